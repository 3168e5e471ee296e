//! Pre-tokenization for byte-level BPE: the `tokenizer.ggml.pre` regexes and the GPT-2 byte
//! table.

use std::sync::OnceLock;

use regex::Regex;

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
    pub(super) fn pattern(self) -> &'static str {
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

    /// The compiled pattern. Each pattern is compiled once per process (building a tokenizer
    /// is then cheap: a compiled regex is shared by cloning).
    pub(super) fn regex(self) -> Result<Regex, regex::Error> {
        static COMPILED: [OnceLock<Regex>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let slot = match self {
            PreTokenizer::Gpt2 | PreTokenizer::DigitsThenGpt2 => &COMPILED[0],
            PreTokenizer::Llama3 => &COMPILED[1],
            PreTokenizer::Qwen2 => &COMPILED[2],
        };
        if let Some(re) = slot.get() {
            return Ok(re.clone());
        }
        let re = Regex::new(self.pattern())?;
        Ok(slot.get_or_init(|| re).clone())
    }

    /// Whether the pattern has the `\s*[\r\n]+` alternative before the final whitespace ones.
    pub(super) fn has_newline_alternative(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Qwen2)
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

/// Splits `text` with a pre-tokenizer regex whose final alternative is `\s+`, emulating the
/// original `\s+(?!\S)|\s+`: a whitespace run of two or more characters followed by a
/// non-space gives its last character back to the next piece.
pub(super) fn split_with_regex<'t>(
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
pub(super) fn split_digits<'t>(text: &'t str, f: &mut impl FnMut(&'t str)) {
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
