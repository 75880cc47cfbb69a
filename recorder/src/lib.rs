//! The recording side of an aether-journal session, shared by the two parts that journal:
//! the LD_PRELOAD shim, inside the process that makes a call, and the seccomp supervisor,
//! outside it, for the calls the shim cannot see (Go, static binaries, raw system calls).
//!
//! - [`tables`]: the session's shared `counters` page (ids, bytes kept, lost records, the
//!   names generation, the passes), mapped by every writer.
//! - [`index`]: the shared capture index and the table of born and kept files.
//! - [`ops`]: what each file-changing call journals before it runs, generic over the store
//!   ([`ops::Journal`]) and over how the calling process is seen ([`ops::Caller`]).
//! - [`effects`]: connects, datagrams and signals, which nothing can undo.
//! - [`seqlock`]: the one sequence-lock protocol those tables and the shim's caches share.
//! - [`marks`]: writing a mark, from outside the session or through the shim inside it.
//!
//! What this crate cannot do: make a call, or decide whether one runs. It journals what a call
//! is about to change and says what must happen after it ([`ops::Pending`]); the shim and the
//! supervisor make (or let the kernel make) the call themselves.

#![deny(missing_docs)]

pub mod effects;
pub mod index;
pub mod marks;
pub mod ops;
pub mod seqlock;
pub mod tables;
