//! What a worker remembers of the directories watched processes name, so that most calls are
//! resolved without opening anything: a process's working directory and the directories its
//! descriptors are open on (each checked by identity on every use, one `stat` through
//! `/proc`), and the directories relative paths led to from them.
//!
//! An entry is trusted while no process of the session has renamed or removed a directory or
//! symlink since it was made (the session's names generation) and for
//! [`aether_journal_recorder::ops::PATH_TRUST_NS`], the rule the shim's own remembered paths
//! follow. The cache holds descriptors, so it is small: full, it starts over.
//!
//! What this module cannot do: notice a directory moved by a process outside the session (or
//! a mount) until its entry is that old: a file made there meanwhile is journaled under the
//! old name (README, "What this cannot do").

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use aether_journal::capture::ident_of;
use aether_journal::record::Ident;
use rustix::fs::{AtFlags, CWD, Mode, OFlags};
use rustix::io::Errno;

/// A directory a watched process names, open here.
#[derive(Clone)]
pub struct Dir {
    /// Its identity.
    pub id: Ident,
    /// Open here (`O_PATH`).
    pub fd: Arc<OwnedFd>,
    /// Its canonical name.
    pub path: Vec<u8>,
    names_gen: u64,
    at: Instant,
}

/// Where a watched process's names start from.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Start {
    /// Its working directory.
    Cwd,
    /// Its descriptor `n`.
    Fd(i32),
}

/// The cache: per process, its starting directories, and the directories relative paths from
/// them led to.
#[derive(Default)]
pub struct Dirs {
    starts: HashMap<(u32, Start), Dir>,
    below: HashMap<(u32, Ident, Vec<u8>), Dir>,
}

/// Most directories held open at once (each entry is a descriptor of the supervisor's).
const MOST: usize = 256;

fn fresh(d: &Dir, names_gen: u64) -> bool {
    d.names_gen == names_gen && d.at.elapsed().as_nanos() < u128::from(aether_journal_recorder::ops::PATH_TRUST_NS)
}

/// Why a directory could not be had.
pub enum DirError {
    /// The call will fail: the link leads nowhere, or not to a directory.
    WillFail,
    /// Reading it failed for a reason of its own.
    Failed(String),
}

impl Dirs {
    /// Forgets everything about process `pid` (it exec'd, or is gone).
    pub fn forget(&mut self, pid: u32) {
        self.starts.retain(|(p, _), _| *p != pid);
        self.below.retain(|(p, _, _), _| *p != pid);
    }

    /// The directory thread `tid` of process `pid` starts from (`start`), as it is now: the
    /// remembered one if `/proc/TID/...` still leads to it and it is fresh, else opened again.
    pub fn start(&mut self, pid: u32, tid: u32, start: Start, names_gen: u64) -> Result<Dir, DirError> {
        let link = match start {
            Start::Cwd => format!("/proc/{tid}/cwd"),
            Start::Fd(n) => format!("/proc/{tid}/fd/{n}"),
        };
        let now = match rustix::fs::statat(CWD, link.as_str(), AtFlags::empty()) {
            Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory => {
                ident_of(&st)
            }
            Ok(_) | Err(Errno::NOENT | Errno::NOTDIR | Errno::BADF) => return Err(DirError::WillFail),
            Err(e) => return Err(DirError::Failed(format!("{link}: {}", std::io::Error::from(e)))),
        };
        if let Some(d) = self.starts.get(&(pid, start)) {
            if d.id == now && fresh(d, names_gen) {
                return Ok(d.clone());
            }
        }
        let fd = match rustix::fs::openat(
            CWD,
            link.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::BADF) => return Err(DirError::WillFail),
            Err(e) => return Err(DirError::Failed(format!("{link}: {}", std::io::Error::from(e)))),
        };
        let d = self.made(fd, names_gen)?;
        self.keep_start(pid, start, d.clone());
        Ok(d)
    }

    /// The directory `dir_part` leads to from `base` (a directory of process `pid`), if it is
    /// one: remembered, or opened now. `None`: the resolver must look (it does not exist, is
    /// not a directory, or cannot be opened here).
    pub fn below(&mut self, pid: u32, base: &Dir, dir_part: &[u8], names_gen: u64) -> Option<Dir> {
        let key = (pid, base.id, dir_part.to_vec());
        if let Some(d) = self.below.get(&key) {
            if fresh(d, names_gen) && fresh(base, names_gen) {
                return Some(d.clone());
            }
        }
        let fd =
            rustix::fs::openat(&*base.fd, dir_part, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .ok()?;
        let d = self.made(fd, names_gen).ok()?;
        if self.below.len() >= MOST {
            self.below.clear();
        }
        self.below.insert(key, d.clone());
        Some(d)
    }

    /// The root directory, for absolute names.
    pub fn root(&mut self, names_gen: u64) -> Option<Dir> {
        if let Some(d) = self.starts.get(&(0, Start::Cwd)) {
            if d.names_gen == names_gen {
                return Some(d.clone());
            }
        }
        let fd =
            rustix::fs::openat(CWD, "/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        let d = Dir { id: ident_of(&st), fd: Arc::new(fd), path: b"/".to_vec(), names_gen, at: Instant::now() };
        self.keep_start(0, Start::Cwd, d.clone());
        Some(d)
    }

    fn keep_start(&mut self, pid: u32, start: Start, d: Dir) {
        if self.starts.len() >= MOST {
            self.starts.clear();
        }
        self.starts.insert((pid, start), d);
    }

    /// A directory just opened here: its identity and canonical name.
    fn made(&self, fd: OwnedFd, names_gen: u64) -> Result<Dir, DirError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| DirError::Failed(std::io::Error::from(e).to_string()))?;
        let path = aether_journal::resolve::fd_path(fd.as_raw_fd()).map_err(|e| DirError::Failed(e.to_string()))?;
        if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") {
            return Err(DirError::WillFail);
        }
        Ok(Dir { id: ident_of(&st), fd: Arc::new(fd), path, names_gen, at: Instant::now() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_directory_serves_until_the_names_generation_moves() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let mut dirs = Dirs::default();
        let root = dirs.root(1).unwrap();
        let tmp = t.path().strip_prefix("/").unwrap().as_os_str().as_encoded_bytes().to_vec();
        let a = dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"a/b"), 1).unwrap();
        assert!(a.path.ends_with(b"/a/b"));
        // Moved by a process of the session: the old entry is not trusted.
        std::fs::rename(t.path().join("a"), t.path().join("c")).unwrap();
        assert!(dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"a/b"), 2).is_none());
        let c = dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"c/b"), 2).unwrap();
        assert_eq!(c.id, a.id, "the same directory, by its new name");
        assert!(c.path.ends_with(b"/c/b"));
    }
}
