//! The shim's allocator: async-signal-safe for everything a hook allocates.
//!
//! A hook may run inside a signal handler that interrupted the program in the middle of
//! `malloc`; had the hook called `malloc` too, glibc's heap would be corrupted (reproduced:
//! "corrupted double-linked list"). So every allocation the shim makes while its reentrancy
//! guard is held comes from a per-thread bump arena of `mmap`'d chunks: no lock, no `malloc`.
//! The arena is reset whenever the outermost guard is entered or released and nothing in it is
//! live (a hook that hands a value past its guard to the real call frees it after the release).
//! Allocations that outlive hooks are made in an explicit scope: [`permanent`] for what a
//! process keeps for good (the configuration, the store, its journal segments' windows), from
//! a lock-free region of `mmap`'d memory that is never returned, so that building them inside
//! a signal handler that interrupted the program's own `malloc` is safe too (reproduced before
//! this: "corrupted double-linked list" when a handler made a process's first change); and
//! [`persistent`] for what an exec hook builds and may free again, which goes to the system
//! allocator, as does everything outside a hook.
//!
//! Every block carries a 16-byte header naming its origin, so that a block is always freed
//! where it came from, whatever the scope at free time.
//!
//! # Rationale
//! The arena's state is a `const` thread-local `Cell` without destructor: safe to touch in a
//! signal handler and during thread exit. In a `vfork` child (which shares its parent's
//! memory and thread-local storage) the arena is used stack-like and left as it was found,
//! because every hook frees what it allocated before the child execs.
//!
//! The first chunk a process's arena takes and its first permanent region are areas of the
//! memory the shim maps on demand ([`crate::lazymap`]): a process that journals makes one
//! mapping for them and the caches, not one each. That chunk is never unmapped; a thread that
//! gives it back frees it for the next thread whose arena starts.
//!
//! A thread's arena goes back to the system when the thread exits: its first chunk arms a
//! pthread key whose destructor unmaps the chain (a program that runs a short thread per task
//! otherwise kept 256 KiB of address space and a resident page per thread it ever ran).
//!
//! What this module cannot do: give back the arena of a thread that exits while one of its
//! blocks is still live (handed to another thread and not yet freed), or from a signal handler
//! that interrupted a hook; or any, when the key cannot be had (see [`watch_thread_exit`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::thread::Local;

const HEADER: usize = 16;
const CHUNK: usize = crate::lazymap::ARENA_FIRST;
const FROM_SYSTEM: usize = 0;
/// Header of a block from the permanent region (arena chunks are page-aligned, never 1).
const FROM_PERMANENT: usize = 1;

/// Header of an arena chunk, at its start.
#[repr(C)]
struct Chunk {
    /// The chunk allocated before this one (a chain, newest first).
    prev: *mut Chunk,
    /// Its size in bytes, header included.
    size: usize,
    /// Blocks in it not yet freed.
    live: AtomicUsize,
}

/// A thread's arena: its newest chunk and where the next block starts in it (in the
/// thread's state, `thread.rs`; all zeroes: no chunk yet).
#[derive(Clone, Copy)]
pub struct Arena {
    /// Newest chunk (null: none yet).
    chunk: *mut Chunk,
    /// Next free byte in it.
    bump: usize,
}

static ARENA: Local<Arena> = Local::new(|t| &t.arena);
static PERSISTENT: Local<bool> = Local::new(|t| &t.persistent);
static PERMANENT: Local<bool> = Local::new(|t| &t.permanent);

/// The region [`permanent`] allocates from: a header at the start of an anonymous mapping.
#[repr(C)]
struct Region {
    /// One past its last byte.
    end: usize,
    /// Next free byte.
    bump: AtomicUsize,
}

/// The current permanent region (older ones stay mapped: their blocks are never freed).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static REGION: std::sync::atomic::AtomicPtr<Region> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
const REGION_SIZE: usize = crate::lazymap::PERMANENT_FIRST;

/// Runs `f` with allocations going to the permanent region: for what the process keeps until
/// it ends. Freeing such a block does nothing. Async-signal-safe (no lock, no `malloc`).
pub fn permanent<T>(f: impl FnOnce() -> T) -> T {
    let was = PERMANENT.with(|p| p.replace(true));
    let out = persistent(f);
    PERMANENT.with(|p| p.set(was));
    out
}

/// Allocates `total` bytes whose user part starts `pad` bytes in, from the permanent region.
fn permanent_alloc(total: usize, pad: usize) -> *mut u8 {
    for _ in 0..4 {
        let r = REGION.load(Ordering::Acquire);
        if !r.is_null() {
            // SAFETY: a published region is mapped for the life of the process.
            let (end, bump) = unsafe { ((*r).end, &(*r).bump) };
            let mut cur = bump.load(Ordering::Relaxed);
            loop {
                let region = align_up(cur, pad);
                if region + total > end {
                    break;
                }
                match bump.compare_exchange_weak(cur, region + total, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => {
                        let user = (region + pad) as *mut u8;
                        // SAFETY: the header lies inside the region just reserved, before `user`.
                        unsafe { user.sub(8).cast::<usize>().write(FROM_PERMANENT) };
                        return user;
                    }
                    Err(now) => cur = now,
                }
            }
        }
        let size = REGION_SIZE.max(align_up(total + pad + std::mem::size_of::<Region>(), 4096));
        // The process's first region is the one in the memory mapped on demand (no mapping of
        // its own), if this thread is the one to take it.
        let first_region = r.is_null() && size == REGION_SIZE && !PERMANENT_FIRST_TAKEN.swap(true, Ordering::AcqRel);
        let (p, ours) = match first_region.then(crate::lazymap::permanent_first).flatten() {
            Some(p) => (p.cast::<std::ffi::c_void>(), false),
            None => match map_private(size) {
                Some(p) => (p, true),
                None => return std::ptr::null_mut(),
            },
        };
        let fresh = p.cast::<Region>();
        let first = p as usize + std::mem::size_of::<Region>();
        // SAFETY: the area is at least `size` bytes, page-aligned, this thread's alone (a
        // fresh mapping, or the on-demand one's area that the swap above gave it).
        unsafe { fresh.write(Region { end: p as usize + size, bump: AtomicUsize::new(first) }) };
        if REGION.compare_exchange(r, fresh, Ordering::AcqRel, Ordering::Acquire).is_err() && ours {
            // Another thread installed one first: use that (the on-demand area is left unused).
            // SAFETY: never published, so nobody else can hold a pointer into it.
            let _ = unsafe { rustix::mm::munmap(p, size) };
        }
    }
    std::ptr::null_mut()
}

/// Set once a thread has taken the first permanent region in the memory mapped on demand.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static PERMANENT_FIRST_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set while a thread's arena starts in the chunk in the memory mapped on demand.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static ARENA_FIRST_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `f` with allocations going to the system allocator: for what must outlive the hook.
/// Also marks, for [`in_persistent`], work whose own libc calls re-enter hooks on purpose.
pub fn persistent<T>(f: impl FnOnce() -> T) -> T {
    let was = PERSISTENT.with(|p| p.replace(true));
    let out = f();
    PERSISTENT.with(|p| p.set(was));
    out
}

/// Whether the current thread is inside a [`persistent`] scope.
pub fn in_persistent() -> bool {
    PERSISTENT.with(Cell::get)
}

/// A fresh anonymous private read-write mapping of `size` bytes (a raw system call: no
/// `malloc`, no lock), ours until we unmap it.
fn map_private(size: usize) -> Option<*mut std::ffi::c_void> {
    // SAFETY: a new anonymous mapping aliases nothing; the caller owns it.
    unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            size,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .ok()
}

/// A fresh chunk of `size` bytes for a thread whose arena has `none_yet`: the chunk in the
/// memory mapped on demand if it is a first chunk of the usual size and no other thread has
/// it, else a mapping of its own.
fn map_chunk(size: usize, none_yet: bool) -> *mut Chunk {
    let first = none_yet && size == CHUNK && !ARENA_FIRST_TAKEN.swap(true, Ordering::AcqRel);
    let p = match first.then(crate::lazymap::arena_first).flatten() {
        Some(p) => p.cast::<std::ffi::c_void>(),
        None => {
            if first {
                ARENA_FIRST_TAKEN.store(false, Ordering::Release);
            }
            match map_private(size) {
                Some(p) => p,
                None => return std::ptr::null_mut(),
            }
        }
    };
    let c = p.cast::<Chunk>();
    // SAFETY: the mapping is at least CHUNK bytes, page-aligned, ours alone.
    unsafe { c.write(Chunk { prev: std::ptr::null_mut(), size, live: AtomicUsize::new(0) }) };
    c
}

fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

/// Allocates `total` bytes whose user part starts `pad` bytes in, from this thread's arena.
fn arena_alloc(total: usize, pad: usize) -> *mut u8 {
    ARENA.with(|cell| {
        let mut a = cell.get();
        for _ in 0..2 {
            if !a.chunk.is_null() {
                // SAFETY: a.chunk is a live chunk of this thread's arena.
                let end = a.chunk as usize + unsafe { (*a.chunk).size };
                let region = align_up(a.bump, pad);
                if region + total <= end {
                    let user = (region + pad) as *mut u8;
                    a.bump = region + total;
                    // SAFETY: as above; `live` is atomic because a block may be freed by
                    // another thread.
                    unsafe { (*a.chunk).live.fetch_add(1, Ordering::Relaxed) };
                    // SAFETY: the header lies inside the region just reserved, before `user`.
                    unsafe { user.sub(8).cast::<usize>().write(a.chunk as usize) };
                    cell.set(a);
                    return user;
                }
            }
            let size = CHUNK.max(align_up(total + pad + std::mem::size_of::<Chunk>(), 4096));
            let fresh = map_chunk(size, a.chunk.is_null());
            if fresh.is_null() {
                return std::ptr::null_mut();
            }
            if a.chunk.is_null() {
                watch_thread_exit();
            }
            // SAFETY: `fresh` was just initialised by map_chunk.
            unsafe { (*fresh).prev = a.chunk };
            a = Arena { chunk: fresh, bump: fresh as usize + std::mem::size_of::<Chunk>() };
        }
        cell.set(a);
        std::ptr::null_mut()
    })
}

/// Releases this thread's arena for reuse when nothing in it is live: called when the
/// outermost guard is entered and when it is released.
pub fn reset_arena() {
    start_over(false);
}

/// If nothing in this thread's arena is live, unmaps its chunks (all of them with `give_back`,
/// else all but the oldest, which the arena starts over in) and returns true.
fn start_over(give_back: bool) -> bool {
    ARENA.with(|cell| {
        let a = cell.get();
        let mut c = a.chunk;
        while !c.is_null() {
            // SAFETY: every chunk on the chain is mapped until unmapped below.
            if unsafe { (*c).live.load(Ordering::Acquire) } != 0 {
                return false;
            }
            // SAFETY: as above.
            c = unsafe { (*c).prev };
        }
        let mut c = a.chunk;
        // SAFETY: walking our own chain; each chunk is unmapped once, after reading `prev`.
        unsafe {
            while !c.is_null() && (give_back || !(*c).prev.is_null()) {
                let prev = (*c).prev;
                if crate::lazymap::is_arena_first(c.cast()) {
                    // Never unmapped (it is part of the on-demand memory): free for the
                    // next thread whose arena starts.
                    ARENA_FIRST_TAKEN.store(false, Ordering::Release);
                } else {
                    let _ = rustix::mm::munmap(c.cast(), (*c).size);
                }
                c = prev;
            }
        }
        let bump = if c.is_null() { 0 } else { c as usize + std::mem::size_of::<Chunk>() };
        cell.set(Arena { chunk: c, bump });
        true
    })
}

/// The pthread key whose destructor gives an exiting thread's arena back: [`NO_KEY`] until a
/// thread other than the main one maps a first chunk (most processes never make one), then the
/// key plus [`KEY_BASE`], or [`KEY_NONE`].
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static EXIT_KEY: AtomicUsize = AtomicUsize::new(NO_KEY);
const NO_KEY: usize = 0;
const KEY_MAKING: usize = 1;
const KEY_NONE: usize = 2;
const KEY_BASE: usize = 3;
/// Keys below this live in the thread descriptor itself: setting one never allocates (glibc's
/// `PTHREAD_KEY_2NDLEVEL_SIZE`). A higher key would make `pthread_setspecific` call `calloc`,
/// which a hook running in a signal handler must not.
const KEYS_IN_DESCRIPTOR: usize = 32;

/// Arms the current thread's exit key (its arena has just got its first chunk), making the
/// key on first use. Lock-free and allocation-free: a thread that maps its first chunk while
/// another is making the key is simply not watched.
///
/// Not for a process's main thread ([`crate::state::on_main_thread`]): its end is the
/// process's end in all but the rare program whose `main` calls `pthread_exit`, where what
/// stays behind is the arena's first chunk (part of the on-demand memory anyway, then kept from
/// later threads) and any chunk after it. So a process whose other threads never journal makes
/// no key: the program's own keys are numbered as without the shim, and a forked shell's
/// child, whose parent never journaled, does not fault in `pthread_key_create`'s code and the
/// pages it writes before its exec. A `vfork` child, on its parent thread's memory, does as
/// that thread would.
fn watch_thread_exit() {
    if crate::state::on_main_thread() {
        return;
    }
    let mut state = EXIT_KEY.load(Ordering::Acquire);
    if state == NO_KEY && EXIT_KEY.compare_exchange(NO_KEY, KEY_MAKING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: creates a key with a destructor that is a plain `extern "C"` function of this
        // library, which is never unloaded (a preloaded library stays to the end).
        let made = unsafe { libc::pthread_key_create(&mut key, Some(give_back_at_exit)) } == 0;
        state = if made && (key as usize) < KEYS_IN_DESCRIPTOR { key as usize + KEY_BASE } else { KEY_NONE };
        EXIT_KEY.store(state, Ordering::Release);
    }
    if state >= KEY_BASE {
        // SAFETY: a key this process made; any non-null value makes its destructor run when
        // the thread exits. Below KEYS_IN_DESCRIPTOR this only stores into the descriptor.
        unsafe {
            libc::pthread_setspecific((state - KEY_BASE) as libc::pthread_key_t, std::ptr::dangling::<libc::c_void>())
        };
    }
}

/// The exit key's destructor, run by the exiting thread itself after its thread-local
/// destructors: unmaps the thread's arena if nothing in it is live. Another destructor run
/// after this one that makes a hook allocate starts a fresh chunk, which arms the key again.
unsafe extern "C" fn give_back_at_exit(_: *mut libc::c_void) {
    // Inside the guard, as every start-over is. Busy: the thread is ending from a signal
    // handler that interrupted a hook, whose blocks may still be in use: leave it all.
    let Some(guard) = crate::guard::Guard::enter() else { return };
    if !start_over(true) {
        // Still referenced from elsewhere (a block handed to another thread): keep the chain,
        // stop using it.
        ARENA.with(|cell| cell.set(Arena { chunk: std::ptr::null_mut(), bump: 0 }));
    }
    drop(guard);
}

/// The allocator of the shim's own Rust code.
pub struct ShimAlloc;

fn use_arena() -> bool {
    crate::guard::busy() && !PERSISTENT.with(Cell::get)
}

// SAFETY: every block is either a System allocation of `layout.size() + pad` bytes with
// alignment `pad`, or an arena region of that size aligned to `pad`; the header just before
// the user pointer says which, and dealloc returns it the same way.
unsafe impl GlobalAlloc for ShimAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pad = layout.align().max(HEADER);
        let total = layout.size() + pad;
        if PERMANENT.with(Cell::get) {
            // Never the system allocator: this may be a signal handler inside `malloc`.
            return permanent_alloc(total, pad);
        }
        if use_arena() {
            let p = arena_alloc(total, pad);
            if !p.is_null() {
                return p;
            }
        }
        // SAFETY: pad is a power of two (an alignment, or 16) and total > 0.
        let raw = unsafe { System.alloc(Layout::from_size_align_unchecked(total, pad)) };
        if raw.is_null() {
            return raw;
        }
        // SAFETY: raw has total = size + pad bytes; the header is in the first pad bytes.
        unsafe {
            let user = raw.add(pad);
            user.sub(8).cast::<usize>().write(FROM_SYSTEM);
            user
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let pad = layout.align().max(HEADER);
        // SAFETY: every block we hand out has its header 8 bytes before it.
        let origin = unsafe { ptr.sub(8).cast::<usize>().read() };
        if origin == FROM_PERMANENT {
            // Kept until the process ends.
        } else if origin == FROM_SYSTEM {
            // SAFETY: allocated by System with exactly this size and alignment.
            unsafe { System.dealloc(ptr.sub(pad), Layout::from_size_align_unchecked(layout.size() + pad, pad)) };
        } else {
            // SAFETY: `origin` is the chunk the block came from, still mapped while it has
            // live blocks.
            unsafe { (*(origin as *const Chunk)).live.fetch_sub(1, Ordering::Release) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin_of(p: *const u8) -> usize {
        // SAFETY: every block this allocator hands out has its header 8 bytes before it.
        unsafe { p.sub(8).cast::<usize>().read() }
    }

    #[test]
    fn a_permanent_block_never_comes_from_the_system_allocator() {
        let small = permanent(|| vec![7u8; 100]);
        let big = permanent(|| vec![9u64; REGION_SIZE]); // larger than a region
        let grown = permanent(|| {
            let mut v = Vec::new();
            for i in 0..10_000u32 {
                v.push(i); // every reallocation stays in the region
            }
            v
        });
        for p in [small.as_ptr(), big.as_ptr().cast(), grown.as_ptr().cast()] {
            assert_eq!(origin_of(p), FROM_PERMANENT);
        }
        assert!(small.iter().all(|&b| b == 7) && big.iter().all(|&b| b == 9));
        assert_eq!(grown.iter().map(|&x| u64::from(x)).sum::<u64>(), 9_999 * 10_000 / 2);
        let outside = std::hint::black_box(vec![1u8; 100]);
        assert_eq!(origin_of(outside.as_ptr()), FROM_SYSTEM, "outside the scope: the system allocator");
    }

    #[test]
    fn permanent_blocks_of_concurrent_threads_never_overlap() {
        let blocks: Vec<Vec<(usize, usize)>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    sc.spawn(move || {
                        (0..3_000)
                            .map(|i| {
                                let len = 1 + (i * 7 + t) % 300;
                                let b = std::mem::ManuallyDrop::new(permanent(|| vec![t as u8; len]));
                                assert!(b.iter().all(|&x| x == t as u8));
                                (b.as_ptr() as usize, len)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<(usize, usize)> = blocks.into_iter().flatten().collect();
        all.sort();
        for w in all.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "blocks overlap: {w:?}");
        }
    }
}
