//! Marks: named points in a session, such as the start of each turn of an agent harness.
//! `undo --to NAME` reverses every record after a mark, `review --since NAME` shows the net
//! effect of what came after it.
//!
//! A mark is a record ([`Op::Mark`]) with an id from the session's shared counter, so it sits
//! between the records made before it and those made after it. Marks are appended, one line
//! each, to their own segment, `segments/marks` ([`MARKS_SEGMENT`]), which holds nothing else:
//! listing the marks of a session reads only that file, however long its journal.
//!
//! What this module cannot do: write a mark. Taking an id needs the counters mapped shared
//! (`aether_journal_recorder::marks` does it, from outside the session or through the shim
//! loaded into a process of it). A call that took its id before a mark was written but runs
//! after it is still before the mark: marks are exact between turns, when the session is idle.

use std::io;
use std::path::PathBuf;

use serde::Serialize;

use crate::journal::{JournalContents, parse_segment_into};
use crate::record::Op;
use crate::session::{SEGMENTS_DIR, Session, SessionError};

/// The segment (under `segments/`) that holds a session's marks.
pub const MARKS_SEGMENT: &str = "marks";

/// The prefix of the names [`default_name`] gives.
pub const DEFAULT_PREFIX: &str = "turn-";

/// One mark of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// Its record's id: every record after it has a greater one.
    pub seq: u64,
    /// Its name, unique in the session.
    pub name: String,
    /// Its label, if any.
    pub label: Option<String>,
    /// The caller's key, if any.
    pub key: Option<String>,
    /// When it was made (RFC 3339).
    pub time: String,
    /// The process that made it.
    pub pid: u32,
    /// Files a process of the session held open for writing then ([`Op::Mark`]'s `held`).
    pub held: Vec<crate::BPath>,
}

/// Waits (a clock tick at most: 1 to 4 ms) until the coarse realtime clock, which the kernel
/// stamps files' change times with, is past `since_ns`, the time of a mark or an undo just
/// made: from then on a change by anyone has a change time after it, and every change made
/// before it one at or before it. The end-of-turn check of undo relies on this.
pub fn wait_for_clock_tick(since_ns: i64) {
    for _ in 0..1000 {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
        if t.tv_sec.saturating_mul(1_000_000_000).saturating_add(t.tv_nsec) > since_ns {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(250));
    }
}

/// The marks among a journal's records, oldest first.
pub fn marks_of(journal: &JournalContents) -> Vec<Mark> {
    journal
        .records
        .iter()
        .filter_map(|r| match &r.op {
            Op::Mark(m) => Some(Mark {
                seq: r.seq,
                name: m.name.clone(),
                label: m.label.clone(),
                key: m.key.clone(),
                time: r.time.to_string(),
                pid: r.pid,
                held: m.held.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The name the next mark gets when none is asked for: `turn-N`, one past the highest `N`
/// any mark of the session has.
pub fn default_name(marks: &[Mark]) -> String {
    let highest =
        marks.iter().filter_map(|m| m.name.strip_prefix(DEFAULT_PREFIX)?.parse::<u64>().ok()).max().unwrap_or(0);
    format!("{DEFAULT_PREFIX}{}", highest + 1)
}

/// Whether `name` can name a mark: not empty, at most 200 bytes, no control characters, and
/// not all digits (a record id is written that way).
pub fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 200 {
        return Err(format!("a mark's name must be 1 to 200 bytes long, not {}", name.len()));
    }
    if name.chars().any(char::is_control) {
        return Err("a mark's name cannot hold control characters".into());
    }
    if name.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{name:?} is all digits, which reads as a record id: give the mark a name"));
    }
    Ok(())
}

impl Session {
    /// Path of the marks segment.
    pub fn marks_path(&self) -> PathBuf {
        self.dir().join(SEGMENTS_DIR).join(MARKS_SEGMENT)
    }

    /// The session's marks, oldest first, read from the marks segment alone.
    pub fn marks(&self) -> Result<Vec<Mark>, SessionError> {
        let path = self.marks_path();
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(SessionError::Io { path, source }),
        };
        let mut contents = JournalContents::default();
        parse_segment_into(MARKS_SEGMENT, &data, &mut contents);
        contents.records.sort_unstable_by(crate::record::Record::journal_order);
        Ok(marks_of(&contents))
    }

    /// The mark called `name`.
    pub fn mark_named(&self, name: &str) -> Result<Mark, SessionError> {
        let marks = self.marks()?;
        marks.iter().find(|m| m.name == name).cloned().ok_or_else(|| SessionError::NoSuchMark {
            name: name.to_string(),
            known: marks.into_iter().map(|m| m.name).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(name: &str) -> Mark {
        Mark { seq: 1, name: name.into(), label: None, key: None, time: String::new(), pid: 1, held: Vec::new() }
    }

    #[test]
    fn the_default_name_is_one_past_the_highest_turn() {
        assert_eq!(default_name(&[]), "turn-1");
        assert_eq!(default_name(&[mark("turn-1"), mark("setup"), mark("turn-7"), mark("turn-x")]), "turn-8");
    }

    #[test]
    fn a_name_that_reads_as_a_record_id_or_holds_control_characters_is_refused() {
        assert!(valid_name("turn-1").is_ok());
        assert!(valid_name("42").is_err());
        assert!(valid_name("").is_err());
        assert!(valid_name("a\u{1b}[31m").is_err());
        assert!(valid_name(&"x".repeat(201)).is_err());
    }
}
