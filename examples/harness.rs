//! How an agent harness drives aether-journal as a library: find the session an agent run left,
//! read what it did, review it, and decide: undo it (here: a dry run first, then for real) or
//! keep it.
//!
//! Run it after any session, e.g.:
//!
//! ```sh
//! cargo build --release
//! target/release/aether-journal run -- sh -c 'echo hi > /tmp/aj-example; rm -f /tmp/aj-gone'
//! cargo run --example harness             # most recent session: dry run only
//! cargo run --example harness -- --undo   # and undo it
//! ```

use aether_journal::record::Op;
use aether_journal::review::review;
use aether_journal::session::{Session, latest_session, list_sessions, sessions_root};
use aether_journal::undo::{UndoOptions, undo_session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = sessions_root().ok_or("HOME is not set")?;

    // Every session, newest first.
    for s in list_sessions(&root).into_iter().flatten().take(5) {
        let info = s.info();
        println!("{} {:<7} {} records, {} irreversible", info.id, info.state.name(), info.records, info.irreversible);
    }

    // The most recent one (or one the harness kept the directory of: Session::open(dir)).
    let session: Session = match std::env::args().nth(2) {
        Some(dir) => Session::open(dir.as_ref())?,
        None => latest_session(&root)?,
    };

    // What it did, record by record.
    let journal = session.read_journal()?;
    for r in &journal.records {
        let what = match &r.op {
            Op::Change { path, .. } | Op::Meta { path, .. } => path.display_lossy(),
            Op::Rename(m) => format!("{} -> {}", m.from.display_lossy(), m.to.display_lossy()),
            Op::Exec(e) => e.argv.iter().map(String::from_utf8_lossy).collect::<Vec<_>>().join(" "),
            other => format!("{other:?}"),
        };
        println!("#{} {} {}: {what}", r.seq, r.prog().display_lossy(), r.call());
    }

    // The summary a person (or a model) decides on.
    let rv = review(&journal, &session.blobs_dir(), &[], || {});
    println!("{}", serde_json::to_string_pretty(&rv.stat())?);

    // Plan the undo without touching anything; the report says whether it would be complete.
    let plan = undo_session(&session, &UndoOptions { dry_run: true, ..Default::default() })?;
    println!("an undo would be {}", if plan.complete { "complete" } else { "INCOMPLETE" });
    for o in plan.outcomes.iter().filter(|o| !o.outcome.is_success()) {
        println!("  {} {:?}: {}", o.outcome.name(), o.path, o.why);
    }

    if std::env::args().any(|a| a == "--undo") {
        let report = undo_session(&session, &UndoOptions::default())?;
        println!("{}", report.to_json());
        std::process::exit(if report.complete { 0 } else { 3 });
    }
    Ok(())
}
