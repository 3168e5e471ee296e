//! Perplexity under the engine: each chunk from an empty cache, the scored half read from the
//! logits of every position.
//!
//! With page selection on, the unscored first half is prefilled in batches and the scored half
//! is fed one token at a time, as generation would see it: page selection applies to single-token
//! steps, so the perplexity shows what selection costs.

use super::ppl::{Chunk, PplAccumulator, PplReport, first_scored};
use crate::engine::{Engine, EngineError};

/// Errors of an engine evaluation.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Eval(#[from] super::EvalError),
}

/// Perplexity of `chunks` under `engine`; `on_chunk(k, acc)` after chunk `k`.
pub fn perplexity(
    engine: &mut Engine,
    chunks: &[Chunk],
    on_chunk: &mut dyn FnMut(usize, &PplAccumulator),
) -> Result<PplReport, ScoreError> {
    let mut acc = PplAccumulator::default();
    let stepwise = engine.plan.kv.select.is_some();
    for (k, chunk) in chunks.iter().enumerate() {
        engine.reset();
        let toks = &chunk.tokens;
        let first = first_scored(toks.len());
        let mut err = None;
        let mut score = |j: usize, logits: &[f32], acc: &mut PplAccumulator| {
            if j >= first
                && j + 1 < toks.len()
                && err.is_none()
                && let Err(e) = acc.add_logits(logits, toks[j + 1])
            {
                err = Some(e);
            }
        };
        if stepwise {
            engine.forward_rows(&toks[..=first], first, &mut |j, l| score(j, l, &mut acc))?;
            for j in first + 1..toks.len() - 1 {
                let l = engine.forward(&toks[j..=j])?;
                score(j, &l, &mut acc);
            }
        } else {
            engine.forward_rows(&toks[..toks.len() - 1], first, &mut |j, l| {
                score(j, l, &mut acc)
            })?;
        }
        if let Some(e) = err {
            return Err(e.into());
        }
        acc.add_chunk();
        on_chunk(k, &acc);
    }
    engine.reset();
    Ok(acc.report())
}
