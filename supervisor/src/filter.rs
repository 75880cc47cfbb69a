//! The seccomp filter: which system calls the kernel sends to the supervisor.
//!
//! A classic BPF program sees only a call's number, architecture and argument registers,
//! never memory. It sends to the supervisor the calls that can change a file, run a program,
//! reach another endpoint or signal another process, and nothing else: reads, writes, stats
//! and read-only opens never leave the kernel, and a number the filter does not watch is
//! decided without looking at any argument, so the kernel's per-number cache allows it
//! without running the program at all.
//!
//! A watched call carrying the session's marker in its sixth argument register is allowed:
//! the shim makes the calls it has journaled that way (see the shim's `kernel.rs`). `sendto`
//! uses all six registers, so it is never marked; it is watched only with a destination.
//! `io_uring_setup`, `chroot`, `pivot_root` and `setns` are always sent. `chdir` and `fchdir`
//! change nothing, but the supervisor must know of every working directory changed to trust
//! what it remembers of one: one the shim made itself, marked, moved the session's
//! working-directory generation before and counted it done after (see `dirs.rs`); any other is sent. An exec
//! the shim made itself is marked (it journaled it); any other (a static program's,
//! posix_spawn's child's) is sent.
//!
//! What this filter cannot do: look at `openat2`'s flags (they are in memory: it is always
//! sent), or watch a foreign architecture (32-bit x86, x32): such a process is allowed
//! everything, and its exec was journaled as unobserved by the process that started it.

use libc::{SECCOMP_RET_ALLOW, SECCOMP_RET_USER_NOTIF, sock_filter};

/// The architecture this filter watches (`AUDIT_ARCH_X86_64` / `AUDIT_ARCH_AARCH64`).
#[cfg(target_arch = "x86_64")]
pub const NATIVE_ARCH: u32 = 0xC000_003E;
/// The architecture this filter watches (`AUDIT_ARCH_X86_64` / `AUDIT_ARCH_AARCH64`).
#[cfg(target_arch = "aarch64")]
pub const NATIVE_ARCH: u32 = 0xC000_00B7;

pub use aether_journal_recorder::ops::{FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS};

/// `setxattrat(2)` and `removexattrat(2)` (Linux 6.13; not yet in the libc crate).
pub const SYS_SETXATTRAT: i64 = 463;
/// See [`SYS_SETXATTRAT`].
pub const SYS_REMOVEXATTRAT: i64 = 466;

/// How the filter decides a watched call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// Sent unless it carries the marker.
    Unmarked,
    /// Sent always (the supervisor journals it whatever made it).
    Always,
    /// An open whose flags are argument `n`: sent (unless marked) only when they write,
    /// create or truncate.
    OpenFlags(u8),
    /// A signal whose number is argument `n`: sent (unless marked) unless it is 0 (a probe).
    Signal(u8),
    /// `sendto`: sent only with a destination (argument 4).
    SendTo,
    /// `ioctl`: sent (unless marked) only for the requests that change a file's attributes.
    Ioctl,
    /// `unshare` and `clone`, whose flags are argument `n`: sent only with `CLONE_NEWNS`.
    NewMountNamespace(u8),
}

/// Every watched call, with how it is decided.
pub fn watched() -> Vec<(i64, Watch)> {
    use Watch::*;
    let mut w: Vec<(i64, Watch)> = vec![
        // Opens come first: they are the commonest watched calls, and the chain is walked in
        // this order.
        (libc::SYS_openat, OpenFlags(2)),
        (libc::SYS_openat2, Unmarked),
        (libc::SYS_open_by_handle_at, OpenFlags(2)),
        (libc::SYS_truncate, Unmarked),
        (libc::SYS_ftruncate, Unmarked),
        (libc::SYS_fallocate, Unmarked),
        (libc::SYS_renameat2, Unmarked),
        (libc::SYS_unlinkat, Unmarked),
        (libc::SYS_mkdirat, Unmarked),
        (libc::SYS_linkat, Unmarked),
        (libc::SYS_symlinkat, Unmarked),
        (libc::SYS_mknodat, Unmarked),
        (libc::SYS_fchmod, Unmarked),
        (libc::SYS_fchmodat, Unmarked),
        (libc::SYS_fchmodat2, Unmarked),
        (libc::SYS_fchown, Unmarked),
        (libc::SYS_fchownat, Unmarked),
        (libc::SYS_utimensat, Unmarked),
        (libc::SYS_setxattr, Unmarked),
        (libc::SYS_lsetxattr, Unmarked),
        (libc::SYS_fsetxattr, Unmarked),
        (libc::SYS_removexattr, Unmarked),
        (libc::SYS_lremovexattr, Unmarked),
        (libc::SYS_fremovexattr, Unmarked),
        (SYS_SETXATTRAT, Unmarked),
        (SYS_REMOVEXATTRAT, Unmarked),
        (libc::SYS_bind, Unmarked),
        (libc::SYS_ioctl, Ioctl),
        (libc::SYS_connect, Unmarked),
        (libc::SYS_sendto, SendTo),
        (libc::SYS_sendmsg, Unmarked),
        (libc::SYS_sendmmsg, Unmarked),
        (libc::SYS_kill, Signal(1)),
        (libc::SYS_tkill, Signal(1)),
        (libc::SYS_tgkill, Signal(2)),
        (libc::SYS_rt_sigqueueinfo, Signal(1)),
        (libc::SYS_rt_tgsigqueueinfo, Signal(2)),
        (libc::SYS_pidfd_send_signal, Signal(1)),
        (libc::SYS_execve, Unmarked),
        (libc::SYS_execveat, Unmarked),
        (libc::SYS_io_uring_setup, Always),
        // No change, but where relative names lead from now on: the supervisor trusts what it
        // remembers of a working directory only while none changed (see `dirs.rs`; the shim
        // moves the session's working-directory generation around the ones it marks).
        (libc::SYS_chdir, Unmarked),
        (libc::SYS_fchdir, Unmarked),
        (libc::SYS_chroot, Always),
        (libc::SYS_pivot_root, Always),
        (libc::SYS_setns, Always),
        (libc::SYS_unshare, NewMountNamespace(0)),
        (libc::SYS_clone, NewMountNamespace(0)),
    ];
    #[cfg(target_arch = "x86_64")]
    w.extend([
        (libc::SYS_open, OpenFlags(1)),
        (libc::SYS_creat, Unmarked),
        (libc::SYS_rename, Unmarked),
        (libc::SYS_renameat, Unmarked),
        (libc::SYS_unlink, Unmarked),
        (libc::SYS_rmdir, Unmarked),
        (libc::SYS_mkdir, Unmarked),
        (libc::SYS_link, Unmarked),
        (libc::SYS_symlink, Unmarked),
        (libc::SYS_mknod, Unmarked),
        (libc::SYS_chmod, Unmarked),
        (libc::SYS_chown, Unmarked),
        (libc::SYS_lchown, Unmarked),
        (libc::SYS_utime, Unmarked),
        (libc::SYS_utimes, Unmarked),
        (libc::SYS_futimesat, Unmarked),
    ]);
    w
}

// Offsets into `struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }`.
const NR: u32 = 0;
const ARCH: u32 = 4;
fn arg_lo(n: u8) -> u32 {
    16 + 8 * n as u32
}
fn arg_hi(n: u8) -> u32 {
    arg_lo(n) + 4
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// A jump target while the program is assembled.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum L {
    /// The next instruction.
    Next,
    Allow,
    Notify,
    /// The marker check.
    Marked,
    /// The first instruction of block `i`.
    Block(usize),
}

/// One instruction with symbolic targets.
enum Op {
    Load(u32),
    /// Conditional jump (JEQ, JGE or JSET) on `k`.
    Jump(u16, u32, L, L),
    /// Unconditional jump.
    Always(L),
    Ret(u32),
}

/// The filter for a session whose marker is `mark`.
pub fn program(mark: u64) -> Vec<sock_filter> {
    let watched = watched();
    let mut ops: Vec<Op> = vec![Op::Load(ARCH), Op::Jump(JEQ_K, NATIVE_ARCH, L::Next, L::Allow), Op::Load(NR)];
    #[cfg(target_arch = "x86_64")]
    ops.push(Op::Jump(JGE_K, 0x4000_0000, L::Allow, L::Next)); // x32: a foreign ABI
    for (i, (nr, _)) in watched.iter().enumerate() {
        ops.push(Op::Jump(JEQ_K, *nr as u32, L::Block(i), L::Next));
    }
    ops.push(Op::Ret(SECCOMP_RET_ALLOW));
    // Where each label lands, filled in as the blocks are laid out.
    let mut at_block = Vec::with_capacity(watched.len());
    for (_, watch) in &watched {
        at_block.push(ops.len());
        block(&mut ops, *watch);
    }
    let at_marked = ops.len();
    ops.extend([
        Op::Load(arg_lo(5)),
        Op::Jump(JEQ_K, mark as u32, L::Next, L::Notify),
        Op::Load(arg_hi(5)),
        Op::Jump(JEQ_K, (mark >> 32) as u32, L::Allow, L::Notify),
    ]);
    let at_allow = ops.len();
    ops.push(Op::Ret(SECCOMP_RET_ALLOW));
    let at_notify = ops.len();
    ops.push(Op::Ret(SECCOMP_RET_USER_NOTIF));
    let target = |l: L, here: usize| -> usize {
        match l {
            L::Next => here + 1,
            L::Allow => at_allow,
            L::Notify => at_notify,
            L::Marked => at_marked,
            L::Block(i) => at_block[i],
        }
    };
    // Conditional jumps reach at most 255 instructions ahead: one that would go further
    // jumps to an unconditional jump placed right after it instead. The chain's jumps to the
    // blocks are far, so each chain entry becomes `jeq nr, 0, 1; ja block`.
    let mut out: Vec<sock_filter> = Vec::new();
    let mut fixups: Vec<(usize, usize)> = Vec::new(); // (index in out of a JA, op index it targets)
    let mut out_index_of_op = vec![0usize; ops.len() + 1];
    for (i, op) in ops.iter().enumerate() {
        out_index_of_op[i] = out.len();
        match *op {
            Op::Load(off) => out.push(ins(LD_W_ABS, 0, 0, off)),
            Op::Ret(k) => out.push(ins(RET_K, 0, 0, k)),
            Op::Always(l) => {
                fixups.push((out.len(), target(l, i)));
                out.push(ins(JA, 0, 0, 0));
            }
            Op::Jump(code, k, t, f) => {
                // Each far branch gets a JA right after the jump.
                let (tt, ft) = (target(t, i), target(f, i));
                let far_t = t != L::Next;
                let far_f = f != L::Next;
                match (far_t, far_f) {
                    (false, false) => out.push(ins(code, 0, 0, k)),
                    (true, false) => {
                        out.push(ins(code, 0, 1, k));
                        fixups.push((out.len(), tt));
                        out.push(ins(JA, 0, 0, 0));
                    }
                    (false, true) => {
                        out.push(ins(code, 1, 0, k));
                        fixups.push((out.len(), ft));
                        out.push(ins(JA, 0, 0, 0));
                    }
                    (true, true) => {
                        out.push(ins(code, 0, 1, k));
                        fixups.push((out.len(), tt));
                        out.push(ins(JA, 0, 0, 0));
                        fixups.push((out.len(), ft));
                        out.push(ins(JA, 0, 0, 0));
                    }
                }
            }
        }
    }
    out_index_of_op[ops.len()] = out.len();
    for (at, op_target) in fixups {
        let to = out_index_of_op[op_target];
        out[at].k = (to - at - 1) as u32;
    }
    out
}

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The instructions of one watched call's block.
fn block(ops: &mut Vec<Op>, watch: Watch) {
    match watch {
        Watch::Unmarked => ops.push(Op::Always(L::Marked)),
        Watch::Always => ops.push(Op::Ret(SECCOMP_RET_USER_NOTIF)),
        Watch::OpenFlags(n) => {
            let writes = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u32;
            ops.extend([
                Op::Load(arg_lo(n)),
                Op::Jump(JSET_K, libc::O_PATH as u32, L::Allow, L::Next),
                Op::Jump(JSET_K, writes, L::Marked, L::Allow),
            ]);
        }
        Watch::Signal(n) => ops.extend([Op::Load(arg_lo(n)), Op::Jump(JEQ_K, 0, L::Allow, L::Marked)]),
        Watch::SendTo => ops.extend([
            Op::Load(arg_lo(4)),
            Op::Jump(JEQ_K, 0, L::Next, L::Notify),
            Op::Load(arg_hi(4)),
            Op::Jump(JEQ_K, 0, L::Allow, L::Notify),
        ]),
        Watch::Ioctl => ops.extend([
            Op::Load(arg_lo(1)),
            Op::Jump(JEQ_K, FS_IOC_SETFLAGS, L::Marked, L::Next),
            Op::Jump(JEQ_K, FS_IOC32_SETFLAGS, L::Marked, L::Next),
            Op::Jump(JEQ_K, FS_IOC_FSSETXATTR, L::Marked, L::Allow),
        ]),
        Watch::NewMountNamespace(n) => {
            ops.extend([Op::Load(arg_lo(n)), Op::Jump(JSET_K, libc::CLONE_NEWNS as u32, L::Notify, L::Allow)])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions [`program`] uses, over a
    /// `seccomp_data` laid out as the kernel lays it out.
    fn run(prog: &[sock_filter], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as i32).to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        for _ in 0..10_000 {
            let i = prog[pc];
            match i.code {
                LD_W_ABS => {
                    let o = i.k as usize;
                    acc = u32::from_ne_bytes(data[o..o + 4].try_into().unwrap());
                    pc += 1;
                }
                RET_K => return i.k,
                JA => pc += 1 + i.k as usize,
                c => {
                    let taken = match c {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        JSET_K => acc & i.k != 0,
                        _ => panic!("unexpected instruction {c:#x}"),
                    };
                    pc += 1 + if taken { i.jt } else { i.jf } as usize;
                }
            }
        }
        panic!("the program does not end");
    }

    const MARK: u64 = 0x1234_5678_9abc_def1;

    fn verdict(nr: i64, args: [u64; 6]) -> &'static str {
        match run(&program(MARK), nr, NATIVE_ARCH, args) {
            SECCOMP_RET_ALLOW => "allow",
            SECCOMP_RET_USER_NOTIF => "notify",
            other => panic!("unexpected action {other:#x}"),
        }
    }

    #[test]
    fn only_opens_that_write_create_or_truncate_reach_the_supervisor() {
        let at = |flags: i32| verdict(libc::SYS_openat, [libc::AT_FDCWD as u64, 0x1000, flags as u64, 0o644, 0, 0]);
        assert_eq!(at(libc::O_RDONLY | libc::O_CLOEXEC), "allow");
        assert_eq!(at(libc::O_RDONLY | libc::O_DIRECTORY), "allow");
        assert_eq!(at(libc::O_PATH | libc::O_WRONLY), "allow");
        assert_eq!(at(libc::O_WRONLY), "notify");
        assert_eq!(at(libc::O_RDWR | libc::O_CREAT), "notify");
        assert_eq!(at(libc::O_RDONLY | libc::O_TRUNC), "notify");
        assert_eq!(at(libc::O_TMPFILE | libc::O_RDWR), "notify");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(verdict(libc::SYS_open, [0x1000, libc::O_WRONLY as u64, 0, 0, 0, 0]), "notify");
    }

    #[test]
    fn a_watched_call_carrying_the_marker_is_allowed_and_no_other_value_is() {
        let unlink = |a5: u64| verdict(libc::SYS_unlinkat, [libc::AT_FDCWD as u64, 0x1000, 0, 0, 0, a5]);
        assert_eq!(unlink(MARK), "allow");
        assert_eq!(unlink(0), "notify");
        assert_eq!(unlink(MARK ^ 1), "notify", "low word differs");
        assert_eq!(unlink(MARK ^ (1 << 40)), "notify", "high word differs");
        let open = verdict(libc::SYS_openat, [0, 0x1000, libc::O_WRONLY as u64, 0, 0, MARK]);
        assert_eq!(open, "allow");
    }

    #[test]
    fn io_uring_always_reaches_the_supervisor_and_execs_and_working_directory_changes_unless_marked() {
        assert_eq!(verdict(libc::SYS_io_uring_setup, [0, 0, 0, 0, 0, MARK]), "notify");
        for nr in [libc::SYS_chdir, libc::SYS_fchdir] {
            assert_eq!(verdict(nr, [0, 0, 0, 0, 0, 0]), "notify", "{nr}");
            assert_eq!(verdict(nr, [0, 0, 0, 0, 0, MARK]), "allow", "{nr}: the shim told the session");
        }
        for nr in [libc::SYS_execve, libc::SYS_execveat] {
            assert_eq!(verdict(nr, [0, 0, 0, 0, 0, 0]), "notify", "{nr}");
            assert_eq!(verdict(nr, [0, 0, 0, 0, 0, MARK]), "allow", "{nr}: the shim journaled it");
        }
    }

    #[test]
    fn only_the_calls_that_make_a_root_or_mount_namespace_of_their_own_reach_the_supervisor() {
        let newns = libc::CLONE_NEWNS as u64;
        let fork_flags = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        assert_eq!(verdict(libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]), "allow", "a fork");
        assert_eq!(verdict(libc::SYS_clone, [fork_flags | newns, 0, 0, 0, 0, 0]), "notify");
        assert_eq!(verdict(libc::SYS_unshare, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]), "allow");
        assert_eq!(verdict(libc::SYS_unshare, [newns | libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]), "notify");
        for nr in [libc::SYS_setns, libc::SYS_chroot, libc::SYS_pivot_root] {
            assert_eq!(verdict(nr, [0, 0, 0, 0, 0, MARK]), "notify", "{nr}");
        }
    }

    #[test]
    fn unwatched_calls_and_foreign_architectures_are_allowed() {
        for nr in
            [libc::SYS_read, libc::SYS_write, libc::SYS_close, libc::SYS_newfstatat, libc::SYS_futex, libc::SYS_getpid]
        {
            assert_eq!(verdict(nr, [0; 6]), "allow", "{nr}");
        }
        assert_eq!(run(&program(MARK), libc::SYS_unlinkat, 0x4000_0003, [0; 6]), SECCOMP_RET_ALLOW, "i386");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(verdict(0x4000_0000 + 87, [0; 6]), "allow", "x32");
    }

    #[test]
    fn sendto_reaches_the_supervisor_only_with_a_destination_and_signal_probes_never() {
        assert_eq!(verdict(libc::SYS_sendto, [3, 0x1000, 10, 0, 0, 0]), "allow");
        assert_eq!(verdict(libc::SYS_sendto, [3, 0x1000, 10, 0, 0x2000, 16]), "notify");
        assert_eq!(verdict(libc::SYS_sendto, [3, 0x1000, 10, 0, 1 << 33, MARK]), "notify", "never marked");
        assert_eq!(verdict(libc::SYS_kill, [42, 0, 0, 0, 0, 0]), "allow");
        assert_eq!(verdict(libc::SYS_kill, [42, 15, 0, 0, 0, 0]), "notify");
        assert_eq!(verdict(libc::SYS_tgkill, [42, 43, 0, 0, 0, 0]), "allow");
        assert_eq!(verdict(libc::SYS_tgkill, [42, 43, 23, 0, 0, 0]), "notify");
    }

    #[test]
    fn only_the_ioctl_requests_that_change_attributes_reach_the_supervisor() {
        assert_eq!(verdict(libc::SYS_ioctl, [3, libc::TCGETS, 0, 0, 0, 0]), "allow");
        assert_eq!(verdict(libc::SYS_ioctl, [3, 0x4004_9409, 4, 0, 0, 0]), "allow", "FICLONE");
        assert_eq!(verdict(libc::SYS_ioctl, [3, FS_IOC_SETFLAGS as u64, 0x1000, 0, 0, 0]), "notify");
        assert_eq!(verdict(libc::SYS_ioctl, [3, FS_IOC_FSSETXATTR as u64, 0x1000, 0, 0, 0]), "notify");
        assert_eq!(verdict(libc::SYS_ioctl, [3, FS_IOC_SETFLAGS as u64, 0x1000, 0, 0, MARK]), "allow");
    }

    #[test]
    fn every_watched_call_reaches_the_supervisor_unmarked() {
        for (nr, watch) in watched() {
            let args = match watch {
                Watch::OpenFlags(n) => {
                    let mut a = [0u64; 6];
                    a[n as usize] = libc::O_WRONLY as u64;
                    a
                }
                Watch::Signal(n) => {
                    let mut a = [0u64; 6];
                    a[n as usize] = 15;
                    a
                }
                Watch::SendTo => [0, 0, 0, 0, 0x1000, 0],
                Watch::Ioctl => [0, FS_IOC_SETFLAGS as u64, 0, 0, 0, 0],
                Watch::NewMountNamespace(n) => {
                    let mut a = [0u64; 6];
                    a[n as usize] = libc::CLONE_NEWNS as u64;
                    a
                }
                Watch::Unmarked | Watch::Always => [0; 6],
            };
            assert_eq!(verdict(nr, args), "notify", "{nr} {watch:?}");
        }
    }

    #[test]
    fn no_conditional_jump_goes_past_the_end() {
        let p = program(MARK);
        assert!(p.len() < 4096, "BPF_MAXINSNS");
        for (i, ins) in p.iter().enumerate() {
            if ins.code == JA {
                assert!(i + 1 + (ins.k as usize) < p.len());
            } else if matches!(ins.code, JEQ_K | JGE_K | JSET_K) {
                assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < p.len());
            }
        }
    }
}
