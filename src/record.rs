//! The journal's data model: one [`Record`] per mutation, each carrying the prior state of
//! the path it is about to change.
//!
//! A record is written *before* the call it describes proceeds, so it says what the path was
//! ([`Before`]), not what the call did. Undo works out from the file system at undo time whether
//! the call took effect (a rename whose source is still in place did not), which is why one
//! append per mutation is enough.
//!
//! What this module cannot do: describe effects outside the file system precisely enough to
//! reverse them. Those are recorded as [`Before::Irreversible`] with a [`Reason`], and every
//! undo that meets one reports itself incomplete.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::bpath::BPath;

/// Version of the record format written by this build (`"v"` in every record).
pub const RECORD_VERSION: u32 = 1;

/// How much earlier than its [`Before::Exclusive`] record a node may have been born and still
/// count as made by the call: file systems stamp birth times from a clock that lags the
/// record's by up to a timer tick, so a second is far more than is needed and far less than
/// separates a file made before a session from a call in it. A file system that stamps more
/// coarsely (FAT: 2 s) can make undo report a conflict it need not, never remove a file it
/// should have left.
pub const EXCLUSIVE_BIRTH_SLACK_S: u64 = 1;

/// Shared copies of the values records repeat: records read one after another name the same
/// few programs and calls, and a million records otherwise kept a million copies of each. A
/// reading thread keeps at most a few thousand distinct values (then starts again), so a
/// journal of all-distinct names costs what it would have without sharing.
struct Interner<K>(std::collections::HashSet<K>);

/// How many distinct values a reading thread shares at most (see [`Interner`]).
const INTERNED_MAX: usize = 4096;

impl<K: Clone + Eq + std::hash::Hash> Interner<K> {
    /// The shared copy of `value`, made by `make` the first time.
    fn get<Q>(&mut self, value: &Q, make: impl FnOnce(&Q) -> K) -> K
    where
        Q: ?Sized + Eq + std::hash::Hash,
        K: std::borrow::Borrow<Q>,
    {
        if let Some(found) = self.0.get(value) {
            return found.clone();
        }
        if self.0.len() >= INTERNED_MAX {
            self.0.clear();
        }
        let shared = make(value);
        self.0.insert(shared.clone());
        shared
    }
}

thread_local! {
    static ORIGINS: std::cell::RefCell<Interner<Origin>> = std::cell::RefCell::new(Interner(Default::default()));
    static CALLS: std::cell::RefCell<Interner<Call>> = std::cell::RefCell::new(Interner(Default::default()));
}

/// Who made a record: the program (the caller's executable, as the kernel names it) and the
/// libc entry point it called, held together behind one pointer. Every record of a process
/// names the same program and one of a few calls, so the records read by one thread share one
/// copy of each pair (see `Interner`), and a record holds one word for both (a million records
/// held eight million bytes for a second pointer).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Origin(Arc<(BPath, Call)>);

impl Origin {
    /// The origin of a call `call` made by the program `prog`, not shared with any other.
    pub fn new(prog: BPath, call: Call) -> Origin {
        Origin(Arc::new((prog, call)))
    }

    /// The program.
    pub fn prog(&self) -> &BPath {
        &self.0.0
    }

    /// The call.
    pub fn call(&self) -> &Call {
        &self.0.1
    }

    /// The shared copy of this pair for the reading thread (see `Interner`).
    fn interned(prog: BPath, call: Call) -> Origin {
        let pair = (prog, call);
        ORIGINS.with(|t| t.borrow_mut().get(&pair, |p| Origin(Arc::new(p.clone()))))
    }
}

// Hashed and compared as the pair it holds (`Arc` hashes and compares what it holds, and the
// derived `Hash` of a one-field struct hashes only that field), as `Borrow` requires: the
// reader's interner finds an origin by its pair.
impl std::borrow::Borrow<(BPath, Call)> for Origin {
    fn borrow(&self) -> &(BPath, Call) {
        &self.0
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin").field("prog", self.prog()).field("call", self.call()).finish()
    }
}

/// A record's format version, in memory: always [`RECORD_VERSION`], since a record of any
/// other version is not read as one (see [`crate::journal`]), so it takes no room (a journal
/// of a million records held four million bytes of ones). Written as that number; reading
/// any other number, or none, fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Version;

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(RECORD_VERSION)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match u64::deserialize(d)? {
            v if v == u64::from(RECORD_VERSION) => Ok(Version),
            v => Err(serde::de::Error::custom(format!("record format version {v}, not {RECORD_VERSION}"))),
        }
    }
}

/// The libc entry point a record was made for (`openat`, `__open_2`, `renameat2`, ...): a
/// string, shared between the records that name the same one (read through the reader's
/// interner) and held by one pointer (an `Arc<str>` is two words, and a million records held
/// eight million bytes of lengths of a dozen names).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Call(Arc<Box<str>>);

impl Call {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Call {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

// Hashed and compared as its name (`Arc` and `Box` hash and compare what they hold), as
// `Borrow` requires: the reader's interner finds a call by its name.
impl std::borrow::Borrow<str> for Call {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Call {
    fn from(name: &str) -> Call {
        Call(Arc::new(name.into()))
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self.0, f)
    }
}

impl Serialize for Call {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Call {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let call = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(CALLS.with(|t| t.borrow_mut().get(&*call, |c| Call::from(c))))
    }
}

/// A record's wall-clock time: nanoseconds since the epoch (0 and after; held as a number, not
/// as its 30-byte text: a session of a million records kept them as a million strings).
/// Written and read as RFC 3339 with nanoseconds, UTC (`2026-12-01T17:48:33.792479801Z`);
/// reading accepts any RFC 3339 time humantime does, and one outside what a number of
/// nanoseconds can hold (before 1970, after 2262) is not a record this build reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(pub i64);

impl Stamp {
    /// Now.
    pub fn now() -> Self {
        Self::of(std::time::SystemTime::now())
    }

    /// `t`, clamped to what a stamp can hold.
    pub fn of(t: std::time::SystemTime) -> Self {
        Stamp(t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
    }

    /// Parses RFC 3339 (see the type's docs).
    pub fn parse(text: &str) -> Option<Self> {
        let t = humantime::parse_rfc3339_weak(text).ok()?;
        let ns = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        i64::try_from(ns).ok().map(Stamp)
    }

    /// Nanoseconds since the epoch.
    pub fn ns(self) -> i64 {
        self.0
    }

    /// As a system time.
    pub fn system_time(self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(self.0.max(0) as u64)
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = Vec::with_capacity(30);
        crate::journal::push_rfc3339_nanos(&mut text, self.system_time());
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

impl Serialize for Stamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Stamp::parse(&text).ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {text:?}")))
    }
}

/// One journaled step. Written and read as one JSON object with the fields `v`, `seq`,
/// `time`, `pid`, `ppid`, `prog`, `call` and `op`, in that order (see `docs/FORMAT.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Record format version; see [`Version`].
    pub v: Version,
    /// Session-wide sequence number, taken after the prior state was captured and before the
    /// call proceeds: undo replays in descending `seq`.
    pub seq: u64,
    /// Wall-clock time the record was made (RFC 3339 with nanoseconds, UTC, in the journal).
    pub time: Stamp,
    /// Process that made the call.
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// The program and the libc entry point it called (`openat`, `__open_2`, `renameat2`,
    /// ...), `prog` and `call` in the journal. Shared: see [`Origin`].
    pub origin: Origin,
    /// What the call is about to do, with the prior state needed to reverse it.
    pub op: Op,
}

/// A record as it is read: the program and the call are separate fields in the journal.
#[derive(Deserialize)]
struct RecordIn {
    v: Version,
    seq: u64,
    time: Stamp,
    pid: u32,
    ppid: u32,
    prog: BPath,
    call: Call,
    #[serde(deserialize_with = "tag_first::op")]
    op: Op,
}

/// A record as it is written (borrowed from it), in the journal's order of fields.
#[derive(Serialize)]
struct RecordOut<'a> {
    v: Version,
    seq: u64,
    time: Stamp,
    pid: u32,
    ppid: u32,
    prog: &'a BPath,
    call: &'a Call,
    op: &'a Op,
}

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self;
        RecordOut {
            v: r.v,
            seq: r.seq,
            time: r.time,
            pid: r.pid,
            ppid: r.ppid,
            prog: r.prog(),
            call: r.call(),
            op: &r.op,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RecordIn::deserialize(d)?;
        Ok(Record {
            v: r.v,
            seq: r.seq,
            time: r.time,
            pid: r.pid,
            ppid: r.ppid,
            origin: Origin::interned(r.prog, r.call),
            op: r.op,
        })
    }
}

impl Record {
    /// The program that made the call (the caller's executable, as the kernel names it).
    pub fn prog(&self) -> &BPath {
        self.origin.prog()
    }

    /// The libc entry point that was called.
    pub fn call(&self) -> &Call {
        self.origin.call()
    }

    /// The order of the journal: by `seq` (unique in a journal that was not tampered with),
    /// then by the rest of the envelope, so that duplicates still come out in one order. For
    /// sorting in place: a stable sort of a million records allocated half as many again.
    pub fn journal_order(a: &Record, b: &Record) -> std::cmp::Ordering {
        (a.seq, a.pid, &a.time, a.call()).cmp(&(b.seq, b.pid, &b.time, b.call()))
    }

    /// Whether this step can never be undone (an irreversible capture, a connection that was
    /// made, a datagram, a signal outside the session, a program that ran unobserved). A step
    /// whose call later proved to have failed is not counted by this check alone.
    pub fn irreversible(&self) -> bool {
        match &self.op {
            Op::Change { .. } | Op::Rename(_) => matches!(self.op.before(), Some(Before::Irreversible { .. })),
            Op::Connect { result, .. } => !matches!(result, ConnectResult::Failed { .. }),
            Op::Send { .. } | Op::Unobserved { .. } => true,
            Op::Signal { outside, .. } => *outside,
            Op::Meta { .. }
            | Op::Exec(_)
            | Op::Refused { .. }
            | Op::TempName { .. }
            | Op::CallFailed { .. }
            | Op::DirTimes(_)
            | Op::Mark(_) => false,
        }
    }
}

/// What a journaled call is about to do. The variants that are rare in a large session and
/// large in themselves are boxed, so that the common one (a [`Op::Change`]) is not as large as
/// the largest: an undo of a million records holds every one of them (an `Op` was 96 bytes,
/// now 32).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    /// `path`'s content or existence is about to change: an open for writing, a truncate, an
    /// unlink, an rmdir, a mkdir, a create. Undo makes `path` match `before` again.
    Change {
        /// Absolute path with a symlink-free parent directory.
        path: BPath,
        /// What `path` was before the call.
        before: Before,
    },
    /// A name is about to be moved ([`RenameOp`]).
    Rename(Box<RenameOp>),
    /// `path`'s metadata (mode, owner, times or one extended attribute) is about to change.
    /// Undo sets back what the call changes, and only that.
    Meta {
        /// Absolute path with a symlink-free parent directory (the node itself, never
        /// followed).
        path: BPath,
        /// The prior metadata (boxed: it is most of the size of a record, and most records
        /// are not metadata changes).
        before: Box<MetaBefore>,
    },
    /// A process, or a program about to be executed, that the shim cannot see into: whatever
    /// it changes is not journaled, so no undo of this session can be complete.
    Unobserved {
        /// The program concerned.
        program: BPath,
        /// Why it runs unobserved.
        reason: Box<UnobservedReason>,
    },
    /// A connection to another endpoint (recorded after the call, with its result): what
    /// was sent over it cannot be unsent.
    Connect {
        /// The endpoint.
        peer: Box<Endpoint>,
        /// Whether it was made: `ok`, `in_progress` (non-blocking), or `failed` with `errno`.
        result: ConnectResult,
    },
    /// A datagram sent to an explicit destination (one record per destination per process).
    Send {
        /// The destination.
        peer: Box<Endpoint>,
    },
    /// A signal sent to another process.
    Signal {
        /// The target as passed (a pid, or a negative process group).
        target: i64,
        /// The target's program, when it could be read (boxed, like `what` of
        /// [`Op::Refused`] being a boxed string: with them, a change's path and prior state
        /// are the largest operation, and an `Op` is 32 bytes where it was 40).
        target_prog: Option<Box<BPath>>,
        /// The signal number.
        signal: i32,
        /// Whether the target is outside the session (irreversible), or one of its own
        /// processes (an audit entry).
        outside: bool,
    },
    /// A program is about to be executed ([`ExecOp`]).
    Exec(Box<ExecOp>),
    /// A call refused under the strict policy because its effect could not be journaled.
    /// It changed nothing.
    Refused {
        /// What was refused and why.
        what: Box<str>,
        /// The errno the program saw.
        errno: i32,
    },
    /// A temporary file or directory is about to be created from `template` (the mkstemp
    /// family, mkdtemp), whose `X`s the call replaces. The name is only known afterwards, when
    /// the same process journals it as a `change` from `absent` (or a `call_failed` of this
    /// record). Written before the call, so that a process killed in between leaves a trace:
    /// an intent that no later record completes makes the undo incomplete, naming the pattern.
    TempName {
        /// Absolute template, `X`s included, with a symlink-free parent directory.
        template: BPath,
    },
    /// The times of a directory before the session first changed its entries
    /// ([`DirTimesOp`]).
    DirTimes(Box<DirTimesOp>),
    /// The call described by record `of_seq` failed, so it changed nothing. Written after the
    /// call, only where undo could not tell that from the file system alone.
    CallFailed {
        /// The record this outcome belongs to.
        of_seq: u64,
        /// The errno the call failed with.
        errno: i32,
    },
    /// A point in the session a user or a harness named ([`MarkOp`]).
    Mark(Box<MarkOp>),
}

/// `from` is about to be renamed to `to` (rename, renameat, renameat2). Undo moves it back
/// when the move took effect, then makes `to` match `to_before`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameOp {
    /// Source path.
    pub from: BPath,
    /// Destination path.
    pub to: BPath,
    /// renameat2 flags (`RENAME_NOREPLACE` = 1, `RENAME_EXCHANGE` = 2, `RENAME_WHITEOUT` = 4).
    pub flags: u32,
    /// Identity of the source before the call, when it existed.
    pub moved: Option<Ident>,
    /// What the destination was before the call (it may be clobbered).
    pub to_before: Before,
}

/// A program is about to be executed (execve and friends, posix_spawn, system, popen). An
/// audit entry; a program the shim cannot see into gets an `unobserved` record too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOp {
    /// The program, as resolved (an absolute path when it could be found).
    pub program: BPath,
    /// Its arguments.
    pub argv: Argv,
    /// The working directory it starts in.
    pub cwd: BPath,
    /// The child's pid, for posix_spawn (whose record is written after the call).
    pub child: Option<u32>,
}

/// A program's arguments, held in one buffer: `xargs` passes thousands of names to each
/// program it starts, and a session that made a million files by `xargs touch` held every name
/// again in its exec records, as a `BPath` and an allocation each (48 bytes beside the name,
/// where an end offset is 8). In JSON a list of paths, as a `Vec<BPath>` is.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Argv {
    bytes: Box<[u8]>,
    /// Where each argument ends in `bytes`.
    ends: Box<[usize]>,
}

impl Argv {
    /// How many arguments it holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Every argument, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.ends.iter().enumerate().map(|(i, &end)| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.bytes[start..end]
        })
    }

    /// Every argument as a path of its own.
    pub fn to_paths(&self) -> Vec<BPath> {
        self.iter().map(BPath::from).collect()
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for Argv {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Argv {
        let (mut bytes, mut ends) = (Vec::new(), Vec::new());
        for a in iter {
            bytes.extend_from_slice(a.as_ref());
            ends.push(bytes.len());
        }
        Argv { bytes: bytes.into(), ends: ends.into() }
    }
}

impl fmt::Debug for Argv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(BPath::from)).finish()
    }
}

impl Serialize for Argv {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(crate::bpath::BytesAsPath))
    }
}

impl<'de> Deserialize<'de> for Argv {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Argv;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of arguments")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Argv, A::Error> {
                let (mut bytes, mut ends) = (Vec::new(), Vec::new());
                while let Some(a) = seq.next_element::<BPath>()? {
                    bytes.extend_from_slice(a.as_bytes());
                    ends.push(bytes.len());
                }
                Ok(Argv { bytes: bytes.into(), ends: ends.into() })
            }
        }
        d.deserialize_seq(V)
    }
}

/// The times of directory `path` before the session first changed its entries (a name made,
/// removed or renamed in it): written once per directory per session, before that change.
/// Undo sets them back after every entry is back, when it undoes every record that changed
/// the directory's entries and this is the oldest record it has of the name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirTimesOp {
    /// The directory, absolute, with a symlink-free path.
    pub path: BPath,
    /// Its identity then.
    pub ident: Ident,
    /// Last access time, `[seconds, nanoseconds]`.
    pub atime: [i64; 2],
    /// Last modification time, `[seconds, nanoseconds]`.
    pub mtime: [i64; 2],
}

/// A point in the session a user or a harness named (`aether-journal mark`): the start of a
/// turn, say. Changes nothing; `undo --to` reverses every record after it and `review --since`
/// shows their net effect. Kept in the segment `segments/marks`, which holds nothing else.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkOp {
    /// Unique in the session (`turn-1`, `turn-2`, ... by default).
    pub name: String,
    /// Free text (a harness puts the first line of the prompt here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// A caller's own key for the point (a harness's prompt or turn id): a second mark with
    /// the same key is the first one again, so a retried hook marks once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Files a process of the session held open for writing when the mark was made: what it
    /// wrote through that descriptor after the mark was never journaled, so an undo to the
    /// mark cannot put them back as they were at it, and says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<BPath>,
}

impl Op {
    /// What the name the step writes over was before it: a change's `before`, a rename's
    /// `to_before`.
    pub fn before(&self) -> Option<&Before> {
        match self {
            Op::Change { before, .. } => Some(before),
            Op::Rename(m) => Some(&m.to_before),
            _ => None,
        }
    }

    /// The path the step is mainly about (`to` for a rename's clobbered destination is
    /// reported separately by undo).
    pub fn primary_path(&self) -> Option<&BPath> {
        match self {
            Op::Change { path, .. } | Op::Meta { path, .. } => Some(path),
            Op::DirTimes(d) => Some(&d.path),
            Op::Rename(r) => Some(&r.from),
            Op::Unobserved { program, .. } => Some(program),
            Op::Exec(e) => Some(&e.program),
            Op::TempName { template } => Some(template),
            Op::Connect { .. }
            | Op::Send { .. }
            | Op::Signal { .. }
            | Op::Refused { .. }
            | Op::CallFailed { .. }
            | Op::Mark(_) => None,
        }
    }
}

/// Whether `path` is a name `template` (a [`Op::TempName`] template) can produce: the same
/// directory and length, equal bytes wherever the template's final component is not `X`.
pub fn matches_template(template: &BPath, path: &BPath) -> bool {
    let (Some((tdir, tname)), Some((pdir, pname))) = (template.split_parent(), path.split_parent()) else {
        return false;
    };
    tdir == pdir && tname.len() == pname.len() && tname.iter().zip(pname).all(|(t, p)| *t == b'X' || t == p)
}

/// What a path was before a journaled call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Before {
    /// The path held this node, and enough of it was kept to put it back.
    Contents(Box<Snapshot>),
    /// The path did not exist: undo removes whatever the session left there.
    Absent,
    /// The call creates the path only if nothing is there (an open with `O_CREAT|O_EXCL`),
    /// and was journaled without looking first: the call's result alone says whether the path
    /// was absent. A call that fails is followed by a `call_failed` record. A process killed
    /// between a failure and that record leaves this record alone, with something at the
    /// path that was there before it: so undo removes what is there only if it was born after
    /// this record was made (less [`EXCLUSIVE_BIRTH_SLACK_S`]), and otherwise leaves it in
    /// place and reports a conflict. Where the file system keeps no birth times, undo removes
    /// it as for `Absent`.
    Exclusive,
    /// The prior state could not be kept; undo reports this step as skipped with the reason.
    Irreversible {
        /// Why it could not be kept (boxed: two strings, where most prior states hold none).
        reason: Box<Reason>,
    },
    /// The path held a file this session had created (by record `created`), which the call
    /// rewrote without a capture: nothing it held is needed once that creation is undone, since
    /// undoing it removes the file. Undo reports the step unchanged when it also undoes (or
    /// has already undone) record `created`, and skipped otherwise: what the file held before
    /// this call was not kept.
    Born {
        /// The record that created the file.
        created: u64,
    },
    /// The path held a file whose whole state from before the session record `by` had already
    /// kept (a copy made for an earlier call of this session), rewritten here without another
    /// capture. Undo reports the step unchanged when it also undoes (or has undone) record
    /// `by`, which puts that state back, and skipped otherwise: what the file held between
    /// the two calls was not kept.
    Kept {
        /// The record whose capture holds the file's state from before the session.
        by: u64,
    },
}

impl Before {
    /// [`Before::Irreversible`] for `reason`.
    pub fn irreversible(reason: Reason) -> Self {
        Before::Irreversible { reason: Box::new(reason) }
    }

    /// [`Before::Contents`] of `snap` (boxed: a snapshot is most of a record's size, and most
    /// records hold none).
    pub fn contents(snap: Snapshot) -> Self {
        Before::Contents(Box::new(snap))
    }
}

/// A kept prior state: the node and its metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The node itself.
    #[serde(deserialize_with = "tag_first::node")]
    pub node: Node,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last modification time, `[seconds, nanoseconds]`.
    pub mtime: [i64; 2],
    /// Last access time, `[seconds, nanoseconds]`.
    pub atime: [i64; 2],
    /// Identity of the node when it was captured.
    pub ident: Ident,
    /// Its extended attributes (ACLs included), when they had to be kept: for a copy that
    /// may have to be recreated, and for a directory. `None` when not captured (a linked
    /// capture keeps the inode itself, attributes and all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattrs: Option<Vec<Xattr>>,
    /// For a regular file kept as a copy: how many names (hard links) it had, when more than
    /// one (0: one, or not known). A copy put back where the file was removed is a new inode:
    /// its other names keep the old one, and undo says so.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub links: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One extended attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    /// Its name (`user.comment`, `system.posix_acl_access`, ...).
    pub name: BPath,
    /// Its value.
    pub value: Bytes,
}

/// Opaque bytes, base64 in JSON.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(Bytes)
            .map_err(|e| serde::de::Error::custom(format!("bad base64: {e}")))
    }
}

/// Which part of a node's metadata a call changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaKind {
    /// chmod family.
    Mode,
    /// chown family (which may also clear set-id bits, so the mode is put back too).
    Owner,
    /// utime family.
    Times,
    /// setxattr/removexattr family: the attribute named in `xattr`.
    Xattr,
    /// The inode flags `chattr` sets (`FS_IOC_SETFLAGS`: append-only, immutable, ...), kept in
    /// `flags`.
    Flags,
}

/// A node's metadata before a chmod, chown, utime or xattr call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaBefore {
    /// What the call changes.
    pub what: MetaKind,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access time, `[seconds, nanoseconds]`.
    pub atime: [i64; 2],
    /// Last modification time, `[seconds, nanoseconds]`.
    pub mtime: [i64; 2],
    /// Identity of the node.
    pub ident: Ident,
    /// Whether the node is a symlink (whose mode Linux ignores).
    pub symlink: bool,
    /// For `what = xattr`: the attribute's name and prior value (`None`: it was not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattr: Option<XattrBefore>,
    /// For `what = flags`: the inode flags before the call (`FS_IOC_GETFLAGS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<u32>,
}

/// One extended attribute's prior state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XattrBefore {
    /// Its name.
    pub name: BPath,
    /// Its prior value; `None` when it was not set.
    pub value: Option<Bytes>,
}

/// Device and inode number: what makes two names the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ident {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

/// Whether `name` is one the capture code makes: a decimal id, optionally inside the shard
/// directory named, in two hex digits, by the id's second byte (`04/1066`, see
/// [`crate::capture::blob_name`]) or, in sessions of builds before that, by its low byte
/// (`2a/1066`). Nothing else: a name with `..`, a leading `/` or another directory in a
/// tampered journal would send undo (or review) outside the store.
pub fn is_blob_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    let named_by = |shard: &str, byte: u64| format!("{byte:02x}") == shard;
    match name.split_once('/') {
        None => digits(name),
        Some((shard, id)) => {
            digits(id)
                && shard.len() == 2
                && id.parse::<u64>().is_ok_and(|n| named_by(shard, (n >> 8) & 0xff) || named_by(shard, n & 0xff))
        }
    }
}

fn blob_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if is_blob_name(&name) {
        Ok(name)
    } else {
        Err(serde::de::Error::custom(format!("{name:?} is not a blob name this store makes")))
    }
}

/// The kind of node a snapshot holds, and where its content went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Node {
    /// A regular file whose bytes are kept in a blob.
    File {
        /// Blob name inside the session's `blobs/` directory: `hh/ID` (see
        /// [`crate::capture::blob_name`]), or a bare `ID` in sessions made before blobs were
        /// sharded. Any other name is refused when the journal is read ([`is_blob_name`]).
        #[serde(deserialize_with = "blob_name")]
        blob: String,
        /// Size in bytes at capture time.
        size: u64,
        /// BLAKE3 of the content (hex), when it was computed at capture time.
        hash: Option<String>,
        /// How the blob was made.
        how: CaptureHow,
        /// For a file kept by moving its inode into the store before an `O_TRUNC` open (see
        /// [`crate::capture::MOVE_ASIDE_MIN`]): the identity of the empty file left in its
        /// place, which the call then opened.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        twin: Option<Ident>,
    },
    /// A small regular file whose bytes were copied into a pack: one file of the store
    /// holding many small captures one after another (the supervisor writes one per worker),
    /// so that a capture costs one write instead of a file of its own.
    Packed {
        /// The pack's name inside `blobs/`, as for a blob ([`is_blob_name`]).
        #[serde(deserialize_with = "blob_name")]
        pack: String,
        /// Where the bytes start in the pack.
        at: u64,
        /// How many there are: the file's size at capture time.
        size: u64,
        /// BLAKE3 of the bytes (hex): undo writes back only bytes that match it.
        hash: String,
    },
    /// A regular file about to be appended to: its first `len` bytes stay as they are, so
    /// undo only truncates back to `len`.
    Prefix {
        /// Size in bytes before the append.
        len: u64,
    },
    /// A symbolic link.
    Symlink {
        /// Its target, exactly as stored.
        target: BPath,
    },
    /// A directory (its entries have records of their own).
    Dir,
    /// A FIFO, socket or device node, recreated with `mknod`.
    Special {
        /// `fifo`, `socket`, `char` or `block`.
        kind: SpecialKind,
        /// Device number for device nodes.
        rdev: u64,
    },
}

/// How a file's prior content was kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureHow {
    /// The doomed inode itself was hard-linked into the store (unlink, rename over): undo
    /// moves it back, so its inode, metadata and bytes are exactly the original.
    Link,
    /// The bytes were copied (and hashed while copying).
    Copy,
    /// The bytes were cloned with `FICLONE` (copy-on-write; hashed lazily).
    Reflink,
}

/// Kinds of special file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    /// Named pipe.
    Fifo,
    /// Unix-domain socket node.
    Socket,
    /// Character device.
    Char,
    /// Block device.
    Block,
}

impl SpecialKind {
    /// Lower-case name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            SpecialKind::Fifo => "FIFO",
            SpecialKind::Socket => "socket",
            SpecialKind::Char => "character device",
            SpecialKind::Block => "block device",
        }
    }
}

/// A network or local socket endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// `inet`, `inet6`, `unix`, or the numeric family.
    pub family: String,
    /// The address: an IP address, a socket path, or `@name` for an abstract socket.
    pub address: BPath,
    /// The port, for `inet` and `inet6`.
    pub port: Option<u16>,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.family.as_str(), self.port) {
            ("inet6", Some(p)) => write!(f, "[{}]:{p}", self.address.display_lossy()),
            (_, Some(p)) => write!(f, "{}:{p}", self.address.display_lossy()),
            ("unix", None) => write!(f, "unix socket {}", self.address.display_lossy()),
            (fam, None) => write!(f, "{} ({fam})", self.address.display_lossy()),
        }
    }
}

/// Whether a connect took place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ConnectResult {
    /// Connected.
    Ok,
    /// A non-blocking connect under way: it may well succeed.
    InProgress,
    /// Refused or unreachable: nothing was exchanged.
    Failed {
        /// Why.
        errno: i32,
    },
    /// Attempted; whether it connected was not seen (journaled by the supervisor, which lets
    /// the kernel make the call). Treated as made.
    Unknown,
}

/// Why a process or program runs where the shim cannot see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum UnobservedReason {
    /// The process switched to a user that cannot write the session store, so neither it nor
    /// its children can journal anything.
    CredentialsChanged {
        /// The new effective uid.
        uid: u32,
        /// The uid that owns the session store.
        store_owner: u32,
    },
    /// A statically linked executable: no dynamic loader, so no shim.
    StaticExecutable,
    /// A set-user-ID or set-group-ID executable: the loader drops LD_PRELOAD for it.
    SetIdExecutable {
        /// Its permission bits.
        mode: u32,
    },
    /// An executable with file capabilities: the loader drops LD_PRELOAD for it.
    FileCapabilities,
    /// An executable for another architecture, which this shim cannot be loaded into.
    ForeignArchitecture {
        /// What the ELF header says.
        machine: String,
    },
    /// The program's environment disables the shim (`AETHER_JOURNAL=off` set by the caller).
    ShimDisabled,
    /// `aether-journal` itself, run inside this session (it leaves the shim to reach its own
    /// store): a nested `run` journals its command in a session of its own, which must be
    /// undone first; any other subcommand (an `undo`) changed files this session did not see.
    NestedSession {
        /// The subcommand (`run`, `undo`, ...).
        subcommand: String,
        /// The nested session's directory, when its command line names it (`--journal`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dir: Option<BPath>,
    },
    /// The process set up io_uring, through which it can open, write, rename and unlink
    /// files without calling libc.
    IoUring,
    /// A program that makes its own system calls for its file operations instead of calling
    /// libc (a Go program, even one linked with libc; Bun), so the shim sees none of them.
    BypassesLibc {
        /// What it is built with (`go`, `bun`).
        runtime: String,
    },
    /// The process gave itself a root or a mount namespace of its own (`chroot`, `unshare
    /// -m`, a sandbox such as bubblewrap): the names it (and its children) change files by may
    /// lead elsewhere than the same names do for undo, so those changes are not known to be
    /// undoable.
    OwnMountNamespace,
    /// The shim could not be loaded or could not reach the session store.
    ShimNotLoaded {
        /// Why.
        why: String,
    },
}

impl fmt::Display for UnobservedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnobservedReason::CredentialsChanged { uid, store_owner } => write!(
                f,
                "it switched to uid {uid}, which cannot write the session store (owned by uid {store_owner}); what it and its children changed afterwards was not journaled"
            ),
            UnobservedReason::StaticExecutable => f.write_str(
                "it is statically linked, so the shim could not be loaded into it; what it changed was not journaled",
            ),
            UnobservedReason::SetIdExecutable { mode } => write!(
                f,
                "it is set-user-ID or set-group-ID (mode {mode:o}), so the loader ignored LD_PRELOAD; what it changed was not journaled"
            ),
            UnobservedReason::FileCapabilities => f.write_str(
                "it has file capabilities, so the loader ignored LD_PRELOAD; what it changed was not journaled",
            ),
            UnobservedReason::ForeignArchitecture { machine } => write!(
                f,
                "it is built for another architecture ({machine}), so the shim could not be loaded into it; what it changed was not journaled"
            ),
            UnobservedReason::ShimDisabled => {
                f.write_str("its environment sets AETHER_JOURNAL=off; what it changed was not journaled")
            }
            UnobservedReason::NestedSession { subcommand, dir } if subcommand == "run" => match dir {
                Some(d) => write!(
                    f,
                    "a nested session at {}: what its command changed is journaled there, not here; undo it first (aether-journal undo --journal {})",
                    d.display_lossy(),
                    d.display_lossy()
                ),
                None => f.write_str(
                    "a nested aether-journal session (its directory is the one that run printed): what its command changed is journaled there, not here; undo it first",
                ),
            },
            UnobservedReason::NestedSession { subcommand, .. } => write!(
                f,
                "aether-journal {subcommand} ran inside this session, outside the shim: what it changed was not journaled here"
            ),
            UnobservedReason::IoUring => f.write_str(
                "it set up io_uring, through which files can change without passing through libc; what it changed that way was not journaled",
            ),
            UnobservedReason::OwnMountNamespace => f.write_str(
                "it gave itself a root or mount namespace of its own, where names may lead elsewhere than they do for undo; what it and its children changed there is not known to be undoable",
            ),
            UnobservedReason::ShimNotLoaded { why } => {
                write!(f, "the shim could not journal it ({why}); what it changed was not journaled")
            }
            UnobservedReason::BypassesLibc { runtime } => write!(
                f,
                "it is a {} program, which makes its own system calls instead of calling libc, so the shim saw none of them; what it changed was not journaled (the supervisor of `aether-journal run` sees them)",
                match runtime.as_str() {
                    "go" => "Go",
                    "bun" => "Bun",
                    other => other,
                }
            ),
        }
    }
}

/// Why a prior state could not be kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// The file is larger than `AETHER_JOURNAL_MAX_FILE`.
    OverFileBudget {
        /// The file's size.
        size: u64,
        /// The per-file limit in force.
        limit: u64,
    },
    /// Keeping the file would take the session past `AETHER_JOURNAL_MAX_TOTAL`.
    OverTotalBudget {
        /// The file's size.
        size: u64,
        /// Bytes the session had already kept.
        used: u64,
        /// The session limit in force.
        limit: u64,
    },
    /// Data written into a FIFO, socket or device is consumed elsewhere and cannot be unsent.
    SpecialFile {
        /// What the node is.
        kind: SpecialKind,
    },
    /// Capturing the prior state failed.
    CaptureFailed {
        /// What was being done (`read`, `copy into the store`, ...).
        step: String,
        /// The error.
        error: String,
    },
    /// The shim hit an internal error while journaling this call (it still let the call run).
    Internal {
        /// What went wrong.
        message: String,
    },
}

/// `n` bytes for a person: `2.0 GiB`, `512 bytes`.
pub(crate) fn human_size(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, scale) in UNITS {
        if n >= scale {
            return format!("{:.1} {unit}", n as f64 / scale as f64);
        }
    }
    format!("{n} bytes")
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::OverFileBudget { size, limit } => write!(
                f,
                "file of {} ({size} bytes) is over the per-file capture budget of {} ({limit} bytes, AETHER_JOURNAL_MAX_FILE); its prior contents were not kept",
                human_size(*size),
                human_size(*limit)
            ),
            Reason::OverTotalBudget { size, used, limit } => write!(
                f,
                "keeping this file of {} ({size} bytes) would take the session past its capture budget of {} ({limit} bytes, AETHER_JOURNAL_MAX_TOTAL; {used} bytes already kept); its prior contents were not kept",
                human_size(*size),
                human_size(*limit)
            ),
            Reason::SpecialFile { kind } => {
                write!(f, "data written to a {} is consumed by whatever reads it and cannot be unsent", kind.name())
            }
            Reason::CaptureFailed { step, error } => {
                write!(f, "the prior state could not be captured ({step}: {error})")
            }
            Reason::Internal { message } => {
                write!(f, "the shim failed while journaling this call ({message})")
            }
        }
    }
}

/// Reading the three internally tagged enums of a record ([`Op`], [`Before`], [`Node`]) without
/// serde's buffering of each map: every writer of the format puts the tag first, so the tag is
/// read, then the rest of the map goes straight into the variant's fields. A map whose tag is
/// not first, or a variant rarely written, is handed to the derived implementation whole (its
/// first entry replayed), so what is accepted and the errors for what is not are the derived
/// ones. Reading a journal spent a third of its time in that buffering.
pub(crate) mod tag_first {
    use serde::de::value::{MapAccessDeserializer, StringDeserializer};
    use serde::de::{DeserializeSeed, Error, IgnoredAny, MapAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    use super::{BPath, Before, CaptureHow, Ident, MetaBefore, Node, Op, Snapshot};

    /// A map access that yields `first` (a key and its value, already read) before the rest.
    struct Replay<A> {
        first: Option<(String, Value)>,
        value: Option<Value>,
        rest: A,
    }

    impl<'de, A: MapAccess<'de>> MapAccess<'de> for Replay<A> {
        type Error = A::Error;

        fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
            match self.first.take() {
                Some((key, value)) => {
                    self.value = Some(value);
                    seed.deserialize(StringDeserializer::<A::Error>::new(key)).map(Some)
                }
                None => self.rest.next_key_seed(seed),
            }
        }

        fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
            match self.value.take() {
                Some(value) => seed.deserialize(value).map_err(A::Error::custom),
                None => self.rest.next_value_seed(seed),
            }
        }
    }

    /// The tag of a map (when it is its first key) and the access to the rest; otherwise the
    /// map to hand to the derived implementation.
    enum Start<A> {
        Tagged(String, A),
        Whole(Replay<A>),
    }

    fn start<'de, A: MapAccess<'de>>(mut map: A, tag: &str) -> Result<Start<A>, A::Error> {
        let Some(key) = map.next_key::<String>()? else {
            return Ok(Start::Whole(Replay { first: None, value: None, rest: map }));
        };
        let value: Value = map.next_value()?;
        match value {
            Value::String(name) if key == tag => Ok(Start::Tagged(name, map)),
            value => Ok(Start::Whole(Replay { first: Some((key, value)), value: None, rest: map })),
        }
    }

    /// The derived implementation of `T`, given the whole map.
    fn derived<'de, T: Deserialize<'de>, A: MapAccess<'de>>(map: Replay<A>) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }

    pub(crate) fn tagged_back<'de, T: Deserialize<'de>, A: MapAccess<'de>>(
        tag: &str,
        name: String,
        rest: A,
    ) -> Result<T, A::Error> {
        derived(Replay { first: Some((tag.to_string(), Value::String(name))), value: None, rest })
    }

    pub(crate) fn fields<'de, T: Deserialize<'de>, A: MapAccess<'de>>(rest: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(rest))
    }

    /// An enum whose common variants are read here, tag first.
    pub(crate) trait TagFirst<'de>: Deserialize<'de> {
        /// The name of its tag.
        const TAG: &'static str;
        /// What it is, for an error about something that is not a map.
        const WHAT: &'static str;
        /// Variant `name`, read from the rest of its map (the derived way, through
        /// [`tagged_back`], for a variant not read here).
        fn variant<A: MapAccess<'de>>(name: String, rest: A) -> Result<Self, A::Error>;
    }

    struct TagFirstVisitor<T>(std::marker::PhantomData<T>);

    impl<'de, T: TagFirst<'de>> Visitor<'de> for TagFirstVisitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(T::WHAT)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            match start(map, T::TAG)? {
                Start::Tagged(name, rest) => T::variant(name, rest),
                Start::Whole(map) => derived(map),
            }
        }
    }

    pub(crate) fn read<'de, T: TagFirst<'de>, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        d.deserialize_map(TagFirstVisitor(std::marker::PhantomData))
    }

    impl<'de> TagFirst<'de> for Op {
        const TAG: &'static str = "kind";
        const WHAT: &'static str = "a journaled operation";

        fn variant<A: MapAccess<'de>>(kind: String, rest: A) -> Result<Op, A::Error> {
            #[derive(Deserialize)]
            struct Change {
                path: BPath,
                #[serde(deserialize_with = "before")]
                before: Before,
            }
            #[derive(Deserialize)]
            struct Rename {
                from: BPath,
                to: BPath,
                flags: u32,
                moved: Option<Ident>,
                #[serde(deserialize_with = "before")]
                to_before: Before,
            }
            #[derive(Deserialize)]
            struct Meta {
                path: BPath,
                before: Box<MetaBefore>,
            }
            match kind.as_str() {
                "change" => fields::<Change, _>(rest).map(|c| Op::Change { path: c.path, before: c.before }),
                "rename" => fields::<Rename, _>(rest).map(|r| {
                    Op::Rename(Box::new(super::RenameOp {
                        from: r.from,
                        to: r.to,
                        flags: r.flags,
                        moved: r.moved,
                        to_before: r.to_before,
                    }))
                }),
                "meta" => fields::<Meta, _>(rest).map(|m| Op::Meta { path: m.path, before: m.before }),
                _ => tagged_back(Self::TAG, kind, rest),
            }
        }
    }

    impl<'de> TagFirst<'de> for Before {
        const TAG: &'static str = "state";
        const WHAT: &'static str = "a prior state";

        fn variant<A: MapAccess<'de>>(state: String, mut rest: A) -> Result<Before, A::Error> {
            match state.as_str() {
                "contents" => fields::<Snapshot, _>(rest).map(Before::contents),
                "absent" | "exclusive" => {
                    // A unit variant: whatever else the map holds is ignored, as derived.
                    while rest.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                    Ok(if state == "absent" { Before::Absent } else { Before::Exclusive })
                }
                _ => tagged_back(Self::TAG, state, rest),
            }
        }
    }

    impl<'de> TagFirst<'de> for Node {
        const TAG: &'static str = "type";
        const WHAT: &'static str = "a captured node";

        fn variant<A: MapAccess<'de>>(kind: String, rest: A) -> Result<Node, A::Error> {
            #[derive(Deserialize)]
            struct File {
                #[serde(deserialize_with = "super::blob_name")]
                blob: String,
                size: u64,
                hash: Option<String>,
                how: CaptureHow,
                #[serde(default)]
                twin: Option<Ident>,
            }
            #[derive(Deserialize)]
            struct Packed {
                #[serde(deserialize_with = "super::blob_name")]
                pack: String,
                at: u64,
                size: u64,
                hash: String,
            }
            match kind.as_str() {
                "file" => fields::<File, _>(rest).map(|f| Node::File {
                    blob: f.blob,
                    size: f.size,
                    hash: f.hash,
                    how: f.how,
                    twin: f.twin,
                }),
                "packed" => fields::<Packed, _>(rest).map(|p| Node::Packed {
                    pack: p.pack,
                    at: p.at,
                    size: p.size,
                    hash: p.hash,
                }),
                _ => tagged_back(Self::TAG, kind, rest),
            }
        }
    }

    /// [`Op`], tag first.
    pub(super) fn op<'de, D: Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        read(d)
    }

    /// [`Before`], tag first.
    pub(super) fn before<'de, D: Deserializer<'de>>(d: D) -> Result<Before, D::Error> {
        read(d)
    }

    /// [`Node`], tag first.
    pub(super) fn node<'de, D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        read(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_written_and_read_as_the_list_of_paths_they_were() {
        let lists: [Vec<BPath>; 3] = [
            vec![],
            vec![BPath::from("touch"), BPath::from(""), BPath::from(&b"n\xffme"[..]), BPath::from("\u{e9}t\u{e9}")],
            (0..1000).map(|i| BPath::from(i.to_string().as_str())).collect(),
        ];
        for list in lists {
            let argv: Argv = list.iter().collect();
            assert_eq!(argv.len(), list.len());
            assert_eq!(argv.to_paths(), list);
            let text = serde_json::to_string(&argv).unwrap();
            assert_eq!(text, serde_json::to_string(&list).unwrap(), "written as the list");
            let back: Argv = serde_json::from_str(&text).unwrap();
            assert_eq!(back, argv);
        }
        assert!(serde_json::from_str::<Argv>(r#""touch""#).is_err(), "a string is not a list");
    }

    fn sample(op: Op) -> Record {
        Record {
            v: Version,
            seq: 7,
            time: Stamp::parse("2026-11-29T19:45:12.000000001Z").unwrap(),
            pid: 42,
            ppid: 1,
            origin: crate::record::Origin::new(BPath::from("/usr/bin/rm"), "unlinkat".into()),
            op,
        }
    }

    #[test]
    fn only_blob_names_the_store_makes_are_accepted() {
        assert!(is_blob_name("04/1066") && is_blob_name("01/256") && is_blob_name("00/255"));
        assert!(is_blob_name("2a/1066") && is_blob_name("00/256") && is_blob_name("ff/255"), "shards of older builds");
        assert!(is_blob_name("17"), "sessions made before sharding");
        for bad in
            ["", "../x", "/etc/passwd", "2a/../../x", "2b/1066", "05/1066", "2a/", "/1", "a/b/1", "2A/1066", "1e3"]
        {
            assert!(!is_blob_name(bad), "{bad:?} accepted");
        }
        let json = r#"{"type":"file","blob":"../../../etc/shadow","size":1,"hash":null,"how":"link"}"#;
        let err = serde_json::from_str::<Node>(json).unwrap_err().to_string();
        assert!(err.contains("not a blob name"), "{err}");
        let json = r#"{"type":"packed","pack":"../../../etc/shadow","at":0,"size":1,"hash":"ab"}"#;
        let err = serde_json::from_str::<Node>(json).unwrap_err().to_string();
        assert!(err.contains("not a blob name"), "{err}");
    }

    #[test]
    fn a_record_in_memory_is_sixty_four_bytes_and_its_program_and_call_one_pointer() {
        // A journal of a million records holds a million of these: each word is 8 MB.
        assert_eq!(std::mem::size_of::<Version>(), 0);
        assert_eq!(std::mem::size_of::<Call>(), 8);
        assert_eq!(std::mem::size_of::<Origin>(), 8);
        assert!(std::mem::size_of::<Op>() <= 32, "{}", std::mem::size_of::<Op>());
        assert!(std::mem::size_of::<Record>() <= 64, "{}", std::mem::size_of::<Record>());
    }

    #[test]
    fn records_read_by_one_thread_share_one_origin_per_program_and_call() {
        let line = |seq: u32, prog: &str, call: &str| {
            format!(
                r#"{{"v":1,"seq":{seq},"time":"2026-12-01T17:48:33.792479801Z","pid":1,"ppid":0,"prog":"{prog}","call":"{call}","op":{{"kind":"change","path":"/t/a","before":{{"state":"absent"}}}}}}"#
            )
        };
        let read = |text: String| serde_json::from_str::<Record>(&text).unwrap();
        let (a, b) = (read(line(1, "/bin/rm", "unlinkat")), read(line(2, "/bin/rm", "unlinkat")));
        assert!(Arc::ptr_eq(&a.origin.0, &b.origin.0), "the same program and call are one copy");
        let (c, d) = (read(line(3, "/bin/rm", "openat")), read(line(4, "/bin/mv", "unlinkat")));
        assert!(!Arc::ptr_eq(&a.origin.0, &c.origin.0) && !Arc::ptr_eq(&a.origin.0, &d.origin.0));
        assert_eq!((a.prog().as_bytes(), a.call().as_str()), (&b"/bin/rm"[..], "unlinkat"));
        assert_eq!((c.call().as_str(), d.prog().as_bytes()), ("openat", &b"/bin/mv"[..]));
        // Written back in the journal's order of fields, as it was read.
        assert_eq!(serde_json::to_string(&a).unwrap(), line(1, "/bin/rm", "unlinkat"));
    }

    #[test]
    fn a_call_reads_and_writes_as_its_name_and_the_records_of_one_thread_share_it() {
        let a: Call = serde_json::from_str(r#""openat""#).unwrap();
        let b: Call = serde_json::from_str(r#""openat""#).unwrap();
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!((a.as_str(), format!("{a}"), format!("{a:?}")), ("openat", "openat".into(), r#""openat""#.into()));
        assert_eq!(serde_json::to_string(&a).unwrap(), r#""openat""#);
        assert_eq!(a, Call::from("openat"));
        let odd: Call = serde_json::from_str(r#""we\"ird""#).unwrap();
        assert_eq!(&*odd, "we\"ird");
    }

    #[test]
    fn every_prior_state_round_trips_through_json() {
        let snap = Snapshot {
            node: Node::File {
                blob: "01/1".into(),
                size: 3,
                hash: Some("ab".into()),
                how: CaptureHow::Copy,
                twin: None,
            },
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: [1, 2],
            atime: [3, 4],
            ident: Ident { dev: 1, ino: 2 },
            xattrs: Some(vec![Xattr { name: BPath::from("user.x"), value: Bytes(vec![0, 255]) }]),
            links: 2,
        };
        for before in [
            Before::contents(snap.clone()),
            Before::Absent,
            Before::Exclusive,
            Before::irreversible(Reason::OverFileBudget { size: 10, limit: 5 }),
            Before::contents(Snapshot {
                node: Node::Symlink { target: BPath::new(b"t\xff".to_vec()) },
                ..snap.clone()
            }),
            Before::contents(Snapshot { node: Node::Dir, ..snap.clone() }),
            Before::contents(Snapshot { node: Node::Prefix { len: 9 }, ..snap.clone() }),
            Before::contents(Snapshot { node: Node::Special { kind: SpecialKind::Fifo, rdev: 0 }, ..snap.clone() }),
            Before::contents(Snapshot {
                node: Node::Packed { pack: "02/2".into(), at: 4096, size: 71, hash: "cd".into() },
                ..snap.clone()
            }),
        ] {
            let r = sample(Op::Change { path: BPath::from("/x"), before });
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), r, "{text}");
        }
    }

    #[test]
    fn a_record_reads_the_same_whether_its_tags_come_first_or_last() {
        // Writers put every tag first (read without buffering); any other order goes the
        // derived way. Both must give the same record, for every kind of operation and state.
        let snap = Snapshot {
            node: Node::File { blob: "01/1".into(), size: 3, hash: None, how: CaptureHow::Link, twin: None },
            mode: 0o644,
            uid: 1,
            gid: 2,
            mtime: [1, 2],
            atime: [3, 4],
            ident: Ident { dev: 1, ino: 2 },
            xattrs: None,
            links: 0,
        };
        let meta = MetaBefore {
            what: MetaKind::Mode,
            mode: 0o600,
            uid: 0,
            gid: 0,
            atime: [0, 0],
            mtime: [5, 6],
            ident: Ident { dev: 1, ino: 3 },
            symlink: false,
            xattr: None,
            flags: Some(16),
        };
        let ops = [
            Op::Change { path: BPath::new(b"/a\xff".to_vec()), before: Before::contents(snap.clone()) },
            Op::Change { path: BPath::from("/b"), before: Before::Exclusive },
            Op::Change { path: BPath::from("/c"), before: Before::Born { created: 3 } },
            Op::Change { path: BPath::from("/d"), before: Before::Kept { by: 4 } },
            Op::Change {
                path: BPath::from("/e"),
                before: Before::contents(Snapshot { node: Node::Prefix { len: 9 }, ..snap.clone() }),
            },
            Op::Change {
                path: BPath::from("/e2"),
                before: Before::contents(Snapshot {
                    node: Node::Packed { pack: "02/2".into(), at: 7, size: 3, hash: "ab".into() },
                    ..snap.clone()
                }),
            },
            Op::Rename(Box::new(RenameOp {
                from: BPath::from("/f"),
                to: BPath::from("/g"),
                flags: 1,
                moved: Some(Ident { dev: 1, ino: 9 }),
                to_before: Before::contents(Snapshot { node: Node::Dir, ..snap.clone() }),
            })),
            Op::Rename(Box::new(RenameOp {
                from: BPath::from("/h"),
                to: BPath::from("/i"),
                flags: 0,
                moved: None,
                to_before: Before::Absent,
            })),
            Op::Meta { path: BPath::from("/j"), before: Box::new(meta) },
            Op::Exec(Box::new(ExecOp {
                program: BPath::from("/bin/sh"),
                argv: ["sh"].into_iter().collect(),
                cwd: BPath::from("/"),
                child: Some(5),
            })),
            Op::CallFailed { of_seq: 6, errno: 2 },
            Op::Mark(Box::new(MarkOp { name: "turn-1".into(), label: None, key: Some("k".into()), held: vec![] })),
        ];
        fn tags_last(v: &mut serde_json::Value) {
            if let serde_json::Value::Object(map) = v {
                for tag in ["kind", "state", "type"] {
                    if let Some(t) = map.remove(tag) {
                        map.insert(tag.to_string(), t);
                    }
                }
                map.values_mut().for_each(tags_last);
            }
        }
        for op in ops {
            let r = sample(op);
            let first = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Record>(&first).unwrap(), r, "{first}");
            let mut v = serde_json::to_value(&r).unwrap();
            tags_last(&mut v);
            let last = serde_json::to_string(&v).unwrap();
            assert_ne!(first, last);
            assert_eq!(serde_json::from_str::<Record>(&last).unwrap(), r, "{last}");
        }
        // What the derived reading refuses, the tag-first one refuses too.
        let bad = r#"{"v":1,"seq":1,"time":"2026-11-29T19:45:12Z","pid":1,"ppid":0,"prog":"/p","call":"c","op":{"kind":"change","path":"/x","before":{"state":"contents","node":{"type":"file","blob":"../x","size":1,"hash":null,"how":"link"},"mode":0,"uid":0,"gid":0,"mtime":[0,0],"atime":[0,0],"ident":{"dev":1,"ino":1}}}}"#;
        let err = serde_json::from_str::<Record>(bad).unwrap_err().to_string();
        assert!(err.contains("not a blob name"), "{err}");
        let missing = r#"{"v":1,"seq":1,"time":"2026-11-29T19:45:12Z","pid":1,"ppid":0,"prog":"/p","call":"c","op":{"kind":"change","before":{"state":"absent"}}}"#;
        let err = serde_json::from_str::<Record>(missing).unwrap_err().to_string();
        assert!(err.contains("missing field `path`"), "{err}");
    }

    #[test]
    fn the_json_names_the_prior_state_in_the_words_of_the_format() {
        let r = sample(Op::Change { path: BPath::from("/x"), before: Before::Absent });
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""op":{"kind":"change","path":"/x","before":{"state":"absent"}}"#), "{text}");
    }

    #[test]
    fn budget_reasons_name_both_numbers() {
        let msg = Reason::OverFileBudget { size: 2 << 30, limit: 1 << 30 }.to_string();
        assert!(msg.contains("2147483648") && msg.contains("1073741824"), "{msg}");
        let msg = Reason::OverTotalBudget { size: 10, used: 20, limit: 25 }.to_string();
        assert!(msg.contains("10 bytes") && msg.contains("25 bytes"), "{msg}");
    }

    #[test]
    fn a_template_matches_only_names_it_could_produce_in_its_own_directory() {
        let t = BPath::from("/d/sedXXXXXX");
        assert!(matches_template(&t, &BPath::from("/d/sedA1b2C3")));
        assert!(!matches_template(&t, &BPath::from("/d/sedA1b2C")), "another length");
        assert!(!matches_template(&t, &BPath::from("/d/xedA1b2C3")), "another prefix");
        assert!(!matches_template(&t, &BPath::from("/e/sedA1b2C3")), "another directory");
        assert!(matches_template(&BPath::from("/d/aXXXXXX.c"), &BPath::from("/d/a123456.c")));
        assert!(!matches_template(&BPath::from("/d/aXXXXXX.c"), &BPath::from("/d/a123456.h")), "another suffix");
    }
}
