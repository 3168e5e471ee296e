//! Hostile GGUF files: one crafted file per known class of GGUF reader bug (kept under
//! `tests/fixtures/hostile/`), random mutations, and model files truncated or replaced while open.

mod gguf_support;

use std::path::{Path, PathBuf};

use flashlm::gguf::writer::GgufBytes;
use flashlm::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetaArray, MetaValue, value_type};
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::model::tokenizer::{Tokenizer, TokenizerError};
use gguf_support::*;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile")
}

/// An array value: element type, count, then whatever raw bytes follow.
fn array(elem: u32, count: u64, rest: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_u32(elem);
    v.put_u64(count);
    v.extend_from_slice(rest);
    v
}

/// The crafted files, by name. Each stays a few hundred bytes at most.
fn crafted() -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    // Counts in the header that no file of this size can hold (allocation from a count).
    out.push((
        "kv_count_huge.gguf",
        with_data(header(3, 0, u64::MAX), 32, 0),
    ));
    out.push(("tensor_count_overflow.gguf", {
        // 2^59 tensor infos: a count times the info size wraps a u64.
        with_data(header(3, 1 << 59, 0), 32, 0)
    }));
    // A string length past the end, and one whose `len + 1` wraps.
    out.push(("key_length_past_end.gguf", {
        let mut b = header(3, 0, 1);
        b.put_u64(1 << 20);
        b.extend_from_slice(b"general.name");
        b
    }));
    out.push(("string_length_wraps.gguf", {
        let mut v = Vec::new();
        v.put_u64(u64::MAX);
        v.extend_from_slice(b"abc");
        one_kv("general.name", value_type::STRING, &v)
    }));
    // Array counts whose byte size overflows, or does not fit the file.
    out.push(("array_count_overflow.gguf", {
        one_kv(
            "a",
            value_type::ARRAY,
            &array(value_type::UINT32, 1 << 62, &[0; 16]),
        )
    }));
    out.push(("string_array_count_huge.gguf", {
        one_kv(
            "a",
            value_type::ARRAY,
            &array(value_type::STRING, u64::MAX / 8, &[0; 16]),
        )
    }));
    out.push(("nested_array_inner_count_huge.gguf", {
        let inner = array(value_type::UINT64, u64::MAX, &[0; 8]);
        one_kv("a", value_type::ARRAY, &array(value_type::ARRAY, 1, &inner))
    }));
    out.push(("nested_array_three_levels.gguf", {
        let innermost = array(value_type::UINT8, 0, &[]);
        let middle = array(value_type::ARRAY, 1, &innermost);
        one_kv(
            "a",
            value_type::ARRAY,
            &array(value_type::ARRAY, 1, &middle),
        )
    }));
    out.push(("unknown_value_type.gguf", one_kv("k", 0x4000_0000, &[0; 8])));
    out.push(("unknown_array_element_type.gguf", {
        one_kv("k", value_type::ARRAY, &array(13, 1, &[0; 8]))
    }));
    out.push(("invalid_utf8_key.gguf", {
        let mut b = header(3, 0, 1);
        b.put_u64(2);
        b.extend_from_slice(&[0xC3, 0x28]);
        b.put_u32(value_type::UINT8);
        b.push(1);
        with_data(b, 32, 0)
    }));
    out.push(("duplicate_key.gguf", {
        let mut b = header(3, 0, 2);
        kv(&mut b, "k", value_type::UINT8, &[1]);
        kv(&mut b, "k", value_type::UINT8, &[2]);
        with_data(b, 32, 0)
    }));
    // Alignment: zero (a division by zero in some readers) and not a power of two.
    for (name, a) in [
        ("alignment_zero.gguf", 0u32),
        ("alignment_not_power_of_two.gguf", 24),
    ] {
        out.push((
            name,
            one_kv("general.alignment", value_type::UINT32, &a.to_le_bytes()),
        ));
    }
    // Tensor infos: too many dims (an out-of-bounds write into a fixed dims array), zero and
    // overflowing dims, sizes that overflow, offsets past the end or wrapping.
    out.push(("tensor_dims_too_many.gguf", one_tensor(&[1; 5], F32, 0, 32)));
    out.push(("tensor_dims_u32_max.gguf", {
        let mut b = header(3, 1, 0);
        b.put_str("t");
        b.put_u32(u32::MAX);
        b.extend_from_slice(&[1; 64]);
        with_data(b, 32, 0)
    }));
    out.push(("tensor_dim_zero.gguf", one_tensor(&[4, 0], F32, 0, 32)));
    out.push((
        "tensor_elements_overflow.gguf",
        one_tensor(&[1 << 32, 1 << 32], F32, 0, 32),
    ));
    out.push((
        "tensor_bytes_overflow.gguf",
        one_tensor(&[1 << 31, 1 << 31], F32, 0, 32),
    ));
    out.push(("tensor_offset_past_end.gguf", one_tensor(&[8], F32, 64, 32)));
    out.push((
        "tensor_offset_wraps.gguf",
        one_tensor(&[8], F32, u64::MAX - 31, 32),
    ));
    out.push(("tensor_sizes_sum_overflow.gguf", {
        // Two tensors of 2^62 bytes each: their total wraps in a reader that sums sizes.
        let mut b = header(3, 2, 0);
        info(&mut b, "a", &[1 << 60], F32, 0);
        info(&mut b, "b", &[1 << 60], F32, 1 << 62);
        with_data(b, 32, 64)
    }));
    out.push(("tensor_misaligned.gguf", one_tensor(&[4], F32, 4, 64)));
    out.push(("tensors_overlap.gguf", {
        let mut b = header(3, 2, 0);
        info(&mut b, "a", &[16], F32, 0);
        info(&mut b, "b", &[8], F32, 32);
        with_data(b, 32, 64)
    }));
    out.push(("duplicate_tensor.gguf", {
        let mut b = header(3, 2, 0);
        info(&mut b, "a", &[8], F32, 0);
        info(&mut b, "a", &[8], F32, 32);
        with_data(b, 32, 64)
    }));
    out.push(("tensor_type_unknown.gguf", one_tensor(&[32], 0xFFFF, 0, 64)));
    out.push(("tensor_name_length_past_end.gguf", {
        let mut b = header(3, 1, 0);
        b.put_u64(u64::MAX - 8);
        b.extend_from_slice(&[b'x'; 40]);
        b
    }));
    out.push(("version_1.gguf", with_data(header(1, 0, 0), 32, 0)));
    out.push(("bad_magic.gguf", {
        let mut b = with_data(header(3, 0, 0), 32, 0);
        b[..4].copy_from_slice(b"GGML");
        b
    }));
    // A special token id past the vocabulary (read as an index by a tokenizer).
    out.push(("token_id_past_vocab.gguf", {
        let mut w = GgufWriter::new();
        w.meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
            .meta(
                "tokenizer.ggml.tokens",
                MetaValue::Array(vec!["a", "b"].into()),
            )
            .meta(
                "tokenizer.ggml.merges",
                MetaValue::Array(vec!["a b"].into()),
            )
            .meta(
                "tokenizer.ggml.bos_token_id",
                MetaValue::U64(u32::MAX as u64),
            );
        w.to_bytes()
    }));
    out
}

/// What each crafted file must be refused with.
fn expected(name: &str, err: &GgufError) -> bool {
    use GgufError as E;
    match name {
        "kv_count_huge.gguf" => {
            matches!(err, E::CountTooLarge { field, .. } if field == "kv_count")
        }
        "tensor_count_overflow.gguf" => {
            matches!(err, E::CountTooLarge { field, .. } if field == "tensor_count")
        }
        "key_length_past_end.gguf" | "string_length_wraps.gguf" => {
            matches!(err, E::Truncated { .. })
        }
        "tensor_name_length_past_end.gguf" => {
            matches!(err, E::Truncated { field, .. } if field.contains("tensor #0 name"))
        }
        "array_count_overflow.gguf"
        | "string_array_count_huge.gguf"
        | "nested_array_inner_count_huge.gguf" => {
            matches!(err, E::CountTooLarge { field, .. } if field.contains("array count"))
        }
        "nested_array_three_levels.gguf" => matches!(err, E::NestedArray { .. }),
        "unknown_value_type.gguf" | "unknown_array_element_type.gguf" => {
            matches!(err, E::UnknownValueType { .. })
        }
        "invalid_utf8_key.gguf" => matches!(err, E::InvalidUtf8 { .. }),
        "duplicate_key.gguf" => matches!(err, E::DuplicateKey { .. }),
        "alignment_zero.gguf" => matches!(err, E::BadAlignment { value: 0, .. }),
        "alignment_not_power_of_two.gguf" => matches!(err, E::BadAlignment { value: 24, .. }),
        "tensor_dims_too_many.gguf" => matches!(err, E::BadDimCount { n_dims: 5, .. }),
        "tensor_dims_u32_max.gguf" => matches!(
            err,
            E::BadDimCount {
                n_dims: u32::MAX,
                ..
            }
        ),
        "tensor_dim_zero.gguf" => matches!(err, E::ZeroDimension { dim: 1, .. }),
        "tensor_elements_overflow.gguf" | "tensor_bytes_overflow.gguf" => {
            matches!(err, E::SizeOverflow { .. })
        }
        "tensor_offset_past_end.gguf"
        | "tensor_offset_wraps.gguf"
        | "tensor_sizes_sum_overflow.gguf" => matches!(err, E::TensorOutOfBounds { .. }),
        "tensor_misaligned.gguf" => matches!(err, E::Misaligned { .. }),
        "tensors_overlap.gguf" => matches!(err, E::OverlappingTensors { .. }),
        "duplicate_tensor.gguf" => matches!(err, E::DuplicateTensor { .. }),
        "tensor_type_unknown.gguf" => matches!(err, E::UnknownTensorType { ty: 0xFFFF, .. }),
        "version_1.gguf" => matches!(err, E::UnsupportedVersion { version: 1 }),
        "bad_magic.gguf" => matches!(err, E::BadMagic { .. }),
        _ => false,
    }
}

/// `FLASHLM_WRITE_FIXTURES=1 cargo test --test gguf_hostile write_fixtures` rewrites the files.
#[test]
fn write_fixtures() {
    if std::env::var_os("FLASHLM_WRITE_FIXTURES").is_none() {
        return;
    }
    std::fs::create_dir_all(fixtures_dir()).unwrap();
    for (name, bytes) in crafted() {
        std::fs::write(fixtures_dir().join(name), bytes).unwrap();
    }
}

#[test]
fn hostile_fixtures_fail_with_typed_errors() {
    let crafted = crafted();
    let mut seen = 0;
    for entry in std::fs::read_dir(fixtures_dir()).expect("tests/fixtures/hostile") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.ends_with(".gguf") {
            continue;
        }
        seen += 1;
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() <= 512, "{name}: fixtures stay tiny");
        // The committed file is the one described in `crafted` (so its intent is documented).
        let recipe = crafted.iter().find(|(n, _)| *n == name);
        assert_eq!(
            recipe.map(|(_, b)| b),
            Some(&bytes),
            "{name}: differs from its recipe"
        );
        if name == "token_id_past_vocab.gguf" {
            let g = GgufFile::open(&path).expect("a valid GGUF file");
            let err = Tokenizer::from_gguf(&g).expect_err("the bos id is past the vocabulary");
            assert!(
                matches!(err, TokenizerError::BadSpecialId { id, n_vocab: 2, .. } if id == u32::MAX as u64),
                "{name}: {err:?}"
            );
            continue;
        }
        // Both from memory and from a map.
        let err = GgufFile::from_bytes(bytes).expect_err(&name);
        assert!(expected(&name, &err), "{name}: unexpected {err:?}");
        let err = GgufFile::open(&path).expect_err(&name);
        assert!(
            expected(&name, &err),
            "{name}: unexpected {err:?} from open"
        );
        // Messages are readable and name something.
        assert!(err.to_string().len() > 10);
    }
    assert_eq!(seen, crafted.len(), "every crafted file is committed");
}

#[test]
fn open_errors_and_files_on_disk() {
    let dir = std::env::temp_dir().join(format!("flashlm-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.gguf");
    assert!(matches!(
        GgufFile::open(&missing),
        Err(GgufError::Io { .. })
    ));
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    let valid = dir.join("valid.gguf");
    std::fs::write(&valid, small_valid()).unwrap();
    let f = GgufFile::open(&valid).unwrap();
    assert_eq!(f.bytes(), &small_valid()[..]);
    assert_eq!(f.dequantize_tensor(f.tensor("w").unwrap()).unwrap()[7], 8.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Random mutations

#[test]
fn truncation_at_every_prefix() {
    let bytes = small_valid();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_offset = f.data_offset as usize;
    // The end of the tensor infos: padding follows up to the data section.
    let header_end = {
        // The last tensor info: name "w" (u64 length 1), n_dims, 2 dims, type, offset.
        let name = [1, 0, 0, 0, 0, 0, 0, 0, b'w'];
        let at = bytes.windows(name.len()).rposition(|w| w == name).unwrap();
        at + name.len() + 4 + 2 * 8 + 4 + 8
    };
    assert!(
        header_end < data_offset,
        "the test file has padding before its data"
    );
    for cut in 0..bytes.len() {
        let prefix = bytes[..cut].to_vec();
        let err = match GgufFile::from_bytes(prefix) {
            Ok(_) => panic!("a {cut}-byte prefix of a {}-byte file parsed", bytes.len()),
            Err(e) => e,
        };
        let ok = match cut {
            // Inside the fixed header: a plain short read.
            0..24 => matches!(err, GgufError::Truncated { len, .. } if len == cut as u64),
            // Inside metadata or tensor infos: a short read, or a count that no longer fits.
            _ if cut < header_end => matches!(
                err,
                GgufError::Truncated { len, .. } | GgufError::CountTooLarge { len, .. }
                    if len == cut as u64
            ),
            // Inside the padding before the data section.
            _ if cut < data_offset => matches!(
                err,
                GgufError::Truncated { ref field, len, .. }
                    if len == cut as u64 && field.contains("padding")
            ),
            // Inside the tensor data.
            _ => matches!(err, GgufError::TensorOutOfBounds { data_len, .. }
                if data_len == (cut - data_offset) as u64),
        };
        assert!(ok, "prefix of {cut} bytes: unexpected {err:?}");
    }
}

/// Parses, and when that succeeds uses everything the parser vouched for.
fn parse_and_use(bytes: Vec<u8>) {
    let Ok(f) = GgufFile::from_bytes(bytes) else {
        return;
    };
    for key in &f.metadata_order {
        let _ = f.get_u64(key);
        let _ = f.get_f32(key);
        let _ = f.get_bool(key);
        let _ = f.get_str(key);
        let _ = f.get_str_array(key);
        let _ = f.get_f32_array(key);
        let _ = f.get_i64_array(key);
    }
    for t in &f.tensors {
        assert!(t.offset >= f.data_offset && t.offset + t.n_bytes <= f.file_len);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(f.read_tensor(t).unwrap(), f.tensor_data(t));
        let v = f.dequantize_tensor(t).unwrap();
        assert_eq!(v.len() as u64, t.n_elements);
        assert!(f.dequantize_row(t, t.n_rows() - 1).unwrap().is_some());
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let seeds = [small_valid(), {
        // A second seed file with an explicit alignment and more varied metadata.
        let mut w = GgufWriter::new();
        w.meta("general.alignment", MetaValue::U32(16))
            .meta("b", MetaValue::Bool(true))
            .meta("f", MetaValue::F64(0.5))
            .meta(
                "nested",
                MetaValue::Array(MetaArray::Array(vec![MetaArray::I8(vec![-1])])),
            )
            .tensor_f32("x", &[32, 1], GgmlType::Q4_0, &[0.25; 32])
            .tensor_f32("y", &[2, 2], GgmlType::BF16, &[1.0, 2.0, 3.0, 4.0])
            .tensor_f32("z", &[2], GgmlType::F16, &[1.0, -1.0]);
        w.to_bytes()
    }];
    let interesting: [u64; 8] = [0, 1, 2, 0x7F, 0xFF, 1 << 32, u64::MAX, u64::MAX / 2];
    let mut rng = Rng(0x5EED_F00D_1234_5678);
    let mut parsed = 0;
    for round in 0..4000 {
        let seed = &seeds[round % seeds.len()];
        let mut b = seed.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(b.len());
            match rng.below(4) {
                // A random byte.
                0 => b[at] = rng.next() as u8,
                // A single bit.
                1 => b[at] ^= 1 << rng.below(8),
                // An interesting little-endian u64 (counts, lengths, offsets, dims).
                2 => {
                    let v = interesting[rng.below(interesting.len())].to_le_bytes();
                    for (dst, src) in b[at..].iter_mut().zip(v) {
                        *dst = src;
                    }
                }
                // An interesting u32 (type ids, n_dims).
                _ => {
                    let v = (rng.below(48) as u32).to_le_bytes();
                    for (dst, src) in b[at..].iter_mut().zip(v) {
                        *dst = src;
                    }
                }
            }
        }
        if rng.below(8) == 0 {
            let len = rng.below(b.len() + 1);
            b.truncate(len);
        }
        let copy = b.clone();
        if std::panic::catch_unwind(move || parse_and_use(b)).is_err() {
            panic!("round {round}: the reader panicked on {copy:02x?}");
        }
        parsed += usize::from(GgufFile::from_bytes(copy).is_ok());
    }
    // Flips in tensor data and in metadata values leave valid files: the loop exercised both.
    assert!(
        parsed > 100 && parsed < 3900,
        "{parsed} of 4000 mutated files parsed"
    );
}

// ---------------------------------------------------------------------------------------------
// Model files that change while open

/// A small synthetic llama model written to a fresh file; returns the directory and the path.
fn model_on_disk(tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("flashlm-hostile-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    std::fs::write(
        &path,
        synthetic_llama(&SyntheticSpec::tiny(GgmlType::Q8_0), 7),
    )
    .unwrap();
    (dir, path)
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn truncated_while_open_is_an_error_not_a_signal() {
    let (dir, path) = model_on_disk("truncate");
    let f = GgufFile::open(&path).unwrap();
    let last = f.tensors.iter().max_by_key(|t| t.offset).unwrap().clone();
    let first = f.tensors.iter().min_by_key(|t| t.offset).unwrap().clone();
    let before = f.read_tensor(&last).unwrap();
    assert_eq!(before, f.try_tensor_data(&last).unwrap());
    f.check_file().unwrap();

    // Cut the file inside the tensor data: the last tensor is gone, the first is still there.
    truncate(&path, last.offset + 1);
    let shrunk = |e: GgufError| {
        matches!(e, GgufError::FileShrunk { expected, found, .. }
        if expected == f.file_len && found == last.offset + 1)
    };
    assert!(shrunk(f.check_file().unwrap_err()));
    assert!(shrunk(f.read_tensor(&last).unwrap_err()));
    assert!(shrunk(f.try_tensor_data(&last).unwrap_err()));
    assert!(shrunk(f.dequantize_tensor(&last).unwrap_err()));
    assert!(shrunk(f.dequantize_row(&last, 0).unwrap_err()));
    assert!(shrunk(f.tensor_row_data(&last, 0).unwrap_err()));
    let mut buf = vec![0u8; 64];
    assert!(shrunk(f.read_at(last.offset, &mut buf).unwrap_err()));
    // `pread` of bytes the file still has works; the map-based accessors refuse any access
    // once the file is shorter than when it was opened.
    let mut head = vec![0u8; first.n_bytes as usize];
    f.read_at(first.offset, &mut head).unwrap();
    assert!(shrunk(f.try_tensor_data(&first).unwrap_err()));
    // Reads past the original end are refused before touching the file.
    assert!(matches!(
        f.read_at(f.file_len - 1, &mut buf),
        Err(GgufError::ReadOutOfBounds { .. })
    ));

    // Cut inside the header.
    truncate(&path, 10);
    assert!(matches!(
        f.header_bytes(),
        Err(GgufError::FileShrunk { found: 10, .. })
    ));
    // Growing the file back (with other bytes) makes reads valid again: only length is checked.
    truncate(&path, f.file_len);
    f.check_file().unwrap();
    assert_eq!(f.read_tensor(&last).unwrap(), vec![0u8; before.len()]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn replaced_while_open_keeps_reading_the_opened_file() {
    let (dir, path) = model_on_disk("replace");
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensors.last().unwrap().clone();
    let before = f.read_tensor(&t).unwrap();
    // Replace by rename (what downloaders and editors do): the open file is a different inode.
    let other = dir.join("other.gguf");
    std::fs::write(&other, b"GGUF-but-not-really").unwrap();
    std::fs::rename(&other, &path).unwrap();
    f.check_file().unwrap();
    assert_eq!(f.read_tensor(&t).unwrap(), before);
    assert_eq!(f.try_tensor_data(&t).unwrap(), &before[..]);
    std::fs::remove_dir_all(&dir).unwrap();
}

const SIGBUS_CHILD: &str = "FLASHLM_SIGBUS_CHILD";

/// Run in a child process by `unchecked_access_to_a_truncated_map_is_the_hazard`: reads a
/// truncated map without checking. Does nothing in a normal test run.
#[test]
fn sigbus_child() {
    let Some(path) = std::env::var_os(SIGBUS_CHILD) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    let last = f.tensors.iter().max_by_key(|t| t.offset).unwrap();
    truncate(Path::new(&path), 0);
    let sum: u64 = f.tensor_data(last).iter().map(|&b| b as u64).sum();
    println!("read {sum} without a signal");
}

/// The control for the tests above: the hazard they guard against is real. The unchecked
/// accessor, run in a child process on a truncated file, dies of SIGBUS.
#[cfg(unix)]
#[test]
fn unchecked_access_to_a_truncated_map_is_the_hazard() {
    use std::os::unix::process::ExitStatusExt;
    let (dir, path) = model_on_disk("sigbus");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sigbus_child", "--nocapture", "--test-threads=1"])
        .env(SIGBUS_CHILD, &path)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}
