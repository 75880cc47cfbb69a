//! What the supervisor does with one notification: recognise a call the shim already
//! journaled (a pass), read the call's arguments from the thread's memory, journal it through
//! the same logic the shim uses ([`aether_journal_recorder::ops`]), and answer: let the kernel
//! run it, or fail it (the strict policy, the session's own store).
//!
//! What this module cannot do: see the call's result. The kernel runs the call after the
//! answer, so strategies that need the result (an exclusive create journaled without looking,
//! a big file moved aside before a truncation, a `call_failed` record) are not used here, and a
//! connect is journaled as attempted.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;

use aether_journal::BPath;
use aether_journal::config::Policy;
use aether_journal::exec_check;
use aether_journal::record::{Before, ExecOp, MetaKind, Op, Reason, UnobservedReason};
use aether_journal_recorder::effects;
use aether_journal_recorder::ops::{self, Journal, Pending, Removes};

use crate::dirs::{Changes, Dirs};
use crate::filter::{
    FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, NATIVE_ARCH, SYS_REMOVEXATTRAT, SYS_SETXATTRAT,
};
use crate::listener::{Listener, Notification};
use crate::store::{Recording, Store, Writer};
use crate::target::{Process, ReadError, Thread, Watched as Target};

/// How a notification is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Let the kernel run the call.
    Proceed,
    /// Fail it with this errno without running it.
    Fail(i32),
}

/// Longest path the kernel accepts (`PATH_MAX`, its NUL included).
const PATH_MAX: usize = 4096;

/// One worker's state: its segment, and what it knows of the processes it has seen.
pub struct Worker<'s> {
    store: &'s Store,
    writer: Writer,
    /// The processes it has seen, by thread, each with the execs noted when it was read.
    processes: HashMap<u32, (Process, u64)>,
    /// The directories the processes it has seen name.
    dirs: std::cell::RefCell<Dirs>,
    /// The processes journaled as having a root or mount namespace of their own.
    own_roots: std::collections::HashSet<u32>,
    /// The calls under way that may change where paths lead. Shared by the workers.
    changes: &'s Changes,
    /// Calls journaled whose answer the kernel refused because the thread had stopped waiting
    /// (a signal, on a kernel without `WAIT_KILLABLE_RECV`): the same call coming again from
    /// the same thread is that call restarted, journaled already. Shared by the workers.
    abandoned: &'s Abandoned,
}

/// Per thread, the journaled call whose answer the kernel refused (see [`Worker`]).
pub type Abandoned = std::sync::Mutex<HashMap<u32, (i64, [u64; 6])>>;

/// A call's arguments could not be read: what to do instead.
enum Unread {
    /// The call will fail (a bad pointer, a name too long) or never run: nothing to journal.
    Nothing,
    /// Say why in an irreversible record.
    Denied(i32),
}

impl From<ReadError> for Unread {
    fn from(e: ReadError) -> Unread {
        match e {
            ReadError::Fault | ReadError::TooLong | ReadError::Gone => Unread::Nothing,
            ReadError::Denied(e) => Unread::Denied(e),
        }
    }
}

impl<'s> Worker<'s> {
    /// A worker for `store`, sharing `abandoned` and `changes` with the other workers.
    pub fn new(store: &'s Store, abandoned: &'s Abandoned, changes: &'s Changes) -> Worker<'s> {
        Worker {
            store,
            changes,
            writer: Writer::default(),
            processes: HashMap::new(),
            dirs: Default::default(),
            own_roots: Default::default(),
            abandoned,
        }
    }

    /// Handles one notification and answers it; counts it in the session's counters page,
    /// with whether it was one of the shim's passes (the test suite reads them there).
    pub fn serve(&mut self, listener: &Listener, n: &Notification) {
        // Whatever this thread had under way has run: it is in another call now.
        self.changes.heard_from(n.tid, self.store.counters());
        let passed = n.arch == NATIVE_ARCH && (self.passed(n.tid) || self.spawn_passed(n));
        let answer = if passed { Answer::Proceed } else { self.handle(listener, n) };
        self.store.counters().note_notified(passed);
        let waited = match answer {
            Answer::Proceed => listener.proceed(n.id),
            Answer::Fail(e) => listener.fail(n.id, e),
        };
        if !waited
            && !is_exec(n.nr)
            && let Ok(mut a) = self.abandoned.lock()
        {
            if a.len() > 4096 {
                a.clear();
            }
            a.insert(n.tid, (n.nr, n.args));
        }
    }

    fn handle(&mut self, listener: &Listener, n: &Notification) -> Answer {
        if n.arch != NATIVE_ARCH {
            return Answer::Proceed;
        }
        // The same call again, restarted after a signal interrupted its wait: journaled the
        // first time. (Registers alone cannot tell a new call from it: a program may pass the
        // same buffer, holding another name; but only a call whose answer the kernel refused
        // is ever made again.)
        let restarted = self.abandoned.lock().ok().and_then(|mut a| a.remove(&n.tid)) == Some((n.nr, n.args));
        if restarted {
            // Not journaled again, but under way again: what it may change is not trusted
            // until it has run (see `dirs.rs`).
            match moves_paths(n.nr) {
                Some(Moves::Cwd) => self.changes.begin_cwd(n.tid, n.nr, self.store.counters()),
                Some(Moves::Names) => {
                    self.store.counters().names_changing();
                    self.changes.begin_names(n.tid, n.nr);
                }
                None => {}
            }
            return Answer::Proceed;
        }
        if self.processes.len() > 4096 {
            self.processes.clear();
        }
        let process = match self.process(n.tid) {
            Some(p) => p,
            // Gone already: the call will never run.
            None => return Answer::Proceed,
        };
        let thread = Thread { tid: n.tid };
        let call = Call::read(&thread, n, process.pid);
        // Whatever was read is only acted on if the thread still waits in this very call
        // (its memory could otherwise be another process's by now).
        if !listener.valid(n.id) {
            return Answer::Proceed;
        }
        if is_exec(n.nr) && matches!(call, Ok(Call::Exec { .. })) {
            // A new image: the process's program changes, its other threads are gone, and
            // its descriptors may be closed.
            self.processes.retain(|_, (p, _)| p.pid != process.pid);
            self.dirs.borrow_mut().forget(process.pid);
        }
        if matches!(call, Ok(Call::OwnRoot)) {
            // From now on (the call is about to run) its names cannot be trusted; a child it
            // makes later is seen in its own namespace when first met.
            for (p, _) in self.processes.values_mut().filter(|(p, _)| p.pid == process.pid) {
                p.own_root = true;
            }
        }
        let journal =
            Recording { store: self.store, writer: std::cell::RefCell::new(&mut self.writer), process: &process };
        if matches!(call, Ok(Call::CwdChange)) {
            self.changes.begin_cwd(n.tid, n.nr, self.store.counters());
        }
        let target = Target { thread, process: &process, dirs: &self.dirs, changes: self.changes, nr: n.nr };
        let name = crate::names::name(n.nr);
        if process.own_root || matches!(call, Ok(Call::OwnRoot)) {
            if self.own_roots.len() > 4096 {
                self.own_roots.clear();
            }
            // Met in a root or namespace of its own that no call seen here made (its parent's
            // `clone3`, say): said once, for it and for the children the shim journals.
            if self.own_roots.insert(process.pid) && !matches!(call, Ok(Call::OwnRoot)) {
                let reason = UnobservedReason::OwnMountNamespace;
                journal.record(name, Op::Unobserved { program: process.prog.clone(), reason: Box::new(reason) });
            }
        }
        let pending = match call {
            // Which program its names lead to here is not known; the record above says so.
            Ok(Call::Exec { .. }) if process.own_root => Pending::Nothing,
            Ok(call) if process.own_root && call.names_paths() => own_root(&journal, n.nr),
            Ok(call) => call.journal(&journal, &target, name),
            Err(Unread::Nothing) => Pending::Nothing,
            Err(Unread::Denied(e)) => unreadable(&journal, n.nr, e),
        };
        match pending {
            Pending::Refuse(e) => Answer::Fail(e),
            _ => Answer::Proceed,
        }
    }

    /// What `/proc` says of thread `tid`'s process: remembered, unless an exec the supervisor
    /// did not see (the shim's, marked) may have given it another program since, which its
    /// `exe` link then tells.
    fn process(&mut self, tid: u32) -> Option<Process> {
        let execs = self.store.counters().execs();
        if let Some((p, seen)) = self.processes.get_mut(&tid) {
            if *seen == execs {
                return Some(p.clone());
            }
            *seen = execs;
            if (Thread { tid }).link("exe").is_ok_and(|exe| exe == p.prog.as_bytes()) {
                return Some(p.clone());
            }
        }
        let p = Process::of(tid)?;
        self.processes.insert(tid, (p.clone(), execs));
        Some(p)
    }

    /// Whether call `n` is the exec of a `posix_spawn` child that a spawn pass lets through
    /// (see `aether_journal::internal::counters::SPAWN_PASS`): a thread inside that
    /// `posix_spawn` journals the spawn, and the child runs on its memory, where the pass's
    /// cookie is found with this exec's `argv`. The child's program changes unseen: what is
    /// remembered of it is forgotten, and the other workers are told (the execs counter).
    fn spawn_passed(&mut self, n: &Notification) -> bool {
        if !is_exec(n.nr) {
            return false;
        }
        let argv = if n.nr == libc::SYS_execve { n.args[1] } else { n.args[2] };
        let counters = self.store.counters();
        let thread = Thread { tid: n.tid };
        let found = counters.spawn_passes().any(|(_, holder, addr)| {
            let want = aether_journal::internal::counters::spawn_pass_cookie(self.store.mark, holder);
            thread.read_u64(addr).is_ok_and(|c| c == want) && thread.read_u64(addr + 8).is_ok_and(|a| a == argv)
        });
        if found {
            counters.note_exec();
            self.processes.remove(&n.tid);
            self.dirs.borrow_mut().forget(n.tid);
        }
        found
    }

    /// Whether thread `tid` holds a pass: the shim is inside a libc function whose own system
    /// calls it journaled, and the cookie at the pass's address in the thread's memory says so.
    fn passed(&self, tid: u32) -> bool {
        let counters = self.store.counters();
        let want = aether_journal::internal::counters::pass_cookie(self.store.mark, tid);
        let thread = Thread { tid };
        for (slot, addr) in counters.passes_of(tid).collect::<Vec<_>>() {
            match thread.read_u64(addr) {
                Ok(c) if c == want => return true,
                Err(ReadError::Gone) => counters.drop_stale_pass(slot, tid),
                _ => {}
            }
        }
        false
    }
}

/// Whether an absolute path names nothing (an exec of it will fail with `ENOENT`).
fn absent(path: &[u8]) -> bool {
    path.first() == Some(&b'/')
        && matches!(
            rustix::fs::statat(rustix::fs::CWD, path, rustix::fs::AtFlags::SYMLINK_NOFOLLOW),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR)
        )
}

/// What a watched call may change of where paths lead.
enum Moves {
    /// A working directory.
    Cwd,
    /// Where names lead (a directory or symlink renamed or removed).
    Names,
}

/// What call `nr` may change of where paths lead, if anything.
fn moves_paths(nr: i64) -> Option<Moves> {
    #[cfg(target_arch = "x86_64")]
    if matches!(nr, libc::SYS_rename | libc::SYS_renameat | libc::SYS_unlink | libc::SYS_rmdir) {
        return Some(Moves::Names);
    }
    match nr {
        libc::SYS_chdir | libc::SYS_fchdir => Some(Moves::Cwd),
        libc::SYS_renameat2 | libc::SYS_unlinkat => Some(Moves::Names),
        _ => None,
    }
}

fn is_exec(nr: i64) -> bool {
    nr == libc::SYS_execve || nr == libc::SYS_execveat
}

/// A watched call's arguments, read from the thread's memory.
enum Call {
    Open {
        dirfd: i32,
        path: Vec<u8>,
        flags: i32,
    },
    Truncate {
        path: Vec<u8>,
    },
    FdChange {
        fd: i32,
        st: Option<rustix::fs::Stat>,
    },
    Rename {
        olddir: i32,
        old: Vec<u8>,
        newdir: i32,
        new: Vec<u8>,
        flags: u32,
    },
    Remove {
        dirfd: i32,
        path: Vec<u8>,
        removes: Removes,
    },
    Create {
        dirfd: i32,
        path: Vec<u8>,
    },
    /// A new name for an existing file (its source may not be in the store).
    Link {
        olddirfd: i32,
        old: Vec<u8>,
        newdirfd: i32,
        new: Vec<u8>,
        follow: bool,
    },
    Meta {
        dirfd: i32,
        path: Vec<u8>,
        follow: bool,
        what: MetaKind,
        xattr: Option<Vec<u8>>,
    },
    FdMeta {
        fd: i32,
        st: Option<rustix::fs::Stat>,
        what: MetaKind,
        xattr: Option<Vec<u8>>,
    },
    SetFlags {
        fd: i32,
        st: Option<rustix::fs::Stat>,
    },
    FsSetXattr {
        fd: i32,
    },
    OpenByHandle,
    Connect(Option<aether_journal::record::Endpoint>),
    Send(Vec<aether_journal::record::Endpoint>),
    Signal {
        target: i64,
        sig: i32,
    },
    /// A signal to the caller's own process: nothing outside it is touched.
    OwnSignal,
    /// A change of the working directory (`chdir`, `fchdir`): nothing to journal, but what
    /// the worker remembers of working directories is not trusted until it has run.
    CwdChange,
    Exec {
        dirfd: i32,
        path: Vec<u8>,
        argv: Vec<Vec<u8>>,
        cut: bool,
        empty_path: bool,
    },
    IoUring,
    /// A call that gives the process a root or mount namespace of its own (`chroot`,
    /// `pivot_root`, `setns`, `unshare` or `clone` with `CLONE_NEWNS`).
    OwnRoot,
    /// Nothing to journal.
    Nothing,
}

impl Call {
    /// Reads the arguments of notification `n` from `thread`.
    fn read(thread: &Thread, n: &Notification, own_pid: u32) -> Result<Call, Unread> {
        let a = n.args;
        let int = |i: usize| a[i] as i32;
        let path = |i: usize| thread.read_cstr(a[i], PATH_MAX - 1);
        let fd_stat = |fd: i32| thread.fd_stat(fd);
        let at = libc::AT_FDCWD;
        let removes = |flags: i32| if flags & libc::AT_REMOVEDIR != 0 { Removes::Dir } else { Removes::NonDir };
        // Metadata by name relative to `dirfd` (`flags`: AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH),
        // or of `dirfd` itself for a null path (`null_is_dirfd`) or an empty one with
        // AT_EMPTY_PATH.
        let meta_at = |dirfd: i32,
                       p: u64,
                       flags: i32,
                       what: MetaKind,
                       xattr: Option<Vec<u8>>,
                       null_is_dirfd: bool|
         -> Result<Call, ReadError> {
            if p == 0 && null_is_dirfd {
                return Ok(Call::FdMeta { fd: dirfd, st: fd_stat(dirfd), what, xattr });
            }
            let p = thread.read_cstr(p, PATH_MAX - 1)?;
            if p.is_empty() {
                if flags & libc::AT_EMPTY_PATH != 0 {
                    return Ok(Call::FdMeta { fd: dirfd, st: fd_stat(dirfd), what, xattr });
                }
                return Ok(Call::Nothing); // ENOENT
            }
            Ok(Call::Meta { dirfd, path: p, follow: flags & libc::AT_SYMLINK_NOFOLLOW == 0, what, xattr })
        };
        let name = |i: usize| thread.read_cstr(a[i], 255).map(Some);
        Ok(match n.nr {
            libc::SYS_openat => Call::Open { dirfd: int(0), path: path(1)?, flags: int(2) },
            libc::SYS_openat2 => {
                // struct open_how starts with the u64 flags.
                let flags = if a[3] >= 8 { thread.read_u64(a[2])? as i32 } else { return Ok(Call::Nothing) };
                Call::Open { dirfd: int(0), path: path(1)?, flags }
            }
            libc::SYS_open_by_handle_at => Call::OpenByHandle,
            libc::SYS_truncate => Call::Truncate { path: path(0)? },
            libc::SYS_ftruncate | libc::SYS_fallocate => Call::FdChange { fd: int(0), st: fd_stat(int(0)) },
            libc::SYS_renameat2 => {
                Call::Rename { olddir: int(0), old: path(1)?, newdir: int(2), new: path(3)?, flags: a[4] as u32 }
            }
            libc::SYS_unlinkat => Call::Remove { dirfd: int(0), path: path(1)?, removes: removes(int(2)) },
            libc::SYS_mkdirat | libc::SYS_mknodat => Call::Create { dirfd: int(0), path: path(1)? },
            libc::SYS_linkat => Call::Link {
                olddirfd: int(0),
                old: path(1)?,
                newdirfd: int(2),
                new: path(3)?,
                follow: int(4) & libc::AT_SYMLINK_FOLLOW != 0,
            },
            libc::SYS_symlinkat => Call::Create { dirfd: int(1), path: path(2)? },
            libc::SYS_fchmod => Call::FdMeta { fd: int(0), st: fd_stat(int(0)), what: MetaKind::Mode, xattr: None },
            libc::SYS_fchmodat => meta_at(int(0), a[1], 0, MetaKind::Mode, None, false)?,
            libc::SYS_fchmodat2 => meta_at(int(0), a[1], int(3), MetaKind::Mode, None, false)?,
            libc::SYS_fchown => Call::FdMeta { fd: int(0), st: fd_stat(int(0)), what: MetaKind::Owner, xattr: None },
            libc::SYS_fchownat => meta_at(int(0), a[1], int(4), MetaKind::Owner, None, false)?,
            libc::SYS_utimensat => meta_at(int(0), a[1], int(3), MetaKind::Times, None, true)?,
            libc::SYS_setxattr | libc::SYS_removexattr => meta_at(at, a[0], 0, MetaKind::Xattr, name(1)?, false)?,
            libc::SYS_lsetxattr | libc::SYS_lremovexattr => {
                meta_at(at, a[0], libc::AT_SYMLINK_NOFOLLOW, MetaKind::Xattr, name(1)?, false)?
            }
            libc::SYS_fsetxattr | libc::SYS_fremovexattr => {
                Call::FdMeta { fd: int(0), st: fd_stat(int(0)), what: MetaKind::Xattr, xattr: name(1)? }
            }
            SYS_SETXATTRAT | SYS_REMOVEXATTRAT => meta_at(int(0), a[1], int(2), MetaKind::Xattr, name(3)?, false)?,
            libc::SYS_bind => match sockaddr(thread, a[1], a[2])? {
                // A Unix socket's name is a file the call creates.
                Some(sa) if unix_path(&sa).is_some() => {
                    Call::Create { dirfd: at, path: unix_path(&sa).unwrap_or_default().to_vec() }
                }
                _ => Call::Nothing,
            },
            libc::SYS_ioctl => match a[1] as u32 {
                FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => Call::SetFlags { fd: int(0), st: fd_stat(int(0)) },
                FS_IOC_FSSETXATTR => Call::FsSetXattr { fd: int(0) },
                _ => Call::Nothing,
            },
            libc::SYS_connect => {
                Call::Connect(sockaddr(thread, a[1], a[2])?.as_deref().and_then(effects::parse_endpoint))
            }
            libc::SYS_sendto => Call::Send(
                sockaddr(thread, a[4], a[5])?.as_deref().and_then(effects::parse_endpoint).into_iter().collect(),
            ),
            libc::SYS_sendmsg => Call::Send(msg_destination(thread, a[1])?.into_iter().collect()),
            libc::SYS_sendmmsg => {
                let mut dests = Vec::new();
                // struct mmsghdr is a msghdr (56 bytes) and an unsigned int, padded to 64.
                for i in 0..(a[2] as u32).min(1024) as u64 {
                    if let Some(ep) = msg_destination(thread, a[1] + 64 * i)?
                        && !dests.contains(&ep)
                    {
                        dests.push(ep);
                    }
                }
                Call::Send(dests)
            }
            libc::SYS_kill | libc::SYS_rt_sigqueueinfo => signal(own_pid, a[0] as i32 as i64, int(1)),
            // A thread id: its process is the target.
            libc::SYS_tkill => match Process::of(a[0] as u32) {
                Some(p) => signal(own_pid, i64::from(p.pid), int(1)),
                None => Call::Nothing,
            },
            libc::SYS_tgkill | libc::SYS_rt_tgsigqueueinfo => signal(own_pid, a[0] as i32 as i64, int(2)),
            libc::SYS_pidfd_send_signal => match pidfd_pid(thread, int(0)) {
                Some(pid) => signal(own_pid, i64::from(pid), int(1)),
                None => Call::Nothing,
            },
            libc::SYS_execve => {
                let path = path(0)?;
                if absent(&path) {
                    // One of an exec family's tries along PATH: it fails, and runs nothing.
                    return Ok(Call::Nothing);
                }
                let (argv, cut) = thread.read_argv(a[1], 4096, 256 * 1024)?;
                Call::Exec { dirfd: at, path, argv, cut, empty_path: false }
            }
            libc::SYS_execveat => {
                let (argv, cut) = thread.read_argv(a[2], 4096, 256 * 1024)?;
                let empty_path = int(4) & libc::AT_EMPTY_PATH != 0;
                Call::Exec { dirfd: int(0), path: path(1)?, argv, cut, empty_path }
            }
            libc::SYS_io_uring_setup => Call::IoUring,
            libc::SYS_chdir | libc::SYS_fchdir => Call::CwdChange,
            libc::SYS_chroot | libc::SYS_pivot_root | libc::SYS_setns | libc::SYS_unshare | libc::SYS_clone => {
                Call::OwnRoot
            }
            #[cfg(target_arch = "x86_64")]
            nr => match nr {
                libc::SYS_open => Call::Open { dirfd: at, path: path(0)?, flags: int(1) },
                libc::SYS_creat => {
                    Call::Open { dirfd: at, path: path(0)?, flags: libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC }
                }
                libc::SYS_rename => Call::Rename { olddir: at, old: path(0)?, newdir: at, new: path(1)?, flags: 0 },
                libc::SYS_renameat => {
                    Call::Rename { olddir: int(0), old: path(1)?, newdir: int(2), new: path(3)?, flags: 0 }
                }
                libc::SYS_unlink => Call::Remove { dirfd: at, path: path(0)?, removes: Removes::NonDir },
                libc::SYS_rmdir => Call::Remove { dirfd: at, path: path(0)?, removes: Removes::Dir },
                libc::SYS_mkdir | libc::SYS_mknod => Call::Create { dirfd: at, path: path(0)? },
                libc::SYS_link => {
                    Call::Link { olddirfd: at, old: path(0)?, newdirfd: at, new: path(1)?, follow: false }
                }
                libc::SYS_symlink => Call::Create { dirfd: at, path: path(1)? },
                libc::SYS_chmod => meta_at(at, a[0], 0, MetaKind::Mode, None, false)?,
                libc::SYS_chown => meta_at(at, a[0], 0, MetaKind::Owner, None, false)?,
                libc::SYS_lchown => meta_at(at, a[0], libc::AT_SYMLINK_NOFOLLOW, MetaKind::Owner, None, false)?,
                libc::SYS_utime | libc::SYS_utimes => meta_at(at, a[0], 0, MetaKind::Times, None, false)?,
                libc::SYS_futimesat => meta_at(int(0), a[1], 0, MetaKind::Times, None, true)?,
                _ => Call::Nothing,
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => Call::Nothing,
        })
    }

    /// Whether journaling the call needs to name paths (which those of a process with a root or
    /// mount namespace of its own cannot be).
    fn names_paths(&self) -> bool {
        !matches!(
            self,
            Call::Connect(_)
                | Call::Send(_)
                | Call::Signal { .. }
                | Call::OwnSignal
                | Call::CwdChange
                | Call::IoUring
                | Call::OwnRoot
                | Call::Nothing
        )
    }

    /// Journals the call (`call`: its name in the records); the pending outcome says whether
    /// the strict policy refuses it.
    fn journal(self, j: &Recording<'_>, t: &Target<'_>, call: &str) -> Pending {
        match self {
            Call::Open { dirfd, path, flags } => ops::before_open(j, t, call, dirfd, &path, flags),
            Call::Truncate { path } => ops::before_truncate(j, t, call, &path),
            Call::FdChange { fd, st: Some(st) } => ops::before_fd_change(j, t, call, fd, &st),
            Call::Rename { olddir, old, newdir, new, flags } => {
                ops::before_rename(j, t, call, olddir, &old, newdir, &new, flags)
            }
            Call::Remove { dirfd, path, removes } => ops::before_remove(j, t, call, dirfd, &path, removes),
            Call::Create { dirfd, path } => ops::before_create(j, t, call, dirfd, &path),
            Call::Link { olddirfd, old, newdirfd, new, follow } => {
                ops::before_link(j, t, call, olddirfd, &old, newdirfd, &new, follow)
            }
            Call::Meta { dirfd, path, follow, what, xattr } => {
                ops::before_meta(j, t, call, dirfd, &path, follow, what, xattr.as_deref())
            }
            Call::FdMeta { fd, st: Some(st), what, xattr } => {
                ops::before_fd_meta(j, t, call, fd, &st, what, xattr.as_deref())
            }
            Call::SetFlags { fd, st: Some(st) } => ops::before_fd_flags(j, t, call, fd, &st),
            Call::FsSetXattr { fd } => {
                ops::not_kept(j, t, call, fd, "the attributes FS_IOC_FSSETXATTR sets are not kept")
            }
            Call::OpenByHandle => irreversible_call(j, call, "a file opened by handle cannot be named"),
            // A Unix socket that is not there cannot be connected to (glibc's lookups try
            // nscd's on every name resolution): the call fails and changes nothing.
            Call::Connect(Some(ep)) if !unix_socket_exists(t, &ep) => Pending::Nothing,
            Call::Connect(Some(ep)) => effects::before_connect(j, t, call, ep),
            Call::Send(dests) => {
                for ep in dests {
                    if let Pending::Refuse(e) = effects::before_send(j, t, call, ep) {
                        return Pending::Refuse(e);
                    }
                }
                Pending::Nothing
            }
            Call::Signal { target, sig } => effects::before_signal(j, t, call, target, sig),
            Call::Exec { dirfd, path, argv, cut, empty_path } => exec(j, t, call, dirfd, &path, argv, cut, empty_path),
            Call::IoUring => {
                let reason = UnobservedReason::IoUring;
                if j.settings().policy == Policy::Strict {
                    return ops::refuse(j, call, format!("{call}: {reason}"), libc::EPERM);
                }
                j.record(call, Op::Unobserved { program: t.process.prog.clone(), reason: Box::new(reason) });
                Pending::Nothing
            }
            Call::OwnRoot => {
                let reason = UnobservedReason::OwnMountNamespace;
                if j.settings().policy == Policy::Strict {
                    return ops::refuse(j, call, format!("{call}: {reason}"), libc::EPERM);
                }
                j.record(call, Op::Unobserved { program: t.process.prog.clone(), reason: Box::new(reason) });
                Pending::Nothing
            }
            Call::FdChange { st: None, .. }
            | Call::FdMeta { st: None, .. }
            | Call::SetFlags { st: None, .. }
            | Call::Connect(None)
            | Call::OwnSignal
            | Call::CwdChange
            | Call::Nothing => Pending::Nothing,
        }
    }
}

/// A signal: to the caller's own process (nothing outside it is touched: not journaled, which
/// also spares the journal the Go runtime's preemption signals), or to another.
fn signal(own_pid: u32, target: i64, sig: i32) -> Call {
    if sig == 0 {
        return Call::Nothing;
    }
    if target == i64::from(own_pid) {
        return Call::OwnSignal;
    }
    Call::Signal { target, sig }
}

/// The process a pidfd of the thread's refers to (`Pid:` in its fdinfo).
fn pidfd_pid(thread: &Thread, fd: i32) -> Option<u32> {
    let info = std::fs::read(format!("/proc/{}/fdinfo/{fd}", thread.tid)).ok()?;
    info.split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"Pid:"))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<i64>().ok().filter(|&p| p > 0).map(|p| p as u32))
}

/// Whether a Unix socket endpoint (not an abstract one) names a socket that exists, as the
/// caller sees its path; any other endpoint counts as existing.
fn unix_socket_exists(t: &Target<'_>, ep: &aether_journal::record::Endpoint) -> bool {
    let addr = ep.address.as_bytes();
    if ep.family != "unix" || addr.first() == Some(&b'@') {
        return true;
    }
    let path = if addr.first() == Some(&b'/') {
        addr.to_vec()
    } else {
        aether_journal::bpath::join(&t.thread.link("cwd").unwrap_or_default(), addr)
    };
    !matches!(
        rustix::fs::statat(rustix::fs::CWD, path.as_slice(), rustix::fs::AtFlags::empty()),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR)
    )
}

/// A socket address of `len` bytes at `addr` (at most `sockaddr_storage`'s size).
fn sockaddr(thread: &Thread, addr: u64, len: u64) -> Result<Option<Vec<u8>>, ReadError> {
    let len = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    if addr == 0 || len < 2 {
        return Ok(None);
    }
    let mut buf = vec![0u8; len];
    thread.read(addr, &mut buf)?;
    Ok(Some(buf))
}

/// The path a Unix socket address names (not an abstract or unnamed one).
fn unix_path(sa: &[u8]) -> Option<&[u8]> {
    if sa.len() < 3 || i32::from(u16::from_ne_bytes([sa[0], sa[1]])) != libc::AF_UNIX || sa[2] == 0 {
        return None;
    }
    let path = &sa[2..];
    Some(&path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())])
}

/// The destination a `struct msghdr` at `addr` names, if any.
fn msg_destination(thread: &Thread, addr: u64) -> Result<Option<aether_journal::record::Endpoint>, ReadError> {
    if addr == 0 {
        return Ok(None);
    }
    // msg_name (a pointer) then msg_namelen (a u32).
    let mut hdr = [0u8; 16];
    thread.read(addr, &mut hdr)?;
    let name = u64::from_ne_bytes(hdr[..8].try_into().unwrap_or([0; 8]));
    let len = u32::from_ne_bytes(hdr[8..12].try_into().unwrap_or([0; 4]));
    Ok(sockaddr(thread, name, u64::from(len))?.as_deref().and_then(effects::parse_endpoint))
}

/// An exec: journaled (its program, argv and working directory) when the program exists; a
/// program of another architecture is also journaled as unobserved (the filter cannot watch
/// it), or refused under the strict policy.
#[allow(clippy::too_many_arguments)]
fn exec(
    j: &Recording<'_>,
    t: &Target<'_>,
    call: &str,
    dirfd: i32,
    path: &[u8],
    mut argv: Vec<Vec<u8>>,
    cut: bool,
    empty_path: bool,
) -> Pending {
    use aether_journal_recorder::ops::Caller;
    let cwd = t.thread.link("cwd").unwrap_or_default();
    let program = if empty_path && path.is_empty() {
        t.fd_path(dirfd).unwrap_or_default()
    } else if path.first() == Some(&b'/') || dirfd == libc::AT_FDCWD {
        aether_journal::bpath::join(&cwd, path)
    } else {
        aether_journal::bpath::join(&t.fd_path(dirfd).unwrap_or_default(), path)
    };
    // A program that is not there will not run (execvp tries every directory of PATH).
    if std::fs::symlink_metadata(std::ffi::OsStr::from_bytes(&program)).is_err() {
        return Pending::Nothing;
    }
    if cut {
        argv.push(b"[... further arguments not journaled]".to_vec());
    }
    let program = BPath::new(program);
    let argv = argv.into_iter().collect();
    j.record(call, Op::Exec(Box::new(ExecOp { program: program.clone(), argv, cwd: BPath::new(cwd), child: None })));
    if let Some(reason) = exec_check::foreign_architecture(program.as_bytes()) {
        if j.settings().policy == Policy::Strict {
            let what = format!("exec of {}: {reason}", program.display_lossy());
            return ops::refuse(j, call, what, libc::EPERM);
        }
        j.record(call, Op::Unobserved { program, reason: Box::new(reason) });
    }
    Pending::Nothing
}

fn irreversible_call(j: &Recording<'_>, call: &str, why: &str) -> Pending {
    change_irreversible(
        j,
        call,
        BPath::new(Vec::new()),
        Reason::CaptureFailed { step: "name the file".into(), error: why.into() },
    )
}

fn change_irreversible(j: &Recording<'_>, call: &str, path: BPath, reason: Reason) -> Pending {
    if j.settings().policy == Policy::Strict {
        return ops::refuse(j, call, format!("{call} {}: {reason}", path.display_lossy()), libc::EACCES);
    }
    j.record(call, Op::Change { path, before: Before::irreversible(reason) });
    Pending::Nothing
}

/// A call of a process whose root is not the supervisor's: its paths cannot be named from
/// outside, so the step is journaled as irreversible (and refused under the strict policy).
fn own_root(j: &Recording<'_>, nr: i64) -> Pending {
    let call = crate::names::name(nr);
    let reason = Reason::CaptureFailed {
        step: "resolve the path".into(),
        error: "the process has a root or mount namespace of its own".into(),
    };
    change_irreversible(j, call, BPath::new(Vec::new()), reason)
}

/// The thread's memory could not be read: journaled as irreversible with the reason.
fn unreadable(j: &Recording<'_>, nr: i64, errno: i32) -> Pending {
    let call = crate::names::name(nr);
    let error =
        format!("the supervisor could not read the call's arguments ({})", std::io::Error::from_raw_os_error(errno));
    change_irreversible(
        j,
        call,
        BPath::new(Vec::new()),
        Reason::CaptureFailed { step: "read the arguments".into(), error },
    )
}
