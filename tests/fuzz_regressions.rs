//! Replays every input in tests/fuzz_corpus/ (hostile shapes, and any crash `fuzz/run.sh` ever
//! found) through the journal reader: none may panic, and each must read the same way twice.

use aether_journal::journal::parse_journal;

#[test]
fn every_fuzz_corpus_input_is_read_without_panicking() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("corpus directory") {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        let a = parse_journal(&data);
        let b = parse_journal(&data);
        assert_eq!(a.records, b.records, "{}", p.display());
        assert_eq!(a.problems, b.problems, "{}", p.display());
        for problem in &a.problems {
            assert!(!problem.describe().is_empty());
        }
        n += 1;
    }
    assert!(n >= 10, "the corpus is there");
}

#[test]
fn a_torn_tail_and_nesting_bombs_are_classified_not_crashed_on() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus");
    let torn = parse_journal(&std::fs::read(dir.join("torn-tail")).unwrap());
    assert_eq!(torn.torn_tail, Some(0));
    let deep = parse_journal(&std::fs::read(dir.join("deep-nesting")).unwrap());
    assert_eq!(deep.problems.len(), 1);
}

#[test]
fn a_nesting_bomb_with_a_valid_check_is_a_problem_not_a_stack_overflow() {
    let json = [b"{\"v\":1,\"seq\":1,\"x\":".as_slice(), &b"[".repeat(200_000), &b"]".repeat(200_000), b"}"].concat();
    let mut line = aether_journal::journal::check_of(&json).to_vec();
    line.push(b' ');
    line.extend_from_slice(&json);
    line.push(b'\n');
    let j = parse_journal(&line);
    assert!(j.records.is_empty());
    assert_eq!(j.problems.len(), 1);
}
