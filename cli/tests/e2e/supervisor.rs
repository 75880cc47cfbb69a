//! The seccomp supervisor with real programs that bypass libc: Go (linked with libc and
//! static), inline `syscall` instructions, Rust on rustix, Bun; what reaches the supervisor and
//! what does not (counted in the session's counters page); coverage when the supervisor cannot
//! run; and a supervisor killed mid-session.
//!
//! What these tests cannot do: run without the tools they name (`go`, `bun`, `gcc`, `chattr`,
//! `readelf`): `.ci/run` installs them, and a missing one fails its test loudly.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;

/// The supervisor's notifications in a session, and how many were passes (the counters page:
/// `SLOT_NOTIFIED` and `SLOT_PASSED`, words 16 and 17).
fn notified(session: &Path) -> (u64, u64) {
    let c = std::fs::read(session.join("counters")).expect("counters");
    let word = |i: usize| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap());
    (word(16), word(17))
}

/// Builds `tests/progs/go/NAME.go`, linked with libc (cgo, external linker) or statically
/// (`CGO_ENABLED=0`), once per test binary.
fn go_program(name: &str, static_: bool) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<std::collections::HashMap<(String, bool), PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap();
    if let Some(p) = built.get(&(name.to_string(), static_)) {
        return p.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{}", if static_ { "static" } else { "cgo" }));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/go").join(format!("{name}.go"));
    let mut cmd = Command::new("go");
    cmd.arg("build").arg("-o").arg(&out);
    if static_ {
        cmd.env("CGO_ENABLED", "0");
    } else {
        cmd.env("CGO_ENABLED", "1").arg("-ldflags=-linkmode=external");
    }
    cmd.arg(&src).env("GOCACHE", dir.join("cache")).env("GOPATH", dir.join("path")).env("GOFLAGS", "-mod=mod");
    let o = cmd.output().expect("go is needed by this test; .ci/run installs golang-go");
    assert!(o.status.success(), "go build: {}", String::from_utf8_lossy(&o.stderr));
    let headers = Command::new("readelf").arg("-l").arg(&out).output().expect("readelf (binutils)");
    let dynamic = String::from_utf8_lossy(&headers.stdout).contains("interpreter");
    assert_eq!(dynamic, !static_, "{} is {} linked", out.display(), if dynamic { "dynamically" } else { "statically" });
    built.insert((name.to_string(), static_), out.clone());
    out
}

/// Bun, from the npm registry (`.ci/run` installs it).
fn bun() -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("bun")).find(|b| b.is_file()))
        .unwrap_or_default();
    found.expect("bun is needed by this test; .ci/run installs it (npm install -g bun)")
}

/// An example program of the workspace, built with the test's profile.
fn example(name: &str) -> PathBuf {
    let a = artifacts();
    let profile_dir = a.cli.parent().unwrap();
    let profile = match profile_dir.file_name().and_then(OsStr::to_str) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => "dev".to_string(),
    };
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--quiet", "-p", "aether-journal", "--example", name, "--profile", &profile, "--target-dir"])
        .arg(profile_dir.parent().unwrap())
        .current_dir(repo_root())
        .status()
        .unwrap();
    assert!(status.success());
    profile_dir.join("examples").join(name)
}

/// The fixture every file-operations program here works on.
const FIXTURE: &str = "echo old > existing; echo start > appended; echo r > removed; echo m > renamed-from; \
    echo a > replacing; echo b > replaced; mkdir -p tree/sub; echo t > tree/sub/x; echo c > chmodded; \
    echo 123456 > truncated";

#[test]
fn go_programs_linked_with_libc_and_static_ones_are_journaled_and_undone_exactly() {
    for static_ in [false, true] {
        let prog = go_program("fileops", static_);
        let s = scratch!(format!("{static_}"));
        s.sh(FIXTURE);
        let report = roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| {
            assert!(during.contains_key(&b"made/deep/file"[..]) && !during.contains_key(&b"tree"[..]));
        });
        assert_eq!(report["coverage"]["mode"], "syscalls", "{report}");
        let log = s.log_json(&s.session("session"));
        assert!(records_of_kind(&log, "unobserved").is_empty(), "{log}");
        // Every change is the supervisor's: Go made them with its own system calls.
        let changes = records_of_kind(&log, "change");
        assert!(changes.len() >= 8, "{log}");
        assert!(changes.iter().all(|r| r["prog"].as_str().unwrap().contains("fileops")), "{log}");
        // Its small rewrites were copied into one pack, not into a file each.
        let packs: Vec<_> = ["/existing", "/truncated"]
            .iter()
            .map(|name| {
                let node = before_of(&log, name)["node"].clone();
                assert_eq!(node["type"], "packed", "{name}: {log}");
                node["pack"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(packs[0], packs[1], "{log}");
    }
}

/// The prior state the first change record of a path ending in `name` kept.
fn before_of(log: &serde_json::Value, name: &str) -> serde_json::Value {
    records_of_kind(log, "change")
        .into_iter()
        .find(|r| r["op"]["path"].as_str().is_some_and(|p| p.ends_with(name)))
        .unwrap_or_else(|| panic!("no change of {name}: {log}"))["op"]["before"]
        .clone()
}

#[test]
fn a_packed_copy_whose_bytes_were_changed_in_the_store_is_named_and_never_written_back() {
    let prog = go_program("fileops", true);
    let s = scratch!();
    s.sh(FIXTURE);
    let session = s.session("session");
    s.run_ok(&session, &[prog.to_str().unwrap()]);
    let log = s.log_json(&session);
    // Review reads the prior bytes out of the pack.
    let out = s.cli(&["review".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert!(out.status.success(), "{out:?}");
    let review: serde_json::Value = serde_json::from_slice(&out.stdout).expect("review --json");
    let diff = review["modified"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().is_some_and(|p| p.ends_with("/existing")))
        .and_then(|m| m["diff"].as_str())
        .unwrap_or_else(|| panic!("no diff of existing: {review}"))
        .to_string();
    assert!(diff.contains("-old") && diff.contains("+overwritten by go"), "{diff}");
    let before = before_of(&log, "/existing");
    let node = &before["node"];
    let (pack, at) = (node["pack"].as_str().unwrap(), node["at"].as_u64().unwrap());
    let f = std::fs::OpenOptions::new().write(true).open(session.join("blobs").join(pack)).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"EVIL", at).unwrap();
    drop(f);
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    let existing = r["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["path"].as_str().is_some_and(|p| p.ends_with("/existing")))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(existing["cause"]["code"], "blob_damaged", "{r}");
    assert_eq!(
        std::fs::read_to_string(s.path("existing")).unwrap(),
        "overwritten by go\n",
        "nothing unverified written"
    );
    assert_eq!(std::fs::read_to_string(s.path("truncated")).unwrap(), "123456\n", "the other packed copy is put back");
}

#[test]
fn directories_moved_and_made_again_under_the_same_names_are_never_mistaken_for_each_other() {
    let prog = go_program("dirmoves", true);
    let s = scratch!();
    s.sh("mkdir a b c && echo old > a/f && echo g > b/g && echo cg > c/g && echo keep > c/keep");
    roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| {
        assert!(during.contains_key(&b"moved2/f"[..]) && during.contains_key(&b"b-moved/g"[..]));
        assert!(!during.contains_key(&b"c"[..]) && !during.contains_key(&b"c-moved"[..]));
    });
}

#[test]
fn a_creation_in_a_directory_the_supervisor_remembers_costs_it_five_system_calls() {
    // Counted, not timed: the supervisor's system calls between its first receive and its last
    // answer, for 300 creations by a program that makes its own system calls. Five each today:
    // the receive, the read of the name, the check that the call still waits, an lstat of the
    // name, the answer (no poll before the receive), and a journal segment now and then. The
    // directories are looked at again (three stats) only once each 10 ms, which strace's
    // slowness makes often: those are allowed for by the time the trace took.
    let s = scratch!();
    let prog = compile(&s, "rawcreate");
    s.sh("mkdir d");
    let trace = s.root.join("strace");
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-ttt", "-o"]).arg(&trace).arg(&artifacts().cli);
    cmd.arg("run").arg("--journal").arg(s.session("session")).arg("--").arg(&prog).arg("300");
    cmd.current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    let out = cmd.output().expect("strace (.ci/run installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    let worker = text
        .lines()
        .find(|l| l.contains("SECCOMP_IOCTL_NOTIF_RECV"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no receive in the trace"))
        .to_string();
    // The worker's calls (`PID TIME CALL(...`) from its first receive to its last answer;
    // strace splits a call that blocks in two lines, and its resumption is not a call.
    let calls: Vec<(f64, &str)> = text
        .lines()
        .filter_map(|l| {
            // strace pads the pid to a width of its own choosing.
            let (pid, rest) = l.trim_start().split_once(char::is_whitespace)?;
            let (time, call) = rest.trim_start().split_once(char::is_whitespace)?;
            let call = call.trim_start();
            (pid == worker && !call.starts_with('<')).then(|| Some((time.parse().ok()?, call))).flatten()
        })
        .skip_while(|(_, c)| !c.contains("SECCOMP_IOCTL_NOTIF_RECV"))
        .collect();
    let last = calls.iter().rposition(|(_, c)| c.contains("SECCOMP_IOCTL_NOTIF_SEND")).unwrap();
    let calls = &calls[..=last];
    let count = |what: &str| calls.iter().filter(|(_, c)| c.starts_with(what)).count();
    let received = calls.iter().filter(|(_, c)| c.contains("SECCOMP_IOCTL_NOTIF_RECV")).count();
    assert!(received >= 300, "{received} notifications");
    assert_eq!(count("poll("), 0, "no poll before a receive");
    let stats = count("newfstatat(") + count("statx(");
    let windows = ((calls[last].0 - calls[0].0) * 1000.0 / 10.0).ceil() as usize + 1;
    assert!(
        stats <= received + 3 * windows + 10,
        "{stats} stats for {received} notifications in {windows} windows of 10 ms: a remembered directory was looked at"
    );
    let per = (calls.len() - stats) as f64 / received as f64;
    assert!(per <= 4.3, "{per:.2} system calls but stats per notification (four today)");
    let log = s.log_json(&s.session("session"));
    assert!(records_of_kind(&log, "change").len() >= 300, "{log}");
}

#[test]
fn a_directory_the_supervisor_remembers_is_never_trusted_past_a_rename_or_a_change_of_working_directory() {
    let prog = go_program("staledirs", true);
    let s = scratch!();
    s.sh("mkdir -p a x d1/sub d2/sub && echo precious > x/f && echo also-precious > d2/sub/f");
    let report = roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| {
        let read = |p: &str| std::fs::read_to_string(s.tree().join(p)).unwrap();
        assert_eq!(read("a/f"), "rewritten through the second a\n");
        assert_eq!(read("d2/sub/f"), "rewritten in d2/sub\n");
        assert!(during.contains_key(&b"d1/sub/f"[..]) && during.contains_key(&b"a-away/made"[..]));
    });
    // The rewritten files were captured where they were, not under the names' earlier places.
    let restored = |path: &str| {
        report["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["path"].as_str().is_some_and(|p| p.ends_with(path)) && o["outcome"] == "restored")
    };
    assert!(restored("/a/f") && restored("/d2/sub/f"), "{report}");
}

#[test]
fn a_process_that_makes_its_own_mount_namespace_makes_the_undo_incomplete_and_says_why() {
    let s = scratch!();
    s.sh("mkdir inner && echo outer > inner/kept");
    let session = s.session("session");
    // A tmpfs over `inner` in the new namespace: `inner/new` there is not `inner/new` here.
    let unshare = if is_root() { "unshare -m" } else { "unshare -rm" };
    // A static program started in there by a forked shell is first met by the supervisor
    // already inside it.
    let script = format!(
        "{unshare} sh -c 'mount -t tmpfs none inner && echo inside > inner/new && \
         busybox sh -c \"busybox touch inner/x; busybox touch inner/y\"' && echo done"
    );
    let out = s.run_ok(&session, &["sh", "-c", &script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    let log = s.log_json(&session);
    let unobserved = records_of_kind(&log, "unobserved");
    // The unshare call itself, and each process met already inside, said once each.
    assert!(unobserved.len() >= 2, "{log}");
    assert!(unobserved.iter().all(|r| r["op"]["reason"]["code"] == "own_mount_namespace"), "{log}");
    assert_eq!(unobserved[0]["call"], "unshare", "{log}");
    let (code, report) = s.undo_json(&session);
    assert_eq!(code, 3, "the undo cannot be complete: {report}");
    assert_eq!(std::fs::read_to_string(s.tree().join("inner/kept")).unwrap(), "outer\n", "nothing outside touched");
}

#[test]
fn a_session_whose_aether_variables_outgrow_the_shims_copy_still_marks_the_shims_own_calls() {
    // Every process's constructor copies the `AETHER_*` entries it started with into 1 KiB of
    // its statics; past that it reads the supervisor's marker from the environment in place.
    // Unmarked, the shim's own calls (the execs it makes for the program, its store's files)
    // would reach the supervisor, which journals them again: 17 records instead of 7 here, and
    // a round trip each.
    let s = scratch!();
    let script = "echo x > f; mkdir d; echo y > d/g";
    let plain = s.session("plain");
    s.run_ok(&plain, &["sh", "-c", script]);
    s.sh("rm -rf f d");
    let padded = s.session("padded");
    let mut cmd = run_cmd(&s, &padded, &["sh".as_ref(), "-c".as_ref(), OsStr::new(script)]);
    cmd.env("AETHER_TEST_PADDING", "x".repeat(5000));
    let out = cmd.output().expect("run aether-journal run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let records = |session: &Path| s.log_json(session)["records"].as_array().expect("records").len();
    assert_eq!(records(&padded), records(&plain), "the same steps journaled once each");
    assert_eq!(notified(&padded), notified(&plain), "no more of the session's calls reached the supervisor");
}

#[test]
fn a_supervised_program_keeps_the_speculation_mitigations_it_has_without_the_supervisor() {
    // A kernel that mitigates speculation "by prctl and seccomp" (the default before 5.16)
    // forces them on every process with a filter installed without SPEC_ALLOW, slowing some
    // programs by several times. (This kernel mitigates by prctl only: there the lines are the
    // same either way.)
    let s = scratch!();
    let status = |out: std::process::Output| {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let script = "grep -E '^(Seccomp|Speculation)' /proc/self/status";
    let bare = status(Command::new("sh").args(["-c", script]).output().unwrap());
    let supervised = status(s.run_ok(&s.session("session"), &["sh", "-c", script]));
    assert!(supervised.contains("Seccomp:\t2"), "the filter is installed: {supervised}");
    let speculation = |t: &str| t.lines().filter(|l| l.starts_with("Speculation")).collect::<Vec<_>>().join("\n");
    assert!(!speculation(&bare).is_empty(), "the kernel reports speculation mitigations: {bare}");
    assert_eq!(speculation(&supervised), speculation(&bare));
}

#[test]
fn a_go_program_with_many_goroutines_behaves_as_it_does_without_the_supervisor() {
    let prog = go_program("goroutines", false);
    let s = scratch!();
    let bare = Command::new(&prog).current_dir(s.tree()).output().unwrap();
    assert_eq!(bare.status.code(), Some(3), "{}", String::from_utf8_lossy(&bare.stderr));
    s.sh("rm -f f*");
    let before = manifest(&s.tree());
    let session = s.session("session");
    let out = bounded(run_cmd(&s, &session, &[prog.as_os_str()]), 300);
    assert_eq!(out.stdout, bare.stdout, "the same output");
    assert_eq!(out.status.code(), bare.status.code(), "the same exit status: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(manifest(&s.tree()).len(), 200, "the files it made");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_same_tree(&before, &manifest(&s.tree()));
}

#[test]
fn a_c_program_making_inline_system_calls_is_journaled_and_undone_exactly() {
    let s = scratch!();
    let prog = compile(&s, "rawsyscall");
    s.sh("echo old > overwritten; echo r > removed; echo f > from; echo m > mode; echo 12345 > truncated");
    roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| {
        assert!(
            during.contains_key(&b"created"[..]) && during.contains_key(&b"to"[..]) && during.contains_key(&b"dir"[..])
        );
    });
}

#[test]
fn calls_with_the_same_registers_but_other_names_are_each_journaled() {
    // A program that reuses one buffer for every name makes calls whose registers are all
    // alike: none of them is a restart of the one before.
    let s = scratch!();
    let prog = compile(&s, "samebuffer");
    roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| assert_eq!(during.len(), 100));
}

#[test]
fn a_rust_program_on_rustix_and_tempfile_persist_is_journaled_and_undone_exactly() {
    let prog = example("persist");
    let s = scratch!();
    s.sh("echo old target > target; echo d > doomed; echo f > from; echo m > mode");
    roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| {
        assert!(during.contains_key(&b"made/raw"[..]) && !during.contains_key(&b"doomed"[..]));
    });
    let log = s.log_json(&s.session("session"));
    let renames = records_of_kind(&log, "rename");
    assert!(
        renames.iter().any(|r| r["op"]["to"].as_str().unwrap().ends_with("/target")),
        "persist's rename over the target is journaled: {log}"
    );
}

#[test]
fn a_lock_file_tempfile_persists_into_an_existing_directory_is_removed_by_the_undo() {
    // uv's cache lock: persist makes a new name in a directory that existed before, and the
    // file is then opened again and written (the born table knows it by its first name).
    let prog = example("persist");
    let s = scratch!();
    s.sh("mkdir cache && echo x > cache/existing");
    roundtrip_changing(&s, &[prog.to_str().unwrap(), "lock"], |during| {
        assert!(during.contains_key(&b"cache/.lock"[..]));
    });
}

#[test]
fn bun_writing_with_fs_and_bun_write_is_journaled_and_undone_exactly() {
    let bun = bun();
    let s = scratch!();
    s.sh("echo old > existing; echo r > removed; echo m > from; echo keep > appended");
    let script = r#"
const fs = require("fs");
fs.writeFileSync("existing", "overwritten by bun\n");
fs.writeFileSync("new", "new file\n");
fs.appendFileSync("appended", "more\n");
fs.unlinkSync("removed");
fs.renameSync("from", "to");
fs.mkdirSync("dir/sub", { recursive: true });
await Bun.write("dir/sub/bunwrite", "written by Bun.write\n");
await Bun.write("existing", "Bun.write over it\n");
"#;
    roundtrip_changing(&s, &[bun.to_str().unwrap(), "-e", script], |during| {
        assert!(during.contains_key(&b"dir/sub/bunwrite"[..]) && !during.contains_key(&b"removed"[..]));
    });
}

#[test]
fn a_file_bun_creates_and_then_truncates_through_libc_is_known_born_and_not_copied() {
    let bun = bun();
    let s = scratch!();
    let script = r#"
const fs = require("fs");
for (let i = 0; i < 20; i++) fs.writeFileSync(`f${i}`, "written by bun\n");
"#;
    let report = roundtrip_changing(&s, &[bun.to_str().unwrap(), "-e", script], |during| {
        assert_eq!(during.len(), 20);
    });
    assert_eq!(report["coverage"]["mode"], "syscalls", "{report}");
    let log = s.log_json(&s.session("session"));
    // Bun creates each file with its own openat (the supervisor's record) and then calls
    // libc's ftruncate (the shim's), which must not copy what Bun just wrote.
    let truncates: Vec<_> = records_of_kind(&log, "change").into_iter().filter(|r| r["call"] == "ftruncate").collect();
    assert_eq!(truncates.len(), 20, "{log}");
    assert!(truncates.iter().all(|r| r["op"]["before"]["state"] == "born"), "{log}");
    let blobs = manifest(&s.session("session").join("blobs"));
    assert!(blobs.values().all(|e| e.kind != "file"), "nothing copied: {:?}", blobs.keys());
}

#[test]
fn a_program_whose_changes_go_through_libc_makes_no_round_trip_to_the_supervisor() {
    let s = scratch!();
    let prog = compile(&s, "libcops");
    let fixture = "echo old > overwritten; echo r > removed; echo r > removed-too; echo f > from; echo m > mode; \
                   echo 12345 > truncated; mkdir emptydir; echo o > owned; echo t > timed";
    s.sh(fixture);
    roundtrip(&s, &[prog.to_str().unwrap()]);
    let session = s.session("session");
    let execs = records_of_kind(&s.log_json(&session), "exec").len() as u64;
    assert_eq!(execs, 1);
    assert_eq!(notified(&session), (execs, 0), "only the exec reached the supervisor");

    // The libc functions whose own system calls the shim cannot make: they reach it with a
    // pass, and nothing is journaled twice.
    let s = scratch!("pass");
    let prog = compile(&s, "libcops");
    s.sh(fixture);
    roundtrip(&s, &[prog.to_str().unwrap(), "pass"]);
    let session = s.session("session");
    let (notified, passed) = notified(&session);
    // fopen and mkstemp are made by the shim itself, marked; remove and utimes hold passes.
    assert_eq!(passed, 2, "remove and utimes held passes: {notified} {passed}");
    assert_eq!(notified, passed + 1, "and nothing else but the exec reached the supervisor");
    let log = s.log_json(&session);
    let fopened: Vec<_> = records_of_kind(&log, "change")
        .into_iter()
        .filter(|r| r["op"]["path"].as_str().unwrap().ends_with("/fopened"))
        .collect();
    assert_eq!(fopened.len(), 1, "journaled once, by the shim: {fopened:?}");
}

#[test]
fn a_posix_spawn_childs_exec_is_let_through_by_a_pass_and_journaled_once_by_its_parent() {
    // glibc's posix_spawn child makes its execve itself, unmarked, so it reaches the
    // supervisor; the spawning hook holds a spawn pass, and journals the spawn itself. The
    // child's file actions (an open that truncates) are still the supervisor's to journal.
    let s = scratch!();
    s.sh("echo old > out.txt; mkdir sub");
    let script = "import os\n\
                  fa = [(os.POSIX_SPAWN_OPEN, 1, 'out.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]\n\
                  for i in range(3):\n    \
                  pid = os.posix_spawn('/bin/sh', ['sh', '-c', f'echo {i} > made{i}; echo spawned'], os.environ, file_actions=fa)\n    \
                  assert os.waitpid(pid, 0)[1] == 0\n\
                  os.environ['PATH'] = '/nowhere:/usr/bin'\n\
                  pid = os.posix_spawnp('touch', ['touch', 'sub/touched'], os.environ)\n\
                  assert os.waitpid(pid, 0)[1] == 0\n";
    let report = roundtrip_changing(&s, &[python(), "-c", script], |during| {
        assert!(during.contains_key(b"made2".as_slice()) && during.contains_key(b"sub/touched".as_slice()));
    });
    assert_eq!(report["coverage"]["mode"], "syscalls", "{report}");
    assert_eq!(std::fs::read(s.path("out.txt")).unwrap(), b"old\n", "the truncation by a file action was undone");
    let session = s.session("session");
    let log = s.log_json(&session);
    let spawns: Vec<_> = records_of_kind(&log, "exec")
        .into_iter()
        .filter(|r| r["op"]["argv"][0] == "sh" || r["op"]["argv"][0] == "touch")
        .collect();
    assert_eq!(spawns.len(), 4, "each spawn journaled once: {spawns:?}");
    for r in &spawns {
        assert!(r["call"] == "posix_spawn" || r["call"] == "posix_spawnp", "by the parent: {r}");
        assert!(r["op"]["child"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["op"]["cwd"].as_str().unwrap(), s.tree().to_str().unwrap(), "{r}");
    }
    assert!(spawns[3]["op"]["program"].as_str().unwrap().ends_with("/touch"), "{spawns:?}");
    let (notified, passed) = notified(&session);
    // The program's own start, three opens of file actions, and five execs let through (the
    // last spawn's search of PATH tries two).
    assert_eq!((notified, passed), (9, 5), "{log}");
}

#[test]
fn a_spawn_that_changes_directory_is_journaled_with_the_directory_and_program_it_ran() {
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        let prog = compile(&s, "spawnchdir");
        // In `sub`, it waits for its input: the spawning process has journaled it by then.
        s.sh("mkdir sub && printf '#!/bin/sh\\nread go\\necho $1 > made-$1\\n' > sub/mk && \
              printf '#!/bin/sh\\necho $1 > made-$1\\n' > mk && chmod +x mk sub/mk");
        let session = s.session("session");
        let before = manifest(&s.tree());
        s.run_ok_as(&session, &[prog.to_str().unwrap()], watch);
        assert!(s.path("sub/made-in-sub").exists() && s.path("made-here").exists());
        let log = s.log_json(&session);
        let spawns: Vec<_> = records_of_kind(&log, "exec").into_iter().filter(|r| r["call"] == "posix_spawn").collect();
        assert_eq!(spawns.len(), 2, "{watch:?}: {log}");
        let tree = s.tree().to_str().unwrap().to_string();
        for (r, dir) in spawns.iter().zip([format!("{tree}/sub"), tree.clone()]) {
            assert_eq!(r["op"]["cwd"].as_str().unwrap(), dir, "{watch:?}: {r}");
            assert_eq!(r["op"]["program"].as_str().unwrap(), format!("{dir}/mk"), "{watch:?}: {r}");
        }
        let (code, r) = s.undo_json(&session);
        assert_complete(code, &r);
        assert_same_tree(&before, &manifest(&s.tree()));
    }
}

#[test]
fn execs_along_path_behave_as_glibcs_and_cost_no_round_trip() {
    let s = scratch!();
    let prog = compile(&s, "execpath");
    // `x` is in the first directory but not executable, and a script in the second; `plain`
    // is a script without `#!` (run by /bin/sh); `only-a` exists but cannot be run at all.
    s.sh(
        "mkdir -p a b && echo 'echo not me' > a/x && printf '#!/bin/sh\\necho b-x \"$@\"\\n' > b/x && chmod +x b/x && \
          echo 'echo plain \"$@\"' > b/plain && chmod +x b/plain && echo nope > a/only-a",
    );
    let names = ["x", "plain", "missing", "only-a", "/bin/echo", "sh"];
    let path = format!("{}/a:{}/b:/usr/bin:/bin", s.tree().display(), s.tree().display());
    let bare = Command::new(&prog).args(names).env("PATH", &path).current_dir(s.tree()).output().unwrap();
    assert!(bare.status.success());
    let session = s.session("session");
    let mut cmd = Command::new(&artifacts().cli);
    cmd.args(["run", "--journal"]).arg(&session).arg("--").arg(&prog).args(names);
    cmd.env("PATH", &path).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    let out = cmd.output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&bare.stdout),
        "the same outcome for each name"
    );
    assert!(String::from_utf8_lossy(&bare.stdout).contains("b-x arg1"), "{}", String::from_utf8_lossy(&bare.stdout));
    // Only the program's own start (by the supervisor's child) reached it: every exec along
    // PATH was made by the shim, marked, and journaled once.
    assert_eq!(notified(&session), (1, 0));
    let log = s.log_json(&session);
    let execs = records_of_kind(&log, "exec");
    for found in ["/b/x", "/b/plain", "/bin/echo"] {
        assert!(execs.iter().any(|r| r["op"]["program"].as_str().unwrap().ends_with(found)), "{found}: {log}");
    }
}

#[test]
fn the_shims_own_mkstemp_family_behaves_as_glibcs_and_costs_no_round_trip() {
    let s = scratch!();
    let prog = compile(&s, "tempnames");
    let bare = Command::new(&prog).current_dir(s.tree()).output().unwrap();
    assert!(bare.status.success());
    s.sh("rm -rf tmp-*");
    let before = manifest(&s.tree());
    let session = s.session("session");
    let out = s.run_ok(&session, &[prog.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&bare.stdout), "the same results");
    let text = String::from_utf8_lossy(&bare.stdout).to_string();
    assert!(text.contains("mkostemp: mode 600 rw 1 cloexec 1 append 1"), "{text}");
    assert!(text.contains("mkstemp with five Xs: Invalid argument"), "{text}");
    assert!(text.contains("left as it was: tmp-bad-XXXXX"), "{text}");
    assert_eq!(notified(&session), (1, 0), "only the program's own start reached the supervisor");
    assert_eq!(manifest(&s.tree()).len(), 5, "four files and a directory");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_same_tree(&before, &manifest(&s.tree()));
}

#[test]
fn read_only_work_makes_no_round_trip_to_the_supervisor() {
    // W1 and W7 of the benchmarks: grep over a tree, and opens for reading in a loop.
    let s = scratch!();
    s.sh("mkdir -p d/e && for i in $(seq 1 50); do echo needle $i > d/e/f$i; done");
    let open_close = s.root.join("open_close.bin");
    let src = repo_root().join("bench/progs/open_close.c");
    let o = Command::new("gcc").args(["-O1", "-o"]).arg(&open_close).arg(&src).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // By absolute path: a name is looked up in PATH with one execve per directory tried,
    // each of which reaches the supervisor.
    let grep = ["/usr/bin/grep", "/bin/grep"].into_iter().find(|p| Path::new(p).exists()).expect("grep");
    for (name, argv) in [
        ("grep", vec![grep, "-r", "needle", "d"]),
        ("open_close", vec![open_close.to_str().unwrap(), "d/e/f1", "20000"]),
    ] {
        let session = s.session(name);
        s.run_ok(&session, &argv);
        assert_eq!(notified(&session), (1, 0), "{name}: its exec, and nothing else");
    }
}

#[test]
fn binding_a_unix_socket_is_journaled_and_the_socket_file_removed_on_undo() {
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        let before = manifest(&s.tree());
        let session = s.session("session");
        let script = "import socket\nfor name in ('s1', 'sub/s2'):\n    import os; os.makedirs('sub', exist_ok=True)\n    \
                      socket.socket(socket.AF_UNIX).bind(name)\nsocket.socket(socket.AF_UNIX).bind('\\0abstract')\n";
        s.run_ok_as(&session, &[python(), "-c", script], watch);
        assert!(s.path("s1").exists() && s.path("sub/s2").exists());
        let (code, r) = s.undo_json(&session);
        assert_complete(code, &r);
        assert_same_tree(&before, &manifest(&s.tree()));
    }
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn chattr_plus_a_is_journaled_and_undone() {
    require_root("to set the append-only attribute");
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        s.sh("echo data > f");
        let session = s.session("session");
        let out = s.run_as(&session, &["chattr", "+a", "f"], watch);
        if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Operation not supported") {
            panic!("the test tree's file system keeps no inode flags: {}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lsattr =
            |p: &Path| String::from_utf8_lossy(&Command::new("lsattr").arg(p).output().unwrap().stdout).to_string();
        assert!(lsattr(&s.path("f")).split_whitespace().next().unwrap().contains('a'), "{watch:?}: set");
        let (code, r) = s.undo_json(&session);
        assert_complete(code, &r);
        assert!(!lsattr(&s.path("f")).split_whitespace().next().unwrap().contains('a'), "{watch:?}: put back: {r}");
    }
}

#[test]
fn under_libc_coverage_a_go_program_makes_the_undo_incomplete() {
    let prog = go_program("fileops", false);
    let s = scratch!();
    s.sh(FIXTURE);
    let session = s.session("session");
    s.run_ok_as(&session, &[prog.to_str().unwrap()], Watch::ShimOnly);
    let log = s.log_json(&session);
    assert_eq!(log["session"]["coverage"]["mode"], "libc");
    assert_eq!(log["session"]["coverage"]["reason"]["code"], "no_supervise");
    let unobserved = records_of_kind(&log, "unobserved");
    assert_eq!(unobserved.len(), 1, "{log}");
    assert_eq!(unobserved[0]["op"]["reason"]["code"], "bypasses_libc");
    assert_eq!(unobserved[0]["op"]["reason"]["runtime"], "go");
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    assert_eq!(r["complete"], false);
    assert_eq!(r["coverage"]["mode"], "libc");
}

#[test]
fn where_the_kernel_refuses_the_filter_the_session_has_libc_coverage_and_says_why() {
    let s = scratch!();
    let noseccomp = compile(&s, "noseccomp");
    let prog = go_program("fileops", true);
    s.sh(FIXTURE);
    let session = s.session("session");
    let mut cmd = Command::new(&noseccomp);
    cmd.arg(&artifacts().cli).arg("run").arg("--journal").arg(&session).arg("--").arg(&prog).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("coverage is libc calls only"), "run says so");
    let log = s.log_json(&session);
    assert_eq!(log["session"]["coverage"]["mode"], "libc", "{log}");
    assert_eq!(log["session"]["coverage"]["reason"]["code"], "seccomp_unavailable");
    assert_eq!(log["session"]["coverage"]["reason"]["errno"], libc_enosys());
    // The static Go program ran unobserved, and the undo says so.
    let unobserved = records_of_kind(&log, "unobserved");
    assert_eq!(unobserved[0]["op"]["reason"]["code"], "static_executable", "{log}");
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
}

fn libc_enosys() -> i64 {
    38
}

#[test]
fn a_supervisor_killed_mid_session_leaves_unwatched_changes_failing_with_enosys_and_the_undo_honest() {
    let s = scratch!();
    let raw = compile(&s, "rawsyscall");
    s.sh("echo old > overwritten; echo r > removed; echo f > from; echo m > mode; echo 12345 > truncated");
    let before = manifest(&s.tree());
    let session = s.session("session");
    // The command's parent is the supervisor. Once it is gone: the shim's own journaled calls
    // still pass the filter (marked: the shell's writes, its exec of the raw program), but a
    // call nothing journaled fails with ENOSYS, and the program sees that error.
    let script = format!(
        "echo first > journaled-before; kill -9 $PPID; sleep 0.2; echo second > journaled-after; \
         {} ; echo raw=$?",
        raw.display()
    );
    let out = bounded(run_cmd(&s, &session, &["sh".as_ref(), "-c".as_ref(), script.as_ref()]), 60);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ENOSYS") && stdout.contains("raw=1"),
        "its first raw call failed with ENOSYS: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("supervisor ended"),
        "run says so: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(s.path("journaled-after").exists());
    assert!(!s.path("created").exists(), "nothing changed unjournaled");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_same_tree(&before, &manifest(&s.tree()));
}

#[test]
fn io_uring_is_unobserved_under_the_record_policy_and_refused_under_the_strict_one() {
    let s = scratch!();
    let prog = compile(&s, "iouring");
    // Through libc's syscall() the shim sees it first (and leaves it to the supervisor);
    // inline, only the supervisor does.
    for how in ["raw", "libc"] {
        let session = s.session(&format!("record-{how}"));
        let out = s.run(&session, &[prog.to_str().unwrap(), how]);
        if String::from_utf8_lossy(&out.stdout).trim() != "ring" {
            panic!("this kernel refuses io_uring, so nothing here is tested: {}", String::from_utf8_lossy(&out.stdout));
        }
        let log = s.log_json(&session);
        let unobserved = records_of_kind(&log, "unobserved");
        assert_eq!(unobserved.len(), 1, "{how}: journaled once: {log}");
        assert_eq!(unobserved[0]["op"]["reason"]["code"], "io_uring");
        let (code, r) = s.undo_json(&session);
        assert_eq!(code, 3, "{how}: {r}");
        let session = s.session(&format!("strict-{how}"));
        let mut cmd = Command::new(&artifacts().cli);
        cmd.args(["run", "--strict", "--journal"]).arg(&session).arg("--").arg(&prog).arg(how).current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        let out = cmd.output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Operation not permitted", "{how}: refused with EPERM");
        assert_eq!(records_of_kind(&s.log_json(&session), "refused").len(), 1, "{how}");
    }
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn under_the_supervisor_a_set_uid_program_runs_without_its_privileges() {
    require_root("to make a set-uid program and switch to nobody");
    // As any user but root, the filter needs no_new_privs, under which the kernel ignores
    // set-id bits: a set-uid-root touch run by nobody is nobody, and cannot write where only
    // root may. The same program under the shim alone runs as root.
    let s = scratch!();
    s.sh("cp /bin/touch ../suid-root-touch && chmod 4755 ../suid-root-touch && mkdir rootonly && chmod 755 rootonly");
    s.sh("mkdir -p ../sessions && chown 65534 ../sessions");
    let touch = s.root.join("suid-root-touch");
    for (watch, made) in [(Watch::Supervised, false), (Watch::ShimOnly, true)] {
        let session = s.root.join(format!("sessions/{watch:?}"));
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&artifacts().cli).arg("run");
        if watch == Watch::ShimOnly {
            cmd.arg("--no-supervise");
        }
        cmd.arg("--journal").arg(&session).arg("--").arg(&touch).arg("rootonly/made").current_dir(s.tree());
        isolate(&mut cmd, &s.root);
        cmd.env("XDG_STATE_HOME", s.root.join("sessions/state"));
        let out = cmd.output().unwrap();
        assert_eq!(s.path("rootonly/made").exists(), made, "{watch:?}: {}", String::from_utf8_lossy(&out.stderr));
        let header: serde_json::Value =
            serde_json::from_slice(&std::fs::read(session.join("session.json")).unwrap()).unwrap();
        if watch == Watch::Supervised {
            assert_eq!(header["coverage"]["no_new_privs"], true, "the header says so: {header}");
        }
        let _ = std::fs::remove_file(s.path("rootonly/made"));
    }
}

#[test]
fn a_link_from_the_store_to_outside_it_is_refused_whatever_the_program() {
    let s = scratch!();
    let go = go_program("linkstore", true);
    for (i, watch) in BOTH.into_iter().enumerate() {
        let session = s.session(&format!("s{i}"));
        let journal = session.join("journal").display().to_string();
        let out = s.root.join(format!("x{i}")).display().to_string();
        // Through libc (ln), and, under the supervisor, a static Go program's own system call.
        let mut script = format!("echo a > a{i}; ln {journal} {out}; echo ln=$?");
        if watch == Watch::Supervised {
            // Under libc coverage a static program runs unobserved (and the undo says so).
            script.push_str(&format!("; {} {journal} {out}-go", go.display()));
        }
        let o = s.run_as(&session, &["sh", "-c", &script], watch);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("ln=1"), "{watch:?}: {stdout} {}", String::from_utf8_lossy(&o.stderr));
        assert!(!Path::new(&out).exists(), "{watch:?}: no second name for the journal");
        if watch == Watch::Supervised {
            assert!(stdout.contains("permission denied"), "{stdout}");
            assert!(!Path::new(&format!("{out}-go")).exists());
        }
        let refused = records_of_kind(&s.log_json(&session), "refused");
        assert!(!refused.is_empty(), "the refusal is journaled");
        let (code, r) = s.undo_json(&session);
        assert_complete(code, &r);
    }
}

#[test]
fn a_record_a_process_erases_from_its_own_segment_after_the_supervisor_read_it_makes_the_undo_incomplete() {
    // The attack no filter sees: a process of the session zeroes one of its records in the
    // segment the shim maps into it (a write to its own memory), before `run` seals. Without
    // the supervisor's reading the seal digests the erased segment and the undo says complete,
    // one removed file never put back.
    let s = scratch!();
    s.sh("for i in $(seq -w 1 30); do echo \"kept $i\" > v$i; done");
    let session = s.session("session");
    let script = r#"
import ctypes, os, time
for i in range(1, 31):
    os.remove("v%02d" % i)
# The supervisor reads what was written within a tenth of a second of it: leave it twenty.
time.sleep(2)
erased = 0
for line in open("/proc/self/maps"):
    if "/segments/" not in line:
        continue
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    mapped = ctypes.string_at(lo, hi - lo)
    at = mapped.find(b'/v25"')
    if at >= 0:
        start = mapped.rfind(b"\n", 0, at) + 1
        end = mapped.find(b"\n", at) + 1
        ctypes.memset(lo + start, 0, end - start)
        erased += 1
print("erased", erased)
"#;
    let out = s.run_ok(&session, &["python3", "-c", script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "erased 1", "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not what the supervisor read of it while the command ran"), "{stderr}");
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    let damaged = damaged_whys(&r);
    assert!(damaged.iter().any(|w| w.contains("1 record(s) that segments/") && w.contains("are gone")), "{r}");
    assert!(!s.path("v25").exists(), "what the erased record kept is not known: {r}");
    for i in (1..=30).filter(|&i| i != 25) {
        let name = format!("v{i:02}");
        assert_eq!(std::fs::read_to_string(s.path(&name)).unwrap(), format!("kept {i:02}\n"), "{r}");
    }
}

#[test]
fn a_change_of_working_directory_through_libc_makes_no_round_trip_and_the_supervisor_still_follows_it() {
    // The supervisor trusts a working directory it looked at moments ago while the session's
    // working-directory generation stays put: the shim moves it around each chdir it makes
    // itself, marked, so that none of them reaches the supervisor and the creations past
    // libc after each are still journaled where they happened (x/a/f and y/a/f held data).
    let s = scratch!();
    let prog = compile(&s, "chdirmix");
    s.sh("mkdir -p a x/a y/a && echo precious > x/a/f && echo also-precious > y/a/f");
    roundtrip_changing(&s, &[prog.to_str().unwrap()], |during| {
        let read = |p: &str| std::fs::read_to_string(s.tree().join(p)).unwrap();
        assert_eq!(read("a/f"), "top again\n");
        assert_eq!((read("x/a/f").as_str(), read("y/a/f").as_str()), ("over x's\n", "over y's\n"));
        assert!(during.contains_key(&b"a/f"[..]));
    });
    let session = s.session("session");
    assert_eq!(notified(&session), (1 + 4, 0), "its exec and the four creations, no chdir");
}
