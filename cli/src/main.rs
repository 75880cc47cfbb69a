//! `aether-journal`: run a command with every file change journaled, look at what it did, and
//! rewind it or keep it.
//!
//! Exit status (a contract): 0 success (an undo that undid every selected step exactly); 1 an
//! error (unreadable session, bad arguments after parsing); 2 usage errors; 3 an undo (or dry
//! run) that could not undo everything exactly, conflicts included. `run` passes the command's
//! own status through.
//!
//! What this program cannot do: undo what the journal marks irreversible. It says so, names
//! each such step, and exits 3.

mod doctor;
mod error;
mod hook;
mod init;
mod mcp;
mod output;
mod run;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use aether_journal::BPath;
use aether_journal::config::parse_size;
use aether_journal::select::Selection;
use aether_journal::session::{self, Session, SessionError};
use aether_journal::undo::{self, UndoOptions};
use aether_journal_recorder::marks::{MarkRequest, Marked};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use error::CliError;

use aether_journal::exit_codes::{ERROR as EXIT_ERROR, INCOMPLETE as EXIT_INCOMPLETE, NOTHING_SELECTED};

#[derive(Parser)]
#[command(name = "aether-journal", version, about = "Make any process tree's file changes reversible")]
#[command(long_about = "Run a command with every file change journaled (aether-journal run), look at what it did \
(review, log), then decide once: keep it (keep) or rewind it (undo). Undo reports every step it could not \
reverse, and exits 3 when anything is not exactly as it was.")]
#[command(after_long_help = aether_journal::exit_codes::help_text())]
struct Cli {
    /// Without --journal, take the newest session of all, wherever it was started (by default:
    /// the newest started in the current directory or above it).
    #[arg(long, global = true)]
    latest: bool,
    #[command(subcommand)]
    command: Command,
}

/// What `undo` and `redo` share: the session, the form of the report, and how careful to be.
#[derive(clap::Args)]
struct ReportArgs {
    /// Session directory (default: the most recent session).
    #[arg(long, value_name = "DIR")]
    journal: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Say what would be done without changing anything.
    #[arg(long)]
    dry_run: bool,
    /// Restore paths that changed since (the session ended, or the undo a redo takes back):
    /// otherwise they are conflicts, left alone.
    #[arg(long)]
    force: bool,
}

/// When to colour output.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Color {
    /// When stdout is a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
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
        /// Journal through the LD_PRELOAD shim only, without the seccomp supervisor: programs
        /// that bypass libc (Go, static binaries) then run unobserved, and undo says so.
        #[arg(long)]
        no_supervise: bool,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
        command: Vec<std::ffi::OsString>,
    },
    /// List every session, newest first.
    Sessions {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Name this point of the session (the start of a turn): `undo --to NAME` rewinds to it,
    /// `review --since NAME` shows what came after it. Safe from any process, inside the
    /// session or outside it, while the session runs.
    Mark {
        /// Session directory (default: the session this process runs in, from
        /// AETHER_JOURNAL_DIR, or else the most recent session).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
        /// Free text shown beside the name (a harness puts the prompt's first line here).
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
        /// Your own key for this point (a prompt or turn id): marking the same key again
        /// names the mark made the first time, and writes nothing.
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
        /// Print the mark as one JSON object.
        #[arg(long)]
        json: bool,
        /// Its name, unique in the session (default: turn-1, turn-2, ...).
        name: Option<String>,
    },
    /// What an agent harness's hooks run (the hook's JSON on stdin): one session per harness
    /// session that its shell commands join, a mark at the start and end of every turn, and
    /// the files its own edit tools are about to write journaled first. Always exits 0.
    Hook {
        /// The harness.
        #[arg(value_enum)]
        harness: hook::Harness,
    },
    /// Add the hooks `aether-journal hook` needs to a harness's settings (idempotent; shows
    /// the change as a diff).
    Init {
        /// The harness.
        #[arg(value_enum)]
        harness: hook::Harness,
        /// The user's settings, for every project (the default).
        #[arg(long, conflicts_with = "project")]
        user: bool,
        /// The current project's settings.
        #[arg(long)]
        project: bool,
        /// Show the change without making it.
        #[arg(long)]
        dry_run: bool,
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
    /// What the session did: modified files with diffs, created, deleted, renamed, metadata,
    /// network, processes, irreversible steps.
    #[command(alias = "diff")]
    Review {
        /// Session directory (default: the most recent session).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// The summary only, without diffs.
        #[arg(long)]
        stat: bool,
        /// Colour the output.
        #[arg(long, value_enum, default_value = "auto")]
        color: Color,
        /// Never page the output.
        #[arg(long)]
        no_pager: bool,
        /// Only what was done after this mark.
        #[arg(long, value_name = "MARK")]
        since: Option<String>,
        /// Only what was done up to this mark (with --since: the span between the two).
        #[arg(long, value_name = "MARK")]
        until: Option<String>,
        /// Only these paths (and what lies beneath them).
        #[arg(value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Rewind the session (or part of it): replay the journal backwards and report every step.
    Undo {
        #[command(flatten)]
        report: ReportArgs,
        /// Keep no journal of this undo: faster, and `redo` cannot take it back.
        #[arg(long)]
        no_redo: bool,
        /// Only the newest N records.
        #[arg(long, value_name = "N", conflicts_with_all = ["pid", "paths", "to"])]
        last: Option<usize>,
        /// Everything done after this mark (`aether-journal mark`): the tree as it was there.
        #[arg(long, value_name = "MARK", conflicts_with_all = ["pid", "paths"])]
        to: Option<String>,
        /// Only what this process and its descendants did.
        #[arg(long, value_name = "PID", conflicts_with = "paths")]
        pid: Option<u32>,
        /// Only these paths (a file, or a whole subtree).
        #[arg(value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Take back the last undo of the session: every path it changed goes back to what it was
    /// just before it, with the same report and exit codes as an undo.
    Redo {
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Accept the session: release its captured contents, keep its journal as an audit log.
    Keep {
        /// Session directory (default: the most recent session).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
        /// Delete the whole session, journal included.
        #[arg(long)]
        forget: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete old sessions, or the oldest ones beyond a size.
    Gc {
        /// Remove sessions started longer ago than this (e.g. 7d, 12h).
        #[arg(long, value_name = "AGE")]
        older_than: Option<humantime::Duration>,
        /// Then remove the oldest sessions until all of them take at most this much (e.g. 10G).
        #[arg(long, value_name = "SIZE")]
        max_size: Option<String>,
        /// Say what would be removed without removing it.
        #[arg(long)]
        dry_run: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A stdio MCP server with the tools mark, status, review (since a mark) and rewind (to a
    /// mark; a dry run by default), for harnesses without hooks.
    Mcp,
    /// What a session on this machine gets, and why: each feature the supervisor and the
    /// shim need, checked for real. Exits 3 when one a session needs is missing (`--`: only
    /// costs speed).
    Doctor {
        /// One JSON object: `coverage`, and `checks` (`name`, `ok`, `detail`, `without`).
        #[arg(long)]
        json: bool,
        /// The directory sessions will journal (default: the current one).
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

/// When this program runs inside a session (an agent running `aether-journal` itself), the shim
/// is loaded into it and would refuse its writes to its own store. Start again without it; the
/// enclosing session journals this program as unobserved, which is what it is to that session.
fn leave_the_shim() {
    use std::os::unix::process::CommandExt;
    // The subcommands that only read run under the shim as any reader does: the session sees
    // all they do (nothing), and need not count them as unobserved.
    let sub = std::env::args_os().skip(1).find(|a| !a.to_string_lossy().starts_with('-'));
    // `mark` and `hook` stay too: inside a session a mark is appended through the shim (see
    // aether_journal_recorder::marks).
    if sub.is_none_or(|s| {
        ["sessions", "log", "review", "mark", "hook", "mcp", "doctor", "completions", "man", "help"]
            .contains(&&*s.to_string_lossy())
    }) {
        return;
    }
    let Some(preload) = std::env::var_os("LD_PRELOAD") else { return };
    let preload = preload.to_string_lossy().into_owned();
    if !preload.contains("libaether_journal") || std::env::var_os("AETHER_JOURNAL").is_some_and(|v| v == "off") {
        return;
    }
    let rest: Vec<&str> =
        preload.split([':', ' ']).filter(|e| !e.is_empty() && !e.contains("libaether_journal")).collect();
    let Ok(exe) = std::env::current_exe() else { return };
    let mut cmd = std::process::Command::new(exe);
    // The enclosing session's shim names this exec a nested session (see ENV_NESTED).
    cmd.args(std::env::args_os().skip(1)).env("AETHER_JOURNAL", "off").env(aether_journal::config::ENV_NESTED, "1");
    if rest.is_empty() {
        cmd.env_remove("LD_PRELOAD");
    } else {
        cmd.env("LD_PRELOAD", rest.join(":"));
    }
    let e = cmd.exec();
    let _ = writeln!(std::io::stderr(), "aether-journal: warning: could not leave the shim ({e})");
}

/// Makes every allocation of 128 KiB or more a mapping of its own, given back when it is freed.
/// glibc starts so, but raises that size each time such a block is freed (up to 32 MiB): after
/// the journal reader's buffers were freed, an undo's large short-lived buffers came from the
/// heap and left holes in it that it kept (a dry run of a million records peaked at 255 MB
/// instead of 239).
fn keep_large_allocations_mapped() {
    #[cfg(target_env = "gnu")]
    // SAFETY: `mallopt` only sets one of the allocator's parameters, under its own lock; it
    // reads and writes no memory of ours.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

fn main() -> ExitCode {
    leave_the_shim();
    keep_large_allocations_mapped();
    let cli = Cli::parse();
    LATEST.store(cli.latest, std::sync::atomic::Ordering::Relaxed);
    if let Some(x) =
        std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty() && !x.to_string_lossy().starts_with('/'))
    {
        let _ = writeln!(
            std::io::stderr(),
            "aether-journal: warning: XDG_STATE_HOME is relative ({}), which the XDG specification says to ignore: sessions are under $HOME/.local/state",
            x.to_string_lossy()
        );
    }
    let wants_json = std::env::args_os().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
    let result = match cli.command {
        Command::Run { journal, strict, no_supervise, command } => {
            run::run(run::RunOptions { journal, strict, no_supervise }, command).map_err(CliError::from)
        }
        Command::Sessions { json } => sessions(json),
        Command::Log { journal, json, tree } => log(journal, json, tree),
        Command::Hook { harness } => Ok(hook::hook(harness)),
        Command::Init { harness, user: _, project, dry_run } => {
            let scope = if project { init::Scope::Project } else { init::Scope::User };
            init::init(harness, scope, dry_run).map_err(CliError::from).map(|text| {
                output::emit(&text);
                0
            })
        }
        Command::Mark { journal, label, key, json, name } => mark(journal, MarkRequest { name, label, key }, json),
        Command::Review { journal, json, stat, color, no_pager, since, until, paths } => {
            review(journal, ReviewArgs { json, stat, color, no_pager, since, until, paths })
        }
        Command::Undo { report: ReportArgs { journal, json, dry_run, force }, no_redo, last, to, pid, paths } => {
            undo(journal, json, UndoOptions { dry_run, force, no_redo, select: None }, |s| {
                Ok(match (last, to, pid, paths.is_empty()) {
                    (Some(n), ..) => Some(Selection::Last(n)),
                    (_, Some(m), ..) => Some(Selection::After(mark_seq(s, &m)?)),
                    (_, _, Some(p), _) => Some(Selection::Pid(p)),
                    (.., false) => Some(Selection::Paths(paths.iter().map(|p| canonical_arg(p)).collect())),
                    _ => None,
                })
            })
        }
        Command::Redo { report: ReportArgs { journal, json, dry_run, force } } => {
            redo(journal, json, UndoOptions { dry_run, force, ..Default::default() })
        }
        Command::Keep { journal, forget, json } => keep(journal, forget, json),
        Command::Gc { older_than, max_size, dry_run, json } => gc(older_than, max_size, dry_run, json),
        Command::Mcp => mcp::serve().map_err(CliError::from),
        Command::Doctor { json, dir } => doctor::doctor(dir, json).map_err(CliError::from).map(|(text, all)| {
            output::emit(&text);
            if all { 0 } else { EXIT_INCOMPLETE }
        }),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "aether-journal", &mut out);
            output::emit(&String::from_utf8_lossy(&out));
            Ok(0)
        }
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut out).map_err(|e| CliError::Other(e.to_string())).map(
                |_| {
                    output::emit(&String::from_utf8_lossy(&out));
                    0
                },
            )
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "aether-journal: error: {e}");
            // A program that asked for JSON gets the error as JSON too, with a stable code.
            if wants_json {
                output::emit(&format!("{}\n", e.to_json()));
            }
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// An absolute, symlink-free form of a path argument: its deepest existing ancestor resolved by
/// the kernel, the rest (which the session may have deleted) kept as written.
fn canonical_arg(p: &Path) -> BPath {
    use std::os::unix::ffi::OsStrExt;
    let abs = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(p) };
    let mut head = abs.clone();
    let mut tail = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(&head) {
            let mut out = c;
            for t in tail.iter().rev() {
                out.push(t);
            }
            return BPath::new(out.as_os_str().as_bytes().to_vec());
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                head = parent.to_path_buf();
            }
            _ => return BPath::from(abs.as_path()),
        }
    }
}

/// Opens `--journal DIR`, or the most recent session.
/// Set by `--latest`: a command without `--journal` takes the newest session of all, not the
/// newest started in the current directory or above it.
static LATEST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn open_session(journal: Option<PathBuf>) -> Result<Session, CliError> {
    let dir = match journal {
        Some(d) => d,
        None => {
            let root = sessions_root()?;
            let s = if LATEST.load(std::sync::atomic::Ordering::Relaxed) {
                session::latest_session(&root)
            } else {
                let cwd = std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
                session::session_here(&root, &cwd)
            };
            let s = s.map_err(|e| match e {
                SessionError::NoSessions(r) => {
                    CliError::Other(format!("no sessions found under {}: pass --journal DIR", r.display()))
                }
                e => CliError::Session(e),
            })?;
            session::check_ownership(s.dir())?;
            // Said, since it was chosen for the user.
            let _ = writeln!(
                std::io::stderr(),
                "aether-journal: session {} ({}, started in {})",
                s.header().id,
                s.dir().display(),
                output::escape(&s.header().cwd)
            );
            return Ok(s);
        }
    };
    let s = Session::open(&dir)?;
    session::check_ownership(s.dir())?;
    Ok(s)
}

fn sessions_root() -> Result<PathBuf, CliError> {
    session::sessions_root().ok_or_else(|| "neither XDG_STATE_HOME nor HOME is set: pass --journal DIR".into())
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() || len < 200 {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

/// What a long step calls once per item to move `pb` on: nothing at all when the bar is hidden
/// (`inc` still reads the clock and updates a position every thread shares: 4% of the samples
/// of `run`'s seal after an `rm -rf`, its threads contending for it).
pub fn ticker(pb: &indicatif::ProgressBar) -> impl Fn() + Sync + '_ {
    let shown = !pb.is_hidden();
    move || {
        if shown {
            pb.inc(1)
        }
    }
}

fn sessions(json: bool) -> Result<u8, CliError> {
    let root = sessions_root()?;
    let list = session::list_sessions(&root);
    let infos: Vec<_> = list.iter().filter_map(|s| s.as_ref().ok()).map(Session::info).collect();
    if json {
        output::emit(&format!("{}\n", serde_json::to_string(&infos).map_err(|e| e.to_string())?));
    } else {
        let mut text = output::sessions_text(&infos);
        for e in list.iter().filter_map(|s| s.as_ref().err()) {
            text.push_str(&format!("!! {}\n", output::escape_text(&e.to_string())));
        }
        output::emit(&text);
    }
    // A session that cannot be read is named, and the listing is not a clean one.
    Ok(if list.iter().any(|s| s.is_err()) { EXIT_INCOMPLETE } else { 0 })
}

fn log(journal: Option<PathBuf>, json: bool, tree: bool) -> Result<u8, CliError> {
    let s = open_session(journal)?;
    // The steps undo would act on; the rest among the damaged.
    let (j, _) = s.read_checked()?;
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

fn mark(journal: Option<PathBuf>, req: MarkRequest, json: bool) -> Result<u8, CliError> {
    // Inside a session, its own session is the one meant.
    let journal = journal.or_else(|| std::env::var_os(aether_journal::config::ENV_DIR).map(PathBuf::from));
    let s = open_session(journal)?;
    let marked = aether_journal_recorder::marks::mark(&s, &req)?;
    let (m, new) = match &marked {
        Marked::New(m) => (m, true),
        Marked::Again(m) => (m, false),
    };
    if json {
        let doc = serde_json::json!({"name": m.name, "seq": m.seq, "label": m.label, "key": m.key, "new": new});
        output::emit(&format!("{doc}\n"));
    } else if new {
        output::emit(&format!("marked {} (record {})\n", output::escape_text(&m.name), m.seq));
    } else {
        output::emit(&format!("{} was marked already for this key (record {})\n", output::escape_text(&m.name), m.seq));
    }
    Ok(0)
}

/// The record id of the mark `name`; when there is none and the session's hooks failed (a
/// mark they could not write), the error says so.
fn mark_seq(s: &Session, name: &str) -> Result<u64, CliError> {
    s.mark_named(name).map(|m| m.seq).map_err(|e| {
        let log = s.dir().join("hook-errors.log");
        match std::fs::read_to_string(&log) {
            Ok(t) if !t.is_empty() => CliError::Other(format!(
                "{e}; the session's hooks failed {} time(s), so a mark may be missing: see {}",
                t.lines().count(),
                log.display()
            )),
            _ => CliError::Session(e),
        }
    })
}

/// `review`'s options.
struct ReviewArgs {
    json: bool,
    stat: bool,
    color: Color,
    no_pager: bool,
    since: Option<String>,
    until: Option<String>,
    paths: Vec<PathBuf>,
}

fn review(journal: Option<PathBuf>, a: ReviewArgs) -> Result<u8, CliError> {
    let ReviewArgs { json, stat, color, no_pager, since, until, paths } = a;
    let s = open_session(journal)?;
    // What undo would not act on is shown as damaged here too, not as a change of the session's.
    let (j, _) = s.read_checked()?;
    let seq_of =
        |m: &Option<String>| -> Result<Option<u64>, CliError> { m.as_deref().map(|m| mark_seq(&s, m)).transpose() };
    let span = aether_journal::review::Span { after: seq_of(&since)?.unwrap_or(0), until: seq_of(&until)? };
    if span.until.is_some_and(|u| u <= span.after) {
        return Err(format!(
            "--until {} is not after --since {}",
            until.unwrap_or_default(),
            since.unwrap_or_default()
        )
        .into());
    }
    let limits: Vec<BPath> = paths.iter().map(|p| canonical_arg(p)).collect();
    let pb = progress_bar(j.records.len() as u64, "reviewing");
    let rv = aether_journal::review::review_span(&j, &s.blobs_dir(), &limits, span, ticker(&pb));
    pb.finish_and_clear();
    if json {
        output::emit(&output::review_json(&s, &rv));
        return Ok(0);
    }
    let tty = std::io::stdout().is_terminal();
    let colour = match color {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => tty && std::env::var_os("NO_COLOR").is_none(),
    };
    let text = output::review_text(&s, &rv, stat, colour);
    if tty && !no_pager {
        output::page(&text)
    } else {
        output::emit(&text)
    }
    Ok(0)
}

fn undo(
    journal: Option<PathBuf>,
    json: bool,
    mut opts: UndoOptions,
    select: impl FnOnce(&Session) -> Result<Option<Selection>, CliError>,
) -> Result<u8, CliError> {
    let s = open_session(journal)?;
    opts.select = select(&s)?;
    // Steps are printed as they end (a million of them kept for the end took most of the
    // undo's memory), so a bar is drawn only when they do not go to the same terminal.
    let pb = match std::io::stdout().is_terminal() {
        true => indicatif::ProgressBar::hidden(),
        false => progress_bar(0, if opts.dry_run { "planning" } else { "undoing" }),
    };
    let mut out = output::Stdout::new();
    let mut printer = output::ReportPrinter::new(&s, json, opts.dry_run, opts.select.is_some());
    let report = undo::undo_session_streaming(
        &s,
        &opts,
        &mut |done, total| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        },
        &mut |step| printer.step(&mut out, &step),
    );
    pb.finish_and_clear();
    let report = report?;
    printer.finish(&mut out, &report);
    out.finish();
    // Nothing to undo, and nothing left as it should not be.
    if report.selected == Some(0) && report.complete {
        return Ok(NOTHING_SELECTED);
    }
    Ok(if report.complete { 0 } else { EXIT_INCOMPLETE })
}

fn redo(journal: Option<PathBuf>, json: bool, opts: UndoOptions) -> Result<u8, CliError> {
    let s = open_session(journal)?;
    let report = undo::redo_session(&s, &opts)?;
    let text = if json { format!("{}\n", report.to_json()) } else { output::redo_text(&s, &report) };
    output::emit(&text);
    Ok(if report.complete { 0 } else { EXIT_INCOMPLETE })
}

fn keep(journal: Option<PathBuf>, forget: bool, json: bool) -> Result<u8, CliError> {
    let s = open_session(journal)?;
    let root = session::sessions_root();
    let id = s.header().id.clone();
    let freed = s.keep(forget, root.as_deref())?;
    if json {
        output::emit(&format!("{}\n", serde_json::json!({"id": id, "forgotten": forget, "bytes_freed": freed})));
    } else if forget {
        output::emit(&format!("forgot session {id}: deleted it entirely ({} freed)\n", output::size(freed)));
    } else {
        output::emit(&format!(
            "kept session {id}: released {} of captured contents; its journal stays as an audit log (`aether-journal keep --forget` deletes it)\n",
            output::size(freed)
        ));
    }
    Ok(0)
}

fn gc(
    older_than: Option<humantime::Duration>,
    max_size: Option<String>,
    dry_run: bool,
    json: bool,
) -> Result<u8, CliError> {
    if older_than.is_none() && max_size.is_none() {
        return Err("say what to collect: --older-than AGE, --max-size SIZE, or both".into());
    }
    let max = max_size.map(|m| parse_size(&m).map_err(|e| e.to_string())).transpose()?;
    let root = sessions_root()?;
    let removed = session::gc(&root, older_than.map(Into::into), max, dry_run);
    if json {
        output::emit(&format!("{}\n", serde_json::json!({"dry_run": dry_run, "removed": removed})));
    } else {
        output::emit(&output::gc_text(&removed, dry_run));
    }
    // Every session is tried; one that could not be removed makes the whole incomplete.
    Ok(if removed.iter().any(|c| c.error.is_some()) { EXIT_INCOMPLETE } else { 0 })
}
