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
    let w = f.dequantize_tensor(norm);
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
        let row = f.dequantize_row(t, t.n_rows() - 1).unwrap();
        assert!(row.iter().all(|v| v.is_finite()), "{}", t.name);
    }
    // The embedding row of a token matches the same row of the whole-tensor decode.
    let row = f.dequantize_row(embd, 1000).unwrap();
    let all = f.dequantize_tensor(embd);
    assert_eq!(row, all[576 * 1000..576 * 1001]);
}
