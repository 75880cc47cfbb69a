//! End-to-end tests of reliability and security (issue 7): crashes, concurrency, store failure,
//! damaged input, restore safety, store protection, descriptor collisions.

mod common;

use std::process::Command;

use common::*;

fn records_of_kind(log: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    log["records"].as_array().unwrap().iter().filter(|r| r["kind"] == kind).cloned().collect()
}

#[test]
fn a_session_cannot_delete_or_move_its_own_store() {
    let s = Scratch::new("a_session_cannot_delete_or_move_its_own_store");
    s.sh("mkdir home && echo precious > home/notes");
    let before = manifest(&s.tree());
    // The store lives inside the tree the session wipes, as ~/.local/state would under rm -rf ~.
    let session = s.path("home/.local/state/aether-journal/s1");
    let out = s.run(
        &session,
        &["sh", "-c", "rm -rf home; mv home moved; echo x > home/.local/state/aether-journal/s1/journal; echo done"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done", "the program keeps running");
    assert!(session.join("journal").exists() && session.join("session.json").exists(), "the store survived");
    let log = s.log_json(&session);
    let refused = records_of_kind(&log, "refused");
    assert!(!refused.is_empty());
    assert!(refused.iter().all(|r| r["op"]["errno"] == 13), "EACCES: {refused:?}");
    assert!(
        refused.iter().any(|r| r["call"] == "renameat2" || r["call"] == "rename"),
        "the move of an ancestor: {refused:?}"
    );
    // Everything else rm removed comes back.
    let (code, r) = s.undo_json(&session);
    let mut now = manifest(&s.tree());
    now.retain(|k, _| !k.starts_with(b"home/.local"));
    assert_same_tree(&before, &now);
    assert_complete(code, &r);
}

#[test]
fn the_cli_refuses_a_session_directory_writable_by_others_or_owned_by_someone_else() {
    let s = Scratch::new("the_cli_refuses_a_session_directory_writable_by_others_or_owned_by_someone_else");
    let session = s.session("session");
    s.run_ok(&session, &["true"]);
    s.sh(&format!("chmod 777 {}", session.display()));
    let out = s.cli(&["undo".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("writable by other users"));
    if is_root() {
        s.sh(&format!("chmod 700 {0} && chown 65534 {0}", session.display()));
        let out = s.cli(&["undo".as_ref(), "--journal".as_ref(), session.as_os_str()]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("owned by uid 65534"));
    }
}

#[test]
fn the_shim_survives_descriptor_sweeps_and_dup2_onto_its_descriptor() {
    let s = Scratch::new("the_shim_survives_descriptor_sweeps_and_dup2_onto_its_descriptor");
    s.sh("echo 1 > a && echo 2 > b && echo 3 > c");
    let before = manifest(&s.tree());
    let script = r#"
import os
# Whatever the shim holds open, the program may close or reuse: a sweep, then dup2 onto every
# descriptor above 2 that is open.
os.unlink('a')
os.closerange(3, 65536)
os.unlink('b')
victim = os.open('victim.log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for fd in range(3, 4096):
    if fd != victim:
        try:
            os.fstat(fd)
            os.dup2(victim, fd)
        except OSError:
            pass
os.unlink('c')
os.write(victim, b'program data\n')
print('ok')
"#;
    let session = s.session("session");
    let out = s.run_ok(&session, &[python(), "-c", script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert_eq!(
        std::fs::read(s.path("victim.log")).unwrap(),
        b"program data\n",
        "no journal bytes in the program's file"
    );
    let log = s.log_json(&session);
    let removed: Vec<_> = records_of_kind(&log, "change")
        .iter()
        .filter(|r| r["call"] == "unlink")
        .map(|r| r["op"]["path"].clone())
        .collect();
    assert_eq!(removed.len(), 3, "every step journaled: {removed:?}");
    let (code, r) = s.undo_json(&session);
    let mut now = manifest(&s.tree());
    now.remove(&b"victim.log".to_vec());
    assert_same_tree(&before, &now);
    assert_complete(code, &r);
}
