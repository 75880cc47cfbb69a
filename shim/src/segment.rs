//! Journal segments: once a process has journaled [`WRITES_FIRST`] records through `write(2)`
//! on the shared journal, it copies the rest into files of its own under
//! `<session>/segments/`, each preallocated with `fallocate` and mapped shared. A record then
//! costs a copy into memory instead of a system call that takes the journal's inode lock and
//! moves its size and times (about 3 us per record on ext4 here: most of what the shim adds
//! to `tar x`). A process that journals no more than that (a compiler, most shell commands)
//! never makes a segment.
//!
//! A copied record is in the page cache, not in the process, so it survives the process's
//! death exactly as a written one does (and a machine crash exactly as badly: neither is
//! synced without `AETHER_JOURNAL_SYNC=1`, under which segments are not used at all). Each
//! record's final LF is stored after the rest of it, so a reader that finds the LF has the
//! whole line; see `journal` in the core library for how segments are read.
//!
//! Lock-free, like the rest of the shim: threads reserve room with one atomic add; a record
//! that does not fit, or comes while another thread is mapping the next segment, goes to the
//! journal file instead (records are ordered by `seq`, never by where they are). A filled
//! segment is unmapped once no thread can still be copying into it: every copy is counted in
//! flight from before it loads the current segment until it has finished, and retired
//! segments are unmapped only at a moment that count is zero (otherwise at a later roll), so
//! a process's address space holds its current segment and few others.
//!
//! Which segment is current is kept in a page marked `MADV_WIPEONFORK`: a forked child,
//! whether or not a fork hook of ours saw it made (`syscall(SYS_fork)`, `clone` without
//! `CLONE_VM`), sees it zeroed and never copies into its parent's segment through its copy of
//! the parent's memory, and no record pays a `getpid` to prove it. A child that shares its
//! parent's memory (`vfork`, `posix_spawn`) shares the segment and its atomic cursor too,
//! which is sound.
//!
//! What this module cannot do: protect a process from `SIGBUS` if something outside the
//! session truncates its segment while it is mapped (the session's own processes are refused
//! any change to the store); or work where `fallocate` or `MADV_WIPEONFORK` (Linux 4.14) is
//! not supported: the process then keeps writing to the journal file.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering, fence};

use rustix::fs::{AtFlags, CWD, Mode, OFlags};
use rustix::io::Errno;

/// Size of a process's first segment file (and its mapping). Each next one is twice the size
/// of the one before, up to [`SEGMENT_MAX`]: a process that journals a few dozen records
/// preallocates 16 KiB of store, not a quarter of a megabyte.
pub const SEGMENT_FIRST: usize = 16 * 1024;
/// Size of the largest segments: about what a process's segments add to its resident set
/// (more only while filled ones wait to be unmapped).
pub const SEGMENT_MAX: usize = 256 * 1024;
/// Records a process journals through `write(2)` before it makes a segment.
pub const WRITES_FIRST: u32 = 16;
/// Segments one process image keeps mapped at most (current and retired not yet unmapped);
/// past that, its records go to the journal file.
const MAX_SEGMENTS: u32 = 64;
/// Retired segments waiting to be unmapped.
const RETIRED_SLOTS: usize = 16;
/// Larger records (an exec with a huge command line) go to the journal file.
const LARGEST: usize = SEGMENT_FIRST / 4;

/// One mapped segment.
struct Window {
    base: *mut u8,
    /// Size of the mapping (and of the file).
    len: usize,
    /// Next free byte; may run past `len` (a reservation that did not fit).
    cursor: AtomicUsize,
}

// SAFETY: `base` points into a shared mapping that stays mapped while any thread is counted in
// flight (see IN_FLIGHT); threads write disjoint ranges of it, each reserved with one atomic
// add on `cursor`.
unsafe impl Sync for Window {}
// SAFETY: as above.
unsafe impl Send for Window {}

/// Points into a private page marked `MADV_WIPEONFORK` that holds the current segment's
/// `Window` pointer (see the module docs); null until a process makes its first segment.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static CURRENT: AtomicPtr<AtomicPtr<Window>> = AtomicPtr::new(std::ptr::null_mut());
/// Records this process image sent to the journal file while it had no segment.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.fork"))]
static WRITTEN: AtomicU32 = AtomicU32::new(0);
/// Segments mapped now (current and retired).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static MAPPED: AtomicU32 = AtomicU32::new(0);
/// Segments this process made (each one twice the size of the one before, up to the cap).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.fork"))]
static MADE: AtomicU32 = AtomicU32::new(0);
/// Copies between loading the current segment and finishing with it.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.fork"))]
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Filled segments not yet unmapped (their `Window`s are never freed: a stale pointer to one
/// is only ever compared, never followed, outside a copy counted in flight).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static RETIRED: [AtomicPtr<Window>; RETIRED_SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; RETIRED_SLOTS];
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.fork"))]
static MAPPING: AtomicBool = AtomicBool::new(false);
/// Set when a segment could not be made: the journal file from then on.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static OFF: AtomicBool = AtomicBool::new(false);

/// The slot holding the current segment, made on first use.
fn slot() -> Option<&'static AtomicPtr<Window>> {
    let p = CURRENT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null CURRENT points into a page that is never unmapped; its first
        // word is an AtomicPtr (page-aligned, zero = null).
        return Some(unsafe { &*p });
    }
    // SAFETY: a fresh private anonymous page at an address of the kernel's choosing.
    let page = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            4096,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .ok()?;
    // SAFETY: `page` is the 4096-byte mapping just made.
    if unsafe { rustix::mm::madvise(page, 4096, rustix::mm::Advice::LinuxWipeOnFork) }.is_err() {
        // SAFETY: nobody else has seen `page`.
        let _ = unsafe { rustix::mm::munmap(page, 4096) };
        return None;
    }
    let fresh = page.cast::<AtomicPtr<Window>>();
    match CURRENT.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: as for the first branch.
        Ok(_) => Some(unsafe { &*fresh }),
        Err(winner) => {
            // SAFETY: our page was never shared; the winner's is never unmapped.
            let _ = unsafe { rustix::mm::munmap(page, 4096) };
            // SAFETY: as for the first branch.
            Some(unsafe { &*winner })
        }
    }
}

/// Copies `line` (one encoded record, ending in LF) into this process's segment. `false`: the
/// caller must write it to the journal file instead. `seq` is the record's, naming a new
/// segment when this record opens one. No system call unless a segment is made.
pub fn append(session_dir: &[u8], seq: u64, line: &[u8]) -> bool {
    if line.len() > LARGEST || line.last() != Some(&b'\n') || OFF.load(Ordering::Relaxed) {
        return false;
    }
    let current = CURRENT.load(Ordering::Acquire);
    let mut cur = std::ptr::null_mut();
    if !current.is_null() {
        // SAFETY: a non-null CURRENT points into a page that is never unmapped.
        let slot = unsafe { &*current };
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        cur = slot.load(Ordering::SeqCst);
        // SAFETY: a window loaded while counted in flight stays mapped until the count drops.
        let copied = !cur.is_null() && copy_into(unsafe { &*cur }, line);
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        if copied {
            return true;
        }
    }
    // No segment yet (or a forked child, whose slot the kernel zeroed, starting over).
    if cur.is_null() && WRITTEN.fetch_add(1, Ordering::Relaxed) < WRITES_FIRST {
        return false;
    }
    roll(session_dir, seq, cur, line)
}

/// Makes the next segment (unless another thread is making one, or made one since `cur` was
/// current), retires `cur`, and copies `line` into the new one.
fn roll(session_dir: &[u8], seq: u64, cur: *mut Window, line: &[u8]) -> bool {
    if MAPPING.swap(true, Ordering::Acquire) {
        return false; // another thread is making the next segment
    }
    let Some(slot) = slot() else {
        OFF.store(true, Ordering::Relaxed);
        MAPPING.store(false, Ordering::Release);
        return false;
    };
    if slot.load(Ordering::SeqCst) == cur
        && let Some(fresh) = make(session_dir, seq)
    {
        slot.store(fresh, Ordering::SeqCst);
        if !cur.is_null() {
            retire(cur);
        }
    }
    MAPPING.store(false, Ordering::Release);
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let now = slot.load(Ordering::SeqCst);
    // SAFETY: loaded while counted in flight (see `append`).
    let copied = !now.is_null() && now != cur && copy_into(unsafe { &*now }, line);
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    copied
}

/// Queues a filled segment for unmapping and unmaps every queued one if no copy is in flight.
/// Runs only while MAPPING is held (one thread at a time).
fn retire(old: *mut Window) {
    match RETIRED.iter().find(|r| r.load(Ordering::Relaxed).is_null()) {
        Some(free) => free.store(old, Ordering::Relaxed),
        None => {
            // The queue is full: the mapping stays, released from the resident set only,
            // which a late copy survives (the page faults back in from the file).
            // SAFETY: `old` is a leaked Window whose mapping stays in place.
            let _ = unsafe { rustix::mm::madvise((*old).base.cast(), (*old).len, rustix::mm::Advice::LinuxDontNeed) };
        }
    }
    // A copy that starts after this load of zero loads the slot after the new segment was
    // stored in it (SeqCst), so it can never reach a retired one.
    if IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        return; // a later roll unmaps them
    }
    for r in &RETIRED {
        let w = r.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !w.is_null() {
            // SAFETY: a retired segment no copy can reach (above); its Window is never freed.
            let _ = unsafe { rustix::mm::munmap((*w).base.cast(), (*w).len) };
            MAPPED.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Reserves room for `line` in `w` and copies it there, LF last. The caller is counted in
/// flight (IN_FLIGHT) from before it loaded `w` until this returns.
fn copy_into(w: &Window, line: &[u8]) -> bool {
    let at = w.cursor.fetch_add(line.len(), Ordering::Relaxed);
    if at.checked_add(line.len()).is_none_or(|end| end > w.len) {
        return false;
    }
    let body = line.len() - 1;
    // SAFETY: [at, at + len) lies inside the `w.len`-byte mapping at `base` (checked
    // above), which stays mapped while the caller is counted in flight, and no other thread
    // was given any of it.
    unsafe {
        std::ptr::copy_nonoverlapping(line.as_ptr(), w.base.add(at), body);
        // The LF marks the line complete: it must not be stored before the rest.
        fence(Ordering::Release);
        std::ptr::write_volatile(w.base.add(at + body), b'\n');
    }
    true
}

/// Creates, preallocates and maps a new segment `<dir>/segments/PID-SEQ`.
fn make(session_dir: &[u8], seq: u64) -> Option<*mut Window> {
    if MAPPED.load(Ordering::Relaxed) >= MAX_SEGMENTS {
        OFF.store(true, Ordering::Relaxed);
        return None;
    }
    let pid = rustix::process::getpid().as_raw_nonzero().get();
    let len = (SEGMENT_FIRST << MADE.load(Ordering::Relaxed).min(8)).min(SEGMENT_MAX);
    // The names live in the hook's arena; only the window outlives it, in the permanent region
    // (never malloc: this may run in a signal handler that interrupted the program's malloc).
    let made = (|| {
        let dir = [session_dir, b"/", journal_core::session::SEGMENTS_DIR.as_bytes()].concat();
        let path = [&dir[..], format!("/{pid}-{seq}").as_bytes()].concat();
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let mode = Mode::from_raw_mode(0o600);
        let fd = match crate::kernel::open(CWD, &path, flags, mode) {
            Err(Errno::NOENT) => {
                let _ = crate::kernel::mkdir(CWD, &dir, Mode::from_raw_mode(0o700));
                crate::kernel::open(CWD, &path, flags, mode)
            }
            other => other,
        }
        .ok()?;
        // Blocks allocated now: a copy into the mapping can never meet a full disk (SIGBUS).
        if journal_core::capture::FsCalls::fallocate(
            &crate::kernel::Marked,
            rustix::fd::AsFd::as_fd(&fd),
            0,
            len as u64,
        )
        .is_err()
        {
            let _ = crate::kernel::unlink(CWD, &path, AtFlags::empty());
            return None;
        }
        let base = crate::state::map_shared(rustix::fd::AsFd::as_fd(&fd), len)?;
        let window = Window { base: base.cast(), len, cursor: AtomicUsize::new(0) };
        Some(crate::alloc::permanent(|| Box::into_raw(Box::new(window))))
    })();
    match made {
        Some(w) => {
            MAPPED.fetch_add(1, Ordering::Relaxed);
            MADE.fetch_add(1, Ordering::Relaxed);
            Some(w)
        }
        None => {
            OFF.store(true, Ordering::Relaxed);
            None
        }
    }
}

/// In a forked child (the fork hooks): the kernel has already zeroed the slot; the child
/// starts over with the journal file and makes its own segment if it journals enough, even if
/// the fork caught another thread making one.
pub fn forget_after_fork() {
    WRITTEN.store(0, Ordering::Relaxed);
    MADE.store(0, Ordering::Relaxed);
    MAPPING.store(false, Ordering::Relaxed);
    // Only the forking thread lives on, and it was not copying.
    IN_FLIGHT.store(0, Ordering::Relaxed);
}
