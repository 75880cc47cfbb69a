//! End-to-end tests of the capture strategies (issue 5): each one must keep exactly what undo
//! needs, and each fallback must be taken when its strategy cannot be. Speed is measured in
//! bench/, never here.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use crate::common::*;

/// The `before.node` of every change record, in journal order.
fn captured_nodes(log: &serde_json::Value) -> Vec<serde_json::Value> {
    log["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "change")
        .map(|r| r["op"]["before"]["node"].clone())
        .collect()
}

fn ino(p: &std::path::Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn a_big_file_overwritten_by_dd_is_moved_aside_and_undo_puts_its_very_inode_back() {
    let s = scratch!();
    s.sh("head -c 3000000 /dev/urandom > big && chmod 604 big && setfattr -n user.origin -v kept big");
    let original = ino(&s.path("big"));
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(&session, &["dd", "if=/dev/zero", "of=big", "bs=64k", "count=2", "status=none"]);
    let during = std::fs::metadata(s.path("big")).unwrap();
    assert_eq!(during.len(), 131072, "dd wrote what it was asked to");
    assert_eq!(during.mode() & 0o7777, 0o604, "the twin dd wrote into has the original's mode");
    let nodes = captured_nodes(&s.log_json(&session));
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0]["how"], "link", "kept by moving the inode, not by copying: {nodes:?}");
    assert_eq!(nodes[0]["twin"]["ino"], during.ino(), "the record names the twin left in its place");
    let kept = session.join("blobs").join(nodes[0]["blob"].as_str().unwrap());
    assert_eq!(ino(&kept), original, "the store holds the original inode itself");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
    assert_eq!(ino(&s.path("big")), original, "undo moved the very inode back");
}

/// Allocated bytes of every file under `dir`.
fn allocated_under(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        total += if m.is_dir() { allocated_under(&e.path()) } else { m.blocks() * 512 };
    }
    total
}

#[test]
fn a_sparse_file_over_the_copy_budget_is_kept_by_its_data_and_comes_back_sparse() {
    // 1.1 GiB long (over the 1 GiB per-file budget), 8 KiB of it data; GNU truncate opens it
    // for writing (a copy) and cuts it to 1 MiB.
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        s.sh("truncate -s 1100M sparse && printf head | dd of=sparse conv=notrunc status=none && \
              printf tail | dd of=sparse bs=1 seek=1153433596 conv=notrunc status=none");
        let before = manifest(&s.tree());
        let session = s.session("session");
        let out = bounded(
            run_cmd_as(&s, &session, &["truncate".as_ref(), "-s".as_ref(), "1M".as_ref(), "sparse".as_ref()], watch),
            120,
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::metadata(s.path("sparse")).unwrap().len(), 1 << 20);
        let nodes = captured_nodes(&s.log_json(&session));
        assert!(!nodes.is_empty(), "its prior contents were kept, not judged over budget");
        assert!(allocated_under(&session.join("blobs")) < 1 << 20, "the store holds its data, not its holes");
        let (code, r) = s.undo_json(&session);
        assert_complete(code, &r);
        assert_same_tree(&before, &manifest(&s.tree()));
        assert!(std::fs::metadata(s.path("sparse")).unwrap().blocks() * 512 < 1 << 20, "it came back sparse");
    }
}

#[test]
fn a_truncating_open_that_fails_after_the_move_puts_the_original_back() {
    let s = scratch!();
    s.sh("head -c 2000000 /dev/urandom > big");
    let original = ino(&s.path("big"));
    let before = manifest(&s.tree());
    let session = s.session("session");
    // O_DIRECTORY on a regular file: the kernel refuses the open (ENOTDIR) only after the
    // shim has moved the file aside.
    let script = "import os, errno\ntry:\n    os.open('big', os.O_WRONLY | os.O_TRUNC | os.O_DIRECTORY)\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let out = s.run_ok(&session, &[python(), "-c", script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ENOTDIR");
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_eq!(ino(&s.path("big")), original, "the original is back at its name, not a copy");
    let log = s.log_json(&session);
    assert!(log["records"].as_array().unwrap().iter().any(|r| r["kind"] == "call_failed"), "{log}");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_same_tree(&before, &manifest(&s.tree()));
}

#[test]
fn a_running_program_is_never_moved_aside_so_its_truncation_still_fails_with_etxtbsy() {
    let s = scratch!();
    // A copy of the interpreter: over the move-aside threshold, and executable.
    std::fs::copy(std::fs::canonicalize(python()).unwrap(), s.path("busy")).unwrap();
    assert!(std::fs::metadata(s.path("busy")).unwrap().len() > 1 << 20);
    let mut running =
        Command::new(s.path("busy")).args(["-c", "import time; time.sleep(30)"]).spawn().expect("run the copy");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let session = s.session("session");
    let script = "import os, errno\ntry:\n    os.open('busy', os.O_WRONLY | os.O_TRUNC)\n    print('opened')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let out = s.run(&session, &[python(), "-c", script]);
    let _ = running.kill();
    let _ = running.wait();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ETXTBSY", "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::metadata(s.path("busy")).unwrap().len() > 1 << 20, "the program file is untouched");
}

#[test]
fn a_file_reopened_for_writing_unchanged_reuses_the_earlier_copy_and_undo_is_exact() {
    let s = scratch!();
    s.sh("head -c 200000 /dev/urandom > db");
    let before = manifest(&s.tree());
    let session = s.session("session");
    // Three separate processes open it read-write; only the third writes. Then a fourth.
    let open_rw = |write: bool| {
        format!(
            "{} -c \"f = open('db', 'r+b'); {} f.close()\"",
            python(),
            if write { "f.write(b'CHANGED');" } else { "" }
        )
    };
    let script = [open_rw(false), open_rw(false), open_rw(true), open_rw(false)].join(" && ");
    s.run_ok(&session, &["sh", "-c", &script]);
    let log = s.log_json(&session);
    let nodes = captured_nodes(&log);
    assert_eq!(nodes.len(), 4, "{nodes:?}");
    assert!(nodes[0]["hash"].is_string(), "the first capture is a hashed copy: {nodes:?}");
    assert_eq!(nodes[1]["blob"], nodes[0]["blob"], "unchanged since: the copy is reused");
    assert_eq!(nodes[2]["blob"], nodes[0]["blob"]);
    // Changed since (written): not copied anew, journaled as kept by a record holding that copy.
    let changes: Vec<_> = log["records"].as_array().unwrap().iter().filter(|r| r["kind"] == "change").collect();
    assert_eq!(changes[3]["op"]["before"]["state"], "kept", "{log}");
    let by = changes.iter().find(|r| r["seq"] == changes[3]["op"]["before"]["by"]).expect("the kept-by record");
    assert_eq!(by["op"]["before"]["node"]["blob"], nodes[0]["blob"], "it names a record holding that copy: {log}");
    let blobs = walk_files(&session.join("blobs"));
    assert_eq!(blobs, 1, "one copy, of the state before the session");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

#[test]
fn a_reused_blob_that_was_tampered_with_is_never_written_back() {
    let s = scratch!();
    s.sh("head -c 50000 /dev/urandom > db");
    let session = s.session("session");
    let touch = format!("{} -c \"open('db', 'r+b').close()\"", python());
    let write = format!("{} -c \"f = open('db', 'r+b'); f.write(b'NEW'); f.close()\"", python());
    s.run_ok(&session, &["sh", "-c", &format!("{touch} && {touch} && {write}")]);
    let nodes = captured_nodes(&s.log_json(&session));
    assert_eq!(nodes[1]["blob"], nodes[0]["blob"], "{nodes:?}");
    assert!(nodes[1]["hash"].is_null(), "the reusing record carries no hash of its own");
    // Damage the shared blob: both the record that made it and the one reusing it must refuse.
    std::fs::write(session.join("blobs").join(nodes[0]["blob"].as_str().unwrap()), vec![0u8; 50000]).unwrap();
    let during = std::fs::read(s.path("db")).unwrap();
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    let failed: Vec<_> = r["outcomes"].as_array().unwrap().iter().filter(|o| o["outcome"] == "failed").collect();
    assert!(!failed.is_empty() && failed.iter().all(|o| o["why"].as_str().unwrap().contains("tampered")), "{r}");
    assert_eq!(std::fs::read(s.path("db")).unwrap(), during, "no unverified byte was written back");
}

fn walk_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() { walk_files(&e.path()) } else { 1 }
        })
        .sum()
}

#[test]
fn a_removed_file_is_kept_by_a_hard_link_and_comes_back_byte_exact_as_the_same_inode() {
    let s = scratch!();
    s.sh("head -c 70000 /dev/urandom > doomed");
    let original = ino(&s.path("doomed"));
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(&session, &["rm", "doomed"]);
    let nodes = captured_nodes(&s.log_json(&session));
    assert_eq!(nodes[0]["how"], "link", "{nodes:?}");
    let kept = session.join("blobs").join(nodes[0]["blob"].as_str().unwrap());
    assert_eq!((ino(&kept), std::fs::metadata(&kept).unwrap().nlink()), (original, 1), "it lives on in the store");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
    assert_eq!(ino(&s.path("doomed")), original);
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn a_rename_over_a_file_on_another_file_system_falls_back_to_a_copy() {
    require_root("to mount a tmpfs");
    let s = scratch!();
    s.sh("mkdir other");
    let mnt = s.path("other");
    let _guard = mount(&["-t", "tmpfs", "-o", "size=16m", "tmpfs"], &mnt);
    s.sh("echo new > other/tmp && echo old > other/target && head -c 30000 /dev/urandom > other/removed");
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "mv other/tmp other/target && rm other/removed"]);
    let nodes = captured_nodes(&s.log_json(&session));
    let log = s.log_json(&session);
    let records = log["records"].as_array().unwrap();
    // mv tries a no-replace rename first: journaled too, and marked failed once it fails.
    let failed: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["kind"] == "call_failed").map(|r| &r["op"]["of_seq"]).collect();
    let renames: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "rename" && !failed.contains(&&r["seq"]))
        .map(|r| r["op"]["to_before"]["node"].clone())
        .collect();
    assert_eq!(renames.len(), 1);
    assert_eq!(renames[0]["how"], "copy", "the store is on another file system: copied, {renames:?}");
    assert_eq!(nodes.last().unwrap()["how"], "copy", "{nodes:?}");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

/// System calls made by `argv` (run in `dir`, under the shim with a fresh session named
/// `session`), by name, with the number of calls to each; "total" holds the sum.
fn strace_calls(s: &Scratch, session: &str, dir: &std::path::Path, argv: &[&std::ffi::OsStr]) -> BTreeMap<String, u64> {
    if Command::new("strace").arg("-V").output().is_err() {
        panic!("strace is needed (apt-get install strace; .ci/run installs it)");
    }
    let out_file = s.root.join(format!("strace-{session}"));
    let mut cmd = Command::new("strace");
    cmd.arg("-f").arg("-c").arg("-o").arg(&out_file);
    // The environment of the traced program only, not strace's own.
    cmd.arg("-E").arg(format!("LD_PRELOAD={}", artifacts().shim.display()));
    cmd.arg("-E").arg(format!("AETHER_JOURNAL_DIR={}", s.session(session).display()));
    cmd.args(argv).current_dir(dir);
    isolate(&mut cmd, &s.root);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&out_file).unwrap();
    let calls: BTreeMap<String, u64> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.last()?.to_string(), w.get(3)?.parse().ok()?))
        })
        .collect();
    assert!(calls.contains_key("total"), "no strace summary in {text}");
    calls
}

#[test]
fn a_shells_forked_children_find_the_real_execve_looked_up_by_their_parent() {
    // A shell forks only to exec. Looked up in each child, the real `execve` is a `dlsym`
    // there every time, walking every library's symbols on pages the fork did not map in the
    // child; looked up before the fork, once. Counted with the loader's own log of bindings.
    let s = scratch!();
    let session = s.session("session");
    let log = s.root.join("ld");
    let mut cmd =
        run_cmd_libc(&s, &session, &["bash".as_ref(), "-c".as_ref(), "for i in 1 2 3; do /bin/true; done".as_ref()]);
    cmd.env("LD_DEBUG", "bindings").env("LD_DEBUG_OUTPUT", &log);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut lookups = 0;
    let mut trues = 0;
    for entry in std::fs::read_dir(&s.root).unwrap() {
        let path = entry.unwrap().path();
        if !path.file_name().unwrap().to_string_lossy().starts_with("ld.") {
            continue;
        }
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        lookups += text
            .lines()
            .filter(|l| l.contains("libaether_journal.so [0] to ") && l.ends_with("normal symbol `execve'"))
            .count();
        trues += usize::from(text.contains("binding file /bin/true") || text.contains("binding file /usr/bin/true"));
    }
    assert_eq!(trues, 3, "three forked children ran /bin/true");
    assert_eq!(lookups, 1, "the real execve looked up once, by the shell, not once per child");
}

#[test]
fn the_shim_never_asks_for_the_times_of_its_stores_files() {
    // A stat that asks for a file's times marks them seen, and the next write then stamps the
    // file with a fine-grained time (multigrain timestamps, Linux 6.13): on ext4 a transaction
    // of its journal for every record written after the identity check that precedes it (3.0
    // against 1.75 us a record here). So every stat the shim makes of its store asks for the
    // inode, owner and size only. Counted from strace (its `-y` names each descriptor's file):
    // a shell that makes a file, rewrites one from before the session (a copy into `blobs/`,
    // the capture index, the born table) and runs two commands (exec records).
    let s = scratch!();
    s.sh("printf 'before\\n' > old.txt");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo x > made"]);
    let out_file = s.root.join("strace-stats");
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-y", "-qq", "-s", "512", "-e", "trace=fstat,newfstatat,statx,stat,lstat", "-o"]).arg(&out_file);
    cmd.arg("-E").arg(format!("LD_PRELOAD={}", artifacts().shim.display()));
    cmd.arg("-E").arg(format!("AETHER_JOURNAL_DIR={}", session.display()));
    cmd.args(["sh", "-c", "echo new > new.txt; echo again >> old.txt; cat old.txt > copy.txt; /bin/true"]);
    cmd.current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    assert!(cmd.output().expect("strace (.ci/run installs it)").status.success());
    let text = std::fs::read_to_string(&out_file).unwrap();
    let store = std::fs::canonicalize(&session).unwrap().to_string_lossy().into_owned();
    let of_store: Vec<&str> = text.lines().filter(|l| l.contains(&store)).collect();
    assert!(of_store.len() >= 5, "the store's files were looked at: {of_store:#?}");
    let with_times: Vec<&&str> = of_store
        .iter()
        .filter(|l| {
            let mask = l.split(", ").find(|f| f.starts_with("STATX_")).unwrap_or("");
            !l.contains("statx(")
                || ["STATX_MTIME", "STATX_CTIME", "STATX_BASIC_STATS", "STATX_ALL"].iter().any(|t| mask.contains(t))
        })
        .collect();
    assert!(with_times.is_empty(), "stats of the store that ask for its times: {with_times:#?}");
}

/// The system calls `argv` makes (run in the scratch tree, every process counted), under the
/// release shim joining `session` if there is one, else bare.
fn strace_total(s: &Scratch, session: Option<&std::path::Path>, argv: &[&str]) -> u64 {
    strace_total_with(s, session, &[], argv)
}

/// [`strace_total`], with the variables `env` set beside the shim's.
fn strace_total_with(s: &Scratch, session: Option<&std::path::Path>, env: &[(&str, &str)], argv: &[&str]) -> u64 {
    let out_file = s.root.join(format!("strace-total-{}-{}", session.is_some(), env.len()));
    let mut cmd = Command::new("strace");
    cmd.arg("-f").arg("-c").arg("-o").arg(&out_file);
    if let Some(session) = session {
        cmd.arg("-E").arg(format!("LD_PRELOAD={}", release_shim().display()));
        cmd.arg("-E").arg(format!("AETHER_JOURNAL_DIR={}", session.display()));
        for (name, value) in env {
            cmd.arg("-E").arg(format!("{name}={value}"));
        }
    }
    cmd.args(argv).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    assert!(cmd.output().expect("strace (.ci/run installs it)").status.success());
    let text = std::fs::read_to_string(&out_file).unwrap();
    let total = text.lines().find(|l| l.ends_with(" total")).unwrap_or_else(|| panic!("no summary: {text}"));
    total.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Minor page faults (the kernel's accounting, the median of 21 runs) that one way of running
/// a program takes more than another, as the Python expression `difference` computes it from
/// `median(env, argv)` (`argv(i)`: the command of run `i`), `bare` (this environment without
/// the shim) and `shim` (with the release shim joining `session`), run in the scratch tree.
fn median_faults_added(s: &Scratch, session: &std::path::Path, difference: &str) -> i64 {
    let script = [
        "import os, subprocess",
        "def median(env, argv):",
        "    r = []",
        "    for i in range(21):",
        "        p = subprocess.Popen(argv(i), env=env)",
        "        r.append(os.wait4(p.pid, 0)[2].ru_minflt)",
        "    return sorted(r)[10]",
        "bare = {k: v for k, v in os.environ.items() if k not in ('LD_PRELOAD', 'AETHER_JOURNAL_DIR')}",
        "shim = dict(bare, LD_PRELOAD=os.environ['SHIM'], AETHER_JOURNAL_DIR=os.environ['SESSION'])",
        &format!("print({difference})"),
    ]
    .join("\n");
    let mut cmd = Command::new(python());
    cmd.args(["-c", &script]).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd.env("SHIM", release_shim()).env("SESSION", session);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn a_process_that_only_execs_pays_a_counted_number_of_system_calls_to_journal_it() {
    // `env /bin/true` joining an existing session: env opens the store and journals its exec of
    // /bin/true, which changes nothing. Counted, not timed: what every shell's forked child
    // that runs a command pays (26 system calls today beyond the two processes' 11 each: the
    // store's counters and journal opened, the program's name checked, the memory mapped on
    // demand (one mapping for the hook's arena and the permanent region: two before), the
    // record's time (a system call, not the vDSO: two page faults fewer in a forked child),
    // the record written, the new program's ELF headers read to know the shim will see into it).
    // The session's tag in the counters spares the header's five (open, statx, two reads,
    // close) and the counters' check of their magic; `blobs/`, opened at a process's first
    // capture, its four.
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo x > made"]);
    let argv = ["/usr/bin/env", "/bin/true"];
    let calls = strace_total(&s, Some(&session), &argv) - strace_total(&s, None, &argv);
    assert!(calls <= 11 + 11 + 26, "journaling one exec costs {calls} system calls in all (48 today)");
    let log = s.log_json(&session);
    let journaled =
        log["records"].as_array().unwrap().iter().any(|r| r["kind"] == "exec" && r["op"]["argv"][0] == "/bin/true");
    assert!(journaled, "the exec was journaled: {log}");
}

#[test]
fn a_process_that_changes_nothing_pays_a_counted_number_of_system_calls_and_page_faults_for_the_shim() {
    // `/bin/true` joining an existing session, against the same without the shim: counted, not
    // timed, with the shim as it is shipped (the release build). Today the shim adds 11 system
    // calls (the loader's open, read, fstat, four mmaps, close and mprotect of the library,
    // the pid and parent pid the constructor keeps; a fifth mmap, for the statics past the
    // initialised data's page, until shim/src/lazymap.rs) and 8 minor page faults (9 while
    // the constructor registered fork handlers, 19 before shim/startup.ld gathered what
    // starting touches, 12 before the constructor's scan of the environment, the data's first
    // page and three pages of relocated data were gathered or shed; a debug build pays about
    // 55); a change that makes every process touch more pays here.
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "echo x > made"]);
    let calls = strace_total(&s, Some(&session), &["/bin/true"]) - strace_total(&s, None, &["/bin/true"]);
    assert!(calls <= 11, "a process that changes nothing pays {calls} system calls for the shim (11 today)");
    let added = median_faults_added(
        &s,
        &session,
        "median(shim, lambda i: ['/bin/true']) - median(bare, lambda i: ['/bin/true'])",
    );
    let limit = 10;
    assert!(
        added <= limit,
        "a process that changes nothing takes {added} more page faults with the shim (limit {limit})"
    );
}

#[test]
fn a_process_that_makes_one_change_pays_a_counted_number_of_system_calls_and_page_faults_to_journal_it() {
    // `touch` of a new file joining an existing session, against the same with the shim loaded
    // but switched off: counted, not timed, what journaling a process's first change costs it.
    // In the agent loop (bench W12) eight processes a turn journal one change or a few, and
    // that first change is most of what journaling costs the loop (bench/RESULTS.md). Today 20
    // system calls (the counters opened, mapped and closed; the journal opened, moved to a
    // high descriptor and checked; the program's name checked; the new name and its directory
    // looked at; the record's time, the check of the journal's descriptor and the write; the
    // new file's inode, and the pid that tells a vfork child) and 8 minor page faults (the
    // counters' pages, the arena's and the caches', the code of the path); a change that makes
    // the first change dearer pays here.
    let s = scratch!();
    let session = s.session("session");
    // The directory's times are journaled by the session's first change in it, not by touch's.
    s.run_ok(&session, &["sh", "-c", "echo x > made"]);
    let off = [("AETHER_JOURNAL", "off")];
    let calls = strace_total(&s, Some(&session), &["touch", "new.txt"]);
    std::fs::remove_file(s.tree().join("new.txt")).unwrap();
    let calls_off = strace_total_with(&s, Some(&session), &off, &["touch", "new.txt"]);
    let added = calls - calls_off;
    assert!(added <= 20, "journaling one creation costs its process {added} system calls (20 today)");
    // Each run makes a new file.
    let added = median_faults_added(
        &s,
        &session,
        "median(shim, lambda i: ['touch', 'new-on-%d' % i]) \
         - median(dict(shim, AETHER_JOURNAL='off'), lambda i: ['touch', 'new-off-%d' % i])",
    );
    let limit = 10;
    assert!(added <= limit, "journaling one creation takes its process {added} more page faults (limit {limit})");
    // What was counted was journaled: the creations of the shim's runs, none of the others'.
    let log = s.log_json(&session);
    let created = |name: &str| {
        log["records"].as_array().unwrap().iter().any(|r| {
            r["kind"] == "change"
                && r["op"]["before"]["state"] == "absent"
                && r["op"]["path"].as_str().is_some_and(|p| p.ends_with(&format!("/{name}")))
        })
    };
    assert!(created("new.txt") && created("new-on-20"), "the creations were journaled: {log}");
    assert!(!created("new-off-20"), "nothing was journaled with the shim switched off: {log}");
}

/// Where the linker put each of the shim's symbols: its address by demangled name.
fn shim_symbol_address(nm: &str, name: &str) -> u64 {
    let line = nm
        .lines()
        .find(|l| l.split_once(' ').and_then(|(_, rest)| rest.get(2..)) == Some(name))
        .unwrap_or_else(|| panic!("no symbol {name} in the shim"));
    u64::from_str_radix(&line[..line.find(' ').unwrap()], 16).unwrap()
}

/// What a binutils `tool` with `args` prints about the shim.
fn binutils_on_shim(tool: &str, args: &[&str]) -> String {
    binutils_on(&artifacts().shim, tool, args)
}

/// What a binutils `tool` with `args` prints about the library at `lib`.
fn binutils_on(lib: &std::path::Path, tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).arg(lib).output().expect("binutils (.ci/run installs it)");
    assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A section's address and size, from what `readelf -S -W` printed.
fn section_in(readelf: &str, name: &str) -> Option<(u64, u64)> {
    let line = readelf.lines().find(|l| l.contains(&format!(" {name} ")))?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let at = fields.iter().position(|f| *f == name)?;
    let hex = |i: usize| fields.get(i).and_then(|f| u64::from_str_radix(f, 16).ok());
    Some((hex(at + 2)?, hex(at + 4)?))
}

/// `nm -n -C` of the shim.
fn shim_symbols() -> String {
    binutils_on_shim("nm", &["-n", "-C"])
}

#[test]
fn what_every_process_touches_while_the_shim_starts_sits_on_one_code_window_and_two_data_pages() {
    // shim/startup.ld gathers it; counted as page faults above, checked here by where the linker
    // put each piece, which no machine's noise moves. Without the script the constructor and
    // std's argument hook sat in 64 KiB windows of code of their own, and the statics the
    // constructor writes on three pages.
    let nm = shim_symbols();
    let addr = |name: &str| shim_symbol_address(&nm, name);
    let init = addr("aether_journal::shim_init");
    for code in [
        "std::sys::args::unix::imp::ARGV_INIT_ARRAY::init_wrapper",
        // The constructor's scan of the environment, not inlined into it (in `.text` it was a
        // page fault of its own in every process).
        "aether_journal::state::env::capture_early_env",
        // The fork handlers: a fork child faults in each window of code it runs again.
        "aether_journal::before_fork",
        "aether_journal::after_fork_in_child",
    ] {
        assert_eq!(addr(code) >> 16, init >> 16, "{code} is in the 64 KiB window of the shim's constructor");
    }
    // The first page is the one the loader writes anyway (the end of the initialised data);
    // a fork child's handler writes there too, and copies no other page.
    let page = addr("aether_journal::state::identity::OWNER_PID") >> 12;
    for data in [
        "aether_journal::state::identity::OWNER_PPID",
        "aether_journal::kernel::MARK",
        "std::panicking::HOOK",
        "std::panicking::panic_count::GLOBAL_PANIC_COUNT",
        "aether_journal::segment::WRITTEN",
        "aether_journal::segment::MADE",
        "aether_journal::segment::MAPPING",
        "aether_journal::segment::IN_FLIGHT",
        "aether_journal::ops::destinations::GENERATION",
    ] {
        assert_eq!(addr(data) >> 12, page, "{data} is on the page of the constructor's other statics");
    }
    // The copy of the environment, whose state and length lead it, on that page or the next.
    let env = (addr("aether_journal::state::env::EARLY_ENV") + 16) >> 12;
    assert!(env == page || env == page + 1, "the environment's copy starts on the constructor's pages");
}

#[test]
fn a_forked_childs_path_to_its_exec_lies_together_in_the_shipped_shims_code() {
    // A shell's forked child has no page-table entries for its parent's code: each 64 KiB
    // window of the shim's code it runs between its fork and its exec is a page fault again
    // (2-3 us each on the development machine), in every command the shell runs.
    // shim/hot_text.ld puts that path first in the hot code (bench/hot_text.py): at most 64 KiB,
    // two windows at worst, where ordered by how many processes ran each function it spread
    // over 198 KiB and four. Checked by where the linker put it, in the optimised build that
    // is shipped. A function that joins the path belongs in this list, and the layout is then
    // generated again: `fix_env_of` and `push_bytes_json` joined it without either, and sat
    // 300 and 700 KiB away: two page faults more in each forked child. So did the supervised
    // exec's check and marked call (profiled only under a bare preload, the check sat 270 KiB
    // past the rest), and the record checksum's hash for a record of 129 to 240 bytes (placed
    // by count, past the window's end): under `run`, five of the shim's pages faulted in each
    // child of a forking parent before its exec, three after.
    let path = [
        // The fork hook, to which the real fork returns in the child.
        "fork",
        "aether_journal::after_fork_in_child",
        // What bash calls in the child before it execs.
        "sigaction",
        "close",
        "dup2",
        // The exec hook, its check and its record.
        "execve",
        "aether_journal::exec::prepare",
        "aether_journal::exec::fix_env_of",
        "aether_journal::exec::fix_env",
        "aether_journal::guard::Guard::enter",
        "aether_journal::state::store::Store::append_line",
        "aether_journal::internal::start_envelope",
        "aether_journal::internal::end_line",
        "aether_journal::journal::push_bytes_json",
        // The record's checksum: which of these runs depends on the record's length.
        "xxhash_rust::xxh3::xxh3_64_129to240",
        "xxhash_rust::xxh3::xxh3_64_long_default",
        "aether_journal_thread",
        // Under a supervisor: the architecture check and the marked exec.
        "aether_journal::exec::check_architecture",
        "aether_journal::hooks::exec::marked_execve",
    ];
    assert_code_lies_within(&path, 64 << 10, "a forked child's path");
}

/// Checks that the shipped shim's functions `names` lie within `bound` bytes of each other.
fn assert_code_lies_within(names: &[&str], bound: u64, what: &str) {
    let nm = binutils_on(release_shim(), "nm", &["-n", "-C"]);
    let at: Vec<u64> = names.iter().map(|name| shim_symbol_address(&nm, name)).collect();
    let (low, high) = (at.iter().min().unwrap(), at.iter().max().unwrap());
    assert!(high - low <= bound, "{what} spans {} KiB of the shim's code: {names:?} at {at:x?}", (high - low) >> 10);
}

#[test]
fn what_a_program_that_changes_nothing_runs_of_the_shim_lies_together_in_the_shipped_shims_code() {
    // `ls`, `cat` and `grep`, a third of the agent loop's programs, run the constructor and the
    // early returns of a few hooks their libraries call (libselinux's `fopen` and `fclose`, a
    // `closedir`, an `openat`): 9 KiB of the shim's code. Placed by how many processes ran each
    // function, those hooks sat in three windows of their own: an `ls` faulted five of the
    // shim's code windows, where it now faults the constructor's and at most two more
    // (bench/hot_text.py puts what such processes run right after the forked child's path).
    // Measured with the shim on the root file system: 9.0 page faults on the shim's pages for
    // each `ls`, then 7.1; 245-249 a turn of the agent loop, then 199-215.
    let path = ["aether_journal_thread", "fopen", "fclose", "closedir", "openat"];
    assert_code_lies_within(&path, 32 << 10, "what a program that changes nothing runs");
}

#[test]
fn the_shipped_shims_zero_initialised_statics_end_on_its_last_page_of_initialised_data() {
    // Where a library's zero-initialised statics run past the page its initialised data ends
    // on, the loader maps anonymous memory for the rest, in every process that loads it: an
    // `mmap` and a mapping torn down at exit, about 5 us a process on the development machine
    // (the shim's caches made that 370 KiB; they are mapped on demand now, shim/src/lazymap.rs,
    // and counted as a system call above). Checked on the loadable segments as the loader reads
    // them, in the optimised build that is shipped.
    let shim = release_shim();
    let headers = binutils_on(shim, "readelf", &["-l", "-W"]);
    let hex = |f: &str| u64::from_str_radix(f.trim_start_matches("0x"), 16).expect("readelf prints hex");
    let last = headers
        .lines()
        .rfind(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .expect("the shim has loadable segments");
    // LOAD offset vaddr paddr filesz memsz flags align
    let (vaddr, filesz, memsz) = (hex(&last[2]), hex(&last[4]), hex(&last[5]));
    let file_end_page = (vaddr + filesz).next_multiple_of(4096);
    assert!(
        vaddr + memsz <= file_end_page,
        "the statics end {:#x} bytes past the page the file's data ends on (at {:#x}): the loader \
         maps anonymous memory for them in every process",
        vaddr + memsz - file_end_page,
        file_end_page
    );
}

#[test]
fn the_shipped_shims_run_of_zero_bytes_sits_after_everything_else_it_reads() {
    // The 64 KiB of zeros a capture hashes for a sparse file's holes, left among the read-only
    // data, filled the image's second 64 KiB window and pushed the constants after it there: a
    // page fault of its own in every process that journals (shim/startup.ld puts it last).
    let shim = release_shim();
    let sections = binutils_on(shim, "readelf", &["-S", "-W"]);
    let section = |name: &str| section_in(&sections, name).expect("the shim has the section");
    let zeros = shim_symbol_address(&shim_symbols(), "aether_journal::capture::hash_zeros::ZEROS");
    let (rodata, rodata_size) = section(".rodata");
    let (except, except_size) = section(".gcc_except_table");
    assert!(zeros >= except + except_size, "the zeros at {zeros:#x} precede the end of .gcc_except_table");
    assert!(rodata + rodata_size <= zeros, "the zeros at {zeros:#x} are among the read-only data");
}

#[test]
fn the_shipped_shim_relocates_no_table_of_its_hooks_and_its_read_only_data_spans_three_pages() {
    // The loader writes, and so copies, every page of relocated data in every process. Looked
    // up by index, the hook table (a self-test's) became through LLVM two tables of 122
    // addresses each (the names and the `Real`s): 247 relocations and most of a page; the
    // table is walked by straight-line code now (`table::each_hook`). And the data made
    // read-only after relocation starts a page (`-z separate-loadable-segments`, shim/build.rs):
    // where it happened to begin, its 12 KiB took four pages, now three. Only the optimised
    // build shows either, so it is the one checked.
    let shim = release_shim();
    let sections = binutils_on(shim, "readelf", &["-S", "-W"]);
    let section = |name: &str| section_in(&sections, name).expect("the shim has the section");
    let names = section(".rodata.hook_names");
    let (bss, bss_size) = section(".bss");
    let statics = (section(".bss.startup").0, bss + bss_size);
    let targets: Vec<u64> = binutils_on(shim, "readelf", &["-r", "-W"])
        .lines()
        .filter(|l| l.contains("R_X86_64_RELATIVE"))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(3)?, 16).ok())
        .collect();
    assert!(targets.len() > 100, "only {} relative relocations found", targets.len());
    let to_names = targets.iter().filter(|&&t| (names.0..names.0 + names.1).contains(&t)).count();
    let to_statics = targets.iter().filter(|&&t| (statics.0..statics.1).contains(&t)).count();
    assert_eq!((to_names, to_statics), (0, 0), "relocated addresses of hook names and of the shim's statics");
    // 809 before the hook table's lookup tables went, 562 now: room for growth, not for them.
    assert!(targets.len() <= 650, "{} relative relocations", targets.len());
    let relro = binutils_on(shim, "readelf", &["-l", "-W"])
        .lines()
        .find(|l| l.trim_start().starts_with("GNU_RELRO"))
        .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
        .expect("the shim has a RELRO segment");
    let (at, size) =
        (u64::from_str_radix(&relro[2][2..], 16).unwrap(), u64::from_str_radix(&relro[4][2..], 16).unwrap());
    assert_eq!(at % 4096, 0, "the read-only-after-relocation data starts at {at:#x}, not on a page");
    let pages = (at + size).div_ceil(4096) - at / 4096;
    assert!(pages <= 3, "the read-only-after-relocation data spans {pages} pages ({size:#x} bytes from {at:#x})");
}

#[test]
fn the_loader_s_writes_to_the_shim_s_data_and_the_constructor_s_statics_share_one_page() {
    // The loader relocates the initialised data and zeroes the tail of its last page; the
    // constructor writes its statics and the environment's copy after it. shim/startup.ld
    // moves std's backtrace cache (2.3 KiB nobody touches) to a page of its own and starts the
    // rest of the data on a page: one page written at start instead of two, and the same one
    // whatever precedes it (before, whether the statics shared it depended on where the data
    // happened to begin).
    let nm = shim_symbols();
    let addr = |name: &str| shim_symbol_address(&nm, name);
    let page = addr("aether_journal::state::identity::OWNER_PID") >> 12;
    let sections = binutils_on_shim("readelf", &["-S", "-W"]);
    let section = |name: &str| section_in(&sections, name);
    let (data, data_size) = section(".data").expect("the shim has .data");
    assert_eq!(data >> 12, page, ".data starts on page {:#x}, not the constructor's ({page:#x})", data >> 12);
    assert_eq!((data + data_size - 1) >> 12, page, ".data ends past the constructor's page");
    // Every address the loader writes from the start of the writable, non-RELRO data on.
    let (cold, _) = section(".data.cold").unwrap_or((data, 0));
    let written: Vec<u64> = binutils_on_shim("readelf", &["-r", "-W"])
        .lines()
        .filter(|l| l.contains("R_X86_64_"))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
        .filter(|&at| at >= cold.min(data))
        .collect();
    assert!(!written.is_empty(), "no relocation of the shim's data found");
    for at in written {
        assert_eq!(at >> 12, page, "the loader writes {at:#x}, off the constructor's page ({page:#x})");
    }
    // The environment's copy: its state, length and a few hundred bytes of entries.
    let env = addr("aether_journal::state::env::EARLY_ENV");
    assert_eq!((env + 16 + 512) >> 12, page, "the environment's copy leaves the constructor's page");
}

#[test]
fn the_constructors_scan_of_the_environment_calls_nothing_in_libc() {
    // Every process of a session runs it: a call of libc's `strlen` there (through
    // `CStr::from_ptr`) was a page of libc's code that `/bin/true` does not otherwise touch, a
    // page fault in about one process in eight (perf's page-fault records: 78 faults on that
    // page in 200 processes, against 54 under the do-nothing library). A call of libc goes
    // through the GOT or the PLT: an indirect `call *` or a `@plt` target. Checked in the
    // optimised build that is shipped (an unoptimised one calls its own helpers through the
    // GOT, and copies with libc's `memcpy`).
    let asm = binutils_on(release_shim(), "objdump", &["-d", "--no-show-raw-insn", "-C"]);
    let start =
        asm.find("<aether_journal::state::env::capture_early_env>:").expect("capture_early_env in the shim's code");
    let body = asm[start..].split("\n\n").next().unwrap_or_default();
    let calls: Vec<&str> =
        body.lines().filter(|l| l.contains("call") && (l.contains('*') || l.contains("@plt"))).collect();
    assert!(calls.is_empty(), "the constructor's scan of the environment calls out of the shim: {calls:?}");
}

#[test]
fn the_names_hooks_look_up_in_libc_lie_in_the_window_the_loader_reads_in_every_process() {
    // A hook's first call looks its libc function up by name (dlsym reads the name). The
    // loader reads the image's first 64 KiB (headers, symbol tables) in every process, so the
    // names are put there (shim/startup.ld); among the other constants they were spread over
    // three pages of a window of their own, a page fault in nearly every process.
    let nm = shim_symbols();
    let (dynstr, _) = section_in(&binutils_on_shim("readelf", &["-S", "-W"]), ".dynstr").expect("the shim has .dynstr");
    let names: Vec<(u64, &str)> = nm
        .lines()
        .filter(|l| l.contains("aether_journal::hooks::table::") && l.ends_with("::BYTES"))
        .map(|l| (u64::from_str_radix(&l[..l.find(' ').unwrap()], 16).unwrap(), l))
        .collect();
    assert!(names.len() >= 100, "only {} hook names are statics of their own", names.len());
    for (at, line) in names {
        assert_eq!(at >> 16, dynstr >> 16, "{line} is outside the window of .dynstr ({dynstr:#x})");
    }
}

#[test]
fn the_constants_a_journaling_process_reads_first_lie_in_the_window_the_loader_reads() {
    // The personality routine's tables (`.gcc_except_table`, 27 KiB, read only while a panic
    // unwinds) sat between the symbol tables and the read-only data, and pushed the constants
    // every journaling process reads (the `AETHER_*` names its configuration looks up, the
    // name of its program's `/proc` entry) out of the first 64 KiB of the image, which the
    // loader reads in every process: measured, 13 to 18 page faults fewer in a turn of the
    // agent loop with them in it. shim/startup.ld puts the tables after the unwinding
    // information. Where the linker puts things depends on the optimised build's sizes, so
    // that build is the one checked; the image's first segment starts at file offset 0, so an
    // offset in the file is an address in the image.
    let shim = release_shim();
    let sections = binutils_on(shim, "readelf", &["-S", "-W"]);
    let section = |name: &str| section_in(&sections, name).expect("the shim has the section").0;
    let (rodata, eh_frame, tables) = (section(".rodata"), section(".eh_frame"), section(".gcc_except_table"));
    assert!(
        tables > rodata && tables > eh_frame,
        "the unwinding tables at {tables:#x} precede the read-only data ({rodata:#x}) or the unwinding information ({eh_frame:#x})"
    );
    let image = std::fs::read(shim).unwrap();
    for constant in ["AETHER_JOURNAL_MAX_FILE", "/proc/self/cmdline"] {
        let at = image
            .windows(constant.len())
            .position(|w| w == constant.as_bytes())
            .unwrap_or_else(|| panic!("no {constant} in the shim"));
        assert!(at < 0x10000, "{constant} is at {at:#x}, past the image's first 64 KiB");
    }
}

#[test]
fn what_hooks_exit_and_a_fork_child_write_shares_the_constructor_s_two_data_pages() {
    // Every process writes some of these (a hook's pointer to libc's function on its first
    // call, the store and segment state when it journals, the fork child's generation): left
    // in `.bss` they were on five pages, each a page fault in a process and a copy in a fork
    // child. shim/startup.ld puts them beside the constructor's.
    let nm = shim_symbols();
    let addr = |name: &str| shim_symbol_address(&nm, name);
    let page = addr("aether_journal::state::identity::OWNER_PID") >> 12;
    let mut hot: Vec<String> =
        ["open", "openat", "close", "fclose", "sigaction", "dup2", "execve", "waitpid", "rename"]
            .iter()
            .map(|hook| format!("aether_journal::hooks::table::{hook}::REAL"))
            .collect();
    hot.extend(
        [
            "aether_journal::guard::ASYNC_HANDLERS",
            "aether_journal::state::store::STORE",
            "aether_journal::state::config::CONFIG",
            "aether_journal::segment::CURRENT",
            "aether_journal::fdmemo::CREATED",
            "aether_journal::dircache::LOCAL_GEN",
            "aether_journal::execmemo::ANY",
        ]
        .map(String::from),
    );
    for data in &hot {
        let at = addr(data) >> 12;
        assert!(at == page || at == page + 1, "{data} is on page {at:#x}, not the constructor's ({page:#x}, +1)");
    }
}

#[test]
fn the_code_a_forked_shell_child_runs_before_its_exec_follows_the_constructor_s() {
    // shim/hot_text.ld (bench/hot_text.py) puts the functions the agent loop's processes run
    // right after the constructor's code, most used first: a process touches a few 64 KiB
    // windows of the shim's code instead of one per place its hooks sat in, and a fork child,
    // whose code pages the kernel does not copy, pays each window again.
    let sections = binutils_on_shim("readelf", &["-S", "-W"]);
    let section = |name: &str| section_in(&sections, name).expect("the shim has the section");
    let (start, size) = section(".text.hot");
    let nm = shim_symbols();
    // The PLT, through which every thread-local access goes, in the constructor's window too.
    let init = shim_symbol_address(&nm, "aether_journal::shim_init");
    assert_eq!(section(".plt").0 >> 16, init >> 16, "the PLT is in the 64 KiB window of the shim's constructor");
    for code in [
        "sigaction",
        "close",
        "execve",
        "aether_journal::exec::prepare",
        "aether_journal::state::store::exec_store",
        "aether_journal::guard::Guard::enter",
    ] {
        let a = shim_symbol_address(&nm, code);
        assert!((start..start + size).contains(&a), "{code} at {a:#x} is outside .text.hot ({start:#x}+{size:#x})");
    }
    // What LLVM took for cold (`#[cold]`: std's vector growth, in `.text.unlikely.NAME`) too.
    let grows: Vec<u64> = nm
        .lines()
        .filter(|l| l.contains("RawVecInner") && l.ends_with("::finish_grow"))
        .map(|l| u64::from_str_radix(&l[..l.find(' ').unwrap()], 16).unwrap())
        .collect();
    assert!(
        grows.iter().any(|a| (start..start + size).contains(a)),
        "no RawVecInner::finish_grow in .text.hot ({start:#x}+{size:#x}): {grows:x?}"
    );
}

#[test]
fn loading_the_shim_looks_up_no_symbol_the_shim_defines_itself() {
    // Each symbol the loader looks up costs a process a walk of every loaded object's hash
    // table (about 0.2 us here, a few cache misses each): the shim's own calls to functions it
    // exports (std's `close`, the exec bodies' `execve`) are bound when it is linked
    // (-Bsymbolic-functions in shim/build.rs), not looked up in every process.
    let defined: std::collections::BTreeSet<String> = binutils_on_shim("nm", &["-D", "--defined-only"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
        .collect();
    let looked_up: Vec<String> = binutils_on_shim("readelf", &["-r", "-W"])
        .lines()
        .filter(|l| l.contains("R_X86_64_") && !l.contains("RELATIVE"))
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|s| s.split('@').next().unwrap_or(s).to_string())
        .filter(|s| defined.contains(s))
        .collect();
    assert!(looked_up.is_empty(), "the loader looks up the shim's own {looked_up:?} in every process");
}

#[test]
fn loading_the_shim_looks_up_a_counted_number_of_libc_functions() {
    // Each function the shim imports is a symbol the loader looks up in every process that
    // loads it (about 0.2 us each here: 30 imports cost a do-nothing library about 6 us a
    // spawn). The core's session code reads and writes the counters' magic, syncs and asks for
    // its pid through rustix, not std, and the shim asks for its seccomp mode with a raw call:
    // 59 imports before, 54 then in a release build (63 and 58 in a debug one, whose
    // unoptimised std reaches more); `getauxval` since (the program's name without /proc).
    // Then 54 (no fork handlers), and 30 (34 in a debug build) since most functions no process
    // that changes nothing calls are looked up on first use instead (shim/src/imports.c:
    // measured 4-6 us less of a spawn of /bin/true). Then 27 (31), since the guard holds
    // signals back with a raw `rt_sigprocmask` rather than libc's three signal functions. Then
    // 21 (25), since std's weak `statx` and `gettid` and the unwinder's four pthread functions
    // are looked up on first use too (6,400 instructions less of a /bin/true under callgrind).
    // Then 17 (21), since the shim is linked without the C start files, whose code imported
    // `__cxa_finalize`, `__gmon_start__` and the two `_ITM_` tables (3,600 instructions). The
    // limits leave room for two more, which another release of std may import (the workspace
    // builds from Rust 1.88 on); the code before that change (21 in a release build) fails
    // them.
    let imports: Vec<String> = binutils_on_shim("nm", &["-D", "--undefined-only"])
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(|s| s.split('@').next().unwrap_or(s).to_string()))
        .collect();
    let limit = if cfg!(debug_assertions) { 23 } else { 19 };
    assert!(imports.len() <= limit, "the shim imports {} symbols (limit {limit}): {imports:?}", imports.len());
    let signal_functions: Vec<&String> =
        imports.iter().filter(|i| i.starts_with("sig") || i.contains("sigmask") || i.contains("sigprocmask")).collect();
    assert!(signal_functions.is_empty(), "the guard's masking imports {signal_functions:?}");
    // The functions looked up on first use are defined in the shim but never exported (hidden,
    // and outside the version script rustc writes): exported, they would take the program's own
    // calls of `getenv` or `read`.
    let lazy = std::fs::read_to_string(repo_root().join("shim/src/imports.c")).expect("shim/src/imports.c");
    let names: Vec<&str> =
        lazy.lines().filter_map(|l| l.strip_prefix("LAZY(")?.split(", ").nth(1)).chain(["abort"]).collect();
    assert!(names.len() > 20, "the names of shim/src/imports.c: {names:?}");
    let exported = binutils_on_shim("nm", &["-D", "--defined-only"]);
    let exported: Vec<&str> = exported
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|name| names.contains(&name.split('@').next().unwrap_or(name)))
        .collect();
    assert!(exported.is_empty(), "the shim exports its lazily looked-up {exported:?}");
}

#[test]
fn each_libc_function_the_shipped_shim_calls_is_looked_up_once_at_load() {
    // Under full RELRO the loader binds every GOT entry and every PLT slot at load, each in a
    // lookup of its own, and a function called both ways is looked up twice. The shim's C
    // files are compiled with -fno-plt, and the statically linked unwinder's PLT calls of
    // `malloc`, `free` and `strlen` reach wrappers that call through the GOT (`--wrap`, see
    // shim/build.rs): before that, `dlsym`, `__errno_location` and those three each had a PLT
    // slot too, five lookups more in every process (3,400 instructions of a /bin/true under
    // callgrind). What keeps a slot is `__tls_get_addr`, which rustc's thread-local accesses
    // call through the PLT and nothing calls through the GOT. The release build is what ships
    // (a debug build's unoptimised code calls `memcpy` and `memset` through the PLT as well).
    let relocations = binutils_on(release_shim(), "readelf", &["-r", "-W"]);
    let slots: Vec<&str> = relocations
        .lines()
        .filter(|l| l.contains("R_X86_64_JUMP_SLOT"))
        .filter_map(|l| l.split_whitespace().nth(4)?.split('@').next())
        .collect();
    assert_eq!(slots, ["__tls_get_addr"], "the shim's PLT slots (each a lookup at load besides its GOT entry's)");
}

#[test]
fn loading_the_shim_registers_no_fork_handlers() {
    // Registering `pthread_atfork` handlers in the constructor wrote libc's pages of handlers
    // in every process: 4-5.6 us of a `/bin/true` that never forks, and one page fault of the
    // ones counted above (9 then, 8 since). The fork hooks do that work around the real call
    // instead (shim/src/hooks/exec.rs, `fork_`); a shim that registers handlers imports
    // `__register_atfork` (what `pthread_atfork` calls) or `pthread_atfork`.
    let imports = binutils_on_shim("nm", &["-D", "--undefined-only"]);
    let registers: Vec<&str> = imports.lines().filter(|l| l.contains("atfork")).collect();
    assert!(registers.is_empty(), "the shim registers fork handlers: {registers:?}");
}

/// A copy of /bin/true in the tree (`prog`), left unchanged long enough to be vouched for
/// (exec_check::Vouched::SETTLED), and the static busybox the tests put in its place.
fn settled_true_and_busybox(s: &Scratch) -> (std::path::PathBuf, &'static str) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists());
    let busybox = busybox.expect("busybox-static is needed by this test; .ci/run installs it");
    let prog = s.path("prog");
    std::fs::copy("/bin/true", &prog).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    (prog, busybox)
}

#[test]
fn a_program_a_process_starts_again_is_read_once_until_it_changes_and_a_static_one_put_in_its_place_is_named() {
    // Python's subprocess (vfork, like posix_spawn, shares the parent's memory with the exec
    // hook) starts a copy of /bin/true four times: its headers are read for the exec check
    // once. Then the copy is rewritten in place with a static busybox, put back, and replaced
    // by a static busybox through a rename: each change is read again, and each static run is
    // named unobserved (a remembered verdict taken on the name alone would have missed them).
    let s = scratch!();
    let (prog, busybox) = settled_true_and_busybox(&s);
    let script = s.root.join("starts.py");
    std::fs::write(
        &script,
        [
            "import os, shutil, subprocess, sys",
            "prog, busybox = sys.argv[1], sys.argv[2]",
            "for _ in range(4): subprocess.run([prog], check=True)",
            "shutil.copyfile(busybox, prog)",
            "subprocess.run([prog], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
            "shutil.copyfile('/bin/true', prog)",
            "subprocess.run([prog], check=True)",
            "shutil.copyfile(busybox, prog + '.new'); os.chmod(prog + '.new', 0o755); os.rename(prog + '.new', prog)",
            "subprocess.run([prog], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
        ]
        .join("\n"),
    )
    .unwrap();
    let session = s.session("session");
    let trace = trace_joining(
        &s,
        &session,
        "openat",
        &format!("{} {} {} {busybox}", python(), script.display(), prog.display()),
    );
    let reads = trace.lines().filter(|l| l.contains(&format!("\"{}\", O_RDONLY|O_NONBLOCK", prog.display()))).count();
    assert_eq!(reads, 4, "the program is read for its check at its first start and after each change:\n{trace}");
    let log = s.log_json(&session);
    let unobserved: Vec<_> =
        records_of_kind(&log, "unobserved").iter().map(|r| r["op"]["reason"]["code"].clone()).collect();
    assert_eq!(unobserved, ["static_executable", "static_executable"], "{log}");
}

/// `bash -c script` joining the session at `session` (made first by a command that changes a
/// file) under the shim, traced by `strace -f -y -e trace=calls` (descriptors shown with their
/// paths): the trace's text.
fn trace_joining(s: &Scratch, session: &std::path::Path, calls: &str, script: &str) -> String {
    s.run_ok(session, &["sh", "-c", "echo x > made"]);
    let trace = s.root.join("strace");
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-y", "-qq", "-e", &format!("trace={calls}"), "-o"]).arg(&trace);
    cmd.arg("-E").arg(format!("LD_PRELOAD={}", artifacts().shim.display()));
    cmd.arg("-E").arg(format!("AETHER_JOURNAL_DIR={}", session.display()));
    cmd.args(["bash", "-c", script]).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    assert!(cmd.output().expect("strace (.ci/run installs it)").status.success());
    std::fs::read_to_string(&trace).unwrap()
}

#[test]
fn a_store_named_plainly_is_opened_without_asking_proc_for_its_name() {
    // A session directory named absolutely, with no symlink on the way, is the kernel's name
    // for it already: reading it back through /proc/self/fd costs a fresh process about 25 us
    // here, most of what opening its store costs. (Through a symlink it is still read back:
    // reliability.rs, a_store_reached_through_a_symlink_is_still_known_as_the_store_and_protected.)
    let s = scratch!();
    let session = std::fs::canonicalize(&s.root).unwrap().join("session");
    let text = trace_joining(&s, &session, "readlink,readlinkat,openat2", "echo x > f");
    let journal = format!("\"{}/journal\"", session.display());
    assert!(text.contains(&journal) && text.contains("RESOLVE_NO_SYMLINKS"), "the store was not opened: {text}");
    let read_back: Vec<&str> = text.lines().filter(|l| l.contains("readlink") && l.contains(&journal)).collect();
    assert!(read_back.is_empty(), "the store's name was read back from /proc: {read_back:#?}");
}

#[test]
fn a_program_executed_by_its_plain_name_is_named_without_asking_proc() {
    // Every record names its program. Executed by an absolute name with no symlink on the way
    // (AT_EXECFN), an ELF program's name is the kernel's name for it: /proc/self/exe, about
    // 10 us for a fresh process's first lookup in /proc/self here, is not asked. (A symlink
    // on the way or a script: the next test.) trace_joining makes `made`.
    let s = scratch!();
    let session = s.session("session");
    let cp = std::fs::canonicalize("/bin/cp").unwrap();
    let text = trace_joining(&s, &session, "readlink,readlinkat,openat2", &format!("{} made copy", cp.display()));
    let asked: Vec<&str> =
        text.lines().filter(|l| l.contains("\"/proc/self/exe\"") && l.contains(cp.to_str().unwrap())).collect();
    assert!(asked.is_empty(), "cp's name was read back from /proc: {asked:#?}");
    let log = s.log_json(&session);
    let copy = s.path("copy");
    let made = log["records"].as_array().unwrap().iter().find(|r| r["op"]["path"] == copy.to_str().unwrap()).cloned();
    let made = made.unwrap_or_else(|| panic!("the copy is journaled: {log}"));
    assert_eq!(made["prog"], cp.to_str().unwrap(), "{made}");
}

#[test]
fn a_program_run_through_a_symlink_and_a_script_are_named_as_the_kernel_names_their_executable() {
    // The name a program was executed by is taken only when it is the kernel's: a symlink's
    // name is not (the kernel names its target), nor is a script's (the kernel runs, and
    // names, its interpreter).
    let s = scratch!();
    let tree = std::fs::canonicalize(s.tree()).unwrap();
    let cp = std::fs::canonicalize("/bin/cp").unwrap();
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    std::os::unix::fs::symlink(&cp, tree.join("linked-cp")).unwrap();
    std::fs::write(tree.join("script"), "#!/bin/sh\necho x > by-script\n").unwrap();
    std::fs::set_permissions(tree.join("script"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    s.sh("echo x > made");
    let session = s.session("session");
    let linked = tree.join("linked-cp");
    let script = tree.join("script");
    s.run_libc(&session, &["bash", "-c", &format!("{} made copy; {}", linked.display(), script.display())]);
    let log = s.log_json(&session);
    let prog_of = |name: &str| {
        let path = s.path(name);
        let r = log["records"].as_array().unwrap().iter().find(|r| r["op"]["path"] == path.to_str().unwrap()).cloned();
        r.unwrap_or_else(|| panic!("{name} is journaled: {log}"))["prog"].clone()
    };
    assert_eq!(prog_of("copy"), cp.to_str().unwrap(), "cp run through a symlink is named by its target");
    assert_eq!(prog_of("by-script"), sh.to_str().unwrap(), "a script's changes are its interpreter's");
}

#[test]
fn a_change_in_a_directory_reached_without_symlinks_is_named_without_asking_proc() {
    // The directory of `sub/f` is opened with RESOLVE_NO_SYMLINKS: reached that way, the cwd's
    // name joined with `sub` is its canonical name, and /proc/self/fd (about 25 us for a fresh
    // process's first lookup here) is not asked. Through a symlink it still is: resolve.rs's
    // tests, and every end-to-end test that plants one.
    let s = scratch!();
    let session = s.session("session");
    let text = trace_joining(&s, &session, "readlink,readlinkat,openat2", "mkdir sub; echo x > sub/f; mv sub/f sub/g");
    assert!(
        text.lines().any(|l| l.contains("openat2(") && l.contains("\"sub\"") && l.contains("RESOLVE_NO_SYMLINKS")),
        "sub was not opened plainly: {text}"
    );
    let asked: Vec<&str> = text.lines().filter(|l| l.contains("\"/proc/self/fd/")).collect();
    assert!(asked.is_empty(), "a directory's name was read back from /proc: {asked:#?}");
    let log = s.log_json(&session);
    let renamed = records_of_kind(&log, "rename");
    let tree = std::fs::canonicalize(s.tree()).unwrap();
    assert_eq!(renamed.len(), 1, "{log}");
    assert_eq!(renamed[0]["op"]["to"], format!("{}/sub/g", tree.display()), "{renamed:?}");
}

#[test]
fn a_shell_that_only_writes_to_dev_null_and_probes_its_terminal_opens_no_store() {
    // bash opens /dev/tty read-write as it starts, and `> /dev/null` opens /dev/null for
    // writing: neither is journaled, and neither may cost the process the session's store
    // (its header, counters, journal and blobs directory: about 25 system calls).
    let s = scratch!();
    let session = s.session("session");
    let text = trace_joining(&s, &session, "open,openat,openat2", "echo x > /dev/null; : >> /dev/null");
    assert!(text.contains("\"/dev/null\", O_WRONLY|O_CREAT|O_TRUNC"), "the redirect was not traced: {text}");
    let session_name = session.to_string_lossy().into_owned();
    let store_opens: Vec<&str> = text.lines().filter(|l| l.contains(&session_name)).collect();
    assert!(store_opens.is_empty(), "the shell opened the session's store: {store_opens:#?}");
}

#[test]
fn a_program_that_only_fopens_dev_null_for_writing_opens_no_store() {
    // sed's `w` command opens its file with fopen: stdio's hooks take the same shortcut as the
    // open family. (bash, which execs sed and journals the exec, opens the store itself.)
    let s = scratch!();
    let session = s.session("session");
    let text = trace_joining(&s, &session, "open,openat,openat2,execve", "exec sed -n 'w /dev/null' made");
    // bash execs sed in its own process: what that pid does from sed's execve on.
    let is_sed_exec = |l: &str| l.contains("execve(") && l.contains("sed\"") && l.ends_with("= 0");
    let sed = text
        .lines()
        .find(|l| is_sed_exec(l))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("sed did not run: {text}"));
    let after_exec: Vec<&str> =
        text.lines().filter(|l| l.split_whitespace().next() == Some(sed)).skip_while(|l| !is_sed_exec(l)).collect();
    assert!(
        after_exec.iter().any(|l| l.contains("\"/dev/null\", O_WRONLY|O_CREAT|O_TRUNC")),
        "sed's fopen was not traced: {text}"
    );
    // Every opening of the store opens its counters (the header only when they are not tagged).
    let counters = session.join("counters").to_string_lossy().into_owned();
    let store_opens: Vec<&&str> = after_exec.iter().filter(|l| l.contains(&format!("\"{counters}\""))).collect();
    assert!(store_opens.is_empty(), "sed opened the session's store: {store_opens:#?}");
}

#[test]
fn a_process_that_creates_and_rewrites_files_opens_and_maps_one_shared_table_file() {
    // The counters, the exec verdicts, the capture index and the born table are one file,
    // opened and mapped once by a process that journals: three files took three opens and
    // three mappings (about 8 us a process here, measured paired). A file from before the
    // session rewritten (the capture index) and one made (the born table) need all of them.
    let s = scratch!();
    s.sh("printf 'before\\n' > old.txt");
    let session = s.session("session");
    let text = trace_joining(&s, &session, "open,openat,openat2,mmap", "echo again >> old.txt; echo new > new.txt");
    let dir = session.to_string_lossy().into_owned();
    // strace's -y names each descriptor's file: `"DIR/counters"` as an open's argument,
    // `<DIR/counters>` as a mapped descriptor.
    let names_a_table = |l: &str, open: &str, close: &str| {
        ["counters", "captures", "born"].iter().any(|t| l.contains(&format!("{open}{dir}/{t}{close}")))
    };
    let tables: Vec<&str> = text.lines().filter(|l| l.contains("open") && names_a_table(l, "\"", "\"")).collect();
    assert_eq!(tables.len(), 1, "the shared tables were opened {} times: {tables:#?}", tables.len());
    let mapped: Vec<&str> = text.lines().filter(|l| l.contains("mmap(") && names_a_table(l, "<", ">")).collect();
    assert_eq!(mapped.len(), 1, "the shared tables were mapped {} times: {mapped:#?}", mapped.len());
    for gone in ["captures", "born"] {
        assert!(!session.join(gone).exists(), "{gone} is a file of its own");
    }
    let log = s.log_json(&session);
    let states: Vec<&str> =
        log["records"].as_array().unwrap().iter().filter_map(|r| r["op"]["before"]["state"].as_str()).collect();
    assert!(states.contains(&"absent") && states.iter().any(|st| *st != "absent"), "both were journaled: {log}");
}

#[test]
fn a_shell_running_a_list_of_commands_opens_the_session_store_once() {
    // bash forks for each command but the last, which it execs itself; every exec is
    // journaled. The store the shell opens before its first fork is the one its children
    // journal their execs through, instead of one each (about 25 system calls apiece).
    let s = scratch!();
    let session = s.session("session");
    let text = trace_joining(&s, &session, "open,openat,openat2,execve", "/bin/true; /bin/true; /bin/true");
    let execs = text.lines().filter(|l| l.contains("execve(\"/bin/true\"")).count();
    assert_eq!(execs, 3, "{text}");
    // Every opening of the store opens its counters once (the header only when they are not
    // tagged with the session).
    let counters = session.join("counters").to_string_lossy().into_owned();
    let opens: Vec<&str> = text.lines().filter(|l| l.contains(&format!("\"{counters}\""))).collect();
    assert_eq!(opens.len(), 1, "the session's store was opened {} times: {opens:#?}", opens.len());
    let log = s.log_json(&session);
    let journaled = log["records"].as_array().unwrap().iter().filter(|r| r["op"]["program"] == "/bin/true").count();
    assert_eq!(journaled, 3, "every exec is journaled: {log}");
}

#[test]
fn the_check_before_an_exec_reads_the_program_in_two_reads_and_asks_no_gid() {
    // The ELF header with the program headers after it, then the section headers with the
    // section names before them (Go and Bun are told by a section's name): four reads before.
    // The gid matters only for a set-group-ID program: it was asked before every exec.
    let s = scratch!();
    let session = s.session("session");
    let script = "/bin/true; /bin/true";
    let text = trace_joining(&s, &session, "pread64,getgid,execve", script);
    let execs = text.lines().filter(|l| l.contains("execve(\"/bin/true\"") && l.ends_with("= 0")).count();
    assert_eq!(execs, 2, "{text}");
    let true_path = std::fs::canonicalize("/bin/true").unwrap().to_string_lossy().into_owned();
    let reads = text.lines().filter(|l| l.contains("pread64(") && l.contains(&format!("<{true_path}>"))).count();
    // The second exec takes the first one's verdict from the session (the test below).
    assert_eq!(reads, 2, "{text}");
    let bare_trace = s.root.join("strace-bare");
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-e", "trace=getgid", "-o"]).arg(&bare_trace).args(["bash", "-c", script]);
    isolate(&mut cmd, &s.root);
    assert!(cmd.current_dir(s.tree()).output().unwrap().status.success());
    let gids = |t: &str| t.lines().filter(|l| l.contains("getgid(")).count();
    let bare = std::fs::read_to_string(&bare_trace).unwrap();
    assert_eq!(gids(&text), gids(&bare), "the shim asked for the gid:\n{text}");
}

#[test]
fn a_program_a_shell_runs_again_is_read_once_for_the_session_until_it_changes() {
    // bash forks before each command but the last, and checks the program in the child, whose
    // memory is gone at its exec: the verdict is kept in the session's counters file, where
    // the next child, and the next shell, find it. A static busybox copied over the program in
    // place is read again and named unobserved.
    let s = scratch!();
    let (prog, busybox) = settled_true_and_busybox(&s);
    let session = s.session("session");
    let p = prog.display();
    let script = format!("{p}; {p}; bash -c '{p}; {p}'; cp {busybox} {p}; {p} >/dev/null 2>&1; true");
    let text = trace_joining(&s, &session, "pread64,execve", &script);
    let execs = text.lines().filter(|l| l.contains(&format!("execve(\"{p}\"")) && l.ends_with("= 0")).count();
    assert_eq!(execs, 5, "{text}");
    let reads: Vec<&str> = text.lines().filter(|l| l.contains("pread64(") && l.contains(&format!("<{p}>"))).collect();
    // Two reads for the first check (headers, then sections), one for busybox's (no PT_INTERP).
    assert_eq!(reads.len(), 3, "the program was read for a check {} times: {reads:#?}", reads.len());
    let log = s.log_json(&session);
    let unobserved: Vec<_> =
        records_of_kind(&log, "unobserved").iter().map(|r| r["op"]["reason"]["code"].clone()).collect();
    assert_eq!(unobserved, ["static_executable"], "{log}");
}

#[test]
fn a_truncation_through_dev_stdout_is_journaled_and_undone_like_any_other() {
    // /dev/stdout is a symlink to whatever descriptor 1 is: here a file of the tree, which the
    // second open truncates. A shortcut that left every name in /dev out unresolved would lose
    // the file's prior contents.
    let s = scratch!();
    s.sh("printf 'before\\n' > f");
    let f = s.path("f");
    roundtrip_changing(&s, &["sh", "-c", "exec 1>>f; echo after > /dev/stdout"], |_| {
        assert_eq!(std::fs::read(&f).unwrap(), b"after\n", "the truncation did not happen");
    });
}

#[test]
fn a_read_only_open_costs_no_system_call_of_the_shims_own() {
    let s = scratch!();
    let src = repo_root().join("bench/progs/open_close.c");
    let prog = s.root.join("open_close");
    let o = Command::new("gcc").args(["-O1", "-o"]).arg(&prog).arg(&src).output().expect("gcc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    s.sh("echo data > file && mkdir d");
    // Total system calls of the hooked program for N and 2N open+close pairs: start-up
    // cancels out, and each extra pair must cost exactly its own openat and close.
    let count = |n: u32| -> u64 {
        let n_arg = n.to_string();
        let argv = [prog.as_os_str(), "file".as_ref(), n_arg.as_ref()];
        strace_calls(&s, &format!("session-{n}"), &s.tree(), &argv)["total"]
    };
    let (one, two) = (count(2000), count(4000));
    assert_eq!(two - one, 2 * 2000, "2000 more read-only open+close pairs cost {} system calls", two - one);
}

#[test]
fn a_file_tar_creates_costs_no_stat_of_its_name_or_directory_and_no_fstat_for_its_times_owner_and_mode() {
    // tar x creates each file, then sets its times, owner (as root) and mode through the new
    // descriptor. The shim journals the creation and learns the inode (one statx), and nothing
    // else on a descriptor; past its first records tar journals into a segment of its own
    // (no write, no check of the journal's descriptor); tar installs no signal handler, so no
    // signal mask is touched either.
    let s = scratch!();
    s.sh("mkdir -p src50 src100 x50 x100 && for i in $(seq 50); do echo same > src50/f$i; done && \
          for i in $(seq 100); do echo same > src100/f$i; done && \
          tar cf t50.tar -C src50 . && tar cf t100.tar -C src100 .");
    let count = |n: u32| {
        let archive = s.path(&format!("t{n}.tar"));
        strace_calls(
            &s,
            &format!("tar-{n}"),
            &s.path(&format!("x{n}")),
            &["tar".as_ref(), "xf".as_ref(), archive.as_os_str()],
        )
    };
    let one = count(50);
    let started = std::time::Instant::now();
    let two = count(100);
    let took_ms = started.elapsed().as_millis() as i64;
    let more = |name: &str| two.get(name).copied().unwrap_or(0) as i64 - one.get(name).copied().unwrap_or(0) as i64;
    // The inode is learned with statx (its birth time marks it born in the session).
    assert_eq!(more("fstat") + more("statx"), 50, "one fstat or statx for 50 more files: {one:?} {two:?}");
    assert_eq!(more("write"), 50, "write for 50 more files (tar's own: one each): {one:?} {two:?}");
    // tar creates with O_EXCL in a directory it has just named: the new name is not looked at
    // (the exclusive create), nor the directory (its remembered path, looked at again only
    // once it is 10 ms old: a few times a run under strace, more on a loaded machine, where
    // the larger run takes longer: at most once per 10 ms of it). Without either, 50 or 100
    // more.
    let stats = more("newfstatat") + more("lstat") + more("stat");
    let allowed = 15 + took_ms / 10;
    assert!(stats < allowed, "{stats} stat calls for 50 more files in {took_ms} ms: {one:?} {two:?}");
    assert_eq!(two.get("rt_sigprocmask"), None, "signal masking without a handler: {two:?}");
    assert_eq!(walk_files(&s.path("x100")), 100);
    // A program that has a handler still has its signals held back around the shim's work.
    let bash = |n: u32| {
        let script = format!("trap 'echo' USR1; for i in $(seq {n}); do : > b{n}-$i; done");
        strace_calls(&s, &format!("bash-{n}"), &s.tree(), &["bash".as_ref(), "-c".as_ref(), script.as_ref()])
    };
    let (one, two) = (bash(50), bash(100));
    let masks =
        two.get("rt_sigprocmask").copied().unwrap_or(0) as i64 - one.get("rt_sigprocmask").copied().unwrap_or(0) as i64;
    assert!(masks >= 2 * 50, "50 more changes by a program with a handler: {masks} rt_sigprocmask calls more");
}

/// Runs tests/progs/PROG (with `args`) in a fresh scratch tree prepared by `setup`, checks it
/// printed "ok" and, through `check`, what it did; then undoes the session and requires the
/// tree exactly as before and the undo complete.
fn program_is_undone_exactly(s: Scratch, prog: &str, setup: &str, args: &[&str], check: impl Fn(&Scratch)) {
    let prog = compile(&s, prog);
    s.sh(setup);
    let argv: Vec<&std::ffi::OsStr> =
        std::iter::once(prog.as_os_str()).chain(args.iter().map(|a| a.as_ref())).collect();
    undone_exactly_after(&s, &argv, 60, |out| {
        assert_stdout(out, "ok");
        check(&s);
    });
}

const OLDER_FILE: &str = "echo kept > existing && chmod 644 existing && touch -d 2020-01-01 existing";

#[test]
fn every_way_of_letting_a_created_descriptor_go_makes_the_shim_forget_it() {
    // The same number then names a file that existed before: its changes must be journaled.
    for mode in ["close", "fclose", "close_range", "closefrom", "syscall", "dup2", "dup3", "freopen"] {
        program_is_undone_exactly(scratch!(mode), "fdreuse", OLDER_FILE, &[mode], |_| {});
    }
}

#[test]
fn a_descriptor_a_vfork_child_created_never_hides_a_change_the_parent_makes_through_the_same_number() {
    program_is_undone_exactly(scratch!(), "vforkmemo", OLDER_FILE, &[], |_| {});
}

#[test]
fn a_stream_reopened_for_writing_by_freopen_null_is_captured_through_its_own_name() {
    program_is_undone_exactly(scratch!(), "freopennull", "printf 'the original bytes\\n' > existing", &[], |s| {
        assert_eq!(std::fs::read_to_string(s.path("existing")).unwrap(), "replaced\n")
    });
}

/// The `before.state` of every change record of `log` for the path ending in `name`.
fn states_of(log: &serde_json::Value, name: &str) -> Vec<String> {
    log["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "change" && r["op"]["path"].as_str().is_some_and(|p| p.ends_with(name)))
        .map(|r| r["op"]["before"]["state"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Runs `sh -c script` in a new session, lets `check` look at its log, then undoes it and
/// requires the tree exactly as it was and the undo complete.
fn journaled_then_undone_exactly(s: &Scratch, script: &str, check: impl FnOnce(&serde_json::Value)) {
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", script]);
    check(&s.log_json(&session));
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

#[test]
fn files_the_session_created_are_rewritten_by_its_other_processes_without_a_copy_and_undo_is_exact() {
    let s = scratch!();
    s.sh("head -c 40000 /dev/urandom > pre.bin && printf 'int f(void) { return 1; }\\n' > x.c && mkdir tmp");
    // Each step is its own process: shell redirection, cp over, Python, dd in place, and a
    // compiler run twice (cc1 truncates the temporary file its driver made). pre.bin existed
    // before the session: it is copied once, and its second rewrite is kept by that copy.
    let script = format!(
        "echo one > out.txt && cp x.c out.txt && {py} -c \"open('out.txt', 'w').write('two')\" \
         && printf 3 | dd of=out.txt conv=notrunc status=none \
         && TMPDIR=$PWD/tmp gcc -c x.c -o x.o && TMPDIR=$PWD/tmp gcc -c x.c -o x.o \
         && head -c 100 /dev/urandom > pre.bin && head -c 200 /dev/urandom > pre.bin",
        py = python()
    );
    journaled_then_undone_exactly(&s, &script, |log| {
        let out = states_of(log, "/out.txt");
        assert_eq!(
            out,
            ["absent", "born", "born", "born"],
            "created once, then each rewrite journaled with nothing kept"
        );
        // `as` unlinks an old object before writing a new one: that removal keeps the inode by a
        // hard link (the removal path is unchanged); it is never copied.
        let obj = states_of(log, "/x.o");
        assert_eq!(obj.iter().filter(|c| *c == "absent").count(), 2, "{obj:?}");
        let copied: Vec<_> = log["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["op"]["before"]["node"]["how"] == "copy")
            .map(|r| r["op"]["path"].as_str().unwrap().rsplit('/').next().unwrap().to_owned())
            .collect();
        assert_eq!(copied, ["pre.bin"], "only the file made before the session is copied, once: {log}");
        let temp_writes: Vec<_> = log["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["kind"] == "change" && r["op"]["path"].as_str().is_some_and(|p| p.contains("/tree/tmp/cc")))
            .filter(|r| r["op"]["before"]["state"] == "contents" && r["call"] != "unlink")
            .collect();
        assert!(
            temp_writes.is_empty(),
            "the compiler's temporary files are not copied when rewritten: {temp_writes:?}"
        );
        let temps = log["records"].as_array().unwrap().iter().filter(|r| r["kind"] == "temp_name").count();
        assert_eq!(temps, 2, "the compiler made its temporaries in the tree's tmp/: {log}");
        assert_eq!(states_of(log, "/pre.bin"), ["contents", "kept"], "copied once, then kept by that copy: {log}");
    });
}

#[test]
fn a_database_several_processes_update_is_copied_once_and_undo_is_exact() {
    // Each sqlite3 run opens the database read-write and changes it: the first copies it
    // whole; the later ones find it changed since that copy and are journaled as kept by it.
    let s = scratch!();
    s.sh("sqlite3 db.sqlite 'create table t(a, b); insert into t values (1, 2);' && head -c 300000 /dev/urandom > pad && sqlite3 db.sqlite \"insert into t values (3, hex(randomblob(100000)))\"");
    let update = |n: u32| format!("sqlite3 db.sqlite \"insert into t values ({n}, {n}); update t set a = a + 1;\"");
    journaled_then_undone_exactly(&s, &[update(10), update(20), update(30), update(40)].join(" && "), |log| {
        assert_eq!(states_of(log, "/db.sqlite"), ["contents", "kept", "kept", "kept"], "{log}");
        let copies =
            log["records"].as_array().unwrap().iter().filter(|r| r["op"]["before"]["node"]["how"] == "copy").count();
        assert_eq!(copies, 1, "the database is copied once: {log}");
    });
}

#[test]
fn a_file_with_two_names_is_copied_again_when_rewritten_through_the_other_name() {
    // Undo puts a copy back through the name it was taken from; a rewrite through the other
    // name must keep its own copy rather than lean on that one.
    let s = scratch!();
    s.sh("head -c 20000 /dev/urandom > p && ln p q");
    let write = |name: &str| format!("{} -c \"f = open('{name}', 'r+b'); f.write(b'{name}'); f.close()\"", python());
    journaled_then_undone_exactly(&s, &format!("{} && {}", write("p"), write("q")), |log| {
        assert_eq!(states_of(log, "/q"), ["contents"], "{log}");
    });
}

#[test]
fn undoing_only_the_process_that_rewrote_a_file_the_session_created_is_reported_incomplete() {
    // What the file held before the rewrite was not kept: an undo of the rewriting process
    // alone (or of the newest records alone) must say so, naming the file; an undo that also
    // removes the file is complete.
    let s = scratch!();
    let before = manifest(&s.tree());
    let session = s.session("session");
    let script = format!("echo made > f && {} -c \"open('f', 'w').write('rewritten')\"", python());
    s.run_ok(&session, &["sh", "-c", &script]);
    let log = s.log_json(&session);
    let rewrite =
        log["records"].as_array().unwrap().iter().find(|r| r["op"]["before"]["state"] == "born").unwrap().clone();
    let created = rewrite["op"]["before"]["created"].as_u64().unwrap();
    let creation = log["records"].as_array().unwrap().iter().find(|r| r["seq"] == created).unwrap();
    assert_eq!(
        (creation["op"]["path"].as_str(), creation["op"]["before"]["state"].as_str()),
        (rewrite["op"]["path"].as_str(), Some("absent"))
    );
    let pid = rewrite["pid"].to_string();
    let out = s.cli(&[
        "undo".as_ref(),
        "--json".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
        "--journal".as_ref(),
        session.as_os_str(),
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["complete"], false, "{r}");
    let step = r["outcomes"].as_array().unwrap().iter().find(|o| o["path"] == rewrite["op"]["path"]).unwrap();
    assert_eq!(step["outcome"], "skipped", "{r}");
    assert!(step["why"].as_str().unwrap().contains("not kept"), "{r}");
    assert_eq!(std::fs::read_to_string(s.path("f")).unwrap(), "rewritten", "nothing was made up");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn a_file_made_outside_the_session_under_a_born_files_name_is_still_captured() {
    // The session creates `f`; outside the session it is removed and a new `f` made on the
    // freed inode number. The session then truncates it: what it held must be kept. On a
    // private ext4, so that no other test takes the freed number first.
    require_root("to mount a private ext4");
    let s = scratch!();
    s.sh("mkdir fs");
    let mnt = s.path("fs");
    let _guard = loop_ext4(&s.root.join("fs.img"), "8M", &[], "rw", &mnt);
    let session = s.session("session");
    let in_session = |script: &str| {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(&mnt);
        isolate(&mut cmd, &s.root);
        cmd.env("LD_PRELOAD", &artifacts().shim).env("AETHER_JOURNAL_DIR", &session);
        assert!(cmd.status().unwrap().success(), "{script}");
    };
    in_session("echo born > f");
    let born = ino(&mnt.join("f"));
    s.sh("rm fs/f && echo 'made outside the session' > fs/f");
    // ext4 hands the freed number straight out again: the index's entry names this inode.
    assert_eq!(ino(&mnt.join("f")), born, "the inode number was not reused: this test proves nothing here");
    in_session("echo replaced > f");
    let log = s.log_json(&session);
    let changes = states_of(&log, "/f");
    assert_eq!(changes.last().map(String::as_str), Some("contents"), "{changes:?}");
    let kept = captured_nodes(&log).last().unwrap()["blob"].as_str().unwrap().to_owned();
    assert_eq!(std::fs::read_to_string(session.join("blobs").join(kept)).unwrap(), "made outside the session\n");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
}

/// `python3 -c BODY`, with `os` imported and `x` the flags of an exclusive create.
fn exclusive_python(body: &str) -> String {
    format!("{py} -c \"\nimport os\nx = os.O_WRONLY | os.O_CREAT | os.O_EXCL\n{body}\"", py = python())
}

#[test]
fn an_exclusive_create_is_journaled_without_looking_and_one_that_fails_is_marked_failed() {
    // The first exclusive create of a process looks (it learns there whether the file system
    // keeps birth times); later ones are journaled as `exclusive` without an lstat, and one
    // that fails because something is there gets a call_failed record, so undo leaves that
    // file alone.
    let s = scratch!();
    s.sh("echo 'there before' > existing");
    let script = exclusive_python(
        "os.close(os.open('first', x))
try:
    os.open('existing', x)
    raise SystemExit('an exclusive open of an existing file succeeded')
except FileExistsError:
    pass
os.close(os.open('new', x))
os.close(os.open('newer', x))
",
    );
    journaled_then_undone_exactly(&s, &script, |log| {
        assert_eq!(states_of(log, "/first"), ["absent"], "{log}");
        // After a failure the next exclusive create looks first; finding its name free, the
        // one after goes back to not looking.
        assert_eq!(states_of(log, "/new"), ["absent"], "{log}");
        assert_eq!(states_of(log, "/newer"), ["exclusive"], "{log}");
        assert_eq!(states_of(log, "/existing"), ["exclusive"], "{log}");
        let records = log["records"].as_array().unwrap();
        let seq = records
            .iter()
            .find(|r| r["op"]["path"].as_str().is_some_and(|p| p.ends_with("/existing")))
            .map(|r| r["seq"].clone())
            .unwrap();
        let failed = records.iter().filter(|r| r["kind"] == "call_failed" && r["op"]["of_seq"] == seq).count();
        assert_eq!(failed, 1, "the failed exclusive open is marked failed: {log}");
    });
    assert_eq!(std::fs::read_to_string(s.path("existing")).unwrap(), "there before\n");
}

#[test]
fn a_remembered_directory_path_is_never_trusted_after_the_session_moved_what_it_leads_to() {
    // A process names the directory of each file it creates from a memo of directory paths
    // it has just looked at (from the second file in a directory on). Each step below makes a
    // path written the same way lead somewhere else: a symlink replaced, a chdir (through
    // libc, and through syscall), the working directory renamed, and (from a forked child, so
    // through the session's shared generation) a symlink replaced again. A stale memo would
    // journal the second file of each pair under the first one's directory, and undo would
    // leave it behind.
    for attempt in 0.. {
        let s = scratch!(attempt);
        s.sh("mkdir -p d1/sub d2/sub d3/sub d4/sub a/sub b/sub c/sub e/sub w/sub && ln -s d1 link && ln -s d3 link2");
        let script = format!(
            "{py} -c \"
import os, time
x = os.O_WRONLY | os.O_CREAT | os.O_EXCL
def make(p): os.close(os.open(p, x))
make('link/sub/f0')
make('link/sub/f1')
os.unlink('link'); os.symlink('d2', 'link')
make('link/sub/f2')
os.chdir('a'); make('sub/g0'); make('sub/g1')
os.chdir('../b'); make('sub/g2')
os.chdir('../c'); make('sub/h0'); make('sub/h1')
import ctypes
assert ctypes.CDLL(None).syscall(80, b'../e') == 0  # SYS_chdir, past libc's chdir
make('sub/h2')
os.chdir('../w'); make('sub/k0'); make('sub/k1')
os.rename('../w', '../w2'); make('sub/k2')
os.chdir('..')
make('link2/sub/m0')
make('link2/sub/m1')
t = time.monotonic()
pid = os.fork()
if pid == 0:
    os.unlink('link2'); os.symlink('d4', 'link2'); os._exit(0)
os.waitpid(pid, 0)
make('link2/sub/m2')
print(int((time.monotonic() - t) * 1e6))
\"",
            py = python()
        );
        let before = manifest(&s.tree());
        let session = s.session("session");
        let out = s.run_ok(&session, &["sh", "-c", &script]);
        let took_us: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let log = s.log_json(&session);
        for (name, dir) in
            [("f2", "/d2/sub/"), ("g2", "/b/sub/"), ("h2", "/e/sub/"), ("k2", "/w2/sub/"), ("m2", "/d4/sub/")]
        {
            let paths: Vec<_> = log["records"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["op"]["path"].as_str())
                .filter(|p| p.ends_with(&format!("/{name}")))
                .collect();
            assert_eq!(paths.len(), 1, "{name}: {paths:?}");
            assert!(paths[0].ends_with(&format!("{dir}{name}")), "{name} journaled as {}", paths[0]);
        }
        let (code, r) = s.undo_json(&session);
        assert_same_tree(&before, &manifest(&s.tree()));
        assert_complete(code, &r);
        // The forked child's change only tests the shared generation if the parent named the
        // directory again within the time a remembered path is trusted (10 ms).
        if took_us < 8_000 {
            break;
        }
        assert!(attempt < 5, "the fork and wait never took less than 8 ms ({took_us} us)");
    }
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn on_a_file_system_without_birth_times_an_exclusive_create_looks_first_again() {
    // Undo can only tell a file an exclusive open made from one that was there by its birth
    // time. ext4 with 128-byte inodes keeps none: after the process first sees that, its
    // exclusive creates look at the name again (`absent`); the one create in between (the
    // process had seen birth times elsewhere first) is still undone, as for `absent`.
    require_root("to mount a private ext4");
    let s = scratch!();
    s.sh("mkdir nobirth");
    let _guard = loop_ext4(&s.root.join("fs.img"), "8M", &["-I", "128"], "rw", &s.path("nobirth"));
    let script = exclusive_python(
        "for p in ['first', 'second', 'nobirth/a', 'nobirth/b', 'nobirth/c']:
    os.close(os.open(p, x))
",
    );
    journaled_then_undone_exactly(&s, &script, |log| {
        let states: Vec<String> = ["/first", "/second", "/nobirth/a", "/nobirth/b", "/nobirth/c"]
            .iter()
            .flat_map(|n| states_of(log, n))
            .collect();
        assert_eq!(states, ["absent", "exclusive", "exclusive", "absent", "absent"], "{log}");
    });
}

#[test]
fn an_exclusive_create_retried_on_a_taken_name_is_journaled_once_not_per_attempt() {
    // A lock file someone else holds, tried 200 times: the first failure is journaled (with
    // its call_failed); the retries look first and find the name taken, so they journal
    // nothing. Once the lock is free, the next exclusive create takes it and is undone.
    let s = scratch!();
    s.sh("echo held > lock");
    let script = exclusive_python(
        "os.close(os.open('warm', x))
for i in range(200):
    try:
        os.open('lock', x)
        raise SystemExit('took a held lock')
    except FileExistsError:
        pass
os.close(os.open('free', x))
",
    );
    journaled_then_undone_exactly(&s, &script, |log| {
        let records = log["records"].as_array().unwrap();
        let on_lock = records.iter().filter(|r| r["op"]["path"].as_str().is_some_and(|p| p.ends_with("/lock"))).count();
        assert_eq!(on_lock, 1, "{log}");
        assert_eq!(records.iter().filter(|r| r["kind"] == "call_failed").count(), 1, "{log}");
        assert_eq!(states_of(log, "/free"), ["absent"], "the first create after a failure looks: {log}");
    });
    assert_eq!(std::fs::read_to_string(s.path("lock")).unwrap(), "held\n");
}
