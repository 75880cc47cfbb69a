//! Handlers of the calls that run programs (the exec family, posix_spawn, system, popen), the
//! calls after which a process can no longer be seen into (a switch to a user who cannot
//! write the store, an io_uring), and `syscall(2)` itself, which routes the numbers of the
//! table's second part to their rows.
//!
//! The bookkeeping is [`crate::exec`]'s: the audit record and the check that the new program
//! loads the shim (both left to the supervisor when one watches the process), and the
//! environment fixed so that the new program stays in the session.
//!
//! What this module cannot do: run in the `vfork` child of a posix_spawn (glibc's child calls
//! its internal execve): the spawn is journaled from the parent, with the child's pid.

use std::ffi::{CStr, c_char, c_int, c_long};

use libc::{FILE, pid_t, posix_spawn_file_actions_t, posix_spawnattr_t, uid_t};

use super::table::{self, execve, execveat, execvpe, fexecve, posix_spawn, posix_spawnp};
use super::{Account, CPath, Ret, journaled};
use crate::exec::{EnvIn, Plan, Program};
use crate::guard::{errno, set_errno};
use crate::ops;
use crate::real::Real;

type Argv = *const *const c_char;
type Spawn = *const *mut c_char;

/// Runs an exec according to its plan: refused; made by the hook itself, marked (`marked`,
/// with `env`, the caller's environment, or the fixed one); or by libc, with the caller's own
/// environment (`real`) or a fixed one (`with_env`, which calls the same real function, or its
/// envp-taking sibling). Exactly one of them runs. Only returns if the exec failed.
fn run_exec<R: Ret>(
    call: &'static str,
    mut plan: Plan,
    real: impl FnOnce(Account) -> R,
    with_env: impl FnOnce(Argv) -> c_int,
    marked: impl FnOnce(Argv) -> c_int,
    env: Argv,
) -> R {
    if let Some(errno) = plan.refuse {
        return R::refused(errno);
    }
    let r = match (plan.marked, plan.env.take()) {
        (true, None) => R::from_sys(marked(env) as c_long),
        (true, Some(block)) => R::from_sys(crate::exec::exec_with_env(block, marked) as c_long),
        (false, None) => real(Account::AsIs),
        (false, Some(block)) => R::from_sys(crate::exec::exec_with_env(block, with_env) as c_long),
    };
    let err = errno();
    crate::exec::failed(call, &plan, err);
    set_errno(err);
    r
}

/// `execve` as a marked system call (libc's result convention). Never inlined, like
/// [`marked_execveat`]: the last function a supervised exec runs before the kernel replaces
/// the image, where bench/hot_text.py's profile dumps what the exec path ran (as it does at
/// libc's `execve` without a supervisor).
#[inline(never)]
fn marked_execve(path: *const c_char, argv: Argv, env: Argv) -> c_int {
    // SAFETY: the caller's path and argv, and a null-terminated environment.
    unsafe { crate::kernel::libc_style(libc::SYS_execve, [path as usize, argv as usize, env as usize, 0, 0]) as c_int }
}

/// `execveat` as a marked system call.
#[inline(never)]
fn marked_execveat(dirfd: c_int, path: *const c_char, argv: Argv, env: Argv, flags: c_int) -> c_int {
    // SAFETY: as in marked_execve.
    unsafe {
        crate::kernel::libc_style(
            libc::SYS_execveat,
            [dirfd as usize, path as usize, argv as usize, env as usize, flags as usize],
        ) as c_int
    }
}

/// What glibc's `execvpe` does, with each exec marked: a name with a slash is run as it is;
/// any other is tried in each directory of `PATH` (`/bin:/usr/bin` when unset; an empty entry
/// is the working directory), going on past `ENOENT`, `ESTALE`, `ENOTDIR`, `ENODEV`,
/// `ETIMEDOUT` and `EACCES` (reported if nothing else was found); a file the kernel cannot
/// run (`ENOEXEC`) is run by `/bin/sh`. Names are built on the stack: this may run in a
/// `vfork` child.
fn marked_execvpe(file: CPath, argv: Argv, env: Argv) -> c_int {
    // SAFETY: the caller's file name is a NUL-terminated string (checked non-null).
    let name = unsafe { CStr::from_ptr(file.0) }.to_bytes();
    if name.is_empty() {
        set_errno(libc::ENOENT);
        return -1;
    }
    if name.contains(&b'/') {
        marked_execve(file.0, argv, env);
        if errno() == libc::ENOEXEC {
            marked_script(file.0, argv, env);
        }
        return -1;
    }
    if name.len() > libc::NAME_MAX as usize {
        set_errno(libc::ENAMETOOLONG);
        return -1;
    }
    // SAFETY: getenv returns null or a NUL-terminated string of the environment.
    let path_var = unsafe { libc::getenv(c"PATH".as_ptr()) };
    let path: &[u8] = if path_var.is_null() {
        b"/bin:/usr/bin"
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(path_var) }.to_bytes()
    };
    let mut buf = [0u8; libc::PATH_MAX as usize + 1];
    let mut eacces = false;
    for dir in path.split(|&b| b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        if dir.len() + 1 + name.len() >= buf.len() {
            continue;
        }
        // DIR/NAME and a NUL: the rest of the buffer is not read.
        let joined = dir.iter().chain(b"/").chain(name).chain(b"\0");
        for (to, from) in buf.iter_mut().zip(joined) {
            *to = *from;
        }
        let candidate = buf.as_ptr().cast::<c_char>();
        marked_execve(candidate, argv, env);
        match errno() {
            libc::ENOEXEC => {
                marked_script(candidate, argv, env);
                return -1;
            }
            libc::EACCES => eacces = true,
            libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return -1,
        }
    }
    if eacces {
        set_errno(libc::EACCES);
    }
    -1
}

/// A file the kernel would not run, run by `/bin/sh` as glibc's exec family does: `/bin/sh
/// FILE ARGS...`, with the argument array built on the stack (at most 1,024 arguments: a
/// longer one fails with `E2BIG` rather than allocate in a `vfork` child).
fn marked_script(file: *const c_char, argv: Argv, env: Argv) {
    let mut args: [*const c_char; 1026] = [std::ptr::null(); 1026];
    let [sh, script, rest @ ..] = &mut args;
    *sh = c"/bin/sh".as_ptr();
    *script = file;
    // The last entry stays null: the array's terminator.
    let usable = rest.len() - 1;
    let mut room = rest.iter_mut().take(usable);
    let mut i = 1usize;
    loop {
        // SAFETY: argv is null-terminated (exec's contract); we stop at its null.
        let a = if argv.is_null() { std::ptr::null() } else { unsafe { *argv.add(i) } };
        if a.is_null() {
            break;
        }
        let Some(slot) = room.next() else {
            set_errno(libc::E2BIG);
            return;
        };
        *slot = a;
        i += 1;
    }
    marked_execve(c"/bin/sh".as_ptr(), args.as_ptr(), env);
    set_errno(libc::ENOEXEC.max(errno()));
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

fn call_execve(path: CPath, argv: Argv, env: Argv) -> c_int {
    // SAFETY: ExecveFn is execve's C signature.
    match unsafe { real_of::<ExecveFn>(execve::NAME, &execve::REAL) } {
        // SAFETY: the caller's path and argv, with a null-terminated environment we built.
        Some(f) => unsafe { f(path.0, argv, env) },
        None => <c_int as crate::real::Missing>::missing(),
    }
}

fn call_execvpe(file: CPath, argv: Argv, env: Argv) -> c_int {
    // SAFETY: ExecveFn is also execvpe's C signature.
    match unsafe { real_of::<ExecveFn>(execvpe::NAME, &execvpe::REAL) } {
        // SAFETY: as in call_execve.
        Some(f) => unsafe { f(file.0, argv, env) },
        None => <c_int as crate::real::Missing>::missing(),
    }
}

pub fn execve_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, path: CPath, argv: Argv, envp: Argv) -> R {
    if path.0.is_null() {
        return real(Account::AsIs);
    }
    let plan = crate::exec::prepare(call, Program::Path(path), argv, EnvIn::Given(envp), true, true).1;
    run_exec(call, plan, real, |env| call_execve(path, argv, env), |env| marked_execve(path.0, argv, env), envp)
}

pub fn execv_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, path: CPath, argv: Argv) -> R {
    if path.0.is_null() {
        return real(Account::AsIs);
    }
    let plan = crate::exec::prepare(call, Program::Path(path), argv, EnvIn::Environ, true, true).1;
    let environ = crate::exec::current_environ();
    run_exec(call, plan, real, |env| call_execve(path, argv, env), |env| marked_execve(path.0, argv, env), environ)
}

pub fn execvp_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, file: CPath, argv: Argv) -> R {
    if file.0.is_null() {
        return real(Account::AsIs);
    }
    let plan = crate::exec::prepare(call, Program::Search(file), argv, EnvIn::Environ, true, true).1;
    let environ = crate::exec::current_environ();
    run_exec(call, plan, real, |env| call_execvpe(file, argv, env), |env| marked_execvpe(file, argv, env), environ)
}

pub fn execvpe_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, file: CPath, argv: Argv, envp: Argv) -> R {
    if file.0.is_null() {
        return real(Account::AsIs);
    }
    let plan = crate::exec::prepare(call, Program::Search(file), argv, EnvIn::Given(envp), true, true).1;
    run_exec(call, plan, real, |env| call_execvpe(file, argv, env), |env| marked_execvpe(file, argv, env), envp)
}

pub fn fexecve_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, fd: c_int, argv: Argv, envp: Argv) -> R {
    let plan = crate::exec::prepare(call, Program::Fd(fd), argv, EnvIn::Given(envp), true, true).1;
    let marked = |env| marked_execveat(fd, c"".as_ptr(), argv, env, libc::AT_EMPTY_PATH);
    run_exec(
        call,
        plan,
        real,
        |env| {
            type F = unsafe extern "C" fn(c_int, Argv, Argv) -> c_int;
            // SAFETY: F is fexecve's C signature.
            match unsafe { real_of::<F>(fexecve::NAME, &fexecve::REAL) } {
                // SAFETY: the caller's fd and argv, with our null-terminated environment.
                Some(f) => unsafe { f(fd, argv, env) },
                None => <c_int as crate::real::Missing>::missing(),
            }
        },
        marked,
        envp,
    )
}

pub fn execveat_<R: Ret>(
    call: &'static str,
    real: impl FnOnce(Account) -> R,
    dirfd: c_int,
    path: CPath,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> R {
    if path.0.is_null() {
        return real(Account::AsIs);
    }
    let plan = crate::exec::prepare(call, Program::At(dirfd, path, flags), argv, EnvIn::Given(envp), true, true).1;
    let marked = |env| marked_execveat(dirfd, path.0, argv, env, flags);
    run_exec(
        call,
        plan,
        real,
        |env| {
            type F = unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int;
            // SAFETY: F is execveat's C signature.
            match unsafe { real_of::<F>(execveat::NAME, &execveat::REAL) } {
                // SAFETY: the caller's arguments, with our null-terminated environment.
                Some(f) => unsafe { f(dirfd, path.0, argv, env, flags) },
                None => <c_int as crate::real::Missing>::missing(),
            }
        },
        marked,
        envp,
    )
}

type SpawnFn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const posix_spawn_file_actions_t,
    *const posix_spawnattr_t,
    Spawn,
    Spawn,
) -> c_int;

/// Before a `fork` (the fork hooks' preparation): looks up the real `execve` and
/// `execvp` if no call has yet, so that a forked child, which a shell makes only to exec,
/// finds them in the memory it inherits. Looked up in the child, each is a `dlsym` in every
/// child, walking the libraries' symbol tables on pages the fork did not map into it (a bash
/// loop of `/bin/true` paid about 10 page faults a command for it). Two relaxed loads once
/// both are known; nothing in a `vfork` child or while this thread is inside the shim.
pub fn resolve_before_fork() {
    if table::execve::REAL.resolved() && table::execvp::REAL.resolved() {
        return;
    }
    crate::state::outside_a_hook(|| {
        table::execve::REAL.addr(table::execve::NAME);
        table::execvp::REAL.addr(table::execvp::NAME);
    });
}

/// fork, `__fork`, `_Fork`, daemon and forkpty (each returns 0 in the child it made, and
/// forkpty's and daemon's children return from the call only through that): before the real
/// call, with `prepare`, the store this process's children will inherit ([`crate::before_fork`]);
/// after it, in the child, the child's own ids and a fresh start of what is per process
/// ([`crate::after_fork_in_child`]).
///
/// Done here rather than in `pthread_atfork` handlers, which every process that loads the
/// shim would pay to register (libc writes its handler pages) whether it forks or not. What
/// this cannot do: run before the fork handlers other code registered, which run inside the
/// real call. A file such a child handler changes is journaled all the same, with the parent's
/// pid (as in a child of a raw `clone` or `syscall(SYS_fork)`, which no hook sees: its records
/// carry its parent's pid, and its first datagram to a destination its parent sent to is not
/// journaled again).
pub fn fork_<R: Copy + PartialEq + Default>(_call: &'static str, real: impl FnOnce(Account) -> R, prepare: bool) -> R {
    if prepare {
        crate::before_fork();
    }
    let made = real(Account::AsIs);
    if made == R::default() {
        crate::after_fork_in_child();
    }
    made
}

/// posix_spawn and posix_spawnp: checked and fixed before, journaled after (with the child's
/// pid). They return an error number rather than setting errno.
#[allow(clippy::too_many_arguments)]
pub fn posix_spawn_(
    call: &'static str,
    real: impl FnOnce(Account) -> c_int,
    pid: *mut pid_t,
    path: CPath,
    actions: *const posix_spawn_file_actions_t,
    attr: *const posix_spawnattr_t,
    argv: Spawn,
    envp: Spawn,
    search: bool,
) -> c_int {
    if path.0.is_null() {
        return real(Account::AsIs);
    }
    let (program, sym) = if search {
        (Program::Search(path), (posix_spawnp::NAME, &posix_spawnp::REAL))
    } else {
        (Program::Path(path), (posix_spawn::NAME, &posix_spawn::REAL))
    };
    let (resolved, mut plan) =
        crate::exec::prepare(call, program, argv.cast(), EnvIn::Given(envp.cast()), false, false);
    if let Some(errno) = plan.refuse {
        return errno;
    }
    // The environment outlives the call (and the plan, which the spawn below updates).
    let env = plan.env.take();
    let spawn = || match &env {
        None => real(Account::AsIs),
        // SAFETY: SpawnFn is the C signature of both posix_spawn and posix_spawnp.
        Some(env) => match unsafe { real_of::<SpawnFn>(sym.0, sym.1) } {
            // SAFETY: the caller's arguments, with our null-terminated environment.
            Some(f) => unsafe { f(pid, path.0, actions, attr, argv, env.as_ptr().cast()) },
            None => libc::ENOSYS,
        },
    };
    // Under a supervisor, glibc's child makes the exec itself, unmarked: a spawn pass lets it
    // through without a journaling round trip, and the spawn is journaled here instead.
    let r = crate::exec::spawn_with_pass(call, &resolved, &mut plan, argv.cast(), spawn);
    if r == 0 {
        // SAFETY: on success posix_spawn stored the child's pid through the caller's pointer
        // (when it passed one).
        let child = if pid.is_null() { 0 } else { unsafe { *pid } };
        let given = path.bytes().unwrap_or_default();
        let relative = (given.first() != Some(&b'/') && (!search || given.contains(&b'/'))).then_some(given);
        crate::exec::spawned(call, relative, &resolved, &plan, argv.cast(), child as u32, !actions.is_null());
    } else {
        crate::exec::failed(call, &plan, r);
    }
    r
}

/// The argv `/bin/sh -c command` that system and popen run.
fn shell_argv(command: CPath) -> [*const c_char; 4] {
    [c"sh".as_ptr(), c"-c".as_ptr(), command.0, std::ptr::null()]
}

/// system and popen: the shell's exec is glibc's own, so a scrubbed environment cannot be
/// fixed; the plan only journals.
fn shell<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, command: CPath) -> R {
    if command.0.is_null() {
        return real(Account::AsIs); // system(NULL) asks whether a shell exists
    }
    let argv = shell_argv(command);
    let plan =
        crate::exec::prepare(call, Program::Path(CPath(c"/bin/sh".as_ptr())), argv.as_ptr(), EnvIn::Fixed, true, false)
            .1;
    if let Some(errno) = plan.refuse {
        return R::refused(errno);
    }
    let r = real(Account::AsIs);
    if !r.succeeded() {
        let err = errno();
        crate::exec::failed(call, &plan, err);
        set_errno(err);
    }
    r
}

pub fn system_(call: &'static str, real: impl FnOnce(Account) -> c_int, command: CPath) -> c_int {
    // system's -1 is its own failure to run a shell; any other value is the shell's status.
    shell(call, |a| SystemStatus(real(a)), command).0
}

pub fn popen_(call: &'static str, real: impl FnOnce(Account) -> *mut FILE, command: CPath) -> *mut FILE {
    shell(call, real, command)
}

/// system's result: -1 when it could not run a shell, else the shell's wait status (which
/// may look negative to [`Ret`] for ints).
struct SystemStatus(c_int);

impl Ret for SystemStatus {
    fn succeeded(&self) -> bool {
        self.0 != -1
    }
    fn refused(errno: c_int) -> Self {
        SystemStatus(c_int::refused(errno))
    }
    fn from_sys(r: c_long) -> Self {
        SystemStatus(r as c_int)
    }
}

/// setuid, seteuid, setreuid, setresuid: a switch to a user who cannot write the store.
pub fn set_euid<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R, euid: uid_t) -> R {
    journaled(call, CPath::NONE, |s| ops::before_uid_change(s, call, euid), real)
}

/// `syscall(SYS_io_uring_setup, ...)`: what is submitted to the ring bypasses every hook.
pub fn io_uring_<R: Ret>(call: &'static str, real: impl FnOnce(Account) -> R) -> R {
    journaled(call, CPath::NONE, |s| ops::before_io_uring(s, call), real)
}

/// `syscall(2)`: a number of the table's second part goes to its row, any other straight on.
pub fn syscall_(call: &'static str, real: impl FnOnce(Account) -> c_long, nr: c_long, a: [c_long; 6]) -> c_long {
    let _ = call;
    if !table::syscall_row(nr) {
        return real(Account::AsIs);
    }
    table::dispatch(|| real(Account::AsIs), nr, a)
}
