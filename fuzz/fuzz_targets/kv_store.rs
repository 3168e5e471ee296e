//! The KV page file read back after arbitrary damage: bytes overwritten anywhere, the file
//! truncated or extended. A read must either fail or return exactly the pages written.
//!
//! Input: a list of operations, each `kind u8 | offset u32 | len u8 | bytes`.
#![no_main]

use std::os::unix::fs::FileExt;
use std::sync::{Mutex, OnceLock};

use flashlm::flash::IoMode;
use flashlm::kv::store::{KvLayout, KvStore};
use libfuzzer_sys::fuzz_target;

mod common;

const LAYOUT: KvLayout = KvLayout {
    n_layers: 2,
    page_tokens: 4,
    page_bytes: 96,
    max_pages: 4,
    max_seqs: 2,
};

struct Fixture {
    store: KvStore,
    pristine: Vec<u8>,
}

fn page_data(seq: u32, layer: u32, page: u32) -> Vec<u8> {
    (0..LAYOUT.page_bytes)
        .map(|i| (i as u32 ^ (seq << 6) ^ (layer << 4) ^ page).wrapping_mul(31) as u8)
        .collect()
}

fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("flashlm-fuzz-kv-{}", std::process::id()));
        let store = KvStore::create(&dir, LAYOUT, IoMode::Mmap).expect("creating the page file");
        for seq in 0..LAYOUT.max_seqs {
            for layer in 0..LAYOUT.n_layers {
                // The last page of each sequence stays unwritten.
                for page in 0..LAYOUT.max_pages - 1 {
                    store
                        .write_page(seq, layer, page, &page_data(seq, layer, page))
                        .expect("writing a page");
                }
            }
        }
        let pristine = std::fs::read(store.path()).expect("reading the page file");
        Mutex::new(Fixture { store, pristine })
    })
}

fuzz_target!(|data: &[u8]| {
    common::alt_stack();
    let f = fixture().lock().unwrap_or_else(|e| e.into_inner());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(f.store.path())
        .expect("opening the page file");
    let full = f.pristine.len() as u64;
    // Start from the pages as written.
    file.set_len(full).unwrap();
    file.write_all_at(&f.pristine, 0).unwrap();
    let mut rest = data;
    while rest.len() >= 6 {
        let kind = rest[0];
        let offset = u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]]) as u64 % (full + 64);
        let len = rest[5] as usize;
        rest = &rest[6..];
        match kind % 4 {
            0 | 1 => {
                let n = len.min(rest.len());
                file.write_all_at(&rest[..n], offset).unwrap();
                rest = &rest[n..];
            }
            2 => file.set_len(offset).unwrap(),
            _ => file.set_len(full + offset).unwrap(),
        }
    }
    let pb = LAYOUT.page_bytes as usize;
    for seq in 0..LAYOUT.max_seqs {
        for layer in 0..LAYOUT.n_layers {
            for first in 0..LAYOUT.max_pages {
                for n in 0..=LAYOUT.max_pages - first {
                    let mut dst = vec![0u8; n as usize * pb];
                    if f.store.read_pages(seq, layer, first, n, &mut dst).is_ok() {
                        for (k, chunk) in dst.chunks_exact(pb).enumerate() {
                            assert_eq!(chunk, page_data(seq, layer, first + k as u32));
                        }
                    }
                }
            }
        }
    }
});
