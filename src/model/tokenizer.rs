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
//! [`Tokenizer::new`] builds a tokenizer from plain data ([`TokenizerData`]);
//! [`Tokenizer::from_gguf`] only reads that data from a [`GgufFile`].

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::Mutex;

use regex::Regex;
use thiserror::Error;

use crate::gguf::{GgufError, GgufFile};

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

/// How byte-level BPE splits text into pieces before merging (`tokenizer.ggml.pre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// The GPT-2 pattern.
    Gpt2,
    /// Every digit on its own, then the GPT-2 pattern (smollm, starcoder, refact, codeshell).
    DigitsThenGpt2,
    /// The Llama-3 pattern: numbers in groups of up to three, case-insensitive contractions.
    Llama3,
    /// The Llama-3 pattern with single digits.
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value; unknown names fall back to GPT-2 with a
    /// warning.
    pub fn from_name(name: &str) -> Self {
        match name {
            "gpt2" | "default" => PreTokenizer::Gpt2,
            "smollm" | "starcoder" | "refact" | "codeshell" => PreTokenizer::DigitsThenGpt2,
            "llama-bpe" | "llama3" => PreTokenizer::Llama3,
            "qwen2" => PreTokenizer::Qwen2,
            other => {
                log::warn!(
                    "unknown tokenizer pre-tokenizer {other:?}: using the GPT-2 pattern, \
                     tokenization may differ from the model's"
                );
                PreTokenizer::Gpt2
            }
        }
    }

    /// The regex for the regex crate. Each pattern's final `\s+(?!\S)|\s+` is written `\s+`; the
    /// look-ahead is emulated in [`split_with_regex`].
    fn pattern(self) -> &'static str {
        match self {
            PreTokenizer::Gpt2 | PreTokenizer::DigitsThenGpt2 => {
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"
            }
            PreTokenizer::Llama3 => {
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+"
            }
            PreTokenizer::Qwen2 => {
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+"
            }
        }
    }

    /// Whether the pattern has the `\s*[\r\n]+` alternative before the final whitespace ones.
    fn has_newline_alternative(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Qwen2)
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

/// The SentencePiece stand-in for a space.
const SPM_SPACE: char = '\u{2581}';

/// Words longer than this many bytes are not cached.
const CACHE_MAX_WORD: usize = 128;
/// The cache is cleared when it reaches this many words.
const CACHE_MAX_ENTRIES: usize = 1 << 16;

const NONE: usize = usize::MAX;

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
    /// Tokens matched as whole strings: `(id, is_control)`, bucketed by first byte, longest first.
    specials: Vec<Vec<(u32, bool)>>,
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

/// The GPT-2 table: every byte maps to a printable character. Bytes that are printable and not
/// a space map to themselves; the others map to U+0100 onwards, in byte order.
pub fn gpt2_byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in map.iter_mut().enumerate() {
        let b = b as u32;
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        // Every code here is below 0x200, so always a valid char.
        *slot = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    map
}

/// Parses a `<0xXX>` byte-token text.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Splits `text` with a pre-tokenizer regex whose final alternative is `\s+`, emulating the
/// original `\s+(?!\S)|\s+`: a whitespace run of two or more characters followed by a
/// non-space gives its last character back to the next piece.
fn split_with_regex<'t>(
    re: &Regex,
    newline_alternative: bool,
    text: &'t str,
    f: &mut impl FnMut(&'t str),
) {
    let mut pos = 0;
    while pos < text.len() {
        let Some(m) = re.find_at(text, pos) else {
            break;
        };
        if m.start() > pos {
            // Every character is covered by some alternative; this is only a safety net.
            f(&text[pos..m.start()]);
        }
        let s = m.as_str();
        let mut end = m.end();
        if s.is_empty() {
            // The patterns never match empty; step over one character to be safe.
            let step = text[m.start()..].chars().next().map_or(1, char::len_utf8);
            f(&text[m.start()..m.start() + step]);
            pos = m.start() + step;
            continue;
        }
        let whitespace_only = s.chars().all(char::is_whitespace);
        // A whitespace-only match ending in a newline came from `\s*[\r\n]+`, not from `\s+`.
        let from_final_alternative =
            whitespace_only && !(newline_alternative && s.ends_with(['\r', '\n']));
        if from_final_alternative && end < text.len() {
            // `\s+` is greedy, so a non-space follows: `\s+(?!\S)` stops one character early.
            if let Some((last, _)) = s.char_indices().last()
                && last > 0
            {
                end = m.start() + last;
            }
        }
        f(&text[m.start()..end]);
        pos = end;
    }
    if pos < text.len() {
        f(&text[pos..]);
    }
}

/// Splits `text` so that every numeric character (`\p{N}`) is a piece of its own.
fn split_digits<'t>(text: &'t str, f: &mut impl FnMut(&'t str)) {
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if c.is_numeric() {
            if i > start {
                f(&text[start..i]);
            }
            let end = i + c.len_utf8();
            f(&text[i..end]);
            start = end;
        }
    }
    if start < text.len() {
        f(&text[start..]);
    }
}

/// A piece of the input: text to tokenize, or a special token matched by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A symbol of a word being merged (BPE).
#[derive(Clone, Copy)]
struct BpeSymbol {
    id: u32,
    prev: usize,
    next: usize,
}

/// A symbol of a SentencePiece fragment: a byte range of the text.
#[derive(Clone, Copy)]
struct SpmSymbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

/// A candidate SentencePiece merge: highest score first, then leftmost.
struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for SpmBigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
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
        let pre_regex = Regex::new(pre.pattern()).map_err(|e| {
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

        // Control and user-defined tokens, matched by name, longest first.
        let mut specials: Vec<Vec<(u32, bool)>> = vec![Vec::new(); 256];
        for (i, (text, ty)) in data.tokens.iter().zip(&types).enumerate() {
            let control = match ty {
                TokenType::Control => true,
                TokenType::UserDefined => false,
                _ => continue,
            };
            if let Some(&first) = text.as_bytes().first() {
                specials[first as usize].push((i as u32, control));
            }
        }
        for bucket in &mut specials {
            bucket.sort_by(|a, b| {
                let la = data.tokens[a.0 as usize].len();
                let lb = data.tokens[b.0 as usize].len();
                lb.cmp(&la).then(a.0.cmp(&b.0))
            });
        }

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
        let fragments = self.split_special(text, parse_special);
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

    /// Splits text at control tokens (if `parse_special`) and user-defined tokens.
    fn split_special<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            let found = self.specials[bytes[i] as usize]
                .iter()
                .filter(|&&(_, control)| parse_special || !control)
                .map(|&(id, _)| id)
                .find(|&id| bytes[i..].starts_with(self.tokens[id as usize].as_bytes()));
            match found {
                Some(id) => {
                    if i > start {
                        out.push(Fragment::Text(&text[start..i]));
                    }
                    out.push(Fragment::Token(id));
                    i += self.tokens[id as usize].len();
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < bytes.len() {
            out.push(Fragment::Text(&text[start..]));
        }
        out
    }

    fn encode_bpe(&self, text: &str, out: &mut Vec<u32>, cache: &mut HashMap<String, Vec<u32>>) {
        let mut word = |piece: &str| self.encode_bpe_word(piece, out, cache);
        let nl = self.pre.has_newline_alternative();
        match self.pre {
            PreTokenizer::DigitsThenGpt2 => split_digits(text, &mut |part| {
                split_with_regex(&self.pre_regex, nl, part, &mut word)
            }),
            _ => split_with_regex(&self.pre_regex, nl, text, &mut word),
        }
    }

    fn encode_bpe_word(
        &self,
        piece: &str,
        out: &mut Vec<u32>,
        cache: &mut HashMap<String, Vec<u32>>,
    ) {
        if let Some(ids) = cache.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.bpe_merge(piece.as_bytes(), out);
        if piece.len() <= CACHE_MAX_WORD {
            if cache.len() >= CACHE_MAX_ENTRIES {
                cache.clear();
            }
            cache.insert(piece.to_string(), out[start..].to_vec());
        }
    }

    /// Byte-level BPE of one pre-tokenized piece: lowest-ranked adjacent pair first, leftmost
    /// first among equals.
    fn bpe_merge(&self, bytes: &[u8], out: &mut Vec<u32>) {
        if self.ignore_merges {
            let mapped: String = bytes.iter().map(|&b| self.byte_chars[b as usize]).collect();
            if let Some(&id) = self.token_to_id.get(&mapped) {
                out.push(id);
                return;
            }
        }
        let mut syms: Vec<BpeSymbol> = Vec::with_capacity(bytes.len());
        for &b in bytes {
            let Some(id) = self.byte_ids[b as usize].or(self.unk_id) else {
                continue;
            };
            let i = syms.len();
            syms.push(BpeSymbol {
                id,
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
            });
        }
        if let Some(last) = syms.last_mut() {
            last.next = NONE;
        }
        if syms.len() > 1 {
            let mut heap = BinaryHeap::new();
            for i in 0..syms.len() - 1 {
                if let Some(&(rank, _)) = self.merges.get(&(syms[i].id, syms[i + 1].id)) {
                    heap.push(Reverse((rank, i)));
                }
            }
            while let Some(Reverse((rank, i))) = heap.pop() {
                let next = syms[i].next;
                if next == NONE {
                    continue;
                }
                // Stale entries: the pair at `i` changed since it was queued.
                let Some(&(r, merged)) = self.merges.get(&(syms[i].id, syms[next].id)) else {
                    continue;
                };
                if r != rank {
                    continue;
                }
                syms[i].id = merged;
                let after = syms[next].next;
                syms[i].next = after;
                syms[next].id = u32::MAX;
                syms[next].next = NONE;
                if after != NONE {
                    syms[after].prev = i;
                    if let Some(&(r, _)) = self.merges.get(&(merged, syms[after].id)) {
                        heap.push(Reverse((r, i)));
                    }
                }
                let prev = syms[i].prev;
                if prev != NONE
                    && let Some(&(r, _)) = self.merges.get(&(syms[prev].id, merged))
                {
                    heap.push(Reverse((r, prev)));
                }
            }
        }
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            out.push(syms[i].id);
            i = syms[i].next;
        }
    }

    /// SentencePiece-style encoding of one text fragment.
    fn encode_spm(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        let mut s = String::with_capacity(text.len() + 3 * (text.len() / 4 + 1));
        if space_prefix {
            s.push(SPM_SPACE);
        }
        for c in text.chars() {
            s.push(if c == ' ' { SPM_SPACE } else { c });
        }
        if s.is_empty() {
            return;
        }
        let mut syms: Vec<SpmSymbol> = Vec::with_capacity(s.len());
        for (i, (start, c)) in s.char_indices().enumerate() {
            syms.push(SpmSymbol {
                start,
                len: c.len_utf8(),
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
            });
        }
        if let Some(last) = syms.last_mut() {
            last.next = NONE;
        }
        let mut heap = BinaryHeap::new();
        let try_add = |syms: &[SpmSymbol], heap: &mut BinaryHeap<SpmBigram>, l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let start = syms[l].start;
            let size = syms[l].len + syms[r].len;
            let Some(&id) = self.token_to_id.get(&s[start..start + size]) else {
                return;
            };
            if self.types[id as usize].is_text_piece() {
                heap.push(SpmBigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    size,
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i - 1, i);
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (b.left, b.right);
            if syms[l].len == 0
                || syms[r].len == 0
                || syms[l].next != r
                || syms[l].len + syms[r].len != b.size
            {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            let after = syms[r].next;
            syms[l].next = after;
            if after != NONE {
                syms[after].prev = l;
            }
            try_add(&syms, &mut heap, syms[l].prev, l);
            try_add(&syms, &mut heap, l, after);
        }
        let mut i = 0;
        while i != NONE {
            let sym = syms[i];
            let piece = &s[sym.start..sym.start + sym.len];
            match self.token_to_id.get(piece) {
                Some(&id) if self.types[id as usize].is_text_piece() => out.push(id),
                _ => {
                    // Byte fallback (a space is looked up as the byte 0x20).
                    let raw = piece.replace(SPM_SPACE, " ");
                    for &byte in raw.as_bytes() {
                        if let Some(id) = self.byte_ids[byte as usize].or(self.unk_id) {
                            out.push(id);
                        }
                    }
                }
            }
            i = sym.next;
        }
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

/// Decodes tokens one at a time, returning only complete UTF-8 text: the bytes of a character
/// split across tokens are held back until the character is complete.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special: bool,
    strip_space: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            skip_special,
            strip_space: tokenizer.strips_leading_space(),
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text completed by it (possibly empty). Invalid byte
    /// sequences come out as U+FFFD, as in [`Tokenizer::decode`].
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let t = self.tokenizer;
        let piece = t.piece_for_decode(id, self.skip_special)?;
        let piece = t.strip(piece, &mut self.strip_space, id, self.skip_special);
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just checked to be valid UTF-8.
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &rest[valid + n..];
                        }
                        None => {
                            // An incomplete character at the end: wait for more bytes.
                            rest = &rest[valid..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drain_to = self.pending.len() - keep;
        self.pending.drain(..drain_to);
        Ok(out)
    }

    /// Returns whatever is still held back (an incomplete character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.strip_space = self.tokenizer.strips_leading_space();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::MetaValue;

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
}
