//! Unit tests of the tokenizer on tiny hand-made vocabularies.

use regex::Regex;

use super::pretok::{split_digits, split_with_regex};
use super::*;
use crate::gguf::{GgufFile, MetaValue};

fn split_all(pre: PreTokenizer, text: &str) -> Vec<String> {
    let re = Regex::new(pre.pattern()).unwrap();
    let mut out = Vec::new();
    let nl = pre.has_newline_alternative();
    let mut push = |s: &str| out.push(s.to_string());
    match pre {
        PreTokenizer::DigitsThenGpt2 => {
            split_digits(text, &mut |p| split_with_regex(&re, nl, p, &mut push))
        }
        _ => split_with_regex(&re, nl, text, &mut push),
    }
    out
}

#[test]
fn tokenizer_is_shareable() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

#[test]
fn gpt2_byte_table_is_a_bijection() {
    let map = gpt2_byte_to_char();
    let mut seen = std::collections::HashSet::new();
    for c in map {
        assert!(seen.insert(c));
        assert!(!c.is_whitespace() && !c.is_control());
    }
    assert_eq!(map[b' ' as usize], 'Ġ');
    assert_eq!(map[b'\n' as usize], 'Ċ');
    assert_eq!(map[b'a' as usize], 'a');
    assert_eq!(map[0], '\u{100}');
}

#[test]
fn gpt2_split_emulates_lookahead() {
    let p = PreTokenizer::Gpt2;
    assert_eq!(split_all(p, "Hello   world"), ["Hello", "  ", " world"]);
    assert_eq!(split_all(p, "a\n\nb"), ["a", "\n", "\n", "b"]);
    assert_eq!(split_all(p, "abc  "), ["abc", "  "]);
    assert_eq!(split_all(p, "  x"), [" ", " x"]);
    assert_eq!(split_all(p, " \tx"), [" ", "\t", "x"]);
    assert_eq!(split_all(p, "I'm 12345!!"), ["I", "'m", " 12345", "!!"]);
    assert_eq!(split_all(p, "I'M"), ["I", "'", "M"]);
    assert_eq!(split_all(p, ""), Vec::<String>::new());
}

#[test]
fn digits_split_first() {
    let p = PreTokenizer::DigitsThenGpt2;
    assert_eq!(
        split_all(p, "in 2024!"),
        ["in", " ", "2", "0", "2", "4", "!"]
    );
    assert_eq!(split_all(p, "x٣y"), ["x", "٣", "y"]);
}

#[test]
fn llama3_split() {
    let p = PreTokenizer::Llama3;
    assert_eq!(
        split_all(p, "Hello   world\n\n  x"),
        ["Hello", "  ", " world", "\n\n", " ", " x"]
    );
    assert_eq!(split_all(p, "1234567"), ["123", "456", "7"]);
    assert_eq!(split_all(p, "I'M ok"), ["I", "'M", " ok"]);
    assert_eq!(split_all(p, "a.\n\nb"), ["a", ".\n\n", "b"]);
    assert_eq!(split_all(PreTokenizer::Qwen2, "123"), ["1", "2", "3"]);
}

#[test]
fn unknown_pre_falls_back_to_gpt2() {
    assert_eq!(PreTokenizer::from_name("no-such-thing"), PreTokenizer::Gpt2);
    assert_eq!(
        PreTokenizer::from_name("smollm"),
        PreTokenizer::DigitsThenGpt2
    );
    assert_eq!(PreTokenizer::from_name("llama-bpe"), PreTokenizer::Llama3);
}

/// A byte-level BPE vocabulary: the 256 byte characters, a few merges, two specials.
fn tiny_bpe() -> TokenizerData {
    let map = gpt2_byte_to_char();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
    tokens.extend(map.iter().map(|c| c.to_string()));
    let merges: Vec<String> = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "a a",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<tool>".into());
    let mut types = vec![1i64; tokens.len()];
    types[0] = 3;
    types[1] = 3;
    *types.last_mut().unwrap() = 4;
    TokenizerData {
        model: "gpt2".into(),
        pre: Some("gpt2".into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        eos_id: Some(0),
        ..Default::default()
    }
}

#[test]
fn bpe_merges_by_rank() {
    let t = Tokenizer::new(tiny_bpe()).unwrap();
    let ids = t.encode("hello wor", false);
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["hello", "Ġwor"]);
    // Equal pairs merge leftmost first: "aaa" -> "aa" + "a".
    let ids = t.encode("aaa", false);
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["aa", "a"]);
    assert_eq!(
        t.decode(&t.encode("hello wor", false), false).unwrap(),
        "hello wor"
    );
    // Twice, to go through the cache.
    assert_eq!(t.encode("hello", false), t.encode("hello", false));
}

#[test]
fn llama3_uses_whole_word_tokens() {
    let mut d = tiny_bpe();
    d.tokens.push("abc".into());
    d.token_types.as_mut().unwrap().push(1);
    let gpt2 = Tokenizer::new(d.clone()).unwrap();
    assert_eq!(gpt2.encode("abc", false).len(), 3);
    d.pre = Some("llama-bpe".into());
    let llama3 = Tokenizer::new(d).unwrap();
    assert_eq!(
        llama3.encode("abc", false),
        [llama3.token_id("abc").unwrap()]
    );
}

#[test]
fn bpe_specials_and_eog() {
    let t = Tokenizer::new(tiny_bpe()).unwrap();
    let ids = t.encode("a<|im_end|>b<tool>", true);
    assert_eq!(ids[1], 1);
    assert_eq!(t.token_text(*ids.last().unwrap()), Some("<tool>"));
    // Control tokens stay text without parse_special; user-defined ones are always matched.
    let ids = t.encode("<|im_end|><tool>", false);
    assert!(!ids.contains(&1));
    assert_eq!(t.token_text(*ids.last().unwrap()), Some("<tool>"));
    assert!(t.is_end_of_generation(0));
    assert!(t.is_end_of_generation(1));
    assert!(!t.is_end_of_generation(2));
    assert_eq!(t.decode(&[1, 2 + b'a' as u32], true).unwrap(), "a");
    assert_eq!(
        t.decode(&[1, 2 + b'a' as u32], false).unwrap(),
        "<|im_end|>a"
    );
    assert_eq!(t.decode(&[], false).unwrap(), "");
}

#[test]
fn bpe_errors() {
    let mut d = tiny_bpe();
    d.merges.as_mut().unwrap().push("nospace".into());
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::BadMerge { index: 8, .. })
    ));
    let mut d = tiny_bpe();
    d.merges.as_mut().unwrap().push("x ".into());
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::BadMerge { .. })
    ));
    let mut d = tiny_bpe();
    d.merges = None;
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::MissingKey("tokenizer.ggml.merges"))
    ));
    let mut d = tiny_bpe();
    d.token_types.as_mut().unwrap().pop();
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::CountMismatch { .. })
    ));
    let mut d = tiny_bpe();
    d.token_types.as_mut().unwrap()[5] = 9;
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::BadTokenType { index: 5, value: 9 })
    ));
    let mut d = tiny_bpe();
    d.model = "bert".into();
    let e = Tokenizer::new(d).unwrap_err();
    assert!(e.to_string().contains("\"bert\""), "{e}");
    let mut d = tiny_bpe();
    d.bos_id = Some(100_000);
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::BadSpecialId { .. })
    ));
    let d = TokenizerData {
        model: "gpt2".into(),
        merges: Some(vec![]),
        ..Default::default()
    };
    assert!(matches!(Tokenizer::new(d), Err(TokenizerError::EmptyVocab)));

    let t = Tokenizer::new(tiny_bpe()).unwrap();
    let n = t.n_vocab() as u32;
    assert!(matches!(
        t.decode(&[0, n], false),
        Err(TokenizerError::IdOutOfRange { .. })
    ));
    assert!(t.token_bytes(n).is_err());
    assert!(t.stream_decoder(false).push(u32::MAX).is_err());
}

/// A SentencePiece vocabulary with byte fallback.
fn tiny_spm() -> TokenizerData {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i64, 3, 3];
    let mut scores = vec![0.0f32, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let pieces: &[(&str, f32)] = &[
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("ll", -3.0),
        ("▁h", -4.0),
        ("▁he", -5.0),
        ("▁hell", -6.0),
        ("▁hello", -7.0),
        ("or", -3.5),
        ("▁w", -4.0),
        ("▁wor", -6.5),
        ("▁world", -8.0),
        ("ld", -9.0),
        ("▁▁", -9.5),
    ];
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(*s);
    }
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

#[test]
fn spm_encodes_by_score_with_byte_fallback() {
    let t = Tokenizer::new(tiny_spm()).unwrap();
    assert!(t.add_bos() && t.add_space_prefix());
    let ids = t.encode("hello world", false);
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["<s>", "▁hello", "▁world"]);
    assert_eq!(t.decode(&ids, true).unwrap(), "hello world");
    assert_eq!(t.decode(&ids, false).unwrap(), "<s> hello world");

    // "é" is not in the vocabulary: UTF-8 bytes C3 A9.
    let ids = t.encode_with_bos("hé", false, false);
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["▁h", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hé");

    // Double spaces, leading/trailing spaces.
    for s in ["", " ", "  hello  world ", "héllo wörld 🌍", "\n"] {
        let ids = t.encode(s, false);
        assert_eq!(t.decode(&ids, true).unwrap(), s, "{s:?}: {ids:?}");
    }
    // Equal scores merge leftmost first.
    let texts = |ids: Vec<u32>| -> Vec<String> {
        ids.iter()
            .map(|&i| t.token_text(i).unwrap().to_string())
            .collect()
    };
    assert_eq!(texts(t.encode_with_bos("   ", false, false)), ["▁▁", "▁▁"]);
    assert_eq!(texts(t.encode_with_bos("  ", false, false)), ["▁▁", "▁"]);
    // The higher score wins over the leftmost pair: "ll" (-3) before "▁h" (-4).
    assert_eq!(texts(t.encode_with_bos("hell", false, false)), ["▁hell"]);
    assert_eq!(texts(t.encode_with_bos("hel", false, false)), ["▁he", "l"]);
    // After a special token the text gets a space prefix again.
    assert_eq!(
        texts(t.encode_with_bos("</s>hello", true, false)),
        ["</s>", "▁hello"]
    );
    // BOS is not doubled when the text already starts with it.
    let ids = t.encode("<s>hello", true);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1);
    assert!(t.is_end_of_generation(2));
}

/// `data` as a tensor-less GGUF file (the special ids are left out).
fn spm_gguf(data: &TokenizerData, extra: &[(&str, MetaValue)]) -> GgufFile {
    use crate::gguf::writer::GgufWriter;
    let mut w = GgufWriter::new();
    w.meta(
        "tokenizer.ggml.model",
        MetaValue::String(data.model.clone()),
    );
    w.meta(
        "tokenizer.ggml.tokens",
        MetaValue::Array(data.tokens.iter().cloned().map(MetaValue::String).collect()),
    );
    if let Some(types) = &data.token_types {
        w.meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t as i32)).collect()),
        );
    }
    if let Some(scores) = &data.scores {
        w.meta(
            "tokenizer.ggml.scores",
            MetaValue::Array(scores.iter().map(|&s| MetaValue::F32(s)).collect()),
        );
    }
    for (k, v) in extra {
        w.meta(k, v.clone());
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn spm_from_gguf_uses_defaults() {
    let g = spm_gguf(&tiny_spm(), &[]);
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(t.model(), TokenizerModel::SentencePiece);
    assert_eq!(
        (t.unk_id(), t.bos_id(), t.eos_id()),
        (Some(0), Some(1), Some(2))
    );
    assert!(t.add_bos() && t.add_space_prefix());
    let plain = Tokenizer::new(tiny_spm()).unwrap();
    assert_eq!(
        t.encode("hello world", false),
        plain.encode("hello world", false)
    );

    let g = spm_gguf(
        &tiny_spm(),
        &[
            ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
            ("tokenizer.ggml.eos_token_id", MetaValue::U32(5)),
        ],
    );
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(!t.add_bos());
    assert_eq!(t.eos_id(), Some(5));

    let g = spm_gguf(
        &tiny_spm(),
        &[("tokenizer.ggml.bos_token_id", MetaValue::U64(1 << 40))],
    );
    assert!(matches!(
        Tokenizer::from_gguf(&g),
        Err(TokenizerError::BadSpecialId { .. })
    ));
    let mut d = tiny_spm();
    d.model = "t5".into();
    let e = Tokenizer::from_gguf(&spm_gguf(&d, &[])).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnsupportedModel(ref m) if m == "t5"),
        "{e}"
    );
    let mut d = tiny_spm();
    d.model = "gpt2".into();
    assert!(matches!(
        Tokenizer::from_gguf(&spm_gguf(&d, &[])),
        Err(TokenizerError::MissingKey("tokenizer.ggml.merges"))
    ));
    let g = GgufFile::from_bytes(crate::gguf::writer::GgufWriter::new().to_bytes()).unwrap();
    assert!(matches!(
        Tokenizer::from_gguf(&g),
        Err(TokenizerError::MissingKey("tokenizer.ggml.model"))
    ));
}

#[test]
fn spm_requires_scores() {
    let mut d = tiny_spm();
    d.scores = None;
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::MissingKey("tokenizer.ggml.scores"))
    ));
    let mut d = tiny_spm();
    d.scores.as_mut().unwrap().push(0.0);
    assert!(matches!(
        Tokenizer::new(d),
        Err(TokenizerError::CountMismatch { .. })
    ));
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let t = Tokenizer::new(tiny_spm()).unwrap();
    let ids = t.encode("hé🌍 world", false);
    let mut d = t.stream_decoder(true);
    let mut parts = Vec::new();
    for &id in &ids {
        parts.push(d.push(id).unwrap());
    }
    parts.push(d.finish());
    assert!(parts.iter().all(|p| !p.contains('\u{FFFD}')));
    assert_eq!(parts.concat(), t.decode(&ids, true).unwrap());
    assert_eq!(parts.concat(), "hé🌍 world");
    // An invalid continuation is replaced, then decoding goes on.
    let c3 = t.token_id("<0xC3>").unwrap();
    let h = t.token_id("h").unwrap();
    let mut d = t.stream_decoder(true);
    assert_eq!(d.push(c3).unwrap(), "");
    assert_eq!(d.push(h).unwrap(), "\u{FFFD}h");
    assert_eq!(d.push(c3).unwrap(), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(t.decode(&[c3, h, c3], true).unwrap(), "\u{FFFD}h\u{FFFD}");
}
