//! What to undo: the options, the session's bookkeeping of what earlier undos reversed, and
//! the entry points that read a session and run its plan.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io;
use std::path::Path;

use super::{Cause, Outcome, Report, SeqSet, SeqTimes, StepReport, run_plan};
use crate::journal::JournalContents;
use crate::record::Op;
use crate::seal::{SEAL_FILE, Seal};
use crate::select::{Selection, select};
use crate::session::{Session, SessionError, State};

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
    /// Keep no journal of this undo (`undo --no-redo`): faster (an undo of 100,000 creations
    /// renames each file into the undo's store instead of only removing it), and `redo` cannot
    /// take it back.
    pub no_redo: bool,
}

/// File (in the session directory) listing, one per line, the records earlier selective
/// undos reversed.
pub const UNDONE_FILE: &str = "undone";

/// After a redo: the session records `seqs` that its undo reversed are not undone any more,
/// and the seal takes the state the redo left.
pub(super) fn note_redone(session: &Session, seqs: &[u64]) -> io::Result<()> {
    let now = crate::undo::now_ns();
    append_undone_lines(session, seqs.iter().copied(), b"-", now)?;
    if let Some(mut seal) = Seal::read(session.dir())? {
        let journal = session.read_journal().map_err(io::Error::other)?;
        reseal(&mut seal, &journal, &by_place(&journal, seqs.iter().copied()), None);
        seal.write(session.dir())?;
    }
    if session.state() == State::Undone {
        session.set_state(State::Active).map_err(io::Error::other)?;
    }
    crate::marks::wait_for_clock_tick(now);
    Ok(())
}

fn append_undone(session: &Session, seqs: &super::Seqs) -> io::Result<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    let now = crate::undo::now_ns();
    append_undone_lines(session, seqs.iter(), b"", now)?;
    crate::marks::wait_for_clock_tick(now);
    Ok(())
}

/// Appends a line `{sign}SEQ NOW` to the `undone` file for each of `seqs`, written as it is
/// made (the text of a million lines was 30 MB at an undo's peak).
fn append_undone_lines(
    session: &Session,
    seqs: impl IntoIterator<Item = u64>,
    sign: &[u8],
    now: i64,
) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(session.dir().join(UNDONE_FILE))?;
    let mut w = io::BufWriter::with_capacity(1 << 16, f);
    let (mut seq, mut at) = (itoa::Buffer::new(), itoa::Buffer::new());
    let at = at.format(now);
    for s in seqs {
        w.write_all(sign)?;
        w.write_all(seq.format(s).as_bytes())?;
        w.write_all(b" ")?;
        w.write_all(at.as_bytes())?;
        w.write_all(b"\n")?;
    }
    w.into_inner().map_err(io::IntoInnerError::into_error)?;
    Ok(())
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
    undo_inner(session, opts, progress, None)
}

/// [`undo_session_with_progress`], handing every step that ends exactly (restored, removed,
/// recreated or unchanged) to `step` as it ends instead of keeping it in the report, whose
/// `outcomes` then hold only the others (and `streamed` counts these): the memory of an undo
/// of a million steps is then not a million report lines. The report's verdicts
/// (`complete`, `files_exact`, the summary) are the same as without it.
pub fn undo_session_streaming(
    session: &Session,
    opts: &UndoOptions,
    progress: &mut dyn FnMut(usize, usize),
    step: &mut dyn FnMut(StepReport),
) -> Result<Report, SessionError> {
    undo_inner(session, opts, progress, Some(step))
}

fn undo_inner(
    session: &Session,
    opts: &UndoOptions,
    progress: &mut dyn FnMut(usize, usize),
    step: Option<&mut dyn FnMut(StepReport)>,
) -> Result<Report, SessionError> {
    let undone_before = session.state() == State::Undone;
    match session.state() {
        State::Undone | State::Active => {}
        State::Kept => {
            return Err(SessionError::Io {
                path: session.dir().to_path_buf(),
                source: io::Error::other(
                    "this session was kept: its captured contents were released and it cannot be undone",
                ),
            });
        }
    }
    let mut notes_live = None;
    let mut report_notes_resumed = None;
    // Asked before this undo makes its own journal there.
    let earlier_undo =
        std::fs::read_dir(session.dir().join(super::redo::UNDOS_DIR)).is_ok_and(|mut d| d.next().is_some());
    // What was written or changed since the seal is set aside (and named).
    let (journal, mut seal) = session.read_checked()?;
    let super::earlier::Earlier { undone: already, times: undo_times } = super::earlier::read(session, &journal);
    // Undone is per record: what a process of the session journaled after an earlier undo is
    // undone by this one.
    // (Unless the journal is damaged: what it is damaged in is named again, and not as done.)
    if undone_before && journal.problems.is_empty() && journal.records.iter().all(|r| already.contains(&r.seq)) {
        return Ok(Report {
            complete: true,
            already_undone: true,
            dry_run: opts.dry_run,
            notes: vec!["this session was already undone; nothing was changed".into()],
            coverage: session.coverage(),
            ..Default::default()
        });
    }
    if !opts.dry_run {
        // An undo writes down what it did; a store that cannot take it is found out before
        // anything in the tree changes.
        if let Err(source) = tempfile::tempfile_in(session.dir()) {
            return Err(SessionError::Io {
                path: session.dir().to_path_buf(),
                source: io::Error::new(
                    source.kind(),
                    format!(
                        "the session store cannot be written ({source}), so an undo could not record what it did; nothing was changed"
                    ),
                ),
            });
        }
    }
    let live = session.live_processes();
    // An undo to a mark is how a running session (a harness between two turns) is rewound:
    // what its processes journal after it is undone by the next.
    let to_mark = match opts.select {
        Some(Selection::After(seq)) => journal.records.iter().find(|r| r.seq == seq),
        _ => None,
    };
    if !live.is_empty() {
        let pids = live.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        if !opts.force && to_mark.is_none() {
            return Ok(Report {
                complete: false,
                dry_run: opts.dry_run,
                outcomes: vec![StepReport {
                    seq: None,
                    outcome: Outcome::Conflict,
                    path: None,
                    why: format!(
                        "the session is still running: process(es) {pids} still have its journal open; nothing was undone (stop them first, or use --force to undo what is journaled so far)"
                    ),
                    cause: Cause::SessionRunning { pids: live.clone() },
                }],
                coverage: session.coverage(),
                ..Default::default()
            });
        }
        notes_live = Some(format!(
            "the session was still running (process(es) {pids}): what they journal after this undo is undone by the next one"
        ));
    }
    let others_note = other_sessions_on_these_paths(session, &journal, opts, &already);
    let blobs = session.blobs_dir();
    let only = opts.select.as_ref().map(|sel| select(&journal, sel));
    let plan = Plan {
        journal: &journal,
        blobs_dir: &blobs,
        opts,
        seal: seal.as_ref(),
        already: &already,
        undo_times: &undo_times,
        only: only.as_ref(),
        earlier_undo,
    };
    // An undo killed midway is finished, not fought: what it changed is its work.
    let super::redo::Interrupted { paths: resumed, dirs: interrupted, beside } =
        super::redo::interrupted_paths(session);
    let (beside_note, beside_left) = remove_left_beside(&beside, opts.dry_run);
    if !interrupted.is_empty() {
        report_notes_resumed = Some(format!(
            "an earlier undo of this session was interrupted ({}): the paths it had changed were taken as its work, and finished",
            interrupted.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    super::redo::resume(resumed);
    // A real undo journals itself (see super::redo), so that `redo` can take it back.
    let log = match opts.dry_run || opts.no_redo {
        true => None,
        false => {
            room_for_redo(session, &plan)?;
            let (settings, _) = crate::config::Settings::from_env();
            let named = super::redo::named_inodes(&plan.journal.records);
            let sealed = seal.as_ref().map(|s| s.paths.names());
            let log = super::redo::UndoLog::create(session.dir(), settings.budget, named, sealed)
                .map_err(|source| SessionError::Io { path: session.dir().join(super::redo::UNDOS_DIR), source })?;
            Some(log.start())
        }
    };
    let ran = super::execute::run_plan_streaming(&plan, progress, step);
    super::redo::resume(HashSet::new());
    let undo_log = log.map(|l| l.finish());
    let mut report = ran.map_err(|source| SessionError::Io { path: blobs.clone(), source })?;
    if !opts.dry_run {
        // Finished by this undo: closed, so that no later undo takes their paths as undo work.
        for d in &interrupted {
            let _ = crate::session::write_atomically(&d.join(super::redo::REVERSED_FILE), b"");
        }
    }
    report.coverage = session.coverage();
    report.selected = only.as_ref().map(|o| o.len());
    report.notes.extend(notes_live);
    report.notes.extend(others_note);
    report.notes.extend(report_notes_resumed);
    report.notes.extend(beside_note);
    if !beside_left.is_empty() {
        report.outcomes.extend(beside_left);
        report.complete = false;
    }
    if let Some(crate::record::Record { seq, op: Op::Mark(mark), .. }) = to_mark {
        let name = &mark.name;
        for path in &mark.held {
            report.outcomes.push(StepReport {
                seq: Some(*seq),
                outcome: Outcome::Skipped,
                path: Some(path.clone()),
                why: format!(
                    "a process of the session held it open for writing when mark {name:?} was made: what it wrote through that descriptor after the mark was not journaled, so it was not put back as it was at the mark"
                ),
                cause: Cause::HeldOpenAtMark { mark: name.clone() },
            });
            report.complete = false;
        }
    }
    if let Some(why) = &session.header().cut_off {
        report.outcomes.push(StepReport {
            seq: None,
            outcome: Outcome::Failed,
            path: None,
            why: format!(
                "this session was cut off ({why}): what its processes did before that is not in this journal and cannot be undone"
            ),
            cause: Cause::SessionCutOff,
        });
        report.complete = false;
    }
    let lost = session.counters().lost_records;
    if lost > 0 {
        report.outcomes.push(StepReport {
            seq: None,
            outcome: Outcome::Failed,
            path: None,
            why: format!(
                "{lost} step(s) ran without a journal record (the session store could not be written); they cannot be undone"
            ),
            cause: Cause::LostRecords { count: lost },
        });
        report.complete = false;
    }
    if !opts.dry_run {
        // The tree is already changed: a failure to write down what was done is reported, as
        // a step, beside everything the undo did; it is never a bare error that hides them.
        let mut bookkeeping = append_undone(session, &report.undone).map_err(|e| (UNDONE_FILE, e));
        // Marked by each record's place in the journal (a set of a million seqs was 19 MB at
        // the undo's peak, a sorted copy of them 8 MB).
        let undone = by_place(&journal, report.undone.iter());
        if let (Ok(()), Some(mut seal)) = (&bookkeeping, seal.take()) {
            // What this undo left is what a later undo compares against: its own work is no
            // change since the session.
            reseal(&mut seal, &journal, &undone, undo_log.as_ref().map(|done| &done.paths));
            bookkeeping = seal.write(session.dir()).map_err(|e| (SEAL_FILE, e));
        }
        let all_done = journal.records.iter().zip(&undone).all(|(r, &undone)| undone || already.contains(&r.seq));
        if bookkeeping.is_ok() && report.complete && all_done && journal.problems.is_empty() {
            bookkeeping = session.set_state(State::Undone).map_err(|e| ("state.json", io::Error::other(e.to_string())));
        }
        if let Err((file, e)) = bookkeeping {
            report.outcomes.push(StepReport {
                seq: None,
                outcome: Outcome::Failed,
                path: Some(crate::bpath::BPath::from(session.dir().join(file).as_path())),
                why: format!(
                    "the steps above were taken, but what this undo did could not be written down ({e}): a later undo of this session will take its work for changes made since"
                ),
                cause: Cause::Errno { errno: e.raw_os_error() },
            });
            report.complete = false;
        }
    }
    // The undo's own journal is read back to seal it: the session's is let go first (the two
    // at once were the peak of a large undo).
    drop(journal);
    if let Some(done) = undo_log {
        let (dir, lost, not_kept) = (done.dir.clone(), done.lost, done.not_kept.clone());
        super::redo::close(done, &report.undone);
        if lost > 0 {
            report.notes.push(format!(
                "{lost} change(s) of this undo could not be journaled in {}: `redo` cannot take them back",
                dir.display()
            ));
        }
        if let (n @ 1.., why) = not_kept {
            report.notes.push(format!(
                "what {n} path(s) held before this undo changed them could not be kept ({}): `redo` cannot take those changes back exactly",
                why.unwrap_or_default()
            ));
        }
    }
    Ok(report)
}

/// Removes the files an interrupted undo was writing beside the files it restored (`beside`,
/// from its journal), where they are still regular files: a note of how many, and a failed
/// step for each that could not be removed (it is a file the tree did not hold before). A dry
/// run says what it would remove.
fn remove_left_beside(beside: &[crate::bpath::BPath], dry_run: bool) -> (Option<String>, Vec<StepReport>) {
    use rustix::fs::{AtFlags, FileType};
    let (mut removed, mut left) = (0usize, Vec::new());
    for path in beside {
        let regular =
            crate::resolve::at_path(path.as_bytes(), |d, n| rustix::fs::statat(d, n, AtFlags::SYMLINK_NOFOLLOW))
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
        if !regular {
            continue;
        }
        let gone = if dry_run {
            Ok(())
        } else {
            crate::resolve::at_path(path.as_bytes(), |d, n| rustix::fs::unlinkat(d, n, AtFlags::empty()))
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) => left.push(StepReport {
                seq: None,
                outcome: Outcome::Failed,
                path: Some(path.clone()),
                why: format!(
                    "an interrupted undo left this partly written file beside one it was restoring, and it could not be removed: {}",
                    std::io::Error::from(e)
                ),
                cause: Cause::Errno { errno: Some(e.raw_os_error()) },
            }),
        }
    }
    let would = if dry_run { "would remove" } else { "removed" };
    let note = (removed > 0).then(|| {
        format!(
            "{would} {removed} partly written file(s) an interrupted undo had left beside the files it was restoring"
        )
    });
    (note, left)
}

/// Another session that is still running (some process holds it open) and has journaled
/// changes to paths this undo puts back: what it does after this undo is not undone by it,
/// and it may change them again. Said in a note, with the session and one of the paths; a
/// session whose journal this user cannot read is not seen.
fn other_sessions_on_these_paths(
    session: &Session,
    journal: &crate::journal::JournalContents,
    opts: &UndoOptions,
    already: &SeqSet,
) -> Option<String> {
    let own = std::fs::canonicalize(session.dir()).unwrap_or_else(|_| session.dir().to_path_buf());
    let others: Vec<_> = crate::session::live_sessions().into_iter().filter(|(d, _)| *d != own).collect();
    if others.is_empty() {
        return None;
    }
    let only = opts.select.as_ref().map(|sel| select(journal, sel));
    let mine: HashSet<&crate::bpath::BPath> = journal
        .records
        .iter()
        .filter(|r| !already.contains(&r.seq) && only.as_ref().is_none_or(|o| o.contains(&r.seq)))
        .flat_map(crate::select::record_paths)
        .collect();
    let mut said = Vec::new();
    for (dir, pids) in others {
        let Ok(j) = Session::open_untrusted(&dir).and_then(|o| o.read_journal()) else { continue };
        let shared: HashSet<&crate::bpath::BPath> =
            j.records.iter().flat_map(crate::select::record_paths).filter(|p| mine.contains(p)).collect();
        if let Some(example) = shared.iter().min() {
            let pids = pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            said.push(format!(
                "another session, {} (process(es) {pids}), is still running and has journaled changes to {} of the paths this undo puts back (such as {}): what it does after this undo is not undone by it",
                dir.display(),
                shared.len(),
                example.display_lossy()
            ));
        }
    }
    (!said.is_empty()).then(|| said.join("; "))
}

/// Makes sure the session's store has room for what this undo will keep of the paths it
/// changes (so that `redo` can take it back), before anything in the tree changes: the
/// current contents of every file it rewrites, and of every file it removes from another file
/// system than the store's (one on the store's own is moved into it, which costs nothing).
/// An estimate from the records, one `lstat` per such path and one per directory of the
/// removed ones; a store that can clone (btrfs, XFS) may need less.
fn room_for_redo(session: &Session, plan: &Plan<'_>) -> Result<(), SessionError> {
    use rustix::fs::{AtFlags, FileType};
    let err = |source: io::Error| SessionError::Io { path: session.dir().to_path_buf(), source };
    let store = rustix::fs::statvfs(session.dir()).map_err(|e| err(e.into()))?;
    let avail = store.f_bavail.saturating_mul(store.f_frsize);
    let store_dev = rustix::fs::stat(session.dir()).map_err(|e| err(e.into()))?.st_dev;
    // Each path once, told by the seal's index (a set of a million paths was 25 MB more at the
    // undo's peak).
    let mut seen = super::execute::FirstSeen::new(plan.seal);
    let mut dirs: HashMap<Vec<u8>, Option<u64>> = HashMap::new();
    let mut selected = 0u64;
    let mut needed = 0u64;
    let undone = |seq: u64| !plan.already.contains(&seq) && plan.only.is_none_or(|o| o.contains(&seq));
    for r in plan.journal.records.iter().filter(|r| undone(r.seq)) {
        selected += 1;
        let (path, rewrite) = match &r.op {
            Op::Change { path, before: crate::record::Before::Contents(snap) } => {
                let file = matches!(
                    snap.node,
                    crate::record::Node::File { .. }
                        | crate::record::Node::Packed { .. }
                        | crate::record::Node::Prefix { .. }
                );
                (path, file)
            }
            Op::Change {
                path,
                before:
                    crate::record::Before::Absent | crate::record::Before::Exclusive | crate::record::Before::Born { .. },
            } => (path, false),
            _ => continue,
        };
        if !seen.first(path) {
            continue;
        }
        // A removal on the store's file system costs nothing: its directory says where it is
        // (one look per directory, not per file).
        if !rewrite {
            let dir = path.split_parent().map(|(d, _)| d.to_vec()).unwrap_or_default();
            let dev = *dirs.entry(dir).or_insert_with_key(|d| {
                crate::resolve::at_path(d, |at, n| rustix::fs::statat(at, n, AtFlags::empty())).map(|st| st.st_dev).ok()
            });
            if dev == Some(store_dev) {
                continue;
            }
        }
        let lstat =
            crate::resolve::at_path(path.as_bytes(), |at, n| rustix::fs::statat(at, n, AtFlags::SYMLINK_NOFOLLOW));
        let Ok(st) = lstat else { continue };
        if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && (rewrite || st.st_dev != store_dev) {
            needed = needed.saturating_add(crate::capture::data_bytes(&st));
        }
    }
    // Its own records, about half a kilobyte each.
    needed = needed.saturating_add(selected.saturating_mul(512));
    if needed > avail {
        return Err(err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "the session store has {} free, but this undo would keep about {} of what it changes, so that `redo` can take it back; nothing was changed (free space there, or undo with --no-redo, which keeps nothing)",
                crate::record::human_size(avail),
                crate::record::human_size(needed)
            ),
        )));
    }
    Ok(())
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
    pub already: &'a SeqSet,
    /// When an earlier undo reversed each record it did (ns since the epoch), where known.
    pub undo_times: &'a SeqTimes,
    /// The selected records, for a selective undo.
    pub only: Option<&'a BTreeSet<u64>>,
    /// Whether an undo of the session ran before this one: a redo of it may have moved the
    /// blobs it put back into the tree back into the store, which moves their change times
    /// ([`crate::seal::BlobStat::unchanged`]).
    pub earlier_undo: bool,
}

/// Undoes every record of `journal` with the blobs in `blobs_dir`, unsealed, without
/// bookkeeping (for tests and tools that manage their own journal).
pub fn undo_records(journal: &JournalContents, blobs_dir: &Path, opts: &UndoOptions) -> io::Result<Report> {
    let (none, no_times) = (SeqSet::default(), SeqTimes::default());
    let plan = Plan {
        journal,
        blobs_dir,
        opts,
        seal: None,
        already: &none,
        undo_times: &no_times,
        only: None,
        earlier_undo: true,
    };
    run_plan(&plan, &mut |_, _| {})
}

/// Whether each record of `journal` (sorted by `seq`, each `seq` once) is one of `seqs`, by
/// its place.
fn by_place(journal: &JournalContents, seqs: impl IntoIterator<Item = u64>) -> Vec<bool> {
    let mut marked = vec![false; journal.records.len()];
    for seq in seqs {
        if let Ok(i) = journal.records.binary_search_by_key(&seq, |r| r.seq) {
            marked[i] = true;
        }
    }
    marked
}

/// Takes into `seal` the state, now, of every path the records `undone` (by their place in
/// `journal`) name, without looking at those the undo's own journal says it left `absent`.
fn reseal(seal: &mut Seal, journal: &JournalContents, undone: &[bool], absent: Option<&super::redo::Paths>) {
    let named =
        journal.records.iter().zip(undone).filter(|(_, u)| **u).flat_map(|(r, _)| crate::select::record_paths(r));
    // Only the paths to look at are listed (each once, by sorting): an undo of a million
    // creations leaves a million paths absent, which are set as they come (a path set twice
    // is set the same way), where a list of them and of the rest was 24 MB at its peak.
    let mut look = Vec::new();
    for p in named {
        if absent.is_some_and(|a| a.left_absent(p.as_bytes())) {
            seal.set_state(p, crate::seal::AfterState::Absent);
        } else {
            look.push(p);
        }
    }
    look.sort_unstable();
    look.dedup();
    let states = crate::seal::states_of(&look, None);
    for (p, st) in look.into_iter().zip(states) {
        if let Some(Ok(st)) = st {
            seal.set_state(p, st);
        }
    }
}
