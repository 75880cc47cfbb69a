//! The logic half of every hook: classify the call, capture the prior state through the core
//! library, and journal it. Plain Rust on byte paths and raw descriptor numbers; the FFI half
//! (`hooks.rs`) turns C arguments into these and calls the real function.
//!
//! Each `before_*` function runs before the real call and returns a [`Pending`] that the
//! wrapper hands to [`after`] with the call's result. Nothing here ever decides whether the
//! real call runs: it always does, exactly once.
//!
//! What this module cannot do: journal a call whose target it cannot name (resolution failed
//! for a reason the real call will not share). That case is journaled as irreversible with the
//! lexical path and the error, never skipped.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use journal::BPath;
use journal::capture::{Capturer, Intent, ident_of, meta_before, xattr_value};
use journal::record::{Before, Bytes, CaptureHow, MetaKind, Node, Op, Reason, Snapshot, UnobservedReason, XattrBefore};
use journal::resolve::{DirFd, Target, Unresolved, fd_path, getcwd, resolve, split_last};
use rustix::fs::{AtFlags, CWD, FileType, Stat, StatxFlags};
use rustix::io::Errno;

use journal::config::Policy;

use crate::index::Origin;
use crate::state::Store;

/// What a hook must do once the real call has returned.
pub enum Pending {
    /// Nothing: the call needs no record (or its record is written).
    Nothing,
    /// Nothing, because the shim could not journal the call (a name it cannot read): the call
    /// is made as the program made it, so that a supervisor, if one watches, journals it.
    NotJournaled,
    /// A blob was hard-linked to a file the call (record `seq`) was about to remove. If the call
    /// fails, the link is dropped again (so that the file's link count is what it would have
    /// been) and a `call_failed` record tells undo that the step changed nothing.
    Linked {
        /// The blob.
        blob: String,
        /// The record naming it.
        seq: u64,
    },
    /// A record whose call may fail in a way undo cannot see: if it does, a `call_failed`
    /// record says so.
    Recorded(u64),
    /// The strict policy refuses the call: it must not run, and fails with this errno. The
    /// refusal is already journaled.
    Refuse(i32),
    /// A connect: its endpoint is journaled with the result once the call returns.
    Connect(journal::record::Endpoint),
    /// An open that may create a file recorded `Absent` or `Exclusive` by record `created`:
    /// once it returns a descriptor, the new inode is remembered as covered, and as born in
    /// the session.
    Created {
        /// The record of the creation.
        created: u64,
        /// Whether the name was seen absent before the call (`Absent`). If not (`Exclusive`),
        /// a call that fails gets a `call_failed` record: it changed nothing.
        looked: bool,
    },
    /// A rewrite (an open for writing, truncate, ftruncate) of a file the session created or
    /// already kept whole (`origin`), journaled by record `seq` without a capture: an open that
    /// succeeds is learned like a creation; a call that fails gets a `call_failed` record.
    BornRewrite {
        /// The record of this call.
        seq: u64,
        /// Why the file needs no capture.
        origin: Origin,
    },
    /// An `O_TRUNC` open whose file was moved into the store (record `seq`, blob `blob`) and
    /// replaced by an empty twin. If the call fails, the original goes back to `path` and a
    /// `call_failed` record says the step changed nothing; if it succeeds, the twin it opened
    /// is covered (undo puts the original inode back over it).
    MovedAside {
        /// The blob holding the original inode.
        blob: String,
        /// The record naming it.
        seq: u64,
        /// Where it came from.
        path: BPath,
    },
}

/// Which kinds of node an unlink-like call accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Removes {
    /// unlink, unlinkat without AT_REMOVEDIR.
    NonDir,
    /// rmdir, unlinkat with AT_REMOVEDIR.
    Dir,
    /// remove.
    Either,
}

/// A capturer into the store's `blobs/` (the index only where a copy may be made).
fn capturer<'a>(store: &'a Store, blobs: BorrowedFd<'a>, intent: Intent) -> Capturer<'a> {
    Capturer {
        blobs,
        budget: store.settings.budget,
        counters: &store.counters,
        sync: store.settings.sync,
        index: (intent != Intent::Destroy)
            .then(|| store.index())
            .flatten()
            .map(|i| i as &dyn journal::capture::CaptureIndex),
        calls: &crate::kernel::Marked,
    }
}

/// Captures with the store's `blobs/` descriptor (checked before use).
fn capture(store: &Store, parent: BorrowedFd<'_>, name: &[u8], st: &Stat, intent: Intent) -> Before {
    store.blobs.with(|blobs| capturer(store, blobs, intent).capture_stat(parent, name, st, intent)).unwrap_or_else(
        || Before::Irreversible {
            reason: Reason::CaptureFailed {
                step: "open the session store".into(),
                error: "its blobs directory is gone".into(),
            },
        },
    )
}

/// A resolved target, or why there is none.
enum Resolved<'a> {
    Target(Target<'a>),
    /// The call will fail without touching anything.
    WillFail,
    /// The path is not journaled (/proc, /sys, /dev).
    Excluded,
    /// The path is the session's own store: the call is refused.
    Protected(BPath),
    /// Resolution failed on its own: journal the lexical path as irreversible.
    Unknown(BPath, String),
}

/// Errors from looking at a target that the real call will meet too.
fn call_will_fail(e: Errno) -> bool {
    matches!(e, Errno::NOENT | Errno::NOTDIR | Errno::ACCESS | Errno::LOOP | Errno::NAMETOOLONG | Errno::BADF)
}

/// Resolves `path` relative to `dirfd` as the kernel will for the real call.
fn locate<'a>(store: &Store, dirfd: i32, path: &[u8], follow: bool) -> Resolved<'a> {
    if let Some(t) = locate_cached(store, dirfd, path, follow) {
        return checked(store, t);
    }
    let (base, base_path) = if path.first() == Some(&b'/') {
        (CWD, b"/".to_vec())
    } else if dirfd == libc::AT_FDCWD {
        match getcwd() {
            Ok(cwd) => (CWD, cwd),
            Err(e) => return Resolved::Unknown(BPath::new(path.to_vec()), format!("getcwd: {e}")),
        }
    } else {
        match dir_path_of_fd(dirfd) {
            // SAFETY: `dirfd` is the caller's descriptor, open for the duration of the call
            // that passed it to us; we only use it for the *at calls that resolve this path.
            Ok(p) if p.first() == Some(&b'/') => (unsafe { BorrowedFd::borrow_raw(dirfd) }, p),
            Ok(_) => return Resolved::WillFail,
            Err(e) if e.raw_os_error() == Some(libc::EBADF) || e.raw_os_error() == Some(libc::ENOENT) => {
                return Resolved::WillFail;
            }
            Err(e) => return Resolved::Unknown(BPath::new(path.to_vec()), format!("descriptor {dirfd}: {e}")),
        }
    };
    match resolve(base, &base_path, path, follow) {
        Ok(t) => {
            remember_parent(&t);
            checked(store, t)
        }
        Err(Unresolved::CallWillFail(_)) => Resolved::WillFail,
        Err(Unresolved::Failed { lexical, error }) => {
            if store.protected(lexical.as_bytes()) {
                Resolved::Protected(lexical)
            } else if store.excluded(lexical.as_bytes()) {
                Resolved::Excluded
            } else {
                Resolved::Unknown(lexical, error.to_string())
            }
        }
    }
}

fn checked<'a>(store: &Store, t: Target<'a>) -> Resolved<'a> {
    if store.protected(t.abs.as_bytes()) {
        Resolved::Protected(t.abs)
    } else if store.excluded(t.abs.as_bytes()) {
        Resolved::Excluded
    } else {
        Resolved::Target(t)
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
fn locate_cached<'a>(store: &Store, dirfd: i32, path: &[u8], follow: bool) -> Option<Target<'a>> {
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
    let gens =
        plain_base.then(|| (store.counters.names_gen(), crate::dircache::local_gen(), crate::dircache::coarse_now()));
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
    if follow {
        // The call follows a final symlink: that is the full resolver's job.
        if let Ok(fin) = rustix::fs::statat(base, path, AtFlags::SYMLINK_NOFOLLOW) {
            if FileType::from_raw_mode(fin.st_mode) == FileType::Symlink {
                return None;
            }
        }
    }
    let abs = BPath::new(journal::bpath::join(&canonical, name));
    Some(Target { parent: DirFd::Borrowed(base), name: path.to_vec(), abs })
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
fn cached_dir_name(id: journal::record::Ident, known: &[u8]) -> Option<Vec<u8>> {
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

fn irreversible(store: &Store, call: &str, path: BPath, step: &str, error: String) -> Pending {
    let reason = Reason::CaptureFailed { step: step.into(), error };
    change(store, call, path, Before::Irreversible { reason })
}

/// Journals a `change` record, or, under the strict policy, refuses a call whose prior state
/// could not be kept (EACCES) and journals the refusal.
fn change(store: &Store, call: &str, path: BPath, before: Before) -> Pending {
    record_change(store, call, path, before).0
}

/// [`change`], also returning the record's seq (none when the call is refused).
fn record_change(store: &Store, call: &str, path: BPath, before: Before) -> (Pending, Option<u64>) {
    if let Before::Irreversible { reason } = &before {
        if store.settings.policy == Policy::Strict {
            let what = format!("{call} {}: {reason}", path.display_lossy());
            return (refuse(store, call, what, libc::EACCES), None);
        }
    }
    let seq = store.record(call, Op::Change { path, before: before.clone() });
    (pending_of(&before, seq), Some(seq))
}

/// Refuses (always, whatever the policy) a call that would change the session's own store.
fn protect(store: &Store, call: &str, path: &BPath) -> Pending {
    let what = format!("{call} {} would change this session's own journal store", path.display_lossy());
    refuse(store, call, what, libc::EACCES)
}

/// Journals a refusal (strict policy, or the session's own store).
pub fn refuse(store: &Store, call: &str, what: String, errno: i32) -> Pending {
    store.record(call, Op::Refused { what, errno });
    Pending::Refuse(errno)
}

/// `lstat` of a target. `Err` carries what the hook must do instead: nothing when the real
/// call will fail anyway, or the outcome of journaling an unexpected error.
fn stat_target(store: &Store, call: &str, t: &Target<'_>) -> Result<Option<Stat>, Pending> {
    match rustix::fs::statat(t.parent.as_fd(), t.name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) if call_will_fail(e) => Err(Pending::Nothing),
        Err(e) => Err(irreversible(store, call, t.abs.clone(), "stat", std::io::Error::from(e).to_string())),
    }
}

/// The target of a call that acts on something existing, with its `lstat`; or what the hook
/// must do instead (nothing when it does not exist: the call will fail).
fn existing_target<'a>(
    store: &Store,
    call: &str,
    dirfd: i32,
    path: &[u8],
    follow: bool,
) -> Result<(Target<'a>, Stat), Pending> {
    let t = target_or_record(store, call, dirfd, path, follow)?;
    match stat_target(store, call, &t)? {
        Some(st) => Ok((t, st)),
        None => Err(Pending::Nothing),
    }
}

/// The target of a call, or what the hook must do instead (nothing when the call will fail or
/// the path is not journaled; the outcome of journaling an unresolvable path).
fn target_or_record<'a>(
    store: &Store,
    call: &str,
    dirfd: i32,
    path: &[u8],
    follow: bool,
) -> Result<Target<'a>, Pending> {
    match locate(store, dirfd, path, follow) {
        Resolved::Target(t) => Ok(t),
        Resolved::WillFail | Resolved::Excluded => Err(Pending::Nothing),
        Resolved::Protected(p) => Err(protect(store, call, &p)),
        Resolved::Unknown(p, why) => Err(irreversible(store, call, p, "resolve the path", why)),
    }
}

fn pending_of(before: &Before, seq: u64) -> Pending {
    match before {
        Before::Contents(s) => match &s.node {
            Node::File { blob, how: CaptureHow::Link, .. } => Pending::Linked { blob: blob.clone(), seq },
            Node::File { how: CaptureHow::Copy | CaptureHow::Reflink, .. } => {
                // Bytes and metadata are kept apart from the inode: any later change to it
                // through a descriptor is undone by restoring this capture.
                crate::covered::insert(s.ident);
                Pending::Nothing
            }
            _ => Pending::Nothing,
        },
        _ => Pending::Nothing,
    }
}

/// Whether open flags can change anything (the read-only fast path is the negation).
#[inline(always)]
pub fn open_mutates(flags: i32) -> bool {
    // O_TMPFILE includes the O_DIRECTORY bit, so it is tested whole: a plain directory open
    // must stay on the fast path (INTERPOSITION.md §6.3).
    flags & libc::O_PATH == 0
        && (flags & (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) != 0
            || flags & libc::O_TMPFILE == libc::O_TMPFILE)
}

/// Before open/openat/creat/fopen and friends.
pub fn before_open(store: &Store, call: &str, dirfd: i32, path: &[u8], flags: i32) -> Pending {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        // An unnamed file: nothing appears in the tree unless it is linked in later.
        return Pending::Nothing;
    }
    let creat = flags & libc::O_CREAT != 0;
    let excl = flags & libc::O_EXCL != 0;
    let follow = flags & libc::O_NOFOLLOW == 0 && !(creat && excl);
    let t = match target_or_record(store, call, dirfd, path, follow) {
        Ok(t) => t,
        Err(p) => return p,
    };
    if creat && excl && birth_times_kept() && !EXCLUSIVE_FAILED.load(Ordering::Relaxed) {
        // The call creates the file or fails: its result says which, and undo can tell a
        // file this call made from one that was there by its birth time (Before::Exclusive).
        return created(store, call, t.abs, Before::Exclusive);
    }
    let st = match stat_target(store, call, &t) {
        Ok(Some(st)) => st,
        Ok(None) if creat => {
            if excl {
                EXCLUSIVE_FAILED.store(false, Ordering::Relaxed);
            }
            return created(store, call, t.abs, Before::Absent);
        }
        Ok(None) => return Pending::Nothing,
        Err(p) => return p,
    };
    if creat && excl {
        return Pending::Nothing; // EEXIST
    }
    let acc = flags & libc::O_ACCMODE;
    let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
    let ft = FileType::from_raw_mode(st.st_mode);
    let intent = match ft {
        FileType::RegularFile if flags & libc::O_TRUNC != 0 => Intent::Truncate,
        FileType::RegularFile if acc == libc::O_WRONLY && flags & libc::O_APPEND != 0 => Intent::Append,
        FileType::RegularFile if writes => Intent::Overwrite,
        FileType::Fifo | FileType::Socket | FileType::CharacterDevice | FileType::BlockDevice if writes => {
            Intent::Overwrite
        }
        // Directories, symlinks (O_NOFOLLOW: ELOOP) and read-only opens change nothing.
        _ => return Pending::Nothing,
    };
    before_rewrite(store, call, &t, &st, intent)
}

/// A call that may change where existing directory paths lead (a rename, an unlink, an
/// rmdir): every process of the session is told through the shared names generation, before
/// the call (here) and after it ([`names_changed_after_call`]), so that none trusts a
/// remembered directory path ([`crate::dircache`]) the call may have made wrong. Started
/// before the call's target is known; taken back once it is known to be a plain file, whose
/// removal or move cannot change where a directory path leads (the tell happens when this is
/// dropped, at the end of the hook's work before the call).
struct NamesChange<'a> {
    store: &'a Store,
    needed: std::cell::Cell<bool>,
}

thread_local! {
    /// Set by a hook whose call may change where directory paths lead; taken after the call.
    static NAMES_AFTER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<'a> NamesChange<'a> {
    fn begin(store: &'a Store) -> NamesChange<'a> {
        NamesChange { store, needed: std::cell::Cell::new(true) }
    }

    /// Once the call's ends are known: whether one of them leads somewhere.
    fn only_if(&self, leads: bool) {
        self.needed.set(leads);
    }
}

/// Whether a path may lead through a node of this kind to other nodes.
fn leads(st: &Stat) -> bool {
    matches!(FileType::from_raw_mode(st.st_mode), FileType::Directory | FileType::Symlink)
}

impl Drop for NamesChange<'_> {
    fn drop(&mut self) {
        if self.needed.get() {
            self.store.counters.names_changing();
            NAMES_AFTER.with(|c| c.set(true));
        }
    }
}

/// After the real call of a hook that started a [`NamesChange`]: tells the session again,
/// now that the call has taken effect.
pub fn names_changed_after_call() {
    if NAMES_AFTER.with(|c| c.replace(false)) {
        crate::state::names_changed();
    }
}

/// Journals the creation of `path` by an open (`before`: absent, or an exclusive create not
/// looked at first).
fn created(store: &Store, call: &str, path: BPath, before: Before) -> Pending {
    let looked = matches!(before, Before::Absent);
    let created = store.record(call, Op::Change { path, before });
    // Mapped here, under the guard, so that the lock-free learning after the call can mark
    // the new file born for every process of the session.
    let _ = store.born();
    Pending::Created { created, looked }
}

/// Whether the files this process last created have birth times (`statx` `btime`), which is
/// what lets an exclusive create skip the `lstat` that proves its name absent: 0 not known
/// yet, 1 yes, 2 no. A property of the file system, so a `vfork` child may set it too.
static BIRTH_TIMES: AtomicU8 = AtomicU8::new(0);

/// Set when an exclusive create journaled without looking failed (a lock file someone holds,
/// which a program may retry many times): the next ones look first, and journal nothing while
/// the name is taken, until one finds it free.
static EXCLUSIVE_FAILED: AtomicBool = AtomicBool::new(false);

fn birth_times_kept() -> bool {
    BIRTH_TIMES.load(Ordering::Relaxed) == 1
}

/// Before truncate/truncate64.
pub fn before_truncate(store: &Store, call: &str, path: &[u8]) -> Pending {
    let (t, st) = match existing_target(store, call, libc::AT_FDCWD, path, true) {
        Ok(x) => x,
        Err(p) => return p,
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Pending::Nothing;
    }
    before_rewrite(store, call, &t, &st, Intent::Overwrite)
}

/// Before a call rewrites the existing file at `t` (whose `lstat` is `st`) in place with
/// `intent` (an open for writing, truncate, ftruncate): journals what undo needs and returns
/// what the hook must do after the call.
///
/// A regular file the session already holds what undo needs for is not copied: a file it
/// created gets a `born` record; a file an earlier call copied whole reuses that copy while
/// it is unchanged (a capture like any other, which a selective undo can restore on its own),
/// and once it has changed gets a `kept` record naming that copy's record. Anything else is
/// captured; a truncation the capture moved aside is put back if the call fails.
fn before_rewrite(store: &Store, call: &str, t: &Target<'_>, st: &Stat, intent: Intent) -> Pending {
    let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    if let Some(origin) = regular.then(|| origin_of(store, t, st)).flatten() {
        if let Origin::Kept(_) = origin {
            let reused = store
                .blobs
                .with(|blobs| capturer(store, blobs, Intent::Overwrite).reuse(t.parent.as_fd(), &t.name, st))
                .flatten();
            if let Some(before) = reused {
                return kept_change(store, call, t, st, before);
            }
        }
        let seq = store.record(call, Op::Change { path: t.abs.clone(), before: before_of(origin) });
        return Pending::BornRewrite { seq, origin };
    }
    let before = capture(store, t.parent.as_fd(), &t.name, st, intent);
    let moved_aside = intent == Intent::Truncate
        && matches!(&before, Before::Contents(s) if matches!(s.node, Node::File { how: CaptureHow::Link, .. }));
    match kept_change(store, call, t, st, before) {
        Pending::Linked { blob, seq } if moved_aside => Pending::MovedAside { blob, seq, path: t.abs.clone() },
        other => other,
    }
}

/// [`change`] for a capture before a call that rewrites a regular file in place: when the
/// capture is a whole copy (or clone) of a file with one name (`st`), the file is also marked
/// kept in the session's born table, so that later rewrites by any process of the session
/// copy nothing more (undoing this record puts back the state they would have kept). One
/// `statx` more, on a path that has just copied the file.
///
/// One name only: undo puts a copy back through the name it was taken from, and a file with
/// other names could come back as a new inode there (a removal kept by copy, across file
/// systems) while a rewrite through another name, journaled as kept, would be left as it is.
fn kept_change(store: &Store, call: &str, t: &Target<'_>, st: &Stat, before: Before) -> Pending {
    let whole = match &before {
        Before::Contents(s)
            if st.st_nlink == 1 && matches!(s.node, Node::File { how: CaptureHow::Copy | CaptureHow::Reflink, .. }) =>
        {
            Some(s.ident)
        }
        _ => None,
    };
    let (pending, seq) = record_change(store, call, t.abs.clone(), before);
    // The table is mapped (and the birth time asked) only for a whole copy that was recorded.
    let Some((ident, seq)) = whole.zip(seq) else { return pending };
    if let (Some(index), Some((now, btime))) =
        (store.born(), birth_of(t.parent.as_fd(), &t.name, AtFlags::SYMLINK_NOFOLLOW))
    {
        if now == ident {
            index.remember_origin(ident, btime, Origin::Kept(seq));
        }
    }
    pending
}

/// The prior state a record gives a file that needs no capture.
fn before_of(origin: Origin) -> Before {
    match origin {
        Origin::Born(created) => Before::Born { created },
        Origin::Kept(by) => Before::Kept { by },
    }
}

/// Why the file at `t` (whose `lstat` is `st`) needs no capture, if it does not: a process of
/// this session created it, or already copied it whole. The born table has an entry for its
/// inode, and `statx` gives the birth time that entry was made with. No system call unless
/// the table names the inode.
fn origin_of(store: &Store, t: &Target<'_>, st: &Stat) -> Option<Origin> {
    let index = store.born()?;
    let ident = ident_of(st);
    if !index.may_be_born(ident) {
        return None;
    }
    let (now, btime) = birth_of(t.parent.as_fd(), &t.name, AtFlags::SYMLINK_NOFOLLOW)?;
    if now != ident {
        return None;
    }
    index.origin(ident, btime)
}

/// The identity and birth time (nanoseconds since the epoch) of `name` under `dir`, if the
/// file system keeps birth times.
fn birth_of(dir: BorrowedFd<'_>, name: &[u8], flags: AtFlags) -> Option<(journal::record::Ident, i64)> {
    let sx = rustix::fs::statx(dir, name, flags, StatxFlags::INO | StatxFlags::BTIME).ok()?;
    if !StatxFlags::from_bits_retain(sx.stx_mask).contains(StatxFlags::BTIME) {
        return None;
    }
    let dev = rustix::fs::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    let btime = sx.stx_btime.tv_sec.saturating_mul(1_000_000_000).saturating_add(i64::from(sx.stx_btime.tv_nsec));
    Some((journal::record::Ident { dev, ino: sx.stx_ino }, btime))
}

/// Before a call that changes a file through a descriptor (ftruncate): the descriptor is
/// resolved to its path, and the file captured there if that name still leads to it.
pub fn before_fd_change(store: &Store, call: &str, fd: i32, fst: &Stat) -> Pending {
    if FileType::from_raw_mode(fst.st_mode) != FileType::RegularFile {
        return Pending::Nothing;
    }
    let Ok(path) = fd_path(fd) else { return Pending::Nothing };
    if store.protected(&path) {
        return protect(store, call, &BPath::new(path));
    }
    if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") {
        // An unlinked file: it is not in the tree, and a capture made when it was opened or
        // removed inside the session already covers it.
        return Pending::Nothing;
    }
    let (t, st) = match existing_target(store, call, libc::AT_FDCWD, &path, false) {
        Ok(x) => x,
        Err(p) => return p,
    };
    if ident_of(&st) != ident_of(fst) {
        return Pending::Nothing;
    }
    before_rewrite(store, call, &t, &st, Intent::Overwrite)
}

/// Before rename/renameat/renameat2.
pub fn before_rename(
    store: &Store,
    call: &str,
    olddir: i32,
    old: &[u8],
    newdir: i32,
    new: &[u8],
    flags: u32,
) -> Pending {
    let from = locate(store, olddir, old, false);
    let to = locate(store, newdir, new, false);
    // Told before any early return; taken back below when both ends are plain files.
    let names = NamesChange::begin(store);
    let (from, to) = match (from, to) {
        (Resolved::Protected(p), _) | (_, Resolved::Protected(p)) => return protect(store, call, &p),
        (Resolved::Target(f), _) if store.holds_store(f.abs.as_bytes()) => return protect(store, call, &f.abs),
        (Resolved::WillFail, _) | (_, Resolved::WillFail) | (Resolved::Excluded, Resolved::Excluded) => {
            return Pending::Nothing;
        }
        (Resolved::Unknown(p, why), _) | (_, Resolved::Unknown(p, why)) => {
            return irreversible(store, call, p, "resolve the path", why);
        }
        // One end outside the journaled world: what matters is the end inside it.
        (Resolved::Excluded, Resolved::Target(t)) | (Resolved::Target(t), Resolved::Excluded) => {
            return match stat_target(store, call, &t) {
                Ok(Some(st)) => {
                    let before = capture(store, t.parent.as_fd(), &t.name, &st, Intent::Destroy);
                    change(store, call, t.abs, before)
                }
                Ok(None) => change(store, call, t.abs, Before::Absent),
                Err(p) => p,
            };
        }
        (Resolved::Target(f), Resolved::Target(t)) => (f, t),
    };
    let fst = match stat_target(store, call, &from) {
        Ok(Some(st)) => st,
        Ok(None) => return Pending::Nothing,
        Err(p) => return p,
    };
    let moved = Some(ident_of(&fst));
    if flags & libc::RENAME_EXCHANGE != 0 {
        store.record(call, Op::Rename { from: from.abs, to: to.abs, flags, moved, to_before: Before::Absent });
        return Pending::Nothing;
    }
    let to_before = match stat_target(store, call, &to) {
        Err(p) => return p,
        Ok(None) => {
            names.only_if(leads(&fst));
            Before::Absent
        }
        Ok(Some(_)) if flags & libc::RENAME_NOREPLACE != 0 => return Pending::Nothing, // EEXIST
        // Two names of one inode: rename does nothing at all.
        Ok(Some(tst)) if ident_of(&tst) == ident_of(&fst) => return Pending::Nothing,
        Ok(Some(tst)) => {
            names.only_if(leads(&fst) || leads(&tst));
            capture(store, to.parent.as_fd(), &to.name, &tst, Intent::Destroy)
        }
    };
    if let Before::Irreversible { reason } = &to_before {
        if store.settings.policy == Policy::Strict {
            let what = format!("{call} over {}: {reason}", to.abs.display_lossy());
            return refuse(store, call, what, libc::EACCES);
        }
    }
    let seq = store.record(call, Op::Rename { from: from.abs, to: to.abs, flags, moved, to_before: to_before.clone() });
    pending_of(&to_before, seq)
}

/// Before unlink/unlinkat/rmdir/remove.
pub fn before_remove(store: &Store, call: &str, dirfd: i32, path: &[u8], removes: Removes) -> Pending {
    let t = match target_or_record(store, call, dirfd, path, false) {
        Ok(t) => t,
        Err(p) => return p,
    };
    let names = NamesChange::begin(store);
    if removes == Removes::NonDir {
        // The common case (rm of a file): link first, look after.
        let linked = store
            .blobs
            .with(|blobs| capturer(store, blobs, Intent::Destroy).capture_doomed_file(t.parent.as_fd(), &t.name));
        if let Some(Some(before)) = linked {
            names.only_if(!matches!(&before, Before::Contents(Snapshot { node: Node::File { .. }, .. })));
            forget_born(store, &before);
            return change(store, call, t.abs, before);
        }
    }
    let st = match stat_target(store, call, &t) {
        Ok(Some(st)) => st,
        Ok(None) => return Pending::Nothing,
        Err(p) => return p,
    };
    names.only_if(leads(&st));
    let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
    match removes {
        Removes::NonDir if is_dir => return Pending::Nothing, // EISDIR
        Removes::Dir if !is_dir => return Pending::Nothing,   // ENOTDIR
        _ => {}
    }
    let before = capture(store, t.parent.as_fd(), &t.name, &st, Intent::Destroy);
    forget_born(store, &before);
    change(store, call, t.abs, before)
}

/// A file the session removes may free its inode number for a file that is not the
/// session's: its born entry goes.
fn forget_born(store: &Store, before: &Before) {
    if let (Before::Contents(snap), Some(index)) = (before, store.born_mapped()) {
        index.forget_born(snap.ident);
    }
}

/// Before a call that creates a new name and fails if it exists (mkdir, link, symlink,
/// mknod, mkfifo and their *at forms): the name was absent, so undo removes it.
pub fn before_create(store: &Store, call: &str, dirfd: i32, path: &[u8]) -> Pending {
    let t = match target_or_record(store, call, dirfd, path, false) {
        Ok(t) => t,
        Err(p) => return p,
    };
    match stat_target(store, call, &t) {
        Ok(None) => change(store, call, t.abs, Before::Absent),
        Ok(Some(_)) => Pending::Nothing, // EEXIST
        Err(p) => p,
    }
}

/// Before a call that creates a name from a template (the mkstemp family, mkdtemp): the
/// intent, so that a process killed before [`after_created`] leaves a trace undo reports.
/// Also returns the template's absolute name, which names the directory the call creates in.
pub fn before_mktemp(store: &Store, call: &str, template: &[u8]) -> (Pending, Option<BPath>) {
    match target_or_record(store, call, libc::AT_FDCWD, template, false) {
        Ok(t) => {
            let abs = t.abs.clone();
            (Pending::Recorded(store.record(call, Op::TempName { template: t.abs })), Some(abs))
        }
        Err(p) => (p, None),
    }
}

/// After a call that created a name we could only learn from its result (the mkstemp
/// family, mkdtemp): it did not exist before, so undo removes it. `template` is the absolute
/// template [`before_mktemp`] journaled: the call only replaces the end of its last component,
/// so the new name is found without a system call, which keeps the window in which a killed
/// process leaves an intent nothing completes as short as it can be.
pub fn after_created(store: &Store, call: &str, path: &[u8], template: Option<&BPath>, fd: Option<i32>) {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    let abs = match template.and_then(BPath::split_parent) {
        Some((dir, _)) if !name.is_empty() && name != b"." && name != b".." => {
            BPath::new(journal::bpath::join(dir, name))
        }
        _ => match target_or_record(store, call, libc::AT_FDCWD, path, false) {
            Ok(t) => t.abs,
            Err(_) => return,
        },
    };
    let created = store.record(call, Op::Change { path: abs, before: Before::Absent });
    // Undo removes it whole: later descriptor changes to it need no records, and other
    // processes' rewrites of it no captures (the table is mapped for learn_created).
    let _ = store.born();
    after(store, call, Pending::Created { created, looked: true }, true, 0, fd);
}

/// Before a call that changes a node's metadata by name (chmod, chown, utime, setxattr and
/// their variants): the part it changes, so undo can set it back.
pub fn before_meta(
    store: &Store,
    call: &str,
    dirfd: i32,
    path: &[u8],
    follow: bool,
    what: MetaKind,
    xattr: Option<&[u8]>,
) -> Pending {
    let (t, st) = match existing_target(store, call, dirfd, path, follow) {
        Ok(x) => x,
        Err(p) => return p,
    };
    if crate::covered::contains(ident_of(&st)) {
        return Pending::Nothing;
    }
    let xattr = match xattr {
        None => None,
        Some(name) => match xattr_value(t.abs.as_bytes(), name) {
            Ok(value) => Some(XattrBefore { name: BPath::new(name.to_vec()), value: value.map(Bytes) }),
            Err(e) => return irreversible(store, call, t.abs, "read the extended attribute", e.to_string()),
        },
    };
    store.record(call, Op::Meta { path: t.abs, before: meta_before(&st, what, xattr) });
    Pending::Nothing
}

/// Before a call that changes metadata through a descriptor (fchmod, fchown, futimens,
/// fsetxattr, ...): the descriptor is named through `/proc/self/fd`.
pub fn before_fd_meta(store: &Store, call: &str, fd: i32, st: &Stat, what: MetaKind, xattr: Option<&[u8]>) -> Pending {
    // SAFETY: `fd` is the caller's descriptor, open for the duration of its call.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let Ok(path) = fd_path(fd) else { return Pending::Nothing };
    if store.protected(&path) {
        return protect(store, call, &BPath::new(path));
    }
    if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") || store.excluded(&path) {
        // Not a named file in the tree (a pipe, a socket, an unlinked file).
        return Pending::Nothing;
    }
    let xattr = match xattr {
        None => None,
        Some(name) => {
            let mut buf = vec![0u8; 65536];
            let value = match rustix::fs::fgetxattr(bfd, name, &mut buf[..]) {
                Ok(n) => Some(Bytes(buf[..n].to_vec())),
                Err(Errno::NODATA) | Err(Errno::NOTSUP) => None,
                Err(e) => {
                    irreversible(
                        store,
                        call,
                        BPath::new(path),
                        "read the extended attribute",
                        std::io::Error::from(e).to_string(),
                    );
                    return Pending::Nothing;
                }
            };
            Some(XattrBefore { name: BPath::new(name.to_vec()), value })
        }
    };
    store.record(call, Op::Meta { path: BPath::new(path), before: meta_before(st, what, xattr) });
    Pending::Nothing
}

/// Before setuid/seteuid/setreuid/setresuid: a switch to a user that cannot write the
/// session store (anyone but its owner and root) leaves this process and its children
/// unobserved. Say so while the store can still be written.
pub fn before_uid_change(store: &Store, call: &str, new_euid: u32) -> Pending {
    if crate::state::config().supervised {
        // The supervisor still sees every call the process makes, whoever it runs as.
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

/// Before io_uring_setup: file operations submitted through the ring bypass every hook.
pub fn before_io_uring(store: &Store, call: &str) -> Pending {
    if crate::state::config().supervised {
        // The supervisor sees io_uring_setup too, and journals it (or refuses it) itself.
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
        Pending::Connect(peer) => crate::effects::after_connect(store, call, peer, succeeded, errno),
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

/// Translates an `fopen` mode string into `open` flags (`None` for an invalid mode, which
/// makes fopen fail with EINVAL).
pub fn fopen_flags(mode: &[u8]) -> Option<i32> {
    let (&first, rest) = mode.split_first()?;
    let (mut acc, mut extra) = match first {
        b'r' => (libc::O_RDONLY, 0),
        b'w' => (libc::O_WRONLY, libc::O_CREAT | libc::O_TRUNC),
        b'a' => (libc::O_WRONLY, libc::O_CREAT | libc::O_APPEND),
        _ => return None,
    };
    for &c in rest.iter().take_while(|&&c| c != b',') {
        match c {
            b'+' => acc = libc::O_RDWR,
            b'x' => extra |= libc::O_EXCL,
            b'e' => extra |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    Some(acc | extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_map_to_the_open_flags_glibc_uses() {
        assert_eq!(fopen_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"rb"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"r+"), Some(libc::O_RDWR));
        assert_eq!(fopen_flags(b"w"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(fopen_flags(b"a+"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND));
        assert_eq!(fopen_flags(b"wx"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL));
        assert_eq!(fopen_flags(b"r,ccs=UTF-8+"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b""), None);
        assert_eq!(fopen_flags(b"z"), None);
    }

    #[test]
    fn only_writing_creating_or_truncating_opens_are_mutations() {
        assert!(!open_mutates(libc::O_RDONLY));
        assert!(!open_mutates(libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC));
        assert!(!open_mutates(libc::O_PATH | libc::O_WRONLY));
        assert!(open_mutates(libc::O_WRONLY));
        assert!(open_mutates(libc::O_RDONLY | libc::O_CREAT));
        assert!(open_mutates(libc::O_RDONLY | libc::O_TRUNC));
        assert!(open_mutates(libc::O_TMPFILE | libc::O_RDWR));
    }

    #[test]
    fn the_identity_statx_gives_with_a_birth_time_is_the_one_stat_gives() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let st = rustix::fs::fstat(&file).unwrap();
        let Some((by_fd, btime)) = birth_of(file.as_fd(), b"", AtFlags::EMPTY_PATH) else {
            panic!("this file system keeps no birth times: nothing here is tested");
        };
        assert_eq!(by_fd, ident_of(&st), "device numbers composed as stat reports them");
        let dir = std::fs::File::open(t.path()).unwrap();
        assert_eq!(birth_of(dir.as_fd(), b"f", AtFlags::SYMLINK_NOFOLLOW), Some((by_fd, btime)), "by name");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
        assert!(btime > 0 && btime <= now, "a birth time in nanoseconds since the epoch: {btime}");
    }
}
