//! aether-journal's core library: the journal format, the session store, the reader, and the
//! undo planner and executor. No hooks live here: the LD_PRELOAD shim (`shim/`) calls into
//! [`capture`] and [`journal`] to record, and the CLI (`cli/`) calls [`undo`] to rewind.
//!
//! A session is a directory (see [`session`]) holding a header, an append-only journal of
//! [`record::Record`]s and the captured prior contents of every path the session's processes
//! changed. Undo replays the records newest first and reports, step by step, what it restored,
//! removed or recreated, and what it could not ([`undo::Report`]).
//!
//! What this library cannot do: reverse an effect that no snapshot can capture (a network
//! request, a program the shim could not see into). Those are recorded as irreversible, and an
//! undo that meets one never reports itself complete.
//!
//! ```no_run
//! use aether_journal::session::{Session, latest_session, sessions_root};
//! use aether_journal::undo::{UndoOptions, undo_session};
//!
//! let root = sessions_root().expect("HOME is set");
//! let session = latest_session(&root)?;
//! for rec in session.read_journal()?.records {
//!     println!("{} {} {:?}", rec.seq, rec.call(), rec.op.primary_path());
//! }
//! let report = undo_session(&session, &UndoOptions { dry_run: true, ..Default::default() })?;
//! println!("an undo would be {}", if report.complete { "complete" } else { "incomplete" });
//! # Ok::<(), aether_journal::session::SessionError>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bpath;
pub mod byteset;
pub mod capture;
pub mod config;
pub mod digest;
pub mod exec_check;
pub mod exit_codes;
pub mod internal;
pub mod journal;
pub mod marks;
pub mod pack;
pub mod record;
pub mod resolve;
pub mod review;
pub mod seal;
pub mod select;
pub mod session;
pub mod undo;
pub mod witness;

pub use bpath::BPath;
pub use record::{Before, Op, Reason, Record};
