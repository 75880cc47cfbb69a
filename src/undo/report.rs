//! What an undo reports: an outcome per step, the summary, and the JSON contract.

use serde::Serialize;

use crate::bpath::BPath;

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

/// Why a step ended as it did, for a program to read (the JSON contract's `cause`, tagged by
/// `code`); the prose `why` beside it says the same for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Cause {
    /// The step was reversed as recorded.
    Undone,
    /// The path was already as the record says it was before.
    AlreadyAsBefore,
    /// The call failed (or was refused), so it changed nothing.
    CallChangedNothing,
    /// An earlier undo reversed this record.
    AlreadyUndone,
    /// Another record this undo (or an earlier one) reverses puts the path back.
    CoveredBy {
        /// That record.
        seq: u64,
    },
    /// The step failed, but the path is verifiably as it was before the session.
    EndedAsBefore,
    /// A connection was made: what was sent over it cannot be unsent. No file is concerned.
    Network {
        /// The peer, as `log` shows it.
        peer: String,
    },
    /// A datagram was sent. No file is concerned.
    Datagram {
        /// The destination.
        peer: String,
    },
    /// A signal reached a process outside the session. No file is concerned.
    Signal {
        /// The target as passed.
        target: i64,
        /// The signal number.
        signal: i32,
    },
    /// A program ran where nothing could see what it changed.
    Unobserved {
        /// The program.
        program: BPath,
        /// Why, as journaled.
        reason: crate::record::UnobservedReason,
    },
    /// The prior state was not kept when the call ran.
    NotKept {
        /// Why, as journaled.
        reason: crate::record::Reason,
    },
    /// What the path held before this call is only put back by undoing record `seq`, which
    /// this undo does not undo.
    NeedsRecord {
        /// That record.
        seq: u64,
    },
    /// The path changed since the session ended; it was left alone.
    ChangedSinceSession {
        /// What differs.
        detail: String,
    },
    /// A symlink now stands in the path to it; it was not followed.
    SymlinkInPath {
        /// The directory whose path holds it.
        dir: BPath,
    },
    /// Something of another kind, or born before the record, stands at the path now.
    Replaced,
    /// The node the record is about no longer exists.
    Gone,
    /// Its directory no longer exists.
    DirectoryGone {
        /// The directory.
        dir: BPath,
    },
    /// A directory still holds entries the journal did not create.
    NotEmpty,
    /// The captured contents are missing from the store.
    BlobMissing {
        /// The blob.
        blob: String,
    },
    /// The captured contents do not match what was captured (tampered with or damaged).
    BlobDamaged {
        /// The blob.
        blob: String,
    },
    /// The file was recreated from a copy, a new inode, though it had more hard links: its
    /// other names still lead to the old one.
    LinkGroupBroken {
        /// How many names it had.
        links: u64,
    },
    /// Only a shorter prefix of the prior contents survives (an append was all that was kept).
    PriorBytesGone,
    /// A system call of the restore failed.
    Errno {
        /// The errno, when one was the reason.
        errno: Option<i32>,
    },
    /// A process was killed between creating a name from a template and journaling it.
    InterruptedTempName,
    /// Processes of the session still have its journal open.
    SessionRunning {
        /// Their pids.
        pids: Vec<u32>,
    },
    /// Steps ran without a journal record (the store could not be written).
    LostRecords {
        /// How many.
        count: u64,
    },
    /// A record of the journal is damaged.
    DamagedJournal,
    /// The session's store vanished while its processes ran and was made again: what they did
    /// before is not in the journal.
    SessionCutOff,
    /// A process of the session held the file open for writing when the mark an undo goes
    /// back to was made: what it wrote after the mark was not journaled.
    HeldOpenAtMark {
        /// The mark.
        mark: String,
    },
}

impl Cause {
    /// Whether this cause leaves a file not as it was (as opposed to an effect outside the
    /// file system, which no undo can take back: a connection, a datagram, a signal).
    pub fn concerns_files(&self) -> bool {
        !matches!(self, Cause::Network { .. } | Cause::Datagram { .. } | Cause::Signal { .. })
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
    /// The same, for a program.
    pub cause: Cause,
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

/// A list of record numbers, held as runs of consecutive ones: an undo takes a journal's
/// records newest first, so a million it undid are a few runs, where a list of them was 8 MB
/// at the undo's peak. Kept in the order they were added.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seqs {
    /// Each run as its first number and its length, counting down from the first.
    runs: Vec<(u64, u64)>,
    len: usize,
}

impl Seqs {
    /// Adds `seq` at the end.
    pub fn push(&mut self, seq: u64) {
        self.len += 1;
        if let Some((first, n)) = self.runs.last_mut()
            && first.checked_sub(*n) == Some(seq)
        {
            *n += 1;
            return;
        }
        self.runs.push((seq, 1));
    }

    /// Every number, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs.iter().flat_map(|&(first, n)| (0..n).map(move |k| first - k))
    }

    /// How many numbers it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps only the numbers `keep` is true of.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        let mut kept = Seqs::default();
        for s in self.iter().filter(|&s| keep(s)) {
            kept.push(s);
        }
        *self = kept;
    }
}

impl FromIterator<u64> for Seqs {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Seqs {
        let mut out = Seqs::default();
        for s in iter {
            out.push(s);
        }
        out
    }
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
    /// One line per step, newest first, then damaged records; for an undo that streamed its
    /// steps ([`crate::undo::undo_session_streaming`]), only those that did not end exactly
    /// (the others went to the caller as they ended, and are counted in `streamed`).
    pub outcomes: Vec<StepReport>,
    /// The steps handed to the caller as they ended instead of kept in `outcomes` (each ended
    /// exactly: restored, removed, recreated or unchanged).
    pub streamed: Summary,
    /// Things worth knowing that are not steps (a torn tail).
    pub notes: Vec<String>,
    /// Whether drift was checked against a seal (false: the weaker check, or none with force).
    pub sealed: bool,
    /// The records this run undid completely.
    pub undone: Seqs,
    /// What the session's journaling could see (from its header).
    pub coverage: crate::session::Coverage,
    /// For a selective undo, how many records the selection covers (`Some(0)`: it matched
    /// nothing, and nothing was changed); `None` for a whole undo.
    pub selected: Option<usize>,
}

impl Report {
    /// Whether every file is as it was before the session: every step undone exactly, or
    /// left only with an effect outside the file system (a connection, a datagram, a signal).
    pub fn files_exact(&self) -> bool {
        self.outcomes.iter().all(|o| o.outcome.is_success() || !o.cause.concerns_files())
    }

    /// Counts of each outcome.
    pub fn summary(&self) -> Summary {
        let mut s = self.streamed.clone();
        for o in &self.outcomes {
            s.count(o.outcome);
        }
        s
    }

    /// Moves every step from `outcomes[from..]` that ended exactly to `sink`, counting it in
    /// `streamed`; the others stay, in order (later passes may still change them).
    pub(crate) fn stream_from(&mut self, from: usize, sink: &mut dyn FnMut(StepReport)) {
        self.stream_range(from, self.outcomes.len(), sink);
    }

    /// [`Report::stream_from`] for `outcomes[from..upto]` only; the steps after it stay as they
    /// are. Returns where those steps now begin.
    pub(crate) fn stream_range(&mut self, from: usize, upto: usize, sink: &mut dyn FnMut(StepReport)) -> usize {
        let from = from.min(self.outcomes.len());
        let upto = upto.clamp(from, self.outcomes.len());
        if self.outcomes[from..upto].iter().all(|o| !o.outcome.is_success()) {
            return upto;
        }
        let mut stay = Vec::new();
        for o in self.outcomes.drain(from..upto) {
            if o.outcome.is_success() {
                self.streamed.count(o.outcome);
                sink(o);
            } else {
                stay.push(o);
            }
        }
        let begins = from + stay.len();
        self.outcomes.splice(from..from, stay);
        begins
    }

    /// The report as the JSON object `undo --json` prints (a documented contract).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(JsonRest(self)).unwrap_or_default();
        v["outcomes"] = serde_json::to_value(Steps(&self.outcomes)).unwrap_or_default();
        v
    }

    /// [`Report::to_json`] written to `out` as it is made, one step at a time (the value of a
    /// million steps took several times the memory of the undo itself).
    pub fn write_json(&self, out: &mut dyn std::io::Write) -> serde_json::Result<()> {
        JsonStream::default().finish(out, self)
    }
}

impl Summary {
    /// Counts one step that ended `outcome`.
    fn count(&mut self, outcome: Outcome) {
        self.total += 1;
        *match outcome {
            Outcome::Restored => &mut self.restored,
            Outcome::Removed => &mut self.removed,
            Outcome::Recreated => &mut self.recreated,
            Outcome::Unchanged => &mut self.unchanged,
            Outcome::Skipped => &mut self.skipped,
            Outcome::Failed => &mut self.failed,
            Outcome::Conflict => &mut self.conflict,
        } += 1;
    }
}

/// Writes the JSON object of [`Report::to_json`] while the undo runs: the steps that ended
/// exactly as they are handed over (see [`crate::undo::undo_session_streaming`]), then, when
/// the report is done, the others and every other key. `outcomes` comes first in the text.
#[derive(Debug, Default)]
pub struct JsonStream {
    steps: usize,
}

impl JsonStream {
    /// Writes one step of `outcomes`.
    pub fn step(&mut self, out: &mut dyn std::io::Write, o: &StepReport) -> serde_json::Result<()> {
        out.write_all(if self.steps == 0 { b"{\"outcomes\":[" } else { b"," }).map_err(serde_json::Error::io)?;
        self.steps += 1;
        serde_json::to_writer(&mut *out, &JsonStep(o))
    }

    /// Writes the steps `report` kept, then the rest of the object.
    pub fn finish(mut self, out: &mut dyn std::io::Write, report: &Report) -> serde_json::Result<()> {
        for o in &report.outcomes {
            self.step(out, o)?;
        }
        if self.steps == 0 {
            out.write_all(b"{\"outcomes\":[").map_err(serde_json::Error::io)?;
        }
        // `{"already_undone":...}`: its keys follow the array.
        let rest = serde_json::to_vec(&JsonRest(report))?;
        out.write_all(b"],").map_err(serde_json::Error::io)?;
        out.write_all(rest.get(1..).unwrap_or_default()).map_err(serde_json::Error::io)
    }
}

/// Every key of the JSON report but `outcomes`.
struct JsonRest<'a>(&'a Report);

impl Serialize for JsonRest<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let mut m = s.serialize_map(Some(10))?;
        m.serialize_entry("already_undone", &r.already_undone)?;
        m.serialize_entry("complete", &r.complete)?;
        m.serialize_entry("coverage", &r.coverage)?;
        m.serialize_entry("dry_run", &r.dry_run)?;
        m.serialize_entry("files_exact", &r.files_exact())?;
        m.serialize_entry("irreversible", &Irreversible(&r.outcomes))?;
        m.serialize_entry("notes", &r.notes)?;
        m.serialize_entry("sealed", &r.sealed)?;
        m.serialize_entry("selected", &r.selected)?;
        m.serialize_entry("summary", &r.summary())?;
        m.end()
    }
}

/// The causes of the steps that are irreversible by nature.
struct Irreversible<'a>(&'a [StepReport]);

impl Serialize for Irreversible<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().filter(|o| !o.cause.concerns_files()).map(|o| &o.cause))
    }
}

struct Steps<'a>(&'a [StepReport]);

impl Serialize for Steps<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(JsonStep))
    }
}

struct JsonStep<'a>(&'a StepReport);

impl Serialize for JsonStep<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let o = self.0;
        let b64 = o.path.as_ref().and_then(|p| p.b64_if_not_utf8());
        let mut m = s.serialize_map(Some(5 + usize::from(b64.is_some())))?;
        m.serialize_entry("cause", &o.cause)?;
        m.serialize_entry("outcome", o.outcome.name())?;
        m.serialize_entry("path", &o.path.as_ref().map(|p| p.display_lossy()))?;
        if let Some(b64) = &b64 {
            m.serialize_entry("path_b64", b64)?;
        }
        m.serialize_entry("seq", &o.seq)?;
        m.serialize_entry("why", &o.why)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seq: u64, outcome: Outcome, path: &[u8]) -> StepReport {
        let cause = match outcome.is_success() {
            true => Cause::Undone,
            false => Cause::ChangedSinceSession { detail: "edited".into() },
        };
        StepReport { seq: Some(seq), outcome, path: Some(BPath::new(path.to_vec())), why: format!("step {seq}"), cause }
    }

    fn sample() -> Report {
        Report {
            outcomes: vec![
                step(5, Outcome::Removed, b"/w/a"),
                step(4, Outcome::Conflict, b"/w/b"),
                step(3, Outcome::Restored, b"/w/\xff"),
                step(2, Outcome::Failed, b"/w/c"),
                step(1, Outcome::Unchanged, b"/w/d"),
            ],
            notes: vec!["a note".into()],
            undone: [5, 3, 1].into_iter().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn undone_records_come_back_in_the_order_they_were_added_and_a_countdown_is_held_as_one_run() {
        let added = [9, 8, 7, 3, 4, 4, 2, 1, 0, 100];
        let seqs: Seqs = added.into_iter().collect();
        assert_eq!(seqs.iter().collect::<Vec<_>>(), added);
        assert_eq!(seqs.len(), added.len());
        let mut kept = seqs.clone();
        kept.retain(|s| s != 4 && s != 8);
        assert_eq!(kept.iter().collect::<Vec<_>>(), [9, 7, 3, 2, 1, 0, 100]);
        let million: Seqs = (0..1_000_000u64).rev().collect();
        assert_eq!(million.runs.len(), 1, "a countdown is one run, not a list");
        assert_eq!(million.iter().next(), Some(999_999));
        assert_eq!(million.iter().last(), Some(0));
        assert!(Seqs::default().is_empty());
    }

    #[test]
    fn streaming_hands_over_the_exact_steps_keeps_the_others_in_order_and_counts_the_same() {
        let whole = sample();
        let mut streamed = sample();
        let mut got = Vec::new();
        streamed.stream_from(1, &mut |o| got.push(o.seq));
        assert_eq!(got, vec![Some(3), Some(1)], "from the given index on, exact steps only");
        assert_eq!(streamed.outcomes.iter().map(|o| o.seq).collect::<Vec<_>>(), vec![Some(5), Some(4), Some(2)]);
        assert_eq!(streamed.summary(), whole.summary());
        assert_eq!(streamed.files_exact(), whole.files_exact());
    }

    #[test]
    fn the_streamed_json_report_is_the_same_object_as_the_whole_one() {
        let whole = sample();
        let mut streamed = sample();
        let mut text = Vec::new();
        let mut json = JsonStream::default();
        streamed.stream_from(0, &mut |o| json.step(&mut text, &o).unwrap());
        json.finish(&mut text, &streamed).unwrap();
        let got: serde_json::Value = serde_json::from_slice(&text).unwrap();
        let mut want = whole.to_json();
        // The same steps, exact ones first (as they ended), then the others, each newest first.
        let order = [5, 3, 1, 4, 2];
        let steps = want["outcomes"].as_array().unwrap().clone();
        want["outcomes"] = order.iter().map(|s| steps.iter().find(|o| o["seq"] == *s).unwrap().clone()).collect();
        assert_eq!(got, want);
        assert_eq!(got["outcomes"][1]["path_b64"], "L3cv/w==", "a name that is not UTF-8 keeps its bytes");
        let mut direct = Vec::new();
        whole.write_json(&mut direct).unwrap();
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&direct).unwrap(), whole.to_json());
    }
}
