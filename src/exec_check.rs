//! Deciding, just before an exec, whether the shim will be loaded into the new program.
//!
//! Reads the executable's first 4 KiB (the ELF header and the program headers after it: one
//! `pread`), its mode bits and, for anyone but root, its `security.capability` attribute, and
//! follows `#!` to the interpreter; for a dynamic program also its section headers with the
//! 4 KiB before them, where the section names are (a second `pread`). A program is
//! unobservable when it is statically linked (no `PT_INTERP`), built for another architecture
//! or word size, set-user-ID or set-group-ID to someone else, or carries file capabilities
//! (the loader then runs in secure mode and ignores `LD_PRELOAD`).
//!
//! A dynamically linked program known to make its own system calls is unobservable too: a Go
//! program (its `.go.buildinfo` section; Go never calls libc for file operations, even when it
//! is linked with it) or Bun (its `.bun` section).
//!
//! What this module cannot do: predict every way a program can escape (a dynamically linked
//! program that calls `syscall` instructions itself, or clears its own environment before
//! exec'ing a helper); those are covered elsewhere or listed in the README.

use std::io;

use rustix::fs::{CWD, Mode, OFlags};
use rustix::io::Errno;

use crate::record::UnobservedReason;

const PT_INTERP: u32 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// The ELF machine of this build.
pub const NATIVE_MACHINE: u16 = if cfg!(target_arch = "aarch64") { EM_AARCH64 } else { EM_X86_64 };

fn machine_name(m: u16) -> String {
    match m {
        3 => "i386".into(),
        8 => "MIPS".into(),
        20 => "PowerPC".into(),
        21 => "PowerPC64".into(),
        40 => "ARM".into(),
        62 => "x86-64".into(),
        183 => "AArch64".into(),
        243 => "RISC-V".into(),
        other => format!("ELF machine {other}"),
    }
}

/// Credentials of the process about to exec: the real ids a set-ID program is compared with,
/// and the uid that says whether file capabilities matter (for anyone but root).
#[derive(Clone, Copy, Debug)]
pub enum Creds {
    /// The calling process's, asked of the kernel only when a check needs them: the gid only
    /// for a set-group-ID program, so that most execs cost one `getuid`, not two calls.
    Current,
    /// These real ids.
    Of {
        /// Real uid.
        uid: u32,
        /// Real gid.
        gid: u32,
    },
}

impl Creds {
    /// The calling process's real ids (asked when needed).
    pub fn current() -> Creds {
        Creds::Current
    }

    /// The real uid.
    pub fn uid(self) -> u32 {
        match self {
            Creds::Current => rustix::process::getuid().as_raw(),
            Creds::Of { uid, .. } => uid,
        }
    }

    /// The real gid.
    pub fn gid(self) -> u32 {
        match self {
            Creds::Current => rustix::process::getgid().as_raw(),
            Creds::Of { gid, .. } => gid,
        }
    }
}

/// Checks the executable at `path` (absolute, or relative to the cwd). `Ok(())` when the shim
/// will be loaded, or when the exec cannot succeed anyway (no such file, not executable, not a
/// format the kernel runs).
pub fn check(path: &[u8], creds: Creds) -> Result<(), UnobservedReason> {
    check_depth(path, creds, 0, &mut None)
}

/// [`check`] for an exec with its arguments: the dynamic loader run as a program (`ld.so
/// PROGRAM`, as `ldd` and uv do) honours `LD_PRELOAD` like any dynamic program, so what
/// counts is the program it is told to run (`argv[0]` is the loader's own name).
pub fn check_exec(path: &[u8], argv: &[&[u8]], creds: Creds) -> Result<(), UnobservedReason> {
    check_exec_vouched(path, argv, creds).0
}

/// [`check_exec`], and what its verdict rests on when that is the file at `path` alone (see
/// [`Vouched`]), for a caller that remembers verdicts.
pub fn check_exec_vouched(
    path: &[u8],
    argv: &[&[u8]],
    creds: Creds,
) -> (Result<(), UnobservedReason>, Option<Vouched>) {
    let mut vouched = None;
    match check_depth(path, creds, 0, &mut vouched) {
        Err(UnobservedReason::StaticExecutable) if is_dynamic_loader(path) => match loader_operand(argv) {
            Some(program) => (check(program, creds), None),
            // Options alone (`--list`, `--help`): it runs no program.
            None => (Ok(()), None),
        },
        other => (other, vouched),
    }
}

/// The file a check found observable, when the verdict rests on that file alone: a
/// dynamically linked ELF program of this machine (not a script, whose verdict is its
/// interpreter's; not the dynamic loader, whose verdict is its operand's), without set-ID
/// bits, and without file capabilities (or checked for root, to whom they do not matter).
///
/// Any change to such a file, of its bytes, mode, owner or attributes, moves its change time,
/// which no call can set back, and another file at the name has another identity: a caller
/// that finds the same `Vouched` for the name later ([`Vouched::now`]) may take the same verdict
/// without reading the file again. Only a file unchanged for [`Vouched::SETTLED`] is vouched
/// for: where times are kept to the second (ext4 with small inodes), a change made within the
/// second the file was last changed would leave its change time as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vouched {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size.
    pub size: u64,
    /// Modification time, `[seconds, nanoseconds]`.
    pub mtime: [i64; 2],
    /// Change time, `[seconds, nanoseconds]`.
    pub ctime: [i64; 2],
    /// The real uid the check was made for.
    pub uid: u32,
}

impl Vouched {
    /// How long a file must have been left unchanged to be vouched for (seconds).
    pub const SETTLED: i64 = 2;

    fn of(st: &rustix::fs::Stat, uid: u32) -> Vouched {
        Vouched {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: [st.st_mtime, st.st_mtime_nsec as i64],
            ctime: [st.st_ctime, st.st_ctime_nsec as i64],
            uid,
        }
    }

    /// The file `path` names now (following symlinks, as exec does), as a check made for
    /// `uid` would find it: one `stat`.
    pub fn now(path: &[u8], uid: u32) -> Option<Vouched> {
        rustix::fs::stat(path).ok().map(|st| Vouched::of(&st, uid))
    }
}

/// The program a command line of the dynamic loader runs: its first operand after the
/// loader's options (`--library-path DIR` and the like take a value).
fn loader_operand<'a>(argv: &[&'a [u8]]) -> Option<&'a [u8]> {
    const WITH_VALUE: [&[u8]; 7] = [
        b"--library-path",
        b"--inhibit-rpath",
        b"--audit",
        b"--preload",
        b"--argv0",
        b"--glibc-hwcaps-prepend",
        b"--glibc-hwcaps-mask",
    ];
    const RUNS_NOTHING: [&[u8]; 6] =
        [b"--list", b"--verify", b"--help", b"--version", b"--list-tunables", b"--list-diagnostics"];
    let mut args = argv.iter().skip(1);
    while let Some(a) = args.next() {
        if RUNS_NOTHING.contains(a) {
            return None;
        }
        if WITH_VALUE.contains(a) {
            args.next();
            continue;
        }
        if *a == b"--" {
            return args.next().copied();
        }
        if !a.starts_with(b"--") {
            return Some(a);
        }
    }
    None
}

/// Whether `path` is the dynamic loader this process was started by (the `PT_INTERP` of its
/// own executable): the same file, by device and inode.
pub fn is_dynamic_loader(path: &[u8]) -> bool {
    let (Some(loader), Ok(st)) = (own_interpreter(), rustix::fs::stat(path)) else { return false };
    rustix::fs::stat(loader.as_slice()).is_ok_and(|l| (l.st_dev, l.st_ino) == (st.st_dev, st.st_ino))
}

/// The `PT_INTERP` path of this process's executable.
fn own_interpreter() -> Option<Vec<u8>> {
    let fd = rustix::fs::open("/proc/self/exe", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let head = read_at(&fd, 64, 0).ok()?;
    if head.len() < 64 || !head.starts_with(b"\x7fELF") || head[4] != 2 {
        return None;
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?);
    let (phentsize, phnum) =
        (u16::from_le_bytes([head[54], head[55]]) as usize, u16::from_le_bytes([head[56], head[57]]) as usize);
    if phentsize < 56 || phnum == 0 || phnum > 512 {
        return None;
    }
    let table = read_at(&fd, phentsize * phnum, phoff).ok()?;
    if table.len() != phentsize * phnum {
        return None;
    }
    let ph = table.chunks_exact(phentsize).find(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP)?;
    let (off, len) = (u64::from_le_bytes(ph[8..16].try_into().ok()?), u64::from_le_bytes(ph[32..40].try_into().ok()?));
    let mut name = read_at(&fd, len.min(4096) as usize, off).ok()?;
    while name.last() == Some(&0) {
        name.pop();
    }
    Some(name)
}

/// Whether the executable at `path` is built for another architecture than this process (a
/// script: its interpreter), from its ELF header alone: what the supervisor, which sees into
/// every program of its own architecture, needs to know of an exec.
pub fn foreign_architecture(path: &[u8]) -> Option<UnobservedReason> {
    let mut path = path.to_vec();
    for _ in 0..4 {
        let fd = rustix::fs::openat(CWD, &path[..], OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK, Mode::empty())
            .ok()?;
        let head = read_at(&fd, 256, 0).unwrap_or_default();
        if head.starts_with(b"#!") {
            let line = head[2..].split(|&b| b == b'\n').next().unwrap_or(&[]);
            path = line.split(|&b| b == b' ' || b == b'\t').find(|t| !t.is_empty())?.to_vec();
            continue;
        }
        if !head.starts_with(b"\x7fELF") || head.len() < 20 {
            return None;
        }
        let (class64, little) = (head[4] == 2, head[5] == 1);
        let machine =
            if little { u16::from_le_bytes([head[18], head[19]]) } else { u16::from_be_bytes([head[18], head[19]]) };
        if class64 && little && machine == NATIVE_MACHINE {
            return None;
        }
        let bits = if class64 { "64-bit" } else { "32-bit" };
        return Some(UnobservedReason::ForeignArchitecture { machine: format!("{bits} {}", machine_name(machine)) });
    }
    None
}

/// `vouched` is set when the verdict is `Ok` and rests on the file at `path` alone (at depth 0).
fn check_depth(path: &[u8], creds: Creds, depth: usize, vouched: &mut Option<Vouched>) -> Result<(), UnobservedReason> {
    let fd = match rustix::fs::openat(CWD, path, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK, Mode::empty()) {
        Ok(fd) => fd,
        // Unreadable (mode --x) executables cannot be inspected; the exec will tell.
        Err(_) => return Ok(()),
    };
    let Ok(st) = rustix::fs::fstat(&fd) else { return Ok(()) };
    let uid = creds.uid();
    if st.st_mode & 0o4000 != 0 && st.st_uid != uid || st.st_mode & 0o2000 != 0 && st.st_gid != creds.gid() {
        return Err(UnobservedReason::SetIdExecutable { mode: st.st_mode & 0o7777 });
    }
    if uid != 0 && has_file_capabilities(&fd) {
        return Err(UnobservedReason::FileCapabilities);
    }
    // One read for the header and, in every ordinary ELF file, its program headers (they
    // follow it); only the first 256 bytes count as the header (the kernel reads as much of a
    // `#!` line).
    let first = read_at_least(&fd, FIRST_READ, 0, 256).unwrap_or_default();
    let n = first.len();
    let head = &first[..n.min(256)];
    if head.starts_with(b"#!") {
        if depth >= 4 {
            return Ok(());
        }
        let line = head[2..].split(|&b| b == b'\n').next().unwrap_or(&[]);
        let interp = line.split(|&b| b == b' ' || b == b'\t').find(|t| !t.is_empty());
        return match interp {
            Some(i) => check_depth(i, creds, depth + 1, &mut None),
            None => Ok(()),
        };
    }
    if !head.starts_with(b"\x7fELF") || head.len() < 64 {
        return Ok(());
    }
    let class64 = head[4] == 2;
    let little = head[5] == 1;
    let u16_at = |o: usize| {
        if little { u16::from_le_bytes([head[o], head[o + 1]]) } else { u16::from_be_bytes([head[o], head[o + 1]]) }
    };
    let machine = u16_at(18);
    if !class64 || !little || machine != NATIVE_MACHINE {
        let bits = if class64 { "64-bit" } else { "32-bit" };
        return Err(UnobservedReason::ForeignArchitecture { machine: format!("{bits} {}", machine_name(machine)) });
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or([0; 8]));
    let phentsize = u16_at(54) as usize;
    let phnum = u16_at(56) as usize;
    if phentsize < 4 || phnum == 0 || phnum > 512 {
        return Ok(());
    }
    let table_len = phentsize * phnum;
    let read_table;
    let table = match usize::try_from(phoff).ok().and_then(|at| first.get(at..at.checked_add(table_len)?)) {
        Some(in_first) => in_first,
        None => {
            match read_at(&fd, table_len, phoff) {
                Ok(t) if t.len() == table_len => read_table = t,
                _ => return Ok(()),
            }
            &read_table[..]
        }
    };
    let dynamic = table.chunks_exact(phentsize).any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP);
    if !dynamic {
        return Err(UnobservedReason::StaticExecutable);
    }
    if let Some(runtime) = runtime_of(&fd, head) {
        return Err(UnobservedReason::BypassesLibc { runtime: runtime.into() });
    }
    // libc's clock (rustix's own reading of the vDSO faults under valgrind).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    if depth == 0 && st.st_mode & 0o6000 == 0 && st.st_ctime <= now - Vouched::SETTLED {
        *vouched = Some(Vouched::of(&st, uid));
    }
    Ok(())
}

/// The runtime a 64-bit little-endian ELF file was built with, when it is one whose programs
/// make their own system calls: found by the name of a section only its toolchain emits.
fn runtime_of(fd: &std::os::fd::OwnedFd, head: &[u8]) -> Option<&'static str> {
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let shoff = u64::from_le_bytes(head[40..48].try_into().ok()?);
    let (shentsize, shnum, shstrndx) = (u16_at(58), u16_at(60), u16_at(62));
    if shentsize < 64 || shnum == 0 || shnum > 4096 || shstrndx >= shnum {
        return None;
    }
    // The section headers and, read with them, what precedes them: the section names are
    // there in every file GNU ld, lld and Go's linker write, so one read is enough.
    let table_len = shentsize * shnum;
    let before = shoff.min(TAIL_BEFORE);
    let tail = read_at(fd, before as usize + table_len, shoff - before).ok()?;
    if tail.len() != before as usize + table_len {
        return None;
    }
    let table = &tail[before as usize..];
    let field = |sh: &[u8], o: usize| u64::from_le_bytes(sh[o..o + 8].try_into().unwrap_or([0; 8]));
    let strtab = &table[shstrndx * shentsize..(shstrndx + 1) * shentsize];
    let (str_off, str_len) = (field(strtab, 24), field(strtab, 32).min(1 << 20));
    let in_tail = str_off
        .checked_sub(shoff - before)
        .and_then(|at| tail.get(at as usize..(at as usize).checked_add(str_len as usize)?));
    let read_names;
    let names = match in_tail {
        Some(names) => names,
        None => {
            read_names = read_at(fd, str_len as usize, str_off).ok()?;
            if read_names.len() != str_len as usize {
                return None;
            }
            &read_names[..]
        }
    };
    let name_of = |sh: &[u8]| {
        let at = u32::from_le_bytes(sh[0..4].try_into().unwrap_or([0; 4])) as usize;
        names.get(at..).map(|n| &n[..n.iter().position(|&b| b == 0).unwrap_or(n.len())])
    };
    table.chunks_exact(shentsize).find_map(|sh| match name_of(sh) {
        Some(b".go.buildinfo") => Some("go"),
        Some(b".bun") => Some("bun"),
        _ => None,
    })
}

fn has_file_capabilities(fd: &std::os::fd::OwnedFd) -> bool {
    let mut buf = [0u8; 64];
    rustix::fs::fgetxattr(fd, "security.capability", &mut buf[..]).is_ok()
}

/// How much of an executable the check reads first: the ELF header and the program headers
/// after it (a dynamic program's dozen of them take under 1 KiB).
const FIRST_READ: usize = 4096;

/// How much of what precedes the section headers is read with them (see [`runtime_of`]).
const TAIL_BEFORE: u64 = 4096;

/// Reads at most `len` bytes from `offset` until it holds at least `min` of them, or the file
/// ends: a script of a few hundred bytes costs one `pread`, not a second one to find its end,
/// and what a short read left out is read again by whoever needs it. The buffer is not zeroed
/// first (zeroing the 10 KiB a check reads was half the work of an exec's check).
fn read_at_least(fd: &std::os::fd::OwnedFd, len: usize, offset: u64, min: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < min.min(len) {
        let at = offset + buf.len() as u64;
        match rustix::io::pread(fd, rustix::buffer::spare_capacity(&mut buf), at) {
            Ok(0) => break,
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    // The allocator may have given more room than asked, and a read may have used it.
    buf.truncate(len);
    Ok(buf)
}

fn read_at(fd: &std::os::fd::OwnedFd, len: usize, offset: u64) -> io::Result<Vec<u8>> {
    read_at_least(fd, len, offset, len)
}

/// Resolves a program name the way `execvp` does: names with a slash are used as they are,
/// others are searched in `path_var` (`PATH`, or `/bin:/usr/bin` when unset). Returns the first
/// executable candidate, or the name itself when none is found.
pub fn search_path(file: &[u8], path_var: Option<&[u8]>) -> Vec<u8> {
    if file.contains(&b'/') || file.is_empty() {
        return file.to_vec();
    }
    let path_var = path_var.unwrap_or(b"/bin:/usr/bin");
    for dir in path_var.split(|&b| b == b':') {
        let dir = if dir.is_empty() { &b"."[..] } else { dir };
        let mut cand = dir.to_vec();
        cand.push(b'/');
        cand.extend_from_slice(file);
        if rustix::fs::access(cand.as_slice(), rustix::fs::Access::EXEC_OK).is_ok()
            && rustix::fs::stat(cand.as_slice()).is_ok_and(|st| st.st_mode & 0o170000 == 0o100000)
        {
            return cand;
        }
    }
    file.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Creds {
        Creds::current()
    }

    /// A minimal static ELF of this architecture: header plus one PT_LOAD, no PT_INTERP.
    fn minimal_static_elf() -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[18..20].copy_from_slice(&NATIVE_MACHINE.to_le_bytes());
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        elf
    }

    /// A dynamic ELF of this architecture (one `PT_INTERP` at `phoff`) whose section names
    /// (`.shstrtab` at `names_at`, then `section`) precede its section headers by `gap` bytes.
    fn dynamic_elf_with_section(section: &str, phoff: usize, names_at: usize, gap: usize) -> Vec<u8> {
        let names = format!("\0.shstrtab\0{section}\0").into_bytes();
        let shoff = names_at + names.len() + gap;
        let mut elf = vec![0u8; (shoff + 3 * 64).max(phoff + 56)];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[18..20].copy_from_slice(&NATIVE_MACHINE.to_le_bytes());
        elf[32..40].copy_from_slice(&(phoff as u64).to_le_bytes());
        elf[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        elf[58..60].copy_from_slice(&64u16.to_le_bytes());
        elf[60..62].copy_from_slice(&3u16.to_le_bytes());
        elf[62..64].copy_from_slice(&1u16.to_le_bytes());
        elf[phoff..phoff + 4].copy_from_slice(&PT_INTERP.to_le_bytes());
        elf[names_at..names_at + names.len()].copy_from_slice(&names);
        for (i, name_at) in [(1usize, 1u32), (2, 11)] {
            let sh = shoff + i * 64;
            elf[sh..sh + 4].copy_from_slice(&name_at.to_le_bytes());
            if i == 1 {
                elf[sh + 24..sh + 32].copy_from_slice(&(names_at as u64).to_le_bytes());
                elf[sh + 32..sh + 40].copy_from_slice(&(names.len() as u64).to_le_bytes());
            }
        }
        elf
    }

    #[test]
    fn a_go_program_is_found_by_its_section_wherever_its_headers_and_names_lie() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("prog");
        let go = || Err(UnobservedReason::BypassesLibc { runtime: "go".into() });
        // The names just before the section headers (what linkers write), far before them,
        // and program headers beyond the first read: the same verdict each time.
        for (phoff, names_at, gap) in [(64, 200, 0), (64, 200, 10_000), (6_000, 7_000, 0)] {
            std::fs::write(&p, dynamic_elf_with_section(".go.buildinfo", phoff, names_at, gap)).unwrap();
            assert_eq!(check(p.as_os_str().as_bytes(), me()), go(), "phoff {phoff}, names at {names_at}, gap {gap}");
            std::fs::write(&p, dynamic_elf_with_section(".data.other", phoff, names_at, gap)).unwrap();
            assert_eq!(check(p.as_os_str().as_bytes(), me()), Ok(()), "phoff {phoff}, names at {names_at}, gap {gap}");
        }
    }

    #[test]
    fn a_dynamically_linked_program_is_observable() {
        assert_eq!(check(b"/bin/sh", me()), Ok(()));
        assert_eq!(check(b"/usr/bin/env", me()), Ok(()));
    }

    #[test]
    fn only_a_verdict_that_rests_on_the_program_s_own_file_is_vouched_for_and_any_change_to_it_shows() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("prog");
        let path = p.as_os_str().as_bytes();
        let uid = rustix::process::getuid().as_raw();
        std::fs::copy("/bin/true", &p).unwrap();
        assert_eq!(check_exec_vouched(path, &[path], me()), (Ok(()), None), "changed less than SETTLED ago");
        std::thread::sleep(std::time::Duration::from_secs(Vouched::SETTLED as u64 + 1));
        let (verdict, vouched) = check_exec_vouched(path, &[path], me());
        assert_eq!(verdict, Ok(()));
        let vouched = vouched.expect("a dynamic program of this machine, settled, is vouched for");
        assert_eq!(Vouched::now(path, uid), Some(vouched), "nothing changed");
        assert_ne!(Vouched::now(path, uid.wrapping_add(1)), Some(vouched), "another uid");
        // The same bytes written again (its change time moves), then its mode: each shows.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&p, std::fs::read("/bin/true").unwrap()).unwrap();
        let rewritten = Vouched::now(path, uid).unwrap();
        assert_ne!(rewritten, vouched, "rewritten in place");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_ne!(Vouched::now(path, uid), Some(rewritten), "chmod");
        // Replaced by another file at the name: another identity.
        std::fs::write(t.path().join("static"), minimal_static_elf()).unwrap();
        std::fs::rename(t.path().join("static"), &p).unwrap();
        assert_eq!(check_exec_vouched(path, &[path], me()), (Err(UnobservedReason::StaticExecutable), None));
        // Not vouched for: a script (its interpreter decides), a set-ID program, anything
        // unobservable, a file that cannot be read.
        let script = t.path().join("script");
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        let script = script.as_os_str().as_bytes();
        assert_eq!(check_exec_vouched(script, &[script], me()), (Ok(()), None));
        std::fs::copy("/bin/true", &p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
        assert_eq!(check_exec_vouched(path, &[path], Creds::Of { uid, gid: 0 }), (Ok(()), None));
        assert_eq!(check_exec_vouched(b"/nonexistent/program", &[], me()), (Ok(()), None));
    }

    #[test]
    fn a_missing_program_is_left_to_the_exec_to_report() {
        assert_eq!(check(b"/nonexistent/program", me()), Ok(()));
    }

    #[test]
    fn a_static_binary_is_unobservable() {
        let t = tempfile::tempdir().unwrap();
        let mut elf = minimal_static_elf();
        let p = t.path().join("static");
        std::fs::write(&p, &elf).unwrap();
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(check(p.as_os_str().as_bytes(), me()), Err(UnobservedReason::StaticExecutable));
        // ... and a script whose interpreter is that binary.
        let s = t.path().join("script");
        std::fs::write(&s, format!("#!{} -x\necho hi\n", p.display())).unwrap();
        assert_eq!(check(s.as_os_str().as_bytes(), me()), Err(UnobservedReason::StaticExecutable));
        // A 32-bit one is foreign.
        elf[4] = 1;
        std::fs::write(&p, &elf).unwrap();
        assert!(matches!(check(p.as_os_str().as_bytes(), me()), Err(UnobservedReason::ForeignArchitecture { .. })));
    }

    #[test]
    fn a_setuid_program_owned_by_someone_else_is_unobservable() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("suid");
        std::fs::copy("/bin/true", &p).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
        use std::os::unix::ffi::OsStrExt;
        let uid = rustix::process::getuid().as_raw();
        let owner = Creds::Of { uid, gid: 0 };
        assert_eq!(check(p.as_os_str().as_bytes(), owner), Ok(()), "set-id to oneself changes nothing");
        assert_eq!(check(p.as_os_str().as_bytes(), Creds::current()), Ok(()), "the caller's own ids, asked lazily");
        let other = Creds::Of { uid: uid.wrapping_add(1), gid: 0 };
        assert!(matches!(
            check(p.as_os_str().as_bytes(), other),
            Err(UnobservedReason::SetIdExecutable { mode: 0o4755 })
        ));
    }

    #[test]
    fn the_dynamic_loader_run_as_a_program_is_observable_when_the_program_it_runs_is() {
        let loader = own_interpreter().expect("this test program is dynamically linked");
        assert!(is_dynamic_loader(&loader));
        assert_eq!(check(&loader, me()), Err(UnobservedReason::StaticExecutable), "by its headers alone");
        let ld: &[u8] = &loader;
        assert_eq!(check_exec(&loader, &[ld, b"/bin/rm", b"f"], me()), Ok(()));
        assert_eq!(check_exec(&loader, &[ld, b"--library-path", b"/x", b"--", b"/bin/true"], me()), Ok(()));
        assert_eq!(check_exec(&loader, &[ld, b"--list", b"/bin/true"], me()), Ok(()));
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("static");
        std::fs::write(&p, minimal_static_elf()).unwrap();
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(
            check_exec(&loader, &[ld, p.as_os_str().as_bytes()], me()),
            Err(UnobservedReason::StaticExecutable),
            "what it runs decides"
        );
        assert!(!is_dynamic_loader(b"/bin/sh"));
    }

    #[test]
    fn path_search_finds_the_first_executable() {
        assert_eq!(search_path(b"sh", Some(b"/nonexistent:/bin")), b"/bin/sh");
        assert_eq!(search_path(b"./x", Some(b"/bin")), b"./x");
        assert_eq!(search_path(b"no-such-program-here", Some(b"/bin")), b"no-such-program-here");
    }
}
