//! A watched thread seen from the supervisor: its memory (read with `process_vm_readv`, page by
//! page, as bytes), its working directory and descriptors (through `/proc/TID/`), and the
//! process it belongs to.
//!
//! What this module cannot do: read a thread the supervisor may not trace (a program that made
//! itself non-dumpable, Yama's restrictions, a container that blocks `process_vm_readv`): the
//! call is then journaled as irreversible with the reason. Nor can it keep the thread, or
//! another thread of its process, from changing the memory it read before the kernel reads it
//! again (README, "What this cannot do").

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use aether_journal::BPath;
use aether_journal::record::Endpoint;
use aether_journal::resolve::DirFd;
use aether_journal::resolve::{Looked, Target, split_last};
use aether_journal_recorder::ops::{Base, BaseError, Caller, Journal};

use crate::dirs::{Changes, Checked, DirError, Dirs, Start};
use rustix::fs::{CWD, Mode, OFlags};
use rustix::io::Errno;

/// Why memory of a watched thread could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The address is not mapped: the call will fail with EFAULT and change nothing.
    Fault,
    /// The string is longer than the kernel accepts for this argument: the call will fail.
    TooLong,
    /// The thread has gone: the call will never run.
    Gone,
    /// The supervisor may not read it (`EPERM`: not traceable).
    Denied(i32),
}

const PAGE: usize = 4096;
/// How much of each argument string [`Thread::read_argv`] reads at first.
const FIRST: usize = 512;
/// Strings read by one vectored read (the kernel's `IOV_MAX` is 1024).
const IOV_BATCH: usize = 256;

/// The start of a string: all of it, or its first bytes with no NUL among them.
enum Head {
    Whole(Vec<u8>),
    Partial(Vec<u8>),
}

/// A thread waiting in a watched call.
pub struct Thread {
    /// Its id.
    pub tid: u32,
}

impl Thread {
    /// Reads `buf.len()` bytes at `addr` of the thread's memory.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: one local iovec over `buf`, which we own and which is `buf.len()` bytes; the
        // remote one names memory of the other process, which the kernel checks.
        let n = unsafe { libc::process_vm_readv(self.tid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n == buf.len() as isize {
            return Ok(());
        }
        if n >= 0 {
            return Err(ReadError::Fault);
        }
        Err(match io::Error::last_os_error().raw_os_error().unwrap_or(0) {
            libc::EFAULT => ReadError::Fault,
            libc::ESRCH => ReadError::Gone,
            e => ReadError::Denied(e),
        })
    }

    /// A `u64` at `addr`.
    pub fn read_u64(&self, addr: u64) -> Result<u64, ReadError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// The NUL-terminated string at `addr`, at most `max` bytes before its NUL, read a page at
    /// a time so that no read crosses into an unmapped page.
    pub fn read_cstr(&self, addr: u64, max: usize) -> Result<Vec<u8>, ReadError> {
        if addr == 0 {
            return Err(ReadError::Fault);
        }
        let mut out = Vec::new();
        let mut at = addr;
        let mut page = [0u8; PAGE];
        while out.len() <= max {
            let room = PAGE - (at as usize % PAGE);
            let chunk = &mut page[..room];
            self.read(at, chunk)?;
            if let Some(nul) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                return if out.len() > max { Err(ReadError::TooLong) } else { Ok(out) };
            }
            out.extend_from_slice(chunk);
            at += room as u64;
        }
        Err(ReadError::TooLong)
    }

    /// A null-terminated array of string pointers at `addr` (argv), at most `max` entries and
    /// `budget` bytes in all: (the strings, whether any were left out).
    ///
    /// Read in a few system calls, not two per string: the pointers a page at a time, then the
    /// start of every string (up to the end of its page, at most 512 bytes) in one
    /// vectored read; only a string longer than that is read on page by page.
    pub fn read_argv(&self, addr: u64, max: usize, budget: usize) -> Result<(Vec<Vec<u8>>, bool), ReadError> {
        if addr == 0 {
            return Ok((Vec::new(), false));
        }
        let (ptrs, ended) = self.read_pointers(addr, max)?;
        let mut out = Vec::with_capacity(ptrs.len());
        let mut used = 0usize;
        for batch in ptrs.chunks(IOV_BATCH) {
            for (p, start) in batch.iter().zip(self.read_starts(batch)?) {
                let s = match start {
                    Head::Whole(s) => s,
                    Head::Partial(mut s) => {
                        let rest = self.read_cstr(p + s.len() as u64, (128 * 1024usize).saturating_sub(s.len()))?;
                        s.extend_from_slice(&rest);
                        s
                    }
                };
                used += s.len();
                if used > budget {
                    return Ok((out, true));
                }
                out.push(s);
            }
        }
        Ok((out, !ended))
    }

    /// Up to `max` pointers of the null-terminated array at `addr`: (them, whether the array
    /// ended within `max`).
    fn read_pointers(&self, addr: u64, max: usize) -> Result<(Vec<u64>, bool), ReadError> {
        let mut ptrs = Vec::new();
        let mut at = addr;
        let mut page = [0u8; PAGE];
        while ptrs.len() < max {
            let room = (PAGE - (at as usize % PAGE)).min(8 * (max - ptrs.len()));
            // A pointer straddling two pages: read on its own.
            if room < 8 {
                let p = self.read_u64(at)?;
                if p == 0 {
                    return Ok((ptrs, true));
                }
                ptrs.push(p);
                at += 8;
                continue;
            }
            let chunk = &mut page[..room - room % 8];
            self.read(at, chunk)?;
            for w in chunk.chunks_exact(8) {
                let p = u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
                if p == 0 {
                    return Ok((ptrs, true));
                }
                ptrs.push(p);
            }
            at += chunk.len() as u64;
        }
        Ok((ptrs, false))
    }

    /// The first bytes of the strings at `ptrs` (at most [`IOV_BATCH`]), each read up to the end
    /// of its page or [`FIRST`] bytes, in one `process_vm_readv`.
    fn read_starts(&self, ptrs: &[u64]) -> Result<Vec<Head>, ReadError> {
        let lens: Vec<usize> = ptrs.iter().map(|&p| (PAGE - (p as usize % PAGE)).min(FIRST)).collect();
        let mut buf = vec![0u8; lens.iter().sum()];
        let mut local = Vec::with_capacity(ptrs.len());
        let mut remote = Vec::with_capacity(ptrs.len());
        let mut rest = &mut buf[..];
        for (&p, &len) in ptrs.iter().zip(&lens) {
            let (mine, after) = rest.split_at_mut(len);
            local.push(libc::iovec { iov_base: mine.as_mut_ptr().cast(), iov_len: len });
            remote.push(libc::iovec { iov_base: p as usize as *mut libc::c_void, iov_len: len });
            rest = after;
        }
        // SAFETY: `local` holds disjoint slices of `buf`, which outlives the call, with their
        // lengths; the remote iovecs name the other process's memory, which the kernel checks.
        let n = unsafe {
            libc::process_vm_readv(
                self.tid as libc::pid_t,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            return Err(match io::Error::last_os_error().raw_os_error().unwrap_or(0) {
                libc::EFAULT => ReadError::Fault,
                libc::ESRCH => ReadError::Gone,
                e => ReadError::Denied(e),
            });
        }
        let mut got = n as usize;
        let mut out = Vec::with_capacity(ptrs.len());
        let mut at = 0usize;
        for (&p, &len) in ptrs.iter().zip(&lens) {
            if got < len {
                // The kernel stopped at an unreadable string: this one and the rest are read
                // one by one (which reports the fault).
                out.push(Head::Whole(self.read_cstr(p, 128 * 1024)?));
                got = 0;
                at += len;
                continue;
            }
            let chunk = &buf[at..at + len];
            out.push(match chunk.iter().position(|&b| b == 0) {
                Some(nul) => Head::Whole(chunk[..nul].to_vec()),
                None => Head::Partial(chunk.to_vec()),
            });
            got -= len;
            at += len;
        }
        Ok(out)
    }

    fn proc_path(&self, rest: &str) -> String {
        format!("/proc/{}/{rest}", self.tid)
    }

    /// The target of one of the thread's `/proc` links (`cwd`, `root`, `exe`, `fd/N`).
    pub fn link(&self, rest: &str) -> io::Result<Vec<u8>> {
        match rustix::fs::readlinkat(CWD, self.proc_path(rest).as_str(), Vec::new()) {
            Ok(p) => Ok(p.into_bytes()),
            // A directory deeper than the kernel names (past PATH_MAX): found by walking up.
            Err(Errno::NAMETOOLONG) => aether_journal::resolve::dir_path_by_walking_up(self.open_dir(rest)?.as_fd()),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the directory one of the thread's `/proc` links leads to (`O_PATH`).
    pub fn open_dir(&self, rest: &str) -> Result<OwnedFd, Errno> {
        rustix::fs::openat(
            CWD,
            self.proc_path(rest).as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    }

    /// `stat` of the file open as the thread's descriptor `fd`.
    pub fn fd_stat(&self, fd: i32) -> Option<rustix::fs::Stat> {
        rustix::fs::statat(CWD, self.proc_path(&format!("fd/{fd}")).as_str(), rustix::fs::AtFlags::empty()).ok()
    }

    /// Opens the file behind the thread's descriptor `fd` for reading (to ask it its
    /// attributes).
    pub fn open_fd(&self, fd: i32) -> Result<OwnedFd, Errno> {
        rustix::fs::openat(
            CWD,
            self.proc_path(&format!("fd/{fd}")).as_str(),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    }
}

/// What the supervisor knows of the process a watched thread belongs to.
#[derive(Clone, Debug)]
pub struct Process {
    /// Its process id (the thread group).
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// Its process group.
    pub pgid: i64,
    /// `/proc/PID/exe`.
    pub prog: BPath,
    /// The same, encoded once for every record.
    pub prog_json: Vec<u8>,
    /// Whether its root or mount namespace is not the supervisor's (a `chroot`, an
    /// `unshare -m`, a sandbox such as bubblewrap): the names it uses may lead elsewhere than
    /// the same names do for the supervisor and for undo, so its paths cannot be named.
    pub own_root: bool,
}

impl Process {
    /// Reads what `/proc` says of the process of thread `tid`: `status` in one read (its
    /// first lines, which hold the ids), and the `exe`, `root` and `ns/mnt` links.
    pub fn of(tid: u32) -> Option<Process> {
        let fd = rustix::fs::openat(
            CWD,
            format!("/proc/{tid}/status").as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let mut buf = [0u8; 4096];
        let n = rustix::io::read(&fd, &mut buf).ok()?;
        drop(fd);
        let status = &buf[..n];
        // `Name:` comes first, escaped by the kernel, so each line is one field.
        let field = |name: &[u8]| -> Option<u64> {
            status
                .split(|&b| b == b'\n')
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| std::str::from_utf8(v).ok())
                // `NSpgid:` lists the id in each nested namespace, ours first.
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        let pid = u32::try_from(field(b"Tgid:")?).ok()?;
        let ppid = field(b"PPid:").and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
        let pgid = i64::try_from(field(b"NSpgid:")?).ok()?;
        let thread = Thread { tid };
        let prog = BPath::new(thread.link("exe").unwrap_or_default());
        let own_root = thread.link("root").is_ok_and(|r| r != b"/")
            || thread.link("ns/mnt").is_ok_and(|ns| Some(&ns) != own_mount_namespace());
        Some(Process { pid, ppid, pgid, prog_json: aether_journal::internal::prog_json(&prog), prog, own_root })
    }
}

/// The supervisor's own mount namespace (`mnt:[INODE]`), if it can be read.
fn own_mount_namespace() -> Option<&'static Vec<u8>> {
    static NS: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    NS.get_or_init(|| std::fs::read_link("/proc/self/ns/mnt").ok().map(|p| p.into_os_string().into_encoded_bytes()))
        .as_ref()
}

/// A watched thread as the journaling logic sees its caller: paths relative to its working
/// directory and descriptors, named through `/proc`. It never sees a call's result (the kernel
/// runs the call after the supervisor answers).
pub struct Watched<'a> {
    /// The thread.
    pub thread: Thread,
    /// Its process.
    pub process: &'a Process,
    /// The worker's remembered directories.
    pub dirs: &'a std::cell::RefCell<Dirs>,
    /// The calls under way that may change where paths lead (shared by the workers).
    pub changes: &'a Changes,
    /// The call's number.
    pub nr: i64,
}

impl Watched<'_> {
    fn start(&self, start: Start) -> Result<Base<'static>, BaseError> {
        match self.dirs.borrow_mut().start(self.process.pid, self.thread.tid, start, None) {
            Ok(d) => Ok(Base { fd: DirFd::Shared(d.fd), path: d.path }),
            Err(DirError::WillFail) => Err(BaseError::WillFail),
            Err(DirError::Failed(why)) => Err(BaseError::Failed(why)),
        }
    }
}

impl Caller for Watched<'_> {
    fn sees_results(&self) -> bool {
        false
    }

    fn cwd(&self) -> Result<Base<'_>, BaseError> {
        self.start(Start::Cwd)
    }

    fn dir(&self, fd: i32) -> Result<Base<'_>, BaseError> {
        if fd < 0 {
            return Err(BaseError::WillFail);
        }
        self.start(Start::Fd(fd))
    }

    fn cached_target<J: Journal>(&self, journal: &J, dirfd: i32, path: &[u8], follow: bool) -> Option<Target<'_>> {
        if path.last() == Some(&b'/') {
            return None;
        }
        let (dir_part, name) = split_last(path);
        if dir_part.is_empty() || name.is_empty() || name == b"." || name == b".." {
            return None;
        }
        // Read before anything is looked at: what changes meanwhile makes it stale.
        let now = Checked::now(self.changes, journal.counters());
        let mut dirs = self.dirs.borrow_mut();
        let (base, rel) = if path.first() == Some(&b'/') {
            let rel = &dir_part[dir_part.iter().position(|&b| b != b'/').unwrap_or(dir_part.len())..];
            (dirs.root()?, rel)
        } else {
            let start = if dirfd == libc::AT_FDCWD { Start::Cwd } else { Start::Fd(dirfd) };
            (dirs.start(self.process.pid, self.thread.tid, start, now).ok()?, dir_part)
        };
        let parent = if rel.is_empty() { base } else { dirs.below(self.process.pid, &base, rel, now)? };
        let mut looked = Looked::No;
        if follow {
            // The call follows a final symlink: that is the full resolver's job.
            let fin = rustix::fs::statat(&*parent.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW);
            if fin.is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink) {
                return None;
            }
            looked = Looked::of(fin);
        }
        let abs = aether_journal::BPath::new(aether_journal::bpath::join(&parent.path, name));
        Some(Target { parent: DirFd::Shared(parent.fd), name: name.to_vec(), abs, looked })
    }

    fn fd_path(&self, fd: i32) -> io::Result<Vec<u8>> {
        self.thread.link(&format!("fd/{fd}"))
    }

    fn fd_xattr(&self, fd: i32, name: &[u8]) -> Result<Option<Vec<u8>>, Errno> {
        let path = self.thread.proc_path(&format!("fd/{fd}"));
        let mut buf = vec![0u8; 65536];
        match rustix::fs::getxattr(path.as_str(), name, &mut buf[..]) {
            Ok(n) => Ok(Some(buf[..n].to_vec())),
            Err(Errno::NODATA) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn fd_flags(&self, fd: i32) -> Result<u32, Errno> {
        Ok(rustix::fs::ioctl_getflags(self.thread.open_fd(fd)?)?.bits())
    }

    fn names_changing(&self) {
        self.changes.begin_names(self.thread.tid, self.nr);
    }

    fn pid_and_group(&self) -> (u32, i64) {
        (self.process.pid, self.process.pgid)
    }

    fn first_send_to(&self, _peer: &Endpoint) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_read_as_bytes_across_a_page_boundary_and_stop_at_their_nul() {
        let me = Thread { tid: rustix::thread::gettid().as_raw_nonzero().get() as u32 };
        // A name that is not UTF-8, placed so that it straddles a page boundary.
        let mut area = vec![0u8; 3 * PAGE];
        let base = area.as_ptr() as usize;
        let start = (base / PAGE + 1) * PAGE - 3 - base;
        let name = b"\xff\xfename-after-the-boundary";
        area[start..start + name.len()].copy_from_slice(name);
        let got = me.read_cstr((base + start) as u64, 4096).unwrap();
        assert_eq!(got, name);
        assert_eq!(me.read_cstr(0, 4096), Err(ReadError::Fault));
        assert_eq!(me.read_cstr(8, 4096), Err(ReadError::Fault), "an unmapped page");
        let long = vec![b'a'; 5000];
        let mut z = long.clone();
        z.push(0);
        assert_eq!(me.read_cstr(z.as_ptr() as u64, 4096), Err(ReadError::TooLong));
    }

    #[test]
    fn an_argv_array_is_read_whole_or_said_to_be_cut() {
        let me = Thread { tid: rustix::thread::gettid().as_raw_nonzero().get() as u32 };
        let a = std::ffi::CString::new("ls").unwrap();
        let b = std::ffi::CString::new("-l").unwrap();
        let argv = [a.as_ptr(), b.as_ptr(), std::ptr::null()];
        let (got, cut) = me.read_argv(argv.as_ptr() as u64, 100, 1 << 20).unwrap();
        assert_eq!(got, vec![b"ls".to_vec(), b"-l".to_vec()]);
        assert!(!cut);
        let (got, cut) = me.read_argv(argv.as_ptr() as u64, 1, 1 << 20).unwrap();
        assert_eq!(got.len(), 1);
        assert!(cut);
    }

    #[test]
    fn a_process_is_known_by_its_thread_group_parent_and_program() {
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let p = Process::of(tid).unwrap();
        assert_eq!(p.pid, std::process::id());
        assert_eq!(p.ppid, rustix::process::getppid().unwrap().as_raw_nonzero().get() as u32);
        assert!(!p.prog.as_bytes().is_empty());
        assert!(!p.own_root);
    }
}
