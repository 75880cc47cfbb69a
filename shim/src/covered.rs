//! Inodes whose whole state this process has already journaled: files it created during the
//! session (undo removes them) and files whose bytes and metadata it copied. A later change to
//! such an inode through a descriptor (fchmod, fchown, futimens, fsetxattr, ftruncate,
//! fallocate) needs no record of its own: undo already puts the whole inode back or removes
//! it. This is what keeps `tar x` at one record per file instead of four.
//!
//! A lock-free, direct-mapped cache (no lock can be caught by `fork`): 16384 (dev, ino) slots,
//! a newer entry evicting an older one in its slot. The pattern it serves is local in time
//! (create, write, fchown, fchmod, futimens, close), and a miss, or an evicted entry, only
//! costs a redundant capture, never a missing one. Writers reserve a slot before filling it;
//! readers check the slot twice around reading the device, so a half-written slot never
//! matches.
//!
//! What this module cannot do: notice an inode number reused within the process's lifetime. An
//! inode captured here stays alive in the store while the session is open (a removal links it
//! there), except when it was captured by copy across file systems and then removed.

use std::sync::atomic::{AtomicU64, Ordering};

use journal_core::record::Ident;

const SLOTS: usize = 16384;
const WRITING: u64 = u64::MAX;

/// One cache entry. Both words sit side by side, so that an insert touches one page of the
/// table, not two (every fresh page a process touches is a page fault).
pub(crate) struct Slot {
    ino: AtomicU64,
    dev: AtomicU64,
}

/// The table, in the memory the shim maps on demand ([`crate::lazymap`]).
pub(crate) type Table = [Slot; SLOTS];

#[expect(clippy::indexing_slicing, reason = "the index is taken modulo the table's length")]
fn slot(table: &'static Table, id: Ident) -> &'static Slot {
    &table[(id.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id.dev.rotate_left(29)) as usize % SLOTS]
}

/// The session's mark count the entries (and the descriptor memo's) were learnt under;
/// `u64::MAX` before the process first looked.
static TURN: AtomicU64 = AtomicU64::new(u64::MAX);

/// Forgets every entry here and in the descriptor memo if the session was marked since they
/// were learnt: an undo to the mark needs each file's state at it, which the creation or copy
/// made before it does not hold. Two relaxed loads when nothing changed; a process that never
/// looked before only notes the count (it has learnt nothing yet, or only in this turn).
#[inline]
pub fn check_turn() {
    let Some(store) = crate::state::published_store() else { return };
    let turn = store.counters.marks();
    let seen = TURN.load(Ordering::Relaxed);
    if seen != turn {
        TURN.store(turn, Ordering::Relaxed);
        if seen != u64::MAX {
            forget_all();
        }
    }
}

#[cold]
fn forget_all() {
    for s in crate::lazymap::tables_made().map_or(&[][..], |t| &t.covered[..]) {
        if s.ino.load(Ordering::Relaxed) != 0 {
            s.ino.store(0, Ordering::Release);
        }
    }
    crate::fdmemo::forget_all();
}

/// Remembers that `id`'s whole state is journaled.
pub fn insert(id: Ident) {
    if id.ino == 0 || id.ino == WRITING {
        return;
    }
    check_turn();
    // Without the table (no memory for it) nothing is cached: the next change is captured again.
    let Some(tables) = crate::lazymap::tables() else { return };
    let s = slot(&tables.covered, id);
    // Reserve the slot with a write first (a read of a page never touched maps the zero page,
    // and the write after it faults a second time).
    if s.ino.swap(WRITING, Ordering::AcqRel) == WRITING {
        return; // another thread is filling this slot: this entry is simply not cached
    }
    s.dev.store(id.dev, Ordering::Release);
    s.ino.store(id.ino, Ordering::Release);
}

/// Whether `id`'s whole state is already journaled by this process (in this turn).
pub fn contains(id: Ident) -> bool {
    check_turn();
    // A table this process never made holds nothing.
    let Some(tables) = crate::lazymap::tables_made() else { return false };
    let s = slot(&tables.covered, id);
    let first = s.ino.load(Ordering::Acquire);
    if first != id.ino {
        return false;
    }
    let dev = s.dev.load(Ordering::Acquire);
    s.ino.load(Ordering::Acquire) == first && dev == id.dev
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> &'static Table {
        &crate::lazymap::tables().expect("mapped").covered
    }

    #[test]
    fn inserted_identities_are_found_and_others_are_not() {
        let a = Ident { dev: 7, ino: 123_456 };
        assert!(!contains(a));
        insert(a);
        assert!(contains(a));
        assert!(!contains(Ident { dev: 8, ino: 123_456 }), "same inode number on another device");
        assert!(!contains(Ident { dev: 7, ino: 123_457 }));
    }

    #[test]
    fn an_entry_evicted_by_a_colliding_one_is_no_longer_reported() {
        let a = Ident { dev: 3, ino: 42 };
        let b = (1..u64::MAX)
            .map(|i| Ident { dev: 3, ino: 42 + i })
            .find(|b| std::ptr::eq(slot(table(), *b), slot(table(), a)))
            .unwrap();
        insert(a);
        insert(b);
        assert!(contains(b));
        assert!(!contains(a), "evicted: the next change to it is captured again");
    }

    #[test]
    fn the_cache_keeps_the_most_recent_entries_of_a_long_run() {
        let ids: Vec<Ident> = (1..=100_000).map(|i| Ident { dev: 9, ino: i }).collect();
        for id in &ids {
            insert(*id);
        }
        assert!(contains(ids[ids.len() - 1]));
    }
}
