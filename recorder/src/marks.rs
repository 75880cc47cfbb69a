//! Writing a mark ([`aether_journal::marks`]): one record with an id from the session's
//! shared counter, appended with a single `write(2)` to the marks segment, under an exclusive
//! lock on that file so that names stay unique however many callers mark at once.
//!
//! A mark is written one of two ways. From outside the session (a harness's hook, a user's
//! shell) this process maps the counters and appends itself. From inside it (a hook run by a
//! harness that itself runs under `aether-journal run`), the store is out of this process's
//! reach, as it is for every process of the session: it asks the shim loaded into it to
//! append the mark ([`ShimMarkArgs`], the shim's `aether_journal_append_mark`), which takes
//! the id and writes the line itself, so no process of the session gets a descriptor it could
//! write anything else through.
//!
//! What this module cannot do: mark from inside a session without the shim loaded (a static
//! program under the supervisor): that is refused, and said.

use std::ffi::c_void;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use aether_journal::capture::Counters;
use aether_journal::marks::{Mark, default_name, valid_name};
use aether_journal::record::{MarkOp, Op};
use aether_journal::session::{COUNTERS_FILE, Session, SessionError};

use crate::tables::SharedCounters;

/// What to mark.
#[derive(Clone, Debug, Default)]
pub struct MarkRequest {
    /// Its name (default: the next `turn-N`).
    pub name: Option<String>,
    /// Its label.
    pub label: Option<String>,
    /// The caller's key: if a mark with this key exists, it is the answer, and nothing is
    /// written.
    pub key: Option<String>,
}

/// What [`mark`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marked {
    /// Wrote this new mark.
    New(Mark),
    /// A mark with the request's key existed already: this one.
    Again(Mark),
}

impl Marked {
    /// The mark, new or not.
    pub fn mark(&self) -> &Mark {
        match self {
            Marked::New(m) | Marked::Again(m) => m,
        }
    }
}

/// Why a mark could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    /// The session cannot be read.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The name cannot name a mark.
    #[error("{0}")]
    BadName(String),
    /// Another mark has the name.
    #[error("the session has a mark {name:?} already (record {seq}): marks are named once")]
    NameTaken {
        /// The name.
        name: String,
        /// The existing mark's record.
        seq: u64,
    },
    /// This process is one of the session's, and the shim loaded into it could not append
    /// the mark (or no shim is loaded).
    #[error("this process runs inside the session and cannot write to its store ({why})")]
    Inside {
        /// Why.
        why: String,
    },
    /// A file of the session could not be opened or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The arguments of the shim's `aether_journal_append_mark`, by pointer: byte ranges the
/// caller owns for the length of the call. `label` and `key` may be null (none).
#[repr(C)]
pub struct ShimMarkArgs {
    /// The canonical path of the session directory the caller means: the shim appends only
    /// to its own session, and otherwise fails with `ENOENT`.
    pub session: *const u8,
    /// Its length.
    pub session_len: usize,
    /// The mark's name (UTF-8).
    pub name: *const u8,
    /// Its length.
    pub name_len: usize,
    /// The label (UTF-8), or null.
    pub label: *const u8,
    /// Its length.
    pub label_len: usize,
    /// The key (UTF-8), or null.
    pub key: *const u8,
    /// Its length.
    pub key_len: usize,
    /// The files held open for writing ([`Op::Mark`]'s `held`), each followed by a NUL byte;
    /// null when none.
    pub held: *const u8,
    /// Its length.
    pub held_len: usize,
}

/// The shim's entry point: the mark's record id, or 0 with `errno` set.
pub type AppendMarkFn = unsafe extern "C" fn(*const ShimMarkArgs) -> u64;

/// The name the shim exports [`AppendMarkFn`] under.
pub const APPEND_MARK_SYMBOL: &std::ffi::CStr = c"aether_journal_append_mark";

/// Marks the session: the request's key seen already, or a new mark.
pub fn mark(session: &Session, req: &MarkRequest) -> Result<Marked, MarkError> {
    let path = session.marks_path();
    let io_err = |source| MarkError::Io { path: path.clone(), source };
    // Locked through a read-only descriptor, which a process of the session may open too.
    // The file is made with the session; a session made before marks existed gets it here
    // (from outside the session: from inside, there is nothing to lock and a single mark).
    let lock = match std::fs::File::open(&path) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => create_marks_file(session).ok(),
        Err(e) => return Err(io_err(e)),
    };
    if let Some(f) = &lock {
        rustix::fs::flock(f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| io_err(e.into()))?;
    }
    let marks = session.marks()?;
    if let Some(k) = &req.key
        && let Some(m) = marks.iter().find(|m| m.key.as_ref() == Some(k))
    {
        return Ok(Marked::Again(m.clone()));
    }
    let name = match &req.name {
        Some(n) => {
            valid_name(n).map_err(MarkError::BadName)?;
            if let Some(m) = marks.iter().find(|m| m.name == *n) {
                return Err(MarkError::NameTaken { name: n.clone(), seq: m.seq });
            }
            n.clone()
        }
        None => default_name(&marks),
    };
    let (label, key) = (req.label.clone(), req.key.clone());
    let held = held_journaled(session)?;
    let op =
        Op::Mark(Box::new(MarkOp { name: name.clone(), label: label.clone(), key: key.clone(), held: held.clone() }));
    let seq = match through_shim(session, &op)? {
        Some(seq) => seq,
        None => append_directly(session, op)?,
    };
    let pid = aether_journal::session::own_pid();
    // The record's time is before now: once the coarse clock is past now, whatever anyone
    // changes has a change time after the mark (see wait_for_clock_tick).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    aether_journal::marks::wait_for_clock_tick(now);
    Ok(Marked::New(Mark { seq, name, label, key, time: aether_journal::session::now_rfc3339(), pid, held }))
}

/// The files the session's processes hold open for writing that its journal knows (a file
/// the session never journaled, such as an inherited output file, is outside every undo).
fn held_journaled(session: &Session) -> Result<Vec<aether_journal::BPath>, MarkError> {
    let held = session.held_for_writing();
    if held.is_empty() {
        return Ok(held);
    }
    let journal = session.read_journal()?;
    let known: std::collections::HashSet<&aether_journal::BPath> =
        journal.records.iter().flat_map(aether_journal::select::record_paths).collect();
    Ok(held.into_iter().filter(|p| known.contains(p)).collect())
}

fn create_marks_file(session: &Session) -> io::Result<std::fs::File> {
    use std::os::unix::fs::DirBuilderExt;
    let path = session.marks_path();
    if let Some(dir) = path.parent() {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(&path)
}

/// Through the shim loaded into this process, when there is one and the session is its own:
/// `None` when there is no shim, or it journals another session (or none).
fn through_shim(session: &Session, op: &Op) -> Result<Option<u64>, MarkError> {
    let Op::Mark(mark) = op else { return Ok(None) };
    let MarkOp { name, label, key, held } = &**mark;
    // SAFETY: dlsym only looks a NUL-terminated name up among the loaded objects.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, APPEND_MARK_SYMBOL.as_ptr()) };
    if sym.is_null() {
        return Ok(None);
    }
    // SAFETY: the shim exports this symbol with exactly the signature of AppendMarkFn (the
    // shim's own definition is checked against the type: it is declared through it).
    let append = unsafe { std::mem::transmute::<*mut c_void, AppendMarkFn>(sym) };
    let canon =
        std::fs::canonicalize(session.dir()).map_err(|source| MarkError::Io { path: session.dir().into(), source })?;
    let canon = canon.as_os_str().as_bytes();
    let range = |s: Option<&String>| s.map_or((std::ptr::null(), 0), |s| (s.as_ptr(), s.len()));
    let ((label, label_len), (key, key_len)) = (range(label.as_ref()), range(key.as_ref()));
    let held: Vec<u8> = held.iter().flat_map(|p| p.as_bytes().iter().copied().chain([0])).collect();
    let (held, held_len) = if held.is_empty() { (std::ptr::null(), 0) } else { (held.as_ptr(), held.len()) };
    let args = ShimMarkArgs {
        session: canon.as_ptr(),
        session_len: canon.len(),
        name: name.as_ptr(),
        name_len: name.len(),
        label,
        label_len,
        key,
        key_len,
        held,
        held_len,
    };
    // SAFETY: every range in `args` is borrowed from a value that outlives the call.
    let seq = unsafe { append(&args) };
    if seq != 0 {
        return Ok(Some(seq));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        e => Err(MarkError::Inside { why: format!("the shim could not append the mark: {e}") }),
    }
}

/// From outside the session: takes the id from the mapped counters and appends the line.
fn append_directly(session: &Session, op: Op) -> Result<u64, MarkError> {
    let counters_path = session.dir().join(COUNTERS_FILE);
    // A process of the session without the shim is refused here by the supervisor (which
    // keeps the store out of every process's reach).
    let counters = SharedCounters::open(&counters_path).ok_or_else(|| MarkError::Inside {
        why: format!("{} cannot be opened for writing", counters_path.display()),
    })?;
    let seq = counters.next_id();
    let rec = session.starter_record(seq, "mark", op);
    let line = aether_journal::journal::encode_line(&rec);
    let path = session.marks_path();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| MarkError::Io { path: path.clone(), source })?;
    // One write on an O_APPEND descriptor: never interleaved with another mark's line.
    f.write_all(&line).map_err(|source| MarkError::Io { path: path.clone(), source })?;
    counters.note_mark(seq);
    Ok(seq)
}
