//! What each file-changing call journals before it runs: classify the call, resolve its
//! target as the kernel will, capture the prior state through the core library, and record
//! it. The same code serves the shim (for the calling process itself) and the supervisor (for
//! a process it watches from outside), through two traits: [`Journal`], the session store a
//! record goes to, and [`Caller`], how the calling process names its working directory and
//! descriptors, and what it can learn after the call.
//!
//! Each `before_*` function runs before the real call and returns a [`Pending`] that says what
//! must happen once the call has returned. Nothing here decides whether the real call runs: it
//! always does, exactly once, unless the strict policy refuses it ([`Pending::Refuse`]).
//!
//! What this module cannot do: journal a call whose target it cannot name (resolution failed
//! for a reason the real call will not share). That case is journaled as irreversible with the
//! lexical path and the error, never skipped. Nor can it see a path change between its
//! resolution and the call (README, "What this cannot do").

mod files;
mod meta;
mod names;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use aether_journal::BPath;
use aether_journal::capture::{Capturer, FsCalls, Intent};
use aether_journal::config::{Policy, Settings};
use aether_journal::record::{Before, CaptureHow, DirTimesOp, Ident, Node, Op, Reason};
use aether_journal::resolve::{DirFd, Looked, Target, Unresolved, resolve_from};
use rustix::fs::{AtFlags, CWD, FileType, Stat};
use rustix::io::Errno;

pub use files::{
    before_create, before_fd_change, before_link, before_open, before_truncate, birth_of, fopen_flags, open_mutates,
};
pub use meta::{
    FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, before_fd_flags, before_fd_meta, before_meta, not_kept,
};
pub use names::{Removes, before_mktemp, before_remove, before_rename, temp_name_target};

use crate::index::{Origin, SharedIndex};
use crate::tables::SharedCounters;

/// The session store a record goes to, and the tables it shares with the session's other
/// writers.
pub trait Journal {
    /// Appends a record for `op`, made by `call`; returns its sequence number. A record that
    /// cannot be written is counted as lost (so that no undo can claim completeness).
    fn record(&self, call: &str, op: Op) -> u64;
    /// Runs `f` with the store's `blobs/` directory (`None`: it is gone).
    fn with_blobs<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R>;
    /// The shared counters.
    fn counters(&self) -> &SharedCounters;
    /// The capture index, mapped on first use.
    fn index(&self) -> Option<&SharedIndex>;
    /// The table of born and kept files, mapped on first use.
    fn born(&self) -> Option<&SharedIndex>;
    /// The born table if it is already mapped (no system call).
    fn born_mapped(&self) -> Option<&SharedIndex>;
    /// Budgets, policy, sync.
    fn settings(&self) -> &Settings;
    /// The canonical session directory.
    fn session_canon(&self) -> &[u8];
    /// How captures change files ([`aether_journal::capture::Direct`], or the shim's marked
    /// calls).
    fn calls(&self) -> &dyn FsCalls;
    /// The session directory as the session's processes know it (`AETHER_JOURNAL_DIR`).
    fn session_dir(&self) -> &[u8];
    /// Where this writer packs small copies ([`aether_journal::pack`]); `None`: a file each.
    fn packer(&self) -> Option<&dyn aether_journal::capture::Packer> {
        None
    }
    /// The process at the root of the session's tree (from its header).
    fn root_pid(&self) -> Option<u32>;

    /// Whether a path is never journaled: the pseudo-file systems under /proc and /sys, and
    /// the device nodes under /dev (but not the tmpfs at /dev/shm, where programs keep shared
    /// memory as ordinary files).
    fn excluded(&self, abs: &[u8]) -> bool {
        excluded(abs)
    }

    /// Whether a path is the session's own store (or inside it): processes of the session may
    /// not change it, so that `rm -rf ~` cannot take the means of recovery with it.
    fn protected(&self, abs: &[u8]) -> bool {
        aether_journal::bpath::starts_with_dir(abs, self.session_canon())
    }

    /// Whether moving `abs` away would move the store with it.
    fn holds_store(&self, abs: &[u8]) -> bool {
        BPath::new(self.session_canon().to_vec()).starts_with_dir(abs)
    }
}

/// Whether a path is outside the journaled world (see [`Journal::excluded`]).
pub fn excluded(abs: &[u8]) -> bool {
    use aether_journal::bpath::starts_with_dir;
    if starts_with_dir(abs, b"/proc") || starts_with_dir(abs, b"/sys") {
        return true;
    }
    starts_with_dir(abs, b"/dev") && !starts_with_dir(abs, b"/dev/shm")
}

/// Whether `path` is certainly [`excluded`] without resolving it: an absolute name directly in
/// `/dev` (not `/dev/shm`, which holds ordinary files), where `/dev` is a directory and the
/// name is not a symlink (a missing name too: a file created there is left out as well). A
/// caller may then let the call pass without opening the session's store: every `bash` opens
/// `/dev/tty` read-write as it starts, and every `> /dev/null` opens `/dev/null` for writing,
/// which cost a process that changes nothing a whole store (about 25 system calls) each. Two
/// `lstat`s; `false` whenever the name is anything but plain, and the caller resolves it as
/// usual.
pub fn plainly_excluded(path: &[u8]) -> bool {
    let Some(name) = path.strip_prefix(b"/dev/") else { return false };
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." || name == b"shm" {
        return false;
    }
    let dev_is_dir =
        rustix::fs::lstat("/dev").is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
    dev_is_dir
        && match rustix::fs::lstat(path) {
            Ok(st) => FileType::from_raw_mode(st.st_mode) != FileType::Symlink,
            Err(e) => e == Errno::NOENT,
        }
}

/// How long a directory path a caller resolved may be trusted without looking again, when no
/// process of the session has renamed or removed a directory or symlink since (the names
/// generation): the time within which a directory moved by a process outside the session is
/// not noticed (README, "What this cannot do").
pub const PATH_TRUST_NS: u64 = 10_000_000;

/// The directory a path relative to a descriptor starts from, and its canonical name.
pub struct Base<'a> {
    /// The directory.
    pub fd: DirFd<'a>,
    /// Its canonical absolute name.
    pub path: Vec<u8>,
}

/// Why a call's base directory could not be named.
pub enum BaseError {
    /// The call will fail without touching anything (a descriptor that is not open, or not a
    /// directory that still exists).
    WillFail,
    /// Naming it failed for a reason of its own.
    Failed(String),
}

/// The process a call is made by, as the journaling sees it: the shim's own process, or a
/// process the supervisor watches from outside.
pub trait Caller {
    /// Whether the journaling learns the call's result: the shim does (it makes the call);
    /// a supervisor that lets the kernel continue the call does not. Strategies that need the
    /// result (an exclusive create journaled without looking, a big file moved aside before a
    /// truncation) are used only when it does.
    fn sees_results(&self) -> bool;
    /// The caller's working directory, as a directory to resolve from and its name.
    fn cwd(&self) -> Result<Base<'_>, BaseError>;
    /// The directory open as the caller's descriptor `fd`, and its canonical name.
    fn dir(&self, fd: i32) -> Result<Base<'_>, BaseError>;
    /// The canonical path of the caller's descriptor `fd`.
    fn fd_path(&self, fd: i32) -> io::Result<Vec<u8>>;
    /// The value of extended attribute `name` of the file open as the caller's descriptor `fd`
    /// (`Ok(None)` when it is not set).
    fn fd_xattr(&self, fd: i32, name: &[u8]) -> Result<Option<Vec<u8>>, Errno>;
    /// The inode flags (`FS_IOC_GETFLAGS`) of the file open as the caller's descriptor `fd`.
    fn fd_flags(&self, fd: i32) -> Result<u32, Errno>;

    /// A fast way to name a target without a full resolution (the shim's remembered directory
    /// paths); `None`: resolve it.
    fn cached_target<J: Journal>(&self, _journal: &J, _dirfd: i32, _path: &[u8], _follow: bool) -> Option<Target<'_>> {
        None
    }
    /// Told after a full resolution through an opened parent (the shim remembers its name).
    fn resolved(&self, _target: &Target<'_>) {}
    /// Whether the caller has already journaled inode `id` whole (its later descriptor changes
    /// need no record).
    fn covered(&self, _id: Ident) -> bool {
        false
    }
    /// Tells the caller that inode `id` is now journaled whole.
    fn cover(&self, _id: Ident) {}
    /// Whether an exclusive create may be journaled without looking at its name first (see
    /// [`Before::Exclusive`]): only where the result is seen, on a file system with birth
    /// times, and not while a name the caller retries is taken.
    fn exclusive_without_looking(&self) -> bool {
        false
    }
    /// Told when an exclusive create looked and found its name free.
    fn found_name_free(&self) {}
    /// Told before a call that may change where directory paths lead has run (the shim tells
    /// the session again after the call).
    fn names_changing(&self) {}
    /// The caller's process id and process group.
    fn pid_and_group(&self) -> (u32, i64);
    /// Whether this is the first datagram the caller's process sends to `peer` (only the
    /// first is journaled); always true where nobody remembers.
    fn first_send_to(&self, _peer: &aether_journal::record::Endpoint) -> bool {
        true
    }
}

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
    Connect(aether_journal::record::Endpoint),
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

/// A capturer into the store's `blobs/` (the index only where a copy may be made).
fn capturer<'a, J: Journal>(journal: &'a J, blobs: BorrowedFd<'a>, intent: Intent) -> Capturer<'a> {
    Capturer {
        blobs,
        budget: journal.settings().budget,
        counters: journal.counters(),
        sync: journal.settings().sync,
        index: (intent != Intent::Destroy)
            .then(|| journal.index())
            .flatten()
            .map(|i| i as &dyn aether_journal::capture::CaptureIndex),
        calls: journal.calls(),
        pack: (intent != Intent::Destroy).then(|| journal.packer()).flatten(),
    }
}

/// Captures with the store's `blobs/` descriptor.
fn capture<J: Journal>(journal: &J, parent: BorrowedFd<'_>, name: &[u8], st: &Stat, intent: Intent) -> Before {
    journal.with_blobs(|blobs| capturer(journal, blobs, intent).capture_stat(parent, name, st, intent)).unwrap_or_else(
        || {
            Before::irreversible(Reason::CaptureFailed {
                step: "open the session store".into(),
                error: "its blobs directory is gone".into(),
            })
        },
    )
}

/// A resolved target, or why there is none.
enum Resolved<'a> {
    Target(Target<'a>),
    /// The call will fail without touching anything.
    WillFail,
    /// The path is not journaled (/proc, /sys, device nodes).
    Excluded,
    /// The path is the session's own store: the call is refused.
    Protected(BPath),
    /// Resolution failed on its own: journal the lexical path as irreversible.
    Unknown(BPath, String),
}

/// Resolves `path` relative to `dirfd` as the kernel will for the real call.
fn locate<'a, J: Journal, C: Caller>(
    journal: &J,
    caller: &'a C,
    dirfd: i32,
    path: &[u8],
    follow: bool,
) -> Resolved<'a> {
    if let Some(t) = caller.cached_target(journal, dirfd, path, follow) {
        return checked(journal, t);
    }
    let base = if path.first() == Some(&b'/') {
        Ok(Base { fd: DirFd::Borrowed(CWD), path: b"/".to_vec() })
    } else if dirfd == libc::AT_FDCWD {
        caller.cwd()
    } else {
        caller.dir(dirfd)
    };
    let base = match base {
        Ok(b) => b,
        Err(BaseError::WillFail) => return Resolved::WillFail,
        Err(BaseError::Failed(why)) => return Resolved::Unknown(BPath::new(path.to_vec()), why),
    };
    match resolve_from(base.fd, &base.path, path, follow, journal.calls()) {
        Ok(t) => {
            caller.resolved(&t);
            checked(journal, t)
        }
        Err(Unresolved::CallWillFail(_)) => Resolved::WillFail,
        Err(Unresolved::Failed { lexical, error }) => {
            if journal.protected(lexical.as_bytes()) {
                Resolved::Protected(lexical)
            } else if journal.excluded(lexical.as_bytes()) {
                Resolved::Excluded
            } else {
                Resolved::Unknown(lexical, error.to_string())
            }
        }
    }
}

fn checked<'a, J: Journal>(journal: &J, t: Target<'a>) -> Resolved<'a> {
    if journal.protected(t.abs.as_bytes()) {
        Resolved::Protected(t.abs)
    } else if journal.excluded(t.abs.as_bytes()) {
        Resolved::Excluded
    } else {
        Resolved::Target(t)
    }
}

/// Errors from looking at a target that the real call will meet too.
pub fn call_will_fail(e: Errno) -> bool {
    matches!(e, Errno::NOENT | Errno::NOTDIR | Errno::ACCESS | Errno::LOOP | Errno::NAMETOOLONG | Errno::BADF)
}

fn irreversible<J: Journal>(journal: &J, call: &str, path: BPath, step: &str, error: String) -> Pending {
    let reason = Reason::CaptureFailed { step: step.into(), error };
    if journal.settings().policy == Policy::Strict {
        let what = format!("{call} {}: {reason}", path.display_lossy());
        return refuse(journal, call, what, libc::EACCES);
    }
    journal.record(call, Op::Change { path, before: Before::irreversible(reason) });
    Pending::Nothing
}

/// Journals a `change` record, or, under the strict policy, refuses a call whose prior state
/// could not be kept (EACCES) and journals the refusal.
fn change<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, path: BPath, before: Before) -> Pending {
    record_change(journal, caller, call, path, before).0
}

/// [`change`], also returning the record's seq (none when the call is refused).
fn record_change<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    path: BPath,
    before: Before,
) -> (Pending, Option<u64>) {
    if let Before::Irreversible { reason } = &before
        && journal.settings().policy == Policy::Strict
    {
        let what = format!("{call} {}: {reason}", path.display_lossy());
        return (refuse(journal, call, what, libc::EACCES), None);
    }
    let seq = journal.record(call, Op::Change { path, before: before.clone() });
    (pending_of(caller, &before, seq), Some(seq))
}

/// The size word of a capture-index entry that says a directory's times are journaled (no
/// file is this long, so it never matches a capture of contents).
const DIR_TIMES_SIZE: u64 = u64::MAX - 2;

/// Journals the times of `t`'s directory before a call makes, removes or renames a name in
/// it, the first time the session does so there: the capture index remembers the directory
/// (by device, inode and birth time, and the number of marks made so far: once per turn) for
/// every process of the session. An entry evicted or a process that cannot map the index only
/// journals the times again, later, which undo ignores (the oldest record it undoes wins).
fn note_dir_times<J: Journal>(journal: &J, call: &str, t: &Target<'_>) {
    use aether_journal::capture::{CaptureIndex, CaptureKey};
    use rustix::fs::StatxFlags;
    use std::sync::atomic::{AtomicU64, Ordering};
    // The directory this process noted last, by a hash of its path and the names generation
    // then: a run of changes in one directory (tar, a build) costs one look, not one each. A
    // directory replaced at that path needs a rename or removal of a directory, which moves
    // the generation on; while one is under way nothing is remembered (0).
    static LAST: AtomicU64 = AtomicU64::new(0);
    let Some((parent, _)) = t.abs.split_parent() else { return };
    let turn = journal.counters().marks();
    let last = journal.counters().names_settled().map_or(0, |names| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (parent, names, turn).hash(&mut h);
        h.finish() | 1
    });
    if last != 0 && LAST.load(Ordering::Relaxed) == last {
        return;
    }
    // A name resolved through a trusted directory path may still hold slashes (`d/x`
    // relative to the cwd): its directory is then the part before the last one.
    let (dir, flags): (&[u8], AtFlags) = match t.name.iter().rposition(|&c| c == b'/') {
        Some(i) => (&t.name[..i.max(1)], AtFlags::SYMLINK_NOFOLLOW),
        None => (b"", AtFlags::EMPTY_PATH),
    };
    let Ok(sx) = rustix::fs::statx(t.parent.as_fd(), dir, flags, StatxFlags::BASIC_STATS | StatxFlags::BTIME) else {
        return;
    };
    if FileType::from_raw_mode(u32::from(sx.stx_mode)) != FileType::Directory {
        return;
    }
    let ident = Ident { dev: rustix::fs::makedev(sx.stx_dev_major, sx.stx_dev_minor), ino: sx.stx_ino };
    let btime = if StatxFlags::from_bits_retain(sx.stx_mask).contains(StatxFlags::BTIME) {
        sx.stx_btime.tv_sec.saturating_mul(1_000_000_000).saturating_add(i64::from(sx.stx_btime.tv_nsec))
    } else {
        0
    };
    let key = CaptureKey { ident, size: DIR_TIMES_SIZE, mtime_ns: btime, ctime_ns: turn as i64 };
    let index = journal.index();
    if index.is_some_and(|i| i.find(&key).is_some()) {
        LAST.store(last, Ordering::Relaxed);
        return;
    }
    let op = Op::DirTimes(Box::new(DirTimesOp {
        path: BPath::new(parent.to_vec()),
        ident,
        atime: [sx.stx_atime.tv_sec, i64::from(sx.stx_atime.tv_nsec)],
        mtime: [sx.stx_mtime.tv_sec, i64::from(sx.stx_mtime.tv_nsec)],
    }));
    let seq = journal.record(call, op);
    if let Some(i) = index {
        i.remember(&key, seq);
    }
    LAST.store(last, Ordering::Relaxed);
}

/// Refuses (always, whatever the policy) a call that would change the session's own store.
fn protect<J: Journal>(journal: &J, call: &str, path: &BPath) -> Pending {
    let what = format!("{call} {} would change this session's own journal store", path.display_lossy());
    refuse(journal, call, what, libc::EACCES)
}

/// Journals a refusal (strict policy, or the session's own store).
pub fn refuse<J: Journal>(journal: &J, call: &str, what: String, errno: i32) -> Pending {
    journal.record(call, Op::Refused { what: what.into(), errno });
    Pending::Refuse(errno)
}

/// `lstat` of a target. `Err` carries what the hook must do instead: nothing when the real
/// call will fail anyway, or the outcome of journaling an unexpected error.
fn stat_target<J: Journal>(journal: &J, call: &str, t: &Target<'_>) -> Result<Option<Stat>, Pending> {
    match t.looked {
        // Looked at while it was resolved, an instant ago.
        Looked::Present(st) => return Ok(Some(st)),
        Looked::Absent => return Ok(None),
        Looked::No => {}
    }
    match rustix::fs::statat(t.parent.as_fd(), t.name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) if call_will_fail(e) => Err(Pending::Nothing),
        Err(e) => Err(irreversible(journal, call, t.abs.clone(), "stat", io::Error::from(e).to_string())),
    }
}

/// The target of a call that acts on something existing, with its `lstat`; or what the hook
/// must do instead (nothing when it does not exist: the call will fail).
fn existing_target<'a, J: Journal, C: Caller>(
    journal: &J,
    caller: &'a C,
    call: &str,
    dirfd: i32,
    path: &[u8],
    follow: bool,
) -> Result<(Target<'a>, Stat), Pending> {
    let t = target_or_record(journal, caller, call, dirfd, path, follow)?;
    match stat_target(journal, call, &t)? {
        Some(st) => Ok((t, st)),
        None => Err(Pending::Nothing),
    }
}

/// The target of a call, or what the hook must do instead (nothing when the call will fail or
/// the path is not journaled; the outcome of journaling an unresolvable path).
pub fn target_or_record<'a, J: Journal, C: Caller>(
    journal: &J,
    caller: &'a C,
    call: &str,
    dirfd: i32,
    path: &[u8],
    follow: bool,
) -> Result<Target<'a>, Pending> {
    match locate(journal, caller, dirfd, path, follow) {
        Resolved::Target(t) => Ok(t),
        Resolved::WillFail | Resolved::Excluded => Err(Pending::Nothing),
        Resolved::Protected(p) => Err(protect(journal, call, &p)),
        Resolved::Unknown(p, why) => Err(irreversible(journal, call, p, "resolve the path", why)),
    }
}

fn pending_of<C: Caller>(caller: &C, before: &Before, seq: u64) -> Pending {
    match before {
        Before::Contents(s) => match &s.node {
            Node::File { blob, how: CaptureHow::Link, .. } => Pending::Linked { blob: blob.clone(), seq },
            Node::Packed { .. } | Node::File { how: CaptureHow::Copy | CaptureHow::Reflink, .. } => {
                // Bytes and metadata are kept apart from the inode: any later change to it
                // through a descriptor is undone by restoring this capture.
                caller.cover(s.ident);
                Pending::Nothing
            }
            _ => Pending::Nothing,
        },
        _ => Pending::Nothing,
    }
}

/// A call that may change where directory paths lead (a rename, an unlink, an rmdir): every
/// process of the session is told through the shared names generation, moved before the call
/// (when this is dropped, at the end of the work before the call) and counted done after it
/// (by the caller: the shim after its real call, the supervisor once it knows the call has
/// run), so that none trusts a remembered directory path the call may make or has made wrong.
/// Started before the call's target is known; taken back once it is known to be a plain file,
/// whose removal or move cannot change where a directory path leads.
struct NamesChange<'a, J: Journal, C: Caller> {
    journal: &'a J,
    caller: &'a C,
    needed: std::cell::Cell<bool>,
}

impl<'a, J: Journal, C: Caller> NamesChange<'a, J, C> {
    fn begin(journal: &'a J, caller: &'a C) -> Self {
        NamesChange { journal, caller, needed: std::cell::Cell::new(true) }
    }

    /// Once the call's ends are known: whether one of them leads somewhere.
    fn only_if(&self, leads: bool) {
        self.needed.set(leads);
    }
}

impl<J: Journal, C: Caller> Drop for NamesChange<'_, J, C> {
    fn drop(&mut self) {
        if self.needed.get() {
            self.journal.counters().names_changing();
            self.caller.names_changing();
        }
    }
}

/// Whether a path may lead through a node of this kind to other nodes.
fn leads(st: &Stat) -> bool {
    matches!(FileType::from_raw_mode(st.st_mode), FileType::Directory | FileType::Symlink)
}

/// The born table's reason a file needs no capture, as the record says it.
fn before_of(origin: Origin) -> Before {
    match origin {
        Origin::Born(created) => Before::Born { created },
        Origin::Kept(by) => Before::Kept { by },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_name_directly_in_dev_is_excluded_without_resolving_it() {
        // Device nodes every Linux system has, and a name that is not there (a file created in
        // /dev is left out as well).
        for path in [&b"/dev/null"[..], b"/dev/zero", b"/dev/aether-journal-no-such-node"] {
            assert!(plainly_excluded(path), "{}", String::from_utf8_lossy(path));
            assert!(excluded(path), "plainly excluded must imply excluded");
        }
        // Symlinks (/dev/stdout leads to whatever descriptor 1 is, a file in the tree maybe),
        // deeper names, /dev/shm (ordinary files), relative and degenerate names: resolved as
        // usual.
        let stdout_is_link =
            rustix::fs::lstat("/dev/stdout").is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
        assert!(stdout_is_link, "the test needs /dev/stdout to be a symlink, as on every Linux system");
        for path in [
            &b"/dev/stdout"[..],
            b"/dev/fd",
            b"/dev/fd/1",
            b"/dev/shm",
            b"/dev/shm/x",
            b"/dev/",
            b"/dev/.",
            b"/dev/..",
            b"dev/null",
            b"/devnull",
            b"/dev//null",
        ] {
            assert!(!plainly_excluded(path), "{}", String::from_utf8_lossy(path));
        }
    }
}
