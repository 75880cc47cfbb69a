//! Opens that write, create or truncate; truncation by name and through a descriptor; names
//! created (mkdir, link, symlink, mknod).

use std::os::fd::{AsFd, BorrowedFd};

use aether_journal::BPath;
use aether_journal::capture::{Intent, ident_of};
use aether_journal::record::{Before, CaptureHow, Ident, Node, Op};
use aether_journal::resolve::Target;
use rustix::fs::{AtFlags, FileType, Stat, StatxFlags};

use super::{
    Caller, Journal, Pending, before_of, capture, capturer, existing_target, protect, record_change, stat_target,
    target_or_record,
};
use crate::index::Origin;

/// Whether open flags can change anything (the read-only fast path is the negation).
#[inline(always)]
pub fn open_mutates(flags: i32) -> bool {
    // O_TMPFILE includes the O_DIRECTORY bit, so it is tested whole: a plain directory open
    // must stay on the fast path.
    flags & libc::O_PATH == 0
        && (flags & (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) != 0
            || flags & libc::O_TMPFILE == libc::O_TMPFILE)
}

/// Before open/openat/creat/fopen and friends.
pub fn before_open<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    dirfd: i32,
    path: &[u8],
    flags: i32,
) -> Pending {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        // An unnamed file: nothing appears in the tree unless it is linked in later.
        return Pending::Nothing;
    }
    let creat = flags & libc::O_CREAT != 0;
    let excl = flags & libc::O_EXCL != 0;
    let follow = flags & libc::O_NOFOLLOW == 0 && !(creat && excl);
    let t = match target_or_record(journal, caller, call, dirfd, path, follow) {
        Ok(t) => t,
        Err(p) => return p,
    };
    if creat && excl && caller.exclusive_without_looking() {
        // The call creates the file or fails: its result says which, and undo can tell a
        // file this call made from one that was there by its birth time (Before::Exclusive).
        super::note_dir_times(journal, call, &t);
        return created(journal, call, t.abs, Before::Exclusive);
    }
    // Before the name is seen absent: a file born there afterwards is born no earlier.
    let since = (creat && !caller.sees_results()).then(coarse_realtime_ns);
    let st = match stat_target(journal, call, &t) {
        Ok(Some(st)) => st,
        Ok(None) if creat => {
            if excl {
                caller.found_name_free();
            }
            let abs = t.abs.clone();
            super::note_dir_times(journal, call, &t);
            let pending = created(journal, call, t.abs, Before::Absent);
            if let (Some(since), Pending::Created { created, .. }) = (since, &pending) {
                // The supervisor never sees the file the kernel is about to make: whoever
                // changes it next recognises it by this note (see SLOT_BORN_NAMES).
                journal.counters().note_born_name(abs.as_bytes(), *created, since);
            }
            return pending;
        }
        Ok(None) => return Pending::Nothing,
        Err(p) => return p,
    };
    if creat && excl {
        return Pending::Nothing; // EEXIST
    }
    let acc = flags & libc::O_ACCMODE;
    let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
    let ft = FileType::from_raw_mode(st.st_mode);
    let intent = match ft {
        // Moving a big file aside needs to see the call fail, to put it back.
        FileType::RegularFile if flags & libc::O_TRUNC != 0 && caller.sees_results() => Intent::Truncate,
        FileType::RegularFile if flags & libc::O_TRUNC != 0 => Intent::Overwrite,
        FileType::RegularFile if acc == libc::O_WRONLY && flags & libc::O_APPEND != 0 => Intent::Append,
        FileType::RegularFile if writes => Intent::Overwrite,
        FileType::Fifo | FileType::Socket | FileType::CharacterDevice | FileType::BlockDevice if writes => {
            Intent::Overwrite
        }
        // Directories, symlinks (O_NOFOLLOW: ELOOP) and read-only opens change nothing.
        _ => return Pending::Nothing,
    };
    before_rewrite(journal, caller, call, &t, &st, intent)
}

/// Journals the creation of `path` by an open (`before`: absent, or an exclusive create not
/// looked at first).
fn created<J: Journal>(journal: &J, call: &str, path: BPath, before: Before) -> Pending {
    let looked = matches!(before, Before::Absent);
    let created = journal.record(call, Op::Change { path, before });
    // Mapped here, under the guard, so that the lock-free learning after the call can mark
    // the new file born for every process of the session.
    let _ = journal.born();
    Pending::Created { created, looked }
}

/// Before truncate/truncate64.
pub fn before_truncate<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, path: &[u8]) -> Pending {
    let (t, st) = match existing_target(journal, caller, call, libc::AT_FDCWD, path, true) {
        Ok(x) => x,
        Err(p) => return p,
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Pending::Nothing;
    }
    before_rewrite(journal, caller, call, &t, &st, Intent::Overwrite)
}

/// Before a call rewrites the existing file at `t` (whose `lstat` is `st`) in place with
/// `intent` (an open for writing, truncate, ftruncate): journals what undo needs and returns
/// what the hook must do after the call.
///
/// A regular file the session already holds what undo needs for is not copied: a file it
/// created gets a `born` record; a file an earlier call copied whole reuses that copy while
/// it is unchanged (a capture like any other, which a selective undo can restore on its own),
/// and once it has changed gets a `kept` record naming that copy's record. Anything else is
/// captured; a truncation the capture moved aside is put back if the call fails.
fn before_rewrite<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    t: &Target<'_>,
    st: &Stat,
    intent: Intent,
) -> Pending {
    let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    if let Some(origin) = regular.then(|| origin_of(journal, t, st)).flatten() {
        if let Origin::Kept(_) = origin {
            let reused = journal
                .with_blobs(|blobs| capturer(journal, blobs, Intent::Overwrite).reuse(t.parent.as_fd(), &t.name, st))
                .flatten();
            if let Some(before) = reused {
                return kept_change(journal, caller, call, t, st, before);
            }
        }
        let seq = journal.record(call, Op::Change { path: t.abs.clone(), before: before_of(origin) });
        return Pending::BornRewrite { seq, origin };
    }
    let before = capture(journal, t.parent.as_fd(), &t.name, st, intent);
    let moved_aside = intent == Intent::Truncate
        && matches!(&before, Before::Contents(s) if matches!(s.node, Node::File { how: CaptureHow::Link, .. }));
    match kept_change(journal, caller, call, t, st, before) {
        Pending::Linked { blob, seq } if moved_aside => Pending::MovedAside { blob, seq, path: t.abs.clone() },
        other => other,
    }
}

/// A `change` record for a capture before a call that rewrites a regular file in place: when
/// the capture is a whole copy (or clone) of a file with one name (`st`), the file is also
/// marked kept in the session's born table, so that later rewrites by any process of the
/// session copy nothing more (undoing this record puts back the state they would have kept).
/// One `statx` more, on a path that has just copied the file.
///
/// One name only: undo puts a copy back through the name it was taken from, and a file with
/// other names could come back as a new inode there (a removal kept by copy, across file
/// systems) while a rewrite through another name, journaled as kept, would be left as it is.
fn kept_change<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    t: &Target<'_>,
    st: &Stat,
    before: Before,
) -> Pending {
    let whole = match &before {
        Before::Contents(s)
            if st.st_nlink == 1
                && matches!(
                    s.node,
                    Node::Packed { .. } | Node::File { how: CaptureHow::Copy | CaptureHow::Reflink, .. }
                ) =>
        {
            Some(s.ident)
        }
        _ => None,
    };
    let (pending, seq) = record_change(journal, caller, call, t.abs.clone(), before);
    // The table is mapped (and the birth time asked) only for a whole copy that was recorded.
    let Some((ident, seq)) = whole.zip(seq) else { return pending };
    if let (Some(index), Some((now, btime))) =
        (journal.born(), birth_of(t.parent.as_fd(), &t.name, AtFlags::SYMLINK_NOFOLLOW))
        && now == ident
    {
        index.remember_origin(ident, btime, Origin::Kept(seq));
    }
    pending
}

/// Why the file at `t` (whose `lstat` is `st`) needs no capture, if it does not: a process of
/// this session created it, or already copied it whole. The born table has an entry for its
/// inode, and `statx` gives the birth time that entry was made with. No system call unless
/// the table names the inode.
///
/// A file whose creation the supervisor journaled is not in the born table (the supervisor
/// never sees the file the kernel makes): its path's note in the counters page stands for
/// it, once, if the file was born no earlier than the path was seen absent; it then goes into
/// the born table.
fn origin_of<J: Journal>(journal: &J, t: &Target<'_>, st: &Stat) -> Option<Origin> {
    // Made or copied before the session's newest mark: an undo to the mark needs the state
    // the file had there, which that record does not hold.
    let since = journal.counters().last_mark();
    known_origin(journal, t, st).filter(|o| match o {
        Origin::Born(seq) | Origin::Kept(seq) => *seq > since,
    })
}

fn known_origin<J: Journal>(journal: &J, t: &Target<'_>, st: &Stat) -> Option<Origin> {
    let index = journal.born()?;
    let ident = ident_of(st);
    if !index.may_be_born(ident) {
        let (created, since) = journal.counters().take_born_name(t.abs.as_bytes())?;
        let (now, btime) = birth_of(t.parent.as_fd(), &t.name, AtFlags::SYMLINK_NOFOLLOW)?;
        if now != ident || btime < since {
            return None;
        }
        index.remember_origin(ident, btime, Origin::Born(created));
        return Some(Origin::Born(created));
    }
    let (now, btime) = birth_of(t.parent.as_fd(), &t.name, AtFlags::SYMLINK_NOFOLLOW)?;
    if now != ident {
        return None;
    }
    index.origin(ident, btime)
}

/// The realtime clock file timestamps are taken from (coarse), in nanoseconds.
fn coarse_realtime_ns() -> i64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    ts.tv_sec.saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec)
}

/// The identity and birth time (nanoseconds since the epoch) of `name` under `dir`, if the
/// file system keeps birth times.
pub fn birth_of(dir: BorrowedFd<'_>, name: &[u8], flags: AtFlags) -> Option<(Ident, i64)> {
    let sx = rustix::fs::statx(dir, name, flags, StatxFlags::INO | StatxFlags::BTIME).ok()?;
    if !StatxFlags::from_bits_retain(sx.stx_mask).contains(StatxFlags::BTIME) {
        return None;
    }
    let dev = rustix::fs::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    let btime = sx.stx_btime.tv_sec.saturating_mul(1_000_000_000).saturating_add(i64::from(sx.stx_btime.tv_nsec));
    Some((Ident { dev, ino: sx.stx_ino }, btime))
}

/// Before a call that changes a file through a descriptor (ftruncate): the descriptor is
/// resolved to its path, and the file captured there if that name still leads to it (`fst` is
/// the descriptor's own `stat`).
pub fn before_fd_change<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, fd: i32, fst: &Stat) -> Pending {
    if FileType::from_raw_mode(fst.st_mode) != FileType::RegularFile {
        return Pending::Nothing;
    }
    let Ok(path) = caller.fd_path(fd) else { return Pending::Nothing };
    if journal.protected(&path) {
        return protect(journal, call, &BPath::new(path));
    }
    if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") {
        // An unlinked file: it is not in the tree, and a capture made when it was opened or
        // removed inside the session already covers it.
        return Pending::Nothing;
    }
    let (t, st) = match existing_target(journal, caller, call, libc::AT_FDCWD, &path, false) {
        Ok(x) => x,
        Err(p) => return p,
    };
    if ident_of(&st) != ident_of(fst) {
        return Pending::Nothing;
    }
    before_rewrite(journal, caller, call, &t, &st, Intent::Overwrite)
}

/// Before a call that creates a new name and fails if it exists (mkdir, link, symlink,
/// mknod, mkfifo and their *at forms; a Unix socket's bind): the name was absent, so undo
/// removes it.
pub fn before_create<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, dirfd: i32, path: &[u8]) -> Pending {
    let t = match target_or_record(journal, caller, call, dirfd, path, false) {
        Ok(t) => t,
        Err(p) => return p,
    };
    match stat_target(journal, call, &t) {
        Ok(None) => {
            super::note_dir_times(journal, call, &t);
            super::change(journal, caller, call, t.abs, Before::Absent)
        }
        Ok(Some(_)) => Pending::Nothing, // EEXIST
        Err(p) => p,
    }
}

/// Before link/linkat: the new name as for [`before_create`], but a source in the session's
/// own store is refused, whatever the policy: a second name for a store file outside the
/// store would let any process of the session empty or rewrite its journal and blobs through
/// it (`follow`: `AT_SYMLINK_FOLLOW`).
#[allow(clippy::too_many_arguments)]
pub fn before_link<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    olddirfd: i32,
    old: &[u8],
    newdirfd: i32,
    new: &[u8],
    follow: bool,
) -> Pending {
    if let super::Resolved::Protected(p) = super::locate(journal, caller, olddirfd, old, follow) {
        return super::protect(journal, call, &p);
    }
    before_create(journal, caller, call, newdirfd, new)
}

/// Translates an `fopen` mode string into `open` flags (`None` for an invalid mode, which
/// makes fopen fail with EINVAL).
pub fn fopen_flags(mode: &[u8]) -> Option<i32> {
    let (&first, rest) = mode.split_first()?;
    let (mut acc, mut extra) = match first {
        b'r' => (libc::O_RDONLY, 0),
        b'w' => (libc::O_WRONLY, libc::O_CREAT | libc::O_TRUNC),
        b'a' => (libc::O_WRONLY, libc::O_CREAT | libc::O_APPEND),
        _ => return None,
    };
    for &c in rest.iter().take_while(|&&c| c != b',') {
        match c {
            b'+' => acc = libc::O_RDWR,
            b'x' => extra |= libc::O_EXCL,
            b'e' => extra |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    Some(acc | extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_map_to_the_open_flags_glibc_uses() {
        assert_eq!(fopen_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"rb"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"r+"), Some(libc::O_RDWR));
        assert_eq!(fopen_flags(b"w"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(fopen_flags(b"a+"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND));
        assert_eq!(fopen_flags(b"wx"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL));
        assert_eq!(fopen_flags(b"r,ccs=UTF-8+"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b""), None);
        assert_eq!(fopen_flags(b"z"), None);
    }

    #[test]
    fn only_writing_creating_or_truncating_opens_are_mutations() {
        assert!(!open_mutates(libc::O_RDONLY));
        assert!(!open_mutates(libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC));
        assert!(!open_mutates(libc::O_PATH | libc::O_WRONLY));
        assert!(open_mutates(libc::O_WRONLY));
        assert!(open_mutates(libc::O_RDONLY | libc::O_CREAT));
        assert!(open_mutates(libc::O_RDONLY | libc::O_TRUNC));
        assert!(open_mutates(libc::O_TMPFILE | libc::O_RDWR));
    }

    #[test]
    fn the_identity_statx_gives_with_a_birth_time_is_the_one_stat_gives() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let st = rustix::fs::fstat(&file).unwrap();
        let Some((by_fd, btime)) = birth_of(file.as_fd(), b"", AtFlags::EMPTY_PATH) else {
            panic!("this file system keeps no birth times: nothing here is tested");
        };
        assert_eq!(by_fd, ident_of(&st), "device numbers composed as stat reports them");
        let dir = std::fs::File::open(t.path()).unwrap();
        assert_eq!(birth_of(dir.as_fd(), b"f", AtFlags::SYMLINK_NOFOLLOW), Some((by_fd, btime)), "by name");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
        assert!(btime > 0 && btime <= now, "a birth time in nanoseconds since the epoch: {btime}");
    }
}
