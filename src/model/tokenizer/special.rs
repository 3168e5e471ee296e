//! Finding control and user-defined tokens written in the text.
//!
//! The tokens are matched as whole strings, leftmost first and longest among those starting at
//! the same byte (the lowest id among tokens with the same text). Two Aho-Corasick automata
//! (all such tokens; user-defined ones only) find them in one pass over the text, so the cost
//! is linear in the text whatever the vocabulary holds (a byte-by-byte scan trying every token
//! is quadratic-like on text full of near misses such as `<|im_sta<|im_sta...`).

use std::collections::HashSet;

use aho_corasick::{AhoCorasick, MatchKind};

use super::{TokenType, TokenizerError};

/// A piece of the input: text to tokenize, or a special token matched by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// One automaton and the token id of each of its patterns.
struct Automaton {
    ac: AhoCorasick,
    ids: Vec<u32>,
}

impl Automaton {
    /// `None` when there is nothing to match.
    fn build(tokens: &[(&str, u32)]) -> Result<Option<Self>, TokenizerError> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(t, _)| t))
            .map_err(|e| TokenizerError::SpecialTokens(e.to_string()))?;
        Ok(Some(Automaton {
            ac,
            ids: tokens.iter().map(|&(_, id)| id).collect(),
        }))
    }
}

/// Finds control and user-defined tokens in text.
pub(super) struct SpecialMatcher {
    /// Control and user-defined tokens (when special tokens are parsed).
    all: Option<Automaton>,
    /// User-defined tokens only (always matched).
    user: Option<Automaton>,
}

impl SpecialMatcher {
    pub(super) fn new(tokens: &[String], types: &[TokenType]) -> Result<Self, TokenizerError> {
        // The first (lowest) id of each distinct text; empty texts never match.
        let mut all: Vec<(&str, u32)> = Vec::new();
        let mut user: Vec<(&str, u32)> = Vec::new();
        let mut seen_all: HashSet<&str> = HashSet::new();
        let mut seen_user: HashSet<&str> = HashSet::new();
        for (i, (text, ty)) in tokens.iter().zip(types).enumerate() {
            let Ok(id) = u32::try_from(i) else {
                break;
            };
            let text = text.as_str();
            if text.is_empty() || !matches!(ty, TokenType::Control | TokenType::UserDefined) {
                continue;
            }
            if seen_all.insert(text) {
                all.push((text, id));
            }
            if *ty == TokenType::UserDefined && seen_user.insert(text) {
                user.push((text, id));
            }
        }
        Ok(SpecialMatcher {
            all: Automaton::build(&all)?,
            user: Automaton::build(&user)?,
        })
    }

    /// Splits text at control tokens (if `parse_special`) and user-defined tokens.
    pub(super) fn split<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let automaton = if parse_special { &self.all } else { &self.user };
        let Some(a) = automaton else {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Fragment::Text(text)]
            };
        };
        let mut out = Vec::new();
        let mut start = 0;
        for m in a.ac.find_iter(text) {
            let Some(&id) = a.ids.get(m.pattern().as_usize()) else {
                continue;
            };
            // Token texts are whole UTF-8 strings, so matches start and end on characters.
            if let Some(before) = text.get(start..m.start())
                && !before.is_empty()
            {
                out.push(Fragment::Text(before));
            }
            out.push(Fragment::Token(id));
            start = m.end();
        }
        if let Some(rest) = text.get(start..)
            && !rest.is_empty()
        {
            out.push(Fragment::Text(rest));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(tokens: &[(&str, TokenType)]) -> (SpecialMatcher, Vec<String>) {
        let texts: Vec<String> = tokens.iter().map(|(t, _)| t.to_string()).collect();
        let types: Vec<TokenType> = tokens.iter().map(|&(_, ty)| ty).collect();
        (SpecialMatcher::new(&texts, &types).unwrap(), texts)
    }

    /// The obvious scan: at each byte, the longest token starting there (lowest id on ties).
    fn naive<'t>(
        tokens: &[(&str, TokenType)],
        text: &'t str,
        parse_special: bool,
    ) -> Vec<Fragment<'t>> {
        let mut out = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < text.len() {
            let best = tokens
                .iter()
                .enumerate()
                .filter(|(_, (t, ty))| {
                    !t.is_empty()
                        && (*ty == TokenType::UserDefined
                            || (parse_special && *ty == TokenType::Control))
                        && text.as_bytes()[i..].starts_with(t.as_bytes())
                })
                .max_by(|a, b| a.1.0.len().cmp(&b.1.0.len()).then(b.0.cmp(&a.0)));
            match best {
                Some((id, (t, _))) => {
                    if i > start {
                        out.push(Fragment::Text(&text[start..i]));
                    }
                    out.push(Fragment::Token(id as u32));
                    i += t.len();
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < text.len() {
            out.push(Fragment::Text(&text[start..]));
        }
        out
    }

    #[test]
    fn matches_like_the_naive_scan() {
        use TokenType::*;
        let tokens = [
            ("a", Normal),
            ("<|im_start|>", Control),
            ("<|im", UserDefined),
            ("<|im_start|>", UserDefined),
            ("<tool>", UserDefined),
            ("<", Control),
            ("", Control),
            ("<tool>x", Control),
            ("é", UserDefined),
        ];
        let (m, _) = matcher(&tokens);
        let texts = [
            "",
            "plain",
            "<|im_start|>user",
            "x<|im<|im_start|><tool>x<tool>",
            "<<<|im_st<|im_start|",
            "é<é>",
        ];
        for text in texts {
            for parse in [false, true] {
                assert_eq!(
                    m.split(text, parse),
                    naive(&tokens, text, parse),
                    "{text:?} {parse}"
                );
            }
        }
        // Duplicated text: the control token (id 1) when parsing specials, else the user one.
        assert_eq!(
            m.split("<|im_start|>", true),
            [Fragment::Token(1)],
            "lowest id among equal texts"
        );
        assert_eq!(m.split("<|im_start|>", false), [Fragment::Token(3)]);
    }

    #[test]
    fn no_specials_is_one_fragment() {
        let (m, _) = matcher(&[("a", TokenType::Normal)]);
        assert_eq!(m.split("abc", true), [Fragment::Text("abc")]);
        assert!(m.split("", true).is_empty());
    }
}
