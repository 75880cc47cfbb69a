//! Planning and executing an undo, and the report it produces.
//!
//! Records are replayed newest first. Each one makes its path match the prior state the record
//! kept, deciding from the file system at undo time what is needed: a rename whose source is
//! still in place did not take effect; a file recorded [`Before::Absent`] that is not there was
//! never created. Such steps report [`Outcome::Unchanged`] and do not make the undo incomplete.
//!
//! Every target is reached through its parent directory opened with `RESOLVE_NO_SYMLINKS`, and
//! the final component is never followed: a symlink planted at or above a journaled path after
//! the session cannot redirect a restore; the step is reported [`Outcome::Conflict`].
//!
//! The report names every step. [`Report::complete`] is true only when every step ended
//! restored, removed, recreated or unchanged, and nothing was unreadable or lost.
//!
//! What this module cannot do: reverse what the journal marks irreversible, or restore bytes it
//! cannot verify. A blob that is missing, or whose content no longer matches its recorded hash,
//! is never written back: the step fails and says so.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, RenameFlags, ResolveFlags, Stat, StatxFlags, Timestamps};
use rustix::io::Errno;
use serde::Serialize;

use crate::bpath::BPath;
use crate::capture::{hash_fd, ident_of, write_all};
use crate::journal::JournalContents;
use crate::record::{
    Before, CaptureHow, ConnectResult, MetaBefore, MetaKind, Node, Op, Record, Snapshot, SpecialKind, Xattr,
};
use crate::seal::{AfterState, Expectation, SEAL_FILE, Seal, expectation};
use crate::select::{Selection, select};
use crate::session::{Session, SessionError, State};

/// What happened to one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The path's prior contents (or node) were put back over what the session left.
    Restored,
    /// A path the session created was removed.
    Removed,
    /// A path the session deleted was created again.
    Recreated,
    /// The path was already in its prior state (the call failed, or an earlier step of this
    /// undo already put it back).
    Unchanged,
    /// The step cannot be reversed (an irreversible record); `why` says what it was.
    Skipped,
    /// Reversing the step failed; `why` says how. The path is not in its prior state.
    Failed,
    /// The path changed in a way the journal does not explain (a symlink planted in its way);
    /// it was left alone.
    Conflict,
}

impl Outcome {
    /// Whether the step counts as undone exactly.
    pub fn is_success(self) -> bool {
        matches!(self, Outcome::Restored | Outcome::Removed | Outcome::Recreated | Outcome::Unchanged)
    }

    /// The lower-case name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Restored => "restored",
            Outcome::Removed => "removed",
            Outcome::Recreated => "recreated",
            Outcome::Unchanged => "unchanged",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "failed",
            Outcome::Conflict => "conflict",
        }
    }
}

/// The report line for one step (a rename can produce two: the move, and the destination).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepReport {
    /// The record's sequence number (absent for a record too damaged to name one).
    pub seq: Option<u64>,
    /// What happened.
    pub outcome: Outcome,
    /// The path concerned.
    pub path: Option<BPath>,
    /// What was done, or why it could not be.
    pub why: String,
}

/// Counts of outcomes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Steps restored.
    pub restored: usize,
    /// Steps removed.
    pub removed: usize,
    /// Steps recreated.
    pub recreated: usize,
    /// Steps already in their prior state.
    pub unchanged: usize,
    /// Irreversible steps.
    pub skipped: usize,
    /// Steps that failed.
    pub failed: usize,
    /// Steps left alone because of a conflict.
    pub conflict: usize,
    /// All report lines.
    pub total: usize,
}

/// The result of an undo (or a dry run).
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// True only when every step ended restored, removed, recreated or unchanged.
    pub complete: bool,
    /// Nothing was changed: this is what an undo would do.
    pub dry_run: bool,
    /// The session had already been undone; nothing was done.
    pub already_undone: bool,
    /// One line per step, newest first, then damaged records.
    pub outcomes: Vec<StepReport>,
    /// Things worth knowing that are not steps (a torn tail).
    pub notes: Vec<String>,
    /// Whether drift was checked against a seal (false: the weaker check, or none with force).
    pub sealed: bool,
    /// The records this run undid completely.
    pub undone: Vec<u64>,
    /// What the session's journaling could see (from its header).
    pub coverage: crate::session::Coverage,
}

impl Report {
    /// Counts of each outcome.
    pub fn summary(&self) -> Summary {
        let mut s = Summary { total: self.outcomes.len(), ..Default::default() };
        for o in &self.outcomes {
            *match o.outcome {
                Outcome::Restored => &mut s.restored,
                Outcome::Removed => &mut s.removed,
                Outcome::Recreated => &mut s.recreated,
                Outcome::Unchanged => &mut s.unchanged,
                Outcome::Skipped => &mut s.skipped,
                Outcome::Failed => &mut s.failed,
                Outcome::Conflict => &mut s.conflict,
            } += 1;
        }
        s
    }

    /// The report as the JSON object `undo --json` prints (a documented contract).
    pub fn to_json(&self) -> serde_json::Value {
        let outcomes: Vec<serde_json::Value> = self
            .outcomes
            .iter()
            .map(|o| {
                let mut v = serde_json::json!({
                    "seq": o.seq,
                    "outcome": o.outcome.name(),
                    "path": o.path.as_ref().map(|p| p.display_lossy()),
                    "why": o.why,
                });
                if let Some(b64) = o.path.as_ref().and_then(|p| p.b64_if_not_utf8()) {
                    v["path_b64"] = b64.into();
                }
                v
            })
            .collect();
        serde_json::json!({
            "complete": self.complete,
            "dry_run": self.dry_run,
            "already_undone": self.already_undone,
            "outcomes": outcomes,
            "notes": self.notes,
            "sealed": self.sealed,
            "coverage": self.coverage,
            "summary": self.summary(),
        })
    }
}

/// Options for [`undo_session`].
#[derive(Clone, Debug, Default)]
pub struct UndoOptions {
    /// Report what would be done without changing anything.
    pub dry_run: bool,
    /// Restore paths that changed since the session ended (by default they are left alone and
    /// reported as conflicts).
    pub force: bool,
    /// Undo only part of the session.
    pub select: Option<Selection>,
}

/// File (in the session directory) listing, one per line, the records earlier selective
/// undos reversed.
pub const UNDONE_FILE: &str = "undone";

fn read_undone(session: &Session) -> HashSet<u64> {
    std::fs::read_to_string(session.dir().join(UNDONE_FILE))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn append_undone(session: &Session, seqs: &[u64]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if seqs.is_empty() {
        return Ok(());
    }
    let mut f =
        std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(session.dir().join(UNDONE_FILE))?;
    let text: String = seqs.iter().map(|s| format!("{s}\n")).collect();
    f.write_all(text.as_bytes())
}

/// Undoes a session, or the selected part of it (or reports what an undo would do). When
/// every record has been undone and the result is complete, the session is marked undone.
pub fn undo_session(session: &Session, opts: &UndoOptions) -> Result<Report, SessionError> {
    undo_session_with_progress(session, opts, &mut |_, _| {})
}

/// [`undo_session`], calling `progress(done, total)` as steps complete.
pub fn undo_session_with_progress(
    session: &Session,
    opts: &UndoOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Report, SessionError> {
    match session.state() {
        State::Undone => {
            return Ok(Report {
                complete: true,
                already_undone: true,
                dry_run: opts.dry_run,
                notes: vec!["this session was already undone; nothing was changed".into()],
                coverage: session.coverage(),
                ..Default::default()
            });
        }
        State::Kept => {
            return Err(SessionError::Io {
                path: session.dir().to_path_buf(),
                source: io::Error::other(
                    "this session was kept: its captured contents were released and it cannot be undone",
                ),
            });
        }
        State::Active => {}
    }
    let journal = session.read_journal()?;
    let blobs = session.blobs_dir();
    let seal =
        Seal::read(session.dir()).map_err(|source| SessionError::Io { path: session.dir().join(SEAL_FILE), source })?;
    let already = read_undone(session);
    let only = opts.select.as_ref().map(|sel| select(&journal, sel));
    let plan = Plan {
        journal: &journal,
        blobs_dir: &blobs,
        opts,
        seal: seal.as_ref(),
        already: &already,
        only: only.as_ref(),
    };
    let mut report = run_plan(&plan, progress).map_err(|source| SessionError::Io { path: blobs.clone(), source })?;
    report.coverage = session.coverage();
    let lost = session.counters().lost_records;
    if lost > 0 {
        report.outcomes.push(StepReport {
            seq: None,
            outcome: Outcome::Failed,
            path: None,
            why: format!(
                "{lost} step(s) ran without a journal record (the session store could not be written); they cannot be undone"
            ),
        });
        report.complete = false;
    }
    if !opts.dry_run {
        append_undone(session, &report.undone)
            .map_err(|source| SessionError::Io { path: session.dir().join(UNDONE_FILE), source })?;
        let all_done = journal.records.iter().all(|r| already.contains(&r.seq) || report.undone.contains(&r.seq));
        if report.complete && all_done && journal.problems.is_empty() {
            session.set_state(State::Undone)?;
        }
    }
    Ok(report)
}

/// What to undo and how.
pub struct Plan<'a> {
    /// The journal.
    pub journal: &'a JournalContents,
    /// The session's `blobs/` directory.
    pub blobs_dir: &'a Path,
    /// Options.
    pub opts: &'a UndoOptions,
    /// The session's seal, when it has one.
    pub seal: Option<&'a Seal>,
    /// Records undone by an earlier undo.
    pub already: &'a HashSet<u64>,
    /// The selected records, for a selective undo.
    pub only: Option<&'a BTreeSet<u64>>,
}

/// Undoes every record of `journal` with the blobs in `blobs_dir`, unsealed, without
/// bookkeeping (for tests and tools that manage their own journal).
pub fn undo_records(journal: &JournalContents, blobs_dir: &Path, opts: &UndoOptions) -> io::Result<Report> {
    let none = HashSet::new();
    run_plan(&Plan { journal, blobs_dir, opts, seal: None, already: &none, only: None }, &mut |_, _| {})
}

/// Executes a plan.
pub fn run_plan(plan: &Plan<'_>, progress: &mut dyn FnMut(usize, usize)) -> io::Result<Report> {
    let blobs = rustix::fs::open(plan.blobs_dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut linked = std::collections::HashMap::new();
    let mut hashed = std::collections::HashMap::new();
    for r in &plan.journal.records {
        let befores: Vec<&Before> = match &r.op {
            Op::Change { before, .. } => vec![before],
            Op::Rename { to_before, .. } => vec![to_before],
            _ => vec![],
        };
        for b in befores {
            match b {
                Before::Contents(Snapshot { node: Node::File { blob, how: CaptureHow::Link, .. }, ident, .. }) => {
                    linked.entry(*ident).or_insert_with(|| blob.clone());
                }
                // A copy reused by identity names its blob without a hash: the record that
                // made the blob has it.
                Before::Contents(Snapshot { node: Node::File { blob, hash: Some(h), .. }, .. }) => {
                    hashed.entry(blob.clone()).or_insert_with(|| h.clone());
                }
                _ => {}
            }
        }
    }
    let mut tampered = HashSet::new();
    if let Some(seal) = plan.seal {
        for (blob, want) in &seal.blob_hashes {
            let got = rustix::fs::openat(
                &blobs,
                blob.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
            .and_then(|fd| hash_fd(&fd).ok())
            .map(|(h, _)| h);
            if got.as_ref().is_some_and(|g| g != want) {
                tampered.insert(blob.clone());
            }
        }
    }
    let exec = Executor {
        blobs,
        blobs_path: plan.blobs_dir.to_path_buf(),
        linked,
        hashed,
        tampered,
        dry_run: plan.opts.dry_run,
        force: plan.opts.force,
        journal: plan.journal,
        seal: plan.seal,
        only: plan.only,
        already: plan.already,
        deferred: Default::default(),
        prior: Default::default(),
        current: Default::default(),
        drift: Default::default(),
        interrupted: plan.journal.interrupted_temp_names(),
    };
    let failed_calls = plan.journal.failed_calls();
    let mut report = Report { dry_run: plan.opts.dry_run, sealed: plan.seal.is_some(), ..Default::default() };
    let todo: Vec<&Record> =
        plan.journal.records.iter().rev().filter(|r| plan.only.is_none_or(|o| o.contains(&r.seq))).collect();
    let total = todo.len();
    // Every path is compared with the seal before anything is restored: a restore through one
    // name (a hard link) must not make another look changed.
    for rec in todo.iter().filter(|r| !plan.already.contains(&r.seq)) {
        if matches!(&rec.op, Op::Change { before: Before::Irreversible { .. }, .. }) {
            continue;
        }
        for p in crate::select::record_paths(rec) {
            exec.drift_of(p);
        }
    }
    exec.learn_prior_facts(plan, &failed_calls);
    for (i, rec) in todo.into_iter().enumerate() {
        progress(i, total);
        if plan.already.contains(&rec.seq) {
            if rec.op.primary_path().is_some() && !matches!(rec.op, Op::Exec { .. }) {
                report.outcomes.push(StepReport {
                    seq: Some(rec.seq),
                    outcome: Outcome::Unchanged,
                    path: rec.op.primary_path().cloned(),
                    why: "already undone by an earlier undo".into(),
                });
            }
            continue;
        }
        if failed_calls.contains(&rec.seq) {
            report.outcomes.push(StepReport {
                seq: Some(rec.seq),
                outcome: Outcome::Unchanged,
                path: rec.op.primary_path().cloned(),
                why: format!("the {} call failed, so it changed nothing", rec.call),
            });
            report.undone.push(rec.seq);
            continue;
        }
        let before = report.outcomes.len();
        exec.undo_record(rec, &mut report.outcomes);
        if report.outcomes[before..].iter().all(|o| o.outcome.is_success()) {
            report.undone.push(rec.seq);
        }
    }
    progress(total, total);
    let before = report.outcomes.len();
    exec.apply_deferred(&mut report.outcomes);
    let failed_dirs: HashSet<u64> = report.outcomes[before..].iter().filter_map(|o| o.seq).collect();
    report.undone.retain(|s| !failed_dirs.contains(s));
    if !plan.opts.dry_run {
        exec.forgive_superseded(plan, &failed_calls, &mut report);
    }
    if plan.only.is_none() {
        for p in &plan.journal.problems {
            report.outcomes.push(StepReport { seq: p.seq(), outcome: Outcome::Failed, path: None, why: p.describe() });
        }
    }
    report.notes.extend(plan.journal.torn_messages());
    if plan.seal.is_none() && !plan.opts.force {
        report.notes.push(
            "this session was not sealed (it did not end under `aether-journal run`): paths were checked against what its newest records imply, a weaker check that cannot see a file edited in place since".into(),
        );
    }
    report.complete = report.outcomes.iter().all(|o| o.outcome.is_success());
    Ok(report)
}

struct Executor<'a> {
    blobs: OwnedFd,
    blobs_path: std::path::PathBuf,
    /// Every inode some record captured by hard link, and the blob holding it.
    linked: std::collections::HashMap<crate::record::Ident, String>,
    /// The hash each copied blob was recorded with (by the record that made it).
    hashed: std::collections::HashMap<String, String>,
    /// Linked blobs whose content no longer matches the hash sealed with the session (checked
    /// once, before this undo changes anything).
    tampered: HashSet<String>,
    dry_run: bool,
    force: bool,
    journal: &'a JournalContents,
    seal: Option<&'a Seal>,
    /// The records this undo reverses (`None`: all), and those earlier undos reversed.
    only: Option<&'a BTreeSet<u64>>,
    already: &'a HashSet<u64>,
    /// The drift verdict for every path checked so far (`Some(why)`: changed since).
    drift: std::cell::RefCell<std::collections::HashMap<BPath, Option<String>>>,
    /// Directory metadata, applied after every entry has been put back: a read-only or
    /// freshly timestamped directory must not be changed again by the restores inside it.
    deferred: std::cell::RefCell<Vec<Deferred>>,
    /// What each path was before the session, worked out before anything is restored (the
    /// blobs it reads may be moved back or rewritten by the undo itself).
    prior: std::cell::RefCell<std::collections::HashMap<BPath, PriorFacts>>,
    /// The record being undone (for deferred work's report lines).
    current: std::cell::Cell<Option<u64>>,
    /// `temp_name` intents no later record completes (see
    /// [`JournalContents::interrupted_temp_names`]).
    interrupted: HashSet<u64>,
}

/// Names in `template`'s directory that it can produce, as they are now (at most 10).
fn temp_name_candidates(template: &BPath) -> Vec<String> {
    let Some((dir, _)) = template.split_parent() else { return Vec::new() };
    use std::os::unix::ffi::OsStrExt;
    let Ok(entries) = std::fs::read_dir(std::ffi::OsStr::from_bytes(dir)) else { return Vec::new() };
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| BPath::new(crate::bpath::join(dir, e.file_name().as_bytes())))
        .filter(|p| crate::record::matches_template(template, p))
        .map(|p| p.display_lossy())
        .collect();
    found.sort();
    found.truncate(10);
    found
}

/// Directory metadata waiting for the end of the undo.
struct Deferred {
    seq: Option<u64>,
    path: BPath,
    meta: DeferredMeta,
}

enum DeferredMeta {
    Snapshot(Snapshot),
    Meta(MetaBefore),
}

/// What is known of a path's state before the session, aspect by aspect (`None`: unknown).
#[derive(Default)]
struct PriorFacts {
    body: Option<Body>,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
}

/// Existence and contents.
enum Body {
    Absent,
    /// BLAKE3 hex and size of a regular file.
    File(String, u64),
    Symlink(BPath),
    Dir,
    /// It existed, but what it held cannot be verified.
    Unknown,
}

/// What a step restores.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Aspect {
    Body,
    Mode,
    Owner,
}

impl PriorFacts {
    /// Whether every aspect in `aspects` is known and is, now, as it was.
    fn verified(&self, path: &BPath, aspects: &[Aspect]) -> bool {
        let st = match rustix::fs::lstat(path.as_bytes()) {
            Ok(st) => Some(st),
            Err(Errno::NOENT) => None,
            Err(_) => return false,
        };
        if aspects.contains(&Aspect::Body) && matches!(self.body, Some(Body::Absent)) {
            return st.is_none();
        }
        let Some(st) = st else { return false };
        aspects.iter().all(|a| match a {
            Aspect::Mode => self.mode.is_some_and(|m| m == st.st_mode & 0o7777 || file_type(&st) == FileType::Symlink),
            Aspect::Owner => self.owner.is_some_and(|o| o == (st.st_uid, st.st_gid)),
            Aspect::Body => match &self.body {
                Some(Body::File(want, size)) => {
                    file_type(&st) == FileType::RegularFile
                        && rustix::fs::open(
                            path.as_bytes(),
                            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                            Mode::empty(),
                        )
                        .ok()
                        .and_then(|fd| hash_fd(&fd).ok())
                        .is_some_and(|(h, n)| h == *want && n == *size)
                }
                Some(Body::Symlink(target)) => {
                    file_type(&st) == FileType::Symlink
                        && rustix::fs::readlink(path.as_bytes(), Vec::new())
                            .is_ok_and(|t| t.as_bytes() == target.as_bytes())
                }
                Some(Body::Dir) => file_type(&st) == FileType::Directory,
                Some(Body::Absent) | Some(Body::Unknown) | None => false,
            },
        })
    }
}

/// Result of one restore action: outcome and explanation.
type Done = (Outcome, String);

fn failed(why: impl Into<String>) -> Done {
    (Outcome::Failed, why.into())
}

fn describe_errno(e: Errno) -> String {
    io::Error::from(e).to_string()
}

/// Opens a directory by absolute path without following any symlink on the way.
pub fn open_dir_nofollow(path: &[u8]) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS)
    {
        Err(Errno::NOSYS) => {}
        other => return other,
    }
    // Kernels before 5.6: walk the components one at a time.
    let mut dir = rustix::fs::open("/", flags, Mode::empty())?;
    for comp in path.split(|&c| c == b'/').filter(|c| !c.is_empty() && *c != b".") {
        if comp == b".." {
            return Err(Errno::LOOP);
        }
        dir = rustix::fs::openat(&dir, comp, flags | OFlags::NOFOLLOW, Mode::empty())?;
    }
    Ok(dir)
}

fn lstat(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Option<Stat>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

fn type_name(st: &Stat) -> &'static str {
    match file_type(st) {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "an unknown kind of file",
    }
}

/// Removes whatever non-directory or empty directory is at `name`.
fn remove_any(dir: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Result<(), Errno> {
    let flags = if file_type(st) == FileType::Directory { AtFlags::REMOVEDIR } else { AtFlags::empty() };
    rustix::fs::unlinkat(dir, name, flags)
}

fn timestamps(atime: [i64; 2], mtime: [i64; 2]) -> Timestamps {
    Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: atime[0], tv_nsec: atime[1] as _ },
        last_modification: rustix::fs::Timespec { tv_sec: mtime[0], tv_nsec: mtime[1] as _ },
    }
}

/// What metadata to put back on a node; `None` fields are left alone.
#[derive(Default)]
struct MetaTarget<'a> {
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
    times: Option<Timestamps>,
    xattrs: XattrTarget<'a>,
    /// Inode flags (chattr), set last: an immutable or append-only flag would refuse the rest.
    flags: Option<u32>,
}

#[derive(Default)]
enum XattrTarget<'a> {
    #[default]
    Leave,
    /// Exactly this set (others removed).
    All(&'a [Xattr]),
    /// One attribute set to a value, or removed.
    One(&'a [u8], Option<&'a [u8]>),
}

impl<'a> MetaTarget<'a> {
    fn of_snapshot(snap: &'a Snapshot) -> Self {
        MetaTarget {
            owner: Some((snap.uid, snap.gid)),
            mode: Some(snap.mode),
            times: Some(timestamps(snap.atime, snap.mtime)),
            xattrs: snap.xattrs.as_deref().map_or(XattrTarget::Leave, XattrTarget::All),
            flags: None,
        }
    }

    fn of_meta(m: &'a MetaBefore) -> Self {
        match m.what {
            MetaKind::Mode => MetaTarget { mode: Some(m.mode), ..Default::default() },
            // chown may have cleared set-id bits: the mode goes back too.
            MetaKind::Owner => MetaTarget { owner: Some((m.uid, m.gid)), mode: Some(m.mode), ..Default::default() },
            MetaKind::Times => MetaTarget { times: Some(timestamps(m.atime, m.mtime)), ..Default::default() },
            MetaKind::Flags => MetaTarget { flags: m.flags, ..Default::default() },
            MetaKind::Xattr => MetaTarget {
                xattrs: match &m.xattr {
                    Some(x) => XattrTarget::One(x.name.as_bytes(), x.value.as_ref().map(|v| v.0.as_slice())),
                    None => XattrTarget::Leave,
                },
                // An access ACL carries the group bits of the mode with it: removing or
                // replacing it does not put the mode back by itself.
                mode: m.xattr.as_ref().filter(|x| x.name.as_bytes() == b"system.posix_acl_access").map(|_| m.mode),
                ..Default::default()
            },
        }
    }
}

/// A node metadata can be set on: an open descriptor, or a node opened `O_PATH | O_NOFOLLOW`
/// relative to its verified parent (reached through `/proc/self/fd`, so never through a
/// symlink planted in its place).
enum MetaHandle<'a> {
    Fd(BorrowedFd<'a>),
    Node { dir: BorrowedFd<'a>, name: &'a [u8], fd: OwnedFd, symlink: bool },
}

impl<'a> MetaHandle<'a> {
    fn open(dir: BorrowedFd<'a>, name: &'a [u8]) -> Result<MetaHandle<'a>, Errno> {
        let fd = rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let symlink = rustix::fs::fstat(&fd).map(|st| file_type(&st) == FileType::Symlink)?;
        Ok(MetaHandle::Node { dir, name, fd, symlink })
    }

    fn proc_path(fd: &OwnedFd) -> String {
        use std::os::fd::AsRawFd;
        format!("/proc/self/fd/{}", fd.as_raw_fd())
    }

    fn stat(&self) -> Result<Stat, Errno> {
        match self {
            MetaHandle::Fd(fd) => rustix::fs::fstat(fd),
            MetaHandle::Node { fd, .. } => rustix::fs::fstat(fd),
        }
    }

    fn chown(&self, uid: u32, gid: u32) -> Result<(), Errno> {
        let (o, g) = (Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)));
        match self {
            MetaHandle::Fd(fd) => rustix::fs::fchown(fd, o, g),
            MetaHandle::Node { fd, .. } => rustix::fs::chownat(fd, "", o, g, AtFlags::EMPTY_PATH),
        }
    }

    fn chmod(&self, mode: u32) -> Result<(), Errno> {
        match self {
            MetaHandle::Fd(fd) => rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)),
            // Linux has no mode for symlinks.
            MetaHandle::Node { symlink: true, .. } => Ok(()),
            MetaHandle::Node { fd, .. } => rustix::fs::chmod(Self::proc_path(fd).as_str(), Mode::from_raw_mode(mode)),
        }
    }

    fn set_times(&self, ts: &Timestamps) -> Result<(), Errno> {
        match self {
            MetaHandle::Fd(fd) => rustix::fs::futimens(fd, ts),
            MetaHandle::Node { dir, name, symlink: true, .. } => {
                rustix::fs::utimensat(*dir, *name, ts, AtFlags::SYMLINK_NOFOLLOW)
            }
            MetaHandle::Node { fd, .. } => {
                rustix::fs::utimensat(CWD, Self::proc_path(fd).as_str(), ts, AtFlags::empty())
            }
        }
    }

    /// Sets the inode flags (`FS_IOC_SETFLAGS`), through a descriptor opened for reading (the
    /// ioctl needs one; a node is reopened through its verified `O_PATH` descriptor).
    fn set_flags(&self, flags: u32) -> Result<(), Errno> {
        let set = |fd: BorrowedFd<'_>| rustix::fs::ioctl_setflags(fd, rustix::fs::IFlags::from_bits_retain(flags));
        match self {
            MetaHandle::Fd(fd) => set(*fd),
            MetaHandle::Node { symlink: true, .. } => Ok(()),
            MetaHandle::Node { fd, .. } => set(reopen_for_flags(fd)?.as_fd()),
        }
    }

    fn list_xattr_names(&self) -> Result<Vec<Vec<u8>>, Errno> {
        let mut buf = vec![0u8; 65536];
        let n = match self {
            MetaHandle::Fd(fd) => rustix::fs::flistxattr(fd, &mut buf[..])?,
            MetaHandle::Node { symlink: true, .. } => 0,
            MetaHandle::Node { fd, .. } => rustix::fs::listxattr(Self::proc_path(fd).as_str(), &mut buf[..])?,
        };
        Ok(buf[..n].split(|&b| b == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect())
    }

    fn set_xattr(&self, name: &[u8], value: Option<&[u8]>) -> Result<(), Errno> {
        let flags = rustix::fs::XattrFlags::empty();
        match (self, value) {
            (MetaHandle::Node { symlink: true, .. }, _) => Ok(()),
            (MetaHandle::Fd(fd), Some(v)) => rustix::fs::fsetxattr(fd, name, v, flags),
            (MetaHandle::Fd(fd), None) => ignore_nodata(rustix::fs::fremovexattr(fd, name)),
            (MetaHandle::Node { fd, .. }, Some(v)) => {
                rustix::fs::setxattr(Self::proc_path(fd).as_str(), name, v, flags)
            }
            (MetaHandle::Node { fd, .. }, None) => {
                ignore_nodata(rustix::fs::removexattr(Self::proc_path(fd).as_str(), name))
            }
        }
    }

    /// Puts the target metadata back: owner first, then extended attributes (an access ACL
    /// rewrites the group bits of the mode), then the mode (chown can clear set-id bits), and
    /// times last. Returns what could not be set back.
    fn apply(&self, t: &MetaTarget<'_>) -> Option<String> {
        let mut problems = Vec::new();
        let st = self.stat().ok();
        if let Some((uid, gid)) = t.owner {
            if st.is_none_or(|s| s.st_uid != uid || s.st_gid != gid) {
                if let Err(e) = self.chown(uid, gid) {
                    problems.push(format!("owner {uid}:{gid} could not be set back ({})", describe_errno(e)));
                }
            }
        }
        match &t.xattrs {
            XattrTarget::Leave => {}
            XattrTarget::One(name, value) => {
                if let Err(e) = self.set_xattr(name, *value) {
                    let name = String::from_utf8_lossy(name);
                    problems.push(format!("extended attribute {name} could not be set back ({})", describe_errno(e)));
                }
            }
            XattrTarget::All(list) => match self.list_xattr_names() {
                Ok(present) => {
                    for name in present.iter().filter(|n| !list.iter().any(|x| x.name.as_bytes() == n.as_slice())) {
                        if let Err(e) = self.set_xattr(name, None) {
                            let name = String::from_utf8_lossy(name);
                            problems.push(format!(
                                "extended attribute {name} could not be removed ({})",
                                describe_errno(e)
                            ));
                        }
                    }
                    for x in list.iter() {
                        if let Err(e) = self.set_xattr(x.name.as_bytes(), Some(&x.value.0)) {
                            let name = x.name.display_lossy();
                            problems.push(format!(
                                "extended attribute {name} could not be set back ({})",
                                describe_errno(e)
                            ));
                        }
                    }
                }
                Err(Errno::NOTSUP) => {}
                Err(e) => problems.push(format!("extended attributes could not be read ({})", describe_errno(e))),
            },
        }
        if let Some(mode) = t.mode {
            if let Err(e) = self.chmod(mode) {
                problems.push(format!("mode {mode:o} could not be set back ({})", describe_errno(e)));
            }
        }
        if let Some(ts) = &t.times {
            if let Err(e) = self.set_times(ts) {
                problems.push(format!("times could not be set back ({})", describe_errno(e)));
            }
        }
        if let Some(flags) = t.flags {
            if let Err(e) = self.set_flags(flags) {
                problems.push(format!("attributes {flags:#x} could not be set back ({})", describe_errno(e)));
            }
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

/// A node reopened for reading through its `O_PATH` descriptor, for the flags ioctls.
fn reopen_for_flags(fd: &OwnedFd) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    rustix::fs::openat(CWD, MetaHandle::proc_path(fd).as_str(), flags, Mode::empty())
}

/// The inode flags of the file at `path`, not following a final symlink.
fn inode_flags_at(path: &BPath) -> Result<u32, Errno> {
    let node =
        rustix::fs::openat(CWD, path.as_bytes(), OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    Ok(rustix::fs::ioctl_getflags(reopen_for_flags(&node)?)?.bits())
}

/// Whether a node's extended attributes are exactly `want`.
fn xattrs_equal(h: &MetaHandle<'_>, want: &[Xattr]) -> bool {
    let Ok(names) = h.list_xattr_names() else { return want.is_empty() };
    if names.len() != want.len() {
        return false;
    }
    want.iter().all(|x| {
        names.iter().any(|n| n.as_slice() == x.name.as_bytes())
            && match h {
                MetaHandle::Fd(fd) => {
                    let mut buf = vec![0u8; 65536];
                    rustix::fs::fgetxattr(fd, x.name.as_bytes(), &mut buf[..]).is_ok_and(|n| buf[..n] == x.value.0[..])
                }
                MetaHandle::Node { fd, .. } => {
                    let mut buf = vec![0u8; 65536];
                    rustix::fs::getxattr(MetaHandle::proc_path(fd).as_str(), x.name.as_bytes(), &mut buf[..])
                        .is_ok_and(|n| buf[..n] == x.value.0[..])
                }
            }
    })
}

fn ignore_nodata(r: Result<(), Errno>) -> Result<(), Errno> {
    match r {
        Err(Errno::NODATA) => Ok(()),
        other => other,
    }
}

/// Puts a snapshot's metadata back on an open descriptor.
fn set_meta_fd(fd: BorrowedFd<'_>, snap: &Snapshot) -> Option<String> {
    MetaHandle::Fd(fd).apply(&MetaTarget::of_snapshot(snap))
}

/// Puts a snapshot's metadata back on `name` in `dir`, never following a symlink.
fn set_meta_at(dir: BorrowedFd<'_>, name: &[u8], snap: &Snapshot) -> Option<String> {
    match MetaHandle::open(dir, name) {
        Ok(h) => h.apply(&MetaTarget::of_snapshot(snap)),
        Err(e) => Some(format!("its metadata could not be set back ({})", describe_errno(e))),
    }
}

/// Whether the part of the metadata a Meta record is about is already as recorded.
fn meta_already(st: &Stat, m: &MetaBefore, path: &BPath) -> bool {
    match m.what {
        MetaKind::Mode => st.st_mode & 0o7777 == m.mode,
        MetaKind::Owner => st.st_uid == m.uid && st.st_gid == m.gid && st.st_mode & 0o7777 == m.mode,
        MetaKind::Times => {
            st.st_mtime == m.mtime[0]
                && st.st_mtime_nsec as i64 == m.mtime[1]
                && st.st_atime == m.atime[0]
                && st.st_atime_nsec as i64 == m.atime[1]
        }
        MetaKind::Flags => m.flags.is_some_and(|want| inode_flags_at(path).is_ok_and(|now| now == want)),
        MetaKind::Xattr => m.xattr.as_ref().is_some_and(|x| {
            // A minimal access ACL is not stored as an attribute at all: it lives in the mode.
            let acl_mode_ok = x.name.as_bytes() != b"system.posix_acl_access" || st.st_mode & 0o7777 == m.mode;
            acl_mode_ok
                && crate::capture::xattr_value(path.as_bytes(), x.name.as_bytes())
                    .is_ok_and(|now| now.as_deref() == x.value.as_ref().map(|v| v.0.as_slice()))
        }),
    }
}

fn meta_matches(st: &Stat, snap: &Snapshot) -> bool {
    st.st_mode & 0o7777 == snap.mode && st.st_uid == snap.uid && st.st_gid == snap.gid
}

impl Executor<'_> {
    fn undo_record(&self, rec: &Record, out: &mut Vec<StepReport>) {
        let seq = Some(rec.seq);
        self.current.set(seq);
        // A step that cannot be reversed anyway touches nothing: no drift check.
        let irreversible_change = matches!(&rec.op, Op::Change { before: Before::Irreversible { .. }, .. });
        for p in crate::select::record_paths(rec).into_iter().filter(|_| !irreversible_change) {
            if let Some(why) = self.drift_of(p) {
                out.push(StepReport { seq, outcome: Outcome::Conflict, path: Some(p.clone()), why });
                return;
            }
        }
        match &rec.op {
            Op::Change { path, before } => {
                let (outcome, why) = self.undo_changed_path(path, before);
                out.push(StepReport { seq, outcome, path: Some(path.clone()), why });
            }
            Op::Rename { from, to, flags, moved, to_before } => {
                let exchange = flags & 2 != 0;
                let (outcome, why) = if exchange {
                    self.undo_exchange(from, to, moved.as_ref())
                } else {
                    self.undo_move(from, to, *flags)
                };
                let moved_back = outcome == Outcome::Restored;
                if moved_back && !self.dry_run {
                    self.deferred_moved(to, from, exchange);
                }
                out.push(StepReport { seq, outcome, path: Some(from.clone()), why });
                // When the move did not happen the destination was never clobbered; an
                // exchange destroys nothing.
                if !exchange && moved_back && !matches!(to_before, Before::Absent) {
                    let (outcome, why) = self.undo_changed_path(to, to_before);
                    out.push(StepReport { seq, outcome, path: Some(to.clone()), why });
                }
            }
            Op::Meta { path, before } => {
                let (outcome, why) = self.undo_meta(seq, path, before);
                out.push(StepReport { seq, outcome, path: Some(path.clone()), why });
            }
            Op::Unobserved { program, reason } => {
                let why = format!("{} ran unobserved: {reason}", program.display_lossy());
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: None, why });
            }
            Op::Connect { peer, result } => {
                let (outcome, why) = match result {
                    ConnectResult::Failed { errno } => (
                        Outcome::Unchanged,
                        format!(
                            "the connection to {peer} failed ({}): nothing was exchanged",
                            describe_errno(Errno::from_raw_os_error(*errno))
                        ),
                    ),
                    _ => (Outcome::Skipped, format!("network connection to {peer} cannot be unsent")),
                };
                out.push(StepReport { seq, outcome, path: None, why });
            }
            Op::Send { peer } => {
                let why = format!("data sent to {peer} cannot be unsent");
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: None, why });
            }
            Op::Signal { target, target_prog, signal, outside: true } => {
                let prog = target_prog.as_ref().map(|p| format!(" ({})", p.display_lossy())).unwrap_or_default();
                let why =
                    format!("signal {signal} sent to process {target}{prog} outside the session cannot be taken back");
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: None, why });
            }
            Op::Refused { what, .. } => {
                let why = format!("refused under the strict policy, so it changed nothing: {what}");
                out.push(StepReport { seq, outcome: Outcome::Unchanged, path: None, why });
            }
            Op::TempName { template } if self.interrupted.contains(&rec.seq) => {
                let found = temp_name_candidates(template);
                let left = if found.is_empty() {
                    "no such name is there now".to_string()
                } else {
                    format!("names there it could have made: {}", found.join(", "))
                };
                let why = format!(
                    "{} was interrupted between creating a name from this template and journaling it (the process was killed, or its record was lost): whatever it created is not removed; {left}",
                    rec.call
                );
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: Some(template.clone()), why });
            }
            // Audit entries: nothing to reverse (a completed temp_name is undone through the
            // record that names what the call created).
            Op::Signal { outside: false, .. } | Op::Exec { .. } | Op::TempName { .. } | Op::CallFailed { .. } => {}
        }
    }

    /// A step can fail because processes of the session raced on one name (its target vanished
    /// before its turn came), while an older record still puts the path back. What counts is
    /// the end result: a failed step is forgiven when every aspect it would have restored
    /// (existence and contents, mode, owner) is, now, verifiably what it was before the session
    /// (see [`Executor::prior_facts`]).
    /// Works out, before anything is restored, what every path of the plan was before the
    /// session (see [`Executor::prior_facts`]).
    fn learn_prior_facts(&self, plan: &Plan<'_>, failed_calls: &HashSet<u64>) {
        if plan.opts.dry_run {
            return;
        }
        let mut by_path: std::collections::HashMap<&BPath, Vec<&Record>> = std::collections::HashMap::new();
        for r in plan.journal.records.iter().filter(|r| plan.only.is_none_or(|o| o.contains(&r.seq))) {
            if failed_calls.contains(&r.seq) {
                continue;
            }
            for p in crate::select::record_paths(r) {
                by_path.entry(p).or_default().push(r);
            }
        }
        let mut prior = self.prior.borrow_mut();
        for (path, records) in by_path {
            prior.insert(path.clone(), self.prior_facts(path, &records));
        }
    }

    fn forgive_superseded(&self, plan: &Plan<'_>, _failed_calls: &HashSet<u64>, report: &mut Report) {
        let by_seq: std::collections::HashMap<u64, &Record> = plan.journal.records.iter().map(|r| (r.seq, r)).collect();
        let facts = self.prior.borrow();
        for o in report.outcomes.iter_mut().filter(|o| o.outcome == Outcome::Failed) {
            let (Some(path), Some(seq)) = (&o.path, o.seq) else { continue };
            let (Some(f), Some(rec)) = (facts.get(path), by_seq.get(&seq)) else { continue };
            let aspects = match &rec.op {
                Op::Meta { before, .. } => match before.what {
                    MetaKind::Mode => vec![Aspect::Mode],
                    MetaKind::Owner => vec![Aspect::Mode, Aspect::Owner],
                    MetaKind::Times | MetaKind::Xattr | MetaKind::Flags => continue,
                },
                Op::Change { .. } | Op::Rename { .. } => vec![Aspect::Body, Aspect::Mode, Aspect::Owner],
                _ => continue,
            };
            if f.verified(path, &aspects) {
                o.outcome = Outcome::Unchanged;
                o.why = format!(
                    "this step could not be replayed ({}), but the path ended exactly as it was before the session (verified)",
                    o.why
                );
                report.undone.push(seq);
            }
        }
    }

    /// What is known, aspect by aspect, about `path` before the session: from its oldest
    /// records (`records`, oldest first), each aspect from the oldest record that knows it. An
    /// append's prior length is laid over the oldest full capture after it. A capture by hard
    /// link proves nothing about prior bytes (the inode may have been changed afterwards
    /// through a descriptor kept open).
    fn prior_facts(&self, path: &BPath, records: &[&Record]) -> PriorFacts {
        let mut f = PriorFacts::default();
        let mut prefix: Option<u64> = None;
        for r in records {
            let before = match &r.op {
                Op::Meta { before, .. } => {
                    match before.what {
                        MetaKind::Mode => {
                            f.mode.get_or_insert(before.mode);
                        }
                        MetaKind::Owner => {
                            f.mode.get_or_insert(before.mode);
                            f.owner.get_or_insert((before.uid, before.gid));
                        }
                        MetaKind::Times | MetaKind::Xattr | MetaKind::Flags => {}
                    }
                    continue;
                }
                Op::Rename { from, .. } if from == path => {
                    f.body.get_or_insert(Body::Unknown);
                    return f;
                }
                Op::Change { before, .. } | Op::Rename { to_before: before, .. } => before,
                _ => continue,
            };
            match before {
                Before::Absent | Before::Exclusive => {
                    f.body.get_or_insert(if prefix.is_none() { Body::Absent } else { Body::Unknown });
                    return f;
                }
                // Reached first only when the creation it names is not being undone.
                Before::Irreversible { .. } | Before::Born { .. } | Before::Kept { .. } => {
                    f.body.get_or_insert(Body::Unknown);
                    return f;
                }
                Before::Contents(s) => {
                    f.mode.get_or_insert(s.mode);
                    f.owner.get_or_insert((s.uid, s.gid));
                    let body = match &s.node {
                        Node::Prefix { len } => {
                            prefix.get_or_insert(*len);
                            continue;
                        }
                        Node::File { blob, how: CaptureHow::Link | CaptureHow::Reflink, .. }
                            if !self.seal.is_some_and(|seal| seal.blob_intact.contains(blob)) =>
                        {
                            Body::Unknown
                        }
                        Node::File { blob, size, hash, .. } => {
                            match (self.expected_hash(blob, hash.as_deref()), prefix) {
                                (None, _) => Body::Unknown,
                                (Some(h), None) => Body::File(h.to_string(), *size),
                                (Some(h), Some(len)) => match std::fs::read(self.blobs_path.join(blob)) {
                                    Ok(bytes)
                                        if bytes.len() as u64 >= len && blake3::hash(&bytes).to_hex().as_str() == h =>
                                    {
                                        Body::File(blake3::hash(&bytes[..len as usize]).to_hex().to_string(), len)
                                    }
                                    _ => Body::Unknown,
                                },
                            }
                        }
                        Node::Symlink { target } if prefix.is_none() => Body::Symlink(target.clone()),
                        Node::Dir if prefix.is_none() => Body::Dir,
                        _ => Body::Unknown,
                    };
                    f.body.get_or_insert(body);
                    return f;
                }
            }
        }
        f
    }

    /// The blob holding `ident`, when a hard-link capture put that inode in the store and it is
    /// still there.
    fn stored_inode(&self, ident: crate::record::Ident) -> Option<&str> {
        let blob = self.linked.get(&ident)?;
        let st = lstat(self.blobs.as_fd(), blob.as_bytes()).ok().flatten()?;
        (ident_of(&st) == ident).then_some(blob.as_str())
    }

    /// Restores a snapshot into the captured inode that now lives in the store as `stored`.
    fn restore_in_store(&self, stored: &str, snap: &Snapshot) -> Done {
        let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dst = match rustix::fs::openat(self.blobs.as_fd(), stored, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) => return failed(format!("cannot open its captured inode (blob {stored}): {}", describe_errno(e))),
        };
        let later = format!("in the captured file (blob {stored}), which an older step puts back");
        match &snap.node {
            Node::Prefix { len } => {
                let now = rustix::fs::fstat(&dst).map(|st| st.st_size as u64).unwrap_or(0);
                if now < *len {
                    return failed(format!(
                        "only its length before an append ({len} bytes) was kept, but the file is now shorter ({now} bytes): bytes from before the session are gone"
                    ));
                }
                if let Err(e) = rustix::fs::ftruncate(&dst, *len) {
                    return failed(format!("cannot truncate it back to {len} bytes: {}", describe_errno(e)));
                }
                match set_meta_fd(dst.as_fd(), snap) {
                    None => {
                        (Outcome::Restored, format!("truncated the appended bytes away ({now} -> {len} bytes) {later}"))
                    }
                    Some(p) => failed(format!("truncated back to {len} bytes, but {p}")),
                }
            }
            Node::File { blob, size, hash, .. } => {
                let ro = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let src = match rustix::fs::openat(self.blobs.as_fd(), blob.as_str(), ro, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(e) => return failed(format!("cannot open blob {blob}: {}", describe_errno(e))),
                };
                let verified = hash_fd(&src).ok().is_some_and(|(h, n)| {
                    n == *size && self.expected_hash(blob, hash.as_deref()).is_none_or(|want| want == h)
                });
                if !verified {
                    return failed(format!(
                        "blob {blob} does not match what was captured: it was tampered with or damaged and was not written back"
                    ));
                }
                if let Err(e) = copy_from_start(&src, &dst) {
                    return failed(format!("writing the captured contents back failed: {e}"));
                }
                match set_meta_fd(dst.as_fd(), snap) {
                    None => {
                        (Outcome::Restored, format!("wrote back its prior contents ({size} bytes, verified) {later}"))
                    }
                    Some(p) => failed(format!("contents restored, but {p}")),
                }
            }
            _ => failed("this kind of capture cannot be restored into the store"),
        }
    }

    /// Whether `path` changed since the session ended, and how (cached per path).
    fn drift_of(&self, path: &BPath) -> Option<String> {
        if self.force {
            return None;
        }
        if let Some(v) = self.drift.borrow().get(path) {
            return v.clone();
        }
        let verdict = self.check_drift(path);
        self.drift.borrow_mut().insert(path.clone(), verdict.clone());
        verdict
    }

    fn check_drift(&self, path: &BPath) -> Option<String> {
        let now = match AfterState::of(path.as_bytes()) {
            Ok(now) => now,
            Err(e) => return Some(format!("it cannot be examined ({e}); left alone")),
        };
        if let Some(sealed) = self.seal.and_then(|s| s.state_of(path)) {
            return sealed.difference(&now).map(|d| {
                format!("changed since the session ended: {d}; left alone (use --force to restore it anyway)")
            });
        }
        let weak = |d: &str| {
            Some(format!(
                "changed since the session: {d}; left alone (use --force to restore it anyway; weak check: the session was not sealed)"
            ))
        };
        let ident_now = match &now {
            AfterState::Absent | AfterState::Symlink { .. } => None,
            AfterState::File { ident, .. } | AfterState::Dir { ident, .. } | AfterState::Other { ident, .. } => {
                Some(*ident)
            }
        };
        match (expectation(self.journal, path), &now) {
            (Expectation::Unknown, _) => None,
            (Expectation::Allowed { may_be_absent: false, .. }, AfterState::Absent) => weak("it no longer exists"),
            (Expectation::Allowed { idents, .. }, _)
                if !idents.is_empty() && ident_now.is_some_and(|now| !idents.contains(&now)) =>
            {
                weak("it was replaced by another file")
            }
            (Expectation::Allowed { .. }, _) => None,
        }
    }

    /// The hash a blob must have: recorded at capture time (by this record, or by the one that
    /// made a blob this record reuses), or (linked and cloned captures) when the session was
    /// sealed.
    fn expected_hash<'h>(&'h self, blob: &str, recorded: Option<&'h str>) -> Option<&'h str> {
        recorded
            .or_else(|| self.hashed.get(blob).map(String::as_str))
            .or_else(|| self.seal.and_then(|s| s.blob_hashes.get(blob)).map(String::as_str))
    }

    fn parent_of<'p>(&self, path: &'p BPath) -> Result<(OwnedFd, &'p [u8]), Done> {
        let Some((parent, name)) = path.split_parent() else {
            return Err(failed("the path has no parent directory"));
        };
        match open_dir_nofollow(parent) {
            Ok(fd) => Ok((fd, name)),
            Err(Errno::LOOP) | Err(Errno::XDEV) => Err((
                Outcome::Conflict,
                format!(
                    "a symlink now stands in the path to {}; it was not followed and nothing was restored",
                    String::from_utf8_lossy(parent)
                ),
            )),
            Err(e @ (Errno::NOENT | Errno::NOTDIR)) => Err(failed(format!(
                "its directory {} no longer exists ({})",
                String::from_utf8_lossy(parent),
                describe_errno(e)
            ))),
            Err(e) => Err(failed(format!("cannot open its directory: {}", describe_errno(e)))),
        }
    }

    /// Undoes a change and keeps the deferred directory metadata true to the tree: when the
    /// step took away a directory that newer steps had put back (it did not exist before the
    /// session, or something else stood there), the metadata queued for it and for
    /// everything inside it has nowhere to go and no longer applies.
    fn undo_changed_path(&self, path: &BPath, before: &Before) -> Done {
        let dir_before = if self.dry_run { None } else { self.directory_at(path) };
        let done = self.undo_change(path, before);
        if let Some(old) = dir_before {
            if matches!(done.0, Outcome::Removed | Outcome::Restored | Outcome::Recreated)
                && self.directory_at(path) != Some(old)
            {
                self.deferred.borrow_mut().retain(|d| !d.path.starts_with_dir(path.as_bytes()));
            }
        }
        done
    }

    /// The identity of the directory standing at `path`, if one does.
    fn directory_at(&self, path: &BPath) -> Option<crate::record::Ident> {
        let (dir, name) = self.parent_of(path).ok()?;
        let st = lstat(dir.as_fd(), name).ok().flatten()?;
        (file_type(&st) == FileType::Directory).then(|| ident_of(&st))
    }

    /// Follows a directory that an undo step moved from `now` back to `back` (or exchanged
    /// with it): its queued metadata, and its entries', move with it.
    fn deferred_moved(&self, now: &BPath, back: &BPath, exchange: bool) {
        let swap = |p: &BPath, from: &BPath, to: &BPath| -> Option<BPath> {
            p.starts_with_dir(from.as_bytes()).then(|| {
                let mut b = to.as_bytes().to_vec();
                b.extend_from_slice(&p.as_bytes()[from.as_bytes().len()..]);
                BPath::new(b)
            })
        };
        for d in self.deferred.borrow_mut().iter_mut() {
            let moved = swap(&d.path, now, back).or_else(|| if exchange { swap(&d.path, back, now) } else { None });
            if let Some(p) = moved {
                d.path = p;
            }
        }
    }

    fn undo_change(&self, path: &BPath, before: &Before) -> Done {
        match before {
            Before::Irreversible { reason } => return (Outcome::Skipped, reason.to_string()),
            Before::Born { created: seq } | Before::Kept { by: seq } => {
                // What the record that names `seq` is, and what undoing it does.
                let (what, does) = match before {
                    Before::Born { .. } => (format!("this session created it (record {seq})"), "removes it"),
                    _ => (format!("record {seq} kept its state from before the session"), "puts it back"),
                };
                return if self.undoes(*seq) {
                    (Outcome::Unchanged, format!("{what}, and this undo undoes that record, which {does}"))
                } else {
                    (
                        Outcome::Skipped,
                        format!(
                            "what it held before this call was not kept: {what}, and only undoing that record {does}"
                        ),
                    )
                };
            }
            Before::Absent | Before::Exclusive | Before::Contents(_) => {}
        }
        if self.dry_run {
            return match before {
                Before::Absent | Before::Exclusive => (Outcome::Removed, "would remove it if it exists".into()),
                Before::Contents(s) => (Outcome::Restored, format!("would restore {}", describe_node(&s.node))),
                Before::Irreversible { .. } | Before::Born { .. } | Before::Kept { .. } => {
                    unreachable!("handled above")
                }
            };
        }
        let (dir, name) = match self.parent_of(path) {
            Ok(x) => x,
            Err((Outcome::Failed, _)) if matches!(before, Before::Absent | Before::Exclusive) => {
                return (Outcome::Unchanged, "already absent (its directory is gone too)".into());
            }
            Err(done) => return done,
        };
        let cur = match lstat(dir.as_fd(), name) {
            Ok(c) => c,
            Err(e) => return failed(format!("cannot examine it: {}", describe_errno(e))),
        };
        match before {
            Before::Absent => self.remove_created(dir.as_fd(), name, cur.as_ref()),
            Before::Exclusive => match cur.as_ref().and_then(|_| self.born_before_current(dir.as_fd(), name)) {
                Some(born) => (
                    Outcome::Conflict,
                    format!(
                        "journaled as created by an exclusive open, but what is there was born at {born}, before that \
                         call: the call must have failed, with the process ended before saying so; it was left in place"
                    ),
                ),
                None => self.remove_created(dir.as_fd(), name, cur.as_ref()),
            },
            Before::Contents(snap) => self.restore(dir.as_fd(), name, path, cur.as_ref(), snap),
            Before::Irreversible { .. } | Before::Born { .. } | Before::Kept { .. } => unreachable!("handled above"),
        }
    }

    /// When the node at `name` was born, if that was clearly before the record being undone
    /// was made (see [`Before::Exclusive`]). `None` when it was born after, or when either time
    /// is unknown (no birth times on this file system).
    fn born_before_current(&self, dir: BorrowedFd<'_>, name: &[u8]) -> Option<String> {
        let seq = self.current.get()?;
        let rec = &self.journal.records[self.journal.records.binary_search_by_key(&seq, |r| r.seq).ok()?];
        let made = humantime::parse_rfc3339_weak(&rec.time).ok()?;
        let sx = rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BTIME).ok()?;
        if sx.stx_mask & StatxFlags::BTIME.bits() == 0 {
            return None;
        }
        let born = std::time::UNIX_EPOCH
            .checked_add(std::time::Duration::new(u64::try_from(sx.stx_btime.tv_sec).ok()?, sx.stx_btime.tv_nsec))?;
        let slack = std::time::Duration::from_secs(crate::record::EXCLUSIVE_BIRTH_SLACK_S);
        (born + slack < made).then(|| humantime::format_rfc3339_nanos(born).to_string())
    }

    /// Whether record `seq` is undone by this undo, or was by an earlier one (the journal's
    /// records are sorted by seq).
    fn undoes(&self, seq: u64) -> bool {
        self.already.contains(&seq)
            || (self.only.is_none_or(|o| o.contains(&seq))
                && self.journal.records.binary_search_by_key(&seq, |r| r.seq).is_ok())
    }

    fn remove_created(&self, dir: BorrowedFd<'_>, name: &[u8], cur: Option<&Stat>) -> Done {
        let Some(st) = cur else {
            return (Outcome::Unchanged, "already absent".into());
        };
        match remove_any(dir, name, st) {
            Ok(()) => (Outcome::Removed, format!("removed {} the session created", type_name(st))),
            Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => {
                let entries = list_some(dir, name);
                failed(format!(
                    "the directory was created during the session but still holds entries the journal did not create ({entries}); it was left in place"
                ))
            }
            Err(e) => failed(format!("could not remove it: {}", describe_errno(e))),
        }
    }

    fn restore(&self, dir: BorrowedFd<'_>, name: &[u8], path: &BPath, cur: Option<&Stat>, snap: &Snapshot) -> Done {
        // The inode this record captured is no longer at its path but in the store (a later
        // unlink or rename over it linked it there): restore the inode itself, which the
        // older step then puts back, with this state in it.
        let in_place_kind =
            matches!(&snap.node, Node::Prefix { .. } | Node::File { how: CaptureHow::Copy | CaptureHow::Reflink, .. });
        if in_place_kind && !cur.is_some_and(|st| ident_of(st) == snap.ident) {
            if let Some(blob) = self.stored_inode(snap.ident) {
                return self.restore_in_store(blob, snap);
            }
        }
        match &snap.node {
            Node::File { blob, size, hash, how, .. } => {
                self.restore_file(dir, name, cur, snap, blob, *size, hash.as_deref(), *how)
            }
            Node::Prefix { len } => self.restore_prefix(dir, name, cur, snap, *len),
            Node::Symlink { target } => self.restore_symlink(dir, name, cur, snap, target),
            Node::Dir => self.restore_dir(dir, name, path, cur, snap),
            Node::Special { kind, rdev } => self.restore_special(dir, name, cur, snap, *kind, *rdev),
        }
    }

    /// Clears the way for a new node at `name`: removes a non-directory, or an empty directory.
    fn clear(&self, dir: BorrowedFd<'_>, name: &[u8], cur: Option<&Stat>) -> Result<bool, Done> {
        let Some(st) = cur else { return Ok(false) };
        match remove_any(dir, name, st) {
            Ok(()) => Ok(true),
            Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => Err(failed(format!(
                "a non-empty directory now stands where it was ({}); it was left in place",
                list_some(dir, name)
            ))),
            Err(e) => Err(failed(format!("could not remove {} in its place: {}", type_name(st), describe_errno(e)))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn restore_file(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        cur: Option<&Stat>,
        snap: &Snapshot,
        blob: &str,
        size: u64,
        hash: Option<&str>,
        how: CaptureHow,
    ) -> Done {
        if how == CaptureHow::Link {
            if cur.is_some_and(|st| ident_of(st) == snap.ident) {
                return (Outcome::Unchanged, "the original file is still in place".into());
            }
            let bst = match lstat(self.blobs.as_fd(), blob.as_bytes()) {
                Ok(Some(st)) => st,
                Ok(None) => return failed(format!("its captured contents (blob {blob}) are missing from the store")),
                Err(e) => return failed(format!("cannot examine blob {blob}: {}", describe_errno(e))),
            };
            if ident_of(&bst) != snap.ident || file_type(&bst) != FileType::RegularFile {
                return failed(format!(
                    "blob {blob} is no longer the captured file (its identity changed: tampered with or replaced); it was not written back"
                ));
            }
            if self.tampered.contains(blob) {
                return failed(format!(
                    "blob {blob} does not match the hash sealed with the session: it was tampered with or damaged and was not put back"
                ));
            }
            let replaced = match cur {
                Some(st) if file_type(st) == FileType::Directory => match self.clear(dir, name, cur) {
                    Ok(_) => true,
                    Err(done) => return done,
                },
                Some(_) => true,
                None => false,
            };
            return match rustix::fs::renameat(self.blobs.as_fd(), blob, dir, name) {
                Ok(()) => {
                    // A descriptor the program kept open may have changed the inode's metadata
                    // after it was unlinked (where no record can name it): set it back.
                    let times_match = bst.st_mtime == snap.mtime[0] && bst.st_mtime_nsec as i64 == snap.mtime[1];
                    if !(meta_matches(&bst, snap) && times_match) {
                        if let Some(problem) = set_meta_at(dir, name, snap) {
                            return failed(format!("put the original file back, but {problem}"));
                        }
                    }
                    if replaced {
                        (
                            Outcome::Restored,
                            format!("put the original file back over what the session left ({size} bytes)"),
                        )
                    } else {
                        (Outcome::Recreated, format!("put the original file back ({size} bytes)"))
                    }
                }
                Err(e) => failed(format!("could not move the captured file back: {}", describe_errno(e))),
            };
        }

        let src = match rustix::fs::openat(
            self.blobs.as_fd(),
            blob,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                return failed(format!("its captured contents (blob {blob}) are missing from the store"));
            }
            Err(e) => return failed(format!("cannot open blob {blob}: {}", describe_errno(e))),
        };
        let (blob_hash, blob_len) = match hash_fd(&src) {
            Ok(x) => x,
            Err(e) => return failed(format!("cannot read blob {blob}: {e}")),
        };
        let hash = self.expected_hash(blob, hash);
        if blob_len != size || hash.is_some_and(|h| h != blob_hash) {
            return failed(format!(
                "blob {blob} does not match what was captured ({blob_len} bytes, hash {}; recorded {size} bytes{}): it was tampered with or damaged and was not written back",
                &blob_hash[..16],
                hash.map(|h| format!(", hash {}", &h[..16.min(h.len())])).unwrap_or_default()
            ));
        }
        // Already identical? Then only the metadata may need setting back.
        if let Some(st) = cur.filter(|st| file_type(st) == FileType::RegularFile && st.st_size as u64 == size) {
            let same = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )
            .ok()
            .and_then(|fd| hash_fd(&fd).ok())
            .is_some_and(|(h, _)| h == blob_hash);
            if same {
                let times_match = st.st_mtime == snap.mtime[0] && st.st_mtime_nsec as i64 == snap.mtime[1];
                let handle = match MetaHandle::open(dir, name) {
                    Ok(h) => h,
                    Err(e) => return failed(format!("cannot open it: {}", describe_errno(e))),
                };
                let xattrs_match = snap.xattrs.as_ref().is_none_or(|want| xattrs_equal(&handle, want));
                if meta_matches(st, snap) && times_match && xattrs_match {
                    return (Outcome::Unchanged, "its contents and metadata are already as before".into());
                }
                return match handle.apply(&MetaTarget::of_snapshot(snap)) {
                    None => (Outcome::Restored, "its contents were already as before; set back its metadata".into()),
                    Some(p) => failed(format!("its contents are as before, but {p}")),
                };
            }
        }
        // Write in place when a regular file is there (keeps its inode and hard links),
        // otherwise create it afresh.
        let (dst, outcome) = match cur {
            Some(st) if file_type(st) == FileType::RegularFile => match open_write_in_place(dir, name, st) {
                Ok(fd) => (fd, Outcome::Restored),
                Err(e) => return failed(format!("cannot open it for writing: {}", describe_errno(e))),
            },
            other => {
                let replaced = match self.clear(dir, name, other) {
                    Ok(r) => r,
                    Err(done) => return done,
                };
                let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600)) {
                    Ok(fd) => (fd, if replaced { Outcome::Restored } else { Outcome::Recreated }),
                    Err(e) => return failed(format!("cannot create it: {}", describe_errno(e))),
                }
            }
        };
        if let Err(e) = copy_from_start(&src, &dst) {
            return failed(format!("writing the captured contents back failed: {e}"));
        }
        if let Some(problem) = set_meta_fd(dst.as_fd(), snap) {
            return failed(format!("contents restored ({size} bytes), but {problem}"));
        }
        let what = if outcome == Outcome::Recreated { "recreated it" } else { "wrote back its prior contents" };
        (outcome, format!("{what} ({size} bytes, verified) with its mode, owner and times"))
    }

    fn restore_prefix(&self, dir: BorrowedFd<'_>, name: &[u8], cur: Option<&Stat>, snap: &Snapshot, len: u64) -> Done {
        let Some(st) = cur.filter(|st| file_type(st) == FileType::RegularFile) else {
            return failed(format!(
                "only its length before an append ({len} bytes) was kept, and it is no longer a regular file; its contents cannot be restored"
            ));
        };
        let now = st.st_size as u64;
        if now < len {
            return failed(format!(
                "only its length before an append ({len} bytes) was kept, but it is now shorter ({now} bytes): bytes from before the session are gone"
            ));
        }
        if now == len
            && st.st_mtime == snap.mtime[0]
            && st.st_mtime_nsec as i64 == snap.mtime[1]
            && meta_matches(st, snap)
        {
            return (Outcome::Unchanged, format!("already {len} bytes long, as before the append"));
        }
        let fd = match open_write_in_place(dir, name, st) {
            Ok(fd) => fd,
            Err(e) => return failed(format!("cannot open it for truncation: {}", describe_errno(e))),
        };
        if let Err(e) = rustix::fs::ftruncate(&fd, len) {
            return failed(format!("cannot truncate it back to {len} bytes: {}", describe_errno(e)));
        }
        if let Some(problem) = set_meta_fd(fd.as_fd(), snap) {
            return failed(format!("truncated back to {len} bytes, but {problem}"));
        }
        (Outcome::Restored, format!("truncated the appended bytes away ({now} -> {len} bytes)"))
    }

    fn restore_symlink(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        cur: Option<&Stat>,
        snap: &Snapshot,
        target: &BPath,
    ) -> Done {
        if let Some(st) = cur.filter(|st| file_type(st) == FileType::Symlink) {
            let same = rustix::fs::readlinkat(dir, name, Vec::new()).is_ok_and(|t| t.as_bytes() == target.as_bytes());
            if same && st.st_uid == snap.uid && st.st_gid == snap.gid {
                return (Outcome::Unchanged, "the symlink is already as before".into());
            }
        }
        let replaced = match self.clear(dir, name, cur) {
            Ok(r) => r,
            Err(done) => return done,
        };
        if let Err(e) = rustix::fs::symlinkat(target.as_bytes(), dir, name) {
            return failed(format!("cannot recreate the symlink: {}", describe_errno(e)));
        }
        if let Some(problem) = set_meta_at(dir, name, snap) {
            return failed(format!("symlink recreated, but {problem}"));
        }
        let what = format!("symlink to {} put back", target.display_lossy());
        (if replaced { Outcome::Restored } else { Outcome::Recreated }, what)
    }

    fn restore_dir(&self, dir: BorrowedFd<'_>, name: &[u8], path: &BPath, cur: Option<&Stat>, snap: &Snapshot) -> Done {
        match cur {
            Some(st) if file_type(st) == FileType::Directory => {
                let times_match = st.st_mtime == snap.mtime[0] && st.st_mtime_nsec as i64 == snap.mtime[1];
                if meta_matches(st, snap) && times_match && snap.xattrs.is_none() {
                    return (Outcome::Unchanged, "the directory is already there, as before".into());
                }
                self.defer(path, DeferredMeta::Snapshot(snap.clone()));
                (
                    Outcome::Restored,
                    format!(
                        "the directory is there; its mode ({:o}), owner and times are set back at the end",
                        snap.mode
                    ),
                )
            }
            other => {
                let replaced = match self.clear(dir, name, other) {
                    Ok(r) => r,
                    Err(done) => return done,
                };
                // Created owner-writable so that its entries can be restored into it; its own
                // mode, owner, attributes and times are set at the end.
                if let Err(e) = rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
                    return failed(format!("cannot recreate the directory: {}", describe_errno(e)));
                }
                self.defer(path, DeferredMeta::Snapshot(snap.clone()));
                let what = format!("recreated the directory (mode {:o})", snap.mode);
                (if replaced { Outcome::Restored } else { Outcome::Recreated }, what)
            }
        }
    }

    fn defer(&self, path: &BPath, meta: DeferredMeta) {
        self.deferred.borrow_mut().push(Deferred { seq: self.current.get(), path: path.clone(), meta });
    }

    /// Applies deferred directory metadata, in the order it was queued (newest record first,
    /// so the oldest, the state before the session, is applied last).
    fn apply_deferred(&self, out: &mut Vec<StepReport>) {
        for d in self.deferred.take() {
            let problem = match self.parent_of(&d.path) {
                Err((_, why)) => Some(why),
                Ok((dir, name)) => match MetaHandle::open(dir.as_fd(), name) {
                    Err(e) => Some(format!("the directory cannot be reached ({})", describe_errno(e))),
                    Ok(h) => match &d.meta {
                        DeferredMeta::Snapshot(s) => h.apply(&MetaTarget::of_snapshot(s)),
                        DeferredMeta::Meta(m) => h.apply(&MetaTarget::of_meta(m)),
                    },
                },
            };
            if let Some(why) = problem {
                out.push(StepReport {
                    seq: d.seq,
                    outcome: Outcome::Failed,
                    path: Some(d.path),
                    why: format!("the directory is back, but {why}"),
                });
            }
        }
    }

    fn undo_meta(&self, _seq: Option<u64>, path: &BPath, m: &MetaBefore) -> Done {
        let what = match m.what {
            MetaKind::Mode => format!("mode ({:o})", m.mode),
            MetaKind::Owner => format!("owner ({}:{})", m.uid, m.gid),
            MetaKind::Times => "times".to_string(),
            MetaKind::Xattr => {
                format!("extended attribute {}", m.xattr.as_ref().map(|x| x.name.display_lossy()).unwrap_or_default())
            }
            MetaKind::Flags => format!("attributes ({:#x})", m.flags.unwrap_or(0)),
        };
        if self.dry_run {
            return (Outcome::Restored, format!("would set back its {what}"));
        }
        let (dir, name) = match self.parent_of(path) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let st = match lstat(dir.as_fd(), name) {
            Ok(st) => st,
            Err(e) => return failed(format!("cannot examine it: {}", describe_errno(e))),
        };
        if !st.as_ref().is_some_and(|st| ident_of(st) == m.ident) {
            if let Some(blob) = self.stored_inode(m.ident) {
                return match MetaHandle::open(self.blobs.as_fd(), blob.as_bytes()) {
                    Ok(h) => match h.apply(&MetaTarget::of_meta(m)) {
                        None => (
                            Outcome::Restored,
                            format!(
                                "set back its {what} in the captured file (blob {blob}), which an older step puts back"
                            ),
                        ),
                        Some(p) => failed(p),
                    },
                    Err(e) => failed(format!("cannot open its captured inode: {}", describe_errno(e))),
                };
            }
        }
        let Some(st) = st else {
            return failed(format!("it no longer exists, so its {what} cannot be set back"));
        };
        if (file_type(&st) == FileType::Symlink) != m.symlink {
            return (
                Outcome::Conflict,
                format!(
                    "a different kind of node ({}) now stands there; its {what} {} left alone",
                    type_name(&st),
                    if m.what == MetaKind::Times { "were" } else { "was" }
                ),
            );
        }
        if meta_already(&st, m, path) {
            return (Outcome::Unchanged, format!("its {what} {} already as before", is_are(m.what)));
        }
        if file_type(&st) == FileType::Directory {
            self.defer(path, DeferredMeta::Meta(m.clone()));
            return (Outcome::Restored, format!("its {what} {} set back at the end", is_are(m.what)));
        }
        match MetaHandle::open(dir.as_fd(), name) {
            Ok(h) => match h.apply(&MetaTarget::of_meta(m)) {
                None => (Outcome::Restored, format!("set back its {what}")),
                Some(p) => failed(p),
            },
            Err(e) => failed(format!("cannot open it to set back its {what}: {}", describe_errno(e))),
        }
    }

    fn restore_special(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        cur: Option<&Stat>,
        snap: &Snapshot,
        kind: SpecialKind,
        rdev: u64,
    ) -> Done {
        let ft = match kind {
            SpecialKind::Fifo => FileType::Fifo,
            SpecialKind::Socket => FileType::Socket,
            SpecialKind::Char => FileType::CharacterDevice,
            SpecialKind::Block => FileType::BlockDevice,
        };
        if let Some(st) = cur.filter(|st| file_type(st) == ft && st.st_rdev == rdev) {
            if meta_matches(st, snap) {
                return (Outcome::Unchanged, format!("the {} is already there", kind.name()));
            }
        }
        let replaced = match self.clear(dir, name, cur) {
            Ok(r) => r,
            Err(done) => return done,
        };
        if let Err(e) = rustix::fs::mknodat(dir, name, ft, Mode::from_raw_mode(0o600), rdev) {
            return failed(format!("cannot recreate the {}: {}", kind.name(), describe_errno(e)));
        }
        if let Some(problem) = set_meta_at(dir, name, snap) {
            return failed(format!("{} recreated, but {problem}", kind.name()));
        }
        (if replaced { Outcome::Restored } else { Outcome::Recreated }, format!("recreated the {}", kind.name()))
    }

    fn undo_move(&self, from: &BPath, to: &BPath, flags: u32) -> Done {
        if self.dry_run {
            return (Outcome::Restored, format!("would move {} back to this name", to.display_lossy()));
        }
        let (fdir, fname) = match self.parent_of(from) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let (tdir, tname) = match self.parent_of(to) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let fcur = match lstat(fdir.as_fd(), fname) {
            Ok(c) => c,
            Err(e) => return failed(format!("cannot examine it: {}", describe_errno(e))),
        };
        if let Some(st) = &fcur {
            let whiteout = flags & 4 != 0 && file_type(st) == FileType::CharacterDevice && st.st_rdev == 0;
            if !whiteout {
                return (Outcome::Unchanged, "the source is in place: the rename did not take effect".into());
            }
            if let Err(e) = rustix::fs::unlinkat(fdir.as_fd(), fname, AtFlags::empty()) {
                return failed(format!("cannot remove the whiteout left by the rename: {}", describe_errno(e)));
            }
        }
        match lstat(tdir.as_fd(), tname) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return failed(format!(
                    "it was renamed to {}, which no longer exists: the renamed file is gone",
                    to.display_lossy()
                ));
            }
            Err(e) => return failed(format!("cannot examine {}: {}", to.display_lossy(), describe_errno(e))),
        }
        match rustix::fs::renameat_with(tdir.as_fd(), tname, fdir.as_fd(), fname, RenameFlags::NOREPLACE) {
            Ok(()) => (Outcome::Restored, format!("moved back from {}", to.display_lossy())),
            Err(e) => failed(format!("cannot move it back from {}: {}", to.display_lossy(), describe_errno(e))),
        }
    }

    fn undo_exchange(&self, a: &BPath, b: &BPath, moved: Option<&crate::record::Ident>) -> Done {
        if self.dry_run {
            return (Outcome::Restored, format!("would exchange it with {} again", b.display_lossy()));
        }
        let (adir, aname) = match self.parent_of(a) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let (bdir, bname) = match self.parent_of(b) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let ast = lstat(adir.as_fd(), aname).ok().flatten();
        let bst = lstat(bdir.as_fd(), bname).ok().flatten();
        let Some(moved) = moved else {
            return failed("the exchanged file's identity was not recorded");
        };
        if ast.as_ref().is_some_and(|st| ident_of(st) == *moved) {
            return (Outcome::Unchanged, "the exchange did not take effect".into());
        }
        if !bst.as_ref().is_some_and(|st| ident_of(st) == *moved) {
            return failed(format!(
                "neither {} nor {} holds the exchanged file any more",
                a.display_lossy(),
                b.display_lossy()
            ));
        }
        match rustix::fs::renameat_with(adir.as_fd(), aname, bdir.as_fd(), bname, RenameFlags::EXCHANGE) {
            Ok(()) => (Outcome::Restored, format!("exchanged back with {}", b.display_lossy())),
            Err(e) => failed(format!("cannot exchange it back: {}", describe_errno(e))),
        }
    }
}

/// The verb for a metadata part's name ("times" is plural).
fn is_are(what: MetaKind) -> &'static str {
    if what == MetaKind::Times { "are" } else { "is" }
}

/// Opens an existing regular file for rewriting without following a symlink, making it
/// writable for the moment if its owner's mode forbids writing (undo sets the mode back).
fn open_write_in_place(dir: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Result<OwnedFd, Errno> {
    let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Err(Errno::ACCESS) if st.st_uid == rustix::process::geteuid().as_raw() => {
            rustix::fs::chmodat(dir, name, Mode::from_raw_mode((st.st_mode & 0o7777) | 0o200), AtFlags::empty())?;
            rustix::fs::openat(dir, name, flags, Mode::empty())
        }
        other => other,
    }
}

fn copy_from_start(src: &OwnedFd, dst: &OwnedFd) -> io::Result<()> {
    rustix::fs::seek(src, rustix::fs::SeekFrom::Start(0))?;
    rustix::fs::ftruncate(dst, 0)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match rustix::io::read(src, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        write_all(dst, &buf[..n])?;
    }
}

fn list_some(dir: BorrowedFd<'_>, name: &[u8]) -> String {
    let Ok(fd) = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return "unreadable".into();
    };
    let Ok(mut d) = rustix::fs::Dir::read_from(&fd) else { return "unreadable".into() };
    let mut names = Vec::new();
    let mut more = 0;
    while let Some(Ok(e)) = d.read() {
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        if names.len() < 5 {
            names.push(String::from_utf8_lossy(n).into_owned());
        } else {
            more += 1;
        }
    }
    if more > 0 { format!("{} and {more} more", names.join(", ")) } else { names.join(", ") }
}

fn describe_node(node: &Node) -> String {
    match node {
        Node::File { size, how, .. } => format!(
            "its prior contents ({size} bytes, {})",
            match how {
                CaptureHow::Link => "the original file",
                CaptureHow::Copy => "a copy",
                CaptureHow::Reflink => "a clone",
            }
        ),
        Node::Prefix { len } => format!("its length before the append ({len} bytes)"),
        Node::Symlink { target } => format!("the symlink to {}", target.display_lossy()),
        Node::Dir => "the directory".into(),
        Node::Special { kind, .. } => format!("the {}", kind.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::tests::TestCounters;
    use crate::capture::{Capturer, Intent};
    use crate::config::Budget;
    use crate::journal::JournalContents;
    use crate::record::{RECORD_VERSION, Reason};
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;

    struct Fixture {
        _t: tempfile::TempDir,
        work: PathBuf,
        blobs: PathBuf,
        counters: TestCounters,
        records: Vec<Record>,
    }

    use std::path::PathBuf;

    impl Fixture {
        fn new() -> Fixture {
            let t = tempfile::tempdir().unwrap();
            let root = fs::canonicalize(t.path()).unwrap();
            fs::create_dir(root.join("blobs")).unwrap();
            fs::create_dir(root.join("work")).unwrap();
            Fixture {
                work: root.join("work"),
                blobs: root.join("blobs"),
                _t: t,
                counters: TestCounters::default(),
                records: vec![],
            }
        }
        fn p(&self, name: &str) -> PathBuf {
            self.work.join(name)
        }
        fn bp(&self, name: &str) -> BPath {
            BPath::from(self.p(name).as_path())
        }
        /// Captures `name` (in the work directory) as the shim would before a call with `intent`.
        fn capture(&self, name: &[u8], intent: Intent) -> Before {
            let blobs = fs::File::open(&self.blobs).unwrap();
            let work = fs::File::open(&self.work).unwrap();
            let cap = Capturer {
                blobs: blobs.as_fd(),
                budget: Budget::default(),
                counters: &self.counters,
                sync: false,
                index: None,
                calls: &crate::capture::Direct,
            };
            cap.capture(work.as_fd(), name, intent)
        }
        /// Captures `name` as the shim would before a call with `intent`, and journals it.
        fn change(&mut self, name: &str, intent: Intent) {
            let before = self.capture(name.as_bytes(), intent);
            let path = self.bp(name);
            self.push(Op::Change { path, before });
        }
        fn push(&mut self, op: Op) {
            let seq = self.records.len() as u64 + 1;
            self.records.push(Record {
                v: RECORD_VERSION,
                seq,
                time: String::new(),
                pid: 1,
                ppid: 0,
                prog: BPath::from("/bin/test"),
                call: "test".into(),
                op,
            });
        }
        fn undo(&self) -> Report {
            let j = JournalContents { records: self.records.clone(), ..Default::default() };
            undo_records(&j, &self.blobs, &UndoOptions::default()).unwrap()
        }
        /// Every blob file in the store (inside its shard directory).
        fn blob_files(&self) -> Vec<PathBuf> {
            let mut out = vec![];
            for shard in fs::read_dir(&self.blobs).unwrap() {
                for b in fs::read_dir(shard.unwrap().path()).unwrap() {
                    out.push(b.unwrap().path());
                }
            }
            out
        }
        fn outcomes(r: &Report) -> Vec<Outcome> {
            r.outcomes.iter().map(|o| o.outcome).collect()
        }
    }

    #[test]
    fn an_overwritten_file_is_restored_in_place_with_its_mode() {
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"old").unwrap();
        fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o640)).unwrap();
        f.change("a", Intent::Overwrite);
        fs::write(f.p("a"), b"new and longer").unwrap();
        fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o777)).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Restored]);
        assert_eq!(fs::read(f.p("a")).unwrap(), b"old");
        assert_eq!(fs::metadata(f.p("a")).unwrap().permissions().mode() & 0o7777, 0o640);
    }

    #[test]
    fn a_created_file_is_removed_and_a_never_created_one_is_unchanged() {
        let mut f = Fixture::new();
        f.change("new", Intent::Overwrite);
        f.change("never", Intent::Overwrite);
        fs::write(f.p("new"), b"x").unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Removed]);
        assert!(!f.p("new").exists());
    }

    #[test]
    fn a_deleted_file_is_recreated_as_the_same_inode() {
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"keep me").unwrap();
        let ino = fs::metadata(f.p("a")).unwrap().ino();
        f.change("a", Intent::Destroy);
        fs::remove_file(f.p("a")).unwrap();
        let r = f.undo();
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Recreated]);
        assert_eq!(fs::read(f.p("a")).unwrap(), b"keep me");
        assert_eq!(fs::metadata(f.p("a")).unwrap().ino(), ino);
        assert_eq!(f.blob_files().len(), 0, "the blob was moved back, not copied");
        // A second run finds it in place.
        let r2 = f.undo();
        assert_eq!(Fixture::outcomes(&r2), vec![Outcome::Unchanged]);
    }

    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_removed_directory_tree_comes_back_in_order() {
        let mut f = Fixture::new();
        fs::create_dir(f.p("d")).unwrap();
        fs::set_permissions(f.p("d"), fs::Permissions::from_mode(0o751)).unwrap();
        fs::write(f.p("d/x"), b"1").unwrap();
        std::os::unix::fs::symlink("x", f.p("d/l")).unwrap();
        // rm -rf order: children, then the directory.
        f.change("d/x", Intent::Destroy);
        fs::remove_file(f.p("d/x")).unwrap();
        f.change("d/l", Intent::Destroy);
        fs::remove_file(f.p("d/l")).unwrap();
        f.change("d", Intent::Destroy);
        fs::remove_dir(f.p("d")).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Recreated; 3]);
        assert_eq!(fs::metadata(f.p("d")).unwrap().permissions().mode() & 0o7777, 0o751);
        assert_eq!(fs::read(f.p("d/x")).unwrap(), b"1");
        assert_eq!(fs::read_link(f.p("d/l")).unwrap(), PathBuf::from("x"));
    }

    #[test]
    fn a_rename_over_a_file_is_moved_back_and_the_target_restored() {
        let mut f = Fixture::new();
        fs::write(f.p("tmp"), b"new").unwrap();
        fs::write(f.p("dst"), b"old").unwrap();
        let to_before = f.capture(b"dst", Intent::Destroy);
        let moved = Some(ident_of(&rustix::fs::stat(f.p("tmp")).unwrap()));
        let (from, to) = (f.bp("tmp"), f.bp("dst"));
        f.push(Op::Rename { from, to, flags: 0, moved, to_before });
        fs::rename(f.p("tmp"), f.p("dst")).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Restored, Outcome::Recreated]);
        assert_eq!(fs::read(f.p("tmp")).unwrap(), b"new");
        assert_eq!(fs::read(f.p("dst")).unwrap(), b"old");
    }

    #[test]
    fn a_rename_that_failed_leaves_both_names_alone() {
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"a").unwrap();
        fs::write(f.p("b"), b"b").unwrap();
        let (from, to) = (f.bp("a"), f.bp("b"));
        // e.g. renameat2(RENAME_NOREPLACE) that failed with EEXIST
        f.push(Op::Rename { from, to, flags: 1, moved: None, to_before: Before::Absent });
        let r = f.undo();
        assert!(r.complete);
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged]);
        assert_eq!(fs::read(f.p("b")).unwrap(), b"b");
    }

    #[test]
    fn an_irreversible_step_is_skipped_with_its_reason_and_makes_the_undo_incomplete() {
        let mut f = Fixture::new();
        let path = f.bp("big");
        f.push(Op::Change {
            path,
            before: Before::Irreversible { reason: Reason::OverFileBudget { size: 9, limit: 1 } },
        });
        let r = f.undo();
        assert!(!r.complete);
        assert_eq!(r.outcomes[0].outcome, Outcome::Skipped);
        assert!(r.outcomes[0].why.contains("budget"), "{}", r.outcomes[0].why);
    }

    #[test]
    fn a_tampered_blob_is_never_written_back() {
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"original").unwrap();
        f.change("a", Intent::Overwrite);
        fs::write(f.p("a"), b"changed").unwrap();
        let blob = f.blob_files().remove(0);
        fs::write(&blob, b"evil!!!!").unwrap();
        let r = f.undo();
        assert!(!r.complete);
        assert_eq!(r.outcomes[0].outcome, Outcome::Failed);
        assert!(r.outcomes[0].why.contains("tampered"), "{}", r.outcomes[0].why);
        assert_eq!(fs::read(f.p("a")).unwrap(), b"changed");
    }

    #[test]
    fn a_missing_blob_fails_that_step_and_the_others_are_still_undone() {
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"1").unwrap();
        f.change("a", Intent::Overwrite);
        f.change("b", Intent::Overwrite);
        fs::write(f.p("a"), b"2").unwrap();
        fs::write(f.p("b"), b"2").unwrap();
        for b in f.blob_files() {
            fs::remove_file(b).unwrap();
        }
        let r = f.undo();
        assert!(!r.complete);
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Removed, Outcome::Failed]);
        assert!(r.outcomes[1].why.contains("missing"));
        assert!(!f.p("b").exists());
    }

    #[test]
    fn a_rewrite_of_a_file_the_session_created_is_undone_only_with_its_creation() {
        let mut f = Fixture::new();
        // #1 creates `out`, #2 rewrites it without a capture (born), #3 rewrites it again.
        f.push(Op::Change { path: f.bp("out"), before: Before::Absent });
        f.push(Op::Change { path: f.bp("out"), before: Before::Born { created: 1 } });
        f.push(Op::Change { path: f.bp("out"), before: Before::Born { created: 1 } });
        fs::write(f.p("out"), b"third").unwrap();
        let j = JournalContents { records: f.records.clone(), ..Default::default() };
        let opts = UndoOptions::default();
        let plan = |only: &BTreeSet<u64>, already: &HashSet<u64>| {
            let plan = Plan { journal: &j, blobs_dir: &f.blobs, opts: &opts, seal: None, already, only: Some(only) };
            run_plan(&plan, &mut |_, _| {}).unwrap()
        };
        // The newest record alone: what `out` held before it was not kept.
        let r = plan(&select(&j, &Selection::Last(1)), &HashSet::new());
        assert!(!r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Skipped]);
        assert!(r.outcomes[0].why.contains("not kept") && r.outcomes[0].why.contains("record 1"), "{r:?}");
        assert_eq!(fs::read(f.p("out")).unwrap(), b"third", "nothing was made up");
        // The rewrites, after an earlier undo already reversed the creation: nothing left to do.
        fs::remove_file(f.p("out")).unwrap();
        let r = plan(&BTreeSet::from([2, 3]), &HashSet::from([1]));
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Unchanged]);
        fs::write(f.p("out"), b"third").unwrap();
        // The whole session: the rewrites need nothing, the creation removes the file.
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Unchanged, Outcome::Removed]);
        assert!(!f.p("out").exists());
    }

    #[test]
    fn a_rewrite_kept_by_an_earlier_copy_is_undone_only_with_that_copy() {
        let mut f = Fixture::new();
        fs::write(f.p("db"), b"before the session").unwrap();
        f.change("db", Intent::Overwrite); // #1: the copy
        fs::write(f.p("db"), b"first rewrite").unwrap();
        f.push(Op::Change { path: f.bp("db"), before: Before::Kept { by: 1 } }); // #2
        fs::write(f.p("db"), b"second rewrite").unwrap();
        let j = JournalContents { records: f.records.clone(), ..Default::default() };
        let opts = UndoOptions::default();
        let only = BTreeSet::from([2]);
        let none = HashSet::new();
        let plan =
            Plan { journal: &j, blobs_dir: &f.blobs, opts: &opts, seal: None, already: &none, only: Some(&only) };
        let r = run_plan(&plan, &mut |_, _| {}).unwrap();
        assert!(!r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Skipped]);
        assert!(r.outcomes[0].why.contains("record 1"), "{r:?}");
        assert_eq!(fs::read(f.p("db")).unwrap(), b"second rewrite", "nothing was made up");
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Restored]);
        assert_eq!(fs::read(f.p("db")).unwrap(), b"before the session");
    }

    #[test]
    fn an_exclusive_create_removes_only_what_was_born_after_its_record() {
        use std::time::{Duration, SystemTime};
        let stamp = |t: SystemTime| humantime::format_rfc3339_nanos(t).to_string();
        let mut f = Fixture::new();
        fs::write(f.p("old"), b"there before the session").unwrap();
        // A process killed between its exclusive open's EEXIST and the call_failed record:
        // the record stands alone, and the file at its path is older than it.
        f.push(Op::Change { path: f.bp("old"), before: Before::Exclusive });
        f.records.last_mut().unwrap().time = stamp(SystemTime::now() + Duration::from_secs(60));
        // An exclusive open that did create its file: born after the record.
        f.push(Op::Change { path: f.bp("new"), before: Before::Exclusive });
        f.records.last_mut().unwrap().time = stamp(SystemTime::now());
        fs::write(f.p("new"), b"made in the session").unwrap();
        let r = f.undo();
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Removed, Outcome::Conflict], "{r:?}");
        assert!(!r.complete, "a step left in place is never a complete undo");
        assert!(r.outcomes[1].why.contains("born at"), "{r:?}");
        assert!(!f.p("new").exists());
        assert_eq!(fs::read(f.p("old")).unwrap(), b"there before the session", "nothing that was there is removed");
    }

    #[test]
    fn a_symlink_planted_above_a_path_is_a_conflict_and_is_not_followed() {
        let mut f = Fixture::new();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir(f.p("d")).unwrap();
        fs::write(f.p("d/a"), b"1").unwrap();
        f.change("d/a", Intent::Overwrite);
        // After the session, someone swaps d for a symlink pointing elsewhere.
        fs::remove_file(f.p("d/a")).unwrap();
        fs::remove_dir(f.p("d")).unwrap();
        std::os::unix::fs::symlink(outside.path(), f.p("d")).unwrap();
        let r = f.undo();
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Conflict]);
        assert!(fs::read_dir(outside.path()).unwrap().next().is_none(), "nothing was written through the symlink");
    }

    #[test]
    fn a_temporary_name_whose_record_never_came_makes_the_undo_incomplete_and_names_what_is_there() {
        let mut f = Fixture::new();
        // Completed: the intent, then the created name (removed by undo).
        f.push(Op::TempName { template: f.bp("tmpXXXXXX") });
        f.push(Op::Change { path: f.bp("tmpAb12Cd"), before: Before::Absent });
        fs::write(f.p("tmpAb12Cd"), b"").unwrap();
        // Failed: the intent, then its call_failed.
        f.push(Op::TempName { template: f.bp("tmpXXXXXX") });
        f.push(Op::CallFailed { of_seq: 3, errno: 17 }); // EEXIST
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert!(!f.p("tmpAb12Cd").exists());
        // Interrupted: the process died between the call and the record naming its file.
        f.push(Op::TempName { template: f.bp("tmpXXXXXX") });
        fs::write(f.p("tmpZz99Yy"), b"").unwrap();
        fs::write(f.p("other-name"), b"").unwrap();
        let r = f.undo();
        assert!(!r.complete);
        let step = r.outcomes.iter().find(|o| o.seq == Some(5)).expect("the interrupted intent is reported");
        assert_eq!(step.outcome, Outcome::Skipped);
        assert!(step.why.contains("tmpZz99Yy") && !step.why.contains("other-name"), "{}", step.why);
        assert!(f.p("tmpZz99Yy").exists(), "a name undo cannot prove the session made is never removed");
    }

    #[test]
    fn only_a_later_record_of_the_same_process_completes_a_temporary_name() {
        let template = BPath::from("/d/tmpXXXXXX");
        let rec = |seq: u64, pid: u32, op: Op| Record {
            v: RECORD_VERSION,
            seq,
            time: String::new(),
            pid,
            ppid: 0,
            prog: BPath::from("/bin/test"),
            call: "mkstemp".into(),
            op,
        };
        let absent = |p: &str| Op::Change { path: BPath::from(p), before: Before::Absent };
        let j = |records: Vec<Record>| JournalContents { records, ..Default::default() };
        let t = || Op::TempName { template: template.clone() };
        // Another process's file, a name in another directory, a name of another length.
        let interrupted = j(vec![
            rec(1, 10, t()),
            rec(2, 11, absent("/d/tmpabcdef")),
            rec(3, 10, absent("/e/tmpabcdef")),
            rec(4, 10, absent("/d/tmpabcdefg")),
        ])
        .interrupted_temp_names();
        assert_eq!(interrupted, HashSet::from([1]));
        // Two intents of one process, one completion: one stays open.
        let interrupted =
            j(vec![rec(1, 10, t()), rec(2, 10, t()), rec(3, 10, absent("/d/tmpabcdef"))]).interrupted_temp_names();
        assert_eq!(interrupted.len(), 1);
        assert!(j(vec![rec(1, 10, t()), rec(2, 10, absent("/d/tmpQ1w2E3"))]).interrupted_temp_names().is_empty());
    }

    #[test]
    fn an_append_is_undone_by_truncating_to_the_prior_length() {
        let mut f = Fixture::new();
        fs::write(f.p("log"), b"line1\n").unwrap();
        f.change("log", Intent::Append);
        fs::OpenOptions::new().append(true).open(f.p("log")).unwrap().write_all(b"line2\n").unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(fs::read(f.p("log")).unwrap(), b"line1\n");
        assert_eq!(f.counters.bytes_kept(), 0);
    }

    use crate::capture::Counters;
    use std::io::Write;

    #[test]
    fn a_created_directory_with_foreign_entries_is_reported_not_deleted() {
        let mut f = Fixture::new();
        f.change("d", Intent::Overwrite);
        fs::create_dir(f.p("d")).unwrap();
        fs::write(f.p("d/user-file"), b"not journaled").unwrap();
        let r = f.undo();
        assert!(!r.complete);
        assert_eq!(r.outcomes[0].outcome, Outcome::Failed);
        assert!(r.outcomes[0].why.contains("user-file"), "{}", r.outcomes[0].why);
        assert!(f.p("d/user-file").exists());
    }

    #[test]
    fn non_utf8_names_are_restored_exactly() {
        let mut f = Fixture::new();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9\nname");
        fs::write(f.work.join(name), b"x").unwrap();
        let before = f.capture(name.as_bytes(), Intent::Destroy);
        let path = BPath::from(f.work.join(name).as_path());
        f.push(Op::Change { path, before });
        fs::remove_file(f.work.join(name)).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(fs::read(f.work.join(name)).unwrap(), b"x");
        let json = r.to_json();
        assert!(json["outcomes"][0]["path_b64"].is_string(), "{json}");
    }

    #[test]
    fn an_unobserved_process_is_skipped_unless_its_call_failed() {
        use crate::record::UnobservedReason;
        let mut f = Fixture::new();
        let reason = UnobservedReason::CredentialsChanged { uid: 65534, store_owner: 0 };
        f.push(Op::Unobserved { program: BPath::from("/usr/bin/setpriv"), reason: reason.clone() });
        let r = f.undo();
        assert!(!r.complete);
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Skipped]);
        assert!(r.outcomes[0].why.contains("uid 65534"), "{}", r.outcomes[0].why);
        f.push(Op::CallFailed { of_seq: 1, errno: 1 });
        let r = f.undo();
        assert!(r.complete, "the switch failed, so nothing ran unobserved: {r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged]);
    }

    fn meta(f: &mut Fixture, name: &str, what: crate::record::MetaKind, xattr: Option<&str>) {
        let path = f.bp(name);
        let st = rustix::fs::lstat(f.p(name)).unwrap();
        let xattr = xattr.map(|n| crate::record::XattrBefore {
            name: BPath::from(n),
            value: crate::capture::xattr_value(path.as_bytes(), n.as_bytes()).unwrap().map(crate::record::Bytes),
        });
        f.push(Op::Meta { path, before: crate::capture::meta_before(&st, what, xattr) });
    }

    #[test]
    fn mode_times_and_xattr_changes_are_set_back_and_only_those() {
        use crate::record::MetaKind;
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"x").unwrap();
        fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o640)).unwrap();
        rustix::fs::setxattr(f.p("a").as_path(), "user.keep", b"v1", rustix::fs::XattrFlags::empty()).unwrap();
        let mtime = fs::metadata(f.p("a")).unwrap().modified().unwrap();
        meta(&mut f, "a", MetaKind::Mode, None);
        fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o777)).unwrap();
        meta(&mut f, "a", MetaKind::Times, None);
        fs::File::options().write(true).open(f.p("a")).unwrap().set_modified(std::time::UNIX_EPOCH).unwrap();
        meta(&mut f, "a", MetaKind::Xattr, Some("user.keep"));
        rustix::fs::setxattr(f.p("a").as_path(), "user.keep", b"v2", rustix::fs::XattrFlags::empty()).unwrap();
        meta(&mut f, "a", MetaKind::Xattr, Some("user.new"));
        rustix::fs::setxattr(f.p("a").as_path(), "user.new", b"n", rustix::fs::XattrFlags::empty()).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(Fixture::outcomes(&r), vec![Outcome::Restored; 4]);
        assert_eq!(fs::metadata(f.p("a")).unwrap().permissions().mode() & 0o7777, 0o640);
        assert_eq!(fs::metadata(f.p("a")).unwrap().modified().unwrap(), mtime);
        assert_eq!(crate::capture::xattr_value(f.bp("a").as_bytes(), b"user.keep").unwrap().unwrap(), b"v1");
        assert_eq!(crate::capture::xattr_value(f.bp("a").as_bytes(), b"user.new").unwrap(), None);
        assert_eq!(fs::read(f.p("a")).unwrap(), b"x", "contents untouched by metadata undo");
    }

    #[test]
    fn a_directory_created_and_removed_within_the_session_leaves_no_failed_metadata() {
        let mut f = Fixture::new();
        // mkdir d; mkdir d/sub; rm -rf d: the undo recreates both, then removes both.
        f.change("d", Intent::Overwrite);
        fs::create_dir(f.p("d")).unwrap();
        f.change("d/sub", Intent::Overwrite);
        fs::create_dir(f.p("d/sub")).unwrap();
        fs::set_permissions(f.p("d/sub"), fs::Permissions::from_mode(0o750)).unwrap();
        f.change("d/sub", Intent::Destroy);
        fs::remove_dir(f.p("d/sub")).unwrap();
        f.change("d", Intent::Destroy);
        fs::remove_dir(f.p("d")).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(
            Fixture::outcomes(&r),
            vec![Outcome::Recreated, Outcome::Recreated, Outcome::Removed, Outcome::Removed]
        );
        assert!(!f.p("d").exists());
    }

    #[test]
    fn a_directory_moved_back_takes_its_pending_mode_with_it() {
        let mut f = Fixture::new();
        fs::create_dir(f.p("d")).unwrap();
        fs::set_permissions(f.p("d"), fs::Permissions::from_mode(0o751)).unwrap();
        // mv d e; chmod 700 e
        let moved = Some(ident_of(&rustix::fs::stat(f.p("d")).unwrap()));
        f.push(Op::Rename { from: f.bp("d"), to: f.bp("e"), flags: 0, moved, to_before: Before::Absent });
        fs::rename(f.p("d"), f.p("e")).unwrap();
        let before = crate::capture::meta_before(&rustix::fs::lstat(f.p("e")).unwrap(), MetaKind::Mode, None);
        f.push(Op::Meta { path: f.bp("e"), before });
        fs::set_permissions(f.p("e"), fs::Permissions::from_mode(0o700)).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert!(!f.p("e").exists());
        assert_eq!(fs::metadata(f.p("d")).unwrap().permissions().mode() & 0o7777, 0o751);
    }

    #[test]
    fn a_recreated_directory_gets_its_mode_and_times_only_after_its_entries() {
        let mut f = Fixture::new();
        fs::create_dir(f.p("ro")).unwrap();
        fs::write(f.p("ro/inner"), b"1").unwrap();
        rustix::fs::setxattr(f.p("ro").as_path(), "user.dir", b"d", rustix::fs::XattrFlags::empty()).unwrap();
        f.change("ro/inner", Intent::Destroy);
        fs::remove_file(f.p("ro/inner")).unwrap();
        fs::set_permissions(f.p("ro"), fs::Permissions::from_mode(0o555)).unwrap();
        // What the rmdir capture sees, and what must be reinstated once `inner` is back.
        let mtime = fs::metadata(f.p("ro")).unwrap().modified().unwrap();
        f.change("ro", Intent::Destroy);
        fs::remove_dir(f.p("ro")).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        let md = fs::metadata(f.p("ro")).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o555);
        assert_eq!(md.modified().unwrap(), mtime, "directory mtime set after its entries were put back");
        assert_eq!(fs::read(f.p("ro/inner")).unwrap(), b"1");
        assert_eq!(crate::capture::xattr_value(f.bp("ro").as_bytes(), b"user.dir").unwrap().unwrap(), b"d");
    }

    #[test]
    fn a_failed_step_superseded_by_an_exact_older_restore_is_forgiven() {
        let mut f = Fixture::new();
        fs::write(f.p("log"), b"orig").unwrap();
        f.change("log", Intent::Overwrite); // a full, hashed copy of "orig"
        fs::write(f.p("log"), b"rewritten").unwrap();
        f.change("log", Intent::Append); // only the length: 9
        // The file then vanishes in a way the journal does not explain step by step (a race).
        fs::remove_file(f.p("log")).unwrap();
        let r = f.undo();
        assert!(r.complete, "{r:?}");
        assert_eq!(fs::read(f.p("log")).unwrap(), b"orig");
        assert_eq!(r.outcomes[0].outcome, Outcome::Unchanged);
        assert!(r.outcomes[0].why.contains("could not be replayed") && r.outcomes[0].why.contains("verified"), "{r:?}");
    }

    #[test]
    fn a_failed_step_is_not_forgiven_when_the_prior_state_cannot_be_verified() {
        let mut f = Fixture::new();
        fs::write(f.p("log"), b"orig").unwrap();
        f.change("log", Intent::Append); // only the length is known: nothing to verify against
        fs::write(f.p("log"), b"o").unwrap(); // bytes from before the session are gone
        let r = f.undo();
        assert!(!r.complete);
        assert_eq!(r.outcomes[0].outcome, Outcome::Failed);
    }

    #[test]
    fn a_dry_run_changes_nothing() {
        let mut f = Fixture::new();
        fs::write(f.p("a"), b"old").unwrap();
        f.change("a", Intent::Overwrite);
        fs::write(f.p("a"), b"new").unwrap();
        let j = JournalContents { records: f.records.clone(), ..Default::default() };
        let r = undo_records(&j, &f.blobs, &UndoOptions { dry_run: true, ..Default::default() }).unwrap();
        assert!(r.dry_run && r.complete);
        assert_eq!(fs::read(f.p("a")).unwrap(), b"new");
    }
}
