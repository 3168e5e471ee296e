//! Tokenizers described by GGUF metadata.
//!
//! Two model types are supported, chosen by `tokenizer.ggml.model`:
//!
//! * `"gpt2"`: byte-level BPE. Text is split by a pre-tokenizer regex (chosen by
//!   `tokenizer.ggml.pre`), every byte of a piece is mapped to a printable character (the GPT-2
//!   byte/unicode table), and adjacent symbols are merged by the rank of `tokenizer.ggml.merges`.
//! * `"llama"`: SentencePiece-style. Spaces become `▁`, a space is prefixed when
//!   `tokenizer.ggml.add_space_prefix` says so, adjacent symbols are merged greedily by the highest
//!   `tokenizer.ggml.scores`, and characters outside the vocabulary fall back to `<0xXX>` byte
//!   tokens.
//!
//! Control and user-defined tokens are matched as whole strings before either algorithm runs
//! (control tokens only when the caller asks to parse special tokens).
//!
//! Control and user-defined tokens are found with one Aho-Corasick automaton (time linear in
//! the text), and every byte of the input reaches the output: through its own token, a byte
//! fallback token, or the unknown token (a vocabulary that can do none of these for some byte is
//! refused when the tokenizer is built).
//!
//! [`Tokenizer::new`] builds a tokenizer from plain data ([`TokenizerData`]);
//! [`Tokenizer::from_gguf`] only reads that data from a [`GgufFile`](crate::gguf::GgufFile).

mod bpe;
mod build;
mod pretok;
mod special;
mod spm;
mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use regex::Regex;
use thiserror::Error;

use crate::gguf::GgufError;

pub use pretok::{PreTokenizer, gpt2_byte_to_char};
pub use stream::StreamDecoder;

use special::{Fragment, SpecialMatcher};

/// Everything that can be wrong with a tokenizer description or a token id.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("reading tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("tokenizer metadata {0:?} is missing")]
    MissingKey(&'static str),
    #[error(
        "unsupported tokenizer model {0:?} (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)"
    )]
    UnsupportedModel(String),
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("the vocabulary has {0} tokens, more than a u32 id can address")]
    VocabTooLarge(usize),
    #[error("{key} has {found} entries, expected {expected} (one per token)")]
    CountMismatch {
        key: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("merge {index} ({line:?}) is not two tokens separated by a space")]
    BadMerge { index: usize, line: String },
    #[error("token {index}: unknown token type {value}")]
    BadTokenType { index: usize, value: i64 },
    #[error("{key} = {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    BadSpecialId {
        key: &'static str,
        id: u64,
        n_vocab: usize,
    },
    #[error("token id {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    IdOutOfRange { id: u32, n_vocab: usize },
    #[error(
        "the vocabulary cannot encode the byte 0x{byte:02X} ({missing} bytes in all): it has no \
         token for it, no byte fallback token and no unknown token"
    )]
    NoByteFallback { byte: u8, missing: usize },
    #[error("the special tokens cannot be indexed: {0}")]
    SpecialTokens(String),
}

/// The type of a token (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    /// The type with GGUF code `v`, if there is one.
    pub fn from_code(v: i64) -> Option<Self> {
        Some(match v {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Tokens that ordinary text encodes to (the others are only reached by name or bytes).
    fn is_text_piece(self) -> bool {
        matches!(self, TokenType::Normal | TokenType::Undefined)
    }
}

/// The tokenizer algorithm (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerModel {
    /// `"gpt2"`: byte-level BPE with ranked merges.
    Bpe,
    /// `"llama"`: SentencePiece-style, score-ordered merges with byte fallback.
    SentencePiece,
}

impl TokenizerModel {
    pub fn from_name(name: &str) -> Result<Self, TokenizerError> {
        match name {
            "gpt2" => Ok(TokenizerModel::Bpe),
            "llama" => Ok(TokenizerModel::SentencePiece),
            other => Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
    }
}

/// A tokenizer described by plain data, as stored in GGUF metadata.
#[derive(Debug, Clone, Default)]
pub struct TokenizerData {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (byte-level BPE only); `None` means the GPT-2 pattern.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` codes; `None` means all normal.
    pub token_types: Option<Vec<i64>>,
    /// `tokenizer.ggml.scores` (required for `"llama"`).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges` as `"left right"` lines, highest priority first (required for
    /// `"gpt2"`).
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: an extra end-of-turn token.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`: an extra end-of-message token.
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; `None` means the model type's default.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; `None` means the model type's default.
    pub add_space_prefix: Option<bool>,
}

/// The SentencePiece stand-in for a space.
pub(super) const SPM_SPACE: char = '\u{2581}';

pub(super) const NONE: usize = usize::MAX;

/// A tokenizer: text to token ids and back.
pub struct Tokenizer {
    model: TokenizerModel,
    pre: PreTokenizer,
    pre_regex: Regex,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    token_to_id: HashMap<String, u32>,
    /// The bytes each token decodes to (control tokens: their text).
    pieces: Vec<Vec<u8>>,
    /// SentencePiece scores (empty for BPE).
    scores: Vec<f32>,
    /// BPE: `(left, right)` → `(rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// BPE: the token of each byte's mapped character. SentencePiece: the `<0xXX>` tokens.
    byte_ids: [Option<u32>; 256],
    /// Control and user-defined tokens, matched as whole strings.
    specials: SpecialMatcher,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    eog_ids: Vec<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    /// Llama-3 style: a piece that is a whole token is used as is, without merging.
    ignore_merges: bool,
    /// The GPT-2 byte table (BPE).
    byte_chars: [char; 256],
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("n_vocab", &self.tokens.len())
            .field("n_merges", &self.merges.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("unk_id", &self.unk_id)
            .field("eog_ids", &self.eog_ids)
            .field("add_bos", &self.add_bos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish()
    }
}

impl Tokenizer {
    pub fn model(&self) -> TokenizerModel {
        self.model
    }
    /// The pre-tokenizer (meaningful for byte-level BPE only).
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }
    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }
    /// Whether [`encode`](Self::encode) prepends the BOS token.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// The tokens that end a generation, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog_ids
    }
    /// True for the EOS token, `tokenizer.ggml.eot_token_id`/`eom_token_id`, and control tokens
    /// such as `<|im_end|>`, `<|eot_id|>` or `<|endoftext|>`.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog_ids.binary_search(&id).is_ok()
    }

    /// The token's text as stored in the vocabulary (byte-level BPE tokens are in mapped form).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }
    /// The id of a vocabulary entry by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }
    /// Control and unknown tokens: left out of [`decode`](Self::decode) when skipping specials.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.token_type(id),
            Some(TokenType::Control | TokenType::Unknown)
        )
    }

    fn check_id(&self, id: u32) -> Result<usize, TokenizerError> {
        let i = id as usize;
        if i < self.tokens.len() {
            Ok(i)
        } else {
            Err(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.tokens.len(),
            })
        }
    }

    /// The bytes a token stands for (control tokens: their text). A token need not be valid
    /// UTF-8 on its own.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>, TokenizerError> {
        Ok(self.pieces[self.check_id(id)?].clone())
    }

    /// Encodes text, prepending BOS when the model asks for it ([`add_bos`](Self::add_bos)).
    /// With `parse_special`, control tokens written in the text (e.g. `<|im_start|>`) become
    /// their ids; user-defined tokens are always matched by name.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.encode_with_bos(text, parse_special, self.add_bos)
    }

    /// As [`encode`](Self::encode), choosing whether to prepend BOS. BOS is not doubled when the
    /// text already starts with it as a special token.
    pub fn encode_with_bos(&self, text: &str, parse_special: bool, add_bos: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = self.specials.split(text, parse_special);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut prev_special = true;
        for frag in fragments {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(s) => {
                    match self.model {
                        TokenizerModel::Bpe => self.encode_bpe(s, &mut out, &mut cache),
                        TokenizerModel::SentencePiece => {
                            self.encode_spm(s, self.add_space_prefix && prev_special, &mut out)
                        }
                    }
                    prev_special = false;
                }
            }
        }
        drop(cache);
        if add_bos
            && let Some(bos) = self.bos_id
            && out.first() != Some(&bos)
        {
            out.insert(0, bos);
        }
        out
    }

    /// The bytes `id` contributes to a decoded text, or `None` when skipped.
    fn piece_for_decode(&self, id: u32, skip_special: bool) -> Result<&[u8], TokenizerError> {
        let i = self.check_id(id)?;
        if skip_special && self.is_special(id) {
            return Ok(&[]);
        }
        Ok(&self.pieces[i])
    }

    /// Decodes token ids to text. With `skip_special`, control and unknown tokens are left out.
    /// Invalid UTF-8 (e.g. a multi-byte character cut between tokens at the end) is replaced by
    /// U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let mut strip_space = self.strips_leading_space();
        for &id in ids {
            let piece = self.piece_for_decode(id, skip_special)?;
            bytes.extend_from_slice(self.strip(piece, &mut strip_space, id, skip_special));
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// SentencePiece with a space prefix: the first decoded token loses its leading space.
    fn strips_leading_space(&self) -> bool {
        self.model == TokenizerModel::SentencePiece && self.add_space_prefix
    }

    fn strip<'p>(
        &self,
        piece: &'p [u8],
        strip_space: &mut bool,
        id: u32,
        skip_special: bool,
    ) -> &'p [u8] {
        if !*strip_space || (skip_special && self.is_special(id)) {
            return piece;
        }
        *strip_space = false;
        piece.strip_prefix(b" ").unwrap_or(piece)
    }

    /// A decoder for tokens arriving one at a time.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }
}
