//! The shim's configuration: built once per process image, from the `AETHER_*` variables the
//! image started with (see [`super::env`]), in the constructor for a session's first process
//! and on first use everywhere else.
//!
//! What this cannot do: configure a session when its directory cannot be created; the shim is
//! then disabled for the process, and its calls run unjournaled (the `run` CLI checks the shim
//! really loaded before it starts the command).

use super::env::{capture_early_env, early_entries, early_env, env_value, lookup};
use crate::once::Leaked;
use journal_core::BPath;
use journal_core::config::{ENV_DIR, ENV_SESSION_ID, ENV_SWITCH, ENV_TEST_FAULT, Settings};
use journal_core::session::{self};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

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

/// The configuration, published once and never freed.
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static CONFIG: Leaked<Config> = Leaked::new();

/// The configuration, built on first use from the environment the image started with.
pub fn config() -> &'static Config {
    // Everything in it outlives the hook that builds it, which may be a signal handler: the
    // permanent region, not the arena or malloc.
    CONFIG.get_or_init(|| read_config(None))
}

/// Called from the constructor, with the program's arguments, when
/// [`configure_in_constructor`] says so (before `main` and its threads: nothing races it).
pub fn init_from_ctor(argv: Vec<BPath>) {
    if CONFIG.get().is_none() {
        CONFIG.publish(read_config(Some(argv)));
    }
}

pub(super) fn cmdline() -> Vec<BPath> {
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
                .find(|dir| session::ensure_layout(dir, &header, session::Durability::of(&settings)).is_ok());
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
    // SAFETY: PR_GET_SECCOMP takes no pointer and changes nothing. A raw call, unmarked (the
    // filter does not watch prctl): libc's prctl would be one more import the loader looks
    // up in every process.
    crate::kernel::mark() != 0
        && unsafe { crate::kernel::raw(libc::SYS_prctl, [libc::PR_GET_SECCOMP as usize, 0, 0, 0, 0], 0) } == 2
}
