//! The shim's per-thread state: one block of initial-exec thread-local storage, defined in C
//! (`src/thread.c`), laid out as [`Thread`].
//!
//! Rust's `thread_local!` in a shared library reaches its slots through the dynamic loader's
//! `__tls_get_addr` (the model for a library that may have been `dlopen`ed). A shell's forked
//! child runs no other code of the loader's between its fork and its exec, so the first hook
//! there paid a page fault for that function alone (2-3 us on the development machine), and
//! one more for libc's `__errno_location`, which the shim's errno handling called. The shim
//! is loaded with the program (`LD_PRELOAD`), so its state can sit in the static block the
//! loader lays out for every thread, at a fixed distance from the thread pointer, as libc's
//! own `errno` does. Stable Rust cannot choose that model; C can, so the block is C's and its
//! layout this module's.
//!
//! Every field is valid as all-zero bytes (how each thread's block starts) and has no
//! destructor: the state lives at one address for the thread's whole life, is usable in a
//! signal handler and while the thread exits, and in a `vfork` child is its parent thread's.
//!
//! What this cannot do: be loaded by `dlopen` into a process whose static TLS block has no
//! room left for it (glibc keeps 512 bytes spare for such libraries, this block takes 128;
//! `dlopen` then fails with "cannot allocate memory in static TLS block"). The shim is meant
//! to be preloaded, and nothing loads it otherwise.

use std::cell::Cell;
use std::ffi::c_int;

/// The shim's state in each thread. Each field belongs to the module named in its comment.
#[repr(C)]
pub struct Thread {
    /// The thread is inside the shim (`guard`).
    pub busy: Cell<bool>,
    /// Allocations go to the system allocator, not the arena (`alloc::persistent`).
    pub persistent: Cell<bool>,
    /// Allocations go to the permanent region (`alloc::permanent`).
    pub permanent: Cell<bool>,
    /// A directory path may lead elsewhere after the hook's real call (`ops::caller`).
    pub names_after: Cell<bool>,
    /// Where errno lives in this thread, once asked of libc (`guard::errno`).
    pub errno_at: Cell<*mut c_int>,
    /// The thread's arena (`alloc`).
    pub arena: Cell<crate::alloc::Arena>,
    /// The cookie of the pass the thread holds, else 0 (`kernel::with_pass`).
    pub cookie: Cell<u64>,
    /// A spawn pass's cookie and `argv` (`kernel::SpawnPass`).
    pub spawn_cookie: Cell<[u64; 2]>,
    /// The environment block an exec of this thread runs with (`exec::exec_with_env`).
    pub left_behind: Cell<*mut crate::exec::EnvBlock>,
}

/// The size of the C block (`AETHER_JOURNAL_THREAD_BYTES` in `src/thread.c`).
const BYTES: usize = 128;
const _: () = assert!(std::mem::size_of::<Thread>() <= BYTES && std::mem::align_of::<Thread>() <= 16);

unsafe extern "C" {
    /// This thread's block (`src/thread.c`).
    fn aether_journal_thread() -> *mut u8;
}

/// This thread's state.
#[inline]
pub fn here() -> &'static Thread {
    // SAFETY: the C function returns this thread's block, BYTES bytes aligned to 16 (at least
    // Thread's size and alignment, checked above), alive as long as the thread, all zeroes
    // when it starts, which is a valid Thread. Thread is not Sync, so the reference cannot
    // leave the thread; all its fields are Cells, so shared references are all anyone takes.
    unsafe { &*aether_journal_thread().cast::<Thread>() }
}

/// One field of [`Thread`], used as a `thread_local!` key is (`KEY.with(|cell| ...)`).
pub struct Local<T: 'static>(fn(&Thread) -> &Cell<T>);

impl<T> Local<T> {
    /// The field `field` picks.
    pub const fn new(field: fn(&Thread) -> &Cell<T>) -> Self {
        Local(field)
    }

    /// Runs `f` with this thread's field.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&Cell<T>) -> R) -> R {
        f((self.0)(here()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_state_starting_at_zero() {
        here().cookie.set(7);
        let other = std::thread::spawn(|| (here().cookie.get(), here() as *const Thread as usize)).join().unwrap();
        assert_eq!(other.0, 0, "a new thread starts with zeroes");
        assert_ne!(other.1, here() as *const Thread as usize);
        assert_eq!(here().cookie.get(), 7);
    }
}
