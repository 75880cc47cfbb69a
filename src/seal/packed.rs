//! The seal's after-states held as bytes: what undo keeps in memory for every path a session
//! touched (a million of them, read whole before anything is put back).
//!
//! An [`AfterState`] is 104 bytes as a value, most of it room for the largest variant; packed,
//! a regular file is its numbers as LEB128 varints and its 32-byte digest, about 55 bytes (an
//! empty one's digest, always the same, is a flag: about 20), and an absent path one byte.
//! Each state is self-delimiting, so one can be decoded from where it starts without a length
//! beside it, and rewritten in place when its new form is no longer.
//!
//! What this cannot do: find anything in a state without decoding it. Every reader decodes the
//! whole state (a few dozen bytes), which is what a caller of [`super::SealedPaths::get`] asks
//! for anyway.

use super::{AfterState, ContentDigest};
use crate::bpath::BPath;
use crate::record::Ident;

const ABSENT: u8 = 0;
const FILE: u8 = 1;
const DIR: u8 = 2;
const SYMLINK: u8 = 3;
const OTHER: u8 = 4;
/// With [`FILE`]: the file's change time follows its group.
const HAS_CTIME: u8 = 0x10;
/// With [`FILE`]: its digest is a stamp (a length and text), not a BLAKE3.
const STAMPED: u8 = 0x20;
/// With [`FILE`]: its digest is the BLAKE3 of no bytes ([`EMPTY_DIGEST`]), not written out (a
/// session of empty files, lock files or `touch`, seals each in about 20 bytes, not 52).
const EMPTY: u8 = 0x40;
/// BLAKE3 of no bytes.
const EMPTY_DIGEST: [u8; 32] = [
    0xaf, 0x13, 0x49, 0xb9, 0xf5, 0xf9, 0xa1, 0xa6, 0xa0, 0x40, 0x4d, 0xea, 0x36, 0xdc, 0xc9, 0x49, 0x9b, 0xcb, 0x25,
    0xc9, 0xad, 0xc1, 0x12, 0xb7, 0xcc, 0x9a, 0x93, 0xca, 0xe4, 0x1f, 0x32, 0x62,
];
const KIND: u8 = 0x0f;

/// Appends `state`, packed, to `out`.
pub(super) fn pack(state: &AfterState, out: &mut Vec<u8>) {
    match state {
        AfterState::Absent => out.push(ABSENT),
        AfterState::File { ident, size, hash, mode, uid, gid, ctime } => {
            let digest = match hash {
                ContentDigest::Blake3(b) if *b == EMPTY_DIGEST => EMPTY,
                ContentDigest::Blake3(_) => 0,
                ContentDigest::Stamp(_) => STAMPED,
            };
            out.push(FILE | if ctime.is_some() { HAS_CTIME } else { 0 } | digest);
            ident_out(*ident, out);
            uint(*size, out);
            match hash {
                ContentDigest::Blake3(_) if digest == EMPTY => {}
                ContentDigest::Blake3(b) => out.extend_from_slice(b),
                ContentDigest::Stamp(s) => bytes(s.as_bytes(), out),
            }
            owner(*mode, *uid, *gid, out);
            if let Some([s, ns]) = ctime {
                int(*s, out);
                int(*ns, out);
            }
        }
        AfterState::Dir { ident, mode, uid, gid } => {
            out.push(DIR);
            ident_out(*ident, out);
            owner(*mode, *uid, *gid, out);
        }
        AfterState::Symlink { target } => {
            out.push(SYMLINK);
            bytes(target.as_bytes(), out);
        }
        AfterState::Other { ident, mode } => {
            out.push(OTHER);
            ident_out(*ident, out);
            uint(u64::from(*mode), out);
        }
    }
}

/// The state packed at the start of `data`, and how many bytes it took. `None` only for bytes
/// [`pack`] never writes.
pub(super) fn unpack(data: &[u8]) -> Option<(AfterState, usize)> {
    let mut r = Reader { data, at: 0 };
    let tag = r.byte()?;
    let state = match tag & KIND {
        ABSENT => AfterState::Absent,
        FILE => {
            let ident = r.ident()?;
            let size = r.uint()?;
            let hash = match tag & (STAMPED | EMPTY) {
                0 => ContentDigest::Blake3(r.take(32)?.try_into().ok()?),
                EMPTY => ContentDigest::Blake3(EMPTY_DIGEST),
                STAMPED => ContentDigest::Stamp(std::str::from_utf8(r.bytes()?).ok()?.into()),
                _ => return None,
            };
            let (mode, uid, gid) = r.owner()?;
            let ctime = match tag & HAS_CTIME {
                0 => None,
                _ => Some([r.int()?, r.int()?]),
            };
            AfterState::File { ident, size, hash, mode, uid, gid, ctime }
        }
        DIR => {
            let ident = r.ident()?;
            let (mode, uid, gid) = r.owner()?;
            AfterState::Dir { ident, mode, uid, gid }
        }
        SYMLINK => AfterState::Symlink { target: BPath::from(r.bytes()?) },
        OTHER => AfterState::Other { ident: r.ident()?, mode: u32::try_from(r.uint()?).ok()? },
        _ => return None,
    };
    Some((state, r.at))
}

fn ident_out(ident: Ident, out: &mut Vec<u8>) {
    uint(ident.dev, out);
    uint(ident.ino, out);
}

fn owner(mode: u32, uid: u32, gid: u32, out: &mut Vec<u8>) {
    for n in [mode, uid, gid] {
        uint(u64::from(n), out);
    }
}

fn bytes(b: &[u8], out: &mut Vec<u8>) {
    uint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// LEB128: seven bits a byte, low first, the high bit set on every byte but the last.
fn uint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Zigzag, then LEB128 (a time before 1970 is a small negative number).
fn int(n: i64, out: &mut Vec<u8>) {
    uint(((n << 1) ^ (n >> 63)) as u64, out);
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn uint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    fn int(&mut self) -> Option<i64> {
        let z = self.uint()?;
        Some((z >> 1) as i64 ^ -((z & 1) as i64))
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.uint()?).ok()
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.uint()?).ok()?;
        self.take(n)
    }

    fn ident(&mut self) -> Option<Ident> {
        Some(Ident { dev: self.uint()?, ino: self.uint()? })
    }

    fn owner(&mut self) -> Option<(u32, u32, u32)> {
        Some((self.u32()?, self.u32()?, self.u32()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states() -> Vec<AfterState> {
        let ident = Ident { dev: 0xfe00, ino: 5_488_867 };
        vec![
            AfterState::Absent,
            AfterState::File {
                ident,
                size: 0,
                hash: ContentDigest::Blake3([7; 32]),
                mode: 0o100644,
                uid: 0,
                gid: 0,
                ctime: Some([1_796_324_070, 916_093_556]),
            },
            AfterState::File {
                ident: Ident { dev: u64::MAX, ino: u64::MAX },
                size: u64::MAX,
                hash: ContentDigest::Stamp("unreadable:13".into()),
                mode: u32::MAX,
                uid: u32::MAX,
                gid: 65534,
                ctime: Some([i64::MIN, -1]),
            },
            AfterState::File {
                ident,
                size: 12,
                hash: ContentDigest::Blake3([0xff; 32]),
                mode: 0o100600,
                uid: 1000,
                gid: 1000,
                ctime: None,
            },
            AfterState::File {
                ident,
                size: 0,
                hash: ContentDigest::Blake3(EMPTY_DIGEST),
                mode: 0o100644,
                uid: 1000,
                gid: 1000,
                ctime: Some([1_796_324_070, 916_093_556]),
            },
            AfterState::Dir { ident, mode: 0o40755, uid: 1, gid: 2 },
            AfterState::Symlink { target: BPath::from(&b"../t\xffarget"[..]) },
            AfterState::Symlink { target: BPath::from(&b""[..]) },
            AfterState::Other { ident, mode: 0o10644 },
        ]
    }

    #[test]
    fn every_state_comes_back_as_it_was_packed_one_after_another() {
        let mut bytes = Vec::new();
        for s in states() {
            pack(&s, &mut bytes);
        }
        let mut at = 0;
        for want in states() {
            let (got, took) = unpack(&bytes[at..]).expect("packed by pack");
            assert_eq!(got, want);
            at += took;
        }
        assert_eq!(at, bytes.len());
    }

    #[test]
    fn a_sealed_regular_file_takes_about_half_of_what_its_value_does() {
        let mut bytes = Vec::new();
        pack(&states()[1], &mut bytes);
        assert!(bytes.len() <= 56, "{} bytes", bytes.len());
        assert!(bytes.len() * 2 <= std::mem::size_of::<AfterState>() + 8, "{} bytes", bytes.len());
    }

    #[test]
    fn an_empty_file_is_sealed_without_its_digest_which_is_the_digest_of_no_bytes() {
        assert_eq!(EMPTY_DIGEST, *blake3::hash(b"").as_bytes());
        let (mut empty, mut full) = (Vec::new(), Vec::new());
        pack(&states()[4], &mut empty);
        let AfterState::File { ident, size, mode, uid, gid, ctime, .. } = states()[4].clone() else { unreachable!() };
        let hash = ContentDigest::Blake3([7; 32]);
        pack(&AfterState::File { ident, size, hash, mode, uid, gid, ctime }, &mut full);
        assert_eq!(empty.len() + 32, full.len(), "the same state with another digest");
        assert_eq!(unpack(&empty).map(|(s, _)| s), Some(states()[4].clone()));
    }

    #[test]
    fn damaged_or_cut_bytes_decode_to_nothing_rather_than_to_a_wrong_state() {
        let mut bytes = Vec::new();
        pack(&states()[1], &mut bytes);
        for cut in 0..bytes.len() {
            assert_eq!(unpack(&bytes[..cut]), None, "cut at {cut}");
        }
        assert_eq!(unpack(&[0x0e]), None);
        assert_eq!(unpack(&[FILE | STAMPED | EMPTY, 0, 0, 0, 0, 0, 0]), None, "a digest both stamped and empty");
        assert_eq!(unpack(&[FILE, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]), None);
    }
}
