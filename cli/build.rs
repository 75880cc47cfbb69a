//! Embeds the shim in the CLI, so that `cargo install aether-journal-cli` gives a tool that
//! works with nothing else installed (`run` writes the library out once under the data
//! directory and checks its hash before every use).
//!
//! For a release build outside the workspace's own `target/` (what `cargo install` makes, in
//! a directory of its own), or when `AETHER_JOURNAL_EMBED_SHIM=1`, this builds the shim
//! package with the same profile into a target directory of its own under `OUT_DIR` (a second
//! cargo: the one running this script holds its own target directory) and copies the library
//! to `OUT_DIR/libaether_journal.so`, which the CLI includes. Otherwise, or with
//! `AETHER_JOURNAL_EMBED_SHIM=0`, that file is empty, and `run` finds the shim next to its
//! executable, where the workspace's own builds put it (they are not slowed by a second build
//! of the shim).
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=AETHER_JOURNAL_EMBED_SHIM");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("libaether_journal.so");
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().expect("the CLI is a workspace member").to_path_buf();
    let embed = match std::env::var("AETHER_JOURNAL_EMBED_SHIM").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => profile == "release" && !out.starts_with(workspace.join("target")),
    };
    if !embed || !workspace.join("shim/Cargo.toml").exists() {
        if embed {
            println!("cargo:warning=the shim's sources are not beside the CLI: it is not embedded");
        }
        std::fs::write(&dest, b"").expect("write OUT_DIR/libaether_journal.so");
        return;
    }
    for dir in ["shim/src", "shim/build.rs", "shim/Cargo.toml", "src", "recorder/src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    let (cargo_profile, dir) = if profile == "release" { ("release", "release") } else { ("dev", "debug") };
    let target = out.join("shim-target");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--quiet", "--locked", "-p", "aether-journal-shim", "--profile", cargo_profile])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo to build the shim");
    assert!(status.success(), "building the shim to embed it failed");
    std::fs::copy(target.join(dir).join("libaether_journal.so"), &dest).expect("copy the shim into OUT_DIR");
}
