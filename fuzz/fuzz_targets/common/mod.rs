//! Shared by the fuzz targets.

use std::cell::Cell;

/// Give this thread an alternate signal stack (once per thread), so that a stack overflow in
/// the code under test reaches libFuzzer's SIGSEGV handler, which reports it and saves the
/// input; on the overflowed stack (or on the small alternate stack a Rust thread gets) the
/// handler itself would fault and the process would die with no trace.
pub fn alt_stack() {
    thread_local! {
        static DONE: Cell<bool> = const { Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    const SIZE: usize = 1 << 20;
    let mem = Box::leak(vec![0u8; SIZE].into_boxed_slice());
    let st = libc::stack_t {
        ss_sp: mem.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: SIZE,
    };
    // SAFETY: the stack memory is leaked, so it outlives the thread; the struct is valid.
    unsafe {
        libc::sigaltstack(&st, std::ptr::null_mut());
    }
}
