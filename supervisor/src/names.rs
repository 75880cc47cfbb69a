//! The names records give the system calls the supervisor journals.
//!
//! What this module cannot do: name a call the filter does not watch (it says `syscall`).

/// The name of system call `nr`, as the records call it.
pub fn name(nr: i64) -> &'static str {
    #[cfg(target_arch = "x86_64")]
    match nr {
        libc::SYS_open => return "open",
        libc::SYS_creat => return "creat",
        libc::SYS_rename => return "rename",
        libc::SYS_renameat => return "renameat",
        libc::SYS_unlink => return "unlink",
        libc::SYS_rmdir => return "rmdir",
        libc::SYS_mkdir => return "mkdir",
        libc::SYS_link => return "link",
        libc::SYS_symlink => return "symlink",
        libc::SYS_mknod => return "mknod",
        libc::SYS_chmod => return "chmod",
        libc::SYS_chown => return "chown",
        libc::SYS_lchown => return "lchown",
        libc::SYS_utime => return "utime",
        libc::SYS_utimes => return "utimes",
        libc::SYS_futimesat => return "futimesat",
        _ => {}
    }
    match nr {
        libc::SYS_openat => "openat",
        libc::SYS_chdir => "chdir",
        libc::SYS_fchdir => "fchdir",
        libc::SYS_openat2 => "openat2",
        libc::SYS_open_by_handle_at => "open_by_handle_at",
        libc::SYS_truncate => "truncate",
        libc::SYS_ftruncate => "ftruncate",
        libc::SYS_fallocate => "fallocate",
        libc::SYS_renameat2 => "renameat2",
        libc::SYS_unlinkat => "unlinkat",
        libc::SYS_mkdirat => "mkdirat",
        libc::SYS_linkat => "linkat",
        libc::SYS_symlinkat => "symlinkat",
        libc::SYS_mknodat => "mknodat",
        libc::SYS_fchmod => "fchmod",
        libc::SYS_fchmodat => "fchmodat",
        libc::SYS_fchmodat2 => "fchmodat2",
        libc::SYS_fchown => "fchown",
        libc::SYS_fchownat => "fchownat",
        libc::SYS_utimensat => "utimensat",
        libc::SYS_setxattr => "setxattr",
        libc::SYS_lsetxattr => "lsetxattr",
        libc::SYS_fsetxattr => "fsetxattr",
        libc::SYS_removexattr => "removexattr",
        libc::SYS_lremovexattr => "lremovexattr",
        libc::SYS_fremovexattr => "fremovexattr",
        crate::filter::SYS_SETXATTRAT => "setxattrat",
        crate::filter::SYS_REMOVEXATTRAT => "removexattrat",
        libc::SYS_bind => "bind",
        libc::SYS_ioctl => "ioctl",
        libc::SYS_connect => "connect",
        libc::SYS_sendto => "sendto",
        libc::SYS_sendmsg => "sendmsg",
        libc::SYS_sendmmsg => "sendmmsg",
        libc::SYS_kill => "kill",
        libc::SYS_tkill => "tkill",
        libc::SYS_tgkill => "tgkill",
        libc::SYS_rt_sigqueueinfo => "rt_sigqueueinfo",
        libc::SYS_rt_tgsigqueueinfo => "rt_tgsigqueueinfo",
        libc::SYS_pidfd_send_signal => "pidfd_send_signal",
        libc::SYS_execve => "execve",
        libc::SYS_execveat => "execveat",
        libc::SYS_io_uring_setup => "io_uring_setup",
        libc::SYS_chroot => "chroot",
        libc::SYS_pivot_root => "pivot_root",
        libc::SYS_setns => "setns",
        libc::SYS_unshare => "unshare",
        libc::SYS_clone => "clone",
        _ => "syscall",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_watched_call_has_its_own_name() {
        let mut seen = std::collections::HashSet::new();
        for (nr, _) in crate::filter::watched() {
            let n = super::name(nr);
            assert_ne!(n, "syscall", "{nr}");
            assert!(seen.insert(n), "{n} named twice");
        }
    }
}
