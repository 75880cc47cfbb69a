//! The reentrancy guard and errno handling.
//!
//! Everything the shim does for itself runs inside a [`Guard`]: a thread-local flag that makes
//! any hook entered while it is set go straight to the real function. That is what stops the
//! shim's own I/O (or a libc call it makes) from recursing into its hooks.
//!
//! # Rationale
//! The flag is a `const`-initialised `Cell<bool>` with no destructor, so touching it during
//! thread exit is safe (docs/INTERPOSITION.md, "Thread-local storage"). It is never held across
//! a call that may not return (the `exec` family, `_exit`): in a `vfork` child the parent's
//! thread-local storage is shared, and a flag left set there would silently switch the
//! parent's hooks off (the same section). The guard is therefore dropped before every real
//! call, and re-entered afterwards.
//!
//! Asynchronous signals are held back while the flag is set, but only once the program has
//! installed a handler for one: without a handler no signal can run the program's code in the
//! middle of the shim's, and the two `rt_sigprocmask` calls per change are saved. Handlers are
//! learned from the hooked installers (`sigaction`, `signal` and their aliases, `sigset`, and
//! `syscall(SYS_rt_sigaction)`); a new process image starts with none (exec resets them).
//!
//! What this module cannot do: journal a call made while the flag is set by anything but the
//! shim itself: a synchronous callback, or a handler installed behind the hooks' back (an
//! inline `rt_sigaction` system call, the compat-only `sigvec`) or by another thread in the
//! middle of this one's bookkeeping. Such a call goes straight to the real function and is
//! counted as lost, so no undo claims completeness.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

static BUSY: crate::thread::Local<bool> = crate::thread::Local::new(|t| &t.busy);

/// Whether the program has ever installed a handler for an asynchronous signal. One-way: a
/// handler removed later costs nothing but the masking it keeps switched on.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static ASYNC_HANDLERS: AtomicBool = AtomicBool::new(false);

/// Notes a disposition the program is installing for `sig`: anything but `SIG_DFL`, `SIG_IGN`
/// or `SIG_HOLD` is a handler that may run the program's code at any instruction. Handlers for
/// the synchronous signals are never held back, so they change nothing. Async-signal-safe.
pub fn note_disposition(sig: libc::c_int, disposition: libc::sighandler_t) {
    let handler = !matches!(disposition, libc::SIG_DFL | libc::SIG_IGN | SIG_HOLD);
    // Stored once: a fork child reinstalling its parent's handlers does not copy the page.
    if handler && !SYNCHRONOUS.contains(&sig) && !ASYNC_HANDLERS.load(Ordering::Relaxed) {
        ASYNC_HANDLERS.store(true, Ordering::Release);
    }
}

/// `sigset`'s "block this signal" disposition (not in the libc crate).
const SIG_HOLD: libc::sighandler_t = 2;

/// Whether a guard must hold asynchronous signals back (see the module docs).
fn must_mask() -> bool {
    ASYNC_HANDLERS.load(Ordering::Acquire)
}

/// Proof that the current thread is inside the shim's own work. Once the program has a signal
/// handler, asynchronous signals are held back while it lives: a handler that writes a file
/// then runs just after the shim's bookkeeping instead of in the middle of it, and is journaled
/// like any other call.
pub struct Guard {
    old_mask: Option<KernelSigset>,
}

/// Signals that report a fault in the running code: never held back (blocking them turns a
/// fault into a silent kill).
const SYNCHRONOUS: [libc::c_int; 6] =
    [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];

/// The kernel's signal set (signal `n` is bit `n - 1`), as `rt_sigprocmask` takes it: 64
/// signals on the architectures the shim is built for. libc's `sigset_t` is 1,024 bits, of
/// which its wrappers hand the kernel these first 64.
type KernelSigset = u64;

/// What a guard holds back: every signal but the synchronous ones and the two glibc keeps for
/// itself (`SIGCANCEL`, 32, which cancels threads, and `SIGSETXID`, 33, by which `setuid` and
/// its kin reach every thread), which glibc's `pthread_sigmask` never blocks either.
const HELD_BACK: KernelSigset = {
    let mut set = !0u64;
    let mut rest: &[libc::c_int] = &SYNCHRONOUS;
    while let [sig, tail @ ..] = rest {
        set &= !(1 << (*sig - 1));
        rest = tail;
    }
    set & !(1 << (32 - 1)) & !(1 << (33 - 1))
};

/// `rt_sigprocmask(how, set, old)` on the calling thread, as a raw system call: the guard's
/// masking needs none of libc's signal functions, which every process would otherwise look up
/// while loading the shim (three of its imports). Not a call a supervisor watches: unmarked.
fn sigprocmask(how: libc::c_int, set: Option<&KernelSigset>, old: Option<&mut KernelSigset>) {
    let set = set.map_or(0, |s| s as *const KernelSigset as usize);
    let old = old.map_or(0, |o| o as *mut KernelSigset as usize);
    // SAFETY: rt_sigprocmask reads one kernel sigset at `set` and writes one at `old` (each
    // null or a live u64 of this frame's caller), with their size; it only changes the calling
    // thread's mask. It cannot fail with these arguments.
    unsafe {
        crate::kernel::raw(libc::SYS_rt_sigprocmask, [how as usize, set, old, size_of::<KernelSigset>(), 0], 0);
    }
}

impl Guard {
    /// Enters the guard, or returns `None` when this thread is already inside the shim.
    pub fn enter() -> Option<Guard> {
        Guard::enter_masking(must_mask())
    }

    /// [`Guard::enter`], holding asynchronous signals back or not.
    fn enter_masking(mask: bool) -> Option<Guard> {
        // Already inside the shim (a libc call the shim's own work makes, coming back through a
        // hook): the outer guard holds signals back already if it must, so no system call is
        // needed to say no.
        if busy() {
            return None;
        }
        // Signals first, then the flag: a handler arriving in between must not find the flag
        // set by a hook that has not started its work yet.
        let old_mask = mask.then(|| {
            let mut old: KernelSigset = 0;
            sigprocmask(libc::SIG_BLOCK, Some(&HELD_BACK), Some(&mut old));
            old
        });
        let entered = BUSY.with(|b| !b.replace(true));
        if !entered {
            restore_mask(&old_mask);
            return None;
        }
        // What an earlier hook handed past its guard (an exec plan, a program name) may have
        // been freed since: start the arena over now if nothing in it is live. Without this a
        // loop of spawns, each of whose releases finds the plan still live, never starts over.
        crate::alloc::reset_arena();
        Some(Guard { old_mask })
    }
}

/// Restores a signal mask a guard saved, if it saved one.
fn restore_mask(old_mask: &Option<KernelSigset>) {
    if let Some(old) = old_mask {
        sigprocmask(libc::SIG_SETMASK, Some(old), None);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Everything this hook allocated is normally freed by now: let the arena start over.
        // Still inside the guard: a signal handler's hook arriving while the chunks are being
        // unmapped would otherwise allocate from (or start over) a chunk already gone.
        crate::alloc::reset_arena();
        BUSY.with(|b| b.set(false));
        restore_mask(&self.old_mask);
    }
}

/// Whether this thread is inside the shim's own work.
pub fn busy() -> bool {
    BUSY.with(Cell::get)
}

/// Where the calling thread's errno lives: asked of libc once per thread and kept in the
/// thread's state (a forked child, whose thread is its parent's, keeps its parent thread's
/// answer, which stays right: the child's memory is a copy at the same addresses).
fn errno_at() -> *mut libc::c_int {
    let slot = &crate::thread::here().errno_at;
    let mut at = slot.get();
    if at.is_null() {
        // SAFETY: __errno_location has no preconditions.
        at = unsafe { libc::__errno_location() };
        slot.set(at);
    }
    at
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    // SAFETY: errno_at is the calling thread's errno, valid for the thread's life.
    unsafe { *errno_at() }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: as in `errno`; writing the thread's own errno is what the location is for.
    unsafe { *errno_at() = e }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usr1_blocked() -> bool {
        // SAFETY: reads the calling thread's mask into a local set.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, libc::SIGUSR1) == 1
        }
    }

    #[test]
    fn a_nested_entry_is_refused_and_leaves_signals_held_until_the_outer_guard_ends() {
        assert!(!usr1_blocked());
        let outer = Guard::enter_masking(true).expect("first entry");
        assert!(busy() && usr1_blocked());
        assert!(Guard::enter_masking(true).is_none(), "the shim's own libc calls pass straight through");
        assert!(busy() && usr1_blocked(), "a refused entry changes nothing");
        drop(outer);
        assert!(!busy() && !usr1_blocked());
        let again = Guard::enter_masking(true);
        assert!(again.is_some(), "the next hook enters normally");
    }

    /// The calling thread's mask as the kernel holds it.
    fn kernel_mask() -> KernelSigset {
        let mut cur: KernelSigset = 0;
        sigprocmask(libc::SIG_BLOCK, None, Some(&mut cur));
        cur
    }

    fn has(set: KernelSigset, sig: libc::c_int) -> bool {
        set & (1 << (sig - 1)) != 0
    }

    #[test]
    fn a_guard_holds_back_asynchronous_signals_but_neither_the_synchronous_ones_nor_glibcs_own() {
        let before = kernel_mask();
        let g = Guard::enter_masking(true).expect("entry");
        let held = kernel_mask();
        for sig in [libc::SIGUSR1, libc::SIGTERM, libc::SIGCHLD, libc::SIGALRM, libc::SIGINT, 34, 64] {
            assert!(has(held, sig), "signal {sig} is held back inside the shim");
        }
        for sig in SYNCHRONOUS.into_iter().chain([32, 33]) {
            assert!(!has(held, sig), "signal {sig} is never held back");
        }
        drop(g);
        assert_eq!(kernel_mask(), before, "the mask is the thread's own again");
    }

    #[test]
    fn a_guard_gives_back_the_exact_mask_the_thread_had_signals_it_held_itself_included() {
        // SAFETY: a local set, and the calling (test) thread's own mask.
        unsafe {
            let mut usr2: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut usr2);
            libc::sigaddset(&mut usr2, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &usr2, std::ptr::null_mut());
        }
        let before = kernel_mask();
        assert!(has(before, libc::SIGUSR2) && !has(before, libc::SIGUSR1));
        drop(Guard::enter_masking(true).expect("entry"));
        assert_eq!(kernel_mask(), before, "SIGUSR2 stays held, SIGUSR1 is let through again");
    }

    #[test]
    fn without_a_signal_handler_the_guard_leaves_the_signal_mask_alone() {
        let g = Guard::enter_masking(false).expect("entry");
        assert!(busy() && !usr1_blocked());
        assert!(Guard::enter_masking(false).is_none());
        drop(g);
        assert!(!busy() && !usr1_blocked());
    }

    #[test]
    fn only_a_handler_for_an_asynchronous_signal_switches_masking_on() {
        // The flag is process-wide and one-way: every other test here names its masking.
        for d in [libc::SIG_DFL, libc::SIG_IGN, SIG_HOLD] {
            note_disposition(libc::SIGUSR1, d);
        }
        note_disposition(libc::SIGSEGV, 0x1234);
        assert!(!must_mask(), "no handler for an asynchronous signal yet");
        note_disposition(libc::SIGUSR1, 0x1234);
        assert!(must_mask());
    }
}
