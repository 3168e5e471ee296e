//! The paged KV cache's share of the plan.
//!
//! K and V live in pages of P tokens per layer (`page_bytes` = P rows of K then P rows of V).
//! Each layer keeps `home_pages` pages on the device: page 0 (the attention sink) and a ring of
//! the most recent pages, at least the pages one batch writes. When the home pages cannot hold
//! the whole context, full pages are written to a file on flash once and the pages a layer
//! attends are read back into a shared stream pool. Attention runs in splits of
//! [`ATTN_SPLIT_KEYS`] keys, `round_splits` at a time; a round's streamed pages must fit the
//! stream pool.

use crate::kernels::ATTN_SPLIT_KEYS;
use crate::model::config::ModelConfig;

use super::{PlanError, PlanOptions, round16};

/// Tokens per page when `--kv-page` is not given. Chosen by measurement: the page-size table of
/// BENCHMARKS.md section 4 (`flashlm bench kv --page-sweep 16,32,64,128,256`, at the S2
/// setting) shows ms/token, KV bytes read and the ring's read rate per page size, and names the
/// size its rule picks (the smallest page within 5% of the fastest ms/token,
/// `bench::kv::PAGE_RULE_TOLERANCE`). Change this value when that table says so.
pub const DEFAULT_PAGE_TOKENS: u32 = 64;
/// Largest page size accepted.
pub const MAX_PAGE_TOKENS: u32 = 1024;

/// How many pages page selection keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SelectSpec {
    /// At most this many pages.
    Pages(u32),
    /// This share (0-100) of the candidate pages, rounded up.
    Percent(f64),
}

/// Page selection (Quest): per layer and token, the top pages by an upper bound of their
/// attention scores, besides the home pages; the first `dense_layers` layers stay exact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvSelect {
    pub spec: SelectSpec,
    pub dense_layers: u32,
    /// Lagged (`quest-lag:`): a layer ranks the pages by the scores of the previous token's
    /// query, read back once at the end of that token, instead of waiting for its own query's
    /// scores; its pages are then known before it runs and read ahead like exact attention's.
    /// The first step after a prompt (no scores yet) selects as plain quest does, and pages
    /// filled since the scores were taken are always attended.
    pub lagged: bool,
}

impl KvSelect {
    /// `quest:N` (pages) or `quest:P%` (share of the pages); `quest-lag:N` and `quest-lag:P%`
    /// select from the previous token's scores.
    pub fn parse(s: &str, dense_layers: u32) -> Result<Self, String> {
        let err = || {
            format!(
                "--kv-select {s:?}: expected quest:N (pages, N >= 1) or quest:P% (0 < P <= 100), \
                 or quest-lag:N / quest-lag:P% (chosen from the previous token's scores)"
            )
        };
        let spec = s.trim();
        let (rest, lagged) = match spec.strip_prefix("quest-lag:") {
            Some(r) => (r, true),
            None => (spec.strip_prefix("quest:").ok_or_else(err)?, false),
        };
        let spec = if let Some(p) = rest.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| err())?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(err());
            }
            SelectSpec::Percent(v)
        } else {
            let v: u32 = rest.trim().parse().map_err(|_| err())?;
            if v == 0 {
                return Err(err());
            }
            SelectSpec::Pages(v)
        };
        Ok(Self {
            spec,
            dense_layers,
            lagged,
        })
    }

    /// Pages to keep out of `candidates`.
    pub fn keep(&self, candidates: u32) -> u32 {
        match self.spec {
            SelectSpec::Pages(n) => n.min(candidates),
            SelectSpec::Percent(p) => {
                ((candidates as f64 * p / 100.0).ceil() as u32).min(candidates)
            }
        }
    }
}

/// The KV cache's shape and device sizes.
#[derive(Debug, Clone)]
pub struct KvPlan {
    pub f16: bool,
    pub n_heads: u32,
    pub head_dim: u32,
    pub kv_dim: u32,
    pub page_tokens: u32,
    /// Device (and file payload) bytes of one page: K rows then V rows.
    pub page_bytes: u64,
    /// Pages per layer for the whole context.
    pub max_pages: u32,
    /// Pages one batch can write into.
    pub touched_pages: u32,
    /// Pages per layer kept on the device.
    pub home_pages: u32,
    /// Recent pages page selection always attends besides page 0 (those a batch writes and the
    /// asked-for window), whatever else the device holds.
    pub select_window: u32,
    /// Pages leave the device for flash (home pages cannot hold the context).
    pub streams: bool,
    /// Attention splits per round, and the splits and pages of one round unit.
    pub round_splits: u32,
    /// Attention splits per round of a pass with a single row (a decode step): its partials
    /// fit where a batch's rows' do, so only the stream pool's half bounds its rounds.
    pub decode_round_splits: u32,
    pub unit_splits: u32,
    pub unit_pages: u32,
    /// Page slots of the stream pool, and how many parts it is cut into (2: round r + 1's pages
    /// are read into one half while round r attends the other).
    pub stream_slots: u32,
    pub halves: u32,
    /// Pages the read-back buffer holds.
    pub pageout_pages: u32,
    pub max_seqs: u32,
    /// Page-table words per sequence and per layer.
    pub seq_stride: u32,
    pub layer_words: u32,
    pub select: Option<KvSelect>,
    pub max_binding: u64,
}

impl KvPlan {
    /// The smallest KV cache that runs: the sink, the pages one batch writes plus the asked-for
    /// window, a stream pool for one round unit.
    pub fn minimal(
        cfg: &ModelConfig,
        o: &PlanOptions,
        max_ctx: usize,
        ubatch: usize,
    ) -> Result<Self, PlanError> {
        let p = o.kv_page.unwrap_or(DEFAULT_PAGE_TOKENS);
        if !p.is_power_of_two() || p > MAX_PAGE_TOKENS {
            return Err(PlanError::Kv(format!(
                "--kv-page {p}: the page size must be a power of two from 1 to {MAX_PAGE_TOKENS} tokens"
            )));
        }
        let kv_dim = (cfg.n_kv_heads * cfg.head_dim) as u32;
        let f16 = o.kv_f16 && kv_dim.is_multiple_of(2) && cfg.head_dim.is_multiple_of(2);
        let elt: u64 = if f16 { 2 } else { 4 };
        let page_bytes = 2 * p as u64 * kv_dim as u64 * elt;
        let max_pages = (max_ctx as u32).div_ceil(p);
        let touched = ((ubatch as u32 + p - 2) / p + 1).min(max_pages);
        let home = (1 + touched + o.kv_window).min(max_pages);
        let (unit_splits, unit_pages) = if p <= ATTN_SPLIT_KEYS {
            (1, ATTN_SPLIT_KEYS / p)
        } else {
            (p / ATTN_SPLIT_KEYS, 1)
        };
        let max_seqs = o.max_seqs.clamp(1, 256) as u32;
        if max_seqs > 1 && o.kv_select.is_some() {
            return Err(PlanError::Kv(
                "page selection (--kv-select) works with one sequence at a time; it cannot be combined with batched sequences".into(),
            ));
        }
        let seq_stride = 4 + 2 * max_pages;
        let kv = Self {
            f16,
            n_heads: cfg.n_heads as u32,
            head_dim: cfg.head_dim as u32,
            kv_dim,
            page_tokens: p,
            page_bytes,
            max_pages,
            touched_pages: touched,
            home_pages: home,
            select_window: home.saturating_sub(1).max(1),
            streams: home < max_pages,
            round_splits: unit_splits,
            decode_round_splits: unit_splits,
            unit_splits,
            unit_pages,
            stream_slots: if home < max_pages {
                unit_pages.min(max_pages) * max_seqs
            } else {
                0
            },
            halves: 1,
            pageout_pages: 1,
            max_seqs,
            seq_stride,
            layer_words: 4 + max_seqs * seq_stride,
            select: o.kv_select,
            max_binding: u64::MAX,
        };
        Ok(kv)
    }

    /// Home page slots of one layer for all sequences.
    pub fn home_slots(&self) -> u32 {
        self.home_pages * self.max_seqs
    }

    /// Whether layer `l` selects pages (else it attends every page).
    pub fn selects_layer(&self, l: usize) -> bool {
        self.select.is_some_and(|s| l as u32 >= s.dense_layers)
    }

    /// Splits covering the whole context, rounded up to whole units.
    pub fn all_splits(&self) -> u32 {
        let keys = self.max_pages as u64 * self.page_tokens as u64;
        let splits = keys.div_ceil(ATTN_SPLIT_KEYS as u64) as u32;
        splits.div_ceil(self.unit_splits).max(1) * self.unit_splits
    }

    /// Device bytes the KV cache allocates for `n_layers` layers.
    pub fn device_bytes(&self, n_layers: usize) -> u64 {
        let n = n_layers as u64;
        let mut b = n * round16(self.home_slots() as u64 * self.page_bytes)
            + round16(self.stream_slots as u64 * self.page_bytes)
            + round16(n * self.layer_words as u64 * 4)
            + round16(self.pageout_pages as u64 * self.page_bytes);
        if let Some(sel) = self.select {
            let selecting = n.saturating_sub(sel.dense_layers as u64);
            let scores = self.max_pages as u64 * self.n_heads as u64 * 4;
            b += selecting * round16(self.max_pages as u64 * 2 * self.kv_dim as u64 * 4)
                + round16((4 + 4 * self.touched_pages as u64) * 4)
                + 2 * round16(scores);
            if sel.lagged {
                // Every layer's scores, read back at the end of a token.
                b += round16(n * scores);
            }
        }
        b
    }

    /// This plan with `units` round units of attention splits (and, when streaming, of stream
    /// pool slots: two halves from two units on).
    fn with_units(&self, units: u32) -> Self {
        let mut t = self.clone();
        t.round_splits = units * self.unit_splits;
        t.halves = 1;
        if t.streams {
            let streamed = t.max_pages - t.home_pages.min(t.max_pages);
            if units >= 2 {
                t.halves = 2;
                t.round_splits = units / 2 * self.unit_splits;
                t.stream_slots =
                    2 * (units / 2 * self.unit_pages).min(streamed.max(1)) * self.max_seqs;
            } else {
                t.stream_slots = (units * self.unit_pages).min(streamed.max(1)) * self.max_seqs;
            }
        }
        t
    }

    /// Spend up to `spare` more device bytes: all pages home when that fits, else more home
    /// pages; then more splits per round (each costing `part_per_split` bytes of partial
    /// results for `part_rows` rows and, when streaming, a unit of stream slots); then, with
    /// what is left, longer rounds for decode steps (see [`Self::with_decode_rounds`]).
    pub fn grow(&self, cfg: &ModelConfig, spare: u64, part_per_split: u64, part_rows: u32) -> Self {
        let n = cfg.n_layers;
        let base = self.device_bytes(n) + round16(part_per_split * self.round_splits as u64);
        let cost = |k: &KvPlan| {
            (k.device_bytes(n) + round16(part_per_split * k.round_splits as u64))
                .saturating_sub(base)
        };
        let fits_binding = |k: &KvPlan| {
            k.home_slots() as u64 * k.page_bytes <= k.max_binding
                && k.stream_slots as u64 * k.page_bytes <= k.max_binding
        };
        let mut kv = self.clone();
        let mut full = self.clone();
        full.home_pages = self.max_pages;
        full.streams = false;
        full.stream_slots = 0;
        full.halves = 1;
        if cost(&full) <= spare && fits_binding(&full) {
            kv = full;
        } else if self.streams {
            // First a two-part stream pool (reads of the next round overlap attention of
            // this one), then more recent pages at home, keeping at least one page streamed.
            let two = self.with_units(2);
            if cost(&two) <= spare && fits_binding(&two) {
                kv = two;
            }
            let mut lo = kv.home_pages;
            let mut hi = self.max_pages - 1;
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                let mut t = kv.clone();
                t.home_pages = mid;
                if cost(&t) <= spare && fits_binding(&t) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            kv.home_pages = lo;
        }
        // More splits per round, up to the whole context in one round.
        let max_units = kv.all_splits() / kv.unit_splits;
        let with_units = |units: u32| kv.with_units(units);
        let start = if kv.halves == 2 { 2 } else { 1 };
        let (mut lo, mut hi) = (start, max_units.max(start));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            let t = with_units(mid);
            if cost(&t) <= spare && fits_binding(&t) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let kv = with_units(lo);
        let left = spare.saturating_sub(cost(&kv));
        kv.with_decode_rounds(left, part_rows)
    }

    /// Pages of the stream pool a round of `splits` splits can bring in (a half's worth).
    fn round_pages(&self, splits: u32) -> u32 {
        if self.page_tokens <= ATTN_SPLIT_KEYS {
            splits * (ATTN_SPLIT_KEYS / self.page_tokens)
        } else {
            splits.div_ceil(self.page_tokens / ATTN_SPLIT_KEYS)
        }
    }

    /// Decode rounds as long as the partial buffer allows for one row (`part_rows` rows of
    /// `round_splits` splits), all of the context at most; when pages stream, the stream pool
    /// grows (each of its parts to a decode round's pages) with up to `spare` more bytes, and
    /// the decode rounds take what the pool then holds. Fewer, longer rounds mean fewer waits
    /// on the reads and fewer merges per token.
    pub fn with_decode_rounds(&self, spare: u64, part_rows: u32) -> Self {
        let mut kv = self.clone();
        let cap =
            (part_rows.max(1) as u64 * kv.round_splits as u64).min(kv.all_splits() as u64) as u32;
        let want = (cap / kv.unit_splits).max(1) * kv.unit_splits;
        kv.decode_round_splits = kv.round_splits.max(want);
        if !kv.streams || kv.decode_round_splits <= kv.round_splits {
            return kv;
        }
        let parts = kv.halves.max(1);
        let streamed = kv.max_pages - kv.home_pages.min(kv.max_pages);
        // A one-row pass is one sequence: a part holds that sequence's pages of a round.
        let pool_for = |splits: u32| parts * kv.round_pages(splits).min(streamed.max(1));
        let fits = |splits: u32| {
            let slots = pool_for(splits).max(kv.stream_slots);
            (slots - kv.stream_slots) as u64 * kv.page_bytes <= spare
                && slots as u64 * kv.page_bytes <= kv.max_binding
        };
        // The largest whole number of units whose pool fits.
        let (mut lo, mut hi) = (kv.round_splits / kv.unit_splits, want / kv.unit_splits);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid * kv.unit_splits) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let splits = (lo * kv.unit_splits).max(kv.round_splits);
        kv.stream_slots = pool_for(splits).max(kv.stream_slots);
        kv.decode_round_splits = splits;
        kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_specs_parse() {
        let q = KvSelect::parse("quest:25%", 2).unwrap();
        assert_eq!(q.spec, SelectSpec::Percent(25.0));
        assert_eq!((q.dense_layers, q.lagged), (2, false));
        let l = KvSelect::parse(" quest-lag:8 ", 1).unwrap();
        assert_eq!(l.spec, SelectSpec::Pages(8));
        assert_eq!((l.dense_layers, l.lagged), (1, true));
        assert!(KvSelect::parse("quest-lag:50%", 0).unwrap().lagged);
        for bad in [
            "quest-lag:0",
            "quest-lag:0%",
            "quest-lag:",
            "lag:4",
            "quest-lag-4",
            "quest:lag:4",
        ] {
            assert!(KvSelect::parse(bad, 0).is_err(), "{bad}");
        }
    }
}
