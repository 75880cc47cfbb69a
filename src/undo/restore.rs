//! The restore actions: removing what the session created, putting back files, prefixes,
//! symlinks, directories and special nodes, from the store and verified.

use rustix::io::Errno;

use super::fs::*;
use super::meta::*;
use super::*;

impl Executor<'_> {
    /// The blob holding `ident`, when a hard-link capture put that inode in the store and it is
    /// still there.
    pub(super) fn stored_inode(&self, ident: crate::record::Ident) -> Option<&str> {
        let blob = self.linked.get(&ident)?;
        let st = self.blobs.lstat(blob.as_bytes()).ok().flatten()?;
        (ident_of(&st) == ident).then_some(blob.as_str())
    }

    /// Restores a snapshot into the captured inode that now lives in the store as `stored`.
    pub(super) fn restore_in_store(&self, stored: &str, snap: &Snapshot) -> Done {
        let dst = match self.blobs.open_wronly(stored.as_bytes()) {
            Ok(fd) => fd,
            Err(e) => {
                return failed_errno(
                    e,
                    format!("cannot open its captured inode (blob {stored}): {}", describe_errno(e)),
                );
            }
        };
        let later = format!("in the captured file (blob {stored}), which an older step puts back");
        match &snap.node {
            Node::Prefix { len } => {
                let now = dst.stat().map(|st| st.st_size as u64).unwrap_or(0);
                if now < *len {
                    return failed_because(
                        Cause::PriorBytesGone,
                        format!(
                            "only its length before an append ({len} bytes) was kept, but the file is now shorter ({now} bytes): bytes from before the session are gone"
                        ),
                    );
                }
                if let Err(e) = dst.truncate(*len) {
                    return failed_errno(e, format!("cannot truncate it back to {len} bytes: {}", describe_errno(e)));
                }
                match set_meta_fd(&dst, snap) {
                    None => done(
                        Outcome::Restored,
                        format!("truncated the appended bytes away ({now} -> {len} bytes) {later}"),
                    ),
                    Some(p) => failed(format!("truncated back to {len} bytes, but {p}")),
                }
            }
            Node::File { .. } | Node::Packed { .. } => {
                let (src, size) = match self.captured(&snap.node) {
                    Ok((src, _, size)) => (src, size),
                    Err(done) => return done,
                };
                if let Err(e) = src.write_into(&dst) {
                    return failed(format!("writing the captured contents back failed: {e}"));
                }
                match set_meta_fd(&dst, snap) {
                    None => done(
                        Outcome::Restored,
                        format!("wrote back its prior contents ({size} bytes, verified) {later}"),
                    ),
                    Some(p) => failed(format!("contents restored, but {p}")),
                }
            }
            _ => failed("this kind of capture cannot be restored into the store"),
        }
    }

    /// The hash a blob must have: recorded at capture time (by this record, or by the one that
    /// made a blob this record reuses), or (linked and cloned captures) when the session was
    /// sealed.
    pub(super) fn expected_hash<'h>(&'h self, blob: &str, recorded: Option<&'h str>) -> Option<&'h str> {
        recorded
            .or_else(|| self.hashed.get(blob).map(String::as_str))
            .or_else(|| self.seal.and_then(|s| s.blob_hashes.get(blob)).map(String::as_str))
    }

    /// The captured bytes a copy (`Node::File` but a link) or a packed capture holds, checked
    /// against what was recorded: the source, its BLAKE3 hex and its length. A blob or pack
    /// that is missing, or whose bytes are not the ones captured, is a failed step.
    pub(super) fn captured(&self, node: &Node) -> Result<(Captured, String, u64), Done> {
        let damaged = |blob: &str| {
            failed_because(
                Cause::BlobDamaged { blob: blob.to_string() },
                format!(
                    "blob {blob} does not match what was captured: it was tampered with or damaged and was not written back"
                ),
            )
        };
        let missing = |blob: &str| {
            failed_because(
                Cause::BlobMissing { blob: blob.to_string() },
                format!("its captured contents (blob {blob}) are missing from the store"),
            )
        };
        match node {
            Node::Packed { pack, at, size, hash } => {
                // Never changed by an undo: read as it really is, in a dry run too.
                let blobs = self
                    .blobs
                    .borrowed()
                    .map_err(|e| failed_errno(e, format!("cannot open the store: {}", describe_errno(e))))?;
                match crate::pack::read(blobs, pack, *at, *size, hash) {
                    Ok(bytes) => Ok((Captured::Bytes(bytes.into()), hash.clone(), *size)),
                    Err(crate::pack::PackError::Missing) => Err(missing(pack)),
                    Err(crate::pack::PackError::Damaged) => Err(damaged(pack)),
                    Err(crate::pack::PackError::Io(e)) => Err(failed(format!("cannot read pack {pack}: {e}"))),
                }
            }
            Node::File { blob, size, hash, .. } => {
                let src = match self.blobs.open_read(blob.as_bytes()) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT) => return Err(missing(blob)),
                    Err(e) => return Err(failed_errno(e, format!("cannot open blob {blob}: {}", describe_errno(e)))),
                };
                let (blob_hash, blob_len) = match src.hash() {
                    Ok(x) => x,
                    Err(e) => return Err(failed(format!("cannot read blob {blob}: {e}"))),
                };
                let want = self.expected_hash(blob, hash.as_deref());
                if blob_len != *size || want.is_some_and(|h| h != blob_hash) {
                    return Err(failed_because(
                        Cause::BlobDamaged { blob: blob.to_string() },
                        format!(
                            "blob {blob} does not match what was captured ({blob_len} bytes, hash {}; recorded {size} bytes{}): it was tampered with or damaged and was not written back",
                            &blob_hash[..16],
                            want.map(|h| format!(", hash {}", &h[..16.min(h.len())])).unwrap_or_default()
                        ),
                    ));
                }
                Ok((Captured::Blob(src), blob_hash, blob_len))
            }
            _ => Err(failed("this kind of capture holds no bytes")),
        }
    }

    pub(super) fn undo_change(&self, path: &BPath, before: &Before) -> Done {
        match before {
            Before::Irreversible { reason } => {
                return done_because(
                    Outcome::Skipped,
                    Cause::NotKept { reason: (**reason).clone() },
                    reason.to_string(),
                );
            }
            Before::Born { created: seq } | Before::Kept { by: seq } => {
                // What the record that names `seq` is, and what undoing it does.
                let (what, does) = match before {
                    Before::Born { .. } => (format!("this session created it (record {seq})"), "removes it"),
                    _ => (format!("record {seq} kept its state from before the session"), "puts it back"),
                };
                return if self.undoes(*seq) {
                    done_because(
                        Outcome::Unchanged,
                        Cause::CoveredBy { seq: *seq },
                        format!("{what}, and this undo undoes that record, which {does}"),
                    )
                } else {
                    done_because(
                        Outcome::Skipped,
                        Cause::NeedsRecord { seq: *seq },
                        format!(
                            "what it held before this call was not kept: {what}, and only undoing that record {does}"
                        ),
                    )
                };
            }
            Before::Absent | Before::Exclusive | Before::Contents(_) => {}
        }
        let (dir, name) = match self.parent_of(path) {
            Ok(x) => x,
            Err((Outcome::Failed, _, _)) if matches!(before, Before::Absent | Before::Exclusive) => {
                return done(Outcome::Unchanged, "already absent (its directory is gone too)".into());
            }
            Err(done) => return done,
        };
        let cur = match dir.lstat(name) {
            Ok(c) => c,
            Err(e) => return failed_errno(e, format!("cannot examine it: {}", describe_errno(e))),
        };
        match before {
            Before::Absent => self.remove_created(&dir, name, cur.as_ref()),
            Before::Exclusive => match cur.as_ref().and_then(|_| self.born_before_current(&dir, name)) {
                Some(born) => done(
                    Outcome::Conflict,
                    format!(
                        "journaled as created by an exclusive open, but what is there was born at {born}, before that \
                         call: the call must have failed, with the process ended before saying so; it was left in place"
                    ),
                ),
                None => self.remove_created(&dir, name, cur.as_ref()),
            },
            Before::Contents(snap) => self.restore(&dir, name, path, cur.as_ref(), snap),
            Before::Irreversible { .. } | Before::Born { .. } | Before::Kept { .. } => unreachable!("handled above"),
        }
    }

    /// When the node at `name` was born, if that was clearly before the record being undone
    /// was made (see [`Before::Exclusive`]). `None` when it was born after, or when either time
    /// is unknown (no birth times on this file system).
    pub(super) fn born_before_current(&self, dir: &Dir, name: &[u8]) -> Option<String> {
        let seq = self.current.get()?;
        let rec = &self.journal.records[self.journal.records.binary_search_by_key(&seq, |r| r.seq).ok()?];
        let made = rec.time.system_time();
        let (sec, nsec) = dir.birth(name)?;
        let born = std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(u64::try_from(sec).ok()?, nsec))?;
        let slack = std::time::Duration::from_secs(crate::record::EXCLUSIVE_BIRTH_SLACK_S);
        (born + slack < made).then(|| humantime::format_rfc3339_nanos(born).to_string())
    }

    pub(super) fn remove_created(&self, dir: &Dir, name: &[u8], cur: Option<&Stat>) -> Done {
        let Some(st) = cur else {
            return done(Outcome::Unchanged, "already absent".into());
        };
        if file_type(st) == FileType::Directory {
            self.forget_parent();
        }
        match dir.remove(name, st) {
            Ok(()) => done(Outcome::Removed, format!("removed {} the session created", type_name(st))),
            Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => {
                let entries = dir.list_some(name);
                failed_because(
                    Cause::NotEmpty,
                    format!(
                        "the directory was created during the session but still holds entries the journal did not create ({entries}); it was left in place"
                    ),
                )
            }
            Err(e) => failed_errno(e, format!("could not remove it: {}", describe_errno(e))),
        }
    }

    pub(super) fn restore(&self, dir: &Dir, name: &[u8], path: &BPath, cur: Option<&Stat>, snap: &Snapshot) -> Done {
        // The inode this record captured is no longer at its path but in the store (a later
        // unlink or rename over it linked it there): restore the inode itself, which the
        // older step then puts back, with this state in it.
        let in_place_kind = matches!(
            &snap.node,
            Node::Prefix { .. } | Node::Packed { .. } | Node::File { how: CaptureHow::Copy | CaptureHow::Reflink, .. }
        );
        if in_place_kind
            && !cur.is_some_and(|st| ident_of(st) == snap.ident)
            && let Some(blob) = self.stored_inode(snap.ident)
        {
            return self.restore_in_store(blob, snap);
        }
        match &snap.node {
            Node::File { blob, size, how: CaptureHow::Link, .. } => {
                self.restore_link(dir, name, cur, snap, blob, *size)
            }
            Node::File { .. } | Node::Packed { .. } => self.restore_copy(dir, name, cur, snap),
            Node::Prefix { len } => self.restore_prefix(dir, name, cur, snap, *len),
            Node::Symlink { target } => self.restore_symlink(dir, name, cur, snap, target),
            Node::Dir => self.restore_dir(dir, name, path, cur, snap),
            Node::Special { kind, rdev } => self.restore_special(dir, name, cur, snap, *kind, *rdev),
        }
    }

    /// Writes `src` (with `snap`'s metadata) to a new file beside `name` in `dir`, then puts it
    /// at `name` in place of `cur` (cleared first): [`Outcome::Restored`] when something was
    /// replaced, [`Outcome::Recreated`] otherwise. The file beside is removed again on failure.
    fn write_beside(
        &self,
        dir: &Dir,
        name: &[u8],
        cur: Option<&Stat>,
        src: &Captured,
        snap: &Snapshot,
        size: u64,
    ) -> Result<Outcome, Done> {
        // A name a killed undo of the same process id left is taken: the next count, a few
        // times at most.
        let mut tries = 0;
        let (beside, dst) = loop {
            let beside = super::redo::beside_name();
            match dir.create(&beside, 0o600) {
                Ok(fd) => break (beside, fd),
                Err(Errno::EXIST) if tries < 64 => tries += 1,
                Err(e) => return Err(failed_errno(e, format!("cannot create it beside: {}", describe_errno(e)))),
            }
        };
        let discard = |done: Done| {
            if let Ok(Some(st)) = dir.lstat(&beside) {
                let _ = dir.remove(&beside, &st);
            }
            done
        };
        if let Err(e) = src.write_into(&dst) {
            return Err(discard(failed(format!("writing the captured contents back failed: {e}"))));
        }
        if let Some(problem) = set_meta_fd(&dst, snap) {
            return Err(discard(failed(format!("contents restored ({size} bytes), but {problem}"))));
        }
        drop(dst);
        let replaced = self.clear(dir, name, cur).map_err(&discard)?;
        if let Err(e) = dir.rename(&beside, dir, name, RenameFlags::NOREPLACE) {
            let why = format!("written beside, but it could not be moved into place: {}", describe_errno(e));
            return Err(discard(failed_errno(e, why)));
        }
        Ok(if replaced { Outcome::Restored } else { Outcome::Recreated })
    }

    /// Clears the way for a new node at `name`: removes a non-directory, or an empty directory.
    pub(super) fn clear(&self, dir: &Dir, name: &[u8], cur: Option<&Stat>) -> Result<bool, Done> {
        let Some(st) = cur else { return Ok(false) };
        if file_type(st) == FileType::Directory {
            self.forget_parent();
        }
        match dir.remove(name, st) {
            Ok(()) => Ok(true),
            Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => Err(failed_because(
                Cause::NotEmpty,
                format!(
                    "a non-empty directory now stands where it was ({}); it was left in place",
                    dir.list_some(name)
                ),
            )),
            Err(e) => {
                Err(failed_errno(e, format!("could not remove {} in its place: {}", type_name(st), describe_errno(e))))
            }
        }
    }

    /// Puts back a file whose inode was linked into the store: the inode itself, moved back.
    fn restore_link(&self, dir: &Dir, name: &[u8], cur: Option<&Stat>, snap: &Snapshot, blob: &str, size: u64) -> Done {
        if cur.is_some_and(|st| ident_of(st) == snap.ident) {
            return done(Outcome::Unchanged, "the original file is still in place".into());
        }
        let bst = match self.blobs.lstat(blob.as_bytes()) {
            Ok(Some(st)) => st,
            Ok(None) => {
                return failed_because(
                    Cause::BlobMissing { blob: blob.to_string() },
                    format!("its captured contents (blob {blob}) are missing from the store"),
                );
            }
            Err(e) => return failed_errno(e, format!("cannot examine blob {blob}: {}", describe_errno(e))),
        };
        if ident_of(&bst) != snap.ident || file_type(&bst) != FileType::RegularFile {
            return failed_because(
                Cause::BlobDamaged { blob: blob.to_string() },
                format!(
                    "blob {blob} is no longer the captured file (its identity changed: tampered with or replaced); it was not written back"
                ),
            );
        }
        if let Some(why) = self.tampered.get(blob) {
            return failed_because(
                Cause::BlobDamaged { blob: blob.to_string() },
                format!("blob {blob} {why}: it was tampered with or damaged and was not put back"),
            );
        }
        let replaced = match cur {
            Some(st) if file_type(st) == FileType::Directory => match self.clear(dir, name, cur) {
                Ok(_) => true,
                Err(done) => return done,
            },
            Some(_) => true,
            None => false,
        };
        match self.blobs.rename(blob.as_bytes(), dir, name, RenameFlags::empty()) {
            Ok(()) => {
                // A descriptor the program kept open may have changed the inode's metadata
                // after it was unlinked (where no record can name it): set it back.
                let times_match = bst.st_mtime == snap.mtime[0] && bst.st_mtime_nsec as i64 == snap.mtime[1];
                if !(meta_matches(&bst, snap) && times_match)
                    && let Some(problem) = set_meta_at(dir, name, snap)
                {
                    return failed(format!("put the original file back, but {problem}"));
                }
                if replaced {
                    done(
                        Outcome::Restored,
                        format!("put the original file back over what the session left ({size} bytes)"),
                    )
                } else {
                    done(Outcome::Recreated, format!("put the original file back ({size} bytes)"))
                }
            }
            Err(e) => failed_errno(e, format!("could not move the captured file back: {}", describe_errno(e))),
        }
    }

    /// Puts back a file whose bytes were copied (into a blob, or a pack), verified first.
    fn restore_copy(&self, dir: &Dir, name: &[u8], cur: Option<&Stat>, snap: &Snapshot) -> Done {
        let (src, blob_hash, size) = match self.captured(&snap.node) {
            Ok(c) => c,
            Err(done) => return done,
        };
        // Already identical? Then only the metadata may need setting back.
        if let Some(st) = cur.filter(|st| file_type(st) == FileType::RegularFile && st.st_size as u64 == size) {
            let same = dir.open_read(name).ok().and_then(|h| h.hash().ok()).is_some_and(|(h, _)| h == blob_hash);
            if same {
                let times_match = st.st_mtime == snap.mtime[0] && st.st_mtime_nsec as i64 == snap.mtime[1];
                let handle = match MetaHandle::open(dir, name) {
                    Ok(h) => h,
                    Err(e) => return failed_errno(e, format!("cannot open it: {}", describe_errno(e))),
                };
                let xattrs_match = snap.xattrs.as_ref().is_none_or(|want| xattrs_equal(&handle, want));
                if meta_matches(st, snap) && times_match && xattrs_match {
                    return done(Outcome::Unchanged, "its contents and metadata are already as before".into());
                }
                return match handle.apply(&MetaTarget::of_snapshot(snap)) {
                    None => {
                        done(Outcome::Restored, "its contents were already as before; set back its metadata".into())
                    }
                    Some(p) => failed(format!("its contents are as before, but {p}")),
                };
            }
        }
        // Write in place when a regular file is there (keeps its inode and hard links) that is
        // the session's own, otherwise create it afresh: a name that now leads to another
        // inode (a hard link planted since, restored with --force) is replaced, never written
        // through.
        let in_place = cur.is_some_and(|st| {
            file_type(st) == FileType::RegularFile
                && self.may_write_through(&BPath::new(dir.child(name)), st, &snap.ident)
        });
        let outcome = if in_place {
            // The inode is kept (its other names, descriptors open on it): written where it is.
            // An undo killed midway leaves it part written; its journal says so, and the next
            // undo takes the path as its work and finishes it.
            let dst = match cur.map(|st| dir.open_write(name, st)) {
                Some(Ok(fd)) => fd,
                Some(Err(e)) => return failed_errno(e, format!("cannot open it for writing: {}", describe_errno(e))),
                None => return failed("it vanished while it was being restored"),
            };
            if let Err(e) = src.write_into(&dst) {
                return failed(format!("writing the captured contents back failed: {e}"));
            }
            if let Some(problem) = set_meta_fd(&dst, snap) {
                return failed(format!("contents restored ({size} bytes), but {problem}"));
            }
            Outcome::Restored
        } else {
            // A new inode: written beside (a name of its own in the same directory), then moved
            // into place, so that the name never holds part of the file, whenever the undo is
            // killed. What a killed one left beside is removed by the next.
            match self.write_beside(dir, name, cur, &src, snap, size) {
                Ok(outcome) => outcome,
                Err(done) => return done,
            }
        };
        // Only a file on another file system than the store had to be kept as a copy when it
        // was removed; on the store's own, the inode itself was kept, and a copy recreated here
        // is an intermediate state an older step replaces.
        if !in_place && snap.links > 1 && snap.ident.dev != self.store_dev {
            // A new inode: the file's other names still lead to the old one.
            return failed_because(
                Cause::LinkGroupBroken { links: snap.links },
                format!(
                    "recreated from a copy ({size} bytes, verified), but it had {} hard links: its other names still lead to the old inode, which this one no longer shares (the store was on another file system, so the inode itself could not be kept)",
                    snap.links
                ),
            );
        }
        let what = if outcome == Outcome::Recreated { "recreated it" } else { "wrote back its prior contents" };
        done(outcome, format!("{what} ({size} bytes, verified) with its mode, owner and times"))
    }

    /// Whether the node `st` at `path` is one a restore may write through (its bytes, length
    /// or metadata): the `captured` inode itself, one this undo put there, the one sealed at
    /// the path, a directory, or, with no seal of the path, one with no other name. Anything
    /// else (a hard link to a file outside the session planted since the seal, met with
    /// `--force`) would change a file the session never touched.
    pub(super) fn may_write_through(&self, path: &BPath, st: &Stat, captured: &crate::record::Ident) -> bool {
        if ident_of(st) == *captured || super::tree::made_here(path.as_bytes()) || file_type(st) == FileType::Directory
        {
            return true;
        }
        match self.seal.and_then(|seal| seal.state_of(path)) {
            Some(crate::seal::AfterState::File { ident, .. } | crate::seal::AfterState::Other { ident, .. }) => {
                ident == ident_of(st)
            }
            Some(_) => false,
            None => st.st_nlink <= 1,
        }
    }

    /// The newest record older than the one being undone that this undo also reverses and
    /// that puts `path` back on its own: a prefix of at most `now` bytes, or a whole state.
    fn older_prefix_within(&self, path: &BPath, now: u64) -> Option<u64> {
        let current = self.current.get()?;
        self.journal.records.iter().rev().filter(|r| r.seq < current && self.undoes(r.seq)).find_map(|r| match &r.op {
            Op::Change { path: p, before } if p == path => match before {
                Before::Contents(s) => match s.node {
                    Node::Prefix { len } => (len <= now).then_some(r.seq),
                    _ => Some(r.seq),
                },
                Before::Absent | Before::Exclusive => Some(r.seq),
                _ => None,
            },
            _ => None,
        })
    }

    pub(super) fn restore_prefix(&self, dir: &Dir, name: &[u8], cur: Option<&Stat>, snap: &Snapshot, len: u64) -> Done {
        let Some(st) = cur.filter(|st| file_type(st) == FileType::RegularFile) else {
            return failed_because(
                Cause::Replaced,
                format!(
                    "only its length before an append ({len} bytes) was kept, and it is no longer a regular file; its contents cannot be restored"
                ),
            );
        };
        if !self.may_write_through(&BPath::new(dir.child(name)), st, &snap.ident) {
            return done_because(
                Outcome::Conflict,
                Cause::Replaced,
                format!(
                    "another file than the session left is at its name now (inode {}, with {} names): it was not truncated",
                    st.st_ino, st.st_nlink
                ),
            );
        }
        let now = st.st_size as u64;
        if now < len {
            // Appenders racing one another: a later capture can take an earlier id (each takes
            // its id after capturing). An older record this undo also reverses, which keeps
            // the file's length before a shorter prefix (or its whole state), puts it back.
            if let Some(older) = self.older_prefix_within(&BPath::new(dir.child(name)), now) {
                return done_because(
                    Outcome::Unchanged,
                    Cause::CoveredBy { seq: older },
                    format!(
                        "it is shorter ({now} bytes) than its length before this append ({len} bytes), but record {older}, which this undo also undoes, puts back its state from before it"
                    ),
                );
            }
            return failed_because(
                Cause::PriorBytesGone,
                format!(
                    "only its length before an append ({len} bytes) was kept, but it is now shorter ({now} bytes): bytes from before the session are gone"
                ),
            );
        }
        if now == len
            && st.st_mtime == snap.mtime[0]
            && st.st_mtime_nsec as i64 == snap.mtime[1]
            && meta_matches(st, snap)
        {
            return done(Outcome::Unchanged, format!("already {len} bytes long, as before the append"));
        }
        let fd = match dir.open_write(name, st) {
            Ok(fd) => fd,
            Err(e) => return failed_errno(e, format!("cannot open it for truncation: {}", describe_errno(e))),
        };
        if let Err(e) = fd.truncate(len) {
            return failed_errno(e, format!("cannot truncate it back to {len} bytes: {}", describe_errno(e)));
        }
        if let Some(problem) = set_meta_fd(&fd, snap) {
            return failed(format!("truncated back to {len} bytes, but {problem}"));
        }
        done(Outcome::Restored, format!("truncated the appended bytes away ({now} -> {len} bytes)"))
    }

    pub(super) fn restore_symlink(
        &self,
        dir: &Dir,
        name: &[u8],
        cur: Option<&Stat>,
        snap: &Snapshot,
        target: &BPath,
    ) -> Done {
        if let Some(st) = cur.filter(|st| file_type(st) == FileType::Symlink) {
            let same = dir.readlink(name).is_ok_and(|t| t == target.as_bytes());
            if same && st.st_uid == snap.uid && st.st_gid == snap.gid {
                return done(Outcome::Unchanged, "the symlink is already as before".into());
            }
        }
        let replaced = match self.clear(dir, name, cur) {
            Ok(r) => r,
            Err(done) => return done,
        };
        if let Err(e) = dir.symlink(target.as_bytes(), name) {
            return failed_errno(e, format!("cannot recreate the symlink: {}", describe_errno(e)));
        }
        if let Some(problem) = set_meta_at(dir, name, snap) {
            return failed(format!("symlink recreated, but {problem}"));
        }
        let what = format!("symlink to {} put back", target.display_lossy());
        done(if replaced { Outcome::Restored } else { Outcome::Recreated }, what)
    }

    pub(super) fn restore_dir(
        &self,
        dir: &Dir,
        name: &[u8],
        path: &BPath,
        cur: Option<&Stat>,
        snap: &Snapshot,
    ) -> Done {
        match cur {
            Some(st) if file_type(st) == FileType::Directory => {
                let times_match = st.st_mtime == snap.mtime[0] && st.st_mtime_nsec as i64 == snap.mtime[1];
                if meta_matches(st, snap) && times_match && snap.xattrs.is_none() {
                    return done(Outcome::Unchanged, "the directory is already there, as before".into());
                }
                self.defer(path, DeferredMeta::Snapshot(snap.clone()));
                done(
                    Outcome::Restored,
                    format!(
                        "the directory is there; its mode ({:o}), owner and times are set back at the end",
                        snap.mode
                    ),
                )
            }
            other => {
                let replaced = match self.clear(dir, name, other) {
                    Ok(r) => r,
                    Err(done) => return done,
                };
                // Created owner-writable so that its entries can be restored into it; its own
                // mode, owner, attributes and times are set at the end.
                self.forget_parent();
                if let Err(e) = dir.mkdir(name, 0o700) {
                    return failed_errno(e, format!("cannot recreate the directory: {}", describe_errno(e)));
                }
                self.defer(path, DeferredMeta::Snapshot(snap.clone()));
                let what = format!("recreated the directory (mode {:o})", snap.mode);
                done(if replaced { Outcome::Restored } else { Outcome::Recreated }, what)
            }
        }
    }

    pub(super) fn restore_special(
        &self,
        dir: &Dir,
        name: &[u8],
        cur: Option<&Stat>,
        snap: &Snapshot,
        kind: SpecialKind,
        rdev: u64,
    ) -> Done {
        let ft = match kind {
            SpecialKind::Fifo => FileType::Fifo,
            SpecialKind::Socket => FileType::Socket,
            SpecialKind::Char => FileType::CharacterDevice,
            SpecialKind::Block => FileType::BlockDevice,
        };
        if let Some(st) = cur.filter(|st| file_type(st) == ft && st.st_rdev == rdev)
            && meta_matches(st, snap)
        {
            return done(Outcome::Unchanged, format!("the {} is already there", kind.name()));
        }
        let replaced = match self.clear(dir, name, cur) {
            Ok(r) => r,
            Err(done) => return done,
        };
        if let Err(e) = dir.mknod(name, ft, 0o600, rdev) {
            return failed_errno(e, format!("cannot recreate the {}: {}", kind.name(), describe_errno(e)));
        }
        if let Some(problem) = set_meta_at(dir, name, snap) {
            return failed(format!("{} recreated, but {problem}", kind.name()));
        }
        done(if replaced { Outcome::Restored } else { Outcome::Recreated }, format!("recreated the {}", kind.name()))
    }
}

/// Captured bytes a restore writes back: a blob opened, or a packed capture held in memory.
pub(super) enum Captured {
    Blob(Handle),
    Bytes(std::rc::Rc<[u8]>),
}

impl Captured {
    /// Replaces `dst`'s contents with these bytes.
    fn write_into(&self, dst: &Handle) -> std::io::Result<()> {
        match self {
            Captured::Blob(src) => dst.copy_from(src),
            Captured::Bytes(bytes) => dst.write_bytes(bytes),
        }
    }
}
