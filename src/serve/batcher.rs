//! The pass loop of [`super::EngineBackend`]: admit requests at pass boundaries, build each
//! pass from decode rows, prompt chunks and drafts, and hand out the tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

use super::backend::{Finish, GenEvent};
use super::engine_backend::{EngineBackendOptions, Job, Shared};
use crate::engine::draft::propose;
use crate::engine::{Engine, EngineError};
use crate::kv::prefix::PrefixIndex;
use crate::sampling::Sampler;

/// A request being generated in a sequence slot.
struct Active {
    tx: Sender<GenEvent>,
    cancel: Arc<AtomicBool>,
    prompt: Vec<u32>,
    /// Prompt tokens in the KV cache (computed or reused).
    fed: usize,
    /// Prompt and emitted tokens (the sampler's and the drafter's context).
    history: Vec<u32>,
    /// The last emitted token, not yet in the KV cache (None while prefilling).
    pending: Option<u32>,
    sampler: Sampler,
    emitted: usize,
    max_new: usize,
    /// Admission order (earlier requests prefill first).
    order: u64,
    /// An earlier request (slot, order) whose prompt starts with the same `n` tokens (whole
    /// pages) and has not computed them yet: this one waits for them and copies their pages.
    wait: Option<(usize, u64, usize)>,
}

enum Slot {
    /// Holds nothing.
    Free,
    /// A finished request's tokens and pages, kept for the prefix cache (`used`: when).
    Cached {
        used: u64,
    },
    Busy(Box<Active>),
}

/// What one item of a pass is.
enum Kind {
    /// Prompt tokens; the last chunk wants the logits of its last row.
    Prefill { complete: bool },
    /// The pending token and `drafts` drafted tokens after it.
    Decode { drafts: usize, before: usize },
}

pub(super) struct Batcher {
    engine: Engine,
    opts: EngineBackendOptions,
    shared: Arc<Shared>,
    slots: Vec<Slot>,
    index: PrefixIndex,
    clock: u64,
    last_flash: u64,
}

/// Bytes the engine has read from flash: weights and KV pages.
fn flash_bytes(e: &Engine) -> u64 {
    e.flash_bytes().saturating_add(e.kv_stats.fetch.flash_bytes)
}

impl Batcher {
    pub fn new(
        mut engine: Engine,
        opts: &EngineBackendOptions,
        shared: &Arc<Shared>,
    ) -> Result<Self, EngineError> {
        engine.reset();
        let mut n = 0;
        while engine.new_seq().is_some() {
            n += 1;
        }
        let identity = format!("{:?}", engine.session_identity()?);
        let index = PrefixIndex::new(identity.as_bytes(), engine.plan.kv.page_tokens as usize, n);
        let last_flash = flash_bytes(&engine);
        Ok(Self {
            engine,
            opts: opts.clone(),
            shared: shared.clone(),
            slots: (0..n).map(|_| Slot::Free).collect(),
            index,
            clock: 0,
            last_flash,
        })
    }

    fn busy(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Busy(_)))
            .count()
    }

    pub fn run(&mut self) {
        loop {
            if self.shared.shutdown.load(Ordering::Acquire) {
                for s in 0..self.slots.len() {
                    self.finish(s, Finish::Cancelled);
                }
                return;
            }
            for job in self.take_jobs() {
                self.start(job);
            }
            self.drop_cancelled();
            if self.busy() == 0 {
                let mut q = self.shared.lock();
                while q.is_empty() && !self.shared.shutdown.load(Ordering::Acquire) {
                    q = self.shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                continue;
            }
            self.step();
        }
    }

    /// Jobs for the free sequences, counted as running before the queue lock is released
    /// (so queued + running never misses a request).
    fn take_jobs(&mut self) -> Vec<Job> {
        let free = self.opts.parallel.saturating_sub(self.busy());
        let mut q = self.shared.lock();
        let n = free.min(q.len());
        let jobs: Vec<Job> = q.drain(..n).collect();
        self.shared
            .counters
            .running
            .fetch_add(jobs.len(), Ordering::AcqRel);
        jobs
    }

    /// A request that ends before it gets a slot.
    fn refuse(&self, tx: &Sender<GenEvent>, ev: GenEvent) {
        {
            let _q = self.shared.lock();
            self.shared.counters.running.fetch_sub(1, Ordering::AcqRel);
        }
        let _ = tx.send(ev);
    }

    fn start(&mut self, job: Job) {
        let Job { req, tx } = job;
        if req.cancel.load(Ordering::Acquire) {
            let done = GenEvent::Done {
                finish: Finish::Cancelled,
            };
            return self.refuse(&tx, done);
        }
        let max_ctx = self.engine.max_ctx();
        let n = req.prompt.len();
        if n == 0 || n >= max_ctx {
            let e = GenEvent::Error(format!(
                "the prompt has {n} tokens; it must have from 1 to {} (the context holds {max_ctx})",
                max_ctx.saturating_sub(1)
            ));
            return self.refuse(&tx, e);
        }
        let max_new = req.max_tokens.min(max_ctx - n);
        if max_new == 0 {
            let done = GenEvent::Done {
                finish: Finish::Length,
            };
            return self.refuse(&tx, done);
        }
        self.clock += 1;
        let (slot, fed) = self.place(&req.prompt);
        let wait = self.pending_prefix(&req.prompt, fed);
        let c = &self.shared.counters;
        c.reused.fetch_add(fed as u64, Ordering::Relaxed);
        log::debug!(
            "request {}: slot {slot}, {n} prompt tokens, {fed} from the prefix cache{}",
            self.clock,
            if wait.is_some() {
                ", more to come from an earlier request"
            } else {
                ""
            }
        );
        self.slots[slot] = Slot::Busy(Box::new(Active {
            tx,
            cancel: req.cancel,
            history: req.prompt.clone(),
            prompt: req.prompt,
            fed,
            pending: None,
            sampler: Sampler::new(req.sampling),
            emitted: 0,
            max_new,
            order: self.clock,
            wait,
        }));
    }

    /// An earlier request still prefilling whose prompt shares more whole pages with `prompt`
    /// than the `fed` tokens already placed: (its slot, its order, the shared tokens).
    fn pending_prefix(&self, prompt: &[u32], fed: usize) -> Option<(usize, u64, usize)> {
        if !self.opts.reuse_prefix {
            return None;
        }
        let pt = self.index.page_tokens();
        let usable = &prompt[..prompt.len() - 1];
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(s, slot)| match slot {
                Slot::Busy(a) if a.pending.is_none() => {
                    let common = a
                        .prompt
                        .iter()
                        .zip(usable)
                        .take_while(|(x, y)| x == y)
                        .count();
                    Some((s, a.order, common / pt * pt))
                }
                _ => None,
            })
            .filter(|&(_, _, n)| n > fed)
            .max_by_key(|&(_, order, n)| (n, std::cmp::Reverse(order)))
    }

    /// Slot `s` waits for an earlier request's pages: copy them once computed. False while
    /// they are still coming (the slot sits this pass out).
    fn take_awaited(&mut self, s: usize) -> bool {
        let Slot::Busy(a) = &self.slots[s] else {
            return false;
        };
        let Some((src, order, n)) = a.wait else {
            return true;
        };
        let ready = {
            let have = self.engine.seq_tokens(src as u32);
            have.len() >= n && have[..n] == a.prompt[..n]
        };
        let still_coming =
            matches!(&self.slots[src], Slot::Busy(b) if b.order == order && b.pending.is_none());
        if !ready && still_coming {
            return false;
        }
        let mut fed = a.fed;
        if ready {
            match self.engine.copy_prefix(src as u32, s as u32, n) {
                Ok(()) => {
                    self.shared
                        .counters
                        .reused
                        .fetch_add((n - fed) as u64, Ordering::Relaxed);
                    fed = n;
                }
                Err(e) => {
                    log::warn!("copying a prefix from sequence {src} failed ({e}); computing it");
                    fed = self.rewind(s, 0);
                }
            }
            self.count_flash();
            self.index.set(s, self.engine.seq_tokens(s as u32));
        }
        if let Slot::Busy(a) = &mut self.slots[s] {
            a.fed = fed;
            a.wait = None;
        }
        true
    }

    /// Pick a slot for `prompt` and fill it with the longest cached prefix there is (at most
    /// all but the last prompt token, whose logits are needed): returns the slot and how many
    /// tokens it already holds.
    fn place(&mut self, prompt: &[u32]) -> (usize, usize) {
        let usable = &prompt[..prompt.len() - 1];
        let pt = self.index.page_tokens();
        let matches = if self.opts.reuse_prefix {
            self.index.matches(&self.index.keys(usable))
        } else {
            Vec::new()
        };
        // A finished sequence that starts like the prompt: rewind it in place, keeping every
        // token it shares (to the token: its pages hold exactly these tokens' keys and values).
        let in_place = if self.opts.reuse_prefix {
            (0..self.slots.len())
                .filter(|&s| matches!(self.slots[s], Slot::Cached { .. }))
                .map(|s| {
                    let common = self
                        .engine
                        .seq_tokens(s as u32)
                        .iter()
                        .zip(usable)
                        .take_while(|(a, b)| a == b)
                        .count();
                    (s, common)
                })
                .filter(|&(_, c)| c > 0)
                .max_by_key(|&(s, c)| (c, std::cmp::Reverse(s)))
        } else {
            None
        };
        let copy = matches.first().copied();
        if let Some((s, common)) = in_place
            && copy.is_none_or(|(_, pages)| common >= pages * pt)
        {
            return (s, self.rewind(s, common));
        }
        // Else an empty slot (or the least recently used finished one), and the pages of the
        // best match copied into it.
        let dst = self
            .slots
            .iter()
            .position(|s| matches!(s, Slot::Free))
            .or_else(|| {
                (0..self.slots.len())
                    .filter_map(|i| match self.slots[i] {
                        Slot::Cached { used } => Some((used, i)),
                        _ => None,
                    })
                    .min()
                    .map(|(_, i)| i)
            })
            .unwrap_or(0);
        let mut fed = self.rewind(dst, 0);
        if let Some((src, pages)) = copy
            && src != dst
        {
            match self.engine.copy_prefix(src as u32, dst as u32, pages * pt) {
                Ok(()) => fed = pages * pt,
                Err(e) => {
                    log::warn!("copying a cached prefix failed ({e}); computing it");
                    fed = self.rewind(dst, 0);
                }
            }
            self.count_flash();
        }
        self.index.set(dst, self.engine.seq_tokens(dst as u32));
        (dst, fed)
    }

    /// Rewind slot `s` to `n` tokens; returns the tokens it holds after (0 when rewinding
    /// failed and the slot was emptied).
    fn rewind(&mut self, s: usize, n: usize) -> usize {
        let held = match self.engine.truncate_seq(s as u32, n) {
            Ok(()) => n.min(self.engine.seq_tokens(s as u32).len()),
            Err(e) => {
                log::warn!("rewinding sequence {s} failed ({e}); emptying it");
                let _ = self.engine.truncate_seq(s as u32, 0);
                0
            }
        };
        self.index.set(s, self.engine.seq_tokens(s as u32));
        held
    }

    fn count_flash(&mut self) {
        let now = flash_bytes(&self.engine);
        self.shared
            .counters
            .flash
            .fetch_add(now.saturating_sub(self.last_flash), Ordering::Relaxed);
        self.last_flash = now;
    }

    fn drop_cancelled(&mut self) {
        let shutdown = self.shared.shutdown.load(Ordering::Acquire);
        for s in 0..self.slots.len() {
            if let Slot::Busy(a) = &self.slots[s]
                && (shutdown || a.cancel.load(Ordering::Acquire))
            {
                self.finish(s, Finish::Cancelled);
            }
        }
    }

    /// End the request in slot `s` (its sequence stays cached for later prompts).
    fn finish(&mut self, s: usize, finish: Finish) {
        if !matches!(self.slots[s], Slot::Busy(_)) {
            return;
        }
        let Slot::Busy(a) =
            std::mem::replace(&mut self.slots[s], Slot::Cached { used: self.clock })
        else {
            return;
        };
        // Free before answering, so a client that sends its next request as soon as it has
        // this answer finds the sequence free.
        {
            let _q = self.shared.lock();
            self.shared.counters.running.fetch_sub(1, Ordering::AcqRel);
        }
        self.index.set(s, self.engine.seq_tokens(s as u32));
        let _ = a.tx.send(GenEvent::Done { finish });
    }

    /// End the request in slot `s` with an error and empty its sequence.
    fn fail(&mut self, s: usize, message: &str) {
        if !matches!(self.slots[s], Slot::Busy(_)) {
            return;
        }
        let Slot::Busy(a) = std::mem::replace(&mut self.slots[s], Slot::Free) else {
            return;
        };
        {
            let _q = self.shared.lock();
            self.shared.counters.running.fetch_sub(1, Ordering::AcqRel);
        }
        let _ = self.engine.truncate_seq(s as u32, 0);
        self.index.clear(s);
        let _ = a.tx.send(GenEvent::Error(message.to_string()));
    }

    /// Hand out token `tok` of slot `s`; false when the request ended with it.
    fn emit(&mut self, s: usize, tok: u32) -> bool {
        let Slot::Busy(a) = &mut self.slots[s] else {
            return false;
        };
        if self.opts.end_ids.contains(&tok) {
            self.finish(s, Finish::Stop);
            return false;
        }
        self.shared
            .counters
            .generated
            .fetch_add(1, Ordering::Relaxed);
        a.emitted += 1;
        a.history.push(tok);
        a.pending = Some(tok);
        if a.cancel.load(Ordering::Acquire) || a.tx.send(GenEvent::Token(tok)).is_err() {
            self.finish(s, Finish::Cancelled);
            return false;
        }
        if a.emitted >= a.max_new {
            self.finish(s, Finish::Length);
            return false;
        }
        true
    }

    /// One pass: a row per decoding sequence, prompt chunks (earliest request first), then
    /// drafts, within the engine's tokens per pass.
    fn step(&mut self) {
        let budget = self.engine.pass_tokens();
        let max_ctx = self.engine.max_ctx();
        let mut items: Vec<(usize, Vec<u32>, usize, Kind)> = Vec::new();
        let mut used = 0;
        for (s, slot) in self.slots.iter().enumerate() {
            if let Slot::Busy(a) = slot
                && let Some(p) = a.pending
            {
                let before = self.engine.seq_tokens(s as u32).len();
                items.push((s, vec![p], 1, Kind::Decode { drafts: 0, before }));
                used += 1;
            }
        }
        let mut prefilling: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(s, slot)| match slot {
                Slot::Busy(a) if a.pending.is_none() => Some((a.order, s)),
                _ => None,
            })
            .collect();
        prefilling.sort();
        for (_, s) in prefilling {
            if !self.take_awaited(s) {
                continue;
            }
            let Slot::Busy(a) = &self.slots[s] else {
                continue;
            };
            let n = (a.prompt.len() - a.fed).min(budget.saturating_sub(used));
            if n == 0 {
                break;
            }
            let complete = a.fed + n == a.prompt.len();
            let chunk = a.prompt[a.fed..a.fed + n].to_vec();
            items.push((s, chunk, usize::from(complete), Kind::Prefill { complete }));
            used += n;
        }
        if let Some(cfg) = self.opts.draft {
            for (s, toks, rows, kind) in items.iter_mut() {
                let (Kind::Decode { drafts, before }, Slot::Busy(a)) = (kind, &self.slots[*s])
                else {
                    continue;
                };
                let room = max_ctx
                    .saturating_sub(*before + 1)
                    .min(a.max_new - a.emitted)
                    .min(budget.saturating_sub(used));
                let mut d = propose(&a.history, &cfg);
                d.truncate(room);
                used += d.len();
                *drafts = d.len();
                *rows += d.len();
                toks.extend(d);
            }
        }
        let pass: Vec<(u32, &[u32])> = items
            .iter()
            .map(|(s, t, _, _)| (*s as u32, t.as_slice()))
            .collect();
        let rows: Vec<usize> = items.iter().map(|i| i.2).collect();
        let result = self.engine.forward_batch_rows(&pass, &rows, true);
        self.shared.counters.passes.fetch_add(1, Ordering::Relaxed);
        self.count_flash();
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                let msg = e.to_string();
                log::warn!("a pass failed: {msg}");
                for (s, ..) in &items {
                    self.fail(*s, &msg);
                }
                return;
            }
        };
        for ((s, toks, _, kind), rows) in items.into_iter().zip(logits) {
            match kind {
                Kind::Prefill { complete } => {
                    if let Slot::Busy(a) = &mut self.slots[s] {
                        a.fed += toks.len();
                    }
                    self.shared
                        .counters
                        .prefill
                        .fetch_add(toks.len() as u64, Ordering::Relaxed);
                    self.index.set(s, self.engine.seq_tokens(s as u32));
                    if complete {
                        let tok = match (&mut self.slots[s], rows.first()) {
                            (Slot::Busy(a), Some(l)) => a.sampler.sample(l, &a.history),
                            _ => continue,
                        };
                        self.emit(s, tok);
                    }
                }
                Kind::Decode { drafts, before } => self.decoded(s, &toks, &rows, drafts, before),
            }
        }
    }

    /// Accept drafts in order (the speculative rule), roll back the rejected ones, and emit.
    fn decoded(&mut self, s: usize, toks: &[u32], rows: &[Vec<f32>], drafts: usize, before: usize) {
        let c = &self.shared.counters;
        c.drafted.fetch_add(drafts as u64, Ordering::Relaxed);
        for (i, &d) in toks[1..].iter().enumerate() {
            let (tok, ok) = match (&mut self.slots[s], rows.get(i)) {
                (Slot::Busy(a), Some(l)) => a.sampler.speculate(l, &a.history, d),
                _ => return,
            };
            if !ok {
                // The rows from the rejected draft on leave the cache.
                if let Err(e) = self.engine.truncate_seq(s as u32, before + 1 + i) {
                    return self.fail(s, &e.to_string());
                }
                self.index.set(s, self.engine.seq_tokens(s as u32));
                self.emit(s, tok);
                return;
            }
            self.shared
                .counters
                .accepted
                .fetch_add(1, Ordering::Relaxed);
            if !self.emit(s, d) {
                return;
            }
        }
        self.index.set(s, self.engine.seq_tokens(s as u32));
        let tok = match (&mut self.slots[s], rows.get(drafts)) {
            (Slot::Busy(a), Some(l)) => a.sampler.sample(l, &a.history),
            _ => return,
        };
        self.emit(s, tok);
    }
}
