//! Canonical names of the directories this process has recently changed things in, by identity
//! (device, inode), so that naming the parent of a target costs one `stat` instead of opening
//! it and reading its name back from `/proc/self/fd` (getcwd, open, readlink, close).
//!
//! A hit in this table is never trusted on its own: the caller stats the cached name and uses it only if it
//! still leads to the same directory (see [`crate::ops`]). A directory renamed or replaced
//! since, by this process or any other, therefore fails the check and is resolved the slow way
//! again; this table can make a resolution cheaper, never different.
//!
//! Lock-free (no lock can be caught by `fork`), direct-mapped: 256 slots of names up to 248
//! bytes, each slot guarded by a sequence counter that a writer makes odd while it fills the
//! slot; a reader that sees the counter odd or changed treats the slot as a miss. Longer names
//! are simply not cached.
//!
//! A second table remembers directory *paths* as a caller wrote them (`src/deep`, absolute or
//! relative to the working directory) with the canonical name they led to, so that the next
//! file made there costs no system call at all. Such an entry is trusted only while three
//! things hold: no process of the session has renamed or removed a directory or a symlink
//! since and none is doing so (the session's names generation, in its shared `counters`, moved
//! before each such call, and the changes done, counted after it), this process has not
//! changed its working directory or root (a local generation, told by the chdir, fchdir and
//! chroot hooks), and it was looked at less than [`TRUST_NS`] ago. 64 slots, the same
//! sequence-counter scheme.
//!
//! What this module cannot do: keep more than 256 directories, or notice anything by itself:
//! correctness rests on the caller's check. A directory path moved by a process outside the
//! session (or by a mount) is noticed only once its entry is [`TRUST_NS`] old: a file made
//! there within that time is journaled under the old name.

use std::sync::atomic::{AtomicU64, Ordering};

use aether_journal_recorder::seqlock;
use journal_core::record::Ident;

const SLOTS: usize = 256;
const WORDS: usize = 31;
/// Longest name kept (bytes).
pub const MAX_NAME: usize = WORDS * 8;

pub(crate) struct Slot {
    seq: AtomicU64,
    dev: AtomicU64,
    ino: AtomicU64,
    len: AtomicU64,
    words: [AtomicU64; WORDS],
}

/// The names table, in the memory the shim maps on demand ([`crate::lazymap`]).
pub(crate) type Table = [Slot; SLOTS];

#[expect(clippy::indexing_slicing, reason = "the index is taken modulo the table's length")]
fn slot(table: &'static Table, id: Ident) -> &'static Slot {
    &table[(id.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id.dev.rotate_left(17)) as usize % SLOTS]
}

/// The name last recorded for directory `id`, if its slot still holds it.
pub fn get(id: Ident) -> Option<Vec<u8>> {
    // A table this process never made holds nothing.
    let s = slot(&crate::lazymap::tables_made()?.dirs, id);
    seqlock::read(&s.seq, || {
        if s.ino.load(Ordering::Relaxed) != id.ino || s.dev.load(Ordering::Relaxed) != id.dev {
            return None;
        }
        let len = s.len.load(Ordering::Relaxed) as usize;
        let words = s.words.get(..len.div_ceil(8)).filter(|_| len != 0)?;
        let mut out = Vec::with_capacity(len);
        for w in words {
            out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out.truncate(len);
        Some(out)
    })
}

/// Records `name` as the canonical name of directory `id` (evicting whatever shared its slot).
pub fn put(id: Ident, name: &[u8]) {
    // Only a canonical name is worth keeping: absolute, and not a removed directory's
    // `/proc/self/fd` name.
    if name.first() != Some(&b'/') || name.ends_with(b" (deleted)") || name.len() > MAX_NAME {
        return;
    }
    // Without the table (no memory for it) nothing is cached.
    let Some(tables) = crate::lazymap::tables() else { return };
    let s = slot(&tables.dirs, id);
    // When another thread is filling this slot, the name is not cached this time.
    seqlock::write(&s.seq, || {
        s.dev.store(id.dev, Ordering::Relaxed);
        s.ino.store(id.ino, Ordering::Relaxed);
        s.len.store(name.len() as u64, Ordering::Relaxed);
        store_words(&s.words, name.chunks(8));
    });
}

/// Stores `chunks` (eight bytes each, the last perhaps fewer) in `words`, little-endian.
pub(crate) fn store_words<'a>(words: &[AtomicU64], chunks: impl Iterator<Item = &'a [u8]>) {
    for (w, chunk) in words.iter().zip(chunks) {
        let mut b = [0u8; 8];
        for (to, from) in b.iter_mut().zip(chunk) {
            *to = *from;
        }
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

/// How long a remembered directory path is trusted without looking at it again, against
/// changes made outside the session (the session's own renames and removals are seen through
/// the shared generation at once): 10 ms of `CLOCK_MONOTONIC_COARSE`.
pub const TRUST_NS: u64 = aether_journal_recorder::ops::PATH_TRUST_NS;

const PATH_SLOTS: usize = 64;
const PATH_WORDS: usize = 48;
/// Longest directory path plus canonical name a path slot holds (bytes).
const PATH_BYTES: usize = PATH_WORDS * 8;

/// One remembered directory path: the bytes the caller wrote (`key`), then the canonical
/// name they led to, the generations it was checked under and when.
pub(crate) struct PathSlot {
    seq: AtomicU64,
    shared_gen: AtomicU64,
    local_gen: AtomicU64,
    stamp: AtomicU64,
    key_len: AtomicU64,
    name_len: AtomicU64,
    words: [AtomicU64; PATH_WORDS],
}

/// The paths table, in the memory the shim maps on demand ([`crate::lazymap`]).
pub(crate) type Paths = [PathSlot; PATH_SLOTS];

/// Bumped whenever this process's relative paths may start leading elsewhere (chdir, fchdir,
/// chroot): every remembered path is then stale.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static LOCAL_GEN: AtomicU64 = AtomicU64::new(0);

/// This process changed its working directory or root: forget every remembered path.
pub fn cwd_changed() {
    LOCAL_GEN.fetch_add(1, Ordering::SeqCst);
}

/// The process-local generation remembered paths are checked under.
pub fn local_gen() -> u64 {
    LOCAL_GEN.load(Ordering::SeqCst)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds, through libc's `clock_gettime` (the vDSO: no system
/// call). Not rustix's: its first clock call in a process parses the vDSO's ELF image to find
/// the function glibc found already at start-up: about 2.2 us in a fresh process here, against
/// 0.07 us for libc's, in every process that journals a path. rustix's is the fallback should
/// libc's fail.
pub fn coarse_now() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, at the address of `t`, which lives for the
    // call; it is async-signal-safe and takes no lock.
    let (secs, nanos) = if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut t) } == 0 {
        (t.tv_sec, t.tv_nsec)
    } else {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
        (t.tv_sec, t.tv_nsec)
    };
    (secs as u64).wrapping_mul(1_000_000_000).wrapping_add(nanos as u64)
}

/// A hash of a short path for a direct-mapped table (FNV-1a, folded): a collision only costs a
/// miss.
pub(crate) fn path_hash(key: &[u8]) -> usize {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    (h ^ (h >> 29)) as usize
}

#[expect(clippy::indexing_slicing, reason = "the index is taken modulo the table's length")]
fn path_slot(paths: &'static Paths, key: &[u8]) -> &'static PathSlot {
    &paths[path_hash(key) % PATH_SLOTS]
}

/// The canonical name directory path `key` (as a caller wrote it: absolute, or relative to
/// the working directory) was last seen to lead to, if that was under the same generations
/// and less than [`TRUST_NS`] before `now`.
pub fn path_get(key: &[u8], shared_gen: u64, local_gen: u64, now: u64) -> Option<Vec<u8>> {
    let s = path_slot(&crate::lazymap::tables_made()?.paths, key);
    let mut bytes = seqlock::read(&s.seq, || {
        if s.shared_gen.load(Ordering::Relaxed) != shared_gen
            || s.local_gen.load(Ordering::Relaxed) != local_gen
            || now.wrapping_sub(s.stamp.load(Ordering::Relaxed)) > TRUST_NS
            || s.key_len.load(Ordering::Relaxed) as usize != key.len()
        {
            return None;
        }
        let name_len = s.name_len.load(Ordering::Relaxed) as usize;
        let total = key.len() + name_len;
        let words = s.words.get(..total.div_ceil(8)).filter(|_| name_len != 0)?;
        let mut bytes = Vec::with_capacity(total.next_multiple_of(8));
        for w in words {
            bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        bytes.truncate(total);
        Some(bytes)
    })?;
    if !bytes.starts_with(key) {
        return None;
    }
    bytes.drain(..key.len());
    Some(bytes)
}

/// Remembers that directory path `key` led to canonical `name` when checked under these
/// generations at `now` (taken before the check).
pub fn path_put(key: &[u8], name: &[u8], shared_gen: u64, local_gen: u64, now: u64) {
    let total = key.len() + name.len();
    if name.first() != Some(&b'/') || total > PATH_BYTES {
        return;
    }
    let Some(tables) = crate::lazymap::tables() else { return };
    let s = path_slot(&tables.paths, key);
    seqlock::write(&s.seq, || {
        s.shared_gen.store(shared_gen, Ordering::Relaxed);
        s.local_gen.store(local_gen, Ordering::Relaxed);
        s.stamp.store(now, Ordering::Relaxed);
        s.key_len.store(key.len() as u64, Ordering::Relaxed);
        s.name_len.store(name.len() as u64, Ordering::Relaxed);
        let mut joined = [0u8; PATH_BYTES];
        for (to, from) in joined.iter_mut().zip(key.iter().chain(name)) {
            *to = *from;
        }
        store_words(&s.words, joined.chunks(8).take(total.div_ceil(8)));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_name_is_returned_for_its_directory_only() {
        let a = Ident { dev: 5, ino: 777 };
        assert_eq!(get(a), None);
        put(a, b"/home/user/project/src/deep/er");
        assert_eq!(get(a).as_deref(), Some(&b"/home/user/project/src/deep/er"[..]));
        assert_eq!(get(Ident { dev: 6, ino: 777 }), None);
        put(a, b"/x");
        assert_eq!(get(a).as_deref(), Some(&b"/x"[..]), "a shorter name replaces a longer one whole");
    }

    #[test]
    fn relative_and_deleted_names_are_not_cached() {
        let a = Ident { dev: 5, ino: 779 };
        put(a, b"relative/dir");
        assert_eq!(get(a), None);
        put(a, b"/gone/dir (deleted)");
        assert_eq!(get(a), None);
    }

    #[test]
    fn names_too_long_to_keep_are_not_cached() {
        let a = Ident { dev: 5, ino: 778 };
        put(a, &[&b"/"[..], &vec![b'a'; MAX_NAME]].concat());
        assert_eq!(get(a), None);
        let exact = [&b"/"[..], &vec![b'b'; MAX_NAME - 1]].concat();
        put(a, &exact);
        assert_eq!(get(a), Some(exact));
    }

    #[test]
    fn a_remembered_path_is_trusted_only_under_the_same_generations_and_while_fresh() {
        let (key, name) = (&b"src/deep"[..], &b"/home/u/project/src/deep"[..]);
        path_put(key, name, 7, 3, 1_000);
        assert_eq!(path_get(key, 7, 3, 1_000 + TRUST_NS).as_deref(), Some(name));
        assert_eq!(path_get(key, 8, 3, 1_001), None, "a rename or removal in the session since");
        assert_eq!(path_get(key, 7, 4, 1_001), None, "a chdir in this process since");
        assert_eq!(path_get(key, 7, 3, 1_001 + TRUST_NS), None, "looked at too long ago");
        assert_eq!(path_get(b"src/deeper", 7, 3, 1_001), None, "another path");
        path_put(b"rel", b"not/canonical", 7, 3, 1_000);
        assert_eq!(path_get(b"rel", 7, 3, 1_000), None, "only canonical names are kept");
        let long = vec![b'/'; PATH_BYTES];
        path_put(b"k", &long, 7, 3, 1_000);
        assert_eq!(path_get(b"k", 7, 3, 1_000), None, "too long to keep");
    }

    #[test]
    fn the_freshness_clock_is_the_coarse_monotonic_clock_in_nanoseconds() {
        let ns = |t: rustix::time::Timespec| (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64;
        let before = ns(rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse));
        let now = coarse_now();
        let after = ns(rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse));
        assert!(before <= now && now <= after, "{before} <= {now} <= {after}");
    }

    #[test]
    fn concurrent_writers_never_produce_a_torn_name() {
        let id = Ident { dev: 9, ino: 4242 };
        let names: Vec<Vec<u8>> = (0..4).map(|i| format!("/dir-{i}/{}", "x".repeat(40 * i)).into_bytes()).collect();
        std::thread::scope(|sc| {
            for n in &names {
                sc.spawn(move || {
                    for _ in 0..20_000 {
                        put(id, n);
                    }
                });
            }
            sc.spawn(|| {
                for _ in 0..50_000 {
                    if let Some(got) = get(id) {
                        assert!(names.contains(&got), "torn: {}", String::from_utf8_lossy(&got));
                    }
                }
            });
        });
    }
}
