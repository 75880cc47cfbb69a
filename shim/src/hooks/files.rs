//! Handlers of the calls that change files: opens that write, create or truncate, temporary
//! names, truncation, renames, removals and creations of names, and metadata.
//!
//! Each classifies its call with a fast test where one exists (a read-only open is a flag test
//! and a tail call; a descriptor already journaled whole needs no record), then hands the rest
//! to [`super::journaled`], whose `pre` closure reads the arguments and journals through
//! [`crate::ops`].
//!
//! What this module cannot do: journal a call whose path it cannot read (a null or invalid
//! pointer, which the real call rejects on its own).

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_ulong};

use journal_core::record::MetaKind;
use libc::FILE;

use super::{Account, CPath, Ret, after_call, injected_kill_after, journaled, journaled_unless, journaled_with};
use aether_journal_recorder::ops::{self as rec, Pending, Removes};

use crate::ops::{self, ME};
use crate::state::store;
use crate::tempname::Temp;

/// Whether open flags need a `mode` (glibc's `__OPEN_NEEDS_MODE`).
pub fn needs_mode(flags: c_int) -> bool {
    flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE
}

/// The open family: the read-only fast path is a flag test and a tail call (the path is not
/// even measured).
#[inline(always)]
pub fn open_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    flags: c_int,
) -> R {
    if !rec::open_mutates(flags) {
        return real(Account::AsIs);
    }
    open_mutating(call, real, dirfd, path, flags)
}

#[inline(never)]
fn open_mutating<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    flags: c_int,
) -> R {
    journaled_unless(
        call,
        path,
        // `/dev/tty`, `/dev/null`: left out of the journal wherever they lead (the dirfd does
        // not matter to an absolute path).
        || flags & libc::O_TMPFILE != libc::O_TMPFILE && path.bytes().is_some_and(rec::plainly_excluded),
        |s| path.bytes().map_or(Pending::Nothing, |p| rec::before_open(s, ME, call, dirfd, p, flags)),
        real,
    )
}

/// `syscall(SYS_openat2, ...)`: the flags are the first member of `struct open_how`.
pub fn openat2_<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    how: *const u64,
    size: usize,
) -> R {
    // SAFETY: openat2's contract: `how` points to a struct open_how of `size` bytes.
    let flags = if how.is_null() || size < 8 { 0 } else { (unsafe { how.read_unaligned() }) as c_int };
    open_at(call, real, dirfd, path, flags)
}

/// What an `fopen`-like call returned: whether it succeeded, and the stream's descriptor.
fn file_outcome(f: &*mut FILE) -> (bool, Option<c_int>) {
    if f.is_null() {
        return (false, None);
    }
    // SAFETY: a stream fopen/freopen just returned; fileno only reads it.
    (true, Some(unsafe { libc::fileno(*f) }))
}

/// The open flags of a stdio mode that writes, creates or truncates (`None` for a read-only
/// or invalid mode).
fn writing_mode(mode: CPath) -> Option<c_int> {
    mode.bytes().and_then(rec::fopen_flags).filter(|&f| rec::open_mutates(f))
}

/// Under a supervisor, a journaled `fopen` for writing is the shim's own: the file opened with a
/// marked `openat` (the flags glibc's `fopen` uses, mode 0666), then `fdopen` (which makes no
/// watched call), instead of libc's `fopen`, whose unmarked `openat` would cost a round trip.
/// A mode with a `,ccs=` encoding, which only `fopen` knows, is left to libc.
pub fn fopen_(call: &'static str, real: impl FnOnce(Account) -> *mut FILE, path: CPath, mode: CPath) -> *mut FILE {
    let Some(flags) = writing_mode(mode) else { return real(Account::AsIs) };
    let plain = mode.bytes().is_some_and(|m| !m.contains(&b','));
    let real = |account: Account| {
        if account != Account::Journaled || !plain || !super::supervised() {
            return real(account);
        }
        // SAFETY: the caller's NUL-terminated path; flags and mode as glibc's fopen passes them.
        let fd = unsafe {
            crate::kernel::libc_style(
                libc::SYS_openat,
                [libc::AT_FDCWD as usize, path.0 as usize, flags as usize, 0o666, 0],
            )
        };
        if fd < 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: a descriptor we just opened, and the caller's mode string.
        let f = unsafe { libc::fdopen(fd as c_int, mode.0) };
        if f.is_null() {
            let err = crate::guard::errno();
            // SAFETY: our own descriptor, not handed out.
            unsafe { libc::close(fd as c_int) };
            crate::guard::set_errno(err);
        }
        f
    };
    let pre = |s| path.bytes().map_or(Pending::Nothing, |p| rec::before_open(s, ME, call, libc::AT_FDCWD, p, flags));
    // `/dev/null` and the like, as for the open family.
    let outside = || path.bytes().is_some_and(rec::plainly_excluded);
    journaled_with(call, path, outside, pre, real, file_outcome, <*mut FILE>::refused)
}

pub fn freopen_(
    call: &'static str,
    real: impl FnOnce(Account) -> *mut FILE,
    path: CPath,
    mode: CPath,
    stream: *mut FILE,
) -> *mut FILE {
    // The stream's descriptor is closed, whatever the new mode.
    let fd = super::descriptors::stream_fd(stream);
    crate::fdmemo::forget(fd);
    let Some(flags) = writing_mode(mode) else { return real(Account::AsIs) };
    let pre = |s| {
        // freopen(NULL, mode, stream) reopens the stream's own file with the new mode; a
        // stream without a descriptor (fd -1) has no name.
        let target = match path.bytes() {
            Some(p) => p.to_vec(),
            None => match journal_core::resolve::fd_path(fd) {
                Ok(p) => p,
                Err(_) => return Pending::NotJournaled,
            },
        };
        rec::before_open(s, ME, call, libc::AT_FDCWD, &target, flags)
    };
    // `freopen("/dev/null", "w", stdout)`, as daemons do: as for fopen.
    let outside = || path.bytes().is_some_and(rec::plainly_excluded);
    journaled_with(call, path, outside, pre, real, file_outcome, <*mut FILE>::refused)
}

/// The mkstemp family and mkdtemp: the template is journaled before the call (a `temp_name`
/// intent), the name the call chose after it (or that the call failed). A process killed in
/// between leaves an intent nothing completes, which undo reports as incomplete.
///
/// Under a supervisor, a journaled call is made by the shim itself, each attempt marked (see
/// [`crate::tempname`]), instead of by libc (whose own unmarked calls would each cost a round
/// trip to the supervisor).
pub fn mktemp<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, template: *mut c_char, kind: Temp) -> R {
    let real = |account: Account| {
        if account != Account::Journaled || !super::supervised() {
            return real(account);
        }
        // SAFETY: the caller's template, a writable NUL-terminated string (the family's
        // contract).
        let r = unsafe { crate::tempname::make(template, kind) };
        match kind {
            Temp::File { .. } => R::from_sys(r),
            Temp::Dir if r == 0 => R::from_ptr(template),
            Temp::Dir => R::from_sys(-1),
        }
    };
    let name = CPath(template.cast_const());
    let resolved = Cell::new(None);
    let pre = |s| {
        let Some(t) = name.bytes() else { return Pending::Nothing };
        let (pending, abs) = rec::before_mktemp(s, ME, call, t);
        resolved.set(abs);
        pending
    };
    let result = journaled(call, name, pre, real);
    injected_kill_after(call);
    if result.succeeded() {
        after_call(call, || {
            if let (Some(s), Some(p)) = (store(), name.bytes()) {
                // The call left the name it chose in the caller's template buffer.
                ops::after_created(s, call, p, resolved.take().as_ref(), result.fd());
            }
        });
    }
    // Freed here whatever happened (a block is always freed where it came from).
    drop(resolved);
    result
}

pub fn truncate_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, path: CPath) -> R {
    journaled(call, path, |s| path.bytes().map_or(Pending::Nothing, |p| rec::before_truncate(s, ME, call, p)), real)
}

/// A change to a file's bytes through a descriptor (ftruncate, fallocate): nothing to journal
/// when the file is already journaled whole, else its contents through its path.
pub fn fd_change<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, fd: c_int) -> R {
    let Some(st) = ops::uncovered_fd(fd) else { return real(Account::Journaled) };
    journaled(call, CPath::NONE, |s| rec::before_fd_change(s, ME, call, fd, &st), real)
}

/// posix_fallocate returns an error number instead of setting errno.
pub fn posix_fallocate_(call: &'static str, real: impl FnOnce(Account) -> c_int, fd: c_int) -> c_int {
    let Some(st) = ops::uncovered_fd(fd) else { return real(Account::Journaled) };
    let pre = |s| rec::before_fd_change(s, ME, call, fd, &st);
    journaled_with(call, CPath::NONE, || false, pre, real, |r| (*r == 0, None), |errno| errno)
}

pub fn rename_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    olddirfd: c_int,
    old: CPath,
    newdirfd: c_int,
    new: CPath,
    flags: c_uint,
) -> R {
    let pre = |s| match (old.bytes(), new.bytes()) {
        (Some(o), Some(n)) => rec::before_rename(s, ME, call, olddirfd, o, newdirfd, n, flags),
        _ => Pending::Nothing,
    };
    let r = journaled(call, old, pre, real);
    ops::names_changed_after_call();
    r
}

fn remove_as<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    removes: Removes,
) -> R {
    let pre = |s| path.bytes().map_or(Pending::Nothing, |p| rec::before_remove(s, ME, call, dirfd, p, removes));
    let r = journaled(call, path, pre, real);
    ops::names_changed_after_call();
    r
}

/// unlink, unlinkat, rmdir.
pub fn remove_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    flags: c_int,
) -> R {
    let removes = if flags & libc::AT_REMOVEDIR != 0 { Removes::Dir } else { Removes::NonDir };
    remove_as(call, real, dirfd, path, removes)
}

/// remove: a file or an empty directory.
pub fn remove_either<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, path: CPath) -> R {
    remove_as(call, real, libc::AT_FDCWD, path, Removes::Either)
}

/// A call that creates a name and fails if it exists (mkdir, link, symlink, mknod, mkfifo and
/// their *at forms).
pub fn create_at<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, dirfd: c_int, path: CPath) -> R {
    journaled(
        call,
        path,
        |s| path.bytes().map_or(Pending::Nothing, |p| rec::before_create(s, ME, call, dirfd, p)),
        real,
    )
}

/// link/linkat: a new name for `old` (see `before_link`: a source in the store is refused).
#[allow(clippy::too_many_arguments)]
pub fn link_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    olddirfd: c_int,
    old: CPath,
    newdirfd: c_int,
    new: CPath,
    flags: c_int,
) -> R {
    let follow = flags & libc::AT_SYMLINK_FOLLOW != 0;
    journaled(
        call,
        new,
        |s| match (old.bytes(), new.bytes()) {
            (Some(o), Some(n)) => rec::before_link(s, ME, call, olddirfd, o, newdirfd, n, follow),
            _ => Pending::Nothing,
        },
        real,
    )
}

/// Whether a path argument is empty (its first byte is the NUL), without measuring it.
fn is_empty(path: CPath) -> bool {
    // SAFETY: a non-null path argument is a NUL-terminated string (the call's contract), so its
    // first byte is readable.
    !path.0.is_null() && unsafe { *path.0 } == 0
}

/// A metadata change by name relative to `dirfd` (`flags` may hold AT_SYMLINK_NOFOLLOW, and
/// AT_EMPTY_PATH makes it a change of `dirfd` itself). A null path is not `dirfd` itself here:
/// the call fails with EFAULT.
pub fn meta_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    flags: c_int,
    what: MetaKind,
) -> R {
    meta_of(call, real, dirfd, path, flags, what, CPath::NONE, false)
}

/// utimensat and futimesat: a null path means `dirfd` itself.
pub fn times_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    flags: c_int,
) -> R {
    meta_of(call, real, dirfd, path, flags, MetaKind::Times, CPath::NONE, true)
}

/// setxattr, lsetxattr, removexattr, lremovexattr (`flags`: AT_SYMLINK_NOFOLLOW for the `l`
/// forms).
pub fn xattr_at<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    path: CPath,
    name: CPath,
    flags: c_int,
) -> R {
    if name.0.is_null() {
        return real(Account::AsIs);
    }
    meta_of(call, real, libc::AT_FDCWD, path, flags, MetaKind::Xattr, name, false)
}

#[allow(clippy::too_many_arguments)]
fn meta_of<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    flags: c_int,
    what: MetaKind,
    xattr: CPath,
    null_is_dirfd: bool,
) -> R {
    let null = path.0.is_null();
    if (null && null_is_dirfd) || (is_empty(path) && flags & libc::AT_EMPTY_PATH != 0) {
        return fd_meta_of(call, real, dirfd, what, xattr);
    }
    if null || is_empty(path) {
        // EFAULT, or ENOENT for an empty path without AT_EMPTY_PATH.
        return real(Account::AsIs);
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    let pre = |s| match path.bytes() {
        Some(p) => rec::before_meta(s, ME, call, dirfd, p, follow, what, xattr.bytes()),
        None => Pending::Nothing,
    };
    journaled(call, path, pre, real)
}

/// fchmod, fchown, futimens, futimes.
pub fn fd_meta<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, fd: c_int, what: MetaKind) -> R {
    fd_meta_of(call, real, fd, what, CPath::NONE)
}

/// fsetxattr, fremovexattr.
pub fn fd_xattr<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, fd: c_int, name: CPath) -> R {
    if name.0.is_null() {
        return real(Account::AsIs);
    }
    fd_meta_of(call, real, fd, MetaKind::Xattr, name)
}

/// A metadata change through a descriptor: nothing to journal when the file is already
/// journaled whole (no guard needed to find that out), else its prior metadata.
fn fd_meta_of<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    fd: c_int,
    what: MetaKind,
    xattr: CPath,
) -> R {
    let Some(st) = ops::uncovered_fd(fd) else { return real(Account::Journaled) };
    journaled(call, CPath::NONE, |s| rec::before_fd_meta(s, ME, call, fd, &st, what, xattr.bytes()), real)
}

/// ioctl: only the requests that change a file's attributes are journaled (chattr's flags;
/// what FS_IOC_FSSETXATTR sets is not kept, so it is journaled as irreversible).
pub fn ioctl_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, fd: c_int, request: c_ulong) -> R {
    use rec::{FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS};
    let request = request as u32;
    if request != FS_IOC_SETFLAGS && request != FS_IOC32_SETFLAGS && request != FS_IOC_FSSETXATTR {
        return real(Account::AsIs);
    }
    let Some(st) = ops::uncovered_fd(fd) else { return real(Account::Journaled) };
    let pre = |s| {
        if request == FS_IOC_FSSETXATTR {
            return rec::not_kept(s, ME, call, fd, "the attributes FS_IOC_FSSETXATTR sets are not kept");
        }
        rec::before_fd_flags(s, ME, call, fd, &st)
    };
    journaled(call, CPath::NONE, pre, real)
}
