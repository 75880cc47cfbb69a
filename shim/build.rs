//! Builds the C half of the variadic exec hooks (see src/variadic.c), links the unwinder
//! statically, and lays out what starting touches (startup.ld).
//!
//! Rust's standard library asks for `-lgcc_s` (the unwinder that makes `catch_unwind` work).
//! Loading that extra shared library into every process the shim enters costs more than the
//! rest of the shim's start-up (measured: about 120 us per exec on the development machine).
//! The unwinder also exists as a PIC archive, `libgcc_eh.a`; copied into this build's link
//! directory under the name `libgcc_s.a`, it is found first and linked in, so the shim needs
//! only libc at run time. Its symbols stay private: the cdylib's version script exports only
//! the hooks. If the compiler has no `libgcc_eh.a`, the shim links `libgcc_s.so` as before.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/variadic.c");
    // What starting touches, on as few pages as possible (see the script's comment).
    let script = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("startup.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rustc-link-arg-cdylib=-Wl,-T,{}", script.display());
    let build = cc::Build::new();
    let compiler = build.get_compiler();
    build.clone().file("src/variadic.c").warnings(true).compile("aether_journal_variadic");

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let eh = Command::new(compiler.path())
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_absolute() && p.exists());
    match eh {
        Some(eh) => {
            std::fs::copy(&eh, out.join("libgcc_s.a")).expect("copy libgcc_eh.a into OUT_DIR");
            println!("cargo:rustc-link-search=native={}", out.display());
        }
        None => println!("cargo:warning=libgcc_eh.a not found: the shim will load libgcc_s.so at run time"),
    }
}
