//! SentencePiece-style encoding: score-ordered merges with byte fallback.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{NONE, SPM_SPACE, Tokenizer};

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

impl Tokenizer {
    /// SentencePiece-style encoding of one text fragment.
    pub(super) fn encode_spm(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
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
}
