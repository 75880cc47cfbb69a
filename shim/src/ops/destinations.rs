//! The network destinations this process has already journaled a send to: a datagram
//! socket's every `sendto` to one peer is one irreversible record, not thousands.
//!
//! What this module cannot do: remember more than 1,024 destinations; past that, every send is
//! journaled (never fewer records than destinations).

use journal_core::record::Endpoint;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

const SENT_SLOTS: usize = 1024;
static SENT: [AtomicU64; SENT_SLOTS] = [const { AtomicU64::new(0) }; SENT_SLOTS];

fn endpoint_hash(ep: &Endpoint) -> u64 {
    // SipHash with fixed keys: stable for the life of the process, and no allocation.
    let mut h = std::hash::DefaultHasher::new();
    h.write(ep.family.as_bytes());
    h.write(ep.address.as_bytes());
    h.write_u16(ep.port.unwrap_or(0));
    h.finish().max(1)
}

/// Remembers a destination; true the first time this process sends to it. When the table is
/// full every send is journaled (never fewer records than destinations).
pub(super) fn first_send_to(ep: &Endpoint) -> bool {
    let h = endpoint_hash(ep);
    let start = (h as usize) % SENT_SLOTS;
    for slot in SENT.iter().cycle().skip(start).take(SENT_SLOTS) {
        match slot.compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(existing) if existing == h => return false,
            Err(_) => continue,
        }
    }
    true
}

/// Forgets every destination (in a forked child: "per process").
pub fn forget_destinations() {
    for slot in &SENT {
        slot.store(0, Ordering::Relaxed);
    }
}
