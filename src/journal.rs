//! The on-disk journal: framing, appending, and reading back.
//!
//! # Format (version 1)
//!
//! A session's journal is the file `journal`, appended to by every process of the session at
//! once through `O_APPEND` descriptors, and the files under `segments/`, each written by one
//! process only. Each record is exactly one line, in either place:
//!
//! ```text
//! line  = CHECK SP JSON LF
//! CHECK = 16 lowercase hex digits: XXH3-64(JSON), most significant digit first
//!         (readers also accept the first 8 bytes of BLAKE3(JSON), which builds before
//!         2026-11-30 wrote)
//! JSON  = one [`Record`] as a JSON object on one line (UTF-8, no raw LF inside)
//! ```
//!
//! In `journal`, each line is written with one `write(2)`. A process that journals many
//! records moves on to segments of its own (named `PID-SEQ`, after its pid and the `seq` of
//! the record that opened the segment): files preallocated with `fallocate` and mapped shared,
//! into which each record is copied with its LF stored last. Runs of NUL bytes between and
//! after lines in a segment are room that was reserved and never filled. Records are ordered
//! by `seq` (one counter shared by the whole session), never by where they are.
//!
//! A reader classifies every byte:
//! - a complete line whose check matches and whose JSON parses is a record;
//! - a complete line that fails either test is *corrupt* ([`Problem::Corrupt`]), named by its
//!   byte offset (and segment) and, where it can still be read, its `seq`;
//! - a record whose `"v"` is not one this build knows is [`Problem::UnknownVersion`];
//! - bytes after the last LF of `journal`, and bytes of a segment that reach a NUL or the end
//!   before an LF, are *torn*: a record whose writing was cut short (the process died
//!   mid-write). Because a record is written before its call proceeds, the call it describes
//!   never ran, so a torn record is reported but does not make an undo incomplete.
//!
//! The reader never truncates, rewrites or repairs a file.
//!
//! What this module cannot do: order records that were never written. A process killed
//! between its record and its call leaves a record for a call that did not happen; undo
//! copes with that by checking the file system (see [`crate::undo`]).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::record::{RECORD_VERSION, Record};

/// Length of the hex check that starts every line.
pub const CHECK_LEN: usize = 16;

/// Computes the check for a JSON payload.
///
/// The check detects torn and damaged lines, not tampering (anyone who can rewrite the journal
/// can recompute any unkeyed hash), so it is XXH3: a few hundred instructions for a record
/// where BLAKE3 took about 1,900, and no CPU feature detection at run time (on a VM each
/// `cpuid` traps to the hypervisor: BLAKE3's detection cost about 38 us in every process
/// that journaled anything).
pub fn check_of(json: &[u8]) -> [u8; CHECK_LEN] {
    hex_check(&xxhash_rust::xxh3::xxh3_64(json).to_be_bytes())
}

/// The check builds before 2026-11-30 wrote: the first 8 bytes of BLAKE3(JSON).
fn legacy_check_of(json: &[u8]) -> [u8; CHECK_LEN] {
    hex_check(&blake3::hash(json).as_bytes()[..CHECK_LEN / 2])
}

fn hex_check(bytes: &[u8]) -> [u8; CHECK_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; CHECK_LEN];
    for (i, b) in bytes.iter().take(CHECK_LEN / 2).enumerate() {
        out[2 * i] = HEX[(b >> 4) as usize];
        out[2 * i + 1] = HEX[(b & 15) as usize];
    }
    out
}

/// Appends `t` as RFC 3339 in UTC with nanoseconds: the bytes `humantime::format_rfc3339_nanos`
/// writes (tested), without going through `core::fmt` (which cost a record about 500
/// instructions). Times humantime would not write as a plain four-digit year are left to it.
pub(crate) fn push_rfc3339_nanos(out: &mut Vec<u8>, t: std::time::SystemTime) {
    const LAST: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let since = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) if d.as_secs() <= LAST => d,
        _ => {
            out.extend_from_slice(humantime::format_rfc3339_nanos(t).to_string().as_bytes());
            return;
        }
    };
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm, for non-negative days).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let mut buf = *b"0000-00-00T00:00:00.000000000Z";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, rem / 3_600);
    put(14, 2, rem % 3_600 / 60);
    put(17, 2, rem % 60);
    put(20, 9, u64::from(since.subsec_nanos()));
    out.extend_from_slice(&buf);
}

/// Appends `path` as the JSON value serde_json makes of it: a printable-ASCII path without
/// `"` or `\` (nearly every path) is copied between quotes as it is, anything else goes to
/// serde_json (escapes, UTF-8 checks, the `b64` form of a non-UTF-8 name).
pub(crate) fn push_path_json(out: &mut Vec<u8>, path: &crate::bpath::BPath) -> bool {
    push_bytes_json(out, path.as_bytes())
}

/// [`push_path_json`] for bytes that are not a [`BPath`] (an argument of an exec record),
/// written as [`crate::bpath::BytesAsPath`] writes them.
pub(crate) fn push_bytes_json(out: &mut Vec<u8>, bytes: &[u8]) -> bool {
    if plain_json(bytes) {
        out.push(b'"');
        out.extend_from_slice(bytes);
        out.push(b'"');
        true
    } else {
        serde_json::to_writer(out, &crate::bpath::BytesAsPath(bytes)).is_ok()
    }
}

/// Whether `bytes` go into JSON between quotes as they are: printable ASCII without a quote or
/// a backslash. Eight bytes at a time, a word's bytes tested together (one at or above 0x80,
/// one below 0x20, one quote, one backslash), then the rest one by one: every record's path and
/// every argument of an exec record goes through here, at about ten instructions a byte when
/// tested one at a time.
fn plain_json(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Whether a byte of `w`, each below 0x80, is below `n` (at most 0x20 here): its
    // subtraction wraps into its high bit, which no byte's own can reach. Exact for "any": a
    // borrow passed on only reaches the bytes above one that is below `n`.
    let any_below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & HIGH != 0;
    let any_is = |w: u64, b: u8| any_below(w ^ (ONES * u64::from(b)), 1);
    let plain_byte = |b: u8| (0x20..0x80).contains(&b) && b != b'"' && b != b'\\';
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let w = u64::from_le_bytes(<[u8; 8]>::try_from(word).unwrap_or_default());
        if w & HIGH != 0 || any_below(w, 0x20) || any_is(w, b'"') || any_is(w, b'\\') {
            return false;
        }
    }
    words.remainder().iter().all(|&b| plain_byte(b))
}

/// Encodes a record as one journal line (with its trailing LF).
pub fn encode_line(rec: &Record) -> Vec<u8> {
    let mut line = start_line();
    // Serialising our own types into a Vec cannot fail: no maps with non-string keys, no
    // custom serializers that error.
    if serde_json::to_writer(&mut line, rec).is_err() {
        line.truncate(CHECK_LEN + 1);
        line.extend_from_slice(b"{}");
    }
    finish_line(line)
}

/// A line's start: room for the check, and the space after it; the JSON follows.
pub(crate) fn start_line() -> Vec<u8> {
    let mut line = Vec::with_capacity(512);
    line.extend_from_slice(&[b'0'; CHECK_LEN]);
    line.push(b' ');
    line
}

/// Fills in the check of the JSON after [`start_line`]'s prefix and ends the line.
pub(crate) fn finish_line(mut line: Vec<u8>) -> Vec<u8> {
    let check = check_of(&line[CHECK_LEN + 1..]);
    line[..CHECK_LEN].copy_from_slice(&check);
    line.push(b'\n');
    line
}

/// Appends records to a session's journal.
#[derive(Debug)]
pub struct JournalWriter {
    fd: OwnedFd,
}

impl JournalWriter {
    /// Wraps a descriptor opened with `O_WRONLY | O_APPEND`.
    pub fn from_fd(fd: OwnedFd) -> Self {
        JournalWriter { fd }
    }

    /// Opens `path` for appending (creating it with mode 0600 if needed).
    pub fn open(path: &Path) -> io::Result<Self> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        Ok(JournalWriter { fd })
    }

    /// The descriptor (the shim moves it to a high number so it never collides with the
    /// program's own descriptors).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Appends one record with a single `write(2)`.
    pub fn append(&self, rec: &Record) -> io::Result<()> {
        self.append_line(&encode_line(rec))
    }

    /// Appends an already encoded line.
    pub fn append_line(&self, line: &[u8]) -> io::Result<()> {
        crate::capture::write_all(self.fd.as_fd(), line)
    }

    /// `fdatasync` of the journal (used with `AETHER_JOURNAL_SYNC=1`).
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fdatasync(self.fd.as_fd())?;
        Ok(())
    }
}

/// Something wrong with part of a journal file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A complete line that is not a valid record.
    Corrupt {
        /// The segment it is in (`None`: the main journal file).
        segment: Option<String>,
        /// Byte offset of the line.
        offset: u64,
        /// 1-based line number.
        line: u64,
        /// The record's `seq`, when it could still be read from the damaged line.
        seq: Option<u64>,
        /// What is wrong with it.
        what: String,
    },
    /// A record written by a format version this build does not know.
    UnknownVersion {
        /// The segment it is in (`None`: the main journal file).
        segment: Option<String>,
        /// Byte offset of the line.
        offset: u64,
        /// 1-based line number.
        line: u64,
        /// The record's `seq`, if present.
        seq: Option<u64>,
        /// The version it declares.
        version: u64,
    },
    /// A valid record whose `seq` no writer of the session handed out: above the session's
    /// counter (which every writer takes its ids from before writing), or taken by another
    /// record too. Forged or damaged; it is never acted on.
    Unaccounted {
        /// Its `seq`.
        seq: u64,
        /// The counter's value when the journal was read, for a `seq` above it; `None` for a
        /// `seq` two records have.
        last_id: Option<u64>,
    },
    /// A valid record the session's seal covers (its `seq` is not above the seal's newest)
    /// that names a path the seal does not hold: every path a record named when the session
    /// was sealed is in it, so this record was written since (forged or damaged). It is never
    /// acted on.
    Unsealed {
        /// Its `seq`.
        seq: u64,
        /// The first of its paths the seal does not hold.
        path: crate::bpath::BPath,
        /// The newest record the seal covers.
        through: u64,
    },
    /// A valid record the seal covers whose line is not one the journal's files held when
    /// the session was sealed ([`crate::digest`]): written or changed since (forged or
    /// damaged). It is never acted on.
    Rewritten {
        /// The file it is in, by its name in the session directory (`journal`,
        /// `segments/NAME`).
        file: String,
        /// The byte offset of its line.
        offset: u64,
        /// Its `seq`.
        seq: u64,
        /// The newest record the seal covers.
        through: u64,
    },
    /// A journal file digested without the hash of each line (an undo's own) that is not
    /// what it was: every record it holds that the seal covers is set aside.
    Altered {
        /// The file, by its name in its directory.
        file: String,
        /// The records set aside.
        seqs: Vec<u64>,
    },
    /// Damaged lines of one file past the first [`NAMED_DAMAGE`] of it (corrupt, or of a format
    /// version this build cannot read), counted together and not each named: a journal
    /// with 100 MB of junk held a problem and an outcome for every line of it, 595 MB. Their
    /// `seq`s are not read: a selective undo always names them.
    Uncounted {
        /// The segment they are in (`None`: the main journal file).
        segment: Option<String>,
        /// How many lines.
        count: u64,
        /// The byte offset and line number of the first.
        first: (u64, u64),
        /// The byte offset and line number of the last.
        last: (u64, u64),
    },
    /// Lines a journal file held when the session was sealed (or when the supervisor read it
    /// while the session ran, see [`crate::witness`]) that it no longer holds (beyond
    /// those named as corrupt): records removed, or changed beyond reading, since. What they
    /// would undo cannot be known.
    Gone {
        /// The file, by its name in the session directory.
        file: String,
        /// How many lines.
        count: usize,
        /// Whether the file itself is gone.
        whole_file: bool,
    },
}

impl Problem {
    /// The record's sequence number when known.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Problem::Corrupt { seq, .. } | Problem::UnknownVersion { seq, .. } => *seq,
            Problem::Unaccounted { seq, .. } | Problem::Unsealed { seq, .. } | Problem::Rewritten { seq, .. } => {
                Some(*seq)
            }
            Problem::Gone { .. } | Problem::Altered { .. } | Problem::Uncounted { .. } => None,
        }
    }

    /// A sentence naming the damaged record and what is wrong.
    pub fn describe(&self) -> String {
        let name = |segment: &Option<String>, offset: &u64, line: &u64, seq: &Option<u64>| {
            let file = segment.as_ref().map(|s| format!(" of segment {s}")).unwrap_or_default();
            match seq {
                Some(s) => format!("the record at byte {offset}{file} (line {line}, seq {s})"),
                None => format!("the record at byte {offset}{file} (line {line})"),
            }
        };
        match self {
            Problem::Corrupt { segment, offset, line, seq, what } => format!(
                "{} is corrupt: {what}; the step it describes cannot be undone",
                name(segment, offset, line, seq)
            ),
            Problem::UnknownVersion { segment, offset, line, seq, version } => format!(
                "{} uses record format version {version}, which this build (version {RECORD_VERSION}) cannot read; the step it describes cannot be undone",
                name(segment, offset, line, seq)
            ),
            Problem::Unaccounted { seq, last_id: Some(last) } => format!(
                "the record of seq {seq} is above the session's counter ({last}), so no writer of the session made it (forged or damaged); it was not acted on"
            ),
            Problem::Unaccounted { seq, last_id: None } => format!(
                "two records have seq {seq}, which the session's counter hands out once (one is forged or damaged); neither was acted on"
            ),
            Problem::Unsealed { seq, path, through } => format!(
                "the record of seq {seq} names {}, which the session's seal (of its records through seq {through}) does not hold: no record named it when the session was sealed, so this one was written since (forged or damaged); it was not acted on",
                path.display_lossy()
            ),
            Problem::Rewritten { file, offset, seq, through } => format!(
                "the record of seq {seq} at byte {offset} of {file} is one the session's seal covers (its records through seq {through}), but the journal held no such line when the session was sealed (or when the supervisor read that file while it ran): it was written or changed since (forged or damaged); it was not acted on"
            ),
            Problem::Altered { file, seqs } => format!(
                "{file} is not what it held when it was sealed (changed since: forged or damaged), so none of its {} record(s) was acted on",
                seqs.len()
            ),
            Problem::Uncounted { segment, count, first, last } => format!(
                "{count} more damaged record(s){} from byte {} (line {}) to byte {} (line {}), each corrupt or of a format version this build cannot read; the steps they describe cannot be undone",
                segment.as_ref().map(|s| format!(" of segment {s}")).unwrap_or_default(),
                first.0,
                first.1,
                last.0,
                last.1
            ),
            Problem::Gone { file, count, whole_file: true } => format!(
                "{file}, which held {count} record(s) when the session was sealed, is gone: what they would undo cannot be known, and was not put back"
            ),
            Problem::Gone { file, count, whole_file: false } => format!(
                "{count} record(s) that {file} held when the session was sealed are gone from it (removed or changed since the seal, or since the supervisor read them while the session ran): what they would undo cannot be known, and was not put back"
            ),
        }
    }

    fn place(&mut self, at_segment: Option<&str>, at_offset: usize, at_line: u64) {
        match self {
            Problem::Corrupt { segment, offset, line, .. } | Problem::UnknownVersion { segment, offset, line, .. } => {
                *segment = at_segment.map(str::to_string);
                *offset = at_offset as u64;
                *line = at_line;
            }
            Problem::Unaccounted { .. }
            | Problem::Unsealed { .. }
            | Problem::Rewritten { .. }
            | Problem::Altered { .. }
            | Problem::Uncounted { .. }
            | Problem::Gone { .. } => {}
        }
    }
}

/// Everything read from a journal file and its segments.
#[derive(Clone, Debug, Default)]
pub struct JournalContents {
    /// Valid records, ordered by `seq` (oldest first).
    pub records: Vec<Record>,
    /// Damaged or unreadable lines, in file order.
    pub problems: Vec<Problem>,
    /// Byte offset of an incomplete final record in the main journal file, if it ends in one.
    pub torn_tail: Option<u64>,
    /// Incomplete records in segments: (segment name, byte offset), the first
    /// [`NAMED_DAMAGE`] of each segment.
    pub torn_in_segments: Vec<(String, u64)>,
    /// How many incomplete records each segment holds past those in
    /// [`JournalContents::torn_in_segments`]: (segment name, count). A segment of junk held a
    /// place and a note for each (94 MB of fragments: 10.8 GB).
    pub torn_uncounted: Vec<(String, u64)>,
    /// Bytes read (the main file and every segment, preallocated room included).
    pub bytes: u64,
}

impl JournalContents {
    /// Sets aside, as [`Problem::Unaccounted`], every record whose `seq` no writer handed out:
    /// above `last_id` (the session's counter, read after the records: each writer takes its
    /// id before it writes) or held by two records. `records` must be sorted by `seq`.
    pub fn set_aside_unaccounted(&mut self, last_id: Option<u64>) {
        // Nearly always nothing is set aside: then the records stay where they are.
        let accounted = |r: &crate::record::Record| last_id.is_none_or(|last| r.seq <= last);
        if self.records.iter().all(accounted) && self.records.windows(2).all(|w| w[0].seq != w[1].seq) {
            return;
        }
        let records = std::mem::take(&mut self.records);
        let mut kept = Vec::with_capacity(records.len());
        let mut it = records.into_iter().peekable();
        while let Some(r) = it.next() {
            if last_id.is_some_and(|last| r.seq > last) {
                self.problems.push(Problem::Unaccounted { seq: r.seq, last_id });
                continue;
            }
            if it.peek().is_some_and(|next| next.seq == r.seq) {
                while it.next_if(|next| next.seq == r.seq).is_some() {}
                self.problems.push(Problem::Unaccounted { seq: r.seq, last_id: None });
                continue;
            }
            kept.push(r);
        }
        self.records = kept;
    }

    /// Sets aside, as [`Problem::Unsealed`], every record `seal` covers that names a path it
    /// does not hold. A seal holds every path the records it covers name (those up to
    /// [`crate::seal::Seal::through`]; every record, for a seal of a build that did not keep
    /// it), so such a record was written after the seal by something other than the session's
    /// writers: acting on it would let a forged line remove or write any file the user can.
    /// Records newer than the seal (a process that joined the session after `run` sealed it)
    /// are kept: they are checked the unsealed way.
    pub fn set_aside_unsealed(&mut self, seal: &crate::seal::Seal) {
        let covered = |r: &crate::record::Record| seal.through == 0 || r.seq <= seal.through;
        let outside = |r: &crate::record::Record| {
            crate::select::record_paths(r).into_iter().find(|p| seal.state_of(p).is_none()).cloned()
        };
        if !self.records.iter().any(|r| covered(r) && outside(r).is_some()) {
            return;
        }
        let records = std::mem::take(&mut self.records);
        let mut kept = Vec::with_capacity(records.len());
        for r in records {
            match outside(&r).filter(|_| covered(&r)) {
                Some(path) => self.problems.push(Problem::Unsealed { seq: r.seq, path, through: seal.through }),
                None => kept.push(r),
            }
        }
        self.records = kept;
    }

    /// Sets aside what the journal's files in `session_dir` hold that they did not hold when
    /// `seal` was taken ([`crate::digest`]): records the seal covers whose line is not one it
    /// hashed ([`Problem::Rewritten`], for those still among the records: call it after the
    /// other checks, so that a record is named once), and names the hashed lines that are gone
    /// ([`Problem::Gone`], beyond the lines of the file already named as corrupt). Nothing, for
    /// a seal of a build that did not hash the journal. `records` must be sorted by `seq`. An
    /// error: a journal file could not be read.
    pub fn set_aside_altered(&mut self, seal: &crate::seal::Seal, session_dir: &Path) -> io::Result<()> {
        let Some(digest) = &seal.journal_digest else { return Ok(()) };
        let findings = digest.check(session_dir, seal.through)?;
        let mut aside = Vec::new();
        for p in findings {
            match p {
                Problem::Rewritten { seq, .. } if self.records.binary_search_by_key(&seq, |r| r.seq).is_err() => {}
                Problem::Rewritten { seq, .. } => {
                    aside.push(seq);
                    self.problems.push(p);
                }
                Problem::Altered { ref seqs, .. } => {
                    aside.extend_from_slice(seqs);
                    self.problems.push(p);
                }
                Problem::Gone { file, count, whole_file } => {
                    // A line damaged in place is gone from the hashes and named as corrupt.
                    let of_file = |segment: &Option<String>| {
                        segment.as_deref().map_or(file == crate::session::JOURNAL_FILE, |s| {
                            file.strip_prefix(crate::session::SEGMENTS_DIR).and_then(|f| f.strip_prefix('/')) == Some(s)
                        })
                    };
                    let corrupt: usize = self
                        .problems
                        .iter()
                        .map(|p| match p {
                            Problem::Corrupt { segment, .. } | Problem::UnknownVersion { segment, .. } => {
                                usize::from(of_file(segment))
                            }
                            Problem::Uncounted { segment, count, .. } if of_file(segment) => {
                                usize::try_from(*count).unwrap_or(usize::MAX)
                            }
                            _ => 0,
                        })
                        .fold(0, usize::saturating_add);
                    if whole_file || count > corrupt {
                        let count = if whole_file { count } else { count - corrupt };
                        self.problems.push(Problem::Gone { file, count, whole_file });
                    }
                }
                other => self.problems.push(other),
            }
        }
        if !aside.is_empty() {
            aside.sort_unstable();
            self.records.retain(|r| aside.binary_search(&r.seq).is_err());
        }
        Ok(())
    }

    /// The records whose call is known to have failed (every `call_failed`'s `of_seq`).
    pub fn failed_calls(&self) -> std::collections::HashSet<u64> {
        self.records
            .iter()
            .filter_map(|r| match r.op {
                crate::record::Op::CallFailed { of_seq, .. } => Some(of_seq),
                _ => None,
            })
            .collect()
    }

    /// The [`crate::record::Op::TempName`] intents no later record completes: the process died
    /// (or could not journal) between the mkstemp-like call and the record naming what it
    /// created. An intent is completed by a `call_failed` of it, or by the first later `change`
    /// from `absent` of the same process whose path its template can produce.
    pub fn interrupted_temp_names(&self) -> std::collections::HashSet<u64> {
        use crate::record::{Before, Op};
        let failed = self.failed_calls();
        let mut open: Vec<(u32, &crate::bpath::BPath, u64)> = Vec::new();
        for r in &self.records {
            match &r.op {
                Op::TempName { template } if !failed.contains(&r.seq) => open.push((r.pid, template, r.seq)),
                Op::Change { path, before: Before::Absent } => {
                    if let Some(i) =
                        open.iter().position(|(pid, t, _)| *pid == r.pid && crate::record::matches_template(t, path))
                    {
                        open.remove(i);
                    }
                }
                _ => {}
            }
        }
        open.into_iter().map(|(_, _, seq)| seq).collect()
    }

    /// One sentence per incomplete record (main file first, then segments).
    pub fn torn_messages(&self) -> Vec<String> {
        let tail = self.torn_tail.map(|at| {
            format!(
                "the journal ends in an incomplete record at byte {at} (a process died while writing it; the call it describes never ran)"
            )
        });
        let segs = self.torn_in_segments.iter().map(|(name, at)| {
            format!(
                "segment {name} holds an incomplete record at byte {at} (a process died while writing it; the call it describes never ran)"
            )
        });
        let more = self.torn_uncounted.iter().map(|(name, count)| {
            format!(
                "segment {name} holds {count} more incomplete record(s) (each where a process died while writing it, or junk; no call they could describe ran)"
            )
        });
        tail.into_iter().chain(segs).chain(more).collect()
    }
}

/// Parses journal bytes (see the module docs for the classification).
pub fn parse_journal(data: &[u8]) -> JournalContents {
    let mut out = JournalContents::default();
    parse_main_into(data, &mut out);
    out.records.sort_unstable_by(crate::record::Record::journal_order);
    out
}

/// Adds the main journal file's records and problems to `out` (unsorted).
fn parse_main_into(data: &[u8], out: &mut JournalContents) {
    let mut records = Vec::new();
    out.bytes += data.len() as u64;
    main_lines(data, &mut Place::default(), true, out, &mut |r| records.push(r));
    out.records.append(&mut records);
}

/// Where a pass over one file is: the offset in the file of the bytes it is handed next, and
/// the lines it has seen.
#[derive(Default)]
struct Place {
    base: usize,
    line_no: u64,
    /// How many damaged lines it named one by one.
    named_damage: usize,
    /// How many incomplete records it named one by one.
    named_torn: usize,
    /// Where a line longer than [`LONGEST_LINE`] started, while the rest of it is skipped.
    skipping: Option<usize>,
    /// How much of the unfinished line it was last handed it searched for an end already (a
    /// line of many blocks is searched once, not again with every block).
    searched: usize,
}

/// The longest line the reader takes as a record. No writer makes one near it (the longest
/// record is an exec's: the kernel takes at most 6 MiB of arguments, which JSON escapes at
/// most six-fold); a longer line is corrupt, or torn when the file ends first, without being
/// held (a journal with a 500 MB line of junk made undo hold it, 520 MB).
pub const LONGEST_LINE: usize = 64 << 20;

/// Notes an incomplete record of segment `name` at `at`: one by one for the first
/// [`NAMED_DAMAGE`], then counted.
fn torn_in_segment(out: &mut JournalContents, place: &mut Place, name: &str, at: usize) {
    if place.named_torn < NAMED_DAMAGE {
        place.named_torn += 1;
        out.torn_in_segments.push((name.to_string(), at as u64));
        return;
    }
    match out.torn_uncounted.last_mut() {
        Some((n, count)) if n == name => *count += 1,
        _ => out.torn_uncounted.push((name.to_string(), 1)),
    }
}

/// How many damaged lines of one file are named one by one ([`Problem::Uncounted`]).
pub const NAMED_DAMAGE: usize = 1000;

/// Takes the whole lines of the main journal file at the start of `data` (at `place` in the
/// file): records to `sink`, problems to `out`. Returns how many bytes it took; with `last`
/// (the file ends with `data`) all of them, an unfinished line being the torn tail.
fn main_lines(
    data: &[u8],
    place: &mut Place,
    last: bool,
    out: &mut JournalContents,
    sink: &mut dyn FnMut(Record),
) -> usize {
    let mut offset = 0usize;
    if let Some(start) = place.skipping {
        match memchr::memchr(b'\n', data) {
            Some(nl) => {
                place.skipping = None;
                place.line_no += 1;
                damaged(too_long(), None, start, place, out);
                offset = nl + 1;
            }
            None => {
                if last {
                    out.torn_tail = Some(start as u64);
                }
                place.base += data.len();
                return data.len();
            }
        }
    }
    while offset < data.len() {
        let look = offset.max(std::mem::take(&mut place.searched));
        let Some(nl) = memchr::memchr(b'\n', &data[look..]).map(|n| look + n - offset) else {
            if last {
                out.torn_tail = Some((place.base + offset) as u64);
                offset = data.len();
            } else if data.len() - offset > LONGEST_LINE {
                place.skipping = Some(place.base + offset);
                offset = data.len();
            } else {
                place.searched = data.len() - offset;
            }
            break;
        };
        place.line_no += 1;
        take_line(&data[offset..offset + nl], None, place.base + offset, place, out, sink);
        offset += nl + 1;
    }
    place.base += offset;
    offset
}

fn take_line(
    line: &[u8],
    segment: Option<&str>,
    offset: usize,
    place: &mut Place,
    out: &mut JournalContents,
    sink: &mut dyn FnMut(Record),
) {
    // Whether or not the reader held it whole, a line that long is no record: not parsed.
    let parsed = if line.len() > LONGEST_LINE { Err(too_long()) } else { parse_line(line) };
    let p = match parsed {
        // The marks segment is appended to by processes that may be of the session: it holds
        // nothing that undo would act on.
        Ok(rec)
            if segment == Some(crate::marks::MARKS_SEGMENT) && !matches!(rec.op, crate::record::Op::Mark { .. }) =>
        {
            corrupt(Some(rec.seq), "the marks segment holds only marks, and this record is not one")
        }
        Ok(rec) => return sink(rec),
        Err(p) => p,
    };
    damaged(p, segment, offset, place, out);
}

/// A line longer than [`LONGEST_LINE`].
fn too_long() -> Problem {
    corrupt(None, format!("the line is longer than {} MiB, which no record is", LONGEST_LINE >> 20))
}

/// Adds the problem `p` of the line at `offset` (and `place`'s line number) to `out`: named
/// for the first [`NAMED_DAMAGE`] of a file, then counted.
fn damaged(mut p: Problem, segment: Option<&str>, offset: usize, place: &mut Place, out: &mut JournalContents) {
    let at = (offset as u64, place.line_no);
    if place.named_damage < NAMED_DAMAGE {
        place.named_damage += 1;
        p.place(segment, offset, place.line_no);
        out.problems.push(p);
        return;
    }
    // Counted together with the damaged lines after the first named ones (a damaged line's
    // problem, and its outcome, cost hundreds of bytes each).
    if let Some(Problem::Uncounted { segment: s, count, last, .. }) = out.problems.last_mut()
        && s.as_deref() == segment
    {
        *count += 1;
        *last = at;
        return;
    }
    out.problems.push(Problem::Uncounted { segment: segment.map(str::to_string), count: 1, first: at, last: at });
}

/// Adds one segment's records and problems to `out` (unsorted). A segment is lines as in the
/// main file, with runs of NUL bytes between and after them: room reserved by a process that
/// died before filling it, and the preallocated rest of the file. Every line's LF is stored
/// after the rest of it, so bytes that reach a NUL (or the end) before an LF are an incomplete
/// record, reported like a torn tail.
pub fn parse_segment_into(name: &str, data: &[u8], out: &mut JournalContents) {
    let mut records = Vec::new();
    out.bytes += data.len() as u64;
    segment_lines(name, data, &mut Place::default(), true, out, &mut |r| records.push(r));
    out.records.append(&mut records);
}

/// [`main_lines`] for segment `name`: takes what is whole at the start of `data` (lines, and
/// the NUL bytes between them), and with `last` the rest too.
fn segment_lines(
    name: &str,
    data: &[u8],
    place: &mut Place,
    last: bool,
    out: &mut JournalContents,
    sink: &mut dyn FnMut(Record),
) -> usize {
    let mut offset = 0usize;
    if let Some(start) = place.skipping {
        match memchr::memchr2(b'\n', 0, data) {
            Some(e) if data[e] == b'\n' => {
                place.skipping = None;
                place.line_no += 1;
                damaged(too_long(), Some(name), start, place, out);
                offset = e + 1;
            }
            Some(e) => {
                place.skipping = None;
                torn_in_segment(out, place, name, start);
                offset = e;
            }
            None => {
                if last {
                    torn_in_segment(out, place, name, start);
                }
                place.base += data.len();
                return data.len();
            }
        }
    }
    while offset < data.len() {
        if data[offset] == 0 {
            offset += nuls_at_start(&data[offset..]);
            continue;
        }
        let look = offset.max(std::mem::take(&mut place.searched));
        let end = memchr::memchr2(b'\n', 0, &data[look..]).map(|n| look + n);
        match end {
            Some(e) if data[e] == b'\n' => {
                place.line_no += 1;
                take_line(&data[offset..e], Some(name), place.base + offset, place, out, sink);
                offset = e + 1;
            }
            Some(e) => {
                torn_in_segment(out, place, name, place.base + offset);
                offset = e;
            }
            None if last => {
                torn_in_segment(out, place, name, place.base + offset);
                offset = data.len();
            }
            None if data.len() - offset > LONGEST_LINE => {
                place.skipping = Some(place.base + offset);
                offset = data.len();
            }
            None => {
                place.searched = data.len() - offset;
                break;
            }
        }
    }
    place.base += offset;
    offset
}

/// How many NUL bytes `data` starts with: a segment's preallocated rest (most of a big one,
/// in a short session) is skipped sixteen bytes at a time.
fn nuls_at_start(data: &[u8]) -> usize {
    let whole = data.chunks_exact(16).take_while(|c| *c == [0u8; 16]).count() * 16;
    whole + data[whole..].iter().take_while(|&&b| b == 0).count()
}

/// How much of a journal file is read at once: a segment of a million records is 200 MB,
/// which need not be in memory whole.
const BLOCK: usize = 1 << 20;

/// Reads the file at `path` a block at a time, handing `take` what is read and not yet taken
/// (and whether the file ends there); `take` returns how much of it it took. Returns the bytes
/// read. `buf` is the reader's own, kept from file to file: a buffer allocated and zeroed for
/// each of a session's many small segments cost more than reading them (and, freed on one of
/// several threads, a TLB shootdown on the others).
fn read_in_blocks(path: &Path, buf: &mut Vec<u8>, mut take: impl FnMut(&[u8], bool) -> usize) -> io::Result<u64> {
    let f = std::fs::File::open(path)?;
    // A small file is read whole at once (its length and one more byte, to see its end).
    let len = f.metadata().map_or(BLOCK as u64, |m| m.len());
    let block = usize::try_from(len).map_or(BLOCK, |l| l.saturating_add(1).min(BLOCK));
    buf.clear();
    let mut total = 0u64;
    loop {
        buf.reserve(block);
        let n = loop {
            match rustix::io::read(&f, rustix::buffer::spare_capacity(buf)) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other?,
            }
        };
        total += n as u64;
        let last = n == 0;
        let took = take(buf, last);
        buf.drain(..took.min(buf.len()));
        if last {
            return Ok(total);
        }
    }
}

/// Reads a session's whole journal: the main file `journal` and every segment under
/// `segments_dir` (either may be missing), records ordered by `seq`.
pub fn read_with_segments(journal: &Path, segments_dir: &Path) -> io::Result<JournalContents> {
    // Each thread's records go into one buffer reserved for all it may read (a record line is
    // longer than 100 bytes; only what is filled is memory): buffers grown segment by segment
    // and freed after the merge left holes the allocator kept, 200 MB for a million records.
    let per_thread = records_per_reader(segments_dir);
    let (mut buffers, mut out) = visit_with_segments(
        journal,
        segments_dir,
        || Vec::with_capacity(per_thread),
        |v: &mut Vec<Record>, r| v.push(r),
    )?;
    // The largest buffer takes the others (growing it moves no record: it is mapped).
    buffers.sort_by_key(|b| std::cmp::Reverse(b.len()));
    let mut all = buffers.first_mut().map(std::mem::take).unwrap_or_default();
    all.reserve_exact(buffers.iter().map(Vec::len).sum::<usize>());
    for b in buffers.iter_mut().skip(1) {
        all.append(b);
    }
    drop(buffers);
    out.records = all;
    out.records.sort_unstable_by(crate::record::Record::journal_order);
    Ok(out)
}

/// At most how many records each thread that reads `segments_dir` finds (a record line is
/// longer than 100 bytes): what a reader reserves room for, since only what is filled of it
/// is memory, while buffers grown as they fill leave the allocator holes as large again.
pub fn records_per_reader(segments_dir: &Path) -> usize {
    let seg_bytes: u64 = std::fs::read_dir(segments_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    usize::try_from(seg_bytes / 100 / reader_threads() as u64).unwrap_or(0).min(1 << 26)
}

/// Segments are parsed on as many threads as there are CPUs (a session of 20,000 records took
/// 34 ms on one), at most eight.
fn reader_threads() -> usize {
    cpus().min(8)
}

/// The CPUs this process may run on, asked once (each ask reads the process's cgroup files).
pub(crate) fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Every record of a session's journal (the main file `journal` and every segment under
/// `segments_dir`, either may be missing), handed to `visit` with the accumulator of the
/// thread that read it (one `init()` for the main file, and one per thread that reads
/// segments), in no particular order, and not kept: for a reader that needs a little of each
/// record (the seal of a million paths needs their names). Files are read a block at a time.
/// Returns the accumulators, and what else the read found (problems in file order, torn
/// records, bytes read), its `records` empty.
pub fn visit_with_segments<A: Send>(
    journal: &Path,
    segments_dir: &Path,
    init: impl Fn() -> A + Sync,
    visit: impl Fn(&mut A, Record) + Sync,
) -> io::Result<(Vec<A>, JournalContents)> {
    let mut out = JournalContents::default();
    let mut main = init();
    let mut place = Place::default();
    let mut buf = Vec::new();
    let read = read_in_blocks(journal, &mut buf, |data, last| {
        main_lines(data, &mut place, last, &mut out, &mut |r| visit(&mut main, r))
    });
    match read {
        Ok(n) => out.bytes += n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut names: Vec<std::ffi::OsString> = match std::fs::read_dir(segments_dir) {
        Ok(entries) => entries.map(|e| e.map(|e| e.file_name())).collect::<io::Result<_>>()?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    names.sort();
    // Each thread takes the next file; the problems are merged in name order, so they come
    // out in the same order whichever thread read them.
    let threads = reader_threads().min(names.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    type Parsed<A> = (A, Vec<(usize, io::Result<JournalContents>)>);
    let reader = || -> Parsed<A> {
        let mut acc = init();
        let mut mine = Vec::new();
        let mut buf = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(name) = names.get(i) else { break };
            let path = segments_dir.join(name);
            let label = name.to_string_lossy();
            let mut part = JournalContents::default();
            let mut place = Place::default();
            let read = read_in_blocks(&path, &mut buf, |data, last| {
                segment_lines(&label, data, &mut place, last, &mut part, &mut |r| visit(&mut acc, r))
            });
            // Named in the error: the caller reports it against the journal as a whole.
            let read = read.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))).map(|n| {
                part.bytes = n;
                part
            });
            mine.push((i, read));
        }
        (acc, mine)
    };
    // One file (a short session: its marks, or one writer's segment) is read here: a thread
    // started for it costs more than the reading.
    let parsed: Vec<Parsed<A>> = if threads == 1 {
        vec![reader()]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads).map(|_| scope.spawn(reader)).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| (init(), vec![(0, Err(io::Error::other("a segment reader panicked")))]))
                })
                .collect()
        })
    };
    let (mut accs, parts): (Vec<A>, Vec<_>) = parsed.into_iter().unzip();
    let mut parts: Vec<(usize, io::Result<JournalContents>)> = parts.into_iter().flatten().collect();
    parts.sort_by_key(|(i, _)| *i);
    for (_, part) in parts {
        let part = part?;
        out.problems.extend(part.problems);
        out.torn_in_segments.extend(part.torn_in_segments);
        out.torn_uncounted.extend(part.torn_uncounted);
        out.bytes += part.bytes;
    }
    accs.push(main);
    Ok((accs, out))
}

fn corrupt(seq: Option<u64>, what: impl Into<String>) -> Problem {
    Problem::Corrupt { segment: None, offset: 0, line: 0, seq, what: what.into() }
}

/// Best-effort `seq` from a damaged line, so that the message can name the record.
fn salvage_seq(json: &[u8]) -> Option<u64> {
    let key = b"\"seq\":";
    let at = json.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: Vec<u8> = json[at..].iter().copied().take_while(u8::is_ascii_digit).collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

pub(crate) fn parse_line(line: &[u8]) -> Result<Record, Problem> {
    if line.len() < CHECK_LEN + 2 || line[CHECK_LEN] != b' ' {
        return Err(corrupt(salvage_seq(line), "the line does not start with a 16-digit check and a space"));
    }
    let (check, json) = (&line[..CHECK_LEN], &line[CHECK_LEN + 1..]);
    if check != check_of(json) && check != legacy_check_of(json) {
        return Err(corrupt(salvage_seq(json), "its checksum does not match its content"));
    }
    // The common case straight into a record; anything else the long way, which says why.
    // (One of another version fails to read: `Version` reads only this build's.)
    if let Ok(rec) = serde_json::from_slice::<Record>(json) {
        return Ok(rec);
    }
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| corrupt(salvage_seq(json), format!("invalid JSON ({e})")))?;
    let seq = value.get("seq").and_then(|s| s.as_u64());
    match value.get("v").and_then(|v| v.as_u64()) {
        Some(v) if v == RECORD_VERSION as u64 => {}
        Some(v) => return Err(Problem::UnknownVersion { segment: None, offset: 0, line: 0, seq, version: v }),
        None => return Err(corrupt(seq, "it has no format version")),
    }
    serde_json::from_value(value).map_err(|e| corrupt(seq, format!("not a record this build understands ({e})")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpath::BPath;
    use crate::internal::{Envelope, ExecParts, encode_exec_fields, encode_fields, prog_json};
    use crate::record::{Before, Op, Version};

    fn rec(seq: u64) -> Record {
        Record {
            v: Version,
            seq,
            time: crate::record::Stamp::parse("2026-11-29T00:00:00.000000000Z").unwrap(),
            pid: 1,
            ppid: 0,
            origin: crate::record::Origin::new(BPath::from("/bin/sh"), "open".into()),
            op: Op::Change { path: BPath::new(b"/t/a\nb\xff".to_vec()), before: Before::Absent },
        }
    }

    #[test]
    fn records_the_seal_covers_that_name_a_path_it_does_not_hold_are_set_aside_and_newer_ones_kept() {
        let at = |seq: u64, op: Op| Record { op, ..rec(seq) };
        let change = |p: &str| Op::Change { path: BPath::from(p), before: Before::Absent };
        let rename = |from: &str, to: &str| {
            Op::Rename(Box::new(crate::record::RenameOp {
                from: BPath::from(from),
                to: BPath::from(to),
                moved: None,
                flags: 0,
                to_before: Before::Absent,
            }))
        };
        let records = || {
            vec![
                at(1, change("/t/a")),
                at(2, rename("/t/a", "/t/forged")),
                at(3, change("/t/\u{e9}")),
                at(4, change("/t/b")),
                // Newer than the seal: a process that joined after it.
                at(9, change("/t/late")),
            ]
        };
        let sealed = |through: u64| {
            let paths = ["/t/a", "/t/b", "/t/\u{e9}"].map(BPath::from).to_vec();
            crate::seal::take_seal_of_paths(paths, through, |_| true)
        };
        let mut j = JournalContents { records: records(), ..Default::default() };
        j.set_aside_unsealed(&sealed(4));
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 3, 4, 9]);
        assert_eq!(j.problems, [Problem::Unsealed { seq: 2, path: BPath::from("/t/forged"), through: 4 }]);
        assert!(j.problems[0].describe().contains("seq 2 names /t/forged"), "{}", j.problems[0].describe());
        // A seal that does not say how far it goes covers every record.
        let mut j = JournalContents { records: records(), ..Default::default() };
        j.set_aside_unsealed(&sealed(0));
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 3, 4]);
        assert_eq!(j.problems.iter().map(|p| p.seq()).collect::<Vec<_>>(), [Some(2), Some(9)]);
    }

    #[test]
    fn records_above_the_counter_or_held_twice_are_set_aside_and_the_rest_kept_in_order() {
        let contents =
            |seqs: &[u64]| JournalContents { records: seqs.iter().map(|&s| rec(s)).collect(), ..Default::default() };
        let seqs = |j: &JournalContents| j.records.iter().map(|r| r.seq).collect::<Vec<_>>();
        let mut clean = contents(&[1, 2, 3]);
        clean.set_aside_unaccounted(Some(3));
        assert_eq!(seqs(&clean), [1, 2, 3]);
        assert!(clean.problems.is_empty());
        let mut forged = contents(&[1, 2, 2, 3, 5]);
        forged.set_aside_unaccounted(Some(4));
        assert_eq!(seqs(&forged), [1, 3]);
        let set_aside: Vec<_> = forged
            .problems
            .iter()
            .map(|p| match p {
                Problem::Unaccounted { seq, last_id } => (*seq, *last_id),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(set_aside, [(2, None), (5, Some(4))]);
        // Without a counter only duplicates are set aside.
        let mut uncounted = contents(&[7, 7, 9]);
        uncounted.set_aside_unaccounted(None);
        assert_eq!(seqs(&uncounted), [9]);
    }

    #[test]
    fn a_name_is_plain_json_exactly_when_each_of_its_bytes_is() {
        let plain_byte = |b: u8| (0x20..0x80).contains(&b) && b != b'"' && b != b'\\';
        for len in 1..20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut name = vec![b'a'; len];
                    name[at] = b;
                    assert_eq!(plain_json(&name), plain_byte(b), "byte {b:#x} at {at} of {len}");
                    // Beside a byte just above the control characters: a borrow from one
                    // byte's subtraction must not mark its neighbour.
                    if len > 1 {
                        name[(at + 1) % len] = 0x20;
                        assert_eq!(plain_json(&name), plain_byte(b), "byte {b:#x} at {at} of {len}, beside 0x20");
                    }
                }
            }
        }
        assert!(plain_json(b""));
        assert!(plain_json(b"/usr/lib/x86_64-linux-gnu/libc.so.6 ~!#$%&'()*+,-.:;<=>?@[]^_`{|}"));
    }

    #[test]
    fn a_record_is_exactly_one_line_and_reads_back() {
        let line = encode_line(&rec(3));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(*line.last().unwrap(), b'\n');
        let j = parse_journal(&line);
        assert_eq!(j.records, vec![rec(3)]);
        assert!(j.problems.is_empty() && j.torn_tail.is_none());
    }

    fn fields_of(r: &Record, time: std::time::SystemTime, prog_json: &[u8]) -> Vec<u8> {
        let env = Envelope { seq: r.seq, time, pid: r.pid, ppid: r.ppid, prog_json, call: r.call() };
        encode_fields(&env, &r.op)
    }

    #[test]
    fn a_record_encoded_from_its_fields_is_byte_for_byte_the_owned_records_line() {
        use crate::record::{Before, MetaBefore, MetaKind, Op};
        let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_796_000_000, 7);
        let when = crate::record::Stamp::of(t);
        let meta = Op::Meta {
            path: BPath::from("/w/d\"q\\é"),
            before: MetaBefore {
                what: MetaKind::Times,
                mode: 0o40755,
                uid: 1000,
                gid: 1000,
                atime: [1, 2],
                mtime: [3, 4],
                ident: crate::record::Ident { dev: 5, ino: 6 },
                symlink: false,
                xattr: None,
                flags: None,
            }
            .into(),
        };
        let ops = [
            Op::Change { path: BPath::new(b"/t/a\nb\xff".to_vec()), before: Before::Absent },
            Op::Change { path: BPath::from("/t/plain \"quoted\" é"), before: Before::Absent },
            Op::Change { path: BPath::from("/t/x"), before: Before::Exclusive },
            meta,
            Op::CallFailed { of_seq: 4, errno: 17 },
            Op::Exec(Box::new(crate::record::ExecOp {
                program: BPath::from("/usr/bin/sed"),
                argv: [b"sed".as_slice(), b"-i", b"s/a\"b\\c/\n\t/", b"caf\xc3\xa9", b"\xff\xfe", b""]
                    .into_iter()
                    .collect(),
                cwd: BPath::new(b"/w/\xffdir".to_vec()),
                child: None,
            })),
            Op::Exec(Box::new(crate::record::ExecOp {
                program: BPath::from("/bin/true"),
                argv: [b"/bin/true".as_slice()].into_iter().collect(),
                cwd: BPath::from("/"),
                child: Some(4_294_967_295),
            })),
            Op::Exec(Box::new(crate::record::ExecOp {
                program: BPath::from("relative \"quoted\""),
                argv: std::iter::empty::<&[u8]>().collect(),
                cwd: BPath::from(""),
                child: Some(0),
            })),
        ];
        for (i, op) in ops.into_iter().enumerate() {
            for (prog, call) in
                [("/usr/bin/tar", "openat"), ("/x/\u{1}odd \"prog\"", "we\"ird call"), ("/bin/sh", "__open_2")]
            {
                let mut r = rec(i as u64 + 1);
                r.time = when;
                r.origin = crate::record::Origin::new(BPath::from(prog), call.into());
                r.op = op.clone();
                r.pid = u32::MAX;
                r.ppid = 0;
                let line = fields_of(&r, t, &prog_json(r.prog()));
                assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&encode_line(&r)));
                if let Op::Exec(e) = &r.op {
                    let env = Envelope {
                        seq: r.seq,
                        time: t,
                        pid: r.pid,
                        ppid: r.ppid,
                        prog_json: &prog_json(r.prog()),
                        call,
                    };
                    let parts = ExecParts {
                        program: e.program.as_bytes(),
                        argv: e.argv.iter(),
                        cwd: e.cwd.as_bytes(),
                        child: e.child,
                    };
                    assert_eq!(encode_exec_fields(&env, parts), line, "an exec given by its parts");
                }
                assert_eq!(parse_journal(&line).records, vec![r]);
            }
        }
        let nonutf8 = BPath::new(b"/p/\xff\xfe".to_vec());
        let mut r = rec(9);
        r.time = when;
        r.origin = crate::record::Origin::new(nonutf8.clone(), r.call().clone());
        assert_eq!(fields_of(&r, t, &prog_json(&nonutf8)), encode_line(&r), "a non-UTF-8 program name");
    }

    #[test]
    fn timestamps_are_written_exactly_as_humantime_writes_them() {
        use std::time::{Duration, UNIX_EPOCH};
        let mut secs: Vec<u64> = vec![
            0,
            59,
            86_399,
            86_400,
            951_782_400,     // 2000-02-29
            951_868_799,     // 2000-02-29T23:59:59
            4_107_542_400,   // 2100-03-01 (2100 is no leap year)
            4_107_542_399,   // 2100-02-28T23:59:59
            1_796_000_000,   // this year
            253_402_300_799, // the last second of year 9999
        ];
        // And a spread of others, every day of a few centuries reached.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            secs.push(x % 253_402_300_800);
        }
        for (i, s) in secs.into_iter().enumerate() {
            let nanos = [0, 1, 999_999_999, (s % 1_000_000_000) as u32][i % 4];
            let t = UNIX_EPOCH + Duration::new(s, nanos);
            let mut ours = Vec::new();
            push_rfc3339_nanos(&mut ours, t);
            assert_eq!(String::from_utf8(ours).unwrap(), humantime::format_rfc3339_nanos(t).to_string(), "{s}.{nanos}");
        }
    }

    #[test]
    fn a_path_is_written_exactly_as_serde_json_writes_it_whatever_its_bytes() {
        let mut paths: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b'/', b'a', b, b'z']).collect();
        paths.push("/home/u/projet/é/ü.txt".as_bytes().to_vec());
        paths.push(b"/w/plain-path_1.2/x y".to_vec());
        paths.push(b"/w/\xc3".to_vec()); // cut UTF-8
        for p in paths {
            let p = BPath::new(p);
            let mut ours = Vec::new();
            assert!(push_path_json(&mut ours, &p));
            assert_eq!(ours, serde_json::to_vec(&p).unwrap(), "{:?}", p.as_bytes());
        }
    }

    #[test]
    fn records_are_returned_in_sequence_order_whatever_the_file_order() {
        let mut data = encode_line(&rec(5));
        data.extend(encode_line(&rec(2)));
        let seqs: Vec<u64> = parse_journal(&data).records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![2, 5]);
    }

    #[test]
    fn a_torn_final_record_is_reported_with_its_offset_not_as_corruption() {
        let mut data = encode_line(&rec(1));
        let first = data.len();
        let second = encode_line(&rec(2));
        data.extend_from_slice(&second[..second.len() / 2]);
        let j = parse_journal(&data);
        assert_eq!(j.records.len(), 1);
        assert!(j.problems.is_empty());
        assert_eq!(j.torn_tail, Some(first as u64));
        assert!(j.torn_messages()[0].contains(&format!("at byte {first}")));
    }

    #[test]
    fn a_corrupt_record_mid_file_is_named_and_the_rest_still_read() {
        let mut data = encode_line(&rec(1));
        let at = data.len();
        let mut bad = encode_line(&rec(2));
        let idx = bad.len() - 5;
        bad[idx] ^= 0x01;
        data.extend(bad);
        data.extend(encode_line(&rec(3)));
        let j = parse_journal(&data);
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(j.problems.len(), 1);
        match &j.problems[0] {
            Problem::Corrupt { segment, offset, line, seq, .. } => {
                assert_eq!((segment.as_deref(), *offset, *line, *seq), (None, at as u64, 2, Some(2)));
            }
            p => panic!("unexpected {p:?}"),
        }
        assert!(j.problems[0].describe().contains("checksum"));
    }

    #[test]
    fn the_check_is_xxh3_of_the_json_in_sixteen_lowercase_hex_digits() {
        // XXH3-64 of the empty input is 0x2d06800538d394c2 (the reference test vector).
        assert_eq!(&check_of(b""), b"2d06800538d394c2");
        let line = encode_line(&rec(7));
        let json = &line[CHECK_LEN + 1..line.len() - 1];
        assert_eq!(&line[..CHECK_LEN], &check_of(json));
    }

    #[test]
    fn a_line_checked_with_blake3_by_an_older_build_still_reads_and_a_wrong_check_does_not() {
        let line = encode_line(&rec(5));
        let json = &line[CHECK_LEN + 1..];
        let blake3_hex = blake3::hash(&json[..json.len() - 1]).to_hex();
        let mut old = blake3_hex.as_bytes()[..CHECK_LEN].to_vec();
        old.push(b' ');
        old.extend_from_slice(json);
        let j = parse_journal(&old);
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![5]);
        assert!(j.problems.is_empty(), "{:?}", j.problems);
        let mut wrong = old.clone();
        wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
        let j = parse_journal(&wrong);
        assert!(j.records.is_empty() && j.problems.len() == 1, "{:?}", j.problems);
    }

    #[test]
    fn an_unknown_format_version_is_its_own_problem() {
        let json = br#"{"v":99,"seq":4}"#;
        let mut line = check_of(json).to_vec();
        line.push(b' ');
        line.extend_from_slice(json);
        line.push(b'\n');
        let j = parse_journal(&line);
        assert_eq!(
            j.problems,
            vec![Problem::UnknownVersion { segment: None, offset: 0, line: 1, seq: Some(4), version: 99 }]
        );
        assert!(j.problems[0].describe().contains("version 99"));
    }

    #[test]
    fn damaged_lines_past_the_first_thousand_of_a_file_are_counted_together_and_every_record_is_still_read() {
        // Junk, a record, junk, a record: each file's first NAMED_DAMAGE damaged lines are
        // named, the rest counted in one problem per file and run, whatever lies between.
        let junk = b"0123456789abcdef {\"seq\":5}\n";
        let mut data = Vec::new();
        for _ in 0..NAMED_DAMAGE - 1 {
            data.extend_from_slice(junk);
        }
        data.extend_from_slice(&encode_line(&rec(1)));
        let first = data.len() as u64;
        for _ in 0..6 {
            data.extend_from_slice(junk);
        }
        data.extend_from_slice(&encode_line(&rec(2)));
        let last = data.len() as u64;
        data.extend_from_slice(junk);
        let j = parse_journal(&data);
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(j.problems.len(), NAMED_DAMAGE + 1);
        assert!(j.problems[..NAMED_DAMAGE].iter().all(|p| matches!(p, Problem::Corrupt { seq: Some(5), .. })));
        let lines = NAMED_DAMAGE as u64 + 2;
        assert_eq!(
            j.problems[NAMED_DAMAGE],
            Problem::Uncounted {
                segment: None,
                count: 6,
                first: (first + junk.len() as u64, lines),
                last: (last, lines + 6)
            }
        );
        assert_eq!(j.problems[NAMED_DAMAGE].seq(), None);
        assert!(j.problems[NAMED_DAMAGE].describe().starts_with("6 more damaged record(s) from byte"));
        // A segment's damage is its own: it names its first thousand too.
        let mut j = parse_journal(&data);
        parse_segment_into("7-4", junk, &mut j);
        assert!(matches!(j.problems.last(), Some(Problem::Corrupt { segment: Some(s), .. }) if s == "7-4"));
    }

    #[test]
    fn incomplete_records_past_the_first_thousand_of_a_segment_are_counted_together() {
        let mut data = b"ab\0".repeat(NAMED_DAMAGE + 3);
        data.extend_from_slice(&encode_line(&rec(4)));
        let mut j = JournalContents::default();
        parse_segment_into("9-1", &data, &mut j);
        parse_segment_into("9-2", b"cd\0", &mut j);
        assert_eq!(j.records.len(), 1);
        assert_eq!(j.torn_in_segments.len(), NAMED_DAMAGE + 1);
        assert_eq!(j.torn_in_segments[NAMED_DAMAGE - 1], ("9-1".to_string(), 3 * (NAMED_DAMAGE as u64 - 1)));
        assert_eq!(j.torn_in_segments[NAMED_DAMAGE], ("9-2".to_string(), 0));
        assert_eq!(j.torn_uncounted, [("9-1".to_string(), 3)]);
        let notes = j.torn_messages();
        assert_eq!(notes.len(), NAMED_DAMAGE + 2);
        assert!(notes[NAMED_DAMAGE + 1].starts_with("segment 9-1 holds 3 more incomplete record(s)"), "{notes:?}");
    }

    #[test]
    fn a_whole_record_of_another_format_version_or_of_none_is_not_read() {
        let line = encode_line(&rec(4));
        let json = std::str::from_utf8(&line[CHECK_LEN + 1..line.len() - 1]).unwrap();
        assert!(json.contains(r#""v":1,"#), "{json}");
        let relined = |json: String| {
            let mut line = check_of(json.as_bytes()).to_vec();
            line.push(b' ');
            line.extend_from_slice(json.as_bytes());
            line.push(b'\n');
            parse_journal(&line)
        };
        let j = relined(json.replace(r#""v":1,"#, r#""v":2,"#));
        assert!(j.records.is_empty(), "{:?}", j.records);
        assert_eq!(
            j.problems,
            vec![Problem::UnknownVersion { segment: None, offset: 0, line: 1, seq: Some(4), version: 2 }]
        );
        let j = relined(json.replace(r#""v":1,"#, ""));
        assert!(j.records.is_empty(), "{:?}", j.records);
        assert!(matches!(&j.problems[..], [Problem::Corrupt { .. }]), "{:?}", j.problems);
        assert_eq!(relined(json.to_string()).records, vec![rec(4)]);
    }

    fn segment(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn a_segment_reads_as_its_lines_with_reserved_and_preallocated_room_skipped() {
        let data = segment(&[&encode_line(&rec(9)), &[0; 40], &encode_line(&rec(4)), &[0; 4096]]);
        let mut j = JournalContents::default();
        parse_segment_into("7-4", &data, &mut j);
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![9, 4]);
        assert!(j.problems.is_empty() && j.torn_in_segments.is_empty() && j.torn_tail.is_none());
        assert_eq!(j.bytes, data.len() as u64);
    }

    #[test]
    fn a_segment_record_cut_short_is_torn_wherever_it_is_not_corrupt() {
        let whole = encode_line(&rec(2));
        let cut = &whole[..whole.len() - 1]; // everything but the LF, which is stored last
        let at = whole.len() + 10;
        for data in [
            segment(&[&whole, &[0; 10], cut, &[0; 100]]),
            segment(&[&whole, &[0; 10], cut]),
            segment(&[&whole, &[0; 10], &cut[..30], &[0; 500], &encode_line(&rec(3))]),
        ] {
            let mut j = JournalContents::default();
            parse_segment_into("7-1", &data, &mut j);
            assert!(j.problems.is_empty(), "{:?}", j.problems);
            assert_eq!(j.torn_in_segments, vec![("7-1".to_string(), at as u64)]);
            assert!(j.torn_messages()[0].contains(&format!("segment 7-1 holds an incomplete record at byte {at}")));
            assert!(j.records.iter().any(|r| r.seq == 2));
        }
    }

    #[test]
    fn a_damaged_segment_line_is_named_by_its_segment() {
        let mut bad = encode_line(&rec(6));
        let i = bad.len() - 4;
        bad[i] ^= 1;
        let data = segment(&[&[0; 8], &bad, &[0; 8]]);
        let mut j = JournalContents::default();
        parse_segment_into("12-6", &data, &mut j);
        match &j.problems[..] {
            [p @ Problem::Corrupt { segment, offset, .. }] => {
                assert_eq!((segment.as_deref(), *offset), (Some("12-6"), 8));
                assert!(p.describe().contains("at byte 8 of segment 12-6"), "{}", p.describe());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_session_journal_merges_the_main_file_and_every_segment_by_seq() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("journal");
        let segs = dir.path().join("segments");
        std::fs::write(&main, [encode_line(&rec(1)), encode_line(&rec(5))].concat()).unwrap();
        let j = read_with_segments(&main, &segs).unwrap();
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 5], "no segments/ is fine");
        std::fs::create_dir(&segs).unwrap();
        std::fs::write(segs.join("10-2"), segment(&[&encode_line(&rec(2)), &encode_line(&rec(6)), &[0; 64]])).unwrap();
        std::fs::write(segs.join("11-3"), segment(&[&encode_line(&rec(3)), &[0; 64]])).unwrap();
        let j = read_with_segments(&main, &segs).unwrap();
        assert_eq!(j.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2, 3, 5, 6]);
        std::fs::create_dir(segs.join("12-7")).unwrap(); // not a file: cannot be read
        let e = read_with_segments(&main, &segs).unwrap_err();
        assert!(e.to_string().contains("12-7"), "the unreadable segment is named: {e}");
    }

    #[test]
    fn a_line_longer_than_any_record_is_let_go_as_it_is_read_and_named_corrupt_or_torn() {
        // As the block reader hands them over: once more than LONGEST_LINE bytes hold no line
        // end, all of them are taken (the reader drops them), and the line is named from where
        // it started: corrupt when it ends in an LF, torn when the file (or, in a segment, a
        // NUL) ends it first. The records around it are read.
        let long = vec![b'x'; LONGEST_LINE + 1];
        let mut out = JournalContents::default();
        let mut place = Place::default();
        let mut seqs = Vec::new();
        let first = encode_line(&rec(1));
        let mut data = first.clone();
        data.extend_from_slice(&long);
        assert_eq!(main_lines(&data, &mut place, false, &mut out, &mut |r| seqs.push(r.seq)), data.len());
        let mut rest = b"xx\n".to_vec();
        rest.extend_from_slice(&encode_line(&rec(2)));
        let torn_at = data.len() + rest.len();
        rest.extend_from_slice(&long);
        assert_eq!(main_lines(&rest, &mut place, false, &mut out, &mut |r| seqs.push(r.seq)), rest.len());
        assert_eq!(main_lines(b"yy", &mut place, true, &mut out, &mut |r| seqs.push(r.seq)), 2);
        assert_eq!(seqs, [1, 2]);
        assert_eq!(out.torn_tail, Some(torn_at as u64));
        assert!(
            matches!(&out.problems[..], [Problem::Corrupt { segment: None, offset, line: 2, what, .. }]
                if *offset == first.len() as u64 && what.contains("longer than 64 MiB")),
            "{:?}",
            out.problems
        );

        let mut out = JournalContents::default();
        let mut place = Place::default();
        assert_eq!(segment_lines("5-1", &long, &mut place, false, &mut out, &mut |r| seqs.push(r.seq)), long.len());
        let mut rest = b"x\0".to_vec();
        let line_at = long.len() + rest.len();
        rest.extend_from_slice(&long);
        assert_eq!(segment_lines("5-1", &rest, &mut place, false, &mut out, &mut |r| seqs.push(r.seq)), rest.len());
        let mut end = b"x\n".to_vec();
        end.extend_from_slice(&encode_line(&rec(3)));
        assert_eq!(segment_lines("5-1", &end, &mut place, true, &mut out, &mut |r| seqs.push(r.seq)), end.len());
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(out.torn_in_segments, [("5-1".to_string(), 0)]);
        assert!(
            matches!(&out.problems[..], [Problem::Corrupt { segment: Some(s), offset, line: 1, .. }]
                if s == "5-1" && *offset == line_at as u64),
            "{:?}",
            out.problems
        );
        // A line held whole that is that long is no record either.
        let mut whole = long.clone();
        whole.push(b'\n');
        assert!(
            matches!(&parse_journal(&whole).problems[..], [Problem::Corrupt { what, .. }] if what.contains("longer than"))
        );
    }

    #[test]
    fn problems_in_many_segments_are_reported_in_segment_order_whatever_thread_read_them() {
        let dir = tempfile::tempdir().unwrap();
        let segs = dir.path().join("segments");
        std::fs::create_dir(&segs).unwrap();
        for i in 0..40u64 {
            let mut bad = encode_line(&rec(100 + i));
            bad[20] ^= 1; // the check no longer matches
            let parts: Vec<&[u8]> = vec![&bad, b"0123"];
            std::fs::write(segs.join(format!("{:03}-{i}", i)), segment(&parts)).unwrap();
        }
        let j = read_with_segments(&dir.path().join("journal"), &segs).unwrap();
        let named: Vec<String> = j
            .problems
            .iter()
            .map(|p| match p {
                Problem::Corrupt { segment, .. } => segment.clone().unwrap_or_default(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(named.len(), 40, "{named:?}");
        let mut sorted = named.clone();
        sorted.sort();
        assert_eq!(named, sorted, "in segment-name order");
        let torn: Vec<&str> = j.torn_in_segments.iter().map(|(n, _)| n.as_str()).collect();
        assert!(torn.windows(2).all(|w| w[0] < w[1]) && torn.len() == 40, "{torn:?}");
    }

    #[test]
    fn a_journal_read_a_block_at_a_time_reads_as_the_whole_of_it_read_at_once() {
        // Lines, NUL runs, a damaged line and torn records placed across the reader's block
        // boundaries: what is found, and where, is what a read of the whole file finds.
        let dir = tempfile::tempdir().unwrap();
        let (main, segs) = (dir.path().join("journal"), dir.path().join("segments"));
        std::fs::create_dir(&segs).unwrap();
        let mut m = Vec::new();
        let mut g = Vec::new();
        let mut seq = 0;
        while m.len() < 3 * BLOCK + 100 {
            seq += 1;
            let mut line = encode_line(&rec(seq));
            if seq % 4001 == 0 {
                line[30] ^= 1;
            }
            m.extend_from_slice(&line);
            seq += 1;
            g.extend_from_slice(&encode_line(&rec(seq)));
            g.extend(std::iter::repeat_n(0u8, (seq as usize * 7) % 300));
            if seq % 5000 == 0 {
                let cut = encode_line(&rec(seq + 1_000_000));
                g.extend_from_slice(&cut[..cut.len() / 2]);
                g.push(0);
            }
        }
        let tail = encode_line(&rec(seq + 1));
        m.extend_from_slice(&tail[..tail.len() - 1]);
        g.extend_from_slice(&tail[..20]);
        std::fs::write(&main, &m).unwrap();
        std::fs::write(segs.join("5-2"), &g).unwrap();
        let got = read_with_segments(&main, &segs).unwrap();
        let mut want = JournalContents::default();
        parse_main_into(&m, &mut want);
        parse_segment_into("5-2", &g, &mut want);
        want.records.sort_unstable_by(Record::journal_order);
        assert!(got.records.len() > 10_000 && !got.problems.is_empty() && got.torn_in_segments.len() > 1);
        assert_eq!(got.records, want.records);
        assert_eq!(got.problems, want.problems);
        assert_eq!(
            (got.torn_tail, &got.torn_in_segments, got.bytes),
            (want.torn_tail, &want.torn_in_segments, want.bytes)
        );
        assert_eq!(got.torn_tail, Some((m.len() - tail.len() + 1) as u64));
    }

    #[test]
    fn the_nuls_a_segment_starts_with_are_counted_exactly_however_many() {
        for len in 0..70 {
            for at in 0..=len {
                let mut data = vec![0u8; len];
                if at < len {
                    data[at] = b'x';
                }
                assert_eq!(nuls_at_start(&data), at, "{len} bytes, the first non-NUL at {at}");
            }
        }
    }

    #[test]
    fn garbage_never_panics_the_reader() {
        for data in [&b"\n\n\n"[..], b"zzzzzzzzzzzzzzzz {\n", b"\xff\xfe\n", b"0123456789abcdef \n", b"\0\0\n\0"] {
            let j = parse_journal(data);
            assert!(j.records.is_empty());
            let mut j = JournalContents::default();
            parse_segment_into("1-1", data, &mut j);
            assert!(j.records.is_empty());
        }
    }
}
