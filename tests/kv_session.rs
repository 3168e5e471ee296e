//! Saved sessions: round trips, replacement, truncated and corrupted files, identity checks,
//! and saves that crash or fail part way, which must never damage the previous session.

use std::path::{Path, PathBuf};

use flashlm::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use flashlm::kv::SessionError;
use flashlm::kv::session::{SaveFault, Session, SessionIdentity, model_hash, save};
use flashlm::sampling::SplitMix64;
use sha2::{Digest, Sha256};

type PageResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn test_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashlm-session-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn identity() -> SessionIdentity {
    SessionIdentity {
        model_hash: std::array::from_fn(|i| i as u8 * 7),
        config: "n_ctx=64 dram=0".into(),
        kv_type: "f16".into(),
        page_tokens: 4,
        n_layers: 2,
        page_bytes: 100,
    }
}

/// Deterministic contents of page `(layer, page)` of session number `tag`.
fn page_bytes(tag: u64, layer: u32, page: u32, len: u64) -> Vec<u8> {
    let mut r = SplitMix64(tag << 40 ^ u64::from(layer) << 20 ^ u64::from(page));
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn save_tagged(
    path: &Path,
    id: &SessionIdentity,
    tokens: &[u32],
    tag: u64,
    fault: Option<SaveFault>,
) -> Result<flashlm::kv::session::SaveStats, SessionError> {
    let len = id.page_bytes;
    let mut fill = |layer: u32, page: u32, dst: &mut [u8]| -> PageResult {
        assert!(dst.iter().all(|&b| b == 0), "page buffers start zeroed");
        dst.copy_from_slice(&page_bytes(tag, layer, page, len));
        Ok(())
    };
    save(path, id, tokens, &mut fill, fault)
}

/// Opens `path` and checks that it is session `tag` with these tokens, page by page.
fn assert_session(path: &Path, id: &SessionIdentity, tokens: &[u32], tag: u64) {
    let s = Session::open(path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.tokens(), tokens);
    assert_eq!(s.identity(), id);
    s.check_identity(id).unwrap();
    let n_pages = tokens.len().div_ceil(id.page_tokens as usize) as u32;
    assert_eq!(s.n_pages(), n_pages);
    let mut buf = vec![0u8; id.page_bytes as usize];
    for layer in 0..id.n_layers {
        for page in 0..n_pages {
            s.read_page(layer, page, &mut buf).unwrap();
            assert_eq!(
                buf,
                page_bytes(tag, layer, page, id.page_bytes),
                "{layer} {page}"
            );
        }
    }
}

const TOKENS: [u32; 10] = [1, 15, 2000, 7, 49151, 0, 3, 3, 3, 12];

/// Length as the documented format implies: 128-byte header, strings, tokens, index, padding
/// to 4096, then the pages.
fn documented_len(id: &SessionIdentity, n_tokens: usize) -> u64 {
    let n_pages = n_tokens.div_ceil(id.page_tokens as usize) as u64;
    let pages = n_pages * u64::from(id.n_layers);
    let meta = 128 + (id.config.len() + id.kv_type.len()) as u64 + 4 * n_tokens as u64 + 4 * pages;
    meta.div_ceil(4096) * 4096 + pages * id.page_bytes
}

#[test]
fn round_trip_and_layout() {
    let dir = test_dir("rt");
    let path = dir.join("chat.session");
    let id = identity();
    let st = save_tagged(&path, &id, &TOKENS, 1, None).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(len, documented_len(&id, TOKENS.len()));
    assert_eq!((st.bytes, st.tokens, st.pages), (len, 10, 6));
    assert_session(&path, &id, &TOKENS, 1);

    // The raw file: magic, version, then the pages at the documented places.
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(&raw[..8], b"FLMKVSES");
    assert_eq!(raw[8..12], 1u32.to_le_bytes());
    let data = 4096;
    for layer in 0..2u32 {
        for page in 0..3u32 {
            let at = data + ((layer * 3 + page) * 100) as usize;
            assert_eq!(
                &raw[at..at + 100],
                page_bytes(1, layer, page, 100).as_slice()
            );
        }
    }
    // Tokens follow the header and the identity strings.
    let t0 = 128 + id.config.len() + id.kv_type.len();
    assert_eq!(raw[t0 + 8..t0 + 12], 2000u32.to_le_bytes());

    let s = Session::open(&path).unwrap();
    let info = s.info();
    assert_eq!((info.file_bytes, info.tokens, info.pages), (len, 10, 3));
    let text = info.to_string();
    for want in [
        path.to_str().unwrap(),
        "10",
        "f16",
        "n_ctx=64 dram=0",
        "00070e151c23",
        "100 bytes",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }

    // Argument checks on read_page.
    let mut buf = vec![0u8; 100];
    let e = s.read_page(2, 0, &mut buf).unwrap_err();
    assert!(
        matches!(e, SessionError::OutOfRange { what: "layer", .. }),
        "{e}"
    );
    let e = s.read_page(0, 3, &mut buf).unwrap_err();
    assert!(
        matches!(e, SessionError::OutOfRange { what: "page", .. }),
        "{e}"
    );
    let e = s.read_page(0, 0, &mut buf[..99]).unwrap_err();
    assert!(
        matches!(
            e,
            SessionError::BadLength {
                expected: 100,
                got: 99
            }
        ),
        "{e}"
    );
    drop(s);

    // An empty session and one whose last page is partial.
    save_tagged(&path, &id, &[], 2, None).unwrap();
    assert_session(&path, &id, &[], 2);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
    save_tagged(&path, &id, &TOKENS[..9], 3, None).unwrap();
    assert_session(&path, &id, &TOKENS[..9], 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resave_replaces_and_leaves_no_temp_files() {
    let dir = test_dir("resave");
    let path = dir.join("s.bin");
    let id = identity();
    save_tagged(&path, &id, &TOKENS, 1, None).unwrap();
    let id2 = SessionIdentity {
        kv_type: "q8".into(),
        page_bytes: 5000,
        ..identity()
    };
    save_tagged(&path, &id2, &TOKENS[..5], 2, None).unwrap();
    assert_session(&path, &id2, &TOKENS[..5], 2);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("s.bin")]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_truncation_is_rejected() {
    let dir = test_dir("trunc");
    let path = dir.join("s.bin");
    save_tagged(&path, &identity(), &TOKENS, 1, None).unwrap();
    let full = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.bin");
    for len in 0..full.len() {
        std::fs::write(&cut, &full[..len]).unwrap();
        match Session::open(&cut) {
            Err(SessionError::Truncated { len: l, .. }) => assert_eq!(l, len as u64),
            Err(e) => panic!("truncated to {len}: expected Truncated, got {e}"),
            Ok(_) => panic!("truncated to {len}: opened"),
        }
    }
    // One byte too many is refused as well.
    let mut long = full.clone();
    long.push(0);
    std::fs::write(&cut, &long).unwrap();
    let e = Session::open(&cut).unwrap_err();
    assert!(matches!(e, SessionError::Corrupt { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flipped_bytes_are_rejected() {
    let dir = test_dir("flip");
    let path = dir.join("s.bin");
    let id = identity();
    save_tagged(&path, &id, &TOKENS, 1, None).unwrap();
    let full = std::fs::read(&path).unwrap();
    let bad = dir.join("bad.bin");
    // Everything before the pages: header, strings, tokens, index, padding.
    for at in 0..4096 {
        let mut b = full.clone();
        b[at] ^= 0x04;
        std::fs::write(&bad, &b).unwrap();
        let e = match Session::open(&bad) {
            Ok(_) => panic!("flipped byte {at} was not noticed"),
            Err(e) => e,
        };
        let ok = match at {
            0..8 => matches!(e, SessionError::BadMagic { .. }),
            8..12 => matches!(e, SessionError::Version { found, supported: 1, .. } if found != 1),
            _ => matches!(e, SessionError::Corrupt { .. }),
        };
        assert!(ok, "flipped byte {at}: {e}");
    }
    // Page data: the file opens, the page fails its checksum, the others read.
    let mut buf = vec![0u8; 100];
    for (layer, page, k) in [(0u32, 0u32, 0usize), (1, 2, 99), (1, 1, 50)] {
        let mut b = full.clone();
        b[4096 + ((layer * 3 + page) * 100) as usize + k] ^= 0x80;
        std::fs::write(&bad, &b).unwrap();
        let s = Session::open(&bad).unwrap();
        let e = s.read_page(layer, page, &mut buf).unwrap_err();
        assert!(matches!(e, SessionError::Corrupt { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("page {page} of layer {layer}")),
            "{msg}"
        );
        for other in (0..3).filter(|&p| p != page) {
            s.read_page(layer, other, &mut buf).unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn crafted_counts_are_rejected_without_allocating() {
    // A header with a valid checksum that claims an enormous token count.
    let dir = test_dir("counts");
    let path = dir.join("s.bin");
    save_tagged(&path, &identity(), &TOKENS, 1, None).unwrap();
    let mut b = std::fs::read(&path).unwrap();
    let reseal = |b: &mut Vec<u8>| {
        let crc = crc32fast::hash(&b[..124]);
        b[124..128].copy_from_slice(&crc.to_le_bytes());
    };
    let bad = dir.join("bad.bin");
    for (n_tokens, n_pages) in [
        (u64::MAX, u32::MAX),
        (1 << 40, (1u64 << 38) as u32),
        (4u64 << 32, u32::MAX),
    ] {
        b[64..72].copy_from_slice(&n_tokens.to_le_bytes());
        b[72..76].copy_from_slice(&n_pages.to_le_bytes());
        reseal(&mut b);
        std::fs::write(&bad, &b).unwrap();
        let e = Session::open(&bad).unwrap_err();
        assert!(
            matches!(
                e,
                SessionError::Corrupt { .. } | SessionError::Truncated { .. }
            ),
            "{n_tokens}: {e}"
        );
    }
    // Consistent but enormous counts: the file is far too short for them.
    b[64..72].copy_from_slice(&(1u64 << 32).to_le_bytes());
    b[72..76].copy_from_slice(&(1u32 << 30).to_le_bytes());
    reseal(&mut b);
    std::fs::write(&bad, &b).unwrap();
    let e = Session::open(&bad).unwrap_err();
    assert!(matches!(e, SessionError::Truncated { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn identity_mismatch_names_the_field() {
    let dir = test_dir("ident");
    let path = dir.join("s.bin");
    let id = identity();
    save_tagged(&path, &id, &TOKENS, 1, None).unwrap();
    let s = Session::open(&path).unwrap();
    s.check_identity(&id).unwrap();
    let mut other_hash = id.model_hash;
    other_hash[31] ^= 1;
    let cases: [(&str, SessionIdentity); 6] = [
        (
            "model file",
            SessionIdentity {
                model_hash: other_hash,
                ..identity()
            },
        ),
        (
            "config",
            SessionIdentity {
                config: "n_ctx=128".into(),
                ..identity()
            },
        ),
        (
            "KV type",
            SessionIdentity {
                kv_type: "f32".into(),
                ..identity()
            },
        ),
        (
            "page size (tokens)",
            SessionIdentity {
                page_tokens: 8,
                ..identity()
            },
        ),
        (
            "layers",
            SessionIdentity {
                n_layers: 3,
                ..identity()
            },
        ),
        (
            "page bytes",
            SessionIdentity {
                page_bytes: 101,
                ..identity()
            },
        ),
    ];
    for (want, cur) in cases {
        match s.check_identity(&cur) {
            Err(e @ SessionError::Mismatch { field, .. }) => {
                assert_eq!(field, want);
                assert!(e.to_string().contains(want), "{e}");
            }
            r => panic!("{want}: {r:?}"),
        }
    }
    let e = s
        .check_identity(&SessionIdentity {
            kv_type: "q4".into(),
            ..identity()
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("saved f16") && msg.contains("now q4"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Names in `dir` other than `keep`.
fn others(dir: &Path, keep: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != keep)
        .collect()
}

#[test]
fn crashes_and_failed_renames_never_damage_the_previous_session() {
    let dir = test_dir("crash");
    let path = dir.join("s.bin");
    let fresh = dir.join("fresh.bin");
    let id = identity();
    save_tagged(&path, &id, &TOKENS, 1, None).unwrap();
    let before = std::fs::read(&path).unwrap();
    // The replacement is larger than the original: crashes land in every part of it.
    let id2 = SessionIdentity {
        page_bytes: 3000,
        ..identity()
    };
    let total = documented_len(&id2, TOKENS.len());
    let mut rng = SplitMix64(0x5e55);
    let mut cuts: Vec<u64> = (0..60).map(|_| rng.next_u64() % total).collect();
    cuts.extend([0, 1, 4095, 4096, total - 1]);
    let prefix = format!(".s.bin.tmp-{}-", std::process::id());
    for n in cuts {
        let e =
            save_tagged(&path, &id2, &TOKENS, 2, Some(SaveFault::CrashAfterBytes(n))).unwrap_err();
        assert!(matches!(e, SessionError::Fault(_)), "{n}: {e}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "crash after {n} bytes"
        );
        assert_session(&path, &id, &TOKENS, 1);
        // The dead writer's temporary file stays, holding exactly the bytes written.
        let left = others(&dir, "s.bin");
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].starts_with(&prefix), "{left:?}");
        let tmp = dir.join(&left[0]);
        let written = std::fs::metadata(&tmp).unwrap().len();
        assert!(written <= total, "{written}");
        std::fs::remove_file(&tmp).unwrap();

        // Where there was no session, a crash leaves none.
        let e = save_tagged(
            &fresh,
            &id2,
            &TOKENS,
            2,
            Some(SaveFault::CrashAfterBytes(n)),
        )
        .unwrap_err();
        assert!(matches!(e, SessionError::Fault(_)), "{e}");
        assert!(!fresh.exists());
        for name in others(&dir, "s.bin") {
            std::fs::remove_file(dir.join(name)).unwrap();
        }
    }
    // A failed rename: previous intact, no temporary file.
    let e = save_tagged(&path, &id2, &TOKENS, 2, Some(SaveFault::FailRename)).unwrap_err();
    assert!(matches!(e, SessionError::Fault(_)), "{e}");
    assert_session(&path, &id, &TOKENS, 1);
    let e = save_tagged(&fresh, &id2, &TOKENS, 2, Some(SaveFault::FailRename)).unwrap_err();
    assert!(matches!(e, SessionError::Fault(_)), "{e}");
    assert!(!fresh.exists());
    assert_eq!(others(&dir, "s.bin"), Vec::<String>::new());

    // A page that cannot be produced: same guarantees.
    let mut failing = |_: u32, page: u32, _: &mut [u8]| -> PageResult {
        if page == 1 {
            Err("GPU readback failed".into())
        } else {
            Ok(())
        }
    };
    let e = save(&path, &id2, &TOKENS, &mut failing, None).unwrap_err();
    assert!(
        matches!(
            e,
            SessionError::Page {
                layer: 0,
                page: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("page 1 of layer 0"), "{e}");
    assert_session(&path, &id, &TOKENS, 1);
    assert_eq!(others(&dir, "s.bin"), Vec::<String>::new());

    // A crash point past the end of the file does not stop the save.
    save_tagged(
        &path,
        &id2,
        &TOKENS,
        2,
        Some(SaveFault::CrashAfterBytes(total)),
    )
    .unwrap();
    assert_session(&path, &id2, &TOKENS, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_save_arguments_are_errors() {
    let dir = test_dir("args");
    let path = dir.join("s.bin");
    for bad in [
        SessionIdentity {
            page_tokens: 0,
            ..identity()
        },
        SessionIdentity {
            n_layers: 0,
            ..identity()
        },
        SessionIdentity {
            page_bytes: 0,
            ..identity()
        },
        SessionIdentity {
            page_bytes: (1 << 30) + 1,
            ..identity()
        },
        SessionIdentity {
            config: "x".repeat((1 << 20) + 1),
            ..identity()
        },
    ] {
        let e = save_tagged(&path, &bad, &TOKENS, 1, None).unwrap_err();
        assert!(matches!(e, SessionError::Invalid(_)), "{e}");
    }
    let e = save_tagged(&dir.join(".."), &identity(), &TOKENS, 1, None).unwrap_err();
    assert!(matches!(e, SessionError::Invalid(_)), "{e}");
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
    // Not a session at all, and a missing file.
    std::fs::write(&path, b"GGUF and more bytes than a magic").unwrap();
    let e = Session::open(&path).unwrap_err();
    assert!(matches!(e, SessionError::BadMagic { .. }), "{e}");
    let e = Session::open(&dir.join("missing")).unwrap_err();
    assert!(matches!(e, SessionError::Io { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tiny_gguf(name: &str, data: u8) -> GgufFile {
    let mut w = GgufWriter::new();
    w.meta("general.name", MetaValue::String(name.into()));
    w.tensor("t", &[8], GgmlType::F32, vec![data; 32]);
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn model_hash_covers_the_header_not_the_tensor_data() {
    let a = tiny_gguf("a", 1);
    let a2 = tiny_gguf("a", 2);
    let b = tiny_gguf("b", 1);
    let hash = |g: &GgufFile| model_hash(g).unwrap();
    assert_eq!(hash(&a), hash(&a2), "tensor data must not matter");
    assert_ne!(hash(&a), hash(&b), "metadata must matter");
    let prefix = &a.bytes()[..a.data_offset as usize];
    assert!(a.bytes().len() > prefix.len());
    let want: [u8; 32] = Sha256::digest(prefix).into();
    assert_eq!(hash(&a), want);
}
