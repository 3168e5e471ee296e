//! Byte-level BPE: ranked merges over the bytes of each pre-tokenized piece.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::pretok::{PreTokenizer, split_digits, split_with_regex};
use super::{NONE, Tokenizer};

/// Words longer than this many bytes are not cached.
const CACHE_MAX_WORD: usize = 128;
/// The cache is cleared when it reaches this many words.
const CACHE_MAX_ENTRIES: usize = 1 << 16;

/// A symbol of a word being merged (BPE).
#[derive(Clone, Copy)]
struct BpeSymbol {
    id: u32,
    prev: usize,
    next: usize,
}

impl Tokenizer {
    pub(super) fn encode_bpe(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        cache: &mut HashMap<String, Vec<u32>>,
    ) {
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
}
