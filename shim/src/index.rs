//! The session's capture index, shared by all its processes: which blob holds which state of a
//! file (see [`journal::capture::CaptureIndex`]), so that a file opened for writing again and
//! again by many short processes (a database every run of a tool opens read-write) is copied
//! once per state, not once per process.
//!
//! The index is the session file `captures` ([`journal::session::CAPTURES_FILE`]), mapped
//! shared: 16384 direct-mapped slots of eight 64-bit words (sequence, device, inode, size,
//! mtime, ctime, blob id). A writer makes a slot's sequence odd while it fills it (taking the
//! slot with a compare-and-swap, skipping it if another writer has it); a reader that sees the
//! sequence odd or changed treats the slot as a miss. A process killed while writing leaves its
//! slot odd for good: that slot is then never used again, which costs copies, never
//! correctness. Every hit is checked by the capture code against the file's state now.
//!
//! What this module cannot do: keep more than one state per slot, or survive the file being
//! replaced (a missing or short file simply disables reuse).

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use journal::capture::{CaptureIndex, CaptureKey};
use journal::session::CAPTURES_LEN;

const WORDS: usize = 8;
const SLOTS: usize = CAPTURES_LEN / (WORDS * 8);

/// The mapped index.
pub struct SharedIndex {
    slots: *const [AtomicU64; WORDS],
}

// SAFETY: the mapping is never unmapped and is only accessed through atomics.
unsafe impl Send for SharedIndex {}
// SAFETY: as above.
unsafe impl Sync for SharedIndex {}

impl SharedIndex {
    /// Maps the session's `captures` file (creating it when an older session lacks it).
    pub fn map(path: &Path) -> Option<SharedIndex> {
        // At least CAPTURES_LEN bytes long (ensure_captures); only ever accessed through
        // AtomicU64, whose alignment (8) the page-aligned mapping satisfies.
        let f = journal::session::ensure_captures(path).ok()?;
        let p = crate::state::map_shared(f.as_fd(), CAPTURES_LEN)?;
        Some(SharedIndex { slots: p.cast() })
    }

    fn slot(&self, key: &CaptureKey) -> &[AtomicU64; WORDS] {
        let k = (key.ident.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key.ident.dev.rotate_left(23)) as usize % SLOTS;
        // SAFETY: `k < SLOTS`, and the mapping holds SLOTS slots for the life of the process.
        unsafe { &*self.slots.add(k) }
    }
}

fn words(key: &CaptureKey) -> [u64; 5] {
    [key.ident.dev, key.ident.ino, key.size, key.mtime_ns as u64, key.ctime_ns as u64]
}

impl CaptureIndex for SharedIndex {
    fn find(&self, key: &CaptureKey) -> Option<u64> {
        let s = self.slot(key);
        let before = s[0].load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let want = words(key);
        let matches = want.iter().zip(&s[1..6]).all(|(w, a)| a.load(Ordering::Relaxed) == *w);
        let id = s[6].load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        (matches && id != 0 && s[0].load(Ordering::Relaxed) == before).then_some(id)
    }

    fn remember(&self, key: &CaptureKey, id: u64) {
        let s = self.slot(key);
        let cur = s[0].load(Ordering::Acquire);
        if cur & 1 == 1 || s[0].compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        std::sync::atomic::fence(Ordering::Release);
        for (w, a) in words(key).iter().zip(&s[1..6]) {
            a.store(*w, Ordering::Relaxed);
        }
        s[6].store(id, Ordering::Relaxed);
        s[0].store(cur + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal::record::Ident;

    fn key(ino: u64, ctime_ns: i64) -> CaptureKey {
        CaptureKey { ident: Ident { dev: 1, ino }, size: 10, mtime_ns: 5, ctime_ns }
    }

    #[test]
    fn a_state_is_found_by_every_mapping_of_the_file_and_a_changed_state_is_not() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("captures");
        let a = SharedIndex::map(&path).unwrap();
        let b = SharedIndex::map(&path).unwrap();
        a.remember(&key(42, 100), 7);
        assert_eq!(b.find(&key(42, 100)), Some(7), "another process's mapping sees it");
        assert_eq!(b.find(&key(42, 101)), None, "the file changed since (ctime moved)");
        assert_eq!(b.find(&key(43, 100)), None);
    }
}
