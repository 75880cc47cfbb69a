//! Metadata changed by name or through a descriptor: mode, owner, times, extended attributes.

use aether_journal::BPath;
use aether_journal::capture::{ident_of, meta_before, xattr_value};
use aether_journal::record::{Bytes, MetaKind, Op, XattrBefore};
use rustix::fs::Stat;
use rustix::io::Errno;

use super::{Caller, Journal, Pending, existing_target, irreversible, protect};

/// Before a call that changes a node's metadata by name (chmod, chown, utime, setxattr and
/// their variants): the part it changes, so undo can set it back.
#[allow(clippy::too_many_arguments)]
pub fn before_meta<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    dirfd: i32,
    path: &[u8],
    follow: bool,
    what: MetaKind,
    xattr: Option<&[u8]>,
) -> Pending {
    let (t, st) = match existing_target(journal, caller, call, dirfd, path, follow) {
        Ok(x) => x,
        Err(p) => return p,
    };
    if caller.covered(ident_of(&st)) {
        return Pending::Nothing;
    }
    let xattr = match xattr {
        None => None,
        Some(name) => match xattr_value(t.abs.as_bytes(), name) {
            Ok(value) => Some(XattrBefore { name: BPath::new(name.to_vec()), value: value.map(Bytes) }),
            Err(e) => return irreversible(journal, call, t.abs, "read the extended attribute", e.to_string()),
        },
    };
    journal.record(call, Op::Meta { path: t.abs, before: meta_before(&st, what, xattr).into() });
    Pending::Nothing
}

/// Before a call that changes metadata through a descriptor (fchmod, fchown, futimens,
/// fsetxattr, ...): the descriptor is named through its caller (`st`: its `stat`).
#[allow(clippy::too_many_arguments)]
pub fn before_fd_meta<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    fd: i32,
    st: &Stat,
    what: MetaKind,
    xattr: Option<&[u8]>,
) -> Pending {
    let Ok(path) = caller.fd_path(fd) else { return Pending::Nothing };
    if journal.protected(&path) {
        return protect(journal, call, &BPath::new(path));
    }
    if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") || journal.excluded(&path) {
        // Not a named file in the tree (a pipe, a socket, an unlinked file).
        return Pending::Nothing;
    }
    let xattr = match xattr {
        None => None,
        Some(name) => {
            let value = match caller.fd_xattr(fd, name) {
                Ok(v) => v.map(Bytes),
                Err(Errno::NODATA) | Err(Errno::NOTSUP) => None,
                Err(e) => {
                    irreversible(
                        journal,
                        call,
                        BPath::new(path),
                        "read the extended attribute",
                        std::io::Error::from(e).to_string(),
                    );
                    return Pending::Nothing;
                }
            };
            Some(XattrBefore { name: BPath::new(name.to_vec()), value })
        }
    };
    journal.record(call, Op::Meta { path: BPath::new(path), before: meta_before(st, what, xattr).into() });
    Pending::Nothing
}

/// `ioctl(2)` requests that change a file's attributes: `FS_IOC_SETFLAGS` (chattr), its
/// 32-bit alias, and `FS_IOC_FSSETXATTR`.
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// See [`FS_IOC_SETFLAGS`].
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// See [`FS_IOC_SETFLAGS`].
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// Before `ioctl(fd, FS_IOC_SETFLAGS)` (chattr): the inode flags the call replaces.
pub fn before_fd_flags<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, fd: i32, st: &Stat) -> Pending {
    let Ok(path) = caller.fd_path(fd) else { return Pending::Nothing };
    if journal.protected(&path) {
        return protect(journal, call, &BPath::new(path));
    }
    if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") || journal.excluded(&path) {
        return Pending::Nothing;
    }
    let flags = match caller.fd_flags(fd) {
        Ok(f) => f,
        // No inode flags here (ENOTTY, EOPNOTSUPP): the call fails the same way.
        Err(Errno::NOTTY | Errno::NOTSUP | Errno::BADF | Errno::INVAL) => return Pending::Nothing,
        Err(e) => {
            return irreversible(
                journal,
                call,
                BPath::new(path),
                "read the attributes",
                std::io::Error::from(e).to_string(),
            );
        }
    };
    let mut before = meta_before(st, MetaKind::Flags, None);
    before.flags = Some(flags);
    journal.record(call, Op::Meta { path: BPath::new(path), before: before.into() });
    Pending::Nothing
}

/// Before a call that changes what the journal cannot keep of the file open as `fd` (the
/// attributes `FS_IOC_FSSETXATTR` sets): an irreversible record naming it (refused under the
/// strict policy).
pub fn not_kept<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, fd: i32, why: &str) -> Pending {
    let Ok(path) = caller.fd_path(fd) else { return Pending::Nothing };
    if journal.protected(&path) {
        return protect(journal, call, &BPath::new(path));
    }
    if path.first() != Some(&b'/') || journal.excluded(&path) {
        return Pending::Nothing;
    }
    irreversible(journal, call, BPath::new(path), "capture", why.into())
}
