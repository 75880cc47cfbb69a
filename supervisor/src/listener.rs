//! The seccomp listener: receiving notifications and answering them (`seccomp_unotify(2)`).
//!
//! What this module cannot do: answer a notification whose thread has gone (the kernel says
//! `ENOENT`: the call will never run), keep a thread from abandoning its call while the
//! supervisor works on it (the notification's id stops being valid; see [`Listener::valid`]),
//! or, before Linux 6.6, learn that every watched thread has gone (a receive then waits for
//! ever; see [`Listener::recv`]).

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

    /// Waits for the next notification: `Ok(None)` once every watched thread has gone, where
    /// the kernel says so. Since Linux 6.6 a receive made then fails at once with `ENOENT`,
    /// as one does whose call was abandoned: the listener's hang-up (`POLLHUP`, which a filter
    /// no thread uses any more raises and never lowers) tells the two apart, asked only after
    /// an `ENOENT`. Before 6.6 the receive waits for ever: the supervisor ends then without
    /// waiting for it (see `launch.rs`). No `poll` before the receive: one system call fewer
    /// per notification.
    pub fn recv(&self) -> io::Result<Option<Notification>> {
        loop {
            // The struct must be zeroed (EINVAL since Linux 5.5 otherwise).
            // SAFETY: seccomp_notif is plain data; all zeroes is a valid value.
            let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: RECV fills the struct we pass.
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // No thread uses the filter any more, and none ever will: without this
                    // check the loop would spin on `ENOENT` until the process ends.
                    Some(libc::ENOENT) if self.hung_up() => return Ok(None),
                    // Another worker took it, or its thread gave up the call meanwhile.
                    Some(libc::ENOENT) | Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                    _ => return Err(e),
                }
            }
            return Ok(Some(Notification {
                id: req.id,
                tid: req.pid,
                nr: i64::from(req.data.nr),
                arch: req.data.arch,
                args: req.data.args,
            }));
        }
    }

    /// Whether the listener has hung up: no thread uses its filter any more.
    fn hung_up(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: polls one descriptor of ours, without waiting, into a struct on this frame.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r > 0 && pfd.revents & libc::POLLHUP != 0
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::{Installer, receive_listener};
    use std::time::Duration;

    /// The listener of a filter whose only process has installed it and exited.
    fn listener_nobody_uses() -> Listener {
        let (ours, theirs) = crate::launch::socketpair().expect("socketpair");
        let installer = Installer::new(crate::filter::program(7), 7, false);
        // SAFETY: the child only makes system calls (Installer::install's contract: a fresh
        // child, one end of our socket pair) and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            let code = match unsafe { installer.install(theirs.as_raw_fd()) } {
                Ok(()) => 0,
                Err(_) => 1,
            };
            // SAFETY: ends the child without running anything of the parent's.
            unsafe { libc::_exit(code) }
        }
        assert!(pid > 0, "fork: {}", io::Error::last_os_error());
        drop(theirs);
        let listener = receive_listener(&ours).map(Listener::new);
        let mut status = 0;
        // SAFETY: waits for our own child.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child could not install a filter: {status:#x}"
        );
        listener.expect("the child sent its listener")
    }

    #[test]
    fn a_receive_once_every_watched_thread_has_gone_ends_or_waits_but_never_spins() {
        let listener = listener_nobody_uses();
        let (clock_tx, clock_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut clock: libc::clockid_t = 0;
            // SAFETY: asks for this thread's CPU-time clock into a local.
            let _ = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
            let _ = clock_tx.send(clock);
            let _ = done_tx.send(listener.recv().map(|n| n.map(|n| n.nr)).map_err(|e| e.raw_os_error()));
        });
        let clock = clock_rx.recv().expect("the receiving thread started");
        match done_rx.recv_timeout(Duration::from_secs(1)) {
            // Linux 6.6 and later: the receive fails at once, and the listener says why.
            Ok(got) => assert_eq!(got, Ok(None), "a receive with nobody left to watch"),
            // Before 6.6 the receive waits for ever: it must wait, not spin.
            Err(_) => {
                let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: reads the CPU time of a thread that is still running (it has not
                // answered) into a local.
                assert_eq!(unsafe { libc::clock_gettime(clock, &mut t) }, 0);
                let used = Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
                assert!(used < Duration::from_millis(100), "the receiving thread used {used:?} of CPU in a second");
            }
        }
    }
}
