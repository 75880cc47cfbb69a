//! Descriptors this process got from an open that created their file, and has not closed since.
//!
//! `tar x`, `cp -p`, `install` and `sed -i` create a file, then set its times, owner and mode
//! through the new descriptor. The file is already journaled whole (undo removes it), so those
//! calls need no record, but proving it costs an `fstat` per call to find the inode. A
//! descriptor refers to the same file from the open that returned it until it is closed or
//! replaced, so remembering "this number came from a creating open" proves the same thing for
//! free, as long as every close and every replacement of the number forgets it.
//!
//! The memo is a process-wide bitmap (fds 3 to 1023; lock-free, nothing for `fork` to catch
//! half done). A number is forgotten by the hooked `close`, `close_range`, `closefrom`, `dup2`,
//! `dup3`, `fclose`, `fcloseall`, `freopen`, `closedir`, and `syscall` with those numbers, before
//! the call (a close that fails has still forgotten: the safe direction). A `vfork` child shares
//! the bitmap but not the descriptor table: it never remembers (its numbers are not its
//! parent's), and what it forgets is forgotten in the parent too, which only costs an `fstat`.
//! Descriptors 0-2 are never remembered: `daemon`, `login_tty` and `forkpty` replace them from
//! inside glibc, where no hook sees it.
//!
//! What this module cannot do: see a descriptor closed and its number reused without a hooked
//! call: an inline `close` system call, or an io_uring close (programs that use io_uring or raw
//! system calls are outside the shim's view already; README "what this cannot do"). A forgotten
//! number, or one above 1023, only costs the `fstat` it would have saved.

use std::sync::atomic::{AtomicU64, Ordering};

const WORDS: usize = 16;
/// Descriptors below this number are remembered.
const LIMIT: i32 = (WORDS * 64) as i32;

#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static CREATED: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];

fn bit(fd: i32) -> Option<(&'static AtomicU64, u64)> {
    let word = CREATED.get(usize::try_from(fd).ok()? / 64).filter(|_| fd >= 3)?;
    Some((word, 1u64 << (fd % 64)))
}

/// Remembers that `fd` was just returned by an open that created its file.
pub fn remember(fd: i32) {
    if let Some((word, mask)) = bit(fd) {
        word.fetch_or(mask, Ordering::AcqRel);
    }
}

/// Whether `fd` came from an open that created its file, and has not been closed since.
#[inline]
pub fn created(fd: i32) -> bool {
    bit(fd).is_some_and(|(word, mask)| word.load(Ordering::Acquire) & mask != 0)
}

/// Forgets `fd` (about to be closed or replaced). Costs one load when it is not remembered,
/// which is almost always.
#[inline]
pub fn forget(fd: i32) {
    if let Some((word, mask)) = bit(fd)
        && word.load(Ordering::Relaxed) & mask != 0
    {
        word.fetch_and(!mask, Ordering::AcqRel);
    }
}

/// Forgets every descriptor from `first` to `last` (inclusive; `u32` as `close_range` takes).
pub fn forget_range(first: u32, last: u32) {
    let last = last.min(LIMIT as u32 - 1);
    let mut fd = first.max(3);
    while fd <= last {
        forget(fd as i32);
        fd += 1;
    }
}

/// Forgets every descriptor (`fcloseall`).
pub fn forget_all() {
    for word in &CREATED {
        word.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The bitmap is process-wide: each test uses its own descriptor numbers.

    #[test]
    fn a_remembered_descriptor_is_created_until_it_is_forgotten() {
        assert!(!created(100));
        remember(100);
        assert!(created(100) && !created(101) && !created(99));
        forget(100);
        assert!(!created(100));
    }

    #[test]
    fn standard_descriptors_and_numbers_past_the_bitmap_are_never_remembered() {
        for fd in [-1, 0, 1, 2, LIMIT, LIMIT + 5] {
            remember(fd);
            assert!(!created(fd), "{fd}");
            forget(fd);
        }
    }

    #[test]
    fn a_range_close_forgets_every_number_in_it_and_no_other() {
        for fd in 200..=210 {
            remember(fd);
        }
        forget_range(202, 208);
        assert!(created(200) && created(201) && created(209) && created(210));
        assert!((202..=208).all(|fd| !created(fd)));
        forget_range(190, u32::MAX);
        assert!((200..=210).all(|fd| !created(fd)));
    }
}
