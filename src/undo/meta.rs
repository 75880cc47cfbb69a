//! Metadata: mode, owner, times, extended attributes and inode flags set back, by name or
//! through a descriptor, and the directory metadata deferred until a directory's entries are
//! back.

use rustix::io::Errno;

use super::fs::*;
use super::*;

/// Directory metadata waiting for the end of the undo.
pub(super) struct Deferred {
    pub(super) seq: Option<u64>,
    pub(super) path: BPath,
    pub(super) meta: DeferredMeta,
}

pub(super) enum DeferredMeta {
    Snapshot(Snapshot),
    Meta(MetaBefore),
}

/// What metadata to put back on a node; `None` fields are left alone.
#[derive(Default)]
pub(super) struct MetaTarget<'a> {
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
    times: Option<Timestamps>,
    xattrs: XattrTarget<'a>,
    /// Inode flags (chattr), set last: an immutable or append-only flag would refuse the rest.
    flags: Option<u32>,
}

#[derive(Default)]
pub(super) enum XattrTarget<'a> {
    #[default]
    Leave,
    /// Exactly this set (others removed).
    All(&'a [Xattr]),
    /// One attribute set to a value, or removed.
    One(&'a [u8], Option<&'a [u8]>),
}

impl<'a> MetaTarget<'a> {
    pub(super) fn of_snapshot(snap: &'a Snapshot) -> Self {
        MetaTarget {
            owner: Some((snap.uid, snap.gid)),
            mode: Some(snap.mode),
            times: Some(timestamps(snap.atime, snap.mtime)),
            xattrs: snap.xattrs.as_deref().map_or(XattrTarget::Leave, XattrTarget::All),
            flags: None,
        }
    }

    pub(super) fn of_meta(m: &'a MetaBefore) -> Self {
        match m.what {
            MetaKind::Mode => MetaTarget { mode: Some(m.mode), ..Default::default() },
            // chown may have cleared set-id bits: the mode goes back too.
            MetaKind::Owner => MetaTarget { owner: Some((m.uid, m.gid)), mode: Some(m.mode), ..Default::default() },
            MetaKind::Times => MetaTarget { times: Some(timestamps(m.atime, m.mtime)), ..Default::default() },
            MetaKind::Flags => MetaTarget { flags: m.flags, ..Default::default() },
            MetaKind::Xattr => MetaTarget {
                xattrs: match &m.xattr {
                    Some(x) => XattrTarget::One(x.name.as_bytes(), x.value.as_ref().map(|v| v.0.as_slice())),
                    None => XattrTarget::Leave,
                },
                // An access ACL carries the group bits of the mode with it: removing or
                // replacing it does not put the mode back by itself.
                mode: m.xattr.as_ref().filter(|x| x.name.as_bytes() == b"system.posix_acl_access").map(|_| m.mode),
                ..Default::default()
            },
        }
    }
}

/// A node metadata can be set on: an open descriptor, or a node opened `O_PATH | O_NOFOLLOW`
/// relative to its verified parent (reached through `/proc/self/fd`, so never through a
/// symlink planted in its place), or a node of a dry run (see [`super::tree`]).
pub(super) enum MetaHandle<'a> {
    Fd(BorrowedFd<'a>),
    Node { dir: BorrowedFd<'a>, name: &'a [u8], fd: OwnedFd, symlink: bool, path: Vec<u8> },
    Sim { sim: &'a Sim, path: Vec<u8>, real: Option<Vec<u8>>, symlink: bool },
}

impl<'a> MetaHandle<'a> {
    pub(super) fn open(dir: &'a Dir, name: &'a [u8]) -> Result<MetaHandle<'a>, Errno> {
        if let Some(sim) = dir.sim() {
            let st = dir.lstat(name)?.ok_or(Errno::NOENT)?;
            let symlink = file_type(&st) == FileType::Symlink;
            return Ok(MetaHandle::Sim { sim, path: dir.child(name), real: dir.real_path(name), symlink });
        }
        let path = dir.child(name);
        let dir_fd = dir.borrowed()?;
        let fd = rustix::fs::openat(dir_fd, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let symlink = rustix::fs::fstat(&fd).map(|st| file_type(&st) == FileType::Symlink)?;
        Ok(MetaHandle::Node { dir: dir_fd, name, fd, symlink, path })
    }

    /// The handle for a node opened for its contents.
    pub(super) fn of(h: &'a Handle) -> MetaHandle<'a> {
        match h {
            Handle::Fd(fd) => MetaHandle::Fd(fd.as_fd()),
            Handle::Sim(sim, path) => MetaHandle::Sim {
                sim,
                path: path.clone(),
                real: match sim.resolve(path) {
                    Ok(super::tree::Where::Real(r)) => Some(r),
                    Ok(super::tree::Where::Node(n)) => n.real,
                    _ => None,
                },
                symlink: false,
            },
        }
    }

    fn proc_path(fd: &OwnedFd) -> String {
        use std::os::fd::AsRawFd;
        format!("/proc/self/fd/{}", fd.as_raw_fd())
    }

    fn stat(&self) -> Result<Stat, Errno> {
        match self {
            MetaHandle::Fd(fd) => rustix::fs::fstat(fd),
            MetaHandle::Node { fd, .. } => rustix::fs::fstat(fd),
            MetaHandle::Sim { sim, path, .. } => sim.lstat(path)?.ok_or(Errno::NOENT),
        }
    }

    /// Journals what `what` (and `xattr`) of a node the undo did not make is now, before the
    /// undo sets it (see [`super::redo`]).
    fn journal(&self, what: MetaKind, xattr: Option<&[u8]>) {
        if let MetaHandle::Node { fd, path, .. } = self {
            super::redo::before_meta(path, fd.as_fd(), what, xattr);
        }
    }

    fn chown(&self, uid: u32, gid: u32) -> Result<(), Errno> {
        self.journal(MetaKind::Owner, None);
        let (o, g) = (Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)));
        match self {
            MetaHandle::Fd(fd) => rustix::fs::fchown(fd, o, g),
            MetaHandle::Node { fd, .. } => rustix::fs::chownat(fd, "", o, g, AtFlags::EMPTY_PATH),
            MetaHandle::Sim { sim, path, .. } => sim.update(path, |n| {
                n.st.st_uid = uid;
                n.st.st_gid = gid;
            }),
        }
    }

    fn chmod(&self, mode: u32) -> Result<(), Errno> {
        self.journal(MetaKind::Mode, None);
        match self {
            MetaHandle::Fd(fd) => rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)),
            // Linux has no mode for symlinks.
            MetaHandle::Node { symlink: true, .. } | MetaHandle::Sim { symlink: true, .. } => Ok(()),
            MetaHandle::Node { fd, .. } => rustix::fs::chmod(Self::proc_path(fd).as_str(), Mode::from_raw_mode(mode)),
            MetaHandle::Sim { sim, path, .. } => sim.update(path, |n| n.st.st_mode = (n.st.st_mode & !0o7777) | mode),
        }
    }

    fn set_times(&self, ts: &Timestamps) -> Result<(), Errno> {
        self.journal(MetaKind::Times, None);
        match self {
            MetaHandle::Fd(fd) => rustix::fs::futimens(fd, ts),
            MetaHandle::Node { dir, name, symlink: true, .. } => {
                rustix::fs::utimensat(*dir, *name, ts, AtFlags::SYMLINK_NOFOLLOW)
            }
            MetaHandle::Node { fd, .. } => {
                rustix::fs::utimensat(CWD, Self::proc_path(fd).as_str(), ts, AtFlags::empty())
            }
            MetaHandle::Sim { sim, path, .. } => sim.set_times(path, ts),
        }
    }

    /// Sets the inode flags (`FS_IOC_SETFLAGS`), through a descriptor opened for reading (the
    /// ioctl needs one; a node is reopened through its verified `O_PATH` descriptor).
    fn set_flags(&self, flags: u32) -> Result<(), Errno> {
        let set = |fd: BorrowedFd<'_>| rustix::fs::ioctl_setflags(fd, rustix::fs::IFlags::from_bits_retain(flags));
        self.journal(MetaKind::Flags, None);
        match self {
            MetaHandle::Fd(fd) => set(*fd),
            MetaHandle::Node { symlink: true, .. } | MetaHandle::Sim { symlink: true, .. } => Ok(()),
            MetaHandle::Node { fd, .. } => set(reopen_for_flags(fd)?.as_fd()),
            MetaHandle::Sim { sim, path, .. } => sim.update(path, |n| n.flags = Some(flags)),
        }
    }

    /// Every extended attribute, name and value (what a dry run starts from).
    fn xattr_list(&self) -> Result<Vec<super::tree::XattrPair>, Errno> {
        let names = self.list_xattr_names()?;
        Ok(names.into_iter().filter_map(|n| self.xattr(&n).map(|v| (n, v))).collect())
    }

    fn xattr(&self, name: &[u8]) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 65536];
        let n = match self {
            MetaHandle::Fd(fd) => rustix::fs::fgetxattr(fd, name, &mut buf[..]).ok()?,
            MetaHandle::Node { fd, .. } => {
                rustix::fs::getxattr(Self::proc_path(fd).as_str(), name, &mut buf[..]).ok()?
            }
            MetaHandle::Sim { sim, path, real, .. } => {
                if let Some(list) = sim.xattrs(path) {
                    return list.into_iter().find(|(n, _)| n == name).map(|(_, v)| v);
                }
                rustix::fs::lgetxattr(real.as_deref()?, name, &mut buf[..]).ok()?
            }
        };
        buf.truncate(n);
        Some(buf)
    }

    fn list_xattr_names(&self) -> Result<Vec<Vec<u8>>, Errno> {
        let mut buf = vec![0u8; 65536];
        let n = match self {
            MetaHandle::Fd(fd) => rustix::fs::flistxattr(fd, &mut buf[..])?,
            MetaHandle::Node { symlink: true, .. } | MetaHandle::Sim { symlink: true, .. } => 0,
            MetaHandle::Node { fd, .. } => rustix::fs::listxattr(Self::proc_path(fd).as_str(), &mut buf[..])?,
            MetaHandle::Sim { sim, path, real, .. } => match (sim.xattrs(path), real) {
                (Some(list), _) => return Ok(list.into_iter().map(|(n, _)| n).collect()),
                (None, Some(r)) => rustix::fs::llistxattr(r.as_slice(), &mut buf[..])?,
                (None, None) => 0,
            },
        };
        Ok(buf[..n].split(|&b| b == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect())
    }

    fn set_xattr(&self, name: &[u8], value: Option<&[u8]>) -> Result<(), Errno> {
        self.journal(MetaKind::Xattr, Some(name));
        let flags = rustix::fs::XattrFlags::empty();
        match (self, value) {
            (MetaHandle::Node { symlink: true, .. } | MetaHandle::Sim { symlink: true, .. }, _) => Ok(()),
            (MetaHandle::Fd(fd), Some(v)) => rustix::fs::fsetxattr(fd, name, v, flags),
            (MetaHandle::Fd(fd), None) => ignore_nodata(rustix::fs::fremovexattr(fd, name)),
            (MetaHandle::Node { fd, .. }, Some(v)) => {
                rustix::fs::setxattr(Self::proc_path(fd).as_str(), name, v, flags)
            }
            (MetaHandle::Node { fd, .. }, None) => {
                ignore_nodata(rustix::fs::removexattr(Self::proc_path(fd).as_str(), name))
            }
            (MetaHandle::Sim { sim, path, .. }, value) => {
                let mut list = self.xattr_list().unwrap_or_default();
                list.retain(|(n, _)| n != name);
                if let Some(v) = value {
                    list.push((name.to_vec(), v.to_vec()));
                }
                sim.update(path, |n| n.xattrs = Some(list))
            }
        }
    }

    /// Puts the target metadata back: owner first, then extended attributes (an access ACL
    /// rewrites the group bits of the mode), then the mode (chown can clear set-id bits), and
    /// times last. Returns what could not be set back.
    pub(super) fn apply(&self, t: &MetaTarget<'_>) -> Option<String> {
        let mut problems = Vec::new();
        let st = self.stat().ok();
        if let Some((uid, gid)) = t.owner
            && st.is_none_or(|s| s.st_uid != uid || s.st_gid != gid)
            && let Err(e) = self.chown(uid, gid)
        {
            problems.push(format!("owner {uid}:{gid} could not be set back ({})", describe_errno(e)));
        }
        match &t.xattrs {
            XattrTarget::Leave => {}
            XattrTarget::One(name, value) => {
                if let Err(e) = self.set_xattr(name, *value) {
                    let name = String::from_utf8_lossy(name);
                    problems.push(format!("extended attribute {name} could not be set back ({})", describe_errno(e)));
                }
            }
            XattrTarget::All(list) => match self.list_xattr_names() {
                Ok(present) => {
                    for name in present.iter().filter(|n| !list.iter().any(|x| x.name.as_bytes() == n.as_slice())) {
                        if let Err(e) = self.set_xattr(name, None) {
                            let name = String::from_utf8_lossy(name);
                            problems.push(format!(
                                "extended attribute {name} could not be removed ({})",
                                describe_errno(e)
                            ));
                        }
                    }
                    for x in list.iter() {
                        if let Err(e) = self.set_xattr(x.name.as_bytes(), Some(&x.value.0)) {
                            let name = x.name.display_lossy();
                            problems.push(format!(
                                "extended attribute {name} could not be set back ({})",
                                describe_errno(e)
                            ));
                        }
                    }
                }
                Err(Errno::NOTSUP) => {}
                Err(e) => problems.push(format!("extended attributes could not be read ({})", describe_errno(e))),
            },
        }
        if let Some(mode) = t.mode
            && let Err(e) = self.chmod(mode)
        {
            problems.push(format!("mode {mode:o} could not be set back ({})", describe_errno(e)));
        }
        if let Some(ts) = &t.times
            && let Err(e) = self.set_times(ts)
        {
            problems.push(format!("times could not be set back ({})", describe_errno(e)));
        }
        if let Some(flags) = t.flags
            && let Err(e) = self.set_flags(flags)
        {
            problems.push(format!("attributes {flags:#x} could not be set back ({})", describe_errno(e)));
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

/// A node reopened for reading through its `O_PATH` descriptor, for the flags ioctls.
pub(super) fn reopen_for_flags(fd: &OwnedFd) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    rustix::fs::openat(CWD, MetaHandle::proc_path(fd).as_str(), flags, Mode::empty())
}

/// The inode flags of the file at `path`, not following a final symlink.
pub(super) fn inode_flags_at(path: &BPath) -> Result<u32, Errno> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let node = crate::resolve::at_path(path.as_bytes(), |d, n| rustix::fs::openat(d, n, flags, Mode::empty()))?;
    Ok(rustix::fs::ioctl_getflags(reopen_for_flags(&node)?)?.bits())
}

/// Whether a node's extended attributes are exactly `want`.
pub(super) fn xattrs_equal(h: &MetaHandle<'_>, want: &[Xattr]) -> bool {
    let Ok(names) = h.list_xattr_names() else { return want.is_empty() };
    if names.len() != want.len() {
        return false;
    }
    want.iter().all(|x| {
        names.iter().any(|n| n.as_slice() == x.name.as_bytes())
            && h.xattr(x.name.as_bytes()).is_some_and(|v| v == x.value.0)
    })
}

pub(super) fn ignore_nodata(r: Result<(), Errno>) -> Result<(), Errno> {
    match r {
        Err(Errno::NODATA) => Ok(()),
        other => other,
    }
}

/// Puts a snapshot's metadata back on a node opened for its contents.
pub(super) fn set_meta_fd(h: &Handle, snap: &Snapshot) -> Option<String> {
    MetaHandle::of(h).apply(&MetaTarget::of_snapshot(snap))
}

/// Puts a snapshot's metadata back on `name` in `dir`, never following a symlink.
pub(super) fn set_meta_at(dir: &Dir, name: &[u8], snap: &Snapshot) -> Option<String> {
    match MetaHandle::open(dir, name) {
        Ok(h) => h.apply(&MetaTarget::of_snapshot(snap)),
        Err(e) => Some(format!("its metadata could not be set back ({})", describe_errno(e))),
    }
}

/// Whether the part of the metadata a Meta record is about is already as recorded.
pub(super) fn meta_already(st: &Stat, m: &MetaBefore, dir: &Dir, name: &[u8]) -> bool {
    match m.what {
        MetaKind::Mode => st.st_mode & 0o7777 == m.mode,
        MetaKind::Owner => st.st_uid == m.uid && st.st_gid == m.gid && st.st_mode & 0o7777 == m.mode,
        MetaKind::Times => {
            st.st_mtime == m.mtime[0]
                && st.st_mtime_nsec as i64 == m.mtime[1]
                && st.st_atime == m.atime[0]
                && st.st_atime_nsec as i64 == m.atime[1]
        }
        MetaKind::Flags => m.flags.is_some_and(|want| {
            let now = match dir.sim().and_then(|sim| sim.flags(&dir.child(name))) {
                Some(set) => Ok(set),
                None => dir.real_path(name).ok_or(Errno::NOENT).and_then(|p| inode_flags_at(&BPath::new(p))),
            };
            now.is_ok_and(|now| now == want)
        }),
        MetaKind::Xattr => m.xattr.as_ref().is_some_and(|x| {
            // A minimal access ACL is not stored as an attribute at all: it lives in the mode.
            let acl_mode_ok = x.name.as_bytes() != b"system.posix_acl_access" || st.st_mode & 0o7777 == m.mode;
            let want = x.value.as_ref().map(|v| v.0.as_slice());
            acl_mode_ok
                && match dir.sim().and_then(|sim| sim.xattrs(&dir.child(name))) {
                    Some(list) => {
                        list.iter().find(|(n, _)| n.as_slice() == x.name.as_bytes()).map(|(_, v)| v.as_slice()) == want
                    }
                    None => dir.real_path(name).is_some_and(|p| {
                        crate::capture::xattr_value(&p, x.name.as_bytes()).is_ok_and(|now| now.as_deref() == want)
                    }),
                }
        }),
    }
}

pub(super) fn meta_matches(st: &Stat, snap: &Snapshot) -> bool {
    st.st_mode & 0o7777 == snap.mode && st.st_uid == snap.uid && st.st_gid == snap.gid
}

/// The verb for a metadata part's name ("times" is plural).
pub(super) fn is_are(what: MetaKind) -> &'static str {
    if what == MetaKind::Times { "are" } else { "is" }
}

impl Executor<'_> {
    pub(super) fn defer(&self, path: &BPath, meta: DeferredMeta) {
        self.deferred.borrow_mut().push(Deferred { seq: self.current.get(), path: path.clone(), meta });
    }

    /// Applies deferred directory metadata, in the order it was queued (newest record first,
    /// so the oldest, the state before the session, is applied last).
    pub(super) fn apply_deferred(&self, out: &mut Vec<StepReport>) {
        for d in self.deferred.take() {
            let problem = match self.parent_of(&d.path) {
                Err((_, why, _)) => Some(why),
                Ok((dir, name)) => match MetaHandle::open(&dir, name) {
                    Err(e) => Some(format!("the directory cannot be reached ({})", describe_errno(e))),
                    Ok(h) => match &d.meta {
                        DeferredMeta::Snapshot(s) => h.apply(&MetaTarget::of_snapshot(s)),
                        DeferredMeta::Meta(m) => h.apply(&MetaTarget::of_meta(m)),
                    },
                },
            };
            if let Some(why) = problem {
                out.push(StepReport {
                    seq: d.seq,
                    outcome: Outcome::Failed,
                    path: Some(d.path),
                    why: format!("the directory is back, but {why}"),
                    cause: Cause::Errno { errno: None },
                });
            }
        }
    }

    /// Sets back the times of every directory a `dir_times` record of this undo names, after
    /// every entry and every deferred metadata: when every record that changed its entries is
    /// undone, and no older record names the directory itself (a directory the session made
    /// is removed; one it removed is recreated from its own, older, capture).
    /// Returns the records it left for a later undo (their directory's entries are not all
    /// back yet): those are not undone.
    pub(super) fn apply_dir_times(&self, out: &mut Vec<StepReport>) -> Vec<u64> {
        let seqs = self.dir_times.take();
        let mut later = Vec::new();
        if seqs.is_empty() {
            return later;
        }
        struct Want<'j> {
            seq: u64,
            atime: [i64; 2],
            mtime: [i64; 2],
            older_self: Option<u64>,
            partial: bool,
            /// Its name when the record was made.
            then: &'j BPath,
            /// Its name once this undo has moved everything back.
            path: BPath,
        }
        // Every rename, oldest first: a directory renamed before its times were journaled
        // ends under its older name.
        let renames: Vec<(u64, &BPath, &BPath, bool)> = self
            .journal
            .records
            .iter()
            .filter_map(|r| match &r.op {
                Op::Rename(m) => Some((
                    r.seq,
                    &m.from,
                    &m.to,
                    RenameFlags::from_bits_retain(m.flags).contains(RenameFlags::EXCHANGE),
                )),
                _ => None,
            })
            .collect();
        let before_renames = |path: &BPath, seq: u64| -> BPath {
            let mut p = path.clone();
            for (_, from, to, exchange) in renames.iter().rev().filter(|r| r.0 < seq) {
                let swap = |p: &BPath, a: &BPath, b: &BPath| {
                    p.starts_with_dir(a.as_bytes()).then(|| {
                        let mut n = b.as_bytes().to_vec();
                        n.extend_from_slice(&p.as_bytes()[a.as_bytes().len()..]);
                        BPath::new(n)
                    })
                };
                if let Some(n) = swap(&p, to, from).or_else(|| if *exchange { swap(&p, from, to) } else { None }) {
                    p = n;
                }
            }
            p
        };
        let mut want: std::collections::HashMap<BPath, Want<'_>> = std::collections::HashMap::new();
        for seq in seqs {
            let Ok(i) = self.journal.records.binary_search_by_key(&seq, |r| r.seq) else { continue };
            if let Op::DirTimes(d) = &self.journal.records[i].op {
                let then = &d.path;
                let path = before_renames(then, seq);
                let w = Want { seq, atime: d.atime, mtime: d.mtime, older_self: None, partial: false, then, path };
                // The oldest record of a directory's times is the one from before the session.
                match want.get(&w.path) {
                    Some(have) if have.seq < seq => {}
                    _ => {
                        want.insert(w.path.clone(), w);
                    }
                }
            }
        }
        let by_then: std::collections::HashMap<&[u8], BPath> =
            want.values().map(|w| (w.then.as_bytes(), w.path.clone())).collect();
        // The oldest record of each directory's times in the whole journal: the one from
        // before the session. A later one (a directory's times are journaled again in every
        // turn) already holds the effect of every change made to its entries before it.
        let mut oldest: std::collections::HashMap<&[u8], u64> = std::collections::HashMap::new();
        for r in &self.journal.records {
            if let Op::DirTimes(d) = &r.op {
                oldest.entry(d.path.as_bytes()).or_insert(r.seq);
            }
        }
        for r in &self.journal.records {
            for p in crate::select::record_paths(r) {
                // An older record that puts the directory itself back whole (its capture, its
                // creation) or its times; a mode or owner leaves the times to this one, and a
                // rename is followed above.
                let whole = match &r.op {
                    Op::Meta { before, .. } => before.what == MetaKind::Times,
                    Op::Change { .. } => true,
                    _ => false,
                };
                if let Some(w) = by_then.get(p.as_bytes()).and_then(|k| want.get_mut(k))
                    && r.seq < w.seq
                    && whole
                    && p == w.then
                    && self.undoes(r.seq)
                {
                    w.older_self.get_or_insert(r.seq);
                }
                // Only a change of an entry (made, removed, replaced, renamed) changes the
                // directory's times: an entry's metadata (a utime, a chmod) does not.
                let parent = p.split_parent().map(|(d, _)| d).filter(|_| !matches!(r.op, Op::Meta { .. }));
                if let Some(w) = parent.and_then(|d| by_then.get(d)).and_then(|k| want.get_mut(k)) {
                    let matters = r.seq > w.seq || oldest.get(w.then.as_bytes()) == Some(&w.seq);
                    w.partial |= matters && !self.undoes(r.seq);
                }
            }
        }
        let mut want: Vec<Want<'_>> = want.into_values().collect();
        want.sort_by_key(|w| std::cmp::Reverse(w.seq));
        for w in want {
            let (outcome, why, cause) = if let Some(older) = w.older_self {
                done_because(
                    Outcome::Unchanged,
                    Cause::CoveredBy { seq: older },
                    "an older record of the directory itself puts back its state from before the session",
                )
            } else if w.partial {
                later.push(w.seq);
                done(
                    Outcome::Unchanged,
                    "not every change to its entries is undone yet, so its times are left as they are (the undo that puts back the rest sets them)".into(),
                )
            } else {
                self.set_dir_times(&w.path, w.atime, w.mtime)
            };
            out.push(StepReport { seq: Some(w.seq), outcome, path: Some(w.path), why, cause });
        }
        later
    }

    fn set_dir_times(&self, path: &BPath, atime: [i64; 2], mtime: [i64; 2]) -> Done {
        let (dir, name) = match self.parent_of(path) {
            Ok(x) => x,
            Err(done) => return done,
        };
        match dir.lstat(name) {
            Ok(Some(st)) if file_type(&st) == FileType::Directory => {
                // Where this undo changed its entries, the kernel moved its times (a dry run's
                // overlay does not show that, and on a file system that keeps whole seconds
                // they may even read the same): they are set back either way.
                let same =
                    [st.st_mtime, st.st_mtime_nsec as i64] == mtime && [st.st_atime, st.st_atime_nsec as i64] == atime;
                if same && !super::tree::entries_changed_in(path.as_bytes()) {
                    return done(Outcome::Unchanged, "its times are already as before".into());
                }
            }
            Ok(Some(st)) => {
                return done(
                    Outcome::Conflict,
                    format!("{} now stands there; its times were left alone", type_name(&st)),
                );
            }
            Ok(None) => {
                return failed_because(Cause::Gone, "the directory no longer exists, so its times cannot be set back");
            }
            Err(e) => return failed_errno(e, format!("cannot examine it: {}", describe_errno(e))),
        }
        let target = MetaTarget { times: Some(timestamps(atime, mtime)), ..Default::default() };
        match MetaHandle::open(&dir, name).map(|h| h.apply(&target)) {
            Ok(None) => done(Outcome::Restored, "set back its modification and access times".into()),
            Ok(Some(p)) => failed(p),
            Err(e) => failed_errno(e, format!("cannot open it to set back its times: {}", describe_errno(e))),
        }
    }

    pub(super) fn undo_meta(&self, _seq: Option<u64>, path: &BPath, m: &MetaBefore) -> Done {
        let what = match m.what {
            MetaKind::Mode => format!("mode ({:o})", m.mode),
            MetaKind::Owner => format!("owner ({}:{})", m.uid, m.gid),
            MetaKind::Times => "times".to_string(),
            MetaKind::Xattr => {
                format!("extended attribute {}", m.xattr.as_ref().map(|x| x.name.display_lossy()).unwrap_or_default())
            }
            MetaKind::Flags => format!("attributes ({:#x})", m.flags.unwrap_or(0)),
        };
        let (dir, name) = match self.parent_of(path) {
            Ok(x) => x,
            Err(done) => return done,
        };
        let st = match dir.lstat(name) {
            Ok(st) => st,
            Err(e) => return failed_errno(e, format!("cannot examine it: {}", describe_errno(e))),
        };
        if !st.as_ref().is_some_and(|st| ident_of(st) == m.ident)
            && let Some(blob) = self.stored_inode(m.ident)
        {
            return match MetaHandle::open(&self.blobs, blob.as_bytes()) {
                Ok(h) => match h.apply(&MetaTarget::of_meta(m)) {
                    None => done(
                        Outcome::Restored,
                        format!(
                            "set back its {what} in the captured file (blob {blob}), which an older step puts back"
                        ),
                    ),
                    Some(p) => failed(p),
                },
                Err(e) => failed_errno(e, format!("cannot open its captured inode: {}", describe_errno(e))),
            };
        }
        let Some(st) = st else {
            return failed_because(Cause::Gone, format!("it no longer exists, so its {what} cannot be set back"));
        };
        if (file_type(&st) == FileType::Symlink) != m.symlink {
            return done(
                Outcome::Conflict,
                format!(
                    "a different kind of node ({}) now stands there; its {what} {} left alone",
                    type_name(&st),
                    if m.what == MetaKind::Times { "were" } else { "was" }
                ),
            );
        }
        if meta_already(&st, m, &dir, name) {
            return done(Outcome::Unchanged, format!("its {what} {} already as before", is_are(m.what)));
        }
        if !self.may_write_through(path, &st, &m.ident) {
            return done_because(
                Outcome::Conflict,
                Cause::Replaced,
                format!(
                    "another file than the session left is at its name now (inode {}, with {} names): its {what} {} left alone",
                    st.st_ino,
                    st.st_nlink,
                    if m.what == MetaKind::Times { "were" } else { "was" }
                ),
            );
        }
        if file_type(&st) == FileType::Directory {
            self.defer(path, DeferredMeta::Meta(m.clone()));
            return done(Outcome::Restored, format!("its {what} {} set back at the end", is_are(m.what)));
        }
        match MetaHandle::open(&dir, name) {
            Ok(h) => match h.apply(&MetaTarget::of_meta(m)) {
                None => done(Outcome::Restored, format!("set back its {what}")),
                Some(p) => failed(p),
            },
            Err(e) => failed_errno(e, format!("cannot open it to set back its {what}: {}", describe_errno(e))),
        }
    }
}
