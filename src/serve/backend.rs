//! The model side of the server, behind a trait: the HTTP layer queues token requests and reads
//! token events, and never sees the engine.
//!
//! Nothing here assumes that requests run one after another: a backend may run several
//! sequences at once (several engines, or one engine batching sequences per pass), and each
//! request has its own event channel and cancel flag.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Receiver;

use crate::sampling::SamplerParams;

/// One generation: the prompt's token ids and how to continue it.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (the backend may stop earlier at the end of the context).
    pub max_tokens: usize,
    pub sampling: SamplerParams,
    /// Set by the caller to stop the generation; the backend checks it before each token and
    /// frees the sequence as soon as it sees it.
    pub cancel: Arc<AtomicBool>,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model produced an end-of-generation token (not sent as a [`GenEvent::Token`]).
    Stop,
    /// `max_tokens` tokens were generated, or the context is full.
    Length,
    /// The cancel flag was set, or the receiver was dropped.
    Cancelled,
}

/// What a backend sends for a request, in order: tokens, then exactly one `Done` or `Error`.
/// A channel that closes without either means the backend shut down.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    Token(u32),
    Done { finish: Finish },
    Error(String),
}

/// The queue is full: the request was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// Requests waiting when this one was refused.
    pub queued: usize,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.queued == 0 {
            write!(
                f,
                "the server is busy: every sequence is in use; try again later"
            )
        } else {
            write!(
                f,
                "the server is busy: every sequence is in use and {} requests are waiting; try again later",
                self.queued
            )
        }
    }
}

impl std::error::Error for Busy {}

/// Figures a backend reports for `/metrics`. Counters only grow.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendMetrics {
    /// Requests accepted and not yet started.
    pub queued: usize,
    /// Sequences being generated now.
    pub running: usize,
    /// Sequences that can be generated at once.
    pub capacity: usize,
    /// Prompt tokens run through the model (a reused cached prefix is not counted).
    pub prefill_tokens: u64,
    /// Prompt tokens whose KV pages came from the prefix cache instead.
    pub cached_prompt_tokens: u64,
    /// Forward passes run (each serves every sequence in it).
    pub passes: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Bytes read from flash: model weights and KV pages.
    pub flash_bytes_read: u64,
    /// Share of drafted tokens that were accepted, when the backend decodes speculatively;
    /// `None` when it does not draft (there is no ratio to report).
    pub draft_acceptance: Option<f64>,
}

/// A model that serves token requests.
pub trait Backend: Send + Sync + 'static {
    /// Queue a request; tokens arrive on the channel. Err(Busy) when the queue is full.
    fn submit(&self, req: GenRequest) -> Result<Receiver<GenEvent>, Busy>;
    /// Queue length, running sequences, tokens, flash bytes, draft acceptance.
    fn metrics(&self) -> BackendMetrics;
    /// Context length in tokens: a prompt and its completion together fit in it.
    fn max_ctx(&self) -> usize;
}
