//! Builds the C half of the variadic exec hooks (see src/variadic.c).
fn main() {
    println!("cargo:rerun-if-changed=src/variadic.c");
    cc::Build::new().file("src/variadic.c").warnings(true).compile("aether_journal_variadic");
}
