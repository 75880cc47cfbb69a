//! The shim's side of the journaling logic: the calling process as
//! [`aether_journal_recorder::ops`] sees it ([`caller`]), the destinations it already sent to
//! ([`destinations`]), and the work only the process that made a call can do after it (learn
//! the file an open created, undo a capture whose call failed).
//! What each call journals before it runs is the recorder's, shared with the supervisor.
//!
//! What this module cannot do: journal a call whose target it cannot name (see the
//! recorder), or learn the result of a call it did not make.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;

use aether_journal_recorder::index::Origin;
use aether_journal_recorder::ops::{birth_of, refuse};
use journal_core::capture::ident_of;
use journal_core::config::Policy;
use journal_core::record::{Op, UnobservedReason};
use rustix::fs::{AtFlags, CWD, Stat};

pub use aether_journal_recorder::ops::Pending;

use crate::state::Store;
use caller::{BIRTH_TIMES, EXCLUSIVE_FAILED};

mod caller;
pub(crate) mod destinations;

pub use caller::{ME, names_changed_after_call};
pub use destinations::forget_destinations;

/// After a call that created a name we could only learn from its result (the mkstemp
/// family, mkdtemp): it did not exist before, so undo removes it. `template` is the absolute
/// template journaled before the call, which names the directory without a system call and
/// keeps the window in which a killed process leaves an intent nothing completes as short as
/// it can be.
pub fn after_created(store: &Store, call: &str, path: &[u8], template: Option<&journal_core::BPath>, fd: Option<i32>) {
    let Some(abs) = aether_journal_recorder::ops::temp_name_target(store, ME, call, path, template) else { return };
    let created = store.record(call, Op::Change { path: abs, before: journal_core::Before::Absent });
    // Undo removes it whole: later descriptor changes to it need no records, and other
    // processes' rewrites of it no captures (the table is mapped for learn_created).
    let _ = store.born();
    after(store, call, Pending::Created { created, looked: true }, true, 0, fd);
}

/// Before setuid/seteuid/setreuid/setresuid: a switch to a user that cannot write the
/// session store (anyone but its owner and root) leaves this process and its children
/// unobserved. Say so while the store can still be written. Under a supervisor nothing
/// changes: it still sees every call the process makes, whoever it runs as.
pub fn before_uid_change(store: &Store, call: &str, new_euid: u32) -> Pending {
    if crate::state::config().supervised {
        return Pending::Nothing;
    }
    let current = rustix::process::geteuid().as_raw();
    if new_euid == u32::MAX || new_euid == current || new_euid == store.owner_uid || new_euid == 0 {
        return Pending::Nothing;
    }
    let reason = UnobservedReason::CredentialsChanged { uid: new_euid, store_owner: store.owner_uid };
    if store.settings.policy == Policy::Strict {
        return refuse(store, call, format!("{call} to uid {new_euid}: {reason}"), libc::EPERM);
    }
    Pending::Recorded(store.record(call, Op::Unobserved { program: store.prog.clone(), reason: Box::new(reason) }))
}

/// Before io_uring_setup: file operations submitted through the ring bypass every hook. A
/// supervisor sees the call too, and journals it (or refuses it) itself.
pub fn before_io_uring(store: &Store, call: &str) -> Pending {
    if crate::state::config().supervised {
        return Pending::NotJournaled;
    }
    let reason = UnobservedReason::IoUring;
    if store.settings.policy == Policy::Strict {
        return refuse(store, call, format!("{call}: {reason}"), libc::EPERM);
    }
    Pending::Recorded(store.record(call, Op::Unobserved { program: store.prog.clone(), reason: Box::new(reason) }))
}

/// The `stat` of the file behind `fd` when a change through the descriptor must be journaled;
/// `None` when it need not be: the descriptor came from an open that created its file (no
/// system call at all), the file is already journaled whole by this process, or `fd` is not
/// open (the call fails with EBADF). Guard-free: one raw `fstat` (no libc call that could
/// re-enter a hook, errno untouched) and a lock-free lookup. The `before_fd_*` functions take
/// this `stat` instead of asking again.
#[inline]
pub fn uncovered_fd(fd: i32) -> Option<Stat> {
    crate::covered::check_turn();
    if crate::fdmemo::created(fd) {
        return None;
    }
    // SAFETY: `fd` is the caller's descriptor, open for the duration of its call; fstat on a
    // number that is not open fails with EBADF and changes nothing.
    rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok().filter(|st| !crate::covered::contains(ident_of(st)))
}

/// Remembers the file an open returned as covered (raw `statx`, lock-free inserts), and the
/// descriptor as one that came from a creating open, unless this is a `vfork` child: its
/// descriptors are not its parent's, but the memo's memory is.
///
/// The file is also marked born in the session's shared index when this process has mapped
/// it (the open that created the file mapped it under the guard): one raw `statx`, which
/// costs what the `fstat` it replaces did, and lock-free atomic stores.
fn learn_created(store: &Store, fd: Option<i32>, origin: Origin) {
    if let Some(fd) = fd.filter(|&fd| fd >= 0) {
        // SAFETY: the descriptor the real open just returned to the caller.
        let file = unsafe { BorrowedFd::borrow_raw(fd) };
        let Some((ident, btime)) =
            birth_of(file, b"", AtFlags::EMPTY_PATH).map(|(id, b)| (id, Some(b))).or_else(|| {
                // No birth times here: learn the inode only.
                rustix::fs::fstat(file).ok().map(|st| (ident_of(&st), None))
            })
        else {
            return;
        };
        let births = if btime.is_some() { 1 } else { 2 };
        if BIRTH_TIMES.load(Ordering::Relaxed) != births {
            BIRTH_TIMES.store(births, Ordering::Relaxed);
        }
        crate::covered::insert(ident);
        if let (Some(btime), Some(index)) = (btime, store.born_mapped()) {
            index.remember_origin(ident, btime, origin);
        }
        if crate::state::owns_memory() {
            crate::fdmemo::remember(fd);
        }
    }
}

/// The part of [`after`] that needs no guard: a call that succeeded leaves a capture or a record
/// as it is, and a created file is learned with a raw `statx` and lock-free inserts. Returns
/// what is left for [`after`] (under the guard), if anything.
pub fn after_quick(store: &Store, pending: Pending, succeeded: bool, fd: Option<i32>) -> Option<Pending> {
    match pending {
        Pending::Created { created, .. } if succeeded => {
            learn_created(store, fd, Origin::Born(created));
            None
        }
        Pending::BornRewrite { origin, .. } if succeeded => {
            learn_created(store, fd, origin);
            None
        }
        Pending::Created { looked: true, .. } => None,
        Pending::MovedAside { seq, .. } if succeeded => {
            learn_created(store, fd, Origin::Born(seq));
            None
        }
        Pending::Nothing | Pending::NotJournaled | Pending::Refuse(_) => None,
        Pending::Recorded(_) | Pending::Linked { .. } if succeeded => None,
        other => Some(other),
    }
}

/// After the real call: undo what the capture did to the world if the call failed, and learn
/// what it created. `fd` is the descriptor an open returned.
pub fn after(store: &Store, call: &str, pending: Pending, succeeded: bool, errno: i32, fd: Option<i32>) {
    match pending {
        Pending::Created { created, looked } => {
            if succeeded {
                learn_created(store, fd, Origin::Born(created));
            } else if !looked {
                EXCLUSIVE_FAILED.store(true, Ordering::Relaxed);
                store.record(call, Op::CallFailed { of_seq: created, errno });
            }
        }
        Pending::BornRewrite { seq, origin } => {
            if succeeded {
                learn_created(store, fd, origin);
            } else {
                store.record(call, Op::CallFailed { of_seq: seq, errno });
            }
        }
        Pending::MovedAside { blob, seq, path } => {
            if succeeded {
                learn_created(store, fd, Origin::Born(seq));
            } else if store
                .blobs
                .with(|b| crate::kernel::rename(b, blob.as_bytes(), CWD, path.as_bytes()))
                .is_some_and(|r| r.is_ok())
            {
                // The original is back where it was: the step changed nothing.
                store.record(call, Op::CallFailed { of_seq: seq, errno });
            }
        }
        Pending::Nothing | Pending::NotJournaled | Pending::Refuse(_) => {}
        Pending::Connect(peer) => aether_journal_recorder::effects::after_connect(store, call, peer, succeeded, errno),
        Pending::Recorded(seq) => {
            if !succeeded {
                store.record(call, Op::CallFailed { of_seq: seq, errno });
            }
        }
        Pending::Linked { blob, seq } => {
            if !succeeded {
                store.record(call, Op::CallFailed { of_seq: seq, errno });
                let _ = store.blobs.with(|fd| crate::kernel::unlink(fd, blob.as_bytes(), AtFlags::empty()));
            }
        }
    }
}
