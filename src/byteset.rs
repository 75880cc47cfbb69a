//! A set of byte strings (paths) held in one buffer: what an undo of a million records keeps
//! of the paths it removed and touched.
//!
//! A `HashSet<Vec<u8>>` pays, for each member, a 24-byte `Vec`, an allocation with its
//! allocator header and rounding, and the table's slot: about 100 bytes for a 30-byte path.
//! Here the bytes of every member follow one another in one `Vec<u8>`, a list says where each
//! starts and how long it is (8 bytes), and the table holds each member's place in that list
//! (4 bytes), found by the bytes' hash: about 50 bytes a path. A member's place is its index,
//! by which a caller keeps facts about it in a vector of its own.
//!
//! What it cannot do: remove a member (its users mark one instead, by its index), or hold
//! more than 4 GiB of bytes in all (an insertion beyond that panics; an undo's paths are far
//! from it). The hash (xxh3: SipHash was a tenth of a
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
    /// Where each member's bytes are, in insertion order.
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

    /// The member at `index` (see [`ByteSet::index_of`]).
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.order.get(index).map(|s| &self.bytes[s.range()])
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
        let Self { bytes, table, order, seed } = self;
        let at = |i: &u32| &bytes[order[*i as usize].range()];
        match table.entry(hash, |i| at(i) == member, |i| hash_of(*seed, at(i))) {
            hashbrown::hash_table::Entry::Occupied(o) => (*o.get() as usize, false),
            hashbrown::hash_table::Entry::Vacant(slot) => {
                let too_big = "a ByteSet holds at most 4 GiB of bytes and 2^32 members";
                let start = u32::try_from(bytes.len()).expect(too_big);
                let len = u32::try_from(member.len()).expect(too_big);
                start.checked_add(len).expect(too_big);
                slot.insert(u32::try_from(order.len()).expect(too_big));
                order.push(Span { start, len });
                bytes.extend_from_slice(member);
                (order.len() - 1, true)
            }
        }
    }

    /// The members, in the order they were first inserted.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.order.iter().map(|s| &self.bytes[s.range()])
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
}
