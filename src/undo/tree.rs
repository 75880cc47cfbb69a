//! Where an undo's actions look and act: the file system itself, or, for a dry run, the file
//! system as the steps taken so far would have left it.
//!
//! A dry run executes the very same actions as an undo; only the calls that would change
//! something go to [`Sim`], an overlay of names over the real tree, which is then only read. A
//! name the dry run removed is absent from the overlay, a node it moved answers from where it
//! really is, a directory it moved takes its entries along, and a node it made has the type,
//! mode, owner, times, size and content it was given. So the dry run meets the same conflicts,
//! the same "already absent", the same non-empty directories, and reports what the undo would.
//!
//! What it cannot do: foresee what other processes change meanwhile, or a failure only the
//! write itself meets (a full disk, a read-only mount, an `EPERM` from a file system that
//! refuses an owner or an attribute). A node the dry run makes has a made-up identity (no
//! real inode has it), and an append it truncates has content no hash matches.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat, StatxFlags, Timestamps};
use rustix::io::Errno;

use crate::byteset::PathSet;
use crate::capture::hash_fd;

/// A directory an action works in: its path, and, when it really exists, its descriptor
/// (opened without following a symlink). In a dry run it also carries the overlay.
#[derive(Clone)]
pub(super) struct Dir {
    pub(super) path: Rc<[u8]>,
    fd: Option<Rc<OwnedFd>>,
    sim: Option<Rc<Sim>>,
}

/// A node opened for reading or writing contents.
pub(super) enum Handle {
    Fd(OwnedFd),
    /// A node of a dry run, by its path (what the overlay holds for it).
    Sim(Rc<Sim>, Vec<u8>),
}

/// Where the bytes of contents a dry run wrote really are.
#[derive(Clone)]
enum Source {
    /// In the real file at this path.
    Real(Vec<u8>),
    /// Held in memory.
    Held(Rc<[u8]>),
}

thread_local! {
    /// The paths the running undo (or dry run) has put a node at itself: a node there may be
    /// another inode than the one a record names, by this undo's own doing (a copy recreated,
    /// a directory made again). Cleared when an undo starts.
    static MADE_HERE: RefCell<HashSet<Vec<u8>>> = RefCell::new(HashSet::new());
    /// The directories in which the running undo (or dry run) made, removed or renamed an
    /// entry: the kernel moved their times, whatever they read now. Cleared when an undo starts.
    static ENTRIES_CHANGED: RefCell<HashSet<Vec<u8>>> = RefCell::new(HashSet::new());
}

/// Forgets the paths an earlier undo made (see [`made_here`]).
pub(super) fn start_undo() {
    MADE_HERE.with(|m| m.borrow_mut().clear());
    ENTRIES_CHANGED.with(|m| m.borrow_mut().clear());
}

/// Whether the running undo made, removed or renamed an entry of directory `dir`.
pub(super) fn entries_changed_in(dir: &[u8]) -> bool {
    ENTRIES_CHANGED.with(|m| m.borrow().contains(dir))
}

fn note_entries_changed(dir: &[u8]) {
    ENTRIES_CHANGED.with(|m| {
        if !m.borrow().contains(dir) {
            m.borrow_mut().insert(dir.to_vec());
        }
    });
}

/// Whether the running undo has put a node at `path` itself.
pub(super) fn made_here(path: &[u8]) -> bool {
    MADE_HERE.with(|m| m.borrow().contains(path))
}

fn note_made(path: Vec<u8>) {
    let (dir, name) = crate::resolve::split_last(&path);
    if !name.is_empty() {
        note_entries_changed(dir);
    }
    MADE_HERE.with(|m| m.borrow_mut().insert(path));
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    crate::bpath::join(dir, name)
}

fn parent(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&c| c == b'/') {
        Some(0) => b"/",
        Some(i) => &path[..i],
        None => b"",
    }
}

impl Dir {
    /// A real directory, already open.
    pub(super) fn real(path: &[u8], fd: OwnedFd, sim: Option<Rc<Sim>>) -> Dir {
        Dir { path: path.into(), fd: Some(Rc::new(fd)), sim }
    }

    /// Opens the directory at `path` (absolute) without following a symlink on the way, as the
    /// tree is now (in a dry run: as the overlay shows it).
    pub(super) fn open(path: &[u8], sim: Option<&Rc<Sim>>) -> Result<Dir, Errno> {
        let Some(sim) = sim else {
            return Ok(Dir::real(path, super::fs::open_dir_nofollow(path)?, None));
        };
        let fd = match sim.resolve(path)? {
            Where::Real(r) => Some(Rc::new(super::fs::open_dir_nofollow(&r)?)),
            Where::Missing => return Err(Errno::NOENT),
            Where::Node(n) if FileType::from_raw_mode(n.st.st_mode) != FileType::Directory => {
                return Err(if FileType::from_raw_mode(n.st.st_mode) == FileType::Symlink {
                    Errno::LOOP
                } else {
                    Errno::NOTDIR
                });
            }
            Where::Node(n) => match &n.real {
                Some(r) => Some(Rc::new(super::fs::open_dir_nofollow(r)?)),
                None => None,
            },
        };
        Ok(Dir { path: path.into(), fd, sim: Some(sim.clone()) })
    }

    fn fd(&self) -> Result<BorrowedFd<'_>, Errno> {
        self.fd.as_deref().map(|fd| fd.as_fd()).ok_or(Errno::NOENT)
    }

    /// The real directory's descriptor (outside a dry run, always there).
    pub(super) fn borrowed(&self) -> Result<BorrowedFd<'_>, Errno> {
        self.fd()
    }

    pub(super) fn sim(&self) -> Option<&Rc<Sim>> {
        self.sim.as_ref()
    }

    pub(super) fn child(&self, name: &[u8]) -> Vec<u8> {
        join(&self.path, name)
    }

    /// `lstat` of `name`; `None` when nothing is there.
    pub(super) fn lstat(&self, name: &[u8]) -> Result<Option<Stat>, Errno> {
        match &self.sim {
            None => super::fs::lstat(self.fd()?, name),
            Some(sim) => sim.lstat(&self.child(name)),
        }
    }

    /// Removes whatever non-directory or empty directory is at `name` (`st` says which).
    pub(super) fn remove(&self, name: &[u8], st: &Stat) -> Result<(), Errno> {
        note_entries_changed(&self.path);
        let dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        match &self.sim {
            None if dir => {
                // After every removal queued before it (some may be of its entries).
                super::remover::wait();
                super::redo::before_remove(&self.path, self.fd()?, name, st);
                rustix::fs::unlinkat(self.fd()?, name, AtFlags::REMOVEDIR)
            }
            None => {
                if let Some(done) = super::redo::remove_keeping(&self.path, self.fd()?, name, st) {
                    return done;
                }
                super::redo::before_remove(&self.path, self.fd()?, name, st);
                super::remover::unlink(&self.path, self.fd()?, name, None)
            }
            Some(sim) => {
                // `st` is what this directory's `lstat` of `name` gave the caller, after every
                // change the overlay holds: nothing has changed since, so it is not asked again
                // (a dry run of 100,000 removals asked each path three times).
                let p = self.child(name);
                if dir && !sim.entries(&p).is_empty() {
                    return Err(Errno::NOTEMPTY);
                }
                // What the overlay held inside a removed directory went with it.
                sim.move_slots(&p, &p);
                sim.set(&p, Slot::Absent);
                Ok(())
            }
        }
    }

    /// A few of the names in directory `name`, for a message.
    pub(super) fn list_some(&self, name: &[u8]) -> String {
        let names = match &self.sim {
            None => match self.fd() {
                Ok(fd) => super::fs::entries_of(fd, name),
                Err(_) => None,
            },
            Some(sim) => Some(sim.entries(&self.child(name))),
        };
        let Some(mut names) = names else { return "unreadable".into() };
        names.sort();
        let more = names.len().saturating_sub(5);
        let shown: Vec<String> = names.iter().take(5).map(|n| String::from_utf8_lossy(n).into_owned()).collect();
        if more > 0 { format!("{} and {more} more", shown.join(", ")) } else { shown.join(", ") }
    }

    /// Renames `name` here to `to_name` in `to` (`NOREPLACE`, `EXCHANGE` or none).
    pub(super) fn rename(&self, name: &[u8], to: &Dir, to_name: &[u8], flags: RenameFlags) -> Result<(), Errno> {
        note_entries_changed(&self.path);
        note_made(to.child(to_name));
        if flags.contains(RenameFlags::EXCHANGE) {
            note_made(self.child(name));
        }
        match &self.sim {
            None => {
                super::redo::before_rename(&self.path, self.fd()?, name, &to.path, to.fd()?, to_name, flags);
                rustix::fs::renameat_with(self.fd()?, name, to.fd()?, to_name, flags)
            }
            Some(sim) => sim.rename(&self.child(name), &to.child(to_name), flags),
        }
    }

    pub(super) fn mkdir(&self, name: &[u8], mode: u32) -> Result<(), Errno> {
        note_made(self.child(name));
        match &self.sim {
            None => {
                super::redo::before_make(&self.path, name);
                rustix::fs::mkdirat(self.fd()?, name, Mode::from_raw_mode(mode))
            }
            Some(sim) => sim.make(&self.child(name), FileType::Directory, mode, 0, None),
        }
    }

    pub(super) fn symlink(&self, target: &[u8], name: &[u8]) -> Result<(), Errno> {
        note_made(self.child(name));
        match &self.sim {
            None => {
                super::redo::before_make(&self.path, name);
                rustix::fs::symlinkat(target, self.fd()?, name)
            }
            Some(sim) => sim.make(&self.child(name), FileType::Symlink, 0o777, 0, Some(target.to_vec())),
        }
    }

    pub(super) fn mknod(&self, name: &[u8], ft: FileType, mode: u32, rdev: u64) -> Result<(), Errno> {
        note_made(self.child(name));
        match &self.sim {
            None => {
                super::redo::before_make(&self.path, name);
                rustix::fs::mknodat(self.fd()?, name, ft, Mode::from_raw_mode(mode), rdev)
            }
            Some(sim) => sim.make(&self.child(name), ft, mode, rdev, None),
        }
    }

    /// Creates a regular file at `name`, which must not exist.
    pub(super) fn create(&self, name: &[u8], mode: u32) -> Result<Handle, Errno> {
        note_made(self.child(name));
        match &self.sim {
            None => {
                let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                super::redo::before_make(&self.path, name);
                rustix::fs::openat(self.fd()?, name, flags, Mode::from_raw_mode(mode)).map(Handle::Fd)
            }
            Some(sim) => {
                let p = self.child(name);
                sim.make(&p, FileType::RegularFile, mode, 0, None)?;
                Ok(Handle::Sim(sim.clone(), p))
            }
        }
    }

    /// Opens `name` for writing as it is (a blob in the store).
    pub(super) fn open_wronly(&self, name: &[u8]) -> Result<Handle, Errno> {
        match &self.sim {
            None => {
                if let Ok(Some(st)) = super::fs::lstat(self.fd()?, name) {
                    super::redo::before_rewrite(&self.path, self.fd()?, name, &st);
                }
                rustix::fs::openat(self.fd()?, name, OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                    .map(Handle::Fd)
            }
            Some(sim) => self.sim_open(sim, name),
        }
    }

    /// Opens an existing regular file for rewriting without following a symlink, making it
    /// writable for the moment if its owner's mode forbids writing (undo sets the mode back).
    pub(super) fn open_write(&self, name: &[u8], st: &Stat) -> Result<Handle, Errno> {
        match &self.sim {
            None => {
                super::redo::before_rewrite(&self.path, self.fd()?, name, st);
                super::fs::open_write_in_place(self.fd()?, name, st).map(Handle::Fd)
            }
            Some(sim) => self.sim_open(sim, name),
        }
    }

    /// Opens `name` for reading, without following a symlink or blocking on a FIFO.
    pub(super) fn open_read(&self, name: &[u8]) -> Result<Handle, Errno> {
        match &self.sim {
            None => rustix::fs::openat(
                self.fd()?,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )
            .map(Handle::Fd),
            Some(sim) => self.sim_open(sim, name),
        }
    }

    fn sim_open(&self, sim: &Rc<Sim>, name: &[u8]) -> Result<Handle, Errno> {
        let p = self.child(name);
        match sim.lstat(&p)? {
            None => Err(Errno::NOENT),
            Some(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => Err(Errno::LOOP),
            Some(_) => Ok(Handle::Sim(sim.clone(), p)),
        }
    }

    pub(super) fn readlink(&self, name: &[u8]) -> Result<Vec<u8>, Errno> {
        match &self.sim {
            None => rustix::fs::readlinkat(self.fd()?, name, Vec::new()).map(|t| t.into_bytes()),
            Some(sim) => sim.readlink(&self.child(name)),
        }
    }

    /// When the node at `name` was born, `[seconds, nanoseconds]`, if the file system keeps it
    /// (a node a dry run made was born now).
    pub(super) fn birth(&self, name: &[u8]) -> Option<(i64, u32)> {
        let real = match &self.sim {
            None => None,
            Some(sim) => match sim.resolve(&self.child(name)).ok()? {
                Where::Real(r) => Some(r),
                Where::Node(n) => Some(n.real.clone()?),
                Where::Missing => return None,
            },
        };
        let sx = match &real {
            None => rustix::fs::statx(self.fd().ok()?, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BTIME),
            Some(r) => {
                crate::resolve::at_path(r, |d, n| rustix::fs::statx(d, n, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BTIME))
            }
        }
        .ok()?;
        (sx.stx_mask & StatxFlags::BTIME.bits() != 0).then_some((sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec))
    }

    /// The real path of `name`, when it is a real node (for reads by path: inode flags,
    /// extended attributes); `None` for a node a dry run made.
    pub(super) fn real_path(&self, name: &[u8]) -> Option<Vec<u8>> {
        match &self.sim {
            None => Some(self.child(name)),
            Some(sim) => match sim.resolve(&self.child(name)).ok()? {
                Where::Real(r) => Some(r),
                Where::Node(n) => n.real.clone(),
                Where::Missing => None,
            },
        }
    }
}

impl Handle {
    pub(super) fn stat(&self) -> Result<Stat, Errno> {
        match self {
            Handle::Fd(fd) => rustix::fs::fstat(fd),
            Handle::Sim(sim, p) => sim.lstat(p)?.ok_or(Errno::NOENT),
        }
    }

    /// BLAKE3 hex and length of the contents.
    pub(super) fn hash(&self) -> io::Result<(String, u64)> {
        match self {
            Handle::Fd(fd) => hash_fd(fd),
            Handle::Sim(sim, p) => sim.content(p),
        }
    }

    /// Replaces the contents with `src`'s.
    pub(super) fn copy_from(&self, src: &Handle) -> io::Result<()> {
        match (self, src) {
            (Handle::Fd(dst), Handle::Fd(src)) => super::fs::copy_from_start(src, dst),
            (Handle::Sim(sim, p), src) => {
                let (hash, len) = src.hash()?;
                let from = match src {
                    Handle::Sim(from_sim, q) => from_sim.node(q)?.and_then(|n| match n.content {
                        None => n.real.map(Source::Real),
                        Some(_) => n.bytes_from,
                    }),
                    Handle::Fd(_) => None,
                };
                sim.update(p, |n| {
                    n.content = Some((hash, len));
                    n.bytes_from = from;
                    n.st.st_size = len as _;
                })?;
                Ok(())
            }
            (Handle::Fd(_), Handle::Sim(..)) => Err(io::Error::other("a dry run's node copied into a real file")),
        }
    }

    /// Replaces the contents with `bytes` (a capture held in memory).
    pub(super) fn write_bytes(&self, bytes: &Rc<[u8]>) -> io::Result<()> {
        match self {
            Handle::Fd(dst) => {
                rustix::fs::ftruncate(dst, 0)?;
                crate::capture::pwrite_all(dst, bytes, 0)
            }
            Handle::Sim(sim, p) => {
                let len = bytes.len() as u64;
                sim.update(p, |n| {
                    n.content = Some((blake3::hash(bytes).to_hex().to_string(), len));
                    n.bytes_from = Some(Source::Held(bytes.clone()));
                    n.st.st_size = len as _;
                })?;
                Ok(())
            }
        }
    }

    pub(super) fn truncate(&self, len: u64) -> Result<(), Errno> {
        match self {
            Handle::Fd(fd) => rustix::fs::ftruncate(fd, len),
            Handle::Sim(sim, p) => {
                let was = sim.content(p).ok();
                // A real file's first `len` bytes are read and hashed (the node's own, or those
                // of the capture the dry run copied into it); bytes the dry run only imagined
                // cannot be, and get a name no real hash can equal.
                let source = sim.node(p)?.and_then(|n| match &n.content {
                    None => n.real.map(Source::Real),
                    Some((_, had)) if len <= *had => n.bytes_from,
                    Some(_) => None,
                });
                let prefix = source.and_then(|source| match source {
                    Source::Real(r) => {
                        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
                        let fd =
                            crate::resolve::at_path(&r, |d, n| rustix::fs::openat(d, n, flags, Mode::empty())).ok()?;
                        let f = std::fs::File::from(fd);
                        let mut h = blake3::Hasher::new();
                        let copied = io::copy(&mut io::Read::take(f, len), &mut h).ok()?;
                        (copied == len).then(|| h.finalize().to_hex().to_string())
                    }
                    Source::Held(bytes) => bytes.get(..len as usize).map(|b| blake3::hash(b).to_hex().to_string()),
                });
                sim.update(p, |n| {
                    if was.as_ref().is_none_or(|(_, l)| *l != len) {
                        n.content = Some((prefix.unwrap_or_else(|| format!("truncated to {len} bytes")), len));
                    }
                    n.st.st_size = len as _;
                })
            }
        }
    }
}

/// An extended attribute: name and value.
pub(super) type XattrPair = (Vec<u8>, Vec<u8>);

/// What a dry run holds at one name.
#[derive(Clone)]
pub(super) enum Slot {
    /// Nothing is there (removed, or moved away).
    Absent,
    /// This node is there.
    Node(Box<SimNode>),
}

/// A node as a dry run left it.
#[derive(Clone)]
pub(super) struct SimNode {
    /// Where the node really is, when it is a real one (moved or changed by the dry run);
    /// `None` when the dry run made it.
    pub(super) real: Option<Vec<u8>>,
    /// Its status as the dry run left it.
    pub(super) st: Stat,
    /// Contents (hash, length), when the dry run wrote them.
    content: Option<(String, u64)>,
    /// Where the bytes of those contents are (a capture the dry run copied in), so that a
    /// truncation of them after is still known byte for byte.
    bytes_from: Option<Source>,
    /// Symlink target, for a symlink the dry run made.
    target: Option<Vec<u8>>,
    /// Extended attributes, once the dry run changed them.
    pub(super) xattrs: Option<Vec<XattrPair>>,
    /// Inode flags, once the dry run set them.
    pub(super) flags: Option<u32>,
}

/// Where a path leads in a dry run.
pub(super) enum Where {
    /// To the real node at this path.
    Real(Vec<u8>),
    /// To nothing.
    Missing,
    /// To a node the overlay holds.
    Node(Box<SimNode>),
}

/// The names with a slot in one directory, by their index (see [`Slots`]): each listed when it
/// gets a slot, again only if it lost it meanwhile (a list of four bytes a name, where a set
/// of a million was 15 MB at a dry run's peak while it grew).
type Names = Vec<u32>;

/// What the overlay holds at each path it has a slot for, by the path's index: a path the
/// session's seal holds by its index there (shared, so that a dry run of a million removals
/// does not hold a million paths again), any other by its index in a set of the overlay's own
/// after those.
struct Slots {
    /// The seal's paths (none for a session without a seal).
    sealed: Option<std::sync::Arc<PathSet>>,
    /// Every other path that ever had a slot (one that lost it keeps its index).
    own: PathSet,
    /// What each path's slot is, by its index: [`NO_SLOT`], [`ABSENT`] or [`NODE`] (a byte: a
    /// dry run of a million removals holds a million absent slots, and an `Option<Slot>` was
    /// 16 bytes).
    kinds: Vec<u8>,
    /// The nodes of the slots that hold one, by index.
    nodes: HashMap<u32, Slot>,
    /// What [`Slots::get`] answers for an absent slot.
    absent: Slot,
    /// How many paths have a slot.
    held: usize,
}

const NO_SLOT: u8 = 0;
const ABSENT: u8 = 1;
const NODE: u8 = 2;

impl Slots {
    fn new(sealed: Option<std::sync::Arc<PathSet>>) -> Slots {
        Slots {
            sealed,
            own: PathSet::default(),
            kinds: Vec::new(),
            nodes: HashMap::new(),
            absent: Slot::Absent,
            held: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// How many indices the seal takes (the overlay's own paths come after them).
    fn sealed_len(&self) -> usize {
        self.sealed.as_ref().map_or(0, |s| s.len())
    }

    fn index_of(&self, path: &[u8]) -> Option<usize> {
        match self.sealed.as_ref().and_then(|s| s.index_of(path)) {
            Some(i) => Some(i),
            None => Some(self.sealed_len() + self.own.index_of(path)?),
        }
    }

    fn get(&self, path: &[u8]) -> Option<&Slot> {
        let i = self.index_of(path)?;
        match self.kinds.get(i).copied().unwrap_or(NO_SLOT) {
            ABSENT => Some(&self.absent),
            NODE => self.nodes.get(&(i as u32)),
            _ => None,
        }
    }

    /// Sets the slot of `path`: its index, and whether it had no slot before.
    fn insert(&mut self, path: &[u8], slot: Slot) -> (u32, bool) {
        let i = match self.sealed.as_ref().and_then(|s| s.index_of(path)) {
            Some(i) => i,
            None => self.sealed_len() + self.own.insert_full(path).0,
        };
        if self.kinds.len() <= i {
            self.kinds.resize(i + 1, NO_SLOT);
        }
        let new = self.kinds[i] == NO_SLOT;
        self.held += usize::from(new);
        let at = i as u32;
        match slot {
            Slot::Absent => {
                self.kinds[i] = ABSENT;
                self.nodes.remove(&at);
            }
            node => {
                self.kinds[i] = NODE;
                self.nodes.insert(at, node);
            }
        }
        (at, new)
    }

    fn remove(&mut self, path: &[u8]) -> Option<Slot> {
        let i = self.index_of(path)?;
        let kind = std::mem::replace(self.kinds.get_mut(i)?, NO_SLOT);
        self.held -= usize::from(kind != NO_SLOT);
        match kind {
            ABSENT => Some(Slot::Absent),
            NODE => self.nodes.remove(&(i as u32)),
            _ => None,
        }
    }

    fn path(&self, index: u32) -> Vec<u8> {
        let i = index as usize;
        match i.checked_sub(self.sealed_len()) {
            Some(own) => self.own.get(own),
            None => self.sealed.as_ref().and_then(|s| s.get(i)),
        }
        .unwrap_or_default()
    }

    /// The last name of the path at `index`.
    fn name(&self, index: u32) -> &[u8] {
        let i = index as usize;
        match i.checked_sub(self.sealed_len()) {
            Some(own) => self.own.name(own),
            None => self.sealed.as_ref().and_then(|s| s.name(i)),
        }
        .unwrap_or_default()
    }
}

/// The overlay of a dry run (see the module documentation).
pub(super) struct Sim {
    slots: RefCell<Slots>,
    /// The names with a slot, by parent directory.
    kids: RefCell<HashMap<Box<[u8]>, Names>>,
    next_ino: Cell<u64>,
    /// A real status whose every field the dry run overwrites for a node it makes.
    template: Stat,
}

impl Sim {
    /// An empty overlay; `sealed`: the session seal's paths, whose indices it shares.
    pub(super) fn new(template: Stat, sealed: Option<std::sync::Arc<PathSet>>) -> Sim {
        Sim { slots: RefCell::new(Slots::new(sealed)), kids: Default::default(), next_ino: Cell::new(0), template }
    }

    /// Where `path` leads: the nearest slot at or above it decides.
    pub(super) fn resolve(&self, path: &[u8]) -> Result<Where, Errno> {
        let slots = self.slots.borrow();
        if slots.is_empty() {
            return Ok(Where::Real(path.to_vec()));
        }
        let mut at = path;
        loop {
            if let Some(slot) = slots.get(at) {
                let rest = &path[at.len()..];
                return Ok(match (slot, rest.is_empty()) {
                    (Slot::Absent, _) => Where::Missing,
                    (Slot::Node(n), true) => Where::Node(n.clone()),
                    (Slot::Node(n), false) => match FileType::from_raw_mode(n.st.st_mode) {
                        FileType::Directory => match &n.real {
                            Some(r) => {
                                let mut p = r.clone();
                                p.extend_from_slice(rest);
                                Where::Real(p)
                            }
                            // A directory the dry run made holds only what has a slot.
                            None => Where::Missing,
                        },
                        FileType::Symlink => return Err(Errno::LOOP),
                        _ => return Err(Errno::NOTDIR),
                    },
                });
            }
            if at.len() <= 1 {
                return Ok(Where::Real(path.to_vec()));
            }
            at = parent(at);
        }
    }

    pub(super) fn lstat(&self, path: &[u8]) -> Result<Option<Stat>, Errno> {
        match self.resolve(path)? {
            Where::Real(r) => {
                match crate::resolve::at_path(&r, |d, n| rustix::fs::statat(d, n, AtFlags::SYMLINK_NOFOLLOW)) {
                    Ok(st) => Ok(Some(st)),
                    Err(Errno::NOENT) | Err(Errno::NOTDIR) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Where::Missing => Ok(None),
            Where::Node(n) => Ok(Some(n.st)),
        }
    }

    /// The node at `path` as the overlay's own (a real one is taken in as it is now).
    fn node(&self, path: &[u8]) -> Result<Option<Box<SimNode>>, Errno> {
        Ok(match self.resolve(path)? {
            Where::Real(r) => {
                match crate::resolve::at_path(&r, |d, n| rustix::fs::statat(d, n, AtFlags::SYMLINK_NOFOLLOW)) {
                    Ok(st) => Some(Box::new(SimNode {
                        real: Some(r),
                        st,
                        content: None,
                        bytes_from: None,
                        target: None,
                        xattrs: None,
                        flags: None,
                    })),
                    Err(Errno::NOENT) | Err(Errno::NOTDIR) => None,
                    Err(e) => return Err(e),
                }
            }
            Where::Missing => None,
            Where::Node(n) => Some(n),
        })
    }

    pub(super) fn set(&self, path: &[u8], slot: Slot) {
        let (i, new) = self.slots.borrow_mut().insert(path, slot);
        if new {
            self.kids.borrow_mut().entry(parent(path).into()).or_default().push(i);
        }
    }

    /// Changes the node at `path` (taken into the overlay first).
    pub(super) fn update(&self, path: &[u8], f: impl FnOnce(&mut SimNode)) -> Result<(), Errno> {
        let mut n = self.node(path)?.ok_or(Errno::NOENT)?;
        f(&mut n);
        self.set(path, Slot::Node(n));
        Ok(())
    }

    /// The names in directory `path`, as the overlay shows it.
    pub(super) fn entries(&self, path: &[u8]) -> Vec<Vec<u8>> {
        let mut names: HashSet<Vec<u8>> = HashSet::new();
        let real = match self.resolve(path) {
            Ok(Where::Real(r)) => Some(r),
            Ok(Where::Node(n)) => n.real,
            _ => None,
        };
        if let Some(r) = real
            && let Ok(fd) = super::fs::open_dir_nofollow(&r)
        {
            for n in super::fs::entries_of(fd.as_fd(), b".").unwrap_or_default() {
                names.insert(n);
            }
        }
        if let Some(kids) = self.kids.borrow().get(path) {
            let slots = self.slots.borrow();
            names.extend(kids.iter().map(|&k| slots.name(k).to_vec()));
        }
        let mut present: Vec<Vec<u8>> =
            names.into_iter().filter(|n| self.lstat(&join(path, n)).is_ok_and(|st| st.is_some())).collect();
        present.sort();
        present
    }

    fn make(&self, path: &[u8], ft: FileType, mode: u32, rdev: u64, target: Option<Vec<u8>>) -> Result<(), Errno> {
        if self.lstat(path)?.is_some() {
            return Err(Errno::EXIST);
        }
        let parent_st = self.lstat(parent(path))?.ok_or(Errno::NOENT)?;
        let mut st = self.template;
        let ino = self.next_ino.get() + 1;
        self.next_ino.set(ino);
        st.st_dev = parent_st.st_dev;
        // No real inode has this number.
        st.st_ino = u64::MAX - ino;
        st.st_mode = ft.as_raw_mode() | (mode & 0o7777);
        st.st_nlink = if ft == FileType::Directory { 2 } else { 1 };
        st.st_uid = rustix::process::geteuid().as_raw();
        st.st_gid = rustix::process::getegid().as_raw();
        st.st_rdev = rdev as _;
        st.st_size = target.as_ref().map_or(0, |t| t.len() as _);
        self.move_slots(path, path);
        let content = (ft == FileType::RegularFile).then(|| (blake3::hash(b"").to_hex().to_string(), 0));
        let node = SimNode { real: None, st, content, bytes_from: None, target, xattrs: None, flags: None };
        self.set(path, Slot::Node(Box::new(node)));
        Ok(())
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>, Errno> {
        match self.resolve(path)? {
            Where::Real(r) => {
                crate::resolve::at_path(&r, |d, n| rustix::fs::readlinkat(d, n, Vec::new())).map(|t| t.into_bytes())
            }
            Where::Missing => Err(Errno::NOENT),
            Where::Node(n) => match (n.target, n.real) {
                (Some(t), _) => Ok(t),
                (None, Some(r)) => {
                    crate::resolve::at_path(&r, |d, n| rustix::fs::readlinkat(d, n, Vec::new())).map(|t| t.into_bytes())
                }
                (None, None) => Err(Errno::INVAL),
            },
        }
    }

    fn content(&self, path: &[u8]) -> io::Result<(String, u64)> {
        let n = self.node(path)?.ok_or_else(|| io::Error::from(Errno::NOENT))?;
        if let Some(c) = n.content {
            return Ok(c);
        }
        let r = n.real.ok_or_else(|| io::Error::other("no contents"))?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let fd = crate::resolve::at_path(&r, |d, n| rustix::fs::openat(d, n, flags, Mode::empty()))?;
        hash_fd(&fd)
    }

    /// Takes every slot under directory `from` out of the overlay and returns them keyed under
    /// `to` (`from` itself to drop them).
    fn move_slots(&self, from: &[u8], to: &[u8]) -> Vec<(Vec<u8>, Slot)> {
        // Every slot below `from`, through the index by parent (never a scan of the overlay).
        let mut below = Vec::new();
        let mut dirs = vec![from.to_vec()];
        while let Some(d) = dirs.pop() {
            if let Some(kids) = self.kids.borrow_mut().remove(d.as_slice()) {
                let slots = self.slots.borrow();
                for k in kids {
                    let k = slots.path(k);
                    dirs.push(k.clone());
                    below.push(k);
                }
            }
        }
        let mut slots = self.slots.borrow_mut();
        below
            .into_iter()
            .filter_map(|k| {
                let slot = slots.remove(&k)?;
                let mut nk = to.to_vec();
                nk.extend_from_slice(&k[from.len()..]);
                Some((nk, slot))
            })
            .collect()
    }

    fn rename(&self, from: &[u8], to: &[u8], flags: RenameFlags) -> Result<(), Errno> {
        let src = self.node(from)?.ok_or(Errno::NOENT)?;
        let dst = self.node(to)?;
        if flags.contains(RenameFlags::EXCHANGE) {
            let dst = dst.ok_or(Errno::NOENT)?;
            let a = self.move_slots(from, to);
            let b = self.move_slots(to, from);
            self.set(to, Slot::Node(src));
            self.set(from, Slot::Node(dst));
            for (k, s) in a.into_iter().chain(b) {
                self.set(&k, s);
            }
            return Ok(());
        }
        if let Some(d) = &dst {
            if flags.contains(RenameFlags::NOREPLACE) {
                return Err(Errno::EXIST);
            }
            let (sd, dd) = (
                FileType::from_raw_mode(src.st.st_mode) == FileType::Directory,
                FileType::from_raw_mode(d.st.st_mode) == FileType::Directory,
            );
            match (sd, dd) {
                (false, true) => return Err(Errno::ISDIR),
                (true, false) => return Err(Errno::NOTDIR),
                (true, true) if !self.entries(to).is_empty() => return Err(Errno::NOTEMPTY),
                _ => {}
            }
        }
        let moved = self.move_slots(from, to);
        // Whatever was inside the directory replaced is gone.
        self.move_slots(to, to);
        self.set(to, Slot::Node(src));
        self.set(from, Slot::Absent);
        for (k, s) in moved {
            self.set(&k, s);
        }
        Ok(())
    }

    /// The extended attributes of the node at `path` as the overlay shows them (`None`: the
    /// real node's, read by the caller from [`Dir::real_path`]).
    pub(super) fn xattrs(&self, path: &[u8]) -> Option<Vec<XattrPair>> {
        self.node(path).ok().flatten().and_then(|n| n.xattrs)
    }

    /// The inode flags the dry run set on the node at `path`, if it set any.
    pub(super) fn flags(&self, path: &[u8]) -> Option<u32> {
        self.node(path).ok().flatten().and_then(|n| n.flags)
    }

    /// Sets times on the node at `path`.
    pub(super) fn set_times(&self, path: &[u8], ts: &Timestamps) -> Result<(), Errno> {
        self.update(path, |n| {
            n.st.st_atime = ts.last_access.tv_sec;
            n.st.st_atime_nsec = ts.last_access.tv_nsec as _;
            n.st.st_mtime = ts.last_modification.tv_sec;
            n.st.st_mtime_nsec = ts.last_modification.tv_nsec as _;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_dry_run_sees_what_it_removed_as_gone_what_it_made_as_made_and_the_rest_as_it_is() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().as_os_str().as_bytes().to_vec();
        for n in ["a", "b"] {
            std::fs::write(t.path().join(n), "x").unwrap();
        }
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/x"), "x").unwrap();
        let sim = Sim::new(rustix::fs::stat(t.path()).unwrap(), None);
        let p = |n: &str| join(&root, n.as_bytes());
        sim.set(&p("a"), Slot::Absent);
        sim.set(&p("d"), Slot::Absent);
        sim.make(&p("c"), FileType::RegularFile, 0o644, 0, None).unwrap();
        assert!(matches!(sim.resolve(&p("a")), Ok(Where::Missing)));
        assert!(matches!(sim.resolve(&p("d/x")), Ok(Where::Missing)), "under a removed directory");
        assert!(matches!(sim.resolve(&p("b")), Ok(Where::Real(r)) if r == p("b")));
        assert!(matches!(sim.resolve(&p("c")), Ok(Where::Node(_))));
        assert_eq!(sim.entries(&root), [b"b".to_vec(), b"c".to_vec()]);
        // Made again where it was removed, then removed again.
        sim.make(&p("a"), FileType::RegularFile, 0o600, 0, None).unwrap();
        assert!(matches!(sim.resolve(&p("a")), Ok(Where::Node(_))));
        sim.set(&p("a"), Slot::Absent);
        assert!(matches!(sim.resolve(&p("a")), Ok(Where::Missing)));
        assert_eq!(sim.entries(&root), [b"b".to_vec(), b"c".to_vec()]);
    }

    #[test]
    fn a_dry_run_holds_a_path_the_seal_holds_by_its_index_there_not_a_second_time() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().as_os_str().as_bytes().to_vec();
        let p = |n: &str| join(&root, n.as_bytes());
        std::fs::write(t.path().join("a"), "x").unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/x"), "x").unwrap();
        let mut sealed = PathSet::default();
        for n in ["a", "d", "d/x"] {
            sealed.insert_full(&p(n));
        }
        let sim = Sim::new(rustix::fs::stat(t.path()).unwrap(), Some(std::sync::Arc::new(sealed)));
        sim.set(&p("d/x"), Slot::Absent);
        sim.set(&p("a"), Slot::Absent);
        sim.make(&p("c"), FileType::RegularFile, 0o644, 0, None).unwrap();
        assert!(matches!(sim.resolve(&p("a")), Ok(Where::Missing)));
        assert!(matches!(sim.resolve(&p("d/x")), Ok(Where::Missing)));
        assert!(matches!(sim.resolve(&p("c")), Ok(Where::Node(_))));
        assert_eq!(sim.entries(&root), [b"c".to_vec(), b"d".to_vec()]);
        assert_eq!(sim.entries(&p("d")), Vec::<Vec<u8>>::new());
        // A directory made where one was takes none of the old one's slots along.
        sim.set(&p("d"), Slot::Absent);
        sim.make(&p("d"), FileType::Directory, 0o755, 0, None).unwrap();
        assert!(matches!(sim.resolve(&p("d/x")), Ok(Where::Missing)), "a made directory holds only what has a slot");
        assert_eq!(sim.slots.borrow().own.len(), 1, "only the path the seal does not hold is held again");
    }
}
