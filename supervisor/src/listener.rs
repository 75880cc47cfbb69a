//! The seccomp listener: receiving notifications and answering them (`seccomp_unotify(2)`).
//!
//! What this module cannot do: answer a notification whose thread has gone (the kernel says
//! `ENOENT`: the call will never run), or keep a thread from abandoning its call while the
//! supervisor works on it (the notification's id stops being valid; see [`Listener::valid`]).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// One call a watched thread is waiting in.
#[derive(Clone, Copy, Debug)]
pub struct Notification {
    /// The kernel's id for this wait.
    pub id: u64,
    /// The thread id (not the process id) of the caller.
    pub tid: u32,
    /// The system call number.
    pub nr: i64,
    /// The caller's architecture (`AUDIT_ARCH_*`).
    pub arch: u32,
    /// The six argument registers.
    pub args: [u64; 6],
}

/// The listener descriptor a filter with `SECCOMP_FILTER_FLAG_NEW_LISTENER` returned.
pub struct Listener {
    fd: OwnedFd,
}

/// `SECCOMP_IOCTL_NOTIF_ID_VALID` as kernels before 5.17 numbered it (`_IOR` instead of
/// `_IOW`).
const NOTIF_ID_VALID_OLD: libc::Ioctl = 0x8008_2102;

/// `SECCOMP_IOCTL_NOTIF_SET_FLAGS` and its one flag (Linux 6.6): wake the waiting thread on
/// the supervisor's CPU, which saves a cross-CPU wake-up per call.
const NOTIF_SET_FLAGS: libc::Ioctl = 0x4008_2104;
const USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;

impl Listener {
    /// Wraps a listener descriptor.
    pub fn new(fd: OwnedFd) -> Listener {
        let l = Listener { fd };
        // Where the kernel has it; without it every answer costs a wake-up on another CPU.
        // SAFETY: an ioctl on our own listener with a plain integer argument.
        let _ = unsafe { libc::ioctl(l.fd.as_raw_fd(), NOTIF_SET_FLAGS, USER_NOTIF_FD_SYNC_WAKE_UP) };
        l
    }

    /// Waits for the next notification. It waits for ever once every watched thread has gone
    /// (a receive never learns that): the supervisor ends then without waiting for it (see
    /// `launch.rs`). No `poll` before it: one system call fewer per notification.
    pub fn recv(&self) -> io::Result<Notification> {
        loop {
            // The struct must be zeroed (EINVAL since Linux 5.5 otherwise).
            // SAFETY: seccomp_notif is plain data; all zeroes is a valid value.
            let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: RECV fills the struct we pass.
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // Another worker took it, or its thread gave up the call meanwhile.
                    Some(libc::ENOENT) | Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                    _ => return Err(e),
                }
            }
            return Ok(Notification {
                id: req.id,
                tid: req.pid,
                nr: i64::from(req.data.nr),
                arch: req.data.arch,
                args: req.data.args,
            });
        }
    }

    /// Whether the thread of notification `id` is still waiting in that call (not killed,
    /// and the call not abandoned): checked after reading its memory, before acting on it.
    pub fn valid(&self, id: u64) -> bool {
        let mut id = id;
        // SAFETY: ID_VALID reads the u64 we pass.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id) };
        if r == 0 {
            return true;
        }
        if matches!(io::Error::last_os_error().raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOTTY)) {
            // SAFETY: as above, with the number older kernels used.
            return unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_ID_VALID_OLD, &mut id) } == 0;
        }
        false
    }

    /// Lets the kernel run the call as the program made it. False when the thread no longer
    /// waits in it (killed, or interrupted by a signal: the call may then be made again).
    pub fn proceed(&self, id: u64) -> bool {
        self.send(id, 0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32)
    }

    /// Fails the call with `errno`, without running it. False as for [`Listener::proceed`].
    pub fn fail(&self, id: u64, errno: i32) -> bool {
        self.send(id, -errno, 0)
    }

    fn send(&self, id: u64, error: i32, flags: u32) -> bool {
        let mut resp = libc::seccomp_notif_resp { id, val: 0, error, flags };
        // SAFETY: SEND reads the struct we pass.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) == 0 }
    }
}
