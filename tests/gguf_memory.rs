//! Metadata costs memory in proportion to its size in the file.
//!
//! A counting global allocator records the peak of live heap bytes while a crafted file is
//! opened (the file itself is memory-mapped, so it is not counted). One test function runs all
//! cases in turn, so no other test thread allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use flashlm::gguf::writer::GgufBytes;
use flashlm::gguf::{GgufFile, value_type};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MB: usize = 1 << 20;

/// A file with no tensors and one metadata pair `"k"` whose value is `value` (type `ty`).
fn write_one_kv(path: &std::path::Path, ty: u32, value: &[u8]) -> usize {
    let mut b = b"GGUF".to_vec();
    b.put_u32(3);
    b.put_u64(0);
    b.put_u64(1);
    b.put_str("k");
    b.put_u32(ty);
    b.extend_from_slice(value);
    b.resize(b.len().next_multiple_of(32), 0);
    std::fs::write(path, &b).unwrap();
    b.len()
}

/// Peak heap growth while opening `path` and holding the parsed file.
fn peak_of_open(path: &std::path::Path) -> (usize, GgufFile) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let f = GgufFile::open(path).expect("the crafted file parses");
    (PEAK.load(Ordering::Relaxed) - base, f)
}

#[test]
fn metadata_memory_is_proportional_to_its_size_in_the_file() {
    let dir = std::env::temp_dir().join(format!("flashlm-gguf-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.gguf");

    // 50 MB of u8: at most 2 bytes of heap per array byte plus a few MB.
    let n = 50 * MB;
    let mut v = Vec::new();
    v.put_u32(value_type::UINT8);
    v.put_u64(n as u64);
    v.resize(12 + n, 7);
    let file_len = write_one_kv(&path, value_type::ARRAY, &v);
    drop(v);
    let (peak, f) = peak_of_open(&path);
    let a = f.get_array("k").unwrap().unwrap();
    assert_eq!(
        (a.len(), a.get(n - 1)),
        (n, Some(flashlm::gguf::MetaValue::U8(7)))
    );
    eprintln!("u8 array: {peak} bytes of heap for a {file_len}-byte file");
    assert!(
        peak <= 2 * n + 4 * MB,
        "u8 array: {peak} bytes of heap for a {file_len}-byte file"
    );
    drop(f);

    // 1M strings of 16 bytes (24 MB of file): text plus one offset per string.
    let count = MB;
    let mut v = Vec::new();
    v.put_u32(value_type::STRING);
    v.put_u64(count as u64);
    for i in 0..count {
        v.put_str(&format!("{i:016}"));
    }
    let file_len = write_one_kv(&path, value_type::ARRAY, &v);
    drop(v);
    let (peak, f) = peak_of_open(&path);
    let s = f.get_str_array("k").unwrap().unwrap();
    assert_eq!((s.len(), s[12345]), (count, "0000000000012345"));
    drop(s);
    eprintln!("string array: {peak} bytes of heap for a {file_len}-byte file");
    assert!(
        peak <= 2 * file_len + 4 * MB,
        "string array: {peak} bytes of heap for a {file_len}-byte file"
    );
    drop(f);

    // 2M empty inner arrays (24 MB of file): the worst case of nesting, a few words each.
    let count = 2 * MB;
    let mut v = Vec::new();
    v.put_u32(value_type::ARRAY);
    v.put_u64(count as u64);
    for _ in 0..count {
        v.put_u32(value_type::UINT8);
        v.put_u64(0);
    }
    let file_len = write_one_kv(&path, value_type::ARRAY, &v);
    drop(v);
    let (peak, f) = peak_of_open(&path);
    assert_eq!(f.get_array("k").unwrap().unwrap().len(), count);
    eprintln!("nested arrays: {peak} bytes of heap for a {file_len}-byte file");
    assert!(
        peak <= 4 * file_len + 4 * MB,
        "nested arrays: {peak} bytes of heap for a {file_len}-byte file"
    );
    drop(f);

    // 512K metadata pairs with 7-byte keys and u8 values (10 MB of file): the key is stored
    // twice (map and order) and each entry has fixed costs, so this is the most heap per file
    // byte a GGUF header can ask for.
    let count = MB / 2;
    let mut b = b"GGUF".to_vec();
    b.put_u32(3);
    b.put_u64(0);
    b.put_u64(count as u64);
    for i in 0..count {
        b.put_str(&format!("k{i:06}"));
        b.put_u32(value_type::UINT8);
        b.push(1);
    }
    b.resize(b.len().next_multiple_of(32), 0);
    std::fs::write(&path, &b).unwrap();
    let file_len = b.len();
    drop(b);
    let (peak, f) = peak_of_open(&path);
    assert_eq!(f.metadata.len(), count);
    eprintln!("metadata pairs: {peak} bytes of heap for a {file_len}-byte file");
    assert!(
        peak <= 10 * file_len + 4 * MB,
        "metadata pairs: {peak} bytes of heap for a {file_len}-byte file"
    );
    drop(f);
    std::fs::remove_dir_all(&dir).unwrap();
}
