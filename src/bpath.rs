//! Paths as the kernel sees them: raw bytes.
//!
//! Linux file names are byte strings; an agent can create `b"caf\xe9"` or a name with a newline
//! as easily as `notes.txt`. Every path the journal stores is a [`BPath`] so that such names
//! round-trip exactly through the journal, the undo and the JSON the CLI prints.
//!
//! In JSON a `BPath` is a plain string when its bytes are valid UTF-8, and an object
//! `{"b64": "<standard base64 of the bytes>"}` otherwise. This module cannot make a non-UTF-8
//! name printable: [`BPath::display_lossy`] replaces invalid bytes and is for humans only.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A path or file name held as raw bytes (a boxed slice, not a `Vec`: a journal of a million
/// records holds millions of them, and a capacity word and growth slack each add up).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BPath(Box<[u8]>);

impl BPath {
    /// Wraps raw bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        BPath(bytes.into().into_boxed_slice())
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The path as a `std::path::Path` (lossless on Unix).
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    /// Consumes the value, returning its bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0.into_vec()
    }

    /// The UTF-8 form when the bytes are valid UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// A lossy rendering for people (invalid UTF-8 becomes U+FFFD).
    pub fn display_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// Base64 of the raw bytes when they are not valid UTF-8 (what `--json` adds as
    /// `path_b64`), `None` otherwise.
    pub fn b64_if_not_utf8(&self) -> Option<String> {
        match self.to_str() {
            Some(_) => None,
            None => Some(B64.encode(&self.0)),
        }
    }

    /// Whether this is an absolute path.
    pub fn is_absolute(&self) -> bool {
        self.0.first() == Some(&b'/')
    }

    /// The parent directory and the final component of an absolute, normalised path
    /// (`/a/b` gives `/a` and `b`; `/a` gives `/` and `a`). `None` for `/` itself.
    pub fn split_parent(&self) -> Option<(&[u8], &[u8])> {
        let b = &self.0;
        let end = b.iter().rposition(|&c| c != b'/')? + 1;
        let trimmed = &b[..end];
        let slash = trimmed.iter().rposition(|&c| c == b'/')?;
        let parent = if slash == 0 { &b"/"[..] } else { &trimmed[..slash] };
        Some((parent, &trimmed[slash + 1..]))
    }

    /// Whether `self` equals `dir` or lies beneath it (byte-wise component prefix).
    pub fn starts_with_dir(&self, dir: &[u8]) -> bool {
        starts_with_dir(&self.0, dir)
    }
}

/// Whether the path `path` equals `dir` or lies beneath it (byte-wise component prefix), for
/// callers holding bytes rather than a [`BPath`].
pub fn starts_with_dir(path: &[u8], dir: &[u8]) -> bool {
    let dir = if dir.len() > 1 { dir.strip_suffix(b"/").unwrap_or(dir) } else { dir };
    if dir == b"/" {
        return path.first() == Some(&b'/');
    }
    path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/')
}

impl fmt::Debug for BPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.display_lossy(), f)
    }
}

impl From<&[u8]> for BPath {
    fn from(b: &[u8]) -> Self {
        BPath(b.into())
    }
}

impl From<&str> for BPath {
    fn from(s: &str) -> Self {
        BPath(s.as_bytes().into())
    }
}

impl From<&Path> for BPath {
    fn from(p: &Path) -> Self {
        BPath(p.as_os_str().as_bytes().into())
    }
}

impl AsRef<[u8]> for BPath {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Serialize for BPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        BytesAsPath(&self.0).serialize(s)
    }
}

/// Bytes written as a [`BPath`] writes them (a string when they are UTF-8, else
/// `{"b64": ...}`), without making one.
pub struct BytesAsPath<'a>(pub &'a [u8]);

impl Serialize for BytesAsPath<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("b64", &B64.encode(self.0))?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for BPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BPath;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path string or {\"b64\": ...}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<BPath, E> {
                Ok(BPath(v.as_bytes().into()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BPath, A::Error> {
                let mut out = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "b64" {
                        let text: String = map.next_value()?;
                        let bytes = B64
                            .decode(text.as_bytes())
                            .map_err(|e| de::Error::custom(format!("bad base64 path: {e}")))?;
                        out = Some(BPath::new(bytes));
                    } else {
                        map.next_value::<de::IgnoredAny>()?;
                    }
                }
                out.ok_or_else(|| de::Error::missing_field("b64"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Joins a directory and a relative path lexically, normalising `.` and repeated slashes.
///
/// `..` is kept as written: resolving it lexically is wrong across symlinks, and callers that
/// need a canonical path resolve the parent directory through the kernel instead.
pub fn join(dir: &[u8], rel: &[u8]) -> Vec<u8> {
    // The shim's common case, a canonical directory and one name: nothing to normalise.
    if is_normal_absolute(dir) && !rel.is_empty() && rel != b"." && !rel.contains(&b'/') {
        let mut out = Vec::with_capacity(dir.len() + rel.len() + 1);
        out.extend_from_slice(dir);
        if dir.len() > 1 {
            out.push(b'/');
        }
        out.extend_from_slice(rel);
        return out;
    }
    join_normalising(dir, rel)
}

/// [`join`] the long way: component by component.
fn join_normalising(dir: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(dir.len() + rel.len() + 1);
    if rel.first() == Some(&b'/') {
        push_components(&mut out, rel);
    } else {
        push_components(&mut out, dir);
        push_components(&mut out, rel);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

/// Whether `p` is absolute and already what [`push_components`] would make of it: no empty
/// or `.` component, no trailing slash (`/` itself is normal).
fn is_normal_absolute(p: &[u8]) -> bool {
    if p == b"/" {
        return true;
    }
    if p.first() != Some(&b'/') || p.last() == Some(&b'/') {
        return false;
    }
    // Every component after a slash must be non-empty and not `.`.
    p.split(|&c| c == b'/').skip(1).all(|comp| !comp.is_empty() && comp != b".")
}

/// Whether `path` has no empty, `.` or `..` component and no trailing slash (a leading `/`
/// aside; `/` and the empty path are not plain): joined to a canonical name, or absolute, it is
/// itself the kernel's name for what it leads to if no component is a symlink.
pub fn is_plain(path: &[u8]) -> bool {
    let rest = path.strip_prefix(b"/").unwrap_or(path);
    !rest.is_empty() && rest.split(|&c| c == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..")
}

fn push_components(out: &mut Vec<u8>, p: &[u8]) {
    for comp in p.split(|&c| c == b'/') {
        if comp.is_empty() || comp == b"." {
            continue;
        }
        out.push(b'/');
        out.extend_from_slice(comp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_utf8_name_round_trips_through_json_exactly() {
        let p = BPath::new(b"/tmp/caf\xe9\nx".to_vec());
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("b64"), "{json}");
        let back: BPath = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn a_utf8_name_is_a_plain_json_string() {
        let p = BPath::from("/tmp/a b\nc");
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"/tmp/a b\\nc\"");
        assert_eq!(p.b64_if_not_utf8(), None);
    }

    #[test]
    fn joining_a_normal_directory_and_a_name_is_the_same_as_normalising_both() {
        let dirs: [&[u8]; 12] =
            [b"/", b"//", b"/a", b"/a/", b"/a/b", b"/a//b", b"/a/./b", b"/a/.", b"/./a", b"/a/..", b"a/b", b""];
        let rels: [&[u8]; 9] = [b"x", b".", b"..", b"", b"x/y", b"/abs", b"x/", b".x", b"x.."];
        for d in dirs {
            for r in rels {
                assert_eq!(
                    join(d, r),
                    join_normalising(d, r),
                    "{:?} + {:?}",
                    String::from_utf8_lossy(d),
                    String::from_utf8_lossy(r)
                );
            }
        }
    }

    #[test]
    fn join_normalises_dots_and_slashes_but_keeps_dotdot() {
        assert_eq!(join(b"/a/b", b"./c//d"), b"/a/b/c/d");
        assert_eq!(join(b"/a/b", b"/x/./y"), b"/x/y");
        assert_eq!(join(b"/a", b"../c"), b"/a/../c");
        assert_eq!(join(b"/", b"."), b"/");
    }

    #[test]
    fn split_parent_handles_root_children_and_trailing_slashes() {
        assert_eq!(BPath::from("/a/b").split_parent(), Some((&b"/a"[..], &b"b"[..])));
        assert_eq!(BPath::from("/a").split_parent(), Some((&b"/"[..], &b"a"[..])));
        assert_eq!(BPath::from("/a/b/").split_parent(), Some((&b"/a"[..], &b"b"[..])));
        assert_eq!(BPath::from("/").split_parent(), None);
    }

    #[test]
    fn starts_with_dir_respects_component_boundaries() {
        let p = BPath::from("/home/u/.local/state/aj/s1/journal");
        assert!(p.starts_with_dir(b"/home/u/.local/state/aj/s1"));
        assert!(p.starts_with_dir(b"/home/u/.local/state/aj/s1/"));
        assert!(!p.starts_with_dir(b"/home/u/.local/state/aj/s"));
        assert!(BPath::from("/x").starts_with_dir(b"/"));
    }
}
