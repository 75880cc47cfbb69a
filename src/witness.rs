//! What the supervisor read of the journal's files while the session ran: the hash of each
//! whole line it read, and of them all, file by file. `run` seals with it, so that a record a
//! process of the session rewrote, erased or forged in the store after the supervisor had read
//! that file's lines (through the shim's own descriptors or mapping, which no filter can tell
//! from the shim) is found by every undo instead of acted on.
//!
//! The supervisor is a process the session cannot trace or write into (it is not dumpable),
//! and it reads each file forward from where it stopped: a line is read once, soon after it is
//! written, and only whole lines (up to an LF, never past a NUL: a segment's record may still
//! be being copied, its LF last) are taken. [`Witness::seen`] is handed to `run` over a pipe;
//! [`crate::digest::JournalDigest::take_witnessed`] then checks that each file still begins with exactly
//! the lines the supervisor read, and where it does not, the seal keeps the hashes of the lines
//! the supervisor read instead of those the file holds: the records written over them are set
//! aside and the ones erased are counted as gone, as for a change made after the seal.
//!
//! What it cannot do: tell anything of a line changed before the supervisor read it (the
//! supervisor polls; a record is read within about [`POLL`] of being written while the
//! session writes), of a segment after a record its writer never finished (a process killed
//! mid-copy: the rest of that segment is read at the seal as without a witness), or of
//! anything under `libc` coverage (there is no supervisor). A line longer than any record
//! ([`crate::journal::LONGEST_LINE`]) ends the reading of its file. A segment is not read
//! again once the process that wrote it had ended before a reading (it is known by the pid in
//! its name, as the supervisor sees pids: a process in a pid namespace of its own may be taken
//! for ended, and its later records are then digested at the seal as without a witness).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::digest::{journal_files, line_hash, read_at};
use crate::journal::LONGEST_LINE;

/// How often the supervisor reads what was written since it last read, while ids are being
/// taken from the session's counter.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// What was read of one journal file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Where the last whole line read ended: the file's bytes before it are every line read.
    pub end: u64,
    /// The BLAKE3 of those lines, each with its LF, one after the other (as
    /// [`crate::digest::FileDigest::whole`] hashes them).
    pub whole: [u8; 32],
    /// The hash of each line read, in file order (as [`crate::digest::FileDigest`] keeps them).
    pub hashes: Vec<u64>,
}

/// What was read of every journal file, by the name the digest knows it by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Witnessed {
    /// Each file read (a file with no whole line read is not here).
    pub files: BTreeMap<String, Seen>,
}

impl Witnessed {
    /// The bytes `run` is handed: for each file, its name's length (u32), the name, `end`,
    /// `whole`, the number of hashes (u64) and the hashes, little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, seen) in &self.files {
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&seen.end.to_le_bytes());
            out.extend_from_slice(&seen.whole);
            out.extend_from_slice(&(seen.hashes.len() as u64).to_le_bytes());
            for h in &seen.hashes {
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        out
    }

    /// Reads what [`Witnessed::to_bytes`] wrote (`None`: not that).
    pub fn from_bytes(mut bytes: &[u8]) -> Option<Witnessed> {
        fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, rest) = bytes.split_at_checked(n)?;
            *bytes = rest;
            Some(head)
        }
        fn number(bytes: &mut &[u8]) -> Option<u64> {
            Some(u64::from_le_bytes(take(bytes, 8)?.try_into().ok()?))
        }
        let mut files = BTreeMap::new();
        while !bytes.is_empty() {
            let len = u32::from_le_bytes(take(&mut bytes, 4)?.try_into().ok()?) as usize;
            let name = String::from_utf8(take(&mut bytes, len)?.to_vec()).ok()?;
            let end = number(&mut bytes)?;
            let whole: [u8; 32] = take(&mut bytes, 32)?.try_into().ok()?;
            let count = usize::try_from(number(&mut bytes)?).ok()?;
            let raw = take(&mut bytes, count.checked_mul(8)?)?;
            let hashes = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            files.insert(name, Seen { end, whole, hashes });
        }
        Some(Witnessed { files })
    }
}

/// One file being read.
struct Reading {
    path: PathBuf,
    /// For a segment of the shim's, the process that writes it (the pid in its name).
    writer: Option<i32>,
    end: u64,
    whole: blake3::Hasher,
    hashes: Vec<u64>,
    /// A line longer than any record was met: nothing more of this file is read.
    stopped: bool,
    /// A segment whose writer had ended before it was last read: nothing more will be written
    /// to it by the session, so it is not read again.
    settled: bool,
}

/// The reader the supervisor keeps while the session runs.
pub struct Witness {
    dir: PathBuf,
    files: BTreeMap<String, Reading>,
    buf: Vec<u8>,
}

/// How much is read at once.
const BLOCK: usize = 256 * 1024;

impl Witness {
    /// A witness of the session at `session_dir` that has read nothing yet.
    pub fn new(session_dir: &Path) -> Witness {
        Witness { dir: session_dir.to_path_buf(), files: BTreeMap::new(), buf: Vec::new() }
    }

    /// Reads the whole lines written since the last time, in every journal file there is now.
    /// A file that cannot be read now is read the next time.
    pub fn catch_up(&mut self) {
        let Ok(names) = journal_files(&self.dir) else { return };
        for (name, path) in names {
            let reading = self.files.entry(name).or_insert_with(|| Reading {
                writer: path.file_name().and_then(|n| writer(n.as_bytes())),
                path,
                end: 0,
                whole: blake3::Hasher::new(),
                hashes: Vec::new(),
                stopped: false,
                settled: false,
            });
            if reading.stopped || reading.settled {
                continue;
            }
            // Asked before the reading: a writer gone by then wrote everything it wrote before.
            let gone = reading.writer.is_some_and(|pid| !alive(pid));
            if read_on(reading, &mut self.buf).is_ok() && gone {
                reading.settled = true;
            }
        }
    }

    /// What has been read so far.
    pub fn seen(&self) -> Witnessed {
        let files = self
            .files
            .iter()
            .filter(|(_, r)| r.end > 0)
            .map(|(name, r)| {
                (name.clone(), Seen { end: r.end, whole: *r.whole.finalize().as_bytes(), hashes: r.hashes.clone() })
            })
            .collect();
        Witnessed { files }
    }
}

/// The process that writes the segment named `name` (`PID-SEQ`, as the shim names them; the
/// supervisor's own, `supervisor-PID-SEQ`, and the journal file have none).
fn writer(name: &[u8]) -> Option<i32> {
    let (pid, seq) = std::str::from_utf8(name).ok()?.split_once('-')?;
    seq.parse::<u64>().ok()?;
    pid.parse::<i32>().ok().filter(|&p| p > 0)
}

/// Whether process `pid` is there (one of another user is).
fn alive(pid: i32) -> bool {
    match rustix::process::Pid::from_raw(pid) {
        Some(p) => !matches!(rustix::process::test_kill_process(p), Err(rustix::io::Errno::SRCH)),
        None => false,
    }
}

/// Reads `r`'s file on from where it stopped: every whole line up to the first NUL or
/// unfinished line.
fn read_on(r: &mut Reading, buf: &mut Vec<u8>) -> io::Result<()> {
    let file = File::open(&r.path)?;
    let mut want = BLOCK;
    loop {
        buf.resize(want, 0);
        let n = read_at(&file, buf, r.end)?;
        let got = &buf[..n];
        let mut i = 0;
        let mut blocked = false;
        while let Some(e) = memchr::memchr2(b'\n', 0, &got[i..]).map(|e| i + e) {
            if got[e] == 0 {
                blocked = true;
                break;
            }
            if e - i > LONGEST_LINE {
                r.stopped = true;
                break;
            }
            r.hashes.push(line_hash(&got[i..e]));
            r.whole.update(&got[i..=e]);
            i = e + 1;
        }
        r.end += i as u64;
        if blocked || r.stopped {
            return Ok(());
        }
        if n < want {
            // The end of the file, in an unfinished line or after the last whole one.
            return Ok(());
        }
        if i == 0 {
            // A line longer than the block: read it whole, up to the longest a record is.
            if want > LONGEST_LINE {
                r.stopped = true;
                return Ok(());
            }
            want *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{JOURNAL_FILE, SEGMENTS_DIR};

    #[test]
    fn only_whole_lines_before_a_nul_are_read_and_reading_goes_on_from_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SEGMENTS_DIR)).unwrap();
        let segment = dir.path().join("segments/7-1");
        std::fs::write(dir.path().join(JOURNAL_FILE), b"a\nb\npart").unwrap();
        // A record being copied (its LF not yet there), then one that is whole.
        let mut room = b"one\ntw".to_vec();
        room.extend_from_slice(&[0; 3]);
        room.extend_from_slice(b"three\n");
        room.extend_from_slice(&[0; 16]);
        std::fs::write(&segment, &room).unwrap();
        let mut w = Witness::new(dir.path());
        w.catch_up();
        let seen = w.seen();
        assert_eq!(seen.files["journal"].end, 4);
        assert_eq!(seen.files["journal"].whole, *blake3::hash(b"a\nb\n").as_bytes());
        assert_eq!(seen.files["journal"].hashes, vec![line_hash(b"a"), line_hash(b"b")]);
        assert_eq!(seen.files["segments/7-1"].end, 4, "stopped at the record still being copied");
        // The copy finishes; the journal's line too.
        room[6..9].copy_from_slice(b"o!\n");
        std::fs::write(&segment, &room).unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), b"a\nb\npart\n").unwrap();
        w.catch_up();
        let seen = w.seen();
        assert_eq!(seen.files["journal"].hashes.len(), 3);
        assert_eq!(seen.files["segments/7-1"].end, 15);
        assert_eq!(seen.files["segments/7-1"].whole, *blake3::hash(b"one\ntwo!\nthree\n").as_bytes());
        assert_eq!(Witnessed::from_bytes(&seen.to_bytes()), Some(seen));
        assert_eq!(Witnessed::from_bytes(b"\x05\0\0\0ab"), None, "cut short");
    }

    #[test]
    fn a_segment_of_a_process_that_had_ended_is_read_once_after_and_then_no_longer() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SEGMENTS_DIR)).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let ended = child.id();
        child.wait().unwrap();
        let theirs = dir.path().join(format!("segments/{ended}-1"));
        let ours = dir.path().join(format!("segments/{}-1", std::process::id()));
        std::fs::write(&theirs, b"a\n").unwrap();
        std::fs::write(&ours, b"a\n").unwrap();
        let mut w = Witness::new(dir.path());
        w.catch_up();
        std::fs::write(&theirs, b"a\nb\n").unwrap();
        std::fs::write(&ours, b"a\nb\n").unwrap();
        w.catch_up();
        let seen = w.seen();
        assert_eq!(seen.files[&format!("segments/{ended}-1")].end, 2, "settled");
        assert_eq!(seen.files[&format!("segments/{}-1", std::process::id())].end, 4, "still read");
        assert_eq!((writer(b"12-3"), writer(b"supervisor-12-3"), writer(b"journal")), (Some(12), None, None));
    }

    #[test]
    fn a_line_longer_than_a_block_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = vec![b'x'; 3 * BLOCK];
        bytes.push(b'\n');
        bytes.extend_from_slice(b"next\n");
        std::fs::write(dir.path().join(JOURNAL_FILE), &bytes).unwrap();
        let mut w = Witness::new(dir.path());
        w.catch_up();
        let seen = w.seen();
        assert_eq!(seen.files["journal"].end, bytes.len() as u64);
        assert_eq!(seen.files["journal"].whole, *blake3::hash(&bytes).as_bytes());
    }
}
