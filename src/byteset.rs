//! Sets of byte strings (paths) held in one buffer ([`ByteSet`]), and of paths held as their
//! directories and names ([`PathSet`]): what an undo of a million records keeps of the paths
//! its seal holds and of those it removed and touched.
//!
//! A `HashSet<Vec<u8>>` pays, for each member, a 24-byte `Vec`, an allocation with its
//! allocator header and rounding, and the table's slot: about 100 bytes for a 30-byte path.
//! Here the bytes of every member follow one another in one `Vec<u8>`, a list says where each
//! ends (4 bytes: it starts where the one before ends), and the table holds each member's place
//! in that list (4 bytes), found by the bytes' hash: about 45 bytes a path. A member's place is its index,
//! by which a caller keeps facts about it in a vector of its own.
//!
//! What it cannot do: remove a member (its users mark one instead, by its index), or hold
//! more than 4 GiB of bytes in all (an insertion beyond that panics; an undo's paths are far
//! from it). The hash (xxh3: SipHash was a tenth of a
//! dry run's time) is seeded at random per set, so names chosen to collide cannot make it slow.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the member at `index` is in `bytes`, from where each member ends (members follow
/// one another, so one ends where the next starts).
fn span(ends: &[u32], index: usize) -> Option<std::ops::Range<usize>> {
    let end = *ends.get(index)? as usize;
    let start = index.checked_sub(1).map_or(0, |before| ends[before] as usize);
    Some(start..end)
}

/// A set of byte strings in one buffer (see the module documentation).
#[derive(Clone)]
pub struct ByteSet {
    bytes: Vec<u8>,
    /// Each member's place in `order`, found by the hash of its bytes.
    table: hashbrown::HashTable<u32>,
    /// Where each member's bytes end in `bytes`, in insertion order (it starts where the one
    /// before ends: 4 bytes a member, where a start and a length were 8).
    ends: Vec<u32>,
    seed: u64,
}

impl Default for ByteSet {
    fn default() -> ByteSet {
        ByteSet { bytes: Vec::new(), table: Default::default(), ends: Vec::new(), seed: random_seed() }
    }
}

/// A seed no two sets share (std's per-process random keys, stepped for each).
fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(0u64)
}

fn hash_of(seed: u64, bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed)
}

impl std::fmt::Debug for ByteSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter().map(crate::bpath::BPath::from)).finish()
    }
}

impl ByteSet {
    /// An empty set.
    pub fn new() -> ByteSet {
        ByteSet::default()
    }

    /// How many members it holds.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn member(&self, at: u32) -> &[u8] {
        span(&self.ends, at as usize).map_or(&[][..], |r| &self.bytes[r])
    }

    /// The member at `index` (see [`ByteSet::index_of`]).
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        span(&self.ends, index).map(|r| &self.bytes[r])
    }

    /// Whether `member` is in the set.
    pub fn contains(&self, member: &[u8]) -> bool {
        self.index_of(member).is_some()
    }

    /// Where `member` is in the order of insertion, if it is in the set: an index a caller
    /// may keep facts by, in a vector beside the set.
    pub fn index_of(&self, member: &[u8]) -> Option<usize> {
        let hash = hash_of(self.seed, member);
        self.table.find(hash, |&at| self.member(at) == member).map(|&at| at as usize)
    }

    /// Adds `member`; false when it was in the set already.
    ///
    /// # Panics
    /// When the set's bytes, or its members ever inserted, would pass 4 GiB (or 2^32).
    pub fn insert(&mut self, member: &[u8]) -> bool {
        self.insert_full(member).1
    }

    /// Adds `member`: its [`ByteSet::index_of`], and whether it is new (indexes of new
    /// members count up from 0, one by one).
    ///
    /// # Panics
    /// As [`ByteSet::insert`].
    pub fn insert_full(&mut self, member: &[u8]) -> (usize, bool) {
        let hash = hash_of(self.seed, member);
        let Self { bytes, table, ends, seed } = self;
        let at = |i: &u32| span(ends, *i as usize).map_or(&[][..], |r| &bytes[r]);
        match table.entry(hash, |i| at(i) == member, |i| hash_of(*seed, at(i))) {
            hashbrown::hash_table::Entry::Occupied(o) => (*o.get() as usize, false),
            hashbrown::hash_table::Entry::Vacant(slot) => {
                let too_big = "a ByteSet holds at most 4 GiB of bytes and 2^32 members";
                let end = bytes.len().checked_add(member.len()).and_then(|e| u32::try_from(e).ok()).expect(too_big);
                slot.insert(u32::try_from(ends.len()).expect(too_big));
                ends.push(end);
                bytes.extend_from_slice(member);
                (ends.len() - 1, true)
            }
        }
    }

    /// The members, in the order they were first inserted.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.ends.len()).map(|i| span(&self.ends, i).map_or(&[][..], |r| &self.bytes[r]))
    }
}

/// A set of paths held as a [`ByteSet`] of their directories and a [`ByteSet`] of their last
/// names, each name keyed by its directory's index: a million files made in a few directories
/// keep each directory once, where a [`ByteSet`] of the whole paths keeps it a million times
/// (about 26 bytes a path fewer for the benchmark's 37-byte paths). A path's directory is
/// everything up to and including its last `/` (empty for a bare name), so every path splits
/// one way and is given back byte for byte.
///
/// What it cannot do: beside [`ByteSet`]'s limits, a set whose every path is in a directory of
/// its own holds more than a [`ByteSet`] would (the directory, and 4 bytes of key, per path),
/// and a lookup hashes twice (the directory, then the key).
pub struct PathSet {
    dirs: ByteSet,
    /// Each path as its directory's index (4 bytes, little-endian) and its last name.
    keys: ByteSet,
    /// The directory the last insertion or lookup found ([`NO_DIR`]: none), so that a run of
    /// paths in one directory finds it by one comparison instead of a hash and a probe of a
    /// large table (an atomic, so that threads may look up in one set at once).
    last_dir: AtomicU32,
}

/// No directory ([`PathSet::last_dir`]).
const NO_DIR: u32 = u32::MAX;

impl Default for PathSet {
    fn default() -> PathSet {
        PathSet { dirs: ByteSet::default(), keys: ByteSet::default(), last_dir: AtomicU32::new(NO_DIR) }
    }
}

impl Clone for PathSet {
    fn clone(&self) -> PathSet {
        PathSet { dirs: self.dirs.clone(), keys: self.keys.clone(), last_dir: AtomicU32::new(NO_DIR) }
    }
}

impl std::fmt::Debug for PathSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter().map(crate::bpath::BPath::new)).finish()
    }
}

/// `path` as its directory (up to and including its last `/`) and its last name.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    let at = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    path.split_at(at)
}

/// Calls `f` with the key of `name` in the directory `dir` (see [`PathSet`]), built on the
/// stack when the name is short (every name of a real file system is).
fn with_key<R>(dir: u32, name: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    let mut short = [0u8; 4 + 256];
    let key_len = 4 + name.len();
    if key_len <= short.len() {
        short[..4].copy_from_slice(&dir.to_le_bytes());
        short[4..key_len].copy_from_slice(name);
        f(&short[..key_len])
    } else {
        let mut long = Vec::with_capacity(key_len);
        long.extend_from_slice(&dir.to_le_bytes());
        long.extend_from_slice(name);
        f(&long)
    }
}

impl PathSet {
    /// An empty set.
    pub fn new() -> PathSet {
        PathSet::default()
    }

    /// How many paths it holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Where `path` is in the order of insertion, if it is in the set (as
    /// [`ByteSet::index_of`]).
    pub fn index_of(&self, path: &[u8]) -> Option<usize> {
        let (dir, name) = split(path);
        let dir = match self.cached_dir(dir) {
            Some(d) => d,
            None => {
                let d = u32::try_from(self.dirs.index_of(dir)?).ok()?;
                self.last_dir.store(d, Ordering::Relaxed);
                d
            }
        };
        with_key(dir, name, |key| self.keys.index_of(key))
    }

    /// The index of `dir` when it is the directory last found.
    fn cached_dir(&self, dir: &[u8]) -> Option<u32> {
        let last = self.last_dir.load(Ordering::Relaxed);
        (last != NO_DIR && self.dirs.get(last as usize) == Some(dir)).then_some(last)
    }

    /// Whether `path` is in the set.
    pub fn contains(&self, path: &[u8]) -> bool {
        self.index_of(path).is_some()
    }

    /// Adds `path`; false when it was in the set already.
    ///
    /// # Panics
    /// As [`ByteSet::insert`].
    pub fn insert(&mut self, path: &[u8]) -> bool {
        self.insert_full(path).1
    }

    /// Adds `path`: its [`PathSet::index_of`], and whether it is new (indexes of new paths
    /// count up from 0, one by one).
    ///
    /// # Panics
    /// As [`ByteSet::insert`].
    pub fn insert_full(&mut self, path: &[u8]) -> (usize, bool) {
        let (dir, name) = split(path);
        let dir = match self.cached_dir(dir) {
            Some(d) => d,
            None => {
                let (d, _) = self.dirs.insert_full(dir);
                let d = u32::try_from(d).ok().filter(|&d| d != NO_DIR);
                let d = d.expect("a PathSet holds fewer than 2^32 - 1 directories");
                self.last_dir.store(d, Ordering::Relaxed);
                d
            }
        };
        with_key(dir, name, |key| self.keys.insert_full(key))
    }

    /// The path at `index`, whole (see [`PathSet::index_of`]).
    pub fn get(&self, index: usize) -> Option<Vec<u8>> {
        self.keys.get(index).map(|key| self.whole(key))
    }

    /// The last name of the path at `index`.
    pub fn name(&self, index: usize) -> Option<&[u8]> {
        self.keys.get(index).map(|key| &key[4..])
    }

    fn whole(&self, key: &[u8]) -> Vec<u8> {
        let (dir, name) = key.split_at(4);
        let dir = u32::from_le_bytes([dir[0], dir[1], dir[2], dir[3]]);
        let dir = self.dirs.get(dir as usize).unwrap_or_default();
        let mut path = Vec::with_capacity(dir.len() + name.len());
        path.extend_from_slice(dir);
        path.extend_from_slice(name);
        path
    }

    /// The paths, in the order they were first inserted, each whole.
    pub fn iter(&self) -> impl Iterator<Item = Vec<u8>> + '_ {
        self.keys.iter().map(|key| self.whole(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_set_holds_each_member_once_and_answers_as_a_hash_set_does() {
        let mut set = ByteSet::new();
        let mut model = std::collections::HashSet::new();
        // Names that share prefixes, the empty name, and bytes that are not UTF-8.
        let names: Vec<Vec<u8>> = (0..5000u32)
            .map(|i| match i % 4 {
                0 => format!("/t/d/{i}").into_bytes(),
                1 => format!("/t/d/{}", i / 2).into_bytes(),
                2 => vec![b'/', 0xff, (i % 251) as u8],
                _ => Vec::new(),
            })
            .collect();
        for n in &names {
            assert_eq!(set.insert(n), model.insert(n.clone()), "insert {n:?}");
            assert_eq!(set.len(), model.len());
        }
        for n in &names {
            assert!(set.contains(n), "contains {n:?}");
            assert_eq!(set.get(set.index_of(n).unwrap()), Some(&n[..]));
        }
        assert!(!set.contains(b"/t/d/never"));
        let listed: Vec<&[u8]> = set.iter().collect();
        assert_eq!(listed.len(), model.len(), "every member listed once");
        assert!(listed.iter().all(|m| model.contains(*m)));
    }

    #[test]
    fn a_byte_set_says_where_a_member_is_in_four_bytes() {
        let mut set = ByteSet::new();
        for n in 0..1000u32 {
            set.insert(format!("/w/{n}").as_bytes());
        }
        set.insert(b"");
        assert_eq!(std::mem::size_of_val(set.ends.as_slice()), 4 * set.len());
        assert_eq!(set.get(1000), Some(&b""[..]));
        assert_eq!(set.get(999), Some(&b"/w/999"[..]));
        assert_eq!(set.index_of(b"/w/0"), Some(0));
    }

    #[test]
    fn a_byte_set_lists_its_members_in_the_order_they_were_first_inserted() {
        let mut set = ByteSet::new();
        for n in [&b"c"[..], b"a", b"c", b"b", b"a", b"d"] {
            set.insert(n);
        }
        assert_eq!(set.insert_full(b"e"), (4, true), "a new member comes last");
        assert_eq!(set.insert_full(b"a"), (1, false));
        assert_eq!(set.index_of(b"d"), Some(3));
        assert_eq!(set.index_of(b"f"), None);
        assert_eq!((set.get(3), set.get(1), set.get(9)), (Some(&b"d"[..]), Some(&b"a"[..]), None));
        let listed: Vec<&[u8]> = set.iter().collect();
        assert_eq!(listed, vec![&b"c"[..], b"a", b"b", b"d", b"e"]);
    }

    #[test]
    fn a_path_set_answers_as_a_byte_set_of_the_whole_paths_does() {
        let mut paths = PathSet::new();
        let mut whole = ByteSet::new();
        // Runs of names in one directory, directories that come back, bare names, the empty
        // path, a trailing slash, bytes that are not UTF-8, and a name longer than any file
        // system's.
        let long = [&b"/t/"[..], &[b'x'; 300]].concat();
        let names: Vec<Vec<u8>> = (0..6000u32)
            .map(|i| match i % 8 {
                0..=2 => format!("/t/d{}/{}", i / 100, i % 37).into_bytes(),
                3 => format!("/t/{}", i / 3).into_bytes(),
                4 => format!("bare{}", i % 11).into_bytes(),
                5 => vec![b'/', 0xff, b'/', (i % 251) as u8],
                6 => {
                    if i % 16 == 6 {
                        Vec::new()
                    } else {
                        b"/t/d1/".to_vec()
                    }
                }
                _ => long.clone(),
            })
            .collect();
        for n in &names {
            assert_eq!(paths.insert_full(n), whole.insert_full(n), "insert {n:?}");
            assert_eq!(paths.len(), whole.len());
        }
        for n in &names {
            let i = paths.index_of(n).unwrap();
            assert_eq!(Some(i), whole.index_of(n));
            assert_eq!(paths.get(i).as_deref(), Some(&n[..]));
            assert_eq!(paths.name(i), Some(super::split(n).1));
            assert!(paths.contains(n));
        }
        for never in [&b"/t/d1/never"[..], b"/never/1", b"bare", b"/t/d1"] {
            assert_eq!(paths.index_of(never), None, "{never:?}");
        }
        assert_eq!(paths.get(paths.len()), None);
        let listed: Vec<Vec<u8>> = paths.iter().collect();
        let expected: Vec<Vec<u8>> = whole.iter().map(<[u8]>::to_vec).collect();
        assert_eq!(listed, expected, "the same paths in the same order");
    }
}
