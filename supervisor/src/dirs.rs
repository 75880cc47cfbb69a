//! What a worker remembers of the directories watched processes name, so that most calls are
//! resolved without opening anything: a thread's working directory and the directories a
//! process's descriptors are open on, and the directories relative paths led to from them.
//!
//! A remembered directory is checked again, one `stat` each, unless it was checked less than
//! [`PATH_TRUST_NS`] ago and nothing since could have changed where its path leads: no process
//! of the session renamed or removed a directory or symlink (the session's names generation,
//! which the shim and the supervisor both move), and none changed its working directory (the
//! session's working-directory generation, moved before each `chdir` and `fchdir`: by the
//! shim before one it makes itself, marked, by the supervisor before one the filter sends it),
//! with no such call still under way (the shim's: a generation's changes done behind it, in
//! the counters; the supervisor's: [`Changes`]). The check, when made: a start is
//! the one `/proc/TID/cwd` (or `fd/N`) leads to now when its identity is the same, and its
//! remembered name is current when that name still leads to it (else its name is asked
//! again); a directory below a start is the one its relative path leads to now when that path,
//! walked from the start, leads to the same identity. A directory a descriptor names is
//! checked at every use (a descriptor can be closed and its number reused without any call the
//! supervisor sees). A path is remembered only when it has no `.`, `..` or symlink in it (where
//! those lead can change without a directory moving). The cache holds descriptors, so it is
//! small: full, it starts over.
//!
//! What this module cannot do: see into another mount namespace (a process that made its own
//! is not resolved here; see `target.rs`), notice within [`PATH_TRUST_NS`] a directory moved
//! or mounted over by a process outside the session (the shim trusts its own memory of
//! directory paths for as long: README, "What this cannot do"), or close the race every
//! capture has, a directory moved between the check and the kernel's own walk.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use aether_journal::capture::ident_of;
use aether_journal::record::Ident;
use aether_journal_recorder::ops::PATH_TRUST_NS;
use aether_journal_recorder::tables::SharedCounters;
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

/// The cache: per thread, its starting directories, and per process the directories relative
/// paths from them led to, each with when it was last checked.
#[derive(Default)]
pub struct Dirs {
    /// By process, thread and start.
    starts: HashMap<(u32, u32, Start), Kept>,
    /// By process, the start's identity and the relative path.
    below: HashMap<(u32, Ident, Vec<u8>), Kept>,
}

/// A remembered directory, and when it was last checked (`None`: while a change was under
/// way, or where nothing is trusted: checked again at its next use).
type Kept = (Dir, Option<Checked>);

/// The generations and time under which a remembered directory was last checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    /// The session's names generation, read before the check.
    pub names: u64,
    /// The session's working-directory generation, read before it.
    pub cwd: u64,
    /// `CLOCK_MONOTONIC_COARSE`, in nanoseconds.
    pub at: u64,
}

impl Checked {
    /// Now, when nothing that changes where paths lead is under way; `None` otherwise (what is
    /// checked meanwhile is not trusted later).
    pub fn now(changes: &Changes, counters: &SharedCounters) -> Option<Checked> {
        if !changes.settled(counters) {
            return None;
        }
        Some(Checked { names: counters.names_settled()?, cwd: counters.cwd_settled()?, at: coarse_now() })
    }

    /// Whether a directory checked at `self` may be trusted without looking at `now`.
    fn covers(&self, now: &Checked) -> bool {
        self.names == now.names && self.cwd == now.cwd && now.at.wrapping_sub(self.at) < PATH_TRUST_NS
    }
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds (vDSO: no system call).
fn coarse_now() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// The calls the supervisor let run that may change where paths lead (a directory or symlink
/// renamed or removed, a working directory changed), until each is known to have run: the
/// kernel runs a call after the answer, so a directory checked between the two may no longer
/// be where its path leads. Shared by the workers.
///
/// Each such call has moved a generation of the session's counters before its answer (the
/// recorder moves the names generation, [`Changes::begin_cwd`] the working-directory one) and
/// is counted done in it once it has run: when its thread is next heard from, or
/// `/proc/TID/syscall` shows it elsewhere. While one is under way, nothing checked is trusted
/// later.
#[derive(Default)]
pub struct Changes {
    /// Whether `under_way` may hold anything (a lock-free look for the usual case).
    any: AtomicBool,
    under_way: Mutex<Vec<UnderWay>>,
}

/// One call let run that may change where paths lead.
#[derive(Clone, Copy, Debug)]
struct UnderWay {
    tid: u32,
    nr: i64,
    /// A working directory (else names).
    cwd: bool,
}

impl Changes {
    /// Before answering call `nr` of thread `tid`, which may change where names lead (the
    /// recorder has moved the names generation).
    pub fn begin_names(&self, tid: u32, nr: i64) {
        self.begin(tid, nr, false);
    }

    /// Before answering call `nr` of thread `tid`, which changes its working directory: moves
    /// the session's working-directory generation.
    pub fn begin_cwd(&self, tid: u32, nr: i64, counters: &SharedCounters) {
        counters.cwd_changing();
        self.begin(tid, nr, true);
    }

    fn begin(&self, tid: u32, nr: i64, cwd: bool) {
        if let Ok(mut u) = self.under_way.lock() {
            u.push(UnderWay { tid, nr, cwd });
            self.any.store(true, Ordering::SeqCst);
        }
    }

    /// Thread `tid` makes another watched call: whatever it had under way has run.
    pub fn heard_from(&self, tid: u32, counters: &SharedCounters) {
        if self.any.load(Ordering::SeqCst) {
            self.finish(counters, |u| u.tid != tid);
        }
    }

    /// Whether nothing is under way (asking `/proc` about what may have run since).
    pub fn settled(&self, counters: &SharedCounters) -> bool {
        !self.any.load(Ordering::SeqCst) || self.finish(counters, |u| still_in(u.tid, u.nr))
    }

    /// Keeps the calls `keep` says are still under way, moving the generations of the others;
    /// whether none is left.
    fn finish(&self, counters: &SharedCounters, keep: impl Fn(&UnderWay) -> bool) -> bool {
        let Ok(mut u) = self.under_way.lock() else { return false };
        u.retain(|c| {
            if keep(c) {
                return true;
            }
            if c.cwd {
                counters.cwd_changed();
            } else {
                counters.names_changed();
            }
            false
        });
        self.any.store(!u.is_empty(), Ordering::SeqCst);
        u.is_empty()
    }
}

/// Whether thread `tid` may still be in system call `nr` (`/proc/TID/syscall`: its number, or
/// `running` when the thread is on a CPU, which says nothing).
fn still_in(tid: u32, nr: i64) -> bool {
    let mut buf = [0u8; 32];
    let read = rustix::fs::openat(
        CWD,
        format!("/proc/{tid}/syscall").as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .and_then(|fd| rustix::io::read(&fd, &mut buf));
    match read {
        Ok(n) => {
            let first = buf[..n].split(|&b| b == b' ' || b == b'\n').next().unwrap_or_default();
            first == b"running" || std::str::from_utf8(first).ok().and_then(|v| v.parse::<i64>().ok()) == Some(nr)
        }
        // Gone: it will not run the call any more.
        Err(Errno::NOENT | Errno::SRCH) => false,
        Err(_) => true,
    }
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
        self.starts.retain(|(p, _, _), _| *p != pid);
        self.below.retain(|(p, _, _), _| *p != pid);
    }

    /// The directory thread `tid` of process `pid` starts from (`start`), as it is now: the
    /// remembered one if it was checked under `now` (a working directory only; see the module
    /// documentation), or if `/proc/TID/...` still leads to it (by its current name), else
    /// opened again. `now`: [`Checked::now`], read before anything is looked at (`None`:
    /// nothing is trusted, and nothing checked now will be).
    pub fn start(&mut self, pid: u32, tid: u32, start: Start, now: Option<Checked>) -> Result<Dir, DirError> {
        let key = (pid, tid, start);
        if let (Start::Cwd, Some(now)) = (start, &now)
            && let Some((d, Some(checked))) = self.starts.get(&key)
            && checked.covers(now)
        {
            return Ok(d.clone());
        }
        let link = match start {
            Start::Cwd => format!("/proc/{tid}/cwd"),
            Start::Fd(n) => format!("/proc/{tid}/fd/{n}"),
        };
        let ident = match rustix::fs::statat(CWD, link.as_str(), AtFlags::empty()) {
            Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory => {
                ident_of(&st)
            }
            Ok(_) | Err(Errno::NOENT | Errno::NOTDIR | Errno::BADF) => return Err(DirError::WillFail),
            Err(e) => return Err(DirError::Failed(format!("{link}: {}", std::io::Error::from(e)))),
        };
        if let Some((d, checked)) = self.starts.get_mut(&key)
            && d.id == ident
            && still_named(d)
        {
            *checked = now;
            return Ok(d.clone());
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
        self.keep_start(key, d.clone(), now);
        Ok(d)
    }

    /// The directory `dir_part` leads to from `base` (a directory of process `pid`, its
    /// `path` current), if it is one and the path is one the cache can check (see the module
    /// documentation): remembered (trusted when checked under `now`, else checked), or opened
    /// now. `None`: the resolver must look (the path has `.`, `..` or a symlink in it, does
    /// not exist, is not a directory, or cannot be opened here).
    pub fn below(&mut self, pid: u32, base: &Dir, dir_part: &[u8], now: Option<Checked>) -> Option<Dir> {
        let rel = plain(dir_part)?;
        let expected = joined(&base.path, &rel);
        let key = (pid, base.id, rel);
        if let Some((d, checked)) = self.below.get_mut(&key) {
            if now.is_some_and(|now| checked.is_some_and(|c| c.covers(&now))) && d.path == expected {
                return Some(d.clone());
            }
            // One stat from the start (cheaper than asking the directory's name): the path
            // still leads to it.
            match rustix::fs::statat(&*base.fd, &key.2[..], AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if ident_of(&st) == d.id => {
                    d.path = expected;
                    *checked = now;
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
        self.below.insert(key, (d.clone(), now));
        Some(d)
    }

    /// The root directory, for absolute names (a chrooted process's are not resolved here).
    pub fn root(&mut self) -> Option<Dir> {
        let key = (0, 0, Start::Cwd);
        if let Some((d, _)) = self.starts.get(&key) {
            return Some(d.clone());
        }
        let fd =
            rustix::fs::openat(CWD, "/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        let d = Dir { id: ident_of(&st), fd: Arc::new(fd), path: b"/".to_vec() };
        self.keep_start(key, d.clone(), None);
        Some(d)
    }

    fn keep_start(&mut self, key: (u32, u32, Start), d: Dir, checked: Option<Checked>) {
        if self.starts.len() >= MOST {
            self.starts.clear();
        }
        self.starts.insert(key, (d, checked));
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

    /// A temporary directory holding `a/b`, this thread's id, a cache with the root in it, and
    /// the temporary directory's path relative to the root.
    fn with_a_b() -> (tempfile::TempDir, u32, Dirs, Dir, Vec<u8>) {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let mut dirs = Dirs::default();
        let root = dirs.root().unwrap();
        let tmp = t.path().strip_prefix("/").unwrap().as_os_str().as_encoded_bytes().to_vec();
        (t, me, dirs, root, tmp)
    }

    #[test]
    fn a_remembered_directory_serves_while_its_path_leads_to_it_and_not_after_it_moved() {
        let (t, me, mut dirs, root, tmp) = with_a_b();
        let ab = aether_journal::bpath::join(&tmp, b"a/b");
        let first = dirs.below(me, &root, &ab, None).unwrap();
        assert!(first.path.ends_with(b"/a/b"));
        assert!(Arc::ptr_eq(&dirs.below(me, &root, &ab, None).unwrap().fd, &first.fd), "remembered");
        // Moved (by anyone): the remembered one no longer serves for the old path.
        std::fs::rename(t.path().join("a"), t.path().join("c")).unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let again = dirs.below(me, &root, &ab, None).unwrap();
        assert_ne!(again.id, first.id, "the new a/b");
        let c = dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"c/b"), None).unwrap();
        assert_eq!(c.id, first.id, "the same directory, by its new name");
        assert!(c.path.ends_with(b"/c/b"));
    }

    #[test]
    fn a_remembered_directory_is_trusted_only_within_its_time_and_under_the_same_generations() {
        let (t, me, mut dirs, root, tmp) = with_a_b();
        let ab = aether_journal::bpath::join(&tmp, b"a/b");
        let checked = Checked { names: 7, cwd: 3, at: coarse_now() };
        let first = dirs.below(me, &root, &ab, Some(checked)).unwrap();
        // Moved by a process outside the session, which moves no generation.
        std::fs::rename(t.path().join("a"), t.path().join("c")).unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let soon = Checked { at: checked.at + PATH_TRUST_NS / 2, ..checked };
        assert_eq!(dirs.below(me, &root, &ab, Some(soon)).unwrap().id, first.id, "trusted: nothing was looked at");
        for (what, now) in [
            ("nothing trusted", None),
            ("the names generation moved", Some(Checked { names: 8, ..soon })),
            ("the working-directory generation moved", Some(Checked { cwd: 4, ..soon })),
            ("too long ago", Some(Checked { at: checked.at + PATH_TRUST_NS, ..checked })),
        ] {
            let mut dirs = Dirs::default();
            let root = dirs.root().unwrap();
            std::fs::create_dir_all(t.path().join("d/b")).unwrap();
            let db = aether_journal::bpath::join(&tmp, b"d/b");
            let before = dirs.below(me, &root, &db, Some(checked)).unwrap();
            std::fs::rename(t.path().join("d"), t.path().join(format!("d-{}", what.len()))).unwrap();
            std::fs::create_dir_all(t.path().join("d/b")).unwrap();
            assert_ne!(dirs.below(me, &root, &db, now).unwrap().id, before.id, "{what}: looked at again");
        }
    }

    #[test]
    fn a_call_under_way_keeps_every_directory_from_being_trusted_until_it_has_run() {
        let t = tempfile::tempdir().unwrap();
        let counters = SharedCounters::open(&t.path().join("counters")).unwrap();
        let changes = Changes::default();
        assert!(Checked::now(&changes, &counters).is_some(), "nothing under way");
        // A thread asleep in a call: still in it, as far as /proc says. Waited for until it is
        // in sleep's own call: while it starts, /proc can show it blocked in the loader's calls
        // or in a page fault (-1), and then running, which would say nothing below.
        let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let tid = child.id();
        let asleep_in = |tid: u32| -> i64 {
            for _ in 0..1000 {
                let s = std::fs::read_to_string(format!("/proc/{tid}/syscall")).unwrap_or_default();
                let nr = s.split(' ').next().and_then(|v| v.parse().ok());
                if let Some(nr @ (libc::SYS_clock_nanosleep | libc::SYS_nanosleep)) = nr {
                    return nr;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            panic!("the child never slept");
        };
        let nr = asleep_in(tid);
        let (names, cwd) = (counters.names_gen(), counters.cwd_gen());
        changes.begin_cwd(tid, nr, &counters);
        assert_eq!(counters.cwd_gen(), cwd + 1, "moved before the answer");
        assert!(Checked::now(&changes, &counters).is_none(), "the thread is still in the call");
        // Heard from again: the call has run, and it is counted done.
        changes.heard_from(tid, &counters);
        assert_eq!(counters.cwd_settled(), Some(cwd + 1), "counted done once it has run");
        assert!(Checked::now(&changes, &counters).is_some());
        // A call the thread is no longer in (it sleeps in another) has run. (The recorder
        // announces a change of names before `begin_names`.)
        counters.names_changing();
        changes.begin_names(tid, libc::SYS_renameat2);
        assert!(Checked::now(&changes, &counters).is_some(), "/proc shows it elsewhere");
        assert_eq!(counters.names_settled(), Some(names + 1), "counted done once it was known to have run");
        // A thread that has gone will not run its call any more.
        counters.names_changing();
        changes.begin_names(tid, nr);
        assert!(Checked::now(&changes, &counters).is_none(), "the thread is still in the call");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(Checked::now(&changes, &counters).is_some());
    }

    #[test]
    fn nothing_checked_while_a_process_changes_its_working_directory_or_a_name_itself_is_trusted() {
        // The shim's marked chdir and its renames never reach the supervisor: between the two
        // counts the kernel may run the call at any moment, so a directory checked then may be
        // stale by the time it is used, even before anything is counted again.
        let t = tempfile::tempdir().unwrap();
        let counters = SharedCounters::open(&t.path().join("counters")).unwrap();
        let changes = Changes::default();
        type Count = fn(&SharedCounters);
        let both: [(&str, Count, Count); 2] = [
            ("a chdir", SharedCounters::cwd_changing, SharedCounters::cwd_changed),
            ("a rename", SharedCounters::names_changing, SharedCounters::names_changed),
        ];
        for (what, begin, done) in both {
            let before = Checked::now(&changes, &counters).expect("nothing under way");
            begin(&counters);
            assert!(Checked::now(&changes, &counters).is_none(), "{what} is under way");
            done(&counters);
            let after = Checked::now(&changes, &counters).expect("it has run");
            assert!(!before.covers(&after), "what was checked before {what} is not trusted after it");
            assert!(after.covers(&Checked::now(&changes, &counters).unwrap()));
        }
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
        assert!(dirs.below(me, &root, &aether_journal::bpath::join(&tmp, b"link/sub"), None).is_none());
        assert!(dirs.below(me, &root, &[&tmp[..], b"/real/sub/.."].concat(), None).is_none());
        assert!(dirs.below.is_empty());
    }

    #[test]
    fn a_working_directory_renamed_keeps_serving_under_its_new_name() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("w")).unwrap();
        let child = std::process::Command::new("sleep").arg("10").current_dir(t.path().join("w")).spawn().unwrap();
        let pid = child.id();
        let mut dirs = Dirs::default();
        let Ok(d) = dirs.start(pid, pid, Start::Cwd, None) else { panic!("cwd") };
        assert!(d.path.ends_with(b"/w"));
        std::fs::rename(t.path().join("w"), t.path().join("v")).unwrap();
        let Ok(d) = dirs.start(pid, pid, Start::Cwd, None) else { panic!("cwd") };
        assert!(d.path.ends_with(b"/v"), "{:?}", String::from_utf8_lossy(&d.path));
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
}
