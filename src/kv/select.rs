//! Which pages page selection keeps, from the page scores the score kernel computed.
//!
//! The kernel gives, per candidate page and query head, Quest's upper bound of `q·k` over the
//! page's keys (from their per-channel min and max). A page is ranked by the attention mass
//! those bounds allow it, summed over the heads: per head the bound becomes a logit (times the
//! attention scale, through the soft cap where the model has one) and, relative to that head's
//! best candidate, a weight `exp(logit - best)`. Each head's best page weighs 1 whatever the
//! scale of its scores, so every head gets the pages it needs; a page two heads both want
//! outranks one only a single head wants. (Ranking by the largest bound over the heads instead
//! lets the heads with the largest query norms choose every page.)

/// How a bound becomes a logit.
#[derive(Debug, Clone, Copy)]
pub struct Logit {
    pub scale: f32,
    /// Soft cap `c`: logits become `c tanh(l / c)` (None: none).
    pub softcap: Option<f32>,
}

impl Logit {
    fn of(&self, bound: f32) -> f32 {
        let l = bound * self.scale;
        match self.softcap {
            Some(c) if c > 0.0 => c * (l / c).tanh(),
            _ => l,
        }
    }
}

/// The `keep` best of `candidates` (sorted by page), given `scores[page * heads + head]`
/// (missing or non-finite scores rank last). Ties go to the lower page.
pub fn keep_pages(
    scores: &[f32],
    heads: usize,
    candidates: &[u32],
    keep: usize,
    logit: Logit,
) -> Vec<u32> {
    if keep >= candidates.len() {
        return candidates.to_vec();
    }
    let heads = heads.max(1);
    let at = |p: u32, h: usize| {
        let s = scores
            .get(p as usize * heads + h)
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        if s.is_finite() {
            logit.of(s)
        } else {
            f32::NEG_INFINITY
        }
    };
    let best: Vec<f32> = (0..heads)
        .map(|h| {
            candidates
                .iter()
                .map(|&p| at(p, h))
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    let mass = |p: u32| -> f64 {
        (0..heads)
            .filter(|&h| best[h].is_finite())
            .map(|h| f64::from(at(p, h) - best[h]).exp())
            .sum()
    };
    let mut ranked: Vec<(f64, u32)> = candidates.iter().map(|&p| (mass(p), p)).collect();
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut out: Vec<u32> = ranked[..keep].iter().map(|r| r.1).collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Logit = Logit {
        scale: 1.0,
        softcap: None,
    };

    #[test]
    fn every_head_gets_its_best_page() {
        // Two heads; head 0's bounds are large everywhere, head 1's small. Head 1 wants page
        // 3, which head 0 ranks last: the largest bound over heads would keep pages 1 and 2.
        let scores = [
            0.0, 0.0, // page 0 (not a candidate)
            30.0, 0.1, // page 1
            29.0, 0.2, // page 2
            20.0, 5.0, // page 3
        ];
        assert_eq!(keep_pages(&scores, 2, &[1, 2, 3], 2, PLAIN), vec![1, 3]);
        // Both heads' second choices: page 2 beats nothing else now.
        assert_eq!(keep_pages(&scores, 2, &[1, 2, 3], 3, PLAIN), vec![1, 2, 3]);
    }

    #[test]
    fn shared_wants_outrank_single_ones() {
        // Page 1 is every head's best; pages 2 and 3 each one head's second best, page 3
        // closer: pages 1 and 3.
        let scores = [0.0, 0.0, 9.0, 9.0, 8.0, 0.0, 0.0, 8.5];
        assert_eq!(keep_pages(&scores, 2, &[1, 2, 3], 2, PLAIN), vec![1, 3]);
    }

    #[test]
    fn scale_softcap_ties_and_missing_scores() {
        // The scale sharpens the weights but keeps the best page per head; a soft cap flattens
        // large bounds (here both pages sit near the cap, so the tie goes to the lower page).
        let scores = [0.0, 100.0, 90.0];
        let sharp = Logit {
            scale: 2.0,
            softcap: None,
        };
        assert_eq!(keep_pages(&scores, 1, &[1, 2], 1, sharp), vec![1]);
        let capped = Logit {
            scale: 1.0,
            softcap: Some(1e-3),
        };
        assert_eq!(keep_pages(&scores, 1, &[2, 1], 1, capped), vec![1]);
        // Pages past the scores rank last; NaN too.
        let scores = [f32::NAN, 1.0, f32::NAN];
        assert_eq!(keep_pages(&scores, 1, &[0, 1, 2, 7], 1, PLAIN), vec![1]);
        assert_eq!(keep_pages(&scores, 1, &[0, 2, 7], 1, PLAIN), vec![0]);
        // Keeping everything keeps every candidate, in page order.
        assert_eq!(keep_pages(&[], 4, &[5, 9], 2, PLAIN), vec![5, 9]);
    }
}
