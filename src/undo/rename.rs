//! Renames undone: a move back, an exchange swapped back.

use super::fs::*;
use super::*;

impl Executor<'_> {
    pub(super) fn undo_move(
        &self,
        from: &BPath,
        to: &BPath,
        flags: u32,
        moved: Option<&crate::record::Ident>,
        to_before: &Before,
    ) -> Done {
        // What moves may be a directory.
        self.forget_parent();
        let (fdir, fname) = match self.parent_of(from) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let (tdir, tname) = match self.parent_of(to) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let fcur = match fdir.lstat(fname) {
            Ok(c) => c,
            Err(e) => return failed_errno(e, format!("cannot examine it: {}", describe_errno(e))),
        };
        if let Some(st) = &fcur {
            let whiteout = RenameFlags::from_bits_retain(flags).contains(RenameFlags::WHITEOUT)
                && file_type(st) == FileType::CharacterDevice
                && st.st_rdev == 0;
            if !whiteout {
                return done(Outcome::Unchanged, "the source is in place: the rename did not take effect".into());
            }
            if let Err(e) = fdir.remove(fname, st) {
                return failed_errno(
                    e,
                    format!("cannot remove the whiteout left by the rename: {}", describe_errno(e)),
                );
            }
        }
        match tdir.lstat(tname) {
            // Moved back by identity: another inode at the destination than the one the
            // session moved there (a rename by another process in between, or anything made
            // there since) is not moved onto the source's name, unless this undo put it there.
            // A newer record of this undo put back at the destination what it held before this
            // rename (the two renames onto it raced: this one's record is older, but the
            // newer one captured the destination before this one ran): this rename's effect
            // there is already reversed, and the file it moved was replaced by the other.
            Ok(Some(st))
                if moved.is_some_and(|m| *m != ident_of(&st))
                    && super::tree::made_here(to.as_bytes())
                    && holds_snapshot(&st, to_before) =>
            {
                if self.made_by_this_undo_s_records(from) {
                    return done_because(
                        Outcome::Unchanged,
                        Cause::AlreadyAsBefore,
                        format!(
                            "{} holds again what it held before this rename (a newer record that raced it put that back), and the file this rename moved there was made by the session",
                            to.display_lossy()
                        ),
                    );
                }
                return done_because(
                    Outcome::Conflict,
                    Cause::Replaced,
                    format!(
                        "the file this rename moved to {} was replaced there by another rename that raced it, and nothing kept it: it was not moved back",
                        to.display_lossy()
                    ),
                );
            }
            Ok(Some(st)) if moved.is_some_and(|m| *m != ident_of(&st)) && !super::tree::made_here(to.as_bytes()) => {
                if let Some(older) = self.older_rename_that_ran_after(from, to, &ident_of(&st)) {
                    return done_because(
                        Outcome::Unchanged,
                        Cause::CoveredBy { seq: older },
                        format!(
                            "{} holds the file record {older} moved there, which the kernel did after this rename although its record is older (two processes renamed onto one name at once); record {older}, which this undo also undoes, puts back what the name held before both, and the file this rename moved was made by the session",
                            to.display_lossy()
                        ),
                    );
                }
                return done_because(
                    Outcome::Conflict,
                    Cause::Replaced,
                    format!(
                        "{} holds another file than the one the session moved there (inode {} now, {} in the record): it was not moved back",
                        to.display_lossy(),
                        st.st_ino,
                        moved.map_or(0, |m| m.ino)
                    ),
                );
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                return failed_because(
                    Cause::Gone,
                    format!(
                        "it was renamed to {}, which no longer exists: the renamed file is gone",
                        to.display_lossy()
                    ),
                );
            }
            Err(e) => return failed_errno(e, format!("cannot examine {}: {}", to.display_lossy(), describe_errno(e))),
        }
        match tdir.rename(tname, &fdir, fname, RenameFlags::NOREPLACE) {
            Ok(()) => done(Outcome::Restored, format!("moved back from {}", to.display_lossy())),
            Err(e) => {
                failed_errno(e, format!("cannot move it back from {}: {}", to.display_lossy(), describe_errno(e)))
            }
        }
    }

    /// Two renames onto `to` racing: the older record `R'` (returned) moved the file `now` holds
    /// there, so the kernel ran it after this one (each record takes its seq after its capture
    /// and before its call, so `R'` also captured what `to` held before this rename ran, and
    /// undoing it puts that back). Only when nothing else of this undo touches `to` between
    /// the two, and the file this rename moved away from `from` was made by the session (the
    /// newest older record of `from` is its creation), whose undo leaves `from` absent anyway.
    fn older_rename_that_ran_after(&self, from: &BPath, to: &BPath, now: &crate::record::Ident) -> Option<u64> {
        let racer = self.newest_older_record_of(to)?;
        let Op::Rename(r) = &racer.op else { return None };
        let crate::record::RenameOp { to: t, moved: Some(m), flags, .. } = &**r else { return None };
        if t != to || m != now || RenameFlags::from_bits_retain(*flags).contains(RenameFlags::EXCHANGE) {
            return None;
        }
        self.made_by_this_undo_s_records(from).then_some(racer.seq)
    }

    /// Whether the newest record older than the current one that names `from`, among those this
    /// undo reverses, is its creation: undoing it leaves `from` absent, whatever was there.
    fn made_by_this_undo_s_records(&self, from: &BPath) -> bool {
        matches!(self.newest_older_record_of(from).map(|r| &r.op), Some(Op::Change { path, before: Before::Absent | Before::Exclusive }) if path == from)
    }

    /// The newest record older than the one being undone that names `path` and that this undo
    /// (not an earlier one) reverses.
    fn newest_older_record_of(&self, path: &BPath) -> Option<&Record> {
        let current = self.current.get()?;
        let older = &self.journal.records[..self.journal.records.partition_point(|r| r.seq < current)];
        older
            .iter()
            .rev()
            .filter(|r| self.undoes(r.seq) && !self.already.contains(&r.seq))
            .find(|r| crate::select::record_paths(r).contains(&path))
    }

    pub(super) fn undo_exchange(&self, a: &BPath, b: &BPath, moved: Option<&crate::record::Ident>) -> Done {
        self.forget_parent();
        let (adir, aname) = match self.parent_of(a) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let (bdir, bname) = match self.parent_of(b) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let ast = adir.lstat(aname).ok().flatten();
        let bst = bdir.lstat(bname).ok().flatten();
        let Some(moved) = moved else {
            return failed("the exchanged file's identity was not recorded");
        };
        if ast.as_ref().is_some_and(|st| ident_of(st) == *moved) {
            return done(Outcome::Unchanged, "the exchange did not take effect".into());
        }
        if !bst.as_ref().is_some_and(|st| ident_of(st) == *moved) {
            return failed_because(
                Cause::Gone,
                format!("neither {} nor {} holds the exchanged file any more", a.display_lossy(), b.display_lossy()),
            );
        }
        match adir.rename(aname, &bdir, bname, RenameFlags::EXCHANGE) {
            Ok(()) => done(Outcome::Restored, format!("exchanged back with {}", b.display_lossy())),
            Err(e) => failed_errno(e, format!("cannot exchange it back: {}", describe_errno(e))),
        }
    }

    /// Follows a directory that an undo step moved from `now` back to `back` (or exchanged
    /// with it): its queued metadata, and its entries', move with it.
    pub(super) fn deferred_moved(&self, now: &BPath, back: &BPath, exchange: bool) {
        let swap = |p: &BPath, from: &BPath, to: &BPath| -> Option<BPath> {
            p.starts_with_dir(from.as_bytes()).then(|| {
                let mut b = to.as_bytes().to_vec();
                b.extend_from_slice(&p.as_bytes()[from.as_bytes().len()..]);
                BPath::new(b)
            })
        };
        for d in self.deferred.borrow_mut().iter_mut() {
            let moved = swap(&d.path, now, back).or_else(|| if exchange { swap(&d.path, back, now) } else { None });
            if let Some(p) = moved {
                d.path = p;
            }
        }
    }
}

/// Whether `st` is the state `snap` describes: the same inode (a capture by hard link, put back
/// as itself), or a regular file of its size, mode and modification time (a copy put back).
fn holds_snapshot(st: &Stat, before: &Before) -> bool {
    let Before::Contents(snap) = before else { return false };
    if ident_of(st) == snap.ident {
        return true;
    }
    matches!(snap.node, Node::File { size, .. } | Node::Packed { size, .. } if size == st.st_size as u64)
        && file_type(st) == FileType::RegularFile
        && st.st_mode & 0o7777 == snap.mode & 0o7777
        && [st.st_mtime, st.st_mtime_nsec as i64] == snap.mtime
}
