//! Handlers that journal nothing but keep the shim's per-process knowledge true: descriptors
//! let go (forgotten by [`crate::fdmemo`]), the working directory or root changed (remembered
//! directory paths dropped, [`crate::dircache`]), and a child reaped (the moment a parent
//! opens the store its `vfork` children asked for, [`crate::state`]).
//!
//! What this module cannot do: notice a descriptor closed, or a directory changed, behind
//! libc's names (an inline system call, io_uring).

use std::ffi::{c_int, c_uint};

use libc::{DIR, FILE};

use super::Account;
use crate::guard::{errno, set_errno};

/// close, dup2, dup3: forgets the descriptor being closed or replaced, then calls.
pub fn forget<R>(_call: &'static str, real: impl FnOnce(Account) -> R, fd: c_int) -> R {
    crate::fdmemo::forget(fd);
    real(Account::AsIs)
}

/// close_range, closefrom.
pub fn forget_range<R>(_call: &'static str, real: impl FnOnce(Account) -> R, first: c_uint, last: c_uint) -> R {
    crate::fdmemo::forget_range(first, last);
    real(Account::AsIs)
}

/// The descriptor behind a stream, errno untouched (`fileno` sets it for a stream without one).
pub fn stream_fd(stream: *mut FILE) -> c_int {
    if stream.is_null() {
        return -1;
    }
    let saved = errno();
    // SAFETY: a non-null stream the caller is about to close or reopen, valid for this call;
    // fileno only reads it.
    let fd = unsafe { libc::fileno(stream) };
    set_errno(saved);
    fd
}

pub fn forget_stream(_call: &'static str, real: impl FnOnce(Account) -> c_int, stream: *mut FILE) -> c_int {
    crate::fdmemo::forget(stream_fd(stream));
    real(Account::AsIs)
}

pub fn forget_all(_call: &'static str, real: impl FnOnce(Account) -> c_int) -> c_int {
    crate::fdmemo::forget_all();
    real(Account::AsIs)
}

pub fn forget_dir(_call: &'static str, real: impl FnOnce(Account) -> c_int, dir: *mut DIR) -> c_int {
    if !dir.is_null() {
        let saved = errno();
        // SAFETY: a non-null directory stream the caller is about to close; dirfd only reads it.
        crate::fdmemo::forget(unsafe { libc::dirfd(dir) });
        set_errno(saved);
    }
    real(Account::AsIs)
}

/// chdir, fchdir: nothing to journal, but relative paths lead elsewhere from now on. Under a
/// supervisor the shim makes the call itself, marked, once it has moved the session's
/// working-directory generation (which tells the supervisor what the call would have, without
/// a round trip), and counts it done after (the supervisor trusts nothing it checks while the
/// two counts differ); when it cannot, the call is made as it came, for the supervisor to see.
pub fn cwd_change<R>(_call: &'static str, real: impl FnOnce(Account) -> R) -> R {
    // Before and after: a thread naming a directory meanwhile sees one or the other.
    crate::dircache::cwd_changed();
    let marked = super::supervised() && crate::state::cwd_changing();
    let r = real(if marked { Account::Journaled } else { Account::AsIs });
    if marked {
        crate::state::cwd_changed();
    }
    crate::dircache::cwd_changed();
    r
}

/// chroot: as [`cwd_change`], but always made as it came (the supervisor sees every one).
pub fn root_change<R>(_call: &'static str, real: impl FnOnce(Account) -> R) -> R {
    crate::dircache::cwd_changed();
    let r = real(Account::AsIs);
    crate::dircache::cwd_changed();
    r
}

/// The wait family.
pub fn reap<R>(_call: &'static str, real: impl FnOnce(Account) -> R) -> R {
    crate::state::open_store_children_need();
    real(Account::AsIs)
}
