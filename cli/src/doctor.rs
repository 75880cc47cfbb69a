//! `aether-journal doctor [--json] [DIR]`: what a session on this machine gets, and why. Each
//! check is made for real (a filter installed in a child, another process's memory read, a
//! clone attempted, the shim loaded into a shell), never inferred from a version number.
//!
//! What this module cannot do: promise what a check found for another directory, another
//! user, or a container that is set up differently: run it where the sessions will run.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// One thing checked.
#[derive(Debug, Serialize)]
pub struct Check {
    /// Its name, stable for a program to read.
    pub name: &'static str,
    /// Whether a session has it.
    pub ok: bool,
    /// Whether a session needs it for its full coverage (the others only make it cheaper).
    pub needed: bool,
    /// What was found.
    pub detail: String,
    /// What a session loses without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without: Option<&'static str>,
}

fn check(name: &'static str, result: Result<String, String>, without: &'static str) -> Check {
    let needed = !matches!(name, "birth_times" | "reflink" | "same_file_system");
    match result {
        Ok(detail) => Check { name, ok: true, needed, detail, without: None },
        Err(detail) => Check { name, ok: false, needed, detail, without: Some(without) },
    }
}

fn errno_text(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// A child that waits, for the checks that need another process of ours to look at.
struct Child(std::process::Child);

impl Child {
    fn spawn() -> Result<Child, String> {
        std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::null())
            .spawn()
            .map(Child)
            .map_err(|e| format!("cannot start a child to check with: {e}"))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn seccomp() -> (Check, Check) {
    use aether_journal_supervisor::install::{Unavailable, probe};
    match probe() {
        Ok(killable) => (
            check("seccomp_user_notification", Ok("a filter with a listener was installed in a child".into()), ""),
            check(
                "wait_killable_recv",
                if killable {
                    Ok("SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV accepted".into())
                } else {
                    Err("the kernel refused SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (before Linux 5.19)".into())
                },
                "signals (Go's preemption) interrupt every watched call, which the kernel restarts",
            ),
        ),
        Err(why) => {
            let detail = match why {
                Unavailable::Busy => "another supervisor already watches this process tree (EBUSY)".to_string(),
                Unavailable::Refused(e) => format!("the kernel refused the filter: {}", errno_text(e)),
            };
            let without = "sessions get libc coverage: Go, Bun and static programs run unobserved";
            (
                check("seccomp_user_notification", Err(detail.clone()), without),
                check("wait_killable_recv", Err(detail), without),
            )
        }
    }
}

fn pidfd_getfd(child: &Child) -> Result<String, String> {
    use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let pid = Pid::from_raw(child.0.id() as i32).ok_or("no child pid")?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|e| format!("pidfd_open: {e}"))?;
    pidfd_getfd(&pidfd, 0, PidfdGetfdFlags::empty()).map_err(|e| format!("pidfd_getfd: {e}"))?;
    Ok("took a descriptor of a child with pidfd_getfd".into())
}

fn peer_memory(child: &Child) -> Result<String, String> {
    let pid = child.0.id();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| format!("/proc/{pid}/maps: {e}"))?;
    let start = maps
        .lines()
        .find(|l| l.split_whitespace().nth(1).is_some_and(|p| p.starts_with('r')))
        .and_then(|l| l.split('-').next())
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .ok_or("no readable mapping in the child")?;
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().map(|s| s.trim().to_string());
    let mut buf = [0u8; 8];
    let thread = aether_journal_supervisor::target::Thread { tid: pid };
    match thread.read(start, &mut buf) {
        Ok(()) => Ok(format!(
            "read a child's memory with process_vm_readv{}",
            yama.map(|y| format!(" (Yama ptrace_scope {y})")).unwrap_or_default()
        )),
        Err(e) => Err(format!(
            "process_vm_readv of a child failed ({e:?}){}",
            yama.map(|y| format!("; Yama ptrace_scope is {y}")).unwrap_or_default()
        )),
    }
}

/// A scratch file in `dir`, removed when dropped.
fn scratch_file(dir: &Path) -> Result<tempfile::NamedTempFile, String> {
    tempfile::Builder::new()
        .prefix(".doctor-")
        .tempfile_in(dir)
        .map_err(|e| format!("cannot write in {}: {e}", dir.display()))
}

fn birth_times(dir: &Path) -> Result<String, String> {
    let f = scratch_file(dir)?;
    let sx = rustix::fs::statx(rustix::fs::CWD, f.path(), rustix::fs::AtFlags::empty(), rustix::fs::StatxFlags::BTIME)
        .map_err(|e| format!("statx: {e}"))?;
    if rustix::fs::StatxFlags::from_bits_retain(sx.stx_mask).contains(rustix::fs::StatxFlags::BTIME) {
        Ok(format!("{} keeps birth times", dir.display()))
    } else {
        Err(format!("{} keeps no birth times", dir.display()))
    }
}

fn reflink(dir: &Path) -> Result<String, String> {
    use std::io::Write;
    let mut a = scratch_file(dir)?;
    a.write_all(b"aether-journal doctor").map_err(|e| e.to_string())?;
    let b = scratch_file(dir)?;
    rustix::fs::ioctl_ficlone(b.as_file(), a.as_file())
        .map(|()| format!("the store's file system ({}) clones files", dir.display()))
        .map_err(|e| format!("FICLONE in {}: {e}", dir.display()))
}

fn same_fs(dir: &Path, store: &Path) -> Result<String, String> {
    let d = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let s = std::fs::metadata(store).map_err(|e| format!("{}: {e}", store.display()))?;
    if d.dev() == s.dev() {
        Ok(format!("{} and the store are on one file system: removed files are kept by a hard link", dir.display()))
    } else {
        Err(format!("{} is on another file system than the store ({})", dir.display(), store.display()))
    }
}

fn shim_loads() -> Result<String, String> {
    let shim = crate::run::find_shim()?;
    crate::run::shim_loads(&shim).map(|()| format!("{} loads into a program", shim.display()))
}

fn state_dir(root: &Path) -> Result<String, String> {
    let m = std::fs::metadata(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me {
        return Err(format!("{} belongs to uid {}, not to you", root.display(), m.uid()));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!("{} is open to others (mode {:o})", root.display(), m.mode() & 0o7777));
    }
    scratch_file(root)?;
    Ok(format!("{} is yours, private and writable", root.display()))
}

/// Runs every check: for sessions journaling `dir`.
pub fn checks(dir: &Path) -> Vec<Check> {
    let root: PathBuf = aether_journal::session::sessions_root().unwrap_or_else(|| PathBuf::from("/nonexistent"));
    if !root.exists() {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&root);
    }
    let (seccomp, killable) = seccomp();
    let child = Child::spawn();
    let with_child = |f: fn(&Child) -> Result<String, String>| child.as_ref().map_err(Clone::clone).and_then(f);
    vec![
        seccomp,
        killable,
        check(
            "pidfd_getfd",
            with_child(pidfd_getfd),
            "the supervisor cannot make a call on a program's behalf with its own descriptors",
        ),
        check(
            "process_vm_readv",
            with_child(peer_memory),
            "the supervisor cannot read the paths programs pass: their calls are journaled irreversible",
        ),
        check("birth_times", birth_times(dir), "exclusive creates are looked at first (a little slower)"),
        check("reflink", reflink(&root), "captures copy bytes where they could share them"),
        check("same_file_system", same_fs(dir, &root), "removed files are kept by copying them into the store"),
        check("shim", shim_loads(), "nothing is journaled: `run` refuses to start"),
        check("state_dir", state_dir(&root), "sessions go to a fallback directory, or nowhere"),
    ]
}

/// Runs `doctor`: the text or JSON, and whether every needed check passed.
pub fn doctor(dir: Option<PathBuf>, json: bool) -> Result<(String, bool), String> {
    let dir = match dir {
        Some(d) => d,
        None => std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?,
    };
    let checks = checks(&dir);
    let all = checks.iter().all(|c| c.ok || !c.needed);
    let coverage =
        if checks.iter().any(|c| c.name == "seccomp_user_notification" && !c.ok) { "libc" } else { "syscalls" };
    if json {
        let doc = serde_json::json!({"dir": dir, "coverage": coverage, "checks": checks});
        return Ok((format!("{doc}\n"), all));
    }
    let mut out = format!("sessions here get {coverage} coverage\n");
    for c in &checks {
        let verdict = match (c.ok, c.needed) {
            (true, _) => "ok",
            (false, true) => "NO",
            (false, false) => "--",
        };
        out.push_str(&format!("{verdict:<4} {:<26} {}\n", c.name, c.detail));
        if let Some(w) = c.without {
            out.push_str(&format!("     {:<26} without it: {w}\n", ""));
        }
    }
    Ok((out, all))
}
