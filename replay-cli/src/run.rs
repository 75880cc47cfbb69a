//! `aether-journal run`: create a session and run a command under the shim.
//!
//! What this cannot do: journal a command whose environment drops `LD_PRELOAD` before the
//! shim is loaded, or a statically linked one; the shim records those it can detect.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use aether_journal::BPath;
use aether_journal::bpath;
use aether_journal::config::{ENV_DIR, ENV_POLICY, ENV_SHIM, ENV_SWITCH};
use aether_journal::exec_check::{self, Creds};
use aether_journal::record::{Op, RECORD_VERSION, Record};
use aether_journal::session::{self, Header, Session};

fn libc_eperm() -> i32 {
    rustix::io::Errno::PERM.raw_os_error()
}

/// A record made by this process (the root of the session's tree).
fn own_record(seq: u64, op: Op) -> Record {
    Record {
        v: RECORD_VERSION,
        seq,
        time: session::now_rfc3339(),
        pid: std::process::id(),
        ppid: rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32),
        prog: std::env::current_exe().map(|p| BPath::from(p.as_path())).unwrap_or_default(),
        call: "run".into(),
        op,
    }
}

/// The shim's file name.
pub const SHIM_NAME: &str = "libaether_journal.so";

/// Finds the shim: `AETHER_JOURNAL_SHIM`, or next to this executable.
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
        Ok(candidate)
    } else {
        Err(format!(
            "the shim {SHIM_NAME} is not next to {} and {ENV_SHIM} is not set; build it with `cargo build --release`",
            exe.display()
        ))
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().unwrap_or_else(|_| "/".into()).join(p) }
}

/// Runs the command; returns its exit status (128 + signal number when it was killed).
pub fn run(journal: Option<PathBuf>, strict: bool, command: Vec<OsString>) -> Result<u8, String> {
    let shim = find_shim()?;
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let id = session::new_session_id();
    let root = session::sessions_root();
    let dir = match journal {
        Some(d) => absolute(&d),
        None => root.clone().ok_or("neither XDG_STATE_HOME nor HOME is set: pass --journal DIR")?.join(&id),
    };
    let header = Header::new(
        id,
        command.iter().map(|a| BPath::new(a.as_bytes().to_vec())).collect(),
        BPath::from(cwd.as_path()),
        "cli",
    );
    let s = Session::create(&dir, &header).map_err(|e| e.to_string())?;
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
    drop(err);
    // The command itself is started by this (unhooked) process: check it here, as the shim's
    // exec hooks check every program started after it.
    let first = s.reserve_ids_before_start(2).map_err(|e| e.to_string())?;
    let path_var = std::env::var_os("PATH");
    let found = exec_check::search_path(command[0].as_bytes(), path_var.as_ref().map(|p| p.as_bytes()));
    let program =
        BPath::new(if found.first() == Some(&b'/') { found } else { bpath::join(cwd.as_os_str().as_bytes(), &found) });
    if let Err(reason) = exec_check::check(program.as_bytes(), Creds::current()) {
        if strict {
            let what = format!("exec of {}: {reason}", program.display_lossy());
            s.append(&own_record(first, Op::Refused { what, errno: libc_eperm() })).map_err(|e| e.to_string())?;
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: refusing to run {} under --strict: {reason}",
                program.display_lossy()
            );
            return Ok(126);
        }
        let _ = writeln!(
            std::io::stderr(),
            "aether-journal: warning: {} runs unobserved: {reason}",
            program.display_lossy()
        );
        s.append(&own_record(first, Op::Unobserved { program: program.clone(), reason })).map_err(|e| e.to_string())?;
    }
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env("LD_PRELOAD", preload).env(ENV_DIR, s.dir()).env_remove(ENV_SWITCH);
    if strict {
        cmd.env(ENV_POLICY, "strict");
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "aether-journal: cannot run {}: {e}", command[0].to_string_lossy());
            return Ok(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 });
        }
    };
    let argv = command.iter().map(|a| BPath::new(a.as_bytes().to_vec())).collect();
    let exec = Op::Exec { program, argv, cwd: BPath::from(cwd.as_path()), child: Some(child.id()) };
    let _ = s.append(&own_record(first + 1, exec));
    let status = child.wait().map_err(|e| format!("waiting for the command: {e}"))?;
    // Seal: the after-state of every touched path, so that undo can tell later edits apart.
    let journal = s.read_journal().map_err(|e| e.to_string())?;
    let pb = crate::progress_bar(journal.records.len() as u64, "sealing");
    let seal = aether_journal::seal::take_seal(&journal, &s.blobs_dir(), || pb.inc(1));
    pb.finish_and_clear();
    let sealed = serde_json::to_vec_pretty(&seal).map_err(|e| e.to_string())?;
    if let Err(e) = session::write_atomically(&s.dir().join(aether_journal::seal::SEAL_FILE), &sealed) {
        let _ = writeln!(
            std::io::stderr(),
            "aether-journal: warning: the session could not be sealed ({e}); undo will use a weaker check for later changes"
        );
    }
    let records = journal.records.len();
    let _ = writeln!(
        std::io::stderr(),
        "aether-journal: {records} step(s) journaled in {}; review with `aether-journal log --journal {0}`, rewind with `aether-journal undo --journal {0}`",
        s.dir().display()
    );
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => 1,
    })
}
