//! `libaether_journal.so`: the LD_PRELOAD shim.
//!
//! Only interposition lives here: each hook classifies its call, captures the prior state
//! through the core library (`aether-journal`), calls the real libc function exactly once, and
//! records the outcome. See `hooks.rs` for the table of hooked symbols and the shape every hook
//! follows, `ops.rs` for what each call journals, and `state.rs` for the session store.
//!
//! The second rule of the project binds every line here: the hooked program must observe
//! nothing different. Same return values, same errno, nothing on fds 0-2, no panic across FFI,
//! no lock held across `fork`, nothing held across `exec` (it may run in a `vfork` child).
//!
//! What this library cannot do: see into statically linked programs, programs whose
//! environment lost `LD_PRELOAD`, or system calls made without going through libc's exported
//! names (raw `syscall` instructions, io_uring). README.md lists these limits.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
// Under `cargo test` nothing is exported (the test binary must not interpose its own libc
// calls), so the hooks look unused.
#![cfg_attr(test, allow(dead_code))]

mod alloc;
mod covered;
mod dircache;
mod exec;
mod fdmemo;
mod guard;
mod hooks;
mod kernel;
mod ops;
mod real;
mod segment;
mod state;
mod tempname;

use std::ffi::{c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use guard::{Guard, errno, set_errno};

#[global_allocator]
static ALLOCATOR: alloc::ShimAlloc = alloc::ShimAlloc;

/// Runs once when the library is loaded, before the program's `main`: keeps the `AETHER_*`
/// variables of the starting environment (the program may clear it later), silences panic
/// output, and, in the root process of a new session only, creates the session.
///
/// # Safety
/// Called by the dynamic loader with the program's `argc`/`argv`.
unsafe extern "C" fn shim_init(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    let saved = errno();
    // No guard here: nothing below calls a hooked function (raw system calls, a scan of
    // `environ`, pthread_atfork, the panic hook), and not touching the guard's thread-local
    // flag, the signal mask or the heap is what keeps loading the library cheap (each page a
    // process touches for the first time is a page fault).
    let _ = catch_unwind(|| {
        // Never print a panic: fd 2 belongs to the program (INTERPOSITION.md §6.11). Set here,
        // while the process has one thread: set later, a fork by another thread in the middle
        // would leave the child's panic machinery locked. A zero-sized closure: no allocation.
        std::panic::set_hook(Box::new(|_| {}));
        state::capture_early_env();
        state::adopt_mark();
        state::adopt_store_after_fork();
        // SAFETY: registering a handler with no preparation or parent part; the child part
        // only stores into atomics, which is safe in a freshly forked child.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    // Everything else is built on first use: a process that changes nothing (most execs of a
    // build) pays for loading the library and the scan above, not for the configuration. The
    // root of a new session is the exception (it must create the session and export its
    // directory before `main`, so that every descendant joins it), and so is a relative
    // session directory (it names a place under the cwd the process starts in).
    if state::configure_in_constructor() {
        if let Some(guard) = Guard::enter() {
            let _ = catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: the loader passes the program's argc/argv.
                let args = alloc::persistent(|| unsafe { state::collect_argv(argc, argv) });
                alloc::persistent(|| state::init_from_ctor(args));
            }));
            drop(guard);
        }
    }
    set_errno(saved);
}

/// In a forked child: it owns its copies of the store's descriptors now, its parent's
/// journal segment is not its own, and datagram destinations are journaled once per *process*.
extern "C" fn after_fork_in_child() {
    state::adopt_store_after_fork();
    segment::forget_after_fork();
    ops::forget_destinations();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) = shim_init;

/// Self-test for the test suite: the number of hooked symbols that do not resolve to a real
/// definition in the libraries loaded after this one (0 when every hook has its original).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn aether_journal_unresolved_hooks() -> c_int {
    hooks::all_hooks().filter(|(name, real)| real.addr(name).is_null()).count() as c_int
}

/// Self-test: the number of entries in the hook table.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn aether_journal_hook_count() -> c_int {
    hooks::HOOK_COUNT as c_int
}

/// Self-test: the name of hook `i` (null past the end), so that a test can list the table.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn aether_journal_hook_name(i: c_int) -> *const c_char {
    usize::try_from(i).ok().and_then(hooks::hook).map_or(std::ptr::null(), |(name, _)| name.as_ptr())
}
