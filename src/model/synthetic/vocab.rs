//! The synthetic models' tokenizer: a byte-level BPE vocabulary of any size.
//!
//! Ids `0..256` are the byte tokens (GPT-2 byte-to-character spelling), then the tokens of
//! [`SYNTHETIC_MERGES`], then the control tokens of [`SYNTHETIC_SPECIALS`]. The rest is filled
//! with generated merged tokens, breadth first: `Ġ` (a space) and each letter, extended by one
//! letter at a time (`Ġe`, `Ġt`, …, `ee`, `et`, …, `Ġee`, …), letters in English frequency
//! order, each with the merge `"prefix letter"` that forms it. Every merge joins two tokens of
//! the vocabulary and every id decodes to text.

use std::collections::HashSet;

use crate::gguf::MetaValue;

/// Merges of the synthetic tokenizer, in rank order (GPT-2 byte-level spelling, `Ġ` = space).
pub const SYNTHETIC_MERGES: &[&str] = &["Ġ t", "h e", "i n", "Ġt he", "e r", "Ġ a", "o n", "Ġ s"];
/// Control tokens, placed right after the merged tokens.
pub const SYNTHETIC_SPECIALS: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Smallest vocabulary that holds the byte tokens, merges and control tokens.
pub const SYNTHETIC_MIN_VOCAB: usize = 256 + SYNTHETIC_MERGES.len() + SYNTHETIC_SPECIALS.len();

/// Letters the generated tokens are spelled with, most frequent in English first.
const LETTERS: &str = "etaoinshrdlcumwfgypbvkjxqz";

/// A ChatML template, as SmolLM2-style models carry.
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Token types as GGUF stores them.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;

/// The GPT-2 byte-to-character map: printable bytes stand for themselves, the others map to
/// code points from U+0100 upward, in byte order.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(cp).unwrap_or('?');
    }
    out
}

/// Tokens, their types and the merges of a `vocab`-token vocabulary (`vocab` at least
/// [`SYNTHETIC_MIN_VOCAB`]).
pub(super) struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    /// Id of the first control token.
    pub first_special: usize,
}

pub(super) fn build(vocab: usize) -> Vocab {
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut merges: Vec<String> = SYNTHETIC_MERGES.iter().map(|m| m.to_string()).collect();
    tokens.extend(SYNTHETIC_MERGES.iter().map(|m| m.replace(' ', "")));
    let first_special = tokens.len();
    tokens.extend(SYNTHETIC_SPECIALS.iter().map(|s| s.to_string()));
    let mut types = vec![TOKEN_NORMAL; first_special];
    types.resize(tokens.len(), TOKEN_CONTROL);

    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    let space = chars[usize::from(b' ')].to_string();
    let mut level: Vec<String> = std::iter::once(space)
        .chain(LETTERS.chars().map(String::from))
        .collect();
    // Each level's strings are one letter longer than the last's, so candidates never repeat;
    // a candidate that is already a token (a fixed merge) is skipped but still extended.
    'fill: while tokens.len() < vocab && !level.is_empty() {
        let mut next = Vec::with_capacity(level.len() * LETTERS.len());
        for prefix in &level {
            for c in LETTERS.chars() {
                if tokens.len() >= vocab {
                    break 'fill;
                }
                let token = format!("{prefix}{c}");
                if seen.insert(token.clone()) {
                    merges.push(format!("{prefix} {c}"));
                    tokens.push(token.clone());
                    types.push(TOKEN_NORMAL);
                }
                next.push(token);
            }
        }
        level = next;
    }
    Vocab {
        tokens,
        types,
        merges,
        first_special,
    }
}

fn strings(v: Vec<String>) -> MetaValue {
    MetaValue::Array(v.into_iter().map(MetaValue::String).collect())
}

/// The `tokenizer.*` metadata for a `vocab`-token vocabulary.
pub(super) fn tokenizer_metadata(vocab: usize) -> Vec<(&'static str, MetaValue)> {
    let v = build(vocab);
    let (eot, bos, eos) = (v.first_special, v.first_special + 1, v.first_special + 2);
    let u32v = |x: usize| MetaValue::U32(x as u32);
    vec![
        ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(v.tokens)),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(v.types.into_iter().map(MetaValue::I32).collect()),
        ),
        ("tokenizer.ggml.merges", strings(v.merges)),
        ("tokenizer.ggml.bos_token_id", u32v(bos)),
        ("tokenizer.ggml.eos_token_id", u32v(eos)),
        ("tokenizer.ggml.unknown_token_id", u32v(eot)),
        ("tokenizer.ggml.padding_token_id", u32v(eos)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
        (
            "tokenizer.chat_template",
            MetaValue::String(CHAT_TEMPLATE.into()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_any_size_with_valid_merges() {
        for n in [SYNTHETIC_MIN_VOCAB, 300, 1000, 32000] {
            let v = build(n);
            assert_eq!(v.tokens.len(), n);
            assert_eq!(v.types.len(), n);
            let set: HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
            assert_eq!(set.len(), n, "duplicate tokens");
            // Every merge joins two tokens into a third; each generated token has one merge.
            for m in &v.merges {
                let (l, r) = m.split_once(' ').expect("merge has two sides");
                assert!(set.contains(l) && set.contains(r), "{m}");
                assert!(set.contains(format!("{l}{r}").as_str()), "{m}");
            }
            assert_eq!(v.merges.len(), n - 256 - SYNTHETIC_SPECIALS.len());
            assert_eq!(&v.tokens[v.first_special], "<|endoftext|>");
        }
        // The first generated tokens, in order (`Ġt` and `Ġa` are fixed merges).
        let v = build(SYNTHETIC_MIN_VOCAB + 3);
        assert_eq!(&v.tokens[SYNTHETIC_MIN_VOCAB..], ["Ġe", "Ġo", "Ġi"]);
        assert_eq!(v.merges.last().map(String::as_str), Some("Ġ i"));
    }
}
