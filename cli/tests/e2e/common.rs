//! Shared helpers for the end-to-end tests: building the shim and CLI, scratch directories,
//! whole-tree manifests, and running commands under the CLI.
//!
//! What these helpers cannot do: make a test pass on a machine without the real tools it
//! runs. `.ci/run` installs them; a missing tool fails the test that needs it, loudly.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Paths of the built artifacts.
pub struct Artifacts {
    pub cli: PathBuf,
    pub shim: PathBuf,
}

/// The repository's root (the workspace), for the benchmark programs and for cargo.
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The directory cargo built this test binary's profile into (`target/<profile>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    // target/<profile>/deps/<test>-<hash>
    exe.parent().and_then(Path::parent).expect("profile dir").to_path_buf()
}

/// Builds the shim with cargo `profile` into `target_dir`.
fn build_shim(profile: &str, target_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", "aether-journal-shim", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(repo_root())
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building the shim ({profile}) failed");
}

/// The CLI cargo built for this test binary, and the shim, built here once with the profile
/// this test was built with (cargo builds no other package's library for a test), so that
/// `cargo test` alone exercises the current code.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let profile_dir = profile_dir();
        let profile = match profile_dir.file_name().and_then(OsStr::to_str) {
            Some("debug") => "dev".to_string(),
            Some(other) => other.to_string(),
            None => "dev".to_string(),
        };
        build_shim(&profile, profile_dir.parent().expect("target dir"));
        let a = Artifacts {
            cli: PathBuf::from(env!("CARGO_BIN_EXE_aether-journal")),
            shim: profile_dir.join("libaether_journal.so"),
        };
        assert!(a.cli.is_file() && a.shim.is_file(), "artifacts missing in {}", profile_dir.display());
        a
    })
}

/// The shim as it is shipped: built once with the release profile into the same target
/// directory, for the tests of what only the optimised, link-time-optimised image shows: the
/// page faults and relocations every process pays, and tables the optimiser makes.
pub fn release_shim() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let target_dir = profile_dir().parent().expect("target dir").to_path_buf();
        build_shim("release", &target_dir);
        let shim = target_dir.join("release").join("libaether_journal.so");
        assert!(shim.is_file(), "no release shim at {}", shim.display());
        shim
    })
}

/// A [`Scratch`] named after the test function it is made in (`module.function`), or with
/// `scratch!(SUFFIX)` after it and SUFFIX, for a test that makes several.
macro_rules! scratch {
    () => {
        $crate::common::Scratch::new(&$crate::common::test_name({
            fn here() {}
            std::any::type_name_of_val(&here)
        }))
    };
    ($suffix:expr) => {
        $crate::common::Scratch::new(&format!(
            "{}-{}",
            $crate::common::test_name({
                fn here() {}
                std::any::type_name_of_val(&here)
            }),
            $suffix
        ))
    };
}

/// `module.function` of the test whose `here` function's type name is `here`
/// (`e2e::module::function::here`, closures' segments left out).
pub fn test_name(here: &str) -> String {
    let parts: Vec<&str> = here.split("::").filter(|p| *p != "{{closure}}" && *p != "here").skip(1).collect();
    parts.join(".")
}

/// A scratch directory named after the test, with `tree/` (the tree under test) and room for
/// session directories beside it. Removed when dropped unless AETHER_KEEP_SCRATCH is set.
pub struct Scratch {
    pub root: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let base = std::env::var_os("AETHER_TEST_SCRATCH")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e"));
        let root = base.join(name);
        if root.exists() {
            make_writable(&root);
            std::fs::remove_dir_all(&root).expect("clean scratch");
        }
        std::fs::create_dir_all(root.join("tree")).expect("make scratch");
        let root = std::fs::canonicalize(&root).expect("canonical scratch");
        Scratch { root }
    }

    pub fn tree(&self) -> PathBuf {
        self.root.join("tree")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.tree().join(rel)
    }

    pub fn session(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Runs `sh -c script` in the tree, without the shim (to build fixtures).
    pub fn sh(&self, script: &str) {
        let out = Command::new("sh").arg("-c").arg(script).current_dir(self.tree()).output().expect("sh");
        assert!(out.status.success(), "fixture script failed: {script}\n{}", String::from_utf8_lossy(&out.stderr));
    }

    /// `aether-journal run --journal <session> -- argv...` in the tree.
    pub fn run(&self, session: &Path, argv: &[&str]) -> Output {
        let mut cmd = Command::new(&artifacts().cli);
        cmd.arg("run").arg("--journal").arg(session).arg("--").args(argv).current_dir(self.tree());
        isolate(&mut cmd, &self.root);
        cmd.output().expect("run aether-journal run")
    }

    /// `aether-journal run --no-supervise --journal <session> -- argv...` in the tree: the
    /// shim alone journals.
    pub fn run_libc(&self, session: &Path, argv: &[&str]) -> Output {
        let argv: Vec<&OsStr> = argv.iter().map(|a| a.as_ref()).collect();
        run_cmd_libc(self, session, &argv).output().expect("run aether-journal run")
    }

    /// `run` as `watch` says.
    pub fn run_as(&self, session: &Path, argv: &[&str], watch: Watch) -> Output {
        let argv: Vec<&OsStr> = argv.iter().map(|a| a.as_ref()).collect();
        run_cmd_as(self, session, &argv, watch).output().expect("run aether-journal run")
    }

    /// `run` as `watch` says, asserting the command succeeded.
    pub fn run_ok_as(&self, session: &Path, argv: &[&str], watch: Watch) -> Output {
        let argv: Vec<&OsStr> = argv.iter().map(|a| a.as_ref()).collect();
        let out = run_cmd_as(self, session, &argv, watch).output().expect("run aether-journal run");
        assert!(
            out.status.success(),
            "command under the shim ({watch:?}) failed: {argv:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Like [`Scratch::run`], asserting the command succeeded.
    pub fn run_ok(&self, session: &Path, argv: &[&str]) -> Output {
        let out = self.run(session, argv);
        assert!(
            out.status.success(),
            "command under the shim failed: {argv:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs the CLI with `args`.
    pub fn cli(&self, args: &[&OsStr]) -> Output {
        let mut cmd = Command::new(&artifacts().cli);
        cmd.args(args).current_dir(self.tree());
        isolate(&mut cmd, &self.root);
        cmd.output().expect("run aether-journal")
    }

    /// `undo --journal <session> --json`: exit code and parsed report. Every undo a test takes
    /// this way is preceded by `undo --dry-run` of the same session, which must predict it:
    /// the same exit code, completeness, and outcome for every step and path.
    pub fn undo_json(&self, session: &Path) -> (i32, serde_json::Value) {
        self.undo_json_with(session, &[])
    }

    /// [`Scratch::undo_json`] with more arguments (`--force`, a selection), dry run included.
    pub fn undo_json_with(&self, session: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
        let undo = |dry: bool| {
            let mut args: Vec<&OsStr> = vec!["undo".as_ref(), "--json".as_ref()];
            if dry {
                args.push("--dry-run".as_ref());
            }
            args.extend(extra.iter().map(OsStr::new));
            args.extend(["--journal".as_ref(), session.as_os_str()]);
            let out = self.cli(&args);
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "undo --json printed no JSON ({e})\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            (out.status.code().unwrap_or(-1), json)
        };
        let predicted = undo(true);
        let done = undo(false);
        assert_dry_run_predicts(&predicted, &done);
        done
    }

    /// `log --journal <session> --json`.
    pub fn log_json(&self, session: &Path) -> serde_json::Value {
        let out = self.cli(&["log".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()]);
        assert!(out.status.success(), "log failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("log --json")
    }

    /// The names of the session's marks, oldest first, as `log --json` lists them.
    pub fn mark_names(&self, session: &Path) -> Vec<String> {
        self.log_json(session)["records"]
            .as_array()
            .expect("log --json has records")
            .iter()
            .filter(|r| r["kind"] == "mark")
            .map(|r| r["op"]["name"].as_str().expect("a mark has a name").to_string())
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("AETHER_KEEP_SCRATCH").is_none() && !std::thread::panicking() {
            make_writable(&self.root);
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// `redo --json`, preceded by `redo --dry-run --json`, which must predict it.
pub fn redo_json(s: &Scratch, session: &Path) -> (i32, serde_json::Value) {
    let redo = |dry: bool| {
        let mut args: Vec<&std::ffi::OsStr> =
            vec!["redo".as_ref(), "--json".as_ref(), "--journal".as_ref(), session.as_os_str()];
        if dry {
            args.push("--dry-run".as_ref());
        }
        let out = s.cli(&args);
        let json = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("redo printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code().unwrap_or(-1), json)
    };
    let predicted = redo(true);
    let done = redo(false);
    assert_dry_run_predicts(&predicted, &done);
    done
}

/// Requires a dry run's report to predict the undo's: exit code, completeness, and the
/// outcome of every step, path by path, in order (the explanations may differ in tense).
pub fn assert_dry_run_predicts(dry: &(i32, serde_json::Value), undo: &(i32, serde_json::Value)) {
    let steps = |r: &serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> {
        r["outcomes"]
            .as_array()
            .map(|a| a.iter().map(|o| (o["seq"].clone(), o["path"].clone(), o["outcome"].clone())).collect())
            .unwrap_or_default()
    };
    let show = |r: &(i32, serde_json::Value)| serde_json::to_string_pretty(&r.1).unwrap_or_default();
    assert!(
        dry.0 == undo.0 && dry.1["complete"] == undo.1["complete"] && steps(&dry.1) == steps(&undo.1),
        "the dry run (exit {}) did not predict the undo (exit {})\ndry run:\n{}\nundo:\n{}",
        dry.0,
        undo.0,
        show(dry),
        show(undo)
    );
}

/// Keeps test sessions out of the user's real state directory.
pub fn isolate(cmd: &mut Command, root: &Path) {
    cmd.env("XDG_STATE_HOME", root.join("state"))
        .env_remove("AETHER_JOURNAL_DIR")
        .env_remove("AETHER_JOURNAL")
        .env_remove("AETHER_JOURNAL_MARK");
}

fn make_writable(p: &Path) {
    let _ = Command::new("chmod").args(["-R", "u+rwx"]).arg(p).status();
}

/// One entry of a whole-tree manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Content hash for files, target for symlinks.
    pub content: String,
    /// Modification time of regular files and directories (ns since the epoch).
    pub mtime: Option<i128>,
    /// Index of the hard-link group for files with more than one link inside the tree.
    pub link_group: Option<usize>,
    /// Extended attributes (what `getfattr -d -m -` shows), as name=hex(value).
    pub xattrs: Vec<String>,
}

/// Runs a command, failing the test (instead of hanging it) if it does not finish in time. The
/// command runs in a process group of its own, killed whole on timeout: a wedged grandchild
/// left spinning would slow every later test and benchmark on the machine.
pub fn bounded(mut cmd: Command, secs: u64) -> Output {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut child = cmd.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if std::time::Instant::now() > deadline {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.kill();
            panic!("still running after {secs} s: deadlocked under the shim");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The CLI's `run` of `argv` in a new session at `session`, in the scratch tree.
pub fn run_cmd(s: &Scratch, session: &Path, argv: &[&OsStr]) -> Command {
    let mut cmd = Command::new(&artifacts().cli);
    cmd.arg("run").arg("--journal").arg(session).arg("--").args(argv).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd
}

/// How a test's session journals: with the supervisor (what `run` does by default) or the
/// shim alone (`run --no-supervise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// `run`: the shim and the supervisor (coverage `syscalls`).
    Supervised,
    /// `run --no-supervise`: the shim alone (coverage `libc`).
    ShimOnly,
}

/// Both ways, for tests whose requirement holds in each.
pub const BOTH: [Watch; 2] = [Watch::Supervised, Watch::ShimOnly];

/// `run` as `watch` says.
pub fn run_cmd_as(s: &Scratch, session: &Path, argv: &[&OsStr], watch: Watch) -> Command {
    match watch {
        Watch::Supervised => run_cmd(s, session, argv),
        Watch::ShimOnly => run_cmd_libc(s, session, argv),
    }
}

/// `sh -c script` in the tree with a bare `LD_PRELOAD` of the shim (no `aether-journal run`),
/// joining the session at `session` (`AETHER_JOURNAL_DIR`), as a harness's shell tool does.
pub fn preloaded_sh(s: &Scratch, session: &Path, script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd.env("LD_PRELOAD", &artifacts().shim).env("AETHER_JOURNAL_DIR", session);
    cmd
}

/// [`run_cmd`] with `--no-supervise`: the shim alone journals (coverage `libc`), for the tests
/// of what the shim does by itself.
pub fn run_cmd_libc(s: &Scratch, session: &Path, argv: &[&OsStr]) -> Command {
    let mut cmd = Command::new(&artifacts().cli);
    cmd.arg("run").arg("--no-supervise").arg("--journal").arg(session).arg("--").args(argv).current_dir(s.tree());
    isolate(&mut cmd, &s.root);
    cmd
}

/// Requires a command's output to be `want` (trimmed), showing its stderr if not.
pub fn assert_stdout(out: &Output, want: &str) {
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{}", String::from_utf8_lossy(&out.stderr));
}

/// Snapshots the scratch tree, runs `argv` in a new session (bounded by `secs`), requires it to
/// succeed and lets `check` look at its output, then undoes the session and requires the tree
/// exactly as it was and the undo complete.
pub fn undone_exactly_after(s: &Scratch, argv: &[&OsStr], secs: u64, check: impl FnOnce(&Output)) {
    let before = manifest(&s.tree());
    let session = s.session("session");
    let out = bounded(run_cmd(s, &session, argv), secs);
    assert!(out.status.success(), "{argv:?} failed under the shim: {}", String::from_utf8_lossy(&out.stderr));
    check(&out);
    let (code, r) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &r);
}

/// Compiles `tests/progs/NAME.c` into the scratch root and returns the program's path.
pub fn compile(s: &Scratch, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs").join(format!("{name}.c"));
    let out = s.root.join(name);
    let o = Command::new("gcc").args(["-O1", "-pthread", "-o"]).arg(&out).arg(&src).output().expect("gcc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Every entry under `root` (relative path bytes -> entry), without following symlinks.
pub fn manifest(root: &Path) -> BTreeMap<Vec<u8>, Entry> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<(u64, u64), Vec<Vec<u8>>> = BTreeMap::new();
    walk(root, root, &mut out, &mut inodes);
    for (group, names) in inodes.values().filter(|n| n.len() > 1).enumerate() {
        for n in names {
            if let Some(e) = out.get_mut(n) {
                e.link_group = Some(group);
            }
        }
    }
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, Entry>, inodes: &mut BTreeMap<(u64, u64), Vec<Vec<u8>>>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for p in entries {
        let md = std::fs::symlink_metadata(&p).expect("lstat");
        let rel = p.strip_prefix(root).expect("under root").as_os_str().as_bytes().to_vec();
        let ft = md.file_type();
        use std::os::unix::fs::FileTypeExt;
        let (kind, content, mtime) = if ft.is_symlink() {
            ("symlink", std::fs::read_link(&p).expect("readlink").as_os_str().to_string_lossy().into_owned(), None)
        } else if ft.is_dir() {
            // Directory times are part of the tree: undo puts them back after the entries.
            ("dir", String::new(), Some(md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128))
        } else if ft.is_file() {
            inodes.entry((md.dev(), md.ino())).or_default().push(rel.clone());
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            let mtime = md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128;
            ("file", format!("{} bytes, blake3 {}", bytes.len(), &blake3::hash(&bytes).to_hex()[..16]), Some(mtime))
        } else if ft.is_fifo() {
            ("fifo", String::new(), None)
        } else if ft.is_socket() {
            ("socket", String::new(), None)
        } else {
            ("device", format!("rdev {}", md.rdev()), None)
        };
        let xattrs = xattrs_of(&p);
        let (mode, uid, gid) = (md.mode() & 0o7777, md.uid(), md.gid());
        out.insert(rel, Entry { kind, mode, uid, gid, content, mtime, link_group: None, xattrs });
        if ft.is_dir() {
            walk(root, &p, out, inodes);
        }
    }
}

fn xattrs_of(p: &Path) -> Vec<String> {
    let mut names = vec![0u8; 65536];
    let Ok(n) = rustix::fs::llistxattr(p, &mut names[..]) else { return Vec::new() };
    let mut out: Vec<String> = names[..n]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let mut v = vec![0u8; 65536];
            let len = rustix::fs::lgetxattr(p, name, &mut v[..]).unwrap_or(0);
            let hex: String = v[..len].iter().map(|b| format!("{b:02x}")).collect();
            format!("{}={hex}", String::from_utf8_lossy(name))
        })
        .collect();
    out.sort();
    out
}

/// Asserts two manifests are equal, printing every difference as expected/got.
pub fn assert_same_tree(before: &BTreeMap<Vec<u8>, Entry>, after: &BTreeMap<Vec<u8>, Entry>) {
    let mut diff = String::new();
    for (k, v) in before {
        match after.get(k) {
            None => {
                let _ = writeln!(diff, "missing after undo: {:?}\n  expected {v:?}", String::from_utf8_lossy(k));
            }
            Some(w) if w != v => {
                let _ = writeln!(diff, "differs: {:?}\n  expected {v:?}\n  got      {w:?}", String::from_utf8_lossy(k));
            }
            _ => {}
        }
    }
    for (k, w) in after {
        if !before.contains_key(k) {
            let _ = writeln!(diff, "left behind: {:?}\n  got {w:?}", String::from_utf8_lossy(k));
        }
    }
    assert!(diff.is_empty(), "the tree after undo is not the tree before the session:\n{diff}");
}

/// Asserts an undo report is complete, printing it otherwise.
pub fn assert_complete(code: i32, report: &serde_json::Value) {
    assert!(
        code == 0 && report["complete"] == true,
        "undo was not complete (exit {code}):\n{}",
        serde_json::to_string_pretty(report).unwrap_or_default()
    );
}

/// The records of `kind` in a session's log (`log --json`), in journal order.
pub fn records_of_kind(log: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    log["records"].as_array().unwrap().iter().filter(|r| r["kind"] == kind).cloned().collect()
}

/// The Python interpreter to use (Debian's, so that no pyenv shim scripts run in between).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" }
}

/// Runs `argv` under the shim, undoes it, and asserts the tree is exactly as before and the
/// undo complete. Returns the undo report.
pub fn roundtrip(s: &Scratch, argv: &[&str]) -> serde_json::Value {
    roundtrip_changing(s, argv, |_| {})
}

/// Like [`roundtrip`], also checking (with `changed`) the tree the session left, so that a
/// test proves the session really changed what it claims to.
pub fn roundtrip_changing(
    s: &Scratch,
    argv: &[&str],
    changed: impl FnOnce(&BTreeMap<Vec<u8>, Entry>),
) -> serde_json::Value {
    let before = manifest(&s.tree());
    let session = s.session("session");
    s.run_ok(&session, argv);
    let during = manifest(&s.tree());
    assert_ne!(before, during, "the session changed nothing: the test proves nothing");
    changed(&during);
    let (code, report) = s.undo_json(&session);
    assert_same_tree(&before, &manifest(&s.tree()));
    assert_complete(code, &report);
    report
}

/// Whether the tests run as root (some scenarios need it, others switch to nobody).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Fails the test unless it runs as root: such tests are `#[ignore]`d, and CI runs them as
/// root with `--include-ignored`; run without root, they fail rather than pass untested.
pub fn require_root(needs: &str) {
    assert!(is_root(), "this test needs root ({needs}): run it as root");
}

/// Unmounts a test's private file system when dropped.
pub struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A fresh ext4 image at `img` (`size`, e.g. "8M"; `mkfs` extra `mkfs.ext4` arguments),
/// loop-mounted at the existing directory `mnt` with the mount options `opts` (root only); the
/// guard unmounts it.
#[allow(dead_code)]
pub fn loop_ext4(img: &Path, size: &str, mkfs: &[&str], opts: &str, mnt: &Path) -> Unmount {
    let made = Command::new("mkfs.ext4").args(["-q", "-F"]).args(mkfs).arg(img).arg(size).output().expect("mkfs.ext4");
    assert!(made.status.success(), "mkfs.ext4: {}", String::from_utf8_lossy(&made.stderr));
    let img = img.to_str().expect("a UTF-8 image path");
    mount(&["-o", &format!("loop,{opts}"), img], mnt)
}

/// `mount ARGS... MNT` (root only), asserting it worked; the guard unmounts it again.
pub fn mount(args: &[&str], mnt: &Path) -> Unmount {
    let ok = Command::new("mount").args(args).arg(mnt).status().expect("run mount");
    assert!(ok.success(), "mount {args:?} {}", mnt.display());
    Unmount(mnt.to_path_buf())
}

/// Rewrites, in place, every line of the journal file at `file` whose record `edit` changes
/// (it returns whether it did), with a valid check: what a program with write access to the
/// store can do.
pub fn rewrite_records(file: &std::path::Path, mut edit: impl FnMut(&mut serde_json::Value) -> bool) -> usize {
    let bytes = std::fs::read(file).unwrap();
    let mut out = Vec::new();
    let mut changed = 0;
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let mut rec: serde_json::Value = match body.get(17..).map(serde_json::from_slice) {
            Some(Ok(v)) => v,
            _ => {
                out.extend_from_slice(line);
                continue;
            }
        };
        if !edit(&mut rec) {
            out.extend_from_slice(line);
            continue;
        }
        changed += 1;
        let json = serde_json::to_vec(&rec).unwrap();
        out.extend_from_slice(&aether_journal::journal::check_of(&json));
        out.push(b' ');
        out.extend_from_slice(&json);
        out.push(b'\n');
    }
    std::fs::write(file, out).unwrap();
    changed
}

/// The `why` of every outcome of an undo report whose cause is a damaged journal.
pub fn damaged_whys(r: &serde_json::Value) -> Vec<String> {
    r["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["cause"]["code"] == "damaged_journal")
        .map(|o| o["why"].as_str().unwrap().to_string())
        .collect()
}
