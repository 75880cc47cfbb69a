//! Canonical names of the directories this process has recently changed things in, by identity
//! (device, inode), so that naming the parent of a target costs one `stat` instead of opening
//! it and reading its name back from `/proc/self/fd` (getcwd, open, readlink, close).
//!
//! A hit is never trusted on its own: the caller stats the cached name and uses it only if it
//! still leads to the same directory (see [`crate::ops`]). A directory renamed or replaced
//! since, by this process or any other, therefore fails the check and is resolved the slow way
//! again; the cache can make a resolution cheaper, never different.
//!
//! Lock-free (no lock can be caught by `fork`), direct-mapped: 256 slots of names up to 248
//! bytes, each slot guarded by a sequence counter that a writer makes odd while it fills the
//! slot; a reader that sees the counter odd or changed treats the slot as a miss. Longer names
//! are simply not cached.
//!
//! What this module cannot do: keep more than 256 directories, or notice anything by itself:
//! correctness rests on the caller's check.

use std::sync::atomic::{AtomicU64, Ordering};

use journal::record::Ident;

const SLOTS: usize = 256;
const WORDS: usize = 31;
/// Longest name kept (bytes).
pub const MAX_NAME: usize = WORDS * 8;

struct Slot {
    seq: AtomicU64,
    dev: AtomicU64,
    ino: AtomicU64,
    len: AtomicU64,
    words: [AtomicU64; WORDS],
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        seq: AtomicU64::new(0),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
        len: AtomicU64::new(0),
        words: [const { AtomicU64::new(0) }; WORDS],
    }
}; SLOTS];

fn slot(id: Ident) -> &'static Slot {
    &TABLE[(id.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id.dev.rotate_left(17)) as usize % SLOTS]
}

/// The name last recorded for directory `id`, if its slot still holds it.
pub fn get(id: Ident) -> Option<Vec<u8>> {
    let s = slot(id);
    let before = s.seq.load(Ordering::Acquire);
    if before & 1 == 1 || s.ino.load(Ordering::Relaxed) != id.ino || s.dev.load(Ordering::Relaxed) != id.dev {
        return None;
    }
    let len = s.len.load(Ordering::Relaxed) as usize;
    if len == 0 || len > MAX_NAME {
        return None;
    }
    let mut out = Vec::with_capacity(len);
    for w in &s.words[..len.div_ceil(8)] {
        out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    out.truncate(len);
    std::sync::atomic::fence(Ordering::Acquire);
    (s.seq.load(Ordering::Relaxed) == before).then_some(out)
}

/// Records `name` as the canonical name of directory `id` (evicting whatever shared its slot).
pub fn put(id: Ident, name: &[u8]) {
    // Only a canonical name is worth keeping: absolute, and not a removed directory's
    // `/proc/self/fd` name.
    if name.first() != Some(&b'/') || name.ends_with(b" (deleted)") || name.len() > MAX_NAME {
        return;
    }
    let s = slot(id);
    let cur = s.seq.load(Ordering::Acquire);
    if cur & 1 == 1 || s.seq.compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return; // another thread is filling this slot: not cached this time
    }
    std::sync::atomic::fence(Ordering::Release);
    s.dev.store(id.dev, Ordering::Relaxed);
    s.ino.store(id.ino, Ordering::Relaxed);
    s.len.store(name.len() as u64, Ordering::Relaxed);
    for (w, chunk) in s.words.iter().zip(name.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    s.seq.store(cur + 2, Ordering::Release);
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
