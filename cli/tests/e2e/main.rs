//! The end-to-end tests: real tools run under `aether-journal run` and under a bare
//! `LD_PRELOAD` of the shim, with whole-tree manifests taken before the session and after
//! `aether-journal undo`. One test binary, one module per behaviour.
//!
//! What these tests cannot do: run without the real tools they use (`.ci/run` installs them;
//! a missing tool fails the test that needs it, loudly), or the root-only ones without root
//! (they are `#[ignore = "needs root"]`, and CI runs them with `--include-ignored`).

#[macro_use]
mod common;

mod capture_strategies;
mod effects;
mod fidelity;
mod foundation;
mod reliability;
mod review;
mod supervisor;
mod turns;
