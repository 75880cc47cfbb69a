//! Programs this process has found observable before an exec, by the name it exec'd them by,
//! with what that verdict rests on ([`Vouched`]): a process that starts the same program again
//! (a Python harness's `subprocess.run`, `make`'s recipes through `posix_spawn`) then pays one
//! `stat` and a `getuid` for the check instead of opening the program and reading its headers
//! (`open`, `fstat`, `getuid`, two `pread`s, `close`, and the parsing).
//!
//! A remembered verdict is never trusted on its own: the caller takes it only if the name
//! leads to a file with the very identity, size, times and uid the check vouched for (any
//! change to the program moves its change time). The table can make a check cheaper, never
//! different.
//!
//! Two levels. This process's own table, lock-free like the directory caches
//! ([`crate::dircache`]): a vfork child's exec hook writes into its parent's memory, which is
//! how the parent learns what its children checked, and a fork inherits what its parent knew
//! (16 direct-mapped slots of names up to 248 bytes, each guarded by a sequence counter). And
//! the session's exec verdicts, in the second page of its counters file (see
//! `SharedCounters::remembered_verdict`), which every process of the session reads and
//! writes: a shell that forks before each exec checks in the child, whose memory is gone at the
//! exec, so without them every command a shell runs was checked again.
//!
//! What this module cannot do: help a session whose counters file has no second page (made
//! before it): its processes remember in their own table only.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use aether_journal_recorder::seqlock;
use aether_journal_recorder::tables::SharedCounters;
use journal_core::exec_check::Vouched;

const SLOTS: usize = 16;
const WORDS: usize = 31;
/// Longest name kept (bytes).
const MAX_NAME: usize = WORDS * 8;

pub(crate) struct Slot {
    seq: AtomicU64,
    len: AtomicU64,
    words: [AtomicU64; WORDS],
    /// dev, ino, size, mtime (s, ns), ctime (s, ns), uid.
    vouched: [AtomicU64; 8],
}

/// The table, in the memory the shim maps on demand ([`crate::lazymap`]).
pub(crate) type Table = [Slot; SLOTS];

/// Set before the first verdict is written: until then the table (5 KiB over two pages, which
/// a process that never spawned anything has not touched) is not read at all.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static ANY: AtomicBool = AtomicBool::new(false);

#[expect(clippy::indexing_slicing, reason = "the index is taken modulo the table's length")]
fn slot(table: &'static Table, name: &[u8]) -> &'static Slot {
    &table[crate::dircache::path_hash(name) % SLOTS]
}

fn to_words(v: &Vouched) -> [u64; 8] {
    [v.dev, v.ino, v.size, v.mtime[0] as u64, v.mtime[1] as u64, v.ctime[0] as u64, v.ctime[1] as u64, u64::from(v.uid)]
}

fn from_words(w: [u64; 8]) -> Vouched {
    let [dev, ino, size, ms, mns, cs, cns, uid] = w;
    Vouched { dev, ino, size, mtime: [ms as i64, mns as i64], ctime: [cs as i64, cns as i64], uid: uid as u32 }
}

/// What the check of the program `name` last vouched for, if its slot still holds it.
fn remembered(name: &[u8]) -> Option<Vouched> {
    // A table this process never made holds nothing.
    let s = slot(&crate::lazymap::tables_made()?.execs, name);
    seqlock::read(&s.seq, || {
        if s.len.load(Ordering::Relaxed) as usize != name.len() || name.is_empty() {
            return None;
        }
        let same = s.words.iter().zip(name.chunks(8)).all(|(w, chunk)| {
            let mut b = [0u8; 8];
            for (to, from) in b.iter_mut().zip(chunk) {
                *to = *from;
            }
            w.load(Ordering::Relaxed) == u64::from_le_bytes(b)
        });
        let mut v = [0u64; 8];
        for (to, from) in v.iter_mut().zip(&s.vouched) {
            *to = from.load(Ordering::Relaxed);
        }
        same.then(|| from_words(v))
    })
}

/// Whether the program `name` is the very file a check of this process, or else of any
/// process of the session (`session`'s verdicts), vouched for, for the caller's real uid now:
/// then it is observable without a check. A `stat` and a `getuid` when the name is remembered,
/// nothing otherwise.
pub fn still_vouched(name: &[u8], session: &SharedCounters) -> bool {
    let own = if ANY.load(Ordering::Acquire) { remembered(name) } else { None };
    let Some(v) = own.or_else(|| session.remembered_verdict(name)) else { return false };
    Vouched::now(name, rustix::process::getuid().as_raw()) == Some(v)
}

/// Remembers that a check of the program `name` vouched for `v`: for the session (in
/// `session`'s verdicts), and, with `own`, in this process's table (where its memory outlives
/// the exec: a spawning parent's, a `vfork` child's). Each evicts whatever shared its slot.
pub fn remember(name: &[u8], v: &Vouched, own: bool, session: &SharedCounters) {
    session.remember_verdict(name, v);
    if own {
        remember_own(name, v);
    }
}

/// Remembers `v` for `name` in this process's table.
fn remember_own(name: &[u8], v: &Vouched) {
    if name.is_empty() || name.len() > MAX_NAME {
        return;
    }
    // Without the table (no memory for it) nothing is remembered: the next exec checks again.
    let Some(tables) = crate::lazymap::tables() else { return };
    ANY.store(true, Ordering::Release);
    let s = slot(&tables.execs, name);
    // When another thread is filling this slot, the verdict is not remembered this time.
    seqlock::write(&s.seq, || {
        s.len.store(name.len() as u64, Ordering::Relaxed);
        crate::dircache::store_words(&s.words, name.chunks(8));
        for (to, from) in s.vouched.iter().zip(to_words(v)) {
            to.store(from, Ordering::Relaxed);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vouched(ino: u64) -> Vouched {
        Vouched { dev: 1, ino, size: 3, mtime: [4, 5], ctime: [-6, 7], uid: 8 }
    }

    #[test]
    fn a_remembered_verdict_is_returned_for_its_own_name_only() {
        remember_own(b"/usr/bin/memo-test-a", &vouched(10));
        assert_eq!(remembered(b"/usr/bin/memo-test-a"), Some(vouched(10)));
        assert_eq!(remembered(b"/usr/bin/memo-test-"), None, "a prefix");
        assert_eq!(remembered(b"/usr/bin/memo-test-ab"), None, "a longer name");
        // A name of exactly eight bytes and one of nine share their first word.
        remember_own(b"12345678", &vouched(11));
        assert_eq!(remembered(b"12345678"), Some(vouched(11)));
        assert_eq!(remembered(b"123456789"), None);
    }

    #[test]
    fn empty_and_overlong_names_are_not_remembered() {
        remember_own(b"", &vouched(1));
        assert_eq!(remembered(b""), None);
        let long = vec![b'x'; MAX_NAME + 1];
        remember_own(&long, &vouched(2));
        assert_eq!(remembered(&long), None);
    }

    #[test]
    fn a_file_is_still_vouched_for_only_while_nothing_about_it_changed() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let session = SharedCounters::open(&t.path().join("counters")).unwrap();
        let other_session = SharedCounters::open(&t.path().join("counters-2")).unwrap();
        // Remembered by this process and the session, and by the session alone (as a shell's
        // forked child, whose memory is gone at its exec, remembers).
        for (own, prog) in [(true, "own"), (false, "shared")] {
            let p = t.path().join(prog);
            std::fs::copy("/bin/true", &p).unwrap();
            let name = p.as_os_str().as_bytes();
            assert!(!still_vouched(name, &session), "never checked ({prog})");
            let uid = rustix::process::getuid().as_raw();
            remember(name, &Vouched::now(name, uid).unwrap(), own, &session);
            assert!(still_vouched(name, &session), "{prog}");
            assert_eq!(still_vouched(name, &other_session), own, "{prog}: in this process's own table");
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::fs::write(&p, b"#!/bin/sh\n").unwrap();
            assert!(!still_vouched(name, &session), "rewritten since ({prog})");
        }
    }
}
