//! The session store as the supervisor writes to it: the same counters, capture index, born
//! table and blobs as the shim's, and records in segments of the supervisor's own (one per
//! worker thread, mapped like the shim's), ordered with every other writer's records by the
//! shared sequence counter.
//!
//! What this module cannot do: keep records when the store's file system is full (each lost
//! record is counted, so no undo of the session can claim completeness), or survive a segment
//! truncated from outside the session while it is mapped (the supervisor would then die of
//! `SIGBUS`, and the session's watched calls fail with `ENOSYS`).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aether_journal::capture::{Counters, Direct, FsCalls, Packer};
use aether_journal::config::Settings;
use aether_journal::internal::{Envelope, encode_fields};
use aether_journal::pack::Pack;
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
    /// The session's `journal`, for each worker's first records (`O_APPEND`).
    journal: Option<OwnedFd>,
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
        let journal = rustix::fs::open(
            dir.join(session::JOURNAL_FILE).as_path(),
            OFlags::WRONLY | OFlags::APPEND | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok();
        let root_pid = std::fs::read(dir.join(session::HEADER_FILE))
            .ok()
            .and_then(|t| aether_journal_recorder::effects::serde_json_root_pid(&t));
        // The tables inside the counters' mapping (a session made with them there), set now;
        // those of an older session are mapped from their own files on first use.
        let (index, born) = (OnceLock::new(), OnceLock::new());
        // SAFETY: the tables point into `counters`' mapping, which this Store holds beside them
        // and which is unmapped only when the Store, tables included, is dropped.
        if let (Some(i), Some(b)) = unsafe { (counters.captures(), counters.born()) } {
            let _ = index.set(Some(i));
            let _ = born.set(Some(b));
        }
        Ok(Store { dir: dir.to_path_buf(), canon, counters, index, born, blobs, journal, settings, root_pid, mark })
    }

    /// The shared counters (passes, the lost-record count).
    pub fn counters(&self) -> &SharedCounters {
        &self.counters
    }

    fn segments(&self) -> PathBuf {
        self.dir.join(SEGMENTS_DIR)
    }
}

/// One worker's segment: a file of its own (`segments/supervisor-PID-SEQ`, PID the
/// supervisor's, SEQ its first record's), preallocated and mapped shared, into which each
/// record is copied with its LF stored last, as the shim's are (a copied record is in the page
/// cache as a written one is: it survives the supervisor's death). A record that does not fit
/// starts the next segment. A worker's first records are written to the session's `journal`
/// instead. With `AETHER_JOURNAL_SYNC=1` records are written and synced
/// instead, one `write(2)` each.
#[derive(Default)]
pub struct Writer {
    file: Option<OwnedFd>,
    map: Option<Mapped>,
    made: u32,
    written: u32,
    /// The worker's pack of small copies ([`aether_journal::pack`]), once it has made one.
    pack: Option<Pack>,
}

/// Records a worker writes to the session's `journal` (one `write(2)` each, as the shim's
/// first are) before it makes a segment: a session the supervisor journals little for
/// preallocates nothing.
const WRITES_FIRST: u32 = 16;

/// A mapped segment and how much of it is used.
struct Mapped {
    base: *mut u8,
    len: usize,
    used: usize,
}

/// Size of a worker's first segment; each next one is twice the one before, up to
/// [`SEGMENT_MAX`] (a record longer than that gets a segment of its own size). A session that
/// journals little through the supervisor costs little disk.
const SEGMENT_FIRST: usize = 16 * 1024;
/// Size of a worker's largest segments.
const SEGMENT_MAX: usize = 1 << 20;

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, which nothing refers to any more.
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.len) };
        // The room it preallocated and did not use stays (NUL bytes, which readers skip): on
        // ext4 with ordered data, a truncate waits for the journal's commit of everything the
        // session wrote meanwhile (measured: 0.4 s, during which no watched call is answered).
    }
}

impl Writer {
    fn append(&mut self, store: &Store, seq: u64, line: &[u8]) -> bool {
        if store.settings.sync {
            return self.write_synced(store, seq, line);
        }
        if self.written < WRITES_FIRST
            && let Some(j) = &store.journal
        {
            self.written += 1;
            return aether_journal::capture::write_all(j, line).is_ok();
        }
        let room = self.map.as_ref().map_or(0, |m| m.len - m.used);
        if room < line.len() {
            self.map = None;
            let len = (SEGMENT_FIRST << self.made.min(8)).min(SEGMENT_MAX);
            match self.new_segment(store, seq, line.len().max(len)) {
                Some(m) => {
                    self.map = Some(m);
                    self.made += 1;
                }
                None => return false,
            }
        }
        let Some(m) = self.map.as_mut() else { return false };
        let Some((&lf, body)) = line.split_last() else { return true };
        // SAFETY: `used + line.len() <= len` (checked above), within our mapping, which no one
        // else writes (the segment is this worker's).
        unsafe {
            let at = m.base.add(m.used);
            std::ptr::copy_nonoverlapping(body.as_ptr(), at, body.len());
            // The line ends last: a reader (or a death) before this sees an incomplete record.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            at.add(body.len()).write_volatile(lf);
        }
        m.used += line.len();
        true
    }

    /// A new segment of `len` bytes, preallocated (a copy into it can never meet a full disk)
    /// and mapped.
    fn new_segment(&self, store: &Store, seq: u64, len: usize) -> Option<Mapped> {
        let dir = store.segments();
        let _ = std::fs::create_dir(&dir);
        let name = dir.join(format!("supervisor-{}-{seq}", std::process::id()));
        let fd = rustix::fs::open(
            name.as_path(),
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .ok()?;
        if rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, len as u64).is_err() {
            let _ = std::fs::remove_file(&name);
            return None;
        }
        let base = aether_journal_recorder::tables::map_shared(fd.as_fd(), len)?;
        Some(Mapped { base: base.cast(), len, used: 0 })
    }

    fn write_synced(&mut self, store: &Store, seq: u64, line: &[u8]) -> bool {
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
        aether_journal::capture::write_all(f, line).is_ok() && rustix::fs::fsync(f).is_ok()
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

    fn packer(&self) -> Option<&dyn Packer> {
        Some(self)
    }
}

/// A worker packs its small copies: one write each into a pack of its own, instead of a file
/// each (W10, a Go program rewriting 2,000 small files, spent most of its supervisor time
/// making those files).
impl Packer for Recording<'_> {
    fn append(&self, blobs: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<(String, u64)> {
        let sync = self.store.settings.sync;
        let mut writer = self.writer.borrow_mut();
        let pack = match &mut writer.pack {
            Some(pack) if pack.has_room(bytes.len() as u64) => pack,
            slot => slot.insert(Pack::create(&Direct, blobs, self.store.counters.next_id(), sync)?),
        };
        let at = pack.append(bytes, sync)?;
        Ok((pack.name.clone(), at))
    }
}
