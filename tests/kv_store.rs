//! The KV page file: round trips in both I/O modes, the on-disk layout (checked against the
//! raw file), corruption, unwritten and doubly written pages, dropping, range checks, removal
//! and concurrent use.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use flashlm::flash::IoMode;
use flashlm::kv::KvError;
use flashlm::kv::store::{KvLayout, KvStore};
use flashlm::sampling::SplitMix64;

/// 3 tokens × 7 dims of f16, K rows then V rows: 84 bytes a page.
const ODD: KvLayout = KvLayout {
    n_layers: 3,
    page_tokens: 3,
    page_bytes: 3 * 7 * 2 * 2,
    max_pages: 5,
    max_seqs: 2,
};

/// A directory of its own for each test.
fn test_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashlm-kv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A store, or `None` (with a note) where the filesystem refuses direct I/O.
fn create(dir: &Path, layout: KvLayout, mode: IoMode) -> Option<KvStore> {
    match KvStore::create(dir, layout, mode) {
        Ok(s) => Some(s),
        Err(e @ KvError::DirectUnsupported { .. }) => {
            assert!(e.to_string().contains("--io mmap"), "{e}");
            eprintln!("skipping direct I/O: {e}");
            None
        }
        Err(e) => panic!("creating a KV store in {}: {e}", dir.display()),
    }
}

/// Deterministic contents of page `(seq, layer, page)` (tagged with `version` for rewrites).
fn page_data(len: u64, seq: u32, layer: u32, page: u32, version: u64) -> Vec<u8> {
    let mut r = SplitMix64(
        (u64::from(seq) << 48) ^ (u64::from(layer) << 32) ^ u64::from(page) ^ (version << 56),
    );
    (0..len).map(|_| r.next_u64() as u8).collect()
}

/// Record offset as the layout documents it, computed independently of the store.
fn expected_offset(l: &KvLayout, seq: u32, layer: u32, page: u32) -> u64 {
    let rec = l.page_bytes.div_ceil(4096) * 4096;
    ((u64::from(seq) * u64::from(l.n_layers) + u64::from(layer)) * u64::from(l.max_pages)
        + u64::from(page))
        * rec
}

fn write_all(s: &KvStore) {
    let l = *s.layout();
    // Out of order on purpose: the last sequence and layer first.
    for seq in (0..l.max_seqs).rev() {
        for layer in (0..l.n_layers).rev() {
            for page in 0..l.max_pages {
                let d = page_data(l.page_bytes, seq, layer, page, 0);
                s.write_page(seq, layer, page, &d).unwrap();
            }
        }
    }
}

fn round_trip(layout: KvLayout, mode: IoMode) {
    let dir = test_dir(&format!("rt-{mode}-{}", layout.page_bytes));
    let Some(s) = create(&dir, layout, mode) else {
        return;
    };
    let l = layout;
    let rec = l.page_bytes.div_ceil(4096) * 4096;
    assert_eq!(l.record_bytes(), rec);
    let total = u64::from(l.max_seqs * l.n_layers * l.max_pages);
    assert_eq!(std::fs::metadata(s.path()).unwrap().len(), total * rec);
    write_all(&s);
    let st = s.stats();
    assert_eq!(st.pages_written, total);
    let per_write = if mode == IoMode::Direct {
        rec
    } else {
        l.page_bytes
    };
    assert_eq!(st.bytes_written, total * per_write);

    // Every page alone.
    let mut one = vec![0u8; l.page_bytes as usize];
    for seq in 0..l.max_seqs {
        for layer in 0..l.n_layers {
            for page in 0..l.max_pages {
                s.read_pages(seq, layer, page, 1, &mut one).unwrap();
                assert_eq!(one, page_data(l.page_bytes, seq, layer, page, 0));
                let crc = crc32fast::hash(&one);
                assert_eq!(s.checksum(seq, layer, page), Some(crc));
                assert!(s.is_written(seq, layer, page));
            }
        }
    }
    // One read of all pages of (last seq, middle layer), and of a run in the middle.
    let (seq, layer) = (l.max_seqs - 1, l.n_layers / 2);
    for (first, n) in [(0, l.max_pages), (1, l.max_pages - 2)] {
        let mut many = vec![0u8; (u64::from(n) * l.page_bytes) as usize];
        s.read_pages(seq, layer, first, n, &mut many).unwrap();
        for (k, chunk) in many.chunks_exact(l.page_bytes as usize).enumerate() {
            assert_eq!(
                chunk,
                page_data(l.page_bytes, seq, layer, first + k as u32, 0)
            );
        }
    }
    let st = s.stats();
    assert_eq!(st.pages_read, total + u64::from(2 * l.max_pages - 2));

    // The raw file holds each payload at the documented offset, zero padding after it.
    let raw = std::fs::read(s.path()).unwrap();
    for seq in 0..l.max_seqs {
        for layer in 0..l.n_layers {
            for page in 0..l.max_pages {
                let off = expected_offset(&l, seq, layer, page);
                assert_eq!(s.offset(seq, layer, page).unwrap(), off);
                let off = off as usize;
                let pb = l.page_bytes as usize;
                let want = page_data(l.page_bytes, seq, layer, page, 0);
                assert_eq!(&raw[off..off + pb], want.as_slice(), "{seq} {layer} {page}");
                assert!(raw[off + pb..off + rec as usize].iter().all(|&b| b == 0));
            }
        }
    }
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn round_trip_odd_pages_both_modes() {
    for mode in [IoMode::Mmap, IoMode::Direct] {
        round_trip(ODD, mode);
    }
}

#[test]
fn round_trip_record_sized_and_straddling_pages() {
    for page_bytes in [8192, 8193] {
        let layout = KvLayout {
            n_layers: 2,
            page_tokens: 16,
            page_bytes,
            max_pages: 4,
            max_seqs: 1,
        };
        for mode in [IoMode::Mmap, IoMode::Direct] {
            round_trip(layout, mode);
        }
    }
}

#[test]
fn aligned_destination_reads_whole_records() {
    // Page size equal to the record size and a 4 KiB-aligned destination: direct mode reads
    // straight into it; the result must be the same.
    let layout = KvLayout {
        n_layers: 1,
        page_tokens: 8,
        page_bytes: 4096,
        max_pages: 8,
        max_seqs: 1,
    };
    for mode in [IoMode::Mmap, IoMode::Direct] {
        let dir = test_dir(&format!("aligned-{mode}"));
        let Some(s) = create(&dir, layout, mode) else {
            continue;
        };
        write_all(&s);
        let mut backing = vec![0u8; 8 * 4096 + 4096];
        let skip = backing.as_ptr().align_offset(4096);
        let dst = &mut backing[skip..skip + 6 * 4096];
        s.read_pages(0, 0, 2, 6, dst).unwrap();
        for (k, chunk) in dst.chunks_exact(4096).enumerate() {
            assert_eq!(chunk, page_data(4096, 0, 0, 2 + k as u32, 0));
        }
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn flipped_byte_is_a_checksum_error() {
    for mode in [IoMode::Mmap, IoMode::Direct] {
        let dir = test_dir(&format!("flip-{mode}"));
        let Some(s) = create(&dir, ODD, mode) else {
            continue;
        };
        write_all(&s);
        let (seq, layer, page) = (1, 2, 3);
        let at = expected_offset(&ODD, seq, layer, page) + 41;
        let mut raw = std::fs::read(s.path()).unwrap();
        raw[at as usize] ^= 0x10;
        std::fs::write(s.path(), &raw).unwrap();
        let mut one = vec![0u8; ODD.page_bytes as usize];
        let e = s.read_pages(seq, layer, page, 1, &mut one).unwrap_err();
        assert!(
            matches!(
                e,
                KvError::Checksum {
                    seq: 1,
                    layer: 2,
                    page: 3
                }
            ),
            "{mode}: {e}"
        );
        assert!(e.to_string().contains("checksum"), "{e}");
        // A run containing the page names that page; its neighbours still read.
        let mut run = vec![0u8; 5 * ODD.page_bytes as usize];
        let e = s.read_pages(seq, layer, 0, 5, &mut run).unwrap_err();
        assert!(matches!(e, KvError::Checksum { page: 3, .. }), "{e}");
        s.read_pages(seq, layer, 2, 1, &mut one).unwrap();
        s.read_pages(seq, layer, 4, 1, &mut one).unwrap();
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn unwritten_double_written_and_dropped_pages() {
    for mode in [IoMode::Mmap, IoMode::Direct] {
        let dir = test_dir(&format!("states-{mode}"));
        let Some(s) = create(&dir, ODD, mode) else {
            continue;
        };
        let pb = ODD.page_bytes;
        let mut one = vec![0u8; pb as usize];
        let e = s.read_pages(0, 0, 0, 1, &mut one).unwrap_err();
        assert!(
            matches!(
                e,
                KvError::NotWritten {
                    seq: 0,
                    layer: 0,
                    page: 0
                }
            ),
            "{e}"
        );
        assert!(!s.is_written(0, 0, 0));
        assert_eq!(s.checksum(0, 0, 0), None);
        for layer in 0..ODD.n_layers {
            for page in [0, 1, 3, 4] {
                s.write_page(0, layer, page, &page_data(pb, 0, layer, page, 0))
                    .unwrap();
            }
        }
        // A run with a hole names the hole.
        let mut run = vec![0u8; 5 * pb as usize];
        let e = s.read_pages(0, 1, 0, 5, &mut run).unwrap_err();
        assert!(
            matches!(
                e,
                KvError::NotWritten {
                    page: 2,
                    layer: 1,
                    ..
                }
            ),
            "{e}"
        );

        // Written once only; the refused write changes nothing.
        let e = s
            .write_page(0, 1, 1, &page_data(pb, 9, 9, 9, 9))
            .unwrap_err();
        assert!(
            matches!(
                e,
                KvError::AlreadyWritten {
                    seq: 0,
                    layer: 1,
                    page: 1
                }
            ),
            "{e}"
        );
        s.read_pages(0, 1, 1, 1, &mut one).unwrap();
        assert_eq!(one, page_data(pb, 0, 1, 1, 0));

        // Dropping pages >= 3 of sequence 0 forgets them in every layer, and only them.
        s.write_page(1, 0, 4, &page_data(pb, 1, 0, 4, 0)).unwrap();
        s.drop_pages(0, 3);
        for layer in 0..ODD.n_layers {
            assert!(s.is_written(0, layer, 1));
            assert!(!s.is_written(0, layer, 3) && !s.is_written(0, layer, 4));
            let e = s.read_pages(0, layer, 3, 1, &mut one).unwrap_err();
            assert!(matches!(e, KvError::NotWritten { page: 3, .. }), "{e}");
        }
        assert!(s.is_written(1, 0, 4));
        // ... and they can be written again, with new contents.
        for layer in 0..ODD.n_layers {
            for page in 2..5 {
                s.write_page(0, layer, page, &page_data(pb, 0, layer, page, 1))
                    .unwrap();
            }
        }
        s.read_pages(0, 2, 0, 5, &mut run).unwrap();
        for (k, chunk) in run.chunks_exact(pb as usize).enumerate() {
            let version = u64::from(k >= 2);
            assert_eq!(chunk, page_data(pb, 0, 2, k as u32, version), "page {k}");
        }
        // Out-of-range drops forget nothing.
        s.drop_pages(2, 0);
        s.drop_pages(0, 5);
        assert!(s.is_written(0, 0, 4) && s.is_written(1, 0, 4));
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn out_of_range_arguments_are_errors() {
    let dir = test_dir("range");
    let s = KvStore::create(&dir, ODD, IoMode::Mmap).unwrap();
    let pb = ODD.page_bytes as usize;
    let data = vec![1u8; pb];
    let range = |e: KvError, what: &str, value: u64| match e {
        KvError::OutOfRange {
            what: w, value: v, ..
        } if w == what && v == value => {}
        e => panic!("expected {what} {value} out of range, got {e}"),
    };
    range(s.write_page(2, 0, 0, &data).unwrap_err(), "sequence", 2);
    range(s.write_page(0, 3, 0, &data).unwrap_err(), "layer", 3);
    range(s.write_page(0, 0, 5, &data).unwrap_err(), "page", 5);
    range(
        s.offset(u32::MAX, 0, 0).unwrap_err(),
        "sequence",
        u32::MAX.into(),
    );
    range(s.offset(0, 0, 5).unwrap_err(), "page", 5);
    let mut one = vec![0u8; pb];
    range(s.read_pages(0, 7, 0, 1, &mut one).unwrap_err(), "layer", 7);
    let mut two = vec![0u8; 2 * pb];
    range(
        s.read_pages(0, 0, 4, 2, &mut two).unwrap_err(),
        "page run end",
        6,
    );
    let mut huge = Vec::new();
    range(
        s.read_pages(0, 0, 1, u32::MAX, &mut huge).unwrap_err(),
        "page run end",
        u64::from(u32::MAX) + 1,
    );
    // Wrong buffer lengths.
    let e = s.write_page(0, 0, 0, &data[1..]).unwrap_err();
    assert!(
        matches!(
            e,
            KvError::BadLength {
                expected: 84,
                got: 83
            }
        ),
        "{e}"
    );
    let e = s.read_pages(0, 0, 0, 2, &mut one).unwrap_err();
    assert!(
        matches!(
            e,
            KvError::BadLength {
                expected: 168,
                got: 84
            }
        ),
        "{e}"
    );
    // Out-of-range queries answer "no".
    assert!(!s.is_written(5, 5, 5));
    assert_eq!(s.checksum(0, 0, 99), None);
    assert_eq!(s.stats().pages_written, 0);
    drop(s);

    // Unusable layouts.
    for bad in [
        KvLayout { n_layers: 0, ..ODD },
        KvLayout {
            page_tokens: 0,
            ..ODD
        },
        KvLayout {
            page_bytes: 0,
            ..ODD
        },
        KvLayout {
            page_bytes: (1 << 30) + 1,
            ..ODD
        },
        KvLayout {
            max_pages: 0,
            ..ODD
        },
        KvLayout { max_seqs: 0, ..ODD },
        KvLayout {
            n_layers: u32::MAX,
            max_pages: u32::MAX,
            max_seqs: u32::MAX,
            ..ODD
        },
    ] {
        let e = KvStore::create(&dir, bad, IoMode::Mmap).unwrap_err();
        assert!(matches!(e, KvError::BadLayout(_)), "{bad:?}: {e}");
    }
    // Nothing was left behind by the refused layouts.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_are_unique_and_removed_at_drop_unless_kept() {
    let dir = test_dir("names").join("nested");
    let a = KvStore::create(&dir, ODD, IoMode::Mmap).unwrap();
    let mut b = KvStore::create(&dir, ODD, IoMode::Mmap).unwrap();
    assert_ne!(a.path(), b.path());
    for s in [&a, &b] {
        assert_eq!(s.path().parent(), Some(dir.as_path()));
        let name = s.path().file_name().unwrap().to_str().unwrap();
        let prefix = format!("kv-{}-", std::process::id());
        let n = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".bin"))
            .unwrap_or_else(|| panic!("{name}"));
        assert!(n.parse::<u64>().is_ok(), "{name}");
        assert!(s.path().is_file());
    }
    let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
    b.keep();
    drop(a);
    drop(b);
    assert!(!pa.exists(), "dropped store's file remains");
    assert!(pb.is_file(), "kept store's file was removed");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn shrunk_file_is_an_error_not_a_crash() {
    for mode in [IoMode::Mmap, IoMode::Direct] {
        let dir = test_dir(&format!("shrink-{mode}"));
        let Some(s) = create(&dir, ODD, mode) else {
            continue;
        };
        write_all(&s);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(s.path())
            .unwrap();
        f.set_len(expected_offset(&ODD, 1, 0, 0)).unwrap();
        let mut one = vec![0u8; ODD.page_bytes as usize];
        s.read_pages(0, 0, 0, 1, &mut one).ok();
        let e = s.read_pages(1, 2, 0, 1, &mut one).unwrap_err();
        assert!(matches!(e, KvError::Shrunk { .. }), "{mode}: {e}");
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_writer_and_readers_run_concurrently() {
    let layout = KvLayout {
        n_layers: 2,
        page_tokens: 4,
        page_bytes: 1000,
        max_pages: 64,
        max_seqs: 2,
    };
    for mode in [IoMode::Mmap, IoMode::Direct] {
        let dir = test_dir(&format!("threads-{mode}"));
        let Some(s) = create(&dir, layout, mode) else {
            continue;
        };
        // Sequence 1 is written up front and read throughout.
        for layer in 0..2 {
            for page in 0..64 {
                s.write_page(1, layer, page, &page_data(1000, 1, layer, page, 0))
                    .unwrap();
            }
        }
        let done = AtomicU32::new(0);
        std::thread::scope(|t| {
            t.spawn(|| {
                for page in 0..64 {
                    for layer in 0..2 {
                        s.write_page(0, layer, page, &page_data(1000, 0, layer, page, 0))
                            .unwrap();
                    }
                    done.store(page + 1, Ordering::Release);
                }
            });
            t.spawn(|| {
                let mut buf = vec![0u8; 4 * 1000];
                let mut checked = 0;
                while checked < 64 {
                    let ready = done.load(Ordering::Acquire);
                    if ready <= checked {
                        std::thread::yield_now();
                        continue;
                    }
                    // Everything written so far, in one read per layer.
                    for layer in 0..2 {
                        let first = ready.saturating_sub(4);
                        let n = ready - first;
                        let dst = &mut buf[..(n * 1000) as usize];
                        s.read_pages(0, layer, first, n, dst).unwrap();
                        for (k, c) in dst.chunks_exact(1000).enumerate() {
                            assert_eq!(c, page_data(1000, 0, layer, first + k as u32, 0));
                        }
                    }
                    checked = ready;
                }
            });
            t.spawn(|| {
                let mut buf = vec![0u8; 64 * 1000];
                for round in 0..20 {
                    let layer = round % 2;
                    s.read_pages(1, layer, 0, 64, &mut buf).unwrap();
                    for (k, c) in buf.chunks_exact(1000).enumerate() {
                        assert_eq!(c, page_data(1000, 1, layer, k as u32, 0));
                    }
                }
            });
        });
        assert_eq!(s.stats().pages_written, 256);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
