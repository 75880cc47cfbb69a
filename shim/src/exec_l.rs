//! `execl`, `execlp` and `execle`: C-variadic, so their bodies are C (`variadic.c`) and what the
//! shim exports are naked trampolines that jump there with every register and stack slot
//! untouched, exactly as the caller set them up.
//!
//! What this module cannot do: run on architectures other than x86-64 and AArch64 (the jump
//! is written for each).

unsafe extern "C" {
    fn aether_journal_execl();
    fn aether_journal_execlp();
    fn aether_journal_execle();
}

macro_rules! trampoline {
    ($name:ident => $target:ident) => {
        /// Exported variadic exec: jumps to its C implementation.
        #[cfg(not(test))]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name() {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("jmp {}", sym $target);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("b {}", sym $target);
        }
    };
}

trampoline!(execl => aether_journal_execl);
trampoline!(execlp => aether_journal_execlp);
trampoline!(execle => aether_journal_execle);
