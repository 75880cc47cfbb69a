//! The one sequence-lock protocol of the session's lock-free tables (the capture index, the
//! names born unseen, the shim's directory caches): a word that is odd while a writer fills its
//! slot and grows by two with each write, so that a reader knows whether what it read is whole.
//!
//! Writers never wait: a slot another writer holds is simply not written this time (every
//! table here is a cache, where a missed write only costs a later copy or lookup). Readers
//! never wait either: a slot being written, or written while they read, is a miss.
//!
//! What this cannot do: make a read of several words atomic without the reader's cooperation.
//! The words a reader reads must be atomics (relaxed loads suffice), and whatever it reads is
//! thrown away unless [`read`] says the sequence held still.

use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Runs `fill` with the slot's sequence `seq` odd, then makes it even again, and returns what
/// `fill` did; `None`, without running it, when another writer has the slot.
pub fn write<T>(seq: &AtomicU64, fill: impl FnOnce() -> T) -> Option<T> {
    let cur = seq.load(Ordering::Acquire);
    if cur & 1 == 1 || seq.compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return None;
    }
    fence(Ordering::Release);
    let done = fill();
    seq.store(cur.wrapping_add(2), Ordering::Release);
    Some(done)
}

/// What `look` read of the slot whose sequence is `seq`, if no writer had it meanwhile (the
/// sequence even, and the same after as before).
pub fn read<T>(seq: &AtomicU64, look: impl FnOnce() -> Option<T>) -> Option<T> {
    let before = seq.load(Ordering::Acquire);
    if before & 1 == 1 {
        return None;
    }
    let got = look();
    fence(Ordering::Acquire);
    if seq.load(Ordering::Relaxed) == before { got } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_of_a_slot_being_written_is_a_miss_and_a_second_writer_is_turned_away() {
        let seq = AtomicU64::new(0);
        let word = AtomicU64::new(0);
        let inner = write(&seq, || {
            assert_eq!(read(&seq, || Some(word.load(Ordering::Relaxed))), None, "read while odd");
            assert_eq!(write(&seq, || ()), None, "a second writer");
            word.store(7, Ordering::Relaxed);
            "filled"
        });
        assert_eq!(inner, Some("filled"));
        assert_eq!(seq.load(Ordering::Relaxed), 2);
        assert_eq!(read(&seq, || Some(word.load(Ordering::Relaxed))), Some(7));
    }

    #[test]
    fn a_read_overtaken_by_a_write_is_a_miss() {
        let seq = AtomicU64::new(4);
        let got = read(&seq, || {
            write(&seq, || ());
            Some(1)
        });
        assert_eq!(got, None);
    }
}
