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
//!
//! The parts: `plan` (what to undo, the session's entry points), `execute` (running it),
//! `restore`, `rename` and `meta` (the actions), `prior` (what each path was before the
//! session), `fs` (file-system helpers), `report` (what comes out), `redo` (the journal every
//! undo keeps of itself, and the redo that takes it back).

use std::collections::{BTreeSet, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, RenameFlags, Stat, Timestamps};

use crate::bpath::BPath;
use crate::capture::{hash_fd, ident_of};
use crate::journal::JournalContents;
use crate::record::{
    Before, CaptureHow, ConnectResult, MetaBefore, MetaKind, Node, Op, Record, Snapshot, SpecialKind, Xattr,
};
use crate::seal::{AfterState, Expectation, Seal, expectations};

mod earlier;
mod execute;
mod fs;
mod meta;
mod plan;
mod prior;
mod redo;
mod remover;
mod rename;
mod report;
mod restore;
#[cfg(test)]
mod tests;
mod tree;

pub use earlier::{SeqSet, SeqTimes};
pub use execute::run_plan;
pub use fs::open_dir_nofollow;
pub use plan::{
    Plan, UNDONE_FILE, UndoOptions, undo_records, undo_session, undo_session_streaming, undo_session_with_progress,
};
pub use redo::{REDONE_FILE, REVERSED_FILE, UNDOS_DIR, redo_session};
pub use report::{Cause, JsonStream, Outcome, Report, Seqs, StepReport, Summary};

use meta::Deferred;
use prior::PriorFacts;
use tree::{Dir, Handle, Sim};

struct Executor<'a> {
    /// The session's `blobs/` directory.
    blobs: Dir,
    /// The device the store is on (a file on another one can only be kept as a copy).
    store_dev: u64,
    /// For a dry run, the overlay its steps act on instead of the file system.
    sim: Option<std::rc::Rc<Sim>>,
    blobs_path: std::path::PathBuf,
    /// Every inode some record captured by hard link, and the blob holding it.
    linked: std::collections::HashMap<crate::record::Ident, String>,
    /// The hash each copied blob was recorded with (by the record that made it).
    hashed: std::collections::HashMap<String, String>,
    /// Blobs not to be trusted, each with how that is known: bytes that no longer match the
    /// hash sealed with the session, a state not the sealed one, or a linked blob written
    /// after its capture by something the journal never saw (checked once, before this undo
    /// changes anything).
    tampered: std::collections::HashMap<String, &'static str>,
    force: bool,
    journal: &'a JournalContents,
    seal: Option<&'a Seal>,
    /// The records this undo reverses (`None`: all), and those earlier undos reversed.
    only: Option<&'a BTreeSet<u64>>,
    already: &'a SeqSet,
    /// See [`Plan::undo_times`].
    undo_times: &'a SeqTimes,
    /// For each path, the newest record of it no earlier undo reversed, and when the turn it
    /// was in ended (the time of the first mark after it), if one did (built on first use,
    /// for a session with marks).
    turn_ends: std::cell::OnceCell<std::collections::HashMap<BPath, TurnEnd>>,
    /// Why each path found changed since the session was (keyed by the journal's own copy of
    /// the path; a path checked and found unchanged has no entry).
    drift: std::cell::RefCell<std::collections::HashMap<&'a BPath, String>>,
    /// Every path a step will act on was checked before the first step (then a path not in
    /// `drift` is unchanged; otherwise it is checked when first met).
    prechecked: std::cell::Cell<bool>,
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
    /// What the newest record of each path implies it is now, for an unsealed session (built
    /// on first use).
    expected: std::cell::OnceCell<std::collections::HashMap<&'a BPath, Expectation>>,
    /// The paths of the records newer than the seal (built on first use; see [`Seal::through`]).
    after_seal: std::cell::OnceCell<HashSet<BPath>>,
    /// The directory the last step's path was in, open (see [`Executor::parent_of`]).
    parent: std::cell::RefCell<Option<(Vec<u8>, Dir)>>,
    /// The `dir_times` records this undo reverses, set back at the very end.
    dir_times: std::cell::RefCell<Vec<u64>>,
}

/// What the end-of-turn check knows of a path (see `Executor::changed_after_turn`).
#[derive(Default)]
struct TurnEnd {
    /// Its newest record no earlier undo reversed.
    newest: Option<u64>,
    /// When the turn of that record ended: the first mark after it (ns, and its name).
    end: Option<(i64, String)>,
    /// When an earlier undo last put it back (ns).
    put_back: Option<i64>,
}

/// Nanoseconds since the epoch now.
pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Result of one restore action: outcome, explanation, and its cause.
type Done = (Outcome, String, Cause);
