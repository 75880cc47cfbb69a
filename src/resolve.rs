//! Turning the path a program passed (relative to its cwd or to a directory descriptor, through
//! symlinks and `..`) into the absolute, symlink-free name the journal records, plus a
//! descriptor for the directory it lives in.
//!
//! The kernel resolves the program's own call; this module resolves the *same* path the same
//! way beforehand, so that the capture and the record name the object the call will act on.
//! The parent directory is opened with `O_PATH`. When the path to it is plain (no empty, `.`
//! or `..` component) and the kernel reaches it without following a symlink (`openat2` with
//! `RESOLVE_NO_SYMLINKS`), the base's canonical name joined with that path is the directory's
//! canonical name; otherwise it is named through `/proc/self/fd`, which gives its canonical
//! path (a fresh process pays about 25 us for its first such lookup). The final component is
//! kept as written (it is the name that changes).
//!
//! What this module cannot do: see a path change between its resolution and the program's own
//! call (another process renaming a parent in between). It also needs `/proc`; without it the
//! name is joined lexically and may contain symlinks.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::bpath::{BPath, join};
use crate::capture::FsCalls;

/// Longest chain of symlinks followed (the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

/// A directory descriptor that is either the caller's or one we opened.
#[derive(Debug)]
pub enum DirFd<'a> {
    /// The caller's descriptor (or `AT_FDCWD`).
    Borrowed(BorrowedFd<'a>),
    /// Opened by the resolver; closed on drop.
    Owned(OwnedFd),
    /// Kept open by a cache of directories (the supervisor's), shared with it.
    Shared(std::sync::Arc<OwnedFd>),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Borrowed(b) => *b,
            DirFd::Owned(o) => o.as_fd(),
            DirFd::Shared(s) => s.as_fd(),
        }
    }
}

/// A resolved target: the directory it lives in, its name there, and its absolute path.
#[derive(Debug)]
pub struct Target<'a> {
    /// The parent directory.
    pub parent: DirFd<'a>,
    /// The final component (never empty, never `.` or `..`).
    pub name: Vec<u8>,
    /// Canonical parent path joined with `name`.
    pub abs: BPath,
    /// What an `lstat` of the final component said while it was resolved (to see whether it
    /// is a symlink to follow), so that the caller need not ask again.
    pub looked: Looked,
}

/// See [`Target::looked`].
#[derive(Clone, Copy, Debug, Default)]
pub enum Looked {
    /// Not looked at.
    #[default]
    No,
    /// Nothing there.
    Absent,
    /// This, and not a symlink.
    Present(rustix::fs::Stat),
}

impl Looked {
    /// What a `lstat` result says.
    pub fn of(r: Result<rustix::fs::Stat, Errno>) -> Looked {
        match r {
            Ok(st) => Looked::Present(st),
            Err(Errno::NOENT) => Looked::Absent,
            Err(_) => Looked::No,
        }
    }
}

/// Why a path was not resolved.
#[derive(Debug)]
pub enum Unresolved {
    /// The program's own call will fail the same way (a missing or inaccessible parent, a
    /// final `.` or `..`, an empty path): there is nothing to journal.
    CallWillFail(Errno),
    /// Resolution failed for a reason of its own; the lexical path is the best name we have.
    Failed {
        /// Lexical absolute path.
        lexical: BPath,
        /// What failed.
        error: io::Error,
    },
}

/// Canonical path of an open descriptor, read from `/proc/self/fd/N`.
pub fn fd_path(fd: RawFd) -> io::Result<Vec<u8>> {
    let link = format!("/proc/self/fd/{fd}");
    match rustix::fs::readlinkat(CWD, link.as_str(), Vec::new()) {
        Ok(p) => Ok(p.into_bytes()),
        // Deeper than the kernel names (a directory whose path is over PATH_MAX).
        // The link still leads to the directory when opened.
        Err(Errno::NAMETOOLONG) => {
            let dir =
                rustix::fs::open(link.as_str(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
            dir_path_by_walking_up(dir.as_fd())
        }
        Err(e) => Err(e.into()),
    }
}

/// The current working directory, however deep.
pub fn getcwd() -> io::Result<Vec<u8>> {
    match rustix::process::getcwd(Vec::new()) {
        Ok(p) => Ok(p.into_bytes()),
        Err(Errno::NAMETOOLONG | Errno::RANGE) => dir_path_by_walking_up(CWD),
        Err(e) => Err(e.into()),
    }
}

/// The absolute path of directory `dir` (or the cwd, for `CWD`), found by walking up through
/// `..` and finding each directory by identity among its parent's entries: for a directory
/// deeper than the kernel will name (`getcwd` and the `/proc` links fail with `ENAMETOOLONG`
/// past `PATH_MAX`). Each step is relative to a descriptor, so no path it builds is ever
/// looked up whole.
///
/// What this cannot do: name a directory a concurrent rename moves while it walks (it names
/// where it found each one), or one whose parent it may not read.
pub fn dir_path_by_walking_up(dir: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut cur = rustix::fs::openat(dir, ".", flags, Mode::empty())?;
    let mut names: Vec<Vec<u8>> = Vec::new();
    // A path cannot be deeper than this many components of at least one byte and a slash.
    for _ in 0..(1 << 20) {
        let st = rustix::fs::fstat(&cur)?;
        let parent = rustix::fs::openat(&cur, "..", flags, Mode::empty())?;
        let pst = rustix::fs::fstat(&parent)?;
        if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino) {
            let mut path = Vec::new();
            for n in names.iter().rev() {
                path.push(b'/');
                path.extend_from_slice(n);
            }
            return Ok(if path.is_empty() { b"/".to_vec() } else { path });
        }
        names.push(name_in(&parent, &st)?);
        cur = parent;
    }
    Err(Errno::LOOP.into())
}

/// Opens directory `dir` (absolute and symlink-free, as the journal names paths) one component
/// at a time, `O_PATH`, never following a symlink nor going up (`..` is `ELOOP`): a directory
/// deeper than `PATH_MAX`, which no call can be given whole, is reached this way.
pub fn open_dir_by_components(dir: &[u8]) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut cur = rustix::fs::open("/", flags, Mode::empty())?;
    for part in dir.split(|&b| b == b'/').filter(|p| !p.is_empty() && *p != b".") {
        if part == b".." {
            return Err(Errno::LOOP);
        }
        cur = rustix::fs::openat(&cur, part, flags, Mode::empty())?;
    }
    Ok(cur)
}

/// Runs `f` on `path` as a directory descriptor and a name in it: `CWD` and the whole path
/// for an ordinary one, the parent opened by [`open_dir_by_components`] and the last
/// component for one of [`LONG_PATH`] bytes or more.
pub fn at_path<T>(path: &[u8], f: impl FnOnce(BorrowedFd<'_>, &[u8]) -> Result<T, Errno>) -> Result<T, Errno> {
    if path.len() < LONG_PATH || path.first() != Some(&b'/') {
        return f(CWD, path);
    }
    let (dir, name) = split_last(path);
    let parent = open_dir_by_components(dir)?;
    f(parent.as_fd(), name)
}

/// Paths at least this long are looked at through [`open_dir_by_components`] (the kernel
/// refuses a whole path of `PATH_MAX` bytes or more with `ENAMETOOLONG`).
pub const LONG_PATH: usize = 4096;

/// The name under which directory `parent` holds the node `st` describes: by the inode number
/// its entries give, confirmed by a look at it, or, for a mount point (whose entry names the
/// covered directory's inode), by looking at each subdirectory.
fn name_in(parent: &OwnedFd, st: &rustix::fs::Stat) -> io::Result<Vec<u8>> {
    let is_it = |name: &[u8]| {
        rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino))
    };
    let mut others = Vec::new();
    let mut entries = rustix::fs::Dir::read_from(parent)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if entry.ino() == st.st_ino && is_it(name) {
            return Ok(name.to_vec());
        }
        if matches!(entry.file_type(), FileType::Directory | FileType::Unknown) {
            others.push(name.to_vec());
        }
    }
    others.into_iter().find(|n| is_it(n)).ok_or_else(|| Errno::NOENT.into())
}

/// Splits a path into its directory part (empty for a bare name, `/` for a name in the root)
/// and its final component, ignoring trailing slashes.
pub fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    let end = path.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
    let trimmed = &path[..end];
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => (if i == 0 { &path[..1] } else { &trimmed[..i] }, &trimmed[i + 1..]),
        None => (&b""[..], trimmed),
    }
}

/// Resolves `path` as the kernel would for a call made relative to `base` (whose canonical
/// path is `base_path`; `AT_FDCWD` with the cwd for plain calls). With `follow`, a final
/// symlink is followed (as `open` without `O_NOFOLLOW` does), up to 40 links. Directories are
/// opened through `calls` (a shim's are marked for its supervisor).
pub fn resolve<'a>(
    base: BorrowedFd<'a>,
    base_path: &[u8],
    path: &[u8],
    follow: bool,
    calls: &dyn FsCalls,
) -> Result<Target<'a>, Unresolved> {
    if path.is_empty() {
        return Err(Unresolved::CallWillFail(Errno::NOENT));
    }
    let target = resolve_once(base, base_path, path, calls)?;
    if !follow {
        return Ok(target);
    }
    follow_final(target, calls)
}

/// Follows a final symlink at `target`, up to 40 links.
fn follow_final<'a>(mut target: Target<'a>, calls: &dyn FsCalls) -> Result<Target<'a>, Unresolved> {
    for _ in 0..MAX_SYMLINKS {
        let st = match rustix::fs::statat(target.parent.as_fd(), target.name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) => return Ok(Target { looked: Looked::of(Err(e)), ..target }),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
            return Ok(Target { looked: Looked::Present(st), ..target });
        }
        let link = rustix::fs::readlinkat(target.parent.as_fd(), target.name.as_slice(), Vec::new())
            .map_err(|e| Unresolved::Failed { lexical: target.abs.clone(), error: e.into() })?
            .into_bytes();
        let dir_path = target.abs.split_parent().map(|(p, _)| p.to_vec()).unwrap_or_else(|| b"/".to_vec());
        // The link's target is resolved relative to the directory holding the link.
        let next = match target.parent {
            DirFd::Borrowed(b) => resolve_once(b, &dir_path, &link, calls)?,
            kept => resolve_once_keeping(kept, &dir_path, &link, calls)?,
        };
        target = next;
    }
    Err(Unresolved::CallWillFail(Errno::LOOP))
}

/// [`resolve`] from a directory the caller either borrows or hands over: a base the resolver
/// owns (a supervisor's descriptor for another process's directory) stays open as long as
/// the target needs it (for a bare name, it is the target's parent).
pub fn resolve_from<'a>(
    base: DirFd<'a>,
    base_path: &[u8],
    path: &[u8],
    follow: bool,
    calls: &dyn FsCalls,
) -> Result<Target<'a>, Unresolved> {
    let base = match base {
        DirFd::Borrowed(b) => return resolve(b, base_path, path, follow, calls),
        kept => kept,
    };
    if path.is_empty() {
        return Err(Unresolved::CallWillFail(Errno::NOENT));
    }
    let target = resolve_once_keeping(base, base_path, path, calls)?;
    if !follow {
        return Ok(target);
    }
    follow_final(target, calls)
}

/// [`resolve_once`] from a directory the resolver owns or shares: a target that lives in it
/// (a bare name) keeps it open as its parent.
fn resolve_once_keeping<'a>(
    dir: DirFd<'a>,
    dir_path: &[u8],
    path: &[u8],
    calls: &dyn FsCalls,
) -> Result<Target<'a>, Unresolved> {
    let (dir_part, name) = split_last(path);
    if dir_part.is_empty() {
        if name.is_empty() || name == b"." || name == b".." {
            return Err(Unresolved::CallWillFail(Errno::INVAL));
        }
        let abs = BPath::new(join(dir_path, name));
        return Ok(Target { parent: dir, name: name.to_vec(), abs, looked: Looked::No });
    }
    let t = resolve_once(dir.as_fd(), dir_path, path, calls)?;
    match t.parent {
        DirFd::Owned(parent) => Ok(Target { parent: DirFd::Owned(parent), ..t }),
        DirFd::Borrowed(_) | DirFd::Shared(_) => Err(Unresolved::CallWillFail(Errno::INVAL)),
    }
}

fn resolve_once<'a>(
    base: BorrowedFd<'a>,
    base_path: &[u8],
    path: &[u8],
    calls: &dyn FsCalls,
) -> Result<Target<'a>, Unresolved> {
    let (dir_part, name) = split_last(path);
    if name.is_empty() || name == b"." || name == b".." {
        // `/`, `x/.`, `..`: no mutating call can succeed on these names.
        return Err(Unresolved::CallWillFail(Errno::INVAL));
    }
    let lexical = || BPath::new(join(base_path, path));
    if dir_part.is_empty() {
        let abs = join(base_path, name);
        return Ok(Target {
            parent: DirFd::Borrowed(base),
            name: name.to_vec(),
            abs: BPath::new(abs),
            looked: Looked::No,
        });
    }
    // Reached plainly, with no symlink on the way: the base's name joined with the path is the
    // directory's canonical name, with no lookup in /proc (see the module's documentation).
    if base_path.first() == Some(&b'/') && crate::bpath::is_plain(dir_part) {
        match crate::capture::with_c_path(dir_part, |p| calls.open_dir_no_symlinks(base, p)) {
            Ok(dir) => {
                let abs = join(&join(base_path, dir_part), name);
                return Ok(Target {
                    parent: DirFd::Owned(dir),
                    name: name.to_vec(),
                    abs: BPath::new(abs),
                    looked: Looked::No,
                });
            }
            // What the open below would fail with too (a symlink could not have changed it).
            Err(e @ (Errno::NOENT | Errno::NOTDIR | Errno::ACCESS | Errno::NAMETOOLONG)) => {
                return Err(Unresolved::CallWillFail(e));
            }
            // A symlink on the way (ELOOP), no openat2: the general way.
            Err(_) => {}
        }
    }
    let dir =
        match rustix::fs::openat(base, dir_part, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(e @ (Errno::NOENT | Errno::NOTDIR | Errno::ACCESS | Errno::LOOP | Errno::NAMETOOLONG)) => {
                return Err(Unresolved::CallWillFail(e));
            }
            Err(e) => return Err(Unresolved::Failed { lexical: lexical(), error: e.into() }),
        };
    let canonical = match fd_path(dir.as_raw_fd()) {
        Ok(p) if p.first() == Some(&b'/') => p,
        // No /proc, or an unreachable directory: the lexical name is the best we have.
        _ => join(base_path, dir_part),
    };
    let abs = join(&canonical, name);
    Ok(Target { parent: DirFd::Owned(dir), name: name.to_vec(), abs: BPath::new(abs), looked: Looked::No })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::Direct;
    use std::os::unix::ffi::OsStrExt;

    fn tmp() -> (tempfile::TempDir, Vec<u8>) {
        let t = tempfile::tempdir().unwrap();
        let canon = std::fs::canonicalize(t.path()).unwrap().as_os_str().as_bytes().to_vec();
        (t, canon)
    }

    #[test]
    fn a_path_through_a_symlinked_directory_is_recorded_by_its_real_parent() {
        let (t, canon) = tmp();
        std::fs::create_dir(t.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", t.path().join("via")).unwrap();
        let tgt = resolve(CWD, b"/", &join(&canon, b"via/f"), false, &Direct).unwrap();
        assert_eq!(tgt.abs.as_bytes(), join(&canon, b"real/f"));
        assert_eq!(tgt.name, b"f");
    }

    #[test]
    fn dotdot_is_resolved_by_the_kernel_not_lexically() {
        let (t, canon) = tmp();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("a/b", t.path().join("l")).unwrap();
        // l/.. is a, not the temp dir.
        let tgt = resolve(CWD, b"/", &join(&canon, b"l/../x"), false, &Direct).unwrap();
        assert_eq!(tgt.abs.as_bytes(), join(&canon, b"a/x"));
    }

    #[test]
    fn a_final_symlink_is_followed_only_when_asked() {
        let (t, canon) = tmp();
        std::fs::write(t.path().join("target"), b"x").unwrap();
        std::os::unix::fs::symlink("target", t.path().join("link")).unwrap();
        let p = join(&canon, b"link");
        assert_eq!(resolve(CWD, b"/", &p, false, &Direct).unwrap().abs.as_bytes(), p);
        assert_eq!(resolve(CWD, b"/", &p, true, &Direct).unwrap().abs.as_bytes(), join(&canon, b"target"));
    }

    #[test]
    fn a_dangling_symlink_resolves_to_the_file_open_would_create() {
        let (t, canon) = tmp();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d/new", t.path().join("link")).unwrap();
        let tgt = resolve(CWD, b"/", &join(&canon, b"link"), true, &Direct).unwrap();
        assert_eq!(tgt.abs.as_bytes(), join(&canon, b"d/new"));
    }

    #[test]
    fn a_missing_parent_means_the_call_will_fail() {
        let (_t, canon) = tmp();
        assert!(matches!(
            resolve(CWD, b"/", &join(&canon, b"nope/f"), false, &Direct),
            Err(Unresolved::CallWillFail(Errno::NOENT))
        ));
        assert!(matches!(resolve(CWD, b"/", b"", false, &Direct), Err(Unresolved::CallWillFail(_))));
        assert!(matches!(resolve(CWD, b"/", &join(&canon, b".."), false, &Direct), Err(Unresolved::CallWillFail(_))));
    }

    #[test]
    fn a_relative_name_joins_the_base_path() {
        let (t, canon) = tmp();
        let dir = std::fs::File::open(t.path()).unwrap();
        let tgt = resolve(dir.as_fd(), &canon, b"name\nwith newline", false, &Direct).unwrap();
        assert_eq!(tgt.abs.as_bytes(), join(&canon, b"name\nwith newline"));
    }
}
