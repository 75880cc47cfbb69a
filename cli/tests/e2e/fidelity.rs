//! End-to-end tests of full-fidelity rewind (issue 4): real tools, whole-tree manifests with
//! type, mode, owner, bytes, symlink target, hard-link groups, file mtimes and extended
//! attributes, before the session and after undo.

use std::process::Command;

use crate::common::*;

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

pub(crate) fn require(tool: &str) {
    assert!(have(tool), "{tool} is needed by this test; .ci/run installs it");
}

#[test]
fn rm_rf_of_a_deep_tree_with_every_mode_and_a_read_only_directory_is_rewound_exactly() {
    let s = scratch!();
    s.sh(
        "mkdir -p t/a/b/c/d/e t/empty1 t/a/empty2 t/ro/sub && echo 1 > t/f600 && echo 2 > t/a/f755 && echo 3 > t/a/b/f444 \
         && echo 4 > t/ro/inside && echo 5 > t/ro/sub/deeper && head -c 100000 /dev/urandom > t/a/b/c/d/e/blob \
         && ln -s ../f600 t/a/up && ln -s /nonexistent t/a/b/dangling && ln -s c t/a/b/dirlink \
         && chmod 600 t/f600 && chmod 755 t/a/f755 && chmod 444 t/a/b/f444 && chmod 700 t/a/b/c \
         && chmod 555 t/ro && touch -d '2001-02-03 04:05:06' t/a/f755",
    );
    roundtrip(&s, &["rm", "-rf", "t"]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(s.path("t/ro")).unwrap().permissions().mode() & 0o777, 0o555);
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn an_unprivileged_user_making_a_tree_writable_and_removing_it_gets_it_back_read_only() {
    require_root("to switch to another user");
    let s = scratch!();
    s.sh("mkdir -p ../sessions t/ro/sub && echo 1 > t/ro/f && echo 2 > t/ro/sub/g && chmod 444 t/ro/f && chmod 555 t/ro/sub t/ro && chown -R 65534:65534 . ../sessions");
    let before = manifest(&s.tree());
    let session = s.root.join("sessions/session");
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&artifacts().cli).args(args);
        c.current_dir(s.tree());
        isolate(&mut c, &s.root);
        c.env("XDG_STATE_HOME", s.root.join("sessions/state"));
        c.output().unwrap()
    };
    let out = as_nobody(&[
        "run".as_ref(),
        "--journal".as_ref(),
        session.as_os_str(),
        "--".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        "chmod -R u+w t && rm -rf t".as_ref(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!s.path("t").exists());
    let out = as_nobody(&["undo".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(out.status.code().unwrap(), &r);
}

#[test]
fn cp_a_over_an_existing_tree_is_rewound_exactly() {
    require("setfattr");
    let s = scratch!();
    s.sh("mkdir -p src/d dst/d && echo new > src/f && echo newer > src/d/g && ln -s f src/l && chmod 751 src/d && \
         setfattr -n user.origin -v src src/f && echo old > dst/f && echo older > dst/d/g && chmod 600 dst/f && \
         setfattr -n user.keep -v dst dst/f && touch -d '1999-12-31' dst/f dst/d/g && echo only-in-dst > dst/extra");
    roundtrip(&s, &["cp", "-a", "src/.", "dst/"]);
}

#[test]
fn chmod_recursive_is_rewound_exactly() {
    let s = scratch!();
    s.sh("mkdir -p d/e && echo 1 > d/f && echo 2 > d/e/g && chmod 644 d/f && chmod 600 d/e/g && chmod 755 d d/e && chmod 4755 d/f");
    roundtrip(&s, &["chmod", "-R", "go-rwx,u-w", "d"]);
}

#[test]
#[ignore = "needs root: `cargo test -- --include-ignored` as root (.ci/run does)"]
fn chown_recursive_is_rewound_exactly() {
    require_root("to chown to other users");
    let s = scratch!();
    s.sh("mkdir -p d/e && echo 1 > d/f && echo 2 > d/e/g && ln -s f d/l && chmod 2755 d/e && chmod 4755 d/f");
    roundtrip(&s, &["chown", "-hR", "65534:65534", "d"]);
}

#[test]
fn touch_of_existing_files_is_rewound_exactly() {
    let s = scratch!();
    s.sh("echo 1 > a && echo 2 > b && touch -d '2000-01-01 00:00:00' a b && ln -s a l");
    roundtrip(&s, &["sh", "-c", "touch a new && touch -d '2010-10-10' b && touch -h l"]);
}

#[test]
fn ln_sf_replacing_a_symlink_and_a_file_is_rewound_exactly() {
    let s = scratch!();
    s.sh("echo 1 > t1 && echo 2 > t2 && ln -s t1 link && echo regular > was-a-file");
    roundtrip(&s, &["sh", "-c", "ln -sf t2 link && ln -sf t1 was-a-file && ln -sf t2 brand-new"]);
    assert_eq!(std::fs::read_link(s.path("link")).unwrap(), std::path::PathBuf::from("t1"));
}

#[test]
fn tar_x_with_modes_over_existing_files_is_rewound_exactly() {
    let s = scratch!();
    s.sh("mkdir -p stage/p/q && echo a > stage/p/f600 && echo b > stage/p/q/f755 && echo c > stage/p/f444 && \
         chmod 600 stage/p/f600 && chmod 755 stage/p/q/f755 && chmod 444 stage/p/f444 && chmod 700 stage/p/q && \
         ln -s f600 stage/p/l && (cd stage && tar cf ../pack.tar p) && rm -rf stage && \
         mkdir -p p/q && echo old > p/f600 && chmod 666 p/f600 && echo old > p/f444 && touch -d '2005-05-05' p/f444");
    roundtrip(&s, &["tar", "xpf", "pack.tar"]);
}

#[test]
fn rsync_archive_with_delete_is_rewound_exactly() {
    require("rsync");
    let s = scratch!();
    s.sh(
        "mkdir -p src/d dst/d dst/stale/deep && echo new > src/f && echo new2 > src/d/g && ln -s f src/l && chmod 640 src/f && \
         echo old > dst/f && echo old2 > dst/d/g && echo gone > dst/stale/deep/x && echo gone2 > dst/h && touch -d '2002-02-02' dst/f",
    );
    roundtrip(&s, &["rsync", "-a", "--delete", "src/", "dst/"]);
}

#[test]
fn git_checkout_and_gc_prune_now_are_rewound_exactly() {
    require("git");
    let s = scratch!();
    s.sh(
        "git init -q -b main repo && cd repo && git config user.email t@example.com && git config user.name T && \
         git config gc.auto 0 && for i in $(seq 1 30); do echo v1-$i > f$i; done && mkdir sub && echo s > sub/s && \
         git add -A && git commit -qm one && git checkout -qb other && for i in $(seq 1 15); do echo v2-$i > f$i; done && \
         git rm -q f30 && echo added > new && git add -A && git commit -qm two && git checkout -q main && \
         echo loose > loose && git add loose && git reset -q loose && rm loose",
    );
    roundtrip(&s, &["sh", "-c", "cd repo && git checkout -q other && git gc -q --prune=now"]);
}

#[test]
fn sqlite_writes_in_rollback_journal_mode_are_rewound_exactly() {
    require("sqlite3");
    let s = scratch!();
    s.sh("sqlite3 db 'create table t(a, b); insert into t values (1, 2), (3, 4);'");
    roundtrip(
        &s,
        &[
            "sqlite3",
            "db",
            "begin; insert into t values (5, 6); update t set b = b * 10; commit; delete from t where a = 1; vacuum;",
        ],
    );
}

#[test]
fn sqlite_writes_in_wal_mode_are_rewound_exactly() {
    require("sqlite3");
    let s = scratch!();
    s.sh("sqlite3 db 'pragma journal_mode=wal; create table t(a); insert into t values (1);' >/dev/null");
    roundtrip(
        &s,
        &[
            "sqlite3",
            "db",
            "insert into t select value from generate_series(1, 2000); update t set a = a + 1; pragma wal_checkpoint(truncate);",
        ],
    );
}

#[test]
fn patch_p1_is_rewound_exactly() {
    require("patch");
    let s = scratch!();
    s.sh(
        "mkdir -p a/src b/src && printf 'one\\ntwo\\nthree\\n' > a/src/x.c && printf 'one\\n2\\nthree\\n' > b/src/x.c && \
         printf 'new file\\n' > b/src/y.c && (diff -ruN a b > fix.patch || true) && mkdir proj && cp -a a/src proj/ && \
         chmod 640 proj/src/x.c && rm -rf a b",
    );
    roundtrip(&s, &["sh", "-c", "cd proj && patch -p1 -b < ../fix.patch"]);
}

#[test]
fn install_with_a_mode_over_an_existing_file_is_rewound_exactly() {
    let s = scratch!();
    s.sh("echo '#!/bin/sh' > tool && echo old > bin-tool && chmod 644 bin-tool && mkdir bin");
    roundtrip(&s, &["sh", "-c", "install -m 755 tool bin-tool && install -D -m 700 tool bin/sub/tool"]);
}

#[test]
fn dd_with_notrunc_is_rewound_exactly() {
    let s = scratch!();
    s.sh("head -c 65536 /dev/urandom > target && printf 'PATCHED' > patch");
    roundtrip(
        &s,
        &[
            "sh",
            "-c",
            "dd if=patch of=target bs=1 seek=100 conv=notrunc status=none && dd if=patch of=grown bs=1 seek=5 status=none",
        ],
    );
}

#[test]
fn truncate_shrinking_and_growing_is_rewound_exactly() {
    let s = scratch!();
    s.sh("head -c 5000 /dev/urandom > shrink && echo small > grow");
    roundtrip(&s, &["sh", "-c", "truncate -s 2 shrink && truncate -s 1M grow && truncate -s 10 created"]);
}

#[test]
fn a_hard_linked_file_edited_in_place_keeps_its_links_after_undo() {
    let s = scratch!();
    s.sh("echo original > a && ln a b && mkdir d && ln a d/c && echo log > l1 && ln l1 l2");
    let script = "f = open('a', 'r+')\nf.write('EDITED')\nf.close()\nopen('l2', 'a').write('appended\\n')\n";
    roundtrip_changing(&s, &[python(), "-c", script], |during| {
        assert!(during[&b"a".to_vec()].link_group.is_some(), "still linked during the session");
    });
}

#[test]
fn setfattr_setting_and_removing_attributes_is_rewound_exactly() {
    require("setfattr");
    let s = scratch!();
    s.sh("echo 1 > f && echo 2 > g && mkdir d && setfattr -n user.old -v before g && setfattr -n user.x -v 1 d");
    roundtrip(
        &s,
        &[
            "sh",
            "-c",
            "setfattr -n user.comment -v hello f && setfattr -x user.old g && setfattr -n user.x -v 2 d && setfattr -n user.new -v '' g",
        ],
    );
}

#[test]
fn acls_set_with_setfacl_are_rewound_exactly() {
    require("setfacl");
    let s = scratch!();
    s.sh("echo 1 > f && mkdir d && setfacl -m u:65534:r f");
    roundtrip(&s, &["sh", "-c", "setfacl -m u:65534:rw f && setfacl -d -m g:65534:rx d && setfacl -b f"]);
}

#[test]
fn a_make_python_sh_chain_is_rewound_exactly() {
    require("make");
    let s = scratch!();
    let py = python();
    s.sh(&format!(
        "printf 'all:\\n\\t{py} gen.py\\n\\techo made > made.txt\\n' > Makefile && \
         printf 'import subprocess\\nopen(\"gen.txt\",\"w\").write(\"gen\")\\nsubprocess.run([\"sh\", \"-c\", \"echo from-sh > sh.txt; rm victim; mv m1 m2\"], check=True)\\n' > gen.py && \
         echo doomed > victim && echo move > m1"
    ));
    roundtrip(&s, &["make", "-s"]);
}

#[test]
fn appends_are_undone_by_truncation_even_after_a_later_full_rewrite() {
    let s = scratch!();
    s.sh("printf 'base\\n' > log && printf 'keep\\n' > other");
    let report = roundtrip(
        &s,
        &["sh", "-c", "echo one >> log; echo two >> log; echo rewritten > log; echo three >> log; echo more >> other"],
    );
    let whys: Vec<&str> = report["outcomes"].as_array().unwrap().iter().map(|o| o["why"].as_str().unwrap()).collect();
    assert!(whys.iter().any(|w| w.contains("truncated")), "appends are undone by truncation: {whys:?}");
}

#[test]
fn special_files_are_recreated_and_fifos_created_are_removed() {
    let s = scratch!();
    s.sh("mkfifo -m 640 oldfifo");
    if is_root() {
        s.sh("mknod -m 600 nulldev c 1 3");
    }
    roundtrip(
        &s,
        &[
            "sh",
            "-c",
            "rm -f oldfifo nulldev && mkfifo newfifo && python3 -c 'import os; os.mknod(\"sock\", 0o600 | 0o140000)'",
        ],
    );
}

#[test]
fn writing_into_a_fifo_is_reported_as_irreversible() {
    let s = scratch!();
    s.sh("mkfifo p");
    let session = s.session("session");
    s.run_ok(&session, &["sh", "-c", "cat p > /dev/null & echo data > p; wait"]);
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "{r}");
    let o = &r["outcomes"][0];
    assert_eq!(o["outcome"], "skipped");
    assert!(o["why"].as_str().unwrap().contains("FIFO"), "{r}");
}

#[test]
fn nothing_under_proc_sys_or_a_device_node_is_journaled() {
    let s = scratch!();
    let session = s.session("session");
    s.run_ok(
        &session,
        &["sh", "-c", "echo x > /dev/null; echo 0 > /proc/self/oom_score_adj; : > /dev/full 2>/dev/null || true"],
    );
    let log = s.log_json(&session);
    let changes: Vec<_> = log["records"].as_array().unwrap().iter().filter(|r| r["kind"] != "exec").collect();
    assert!(changes.is_empty(), "{changes:?}");
}

#[test]
fn files_under_dev_shm_are_journaled_and_undone_like_any_other() {
    let s = scratch!();
    let dir = std::path::PathBuf::from(format!("/dev/shm/aether-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("kept"), b"before\n").unwrap();
    std::fs::write(dir.join("doomed"), b"doomed\n").unwrap();
    let before = manifest(&dir);
    let session = s.session("session");
    let script = format!(
        "cd {d} && echo after > kept && rm doomed && echo new > made && mkdir sub && python3 -c 'import os; os.rename(\"made\", \"sub/moved\")'",
        d = dir.display()
    );
    s.run_ok(&session, &["sh", "-c", &script]);
    assert_ne!(manifest(&dir), before, "the session changed /dev/shm");
    let (code, r) = s.undo_json(&session);
    let after = manifest(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_complete(code, &r);
    assert_same_tree(&before, &after);
}

#[test]
fn every_path_shape_round_trips() {
    let s = scratch!();
    // Relative paths after chdir and fchdir, dirfd-relative calls, `..`, a symlinked
    // directory, names with spaces, newlines and invalid UTF-8, and a name near PATH_MAX.
    s.sh("mkdir -p real/deep/er other && ln -s real/deep viadir && echo x > real/deep/er/f && echo y > 'with space'");
    let script = r#"
import os
os.chdir('real')
open('deep/er/f', 'w').write('via chdir')
os.chdir('deep')
open('../../other/from-dotdot', 'w').write('dotdot')
d = os.open('er', os.O_RDONLY | os.O_DIRECTORY)
os.fchdir(d)
open('after-fchdir', 'w').write('fchdir')
fd = os.open('by-dirfd', os.O_WRONLY | os.O_CREAT, 0o640, dir_fd=d)
os.write(fd, b'dirfd'); os.close(fd)
os.rename('f', 'f-renamed', src_dir_fd=d, dst_dir_fd=d)
os.unlink('../../../with space')
os.chdir('../../..')
open('viadir/er/through-symlink', 'w').write('symlink')
open(b'new\nline \xff\xfe', 'w').write('bytes')
long = 'L' * 200
p = 'long'
os.mkdir(p)
for i in range(18):
    p = os.path.join(p, long)
    os.mkdir(p)
open(os.path.join(p, 'end'), 'w').write('deep')
"#;
    roundtrip(&s, &[python(), "-c", script]);
}

#[test]
fn descriptor_changes_on_a_file_opened_outside_the_session_are_captured_at_the_call() {
    let s = scratch!();
    s.sh("echo 'precious data' > f && chmod 644 f && echo 'more data' > g");
    let before = manifest(&s.tree());
    let session = s.session("session");
    // fd 3 and 4 are opened by the outer shell, before the session begins.
    let inner = format!(
        "{} -c 'import os; os.ftruncate(3, 2); os.fchmod(3, 0o600); os.posix_fallocate(4, 0, 100000)'",
        python()
    );
    let script = format!(
        "exec 3<>f 4<>g; {} run --journal {} -- sh -c \"{inner}\"",
        artifacts().cli.display(),
        session.display()
    );
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &script]).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    assert!(cmd.status().unwrap().success());
    assert_eq!(std::fs::read(s.path("f")).unwrap(), b"pr");
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

#[test]
fn mmap_writes_and_copy_file_range_through_descriptors_opened_in_the_session_are_undone() {
    let s = scratch!();
    s.sh("head -c 8192 /dev/urandom > mapped && head -c 4096 /dev/urandom > dst && echo source-bytes > src");
    let script = r#"
import mmap, os
with open('mapped', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 0)
    m[0:5] = b'XXXXX'
    m.flush(); m.close()
src = os.open('src', os.O_RDONLY)
dst = os.open('dst', os.O_WRONLY)
os.copy_file_range(src, dst, 12, 0, 100)
os.lseek(src, 0, 0)
os.sendfile(dst, src, 0, 12)
"#;
    roundtrip(&s, &[python(), "-c", script]);
}

#[test]
fn temp_and_rename_patterns_restore_the_target_and_remove_the_temporary() {
    let s = scratch!();
    s.sh("echo 'line a' > edited && echo 'x' > perl-edited && chmod 640 edited");
    let py = "import os, tempfile\nfd, tmp = tempfile.mkstemp(dir='.')\nos.write(fd, b'editor save')\nos.close(fd)\nos.replace(tmp, 'edited')\n";
    roundtrip(&s, &["sh", "-c", &format!("{} -c \"{py}\" && perl -pi -e 's/x/y/' perl-edited", python())]);
}

#[test]
fn a_symlinked_directory_stays_a_symlink_and_restores_go_through_its_real_path() {
    let s = scratch!();
    s.sh("mkdir real && echo 1 > real/a && echo 2 > real/b && ln -s real alias && ln -s real alias2");
    let report = roundtrip(
        &s,
        &[
            "sh",
            "-c",
            "rm -rf alias/ ; rm -f alias/b; echo new > alias/c; rm alias2 && mkdir alias2 && echo x > alias2/y",
        ],
    );
    let paths: Vec<&str> = report["outcomes"].as_array().unwrap().iter().filter_map(|o| o["path"].as_str()).collect();
    assert!(paths.iter().any(|p| p.ends_with("/real/a")), "recorded by its real path: {paths:?}");
    assert!(std::fs::symlink_metadata(s.path("alias")).unwrap().file_type().is_symlink());
    assert!(std::fs::symlink_metadata(s.path("alias2")).unwrap().file_type().is_symlink());
}

#[test]
fn metadata_changed_through_a_descriptor_after_the_file_was_removed_is_set_back() {
    let s = scratch!();
    s.sh("echo data > f && chmod 640 f && touch -d '2003-03-03' f");
    let script =
        "import os\nfd = os.open('f', os.O_RDONLY)\nos.unlink('f')\nos.fchmod(fd, 0o777)\nos.utime(fd, (0, 0))\n";
    roundtrip(&s, &[python(), "-c", script]);
}

#[test]
fn a_hard_linked_file_removed_from_a_tree_on_another_file_system_than_the_store_is_named_as_not_back() {
    // The tree on a tmpfs, the store on the disk: the removed inode cannot be linked into the
    // store, so it is kept as a copy, and a copy put back is a new inode.
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "/dev/shm (a tmpfs) is needed for this test");
    let s = scratch!();
    let tree = tempfile::Builder::new().prefix("aj-links").tempdir_in(shm).unwrap();
    let t = tree.path();
    std::fs::write(t.join("a"), b"shared\n").unwrap();
    std::fs::hard_link(t.join("a"), t.join("b")).unwrap();
    std::fs::write(t.join("single"), b"alone\n").unwrap();
    let session = s.session("session");
    let script = format!("rm {0}/a {0}/single", t.display());
    s.run_ok(&session, &["sh", "-c", &script]);
    let (code, r) = s.undo_json(&session);
    assert_eq!(code, 3, "the link group is not back: {r}");
    let outcomes = r["outcomes"].as_array().unwrap();
    let a = outcomes.iter().find(|o| o["path"] == t.join("a").to_str().unwrap()).unwrap();
    assert_eq!(a["outcome"], "failed", "{r}");
    assert_eq!(a["cause"], serde_json::json!({"code": "link_group_broken", "links": 2}), "{r}");
    let single = outcomes.iter().find(|o| o["path"] == t.join("single").to_str().unwrap()).unwrap();
    assert_eq!(single["outcome"], "recreated", "a file with one name comes back exactly: {r}");
    assert_eq!(std::fs::read(t.join("a")).unwrap(), b"shared\n", "its bytes are back all the same");
    assert_eq!(r["files_exact"], false);
}

#[test]
fn a_working_directory_deeper_than_path_max_is_journaled_by_absolute_names_and_undone_exactly() {
    // 21 directories of 250 bytes (over 5,000 bytes deep), made and entered one by one: the
    // kernel will not name the cwd (getcwd fails with ENAMETOOLONG), yet every record must
    // name its path absolutely, both ends of a rename included.
    let script = "import os\nlong = 'D' * 250\nfor i in range(21):\n    os.mkdir(long)\n    os.chdir(long)\n\
                  open('leaf.txt', 'w').write('leaf')\nos.rename('leaf.txt', 'moved.txt')\n\
                  open('other.txt', 'w').write('o')\nos.unlink('other.txt')\nprint(len(os.getcwd()))\n";
    for watch in BOTH {
        let s = scratch!(format!("{watch:?}"));
        let before = manifest(&s.tree());
        let session = s.session("session");
        let out = bounded(run_cmd_as(&s, &session, &[python().as_ref(), "-c".as_ref(), script.as_ref()], watch), 60);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).trim().parse::<usize>().unwrap() > 5000);
        let log = s.log_json(&session);
        let records = log["records"].as_array().unwrap();
        let names: Vec<&str> =
            records.iter().flat_map(|r| ["path", "from", "to"].map(|k| r["op"][k].as_str())).flatten().collect();
        assert!(names.len() >= 25, "{log}");
        let relative: Vec<_> = names.iter().filter(|p| !p.starts_with('/')).map(|p| &p[..p.len().min(40)]).collect();
        assert!(relative.is_empty(), "every name is absolute: {relative:?}");
        let rename = records.iter().find(|r| r["kind"] == "rename").expect("the rename is journaled");
        let to = rename["op"]["to"].as_str().unwrap();
        assert!(to.len() > 5000 && to.ends_with("/moved.txt"), "{to}");
        let (code, r) = s.undo_json(&session);
        assert_complete(code, &r);
        assert_same_tree(&before, &manifest(&s.tree()));
    }
}
