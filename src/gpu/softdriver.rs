//! Mesa's software rasterizers (lavapipe for Vulkan, llvmpipe for GL): how many worker threads
//! they run.
//!
//! The driver splits each dispatch's workgroups into one chunk per worker thread, and a thread
//! that wakes first takes the next chunk left. With as many workers as CPUs, a CPU that has
//! gone idle between dispatches takes long to wake (on a VM, a halted virtual CPU), and the
//! dispatch runs on one thread meanwhile: a resident decode of the default model on a 2-core VM
//! kept one CPU idle 62% of the time. Twice as many workers split each dispatch into smaller
//! chunks that the awake CPUs take up, and decoded 1.5x as fast there (`flashlm bench threads`
//! measures it). The driver reads the count from `LP_NUM_THREADS` when it starts, so the choice
//! is made before the first GPU context, at program start; a value the user set stands.

/// The environment variable the driver reads.
pub const THREADS_ENV: &str = "LP_NUM_THREADS";
/// The most worker threads the driver runs.
pub const MAX_THREADS: usize = 16;

/// Worker threads for a machine of `cpus` CPUs: twice as many, within the driver's limit.
pub fn default_threads(cpus: usize) -> usize {
    (2 * cpus.max(1)).min(MAX_THREADS)
}

/// The CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// What [`THREADS_ENV`] says now, if it is set to a count.
pub fn threads_set() -> Option<usize> {
    std::env::var(THREADS_ENV).ok()?.trim().parse().ok()
}

/// Give the software rasterizers [`default_threads`] workers unless [`THREADS_ENV`] is set
/// (set to anything, even a value the driver rejects: the user's choice stands). Returns the
/// count it set.
///
/// # Safety
/// It changes the process environment: call it before any other thread runs (at the start of
/// `main`), as [`std::env::set_var`] requires.
pub unsafe fn tune_threads() -> Option<usize> {
    if std::env::var_os(THREADS_ENV).is_some() {
        return None;
    }
    let n = default_threads(cpus());
    // SAFETY: the caller guarantees no other thread reads or writes the environment now.
    unsafe { std::env::set_var(THREADS_ENV, n.to_string()) };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twice_the_cpus_within_the_limit() {
        assert_eq!(default_threads(0), 2);
        assert_eq!(default_threads(1), 2);
        assert_eq!(default_threads(2), 4);
        assert_eq!(default_threads(7), 14);
        assert_eq!(default_threads(8), 16);
        assert_eq!(default_threads(64), 16);
    }
}
