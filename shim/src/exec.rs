//! Exec and spawn bookkeeping: the audit record, the check that the new program will load the
//! shim, and the re-insertion of `LD_PRELOAD` and every `AETHER_*` variable into an
//! environment a caller scrubbed (`env -i`, an explicit envp, a build tool's clean env).
//!
//! # Rationale
//! These hooks may run in a `vfork` child, which shares the parent's memory (and its thread's
//! thread-local storage) but not its descriptors. So: no guard is held across the real exec;
//! the store is never *published* from here ([`crate::state::exec_store`]); and the replacement
//! environment is an allocation that, if the exec succeeds in a vfork child, stays behind in
//! the parent's heap until the parent thread's next exec hook frees it (see `LEFT_BEHIND`).
//!
//! What this module cannot do: re-insert variables for `system` and `popen`, which take no
//! environment argument; when theirs has lost the shim, the command is journaled as
//! unobserved instead.

use std::borrow::Cow;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use journal_core::BPath;
use journal_core::config::{ENV_DIR, Policy};
use journal_core::exec_check::{self, Creds};
use journal_core::internal::ExecParts;
use journal_core::record::{Op, UnobservedReason};

use crate::guard::{Guard, errno, set_errno};
use crate::hooks::CPath;
use crate::state::{Config, ExecStore, Store, config, env_value, exec_store};

unsafe extern "C" {
    static mut environ: *const *const c_char;
}

/// A replacement environment: the caller's entries plus ours, null-terminated.
pub struct EnvBlock {
    _owned: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

impl EnvBlock {
    /// The `envp` to pass on.
    pub fn as_ptr(&self) -> *const *const c_char {
        self.ptrs.as_ptr()
    }
}

/// Where the new program's environment comes from.
#[derive(Clone, Copy)]
pub enum EnvIn {
    /// An explicit `envp` (execve, execvpe, posix_spawn, ...).
    Given(*const *const c_char),
    /// The process's `environ` (execv, execvp): replaced by an explicit one if it needs fixing.
    Environ,
    /// `environ`, which cannot be replaced (system, popen).
    Fixed,
}

/// What the exec hook must do.
#[derive(Default)]
pub struct Plan {
    /// A replacement environment, when the caller's lacked ours (see [`exec_with_env`] for
    /// how an exec hands it on).
    pub env: Option<Box<EnvBlock>>,
    /// Refuse the exec with this errno (strict policy).
    pub refuse: Option<i32>,
    /// The `unobserved` record made for this exec (cancelled if the exec fails).
    pub unobserved: Option<u64>,
    /// The working directory the exec runs in (for the record posix_spawn makes afterwards).
    pub cwd: Vec<u8>,
    /// Under a supervisor: the hook journaled the exec and makes it itself, marked, so that
    /// it costs no round trip.
    pub marked: bool,
    /// Under a supervisor: a posix_spawn whose child's exec a spawn pass lets through
    /// ([`crate::kernel::SpawnPass`]), so journaled here, as without one.
    pub spawn_passed: bool,
}

/// The entries of a null-terminated array, up to its null (a runaway array without one is cut
/// at a million entries).
///
/// # Safety
/// `arr` must be null or a null-terminated array.
unsafe fn entries(arr: *const *const c_char) -> impl Iterator<Item = *const c_char> {
    let len = if arr.is_null() { 0 } else { 1_000_000 };
    // SAFETY: within a null-terminated array (caller's obligation); we stop at its null.
    (0..len).map_while(move |i| Some(unsafe { *arr.add(i) }).filter(|p| !p.is_null()))
}

/// Reads a null-terminated array of C strings.
///
/// # Safety
/// `arr` must be null or a null-terminated array of NUL-terminated strings.
pub unsafe fn c_strings<'a>(arr: *const *const c_char) -> Vec<&'a [u8]> {
    // Counted first, so that the list is one allocation: an environment of thousands of
    // entries would otherwise leave a trail of outgrown copies in the hook's arena.
    // SAFETY: forwarded obligation.
    let mut list = Vec::with_capacity(unsafe { entries(arr) }.count());
    // SAFETY: forwarded obligation; each entry is a NUL-terminated string.
    list.extend(unsafe { entries(arr) }.map(|p| unsafe { CStr::from_ptr(p) }.to_bytes()));
    list
}

/// The strings of a null-terminated array of C strings, each read as it is reached: for an
/// exec record, encoded straight from the caller's `argv` without a list of them.
///
/// # Safety
/// As for [`c_strings`].
unsafe fn c_string_iter<'a>(arr: *const *const c_char) -> impl Iterator<Item = &'a [u8]> {
    // SAFETY: forwarded obligation; each entry is a NUL-terminated string.
    unsafe { entries(arr) }.map(|p| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// The entries of a null-terminated environment that [`fix_env`] looks up: `LD_PRELOAD` and
/// the `AETHER_*` variables, in their order. Every other entry is read no further than the
/// first byte that differs from both prefixes (an environment holds kilobytes of `PATH`,
/// `LS_COLORS` and the like, which every exec measured whole before, and each lookup then
/// scanned: about 1,700 instructions an exec more, with an environment of 35 entries).
///
/// # Safety
/// `arr` must be null or a null-terminated array of NUL-terminated strings.
unsafe fn looked_up_entries<'a>(arr: *const *const c_char) -> Vec<&'a [u8]> {
    // SAFETY: forwarded obligation.
    unsafe { entries(arr) }
        // SAFETY: each entry is a NUL-terminated string (caller's obligation).
        .filter(|&p| unsafe { crate::state::has_prefix(p, b"AETHER_") || crate::state::has_prefix(p, b"LD_PRELOAD=") })
        // SAFETY: as above.
        .map(|p| unsafe { CStr::from_ptr(p) }.to_bytes())
        .collect()
}

/// [`fix_env`] for a null-terminated environment: decided on the entries it looks up alone
/// ([`looked_up_entries`]: the same values, so the same decision), and only for a changed
/// environment on all of them, which the new one copies.
///
/// # Safety
/// As for [`c_strings`].
unsafe fn fix_env_of(cfg: &Config, envp: *const *const c_char) -> EnvFix {
    // SAFETY: forwarded obligation.
    match fix_env(cfg, &unsafe { looked_up_entries(envp) }) {
        // SAFETY: forwarded obligation.
        EnvFix::Changed(_) => fix_env(cfg, &unsafe { c_strings(envp) }),
        decided => decided,
    }
}

enum EnvFix {
    Unchanged,
    /// The caller set `AETHER_JOURNAL=off` for the child on purpose.
    Disabled,
    /// `aether-journal` re-executing itself outside the shim (`AETHER_JOURNAL_NESTED=1`).
    Nested,
    Changed(Vec<Vec<u8>>),
}

/// Decides what the child's environment lacks: our library in `LD_PRELOAD`, and each of our
/// `AETHER_*` variables (present, non-empty ones are never overridden: a nested session keeps
/// its own).
fn fix_env(cfg: &Config, entries: &[&[u8]]) -> EnvFix {
    let value_of = |name: &[u8]| entries.iter().find_map(|e| env_value(e, name));
    if value_of(b"AETHER_JOURNAL") == Some(b"off") {
        return if value_of(journal_core::config::ENV_NESTED.as_bytes()) == Some(b"1") {
            EnvFix::Nested
        } else {
            EnvFix::Disabled
        };
    }
    let mut add: Vec<Vec<u8>> = Vec::new();
    let preload = value_of(b"LD_PRELOAD");
    // Nearly always the shim alone (what `run` and this function set): one comparison, not a
    // split byte by byte.
    let shim = cfg.shim_path.as_slice();
    let has_shim = preload.is_some_and(|p| p == shim || p.split(|&b| b == b':' || b == b' ').any(|e| e == shim));
    let mut replace_preload = None;
    if !has_shim && !cfg.shim_path.is_empty() {
        let mut v = b"LD_PRELOAD=".to_vec();
        v.extend_from_slice(&cfg.shim_path);
        if let Some(old) = preload.filter(|p| !p.is_empty()) {
            v.push(b':');
            v.extend_from_slice(old);
        }
        replace_preload = Some(v);
    }
    // An empty value counts as missing, and so does a relative session directory: both can
    // only be what this process started with, handed on by a shell (bash keeps its own copy
    // of the environment, which the shim's constructor cannot update) instead of the absolute
    // directory the shim resolved.
    let stale = |name: &[u8], v: &[u8]| v.is_empty() || (name == ENV_DIR.as_bytes() && v.first() != Some(&b'/'));
    let mut replaced: Vec<&[u8]> = Vec::new();
    for var in &cfg.exec_env {
        let name = var.split(|&b| b == b'=').next().unwrap_or_default();
        match value_of(name) {
            None => add.push(var.clone()),
            Some(v) if stale(name, v) && env_value(var, name) != Some(v) => {
                replaced.push(name);
                add.push(var.clone());
            }
            Some(_) => {}
        }
    }
    if replace_preload.is_none() && add.is_empty() {
        return EnvFix::Unchanged;
    }
    let is_replaced = |e: &[u8]| replaced.iter().any(|n| env_value(e, n).is_some());
    let mut out: Vec<Vec<u8>> = entries
        .iter()
        .filter(|e| replace_preload.is_none() || !e.starts_with(b"LD_PRELOAD="))
        .filter(|e| !is_replaced(e))
        .map(|e| e.to_vec())
        .collect();
    out.extend(replace_preload);
    out.extend(add);
    EnvFix::Changed(out)
}

/// Builds the replacement environment. Called in a [`crate::alloc::persistent`] scope, and
/// every byte of it is copied there: `CString::new` of an entry built in the hook's arena
/// would keep that arena buffer, which in a `vfork` child whose exec succeeds stays live in
/// the parent's arena for good (and the arena never starts over again).
fn env_block(entries: Vec<Vec<u8>>) -> EnvBlock {
    let owned: Vec<CString> = entries.iter().filter_map(|e| CString::new(e.as_slice()).ok()).collect();
    let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    EnvBlock { _owned: owned, ptrs }
}

pub fn current_environ() -> *const *const c_char {
    // SAFETY: reading the address stored in libc's `environ`; we never write it.
    unsafe { std::ptr::addr_of!(environ).read() }
}

/// The program an exec will run, as the record names it (resolved under the guard, in
/// [`prepare`]).
pub enum Program {
    /// A path (absolute, or relative to the cwd).
    Path(CPath),
    /// A name searched in `PATH` like `execvp`.
    Search(CPath),
    /// The file open as this descriptor (fexecve).
    Fd(libc::c_int),
    /// A path relative to a directory descriptor, with execveat's flags (`AT_EMPTY_PATH` and
    /// an empty path: the descriptor itself).
    At(libc::c_int, CPath, libc::c_int),
}

fn resolve_program(p: Program, cwd: &[u8]) -> Vec<u8> {
    let fd_path =
        |fd| journal_core::resolve::fd_path(fd).unwrap_or_else(|_| format!("/proc/self/fd/{fd}").into_bytes());
    match p {
        Program::Path(path) => {
            let path = path.bytes().unwrap_or_default();
            if path.first() == Some(&b'/') { path.to_vec() } else { journal_core::bpath::join(cwd, path) }
        }
        Program::Search(file) => {
            // SAFETY: getenv reads the environment without taking any lock.
            let path_var = unsafe { libc::getenv(c"PATH".as_ptr()) };
            let path_var = (!path_var.is_null()).then(|| {
                // SAFETY: getenv returned a NUL-terminated string.
                unsafe { CStr::from_ptr(path_var) }.to_bytes()
            });
            let found = exec_check::search_path(file.bytes().unwrap_or_default(), path_var);
            if found.first() == Some(&b'/') { found } else { journal_core::bpath::join(cwd, &found) }
        }
        Program::Fd(fd) => fd_path(fd),
        Program::At(dirfd, path, flags) => {
            let p = path.bytes().unwrap_or_default();
            if p.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
                fd_path(dirfd)
            } else if p.first() == Some(&b'/') || dirfd == libc::AT_FDCWD {
                journal_core::bpath::join(cwd, p)
            } else {
                journal_core::bpath::join(&fd_path(dirfd), p)
            }
        }
    }
}

/// Runs `f` under the guard and `catch_unwind`, with errno preserved; `None` when this thread
/// is already inside the shim or `f` panicked.
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let Some(guard) = Guard::enter() else {
        if !crate::alloc::in_persistent() {
            crate::state::note_unjournaled();
        }
        return None;
    };
    let saved = errno();
    let out = catch_unwind(AssertUnwindSafe(f)).ok();
    drop(guard);
    set_errno(saved);
    out
}

/// Prepares an exec: journals it (unless `record_exec` is false: posix_spawn journals after
/// the call, with the child's pid), checks that the new program will load the shim, and fixes
/// its environment. Returns the resolved program path (empty when the shim is switched off)
/// with the plan.
pub fn prepare(
    call: &str,
    program: Program,
    argv: *const *const c_char,
    env: EnvIn,
    record_exec: bool,
    marks: bool,
) -> (Vec<u8>, Plan) {
    free_left_behind();
    guarded(|| {
        let cfg = config();
        // Switched off (`AETHER_JOURNAL=off`), an exec is only passed on: nothing uses the
        // program's name, so no `getcwd` is made for it.
        if !cfg.enabled {
            return (Vec::new(), Plan::default());
        }
        let cwd = journal_core::resolve::getcwd().unwrap_or_default();
        let program = resolve_program(program, &cwd);
        let mut plan = Plan::default();
        if cfg.supervised {
            // The supervisor sees into every program of its architecture: the environment is
            // fixed so that the new program's own libc calls are journaled in-process, and an
            // exec the hook makes itself (`marks`) is journaled here and marked. posix_spawn's
            // child's is let through by a spawn pass and journaled after the call
            // ([`spawn_with_pass`]); system's shell's reaches the supervisor, which journals it.
            plan.env = fixed_env(cfg, env).map(|new| crate::alloc::persistent(|| Box::new(env_block(new))));
            if !marks {
                if !record_exec {
                    plan.cwd = cwd;
                }
                return (program, plan);
            }
            let Some(store) = exec_store() else { return (program, plan) };
            // SAFETY: exec's contract: argv is a null-terminated array of C strings.
            let argv = unsafe { c_string_iter(argv) };
            store.record_exec_fresh(call, ExecParts { program: &program, argv, cwd: &cwd, child: None });
            check_architecture(&store, call, &program, &mut plan);
            store.counters.note_exec();
            plan.marked = true;
            return (program, plan);
        }
        if !record_exec {
            plan.cwd = cwd.clone();
        }
        let Some(store) = exec_store() else { return (program, plan) };
        // A store that went read-only cannot be joined by the new program. No separate check
        // is needed: the exec record (here, or after posix_spawn) fails to be written, and a
        // record that cannot be written is counted as lost.
        if record_exec {
            // SAFETY: exec's contract: argv is a null-terminated array of C strings.
            let argv = unsafe { c_string_iter(argv) };
            store.record_exec_fresh(call, ExecParts { program: &program, argv, cwd: &cwd, child: None });
        }
        // Read only for a check the memo does not spare, or a nested session's record.
        // SAFETY: exec's contract: argv is a null-terminated array of C strings.
        let argv_now = || unsafe { c_strings(argv) };
        // A program this process checked before and that has not changed since is observable
        // without reading it again (crate::execmemo).
        let mut reason = if crate::execmemo::still_vouched(&program, &store.counters) {
            None
        } else {
            let (verdict, vouched) = exec_check::check_exec_vouched(&program, &argv_now(), Creds::current());
            if let Some(v) = vouched {
                // For the session always; in this process's own table where its memory
                // outlives the exec: a spawning parent's, a `vfork` child's (its parent's). A
                // process's own exec replaces its memory: writing there would only cost a
                // forked shell's child the pages' copies. (`owns_memory` is a `getpid`.)
                let own = !(record_exec && marks && crate::state::owns_memory());
                crate::execmemo::remember(&program, &v, own, &store.counters);
            }
            verdict.err()
        };
        let envp = match env {
            EnvIn::Given(e) => e,
            EnvIn::Environ | EnvIn::Fixed => current_environ(),
        };
        // SAFETY: an envp (or environ) is a null-terminated array of C strings.
        match unsafe { fix_env_of(cfg, envp) } {
            EnvFix::Unchanged => {}
            EnvFix::Disabled => reason = reason.or(Some(UnobservedReason::ShimDisabled)),
            EnvFix::Nested => reason = reason.or(Some(nested_session(&argv_now(), &cwd))),
            EnvFix::Changed(_) if matches!(env, EnvIn::Fixed) => {
                reason = reason.or(Some(UnobservedReason::ShimNotLoaded {
                    why: format!("{call}() runs its command with an environment that lost LD_PRELOAD"),
                }));
            }
            // The environment outlives this guarded scope (it is used by the real exec).
            EnvFix::Changed(new) => plan.env = Some(crate::alloc::persistent(|| Box::new(env_block(new)))),
        }
        if let Some(reason) = reason {
            let program = BPath::new(program.clone());
            if store.settings.policy == Policy::Strict && !matches!(reason, UnobservedReason::ShimDisabled) {
                let what = format!("exec of {}: {reason}", program.display_lossy());
                store.record_fresh(call, Op::Refused { what: what.into(), errno: libc::EPERM });
                plan.refuse = Some(libc::EPERM);
            } else {
                plan.unobserved = Some(store.record_fresh(call, Op::Unobserved { program, reason: Box::new(reason) }));
            }
        }
        (program, plan)
    })
    .unwrap_or_default()
}

/// What a nested `aether-journal` command line is: its subcommand, and the session directory
/// it names (`--journal DIR` or `--journal=DIR`, made absolute against `cwd`).
fn nested_session(argv: &[&[u8]], cwd: &[u8]) -> UnobservedReason {
    let sub = argv.iter().skip(1).find(|a| !a.starts_with(b"-")).copied().unwrap_or_default();
    let mut dir = None;
    for (i, a) in argv.iter().enumerate() {
        if *a == b"--" {
            break;
        }
        if *a == b"--journal" {
            dir = argv.get(i + 1).copied();
        } else if let Some(v) = a.strip_prefix(b"--journal=") {
            dir = Some(v);
        }
    }
    let dir = dir.map(|d| {
        if d.starts_with(b"/") { BPath::new(d.to_vec()) } else { BPath::new(journal_core::bpath::join(cwd, d)) }
    });
    UnobservedReason::NestedSession { subcommand: String::from_utf8_lossy(sub).into_owned(), dir }
}

/// The replacement environment an exec of this thread is running with (or, once that exec
/// succeeded in a `vfork` child, ran with). A `vfork` child runs on its parent thread's memory,
/// this slot included, and never returns from a successful exec to free the block it allocated
/// in the parent's heap: the parent thread frees it on its next exec hook, by when the child
/// has exec'd or exited. Without this, a harness passing a clean `env=` to Python's
/// `subprocess` lost about 1 KiB per command. In the thread's state (`thread.rs`): safe in a
/// signal handler and during thread exit.
static LEFT_BEHIND: crate::thread::Local<*mut EnvBlock> = crate::thread::Local::new(|t| &t.left_behind);

/// Frees the environment block a `vfork` child of this thread left behind, if any. With the
/// system allocator: in an exec hook that runs in a signal handler, this joins the `malloc`
/// that building a replacement environment already makes there (README, Reliability).
fn free_left_behind() {
    let p = LEFT_BEHIND.with(|c| c.replace(std::ptr::null_mut()));
    if !p.is_null() {
        // SAFETY: only exec_with_env stores here, a pointer from Box::into_raw that nothing
        // else frees; the exec that used it has replaced the child's image or returned (and
        // then taken it back), since this thread runs again.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Runs `exec` with `block`'s environment, parking the block in [`LEFT_BEHIND`] meanwhile: an
/// exec that returns (it failed) frees it here; one that succeeds in a `vfork` child leaves it
/// to the parent thread's next exec hook.
pub fn exec_with_env(block: Box<EnvBlock>, exec: impl FnOnce(*const *const c_char) -> libc::c_int) -> libc::c_int {
    let env = block.as_ptr();
    let raw = Box::into_raw(block);
    LEFT_BEHIND.with(|c| c.set(raw));
    let r = exec(env);
    let err = errno();
    let mine = LEFT_BEHIND.with(|c| c.replace(std::ptr::null_mut())) == raw;
    if mine {
        // SAFETY: `raw` came from Box::into_raw above, and the slot still held it: nothing
        // freed it meanwhile.
        drop(unsafe { Box::from_raw(raw) });
    }
    set_errno(err);
    r
}

/// After an exec (or spawn) failed: nothing ran unobserved after all.
pub fn failed(call: &str, plan: &Plan, err: i32) {
    if let Some(seq) = plan.unobserved {
        guarded(|| {
            if let Some(store) = exec_store() {
                store.record_fresh(call, Op::CallFailed { of_seq: seq, errno: err });
            }
        });
    }
}

/// The replacement environment an exec needs under a supervisor, if any (`system` and
/// `popen` take none).
fn fixed_env(cfg: &Config, env: EnvIn) -> Option<Vec<Vec<u8>>> {
    let envp = match env {
        EnvIn::Given(e) => e,
        EnvIn::Environ => current_environ(),
        EnvIn::Fixed => return None,
    };
    // SAFETY: an envp (or environ) is a null-terminated array of C strings.
    match unsafe { fix_env_of(cfg, envp) } {
        EnvFix::Changed(new) => Some(new),
        EnvFix::Unchanged | EnvFix::Disabled | EnvFix::Nested => None,
    }
}

/// Under a supervisor, which sees into every program of its architecture: a program of
/// another one is refused under the strict policy (`plan.refuse`), else journaled as
/// unobserved (`plan.unobserved`).
fn check_architecture(store: &Store, call: &str, program: &[u8], plan: &mut Plan) {
    if let Some(reason) = exec_check::foreign_architecture(program) {
        let program = BPath::from(program);
        if store.settings.policy == Policy::Strict {
            let what = format!("exec of {}: {reason}", program.display_lossy());
            store.record_fresh(call, Op::Refused { what: what.into(), errno: libc::EPERM });
            plan.refuse = Some(libc::EPERM);
        } else {
            plan.unobserved = Some(store.record_fresh(call, Op::Unobserved { program, reason: Box::new(reason) }));
        }
    }
}

/// Runs `spawn` (the real posix_spawn) and returns its result; under a supervisor, with a
/// spawn pass for the child's exec ([`crate::kernel::SpawnPass`]) when one can be had. Then
/// what the supervisor would have checked of that exec is checked here first (a program of
/// another architecture: refused under the strict policy, else journaled as unobserved), and
/// the plan marked for [`spawned`] to journal the spawn.
pub fn spawn_with_pass(
    call: &str,
    program: &[u8],
    plan: &mut Plan,
    argv: *const *const c_char,
    spawn: impl FnOnce() -> libc::c_int,
) -> libc::c_int {
    if !config().supervised || crate::kernel::mark() == 0 {
        return spawn();
    }
    let pass = guarded(|| match exec_store() {
        Some(ExecStore::Shared(store)) => {
            crate::kernel::SpawnPass::claim(&store.counters, argv.cast()).map(|p| (p, store))
        }
        _ => None,
    })
    .flatten();
    let Some((pass, store)) = pass else { return spawn() };
    let checked = guarded(|| check_architecture(store, call, program, plan));
    if checked.is_none() {
        // Not checked (this thread was inside the shim already): the supervisor checks it.
        drop(pass);
        return spawn();
    }
    if let Some(errno) = plan.refuse {
        return errno;
    }
    plan.spawn_passed = true;
    let r = spawn();
    drop(pass);
    r
}

/// After posix_spawn succeeded: the audit record, with the child's pid (under a supervisor
/// only when a spawn pass let the child's exec through, see [`spawn_with_pass`]). When the
/// spawn had file actions (`actions`: one may change the child's directory), the working
/// directory is the one the child ran in, read from `/proc` (this process's own, should the
/// child have ended already), and `relative`, the caller's program name when it was resolved
/// against the working directory, is resolved against that one.
pub fn spawned(
    call: &str,
    relative: Option<&[u8]>,
    program: &[u8],
    plan: &Plan,
    argv: *const *const c_char,
    child: u32,
    actions: bool,
) {
    guarded(|| {
        if !config().enabled || (config().supervised && !plan.spawn_passed) {
            return;
        }
        if let Some(store) = exec_store() {
            let mut cwd = Cow::Borrowed(plan.cwd.as_slice());
            let mut program = Cow::Borrowed(program);
            if actions {
                let link = format!("/proc/{child}/cwd");
                if let Ok(there) = rustix::fs::readlink(link.as_str(), Vec::new()) {
                    let there = there.into_bytes();
                    if let Some(rel) = relative.filter(|_| there != *cwd) {
                        program = Cow::Owned(journal_core::bpath::join(&there, rel));
                    }
                    cwd = Cow::Owned(there);
                }
            }
            // SAFETY: posix_spawn's contract: argv is a null-terminated array of C strings.
            let argv = unsafe { c_string_iter(argv) };
            store.record_exec_fresh(call, ExecParts { program: &program, argv, cwd: &cwd, child: Some(child) });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal_core::config::Settings;

    fn cfg() -> Config {
        Config {
            enabled: true,
            session_dir: b"/s".to_vec(),
            settings: Settings::from_lookup(|_| None).0,
            shim_path: b"/lib/libaether_journal.so".to_vec(),
            exec_env: vec![b"AETHER_JOURNAL_DIR=/s".to_vec(), b"AETHER_JOURNAL_MAX_FILE=1K".to_vec()],
            test_fault: None,
            supervised: false,
            session_id: None,
        }
    }

    #[test]
    fn a_scrubbed_environment_gets_the_preload_and_every_aether_variable_back() {
        let EnvFix::Changed(env) = fix_env(&cfg(), &[b"PATH=/bin"]) else { panic!() };
        assert!(env.contains(&b"PATH=/bin".to_vec()));
        assert!(env.contains(&b"LD_PRELOAD=/lib/libaether_journal.so".to_vec()));
        assert!(env.contains(&b"AETHER_JOURNAL_DIR=/s".to_vec()));
        assert!(env.contains(&b"AETHER_JOURNAL_MAX_FILE=1K".to_vec()));
    }

    #[test]
    fn an_existing_preload_is_kept_after_ours_and_present_variables_are_not_overridden() {
        let EnvFix::Changed(env) = fix_env(&cfg(), &[b"LD_PRELOAD=/other.so", b"AETHER_JOURNAL_DIR=/nested"]) else {
            panic!()
        };
        assert!(env.contains(&b"LD_PRELOAD=/lib/libaether_journal.so:/other.so".to_vec()));
        assert!(env.contains(&b"AETHER_JOURNAL_DIR=/nested".to_vec()));
        assert!(!env.contains(&b"AETHER_JOURNAL_DIR=/s".to_vec()));
    }

    #[test]
    fn an_empty_session_variable_is_replaced_not_kept_beside_ours() {
        let EnvFix::Changed(env) = fix_env(&cfg(), &[b"LD_PRELOAD=/lib/libaether_journal.so", b"AETHER_JOURNAL_DIR="])
        else {
            panic!()
        };
        assert!(env.contains(&b"AETHER_JOURNAL_DIR=/s".to_vec()));
        assert!(!env.contains(&b"AETHER_JOURNAL_DIR=".to_vec()));
    }

    #[test]
    fn a_relative_session_directory_is_replaced_by_the_resolved_one() {
        let EnvFix::Changed(env) =
            fix_env(&cfg(), &[b"LD_PRELOAD=/lib/libaether_journal.so", b"AETHER_JOURNAL_DIR=../s"])
        else {
            panic!()
        };
        assert!(env.contains(&b"AETHER_JOURNAL_DIR=/s".to_vec()));
        assert!(!env.contains(&b"AETHER_JOURNAL_DIR=../s".to_vec()));
    }

    /// A null-terminated environment of `entries`, with the strings it points into.
    fn c_env(entries: &[&[u8]]) -> (Vec<CString>, Vec<*const c_char>) {
        let owned: Vec<CString> = entries.iter().map(|e| CString::new(*e).expect("no NUL")).collect();
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        (owned, ptrs)
    }

    /// What a decision says, comparable (EnvFix holds no PartialEq).
    fn said(fix: EnvFix) -> (&'static str, Vec<Vec<u8>>) {
        match fix {
            EnvFix::Unchanged => ("unchanged", Vec::new()),
            EnvFix::Disabled => ("disabled", Vec::new()),
            EnvFix::Nested => ("nested", Vec::new()),
            EnvFix::Changed(env) => ("changed", env),
        }
    }

    #[test]
    fn an_environment_decided_on_its_preload_and_aether_entries_alone_is_decided_as_on_all_of_them() {
        let long = [b"LS_COLORS=".as_slice(), &[b'x'; 4096]].concat();
        let environments: [&[&[u8]]; 7] = [
            &[b"PATH=/bin", &long, b"LD_PRELOADX=/no.so", b"AETHER=1", b"HOME=/root"],
            &[
                b"PATH=/bin",
                b"LD_PRELOAD=/lib/libaether_journal.so",
                b"AETHER_JOURNAL_DIR=/x",
                b"AETHER_JOURNAL_MAX_FILE=9",
            ],
            &[b"LD_PRELOAD=/other.so", &long, b"AETHER_JOURNAL_DIR=/nested", b"LANG=C"],
            &[b"A=1", b"AETHER_JOURNAL_DIR=", b"LD_PRELOAD=/lib/libaether_journal.so", b"L=2"],
            &[b"AETHER_JOURNAL=off", b"PATH=/bin"],
            &[b"AETHER_JOURNAL=off", b"AETHER_JOURNAL_NESTED=1"],
            &[],
        ];
        for entries in environments {
            let (_owned, envp) = c_env(entries);
            // SAFETY: a null-terminated array of the NUL-terminated strings `_owned` holds.
            let filtered = said(unsafe { fix_env_of(&cfg(), envp.as_ptr()) });
            assert_eq!(filtered, said(fix_env(&cfg(), entries)), "for {entries:?}");
        }
        let (_owned, envp) =
            c_env(&[b"PATH=/bin", b"LD_PRELOAD=/a.so", &long, b"LD_PRELOADX=1", b"AETHER_X=1", b"AETHER=2"]);
        // SAFETY: as above.
        let looked_up = unsafe { looked_up_entries(envp.as_ptr()) };
        assert_eq!(
            looked_up,
            [b"LD_PRELOAD=/a.so".as_slice(), b"AETHER_X=1"],
            "only the preload and AETHER_ entries, in order"
        );
        let (_owned, envp) = c_env(&[b"PATH=/bin", &long]);
        // SAFETY: as above.
        let (kind, env) = said(unsafe { fix_env_of(&cfg(), envp.as_ptr()) });
        assert_eq!(kind, "changed");
        assert!(env.contains(&long) && env.contains(&b"PATH=/bin".to_vec()), "a changed environment keeps every entry");
    }

    #[test]
    fn a_complete_environment_is_left_alone_and_an_explicit_off_is_respected() {
        let full: [&[u8]; 3] =
            [b"LD_PRELOAD=/lib/libaether_journal.so", b"AETHER_JOURNAL_DIR=/x", b"AETHER_JOURNAL_MAX_FILE=9"];
        assert!(matches!(fix_env(&cfg(), &full), EnvFix::Unchanged));
        assert!(matches!(fix_env(&cfg(), &[b"AETHER_JOURNAL=off"]), EnvFix::Disabled));
    }
}
