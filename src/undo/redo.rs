//! Every undo is journaled, so that it can be taken back: before an undo removes, renames,
//! makes or rewrites a name, or sets a node's metadata, it captures what is there into a
//! journal of its own, `undos/N/` in the session (the same record format and capture
//! strategies as the session's, in a store of its own). `redo` is then an undo of that
//! journal: it puts every path back as it was just before the undo, newest change first,
//! with drift protection against the state the undo left (sealed when it ended).
//!
//! Each record is written before the change it describes (one `write(2)`), so an undo that is
//! killed leaves a journal of everything it did. The next undo of the session takes the paths
//! that journal names as that undo's work, not as changes made since the session (see
//! [`interrupted_paths`]): it finishes the job instead of reporting its own steps as conflicts.
//!
//! What this module cannot do: journal what the undo could not journal (a capture over the
//! session's budgets is `irreversible` here as anywhere, and the redo says so), or redo an
//! undo whose journal is gone.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};

use crate::bpath::BPath;
use crate::byteset::PathSet;
use crate::capture::{Capturer, Counters, Direct, Intent, ident_of, meta_before};
use crate::config::Budget;
use crate::journal::JournalWriter;
use crate::record::{Before, DirTimesOp, MetaKind, Op, Record, RenameOp, Version, XattrBefore};

/// The directory (in the session) holding one journal per undo, `1`, `2`, ...
pub const UNDOS_DIR: &str = "undos";

/// In an undo's journal directory: written once a redo has taken it back.
pub const REDONE_FILE: &str = "redone";

/// In an undo's journal directory: the session's records the undo reversed, one per line
/// (a redo makes them not undone again).
pub const REVERSED_FILE: &str = "reversed";

/// The journal an undo in progress writes.
pub(super) struct UndoLog {
    dir: PathBuf,
    writer: JournalWriter,
    pending: RefCell<Vec<u8>>,
    pending_records: Cell<u64>,
    blobs: OwnedFd,
    next: Cell<u64>,
    kept: Cell<u64>,
    budget: Budget,
    /// Every path a record names, and which of them this undo made (what it does to them
    /// later needs no record of its own) or removed and did not make again (absent when it
    /// ends, without looking). The seal of the undo is taken of them when it ends, without
    /// reading its journal back.
    paths: RefCell<Paths>,
    /// Directories whose times are journaled already.
    dirs: RefCell<HashSet<Vec<u8>>>,
    /// Records that could not be written.
    lost: Cell<u64>,
    /// Records whose prior state could not be kept (over a budget, a full store), and the
    /// reason of the first.
    not_kept: Cell<u64>,
    not_kept_why: RefCell<Option<String>>,
    written: Cell<u64>,
    /// This program, and the call every record of an undo names (`undo`).
    origin: crate::record::Origin,
    /// This process's id, for every record (asked once).
    pid: u32,
    /// The inodes the session's records name by identity ([`named_inodes`]): one of them that
    /// the undo removes is kept as itself, never as a copy.
    named: HashSet<crate::record::Ident>,
    /// Where small files it removes are copied ([`crate::capture::Capturer::capture_small_doomed`]),
    /// begun with the first.
    pack: RefCell<Option<crate::pack::Pack>>,
}

/// What an undo's journal holds when the undo ends ([`UndoLog::finish`]).
pub(super) struct Finished {
    /// Its directory.
    pub(super) dir: PathBuf,
    /// Records written.
    pub(super) written: u64,
    /// The seq of its last record.
    pub(super) last_seq: u64,
    /// Every path its records name, once each, and what the undo did to it.
    pub(super) paths: Paths,
    /// Records that could not be written.
    pub(super) lost: u64,
    /// Records whose prior state could not be kept, and why the first could not.
    pub(super) not_kept: (u64, Option<String>),
}

/// A path an undo made ([`Paths::mark`]).
pub(super) const MADE: u8 = 1;
/// A path an undo removed and did not make again: absent when it ends.
pub(super) const REMOVED: u8 = 2;

/// A path an undo's journal names (a mark of the paths the seal holds: those it does not hold
/// are named by being in [`Paths::set`]).
const NAMED: u8 = 4;

/// Every path an undo's journal names, once each, with what the undo did to each ([`MADE`],
/// [`REMOVED`]). A path the session's seal holds is marked by its index there (the seal holds
/// every path the session's records name: an undo of a million removals names a million
/// paths, which were 25 MB more held again); any other is held in one buffer of its own.
#[derive(Debug, Default)]
pub(super) struct Paths {
    /// The session's sealed paths, and the marks of each by its index there.
    sealed: Option<(std::sync::Arc<PathSet>, Vec<u8>)>,
    /// The paths the seal does not hold.
    set: PathSet,
    /// The marks of each path of `set`, by its index there.
    marks: Vec<u8>,
}

impl Paths {
    /// Paths marked by their index in `sealed` (the session's seal's, when it has one), or held.
    pub(super) fn new(sealed: Option<std::sync::Arc<PathSet>>) -> Paths {
        Paths { sealed: sealed.map(|names| (names.clone(), vec![0; names.len()])), ..Default::default() }
    }

    /// The marks of `path`, if it is named.
    fn marks_of(&self, path: &[u8]) -> Option<u8> {
        if let Some((names, marks)) = &self.sealed
            && let Some(i) = names.index_of(path)
        {
            return Some(marks[i]).filter(|m| m & NAMED != 0);
        }
        self.set.index_of(path).map(|i| self.marks[i])
    }

    /// The marks of `path`, counting it among those the journal names.
    fn touch(&mut self, path: &[u8]) -> &mut u8 {
        if let Some((names, marks)) = &mut self.sealed
            && let Some(i) = names.index_of(path)
        {
            marks[i] |= NAMED;
            return &mut marks[i];
        }
        let (i, _) = self.set.insert_full(path);
        if i >= self.marks.len() {
            self.marks.resize(i + 1, 0);
        }
        &mut self.marks[i]
    }

    /// Whether `path` is marked `mark`.
    fn has(&self, path: &[u8], mark: u8) -> bool {
        self.marks_of(path).is_some_and(|m| m & mark != 0)
    }

    /// Marks `path` (counting it among those named).
    fn mark(&mut self, path: &[u8], mark: u8) {
        *self.touch(path) |= mark;
    }

    /// Takes `mark` off `path`: whether it had it.
    fn unmark(&mut self, path: &[u8], mark: u8) -> bool {
        if !self.has(path, mark) {
            return false;
        }
        *self.touch(path) &= !mark;
        true
    }

    /// Whether the undo left `path` absent (it removed it and did not make it again).
    pub(super) fn left_absent(&self, path: &[u8]) -> bool {
        self.has(path, REMOVED)
    }

    /// Every path named, whole: those the seal holds, in its order, then the others.
    pub(super) fn iter(&self) -> impl Iterator<Item = Vec<u8>> + '_ {
        let sealed = self.sealed.iter().flat_map(|(names, marks)| {
            marks.iter().enumerate().filter(|(_, m)| **m & NAMED != 0).filter_map(|(i, _)| names.get(i))
        });
        sealed.chain(self.set.iter())
    }
}

impl Counters for UndoLog {
    fn next_id(&self) -> u64 {
        let n = self.next.get() + 1;
        self.next.set(n);
        n
    }
    fn bytes_kept(&self) -> u64 {
        self.kept.get()
    }
    fn add_bytes_kept(&self, n: u64) {
        self.kept.set(self.kept.get() + n);
    }
}

impl crate::capture::Packer for UndoLog {
    fn append(&self, blobs: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<(String, u64)> {
        let mut slot = self.pack.borrow_mut();
        let mut pack = match slot.take().filter(|p| p.has_room(bytes.len() as u64)) {
            Some(pack) => pack,
            None => crate::pack::Pack::create(&Direct, blobs, self.next_id(), false)?,
        };
        let placed = pack.append(bytes, false).map(|at| (pack.name.clone(), at));
        *slot = Some(pack);
        placed
    }
}

thread_local! {
    /// The journal of the undo running on this thread, if it journals (a real undo, not a dry
    /// run or a redo).
    static LOG: RefCell<Option<Rc<UndoLog>>> = const { RefCell::new(None) };
}

/// The next free `undos/N` of a session.
fn next_dir(session: &Path) -> PathBuf {
    let root = session.join(UNDOS_DIR);
    let highest = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    root.join((highest + 1).to_string())
}

impl UndoLog {
    /// Opens a new undo journal in the session at `session`, whose seal's paths (if it has a
    /// seal) are `sealed` (see [`Paths::new`]).
    pub(super) fn create(
        session: &Path,
        budget: Budget,
        named: HashSet<crate::record::Ident>,
        sealed: Option<std::sync::Arc<PathSet>>,
    ) -> std::io::Result<UndoLog> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = next_dir(session);
        std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir.join(crate::session::BLOBS_DIR))?;
        let writer = JournalWriter::open(&dir.join(crate::session::JOURNAL_FILE))?;
        let blobs = rustix::fs::open(
            dir.join(crate::session::BLOBS_DIR).as_path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let prog = std::env::current_exe().map(|p| BPath::from(p.as_path())).unwrap_or_default();
        Ok(UndoLog {
            dir,
            writer,
            pending: RefCell::new(Vec::with_capacity(64 << 10)),
            pending_records: Cell::new(0),
            blobs,
            next: Cell::new(0),
            kept: Cell::new(0),
            budget,
            paths: RefCell::new(Paths::new(sealed)),
            dirs: Default::default(),
            lost: Cell::new(0),
            not_kept: Cell::new(0),
            not_kept_why: RefCell::new(None),
            written: Cell::new(0),
            origin: crate::record::Origin::new(prog, "undo".into()),
            pid: std::process::id(),
            named,
            pack: RefCell::new(None),
        })
    }

    /// Makes this the journal of the undo running on this thread until [`UndoLog::finish`].
    pub(super) fn start(self) -> Rc<UndoLog> {
        let log = Rc::new(self);
        LOG.with(|l| *l.borrow_mut() = Some(log.clone()));
        log
    }

    /// Stops journaling; returns what it journaled.
    pub(super) fn finish(&self) -> Finished {
        LOG.with(|l| *l.borrow_mut() = None);
        self.flush();
        Finished {
            dir: self.dir.clone(),
            written: self.written.get(),
            last_seq: self.next.get(),
            paths: self.paths.take(),
            lost: self.lost.get(),
            not_kept: (self.not_kept.get(), self.not_kept_why.take()),
        }
    }

    fn flush(&self) {
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            return;
        }
        let n = self.pending_records.replace(0);
        match crate::capture::write_all(self.writer.fd(), &pending) {
            Ok(()) => self.written.set(self.written.get() + n),
            Err(_) => self.lost.set(self.lost.get() + n),
        }
        pending.clear();
    }

    /// Journals `op`, written now with every record before it.
    fn record(&self, op: Op) -> u64 {
        let seq = self.record_held(op);
        self.flush();
        seq
    }

    /// Journals `op` without writing it yet: the caller makes its change only after
    /// [`flush_held`] (the removal thread hands a batch of removals over once their records
    /// are written, one `write` for them all).
    fn record_held(&self, op: Op) -> u64 {
        if let Some(Before::Irreversible { reason }) = op.before() {
            self.not_kept.set(self.not_kept.get() + 1);
            self.not_kept_why.borrow_mut().get_or_insert_with(|| reason.to_string());
        }
        {
            let mut paths = self.paths.borrow_mut();
            match &op {
                Op::Change { path, .. } | Op::Meta { path, .. } => {
                    paths.touch(path.as_bytes());
                }
                Op::Rename(m) => {
                    paths.touch(m.from.as_bytes());
                    paths.touch(m.to.as_bytes());
                }
                _ => {}
            }
        }
        let seq = self.next_id();
        let rec = Record {
            v: Version,
            seq,
            time: crate::record::Stamp::now(),
            pid: self.pid,
            ppid: 0,
            origin: self.origin.clone(),
            op,
        };
        let line = crate::journal::encode_line(&rec);
        self.pending.borrow_mut().extend_from_slice(&line);
        self.pending_records.set(self.pending_records.get() + 1);
        seq
    }

    fn capturer(&self) -> Capturer<'_> {
        Capturer {
            blobs: self.blobs.as_fd(),
            budget: self.budget,
            counters: self,
            sync: false,
            index: None,
            calls: &Direct,
            pack: Some(self),
        }
    }

    /// The directory `path`'s times, once, before the undo first changes its entries.
    fn note_dir(&self, path: &[u8]) {
        if !self.dirs.borrow_mut().insert(path.to_vec()) || self.paths.borrow().has(path, MADE) {
            return;
        }
        if let Ok(st) = rustix::fs::lstat(path)
            && FileType::from_raw_mode(st.st_mode) == FileType::Directory
        {
            self.record(Op::DirTimes(Box::new(DirTimesOp {
                path: BPath::new(path.to_vec()),
                ident: ident_of(&st),
                atime: [st.st_atime, st.st_atime_nsec as i64],
                mtime: [st.st_mtime, st.st_mtime_nsec as i64],
            })));
        }
    }
}

/// Runs `f` with the undo journal of this thread, if there is one.
fn with_log(f: impl FnOnce(&UndoLog)) {
    let log = LOG.with(|l| l.borrow().clone());
    if let Some(log) = log {
        f(&log);
    }
}

fn child(dir: &[u8], name: &[u8]) -> Vec<u8> {
    crate::bpath::join(dir, name)
}

/// Every inode `records` name by identity: a file a rename moved, a node whose prior state or
/// metadata was kept. An undo that removes one of them keeps that very inode (moved into its
/// store), so that after a redo puts it back, another undo finds the inode the records name
/// (a copy put back would be another inode, and a conflict).
pub(super) fn named_inodes(records: &[crate::record::Record]) -> HashSet<crate::record::Ident> {
    let mut named = HashSet::new();
    let of_before = |b: &Before, named: &mut HashSet<_>| {
        if let Before::Contents(snap) = b {
            named.insert(snap.ident);
            if let crate::record::Node::File { twin: Some(twin), .. } = &snap.node {
                named.insert(*twin);
            }
        }
    };
    for r in records {
        match &r.op {
            Op::Change { before, .. } => of_before(before, &mut named),
            Op::Rename(m) => {
                named.extend(m.moved);
                of_before(&m.to_before, &mut named);
            }
            Op::Meta { before, .. } => {
                named.insert(before.ident);
            }
            _ => {}
        }
    }
    named
}

/// Removes the regular file `name` (whose `lstat` is `st`) from `dir` (at `path`), keeping it
/// for `redo` the cheapest way: a small file with one name, whose inode no record of the
/// session names ([`named_inodes`]), copied into this undo's pack (see
/// [`crate::capture::Capturer::capture_small_doomed`]; its removal may be queued, see
/// [`super::remover`]), any other moved into its store,
/// journaled as kept by link: one rename instead of a link and an unlink in what may be a
/// directory of many thousands of names (an undo of 100,000 creations spent more time linking
/// than removing). `None` when no undo journal is kept, or the move cannot be made (the store
/// on another file system): the caller removes the name itself.
pub(super) fn remove_keeping(
    path: &std::rc::Rc<[u8]>,
    dir: BorrowedFd<'_>,
    name: &[u8],
    st: &Stat,
) -> Option<Result<(), rustix::io::Errno>> {
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return None;
    }
    let log = LOG.with(|l| l.borrow().clone())?;
    let p = child(path, name);
    if log.paths.borrow().has(&p, MADE) {
        return None;
    }
    log.note_dir(path);
    let small = (!log.named.contains(&ident_of(st))).then(|| log.capturer().capture_small_doomed(dir, name, st));
    if let Some(before) = small.flatten() {
        // Journaled before the removal, and taken back with a call_failed record if it fails.
        let seq = log.record_held(Op::Change { path: BPath::new(p.clone()), before });
        return Some(match super::remover::unlink(path, dir, name, Some(seq)) {
            Ok(()) => {
                log.paths.borrow_mut().mark(&p, REMOVED);
                Ok(())
            }
            Err(e) => {
                log.record(Op::CallFailed { of_seq: seq, errno: e.raw_os_error() });
                Err(e)
            }
        });
    }
    let blob = crate::capture::blob_name(log.next_id());
    // Journaled before the move (an undo killed right after it leaves its record), and taken
    // back with a call_failed record if the move does not happen.
    let node = crate::record::Node::File {
        blob: blob.clone(),
        size: st.st_size as u64,
        hash: None,
        how: crate::record::CaptureHow::Link,
        twin: None,
    };
    let seq = log.record(Op::Change {
        path: BPath::new(p.clone()),
        before: Before::contents(crate::capture::snapshot_meta(st, node)),
    });
    let moved = crate::capture::in_shard(&Direct, log.blobs.as_fd(), &blob, || {
        rustix::fs::renameat_with(dir, name, log.blobs.as_fd(), blob.as_str(), RenameFlags::NOREPLACE)
    });
    match moved {
        Ok(()) => {
            log.paths.borrow_mut().mark(&p, REMOVED);
            Some(Ok(()))
        }
        Err(e) => {
            log.record(Op::CallFailed { of_seq: seq, errno: e.raw_os_error() });
            if e == rustix::io::Errno::XDEV { None } else { Some(Err(e)) }
        }
    }
}

/// Writes the records of this thread's undo journal not yet written (see
/// [`UndoLog::record_held`]).
pub(super) fn flush_held() {
    with_log(|log| log.flush());
}

/// A removal handed to the removal thread after its record `logged` failed with `errno`: the
/// record is taken back, and `path` is not absent for the seal of this undo.
pub(super) fn removal_failed(logged: Option<u64>, path: &[u8], errno: rustix::io::Errno) {
    with_log(|log| {
        if let Some(seq) = logged {
            log.record(Op::CallFailed { of_seq: seq, errno: errno.raw_os_error() });
        }
        log.paths.borrow_mut().unmark(path, REMOVED);
    });
}

/// Before the undo removes `name` (whose `lstat` is `st`) from the directory `dir` (at `path`).
pub(super) fn before_remove(path: &[u8], dir: BorrowedFd<'_>, name: &[u8], st: &Stat) {
    with_log(|log| {
        log.note_dir(path);
        let p = child(path, name);
        if log.paths.borrow_mut().unmark(&p, MADE) {
            // Made by this undo and removed again: the redo has nothing to put back.
            return;
        }
        let before = log.capturer().capture_stat(dir, name, st, Intent::Destroy);
        log.paths.borrow_mut().mark(&p, REMOVED);
        log.record(Op::Change { path: BPath::new(p), before });
    });
}

/// Before the undo renames `name` in `dir` (at `path`) to `to_name` in `to` (at `to_path`).
pub(super) fn before_rename(
    path: &[u8],
    dir: BorrowedFd<'_>,
    name: &[u8],
    to_path: &[u8],
    to: BorrowedFd<'_>,
    to_name: &[u8],
    flags: RenameFlags,
) {
    with_log(|log| {
        log.note_dir(path);
        log.note_dir(to_path);
        let (from, dest) = (child(path, name), child(to_path, to_name));
        let moved = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok().map(|st| ident_of(&st));
        let to_before = if flags.contains(RenameFlags::EXCHANGE) {
            Before::Absent
        } else {
            log.capturer().capture(to, to_name, Intent::Destroy)
        };
        let mut paths = log.paths.borrow_mut();
        if paths.unmark(&from, MADE) {
            paths.mark(&dest, MADE);
        }
        paths.unmark(&dest, REMOVED);
        if !flags.contains(RenameFlags::EXCHANGE) {
            paths.mark(&from, REMOVED);
        }
        drop(paths);
        log.record(Op::Rename(Box::new(RenameOp {
            from: BPath::new(from),
            to: BPath::new(dest),
            flags: flags.bits(),
            moved,
            to_before,
        })));
    });
}

/// Before the undo makes `name` (which is absent) in `dir` (at `path`).
pub(super) fn before_make(path: &[u8], name: &[u8]) {
    with_log(|log| {
        log.note_dir(path);
        let p = child(path, name);
        let mut paths = log.paths.borrow_mut();
        paths.mark(&p, MADE);
        paths.unmark(&p, REMOVED);
        drop(paths);
        log.record(Op::Change { path: BPath::new(p), before: Before::Absent });
    });
}

/// Before the undo rewrites the regular file `name` in `dir` (at `path`) in place.
pub(super) fn before_rewrite(path: &[u8], dir: BorrowedFd<'_>, name: &[u8], st: &Stat) {
    with_log(|log| {
        let p = child(path, name);
        if log.paths.borrow().has(&p, MADE) {
            return;
        }
        let before = log.capturer().capture_stat(dir, name, st, Intent::Overwrite);
        log.record(Op::Change { path: BPath::new(p), before });
    });
}

/// Before the undo sets `what` of the node at `path` (open as `node`; `xattr`: the
/// attribute's name).
pub(super) fn before_meta(path: &[u8], node: BorrowedFd<'_>, what: MetaKind, xattr: Option<&[u8]>) {
    with_log(|log| {
        if log.paths.borrow().has(path, MADE) {
            return;
        }
        let Ok(st) = rustix::fs::fstat(node) else { return };
        if what == MetaKind::Times && FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            // Set back last by the redo, as a directory's times are.
            log.note_dir(path);
            return;
        }
        let xattr = xattr.map(|name| {
            let value = crate::capture::xattr_value(path, name).ok().flatten().map(crate::record::Bytes);
            XattrBefore { name: BPath::new(name.to_vec()), value }
        });
        let mut before = meta_before(&st, what, xattr);
        if what == MetaKind::Flags {
            before.flags = rustix::fs::open(
                path,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )
            .ok()
            .and_then(|fd| crate::capture::inode_flags(fd.as_fd()).ok());
        }
        log.record(Op::Meta { path: BPath::new(path.to_vec()), before: before.into() });
    });
}

/// Ends an undo's journal at `dir`: the session records it reversed, and the state it left
/// (its seal, what a redo compares against). A journal that holds nothing is removed.
pub(super) fn close(done: Finished, reversed: &super::Seqs) {
    if done.written == 0 {
        let _ = std::fs::remove_dir_all(&done.dir);
        return;
    }
    let text: String = reversed.iter().map(|s| format!("{s}\n")).collect();
    let _ = crate::session::write_atomically(&done.dir.join(REVERSED_FILE), text.trim_end().as_bytes());
    // The state of every path the undo changed, from the paths it journaled (its journal is
    // not read back: its records hold every capture); its kept inodes are not hashed (they
    // were this undo's own moves and links, a moment ago).
    let mut touched: Vec<BPath> = done.paths.iter().map(BPath::new).collect();
    touched.sort_unstable();
    let mut seal = crate::seal::take_seal_of_paths(touched, done.last_seq, |p| done.paths.left_absent(p));
    seal.journal_digest = crate::digest::JournalDigest::take(&done.dir, false).ok();
    let _ = seal.write(&done.dir);
}

thread_local! {
    /// The paths the session's interrupted undos changed (see [`interrupted_paths`]), for the
    /// undo running on this thread.
    static RESUMED: RefCell<HashSet<Vec<u8>>> = RefCell::new(HashSet::new());
}

/// How the name of a file an undo writes beside the one it restores begins (see
/// [`beside_name`]).
pub const BESIDE_PREFIX: &str = ".aether-undo-";

/// A name, in the directory of a file being restored, for the new file written there before
/// it is moved into place: this process's id and a count, after [`BESIDE_PREFIX`].
pub(super) fn beside_name() -> Vec<u8> {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{BESIDE_PREFIX}{}-{n}", std::process::id()).into_bytes()
}

/// What the session's undos that never ended (killed: no `reversed` file) left: the paths
/// their journals name, those journals, and the files they were writing beside the files they
/// restored (each journaled as made from nothing before it was made). The state such an undo
/// left is its own work, which the next undo finishes; what it wrote beside, the next undo
/// removes.
pub(super) struct Interrupted {
    pub paths: HashSet<Vec<u8>>,
    pub dirs: Vec<PathBuf>,
    pub beside: Vec<BPath>,
}

/// See [`Interrupted`].
pub(super) fn interrupted_paths(session: &crate::session::Session) -> Interrupted {
    let root = session.dir().join(UNDOS_DIR);
    let mut paths = HashSet::new();
    let mut dirs = Vec::new();
    let mut beside = Vec::new();
    for d in std::fs::read_dir(&root).into_iter().flatten().flatten().map(|e| e.path()) {
        if d.join(REVERSED_FILE).exists() || d.join(REDONE_FILE).exists() {
            continue;
        }
        let Ok(j) = crate::journal::read_with_segments(&d.join(crate::session::JOURNAL_FILE), &d.join("none")) else {
            continue;
        };
        for r in &j.records {
            paths.extend(crate::select::record_paths(r).into_iter().map(|p| p.as_bytes().to_vec()));
            match &r.op {
                Op::DirTimes(d) => {
                    paths.insert(d.path.as_bytes().to_vec());
                }
                Op::Change { path, before: Before::Absent }
                    if path.split_parent().is_some_and(|(_, n)| n.starts_with(BESIDE_PREFIX.as_bytes())) =>
                {
                    beside.push(path.clone());
                }
                _ => {}
            }
        }
        dirs.push(d);
    }
    Interrupted { paths, dirs, beside }
}

/// Makes `paths` the interrupted undos' work for the undo that runs next on this thread.
pub(super) fn resume(paths: HashSet<Vec<u8>>) {
    RESUMED.with(|r| *r.borrow_mut() = paths);
}

/// Whether an interrupted undo changed `path` (its state is that undo's work).
pub(super) fn resumed(path: &[u8]) -> bool {
    RESUMED.with(|r| r.borrow().contains(path))
}

/// The newest undo of `session` no redo has taken back yet.
pub fn last_undo(session: &crate::session::Session) -> Option<PathBuf> {
    let root = session.dir().join(UNDOS_DIR);
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u64>().ok()?, e.path())))
        .collect();
    dirs.sort();
    dirs.into_iter().rev().map(|(_, d)| d).find(|d| !d.join(REDONE_FILE).exists())
}

/// Takes back the newest undo of `session` not yet taken back: every path it changed is put
/// back as it was just before it, newest change first, with the same outcomes, drift
/// protection (against the state the undo left) and completeness as an undo. The session's
/// records that undo reversed count as not undone again, so a later undo reverses them anew.
pub fn redo_session(
    session: &crate::session::Session,
    opts: &super::UndoOptions,
) -> Result<super::Report, crate::session::SessionError> {
    use crate::session::SessionError;
    let io_at = |p: &Path| {
        let p = p.to_path_buf();
        move |source| SessionError::Io { path: p, source }
    };
    let Some(dir) = last_undo(session) else {
        return Err(SessionError::Io {
            path: session.dir().join(UNDOS_DIR),
            source: std::io::Error::other("there is no undo of this session to take back"),
        });
    };
    let journal_path = dir.join(crate::session::JOURNAL_FILE);
    let mut journal =
        crate::journal::read_with_segments(&journal_path, &dir.join("none")).map_err(io_at(&journal_path))?;
    let seal = crate::seal::Seal::read(&dir).map_err(io_at(&dir))?;
    if let Some(seal) = &seal {
        journal.set_aside_unsealed(seal);
        journal.set_aside_altered(seal, &dir).map_err(io_at(&journal_path))?;
    }
    let blobs = dir.join(crate::session::BLOBS_DIR);
    let (none, no_times) = (super::SeqSet::default(), super::SeqTimes::default());
    let plan = super::Plan {
        journal: &journal,
        blobs_dir: &blobs,
        opts,
        seal: seal.as_ref(),
        already: &none,
        undo_times: &no_times,
        only: None,
        earlier_undo: true,
    };
    let mut report = super::run_plan(&plan, &mut |_, _| {}).map_err(io_at(&blobs))?;
    report.coverage = session.coverage();
    // An incomplete redo is left to be run again (with `--force`, say): what it did is as
    // before the undo, and a second run finds it so.
    if !opts.dry_run && report.complete {
        let reversed: Vec<u64> = std::fs::read_to_string(dir.join(REVERSED_FILE))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        super::plan::note_redone(session, &reversed).map_err(io_at(session.dir()))?;
        let _ = crate::session::write_atomically(&dir.join(REDONE_FILE), crate::session::now_rfc3339().as_bytes());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undo_marks_the_paths_the_seal_holds_by_their_index_and_holds_only_the_others() {
        let mut names = PathSet::new();
        for p in ["/t/a", "/t/b", "/t/c"] {
            names.insert(p.as_bytes());
        }
        let mut paths = Paths::new(Some(std::sync::Arc::new(names)));
        paths.mark(b"/t/b", REMOVED);
        paths.mark(b"/t/new", MADE);
        paths.touch(b"/t/c");
        assert_eq!(paths.set.len(), 1, "only the path the seal does not hold is held again");
        assert!(paths.left_absent(b"/t/b") && !paths.left_absent(b"/t/a") && !paths.left_absent(b"/t/c"));
        assert!(paths.has(b"/t/new", MADE));
        assert!(paths.unmark(b"/t/b", REMOVED) && !paths.unmark(b"/t/b", REMOVED) && !paths.unmark(b"/t/a", MADE));
        let named: Vec<Vec<u8>> = paths.iter().collect();
        assert_eq!(named, [b"/t/b".to_vec(), b"/t/c".to_vec(), b"/t/new".to_vec()], "every path named, once");
        // Without a seal, every path is held.
        let mut alone = Paths::new(None);
        alone.mark(b"/t/b", REMOVED);
        assert_eq!(alone.set.len(), 1);
        assert!(alone.left_absent(b"/t/b"));
    }
}
