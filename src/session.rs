//! Session directories: where a session's header, journal, counters and captured contents live.
//!
//! # Layout (session format version 1)
//!
//! ```text
//! <session>/                 mode 0700
//!   session.json             header: format, version, id, created, root command, cwd, shim version
//!   journal                  append-only records (see crate::journal), mode 0600
//!   counters                 4096 bytes shared by every process of the session (see below)
//!   captures                 1 MiB, sparse: the capture index shared by the session's processes
//!                            (which blob holds which state of a file; see the shim's index.rs)
//!   blobs/                   mode 0700: captured prior contents, one file per capture, spread
//!     04/1066                over up to 256 shard directories named by the id's second byte
//!   seal.json                what the tree looked like when `run` ended (see crate::seal)
//!   state.json               present once the session was undone or kept
//! ```
//!
//! `counters` is mapped `MAP_SHARED` by every hooked process. Little-endian `u64` slots:
//! offset 0 magic `AJCOUNT1`, 8 the last id handed out (blob names and record sequence
//! numbers), 16 bytes kept in `blobs/`, 24 records that could not be written (a session with
//! a non-zero value here can never undo completely), 64 the names generation (see
//! [`crate::internal::counters::SLOT_NAMES_GEN`]).
//!
//! Copied blobs are created with mode 0600. A blob captured by hard-linking the doomed inode
//! keeps that inode's own mode (changing it would be visible to the program through any
//! descriptor it still holds); the 0700 directories keep it unreachable to other users.
//!
//! What this module cannot do: protect a session directory from its own session's processes.
//! A hooked `rm -rf ~` reaches it like any other path unless the shim refuses that call.

use crate::internal::counters::{SLOT_BYTES_KEPT, SLOT_LAST_ID, SLOT_LOST};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::bpath::BPath;
use crate::journal::{JournalContents, read_with_segments};

/// `format` value of every session header.
pub const SESSION_FORMAT: &str = "aether-journal-session";
/// Session format version written by this build.
pub const SESSION_VERSION: u32 = 1;
/// Header file name.
pub const HEADER_FILE: &str = "session.json";
/// Journal file name.
pub const JOURNAL_FILE: &str = "journal";
/// Directory of per-process journal segments (see [`crate::journal`]).
pub const SEGMENTS_DIR: &str = "segments";
/// Blob directory name.
pub const BLOBS_DIR: &str = "blobs";
/// Shared counters file name.
pub const COUNTERS_FILE: &str = "counters";
/// State file name.
pub const STATE_FILE: &str = "state.json";
/// Size of the counters page: the first page of the counters file (see
/// [`COUNTERS_FILE_LEN`]), all that readers use.
pub const COUNTERS_LEN: usize = 4096;
/// Size of the counters file's first two pages: the counters page, then a page of exec
/// verdicts (see `internal::counters::SLOT_EXEC_VERDICTS`), which only the shim uses. A session
/// made before the second page has a file of [`COUNTERS_LEN`] bytes, and its processes check
/// every exec.
pub const COUNTERS_FILE_LEN: usize = 2 * COUNTERS_LEN;
/// Where the capture index starts in the counters file of a session made with its tables
/// inside it ([`COUNTERS_TABLES_LEN`] bytes long): right after the verdicts' page.
pub const CAPTURES_AT: usize = COUNTERS_FILE_LEN;
/// Where the born table starts in such a counters file: right after the capture index.
pub const BORN_AT: usize = CAPTURES_AT + CAPTURES_LEN;
/// Size of the counters file of a session made with the capture index and the born table
/// inside it (sparse until used): one file, opened and mapped once by a process that
/// journals, where the three files it replaces took three opens and three mappings (a process
/// that makes one directory: 8 us less, measured paired on the development machine).
pub const COUNTERS_TABLES_LEN: usize = BORN_AT + BORN_LEN;
/// Capture index file name: the index of a session made before it moved into the counters
/// file ([`CAPTURES_AT`]); still used where the counters file is shorter.
pub const CAPTURES_FILE: &str = "captures";
/// Size of the capture index (sparse until used).
pub const CAPTURES_LEN: usize = 1 << 20;
/// Table of the files the session's processes created: the table of a session made before it
/// moved into the counters file ([`BORN_AT`]); still used where the counters file is shorter.
pub const BORN_FILE: &str = "born";
/// Size of the born table (sparse until used): small, because every process that creates
/// files touches pages of it, and those count in its resident memory. An entry evicted by a
/// newer one only costs a copy later.
pub const BORN_LEN: usize = 128 << 10;
/// Magic at the start of the counters file.
pub const COUNTERS_MAGIC: &[u8; 8] = b"AJCOUNT1";
/// The versioned session header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`SESSION_FORMAT`].
    pub format: String,
    /// Session format version.
    pub version: u32,
    /// Session id (also the directory name for sessions under the state directory).
    pub id: String,
    /// Creation time, RFC 3339 UTC.
    pub created: String,
    /// The command the session was started for.
    pub root_command: Vec<BPath>,
    /// Working directory it started in.
    pub cwd: BPath,
    /// Version of the shim (or CLI) that created the session.
    pub shim_version: String,
    /// `cli` when `aether-journal run` created it, `shim` when the first hooked process did.
    pub created_by: String,
    /// The process at the root of the session's tree (the CLI, or the first hooked process):
    /// a process descending from it is a member of the session.
    #[serde(default)]
    pub root_pid: Option<u32>,
    /// What the session's journaling could see (absent in sessions recorded before it was
    /// kept: read as [`Coverage::unknown`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
    /// Set when this session was made again at the directory of one that vanished while its
    /// processes ran (removed or moved by a program nothing could see into): what they did
    /// before is not in this journal, and no undo of it is complete. Says when and by whom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_off: Option<String>,
}

/// What a session's journaling could see: every system call of every process (`syscalls`:
/// the seccomp supervisor watched the whole tree), or only calls made through libc (`libc`:
/// the LD_PRELOAD shim alone), with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// `syscalls` or `libc`.
    pub mode: CoverageMode,
    /// Why the coverage is `libc` (absent for `syscalls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<CoverageReason>,
    /// Whether set-id programs run without their privileges (`PR_SET_NO_NEW_PRIVS`: the
    /// supervisor's filter needs it unless `run` has `CAP_SYS_ADMIN`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_new_privs: bool,
}

impl Default for Coverage {
    fn default() -> Coverage {
        Coverage::unknown()
    }
}

/// See [`Coverage::mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoverageMode {
    /// Every system call of every process of the session was watched.
    Syscalls,
    /// Only calls made through libc's exported names were seen: a program that bypasses libc
    /// (Go, static binaries, raw system calls) is journaled as unobserved when it starts.
    Libc,
}

/// Why a session has `libc` coverage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum CoverageReason {
    /// `run --no-supervise`.
    NoSupervise,
    /// A session started by a bare `LD_PRELOAD` (no `aether-journal run`).
    PreloadOnly,
    /// Another supervisor already watches this process tree (a nested session, a sandbox):
    /// the kernel allows one listener per tree (`EBUSY`).
    ListenerBusy,
    /// The kernel refused a seccomp filter with a listener (too old, or forbidden here).
    SeccompUnavailable {
        /// The errno of the refusal.
        errno: i32,
    },
    /// Recorded before sessions kept their coverage.
    Unknown,
}

impl Coverage {
    /// The supervisor watched the whole tree.
    pub fn syscalls(no_new_privs: bool) -> Coverage {
        Coverage { mode: CoverageMode::Syscalls, reason: None, no_new_privs }
    }

    /// Only libc calls were seen, for `reason`.
    pub fn libc(reason: CoverageReason) -> Coverage {
        Coverage { mode: CoverageMode::Libc, reason: Some(reason), no_new_privs: false }
    }

    /// The coverage of a session recorded before coverage was kept.
    pub fn unknown() -> Coverage {
        Coverage::libc(CoverageReason::Unknown)
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match (&self.mode, &self.reason) {
            (CoverageMode::Syscalls, _) => {
                "system calls (every process of the session was watched by the supervisor)".into()
            }
            (CoverageMode::Libc, Some(r)) => format!("libc calls only ({})", r.describe()),
            (CoverageMode::Libc, None) => "libc calls only".into(),
        }
    }
}

impl CoverageReason {
    /// Why, for people.
    pub fn describe(&self) -> String {
        match self {
            CoverageReason::NoSupervise => "run --no-supervise".into(),
            CoverageReason::PreloadOnly => "a bare LD_PRELOAD session, without aether-journal run".into(),
            CoverageReason::ListenerBusy => {
                "another supervisor already watches this process tree (a nested session or a sandbox)".into()
            }
            CoverageReason::SeccompUnavailable { errno } => format!(
                "the kernel refused a seccomp filter with a listener: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            CoverageReason::Unknown => "recorded before sessions kept their coverage".into(),
        }
    }
}

impl Header {
    /// A header for a session created now.
    pub fn new(id: String, root_command: Vec<BPath>, cwd: BPath, created_by: &str) -> Header {
        Header {
            format: SESSION_FORMAT.into(),
            version: SESSION_VERSION,
            id,
            created: now_rfc3339_seconds(),
            root_command,
            cwd,
            shim_version: env!("CARGO_PKG_VERSION").into(),
            created_by: created_by.into(),
            root_pid: Some(own_pid()),
            coverage: None,
            cut_off: None,
        }
    }
}

/// Current time as RFC 3339 with nanoseconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}

/// Current time as RFC 3339 with whole seconds.
pub fn now_rfc3339_seconds() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// A new session id: UTC time, pid and random bits, sortable by creation time.
pub fn new_session_id() -> String {
    let stamp: String = now_rfc3339_seconds().chars().filter(|c| !matches!(c, '-' | ':')).collect();
    let mut rnd = [0u8; 3];
    let _ = rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty());
    format!("{stamp}-{}-{:02x}{:02x}{:02x}", own_pid(), rnd[0], rnd[1], rnd[2])
}

/// Where sessions are created by default: `${XDG_STATE_HOME:-$HOME/.local/state}/aether-journal`.
pub fn sessions_root_from(xdg_state_home: Option<&[u8]>, home: Option<&[u8]>) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let base = match xdg_state_home.filter(|x| x.first() == Some(&b'/')) {
        Some(x) => PathBuf::from(std::ffi::OsStr::from_bytes(x)),
        None => PathBuf::from(std::ffi::OsStr::from_bytes(home.filter(|h| !h.is_empty())?)).join(".local/state"),
    };
    Some(base.join("aether-journal"))
}

/// Where a session goes when the state directory cannot be written (a read-only home, a
/// full disk, a sandbox): `$XDG_RUNTIME_DIR/aether-journal`, then `/tmp/aether-journal-UID`.
/// Listed with the state directory's sessions, so that `undo` finds the last session rather
/// than rewinding an older one.
pub fn fallback_roots() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(r) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|r| r.is_absolute()) {
        out.push(r.join("aether-journal"));
    }
    out.push(PathBuf::from(format!("/tmp/aether-journal-{}", rustix::process::getuid().as_raw())));
    out
}

/// [`sessions_root_from`] applied to this process's environment.
pub fn sessions_root() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let x = std::env::var_os("XDG_STATE_HOME");
    let h = std::env::var_os("HOME");
    sessions_root_from(x.as_ref().map(|v| v.as_bytes()), h.as_ref().map(|v| v.as_bytes()))
}

/// The lifecycle state of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Recording, or finished but neither undone nor kept.
    Active,
    /// Completely undone.
    Undone,
    /// Accepted by the user.
    Kept,
}

impl State {
    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Undone => "undone",
            State::Kept => "kept",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    state: State,
    changed: String,
}

/// Errors opening a session directory.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The directory does not exist.
    #[error("no session at {0}: the directory does not exist")]
    NotFound(PathBuf),
    /// The directory has no header.
    #[error("{0} is not an aether-journal session: it has no {HEADER_FILE}")]
    NotASession(PathBuf),
    /// The header is damaged.
    #[error("the session header {path} cannot be read: {why}")]
    BadHeader {
        /// Header path.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The header declares a version this build does not know.
    #[error("the session at {path} uses session format version {version}; this build reads version {SESSION_VERSION}")]
    UnknownVersion {
        /// Session directory.
        path: PathBuf,
        /// Declared version.
        version: u64,
    },
    /// No session exists yet.
    #[error("no sessions found under {0}")]
    NoSessions(PathBuf),
    /// The session directory is owned by another user or writable by others: its journal
    /// could name any file, and undo would write there.
    #[error("{why}")]
    NotTrusted {
        /// The directory.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// No session was started in this directory or above it.
    #[error(
        "no session was started in {cwd} or a directory above it (sessions are under {root}): pass --journal DIR, or --latest for the newest of all"
    )]
    NoSessionHere {
        /// The directory asked about.
        cwd: PathBuf,
        /// Where sessions are.
        root: PathBuf,
    },
    /// More than one session started here or above is still running: which one is meant
    /// cannot be told.
    #[error("{} sessions started here or above are still running ({}): pass --journal DIR", .dirs.len(), .dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "))]
    Ambiguous {
        /// Their directories, newest first.
        dirs: Vec<PathBuf>,
    },
    /// No mark of the session has this name.
    #[error("the session has no mark {name:?} ({})", if .known.is_empty() { "it has no marks".to_string() } else { format!("its marks: {}", .known.join(", ")) })]
    NoSuchMark {
        /// The name asked for.
        name: String,
        /// The names it has, oldest first.
        known: Vec<String>,
    },
    /// Any other I/O error, with the path involved.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> SessionError + '_ {
    move |source| SessionError::Io { path: path.to_path_buf(), source }
}

/// An existing session directory.
#[derive(Clone, Debug)]
pub struct Session {
    dir: PathBuf,
    header: Header,
}

fn mkdir_0700(path: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// The names a session directory holds (and the temporary files of its atomic writes): a
/// directory holding anything else is not a session and is never made into one.
const SESSION_NAMES: &[&str] = &[
    HEADER_FILE,
    JOURNAL_FILE,
    SEGMENTS_DIR,
    BLOBS_DIR,
    COUNTERS_FILE,
    CAPTURES_FILE,
    BORN_FILE,
    STATE_FILE,
    crate::seal::SEAL_FILE,
    "undone",
    "undos",
    "hook-errors.log",
];

/// Whether `dir` may become a session: it does not exist, is one already, or holds only what
/// a session holds (several processes making the same session at once). A directory of the
/// user's (files of theirs in it) is refused: the session's `counters`, `captures` and
/// `journal` would be written over files of the same names.
pub fn may_hold_session(dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if dir.join(HEADER_FILE).exists() {
        return Ok(());
    }
    for e in entries {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if !SESSION_NAMES.contains(&&*name) && !name.starts_with(".tmp-") {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} is not an aether-journal session and holds other files ({name}, ...): a session is never written into it",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Creates the directories, journal and counters of a session at `dir` if they are missing
/// (several processes may do this at once), and writes `header` unless one exists, then its
/// tag in the counters ([`crate::internal::counters::SLOT_SESSION`]). A directory that holds
/// files of its own ([`may_hold_session`]) is refused. The header is written as durably as
/// `durability` says.
pub fn ensure_layout(dir: &Path, header: &Header, durability: Durability) -> io::Result<()> {
    may_hold_session(dir)?;
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
        && !parent.is_dir()
    {
        fs::DirBuilder::new().mode(0o700).recursive(true).create(parent)?;
    }
    mkdir_0700(dir)?;
    mkdir_0700(&dir.join(BLOBS_DIR))?;
    let journal = dir.join(JOURNAL_FILE);
    fs::OpenOptions::new().append(true).create(true).mode(0o600).open(&journal)?;
    // Made here, by whoever makes the session, so that a process of the session, which may
    // not create files in the store, can lock it while it marks (through the shim).
    mkdir_0700(&dir.join(SEGMENTS_DIR))?;
    fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(dir.join(SEGMENTS_DIR).join(crate::marks::MARKS_SEGMENT))?;
    let counters = ensure_counters(&dir.join(COUNTERS_FILE))?;
    let header_path = dir.join(HEADER_FILE);
    if !header_path.exists() {
        let body = serde_json::to_vec_pretty(header).map_err(io::Error::other)?;
        write_atomically_as(&header_path, durability, |w| w.write_all(&body))?;
        // After the header: a process that finds the tag may take the header as read.
        let tag = crate::internal::counters::session_tag(header.id.as_bytes()).to_le_bytes();
        let at = (crate::internal::counters::SLOT_SESSION * 8) as u64;
        if rustix::io::pwrite(&counters, &tag, at)? != tag.len() {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// This process's id (rustix's `getpid`, not std's: one libc import fewer in the shim, see
/// [`ensure_counters`]).
pub fn own_pid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// What a process of the session asks of a store file it holds: its device, inode, owner and
/// size, and never its times.
///
/// # Rationale
/// A stat that asks for a file's times (`fstat`; `statx` with `STATX_MTIME` or `STATX_CTIME`)
/// marks them as seen, and on a file system with multigrain timestamps (ext4, xfs, btrfs and
/// tmpfs since Linux 6.13) the next write then stamps the file with a fine-grained time, which
/// dirties its inode: on ext4, a transaction of its journal. Measured on the development
/// machine, a 200-byte append after an `fstat` took 3.0 us, after a `statx` of the inode
/// number alone 1.75. Asked this way, writes (and first writes to shared pages) within one
/// tick of the clock leave the inode as it is. On a kernel without `statx` (before 4.11) the
/// answer comes from `fstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreStat {
    /// The device, encoded as `st_dev` is.
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
    /// The owner.
    pub uid: u32,
    /// The size in bytes.
    pub size: u64,
}

impl StoreStat {
    fn of(at: impl rustix::fd::AsFd, path: &str, flags: rustix::fs::AtFlags) -> io::Result<StoreStat> {
        use rustix::fs::StatxFlags;
        match rustix::fs::statx(&at, path, flags, StatxFlags::INO | StatxFlags::UID | StatxFlags::SIZE) {
            Ok(x) => Ok(StoreStat {
                dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
                ino: x.stx_ino,
                uid: x.stx_uid,
                size: x.stx_size,
            }),
            Err(rustix::io::Errno::NOSYS) => {
                let st = rustix::fs::statat(&at, path, flags)?;
                Ok(StoreStat { dev: st.st_dev, ino: st.st_ino, uid: st.st_uid, size: st.st_size as u64 })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The store file open as `fd`.
    pub fn of_fd(fd: impl rustix::fd::AsFd) -> io::Result<StoreStat> {
        StoreStat::of(fd, "", rustix::fs::AtFlags::EMPTY_PATH)
    }

    /// The store file `name` in the directory open as `dir`, not following a symlink there.
    pub fn of_name(dir: impl rustix::fd::AsFd, name: &str) -> io::Result<StoreStat> {
        StoreStat::of(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
    }

    /// Its device and inode.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// Makes sure the counters file exists, is [`COUNTERS_TABLES_LEN`] bytes long (the counters,
/// the exec verdicts, the capture index and the born table) and carries its magic. Idempotent,
/// and safe to race with itself.
pub fn ensure_counters(path: &Path) -> io::Result<fs::File> {
    let f = ensure_table(path, COUNTERS_TABLES_LEN)?;
    // rustix's pread and pwrite rather than std's: every process of a session that journals
    // runs this, and each libc function the shim imports is one more symbol the loader looks
    // up in every process (see `-Bsymbolic-functions` in shim/build.rs).
    let mut magic = [0u8; 8];
    if rustix::io::pread(&f, &mut magic, 0)? != magic.len() || &magic != COUNTERS_MAGIC {
        let mut at = 0;
        while at < COUNTERS_MAGIC.len() {
            match rustix::io::pwrite(&f, &COUNTERS_MAGIC[at..], at as u64)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => at += n,
            }
        }
    }
    Ok(f)
}

/// Makes sure a shared table file exists and is at least `len` bytes long (new bytes zero).
/// Idempotent, and safe to race with itself.
pub fn ensure_table(path: &Path, len: usize) -> io::Result<fs::File> {
    let f = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)?;
    if StoreStat::of_fd(&f)?.size < len as u64 {
        f.set_len(len as u64)?;
    }
    Ok(f)
}

/// How far a session file written with [`write_atomically_as`] has got when the write returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// In the kernel: it survives the death of any process, not a power loss. What records and
    /// captures get by default, and so what the files describing them get too (a session's
    /// header, `run`'s seal): an `fsync` of theirs would promise more than the records beside
    /// them keep, and costs tens of milliseconds on every `run`.
    InKernel,
    /// On disk (`fsync` of the file and its directory): it survives a power loss. With
    /// `AETHER_JOURNAL_SYNC=1`, and always for the seal an undo rewrites and its redo markers.
    OnDisk,
}

impl Durability {
    /// The durability a session's settings ask for.
    pub fn of(settings: &crate::config::Settings) -> Durability {
        if settings.sync { Durability::OnDisk } else { Durability::InKernel }
    }
}

/// Writes `bytes` (and a newline) to `path`, mode 0600, atomically and durably: a temporary
/// file of its own in the same directory, written and `fsync`ed, renamed over `path`, and the
/// directory `fsync`ed, so that after a crash `path` holds either the old bytes or the new.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_as(path, Durability::OnDisk, |w| w.write_all(bytes))
}

/// Writes what `write` writes (and a newline) to `path`, mode 0600, atomically (a temporary file
/// of its own in the same directory, renamed over `path`: no reader ever sees a part of it), as
/// durably as `durability` says. `write` is given a buffered writer, so that a large file (a
/// seal of a million paths) is never held in memory whole.
pub fn write_atomically_as(
    path: &Path,
    durability: Durability,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    write_bytes_atomically_as(path, durability, |w| {
        write(w)?;
        w.write_all(b"\n")
    })
}

/// [`write_atomically_as`] without the newline: the file holds exactly what `write` writes.
pub fn write_bytes_atomically_as(
    path: &Path,
    durability: Durability,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp =
        tempfile::Builder::new().prefix(".tmp-").permissions(fs::Permissions::from_mode(0o600)).tempfile_in(dir)?;
    let mut out = io::BufWriter::with_capacity(1 << 16, tmp);
    write(&mut out)?;
    let tmp = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    if durability == Durability::OnDisk {
        rustix::fs::fsync(tmp.as_file())?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if durability == Durability::OnDisk {
        rustix::fs::fsync(fs::File::open(dir)?)?;
    }
    Ok(())
}

/// The counters of a session, read without mapping the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// The last id handed out.
    pub last_id: u64,
    /// Bytes kept in `blobs/`.
    pub bytes_kept: u64,
    /// Records that could not be written.
    pub lost_records: u64,
}

impl Session {
    /// Creates a new session directory (which must not already hold a session), its header
    /// written as durably as `durability` says.
    pub fn create(dir: &Path, header: &Header, durability: Durability) -> Result<Session, SessionError> {
        if dir.join(HEADER_FILE).exists() {
            return Err(SessionError::Io {
                path: dir.to_path_buf(),
                source: io::Error::new(io::ErrorKind::AlreadyExists, "a session already exists there"),
            });
        }
        ensure_layout(dir, header, durability).map_err(io_at(dir))?;
        // An existing directory keeps its mode: one open to others is made private (undo
        // refuses a session others could write).
        let m = fs::metadata(dir).map_err(io_at(dir))?;
        if m.permissions().mode() & 0o077 != 0
            && std::os::unix::fs::MetadataExt::uid(&m) == rustix::process::geteuid().as_raw()
        {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_at(dir))?;
        }
        Session::open(dir)
    }

    /// Opens an existing session directory.
    pub fn open(dir: &Path) -> Result<Session, SessionError> {
        if !dir.exists() {
            return Err(SessionError::NotFound(dir.to_path_buf()));
        }
        check_ownership(dir).map_err(|why| SessionError::NotTrusted { path: dir.to_path_buf(), why })?;
        Session::open_untrusted(dir)
    }

    /// [`Session::open`] without its trust check: for a tool that only reads a session another
    /// user owns (an administrator's audit). Undoing such a session writes where its records
    /// say, with this process's rights: never do it on a session you do not trust.
    pub fn open_untrusted(dir: &Path) -> Result<Session, SessionError> {
        if !dir.exists() {
            return Err(SessionError::NotFound(dir.to_path_buf()));
        }
        let header_path = dir.join(HEADER_FILE);
        let text = match fs::read(&header_path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(SessionError::NotASession(dir.to_path_buf())),
            Err(e) => return Err(SessionError::Io { path: header_path, source: e }),
        };
        let value: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| SessionError::BadHeader { path: header_path.clone(), why: e.to_string() })?;
        if value.get("format").and_then(|f| f.as_str()) != Some(SESSION_FORMAT) {
            return Err(SessionError::BadHeader {
                path: header_path,
                why: format!("\"format\" is not {SESSION_FORMAT:?}"),
            });
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == SESSION_VERSION as u64 => {}
            Some(v) => return Err(SessionError::UnknownVersion { path: dir.to_path_buf(), version: v }),
            None => return Err(SessionError::BadHeader { path: header_path, why: "no \"version\"".into() }),
        }
        let header: Header = serde_json::from_value(value)
            .map_err(|e| SessionError::BadHeader { path: header_path, why: e.to_string() })?;
        Ok(Session { dir: dir.to_path_buf(), header })
    }

    /// The session directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Path of the journal file.
    pub fn journal_path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// Path of the blob directory.
    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join(BLOBS_DIR)
    }

    /// Reads the journal: the main file and every segment. A record whose `seq` no writer of
    /// the session handed out (above the counter, or held twice) is set aside as a problem
    /// ([`crate::journal::Problem::Unaccounted`]).
    pub fn read_journal(&self) -> Result<JournalContents, SessionError> {
        let p = self.journal_path();
        let mut journal = read_with_segments(&p, &self.dir.join(SEGMENTS_DIR)).map_err(io_at(&p))?;
        // The counter is read after the records, so that every id a record holds was handed
        // out by then; a session without a counters file (a copied one) is not checked.
        journal.set_aside_unaccounted(self.last_id_after_reading());
        Ok(journal)
    }

    /// [`Session::read_journal`], checked against the session's seal (when it has one): what
    /// undo would not act on, because it was written or changed since the seal, set aside and
    /// named ([`JournalContents::set_aside_unsealed`], [`JournalContents::set_aside_altered`]).
    /// Every reader that shows or acts on the session's steps reads them so. With the seal.
    pub fn read_checked(&self) -> Result<(JournalContents, Option<crate::seal::Seal>), SessionError> {
        let mut journal = self.read_journal()?;
        let seal = crate::seal::Seal::read(&self.dir).map_err(io_at(&self.dir.join(crate::seal::SEAL_FILE)))?;
        if let Some(seal) = &seal {
            journal.set_aside_unsealed(seal);
            journal.set_aside_altered(seal, &self.dir).map_err(io_at(&self.journal_path()))?;
        }
        Ok((journal, seal))
    }

    /// The session's counter, read after its records, so that every id a record holds was
    /// handed out by then; `None` for a session without a counters file (a copied one), which
    /// is not checked.
    fn last_id_after_reading(&self) -> Option<u64> {
        self.dir.join(COUNTERS_FILE).exists().then(|| self.counters().last_id).filter(|&l| l > 0)
    }

    /// Reads the shared counters (zeros when the file is missing or short): the counters page
    /// only, not the tables after it.
    pub fn counters(&self) -> Counters {
        let mut data = Vec::new();
        if let Ok(f) = fs::File::open(self.dir.join(COUNTERS_FILE)) {
            let _ = f.take(COUNTERS_LEN as u64).read_to_end(&mut data);
        }
        let slot = |i: usize| {
            data.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).unwrap_or(0)
        };
        Counters { last_id: slot(SLOT_LAST_ID), bytes_kept: slot(SLOT_BYTES_KEPT), lost_records: slot(SLOT_LOST) }
    }

    /// Appends one record to the journal (for the CLI, which is not hooked).
    pub fn append(&self, rec: &crate::record::Record) -> Result<(), SessionError> {
        let p = self.journal_path();
        crate::journal::JournalWriter::open(&p).and_then(|w| w.append(rec)).map_err(io_at(&p))
    }

    /// A record made by the process that starts the session's command (a harness, or `run`),
    /// with the id `seq` (from [`Session::reserve_ids_before_start`]): its `exec` of the
    /// command, or a refusal or `unobserved` step about it. The program, pid and time are this
    /// process's.
    pub fn starter_record(&self, seq: u64, call: &str, op: crate::record::Op) -> crate::record::Record {
        crate::record::Record {
            v: crate::record::Version,
            seq,
            time: crate::record::Stamp::now(),
            pid: own_pid(),
            ppid: rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32),
            origin: crate::record::Origin::new(
                std::env::current_exe().map(|p| BPath::from(p.as_path())).unwrap_or_default(),
                call.into(),
            ),
            op,
        }
    }

    /// Seals the session once its command has ended: the after-state of every path it
    /// touched, so that a later undo tells a change made since from its own work
    /// ([`crate::seal`]), written as durably as `durability` says, its records read and the seal
    /// written without holding either whole. `witnessed`: what the supervisor read of the
    /// journal while the session ran ([`crate::witness`]; empty without one): a file that no
    /// longer begins with the lines it read is sealed with those lines. Returns how many
    /// records it covers, and the journal files that were not what the supervisor read;
    /// `progress` is called once per path and per unhashed blob.
    pub fn seal(
        &self,
        durability: Durability,
        witnessed: &crate::witness::Witnessed,
        progress: impl Fn() + Sync,
    ) -> Result<(usize, Vec<String>), SessionError> {
        let p = self.journal_path();
        let segments = self.dir.join(SEGMENTS_DIR);
        let room = crate::journal::records_per_reader(&segments);
        let (parts, _) = crate::journal::visit_with_segments(
            &p,
            &segments,
            || crate::seal::Gathered::with_capacity(room),
            |g, r| g.take(&r),
        )
        .map_err(io_at(&p))?;
        let last_id = self.last_id_after_reading();
        // After the records: every line they were read from is in what it digests.
        let (mut digest, differing) =
            crate::digest::JournalDigest::take_witnessed(&self.dir, true, witnessed).map_err(io_at(&p))?;
        let lines = self.dir.join(crate::digest::LINES_FILE);
        digest.write_lines(&self.dir, durability).map_err(io_at(&lines))?;
        let records =
            crate::seal::seal_streamed(parts, last_id, &digest, &self.dir, &self.blobs_dir(), durability, progress)
                .map_err(io_at(&self.dir.join(crate::seal::SEAL_FILE)))?;
        Ok((records, differing))
    }

    /// Takes `n` ids from the shared counter without mapping it, returning the first. Only
    /// correct while no process of the session is running (before `run` starts its command),
    /// since it is a read followed by a write.
    pub fn reserve_ids_before_start(&self, n: u64) -> Result<u64, SessionError> {
        use std::os::unix::fs::FileExt;
        let p = self.dir.join(COUNTERS_FILE);
        let f = ensure_counters(&p).map_err(io_at(&p))?;
        let mut slot = [0u8; 8];
        f.read_exact_at(&mut slot, (SLOT_LAST_ID * 8) as u64).map_err(io_at(&p))?;
        let last = u64::from_le_bytes(slot);
        f.write_all_at(&(last + n).to_le_bytes(), (SLOT_LAST_ID * 8) as u64).map_err(io_at(&p))?;
        Ok(last + 1)
    }

    /// What the session's journaling could see ([`Coverage::unknown`] for a session recorded
    /// before coverage was kept).
    pub fn coverage(&self) -> Coverage {
        self.header.coverage.clone().unwrap_or_else(Coverage::unknown)
    }

    /// The lifecycle state.
    pub fn state(&self) -> State {
        fs::read(self.dir.join(STATE_FILE))
            .ok()
            .and_then(|t| serde_json::from_slice::<StateFile>(&t).ok())
            .map(|s| s.state)
            .unwrap_or(State::Active)
    }

    /// The processes that still hold a file of this session open or mapped (its journal, a
    /// segment, its counters): a process of the session still running (a dev server or a
    /// watcher left behind by `run`, or the command itself while an undo is taken). Found in
    /// `/proc`, among the processes this user may inspect; this process excluded.
    ///
    /// What it cannot see: a process of the session that has not journaled anything yet
    /// (it has opened nothing here), or one owned by another user. A process that holds the
    /// session's files only for reading (a `review`, an undo of another session looking at
    /// what this one journaled) is not one of its processes.
    pub fn live_processes(&self) -> Vec<u32> {
        live_processes_of(&[self]).pop().unwrap_or_default()
    }

    /// Records a new lifecycle state.
    pub fn set_state(&self, state: State) -> Result<(), SessionError> {
        let p = self.dir.join(STATE_FILE);
        let body = serde_json::to_vec(&StateFile { state, changed: now_rfc3339_seconds() }).map_err(io::Error::other);
        body.and_then(|b| write_atomically(&p, &b)).map_err(io_at(&p))
    }
}

/// Every process but this one, with the files it holds open or mapped for writing (one pass
/// over `/proc`).
///
/// Only what a writer holds counts: a descriptor open for writing, or a writable mapping. A
/// process that reads a session (an undo of another session checking what this one journaled,
/// a `review`) holds its files read-only, and is not one of its processes.
fn processes_and_what_they_hold() -> impl Iterator<Item = (u32, Vec<PathBuf>)> {
    use std::os::unix::ffi::OsStringExt;
    let me = own_pid();
    let procs = fs::read_dir("/proc").into_iter().flatten();
    procs.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).filter(move |&p| p != me).map(|pid| {
        let writes = |fd: &std::ffi::OsStr| {
            let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy())).unwrap_or_default();
            let flags =
                info.lines().find_map(|l| l.strip_prefix("flags:")).and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
            flags.map(rustix::fs::OFlags::from_bits_retain).is_some_and(|f| {
                (f & rustix::fs::OFlags::ACCMODE) != rustix::fs::OFlags::RDONLY && !f.contains(rustix::fs::OFlags::PATH)
            })
        };
        let mut held: Vec<PathBuf> = fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|fd| writes(&fd.file_name()))
            .filter_map(|fd| fs::read_link(fd.path()).ok())
            .collect();
        let maps = fs::read(format!("/proc/{pid}/maps")).unwrap_or_default();
        // `ADDRESS PERMS OFFSET DEV INODE PATH`: a writable mapping's PERMS is `?w??`.
        held.extend(maps.split(|&c| c == b'\n').filter(|l| mapped_writable(l)).filter_map(|l| {
            l.iter().position(|&c| c == b'/').map(|i| PathBuf::from(std::ffi::OsString::from_vec(l[i..].to_vec())))
        }));
        (pid, held)
    })
}

/// Whether a line of `/proc/PID/maps` is a writable mapping.
fn mapped_writable(line: &[u8]) -> bool {
    line.split(|&c| c == b' ').nth(1).is_some_and(|perms| perms.get(1) == Some(&b'w'))
}

/// Every session some process still holds open for writing (its journal, a segment, the
/// shared tables), wherever it is, with those processes: one pass over `/proc`. This process is left out.
pub fn live_sessions() -> Vec<(PathBuf, Vec<u32>)> {
    let mut found: std::collections::BTreeMap<PathBuf, Vec<u32>> = std::collections::BTreeMap::new();
    for (pid, held) in processes_and_what_they_hold() {
        let mut dirs: Vec<PathBuf> = held
            .iter()
            .filter_map(|h| {
                let name = h.file_name()?.to_str()?;
                let parent = h.parent()?;
                match name {
                    JOURNAL_FILE | COUNTERS_FILE | CAPTURES_FILE | BORN_FILE | BLOBS_DIR => Some(parent.to_path_buf()),
                    _ if parent.file_name().is_some_and(|n| n == SEGMENTS_DIR) => Some(parent.parent()?.to_path_buf()),
                    _ => None,
                }
            })
            .filter(|d| d.join(HEADER_FILE).is_file())
            .collect();
        dirs.sort();
        dirs.dedup();
        for d in dirs {
            found.entry(d).or_default().push(pid);
        }
    }
    found.into_iter().collect()
}

/// [`Session::live_processes`] of each of `sessions`, from one pass over `/proc` (a choice
/// among many sessions reads every process's descriptors once, not once per session).
pub fn live_processes_of(sessions: &[&Session]) -> Vec<Vec<u32>> {
    // Path::starts_with compares whole components: a file under the session directory.
    let dirs: Vec<Option<PathBuf>> = sessions.iter().map(|s| fs::canonicalize(&s.dir).ok()).collect();
    let mut live = vec![Vec::new(); sessions.len()];
    for (pid, held) in processes_and_what_they_hold() {
        for (i, dir) in dirs.iter().enumerate() {
            if dir.as_ref().is_some_and(|d| held.iter().any(|h| h.starts_with(d) && h != d)) {
                live[i].push(pid);
            }
        }
    }
    live
}

impl Session {
    /// The files the session's running processes hold open for writing (or have mapped
    /// shared and writable), outside its store: what they write through those descriptors is
    /// not journaled again after a mark. Regular files only, sorted.
    ///
    /// What it cannot see: processes of the session that hold no file of its store (a
    /// program the supervisor journals for, which never opens the store itself).
    pub fn held_for_writing(&self) -> Vec<BPath> {
        use std::os::unix::ffi::OsStringExt;
        let store = fs::canonicalize(&self.dir).map(|d| BPath::from(d.as_path())).ok();
        let mut out = std::collections::BTreeSet::new();
        let mut keep = |target: Vec<u8>| {
            let p = BPath::new(target);
            let regular = fs::symlink_metadata(p.as_path()).is_ok_and(|m| m.file_type().is_file());
            if p.as_bytes().starts_with(b"/")
                && regular
                && store.as_ref().is_none_or(|s| !p.starts_with_dir(s.as_bytes()))
            {
                out.insert(p);
            }
        };
        for pid in self.live_processes() {
            for fd in fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
                let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy()));
                let flags = info.ok().and_then(|i| {
                    let f = i.lines().find_map(|l| l.strip_prefix("flags:"))?.trim().to_string();
                    u32::from_str_radix(&f, 8).ok()
                });
                if flags.is_some_and(|f| f & 0o3 != 0)
                    && let Ok(t) = fs::read_link(fd.path())
                {
                    keep(t.into_os_string().into_vec());
                }
            }
            for line in fs::read(format!("/proc/{pid}/maps")).unwrap_or_default().split(|&c| c == b'\n') {
                let mut fields = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
                let perms = fields.nth(1).unwrap_or_default();
                if perms.get(1) == Some(&b'w')
                    && perms.get(3) == Some(&b's')
                    && let Some(i) = line.iter().position(|&c| c == b'/')
                {
                    keep(line[i..].to_vec());
                }
            }
        }
        out.into_iter().collect()
    }
}

/// What `aether-journal sessions` shows about a session.
#[derive(Clone, Debug, Serialize)]
pub struct SessionInfo {
    /// What `sessions` shows: `open` (running, or ended without `run` sealing it), `sealed`
    /// (ended under `run`, neither undone nor kept), `undone` or `kept`.
    pub phase: &'static str,
    /// Session id.
    pub id: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The command it was started for.
    pub root_command: Vec<BPath>,
    /// When it started.
    pub created: String,
    /// active, undone or kept.
    pub state: State,
    /// Records in its journal.
    pub records: usize,
    /// Bytes of captured contents it holds now.
    pub bytes_captured: u64,
    /// Steps that can never be undone.
    pub irreversible: usize,
    /// Bytes the session directory takes on disk in all (allocated blocks).
    pub bytes_total: u64,
    /// Its marks' names, oldest first.
    pub marks: Vec<String>,
}

/// Bytes of the files under `p`: their lengths, or (`on_disk`) the blocks they occupy, which is
/// what a sparse file like `captures` really costs.
fn dir_size_of(p: &Path, on_disk: bool) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = fs::read_dir(p) else { return 0 };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size_of(&e.path(), on_disk),
            Ok(m) if on_disk => m.blocks() * 512,
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn dir_size(p: &Path) -> u64 {
    dir_size_of(p, false)
}

impl Session {
    /// The listing information.
    pub fn info(&self) -> SessionInfo {
        let journal = self.read_journal().unwrap_or_default();
        let sealed = self.dir.join(crate::seal::SEAL_FILE).exists();
        let phase = match self.state() {
            State::Undone => "undone",
            State::Kept => "kept",
            State::Active if sealed => "sealed",
            State::Active => "open",
        };
        SessionInfo {
            phase,
            id: self.header.id.clone(),
            dir: self.dir.clone(),
            root_command: self.header.root_command.clone(),
            created: self.header.created.clone(),
            state: self.state(),
            records: journal.records.len(),
            bytes_captured: dir_size(&self.blobs_dir()),
            irreversible: journal.records.iter().filter(|r| r.irreversible()).count(),
            bytes_total: dir_size_of(&self.dir, true),
            marks: self.marks().unwrap_or_default().into_iter().map(|m| m.name).collect(),
        }
    }

    /// Accepts the session: releases its captured contents, keeps its header and journal (the
    /// audit log). With `forget`, deletes the session directory altogether.
    pub fn keep(&self, forget: bool, root: Option<&Path>) -> Result<u64, SessionError> {
        if forget {
            // The directory itself, not a link to it (a session kept elsewhere is listed
            // through a link under the state directory): only what is gone counts as freed.
            let real = fs::canonicalize(&self.dir).map_err(io_at(&self.dir))?;
            let before = dir_size_of(&real, true);
            let removed = fs::remove_dir_all(&real).map_err(io_at(&real));
            let freed = before.saturating_sub(if real.exists() { dir_size_of(&real, true) } else { 0 });
            removed?;
            for link in [Some(self.dir.clone()), root.map(|r| r.join(&self.header.id))].into_iter().flatten() {
                if link.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
                    let _ = fs::remove_file(&link);
                }
            }
            return Ok(freed);
        }
        let blobs = self.blobs_dir();
        let before = dir_size(&blobs);
        self.set_state(State::Kept)?;
        fs::remove_dir_all(&blobs).map_err(io_at(&blobs))?;
        mkdir_0700(&blobs).map_err(io_at(&blobs))?;
        Ok(before)
    }
}

/// One session removed (or to be removed) by [`gc`], and why.
#[derive(Clone, Debug, Serialize)]
pub struct Collected {
    /// The session.
    pub session: SessionInfo,
    /// Why it goes.
    pub why: String,
    /// The bytes its removal freed (0 for a dry run).
    pub freed: u64,
    /// Why it could not be removed (wholly or in part), if it could not.
    pub error: Option<String>,
}

/// Removes sessions under `root` older than `older_than`, then the oldest ones until the rest
/// take at most `max_size` bytes. With `dry_run`, only says which.
pub fn gc(
    root: &Path,
    older_than: Option<std::time::Duration>,
    max_size: Option<u64>,
    dry_run: bool,
) -> Vec<Collected> {
    let mut infos: Vec<(Session, SessionInfo)> = list_sessions(root)
        .into_iter()
        .filter_map(|s| s.ok())
        .map(|s| {
            let i = s.info();
            (s, i)
        })
        .collect();
    // Oldest first.
    infos.sort_by(|a, b| a.1.created.cmp(&b.1.created));
    let now = SystemTime::now();
    let mut out = Vec::new();
    let mut keep = Vec::new();
    for (s, info) in infos {
        let age = humantime::parse_rfc3339_weak(&info.created).ok().and_then(|t| now.duration_since(t).ok());
        match (older_than, age) {
            (Some(limit), Some(age)) if age > limit => {
                let why = format!("older than {} (started {})", humantime::format_duration(limit), info.created);
                out.push((s, Collected { session: info, why, freed: 0, error: None }));
            }
            _ => keep.push((s, info)),
        }
    }
    if let Some(max) = max_size {
        let mut total: u64 = keep.iter().map(|(_, i)| i.bytes_total).sum();
        let mut rest = Vec::new();
        for (s, info) in keep {
            if total > max {
                total -= info.bytes_total;
                let why = format!("the sessions took more than {max} bytes; this is one of the oldest");
                out.push((s, Collected { session: info, why, freed: 0, error: None }));
            } else {
                rest.push((s, info));
            }
        }
    }
    if !dry_run {
        for (s, c) in &mut out {
            match s.keep(true, Some(root)) {
                Ok(freed) => c.freed = freed,
                Err(e) => c.error = Some(e.to_string()),
            }
        }
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// Every session under `root` (directories and symlinks to directories with a readable
/// header), newest first. Entries that are not sessions are ignored; damaged ones are returned
/// as errors so that a listing can name them.
pub fn list_sessions(root: &Path) -> Vec<Result<Session, SessionError>> {
    let mut roots = vec![root.to_path_buf()];
    // Sessions made where the state directory could not be written (see fallback_roots)
    // belong to the same user's list.
    if sessions_root().as_deref() == Some(root) {
        roots.extend(fallback_roots());
    }
    let mut out: Vec<Result<Session, SessionError>> = roots
        .iter()
        .filter_map(|r| fs::read_dir(r).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| Session::open(&e.path()))
        .filter(|r| !matches!(r, Err(SessionError::NotASession(_))))
        .collect();
    out.sort_by(|a, b| match (a, b) {
        (Ok(a), Ok(b)) => (&b.header.created, &b.header.id).cmp(&(&a.header.created, &a.header.id)),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => std::cmp::Ordering::Equal,
    });
    out
}

/// The session a command without `--journal` means in `cwd` (as git finds its repository):
/// the newest one under `root` started in `cwd` or a directory above it. Refuses to guess
/// when more than one of them is still running ([`Session::live_processes`]).
pub fn session_here(root: &Path, cwd: &Path) -> Result<Session, SessionError> {
    use std::os::unix::ffi::OsStrExt;
    let cwd = fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    let here = BPath::new(cwd.as_os_str().as_bytes().to_vec());
    let candidates: Vec<Session> = list_sessions(root)
        .into_iter()
        .filter_map(|s| s.ok())
        .filter(|s| here.starts_with_dir(s.header.cwd.as_bytes()))
        .collect();
    let Some(newest) = candidates.first() else {
        return Err(SessionError::NoSessionHere { cwd, root: root.to_path_buf() });
    };
    let refs: Vec<&Session> = candidates.iter().collect();
    let running: Vec<PathBuf> = live_processes_of(&refs)
        .into_iter()
        .zip(&candidates)
        .filter(|(pids, _)| !pids.is_empty())
        .map(|(_, s)| s.dir.clone())
        .collect();
    if running.len() > 1 {
        return Err(SessionError::Ambiguous { dirs: running });
    }
    Session::open(&newest.dir)
}

/// The newest readable session under `root`.
pub fn latest_session(root: &Path) -> Result<Session, SessionError> {
    list_sessions(root).into_iter().find_map(|s| s.ok()).ok_or_else(|| SessionError::NoSessions(root.to_path_buf()))
}

/// Removes a session that journaled nothing because its command could not be started (no
/// such program, not executable), with its link under `root`: nothing is left for `undo` to
/// mistake for the last session.
pub fn discard_unstarted(root: Option<&Path>, session: Session) -> io::Result<()> {
    if let Some(root) = root {
        let link = root.join(&session.header.id);
        if link.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
            fs::remove_file(link)?;
        }
    }
    fs::remove_dir_all(&session.dir)
}

/// Adds a symlink `root/<id>` to a session kept elsewhere, so that commands without
/// `--journal` find it.
pub fn register(root: &Path, session: &Session) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o700).recursive(true).create(root)?;
    let link = root.join(&session.header.id);
    if link.exists() || link.symlink_metadata().is_ok() {
        return Ok(());
    }
    let target = fs::canonicalize(&session.dir)?;
    if target.parent() == Some(&fs::canonicalize(root)?) {
        return Ok(());
    }
    std::os::unix::fs::symlink(target, link)
}

/// Checks that a directory is a safe place to write restores from: owned by us, not writable
/// by others.
pub fn check_ownership(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let md = fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if md.uid() != me {
        return Err(format!(
            "the session directory {} is owned by uid {}, not by you (uid {me}); refusing to use it",
            dir.display(),
            md.uid()
        ));
    }
    if md.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "the session directory {} is writable by other users (mode {:o}); refusing to use it",
            dir.display(),
            md.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: &str) -> Header {
        Header::new(id.into(), vec![BPath::from("bash")], BPath::from("/"), "cli")
    }

    #[test]
    fn the_library_refuses_a_session_directory_others_can_write_unless_asked_not_to_check() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("s");
        Session::create(&dir, &header("s"), Durability::InKernel).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(Session::open(&dir), Err(SessionError::NotTrusted { .. })));
        assert!(Session::open_untrusted(&dir).is_ok());
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(Session::open(&dir).is_ok());
    }

    #[test]
    fn an_atomic_write_replaces_the_file_whole_private_and_leaves_no_temporary_behind() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("state.json");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        write_atomically(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new\n");
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let names: Vec<_> = fs::read_dir(t.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn a_new_session_directory_is_private() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("s");
        let s = Session::create(&dir, &header("s"), Durability::InKernel).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(s.dir()), 0o700);
        assert_eq!(mode(&s.blobs_dir()), 0o700);
        assert_eq!(mode(&s.journal_path()), 0o600);
        assert_eq!(mode(&dir.join(HEADER_FILE)), 0o600);
        assert_eq!(fs::metadata(dir.join(COUNTERS_FILE)).unwrap().len(), COUNTERS_TABLES_LEN as u64);
        assert!(
            !dir.join(CAPTURES_FILE).exists() && !dir.join(BORN_FILE).exists(),
            "the tables are in the counters file"
        );
        assert_eq!(s.state(), State::Active);
        assert_eq!(s.header().version, SESSION_VERSION);
    }

    #[test]
    fn an_unknown_session_version_is_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let s = Session::create(&t.path().join("s"), &header("s"), Durability::InKernel).unwrap();
        let mut h = serde_json::to_value(s.header()).unwrap();
        h["version"] = 7.into();
        fs::write(s.dir().join(HEADER_FILE), serde_json::to_vec(&h).unwrap()).unwrap();
        let err = Session::open(s.dir()).unwrap_err();
        assert!(matches!(err, SessionError::UnknownVersion { version: 7, .. }), "{err}");
    }

    #[test]
    fn state_changes_are_persisted() {
        let t = tempfile::tempdir().unwrap();
        let s = Session::create(&t.path().join("s"), &header("s"), Durability::InKernel).unwrap();
        s.set_state(State::Undone).unwrap();
        assert_eq!(Session::open(s.dir()).unwrap().state(), State::Undone);
    }

    #[test]
    fn the_latest_session_is_the_newest_by_creation() {
        let t = tempfile::tempdir().unwrap();
        let mut a = header("a");
        a.created = "2026-01-01T00:00:00Z".into();
        let mut b = header("b");
        b.created = "2026-02-01T00:00:00Z".into();
        Session::create(&t.path().join("a"), &a, Durability::InKernel).unwrap();
        Session::create(&t.path().join("b"), &b, Durability::InKernel).unwrap();
        fs::create_dir(t.path().join("not-a-session")).unwrap();
        assert_eq!(latest_session(t.path()).unwrap().header().id, "b");
    }

    #[test]
    fn the_state_root_follows_xdg_then_home() {
        assert_eq!(sessions_root_from(Some(b"/x"), Some(b"/h")), Some(PathBuf::from("/x/aether-journal")));
        assert_eq!(
            sessions_root_from(Some(b"rel"), Some(b"/h")),
            Some(PathBuf::from("/h/.local/state/aether-journal"))
        );
        assert_eq!(sessions_root_from(None, None), None);
    }
}

#[cfg(test)]
mod format_doc {
    //! `docs/FORMAT.md` is the normative description of the session directory: the constants
    //! here must be the ones it states.
    use super::*;
    use crate::internal::counters::*;

    const DOC: &str = include_str!("../docs/FORMAT.md");

    fn row(slot: &str) -> bool {
        DOC.lines().any(|l| l.starts_with(&format!("| {slot} |")))
    }

    #[test]
    fn the_counters_slots_are_the_ones_the_format_document_states() {
        for (slot, what) in [
            (SLOT_LAST_ID, "the last id"),
            (SLOT_BYTES_KEPT, "bytes kept"),
            (SLOT_LOST, "could not be written"),
            (SLOT_NAMES_GEN, "names generation"),
            (SLOT_CWD_GEN, "working-directory generation"),
            (SLOT_CWD_DONE, "working-directory changes done"),
            (SLOT_NAMES_DONE, "names changes done"),
            (SLOT_SESSION, "the session's tag"),
            (SLOT_MARKS, "marks made so far"),
            (SLOT_LAST_MARK, "the seq of the newest mark"),
            (SLOT_SUPERVISOR_PEAK_KIB, "peak resident memory"),
            (SLOT_EXECS, "execs the shim journaled"),
        ] {
            assert!(
                DOC.lines().any(|l| l.starts_with(&format!("| {slot} | ")) && l.contains(what)),
                "FORMAT.md has no counters row `| {slot} | ...{what}...`"
            );
        }
        assert!(row(&format!("{}, {}", SLOT_NOTIFIED, SLOT_PASSED)));
        assert!(row(&format!("{}-{}", SLOT_BORN_NAMES, SLOT_BORN_NAMES + 4 * BORN_NAMES - 1)));
        assert!(row(&format!("{}-{}", SLOT_PASSES, COUNTERS_LEN / 8 - 1)));
        assert_eq!(SLOT_EXEC_VERDICTS, COUNTERS_LEN / 8, "the verdicts fill the second page");
        assert_eq!(SLOT_EXEC_VERDICTS + 8 * EXEC_VERDICTS, COUNTERS_FILE_LEN / 8);
        assert!(row(&format!("{}-{}", SLOT_EXEC_VERDICTS, COUNTERS_FILE_LEN / 8 - 1)));
        assert!(DOC.contains(&format!("{EXEC_VERDICTS} exec verdicts, 8 slots each")));
        assert!(DOC.contains(&format!("{BORN_NAMES} names born unseen, 4 slots each")));
        assert!(DOC.contains(&format!("the magic `{}`", std::str::from_utf8(COUNTERS_MAGIC).unwrap())));
    }

    #[test]
    fn the_file_names_and_table_sizes_are_the_ones_the_format_document_states() {
        for name in
            [HEADER_FILE, JOURNAL_FILE, SEGMENTS_DIR, BLOBS_DIR, COUNTERS_FILE, CAPTURES_FILE, BORN_FILE, STATE_FILE]
        {
            assert!(DOC.contains(&format!("  {name} ")) || DOC.contains(&format!("  {name}/")), "{name}");
        }
        assert!(DOC.contains(&format!("segments/{}", crate::marks::MARKS_SEGMENT)));
        assert!(DOC.contains(&format!("counters                 {COUNTERS_TABLES_LEN} bytes")));
        assert!(DOC.contains(&format!("| {CAPTURES_AT} | {CAPTURES_LEN} | the capture index")));
        assert!(DOC.contains(&format!("| {BORN_AT} | {BORN_LEN} | the born table |")));
        assert!(DOC.contains(&format!("captures                 {} MiB", CAPTURES_LEN >> 20)));
        assert!(DOC.contains(&format!("born                     {} KiB", BORN_LEN >> 10)));
        assert!(DOC.contains(&format!("holds {} slots of eight `u64`s", CAPTURES_LEN / 64)));
        assert!(DOC.contains(&format!("(`born`) holds {} slots", BORN_LEN / 64)));
        assert!(DOC.contains(&format!("\"format\": \"{SESSION_FORMAT}\", \"version\": {SESSION_VERSION}")));
    }
}
