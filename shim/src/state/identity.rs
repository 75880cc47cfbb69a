//! Which process this is: the pid that owns the store's descriptors (not a `vfork` child, which
//! shares its parent's memory), its parent, the session's root, and the program's arguments.
//!
//! What this cannot do: tell a `vfork` child from its parent without a `getpid` system call
//! ([`owns_memory`]).

use super::config::config;
use journal_core::BPath;
use journal_core::session::{self};
use std::ffi::{OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The pid that owns the store's descriptors: set by the constructor and in every child the
/// fork hooks see made (`crate::after_fork_in_child`). A `vfork` child shares the store's
/// memory but not its descriptor table, and has another pid: it never replaces a descriptor,
/// it opens a one-shot one.
/// Written by every process while starting: in the start-up data (`shim/startup.ld`).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.startup"))]
pub(super) static OWNER_PID: AtomicU32 = AtomicU32::new(0);
/// The owning process's parent, cached with OWNER_PID for records.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.startup"))]
pub(super) static OWNER_PPID: AtomicU32 = AtomicU32::new(0);
/// The thread pointer of the owning process's main thread (see [`thread_pointer`]), set with
/// OWNER_PID: the constructor runs on the main thread, and a forked child's one thread is the
/// one that forked. 0 where it cannot be read.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.startup"))]
static MAIN_THREAD: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's thread pointer, which is unique among a process's live threads, and the
/// same in a `vfork` child as in the parent thread whose memory it runs on: on x86-64 the
/// first word of the thread control block (the TLS ABI makes it point to itself), on AArch64
/// `TPIDR_EL0`. No system call and no libc call (a forked shell's child would fault in the
/// page of `pthread_self`). 0 on other architectures.
fn thread_pointer() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: reads the word at %fs:0, which the x86-64 ELF TLS ABI (variant II) requires
        // every thread's control block to hold, pointing to itself; glibc sets it before any
        // code of the thread runs. Nothing is written; the stack and flags are untouched.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
        };
        tp
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: reads the thread pointer register, readable at EL0; no memory is touched.
        unsafe { std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags)) };
        tp
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        0
    }
}

/// Records that this process owns the store's descriptors and caches its ids and its main
/// thread's pointer. Called only where no memory is shared with another process: in the
/// constructor (a fresh image) and in the child of a real fork, after the fork hook's real call
/// returned 0 there. Never from any other hook, which may run in a `vfork` child sharing its
/// parent's memory.
pub fn adopt_store_after_fork() {
    MAIN_THREAD.store(thread_pointer(), Ordering::Relaxed);
    OWNER_PID.store(rustix::process::getpid().as_raw_nonzero().get() as u32, Ordering::Relaxed);
    OWNER_PPID.store(rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32), Ordering::Relaxed);
}

/// Whether this process owns the memory it runs in: false in a `vfork` child (which shares its
/// parent's memory but has a descriptor table of its own), and where no constructor ran. One
/// `getpid` system call.
pub fn owns_memory() -> bool {
    let owner = OWNER_PID.load(Ordering::Relaxed);
    owner != 0 && owner == rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// Whether the calling thread is its process's main thread (the thread the constructor ran on,
/// or, in a forked child, the one that forked), or a `vfork` child running on that thread's
/// memory. False in any other thread, where no constructor ran, and on architectures whose
/// thread pointer is not read here. No system call.
pub fn on_main_thread() -> bool {
    let main = MAIN_THREAD.load(Ordering::Relaxed);
    main != 0 && main == thread_pointer()
}

/// The session's root process (from its header), read once.
pub(super) fn root_pid() -> Option<u32> {
    #[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
    static ROOT: AtomicU32 = AtomicU32::new(0);
    match ROOT.load(Ordering::Relaxed) {
        0 => {}
        u32::MAX => return None,
        pid => return Some(pid),
    }
    let dir = std::path::Path::new(OsStr::from_bytes(&config().session_dir));
    let pid = std::fs::read(dir.join(session::HEADER_FILE))
        .ok()
        .and_then(|t| aether_journal_recorder::effects::serde_json_root_pid(&t))
        .unwrap_or(u32::MAX);
    ROOT.store(pid, Ordering::Relaxed);
    (pid != u32::MAX).then_some(pid)
}

/// Collects a C `argv` into paths (used by the constructor).
///
/// # Safety
/// `argv` must be null or point to `argc` valid NUL-terminated strings.
pub unsafe fn collect_argv(argc: i32, argv: *const *const c_char) -> Vec<BPath> {
    if argv.is_null() {
        return Vec::new();
    }
    (0..argc.max(0) as usize)
        .filter_map(|i| {
            // SAFETY: i < argc and argv has argc entries (caller's obligation).
            let p = unsafe { *argv.add(i) };
            // SAFETY: each non-null entry is a NUL-terminated string (caller's obligation).
            (!p.is_null()).then(|| BPath::from(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes()))
        })
        .collect()
}
