//! Tokenizers on arbitrary text and arbitrary id sequences: the default model's (when it is
//! cached), a synthetic byte-level BPE model's and a SentencePiece vocabulary with byte fallback.
//!
//! Input: byte 0 picks the tokenizer and the mode, the rest is the text (invalid UTF-8 is
//! replaced, as on the prompt path) or the ids (little-endian u32s).
#![no_main]

use std::sync::OnceLock;

use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::model::tokenizer::{Tokenizer, TokenizerData};
use libfuzzer_sys::fuzz_target;

mod common;

fn spm() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i64, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for p in [
        "▁",
        "▁a",
        "a",
        "b",
        "ab",
        "▁ab",
        "é",
        "<tool>",
        "<|im_start|>",
    ] {
        tokens.push(p.to_string());
        types.push(if p.starts_with('<') { 4 } else { 1 });
    }
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    Tokenizer::new(TokenizerData {
        model: "llama".into(),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    })
    .expect("the SentencePiece vocabulary is valid")
}

fn tokenizers() -> &'static [Tokenizer] {
    static ALL: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    ALL.get_or_init(|| {
        let synthetic =
            GgufFile::from_bytes(synthetic_llama(&SyntheticSpec::tiny(GgmlType::F32), 1))
                .expect("the synthetic model parses");
        let mut all = vec![
            Tokenizer::from_gguf(&synthetic).expect("synthetic tokenizer"),
            spm(),
        ];
        let real = flashlm::paths::default_model_path();
        if let Ok(g) = GgufFile::open(&real) {
            all.push(Tokenizer::from_gguf(&g).expect("the default model's tokenizer"));
        }
        all
    })
}

fuzz_target!(|data: &[u8]| {
    common::alt_stack();
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let all = tokenizers();
    let t = &all[(sel as usize >> 2) % all.len()];
    let n = t.n_vocab() as u64;
    match sel & 3 {
        0 | 1 => {
            let text = String::from_utf8_lossy(rest);
            let ids = t.encode(&text, sel & 1 == 1);
            assert!(ids.iter().all(|&i| (i as u64) < n));
            // Every byte reaches the output (as itself, a byte token or the unknown token): the
            // decoded text is never shorter than the input, except for SentencePiece's leading
            // space and U+2581, which it reads back as a space.
            let back = t.decode(&ids, false).expect("encoded ids decode");
            let want = text.replace('\u{2581}', " ");
            assert!(back.len() + 1 >= want.len(), "{text:?} -> {back:?}");
        }
        _ => {
            let ids: Vec<u32> = rest
                .chunks(4)
                .map(|c| {
                    let mut w = [0u8; 4];
                    w[..c.len()].copy_from_slice(c);
                    // Mostly in range, sometimes not.
                    let v = u32::from_le_bytes(w);
                    if v & 0x8000_0000 == 0 {
                        (v as u64 % n) as u32
                    } else {
                        v
                    }
                })
                .collect();
            let valid = ids.iter().all(|&i| (i as u64) < n);
            let skip = sel & 1 == 1;
            assert_eq!(t.decode(&ids, skip).is_ok(), valid);
            let mut d = t.stream_decoder(skip);
            for &id in &ids {
                assert_eq!(d.push(id).is_ok(), (id as u64) < n);
            }
            d.finish();
        }
    }
});
