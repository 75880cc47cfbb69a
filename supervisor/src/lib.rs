//! The seccomp supervisor: journals the file changes of programs the LD_PRELOAD shim cannot
//! see into (Go, static binaries, raw `syscall` instructions, Bun), so that every process of
//! an `aether-journal run` session is journaled, whatever it is made of.

#![deny(missing_docs)]

pub mod dirs;
pub mod filter;
pub mod handle;
pub mod install;
pub mod launch;
pub mod listener;
pub mod names;
pub mod outside;
pub mod serve;
pub mod store;
pub mod target;
