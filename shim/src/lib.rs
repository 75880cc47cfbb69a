//! `libaether_journal.so`: the LD_PRELOAD shim.
//!
//! Only interposition lives here: each hook classifies its call, captures the prior state
//! through the core library (`aether-journal`), calls the real libc function exactly once, and
//! records the outcome. See `hooks/` for the table of hooked symbols and the shape every hook
//! follows, `ops.rs` for what each call journals, and `state/` for the session store.
//!
//! The second rule of the project binds every line here: the hooked program must observe
//! nothing different. Same return values, same errno, nothing on fds 0-2, no panic across FFI,
//! no lock held across `fork`, nothing held across `exec` (it may run in a `vfork` child).
//!
//! What this library cannot do: see into statically linked programs, programs whose
//! environment lost `LD_PRELOAD`, or system calls made without going through libc's exported
//! names (raw `syscall` instructions, io_uring). README.md lists these limits.

// Code that runs inside the program may not panic on its own account: no indexing or slicing
// that can be out of bounds, no unwrapping; each exception is an `#[expect]` with its reason.
#![cfg_attr(not(test), deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::missing_safety_doc)]
// Under `cargo test` nothing is exported (the test binary must not interpose its own libc
// calls), so the hooks look unused.
#![cfg_attr(test, allow(dead_code))]

mod alloc;
mod covered;
mod dircache;
mod exec;
mod execmemo;
mod fdmemo;
mod guard;
mod hooks;
mod kernel;
mod lazymap;
mod once;
mod ops;
mod real;
mod segment;
mod state;
mod tempname;
mod thread;

use std::ffi::{c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use aether_journal_recorder::marks::ShimMarkArgs;
use guard::{Guard, errno, set_errno};

#[global_allocator]
static ALLOCATOR: alloc::ShimAlloc = alloc::ShimAlloc;

/// Runs once when the library is loaded, before the program's `main`: keeps the `AETHER_*`
/// variables of the starting environment (the program may clear it later), silences panic
/// output, and, in the root process of a new session only, creates the session.
///
/// # Rationale
/// Every process pays for each page of this library it touches while starting: a page fault
/// costs 1-3 us on the development machine, about as much as the rest of the constructor.
/// `shim/startup.ld` therefore gathers what starting touches: this function (in
/// `.text.startup`) beside std's argument hook and the fork hooks, in one 64 KiB window of
/// code the kernel maps at once, and the statics written here (`.bss.aether_journal.startup`,
/// with std's panic hook and count) right after the initialised data, on the page the loader
/// has already written.
///
/// # Safety
/// Called by the dynamic loader with the program's `argc`/`argv`.
#[cfg_attr(not(test), unsafe(link_section = ".text.startup.aether_journal"))]
unsafe extern "C" fn shim_init(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    let saved = errno();
    // No guard here: nothing below calls a hooked function (raw system calls, a scan of
    // `environ`, the panic hook), and not touching the guard's thread-local flag, the signal
    // mask or the heap is what keeps loading the library cheap (each page a process touches
    // for the first time is a page fault).
    //
    // No `pthread_atfork` handlers either: registering them wrote libc's pages of handlers in
    // every process (4-5.6 us of a `/bin/true` that never forks). The fork hooks do that work
    // around the real call instead ([`before_fork`], [`after_fork_in_child`]).
    let _ = catch_unwind(|| {
        // Two raw system calls that cannot panic, first: their write maps the start-up data's
        // page writable, so the panic hook's read of it below is no second fault.
        state::adopt_store_after_fork();
        // Never print a panic: fd 2 belongs to the program (docs/INTERPOSITION.md, "The program's
        // descriptors"). Set here, while the process has one thread: set later, a fork by
        // another thread in the middle would leave the child's panic machinery locked. A
        // zero-sized closure: no allocation.
        std::panic::set_hook(Box::new(|_| {}));
        state::capture_early_env();
        state::adopt_mark();
    });
    // Everything else is built on first use: a process that changes nothing (most execs of a
    // build) pays for loading the library and the scan above, not for the configuration. The
    // root of a new session is the exception (it must create the session and export its
    // directory before `main`, so that every descendant joins it), and so is a relative
    // session directory (it names a place under the cwd the process starts in).
    if state::configure_in_constructor()
        && let Some(guard) = Guard::enter()
    {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the loader passes the program's argc/argv.
            let args = alloc::persistent(|| unsafe { state::collect_argv(argc, argv) });
            alloc::persistent(|| state::init_from_ctor(args));
        }));
        drop(guard);
    }
    set_errno(saved);
}

/// Before a `fork` (the fork hooks, before the real call): the child inherits this process's
/// store rather than opening its own, and the real exec functions already looked up. Under
/// the guard, with errno kept; nothing in a `vfork` child or while this thread is inside the
/// shim already.
#[cfg_attr(not(test), unsafe(link_section = ".text.startup.aether_journal.fork"))]
#[inline(never)]
pub(crate) fn before_fork() {
    state::open_store_before_fork();
    hooks::resolve_before_fork();
}

/// In a forked child (the fork hooks, after the real call returned 0 in it): it owns its
/// copies of the store's descriptors now, its parent's journal segment is not its own, and
/// datagram destinations are journaled once per *process*. Only stores into atomics and two
/// raw system calls (its ids): no errno, no lock, nothing a freshly forked child of a
/// threaded process cannot do. Beside the constructor's code and the fork hooks
/// (`shim/startup.ld`): a fork child faults in every 64 KiB window of code it runs again, and
/// returns from the real fork into that one. Never inlined: one copy for the five hooks, and a
/// name `bench/hot_text.py` finds a forked child by.
#[cfg_attr(not(test), unsafe(link_section = ".text.startup.aether_journal.fork"))]
#[inline(never)]
pub(crate) fn after_fork_in_child() {
    state::adopt_store_after_fork();
    segment::forget_after_fork();
    ops::forget_destinations();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) = shim_init;

/// `aether-journal mark` in a process of the session: appends the mark `args` describes to
/// this process's session (see `aether_journal_recorder::marks`). Returns the mark's record
/// id, or 0 with errno set: `ENOENT` when `args` names another session than this process's
/// (or it has none), `EINVAL` for a name, label or key that is not UTF-8, `EBUSY` when the
/// thread is inside the shim already.
///
/// # Safety
/// `args` points to a [`ShimMarkArgs`] whose ranges are readable for the call (a null
/// `label`, `key` or `held`: none).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn aether_journal_append_mark(args: *const ShimMarkArgs) -> u64 {
    // Checked against the type the caller uses.
    const _: aether_journal_recorder::marks::AppendMarkFn = aether_journal_append_mark;
    let Some(guard) = Guard::enter() else {
        set_errno(libc::EBUSY);
        return 0;
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        if args.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a valid ShimMarkArgs (this function's contract).
        let a = unsafe { &*args };
        let bytes = |p: *const u8, len: usize| -> Option<&[u8]> {
            // SAFETY: the caller's ranges are readable for the call; null means none.
            (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, len) })
        };
        let text = |p, len| -> Result<Option<String>, c_int> {
            bytes(p, len).map(|b| std::str::from_utf8(b).map(str::to_owned).map_err(|_| libc::EINVAL)).transpose()
        };
        let session = bytes(a.session, a.session_len).ok_or(libc::EINVAL)?;
        let name = text(a.name, a.name_len)?.ok_or(libc::EINVAL)?;
        let (label, key) = (text(a.label, a.label_len)?, text(a.key, a.key_len)?);
        let held = bytes(a.held, a.held_len).unwrap_or_default();
        let held =
            held.split(|&c| c == 0).filter(|p| !p.is_empty()).map(|p| journal_core::BPath::new(p.to_vec())).collect();
        let store = state::store().ok_or(libc::ENOENT)?;
        if store.session_canon.as_slice() != session {
            return Err(libc::ENOENT);
        }
        store
            .append_mark(journal_core::record::Op::Mark(Box::new(journal_core::record::MarkOp {
                name,
                label,
                key,
                held,
            })))
            .map_err(|e| e.raw_os_error())
    }))
    .unwrap_or(Err(libc::EIO));
    drop(guard);
    match result {
        Ok(seq) => seq,
        Err(e) => {
            set_errno(e);
            0
        }
    }
}

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

#[cfg(test)]
mod doc_references {
    //! The shim cites measured facts by a document of the repository and a heading
    //! (`docs/INTERPOSITION.md, "Panics"`): each must name a heading that exists.

    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.ends_with("target") && !path.ends_with(".git") {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "toml") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_document_and_heading_the_code_cites_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = Vec::new();
        sources(root, &mut files);
        let mut cited = 0;
        for file in &files {
            // Comment lines joined, so that a citation broken across two lines is still read.
            let text = std::fs::read_to_string(file).unwrap();
            let joined = text
                .lines()
                .map(str::trim_start)
                .filter(|l| l.starts_with("//") || l.starts_with('#') && !l.starts_with("#["))
                .map(|l| l.trim_start_matches(['/', '!', '#']).trim())
                .collect::<Vec<_>>()
                .join(" ");
            for (at, _) in joined.match_indices("docs/") {
                let rest = &joined[at..];
                let Some(doc) = rest.split(|c: char| !(c.is_alphanumeric() || "/._-".contains(c))).next() else {
                    continue;
                };
                let doc = doc.trim_end_matches('.');
                if !doc.ends_with(".md") {
                    continue;
                }
                let body = std::fs::read_to_string(root.join(doc))
                    .unwrap_or_else(|_| panic!("{} cites {doc}, which does not exist", file.display()));
                if let Some(quoted) = rest[doc.len()..].strip_prefix(", \"") {
                    let heading = &quoted[..quoted.find('"').unwrap()];
                    assert!(
                        body.lines().any(|l| l.trim_start_matches('#').trim() == heading && l.starts_with('#')),
                        "{} cites {doc}, \"{heading}\": no such heading",
                        file.display()
                    );
                    cited += 1;
                }
            }
        }
        assert!(cited >= 6, "only {cited} citations with a heading were found: the scan is broken");
    }
}
