//! Marks and turns: a session marked between the turns of an agent, rewound to any mark with
//! `undo --to`, reviewed from one with `review --since`, with real tools doing the work and the
//! user editing between turns outside the session.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;

/// Runs `script` with `sh -c` in the tree as a harness's shell tool does when its hooks joined
/// the session: the shim preloaded, the session named by AETHER_JOURNAL_DIR.
fn agent(s: &Scratch, session: &Path, script: &str) -> Output {
    let mut cmd = preloaded_sh(s, session, script);
    // The CLI is on PATH for scripts that mark from inside.
    let path = format!("{}:{}", artifacts().cli.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    cmd.env("PATH", path);
    let out = bounded(cmd, 60);
    assert!(out.status.success(), "agent step failed: {script}\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A session for a harness, made before its first turn (as its SessionStart hook does), in the
/// scratch state directory: what `sessions` lists.
fn harness_session(s: &Scratch) -> std::path::PathBuf {
    use aether_journal::session::{Coverage, CoverageReason, Header, Session};
    let id = aether_journal::session::new_session_id();
    let dir = s.root.join("state/aether-journal").join(&id);
    let mut header = Header::new(id, vec!["harness".into()], s.tree().as_path().into(), "harness");
    header.coverage = Some(Coverage::libc(CoverageReason::PreloadOnly));
    Session::create(&dir, &header, aether_journal::session::Durability::InKernel).expect("create the session");
    dir
}

/// Starts `python3` in the tree under the shim, joined to `session`: it runs `before`, then
/// waits until the test makes the returned `go` file, then runs `after` (the lines of both
/// may use `os`). Returns once `before` has run: a process of the session that lives across
/// whatever the test does meanwhile (a mark).
fn python_paused(s: &Scratch, session: &Path, before: &str, after: &str) -> (std::process::Child, std::path::PathBuf) {
    let (go, ready) = (s.root.join("go"), s.root.join("ready"));
    let py = format!(
        "import os,time\n{before}\nopen('{}','w').close()\nwhile not os.path.exists('{}'): time.sleep(0.01)\n{after}\n",
        ready.display(),
        go.display()
    );
    let mut cmd = Command::new(python());
    cmd.arg("-c").arg(&py).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd.env("LD_PRELOAD", &artifacts().shim).env("AETHER_JOURNAL_DIR", session);
    let child = cmd.spawn().expect("python");
    while !ready.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    (child, go)
}

/// `aether-journal SUBCOMMAND --json --journal SESSION ARGS...`, which must succeed: its JSON.
fn cli_json(s: &Scratch, subcommand: &str, session: &Path, args: &[&str]) -> serde_json::Value {
    let mut all: Vec<&OsStr> = vec![subcommand.as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()];
    all.extend(args.iter().map(OsStr::new));
    let out = s.cli(&all);
    assert!(out.status.success(), "{subcommand} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{subcommand} --json: {e}"))
}

/// `aether-journal mark --json` of `session` from outside it (a harness's hook): the mark's JSON.
fn mark(s: &Scratch, session: &Path, args: &[&str]) -> serde_json::Value {
    cli_json(s, "mark", session, args)
}

fn review_json(s: &Scratch, session: &Path, args: &[&str]) -> serde_json::Value {
    cli_json(s, "review", session, args)
}

/// The paths (relative to the tree, outside `.git`) a review lists in `section`, sorted.
fn listed(s: &Scratch, review: &serde_json::Value, section: &str) -> Vec<String> {
    let tree = format!("{}/", s.tree().display());
    let mut out: Vec<String> = review["review"][section]
        .as_array()
        .or_else(|| review[section].as_array())
        .unwrap_or_else(|| panic!("no {section} in {review}"))
        .iter()
        .filter_map(|e| e["path"].as_str().or_else(|| e["to"].as_str()))
        .map(|p| p.strip_prefix(&tree).unwrap_or(p).to_string())
        .filter(|p| !p.starts_with(".git"))
        .collect();
    out.sort();
    out
}

/// The outcome a report gives `path` (relative to the tree), with its cause's code.
fn outcome_of(s: &Scratch, report: &serde_json::Value, rel: &str) -> Vec<(String, String)> {
    let want = s.path(rel).display().to_string();
    report["outcomes"]
        .as_array()
        .expect("outcomes")
        .iter()
        .filter(|o| o["path"].as_str() == Some(&want))
        .map(|o| {
            (o["outcome"].as_str().unwrap_or("").to_string(), o["cause"]["code"].as_str().unwrap_or("").to_string())
        })
        .collect()
}

/// `undo --to MARK` (its dry run first, which must predict it) must be complete and leave the
/// tree exactly `want`.
fn assert_rewound_exactly(s: &Scratch, session: &Path, mark: &str, want: &std::collections::BTreeMap<Vec<u8>, Entry>) {
    let (code, report) = s.undo_json_with(session, &["--to", mark]);
    assert_same_tree(want, &manifest(&s.tree()));
    assert_complete(code, &report);
}

/// The paths the user edits between turns in the scenario tests: a file the agent made in
/// turn 4 (and its directory, whose entries the undo then cannot all put back), and one the
/// agent never touched.
const USERS_OWN: [&str; 3] = ["notes", "notes/notes.txt", "user.txt"];

/// `undo --to MARK` (its dry run first, which must predict it), which leaves the user's own
/// edit of a file the agent made alone: a conflict, exit 3. The tree must then be `want`,
/// except for [`USERS_OWN`], which keep what they hold now.
fn rewind_keeping_the_users_edits(
    s: &Scratch,
    session: &Path,
    mark: &str,
    want: &std::collections::BTreeMap<Vec<u8>, Entry>,
) {
    let (code, report) = s.undo_json_with(session, &["--to", mark]);
    assert_eq!(code, 3, "a conflict makes the undo incomplete: {report}");
    assert_eq!(
        outcome_of(s, &report, "notes/notes.txt"),
        [("conflict".to_string(), "changed_since_session".to_string())],
        "{report}"
    );
    let mut want = want.clone();
    let now = manifest(&s.tree());
    for kept in USERS_OWN {
        want.insert(kept.as_bytes().to_vec(), now[kept.as_bytes()].clone());
    }
    assert_same_tree(&want, &now);
}

fn git_fixture(s: &Scratch) {
    s.sh("mkdir -p src docs notes && printf 'alpha\\nbeta\\ngamma\\n' > src/main.txt && \
         for i in 1 2 3; do echo doc $i > docs/d$i.md; done && echo mine > user.txt && \
         git init -q . && git add -A && git -c user.name=t -c user.email=t@e commit -q -m init");
}

/// Five turns of an agent with real tools, the user editing between turns outside the
/// session; then rewinds to turn 3 and to turn 1.
#[test]
fn an_undo_to_a_mark_puts_back_the_tree_of_that_turn_and_leaves_the_user_s_own_edits_alone() {
    let s = scratch!();
    git_fixture(&s);
    let session = harness_session(&s);
    let turns = [
        "sed -i 's/beta/BETA/' src/main.txt && echo one > src/new1.txt",
        "rm -rf docs && mkdir -p build/out && echo obj > build/out/a.o && git add -A && \
         git -c user.name=a -c user.email=a@e commit -q -m turn2",
        "python3 -c \"open('src/main.txt','a').write('delta\\n'); open('src/gen.py','w').write('x=1\\n')\" && \
         mv src/new1.txt src/renamed.txt && chmod 600 src/gen.py",
        "echo first > notes/notes.txt && sed -i 's/alpha/ALPHA/' src/main.txt && rm -f src/renamed.txt",
        "git rm -q -r --cached build && rm -rf build && echo last > src/last.txt",
    ];
    let mut at_start = Vec::new();
    let mut marks = Vec::new();
    for (i, script) in turns.iter().enumerate() {
        let n = i + 1;
        at_start.push(manifest(&s.tree()));
        let m = mark(&s, &session, &["--label", &format!("prompt {n}")]);
        assert_eq!(m["name"], format!("turn-{n}"), "default names count the turns");
        marks.push(m);
        agent(&s, &session, script);
        // The end of the turn (the harness's Stop hook).
        mark(&s, &session, &[&format!("end-{n}")]);
        if n == 4 {
            // Between turns 4 and 5 the user edits a file the agent made, and one it never touched.
            s.sh("echo 'user line' >> notes/notes.txt && echo 'also mine' >> user.txt");
        }
    }
    let logged = s.mark_names(&session);
    assert_eq!(logged.len(), 10, "every mark is in the log: {logged:?}");

    // The net effect of turns 3 to 5: from the tree at the start of turn 3 to now.
    let rv = review_json(&s, &session, &["--since", "turn-3"]);
    assert_eq!(listed(&s, &rv, "created"), ["notes/notes.txt", "src/gen.py", "src/last.txt"]);
    assert_eq!(listed(&s, &rv, "deleted"), ["build", "build/out", "build/out/a.o", "src/new1.txt"]);
    assert!(listed(&s, &rv, "modified").contains(&"src/main.txt".to_string()), "{rv}");
    // Turn 2 alone, between two marks: what it removed and made, nothing of the later turns.
    let rv2 = review_json(&s, &session, &["--since", "turn-2", "--until", "end-2"]);
    assert_eq!(listed(&s, &rv2, "created"), ["build", "build/out", "build/out/a.o"]);
    assert!(listed(&s, &rv2, "deleted").contains(&"docs/d1.md".to_string()), "{rv2}");
    assert!(!listed(&s, &rv2, "created").contains(&"src/gen.py".to_string()));

    // Rewind to the start of turn 3: exact for the agent's paths; the user's edit of a file the
    // agent made in turn 4 is left alone and named, and the file the agent never touched keeps
    // the user's edit.
    rewind_keeping_the_users_edits(&s, &session, "turn-3", &at_start[2]);
    assert_eq!(std::fs::read_to_string(s.path("notes/notes.txt")).unwrap(), "first\nuser line\n");

    // Then to the start of turn 1: every turn's work is gone, the user's edits stay.
    rewind_keeping_the_users_edits(&s, &session, "turn-1", &at_start[0]);
    assert_eq!(std::fs::read_to_string(s.path("user.txt")).unwrap(), "mine\nalso mine\n");
}

/// A file the session made (or copied whole) before a mark carries no prior state of its own
/// when it is next changed; after the mark it must be captured again.
#[test]
fn a_file_the_session_made_before_a_mark_is_captured_again_when_a_later_turn_rewrites_it() {
    let s = scratch!();
    let session = s.session("session");
    agent(&s, &session, "printf 'made in turn one\\n' > made.txt && mkdir d && echo x > d/f && chmod 640 d/f");
    let at_mark = manifest(&s.tree());
    mark(&s, &session, &[]);
    agent(&s, &session, "printf 'rewritten\\n' > made.txt && echo y > d/f && chmod 600 d/f && touch -d 2001-01-01 d/f");
    assert_rewound_exactly(&s, &session, "turn-1", &at_mark);
}

/// A mark made by a process of the session (a harness hook, when the harness itself runs
/// under `aether-journal run`) goes through the shim: the store stays out of the process's
/// reach, nothing is refused, and the undo to it is exact.
#[test]
fn a_mark_made_from_inside_a_supervised_session_goes_through_the_shim_and_is_exact() {
    let s = scratch!();
    s.sh("echo keep > kept.txt");
    let session = s.session("session");
    let cli = artifacts().cli.display().to_string();
    let script = format!(
        "echo before > a.txt && {cli} mark inside-1 --label 'from inside' >/dev/null && echo after > b.txt && \
         echo changed > kept.txt && mkdir sub && echo z > sub/z"
    );
    let before_mark_tree = {
        // The tree at the mark, rebuilt: a.txt made, nothing else yet.
        let t = scratch!("expected");
        t.sh("echo keep > kept.txt && echo before > a.txt");
        t
    };
    s.run_ok(&session, &["sh", "-c", &script]);
    let log = s.log_json(&session);
    let records = log["records"].as_array().unwrap();
    let m = records.iter().find(|r| r["kind"] == "mark").expect("the mark is journaled");
    assert_eq!(m["op"]["name"], "inside-1");
    assert_eq!(m["prog"].as_str().unwrap(), cli, "made by the CLI process inside the session");
    assert!(!records.iter().any(|r| r["kind"] == "refused"), "nothing was refused: {log}");
    let (code, report) = s.undo_json_with(&session, &["--to", "inside-1"]);
    assert_complete(code, &report);
    let strip = |m: std::collections::BTreeMap<Vec<u8>, Entry>| -> Vec<(Vec<u8>, String)> {
        m.into_iter().map(|(k, e)| (k, e.content)).collect()
    };
    assert_eq!(strip(manifest(&s.tree())), strip(manifest(&before_mark_tree.tree())));
}

/// A process that holds a file open for writing across a mark writes through that descriptor
/// unjournaled: an undo to the mark names the file and is incomplete.
#[test]
fn a_file_held_open_for_writing_across_a_mark_is_named_by_the_undo_to_it() {
    let s = scratch!();
    let session = s.session("session");
    let (mut child, go) = python_paused(
        &s,
        &session,
        "f=open('log.txt','w')\nf.write('one\\n'); f.flush()",
        "f.write('two\\n'); f.close()",
    );
    let m = mark(&s, &session, &[]);
    std::fs::write(&go, b"").unwrap();
    assert!(child.wait().unwrap().success());
    let held = s.log_json(&session)["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "mark")
        .map(|r| r["op"]["held"].clone())
        .unwrap();
    assert_eq!(held, serde_json::json!([s.path("log.txt").display().to_string()]), "{m}");
    let (code, report) = s.undo_json_with(&session, &["--to", "turn-1"]);
    assert_eq!(code, 3, "{report}");
    assert_eq!(outcome_of(&s, &report, "log.txt"), [("skipped".to_string(), "held_open_at_mark".to_string())]);
}

/// Mark names: unique per session, a key makes a retried mark the same mark, and an unknown
/// mark is an error that lists the session's marks.
#[test]
fn a_mark_s_name_is_unique_its_key_makes_a_retry_the_same_mark_and_an_unknown_one_is_named() {
    let s = scratch!();
    let session = harness_session(&s);
    agent(&s, &session, "echo a > a");
    let first = mark(&s, &session, &["--key", "prompt-7", "--label", "fix the build"]);
    let again = mark(&s, &session, &["--key", "prompt-7"]);
    assert_eq!((first["seq"].clone(), again["new"].clone()), (again["seq"].clone(), serde_json::json!(false)));
    let named = mark(&s, &session, &["setup"]);
    assert_eq!(named["name"], "setup");
    let dup = s.cli(&["mark".as_ref(), "--journal".as_ref(), session.as_os_str(), "setup".as_ref()]);
    assert_eq!(dup.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&dup.stderr).contains("has a mark \"setup\" already"), "{dup:?}");
    assert_eq!(mark(&s, &session, &[])["name"], "turn-2", "the next default name");
    let unknown =
        s.cli(&["undo".as_ref(), "--to".as_ref(), "nope".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert_eq!(unknown.status.code(), Some(1));
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(err.contains("no mark \"nope\"") && err.contains("turn-1, setup, turn-2"), "{err}");
    let tree = s.cli(&["log".as_ref(), "--tree".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    let tree = String::from_utf8_lossy(&tree.stdout);
    assert!(tree.contains(&format!("-- #{} MARK setup", named["seq"])), "{tree}");
    let sessions = s.cli(&["sessions".as_ref(), "--json".as_ref()]);
    let list: serde_json::Value = serde_json::from_slice(&sessions.stdout).unwrap();
    assert_eq!(list[0]["marks"], serde_json::json!(["turn-1", "setup", "turn-2"]), "{list}");
}

/// A process alive across a mark that changes, after it, a file it made before it (through a
/// descriptor it still holds, read-only) must journal that change: the mark made its
/// knowledge that the file is journaled whole stale.
#[test]
fn a_process_alive_across_a_mark_journals_again_what_it_knew_was_journaled_before_it() {
    let s = scratch!();
    let session = harness_session(&s);
    let (mut child, go) = python_paused(
        &s,
        &session,
        "fd=os.open('made.txt', os.O_CREAT|os.O_RDONLY, 0o644)",
        "os.fchmod(fd, 0o600)\nos.close(fd)",
    );
    let at_mark = manifest(&s.tree());
    mark(&s, &session, &[]);
    std::fs::write(&go, b"").unwrap();
    assert!(child.wait().unwrap().success());
    assert_ne!(manifest(&s.tree()), at_mark, "the process changed the file after the mark");
    assert_rewound_exactly(&s, &session, "turn-1", &at_mark);
}

/// A session that `run` sealed and that processes joined afterwards (a harness's shell tool,
/// through the same session directory): the paths those processes changed are checked against
/// their newer records, not the seal that predates them.
#[test]
fn paths_changed_after_the_seal_are_not_judged_by_the_seal() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo one > a && mkdir d && echo x > d/f"]);
    mark(&s, &session, &[]);
    agent(&s, &session, "echo two >> a && rm -r d && echo new > b");
    let at_mark = manifest(&s.tree());
    mark(&s, &session, &[]);
    agent(&s, &session, "echo three > a && echo c > c");
    assert_rewound_exactly(&s, &session, "turn-2", &at_mark);
}

/// Runs `aether-journal hook claude-code` with `input` on stdin (and `CLAUDE_ENV_FILE`), as
/// Claude Code runs a command hook: it must exit 0 and print nothing unless asked.
fn claude_hook(s: &Scratch, env_file: &Path, input: serde_json::Value) -> Output {
    hook_of(s, "claude-code", input, &[("CLAUDE_ENV_FILE", env_file.as_os_str())])
}

/// Five turns of a scripted Claude Code session driven through the real hook command with the
/// harness's documented JSON: each turn an edit-tool write the test makes itself without the
/// shim (as the harness's own process, which nothing sees into, does), shell commands that
/// join the session through `CLAUDE_ENV_FILE`, and a user edit between turns outside it.
#[test]
fn a_claude_code_session_driven_through_its_hooks_rewinds_to_any_turn() {
    let s = scratch!();
    git_fixture(&s);
    let env_file = s.root.join("claude-env");
    let tree = s.tree().display().to_string();
    let base = |event: &str| serde_json::json!({"session_id": "7f3c-aa", "transcript_path": "/dev/null", "cwd": tree, "hook_event_name": event});
    let mut start = base("SessionStart");
    start["source"] = "startup".into();
    let out = claude_hook(&s, &env_file, start);
    assert!(out.stdout.is_empty(), "SessionStart's stdout would become the model's context");
    let exports = std::fs::read_to_string(&env_file).expect("the hook wrote the env file");
    assert!(exports.contains("AETHER_JOURNAL_DIR=") && exports.contains("LD_PRELOAD="), "{exports}");
    let session = s.root.join("state/aether-journal/claude-code-7f3c-aa");
    // The harness's Bash tool: a fresh shell that sources the env file first.
    let bash = |script: &str| {
        let mut cmd = Command::new("bash");
        cmd.arg("-c").arg(format!(". '{}'; {script}", env_file.display())).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        let out = bounded(cmd, 60);
        assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let turns: [(&str, &str, &str); 5] = [
        ("src/plan.md", "step one\n", "sed -i 's/beta/BETA/' src/main.txt && echo one > src/new1.txt"),
        (
            "src/main.txt",
            "rewritten by the edit tool\n",
            "rm -rf docs && git add -A && git -c user.name=a -c user.email=a@e commit -q -m t2",
        ),
        (
            "src/plan.md",
            "step two\n",
            "python3 -c \"open('src/gen.py','w').write('x=1\\n')\" && mv src/new1.txt src/renamed.txt",
        ),
        ("notes/notes.txt", "first\n", "sed -i 's/step/STEP/' src/plan.md && rm -f src/renamed.txt"),
        (
            "src/last.txt",
            "last\n",
            "rm -rf src/gen.py && git add -A && git -c user.name=a -c user.email=a@e commit -q -m t5",
        ),
    ];
    let mut at_start = Vec::new();
    for (i, (edit, content, script)) in turns.iter().enumerate() {
        let n = i + 1;
        at_start.push(manifest(&s.tree()));
        let mut prompt = base("UserPromptSubmit");
        prompt["prompt"] = format!("turn {n}: do the thing\nwith details").into();
        prompt["prompt_id"] = format!("p-{n}").into();
        assert!(claude_hook(&s, &env_file, prompt.clone()).stdout.is_empty());
        // A retried hook marks once.
        claude_hook(&s, &env_file, prompt);
        let mut pre = base("PreToolUse");
        pre["prompt_id"] = format!("p-{n}").into();
        pre["tool_name"] = "Write".into();
        pre["tool_use_id"] = format!("tu-{n}").into();
        pre["tool_input"] = serde_json::json!({"file_path": s.path(edit).display().to_string(), "content": content});
        assert!(claude_hook(&s, &env_file, pre).stdout.is_empty());
        std::fs::write(s.path(edit), content).unwrap();
        bash(script);
        let mut stop = base("Stop");
        stop["prompt_id"] = format!("p-{n}").into();
        stop["stop_hook_active"] = false.into();
        claude_hook(&s, &env_file, stop);
        if n == 4 {
            s.sh("echo 'user line' >> notes/notes.txt && echo 'also mine' >> user.txt");
        }
    }
    let marks = s.mark_names(&session);
    let want: Vec<String> = (1..=5).flat_map(|n| [format!("turn-{n}"), format!("turn-{n}-end")]).collect();
    assert_eq!(marks, want);

    let rv = review_json(&s, &session, &["--since", "turn-3"]);
    assert_eq!(listed(&s, &rv, "created"), ["notes/notes.txt", "src/last.txt"], "{rv}");
    assert!(listed(&s, &rv, "modified").contains(&"src/plan.md".to_string()), "{rv}");
    assert!(listed(&s, &rv, "deleted").contains(&"src/new1.txt".to_string()), "{rv}");

    let before_undo = manifest(&s.tree());
    rewind_keeping_the_users_edits(&s, &session, "turn-3", &at_start[2]);

    // Take the rewind back: the tree as it was just before it.
    let (code, report) = redo_json(&s, &session);
    assert_complete(code, &report);
    assert_same_tree(&before_undo, &manifest(&s.tree()));

    rewind_keeping_the_users_edits(&s, &session, "turn-1", &at_start[0]);
    assert!(!s.root.join("state/aether-journal/hook-errors.log").exists(), "no hook failed");
}

/// A hook given something it cannot use (not JSON, no session id) still exits 0, prints
/// nothing, and says what went wrong in hook-errors.log.
#[test]
fn a_hook_that_cannot_do_its_work_exits_0_prints_nothing_and_logs_why() {
    let s = scratch!();
    let env_file = s.root.join("env");
    let out = claude_hook(&s, &env_file, serde_json::json!({"hook_event_name": "UserPromptSubmit", "prompt": "x"}));
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    let log = std::fs::read_to_string(s.root.join("state/aether-journal/hook-errors.log")).unwrap();
    assert!(log.contains("claude-code UserPromptSubmit: the hook's input has no session_id"), "{log}");
}

/// `init claude-code` merges the hooks into the user's settings, keeping theirs, shows the
/// diff, writes nothing on a dry run and nothing new the second time; the command it writes
/// is the hook that works.
#[test]
fn init_merges_the_hooks_into_the_harness_settings_once_and_the_written_command_runs() {
    let s = scratch!();
    let home = s.root.join("home");
    let settings = home.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    std::fs::write(&settings, r#"{"model": "opus", "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "lint"}]}]}}"#).unwrap();
    let init = |args: &[&str]| {
        let mut cmd = Command::new(&artifacts().cli);
        cmd.arg("init").arg("claude-code").args(args).env("HOME", &home).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let original = std::fs::read_to_string(&settings).unwrap();
    let dry = init(&["--dry-run"]);
    assert!(dry.contains("+") && dry.contains("hook claude-code") && dry.contains("dry run"), "{dry}");
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), original, "a dry run changes nothing");
    assert!(init(&[]).contains("wrote"));
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(written["model"], "opus");
    assert_eq!(written["hooks"]["PreToolUse"][0]["hooks"][0]["command"], "lint");
    assert!(init(&[]).contains("nothing to change"));
    // The harness runs the command through a shell, with the hook's JSON on stdin.
    let command = written["hooks"]["UserPromptSubmit"][0]["hooks"][0]["command"].as_str().unwrap().to_string();
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(&command).current_dir(s.tree()).stdin(std::process::Stdio::piped());
    isolate(&mut cmd, &s.root);
    let mut child = cmd.spawn().unwrap();
    use std::io::Write as _;
    let input = serde_json::json!({"session_id": "s1", "cwd": s.tree(), "hook_event_name": "UserPromptSubmit", "prompt": "hello", "prompt_id": "p1"});
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    let session = s.root.join("state/aether-journal/claude-code-s1");
    let log = s.log_json(&session);
    assert!(
        log["records"].as_array().unwrap().iter().any(|r| r["kind"] == "mark" && r["op"]["label"] == "hello"),
        "{log}"
    );
}

/// Undo, redo, undo again: each exact, with real tools that rename directories, rewrite files
/// in place, remove trees, change modes and extended attributes; a redo while nothing is left
/// to redo is an error that says so.
#[test]
fn undo_redo_and_undo_again_are_each_exact() {
    let s = scratch!();
    s.sh("mkdir -p src/lib docs && for i in 1 2 3; do echo line $i > src/lib/f$i.txt; done && echo d > docs/a.md && \
          echo keep > keep.txt && tar cf ../src.tar src");
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(
        &session,
        &[
            "sh",
            "-c",
            "sed -i 's/line/LINE/' src/lib/f1.txt && mv src/lib src/core && rm -rf docs && chmod 600 keep.txt && \
             setfattr -n user.tag -v v1 keep.txt && mkdir -p out && tar xf ../src.tar -C out && echo new > new.txt && \
             ln -s keep.txt link && printf 'rewritten' > src/core/f2.txt",
        ],
    );
    let after_session = manifest(&s.tree());
    assert_ne!(before, after_session);
    let (code, report) = s.undo_json(&session);
    assert_complete(code, &report);
    assert_same_tree(&before, &manifest(&s.tree()));
    let (code, report) = redo_json(&s, &session);
    assert_complete(code, &report);
    assert_same_tree(&after_session, &manifest(&s.tree()));
    let (code, report) = s.undo_json(&session);
    assert_complete(code, &report);
    assert_same_tree(&before, &manifest(&s.tree()));
    let (code, report) = redo_json(&s, &session);
    assert_complete(code, &report);
    assert_same_tree(&after_session, &manifest(&s.tree()));
    // Both undos are taken back: nothing is left to redo.
    let out = s.cli(&["redo".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no undo of this session to take back"), "{out:?}");
}

/// The files an undo removes are kept for `redo`: a small file with one name as a copy in the
/// undo's pack (no file of its own in the store), any other as its inode (moved into the store),
/// and either comes back from `redo` exactly, an inherited ACL and a set-back time included.
#[test]
fn small_files_an_undo_removes_share_one_pack_and_come_back_from_redo_exactly() {
    crate::fidelity::require("setfacl");
    let s = scratch!();
    // Files made in `d` inherit an access ACL from its default one (an xattr no record sets).
    s.sh("mkdir d && setfacl -d -m u:65534:rw d");
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(
        &session,
        &[
            "sh",
            "-c",
            "for i in $(seq 1 50); do echo $i > d/f$i; done; : > d/empty; head -c 40000 /dev/zero > d/big; \
             chmod 604 d/f7; ln d/f9 d/f9.link",
        ],
    );
    let after = manifest(&s.tree());
    assert!(xattr_names(&s.path("d/f1")).contains("system.posix_acl_access"), "the ACL was inherited");
    let (code, report) = s.undo_json(&session);
    assert_complete(code, &report);
    assert_same_tree(&before, &manifest(&s.tree()));
    // One pack for the 48 small files with one name; `big` (over the copy size), `f7` (named
    // by its chmod's record) and `f9` (two names) each kept as itself.
    let mut kept = Vec::new();
    for shard in std::fs::read_dir(session.join("undos/1/blobs")).unwrap() {
        kept.extend(std::fs::read_dir(shard.unwrap().path()).unwrap().map(|e| e.unwrap().path()));
    }
    assert_eq!(kept.len(), 1 + 4, "{kept:?}");
    let (code, report) = redo_json(&s, &session);
    assert_complete(code, &report);
    assert_same_tree(&after, &manifest(&s.tree()));
    let (code, report) = s.undo_json(&session);
    assert_complete(code, &report);
    assert_same_tree(&before, &manifest(&s.tree()));
}

/// The names of `p`'s extended attributes.
fn xattr_names(p: &Path) -> String {
    let mut names = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(p, &mut names[..]).unwrap_or(0);
    String::from_utf8_lossy(&names[..n]).into_owned()
}

/// `undo --no-redo` keeps no journal of itself: nothing for `redo` to take back.
#[test]
fn an_undo_without_its_journal_cannot_be_redone_and_says_so() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo a > a"]);
    let (code, report) = s.undo_json_with(&session, &["--no-redo"]);
    assert_complete(code, &report);
    assert!(!session.join("undos").exists(), "no journal of the undo");
    let out = s.cli(&["redo".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no undo of this session to take back"));
}

/// A file changed after an undo is not overwritten by the redo: a conflict, named.
#[test]
fn a_redo_leaves_alone_what_changed_since_the_undo() {
    let s = scratch!();
    s.sh("echo v1 > f");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo v2 > f && echo made > g"]);
    let (code, report) = s.undo_json(&session);
    assert_complete(code, &report);
    s.sh("echo mine > f");
    let (code, report) = redo_json(&s, &session);
    assert_eq!(code, 3, "{report}");
    assert_eq!(outcome_of(&s, &report, "f"), [("conflict".to_string(), "changed_since_session".to_string())]);
    assert_eq!(std::fs::read_to_string(s.path("f")).unwrap(), "mine\n");
    assert_eq!(std::fs::read_to_string(s.path("g")).unwrap(), "made\n", "the rest is taken back");
}

/// `doctor --json` names each feature it checked, with what it found; a check that cannot
/// pass here (a second supervisor, a directory on another file system) says no.
#[test]
fn doctor_names_each_feature_it_checked_and_says_no_where_one_is_missing() {
    let s = scratch!();
    let doctor = |args: &[&OsStr]| {
        let mut all: Vec<&OsStr> = vec!["doctor".as_ref(), "--json".as_ref()];
        all.extend_from_slice(args);
        let out = s.cli(&all);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), v)
    };
    let by_name = |v: &serde_json::Value, name: &str| -> serde_json::Value {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {v}"))
    };
    let (code, v) = doctor(&[s.tree().as_os_str()]);
    let names: Vec<&str> = v["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "seccomp_user_notification",
            "wait_killable_recv",
            "pidfd_getfd",
            "process_vm_readv",
            "birth_times",
            "reflink",
            "same_file_system",
            "shim",
            "state_dir"
        ]
    );
    assert!(v["checks"].as_array().unwrap().iter().all(|c| !c["detail"].as_str().unwrap().is_empty()));
    assert_eq!(code, Some(0), "this machine has every feature a session needs: {v}");
    assert_eq!(v["coverage"], "syscalls");
    assert_eq!(by_name(&v, "same_file_system")["ok"], true, "the scratch tree and state are on one file system");
    // /dev/shm is a tmpfs of its own.
    let (_, shm) = doctor(&["/dev/shm".as_ref()]);
    assert_eq!(by_name(&shm, "same_file_system")["ok"], false, "{shm}");
    // Under a supervisor, a second one cannot listen.
    let cli = artifacts().cli.display().to_string();
    let out = s.run(&s.session("session"), &[&cli, "doctor", "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let inside: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sc = by_name(&inside, "seccomp_user_notification");
    assert_eq!(sc["ok"], false);
    assert!(sc["detail"].as_str().unwrap().contains("EBUSY"), "{sc}");
    assert_eq!(inside["coverage"], "libc");
}

/// `cargo install --path cli` into a scratch root gives a tool that works with nothing
/// else installed: the shim is carried inside it, written out under the data directory with
/// its hash checked, and `run` then `undo` work with only that root on PATH.
#[test]
fn cargo_install_gives_a_cli_that_runs_and_undoes_with_nothing_else_installed() {
    let s = scratch!();
    let root = s.root.join("root");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-target");
    let mut install = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    install
        .args(["install", "--quiet", "--locked", "--debug", "--path", "cli", "--root"])
        .arg(&root)
        .current_dir(repo_root())
        .env("CARGO_TARGET_DIR", &target)
        // A debug build (quicker to make) that embeds the shim as a release build does.
        .env("AETHER_JOURNAL_EMBED_SHIM", "1");
    let out = bounded(install, 1200);
    assert!(out.status.success(), "cargo install failed: {}", String::from_utf8_lossy(&out.stderr));
    let bin: Vec<_> = std::fs::read_dir(root.join("bin")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(bin, ["aether-journal"], "one program, the shim inside it");
    s.sh("echo orig > f && mkdir d && echo z > d/z");
    let before = manifest(&s.tree());
    let home = s.root.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let script = "aether-journal run -- sh -c 'echo new > f && rm -r d && echo x > g' && aether-journal undo --json > ../undo.json";
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(script).current_dir(s.tree()).env_clear();
    cmd.env("PATH", format!("{}:/usr/bin:/bin", root.join("bin").display())).env("HOME", &home);
    let out = bounded(cmd, 120);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(s.root.join("undo.json")).unwrap()).unwrap();
    assert_complete(0, &report);
    assert_same_tree(&before, &manifest(&s.tree()));
    let shims: Vec<_> = std::fs::read_dir(home.join(".local/share/aether-journal")).unwrap().collect();
    assert_eq!(shims.len(), 1, "the shim was written out once");
}

/// Runs `aether-journal hook HARNESS` with `input` on stdin, in the scratch tree, with `env`
/// added to its environment, as a harness runs a command hook: it must always exit 0.
fn hook_of(s: &Scratch, harness: &str, input: serde_json::Value, env: &[(&str, &OsStr)]) -> Output {
    use std::io::Write as _;
    let mut cmd = Command::new(&artifacts().cli);
    cmd.args(["hook", harness]).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd.envs(env.iter().copied());
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hook");
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Codex: turns keyed by `turn_id`, and the files an `apply_patch` names journaled before the
/// harness (a static binary nothing sees into) applies it; Gemini: `BeforeAgent`, `BeforeTool`
/// of `write_file`, `AfterAgent`. Each rewinds to its first turn exactly.
#[test]
fn codex_and_gemini_turns_and_edit_tools_are_journaled_through_their_own_hooks() {
    for harness in ["codex", "gemini"] {
        let s = scratch!(harness);
        s.sh("mkdir src && echo 'fn main() {}' > src/main.rs && echo old > src/gone.rs");
        let tree = s.tree().display().to_string();
        let base = |event: &str| serde_json::json!({"session_id": "s-9", "cwd": tree, "hook_event_name": event, "transcript_path": null});
        let (prompt, tool, stop) = if harness == "codex" {
            ("UserPromptSubmit", "PreToolUse", "Stop")
        } else {
            ("BeforeAgent", "BeforeTool", "AfterAgent")
        };
        let mut at_start = Vec::new();
        for n in 1..=2 {
            at_start.push(manifest(&s.tree()));
            let mut p = base(prompt);
            p["prompt"] = format!("turn {n}").into();
            p["turn_id"] = format!("t{n}").into();
            assert!(hook_of(&s, harness, p, &[]).stdout.is_empty());
            let mut t = base(tool);
            if harness == "codex" {
                t["tool_name"] = "apply_patch".into();
                let patch = format!(
                    "*** Begin Patch\n*** Update File: src/main.rs\n@@\n-fn main() {{}}\n+fn main() {{ {n} }}\n*** Add File: src/new{n}.rs\n+x\n*** Delete File: src/gone.rs\n*** End Patch\n"
                );
                t["tool_input"] = serde_json::json!({ "input": patch });
            } else {
                t["tool_name"] = "write_file".into();
                t["tool_input"] = serde_json::json!({"file_path": "src/main.rs", "content": "x"});
            }
            hook_of(&s, harness, t, &[]);
            // The harness applies the edit itself, where nothing sees it.
            std::fs::write(s.path("src/main.rs"), format!("fn main() {{ {n} }}\n")).unwrap();
            if harness == "codex" {
                std::fs::write(s.path(&format!("src/new{n}.rs")), "x\n").unwrap();
                let _ = std::fs::remove_file(s.path("src/gone.rs"));
            }
            let mut e = base(stop);
            e["turn_id"] = format!("t{n}").into();
            hook_of(&s, harness, e, &[]);
        }
        let session = s.root.join(format!("state/aether-journal/{harness}-s-9"));
        assert_rewound_exactly(&s, &session, "turn-2", &at_start[1]);
        assert_rewound_exactly(&s, &session, "turn-1", &at_start[0]);
    }
}

/// A client of `aether-journal mcp` over stdio (newline-delimited JSON-RPC).
struct Mcp {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(s: &Scratch) -> Mcp {
        let mut cmd = Command::new(&artifacts().cli);
        cmd.arg("mcp").current_dir(s.tree()).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        isolate(&mut cmd, &s.root);
        let mut child = cmd.spawn().expect("mcp");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut m = Mcp { child, out, next: 1 };
        let init = m.request(
            "initialize",
            serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
        );
        assert_eq!(init["serverInfo"]["name"], "aether-journal", "{init}");
        m.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        m
    }

    fn send(&mut self, v: serde_json::Value) {
        use std::io::Write as _;
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use std::io::BufRead as _;
        let id = self.next;
        self.next += 1;
        self.send(serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["id"], id, "{v}");
        v["result"].clone()
    }

    /// A tool's JSON answer, and whether it was an error.
    fn call(&mut self, tool: &str, args: serde_json::Value) -> (serde_json::Value, bool) {
        let r = self.request("tools/call", serde_json::json!({"name": tool, "arguments": args}));
        let text = r["content"][0]["text"].as_str().unwrap_or_default().to_string();
        (serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)), r["isError"] == true)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// `aether-journal mcp`: tools mark, status, review (since a mark) and rewind (to a mark, a dry
/// run unless asked), over stdio with a real JSON-RPC exchange.
#[test]
fn the_mcp_server_marks_reviews_and_rewinds_a_session() {
    let s = scratch!();
    s.sh("echo orig > f");
    let session = harness_session(&s);
    let journal = session.display().to_string();
    let mut mcp = Mcp::start(&s);
    let tools = mcp.request("tools/list", serde_json::json!({}));
    let mut names: Vec<&str> = tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["mark", "review", "rewind", "status"]);
    let at_mark = manifest(&s.tree());
    let (m, err) = mcp.call("mark", serde_json::json!({"journal": journal, "label": "first prompt"}));
    assert!(!err && m["name"] == "turn-1", "{m}");
    agent(&s, &session, "echo changed > f && echo new > g");
    let (status, _) = mcp.call("status", serde_json::json!({"journal": journal}));
    assert_eq!(status["marks"], serde_json::json!(["turn-1"]), "{status}");
    let (rv, _) = mcp.call("review", serde_json::json!({"journal": journal, "since": "turn-1"}));
    assert_eq!(listed(&s, &rv, "created"), ["g"]);
    assert_eq!(listed(&s, &rv, "modified"), ["f"]);
    let changed = manifest(&s.tree());
    let (dry, _) = mcp.call("rewind", serde_json::json!({"journal": journal, "to": "turn-1"}));
    assert_eq!((dry["dry_run"].clone(), dry["complete"].clone()), (true.into(), true.into()), "{dry}");
    assert_eq!(manifest(&s.tree()), changed, "a dry run by default");
    let (done, _) = mcp.call("rewind", serde_json::json!({"journal": journal, "to": "turn-1", "dry_run": false}));
    assert_eq!(done["complete"], true, "{done}");
    assert_same_tree(&at_mark, &manifest(&s.tree()));
    let (e, err) = mcp.call("rewind", serde_json::json!({"journal": journal, "to": "nope"}));
    assert!(err && e.as_str().unwrap().contains("no mark \"nope\""), "{e}");
}

/// The MCP server's review reads a session as undo does: a record rewritten after the seal is
/// listed among the steps undo cannot take back, not as a file the session made.
#[test]
fn the_mcp_review_shows_a_record_rewritten_after_the_seal_as_undo_treats_it() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo new > g && echo new > h"]);
    let g = s.path("g").display().to_string();
    // g's creation made to name h: a path the seal holds, so only the seal's hashes can tell.
    let n = rewrite_records(&session.join("journal"), |rec| {
        if rec["op"]["path"].as_str() != Some(&g) {
            return false;
        }
        rec["op"]["path"] = s.path("h").display().to_string().into();
        true
    });
    assert_eq!(n, 1);
    let mut mcp = Mcp::start(&s);
    let (rv, err) = mcp.call("review", serde_json::json!({"journal": session.display().to_string()}));
    assert!(!err, "{rv}");
    let irreversible: Vec<&str> =
        rv["irreversible"].as_array().unwrap().iter().filter_map(|i| i["what"].as_str()).collect();
    assert!(irreversible.iter().any(|w| w.contains("the journal held no such line")), "{rv}");
    assert_eq!(listed(&s, &rv, "created"), ["h"], "the rewritten record is not a creation: {rv}");
}

/// A harness that itself runs under `aether-journal run`: its hooks join that session (marks
/// go through the shim), and the Stop hook tells the harness, in a `systemMessage`, which steps
/// of the turn no undo can take back.
#[test]
fn hooks_of_a_harness_under_run_mark_its_session_and_stop_names_the_turn_s_irreversible_steps() {
    let s = scratch!();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cli = artifacts().cli.display().to_string();
    let json = |event: &str| {
        serde_json::json!({"session_id": "h1", "cwd": s.tree(), "hook_event_name": event, "prompt_id": "p1", "prompt": "fetch it"}).to_string()
    };
    let script = format!(
        "echo '{prompt}' | {cli} hook claude-code > prompt.out && \
         python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port})).close()\" && echo x > made.txt && \
         echo '{stop}' | {cli} hook claude-code > ../stop.out",
        prompt = json("UserPromptSubmit"),
        stop = json("Stop"),
    );
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", &script]);
    drop(listener);
    let stop: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.root.join("stop.out")).unwrap()).expect("Stop printed JSON");
    let msg = stop["systemMessage"].as_str().unwrap();
    assert!(
        msg.contains("1 step(s) of turn-1 cannot be undone") && msg.contains(&format!("127.0.0.1:{port}")),
        "{msg}"
    );
    assert!(std::fs::read(s.path("prompt.out")).unwrap().is_empty(), "UserPromptSubmit prints nothing");
    let marks = s.mark_names(&session);
    assert_eq!(marks, ["turn-1", "turn-1-end"], "the hooks marked the session they run in");
    assert!(!s.root.join("state/aether-journal/claude-code-h1").exists(), "no second session");
}

/// A mark a hook could not write leaves its trace: `undo --to` of that turn names the hooks'
/// failures.
#[test]
fn a_turn_whose_mark_a_hook_could_not_write_is_named_by_undo_to_it() {
    let s = scratch!();
    let session = harness_session(&s);
    // The marks segment made immutable (even for root): the hook's mark cannot be appended.
    let marks = session.join("segments/marks");
    let chattr = |flag: &str| Command::new("chattr").arg(flag).arg(&marks).status().expect("chattr").success();
    assert!(chattr("+i"), "chattr +i (e2fsprogs) on the scratch file system");
    struct Mutable<F: Fn(&str) -> bool>(F);
    impl<F: Fn(&str) -> bool> Drop for Mutable<F> {
        fn drop(&mut self) {
            (self.0)("-i");
        }
    }
    let _mutable_again = Mutable(chattr);
    let input = serde_json::json!({"session_id": "x", "cwd": s.tree(), "hook_event_name": "UserPromptSubmit", "prompt": "p", "prompt_id": "p1"});
    let out = hook_of(&s, "claude-code", input, &[("AETHER_JOURNAL_DIR", session.as_os_str())]);
    assert!(out.stdout.is_empty());
    let undo = s.cli(&["undo".as_ref(), "--to".as_ref(), "turn-1".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert_eq!(undo.status.code(), Some(1));
    let err = String::from_utf8_lossy(&undo.stderr);
    assert!(err.contains("no mark \"turn-1\"") && err.contains("hooks failed 1 time(s)"), "{err}");
}

/// A command asked for JSON answers an error with JSON too: a stable code beside the message.
#[test]
fn errors_of_json_commands_are_json_with_a_stable_code() {
    let s = scratch!();
    let session = harness_session(&s);
    let out = s.cli(&[
        "undo".as_ref(),
        "--json".as_ref(),
        "--to".as_ref(),
        "nope".as_ref(),
        "--journal".as_ref(),
        session.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["code"], "no_such_mark", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("no mark \"nope\""));
    let missing = s.root.join("missing");
    let out = s.cli(&["log".as_ref(), "--json".as_ref(), "--journal".as_ref(), missing.as_os_str()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["code"], "session_not_found", "{v}");
    let out = s.cli(&["mark".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str(), "42".as_ref()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["code"], "bad_mark_name", "{v}");
}

/// A small git repository for the agent loop (`bench/agent_loop.sh`), committed.
fn agent_repo(s: &Scratch) {
    s.sh("git init -q . && for i in $(seq -w 0 40); do echo \"omega $i\" > g00$i.txt; done && \
          git add -A && git -c user.email=t@x -c user.name=t commit -qm start");
}

fn agent_loop() -> String {
    repo_root().join("bench/agent_loop.sh").display().to_string()
}

#[test]
fn the_agent_loop_under_a_bare_ld_preload_rewinds_to_each_turn_and_to_its_start() {
    // Each turn a command of its own joining one session (as a harness's shell commands do),
    // a mark after each, the tree's manifest taken there.
    let s = scratch!();
    agent_repo(&s);
    let before = manifest(&s.tree());
    let session = s.session("session");
    let mut at_mark = Vec::new();
    for turn in 1..=3 {
        let mut cmd = Command::new("bash");
        cmd.args([agent_loop(), "1".into(), turn.to_string()]).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        cmd.env("LD_PRELOAD", &artifacts().shim).env("AETHER_JOURNAL_DIR", &session);
        let out = bounded(cmd, 120);
        assert!(out.status.success(), "turn {turn}: {}", String::from_utf8_lossy(&out.stderr));
        mark(&s, &session, &[]);
        at_mark.push(manifest(&s.tree()));
    }
    for (turn, expected) in [(2, &at_mark[1]), (1, &at_mark[0])] {
        let (code, r) = s.undo_json_with(&session, &["--to", &format!("turn-{turn}")]);
        assert_complete(code, &r);
        assert_same_tree(expected, &manifest(&s.tree()));
    }
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_same_tree(&before, &manifest(&s.tree()));
}

#[test]
fn the_agent_loop_under_run_with_marks_from_inside_is_undone_exactly() {
    let s = scratch!();
    agent_repo(&s);
    let before = manifest(&s.tree());
    let session = s.session("session");
    let cli = artifacts().cli.display().to_string();
    let script = format!("for t in 1 2 3; do bash {} 1 $t && {cli} mark >/dev/null || exit 1; done", agent_loop());
    let out = bounded(run_cmd(&s, &session, &["sh".as_ref(), "-c".as_ref(), script.as_ref()]), 120);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(s.mark_names(&session), ["turn-1", "turn-2", "turn-3"]);
    let (code, r) = s.undo_json_with(&session, &["--to", "turn-2"]);
    assert_complete(code, &r);
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_same_tree(&before, &manifest(&s.tree()));
}
