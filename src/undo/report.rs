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
                    "cause": o.cause,
                });
                if let Some(b64) = o.path.as_ref().and_then(|p| p.b64_if_not_utf8()) {
                    v["path_b64"] = b64.into();
                }
                v
            })
            .collect();
        serde_json::json!({
            "complete": self.complete,
            "selected": self.selected,
            "files_exact": self.files_exact(),
            "irreversible": self.outcomes.iter().filter(|o| !o.cause.concerns_files()).map(|o| &o.cause).collect::<Vec<_>>(),
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
