//! Prefix cache keys: each full KV page of a sequence is named by a SHA-256 hash chain over the
//! token blocks up to and including it, seeded with the model's identity. Two sequences whose
//! pages have the same key hold the same tokens from position 0 (the chain covers the whole
//! prefix, not one block) computed by the same model and configuration, so a page can serve
//! another request that starts the same way. A weak or per-block hash could let one request
//! read keys and values computed for another's different text; a collision of this chain is a
//! SHA-256 collision.

use sha2::{Digest, Sha256};

/// A page's key.
pub type PageKey = [u8; 32];

/// The chain's seed: what the pages were computed with (model file, configuration, KV type
/// and page geometry), as bytes.
pub fn seed(identity: &[u8]) -> PageKey {
    let mut h = Sha256::new();
    h.update(b"flashlm prefix v1\0");
    h.update((identity.len() as u64).to_le_bytes());
    h.update(identity);
    h.finalize().into()
}

/// Keys of the full blocks of `page_tokens` tokens at the start of `tokens`: key i names
/// tokens[..(i + 1) * page_tokens].
pub fn chain(seed: &PageKey, tokens: &[u32], page_tokens: usize) -> Vec<PageKey> {
    let mut out = Vec::with_capacity(tokens.len() / page_tokens.max(1));
    let mut prev = *seed;
    for block in tokens.chunks_exact(page_tokens.max(1)) {
        let mut h = Sha256::new();
        h.update(prev);
        for t in block {
            h.update(t.to_le_bytes());
        }
        prev = h.finalize().into();
        out.push(prev);
    }
    out
}

/// The key chains of the sequences an engine holds, for finding the longest cached prefix of a
/// new prompt.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    seed: PageKey,
    page_tokens: usize,
    /// Per sequence slot: the keys of its full pages.
    slots: Vec<Vec<PageKey>>,
}

impl PrefixIndex {
    pub fn new(identity: &[u8], page_tokens: usize, n_slots: usize) -> Self {
        Self {
            seed: seed(identity),
            page_tokens: page_tokens.max(1),
            slots: vec![Vec::new(); n_slots],
        }
    }

    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }

    /// Keys of the full pages of `tokens`.
    pub fn keys(&self, tokens: &[u32]) -> Vec<PageKey> {
        chain(&self.seed, tokens, self.page_tokens)
    }

    /// Slot `slot` now holds `tokens` (its full pages are keyed; a partial page is not).
    pub fn set(&mut self, slot: usize, tokens: &[u32]) {
        if let Some(s) = self.slots.get_mut(slot) {
            let have = s.len();
            let full = tokens.len() / self.page_tokens;
            if full < have {
                s.truncate(full);
            } else if full > have {
                // Extend the chain from its last key: earlier blocks are unchanged.
                let prev = s.last().copied().unwrap_or(self.seed);
                let start = have * self.page_tokens;
                s.extend(chain(
                    &prev,
                    &tokens[start..full * self.page_tokens],
                    self.page_tokens,
                ));
            }
        }
    }

    /// Slot `slot` holds nothing.
    pub fn clear(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.clear();
        }
    }

    /// Slots whose pages match the most leading pages of `keys`, with how many pages: the
    /// longest match first; slots matching no page are left out.
    pub fn matches(&self, keys: &[PageKey]) -> Vec<(usize, usize)> {
        let mut m: Vec<(usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.iter().zip(keys).take_while(|(a, b)| a == b).count()))
            .filter(|&(_, n)| n > 0)
            .collect();
        m.sort_by_key(|&(i, n)| (std::cmp::Reverse(n), i));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_covers_the_whole_prefix() {
        let s = seed(b"model a");
        let a = chain(&s, &[1, 2, 3, 4, 5, 6, 7], 3);
        assert_eq!(a.len(), 2);
        // Same second block, different first block: the second keys differ too.
        let b = chain(&s, &[9, 2, 3, 4, 5, 6], 3);
        assert_ne!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // Another model: every key differs.
        let c = chain(&seed(b"model b"), &[1, 2, 3, 4, 5, 6], 3);
        assert_ne!(a[0], c[0]);
        assert_ne!(a[1], c[1]);
        // Token order matters within a block, and ids are not confused across bytes.
        assert_ne!(chain(&s, &[1, 2, 3], 3), chain(&s, &[2, 1, 3], 3));
        assert_ne!(chain(&s, &[256, 0, 0], 3), chain(&s, &[1, 0, 0], 3));
        // The seed length is hashed: identities that concatenate alike still differ.
        assert_ne!(seed(b"ab"), seed(b"a"));
        // Known answer: SHA-256 of the seed followed by the block's little-endian ids.
        let mut h = Sha256::new();
        h.update(s);
        for t in [1u32, 2, 3] {
            h.update(t.to_le_bytes());
        }
        let want: PageKey = h.finalize().into();
        assert_eq!(a[0], want);
    }

    #[test]
    fn index_finds_the_longest_match_and_follows_changes() {
        let mut ix = PrefixIndex::new(b"m", 2, 3);
        ix.set(0, &[1, 2, 3, 4, 5]);
        ix.set(1, &[1, 2, 7, 7]);
        let k = ix.keys(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(ix.matches(&k), vec![(0, 2), (1, 1)]);
        // Growing a slot extends its chain exactly as keying the whole sequence would.
        ix.set(1, &[1, 2, 7, 7, 8, 8]);
        assert_eq!(ix.slots[1], ix.keys(&[1, 2, 7, 7, 8, 8]));
        // Rewinding drops the keys past the new end.
        ix.set(0, &[1, 2, 3]);
        assert_eq!(ix.matches(&k), vec![(0, 1), (1, 1)]);
        ix.clear(0);
        ix.clear(1);
        assert!(ix.matches(&k).is_empty());
        // Out-of-range slots are ignored.
        ix.set(9, &[1, 2]);
        ix.clear(9);
    }
}
