//! Building a tokenizer from plain data or GGUF metadata, checking it for consistency.

use std::collections::HashMap;
use std::sync::Mutex;

use super::pretok::{PreTokenizer, gpt2_byte_to_char};
use super::special::SpecialMatcher;
use super::{SPM_SPACE, TokenType, Tokenizer, TokenizerData, TokenizerError, TokenizerModel};
use crate::gguf::GgufFile;

/// Texts of control tokens that end a generation in common chat formats.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<|return|>",
    "<EOT>",
    "</s>",
    "<｜end▁of▁sentence｜>",
];

/// Parses a `<0xXX>` byte-token text.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn check_special_id(
    key: &'static str,
    id: Option<u32>,
    n_vocab: usize,
) -> Result<Option<u32>, TokenizerError> {
    match id {
        Some(id) if id as usize >= n_vocab => Err(TokenizerError::BadSpecialId {
            key,
            id: id as u64,
            n_vocab,
        }),
        other => Ok(other),
    }
}

impl Tokenizer {
    /// Builds a tokenizer from plain data, checking it for consistency.
    pub fn new(data: TokenizerData) -> Result<Self, TokenizerError> {
        let model = TokenizerModel::from_name(&data.model)?;
        let n_vocab = data.tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n_vocab > u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n_vocab));
        }

        let types = match &data.token_types {
            None => vec![TokenType::Normal; n_vocab],
            Some(codes) => {
                if codes.len() != n_vocab {
                    return Err(TokenizerError::CountMismatch {
                        key: "tokenizer.ggml.token_type",
                        expected: n_vocab,
                        found: codes.len(),
                    });
                }
                codes
                    .iter()
                    .enumerate()
                    .map(|(index, &value)| {
                        TokenType::from_code(value)
                            .ok_or(TokenizerError::BadTokenType { index, value })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };

        let scores = match (model, data.scores) {
            (TokenizerModel::SentencePiece, None) => {
                return Err(TokenizerError::MissingKey("tokenizer.ggml.scores"));
            }
            (_, Some(s)) if s.len() != n_vocab => {
                return Err(TokenizerError::CountMismatch {
                    key: "tokenizer.ggml.scores",
                    expected: n_vocab,
                    found: s.len(),
                });
            }
            (TokenizerModel::SentencePiece, Some(s)) => s,
            (TokenizerModel::Bpe, _) => Vec::new(),
        };

        // The first occurrence of a duplicated text keeps the name.
        let mut token_to_id = HashMap::with_capacity(n_vocab);
        for (i, t) in data.tokens.iter().enumerate() {
            token_to_id.entry(t.clone()).or_insert(i as u32);
        }

        let bos_id = check_special_id("tokenizer.ggml.bos_token_id", data.bos_id, n_vocab)?;
        let eos_id = check_special_id("tokenizer.ggml.eos_token_id", data.eos_id, n_vocab)?;
        let unk_id = check_special_id("tokenizer.ggml.unknown_token_id", data.unk_id, n_vocab)?;
        let pad_id = check_special_id("tokenizer.ggml.padding_token_id", data.pad_id, n_vocab)?;
        let eot_id = check_special_id("tokenizer.ggml.eot_token_id", data.eot_id, n_vocab)?;
        let eom_id = check_special_id("tokenizer.ggml.eom_token_id", data.eom_id, n_vocab)?;

        let pre = match (model, data.pre.as_deref()) {
            (TokenizerModel::Bpe, Some(name)) => PreTokenizer::from_name(name),
            _ => PreTokenizer::Gpt2,
        };
        let pre_regex = pre.regex().map_err(|e| {
            // The patterns are constants: this would be a bug in this file.
            TokenizerError::UnsupportedModel(format!("pre-tokenizer regex: {e}"))
        })?;

        let byte_to_char = gpt2_byte_to_char();
        let mut char_to_byte = HashMap::with_capacity(256);
        for (b, &c) in byte_to_char.iter().enumerate() {
            char_to_byte.insert(c, b as u8);
        }

        // What each token decodes to.
        let pieces: Vec<Vec<u8>> = data
            .tokens
            .iter()
            .zip(&types)
            .map(|(text, ty)| match ty {
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    text.as_bytes().to_vec()
                }
                TokenType::Byte => match parse_byte_token(text) {
                    Some(b) => vec![b],
                    None => text.as_bytes().to_vec(),
                },
                _ => match model {
                    TokenizerModel::Bpe => {
                        let mut out = Vec::with_capacity(text.len());
                        for c in text.chars() {
                            match char_to_byte.get(&c) {
                                Some(&b) => out.push(b),
                                None => {
                                    let mut buf = [0u8; 4];
                                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                                }
                            }
                        }
                        out
                    }
                    TokenizerModel::SentencePiece => text.replace(SPM_SPACE, " ").into_bytes(),
                },
            })
            .collect();

        let mut byte_ids = [None; 256];
        let mut merges = HashMap::new();
        match model {
            TokenizerModel::Bpe => {
                let mut buf = [0u8; 4];
                for (b, slot) in byte_ids.iter_mut().enumerate() {
                    *slot = token_to_id
                        .get(byte_to_char[b].encode_utf8(&mut buf) as &str)
                        .copied();
                }
                let missing = byte_ids.iter().filter(|x| x.is_none()).count();
                if missing > 0 {
                    log::info!(
                        "byte-level BPE vocabulary lacks {missing} of the 256 byte tokens; \
                         such bytes encode to the unknown token"
                    );
                }
                let lines = data
                    .merges
                    .as_ref()
                    .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
                merges.reserve(lines.len());
                let mut skipped = 0usize;
                for (index, line) in lines.iter().enumerate() {
                    // The separator is the first space after the first character.
                    let split = line
                        .char_indices()
                        .skip(1)
                        .find(|&(_, c)| c == ' ')
                        .map(|(i, _)| i);
                    let (left, right) = match split {
                        Some(i) if i + 1 < line.len() => (&line[..i], &line[i + 1..]),
                        _ => {
                            return Err(TokenizerError::BadMerge {
                                index,
                                line: line.clone(),
                            });
                        }
                    };
                    let merged = format!("{left}{right}");
                    match (
                        token_to_id.get(left),
                        token_to_id.get(right),
                        token_to_id.get(&merged),
                    ) {
                        (Some(&l), Some(&r), Some(&m)) => {
                            merges.entry((l, r)).or_insert((index as u32, m));
                        }
                        _ => skipped += 1,
                    }
                }
                if skipped > 0 {
                    log::warn!(
                        "{skipped} of {} BPE merges name tokens missing from the vocabulary; \
                         they are ignored",
                        lines.len()
                    );
                }
            }
            TokenizerModel::SentencePiece => {
                for (i, ty) in types.iter().enumerate() {
                    if *ty == TokenType::Byte
                        && let Some(b) = parse_byte_token(&data.tokens[i])
                    {
                        byte_ids[b as usize].get_or_insert(i as u32);
                    }
                }
            }
        }

        // Every byte that UTF-8 text can contain must reach the output: as a byte token, or
        // the unknown token. (0xC0, 0xC1 and 0xF5..=0xFF never occur in a `&str`.)
        if unk_id.is_none() {
            let missing: Vec<u8> = (0..=255u8)
                .filter(|&b| !matches!(b, 0xC0 | 0xC1 | 0xF5..=0xFF))
                .filter(|&b| byte_ids[b as usize].is_none())
                .collect();
            if let Some(&byte) = missing.first() {
                return Err(TokenizerError::NoByteFallback {
                    byte,
                    missing: missing.len(),
                });
            }
        }

        let specials = SpecialMatcher::new(&data.tokens, &types)?;

        // End of generation: eos, eot, eom, and well-known end-of-turn tokens.
        let mut eog_ids: Vec<u32> = [eos_id, eot_id, eom_id].into_iter().flatten().collect();
        for text in END_OF_GENERATION_TEXTS {
            if let Some(&id) = token_to_id.get(*text)
                && matches!(
                    types[id as usize],
                    TokenType::Control | TokenType::UserDefined
                )
            {
                eog_ids.push(id);
            }
        }
        eog_ids.sort_unstable();
        eog_ids.dedup();

        let (add_bos_default, add_space_default) = match model {
            TokenizerModel::SentencePiece => (true, true),
            TokenizerModel::Bpe => (false, false),
        };

        Ok(Tokenizer {
            model,
            pre,
            pre_regex,
            tokens: data.tokens,
            types,
            token_to_id,
            pieces,
            scores,
            merges,
            byte_ids,
            specials,
            bos_id,
            eos_id,
            unk_id,
            pad_id,
            eog_ids,
            add_bos: data.add_bos.unwrap_or(add_bos_default),
            add_space_prefix: data.add_space_prefix.unwrap_or(add_space_default),
            ignore_merges: pre == PreTokenizer::Llama3,
            byte_chars: byte_to_char,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Reads the tokenizer from a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        let model = gguf
            .get_str("tokenizer.ggml.model")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?
            .to_string();
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n_vocab = tokens.len();
        let id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match gguf.get_u64(key)? {
                None => Ok(None),
                Some(v) => u32::try_from(v)
                    .map(Some)
                    .map_err(|_| TokenizerError::BadSpecialId {
                        key,
                        id: v,
                        n_vocab,
                    }),
            }
        };
        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")?
            .map(|m| m.into_iter().map(str::to_string).collect());
        let mut data = TokenizerData {
            pre: gguf.get_str("tokenizer.ggml.pre")?.map(str::to_string),
            token_types: gguf.get_i64_array("tokenizer.ggml.token_type")?,
            scores: gguf.get_f32_array("tokenizer.ggml.scores")?,
            merges,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            eom_id: id("tokenizer.ggml.eom_token_id")?,
            add_bos: gguf.get_bool("tokenizer.ggml.add_bos_token")?,
            add_space_prefix: gguf.get_bool("tokenizer.ggml.add_space_prefix")?,
            model,
            tokens,
        };
        // SentencePiece files conventionally use <unk>=0, <s>=1, </s>=2 when the ids are absent.
        if data.model == "llama" {
            let n = data.tokens.len();
            let default = |v: u32| (v as usize) < n;
            if data.unk_id.is_none() && default(0) {
                data.unk_id = Some(0);
            }
            if data.bos_id.is_none() && default(1) {
                data.bos_id = Some(1);
            }
            if data.eos_id.is_none() && default(2) {
                data.eos_id = Some(2);
            }
        }
        Tokenizer::new(data)
    }
}
