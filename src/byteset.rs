//! A set of byte strings (paths) held in one buffer: what an undo of a million records keeps
//! of the paths it removed and touched.
//!
//! A `HashSet<Vec<u8>>` pays, for each member, a 24-byte `Vec`, an allocation with its
//! allocator header and rounding, and the table's slot: about 100 bytes for a 30-byte path.
//! Here the bytes of every member follow one another in one `Vec<u8>`, and the table holds
//! only where each starts and how long it is (12 bytes), looked up by the bytes' hash: about
//! 50 bytes a path. Members keep the order they were first inserted in ([`ByteSet::iter`]).
//!
//! What it cannot do: give back the space of a removed member (its bytes stay in the buffer
//! until the set is dropped), or hold more than 4 GiB of bytes in all (an insertion beyond
//! that panics; an undo's paths are far from it). The hash (xxh3: SipHash was a tenth of a
//! dry run's time) is seeded at random per set, so names chosen to collide cannot make it slow.

use std::hash::BuildHasher;

/// Where one member's bytes are in the buffer.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// A set of byte strings in one buffer (see the module documentation).
#[derive(Clone)]
pub struct ByteSet {
    bytes: Vec<u8>,
    /// Each member's place in `order`, found by the hash of its bytes.
    table: hashbrown::HashTable<u32>,
    /// Every member ever inserted, in insertion order; a removed one is marked [`GONE`].
    order: Vec<Span>,
    seed: u64,
}

impl Default for ByteSet {
    fn default() -> ByteSet {
        ByteSet { bytes: Vec::new(), table: Default::default(), order: Vec::new(), seed: random_seed() }
    }
}

/// A seed no two sets share (std's per-process random keys, stepped for each).
fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(0u64)
}

fn hash_of(seed: u64, bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed)
}

/// The length that marks a removed member's place in the order.
const GONE: u32 = u32::MAX;

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
        &self.bytes[self.order[at as usize].range()]
    }

    /// The member at `index` (see [`ByteSet::index_of`]), unless it was removed.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.order.get(index).filter(|s| s.len != GONE).map(|s| &self.bytes[s.range()])
    }

    /// Whether `member` is in the set.
    pub fn contains(&self, member: &[u8]) -> bool {
        self.index_of(member).is_some()
    }

    /// Where `member` is in the order of insertion (counting removed members), if it is in
    /// the set: an index a caller may keep facts by, in a vector beside the set.
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
    /// members count up from 0, one by one, removed members included).
    ///
    /// # Panics
    /// As [`ByteSet::insert`].
    pub fn insert_full(&mut self, member: &[u8]) -> (usize, bool) {
        let hash = hash_of(self.seed, member);
        let Self { bytes, table, order, seed } = self;
        let at = |i: &u32| &bytes[order[*i as usize].range()];
        match table.entry(hash, |i| at(i) == member, |i| hash_of(*seed, at(i))) {
            hashbrown::hash_table::Entry::Occupied(o) => (*o.get() as usize, false),
            hashbrown::hash_table::Entry::Vacant(slot) => {
                let too_big = "a ByteSet holds at most 4 GiB of bytes and 2^32 members";
                let start = u32::try_from(bytes.len()).expect(too_big);
                let len = u32::try_from(member.len()).ok().filter(|&l| l != GONE).expect(too_big);
                start.checked_add(len).expect(too_big);
                slot.insert(u32::try_from(order.len()).expect(too_big));
                order.push(Span { start, len });
                bytes.extend_from_slice(member);
                (order.len() - 1, true)
            }
        }
    }

    /// Takes `member` out of the set; false when it was not in it.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        let hash = hash_of(self.seed, member);
        let Self { bytes, table, order, .. } = self;
        match table.find_entry(hash, |i| &bytes[order[*i as usize].range()] == member) {
            Ok(entry) => {
                let (i, _) = entry.remove();
                order[i as usize].len = GONE;
                true
            }
            Err(_) => false,
        }
    }

    /// The members, in the order they were first inserted.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.order.iter().filter(|s| s.len != GONE).map(|s| &self.bytes[s.range()])
    }
}

impl Extend<Vec<u8>> for ByteSet {
    fn extend<I: IntoIterator<Item = Vec<u8>>>(&mut self, iter: I) {
        for m in iter {
            self.insert(&m);
        }
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
        for (i, n) in names.iter().enumerate() {
            assert_eq!(set.insert(n), model.insert(n.clone()), "insert {n:?}");
            if i % 3 == 0 {
                let victim = &names[i / 2];
                assert_eq!(set.remove(victim), model.remove(victim), "remove {victim:?}");
            }
            assert_eq!(set.len(), model.len());
        }
        for n in &names {
            assert_eq!(set.contains(n), model.contains(n), "contains {n:?}");
        }
        assert!(!set.contains(b"/t/d/never"));
        let listed: Vec<&[u8]> = set.iter().collect();
        assert_eq!(listed.len(), model.len(), "every member listed once");
        assert!(listed.iter().all(|m| model.contains(*m)));
    }

    #[test]
    fn a_byte_set_lists_its_members_in_the_order_they_were_first_inserted() {
        let mut set = ByteSet::new();
        for n in [&b"c"[..], b"a", b"c", b"b", b"a", b"d"] {
            set.insert(n);
        }
        set.remove(b"b");
        assert_eq!(set.insert_full(b"b"), (4, true), "a member inserted again is new, at the end");
        assert_eq!(set.insert_full(b"a"), (1, false));
        assert_eq!(set.index_of(b"d"), Some(3));
        assert_eq!(set.index_of(b"e"), None);
        assert_eq!((set.get(3), set.get(1), set.get(9)), (Some(&b"d"[..]), Some(&b"a"[..]), None));
        assert_eq!(set.get(2), None, "a removed member is not got by its old index");
        let listed: Vec<&[u8]> = set.iter().collect();
        assert_eq!(listed, vec![&b"c"[..], b"a", b"d", b"b"]);
    }
}
