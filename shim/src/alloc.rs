//! The shim's allocator: async-signal-safe for everything a hook allocates.
//!
//! A hook may run inside a signal handler that interrupted the program in the middle of
//! `malloc`; had the hook called `malloc` too, glibc's heap would be corrupted (reproduced:
//! "corrupted double-linked list"). So every allocation the shim makes while its reentrancy
//! guard is held comes from a per-thread bump arena of `mmap`'d chunks: no lock, no `malloc`.
//! The arena is reset whenever the outermost guard is released and nothing in it is live.
//! Allocations that outlive hooks (the configuration, the store) are made in an explicit
//! [`persistent`] scope and go to the system allocator, as does everything outside a hook.
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
//! What this module cannot do: return a thread's arena to the system when the thread exits
//! (a chunk of 256 KiB of address space per thread that ever ran a hook, most of it never
//! touched and so never resident).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

const HEADER: usize = 16;
const CHUNK: usize = 256 * 1024;
const FROM_SYSTEM: usize = 0;

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

#[derive(Clone, Copy)]
struct Arena {
    /// Newest chunk (null: none yet).
    chunk: *mut Chunk,
    /// Next free byte in it.
    bump: usize,
}

thread_local! {
    static ARENA: Cell<Arena> = const { Cell::new(Arena { chunk: std::ptr::null_mut(), bump: 0 }) };
    static PERSISTENT: Cell<bool> = const { Cell::new(false) };
}

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

fn map_chunk(size: usize) -> *mut Chunk {
    // SAFETY: an anonymous private mapping; we own it until we unmap it.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            size,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    };
    match p {
        Ok(p) => {
            let c = p.cast::<Chunk>();
            // SAFETY: the mapping is at least CHUNK bytes, page-aligned, ours alone.
            unsafe { c.write(Chunk { prev: std::ptr::null_mut(), size, live: AtomicUsize::new(0) }) };
            c
        }
        Err(_) => std::ptr::null_mut(),
    }
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
            let fresh = map_chunk(size);
            if fresh.is_null() {
                return std::ptr::null_mut();
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
/// outermost guard is released.
pub fn reset_arena() {
    let _ = ARENA.try_with(|cell| {
        let a = cell.get();
        if a.chunk.is_null() {
            return;
        }
        let mut c = a.chunk;
        while !c.is_null() {
            // SAFETY: every chunk on the chain is live until unmapped below.
            if unsafe { (*c).live.load(Ordering::Acquire) } != 0 {
                return;
            }
            // SAFETY: as above.
            c = unsafe { (*c).prev };
        }
        // Nothing live: keep the oldest chunk, unmap the rest.
        let mut c = a.chunk;
        // SAFETY: walking our own chain; each chunk is unmapped once, after reading `prev`.
        unsafe {
            while !(*c).prev.is_null() {
                let prev = (*c).prev;
                let _ = rustix::mm::munmap(c.cast(), (*c).size);
                c = prev;
            }
        }
        cell.set(Arena { chunk: c, bump: c as usize + std::mem::size_of::<Chunk>() });
    });
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
        if origin == FROM_SYSTEM {
            // SAFETY: allocated by System with exactly this size and alignment.
            unsafe { System.dealloc(ptr.sub(pad), Layout::from_size_align_unchecked(layout.size() + pad, pad)) };
        } else {
            // SAFETY: `origin` is the chunk the block came from, still mapped while it has
            // live blocks.
            unsafe { (*(origin as *const Chunk)).live.fetch_sub(1, Ordering::Release) };
        }
    }
}
