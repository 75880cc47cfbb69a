//! `aether-journal run`: create a session and run a command in it.
//!
//! By default the command runs under the seccomp supervisor as well as the shim (coverage
//! `syscalls`): every process of the tree is watched, whether or not it goes through libc.
//! With `--no-supervise`, or where the kernel refuses a filter with a listener, only the shim
//! journals (coverage `libc`), and the session's header says why.
//!
//! What this cannot do: journal a process of the session that escaped the tree (one started
//! through a service manager), or, under `libc` coverage, see into programs that bypass libc:
//! those are journaled as unobserved.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use aether_journal::BPath;
use aether_journal::bpath;
use aether_journal::config::{ENV_DIR, ENV_MARK, ENV_POLICY, ENV_SHIM, ENV_SWITCH, Settings};
use aether_journal::exec_check::{self, Creds};
use aether_journal::record::{ExecOp, Op};
use aether_journal::session::{self, Coverage, CoverageMode, CoverageReason, Durability, Header, Session};
use aether_journal::witness::Witnessed;
use aether_journal_supervisor::install::{Installer, Unavailable, probe};
use aether_journal_supervisor::launch::{Ended, launch};

fn libc_eperm() -> i32 {
    rustix::io::Errno::PERM.raw_os_error()
}

/// The shim's file name.
pub const SHIM_NAME: &str = "libaether_journal.so";

/// The shim, when this build carries it (see `build.rs`): empty otherwise.
static EMBEDDED_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libaether_journal.so"));

/// The embedded shim, written out (once, mode 0755) under
/// `${XDG_DATA_HOME:-$HOME/.local/share}/aether-journal/shim-HASH/` and checked against its
/// hash every time; `None` when this build carries none.
fn embedded_shim() -> Result<Option<PathBuf>, String> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if EMBEDDED_SHIM.is_empty() {
        return Ok(None);
    }
    let hash = blake3::hash(EMBEDDED_SHIM);
    let data = match std::env::var_os("XDG_DATA_HOME").filter(|d| Path::new(d).is_absolute()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").filter(|h| !h.is_empty()).ok_or("HOME is not set")?)
            .join(".local/share"),
    };
    let dir = data.join("aether-journal").join(format!("shim-{}", &hash.to_hex()[..16]));
    let path = dir.join(SHIM_NAME);
    if std::fs::read(&path).is_ok_and(|b| blake3::hash(&b) == hash) {
        return Ok(Some(path));
    }
    let fail = |what: &str, e: std::io::Error| format!("cannot write the shim out to {}: {what}: {e}", dir.display());
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).map_err(|e| fail("mkdir", e))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".shim-")
        .permissions(std::fs::Permissions::from_mode(0o755))
        .tempfile_in(&dir)
        .map_err(|e| fail("create", e))?;
    tmp.write_all(EMBEDDED_SHIM).map_err(|e| fail("write", e))?;
    tmp.as_file().sync_all().map_err(|e| fail("fsync", e))?;
    tmp.persist(&path).map_err(|e| fail("rename", e.error))?;
    match std::fs::read(&path) {
        Ok(b) if blake3::hash(&b) == hash => Ok(Some(path)),
        _ => Err(format!("the shim written to {} does not match the one this program carries", path.display())),
    }
}

/// Finds the shim: `AETHER_JOURNAL_SHIM`, next to this executable (or in
/// `../lib/aether-journal/`, as a package installs it), or the one this program carries.
pub fn find_shim() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(ENV_SHIM).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(std::fs::canonicalize(&p).unwrap_or(p))
        } else {
            Err(format!("{ENV_SHIM} names {}, which is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    let candidate = exe.with_file_name(SHIM_NAME);
    if candidate.is_file() {
        return Ok(candidate);
    }
    if let Some(lib) = exe.parent().and_then(Path::parent).map(|p| p.join("lib/aether-journal").join(SHIM_NAME))
        && lib.is_file()
    {
        return Ok(lib);
    }
    match embedded_shim()? {
        Some(p) => Ok(p),
        None => Err(format!(
            "the shim {SHIM_NAME} is not next to {} and {ENV_SHIM} is not set; build it with `cargo build --release`",
            exe.display()
        )),
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().unwrap_or_else(|_| "/".into()).join(p) }
}

/// How `run` starts its command.
pub struct RunOptions {
    /// `--journal DIR`.
    pub journal: Option<PathBuf>,
    /// `--strict`.
    pub strict: bool,
    /// `--no-supervise`.
    pub no_supervise: bool,
}

/// The session's coverage on this machine, and, for `syscalls`, whether the kernel waits
/// killably.
fn coverage(no_supervise: bool) -> (Coverage, Option<bool>) {
    if no_supervise {
        return (Coverage::libc(CoverageReason::NoSupervise), None);
    }
    match probe() {
        Ok(killable) => (Coverage::syscalls(false), Some(killable)),
        Err(Unavailable::Busy) => (Coverage::libc(CoverageReason::ListenerBusy), None),
        Err(Unavailable::Refused(errno)) => (Coverage::libc(CoverageReason::SeccompUnavailable { errno }), None),
    }
}

/// A marker no watched call carries by chance (never 0, which means "none").
fn new_mark() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u64::from_ne_bytes(b) | 1
}

/// Whether `shim` really loads into a program as the shim (a file that the loader cannot
/// preload, `AETHER_JOURNAL_SHIM=/bin/true` say, is ignored by it with a warning, and the
/// command would run with nothing journaled): a shell started with it preloaded, and the
/// loader's `LD_DEBUG=files` report, must show the loader calling the shim's initializer.
/// (One process: a shell that looked for it in its mappings with `grep` took two, 3.6 ms of
/// every `run` against 1.5.)
pub fn shim_loads(shim: &Path) -> Result<(), String> {
    ShimCheck::start(shim)?.verdict()
}

/// [`shim_loads`] under way: `run` starts it first and asks its verdict before it makes the
/// session, so that the check's 1.5 ms overlap with the seccomp probe's.
pub struct ShimCheck {
    child: std::process::Child,
    shim: PathBuf,
}

impl ShimCheck {
    /// Starts the shell that loads `shim`.
    pub fn start(shim: &Path) -> Result<ShimCheck, String> {
        let child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg("exit 0")
            .env("LD_PRELOAD", shim)
            .env("LD_DEBUG", "files")
            .env_remove("LD_DEBUG_OUTPUT")
            .env(ENV_SWITCH, "off")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start /bin/sh to check the shim: {e}"))?;
        Ok(ShimCheck { child, shim: shim.to_path_buf() })
    }

    /// Waits for the shell: whether the loader called the shim's initializer, and if not,
    /// what the loader said of it.
    pub fn verdict(self) -> Result<(), String> {
        let shim = self.shim;
        let name = shim.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let out = self.child.wait_with_output().map_err(|e| format!("cannot check the shim: {e}"))?;
        let report = String::from_utf8_lossy(&out.stderr);
        let init = format!("calling init: {}", shim.display());
        if out.status.success() && report.lines().any(|l| l.trim_end().ends_with(&init)) {
            return Ok(());
        }
        // What the loader said of it (its errors carry no pid; its report of every file does),
        // with any report line that says it cannot do something.
        let why = report
            .lines()
            .filter(|l| l.contains("cannot") || !l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ");
        Err(format!(
            "the shim {} ({name}) does not load into programs{}: nothing would be journaled",
            shim.display(),
            if why.is_empty() { String::new() } else { format!(" ({why})") }
        ))
    }
}

/// Runs the command; returns its exit status (128 + signal number when it was killed).
pub fn run(opts: RunOptions, command: Vec<OsString>) -> Result<u8, String> {
    let shim = find_shim()?;
    let check = ShimCheck::start(&shim)?;
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let id = session::new_session_id();
    let root = session::sessions_root();
    let dir = match &opts.journal {
        Some(d) => absolute(d),
        None => root.clone().ok_or("neither XDG_STATE_HOME nor HOME is set: pass --journal DIR")?.join(&id),
    };
    let (mut coverage, killable) = coverage(opts.no_supervise);
    check.verdict()?;
    let mark = killable.map(|_| new_mark());
    let installer = killable.zip(mark).map(|(k, m)| {
        let i = Installer::new(aether_journal_supervisor::filter::program(m), m, k);
        coverage.no_new_privs = i.no_new_privs();
        i
    });
    let mut header = Header::new(
        id,
        command.iter().map(|a| BPath::new(a.as_bytes().to_vec())).collect(),
        BPath::from(cwd.as_path()),
        "cli",
    );
    header.coverage = Some(coverage.clone());
    let durability = Durability::of(&Settings::from_env().0);
    let s = Session::create(&dir, &header, durability).map_err(|e| e.to_string())?;
    if let Some(root) = &root {
        // So that `log`/`undo` without --journal find sessions kept elsewhere.
        let _ = session::register(root, &s);
    }
    let mut preload = OsString::from(shim.as_os_str());
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut err = std::io::stderr().lock();
    if std::env::var_os(ENV_SWITCH).is_some_and(|v| v == "off") {
        let _ = writeln!(
            err,
            "aether-journal: note: {ENV_SWITCH}=off is set in the environment; it is cleared for this run"
        );
    }
    let _ = writeln!(err, "aether-journal: session {}", s.dir().display());
    if coverage.mode == CoverageMode::Libc && !opts.no_supervise {
        let _ = writeln!(err, "aether-journal: note: coverage is {}", coverage.describe());
    }
    drop(err);
    let path_var = std::env::var_os("PATH");
    let found = exec_check::search_path(command[0].as_bytes(), path_var.as_ref().map(|p| p.as_bytes()));
    let program =
        BPath::new(if found.first() == Some(&b'/') { found } else { bpath::join(cwd.as_os_str().as_bytes(), &found) });
    let mut cmd = std::process::Command::new(&command[0]);
    // The marker of an outer session's supervisor must not reach this one's processes: they
    // would mark their calls with it, hiding them from the supervisor that watches them.
    cmd.args(&command[1..])
        .env("LD_PRELOAD", preload)
        .env(ENV_DIR, s.dir())
        .env(aether_journal::config::ENV_SESSION_ID, &s.header().id)
        .env_remove(ENV_SWITCH)
        .env_remove(ENV_MARK);
    if opts.strict {
        cmd.env(ENV_POLICY, "strict");
    }
    let (status, witnessed) = match installer {
        Some(installer) => {
            cmd.env(ENV_MARK, format!("{:016x}", mark.unwrap_or(0)));
            run_supervised(&s, cmd, installer, mark.unwrap_or(0), opts.strict, &command[0])?
        }
        None => (run_plain(&s, cmd, opts.strict, &program, &cwd, &command)?, Witnessed::default()),
    };
    let status = match status {
        Started::Ran(status) => status,
        Started::Refused(code) => return Ok(code),
        Started::Not(code) => {
            // Nothing ran: no session is left for a plain `undo` to take for the last one.
            if let Err(e) = session::discard_unstarted(root.as_deref(), s) {
                let _ = writeln!(std::io::stderr(), "aether-journal: warning: the unused session was not removed: {e}");
            }
            return Ok(code);
        }
    };
    seal(&s, durability, &witnessed)?;
    Ok(status)
}

/// How the command went: it ran (its status as `run` passes it on), the strict policy refused
/// it (journaled), or it could not be started at all (126 or 127, as a shell says).
enum Started {
    Ran(u8),
    Refused(u8),
    Not(u8),
}

/// Runs the command under the supervisor (which journals its exec and sees into every
/// program). Also returns what the supervisor read of the journal while the command ran.
fn run_supervised(
    s: &Session,
    cmd: std::process::Command,
    installer: Installer,
    mark: u64,
    strict: bool,
    name: &OsString,
) -> Result<(Started, Witnessed), String> {
    // The settings the command's processes get: this environment's, and the policy.
    let (settings, _) =
        Settings::from_lookup(
            |k| {
                if k == ENV_POLICY && strict { Some("strict".into()) } else { std::env::var(k).ok() }
            },
        );
    let store = aether_journal_supervisor::store::Store::open(s.dir(), settings, mark)
        .map_err(|e| format!("cannot open the session for the supervisor: {e}"))?;
    let caught = catch_signals();
    let mut launched = launch(cmd, store, installer, 1).map_err(|e| format!("cannot start the supervisor: {e}"))?;
    if let Some(child) = launched.started() {
        pass_signals_to(caught, child);
    }
    let status = match launched.wait() {
        Ended::Status(st) => exit_code(std::process::ExitStatus::from_raw(st)),
        Ended::NotStarted(errno) => {
            let e = std::io::Error::from_raw_os_error(errno);
            let _ = writeln!(std::io::stderr(), "aether-journal: cannot run {}: {e}", name.to_string_lossy());
            let _ = rustix::process::waitpid(
                rustix::process::Pid::from_raw(launched.supervisor as i32),
                rustix::process::WaitOptions::empty(),
            );
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Ok((Started::Not(code), Witnessed::default()));
        }
        Ended::SupervisorLost(st) => {
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: warning: the supervisor ended before the command did; its processes' watched calls fail with ENOSYS from then on"
            );
            st.map_or(1, |st| exit_code(std::process::ExitStatus::from_raw(st)))
        }
    };
    // Reap the supervisor if it has finished; if not, it goes on for the session's processes
    // that are still running.
    let _ = rustix::process::waitpid(
        Some(rustix::process::Pid::from_raw(launched.supervisor as i32).ok_or("bad supervisor pid")?),
        rustix::process::WaitOptions::NOHANG,
    );
    Ok((Started::Ran(status), std::mem::take(&mut launched.witnessed)))
}

/// Runs the command with the shim alone, as without a supervisor: `run` checks the program
/// itself (as the shim's exec hooks check every program started after it) and journals its
/// exec. `Err(code)`: refused under the strict policy.
fn run_plain(
    s: &Session,
    mut cmd: std::process::Command,
    strict: bool,
    program: &BPath,
    cwd: &Path,
    command: &[OsString],
) -> Result<Started, String> {
    // The command itself is started by this (unhooked) process: check it here, as the shim's
    // exec hooks check every program started after it.
    let first = s.reserve_ids_before_start(2).map_err(|e| e.to_string())?;
    use std::os::unix::ffi::OsStrExt;
    let argv: Vec<&[u8]> = command.iter().map(|a| a.as_bytes()).collect();
    if let Err(reason) = exec_check::check_exec(program.as_bytes(), &argv, Creds::current()) {
        if strict {
            let what = format!("exec of {}: {reason}", program.display_lossy());
            s.append(&s.starter_record(first, "run", Op::Refused { what: what.into(), errno: libc_eperm() }))
                .map_err(|e| e.to_string())?;
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: refusing to run {} under --strict: {reason}",
                program.display_lossy()
            );
            return Ok(Started::Refused(126));
        }
        let _ = writeln!(
            std::io::stderr(),
            "aether-journal: warning: {} runs unobserved: {reason}",
            program.display_lossy()
        );
        s.append(&s.starter_record(
            first,
            "run",
            Op::Unobserved { program: program.clone(), reason: Box::new(reason) },
        ))
        .map_err(|e| e.to_string())?;
    }
    let caught = catch_signals();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "aether-journal: cannot run {}: {e}", command[0].to_string_lossy());
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Ok(Started::Not(code));
        }
    };
    let argv = command.iter().map(|a| a.as_bytes()).collect();
    let exec =
        Op::Exec(Box::new(ExecOp { program: program.clone(), argv, cwd: BPath::from(cwd), child: Some(child.id()) }));
    let _ = s.append(&s.starter_record(first + 1, "run", exec));
    pass_signals_to(caught, child.id());
    let status = child.wait().map_err(|e| format!("waiting for the command: {e}"))?;
    Ok(Started::Ran(exit_code(status)))
}

/// The signals `run` passes on, caught from before the command starts (a signal sent the
/// moment the command has started would otherwise kill `run` before it sealed): they wait
/// in signal-hook's pipe until [`pass_signals_to`] forwards them. No thread is started here,
/// so the supervisor's fork after this copies none.
type Caught = signal_hook::iterator::SignalsInfo<signal_hook::iterator::exfiltrator::WithOrigin>;

fn catch_signals() -> Option<Caught> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    Caught::new([SIGINT, SIGQUIT, SIGTERM, SIGHUP]).ok()
}

/// From now on, passes the signals `run` is sent (caught since [`catch_signals`]) on to the
/// command (`child`), so that a harness's `proc.send_signal(SIGTERM)` or `SIGINT` to `run`'s
/// pid alone stops the command instead of killing `run` before it seals and leaving the
/// command running. The terminal's own SIGINT, SIGQUIT and SIGHUP (sent by the kernel to the
/// whole foreground process group) are not passed on: the command has its own. Called once
/// the command has started (after the supervisor's fork: the thread it starts must not be in
/// a forked child).
fn pass_signals_to(signals: Option<Caught>, child: u32) {
    use signal_hook::consts::SIGTERM;
    use signal_hook::low_level::siginfo::Cause;
    let Some(mut signals) = signals else { return };
    let Some(pid) = rustix::process::Pid::from_raw(child as i32) else { return };
    std::thread::spawn(move || {
        for o in signals.forever() {
            if matches!(o.cause, Cause::Kernel) && o.signal != SIGTERM {
                continue;
            }
            if let Some(sig) = rustix::process::Signal::from_named_raw(o.signal) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    });
}

/// An exit status as `run` passes it on: the code, or 128 + N when killed by signal N.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => 1,
    }
}

/// Seals the session: the after-state of every touched path, so that undo can tell later
/// edits apart. Written as durably as the session's records (`durability`).
fn seal(s: &Session, durability: Durability, witnessed: &Witnessed) -> Result<(), String> {
    // A store that vanished while the command ran (a program nothing could see into removed
    // or moved it) is said plainly: what was journaled in it is gone.
    match Session::open(s.dir()) {
        Ok(now) if now.header().id == s.header().id && now.header().cut_off.is_none() => {}
        Ok(now) if now.header().id == s.header().id => {
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: warning: the session's store vanished while the command ran and was made again ({}): what was done before that cannot be undone",
                now.header().cut_off.as_deref().unwrap_or_default()
            );
        }
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: warning: the session's store at {} vanished while the command ran: nothing it journaled can be undone",
                s.dir().display()
            );
            return Ok(());
        }
    }
    let pb = crate::progress_bar(s.counters().last_id, "sealing");
    let records = match s.seal(durability, witnessed, crate::ticker(&pb)) {
        Ok((records, differing)) => {
            for file in differing {
                let _ = writeln!(
                    std::io::stderr(),
                    "aether-journal: warning: the session's {file} is not what the supervisor read of it while the command ran (a process of the session rewrote or removed records): undo will not act on what was written over them, and will be incomplete"
                );
            }
            records
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: warning: the session could not be sealed ({e}); undo will use a weaker check for later changes"
            );
            s.read_journal().map(|j| j.records.len()).unwrap_or(0)
        }
    };
    pb.finish_and_clear();
    let _ = writeln!(
        std::io::stderr(),
        "aether-journal: {records} step(s) journaled in {}; review with `aether-journal review --journal {0}`, rewind with `aether-journal undo --journal {0}`",
        s.dir().display()
    );
    Ok(())
}
