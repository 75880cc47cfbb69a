//! Installing the filter in the command `run` starts, and handing its listener to the
//! supervisor.
//!
//! The child does it between `fork` and `exec` ([`Installer::install`], called from a
//! `pre_exec` hook): `PR_SET_NO_NEW_PRIVS` unless it has `CAP_SYS_ADMIN`, the filter with
//! `SECCOMP_FILTER_FLAG_NEW_LISTENER` (and `WAIT_KILLABLE_RECV` where the kernel has it: without
//! it, signals such as Go's preemption interrupt every wait), then the listener sent over a Unix
//! socket (`SCM_RIGHTS`) with a marked `sendmsg`, which the filter it has just installed lets
//! through. The filter is inherited by every descendant, across fork, clone and exec, and cannot
//! be removed.
//!
//! Whether a filter can be installed at all is asked first, of a throwaway child ([`probe`]),
//! so that `run` knows the session's coverage before it starts the command.
//!
//! What this module cannot do: install a second listener under a process that already has one
//! (`EBUSY`: another supervisor, or a nested `aether-journal run`), or any filter where seccomp
//! is unavailable (`EINVAL`, `ENOSYS`, a container's own policy): the session then has `libc`
//! coverage, and says why.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use libc::{sock_filter, sock_fprog};

/// Everything the child needs, prepared before the fork: the child allocates nothing.
pub struct Installer {
    program: Vec<sock_filter>,
    flags: libc::c_ulong,
    no_new_privs: bool,
    mark: u64,
}

/// Why no filter can be installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// Another filter of this process tree already has a listener (a supervisor above us).
    Busy,
    /// The kernel has no seccomp user notification (or refuses it here): the errno.
    Refused(i32),
}

/// `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` (Linux 5.19).
const WAIT_KILLABLE_RECV: libc::c_ulong = libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;

/// `SECCOMP_FILTER_FLAG_SPEC_ALLOW` (Linux 4.17, before user notification): a kernel whose
/// speculation mitigations are chosen "by prctl and seccomp" (the default before 5.16) would
/// otherwise force Speculative Store Bypass and indirect branch mitigations on every process
/// of the session, which slows some programs by several times. The filter is there to journal
/// what the programs do, not to change how they run: they keep the mitigations they would have
/// without it.
const SPEC_ALLOW: libc::c_ulong = libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW;

impl Installer {
    /// The installer of `program` for a session marked `mark`, with the flags this kernel
    /// takes (see [`probe`]).
    pub fn new(program: Vec<sock_filter>, mark: u64, killable: bool) -> Installer {
        let mut flags = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | SPEC_ALLOW;
        if killable {
            flags |= WAIT_KILLABLE_RECV;
        }
        Installer { program, flags, no_new_privs: !has_sys_admin(), mark }
    }

    /// Whether the filter is installed with `PR_SET_NO_NEW_PRIVS` (set-id programs then run
    /// without their privileges).
    pub fn no_new_privs(&self) -> bool {
        self.no_new_privs
    }

    /// In the child, after `fork`, before `exec`: installs the filter and sends its listener
    /// on `socket`. Async-signal-safe: system calls only, on memory prepared beforehand.
    ///
    /// # Safety
    /// Only in a child that has just been forked (a single thread), with `socket` one end of a
    /// Unix socket pair whose other end the supervisor reads.
    pub unsafe fn install(&self, socket: RawFd) -> Result<(), i32> {
        // SAFETY: forwarded obligation (a fresh child); the program lives in `self`.
        let listener = unsafe { install_filter(&self.program, self.flags, self.no_new_privs) }?;
        // SAFETY: both descriptors are open; the message is built on this stack frame.
        let sent = unsafe { send_fd(socket, listener, self.mark) };
        // SAFETY: our own descriptor, no longer needed here (the supervisor has its copy).
        unsafe { libc::close(listener) };
        sent
    }
}

/// Installs `program` in the calling thread; returns the listener.
///
/// # Safety
/// The calling process must accept the filter for good (it is never removed).
unsafe fn install_filter(program: &[sock_filter], flags: libc::c_ulong, no_new_privs: bool) -> Result<RawFd, i32> {
    if no_new_privs {
        // SAFETY: a prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(errno());
        }
    }
    let prog = sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
    // SAFETY: seccomp(SET_MODE_FILTER, flags, &prog), with `prog` pointing to `program`,
    // which outlives the call.
    let fd =
        unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &prog as *const sock_fprog) };
    if fd < 0 { Err(errno()) } else { Ok(fd as RawFd) }
}

/// Sends descriptor `fd` with one byte over `socket` (`SCM_RIGHTS`), as a marked `sendmsg`.
///
/// # Safety
/// `socket` and `fd` must be open descriptors.
unsafe fn send_fd(socket: RawFd, fd: RawFd, mark: u64) -> Result<(), i32> {
    let mut byte = [b'L'];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // Room for one descriptor's control message, aligned as a cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; zero is a valid value for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: the control buffer is at least CMSG_SPACE(4) bytes (32 >= 24) and aligned, so
    // CMSG_FIRSTHDR returns a pointer into it, and CMSG_DATA a pointer inside that header's
    // room.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        libc::CMSG_DATA(c).cast::<RawFd>().write_unaligned(fd);
    }
    // SAFETY: sendmsg(socket, &msg, 0) with the marker in the sixth register, which the filter
    // just installed lets through; `msg` and what it points to live on this frame.
    let r = unsafe { libc::syscall(libc::SYS_sendmsg, socket, &msg as *const libc::msghdr, 0, 0, 0, mark) };
    let err = errno();
    // glibc's syscall() leaves the marker in the sixth argument register: clear it with a
    // harmless call, so that no later call of this child carries it by accident.
    // SAFETY: getppid takes no argument; the six given are the registers it ignores.
    unsafe { libc::syscall(libc::SYS_getppid, 0, 0, 0, 0, 0, 0) };
    if r < 0 { Err(err) } else { Ok(()) }
}

/// Receives the listener the child sent on `socket` (`None`: the child ended, or sent none).
pub fn receive_listener(socket: &OwnedFd) -> Option<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let mut control = [0u64; 4];
    // SAFETY: as in send_fd.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    loop {
        // SAFETY: recvmsg into buffers that live on this frame.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            return None;
        }
        break;
    }
    // SAFETY: the kernel filled `msg`; CMSG_FIRSTHDR reads its control fields.
    let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: a non-null header lies in our control buffer.
    if c.is_null() || unsafe { (*c).cmsg_type } != libc::SCM_RIGHTS {
        return None;
    }
    // SAFETY: an SCM_RIGHTS message carries the descriptor in its data.
    let fd = unsafe { libc::CMSG_DATA(c).cast::<RawFd>().read_unaligned() };
    // SAFETY: a descriptor the kernel just installed in this process for us.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether a filter with a listener can be installed here, and with `WAIT_KILLABLE_RECV`:
/// asked of a throwaway child, which installs one and exits. `Ok(killable)`.
pub fn probe() -> Result<bool, Unavailable> {
    let program = crate::filter::program(1);
    let no_new_privs = !has_sys_admin();
    let attempt = |flags: libc::c_ulong| -> Result<(), i32> {
        // SAFETY: fork of a process whose child only makes system calls and _exits.
        match unsafe { libc::fork() } {
            -1 => Err(errno()),
            0 => {
                // SAFETY: a fresh child, which exits right away.
                let code = match unsafe { install_filter(&program, flags, no_new_privs) } {
                    Ok(_) => 0,
                    Err(e) => e.clamp(1, 255),
                };
                // SAFETY: ends the child without running anything of the parent's.
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child.
                while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 && errno() == libc::EINTR {}
                match libc::WEXITSTATUS(status) {
                    0 if libc::WIFEXITED(status) => Ok(()),
                    e if libc::WIFEXITED(status) => Err(e),
                    _ => Err(libc::ECHILD),
                }
            }
        }
    };
    let listener = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | SPEC_ALLOW;
    match attempt(listener | WAIT_KILLABLE_RECV) {
        Ok(()) => Ok(true),
        Err(libc::EBUSY) => Err(Unavailable::Busy),
        Err(libc::EINVAL) => match attempt(listener) {
            Ok(()) => Ok(false),
            Err(libc::EBUSY) => Err(Unavailable::Busy),
            Err(e) => Err(Unavailable::Refused(e)),
        },
        Err(e) => Err(Unavailable::Refused(e)),
    }
}

/// Whether this process has `CAP_SYS_ADMIN` in its effective set (it may then install a
/// filter without `PR_SET_NO_NEW_PRIVS`).
fn has_sys_admin() -> bool {
    rustix::thread::capabilities(None).is_ok_and(|c| c.effective.contains(rustix::thread::CapabilitySet::SYS_ADMIN))
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}
