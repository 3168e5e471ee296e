//! Incremental decoding: text completed by each new token.

use super::{Tokenizer, TokenizerError};

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
