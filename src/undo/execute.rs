//! Executing a plan: every selected record, newest first, after every path has been compared
//! with the seal; the report of each step.

use std::io;

use rustix::io::Errno;

use super::fs::*;
use super::*;

/// Executes a plan.
pub fn run_plan(plan: &Plan<'_>, progress: &mut dyn FnMut(usize, usize)) -> io::Result<Report> {
    run_plan_streaming(plan, progress, None)
}

/// [`run_plan`], handing each step that ends exactly to `sink` as it ends (see
/// [`Report::outcomes`]).
pub(super) fn run_plan_streaming(
    plan: &Plan<'_>,
    progress: &mut dyn FnMut(usize, usize),
    mut sink: Option<&mut dyn FnMut(StepReport)>,
) -> io::Result<Report> {
    super::tree::start_undo();
    let blobs_fd = rustix::fs::open(plan.blobs_dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    // A dry run acts on an overlay; its made-up nodes start from a real status.
    let sim = match plan.opts.dry_run {
        true => Some(std::rc::Rc::new(Sim::new(rustix::fs::fstat(&blobs_fd)?, plan.seal.map(|s| s.paths.names())))),
        false => None,
    };
    use std::os::unix::ffi::OsStrExt;
    let blobs_dir = Dir::real(plan.blobs_dir.as_os_str().as_bytes(), blobs_fd, sim.clone());
    let blobs = blobs_dir.borrowed()?;
    let mut linked = std::collections::HashMap::new();
    let mut hashed = std::collections::HashMap::new();
    // How many records name each inode they kept, and what each linked capture recorded.
    let mut named = std::collections::HashMap::new();
    let mut link_captures = Vec::new();
    for r in &plan.journal.records {
        let Some(Before::Contents(snap)) = r.op.before() else { continue };
        *named.entry(snap.ident).or_insert(0u32) += 1;
        match &snap.node {
            Node::File { blob, how: CaptureHow::Link, size, .. } => {
                linked.entry(snap.ident).or_insert_with(|| blob.clone());
                link_captures.push((blob.as_str(), snap.ident, (*size, snap.mtime, r.time.0)));
            }
            // A copy reused by identity names its blob without a hash: the record that made
            // the blob has it.
            Node::File { blob, hash: Some(h), .. } => {
                hashed.entry(blob.clone()).or_insert_with(|| h.clone());
            }
            _ => {}
        }
    }
    // The linked blobs whose inode no other record names, with their record's size, mtime
    // and time.
    let lone: std::collections::HashMap<&str, (u64, [i64; 2], i64)> = link_captures
        .into_iter()
        .filter(|(_, ident, _)| named.get(ident) == Some(&1))
        .map(|(blob, _, captured)| (blob, captured))
        .collect();
    // Each blob not to be trusted, and how it is known.
    let mut tampered = std::collections::HashMap::new();
    // When the session's first step was made (ns): a kept inode born before is no file the
    // session made.
    let session_began = plan.journal.records.first().map_or(i64::MIN, |r| r.time.0);
    if let Some(seal) = plan.seal {
        for (blob, want) in &seal.blob_hashes {
            let got = rustix::fs::openat(
                blobs,
                blob.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
            .and_then(|fd| hash_fd(&fd).ok())
            .map(|(h, _)| h);
            if got.as_ref().is_some_and(|g| g != want) {
                tampered.insert(blob.clone(), "does not match the hash sealed with the session");
            }
        }
        // A blob still there but not as sealed was changed since: never trusted. (One gone is
        // named missing where a step needs it.) Its change time is compared while no undo of
        // the session has run: a redo moves blobs back into the store.
        for (blob, want) in &seal.blob_stats {
            let now = rustix::fs::statat(blobs, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW);
            if now.is_ok_and(|st| !want.unchanged(&st, plan.earlier_undo)) {
                tampered.insert(blob.clone(), "is not what it was when the session was sealed");
            } else if lone.get(blob.as_str()).is_some_and(|captured| written_since(want, *captured))
                && born_before(&blobs_dir, blob, session_began)
            {
                // Written since its capture, while no other record names its inode and it is no
                // file the session made: through a descriptor the journal never saw (one
                // inherited from outside the session). A file the session made, or wrote
                // through a call it journaled, is written by its own processes, whose steps
                // undo takes back.
                tampered.insert(
                    blob.clone(),
                    "was written after it was captured, through a descriptor the journal never saw (its size or modification time are not those of its capture)",
                );
            }
        }
    }
    let store_dev = rustix::fs::fstat(blobs)?.st_dev;
    let exec = Executor {
        store_dev,
        blobs: blobs_dir,
        sim,
        blobs_path: plan.blobs_dir.to_path_buf(),
        linked,
        hashed,
        tampered,
        force: plan.opts.force,
        journal: plan.journal,
        seal: plan.seal,
        only: plan.only,
        already: plan.already,
        undo_times: plan.undo_times,
        turn_ends: Default::default(),
        deferred: Default::default(),
        prior: Default::default(),
        current: Default::default(),
        drift: Default::default(),
        prechecked: Default::default(),
        interrupted: plan.journal.interrupted_temp_names(),
        expected: Default::default(),
        after_seal: Default::default(),
        parent: Default::default(),
        dir_times: Default::default(),
    };
    let failed_calls = plan.journal.failed_calls();
    let mut report = Report { dry_run: plan.opts.dry_run, sealed: plan.seal.is_some(), ..Default::default() };
    // Walked again rather than collected (a list of a million was 8 MB at the undo's peak).
    let todo = || plan.journal.records.iter().rev().filter(|r| plan.only.is_none_or(|o| o.contains(&r.seq)));
    let total = todo().count();
    // Every path is compared with the seal before anything is restored: a restore through one
    // name (a hard link) must not make another look changed.
    // The paths are looked at on every CPU, each directory opened once (nothing changes yet).
    if !plan.opts.force {
        // Each path once, a slice at a time: the states of a million paths at once were a
        // tenth of the undo's memory, slices of 65,536 left 17 MB the allocator kept (results
        // of 112 bytes a path), and the list of every path with a set of them 35 MB more.
        let mut seen = FirstSeen::new(plan.seal);
        let mut paths = todo()
            .filter(|r| !plan.already.contains(&r.seq))
            .filter(|r| !matches!(&r.op, Op::Change { before: Before::Irreversible { .. }, .. }))
            .flat_map(|r| crate::select::record_paths(r))
            .filter(|p| seen.first(p));
        let mut drift = exec.drift.borrow_mut();
        let mut slice = Vec::with_capacity(1 << 12);
        loop {
            slice.clear();
            slice.extend(paths.by_ref().take(1 << 12));
            if slice.is_empty() {
                break;
            }
            let states = crate::seal::states_of(&slice, plan.seal);
            for (p, now) in slice.iter().zip(states) {
                // None: unchanged since the seal, by its lstat alone.
                if let Some(why) = now.and_then(|now| exec.drift_verdict(p, now)) {
                    drift.insert(p, why);
                }
            }
        }
        exec.prechecked.set(true);
    }
    exec.learn_prior_facts(plan, &failed_calls);
    // Files are removed by a thread of their own while the next steps are taken.
    let removing = if plan.opts.dry_run { None } else { super::remover::start() };
    // The steps not yet handed to the sink start here.
    let mut kept = 0;
    for (i, rec) in todo().enumerate() {
        progress(i, total);
        let overlaps = removing.is_some() && exec.may_overlap_removals(rec);
        if !overlaps {
            super::remover::wait();
        }
        exec.report_failed_removals(&mut report);
        // The steps before the oldest removal still queued are final: printed (and dropped)
        // now. That one and those after it may yet be failed by it.
        if let Some(sink) = sink.as_mut() {
            let upto = match super::remover::oldest_queued() {
                None => Some(report.outcomes.len()),
                Some(Some(step)) => {
                    let after = report.outcomes[kept..].iter().position(|o| o.seq.is_none_or(|s| s <= step));
                    Some(kept + after.unwrap_or(report.outcomes.len() - kept))
                }
                Some(None) => None,
            };
            // (Behind a queue, in pieces: the steps after it are moved down each time.)
            if let Some(upto) = upto.filter(|&u| u == report.outcomes.len() || u >= kept + STREAM_BEHIND_QUEUE) {
                kept = report.stream_range(kept, upto, *sink);
            }
        }
        super::remover::set_step(Some(rec.seq), overlaps);
        if plan.already.contains(&rec.seq) {
            if rec.op.primary_path().is_some() && !matches!(rec.op, Op::Exec { .. }) {
                report.outcomes.push(StepReport {
                    seq: Some(rec.seq),
                    outcome: Outcome::Unchanged,
                    path: rec.op.primary_path().cloned(),
                    why: "already undone by an earlier undo".into(),
                    cause: Cause::AlreadyUndone,
                });
            }
            continue;
        }
        if failed_calls.contains(&rec.seq) {
            report.outcomes.push(StepReport {
                seq: Some(rec.seq),
                outcome: Outcome::Unchanged,
                path: rec.op.primary_path().cloned(),
                why: format!("the {} call failed, so it changed nothing", rec.call()),
                cause: Cause::CallChangedNothing,
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
    super::remover::set_step(None, false);
    super::remover::wait();
    exec.report_failed_removals(&mut report);
    drop(removing);
    progress(total, total);
    let before = report.outcomes.len();
    exec.apply_deferred(&mut report.outcomes);
    let later = exec.apply_dir_times(&mut report.outcomes);
    let failed_dirs: HashSet<u64> = report.outcomes[before..]
        .iter()
        .filter(|o| !o.outcome.is_success())
        .filter_map(|o| o.seq)
        .chain(later)
        .collect();
    report.undone.retain(|s| !failed_dirs.contains(&s));
    exec.forgive_superseded(plan, &failed_calls, &mut report);
    // A selective undo names the damaged records it chose, and those whose place is not
    // known (it cannot say they are outside what it was asked to undo).
    let chosen = |p: &crate::journal::Problem| plan.only.is_none_or(|o| p.seq().is_none_or(|s| o.contains(&s)));
    for p in plan.journal.problems.iter().filter(|p| chosen(p)) {
        report.outcomes.push(StepReport {
            seq: p.seq(),
            outcome: Outcome::Failed,
            path: None,
            why: p.describe(),
            cause: Cause::DamagedJournal,
        });
    }
    // Every path the seal holds was named by a record when the session was sealed: a path no
    // record names now lost its record (a journal truncated or removed since).
    if let (None, Some(seal)) = (plan.only, plan.seal) {
        // Marked by the seal's own index (a sorted list of a million paths was 16 MB at the
        // undo's peak, a set of them 36 MB).
        let mut named = vec![false; seal.paths.len()];
        for p in plan.journal.records.iter().flat_map(crate::select::record_paths) {
            if let Some(i) = seal.paths.index_of(p.as_bytes()) {
                named[i] = true;
            }
        }
        let unnamed = named.iter().enumerate().filter(|(_, named)| !**named);
        for path in unnamed.filter_map(|(i, _)| seal.paths.path_at(i)) {
            report.outcomes.push(StepReport {
                seq: None,
                outcome: Outcome::Failed,
                path: Some(BPath::new(path)),
                why: "the seal lists it as changed by the session, but no record of the journal names it now: its records were lost or removed, so it was not put back".into(),
                cause: Cause::DamagedJournal,
            });
        }
    }
    report.notes.extend(plan.journal.torn_messages());
    if plan.seal.is_none() && !plan.opts.force {
        report.notes.push(
            "this session was not sealed (it did not end under `aether-journal run`): paths were checked against what its newest records imply, a weaker check that cannot see a file edited in place since".into(),
        );
    }
    report.complete = report.outcomes.iter().all(|o| o.outcome.is_success());
    if let Some(sink) = sink {
        report.stream_from(0, sink);
    }
    Ok(report)
}

/// Tells the first time each path is met: a path the seal holds by a mark at its index there
/// (a set of a million paths was 27 MB at the undo's peak), any other by a set of them.
pub(super) struct FirstSeen<'a> {
    seal: Option<&'a Seal>,
    sealed: Vec<bool>,
    others: HashSet<&'a BPath>,
}

impl<'a> FirstSeen<'a> {
    pub(super) fn new(seal: Option<&'a Seal>) -> FirstSeen<'a> {
        FirstSeen { seal, sealed: vec![false; seal.map_or(0, |s| s.paths.len())], others: HashSet::new() }
    }

    /// Whether `path` is met for the first time.
    pub(super) fn first(&mut self, path: &'a BPath) -> bool {
        match self.seal.and_then(|s| s.paths.index_of(path.as_bytes())) {
            Some(i) => !std::mem::replace(&mut self.sealed[i], true),
            None => self.others.insert(path),
        }
    }
}

/// While removals are queued, the final steps before them are printed this many at a time.
const STREAM_BEHIND_QUEUE: usize = 1024;

/// Names in `template`'s directory that it can produce, as they are now (at most 10).
pub(super) fn temp_name_candidates(template: &BPath) -> Vec<String> {
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

impl<'a> Executor<'a> {
    /// Whether `rec`'s undo may be taken while removals queued before it are still being made
    /// (see [`super::remover`]): it can at most remove its own path, which none of them is in or
    /// at.
    fn may_overlap_removals(&self, rec: &Record) -> bool {
        match &rec.op {
            Op::Change { path, before: Before::Absent | Before::Exclusive } => {
                !super::remover::must_wait(path.as_bytes())
            }
            _ => false,
        }
    }

    /// Turns the steps whose queued removal failed into failures (and takes back what the
    /// undo's own journal said of them).
    fn report_failed_removals(&self, report: &mut Report) {
        for f in super::remover::take_failures() {
            super::redo::removal_failed(f.logged, &f.path, f.errno);
            let (outcome, why, cause) =
                failed_errno(f.errno, format!("could not remove it: {}", describe_errno(f.errno)));
            let queued_by = report.outcomes.iter_mut().rev().find(|o| {
                o.seq == f.step
                    && o.outcome == Outcome::Removed
                    && o.path.as_ref().is_some_and(|p| p.as_bytes() == f.path)
            });
            match queued_by {
                Some(o) => (o.outcome, o.why, o.cause) = (outcome, why, cause),
                None => report.outcomes.push(StepReport {
                    seq: f.step,
                    outcome,
                    path: Some(BPath::new(f.path)),
                    why,
                    cause,
                }),
            }
            if let Some(step) = f.step {
                report.undone.retain(|s| s != step);
            }
        }
    }

    pub(super) fn undo_record(&self, rec: &'a Record, out: &mut Vec<StepReport>) {
        let seq = Some(rec.seq);
        self.current.set(seq);
        // A step that cannot be reversed anyway touches nothing: no drift check.
        let irreversible_change = matches!(&rec.op, Op::Change { before: Before::Irreversible { .. }, .. });
        for p in crate::select::record_paths(rec).into_iter().filter(|_| !irreversible_change) {
            if let Some(why) = self.drift_of(p) {
                let cause = Cause::ChangedSinceSession { detail: why.clone() };
                out.push(StepReport { seq, outcome: Outcome::Conflict, path: Some(p.clone()), why, cause });
                return;
            }
        }
        match &rec.op {
            Op::Change { path, before } => {
                let (outcome, why, cause) = self.undo_changed_path(path, before);
                out.push(StepReport { seq, outcome, path: Some(path.clone()), why, cause });
            }
            Op::Rename(m) => {
                let crate::record::RenameOp { from, to, flags, moved, to_before } = &**m;
                let exchange = RenameFlags::from_bits_retain(*flags).contains(RenameFlags::EXCHANGE);
                let (outcome, why, cause) = if exchange {
                    self.undo_exchange(from, to, moved.as_ref())
                } else {
                    self.undo_move(from, to, *flags, moved.as_ref(), to_before)
                };
                let moved_back = outcome == Outcome::Restored;
                if moved_back {
                    self.deferred_moved(to, from, exchange);
                }
                out.push(StepReport { seq, outcome, path: Some(from.clone()), why, cause });
                // When the move did not happen the destination was never clobbered; an
                // exchange destroys nothing.
                if !exchange && moved_back && !matches!(to_before, Before::Absent) {
                    let (outcome, why, cause) = self.undo_changed_path(to, to_before);
                    out.push(StepReport { seq, outcome, path: Some(to.clone()), why, cause });
                }
            }
            Op::Meta { path, before } => {
                let (outcome, why, cause) = self.undo_meta(seq, path, before);
                out.push(StepReport { seq, outcome, path: Some(path.clone()), why, cause });
            }
            Op::Unobserved { program, reason } => {
                let why = format!("{} ran unobserved: {reason}", program.display_lossy());
                let cause = Cause::Unobserved { program: program.clone(), reason: (**reason).clone() };
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: None, why, cause });
            }
            Op::Connect { peer, result } => {
                let (outcome, why, cause) = match result {
                    ConnectResult::Failed { errno } => done_because(
                        Outcome::Unchanged,
                        Cause::CallChangedNothing,
                        format!(
                            "the connection to {peer} failed ({}): nothing was exchanged",
                            describe_errno(Errno::from_raw_os_error(*errno))
                        ),
                    ),
                    _ => done_because(
                        Outcome::Skipped,
                        Cause::Network { peer: peer.to_string() },
                        format!("network connection to {peer} cannot be unsent"),
                    ),
                };
                out.push(StepReport { seq, outcome, path: None, why, cause });
            }
            Op::Send { peer } => {
                let why = format!("data sent to {peer} cannot be unsent");
                let cause = Cause::Datagram { peer: peer.to_string() };
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: None, why, cause });
            }
            Op::Signal { target, target_prog, signal, outside: true } => {
                let prog = target_prog.as_ref().map(|p| format!(" ({})", p.display_lossy())).unwrap_or_default();
                let why =
                    format!("signal {signal} sent to process {target}{prog} outside the session cannot be taken back");
                let cause = Cause::Signal { target: *target, signal: *signal };
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: None, why, cause });
            }
            Op::Refused { what, .. } => {
                let why = format!("refused under the strict policy, so it changed nothing: {what}");
                let cause = Cause::CallChangedNothing;
                out.push(StepReport { seq, outcome: Outcome::Unchanged, path: None, why, cause });
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
                    rec.call()
                );
                let cause = Cause::InterruptedTempName;
                out.push(StepReport { seq, outcome: Outcome::Skipped, path: Some(template.clone()), why, cause });
            }
            // Set back at the end, once every entry is back (see Executor::apply_dir_times).
            Op::DirTimes { .. } => self.dir_times.borrow_mut().push(rec.seq),
            // Audit entries and marks: nothing to reverse (a completed temp_name is undone
            // through the record that names what the call created).
            Op::Signal { outside: false, .. }
            | Op::Exec { .. }
            | Op::TempName { .. }
            | Op::CallFailed { .. }
            | Op::Mark { .. } => {}
        }
    }

    /// Whether `path` changed since the session ended, and how (cached per path).
    pub(super) fn drift_of(&self, path: &'a BPath) -> Option<String> {
        if self.force {
            return None;
        }
        if let Some(why) = self.drift.borrow().get(path) {
            return Some(why.clone());
        }
        if self.prechecked.get() {
            return None;
        }
        let verdict = self.check_drift(path);
        if let Some(why) = &verdict {
            self.drift.borrow_mut().insert(path, why.clone());
        }
        verdict
    }

    pub(super) fn check_drift(&self, path: &BPath) -> Option<String> {
        self.drift_verdict(path, AfterState::of(path.as_bytes()))
    }

    /// [`Executor::check_drift`] for a path found to be `now`.
    pub(super) fn drift_verdict(&self, path: &BPath, now: io::Result<AfterState>) -> Option<String> {
        let now = match now {
            Ok(now) => now,
            Err(e) => return Some(format!("it cannot be examined ({e}); left alone")),
        };
        if super::redo::resumed(path.as_bytes()) {
            return None;
        }
        let sealed = self.seal.and_then(|seal| {
            let newer = self.after_seal.get_or_init(|| {
                let through = seal.through;
                let newer = self.journal.records.iter().filter(|r| through != 0 && r.seq > through);
                newer.flat_map(crate::select::record_paths).cloned().collect()
            });
            seal.state_of(path).filter(|_| !newer.contains(path))
        });
        if let Some(sealed) = sealed {
            return sealed.difference(&now).map(|d| {
                format!("changed since the session ended: {d}; left alone (use --force to restore it anyway)")
            });
        }
        if super::redo::resumed(path.as_bytes()) {
            return None;
        }
        if let Some(d) = self.changed_after_turn(path, &now) {
            return Some(d);
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
        let expected = self.expected.get_or_init(|| expectations(self.journal, self.already));
        match (expected.get(path).unwrap_or(&Expectation::Unknown), &now) {
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

    /// For a path the seal does not vouch for, in a session with marks: whether it changed
    /// (its change time) after the turn that last changed it ended, at the first mark after
    /// its newest record no earlier undo reversed, or after the earlier undo that last put it
    /// back, whichever is later. The user's own edits between turns are caught this way.
    /// Directories are not judged so (a later turn's entries change their change time), nor
    /// a path whose newest record is in the turn still open.
    fn changed_after_turn(&self, path: &BPath, now: &AfterState) -> Option<String> {
        if matches!(now, AfterState::Absent | AfterState::Dir { .. }) {
            return None;
        }
        let ends = self.turn_ends.get_or_init(|| {
            let marks: Vec<(u64, i64, &String)> = self
                .journal
                .records
                .iter()
                .filter_map(|r| match &r.op {
                    Op::Mark(m) => Some((r.seq, r.time.ns(), &m.name)),
                    _ => None,
                })
                .collect();
            let mut out: std::collections::HashMap<BPath, TurnEnd> = std::collections::HashMap::new();
            if marks.is_empty() {
                return out;
            }
            for r in self.journal.records.iter().rev() {
                // When an undo (or a redo, which makes it not undone again) last acted on it.
                let acted = self.undo_times.get(&r.seq);
                for p in crate::select::record_paths(r) {
                    let e = out.entry(p.clone()).or_default();
                    if let Some(at) = acted {
                        e.put_back = Some(e.put_back.map_or(at, |b| b.max(at)));
                    }
                    if !self.already.contains(&r.seq) && e.newest.is_none() {
                        e.newest = Some(r.seq);
                        e.end = marks.iter().find(|m| m.0 > r.seq).map(|m| (m.1, m.2.clone()));
                    }
                }
            }
            out
        });
        let e = ends.get(path)?;
        let (mark_ns, mark) = e.end.as_ref()?;
        let put_back = e.put_back;
        let since = put_back.map_or(*mark_ns, |u| u.max(*mark_ns));
        let st = rustix::fs::lstat(path.as_path()).ok()?;
        let ctime = (st.st_ctime as i64).saturating_mul(1_000_000_000).saturating_add(st.st_ctime_nsec as i64);
        (ctime > since).then(|| {
            let when = if put_back.is_some_and(|u| u >= *mark_ns) {
                "an earlier undo (or redo) put it back".to_string()
            } else {
                format!("the turn that last changed it ended (mark {mark:?})")
            };
            format!("changed after {when}; left alone (use --force to restore it anyway)")
        })
    }

    /// The directory `path` is in, opened without following a symlink at or above it, and
    /// its name there. The last one opened is kept for the next step in the same directory
    /// until this undo changes the tree's directories ([`Executor::forget_parent`]).
    pub(super) fn parent_of<'p>(&self, path: &'p BPath) -> Result<(Dir, &'p [u8]), Done> {
        let Some((parent, name)) = path.split_parent() else {
            return Err(failed("the path has no parent directory"));
        };
        if let Some((p, fd)) = self.parent.borrow().as_ref()
            && p.as_slice() == parent
        {
            return Ok((fd.clone(), name));
        }
        match Dir::open(parent, self.sim.as_ref()) {
            Ok(dir) => {
                *self.parent.borrow_mut() = Some((parent.to_vec(), dir.clone()));
                Ok((dir, name))
            }
            Err(Errno::LOOP) | Err(Errno::XDEV) => Err(done_because(
                Outcome::Conflict,
                Cause::SymlinkInPath { dir: BPath::new(parent.to_vec()) },
                format!(
                    "a symlink now stands in the path to {}; it was not followed and nothing was restored",
                    String::from_utf8_lossy(parent)
                ),
            )),
            Err(e @ (Errno::NOENT | Errno::NOTDIR)) => Err(failed_because(
                Cause::DirectoryGone { dir: BPath::new(parent.to_vec()) },
                format!("its directory {} no longer exists ({})", String::from_utf8_lossy(parent), describe_errno(e)),
            )),
            Err(e) => Err(failed_because(
                Cause::Errno { errno: Some(e.raw_os_error()) },
                format!("cannot open its directory: {}", describe_errno(e)),
            )),
        }
    }

    /// Forgets the directory [`Executor::parent_of`] keeps: this undo is about to move, make or
    /// remove a directory, after which a name may lead elsewhere.
    pub(super) fn forget_parent(&self) {
        self.parent.borrow_mut().take();
    }

    /// Undoes a change and keeps the deferred directory metadata true to the tree: when the
    /// step took away a directory that newer steps had put back (it did not exist before the
    /// session, or something else stood there), the metadata queued for it and for
    /// everything inside it has nowhere to go and no longer applies.
    pub(super) fn undo_changed_path(&self, path: &BPath, before: &Before) -> Done {
        // Only worth a look when metadata is queued at or under the path.
        let queued = self.deferred.borrow().iter().any(|d| d.path.starts_with_dir(path.as_bytes()));
        let dir_before = if !queued { None } else { self.directory_at(path) };
        let done = self.undo_change(path, before);
        if let Some(old) = dir_before
            && matches!(done.0, Outcome::Removed | Outcome::Restored | Outcome::Recreated)
            && self.directory_at(path) != Some(old)
        {
            self.deferred.borrow_mut().retain(|d| !d.path.starts_with_dir(path.as_bytes()));
        }
        done
    }

    /// The identity of the directory standing at `path`, if one does.
    pub(super) fn directory_at(&self, path: &BPath) -> Option<crate::record::Ident> {
        let (dir, name) = self.parent_of(path).ok()?;
        let st = dir.lstat(name).ok().flatten()?;
        (file_type(&st) == FileType::Directory).then(|| ident_of(&st))
    }

    /// Whether record `seq` is undone by this undo, or was by an earlier one (the journal's
    /// records are sorted by seq).
    pub(super) fn undoes(&self, seq: u64) -> bool {
        self.already.contains(&seq)
            || (self.only.is_none_or(|o| o.contains(&seq))
                && self.journal.records.binary_search_by_key(&seq, |r| r.seq).is_ok())
    }
}

/// Whether a linked blob sealed as `sealed` was written after its capture, which recorded its
/// size, its mtime and the record's time (ns): its size moved, or its mtime did and not to
/// before the record (by more than a second), as `utime` through a descriptor kept open on
/// the removed file sets it; a write sets it to the time of the write.
fn written_since(sealed: &crate::seal::BlobStat, (size, mtime, recorded): (u64, [i64; 2], i64)) -> bool {
    let set_back = sealed.mtime[0] < recorded.div_euclid(1_000_000_000).saturating_sub(1);
    sealed.size != size || (sealed.mtime != mtime && !set_back)
}

/// How far the file system's clock, which reads its clock tick's time, may lag the time a
/// record was made: a file made just after the session's first record is never taken for one
/// born before it.
const COARSE_CLOCK_NS: i64 = 20_000_000;

/// Whether the blob `name` in `blobs` is an inode born before `began` (ns since the epoch),
/// by more than [`COARSE_CLOCK_NS`]. `false` where birth times are not kept.
fn born_before(blobs: &Dir, name: &str, began: i64) -> bool {
    blobs.birth(name.as_bytes()).is_some_and(|(sec, nsec)| {
        let born = sec.saturating_mul(1_000_000_000).saturating_add(i64::from(nsec));
        born < began.saturating_sub(COARSE_CLOCK_NS)
    })
}
