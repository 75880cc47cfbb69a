//! The session store as the supervisor writes to it: the same counters, capture index, born
//! table and blobs as the shim's, and records in segment files of the supervisor's own (one per
//! worker thread, appended with one `write(2)` per record), ordered with every other writer's
//! records by the shared sequence counter.
//!
//! What this module cannot do: write a record that is larger than a pipe buffer atomically with
//! respect to a reader of a session still running (readers meet a torn last line, which they
//! report as such); nor keep records when the store's file system is full (each lost record is
//! counted, so no undo of the session can claim completeness).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aether_journal::capture::{Counters, Direct, FsCalls};
use aether_journal::config::Settings;
use aether_journal::journal::{Envelope, encode_fields};
use aether_journal::record::Op;
use aether_journal::session::{self, BORN_FILE, CAPTURES_FILE, COUNTERS_FILE, SEGMENTS_DIR};
use aether_journal_recorder::index::SharedIndex;
use aether_journal_recorder::ops::Journal;
use aether_journal_recorder::tables::SharedCounters;
use rustix::fs::{Mode, OFlags};

use crate::target::Process;

/// An open session, shared by the supervisor's workers.
pub struct Store {
    /// The session directory as its processes know it.
    pub dir: PathBuf,
    canon: Vec<u8>,
    counters: SharedCounters,
    index: OnceLock<Option<SharedIndex>>,
    born: OnceLock<Option<SharedIndex>>,
    blobs: OwnedFd,
    /// Budgets, policy, sync (the session's settings, as `run` passes them to the shim).
    pub settings: Settings,
    root_pid: Option<u32>,
    /// The marker the shim's journaled calls carry.
    pub mark: u64,
}

impl Store {
    /// Opens the session at `dir` (it must exist: `run` made it).
    pub fn open(dir: &Path, settings: Settings, mark: u64) -> std::io::Result<Store> {
        let counters = SharedCounters::open(&dir.join(COUNTERS_FILE))
            .ok_or_else(|| std::io::Error::other("cannot map the session's counters"))?;
        let blobs = rustix::fs::open(
            dir.join(session::BLOBS_DIR).as_path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let canon = std::fs::canonicalize(dir)?.as_os_str().as_bytes().to_vec();
        let root_pid = std::fs::read(dir.join(session::HEADER_FILE))
            .ok()
            .and_then(|t| aether_journal_recorder::effects::serde_json_root_pid(&t));
        Ok(Store {
            dir: dir.to_path_buf(),
            canon,
            counters,
            index: OnceLock::new(),
            born: OnceLock::new(),
            blobs,
            settings,
            root_pid,
            mark,
        })
    }

    /// The shared counters (passes, the lost-record count).
    pub fn counters(&self) -> &SharedCounters {
        &self.counters
    }

    fn segments(&self) -> PathBuf {
        self.dir.join(SEGMENTS_DIR)
    }
}

/// One worker's segment file, made at its first record (`segments/supervisor-PID-SEQ`, where
/// PID is the supervisor's and SEQ the first record's): a plain file appended to, never
/// preallocated or mapped like the shim's `PID-SEQ` segments.
#[derive(Default)]
pub struct Writer {
    file: Option<OwnedFd>,
}

impl Writer {
    fn append(&mut self, store: &Store, seq: u64, line: &[u8]) -> bool {
        if self.file.is_none() {
            let dir = store.segments();
            let _ = std::fs::create_dir(&dir);
            let name = dir.join(format!("supervisor-{}-{seq}", std::process::id()));
            self.file = rustix::fs::open(
                name.as_path(),
                OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .ok();
        }
        let Some(f) = &self.file else { return false };
        let ok = aether_journal::capture::write_all(f, line).is_ok();
        if ok && store.settings.sync {
            let _ = rustix::fs::fsync(f);
        }
        ok
    }
}

/// The journal one call is recorded into: the session, the worker's segment, and the process
/// that made the call (the records' `pid`, `ppid` and `prog`).
pub struct Recording<'a> {
    /// The session.
    pub store: &'a Store,
    /// The worker's segment.
    pub writer: std::cell::RefCell<&'a mut Writer>,
    /// Who made the call.
    pub process: &'a Process,
}

impl Journal for Recording<'_> {
    fn record(&self, call: &str, op: Op) -> u64 {
        let seq = self.store.counters.next_id();
        let env = Envelope {
            seq,
            time: std::time::SystemTime::now(),
            pid: self.process.pid,
            ppid: self.process.ppid,
            prog_json: &self.process.prog_json,
            call,
        };
        let line = encode_fields(&env, &op);
        if !self.writer.borrow_mut().append(self.store, seq, &line) {
            self.store.counters.add_lost();
        }
        seq
    }

    fn with_blobs<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        Some(f(self.store.blobs.as_fd()))
    }

    fn counters(&self) -> &SharedCounters {
        &self.store.counters
    }

    fn index(&self) -> Option<&SharedIndex> {
        self.store.index.get_or_init(|| SharedIndex::map(&self.store.dir.join(CAPTURES_FILE))).as_ref()
    }

    fn born(&self) -> Option<&SharedIndex> {
        self.store.born.get_or_init(|| SharedIndex::map_born(&self.store.dir.join(BORN_FILE))).as_ref()
    }

    fn born_mapped(&self) -> Option<&SharedIndex> {
        self.store.born.get().and_then(Option::as_ref)
    }

    fn settings(&self) -> &Settings {
        &self.store.settings
    }

    fn session_canon(&self) -> &[u8] {
        &self.store.canon
    }

    fn calls(&self) -> &dyn FsCalls {
        &Direct
    }

    fn session_dir(&self) -> &[u8] {
        OsStr::as_bytes(self.store.dir.as_os_str())
    }

    fn root_pid(&self) -> Option<u32> {
        self.store.root_pid
    }
}
