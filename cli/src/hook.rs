//! `aether-journal hook HARNESS`: what an agent harness's hooks run, with the hook's JSON on
//! stdin. It keeps one session per harness session, makes the harness's shell commands join
//! it, marks the start and end of every turn, and journals the files the harness's own edit
//! tools are about to write (their writes happen in the harness's process, which nothing may
//! be able to see into).
//!
//! A hook never breaks the harness: whatever goes wrong, it exits 0, prints nothing the harness
//! would take as an answer or as context for the model, and writes what went wrong to
//! `hook-errors.log` in the state directory (and, when it has one, in the session).
//!
//! What this module cannot do: journal an edit a harness makes without announcing it to a hook
//! (a tool the hook configuration does not match), or mark a turn the harness does not report.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use aether_journal::config::{ENV_DIR, ENV_SESSION_ID, Settings};
use aether_journal::session::{self, Coverage, CoverageMode, CoverageReason, Durability, Header, Session};
use aether_journal_recorder::marks::{MarkError, MarkRequest, Marked, mark};
use clap::ValueEnum;
use serde_json::Value;

/// The harnesses whose hook points are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Harness {
    /// Claude Code (`~/.claude/settings.json` hooks).
    ClaudeCode,
    /// Codex CLI (`hooks.json`).
    Codex,
    /// Gemini CLI (`settings.json` hooks).
    Gemini,
}

impl Harness {
    /// The name used in session directories and the hook command line.
    pub fn name(self) -> &'static str {
        match self {
            Harness::ClaudeCode => "claude-code",
            Harness::Codex => "codex",
            Harness::Gemini => "gemini",
        }
    }
}

/// What one hook call asks for, whatever the harness calls it.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// The harness session starts (or resumes).
    Start,
    /// A turn starts: the user's prompt, and the harness's key for it.
    Prompt { text: String, key: Option<String> },
    /// A tool is about to write these files.
    Writes { tool: String, paths: Vec<String> },
    /// The turn ended.
    Stop { key: Option<String> },
    /// Nothing for us.
    Other,
}

/// The tool names that write files themselves, per harness.
fn edit_tool(harness: Harness, tool: &str) -> bool {
    match harness {
        Harness::ClaudeCode => matches!(tool, "Write" | "Edit" | "MultiEdit" | "NotebookEdit"),
        Harness::Codex => tool == "apply_patch",
        Harness::Gemini => matches!(tool, "write_file" | "replace" | "edit"),
    }
}

/// The files an `apply_patch` input names: its `*** Add File:`, `*** Update File:`,
/// `*** Delete File:` and `*** Move to:` lines.
pub fn patch_files(patch: &str) -> Vec<String> {
    const HEADS: [&str; 4] = ["*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: "];
    patch
        .lines()
        .filter_map(|l| HEADS.iter().find_map(|h| l.strip_prefix(h)))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Reads the event out of a hook's JSON.
fn event_of(harness: Harness, v: &Value) -> Event {
    let name = str_of(v, "hook_event_name").unwrap_or_default();
    let key = |field: &str| str_of(v, field).map(str::to_string);
    match (harness, name) {
        (_, "SessionStart") => Event::Start,
        (Harness::ClaudeCode, "UserPromptSubmit") => {
            Event::Prompt { text: key("prompt").unwrap_or_default(), key: key("prompt_id") }
        }
        (Harness::Codex, "UserPromptSubmit") => {
            Event::Prompt { text: key("prompt").unwrap_or_default(), key: key("turn_id") }
        }
        (Harness::Gemini, "BeforeAgent") => Event::Prompt { text: key("prompt").unwrap_or_default(), key: None },
        (Harness::ClaudeCode | Harness::Codex, "PreToolUse") | (Harness::Gemini, "BeforeTool") => {
            let tool = str_of(v, "tool_name").unwrap_or_default().to_string();
            if !edit_tool(harness, &tool) {
                return Event::Other;
            }
            let input = v.get("tool_input").cloned().unwrap_or(Value::Null);
            let mut paths: Vec<String> = ["file_path", "notebook_path", "path"]
                .iter()
                .filter_map(|k| str_of(&input, k).map(str::to_string))
                .collect();
            if harness == Harness::Codex {
                // The patch text, whatever the field holding it is called.
                let texts: Vec<&str> = match &input {
                    Value::String(s) => vec![s.as_str()],
                    Value::Object(m) => m.values().filter_map(Value::as_str).collect(),
                    _ => vec![],
                };
                paths.extend(texts.into_iter().flat_map(patch_files));
            }
            Event::Writes { tool, paths }
        }
        (Harness::ClaudeCode, "Stop") => Event::Stop { key: key("prompt_id") },
        (Harness::Codex, "Stop") => Event::Stop { key: key("turn_id") },
        (Harness::Gemini, "AfterAgent") => Event::Stop { key: None },
        _ => Event::Other,
    }
}

/// The session directory of a harness session: the one this process runs in (the harness
/// itself runs under `aether-journal run`), or one per harness session id under the state
/// directory.
fn session_dir(harness: Harness, v: &Value) -> Result<(PathBuf, bool), String> {
    if let Some(dir) = std::env::var_os(ENV_DIR).filter(|d| !d.is_empty()) {
        return Ok((PathBuf::from(dir), true));
    }
    let id = str_of(v, "session_id").ok_or("the hook's input has no session_id")?;
    let safe: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).take(120).collect();
    let root = session::sessions_root().ok_or("neither XDG_STATE_HOME nor HOME is set")?;
    Ok((root.join(format!("{}-{safe}", harness.name())), false))
}

/// The session, made if it does not exist yet.
fn open_or_create(harness: Harness, dir: &Path, cwd: &str) -> Result<Session, String> {
    if dir.join(session::HEADER_FILE).exists() {
        return Session::open(dir).map_err(|e| e.to_string());
    }
    let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut header = Header::new(id, vec![harness.name().into()], cwd.into(), "hook");
    header.coverage = Some(Coverage::libc(CoverageReason::PreloadOnly));
    match Session::create(dir, &header, Durability::of(&Settings::from_env().0)) {
        Ok(s) => Ok(s),
        // Two hooks at once: the other one made it.
        Err(_) if dir.join(session::HEADER_FILE).exists() => Session::open(dir).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The lines a Claude Code `SessionStart` hook appends to `$CLAUDE_ENV_FILE`, so that every
/// later shell command of the harness joins the session.
///
/// The harness sources the file inside the shell that runs the command, which started before
/// `LD_PRELOAD` was set: what that shell writes itself (`echo x > f`) would go unseen. So a
/// `bash -c` or `zsh -c` shell that does not have the shim loaded runs its command string
/// again, once, in a shell that does (`exec`: same arguments, same environment, the output
/// the same; only the process is new).
pub fn env_lines(shim: &Path, session: &Session) -> String {
    let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    format!(
        "export {ENV_DIR}={}\n\
         export {ENV_SESSION_ID}={}\n\
         export LD_PRELOAD={}\"${{LD_PRELOAD:+:$LD_PRELOAD}}\"\n\
         case \"$(cat /proc/$$/maps 2>/dev/null)\" in *libaether_journal*) ;; *)\n\
         \x20 if [ -z \"${{AETHER_JOURNAL_REEXEC:-}}\" ]; then export AETHER_JOURNAL_REEXEC=1\n\
         \x20   if [ -n \"${{BASH_EXECUTION_STRING:-}}\" ]; then exec \"$BASH\" -c \"$BASH_EXECUTION_STRING\" \"$0\" \"$@\"\n\
         \x20   elif [ -n \"${{ZSH_EXECUTION_STRING:-}}\" ]; then exec zsh -c \"$ZSH_EXECUTION_STRING\" \"$0\" \"$@\"; fi\n\
         \x20 fi ;;\nesac\n",
        q(session.dir()),
        q(Path::new(&session.header().id)),
        q(shim)
    )
}

/// The first line of a prompt, at most 120 characters.
fn label_of(prompt: &str) -> String {
    let line = prompt.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    let mut out: String = line.chars().take(120).collect();
    if line.chars().count() > 120 {
        out.push('…');
    }
    out
}

/// What the hook does for `event`; `Ok(Some(text))` is printed on stdout.
fn handle(harness: Harness, v: &Value, event: Event) -> Result<Option<String>, String> {
    if event == Event::Other {
        return Ok(None);
    }
    let (dir, inside) = session_dir(harness, v)?;
    let cwd = str_of(v, "cwd").unwrap_or("/");
    let s = open_or_create(harness, &dir, cwd)?;
    match event {
        Event::Start => {
            if let (Harness::ClaudeCode, Some(file), false) = (harness, std::env::var_os("CLAUDE_ENV_FILE"), inside) {
                let shim = crate::run::find_shim()?;
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&file)
                    .map_err(|e| format!("{}: {e}", PathBuf::from(&file).display()))?;
                f.write_all(env_lines(&shim, &s).as_bytes()).map_err(|e| e.to_string())?;
            }
            Ok(None)
        }
        Event::Prompt { text, key } => {
            let req = MarkRequest { name: None, label: Some(label_of(&text)).filter(|l| !l.is_empty()), key };
            mark(&s, &req).map_err(|e| e.to_string())?;
            Ok(None)
        }
        Event::Writes { tool, paths } => {
            // Under the supervisor the harness's own writes are seen as they happen.
            if inside && s.coverage().mode == CoverageMode::Syscalls {
                return Ok(None);
            }
            let abs: Vec<Vec<u8>> = paths
                .iter()
                .map(|p| {
                    use std::os::unix::ffi::OsStrExt;
                    let p = Path::new(p);
                    let p = if p.is_absolute() { p.to_path_buf() } else { Path::new(cwd).join(p) };
                    p.as_os_str().as_bytes().to_vec()
                })
                .collect();
            aether_journal_supervisor::outside::before_writes(s.dir(), &abs, &tool).map_err(|e| e.to_string())?;
            Ok(None)
        }
        Event::Stop { key } => {
            let marks = s.marks().map_err(|e| e.to_string())?;
            let Some(turn) = marks.iter().rev().find(|m| !m.name.ends_with("-end")) else { return Ok(None) };
            let req = MarkRequest {
                name: Some(format!("{}-end", turn.name)),
                label: None,
                key: key.map(|k| format!("{k}:end")),
            };
            let end = match mark(&s, &req) {
                Ok(Marked::New(m) | Marked::Again(m)) => m,
                // The turn was closed already (a Stop hook that runs again).
                Err(MarkError::NameTaken { .. }) => return Ok(None),
                Err(e) => return Err(e.to_string()),
            };
            let journal = s.read_journal().map_err(|e| e.to_string())?;
            let irreversible: Vec<String> = journal
                .records
                .iter()
                .filter(|r| r.seq > turn.seq && r.seq < end.seq && r.irreversible())
                .map(crate::output::describe_record)
                .collect();
            if irreversible.is_empty() || harness != Harness::ClaudeCode {
                return Ok(None);
            }
            let text = format!(
                "aether-journal: {} step(s) of {} cannot be undone: {}",
                irreversible.len(),
                turn.name,
                irreversible.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
            );
            Ok(Some(format!("{}\n", serde_json::json!({ "systemMessage": text }))))
        }
        Event::Other => Ok(None),
    }
}

/// Appends a line about a failed hook to `hook-errors.log` in the state directory and, when
/// known, the session.
fn note_failure(harness: Harness, v: &Value, why: &str) {
    let line = format!(
        "{} {} {}: {}\n",
        session::now_rfc3339_seconds(),
        harness.name(),
        str_of(v, "hook_event_name").unwrap_or("?"),
        why.replace('\n', " ")
    );
    let mut places: Vec<PathBuf> = session::sessions_root().into_iter().collect();
    if let Ok((dir, _)) = session_dir(harness, v)
        && dir.is_dir()
    {
        places.push(dir);
    }
    for dir in places {
        let _ = std::fs::create_dir_all(&dir);
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(dir.join("hook-errors.log")) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Runs the hook: always exit status 0.
pub fn hook(harness: Harness) -> u8 {
    let mut input = Vec::new();
    let read = std::io::stdin().take(64 << 20).read_to_end(&mut input);
    let v: Value =
        match read.map_err(|e| e.to_string()).and_then(|_| serde_json::from_slice(&input).map_err(|e| e.to_string())) {
            Ok(v) => v,
            Err(e) => {
                note_failure(harness, &Value::Null, &format!("the hook's input is not JSON: {e}"));
                return 0;
            }
        };
    let event = event_of(harness, &v);
    match std::panic::catch_unwind(|| handle(harness, &v, event)) {
        Ok(Ok(Some(text))) => {
            let _ = std::io::stdout().write_all(text.as_bytes());
        }
        Ok(Ok(None)) => {}
        Ok(Err(why)) => note_failure(harness, &v, &why),
        Err(_) => note_failure(harness, &v, "the hook panicked"),
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apply_patch_names_every_file_it_adds_updates_deletes_or_moves_to() {
        let patch = "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-x\n+y\n*** Move to: src/b.rs\n*** Add File: c.txt\n+hi\n*** Delete File: d.txt\n*** End Patch\n";
        assert_eq!(patch_files(patch), ["src/a.rs", "src/b.rs", "c.txt", "d.txt"]);
    }

    #[test]
    fn each_harness_s_events_are_read_from_its_own_field_names() {
        let v =
            serde_json::json!({"hook_event_name": "UserPromptSubmit", "prompt": "fix it\nplease", "prompt_id": "p1"});
        assert_eq!(
            event_of(Harness::ClaudeCode, &v),
            Event::Prompt { text: "fix it\nplease".into(), key: Some("p1".into()) }
        );
        let v = serde_json::json!({"hook_event_name": "UserPromptSubmit", "prompt": "x", "turn_id": "t9"});
        assert_eq!(event_of(Harness::Codex, &v), Event::Prompt { text: "x".into(), key: Some("t9".into()) });
        let v = serde_json::json!({"hook_event_name": "BeforeTool", "tool_name": "write_file", "tool_input": {"file_path": "/w/a"}});
        assert_eq!(
            event_of(Harness::Gemini, &v),
            Event::Writes { tool: "write_file".into(), paths: vec!["/w/a".into()] }
        );
        let v =
            serde_json::json!({"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}});
        assert_eq!(event_of(Harness::ClaudeCode, &v), Event::Other, "the shim sees shell commands");
    }

    #[test]
    fn a_label_is_the_prompt_s_first_line_cut_to_120_characters() {
        assert_eq!(label_of("\n  refactor the parser  \nthen test"), "refactor the parser");
        assert_eq!(label_of(&"é".repeat(130)).chars().count(), 121);
    }
}
