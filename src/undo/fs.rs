//! File-system helpers of undo: directories opened without following symlinks, `lstat` by
//! name, removal of any node, the words for what a node is.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, ResolveFlags, Stat, Timestamps};
use rustix::io::Errno;

use super::{Cause, Done, Outcome};

/// A step that failed because a system call of the restore did (`failed_because` for a
/// cause of its own).
pub(super) fn failed(why: impl Into<String>) -> Done {
    (Outcome::Failed, why.into(), Cause::Errno { errno: None })
}

/// A step that failed because a system call returned `e`.
pub(super) fn failed_errno(e: Errno, why: impl Into<String>) -> Done {
    (Outcome::Failed, why.into(), Cause::Errno { errno: Some(e.raw_os_error()) })
}

/// A step that failed for `cause`.
pub(super) fn failed_because(cause: Cause, why: impl Into<String>) -> Done {
    (Outcome::Failed, why.into(), cause)
}

/// An outcome with the cause it has when nothing more particular is known: undone as
/// recorded, already as before, or (a failure) a system call.
pub(super) fn done(outcome: Outcome, why: String) -> Done {
    let cause = match outcome {
        Outcome::Restored | Outcome::Removed | Outcome::Recreated => Cause::Undone,
        Outcome::Unchanged => Cause::AlreadyAsBefore,
        Outcome::Conflict => Cause::Replaced,
        Outcome::Skipped | Outcome::Failed => Cause::Errno { errno: None },
    };
    (outcome, why, cause)
}

/// [`done`] with a cause of its own.
pub(super) fn done_because(outcome: Outcome, cause: Cause, why: impl Into<String>) -> Done {
    (outcome, why.into(), cause)
}

pub(super) fn describe_errno(e: Errno) -> String {
    io::Error::from(e).to_string()
}

/// Opens a directory by absolute path without following any symlink on the way.
pub fn open_dir_nofollow(path: &[u8]) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS)
    {
        // Kernels before 5.6, and directories deeper than PATH_MAX: one component at a time.
        Err(Errno::NOSYS | Errno::NAMETOOLONG) => crate::resolve::open_dir_by_components(path),
        other => other,
    }
}

pub(super) fn lstat(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Option<Stat>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(super) fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

pub(super) fn type_name(st: &Stat) -> &'static str {
    match file_type(st) {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "an unknown kind of file",
    }
}

pub(super) fn timestamps(atime: [i64; 2], mtime: [i64; 2]) -> Timestamps {
    Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: atime[0], tv_nsec: atime[1] as _ },
        last_modification: rustix::fs::Timespec { tv_sec: mtime[0], tv_nsec: mtime[1] as _ },
    }
}

/// Opens an existing regular file for rewriting without following a symlink, making it
/// writable for the moment if its owner's mode forbids writing (undo sets the mode back).
pub(super) fn open_write_in_place(dir: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Result<OwnedFd, Errno> {
    let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Err(Errno::ACCESS) if st.st_uid == rustix::process::geteuid().as_raw() => {
            rustix::fs::chmodat(dir, name, Mode::from_raw_mode((st.st_mode & 0o7777) | 0o200), AtFlags::empty())?;
            rustix::fs::openat(dir, name, flags, Mode::empty())
        }
        other => other,
    }
}

/// Replaces `dst`'s contents with `src`'s, writing only `src`'s data extents: a sparse capture
/// comes back sparse (holes are left unwritten, then the length set).
pub(super) fn copy_from_start(src: &OwnedFd, dst: &OwnedFd) -> io::Result<()> {
    rustix::fs::ftruncate(dst, 0)?;
    let copied = crate::capture::copy_extents(src, dst, |_, _| {})?;
    let len = rustix::fs::fstat(src)?.st_size.max(0) as u64;
    rustix::fs::ftruncate(dst, len.max(copied))?;
    Ok(())
}

/// The names in directory `name` of `dir` (not following a symlink), `None` if unreadable.
pub(super) fn entries_of(dir: BorrowedFd<'_>, name: &[u8]) -> Option<Vec<Vec<u8>>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).ok()?;
    let mut d = rustix::fs::Dir::read_from(&fd).ok()?;
    let mut names = Vec::new();
    while let Some(Ok(e)) = d.read() {
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    Some(names)
}
