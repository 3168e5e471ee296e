//! Evaluation of a model's predictions over natural text.
//!
//! [`ppl`] holds the perplexity arithmetic: how a tokenized text is cut into chunks, which
//! positions of a chunk are scored, the negative log-likelihood of one prediction and how the
//! scores add up to a perplexity with its standard error. It needs no GPU and no engine: the
//! caller evaluates each [`Chunk`] from an empty cache and feeds the logits back.
//!
//! The method is llama.cpp's `perplexity` tool's (non-overlapping chunks, only the second half of
//! each chunk scored), so numbers from the two are comparable for the same model and text.

use thiserror::Error;

pub mod ppl;

pub use ppl::{Chunk, PplAccumulator, PplReport, chunks, first_scored, nll, scored_per_chunk};

/// Everything that can be wrong with a perplexity evaluation's input.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EvalError {
    #[error("a context of {ctx} tokens is too small for perplexity: it must be at least {min}")]
    CtxTooSmall { ctx: usize, min: usize },
    #[error(
        "the text has {have} tokens, fewer than the {need} needed for one chunk of {ctx} tokens"
    )]
    TextTooShort {
        have: usize,
        need: usize,
        ctx: usize,
    },
    #[error("asked for 0 chunks: at least one chunk is needed to measure perplexity")]
    NoChunks,
    #[error("logit {index} is {value}, not a finite number")]
    NonFiniteLogit { index: usize, value: f32 },
    #[error("target token {target} is outside the {n_vocab} logits given")]
    TargetOutOfRange { target: u32, n_vocab: usize },
}
