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
    old_mask: Option<libc::sigset_t>,
}

/// Signals that report a fault in the running code: never held back (blocking them turns a
/// fault into a silent kill).
const SYNCHRONOUS: [libc::c_int; 6] =
    [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];

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
        // SAFETY: plain sigset manipulation on local values; pthread_sigmask only changes the
        // calling thread's mask and is async-signal-safe.
        let old_mask = mask.then(|| unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            for s in SYNCHRONOUS {
                libc::sigdelset(&mut all, s);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
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
fn restore_mask(old_mask: &Option<libc::sigset_t>) {
    if let Some(old) = old_mask {
        // SAFETY: restores a mask saved by `enter_masking` on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
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
