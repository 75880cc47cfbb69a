//! The system calls the shim makes itself, marked so that a supervisor's filter lets them
//! through, and the *passes* that tell the supervisor a libc function's own unmarked calls are
//! already journaled.
//!
//! Under `aether-journal run` every process of the session runs under a seccomp filter whose
//! supervisor journals file-changing system calls that nothing else journaled (Go, static
//! binaries, raw `syscall` instructions). A call the shim has already journaled must not cost a
//! second journal entry, nor a round trip to the supervisor. So:
//!
//! - **Marked calls.** The shim makes such a call itself, as a raw system call carrying the
//!   session's marker ([`mark`], from `AETHER_JOURNAL_MARK`) in the sixth argument register,
//!   which no call the filter watches uses (`sendto`, the one six-argument call among them, is
//!   never marked). The filter allows any watched call that carries the marker. This is how a
//!   hook's real call is made for the thin wrappers (`openat`, `unlinkat`, `renameat`, ...:
//!   their `kernel` column in the hook table), and how the shim's own changes to the store and
//!   the tree (blob links, copies, segments, a file moved aside) are made ([`Marked`]).
//! - **Passes.** A libc function whose system calls the shim cannot make itself (`fopen`,
//!   `mkstemp`, `posix_fallocate`, ...: the `pass` column) is called with a pass: the thread's
//!   id and the address of a thread-local cookie in the session's `counters` page. The
//!   supervisor lets a call through when the calling thread holds a pass and the cookie at that
//!   address, read from the thread's own memory, is the one the marker gives this thread id. A
//!   pass left behind by a killed process is never honoured for another: its memory is gone.
//!
//! Without a supervisor ([`mark`] is 0) nothing here is used: hooks call libc exactly as the
//! program would have.
//!
//! What this module cannot do: make a marked call a pthread cancellation point. A thread
//! cancelled while blocked in a marked `open` of a FIFO, `connect` or `sendmsg` is cancelled
//! when the call returns, not during it (README, "What this cannot do"). Nor does it keep the
//! marker from a program that reads its own environment and wants to hide its calls from the
//! supervisor: the marker is a convention between cooperating parts, not a secret.

use std::ffi::{CStr, c_char, c_long};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use journal_core::capture::FsCalls;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, XattrFlags};
use rustix::io::Errno;

/// The session's marker, or 0 when no supervisor watches this process. Written by every
/// process of a supervised session while starting: in the start-up data (`shim/startup.ld`).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.startup"))]
static MARK: AtomicU64 = AtomicU64::new(0);

/// The marker every journaled call carries (0: no supervisor, so nothing is marked).
#[inline(always)]
pub fn mark() -> u64 {
    MARK.load(Ordering::Relaxed)
}

/// Sets the marker from the value of `AETHER_JOURNAL_MARK` (16 hex digits; anything else, or
/// 0, means no supervisor).
pub fn set_mark_from(value: &[u8]) {
    let parsed = std::str::from_utf8(value).ok().and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0);
    MARK.store(parsed, Ordering::Relaxed);
}

/// The raw system call `nr` with arguments `a`, carrying `mark` in the sixth argument register.
/// Returns what the kernel returned: a value, or minus an error number.
///
/// # Safety
/// The arguments must be valid for system call `nr` (pointers to what it reads and writes).
#[inline(always)]
pub unsafe fn raw(nr: c_long, a: [usize; 5], mark: u64) -> isize {
    #[cfg(target_arch = "x86_64")]
    {
        let ret: isize;
        // SAFETY: the x86-64 system call convention: number in rax, arguments in rdi, rsi, rdx,
        // r10, r8, r9; the kernel clobbers rcx and r11 and returns in rax. The caller vouches
        // for the arguments. r9 is cleared right after: the kernel leaves it as it was, and a
        // libc wrapper the program calls next (four arguments: it never sets r9) would
        // otherwise carry the marker into a call the shim did not journal.
        unsafe {
            core::arch::asm!(
                "syscall",
                "xor r9d, r9d",
                inlateout("rax") nr as isize => ret,
                in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4],
                inlateout("r9") mark => _,
                lateout("rcx") _, lateout("r11") _,
                options(nostack)
            );
        }
        ret
    }
    #[cfg(target_arch = "aarch64")]
    {
        let ret: isize;
        // SAFETY: the AArch64 system call convention: number in x8, arguments in x0-x5, result
        // in x0. The caller vouches for the arguments. x5 is cleared right after, for the
        // reason given for r9 above.
        unsafe {
            core::arch::asm!(
                "svc 0",
                "mov x5, xzr",
                in("x8") nr,
                inlateout("x0") a[0] as isize => ret,
                in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4],
                inlateout("x5") mark => _,
                options(nostack)
            );
        }
        ret
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        // glibc's syscall() passes all six arguments in registers on every architecture.
        // SAFETY: as above.
        let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], mark) } as isize;
        if r == -1 { -(crate::guard::errno() as isize) } else { r }
    }
}

/// The wall-clock time for a record, asked of the kernel by a system call rather than read
/// through the vDSO as libc's `clock_gettime` does. A shell's forked child, whose page tables
/// hold none of the parent's code, would otherwise fault in libc's `clock_gettime` and the
/// vDSO for the exec's record alone: two page faults, 2-3 us each on the development machine,
/// against about 0.1 us for the call. Falls back on libc's if the call fails.
pub fn wall_clock() -> std::time::SystemTime {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, at the address of `ts`, which lives for the
    // call. Not a watched call: no marker.
    let r = unsafe { raw(libc::SYS_clock_gettime, [libc::CLOCK_REALTIME as usize, &raw mut ts as usize, 0, 0, 0], 0) };
    match (u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec)) {
        (Ok(s), Ok(ns)) if r == 0 && ns < 1_000_000_000 => std::time::UNIX_EPOCH + std::time::Duration::new(s, ns),
        _ => std::time::SystemTime::now(),
    }
}

/// [`raw`], with the libc convention for the result: -1 and errno on failure.
///
/// # Safety
/// As for [`raw`].
#[inline(always)]
pub unsafe fn libc_style(nr: c_long, a: [usize; 5]) -> c_long {
    // SAFETY: forwarded obligation.
    let r = unsafe { raw(nr, a, mark()) };
    if (-4095..0).contains(&r) {
        crate::guard::set_errno(-r as i32);
        -1
    } else {
        r as c_long
    }
}

/// [`raw`] as rustix reports results.
///
/// # Safety
/// As for [`raw`].
unsafe fn checked(nr: c_long, a: [usize; 5]) -> Result<usize, Errno> {
    // SAFETY: forwarded obligation.
    let r = unsafe { raw(nr, a, mark()) };
    if (-4095..0).contains(&r) { Err(Errno::from_raw_os_error(-r as i32)) } else { Ok(r as usize) }
}

fn fd(f: BorrowedFd<'_>) -> usize {
    f.as_raw_fd() as usize
}

fn ptr(s: &CStr) -> usize {
    s.as_ptr() as usize
}

/// The store and tree changes the shim makes itself, as marked system calls: what the core
/// library's captures ([`journal_core::capture::Capturer`]) and the shim's own store use, so that a
/// supervisor never journals the shim's own work as the program's.
pub struct Marked;

impl FsCalls for Marked {
    fn open_dir_no_symlinks(&self, dir: BorrowedFd<'_>, path: &CStr) -> Result<OwnedFd, Errno> {
        openat2_no_symlinks(dir, path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC)
    }

    fn openat(&self, dir: BorrowedFd<'_>, path: &CStr, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        // SAFETY: a NUL-terminated path, a descriptor the caller holds, plain flags.
        let r =
            unsafe { checked(libc::SYS_openat, [fd(dir), ptr(path), flags.bits() as usize, mode.bits() as usize, 0]) }?;
        // SAFETY: openat returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }

    fn linkat(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &CStr,
        new_dir: BorrowedFd<'_>,
        new: &CStr,
        flags: AtFlags,
    ) -> Result<(), Errno> {
        // SAFETY: NUL-terminated paths and descriptors the caller holds.
        unsafe { checked(libc::SYS_linkat, [fd(old_dir), ptr(old), fd(new_dir), ptr(new), flags.bits() as usize]) }
            .map(drop)
    }

    fn unlinkat(&self, dir: BorrowedFd<'_>, path: &CStr, flags: AtFlags) -> Result<(), Errno> {
        // SAFETY: a NUL-terminated path and a descriptor the caller holds.
        unsafe { checked(libc::SYS_unlinkat, [fd(dir), ptr(path), flags.bits() as usize, 0, 0]) }.map(drop)
    }

    fn mkdirat(&self, dir: BorrowedFd<'_>, path: &CStr, mode: Mode) -> Result<(), Errno> {
        // SAFETY: as for unlinkat.
        unsafe { checked(libc::SYS_mkdirat, [fd(dir), ptr(path), mode.bits() as usize, 0, 0]) }.map(drop)
    }

    fn renameat(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &CStr,
        new_dir: BorrowedFd<'_>,
        new: &CStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        // SAFETY: NUL-terminated paths and descriptors the caller holds.
        unsafe { checked(libc::SYS_renameat2, [fd(old_dir), ptr(old), fd(new_dir), ptr(new), flags.bits() as usize]) }
            .map(drop)
    }

    fn fchmod(&self, f: BorrowedFd<'_>, mode: Mode) -> Result<(), Errno> {
        // SAFETY: a descriptor the caller holds.
        unsafe { checked(libc::SYS_fchmod, [fd(f), mode.bits() as usize, 0, 0, 0]) }.map(drop)
    }

    fn fchown(&self, f: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<(), Errno> {
        // SAFETY: a descriptor the caller holds.
        unsafe { checked(libc::SYS_fchown, [fd(f), uid as usize, gid as usize, 0, 0]) }.map(drop)
    }

    fn fsetxattr(&self, f: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: XattrFlags) -> Result<(), Errno> {
        // SAFETY: a NUL-terminated name, `value.len()` readable bytes, a descriptor the caller
        // holds.
        unsafe {
            checked(
                libc::SYS_fsetxattr,
                [fd(f), ptr(name), value.as_ptr() as usize, value.len(), flags.bits() as usize],
            )
        }
        .map(drop)
    }

    fn fremovexattr(&self, f: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        // SAFETY: a NUL-terminated name and a descriptor the caller holds.
        unsafe { checked(libc::SYS_fremovexattr, [fd(f), ptr(name), 0, 0, 0]) }.map(drop)
    }

    fn fallocate(&self, f: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
        // SAFETY: a descriptor the caller holds.
        unsafe { checked(libc::SYS_fallocate, [fd(f), 0, offset as usize, len as usize, 0]) }.map(drop)
    }
}

// ----- passes -----

/// The cookie of this thread's pass while it holds one, else 0. Its address is what the pass
/// publishes: in the thread's state (`thread.rs`), at one address for the thread's whole life.
static COOKIE: crate::thread::Local<u64> = crate::thread::Local::new(|t| &t.cookie);

/// The cookie a pass of thread `tid` holds under marker `mark` (the supervisor computes the
/// same).
pub fn cookie(mark: u64, tid: u32) -> u64 {
    journal_core::internal::counters::pass_cookie(mark, tid)
}

/// Runs `f` (a libc call that makes unmarked system calls of its own) holding a pass, when a
/// supervisor watches this process and the session's counters are mapped; otherwise just runs
/// it. Never held across an exec: the functions called with a pass all return.
pub fn with_pass<R>(counters: &crate::state::SharedCounters, f: impl FnOnce() -> R) -> R {
    let m = mark();
    if m == 0 {
        return f();
    }
    let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    let slot = counters.claim_pass(tid);
    if let Some(slot) = slot {
        COOKIE.with(|c| {
            c.set(cookie(m, tid));
            counters.publish_pass(slot, c as *const std::cell::Cell<u64> as u64);
        });
    }
    let out = f();
    if let Some(slot) = slot {
        counters.release_pass(slot);
        COOKIE.with(|c| c.set(0));
    }
    out
}

/// A spawn pass's cookie (see [`SpawnPass`]): the cookie word and the `argv` pointer of the
/// spawn. In the thread's state (`thread.rs`), at one address for the thread's life.
static SPAWN_COOKIE: crate::thread::Local<[u64; 2]> = crate::thread::Local::new(|t| &t.spawn_cookie);

/// A *spawn pass*, held by a thread inside `posix_spawn`, whose child, on this thread's
/// memory, makes its exec itself, unmarked: the supervisor lets through, without journaling
/// it, an exec of the same `argv` by a thread on whose memory the pass's cookie is found
/// (`aether_journal::internal::counters::SPAWN_PASS`). Whoever holds one journals the spawn
/// itself. Given back when dropped: never held past the spawn.
pub struct SpawnPass {
    counters: &'static crate::state::SharedCounters,
    slot: usize,
}

impl SpawnPass {
    /// Takes and publishes a spawn pass for an exec of `argv` by a child of this thread, when
    /// a supervisor watches this process; `None` otherwise, or when none is free (the exec
    /// then reaches the supervisor, which journals it).
    pub fn claim(counters: &'static crate::state::SharedCounters, argv: *const c_char) -> Option<SpawnPass> {
        let m = mark();
        if m == 0 {
            return None;
        }
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let pass = SpawnPass { counters, slot: counters.claim_spawn_pass(tid)? };
        SPAWN_COOKIE.with(|c| {
            c.set([journal_core::internal::counters::spawn_pass_cookie(m, tid), argv as u64]);
            counters.publish_pass(pass.slot, c.as_ptr() as u64);
        });
        Some(pass)
    }
}

impl Drop for SpawnPass {
    fn drop(&mut self) {
        self.counters.release_pass(self.slot);
        SPAWN_COOKIE.with(|c| c.set([0, 0]));
    }
}

// ----- the shim's own changes, with byte paths -----

/// `openat` of a byte path, marked.
pub fn open(dir: BorrowedFd<'_>, path: &[u8], flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    journal_core::capture::with_c_path(path, |p| Marked.openat(dir, p, flags, mode))
}

/// `openat2` of an absolute byte path that follows no symlink anywhere on the way
/// (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), marked. `ELOOP` when a component is a
/// symlink; `ENOSYS` before Linux 5.6.
pub fn open_no_symlinks(path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
    journal_core::capture::with_c_path(path, |p| openat2_no_symlinks(rustix::fs::CWD, p, flags))
}

/// See [`open_no_symlinks`]; relative paths start at `dir`.
fn openat2_no_symlinks(dir: BorrowedFd<'_>, path: &CStr, flags: OFlags) -> Result<OwnedFd, Errno> {
    // The kernel's `struct open_how`: flags, mode, resolve (libc's is non_exhaustive).
    let how: [u64; 3] = [flags.bits() as u64, 0, libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS];
    // SAFETY: a NUL-terminated path, a descriptor the caller holds (or AT_FDCWD), and an
    // open_how that lives across the call, with its true size.
    let r = unsafe {
        checked(libc::SYS_openat2, [fd(dir), ptr(path), how.as_ptr() as usize, std::mem::size_of_val(&how), 0])
    }?;
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// `mkdirat` of a byte path, marked.
pub fn mkdir(dir: BorrowedFd<'_>, path: &[u8], mode: Mode) -> Result<(), Errno> {
    journal_core::capture::with_c_path(path, |p| Marked.mkdirat(dir, p, mode))
}

/// `unlinkat` of a byte path, marked.
pub fn unlink(dir: BorrowedFd<'_>, path: &[u8], flags: AtFlags) -> Result<(), Errno> {
    journal_core::capture::with_c_path(path, |p| Marked.unlinkat(dir, p, flags))
}

/// `renameat` of byte paths, marked.
pub fn rename(old_dir: BorrowedFd<'_>, old: &[u8], new_dir: BorrowedFd<'_>, new: &[u8]) -> Result<(), Errno> {
    journal_core::capture::with_c_path(old, |o| {
        journal_core::capture::with_c_path(new, |n| Marked.renameat(old_dir, o, new_dir, n, RenameFlags::empty()))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_records_time_is_the_wall_clock_libc_reads() {
        for _ in 0..100 {
            let before = std::time::SystemTime::now();
            let t = super::wall_clock();
            let after = std::time::SystemTime::now();
            assert!(before <= t && t <= after, "{before:?} <= {t:?} <= {after:?}");
        }
    }
}
