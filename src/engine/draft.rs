//! Prompt-lookup drafting: several tokens per pass when the text repeats itself.
//!
//! After each accepted token the sequence's own context is searched for the most recent earlier
//! occurrence of its last n tokens (n from `ngram` down to 1); the tokens that followed it are
//! the draft (at most `max`). One pass over [last token, draft...] computes the logits after each
//! of them with the decode-form kernels, so each row's logits are exactly those token-by-token
//! decoding would compute. Drafted tokens are then accepted in order by the speculative rule
//! ([`Sampler::speculate`]: greedy keeps a draft that is the argmax; sampling keeps it with its
//! probability and otherwise draws from the rest), which leaves the output distribution
//! unchanged; the first rejected position yields the sampled replacement, and a fully accepted
//! draft yields one more token from the last row. Rejected tokens are rolled back out of the KV
//! cache (`truncate`).

use std::time::Instant;

use super::{Engine, EngineError, GenStats};
use crate::sampling::Sampler;

/// `--draft lookup[:ngram=N,max=K]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftConfig {
    /// Longest n-gram matched (shorter ones are tried after it, down to 1).
    pub ngram: usize,
    /// Most drafted tokens per pass.
    pub max: usize,
}

impl Default for DraftConfig {
    fn default() -> Self {
        Self { ngram: 3, max: 6 }
    }
}

impl std::str::FromStr for DraftConfig {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = |m: &str| {
            format!("--draft {s:?}: {m} (expected lookup or lookup:ngram=N,max=K, N 1-8, K 1-16)")
        };
        let rest = match s.trim().strip_prefix("lookup") {
            Some(r) => r,
            None => return Err(err("unknown drafter")),
        };
        let mut c = DraftConfig::default();
        let rest = rest.trim();
        if rest.is_empty() {
            return Ok(c);
        }
        let rest = rest
            .strip_prefix(':')
            .ok_or_else(|| err("options follow a colon"))?;
        for kv in rest.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err("options are key=value"))?;
            let v: usize = v.trim().parse().map_err(|_| err("values are numbers"))?;
            match k.trim() {
                "ngram" if (1..=8).contains(&v) => c.ngram = v,
                "max" if (1..=16).contains(&v) => c.max = v,
                _ => return Err(err("unknown option or value out of range")),
            }
        }
        Ok(c)
    }
}

/// Drafted tokens for a sequence whose tokens are `history`: what followed the most recent
/// earlier occurrence of its longest matching suffix (at most `cfg.max` tokens).
pub fn propose(history: &[u32], cfg: &DraftConfig) -> Vec<u32> {
    let len = history.len();
    for n in (1..=cfg.ngram.min(len.saturating_sub(1))).rev() {
        let key = &history[len - n..];
        // Most recent occurrence that ends before the suffix itself.
        for start in (0..len - n).rev() {
            if &history[start..start + n] == key {
                let from = start + n;
                let to = (from + cfg.max).min(len);
                if from < to {
                    return history[from..to].to_vec();
                }
            }
        }
    }
    Vec::new()
}

/// Figures of drafting over a generation.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DraftStats {
    /// Passes that verified a draft, tokens drafted, drafted tokens accepted.
    pub passes: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Tokens produced per decode pass (accepted drafts plus the sampled token).
    pub tokens_per_pass: f64,
    /// Every decode pass after the prefill, with or without a draft.
    pub decode_passes: u64,
}

impl Engine {
    /// Logits after each of `tokens` (appended to the sequence), computed as token-by-token
    /// decoding would compute them.
    pub fn forward_decode_rows(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut out = vec![Vec::new(); tokens.len()];
        self.decode_form = true;
        let r = self.forward_rows(tokens, 0, &mut |i, l| out[i] = l.to_vec());
        self.decode_form = false;
        r?;
        Ok(out)
    }

    /// [`Engine::generate`] with prompt-lookup drafting.
    pub fn generate_drafted(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        cfg: &DraftConfig,
        is_end: impl Fn(u32) -> bool,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats, DraftStats), EngineError> {
        if self.plan.kv.select.is_some() {
            return Err(EngineError::Transfer(
                "drafting is not combined with page selection (--kv-select): verified rows attend every page".into(),
            ));
        }
        let start = Instant::now();
        let mut history: Vec<u32> = self.seqs[0].tokens.clone();
        history.extend_from_slice(prompt);
        let mut logits = self.forward(prompt)?;
        let prefill_s = start.elapsed().as_secs_f64();
        let mut out = Vec::new();
        let mut ds = DraftStats::default();
        let mut passes = 0u64;
        let mut ttft_ms = 0.0;
        let decode_start = Instant::now();
        let mut token_ms = Vec::new();
        // The first token from the prompt's logits.
        let mut next = sampler.sample(&logits, &history);
        'steps: loop {
            if out.is_empty() {
                ttft_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            out.push(next);
            history.push(next);
            if !on_token(next) || is_end(next) || out.len() >= n {
                break;
            }
            let t = Instant::now();
            let room = self.max_ctx.saturating_sub(self.n_past() + 1);
            let mut draft = propose(&history, cfg);
            draft.truncate(room.min(n - out.len()).min(cfg.max));
            if draft.is_empty() {
                logits = self.forward(&[next])?;
                passes += 1;
                next = sampler.sample(&logits, &history);
                token_ms.push(t.elapsed().as_secs_f64() * 1e3);
                continue;
            }
            let before = self.n_past();
            let mut rows = vec![next];
            rows.extend_from_slice(&draft);
            let all = self.forward_decode_rows(&rows)?;
            passes += 1;
            ds.passes += 1;
            ds.drafted += draft.len() as u64;
            let mut kept = 0;
            for (i, &d) in draft.iter().enumerate() {
                let (tok, ok) = sampler.speculate(&all[i], &history, d);
                if !ok {
                    // Rejected: `tok` replaces it; drop the drafts' keys and values.
                    self.try_truncate(before + 1 + kept)?;
                    next = tok;
                    token_ms.push(t.elapsed().as_secs_f64() * 1e3);
                    continue 'steps;
                }
                kept += 1;
                ds.accepted += 1;
                out.push(d);
                history.push(d);
                if !on_token(d) || is_end(d) || out.len() >= n {
                    // The last output is not fed (as in plain decoding): keep the keys and
                    // values up to the token before it.
                    self.try_truncate(before + kept)?;
                    break 'steps;
                }
            }
            // Every draft kept: one more token from the last row.
            next = sampler.sample(&all[draft.len()], &history);
            token_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        ds.decode_passes = passes;
        ds.tokens_per_pass = if passes > 0 {
            (out.len() - 1) as f64 / passes as f64
        } else {
            0.0
        };
        let stats = GenStats {
            prompt_tokens: prompt.len(),
            generated_tokens: out.len(),
            prefill_s,
            decode_s,
            ttft_ms,
            prefill_tok_s: prompt.len() as f64 / prefill_s.max(1e-9),
            decode_tok_s: (out.len() - 1) as f64 / decode_s.max(1e-9),
            ms_per_token: decode_s * 1e3 / (out.len() - 1).max(1) as f64,
            peak_device_bytes: self.ctx.budget.peak(),
            token_ms,
            ..Default::default()
        };
        Ok((out, stats, ds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match() {
        let c = DraftConfig { ngram: 3, max: 4 };
        // "a b c d e ... a b c" -> "d e f g"
        let h = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(propose(&h, &c), vec![4, 5, 6, 7]);
        // The most recent occurrence wins, and drafts stop at the end of the history.
        let h = [1, 2, 8, 1, 2, 9, 5, 1, 2];
        assert_eq!(propose(&h, &c), vec![9, 5, 1, 2]);
        // No match of any length.
        assert!(propose(&[1, 2, 3, 4], &c).is_empty());
        assert!(propose(&[], &c).is_empty());
        assert!(propose(&[7], &c).is_empty());
        // A shorter n-gram when the longer one is new.
        let h = [5, 6, 1, 9, 6];
        assert_eq!(propose(&h, &c), vec![1, 9, 6]);
    }

    #[test]
    fn parses_options() {
        assert_eq!(
            "lookup".parse::<DraftConfig>().unwrap(),
            DraftConfig::default()
        );
        assert_eq!(
            "lookup:ngram=2,max=8".parse::<DraftConfig>().unwrap(),
            DraftConfig { ngram: 2, max: 8 }
        );
        for bad in [
            "lookahead",
            "lookup:max=0",
            "lookup:ngram=9",
            "lookup:x=1",
            "lookup:max",
        ] {
            assert!(bad.parse::<DraftConfig>().is_err(), "{bad}");
        }
    }
}
