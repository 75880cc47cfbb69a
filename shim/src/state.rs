//! The shim's configuration (from the `AETHER_*` variables the process image started with,
//! copied by the constructor and parsed on first use) and the per-process handle on the
//! session store (opened at the first mutation, inherited across `fork`).
//!
//! What this module cannot do: journal anything when the session directory cannot be created
//! or opened at all. Hooked calls then run unjournaled; the `lost` counter in the session's
//! shared counters records every record that could not be written once the store was open.

use std::ffi::{OsStr, c_char};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use aether_journal_recorder::index::SharedIndex;
pub use aether_journal_recorder::tables::{SharedCounters, map_shared};
use journal_core::BPath;
use journal_core::capture::Counters;
use journal_core::config::{ENV_DIR, ENV_SESSION_ID, ENV_SWITCH, ENV_TEST_FAULT, Settings};
use journal_core::internal::Envelope;
use journal_core::record::Op;
use journal_core::session::{self, COUNTERS_FILE};
use rustix::fs::{Mode, OFlags};

/// Settings read once per process image.
pub struct Config {
    /// False with `AETHER_JOURNAL=off`, or when no session could be set up.
    pub enabled: bool,
    /// The session directory (absolute).
    pub session_dir: Vec<u8>,
    /// Budgets, policy, sync.
    pub settings: Settings,
    /// This library's own path (what `LD_PRELOAD` must name in every child).
    pub shim_path: Vec<u8>,
    /// Every `AETHER_*` variable of this process image (`NAME=value`), re-inserted into a
    /// child's environment when a caller passes one without them.
    pub exec_env: Vec<Vec<u8>>,
    /// For the test suite only (`AETHER_JOURNAL_TEST_FAULT=SUFFIX`): the shim's own work
    /// panics on a hooked call whose path ends with SUFFIX, so that a test can prove a panic
    /// is caught, the call still made, and the step journaled as irreversible. With
    /// `kill-after-call:NAME`, a process kills itself (SIGKILL) as soon as a real NAME call
    /// returns, before the shim's bookkeeping after it: the window a `kill -9` can hit.
    pub test_fault: Option<Vec<u8>>,
    /// Whether a supervisor watches this process (run's seccomp filter: the session's marker
    /// is set and the process is under a filter). It then journals every exec itself.
    pub supervised: bool,
    /// The id of the session `session_dir` held when this process's session was made
    /// (`AETHER_JOURNAL_SESSION_ID`): none there means the store vanished, another means it
    /// is not this session's.
    pub session_id: Option<Vec<u8>>,
}

/// The path of the object this function lives in: the shim itself.
fn own_path() -> Vec<u8> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a plain out-parameter and
    // dli_fname, when set, is a NUL-terminated string owned by the loader.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(own_path as *const libc::c_void, &mut info) != 0 && !info.dli_fname.is_null() {
            let p = std::ffi::CStr::from_ptr(info.dli_fname).to_bytes().to_vec();
            if p.first() == Some(&b'/') {
                return p;
            }
            let cwd = journal_core::resolve::getcwd().unwrap_or_default();
            return journal_core::bpath::join(&cwd, &p);
        }
    }
    Vec::new()
}

/// Room for the `AETHER_*` entries of the starting environment (a session needs a few hundred
/// bytes; a larger set falls back to reading the environment when the configuration is built).
const EARLY_ENV_CAP: usize = 4096;

/// The `AETHER_*` entries of the environment this process image started with, each
/// `NAME=value` followed by a NUL, copied by the constructor into static storage.
///
/// # Rationale
/// The configuration must come from the environment the image started with (a program may
/// `clearenv` or `unsetenv` before it execs, and the exec hooks put our variables back), but
/// building it costs allocations and code that a process which never changes a file never
/// needs. The constructor only scans `environ` for the prefix and copies the few matching
/// entries in place, without allocating; [`config`] parses them on first use.
struct EarlyEnv {
    /// `EARLY_EMPTY`, `EARLY_WRITING`, `EARLY_DONE` or `EARLY_OVERFLOW`.
    state: AtomicU32,
    len: AtomicUsize,
    bytes: std::cell::UnsafeCell<[u8; EARLY_ENV_CAP]>,
}

// SAFETY: `bytes` is written only by the one thread that moved `state` from EMPTY to WRITING,
// and read only after `state` is DONE (release/acquire).
unsafe impl Sync for EarlyEnv {}

const EARLY_EMPTY: u32 = 0;
const EARLY_WRITING: u32 = 1;
const EARLY_DONE: u32 = 2;
const EARLY_OVERFLOW: u32 = 3;

static EARLY_ENV: EarlyEnv = EarlyEnv {
    state: AtomicU32::new(EARLY_EMPTY),
    len: AtomicUsize::new(0),
    bytes: std::cell::UnsafeCell::new([0; EARLY_ENV_CAP]),
};

/// Copies the `AETHER_*` entries of `environ` (see [`EarlyEnv`]), once. Allocates nothing.
pub fn capture_early_env() {
    if EARLY_ENV.state.compare_exchange(EARLY_EMPTY, EARLY_WRITING, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return;
    }
    // SAFETY: this thread alone moved the state to WRITING: nobody else touches `bytes` until
    // it is DONE.
    let bytes = unsafe { &mut *EARLY_ENV.bytes.get() };
    let environ = crate::exec::current_environ();
    let entries = (0..).map_while(|i| {
        // SAFETY: `environ` is null or a null-terminated array of NUL-terminated strings; this
        // runs in the constructor (before main and its threads) or on a hook's first use, and
        // only reads.
        let p = if environ.is_null() { std::ptr::null() } else { unsafe { *environ.add(i) } };
        // SAFETY: a non-null entry is a NUL-terminated string (see above).
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
    });
    let mut len = 0;
    let mut state = EARLY_DONE;
    for e in entries.filter(|e| e.starts_with(b"AETHER_")) {
        let Some(room) = bytes.get_mut(len..len + e.len() + 1) else {
            state = EARLY_OVERFLOW;
            break;
        };
        room[..e.len()].copy_from_slice(e);
        room[e.len()] = 0;
        len += e.len() + 1;
    }
    EARLY_ENV.len.store(len, Ordering::Relaxed);
    EARLY_ENV.state.store(state, Ordering::Release);
}

/// The copied entries, once the constructor's copy is complete and whole.
fn early_entries() -> Option<impl Iterator<Item = &'static [u8]>> {
    if EARLY_ENV.state.load(Ordering::Acquire) != EARLY_DONE {
        return None;
    }
    // SAFETY: DONE means the writer has finished: `bytes` is only read from now on.
    let bytes = unsafe { &*EARLY_ENV.bytes.get() };
    Some(bytes[..EARLY_ENV.len.load(Ordering::Relaxed)].split(|&b| b == 0).filter(|e| !e.is_empty()))
}

/// Sets the supervisor's marker ([`crate::kernel::mark`]) from the starting environment,
/// unless the shim is switched off (then nothing it does is journaled, so nothing is marked).
/// Allocation-free: it runs in the constructor of every process.
pub fn adopt_mark() {
    capture_early_env();
    let Some(entries) = early_entries() else { return };
    let mut mark = None;
    for e in entries {
        if env_value(e, ENV_SWITCH.as_bytes()) == Some(b"off") {
            return;
        }
        if let Some(v) = env_value(e, journal_core::config::ENV_MARK.as_bytes()) {
            mark = Some(v);
        }
    }
    if let Some(v) = mark {
        crate::kernel::set_mark_from(v);
    }
}

/// The `AETHER_*` entries the image started with, as `NAME=value` byte strings.
fn early_env() -> Vec<Vec<u8>> {
    capture_early_env();
    match early_entries() {
        Some(entries) => entries.map(<[u8]>::to_vec).collect(),
        // Too many variables to keep, or another thread is copying them right now.
        None => std::env::vars_os()
            .filter(|(k, _)| k.as_bytes().starts_with(b"AETHER_"))
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
            .collect(),
    }
}

/// The value in a `NAME=value` environment entry, if it is `name`'s.
pub fn env_value<'a>(entry: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    entry.strip_prefix(name).and_then(|rest| rest.strip_prefix(b"="))
}

/// The value of `name` among `entries` (`NAME=value` strings).
fn lookup<'a>(entries: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    entries.iter().find_map(|e| env_value(e, name.as_bytes()))
}

/// Whether the constructor must build the configuration now rather than on first use: for
/// the root process of a new session (no session directory inherited), which must create the
/// session and export its directory before `main` so that every descendant joins it, and for
/// a relative session directory, which names a place under the cwd the process started in.
/// Allocation-free in the common case: it runs in the constructor of every process.
pub fn configure_in_constructor() -> bool {
    fn now<'a>(mut entries: impl Iterator<Item = &'a [u8]>) -> bool {
        !entries.any(|e| {
            env_value(e, ENV_SWITCH.as_bytes()) == Some(b"off")
                || env_value(e, ENV_DIR.as_bytes()).is_some_and(|d| d.first() == Some(&b'/'))
        })
    }
    capture_early_env();
    match early_entries() {
        Some(entries) => now(entries),
        None => now(early_env().iter().map(Vec::as_slice)),
    }
}

/// The configuration: a leaked box, published once and never freed.
///
/// # Rationale
/// Lock-free, like the store: it is built on first use, which may be on any thread, and a
/// `fork` by another thread in the middle of building it must not leave the child waiting for
/// a build that will never finish there (a `OnceLock` would: measured as a wedged child of a
/// threaded program). Threads that race each build one; the loser frees its own.
static CONFIG: AtomicPtr<Config> = AtomicPtr::new(std::ptr::null_mut());

/// The configuration, built on first use from the environment the image started with.
pub fn config() -> &'static Config {
    let p = CONFIG.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null CONFIG points to a leaked Box<Config> that is never freed.
        return unsafe { &*p };
    }
    // Everything in it outlives the hook that builds it, which may be a signal handler: the
    // permanent region, not the arena or malloc.
    publish_config(crate::alloc::permanent(|| read_config(None)))
}

fn publish_config(cfg: Config) -> &'static Config {
    let fresh = crate::alloc::permanent(|| Box::into_raw(Box::new(cfg)));
    match CONFIG.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: we just stored `fresh`, a leaked Box that is never freed.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` came from Box::into_raw above and was never shared.
            crate::alloc::permanent(|| drop(unsafe { Box::from_raw(fresh) }));
            // SAFETY: as for the first branch.
            unsafe { &*winner }
        }
    }
}

/// Called from the constructor, with the program's arguments, when
/// [`configure_in_constructor`] says so (before `main` and its threads: nothing races it).
pub fn init_from_ctor(argv: Vec<BPath>) {
    if CONFIG.load(Ordering::Acquire).is_null() {
        publish_config(read_config(Some(argv)));
    }
}

fn cmdline() -> Vec<BPath> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(BPath::from).collect())
        .unwrap_or_default()
}

fn read_config(argv: Option<Vec<BPath>>) -> Config {
    let vars = early_env();
    let (settings, _warnings) =
        Settings::from_lookup(|k| lookup(&vars, k).map(|v| String::from_utf8_lossy(v).into_owned()));
    let shim_path = own_path();
    let test_fault = lookup(&vars, ENV_TEST_FAULT).filter(|v| !v.is_empty()).map(<[u8]>::to_vec);
    let disabled = Config {
        enabled: false,
        session_dir: Vec::new(),
        settings: settings.clone(),
        shim_path: shim_path.clone(),
        exec_env: Vec::new(),
        test_fault: None,
        supervised: false,
        session_id: None,
    };
    if lookup(&vars, ENV_SWITCH) == Some(b"off") {
        return disabled;
    }
    let cwd = || journal_core::resolve::getcwd().unwrap_or_else(|_| b"/".to_vec());
    let in_constructor = argv.is_some();
    let mut made_id: Option<String> = None;
    let dir = match lookup(&vars, ENV_DIR).filter(|d| !d.is_empty()) {
        // Every descendant of a session normally inherits an absolute directory: no getcwd.
        Some(dir) if dir.first() == Some(&b'/') => {
            let session_id = lookup(&vars, ENV_SESSION_ID).filter(|v| !v.is_empty()).map(<[u8]>::to_vec);
            return Config {
                enabled: true,
                session_dir: dir.to_vec(),
                settings,
                shim_path,
                exec_env: vars,
                test_fault,
                supervised: supervised(),
                session_id,
            };
        }
        // A relative one names a directory under the cwd the process started in: the
        // constructor resolves it (see `configure_in_constructor`) and hands the absolute name on.
        Some(dir) => std::path::PathBuf::from(OsStr::from_bytes(&journal_core::bpath::join(&cwd(), dir))),
        None => {
            // No session yet: this process is the root of a new one. Create it now and export
            // its directory so that every descendant joins it.
            let id = session::new_session_id();
            let mut header = session::Header::new(id.clone(), argv.unwrap_or_else(cmdline), BPath::new(cwd()), "shim");
            header.coverage = Some(session::Coverage::libc(session::CoverageReason::PreloadOnly));
            // The state directory, or, when it cannot be written, a private fallback that the
            // CLI lists with it: never a session that journals nothing and says nothing.
            // A fallback under /tmp is shared with every user: it must be this user's, private.
            use std::os::unix::fs::DirBuilderExt;
            let fallbacks = session::fallback_roots().into_iter().filter(|root| {
                std::fs::DirBuilder::new().mode(0o700).recursive(true).create(root).is_ok()
                    && session::check_ownership(root).is_ok()
            });
            let made = session::sessions_root()
                .into_iter()
                .chain(fallbacks)
                .map(|root| root.join(&id))
                .find(|dir| session::ensure_layout(dir, &header).is_ok());
            let Some(dir) = made else { return disabled };
            made_id = Some(id);
            dir
        }
    };
    let session_id = match &made_id {
        Some(id) => Some(id.as_bytes().to_vec()),
        None => lookup(&vars, ENV_SESSION_ID).filter(|v| !v.is_empty()).map(<[u8]>::to_vec),
    };
    if in_constructor {
        // SAFETY: this runs in the shim's constructor, before the program's main and its
        // threads: nothing else reads or writes the environment concurrently.
        unsafe { std::env::set_var(ENV_DIR, &dir) };
        if let Some(id) = &made_id {
            // SAFETY: as above.
            unsafe { std::env::set_var(ENV_SESSION_ID, id) };
        }
    }
    // The value the process started with (empty, or relative) is replaced, not kept beside it.
    let mut exec_env: Vec<Vec<u8>> = vars
        .into_iter()
        .filter(|v| env_value(v, ENV_DIR.as_bytes()).is_none())
        .filter(|v| made_id.is_none() || env_value(v, ENV_SESSION_ID.as_bytes()).is_none())
        .collect();
    exec_env.push([ENV_DIR.as_bytes(), b"=", dir.as_os_str().as_bytes()].concat());
    if let Some(id) = &made_id {
        exec_env.push([ENV_SESSION_ID.as_bytes(), b"=", id.as_bytes()].concat());
    }
    Config {
        enabled: true,
        session_dir: dir.as_os_str().as_bytes().to_vec(),
        settings,
        shim_path,
        exec_env,
        test_fault,
        supervised: supervised(),
        session_id,
    }
}

/// Whether a supervisor watches this process: the session's marker came with the environment
/// and the process runs under a seccomp filter (filters are inherited and cannot be removed,
/// so a process that has the marker but no filter left the supervised tree some other way).
fn supervised() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointer and changes nothing.
    crate::kernel::mark() != 0 && unsafe { libc::prctl(libc::PR_GET_SECCOMP) } == 2
}

/// The pid that owns the store's descriptors: set when the store is opened and in every forked
/// child (`pthread_atfork`). A `vfork` child shares the store's memory but not its descriptor
/// table, and has another pid: it never replaces a descriptor, it opens a one-shot one.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
/// The owning process's parent, cached with OWNER_PID for records.
static OWNER_PPID: AtomicU32 = AtomicU32::new(0);

/// Records that this process owns the store's descriptors and caches its ids. Called only
/// where no memory is shared with another process: in the constructor (a fresh image) and in
/// the `pthread_atfork` child handler (a real fork). Never from a hook, which may run in a
/// `vfork` child sharing its parent's memory.
pub fn adopt_store_after_fork() {
    OWNER_PID.store(rustix::process::getpid().as_raw_nonzero().get() as u32, Ordering::Relaxed);
    OWNER_PPID.store(rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32), Ordering::Relaxed);
}

/// Whether this process owns the memory it runs in: false in a `vfork` child (which shares its
/// parent's memory but has a descriptor table of its own), and where no constructor ran. One
/// `getpid` system call.
pub fn owns_memory() -> bool {
    let owner = OWNER_PID.load(Ordering::Relaxed);
    owner != 0 && owner == rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// A descriptor of the store (the journal, or `blobs/`) that the program may close or reuse
/// behind our back: a `close_range`/`closefrom` sweep, a `dup2` onto its number, Python's
/// subprocess closing everything before `execve`. Its identity is checked before every use.
pub struct StoreFd {
    num: AtomicI32,
    dev: u64,
    ino: u64,
    /// The owner of the file when it was opened.
    uid: u32,
    path: std::path::PathBuf,
    flags: OFlags,
}

impl StoreFd {
    fn open(path: std::path::PathBuf, flags: OFlags) -> Option<StoreFd> {
        let fd = to_high_fd(
            crate::kernel::open(rustix::fs::CWD, path.as_os_str().as_bytes(), flags | OFlags::CLOEXEC, Mode::empty())
                .ok()?,
        );
        let st = rustix::fs::fstat(&fd).ok()?;
        Some(StoreFd {
            num: AtomicI32::new(fd.into_raw_fd()),
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            path,
            flags,
        })
    }

    /// Runs `f` with a descriptor that is really this store file.
    pub fn with<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        let n = self.num.load(Ordering::Acquire);
        // SAFETY: only used for the fstat below, which tolerates a closed or reused number.
        let probe = unsafe { BorrowedFd::borrow_raw(n) };
        if rustix::fs::fstat(probe).is_ok_and(|st| st.st_dev == self.dev && st.st_ino == self.ino) {
            return Some(f(probe));
        }
        // Closed or taken over by the program. Never close the number: it may be the
        // program's now.
        let fresh = crate::kernel::open(
            rustix::fs::CWD,
            self.path.as_os_str().as_bytes(),
            self.flags | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let st = rustix::fs::fstat(&fresh).ok()?;
        if st.st_dev != self.dev || st.st_ino != self.ino {
            return None; // the store itself was replaced
        }
        let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
        if me == OWNER_PID.load(Ordering::Relaxed) {
            let fresh = to_high_fd(fresh);
            let r = f(fresh.as_fd());
            self.num.store(fresh.into_raw_fd(), Ordering::Release);
            Some(r)
        } else {
            // A vfork child (or a clone without fork handlers): use it once, publish nothing.
            Some(f(fresh.as_fd()))
        }
    }
}

/// An open session store: what every record and capture goes through.
pub struct Store {
    /// Canonical session directory (never journaled).
    pub session_canon: Vec<u8>,
    /// The journal (append-only), on a high descriptor.
    pub journal: StoreFd,
    /// `blobs/`, on a high descriptor.
    pub blobs: StoreFd,
    /// Shared ids and accounting.
    pub counters: SharedCounters,
    /// `/proc/self/exe` of this process image.
    pub prog: BPath,
    /// The same, encoded as JSON once for every record.
    prog_json: Vec<u8>,
    /// Budgets, policy, sync.
    pub settings: Settings,
    /// The uid that owns the session store: only it (and root) can write there.
    pub owner_uid: u32,
    /// The shared capture index, mapped on first use (most processes never copy a file).
    index: LazyIndex,
    /// The shared table of files the session created or copied whole, mapped on first use.
    born: LazyIndex,
}

/// A shared table of the session, mapped on first use, lock-free (the loser of a race leaks
/// its mapping, never unmapped).
pub struct LazyIndex {
    ptr: AtomicPtr<SharedIndex>,
    path: std::path::PathBuf,
    map: fn(&std::path::Path) -> Option<SharedIndex>,
}

impl LazyIndex {
    fn new(path: std::path::PathBuf, map: fn(&std::path::Path) -> Option<SharedIndex>) -> LazyIndex {
        LazyIndex { ptr: AtomicPtr::new(std::ptr::null_mut()), path, map }
    }

    /// The table if this process has already mapped it: lock-free and without a system call,
    /// for work done outside the guard.
    pub fn mapped(&self) -> Option<&SharedIndex> {
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here is a leaked Box that is never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The table, mapped now if it was not; `None` if it cannot be.
    pub fn get(&self) -> Option<&SharedIndex> {
        if let Some(mapped) = self.mapped() {
            return Some(mapped);
        }
        let fresh = crate::alloc::permanent(|| (self.map)(&self.path).map(|i| Box::into_raw(Box::new(i))))?;
        match self.ptr.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: we just stored `fresh`, a leaked Box that is never freed.
            Ok(_) => Some(unsafe { &*fresh }),
            // SAFETY: the winner's pointer is a leaked Box that is never freed.
            Err(winner) => Some(unsafe { &*winner }),
        }
    }
}

impl Store {
    /// The session's table of born and kept files, mapped on first use; `None` if it cannot be.
    pub fn born(&self) -> Option<&SharedIndex> {
        self.born.get()
    }

    /// The born table if this process has already mapped it (lock-free, no system call).
    pub fn born_mapped(&self) -> Option<&SharedIndex> {
        self.born.mapped()
    }
}

static STORE: AtomicPtr<Store> = AtomicPtr::new(std::ptr::null_mut());

/// Moves a descriptor above the range programs normally use, close-on-exec, so that it never
/// takes a number the program expects to get from `open`.
fn to_high_fd(fd: OwnedFd) -> OwnedFd {
    // Worked out once per process image; asked again if the program lowered its limit below it.
    static MIN: AtomicI32 = AtomicI32::new(0);
    let limit_based = || {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1024);
        let min = if soft > 2048 { 1000 } else { (soft / 2).max(10) as i32 };
        MIN.store(min, Ordering::Relaxed);
        min
    };
    let cached = MIN.load(Ordering::Relaxed);
    let min = if cached == 0 { limit_based() } else { cached };
    match rustix::io::fcntl_dupfd_cloexec(&fd, min as _) {
        Ok(high) => high,
        Err(_) if cached != 0 => rustix::io::fcntl_dupfd_cloexec(&fd, limit_based() as _).unwrap_or(fd),
        Err(_) => fd,
    }
}

fn open_store(cfg: &Config) -> Option<Store> {
    let dir = Path::new(OsStr::from_bytes(&cfg.session_dir));
    match std::fs::read(dir.join(session::HEADER_FILE)) {
        Ok(header) => {
            // Another session at this session's directory: not this process's to write to.
            if let Some(id) = &cfg.session_id {
                let quoted = [b"\"".as_slice(), id, b"\""].concat();
                if !header.windows(quoted.len()).any(|w| w == quoted.as_slice()) {
                    return None;
                }
            }
        }
        Err(_) => {
            let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let cwd = journal_core::resolve::getcwd().unwrap_or_default();
            let mut header = session::Header::new(id, cmdline(), BPath::new(cwd), "shim");
            header.coverage = Some(session::Coverage::libc(session::CoverageReason::PreloadOnly));
            if let Some(expected) = &cfg.session_id {
                // This process's session was made before it and is gone now: made again, and
                // said, so that no undo of what is journaled from here on claims it is all.
                header.id = String::from_utf8_lossy(expected).into_owned();
                header.cut_off = Some(format!(
                    "the store vanished while the session ran; made again at {} by process {} ({})",
                    session::now_rfc3339_seconds(),
                    rustix::process::getpid().as_raw_nonzero(),
                    String::from_utf8_lossy(&cmdline().first().map(|a| a.as_bytes().to_vec()).unwrap_or_default())
                ));
            }
            session::ensure_layout(dir, &header).ok()?;
        }
    }
    let counters = SharedCounters::open(&dir.join(COUNTERS_FILE))?;
    let journal = StoreFd::open(dir.join(session::JOURNAL_FILE), OFlags::WRONLY | OFlags::APPEND)?;
    let blobs = StoreFd::open(dir.join(session::BLOBS_DIR), OFlags::PATH | OFlags::DIRECTORY)?;
    let session_canon = blobs
        .with(|fd| journal_core::resolve::fd_path(fd.as_raw_fd()))
        .and_then(Result::ok)
        .and_then(|p| p.strip_suffix(b"/blobs").map(<[u8]>::to_vec))
        .unwrap_or_else(|| cfg.session_dir.clone());
    let prog =
        rustix::fs::readlink("/proc/self/exe", Vec::new()).map(|p| BPath::new(p.into_bytes())).unwrap_or_default();
    let owner_uid = blobs.uid;
    Some(Store {
        session_canon,
        journal,
        blobs,
        counters,
        prog_json: journal_core::internal::prog_json(&prog),
        prog,
        settings: cfg.settings.clone(),
        owner_uid,
        index: LazyIndex::new(dir.join(session::CAPTURES_FILE), SharedIndex::map),
        born: LazyIndex::new(dir.join(session::BORN_FILE), SharedIndex::map_born),
    })
}

/// After a call that may have changed where a directory path leads: bumps the session's names
/// generation if this process has its store (the call's hook opened it before the call and
/// bumped it then too). Lock-free and errno-neutral: safe after any real call.
pub fn names_changed() {
    let p = STORE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null STORE points to a leaked Box<Store> that is never freed.
        unsafe { &*p }.counters.names_changing();
    }
}

/// The process's store if it is open already (never opens it).
pub fn published_store() -> Option<&'static Store> {
    let p = STORE.load(Ordering::Acquire);
    // SAFETY: a non-null STORE points to a leaked Box<Store> that is never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The process's store, opened on first use. `None` when the shim is disabled or the store
/// cannot be opened.
pub fn store() -> Option<&'static Store> {
    let p = STORE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null STORE points to a leaked Box<Store> that is never freed.
        return Some(unsafe { &*p });
    }
    let cfg = config();
    if !cfg.enabled {
        return None;
    }
    let fresh = crate::alloc::permanent(|| open_store(cfg).map(|s| Box::into_raw(Box::new(s))))?;
    // Lock-free: whoever loses the race frees its own copy (closing its descriptors), so a
    // fork can never catch another thread halfway through a lock.
    match STORE.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: we just stored `fresh`, a leaked Box that is never freed.
        Ok(_) => Some(unsafe { &*fresh }),
        Err(winner) => {
            // SAFETY: `fresh` came from Box::into_raw above and was never shared.
            crate::alloc::permanent(|| drop(unsafe { Box::from_raw(fresh) }));
            // SAFETY: as for the first branch.
            Some(unsafe { &*winner })
        }
    }
}

/// A store for one exec hook: the published one when this process has it, otherwise one
/// opened just for this call and closed again.
///
/// # Rationale
/// Exec hooks may run in a `vfork` child, which shares the parent's memory but not its
/// descriptor table. Publishing a store opened there would leave the parent holding
/// descriptor numbers that do not exist (or belong to something else) in its own table.
pub enum ExecStore {
    /// The process's published store.
    Shared(&'static Store),
    /// Opened for this call only.
    Temporary(Box<Store>),
}

impl std::ops::Deref for ExecStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        match self {
            ExecStore::Shared(s) => s,
            ExecStore::Temporary(s) => s,
        }
    }
}

/// Counts a mutating call that ran without a record because this thread was already inside
/// the shim (a signal handler that interrupted the shim's own bookkeeping): no undo of this
/// session may then claim completeness.
pub fn note_unjournaled() {
    let p = STORE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null STORE points to a leaked Box<Store> that is never freed.
        unsafe { &*p }.counters.add_lost();
    }
}

/// See [`ExecStore`].
pub fn exec_store() -> Option<ExecStore> {
    let p = STORE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null STORE points to a leaked Box<Store> that is never freed.
        return Some(ExecStore::Shared(unsafe { &*p }));
    }
    let cfg = config();
    if !cfg.enabled {
        return None;
    }
    // The ids cached by the constructor (or the fork handler) are this process's own unless
    // this is a vfork child, which shares its parent's memory and so sees the parent's pid
    // there. Only then must the store stay unpublished; anywhere else it is opened once and
    // kept, instead of once per exec (a shell that runs many commands, posix_spawn loops).
    if owns_memory() {
        return store().map(ExecStore::Shared);
    }
    if OWNER_PID.load(Ordering::Relaxed) != 0 {
        // A vfork child of a process that has no store (it only starts commands, as a Python
        // harness does): ask the parent to open one for the children after this one.
        CHILD_OPENED_STORE.store(true, Ordering::Relaxed);
    }
    crate::alloc::persistent(|| open_store(cfg).map(|s| ExecStore::Temporary(Box::new(s))))
}

/// Set by a `vfork` child that had to open a store of its own for its exec record because
/// its parent had none. Each such child opens, maps and reads back the session's files (about
/// 20 system calls, ~100 us of a Python `subprocess.run` of `/bin/true` here, of ~200 the
/// shim adds); a child of a parent with a published store uses that one. The parent opens
/// its store when it next waits for a child, by when the child has exec'd or exited (not at
/// `close`, also called between a vfork and the wait: that hook is W7's hot path).
static CHILD_OPENED_STORE: AtomicBool = AtomicBool::new(false);

/// Called from the `wait` family's hooks: opens and publishes this process's store if a
/// `vfork` child of it had to open one of its own. One relaxed load unless one did.
#[inline(always)]
pub fn open_store_children_need() {
    if CHILD_OPENED_STORE.load(Ordering::Relaxed) {
        open_store_for_children();
    }
}

#[cold]
#[inline(never)]
fn open_store_for_children() {
    // Only the process that owns this memory opens its store here: in a vfork child (which a
    // program might make wait for a child of its own) the request stays for the parent.
    if !owns_memory() {
        return;
    }
    let saved = crate::guard::errno();
    // Busy (a wait in a signal handler that interrupted a hook): the request stays for the
    // next wait.
    if let Some(guard) = crate::guard::Guard::enter() {
        CHILD_OPENED_STORE.store(false, Ordering::Relaxed);
        let _ = std::panic::catch_unwind(|| {
            let _ = store();
        });
        drop(guard);
    }
    crate::guard::set_errno(saved);
}

impl Store {
    /// Appends a record for `op`, made by `call`. A record that cannot be written is counted
    /// as lost, so that no undo of this session can claim completeness.
    pub fn record(&self, call: &str, op: Op) -> u64 {
        let (pid, ppid) = (OWNER_PID.load(Ordering::Relaxed), OWNER_PPID.load(Ordering::Relaxed));
        if pid == 0 {
            // No constructor ran (the library was loaded some other way): ask the kernel.
            return self.record_fresh(call, op);
        }
        self.record_as(call, op, pid, ppid)
    }

    /// [`Store::record`] with the process ids asked of the kernel: for exec hooks, which may
    /// run in a vfork child (whose memory, cached ids included, is its parent's).
    pub fn record_fresh(&self, call: &str, op: Op) -> u64 {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        // The cached parent is right whenever the cached pid is (not a vfork child).
        let ppid = if pid == OWNER_PID.load(Ordering::Relaxed) {
            OWNER_PPID.load(Ordering::Relaxed)
        } else {
            rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
        };
        self.record_as(call, op, pid, ppid)
    }

    fn record_as(&self, call: &str, op: Op, pid: u32, ppid: u32) -> u64 {
        let seq = self.counters.next_id();
        let env = Envelope { seq, time: std::time::SystemTime::now(), pid, ppid, prog_json: &self.prog_json, call };
        let line = journal_core::internal::encode_fields(&env, &op);
        if !self.settings.sync && crate::segment::append(&self.session_canon, seq, &line) {
            return seq;
        }
        let written = self.journal.with(|fd| {
            let ok = journal_core::capture::write_all(fd, &line).is_ok();
            if ok && self.settings.sync {
                let _ = rustix::fs::fsync(fd);
            }
            ok
        });
        if written != Some(true) {
            self.counters.add_lost();
        } else if self.settings.sync {
            let _ = self.blobs.with(|fd| rustix::fs::fsync(fd));
        }
        seq
    }
}

impl Store {
    /// Appends a mark (`aether-journal mark` run by a process of the session: see
    /// `aether_journal_recorder::marks`) to the marks segment, with a single write, and counts
    /// it. The caller holds the marks file's lock.
    pub fn append_mark(&self, op: Op) -> Result<u64, rustix::io::Errno> {
        use rustix::fs::{Mode, OFlags};
        let seq = self.counters.next_id();
        let (pid, ppid) = match OWNER_PID.load(Ordering::Relaxed) {
            0 => (
                rustix::process::getpid().as_raw_nonzero().get() as u32,
                rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32),
            ),
            pid => (pid, OWNER_PPID.load(Ordering::Relaxed)),
        };
        let env =
            Envelope { seq, time: std::time::SystemTime::now(), pid, ppid, prog_json: &self.prog_json, call: "mark" };
        let line = journal_core::internal::encode_fields(&env, &op);
        let mut path = self.session_canon.clone();
        path.extend_from_slice(b"/");
        path.extend_from_slice(session::SEGMENTS_DIR.as_bytes());
        path.extend_from_slice(b"/");
        path.extend_from_slice(journal_core::marks::MARKS_SEGMENT.as_bytes());
        let fd = crate::kernel::open(
            rustix::fs::CWD,
            &path,
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        journal_core::capture::write_all(&fd, &line)
            .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO))?;
        self.counters.note_mark(seq);
        Ok(seq)
    }
}

impl aether_journal_recorder::ops::Journal for Store {
    fn record(&self, call: &str, op: Op) -> u64 {
        Store::record(self, call, op)
    }
    fn with_blobs<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        self.blobs.with(f)
    }
    fn counters(&self) -> &SharedCounters {
        &self.counters
    }
    fn index(&self) -> Option<&SharedIndex> {
        self.index.get()
    }
    fn born(&self) -> Option<&SharedIndex> {
        self.born.get()
    }
    fn born_mapped(&self) -> Option<&SharedIndex> {
        self.born.mapped()
    }
    fn settings(&self) -> &Settings {
        &self.settings
    }
    fn session_canon(&self) -> &[u8] {
        &self.session_canon
    }
    fn calls(&self) -> &dyn journal_core::capture::FsCalls {
        &crate::kernel::Marked
    }
    fn session_dir(&self) -> &[u8] {
        &config().session_dir
    }
    fn root_pid(&self) -> Option<u32> {
        root_pid()
    }
}

/// The session's root process (from its header), read once.
fn root_pid() -> Option<u32> {
    static ROOT: AtomicU32 = AtomicU32::new(0);
    match ROOT.load(Ordering::Relaxed) {
        0 => {}
        u32::MAX => return None,
        pid => return Some(pid),
    }
    let dir = std::path::Path::new(OsStr::from_bytes(&config().session_dir));
    let pid = std::fs::read(dir.join(session::HEADER_FILE))
        .ok()
        .and_then(|t| aether_journal_recorder::effects::serde_json_root_pid(&t))
        .unwrap_or(u32::MAX);
    ROOT.store(pid, Ordering::Relaxed);
    (pid != u32::MAX).then_some(pid)
}

/// Collects a C `argv` into paths (used by the constructor).
///
/// # Safety
/// `argv` must be null or point to `argc` valid NUL-terminated strings.
pub unsafe fn collect_argv(argc: i32, argv: *const *const c_char) -> Vec<BPath> {
    if argv.is_null() {
        return Vec::new();
    }
    (0..argc.max(0) as usize)
        .filter_map(|i| {
            // SAFETY: i < argc and argv has argc entries (caller's obligation).
            let p = unsafe { *argv.add(i) };
            // SAFETY: each non-null entry is a NUL-terminated string (caller's obligation).
            (!p.is_null()).then(|| BPath::from(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes()))
        })
        .collect()
}
