//! The hook table and the FFI half of every hook.
//!
//! Adding a libc symbol is one line in `hooks!` (below): its C signature and the handler that
//! classifies it. The macro generates the exported `extern "C"` function, the lazily resolved
//! original ([`Real`]) and an entry in [`hook`], which the self-test walks to prove every
//! symbol resolves.
//!
//! Every handler has the same shape, enforced by [`journaled`]: a fast path for calls that
//! cannot mutate (a flag test and a tail call), then guard -> classify and capture (under
//! `catch_unwind`) -> the real call, exactly once, outside the guard -> outcome, with errno
//! restored to what the real call set.
//!
//! Never write to fds 0-2 here, never `print!`: the program may have closed or reused them
//! (INTERPOSITION.md §6.11).
//!
//! What this module cannot do: see calls glibc makes to itself without going through these
//! names (INTERPOSITION.md §3); that is why wrappers such as `fopen`, `remove` and the
//! `mkstemp` family are hooked by their own names.

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};

use libc::{
    DIR, FILE, c_void, dev_t, gid_t, mmsghdr, mode_t, msghdr, off_t, off64_t, pid_t, posix_spawn_file_actions_t,
    posix_spawnattr_t, sighandler_t, sigval, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval, uid_t, utimbuf,
};

use crate::exec::{EnvIn, Plan, Program};
use libc::c_long;
/// `struct sigaction` (its libc name is also the hooked function's).
type SigAction = libc::sigaction;

use journal::record::MetaKind;

use crate::guard::{Guard, errno, set_errno};
use crate::ops::{self, Pending, Removes};
use crate::real::Real;
use crate::state::{Store, store};

/// Converts a C argument into what a handler sees: C strings become byte slices (`None` for
/// null, which the real call rejects on its own), everything else passes through.
pub trait CArg: Copy {
    /// The handler-side type.
    type Out<'a>;
    /// # Safety
    /// For `*const c_char`: null or a NUL-terminated string valid for the duration of the call.
    unsafe fn to_rust<'a>(self) -> Self::Out<'a>;
}

impl CArg for *const c_char {
    type Out<'a> = Option<&'a [u8]>;
    unsafe fn to_rust<'a>(self) -> Option<&'a [u8]> {
        // SAFETY: non-null and NUL-terminated (the caller's obligation).
        (!self.is_null()).then(|| unsafe { CStr::from_ptr(self) }.to_bytes())
    }
}

/// A path argument read only when a handler needs it: the read-only fast paths of the open
/// family never measure it. ABI-identical to `const char *`.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct CPath(*const c_char);

impl CPath {
    /// The path's bytes (`None` for null).
    fn bytes<'a>(self) -> Option<&'a [u8]> {
        // SAFETY: a CPath is only ever a hooked call's own path argument (the exported
        // functions' parameters, or a `syscall` argument that its number makes a path), which
        // that call's contract makes null or a NUL-terminated string valid for the call.
        unsafe { self.0.to_rust() }
    }
}

macro_rules! passthrough_to_rust {
    ($($t:ty),*) => {$(
        impl CArg for $t {
            type Out<'a> = $t;
            unsafe fn to_rust<'a>(self) -> Self::Out<'a> {
                self
            }
        }
    )*};
}
passthrough_to_rust!(
    c_int,
    c_uint,
    *mut c_char,
    *mut FILE,
    *const sockaddr,
    *const msghdr,
    *mut mmsghdr,
    *const *const c_char,
    *const *mut c_char,
    *mut pid_t,
    c_long,
    *const posix_spawn_file_actions_t,
    *const posix_spawnattr_t,
    *const SigAction,
    sighandler_t,
    *mut DIR,
    CPath
);

macro_rules! hooks {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $handler:ident ( $($harg:ident),* ); )*) => {
        $(
            #[allow(non_snake_case)]
            mod $name {
                pub const NAME: &::std::ffi::CStr =
                    match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("hook names never contain NUL"),
                    };
                pub static REAL: $crate::real::Real = $crate::real::Real::new();
            }

            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                type RealFn = unsafe extern "C" fn($($ty),*) -> $ret;
                // SAFETY: RealFn is the C signature of this very symbol, written once above.
                match unsafe { $name::REAL.get::<RealFn>($name::NAME) } {
                    Some(real) => {
                        // SAFETY: forwards the caller's own arguments, unchanged, to the function
                        // they were meant for. FnOnce: the handler can call it at most once, and
                        // every handler calls it exactly once.
                        let real = move || unsafe { real($($arg),*) };
                        // SAFETY: these are the arguments of a C call to `$name`, whose contract
                        // makes every `const char *` null or a NUL-terminated string that stays
                        // valid for the duration of the call.
                        $handler(stringify!($name), real, $(unsafe { CArg::to_rust($harg) }),*)
                    }
                    None => <$ret as $crate::real::Missing>::missing(),
                }
            }
        )*

        /// The number of hooked symbols.
        pub const HOOK_COUNT: usize = [$(stringify!($name)),*].len();

        /// Hooked symbol `i` (in table order): its name and its [`Real`]. Code, not a table of
        /// pointers, which would need relocating in every process.
        pub fn hook(i: usize) -> Option<(&'static std::ffi::CStr, &'static Real)> {
            let mut k = 0usize;
            $(
                if i == k {
                    return Some(($name::NAME, &$name::REAL));
                }
                k += 1;
            )*
            let _ = k;
            None
        }
    };
}

type Str<'a> = Option<&'a [u8]>;

hooks! {
    // `mode` is forwarded as received and never read here: it only means something with
    // O_CREAT or O_TMPFILE (glibc's rule), and the kernel ignores it otherwise.
    fn open(path: CPath, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn open64(path: CPath, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn __open(path: CPath, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn __open64(path: CPath, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn openat(dirfd: c_int, path: CPath, flags: c_int, mode: mode_t) -> c_int => h_openat(dirfd, path, flags);
    fn openat64(dirfd: c_int, path: CPath, flags: c_int, mode: mode_t) -> c_int => h_openat(dirfd, path, flags);
    fn __open_2(path: CPath, flags: c_int) -> c_int => h_open(path, flags);
    fn __open64_2(path: CPath, flags: c_int) -> c_int => h_open(path, flags);
    fn __openat_2(dirfd: c_int, path: CPath, flags: c_int) -> c_int => h_openat(dirfd, path, flags);
    fn __openat64_2(dirfd: c_int, path: CPath, flags: c_int) -> c_int => h_openat(dirfd, path, flags);
    fn creat(path: *const c_char, mode: mode_t) -> c_int => h_creat(path);
    fn creat64(path: *const c_char, mode: mode_t) -> c_int => h_creat(path);
    fn fopen(path: CPath, mode: *const c_char) -> *mut FILE => h_fopen(path, mode);
    fn fopen64(path: CPath, mode: *const c_char) -> *mut FILE => h_fopen(path, mode);
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE => h_freopen(path, mode, stream);
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE => h_freopen(path, mode, stream);
    fn mkstemp(template: *mut c_char) -> c_int => h_mktemp(template);
    fn mkstemp64(template: *mut c_char) -> c_int => h_mktemp(template);
    fn mkostemp(template: *mut c_char, flags: c_int) -> c_int => h_mktemp(template);
    fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int => h_mktemp(template);
    fn mkstemps(template: *mut c_char, suffixlen: c_int) -> c_int => h_mktemp(template);
    fn mkstemps64(template: *mut c_char, suffixlen: c_int) -> c_int => h_mktemp(template);
    fn mkostemps(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int => h_mktemp(template);
    fn mkostemps64(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int => h_mktemp(template);
    fn mkdtemp(template: *mut c_char) -> *mut c_char => h_mktemp(template);
    fn truncate(path: *const c_char, length: off_t) -> c_int => h_truncate(path);
    fn truncate64(path: *const c_char, length: off64_t) -> c_int => h_truncate(path);
    fn ftruncate(fd: c_int, length: off_t) -> c_int => h_fd_change(fd);
    fn ftruncate64(fd: c_int, length: off64_t) -> c_int => h_fd_change(fd);
    fn rename(old: *const c_char, new: *const c_char) -> c_int => h_rename(old, new);
    fn renameat(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char) -> c_int => h_renameat(olddirfd, old, newdirfd, new);
    fn renameat2(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_uint) -> c_int => h_renameat2(olddirfd, old, newdirfd, new, flags);
    fn unlink(path: *const c_char) -> c_int => h_unlink(path);
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int => h_unlinkat(dirfd, path, flags);
    fn remove(path: *const c_char) -> c_int => h_remove(path);
    fn rmdir(path: *const c_char) -> c_int => h_rmdir(path);
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int => h_create(path);
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int => h_createat(dirfd, path);
    fn link(old: *const c_char, new: *const c_char) -> c_int => h_create(new);
    fn linkat(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_int) -> c_int => h_createat(newdirfd, new);
    fn symlink(target: *const c_char, linkpath: *const c_char) -> c_int => h_create(linkpath);
    fn symlinkat(target: *const c_char, newdirfd: c_int, linkpath: *const c_char) -> c_int => h_createat(newdirfd, linkpath);
    fn mknod(path: *const c_char, mode: mode_t, dev: dev_t) -> c_int => h_create(path);
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: dev_t) -> c_int => h_createat(dirfd, path);
    fn mkfifo(path: *const c_char, mode: mode_t) -> c_int => h_create(path);
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int => h_createat(dirfd, path);
    fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int => h_fd_change(fd);
    fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int => h_fd_change(fd);
    fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int => h_posix_fallocate(fd);
    fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int => h_posix_fallocate(fd);
    fn chmod(path: *const c_char, mode: mode_t) -> c_int => h_meta_follow_mode(path);
    fn lchmod(path: *const c_char, mode: mode_t) -> c_int => h_meta_nofollow_mode(path);
    fn fchmod(fd: c_int, mode: mode_t) -> c_int => h_fd_meta_mode(fd);
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int => h_metaat_mode(dirfd, path, flags);
    fn chown(path: *const c_char, owner: uid_t, group: gid_t) -> c_int => h_meta_follow_owner(path);
    fn lchown(path: *const c_char, owner: uid_t, group: gid_t) -> c_int => h_meta_nofollow_owner(path);
    fn fchown(fd: c_int, owner: uid_t, group: gid_t) -> c_int => h_fd_meta_owner(fd);
    fn fchownat(dirfd: c_int, path: *const c_char, owner: uid_t, group: gid_t, flags: c_int) -> c_int => h_metaat_owner(dirfd, path, flags);
    fn utime(path: *const c_char, times: *const utimbuf) -> c_int => h_meta_follow_times(path);
    fn utimes(path: *const c_char, times: *const timeval) -> c_int => h_meta_follow_times(path);
    fn lutimes(path: *const c_char, times: *const timeval) -> c_int => h_meta_nofollow_times(path);
    fn futimes(fd: c_int, times: *const timeval) -> c_int => h_fd_meta_times(fd);
    fn futimesat(dirfd: c_int, path: *const c_char, times: *const timeval) -> c_int => h_futimesat(dirfd, path);
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const timespec, flags: c_int) -> c_int => h_metaat_times(dirfd, path, flags);
    fn futimens(fd: c_int, times: *const timespec) -> c_int => h_fd_meta_times(fd);
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int => h_xattr_follow(path, name);
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int => h_xattr_nofollow(path, name);
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int => h_fd_xattr(fd, name);
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int => h_xattr_follow(path, name);
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int => h_xattr_nofollow(path, name);
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int => h_fd_xattr(fd, name);
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int => h_connect(addr, len);
    fn __connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int => h_connect(addr, len);
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t => h_sendto(addr, len);
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t => h_sendmsg(msg);
    fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int => h_sendmmsg(msgs, vlen);
    fn kill(pid: pid_t, sig: c_int) -> c_int => h_kill(pid, sig);
    fn killpg(pgrp: pid_t, sig: c_int) -> c_int => h_killpg(pgrp, sig);
    fn tgkill(tgid: pid_t, tid: pid_t, sig: c_int) -> c_int => h_kill(tgid, sig);
    fn sigqueue(pid: pid_t, sig: c_int, value: sigval) -> c_int => h_kill(pid, sig);
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int => h_execve(path, argv, envp);
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int => h_execv(path, argv);
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int => h_execvp(file, argv);
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int => h_execvpe(file, argv, envp);
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int => h_fexecve(fd, argv, envp);
    fn execveat(dirfd: c_int, path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, flags: c_int) -> c_int => h_execveat(dirfd, path, argv, envp, flags);
    fn posix_spawn(pid: *mut pid_t, path: *const c_char, actions: *const posix_spawn_file_actions_t, attr: *const posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int => h_posix_spawn(pid, path, actions, attr, argv, envp);
    fn posix_spawnp(pid: *mut pid_t, file: *const c_char, actions: *const posix_spawn_file_actions_t, attr: *const posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int => h_posix_spawnp(pid, file, actions, attr, argv, envp);
    fn system(command: *const c_char) -> c_int => h_system(command);
    fn popen(command: *const c_char, mode: *const c_char) -> *mut FILE => h_popen(command);
    // The escape hatch: only the mutating numbers leave the fast path (Rust calls syscall for
    // every futex operation, the shim's own locks included).
    fn syscall(nr: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long => h_syscall(nr, a1, a2, a3, a4, a5, a6);
    fn setuid(uid: uid_t) -> c_int => h_set_euid(uid);
    fn seteuid(euid: uid_t) -> c_int => h_set_euid(euid);
    fn setreuid(ruid: uid_t, euid: uid_t) -> c_int => h_set_euid(euid);
    fn setresuid(ruid: uid_t, euid: uid_t, suid: uid_t) -> c_int => h_set_euid(euid);
    // Closing or replacing a descriptor: only forgotten (see fdmemo.rs), never journaled.
    fn close(fd: c_int) -> c_int => h_forget(fd);
    fn __close(fd: c_int) -> c_int => h_forget(fd);
    fn dup2(old: c_int, new: c_int) -> c_int => h_forget(new);
    fn __dup2(old: c_int, new: c_int) -> c_int => h_forget(new);
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int => h_forget(new);
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int => h_close_range(first, last);
    fn closefrom(lowfd: c_int) -> () => h_closefrom(lowfd);
    fn fclose(stream: *mut FILE) -> c_int => h_fclose(stream);
    fn fcloseall() -> c_int => h_fcloseall();
    fn closedir(dir: *mut DIR) -> c_int => h_closedir(dir);
    // Signal handlers: only learned (see guard.rs), never journaled.
    fn sigaction(sig: c_int, act: *const SigAction, old: *mut SigAction) -> c_int => h_sigaction(sig, act);
    fn __sigaction(sig: c_int, act: *const SigAction, old: *mut SigAction) -> c_int => h_sigaction(sig, act);
    fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t => h_signal(sig, handler);
    fn bsd_signal(sig: c_int, handler: sighandler_t) -> sighandler_t => h_signal(sig, handler);
    fn ssignal(sig: c_int, handler: sighandler_t) -> sighandler_t => h_signal(sig, handler);
    fn sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t => h_signal(sig, handler);
    fn __sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t => h_signal(sig, handler);
    fn sigset(sig: c_int, disposition: sighandler_t) -> sighandler_t => h_signal(sig, disposition);
    // Changing the working directory or root: relative paths may lead elsewhere from now on
    // (see dircache.rs). Never journaled.
    fn chdir(path: *const c_char) -> c_int => h_cwd_change();
    fn fchdir(fd: c_int) -> c_int => h_cwd_change();
    fn chroot(path: *const c_char) -> c_int => h_cwd_change();
    // Reaping a child: the moment a parent whose vfork children journal their execs (Python's
    // subprocess, dash) opens the store they asked for (see state.rs). Never journaled.
    fn wait(status: *mut c_int) -> pid_t => h_reap();
    fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t => h_reap();
    fn wait3(status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> pid_t => h_reap();
    fn wait4(pid: pid_t, status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> pid_t => h_reap();
    fn waitid(idtype: libc::idtype_t, id: libc::id_t, info: *mut libc::siginfo_t, options: c_int) -> c_int => h_reap();
}

/// How a refused call fails: the value the program sees, with errno set.
pub trait Refusal {
    /// The failure value for `errno`.
    fn refused(errno: c_int) -> Self;
}

impl Refusal for c_int {
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        -1
    }
}

impl Refusal for libc::c_long {
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        -1
    }
}

impl Refusal for isize {
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        -1
    }
}

impl<T> Refusal for *mut T {
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        std::ptr::null_mut()
    }
}

/// Runs the shim's bookkeeping around one real call.
///
/// `pre` classifies and captures (under the guard and `catch_unwind`); `real` is then called
/// exactly once, with the guard released and errno as the caller left it, unless the strict
/// policy refused the call; `after` sees whether it succeeded. A panic in `pre` is journaled as
/// an irreversible step naming `path`.
fn journaled<R: Refusal>(
    call: &'static str,
    path: &[u8],
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce() -> R,
    succeeded: impl FnOnce(&R) -> bool,
) -> R {
    journaled_with(call, path, pre, real, |r| (succeeded(r), None), R::refused)
}

/// [`journaled`] for the open family: the outcome also names the descriptor it returned.
fn journaled_open<R: Refusal>(
    call: &'static str,
    path: &[u8],
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce() -> R,
    outcome: impl FnOnce(&R) -> (bool, Option<c_int>),
) -> R {
    journaled_with(call, path, pre, real, outcome, R::refused)
}

/// [`journaled`] for calls that report refusal their own way (posix_fallocate returns the
/// error number instead of setting errno).
fn journaled_with<R>(
    call: &'static str,
    path: &[u8],
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce() -> R,
    outcome: impl FnOnce(&R) -> (bool, Option<c_int>),
    refused: impl FnOnce(c_int) -> R,
) -> R {
    let pending = match Guard::enter() {
        None => {
            // Already inside the shim: the shim's own calls (which mean to pass through), or a
            // signal handler that interrupted its bookkeeping (which cannot be journaled now).
            if !crate::alloc::in_persistent() {
                crate::state::note_unjournaled();
            }
            None
        }
        Some(guard) => {
            let saved = errno();
            let pending = catch_unwind(AssertUnwindSafe(|| {
                store().map(|s| {
                    injected_fault(path);
                    (s, pre(s))
                })
            }))
            .unwrap_or_else(|payload| {
                let _ = catch_unwind(AssertUnwindSafe(|| record_panic(call, path, payload)));
                None
            });
            drop(guard);
            set_errno(saved);
            pending
        }
    };
    if let Some((_, Pending::Refuse(errno))) = pending {
        return refused(errno);
    }
    let result = real();
    if let Some((store, pending)) = pending {
        if !matches!(pending, Pending::Nothing) {
            let err = errno();
            let (ok, fd) = outcome(&result);
            // Most outcomes need nothing, or only lock-free work: no guard for those.
            if let Some(pending) = ops::after_quick(store, pending, ok, fd) {
                if let Some(guard) = Guard::enter() {
                    let _ = catch_unwind(AssertUnwindSafe(|| ops::after(store, call, pending, ok, err, fd)));
                    drop(guard);
                }
            }
            set_errno(err);
        }
    }
    result
}

/// Bookkeeping that can only happen after a real call (names the call chose): under the guard
/// and `catch_unwind`, with errno preserved.
fn after_call(call: &'static str, work: impl FnOnce()) {
    let err = errno();
    let guard = Guard::enter();
    if guard.is_none() && !crate::alloc::in_persistent() {
        crate::state::note_unjournaled();
    }
    if let Some(guard) = guard {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(work)) {
            let _ = catch_unwind(AssertUnwindSafe(|| record_panic(call, b"", payload)));
        }
        drop(guard);
    }
    set_errno(err);
}

/// The test suite's fault injection (see [`crate::state::Config::test_fault`]).
fn injected_fault(path: &[u8]) {
    if crate::state::config().test_fault.as_deref().is_some_and(|f| path.ends_with(f)) {
        panic!("fault injected by AETHER_JOURNAL_TEST_FAULT");
    }
}

/// The test suite's kill injection (see [`crate::state::Config::test_fault`]).
fn injected_kill_after(call: &str) {
    let fault = crate::state::config().test_fault.as_deref();
    if fault.and_then(|f| f.strip_prefix(b"kill-after-call:")) == Some(call.as_bytes()) {
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}

fn record_panic(call: &str, path: &[u8], payload: Box<dyn std::any::Any + Send>) {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    if let Some(s) = store() {
        let before = journal::Before::Irreversible { reason: journal::Reason::Internal { message } };
        s.record(call, journal::Op::Change { path: journal::BPath::new(path.to_vec()), before });
    }
}

fn int_ok(r: &c_int) -> bool {
    *r >= 0
}

fn fd_outcome(r: &c_int) -> (bool, Option<c_int>) {
    (*r >= 0, (*r >= 0).then_some(*r))
}

fn file_outcome(f: &*mut FILE) -> (bool, Option<c_int>) {
    if f.is_null() {
        return (false, None);
    }
    // SAFETY: a stream fopen/freopen just returned; fileno only reads it.
    (true, Some(unsafe { libc::fileno(*f) }))
}

// ----- open family -----

fn h_open(call: &'static str, real: impl FnOnce() -> c_int, path: CPath, flags: c_int) -> c_int {
    h_openat(call, real, libc::AT_FDCWD, path, flags)
}

#[inline(always)]
fn h_openat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: CPath, flags: c_int) -> c_int {
    // The read-only fast path: a flag test and a tail call (the path is not even measured).
    if !ops::open_mutates(flags) {
        return real();
    }
    openat_mutating(call, real, dirfd, path.bytes(), flags)
}

#[inline(never)]
fn openat_mutating(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
) -> c_int {
    let Some(p) = path else { return real() };
    journaled_open(call, p, |s| ops::before_open(s, call, dirfd, p, flags), real, fd_outcome)
}

/// creat is open(path, O_WRONLY | O_CREAT | O_TRUNC): always a mutation.
fn h_creat(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    openat_mutating(call, real, libc::AT_FDCWD, path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC)
}

fn h_fopen(call: &'static str, real: impl FnOnce() -> *mut FILE, path: CPath, mode: Str<'_>) -> *mut FILE {
    let flags = mode.and_then(ops::fopen_flags).filter(|&f| ops::open_mutates(f));
    let Some(flags) = flags else { return real() };
    fopen_mutating(call, real, path.bytes(), flags)
}

#[inline(never)]
fn fopen_mutating(call: &'static str, real: impl FnOnce() -> *mut FILE, path: Str<'_>, flags: c_int) -> *mut FILE {
    let Some(p) = path else { return real() };
    journaled_open(call, p, |s| ops::before_open(s, call, libc::AT_FDCWD, p, flags), real, file_outcome)
}

fn h_freopen(
    call: &'static str,
    real: impl FnOnce() -> *mut FILE,
    path: Str<'_>,
    mode: Str<'_>,
    stream: *mut FILE,
) -> *mut FILE {
    // The stream's descriptor is closed, whatever the new mode.
    let fd = stream_fd(stream);
    crate::fdmemo::forget(fd);
    let Some(flags) = mode.and_then(ops::fopen_flags).filter(|&f| ops::open_mutates(f)) else { return real() };
    // freopen(NULL, mode, stream) reopens the stream's own file with the new mode.
    let target = match path {
        Some(p) => Some(p.to_vec()),
        // A raw readlink of /proc/self/fd/N: errno untouched; a stream without a descriptor
        // (fd -1) has no name.
        None => journal::resolve::fd_path(fd).ok(),
    };
    let Some(p) = target else { return real() };
    journaled_open(call, &p, |s| ops::before_open(s, call, libc::AT_FDCWD, &p, flags), real, file_outcome)
}

// ----- temporary files: the name is only known afterwards -----

/// Whether a mkstemp-like call succeeded (an fd, or mkdtemp's non-null result), and the
/// descriptor it returned.
trait CreatedOk {
    fn created(&self) -> bool;
    fn fd(&self) -> Option<c_int>;
}

impl CreatedOk for c_int {
    fn created(&self) -> bool {
        *self >= 0
    }
    fn fd(&self) -> Option<c_int> {
        (*self >= 0).then_some(*self)
    }
}

impl CreatedOk for *mut c_char {
    fn created(&self) -> bool {
        !self.is_null()
    }
    fn fd(&self) -> Option<c_int> {
        None
    }
}

/// The mkstemp family and mkdtemp: the template is journaled before the call (a `temp_name`
/// intent), the name the call chose after it (or that the call failed). A process killed in
/// between leaves an intent nothing completes, which undo reports as incomplete.
fn h_mktemp<R: CreatedOk + Refusal>(call: &'static str, real: impl FnOnce() -> R, template: *mut c_char) -> R {
    // SAFETY: the caller's template, a NUL-terminated string (the call's contract); copied
    // because the call rewrites it.
    let Some(t) = (unsafe { template.cast_const().to_rust() }).map(<[u8]>::to_vec) else { return real() };
    let resolved = std::cell::Cell::new(None);
    let before = |s| {
        let (pending, abs) = ops::before_mktemp(s, call, &t);
        resolved.set(abs);
        pending
    };
    let result = journaled(call, &t, before, real, CreatedOk::created);
    injected_kill_after(call);
    if result.created() {
        after_call(call, || {
            if let Some(s) = store() {
                // SAFETY: on success the call left a NUL-terminated name in the caller's
                // template buffer, which stays valid for the duration of this call.
                if let Some(p) = unsafe { template.cast_const().to_rust() } {
                    ops::after_created(s, call, p, resolved.take().as_ref(), result.fd());
                }
            }
        });
    }
    // Freed here whatever happened (a block is always freed where it came from).
    drop(resolved);
    result
}

// ----- truncation -----

fn h_truncate(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    journaled(call, p, |s| ops::before_truncate(s, call, p), real, int_ok)
}

// ----- rename -----

fn h_rename(call: &'static str, real: impl FnOnce() -> c_int, old: Str<'_>, new: Str<'_>) -> c_int {
    h_renameat2(call, real, libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0)
}

fn h_renameat(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    od: c_int,
    old: Str<'_>,
    nd: c_int,
    new: Str<'_>,
) -> c_int {
    h_renameat2(call, real, od, old, nd, new, 0)
}

fn h_renameat2(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    olddirfd: c_int,
    old: Str<'_>,
    newdirfd: c_int,
    new: Str<'_>,
    flags: c_uint,
) -> c_int {
    let (Some(o), Some(n)) = (old, new) else { return real() };
    let r = journaled(call, o, |s| ops::before_rename(s, call, olddirfd, o, newdirfd, n, flags), real, int_ok);
    ops::names_changed_after_call();
    r
}

// ----- removal and creation of names -----

fn h_unlink(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    h_unlinkat(call, real, libc::AT_FDCWD, path, 0)
}

fn h_unlinkat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>, flags: c_int) -> c_int {
    let Some(p) = path else { return real() };
    let removes = if flags & libc::AT_REMOVEDIR != 0 { Removes::Dir } else { Removes::NonDir };
    let r = journaled(call, p, |s| ops::before_remove(s, call, dirfd, p, removes), real, int_ok);
    ops::names_changed_after_call();
    r
}

fn h_remove(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    let r = journaled(call, p, |s| ops::before_remove(s, call, libc::AT_FDCWD, p, Removes::Either), real, int_ok);
    ops::names_changed_after_call();
    r
}

fn h_rmdir(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    h_unlinkat(call, real, libc::AT_FDCWD, path, libc::AT_REMOVEDIR)
}

fn h_create(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    h_createat(call, real, libc::AT_FDCWD, path)
}

fn h_createat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    journaled(call, p, |s| ops::before_create(s, call, dirfd, p), real, int_ok)
}

// ----- credentials -----

fn h_set_euid(call: &'static str, real: impl FnOnce() -> c_int, euid: uid_t) -> c_int {
    journaled(call, b"", |s| ops::before_uid_change(s, call, euid), real, int_ok)
}

// ----- descriptors changed in place -----

/// A change to a file's bytes through a descriptor (ftruncate, fallocate): nothing to journal
/// when the file is already journaled whole, else its contents through its path.
fn h_fd_change(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    let Some(st) = ops::uncovered_fd(fd) else { return real() };
    journaled(call, b"", |s| ops::before_fd_change(s, call, fd, &st), real, int_ok)
}

/// posix_fallocate returns an error number instead of setting errno.
fn h_posix_fallocate(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    let Some(st) = ops::uncovered_fd(fd) else { return real() };
    journaled_with(call, b"", |s| ops::before_fd_change(s, call, fd, &st), real, |r| (*r == 0, None), |errno| errno)
}

// ----- metadata -----

/// Metadata change by name relative to `dirfd`; `flags` may hold AT_SYMLINK_NOFOLLOW, and
/// AT_EMPTY_PATH (or a null path for utimensat) makes it a change of `dirfd` itself.
fn meta_at(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
    what: MetaKind,
    xattr: Option<&[u8]>,
) -> c_int {
    let on_dirfd_itself = match path {
        None => true,
        Some(b"") => flags & libc::AT_EMPTY_PATH != 0,
        Some(_) => false,
    };
    match path {
        _ if on_dirfd_itself => fd_meta(call, real, dirfd, what, xattr),
        // An empty path without AT_EMPTY_PATH fails with ENOENT.
        None | Some(b"") => real(),
        Some(p) => {
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            journaled(call, p, |s| ops::before_meta(s, call, dirfd, p, follow, what, xattr), real, int_ok)
        }
    }
}

fn h_meta_follow_mode(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Mode, None)
}

fn h_meta_nofollow_mode(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Mode, None)
}

fn h_fd_meta_mode(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    fd_meta(call, real, fd, MetaKind::Mode, None)
}

fn h_metaat_mode(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>, flags: c_int) -> c_int {
    meta_at(call, real, dirfd, path.or(Some(b"")), flags, MetaKind::Mode, None)
}

fn h_meta_follow_owner(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Owner, None)
}

fn h_meta_nofollow_owner(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Owner, None)
}

fn h_fd_meta_owner(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    fd_meta(call, real, fd, MetaKind::Owner, None)
}

fn h_metaat_owner(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
) -> c_int {
    meta_at(call, real, dirfd, path.or(Some(b"")), flags, MetaKind::Owner, None)
}

fn h_meta_follow_times(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Times, None)
}

fn h_meta_nofollow_times(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Times, None)
}

fn h_fd_meta_times(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    fd_meta(call, real, fd, MetaKind::Times, None)
}

/// utimensat: a null path means `dirfd` itself.
fn h_metaat_times(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
) -> c_int {
    meta_at(call, real, dirfd, path, flags, MetaKind::Times, None)
}

/// futimesat: a null path means `dirfd` itself; symlinks are always followed.
fn h_futimesat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, dirfd, path, 0, MetaKind::Times, None)
}

fn h_xattr_follow(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, name: Str<'_>) -> c_int {
    let Some(name) = name else { return real() };
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Xattr, Some(name))
}

fn h_xattr_nofollow(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, name: Str<'_>) -> c_int {
    let Some(name) = name else { return real() };
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Xattr, Some(name))
}

fn h_fd_xattr(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int, name: Str<'_>) -> c_int {
    let Some(name) = name else { return real() };
    fd_meta(call, real, fd, MetaKind::Xattr, Some(name))
}

/// A metadata change through a descriptor: nothing to journal when the file is already
/// journaled whole (no guard needed to find that out), else its prior metadata.
fn fd_meta(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int, what: MetaKind, xattr: Option<&[u8]>) -> c_int {
    let Some(st) = ops::uncovered_fd(fd) else { return real() };
    journaled(call, b"", |s| ops::before_fd_meta(s, call, fd, &st, what, xattr), real, int_ok)
}

// ----- effects outside the file system -----

/// The bytes of a caller's socket address (at most `sockaddr_storage`'s size).
///
/// # Safety
/// `addr` must be null or point to `len` readable bytes (the socket calls' contract).
unsafe fn sockaddr_bytes<'a>(addr: *const sockaddr, len: socklen_t) -> Option<&'a [u8]> {
    let len = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: non-null and `len` readable bytes (caller's obligation).
    (!addr.is_null() && len >= 2).then(|| unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) })
}

fn h_connect(call: &'static str, real: impl FnOnce() -> c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: connect's contract: `addr` points to `len` bytes.
    let Some(ep) = (unsafe { sockaddr_bytes(addr, len) }).and_then(crate::effects::parse_endpoint) else {
        return real();
    };
    journaled(call, b"", |s| crate::effects::before_connect(s, call, ep), real, int_ok)
}

fn h_sendto(call: &'static str, real: impl FnOnce() -> ssize_t, addr: *const sockaddr, len: socklen_t) -> ssize_t {
    // SAFETY: sendto's contract: `addr` is null or points to `len` bytes.
    let Some(ep) = (unsafe { sockaddr_bytes(addr, len) }).and_then(crate::effects::parse_endpoint) else {
        return real();
    };
    journaled(call, b"", |s| crate::effects::before_send(s, call, ep), real, |r| *r >= 0)
}

/// The destination of a message header, if it names one.
///
/// # Safety
/// `msg` must be null or point to a valid `msghdr`.
unsafe fn msg_destination(msg: *const msghdr) -> Option<journal::record::Endpoint> {
    if msg.is_null() {
        return None;
    }
    // SAFETY: a valid msghdr (caller's obligation), whose msg_name points to msg_namelen bytes.
    unsafe { sockaddr_bytes((*msg).msg_name as *const sockaddr, (*msg).msg_namelen) }
        .and_then(crate::effects::parse_endpoint)
}

fn h_sendmsg(call: &'static str, real: impl FnOnce() -> ssize_t, msg: *const msghdr) -> ssize_t {
    // SAFETY: sendmsg's contract: `msg` points to a valid msghdr.
    let Some(ep) = (unsafe { msg_destination(msg) }) else { return real() };
    journaled(call, b"", |s| crate::effects::before_send(s, call, ep), real, |r| *r >= 0)
}

fn h_sendmmsg(call: &'static str, real: impl FnOnce() -> c_int, msgs: *mut mmsghdr, vlen: c_uint) -> c_int {
    let mut dests = Vec::new();
    if !msgs.is_null() {
        for i in 0..vlen.min(1024) as usize {
            // SAFETY: sendmmsg's contract: `msgs` points to `vlen` valid mmsghdr entries.
            if let Some(ep) = unsafe { msg_destination(&(*msgs.add(i)).msg_hdr) } {
                if !dests.contains(&ep) {
                    dests.push(ep);
                }
            }
        }
    }
    if dests.is_empty() {
        return real();
    }
    let pre = |s: &'static Store| {
        for ep in dests {
            if let Pending::Refuse(e) = crate::effects::before_send(s, call, ep) {
                return Pending::Refuse(e);
            }
        }
        Pending::Nothing
    };
    journaled(call, b"", pre, real, int_ok)
}

// ----- closing descriptors -----

/// close, dup2, dup3: forgets the descriptor being closed or replaced, then calls.
fn h_forget(_call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    crate::fdmemo::forget(fd);
    real()
}

fn h_cwd_change<R>(_call: &'static str, real: impl FnOnce() -> R) -> R {
    // Before and after: a thread naming a directory meanwhile sees one or the other.
    crate::dircache::cwd_changed();
    let r = real();
    crate::dircache::cwd_changed();
    r
}

fn h_reap<R>(_call: &'static str, real: impl FnOnce() -> R) -> R {
    crate::state::open_store_children_need();
    real()
}

fn h_close_range(_call: &'static str, real: impl FnOnce() -> c_int, first: c_uint, last: c_uint) -> c_int {
    crate::fdmemo::forget_range(first, last);
    real()
}

fn h_closefrom(_call: &'static str, real: impl FnOnce(), lowfd: c_int) {
    crate::fdmemo::forget_range(lowfd.max(0) as c_uint, c_uint::MAX);
    real()
}

/// The descriptor behind a stream, errno untouched (`fileno` sets it for a stream without one).
fn stream_fd(stream: *mut FILE) -> c_int {
    if stream.is_null() {
        return -1;
    }
    let saved = errno();
    // SAFETY: a non-null stream the caller is about to close or reopen, valid for this call;
    // fileno only reads it.
    let fd = unsafe { libc::fileno(stream) };
    set_errno(saved);
    fd
}

fn h_fclose(_call: &'static str, real: impl FnOnce() -> c_int, stream: *mut FILE) -> c_int {
    crate::fdmemo::forget(stream_fd(stream));
    real()
}

fn h_fcloseall(_call: &'static str, real: impl FnOnce() -> c_int) -> c_int {
    crate::fdmemo::forget_all();
    real()
}

fn h_closedir(_call: &'static str, real: impl FnOnce() -> c_int, dir: *mut DIR) -> c_int {
    if !dir.is_null() {
        let saved = errno();
        // SAFETY: a non-null directory stream the caller is about to close; dirfd only reads it.
        crate::fdmemo::forget(unsafe { libc::dirfd(dir) });
        set_errno(saved);
    }
    real()
}

// ----- signal handlers -----

/// sigaction: notes the handler being installed (before it can run), then installs it.
fn h_sigaction(_call: &'static str, real: impl FnOnce() -> c_int, sig: c_int, act: *const SigAction) -> c_int {
    if !act.is_null() {
        // SAFETY: sigaction's contract: a non-null `act` points to a struct sigaction.
        crate::guard::note_disposition(sig, unsafe { (*act).sa_sigaction });
    }
    real()
}

/// signal and its aliases, sigset: as [`h_sigaction`].
fn h_signal(
    _call: &'static str,
    real: impl FnOnce() -> sighandler_t,
    sig: c_int,
    disposition: sighandler_t,
) -> sighandler_t {
    crate::guard::note_disposition(sig, disposition);
    real()
}

fn h_kill(call: &'static str, real: impl FnOnce() -> c_int, pid: pid_t, sig: c_int) -> c_int {
    if sig == 0 {
        return real(); // a liveness probe changes nothing
    }
    journaled(call, b"", |s| crate::effects::before_signal(s, call, pid as i64, sig), real, int_ok)
}

fn h_killpg(call: &'static str, real: impl FnOnce() -> c_int, pgrp: pid_t, sig: c_int) -> c_int {
    if sig == 0 {
        return real();
    }
    let target = if pgrp == 0 { 0 } else { -(pgrp as i64) };
    journaled(call, b"", |s| crate::effects::before_signal(s, call, target, sig), real, int_ok)
}

// ----- exec and spawn -----

type Argv = *const *const c_char;

/// Runs an exec according to its plan: refused, with the caller's own environment (`real`),
/// or with a fixed one (`with_env`, which calls the same real function, or its envp-taking
/// sibling). Exactly one of the two runs. Only returns if the exec failed.
fn run_exec(
    call: &'static str,
    mut plan: Plan,
    real: impl FnOnce() -> c_int,
    with_env: impl FnOnce(Argv) -> c_int,
) -> c_int {
    if let Some(errno) = plan.refuse {
        return c_int::refused(errno);
    }
    let r = match plan.env.take() {
        None => real(),
        Some(block) => crate::exec::exec_with_env(block, with_env),
    };
    let err = errno();
    crate::exec::failed(call, &plan, err);
    set_errno(err);
    r
}

/// The real definition of another hooked symbol (execve behind execv, execvpe behind execvp).
///
/// # Safety
/// `F` must match the C signature of the symbol `real` names.
unsafe fn real_of<F: Copy>(name: &CStr, real: &Real) -> Option<F> {
    // SAFETY: forwarded obligation.
    unsafe { real.get::<F>(name) }
}

type ExecveFn = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;

fn call_execve(path: &[u8], argv: Argv, env: Argv) -> c_int {
    // SAFETY: ExecveFn is execve's C signature.
    match unsafe { real_of::<ExecveFn>(execve::NAME, &execve::REAL) } {
        // SAFETY: the caller's path (still NUL-terminated: it is a CStr's bytes) and argv, with
        // a null-terminated environment we built.
        Some(f) => unsafe { f(path.as_ptr().cast(), argv, env) },
        None => <c_int as crate::real::Missing>::missing(),
    }
}

fn call_execvpe(file: &[u8], argv: Argv, env: Argv) -> c_int {
    // SAFETY: ExecveFn is also execvpe's C signature.
    match unsafe { real_of::<ExecveFn>(execvpe::NAME, &execvpe::REAL) } {
        // SAFETY: as in call_execve.
        Some(f) => unsafe { f(file.as_ptr().cast(), argv, env) },
        None => <c_int as crate::real::Missing>::missing(),
    }
}

fn h_execve(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, argv: Argv, envp: Argv) -> c_int {
    let Some(p) = path else { return real() };
    let (_, plan) = crate::exec::prepare(call, Program::Path(p), argv, EnvIn::Given(envp), true);
    run_exec(call, plan, real, |env| call_execve(p, argv, env))
}

fn h_execv(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, argv: Argv) -> c_int {
    let Some(p) = path else { return real() };
    let (_, plan) = crate::exec::prepare(call, Program::Path(p), argv, EnvIn::Environ, true);
    run_exec(call, plan, real, |env| call_execve(p, argv, env))
}

fn h_execvp(call: &'static str, real: impl FnOnce() -> c_int, file: Str<'_>, argv: Argv) -> c_int {
    let Some(f) = file else { return real() };
    let (_, plan) = crate::exec::prepare(call, Program::Search(f), argv, EnvIn::Environ, true);
    run_exec(call, plan, real, |env| call_execvpe(f, argv, env))
}

fn h_execvpe(call: &'static str, real: impl FnOnce() -> c_int, file: Str<'_>, argv: Argv, envp: Argv) -> c_int {
    let Some(f) = file else { return real() };
    let (_, plan) = crate::exec::prepare(call, Program::Search(f), argv, EnvIn::Given(envp), true);
    run_exec(call, plan, real, |env| call_execvpe(f, argv, env))
}

fn h_fexecve(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int, argv: Argv, envp: Argv) -> c_int {
    let program = journal::resolve::fd_path(fd).unwrap_or_else(|_| format!("/proc/self/fd/{fd}").into_bytes());
    let (_, plan) = crate::exec::prepare(call, Program::Resolved(program), argv, EnvIn::Given(envp), true);
    run_exec(call, plan, real, |env| {
        type F = unsafe extern "C" fn(c_int, Argv, Argv) -> c_int;
        // SAFETY: F is fexecve's C signature.
        match unsafe { real_of::<F>(fexecve::NAME, &fexecve::REAL) } {
            // SAFETY: the caller's fd and argv, with our null-terminated environment.
            Some(f) => unsafe { f(fd, argv, env) },
            None => <c_int as crate::real::Missing>::missing(),
        }
    })
}

fn h_execveat(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> c_int {
    let Some(p) = path else { return real() };
    let program = if p.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
        Program::Resolved(journal::resolve::fd_path(dirfd).unwrap_or_default())
    } else if p.first() == Some(&b'/') || dirfd == libc::AT_FDCWD {
        Program::Path(p)
    } else {
        Program::Resolved(journal::bpath::join(&journal::resolve::fd_path(dirfd).unwrap_or_default(), p))
    };
    let (_, plan) = crate::exec::prepare(call, program, argv, EnvIn::Given(envp), true);
    run_exec(call, plan, real, |env| {
        type F = unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int;
        // SAFETY: F is execveat's C signature.
        match unsafe { real_of::<F>(execveat::NAME, &execveat::REAL) } {
            // SAFETY: the caller's arguments, with our null-terminated environment.
            Some(f) => unsafe { f(dirfd, p.as_ptr().cast(), argv, env, flags) },
            None => <c_int as crate::real::Missing>::missing(),
        }
    })
}

type SpawnFn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const posix_spawn_file_actions_t,
    *const posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

/// posix_spawn and posix_spawnp: checked and fixed before, journaled after (with the child's
/// pid). They return an error number rather than setting errno.
#[allow(clippy::too_many_arguments)]
fn spawn(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    sym: (&CStr, &Real),
    program: Program<'_>,
    pid: *mut pid_t,
    path: &[u8],
    actions: *const posix_spawn_file_actions_t,
    attr: *const posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let (resolved, plan) = crate::exec::prepare(call, program, argv.cast(), EnvIn::Given(envp.cast()), false);
    if let Some(errno) = plan.refuse {
        return errno;
    }
    let r = match &plan.env {
        None => real(),
        // SAFETY: SpawnFn is the C signature of both posix_spawn and posix_spawnp.
        Some(env) => match unsafe { real_of::<SpawnFn>(sym.0, sym.1) } {
            // SAFETY: the caller's arguments, with our null-terminated environment.
            Some(f) => unsafe { f(pid, path.as_ptr().cast(), actions, attr, argv, env.as_ptr().cast()) },
            None => libc::ENOSYS,
        },
    };
    if r == 0 {
        // SAFETY: on success posix_spawn stored the child's pid through the caller's pointer
        // (when it passed one).
        let child = if pid.is_null() { 0 } else { unsafe { *pid } };
        crate::exec::spawned(call, &resolved, &plan, argv.cast(), child as u32);
    } else {
        crate::exec::failed(call, &plan, r);
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn h_posix_spawn(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    pid: *mut pid_t,
    path: Str<'_>,
    actions: *const posix_spawn_file_actions_t,
    attr: *const posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let Some(p) = path else { return real() };
    spawn(call, real, (posix_spawn::NAME, &posix_spawn::REAL), Program::Path(p), pid, p, actions, attr, argv, envp)
}

#[allow(clippy::too_many_arguments)]
fn h_posix_spawnp(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    pid: *mut pid_t,
    file: Str<'_>,
    actions: *const posix_spawn_file_actions_t,
    attr: *const posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let Some(f) = file else { return real() };
    spawn(call, real, (posix_spawnp::NAME, &posix_spawnp::REAL), Program::Search(f), pid, f, actions, attr, argv, envp)
}

/// The argv `/bin/sh -c command` that system and popen run.
fn shell_argv(command: &[u8]) -> Vec<*const c_char> {
    vec![c"sh".as_ptr(), c"-c".as_ptr(), command.as_ptr().cast(), std::ptr::null()]
}

fn h_system(call: &'static str, real: impl FnOnce() -> c_int, command: Str<'_>) -> c_int {
    let Some(cmd) = command else { return real() }; // system(NULL) asks whether a shell exists
    let argv = shell_argv(cmd);
    let (_, plan) =
        crate::exec::prepare(call, Program::Resolved(b"/bin/sh".to_vec()), argv.as_ptr(), EnvIn::Fixed, true);
    if let Some(errno) = plan.refuse {
        return c_int::refused(errno);
    }
    let r = real();
    if r == -1 {
        let err = errno();
        crate::exec::failed(call, &plan, err);
        set_errno(err);
    }
    r
}

fn h_popen(call: &'static str, real: impl FnOnce() -> *mut FILE, command: Str<'_>) -> *mut FILE {
    let Some(cmd) = command else { return real() };
    let argv = shell_argv(cmd);
    let (_, plan) =
        crate::exec::prepare(call, Program::Resolved(b"/bin/sh".to_vec()), argv.as_ptr(), EnvIn::Fixed, true);
    if let Some(errno) = plan.refuse {
        return <*mut FILE>::refused(errno);
    }
    let r = real();
    if r.is_null() {
        let err = errno();
        crate::exec::failed(call, &plan, err);
        set_errno(err);
    }
    r
}

// ----- syscall(2) -----

/// Whether `syscall(nr, ...)` can change files, run programs or reach other endpoints.
#[inline(always)]
fn journaled_syscall(nr: c_long) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(
        nr,
        libc::SYS_open
            | libc::SYS_creat
            | libc::SYS_rename
            | libc::SYS_unlink
            | libc::SYS_rmdir
            | libc::SYS_mkdir
            | libc::SYS_link
            | libc::SYS_symlink
            | libc::SYS_mknod
            | libc::SYS_chmod
            | libc::SYS_chown
            | libc::SYS_lchown
    ) {
        return true;
    }
    matches!(
        nr,
        libc::SYS_openat
            | libc::SYS_openat2
            | libc::SYS_truncate
            | libc::SYS_ftruncate
            | libc::SYS_fallocate
            | libc::SYS_renameat
            | libc::SYS_renameat2
            | libc::SYS_unlinkat
            | libc::SYS_mkdirat
            | libc::SYS_linkat
            | libc::SYS_symlinkat
            | libc::SYS_mknodat
            | libc::SYS_fchmod
            | libc::SYS_fchmodat
            | libc::SYS_fchmodat2
            | libc::SYS_fchown
            | libc::SYS_fchownat
            | libc::SYS_utimensat
            | libc::SYS_setxattr
            | libc::SYS_lsetxattr
            | libc::SYS_fsetxattr
            | libc::SYS_removexattr
            | libc::SYS_lremovexattr
            | libc::SYS_fremovexattr
            | libc::SYS_execve
            | libc::SYS_execveat
            | libc::SYS_connect
            | libc::SYS_sendto
            | libc::SYS_sendmsg
            | libc::SYS_sendmmsg
            | libc::SYS_kill
            | libc::SYS_tgkill
            | libc::SYS_setuid
            | libc::SYS_setreuid
            | libc::SYS_setresuid
            | libc::SYS_io_uring_setup
    )
}

/// Runs an int-returning handler for a syscall, keeping the full `long` the real call returned.
fn as_int(real: impl FnOnce() -> c_long, handler: impl FnOnce(&mut dyn FnMut() -> c_int) -> c_int) -> c_long {
    let mut real = Some(real);
    let mut full = None;
    let r = handler(&mut || match real.take() {
        Some(f) => {
            let v = f();
            full = Some(v);
            v as c_int
        }
        None => -1,
    });
    full.unwrap_or(r as c_long)
}

#[allow(clippy::too_many_arguments)]
fn h_syscall(
    call: &'static str,
    real: impl FnOnce() -> c_long,
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if !journaled_syscall(nr) {
        // A descriptor closed or replaced behind libc's names is forgotten all the same.
        match nr {
            libc::SYS_close => crate::fdmemo::forget(a1 as c_int),
            libc::SYS_dup3 => crate::fdmemo::forget(a2 as c_int),
            libc::SYS_close_range => crate::fdmemo::forget_range(a1 as c_uint, a2 as c_uint),
            libc::SYS_chdir | libc::SYS_fchdir | libc::SYS_chroot => return h_cwd_change(call, real),
            _ => {}
        }
        #[cfg(target_arch = "x86_64")]
        if nr == libc::SYS_dup2 {
            crate::fdmemo::forget(a2 as c_int);
        }
        if nr == libc::SYS_rt_sigaction && a2 != 0 {
            // SAFETY: rt_sigaction's contract: a non-null second argument points to a kernel
            // struct sigaction, whose first member is the handler.
            crate::guard::note_disposition(a1 as c_int, unsafe { *(a2 as *const sighandler_t) });
        }
        return real();
    }
    // SAFETY: for each number below, the argument read as a string is, by that system call's
    // contract, null or a NUL-terminated path or name valid for the duration of the call.
    let s = |p: c_long| unsafe { (p as *const c_char).to_rust() };
    let fd = |v: c_long| v as c_int;
    #[cfg(target_arch = "x86_64")]
    match nr {
        libc::SYS_open => return as_int(real, |r| h_openat(call, r, libc::AT_FDCWD, CPath(a1 as _), fd(a2))),
        libc::SYS_creat => return as_int(real, |r| h_creat(call, r, s(a1))),
        libc::SYS_rename => return as_int(real, |r| h_rename(call, r, s(a1), s(a2))),
        libc::SYS_unlink => return as_int(real, |r| h_unlink(call, r, s(a1))),
        libc::SYS_rmdir => return as_int(real, |r| h_rmdir(call, r, s(a1))),
        libc::SYS_mkdir | libc::SYS_mknod => return as_int(real, |r| h_create(call, r, s(a1))),
        libc::SYS_link | libc::SYS_symlink => return as_int(real, |r| h_create(call, r, s(a2))),
        libc::SYS_chmod => return as_int(real, |r| h_meta_follow_mode(call, r, s(a1))),
        libc::SYS_chown => return as_int(real, |r| h_meta_follow_owner(call, r, s(a1))),
        libc::SYS_lchown => return as_int(real, |r| h_meta_nofollow_owner(call, r, s(a1))),
        _ => {}
    }
    match nr {
        libc::SYS_openat => as_int(real, |r| h_openat(call, r, fd(a1), CPath(a2 as _), fd(a3))),
        libc::SYS_openat2 => {
            // struct open_how starts with the u64 flags.
            let how = a3 as *const u64;
            // SAFETY: openat2's contract: `how` points to a struct open_how of `a4` bytes.
            let flags = if how.is_null() || a4 < 8 { 0 } else { (unsafe { how.read_unaligned() }) as c_int };
            as_int(real, |r| h_openat(call, r, fd(a1), CPath(a2 as _), flags))
        }
        libc::SYS_truncate => as_int(real, |r| h_truncate(call, r, s(a1))),
        libc::SYS_ftruncate | libc::SYS_fallocate => as_int(real, |r| h_fd_change(call, r, fd(a1))),
        libc::SYS_renameat => as_int(real, |r| h_renameat(call, r, fd(a1), s(a2), fd(a3), s(a4))),
        libc::SYS_renameat2 => as_int(real, |r| h_renameat2(call, r, fd(a1), s(a2), fd(a3), s(a4), a5 as c_uint)),
        libc::SYS_unlinkat => as_int(real, |r| h_unlinkat(call, r, fd(a1), s(a2), fd(a3))),
        libc::SYS_mkdirat | libc::SYS_mknodat => as_int(real, |r| h_createat(call, r, fd(a1), s(a2))),
        libc::SYS_linkat => as_int(real, |r| h_createat(call, r, fd(a3), s(a4))),
        libc::SYS_symlinkat => as_int(real, |r| h_createat(call, r, fd(a2), s(a3))),
        libc::SYS_fchmod => as_int(real, |r| h_fd_meta_mode(call, r, fd(a1))),
        libc::SYS_fchmodat => as_int(real, |r| h_metaat_mode(call, r, fd(a1), s(a2), 0)),
        libc::SYS_fchmodat2 => as_int(real, |r| h_metaat_mode(call, r, fd(a1), s(a2), fd(a4))),
        libc::SYS_fchown => as_int(real, |r| h_fd_meta_owner(call, r, fd(a1))),
        libc::SYS_fchownat => as_int(real, |r| h_metaat_owner(call, r, fd(a1), s(a2), fd(a5))),
        libc::SYS_utimensat => as_int(real, |r| h_metaat_times(call, r, fd(a1), s(a2), fd(a4))),
        libc::SYS_setxattr | libc::SYS_removexattr => as_int(real, |r| h_xattr_follow(call, r, s(a1), s(a2))),
        libc::SYS_lsetxattr | libc::SYS_lremovexattr => as_int(real, |r| h_xattr_nofollow(call, r, s(a1), s(a2))),
        libc::SYS_fsetxattr | libc::SYS_fremovexattr => as_int(real, |r| h_fd_xattr(call, r, fd(a1), s(a2))),
        libc::SYS_execve => as_int(real, |r| h_execve(call, r, s(a1), a2 as Argv, a3 as Argv)),
        libc::SYS_execveat => as_int(real, |r| h_execveat(call, r, fd(a1), s(a2), a3 as Argv, a4 as Argv, fd(a5))),
        libc::SYS_connect => as_int(real, |r| h_connect(call, r, a2 as *const sockaddr, a3 as socklen_t)),
        libc::SYS_sendto => journaled_long(real, |r| {
            h_sendto(call, || r() as ssize_t, a5 as *const sockaddr, a6 as socklen_t) as c_long
        }),
        libc::SYS_sendmsg => {
            journaled_long(real, |r| h_sendmsg(call, || r() as ssize_t, a2 as *const msghdr) as c_long)
        }
        libc::SYS_sendmmsg => as_int(real, |r| h_sendmmsg(call, r, a2 as *mut mmsghdr, a3 as c_uint)),
        libc::SYS_kill => as_int(real, |r| h_kill(call, r, fd(a1), fd(a2))),
        libc::SYS_tgkill => as_int(real, |r| h_kill(call, r, fd(a1), fd(a3))),
        libc::SYS_setuid => as_int(real, |r| h_set_euid(call, r, a1 as uid_t)),
        libc::SYS_setreuid => as_int(real, |r| h_set_euid(call, r, a2 as uid_t)),
        libc::SYS_setresuid => as_int(real, |r| h_set_euid(call, r, a2 as uid_t)),
        libc::SYS_io_uring_setup => {
            as_int(real, |r| journaled(call, b"", |st| ops::before_io_uring(st, call), r, int_ok))
        }
        _ => real(),
    }
}

/// Runs a long-returning handler (sendto, sendmsg) with a real call that can be taken once.
fn journaled_long(real: impl FnOnce() -> c_long, handler: impl FnOnce(&mut dyn FnMut() -> c_long) -> c_long) -> c_long {
    let mut real = Some(real);
    handler(&mut || real.take().map_or(-1, |f| f()))
}
