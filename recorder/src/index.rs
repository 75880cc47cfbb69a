//! The session's capture index, shared by all its processes: which blob holds which state of a
//! file (see [`aether_journal::capture::CaptureIndex`]), so that a file opened for writing again and
//! again by many short processes (a database every run of a tool opens read-write) is copied
//! once per state, not once per process.
//!
//! The index is the session file `captures` ([`aether_journal::session::CAPTURES_FILE`]), mapped
//! shared: 16384 direct-mapped slots of eight 64-bit words (sequence, device, inode, size,
//! mtime, ctime, blob id). A writer makes a slot's sequence odd while it fills it (taking the
//! slot with a compare-and-swap, skipping it if another writer has it); a reader that sees the
//! sequence odd or changed treats the slot as a miss. A process killed while writing leaves its
//! slot odd for good: that slot is then never used again, which costs copies, never
//! correctness. Every hit is checked by the capture code against the file's state now.
//!
//! A second, smaller table of the same layout (the session file `born`, 2048 slots, see
//! [`SharedIndex::map_born`]) remembers files *born* in the session, created by one of its
//! processes, with the record that created them: nothing such a file holds is needed once
//! that record is undone (which removes it), so another process of the session that
//! truncates or rewrites it (a compiler writing the temporary its driver created, a rebuild
//! overwriting an output an earlier step made) journals a `born` record and copies nothing.
//! It also remembers files an earlier call of the session copied whole (*kept*, with that
//! call's record): once such a file has changed since the copy, a rewrite journals a `kept`
//! record instead of copying it again (undoing that record puts back the state before it).
//! An entry is keyed by device, inode and birth time (`statx` `btime`, nanoseconds), so an
//! inode number reused by a file made outside the session does not match. The table is small
//! on purpose: every process that creates files touches its pages, and they count in that
//! process's resident memory; an evicted entry only costs a copy.
//!
//! What this module cannot do: keep more than one state per slot, or survive the file being
//! replaced (a missing or short file simply disables reuse). A born or kept file deleted
//! outside the session's view and its inode number reused, with the very same birth time, for
//! a file that is not the session's would match; the session's own removals forget the entry.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use aether_journal::capture::{CaptureIndex, CaptureKey};
use aether_journal::record::Ident;
use aether_journal::session::{BORN_LEN, CAPTURES_LEN};

const WORDS: usize = 8;

/// The mapped index.
pub struct SharedIndex {
    slots: *const [AtomicU64; WORDS],
    count: usize,
}

// SAFETY: the mapping is never unmapped and is only accessed through atomics.
unsafe impl Send for SharedIndex {}
// SAFETY: as above.
unsafe impl Sync for SharedIndex {}

impl SharedIndex {
    /// Maps the `captures` file of a session whose counters file does not hold the index
    /// (creating it when an older session lacks it).
    pub fn map(path: &Path) -> Option<SharedIndex> {
        Self::map_len(path, CAPTURES_LEN)
    }

    /// Maps the born table of a session whose counters file does not hold it (`born`,
    /// [`BORN_LEN`] bytes), creating it if needed.
    pub fn map_born(path: &Path) -> Option<SharedIndex> {
        Self::map_len(path, BORN_LEN)
    }

    /// The table of `len` bytes at `base`, inside a mapping of the counters file that holds
    /// the session's tables (see `SharedCounters::captures`).
    ///
    /// # Safety
    /// `base` is 8-byte aligned, `len` bytes from it are mapped shared and only ever accessed
    /// through atomics, and they stay mapped as long as the index is used.
    pub(crate) unsafe fn within(base: *const u8, len: usize) -> SharedIndex {
        SharedIndex { slots: base.cast(), count: len / (WORDS * 8) }
    }

    fn map_len(path: &Path, len: usize) -> Option<SharedIndex> {
        // At least `len` bytes long (ensure_table); only ever accessed through AtomicU64,
        // whose alignment (8) the page-aligned mapping satisfies.
        let f = aether_journal::session::ensure_table(path, len).ok()?;
        let p = crate::tables::map_shared(f.as_fd(), len)?;
        Some(SharedIndex { slots: p.cast(), count: len / (WORDS * 8) })
    }

    fn slot(&self, key: &CaptureKey) -> &[AtomicU64; WORDS] {
        let k =
            (key.ident.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key.ident.dev.rotate_left(23)) as usize % self.count;
        // SAFETY: `k < count`, and the mapping holds `count` slots for the life of the process.
        unsafe { &*self.slots.add(k) }
    }
}

fn words(key: &CaptureKey) -> [u64; 5] {
    [key.ident.dev, key.ident.ino, key.size, key.mtime_ns as u64, key.ctime_ns as u64]
}

/// What `read` makes of slot `s`, if no writer had the slot meanwhile (its sequence even and
/// the same after).
fn read_slot<T>(s: &[AtomicU64; WORDS], read: impl FnOnce(&[AtomicU64; WORDS]) -> Option<T>) -> Option<T> {
    crate::seqlock::read(&s[0], || read(s))
}

/// Runs `fill` on slot `s` while its sequence is odd (readers then treat it as a miss), or
/// does nothing if another writer has it.
fn write_slot(s: &[AtomicU64; WORDS], fill: impl FnOnce(&[AtomicU64; WORDS])) {
    crate::seqlock::write(&s[0], || fill(s));
}

/// The size word of a born entry: no file is this long (sizes are below 2^63), so a born
/// entry never matches a capture key.
const BORN_SIZE: u64 = u64::MAX;
/// The blob word of a born entry (blob ids are small counters).
const BORN_ID: u64 = u64::MAX;
/// The blob word of a kept entry.
const KEPT_ID: u64 = u64::MAX - 1;

/// Why a file's earlier contents need no capture, and the record that makes that so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The session created it (this record); undoing that removes it.
    Born(u64),
    /// This record kept its whole state from before the session (a copy); undoing that
    /// puts the state back.
    Kept(u64),
}

/// The slot key of a born entry: the birth time stands where a state's mtime does, and the
/// record that created the file where its ctime does.
fn born_key(ident: Ident, btime_ns: i64, created: u64) -> CaptureKey {
    CaptureKey { ident, size: BORN_SIZE, mtime_ns: btime_ns, ctime_ns: created as i64 }
}

impl SharedIndex {
    /// Remembers why the file `ident`, born at `btime_ns`, needs no capture.
    pub fn remember_origin(&self, ident: Ident, btime_ns: i64, origin: Origin) {
        let (seq, id) = match origin {
            Origin::Born(seq) => (seq, BORN_ID),
            Origin::Kept(seq) => (seq, KEPT_ID),
        };
        self.remember(&born_key(ident, btime_ns, seq), id);
    }

    /// Why the file `ident` born at `btime_ns` needs no capture, if the session knows.
    pub fn origin(&self, ident: Ident, btime_ns: i64) -> Option<Origin> {
        read_slot(self.slot(&born_key(ident, btime_ns, 0)), |s| {
            let want = [ident.dev, ident.ino, BORN_SIZE, btime_ns as u64];
            let matches = want.iter().zip(&s[1..5]).all(|(w, a)| a.load(Ordering::Relaxed) == *w);
            let seq = s[5].load(Ordering::Relaxed);
            match s[6].load(Ordering::Relaxed) {
                BORN_ID if matches => Some(Origin::Born(seq)),
                KEPT_ID if matches => Some(Origin::Kept(seq)),
                _ => None,
            }
        })
    }

    /// Whether any born entry names `ident` (then ask `statx` for its birth time).
    pub fn may_be_born(&self, ident: Ident) -> bool {
        let s = self.slot(&born_key(ident, 0, 0));
        s[1].load(Ordering::Relaxed) == ident.dev
            && s[2].load(Ordering::Relaxed) == ident.ino
            && s[3].load(Ordering::Relaxed) == BORN_SIZE
    }

    /// Forgets a born entry for `ident` (the session is removing the file: its inode number
    /// may be reused by a file that is not the session's).
    pub fn forget_born(&self, ident: Ident) {
        if !self.may_be_born(ident) {
            return;
        }
        write_slot(self.slot(&born_key(ident, 0, 0)), |s| {
            if s[1].load(Ordering::Relaxed) == ident.dev && s[2].load(Ordering::Relaxed) == ident.ino {
                s[3].store(0, Ordering::Relaxed);
                s[6].store(0, Ordering::Relaxed);
            }
        });
    }
}

impl CaptureIndex for SharedIndex {
    fn find(&self, key: &CaptureKey) -> Option<u64> {
        read_slot(self.slot(key), |s| {
            let matches = words(key).iter().zip(&s[1..6]).all(|(w, a)| a.load(Ordering::Relaxed) == *w);
            let id = s[6].load(Ordering::Relaxed);
            (matches && id != 0).then_some(id)
        })
    }

    fn remember(&self, key: &CaptureKey, id: u64) {
        write_slot(self.slot(key), |s| {
            for (w, a) in words(key).iter().zip(&s[1..6]) {
                a.store(*w, Ordering::Relaxed);
            }
            s[6].store(id, Ordering::Relaxed);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64, ctime_ns: i64) -> CaptureKey {
        CaptureKey { ident: Ident { dev: 1, ino }, size: 10, mtime_ns: 5, ctime_ns }
    }

    /// Two mappings of one index file, as two processes of a session have.
    fn two_mappings(t: &tempfile::TempDir) -> (SharedIndex, SharedIndex) {
        let path = t.path().join("captures");
        (SharedIndex::map(&path).unwrap(), SharedIndex::map(&path).unwrap())
    }

    #[test]
    fn a_state_is_found_by_every_mapping_of_the_file_and_a_changed_state_is_not() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = two_mappings(&t);
        a.remember(&key(42, 100), 7);
        assert_eq!(b.find(&key(42, 100)), Some(7), "another process's mapping sees it");
        assert_eq!(b.find(&key(42, 101)), None, "the file changed since (ctime moved)");
        assert_eq!(b.find(&key(43, 100)), None);
    }

    #[test]
    fn a_born_file_is_known_to_every_mapping_by_inode_and_birth_time_and_never_as_a_capture() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("born");
        let (a, b) = (SharedIndex::map_born(&path).unwrap(), SharedIndex::map_born(&path).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), BORN_LEN as u64);
        let id = Ident { dev: 3, ino: 77 };
        a.remember_origin(id, 1_000_000_123, Origin::Born(41));
        assert!(b.may_be_born(id), "another process's mapping sees it");
        assert_eq!(b.origin(id, 1_000_000_123), Some(Origin::Born(41)), "with the record that created it");
        assert_eq!(b.origin(id, 1_000_000_124), None, "an inode number reused later has another birth time");
        assert_eq!(b.origin(Ident { dev: 4, ino: 77 }, 1_000_000_123), None, "another device");
        b.remember_origin(id, 1_000_000_123, Origin::Kept(52));
        assert_eq!(a.origin(id, 1_000_000_123), Some(Origin::Kept(52)), "kept by a copy, and by which record");
        let as_capture = CaptureKey { ident: id, size: 0, mtime_ns: 1_000_000_123, ctime_ns: 0 };
        assert_eq!(b.find(&as_capture), None, "a born entry is never a blob");
        b.forget_born(id);
        assert!(!a.may_be_born(id) && a.origin(id, 1_000_000_123).is_none(), "forgotten for every mapping");
    }

    #[test]
    fn forgetting_a_born_file_leaves_a_capture_in_the_same_slot_alone() {
        let t = tempfile::tempdir().unwrap();
        let a = SharedIndex::map(&t.path().join("captures")).unwrap();
        a.remember(&key(42, 100), 7);
        a.forget_born(Ident { dev: 1, ino: 42 });
        assert_eq!(a.find(&key(42, 100)), Some(7));
    }
}
