//! Perplexity arithmetic, following llama.cpp's `perplexity` tool.
//!
//! The method, as that tool does it:
//! 1. The whole text is tokenized once, the way the model tokenizes a prompt (so with a leading
//!    BOS when the model adds one).
//! 2. The tokens are cut into non-overlapping chunks of `ctx` tokens, starting at token 0; the
//!    tail shorter than `ctx` is dropped, and at most the requested number of chunks is kept.
//! 3. When the model adds BOS, the first token of every chunk is replaced by BOS before the chunk
//!    is evaluated (for the first chunk it already is BOS). Only the evaluated input changes: the
//!    replaced token is never a scored target.
//! 4. Each chunk is evaluated from an empty KV cache.
//! 5. Only the second half of a chunk is scored, so every prediction has at least `ctx/2` tokens
//!    of context: for positions `j` in `[ctx/2, ctx - 1)`, the negative log-likelihood of token
//!    `j + 1` under the log-softmax of the logits at `j`. That is `ctx - ctx/2 - 1` scores a chunk.
//! 6. The perplexity is `exp` of the mean of all scores over all chunks. Its standard error is
//!    `ppl * sqrt(var / (n - 1))`, where `var` is the population variance of the `n` scores, i.e.
//!    `ppl` times the standard error of the mean score (first-order propagation through `exp`).
//!    The result is shown as `PPL = x +/- y` with 4 and 5 decimals. After each chunk the tool
//!    also shows the running perplexity of all the chunks so far.
//!
//! Two deliberate differences: llama.cpp refuses a text of fewer than `2 * ctx` tokens, whereas
//! [`chunks`] accepts any text that holds at least one whole chunk (results agree whenever both
//! run); and the variance is accumulated with Welford's update rather than from the sum of
//! squares, which is the same quantity with less cancellation (a constant score gives exactly 0).

use serde::Serialize;

use super::EvalError;

/// The smallest context [`chunks`] accepts: `ctx/2` tokens of context and more than one score.
pub const MIN_CTX: usize = 4;

/// One chunk of the text, as it is to be evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Index of the chunk's first token in the whole tokenized text.
    pub start: usize,
    /// The `ctx` tokens to evaluate, the first replaced by BOS when the model adds one.
    pub tokens: Vec<u32>,
}

impl Chunk {
    /// The scored predictions of this chunk: `(j, target)` pairs, where `target` is the token at
    /// `j + 1` and is to be scored under the logits computed at position `j`.
    pub fn scored(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let first = first_scored(self.tokens.len());
        self.tokens
            .iter()
            .enumerate()
            .skip(first + 1)
            .map(|(i, &t)| (i - 1, t))
    }
}

/// Cuts a tokenized text into the chunks to evaluate.
///
/// `tokens` is the whole text as the model tokenizes a prompt; `ctx` the chunk length;
/// `max_chunks` caps the number of chunks (`None`: as many as the text holds); `bos` is the BOS
/// id when the model adds BOS (it then replaces the first token of each chunk), else `None`.
pub fn chunks(
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
) -> Result<Vec<Chunk>, EvalError> {
    if ctx < MIN_CTX {
        return Err(EvalError::CtxTooSmall { ctx, min: MIN_CTX });
    }
    if max_chunks == Some(0) {
        return Err(EvalError::NoChunks);
    }
    let available = tokens.len() / ctx;
    if available == 0 {
        return Err(EvalError::TextTooShort {
            have: tokens.len(),
            need: ctx,
            ctx,
        });
    }
    let n = max_chunks.map_or(available, |m| m.min(available));
    let out = tokens
        .chunks_exact(ctx)
        .take(n)
        .enumerate()
        .map(|(i, window)| {
            let mut tokens = window.to_vec();
            if let (Some(b), Some(first)) = (bos, tokens.first_mut()) {
                *first = b;
            }
            Chunk {
                start: i * ctx,
                tokens,
            }
        })
        .collect();
    Ok(out)
}

/// The first position of a chunk whose logits are scored: `ctx / 2`.
pub fn first_scored(ctx: usize) -> usize {
    ctx / 2
}

/// How many predictions a chunk of `ctx` tokens scores: `ctx - ctx/2 - 1` (0 when `ctx < 2`).
pub fn scored_per_chunk(ctx: usize) -> usize {
    ctx.saturating_sub(first_scored(ctx)).saturating_sub(1)
}

/// The negative log-likelihood `-log p(target)` under the softmax of `logits`, in f64.
///
/// Computed as `max + ln(sum_i exp(logit_i - max)) - logit_target`, which neither overflows nor
/// loses the small probabilities. Every logit must be finite and `target` must index `logits`.
pub fn nll(logits: &[f32], target: u32) -> Result<f64, EvalError> {
    let t = usize::try_from(target)
        .ok()
        .filter(|&t| t < logits.len())
        .ok_or(EvalError::TargetOutOfRange {
            target,
            n_vocab: logits.len(),
        })?;
    if let Some((index, &value)) = logits.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(EvalError::NonFiniteLogit { index, value });
    }
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = logits.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    Ok(max + sum.ln() - f64::from(logits[t]))
}

/// Per-chunk totals kept by [`PplAccumulator`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ChunkTotals {
    sum: f64,
    count: usize,
}

/// Adds up scores into a perplexity, its standard error and per-chunk figures.
///
/// Call [`add`](Self::add) (or [`add_logits`](Self::add_logits)) for each scored prediction and
/// [`add_chunk`](Self::add_chunk) after the last one of each chunk.
#[derive(Debug, Clone, Default)]
pub struct PplAccumulator {
    sum: f64,
    count: usize,
    /// Welford's running mean and sum of squared deviations of the scores.
    mean: f64,
    m2: f64,
    /// Scores added since the last chunk mark.
    open: ChunkTotals,
    /// Per closed chunk: its totals and the running perplexity after it.
    closed: Vec<(ChunkTotals, f64)>,
}

impl PplAccumulator {
    /// Adds one score, a negative log-likelihood as [`nll`] returns it.
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.count += 1;
        let delta = nll - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (nll - self.mean);
        self.open.sum += nll;
        self.open.count += 1;
    }

    /// Scores `target` under `logits` with [`nll`], adds the score and returns it.
    pub fn add_logits(&mut self, logits: &[f32], target: u32) -> Result<f64, EvalError> {
        let v = nll(logits, target)?;
        self.add(v);
        Ok(v)
    }

    /// Marks the end of a chunk: the scores added since the previous mark form one chunk.
    /// Does nothing when no score was added since then.
    pub fn add_chunk(&mut self) {
        if self.open.count == 0 {
            return;
        }
        let running = self.ppl();
        self.closed.push((self.open, running));
        self.open = ChunkTotals::default();
    }

    /// How many scores were added.
    pub fn tokens(&self) -> usize {
        self.count
    }

    /// The mean score (NaN when none was added).
    pub fn mean_nll(&self) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        self.sum / self.count as f64
    }

    /// `exp` of the mean score (NaN when none was added).
    pub fn ppl(&self) -> f64 {
        self.mean_nll().exp()
    }

    /// The standard error of [`ppl`](Self::ppl): `ppl * sqrt(var / (n - 1))` with `var` the
    /// population variance of the `n` scores. 0 when fewer than two scores were added or they
    /// are all equal.
    pub fn stderr(&self) -> f64 {
        if self.count < 2 || self.m2 <= 0.0 {
            return 0.0;
        }
        let n = self.count as f64;
        let var = self.m2 / n;
        self.ppl() * (var / (n - 1.0)).sqrt()
    }

    /// All the figures. Scores added after the last [`add_chunk`](Self::add_chunk) count as one
    /// more chunk.
    pub fn report(&self) -> PplReport {
        let mut chunks = self.closed.clone();
        if self.open.count > 0 {
            chunks.push((self.open, self.ppl()));
        }
        PplReport {
            ppl: self.ppl(),
            stderr: self.stderr(),
            tokens: self.count,
            chunks: chunks.len(),
            mean_nll: self.mean_nll(),
            per_chunk_ppl: chunks
                .iter()
                .map(|(c, _)| (c.sum / c.count as f64).exp())
                .collect(),
            running_ppl: chunks.iter().map(|&(_, r)| r).collect(),
        }
    }
}

/// The result of a perplexity evaluation. Its `Display` is llama.cpp's final line,
/// `PPL = x +/- y`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PplReport {
    /// Perplexity over all scored predictions.
    pub ppl: f64,
    /// Standard error of `ppl`.
    pub stderr: f64,
    /// How many predictions were scored.
    pub tokens: usize,
    /// How many chunks they came from.
    pub chunks: usize,
    /// Mean negative log-likelihood (nats per token); `ppl = exp(mean_nll)`.
    pub mean_nll: f64,
    /// Each chunk's own perplexity, in order.
    pub per_chunk_ppl: Vec<f64>,
    /// The perplexity of all chunks up to and including each one, as llama.cpp shows it while
    /// it runs (`[1]x,[2]y,...`).
    pub running_ppl: Vec<f64>,
}

impl std::fmt::Display for PplReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PPL = {:.4} +/- {:.5}", self.ppl, self.stderr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn uniform_logits_give_ppl_equal_to_vocab_size() {
        for n_vocab in [1usize, 2, 7, 49152] {
            let logits = vec![3.25f32; n_vocab];
            let mut acc = PplAccumulator::default();
            for t in 0..n_vocab.min(5) {
                let v = acc.add_logits(&logits, t as u32).unwrap();
                assert!(close(v, (n_vocab as f64).ln(), 1e-12), "{v}");
            }
            acc.add_chunk();
            assert!(close(acc.ppl(), n_vocab as f64, 1e-10), "{}", acc.ppl());
            assert_eq!(acc.stderr(), 0.0);
        }
    }

    /// Logits (0, ln 3): p = (1/4, 3/4). Scoring token 0 then token 1 gives nll ln 4 and
    /// ln(4/3); their mean is ln(16/3)/2, so ppl = 4/sqrt(3). The two scores differ by ln 3, so
    /// the population variance is (ln 3 / 2)^2 and the standard error of the mean, with n - 1 = 1,
    /// is ln 3 / 2: stderr = 4/sqrt(3) * ln 3 / 2.
    #[test]
    fn two_token_example_by_hand() {
        let ln3 = 3f64.ln();
        for shift in [0.0f32, 1000.0, -1000.0] {
            let logits = [shift, shift + ln3 as f32];
            let mut acc = PplAccumulator::default();
            let a = acc.add_logits(&logits, 0).unwrap();
            let b = acc.add_logits(&logits, 1).unwrap();
            // ln 3 in f32 is off by ~1e-8 relative; shifted logits lose more in f32.
            let tol = if shift == 0.0 { 1e-7 } else { 1e-4 };
            assert!(close(a, 4f64.ln(), tol), "{a}");
            assert!(close(b, (4.0f64 / 3.0).ln(), tol), "{b}");
            let ppl = 4.0 / 3f64.sqrt();
            assert!(close(acc.ppl(), ppl, tol), "{}", acc.ppl());
            assert!(
                close(acc.stderr(), ppl * ln3 / 2.0, tol),
                "{}",
                acc.stderr()
            );
            let r = acc.report();
            assert_eq!((r.tokens, r.chunks), (2, 1));
            assert!(close(r.mean_nll, (16.0f64 / 3.0).ln() / 2.0, tol));
        }
    }

    #[test]
    fn nll_is_exact_for_a_peaked_distribution() {
        // p(target) = e^0 / (e^0 + 2 e^-20): nll = ln(1 + 2e^-20).
        let v = nll(&[-20.0, 0.0, -20.0], 1).unwrap();
        assert!(close(v, (2.0 * (-20f64).exp()).ln_1p(), 1e-9), "{v}");
        // The unlikely token: nll = 20 + ln(1 + 2e^-20).
        let w = nll(&[-20.0, 0.0, -20.0], 0).unwrap();
        assert!(
            close(w, 20.0 + (2.0 * (-20f64).exp()).ln_1p(), 1e-12),
            "{w}"
        );
    }

    #[test]
    fn nll_rejects_bad_input() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(matches!(
                nll(&[0.0, bad, 1.0], 0),
                Err(EvalError::NonFiniteLogit { index: 1, .. })
            ));
        }
        assert_eq!(
            nll(&[0.0, 1.0], 2),
            Err(EvalError::TargetOutOfRange {
                target: 2,
                n_vocab: 2
            })
        );
        assert_eq!(
            nll(&[], 0),
            Err(EvalError::TargetOutOfRange {
                target: 0,
                n_vocab: 0
            })
        );
        let msg = nll(&[0.0, f32::NAN], 0).unwrap_err().to_string();
        assert!(msg.contains("logit 1") && msg.contains("NaN"), "{msg}");
    }

    #[test]
    fn stderr_matches_the_sum_of_squares_formula() {
        // Scores 1, 2, 3, 4: mean 2.5, population variance 1.25, n - 1 = 3.
        let mut acc = PplAccumulator::default();
        for v in [1.0, 2.0, 3.0, 4.0] {
            acc.add(v);
        }
        let ppl = 2.5f64.exp();
        assert!(close(acc.ppl(), ppl, 1e-14));
        assert!(close(acc.stderr(), ppl * (1.25f64 / 3.0).sqrt(), 1e-14));
        assert_eq!(format!("{}", acc.report()), "PPL = 12.1825 +/- 7.86377");
    }

    #[test]
    fn constant_scores_have_zero_stderr() {
        let mut acc = PplAccumulator::default();
        for _ in 0..1000 {
            acc.add(0.1f64.exp());
        }
        assert_eq!(acc.stderr(), 0.0);
        let mut one = PplAccumulator::default();
        one.add(2.0);
        assert_eq!(one.stderr(), 0.0);
        assert!(close(one.ppl(), 2f64.exp(), 1e-15));
    }

    #[test]
    fn empty_accumulator_reports_nan() {
        let mut acc = PplAccumulator::default();
        acc.add_chunk();
        let r = acc.report();
        assert_eq!((r.tokens, r.chunks), (0, 0));
        assert!(r.ppl.is_nan() && r.mean_nll.is_nan());
        assert_eq!(r.stderr, 0.0);
        assert!(r.per_chunk_ppl.is_empty() && r.running_ppl.is_empty());
    }

    /// Chunk 1 scores ln 2 twice (ppl 2), chunk 2 scores ln 4 once (ppl 4). Overall the mean is
    /// 4 ln 2 / 3, so ppl = 2^(4/3); the running values are 2 then 2^(4/3).
    #[test]
    fn per_chunk_and_running_perplexity() {
        let (ln2, ln4) = (2f64.ln(), 4f64.ln());
        let mut acc = PplAccumulator::default();
        acc.add(ln2);
        acc.add(ln2);
        acc.add_chunk();
        acc.add_chunk(); // an empty chunk mark is ignored
        acc.add(ln4);
        let open = acc.report(); // the unmarked tail counts as a chunk
        acc.add_chunk();
        let r = acc.report();
        assert_eq!(open, r);
        assert_eq!((r.tokens, r.chunks), (3, 2));
        let want = 2f64.powf(4.0 / 3.0);
        assert!(close(r.ppl, want, 1e-14));
        assert!(close(r.per_chunk_ppl[0], 2.0, 1e-14) && close(r.per_chunk_ppl[1], 4.0, 1e-14));
        assert!(close(r.running_ppl[0], 2.0, 1e-14) && close(r.running_ppl[1], want, 1e-14));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["tokens"], 3);
        assert_eq!(json["per_chunk_ppl"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn chunking_drops_the_tail_and_replaces_the_first_token() {
        let tokens: Vec<u32> = (100..110).collect();
        let c = chunks(&tokens, 4, None, None).unwrap();
        assert_eq!(
            c,
            vec![
                Chunk {
                    start: 0,
                    tokens: vec![100, 101, 102, 103]
                },
                Chunk {
                    start: 4,
                    tokens: vec![104, 105, 106, 107]
                },
            ]
        );
        let b = chunks(&tokens, 4, None, Some(1)).unwrap();
        assert_eq!(b[0].tokens, vec![1, 101, 102, 103]);
        assert_eq!(b[1].tokens, vec![1, 105, 106, 107]);
        assert_eq!(b[1].start, 4);
        assert_eq!(chunks(&tokens, 4, Some(1), None).unwrap().len(), 1);
        assert_eq!(chunks(&tokens, 4, Some(9), None).unwrap().len(), 2);
        assert_eq!(chunks(&tokens, 5, None, None).unwrap().len(), 2);
        assert_eq!(chunks(&tokens, 10, None, None).unwrap().len(), 1);
    }

    #[test]
    fn chunking_errors() {
        let tokens: Vec<u32> = (0..10).collect();
        assert_eq!(
            chunks(&tokens, 11, None, None),
            Err(EvalError::TextTooShort {
                have: 10,
                need: 11,
                ctx: 11
            })
        );
        let msg = chunks(&tokens, 4096, None, None).unwrap_err().to_string();
        assert!(msg.contains("10 tokens") && msg.contains("4096"), "{msg}");
        assert_eq!(
            chunks(&tokens, 3, None, None),
            Err(EvalError::CtxTooSmall { ctx: 3, min: 4 })
        );
        assert_eq!(
            chunks(&tokens, 0, None, None),
            Err(EvalError::CtxTooSmall { ctx: 0, min: 4 })
        );
        assert_eq!(chunks(&tokens, 4, Some(0), None), Err(EvalError::NoChunks));
        assert!(matches!(
            chunks(&[], 4, None, Some(1)),
            Err(EvalError::TextTooShort { have: 0, .. })
        ));
    }

    #[test]
    fn scored_range_is_the_second_half_but_last() {
        assert_eq!((first_scored(4096), scored_per_chunk(4096)), (2048, 2047));
        assert_eq!((first_scored(512), scored_per_chunk(512)), (256, 255));
        assert_eq!((first_scored(5), scored_per_chunk(5)), (2, 2));
        assert_eq!((first_scored(4), scored_per_chunk(4)), (2, 1));
        // ctx 6: logits at 3 and 4 predict the tokens at 4 and 5; never the BOS slot.
        let tokens: Vec<u32> = (10..22).collect();
        let c = chunks(&tokens, 6, None, Some(0)).unwrap();
        let s: Vec<Vec<(usize, u32)>> = c.iter().map(|c| c.scored().collect()).collect();
        assert_eq!(s, vec![vec![(3, 14), (4, 15)], vec![(3, 20), (4, 21)]]);
        let odd = chunks(&tokens, 5, Some(1), None).unwrap();
        assert_eq!(odd[0].scored().collect::<Vec<_>>(), vec![(2, 13), (3, 14)]);
    }

    /// A whole evaluation with a stand-in model whose logits at every position are uniform over
    /// 8 tokens except the true next token, which gets logit ln 3 (p = 3/10): every score is
    /// ln(10/3), so the ppl is 10/3 and the count is chunks * (ctx - ctx/2 - 1).
    #[test]
    fn end_to_end_with_a_stand_in_model() {
        let tokens: Vec<u32> = (0..100u32).map(|i| (i * 5 + 1) % 8).collect();
        let ctx = 16;
        let chunks = chunks(&tokens, ctx, None, Some(0)).unwrap();
        assert_eq!(chunks.len(), 6);
        let mut acc = PplAccumulator::default();
        for chunk in &chunks {
            for (j, target) in chunk.scored() {
                let truth = tokens[chunk.start + j + 1];
                assert_eq!(target, truth);
                let mut logits = vec![0.0f32; 8];
                logits[truth as usize] = 3f32.ln();
                acc.add_logits(&logits, target).unwrap();
            }
            acc.add_chunk();
        }
        let r = acc.report();
        assert_eq!((r.tokens, r.chunks), (6 * 7, 6));
        assert!(close(r.ppl, 10.0 / 3.0, 1e-6), "{}", r.ppl);
        assert!(r.stderr < 1e-6);
    }
}
