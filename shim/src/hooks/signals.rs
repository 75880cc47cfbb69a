//! Handlers of signals: those sent to other processes (journaled, see [`crate::effects`]), and
//! the handlers a program installs (only learned, see [`crate::guard`]: signals are held back
//! around the shim's own work once the program has one).
//!
//! What this module cannot do: learn a handler installed behind libc's names (an inline
//! `rt_sigaction` system call).

use std::ffi::c_int;

use libc::{pid_t, sighandler_t};

use super::{Account, CPath, Ret, journaled};
use crate::ops::ME;

/// `struct sigaction` (its libc name is also the hooked function's).
type SigAction = libc::sigaction;

pub fn kill_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, pid: pid_t, sig: c_int) -> R {
    if sig == 0 {
        return real(Account::AsIs); // a liveness probe changes nothing
    }
    journaled(
        call,
        CPath::NONE,
        |s| aether_journal_recorder::effects::before_signal(s, ME, call, pid as i64, sig),
        real,
    )
}

pub fn killpg_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, pgrp: pid_t, sig: c_int) -> R {
    if sig == 0 {
        return real(Account::AsIs);
    }
    let target = if pgrp == 0 { 0 } else { -(pgrp as i64) };
    journaled(call, CPath::NONE, |s| aether_journal_recorder::effects::before_signal(s, ME, call, target, sig), real)
}

/// sigaction: notes the handler being installed (before it can run), then installs it.
pub fn sigaction_<R>(_call: &'static str, real: impl FnOnce(Account) -> R, sig: c_int, act: *const SigAction) -> R {
    if !act.is_null() {
        // SAFETY: sigaction's contract: a non-null `act` points to a struct sigaction.
        crate::guard::note_disposition(sig, unsafe { (*act).sa_sigaction });
    }
    real(Account::AsIs)
}

/// `syscall(SYS_rt_sigaction, ...)`: the kernel's struct sigaction starts with the handler.
pub fn rt_sigaction_<R>(
    _call: &'static str,
    real: impl FnOnce(Account) -> R,
    sig: c_int,
    act: *const sighandler_t,
) -> R {
    if !act.is_null() {
        // SAFETY: rt_sigaction's contract: a non-null second argument points to a kernel
        // struct sigaction, whose first member is the handler.
        crate::guard::note_disposition(sig, unsafe { *act });
    }
    real(Account::AsIs)
}

/// signal and its aliases, sigset: as [`sigaction_`].
pub fn signal_(
    _call: &'static str,
    real: impl FnOnce(Account) -> sighandler_t,
    sig: c_int,
    disposition: sighandler_t,
) -> sighandler_t {
    crate::guard::note_disposition(sig, disposition);
    real(Account::AsIs)
}
