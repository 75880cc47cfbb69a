//! What earlier undos of a session did to its records: which are undone now, and when an undo
//! (or a redo) last acted on each. Read from the session's `undone` file, one line per record
//! an undo reversed (`SEQ NS`) or a redo gave back (`-SEQ NS`).
//!
//! Both are held as runs of consecutive record numbers: an undo writes the numbers of every
//! record it reversed with one time, so a session of a million records undone, redone and
//! undone again is a few runs, where sets and maps of a million numbers (and the file read
//! whole, three million lines) took 200 MB at an undo's peak.
//!
//! What this cannot do: answer without a binary search of its runs (a few comparisons per
//! question when there are few runs; as many as for a sorted list when no two numbers are
//! consecutive).

use std::collections::HashMap;
use std::io::{self, BufRead};

use crate::journal::JournalContents;
use crate::session::Session;

/// A set of record numbers, held as sorted runs of consecutive ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqSet {
    /// First and last number of each run, ascending, apart from each other.
    runs: Vec<(u64, u64)>,
}

impl SeqSet {
    /// Whether `seq` is in the set.
    pub fn contains(&self, seq: &u64) -> bool {
        let i = self.runs.partition_point(|&(_, last)| last < *seq);
        self.runs.get(i).is_some_and(|&(first, _)| first <= *seq)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The set of the numbers of `ascending` (each greater than the one before).
    fn from_ascending(ascending: impl IntoIterator<Item = u64>) -> SeqSet {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for s in ascending {
            match runs.last_mut() {
                Some((_, last)) if last.checked_add(1) == Some(s) => *last = s,
                _ => runs.push((s, s)),
            }
        }
        SeqSet { runs }
    }
}

impl FromIterator<u64> for SeqSet {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> SeqSet {
        let mut all: Vec<u64> = iter.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        SeqSet::from_ascending(all)
    }
}

/// A time (ns since the epoch) for some record numbers, held as sorted runs of consecutive
/// numbers with one time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqTimes {
    /// First and last number of each run, and its time, ascending.
    runs: Vec<(u64, u64, i64)>,
}

impl SeqTimes {
    /// The time of `seq`, if it has one.
    pub fn get(&self, seq: &u64) -> Option<i64> {
        let i = self.runs.partition_point(|&(_, last, _)| last < *seq);
        self.runs.get(i).filter(|&&(first, _, _)| first <= *seq).map(|&(_, _, t)| t)
    }

    fn from_ascending(ascending: impl IntoIterator<Item = (u64, i64)>) -> SeqTimes {
        let mut runs: Vec<(u64, u64, i64)> = Vec::new();
        for (s, t) in ascending {
            match runs.last_mut() {
                Some((_, last, at)) if last.checked_add(1) == Some(s) && *at == t => *last = s,
                _ => runs.push((s, s, t)),
            }
        }
        SeqTimes { runs }
    }
}

impl FromIterator<(u64, i64)> for SeqTimes {
    fn from_iter<I: IntoIterator<Item = (u64, i64)>>(iter: I) -> SeqTimes {
        let mut all: Vec<(u64, i64)> = iter.into_iter().collect();
        // The last time given for a number is its time.
        all.reverse();
        all.sort_by_key(|&(s, _)| s);
        all.dedup_by_key(|&mut (s, _)| s);
        SeqTimes::from_ascending(all)
    }
}

/// What earlier undos did (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Earlier {
    /// The records undone now.
    pub(super) undone: SeqSet,
    /// When an undo or a redo last acted on each record, where known (lines written before
    /// undos kept it hold the number alone).
    pub(super) times: SeqTimes,
}

/// Not named by any line.
const UNTOLD: u8 = 0;
/// Undone by the last line naming it.
const UNDONE: u8 = 1;
/// Given back by a redo in the last line naming it.
const REDONE: u8 = 2;
/// No time known.
const NO_TIME: i64 = i64::MIN;

/// Reads `session`'s `undone` file a line at a time, keeping what each line says of a record
/// of `journal` by the record's place there (a byte, and a time once any line has one), and
/// what it says of any other number beside. A file that cannot be read says nothing.
pub(super) fn read(session: &Session, journal: &JournalContents) -> Earlier {
    let file = match std::fs::File::open(session.dir().join(super::UNDONE_FILE)) {
        Ok(f) => f,
        Err(_) => return Earlier::default(),
    };
    let records = &journal.records;
    let mut state = vec![UNTOLD; records.len()];
    // (`NO_TIME`: none; a line's time is never it.)
    let mut times: Vec<i64> = Vec::new();
    let mut others: HashMap<u64, (bool, Option<i64>)> = HashMap::new();
    for line in io::BufReader::with_capacity(1 << 16, file).split(b'\n') {
        let Ok(line) = line else { break };
        let Ok(line) = std::str::from_utf8(&line) else { continue };
        let mut f = line.split_whitespace();
        let Some(first) = f.next() else { continue };
        let (undone, seq) = match first.strip_prefix('-') {
            Some(s) => (false, s),
            None => (true, first),
        };
        let Ok(seq) = seq.parse::<u64>() else { continue };
        let at: Option<i64> = f.next().and_then(|t| t.parse().ok()).filter(|&t| t != NO_TIME);
        match records.binary_search_by_key(&seq, |r| r.seq) {
            Ok(i) => {
                state[i] = if undone { UNDONE } else { REDONE };
                if let Some(at) = at {
                    if times.is_empty() {
                        times = vec![NO_TIME; records.len()];
                    }
                    times[i] = at;
                }
            }
            Err(_) => {
                let e = others.entry(seq).or_insert((undone, at));
                *e = (undone, at.or(e.1));
            }
        }
    }
    let mut other_undone: Vec<u64> = others.iter().filter(|(_, (u, _))| *u).map(|(s, _)| *s).collect();
    other_undone.sort_unstable();
    let mut other_times: Vec<(u64, i64)> = others.iter().filter_map(|(s, (_, t))| Some((*s, (*t)?))).collect();
    other_times.sort_unstable();
    let undone = records.iter().zip(&state).filter(|(_, st)| **st == UNDONE).map(|(r, _)| r.seq);
    let timed = records.iter().zip(&times).filter(|(_, t)| **t != NO_TIME).map(|(r, t)| (r.seq, *t));
    Earlier {
        undone: SeqSet::from_ascending(merged(undone, other_undone, |s| *s)),
        times: SeqTimes::from_ascending(merged(timed, other_times, |(s, _)| *s)),
    }
}

/// The items of two ascending sequences, in one ascending sequence (`key`: what they are
/// ordered by).
fn merged<T>(a: impl Iterator<Item = T>, b: Vec<T>, key: impl Fn(&T) -> u64) -> impl Iterator<Item = T> {
    let (mut a, mut b) = (a.peekable(), b.into_iter().peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if key(y) < key(x) => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_of_record_numbers_answers_as_a_set_would_and_holds_a_countdown_as_one_run() {
        let set: SeqSet = [7, 3, 4, 5, 10, 4, 0].into_iter().collect();
        for s in 0..12 {
            assert_eq!(set.contains(&s), [0, 3, 4, 5, 7, 10].contains(&s), "{s}");
        }
        assert_eq!(set.runs, [(0, 0), (3, 5), (7, 7), (10, 10)]);
        let million = SeqSet::from_ascending(1..=1_000_000);
        assert_eq!(million.runs.len(), 1);
        assert!(million.contains(&1) && million.contains(&1_000_000) && !million.contains(&0));
        assert!(SeqSet::default().is_empty() && !SeqSet::default().contains(&0));
    }

    #[test]
    fn record_times_keep_the_last_time_given_and_one_run_per_time() {
        let times: SeqTimes = [(5, 100), (6, 100), (7, 100), (6, 200), (9, 100)].into_iter().collect();
        assert_eq!(times.get(&5), Some(100));
        assert_eq!(times.get(&6), Some(200), "the last time given wins");
        assert_eq!(times.get(&7), Some(100));
        assert_eq!(times.get(&8), None);
        assert_eq!(times.get(&9), Some(100));
        let undo = SeqTimes::from_ascending((1..=1_000_000).map(|s| (s, 42)));
        assert_eq!(undo.runs.len(), 1, "a countdown with one time is one run");
    }

    #[test]
    fn the_undone_file_read_a_line_at_a_time_says_what_its_last_line_on_each_record_says() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("s");
        let header = crate::session::Header::new("s".into(), Vec::new(), "/".into(), "test");
        let session = Session::create(&dir, &header, crate::session::Durability::InKernel).unwrap();
        let session = Session::open(session.dir()).unwrap();
        let records = [1, 2, 3, 5]
            .map(|seq| session.starter_record(seq, "openat", crate::record::Op::CallFailed { of_seq: 0, errno: 1 }));
        let journal = JournalContents { records: records.to_vec(), ..Default::default() };
        // An undo of 3, 2 and 1, a redo of 3 and 2, an undo of 3 (an older line without a
        // time), and a line on a record that is not in the journal (9).
        let lines = "3 100\n2 100\n1 100\n-3 200\n-2 200\n3\n9 300\nnot a line\n";
        std::fs::write(dir.join(super::super::UNDONE_FILE), lines).unwrap();
        let e = read(&session, &journal);
        let undone: Vec<u64> = (0..11).filter(|s| e.undone.contains(s)).collect();
        assert_eq!(undone, [1, 3, 9]);
        let times: Vec<Option<i64>> = [1, 2, 3, 5, 9].iter().map(|s| e.times.get(s)).collect();
        assert_eq!(
            times,
            [Some(100), Some(200), Some(200), None, Some(300)],
            "a line without a time keeps the last one"
        );
        std::fs::remove_file(dir.join(super::super::UNDONE_FILE)).unwrap();
        let none = read(&session, &journal);
        assert!(none.undone.is_empty() && none.times.get(&1).is_none());
    }

    #[test]
    fn two_ascending_sequences_merge_into_one() {
        let got: Vec<u64> = merged([1, 4, 9].into_iter(), vec![2, 3, 10], |s| *s).collect();
        assert_eq!(got, [1, 2, 3, 4, 9, 10]);
        let got: Vec<u64> = merged(std::iter::empty(), vec![2], |s| *s).collect();
        assert_eq!(got, [2]);
    }
}
