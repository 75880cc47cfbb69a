//! For the workspace's own writers only (the recorder that the shim and the supervisor link,
//! the CLI's mark writer): the counters file word by word, and the fast encoder of a journal
//! line. Not an API: these change with the writers, whatever the library's version says.
//! Readers use [`crate::session`] and [`crate::journal`]; the format is `docs/FORMAT.md`.

use crate::journal::{finish_line, push_bytes_json, push_path_json, push_rfc3339_nanos, start_line};
use crate::record::{Before, Op, RECORD_VERSION};

/// The words of the counters file (`u64`s, little-endian, after [`crate::session::COUNTERS_MAGIC`]).
pub mod counters {
    /// Slot index (in `u64`s) of the last id handed out.
    pub const SLOT_LAST_ID: usize = 1;
    /// Slot index of the bytes kept.
    pub const SLOT_BYTES_KEPT: usize = 2;
    /// Slot index of the records that could not be written.
    pub const SLOT_LOST: usize = 3;
    /// Slot index of the names generation: bumped by every process of the session before a
    /// call that can change where an existing directory path leads (a rename, an unlink, an
    /// rmdir). On a cache line of its own, away from the id every record takes.
    pub const SLOT_NAMES_GEN: usize = 8;
    /// Slot index of the names changes done: bumped after each call [`SLOT_NAMES_GEN`] counted
    /// has run. While the two differ one is under way, and nothing checked meanwhile is
    /// trusted.
    pub const SLOT_NAMES_DONE: usize = 13;
    /// Slot index of the session's tag ([`session_tag`] of its id), written once the header
    /// exists by whoever wrote the header; 0 before (and in sessions older than it). A process
    /// that finds the tag of the session it expects here knows the header is there and is that
    /// session's without reading it.
    pub const SLOT_SESSION: usize = 14;
    /// Slot index of the working-directory generation: bumped before every change of a
    /// working directory in the session: by the shim before a `chdir` or `fchdir` it makes
    /// itself, marked, and by the supervisor before it lets one run. Under a supervisor only
    /// (without one nothing reads it).
    pub const SLOT_CWD_GEN: usize = 11;
    /// Slot index of the working-directory changes done: bumped after each change
    /// [`SLOT_CWD_GEN`] counted has run. While the two differ one is under way, and nothing
    /// checked meanwhile is trusted.
    pub const SLOT_CWD_DONE: usize = 12;
    /// Slot index of the number of marks made in the session: the turn a directory's times are
    /// journaled in (each directory's `dir_times` is journaled once per turn, so that an undo to
    /// a mark can set them back to what they were at it).
    pub const SLOT_MARKS: usize = 9;
    /// Slot index of the id of the session's newest mark: a file the session created, or copied
    /// whole, before it is captured again when it next changes (an undo to the mark needs the
    /// state it had there, which the creation or the copy does not hold).
    pub const SLOT_LAST_MARK: usize = 10;
    /// Slot index of the number of notifications the supervisor received (a call the kernel sent
    /// it), and, the next one, of those that were calls the shim had already journaled (passes).
    /// On a cache line of their own.
    pub const SLOT_NOTIFIED: usize = 16;
    /// See [`SLOT_NOTIFIED`].
    pub const SLOT_PASSED: usize = 17;
    /// Slot index of the supervisor's peak resident memory in KiB, written when it ends.
    pub const SLOT_SUPERVISOR_PEAK_KIB: usize = 18;
    /// Slot index of the execs the shim made itself, marked, under a supervisor: bumped before
    /// each, so that the supervisor, which does not see them, knows that a process it remembers
    /// may now run another program.
    pub const SLOT_EXECS: usize = 19;
    /// First slot of the names born unseen: [`BORN_NAMES`] entries of four `u64`s each (a
    /// sequence word, the hash of an absolute path, the record that journaled its creation, and
    /// the coarse realtime in nanoseconds, taken before the path was seen absent). The supervisor
    /// journals a creation before the kernel makes the file, so it never learns the new file's
    /// identity for the born table; an entry here lets whoever next changes the file at that path
    /// (the shim's `ftruncate` in Bun's `writeFileSync`) recognise it as born, by a birth time
    /// no earlier than the entry's, and copy nothing.
    pub const SLOT_BORN_NAMES: usize = 64;
    /// How many names born unseen the counters page keeps (direct-mapped by path hash).
    pub const BORN_NAMES: usize = 16;
    /// First slot of the passes (to the end of the page, two `u64`s each: a thread id and the
    /// address of that thread's cookie), with which a process tells its supervisor that the
    /// unmarked system calls of a libc function it is inside are already journaled (see the
    /// shim's `kernel.rs`). A quarter of the page in, on cache lines of their own.
    pub const SLOT_PASSES: usize = 128;

    /// First slot of the exec verdicts, the counters file's second page (slot 512 on): 64
    /// entries of eight `u64`s each (a sequence word, device, inode, size, mtime seconds, ctime
    /// seconds, the two times' nanoseconds (mtime's in the low half), and the uid the check was
    /// made for with the upper half of the FNV-1a hash of the name the program was run by in
    /// the upper half), direct-mapped by that hash. Each vouches that the file with exactly
    /// that identity, size and times was found a program the shim is loaded into
    /// (`crate::exec_check::Vouched`), so that the session's processes check a program once,
    /// not at every exec: a shell's forked child, whose memory is gone at its exec, cannot
    /// remember a verdict for the next one in its own.
    pub const SLOT_EXEC_VERDICTS: usize = 512;
    /// How many exec verdicts the counters file keeps.
    pub const EXEC_VERDICTS: usize = 64;

    /// Set in a pass's thread word for a *spawn pass*: held by a thread inside `posix_spawn`,
    /// whose child runs on the thread's memory until its exec (glibc's child, a `CLONE_VM`
    /// one, makes that exec itself, unmarked). It lets through an exec, and nothing else, of a
    /// thread on whose memory the pass's cookie (two words: [`spawn_pass_cookie`] and the
    /// `argv` pointer given to `posix_spawn`) is found matching the exec's own `argv`.
    pub const SPAWN_PASS: u64 = 1 << 32;

    /// The tag [`SLOT_SESSION`] holds for the session `id`: FNV-1a of its bytes, never 0.
    pub fn session_tag(id: &[u8]) -> u64 {
        fnv1a(id) | 1
    }

    /// FNV-1a (64 bits) of `bytes`: the hash the counters page keys its words by (a session's
    /// tag, a name born unseen).
    pub fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }

    /// The cookie a pass of thread `tid` holds in its own memory under the session's `mark`: what
    /// the supervisor expects to read at the address the pass names.
    pub fn pass_cookie(mark: u64, tid: u32) -> u64 {
        (mark ^ u64::from(tid).wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17) | 1
    }

    /// The first word of a spawn pass's cookie (see [`SPAWN_PASS`]): never a plain pass's
    /// cookie of the same thread, so that neither kind can be taken for the other.
    pub fn spawn_pass_cookie(mark: u64, tid: u32) -> u64 {
        pass_cookie(mark, tid) ^ 0x5350_4157_4E00_0002
    }
}

/// What [`encode_fields`] writes around a record's operation.
#[derive(Clone, Copy, Debug)]
pub struct Envelope<'a> {
    /// See [`crate::record::Record::seq`].
    pub seq: u64,
    /// See [`crate::record::Record::time`]: formatted as RFC 3339 with nanoseconds, UTC.
    pub time: std::time::SystemTime,
    /// See [`crate::record::Record::pid`].
    pub pid: u32,
    /// See [`crate::record::Record::ppid`].
    pub ppid: u32,
    /// See [`crate::record::Record::prog`], already encoded as JSON ([`prog_json`]): it is the same for
    /// every record a process image makes.
    pub prog_json: &'a [u8],
    /// See [`crate::record::Record::call`].
    pub call: &'a str,
}

/// A program name encoded as the JSON value [`Envelope::prog_json`] expects.
pub fn prog_json(prog: &crate::bpath::BPath) -> Vec<u8> {
    serde_json::to_vec(prog).unwrap_or_else(|_| b"\"\"".to_vec())
}

/// An exec record's operation by its parts, borrowed: what [`Op::Exec`] holds, for a writer
/// that has them at hand (the shim's exec hooks: the program's name, its `argv` as the C array
/// the caller passed, the working directory) and need not build the owned record, an
/// allocation for each part and one for the arguments together, to journal it.
#[derive(Clone, Copy, Debug)]
pub struct ExecParts<'a, A> {
    /// See [`crate::record::ExecOp::program`].
    pub program: &'a [u8],
    /// See [`crate::record::ExecOp::argv`]: each argument, in order.
    pub argv: A,
    /// See [`crate::record::ExecOp::cwd`].
    pub cwd: &'a [u8],
    /// See [`crate::record::ExecOp::child`].
    pub child: Option<u32>,
}

/// Encodes a record given as its fields as one journal line: exactly the bytes
/// [`crate::journal::encode_line`] makes of the same [`crate::record::Record`] (tested), for
/// about half the instructions.
///
/// # Rationale
/// This is the shim's hot path (one record per file `tar x` creates). serde_json spends most
/// of a record on the envelope's eight keys and values, each escaped and copied as its own
/// string; here the envelope, whose keys are fixed and whose values need no escaping (numbers,
/// a timestamp, the program name encoded once per process, a call name checked to be a plain
/// identifier), is written directly, and serde_json encodes only the operation, but for the
/// two commonest (a file created or claimed, an exec), written directly too.
pub fn encode_fields(env: &Envelope<'_>, op: &Op) -> Vec<u8> {
    let mut line = start_envelope(env);
    let written = match op {
        // The commonest record of all (every file a build or an unpack creates).
        Op::Change { path, before: b @ (Before::Absent | Before::Exclusive) } => {
            line.extend_from_slice(b"{\"kind\":\"change\",\"path\":");
            let ok = push_path_json(&mut line, path);
            line.extend_from_slice(if matches!(b, Before::Absent) {
                b",\"before\":{\"state\":\"absent\"}}"
            } else {
                b",\"before\":{\"state\":\"exclusive\"}}"
            });
            ok
        }
        Op::Exec(e) => push_exec(
            &mut line,
            ExecParts { program: e.program.as_bytes(), argv: e.argv.iter(), cwd: e.cwd.as_bytes(), child: e.child },
        ),
        _ => serde_json::to_writer(&mut line, op).is_ok(),
    };
    end_line(line, written)
}

/// [`encode_fields`] of an [`Op::Exec`] given by its parts: the same bytes (tested), without
/// the owned record.
pub fn encode_exec_fields<'a>(env: &Envelope<'_>, exec: ExecParts<'_, impl Iterator<Item = &'a [u8]>>) -> Vec<u8> {
    let mut line = start_envelope(env);
    let written = push_exec(&mut line, exec);
    end_line(line, written)
}

/// A line's start, its envelope, up to the operation's value.
fn start_envelope(env: &Envelope<'_>) -> Vec<u8> {
    let mut line = start_line();
    line.extend_from_slice(b"{\"v\":");
    let mut num = itoa::Buffer::new();
    line.extend_from_slice(num.format(RECORD_VERSION).as_bytes());
    line.extend_from_slice(b",\"seq\":");
    line.extend_from_slice(num.format(env.seq).as_bytes());
    line.extend_from_slice(b",\"time\":\"");
    // RFC 3339 output is digits, '-', ':', 'T', '.' and 'Z': nothing to escape.
    push_rfc3339_nanos(&mut line, env.time);
    line.extend_from_slice(b"\",\"pid\":");
    line.extend_from_slice(num.format(env.pid).as_bytes());
    line.extend_from_slice(b",\"ppid\":");
    line.extend_from_slice(num.format(env.ppid).as_bytes());
    line.extend_from_slice(b",\"prog\":");
    line.extend_from_slice(env.prog_json);
    line.extend_from_slice(b",\"call\":");
    if env.call.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        line.push(b'"');
        line.extend_from_slice(env.call.as_bytes());
        line.push(b'"');
    } else if serde_json::to_writer(&mut line, env.call).is_err() {
        line.extend_from_slice(b"\"\"");
    }
    line.extend_from_slice(b",\"op\":");
    line
}

/// Ends a line [`start_envelope`] began, its operation written (`null` if it could not be).
fn end_line(mut line: Vec<u8>, written: bool) -> Vec<u8> {
    if !written {
        line.extend_from_slice(b"null");
    }
    line.push(b'}');
    finish_line(line)
}

/// Writes an exec's operation, as serde_json writes an [`Op::Exec`]. One in every process a
/// shell or a harness starts (serde_json spent about 1,500 instructions on one, most of them
/// on the arguments, each a string of its own).
fn push_exec<'a>(line: &mut Vec<u8>, exec: ExecParts<'_, impl Iterator<Item = &'a [u8]>>) -> bool {
    line.extend_from_slice(b"{\"kind\":\"exec\",\"program\":");
    let mut ok = push_bytes_json(line, exec.program);
    line.extend_from_slice(b",\"argv\":[");
    for (i, arg) in exec.argv.enumerate() {
        if i > 0 {
            line.push(b',');
        }
        ok &= push_bytes_json(line, arg);
    }
    line.extend_from_slice(b"],\"cwd\":");
    ok &= push_bytes_json(line, exec.cwd);
    line.extend_from_slice(b",\"child\":");
    match exec.child {
        Some(child) => line.extend_from_slice(itoa::Buffer::new().format(child).as_bytes()),
        None => line.extend_from_slice(b"null"),
    }
    line.push(b'}');
    ok
}
