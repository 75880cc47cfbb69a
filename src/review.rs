//! What a session did, summarised for the one question the user has to answer: keep it, or
//! rewind it. Net effects per path (prior state from the oldest record, current state from the
//! file system), grouped: modified (with a unified diff of prior and current contents),
//! created, deleted, renamed, metadata changes, network endpoints, processes run, and every
//! step that no undo can reverse.
//!
//! What this module cannot do: diff contents it did not keep. A file journaled irreversible, or
//! whose capture kept only its length before an append, is shown with what is known (sizes, the
//! reason), never with invented bytes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;

use crate::bpath::BPath;
use crate::journal::JournalContents;
use crate::record::{Before, ConnectResult, MetaKind, Node, Op, Record, Snapshot};
use crate::seal::{AfterState, ContentDigest};

/// A path whose contents changed.
#[derive(Clone, Debug, Serialize)]
pub struct Modified {
    /// The path.
    pub path: BPath,
    /// Unified diff of prior and current contents, when both are text.
    pub diff: Option<String>,
    /// Sizes and hashes, when either side is binary (or unknown).
    pub binary: Option<BinaryChange>,
    /// What the review could not show, and why.
    pub note: Option<String>,
}

/// Sizes and hashes of a binary change.
#[derive(Clone, Debug, Serialize)]
pub struct BinaryChange {
    /// Prior size, when known.
    pub before_size: Option<u64>,
    /// Current size.
    pub after_size: u64,
    /// Prior BLAKE3, when known.
    pub before_hash: Option<String>,
    /// Current BLAKE3.
    pub after_hash: String,
}

/// A path that did not exist before the session.
#[derive(Clone, Debug, Serialize)]
pub struct Created {
    /// The path.
    pub path: BPath,
    /// What it is now.
    pub kind: String,
    /// Its size, for a file.
    pub size: Option<u64>,
}

/// A path that no longer exists.
#[derive(Clone, Debug, Serialize)]
pub struct Deleted {
    /// The path.
    pub path: BPath,
    /// What it was.
    pub kind: String,
    /// Its size, for a file.
    pub size: Option<u64>,
}

/// A move of a path that existed before the session.
#[derive(Clone, Debug, Serialize)]
pub struct Renamed {
    /// Where it was.
    pub from: BPath,
    /// Where it is.
    pub to: BPath,
    /// Whether it replaced something that was at `to`.
    pub replaced: bool,
}

/// A metadata change on a path whose contents did not change.
#[derive(Clone, Debug, Serialize)]
pub struct MetadataChange {
    /// The path.
    pub path: BPath,
    /// What changed, in words (`mode 644 -> 600`).
    pub changes: Vec<String>,
}

/// A network effect.
#[derive(Clone, Debug, Serialize)]
pub struct NetworkEffect {
    /// `connect` or `send`.
    pub kind: String,
    /// The endpoint.
    pub endpoint: String,
    /// For connects: `ok`, `in_progress`, or `failed`.
    pub result: Option<String>,
    /// Who.
    pub pid: u32,
    /// Which program.
    pub prog: BPath,
}

/// A process the session ran.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessRun {
    /// Its pid.
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// The programs it ran, in order, with their arguments.
    pub execs: Vec<Vec<BPath>>,
    /// Its program (from its records).
    pub prog: BPath,
    /// How many changes it journaled.
    pub changes: usize,
}

/// A step no undo can reverse.
#[derive(Clone, Debug, Serialize)]
pub struct IrreversibleStep {
    /// Its record (0: a damage of the journal whose record is not known).
    pub seq: u64,
    /// What it was and why it cannot be reversed.
    pub what: String,
}

/// The whole review.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Review {
    /// Files whose contents changed.
    pub modified: Vec<Modified>,
    /// Paths created.
    pub created: Vec<Created>,
    /// Paths deleted.
    pub deleted: Vec<Deleted>,
    /// Paths moved.
    pub renamed: Vec<Renamed>,
    /// Metadata-only changes.
    pub metadata: Vec<MetadataChange>,
    /// Connections and datagrams.
    pub network: Vec<NetworkEffect>,
    /// Processes.
    pub processes: Vec<ProcessRun>,
    /// Steps no undo can reverse (unobserved programs included).
    pub irreversible: Vec<IrreversibleStep>,
}

/// Counts for `--stat`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stat {
    /// Modified files.
    pub modified: usize,
    /// Created paths.
    pub created: usize,
    /// Deleted paths.
    pub deleted: usize,
    /// Renamed paths.
    pub renamed: usize,
    /// Metadata changes.
    pub metadata: usize,
    /// Network effects.
    pub network: usize,
    /// Processes.
    pub processes: usize,
    /// Irreversible steps.
    pub irreversible: usize,
}

impl Review {
    /// The counts.
    pub fn stat(&self) -> Stat {
        Stat {
            modified: self.modified.len(),
            created: self.created.len(),
            deleted: self.deleted.len(),
            renamed: self.renamed.len(),
            metadata: self.metadata.len(),
            network: self.network.len(),
            processes: self.processes.len(),
            irreversible: self.irreversible.len(),
        }
    }
}

fn kind_of(s: &AfterState) -> &'static str {
    match s {
        AfterState::Absent => "nothing",
        AfterState::File { .. } => "file",
        AfterState::Dir { .. } => "directory",
        AfterState::Symlink { .. } => "symlink",
        AfterState::Other { .. } => "special file",
    }
}

fn snapshot_kind(s: &Snapshot) -> &'static str {
    match s.node {
        Node::File { .. } | Node::Packed { .. } | Node::Prefix { .. } => "file",
        Node::Dir => "directory",
        Node::Symlink { .. } => "symlink",
        Node::Special { .. } => "special file",
    }
}

/// What a path was before the session, as the oldest record touching it says.
#[derive(Clone, Debug)]
enum Prior<'a> {
    Absent,
    Known(&'a Snapshot),
    /// It existed (the source of a rename), nothing more is known.
    Existed,
    Unknown(String),
}

fn priors<'a>(journal: &'a JournalContents) -> Vec<(BPath, Prior<'a>)> {
    let mut out: Vec<(BPath, Prior<'a>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut add = |p: &BPath, prior: Prior<'a>| {
        if seen.insert(p.clone()) {
            out.push((p.clone(), prior));
        }
    };
    fn of(b: &Before) -> Prior<'_> {
        match b {
            Before::Absent | Before::Exclusive => Prior::Absent,
            Before::Contents(s) => Prior::Known(s),
            Before::Irreversible { reason } => Prior::Unknown(reason.to_string()),
            // The oldest record of the path: how the file the session made got there is not
            // journaled under this name.
            Before::Born { created } => Prior::Unknown(format!("a file this session created (record {created})")),
            Before::Kept { by } => Prior::Unknown(format!("kept by record {by}")),
        }
    }
    for r in &journal.records {
        match &r.op {
            Op::Change { path, before } => add(path, of(before)),
            Op::Rename(m) => {
                add(&m.from, Prior::Existed);
                add(&m.to, of(&m.to_before));
            }
            Op::Meta { path, .. } => add(path, Prior::Existed),
            _ => {}
        }
    }
    out
}

fn is_text(b: &[u8]) -> bool {
    !b.contains(&0) && std::str::from_utf8(b).is_ok()
}

/// The prior bytes of a file snapshot, read from the store (never trusted blindly: a copy is
/// checked against its recorded hash).
fn prior_bytes(blobs: &Path, s: &Snapshot, current: &[u8]) -> Result<Vec<u8>, String> {
    match &s.node {
        Node::File { blob, hash, .. } => {
            let bytes =
                std::fs::read(blobs.join(blob)).map_err(|e| format!("its prior contents cannot be read ({e})"))?;
            if hash.as_ref().is_some_and(|h| *h != blake3::hash(&bytes).to_hex().to_string()) {
                return Err("its captured contents do not match their recorded hash".into());
            }
            Ok(bytes)
        }
        Node::Packed { pack, at, size, hash } => {
            crate::pack::read_in(blobs, pack, *at, *size, hash).map_err(|e| format!("its prior contents: {e}"))
        }
        Node::Prefix { len } => {
            let len = *len as usize;
            if current.len() >= len {
                Ok(current[..len].to_vec())
            } else {
                Err("it is shorter than before the session".into())
            }
        }
        _ => Err("it was not a regular file".into()),
    }
}

fn under(p: &BPath, limits: &[BPath]) -> bool {
    limits.is_empty() || limits.iter().any(|l| p.starts_with_dir(l.as_bytes()))
}

fn meta_changes(prior: &Snapshot, now: &AfterState) -> Vec<String> {
    let mut out = Vec::new();
    let (mode, uid, gid) = match now {
        AfterState::File { mode, uid, gid, .. } | AfterState::Dir { mode, uid, gid, .. } => (*mode, *uid, *gid),
        _ => return out,
    };
    if mode != prior.mode {
        out.push(format!("mode {:o} -> {mode:o}", prior.mode));
    }
    if (uid, gid) != (prior.uid, prior.gid) {
        out.push(format!("owner {}:{} -> {uid}:{gid}", prior.uid, prior.gid));
    }
    out
}

/// Builds the review of a session from its journal, its store and the file system now.
/// `limits` (absolute paths) restricts the path sections to those paths and what lies beneath.
pub fn review(journal: &JournalContents, blobs: &Path, limits: &[BPath], progress: impl FnMut()) -> Review {
    review_span(journal, blobs, limits, Span::default(), progress)
}

/// The part of a session a review covers: the records after `after` (a mark's `seq`; 0: from
/// the start) and up to `until` (another mark's; `None`: to the end, compared with the file
/// system as it is now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// The records after this id.
    pub after: u64,
    /// The records up to this id.
    pub until: Option<u64>,
}

/// What a path was at the end of a span that ends before the session does: the prior state
/// of the first record after the span that is about it.
#[derive(Clone, Copy, Debug)]
enum Later<'a> {
    /// It was this, as that record kept it.
    Was(&'a Before),
    /// That record does not say what the path held (a rename away of it, a metadata change).
    Unsaid,
}

/// The paths the records after `until` are about, each with what the first of them says it
/// was at `until`.
fn states_at<'a>(journal: &'a JournalContents, until: u64) -> HashMap<&'a BPath, Later<'a>> {
    let mut out = HashMap::new();
    for r in journal.records.iter().filter(|r| r.seq > until) {
        match &r.op {
            Op::Change { path, before } => {
                out.entry(path).or_insert(Later::Was(before));
            }
            Op::Rename(m) => {
                out.entry(&m.from).or_insert(Later::Unsaid);
                out.entry(&m.to).or_insert(Later::Was(&m.to_before));
            }
            Op::Meta { path, .. } => {
                out.entry(path).or_insert(Later::Unsaid);
            }
            _ => {}
        }
    }
    out
}

/// The other side of a review: the file system now, or, for a span that ends at a mark, what
/// the records after it say each path was there.
struct Sides<'a> {
    blobs: &'a Path,
    at_end: Option<HashMap<&'a BPath, Later<'a>>>,
}

impl Sides<'_> {
    /// The path's state at the end of the span: `Err` when it is not known.
    fn state(&self, path: &BPath) -> Result<Option<AfterState>, String> {
        let unkept = || Err("its state at the end of the span was not kept".to_string());
        match self.at_end.as_ref().and_then(|m| m.get(path)) {
            None => Ok(AfterState::of(path.as_bytes()).ok()),
            Some(Later::Unsaid) => Err("it was moved away or its metadata changed after the span, and what it held at the span's end was not kept".into()),
            Some(Later::Was(Before::Absent | Before::Exclusive)) => Ok(Some(AfterState::Absent)),
            Some(Later::Was(Before::Contents(s))) => Ok(Some(match &s.node {
                Node::File { size, hash, blob, .. } => {
                    let hash = match hash {
                        Some(h) => ContentDigest::parse(h),
                        None => match std::fs::read(self.blobs.join(blob)) {
                            Ok(b) => blake3::hash(&b).into(),
                            Err(_) => return unkept(),
                        },
                    };
                    AfterState::File { ident: s.ident, size: *size, hash, mode: s.mode, uid: s.uid, gid: s.gid, ctime: None }
                }
                Node::Packed { size, hash, .. } => {
                    let hash = ContentDigest::parse(hash);
                    AfterState::File { ident: s.ident, size: *size, hash, mode: s.mode, uid: s.uid, gid: s.gid, ctime: None }
                }
                Node::Prefix { len } => {
                    let Ok(now) = std::fs::read(path.as_path()) else { return unkept() };
                    let Some(prefix) = now.get(..*len as usize) else { return unkept() };
                    let hash = blake3::hash(prefix).into();
                    AfterState::File { ident: s.ident, size: *len, hash, mode: s.mode, uid: s.uid, gid: s.gid, ctime: None }
                }
                Node::Dir => AfterState::Dir { ident: s.ident, mode: s.mode, uid: s.uid, gid: s.gid },
                Node::Symlink { target } => AfterState::Symlink { target: target.clone() },
                Node::Special { .. } => AfterState::Other { ident: s.ident, mode: s.mode },
            })),
            Some(Later::Was(_)) => unkept(),
        }
    }

    /// A regular file's bytes at the end of the span.
    fn bytes(&self, path: &BPath) -> Vec<u8> {
        match self.at_end.as_ref().and_then(|m| m.get(path)) {
            Some(Later::Was(Before::Contents(s))) => match &s.node {
                Node::File { blob, .. } => std::fs::read(self.blobs.join(blob)).unwrap_or_default(),
                Node::Packed { pack, at, size, hash } => {
                    crate::pack::read_in(self.blobs, pack, *at, *size, hash).unwrap_or_default()
                }
                Node::Prefix { len } => {
                    let mut b = std::fs::read(path.as_path()).unwrap_or_default();
                    b.truncate(*len as usize);
                    b
                }
                _ => Vec::new(),
            },
            _ => std::fs::read(path.as_path()).unwrap_or_default(),
        }
    }

    /// The snapshot a path's metadata at the end of the span comes from, when the span ends
    /// before the session (`None`: look at the file system).
    fn snapshot(&self, path: &BPath) -> Option<Result<&Snapshot, ()>> {
        match self.at_end.as_ref()?.get(path)? {
            Later::Was(Before::Contents(s)) => Some(Ok(s)),
            _ => Some(Err(())),
        }
    }
}

/// [`review`] of a span of the session: the net effect of the records in it, from the prior
/// state the oldest of them kept to the state at the span's end.
pub fn review_span(
    journal: &JournalContents,
    blobs: &Path,
    limits: &[BPath],
    span: Span,
    mut progress: impl FnMut(),
) -> Review {
    let sides = Sides { blobs, at_end: span.until.map(|u| states_at(journal, u)) };
    let inside;
    let journal = if span == Span::default() {
        journal
    } else {
        let records = journal
            .records
            .iter()
            .filter(|r| r.seq > span.after && span.until.is_none_or(|u| r.seq <= u))
            .cloned()
            .collect();
        let problems = journal
            .problems
            .iter()
            .filter(|p| p.seq().is_none_or(|q| q > span.after && span.until.is_none_or(|u| q <= u)))
            .cloned()
            .collect();
        inside = JournalContents { records, problems, ..Default::default() };
        &inside
    };
    let mut rv = Review::default();
    let mut state_now: HashMap<BPath, AfterState> = HashMap::new();
    let mut unknown_now: HashMap<BPath, String> = HashMap::new();
    let priors = priors(journal);
    for (p, _) in &priors {
        match sides.state(p) {
            Ok(Some(s)) => {
                state_now.insert(p.clone(), s);
            }
            Ok(None) => {}
            Err(why) => {
                unknown_now.insert(p.clone(), why);
            }
        }
    }
    // Renames of something that existed before the session to a name that holds it now.
    let mut renamed_from = std::collections::HashSet::new();
    let mut renamed_to = std::collections::HashSet::new();
    let prior_of: HashMap<&BPath, &Prior<'_>> = priors.iter().map(|(p, pr)| (p, pr)).collect();
    for r in &journal.records {
        if let Op::Rename(m) = &r.op {
            let crate::record::RenameOp { from, to, to_before, .. } = &**m;
            let from_existed = !matches!(prior_of.get(from), Some(Prior::Absent));
            let from_gone = matches!(state_now.get(from), Some(AfterState::Absent));
            let to_there = !matches!(state_now.get(to), Some(AfterState::Absent) | None);
            if from_existed
                && from_gone
                && to_there
                && !renamed_from.contains(from)
                && (under(from, limits) || under(to, limits))
            {
                let replaced = !matches!(to_before, Before::Absent);
                rv.renamed.push(Renamed { from: from.clone(), to: to.clone(), replaced });
                renamed_from.insert(from.clone());
                renamed_to.insert(to.clone());
            }
        }
    }
    for (path, prior) in &priors {
        progress();
        if !under(path, limits) || renamed_from.contains(path) {
            continue;
        }
        if let Some(why) = unknown_now.get(path) {
            rv.modified.push(Modified { path: path.clone(), diff: None, binary: None, note: Some(why.clone()) });
            continue;
        }
        let Some(now) = state_now.get(path) else { continue };
        match (prior, now) {
            (Prior::Absent, AfterState::Absent) => {}
            (Prior::Absent, n) => {
                if !renamed_to.contains(path) {
                    let size = if let AfterState::File { size, .. } = n { Some(*size) } else { None };
                    rv.created.push(Created { path: path.clone(), kind: kind_of(n).into(), size });
                }
            }
            (Prior::Known(s), AfterState::Absent) => {
                let size = match s.node {
                    Node::File { size, .. } | Node::Packed { size, .. } => Some(size),
                    Node::Prefix { len } => Some(len),
                    _ => None,
                };
                rv.deleted.push(Deleted { path: path.clone(), kind: snapshot_kind(s).into(), size });
            }
            (Prior::Existed, AfterState::Absent) => {
                rv.deleted.push(Deleted { path: path.clone(), kind: "unknown".into(), size: None });
            }
            (Prior::Unknown(why), n) => {
                if !matches!(n, AfterState::Absent) || !renamed_to.contains(path) {
                    let note = Some(format!("its prior state was not kept: {why}"));
                    rv.modified.push(Modified { path: path.clone(), diff: None, binary: None, note });
                }
            }
            (Prior::Known(s), now @ AfterState::File { size, hash, .. })
                if matches!(s.node, Node::File { .. } | Node::Packed { .. } | Node::Prefix { .. }) =>
            {
                let current = sides.bytes(path);
                match prior_bytes(blobs, s, &current) {
                    Ok(before) if before == current => {
                        let changes = meta_changes(s, now);
                        if !changes.is_empty() {
                            rv.metadata.push(MetadataChange { path: path.clone(), changes });
                        }
                    }
                    Ok(before) if is_text(&before) && is_text(&current) => {
                        let diff = similar::TextDiff::from_lines(
                            std::str::from_utf8(&before).unwrap_or_default(),
                            std::str::from_utf8(&current).unwrap_or_default(),
                        );
                        let name = path.display_lossy();
                        let text = diff
                            .unified_diff()
                            .context_radius(3)
                            .header(&format!("a{name}"), &format!("b{name}"))
                            .to_string();
                        rv.modified.push(Modified { path: path.clone(), diff: Some(text), binary: None, note: None });
                        let changes = meta_changes(s, now);
                        if !changes.is_empty() {
                            rv.metadata.push(MetadataChange { path: path.clone(), changes });
                        }
                    }
                    Ok(before) => {
                        let binary = BinaryChange {
                            before_size: Some(before.len() as u64),
                            after_size: *size,
                            before_hash: Some(blake3::hash(&before).to_hex().to_string()),
                            after_hash: hash.to_text(),
                        };
                        rv.modified.push(Modified { path: path.clone(), diff: None, binary: Some(binary), note: None });
                    }
                    Err(why) => {
                        let binary = BinaryChange {
                            before_size: None,
                            after_size: *size,
                            before_hash: None,
                            after_hash: hash.to_text(),
                        };
                        rv.modified.push(Modified {
                            path: path.clone(),
                            diff: None,
                            binary: Some(binary),
                            note: Some(why),
                        });
                    }
                }
            }
            (Prior::Known(s), now) => {
                let was = snapshot_kind(s);
                let is = kind_of(now);
                if was != is {
                    let note = Some(format!("it was a {was} and is a {is} now"));
                    rv.modified.push(Modified { path: path.clone(), diff: None, binary: None, note });
                } else if let (Node::Symlink { target }, AfterState::Symlink { target: now_t }) = (&s.node, now) {
                    if target != now_t {
                        let note =
                            Some(format!("symlink target {} -> {}", target.display_lossy(), now_t.display_lossy()));
                        rv.modified.push(Modified { path: path.clone(), diff: None, binary: None, note });
                    }
                } else {
                    let changes = meta_changes(s, now);
                    if !changes.is_empty() {
                        rv.metadata.push(MetadataChange { path: path.clone(), changes });
                    }
                }
            }
            (Prior::Existed, _) => {}
        }
    }
    // Metadata records on paths whose contents the session did not otherwise change.
    let mut meta_first: BTreeMap<BPath, (&Record, crate::record::MetaBefore)> = BTreeMap::new();
    for r in &journal.records {
        if let Op::Meta { path, before } = &r.op {
            meta_first.entry(path.clone()).or_insert((r, (**before).clone()));
        }
    }
    for (path, (_, m)) in meta_first {
        if !under(&path, limits)
            || rv.metadata.iter().any(|x| x.path == path)
            || rv.modified.iter().any(|x| x.path == path)
        {
            continue;
        }
        if !matches!(prior_of.get(&path), Some(Prior::Existed)) {
            continue;
        }
        let now = state_now.get(&path);
        let mut changes = Vec::new();
        match (m.what, now) {
            (MetaKind::Mode, Some(AfterState::File { mode, .. } | AfterState::Dir { mode, .. })) if *mode != m.mode => {
                changes.push(format!("mode {:o} -> {mode:o}", m.mode));
            }
            (MetaKind::Owner, Some(AfterState::File { uid, gid, .. } | AfterState::Dir { uid, gid, .. }))
                if (*uid, *gid) != (m.uid, m.gid) =>
            {
                changes.push(format!("owner {}:{} -> {uid}:{gid}", m.uid, m.gid));
            }
            (MetaKind::Times, _) => {
                let mtime = match sides.snapshot(&path) {
                    Some(Ok(s)) => Some(s.mtime),
                    Some(Err(())) => None,
                    None => rustix::fs::lstat(path.as_path()).ok().map(|st| [st.st_mtime, st.st_mtime_nsec as i64]),
                };
                if mtime.is_some_and(|t| t != m.mtime) {
                    changes.push("modification time changed".into());
                }
            }
            (MetaKind::Flags, _) => {
                changes.push(format!("attributes (chattr) changed from {:#x}", m.flags.unwrap_or(0)))
            }
            (MetaKind::Xattr, _) if sides.snapshot(&path).is_some() => {
                changes
                    .push("extended attributes may have changed (their state at the span's end was not kept)".into());
            }
            (MetaKind::Xattr, _) => {
                if let Some(x) = &m.xattr {
                    let now = crate::capture::xattr_value(path.as_bytes(), x.name.as_bytes()).ok().flatten();
                    if now.as_deref() != x.value.as_ref().map(|v| v.0.as_slice()) {
                        changes.push(format!("extended attribute {} changed", x.name.display_lossy()));
                    }
                }
            }
            _ => {}
        }
        if !changes.is_empty() {
            rv.metadata.push(MetadataChange { path, changes });
        }
    }
    // Effects, processes, irreversible steps.
    let mut procs: BTreeMap<u32, ProcessRun> = BTreeMap::new();
    for r in &journal.records {
        let p = procs.entry(r.pid).or_insert_with(|| ProcessRun {
            pid: r.pid,
            ppid: r.ppid,
            execs: Vec::new(),
            prog: r.prog().clone(),
            changes: 0,
        });
        match &r.op {
            Op::Exec(e) => match e.child {
                None => p.execs.push(e.argv.to_paths()),
                Some(c) => {
                    let parent = r.pid;
                    procs
                        .entry(c)
                        .or_insert_with(|| ProcessRun {
                            pid: c,
                            ppid: parent,
                            execs: Vec::new(),
                            prog: BPath::default(),
                            changes: 0,
                        })
                        .execs
                        .insert(0, e.argv.to_paths());
                }
            },
            Op::Change { .. } | Op::Rename(_) | Op::Meta { .. } => p.changes += 1,
            Op::Connect { peer, result } => rv.network.push(NetworkEffect {
                kind: "connect".into(),
                endpoint: peer.to_string(),
                result: Some(
                    match result {
                        ConnectResult::Ok => "ok",
                        ConnectResult::InProgress => "in_progress",
                        ConnectResult::Failed { .. } => "failed",
                        ConnectResult::Unknown => "unknown",
                    }
                    .into(),
                ),
                pid: r.pid,
                prog: r.prog().clone(),
            }),
            Op::Send { peer } => rv.network.push(NetworkEffect {
                kind: "send".into(),
                endpoint: peer.to_string(),
                result: None,
                pid: r.pid,
                prog: r.prog().clone(),
            }),
            _ => {}
        }
    }
    rv.processes = procs.into_values().collect();
    let failed = journal.failed_calls();
    for r in journal.records.iter().filter(|r| r.irreversible() && !failed.contains(&r.seq)) {
        rv.irreversible.push(IrreversibleStep { seq: r.seq, what: irreversible_what(r) });
    }
    let interrupted = journal.interrupted_temp_names();
    for r in journal.records.iter().filter(|r| interrupted.contains(&r.seq)) {
        if let Op::TempName { template } = &r.op {
            let what = format!(
                "{} {}: interrupted between creating a name from this template and journaling it (the process was killed, or its record was lost); undo cannot remove what it created",
                r.call(),
                template.display_lossy()
            );
            rv.irreversible.push(IrreversibleStep { seq: r.seq, what });
        }
    }
    for p in &journal.problems {
        rv.irreversible.push(IrreversibleStep { seq: p.seq().unwrap_or(0), what: p.describe() });
    }
    rv
}

fn irreversible_what(r: &Record) -> String {
    let prog = r.prog().display_lossy();
    match &r.op {
        Op::Change { path, before: Before::Irreversible { reason } } => {
            format!("{} {}: {reason}", r.call(), path.display_lossy())
        }
        Op::Rename(m) => match &m.to_before {
            Before::Irreversible { reason } => format!("{} over {}: {reason}", r.call(), m.to.display_lossy()),
            _ => format!("{} (record {})", r.call(), r.seq),
        },
        Op::Connect { peer, .. } => format!("{prog} connected to {peer}"),
        Op::Send { peer } => format!("{prog} sent data to {peer}"),
        Op::Signal { target, signal, target_prog, .. } => format!(
            "{prog} sent signal {signal} to process {target}{} outside the session",
            target_prog.as_ref().map(|p| format!(" ({})", p.display_lossy())).unwrap_or_default()
        ),
        Op::Unobserved { program, reason } => format!("{} ran unobserved: {reason}", program.display_lossy()),
        _ => format!("{} (record {})", r.call(), r.seq),
    }
}
