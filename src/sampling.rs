//! Token sampling: repetition penalty, greedy, top-k, temperature, top-p, seeded draw.
//!
//! [`Sampler::sample`] applies, in order:
//! 1. the repetition penalty to every distinct id among the last `repeat_last_n` history tokens
//!    (a positive logit is divided by the penalty, a negative or zero one multiplied);
//! 2. if `temperature <= 0`: the argmax (ties go to the lowest id), and nothing else;
//! 3. top-k (the `top_k` largest logits; 0 keeps all);
//! 4. softmax of `logit / temperature`;
//! 5. top-p: the smallest prefix of the probabilities, sorted descending, whose sum is `>= top_p`
//!    (`top_p >= 1` keeps all);
//! 6. a draw from what is left with a SplitMix64 generator seeded by `seed`.
//!
//! The same parameters and seed give the same sequence of tokens. NaN logits are treated as
//! `-inf` (never chosen unless every logit is NaN or `-inf`, in which case the lowest such id is).

/// Sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `<= 0` (or NaN) means greedy. Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables. Default 40.
    pub top_k: usize,
    /// Nucleus threshold in (0, 1]; values `>= 1` disable it. Default 0.95.
    pub top_p: f32,
    /// Repetition penalty; 1.0 (the default) disables it, as do values `<= 0` and NaN.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalty looks at. Default 64.
    pub repeat_last_n: usize,
    /// Seed of the generator. Default 0; any value, 0 included, is a fixed, reproducible seed
    /// (callers wanting fresh randomness pick a seed themselves, e.g. from the clock).
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Parameters for plain greedy decoding.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Self::default()
        }
    }
}

/// SplitMix64: a tiny, well-mixed 64-bit generator (enough for sampling and seeded test data).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A stateful sampler: each call advances its generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    rng: SplitMix64,
    /// Scratch: (logit, id) candidates, reused between calls.
    cand: Vec<(f32, u32)>,
}

/// Order: larger logit first, then lower id (a total order; NaNs were replaced before).
fn by_logit_desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let rng = SplitMix64(params.seed);
        Sampler {
            params,
            rng,
            cand: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Pick the next token from `logits`; `history` is the tokens so far (prompt included), used
    /// by the repetition penalty. Panics only if `logits` is empty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let d = self.distribution(logits, history);
        self.draw(&d)
    }

    /// Accept or replace a drafted token (speculative sampling with a draft that proposes
    /// `draft` with certainty): the draft is kept with probability p(draft); otherwise a token
    /// is drawn from p with the draft removed (renormalised). The output is distributed as p
    /// whatever the draft. Greedy: the draft is kept when it is the argmax. Returns the token and
    /// whether it is the draft.
    pub fn speculate(&mut self, logits: &[f32], history: &[u32], draft: u32) -> (u32, bool) {
        let d = self.distribution(logits, history);
        match d {
            Dist::Greedy(best) => (best, best == draft),
            Dist::Weights {
                ref ids,
                ref weights,
                total,
            } => {
                let pd = ids
                    .iter()
                    .zip(weights)
                    .find(|(i, _)| **i == draft)
                    .map_or(0.0, |(_, w)| w / total);
                if pd > 0.0 && self.rng.next_f64() < pd {
                    return (draft, true);
                }
                let rest: Vec<(u32, f64)> = ids
                    .iter()
                    .copied()
                    .zip(weights.iter().copied())
                    .filter(|(i, _)| *i != draft)
                    .collect();
                if rest.is_empty() {
                    return (draft, true);
                }
                let t: f64 = rest.iter().map(|r| r.1).sum();
                (self.pick(&rest, t), false)
            }
        }
    }

    fn pick(&mut self, items: &[(u32, f64)], total: f64) -> u32 {
        let r = self.rng.next_f64() * total;
        let mut cum = 0.0;
        for &(id, w) in items {
            cum += w;
            if r < cum {
                return id;
            }
        }
        items[items.len() - 1].0
    }

    fn draw(&mut self, d: &Dist) -> u32 {
        match d {
            Dist::Greedy(b) => *b,
            Dist::Weights {
                ids,
                weights,
                total,
            } => {
                let items: Vec<(u32, f64)> =
                    ids.iter().copied().zip(weights.iter().copied()).collect();
                self.pick(&items, *total)
            }
        }
    }

    /// The distribution the next token is drawn from: steps 1-5 above.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Dist {
        assert!(!logits.is_empty(), "sample: empty logits");
        let p = &self.params;
        let mut cand = std::mem::take(&mut self.cand);
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (if l.is_nan() { f32::NEG_INFINITY } else { l }, i as u32)),
        );

        // 1. Repetition penalty, once per distinct recent id.
        let penalty = p.repeat_penalty;
        if penalty > 0.0 && penalty != 1.0 && p.repeat_last_n > 0 {
            let start = history.len().saturating_sub(p.repeat_last_n);
            let mut recent: Vec<u32> = history[start..].to_vec();
            recent.sort_unstable();
            recent.dedup();
            for id in recent {
                if let Some(c) = cand.get_mut(id as usize) {
                    c.0 = if c.0 > 0.0 {
                        c.0 / penalty
                    } else {
                        c.0 * penalty
                    };
                }
            }
        }

        // 2. Greedy.
        let temp = p.temperature;
        if temp.is_nan() || temp <= 0.0 || p.top_k == 1 {
            let best = cand
                .iter()
                .copied()
                .min_by(by_logit_desc)
                .map_or(0, |c| c.1);
            self.cand = cand;
            return Dist::Greedy(best);
        }

        // 3. Top-k: partition around the k-th best, then sort the kept part.
        let n = cand.len();
        let k = if p.top_k == 0 || p.top_k >= n {
            n
        } else {
            p.top_k
        };
        if k < n {
            cand.select_nth_unstable_by(k - 1, by_logit_desc);
            cand.truncate(k);
        }
        let need_sorted = p.top_p < 1.0;
        if need_sorted {
            cand.sort_unstable_by(by_logit_desc);
        }

        // 4. Softmax with temperature (weights, unnormalised).
        let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.0));
        if !max.is_finite() {
            // Every logit is -inf (or NaN), or +inf is present: take the best deterministically.
            let best = cand
                .iter()
                .copied()
                .min_by(by_logit_desc)
                .map_or(0, |c| c.1);
            self.cand = cand;
            return Dist::Greedy(best);
        }
        let inv_t = 1.0 / temp as f64;
        let mut weights: Vec<f64> = cand
            .iter()
            .map(|c| ((c.0 as f64 - max as f64) * inv_t).exp())
            .collect();
        let mut total: f64 = weights.iter().sum();

        // 5. Top-p over the sorted candidates.
        if need_sorted {
            let target = p.top_p.max(0.0) as f64 * total;
            let mut cum = 0.0;
            let mut keep = weights.len();
            for (i, w) in weights.iter().enumerate() {
                cum += w;
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
            weights.truncate(keep);
            cand.truncate(keep);
            total = weights.iter().sum();
        }

        let ids: Vec<u32> = cand.iter().map(|c| c.1).collect();
        self.cand = cand;
        Dist::Weights {
            ids,
            weights,
            total,
        }
    }
}

/// A token distribution: certain (greedy), or weights over candidate ids.
#[derive(Debug, Clone)]
pub enum Dist {
    Greedy(u32),
    Weights {
        ids: Vec<u32>,
        weights: Vec<f64>,
        total: f64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplerParams {
        SamplerParams {
            temperature,
            top_k,
            top_p,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed,
        }
    }

    /// Deterministic pseudo-random logits in roughly [-4, 4].
    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut g = SplitMix64(seed);
        (0..n).map(|_| (g.next_f64() * 8.0 - 4.0) as f32).collect()
    }

    fn argmax(x: &[f32]) -> u32 {
        crate::model::reference::argmax(x)
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits(1000, 1);
        let mut s = Sampler::new(params(0.0, 40, 0.95, 3));
        assert_eq!(s.sample(&l, &[]), argmax(&l));
        // Ties go to the lowest id.
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 0.0], &[]), 1);
        // Negative temperature is greedy too.
        let mut s = Sampler::new(params(-1.0, 0, 1.0, 3));
        assert_eq!(s.sample(&l, &[]), argmax(&l));
    }

    #[test]
    fn top_k_one_is_argmax_at_any_temperature() {
        let l = logits(49152, 2);
        for t in [0.1, 1.0, 5.0, 100.0] {
            let mut s = Sampler::new(params(t, 1, 1.0, 7));
            for _ in 0..20 {
                assert_eq!(s.sample(&l, &[]), argmax(&l));
            }
        }
    }

    #[test]
    fn seeds_reproduce_and_differ() {
        let l = logits(500, 3);
        let run = |seed| {
            let mut s = Sampler::new(params(1.5, 0, 1.0, seed));
            (0..50).map(|_| s.sample(&l, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn tiny_top_p_returns_top_token() {
        let l = logits(1000, 4);
        for seed in 0..50 {
            let mut s = Sampler::new(params(2.0, 0, 1e-6, seed));
            assert_eq!(s.sample(&l, &[]), argmax(&l));
        }
    }

    #[test]
    fn samples_stay_in_top_k() {
        let l = logits(1000, 5);
        let mut order: Vec<u32> = (0..1000).collect();
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        let top: std::collections::HashSet<u32> = order[..10].iter().copied().collect();
        let mut s = Sampler::new(params(3.0, 10, 1.0, 11));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let t = s.sample(&l, &[]);
            assert!(top.contains(&t), "token {t} outside the top 10");
            seen.insert(t);
        }
        assert!(
            seen.len() > 5,
            "a hot temperature should spread over the top 10"
        );
    }

    #[test]
    fn samples_stay_in_nucleus() {
        let l = logits(300, 6);
        let t = 1.0f64;
        let top_p = 0.6f64;
        // The nucleus, computed independently.
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        let max = l[order[0]] as f64;
        let w: Vec<f64> = order
            .iter()
            .map(|&i| ((l[i] as f64 - max) / t).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let mut cum = 0.0;
        let mut nucleus = std::collections::HashSet::new();
        for (i, &id) in order.iter().enumerate() {
            nucleus.insert(id as u32);
            cum += w[i] / total;
            if cum >= top_p {
                break;
            }
        }
        let mut s = Sampler::new(params(t as f32, 0, top_p as f32, 12));
        for _ in 0..3000 {
            let tok = s.sample(&l, &[]);
            assert!(nucleus.contains(&tok), "token {tok} outside the nucleus");
        }
    }

    #[test]
    fn repetition_penalty_flips_greedy() {
        let l = [2.0, 1.5, -1.0];
        let mut p = params(0.0, 0, 1.0, 0);
        assert_eq!(Sampler::new(p.clone()).sample(&l, &[0]), 0);
        p.repeat_penalty = 1.5; // 2.0 / 1.5 = 1.33 < 1.5
        assert_eq!(Sampler::new(p.clone()).sample(&l, &[0]), 1);
        // Only the last repeat_last_n tokens count.
        p.repeat_last_n = 1;
        assert_eq!(Sampler::new(p.clone()).sample(&l, &[0, 2]), 0);
        // Negative logits are multiplied (pushed further down); repeats count once.
        let l = [-1.0, -1.2];
        assert_eq!(Sampler::new(p.clone()).sample(&l, &[0]), 1);
        p.repeat_last_n = 64;
        assert_eq!(Sampler::new(p).sample(&l, &[0, 0, 0, 0]), 1);
    }

    #[test]
    fn frequencies_match_softmax() {
        let l = [1.0f32, 2.0, 0.5, -1.0];
        let z: f64 = l.iter().map(|&v| (v as f64).exp()).sum();
        let mut s = Sampler::new(params(1.0, 0, 1.0, 2024));
        let n = 40_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&l, &[]) as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let expected = (l[i] as f64).exp() / z;
            let got = c as f64 / n as f64;
            assert!(
                (got - expected).abs() < 0.015,
                "token {i}: frequency {got:.4}, softmax {expected:.4}"
            );
        }
    }

    #[test]
    fn nan_and_inf_logits_do_not_panic() {
        let l = [f32::NAN, 1.0, f32::NAN, 0.5];
        for seed in 0..20 {
            let mut s = Sampler::new(params(1.0, 3, 0.9, seed));
            let t = s.sample(&l, &[0, 1, 2]);
            assert!(t == 1 || t == 3);
        }
        let mut s = Sampler::new(params(0.0, 0, 1.0, 0));
        assert_eq!(s.sample(&l, &[]), 1);
        let all_nan = [f32::NAN; 5];
        let mut s = Sampler::new(SamplerParams::default());
        assert!(s.sample(&all_nan, &[]) < 5);
        let with_inf = [0.0, f32::INFINITY, 1.0];
        assert_eq!(s.sample(&with_inf, &[]), 1);
        let neg_inf = [f32::NEG_INFINITY; 3];
        assert_eq!(s.sample(&neg_inf, &[]), 0);
        // History ids beyond the vocabulary are ignored.
        let mut s = Sampler::new(SamplerParams {
            repeat_penalty: 1.3,
            ..SamplerParams::default()
        });
        assert!(s.sample(&[0.0, 1.0], &[7, 99_999]) < 2);
    }

    #[test]
    fn speculative_acceptance_preserves_the_distribution() {
        // p over 6 tokens after temperature; drafts of a likely, an unlikely and an excluded
        // token: the output frequencies must equal p whatever the draft.
        let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0, -30.0];
        let mut probe = Sampler::new(params(1.0, 0, 1.0, 1));
        let Dist::Weights {
            ids,
            weights,
            total,
        } = probe.distribution(&logits, &[])
        else {
            panic!("expected weights");
        };
        let mut want = [0f64; 6];
        for (i, w) in ids.iter().zip(&weights) {
            want[*i as usize] = w / total;
        }
        let n = 200_000;
        for draft in [0u32, 3, 5] {
            let mut s = Sampler::new(params(1.0, 0, 1.0, 7 + draft as u64));
            let mut count = [0u64; 6];
            let mut accepted = 0;
            for _ in 0..n {
                let (t, ok) = s.speculate(&logits, &[], draft);
                count[t as usize] += 1;
                accepted += ok as u64;
            }
            for k in 0..6 {
                let f = count[k] as f64 / n as f64;
                // 5 standard deviations of a binomial frequency.
                let sd = (want[k] * (1.0 - want[k]) / n as f64).sqrt();
                assert!(
                    (f - want[k]).abs() <= 5.0 * sd + 1e-9,
                    "draft {draft}: token {k} frequency {f} vs p {}",
                    want[k]
                );
            }
            let fa = accepted as f64 / n as f64;
            let sd = (want[draft as usize] * (1.0 - want[draft as usize]) / n as f64).sqrt();
            assert!((fa - want[draft as usize]).abs() <= 5.0 * sd + 1e-9);
        }
        // Greedy: kept exactly when it is the argmax.
        let mut g = Sampler::new(SamplerParams::greedy());
        assert_eq!(g.speculate(&logits, &[], 0), (0, true));
        assert_eq!(g.speculate(&logits, &[], 2), (0, false));
    }
}
