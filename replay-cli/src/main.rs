//! `aether-journal`: run a command with every file change journaled, look at what it did, and
//! rewind it or keep it.
//!
//! Exit status (a contract): 0 success (an undo that undid every step exactly); 1 an error
//! (unreadable session, bad arguments after parsing); 2 usage errors; 3 an undo (or dry run)
//! that could not undo everything exactly. `run` passes the command's own status through.
//!
//! What this program cannot do: undo what the journal marks irreversible. It says so, names
//! each such step, and exits 3.

mod output;
mod run;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aether_journal::session::{self, Session, SessionError};
use aether_journal::undo::{self, UndoOptions};
use clap::{Parser, Subcommand};

/// Exit status: an undo that could not undo every step exactly.
pub const EXIT_INCOMPLETE: u8 = 3;
/// Exit status: an error.
pub const EXIT_ERROR: u8 = 1;

#[derive(Parser)]
#[command(name = "aether-journal", version, about = "Make any process tree's file changes reversible", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command with the shim preloaded; every file it (or any descendant) changes is journaled.
    Run {
        /// Session directory to create (default: a new one under ~/.local/state/aether-journal).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
        /// Refuse calls whose effect cannot be journaled instead of recording them.
        #[arg(long)]
        strict: bool,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
        command: Vec<std::ffi::OsString>,
    },
    /// Show the journal's records, oldest first.
    Log {
        /// Session directory (default: the most recent session).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
        /// One JSON object with the header, the records and any damaged records.
        #[arg(long, conflicts_with = "tree")]
        json: bool,
        /// The process tree, with what each process changed underneath it.
        #[arg(long)]
        tree: bool,
    },
    /// Rewind the session: replay the journal backwards and report every step.
    Undo {
        /// Session directory (default: the most recent session).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Say what would be done without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { journal, strict, command } => run::run(journal, strict, command),
        Command::Log { journal, json, tree } => log(journal, json, tree),
        Command::Undo { journal, json, dry_run } => undo(journal, json, dry_run),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "aether-journal: error: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Opens `--journal DIR`, or the most recent session.
pub fn open_session(journal: Option<PathBuf>) -> Result<Session, String> {
    let dir = match journal {
        Some(d) => d,
        None => {
            let root = session::sessions_root().ok_or("neither XDG_STATE_HOME nor HOME is set: pass --journal DIR")?;
            return session::latest_session(&root).map_err(|e| match e {
                SessionError::NoSessions(r) => format!("no sessions found under {}: pass --journal DIR", r.display()),
                e => e.to_string(),
            });
        }
    };
    session::check_ownership(&dir).ok();
    let s = Session::open(&dir).map_err(|e| e.to_string())?;
    session::check_ownership(s.dir())?;
    Ok(s)
}

fn log(journal: Option<PathBuf>, json: bool, tree: bool) -> Result<u8, String> {
    let s = open_session(journal)?;
    let j = s.read_journal().map_err(|e| e.to_string())?;
    let text = if json {
        output::log_json(&s, &j)
    } else if tree {
        output::log_tree(&s, &j)
    } else {
        output::log_text(&s, &j)
    };
    output::emit(&text);
    Ok(0)
}

fn undo(journal: Option<PathBuf>, json: bool, dry_run: bool) -> Result<u8, String> {
    let s = open_session(journal)?;
    let report = undo::undo_session(&s, UndoOptions { dry_run }).map_err(|e| e.to_string())?;
    let text = if json { format!("{}\n", report.to_json()) } else { output::report_text(&s, &report) };
    output::emit(&text);
    Ok(if report.complete { 0 } else { EXIT_INCOMPLETE })
}
