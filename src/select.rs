//! Choosing which records a selective undo reverses: the records about some paths (or whole
//! subtrees), the newest N records, or everything one process and its descendants did.
//!
//! A selection is closed over what it needs to make sense: restoring a file inside a directory
//! that a later step removed brings that directory back too. What a selection cannot repair
//! (a parent moved away by a rename that is not selected) is reported by the undo itself, step
//! by step.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::bpath::BPath;
use crate::journal::JournalContents;
use crate::record::{Before, Node, Op, Record};

/// What a selective undo covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Records about these paths or anything beneath them (absolute paths).
    Paths(Vec<BPath>),
    /// The newest N records.
    Last(usize),
    /// Records made by this process and its descendants.
    Pid(u32),
    /// Every record after this one (a mark's `seq`, for `undo --to`).
    After(u64),
}

/// The paths a record is about.
pub fn record_paths(r: &Record) -> Vec<&BPath> {
    match &r.op {
        Op::Change { path, .. } | Op::Meta { path, .. } => vec![path],
        Op::Rename(m) => vec![&m.from, &m.to],
        _ => vec![],
    }
}

fn ancestors(p: &BPath) -> Vec<BPath> {
    let mut out = Vec::new();
    let mut cur = p.clone();
    while let Some((parent, _)) = cur.split_parent() {
        let parent = BPath::new(parent.to_vec());
        if parent.as_bytes() == b"/" {
            break;
        }
        out.push(parent.clone());
        cur = parent;
    }
    out
}

/// The processes a pid covers: itself and every descendant the journal knows of.
fn descendants(journal: &JournalContents, root: u32) -> HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for r in &journal.records {
        if r.ppid != r.pid {
            children.entry(r.ppid).or_default().push(r.pid);
        }
        if let Op::Exec(e) = &r.op
            && let Some(c) = e.child
        {
            children.entry(r.pid).or_default().push(c);
        }
    }
    let mut out = HashSet::from([root]);
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if out.insert(c) {
                todo.push(c);
            }
        }
    }
    out
}

/// The `seq`s of the journal's damaged records that no valid record has (a corrupt line whose
/// `seq` could be read, a record set aside as forged), in order.
fn damaged_seqs(journal: &JournalContents) -> BTreeSet<u64> {
    let held: HashSet<u64> = journal.records.iter().map(|r| r.seq).collect();
    journal.problems.iter().filter_map(|p| p.seq()).filter(|s| !held.contains(s)).collect()
}

/// The sequence numbers a selection covers, closed over the directories its paths need. A
/// damaged record with a `seq` is covered where its place says (among the newest N, after a
/// mark) and by every selection by path or process (it does not say what it names).
pub fn select(journal: &JournalContents, sel: &Selection) -> BTreeSet<u64> {
    let mut chosen: BTreeSet<u64> = match sel {
        Selection::Paths(paths) => journal
            .records
            .iter()
            .filter(|r| {
                let under = |rp: &BPath| paths.iter().any(|p| rp.starts_with_dir(p.as_bytes()));
                // A temporary name's template is not a path the undo touches, but an interrupted
                // one belongs to the directory it would have created a file in.
                record_paths(r).into_iter().any(under)
                    || match &r.op {
                        Op::TempName { template } => under(template),
                        Op::DirTimes(d) => under(&d.path),
                        _ => false,
                    }
            })
            .map(|r| r.seq)
            .collect(),
        // Steps, as log shows them: the audit and bookkeeping records (an exec, a directory's
        // times, a failed call's outcome, a temporary name's intent) come along, uncounted.
        Selection::Last(0) => BTreeSet::new(),
        Selection::Last(n) => {
            // A damaged record is a step in its place: when it is among the newest N, it is
            // chosen (and named as not undone), not replaced by an older step.
            let is_step = |r: &Record| {
                !matches!(r.op, Op::Exec { .. } | Op::DirTimes { .. } | Op::CallFailed { .. } | Op::TempName { .. })
            };
            let mut records = journal.records.iter().rev().map(|r| (r.seq, is_step(r))).peekable();
            let damaged = damaged_seqs(journal);
            let mut damaged = damaged.iter().rev().map(|&s| (s, true)).peekable();
            let mut steps = 0;
            let mut chosen = BTreeSet::new();
            loop {
                let newer_damaged = match (records.peek(), damaged.peek()) {
                    (Some(r), Some(d)) => d.0 > r.0,
                    (None, Some(_)) => true,
                    (_, None) => false,
                };
                let Some((seq, step)) = (if newer_damaged { damaged.next() } else { records.next() }) else { break };
                if steps == *n && step {
                    break;
                }
                steps += usize::from(step);
                chosen.insert(seq);
            }
            chosen
        }
        Selection::Pid(pid) => {
            let pids = descendants(journal, *pid);
            journal.records.iter().filter(|r| pids.contains(&r.pid)).map(|r| r.seq).collect()
        }
        Selection::After(mark) => {
            journal.records.iter().map(|r| r.seq).chain(damaged_seqs(journal)).filter(|&seq| seq > *mark).collect()
        }
    };
    // A damaged record does not say what it names, nor whose it is: a selection by path or by
    // process may hold it, and takes it (it is then named as not undone).
    if matches!(sel, Selection::Paths(_) | Selection::Pid(_)) {
        chosen.extend(damaged_seqs(journal));
    }
    // A chosen record about a/b/c needs a and a/b to exist: bring back any directory on the
    // way that a later, unchosen record removed.
    let removed_dirs: Vec<(&BPath, u64)> = journal
        .records
        .iter()
        .filter_map(|r| match &r.op {
            Op::Change { path, before: Before::Contents(s) } if matches!(s.node, Node::Dir) => Some((path, r.seq)),
            _ => None,
        })
        .collect();
    let mut extra = BTreeSet::new();
    for r in journal.records.iter().filter(|r| chosen.contains(&r.seq)) {
        for p in record_paths(r) {
            for a in ancestors(p) {
                for (dir, seq) in &removed_dirs {
                    if **dir == a && *seq > r.seq {
                        extra.insert(*seq);
                    }
                }
            }
        }
    }
    chosen.extend(extra);
    // Everything after a mark holds the times of each directory its changes are in: they are
    // journaled again in every turn, before its entries first change.
    if matches!(sel, Selection::After(_)) {
        return chosen;
    }
    // The times of every directory a chosen record changes an entry of go with it: the
    // newest `dir_times` of the directory taken before the oldest chosen change in it, and
    // any after. Undo sets back the oldest it is given, once every change to the entries
    // after it is undone.
    let mut first_change: HashMap<&[u8], u64> = HashMap::new();
    for r in journal.records.iter().filter(|r| chosen.contains(&r.seq)) {
        for d in record_paths(r).into_iter().filter_map(|p| p.split_parent().map(|(d, _)| d)) {
            first_change.entry(d).and_modify(|s| *s = (*s).min(r.seq)).or_insert(r.seq);
        }
    }
    let mut times: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for r in &journal.records {
        if let Op::DirTimes(d) = &r.op {
            let path = &d.path;
            if first_change.contains_key(path.as_bytes()) {
                times.entry(path.as_bytes()).or_default().push(r.seq);
            }
        }
    }
    for (dir, seqs) in times {
        let first = first_change[dir];
        let from = seqs.iter().copied().filter(|&s| s < first).max().unwrap_or(0);
        chosen.extend(seqs.into_iter().filter(|&s| s >= from));
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Ident, Snapshot, Version};

    fn rec(seq: u64, pid: u32, ppid: u32, call: &str, op: Op) -> Record {
        Record {
            v: Version,
            seq,
            time: Default::default(),
            pid,
            ppid,
            origin: crate::record::Origin::new(BPath::from("/p"), call.into()),
            op,
        }
    }

    fn dir_snap() -> Before {
        Before::contents(Snapshot {
            node: Node::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: [0, 0],
            atime: [0, 0],
            ident: Ident { dev: 1, ino: 1 },
            xattrs: None,
            links: 0,
        })
    }

    fn journal() -> JournalContents {
        let ch = |p: &str, b: Before| Op::Change { path: BPath::from(p), before: b };
        JournalContents {
            records: vec![
                rec(1, 10, 1, "open", ch("/w/d/f", Before::Absent)),
                rec(2, 11, 10, "open", ch("/w/g", Before::Absent)),
                rec(3, 12, 11, "unlinkat", ch("/w/d/f", Before::Absent)),
                rec(4, 12, 11, "unlinkat", ch("/w/d", dir_snap())),
                rec(5, 13, 1, "open", ch("/w/h", Before::Absent)),
            ],
            ..Default::default()
        }
    }

    /// [`journal`] with its record of `seq` damaged (set aside, named by a problem).
    fn damaged_at(seq: u64) -> JournalContents {
        let mut j = journal();
        j.records.retain(|r| r.seq != seq);
        j.problems.push(crate::journal::Problem::Unaccounted { seq, last_id: None });
        j
    }

    #[test]
    fn a_damaged_record_among_the_newest_steps_is_chosen_in_its_place_and_no_older_one_takes_it() {
        assert_eq!(select(&damaged_at(5), &Selection::Last(1)), BTreeSet::from([5]));
        assert_eq!(select(&damaged_at(5), &Selection::Last(2)), BTreeSet::from([4, 5]));
        assert_eq!(select(&damaged_at(4), &Selection::Last(2)), BTreeSet::from([4, 5]));
        assert_eq!(select(&damaged_at(2), &Selection::Last(2)), BTreeSet::from([4, 5]), "an older one is not");
    }

    #[test]
    fn a_damaged_record_after_a_mark_is_chosen_and_every_selection_by_path_or_process_holds_it() {
        assert_eq!(select(&damaged_at(5), &Selection::After(3)), BTreeSet::from([4, 5]));
        assert_eq!(select(&damaged_at(2), &Selection::After(3)), BTreeSet::from([4, 5]));
        assert!(select(&damaged_at(2), &Selection::Paths(vec![BPath::from("/w/h")])).contains(&2));
        assert!(select(&damaged_at(2), &Selection::Pid(13)).contains(&2));
    }

    #[test]
    fn a_path_selection_brings_back_the_directory_a_later_step_removed() {
        let s = select(&journal(), &Selection::Paths(vec![BPath::from("/w/d/f")]));
        assert_eq!(s, BTreeSet::from([1, 3, 4]));
    }

    #[test]
    fn a_subtree_selection_covers_everything_beneath() {
        let s = select(&journal(), &Selection::Paths(vec![BPath::from("/w/d")]));
        assert_eq!(s, BTreeSet::from([1, 3, 4]));
        let all = select(&journal(), &Selection::Paths(vec![BPath::from("/w")]));
        assert_eq!(all.len(), 5);
    }

    #[test]
    fn a_subtree_selection_covers_a_temporary_name_made_in_it() {
        let mut j = journal();
        j.records.push(rec(6, 14, 1, "mkstemp", Op::TempName { template: BPath::from("/w/t/sedXXXXXX") }));
        assert!(select(&j, &Selection::Paths(vec![BPath::from("/w/t")])).contains(&6));
        assert!(!select(&j, &Selection::Paths(vec![BPath::from("/w/d")])).contains(&6));
    }

    #[test]
    fn last_n_takes_the_newest_records() {
        assert_eq!(select(&journal(), &Selection::Last(2)), BTreeSet::from([4, 5]));
    }

    #[test]
    fn everything_after_a_mark_is_selected_and_nothing_before_it() {
        assert_eq!(select(&journal(), &Selection::After(3)), BTreeSet::from([4, 5]));
        assert_eq!(select(&journal(), &Selection::After(5)), BTreeSet::new());
    }

    #[test]
    fn a_selection_takes_a_directory_s_times_from_the_turn_its_first_chosen_change_is_in() {
        let mut j = journal();
        let times = |p: &str| {
            Op::DirTimes(Box::new(crate::record::DirTimesOp {
                path: BPath::from(p),
                ident: Ident { dev: 1, ino: 2 },
                atime: [0, 0],
                mtime: [0, 0],
            }))
        };
        // /w's times journaled at 0 (before the session's first change there) and again at 6,
        // after a mark at 5; then a change in /w at 7.
        j.records.insert(0, rec(0, 10, 1, "open", times("/w")));
        j.records.push(rec(6, 14, 1, "open", times("/w")));
        j.records.push(rec(7, 14, 1, "open", Op::Change { path: BPath::from("/w/k"), before: Before::Absent }));
        let after_mark = select(&j, &Selection::After(5));
        assert_eq!(after_mark, BTreeSet::from([6, 7]), "the times of the mark's turn, not the session's first");
        let whole_turn_one = select(&j, &Selection::Paths(vec![BPath::from("/w/g")]));
        assert!(whole_turn_one.contains(&0) && whole_turn_one.contains(&6), "{whole_turn_one:?}");
    }

    #[test]
    fn a_pid_selection_covers_its_descendants_only() {
        assert_eq!(select(&journal(), &Selection::Pid(11)), BTreeSet::from([2, 3, 4]));
        assert_eq!(select(&journal(), &Selection::Pid(13)), BTreeSet::from([5]));
    }
}
