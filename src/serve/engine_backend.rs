//! [`EngineBackend`]: one engine on one thread running every request's sequence in shared
//! passes (continuous batching).
//!
//! Each pass carries, within the engine's tokens per pass: one row per decoding sequence (its
//! last sampled token, plus its prompt-lookup draft when drafting is on), then prompt chunks of
//! sequences still prefilling (chunked prefill). New requests take a free sequence at the next
//! pass boundary; finished or cancelled ones leave at once. Every row is computed with the
//! decode-form kernels, so a request's tokens are those token-by-token decoding gives, whatever
//! else shares its passes (batch-invariant).
//!
//! Prefix cache: a finished sequence keeps its KV pages until its slot is needed. A new prompt's
//! full pages are keyed by a SHA-256 chain ([`crate::kv::prefix`]); the slot holding the
//! longest matching chain lends its pages (rewound in place when that slot is free, else copied
//! page by page), and only the rest of the prompt is computed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use thiserror::Error;

use super::backend::{Backend, BackendMetrics, Busy, GenEvent, GenRequest};
use super::batcher::Batcher;
use crate::engine::Engine;
use crate::engine::draft::DraftConfig;

/// How an [`EngineBackend`] runs.
#[derive(Debug, Clone)]
pub struct EngineBackendOptions {
    /// Sequences generated at once (the engine must hold this many: `max_seqs`).
    pub parallel: usize,
    /// Requests that may wait for a free sequence; more are refused with [`Busy`] (0: a
    /// request is taken only when a sequence is free).
    pub queue: usize,
    /// Tokens that end a generation (the tokenizer's end-of-generation ids).
    pub end_ids: Vec<u32>,
    /// Reuse cached KV pages of prompts that start alike (the prefix cache).
    pub reuse_prefix: bool,
    /// Prompt-lookup drafting for decoding sequences.
    pub draft: Option<DraftConfig>,
}

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("starting the engine failed: {0}")]
    Start(String),
    #[error("the engine thread could not be started: {0}")]
    Thread(std::io::Error),
    #[error("the backend needs at least one sequence")]
    NoSequences,
    #[error(
        "--parallel {parallel} needs an engine holding {parallel} sequences and at least {parallel} tokens per pass; it holds {seqs} and passes carry {pass}"
    )]
    TooFewSequences {
        parallel: usize,
        seqs: usize,
        pass: usize,
    },
}

pub(super) struct Job {
    pub req: GenRequest,
    pub tx: Sender<GenEvent>,
}

#[derive(Default)]
pub(super) struct Counters {
    pub running: AtomicUsize,
    pub prefill: AtomicU64,
    pub reused: AtomicU64,
    pub generated: AtomicU64,
    pub flash: AtomicU64,
    pub passes: AtomicU64,
    pub drafted: AtomicU64,
    pub accepted: AtomicU64,
}

pub(super) struct Shared {
    pub queue: Mutex<VecDeque<Job>>,
    pub wake: Condvar,
    pub cap: usize,
    pub shutdown: AtomicBool,
    pub counters: Counters,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, VecDeque<Job>> {
        // A thread that panicked mid-push leaves a consistent queue: keep using it.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Serves requests with one engine, batching their sequences.
pub struct EngineBackend {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    max_ctx: usize,
    capacity: usize,
    drafting: bool,
}

impl EngineBackend {
    /// Start the engine thread; it builds its engine with `make_engine()` (on its own thread,
    /// so the engine never moves between threads). Returns once the engine is ready.
    pub fn spawn<F>(opts: EngineBackendOptions, make_engine: F) -> Result<Self, BackendError>
    where
        F: FnOnce() -> Result<Engine, String> + Send + 'static,
    {
        if opts.parallel == 0 {
            return Err(BackendError::NoSequences);
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            cap: opts.queue,
            shutdown: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let (ready_tx, ready_rx) = channel::<Result<usize, BackendError>>();
        let (sh, o) = (shared.clone(), opts.clone());
        let thread = std::thread::Builder::new()
            .name("flashlm-engine".into())
            .spawn(move || {
                let engine = match make_engine() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(BackendError::Start(e)));
                        return;
                    }
                };
                if engine.max_seqs() < o.parallel || engine.pass_tokens() < o.parallel {
                    let _ = ready_tx.send(Err(BackendError::TooFewSequences {
                        parallel: o.parallel,
                        seqs: engine.max_seqs(),
                        pass: engine.pass_tokens(),
                    }));
                    return;
                }
                let _ = ready_tx.send(Ok(engine.max_ctx()));
                drop(ready_tx);
                match Batcher::new(engine, &o, &sh) {
                    Ok(mut b) => b.run(),
                    Err(e) => log::error!("the engine could not open its sequences: {e}"),
                }
            })
            .map_err(BackendError::Thread)?;
        let max_ctx = match ready_rx.recv() {
            Ok(Ok(ctx)) => ctx,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(BackendError::Start(
                    "the engine thread ended while starting".into(),
                ));
            }
        };
        Ok(EngineBackend {
            shared,
            thread: Some(thread),
            max_ctx,
            capacity: opts.parallel,
            drafting: opts.draft.is_some(),
        })
    }

    /// Prompt tokens taken from the prefix cache instead of being computed.
    pub fn reused_tokens(&self) -> u64 {
        self.shared.counters.reused.load(Ordering::Relaxed)
    }

    /// Forward passes run so far.
    pub fn passes(&self) -> u64 {
        self.shared.counters.passes.load(Ordering::Relaxed)
    }
}

impl Backend for EngineBackend {
    fn submit(&self, req: GenRequest) -> Result<Receiver<GenEvent>, Busy> {
        let (tx, rx) = channel();
        {
            let mut q = self.shared.lock();
            // Drop waiting requests whose clients have gone, so they do not hold places.
            q.retain(|j| !j.req.cancel.load(Ordering::Acquire));
            // The engine thread counts a request running under this lock when it takes it,
            // so this is exact: a request is taken when a sequence is free for it or a place
            // in the queue is.
            let running = self.shared.counters.running.load(Ordering::Acquire);
            let free = self.capacity.saturating_sub(running);
            if q.len() >= self.shared.cap.saturating_add(free) {
                return Err(Busy { queued: q.len() });
            }
            q.push_back(Job { req, tx });
        }
        self.shared.wake.notify_one();
        Ok(rx)
    }

    fn metrics(&self) -> BackendMetrics {
        let c = &self.shared.counters;
        let drafted = c.drafted.load(Ordering::Relaxed);
        BackendMetrics {
            queued: self.shared.lock().len(),
            running: c.running.load(Ordering::Acquire),
            capacity: self.capacity,
            prefill_tokens: c.prefill.load(Ordering::Relaxed),
            cached_prompt_tokens: c.reused.load(Ordering::Relaxed),
            passes: c.passes.load(Ordering::Relaxed),
            generated_tokens: c.generated.load(Ordering::Relaxed),
            flash_bytes_read: c.flash.load(Ordering::Relaxed),
            draft_acceptance: if self.drafting {
                Some(c.accepted.load(Ordering::Relaxed) as f64 / drafted.max(1) as f64)
            } else {
                None
            },
        }
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }
}

impl Drop for EngineBackend {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for j in self.shared.lock().drain(..) {
            j.req.cancel.store(true, Ordering::Release);
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
