//! The reader against committed sessions (`tests/fixtures/sessions/`, how each was made is in
//! its README): an intact one, and a torn, a corrupt, a legacy-checksum and an
//! unknown-version variant of it. Each must read back exactly as the format says
//! (`docs/FORMAT.md`, "The reader's rules for what it does not know").

use std::path::{Path, PathBuf};

use aether_journal::journal::{JournalContents, Problem};
use aether_journal::record::Op;
use aether_journal::session::Session;

/// The seqs of the intact session's records, oldest first.
const INTACT: [u64; 12] = [2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sessions").join(name)
}

fn read(name: &str) -> JournalContents {
    // A checkout is not private (0755): the fixtures are read as a copied session would be.
    let session = Session::open_untrusted(&fixture(name)).unwrap_or_else(|e| panic!("open {name}: {e}"));
    session.read_journal().unwrap_or_else(|e| panic!("read {name}: {e}"))
}

fn seqs(contents: &JournalContents) -> Vec<u64> {
    contents.records.iter().map(|r| r.seq).collect()
}

#[test]
fn an_intact_session_reads_back_every_record_with_its_paths_and_no_problem() {
    let c = read("intact");
    assert_eq!(seqs(&c), INTACT);
    assert!(c.problems.is_empty() && c.torn_tail.is_none() && c.torn_in_segments.is_empty(), "{:?}", c.problems);
    let renames: Vec<_> = c
        .records
        .iter()
        .filter_map(|r| match &r.op {
            Op::Rename(m) => Some((m.from.display_lossy(), m.to.display_lossy())),
            _ => None,
        })
        .collect();
    assert_eq!(renames.last(), Some(&("/tmp/fx/tree/made.txt".into(), "/tmp/fx/tree/d/made.txt".into())));
    assert_eq!(c.failed_calls().into_iter().collect::<Vec<_>>(), [11], "mv's first rename failed (EEXIST)");
}

#[test]
fn a_torn_final_record_is_reported_by_its_offset_and_every_record_before_it_is_read() {
    let c = read("torn");
    assert_eq!(seqs(&c), INTACT);
    let intact_len = std::fs::metadata(fixture("intact/journal")).unwrap().len();
    assert_eq!(c.torn_tail, Some(intact_len), "the torn record starts where the intact journal ends");
    assert!(c.problems.is_empty(), "a torn record is not a corrupt one: {:?}", c.problems);
}

#[test]
fn a_corrupt_record_is_named_by_line_offset_and_seq_and_the_others_are_read() {
    let c = read("corrupt");
    assert_eq!(seqs(&c), INTACT.iter().copied().filter(|&s| s != 7).collect::<Vec<_>>());
    match c.problems.as_slice() {
        [Problem::Corrupt { segment: None, line: 5, seq: Some(7), offset, .. }] => {
            let journal = std::fs::read(fixture("corrupt/journal")).unwrap();
            let line_start = journal.split(|&b| b == b'\n').take(4).map(|l| l.len() + 1).sum::<usize>();
            assert_eq!(*offset, line_start as u64);
        }
        other => panic!("expected one corrupt record, seq 7 on line 5: {other:?}"),
    }
}

#[test]
fn a_journal_checked_with_the_legacy_blake3_prefix_reads_as_the_intact_one() {
    let legacy = read("legacy-checksum");
    let intact = read("intact");
    assert!(legacy.problems.is_empty(), "{:?}", legacy.problems);
    assert_eq!(seqs(&legacy), INTACT);
    for (a, b) in legacy.records.iter().zip(&intact.records) {
        assert_eq!(serde_json::to_value(a).unwrap(), serde_json::to_value(b).unwrap());
    }
}

#[test]
fn a_record_of_an_unknown_version_is_named_and_never_read_as_this_version() {
    let c = read("unknown-version");
    assert_eq!(seqs(&c), INTACT.iter().copied().filter(|&s| s != 9).collect::<Vec<_>>());
    match c.problems.as_slice() {
        [Problem::UnknownVersion { seq: Some(9), version: 2, line: 7, .. }] => {}
        other => panic!("expected seq 9 named as version 2: {other:?}"),
    }
}
