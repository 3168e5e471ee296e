//! Reader threads kept for the life of a file: a read's pieces go to threads that are already
//! running instead of threads spawned for that read. Spawning and joining three threads took
//! about 0.2 ms on a 2-core VM with the device busy, against about 3 ms for a 3 MB layer read,
//! and a streamed layer is one such read (several per token).
//!
//! [`ReaderPool::run`] calls one closure on the caller and on up to `n - 1` pool threads at
//! once and returns when every call has returned: the closure is a loop that takes pieces from
//! a shared queue until none are left. A run started inside another run's closure (a read that
//! splits its pieces again) runs on its own thread only, so that no pool thread ever waits for
//! another.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Task = Box<dyn FnOnce() + Send + 'static>;

thread_local! {
    /// Whether this thread is running a closure of some run (a nested run stays on it).
    static IN_RUN: Cell<bool> = const { Cell::new(false) };
}

/// Threads that wait for work, then call what a run gives them.
pub struct ReaderPool {
    tx: Mutex<Option<mpsc::Sender<Task>>>,
    workers: Vec<JoinHandle<()>>,
}

/// Counts the pool threads of one run still calling its closure; remembers a panic.
struct Latch {
    left: Mutex<(usize, bool)>,
    done: Condvar,
}

impl Latch {
    fn finish(&self, panicked: bool) {
        let mut g = self.left.lock().unwrap_or_else(|p| p.into_inner());
        g.0 = g.0.saturating_sub(1);
        g.1 |= panicked;
        self.done.notify_all();
    }

    /// Wait until every pool thread of the run is done; whether one panicked.
    fn wait(&self) -> bool {
        let mut g = self.left.lock().unwrap_or_else(|p| p.into_inner());
        while g.0 > 0 {
            g = self.done.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.1
    }
}

/// Marks the current thread as inside a run while it lives.
struct InRun(bool);

impl InRun {
    fn enter() -> Self {
        Self(IN_RUN.with(|c| c.replace(true)))
    }
}

impl Drop for InRun {
    fn drop(&mut self) {
        IN_RUN.with(|c| c.set(self.0));
    }
}

impl ReaderPool {
    /// A pool of `threads` threads (0: every run stays on its caller).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx = rx.clone();
            let w = std::thread::Builder::new()
                .name(format!("flashlm-reader-{i}"))
                .spawn(move || {
                    loop {
                        // The lock is held only while waiting for the next task.
                        let task = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match task {
                            Ok(t) => t(),
                            Err(_) => return,
                        }
                    }
                });
            match w {
                Ok(w) => workers.push(w),
                Err(e) => {
                    drop(tx);
                    for w in workers {
                        let _ = w.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Self {
            tx: Mutex::new(Some(tx)),
            workers,
        })
    }

    /// Call `f` on this thread and at the same time on up to `n - 1` pool threads; return
    /// when every call has returned. A panic in any call is raised here once all are done.
    pub fn run(&self, n: usize, f: &(dyn Fn() + Sync)) {
        let nested = IN_RUN.with(|c| c.get());
        let helpers = if nested {
            0
        } else {
            n.saturating_sub(1).min(self.workers.len())
        };
        let _mark = InRun::enter();
        if helpers == 0 {
            f();
            return;
        }
        let latch = Arc::new(Latch {
            left: Mutex::new((helpers, false)),
            done: Condvar::new(),
        });
        // SAFETY: the pool threads use `call` only until they count down `latch`, and this
        // function does not return (nor unwind: the caller's own call is caught below) before
        // `latch.wait()` has seen every one of them do so; a task that is never sent counts
        // itself down at once. So `f` outlives every use of the reference.
        let call =
            unsafe { std::mem::transmute::<&(dyn Fn() + Sync), &'static (dyn Fn() + Sync)>(f) };
        {
            let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..helpers {
                let l = latch.clone();
                let task: Task = Box::new(move || {
                    let _mark = InRun::enter();
                    let r = catch_unwind(AssertUnwindSafe(call));
                    l.finish(r.is_err());
                });
                let sent = match tx.as_ref() {
                    Some(tx) => tx.send(task).is_ok(),
                    None => false,
                };
                if !sent {
                    latch.finish(false);
                }
            }
        }
        let own = catch_unwind(AssertUnwindSafe(f));
        let helper_panicked = latch.wait();
        if let Err(p) = own {
            resume_unwind(p);
        }
        if helper_panicked {
            panic!("a reader thread panicked");
        }
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn a_run_calls_its_closure_on_that_many_threads_at_once() {
        let pool = ReaderPool::new(3).unwrap();
        // Each call waits until all four have started: only four threads at once get there.
        let started = AtomicUsize::new(0);
        let ids = Mutex::new(Vec::new());
        pool.run(4, &|| {
            started.fetch_add(1, Ordering::SeqCst);
            let t = std::time::Instant::now();
            while started.load(Ordering::SeqCst) < 4 {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "not 4 threads at once"
                );
                std::thread::yield_now();
            }
            ids.lock().unwrap().push(std::thread::current().id());
        });
        let mut ids = ids.into_inner().unwrap();
        ids.sort_by_key(|i| format!("{i:?}"));
        ids.dedup();
        assert_eq!(ids.len(), 4);
        // More than the pool holds: the caller and every pool thread.
        let calls = AtomicUsize::new(0);
        pool.run(10, &|| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // One: the caller alone.
        let me = std::thread::current().id();
        pool.run(1, &|| assert_eq!(std::thread::current().id(), me));
    }

    #[test]
    fn borrowed_work_is_shared_and_done_before_the_run_returns() {
        let pool = ReaderPool::new(2).unwrap();
        let mut out = vec![0u64; 1000];
        {
            let items = Mutex::new(out.iter_mut().enumerate());
            pool.run(3, &|| {
                while let Some((i, v)) = {
                    let mut g = items.lock().unwrap();
                    g.next()
                } {
                    *v = (i * i) as u64;
                }
            });
        }
        assert!(out.iter().enumerate().all(|(i, &v)| v == (i * i) as u64));
    }

    #[test]
    fn a_run_inside_a_run_stays_on_its_thread() {
        let pool = Arc::new(ReaderPool::new(2).unwrap());
        let inner = AtomicUsize::new(0);
        pool.run(3, &|| {
            let me = std::thread::current().id();
            pool.run(3, &|| {
                assert_eq!(std::thread::current().id(), me);
                inner.fetch_add(1, Ordering::SeqCst);
            });
        });
        assert_eq!(inner.load(Ordering::SeqCst), 3);
        // The mark is gone after the run: the next one uses the pool again.
        let calls = AtomicUsize::new(0);
        pool.run(3, &|| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_panic_on_a_pool_thread_reaches_the_caller_and_the_pool_goes_on() {
        let pool = ReaderPool::new(2).unwrap();
        let caller = std::thread::current().id();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(3, &|| {
                if std::thread::current().id() != caller {
                    panic!("injected");
                }
            })
        }));
        assert!(r.is_err());
        let calls = AtomicUsize::new(0);
        pool.run(3, &|| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // A pool of none runs on the caller.
        let none = ReaderPool::new(0).unwrap();
        let calls = AtomicUsize::new(0);
        none.run(4, &|| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
