//! Packs: small captures kept one after another in one file of the store, instead of a file
//! each. On ext4 a file of its own costs a capture an inode, a directory entry and its
//! journaling (16 to 40 us on the development machine); an append to a pack costs one write.
//! A pack belongs to one writer (a supervisor worker), which alone appends to it; its name is
//! a blob name (`hh/ID`), and a capture in it is [`crate::record::Node::Packed`]: the pack, the
//! offset, the length and the BLAKE3 of the bytes, which every reader checks.
//!
//! The bytes are written before the record that names them, so a record never names bytes a
//! writer had not finished: a writer killed in between leaves bytes no record names, which
//! cost room and nothing else.
//!
//! What this module cannot do: keep a capture's bytes from being overwritten by a process that
//! can write into the store (they are then refused as damaged, never written back), or keep a
//! capture bigger than [`PACK_MAX`] (those get a file of their own).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::capture::FsCalls;

/// Captures of regular files up to this size go into a pack when the writer has one.
pub const PACK_MAX: u64 = 64 * 1024;

/// A pack is appended to until it reaches this size; the next capture begins another.
pub const PACK_LEN: u64 = 64 << 20;

/// Why a packed capture cannot be had.
#[derive(Debug)]
pub enum PackError {
    /// The pack is not in the store.
    Missing,
    /// The bytes there are not the ones captured (fewer, or another hash): tampered with or
    /// damaged.
    Damaged,
    /// Reading failed.
    Io(io::Error),
}

impl std::fmt::Display for PackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackError::Missing => f.write_str("its pack is missing from the store"),
            PackError::Damaged => {
                f.write_str("its bytes in the pack do not match their recorded hash (tampered with or damaged)")
            }
            PackError::Io(e) => write!(f, "its pack cannot be read ({e})"),
        }
    }
}

/// The `size` bytes at `at` in pack `pack` of the store's `blobs` directory, provided their
/// BLAKE3 is `hash` (hex).
pub fn read(blobs: BorrowedFd<'_>, pack: &str, at: u64, size: u64, hash: &str) -> Result<Vec<u8>, PackError> {
    let opened = rustix::fs::openat(blobs, pack, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty());
    read_from(opened, at, size, hash)
}

/// [`read`], with the store's `blobs` directory by its path.
pub fn read_in(blobs: &std::path::Path, pack: &str, at: u64, size: u64, hash: &str) -> Result<Vec<u8>, PackError> {
    let opened = rustix::fs::open(
        blobs.join(pack).as_path(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    );
    read_from(opened, at, size, hash)
}

fn read_from(opened: Result<OwnedFd, Errno>, at: u64, size: u64, hash: &str) -> Result<Vec<u8>, PackError> {
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(PackError::Missing),
        Err(e) => return Err(PackError::Io(e.into())),
    };
    let len = usize::try_from(size).map_err(|_| PackError::Damaged)?;
    let mut bytes = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match rustix::io::pread(&fd, &mut bytes[got..], at + got as u64) {
            Ok(0) => return Err(PackError::Damaged),
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(PackError::Io(e.into())),
        }
    }
    if blake3::hash(&bytes).to_hex().as_str() != hash {
        return Err(PackError::Damaged);
    }
    Ok(bytes)
}

/// One writer's current pack, appended to at its end.
#[derive(Debug)]
pub struct Pack {
    /// Its name inside `blobs/`.
    pub name: String,
    fd: OwnedFd,
    /// Where the next bytes go.
    end: u64,
}

impl Pack {
    /// A pack over `fd`, a new, empty file of the store named `name`, open for writing.
    pub fn new(name: String, fd: OwnedFd) -> Pack {
        Pack { name, fd, end: 0 }
    }

    /// Makes a new pack in the store's `blobs` directory, named as blob `id` is (mode 0600,
    /// its shard made if needed, with `calls`); `sync`: its name on disk before this returns.
    pub fn create(calls: &dyn FsCalls, blobs: BorrowedFd<'_>, id: u64, sync: bool) -> io::Result<Pack> {
        let name = crate::capture::blob_name(id);
        let fd = crate::capture::in_shard(calls, blobs, &name, || {
            crate::capture::with_c_path(name.as_bytes(), |p| {
                calls.openat(
                    blobs,
                    p,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
            })
        })?;
        if sync {
            crate::capture::sync_shard(blobs, &name);
        }
        Ok(Pack::new(name, fd))
    }

    /// Whether `len` more bytes keep the pack within [`PACK_LEN`] (a first capture always fits).
    pub fn has_room(&self, len: u64) -> bool {
        self.end == 0 || self.end.saturating_add(len) <= PACK_LEN
    }

    /// Appends `bytes`, returning where they start; `sync`: on disk before this returns. A
    /// failed write leaves the end where it was (what it wrote is named by no record).
    pub fn append(&mut self, bytes: &[u8], sync: bool) -> io::Result<u64> {
        let at = self.end;
        crate::capture::pwrite_all(&self.fd, bytes, at)?;
        if sync {
            rustix::fs::fdatasync(&self.fd)?;
        }
        self.end = at + bytes.len() as u64;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_packed_capture_reads_back_only_while_its_bytes_are_the_ones_captured() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("01")).unwrap();
        let blobs = std::fs::File::open(t.path()).unwrap();
        let fd = rustix::fs::openat(
            &blobs,
            "01/1",
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let mut pack = Pack::new("01/1".into(), fd);
        let first = pack.append(b"first capture\n", false).unwrap();
        let second = pack.append(b"second\n", true).unwrap();
        assert_eq!((first, second), (0, 14));
        let hash = |b: &[u8]| blake3::hash(b).to_hex().to_string();
        let at = |at, size, h: &str| read(blobs.as_fd(), "01/1", at, size, h);
        assert_eq!(at(14, 7, &hash(b"second\n")).unwrap(), b"second\n");
        assert_eq!(at(0, 14, &hash(b"first capture\n")).unwrap(), b"first capture\n");
        assert!(matches!(at(0, 14, &hash(b"first capture?")), Err(PackError::Damaged)), "another hash");
        assert!(matches!(at(14, 8, &hash(b"second\n\0")), Err(PackError::Damaged)), "past the end");
        assert!(matches!(read(blobs.as_fd(), "01/2", 0, 1, &hash(b"x")), Err(PackError::Missing)));
        // Overwritten in the store: refused.
        let f = std::fs::OpenOptions::new().write(true).open(t.path().join("01/1")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"S", 14).unwrap();
        assert!(matches!(at(14, 7, &hash(b"second\n")), Err(PackError::Damaged)));
    }

    #[test]
    fn a_pack_takes_captures_until_it_is_full_and_always_a_first() {
        let t = tempfile::tempdir().unwrap();
        let fd = std::fs::File::create(t.path().join("p")).unwrap().into();
        let mut pack = Pack::new("1".into(), fd);
        assert!(pack.has_room(PACK_LEN * 2), "a first capture, whatever its size");
        pack.append(&[1; 100], false).unwrap();
        assert!(pack.has_room(PACK_LEN - 100));
        assert!(!pack.has_room(PACK_LEN - 99));
    }
}
