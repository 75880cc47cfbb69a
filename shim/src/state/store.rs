//! The per-process handle on the session store: opened at the first change, inherited across
//! `fork`, kept on high descriptors whose identity is checked before each use, and what every
//! record goes through.
//!
//! What this cannot do: journal anything when the session directory cannot be opened at all.
//! Hooked calls then run unjournaled; the `lost` counter in the session's shared counters
//! records every record that could not be written once the store was open.

use super::config::{Config, cmdline, config};
use super::identity::{OWNER_PID, OWNER_PPID, owns_memory, root_pid};
use crate::once::Leaked;
use aether_journal_recorder::index::SharedIndex;
use aether_journal_recorder::tables::SharedCounters;
use journal_core::BPath;
use journal_core::capture::Counters;
use journal_core::config::Settings;
use journal_core::internal::{Envelope, ExecParts, encode_exec_fields};
use journal_core::record::Op;
use journal_core::session::StoreStat;
use journal_core::session::{self, COUNTERS_FILE};
use rustix::fs::{Mode, OFlags};
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

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
        let fd = open_following(&path, flags).ok()?;
        StoreFd::adopt(fd, path, flags)
    }

    /// Keeps `fd`, just opened from `path` with `flags`, on a high descriptor.
    fn adopt(fd: OwnedFd, path: std::path::PathBuf, flags: OFlags) -> Option<StoreFd> {
        let fd = to_high_fd(fd);
        let st = StoreStat::of_fd(&fd).ok()?;
        Some(StoreFd { num: AtomicI32::new(fd.into_raw_fd()), dev: st.dev, ino: st.ino, uid: st.uid, path, flags })
    }

    /// Runs `f` with a descriptor that is really this store file. Asked without the file's
    /// times ([`StoreStat`]): an `fstat` before every record made each record's write stamp
    /// the journal with a fine-grained time, a transaction of ext4's journal each.
    pub fn with<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        let n = self.num.load(Ordering::Acquire);
        // SAFETY: only used for the stat below, which tolerates a closed or reused number.
        let probe = unsafe { BorrowedFd::borrow_raw(n) };
        if StoreStat::of_fd(probe).is_ok_and(|st| st.id() == self.id()) {
            return Some(f(probe));
        }
        // Closed or taken over by the program. Never close the number: it may be the
        // program's now.
        let fresh = open_following(&self.path, self.flags).ok()?;
        if StoreStat::of_fd(&fresh).ok()?.id() != self.id() {
            return None; // the store itself was replaced
        }
        let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
        if me == OWNER_PID.load(Ordering::Relaxed) {
            let fresh = to_high_fd(fresh);
            let r = f(fresh.as_fd());
            self.num.store(fresh.into_raw_fd(), Ordering::Release);
            Some(r)
        } else {
            // A vfork child (or a raw clone, which no fork hook saw): use it once, publish nothing.
            Some(f(fresh.as_fd()))
        }
    }

    /// The file's device and inode, as opened.
    fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// `blobs/`, opened at the first capture: most processes (a shell's children that only exec,
/// a compiler that only creates files) never copy a file, and spare the four system calls.
///
/// What this cannot do: tell that `blobs/` was replaced while this process had it open (the
/// store's descriptors are checked against what they were when opened, as for the journal).
pub struct LazyBlobs {
    fd: Leaked<StoreFd>,
    path: std::path::PathBuf,
    /// The journal was reached without a symlink from an absolute, plain name: `blobs/` is
    /// opened the same way.
    plainly: bool,
    /// The journal this process opened (device, inode).
    journal: (u64, u64),
}

const BLOBS_FLAGS: OFlags = OFlags::PATH.union(OFlags::DIRECTORY);

impl LazyBlobs {
    /// Runs `f` with a descriptor of this session's `blobs/`, opened now if this process had
    /// not yet. A `vfork` child (which shares its parent's memory but not its descriptors)
    /// opens one for this call only and publishes nothing.
    pub fn with<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        if let Some(blobs) = self.fd.get() {
            return blobs.with(f);
        }
        let fresh = self.open()?;
        if !owns_memory() {
            return Some(f(fresh.as_fd()));
        }
        // Built in permanent memory, as `publish` keeps it: its path is kept for good, and in
        // the hook's arena one live block would keep the arena from ever starting over again
        // (every later hook's allocations on fresh pages: 3 KiB more memory a capture).
        let mine = crate::alloc::permanent(|| StoreFd::adopt(fresh, self.path.clone(), BLOBS_FLAGS))?;
        let my_num = mine.num.load(Ordering::Relaxed);
        let published = self.fd.publish(mine);
        if published.num.load(Ordering::Relaxed) == my_num {
            // SAFETY: `my_num` was opened above by this thread, checked by `adopt`, and stays
            // open for the call (nothing of ours closes it).
            return Some(f(unsafe { BorrowedFd::borrow_raw(my_num) }));
        }
        // Another thread published its own first: close ours (never the winner's).
        // SAFETY: `my_num` was opened above by this thread and never handed out.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(my_num) });
        published.with(f)
    }

    /// Runs `f` with `blobs/` only if this process has opened it already (it has written no
    /// blob otherwise).
    pub fn with_if_open<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        self.fd.get()?.with(f)
    }

    /// Opens `blobs/` if it sits beside this process's journal. A session deleted and made again
    /// at the same directory has blobs of its own, whose names this process's counters (the
    /// old session's) do not hand out: a capture there could overwrite one of them.
    fn open(&self) -> Option<OwnedFd> {
        let fd = if self.plainly {
            crate::kernel::open_no_symlinks(self.path.as_os_str().as_bytes(), BLOBS_FLAGS | OFlags::CLOEXEC)
        } else {
            open_following(&self.path, BLOBS_FLAGS)
        }
        .ok()?;
        let beside = ["../", session::JOURNAL_FILE].concat();
        (StoreStat::of_name(&fd, &beside).ok()?.id() == self.journal).then_some(fd)
    }
}

/// Opens a file of the store by `path` with `flags`, close-on-exec, following symlinks (marked).
fn open_following(path: &Path, flags: OFlags) -> Result<OwnedFd, rustix::io::Errno> {
    crate::kernel::open(rustix::fs::CWD, path.as_os_str().as_bytes(), flags | OFlags::CLOEXEC, Mode::empty())
}

/// An open session store: what every record and capture goes through.
pub struct Store {
    /// Canonical session directory (never journaled).
    pub session_canon: Vec<u8>,
    /// The journal (append-only), on a high descriptor.
    pub journal: StoreFd,
    /// `blobs/`, on a high descriptor once this process first captures.
    pub blobs: LazyBlobs,
    /// Shared ids and accounting.
    pub counters: SharedCounters,
    /// The program this process image runs ([`own_program`]).
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

/// A shared table of the session: inside the counters' mapping (a session made with its tables
/// in the counters file), or else mapped from a file of its own on first use, lock-free (the
/// loser of a race leaks its mapping, never unmapped).
pub struct LazyIndex {
    /// The table inside the counters' mapping, which the store holding both never unmaps
    /// before it.
    within: Option<SharedIndex>,
    index: Leaked<SharedIndex>,
    path: std::path::PathBuf,
    map: fn(&std::path::Path) -> Option<SharedIndex>,
}

impl LazyIndex {
    fn new(
        within: Option<SharedIndex>,
        path: std::path::PathBuf,
        map: fn(&std::path::Path) -> Option<SharedIndex>,
    ) -> LazyIndex {
        LazyIndex { within, index: Leaked::new(), path, map }
    }

    /// The table if this process has already mapped it: lock-free and without a system call,
    /// for work done outside the guard.
    pub fn mapped(&self) -> Option<&SharedIndex> {
        self.within.as_ref().or_else(|| self.index.get())
    }

    /// The table, mapped now if it was not; `None` if it cannot be.
    pub fn get(&self) -> Option<&SharedIndex> {
        self.within.as_ref().or_else(|| self.index.get_or_try_init(|| (self.map)(&self.path)))
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

/// The process's store, published once (see [`Leaked`]: whoever loses a race to open it closes
/// its own descriptors, so a fork can never catch another thread halfway through a lock).
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
static STORE: Leaked<Store> = Leaked::new();

/// Moves a descriptor above the range programs normally use, close-on-exec, so that it never
/// takes a number the program expects to get from `open`.
fn to_high_fd(fd: OwnedFd) -> OwnedFd {
    // Worked out once per process image; asked again if the program lowered its limit below it.
    #[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
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
    let counters_path = dir.join(COUNTERS_FILE);
    // Tagged with this process's session: its header exists and is that session's.
    let counters = match SharedCounters::open_tagged(&counters_path, cfg.session_id.as_deref()) {
        Some(c) => c,
        None => {
            header_checked(cfg, dir)?;
            SharedCounters::open(&counters_path)?
        }
    };
    let journal_path = dir.join(session::JOURNAL_FILE);
    let journal_flags = OFlags::WRONLY | OFlags::APPEND;
    // A directory named absolutely and plainly, reached without a symlink, is named
    // canonically already: no need to ask the kernel for the name through /proc/self/fd,
    // which a fresh process pays about 25 us for here (most of opening its store).
    let reached_plainly = plain_absolute(&cfg.session_dir)
        .then(|| {
            crate::kernel::open_no_symlinks(journal_path.as_os_str().as_bytes(), journal_flags | OFlags::CLOEXEC).ok()
        })
        .flatten();
    let plainly = reached_plainly.is_some();
    let (journal, session_canon) = match reached_plainly {
        Some(fd) => (StoreFd::adopt(fd, journal_path, journal_flags)?, cfg.session_dir.clone()),
        None => {
            let journal = StoreFd::open(journal_path, journal_flags)?;
            let canon = journal
                .with(|fd| journal_core::resolve::fd_path(fd.as_raw_fd()))
                .and_then(Result::ok)
                .and_then(|p| p.strip_suffix(session::JOURNAL_FILE.as_bytes())?.strip_suffix(b"/").map(<[u8]>::to_vec))
                .unwrap_or_else(|| cfg.session_dir.clone());
            (journal, canon)
        }
    };
    let blobs = LazyBlobs { fd: Leaked::new(), path: dir.join(session::BLOBS_DIR), plainly, journal: journal.id() };
    // SAFETY: the tables point into the counters' mapping, which the Store holds beside them
    // and never unmaps while they can be used (a published Store is never dropped; one that
    // lost the race to be published is dropped whole, its tables with it).
    let (captures, born) = unsafe { (counters.captures(), counters.born()) };
    let prog = own_program();
    let owner_uid = journal.uid;
    Some(Store {
        session_canon,
        journal,
        blobs,
        counters,
        prog_json: journal_core::internal::prog_json(&prog),
        prog,
        settings: cfg.settings.clone(),
        owner_uid,
        index: LazyIndex::new(captures, dir.join(session::CAPTURES_FILE), SharedIndex::map),
        born: LazyIndex::new(born, dir.join(session::BORN_FILE), SharedIndex::map_born),
    })
}

/// Reads the session's header at `dir`: `Some` if it is this process's session's (or, when no
/// id is expected, any session's); the layout made if the header is missing (said in it when
/// the session was expected to exist already); `None` if the directory holds another session,
/// or cannot be made one.
fn header_checked(cfg: &Config, dir: &Path) -> Option<()> {
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
            session::ensure_layout(dir, &header, session::Durability::of(&cfg.settings)).ok()?;
        }
    }
    Some(())
}

/// The program this process image runs, for every record it writes: the kernel's name for
/// its executable (`/proc/self/exe`), or, where that name is known to be the same without
/// asking `/proc` ([`program_by_exec_name`]), the name it was executed by. A fresh process's
/// first `/proc/self` lookup costs it about 10 us here, once per store it opens.
fn own_program() -> BPath {
    program_by_exec_name().unwrap_or_else(|| {
        rustix::fs::readlink("/proc/self/exe", Vec::new()).map(|p| BPath::new(p.into_bytes())).unwrap_or_default()
    })
}

/// The name this image was executed by (`AT_EXECFN`), when it is the name the kernel gives
/// the executable: absolute and plain, reached without a symlink anywhere (which is how the
/// kernel names a file), and naming an ELF file (a script's executable is its interpreter, so
/// a script's name is never taken). `None` otherwise, and where `openat2` is missing.
///
/// What this cannot tell: a program replaced under the same name between its exec and this
/// call, which `/proc/self/exe` would name with " (deleted)" after it; the name is kept then
/// (it is what ran, by the name it ran by). Records name their program for people and
/// reports; nothing an undo restores depends on it.
fn program_by_exec_name() -> Option<BPath> {
    // SAFETY: AT_EXECFN is a NUL-terminated string the kernel placed on the initial stack,
    // which stays mapped as long as the process image; getauxval returns 0 when it is
    // missing. A program may rewrite it (as setproctitle rewrites argv): the name is then
    // taken only if it still opens, plainly, as an ELF file, and the kernel's zeroed end of the
    // stack above it ends the string at the latest.
    let ptr = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const std::ffi::c_char;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null: the string above.
    let name = unsafe { std::ffi::CStr::from_ptr(ptr) }.to_bytes();
    if !plain_absolute(name) {
        return None;
    }
    let fd =
        crate::kernel::open_no_symlinks(name, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK)
            .ok()?;
    let mut magic = [0u8; 4];
    let read = rustix::io::read(&fd, &mut magic).ok()?;
    (read == magic.len() && magic == *b"\x7fELF").then(|| BPath::new(name.to_vec()))
}

/// Whether `path` is absolute and plain ([`journal_core::bpath::is_plain`]): the form the kernel
/// gives a file's or directory's name in, if no symlink leads through it (the store's
/// directory, the program's executable).
fn plain_absolute(path: &[u8]) -> bool {
    path.first() == Some(&b'/') && journal_core::bpath::is_plain(path)
}

/// After a call that may have changed where a directory path leads: counts the change the
/// call's hook announced before it (the session's names generation) done, if this process has
/// its store (the hook opened it to announce it). Lock-free and errno-neutral: safe after any
/// real call.
pub fn names_changed() {
    if let Some(store) = STORE.get() {
        store.counters.names_changed();
    }
}

/// Before a `chdir` or `fchdir` the shim makes itself, marked, under a supervisor (which the
/// call then does not reach): moves the session's working-directory generation, which tells
/// the supervisor what the call would have (see the supervisor's `dirs.rs`). Opens this
/// process's store for it if need be; only the process that owns this memory does (a vfork
/// child uses its parent's store, if that has one). Under the guard and `catch_unwind`, with
/// errno preserved. `false`: not moved (no store, a panic, this thread inside the shim
/// already), and the call must be made unmarked.
pub fn cwd_changing() -> bool {
    if let Some(store) = STORE.get() {
        store.counters.cwd_changing();
        return true;
    }
    let mut moved = false;
    outside_a_hook(|| moved = store().map(|s| s.counters.cwd_changing()).is_some());
    moved
}

/// After a call [`cwd_changing`] moved the generation for: counts it done (it has run).
/// Lock-free and errno-neutral.
pub fn cwd_changed() {
    if let Some(store) = STORE.get() {
        store.counters.cwd_changed();
    }
}

/// The process's store if it is open already (never opens it).
pub fn published_store() -> Option<&'static Store> {
    STORE.get()
}

/// The process's store, opened on first use. `None` when the shim is disabled or the store
/// cannot be opened.
pub fn store() -> Option<&'static Store> {
    if let Some(store) = STORE.get() {
        return Some(store);
    }
    let cfg = config();
    if !cfg.enabled {
        return None;
    }
    STORE.get_or_try_init(|| open_store(cfg))
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
    if let Some(store) = STORE.get() {
        store.counters.add_lost();
    }
}

/// See [`ExecStore`].
pub fn exec_store() -> Option<ExecStore> {
    if let Some(store) = STORE.get() {
        return Some(ExecStore::Shared(store));
    }
    let cfg = config();
    if !cfg.enabled {
        return None;
    }
    // The ids cached by the constructor (or a fork hook) are this process's own unless
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
#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
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
    // Busy (a wait in a signal handler that interrupted a hook): the request stays for the
    // next wait.
    publish_store_outside_a_hook(|| CHILD_OPENED_STORE.store(false, Ordering::Relaxed));
}

/// Opens and publishes this process's store from outside a hook (a wait, a fork), under the
/// guard and `catch_unwind`, with errno preserved, after `entered` once the guard is held.
/// Only the process that owns this memory does: in a vfork child (which a program might make
/// wait for or fork a child of its own) nothing is opened. Nothing either while this thread is
/// inside the shim already.
fn publish_store_outside_a_hook(entered: impl FnOnce()) {
    outside_a_hook(|| {
        entered();
        let _ = store();
    });
}

/// Runs `f` from outside a hook (a wait, a fork's preparation, a `chdir` before its hook's
/// real call) under the guard and `catch_unwind`, with errno preserved. Only in the process
/// that owns this memory (not in a vfork child), and not while this thread is inside the shim
/// already.
pub fn outside_a_hook(f: impl FnOnce()) {
    if !owns_memory() {
        return;
    }
    let saved = crate::guard::errno();
    if let Some(guard) = crate::guard::Guard::enter() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        drop(guard);
    }
    crate::guard::set_errno(saved);
}

/// Called before every `fork` (the fork hooks' preparation): opens and publishes this
/// process's store if it has none yet, so that the child inherits it. A forked child usually
/// execs and journals its exec, which without a store of its parent's costs it a store of its
/// own (about 25 system calls): a shell running a list of commands opens one store instead of
/// one per command. A process that forks pays for the store once, whether its children need it
/// or not. Nothing is opened in a `vfork` child, or while this thread is inside the shim.
pub fn open_store_before_fork() {
    if STORE.get().is_none() {
        publish_store_outside_a_hook(|| {});
    }
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
        let (pid, ppid) = fresh_ids();
        self.record_as(call, op, pid, ppid)
    }

    /// [`Store::record_fresh`] of an exec given by its parts: the same line, without building
    /// the owned record (an allocation for each part, one for the arguments together, and
    /// their copies).
    pub fn record_exec_fresh<'a>(&self, call: &str, exec: ExecParts<'_, impl Iterator<Item = &'a [u8]>>) -> u64 {
        let (pid, ppid) = fresh_ids();
        self.record_with(call, pid, ppid, |env| encode_exec_fields(env, exec))
    }

    fn record_as(&self, call: &str, op: Op, pid: u32, ppid: u32) -> u64 {
        self.record_with(call, pid, ppid, |env| journal_core::internal::encode_fields(env, &op))
    }

    /// Takes the next id, and appends the line `encode` makes of the envelope.
    fn record_with(&self, call: &str, pid: u32, ppid: u32, encode: impl FnOnce(&Envelope<'_>) -> Vec<u8>) -> u64 {
        let seq = self.counters.next_id();
        let env = Envelope { seq, time: crate::kernel::wall_clock(), pid, ppid, prog_json: &self.prog_json, call };
        self.append_line(seq, &encode(&env));
        seq
    }

    /// Appends record `seq`'s encoded line: to this process's segment, else to the journal
    /// file; one that cannot be written is counted as lost.
    fn append_line(&self, seq: u64, line: &[u8]) {
        if !self.settings.sync && crate::segment::append(&self.session_canon, seq, line) {
            return;
        }
        let written = self.journal.with(|fd| {
            let ok = journal_core::capture::write_all(fd, line).is_ok();
            if ok && self.settings.sync {
                let _ = rustix::fs::fsync(fd);
            }
            ok
        });
        if written != Some(true) {
            self.counters.add_lost();
        } else if self.settings.sync {
            let _ = self.blobs.with_if_open(|fd| rustix::fs::fsync(fd));
        }
    }
}

/// This process's id and its parent's, asked of the kernel: in a vfork child the cached ones
/// are its parent's. The cached parent is right whenever the cached pid is.
fn fresh_ids() -> (u32, u32) {
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let ppid = if pid == OWNER_PID.load(Ordering::Relaxed) {
        OWNER_PPID.load(Ordering::Relaxed)
    } else {
        rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
    };
    (pid, ppid)
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
            Envelope { seq, time: crate::kernel::wall_clock(), pid, ppid, prog_json: &self.prog_json, call: "mark" };
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

#[cfg(test)]
mod tests {
    use super::plain_absolute;

    #[test]
    fn only_an_absolute_name_without_empty_dot_or_dotdot_components_counts_as_plain() {
        for plain in [&b"/a"[..], b"/home/u/.local/state/aether-journal/s1", b"/a/.b/..c/b..", b"/a/\xff"] {
            assert!(plain_absolute(plain), "{:?}", String::from_utf8_lossy(plain));
        }
        for not in [&b""[..], b"/", b"a/b", b"/a/", b"/a//b", b"/a/./b", b"/a/../b", b"/.", b"/.."] {
            assert!(!plain_absolute(not), "{:?}", String::from_utf8_lossy(not));
        }
    }
}
