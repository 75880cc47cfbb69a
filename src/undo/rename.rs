//! Renames undone: a move back, an exchange swapped back.

use super::fs::*;
use super::*;

impl Executor<'_> {
    pub(super) fn undo_move(&self, from: &BPath, to: &BPath, flags: u32, moved: Option<&crate::record::Ident>) -> Done {
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
            Ok(Some(st)) if moved.is_some_and(|m| *m != ident_of(&st)) && !super::tree::made_here(to.as_bytes()) => {
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
