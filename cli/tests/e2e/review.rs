//! End-to-end tests of the review-and-decide moment (issue 6): review output, selective undo,
//! drift protection, keep, gc, and the JSON shapes harnesses rely on.

use std::ffi::OsStr;
use std::net::TcpListener;
use std::process::Command;

use crate::common::*;

fn cli_json(s: &Scratch, args: &[&OsStr]) -> (i32, serde_json::Value) {
    let out = s.cli(args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON from {args:?} ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn j(s: &std::path::Path) -> &OsStr {
    s.as_os_str()
}

/// A session with every kind of change the review knows; returns it and the server's port.
fn everything_session_and_port(s: &Scratch) -> (std::path::PathBuf, u16) {
    s.sh("printf 'alpha\\nbeta\\ngamma\\n' > text.txt && head -c 64 /dev/zero > data.bin && echo bye > doomed && \
         echo moving > old-name && echo meta > meta.txt && chmod 600 meta.txt && head -c 3000 /dev/zero > big");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || listener.accept().map(|_| ()).is_ok());
    let session = s.session("session");
    let script = format!(
        "sed -i 's/beta/BETA/' text.txt && printf '\\001\\002' >> data.bin && rm doomed && mv old-name new-name && \
         chmod 640 meta.txt && echo fresh > created.txt && echo x > big && \
         {} -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))'",
        python()
    );
    let mut cmd = Command::new(&artifacts().cli);
    cmd.args(["run", "--journal"]).arg(&session).args(["--", "sh", "-c", &script]).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd.env("AETHER_JOURNAL_MAX_FILE", "2K");
    assert!(cmd.status().unwrap().success());
    assert!(t.join().unwrap());
    (session, port)
}

fn everything_session(s: &Scratch) -> std::path::PathBuf {
    everything_session_and_port(s).0
}

/// Replaces what differs from run to run (paths, pids, ids, times, ports) with placeholders.
fn normalise(text: &str, s: &Scratch, port: u16) -> String {
    let root = s.root.to_str().unwrap();
    let cli = artifacts().cli.to_str().unwrap().to_string();
    let text = text.replace(&cli, "<aether-journal>").replace(root, "<root>").replace(&port.to_string(), "<port>");
    let mut out = Vec::new();
    for line in text.lines() {
        let mut l = line.to_string();
        // Session header line.
        if l.starts_with("session ") {
            l = "session <id> (<root>/session), started <time>: <command>".into();
        }
        // pids and ports
        let mut norm = String::new();
        let mut rest = l.as_str();
        while let Some(i) = rest.find("pid ") {
            norm.push_str(&rest[..i + 4]);
            rest = rest[i + 4..].trim_start_matches(|c: char| c.is_ascii_digit());
            norm.push_str("<pid>");
        }
        norm.push_str(rest);
        l = norm;
        // seq numbers of irreversible steps
        if let Some(i) = l.find("! #") {
            let end = l[i + 3..].find(' ').map_or(l.len(), |e| i + 3 + e);
            l = format!("{}! #<seq>{}", &l[..i], &l[end..]);
        }
        // sed's temporary names
        if let Some(i) = l.find("/sed") {
            let end = l[i..].find([' ', ')']).map_or(l.len(), |e| i + e);
            l = format!("{}/sed<tmp>{}", &l[..i], &l[end..]);
        }
        out.push(l);
    }
    out.join("\n") + "\n"
}

#[test]
fn review_shows_every_kind_of_change_in_plain_mode_golden() {
    let s = scratch!();
    let (session, port) = everything_session_and_port(&s);
    let out = s.cli(&["review".as_ref(), "--journal".as_ref(), j(&session)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\x1b'), "no colour when piped");
    // The process section lists programs with their pids; keep the golden to what is stable.
    let stable: String = normalise(&text, &s, port);
    let golden_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/review-every-kind.txt");
    if std::env::var_os("AETHER_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, &stable).unwrap();
    }
    let golden = std::fs::read_to_string(&golden_path).expect("golden file (AETHER_UPDATE_GOLDEN=1 writes it)");
    assert_eq!(stable, golden, "review output changed:\n--- golden\n{golden}\n--- got\n{stable}");
}

#[test]
fn review_json_has_every_section_with_exact_paths() {
    let s = scratch!();
    let session = everything_session(&s);
    let (code, v) = cli_json(&s, &["review".as_ref(), "--json".as_ref(), "--journal".as_ref(), j(&session)]);
    assert_eq!(code, 0);
    for key in ["modified", "created", "deleted", "renamed", "metadata", "network", "processes", "irreversible"] {
        assert!(v[key].is_array(), "{key}: {v}");
        assert!(v["summary"][key].is_u64(), "summary.{key}");
    }
    assert!(v["modified"].as_array().unwrap().iter().any(|m| m["diff"].as_str().is_some_and(|d| d.contains("+BETA"))));
    assert!(v["modified"].as_array().unwrap().iter().any(|m| m["binary"]["after_size"] == 66));
    assert_eq!(v["renamed"][0]["from"], s.path("old-name").to_str().unwrap());
    assert_eq!(v["deleted"][0]["path"], s.path("doomed").to_str().unwrap());
    assert_eq!(v["network"][0]["kind"], "connect");
    assert!(v["irreversible"].as_array().unwrap().len() >= 2, "budget and connect: {}", v["irreversible"]);
    assert!(v["session"]["id"].is_string() && v["state"] == "active");
}

#[test]
fn review_limits_to_the_paths_given_and_stat_leaves_out_diffs() {
    let s = scratch!();
    let session = everything_session(&s);
    let out = s.cli(&[
        "review".as_ref(),
        "--stat".as_ref(),
        "--journal".as_ref(),
        j(&session),
        s.path("text.txt").as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 modified, 0 created, 0 deleted"), "{text}");
    assert!(!text.contains("+BETA"), "no diff with --stat: {text}");
}

#[test]
fn names_are_escaped_for_the_terminal_but_exact_in_json() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["bash", "-c", "echo x > \"$(printf 'evil\\033[31m\\342\\200\\256txt')\""]);
    let out = s.cli(&["review".as_ref(), "--journal".as_ref(), j(&session)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("evil\\u{1b}[31m\\u{202e}txt"), "{text}");
    assert!(!text.contains('\x1b'));
    let (_, v) = cli_json(&s, &["review".as_ref(), "--json".as_ref(), "--journal".as_ref(), j(&session)]);
    assert!(v["created"][0]["path"].as_str().unwrap().ends_with("evil\u{1b}[31m\u{202e}txt"));
}

#[test]
fn undo_of_one_path_restores_only_that_path() {
    let s = scratch!();
    s.sh("echo a1 > a && echo b1 > b");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo a2 > a && echo b2 > b && echo c > c"]);
    let after_session = manifest(&s.tree());
    let a = s.path("a");
    let (code, r) = s.undo_json_with(&session, &[a.to_str().unwrap()]);
    assert_eq!(code, 0, "{r}");
    let now = manifest(&s.tree());
    assert_eq!(std::fs::read(s.path("a")).unwrap(), b"a1\n");
    assert_eq!(now[&b"b".to_vec()], after_session[&b"b".to_vec()], "b untouched");
    assert!(s.path("c").exists(), "c untouched");
    // The rest later: the session then counts as undone.
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert!(r["outcomes"].as_array().unwrap().iter().any(|o| o["why"] == "already undone by an earlier undo"));
    assert_eq!(std::fs::read(s.path("b")).unwrap(), b"b1\n");
    assert!(!s.path("c").exists());
    let (code, r) = s.undo_json(&session);
    assert_eq!((code, r["already_undone"].as_bool()), (0, Some(true)));
}

#[test]
fn undo_of_a_subtree_brings_back_the_directories_a_later_step_removed() {
    let s = scratch!();
    s.sh("mkdir -p proj/src proj/docs && echo code > proj/src/main.c && echo doc > proj/docs/a.md && chmod 750 proj/src && echo keep > other");
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo edited > proj/src/main.c && rm -rf proj && echo changed > other"]);
    // Only the source file: its directories come back because it needs them.
    let (code, r) = s.undo_json_with(&session, &[s.path("proj/src/main.c").to_str().unwrap()]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(std::fs::read(s.path("proj/src/main.c")).unwrap(), b"code\n");
    assert!(!s.path("proj/docs").exists(), "docs were not selected");
    assert_eq!(std::fs::read(s.path("other")).unwrap(), b"changed\n");
    // Then the rest of the subtree.
    let (code, r) = s.undo_json_with(&session, &[s.path("proj").to_str().unwrap()]);
    assert_eq!(code, 0, "{r}");
    let mut expected = before.clone();
    expected.insert(b"other".to_vec(), manifest(&s.tree())[&b"other".to_vec()].clone());
    assert_same_tree(&expected, &manifest(&s.tree()));
}

#[test]
fn undo_last_n_reverses_only_the_newest_records() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo 1 > one; echo 2 > two; echo 3 > three"]);
    let log = s.log_json(&session);
    let n = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .take_while(|r| r["op"]["path"] != s.path("two").to_str().unwrap())
        .count()
        + 1;
    let (code, r) = s.undo_json_with(&session, &["--last", &n.to_string()]);
    assert_eq!(code, 0, "{r}");
    assert!(s.path("one").exists());
    assert!(!s.path("two").exists() && !s.path("three").exists());
}

#[test]
fn undo_pid_reverses_what_one_process_and_its_descendants_did() {
    let s = scratch!();
    s.sh("echo orig > kept && echo orig > undone");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo new > kept; sh -c 'echo new > undone; sh -c \"echo deeper > deep\"'"]);
    let log = s.log_json(&session);
    let pid = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "change" && r["op"]["path"] == s.path("undone").to_str().unwrap())
        .map(|r| r["pid"].as_u64().unwrap())
        .unwrap();
    let before_kept = std::fs::read(s.path("kept")).unwrap();
    let (code, r) = s.undo_json_with(&session, &["--pid", &pid.to_string()]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(std::fs::read(s.path("undone")).unwrap(), b"orig\n");
    assert!(!s.path("deep").exists(), "the descendant's change went too");
    assert_eq!(std::fs::read(s.path("kept")).unwrap(), before_kept, "the parent's change stays");
}

#[test]
fn a_user_edit_after_the_session_is_a_conflict_and_is_left_alone_unless_forced() {
    let s = scratch!();
    s.sh("echo original > f && echo original > g");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo agent > f && echo agent > g"]);
    std::fs::write(s.path("f"), "the user's own edit\n").unwrap();
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    let c: Vec<_> = r["outcomes"].as_array().unwrap().iter().filter(|o| o["outcome"] == "conflict").collect();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["path"], s.path("f").to_str().unwrap());
    assert!(c[0]["why"].as_str().unwrap().contains("contents changed"), "{r}");
    assert_eq!(c[0]["cause"]["code"], "changed_since_session", "{r}");
    assert_eq!(r["files_exact"], false, "{r}");
    assert_eq!(std::fs::read(s.path("f")).unwrap(), b"the user's own edit\n", "the edit is kept");
    assert_eq!(std::fs::read(s.path("g")).unwrap(), b"original\n", "the rest is undone");
    assert_eq!(r["sealed"], true);
    let (code, r) = s.undo_json_with(&session, &["--force"]);
    assert_complete(code, &r);
    assert_eq!(std::fs::read(s.path("f")).unwrap(), b"original\n");
}

#[test]
fn an_unsealed_session_gets_the_weaker_check_and_says_so() {
    let s = scratch!();
    s.sh("echo one > a");
    let session = s.session("raw");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "rm a"])
        .current_dir(s.tree())
        .env("LD_PRELOAD", &artifacts().shim)
        .env("AETHER_JOURNAL_DIR", &session);
    isolate(&mut cmd, &s.root);
    cmd.env("AETHER_JOURNAL_DIR", &session);
    assert!(cmd.status().unwrap().success());
    std::fs::write(s.path("a"), "recreated by the user\n").unwrap();
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    let a = s.path("a").to_str().unwrap().to_string();
    let step = r["outcomes"].as_array().unwrap().iter().find(|o| o["path"] == a.as_str()).expect("a step for a");
    assert_eq!(step["outcome"], "conflict", "{r}");
    assert!(step["why"].as_str().unwrap().contains("weak check"), "{r}");
    assert!(r["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("not sealed")));
    assert_eq!(std::fs::read(s.path("a")).unwrap(), b"recreated by the user\n");
}

#[test]
fn keep_frees_the_captured_contents_and_keeps_the_audit_log() {
    let s = scratch!();
    s.sh("head -c 20000 /dev/urandom > big && echo small > small");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "rm big && echo changed > small"]);
    // Every blob file, in whatever shard directory it lies.
    let blobs = |session: &std::path::Path| {
        let shards = std::fs::read_dir(session.join("blobs")).unwrap().map(|e| e.unwrap().path());
        shards.map(|shard| std::fs::read_dir(shard).unwrap().count()).sum::<usize>()
    };
    assert_eq!(blobs(&session), 2);
    let (code, v) = cli_json(&s, &["keep".as_ref(), "--json".as_ref(), "--journal".as_ref(), j(&session)]);
    assert_eq!(code, 0);
    assert!(v["bytes_freed"].as_u64().unwrap() >= 20000, "{v}");
    assert_eq!(blobs(&session), 0, "blobs released");
    assert_eq!(std::fs::read_dir(session.join("blobs")).unwrap().count(), 0, "and their shards");
    assert!(!s.log_json(&session)["records"].as_array().unwrap().is_empty(), "the journal stays");
    assert_eq!(s.log_json(&session)["state"], "kept");
    let out = s.cli(&["undo".as_ref(), "--journal".as_ref(), j(&session)]);
    assert_eq!(out.status.code(), Some(1), "a kept session cannot be undone");
    assert!(String::from_utf8_lossy(&out.stderr).contains("kept"));
    let out = s.cli(&["keep".as_ref(), "--forget".as_ref(), "--journal".as_ref(), j(&session)]);
    assert!(out.status.success());
    assert!(!session.exists(), "--forget deletes it all");
}

fn age_session(dir: &std::path::Path, created: &str) {
    let p = dir.join("session.json");
    let mut h: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    h["created"] = created.into();
    std::fs::write(&p, serde_json::to_vec(&h).unwrap()).unwrap();
}

#[test]
fn gc_removes_sessions_by_age_and_then_by_size() {
    let s = scratch!();
    let state = s.root.join("state/aether-journal");
    for (name, size) in [("old", 1000), ("mid", 50_000), ("new", 50_000)] {
        s.sh(&format!("head -c {size} /dev/urandom > {name}"));
        let dir = state.join(name);
        s.run_ok(&dir, &["rm", name]);
    }
    age_session(&state.join("old"), "2020-01-01T00:00:00Z");
    age_session(&state.join("mid"), "2026-01-01T00:00:00Z");
    let (_, v) = cli_json(&s, &["gc".as_ref(), "--older-than".as_ref(), "3650d".as_ref(), "--json".as_ref()]);
    assert!(v["removed"].as_array().unwrap().is_empty(), "nothing that old: {v}");
    let (_, v) = cli_json(
        &s,
        &["gc".as_ref(), "--older-than".as_ref(), "365d".as_ref(), "--dry-run".as_ref(), "--json".as_ref()],
    );
    assert_eq!(v["removed"][0]["session"]["id"], serde_json::Value::from(session_id(&state.join("old"))));
    assert!(state.join("old").exists(), "dry run");
    let (_, v) = cli_json(&s, &["gc".as_ref(), "--older-than".as_ref(), "365d".as_ref(), "--json".as_ref()]);
    assert_eq!(v["removed"].as_array().unwrap().len(), 1);
    assert!(!state.join("old").exists());
    let (_, v) = cli_json(&s, &["gc".as_ref(), "--max-size".as_ref(), "80K".as_ref(), "--json".as_ref()]);
    assert_eq!(v["removed"].as_array().unwrap().len(), 1, "{v}");
    assert!(!state.join("mid").exists(), "the oldest went first");
    assert!(state.join("new").exists());
    let out = s.cli(&["gc".as_ref()]);
    assert_eq!(out.status.code(), Some(1), "gc without a limit is an error");
}

fn session_id(dir: &std::path::Path) -> String {
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("session.json")).unwrap()).unwrap();
    h["id"].as_str().unwrap().to_string()
}

#[test]
fn sessions_lists_every_session_newest_first_with_its_counts() {
    let s = scratch!();
    let state = s.root.join("state/aether-journal");
    s.sh("echo 1 > a && head -c 4000 /dev/zero > z");
    s.run_ok(&state.join("first"), &["rm", "a"]);
    age_session(&state.join("first"), "2026-01-01T00:00:00Z");
    let mut cmd = Command::new(&artifacts().cli);
    cmd.args(["run", "--journal"])
        .arg(state.join("second"))
        .args(["--", "sh", "-c", "echo x > z"])
        .current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd.env("AETHER_JOURNAL_MAX_FILE", "1K");
    assert!(cmd.status().unwrap().success());
    let (code, v) = cli_json(&s, &["sessions".as_ref(), "--json".as_ref()]);
    assert_eq!(code, 0);
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], serde_json::Value::from(session_id(&state.join("second"))), "newest first");
    for e in list {
        for key in ["id", "dir", "root_command", "created", "state", "records", "bytes_captured", "irreversible"] {
            assert!(!e[key].is_null(), "{key} in {e}");
        }
    }
    assert_eq!(list[0]["irreversible"], 1, "the over-budget capture");
    assert_eq!(list[1]["state"], "active");
    assert!(list[1]["bytes_captured"].as_u64().unwrap() >= 2);
    let out = s.cli(&["sessions".as_ref()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().next().unwrap().contains("STATE"), "{text}");
}

#[test]
fn the_undo_and_log_json_shapes_are_the_documented_contract() {
    let s = scratch!();
    s.sh("echo 1 > a");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "rm a; echo 2 > b"]);
    let (code, r) =
        cli_json(&s, &["undo".as_ref(), "--dry-run".as_ref(), "--json".as_ref(), "--journal".as_ref(), j(&session)]);
    assert_eq!(code, 0);
    assert!(r["complete"].is_boolean() && r["dry_run"] == true && r["summary"]["total"].is_u64());
    for o in r["outcomes"].as_array().unwrap() {
        assert!(o["seq"].is_u64() && o["outcome"].is_string() && o["why"].is_string());
        assert!(o["path"].is_string() || o["path"].is_null());
        assert!(
            ["restored", "removed", "recreated", "unchanged", "skipped", "failed", "conflict"]
                .contains(&o["outcome"].as_str().unwrap())
        );
    }
    let log = s.log_json(&session);
    for r in log["records"].as_array().unwrap() {
        for key in ["v", "seq", "time", "pid", "ppid", "prog", "call", "op", "kind"] {
            assert!(!r[key].is_null(), "{key} in {r}");
        }
        assert_eq!(r["kind"], r["op"]["kind"]);
    }
}

#[test]
fn completions_and_the_man_page_are_generated_from_the_cli_definition() {
    let s = scratch!();
    let out = s.cli(&["completions".as_ref(), "bash".as_ref()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("aether-journal") && text.contains("review") && text.contains("--dry-run"));
    let out = s.cli(&["man".as_ref()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(".TH") && text.contains("aether-journal"), "{text}");
}

#[test]
fn undo_log_and_review_print_no_escape_sequence_or_invisible_character_an_agent_put_in_a_name() {
    let s = scratch!();
    s.sh("echo a > a");
    let session = s.session("session");
    // OSC 0 (title), SGR colour, OSC 52 (clipboard), OSC 8 (link), a C1 CSI, bidi, tags.
    let name = "b\u{1b}]0;pwned\u{7}\u{1b}[31mRED\u{1b}]52;c;cHduZWQ=\u{7}\u{1b}]8;;https:x\u{1b}\\\u{9b}1m\u{202e}\u{e0041}\u{e0042}";
    s.run_ok(&session, &["mv", "a", name]);
    let forbidden = |out: &[u8]| {
        let text = String::from_utf8_lossy(out);
        text.chars().find(|c| {
            matches!(*c, '\u{1b}' | '\u{7}' | '\u{9b}' | '\u{202e}') || ('\u{e0000}'..='\u{e007f}').contains(c)
        })
    };
    for args in [vec!["log"], vec!["review"], vec!["undo", "--dry-run"], vec!["undo"]] {
        let mut argv: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        argv.extend([OsStr::new("--journal"), session.as_os_str()]);
        let out = s.cli(&argv);
        assert_eq!(forbidden(&out.stdout), None, "{args:?} printed it raw:\n{}", String::from_utf8_lossy(&out.stdout));
        assert!(String::from_utf8_lossy(&out.stdout).contains("\\u{1b}]0;pwned"), "{args:?} names it, escaped");
    }
    assert!(s.path("a").exists(), "the undo itself worked");
    // --json keeps the exact name.
    let log = s.log_json(&session);
    let to = log["records"].as_array().unwrap().iter().find_map(|r| r["op"]["to"].as_str()).unwrap().to_string();
    assert!(to.ends_with(name), "{to:?}");
}

#[test]
fn gc_removes_a_session_kept_elsewhere_whole_reports_only_bytes_freed_and_names_a_removal_that_fails() {
    let s = scratch!();
    s.sh("head -c 40000 /dev/urandom > big && head -c 40000 /dev/urandom > stuck");
    // A session outside the state directory, registered there by a link.
    let elsewhere = s.root.join("elsewhere/s1");
    s.run_ok(&elsewhere, &["rm", "big"]);
    let stuck = s.root.join("elsewhere/s2");
    s.run_ok(&stuck, &["rm", "stuck"]);
    for d in [&elsewhere, &stuck] {
        age_session(d, "2020-01-01T00:00:00Z");
    }
    let (id1, id2) = (session_id_of(&elsewhere), session_id_of(&stuck));
    // One removal that cannot succeed: a blob whose directory is read-only, or for root (who
    // ignores modes) an immutable blob.
    let blob = walk_files(&stuck.join("blobs")).remove(0);
    let shard = blob.parent().unwrap().to_path_buf();
    let root_user = rustix::process::geteuid().is_root();
    let chattr = |flag: &str| Command::new("chattr").arg(flag).arg(&blob).status().is_ok_and(|s| s.success());
    let mode = |m: u32| std::fs::set_permissions(&shard, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap();
    if root_user {
        assert!(chattr("+i"), "the scratch file system must support chattr +i");
    } else {
        mode(0o555);
    }
    let out = s.cli(&["gc".as_ref(), "--older-than".as_ref(), "365d".as_ref(), "--json".as_ref()]);
    if root_user {
        chattr("-i");
    } else {
        mode(0o700);
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(3), "one removal failed: {v}");
    let removed = v["removed"].as_array().unwrap();
    let by = |id: &str| removed.iter().find(|c| c["session"]["id"] == id).unwrap().clone();
    assert!(!elsewhere.exists(), "the session itself is gone, not only its link");
    assert!(by(&id1)["freed"].as_u64().unwrap() >= 40000, "{v}");
    assert!(by(&id1)["error"].is_null());
    assert!(by(&id2)["error"].as_str().is_some(), "{v}");
    assert!(by(&id2)["freed"].as_u64().unwrap() < 40000, "what stayed is not reported freed: {v}");
}

#[test]
fn sessions_names_a_damaged_session_and_exits_3() {
    let s = scratch!();
    s.run_ok(&s.root.join("state/aether-journal/good"), &["true"]);
    let bad = s.root.join("state/aether-journal/bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("session.json"), b"{not json").unwrap();
    let out = s.cli(&["sessions".as_ref()]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("!! "), "{}", String::from_utf8_lossy(&out.stdout));
}

fn session_id_of(dir: &std::path::Path) -> String {
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("session.json")).unwrap()).unwrap();
    h["id"].as_str().unwrap().to_string()
}

fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk_files(&p)) } else { out.push(p) }
    }
    out
}
