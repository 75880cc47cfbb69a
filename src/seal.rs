//! The seal: the after-state of every path a session touched, taken when `aether-journal run`
//! ends. Undo compares each path with it before restoring, so that a change made since (by
//! the user, another agent, another session) is reported as a conflict instead of clobbered.
//!
//! The seal also records the BLAKE3 hash of every blob captured without one (hard-linked and
//! cloned captures are not hashed on the hot path), so that they too are verified before they
//! are put back.
//!
//! What this module cannot do: seal a session whose processes are still running (a raw
//! `LD_PRELOAD` session has no end that `run` sees). Such sessions are checked against what
//! their newest records imply ([`Expectation`]), which catches replaced and removed paths but
//! not a file edited in place; undo says so.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::bpath::BPath;
use crate::byteset::PathSet;
use crate::capture::{hash_regular, ident_of};
use crate::digest::JournalDigest;

mod packed;

std::thread_local! {
    /// The directory the last [`AfterState::of_sealing`] on this thread looked in, open, or
    /// `None` when it does not exist (every name in it is then absent: an `rm -rf` leaves a
    /// seal of many such names).
    static PARENT: std::cell::RefCell<Option<(Vec<u8>, Option<std::os::fd::OwnedFd>)>> = const { std::cell::RefCell::new(None) };
}
use crate::journal::JournalContents;
use crate::record::{Before, CaptureHow, Ident, Node, Op, Record};

/// Seal file name inside a session directory.
pub const SEAL_FILE: &str = "seal.json";
/// Seal format version.
pub const SEAL_VERSION: u32 = 1;

/// What a sealed regular file's contents were: their BLAKE3 (written as 64 hex digits), or,
/// for a file the seal could not read, the text that stands in for them (its size and times,
/// `unreadable:...`). Held as bytes, not text: a seal of a million files kept a 64-byte string
/// for each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentDigest {
    /// The BLAKE3 of the contents.
    Blake3([u8; 32]),
    /// Anything else the seal holds in its place.
    Stamp(Box<str>),
}

impl ContentDigest {
    /// The digest `text` writes (64 hex digits: a BLAKE3; anything else: a stamp).
    pub fn parse(text: &str) -> Self {
        match blake3::Hash::from_hex(text) {
            Ok(h) => ContentDigest::Blake3(*h.as_bytes()),
            Err(_) => ContentDigest::Stamp(text.into()),
        }
    }

    /// As the seal writes it.
    pub fn to_text(&self) -> String {
        match self {
            ContentDigest::Blake3(b) => blake3::Hash::from_bytes(*b).to_hex().to_string(),
            ContentDigest::Stamp(s) => s.to_string(),
        }
    }
}

impl From<blake3::Hash> for ContentDigest {
    fn from(h: blake3::Hash) -> Self {
        ContentDigest::Blake3(*h.as_bytes())
    }
}

impl Serialize for ContentDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ContentDigest::Blake3(b) => s.serialize_str(blake3::Hash::from_bytes(*b).to_hex().as_str()),
            ContentDigest::Stamp(t) => s.serialize_str(t),
        }
    }
}

impl<'de> Deserialize<'de> for ContentDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ContentDigest;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a content digest")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ContentDigest, E> {
                Ok(ContentDigest::parse(v))
            }
        }
        d.deserialize_str(V)
    }
}

/// [`AfterState`] read tag first (see [`crate::record::tag_first`]): the seal's writer puts
/// `kind` first, and serde's buffering of each of a million maps was most of reading a seal.
#[repr(transparent)]
struct TagFirstState(AfterState);

impl<'de> Deserialize<'de> for TagFirstState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::record::tag_first::read(d).map(TagFirstState)
    }
}

impl<'de> crate::record::tag_first::TagFirst<'de> for AfterState {
    const TAG: &'static str = "kind";
    const WHAT: &'static str = "a sealed state";

    fn variant<A: serde::de::MapAccess<'de>>(kind: String, mut rest: A) -> Result<AfterState, A::Error> {
        use crate::record::tag_first::{fields, tagged_back};
        #[derive(Deserialize)]
        struct File {
            ident: Ident,
            size: u64,
            hash: ContentDigest,
            mode: u32,
            uid: u32,
            gid: u32,
            #[serde(default)]
            ctime: Option<[i64; 2]>,
        }
        #[derive(Deserialize)]
        struct Dir {
            ident: Ident,
            mode: u32,
            uid: u32,
            gid: u32,
        }
        match kind.as_str() {
            "file" => fields::<File, _>(rest).map(|f| AfterState::File {
                ident: f.ident,
                size: f.size,
                hash: f.hash,
                mode: f.mode,
                uid: f.uid,
                gid: f.gid,
                ctime: f.ctime,
            }),
            "dir" => {
                fields::<Dir, _>(rest).map(|d| AfterState::Dir { ident: d.ident, mode: d.mode, uid: d.uid, gid: d.gid })
            }
            "absent" => {
                // A unit variant: whatever else the map holds is ignored, as derived.
                while rest.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(AfterState::Absent)
            }
            _ => tagged_back(Self::TAG, kind, rest),
        }
    }
}

/// The seal's `paths`, each state read tag first, into the set as they are read.
fn paths_tag_first<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SealedPaths, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = SealedPaths;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of [path, state] pairs")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<SealedPaths, A::Error> {
            let mut out = SealedPaths::default();
            while let Some((p, s)) = seq.next_element::<(BPath, TagFirstState)>()? {
                out.add_first(p.as_bytes(), s.0);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V)
}

/// What a path was when the session ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AfterState {
    /// Nothing there.
    Absent,
    /// A regular file.
    File {
        /// Identity.
        ident: Ident,
        /// Size.
        size: u64,
        /// What its contents were.
        hash: ContentDigest,
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// Change time, `[seconds, nanoseconds]`, when known (seals made before it was kept
        /// have none): a file whose identity, size, mode, owner and change time are all as
        /// sealed is unchanged without reading it (no call sets a change time back).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ctime: Option<[i64; 2]>,
    },
    /// A directory.
    Dir {
        /// Identity.
        ident: Ident,
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// A symlink.
    Symlink {
        /// Its target.
        target: BPath,
    },
    /// Anything else (FIFO, socket, device).
    Other {
        /// Identity.
        ident: Ident,
        /// Permission bits.
        mode: u32,
    },
}

impl AfterState {
    /// The state of `path` now, without following a final symlink.
    pub fn of(path: &[u8]) -> io::Result<AfterState> {
        if path.len() >= crate::resolve::LONG_PATH && path.first() == Some(&b'/') {
            let (dir, name) = crate::resolve::split_last(path);
            return match crate::resolve::open_dir_by_components(dir) {
                Ok(parent) => Self::at(parent.as_fd(), name),
                Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(AfterState::Absent),
                Err(e) => Err(e.into()),
            };
        }
        Self::at(CWD, path)
    }

    /// [`AfterState::of`] for the seal, which looks at many paths at once and changes none:
    /// the parent is opened once for a run of paths in the same directory (the seal's are
    /// sorted), one walk of its name instead of two per path. The open parent is kept per
    /// thread until [`forget_parent`].
    fn of_sealing(path: &[u8]) -> io::Result<AfterState> {
        let (dir, name) = crate::resolve::split_last(path);
        if path.first() != Some(&b'/') || name.is_empty() || name == b".." || name == b"." {
            return Self::at(CWD, path);
        }
        if path.len() >= crate::resolve::LONG_PATH {
            return Self::of(path);
        }
        PARENT.with(|cell| {
            let mut cached = cell.borrow_mut();
            if cached.as_ref().is_none_or(|(d, _)| d.as_slice() != dir) {
                *cached = match rustix::fs::openat(
                    CWD,
                    dir,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => Some((dir.to_vec(), Some(fd))),
                    Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => Some((dir.to_vec(), None)),
                    Err(_) => None,
                };
            }
            match cached.as_ref() {
                Some((_, Some(fd))) => Self::at(fd.as_fd(), name),
                Some((_, None)) => Ok(AfterState::Absent),
                None => Self::at(CWD, path),
            }
        })
    }

    /// [`AfterState::of`] for `name` under the directory `dir`.
    fn at(dir: impl AsFd, name: &[u8]) -> io::Result<AfterState> {
        let dir = dir.as_fd();
        let path = name;
        let st = match rustix::fs::statat(dir, path, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => return Ok(AfterState::Absent),
            Err(e) => return Err(e.into()),
        };
        let (mode, uid, gid, ident) = (st.st_mode & 0o7777, st.st_uid, st.st_gid, ident_of(&st));
        Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {
                let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
                // Read without moving its access time where we may (ours, or as root): the
                // first read after a write moves it, which dirtied each inode of a million
                // the session made. An empty file need not be opened.
                let open = || match rustix::fs::openat(dir, path, flags | OFlags::NOATIME, Mode::empty()) {
                    Err(rustix::io::Errno::PERM) => rustix::fs::openat(dir, path, flags, Mode::empty()),
                    other => other,
                };
                let read = (st.st_size > 0).then(open);
                let (hash, size) = match read {
                    None => (blake3::hash(b"").into(), 0),
                    Some(Ok(fd)) => {
                        let (hash, size) = hash_regular(fd.as_fd(), st.st_size as u64)?;
                        (ContentDigest::from(hash), size)
                    }
                    // Not readable by us: its size and times stand in for its contents.
                    Some(Err(rustix::io::Errno::ACCESS)) => {
                        let size = st.st_size as u64;
                        let stamp = format!(
                            "unreadable:{size}:{}.{}:{}.{}",
                            st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec
                        );
                        (ContentDigest::Stamp(stamp.into()), size)
                    }
                    Some(Err(e)) => return Err(e.into()),
                };
                AfterState::File {
                    ident,
                    size,
                    hash,
                    mode,
                    uid,
                    gid,
                    ctime: Some([st.st_ctime, st.st_ctime_nsec as i64]),
                }
            }
            FileType::Directory => AfterState::Dir { ident, mode, uid, gid },
            FileType::Symlink => {
                AfterState::Symlink { target: BPath::new(rustix::fs::readlinkat(dir, path, Vec::new())?.into_bytes()) }
            }
            _ => AfterState::Other { ident, mode },
        })
    }

    /// Whether `path` is, by its `lstat` alone, certainly still this sealed regular file: the
    /// same identity, size, mode, owner and change time. `false` says nothing (look closer).
    /// It relies on every change after the seal moving the change time: true on kernels with
    /// multigrain timestamps (6.13+, where the seal's own `stat` makes the next change
    /// fine-grained); on older kernels a change of the same size within one clock tick of the
    /// seal would go unseen.
    pub fn unchanged_by_stat(&self, path: &[u8]) -> bool {
        let AfterState::File { ident, size, mode, uid, gid, ctime: Some(ctime), .. } = self else { return false };
        rustix::fs::statat(CWD, path, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
            FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                && ident_of(&st) == *ident
                && st.st_size as u64 == *size
                && (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (*mode, *uid, *gid)
                && [st.st_ctime, st.st_ctime_nsec as i64] == *ctime
        })
    }

    /// What differs between `self` (sealed) and `now`, in words; `None` when nothing does.
    pub fn difference(&self, now: &AfterState) -> Option<String> {
        use AfterState::*;
        let kind = |s: &AfterState| match s {
            Absent => "nothing",
            File { .. } => "a regular file",
            Dir { .. } => "a directory",
            Symlink { .. } => "a symlink",
            Other { .. } => "a special file",
        };
        match (self, now) {
            (Absent, Absent) => None,
            (
                File { ident: i1, hash: h1, size: s1, mode: m1, uid: u1, gid: g1, .. },
                File { ident: i2, hash: h2, size: s2, mode: m2, uid: u2, gid: g2, .. },
            ) => {
                let mut what = Vec::new();
                if h1 != h2 {
                    what.push(format!("its contents changed ({s1} -> {s2} bytes)"));
                }
                if i1 != i2 {
                    what.push("it was replaced by another file".to_string());
                }
                if m1 != m2 {
                    what.push(format!("its mode changed ({m1:o} -> {m2:o})"));
                }
                if (u1, g1) != (u2, g2) {
                    what.push(format!("its owner changed ({u1}:{g1} -> {u2}:{g2})"));
                }
                (!what.is_empty()).then(|| what.join(", "))
            }
            (Dir { ident: i1, mode: m1, uid: u1, gid: g1 }, Dir { ident: i2, mode: m2, uid: u2, gid: g2 }) => {
                let mut what = Vec::new();
                if i1 != i2 {
                    what.push("it was replaced by another directory".to_string());
                }
                if m1 != m2 {
                    what.push(format!("its mode changed ({m1:o} -> {m2:o})"));
                }
                if (u1, g1) != (u2, g2) {
                    what.push(format!("its owner changed ({u1}:{g1} -> {u2}:{g2})"));
                }
                (!what.is_empty()).then(|| what.join(", "))
            }
            (Symlink { target: t1 }, Symlink { target: t2 }) => {
                (t1 != t2).then(|| format!("its target changed ({} -> {})", t1.display_lossy(), t2.display_lossy()))
            }
            (Other { ident: i1, mode: m1 }, Other { ident: i2, mode: m2 }) => {
                (i1 != i2 || m1 != m2).then(|| "it was replaced or its mode changed".to_string())
            }
            (a, b) => Some(format!("it was {} when the session ended and is {} now", kind(a), kind(b))),
        }
    }
}

/// What a blob was when the session was sealed: its inode, size, modification time and
/// change time. A write to the blob moves its modification time, and its change time too,
/// which no program can set back (a writer that sets the modification time back moves it
/// again). The change time also moves when a redo renames the blob (one an undo put back into
/// the tree goes back into the store) and when another name of its inode is made or removed,
/// so it is compared only for a blob that was and is its inode's only name, while no undo of
/// the session has run ([`BlobStat::unchanged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobStat {
    /// Its identity.
    pub ident: Ident,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time (seconds, nanoseconds).
    pub mtime: [i64; 2],
    /// Its change time (seconds, nanoseconds), when it was its inode's only name; `None`
    /// otherwise, and in seals of older builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime: Option<[i64; 2]>,
}

impl BlobStat {
    /// Of the file `st` describes.
    pub fn of(st: &rustix::fs::Stat) -> BlobStat {
        BlobStat {
            ident: ident_of(st),
            size: st.st_size as u64,
            mtime: [st.st_mtime, st.st_mtime_nsec as i64],
            ctime: (st.st_nlink == 1).then_some([st.st_ctime, st.st_ctime_nsec as i64]),
        }
    }

    /// Whether the blob `st` describes is still as this says: its identity, size and
    /// modification time, and its change time when both were kept (it was and is its inode's
    /// only name) unless `moved_since` (an undo of the session has run, and a redo may have
    /// moved it back into the store since).
    pub fn unchanged(&self, st: &rustix::fs::Stat, moved_since: bool) -> bool {
        let now = BlobStat::of(st);
        let ctimes = now.ctime.zip(self.ctime).filter(|_| !moved_since);
        (now.ident, now.size, now.mtime) == (self.ident, self.size, self.mtime) && ctimes.is_none_or(|(a, b)| a == b)
    }
}

/// A session's seal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// Format version.
    pub version: u32,
    /// When it was taken (RFC 3339).
    pub sealed: String,
    /// The newest record it covers (0: every record, for a seal made before it was kept): a
    /// path with a newer record (a process that joined the session after `run` sealed it)
    /// is not as sealed for a reason the seal does not know, and is checked the unsealed way.
    #[serde(default)]
    pub through: u64,
    /// After-state of every touched path (a list in JSON, since paths are bytes).
    #[serde(deserialize_with = "paths_tag_first")]
    pub paths: SealedPaths,
    /// BLAKE3 of every blob that was captured without a hash (linked and cloned captures), in
    /// seals of older builds; a seal of this one holds [`Seal::blob_stats`] instead (empty).
    pub blob_hashes: BTreeMap<String, String>,
    /// What every blob captured without a hash (linked and cloned captures) was at sealing
    /// ([`BlobStat`]): undo refuses one that is no longer so, and the seal need not read a
    /// byte of them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blob_stats: BTreeMap<String, BlobStat>,
    /// The linked blobs whose size and modification time were, at sealing, still those of
    /// their capture: their bytes are then the captured bytes (a descriptor kept open could
    /// otherwise have changed the inode after it was captured).
    #[serde(default)]
    pub blob_intact: std::collections::BTreeSet<String>,
    /// What the journal's files held when the session was sealed ([`JournalDigest`]), so that
    /// a record changed, removed or added since is found (`None` in seals of older builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_digest: Option<JournalDigest>,
}

/// A seal's paths and the after-state of each, found by path. The paths are held in one
/// [`PathSet`] (each directory once, then each last name with its table: about 25 bytes a
/// path in a few directories, where a list of `BPath`s and a map to them took 100: a seal of
/// a million paths is read whole by undo), the states packed beside
/// them (`packed`: about 55 bytes a regular file where a value took 104), in the same order.
/// A path a list repeats is held once, with its first state. The paths are shared with
/// whoever asks for them ([`SealedPaths::names`]), copied only if a path is added meanwhile.
#[derive(Clone, Default)]
pub struct SealedPaths {
    names: std::sync::Arc<PathSet>,
    /// Every state, packed one after another.
    packed: Vec<u8>,
    /// Where the state of each name starts in `packed`, by its index in `names`.
    starts: Starts,
}

/// Offsets into [`SealedPaths::packed`]: four bytes each while they fit (4 MB of a seal of a
/// million paths), eight once one does not.
#[derive(Clone, Debug)]
enum Starts {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Default for Starts {
    fn default() -> Starts {
        Starts::Narrow(Vec::new())
    }
}

impl Starts {
    fn len(&self) -> usize {
        match self {
            Starts::Narrow(v) => v.len(),
            Starts::Wide(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> usize {
        let at = match self {
            Starts::Narrow(v) => v.get(i).map(|&a| u64::from(a)),
            Starts::Wide(v) => v.get(i).copied(),
        };
        at.and_then(|a| usize::try_from(a).ok()).unwrap_or(usize::MAX)
    }

    /// The offsets as eight bytes each, when `at` does not fit in four.
    fn widen_for(&mut self, at: usize) {
        if let Starts::Narrow(v) = self
            && u32::try_from(at).is_err()
        {
            *self = Starts::Wide(v.iter().map(|&a| u64::from(a)).collect());
        }
    }

    fn set(&mut self, i: usize, at: usize) {
        self.widen_for(at);
        match self {
            Starts::Narrow(v) => v[i] = at as u32,
            Starts::Wide(v) => v[i] = at as u64,
        }
    }

    fn push(&mut self, at: usize) {
        self.widen_for(at);
        match self {
            Starts::Narrow(v) => v.push(at as u32),
            Starts::Wide(v) => v.push(at as u64),
        }
    }
}

impl SealedPaths {
    /// How many paths it holds.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.starts.len() == 0
    }

    /// The state of `path`, if it is held.
    pub fn get(&self, path: &[u8]) -> Option<AfterState> {
        self.names.index_of(path).map(|i| self.state(i).0)
    }

    /// The state at index `i`, and how many bytes it is packed in.
    fn state(&self, i: usize) -> (AfterState, usize) {
        let at = self.starts.get(i);
        // Only `pack` wrote these bytes. Were they ever not a state, the path would be taken
        // for one no real node matches, so changed since the seal (left alone, and named),
        // never for absent or unchanged.
        let unknown = AfterState::Other { ident: Ident { dev: u64::MAX, ino: u64::MAX }, mode: 0 };
        packed::unpack(self.packed.get(at..).unwrap_or_default()).unwrap_or((unknown, 0))
    }

    /// Sets the state of `path`, adding it at the end when it is not held. A state no longer
    /// than the one it replaces takes its place (an undo sets a million created files absent).
    pub fn set(&mut self, path: &[u8], state: AfterState) {
        match self.names.index_of(path) {
            None => {
                std::sync::Arc::make_mut(&mut self.names).insert(path);
                self.push(&state);
            }
            Some(i) => {
                let (_, old) = self.state(i);
                let end = self.packed.len();
                packed::pack(&state, &mut self.packed);
                let new = self.packed.len() - end;
                if new <= old {
                    let at = self.starts.get(i);
                    self.packed.copy_within(end.., at);
                    self.packed.truncate(end);
                } else {
                    self.starts.set(i, end);
                }
            }
        }
    }

    fn push(&mut self, state: &AfterState) {
        self.starts.push(self.packed.len());
        packed::pack(state, &mut self.packed);
    }

    /// Adds `path` with `state` unless it is held already (then the first state stays).
    fn add_first(&mut self, path: &[u8], state: AfterState) {
        if std::sync::Arc::make_mut(&mut self.names).insert(path) {
            self.push(&state);
        }
    }

    /// Every path and its state, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (Vec<u8>, AfterState)> + '_ {
        self.names.iter().enumerate().map(|(i, name)| (name, self.state(i).0))
    }

    /// The index of `path` (the order it was added in), if it is held.
    pub fn index_of(&self, path: &[u8]) -> Option<usize> {
        self.names.index_of(path)
    }

    /// The path at index `i` (see [`SealedPaths::index_of`]), whole.
    pub fn path_at(&self, i: usize) -> Option<Vec<u8>> {
        self.names.get(i)
    }

    /// Its paths, shared (for a reader that marks paths by their index here instead of holding
    /// them again; the indexes are those of [`SealedPaths::index_of`]).
    pub fn names(&self) -> std::sync::Arc<PathSet> {
        self.names.clone()
    }
}

impl FromIterator<(BPath, AfterState)> for SealedPaths {
    fn from_iter<I: IntoIterator<Item = (BPath, AfterState)>>(iter: I) -> Self {
        let mut out = SealedPaths::default();
        for (p, s) in iter {
            out.add_first(p.as_bytes(), s);
        }
        out
    }
}

impl PartialEq for SealedPaths {
    fn eq(&self, other: &SealedPaths) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for SealedPaths {}

impl std::fmt::Debug for SealedPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(|(p, s)| (BPath::new(p), s))).finish()
    }
}

impl Serialize for SealedPaths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(|(p, st)| (BPath::new(p), st)))
    }
}

/// Passes a key that is already a hash (an xxh3 of a path) through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HashedKey(u64);

impl std::hash::Hasher for HashedKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

fn xxh3_of(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

impl Seal {
    /// The sealed after-state of a path.
    pub fn state_of(&self, path: &BPath) -> Option<AfterState> {
        self.paths.get(path.as_bytes())
    }

    /// Sets the after-state of `path` (an undo that changed it makes what it left the state
    /// later changes are measured against).
    pub fn set_state(&mut self, path: &BPath, state: AfterState) {
        self.paths.set(path.as_bytes(), state);
    }

    /// Writes the seal into `session_dir`, atomically and durably (an undo's, which a rerun
    /// after a crash relies on).
    pub fn write(&self, session_dir: &Path) -> io::Result<()> {
        self.write_as(session_dir, crate::session::Durability::OnDisk)
    }

    /// Writes the seal into `session_dir`, atomically, as durably as `durability` says,
    /// serialized as it is written.
    pub fn write_as(&self, session_dir: &Path, durability: crate::session::Durability) -> io::Result<()> {
        crate::session::write_atomically_as(&session_dir.join(SEAL_FILE), durability, |w| {
            serde_json::to_writer(w, self).map_err(io::Error::other)
        })
    }

    /// Reads a session's seal, if it has one.
    pub fn read(session_dir: &Path) -> io::Result<Option<Seal>> {
        // Parsed as it is read: a seal of a million paths is 200 MB of text, which need not
        // be held beside what it parses into.
        match std::fs::File::open(session_dir.join(SEAL_FILE)) {
            Ok(f) => {
                serde_json::from_reader(io::BufReader::with_capacity(1 << 20, f)).map(Some).map_err(io::Error::other)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// [`take_seal`] without hashing the store's linked blobs: only the state of each of `touched`
/// (its records' paths; `through` the seq of the last), without looking at those the caller
/// knows it left `absent` (an undo's own removals).
pub fn take_seal_of_paths(touched: Vec<BPath>, through: u64, absent: impl Fn(&[u8]) -> bool + Sync) -> Seal {
    let mut paths = SealedPaths::default();
    // In slices, each packed as it comes: the states of a million paths at once were 104 MB,
    // the peak of an undo of a million removals.
    for slice in touched.chunks(1 << 12) {
        let states = in_parallel(slice, |p| {
            if absent(p.as_bytes()) {
                return Some(AfterState::Absent);
            }
            AfterState::of_sealing(p.as_bytes()).ok()
        });
        for (p, s) in slice.iter().zip(states) {
            if let Some(s) = s {
                paths.add_first(p.as_bytes(), s);
            }
        }
    }
    drop(touched);
    forget_parent();
    Seal {
        version: SEAL_VERSION,
        sealed: crate::session::now_rfc3339_seconds(),
        through,
        paths,
        blob_hashes: BTreeMap::new(),
        blob_stats: BTreeMap::new(),
        blob_intact: Default::default(),
        journal_digest: None,
    }
}

/// A linked or cloned capture (or a copy reused by identity), which was not hashed when it was
/// made: its blob, size, how it was captured and the captured mtime.
type Unhashed = (String, u64, CaptureHow, [i64; 2]);

/// What a seal needs of the records one reader saw: every record's `seq` (to set aside those
/// no writer handed out, as [`JournalContents::set_aside_unaccounted`] does), the paths each
/// touches and the unhashed blobs each holds, with its `seq`. The rest of a record is dropped
/// as it is read: a million records held whole were most of what `run` kept after its command.
/// A path is kept as its directory (each held once) and its last name, the names end to end
/// in one buffer: a million files made in a few directories keep little more than their names
/// (`run`'s peak for a million creations at 55 bytes a path: 127 MB when each path was kept
/// whole).
#[derive(Default)]
pub struct Gathered {
    seqs: Vec<u64>,
    dirs: Dirs,
    names: Vec<u8>,
    paths: Vec<Touch>,
    unhashed: Vec<(u64, Unhashed)>,
}

/// One path a record touched: `2 * seq` (a rename's destination `2 * seq + 1`, so that sorting
/// by it is record order), its directory, and where its last name is in the names buffer.
#[derive(Clone, Copy)]
struct Touch {
    key: u64,
    start: u64,
    len: u32,
    dir: u32,
}

impl Touch {
    fn name<'a>(&self, names: &'a [u8]) -> &'a [u8] {
        let start = usize::try_from(self.start).unwrap_or(usize::MAX);
        names.get(start..start.saturating_add(self.len as usize)).unwrap_or_default()
    }
}

/// The directory parts of paths (each up to and including its last `/`, so that the part and
/// the name after it are the path's exact bytes), each kept once, by an id.
#[derive(Default)]
struct Dirs {
    bytes: Vec<u8>,
    spans: Vec<(u64, u32)>,
    by_hash: std::collections::HashMap<u64, u32, std::hash::BuildHasherDefault<HashedKey>>,
    /// Directories whose hash an earlier, different one already has.
    collided: std::collections::HashMap<Vec<u8>, u32>,
}

impl Dirs {
    /// The id of `dir`, given it if it is new.
    fn id(&mut self, dir: &[u8]) -> u32 {
        self.id_hashed(dir, xxh3_of(dir))
    }

    /// [`Dirs::id`], with `dir`'s hash.
    fn id_hashed(&mut self, dir: &[u8], hash: u64) -> u32 {
        match self.by_hash.get(&hash) {
            Some(&id) if self.get(id) == dir => id,
            Some(_) => match self.collided.get(dir) {
                Some(&id) => id,
                None => {
                    let id = self.push(dir);
                    self.collided.insert(dir.to_vec(), id);
                    id
                }
            },
            None => {
                let id = self.push(dir);
                self.by_hash.insert(hash, id);
                id
            }
        }
    }

    fn push(&mut self, dir: &[u8]) -> u32 {
        let id = u32::try_from(self.spans.len()).unwrap_or(u32::MAX);
        self.spans.push((self.bytes.len() as u64, u32::try_from(dir.len()).unwrap_or(u32::MAX)));
        self.bytes.extend_from_slice(dir);
        id
    }

    fn get(&self, id: u32) -> &[u8] {
        let Some(&(start, len)) = self.spans.get(id as usize) else { return &[] };
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        self.bytes.get(start..start.saturating_add(len as usize)).unwrap_or_default()
    }
}

/// `path` split after its last `/`: the directory part (empty when there is none) and the name.
fn split_dir(path: &[u8]) -> (&[u8], &[u8]) {
    let at = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    path.split_at(at)
}

impl Gathered {
    /// Room for `records` records and their paths (reserved, not filled: see
    /// [`crate::journal::records_per_reader`]; buffers grown as they filled left the allocator
    /// a copy of every size they passed through).
    pub fn with_capacity(records: usize) -> Self {
        Gathered {
            seqs: Vec::with_capacity(records),
            dirs: Dirs::default(),
            names: Vec::with_capacity(records.saturating_mul(16)),
            paths: Vec::with_capacity(records),
            unhashed: Vec::new(),
        }
    }

    fn touch(&mut self, key: u64, path: &BPath) {
        let (dir, name) = split_dir(path.as_bytes());
        let dir = self.dirs.id(dir);
        // A path is shorter than 4 GiB (the kernel's limit is 4 KiB a call).
        let len = u32::try_from(name.len()).unwrap_or(u32::MAX);
        self.paths.push(Touch { key, start: self.names.len() as u64, len, dir });
        self.names.extend_from_slice(&name[..len as usize]);
    }

    /// Keeps what the seal needs of `r`.
    pub fn take(&mut self, r: &Record) {
        self.seqs.push(r.seq);
        let mut blob = |before: &Before| {
            if let Before::Contents(s) = before
                && let Node::File { blob, size, hash: None, how, .. } = &s.node
            {
                self.unhashed.push((r.seq, (blob.clone(), *size, *how, s.mtime)));
            }
        };
        match &r.op {
            Op::Change { path, before } => {
                blob(before);
                self.touch(2 * r.seq, path);
            }
            Op::Rename(m) => {
                blob(&m.to_before);
                self.touch(2 * r.seq, &m.from);
                self.touch(2 * r.seq + 1, &m.to);
            }
            Op::Meta { path, .. } => self.touch(2 * r.seq, path),
            _ => {}
        }
    }
}

/// What the records of a session touched, for its seal.
struct Touched {
    /// The directory parts of every path.
    dirs: Dirs,
    /// The last names of every path.
    names: Vec<u8>,
    /// Every path, once, in the order of the first record that touches it.
    paths: Vec<Touch>,
    /// The unhashed blobs, once each, in record order.
    unhashed: Vec<Unhashed>,
    /// The newest record's `seq`.
    through: u64,
    /// How many records there are.
    records: usize,
}

impl Touched {
    fn path(&self, t: &Touch) -> BPath {
        let dir = self.dirs.get(t.dir);
        let name = t.name(&self.names);
        let mut p = Vec::with_capacity(dir.len() + name.len());
        p.extend_from_slice(dir);
        p.extend_from_slice(name);
        BPath::new(p)
    }
}

/// Puts together what every reader gathered, leaving out the records whose `seq` no writer
/// handed out (above `last_id`, the counter read after the records, or held twice).
fn touched_of(parts: Vec<Gathered>, last_id: Option<u64>) -> Touched {
    // Into the largest reader's room, reserved for the rest first (growing as they came
    // left the allocator a copy of each smaller one).
    let mut parts = parts;
    parts.sort_by_key(|g| std::cmp::Reverse(g.names.len()));
    let mut all = parts.first_mut().map(std::mem::take).unwrap_or_default();
    all.seqs.reserve_exact(parts.iter().skip(1).map(|g| g.seqs.len()).sum());
    all.paths.reserve_exact(parts.iter().skip(1).map(|g| g.paths.len()).sum());
    all.names.reserve_exact(parts.iter().skip(1).map(|g| g.names.len()).sum());
    for g in parts.iter_mut().skip(1) {
        let base = all.names.len() as u64;
        // The other reader's directory ids, as the first reader's table has them.
        let ids: Vec<u32> = (0..g.dirs.spans.len() as u32).map(|id| all.dirs.id(g.dirs.get(id))).collect();
        all.seqs.append(&mut g.seqs);
        all.names.append(&mut g.names);
        all.paths.extend(g.paths.drain(..).map(|t| Touch {
            start: t.start + base,
            dir: ids.get(t.dir as usize).copied().unwrap_or(u32::MAX),
            ..t
        }));
        all.unhashed.append(&mut g.unhashed);
    }
    drop(parts);
    let Gathered { mut seqs, dirs, names, mut paths, mut unhashed } = all;
    seqs.sort_unstable();
    let twice: std::collections::HashSet<u64> = seqs.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect();
    let accounted = |seq: u64| last_id.is_none_or(|last| seq <= last) && !twice.contains(&seq);
    let records = seqs.iter().filter(|&&q| accounted(q)).count();
    let through = seqs.iter().rev().copied().find(|&q| accounted(q)).unwrap_or(0);
    drop(seqs);
    paths.retain(|t| accounted(t.key / 2));
    // Each path's first record: sorted by path (its directory, then its name; then record),
    // the first of each run of one path is kept, and the rest sorted back into record order.
    // In place: a set of a million paths was a fifth of what the seal held.
    paths.sort_unstable_by(|a, b| (a.dir, a.name(&names), a.key).cmp(&(b.dir, b.name(&names), b.key)));
    paths.dedup_by(|later, first| later.dir == first.dir && later.name(&names) == first.name(&names));
    paths.sort_unstable_by_key(|t| t.key);
    unhashed.retain(|(q, _)| accounted(*q));
    unhashed.sort_by_key(|(q, _)| *q);
    // Each blob once, at its first record (its name borrowed, not copied, to find the others).
    let first: Vec<bool> = {
        let mut seen = std::collections::HashSet::with_capacity(unhashed.len());
        unhashed.iter().map(|(_, u)| seen.insert(u.0.as_str())).collect()
    };
    let mut first = first.into_iter();
    unhashed.retain(|_| first.next().unwrap_or(false));
    let unhashed = unhashed.into_iter().map(|(_, u)| u).collect();
    Touched { dirs, names, paths, unhashed, through, records }
}

/// What each unhashed blob is now (an `lstat` each, not its bytes: hashing them was most of
/// what `run` did after an `rm -rf`), which undo compares with the blob before it trusts it;
/// and whether a linked one is still as captured. One entry per blob of `unhashed`, in its
/// order (`None`: the blob cannot be looked at, as every blob of a store whose blobs
/// directory cannot be opened): they are written from there, not gathered into maps first.
fn blob_stats_of(
    unhashed: &[Unhashed],
    blobs_dir: &Path,
    progress: &(impl Fn() + Sync),
) -> Vec<Option<(BlobStat, bool)>> {
    let blobs = rustix::fs::open(blobs_dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok();
    let stats = in_parallel(unhashed, |(blob, size, how, mtime)| {
        let out = blobs
            .as_ref()
            .and_then(|dir| rustix::fs::statat(dir, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok())
            .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
            .map(|st| {
                let stat = BlobStat::of(&st);
                (stat, *how != CaptureHow::Link || (stat.size == *size && stat.mtime == *mtime))
            });
        progress();
        Some(out)
    });
    stats.into_iter().map(Option::flatten).collect()
}

/// [`Seal::blob_stats`] as written: a map from each blob found to its state, in the order of
/// their names (as a map of them would write them).
struct BlobStatsAsWritten<'a> {
    unhashed: &'a [Unhashed],
    stats: &'a [Option<(BlobStat, bool)>],
    /// The blobs found (indices into both), by name.
    order: Vec<usize>,
}

impl<'a> BlobStatsAsWritten<'a> {
    fn new(unhashed: &'a [Unhashed], stats: &'a [Option<(BlobStat, bool)>]) -> Self {
        let mut order: Vec<usize> = (0..stats.len()).filter(|&i| stats[i].is_some()).collect();
        order.sort_unstable_by(|&a, &b| unhashed[a].0.cmp(&unhashed[b].0));
        BlobStatsAsWritten { unhashed, stats, order }
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Each blob found, by name, with its state and whether it is intact.
    fn found(&self) -> impl Iterator<Item = (&'a String, (BlobStat, bool))> + '_ {
        self.order.iter().filter_map(|&i| Some((&self.unhashed[i].0, self.stats[i]?)))
    }
}

impl Serialize for BlobStatsAsWritten<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.found().map(|(blob, (stat, _))| (blob, stat)))
    }
}

/// [`Seal::blob_intact`] as written: the names of the blobs found intact, in order.
struct BlobsIntactAsWritten<'a>(&'a BlobStatsAsWritten<'a>);

impl Serialize for BlobsIntactAsWritten<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.found().filter(|(_, (_, intact))| *intact).map(|(blob, _)| blob))
    }
}

/// The state of `path` for the seal (`None`: it cannot be read, and undo checks it the
/// weaker way).
fn sealed_state(path: &BPath, progress: &(impl Fn() + Sync)) -> Option<AfterState> {
    let state = AfterState::of_sealing(path.as_bytes()).ok();
    progress();
    state
}

/// Takes the seal of a session whose processes have all ended: the after-state of every path
/// it touched, and the state of its unhashed blobs. `progress` is called once per item, from
/// whichever thread did it: the work is spread over the machine's CPUs (a seal reads and
/// hashes every file the session touched).
pub fn take_seal(journal: &JournalContents, blobs_dir: &Path, progress: impl Fn() + Sync) -> Seal {
    let mut g = Gathered::default();
    for r in &journal.records {
        g.take(r);
    }
    let touched = touched_of(vec![g], None);
    let paths: Vec<BPath> = touched.paths.iter().map(|t| touched.path(t)).collect();
    let states = in_parallel(&paths, |p| sealed_state(p, &progress));
    forget_parent();
    let stats = blob_stats_of(&touched.unhashed, blobs_dir, &progress);
    let blobs = BlobStatsAsWritten::new(&touched.unhashed, &stats);
    let blob_stats = blobs.found().map(|(blob, (stat, _))| (blob.clone(), stat)).collect();
    let blob_intact = blobs.found().filter(|(_, (_, intact))| *intact).map(|(blob, _)| blob.clone()).collect();
    Seal {
        version: SEAL_VERSION,
        sealed: crate::session::now_rfc3339_seconds(),
        through: touched.through,
        paths: paths.into_iter().zip(states).filter_map(|(p, s)| s.map(|s| (p, s))).collect(),
        blob_hashes: BTreeMap::new(),
        blob_stats,
        blob_intact,
        journal_digest: None,
    }
}

/// How many paths the seal looks at together: their states are written as they are found, so
/// that a seal of a million paths is never held whole.
const SEAL_CHUNK: usize = 1 << 14;

/// A seal's paths, found a chunk at a time as they are written.
struct StatesAsWritten<'a, F> {
    touched: &'a Touched,
    progress: &'a F,
}

impl<F: Fn() + Sync> Serialize for StatesAsWritten<'_, F> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(None)?;
        for chunk in self.touched.paths.chunks(SEAL_CHUNK) {
            let paths: Vec<BPath> = chunk.iter().map(|t| self.touched.path(t)).collect();
            let states = in_parallel(&paths, |p| sealed_state(p, self.progress));
            for (p, state) in paths.iter().zip(states) {
                if let Some(state) = state {
                    seq.serialize_element(&(p, &state))?;
                }
            }
        }
        forget_parent();
        seq.end()
    }
}

/// [`Seal`] as written, its paths looked at while they are written (the same fields in the
/// same order: a reader cannot tell it from a [`Seal`] serialized whole).
#[derive(Serialize)]
#[serde(bound = "")]
struct SealAsWritten<'a, F: Fn() + Sync> {
    version: u32,
    sealed: &'a str,
    through: u64,
    paths: StatesAsWritten<'a, F>,
    blob_hashes: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BlobStatsAsWritten::is_empty")]
    blob_stats: &'a BlobStatsAsWritten<'a>,
    blob_intact: BlobsIntactAsWritten<'a>,
    journal_digest: &'a JournalDigest,
}

/// Seals a session from its journal without holding its records or its seal whole: what
/// every reader of its records gathered (`parts`, [`Gathered`]), the counter read after them,
/// the digest of the journal's files taken after them, the session's store of blobs; written
/// to `session_dir` as durably as asked. `progress` is called once per path and per unhashed
/// blob. Returns how many records the seal covers.
pub fn seal_streamed(
    parts: Vec<Gathered>,
    last_id: Option<u64>,
    journal_digest: &JournalDigest,
    session_dir: &Path,
    blobs_dir: &Path,
    durability: crate::session::Durability,
    progress: impl Fn() + Sync,
) -> io::Result<usize> {
    let touched = touched_of(parts, last_id);
    let stats = blob_stats_of(&touched.unhashed, blobs_dir, &progress);
    let blobs = BlobStatsAsWritten::new(&touched.unhashed, &stats);
    let sealed = crate::session::now_rfc3339_seconds();
    let seal = SealAsWritten {
        version: SEAL_VERSION,
        sealed: &sealed,
        through: touched.through,
        paths: StatesAsWritten { touched: &touched, progress: &progress },
        blob_hashes: BTreeMap::new(),
        blob_stats: &blobs,
        blob_intact: BlobsIntactAsWritten(&blobs),
        journal_digest,
    };
    crate::session::write_atomically_as(&session_dir.join(SEAL_FILE), durability, |w| {
        // serde_json writes token by token: into a buffer it can see the type of, not through
        // `dyn Write` (a call through the vtable for every token of every path).
        let mut out = io::BufWriter::with_capacity(1 << 16, w);
        serde_json::to_writer(&mut out, &seal).map_err(io::Error::other)?;
        io::Write::flush(&mut out)
    })?;
    Ok(touched.records)
}

/// What each of `paths` is now, looked at on every CPU, each directory opened once: for a
/// caller that changes none of them meanwhile (undo's check of every path before it acts).
/// `None` for a path `seal` holds as a regular file that its `lstat` alone shows unchanged
/// ([`AfterState::unchanged_by_stat`]): it is not read.
pub fn states_of(paths: &[&BPath], seal: Option<&Seal>) -> Vec<Option<io::Result<AfterState>>> {
    let states = in_parallel(paths, |p| {
        if seal.and_then(|s| s.state_of(p)).is_some_and(|s| s.unchanged_by_stat(p.as_bytes())) {
            return Some(None);
        }
        Some(Some(AfterState::of_sealing(p.as_bytes())))
    });
    forget_parent();
    states
        .into_iter()
        .map(|s| s.unwrap_or_else(|| Some(Err(io::Error::other("the check of this path panicked")))))
        .collect()
}

/// Closes the directory [`AfterState::of_sealing`] keeps open on this thread.
fn forget_parent() {
    PARENT.with(|cell| cell.borrow_mut().take());
}

/// `f` of every item, in order, computed on as many threads as the machine has CPUs (`None`
/// for the items of a thread that panicked: they are left out, the rest are not misplaced).
pub(crate) fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> Option<R> + Sync) -> Vec<Option<R>> {
    let threads = crate::journal::cpus().min(8);
    if threads == 1 || items.len() < 64 {
        return items.iter().map(&f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = items
            .chunks(chunk)
            .map(|c| (c.len(), scope.spawn(|| c.iter().map(&f).collect::<Vec<Option<R>>>())))
            .collect();
        parts
            .into_iter()
            .flat_map(|(n, h)| h.join().unwrap_or_else(|_| std::iter::repeat_with(|| None).take(n).collect()))
            .collect()
    })
}

/// What an unsealed session's newest record on a path allows that path to be now. A record does
/// not say whether its call succeeded, so both outcomes are allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// Nothing can be said (a create: absent if it failed, anything if it succeeded).
    Unknown,
    /// The path may be one of these inodes (any, when empty), or absent when allowed.
    Allowed {
        /// Identities it may have.
        idents: Vec<Ident>,
        /// Whether it may be absent.
        may_be_absent: bool,
    },
}

/// For every path the journal names, the expectation the newest record touching it implies
/// (the weaker check for unsealed sessions), in one pass over the records. A path whose newest
/// record an earlier undo reversed (`undone`) is `Unknown`: that undo may have made it anew.
/// Only paths some record allows something for are held (a path missing is `Unknown`): a
/// million creations otherwise made a map of a million unknowns.
pub fn expectations<'a>(
    journal: &'a JournalContents,
    undone: &crate::undo::SeqSet,
) -> std::collections::HashMap<&'a BPath, Expectation> {
    let ident_of_before = |b: &Before| match b {
        Before::Contents(s) => Some(s.ident),
        _ => None,
    };
    let exchange =
        |flags: u32| rustix::fs::RenameFlags::from_bits_retain(flags).contains(rustix::fs::RenameFlags::EXCHANGE);
    // The paths some record may allow something for.
    let allowing: std::collections::HashSet<&BPath> = journal
        .records
        .iter()
        .filter(|r| !undone.contains(&r.seq))
        .flat_map(|r| match &r.op {
            Op::Change { path, before } if ident_of_before(before).is_some() => vec![path],
            Op::Meta { path, .. } => vec![path],
            Op::Rename(m) if !exchange(m.flags) => vec![&m.from, &m.to],
            _ => vec![],
        })
        .collect();
    let mut out = std::collections::HashMap::new();
    let mut put = |p: &'a BPath, e: &dyn Fn() -> Expectation| {
        if allowing.contains(p) {
            out.entry(p).or_insert_with(e);
        }
    };
    // Newest first: the first record met for a path is the one that counts.
    for r in journal.records.iter().rev() {
        if undone.contains(&r.seq) {
            for p in crate::select::record_paths(r) {
                put(p, &|| Expectation::Unknown);
            }
            continue;
        }
        match &r.op {
            Op::Change { path, before } => put(path, &|| match ident_of_before(before) {
                // Written in place (same inode), removed, or the call failed (same inode);
                // or, for a file moved aside, the empty twin left in its place.
                Some(id) => {
                    let mut idents = vec![id];
                    if let Before::Contents(snap) = before
                        && let Node::File { twin: Some(t), .. } = &snap.node
                    {
                        idents.push(*t);
                    }
                    Expectation::Allowed { idents, may_be_absent: true }
                }
                None => Expectation::Unknown,
            }),
            Op::Meta { path, before } => {
                put(path, &|| Expectation::Allowed { idents: vec![before.ident], may_be_absent: false })
            }
            Op::Rename(m) => {
                let crate::record::RenameOp { from, to, moved, flags, to_before } = &**m;
                if exchange(*flags) {
                    put(to, &|| Expectation::Unknown);
                    put(from, &|| Expectation::Unknown);
                    continue;
                }
                let moved: Vec<Ident> = moved.iter().copied().collect();
                put(to, &|| {
                    let mut idents = moved.clone();
                    idents.extend(ident_of_before(to_before));
                    Expectation::Allowed { idents, may_be_absent: ident_of_before(to_before).is_none() }
                });
                put(from, &|| Expectation::Allowed { idents: moved.clone(), may_be_absent: true });
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seals_offsets_take_four_bytes_each_until_one_does_not_fit_and_then_keep_their_values() {
        let mut starts = Starts::default();
        starts.push(0);
        starts.push(7);
        assert!(matches!(starts, Starts::Narrow(_)), "small offsets are four bytes each");
        let far = u32::MAX as usize + 10;
        starts.set(0, far);
        starts.push(far + 1);
        assert!(matches!(starts, Starts::Wide(_)));
        assert_eq!((0..3).map(|i| starts.get(i)).collect::<Vec<_>>(), [far, 7, far + 1]);
        assert_eq!(starts.len(), 3);
    }

    #[test]
    fn each_directory_of_the_seals_paths_is_kept_once_under_one_id_even_when_hashes_collide() {
        let mut dirs = Dirs::default();
        let (a, b) = (dirs.id_hashed(b"/t/a/", 7), dirs.id_hashed(b"/t/b/", 7));
        assert_ne!(a, b, "two directories, one hash");
        assert_eq!((dirs.id_hashed(b"/t/a/", 7), dirs.id_hashed(b"/t/b/", 7)), (a, b));
        assert_eq!((dirs.get(a), dirs.get(b)), (&b"/t/a/"[..], &b"/t/b/"[..]));
        assert_eq!(dirs.spans.len(), 2, "each kept once");
        assert_eq!(split_dir(b"/t/a/f"), (&b"/t/a/"[..], &b"f"[..]));
        assert_eq!(split_dir(b"f"), (&b""[..], &b"f"[..]));
        assert_eq!(split_dir(b"/t/a/"), (&b"/t/a/"[..], &b""[..]));
    }

    #[test]
    fn the_seal_written_as_records_are_read_is_the_seal_of_the_journal_read_whole() {
        use crate::journal::{encode_line, read_with_segments, visit_with_segments};
        use crate::record::{Snapshot, Stamp, Version};
        let t = tempfile::tempdir().unwrap();
        let (tree, store) = (t.path().join("tree"), t.path().join("store"));
        let blobs = store.join("blobs");
        std::fs::create_dir_all(blobs.join("01")).unwrap();
        std::fs::create_dir_all(store.join("segments")).unwrap();
        std::fs::create_dir(&tree).unwrap();
        std::fs::write(blobs.join("01/1"), b"kept").unwrap();
        // A second blob, captured after the first but named before it: the seal writes its
        // blobs by name, as a map of them would.
        std::fs::create_dir_all(blobs.join("00")).unwrap();
        std::fs::write(blobs.join("00/256"), b"cloned").unwrap();
        let path = |name: &str| BPath::from(tree.join(name).to_str().unwrap());
        for (name, body) in [("a", "1"), ("c", "22"), ("d", "333")] {
            std::fs::write(tree.join(name), body).unwrap();
        }
        let kept = Snapshot {
            node: Node::File { blob: "01/1".into(), size: 4, hash: None, how: CaptureHow::Link, twin: None },
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: [1, 2],
            atime: [1, 2],
            ident: Ident { dev: 1, ino: 1 },
            xattrs: None,
            links: 1,
        };
        let cloned = Snapshot {
            node: Node::File { blob: "00/256".into(), size: 6, hash: None, how: CaptureHow::Reflink, twin: None },
            ..kept.clone()
        };
        let rec = |seq: u64, op: Op| Record {
            v: Version,
            seq,
            time: Stamp::parse("2026-12-01T00:00:00.000000000Z").unwrap(),
            pid: 1,
            ppid: 0,
            origin: crate::record::Origin::new(BPath::from("/bin/sh"), "c".into()),
            op,
        };
        let main = [
            rec(1, Op::Change { path: path("a"), before: Before::Absent }),
            rec(4, Op::Change { path: path("gone"), before: Before::contents(kept.clone()) }),
            // Held twice: neither is sealed.
            rec(6, Op::Change { path: path("twice"), before: Before::Absent }),
            // Above the counter (8): not sealed, and not the seal's newest record.
            rec(9, Op::Change { path: path("forged"), before: Before::Absent }),
        ];
        let segment = [
            // In another directory, met first by this reader: its directories are numbered
            // otherwise than the main file's reader numbers them.
            rec(
                2,
                Op::Rename(Box::new(crate::record::RenameOp {
                    from: path("sub/b"),
                    to: path("c"),
                    flags: 0,
                    moved: None,
                    to_before: Before::Absent,
                })),
            ),
            rec(3, Op::Change { path: path("a"), before: Before::Born { created: 1 } }),
            rec(
                5,
                Op::Exec(Box::new(crate::record::ExecOp {
                    program: BPath::from("/bin/true"),
                    argv: Default::default(),
                    cwd: BPath::from("/"),
                    child: None,
                })),
            ),
            rec(6, Op::Change { path: path("d"), before: Before::Absent }),
            rec(7, Op::Change { path: path("d"), before: Before::contents(cloned) }),
        ];
        let lines = |rs: &[Record]| rs.iter().flat_map(encode_line).collect::<Vec<u8>>();
        std::fs::write(store.join("journal"), lines(&main)).unwrap();
        std::fs::write(store.join("segments/1-2"), lines(&segment)).unwrap();
        let (journal, segments) = (store.join("journal"), store.join("segments"));

        let mut whole = read_with_segments(&journal, &segments).unwrap();
        whole.set_aside_unaccounted(Some(8));
        let expected = take_seal(&whole, &blobs, || {});
        let (parts, _) = visit_with_segments(&journal, &segments, Gathered::default, |g, r| g.take(&r)).unwrap();
        let mut digest = JournalDigest::take(&store, true).unwrap();
        digest.write_lines(&store, crate::session::Durability::InKernel).unwrap();
        let records =
            seal_streamed(parts, Some(8), &digest, &store, &blobs, crate::session::Durability::InKernel, || {})
                .unwrap();
        assert_eq!(records, whole.records.len());
        let text = std::fs::read_to_string(store.join(SEAL_FILE)).unwrap();
        let got = Seal::read(&store).unwrap().unwrap();
        let sealed: Vec<BPath> = got.paths.iter().map(|(p, _)| BPath::new(p)).collect();
        assert_eq!(sealed, [path("a"), path("sub/b"), path("c"), path("gone"), path("d")]);
        assert_eq!((got.through, &got.paths), (7, &expected.paths));
        assert!(got.blob_stats.contains_key("01/1") && got.blob_stats.contains_key("00/256"));
        assert_eq!(got.blob_stats, expected.blob_stats);
        assert_eq!(got.blob_intact, expected.blob_intact);
        assert_eq!(got.journal_digest.as_ref(), Some(&digest));
        let written_whole =
            serde_json::to_string(&Seal { sealed: got.sealed.clone(), journal_digest: Some(digest), ..expected })
                .unwrap();
        assert_eq!(text.trim_end(), written_whole, "a reader cannot tell the two apart");
    }

    #[test]
    fn a_seal_reads_the_same_whether_its_kinds_come_first_or_last_and_keeps_a_stamp_as_written() {
        // The writer puts `kind` first (read without buffering); any other order goes the
        // derived way. Both must give the same seal, for every kind of state.
        let ident = Ident { dev: 1, ino: 2 };
        let states = [
            AfterState::Absent,
            AfterState::File {
                ident,
                size: 3,
                hash: blake3::hash(b"abc").into(),
                mode: 0o644,
                uid: 1,
                gid: 2,
                ctime: Some([5, 6]),
            },
            AfterState::File {
                ident,
                size: 4,
                hash: ContentDigest::parse("unreadable:4:1.2:3.4"),
                mode: 0o600,
                uid: 0,
                gid: 0,
                ctime: None,
            },
            AfterState::Dir { ident, mode: 0o755, uid: 3, gid: 4 },
            AfterState::Symlink { target: BPath::new(b"t\xff".to_vec()) },
            AfterState::Other { ident, mode: 0o600 },
        ];
        let seal = Seal {
            version: SEAL_VERSION,
            sealed: "2026-12-01T00:00:00Z".into(),
            through: 9,
            paths: states
                .iter()
                .enumerate()
                .map(|(i, s)| (BPath::from(format!("/p{i}").as_str()), s.clone()))
                .collect(),
            blob_hashes: BTreeMap::new(),
            blob_stats: BTreeMap::new(),
            blob_intact: Default::default(),
            journal_digest: None,
        };
        let first = serde_json::to_string(&seal).unwrap();
        assert!(first.contains(r#""hash":"unreadable:4:1.2:3.4""#), "{first}");
        assert!(first.contains(&format!(r#""hash":"{}""#, blake3::hash(b"abc").to_hex())), "{first}");
        let mut v = serde_json::to_value(&seal).unwrap();
        for entry in v["paths"].as_array_mut().unwrap() {
            let map = entry[1].as_object_mut().unwrap();
            let kind = map.remove("kind").unwrap();
            map.insert("kind".into(), kind);
        }
        let last = serde_json::to_string(&v).unwrap();
        assert_ne!(first, last);
        for text in [&first, &last] {
            let back: Seal = serde_json::from_str(text).unwrap();
            assert_eq!(back.paths, seal.paths, "{text}");
        }
        // What the derived reading refuses, the tag-first one refuses too.
        let missing = r#"{"version":1,"sealed":"","paths":[["/x",{"kind":"file","size":1}]],"blob_hashes":{}}"#;
        let err = serde_json::from_str::<Seal>(missing).unwrap_err().to_string();
        assert!(err.contains("missing field `ident`"), "{err}");
    }

    #[test]
    fn a_seal_finds_every_path_keeps_the_first_of_a_repeated_one_and_adds_new_ones_at_the_end() {
        let paths: Vec<(BPath, AfterState)> = [&b"/a"[..], b"/b", b"/a", b"/c", b"/b\xff"]
            .iter()
            .enumerate()
            .map(|(i, p)| (BPath::from(*p), AfterState::Other { ident: Ident { dev: 0, ino: i as u64 }, mode: 0 }))
            .collect();
        let mut seal = Seal { paths: paths.iter().cloned().collect(), ..Default::default() };
        let ino = |seal: &Seal, p: &[u8]| match seal.state_of(&BPath::from(p)) {
            Some(AfterState::Other { ident, .. }) => Some(ident.ino),
            None => None,
            other => panic!("{other:?}"),
        };
        assert_eq!(ino(&seal, b"/a"), Some(0), "the first of a repeated path");
        assert_eq!((ino(&seal, b"/b"), ino(&seal, b"/c"), ino(&seal, b"/b\xff")), (Some(1), Some(3), Some(4)));
        assert_eq!(ino(&seal, b"/d"), None);
        assert_eq!(seal.paths.len(), 4);
        seal.set_state(&BPath::from("/e"), AfterState::Absent);
        seal.set_state(&BPath::from("/a"), AfterState::Absent);
        assert_eq!(seal.state_of(&BPath::from("/e")), Some(AfterState::Absent));
        assert_eq!(seal.state_of(&BPath::from("/a")), Some(AfterState::Absent));
        // A state longer than the one it replaces does not overwrite its neighbour's.
        let file = AfterState::File {
            ident: Ident { dev: 1, ino: 1 << 40 },
            size: 1 << 33,
            hash: ContentDigest::Blake3([9; 32]),
            mode: 0o100644,
            uid: 1000,
            gid: 1000,
            ctime: Some([1_796_324_070, 916_093_556]),
        };
        seal.set_state(&BPath::from("/a"), file.clone());
        assert_eq!(seal.state_of(&BPath::from("/a")), Some(file));
        assert_eq!((ino(&seal, b"/b"), ino(&seal, b"/c")), (Some(1), Some(3)));
        let order: Vec<BPath> = seal.paths.iter().map(|(p, _)| BPath::new(p)).collect();
        assert_eq!(order, [&b"/a"[..], b"/b", b"/c", b"/b\xff", b"/e"].map(BPath::from));
        // Written and read back as the same list.
        let back: Seal = serde_json::from_str(&serde_json::to_string(&seal).unwrap()).unwrap();
        assert_eq!(back.paths, seal.paths);
    }

    #[test]
    fn names_in_a_directory_that_is_gone_are_sealed_absent_and_the_next_directory_is_looked_at() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_str().unwrap();
        std::fs::create_dir(t.path().join("kept")).unwrap();
        std::fs::write(t.path().join("kept/f"), b"here").unwrap();
        std::fs::write(t.path().join("file"), b"not a dir").unwrap();
        let paths: Vec<BPath> = ["gone/a", "gone/b", "file/x", "kept/f", "gone/c", "kept/missing"]
            .iter()
            .map(|p| BPath::new(format!("{root}/{p}").into_bytes()))
            .collect();
        let seal = take_seal_of_paths(paths.clone(), 6, |_| false);
        let kind = |p: &BPath| match seal.state_of(p) {
            Some(AfterState::Absent) => "absent",
            Some(AfterState::File { size: 4, .. }) => "file",
            other => panic!("{other:?}"),
        };
        let kinds: Vec<_> = paths.iter().map(kind).collect();
        assert_eq!(kinds, ["absent", "absent", "absent", "file", "absent", "absent"]);
    }

    #[test]
    fn the_newest_record_of_a_path_decides_its_expectation_and_creations_alone_hold_none() {
        let st = rustix::fs::stat("/").unwrap();
        let dir = crate::capture::snapshot_meta(&st, Node::Dir);
        let ident = dir.ident;
        let rec = |seq: u64, op: Op| crate::record::Record {
            v: crate::record::Version,
            seq,
            time: Default::default(),
            pid: 1,
            ppid: 0,
            origin: crate::record::Origin::new(BPath::from("/bin/sh"), "test".into()),
            op,
        };
        let p = |s: &str| BPath::from(s);
        let journal = JournalContents {
            records: vec![
                rec(1, Op::Change { path: p("/w/rewritten-then-made"), before: Before::contents(dir.clone()) }),
                rec(2, Op::Change { path: p("/w/rewritten-then-made"), before: Before::Absent }),
                rec(3, Op::Change { path: p("/w/made"), before: Before::Absent }),
                rec(4, Op::Change { path: p("/w/rewritten"), before: Before::contents(dir.clone()) }),
                rec(5, Op::Change { path: p("/w/undone"), before: Before::contents(dir.clone()) }),
            ],
            ..Default::default()
        };
        let undone = [5].into_iter().collect();
        let e = expectations(&journal, &undone);
        let unknown = |path: &str| e.get(&p(path)).is_none_or(|x| *x == Expectation::Unknown);
        assert!(unknown("/w/rewritten-then-made"), "the newer creation says nothing: {e:?}");
        assert!(unknown("/w/made") && unknown("/w/undone"), "{e:?}");
        assert_eq!(e.get(&p("/w/rewritten")), Some(&Expectation::Allowed { idents: vec![ident], may_be_absent: true }));
        assert!(!e.contains_key(&p("/w/made")), "a path only created is not held: {e:?}");
    }

    #[test]
    fn the_seals_states_are_what_each_path_is_looked_at_alone() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for d in ["a", "a/b", "c"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
            paths.push(t.path().join(d));
            for f in 0..40 {
                let p = t.path().join(d).join(format!("f{f}"));
                std::fs::write(&p, format!("{d} {f}").repeat(f)).unwrap();
                paths.push(p);
            }
        }
        std::os::unix::fs::symlink("a", t.path().join("link")).unwrap();
        paths.push(t.path().join("link"));
        paths.push(t.path().join("missing"));
        // A path through the symlink names the same file as its target's.
        paths.push(t.path().join("link/f3"));
        paths.sort();
        let states = in_parallel(&paths, |p| AfterState::of_sealing(p.as_os_str().as_bytes()).ok());
        forget_parent();
        for (p, s) in paths.iter().zip(states) {
            assert_eq!(s, AfterState::of(p.as_os_str().as_bytes()).ok(), "{}", p.display());
        }
    }

    #[test]
    fn a_file_rewritten_to_the_same_size_and_mtime_is_never_taken_as_unchanged_by_its_stat() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, b"before").unwrap();
        let pb = p.as_os_str().as_bytes();
        let sealed = AfterState::of(pb).unwrap();
        assert!(sealed.unchanged_by_stat(pb), "untouched");
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, b"after!").unwrap();
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(mtime).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().modified().unwrap(), mtime, "same size, same mtime");
        assert!(!sealed.unchanged_by_stat(pb), "its change time moved");
        assert!(sealed.difference(&AfterState::of(pb).unwrap()).unwrap().contains("contents changed"));
    }

    #[test]
    fn after_states_describe_what_changed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, b"one").unwrap();
        use std::os::unix::ffi::OsStrExt;
        let pb = p.as_os_str().as_bytes();
        let sealed = AfterState::of(pb).unwrap();
        assert_eq!(sealed.difference(&AfterState::of(pb).unwrap()), None);
        std::fs::write(&p, b"three").unwrap();
        let d = sealed.difference(&AfterState::of(pb).unwrap()).unwrap();
        assert!(d.contains("contents changed (3 -> 5 bytes)"), "{d}");
        std::fs::remove_file(&p).unwrap();
        let d = sealed.difference(&AfterState::of(pb).unwrap()).unwrap();
        assert!(d.contains("a regular file when the session ended and is nothing now"), "{d}");
    }
}
