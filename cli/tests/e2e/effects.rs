//! End-to-end tests of irreversible effects and exec'd tools (issue 3): network, unobservable
//! programs, scrubbed environments, process chains, syscall(2), and the strict policy.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;

use crate::common::*;

/// A one-shot HTTP server on 127.0.0.1 (the test's own), answering every request.
fn http_server() -> (u16, std::thread::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut served = 0;
        listener.set_nonblocking(false).unwrap();
        if let Ok((mut c, _)) = listener.accept() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nhello\n");
            served += 1;
        }
        served
    });
    (port, handle)
}

#[test]
fn a_connect_to_a_local_server_is_named_and_makes_the_undo_incomplete_while_files_are_restored() {
    let s = scratch!();
    s.sh("echo keep > notes");
    let before = manifest(&s.tree());
    let (port, server) = http_server();
    let session = s.session("session");
    let url = format!("http://127.0.0.1:{port}/x");
    s.run_ok(&session, &["sh", "-c", &format!("curl -s -o fetched {url} && echo changed > notes")]);
    assert_eq!(server.join().unwrap(), 1);
    assert_eq!(std::fs::read(s.path("fetched")).unwrap(), b"hello\n");
    let connects = records_of_kind(&s.log_json(&session), "connect");
    assert!(
        connects.iter().any(|c| c["op"]["peer"]["address"] == "127.0.0.1" && c["op"]["peer"]["port"] == port),
        "{connects:?}"
    );
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    assert_same_tree(&before, &manifest(&s.tree()));
    let expected = format!("network connection to 127.0.0.1:{port} cannot be unsent");
    let skipped: Vec<_> = r["outcomes"].as_array().unwrap().iter().filter(|o| o["outcome"] == "skipped").collect();
    assert!(skipped.iter().any(|o| o["why"] == expected), "{r}");
}

#[test]
fn python_urllib_to_a_local_server_is_journaled_too() {
    let s = scratch!();
    let (port, server) = http_server();
    let session = s.session("session");
    let script = format!(
        "import urllib.request\nopen('out','wb').write(urllib.request.urlopen('http://127.0.0.1:{port}/').read())\n"
    );
    s.run_ok(&session, &[python(), "-c", &script]);
    server.join().unwrap();
    let connects = records_of_kind(&s.log_json(&session), "connect");
    assert_eq!(connects.len(), 1, "{connects:?}");
    assert_eq!(connects[0]["op"]["result"]["status"], "ok");
    assert!(connects[0]["prog"].as_str().unwrap().contains("python"));
    assert!(connects[0]["pid"].as_u64().unwrap() > 0);
}

#[test]
fn a_refused_connection_changes_nothing_and_does_not_make_the_undo_incomplete() {
    let s = scratch!();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(); // closed again
    let session = s.session("session");
    let script = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}))\nexcept OSError as e:\n    print(e.errno)\n"
    );
    let out = s.run_ok(&session, &[python(), "-c", &script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "111");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert!(r["outcomes"][0]["why"].as_str().unwrap().contains("failed"), "{r}");
}

#[test]
fn datagrams_are_journaled_once_per_destination_per_process() {
    let s = scratch!();
    let session = s.session("session");
    let script = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                  for i in range(5):\n    s.sendto(b'x', ('127.0.0.1', 9))\n\
                  s.sendto(b'y', ('127.0.0.1', 10))\n";
    s.run_ok(&session, &[python(), "-c", script]);
    let sends = records_of_kind(&s.log_json(&session), "send");
    let ports: Vec<_> = sends.iter().map(|r| r["op"]["peer"]["port"].as_u64().unwrap()).collect();
    assert_eq!(ports, vec![9, 10]);
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3);
    assert!(r["outcomes"][0]["why"].as_str().unwrap().contains("cannot be unsent"));
}

#[test]
fn a_fork_child_journals_its_own_first_datagram_to_a_destination_its_parent_sent_to() {
    let s = scratch!();
    let session = s.session("session");
    let script = "import os, socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                  s.sendto(b'x', ('127.0.0.1', 9))\n\
                  pid = os.fork()\n\
                  if pid == 0:\n    s.sendto(b'x', ('127.0.0.1', 9)); s.sendto(b'x', ('127.0.0.1', 9)); os._exit(0)\n\
                  os.waitpid(pid, 0)\n\
                  s.sendto(b'x', ('127.0.0.1', 9))\n";
    s.run_ok(&session, &[python(), "-c", script]);
    let sends = records_of_kind(&s.log_json(&session), "send");
    let pids: std::collections::BTreeSet<_> = sends.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    assert_eq!(sends.len(), 2, "one send per process, the child's included: {sends:?}");
    assert_eq!(pids.len(), 2, "{sends:?}");
}

#[test]
fn a_unix_socket_connect_names_the_socket_path() {
    let s = scratch!();
    let sock = s.root.join("daemon.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let t = std::thread::spawn(move || listener.accept().map(|_| ()).is_ok());
    let session = s.session("session");
    let script = format!("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\n", sock.to_str().unwrap());
    s.run_ok(&session, &[python(), "-c", &script]);
    assert!(t.join().unwrap());
    let connects = records_of_kind(&s.log_json(&session), "connect");
    assert_eq!(connects[0]["op"]["peer"]["family"], "unix");
    assert_eq!(connects[0]["op"]["peer"]["address"], sock.to_str().unwrap());
}

#[test]
fn under_libc_coverage_a_static_binary_is_named_as_unobserved_and_the_undo_is_not_complete() {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists());
    let busybox = busybox.expect("busybox-static is needed by this test; .ci/run installs it");
    let s = scratch!();
    s.sh("echo 1 > f; echo 2 > g");
    let session = s.session("session");
    s.run_ok_as(&session, &["sh", "-c", &format!("{busybox} rm f; echo changed > g")], Watch::ShimOnly);
    assert!(!s.path("f").exists());
    let log = s.log_json(&session);
    let unobserved = records_of_kind(&log, "unobserved");
    assert_eq!(unobserved.len(), 1, "{log}");
    assert_eq!(unobserved[0]["op"]["reason"]["code"], "static_executable");
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    assert_eq!(r["complete"], false);
    let why: Vec<&str> = r["outcomes"].as_array().unwrap().iter().filter_map(|o| o["why"].as_str()).collect();
    assert!(why.iter().any(|w| w.contains("busybox") && w.contains("statically linked")), "{why:?}");
    assert_eq!(std::fs::read(s.path("g")).unwrap(), b"2\n", "what was observed is still undone");
}

#[test]
fn under_the_supervisor_a_static_busybox_is_journaled_and_undone_exactly() {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists());
    let busybox = busybox.expect("busybox-static is needed by this test; .ci/run installs it");
    let s = scratch!();
    s.sh("echo 1 > f; printf 'alpha\\nbeta\\n' > g; echo keep > h; mkdir old; echo x > old/y; touch -d 2020-01-01 h");
    let script = format!(
        "{b} rm f && {b} sed -i s/alpha/ALPHA/ g && {b} touch h new && {b} mv old moved && {b} mkdir -p d/e && \
         {b} rm -r moved",
        b = busybox
    );
    let report = roundtrip_changing(&s, &["sh", "-c", &script], |during| {
        assert!(
            during.contains_key(&b"new"[..]) && during.contains_key(&b"d/e"[..]) && !during.contains_key(&b"f"[..])
        );
    });
    assert_eq!(report["summary"]["skipped"], 0, "{report}");
    let log = s.log_json(&s.session("session"));
    assert!(records_of_kind(&log, "unobserved").is_empty(), "nothing ran unobserved: {log}");
}

#[test]
fn env_minus_i_children_are_journaled_and_undone() {
    let s = scratch!();
    s.sh("echo precious > f");
    roundtrip(&s, &["env", "-i", "sh", "-c", "rm f"]);
}

#[test]
fn an_explicit_envp_without_the_shim_gets_it_back() {
    let s = scratch!();
    s.sh("echo a > a; echo b > b");
    let script = "import subprocess, os\n\
                  subprocess.run(['rm', 'a'], env={}, check=True)\n\
                  os.execve('/bin/sh', ['sh', '-c', 'rm b'], {'PATH': '/bin:/usr/bin'})\n";
    roundtrip(&s, &[python(), "-c", script]);
}

#[test]
fn a_program_that_clears_its_own_environment_before_its_first_change_is_still_journaled() {
    // The configuration is built on the first change, long after the constructor: it must come
    // from the environment the process started with, not the one it has by then.
    let s = scratch!();
    s.sh("echo a > a; echo b > b");
    let script = "import os, subprocess\n\
                  os.environ.clear()\n\
                  os.unlink('a')\n\
                  subprocess.run(['/bin/rm', 'b'], check=True)\n";
    let report = roundtrip(&s, &[python(), "-c", script]);
    let paths = report.to_string();
    assert!(paths.contains("/a\"") && paths.contains("/b\""), "both removals undone: {report}");
}

#[test]
fn posix_spawn_and_a_three_level_subprocess_chain_are_journaled() {
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        s.sh("echo 1 > one; echo 2 > two; echo 3 > three; echo 4 > four");
        let py = python();
        let level3 = "import os; os.unlink('three'); open('made3','w').write('3')";
        let level2 =
            format!("import subprocess, os; os.unlink('two'); subprocess.run([{py:?}, '-c', {level3:?}], check=True)");
        let level1 = format!(
            "import subprocess, os\nos.unlink('one')\nsubprocess.run([{py:?}, '-c', {level2:?}], check=True)\n\
             pid = os.posix_spawnp('rm', ['rm', 'four'], os.environ)\nos.waitpid(pid, 0)\n"
        );
        let session = s.session("session");
        let before = manifest(&s.tree());
        s.run_ok_as(&session, &[py, "-c", &level1], watch);
        let log = s.log_json(&session);
        let removed: Vec<String> = records_of_kind(&log, "change")
            .iter()
            .filter(|r| r["call"] == "unlink" || r["call"] == "unlinkat")
            .map(|r| r["op"]["path"].as_str().unwrap().rsplit('/').next().unwrap().to_string())
            .collect();
        for name in ["one", "two", "three", "four"] {
            assert!(removed.contains(&name.to_string()), "{watch:?}: {name} journaled: {removed:?}");
        }
        let rm: Vec<_> = records_of_kind(&log, "exec").into_iter().filter(|r| r["op"]["argv"][0] == "rm").collect();
        assert_eq!(rm.len(), 1, "{watch:?}: {rm:?}");
        // The shim journals a spawn in the parent, after the call, with the child's pid (under
        // a supervisor too: a spawn pass lets the child's own execve through unjournaled).
        assert_eq!(rm[0]["call"], "posix_spawnp", "{watch:?}: {rm:?}");
        assert!(rm[0]["op"]["child"].as_u64().unwrap() > 0);
        assert!(rm[0]["op"]["program"].as_str().unwrap().ends_with("/rm"), "{rm:?}");
        let (code, r) = s.undo_json(&session);
        assert_same_tree(&before, &manifest(&s.tree()));
        assert_complete(code, &r);
    }
}

#[test]
fn every_exec_is_journaled_with_argv_cwd_pid_and_ppid_and_log_tree_shows_the_process_tree() {
    let s = scratch!();
    s.sh("mkdir sub; echo x > sub/f");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "cd sub && rm f && sh -c 'echo y > g'"]);
    let log = s.log_json(&session);
    let execs = records_of_kind(&log, "exec");
    let rm = execs.iter().find(|e| e["op"]["argv"][0] == "rm").expect("rm's exec");
    assert_eq!(rm["op"]["argv"], serde_json::json!(["rm", "f"]));
    assert_eq!(rm["op"]["cwd"], s.path("sub").to_str().unwrap());
    assert!(rm["op"]["program"].as_str().unwrap().ends_with("/rm"));
    assert!(rm["pid"].as_u64().unwrap() > 0 && rm["ppid"].as_u64().unwrap() > 0);
    let out = s.cli(&["log".as_ref(), "--tree".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    let rm_line = tree.lines().position(|l| l.contains("rm f")).expect(&tree);
    let removal = tree.lines().position(|l| l.contains("sub/f") && l.contains("unlinkat")).expect(&tree);
    assert!(removal > rm_line, "the change is shown under the process that made it:\n{tree}");
    let depth = |l: &str| l.len() - l.trim_start_matches(|c: char| !c.is_alphanumeric()).len();
    let lines: Vec<&str> = tree.lines().collect();
    assert!(depth(lines[removal]) > depth(lines[rm_line]), "{tree}");
}

#[test]
fn execl_execlp_and_execle_are_journaled_through_their_variadic_hooks() {
    let s = scratch!();
    let c = r#"
#include <unistd.h>
#include <sys/wait.h>
#include <string.h>
int main(int argc, char **argv) {
    char *env[] = { "PATH=/bin:/usr/bin", NULL };
    if (fork() == 0) { execl("/bin/rm", "rm", "a", (char *)NULL); _exit(9); }
    wait(NULL);
    if (fork() == 0) { execlp("rm", "rm", "b", (char *)NULL); _exit(9); }
    wait(NULL);
    if (fork() == 0) { execle("/bin/rm", "rm", "c", (char *)NULL, env); _exit(9); }
    wait(NULL);
    return 0;
}
"#;
    std::fs::write(s.root.join("t.c"), c).unwrap();
    let out = Command::new("gcc").arg("-o").arg(s.root.join("t")).arg(s.root.join("t.c")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for watch in BOTH {
        s.sh("echo a > a; echo b > b; echo c > c");
        let before = manifest(&s.tree());
        let session = s.session(&format!("session-{watch:?}"));
        s.run_ok_as(&session, &[s.root.join("t").to_str().unwrap()], watch);
        assert!(!s.path("a").exists() && !s.path("b").exists() && !s.path("c").exists(), "the three rm ran");
        let log = s.log_json(&session);
        let (code, report) = s.undo_json(&session);
        assert_same_tree(&before, &manifest(&s.tree()));
        assert_complete(code, &report);
        let execs = records_of_kind(&log, "exec");
        let calls: Vec<_> = execs.iter().map(|r| r["call"].as_str().unwrap().to_string()).collect();
        // execl and execle arrive as execv and execve (what glibc's own versions call); under
        // the supervisor too, since the shim journals and marks the execs it makes.
        assert!(
            calls.contains(&"execv".into()) && calls.contains(&"execvp".into()) && calls.contains(&"execve".into()),
            "{watch:?}: {calls:?}"
        );
        assert_eq!(calls.len(), 4, "{watch:?}: the program's own exec and the three, each once: {calls:?}");
    }
}

#[test]
fn calls_made_through_syscall_are_journaled_like_the_rest() {
    let s = scratch!();
    s.sh("echo 1 > victim; echo 2 > renamed");
    let script = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n\
                  SYS_unlinkat, SYS_renameat2, SYS_openat = 263, 316, 257\n\
                  assert libc.syscall(SYS_unlinkat, -100, b'victim', 0) == 0\n\
                  assert libc.syscall(SYS_renameat2, -100, b'renamed', -100, b'moved', 0) == 0\n\
                  fd = libc.syscall(SYS_openat, -100, b'created', os.O_WRONLY | os.O_CREAT, 0o644)\n\
                  assert fd >= 0\n\
                  assert libc.syscall(SYS_unlinkat, -100, b'missing', 0) == -1 and ctypes.get_errno() == 2\n";
    roundtrip(&s, &[python(), "-c", script]);
}

#[test]
fn a_signal_to_a_process_outside_the_session_is_irreversible_and_one_inside_is_not() {
    let s = scratch!();
    let mut outsider = Command::new("sleep").arg("60").spawn().unwrap();
    let session = s.session("session");
    let script = format!("sleep 60 & inner=$!; kill $inner; kill -TERM {}; wait", outsider.id());
    s.run_ok(&session, &["bash", "-c", &script]);
    let _ = outsider.wait();
    let signals = records_of_kind(&s.log_json(&session), "signal");
    assert_eq!(signals.len(), 2, "{signals:?}");
    let outside: Vec<_> = signals.iter().filter(|r| r["op"]["outside"] == true).collect();
    assert_eq!(outside.len(), 1);
    assert_eq!(outside[0]["op"]["target"], outsider.id());
    assert!(outside[0]["op"]["target_prog"].as_str().unwrap().ends_with("sleep"));
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3);
    let skipped: Vec<_> = r["outcomes"].as_array().unwrap().iter().filter(|o| o["outcome"] == "skipped").collect();
    assert_eq!(skipped.len(), 1, "only the outside signal is irreversible: {r}");
    assert!(skipped[0]["why"].as_str().unwrap().contains(&outsider.id().to_string()));
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn under_libc_coverage_a_setuid_program_that_would_drop_the_shim_is_named_as_unobserved() {
    require_root("to make a set-uid program");
    let s = scratch!();
    s.sh("cp /bin/true suid-true && chown 65534 suid-true && chmod 4755 suid-true");
    let session = s.session("session");
    s.run_ok_as(&session, &["./suid-true"], Watch::ShimOnly);
    let unobserved = records_of_kind(&s.log_json(&session), "unobserved");
    assert_eq!(unobserved.len(), 1);
    assert_eq!(unobserved[0]["op"]["reason"]["code"], "set_id_executable");
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn under_the_supervisor_a_setuid_program_is_watched_like_any_other() {
    require_root("to make a set-uid program");
    let s = scratch!();
    // touch, set-uid to nobody: it runs as nobody (loading no shim), in a directory nobody may
    // write.
    s.sh("cp /bin/touch ../suid-touch && chown 65534 ../suid-touch && chmod 4755 ../suid-touch && mkdir open && chmod 777 open");
    let report = roundtrip_changing(&s, &["sh", "-c", "../suid-touch open/made-by-nobody"], |during| {
        assert!(during.contains_key(&b"open/made-by-nobody"[..]));
    });
    assert_eq!(report["summary"]["removed"], 1, "{report}");
    assert!(records_of_kind(&s.log_json(&s.session("session")), "unobserved").is_empty());
}

#[test]
fn under_libc_coverage_a_child_started_with_aether_journal_off_on_purpose_is_unobserved() {
    let s = scratch!();
    s.sh("echo x > f");
    let session = s.session("session");
    s.run_ok_as(&session, &["sh", "-c", "AETHER_JOURNAL=off rm f"], Watch::ShimOnly);
    let log = s.log_json(&session);
    assert_eq!(records_of_kind(&log, "unobserved")[0]["op"]["reason"]["code"], "shim_disabled");
    assert!(records_of_kind(&log, "change").is_empty(), "the child was not journaled: it was told not to be");
    let (code, _) = s.undo_json(&session);
    assert_eq!(code, 3);
}

#[test]
fn under_the_supervisor_a_child_with_the_shim_switched_off_is_still_journaled() {
    let s = scratch!();
    s.sh("echo x > f");
    roundtrip(&s, &["sh", "-c", "AETHER_JOURNAL=off rm f"]);
    let log = s.log_json(&s.session("session"));
    let changes = records_of_kind(&log, "change");
    assert_eq!(changes.len(), 1, "{log}");
    assert!(changes[0]["prog"].as_str().unwrap().ends_with("/rm"), "journaled by the supervisor, for rm: {log}");
}

/// Runs `argv` under `run --strict`, returning stdout.
fn strict(s: &Scratch, session: &std::path::Path, env: &[(&str, &str)], argv: &[&str]) -> String {
    strict_as(s, session, env, argv, Watch::Supervised)
}

/// [`strict`], journaled as `watch` says.
fn strict_as(s: &Scratch, session: &std::path::Path, env: &[(&str, &str)], argv: &[&str], watch: Watch) -> String {
    let mut cmd = Command::new(&artifacts().cli);
    cmd.args(["run", "--strict"]);
    if watch == Watch::ShimOnly {
        cmd.arg("--no-supervise");
    }
    cmd.arg("--journal").arg(session).arg("--").args(argv).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn strict_policy_refuses_a_connect_with_eacces_and_journals_the_refusal() {
    let s = scratch!();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let session = s.session("session");
    let script = format!(
        "import socket, errno\ntry:\n    socket.create_connection(('127.0.0.1', {port}))\n    print('connected')\n\
         except OSError as e:\n    print(errno.errorcode[e.errno])\nopen('after', 'w').write('ok')\n"
    );
    let out = strict(&s, &session, &[("AETHER_JOURNAL_NETWORK", "deny")], &[python(), "-c", &script]);
    assert_eq!(out.trim(), "EACCES");
    let refused = records_of_kind(&s.log_json(&session), "refused");
    assert_eq!(refused.len(), 1);
    assert!(refused[0]["op"]["what"].as_str().unwrap().contains(&format!("127.0.0.1:{port}")));
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    drop(listener);
}

#[test]
fn strict_policy_allows_loopback_but_refuses_other_hosts_by_default() {
    let s = scratch!();
    let session = s.session("session");
    let script = "import socket, errno\ns = socket.socket()\ns.settimeout(2)\ntry:\n    s.connect(('192.0.2.1', 80))\n\
                  except OSError as e:\n    print(errno.errorcode.get(e.errno, e.errno))\n";
    assert_eq!(strict(&s, &session, &[], &[python(), "-c", script]).trim(), "EACCES");
}

#[test]
fn under_libc_coverage_the_strict_policy_refuses_unobservable_execs_with_eperm_and_over_budget_captures_with_eacces() {
    let s = scratch!();
    s.sh("head -c 5000 /dev/zero > big; echo small > small");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists()).unwrap();
    let session = s.session("session");
    let script = format!(
        "import os, errno\ntry:\n    os.execv({busybox:?}, ['busybox', 'true'])\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n\
         try:\n    open('big', 'w')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\nopen('small', 'w').write('ok')\n"
    );
    let out =
        strict_as(&s, &session, &[("AETHER_JOURNAL_MAX_FILE", "1K")], &[python(), "-c", &script], Watch::ShimOnly);
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["EPERM", "EACCES"]);
    assert_eq!(std::fs::metadata(s.path("big")).unwrap().len(), 5000, "the refused open did not truncate");
    assert_eq!(records_of_kind(&s.log_json(&session), "refused").len(), 2);
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_eq!(std::fs::read(s.path("small")).unwrap(), b"small\n");
}

#[test]
fn under_the_supervisor_the_strict_policy_lets_a_static_program_run_and_refuses_what_it_cannot_keep() {
    let s = scratch!();
    s.sh("head -c 5000 /dev/zero > big; echo small > small; echo doomed > doomed");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists()).unwrap();
    let session = s.session("session");
    // busybox is watched by the supervisor: its rm is journaled, not refused; its truncation
    // of a file over the budget cannot be kept, so it is refused, in busybox itself.
    let script = format!(
        "{busybox} rm doomed && echo rm-ok; {busybox} sh -c ': > big' 2>/dev/null || echo truncate-refused; echo ok > small"
    );
    let out = strict(&s, &session, &[("AETHER_JOURNAL_MAX_FILE", "1K")], &["sh", "-c", &script]);
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["rm-ok", "truncate-refused"]);
    assert_eq!(std::fs::metadata(s.path("big")).unwrap().len(), 5000, "the refused open did not truncate");
    let log = s.log_json(&session);
    assert_eq!(records_of_kind(&log, "refused").len(), 1, "{log}");
    assert!(records_of_kind(&log, "unobserved").is_empty(), "{log}");
    let (code, r) = s.undo_json(&session);
    assert_complete(code, &r);
    assert_eq!(std::fs::read(s.path("doomed")).unwrap(), b"doomed\n");
    assert_eq!(std::fs::read(s.path("small")).unwrap(), b"small\n");
}

/// Runs `cmd` (which starts `/bin/true` 20 times) under strace in a session `run` made (so that
/// it is not the session's root), and returns how often the session's counters were opened,
/// after checking that all 20 commands were journaled.
fn counters_opened_for_twenty_commands(s: &Scratch, name: &str, cmd: &[&str]) -> usize {
    let session = s.session(name);
    let trace = s.root.join(format!("trace-{name}"));
    let argv: Vec<&std::ffi::OsStr> = ["strace", "-f", "-e", "trace=open,openat", "-o"]
        .iter()
        .map(|a| a.as_ref())
        .chain([trace.as_os_str()])
        .chain(cmd.iter().map(|a| a.as_ref()))
        .collect();
    // The shim's own bookkeeping: a supervisor journals execs itself, so the shim opens no store.
    let out = bounded(run_cmd_libc(s, &session, &argv), 120);
    assert!(out.status.success(), "strace is needed (.ci/run installs it): {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    let log = s.log_json(&session);
    let execs = records_of_kind(&log, "exec").iter().filter(|r| r["op"]["program"] == "/bin/true").count();
    assert_eq!(execs, 20, "{name}: every command is journaled, by whichever store");
    text.lines().filter(|l| l.contains("/counters\"")).count()
}

#[test]
fn a_harness_that_only_starts_commands_opens_its_store_once_not_once_per_command() {
    // Python's subprocess and dash start each command from a vfork child, whose exec hook
    // journals the exec. A parent that changes nothing itself had no store, so every child
    // opened the session's files for itself (about 20 system calls, ~100 us a command here);
    // the parent now opens its own once a child had to (when it next waits for a child), and the
    // later children use it.
    let s = scratch!();
    // The system's python3 itself (a version manager's shim would be a chain of scripts).
    let python = if std::path::Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" };
    let script = "import subprocess\nfor i in range(20): subprocess.run(['/bin/true'], check=True)\n";
    let loop_ = "i=0; while [ $i -lt 20 ]; do /bin/true; i=$((i+1)); done";
    for (name, cmd) in [("python", [python, "-c", script]), ("dash", ["dash", "-c", loop_])] {
        let opens = counters_opened_for_twenty_commands(&s, name, &cmd);
        assert!(opens >= 1, "{name}: the store was never opened: the test proves nothing");
        assert!(opens <= 2, "{name}: the session's counters were opened {opens} times for 20 commands");
    }
}
