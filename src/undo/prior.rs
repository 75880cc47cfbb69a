//! What each path was before the session, worked out before anything is restored, and the
//! failed steps it lets undo forgive (the path ended exactly as it was, verified).

use super::fs::*;
use super::*;

/// What is known of a path's state before the session, aspect by aspect (`None`: unknown).
#[derive(Default)]
pub(super) struct PriorFacts {
    body: Option<Body>,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
}

/// Existence and contents.
pub(super) enum Body {
    Absent,
    /// BLAKE3 hex and size of a regular file.
    File(String, u64),
    Symlink(BPath),
    Dir,
    /// It existed, but what it held cannot be verified.
    Unknown,
}

/// What a step restores.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Aspect {
    Body,
    Mode,
    Owner,
}

impl PriorFacts {
    /// Whether every aspect in `aspects` is known and is, now, as it was.
    fn verified(&self, at: Option<(&Dir, &[u8])>, aspects: &[Aspect]) -> bool {
        let st = match at.map(|(dir, name)| dir.lstat(name)) {
            Some(Ok(st)) => st,
            // Its directory is gone: so is it.
            None => None,
            Some(Err(_)) => return false,
        };
        let Some((dir, name)) = at else {
            return aspects.contains(&Aspect::Body) && matches!(self.body, Some(Body::Absent));
        };
        if aspects.contains(&Aspect::Body) && matches!(self.body, Some(Body::Absent)) {
            return st.is_none();
        }
        let Some(st) = st else { return false };
        aspects.iter().all(|a| match a {
            Aspect::Mode => self.mode.is_some_and(|m| m == st.st_mode & 0o7777 || file_type(&st) == FileType::Symlink),
            Aspect::Owner => self.owner.is_some_and(|o| o == (st.st_uid, st.st_gid)),
            Aspect::Body => match &self.body {
                Some(Body::File(want, size)) => {
                    file_type(&st) == FileType::RegularFile
                        && dir
                            .open_read(name)
                            .ok()
                            .and_then(|h| h.hash().ok())
                            .is_some_and(|(h, n)| h == *want && n == *size)
                }
                Some(Body::Symlink(target)) => {
                    file_type(&st) == FileType::Symlink && dir.readlink(name).is_ok_and(|t| t == target.as_bytes())
                }
                Some(Body::Dir) => file_type(&st) == FileType::Directory,
                Some(Body::Absent) | Some(Body::Unknown) | None => false,
            },
        })
    }
}

impl Executor<'_> {
    /// Works out, before anything is restored, what every path of the plan was before the
    /// session (see [`Executor::prior_facts`]).
    ///
    /// Only a path with an append's capture reads the store (its blob's first bytes, which a
    /// restore into the store may rewrite): those are worked out now, the rest when a step
    /// fails ([`Executor::forgive_superseded`]), from records and hashes alone. A million
    /// records that all succeed cost no map of facts.
    pub(super) fn learn_prior_facts(&self, plan: &Plan<'_>, failed_calls: &HashSet<u64>) {
        let reads_store = |r: &Record| match r.op.before() {
            Some(Before::Contents(s)) => matches!(s.node, Node::Prefix { .. }),
            _ => false,
        };
        let wanted: HashSet<&BPath> =
            plan.journal.records.iter().filter(|r| reads_store(r)).flat_map(crate::select::record_paths).collect();
        if wanted.is_empty() {
            return;
        }
        let by_path = self.records_by_path(plan, failed_calls, |p| wanted.contains(p));
        let mut prior = self.prior.borrow_mut();
        for (path, records) in by_path {
            prior.insert(path.clone(), self.prior_facts(path, &records));
        }
    }

    /// The selected records of each path `keep` accepts, oldest first (failed calls left out).
    fn records_by_path<'r>(
        &self,
        plan: &'r Plan<'_>,
        failed_calls: &HashSet<u64>,
        keep: impl Fn(&BPath) -> bool,
    ) -> std::collections::HashMap<&'r BPath, Vec<&'r Record>> {
        let mut by_path: std::collections::HashMap<&BPath, Vec<&Record>> = std::collections::HashMap::new();
        for r in plan.journal.records.iter().filter(|r| plan.only.is_none_or(|o| o.contains(&r.seq))) {
            if failed_calls.contains(&r.seq) {
                continue;
            }
            for p in crate::select::record_paths(r).into_iter().filter(|p| keep(p)) {
                by_path.entry(p).or_default().push(r);
            }
        }
        by_path
    }

    /// A step can fail because processes of the session raced on one name (its target vanished
    /// before its turn came), while an older record still puts the path back. What counts is
    /// the end result: a failed step is forgiven when every aspect it would have restored
    /// (existence and contents, mode, owner) is, now, verifiably what it was before the session
    /// (see [`Executor::prior_facts`]).
    pub(super) fn forgive_superseded(&self, plan: &Plan<'_>, failed_calls: &HashSet<u64>, report: &mut Report) {
        self.forgive_relinked(plan, report);
        // A broken link group is not a race: the path's bytes are back, its inode is not. A
        // step whose prior state was not kept (a capture that lost a race with another process
        // of the session) is forgiven like a failed one when an older step verifiably put the
        // path back as it was before the session.
        let forgivable = |o: &StepReport| match o.outcome {
            Outcome::Failed => !matches!(o.cause, Cause::LinkGroupBroken { .. }),
            Outcome::Skipped => matches!(o.cause, Cause::NotKept { .. }),
            _ => false,
        };
        let failed: HashSet<&BPath> =
            report.outcomes.iter().filter(|o| forgivable(o)).filter_map(|o| o.path.as_ref()).collect();
        if failed.is_empty() {
            return;
        }
        // The facts not worked out before the undo (see learn_prior_facts), for the failed paths.
        let missing: Vec<BPath> =
            failed.iter().filter(|p| !self.prior.borrow().contains_key(**p)).map(|p| (*p).clone()).collect();
        if !missing.is_empty() {
            let missing: HashSet<&BPath> = missing.iter().collect();
            let by_path = self.records_by_path(plan, failed_calls, |p| missing.contains(p));
            let mut prior = self.prior.borrow_mut();
            for (path, records) in by_path {
                prior.insert(path.clone(), self.prior_facts(path, &records));
            }
        }
        let by_seq: std::collections::HashMap<u64, &Record> = plan.journal.records.iter().map(|r| (r.seq, r)).collect();
        let facts = self.prior.borrow();
        for o in report.outcomes.iter_mut().filter(|o| forgivable(o)) {
            let (Some(path), Some(seq)) = (&o.path, o.seq) else { continue };
            let (Some(f), Some(rec)) = (facts.get(path), by_seq.get(&seq)) else { continue };
            let aspects = match &rec.op {
                Op::Meta { before, .. } => match before.what {
                    MetaKind::Mode => vec![Aspect::Mode],
                    MetaKind::Owner => vec![Aspect::Mode, Aspect::Owner],
                    MetaKind::Times | MetaKind::Xattr | MetaKind::Flags => continue,
                },
                Op::Change { .. } | Op::Rename(_) => vec![Aspect::Body, Aspect::Mode, Aspect::Owner],
                _ => continue,
            };
            self.forget_parent();
            let at = self.parent_of(path).ok();
            if f.verified(at.as_ref().map(|(d, n)| (d, *n)), &aspects) {
                o.outcome = Outcome::Unchanged;
                o.cause = Cause::EndedAsBefore;
                o.why = format!(
                    "this step could not be replayed ({}), but the path ended exactly as it was before the session (verified)",
                    o.why
                );
                report.undone.push(seq);
            }
        }
    }

    /// A copy put back as a new inode (the link group broken) is forgiven when an older step
    /// then put the captured inode itself back at that name: the link group is whole again.
    fn forgive_relinked(&self, plan: &Plan<'_>, report: &mut Report) {
        for o in report.outcomes.iter_mut().filter(|o| matches!(o.cause, Cause::LinkGroupBroken { .. })) {
            let (Some(path), Some(seq)) = (&o.path, o.seq) else { continue };
            let Ok(i) = plan.journal.records.binary_search_by_key(&seq, |r| r.seq) else { continue };
            let Some(Before::Contents(snap)) = plan.journal.records[i].op.before() else { continue };
            self.forget_parent();
            let Ok((dir, name)) = self.parent_of(path) else { continue };
            if dir.lstat(name).ok().flatten().is_some_and(|st| ident_of(&st) == snap.ident) {
                o.outcome = Outcome::Unchanged;
                o.cause = Cause::EndedAsBefore;
                o.why = format!("{}; an older step then put the captured inode itself back (verified)", o.why);
                report.undone.push(seq);
            }
        }
    }

    /// What is known, aspect by aspect, about `path` before the session: from its oldest
    /// records (`records`, oldest first), each aspect from the oldest record that knows it. An
    /// append's prior length is laid over the oldest full capture after it. A capture by hard
    /// link proves nothing about prior bytes (the inode may have been changed afterwards
    /// through a descriptor kept open).
    pub(super) fn prior_facts(&self, path: &BPath, records: &[&Record]) -> PriorFacts {
        let mut f = PriorFacts::default();
        let mut prefix: Option<u64> = None;
        for r in records {
            let before = match &r.op {
                Op::Meta { before, .. } => {
                    match before.what {
                        MetaKind::Mode => {
                            f.mode.get_or_insert(before.mode);
                        }
                        MetaKind::Owner => {
                            f.mode.get_or_insert(before.mode);
                            f.owner.get_or_insert((before.uid, before.gid));
                        }
                        MetaKind::Times | MetaKind::Xattr | MetaKind::Flags => {}
                    }
                    continue;
                }
                Op::Rename(m) if m.from == *path => {
                    f.body.get_or_insert(Body::Unknown);
                    return f;
                }
                Op::Change { before, .. } => before,
                Op::Rename(m) => &m.to_before,
                _ => continue,
            };
            match before {
                Before::Absent | Before::Exclusive => {
                    f.body.get_or_insert(if prefix.is_none() { Body::Absent } else { Body::Unknown });
                    return f;
                }
                // Reached first only when the creation it names is not being undone.
                Before::Irreversible { .. } | Before::Born { .. } | Before::Kept { .. } => {
                    f.body.get_or_insert(Body::Unknown);
                    return f;
                }
                Before::Contents(s) => {
                    f.mode.get_or_insert(s.mode);
                    f.owner.get_or_insert((s.uid, s.gid));
                    let body = match &s.node {
                        Node::Prefix { len } => {
                            prefix.get_or_insert(*len);
                            continue;
                        }
                        Node::File { blob, how: CaptureHow::Link | CaptureHow::Reflink, .. }
                            if !self.seal.is_some_and(|seal| seal.blob_intact.contains(blob)) =>
                        {
                            Body::Unknown
                        }
                        Node::File { blob, size, hash, .. } => {
                            // Sealed by its state rather than its bytes, and still so: hashed now.
                            let sealed_as_is = || {
                                self.seal.is_some_and(|s| s.blob_stats.contains_key(blob))
                                    && !self.tampered.contains_key(blob)
                            };
                            match (self.expected_hash(blob, hash.as_deref()), prefix) {
                                (Some(h), None) => Body::File(h.to_string(), *size),
                                (None, None) if sealed_as_is() => std::fs::File::open(self.blobs_path.join(blob))
                                    .ok()
                                    .and_then(|f| crate::capture::hash_fd(&f).ok())
                                    .filter(|(_, n)| n == size)
                                    .map_or(Body::Unknown, |(h, n)| Body::File(h, n)),
                                // Only its length before an append is known: the captured bytes up
                                // to it, from a blob that is what was captured (by its hash, or by
                                // its sealed state).
                                (want, Some(len)) if want.is_some() || sealed_as_is() => {
                                    match std::fs::read(self.blobs_path.join(blob)) {
                                        Ok(bytes)
                                            if bytes.len() as u64 >= len
                                                && want.is_none_or(|h| blake3::hash(&bytes).to_hex().as_str() == h) =>
                                        {
                                            Body::File(blake3::hash(&bytes[..len as usize]).to_hex().to_string(), len)
                                        }
                                        _ => Body::Unknown,
                                    }
                                }
                                _ => Body::Unknown,
                            }
                        }
                        Node::Packed { size, hash, .. } if prefix.is_none() => Body::File(hash.clone(), *size),
                        // Only its length before an append is known: the captured bytes up to
                        // it, from the pack, checked against their hash.
                        Node::Packed { pack, at, size, hash } => {
                            match (prefix, crate::pack::read_in(&self.blobs_path, pack, *at, *size, hash)) {
                                (Some(len), Ok(bytes)) if bytes.len() as u64 >= len => {
                                    Body::File(blake3::hash(&bytes[..len as usize]).to_hex().to_string(), len)
                                }
                                _ => Body::Unknown,
                            }
                        }
                        Node::Symlink { target } if prefix.is_none() => Body::Symlink(target.clone()),
                        Node::Dir if prefix.is_none() => Body::Dir,
                        _ => Body::Unknown,
                    };
                    f.body.get_or_insert(body);
                    return f;
                }
            }
        }
        f
    }
}
