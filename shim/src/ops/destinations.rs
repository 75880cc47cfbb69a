//! The network destinations this process has already journaled a send to: a datagram
//! socket's every `sendto` to one peer is one irreversible record, not thousands.
//!
//! What this module cannot do: remember more than 1,024 destinations; past that, every send is
//! journaled (never fewer records than destinations).

use journal_core::record::Endpoint;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SENT_SLOTS: usize = 1024;
/// The table, in the memory the shim maps on demand ([`crate::lazymap`]). Each slot: the
/// destination's hash in the high 48 bits, the [`GENERATION`] of the process that sent to it
/// in the low 16; 0 is free.
pub(crate) type Sent = [AtomicU64; SENT_SLOTS];

/// This process's generation: 0 in a fresh image, one more than its parent's in a forked
/// child. A slot of another generation is an ancestor's and counts as free, so that a fork
/// child forgets its parent's destinations by one store instead of clearing the table (8 KiB,
/// three pages every child would otherwise copy or zero). Generations only grow along a line
/// of forks (past 65,535 nested forks the table is cleared and they start again), so no process
/// takes an ancestor's slot for its own.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.fork"))]
static GENERATION: AtomicU32 = AtomicU32::new(0);

const GENERATION_BITS: u32 = 16;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

/// A slot's value for `ep` sent by a process of generation `generation`: never 0.
fn tag(ep: &Endpoint, generation: u32) -> u64 {
    // SipHash with fixed keys: stable for the life of the process, and no allocation.
    let mut h = std::hash::DefaultHasher::new();
    h.write(ep.family.as_bytes());
    h.write(ep.address.as_bytes());
    h.write_u16(ep.port.unwrap_or(0));
    (h.finish() & !GENERATION_MASK).max(1 << GENERATION_BITS) | (u64::from(generation) & GENERATION_MASK)
}

/// Remembers a destination; true the first time this process sends to it. When the table is
/// full every send is journaled (never fewer records than destinations).
pub(super) fn first_send_to(ep: &Endpoint) -> bool {
    // Without the table (no memory for it) every send is journaled.
    let Some(tables) = crate::lazymap::tables() else { return true };
    let generation = u64::from(GENERATION.load(Ordering::Relaxed));
    let mine = tag(ep, generation as u32);
    let start = (mine >> GENERATION_BITS) as usize % SENT_SLOTS;
    for slot in tables.sent.iter().cycle().skip(start).take(SENT_SLOTS) {
        let mut seen = slot.load(Ordering::Acquire);
        loop {
            if seen == mine {
                return false;
            }
            // Taken by this process for another destination: look further.
            if seen != 0 && seen & GENERATION_MASK == generation {
                break;
            }
            // Free, or an ancestor's: take it.
            match slot.compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => seen = now,
            }
        }
    }
    true
}

/// Forgets every destination (in a forked child: "per process"): one store, the parent's slots
/// being of an older generation from then on.
pub fn forget_destinations() {
    let next = (u64::from(GENERATION.load(Ordering::Relaxed)) + 1) & GENERATION_MASK;
    if next == 0 {
        for slot in crate::lazymap::tables_made().map_or(&[][..], |t| &t.sent[..]) {
            slot.store(0, Ordering::Relaxed);
        }
    }
    GENERATION.store(next as u32, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(port: u16) -> Endpoint {
        Endpoint { family: "inet".into(), address: "192.0.2.1".into(), port: Some(port) }
    }

    #[test]
    fn a_destination_is_new_once_per_process_and_new_again_in_each_fork_child_whatever_its_generation() {
        let (a, b) = (endpoint(9), endpoint(10));
        assert!(first_send_to(&a));
        assert!(!first_send_to(&a));
        assert!(first_send_to(&b));
        forget_destinations();
        assert!(first_send_to(&b), "a fork child sends to its parent's destination for the first time");
        assert!(!first_send_to(&b), "the child remembers its own sends");

        // Past the last generation the table is cleared: the first process's send to `a`, of
        // generation 0 too, is not taken for a descendant's.
        GENERATION.store(GENERATION_MASK as u32, Ordering::Relaxed);
        forget_destinations();
        assert_eq!(GENERATION.load(Ordering::Relaxed), 0);
        assert!(first_send_to(&a), "a descendant at generation 0 again sends to `a` for the first time");
        assert!(!first_send_to(&a));
    }
}
