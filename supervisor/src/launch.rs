//! Starting a command under the supervisor, as `aether-journal run` does.
//!
//! ```text
//! run ──fork──> supervisor ──fork+exec──> command (filter installed before its exec)
//!  │               │  receives the listener, serves it until every watched thread has gone,
//!  │               │  and reaps the session's orphans (it is their subreaper)
//!  └─ reads the command's pid and exit status from a pipe, seals, exits with the status
//! ```
//!
//! The supervisor is a process of its own, so that `run` can return when the command ends
//! while processes it left behind (a server, a watcher) are still journaled; and it is the
//! command's parent, and the subreaper of everything below it, so that it stays an ancestor of
//! every process it watches (Yama's `ptrace_scope` 1 lets a process read only its
//! descendants' memory). It ignores the terminal's signals (SIGINT, SIGQUIT, SIGHUP) and
//! SIGTERM, which are the command's to receive, and holds none of `run`'s standard streams
//! once the command has started.
//!
//! What this module cannot do: outlive a `SIGKILL`. The watched calls then fail with `ENOSYS`
//! in the program, and nothing changes unjournaled.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use aether_journal::witness::{POLL, Witness, Witnessed};

use crate::install::{Installer, receive_listener};
use crate::listener::Listener;
use crate::store::Store;

/// The supervised command, seen from `run`.
pub struct Launched {
    /// The supervisor's pid.
    pub supervisor: u32,
    /// The command's pid, once the supervisor said it.
    pub child: Option<u32>,
    events: BufReader<std::fs::File>,
    /// What the supervisor read of the journal while the command ran, once it has ended
    /// (empty if the supervisor could not say).
    pub witnessed: Witnessed,
    /// An event [`Launched::started`] read that was not the start (kept for `wait`).
    pending: Option<Event>,
}

/// How the supervised command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its wait status (as `waitpid` gives it).
    Status(i32),
    /// It could not be started: the errno.
    NotStarted(i32),
    /// The supervisor ended before saying (it was killed): the command, if it had started,
    /// was reaped by `run` itself (a subreaper) with this status.
    SupervisorLost(Option<i32>),
}

/// The signals the supervisor ignores, and that the command gets back as `run` had them.
const PASSED_ON: [libc::c_int; 4] = [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTERM];

/// Starts `command` under a supervisor journaling into `store`'s session, with `installer`'s
/// filter. `run` must not have started any thread yet (it forks). `workers`: the supervisor's
/// worker threads.
pub fn launch(mut command: Command, store: Store, installer: Installer, workers: usize) -> std::io::Result<Launched> {
    // Orphans of the session come back to `run` if the supervisor dies, so that `run` can
    // still reap the command and report its status.
    // SAFETY: a prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let (to_run, from_supervisor) = pipe()?;
    // SAFETY: `run` is single-threaded here (its caller's obligation), so the child may run
    // ordinary code.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(from_supervisor);
            // The supervisor's threads hold it until the process ends (see `supervise`).
            let store: &'static Store = Box::leak(Box::new(store));
            let code = supervise(&mut command, store, installer, workers, to_run);
            // SAFETY: ends the supervisor without running `run`'s exit handlers twice.
            unsafe { libc::_exit(code) }
        }
        pid => {
            drop(to_run);
            Ok(Launched {
                supervisor: pid as u32,
                child: None,
                events: BufReader::new(from_supervisor.into()),
                witnessed: Witnessed::default(),
                pending: None,
            })
        }
    }
}

impl Launched {
    /// Waits for the command's pid (`None`: it could not be started, or the supervisor died).
    pub fn started(&mut self) -> Option<u32> {
        if self.child.is_none() && self.pending.is_none() {
            match self.next_event() {
                Some(Event::Started(pid)) => self.child = Some(pid),
                other => self.pending = other,
            }
        }
        self.child
    }

    /// Waits for the command to end.
    pub fn wait(&mut self) -> Ended {
        loop {
            match self.next_event() {
                Some(Event::Started(pid)) => self.child = Some(pid),
                Some(Event::Ended(status, others)) => {
                    if !others {
                        // Nobody is left for the supervisor to watch: it is about to end.
                        // Wait for it, so that it holds nothing of the session open after
                        // `run` returns (a store on a file system about to be unmounted).
                        while self.next_event().is_some() {}
                        let _ = reap(self.supervisor);
                    }
                    return Ended::Status(status);
                }
                Some(Event::NotStarted(e)) => return Ended::NotStarted(e),
                None => return Ended::SupervisorLost(self.child.and_then(reap)),
            }
        }
    }

    fn next_event(&mut self) -> Option<Event> {
        if let Some(e) = self.pending.take() {
            return Some(e);
        }
        let mut line = String::new();
        loop {
            line.clear();
            match self.events.read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            let mut words = line.split_whitespace();
            let (Some(kind), Some(value)) = (words.next(), words.next().and_then(|v| v.parse::<i64>().ok())) else {
                continue;
            };
            if kind == "witness" {
                let mut bytes = vec![0; usize::try_from(value).unwrap_or(0)];
                if self.events.read_exact(&mut bytes).is_err() {
                    return None;
                }
                self.witnessed = Witnessed::from_bytes(&bytes).unwrap_or_default();
                continue;
            }
            return Some(match kind {
                "started" => Event::Started(value as u32),
                "ended" => Event::Ended(value as i32, words.next() == Some("others")),
                "not-started" => Event::NotStarted(value as i32),
                _ => continue,
            });
        }
    }
}

enum Event {
    Started(u32),
    /// The command's wait status, and whether it left processes of the session behind.
    Ended(i32, bool),
    NotStarted(i32),
}

/// Waits for `pid` (reparented to `run` when the supervisor died).
fn reap(pid: u32) -> Option<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waits for a process of our own tree.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if r == pid as libc::pid_t {
            return Some(status);
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

/// The supervisor process: starts the command, serves its listener, reaps, reports to `run`.
/// It ends once it has reaped the last process of the session (it is their subreaper, so every
/// process that could still make a watched call is one it would reap), without waiting for its
/// workers (before Linux 6.6 they wait on the listener for ever once nothing is left to watch).
fn supervise(
    command: &mut Command,
    store: &'static Store,
    installer: Installer,
    workers: usize,
    to_run: OwnedFd,
) -> i32 {
    let mut to_run = std::fs::File::from(to_run);
    // SAFETY: prctls with integer arguments: orphans of the session are reparented here (so it
    // stays an ancestor of every process it reads), and the session's processes may not
    // trace it.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let saved = ignore_passed_on();
    let Ok((ours, theirs)) = socketpair() else {
        let _ = writeln!(to_run, "not-started {}", libc::EMFILE);
        return 1;
    };
    let child_socket = theirs.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes system calls:
    // it puts back the signal dispositions `run` had and its dumpability, then installs the
    // filter and sends the listener (Installer::install's contract: a fresh child, one end of
    // our socket pair).
    unsafe {
        command.pre_exec(move || {
            restore(&saved);
            // Forked from the supervisor, which may not be traced: the command may (as its
            // exec would make it anyway), so that its exec can be read.
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            installer.install(child_socket).map_err(std::io::Error::from_raw_os_error)
        });
    }
    {
        let server = std::thread::spawn(move || {
            if let Some(listener) = receive_listener(&ours).map(Listener::new) {
                drop(ours);
                crate::serve::serve(&listener, store, workers);
            }
        });
        let spawned = command.spawn();
        drop(theirs);
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(to_run, "not-started {}", e.raw_os_error().unwrap_or(libc::ENOEXEC));
                drop(to_run);
                // No listener was sent: the server has ended, or ends when our end of the
                // socket closes with this process.
                drop(server);
                return 0;
            }
        };
        let pid = child.id();
        drop(child);
        let witness = Witnessing::start(store);
        let _ = writeln!(to_run, "started {pid}");
        let _ = to_run.flush();
        // The command has its standard streams: the supervisor keeps none of `run`'s open (a
        // pipe would otherwise stay open until the last process of the session ended).
        detach_stdio();
        let mut reported = false;
        loop {
            let mut status = 0;
            // SAFETY: waits for any child: the command, or an orphan reparented here.
            let r = unsafe { libc::waitpid(-1, &mut status, 0) };
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break; // ECHILD: nobody left
            }
            if r as u32 == pid && !reported {
                // What the supervisor read of the journal, read on to the end first: `run`
                // seals with it (see `aether_journal::witness`).
                let seen = witness.finish();
                let _ = writeln!(to_run, "witness {}", seen.len());
                let _ = to_run.write_all(&seen);
                // Whether the command left processes behind: its orphans are this process's
                // children by the time its own exit is reaped.
                // SAFETY: siginfo_t is plain data; zero is a valid value.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
                // SAFETY: a non-blocking wait that reaps nothing (WNOWAIT) and only asks; `info`
                // is ours.
                let none = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) } < 0;
                let alone = none && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
                let _ = writeln!(to_run, "ended {status} {}", if alone { "alone" } else { "others" });
                let _ = to_run.flush();
                reported = true;
            }
        }
        // Nothing is left to watch: the workers are not waited for (before Linux 6.6 the last
        // one waits on the listener for ever), and end with this process at the latest. The
        // last event: `run` may wait for this pipe to close when the command left nobody
        // behind, so that the session's store is no longer held open when `run` returns.
        drop(server);
        // SAFETY: getrusage fills the struct we pass.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0 {
            store.counters().note_supervisor_peak(usage.ru_maxrss.max(0) as u64);
        }
        drop(to_run);
        0
    }
}

/// The supervisor's reading of the journal while the command runs: a thread that reads what
/// was written every [`POLL`] while ids are being taken from the session's counter (and for a
/// few rounds after, for records whose id was taken before they were written).
struct Witnessing {
    shared: std::sync::Arc<(std::sync::Mutex<Witness>, std::sync::atomic::AtomicBool)>,
}

/// Rounds the witness still reads after the counter last moved.
const QUIET_ROUNDS: u32 = 5;

impl Witnessing {
    fn start(store: &'static Store) -> Witnessing {
        use std::sync::atomic::Ordering;
        let shared = std::sync::Arc::new((
            std::sync::Mutex::new(Witness::new(&store.dir)),
            std::sync::atomic::AtomicBool::new(false),
        ));
        let theirs = shared.clone();
        // Without the thread (none could be started) the journal is read at the end only.
        let _ = std::thread::Builder::new().name("witness".into()).spawn(move || {
            let (witness, done) = &*theirs;
            let (mut last, mut quiet) = (u64::MAX, 0);
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(POLL);
                let now = store.counters().last_id();
                quiet = if now == last { quiet + 1 } else { 0 };
                last = now;
                if quiet <= QUIET_ROUNDS
                    && let Ok(mut w) = witness.lock()
                {
                    w.catch_up();
                }
            }
        });
        Witnessing { shared }
    }

    /// Reads on to the end, stops the thread, and returns what was read as `run` is handed it.
    fn finish(&self) -> Vec<u8> {
        self.shared.1.store(true, std::sync::atomic::Ordering::Release);
        match self.shared.0.lock() {
            Ok(mut w) => {
                w.catch_up();
                w.seen().to_bytes()
            }
            Err(_) => Vec::new(),
        }
    }
}

/// The dispositions of [`PASSED_ON`] as `run` had them.
type Saved = [(libc::c_int, libc::sighandler_t); 4];

/// Ignores [`PASSED_ON`] in the supervisor; returns the dispositions it had.
fn ignore_passed_on() -> Saved {
    let mut saved = [(0, libc::SIG_DFL); 4];
    for (slot, &sig) in saved.iter_mut().zip(PASSED_ON.iter()) {
        // SAFETY: signal() with SIG_IGN installs no handler; it returns the old disposition.
        let old = unsafe { libc::signal(sig, libc::SIG_IGN) };
        *slot = (sig, if old == libc::SIG_ERR { libc::SIG_DFL } else { old });
    }
    saved
}

/// Puts back dispositions [`ignore_passed_on`] saved (in the command, before its exec: only
/// SIG_DFL and SIG_IGN survive an exec anyway).
fn restore(saved: &Saved) {
    for &(sig, disposition) in saved {
        let d = if disposition == libc::SIG_IGN { libc::SIG_IGN } else { libc::SIG_DFL };
        // SAFETY: as in ignore_passed_on.
        unsafe { libc::signal(sig, d) };
    }
}

/// Points the supervisor's standard streams at `/dev/null`.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: dup2 of a descriptor we own onto the standard ones.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((w, r))
}

/// A connected pair of Unix stream sockets, close-on-exec: the command's child sends its
/// listener on one end, the supervisor receives it on the other.
pub(crate) fn socketpair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills the array we pass.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
