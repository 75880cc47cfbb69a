//! What the journal's files held when the session was sealed, kept in the seal, so that a
//! record changed, removed or added since (by a process of the session that outlived `run`,
//! by anything else that can write the store, or by damage) is found by undo, redo and review
//! instead of acted on.
//!
//! For each journal file (`journal` and every segment), the seal keeps where its last whole
//! line ended and the BLAKE3 of its whole lines one after the other; beside it, in
//! [`LINES_FILE`], the BLAKE3 of each line (its first 8 bytes: a second line with the same ones
//! is beyond reach), in file order. A later reader hashes the file's lines up to that end as
//! one: when they are the same, only
//! the lines after it are read, and a record there that the seal covers (its `seq` not above
//! [`crate::seal::Seal::through`]) was written since and is set aside. When they differ, it
//! hashes each line: a record the seal covers whose line is not among those the seal hashed is
//! set aside, and a hashed line no longer there is a record gone (removed, or changed beyond
//! reading), counted and named by file. Where in the file a line is does not matter: a line
//! made longer moves every later one, and they are still found. An undo's own journal is
//! digested without the hash of each line (hashing a million of them took longer than the rest
//! of closing the undo): when it differs, every record it holds that its seal covers is set
//! aside.
//!
//! What this module cannot do: tell anything of what was written before the seal, except
//! against what the supervisor read while the session ran ([`crate::witness`]). A process of
//! the session can write into the store through the shim's own descriptors and mapping while
//! the session runs, and the seal then hashes what it wrote, where the supervisor had not read
//! the lines it wrote over (README, "Not a security boundary"). A record a process of the session was still writing when `run` sealed, with a
//! `seq` the seal covers, is not among its hashes and is set aside: the undo is then
//! incomplete, never wrongly complete. Records newer than the seal are not hashed: they are
//! checked the unsealed way.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::journal::{LONGEST_LINE, Problem};
use crate::session::{JOURNAL_FILE, SEGMENTS_DIR};
use crate::witness::{Seen, Witnessed};

/// Where the seal keeps the hash of each line of every journal file: beside `seal.json`, as
/// little-endian 64-bit numbers, file after file in the order of [`JournalDigest`]'s files
/// (8 MB for a million records, read only when a file is not what it was: in the seal's JSON
/// they were 16 MB more to parse and hold at every undo).
pub const LINES_FILE: &str = "seal.lines";

/// What every journal file of a session held when it was sealed, by the file's name in the
/// session directory (`journal`, `segments/NAME`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalDigest {
    /// Each file's digest.
    pub files: BTreeMap<String, FileDigest>,
    /// The BLAKE3 of [`LINES_FILE`] as written (64 hex digits), when the hash of each line was
    /// kept: a lines file that is not that one is not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines_file: Option<String>,
}

/// What one journal file held when it was digested.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Where its last whole line ended.
    pub end: u64,
    /// The BLAKE3 of its whole lines (each with its LF) one after the other, 64 hex digits: a
    /// file that still holds them all is checked with one hash over its bytes, not one a line.
    pub whole: String,
    /// How many lines it had, when the hash of each was kept (none for an undo's own journal,
    /// whose records are set aside together when it is not what it was).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lines: u64,
    /// Where its line hashes start in [`LINES_FILE`], counted in hashes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lines_at: u64,
    /// The hash of each line, in file order (the first 8 bytes of its BLAKE3, without its LF),
    /// while the digest is being taken: they are written to [`LINES_FILE`], not the seal.
    #[serde(skip)]
    pub hashes: Vec<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The journal files of `session_dir`: `journal` first, then the segments in name order, each
/// as the name the digest knows it by and its path. A segment's name is its file name, with
/// every byte of a name that is not UTF-8 (no writer of a session makes one) outside printable
/// ASCII, and every `\`, written `\xHH`: two files never share a name.
pub(crate) fn journal_files(session_dir: &Path) -> io::Result<Vec<(String, std::path::PathBuf)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut names = vec![(JOURNAL_FILE.to_string(), session_dir.join(JOURNAL_FILE))];
    let dir = session_dir.join(SEGMENTS_DIR);
    let mut segments: Vec<(String, std::path::PathBuf)> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| {
                e.map(|e| {
                    let raw = e.file_name();
                    let name = match raw.to_str() {
                        Some(text) => text.to_string(),
                        None => raw
                            .as_bytes()
                            .iter()
                            .map(|&b| {
                                if b.is_ascii_graphic() && b != b'\\' {
                                    char::from(b).to_string()
                                } else {
                                    format!("\\x{b:02x}")
                                }
                            })
                            .collect(),
                    };
                    (format!("{SEGMENTS_DIR}/{name}"), dir.join(raw))
                })
            })
            .collect::<io::Result<_>>()?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    segments.sort();
    names.append(&mut segments);
    Ok(names)
}

/// The hash the seal keeps of a line (without its LF).
pub(crate) fn line_hash(line: &[u8]) -> u64 {
    let h = blake3::hash(line);
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// Reads `file` from `at`, into `buf`, as much as it holds up to `buf`'s length; returns how
/// much (short only at the end of the file).
pub(crate) fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// How much of a file is read at once.
const BLOCK: usize = 1 << 20;

/// Calls `each` with the offset and bytes (without the LF) of every whole line of `file`, as
/// the journal's reader takes them: runs of NUL bytes between lines skipped, and bytes that
/// reach a NUL or the end before an LF (an unfinished record) not a line. A line longer than a
/// block is held whole, as the reader holds it, up to [`LONGEST_LINE`]: a longer one is no
/// record (the reader names it corrupt), so it is neither a line here nor hashed, and the rest
/// of it is read past, not held (a 500 MB line of junk was held whole). `run` is handed the
/// same lines, each with its LF, as few spans as they make (consecutive lines in one): hashed
/// as one, they are hashed on every lane the CPU has. Returns the most bytes it held at once.
fn whole_lines(file: &File, each: impl FnMut(u64, &[u8]), run: impl FnMut(u64, &[u8])) -> io::Result<usize> {
    let mut buf = BLOCKS.with(|b| b.take());
    let got = whole_lines_in(&mut buf, file, each, run);
    // (A buffer that held one very long line is not kept.)
    if buf.capacity() <= 2 * BLOCK {
        buf.clear();
        BLOCKS.with(|b| *b.borrow_mut() = buf);
    }
    got
}

thread_local! {
    /// The buffer [`whole_lines`] reads into on this thread, kept from file to file: one of a
    /// block (a mapping of its own) made and zeroed afresh for each of the hundreds of segments
    /// of a session cost more system time than reading them (an undo's check of 100,000
    /// records in 104 files: 105 blocks mapped, faulted in and unmapped).
    static BLOCKS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`whole_lines`], reading into `buf` (empty).
fn whole_lines_in(
    buf: &mut Vec<u8>,
    file: &File,
    mut each: impl FnMut(u64, &[u8]),
    mut run: impl FnMut(u64, &[u8]),
) -> io::Result<usize> {
    let mut base = 0u64;
    let mut most = 0;
    // Reading past the rest of a line longer than LONGEST_LINE.
    let mut skipping = false;
    // How much of the line held from the last block was searched for its end already (a
    // line of many blocks is searched once, not again with every block).
    let mut searched = 0;
    loop {
        let held = buf.len();
        // Into the buffer's spare room, not zeroed first (zeroing each block cost as much as
        // reading it), growing it a block at a time as before, so that what it holds stays
        // bounded.
        buf.reserve_exact(BLOCK);
        let n = loop {
            match rustix::io::pread(file, rustix::buffer::spare_capacity(buf), base + held as u64) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other?,
            }
        };
        most = most.max(buf.len());
        let ended = n == 0;
        let mut i = 0;
        if skipping {
            i = match memchr::memchr2(b'\n', 0, buf) {
                Some(e) => {
                    skipping = false;
                    if buf[e] == b'\n' { e + 1 } else { e }
                }
                None => buf.len(),
            };
        }
        let mut from: Option<usize> = None;
        while i < buf.len() {
            if buf[i] == 0 {
                if let Some(f) = from.take() {
                    run(base + f as u64, &buf[f..i]);
                }
                i += buf[i..].iter().take_while(|&&b| b == 0).count();
                continue;
            }
            let look = i.max(std::mem::take(&mut searched));
            match memchr::memchr2(b'\n', 0, &buf[look..]).map(|e| look + e) {
                Some(e) if buf[e] == b'\n' && e - i > LONGEST_LINE => {
                    if let Some(f) = from.take() {
                        run(base + f as u64, &buf[f..i]);
                    }
                    i = e + 1;
                }
                Some(e) if buf[e] == b'\n' => {
                    each(base + i as u64, &buf[i..e]);
                    from.get_or_insert(i);
                    i = e + 1;
                }
                Some(e) => {
                    if let Some(f) = from.take() {
                        run(base + f as u64, &buf[f..i]);
                    }
                    i = e;
                }
                None if ended => {
                    if let Some(f) = from.take() {
                        run(base + f as u64, &buf[f..i]);
                    }
                    i = buf.len();
                }
                None if buf.len() - i > LONGEST_LINE => {
                    if let Some(f) = from.take() {
                        run(base + f as u64, &buf[f..i]);
                    }
                    skipping = true;
                    i = buf.len();
                }
                // The rest of this line is in the next block.
                None => {
                    searched = buf.len() - i;
                    break;
                }
            }
        }
        if let Some(f) = from.take() {
            run(base + f as u64, &buf[f..i]);
        }
        buf.drain(..i);
        base += i as u64;
        if ended {
            return Ok(most);
        }
    }
}

/// Digests one file as it is now (with the hash of each line when `each_line`). With `seen`
/// (what the supervisor read of it, see [`crate::witness`]): when the file no longer begins
/// with exactly those lines, the digest holds the lines read instead of those the file holds
/// before where the reading ended, and says so (`true`).
fn digest_file(file: &File, each_line: bool, seen: Option<&Seen>) -> io::Result<(FileDigest, bool)> {
    let mut d = FileDigest::default();
    let mut whole = blake3::Hasher::new();
    let mut end = 0;
    let read_to = seen.map_or(0, |s| s.end);
    // The hash of the lines before `read_to`, and how many lines they are.
    let mut before_read_to = None;
    let mut lines_before = 0;
    whole_lines(
        file,
        |offset, line| {
            if each_line {
                d.hashes.push(line_hash(line));
            }
            lines_before += usize::from(offset < read_to);
            end = offset + line.len() as u64 + 1;
        },
        |offset, span| {
            let cut = read_to.checked_sub(offset).and_then(|c| usize::try_from(c).ok());
            match cut.filter(|&c| c > 0 && c <= span.len()) {
                Some(cut) => {
                    whole.update(&span[..cut]);
                    before_read_to = Some(whole.finalize());
                    whole.update(&span[cut..]);
                }
                None => {
                    whole.update(span);
                }
            }
        },
    )?;
    d.end = end;
    d.whole = whole.finalize().to_hex().to_string();
    let mut differs = false;
    if let Some(seen) = seen.filter(|s| s.end > 0)
        && before_read_to.map(|h| *h.as_bytes()) != Some(seen.whole)
    {
        differs = true;
        if each_line {
            let later = d.hashes.split_off(lines_before.min(d.hashes.len()));
            d.hashes = [seen.hashes.clone(), later].concat();
        }
        d.whole = blake3::Hash::from_bytes(seen.whole).to_hex().to_string();
        // Never before the lines read: a file emptied since is not a file digested empty.
        d.end = end.max(seen.end);
    }
    d.lines = d.hashes.len() as u64;
    Ok((d, differs))
}

impl JournalDigest {
    /// Digests the journal files of `session_dir` as they are now, with the hash of each line
    /// when `each_line` (the files spread over the machine's CPUs: a million records' lines
    /// took 0.4 s on one).
    pub fn take(session_dir: &Path, each_line: bool) -> io::Result<JournalDigest> {
        Ok(JournalDigest::take_witnessed(session_dir, each_line, &Witnessed::default())?.0)
    }

    /// [`JournalDigest::take`], held against what the supervisor read of the files while the
    /// session ran (see [`crate::witness`]). Also returns the files that no longer begin with
    /// the lines it read, or are gone: the digest holds those lines for them, so that the
    /// records written over them are set aside and the ones erased counted as gone.
    pub fn take_witnessed(
        session_dir: &Path,
        each_line: bool,
        witnessed: &Witnessed,
    ) -> io::Result<(JournalDigest, Vec<String>)> {
        let names = journal_files(session_dir)?;
        let hashed = crate::seal::in_parallel(&names, |(name, path)| {
            Some(match File::open(path) {
                Ok(f) => digest_file(&f, each_line, witnessed.files.get(name)).map(Some),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            })
        });
        let mut files = BTreeMap::new();
        let mut differing = Vec::new();
        for ((name, _), got) in names.into_iter().zip(hashed) {
            if let Some((d, differs)) =
                got.ok_or_else(|| io::Error::other("the hashing of a journal file panicked"))??
            {
                if differs {
                    differing.push(name.clone());
                }
                files.insert(name, d);
            }
        }
        // A file read and gone since: its lines are what the seal holds of it.
        for (name, seen) in &witnessed.files {
            if seen.end > 0 && !files.contains_key(name) {
                differing.push(name.clone());
                let hashes = if each_line { seen.hashes.clone() } else { Vec::new() };
                let d = FileDigest {
                    end: seen.end,
                    whole: blake3::Hash::from_bytes(seen.whole).to_hex().to_string(),
                    lines: hashes.len() as u64,
                    lines_at: 0,
                    hashes,
                };
                files.insert(name.clone(), d);
            }
        }
        differing.sort();
        let mut at = 0;
        for d in files.values_mut() {
            d.lines_at = at;
            at += d.lines;
        }
        Ok((JournalDigest { files, lines_file: None }, differing))
    }

    /// Writes the hash of each line into [`LINES_FILE`] in `session_dir` (as durably as
    /// `durability` says) and notes its BLAKE3; the hashes are then no longer held.
    pub fn write_lines(&mut self, session_dir: &Path, durability: crate::session::Durability) -> io::Result<()> {
        // Hashed as written, each file's hashes freed once out (a million took 8 MB).
        let mut whole = blake3::Hasher::new();
        crate::session::write_bytes_atomically_as(&session_dir.join(LINES_FILE), durability, |w| {
            for d in self.files.values_mut() {
                let bytes: Vec<u8> = std::mem::take(&mut d.hashes).iter().flat_map(|h| h.to_le_bytes()).collect();
                whole.update(&bytes);
                w.write_all(&bytes)?;
            }
            Ok(())
        })?;
        self.lines_file = Some(whole.finalize().to_hex().to_string());
        Ok(())
    }

    /// The line hashes of `d`: those held, or those in [`LINES_FILE`] when it is the one
    /// written (`None` otherwise: the file's records are then set aside together).
    fn hashes_of(
        &self,
        d: &FileDigest,
        lines: &std::sync::OnceLock<Option<Vec<u8>>>,
        session_dir: &Path,
    ) -> Option<Vec<u64>> {
        if !d.hashes.is_empty() || d.lines == 0 {
            return (!d.hashes.is_empty()).then(|| d.hashes.clone());
        }
        let want = self.lines_file.as_ref()?;
        let bytes = lines
            .get_or_init(|| {
                std::fs::read(session_dir.join(LINES_FILE))
                    .ok()
                    .filter(|b| blake3::hash(b).to_hex().as_str() == want.as_str())
            })
            .as_ref()?;
        let from = usize::try_from(d.lines_at.checked_mul(8)?).ok()?;
        let to = usize::try_from(d.lines_at.checked_add(d.lines)?.checked_mul(8)?).ok()?;
        let slice = bytes.get(from..to)?;
        Some(slice.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect())
    }

    /// What the journal files of `session_dir` hold now that they did not hold when this
    /// digest was taken, as the problems the reader names them by: records `through` covers
    /// (`0`: every record) on lines it did not hash ([`Problem::Rewritten`]), a file digested
    /// without its line hashes that is not what it was ([`Problem::Altered`]), and hashed
    /// lines gone ([`Problem::Gone`]). In file order, the files spread over the machine's CPUs.
    pub fn check(&self, session_dir: &Path, through: u64) -> io::Result<Vec<Problem>> {
        let names = journal_files(session_dir)?;
        // Read once, by whichever file needs it first.
        let lines = std::sync::OnceLock::new();
        let checked = crate::seal::in_parallel(&names, |(name, path)| {
            Some(self.check_file(session_dir, name, path, through, &lines))
        });
        let mut findings = Vec::new();
        let mut opened = std::collections::BTreeSet::new();
        for ((name, _), got) in names.into_iter().zip(checked) {
            if let Some(mut found) = got.ok_or_else(|| io::Error::other("the check of a journal file panicked"))?? {
                findings.append(&mut found);
                opened.insert(name);
            }
        }
        for (name, d) in &self.files {
            if d.end > 0 && !opened.contains(name) {
                findings.push(Problem::Gone { file: name.clone(), count: d.lines as usize, whole_file: true });
            }
        }
        Ok(findings)
    }

    /// [`JournalDigest::check`] of the file `name` at `path` (`None`: it is not there).
    fn check_file(
        &self,
        session_dir: &Path,
        name: &str,
        path: &Path,
        through: u64,
        lines: &std::sync::OnceLock<Option<Vec<u8>>>,
    ) -> io::Result<Option<Vec<Problem>>> {
        let covered = |seq: u64| through == 0 || seq <= through;
        let covered_seq = |line: &[u8]| crate::journal::parse_line(line).ok().map(|r| r.seq).filter(|&s| covered(s));
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let none = FileDigest::default();
        let want = self.files.get(name).unwrap_or(&none);
        // First the whole: the lines up to where the digested ones ended, hashed as spans.
        let mut findings = Vec::new();
        let mut whole = blake3::Hasher::new();
        whole_lines(
            &file,
            |offset, line| {
                if offset >= want.end
                    && let Some(seq) = covered_seq(line)
                {
                    findings.push(Problem::Rewritten { file: name.to_string(), offset, seq, through });
                }
            },
            |offset, span| {
                if offset < want.end {
                    whole.update(&span[..span.len().min((want.end - offset) as usize)]);
                }
            },
        )?;
        if whole.finalize().to_hex().as_str() == want.whole || want.end == 0 {
            return Ok(Some(findings));
        }
        findings.clear();
        let Some(mut expected) = self.hashes_of(want, lines, session_dir) else {
            let mut seqs = Vec::new();
            whole_lines(&file, |_, line| seqs.extend(covered_seq(line)), |_, _| {})?;
            findings.push(Problem::Altered { file: name.to_string(), seqs });
            return Ok(Some(findings));
        };
        // Which lines are not there, and which are not the seal's.
        expected.sort_unstable();
        // Each hashed line is matched once (a line twice in a file is two records).
        let mut used = vec![false; expected.len()];
        whole_lines(
            &file,
            |offset, line| {
                let h = line_hash(line);
                let first = expected.partition_point(|&e| e < h);
                let free = (first..expected.len()).take_while(|&i| expected[i] == h).find(|&i| !used[i]);
                match free {
                    Some(i) => used[i] = true,
                    None => {
                        if let Some(seq) = covered_seq(line) {
                            findings.push(Problem::Rewritten { file: name.to_string(), offset, seq, through });
                        }
                    }
                }
            },
            |_, _| {},
        )?;
        let count = used.iter().filter(|u| !**u).count();
        if count > 0 {
            findings.push(Problem::Gone { file: name.to_string(), count, whole_file: false });
        }
        Ok(Some(findings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> File {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f
    }

    fn lines_of(bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut got = Vec::new();
        let mut spans = Vec::new();
        whole_lines(
            &file_of(bytes),
            |at, line| got.push((at, line.to_vec())),
            |at, span| spans.push((at, span.to_vec())),
        )
        .unwrap();
        // The spans are the same lines, each with its LF, consecutive ones together.
        let joined: Vec<u8> = got.iter().flat_map(|(_, l)| l.iter().copied().chain([b'\n'])).collect();
        assert_eq!(spans.iter().flat_map(|(_, s)| s.iter().copied()).collect::<Vec<u8>>(), joined);
        for (at, span) in &spans {
            assert_eq!(&bytes[*at as usize..*at as usize + span.len()], &span[..]);
        }
        got
    }

    #[test]
    fn whole_lines_are_taken_as_the_reader_takes_them() {
        let got = lines_of(b"one\n\0\0tw\0\0three\nfou");
        assert_eq!(got, vec![(0, b"one".to_vec()), (10, b"three".to_vec())], "room, an unfinished record, a torn tail");
        assert!(lines_of(b"").is_empty() && lines_of(b"\0\0\0").is_empty());
        let mut long = vec![b'z'; 2 * BLOCK + 3];
        long.push(b'\n');
        long.extend_from_slice(b"next\n");
        let got = lines_of(&long);
        assert_eq!(got.len(), 2, "a line longer than a block is whole");
        assert_eq!((got[0].1.len(), got[1].0), (2 * BLOCK + 3, 2 * BLOCK as u64 + 4));
    }

    #[test]
    fn a_line_longer_than_any_record_is_neither_a_line_nor_hashed_nor_held() {
        let mut bytes = b"a\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', LONGEST_LINE + BLOCK + 1));
        bytes.extend_from_slice(b"\nb\n");
        let b_at = bytes.len() as u64 - 2;
        bytes.extend(std::iter::repeat_n(b'y', LONGEST_LINE + 2 * BLOCK));
        bytes.extend_from_slice(b"\0c\n");
        let c_at = bytes.len() as u64 - 2;
        bytes.extend(std::iter::repeat_n(b'z', LONGEST_LINE + 1));
        let got = lines_of(&bytes);
        assert_eq!(got, [(0, b"a".to_vec()), (b_at, b"b".to_vec()), (c_at, b"c".to_vec())]);
        let most = whole_lines(&file_of(&bytes), |_, _| {}, |_, _| {}).unwrap();
        assert!(most <= LONGEST_LINE + 2 * BLOCK, "held {most} bytes at once");
    }

    fn line(seq: u64, path: &str) -> Vec<u8> {
        use crate::record::{Before, Op, Record, Version};
        crate::journal::encode_line(&Record {
            v: Version,
            seq,
            time: Default::default(),
            pid: 1,
            ppid: 0,
            origin: crate::record::Origin::new(crate::BPath::from("/bin/sh"), "open".into()),
            op: Op::Change { path: crate::BPath::from(path), before: Before::Absent },
        })
    }

    #[test]
    fn records_rewritten_added_or_removed_since_the_digest_are_found_and_moved_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SEGMENTS_DIR)).unwrap();
        let journal = dir.path().join(JOURNAL_FILE);
        let segment = dir.path().join("segments/1-4");
        let mut room = [line(4, "/s4"), line(5, "/s5")].concat();
        room.extend_from_slice(&[0u8; 64]);
        std::fs::write(&journal, [line(1, "/a"), line(2, "/b"), line(3, "/c")].concat()).unwrap();
        std::fs::write(&segment, &room).unwrap();
        let digest = JournalDigest::take(dir.path(), true).unwrap();
        assert_eq!(digest.check(dir.path(), 5).unwrap(), vec![], "nothing changed");
        // Line 1 made longer (every later line moves), line 2 removed, a record with seq 9
        // added after the seal's newest, one with seq 6 (which it covers) in the segment's room.
        let longer = line(1, "/a-forged");
        std::fs::write(&journal, [longer, line(3, "/c"), line(9, "/new")].concat()).unwrap();
        let mut filled = [line(4, "/s4"), line(5, "/s5")].concat();
        let at = filled.len() as u64;
        filled.extend_from_slice(&line(6, "/late"));
        std::fs::write(&segment, &filled).unwrap();
        let found = digest.check(dir.path(), 8).unwrap();
        assert_eq!(
            found,
            vec![
                Problem::Rewritten { file: "journal".into(), offset: 0, seq: 1, through: 8 },
                Problem::Gone { file: "journal".into(), count: 2, whole_file: false },
                Problem::Rewritten { file: "segments/1-4".into(), offset: at, seq: 6, through: 8 },
            ]
        );
        // The same lines in another order are the same records.
        std::fs::write(&journal, [line(3, "/c"), line(1, "/a"), line(2, "/b")].concat()).unwrap();
        std::fs::remove_file(&segment).unwrap();
        let found = digest.check(dir.path(), 5).unwrap();
        assert_eq!(found, vec![Problem::Gone { file: "segments/1-4".into(), count: 2, whole_file: true }]);
        // A copy of a line the file held once is a second record, not that one.
        std::fs::write(&journal, [line(1, "/a"), line(2, "/b"), line(3, "/c"), line(3, "/c")].concat()).unwrap();
        let found = digest.check(dir.path(), 5).unwrap();
        assert_eq!(
            found[0],
            Problem::Rewritten { file: "journal".into(), offset: 3 * line(1, "/a").len() as u64, seq: 3, through: 5 }
        );
    }

    #[test]
    fn a_file_that_still_holds_its_lines_is_checked_whole_and_what_follows_them_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join(JOURNAL_FILE);
        let lines = [line(1, "/a"), line(2, "/b")].concat();
        std::fs::write(&journal, &lines).unwrap();
        for each_line in [true, false] {
            let digest = JournalDigest::take(dir.path(), each_line).unwrap();
            let d = &digest.files["journal"];
            assert_eq!((d.end, d.whole.as_str()), (lines.len() as u64, blake3::hash(&lines).to_hex().as_str()));
            assert_eq!((d.lines, d.hashes.len()), if each_line { (2, 2) } else { (0, 0) });
            // Appended: a record the seal covers, and one newer than it.
            std::fs::write(&journal, [lines.clone(), line(3, "/late"), line(9, "/newer")].concat()).unwrap();
            let found = digest.check(dir.path(), 5).unwrap();
            assert_eq!(
                found,
                vec![Problem::Rewritten { file: "journal".into(), offset: lines.len() as u64, seq: 3, through: 5 }]
            );
            // Changed: without the hash of each line, every record the seal covers is set aside.
            std::fs::write(&journal, [line(1, "/A"), line(2, "/b"), line(9, "/newer")].concat()).unwrap();
            let found = digest.check(dir.path(), 5).unwrap();
            let want = if each_line {
                vec![
                    Problem::Rewritten { file: "journal".into(), offset: 0, seq: 1, through: 5 },
                    Problem::Gone { file: "journal".into(), count: 1, whole_file: false },
                ]
            } else {
                vec![Problem::Altered { file: "journal".into(), seqs: vec![1, 2] }]
            };
            assert_eq!(found, want);
            std::fs::write(&journal, &lines).unwrap();
        }
    }

    #[test]
    fn records_changed_after_the_supervisor_read_them_are_found_though_the_seal_came_later() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SEGMENTS_DIR)).unwrap();
        let journal = dir.path().join(JOURNAL_FILE);
        let segment = dir.path().join("segments/1-4");
        std::fs::write(&journal, [line(1, "/a"), line(2, "/b")].concat()).unwrap();
        // A slot still being copied when the supervisor read the segment.
        let mut room = line(4, "/s4");
        let slot = room.len();
        room.extend_from_slice(&[0u8; 256]);
        std::fs::write(&segment, &room).unwrap();
        let mut witness = crate::witness::Witness::new(dir.path());
        witness.catch_up();
        // Written on honestly: a line appended, the slot filled.
        std::fs::write(&journal, [line(1, "/a"), line(2, "/b"), line(3, "/c")].concat()).unwrap();
        let five = line(5, "/s5");
        room[slot..slot + five.len()].copy_from_slice(&five);
        std::fs::write(&segment, &room).unwrap();
        let (digest, differing) = JournalDigest::take_witnessed(dir.path(), true, &witness.seen()).unwrap();
        assert_eq!(differing, Vec::<String>::new());
        assert_eq!(digest, JournalDigest::take(dir.path(), true).unwrap(), "the seal is the one taken without it");
        // Record 2 forged over (same length and not), record 4's segment removed, before the seal.
        let forged = line(2, "/X");
        std::fs::write(&journal, [line(1, "/a"), forged, line(3, "/c")].concat()).unwrap();
        std::fs::remove_file(&segment).unwrap();
        let (digest, differing) = JournalDigest::take_witnessed(dir.path(), true, &witness.seen()).unwrap();
        assert_eq!(differing, vec!["journal".to_string(), "segments/1-4".to_string()]);
        assert_eq!(
            digest.check(dir.path(), 5).unwrap(),
            vec![
                Problem::Rewritten { file: "journal".into(), offset: line(1, "/a").len() as u64, seq: 2, through: 5 },
                Problem::Gone { file: "journal".into(), count: 1, whole_file: false },
                Problem::Gone { file: "segments/1-4".into(), count: 1, whole_file: true },
            ]
        );
        // Emptied: every line read is gone, though the file holds none to check.
        std::fs::write(&journal, b"").unwrap();
        let (digest, _) = JournalDigest::take_witnessed(dir.path(), true, &witness.seen()).unwrap();
        assert_eq!(
            digest.check(dir.path(), 5).unwrap()[0],
            Problem::Gone { file: "journal".into(), count: 2, whole_file: false }
        );
    }

    #[test]
    fn a_segment_whose_name_is_not_utf8_is_checked_under_a_name_of_its_own() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SEGMENTS_DIR)).unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), line(1, "/a")).unwrap();
        let digest = JournalDigest::take(dir.path(), true).unwrap();
        let odd = std::ffi::OsStr::from_bytes(b"1-\xff\\");
        std::fs::write(dir.path().join(SEGMENTS_DIR).join(odd), line(2, "/b")).unwrap();
        let found = digest.check(dir.path(), 5).unwrap();
        assert_eq!(
            found,
            vec![Problem::Rewritten { file: "segments/1-\\xff\\x5c".into(), offset: 0, seq: 2, through: 5 }]
        );
    }

    #[test]
    fn line_hashes_written_beside_the_seal_are_read_back_only_when_they_are_the_ones_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SEGMENTS_DIR)).unwrap();
        let journal = dir.path().join(JOURNAL_FILE);
        std::fs::write(&journal, [line(1, "/a"), line(2, "/b")].concat()).unwrap();
        std::fs::write(dir.path().join("segments/1-3"), [line(3, "/c"), line(4, "/d")].concat()).unwrap();
        let mut digest = JournalDigest::take(dir.path(), true).unwrap();
        assert_eq!(digest.files["segments/1-3"].lines_at, 2);
        digest.write_lines(dir.path(), crate::session::Durability::InKernel).unwrap();
        assert!(digest.files.values().all(|d| d.hashes.is_empty()), "no longer held");
        assert_eq!(std::fs::metadata(dir.path().join(LINES_FILE)).unwrap().len(), 4 * 8);
        // As a reader of the seal has it.
        let digest: JournalDigest = serde_json::from_str(&serde_json::to_string(&digest).unwrap()).unwrap();
        std::fs::write(dir.path().join("segments/1-3"), [line(3, "/C"), line(4, "/d")].concat()).unwrap();
        let rewritten = vec![
            Problem::Rewritten { file: "segments/1-3".into(), offset: 0, seq: 3, through: 5 },
            Problem::Gone { file: "segments/1-3".into(), count: 1, whole_file: false },
        ];
        assert_eq!(digest.check(dir.path(), 5).unwrap(), rewritten);
        // A lines file that is not the one written tells nothing: the file's records go aside.
        let mut other = std::fs::read(dir.path().join(LINES_FILE)).unwrap();
        other[20] ^= 1;
        std::fs::write(dir.path().join(LINES_FILE), other).unwrap();
        let found = digest.check(dir.path(), 5).unwrap();
        assert_eq!(found, vec![Problem::Altered { file: "segments/1-3".into(), seqs: vec![3, 4] }]);
    }
}
