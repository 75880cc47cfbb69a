//! The calling process as [`aether_journal_recorder::ops`] sees it ([`Myself`]): its own cwd
//! and descriptors, with the per-process caches that make naming a call's target cheap (the
//! directory names it resolved, whether its file system has birth times, whether an exclusive
//! create it journaled without looking failed).
//!
//! What this module cannot do: trust a cached directory name past the session's names
//! generation or [`crate::dircache`]'s time limit; it looks again.

use super::destinations::first_send_to;
use aether_journal_recorder::ops::{Base, BaseError, Caller, Journal};
use journal_core::capture::ident_of;
use journal_core::record::{Endpoint, Ident};
use journal_core::resolve::{DirFd, Looked, Target, fd_path, getcwd, split_last};
use rustix::fs::{AtFlags, CWD, FileType, Stat};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// The process the shim runs in, as the journaling logic sees a caller.
pub struct Myself;

/// The one [`Myself`].
pub const ME: &Myself = &Myself;

impl Caller for Myself {
    fn sees_results(&self) -> bool {
        true
    }

    fn cwd(&self) -> Result<Base<'_>, BaseError> {
        match getcwd() {
            Ok(cwd) => Ok(Base { fd: DirFd::Borrowed(CWD), path: cwd }),
            Err(e) => Err(BaseError::Failed(format!("getcwd: {e}"))),
        }
    }

    fn dir(&self, fd: i32) -> Result<Base<'_>, BaseError> {
        match dir_path_of_fd(fd) {
            Ok(p) if p.first() == Some(&b'/') => {
                // SAFETY: `fd` is the caller's descriptor, open for the duration of the call that
                // passed it to us; we only use it for the *at calls that resolve this path.
                Ok(Base { fd: DirFd::Borrowed(unsafe { BorrowedFd::borrow_raw(fd) }), path: p })
            }
            Ok(_) => Err(BaseError::WillFail),
            Err(e) if e.raw_os_error() == Some(libc::EBADF) || e.raw_os_error() == Some(libc::ENOENT) => {
                Err(BaseError::WillFail)
            }
            Err(e) => Err(BaseError::Failed(format!("descriptor {fd}: {e}"))),
        }
    }

    fn fd_path(&self, fd: i32) -> std::io::Result<Vec<u8>> {
        fd_path(fd)
    }

    fn fd_xattr(&self, fd: i32, name: &[u8]) -> Result<Option<Vec<u8>>, rustix::io::Errno> {
        // SAFETY: `fd` is the caller's descriptor, open for the duration of its call.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut buf = vec![0u8; 65536];
        match rustix::fs::fgetxattr(bfd, name, &mut buf[..]) {
            Ok(n) => Ok(Some(buf.get(..n).unwrap_or(&buf).to_vec())),
            Err(rustix::io::Errno::NODATA) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn fd_flags(&self, fd: i32) -> Result<u32, rustix::io::Errno> {
        // SAFETY: `fd` is the caller's descriptor, open for the duration of its call.
        rustix::fs::ioctl_getflags(unsafe { BorrowedFd::borrow_raw(fd) }).map(|f| f.bits())
    }

    fn cached_target<J: Journal>(&self, journal: &J, dirfd: i32, path: &[u8], follow: bool) -> Option<Target<'_>> {
        locate_cached(journal, dirfd, path, follow)
    }

    fn resolved(&self, t: &Target<'_>) {
        remember_parent(t);
    }

    fn covered(&self, id: Ident) -> bool {
        crate::covered::contains(id)
    }

    fn cover(&self, id: Ident) {
        crate::covered::insert(id);
    }

    fn exclusive_without_looking(&self) -> bool {
        BIRTH_TIMES.load(Ordering::Relaxed) == 1 && !EXCLUSIVE_FAILED.load(Ordering::Relaxed)
    }

    fn found_name_free(&self) {
        EXCLUSIVE_FAILED.store(false, Ordering::Relaxed);
    }

    fn names_changing(&self) {
        NAMES_AFTER.with(|c| c.set(true));
    }

    fn pid_and_group(&self) -> (u32, i64) {
        (
            rustix::process::getpid().as_raw_nonzero().get() as u32,
            rustix::process::getpgrp().as_raw_nonzero().get() as i64,
        )
    }

    fn first_send_to(&self, peer: &Endpoint) -> bool {
        first_send_to(peer)
    }
}

/// The fast way to name a target whose path has a directory part. A directory path written
/// the same way (absolute, or relative to the working directory) and found within the last
/// [`crate::dircache::TRUST_NS`], with no rename or removal in the session that could have
/// moved it since and no chdir in this process, names it with no system call at all.
/// Otherwise one `stat` of that directory, whose canonical name comes from
/// [`crate::dircache`] if that name still leads to the same directory (checked with a second
/// `stat` unless the path already is that name). The target is then addressed by the path as
/// written, relative to the caller's base, which is exactly what the real call will resolve.
/// `None`: use the full resolver.
fn locate_cached<'a, J: Journal>(journal: &J, dirfd: i32, path: &[u8], follow: bool) -> Option<Target<'a>> {
    if path.last() == Some(&b'/') {
        return None;
    }
    let (dir_part, name) = split_last(path);
    if dir_part.is_empty() || name.is_empty() || name == b"." || name == b".." {
        return None;
    }
    let plain_base = path.first() == Some(&b'/') || dirfd == libc::AT_FDCWD;
    let base = if plain_base {
        CWD
    } else {
        // SAFETY: `dirfd` is the caller's descriptor, open for the duration of the call that
        // passed it to us; we only use it for the *at calls that resolve this path.
        unsafe { BorrowedFd::borrow_raw(dirfd) }
    };
    // Read before anything is looked at: a change begun after this makes what is learned
    // below stale at once, and while one is under way nothing is remembered or trusted.
    let gens = plain_base
        .then(|| journal.counters().names_settled())
        .flatten()
        .map(|names| (names, crate::dircache::local_gen(), crate::dircache::coarse_now()));
    let remembered = gens.and_then(|(shared, local, now)| crate::dircache::path_get(dir_part, shared, local, now));
    let canonical = match remembered {
        Some(c) => c,
        None => {
            let st = rustix::fs::statat(base, dir_part, AtFlags::empty()).ok().filter(is_dir)?;
            let c = cached_dir_name(ident_of(&st), dir_part)?;
            if let Some((shared, local, now)) = gens {
                crate::dircache::path_put(dir_part, &c, shared, local, now);
            }
            c
        }
    };
    let mut looked = Looked::No;
    if follow {
        // The call follows a final symlink: that is the full resolver's job.
        let fin = rustix::fs::statat(base, path, AtFlags::SYMLINK_NOFOLLOW);
        if fin.is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink) {
            return None;
        }
        looked = Looked::of(fin);
    }
    let abs = journal_core::BPath::new(journal_core::bpath::join(&canonical, name));
    Some(Target { parent: DirFd::Borrowed(base), name: path.to_vec(), abs, looked })
}

/// The canonical path of the directory open as `fd`: from [`crate::dircache`] when the cached
/// name still leads to it (fstat + stat), else read from `/proc/self/fd` and remembered.
fn dir_path_of_fd(fd: i32) -> std::io::Result<Vec<u8>> {
    // SAFETY: `fd` is the caller's descriptor, open for the duration of its call; fstat on a
    // number that is not open fails with EBADF.
    let st = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) })?;
    if !is_dir(&st) {
        return fd_path(fd);
    }
    if let Some(p) = cached_dir_name(ident_of(&st), b"") {
        return Ok(p);
    }
    let p = fd_path(fd)?;
    crate::dircache::put(ident_of(&st), &p);
    Ok(p)
}

fn is_dir(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

/// The canonical name [`crate::dircache`] holds for directory `id`, if that name still leads
/// to it: checked with an `lstat`, unless it is `known`, a name the caller just found to lead
/// there itself.
fn cached_dir_name(id: Ident, known: &[u8]) -> Option<Vec<u8>> {
    let name = crate::dircache::get(id)?;
    if name != known {
        let now = rustix::fs::statat(CWD, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        if ident_of(&now) != id {
            return None;
        }
    }
    Some(name)
}

/// After a full resolution through an opened parent: remember the parent's canonical name.
fn remember_parent(t: &Target<'_>) {
    if let (DirFd::Owned(fd), Some((parent, _))) = (&t.parent, t.abs.split_parent())
        && let Ok(st) = rustix::fs::fstat(fd)
    {
        crate::dircache::put(ident_of(&st), parent);
    }
}

/// Set by a hook whose call may change where directory paths lead; taken after the call.
static NAMES_AFTER: crate::thread::Local<bool> = crate::thread::Local::new(|t| &t.names_after);

/// After the real call of a hook whose work told the session a directory path may lead
/// elsewhere: tells it again, now that the call has taken effect.
pub fn names_changed_after_call() {
    if NAMES_AFTER.with(|c| c.replace(false)) {
        crate::state::names_changed();
    }
}

/// Whether the files this process last created have birth times (`statx` `btime`), which is
/// what lets an exclusive create skip the `lstat` that proves its name absent: 0 not known
/// yet, 1 yes, 2 no. A property of the file system, so a `vfork` child may set it too.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
pub(super) static BIRTH_TIMES: AtomicU8 = AtomicU8::new(0);

/// Set when an exclusive create journaled without looking failed (a lock file someone holds,
/// which a program may retry many times): the next ones look first, and journal nothing while
/// the name is taken, until one finds it free.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
pub(super) static EXCLUSIVE_FAILED: AtomicBool = AtomicBool::new(false);
