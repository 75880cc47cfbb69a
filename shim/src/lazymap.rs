//! The shim's larger per-process memory in one anonymous mapping that a process makes only
//! when it first needs any of it: the first chunk of the hook arena, the first permanent
//! region (see [`crate::alloc`]), and the direct-mapped caches (covered inodes, directory names
//! and paths, exec verdicts, network destinations).
//!
//! As zero-initialised statics these tables made the shim's `.bss` 370 KiB, which the loader
//! maps as anonymous memory of its own in every process (an `mmap` there, and the mapping torn
//! down at exit: about 5 us a process here, a fifth of what loading the shim added to a
//! `/bin/true` over a library that does nothing). A process that changes nothing never touches
//! them; one that journals used to make two mappings more (the arena's chunk and the permanent
//! region), and now makes this one. The remaining statics fit on the page of initialised data
//! the loader maps anyway (checked by a test on the library's layout).
//!
//! Lock-free and allocation-free, so that a hook in a signal handler, a `vfork` child or a
//! thread racing another may make it: the mapping is published with one compare-and-swap, and
//! the loser of a race unmaps its own. A `vfork` child's mapping is its parent's too (they share
//! memory); a forked child inherits its parent's copy, as it did the statics.
//!
//! What this cannot do: make the mapping when the system refuses memory. Every user then
//! behaves as on a miss of its cache (a capture or a record more, never one fewer) and the
//! allocator maps its chunks and regions one by one, as before.

use std::sync::atomic::{AtomicPtr, Ordering};

/// Bytes of the arena's first chunk, at the start of the mapping (page-aligned).
pub const ARENA_FIRST: usize = 256 * 1024;
/// Bytes of the first permanent region, right after it.
pub const PERMANENT_FIRST: usize = 64 * 1024;

/// The caches, after the two areas above. All-zero bytes are a valid value of each (they are
/// arrays of atomics), which is what a fresh anonymous mapping holds.
#[repr(C)]
pub struct Tables {
    pub covered: crate::covered::Table,
    pub dirs: crate::dircache::Table,
    pub paths: crate::dircache::Paths,
    pub execs: crate::execmemo::Table,
    pub sent: crate::ops::destinations::Sent,
}

const TABLES_AT: usize = ARENA_FIRST + PERMANENT_FIRST;

fn size() -> usize {
    (TABLES_AT + std::mem::size_of::<Tables>()).next_multiple_of(4096)
}

/// The mapping's start, null until made.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static BASE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// The mapping if this process has made it (one load; never a system call).
fn made() -> Option<*mut u8> {
    let p = BASE.load(Ordering::Acquire);
    (!p.is_null()).then_some(p)
}

/// The mapping, made now if need be.
fn base() -> Option<*mut u8> {
    if let Some(p) = made() {
        return Some(p);
    }
    // SAFETY: a new private anonymous mapping aliases nothing; it is ours until published.
    let fresh = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            size(),
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .ok()?
    .cast::<u8>();
    match BASE.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(fresh),
        Err(winner) => {
            // SAFETY: never published: nobody else can hold a pointer into it.
            let _ = unsafe { rustix::mm::munmap(fresh.cast(), size()) };
            Some(winner)
        }
    }
}

/// The caches, mapping them now if this process had not; `None` if the memory cannot be had.
pub fn tables() -> Option<&'static Tables> {
    // SAFETY: the mapping is at least `size()` bytes, page-aligned, never unmapped once
    // published, and all-zero bytes are a valid `Tables` (arrays of atomics), which every
    // access goes through.
    base().map(|p| unsafe { &*p.add(TABLES_AT).cast::<Tables>() })
}

/// The caches only if this process has mapped them already: for readers, to which a table
/// never made is a table of misses (no system call, no page touched).
pub fn tables_made() -> Option<&'static Tables> {
    // SAFETY: as in `tables`.
    made().map(|p| unsafe { &*p.add(TABLES_AT).cast::<Tables>() })
}

/// The arena's first chunk ([`ARENA_FIRST`] bytes, page-aligned, zero until used).
pub fn arena_first() -> Option<*mut u8> {
    base()
}

/// Whether `p` is the arena's first chunk here (which is never unmapped).
pub fn is_arena_first(p: *const u8) -> bool {
    made().is_some_and(|b| std::ptr::eq(b, p))
}

/// The first permanent region ([`PERMANENT_FIRST`] bytes, page-aligned, zero until used).
pub fn permanent_first() -> Option<*mut u8> {
    // SAFETY: within the mapping (see `size`).
    base().map(|p| unsafe { p.add(ARENA_FIRST) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_start_after_both_areas_and_fit_in_the_mapping() {
        let t = tables().expect("mapped") as *const Tables as usize;
        let b = made().expect("published") as usize;
        assert_eq!(t - b, ARENA_FIRST + PERMANENT_FIRST);
        assert!(t + std::mem::size_of::<Tables>() <= b + size());
        assert_eq!(t % std::mem::align_of::<Tables>(), 0);
        assert_eq!(permanent_first().map(|p| p as usize), Some(b + ARENA_FIRST));
        assert!(is_arena_first(b as *const u8) && !is_arena_first((b + 4096) as *const u8));
    }

    #[test]
    fn threads_racing_to_map_it_all_get_the_same_mapping() {
        let seen: Vec<usize> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..8).map(|_| sc.spawn(|| base().expect("mapped") as usize)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    }
}
