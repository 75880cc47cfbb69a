//! Names moved and removed: rename (every flag), unlink, rmdir, remove; and the templates the
//! mkstemp family creates names from.

use std::os::fd::AsFd;

use aether_journal::BPath;
use aether_journal::capture::{Intent, ident_of};
use aether_journal::config::Policy;
use aether_journal::record::{Before, Node, Op, RenameOp};
use aether_journal::resolve::Target;
use rustix::fs::FileType;

use super::{
    Caller, Journal, NamesChange, Pending, Resolved, capture, capturer, change, irreversible, leads, locate,
    pending_of, protect, refuse, stat_target, target_or_record,
};

/// Which kinds of node an unlink-like call accepts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Removes {
    /// unlink, unlinkat without AT_REMOVEDIR.
    NonDir,
    /// rmdir, unlinkat with AT_REMOVEDIR.
    Dir,
    /// remove.
    Either,
}

/// Before rename/renameat/renameat2.
#[allow(clippy::too_many_arguments)]
pub fn before_rename<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    olddir: i32,
    old: &[u8],
    newdir: i32,
    new: &[u8],
    flags: u32,
) -> Pending {
    let from = locate(journal, caller, olddir, old, false);
    let to = locate(journal, caller, newdir, new, false);
    // Told before any early return; taken back below when both ends are plain files.
    let names = NamesChange::begin(journal, caller);
    let (from, to) = match (from, to) {
        (Resolved::Protected(p), _) | (_, Resolved::Protected(p)) => return protect(journal, call, &p),
        (Resolved::Target(f), _) if journal.holds_store(f.abs.as_bytes()) => return protect(journal, call, &f.abs),
        (Resolved::WillFail, _) | (_, Resolved::WillFail) | (Resolved::Excluded, Resolved::Excluded) => {
            return Pending::Nothing;
        }
        (Resolved::Unknown(p, why), _) | (_, Resolved::Unknown(p, why)) => {
            return irreversible(journal, call, p, "resolve the path", why);
        }
        // One end outside the journaled world: what matters is the end inside it.
        (Resolved::Excluded, Resolved::Target(t)) | (Resolved::Target(t), Resolved::Excluded) => {
            super::note_dir_times(journal, call, &t);
            return match stat_target(journal, call, &t) {
                Ok(Some(st)) => {
                    let before = capture(journal, t.parent.as_fd(), &t.name, &st, Intent::Destroy);
                    change(journal, caller, call, t.abs, before)
                }
                Ok(None) => change(journal, caller, call, t.abs, Before::Absent),
                Err(p) => p,
            };
        }
        (Resolved::Target(f), Resolved::Target(t)) => (f, t),
    };
    let fst = match stat_target(journal, call, &from) {
        Ok(Some(st)) => st,
        Ok(None) => return Pending::Nothing,
        Err(p) => return p,
    };
    let moved = Some(ident_of(&fst));
    super::note_dir_times(journal, call, &from);
    super::note_dir_times(journal, call, &to);
    if flags & libc::RENAME_EXCHANGE != 0 {
        journal.record(
            call,
            Op::Rename(Box::new(RenameOp { from: from.abs, to: to.abs, flags, moved, to_before: Before::Absent })),
        );
        return Pending::Nothing;
    }
    let mut likely_to_fail = false;
    let to_before = match stat_target(journal, call, &to) {
        Err(p) => return p,
        Ok(None) => {
            names.only_if(leads(&fst));
            Before::Absent
        }
        // EEXIST as things stand; but the destination may be gone by the time the call runs
        // (another process renamed it away: `mv` tries RENAME_NOREPLACE first), and a
        // no-replace rename that succeeds found it absent. Journaled, so that such a move is
        // never missing from the journal; undo sees whether it took effect.
        Ok(Some(_)) if flags & libc::RENAME_NOREPLACE != 0 => {
            names.only_if(leads(&fst));
            likely_to_fail = true;
            Before::Absent
        }
        // Two names of one inode: rename does nothing at all.
        Ok(Some(tst)) if ident_of(&tst) == ident_of(&fst) => return Pending::Nothing,
        Ok(Some(tst)) => {
            names.only_if(leads(&fst) || leads(&tst));
            capture(journal, to.parent.as_fd(), &to.name, &tst, Intent::Destroy)
        }
    };
    if let Before::Irreversible { reason } = &to_before
        && journal.settings().policy == Policy::Strict
    {
        let what = format!("{call} over {}: {reason}", to.abs.display_lossy());
        return refuse(journal, call, what, libc::EACCES);
    }
    let seq = journal.record(
        call,
        Op::Rename(Box::new(RenameOp { from: from.abs, to: to.abs, flags, moved, to_before: to_before.clone() })),
    );
    if likely_to_fail {
        // When it does fail (EEXIST), a call_failed record says so (where results are seen).
        return Pending::Recorded(seq);
    }
    pending_of(caller, &to_before, seq)
}

/// Before unlink/unlinkat/rmdir/remove.
pub fn before_remove<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    dirfd: i32,
    path: &[u8],
    removes: Removes,
) -> Pending {
    let t = match target_or_record(journal, caller, call, dirfd, path, false) {
        Ok(t) => t,
        Err(p) => return p,
    };
    let names = NamesChange::begin(journal, caller);
    super::note_dir_times(journal, call, &t);
    if removes == Removes::NonDir {
        // The common case (rm of a file): link first, look after.
        let linked = journal.with_blobs(|blobs| {
            capturer(journal, blobs, Intent::Destroy).capture_doomed_file(t.parent.as_fd(), &t.name)
        });
        if let Some(Some(before)) = linked {
            names.only_if(
                !matches!(&before, Before::Contents(s) if matches!(s.node, Node::File { .. } | Node::Packed { .. })),
            );
            forget_born(journal, &before);
            return change(journal, caller, call, t.abs, before);
        }
    }
    let st = match stat_target(journal, call, &t) {
        Ok(Some(st)) => st,
        Ok(None) => return Pending::Nothing,
        Err(p) => return p,
    };
    names.only_if(leads(&st));
    let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
    match removes {
        Removes::NonDir if is_dir => return Pending::Nothing, // EISDIR
        Removes::Dir if !is_dir => return Pending::Nothing,   // ENOTDIR
        _ => {}
    }
    let before = capture(journal, t.parent.as_fd(), &t.name, &st, Intent::Destroy);
    forget_born(journal, &before);
    change(journal, caller, call, t.abs, before)
}

/// A file the session removes may free its inode number for a file that is not the
/// session's: its born entry goes.
fn forget_born<J: Journal>(journal: &J, before: &Before) {
    if let (Before::Contents(snap), Some(index)) = (before, journal.born_mapped()) {
        index.forget_born(snap.ident);
    }
}

/// Before a call that creates a name from a template (the mkstemp family, mkdtemp): the
/// intent, so that a process killed before the name is journaled leaves a trace undo reports.
/// Also returns the template's absolute name, which names the directory the call creates in.
pub fn before_mktemp<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    template: &[u8],
) -> (Pending, Option<BPath>) {
    match target_or_record(journal, caller, call, libc::AT_FDCWD, template, false) {
        Ok(t) => {
            let abs = t.abs.clone();
            super::note_dir_times(journal, call, &t);
            (Pending::Recorded(journal.record(call, Op::TempName { template: t.abs })), Some(abs))
        }
        Err(p) => (p, None),
    }
}

/// The absolute name a call created from a template (the mkstemp family), given the name it
/// chose (`path`) and the template's absolute name: the call only replaces the end of its
/// last component, so no system call is needed; without the template, `path` is resolved.
pub fn temp_name_target<J: Journal, C: Caller>(
    journal: &J,
    caller: &C,
    call: &str,
    path: &[u8],
    template: Option<&BPath>,
) -> Option<BPath> {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    match template.and_then(BPath::split_parent) {
        Some((dir, _)) if !name.is_empty() && name != b"." && name != b".." => {
            Some(BPath::new(aether_journal::bpath::join(dir, name)))
        }
        _ => target_or_record(journal, caller, call, libc::AT_FDCWD, path, false).ok().map(|t: Target<'_>| t.abs),
    }
}
