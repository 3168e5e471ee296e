//! Where each KV page lives, and the page tables the attention kernel reads.
//!
//! Page `p` of a sequence holds positions `[p P, (p + 1) P)`. On the device each layer keeps
//! `H` home slots: slot 0 holds page 0 (the attention sink) and slots `1..H` hold the most recent
//! pages in a ring (page `p >= 1` goes to slot `1 + (p - 1) % (H - 1)`); with `H` equal to the
//! page count every page simply has its own slot. All layers use the same slots for the same
//! pages, so a row's store address is the same in every layer. A page that leaves the ring was
//! full, and was written to flash at the end of the pass in which it filled.
//!
//! A forward pass over the positions `[a, b)` of a sequence attends, per layer, a list of pages
//! in order (every page up to the last one written, or a selection). Attention runs over the
//! list's keys in splits; a round covers `round_splits` splits, and the list's pages in a round
//! that are not at home are brought into the stream pool for that round.

use crate::kernels::ATTN_SPLIT_KEYS;
use crate::plan::KvPlan;

/// Bit of a page-table slot that selects the stream pool.
pub const STREAM_BIT: u32 = 0x8000_0000;

/// The page geometry every decision here derives from.
#[derive(Debug, Clone, Copy)]
pub struct PageMap {
    pub page_tokens: u32,
    pub max_pages: u32,
    pub home_pages: u32,
    pub round_splits: u32,
    /// Splits per round of a single-row decode pass (its partials take a prefill batch's
    /// room, so its rounds cover more keys, as far as a half of the stream pool holds).
    pub decode_round_splits: u32,
    pub stream_slots: u32,
    /// Parts of the stream pool rounds alternate between.
    pub halves: u32,
    pub kv_dim: u32,
}

impl PageMap {
    pub fn new(kv: &KvPlan) -> Self {
        Self {
            page_tokens: kv.page_tokens,
            max_pages: kv.max_pages,
            home_pages: kv.home_pages,
            round_splits: kv.round_splits.max(1),
            decode_round_splits: kv.decode_round_splits.max(kv.round_splits).max(1),
            stream_slots: kv.stream_slots,
            halves: kv.halves.max(1),
            kv_dim: kv.kv_dim,
        }
    }

    /// The first stream-pool slot of round `r`.
    pub fn round_base(&self, r: usize) -> u32 {
        let half = self.stream_slots / self.halves.max(1);
        (r as u32 % self.halves.max(1)) * half
    }

    /// First home slot of sequence `seq` (each sequence has `home_pages` of them).
    pub fn home_base(&self, seq: u32) -> u32 {
        seq * self.home_pages
    }

    /// Element offset (in the home pool) of the K row of position `pos` of sequence `seq`.
    pub fn row_elem_of(&self, seq: u32, pos: usize) -> u32 {
        self.row_elem(pos) + self.home_base(seq) * 2 * self.page_tokens * self.kv_dim
    }

    /// Whether every page has a home slot (nothing ever leaves the device).
    pub fn all_home(&self) -> bool {
        self.home_pages >= self.max_pages
    }

    /// The page holding position `pos`.
    pub fn page_of(&self, pos: usize) -> u32 {
        (pos / self.page_tokens as usize) as u32
    }

    /// Home slot of `page` (where it is, if it is at home).
    pub fn home_slot(&self, page: u32) -> u32 {
        if self.all_home() || page == 0 || self.home_pages <= 1 {
            page.min(self.home_pages.saturating_sub(1))
        } else {
            1 + (page - 1) % (self.home_pages - 1)
        }
    }

    /// Whether `page` is at home while `top` is the newest page written.
    pub fn is_home(&self, page: u32, top: u32) -> bool {
        self.all_home() || page == 0 || page + self.home_pages > top + 1
    }

    /// Element offset (in the home pool) of the K row of position `pos`.
    pub fn row_elem(&self, pos: usize) -> u32 {
        let page = self.page_of(pos);
        let page_elems = 2 * self.page_tokens * self.kv_dim;
        self.home_slot(page) * page_elems + (pos as u32 % self.page_tokens) * self.kv_dim
    }

    /// Pages that filled up while positions `[a, b)` were written.
    pub fn filled(&self, a: usize, b: usize) -> std::ops::Range<u32> {
        let p = self.page_tokens as usize;
        let first = a / p;
        let end = b / p;
        (first as u32)..(end as u32).max(first as u32)
    }

    /// List entries (pages) one split covers, and splits one page covers.
    fn split_geometry(&self) -> (u32, u32) {
        if self.page_tokens <= ATTN_SPLIT_KEYS {
            (ATTN_SPLIT_KEYS / self.page_tokens, 1)
        } else {
            (1, self.page_tokens / ATTN_SPLIT_KEYS)
        }
    }

    /// The rounds over a list of `list_keys` keys: for each, its first split, its split count
    /// and the range of list entries it reads.
    pub fn rounds(&self, list_keys: u32) -> Vec<Round> {
        self.rounds_of(list_keys, self.round_splits)
    }

    /// [`Self::rounds`] for a single-row decode pass: rounds of `decode_round_splits`.
    pub fn decode_rounds(&self, list_keys: u32) -> Vec<Round> {
        self.rounds_of(list_keys, self.decode_round_splits)
    }

    fn rounds_of(&self, list_keys: u32, round_splits: u32) -> Vec<Round> {
        let total = list_keys.div_ceil(ATTN_SPLIT_KEYS).max(1);
        let (pages_per_split, splits_per_page) = self.split_geometry();
        let per_round = round_splits.max(splits_per_page);
        let n_entries = list_keys.div_ceil(self.page_tokens);
        let mut out = Vec::new();
        let mut s0 = 0;
        while s0 < total {
            let n = per_round.min(total - s0);
            let (e0, e1) = if splits_per_page > 1 {
                (s0 / splits_per_page, (s0 + n).div_ceil(splits_per_page))
            } else {
                (s0 * pages_per_split, (s0 + n) * pages_per_split)
            };
            out.push(Round {
                first_split: s0,
                splits: n,
                entries: e0.min(n_entries)..e1.min(n_entries),
            });
            s0 += n;
        }
        out
    }
}

/// One attention round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub first_split: u32,
    pub splits: u32,
    /// List entries whose keys the round reads.
    pub entries: std::ops::Range<u32>,
}

/// A layer's list of pages to attend for one sequence, with each page's slot code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageList {
    /// (page, slot code) in attention order.
    pub entries: Vec<(u32, u32)>,
    /// Keys in the list: full pages, and the last page's rows.
    pub keys: u32,
    /// Position of list key 0 when the list is a contiguous run of pages starting past page 0
    /// (a sliding window's); 0 otherwise.
    pub key_base: u32,
}

impl PageList {
    /// Every page up to the one holding position `last_pos` (exact attention).
    pub fn exact(map: &PageMap, last_pos: usize) -> Self {
        let top = map.page_of(last_pos);
        Self::of_pages(map, (0..=top).collect(), last_pos)
    }

    /// Every page from the one holding `first_pos` up to the one holding `last_pos`: the keys a
    /// sliding window can reach (rows mask what lies outside their own window).
    pub fn exact_from(map: &PageMap, first_pos: usize, last_pos: usize) -> Self {
        let lo = map.page_of(first_pos.min(last_pos));
        let top = map.page_of(last_pos);
        let mut l = Self::of_pages(map, (lo..=top).collect(), last_pos);
        l.key_base = lo * map.page_tokens;
        l
    }

    /// The given pages (ascending, all full but the one holding `last_pos`, which must be
    /// last).
    pub fn of_pages(map: &PageMap, pages: Vec<u32>, last_pos: usize) -> Self {
        let top = map.page_of(last_pos);
        let p = map.page_tokens;
        let n = pages.len() as u32;
        let last_rows = (last_pos as u32 % p) + 1;
        let keys = if n == 0 { 0 } else { (n - 1) * p + last_rows };
        let entries = pages
            .into_iter()
            .map(|pg| {
                let slot = if map.is_home(pg, top) {
                    map.home_slot(pg)
                } else {
                    STREAM_BIT
                };
                (pg, slot)
            })
            .collect();
        Self {
            entries,
            keys,
            key_base: 0,
        }
    }

    /// Give the streamed pages of `round` stream-pool slots (in list order, from `first_slot`);
    /// returns the pages to bring in, with their slots.
    pub fn assign_round(&mut self, round: &Round, first_slot: u32) -> Vec<(u32, u32)> {
        let mut next = first_slot;
        let mut loads = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.1 & STREAM_BIT == 0 {
                continue;
            }
            if round.entries.contains(&(i as u32)) {
                e.1 = STREAM_BIT | next;
                loads.push((e.0, next));
                next += 1;
            } else {
                e.1 = STREAM_BIT;
            }
        }
        loads
    }

    /// Move the list's home slots to sequence `seq`'s part of the home pool.
    pub fn for_seq(mut self, map: &PageMap, seq: u32) -> Self {
        let base = map.home_base(seq);
        for e in &mut self.entries {
            if e.1 & STREAM_BIT == 0 {
                e.1 += base;
            }
        }
        self
    }

    /// Page-table words of this list: [entries, keys, key_base, 0, (page, slot) ...].
    pub fn words(&self, out: &mut Vec<u32>) {
        out.push(self.entries.len() as u32);
        out.push(self.keys);
        out.push(self.key_base);
        out.push(0);
        for &(p, s) in &self.entries {
            out.push(p);
            out.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(p: u32, max_pages: u32, home: u32, rs: u32) -> PageMap {
        PageMap {
            page_tokens: p,
            max_pages,
            home_pages: home,
            round_splits: rs,
            decode_round_splits: rs,
            stream_slots: 64,
            halves: 1,
            kv_dim: 8,
        }
    }

    #[test]
    fn home_ring_keeps_sink_and_recent_pages() {
        let m = map(16, 100, 4, 1);
        // Slots: page 0 -> 0, pages 1.. -> 1, 2, 3, 1, 2, 3, ...
        assert_eq!(
            (0..8).map(|p| m.home_slot(p)).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 1, 2, 3, 1]
        );
        // With page 7 the newest: 0, 5, 6, 7 are home; the rest streamed.
        let home: Vec<u32> = (0..8).filter(|&p| m.is_home(p, 7)).collect();
        assert_eq!(home, vec![0, 5, 6, 7]);
        // Distinct home pages never share a slot.
        let slots: std::collections::HashSet<u32> = home.iter().map(|&p| m.home_slot(p)).collect();
        assert_eq!(slots.len(), home.len());
        let all = map(16, 8, 8, 1);
        assert!((0..8).all(|p| all.is_home(p, 7) && all.home_slot(p) == p));
        assert_eq!(m.row_elem(16 * 5 + 3), 2 * 2 * 16 * 8 + 3 * 8);
    }

    #[test]
    fn filled_pages() {
        let m = map(16, 100, 4, 1);
        assert_eq!(m.filled(0, 16), 0..1);
        assert_eq!(m.filled(15, 16), 0..1);
        assert_eq!(m.filled(16, 17), 1..1);
        assert_eq!(m.filled(10, 70), 0..4);
    }

    #[test]
    fn rounds_cover_whole_splits() {
        // 16-token pages: a split is 32 pages.
        let m = map(16, 1000, 4, 2);
        let r = m.rounds(3000);
        assert_eq!(r.len(), 3); // 6 splits, 2 per round
        assert_eq!(r[0].entries, 0..64);
        assert_eq!(r[2].entries, 128..188); // 3000 keys = 188 pages
        assert_eq!(r.iter().map(|x| x.splits).sum::<u32>(), 6);
        // 1024-token pages: a page is two splits; rounds take whole pages.
        let big = map(1024, 8, 2, 1);
        let r = big.rounds(3000);
        assert!(r.iter().all(|x| x.splits == 2));
        assert_eq!(r[1].entries, 1..2);
        assert_eq!(m.rounds(1).len(), 1);
    }

    #[test]
    fn lists_and_stream_slots() {
        let m = map(16, 100, 4, 1);
        let mut l = PageList::exact(&m, 16 * 40 + 5);
        assert_eq!(l.keys, 16 * 40 + 6);
        assert_eq!(l.entries.len(), 41);
        let streamed = l.entries.iter().filter(|e| e.1 & STREAM_BIT != 0).count();
        assert_eq!(streamed, 41 - 4);
        let rounds = m.rounds(l.keys);
        let mut loaded = 0;
        for r in &rounds {
            let loads = l.assign_round(r, 0);
            assert!(loads.len() as u32 <= 32);
            loaded += loads.len();
        }
        assert_eq!(loaded, streamed);
        let mut w = Vec::new();
        l.words(&mut w);
        assert_eq!(w.len(), 4 + 2 * 41);
        let sel = PageList::of_pages(&m, vec![0, 3, 9, 40], 16 * 40 + 5);
        assert_eq!(sel.keys, 3 * 16 + 6);
        // A window from position 100: pages 6..=40, keys counted from page 6.
        let win = PageList::exact_from(&m, 100, 16 * 40 + 5);
        assert_eq!(win.entries.first().map(|e| e.0), Some(6));
        assert_eq!(win.entries.len(), 35);
        assert_eq!(win.key_base, 96);
        assert_eq!(win.keys, 16 * 40 + 6 - 96);
        let mut w = Vec::new();
        win.words(&mut w);
        assert_eq!(w[..3], [35, 16 * 40 + 6 - 96, 96]);
    }
}
