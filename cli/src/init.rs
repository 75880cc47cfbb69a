//! `aether-journal init HARNESS`: merges the hook configuration `aether-journal hook` needs
//! into the harness's settings file, idempotently, and shows the change as a diff.
//!
//! Only the entries whose command is this program's `hook HARNESS` are added or replaced;
//! every other setting and hook stays as it was, in its order. A file that is not a JSON
//! object is refused, never overwritten.
//!
//! What this module cannot do: turn a harness's hooks on where the harness needs more than a
//! settings entry (Codex also needs `codex_hooks = true` under `[features]` in its
//! `config.toml`: said, not done).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::hook::Harness;

/// Where the settings go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The user's own settings (every project).
    User,
    /// The current project's.
    Project,
}

/// The settings file of `harness` for `scope` (`home`: the user's home directory).
pub fn settings_path(harness: Harness, scope: Scope, home: &Path, project: &Path) -> PathBuf {
    let (dir, file) = match harness {
        Harness::ClaudeCode => (".claude", "settings.json"),
        Harness::Codex => (".codex", "hooks.json"),
        Harness::Gemini => (".gemini", "settings.json"),
    };
    match scope {
        Scope::User => home.join(dir).join(file),
        Scope::Project => project.join(dir).join(file),
    }
}

/// The events and tool matchers `harness` calls the hook for.
fn events(harness: Harness) -> Vec<(&'static str, Option<&'static str>)> {
    match harness {
        Harness::ClaudeCode => vec![
            ("SessionStart", None),
            ("UserPromptSubmit", None),
            ("PreToolUse", Some("Write|Edit|MultiEdit|NotebookEdit")),
            ("Stop", None),
        ],
        Harness::Codex => {
            vec![
                ("SessionStart", None),
                ("UserPromptSubmit", None),
                ("PreToolUse", Some("apply_patch")),
                ("Stop", None),
            ]
        }
        Harness::Gemini => vec![
            ("SessionStart", None),
            ("BeforeAgent", None),
            ("BeforeTool", Some("write_file|replace|edit")),
            ("AfterAgent", None),
        ],
    }
}

/// Whether a hook group runs our hook command (from this install or another one).
fn is_ours(group: &Value, command: &str) -> bool {
    let tail = command_tail(command);
    group["hooks"]
        .as_array()
        .is_some_and(|hs| hs.iter().any(|h| h["command"].as_str().is_some_and(|c| c.ends_with(&tail))))
}

/// `hook HARNESS`, the part of the command that names what it runs.
fn command_tail(command: &str) -> String {
    command.rsplit_once(" hook ").map(|(_, h)| format!(" hook {h}")).unwrap_or_else(|| command.to_string())
}

/// `settings` with our hooks merged in: the same value when they are there already.
pub fn merged(harness: Harness, settings: &Value, command: &str) -> Result<Value, String> {
    let mut out = settings.clone();
    let Some(obj) = out.as_object_mut() else { return Err("the settings file does not hold a JSON object".into()) };
    let hooks = obj.entry("hooks").or_insert_with(|| json!({}));
    let Some(hooks) = hooks.as_object_mut() else { return Err("its \"hooks\" is not a JSON object".into()) };
    for (event, matcher) in events(harness) {
        let mut group = json!({"hooks": [{"type": "command", "command": command, "timeout": 10}]});
        if let Some(m) = matcher {
            group["matcher"] = m.into();
        }
        let list = hooks.entry(event).or_insert_with(|| json!([]));
        let Some(list) = list.as_array_mut() else { return Err(format!("its hooks.{event} is not a list")) };
        match list.iter().position(|g| is_ours(g, command)) {
            Some(i) => list[i] = group,
            None => list.push(group),
        }
    }
    Ok(out)
}

/// Runs `init`: returns what to print.
pub fn init(harness: Harness, scope: Scope, dry_run: bool) -> Result<String, String> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).ok_or("HOME is not set")?;
    let project = std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let path = settings_path(harness, scope, Path::new(&home), &project);
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    let command = format!("'{}' hook {}", exe.display().to_string().replace('\'', "'\\''"), harness.name());
    let old_text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let old: Value = if old_text.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(&old_text).map_err(|e| format!("{} is not JSON ({e}): left as it is", path.display()))?
    };
    let new = merged(harness, &old, &command).map_err(|e| format!("{}: {e}: left as it is", path.display()))?;
    let mut new_text = serde_json::to_string_pretty(&new).map_err(|e| e.to_string())?;
    new_text.push('\n');
    let mut out = String::new();
    if new == old {
        out.push_str(&format!("{}: aether-journal's hooks are there already; nothing to change\n", path.display()));
    } else {
        let diff = similar::TextDiff::from_lines(&old_text, &new_text);
        let name = path.display().to_string();
        out.push_str(&diff.unified_diff().context_radius(3).header(&name, &name).to_string());
        if dry_run {
            out.push_str(&format!("(dry run: {} was not changed)\n", path.display()));
        } else {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            aether_journal::session::write_atomically(&path, new_text.trim_end().as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            out.push_str(&format!("wrote {}\n", path.display()));
        }
    }
    if harness == Harness::Codex {
        out.push_str("Codex runs hooks only with `codex_hooks = true` under `[features]` in ~/.codex/config.toml.\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_every_other_setting_and_hook_and_is_idempotent() {
        let cmd = "'/opt/aj/aether-journal' hook claude-code";
        let theirs = json!({"model": "x", "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "lint"}]}]}});
        let once = merged(Harness::ClaudeCode, &theirs, cmd).unwrap();
        assert_eq!(once["model"], "x");
        assert_eq!(once["hooks"]["PreToolUse"][0]["hooks"][0]["command"], "lint", "their hook stays first");
        assert_eq!(once["hooks"]["PreToolUse"][1]["matcher"], "Write|Edit|MultiEdit|NotebookEdit");
        assert_eq!(once["hooks"]["Stop"][0]["hooks"][0]["command"], cmd);
        assert_eq!(merged(Harness::ClaudeCode, &once, cmd).unwrap(), once, "a second init changes nothing");
        let moved = merged(Harness::ClaudeCode, &once, "'/usr/bin/aether-journal' hook claude-code").unwrap();
        assert_eq!(moved["hooks"]["Stop"].as_array().unwrap().len(), 1, "a new install replaces the old entry");
    }

    #[test]
    fn settings_that_are_not_an_object_are_refused() {
        assert!(merged(Harness::Gemini, &json!([1, 2]), "x hook gemini").is_err());
        assert!(merged(Harness::Gemini, &json!({"hooks": 3}), "x hook gemini").is_err());
    }
}
