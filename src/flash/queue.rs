//! The transfer queue: one worker thread that runs I/O jobs (read from flash, fill staging
//! memory, queue the copies to the device) in priority order, so the engine thread never
//! blocks on a single chunk; it waits only for the job whose bytes its next submission needs.
//!
//! Jobs run in order of need: each carries the point of the pass its bytes are needed at (a
//! layer ordinal, see [`TransferQueue::submit_at`]), and of the jobs needed at one point the
//! layer's weights come first, then the KV pages it attends ("hot"), then predictive KV
//! prefetches ("cold"). So the KV pages of the layer computing next are read before the
//! weights of a layer after it: weights take priority over the pages of their own layer, never
//! over what the device needs sooner. Jobs of one need and class run in submission order.

use std::collections::BinaryHeap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Job classes, highest priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Weights = 0,
    HotKv = 1,
    ColdKv = 2,
}

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Queued {
    need: u64,
    prio: Priority,
    seq: u64,
    job: Job,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.need, self.prio, self.seq) == (o.need, o.prio, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    // BinaryHeap pops the largest: the soonest need, then the highest priority (lowest
    // value), then the oldest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.need
            .cmp(&self.need)
            .then(o.prio.cmp(&self.prio))
            .then(o.seq.cmp(&self.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Queued>,
    next_seq: u64,
    stop: bool,
    /// Jobs run so far, in the order they ran (priority, sequence number): for tests.
    ran: Vec<(Priority, u64)>,
    record: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

/// A job's result, delivered once.
pub struct Ticket<T> {
    rx: mpsc::Receiver<T>,
}

/// The job was dropped without running (the queue shut down or the job panicked).
#[derive(Debug, thiserror::Error)]
#[error("a transfer job ended without a result")]
pub struct JobLost;

impl<T> Ticket<T> {
    /// Block until the job has run.
    pub fn wait(self) -> Result<T, JobLost> {
        self.rx.recv().map_err(|_| JobLost)
    }
}

/// A priority queue of I/O jobs with one worker thread.
pub struct TransferQueue {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl TransferQueue {
    pub fn new() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name("flashlm-io".into())
            .spawn(move || worker(s))
            .ok();
        Self { shared, worker }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `job` needed after everything with a need stamp ([`Self::submit_at`] with
    /// `u64::MAX`); its result comes back through the ticket.
    pub fn submit<T: Send + 'static>(
        &self,
        prio: Priority,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Ticket<T> {
        self.submit_at(u64::MAX, prio, job)
    }

    /// Queue `job`, whose bytes are needed at point `need` (smaller: sooner; the engine counts
    /// layers across passes), with class `prio` among the jobs of that need. Without a worker
    /// thread (it could not be started) the job runs at once on the caller's thread.
    pub fn submit_at<T: Send + 'static>(
        &self,
        need: u64,
        prio: Priority,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Ticket<T> {
        let (tx, rx) = mpsc::channel();
        let run: Job = Box::new(move || {
            let _ = tx.send(job());
        });
        if self.worker.is_none() {
            run();
            return Ticket { rx };
        }
        let mut g = self.lock();
        let seq = g.next_seq;
        g.next_seq += 1;
        g.heap.push(Queued {
            need,
            prio,
            seq,
            job: run,
        });
        drop(g);
        self.shared.cv.notify_one();
        Ticket { rx }
    }

    /// Wait until every job queued so far has run.
    pub fn drain(&self) -> Result<(), JobLost> {
        // The lowest priority runs after everything queued before it.
        self.submit(Priority::ColdKv, || ()).wait()
    }

    /// Jobs waiting to run.
    pub fn pending(&self) -> usize {
        self.lock().heap.len()
    }

    /// Record the order jobs run in (tests).
    pub fn record_order(&self) {
        self.lock().record = true;
    }

    /// The (priority, submission number) of every job run since recording started.
    pub fn ran(&self) -> Vec<(Priority, u64)> {
        self.lock().ran.clone()
    }
}

impl Default for TransferQueue {
    fn default() -> Self {
        Self::new()
    }
}

fn worker(s: Arc<Shared>) {
    loop {
        let job = {
            let mut g = s.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(q) = g.heap.pop() {
                    if g.record {
                        g.ran.push((q.prio, q.seq));
                    }
                    break Some(q.job);
                }
                if g.stop {
                    break None;
                }
                g = s.cv.wait(g).unwrap_or_else(|p| p.into_inner());
            }
        };
        let Some(job) = job else { return };
        // A panicking job drops its sender: its ticket reports JobLost, the worker goes on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

impl Drop for TransferQueue {
    fn drop(&mut self) {
        {
            let mut g = self.lock();
            g.stop = true;
        }
        self.shared.cv.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_by_priority_then_order() {
        let q = TransferQueue::new();
        q.record_order();
        // Hold the worker so the next jobs queue up behind it.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let first = q.submit(Priority::ColdKv, move || {
            let _ = started_tx.send(());
            let _ = go_rx.recv();
            0
        });
        started_rx.recv().unwrap();
        let a = q.submit(Priority::ColdKv, || 1);
        let b = q.submit(Priority::HotKv, || 2);
        let c = q.submit(Priority::Weights, || 3);
        let d = q.submit(Priority::Weights, || 4);
        go_tx.send(()).unwrap();
        assert_eq!(
            [first.wait(), a.wait(), b.wait(), c.wait(), d.wait()].map(|r| r.unwrap()),
            [0, 1, 2, 3, 4]
        );
        let order: Vec<u64> = q.ran().iter().map(|r| r.1).collect();
        assert_eq!(order, vec![0, 3, 4, 2, 1]);
    }

    #[test]
    fn sooner_needs_run_first_then_by_class() {
        let q = TransferQueue::new();
        q.record_order();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let first = q.submit_at(0, Priority::Weights, move || {
            let _ = started_tx.send(());
            let _ = go_rx.recv();
        });
        started_rx.recv().unwrap();
        // The weights of layer 3 are queued before the pages layer 2 attends: the pages go
        // first. Layer 2's own weights still go before its pages; a drain goes last.
        let t = [
            q.submit_at(3, Priority::Weights, || ()),
            q.submit_at(2, Priority::HotKv, || ()),
            q.submit_at(2, Priority::ColdKv, || ()),
            q.submit_at(2, Priority::Weights, || ()),
            q.submit(Priority::Weights, || ()),
            q.submit_at(4, Priority::ColdKv, || ()),
        ];
        go_tx.send(()).unwrap();
        first.wait().unwrap();
        for tk in t {
            tk.wait().unwrap();
        }
        let order: Vec<u64> = q.ran().iter().map(|r| r.1).collect();
        assert_eq!(order, vec![0, 4, 2, 3, 1, 6, 5]);
    }

    #[test]
    fn a_panicking_job_loses_only_its_ticket() {
        let q = TransferQueue::new();
        let bad = q.submit(Priority::Weights, || -> u32 { panic!("boom") });
        let good = q.submit(Priority::Weights, || 5u32);
        assert!(bad.wait().is_err());
        assert_eq!(good.wait().unwrap(), 5);
    }
}
