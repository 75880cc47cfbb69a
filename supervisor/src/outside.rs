//! Journaling, from outside, a change a program nothing can see into is about to make: a
//! harness's own edit tool (a Bun or static build, in a process the shim is not loaded into
//! and no supervisor watches), announced by the harness's hook before the tool writes. The
//! hook's process journals it as if it were about to make the call itself: its pid and program
//! on the record, the tool's name as the call, and the same capture strategies, capture index,
//! born table and directory times as every other writer of the session.
//!
//! What this module cannot do: know that the write happens as announced, or happens only
//! once. It journals what each path holds when the hook runs; a tool that writes a path its
//! hook did not name is not journaled.

use std::path::Path;

use aether_journal::config::Settings;
use aether_journal_recorder::ops::before_open;

use crate::store::{Recording, Store, Writer};
use crate::target::{Process, Thread, Watched};

/// Journals, in the session at `session`, that this process is about to create or replace
/// each of `paths` (absolute, or relative to this process's working directory) with a call
/// named `call` (a path outside the journaled world, such as `/proc`, needs nothing).
pub fn before_writes(session: &Path, paths: &[Vec<u8>], call: &str) -> std::io::Result<()> {
    let (settings, _) = Settings::from_env();
    let store = Store::open(session, settings, 0)?;
    let process = Process::of(std::process::id())
        .ok_or_else(|| std::io::Error::other("cannot read this process's own /proc entry"))?;
    let mut writer = Writer::default();
    let journal = Recording { store: &store, writer: std::cell::RefCell::new(&mut writer), process: &process };
    let dirs = std::cell::RefCell::new(crate::dirs::Dirs::default());
    let changes = crate::dirs::Changes::default();
    let thread = Thread { tid: process.pid };
    let caller = Watched { thread, process: &process, dirs: &dirs, changes: &changes, nr: libc::SYS_openat };
    for p in paths {
        let _ = before_open(&journal, &caller, call, libc::AT_FDCWD, p, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC);
    }
    Ok(())
}
