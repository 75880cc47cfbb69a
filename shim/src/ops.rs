//! The shim's side of the journaling logic: the calling process as
//! [`aether_journal_recorder::ops`] sees it ([`Myself`]: its own cwd and descriptors, with
//! the per-process caches that make that cheap), and the work only the process that made a
//! call can do after it (learn the file an open created, undo a capture whose call failed).
//! What each call journals before it runs is the recorder's, shared with the supervisor.
//!
//! What this module cannot do: journal a call whose target it cannot name (see the
//! recorder), or learn the result of a call it did not make.

use std::hash::Hasher;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use aether_journal_recorder::index::Origin;
use aether_journal_recorder::ops::{Base, BaseError, Caller, Journal, birth_of, refuse};
use journal_core::capture::ident_of;
use journal_core::config::Policy;
use journal_core::record::{Endpoint, Ident, Op, UnobservedReason};
use journal_core::resolve::{DirFd, Looked, Target, fd_path, getcwd, split_last};
use rustix::fs::{AtFlags, CWD, FileType, Stat};

pub use aether_journal_recorder::ops::Pending;

use crate::state::Store;

/// The process the shim runs in, as the journaling logic sees a caller.
pub struct Myself;

/// The one [`Myself`].
pub const ME: &Myself = &Myself;

impl Caller for Myself {
    fn sees_results(&self) -> bool {
        true
    }

    fn cwd(&self) -> Result<Base<'_>, BaseError> {
        match getcwd() {
            Ok(cwd) => Ok(Base { fd: DirFd::Borrowed(CWD), path: cwd }),
            Err(e) => Err(BaseError::Failed(format!("getcwd: {e}"))),
        }
    }

    fn dir(&self, fd: i32) -> Result<Base<'_>, BaseError> {
        match dir_path_of_fd(fd) {
            Ok(p) if p.first() == Some(&b'/') => {
                // SAFETY: `fd` is the caller's descriptor, open for the duration of the call that
                // passed it to us; we only use it for the *at calls that resolve this path.
                Ok(Base { fd: DirFd::Borrowed(unsafe { BorrowedFd::borrow_raw(fd) }), path: p })
            }
            Ok(_) => Err(BaseError::WillFail),
            Err(e) if e.raw_os_error() == Some(libc::EBADF) || e.raw_os_error() == Some(libc::ENOENT) => {
                Err(BaseError::WillFail)
            }
            Err(e) => Err(BaseError::Failed(format!("descriptor {fd}: {e}"))),
        }
    }

    fn fd_path(&self, fd: i32) -> std::io::Result<Vec<u8>> {
        fd_path(fd)
    }

    fn fd_xattr(&self, fd: i32, name: &[u8]) -> Result<Option<Vec<u8>>, rustix::io::Errno> {
        // SAFETY: `fd` is the caller's descriptor, open for the duration of its call.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut buf = vec![0u8; 65536];
        match rustix::fs::fgetxattr(bfd, name, &mut buf[..]) {
            Ok(n) => Ok(Some(buf.get(..n).unwrap_or(&buf).to_vec())),
            Err(rustix::io::Errno::NODATA) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn fd_flags(&self, fd: i32) -> Result<u32, rustix::io::Errno> {
        // SAFETY: `fd` is the caller's descriptor, open for the duration of its call.
        rustix::fs::ioctl_getflags(unsafe { BorrowedFd::borrow_raw(fd) }).map(|f| f.bits())
    }

    fn cached_target<J: Journal>(&self, journal: &J, dirfd: i32, path: &[u8], follow: bool) -> Option<Target<'_>> {
        locate_cached(journal, dirfd, path, follow)
    }

    fn resolved(&self, t: &Target<'_>) {
        remember_parent(t);
    }

    fn covered(&self, id: Ident) -> bool {
        crate::covered::contains(id)
    }

    fn cover(&self, id: Ident) {
        crate::covered::insert(id);
    }

    fn exclusive_without_looking(&self) -> bool {
        BIRTH_TIMES.load(Ordering::Relaxed) == 1 && !EXCLUSIVE_FAILED.load(Ordering::Relaxed)
    }

    fn found_name_free(&self) {
        EXCLUSIVE_FAILED.store(false, Ordering::Relaxed);
    }

    fn names_changing(&self) {
        NAMES_AFTER.with(|c| c.set(true));
    }

    fn pid_and_group(&self) -> (u32, i64) {
        (
            rustix::process::getpid().as_raw_nonzero().get() as u32,
            rustix::process::getpgrp().as_raw_nonzero().get() as i64,
        )
    }

    fn first_send_to(&self, peer: &Endpoint) -> bool {
        first_send_to(peer)
    }
}

/// The fast way to name a target whose path has a directory part. A directory path written
/// the same way (absolute, or relative to the working directory) and found within the last
/// [`crate::dircache::TRUST_NS`], with no rename or removal in the session that could have
/// moved it since and no chdir in this process, names it with no system call at all.
/// Otherwise one `stat` of that directory, whose canonical name comes from
/// [`crate::dircache`] if that name still leads to the same directory (checked with a second
/// `stat` unless the path already is that name). The target is then addressed by the path as
/// written, relative to the caller's base, which is exactly what the real call will resolve.
/// `None`: use the full resolver.
fn locate_cached<'a, J: Journal>(journal: &J, dirfd: i32, path: &[u8], follow: bool) -> Option<Target<'a>> {
    if path.last() == Some(&b'/') {
        return None;
    }
    let (dir_part, name) = split_last(path);
    if dir_part.is_empty() || name.is_empty() || name == b"." || name == b".." {
        return None;
    }
    let plain_base = path.first() == Some(&b'/') || dirfd == libc::AT_FDCWD;
    let base = if plain_base {
        CWD
    } else {
        // SAFETY: `dirfd` is the caller's descriptor, open for the duration of the call that
        // passed it to us; we only use it for the *at calls that resolve this path.
        unsafe { BorrowedFd::borrow_raw(dirfd) }
    };
    // Read before anything is looked at: a change told after this makes what is learned
    // below stale at once.
    let gens = plain_base
        .then(|| (journal.counters().names_gen(), crate::dircache::local_gen(), crate::dircache::coarse_now()));
    let remembered = gens.and_then(|(shared, local, now)| crate::dircache::path_get(dir_part, shared, local, now));
    let canonical = match remembered {
        Some(c) => c,
        None => {
            let st = rustix::fs::statat(base, dir_part, AtFlags::empty()).ok().filter(is_dir)?;
            let c = cached_dir_name(ident_of(&st), dir_part)?;
            if let Some((shared, local, now)) = gens {
                crate::dircache::path_put(dir_part, &c, shared, local, now);
            }
            c
        }
    };
    let mut looked = Looked::No;
    if follow {
        // The call follows a final symlink: that is the full resolver's job.
        let fin = rustix::fs::statat(base, path, AtFlags::SYMLINK_NOFOLLOW);
        if fin.is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink) {
            return None;
        }
        looked = Looked::of(fin);
    }
    let abs = journal_core::BPath::new(journal_core::bpath::join(&canonical, name));
    Some(Target { parent: DirFd::Borrowed(base), name: path.to_vec(), abs, looked })
}

/// The canonical path of the directory open as `fd`: from [`crate::dircache`] when the cached
/// name still leads to it (fstat + stat), else read from `/proc/self/fd` and remembered.
fn dir_path_of_fd(fd: i32) -> std::io::Result<Vec<u8>> {
    // SAFETY: `fd` is the caller's descriptor, open for the duration of its call; fstat on a
    // number that is not open fails with EBADF.
    let st = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) })?;
    if !is_dir(&st) {
        return fd_path(fd);
    }
    if let Some(p) = cached_dir_name(ident_of(&st), b"") {
        return Ok(p);
    }
    let p = fd_path(fd)?;
    crate::dircache::put(ident_of(&st), &p);
    Ok(p)
}

fn is_dir(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

/// The canonical name [`crate::dircache`] holds for directory `id`, if that name still leads
/// to it: checked with an `lstat`, unless it is `known`, a name the caller just found to lead
/// there itself.
fn cached_dir_name(id: Ident, known: &[u8]) -> Option<Vec<u8>> {
    let name = crate::dircache::get(id)?;
    if name != known {
        let now = rustix::fs::statat(CWD, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        if ident_of(&now) != id {
            return None;
        }
    }
    Some(name)
}

/// After a full resolution through an opened parent: remember the parent's canonical name.
fn remember_parent(t: &Target<'_>) {
    if let (DirFd::Owned(fd), Some((parent, _))) = (&t.parent, t.abs.split_parent()) {
        if let Ok(st) = rustix::fs::fstat(fd) {
            crate::dircache::put(ident_of(&st), parent);
        }
    }
}

thread_local! {
    /// Set by a hook whose call may change where directory paths lead; taken after the call.
    static NAMES_AFTER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// After the real call of a hook whose work told the session a directory path may lead
/// elsewhere: tells it again, now that the call has taken effect.
pub fn names_changed_after_call() {
    if NAMES_AFTER.with(|c| c.replace(false)) {
        crate::state::names_changed();
    }
}

/// Whether the files this process last created have birth times (`statx` `btime`), which is
/// what lets an exclusive create skip the `lstat` that proves its name absent: 0 not known
/// yet, 1 yes, 2 no. A property of the file system, so a `vfork` child may set it too.
static BIRTH_TIMES: AtomicU8 = AtomicU8::new(0);

/// Set when an exclusive create journaled without looking failed (a lock file someone holds,
/// which a program may retry many times): the next ones look first, and journal nothing while
/// the name is taken, until one finds it free.
static EXCLUSIVE_FAILED: AtomicBool = AtomicBool::new(false);

const SENT_SLOTS: usize = 1024;
static SENT: [AtomicU64; SENT_SLOTS] = [const { AtomicU64::new(0) }; SENT_SLOTS];

fn endpoint_hash(ep: &Endpoint) -> u64 {
    // SipHash with fixed keys: stable for the life of the process, and no allocation.
    let mut h = std::hash::DefaultHasher::new();
    h.write(ep.family.as_bytes());
    h.write(ep.address.as_bytes());
    h.write_u16(ep.port.unwrap_or(0));
    h.finish().max(1)
}

/// Remembers a destination; true the first time this process sends to it. When the table is
/// full every send is journaled (never fewer records than destinations).
fn first_send_to(ep: &Endpoint) -> bool {
    let h = endpoint_hash(ep);
    let start = (h as usize) % SENT_SLOTS;
    for slot in SENT.iter().cycle().skip(start).take(SENT_SLOTS) {
        match slot.compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(existing) if existing == h => return false,
            Err(_) => continue,
        }
    }
    true
}

/// Forgets every destination (in a forked child: "per process").
pub fn forget_destinations() {
    for slot in &SENT {
        slot.store(0, Ordering::Relaxed);
    }
}

/// After a call that created a name we could only learn from its result (the mkstemp
/// family, mkdtemp): it did not exist before, so undo removes it. `template` is the absolute
/// template journaled before the call, which names the directory without a system call and
/// keeps the window in which a killed process leaves an intent nothing completes as short as
/// it can be.
pub fn after_created(store: &Store, call: &str, path: &[u8], template: Option<&journal_core::BPath>, fd: Option<i32>) {
    let Some(abs) = aether_journal_recorder::ops::temp_name_target(store, ME, call, path, template) else { return };
    let created = store.record(call, Op::Change { path: abs, before: journal_core::Before::Absent });
    // Undo removes it whole: later descriptor changes to it need no records, and other
    // processes' rewrites of it no captures (the table is mapped for learn_created).
    let _ = store.born();
    after(store, call, Pending::Created { created, looked: true }, true, 0, fd);
}

/// Before setuid/seteuid/setreuid/setresuid: a switch to a user that cannot write the
/// session store (anyone but its owner and root) leaves this process and its children
/// unobserved. Say so while the store can still be written. Under a supervisor nothing
/// changes: it still sees every call the process makes, whoever it runs as.
pub fn before_uid_change(store: &Store, call: &str, new_euid: u32) -> Pending {
    if crate::state::config().supervised {
        return Pending::Nothing;
    }
    let current = rustix::process::geteuid().as_raw();
    if new_euid == u32::MAX || new_euid == current || new_euid == store.owner_uid || new_euid == 0 {
        return Pending::Nothing;
    }
    let reason = UnobservedReason::CredentialsChanged { uid: new_euid, store_owner: store.owner_uid };
    if store.settings.policy == Policy::Strict {
        return refuse(store, call, format!("{call} to uid {new_euid}: {reason}"), libc::EPERM);
    }
    Pending::Recorded(store.record(call, Op::Unobserved { program: store.prog.clone(), reason }))
}

/// Before io_uring_setup: file operations submitted through the ring bypass every hook. A
/// supervisor sees the call too, and journals it (or refuses it) itself.
pub fn before_io_uring(store: &Store, call: &str) -> Pending {
    if crate::state::config().supervised {
        return Pending::NotJournaled;
    }
    let reason = UnobservedReason::IoUring;
    if store.settings.policy == Policy::Strict {
        return refuse(store, call, format!("{call}: {reason}"), libc::EPERM);
    }
    Pending::Recorded(store.record(call, Op::Unobserved { program: store.prog.clone(), reason }))
}

/// The `stat` of the file behind `fd` when a change through the descriptor must be journaled;
/// `None` when it need not be: the descriptor came from an open that created its file (no
/// system call at all), the file is already journaled whole by this process, or `fd` is not
/// open (the call fails with EBADF). Guard-free: one raw `fstat` (no libc call that could
/// re-enter a hook, errno untouched) and a lock-free lookup. The `before_fd_*` functions take
/// this `stat` instead of asking again.
#[inline]
pub fn uncovered_fd(fd: i32) -> Option<Stat> {
    crate::covered::check_turn();
    if crate::fdmemo::created(fd) {
        return None;
    }
    // SAFETY: `fd` is the caller's descriptor, open for the duration of its call; fstat on a
    // number that is not open fails with EBADF and changes nothing.
    rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok().filter(|st| !crate::covered::contains(ident_of(st)))
}

/// Remembers the file an open returned as covered (raw `statx`, lock-free inserts), and the
/// descriptor as one that came from a creating open, unless this is a `vfork` child: its
/// descriptors are not its parent's, but the memo's memory is.
///
/// The file is also marked born in the session's shared index when this process has mapped
/// it (the open that created the file mapped it under the guard): one raw `statx`, which
/// costs what the `fstat` it replaces did, and lock-free atomic stores.
fn learn_created(store: &Store, fd: Option<i32>, origin: Origin) {
    if let Some(fd) = fd.filter(|&fd| fd >= 0) {
        // SAFETY: the descriptor the real open just returned to the caller.
        let file = unsafe { BorrowedFd::borrow_raw(fd) };
        let Some((ident, btime)) =
            birth_of(file, b"", AtFlags::EMPTY_PATH).map(|(id, b)| (id, Some(b))).or_else(|| {
                // No birth times here: learn the inode only.
                rustix::fs::fstat(file).ok().map(|st| (ident_of(&st), None))
            })
        else {
            return;
        };
        let births = if btime.is_some() { 1 } else { 2 };
        if BIRTH_TIMES.load(Ordering::Relaxed) != births {
            BIRTH_TIMES.store(births, Ordering::Relaxed);
        }
        crate::covered::insert(ident);
        if let (Some(btime), Some(index)) = (btime, store.born_mapped()) {
            index.remember_origin(ident, btime, origin);
        }
        if crate::state::owns_memory() {
            crate::fdmemo::remember(fd);
        }
    }
}

/// The part of [`after`] that needs no guard: a call that succeeded leaves a capture or a record
/// as it is, and a created file is learned with a raw `statx` and lock-free inserts. Returns
/// what is left for [`after`] (under the guard), if anything.
pub fn after_quick(store: &Store, pending: Pending, succeeded: bool, fd: Option<i32>) -> Option<Pending> {
    match pending {
        Pending::Created { created, .. } if succeeded => {
            learn_created(store, fd, Origin::Born(created));
            None
        }
        Pending::BornRewrite { origin, .. } if succeeded => {
            learn_created(store, fd, origin);
            None
        }
        Pending::Created { looked: true, .. } => None,
        Pending::MovedAside { seq, .. } if succeeded => {
            learn_created(store, fd, Origin::Born(seq));
            None
        }
        Pending::Nothing | Pending::NotJournaled | Pending::Refuse(_) => None,
        Pending::Recorded(_) | Pending::Linked { .. } if succeeded => None,
        other => Some(other),
    }
}

/// After the real call: undo what the capture did to the world if the call failed, and learn
/// what it created. `fd` is the descriptor an open returned.
pub fn after(store: &Store, call: &str, pending: Pending, succeeded: bool, errno: i32, fd: Option<i32>) {
    match pending {
        Pending::Created { created, looked } => {
            if succeeded {
                learn_created(store, fd, Origin::Born(created));
            } else if !looked {
                EXCLUSIVE_FAILED.store(true, Ordering::Relaxed);
                store.record(call, Op::CallFailed { of_seq: created, errno });
            }
        }
        Pending::BornRewrite { seq, origin } => {
            if succeeded {
                learn_created(store, fd, origin);
            } else {
                store.record(call, Op::CallFailed { of_seq: seq, errno });
            }
        }
        Pending::MovedAside { blob, seq, path } => {
            if succeeded {
                learn_created(store, fd, Origin::Born(seq));
            } else if store
                .blobs
                .with(|b| crate::kernel::rename(b, blob.as_bytes(), CWD, path.as_bytes()))
                .is_some_and(|r| r.is_ok())
            {
                // The original is back where it was: the step changed nothing.
                store.record(call, Op::CallFailed { of_seq: seq, errno });
            }
        }
        Pending::Nothing | Pending::NotJournaled | Pending::Refuse(_) => {}
        Pending::Connect(peer) => aether_journal_recorder::effects::after_connect(store, call, peer, succeeded, errno),
        Pending::Recorded(seq) => {
            if !succeeded {
                store.record(call, Op::CallFailed { of_seq: seq, errno });
            }
        }
        Pending::Linked { blob, seq } => {
            if !succeeded {
                store.record(call, Op::CallFailed { of_seq: seq, errno });
                let _ = store.blobs.with(|fd| crate::kernel::unlink(fd, blob.as_bytes(), AtFlags::empty()));
            }
        }
    }
}
