//! The session file reader on arbitrary bytes written to a file.
//!
//! The header and its sections carry crc32s, which random bytes never match: when the first
//! input byte is odd, the harness recomputes them (where the header's sizes let it) so the
//! reader gets past the checksums to the sizes, strings, tokens and pages.
#![no_main]

use flashlm::kv::session::{Session, SessionIdentity};
use libfuzzer_sys::fuzz_target;

mod common;

const HEADER: usize = 128;

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    })
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Rewrites the section checksums (when the sections fit) and the header checksum.
fn fix_checksums(b: &mut [u8]) {
    if b.len() < HEADER {
        return;
    }
    let strings = u32_at(b, 76) as u64 + u32_at(b, 80) as u64;
    let n_tokens = u64_at(b, 64);
    let index = u32_at(b, 52) as u64 * u32_at(b, 72) as u64;
    let sections = [
        (strings, 84),
        (n_tokens.saturating_mul(4), 88),
        (index.saturating_mul(4), 92),
    ];
    let mut at = HEADER as u64;
    for (len, field) in sections {
        let Some(end) = at.checked_add(len).filter(|&e| e <= b.len() as u64) else {
            break;
        };
        let crc = crc32fast::hash(&b[at as usize..end as usize]);
        put_u32(b, field, crc);
        at = end;
    }
    let crc = crc32fast::hash(&b[..HEADER - 4]);
    put_u32(b, HEADER - 4, crc);
}

/// Memory-backed when there is one: a file is written per input.
fn scratch_dir() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fuzz_target!(|data: &[u8]| {
    common::alt_stack();
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if flags & 1 == 1 {
        fix_checksums(&mut bytes);
    }
    let path = scratch_dir().join(format!("flashlm-fuzz-session-{}.bin", std::process::id()));
    std::fs::write(&path, &bytes).expect("writing the temporary session file");
    let Ok(s) = Session::open(&path) else {
        return;
    };
    let info = s.info();
    assert_eq!(info.file_bytes, bytes.len() as u64);
    assert!(info.page_bytes <= bytes.len() as u64);
    let _ = info.to_string();
    let mut page = vec![0u8; info.page_bytes as usize];
    for layer in 0..info.n_layers.min(64) {
        for p in 0..s.n_pages().min(64) {
            let _ = s.read_page(layer, p, &mut page);
        }
    }
    assert!(s.read_page(info.n_layers, 0, &mut page).is_err());
    assert!(s.read_page(0, s.n_pages(), &mut page).is_err());
    let mut id: SessionIdentity = s.identity().clone();
    assert!(s.check_identity(&id).is_ok());
    id.page_tokens = id.page_tokens.wrapping_add(1);
    assert!(s.check_identity(&id).is_err());
    assert_eq!(s.tokens().len() as u64, info.tokens);
});
