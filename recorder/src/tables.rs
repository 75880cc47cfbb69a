//! The session's `counters` page, mapped shared by every process that journals (see
//! `docs/FORMAT.md` for its words): the id every record and blob takes, the bytes kept, the
//! records that could not be written, the names generation, and the passes; and the page of
//! exec verdicts after it, with which the session's processes check a program once.
//!
//! What this module cannot do: survive the file being replaced under a running session (each
//! process keeps the page it mapped), or keep a process of the session from writing the page
//! (it is the session's own shared memory).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use aether_journal::capture::Counters;
use aether_journal::exec_check::Vouched;
use aether_journal::internal::counters::{
    BORN_NAMES, EXEC_VERDICTS, SLOT_BORN_NAMES, SLOT_BYTES_KEPT, SLOT_CWD_DONE, SLOT_CWD_GEN, SLOT_EXEC_VERDICTS,
    SLOT_EXECS, SLOT_LAST_ID, SLOT_LAST_MARK, SLOT_LOST, SLOT_MARKS, SLOT_NAMES_DONE, SLOT_NAMES_GEN, SLOT_NOTIFIED,
    SLOT_PASSED, SLOT_PASSES, SLOT_SESSION, SLOT_SUPERVISOR_PEAK_KIB, SPAWN_PASS, fnv1a, session_tag,
};
use aether_journal::session::{
    BORN_AT, BORN_LEN, CAPTURES_AT, CAPTURES_LEN, COUNTERS_FILE_LEN, COUNTERS_LEN, COUNTERS_MAGIC, COUNTERS_TABLES_LEN,
    ensure_counters,
};

use crate::seqlock;

/// Maps the first `len` bytes of a session file shared and read-write, for the life of the
/// process (never unmapped: pointers into it stay valid). Touching the memory is only sound if
/// the file is at least `len` bytes long: the callers make sure of that first.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> Option<*mut std::ffi::c_void> {
    // SAFETY: a new mapping at an address of the kernel's choosing (no MAP_FIXED), so nothing
    // existing is replaced; the file stays referenced by the mapping after `fd` is closed.
    unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            fd,
            0,
        )
    }
    .ok()
}

/// How many passes the counters page holds (two words each, from [`SLOT_PASSES`] to the end).
pub const PASSES: usize = (COUNTERS_LEN / 8 - SLOT_PASSES) / 2;

/// The session's `counters` file, mapped shared by every process of the session.
pub struct SharedCounters {
    slots: *const AtomicU64,
    /// Bytes mapped: the counters page, the exec verdicts' page when the file has it, and the
    /// capture index and born table when the file holds them too.
    len: usize,
}

// SAFETY: the mapping is only accessed through atomics, and unmapped only when dropped.
unsafe impl Send for SharedCounters {}
// SAFETY: as above.
unsafe impl Sync for SharedCounters {}

impl SharedCounters {
    /// Maps an open `counters` file `file_len` bytes long (at least [`COUNTERS_LEN`]): with its
    /// exec verdicts' page if it has one, and its capture index and born table if it holds
    /// them (one mapping for all: see [`COUNTERS_TABLES_LEN`]).
    fn map(fd: &OwnedFd, file_len: u64) -> Option<SharedCounters> {
        let len = [COUNTERS_TABLES_LEN, COUNTERS_FILE_LEN]
            .into_iter()
            .find(|&l| file_len >= l as u64)
            .unwrap_or(COUNTERS_LEN);
        let p = map_shared(fd.as_fd(), len)?;
        Some(SharedCounters { slots: p.cast::<AtomicU64>(), len })
    }

    /// The capture index inside this mapping, if the file holds it (a session made before the
    /// index moved into the counters file keeps it in a file of its own: `None`).
    ///
    /// # Safety
    /// The index points into this mapping: it must not be used once `self` is dropped (the
    /// shim never drops its counters; the supervisor keeps them beside the index).
    pub unsafe fn captures(&self) -> Option<crate::index::SharedIndex> {
        // SAFETY: the range lies inside our mapping (len covers the tables), which outlives
        // the index by the caller's promise.
        (self.len >= COUNTERS_TABLES_LEN).then(|| unsafe { self.table(CAPTURES_AT, CAPTURES_LEN) })
    }

    /// The born table inside this mapping, if the file holds it; as [`SharedCounters::captures`].
    ///
    /// # Safety
    /// As for [`SharedCounters::captures`].
    pub unsafe fn born(&self) -> Option<crate::index::SharedIndex> {
        // SAFETY: as above.
        (self.len >= COUNTERS_TABLES_LEN).then(|| unsafe { self.table(BORN_AT, BORN_LEN) })
    }

    /// # Safety
    /// `at..at + len` lies inside the mapping, and the table is not used after `self` is dropped.
    unsafe fn table(&self, at: usize, len: usize) -> crate::index::SharedIndex {
        // SAFETY: the caller's promise: inside the mapping, page-aligned offsets (so 8-byte
        // aligned slots), alive as long as the index is used.
        unsafe { crate::index::SharedIndex::within(self.slots.cast::<u8>().add(at), len) }
    }

    /// Maps the `counters` file at `path` if it exists, is whole and holds the tag of the
    /// session `expected` (any session's, if `None`): then the session's header exists and is
    /// that session's, and need not be read (see [`SLOT_SESSION`]). `None` otherwise, and the
    /// caller looks at the header. Four system calls (open, fstat, mmap, close) where reading
    /// the header and opening the counters with [`SharedCounters::open`] make ten.
    pub fn open_tagged(path: &Path, expected: Option<&[u8]>) -> Option<SharedCounters> {
        // Through libc, as every call the shim makes for itself: under a supervisor the shim's
        // real calls are the marked ones, and an unmarked open of the store would be refused.
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).ok()?;
        // Mapped only whole: touching a page past the end of the file would be a SIGBUS.
        let size = aether_journal::session::StoreStat::of_fd(&f).ok()?.size;
        if size < COUNTERS_LEN as u64 {
            return None;
        }
        let c = SharedCounters::map(&f.into(), size)?;
        let magic = c.slot(0).load(Ordering::SeqCst).to_le_bytes();
        let tag = c.slot(SLOT_SESSION).load(Ordering::SeqCst);
        let ours = expected.map_or(tag != 0, |id| tag == session_tag(id));
        (magic == *COUNTERS_MAGIC && ours).then_some(c)
    }

    /// Opens (creating it if needed) and maps the `counters` file at `path`, with its tables.
    pub fn open(path: &Path) -> Option<SharedCounters> {
        let fd: OwnedFd = ensure_counters(path).ok()?.into();
        SharedCounters::map(&fd, COUNTERS_TABLES_LEN as u64)
    }

    fn slot(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < COUNTERS_LEN / 8);
        // SAFETY: i < COUNTERS_LEN / 8 for every slot we use, the mapping is page-aligned (so
        // 8-byte aligned) and lives as long as `self`.
        unsafe { &*self.slots.add(i) }
    }

    /// The first word of the exec verdict `name` maps to, with the upper half of the name's
    /// hash; `None` where the counters file has no verdicts' page.
    fn verdict(&self, name: &[u8]) -> Option<(&[AtomicU64], u32)> {
        if self.len < COUNTERS_FILE_LEN || name.is_empty() {
            return None;
        }
        let hash = fnv1a(name);
        let first = SLOT_EXEC_VERDICTS + 8 * (hash as usize % EXEC_VERDICTS);
        // SAFETY: the entry's eight words lie in the second page, which this mapping covers
        // (len is COUNTERS_FILE_LEN); page-aligned and alive as long as `self`.
        let words = unsafe { std::slice::from_raw_parts(self.slots.add(first), 8) };
        Some((words, (hash >> 32) as u32))
    }

    /// What a check of the program run by the name `name` vouched for, as the session's exec
    /// verdicts remember it (see [`SLOT_EXEC_VERDICTS`]): `None` when its entry is empty, holds
    /// another name's verdict or is being written, and where the file has no verdicts' page.
    /// Never a verdict by itself: the caller takes it only if `name` leads to that very file
    /// now ([`Vouched::now`]).
    pub fn remembered_verdict(&self, name: &[u8]) -> Option<Vouched> {
        let (w, tag) = self.verdict(name)?;
        let at = |i: usize| w.get(i).map_or(0, |a| a.load(Ordering::Relaxed));
        seqlock::read(w.first()?, || {
            let uid_tag = at(7);
            let (seq, nanos) = (at(0), at(6));
            (seq != 0 && (uid_tag >> 32) as u32 == tag).then(|| Vouched {
                dev: at(1),
                ino: at(2),
                size: at(3),
                mtime: [at(4) as i64, i64::from(nanos as u32)],
                ctime: [at(5) as i64, i64::from((nanos >> 32) as u32)],
                uid: uid_tag as u32,
            })
        })
    }

    /// Remembers, for every process of the session, that a check of the program run by the
    /// name `name` vouched for `v` (evicting whatever shared its entry). Nothing when another
    /// writer has the entry, or the file has no verdicts' page.
    pub fn remember_verdict(&self, name: &[u8], v: &Vouched) {
        let Some((w, tag)) = self.verdict(name) else { return };
        let Some(seq) = w.first() else { return };
        let nanos = u64::from(v.mtime[1] as u32) | u64::from(v.ctime[1] as u32) << 32;
        let words = [
            v.dev,
            v.ino,
            v.size,
            v.mtime[0] as u64,
            v.ctime[0] as u64,
            nanos,
            u64::from(v.uid) | u64::from(tag) << 32,
        ];
        seqlock::write(seq, || {
            for (to, from) in w.iter().skip(1).zip(words) {
                to.store(from, Ordering::Relaxed);
            }
        });
    }

    /// Counts one record that could not be written.
    pub fn add_lost(&self) {
        self.slot(SLOT_LOST).fetch_add(1, Ordering::SeqCst);
    }

    /// The records that could not be written so far.
    pub fn lost(&self) -> u64 {
        self.slot(SLOT_LOST).load(Ordering::SeqCst)
    }

    /// The session's names generation: changes begun of where an existing directory path
    /// leads (see [`SLOT_NAMES_GEN`]).
    pub fn names_gen(&self) -> u64 {
        self.slot(SLOT_NAMES_GEN).load(Ordering::SeqCst)
    }

    /// The names generation when no such change is under way, `None` while one is (see
    /// `settled` below).
    pub fn names_settled(&self) -> Option<u64> {
        self.settled(SLOT_NAMES_GEN, SLOT_NAMES_DONE)
    }

    /// Tells every process of the session that a directory path may be about to lead elsewhere.
    pub fn names_changing(&self) {
        self.slot(SLOT_NAMES_GEN).fetch_add(1, Ordering::SeqCst);
    }

    /// Tells every process of the session that a change [`Self::names_changing`] announced has
    /// run (or will not).
    pub fn names_changed(&self) {
        self.slot(SLOT_NAMES_DONE).fetch_add(1, Ordering::SeqCst);
    }

    /// The session's working-directory generation (see [`SLOT_CWD_GEN`]).
    pub fn cwd_gen(&self) -> u64 {
        self.slot(SLOT_CWD_GEN).load(Ordering::SeqCst)
    }

    /// The working-directory generation when no change of a working directory is under way,
    /// `None` while one is (see `settled` below).
    pub fn cwd_settled(&self) -> Option<u64> {
        self.settled(SLOT_CWD_GEN, SLOT_CWD_DONE)
    }

    /// Tells the supervisor that a working directory of the session is about to change.
    pub fn cwd_changing(&self) {
        self.slot(SLOT_CWD_GEN).fetch_add(1, Ordering::SeqCst);
    }

    /// Tells the supervisor that a change [`Self::cwd_changing`] announced has run.
    pub fn cwd_changed(&self) {
        self.slot(SLOT_CWD_DONE).fetch_add(1, Ordering::SeqCst);
    }

    /// A generation counted as changes begun (slot `begun`) and done (slot `done`): its value
    /// when every change begun is done, `None` while one is under way. Whatever is learned
    /// after reading `Some(g)` may be trusted while the generation is still `g`: a change that
    /// begins later moves it, and one under way at the time is refused. (One counter moved
    /// before and after each change cannot tell this: whatever was learned between the two
    /// moves, while the kernel made the change, would be trusted until the second.)
    fn settled(&self, begun: usize, done: usize) -> Option<u64> {
        let g = self.slot(begun).load(Ordering::SeqCst);
        (self.slot(done).load(Ordering::SeqCst) == g).then_some(g)
    }

    /// The marks made in the session so far: the turn directory times are journaled in.
    pub fn marks(&self) -> u64 {
        self.slot(SLOT_MARKS).load(Ordering::SeqCst)
    }

    /// Counts mark `seq`, once its record is written: from then on every process journals a
    /// directory's times again before it next changes its entries, and captures a file the
    /// session made (or copied) before the mark when it next changes it.
    pub fn note_mark(&self, seq: u64) {
        self.slot(SLOT_LAST_MARK).fetch_max(seq, Ordering::SeqCst);
        self.slot(SLOT_MARKS).fetch_add(1, Ordering::SeqCst);
    }

    /// The id of the session's newest mark (0: none).
    pub fn last_mark(&self) -> u64 {
        self.slot(SLOT_LAST_MARK).load(Ordering::SeqCst)
    }

    /// Counts a notification the supervisor received (`passed`: one the shim had journaled).
    pub fn note_notified(&self, passed: bool) {
        self.slot(SLOT_NOTIFIED).fetch_add(1, Ordering::Relaxed);
        if passed {
            self.slot(SLOT_PASSED).fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The notifications the supervisor received, and how many of them were passes.
    pub fn notified(&self) -> (u64, u64) {
        (self.slot(SLOT_NOTIFIED).load(Ordering::Relaxed), self.slot(SLOT_PASSED).load(Ordering::Relaxed))
    }

    /// Notes an exec the supervisor will not see (see [`SLOT_EXECS`]).
    pub fn note_exec(&self) {
        self.slot(SLOT_EXECS).fetch_add(1, Ordering::Release);
    }

    /// The execs noted so far.
    pub fn execs(&self) -> u64 {
        self.slot(SLOT_EXECS).load(Ordering::Acquire)
    }

    /// The last id taken from the session's counter (records and blobs alike).
    pub fn last_id(&self) -> u64 {
        self.slot(SLOT_LAST_ID).load(Ordering::Acquire)
    }

    /// Keeps the supervisor's peak resident memory (KiB), when it ends.
    pub fn note_supervisor_peak(&self, kib: u64) {
        self.slot(SLOT_SUPERVISOR_PEAK_KIB).store(kib, Ordering::Relaxed);
    }

    /// Notes that record `created` journaled the creation of `abs`, which was absent at
    /// `since_ns` (coarse realtime) or later (see [`SLOT_BORN_NAMES`]).
    pub fn note_born_name(&self, abs: &[u8], created: u64, since_ns: i64) {
        let hash = name_hash(abs);
        let at = SLOT_BORN_NAMES + 4 * (hash as usize % BORN_NAMES);
        // When another writer has the entry, this note is not made: it only saves a copy.
        crate::seqlock::write(self.slot(at), || {
            self.slot(at + 1).store(hash, Ordering::Relaxed);
            self.slot(at + 2).store(created, Ordering::Relaxed);
            self.slot(at + 3).store(since_ns as u64, Ordering::Relaxed);
        });
    }

    /// Takes the note for `abs` if there is one: the record that journaled its creation, and
    /// the time from which a file born there can be the one it created. A note is taken once
    /// (whoever takes it puts the file's identity in the born table).
    pub fn take_born_name(&self, abs: &[u8]) -> Option<(u64, i64)> {
        let hash = name_hash(abs);
        let at = SLOT_BORN_NAMES + 4 * (hash as usize % BORN_NAMES);
        let lock = self.slot(at);
        // Most calls end here: no note, or another one.
        if lock.load(Ordering::Acquire) == 0 || self.slot(at + 1).load(Ordering::Relaxed) != hash {
            return None;
        }
        crate::seqlock::write(lock, || {
            (self.slot(at + 1).load(Ordering::Relaxed) == hash).then(|| {
                self.slot(at + 1).store(0, Ordering::Relaxed);
                (self.slot(at + 2).load(Ordering::Relaxed), self.slot(at + 3).load(Ordering::Relaxed) as i64)
            })
        })
        .flatten()
    }

    fn pass_slot(&self, i: usize) -> (&AtomicU64, &AtomicU64) {
        (self.slot(SLOT_PASSES + 2 * i), self.slot(SLOT_PASSES + 2 * i + 1))
    }

    /// Takes a free pass for thread `tid`; `None` when all are taken (the call then reaches
    /// the supervisor, which journals it itself).
    pub fn claim_pass(&self, tid: u32) -> Option<usize> {
        let start = (tid as usize).wrapping_mul(7) % PASSES;
        (0..PASSES).map(|i| (start + i) % PASSES).find(|&i| {
            self.pass_slot(i).0.compare_exchange(0, u64::from(tid), Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })
    }

    /// Takes a free spawn pass for thread `tid` (see
    /// [`aether_journal::internal::counters::SPAWN_PASS`]); `None` when all are taken (the
    /// child's exec then reaches the supervisor, which journals it itself).
    pub fn claim_spawn_pass(&self, tid: u32) -> Option<usize> {
        let word = u64::from(tid) | SPAWN_PASS;
        let start = (tid as usize).wrapping_mul(7) % PASSES;
        (0..PASSES)
            .map(|i| (start + i) % PASSES)
            .find(|&i| self.pass_slot(i).0.compare_exchange(0, word, Ordering::AcqRel, Ordering::Relaxed).is_ok())
    }

    /// The spawn passes held now: each one's slot, holder thread and cookie address (for the
    /// supervisor, which reads the cookie from the memory of the thread making the exec).
    pub fn spawn_passes(&self) -> impl Iterator<Item = (usize, u32, u64)> + '_ {
        (0..PASSES).filter_map(move |i| {
            let (t, a) = self.pass_slot(i);
            let word = t.load(Ordering::Acquire);
            if word & SPAWN_PASS == 0 {
                return None;
            }
            let addr = a.load(Ordering::Acquire);
            (addr != 0).then_some((i, word as u32, addr))
        })
    }

    /// Names where a claimed pass's cookie lives.
    pub fn publish_pass(&self, pass: usize, cookie_addr: u64) {
        self.pass_slot(pass).1.store(cookie_addr, Ordering::Release);
    }

    /// Gives a claimed pass back.
    pub fn release_pass(&self, pass: usize) {
        let (tid, addr) = self.pass_slot(pass);
        addr.store(0, Ordering::Release);
        tid.store(0, Ordering::Release);
    }

    /// The cookie addresses of the passes thread `tid` holds now (for the supervisor, which
    /// then reads the cookie from the thread's own memory).
    pub fn passes_of(&self, tid: u32) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..PASSES).filter_map(move |i| {
            let (t, a) = self.pass_slot(i);
            if t.load(Ordering::Acquire) != u64::from(tid) {
                return None;
            }
            let addr = a.load(Ordering::Acquire);
            (addr != 0).then_some((i, addr))
        })
    }

    /// Drops pass `pass` if it is still thread `tid`'s (the supervisor, for a thread that is
    /// gone: a pass left behind by a killed process).
    pub fn drop_stale_pass(&self, pass: usize, tid: u32) {
        let (t, a) = self.pass_slot(pass);
        if t.load(Ordering::Acquire) == u64::from(tid) {
            a.store(0, Ordering::Release);
            let _ = t.compare_exchange(u64::from(tid), 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

impl Drop for SharedCounters {
    fn drop(&mut self) {
        // SAFETY: `slots` is the start of our own `len`-byte mapping, and nothing refers to it
        // once `self` is dropped (the shim never drops a published one).
        let _ = unsafe { rustix::mm::munmap(self.slots as *mut std::ffi::c_void, self.len) };
    }
}

impl Counters for SharedCounters {
    fn next_id(&self) -> u64 {
        self.slot(SLOT_LAST_ID).fetch_add(1, Ordering::SeqCst) + 1
    }
    fn bytes_kept(&self) -> u64 {
        self.slot(SLOT_BYTES_KEPT).load(Ordering::Relaxed)
    }
    fn add_bytes_kept(&self, n: u64) {
        self.slot(SLOT_BYTES_KEPT).fetch_add(n, Ordering::Relaxed);
    }
}

/// FNV-1a of an absolute path: the key of a name born unseen (a collision costs a copy at
/// most: the birth time and the identity are checked too).
fn name_hash(abs: &[u8]) -> u64 {
    fnv1a(abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_taken_as_the_sessions_without_its_header_only_when_tagged_with_its_id() {
        use aether_journal::session::{Durability, Header, ensure_layout};
        let t = tempfile::tempdir().unwrap();
        let counters = t.path().join("s").join("counters");
        assert!(SharedCounters::open_tagged(&counters, None).is_none(), "no session yet");
        // Counters without a header (a session being made, or made before the tag existed).
        std::fs::create_dir(t.path().join("s")).unwrap();
        drop(SharedCounters::open(&counters).unwrap());
        assert!(SharedCounters::open_tagged(&counters, None).is_none(), "not tagged: the header is read");
        let header = Header::new("id-1".into(), vec![], "/".into(), "test");
        ensure_layout(&t.path().join("s"), &header, Durability::InKernel).unwrap();
        assert!(SharedCounters::open_tagged(&counters, Some(b"id-1")).is_some());
        assert!(SharedCounters::open_tagged(&counters, None).is_some(), "any session's, when none is expected");
        assert!(SharedCounters::open_tagged(&counters, Some(b"id-2")).is_none(), "another session's");
        // A short file is never mapped (touching past its end would be a SIGBUS).
        std::fs::OpenOptions::new().write(true).open(&counters).unwrap().set_len(64).unwrap();
        assert!(SharedCounters::open_tagged(&counters, None).is_none());
    }

    #[test]
    fn a_name_born_unseen_is_taken_once_by_its_path() {
        let t = tempfile::tempdir().unwrap();
        let c = SharedCounters::open(&t.path().join("counters")).unwrap();
        assert_eq!(c.take_born_name(b"/w/a"), None);
        c.note_born_name(b"/w/a", 7, 1_000);
        assert_eq!(c.take_born_name(b"/w/b"), None, "another path");
        assert_eq!(c.take_born_name(b"/w/a"), Some((7, 1_000)));
        assert_eq!(c.take_born_name(b"/w/a"), None, "taken");
    }

    fn vouched(ino: u64) -> Vouched {
        Vouched { dev: 1, ino, size: 3, mtime: [-4, 999_999_999], ctime: [6, 7], uid: 8 }
    }

    #[test]
    fn an_exec_verdict_is_seen_by_every_mapping_of_the_session_for_its_own_name_only() {
        let t = tempfile::tempdir().unwrap();
        let a = SharedCounters::open(&t.path().join("counters")).unwrap();
        let b = SharedCounters::open(&t.path().join("counters")).unwrap();
        assert_eq!(b.remembered_verdict(b"/usr/bin/git"), None, "nothing yet");
        a.remember_verdict(b"/usr/bin/git", &vouched(10));
        assert_eq!(b.remembered_verdict(b"/usr/bin/git"), Some(vouched(10)), "another mapping sees it");
        // Another name in the same entry: its hash's upper half tells it apart.
        let other = (0..100_000u32)
            .map(|i| format!("/usr/bin/p{i}").into_bytes())
            .find(|n| fnv1a(n) % EXEC_VERDICTS as u64 == fnv1a(b"/usr/bin/git") % EXEC_VERDICTS as u64)
            .unwrap();
        assert_eq!(b.remembered_verdict(&other), None, "the entry holds another name's verdict");
        a.remember_verdict(&other, &vouched(11));
        assert_eq!(b.remembered_verdict(&other), Some(vouched(11)));
        assert_eq!(b.remembered_verdict(b"/usr/bin/git"), None, "evicted");
        assert_eq!(b.remembered_verdict(b""), None);
    }

    #[test]
    fn a_counters_file_without_the_verdicts_page_remembers_no_verdict() {
        use aether_journal::session::{Durability, Header, ensure_layout};
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("s");
        ensure_layout(&dir, &Header::new("id-1".into(), vec![], "/".into(), "test"), Durability::InKernel).unwrap();
        // A session made before the second page: one page of counters.
        std::fs::OpenOptions::new().write(true).open(dir.join("counters")).unwrap().set_len(4096).unwrap();
        let c = SharedCounters::open_tagged(&dir.join("counters"), Some(b"id-1")).unwrap();
        c.remember_verdict(b"/usr/bin/git", &vouched(10));
        assert_eq!(c.remembered_verdict(b"/usr/bin/git"), None);
        assert_eq!(c.next_id(), 1, "the counters themselves work");
    }

    #[test]
    fn a_spawn_pass_is_never_taken_for_its_holders_plain_pass_and_is_gone_once_released() {
        let t = tempfile::tempdir().unwrap();
        let a = SharedCounters::open(&t.path().join("counters")).unwrap();
        let b = SharedCounters::open(&t.path().join("counters")).unwrap();
        let plain = a.claim_pass(4242).unwrap();
        a.publish_pass(plain, 0x1000);
        let spawn = a.claim_spawn_pass(4242).unwrap();
        assert_ne!(plain, spawn);
        assert_eq!(b.spawn_passes().count(), 0, "no cookie address yet: not a pass");
        a.publish_pass(spawn, 0x2000);
        assert_eq!(b.spawn_passes().collect::<Vec<_>>(), vec![(spawn, 4242, 0x2000)], "seen through another mapping");
        assert_eq!(b.passes_of(4242).collect::<Vec<_>>(), vec![(plain, 0x1000)], "the plain pass alone");
        a.release_pass(spawn);
        assert_eq!(b.spawn_passes().count(), 0);
        assert_eq!(b.passes_of(4242).count(), 1);
        use aether_journal::internal::counters::{pass_cookie, spawn_pass_cookie};
        assert_ne!(pass_cookie(7, 4242), spawn_pass_cookie(7, 4242));
    }

    #[test]
    fn a_pass_is_found_by_its_thread_only_and_gone_once_released() {
        let t = tempfile::tempdir().unwrap();
        let a = SharedCounters::open(&t.path().join("counters")).unwrap();
        let b = SharedCounters::open(&t.path().join("counters")).unwrap();
        let p = a.claim_pass(4242).unwrap();
        assert_eq!(b.passes_of(4242).count(), 0, "no cookie address yet: not a pass");
        a.publish_pass(p, 0x1000);
        assert_eq!(b.passes_of(4242).collect::<Vec<_>>(), vec![(p, 0x1000)], "seen through another mapping");
        assert_eq!(b.passes_of(4243).count(), 0);
        a.release_pass(p);
        assert_eq!(b.passes_of(4242).count(), 0);
    }

    #[test]
    fn every_pass_can_be_taken_and_one_more_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let c = SharedCounters::open(&t.path().join("counters")).unwrap();
        let taken: Vec<usize> = (0..PASSES as u32).map(|i| c.claim_pass(100 + i).unwrap()).collect();
        assert_eq!(taken.iter().collect::<std::collections::HashSet<_>>().len(), PASSES);
        assert_eq!(c.claim_pass(99_999), None);
        c.drop_stale_pass(taken[0], 100 + taken.iter().position(|&x| x == taken[0]).unwrap() as u32);
        assert!(c.claim_pass(99_999).is_some(), "a stale pass, dropped, is free again");
    }

    #[test]
    fn ids_are_shared_by_every_mapping() {
        let t = tempfile::tempdir().unwrap();
        let a = SharedCounters::open(&t.path().join("counters")).unwrap();
        let b = SharedCounters::open(&t.path().join("counters")).unwrap();
        let x = a.next_id();
        assert_eq!(b.next_id(), x + 1);
    }

    #[test]
    fn the_capture_index_and_the_born_table_live_in_the_counters_file_and_every_mapping_shares_them() {
        use crate::index::Origin;
        use aether_journal::capture::{CaptureIndex, CaptureKey};
        use aether_journal::record::Ident;
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("counters");
        let (a, b) = (SharedCounters::open(&path).unwrap(), SharedCounters::open(&path).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), COUNTERS_TABLES_LEN as u64);
        // SAFETY: the tables are used only while `a` and `b` are alive (this test's scope).
        let (ca, cb, ba, bb) =
            unsafe { (a.captures().unwrap(), b.captures().unwrap(), a.born().unwrap(), b.born().unwrap()) };
        let key = CaptureKey { ident: Ident { dev: 1, ino: 42 }, size: 10, mtime_ns: 5, ctime_ns: 100 };
        ca.remember(&key, 7);
        assert_eq!(cb.find(&key), Some(7), "another process's mapping sees the capture");
        let id = Ident { dev: 3, ino: 77 };
        ba.remember_origin(id, 1_000, Origin::Born(41));
        assert_eq!(bb.origin(id, 1_000), Some(Origin::Born(41)), "and the born file");
        assert_eq!(cb.find(&CaptureKey { ident: id, size: 0, mtime_ns: 1_000, ctime_ns: 0 }), None, "apart");
        assert_eq!(a.next_id(), 1, "the counters are untouched by the tables");
        // Written where the format says: the index after the verdicts' page, the born table after it.
        let bytes = std::fs::read(&path).unwrap();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let in_table = |base: usize, len: usize, v: u64| (base..base + len).step_by(8).any(|at| word(at) == v);
        assert!(in_table(CAPTURES_AT, CAPTURES_LEN, 42) && !in_table(BORN_AT, BORN_LEN, 42));
        assert!(in_table(BORN_AT, BORN_LEN, 77) && !in_table(CAPTURES_AT, CAPTURES_LEN, 77));
    }

    #[test]
    fn a_counters_file_from_before_the_tables_moved_in_has_none_and_is_mapped_as_it_is() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("counters");
        let mut old = vec![0u8; COUNTERS_FILE_LEN];
        old[..8].copy_from_slice(COUNTERS_MAGIC);
        old[SLOT_SESSION * 8..SLOT_SESSION * 8 + 8].copy_from_slice(&1u64.to_le_bytes());
        std::fs::write(&path, &old).unwrap();
        let c = SharedCounters::open_tagged(&path, None).expect("a tagged file of the older length");
        // SAFETY: not used past `c`.
        assert!(unsafe { c.captures().is_none() && c.born().is_none() }, "the tables are in files of their own");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), COUNTERS_FILE_LEN as u64, "not grown by a writer");
    }
}
