//! Hostile tokenizer inputs: huge prompts of near-miss special tokens, every Unicode scalar
//! value, arbitrary bytes, arbitrary id sequences, and vocabularies that do not fit the model.

mod common;

use std::time::{Duration, Instant};

use flashlm::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use flashlm::model::config::{ModelConfig, ModelError};
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::model::tokenizer::{Tokenizer, TokenizerData, TokenizerError, gpt2_byte_to_char};

/// A byte-level BPE vocabulary: the 256 byte characters, a few merges, and many special tokens
/// sharing long prefixes (as Llama-3 has 250 `<|reserved_special_token_N|>`, here 20 000).
fn bpe_with_many_specials() -> TokenizerData {
    let mut tokens: Vec<String> = gpt2_byte_to_char().iter().map(|c| c.to_string()).collect();
    let merges: Vec<String> = ["Ġ t", "h e", "Ġt he"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![1i64; tokens.len()];
    for i in 0..10_000 {
        tokens.push(format!("<|reserved_special_token_{i}|>"));
        types.push(3);
        tokens.push(format!("<|user_tool_{i}|>"));
        types.push(4);
    }
    TokenizerData {
        model: "gpt2".into(),
        pre: Some("llama-bpe".into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        ..Default::default()
    }
}

/// A SentencePiece vocabulary with byte fallback.
fn spm() -> TokenizerData {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i64, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for p in ["▁", "▁a", "a", "b", "ab", "▁ab", "é"] {
        tokens.push(p.to_string());
        types.push(1);
    }
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    TokenizerData {
        model: "llama".into(),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    }
}

fn synthetic_model_tokenizer() -> Tokenizer {
    let g = GgufFile::from_bytes(synthetic_llama(&SyntheticSpec::tiny(GgmlType::F32), 1)).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

/// Every tokenizer under test: the hand-made ones, the synthetic model's and the real model's.
fn tokenizers() -> Vec<(&'static str, Tokenizer)> {
    let mut out = vec![
        ("bpe", Tokenizer::new(bpe_with_many_specials()).unwrap()),
        ("spm", Tokenizer::new(spm()).unwrap()),
        ("synthetic", synthetic_model_tokenizer()),
    ];
    if let Some(path) = common::model_path() {
        let g = GgufFile::open(path).unwrap();
        out.push(("default model", Tokenizer::from_gguf(&g).unwrap()));
    }
    out
}

/// Generous: the linear scan takes a few milliseconds per MB; a quadratic one takes minutes.
const BOUND: Duration = Duration::from_secs(2);

#[test]
fn special_token_matching_is_linear_in_the_prompt() {
    let t = Tokenizer::new(bpe_with_many_specials()).unwrap();
    // 1 MB of near misses: each `<|` starts thousands of candidate tokens that all fail late.
    let near_misses = [
        "<|reserved_special_token_",
        "<|reserved_special_token_9999",
        "<|user_tool_12|",
        "<|<|<|",
        "<",
    ];
    for unit in near_misses {
        let prompt = unit.repeat((1 << 20) / unit.len());
        for parse_special in [false, true] {
            let start = Instant::now();
            let ids = t.encode(&prompt, parse_special);
            let took = start.elapsed();
            assert!(took < BOUND, "{unit:?} x {}: {took:?}", prompt.len());
            assert_eq!(t.decode(&ids, false).unwrap(), prompt);
        }
    }
    // And a prompt made of hits: every token is found.
    let unit = "<|reserved_special_token_9999|><|user_tool_7|>";
    let prompt = unit.repeat((1 << 20) / unit.len());
    let start = Instant::now();
    let ids = t.encode(&prompt, true);
    assert!(start.elapsed() < BOUND, "{:?}", start.elapsed());
    assert_eq!(ids.len(), 2 * ((1 << 20) / unit.len()));
    assert_eq!(t.decode(&ids, false).unwrap(), prompt);
}

#[test]
fn huge_prompts_of_every_shape_encode_in_linear_time() {
    let shapes: Vec<String> = vec![
        "a".repeat(1 << 20),
        " ".repeat(1 << 20),
        "\n".repeat(1 << 20),
        " \n".repeat(1 << 19),
        "1".repeat(1 << 20),
        "'s".repeat(1 << 19),
        "é".repeat(1 << 19),
        "🌍".repeat(1 << 18),
        "a ".repeat(1 << 19),
        "!".repeat(1 << 20),
    ];
    for (name, t) in tokenizers() {
        for s in &shapes {
            let start = Instant::now();
            let ids = t.encode(s, true);
            let took = start.elapsed();
            assert!(took < BOUND, "{name}: {:?}.. took {took:?}", &s[..8]);
            assert!(!ids.is_empty());
        }
    }
}

/// What decoding the encoding of `text` must give: the text itself, except that SentencePiece
/// reads U+2581 back as a space, and that a byte-level BPE vocabulary without a token for some
/// byte (the default model lacks eight) encodes that byte as the unknown token.
fn expected_round_trip(spm: bool, t: &Tokenizer, text: &str) -> String {
    if spm {
        return text.replace('\u{2581}', " ");
    }
    let map = gpt2_byte_to_char();
    let unk = t.unk_id().map(|u| t.token_bytes(u).unwrap());
    let mut out = Vec::with_capacity(text.len());
    for &b in text.as_bytes() {
        if t.token_id(&map[b as usize].to_string()).is_some() {
            out.push(b);
        } else {
            out.extend_from_slice(unk.as_deref().expect("a byte without a token needs unk"));
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every Unicode scalar value, in chunks.
fn all_scalar_values() -> impl Iterator<Item = String> {
    let chars: Vec<char> = (0..=0x10FFFFu32).filter_map(char::from_u32).collect();
    chars
        .chunks(4096)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .into_iter()
}

#[test]
fn every_unicode_scalar_value_round_trips() {
    for (name, t) in tokenizers() {
        let spm = name == "spm";
        for text in all_scalar_values() {
            let ids = t.encode_with_bos(&text, false, false);
            let back = t.decode(&ids, false).unwrap();
            let want = expected_round_trip(spm, &t, &text);
            if back != want {
                let at = back
                    .chars()
                    .zip(want.chars())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                let from = text.chars().next().map_or(0, |c| c as u32);
                panic!("{name}: round trip of U+{from:04X}.. differs at char {at}");
            }
        }
    }
}

#[test]
fn arbitrary_bytes_are_never_dropped() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (name, t) in tokenizers() {
        for round in 0..200 {
            let len = (next() % 300) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // The prompt path takes text: invalid sequences become U+FFFD first.
            let text = String::from_utf8_lossy(&bytes).into_owned();
            for parse_special in [false, true] {
                let ids = t.encode_with_bos(&text, parse_special, false);
                let back = t.decode(&ids, false).unwrap();
                let want = expected_round_trip(name == "spm", &t, &text);
                assert_eq!(back, want, "{name} round {round}");
            }
        }
    }
}

#[test]
fn decoding_any_ids_never_panics() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (name, t) in tokenizers() {
        let n = t.n_vocab() as u64;
        for _ in 0..500 {
            let len = (next() % 64) as usize;
            let ids: Vec<u32> = (0..len)
                .map(|_| match next() % 8 {
                    0 => u32::MAX,
                    1 => n as u32,
                    _ => (next() % n) as u32,
                })
                .collect();
            let in_range = ids.iter().all(|&i| (i as u64) < n);
            for skip in [false, true] {
                match t.decode(&ids, skip) {
                    Ok(_) => assert!(in_range, "{name}"),
                    Err(e) => assert!(
                        !in_range && matches!(e, TokenizerError::IdOutOfRange { .. }),
                        "{name}: {e}"
                    ),
                }
                let mut d = t.stream_decoder(skip);
                for &id in &ids {
                    assert_eq!(d.push(id).is_ok(), (id as u64) < n, "{name}");
                }
                d.finish();
            }
            for &id in &ids {
                assert_eq!(t.token_bytes(id).is_ok(), (id as u64) < n);
            }
        }
    }
}

#[test]
fn a_vocabulary_that_cannot_encode_a_byte_is_refused_or_uses_unk() {
    // No byte tokens and no unknown token: text with other characters could not be encoded.
    let mut d = spm();
    let keep: Vec<usize> = (0..d.tokens.len())
        .filter(|&i| !d.tokens[i].starts_with("<0x") && d.tokens[i] != "<unk>")
        .collect();
    d.tokens = keep.iter().map(|&i| d.tokens[i].clone()).collect();
    d.token_types = Some(
        keep.iter()
            .map(|&i| d.token_types.as_ref().unwrap()[i])
            .collect(),
    );
    d.scores = Some(
        keep.iter()
            .map(|&i| d.scores.as_ref().unwrap()[i])
            .collect(),
    );
    d.unk_id = None;
    d.bos_id = Some(0);
    d.eos_id = Some(1);
    let err = Tokenizer::new(d.clone()).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::NoByteFallback {
                byte: 0,
                missing: 243
            }
        ),
        "{err}"
    );
    // With an unknown token, unencodable bytes become it (one per byte), never nothing.
    d.tokens.push("<unk>".into());
    d.token_types.as_mut().unwrap().push(2);
    d.scores.as_mut().unwrap().push(0.0);
    d.unk_id = Some(d.tokens.len() as u32 - 1);
    let t = Tokenizer::new(d).unwrap();
    let ids = t.encode_with_bos("a\u{1F30D}b", false, false);
    let unk = t.unk_id().unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == unk).count(), 4, "{ids:?}");
}

/// The synthetic model with its token list replaced by `n` tokens.
fn with_vocab(n: usize) -> GgufFile {
    let g = GgufFile::from_bytes(synthetic_llama(&SyntheticSpec::tiny(GgmlType::F32), 1)).unwrap();
    let mut w = GgufWriter::new();
    for k in &g.metadata_order {
        let v = match k.as_str() {
            "tokenizer.ggml.tokens" => {
                MetaValue::Array((0..n).map(|i| format!("t{i}")).collect::<Vec<_>>().into())
            }
            "tokenizer.ggml.token_type" => MetaValue::Array(vec![1i32; n].into()),
            _ => g.metadata[k].clone(),
        };
        w.meta(k, v);
    }
    for t in &g.tensors {
        w.tensor(&t.name, &t.dims, t.ty, g.read_tensor(t).unwrap());
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn vocabulary_size_must_match_the_embedding_rows() {
    let rows = SyntheticSpec::tiny(GgmlType::F32).vocab;
    assert!(ModelConfig::from_gguf(&with_vocab(rows)).is_ok());
    for n in [rows - 1, rows + 1, 1] {
        let err = ModelConfig::from_gguf(&with_vocab(n)).unwrap_err();
        assert!(
            matches!(err, ModelError::VocabMismatch { tokens, embedding_rows }
                if tokens == n && embedding_rows == rows),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&n.to_string()) && msg.contains(&rows.to_string()),
            "{msg}"
        );
    }
}
