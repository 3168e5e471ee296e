//! The flash reader reads exact bytes in both modes, reports bad reads and changed files, and
//! the page-cache and DRAM-cache helpers do what they say.
mod common;

use std::path::{Path, PathBuf};

use common::Rng;
use flashlm::flash::source::{ChunkSource, FlashSource, WeightSource};
use flashlm::flash::{
    Admit, CacheKey, FileChange, FlashError, FlashFault, FlashFile, HostCache, IoMode,
    ReaderOptions, evict_page_cache, page_cache_residency,
};

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        // Next to the build, on a disk filesystem (temp dirs may be tmpfs without O_DIRECT).
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let p = base.join(format!("flash-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

fn opts(mode: IoMode, threads: usize, chunk: usize) -> ReaderOptions {
    ReaderOptions {
        mode,
        threads,
        chunk,
    }
}

/// Open, or `None` with a note when the filesystem refuses direct I/O.
fn open(path: &Path, o: ReaderOptions) -> Option<FlashFile> {
    match FlashFile::open(path, o) {
        Ok(f) => Some(f),
        Err(e @ FlashError::DirectUnsupported { .. }) => {
            assert!(e.to_string().contains("--io mmap"), "{e}");
            eprintln!("skipping direct I/O: {e}");
            None
        }
        Err(e) => panic!("open {}: {e}", path.display()),
    }
}

/// A zeroed buffer of `len` bytes whose start is 4096-aligned.
fn aligned_vec(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 4096];
    let skew = (4096 - v.as_ptr() as usize % 4096) % 4096;
    (v, skew)
}

const MODES: [IoMode; 2] = [IoMode::Mmap, IoMode::Direct];

#[test]
fn both_modes_read_exact_bytes_at_odd_offsets() {
    let dir = TempDir::new("exact");
    let data = random_bytes(3 * 1024 * 1024 + 1234, 1);
    let path = dir.file("data.bin", &data);
    assert_eq!(std::fs::read(&path).unwrap(), data);
    let n = data.len() as u64;
    let ranges: &[(u64, usize)] = &[
        (0, data.len()),
        (0, 1),
        (1, 4095),
        (4095, 2),
        (4096, 4096),
        (4097, 100_003),
        (12_345, 1_048_577),
        (n - 7, 7),
        (n - 1, 1),
        (n, 0),
        (0, 0),
    ];
    for mode in MODES {
        let Some(f) = open(&path, opts(mode, 3, 65_537)) else {
            continue;
        };
        assert_eq!(f.len(), n);
        assert_eq!(f.mode(), mode);
        for &(off, len) in ranges {
            let mut buf = vec![0xAAu8; len];
            f.read_into(off, &mut buf)
                .unwrap_or_else(|e| panic!("{mode} {off}+{len}: {e}"));
            assert!(
                buf == data[off as usize..off as usize + len],
                "{mode} {off}+{len}"
            );
        }
        let mut rng = Rng(7);
        for _ in 0..40 {
            let off = rng.next_u64() % n;
            let len = (rng.next_u64() % (n - off).min(300_000)) as usize;
            let mut buf = vec![0u8; len];
            f.read_into(off, &mut buf).unwrap();
            assert!(
                buf == data[off as usize..off as usize + len],
                "{mode} {off}+{len}"
            );
        }
        assert!(f.reads() > 0);
        assert!(f.bytes_read() > 0);
    }
}

#[test]
fn parallel_reads_give_identical_bytes() {
    let dir = TempDir::new("parallel");
    let data = random_bytes(2 * 1024 * 1024 + 777, 2);
    let path = dir.file("data.bin", &data);
    let (off, len) = (3_001u64, data.len() - 5_000);
    for mode in MODES {
        for threads in 1..=8 {
            for chunk in [1_000, 4_097, 10_007, 65_537, 1 << 20] {
                let Some(f) = open(&path, opts(mode, threads, chunk)) else {
                    return;
                };
                let mut buf = vec![0u8; len];
                f.read_into(off, &mut buf).unwrap();
                assert!(
                    buf == data[off as usize..off as usize + len],
                    "{mode} threads {threads} chunk {chunk}"
                );
            }
        }
    }
}

#[test]
fn direct_reads_count_alignment_overhead_and_read_aligned_ranges_in_place() {
    let dir = TempDir::new("aligned");
    let data = random_bytes(1024 * 1024 + 100, 3);
    let path = dir.file("data.bin", &data);
    let Some(f) = open(&path, opts(IoMode::Direct, 2, 256 * 1024)) else {
        return;
    };
    // Aligned offset, length and address: exactly the requested bytes.
    let (mut v, skew) = aligned_vec(512 * 1024);
    let dst = &mut v[skew..skew + 512 * 1024];
    f.reset_counters();
    f.read_into(65_536, dst).unwrap();
    assert!(dst == &data[65_536..65_536 + 512 * 1024]);
    assert_eq!(f.bytes_read(), 512 * 1024);
    // Pieces split at multiples of 256 KiB in the file: [64K, 256K), [256K, 512K), [512K, 576K).
    assert_eq!(f.reads(), 3);
    // Same alignment of address and offset, odd ends: aligned middle plus two bounce pages.
    let dst = &mut v[skew + 100..skew + 100 + 300_000];
    f.reset_counters();
    f.read_into(100, dst).unwrap();
    assert!(dst == &data[100..300_100]);
    let aligned = 300_100u64.next_multiple_of(4096);
    assert_eq!(f.bytes_read(), aligned);
    // Unaligned: the whole aligned superset, and nothing more.
    let mut buf = vec![0u8; 10];
    f.reset_counters();
    f.read_into(4090, &mut buf).unwrap();
    assert_eq!(buf, &data[4090..4100]);
    assert_eq!(f.bytes_read(), 8192);
    // The tail of the file: the request is aligned, the file is not.
    let mut buf = vec![0u8; 100];
    f.read_into(data.len() as u64 - 100, &mut buf).unwrap();
    assert_eq!(buf, &data[data.len() - 100..]);
    // Mmap counts exactly what was copied.
    let m = FlashFile::open(&path, opts(IoMode::Mmap, 2, 256 * 1024)).unwrap();
    let mut buf = vec![0u8; 10];
    m.read_into(4090, &mut buf).unwrap();
    assert_eq!((m.bytes_read(), m.reads()), (10, 1));
}

#[test]
fn real_model_reads_match_the_file() {
    let Some(path) = common::model_path() else {
        return;
    };
    let g = flashlm::gguf::GgufFile::open(&path).unwrap();
    for mode in MODES {
        let Some(f) = open(&path, opts(mode, 4, 1 << 20)) else {
            continue;
        };
        assert_eq!(f.len(), g.file_len);
        for t in g.tensors.iter().step_by(17).take(12) {
            let mut buf = vec![0u8; t.n_bytes as usize];
            f.read_into(t.offset, &mut buf).unwrap();
            assert!(buf == g.tensor_data(t), "{mode} {}", t.name);
        }
        // An odd window across tensor boundaries.
        let (off, len) = (g.data_offset + 12_345, 5_000_001);
        let mut buf = vec![0u8; len];
        f.read_into(off, &mut buf).unwrap();
        assert!(buf == g.bytes()[off as usize..off as usize + len], "{mode}");
    }
}

#[test]
fn reads_past_the_end_are_errors() {
    let dir = TempDir::new("range");
    let data = random_bytes(10_000, 4);
    let path = dir.file("data.bin", &data);
    for mode in MODES {
        let Some(f) = open(&path, opts(mode, 2, 4096)) else {
            continue;
        };
        for (off, len) in [(9_999u64, 2usize), (10_000, 1), (20_000, 0), (u64::MAX, 1)] {
            let mut buf = vec![0u8; len];
            let e = f.read_into(off, &mut buf).unwrap_err();
            assert!(matches!(e, FlashError::OutOfRange { .. }), "{mode}: {e}");
            assert!(e.to_string().contains("outside"), "{e}");
        }
    }
    // An empty file: only empty reads.
    let empty = dir.file("empty.bin", &[]);
    for mode in MODES {
        let Some(f) = open(&empty, opts(mode, 2, 4096)) else {
            continue;
        };
        f.read_into(0, &mut []).unwrap();
        assert!(f.read_into(0, &mut [0u8; 1]).is_err());
    }
}

#[test]
fn injected_short_read_is_an_error() {
    let dir = TempDir::new("fault");
    let data = random_bytes(200_000, 5);
    let path = dir.file("data.bin", &data);
    for mode in MODES {
        let Some(f) = open(&path, opts(mode, 4, 8192)) else {
            continue;
        };
        f.inject_fault(FlashFault::ShortRead { at: 150_000 });
        let mut buf = vec![0u8; 100_000];
        let e = f.read_into(100_000, &mut buf).unwrap_err();
        match &e {
            FlashError::ShortRead {
                offset,
                wanted,
                got,
                ..
            } => assert_eq!((*offset, *wanted, *got), (100_000, 100_000, 50_000)),
            other => panic!("{mode}: expected a short read, got {other}"),
        }
        assert!(e.to_string().contains("short read"), "{e}");
        // Reads not covering the offset still work.
        f.read_into(0, &mut buf).unwrap();
        assert!(buf == data[..100_000]);
        // Through the staging-ring interface too.
        let r = flashlm::gpu::staging::ChunkSource::read_into(&f, 149_000, &mut buf[..4096]);
        assert!(r.unwrap_err().to_string().contains("short read"));
        f.clear_faults();
        f.read_into(100_000, &mut buf).unwrap();
        assert!(buf == data[100_000..]);
        f.inject_fault(FlashFault::IoError { at: 10 });
        let e = f.read_into(0, &mut buf[..11]).unwrap_err();
        assert!(matches!(e, FlashError::Io { .. }), "{e}");
    }
}

#[test]
fn a_file_that_shrinks_after_open_is_an_error_not_a_crash() {
    let dir = TempDir::new("shrink");
    let data = random_bytes(1024 * 1024, 6);
    for mode in MODES {
        let path = dir.file(&format!("{mode}.bin"), &data);
        let Some(f) = open(&path, opts(mode, 2, 65_536)) else {
            continue;
        };
        let mut buf = vec![0u8; 300_000];
        f.read_into(600_000, &mut buf).unwrap();
        f.check_unchanged().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100_000)
            .unwrap();
        let e = f.check_unchanged().unwrap_err();
        assert!(
            matches!(
                &e,
                FlashError::FileChanged {
                    change: FileChange::Shrunk {
                        from: 1_048_576,
                        to: 100_000
                    },
                    ..
                }
            ),
            "{mode}: {e}"
        );
        assert!(e.to_string().contains("shrank"), "{e}");
        // Past the new end: an error, never SIGBUS.
        let e = f.read_into(600_000, &mut buf).unwrap_err();
        assert!(matches!(e, FlashError::FileChanged { .. }), "{mode}: {e}");
    }
}

#[test]
fn a_removed_or_replaced_file_is_reported() {
    let dir = TempDir::new("vanish");
    let data = random_bytes(50_000, 7);
    for mode in MODES {
        let path = dir.file(&format!("{mode}.bin"), &data);
        let Some(f) = open(&path, opts(mode, 2, 65_536)) else {
            continue;
        };
        std::fs::remove_file(&path).unwrap();
        let e = f.check_unchanged().unwrap_err();
        assert!(
            matches!(
                &e,
                FlashError::FileChanged {
                    change: FileChange::Vanished,
                    ..
                }
            ),
            "{mode}: {e}"
        );
        assert!(e.to_string().contains("removed"), "{e}");
        // Same name, another file.
        let other = dir.file("other.bin", &data);
        std::fs::rename(&other, &path).unwrap();
        let e = f.check_unchanged().unwrap_err();
        assert!(
            matches!(
                &e,
                FlashError::FileChanged {
                    change: FileChange::Replaced,
                    ..
                }
            ),
            "{mode}: {e}"
        );
    }
}

#[test]
fn eviction_reports_residency() {
    let dir = TempDir::new("evict");
    let data = random_bytes(4 * 1024 * 1024, 8);
    let path = dir.file("data.bin", &data);
    // Written pages are dirty until written back; sync so the eviction can drop them.
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    let _ = std::fs::read(&path).unwrap();
    let warm = page_cache_residency(&path).unwrap();
    let r = evict_page_cache(&path).unwrap();
    eprintln!(
        "residency: warm {warm:.3}, before {:.3}, after {:.3}, effective {}",
        r.before,
        r.after,
        r.effective()
    );
    assert!((0.0..=1.0).contains(&r.before) && (0.0..=1.0).contains(&r.after));
    assert!(r.after <= r.before, "{r:?}");
    assert_eq!(r.effective(), r.after <= 0.05);
    let cold = page_cache_residency(&path).unwrap();
    assert!((0.0..=1.0).contains(&cold));
    // Reading brings pages back (only checkable when the eviction worked).
    if r.effective() {
        let f = FlashFile::open(&path, opts(IoMode::Mmap, 1, 1 << 20)).unwrap();
        let mut buf = vec![0u8; data.len()];
        f.read_into(0, &mut buf).unwrap();
        assert!(page_cache_residency(&path).unwrap() > r.after);
        // While mapped pages are in use, eviction cannot drop them; release, then evict.
        f.release(0, f.len()).unwrap();
        drop(f);
        let r2 = evict_page_cache(&path).unwrap();
        assert!(r2.after <= r2.before, "{r2:?}");
    }
    // Empty files and missing files.
    let empty = dir.file("empty.bin", &[]);
    assert_eq!(page_cache_residency(&empty).unwrap(), 0.0);
    assert!(evict_page_cache(dir.0.join("missing")).is_err());
}

#[test]
fn mmap_hints_work() {
    let dir = TempDir::new("hints");
    let data = random_bytes(300_000, 9);
    let path = dir.file("data.bin", &data);
    let f = FlashFile::open(&path, opts(IoMode::Mmap, 1, 1 << 20)).unwrap();
    f.advise_sequential().unwrap();
    f.prefetch(1, 200_000).unwrap();
    f.prefetch(250_000, 1 << 30).unwrap();
    f.prefetch(1 << 40, 10).unwrap();
    let mut buf = vec![0u8; 299_999];
    f.read_into(1, &mut buf).unwrap();
    f.release(1, 299_999).unwrap();
    // After release the bytes come back from the file.
    let mut again = vec![0u8; 299_999];
    f.read_into(1, &mut again).unwrap();
    assert!(buf == again && buf == data[1..]);
    if let Some(d) = open(&path, opts(IoMode::Direct, 1, 1 << 20)) {
        d.prefetch(0, 10).unwrap();
        d.release(0, 10).unwrap();
    }
}

#[test]
fn host_cache_pins_weights_and_evicts_lru_pages_under_its_budget() {
    let dir = TempDir::new("dram");
    let data = random_bytes(100_000, 10);
    let path = dir.file("data.bin", &data);
    let f = FlashFile::open(&path, opts(IoMode::Mmap, 1, 1 << 20)).unwrap();
    let src = FlashSource::new(f, 3 * 4096);
    let cache = src.host_cache().unwrap();
    let get = |off: u64, len: usize| {
        let mut buf = vec![0u8; len];
        src.read_into(off, &mut buf).unwrap();
        assert!(buf == data[off as usize..off as usize + len]);
        assert!(cache.cached_bytes() <= cache.budget());
    };
    // Weight ranges are pinned until the budget is used, then read from the file each time.
    get(0, 4096);
    get(10_000, 4096);
    get(20_000, 4096);
    get(30_000, 4096);
    assert_eq!(src.file().bytes_read(), 4 * 4096);
    get(0, 4096);
    get(10_000, 4096);
    get(30_000, 4096);
    assert_eq!(
        src.file().bytes_read(),
        5 * 4096,
        "only the unpinned range is re-read"
    );
    assert_eq!(src.dram_stats(), (3 * 4096, 2 * 4096));
    // Errors pass through and cache nothing.
    let mut b = [0u8; 2];
    assert!(src.read_into(99_999, &mut b).is_err());
    // LRU entries (KV pages) under a shared budget: the least recently used goes first, and
    // pinned data is never evicted for them.
    let c = HostCache::new(4 * 4096);
    let page = vec![1u8; 4096];
    let k = |p: u64| CacheKey::new(1, 0, p);
    assert!(c.insert(CacheKey::new(0, 0, 4096), &page, Admit::Pinned));
    for p in 0..3 {
        assert!(c.insert(k(p), &page, Admit::Lru));
    }
    let mut buf = vec![0u8; 4096];
    assert!(c.get(k(0), &mut buf));
    assert!(c.insert(k(3), &page, Admit::Lru)); // evicts page 1
    assert!(c.contains(k(0)) && !c.contains(k(1)) && c.contains(k(2)) && c.contains(k(3)));
    assert!(c.contains(CacheKey::new(0, 0, 4096)));
    let mut r = Rng(11);
    for _ in 0..500 {
        let p = r.next_u64() % 50;
        if !c.get(k(p), &mut buf) {
            c.insert(k(p), &page, Admit::Lru);
        }
        assert!(c.cached_bytes() <= c.budget());
    }
    assert!(c.contains(CacheKey::new(0, 0, 4096)));
}

#[test]
fn staging_ring_uploads_from_flash_in_both_modes() {
    let Some(ctx) = common::gpu() else { return };
    let dir = TempDir::new("ring");
    let data = random_bytes(700_001, 12);
    let path = dir.file("data.bin", &data);
    let mut ring = flashlm::gpu::staging::StagingRing::new(&ctx, 3, 64 * 1024).unwrap();
    let dst = ctx.storage("dst", 700_004).unwrap();
    for mode in MODES {
        let Some(f) = open(&path, opts(mode, 4, 16 * 1024)) else {
            continue;
        };
        for (off, len) in [(0u64, 700_001u64), (4096, 200_000), (13, 333_333)] {
            let s = ring.upload(&ctx, &f, off, len, &dst, 0).unwrap();
            assert_eq!(s.bytes, len);
            let back = ctx.read_buffer(&dst, len).unwrap();
            assert!(
                back == data[off as usize..(off + len) as usize],
                "{mode} {off}+{len}"
            );
        }
        f.inject_fault(FlashFault::ShortRead { at: 500_000 });
        let e = ring.upload(&ctx, &f, 0, 700_001, &dst, 0).unwrap_err();
        assert!(e.to_string().contains("short read"), "{e}");
    }
}
