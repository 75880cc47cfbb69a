//! What a worker remembers of the directories watched processes name, so that most calls are
//! resolved without opening anything: a process's working directory and the directories its
//! descriptors are open on, and the directories relative paths led to from them.
//!
//! Nothing remembered is trusted without a check made at each use, one `stat` each: a start
//! is the one `/proc/TID/cwd` (or `fd/N`) leads to now when its identity is the same, and its
//! remembered name is current when that name still leads to it (else its name is asked
//! again); a directory below a start is the one its relative path leads to now when that
//! path, walked from the start, leads to the same identity. A path is remembered only when it
//! has no `.`, `..` or symlink in it (where those lead can change without a directory moving).
//! So a directory renamed, removed, replaced or mounted over since, by any process in or out
//! of the session, is noticed. The cache holds descriptors, so it is small: full, it starts
//! over.
//!
//! What this module cannot do: see into another mount namespace (a process that made its own
//! is not resolved here; see `target.rs`), or close the race every capture has, a directory
//! moved between the check and the kernel's own walk.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

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
    /// Its canonical name (current when the cache hands it out).
    pub path: Vec<u8>,
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

/// The name a directory open here has now, if it still has one.
fn current_name(fd: &OwnedFd) -> Option<Vec<u8>> {
    let path = aether_journal::resolve::fd_path(fd.as_raw_fd()).ok()?;
    (path.first() == Some(&b'/') && !path.ends_with(b" (deleted)")).then_some(path)
}

/// Whether `d`'s remembered name still leads to it (one `stat`), or else what its name is now
/// (`false`: it has none, it was removed).
fn still_named(d: &mut Dir) -> bool {
    if rustix::fs::statat(CWD, &d.path[..], AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| ident_of(&st) == d.id) {
        return true;
    }
    match current_name(&d.fd) {
        Some(path) => {
            d.path = path;
            true
        }
        None => false,
    }
}

/// The relative directory path as the name comparison can check it: its components joined by
/// single slashes, or `None` if one of them is `.` or `..`.
fn plain(dir_part: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(dir_part.len());
    for c in dir_part.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        if c == b"." || c == b".." {
            return None;
        }
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(c);
    }
    (!out.is_empty()).then_some(out)
}

/// `dir` joined with a [`plain`] relative path.
fn joined(dir: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(dir.len() + 1 + rel.len());
    out.extend_from_slice(dir);
    if dir != b"/" {
        out.push(b'/');
    }
    out.extend_from_slice(rel);
    out
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
    /// remembered one if `/proc/TID/...` still leads to it (by its current name), else opened
    /// again.
    pub fn start(&mut self, pid: u32, tid: u32, start: Start) -> Result<Dir, DirError> {
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
        if let Some(d) = self.starts.get_mut(&(pid, start)) {
            if d.id == now && still_named(d) {
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
        let d = self.made(fd)?;
        self.keep_start(pid, start, d.clone());
        Ok(d)
    }

    /// The directory `dir_part` leads to from `base` (a directory of process `pid`, its
    /// `path` current), if it is one and the path is one the cache can check (see the module
    /// documentation): remembered, or opened now. `None`: the resolver must look (the path
    /// has `.`, `..` or a symlink in it, does not exist, is not a directory, or cannot be
    /// opened here).
    pub fn below(&mut self, pid: u32, base: &Dir, dir_part: &[u8]) -> Option<Dir> {
        let rel = plain(dir_part)?;
        let expected = joined(&base.path, &rel);
        let key = (pid, base.id, rel);
        if let Some(d) = self.below.get_mut(&key) {
            // One stat from the start (cheaper than asking the directory's name): the path
            // still leads to it.
            match rustix::fs::statat(&*base.fd, &key.2[..], AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if ident_of(&st) == d.id => {
                    d.path = expected;
                    return Some(d.clone());
                }
                _ => {
                    self.below.remove(&key);
                }
            }
        }
        let fd = rustix::fs::openat(
            &*base.fd,
            &key.2[..],
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let d = self.made(fd).ok()?;
        if d.path != expected {
            // A symlink on the way: where it leads can change without any name here changing.
            return None;
        }
        if self.below.len() >= MOST {
            self.below.clear();
        }
        self.below.insert(key, d.clone());
        Some(d)
    }

    /// The root directory, for absolute names (a chrooted process's are not resolved here).
    pub fn root(&mut self) -> Option<Dir> {
        if let Some(d) = self.starts.get(&(0, Start::Cwd)) {
            return Some(d.clone());
        }
        let fd =
            rustix::fs::openat(CWD, "/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        let d = Dir { id: ident_of(&st), fd: Arc::new(fd), path: b"/".to_vec() };
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
    fn made(&self, fd: OwnedFd) -> Result<Dir, DirError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| DirError::Failed(std::io::Error::from(e).to_string()))?;
        let path = current_name(&fd).ok_or(DirError::WillFail)?;
        Ok(Dir { id: ident_of(&st), fd: Arc::new(fd), path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_directory_serves_while_its_path_leads_to_it_and_not_after_it_moved() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let mut dirs = Dirs::default();
        let root = dirs.root().unwrap();
        let tmp = t.path().strip_prefix("/").unwrap().as_os_str().as_encoded_bytes().to_vec();
        let ab = aether_journal::bpath::join(&tmp, b"a/b");
        let first = dirs.below(me, &root, &ab).unwrap();
        assert!(first.path.ends_with(b"/a/b"));
        assert!(Arc::ptr_eq(&dirs.below(me, &root, &ab).unwrap().fd, &first.fd), "remembered");
        // Moved (by anyone): the remembered one no longer serves for the old path.
        std::fs::rename(t.path().join("a"), t.path().join("c")).unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let again = dirs.below(me, &root, &ab).unwrap();
        assert_ne!(again.id, first.id, "the new a/b");
        let c = dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"c/b")).unwrap();
        assert_eq!(c.id, first.id, "the same directory, by its new name");
        assert!(c.path.ends_with(b"/c/b"));
    }

    #[test]
    fn paths_through_symlinks_or_dot_dot_are_never_remembered() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("real/sub")).unwrap();
        std::os::unix::fs::symlink("real", t.path().join("link")).unwrap();
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let mut dirs = Dirs::default();
        let root = dirs.root().unwrap();
        let tmp = t.path().strip_prefix("/").unwrap().as_os_str().as_encoded_bytes().to_vec();
        assert!(dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"link/sub")).is_none());
        assert!(dirs.below(me, &root, &[&tmp[..], b"/real/sub/.."].concat()).is_none());
        assert!(dirs.below.is_empty());
    }

    #[test]
    fn a_working_directory_renamed_keeps_serving_under_its_new_name() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("w")).unwrap();
        let child = std::process::Command::new("sleep").arg("10").current_dir(t.path().join("w")).spawn().unwrap();
        let pid = child.id();
        let mut dirs = Dirs::default();
        let Ok(d) = dirs.start(pid, pid, Start::Cwd) else { panic!("cwd") };
        assert!(d.path.ends_with(b"/w"));
        std::fs::rename(t.path().join("w"), t.path().join("v")).unwrap();
        let Ok(d) = dirs.start(pid, pid, Start::Cwd) else { panic!("cwd") };
        assert!(d.path.ends_with(b"/v"), "{:?}", String::from_utf8_lossy(&d.path));
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
}
