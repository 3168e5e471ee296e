//! Unit tests of the reader: writer round trips, alignment, nesting, the cursor.

use super::parse::Cursor;
use super::*;

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.block_count", MetaValue::U32(2))
        .meta("llama.rope.freq_base", MetaValue::F32(10000.0))
        .meta("flag", MetaValue::Bool(true))
        .meta("neg", MetaValue::I32(-5))
        .meta("tokens", MetaValue::Array(vec!["a", "bc"].into()))
        .meta("scores", MetaValue::Array(vec![0.5f32, -1.0].into()))
        .meta("types", MetaValue::Array(vec![1i32, 3].into()))
        .meta(
            "nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![1]),
                MetaArray::U8(vec![]),
            ])),
        )
        .meta("empty", MetaValue::Array(MetaArray::U8(vec![])));
    let a: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
    w.tensor_f32("a", &[32, 2], GgmlType::Q8_0, &a)
        .tensor_f32("b", &[3], GgmlType::F32, &[1.0, 2.0, 3.0])
        .tensor_f32("c", &[32], GgmlType::Q4_1, &a[..32]);
    w
}

#[test]
fn writer_round_trip() {
    let bytes = sample().to_bytes();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset % 32, 0);
    assert_eq!(f.file_len % 32, 0);
    assert_eq!(f.metadata_order.len(), 10);
    assert_eq!(f.metadata_order[0], "general.architecture");
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(f.get_f32("llama.block_count").unwrap(), Some(2.0));
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), Some(10000.0));
    assert_eq!(f.get_bool("flag").unwrap(), Some(true));
    assert_eq!(f.get_str_array("tokens").unwrap(), Some(vec!["a", "bc"]));
    assert_eq!(f.get_f32_array("scores").unwrap(), Some(vec![0.5, -1.0]));
    assert_eq!(f.get_i64_array("types").unwrap(), Some(vec![1, 3]));
    assert_eq!(f.get_f32_array("types").unwrap(), Some(vec![1.0, 3.0]));
    assert_eq!(f.get_str_array("empty").unwrap(), Some(vec![]));
    assert_eq!(f.get_array("nested").unwrap().map(|a| a.len()), Some(2));

    // Absent keys.
    assert_eq!(f.get_u64("missing").unwrap(), None);
    assert_eq!(f.get_str_array("missing").unwrap(), None);
    // Wrong types.
    assert!(matches!(
        f.get_u64("neg"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_u64("general.architecture"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_str("llama.block_count"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_bool("llama.block_count"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_f32("flag"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_str_array("scores"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_i64_array("scores"),
        Err(GgufError::BadMetadata { .. })
    ));
    assert!(matches!(
        f.get_f32_array("flag"),
        Err(GgufError::BadMetadata { .. })
    ));
    let err = f.get_str_array("nested").unwrap_err().to_string();
    assert!(err.contains("element 0"), "{err}");

    assert_eq!(f.tensors.len(), 3);
    let a = f.tensor("a").unwrap();
    assert_eq!(a.dims, vec![32, 2]);
    assert_eq!(a.ty, GgmlType::Q8_0);
    assert_eq!(
        (
            a.n_elements,
            a.n_bytes,
            a.row_len(),
            a.n_rows(),
            a.row_bytes()
        ),
        (64, 68, 32, 2, 34)
    );
    assert_eq!(a.offset, f.data_offset + a.rel_offset);
    let av = f.dequantize_tensor(a).unwrap();
    assert!((av[63] - 7.75).abs() < 0.05);
    assert_eq!(f.dequantize_row(a, 1).unwrap().unwrap(), av[32..].to_vec());
    assert!(f.dequantize_row(a, 2).unwrap().is_none());
    let b = f.tensor("b").unwrap();
    assert_eq!(b.rel_offset, 96);
    assert_eq!(f.dequantize_tensor(b).unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(f.tensor("c").unwrap().rel_offset, 128);
    assert!(f.tensor("d").is_none());
}

#[test]
fn version_2_and_custom_alignment() {
    let mut w = sample();
    w.version(2).meta(ALIGNMENT_KEY, MetaValue::U64(256));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.version, 2);
    assert_eq!(f.alignment, 256);
    assert_eq!(f.data_offset % 256, 0);
    for t in &f.tensors {
        assert_eq!(t.rel_offset % 256, 0);
    }
    assert_eq!(
        f.dequantize_tensor(f.tensor("b").unwrap()).unwrap(),
        vec![1.0, 2.0, 3.0]
    );

    // An alignment of 1 packs the data with no padding at all.
    let mut w = sample();
    w.meta(ALIGNMENT_KEY, MetaValue::U8(1));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.alignment, 1);
    assert_eq!(f.tensor("b").unwrap().rel_offset, 68);
}

#[test]
fn alignment_of_wrong_type() {
    let mut w = GgufWriter::new();
    w.meta(ALIGNMENT_KEY, MetaValue::String("32".into()));
    let err = GgufFile::from_bytes(w.to_bytes()).unwrap_err();
    assert!(
        matches!(err, GgufError::BadMetadata { ref key, .. } if key == ALIGNMENT_KEY),
        "{err}"
    );
}

#[test]
fn empty_file_and_header_only() {
    assert!(matches!(
        GgufFile::from_bytes(Vec::new()),
        Err(GgufError::Truncated {
            offset: 0,
            needed: 4,
            ..
        })
    ));
    let bytes = GgufWriter::new().to_bytes();
    assert_eq!(bytes.len(), 32);
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(
        (f.tensors.len(), f.metadata.len(), f.data_offset),
        (0, 0, 32)
    );
}

#[test]
fn doubly_nested_array_is_rejected() {
    let mut w = GgufWriter::new();
    w.meta(
        "deep",
        MetaValue::Array(MetaArray::Array(vec![MetaArray::Array(vec![])])),
    );
    let err = GgufFile::from_bytes(w.to_bytes()).unwrap_err();
    assert!(
        matches!(err, GgufError::NestedArray { ref key, .. } if key == "deep"),
        "{err}"
    );
}

#[test]
fn cursor_is_bounds_checked() {
    let buf = [1u8, 2, 3];
    let mut c = Cursor { buf: &buf, pos: 0 };
    assert!(c.take(u64::MAX).is_err());
    assert_eq!(c.array::<2>().unwrap(), [1, 2]);
    let short = c.array::<2>().unwrap_err();
    assert_eq!((short.offset, short.needed), (2, 2));
    assert_eq!(c.remaining(), 1);
    assert_eq!(c.take(1).unwrap(), &[3]);
    assert_eq!(c.take(0).unwrap(), &[] as &[u8]);
    assert!(c.take(1).is_err());
}

#[test]
fn errors_name_field_and_offset() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()));
    let mut bytes = w.to_bytes();
    // Cut inside the key's 20 bytes, which start at byte 32 after its length.
    bytes.truncate(40);
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::Truncated { ref field, offset: 32, needed: 20, len: 40 } if field == "metadata key #0"),
        "{err:?}"
    );
    assert!(err.to_string().contains("byte 32"), "{err}");
}
