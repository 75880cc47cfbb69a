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
//! What this module cannot do: tell a signal handler that interrupted the shim's bookkeeping
//! from the shim's own recursion. Both see the flag set and go straight to the real function.

use std::cell::Cell;

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Proof that the current thread is inside the shim's own work.
pub struct Guard(());

impl Guard {
    /// Enters the guard, or returns `None` when this thread is already inside the shim (or its
    /// thread-local storage is gone).
    pub fn enter() -> Option<Guard> {
        BUSY.try_with(|b| {
            if b.get() {
                None
            } else {
                b.set(true);
                Some(Guard(()))
            }
        })
        .ok()
        .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = BUSY.try_with(|b| b.set(false));
    }
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
