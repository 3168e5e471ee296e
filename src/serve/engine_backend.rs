//! [`EngineBackend`]: worker threads, each owning an [`Engine`], taking requests from one
//! bounded queue, one request at a time per worker.
//!
//! A worker keeps what its engine has cached: a request whose prompt starts like the previous
//! one (a chat that goes on) prefills only the new part, as `flashlm chat` does.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use thiserror::Error;

use super::backend::{Backend, BackendMetrics, Busy, Finish, GenEvent, GenRequest};
use crate::engine::Engine;
use crate::sampling::Sampler;

/// How an [`EngineBackend`] runs.
#[derive(Debug, Clone)]
pub struct EngineBackendOptions {
    /// Worker threads, each with its own engine: sequences generated at once.
    pub workers: usize,
    /// Requests that may wait for a busy worker; more are refused with [`Busy`] (0: a request
    /// is taken only when a worker is free).
    pub queue: usize,
    /// Tokens that end a generation (the tokenizer's end-of-generation ids).
    pub end_ids: Vec<u32>,
    /// Keep the cached prefix a new prompt shares with the previous one.
    pub reuse_prefix: bool,
}

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("starting engine {worker} failed: {message}")]
    Start { worker: usize, message: String },
    #[error("a worker thread could not be started: {0}")]
    Thread(std::io::Error),
    #[error("the backend needs at least one worker")]
    NoWorkers,
}

struct Job {
    req: GenRequest,
    tx: Sender<GenEvent>,
}

#[derive(Default)]
struct Counters {
    running: AtomicUsize,
    prefill: AtomicU64,
    generated: AtomicU64,
    flash: AtomicU64,
}

struct Shared {
    queue: Mutex<VecDeque<Job>>,
    wake: Condvar,
    cap: usize,
    shutdown: AtomicBool,
    counters: Counters,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Job>> {
        // A worker that panicked mid-push leaves a consistent queue: keep using it.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Serves requests with engines on worker threads.
pub struct EngineBackend {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    max_ctx: usize,
    capacity: usize,
}

/// Bytes the engine has read from flash: weights and KV pages.
fn flash_bytes(e: &Engine) -> u64 {
    e.flash_bytes().saturating_add(e.kv_stats.fetch.flash_bytes)
}

impl EngineBackend {
    /// Start `opts.workers` threads; each builds its engine with `make_engine(worker index)`
    /// (on its own thread, so the engine never moves between threads). Returns once every
    /// engine is ready, or the first error.
    pub fn spawn<F>(opts: EngineBackendOptions, make_engine: F) -> Result<Self, BackendError>
    where
        F: Fn(usize) -> Result<Engine, String> + Send + Sync + 'static,
    {
        if opts.workers == 0 {
            return Err(BackendError::NoWorkers);
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            cap: opts.queue,
            shutdown: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let make_engine = Arc::new(make_engine);
        let (ready_tx, ready_rx) = channel::<Result<usize, String>>();
        let mut backend = EngineBackend {
            shared: shared.clone(),
            workers: Vec::new(),
            max_ctx: usize::MAX,
            capacity: opts.workers,
        };
        for w in 0..opts.workers {
            let (shared, make, ready, opts) = (
                shared.clone(),
                make_engine.clone(),
                ready_tx.clone(),
                opts.clone(),
            );
            let h = std::thread::Builder::new()
                .name(format!("flashlm-engine-{w}"))
                .spawn(move || {
                    let mut engine = match make(w) {
                        Ok(e) => e,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(engine.max_ctx()));
                    drop(ready);
                    worker_loop(&shared, &mut engine, &opts);
                })
                .map_err(BackendError::Thread)?;
            backend.workers.push(h);
        }
        drop(ready_tx);
        for w in 0..opts.workers {
            match ready_rx.recv() {
                Ok(Ok(ctx)) => backend.max_ctx = backend.max_ctx.min(ctx),
                Ok(Err(message)) => return Err(BackendError::Start { worker: w, message }),
                Err(_) => {
                    return Err(BackendError::Start {
                        worker: w,
                        message: "the engine thread ended while starting".into(),
                    });
                }
            }
        }
        Ok(backend)
    }
}

fn worker_loop(shared: &Shared, engine: &mut Engine, opts: &EngineBackendOptions) {
    let c = &shared.counters;
    let mut last_flash = flash_bytes(engine);
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if shared.shutdown.load(Ordering::Acquire) {
                    return;
                }
                if let Some(j) = q.pop_front() {
                    // Counted as running before the queue lock is released, so queued +
                    // running never misses a request.
                    c.running.fetch_add(1, Ordering::AcqRel);
                    break j;
                }
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let (tx, last) = run_job(engine, job, opts, shared, &mut last_flash);
        // Free before answering, so a client that sends its next request as soon as it has
        // this answer finds the worker free.
        {
            let _q = shared.lock();
            c.running.fetch_sub(1, Ordering::AcqRel);
        }
        let _ = tx.send(last);
    }
}

fn run_job(
    engine: &mut Engine,
    job: Job,
    opts: &EngineBackendOptions,
    shared: &Shared,
    last_flash: &mut u64,
) -> (Sender<GenEvent>, GenEvent) {
    let c = &shared.counters;
    let Job { req, tx } = job;
    let cancel = req.cancel.clone();
    if cancel.load(Ordering::Acquire) {
        let done = GenEvent::Done {
            finish: Finish::Cancelled,
        };
        return (tx, done);
    }
    let ids = &req.prompt;
    let max_ctx = engine.max_ctx();
    if ids.is_empty() || ids.len() >= max_ctx {
        let e = GenEvent::Error(format!(
            "the prompt has {} tokens; it must have from 1 to {} (the context holds {max_ctx})",
            ids.len(),
            max_ctx.saturating_sub(1)
        ));
        return (tx, e);
    }
    let common = if opts.reuse_prefix {
        engine
            .cached_tokens()
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1)
    } else {
        0
    };
    engine.truncate(common);
    let new = &ids[common..];
    // The last sampled token is never fed back, so the context holds all of them.
    let max_new = req.max_tokens.min(max_ctx - ids.len());
    c.prefill.fetch_add(new.len() as u64, Ordering::Relaxed);
    let mut sampler = Sampler::new(req.sampling.clone());
    let mut count = 0usize;
    let mut finish = Finish::Length;
    let end_ids = &opts.end_ids;
    let result = engine.generate(
        new,
        max_new,
        &mut sampler,
        |id| end_ids.contains(&id),
        |id| {
            if end_ids.contains(&id) {
                finish = Finish::Stop;
                return false;
            }
            c.generated.fetch_add(1, Ordering::Relaxed);
            count += 1;
            // The backend shutting down ends generations too.
            if cancel.load(Ordering::Acquire)
                || shared.shutdown.load(Ordering::Acquire)
                || tx.send(GenEvent::Token(id)).is_err()
            {
                finish = Finish::Cancelled;
                return false;
            }
            true
        },
    );
    let now = flash_bytes(engine);
    c.flash
        .fetch_add(now.saturating_sub(*last_flash), Ordering::Relaxed);
    *last_flash = now;
    log::debug!(
        "request done: {} prompt tokens ({common} reused), {count} generated",
        ids.len()
    );
    let last = match result {
        Ok(_) => {
            if finish == Finish::Length && cancel.load(Ordering::Acquire) {
                finish = Finish::Cancelled;
            }
            GenEvent::Done { finish }
        }
        Err(e) => {
            // The cache may hold a partial batch: start the next request from scratch.
            engine.reset();
            GenEvent::Error(e.to_string())
        }
    };
    (tx, last)
}

impl Backend for EngineBackend {
    fn submit(&self, req: GenRequest) -> Result<Receiver<GenEvent>, Busy> {
        let (tx, rx) = channel();
        {
            let mut q = self.shared.lock();
            // Drop waiting requests whose clients have gone, so they do not hold places.
            q.retain(|j| !j.req.cancel.load(Ordering::Acquire));
            // Workers count themselves running under this lock, so this is exact: a request
            // is taken when a worker is free for it or a place in the queue is.
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
        BackendMetrics {
            queued: self.shared.lock().len(),
            running: c.running.load(Ordering::Acquire),
            capacity: self.capacity,
            prefill_tokens: c.prefill.load(Ordering::Relaxed),
            generated_tokens: c.generated.load(Ordering::Relaxed),
            flash_bytes_read: c.flash.load(Ordering::Relaxed),
            // The engine decodes one token per step from the model alone: it drafts nothing.
            draft_acceptance: None,
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
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
