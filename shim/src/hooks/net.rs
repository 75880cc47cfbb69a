//! Handlers of the calls that reach other endpoints: connects, and datagrams sent to an
//! explicit destination. Their addresses are read under the guard (see [`crate::effects`] for
//! what is journaled).
//!
//! What this module cannot do: see traffic over a socket connected before the session, or
//! sends without a destination (they go where an earlier, journaled connect said).

use std::ffi::c_uint;

use libc::{mmsghdr, msghdr, sockaddr, socklen_t};

use super::{Account, CPath, Ret, journaled};
use crate::ops::{ME, Pending};
use crate::state::Store;

/// The bytes of a caller's socket address (at most `sockaddr_storage`'s size).
///
/// # Safety
/// `addr` must be null or point to `len` readable bytes (the socket calls' contract).
unsafe fn sockaddr_bytes<'a>(addr: *const sockaddr, len: socklen_t) -> Option<&'a [u8]> {
    let len = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: non-null and `len` readable bytes (caller's obligation).
    (!addr.is_null() && len >= 2).then(|| unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) })
}

/// The endpoint a socket address names, if it is one that is journaled.
fn endpoint(addr: *const sockaddr, len: socklen_t) -> Option<journal_core::record::Endpoint> {
    // SAFETY: the socket calls' contract: `addr` is null or points to `len` bytes.
    unsafe { sockaddr_bytes(addr, len) }.and_then(aether_journal_recorder::effects::parse_endpoint)
}

/// The destination of a message header, if it names one.
///
/// # Safety
/// `msg` must be null or point to a valid `msghdr`.
unsafe fn msg_destination(msg: *const msghdr) -> Option<journal_core::record::Endpoint> {
    if msg.is_null() {
        return None;
    }
    // SAFETY: a valid msghdr (caller's obligation).
    let (name, len) = unsafe { ((*msg).msg_name as *const sockaddr, (*msg).msg_namelen) };
    endpoint(name, len)
}

pub fn connect_<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    addr: *const sockaddr,
    len: socklen_t,
) -> R {
    let pre = |s| {
        endpoint(addr, len)
            .map_or(Pending::Nothing, |ep| aether_journal_recorder::effects::before_connect(s, ME, call, ep))
    };
    journaled(call, CPath::NONE, pre, real)
}

pub fn sendto_<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    addr: *const sockaddr,
    len: socklen_t,
) -> R {
    if addr.is_null() {
        return real(Account::AsIs);
    }
    let pre = |s| {
        endpoint(addr, len)
            .map_or(Pending::Nothing, |ep| aether_journal_recorder::effects::before_send(s, ME, call, ep))
    };
    journaled(call, CPath::NONE, pre, real)
}

pub fn sendmsg_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, msg: *const msghdr) -> R {
    // SAFETY: sendmsg's contract: a non-null `msg` points to a valid msghdr.
    if msg.is_null() || unsafe { (*msg).msg_name.is_null() } {
        // No destination: nothing to journal (a supervisor would find none either).
        return real(Account::Journaled);
    }
    let pre = |s| {
        // SAFETY: sendmsg's contract: `msg` points to a valid msghdr.
        unsafe { msg_destination(msg) }
            .map_or(Pending::Nothing, |ep| aether_journal_recorder::effects::before_send(s, ME, call, ep))
    };
    journaled(call, CPath::NONE, pre, real)
}

pub fn sendmmsg_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, msgs: *mut mmsghdr, vlen: c_uint) -> R {
    let pre = |s: &'static Store| {
        let mut dests = Vec::new();
        if !msgs.is_null() {
            for i in 0..vlen.min(1024) as usize {
                // SAFETY: sendmmsg's contract: `msgs` points to `vlen` valid mmsghdr entries.
                if let Some(ep) = unsafe { msg_destination(&(*msgs.add(i)).msg_hdr) }
                    && !dests.contains(&ep)
                {
                    dests.push(ep);
                }
            }
        }
        for ep in dests {
            if let Pending::Refuse(e) = aether_journal_recorder::effects::before_send(s, ME, call, ep) {
                return Pending::Refuse(e);
            }
        }
        Pending::Nothing
    };
    journaled(call, CPath::NONE, pre, real)
}

/// bind: a Unix socket's name (not an abstract one) is a file the call creates, and undo
/// removes it.
pub fn bind_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, addr: *const sockaddr, len: socklen_t) -> R {
    // SAFETY: bind's contract: `addr` points to `len` bytes (null fails with EFAULT).
    let Some(sa) = (unsafe { sockaddr_bytes(addr, len) }) else { return real(Account::AsIs) };
    let (family, path) = match sa {
        [a, b, path @ ..] => (i32::from(u16::from_ne_bytes([*a, *b])), path),
        _ => (libc::AF_UNSPEC, &[][..]),
    };
    if family != libc::AF_UNIX || path.first().is_none_or(|&b| b == 0) {
        // Not a name in the file system: nothing to journal.
        return real(Account::Journaled);
    }
    let pre = |s| {
        let path = path.split(|&b| b == 0).next().unwrap_or(path);
        aether_journal_recorder::ops::before_create(s, ME, call, libc::AT_FDCWD, path)
    };
    journaled(call, CPath::NONE, pre, real)
}
