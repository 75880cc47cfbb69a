//! Capturing a path's prior state before a call changes it.
//!
//! Given the directory a target lives in and its name, [`Capturer::capture`] returns the
//! [`Before`] to journal, keeping the bytes in the session's `blobs/` directory when the call
//! could destroy them. Strategies, cheapest first:
//!
//! - the name is about to be removed or replaced (unlink, rename over): hard-link the doomed
//!   inode into the store. No byte is copied, and undo moves the very same inode back;
//! - bytes are only going to be appended: record the length only;
//! - bytes may change in place (open for writing, truncate): clone with `FICLONE` where the
//!   file system can, otherwise copy while hashing;
//! - directories, symlinks and special nodes: their metadata and link target.
//!
//! Every capture that cannot be made, or that the budgets forbid, becomes
//! [`Before::Irreversible`] with the reason: nothing is skipped silently.
//!
//! All I/O goes through `rustix` (raw system calls), so a capture made inside the shim never
//! re-enters the shim's own hooks.
//!
//! What this module cannot do: capture atomically with respect to other processes. A file
//! changed by a process outside the session while it is being copied is kept as read.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat, XattrFlags};
use rustix::io::Errno;

use crate::bpath::BPath;
use crate::config::Budget;
use crate::record::{
    Before, Bytes, CaptureHow, Ident, MetaBefore, MetaKind, Node, Reason, Snapshot, SpecialKind, Xattr, XattrBefore,
};

/// Where ids and the running total of kept bytes come from (shared memory in the shim, plain
/// atomics in tests).
pub trait Counters {
    /// A new session-unique id (blob names and record sequence numbers).
    fn next_id(&self) -> u64;
    /// Bytes kept so far in this session.
    fn bytes_kept(&self) -> u64;
    /// Adds to the bytes kept.
    fn add_bytes_kept(&self, n: u64);
}

/// The calls that change files, as a capture makes them: into the store (a blob linked, copied
/// or removed, a shard made) and, for a file moved aside, in the file's own directory.
///
/// [`Direct`] makes them as plain system calls. The shim supplies its own: under a supervisor,
/// every change the shim makes itself carries the session's marker, so that the supervisor
/// does not journal the shim's own work as the program's.
pub trait FsCalls: Sync {
    /// `openat(2)`.
    fn openat(&self, dir: BorrowedFd<'_>, path: &CStr, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno>;
    /// `linkat(2)`.
    fn linkat(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &CStr,
        new_dir: BorrowedFd<'_>,
        new: &CStr,
        flags: AtFlags,
    ) -> Result<(), Errno>;
    /// `unlinkat(2)`.
    fn unlinkat(&self, dir: BorrowedFd<'_>, path: &CStr, flags: AtFlags) -> Result<(), Errno>;
    /// `mkdirat(2)`.
    fn mkdirat(&self, dir: BorrowedFd<'_>, path: &CStr, mode: Mode) -> Result<(), Errno>;
    /// `renameat2(2)`.
    fn renameat(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &CStr,
        new_dir: BorrowedFd<'_>,
        new: &CStr,
        flags: RenameFlags,
    ) -> Result<(), Errno>;
    /// `fchmod(2)`.
    fn fchmod(&self, fd: BorrowedFd<'_>, mode: Mode) -> Result<(), Errno>;
    /// `fchown(2)`.
    fn fchown(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<(), Errno>;
    /// `fsetxattr(2)`.
    fn fsetxattr(&self, fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: XattrFlags) -> Result<(), Errno>;
    /// `fallocate(2)` with no mode flags.
    fn fallocate(&self, fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno>;
    /// `fremovexattr(2)`.
    fn fremovexattr(&self, fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno>;
    /// `openat2(2)` of a directory with `O_PATH`, following no symlink anywhere on the way
    /// (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`): `ELOOP` where a component is one,
    /// `ENOSYS` before Linux 5.6. How a resolver learns that a plain path is already the
    /// directory's canonical name ([`crate::resolve`]).
    fn open_dir_no_symlinks(&self, dir: BorrowedFd<'_>, path: &CStr) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            dir,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            rustix::fs::ResolveFlags::NO_SYMLINKS | rustix::fs::ResolveFlags::NO_MAGICLINKS,
        )
    }
}

/// [`FsCalls`] as plain system calls (through `rustix`).
pub struct Direct;

impl FsCalls for Direct {
    fn openat(&self, dir: BorrowedFd<'_>, path: &CStr, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        rustix::fs::openat(dir, path, flags, mode)
    }
    fn linkat(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &CStr,
        new_dir: BorrowedFd<'_>,
        new: &CStr,
        flags: AtFlags,
    ) -> Result<(), Errno> {
        rustix::fs::linkat(old_dir, old, new_dir, new, flags)
    }
    fn unlinkat(&self, dir: BorrowedFd<'_>, path: &CStr, flags: AtFlags) -> Result<(), Errno> {
        rustix::fs::unlinkat(dir, path, flags)
    }
    fn mkdirat(&self, dir: BorrowedFd<'_>, path: &CStr, mode: Mode) -> Result<(), Errno> {
        rustix::fs::mkdirat(dir, path, mode)
    }
    fn renameat(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &CStr,
        new_dir: BorrowedFd<'_>,
        new: &CStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        rustix::fs::renameat_with(old_dir, old, new_dir, new, flags)
    }
    fn fchmod(&self, fd: BorrowedFd<'_>, mode: Mode) -> Result<(), Errno> {
        rustix::fs::fchmod(fd, mode)
    }
    fn fchown(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<(), Errno> {
        rustix::fs::fchown(fd, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
    }
    fn fsetxattr(&self, fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: XattrFlags) -> Result<(), Errno> {
        rustix::fs::fsetxattr(fd, name, value, flags)
    }
    fn fallocate(&self, fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
        rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), offset, len)
    }
    fn fremovexattr(&self, fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        rustix::fs::fremovexattr(fd, name)
    }
}

/// [`FsCalls`] with byte paths, as the captures below use them.
impl dyn FsCalls + '_ {
    fn link(&self, old_dir: BorrowedFd<'_>, old: &[u8], new_dir: BorrowedFd<'_>, new: &[u8]) -> Result<(), Errno> {
        with_c_path(old, |o| with_c_path(new, |n| self.linkat(old_dir, o, new_dir, n, AtFlags::empty())))
    }
    fn remove(&self, dir: BorrowedFd<'_>, path: &[u8]) -> Result<(), Errno> {
        with_c_path(path, |p| self.unlinkat(dir, p, AtFlags::empty()))
    }
    fn open(&self, dir: BorrowedFd<'_>, path: &[u8], flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        with_c_path(path, |p| self.openat(dir, p, flags, mode))
    }
    fn exchange(&self, dir: BorrowedFd<'_>, a: &[u8], b: &[u8]) -> Result<(), Errno> {
        with_c_path(a, |x| with_c_path(b, |y| self.renameat(dir, x, dir, y, RenameFlags::EXCHANGE)))
    }
}

/// Runs `f` with `path` as a C string (on the stack when it is short), as rustix does.
pub fn with_c_path<T>(path: &[u8], f: impl FnOnce(&CStr) -> Result<T, Errno>) -> Result<T, Errno> {
    use rustix::path::Arg;
    path.into_with_c_str(f)
}

/// What identifies one state of a file well enough to reuse a capture of it: device, inode,
/// size, and modification and change times to the nanosecond. Any write, truncation, chmod,
/// chown or attribute change moves the change time, which no program can set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureKey {
    /// Device and inode.
    pub ident: Ident,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
}

impl CaptureKey {
    /// The key of a `stat` result.
    pub fn of(st: &Stat) -> Self {
        let ns = |s: i64, n: i64| s.wrapping_mul(1_000_000_000).wrapping_add(n);
        CaptureKey {
            ident: ident_of(st),
            size: st.st_size.max(0) as u64,
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec as i64),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec as i64),
        }
    }
}

/// The copies already made in this session, by the state they copied: a file about to be
/// changed again while its [`CaptureKey`] is unchanged refers to the earlier blob instead of
/// being copied again (a database opened read-write by every run of a tool, say). The shim
/// shares one index between all processes of a session.
pub trait CaptureIndex {
    /// The id of a blob holding exactly the state `key` describes, if one was recorded.
    fn find(&self, key: &CaptureKey) -> Option<u64>;
    /// Records that blob `id` holds the state `key` describes.
    fn remember(&self, key: &CaptureKey, id: u64);
}

/// Where a writer keeps small copies together, if it does ([`crate::pack`]).
pub trait Packer {
    /// Appends `bytes` to the writer's pack in `blobs` (begun there when it has none, or none
    /// with room for them), returning the pack's name and where the bytes start.
    fn append(&self, blobs: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<(String, u64)>;
}

/// What the call about to run will do to an existing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Bytes may change in place (open for writing or truncating, truncate, ftruncate).
    Overwrite,
    /// Bytes will only be added at the end (`O_WRONLY | O_APPEND`).
    Append,
    /// The name is about to be removed or replaced (unlink, rmdir, rename over).
    Destroy,
    /// The file is about to be truncated to nothing by an open with `O_TRUNC`: like
    /// [`Intent::Overwrite`], except that a big file may be moved aside instead of copied
    /// ([`MOVE_ASIDE_MIN`]).
    Truncate,
}

/// Files at least this big that an `O_TRUNC` open is about to empty are kept by moving their
/// inode into the store (one link, one exchange) instead of copying their bytes. Smaller ones
/// are copied: the copy is cheap and, unlike the move, leaves the file's inode number alone.
pub const MOVE_ASIDE_MIN: u64 = 1 << 20;

/// Files up to this size that an undo removes are copied into its pack for `redo` rather than
/// moved into its store ([`Capturer::capture_small_doomed`]): measured on ext4, the move's
/// directory insertion costs more than reading and appending this many bytes.
pub const DOOMED_PACK_MAX: u64 = 16 * 1024;

/// Captures prior states into one session's store.
pub struct Capturer<'a> {
    /// The session's `blobs/` directory.
    pub blobs: BorrowedFd<'a>,
    /// Capture limits.
    pub budget: Budget,
    /// Ids and byte accounting.
    pub counters: &'a dyn Counters,
    /// fsync each blob before returning (`AETHER_JOURNAL_SYNC=1`).
    pub sync: bool,
    /// Earlier copies that a capture of an unchanged file may reuse.
    pub index: Option<&'a dyn CaptureIndex>,
    /// How the capture makes its changes ([`Direct`] outside the shim).
    pub calls: &'a dyn FsCalls,
    /// Where copies of files up to [`crate::pack::PACK_MAX`] go, if not into files of their own.
    pub pack: Option<&'a dyn Packer>,
}

/// Identity and metadata of a `stat` result, as journaled.
pub fn snapshot_meta(st: &Stat, node: Node) -> Snapshot {
    Snapshot {
        node,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: [st.st_mtime, st.st_mtime_nsec as i64],
        atime: [st.st_atime, st.st_atime_nsec as i64],
        ident: ident_of(st),
        xattrs: None,
        links: 0,
    }
}

/// The number of names of a regular file, when it has more than one (see
/// [`Snapshot::links`]).
#[allow(clippy::unnecessary_cast)] // st_nlink is u64 on x86-64, u32 on AArch64.
fn extra_links(st: &Stat) -> u64 {
    if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink > 1 { st.st_nlink as u64 } else { 0 }
}

/// Device and inode of a `stat` result.
pub fn ident_of(st: &Stat) -> Ident {
    Ident { dev: st.st_dev, ino: st.st_ino }
}

/// The special-file kind of a file type, if it is one.
pub fn special_kind(ft: FileType) -> Option<SpecialKind> {
    match ft {
        FileType::Fifo => Some(SpecialKind::Fifo),
        FileType::Socket => Some(SpecialKind::Socket),
        FileType::CharacterDevice => Some(SpecialKind::Char),
        FileType::BlockDevice => Some(SpecialKind::Block),
        _ => None,
    }
}

fn failed(step: &str, e: impl std::fmt::Display) -> Before {
    Before::irreversible(Reason::CaptureFailed { step: step.into(), error: e.to_string() })
}

impl Capturer<'_> {
    /// Captures what `name` in `parent` is now, before a call with `intent` runs.
    pub fn capture(&self, parent: BorrowedFd<'_>, name: &[u8], intent: Intent) -> Before {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => self.capture_stat(parent, name, &st, intent),
            Err(Errno::NOENT) => Before::Absent,
            Err(e) => failed("stat", io::Error::from(e)),
        }
    }

    /// Like [`Capturer::capture`] when the caller already has the `lstat` result.
    pub fn capture_stat(&self, parent: BorrowedFd<'_>, name: &[u8], st: &Stat, intent: Intent) -> Before {
        let ft = FileType::from_raw_mode(st.st_mode);
        match ft {
            FileType::Directory => {
                let mut snap = snapshot_meta(st, Node::Dir);
                if intent == Intent::Destroy {
                    // An rmdir'd directory is recreated by undo: keep its attributes (ACLs).
                    snap.xattrs =
                        open_dir_nofollow_at(parent, name).ok().map(|fd| list_xattrs_fd(&fd).unwrap_or_default());
                }
                Before::contents(snap)
            }
            FileType::Symlink => match rustix::fs::readlinkat(parent, name, Vec::new()) {
                Ok(t) => Before::contents(snapshot_meta(st, Node::Symlink { target: BPath::new(t.into_bytes()) })),
                Err(e) => failed("read the symlink", io::Error::from(e)),
            },
            FileType::RegularFile => self.capture_file(parent, name, st, intent),
            other => {
                let kind = special_kind(other).unwrap_or(SpecialKind::Char);
                if intent == Intent::Destroy {
                    Before::contents(snapshot_meta(st, Node::Special { kind, rdev: st.st_rdev }))
                } else {
                    Before::irreversible(Reason::SpecialFile { kind })
                }
            }
        }
    }

    fn capture_file(&self, parent: BorrowedFd<'_>, name: &[u8], st: &Stat, intent: Intent) -> Before {
        if intent == Intent::Append {
            return Before::contents(snapshot_meta(st, Node::Prefix { len: st.st_size.max(0) as u64 }));
        }
        // What a copy writes: a sparse file's data, not its holes.
        let size = data_bytes(st);
        if size > self.budget.max_file {
            return Before::irreversible(Reason::OverFileBudget { size, limit: self.budget.max_file });
        }
        let used = self.counters.bytes_kept();
        if used.saturating_add(size) > self.budget.max_total {
            return Before::irreversible(Reason::OverTotalBudget { size, used, limit: self.budget.max_total });
        }
        if intent == Intent::Truncate
            && size >= MOVE_ASIDE_MIN
            && st.st_nlink == 1
            && let Some(before) = self.move_aside(parent, name, st)
        {
            return before;
        }
        if intent != Intent::Destroy {
            if let Some(before) = self.reuse(parent, name, st) {
                return before;
            }
            if let Some(packer) = self.pack.filter(|_| size <= crate::pack::PACK_MAX)
                && let Some(before) = self.pack_copy(parent, name, packer)
            {
                return before;
            }
        }
        let id = self.counters.next_id();
        let blob = blob_name(id);
        if intent == Intent::Destroy
            && in_shard(self.calls, self.blobs, &blob, || self.calls.link(parent, name, self.blobs, blob.as_bytes()))
                .is_ok()
        {
            // Describe the inode actually linked: another process may have swapped the name
            // between the stat and the link.
            let linked = match rustix::fs::statat(self.blobs, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(l) if FileType::from_raw_mode(l.st_mode) == FileType::RegularFile => l,
                _ => {
                    let _ = self.calls.remove(self.blobs, blob.as_bytes());
                    return failed("link into the store", "the file was replaced while being captured");
                }
            };
            let size = linked.st_size.max(0) as u64;
            self.counters.add_bytes_kept(size);
            if self.sync {
                sync_shard(self.blobs, &blob);
            }
            let node = Node::File { blob, size, hash: None, how: CaptureHow::Link, twin: None };
            return Before::contents(snapshot_meta(&linked, node));
        }
        match self.copy_into_store(parent, name, &blob) {
            Ok((how, hash, copied, fresh, xattrs)) => {
                self.counters.add_bytes_kept(copied.min(data_bytes(&fresh)));
                if let Some(index) = self.index
                    && copied == fresh.st_size.max(0) as u64
                {
                    index.remember(&CaptureKey::of(&fresh), id);
                }
                let node = Node::File { blob, size: copied, hash, how, twin: None };
                let mut snap = snapshot_meta(&fresh, node);
                snap.xattrs = Some(xattrs);
                snap.links = extra_links(&fresh);
                Before::contents(snap)
            }
            // It vanished between the stat and the capture (another process removed it): it
            // is absent now, which is what the call will find too.
            Err((_, e)) if e.kind() == io::ErrorKind::NotFound && is_gone(parent, name) => {
                let _ = self.calls.remove(self.blobs, blob.as_bytes());
                Before::Absent
            }
            Err((step, e)) => {
                let _ = self.calls.remove(self.blobs, blob.as_bytes());
                failed(step, e)
            }
        }
    }

    /// For a name about to be removed by a writer with a pack: a regular file of at most
    /// [`DOOMED_PACK_MAX`] bytes and no other name is copied into the pack, which costs less
    /// than linking or moving its inode into the store (a directory entry made there). `None`
    /// when `st` (its `lstat`) says it does not qualify, the writer has no pack, or it has
    /// grown since, or the copy could not be made (a file it may not read, a full store): capture
    /// it the usual way, which may still keep it whole (moving its inode needs neither). Undo
    /// puts it back as a new inode with the same bytes and metadata; a file with other names is
    /// never copied (they must keep sharing it).
    pub fn capture_small_doomed(&self, parent: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Option<Before> {
        let packer = self.pack?;
        let size = st.st_size.max(0) as u64;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
            || st.st_nlink != 1
            || size > DOOMED_PACK_MAX
            || self.counters.bytes_kept().saturating_add(size) > self.budget.max_total
        {
            return None;
        }
        match self.pack_copy(parent, name, packer)? {
            // Given another name since it was looked at: link it as any other file.
            Before::Contents(snap) if snap.links > 0 => None,
            before @ Before::Contents(_) => Some(before),
            _ => None,
        }
    }

    /// Copies a small file into the writer's pack: one read and one write, no file of its own.
    /// `None` when it has grown past [`crate::pack::PACK_MAX`] since it was looked at (the
    /// caller copies it into a blob instead).
    fn pack_copy(&self, parent: BorrowedFd<'_>, name: &[u8], packer: &dyn Packer) -> Option<Before> {
        let src = match open_for_capture(parent, name) {
            Ok(fd) => fd,
            // Removed between the stat and the capture: absent, as the call will find it.
            Err(e) if e.kind() == io::ErrorKind::NotFound && is_gone(parent, name) => return Some(Before::Absent),
            Err(e) => return Some(failed("open for reading", e)),
        };
        let st = match rustix::fs::fstat(&src) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => st,
            Ok(_) => return Some(failed("open for reading", "the file was replaced while being captured")),
            Err(e) => return Some(failed("stat", io::Error::from(e))),
        };
        let xattrs = match list_xattrs_fd(&src) {
            Ok(x) => x,
            Err(e) => return Some(failed("read extended attributes", e)),
        };
        let limit = crate::pack::PACK_MAX as usize;
        let mut bytes = vec![0u8; (st.st_size.max(0) as usize).min(limit) + 1];
        let mut len = 0;
        // A regular file reads short only at its end: a file of the size `fstat` gave costs one
        // read (the buffer is one byte longer).
        loop {
            match rustix::io::read(&src, &mut bytes[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(Errno::INTR) => continue,
                Err(e) => return Some(failed("read", io::Error::from(e))),
            }
            if len > limit {
                return None;
            }
            if len < bytes.len() {
                break;
            }
            bytes.resize(len * 2, 0);
        }
        bytes.truncate(len);
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let (pack, at) = match packer.append(self.blobs, &bytes) {
            Ok(placed) => placed,
            Err(e) => return Some(failed("write into a pack", e)),
        };
        let size = len as u64;
        self.counters.add_bytes_kept(size);
        let mut snap = snapshot_meta(&st, Node::Packed { pack, at, size, hash });
        snap.xattrs = Some(xattrs);
        snap.links = extra_links(&st);
        Some(Before::contents(snap))
    }

    /// For a name about to be unlinked: hard-links whatever it names into the store first and
    /// describes the inode actually linked, which saves looking at it beforehand. `None` when
    /// the name is not a regular file, or cannot be linked here (another file system, a
    /// directory, gone): capture it the usual way ([`Capturer::capture`]).
    pub fn capture_doomed_file(&self, parent: BorrowedFd<'_>, name: &[u8]) -> Option<Before> {
        let blob = blob_name(self.counters.next_id());
        in_shard(self.calls, self.blobs, &blob, || self.calls.link(parent, name, self.blobs, blob.as_bytes())).ok()?;
        let drop_blob = || {
            let _ = self.calls.remove(self.blobs, blob.as_bytes());
        };
        let linked = match rustix::fs::statat(self.blobs, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(l) if FileType::from_raw_mode(l.st_mode) == FileType::RegularFile => l,
            _ => {
                drop_blob();
                return None;
            }
        };
        // Charged by its data (a sparse file's holes cost the store nothing).
        let (size, charged) = (linked.st_size.max(0) as u64, data_bytes(&linked));
        if charged > self.budget.max_file {
            drop_blob();
            let limit = self.budget.max_file;
            return Some(Before::irreversible(Reason::OverFileBudget { size: charged, limit }));
        }
        let used = self.counters.bytes_kept();
        if used.saturating_add(charged) > self.budget.max_total {
            drop_blob();
            return Some(Before::irreversible(Reason::OverTotalBudget {
                size: charged,
                used,
                limit: self.budget.max_total,
            }));
        }
        self.counters.add_bytes_kept(charged);
        if self.sync {
            sync_shard(self.blobs, &blob);
        }
        let node = Node::File { blob, size, hash: None, how: CaptureHow::Link, twin: None };
        Some(Before::contents(snapshot_meta(&linked, node)))
    }

    /// A capture that refers to an earlier copy of exactly this state of the file (same
    /// [`CaptureKey`]), if the index has one and its blob is still the size it was. The file's
    /// extended attributes are read again (they are part of the snapshot, not of the blob).
    pub fn reuse(&self, parent: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Option<Before> {
        let key = CaptureKey::of(st);
        let id = self.index?.find(&key)?;
        let blob = blob_name(id);
        let kept = rustix::fs::statat(self.blobs, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        if FileType::from_raw_mode(kept.st_mode) != FileType::RegularFile || kept.st_size != st.st_size {
            return None;
        }
        let src = open_for_capture(parent, name).ok()?;
        let now = rustix::fs::fstat(&src).ok()?;
        if CaptureKey::of(&now) != key {
            return None;
        }
        let xattrs = list_xattrs_fd(&src).ok()?;
        // The blob's hash is checked at sealing like a linked blob's: it was not re-read here.
        let node = Node::File { blob, size: key.size, hash: None, how: CaptureHow::Copy, twin: None };
        let mut snap = snapshot_meta(&now, node);
        snap.xattrs = Some(xattrs);
        Some(Before::contents(snap))
    }

    /// Keeps a file that is about to be truncated by moving its inode into the store: the
    /// inode is hard-linked into `blobs/`, an empty file with the same mode, owner and extended
    /// attributes is made beside it and exchanged with it atomically, and the old name's extra
    /// link dropped. The caller's `O_TRUNC` open then finds an empty file, as it would have
    /// made one, and undo moves the original inode back. No byte is copied.
    ///
    /// What differs from the plain call, and why it is only done for big files with one link:
    /// the file at the name is a new inode (its number, its birth time), the directory's times
    /// change, and a process that already had the file open keeps the original (it would have
    /// seen the truncation).
    ///
    /// `None` (nothing changed, the caller copies instead): the file cannot be opened for
    /// writing by this process (the call will fail), it is on another file system than the store, the
    /// directory is not writable, its owner or attributes cannot be reproduced, or the file
    /// changed while being moved.
    fn move_aside(&self, parent: BorrowedFd<'_>, name: &[u8], st: &Stat) -> Option<Before> {
        // The call's own open must be able to succeed on the original: not only permission,
        // but also ETXTBSY (a running program), EROFS. Its twin would not be busy, and the
        // call must fail exactly as it would have.
        drop(
            self.calls
                .open(
                    parent,
                    name,
                    OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
                    Mode::empty(),
                )
                .ok()?,
        );
        let id = self.counters.next_id();
        let blob = blob_name(id);
        in_shard(self.calls, self.blobs, &blob, || self.calls.link(parent, name, self.blobs, blob.as_bytes())).ok()?;
        let drop_blob = || {
            let _ = self.calls.remove(self.blobs, blob.as_bytes());
        };
        let linked = match rustix::fs::statat(self.blobs, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(l) if ident_of(&l) == ident_of(st) && l.st_nlink == 2 => l,
            _ => {
                drop_blob();
                return None;
            }
        };
        let dir_len = name.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
        let mut tmp = name[..dir_len].to_vec();
        tmp.extend_from_slice(format!(".aether-journal-{id}.tmp").as_bytes());
        let Ok(fresh) = self.calls.open(
            parent,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) else {
            drop_blob();
            return None;
        };
        let drop_both = || {
            let _ = self.calls.remove(parent, &tmp);
            drop_blob();
        };
        if same_identity_apart_from_bytes(self.calls, &fresh, &linked, self.blobs, &blob).is_none() {
            drop_both();
            return None;
        }
        // Exchange, not rename over: if another process replaced the name meanwhile, what now
        // stands at the temporary name is not ours, and the exchange is reversed.
        if self.calls.exchange(parent, &tmp, name).is_err() {
            drop_both();
            return None;
        }
        match rustix::fs::statat(parent, tmp.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(moved) if ident_of(&moved) == ident_of(st) => {}
            _ => {
                let _ = self.calls.exchange(parent, &tmp, name);
                drop_both();
                return None;
            }
        }
        let _ = self.calls.remove(parent, &tmp);
        let twin = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).ok().map(|t| ident_of(&t));
        let size = linked.st_size.max(0) as u64;
        self.counters.add_bytes_kept(size);
        if self.sync {
            sync_shard(self.blobs, &blob);
            if let Ok(d) = rustix::fs::openat(
                parent,
                if dir_len == 0 { &b"."[..] } else { &name[..dir_len] },
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                let _ = rustix::fs::fsync(&d);
            }
        }
        let node = Node::File { blob, size, hash: None, how: CaptureHow::Link, twin };
        Some(Before::contents(snapshot_meta(&linked, node)))
    }

    #[allow(clippy::type_complexity)]
    fn copy_into_store(
        &self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        blob: &str,
    ) -> Result<(CaptureHow, Option<String>, u64, Stat, Vec<Xattr>), (&'static str, io::Error)> {
        let src = open_for_capture(parent, name).map_err(|e| ("open for reading", e))?;
        let st = rustix::fs::fstat(&src).map_err(|e| ("stat", e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(("open for reading", io::Error::other("the file was replaced while being captured")));
        }
        let xattrs = list_xattrs_fd(&src).map_err(|e| ("read extended attributes", e))?;
        let dst = in_shard(self.calls, self.blobs, blob, || {
            self.calls.open(
                self.blobs,
                blob.as_bytes(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
        })
        .map_err(|e| ("create the blob", e.into()))?;
        let result = if try_clone(&dst, &src, st.st_dev) {
            (CaptureHow::Reflink, None, st.st_size.max(0) as u64)
        } else {
            let size = st.st_size.max(0) as u64;
            let copy =
                if data_bytes(&st) < size { copy_sparse_hashing(&src, &dst) } else { copy_hashing(&src, &dst, size) };
            let (hash, n) = copy.map_err(|e| ("copy into the store", e))?;
            (CaptureHow::Copy, Some(hash), n)
        };
        if self.sync {
            rustix::fs::fsync(&dst).map_err(|e| ("fsync the blob", e.into()))?;
            sync_shard(self.blobs, blob);
        }
        Ok((result.0, result.1, result.2, st, xattrs))
    }
}

/// The device (plus one) whose files the store cannot clone (`FICLONE` failed with
/// `EOPNOTSUPP`, `EXDEV` or `ENOTTY`): a capture from it copies without asking again. One
/// device per process: the usual session changes files on one file system.
static NO_CLONE_FROM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Clones `src` (on device `dev`) into `dst` if its file system can.
fn try_clone(dst: &OwnedFd, src: &OwnedFd, dev: u64) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    if NO_CLONE_FROM.load(Relaxed) == dev.wrapping_add(1) {
        return false;
    }
    match rustix::fs::ioctl_ficlone(dst, src) {
        Ok(()) => true,
        Err(Errno::OPNOTSUPP | Errno::XDEV | Errno::NOTTY) => {
            NO_CLONE_FROM.store(dev.wrapping_add(1), Relaxed);
            false
        }
        Err(_) => false,
    }
}

/// The name of blob `id` inside `blobs/`: `hh/ID`, in the shard directory named by the id's
/// second byte (`ID >> 8`, modulo 256).
///
/// # Rationale
/// Blobs are spread over up to 256 directories because linking a file into one directory of
/// 20,000 entries costs about twice what it costs in one of 80 (measured on ext4: 7.5-11.7 us
/// against 4.0-4.4 us per link), and `rm -rf` of a big tree links every file. The second byte,
/// not the first: ids are handed out in order, so a run of 256 consecutive ids shares one
/// shard, and a young session makes a directory every 256 ids instead of one for nearly every
/// blob (a `mkdir` on ext4 costs 20-60 us, more than the link it precedes). A shard still
/// gains at most 256 names in each round of 65,536 ids. Sessions of builds before this one
/// named the shard by the id's low byte; both are read ([`crate::record::is_blob_name`]).
pub fn blob_name(id: u64) -> String {
    format!("{:02x}/{id}", (id >> 8) & 0xff)
}

/// Runs `make` (which creates `blob`), creating the blob's shard directory first if `make`
/// finds it missing (`blob` as [`blob_name`] gives it).
pub fn in_shard<T>(
    calls: &dyn FsCalls,
    blobs: BorrowedFd<'_>,
    blob: &str,
    make: impl Fn() -> Result<T, Errno>,
) -> Result<T, Errno> {
    match make() {
        Err(Errno::NOENT) => {
            let Some((shard, _)) = blob.split_once('/') else { return Err(Errno::NOENT) };
            match with_c_path(shard.as_bytes(), |p| calls.mkdirat(blobs, p, Mode::from_raw_mode(0o700))) {
                Ok(()) | Err(Errno::EXIST) => make(),
                Err(_) => Err(Errno::NOENT),
            }
        }
        other => other,
    }
}

/// Makes a new blob's name durable: its shard directory, and `blobs/` (which may have just
/// gained the shard).
pub(crate) fn sync_shard(blobs: BorrowedFd<'_>, blob: &str) {
    if let Some((shard, _)) = blob.split_once('/')
        && let Ok(d) =
            rustix::fs::openat(blobs, shard, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
    {
        let _ = rustix::fs::fsync(&d);
    }
    let _ = rustix::fs::fsync(blobs);
}

/// Gives the new, empty `fresh` the owner, extended attributes and mode of `old` (the file it
/// is about to replace, linked at `blob`), and checks that they took. `None` when any of them
/// cannot be reproduced.
fn same_identity_apart_from_bytes(
    calls: &dyn FsCalls,
    fresh: &OwnedFd,
    old: &Stat,
    blobs: BorrowedFd<'_>,
    blob: &str,
) -> Option<()> {
    let now = rustix::fs::fstat(fresh).ok()?;
    if (now.st_uid, now.st_gid) != (old.st_uid, old.st_gid) {
        calls.fchown(fresh.as_fd(), old.st_uid, old.st_gid).ok()?;
    }
    let old_fd = open_for_capture(blobs, blob.as_bytes()).ok()?;
    let wanted = list_xattrs_fd(&old_fd).ok()?;
    // A default ACL of the directory may have given the new file attributes the old lacks.
    for x in list_xattrs_fd(fresh).ok()? {
        if !wanted.iter().any(|w| w.name == x.name) {
            with_c_path(x.name.as_bytes(), |n| calls.fremovexattr(fresh.as_fd(), n)).ok()?;
        }
    }
    for x in &wanted {
        with_c_path(x.name.as_bytes(), |n| calls.fsetxattr(fresh.as_fd(), n, &x.value.0, XattrFlags::empty())).ok()?;
    }
    // Last: a chown clears set-id bits, and an ACL write may change the group bits.
    calls.fchmod(fresh.as_fd(), Mode::from_raw_mode(old.st_mode & 0o7777)).ok()?;
    let done = rustix::fs::fstat(fresh).ok()?;
    let same = (done.st_mode & 0o7777, done.st_uid, done.st_gid) == (old.st_mode & 0o7777, old.st_uid, old.st_gid);
    same.then_some(())
}

fn is_gone(parent: BorrowedFd<'_>, name: &[u8]) -> bool {
    matches!(rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW), Err(Errno::NOENT))
}

fn open_dir_nofollow_at(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(parent, name, flags, Mode::empty())?)
}

fn unsupported(e: Errno) -> bool {
    matches!(e, Errno::NOTSUP | Errno::NOSYS)
}

/// Every extended attribute of an open file or directory (none where the file system has no
/// support for them).
pub fn list_xattrs_fd(fd: impl AsFd) -> io::Result<Vec<Xattr>> {
    let mut names = vec![0u8; 4096];
    let n = loop {
        match rustix::fs::flistxattr(&fd, &mut names[..]) {
            Ok(n) => break n,
            Err(Errno::RANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            Err(e) if unsupported(e) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    // Most files have no attributes at all: no value buffer then (zeroing 64 KiB per capture
    // cost more than the capture of a small file).
    let mut value = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        match read_xattr(&mut value, |buf| rustix::fs::fgetxattr(&fd, name, buf)) {
            Ok(len) => out.push(Xattr { name: BPath::new(name.to_vec()), value: Bytes(value[..len].to_vec()) }),
            // Removed between the listing and the read.
            Err(Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Reads one attribute value into `value` with `get`: in 4 KiB first, in the largest size
/// Linux allows (64 KiB) only when the value needs it. Returns the value's length.
fn read_xattr(value: &mut Vec<u8>, mut get: impl FnMut(&mut [u8]) -> Result<usize, Errno>) -> Result<usize, Errno> {
    if value.len() < 4096 {
        value.resize(4096, 0);
    }
    loop {
        match get(&mut value[..]) {
            Err(Errno::RANGE) if value.len() < 65536 => value.resize(65536, 0),
            other => return other,
        }
    }
}

/// The value of one extended attribute of `path` (never following a final symlink); `None`
/// when it is not set.
pub fn xattr_value(path: &[u8], name: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let mut value = Vec::new();
    match read_xattr(&mut value, |buf| rustix::fs::lgetxattr(path, name, buf)) {
        Ok(len) => Ok(Some(value[..len].to_vec())),
        Err(Errno::NODATA) => Ok(None),
        Err(e) if unsupported(e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The metadata a chmod, chown, utime or xattr call is about to change, from `lstat` (and the
/// attribute's value, for an xattr call).
pub fn meta_before(st: &Stat, what: MetaKind, xattr: Option<XattrBefore>) -> MetaBefore {
    MetaBefore {
        what,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: [st.st_atime, st.st_atime_nsec as i64],
        mtime: [st.st_mtime, st.st_mtime_nsec as i64],
        ident: ident_of(st),
        symlink: FileType::from_raw_mode(st.st_mode) == FileType::Symlink,
        xattr,
        flags: None,
    }
}

/// The inode flags (`FS_IOC_GETFLAGS`, what `lsattr` shows) of the file open as `fd`.
pub fn inode_flags(fd: BorrowedFd<'_>) -> io::Result<u32> {
    Ok(rustix::fs::ioctl_getflags(fd)?.bits())
}

/// Opens a file for reading without following a final symlink and, where permitted, without
/// updating its access time (a capture must not change what `stat` shows).
pub fn open_for_capture(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let base = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    match rustix::fs::openat(parent, name, base | OFlags::NOATIME, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::PERM) => Ok(rustix::fs::openat(parent, name, base, Mode::empty())?),
        Err(e) => Err(e.into()),
    }
}

/// Copies `src` to `dst` from their current offsets, returning the BLAKE3 hex of the bytes and
/// their count. `expected` (the size `fstat` gave) only sizes the buffer: a small file is
/// copied through a small one (every fresh page a process touches is a page fault), and a file
/// that grew meanwhile is still copied whole.
pub fn copy_hashing(src: impl AsFd, dst: impl AsFd, expected: u64) -> io::Result<(String, u64)> {
    let len = usize::try_from(expected).unwrap_or(usize::MAX).saturating_add(1).clamp(4096, 64 * 1024);
    read_hashing(src, len, |chunk| write_all(&dst, chunk))
}

/// Files this long or longer whose allocated bytes are fewer than their length are copied
/// sparsely (smaller ones are copied whole: their holes cost little).
pub const SPARSE_MIN: u64 = 1 << 20;

/// The bytes a copy of a file with status `st` writes: its allocated bytes when it is sparse
/// (at least [`SPARSE_MIN`] long and fewer allocated bytes than its length), its length
/// otherwise. Captures are judged against the budgets by this.
pub fn data_bytes(st: &Stat) -> u64 {
    let size = st.st_size.max(0) as u64;
    let allocated = (st.st_blocks.max(0) as u64).saturating_mul(512);
    if size >= SPARSE_MIN && allocated < size { allocated } else { size }
}

/// Copies `src` into `dst` (empty), both from offset 0, writing only the data extents
/// (`SEEK_DATA`/`SEEK_HOLE`), so that a hole stays a hole; returns the BLAKE3 hex of the whole
/// contents (holes read as zeros) and their length. A file system that cannot tell where the
/// data is gets a dense copy.
pub fn copy_sparse_hashing(src: impl AsFd, dst: impl AsFd) -> io::Result<(String, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut pos = 0u64;
    copy_extents(&src, &dst, |at, chunk| {
        hash_zeros(&mut hasher, at - pos);
        hasher.update(chunk);
        pos = at + chunk.len() as u64;
    })?;
    let len = rustix::fs::fstat(&src)?.st_size.max(0) as u64;
    if len > pos {
        // A hole at the end: the copy gets its length from a last zero byte written, not from
        // `ftruncate`, which a supervisor watches (the store's own writes are never its work).
        hash_zeros(&mut hasher, len - pos);
        pwrite_all(&dst, &[0], len - 1)?;
        pos = len;
    }
    Ok((hasher.finalize().to_hex().to_string(), pos))
}

/// Copies every data extent of `src` into `dst` at the same offsets (holes left unwritten),
/// handing each chunk to `seen` with its offset; returns the end of the last byte copied. A file
/// that shrinks meanwhile ends the copy where it now ends.
pub fn copy_extents(src: impl AsFd, dst: impl AsFd, mut seen: impl FnMut(u64, &[u8])) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut copied = 0u64;
    for_each_extent(&src, |start, end| {
        let mut at = start;
        while at < end {
            let want = usize::try_from(end - at).unwrap_or(usize::MAX).min(buf.len());
            let n = match rustix::io::pread(&src, &mut buf[..want], at) {
                Ok(0) => break,
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            seen(at, &buf[..n]);
            pwrite_all(&dst, &buf[..n], at)?;
            at += n as u64;
        }
        copied = at;
        Ok(at == end)
    })?;
    Ok(copied)
}

/// Runs `each` on every data extent of `fd` (`[start, end)`, in order), until it returns
/// `false`. A file system that does not say where the data is (`EINVAL`) has one extent, the
/// whole file.
pub fn for_each_extent(fd: impl AsFd, mut each: impl FnMut(u64, u64) -> io::Result<bool>) -> io::Result<()> {
    use rustix::fs::{SeekFrom, seek};
    let mut pos = 0u64;
    loop {
        let start = match seek(&fd, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(Errno::NXIO) => return Ok(()),
            Err(Errno::INVAL) if pos == 0 => {
                let len = rustix::fs::fstat(&fd)?.st_size.max(0) as u64;
                return each(0, len).map(|_| ());
            }
            Err(e) => return Err(e.into()),
        };
        let end = seek(&fd, SeekFrom::Hole(start))?;
        if end <= start || !each(start, end)? {
            return Ok(());
        }
        pos = end;
    }
}

fn hash_zeros(hasher: &mut blake3::Hasher, mut n: u64) {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        hasher.update(&ZEROS[..k]);
        n -= k as u64;
    }
}

/// Writes all of `bytes` at offset `at`.
pub fn pwrite_all(fd: impl AsFd, mut bytes: &[u8], mut at: u64) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::pwrite(&fd, bytes, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                at += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads `src` to its end through a `buf_len` buffer, hashing every chunk and handing it to
/// `sink`: the BLAKE3 hex of the bytes and their count.
fn read_hashing(
    src: impl AsFd,
    buf_len: usize,
    mut sink: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<(String, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; buf_len];
    let mut total = 0u64;
    loop {
        let n = match rustix::io::read(&src, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        hasher.update(&buf[..n]);
        sink(&buf[..n])?;
        total += n as u64;
    }
    Ok((hasher.finalize().to_hex().to_string(), total))
}

/// BLAKE3 of a regular file of about `expected` bytes, and its length, read with a buffer
/// sized for it; a short read ends it (a regular file reads short only at its end), so a small
/// file costs one `read`. For the seal and the checks against it, which both read this way.
pub fn hash_regular(fd: impl AsFd, expected: u64) -> io::Result<(blake3::Hash, u64)> {
    let len = usize::try_from(expected.saturating_add(1)).unwrap_or(usize::MAX).clamp(512, 64 * 1024);
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; len];
    let mut total = 0u64;
    loop {
        let n = match rustix::io::read(&fd, &mut buf) {
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
        if n < buf.len() {
            break;
        }
    }
    Ok((hasher.finalize(), total))
}

/// Writes all of `data`, retrying on short writes and EINTR.
pub fn write_all(fd: impl AsFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match rustix::io::write(&fd, data) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
            Ok(n) => data = &data[n..],
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// BLAKE3 hex of everything readable from `fd` (from its current offset).
pub fn hash_fd(fd: impl AsFd) -> io::Result<(String, u64)> {
    read_hashing(fd, 64 * 1024, |_| Ok(()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_run_of_256_consecutive_ids_shares_one_shard_directory() {
        let shard = |id: u64| blob_name(id).split_once('/').map(|(s, _)| s.to_string()).unwrap();
        assert!((0..256).all(|id| shard(id) == "00"), "a young session's first blobs share a shard");
        assert_eq!(blob_name(256), "01/256");
        assert_eq!(blob_name(1066), "04/1066");
        assert_eq!(blob_name(65_536 + 7), "00/65543", "the shards are reused every 65,536 ids");
        assert!((0..70_000).step_by(97).all(|id| crate::record::is_blob_name(&blob_name(id))));
    }

    /// In-memory counters for tests.
    #[derive(Default)]
    pub struct TestCounters {
        pub id: AtomicU64,
        pub kept: AtomicU64,
    }

    impl Counters for TestCounters {
        fn next_id(&self) -> u64 {
            self.id.fetch_add(1, Ordering::Relaxed) + 1
        }
        fn bytes_kept(&self) -> u64 {
            self.kept.load(Ordering::Relaxed)
        }
        fn add_bytes_kept(&self, n: u64) {
            self.kept.fetch_add(n, Ordering::Relaxed);
        }
    }

    #[test]
    fn hashing_a_regular_file_by_its_size_gives_the_hash_of_reading_it_to_the_end() {
        let t = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 511, 512, 513, 4096, 65535, 65536, 65537, 200_000] {
            let p = t.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            fs::write(&p, &data).unwrap();
            let full = hash_fd(fs::File::open(&p).unwrap()).unwrap();
            for expected in [0, len as u64, len as u64 / 2, len as u64 * 2] {
                assert_eq!(
                    hash_regular(fs::File::open(&p).unwrap(), expected)
                        .map(|(h, n)| (h.to_hex().to_string(), n))
                        .unwrap(),
                    full,
                    "{len} {expected}"
                );
            }
        }
    }

    /// A capturer into `blobs` with `budget`, counting in `c`, making its calls directly.
    fn capturer<'a>(blobs: &'a fs::File, c: &'a TestCounters, budget: Budget) -> Capturer<'a> {
        Capturer { blobs: blobs.as_fd(), budget, counters: c, sync: false, index: None, calls: &Direct, pack: None }
    }

    /// A pack that cannot be written to (a full store).
    struct FullPack;

    impl Packer for FullPack {
        fn append(&self, _: BorrowedFd<'_>, _: &[u8]) -> io::Result<(String, u64)> {
            Err(io::Error::from(Errno::NOSPC))
        }
    }

    #[test]
    fn a_small_doomed_file_whose_copy_cannot_be_made_is_left_to_be_kept_another_way() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/f"), b"small").unwrap();
        let st = rustix::fs::statat(&work, "f", AtFlags::SYMLINK_NOFOLLOW).unwrap();
        let c = TestCounters::default();
        let cap = Capturer { pack: Some(&FullPack), ..capturer(&blobs, &c, Budget::default()) };
        assert!(cap.capture_small_doomed(work.as_fd(), b"f", &st).is_none(), "not journaled irreversible");
    }

    fn setup() -> (tempfile::TempDir, fs::File, fs::File) {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("blobs")).unwrap();
        fs::create_dir(t.path().join("work")).unwrap();
        let blobs = fs::File::open(t.path().join("blobs")).unwrap();
        let work = fs::File::open(t.path().join("work")).unwrap();
        (t, blobs, work)
    }

    #[test]
    fn a_file_about_to_be_overwritten_is_copied_with_its_hash() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/f"), b"hello").unwrap();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"f", Intent::Overwrite) else { panic!() };
        let Node::File { blob, size, hash, how, .. } = snap.node else { panic!() };
        assert_eq!(size, 5);
        assert!(matches!(how, CaptureHow::Copy | CaptureHow::Reflink));
        if how == CaptureHow::Copy {
            assert_eq!(hash.unwrap(), blake3::hash(b"hello").to_hex().to_string());
        }
        assert_eq!(fs::read(t.path().join("blobs").join(&blob)).unwrap(), b"hello");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(t.path().join("blobs").join(&blob)).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(c.bytes_kept(), 5);
    }

    #[test]
    fn a_sparse_file_is_copied_sparsely_charged_by_its_data_and_hashed_whole() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let (t, blobs, work) = setup();
        // Over 1 GiB, 8 KiB of it data: the per-file budget (1 GiB) is judged on the data.
        const LEN: u64 = (1 << 30) + (64 << 20);
        let f = fs::File::create(t.path().join("work/sparse")).unwrap();
        f.set_len(LEN).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", LEN - 4).unwrap();
        drop(f);
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"sparse", Intent::Overwrite) else { panic!() };
        let Node::File { blob, size, hash, how, .. } = snap.node else { panic!() };
        assert_eq!(size, LEN);
        let kept = fs::metadata(t.path().join("blobs").join(&blob)).unwrap();
        assert_eq!(kept.len(), LEN);
        assert!(kept.blocks() * 512 < 1 << 20, "the blob is sparse: {} blocks", kept.blocks());
        assert!(c.bytes_kept() < 1 << 20, "charged by its data: {}", c.bytes_kept());
        if how == CaptureHow::Copy {
            let whole = hash_fd(fs::File::open(t.path().join("work/sparse")).unwrap()).unwrap();
            assert_eq!(hash.unwrap(), whole.0, "the hash is of the contents, holes read as zeros");
        }
    }

    #[test]
    fn a_file_that_grew_after_its_stat_is_still_copied_whole() {
        let t = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
        fs::write(t.path().join("src"), &data).unwrap();
        let src = fs::File::open(t.path().join("src")).unwrap();
        let dst = fs::File::create(t.path().join("dst")).unwrap();
        // The stat said 10 bytes: the buffer is small, the copy must not be.
        let (hash, n) = copy_hashing(&src, &dst, 10).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(hash, blake3::hash(&data).to_hex().to_string());
        assert_eq!(fs::read(t.path().join("dst")).unwrap(), data);
    }

    #[test]
    fn an_attribute_value_larger_than_the_first_buffer_is_read_whole() {
        // ext4 keeps values within one block; tmpfs takes the 64 KiB Linux allows.
        let Ok(t) = tempfile::tempdir_in("/dev/shm") else {
            println!("SKIPPED: no /dev/shm");
            return;
        };
        let f = t.path().join("f");
        fs::write(&f, b"x").unwrap();
        let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        if rustix::fs::setxattr(f.as_path(), "user.big", &big, rustix::fs::XattrFlags::empty()).is_err() {
            println!("SKIPPED: /dev/shm takes no user attributes here");
            return;
        }
        rustix::fs::setxattr(f.as_path(), "user.small", b"v", rustix::fs::XattrFlags::empty()).unwrap();
        let got = list_xattrs_fd(fs::File::open(&f).unwrap()).unwrap();
        let value = |n: &str| got.iter().find(|x| x.name.as_bytes() == n.as_bytes()).map(|x| x.value.0.clone());
        assert_eq!(value("user.big"), Some(big));
        assert_eq!(value("user.small"), Some(b"v".to_vec()));
        assert_eq!(xattr_value(f.as_os_str().as_encoded_bytes(), b"user.big").unwrap().map(|v| v.len()), Some(20_000));
    }

    #[test]
    fn a_big_file_about_to_be_truncated_is_moved_aside_and_an_identical_empty_twin_left() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (t, blobs, work) = setup();
        let f = t.path().join("work/big");
        let data: Vec<u8> = (0..MOVE_ASIDE_MIN as usize + 4096).map(|i| (i * 7) as u8).collect();
        fs::write(&f, &data).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        rustix::fs::setxattr(f.as_path(), "user.tag", b"v", rustix::fs::XattrFlags::empty()).unwrap();
        let ino = fs::metadata(&f).unwrap().ino();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"big", Intent::Truncate) else { panic!() };
        let Node::File { blob, how, twin, size, .. } = &snap.node else { panic!() };
        assert_eq!((*how, *size), (CaptureHow::Link, data.len() as u64));
        let kept = t.path().join("blobs").join(blob);
        assert_eq!(fs::metadata(&kept).unwrap().ino(), ino, "the original inode itself is kept");
        assert_eq!(fs::metadata(&kept).unwrap().nlink(), 1, "and no longer linked at its name");
        assert_eq!(fs::read(&kept).unwrap(), data, "no byte was copied or lost");
        let now = fs::metadata(&f).unwrap();
        assert_eq!(now.len(), 0, "an empty twin stands at the name");
        assert_eq!(Some(Ident { dev: now.dev(), ino: now.ino() }), *twin, "and the record names it");
        assert_eq!(now.permissions().mode() & 0o7777, 0o640);
        assert_eq!(xattr_value(f.as_os_str().as_encoded_bytes(), b"user.tag").unwrap().as_deref(), Some(&b"v"[..]));
        let names: Vec<_> = fs::read_dir(t.path().join("work")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("big")], "no temporary name left behind");
    }

    #[test]
    fn a_truncated_file_with_other_links_or_below_the_threshold_is_copied_in_place() {
        use std::os::unix::fs::MetadataExt;
        let (t, blobs, work) = setup();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        fs::write(t.path().join("work/small"), b"tiny").unwrap();
        fs::write(t.path().join("work/linked"), vec![1u8; MOVE_ASIDE_MIN as usize]).unwrap();
        fs::hard_link(t.path().join("work/linked"), t.path().join("work/other-name")).unwrap();
        for name in ["small", "linked"] {
            let ino = fs::metadata(t.path().join("work").join(name)).unwrap().ino();
            let Before::Contents(snap) = cap.capture(work.as_fd(), name.as_bytes(), Intent::Truncate) else { panic!() };
            let Node::File { how, twin, .. } = &snap.node else { panic!() };
            assert!(matches!(how, CaptureHow::Copy | CaptureHow::Reflink) && twin.is_none(), "{name}: {how:?}");
            assert_eq!(fs::metadata(t.path().join("work").join(name)).unwrap().ino(), ino, "{name} stays put");
        }
    }

    #[test]
    fn a_doomed_name_is_linked_first_only_when_it_is_a_regular_file_within_budget() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/f"), b"12345").unwrap();
        fs::write(t.path().join("work/big"), vec![0u8; 100]).unwrap();
        std::os::unix::fs::symlink("f", t.path().join("work/l")).unwrap();
        fs::create_dir(t.path().join("work/d")).unwrap();
        let c = TestCounters::default();
        let budget = Budget { max_file: 50, max_total: 1000 };
        let cap = capturer(&blobs, &c, budget);
        let Some(Before::Contents(snap)) = cap.capture_doomed_file(work.as_fd(), b"f") else { panic!() };
        assert!(matches!(snap.node, Node::File { how: CaptureHow::Link, size: 5, .. }));
        assert_eq!(
            cap.capture_doomed_file(work.as_fd(), b"big"),
            Some(Before::irreversible(Reason::OverFileBudget { size: 100, limit: 50 }))
        );
        for other in [&b"l"[..], b"d", b"missing"] {
            assert_eq!(cap.capture_doomed_file(work.as_fd(), other), None, "{}", String::from_utf8_lossy(other));
        }
        let kept: usize = fs::read_dir(t.path().join("blobs"))
            .unwrap()
            .map(|d| fs::read_dir(d.unwrap().path()).unwrap().count())
            .sum();
        assert_eq!(kept, 1, "only the captured file is left in the store");
    }

    #[test]
    fn a_hard_linked_capture_survives_the_originals_unlink() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/f"), b"precious").unwrap();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"f", Intent::Destroy) else { panic!() };
        let Node::File { blob, how, .. } = &snap.node else { panic!() };
        assert_eq!(*how, CaptureHow::Link);
        fs::remove_file(t.path().join("work/f")).unwrap();
        assert_eq!(fs::read(t.path().join("blobs").join(blob)).unwrap(), b"precious");
    }

    #[test]
    fn an_oversized_file_is_recorded_as_irreversible_not_skipped() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/f"), vec![1u8; 100]).unwrap();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget { max_file: 10, max_total: 1000 });
        assert_eq!(
            cap.capture(work.as_fd(), b"f", Intent::Overwrite),
            Before::irreversible(Reason::OverFileBudget { size: 100, limit: 10 })
        );
        let cap = capturer(&blobs, &c, Budget { max_file: 1000, max_total: 150 });
        c.add_bytes_kept(60);
        assert_eq!(
            cap.capture(work.as_fd(), b"f", Intent::Destroy),
            Before::irreversible(Reason::OverTotalBudget { size: 100, used: 60, limit: 150 })
        );
        assert_eq!(fs::read_dir(t.path().join("blobs")).unwrap().count(), 0);
    }

    #[test]
    fn appends_capture_only_the_prior_length_and_missing_files_are_absent() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/log"), b"0123456789").unwrap();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"log", Intent::Append) else { panic!() };
        assert_eq!(snap.node, Node::Prefix { len: 10 });
        assert_eq!(cap.capture(work.as_fd(), b"nope", Intent::Overwrite), Before::Absent);
        assert_eq!(c.bytes_kept(), 0);
    }

    #[test]
    fn symlinks_are_captured_as_links_never_followed() {
        let (t, blobs, work) = setup();
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("work/l")).unwrap();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"l", Intent::Destroy) else { panic!() };
        assert_eq!(snap.node, Node::Symlink { target: BPath::from("/etc/passwd") });
    }

    #[test]
    fn writing_into_a_fifo_is_irreversible_but_removing_one_is_recreatable() {
        let (t, blobs, work) = setup();
        rustix::fs::mknodat(work.as_fd(), "p", FileType::Fifo, Mode::from_raw_mode(0o640), 0).unwrap();
        let c = TestCounters::default();
        let cap = capturer(&blobs, &c, Budget::default());
        assert_eq!(
            cap.capture(work.as_fd(), b"p", Intent::Overwrite),
            Before::irreversible(Reason::SpecialFile { kind: SpecialKind::Fifo })
        );
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"p", Intent::Destroy) else { panic!() };
        assert!(matches!(snap.node, Node::Special { kind: SpecialKind::Fifo, .. }));
        let _ = t;
    }
}
