//! The reentrancy guard and errno handling.
//!
//! Everything the shim does for itself runs inside a [`Guard`]: a thread-local flag that makes
//! any hook entered while it is set go straight to the real function. That is what stops the
//! shim's own I/O (or a libc call it makes) from recursing into its hooks.
//!
//! # Rationale
//! The flag is a `const`-initialised `Cell<bool>` with no destructor, so touching it during
//! thread exit is safe (INTERPOSITION.md §6.9). It is never held across a call that may not
//! return (the `exec` family, `_exit`): in a `vfork` child the parent's thread-local storage is
//! shared, and a flag left set there would silently switch the parent's hooks off (§6.8). The
//! guard is therefore dropped before every real call, and re-entered afterwards.
//!
//! What this module cannot do: journal a call made while the flag is set by anything but the
//! shim itself (signals are held back, so only a synchronous callback could): such a call goes
//! straight to the real function and is counted as lost, so no undo claims completeness.

use std::cell::Cell;

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Proof that the current thread is inside the shim's own work. Asynchronous signals are
/// held back while it lives: a handler that writes a file then runs just after the shim's
/// bookkeeping instead of in the middle of it, and is journaled like any other call.
pub struct Guard {
    old_mask: libc::sigset_t,
}

/// Signals that report a fault in the running code: never held back (blocking them turns a
/// fault into a silent kill).
const SYNCHRONOUS: [libc::c_int; 6] =
    [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];

impl Guard {
    /// Enters the guard, or returns `None` when this thread is already inside the shim.
    pub fn enter() -> Option<Guard> {
        // Already inside the shim (a libc call the shim's own work makes, coming back through a
        // hook): the outer guard holds signals back already, so no system call is needed to
        // say no. The flag is only ever set while signals are held back.
        if busy() {
            return None;
        }
        // Signals first, then the flag: a handler arriving in between must not find the flag
        // set by a hook that has not started its work yet.
        // SAFETY: plain sigset manipulation on local values; pthread_sigmask only changes the
        // calling thread's mask and is async-signal-safe.
        let old_mask = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            for s in SYNCHRONOUS {
                libc::sigdelset(&mut all, s);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            old
        };
        let entered = BUSY
            .try_with(|b| {
                if b.get() {
                    false
                } else {
                    b.set(true);
                    true
                }
            })
            .unwrap_or(false);
        if !entered {
            // SAFETY: restores the mask saved just above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
            return None;
        }
        Some(Guard { old_mask })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = BUSY.try_with(|b| b.set(false));
        // SAFETY: restores the mask saved by `enter` on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut()) };
        // Everything this hook allocated is normally freed by now: let the arena start over.
        crate::alloc::reset_arena();
    }
}

/// Whether this thread is inside the shim's own work.
pub fn busy() -> bool {
    BUSY.try_with(Cell::get).unwrap_or(false)
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid pointer to the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: as in `errno`; writing the thread's own errno is what the location is for.
    unsafe { *libc::__errno_location() = e }
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
        let outer = Guard::enter().expect("first entry");
        assert!(busy() && usr1_blocked());
        assert!(Guard::enter().is_none(), "the shim's own libc calls pass straight through");
        assert!(busy() && usr1_blocked(), "a refused entry changes nothing");
        drop(outer);
        assert!(!busy() && !usr1_blocked());
        let again = Guard::enter();
        assert!(again.is_some(), "the next hook enters normally");
    }
}
