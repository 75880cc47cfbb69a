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

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
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

/// What the call about to run will do to an existing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Bytes may change in place (open for writing or truncating, truncate, ftruncate).
    Overwrite,
    /// Bytes will only be added at the end (`O_WRONLY | O_APPEND`).
    Append,
    /// The name is about to be removed or replaced (unlink, rmdir, rename over).
    Destroy,
}

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
    }
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
    Before::Irreversible { reason: Reason::CaptureFailed { step: step.into(), error: e.to_string() } }
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
                Before::Contents(snap)
            }
            FileType::Symlink => match rustix::fs::readlinkat(parent, name, Vec::new()) {
                Ok(t) => Before::Contents(snapshot_meta(st, Node::Symlink { target: BPath::new(t.into_bytes()) })),
                Err(e) => failed("read the symlink", io::Error::from(e)),
            },
            FileType::RegularFile => self.capture_file(parent, name, st, intent),
            other => {
                let kind = special_kind(other).unwrap_or(SpecialKind::Char);
                if intent == Intent::Destroy {
                    Before::Contents(snapshot_meta(st, Node::Special { kind, rdev: st.st_rdev }))
                } else {
                    Before::Irreversible { reason: Reason::SpecialFile { kind } }
                }
            }
        }
    }

    fn capture_file(&self, parent: BorrowedFd<'_>, name: &[u8], st: &Stat, intent: Intent) -> Before {
        let size = st.st_size.max(0) as u64;
        if intent == Intent::Append {
            return Before::Contents(snapshot_meta(st, Node::Prefix { len: size }));
        }
        if size > self.budget.max_file {
            return Before::Irreversible { reason: Reason::OverFileBudget { size, limit: self.budget.max_file } };
        }
        let used = self.counters.bytes_kept();
        if used.saturating_add(size) > self.budget.max_total {
            return Before::Irreversible {
                reason: Reason::OverTotalBudget { size, used, limit: self.budget.max_total },
            };
        }
        let blob = self.counters.next_id().to_string();
        if intent == Intent::Destroy
            && rustix::fs::linkat(parent, name, self.blobs, blob.as_str(), AtFlags::empty()).is_ok()
        {
            // Describe the inode actually linked: another process may have swapped the name
            // between the stat and the link.
            let linked = match rustix::fs::statat(self.blobs, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(l) if FileType::from_raw_mode(l.st_mode) == FileType::RegularFile => l,
                _ => {
                    let _ = rustix::fs::unlinkat(self.blobs, blob.as_str(), AtFlags::empty());
                    return failed("link into the store", "the file was replaced while being captured");
                }
            };
            let size = linked.st_size.max(0) as u64;
            self.counters.add_bytes_kept(size);
            if self.sync {
                let _ = rustix::fs::fsync(self.blobs);
            }
            let node = Node::File { blob, size, hash: None, how: CaptureHow::Link };
            return Before::Contents(snapshot_meta(&linked, node));
        }
        match self.copy_into_store(parent, name, &blob) {
            Ok((how, hash, copied, fresh, xattrs)) => {
                self.counters.add_bytes_kept(copied);
                let node = Node::File { blob, size: copied, hash, how };
                let mut snap = snapshot_meta(&fresh, node);
                snap.xattrs = Some(xattrs);
                Before::Contents(snap)
            }
            // It vanished between the stat and the capture (another process removed it): it
            // is absent now, which is what the call will find too.
            Err((_, e)) if e.kind() == io::ErrorKind::NotFound && is_gone(parent, name) => {
                let _ = rustix::fs::unlinkat(self.blobs, blob.as_str(), AtFlags::empty());
                Before::Absent
            }
            Err((step, e)) => {
                let _ = rustix::fs::unlinkat(self.blobs, blob.as_str(), AtFlags::empty());
                failed(step, e)
            }
        }
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
        let dst = rustix::fs::openat(
            self.blobs,
            blob,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| ("create the blob", e.into()))?;
        let result = if rustix::fs::ioctl_ficlone(&dst, &src).is_ok() {
            (CaptureHow::Reflink, None, st.st_size.max(0) as u64)
        } else {
            let (hash, n) = copy_hashing(&src, &dst).map_err(|e| ("copy into the store", e))?;
            (CaptureHow::Copy, Some(hash), n)
        };
        if self.sync {
            rustix::fs::fsync(&dst).map_err(|e| ("fsync the blob", e.into()))?;
        }
        Ok((result.0, result.1, result.2, st, xattrs))
    }
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
    let mut value = vec![0u8; 65536];
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        match rustix::fs::fgetxattr(&fd, name, &mut value[..]) {
            Ok(len) => out.push(Xattr { name: BPath::new(name.to_vec()), value: Bytes(value[..len].to_vec()) }),
            // Removed between the listing and the read.
            Err(Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// The value of one extended attribute of `path` (never following a final symlink); `None`
/// when it is not set.
pub fn xattr_value(path: &[u8], name: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let mut value = vec![0u8; 65536];
    match rustix::fs::lgetxattr(path, name, &mut value[..]) {
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
    }
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
/// their count.
pub fn copy_hashing(src: impl AsFd, dst: impl AsFd) -> io::Result<(String, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = match rustix::io::read(&src, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        hasher.update(&buf[..n]);
        write_all(&dst, &buf[..n])?;
        total += n as u64;
    }
    Ok((hasher.finalize().to_hex().to_string(), total))
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
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                total += n as u64;
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok((hasher.finalize().to_hex().to_string(), total))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;
    use std::sync::atomic::{AtomicU64, Ordering};

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
        let cap = Capturer { blobs: blobs.as_fd(), budget: Budget::default(), counters: &c, sync: false };
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"f", Intent::Overwrite) else { panic!() };
        let Node::File { blob, size, hash, how } = snap.node else { panic!() };
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
    fn a_hard_linked_capture_survives_the_originals_unlink() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/f"), b"precious").unwrap();
        let c = TestCounters::default();
        let cap = Capturer { blobs: blobs.as_fd(), budget: Budget::default(), counters: &c, sync: false };
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
        let cap = Capturer {
            blobs: blobs.as_fd(),
            budget: Budget { max_file: 10, max_total: 1000 },
            counters: &c,
            sync: false,
        };
        assert_eq!(
            cap.capture(work.as_fd(), b"f", Intent::Overwrite),
            Before::Irreversible { reason: Reason::OverFileBudget { size: 100, limit: 10 } }
        );
        let cap = Capturer {
            blobs: blobs.as_fd(),
            budget: Budget { max_file: 1000, max_total: 150 },
            counters: &c,
            sync: false,
        };
        c.add_bytes_kept(60);
        assert_eq!(
            cap.capture(work.as_fd(), b"f", Intent::Destroy),
            Before::Irreversible { reason: Reason::OverTotalBudget { size: 100, used: 60, limit: 150 } }
        );
        assert_eq!(fs::read_dir(t.path().join("blobs")).unwrap().count(), 0);
    }

    #[test]
    fn appends_capture_only_the_prior_length_and_missing_files_are_absent() {
        let (t, blobs, work) = setup();
        fs::write(t.path().join("work/log"), b"0123456789").unwrap();
        let c = TestCounters::default();
        let cap = Capturer { blobs: blobs.as_fd(), budget: Budget::default(), counters: &c, sync: false };
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
        let cap = Capturer { blobs: blobs.as_fd(), budget: Budget::default(), counters: &c, sync: false };
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"l", Intent::Destroy) else { panic!() };
        assert_eq!(snap.node, Node::Symlink { target: BPath::from("/etc/passwd") });
    }

    #[test]
    fn writing_into_a_fifo_is_irreversible_but_removing_one_is_recreatable() {
        let (t, blobs, work) = setup();
        rustix::fs::mknodat(work.as_fd(), "p", FileType::Fifo, Mode::from_raw_mode(0o640), 0).unwrap();
        let c = TestCounters::default();
        let cap = Capturer { blobs: blobs.as_fd(), budget: Budget::default(), counters: &c, sync: false };
        assert_eq!(
            cap.capture(work.as_fd(), b"p", Intent::Overwrite),
            Before::Irreversible { reason: Reason::SpecialFile { kind: SpecialKind::Fifo } }
        );
        let Before::Contents(snap) = cap.capture(work.as_fd(), b"p", Intent::Destroy) else { panic!() };
        assert!(matches!(snap.node, Node::Special { kind: SpecialKind::Fifo, .. }));
        let _ = t;
    }
}
