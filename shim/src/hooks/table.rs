//! The hook table: every libc symbol the shim interposes, and every `syscall(2)` number it
//! journals or keeps track of, one row each (the row syntax is described at
//! [`super::libc_hooks`] and [`super::syscall_hooks`]).
//!
//! Read a row as "this call is this handler applied to these arguments". The `kernel` column
//! names the system call the libc function makes, so that under a supervisor a journaled call
//! is made marked, by the shim itself; `pass` marks functions whose own system calls cannot be
//! made that way; `libc` calls that no supervisor watches (or that it journals itself: the
//! exec family).
//!
//! What this table cannot hold: a symbol whose arguments a row cannot describe. The three
//! C-variadic execs are expanded separately (see [`super::variadic_hooks`]) and call hooked
//! rows.

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

use journal_core::record::MetaKind::{Mode, Owner, Times};
use libc::{
    AT_FDCWD, AT_REMOVEDIR, AT_SYMLINK_NOFOLLOW, DIR, FILE, O_CREAT, O_TRUNC, O_WRONLY, S_IFIFO, dev_t, gid_t, mmsghdr,
    mode_t, msghdr, off_t, off64_t, pid_t, posix_spawn_file_actions_t, posix_spawnattr_t, sighandler_t, sigval, size_t,
    sockaddr, socklen_t, ssize_t, timespec, timeval, uid_t, utimbuf,
};

use super::CPath;
use super::descriptors::*;
use super::exec::*;
use super::files::*;
use super::net::*;
use super::signals::*;
use super::{libc_hooks, syscall_hooks, variadic_hooks};
use crate::real::Real;
use crate::tempname::Temp;

/// `struct sigaction` (its libc name is also the hooked function's).
type SigAction = libc::sigaction;
type Argv = *const *const c_char;
type Spawn = *const *mut c_char;
/// `utimensat`'s times argument asking for "now".
const NO_TIMES: *const timespec = std::ptr::null();

libc_hooks! {
    // ----- opening files (a read-only open is a flag test and a tail call) -----
    fn open(path: CPath, flags: c_int; ...mode: mode_t) -> c_int [kernel SYS_openat(AT_FDCWD, path, flags, mode)] => open_at(AT_FDCWD, path, flags);
    fn open64(path: CPath, flags: c_int; ...mode: mode_t) -> c_int [kernel SYS_openat(AT_FDCWD, path, flags, mode)] => open_at(AT_FDCWD, path, flags);
    fn __open(path: CPath, flags: c_int; ...mode: mode_t) -> c_int [kernel SYS_openat(AT_FDCWD, path, flags, mode)] => open_at(AT_FDCWD, path, flags);
    fn __open64(path: CPath, flags: c_int; ...mode: mode_t) -> c_int [kernel SYS_openat(AT_FDCWD, path, flags, mode)] => open_at(AT_FDCWD, path, flags);
    fn openat(dirfd: c_int, path: CPath, flags: c_int; ...mode: mode_t) -> c_int [kernel SYS_openat(dirfd, path, flags, mode)] => open_at(dirfd, path, flags);
    fn openat64(dirfd: c_int, path: CPath, flags: c_int; ...mode: mode_t) -> c_int [kernel SYS_openat(dirfd, path, flags, mode)] => open_at(dirfd, path, flags);
    // The fortified variants abort when the flags ask for a mode they were not given: then
    // libc's own is called, which does.
    fn __open_2(path: CPath, flags: c_int) -> c_int [kernel SYS_openat(AT_FDCWD, path, flags, 0) if !needs_mode(flags)] => open_at(AT_FDCWD, path, flags);
    fn __open64_2(path: CPath, flags: c_int) -> c_int [kernel SYS_openat(AT_FDCWD, path, flags, 0) if !needs_mode(flags)] => open_at(AT_FDCWD, path, flags);
    fn __openat_2(dirfd: c_int, path: CPath, flags: c_int) -> c_int [kernel SYS_openat(dirfd, path, flags, 0) if !needs_mode(flags)] => open_at(dirfd, path, flags);
    fn __openat64_2(dirfd: c_int, path: CPath, flags: c_int) -> c_int [kernel SYS_openat(dirfd, path, flags, 0) if !needs_mode(flags)] => open_at(dirfd, path, flags);
    fn creat(path: CPath, mode: mode_t) -> c_int [kernel SYS_openat(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode)] => open_at(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC);
    fn creat64(path: CPath, mode: mode_t) -> c_int [kernel SYS_openat(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode)] => open_at(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC);
    fn fopen(path: CPath, mode: CPath) -> *mut FILE [pass] => fopen_(path, mode);
    fn fopen64(path: CPath, mode: CPath) -> *mut FILE [pass] => fopen_(path, mode);
    fn freopen(path: CPath, mode: CPath, stream: *mut FILE) -> *mut FILE [pass] => freopen_(path, mode, stream);
    fn freopen64(path: CPath, mode: CPath, stream: *mut FILE) -> *mut FILE [pass] => freopen_(path, mode, stream);

    // ----- temporary files: the name is only known afterwards -----
    fn mkstemp(template: *mut c_char) -> c_int [pass] => mktemp(template, Temp::File { suffix: 0, flags: 0 });
    fn mkstemp64(template: *mut c_char) -> c_int [pass] => mktemp(template, Temp::File { suffix: 0, flags: 0 });
    fn mkostemp(template: *mut c_char, flags: c_int) -> c_int [pass] => mktemp(template, Temp::File { suffix: 0, flags });
    fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int [pass] => mktemp(template, Temp::File { suffix: 0, flags });
    fn mkstemps(template: *mut c_char, suffixlen: c_int) -> c_int [pass] => mktemp(template, Temp::File { suffix: suffixlen, flags: 0 });
    fn mkstemps64(template: *mut c_char, suffixlen: c_int) -> c_int [pass] => mktemp(template, Temp::File { suffix: suffixlen, flags: 0 });
    fn mkostemps(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int [pass] => mktemp(template, Temp::File { suffix: suffixlen, flags });
    fn mkostemps64(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int [pass] => mktemp(template, Temp::File { suffix: suffixlen, flags });
    fn mkdtemp(template: *mut c_char) -> *mut c_char [pass] => mktemp(template, Temp::Dir);

    // ----- bytes changed in place -----
    fn truncate(path: CPath, length: off_t) -> c_int [kernel SYS_truncate(path, length)] => truncate_(path);
    fn truncate64(path: CPath, length: off64_t) -> c_int [kernel SYS_truncate(path, length)] => truncate_(path);
    fn ftruncate(fd: c_int, length: off_t) -> c_int [kernel SYS_ftruncate(fd, length)] => fd_change(fd);
    fn ftruncate64(fd: c_int, length: off64_t) -> c_int [kernel SYS_ftruncate(fd, length)] => fd_change(fd);
    fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int [kernel SYS_fallocate(fd, mode, offset, len)] => fd_change(fd);
    fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int [kernel SYS_fallocate(fd, mode, offset, len)] => fd_change(fd);
    fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int [pass] => posix_fallocate_(fd);
    fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int [pass] => posix_fallocate_(fd);

    // ----- names moved, removed and made -----
    fn rename(old: CPath, new: CPath) -> c_int [kernel SYS_renameat2(AT_FDCWD, old, AT_FDCWD, new, 0)] => rename_at(AT_FDCWD, old, AT_FDCWD, new, 0);
    fn renameat(olddirfd: c_int, old: CPath, newdirfd: c_int, new: CPath) -> c_int [kernel SYS_renameat2(olddirfd, old, newdirfd, new, 0)] => rename_at(olddirfd, old, newdirfd, new, 0);
    fn renameat2(olddirfd: c_int, old: CPath, newdirfd: c_int, new: CPath, flags: c_uint) -> c_int [kernel SYS_renameat2(olddirfd, old, newdirfd, new, flags)] => rename_at(olddirfd, old, newdirfd, new, flags);
    fn unlink(path: CPath) -> c_int [kernel SYS_unlinkat(AT_FDCWD, path, 0)] => remove_at(AT_FDCWD, path, 0);
    fn unlinkat(dirfd: c_int, path: CPath, flags: c_int) -> c_int [kernel SYS_unlinkat(dirfd, path, flags)] => remove_at(dirfd, path, flags);
    fn rmdir(path: CPath) -> c_int [kernel SYS_unlinkat(AT_FDCWD, path, AT_REMOVEDIR)] => remove_at(AT_FDCWD, path, AT_REMOVEDIR);
    fn remove(path: CPath) -> c_int [pass] => remove_either(path);
    fn mkdir(path: CPath, mode: mode_t) -> c_int [kernel SYS_mkdirat(AT_FDCWD, path, mode)] => create_at(AT_FDCWD, path);
    fn mkdirat(dirfd: c_int, path: CPath, mode: mode_t) -> c_int [kernel SYS_mkdirat(dirfd, path, mode)] => create_at(dirfd, path);
    fn link(old: CPath, new: CPath) -> c_int [kernel SYS_linkat(AT_FDCWD, old, AT_FDCWD, new, 0)] => link_at(AT_FDCWD, old, AT_FDCWD, new, 0);
    fn linkat(olddirfd: c_int, old: CPath, newdirfd: c_int, new: CPath, flags: c_int) -> c_int [kernel SYS_linkat(olddirfd, old, newdirfd, new, flags)] => link_at(olddirfd, old, newdirfd, new, flags);
    fn symlink(target: CPath, linkpath: CPath) -> c_int [kernel SYS_symlinkat(target, AT_FDCWD, linkpath)] => create_at(AT_FDCWD, linkpath);
    fn symlinkat(target: CPath, newdirfd: c_int, linkpath: CPath) -> c_int [kernel SYS_symlinkat(target, newdirfd, linkpath)] => create_at(newdirfd, linkpath);
    // libc refuses a device number the system call cannot carry: its own function then runs.
    fn mknod(path: CPath, mode: mode_t, dev: dev_t) -> c_int [kernel SYS_mknodat(AT_FDCWD, path, mode, dev) if dev <= u64::from(u32::MAX)] => create_at(AT_FDCWD, path);
    fn mknodat(dirfd: c_int, path: CPath, mode: mode_t, dev: dev_t) -> c_int [kernel SYS_mknodat(dirfd, path, mode, dev) if dev <= u64::from(u32::MAX)] => create_at(dirfd, path);
    fn mkfifo(path: CPath, mode: mode_t) -> c_int [kernel SYS_mknodat(AT_FDCWD, path, mode | S_IFIFO, 0)] => create_at(AT_FDCWD, path);
    fn mkfifoat(dirfd: c_int, path: CPath, mode: mode_t) -> c_int [kernel SYS_mknodat(dirfd, path, mode | S_IFIFO, 0)] => create_at(dirfd, path);

    // ----- metadata -----
    fn chmod(path: CPath, mode: mode_t) -> c_int [kernel SYS_fchmodat(AT_FDCWD, path, mode)] => meta_at(AT_FDCWD, path, 0, Mode);
    // glibc emulates a chmod that does not follow symlinks through /proc: its own runs.
    fn lchmod(path: CPath, mode: mode_t) -> c_int [pass] => meta_at(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, Mode);
    fn fchmod(fd: c_int, mode: mode_t) -> c_int [kernel SYS_fchmod(fd, mode)] => fd_meta(fd, Mode);
    fn fchmodat(dirfd: c_int, path: CPath, mode: mode_t, flags: c_int) -> c_int [kernel SYS_fchmodat(dirfd, path, mode) if flags == 0] => meta_at(dirfd, path, flags, Mode);
    fn chown(path: CPath, owner: uid_t, group: gid_t) -> c_int [kernel SYS_fchownat(AT_FDCWD, path, owner, group, 0)] => meta_at(AT_FDCWD, path, 0, Owner);
    fn lchown(path: CPath, owner: uid_t, group: gid_t) -> c_int [kernel SYS_fchownat(AT_FDCWD, path, owner, group, AT_SYMLINK_NOFOLLOW)] => meta_at(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, Owner);
    fn fchown(fd: c_int, owner: uid_t, group: gid_t) -> c_int [kernel SYS_fchown(fd, owner, group)] => fd_meta(fd, Owner);
    fn fchownat(dirfd: c_int, path: CPath, owner: uid_t, group: gid_t, flags: c_int) -> c_int [kernel SYS_fchownat(dirfd, path, owner, group, flags)] => meta_at(dirfd, path, flags, Owner);
    // The older forms convert and check their times in libc: its own run, holding a pass. Asked
    // for "now" (no times, as git freshening an object and `touch`-like tools ask), glibc makes
    // exactly the `utimensat` below (checked with strace on glibc 2.36).
    fn utime(path: CPath, times: *const utimbuf) -> c_int [kernel SYS_utimensat(AT_FDCWD, path, NO_TIMES, 0) if times.is_null()] => meta_at(AT_FDCWD, path, 0, Times);
    fn utimes(path: CPath, times: *const timeval) -> c_int [kernel SYS_utimensat(AT_FDCWD, path, NO_TIMES, 0) if times.is_null()] => meta_at(AT_FDCWD, path, 0, Times);
    fn lutimes(path: CPath, times: *const timeval) -> c_int [kernel SYS_utimensat(AT_FDCWD, path, NO_TIMES, AT_SYMLINK_NOFOLLOW) if times.is_null()] => meta_at(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, Times);
    fn futimes(fd: c_int, times: *const timeval) -> c_int [kernel SYS_utimensat(fd, CPath::NONE, NO_TIMES, 0) if times.is_null()] => fd_meta(fd, Times);
    fn futimesat(dirfd: c_int, path: CPath, times: *const timeval) -> c_int [kernel SYS_utimensat(dirfd, path, NO_TIMES, 0) if times.is_null()] => times_at(dirfd, path, 0);
    fn utimensat(dirfd: c_int, path: CPath, times: *const timespec, flags: c_int) -> c_int [kernel SYS_utimensat(dirfd, path, times, flags)] => times_at(dirfd, path, flags);
    fn futimens(fd: c_int, times: *const timespec) -> c_int [kernel SYS_utimensat(fd, CPath::NONE, times, 0)] => fd_meta(fd, Times);
    fn setxattr(path: CPath, name: CPath, value: *const c_void, size: size_t, flags: c_int) -> c_int [kernel SYS_setxattr(path, name, value, size, flags)] => xattr_at(path, name, 0);
    fn lsetxattr(path: CPath, name: CPath, value: *const c_void, size: size_t, flags: c_int) -> c_int [kernel SYS_lsetxattr(path, name, value, size, flags)] => xattr_at(path, name, AT_SYMLINK_NOFOLLOW);
    fn fsetxattr(fd: c_int, name: CPath, value: *const c_void, size: size_t, flags: c_int) -> c_int [kernel SYS_fsetxattr(fd, name, value, size, flags)] => fd_xattr(fd, name);
    fn removexattr(path: CPath, name: CPath) -> c_int [kernel SYS_removexattr(path, name)] => xattr_at(path, name, 0);
    fn lremovexattr(path: CPath, name: CPath) -> c_int [kernel SYS_lremovexattr(path, name)] => xattr_at(path, name, AT_SYMLINK_NOFOLLOW);
    fn fremovexattr(fd: c_int, name: CPath) -> c_int [kernel SYS_fremovexattr(fd, name)] => fd_xattr(fd, name);

    // A Unix socket's name is a file the call creates.
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int [kernel SYS_bind(fd, addr, len)] => bind_(addr, len);
    // Only the requests that change a file's attributes (chattr) leave the fast path; the
    // variadic argument is the request's pointer, read as the mode above is.
    fn ioctl(fd: c_int, request: c_ulong; ...arg: *mut c_void) -> c_int [kernel SYS_ioctl(fd, request, arg)] => ioctl_(fd, request);

    // ----- effects outside the file system -----
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int [kernel SYS_connect(fd, addr, len)] => connect_(addr, len);
    fn __connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int [kernel SYS_connect(fd, addr, len)] => connect_(addr, len);
    // Six arguments: no register is left for the marker.
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t [pass] => sendto_(addr, len);
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t [kernel SYS_sendmsg(fd, msg, flags)] => sendmsg_(msg);
    fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int [kernel SYS_sendmmsg(fd, msgs, vlen, flags)] => sendmmsg_(msgs, vlen);
    fn kill(pid: pid_t, sig: c_int) -> c_int [kernel SYS_kill(pid, sig)] => kill_(pid, sig);
    // libc refuses a negative group itself: its own function then runs.
    fn killpg(pgrp: pid_t, sig: c_int) -> c_int [kernel SYS_kill(-pgrp, sig) if pgrp >= 0] => killpg_(pgrp, sig);
    fn tgkill(tgid: pid_t, tid: pid_t, sig: c_int) -> c_int [kernel SYS_tgkill(tgid, tid, sig)] => kill_(tgid, sig);
    fn sigqueue(pid: pid_t, sig: c_int, value: sigval) -> c_int [pass] => kill_(pid, sig);

    // ----- programs: a supervisor journals execs itself -----
    fn execve(path: CPath, argv: Argv, envp: Argv) -> c_int [libc] => execve_(path, argv, envp);
    fn execv(path: CPath, argv: Argv) -> c_int [libc] => execv_(path, argv);
    fn execvp(file: CPath, argv: Argv) -> c_int [libc] => execvp_(file, argv);
    fn execvpe(file: CPath, argv: Argv, envp: Argv) -> c_int [libc] => execvpe_(file, argv, envp);
    fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int [libc] => fexecve_(fd, argv, envp);
    fn execveat(dirfd: c_int, path: CPath, argv: Argv, envp: Argv, flags: c_int) -> c_int [libc] => execveat_(dirfd, path, argv, envp, flags);
    fn posix_spawn(pid: *mut pid_t, path: CPath, actions: *const posix_spawn_file_actions_t, attr: *const posix_spawnattr_t, argv: Spawn, envp: Spawn) -> c_int [libc] => posix_spawn_(pid, path, actions, attr, argv, envp, false);
    fn posix_spawnp(pid: *mut pid_t, file: CPath, actions: *const posix_spawn_file_actions_t, attr: *const posix_spawnattr_t, argv: Spawn, envp: Spawn) -> c_int [libc] => posix_spawn_(pid, file, actions, attr, argv, envp, true);
    fn system(command: CPath) -> c_int [libc] => system_(command);
    fn popen(command: CPath, mode: *const c_char) -> *mut FILE [libc] => popen_(command);
    fn setuid(uid: uid_t) -> c_int [libc] => set_euid(uid);
    fn seteuid(euid: uid_t) -> c_int [libc] => set_euid(euid);
    fn setreuid(ruid: uid_t, euid: uid_t) -> c_int [libc] => set_euid(euid);
    fn setresuid(ruid: uid_t, euid: uid_t, suid: uid_t) -> c_int [libc] => set_euid(euid);

    // ----- the escape hatch: only the rows of the second table leave the fast path (Rust
    // calls syscall for every futex operation, the shim's own locks included) -----
    fn syscall(nr: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long [libc] => syscall_(nr, [a1, a2, a3, a4, a5, a6]);

    // ----- descriptors let go: only forgotten (see fdmemo.rs), never journaled -----
    fn close(fd: c_int) -> c_int [libc] => forget(fd);
    fn __close(fd: c_int) -> c_int [libc] => forget(fd);
    fn dup2(old: c_int, new: c_int) -> c_int [libc] => forget(new);
    fn __dup2(old: c_int, new: c_int) -> c_int [libc] => forget(new);
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int [libc] => forget(new);
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int [libc] => forget_range(first, last);
    fn closefrom(lowfd: c_int) -> () [libc] => forget_range(lowfd.max(0) as c_uint, c_uint::MAX);
    fn fclose(stream: *mut FILE) -> c_int [libc] => forget_stream(stream);
    fn fcloseall() -> c_int [libc] => forget_all();
    fn closedir(dir: *mut DIR) -> c_int [libc] => forget_dir(dir);

    // ----- signal handlers: only learned (see guard.rs), never journaled -----
    fn sigaction(sig: c_int, act: *const SigAction, old: *mut SigAction) -> c_int [libc] => sigaction_(sig, act);
    fn __sigaction(sig: c_int, act: *const SigAction, old: *mut SigAction) -> c_int [libc] => sigaction_(sig, act);
    fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t [libc] => signal_(sig, handler);
    fn bsd_signal(sig: c_int, handler: sighandler_t) -> sighandler_t [libc] => signal_(sig, handler);
    fn ssignal(sig: c_int, handler: sighandler_t) -> sighandler_t [libc] => signal_(sig, handler);
    fn sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t [libc] => signal_(sig, handler);
    fn __sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t [libc] => signal_(sig, handler);
    fn sigset(sig: c_int, disposition: sighandler_t) -> sighandler_t [libc] => signal_(sig, disposition);

    // ----- relative paths may lead elsewhere from now on (see dircache.rs); never journaled
    // (under a supervisor chdir and fchdir are marked: see `cwd_change`) -----
    fn chdir(path: CPath) -> c_int [kernel SYS_chdir(path)] => cwd_change();
    fn fchdir(fd: c_int) -> c_int [kernel SYS_fchdir(fd)] => cwd_change();
    fn chroot(path: CPath) -> c_int [libc] => root_change();

    // ----- forks: the parent opens its store before, the child adopts itself after (see
    // `fork_`); `_Fork` runs no fork handlers, so it prepares nothing; never journaled -----
    fn fork() -> pid_t [libc] => fork_(true);
    fn __fork() -> pid_t [libc] => fork_(true);
    #[allow(non_snake_case)]
    fn _Fork() -> pid_t [libc] => fork_(false);
    fn daemon(nochdir: c_int, noclose: c_int) -> c_int [libc] => fork_(true);
    fn forkpty(amaster: *mut c_int, name: *mut c_char, termp: *const libc::termios, winp: *const libc::winsize) -> pid_t [libc] => fork_(true);

    // ----- reaping a child: when a parent whose vfork children journal their execs (Python's
    // subprocess, dash) opens the store they asked for (see state.rs); never journaled -----
    fn wait(status: *mut c_int) -> pid_t [libc] => reap();
    fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t [libc] => reap();
    fn wait3(status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> pid_t [libc] => reap();
    fn wait4(pid: pid_t, status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> pid_t [libc] => reap();
    fn waitid(idtype: libc::idtype_t, id: libc::id_t, info: *mut libc::siginfo_t, options: c_int) -> c_int [libc] => reap();
}

variadic_hooks! {
    fn execl(...) => aether_journal_execl;
    fn execlp(...) => aether_journal_execlp;
    fn execle(...) => aether_journal_execle;
}

syscall_hooks! {
    #[cfg(target_arch = "x86_64")]
    sys SYS_open(path: CPath, flags: c_int) [kernel] => open_at(AT_FDCWD, path, flags);
    #[cfg(target_arch = "x86_64")]
    sys SYS_creat(path: CPath) [kernel] => open_at(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC);
    sys SYS_openat(dirfd: c_int, path: CPath, flags: c_int) [kernel] => open_at(dirfd, path, flags);
    sys SYS_openat2(dirfd: c_int, path: CPath, how: *const u64, size: usize) [kernel] => openat2_(dirfd, path, how, size);
    sys SYS_truncate(path: CPath) [kernel] => truncate_(path);
    sys SYS_ftruncate(fd: c_int) [kernel] => fd_change(fd);
    sys SYS_fallocate(fd: c_int) [kernel] => fd_change(fd);
    #[cfg(target_arch = "x86_64")]
    sys SYS_rename(old: CPath, new: CPath) [kernel] => rename_at(AT_FDCWD, old, AT_FDCWD, new, 0);
    #[cfg(target_arch = "x86_64")]
    sys SYS_renameat(olddirfd: c_int, old: CPath, newdirfd: c_int, new: CPath) [kernel] => rename_at(olddirfd, old, newdirfd, new, 0);
    sys SYS_renameat2(olddirfd: c_int, old: CPath, newdirfd: c_int, new: CPath, flags: c_uint) [kernel] => rename_at(olddirfd, old, newdirfd, new, flags);
    #[cfg(target_arch = "x86_64")]
    sys SYS_unlink(path: CPath) [kernel] => remove_at(AT_FDCWD, path, 0);
    #[cfg(target_arch = "x86_64")]
    sys SYS_rmdir(path: CPath) [kernel] => remove_at(AT_FDCWD, path, AT_REMOVEDIR);
    sys SYS_unlinkat(dirfd: c_int, path: CPath, flags: c_int) [kernel] => remove_at(dirfd, path, flags);
    #[cfg(target_arch = "x86_64")]
    sys SYS_mkdir(path: CPath) [kernel] => create_at(AT_FDCWD, path);
    #[cfg(target_arch = "x86_64")]
    sys SYS_mknod(path: CPath) [kernel] => create_at(AT_FDCWD, path);
    #[cfg(target_arch = "x86_64")]
    sys SYS_link(old: CPath, new: CPath) [kernel] => link_at(AT_FDCWD, old, AT_FDCWD, new, 0);
    #[cfg(target_arch = "x86_64")]
    sys SYS_symlink(target: CPath, linkpath: CPath) [kernel] => create_at(AT_FDCWD, linkpath);
    sys SYS_mkdirat(dirfd: c_int, path: CPath) [kernel] => create_at(dirfd, path);
    sys SYS_mknodat(dirfd: c_int, path: CPath) [kernel] => create_at(dirfd, path);
    sys SYS_linkat(olddirfd: c_int, old: CPath, newdirfd: c_int, new: CPath, flags: c_int) [kernel] => link_at(olddirfd, old, newdirfd, new, flags);
    sys SYS_symlinkat(target: CPath, newdirfd: c_int, linkpath: CPath) [kernel] => create_at(newdirfd, linkpath);
    #[cfg(target_arch = "x86_64")]
    sys SYS_chmod(path: CPath) [kernel] => meta_at(AT_FDCWD, path, 0, Mode);
    sys SYS_fchmod(fd: c_int) [kernel] => fd_meta(fd, Mode);
    // The system call has no flags argument: it always follows symlinks.
    sys SYS_fchmodat(dirfd: c_int, path: CPath) [kernel] => meta_at(dirfd, path, 0, Mode);
    sys SYS_fchmodat2(dirfd: c_int, path: CPath, mode: c_uint, flags: c_int) [kernel] => meta_at(dirfd, path, flags, Mode);
    #[cfg(target_arch = "x86_64")]
    sys SYS_chown(path: CPath) [kernel] => meta_at(AT_FDCWD, path, 0, Owner);
    #[cfg(target_arch = "x86_64")]
    sys SYS_lchown(path: CPath) [kernel] => meta_at(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, Owner);
    sys SYS_fchown(fd: c_int) [kernel] => fd_meta(fd, Owner);
    sys SYS_fchownat(dirfd: c_int, path: CPath, owner: c_uint, group: c_uint, flags: c_int) [kernel] => meta_at(dirfd, path, flags, Owner);
    #[cfg(target_arch = "x86_64")]
    sys SYS_utime(path: CPath) [kernel] => meta_at(AT_FDCWD, path, 0, Times);
    #[cfg(target_arch = "x86_64")]
    sys SYS_utimes(path: CPath) [kernel] => meta_at(AT_FDCWD, path, 0, Times);
    #[cfg(target_arch = "x86_64")]
    sys SYS_futimesat(dirfd: c_int, path: CPath) [kernel] => times_at(dirfd, path, 0);
    sys SYS_utimensat(dirfd: c_int, path: CPath, times: *const timespec, flags: c_int) [kernel] => times_at(dirfd, path, flags);
    sys SYS_setxattr(path: CPath, name: CPath) [kernel] => xattr_at(path, name, 0);
    sys SYS_lsetxattr(path: CPath, name: CPath) [kernel] => xattr_at(path, name, AT_SYMLINK_NOFOLLOW);
    sys SYS_fsetxattr(fd: c_int, name: CPath) [kernel] => fd_xattr(fd, name);
    sys SYS_removexattr(path: CPath, name: CPath) [kernel] => xattr_at(path, name, 0);
    sys SYS_lremovexattr(path: CPath, name: CPath) [kernel] => xattr_at(path, name, AT_SYMLINK_NOFOLLOW);
    sys SYS_fremovexattr(fd: c_int, name: CPath) [kernel] => fd_xattr(fd, name);
    sys SYS_execve(path: CPath, argv: Argv, envp: Argv) [libc] => execve_(path, argv, envp);
    sys SYS_execveat(dirfd: c_int, path: CPath, argv: Argv, envp: Argv, flags: c_int) [libc] => execveat_(dirfd, path, argv, envp, flags);
    sys SYS_bind(fd: c_int, addr: *const sockaddr, len: socklen_t) [kernel] => bind_(addr, len);
    sys SYS_ioctl(fd: c_int, request: c_ulong) [kernel] => ioctl_(fd, request);
    sys SYS_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) [kernel] => connect_(addr, len);
    sys SYS_sendto(fd: c_int, buf: *const c_void, n: usize, flags: c_int, addr: *const sockaddr, len: socklen_t) [pass] => sendto_(addr, len);
    sys SYS_sendmsg(fd: c_int, msg: *const msghdr) [kernel] => sendmsg_(msg);
    sys SYS_sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint) [kernel] => sendmmsg_(msgs, vlen);
    sys SYS_kill(pid: pid_t, sig: c_int) [kernel] => kill_(pid, sig);
    sys SYS_tkill(tid: pid_t, sig: c_int) [kernel] => kill_(tid, sig);
    sys SYS_tgkill(tgid: pid_t, tid: pid_t, sig: c_int) [kernel] => kill_(tgid, sig);
    sys SYS_rt_sigqueueinfo(pid: pid_t, sig: c_int) [kernel] => kill_(pid, sig);
    sys SYS_rt_tgsigqueueinfo(tgid: pid_t, tid: pid_t, sig: c_int) [kernel] => kill_(tgid, sig);
    sys SYS_setuid(uid: c_uint) [libc] => set_euid(uid);
    sys SYS_setreuid(ruid: c_uint, euid: c_uint) [libc] => set_euid(euid);
    sys SYS_setresuid(ruid: c_uint, euid: c_uint) [libc] => set_euid(euid);
    sys SYS_io_uring_setup() [libc] => io_uring_();
    // Descriptors let go, directories changed, handlers installed behind libc's names: only
    // noted (a working directory's change marked under a supervisor, as `chdir`'s).
    sys SYS_close(fd: c_int) [libc] => forget(fd);
    #[cfg(target_arch = "x86_64")]
    sys SYS_dup2(old: c_int, new: c_int) [libc] => forget(new);
    sys SYS_dup3(old: c_int, new: c_int) [libc] => forget(new);
    sys SYS_close_range(first: c_uint, last: c_uint) [libc] => forget_range(first, last);
    sys SYS_chdir() [kernel] => cwd_change();
    sys SYS_fchdir() [kernel] => cwd_change();
    sys SYS_chroot() [libc] => root_change();
    sys SYS_rt_sigaction(sig: c_int, act: *const sighandler_t) [libc] => rt_sigaction_(sig, act);
}

/// The number of hooked symbols (libc functions, then the variadic execs).
pub const HOOK_COUNT: usize = LIBC_HOOK_COUNT + VARIADIC_HOOK_COUNT;

/// What [`each_hook`] calls with each hooked symbol: true to go on.
pub type Visit<'a> = dyn FnMut(&'static std::ffi::CStr, &'static Real) -> bool + 'a;

/// Calls `visit` with each hooked symbol in table order (libc functions, then the variadic
/// execs): its name and its [`Real`], until `visit` returns false.
///
/// Straight-line code, one call a row. An index looked up in a chain of `if i == k` returns
/// became, through LLVM, two lookup tables of addresses (names and `Real`s, 2 KiB): data the
/// loader relocates, and so copies, in every process, for a self-test that hardly ever runs.
/// Never inlined: inlined with a known `visit`, the calls fold into such tables again.
#[inline(never)]
pub fn each_hook(visit: &mut Visit<'_>) {
    if each_libc_hook(visit) {
        each_variadic_hook(visit);
    }
}

/// Hooked symbol `i` (in table order): its name and its [`Real`].
pub fn hook(i: usize) -> Option<(&'static std::ffi::CStr, &'static Real)> {
    let (mut k, mut found) = (0usize, None);
    each_hook(&mut |name, real| {
        if k == i {
            found = Some((name, real));
            return false;
        }
        k += 1;
        true
    });
    found
}

/// Every hooked symbol, in table order.
pub fn all() -> impl Iterator<Item = (&'static std::ffi::CStr, &'static Real)> {
    let mut rows = Vec::with_capacity(HOOK_COUNT);
    each_hook(&mut |name, real| {
        rows.push((name, real));
        true
    });
    rows.into_iter()
}
