//! The GGUF reader against the real model and against crafted, malformed files.

mod common;

use flashlm::gguf::{GgmlType, GgufFile};

#[test]
fn real_model() {
    let Some(path) = common::model_path() else {
        return;
    };
    let f = GgufFile::open(&path).expect("the default model parses");
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_u64("llama.block_count").unwrap(), Some(30));

    let embd = f.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(embd.ty, GgmlType::Q8_0);
    assert_eq!(embd.dims, vec![576, 49152]);
    assert_eq!(embd.n_bytes, 576 / 32 * 34 * 49152);
    assert_eq!(f.tensor_data(embd).len() as u64, embd.n_bytes);

    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);

    let norm = f
        .tensor("blk.0.attn_norm.weight")
        .expect("blk.0.attn_norm.weight");
    assert_eq!(norm.ty, GgmlType::F32);
    assert_eq!(norm.dims, vec![576]);
    let w = f.dequantize_tensor(norm).unwrap();
    assert_eq!(w.len(), 576);
    assert!(w.iter().all(|v| v.is_finite()));
    assert!(w.iter().any(|&v| v != 0.0));

    // Every tensor is one of the model's three types, and a row of each decodes to finite values.
    for t in &f.tensors {
        assert!(
            matches!(t.ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::F32),
            "{}",
            t.name
        );
        let row = f.dequantize_row(t, t.n_rows() - 1).unwrap().unwrap();
        assert!(row.iter().all(|v| v.is_finite()), "{}", t.name);
    }
    // The embedding row of a token matches the same row of the whole-tensor decode.
    let row = f.dequantize_row(embd, 1000).unwrap().unwrap();
    let all = f.dequantize_tensor(embd).unwrap();
    assert_eq!(row, all[576 * 1000..576 * 1001]);
}

// ---------------------------------------------------------------------------------------------
// Crafted files

mod gguf_support;

use flashlm::gguf::writer::GgufBytes;
use flashlm::gguf::{GgufError, MetaArray, MetaValue, value_type};
use gguf_support::*;

#[test]
fn small_valid_file_parses() {
    let bytes = small_valid();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.tensors.len(), 2);
    let w = f.tensor("w").unwrap();
    // The last tensor ends exactly at the end of the file, so every shorter prefix is invalid.
    assert_eq!(w.offset + w.n_bytes, bytes.len() as u64);
    assert_eq!(
        f.dequantize_tensor(w).unwrap(),
        (1..=8).map(|i| i as f32).collect::<Vec<_>>()
    );
    assert_eq!(f.get_i64_array("ids").unwrap(), Some(vec![-1, 2]));
}

#[test]
fn bad_magic() {
    let mut b = small_valid();
    b[3] = b'G';
    assert!(matches!(parse_err(b), GgufError::BadMagic { found } if found == *b"GGUG"));
    assert!(matches!(
        parse_err(b"GGML\x01\x00\x00\x00".to_vec()),
        GgufError::BadMagic { .. }
    ));
}

#[test]
fn unsupported_versions() {
    for version in [0, 1, 4, u32::MAX, 0x0300_0000] {
        let mut b = small_valid();
        b[4..8].copy_from_slice(&version.to_le_bytes());
        assert!(
            matches!(parse_err(b), GgufError::UnsupportedVersion { version: v } if v == version),
            "version {version}"
        );
    }
    let mut b = small_valid();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(GgufFile::from_bytes(b).unwrap().version, 2);
}

#[test]
fn huge_counts() {
    for count in [u64::MAX, 1 << 40, 1 << 20] {
        let err = parse_err(header(3, count, 0));
        assert!(
            matches!(err, GgufError::CountTooLarge { ref field, offset: 8, count: c, len: 24 }
                if field == "tensor_count" && c == count),
            "{err:?}"
        );
        let err = parse_err(header(3, 0, count));
        assert!(
            matches!(err, GgufError::CountTooLarge { ref field, offset: 16, count: c, .. }
                if field == "kv_count" && c == count),
            "{err:?}"
        );
    }
    // Counts that fit the file's size but not what is left once metadata has been read.
    let mut b = header(3, 2, 1);
    kv(&mut b, "k", value_type::STRING, &{
        let mut v = Vec::new();
        v.put_str(&"x".repeat(64));
        v
    });
    assert!(
        matches!(parse_err(b), GgufError::CountTooLarge { ref field, .. } if field == "tensor_count")
    );
}

#[test]
fn string_length_past_end() {
    // A key that claims more bytes than the file has.
    let mut b = header(3, 0, 1);
    b.put_u64(1000);
    b.extend_from_slice(b"abcdefgh");
    assert!(
        matches!(parse_err(b), GgufError::Truncated { ref field, offset: 32, needed: 1000, .. }
            if field == "metadata key #0"),
    );
    // A string value with a length of 2^64 - 1.
    let mut v = Vec::new();
    v.put_u64(u64::MAX);
    v.extend_from_slice(&[b'a'; 16]);
    let err = parse_err(one_kv("name", value_type::STRING, &v));
    assert!(
        matches!(err, GgufError::Truncated { ref field, needed: u64::MAX, .. } if field.contains("\"name\"")),
        "{err:?}"
    );
    // A tensor name running past the end.
    let mut b = header(3, 1, 0);
    b.put_u64(40);
    b.extend_from_slice(&[b'n'; 32]);
    assert!(
        matches!(parse_err(b), GgufError::Truncated { ref field, .. } if field.contains("tensor #0 name"))
    );
}

#[test]
fn huge_array_counts() {
    for (elem, count) in [
        (value_type::UINT8, u64::MAX),
        (value_type::UINT8, 1 << 30),
        (value_type::STRING, 1 << 62),
        (value_type::STRING, u64::MAX / 4),
        (value_type::ARRAY, u64::MAX / 8),
        (value_type::FLOAT64, 100),
    ] {
        let mut v = Vec::new();
        v.put_u32(elem);
        v.put_u64(count);
        v.extend_from_slice(&[0u8; 64]);
        let err = parse_err(one_kv("arr", value_type::ARRAY, &v));
        assert!(
            matches!(err, GgufError::CountTooLarge { ref field, count: c, offset: 43, .. }
                if field.contains("\"arr\" array count") && c == count),
            "{elem} x {count}: {err:?}"
        );
    }
}

#[test]
fn unknown_value_types() {
    for ty in [13, 14, 255, u32::MAX] {
        let err = parse_err(one_kv("k", ty, &[0u8; 16]));
        assert!(
            matches!(err, GgufError::UnknownValueType { ref key, offset: 33, ty: t } if key == "k" && t == ty),
            "{err:?}"
        );
    }
    // As an array element type.
    let mut v = Vec::new();
    v.put_u32(77);
    v.put_u64(1);
    v.extend_from_slice(&[0u8; 16]);
    let err = parse_err(one_kv("k", value_type::ARRAY, &v));
    assert!(
        matches!(
            err,
            GgufError::UnknownValueType {
                ty: 77,
                offset: 37,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn nested_arrays() {
    // One level of nesting is read.
    let mut v = Vec::new();
    v.put_u32(value_type::ARRAY);
    v.put_u64(1);
    v.put_u32(value_type::UINT16);
    v.put_u64(2);
    v.extend_from_slice(&[1, 0, 2, 0]);
    let f = GgufFile::from_bytes(one_kv("k", value_type::ARRAY, &v)).unwrap();
    assert_eq!(
        f.get("k"),
        Some(&MetaValue::Array(MetaArray::Array(vec![MetaArray::U16(
            vec![1, 2]
        )])))
    );
    // Two levels are not.
    let mut v = Vec::new();
    v.put_u32(value_type::ARRAY);
    v.put_u64(1);
    v.put_u32(value_type::ARRAY);
    v.put_u64(0);
    v.extend_from_slice(&[0u8; 16]);
    let err = parse_err(one_kv("k", value_type::ARRAY, &v));
    assert!(
        matches!(err, GgufError::NestedArray { offset: 49, .. }),
        "{err:?}"
    );
}

#[test]
fn unknown_tensor_types() {
    for ty in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000, u32::MAX] {
        let err = parse_err(one_tensor(&[32], ty, 0, 128));
        assert!(
            matches!(err, GgufError::UnknownTensorType { ref name, ty: t, offset: 45 } if name == "t" && t == ty),
            "{ty}: {err:?}"
        );
    }
}

#[test]
fn known_unsupported_tensor_types() {
    let err = parse_err(one_tensor(&[256], Q8_K, 0, 256));
    assert!(
        matches!(
            err,
            GgufError::UnsupportedTensorType {
                ty: "Q8_K",
                offset: 45,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("Q8_K"), "{err}");
    for (id, name) in [
        (9, "Q8_1"),
        (18, "IQ3_XXS"),
        (16, "IQ2_XXS"),
        (28, "F64"),
        (39, "MXFP4"),
    ] {
        let err = parse_err(one_tensor(&[256], id, 0, 1024));
        assert!(
            matches!(err, GgufError::UnsupportedTensorType { ty, .. } if ty == name),
            "{err:?}"
        );
    }
}

#[test]
fn bad_dimension_counts() {
    for dims in [&[][..], &[1, 1, 1, 1, 1][..]] {
        let err = parse_err(one_tensor(dims, F32, 0, 64));
        assert!(
            matches!(err, GgufError::BadDimCount { n_dims, offset: 33, .. } if n_dims as usize == dims.len()),
            "{err:?}"
        );
    }
    // A count of 2^32 - 1 is rejected before any dimension is read.
    let mut b = header(3, 1, 0);
    b.put_str("t");
    b.put_u32(u32::MAX);
    let b = with_data(b, 32, 64);
    assert!(matches!(
        parse_err(b),
        GgufError::BadDimCount {
            n_dims: u32::MAX,
            ..
        }
    ));
}

#[test]
fn zero_dimension() {
    let err = parse_err(one_tensor(&[4, 0, 2], F32, 0, 64));
    assert!(
        matches!(
            err,
            GgufError::ZeroDimension {
                dim: 1,
                offset: 45,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn size_overflows() {
    // Element count overflows u64.
    let err = parse_err(one_tensor(&[1 << 40, 1 << 40], F32, 0, 64));
    assert!(
        matches!(err, GgufError::SizeOverflow { offset: 37, .. }),
        "{err:?}"
    );
    // Element count past i64::MAX.
    let err = parse_err(one_tensor(&[1 << 32, 1 << 31], F32, 0, 64));
    assert!(matches!(err, GgufError::SizeOverflow { .. }), "{err:?}");
    // Element count fits (2^62) but the byte size (2^64) does not.
    let err = parse_err(one_tensor(&[1 << 31, 1 << 31], F32, 0, 64));
    assert!(matches!(err, GgufError::SizeOverflow { .. }), "{err:?}");
    // Four large dimensions.
    let err = parse_err(one_tensor(&[1 << 16; 4], F32, 0, 64));
    assert!(matches!(err, GgufError::SizeOverflow { .. }), "{err:?}");
}

#[test]
fn tensor_out_of_bounds() {
    // 8 floats (32 bytes) but only 16 bytes of data.
    let err = parse_err(one_tensor(&[8], F32, 0, 16));
    assert!(
        matches!(
            err,
            GgufError::TensorOutOfBounds {
                start: 0,
                end: 32,
                data_len: 16,
                ..
            }
        ),
        "{err:?}"
    );
    // Offset far past the end.
    let err = parse_err(one_tensor(&[8], F32, 1 << 40, 64));
    assert!(
        matches!(
            err,
            GgufError::TensorOutOfBounds {
                start: 1099511627776,
                ..
            }
        ),
        "{err:?}"
    );
    // Offset + size overflows u64.
    let err = parse_err(one_tensor(&[8], F32, u64::MAX - 31, 64));
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { end: u64::MAX, .. }),
        "{err:?}"
    );
    // A large, valid-looking tensor in a small file.
    let err = parse_err(one_tensor(&[4096, 4096], F32, 0, 64));
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { .. }),
        "{err:?}"
    );
}

#[test]
fn misaligned_offset() {
    let err = parse_err(one_tensor(&[8], F32, 4, 64));
    assert!(
        matches!(
            err,
            GgufError::Misaligned {
                offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{err:?}"
    );
    // The same offset is fine with an alignment of 4.
    let mut b = header(3, 1, 1);
    kv(
        &mut b,
        "general.alignment",
        value_type::UINT32,
        &4u32.to_le_bytes(),
    );
    info(&mut b, "t", &[8], F32, 4);
    let f = GgufFile::from_bytes(with_data(b, 4, 36)).unwrap();
    assert_eq!(f.alignment, 4);
    assert_eq!(f.tensors[0].offset, f.data_offset + 4);
}

#[test]
fn overlapping_tensors() {
    for (a_dims, a_off, b_dims, b_off) in [
        (&[8u64][..], 0u64, &[8u64][..], 0u64),
        (&[16][..], 0, &[8][..], 32),
        // Listed out of order: the later offset comes first in the table.
        (&[8][..], 64, &[32][..], 0),
    ] {
        let mut b = header(3, 2, 0);
        info(&mut b, "a", a_dims, F32, a_off);
        info(&mut b, "b", b_dims, F32, b_off);
        let err = parse_err(with_data(b, 32, 256));
        assert!(
            matches!(err, GgufError::OverlappingTensors { .. }),
            "{err:?}"
        );
    }
    // Adjacent tensors do not overlap.
    let mut b = header(3, 2, 0);
    info(&mut b, "a", &[8], F32, 32);
    info(&mut b, "b", &[8], F32, 0);
    let f = GgufFile::from_bytes(with_data(b, 32, 64)).unwrap();
    assert_eq!(f.tensors.len(), 2);
}

#[test]
fn bad_alignments() {
    for value in [0u32, 3, 48, 1 << 17, u32::MAX] {
        let err = parse_err(one_kv(
            "general.alignment",
            value_type::UINT32,
            &value.to_le_bytes(),
        ));
        assert!(
            matches!(err, GgufError::BadAlignment { value: v, offset: 53 } if v == u64::from(value)),
            "{value}: {err:?}"
        );
    }
    // Negative, and of a non-integer type.
    let err = parse_err(one_kv(
        "general.alignment",
        value_type::INT32,
        &(-32i32).to_le_bytes(),
    ));
    assert!(matches!(err, GgufError::BadMetadata { .. }), "{err:?}");
    let err = parse_err(one_kv(
        "general.alignment",
        value_type::FLOAT32,
        &32f32.to_le_bytes(),
    ));
    assert!(matches!(err, GgufError::BadMetadata { .. }), "{err:?}");
    // Any unsigned type is accepted, and sets where the data section starts.
    let mut b = header(3, 0, 1);
    kv(
        &mut b,
        "general.alignment",
        value_type::UINT64,
        &128u64.to_le_bytes(),
    );
    let short = with_data(b.clone(), 64, 0);
    assert!(matches!(
        parse_err(short),
        GgufError::Truncated {
            offset: 61,
            needed: 67,
            ..
        }
    ));
    assert_eq!(
        GgufFile::from_bytes(with_data(b, 128, 0))
            .unwrap()
            .data_offset,
        128
    );
    let mut b = header(3, 0, 1);
    kv(
        &mut b,
        "general.alignment",
        value_type::UINT16,
        &64u16.to_le_bytes(),
    );
    assert_eq!(
        GgufFile::from_bytes(with_data(b, 64, 0)).unwrap().alignment,
        64
    );
}

#[test]
fn duplicate_key() {
    let mut b = header(3, 0, 3);
    kv(&mut b, "a", value_type::UINT8, &[1]);
    kv(&mut b, "b", value_type::UINT8, &[2]);
    kv(&mut b, "a", value_type::UINT32, &[3, 0, 0, 0]);
    let err = parse_err(with_data(b, 32, 0));
    assert!(
        matches!(err, GgufError::DuplicateKey { ref key, offset: 52 } if key == "a"),
        "{err:?}"
    );
}

#[test]
fn duplicate_tensor_name() {
    let mut b = header(3, 2, 0);
    info(&mut b, "t", &[8], F32, 0);
    info(&mut b, "t", &[8], F32, 32);
    let err = parse_err(with_data(b, 32, 64));
    assert!(
        matches!(err, GgufError::DuplicateTensor { ref name, offset: 57 } if name == "t"),
        "{err:?}"
    );
}

#[test]
fn row_not_a_whole_number_of_blocks() {
    let err = parse_err(one_tensor(&[33, 2], Q4_1, 0, 256));
    assert!(
        matches!(
            err,
            GgufError::BadBlockShape {
                ty: "Q4_1",
                ne0: 33,
                block: 32,
                ..
            }
        ),
        "{err:?}"
    );
    // Rows of 32 but 33 rows is fine: only the row length matters.
    let f = GgufFile::from_bytes(one_tensor(&[32, 33], Q4_1, 0, 33 * 20)).unwrap();
    assert_eq!(f.tensors[0].n_bytes, 660);
    // Super-block types need rows of 256: 32 is not enough for Q6_K (id 14, 210 bytes).
    let err = parse_err(one_tensor(&[32, 8], 14, 0, 210));
    assert!(
        matches!(
            err,
            GgufError::BadBlockShape {
                ty: "Q6_K",
                ne0: 32,
                block: 256,
                ..
            }
        ),
        "{err:?}"
    );
    let f = GgufFile::from_bytes(one_tensor(&[512, 3], 14, 0, 6 * 210)).unwrap();
    assert_eq!(f.tensors[0].n_bytes, 1260);
}

#[test]
fn invalid_utf8() {
    // In a key.
    let mut b = header(3, 0, 1);
    b.put_u64(3);
    b.extend_from_slice(&[b'a', 0xFF, b'b']);
    b.put_u32(value_type::UINT8);
    b.push(0);
    let err = parse_err(with_data(b, 32, 0));
    assert!(
        matches!(err, GgufError::InvalidUtf8 { ref field, offset: 24 } if field == "metadata key #0"),
        "{err:?}"
    );
    // In a string value (a truncated multi-byte sequence).
    let mut v = Vec::new();
    v.put_u64(2);
    v.extend_from_slice(&[b'a', 0xC3]);
    let err = parse_err(one_kv("k", value_type::STRING, &v));
    assert!(
        matches!(err, GgufError::InvalidUtf8 { offset: 37, .. }),
        "{err:?}"
    );
    // In a tensor name.
    let mut b = header(3, 1, 0);
    b.put_u64(2);
    b.extend_from_slice(&[0xED, 0xA0]);
    b.put_u32(1);
    b.put_u64(8);
    b.put_u32(F32);
    b.put_u64(0);
    let err = parse_err(with_data(b, 32, 32));
    assert!(
        matches!(err, GgufError::InvalidUtf8 { ref field, .. } if field == "tensor #0 name"),
        "{err:?}"
    );
}
