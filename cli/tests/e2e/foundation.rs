//! End-to-end tests of the foundation: real tools under `aether-journal run`, whole-tree
//! manifests before the session and after `aether-journal undo`.

use std::ffi::OsStr;
use std::process::Command;

use crate::common::*;

#[test]
fn the_readme_example_is_undone_exactly() {
    let s = scratch!();
    s.sh("echo x > e; echo b > b; echo c > c");
    let report = roundtrip(&s, &["bash", "-c", "echo new > a; rm b; mv c d; sed -i s/x/y/ e"]);
    assert!(report["summary"]["total"].as_u64().unwrap() >= 5, "{report}");
}

#[test]
fn bash_redirections_that_create_truncate_and_append_are_undone() {
    let s = scratch!();
    s.sh("printf 'one\\n' > trunc; printf 'log\\n' > log; chmod 640 log");
    roundtrip(
        &s,
        &["bash", "-c", "echo new > created; echo x > trunc; echo more >> log; echo again >> log; echo app >> newlog"],
    );
}

#[test]
fn rm_rf_of_a_nested_tree_with_symlinks_and_empty_dirs_is_undone() {
    let s = scratch!();
    s.sh("mkdir -p t/a/b/c t/empty t/a/e2; echo 1 > t/a/f1; echo 2 > t/a/b/f2; printf 'bin\\0ary' > t/a/b/c/f3; \
         ln -s f1 t/a/l1; ln -s ../../nowhere t/a/b/dangling; ln -s /etc t/abs; chmod 600 t/a/f1; chmod 755 t/a/b/c; \
         chmod 444 t/a/b/f2; chmod 700 t/empty");
    roundtrip(&s, &["rm", "-rf", "t"]);
}

#[test]
fn mv_over_an_existing_file_is_undone() {
    let s = scratch!();
    s.sh("echo source > a; echo victim > b; chmod 600 b");
    roundtrip(&s, &["mv", "a", "b"]);
}

#[test]
fn the_dry_run_says_already_absent_of_a_file_the_session_created_that_is_gone() {
    let s = scratch!();
    let session = s.session("session");
    // Unsealed (a bare LD_PRELOAD session): a created file gone since is no conflict.
    bash_with_raw_preload(&s, "echo x > f", Some(session.to_str().unwrap()));
    std::fs::remove_file(s.path("f")).unwrap();
    let dry =
        s.cli(&["undo".as_ref(), "--dry-run".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    let dry: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(dry["outcomes"][0]["outcome"], "unchanged", "{dry}");
    assert_eq!(dry["outcomes"][0]["why"], "already absent", "{dry}");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
}

#[test]
fn mv_of_a_directory_is_undone_by_moving_it_back() {
    let s = scratch!();
    s.sh("mkdir -p d/sub; echo x > d/sub/f; mkdir dest");
    let ino_before = std::fs::metadata(s.path("d")).unwrap();
    roundtrip(&s, &["mv", "d", "dest/d2"]);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(s.path("d")).unwrap().ino(), ino_before.ino(), "moved back, not copied");
}

#[test]
fn sed_in_place_over_many_files_is_undone() {
    let s = scratch!();
    s.sh("mkdir src; for i in $(seq 1 60); do printf 'line x %s\\nother\\n' $i > src/f$i.txt; done; chmod 640 src/f7.txt");
    roundtrip(&s, &["sh", "-c", "sed -i 's/x/y/' src/*.txt"]);
}

#[test]
fn tar_extraction_over_existing_files_is_undone() {
    let s = scratch!();
    s.sh("mkdir -p stage/p/q && echo new1 > stage/p/f1 && echo new2 > stage/p/q/f2 && echo added > stage/p/q/f3 \
         && ln -s f1 stage/p/link && (cd stage && tar cf ../pack.tar p) && rm -rf stage \
         && mkdir -p p/q && echo old1 > p/f1 && echo old2 > p/q/f2 && chmod 600 p/q/f2");
    roundtrip(&s, &["tar", "xf", "pack.tar"]);
}

#[test]
fn python_open_replace_and_rmtree_are_undone() {
    let s = scratch!();
    s.sh("echo orig > w; echo target > r; echo src > s; mkdir -p tree/x/y; echo 1 > tree/x/y/z; ln -s x tree/lx");
    let script = "import os, shutil\n\
                  open('w','w').write('rewritten')\n\
                  open('created','w').write('new')\n\
                  os.replace('s','r')\n\
                  shutil.rmtree('tree')\n";
    roundtrip(&s, &[python(), "-c", script]);
}

#[test]
fn names_with_a_newline_and_invalid_utf8_round_trip() {
    let s = scratch!();
    s.sh("printf 'a' > \"$(printf 'new\\nline')\"; printf 'b' > \"$(printf 'caf\\351')\"; mkdir \"$(printf 'd\\377')\"; echo c > \"$(printf 'd\\377')/in\"");
    let report = roundtrip(
        &s,
        &[
            "bash",
            "-c",
            "rm \"$(printf 'new\\nline')\"; echo x > \"$(printf 'caf\\351')\"; rm -r \"$(printf 'd\\377')\"; echo y > \"$(printf 'n\\377w')\"",
        ],
    );
    let exact: Vec<_> = report["outcomes"].as_array().unwrap().iter().filter_map(|o| o["path_b64"].as_str()).collect();
    assert!(!exact.is_empty(), "non-UTF-8 names carry their exact bytes in --json: {report}");
}

#[test]
fn the_journal_records_who_did_what_before_it_happened() {
    let s = scratch!();
    s.sh("echo b > b");
    let session = s.session("session");
    s.run_ok(&session, &["bash", "-c", "rm b; mkdir newdir"]);
    let log = s.log_json(&session);
    let records = log["records"].as_array().unwrap();
    let rm = records
        .iter()
        .find(|r| r["call"] == "unlinkat" && r["op"]["kind"] == "change")
        .expect("rm's unlinkat is journaled");
    let times = records.iter().find(|r| r["op"]["kind"] == "dir_times").expect("and the directory's times before it");
    assert_eq!(times["op"]["path"], s.tree().to_str().unwrap());
    assert!(times["seq"].as_u64() < rm["seq"].as_u64(), "{times} before {rm}");
    assert!(rm["prog"].as_str().unwrap().ends_with("/rm"), "{rm}");
    assert!(rm["pid"].as_u64().unwrap() > 0 && rm["ppid"].as_u64().unwrap() > 0, "{rm}");
    assert_eq!(rm["op"]["path"], s.path("b").to_str().unwrap());
    assert_eq!(rm["op"]["before"]["state"], "contents");
    assert_eq!(rm["op"]["before"]["node"]["size"], 2);
    assert_eq!(rm["op"]["before"]["mode"], 0o644);
    let mk = records.iter().find(|r| r["call"] == "mkdir" && r["op"]["kind"] == "change").expect("mkdir is journaled");
    assert_eq!(mk["op"]["before"]["state"], "absent");
    let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first, increasing: {seqs:?}");
    assert_eq!(log["session"]["version"], 1);
    assert_eq!(log["session"]["root_command"][0], "bash");
}

#[test]
fn a_second_undo_changes_nothing_and_says_so() {
    let s = scratch!();
    s.sh("echo old > f");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo new > f"]);
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    std::fs::write(s.path("f"), "edited after the undo").unwrap();
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 0);
    assert_eq!(r["already_undone"], true, "{r}");
    assert_eq!(std::fs::read(s.path("f")).unwrap(), b"edited after the undo");
}

#[test]
fn a_create_that_failed_counts_as_undone() {
    let s = scratch!();
    let session = s.session("session");
    // O_CREAT|O_DIRECTORY is rejected with EINVAL: the record says Absent, nothing was created.
    let script = "import os\ntry:\n    os.open('x', os.O_CREAT|os.O_DIRECTORY|os.O_RDONLY)\nexcept OSError as e:\n    print(e.errno)\n";
    let out = s.run_ok(&session, &[python(), "-c", script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "22");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_eq!(r["outcomes"][0]["outcome"], "unchanged", "{r}");
}

#[test]
fn an_oversized_file_is_recorded_as_irreversible_and_the_undo_says_incomplete() {
    let s = scratch!();
    s.sh("head -c 5000 /dev/zero > big; echo small > small");
    let session = s.session("session");
    let mut cmd = Command::new(&artifacts().cli);
    cmd.args(["run", "--journal"]).arg(&session).args(["--", "sh", "-c", "echo x > big; echo y > small"]);
    cmd.current_dir(s.tree()).env("AETHER_JOURNAL_MAX_FILE", "4K");
    isolate(&mut cmd, &s.root);
    assert!(cmd.status().unwrap().success());
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    assert_eq!(r["complete"], false);
    let skipped: Vec<_> = r["outcomes"].as_array().unwrap().iter().filter(|o| o["outcome"] == "skipped").collect();
    assert_eq!(skipped.len(), 1, "{r}");
    assert!(skipped[0]["path"].as_str().unwrap().ends_with("/big"));
    let why = skipped[0]["why"].as_str().unwrap();
    assert!(why.contains("5000") && why.contains("4096"), "both numbers are named: {why}");
    assert_eq!(std::fs::read(s.path("small")).unwrap(), b"small\n", "the rest is still undone");
}

#[test]
fn a_young_sessions_captures_share_one_shard_directory_and_undo_finds_them() {
    // Each shard directory is a mkdir (20-60 us on ext4): blobs named by consecutive ids go
    // into one until 256 ids have been handed out.
    let s = scratch!();
    s.sh("mkdir d && for i in $(seq 40); do echo \"file $i\" > d/f$i; done");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "rm d/f*"]);
    let shards: Vec<_> = std::fs::read_dir(session.join("blobs")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(shards, ["00"], "40 captures, one shard");
    let blobs = std::fs::read_dir(session.join("blobs/00")).unwrap().count();
    assert!(blobs >= 40, "every removed file captured: {blobs} blobs");
    let (code, report) = s.undo_json(&session);
    assert_eq!(code, 0, "{report:#}");
    for i in 1..=40 {
        assert_eq!(std::fs::read_to_string(s.tree().join(format!("d/f{i}"))).unwrap(), format!("file {i}\n"));
    }
}

#[test]
fn the_session_directory_and_its_blobs_are_private() {
    let s = scratch!();
    s.sh("echo secret > f");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo overwritten > f"]);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&session), 0o700);
    assert_eq!(mode(&session.join("blobs")), 0o700);
    let shards: Vec<_> = std::fs::read_dir(session.join("blobs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(shards.len(), 1);
    assert_eq!(mode(&shards[0]), 0o700, "a shard directory is private too");
    let blobs: Vec<_> = std::fs::read_dir(&shards[0]).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(blobs.len(), 1);
    assert_eq!(mode(&blobs[0]), 0o600, "a copied capture is readable by its owner only");
    assert_eq!(std::fs::read(&blobs[0]).unwrap(), b"secret\n");
}

#[test]
fn the_run_command_passes_the_exit_status_through_and_names_the_session() {
    let s = scratch!();
    let session = s.session("session");
    let out = s.run(&session, &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert!(String::from_utf8_lossy(&out.stderr).contains(session.to_str().unwrap()));
    let out = s.run(&s.session("s2"), &["sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = s.run(&s.session("s3"), &["/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127));
}

/// Runs `bash -c script` in the tree with a bare `LD_PRELOAD` (no `aether-journal run`), and
/// `AETHER_JOURNAL_DIR` set to `dir` when given.
fn bash_with_raw_preload(s: &Scratch, script: &str, dir: Option<&str>) {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", script]).current_dir(s.tree()).env("LD_PRELOAD", &artifacts().shim);
    isolate(&mut cmd, &s.root);
    if let Some(dir) = dir {
        cmd.env("AETHER_JOURNAL_DIR", dir);
    }
    assert!(cmd.status().unwrap().success());
}

/// Asserts that exactly one session was created under the state directory, and that undoing
/// the most recent session (no `--journal`) brings the tree back to `before`, completely.
fn one_session_undone_exactly(s: &Scratch, before: &std::collections::BTreeMap<Vec<u8>, Entry>) {
    let sessions: Vec<_> = std::fs::read_dir(s.root.join("state/aether-journal")).unwrap().collect();
    assert_eq!(sessions.len(), 1, "one session for the whole tree of processes");
    let out = s.cli(&["undo".as_ref(), "--json".as_ref()]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_complete(out.status.code().unwrap(), &r);
    assert_same_tree(before, &manifest(&s.tree()));
}

#[test]
fn raw_ld_preload_creates_a_session_that_descendants_join_and_undo_finds_it() {
    let s = scratch!();
    s.sh("echo a > a; echo b > b");
    let before = manifest(&s.tree());
    bash_with_raw_preload(&s, "rm a; sh -c 'echo changed > b; python3 -c \"open(\\\"c\\\",\\\"w\\\")\"'", None);
    one_session_undone_exactly(&s, &before);
}

#[test]
fn an_empty_session_variable_starts_one_session_that_scrubbed_children_join_too() {
    let s = scratch!();
    s.sh("echo a > a; echo b > b");
    let before = manifest(&s.tree());
    // The child's environment is scrubbed: the shim puts its variables back, and the session
    // directory it hands on must be the new one, not the empty value this process started with.
    bash_with_raw_preload(&s, "rm a; env -i /bin/sh -c 'rm b'", Some(""));
    one_session_undone_exactly(&s, &before);
}

#[test]
fn a_relative_session_directory_means_the_one_under_the_starting_cwd_for_every_descendant() {
    let s = scratch!();
    s.sh("mkdir sub; echo a > a; echo b > b");
    let before = manifest(&s.tree());
    // The first change comes after a cd, and the second from a child started there.
    bash_with_raw_preload(&s, "cd sub && rm ../a && sh -c 'rm ../b'", Some("../rel-session"));
    let session = s.root.join("rel-session");
    assert!(session.join("journal").exists(), "the session is where the relative name pointed at the start");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

#[test]
fn aether_journal_off_disables_the_shim() {
    let s = scratch!();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo x > f"]).current_dir(s.tree()).env("LD_PRELOAD", &artifacts().shim);
    isolate(&mut cmd, &s.root);
    cmd.env("AETHER_JOURNAL", "off");
    assert!(cmd.status().unwrap().success());
    assert!(!s.root.join("state/aether-journal").exists(), "no session was created");
}

#[test]
fn a_shell_switched_off_runs_its_commands_without_a_system_call_for_their_records() {
    // Switched off, an exec is passed on as it is: its hook made a `getcwd` for a record that
    // was never written, once in every forked child of a shell. The shell switched off asks for
    // its working directory as often as the bare shell does.
    let s = scratch!();
    let getcwds = |preload: bool| {
        let trace = s.root.join(format!("getcwd-{preload}.strace"));
        let mut cmd = Command::new("strace");
        cmd.args(["-f", "-e", "trace=getcwd", "-o"]).arg(&trace);
        if preload {
            cmd.arg("-E").arg(format!("LD_PRELOAD={}", artifacts().shim.display()));
            cmd.args(["-E", "AETHER_JOURNAL=off"]);
        }
        cmd.args(["sh", "-c", "/bin/true; /bin/true"]).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        assert!(cmd.output().expect("strace (.ci/run installs it)").status.success());
        let calls = std::fs::read_to_string(&trace).unwrap();
        (calls.matches("getcwd(").count(), calls)
    };
    let (bare, _) = getcwds(false);
    let (off, calls) = getcwds(true);
    assert_eq!(off, bare, "a shell switched off asked for its working directory {off} times, bare {bare}:\n{calls}");
    assert!(!s.root.join("state/aether-journal").exists(), "no session was created");
}

/// Runs the same script with and without the shim and returns both outputs.
fn with_and_without_shim(s: &Scratch, argv: &[&str], setup: &str) -> (std::process::Output, std::process::Output) {
    let go = |shim: bool| {
        s.sh(&format!("rm -rf ./* ; {setup}"));
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..]).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        if shim {
            cmd.env("LD_PRELOAD", &artifacts().shim).env("AETHER_JOURNAL_DIR", s.session("session"));
        }
        cmd.output().unwrap()
    };
    (go(false), go(true))
}

#[test]
fn failing_calls_return_the_same_errno_with_and_without_the_shim() {
    let s = scratch!();
    let script = r#"
import os, errno
def t(name, f):
    try:
        r = f()
        print(name, "ok", type(r).__name__)
    except OSError as e:
        print(name, errno.errorcode[e.errno])
t("unlink-missing", lambda: os.unlink("missing"))
t("unlink-dir", lambda: os.unlink("d"))
t("rmdir-nonempty", lambda: os.rmdir("d"))
t("rmdir-file", lambda: os.rmdir("f"))
t("mkdir-exists", lambda: os.mkdir("d"))
t("open-excl-exists", lambda: os.open("f", os.O_CREAT|os.O_EXCL|os.O_WRONLY))
t("open-missing-parent", lambda: os.open("nope/f", os.O_CREAT|os.O_WRONLY))
t("open-nofollow-link", lambda: os.open("l", os.O_WRONLY|os.O_NOFOLLOW))
t("rename-missing", lambda: os.rename("missing", "x"))
t("rename-dir-over-nonempty", lambda: os.rename("e", "d"))
t("truncate-dir", lambda: os.truncate("d", 0))
t("open-dir-write", lambda: os.open("d", os.O_WRONLY))
t("open-bad-fd", lambda: os.open("x", os.O_CREAT|os.O_WRONLY, dir_fd=999))
t("unlink-ok", lambda: os.unlink("f2"))
fd = os.open("f3", os.O_WRONLY); os.ftruncate(fd, 1); os.close(fd); print("ftruncate ok")
"#;
    let (bare, shim) =
        with_and_without_shim(&s, &[python(), "-c", script], "mkdir d e; touch d/x f f2; echo 123 > f3; ln -s f l");
    assert!(bare.status.success(), "{}", String::from_utf8_lossy(&bare.stderr));
    assert_eq!(String::from_utf8_lossy(&shim.stdout), String::from_utf8_lossy(&bare.stdout));
    assert_eq!(shim.stderr, bare.stderr, "the shim writes nothing to stderr");
    assert_eq!(shim.status.code(), bare.status.code());
}

#[test]
fn the_shim_writes_nothing_to_stdout_or_stderr_even_when_fd_2_is_reused() {
    let s = scratch!();
    // Close fd 2, so that the next open gets it, then mutate files: nothing may land in it.
    let script = "import os\nos.close(2)\nfd = os.open('victim', os.O_WRONLY|os.O_CREAT, 0o644)\nassert fd == 2\n\
                  open('a','w').write('x')\nos.unlink('a')\nos.rename('b','c')\nos.close(fd)\nprint('done')\n";
    let (bare, shim) = with_and_without_shim(&s, &[python(), "-c", script], "echo b > b");
    assert_eq!(bare.stdout, b"done\n");
    assert_eq!(shim.stdout, bare.stdout);
    assert_eq!(std::fs::read(s.path("victim")).unwrap(), b"", "nothing was written into the program's fd 2");
}

#[test]
fn the_hook_table_resolves_every_symbol_against_libc() {
    let shim = artifacts().shim.to_str().unwrap().to_string();
    let script = format!(
        "import ctypes\nl = ctypes.CDLL({shim:?})\nl.aether_journal_hook_name.restype = ctypes.c_char_p\n\
         names = [l.aether_journal_hook_name(i).decode() for i in range(l.aether_journal_hook_count())]\n\
         print(l.aether_journal_unresolved_hooks(), len(names), ' '.join(names))\n"
    );
    let out = Command::new(python()).args(["-c", &script]).env("AETHER_JOURNAL", "off").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    assert_eq!(parts.next(), Some("0"), "every hook resolves: {text} {}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<&str> = parts.skip(1).collect();
    for required in [
        "open",
        "open64",
        "openat",
        "openat64",
        "__open_2",
        "__open64_2",
        "__openat_2",
        "__openat64_2",
        "creat",
        "creat64",
        "fopen",
        "fopen64",
        "freopen",
        "freopen64",
        "mkstemp",
        "mkostemp",
        "mkstemps",
        "mkostemps",
        "mkdtemp",
        "truncate",
        "truncate64",
        "ftruncate",
        "ftruncate64",
        "rename",
        "renameat",
        "renameat2",
        "unlink",
        "unlinkat",
        "remove",
        "rmdir",
        "mkdir",
        "mkdirat",
        "execl",
        "execlp",
        "execle",
    ] {
        assert!(names.contains(&required), "{required} is hooked");
    }
    let exported = Command::new("nm").args(["-D", "--defined-only"]).arg(&artifacts().shim).output().unwrap();
    let exported = String::from_utf8_lossy(&exported.stdout);
    for n in &names {
        assert!(exported.lines().any(|l| l.ends_with(&format!(" T {n}"))), "{n} is exported");
    }
}

#[test]
fn an_unreadable_journal_directory_is_an_error_with_exit_1() {
    let s = scratch!();
    let out = s.cli(&["undo".as_ref(), "--journal".as_ref(), s.root.join("nope").as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    let out = s.cli(&["undo".as_ref(), "--bogus".as_ref()]);
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
}

#[test]
fn many_processes_append_records_without_interleaving_or_loss() {
    let s = scratch!();
    s.sh("for p in 1 2 3 4 5 6 7 8; do echo old > shared$p; done");
    let before = manifest(&s.tree());
    let session = s.session("session");
    let script = "for p in 1 2 3 4 5 6 7 8; do \
                    (for i in $(seq 1 100); do echo $p > f$p-$i; echo $i >> shared$p; done) & \
                  done; wait";
    s.run_ok(&session, &["bash", "-c", script]);
    let log = s.log_json(&session);
    assert_eq!(log["problems"].as_array().unwrap().len(), 0, "no damaged records");
    assert!(log["torn_tail"].is_null());
    let records = log["records"].as_array().unwrap();
    let changes = records.iter().filter(|r| r["kind"] == "change").count();
    assert_eq!(changes, 8 * 200, "one record per mutation, none lost");
    let mut seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), records.len(), "sequence numbers are unique");
    let (code, report) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &report);
}

#[test]
fn a_failed_capture_lets_the_call_proceed_and_journals_why() {
    let s = scratch!();
    // A write-only file: its owner may overwrite it but not read it, so its prior contents
    // cannot be kept. Root can read anything, so as root the whole session (CLI included)
    // runs as nobody, with a tree and a session directory nobody owns.
    let as_root = rustix_euid() == 0;
    s.sh("echo secret > wo; chmod 200 wo; echo ok > readable; mkdir ../sessions");
    if as_root {
        s.sh("chown -R 65534:65534 . ../sessions");
    }
    let session = s.root.join("sessions/session");
    let cli = |args: &[&std::ffi::OsStr]| {
        let mut cmd = if as_root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&artifacts().cli);
            c
        } else {
            Command::new(&artifacts().cli)
        };
        cmd.args(args).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        cmd.env("XDG_STATE_HOME", s.root.join("sessions/state"));
        cmd.output().unwrap()
    };
    let script = "echo overwritten > wo && echo changed > readable && echo done";
    let out = cli(&[
        "run".as_ref(),
        "--journal".as_ref(),
        session.as_os_str(),
        "--".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        script.as_ref(),
    ]);
    assert_eq!(out.stdout, b"done\n", "the call proceeded: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(s.path("readable")).unwrap(), b"changed\n");
    let out = cli(&["undo".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("undo --json");
    assert_eq!(out.status.code(), Some(3), "{r}");
    let skipped: Vec<_> = r["outcomes"].as_array().unwrap().iter().filter(|o| o["outcome"] == "skipped").collect();
    assert_eq!(skipped.len(), 1, "{r}");
    assert!(skipped[0]["path"].as_str().unwrap().ends_with("/wo"));
    assert!(skipped[0]["why"].as_str().unwrap().contains("could not be captured"), "{r}");
    assert_eq!(std::fs::read(s.path("readable")).unwrap(), b"ok\n", "the rest is undone");
}

#[test]
fn writes_inside_the_session_directory_are_not_journaled() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo x > \"$AETHER_JOURNAL_DIR/note\"; echo y > /dev/null; echo z > f"]);
    let log = s.log_json(&session);
    let paths: Vec<_> = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "change")
        .map(|r| r["op"]["path"].clone())
        .collect();
    assert_eq!(paths, vec![serde_json::Value::from(s.path("f").to_str().unwrap())]);
}

fn rustix_euid() -> u32 {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn under_libc_coverage_a_process_that_drops_to_a_user_who_cannot_write_the_store_makes_the_undo_incomplete() {
    if rustix_euid() != 0 {
        return; // only root can switch users
    }
    let s = scratch!();
    s.sh("echo before > f; chown 65534 f; chmod 777 .");
    let session = s.session("session");
    let out = s.run_ok_as(
        &session,
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", "echo after > f"],
        Watch::ShimOnly,
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read(s.path("f")).unwrap(), b"after\n");
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "the change made as uid 65534 was not journaled: no complete undo: {r}");
    let why = r["outcomes"][0]["why"].as_str().unwrap();
    assert_eq!(r["outcomes"][0]["outcome"], "skipped");
    assert!(why.contains("uid 65534") && why.contains("setpriv"), "{why}");
}

#[test]
fn under_the_supervisor_a_process_that_drops_to_a_user_who_cannot_write_the_store_is_still_journaled() {
    if rustix_euid() != 0 {
        return; // only root can switch users
    }
    let s = scratch!();
    // The shim in the process running as 65534 cannot open the store (its own marked calls,
    // trying, come just before the program's open, which must still reach the supervisor).
    s.sh("echo before > f; chown 65534 f; chmod 777 .");
    roundtrip_changing(
        &s,
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", "echo after > f; mkdir d"],
        |during| assert!(during.contains_key(&b"d"[..])),
    );
}

#[test]
fn a_program_run_through_the_dynamic_loader_is_journaled_and_undone_exactly() {
    // ld.so PROGRAM, as ldd and uv run programs: the loader honours LD_PRELOAD.
    let loader = String::from_utf8(
        Command::new("sh")
            .args(["-c", "readelf -l /bin/rm | sed -n 's/.*interpreter: \\(.*\\)]/\\1/p'"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let loader = loader.trim();
    assert!(loader.starts_with('/'), "the loader of /bin/rm: {loader:?}");
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        s.sh("echo keep > f");
        let before = manifest(&s.tree());
        // As the command itself (run checks it), and from a shell (the shim's exec hook).
        let from_shell = format!("{loader} /bin/rm f");
        for (i, argv) in [vec![loader, "/bin/rm", "f"], vec!["sh", "-c", &from_shell]].into_iter().enumerate() {
            let session = s.session(&format!("session{i}"));
            s.run_ok_as(&session, &argv, watch);
            assert!(!s.path("f").exists());
            let (code, r) = s.undo_json(&session);
            assert_complete(code, &r);
            assert_same_tree(&before, &manifest(&s.tree()));
        }
    }
}

#[test]
fn a_command_that_cannot_be_started_leaves_no_session_behind() {
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        let session = s.session("session");
        let out = s.run_as(&session, &["/nonexistent/program"], watch);
        assert_eq!(out.status.code(), Some(127), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!session.exists(), "no empty session for a plain undo to take for the last one");
        // Written with mode 0644: not executable.
        std::fs::write(s.path("plain"), b"x").unwrap();
        let out = s.run_as(&s.session("s2"), &[s.path("plain").to_str().unwrap()], watch);
        assert_eq!(out.status.code(), Some(126), "not executable");
        assert!(!s.session("s2").exists());
    }
}

#[test]
fn a_selective_undo_that_matches_nothing_says_so_and_exits_4() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo 1 > one"]);
    let elsewhere = s.path("never-touched");
    for args in [vec![elsewhere.to_str().unwrap()], vec!["--last", "0"]] {
        let (code, r) = s.undo_json_with(&session, &args);
        assert_eq!(code, 4, "{args:?}: {r}");
        assert_eq!(r["selected"], 0, "{r}");
        let mut argv: Vec<&OsStr> = vec!["undo".as_ref(), "--journal".as_ref(), session.as_os_str()];
        argv.extend(args.iter().map(OsStr::new));
        let out = s.cli(&argv);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("matched no record") && !text.contains("Undo complete"), "{text}");
    }
    assert!(s.path("one").exists(), "nothing was changed");
}

#[test]
fn undo_last_n_counts_steps_not_the_execs_between_them() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo 1 > one; echo 2 > two; /bin/true"]);
    let (code, r) = s.undo_json_with(&session, &["--last", "1"]);
    assert_eq!(code, 0, "{r}");
    assert!(s.path("one").exists() && !s.path("two").exists(), "the last step is the write of two: {r}");
}

#[test]
fn completions_into_a_closed_pipe_end_quietly_with_success() {
    let s = scratch!();
    let cli = artifacts().cli.to_str().unwrap().to_string();
    let out = Command::new("bash")
        .args(["-c", &format!("set -o pipefail; {cli} completions bash | head -c 10 > /dev/null")])
        .current_dir(s.tree())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sessions_says_sealed_for_a_finished_session_and_the_help_lists_every_exit_code() {
    let s = scratch!();
    s.run_ok(&s.session("session"), &["sh", "-c", "echo 1 > one"]);
    let out = s.cli(&["sessions".as_ref()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.contains(" sealed ")), "{text}");
    assert!(!text.contains(" active "), "{text}");
    let help = s.cli(&["--help".as_ref()]);
    let help = String::from_utf8_lossy(&help.stdout);
    for (code, what) in aether_journal::exit_codes::ALL {
        assert!(help.contains(&format!("  {code}  {what}")), "{help}");
    }
}

#[test]
fn a_relative_xdg_state_home_is_named_as_ignored() {
    let s = scratch!();
    let mut cmd = Command::new(&artifacts().cli);
    isolate(&mut cmd, &s.root);
    cmd.arg("sessions").env("XDG_STATE_HOME", "relative/state").env("HOME", s.root.join("home")).current_dir(s.tree());
    let out = cmd.output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("XDG_STATE_HOME is relative"), "{out:?}");
}

#[test]
fn plain_undo_takes_the_newest_session_started_in_the_current_directory_or_above_it() {
    let s = scratch!();
    s.sh("mkdir -p a/sub b && echo a > a/f && echo b > b/f");
    // Two agents, one per directory; the one in b ran last. Sessions under the state directory.
    let run_in = |dir: &str, script: &str| {
        let mut cmd = Command::new(&artifacts().cli);
        cmd.args(["run", "--", "sh", "-c", script]).current_dir(s.path(dir));
        isolate(&mut cmd, &s.root);
        assert!(cmd.output().unwrap().status.success());
    };
    run_in("a", "echo changed > f");
    run_in("b", "echo changed > f");
    let undo_in = |dir: &str, extra: &[&str]| {
        let mut cmd = Command::new(&artifacts().cli);
        cmd.arg("undo").args(extra).current_dir(s.path(dir));
        isolate(&mut cmd, &s.root);
        cmd.output().unwrap()
    };
    // From a subdirectory of a: a's session, though b's is newer, and it says which.
    let out = undo_in("a/sub", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("started in {}", s.path("a").display())));
    assert_eq!(std::fs::read(s.path("a/f")).unwrap(), b"a\n");
    assert_eq!(std::fs::read(s.path("b/f")).unwrap(), b"changed\n", "the other agent's work is untouched");
    let out = undo_in("b", &[]);
    assert!(out.status.success());
    assert_eq!(std::fs::read(s.path("b/f")).unwrap(), b"b\n");
    // Where no session was started, nothing is guessed.
    let out = undo_in(".", &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session was started in"), "{out:?}");
    // --latest keeps the old meaning: the newest of all.
    let out = undo_in(".", &["--latest"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn plain_undo_refuses_to_guess_between_two_sessions_still_running_here() {
    let s = scratch!();
    let mut runs: Vec<std::process::Child> = ["one", "two"]
        .iter()
        .map(|name| {
            let mut cmd = Command::new(&artifacts().cli);
            let script = format!("echo x > {name}; exec sleep 20");
            cmd.args(["run", "--", "sh", "-c", &script]).current_dir(s.tree());
            cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            isolate(&mut cmd, &s.root);
            cmd.spawn().unwrap()
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(s.path("one").exists() && s.path("two").exists()) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut cmd = Command::new(&artifacts().cli);
    cmd.arg("undo").current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    let out = cmd.output().unwrap();
    for r in &mut runs {
        // run passes SIGTERM on to its command, then seals and exits.
        let _ = Command::new("kill").args(["-TERM", &r.id().to_string()]).status();
        let _ = r.wait();
    }
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("still running"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(s.path("one").exists() && s.path("two").exists(), "nothing was undone");
}

#[test]
fn a_bare_preload_session_whose_state_directory_cannot_be_written_journals_in_a_private_fallback_that_undo_finds() {
    let s = scratch!();
    s.sh("echo one > first && echo two > second");
    // An earlier session, in the state directory.
    bash_with_raw_preload(&s, "echo changed > first", None);
    let root = s.root.join("state/aether-journal");
    assert!(root.is_dir());
    // Now nothing can be made there: mode 0555, and for root (who ignores modes) the
    // immutable flag too.
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    let writable = || std::fs::create_dir(root.join("probe")).map(|_| std::fs::remove_dir(root.join("probe"))).is_ok();
    let chattr = |flag: &str| Command::new("chattr").arg(flag).arg(&root).status().is_ok_and(|s| s.success());
    if writable() {
        chattr("+i");
    }
    assert!(
        !writable(),
        "the state directory could not be made unwritable (neither its mode nor chattr +i holds here)"
    );
    let runtime = s.root.join("run");
    std::fs::create_dir(&runtime).unwrap();
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "echo changed > second"]).current_dir(s.tree()).env("LD_PRELOAD", &artifacts().shim);
    isolate(&mut cmd, &s.root);
    cmd.env("XDG_RUNTIME_DIR", &runtime);
    let status = cmd.status().unwrap();
    let mut undo = Command::new(&artifacts().cli);
    undo.args(["undo", "--json"]).current_dir(s.tree());
    isolate(&mut undo, &s.root);
    undo.env("XDG_RUNTIME_DIR", &runtime);
    let out = undo.output().unwrap();
    chattr("-i");
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_dir(runtime.join("aether-journal")).unwrap().count(),
        1,
        "the session went to the fallback"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_complete(out.status.code().unwrap(), &r);
    assert_eq!(std::fs::read(s.path("second")).unwrap(), b"two\n", "the last session is the one undone");
    assert_eq!(std::fs::read(s.path("first")).unwrap(), b"changed\n", "not the earlier one");
}
