//! The hook table and the FFI half of every hook.
//!
//! Adding a libc symbol is one line in [`hooks!`]: its C signature and the handler that
//! classifies it. The macro generates the exported `extern "C"` function, the lazily resolved
//! original ([`Real`]) and an entry in [`HOOKS`], which the self-test walks to prove every
//! symbol resolves.
//!
//! Every handler has the same shape, enforced by [`journaled`]: a fast path for calls that
//! cannot mutate (a flag test and a tail call), then guard -> classify and capture (under
//! `catch_unwind`) -> the real call, exactly once, outside the guard -> outcome, with errno
//! restored to what the real call set.
//!
//! Never write to fds 0-2 here, never `print!`: the program may have closed or reused them
//! (INTERPOSITION.md §6.11).
//!
//! What this module cannot do: see calls glibc makes to itself without going through these
//! names (INTERPOSITION.md §3); that is why wrappers such as `fopen`, `remove` and the
//! `mkstemp` family are hooked by their own names.

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};

use libc::{FILE, c_void, dev_t, gid_t, mode_t, off_t, off64_t, size_t, timespec, timeval, uid_t, utimbuf};

use journal::record::MetaKind;

use crate::guard::{Guard, errno, set_errno};
use crate::ops::{self, Pending, Removes};
use crate::real::Real;
use crate::state::{Store, store};

/// Converts a C argument into what a handler sees: C strings become byte slices (`None` for
/// null, which the real call rejects on its own), everything else passes through.
pub trait CArg: Copy {
    /// The handler-side type.
    type Out<'a>;
    /// # Safety
    /// For `*const c_char`: null or a NUL-terminated string valid for the duration of the call.
    unsafe fn to_rust<'a>(self) -> Self::Out<'a>;
}

impl CArg for *const c_char {
    type Out<'a> = Option<&'a [u8]>;
    unsafe fn to_rust<'a>(self) -> Option<&'a [u8]> {
        // SAFETY: non-null and NUL-terminated (the caller's obligation).
        (!self.is_null()).then(|| unsafe { CStr::from_ptr(self) }.to_bytes())
    }
}

macro_rules! passthrough_to_rust {
    ($($t:ty),*) => {$(
        impl CArg for $t {
            type Out<'a> = $t;
            unsafe fn to_rust<'a>(self) -> Self::Out<'a> {
                self
            }
        }
    )*};
}
passthrough_to_rust!(c_int, c_uint, *mut c_char, *mut FILE);

macro_rules! hooks {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $handler:ident ( $($harg:ident),* ); )*) => {
        $(
            #[allow(non_snake_case)]
            mod $name {
                pub static REAL: $crate::real::Real = $crate::real::Real::new(
                    match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("hook names never contain NUL"),
                    },
                );
            }

            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                type RealFn = unsafe extern "C" fn($($ty),*) -> $ret;
                // SAFETY: RealFn is the C signature of this very symbol, written once above.
                match unsafe { $name::REAL.get::<RealFn>() } {
                    Some(real) => {
                        // SAFETY: forwards the caller's own arguments, unchanged, to the function
                        // they were meant for. FnOnce: the handler can call it at most once, and
                        // every handler calls it exactly once.
                        let real = move || unsafe { real($($arg),*) };
                        // SAFETY: these are the arguments of a C call to `$name`, whose contract
                        // makes every `const char *` null or a NUL-terminated string that stays
                        // valid for the duration of the call.
                        $handler(stringify!($name), real, $(unsafe { CArg::to_rust($harg) }),*)
                    }
                    None => <$ret as $crate::real::Missing>::missing(),
                }
            }
        )*

        /// Every hooked symbol, in table order.
        pub static HOOKS: &[&Real] = &[$(&$name::REAL),*];
    };
}

type Str<'a> = Option<&'a [u8]>;

hooks! {
    // `mode` is forwarded as received and never read here: it only means something with
    // O_CREAT or O_TMPFILE (glibc's rule), and the kernel ignores it otherwise.
    fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn __open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn __open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int => h_open(path, flags);
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int => h_openat(dirfd, path, flags);
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int => h_openat(dirfd, path, flags);
    fn __open_2(path: *const c_char, flags: c_int) -> c_int => h_open(path, flags);
    fn __open64_2(path: *const c_char, flags: c_int) -> c_int => h_open(path, flags);
    fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int => h_openat(dirfd, path, flags);
    fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int => h_openat(dirfd, path, flags);
    fn creat(path: *const c_char, mode: mode_t) -> c_int => h_creat(path);
    fn creat64(path: *const c_char, mode: mode_t) -> c_int => h_creat(path);
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE => h_fopen(path, mode);
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE => h_fopen(path, mode);
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE => h_freopen(path, mode, stream);
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE => h_freopen(path, mode, stream);
    fn mkstemp(template: *mut c_char) -> c_int => h_mktemp(template);
    fn mkstemp64(template: *mut c_char) -> c_int => h_mktemp(template);
    fn mkostemp(template: *mut c_char, flags: c_int) -> c_int => h_mktemp(template);
    fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int => h_mktemp(template);
    fn mkstemps(template: *mut c_char, suffixlen: c_int) -> c_int => h_mktemp(template);
    fn mkstemps64(template: *mut c_char, suffixlen: c_int) -> c_int => h_mktemp(template);
    fn mkostemps(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int => h_mktemp(template);
    fn mkostemps64(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int => h_mktemp(template);
    fn mkdtemp(template: *mut c_char) -> *mut c_char => h_mktemp(template);
    fn truncate(path: *const c_char, length: off_t) -> c_int => h_truncate(path);
    fn truncate64(path: *const c_char, length: off64_t) -> c_int => h_truncate(path);
    fn ftruncate(fd: c_int, length: off_t) -> c_int => h_ftruncate(fd);
    fn ftruncate64(fd: c_int, length: off64_t) -> c_int => h_ftruncate(fd);
    fn rename(old: *const c_char, new: *const c_char) -> c_int => h_rename(old, new);
    fn renameat(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char) -> c_int => h_renameat(olddirfd, old, newdirfd, new);
    fn renameat2(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_uint) -> c_int => h_renameat2(olddirfd, old, newdirfd, new, flags);
    fn unlink(path: *const c_char) -> c_int => h_unlink(path);
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int => h_unlinkat(dirfd, path, flags);
    fn remove(path: *const c_char) -> c_int => h_remove(path);
    fn rmdir(path: *const c_char) -> c_int => h_rmdir(path);
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int => h_create(path);
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int => h_createat(dirfd, path);
    fn link(old: *const c_char, new: *const c_char) -> c_int => h_create(new);
    fn linkat(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_int) -> c_int => h_createat(newdirfd, new);
    fn symlink(target: *const c_char, linkpath: *const c_char) -> c_int => h_create(linkpath);
    fn symlinkat(target: *const c_char, newdirfd: c_int, linkpath: *const c_char) -> c_int => h_createat(newdirfd, linkpath);
    fn mknod(path: *const c_char, mode: mode_t, dev: dev_t) -> c_int => h_create(path);
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: dev_t) -> c_int => h_createat(dirfd, path);
    fn mkfifo(path: *const c_char, mode: mode_t) -> c_int => h_create(path);
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int => h_createat(dirfd, path);
    fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int => h_fd_change(fd);
    fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int => h_fd_change(fd);
    fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int => h_posix_fallocate(fd);
    fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int => h_posix_fallocate(fd);
    fn chmod(path: *const c_char, mode: mode_t) -> c_int => h_meta_follow_mode(path);
    fn lchmod(path: *const c_char, mode: mode_t) -> c_int => h_meta_nofollow_mode(path);
    fn fchmod(fd: c_int, mode: mode_t) -> c_int => h_fd_meta_mode(fd);
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int => h_metaat_mode(dirfd, path, flags);
    fn chown(path: *const c_char, owner: uid_t, group: gid_t) -> c_int => h_meta_follow_owner(path);
    fn lchown(path: *const c_char, owner: uid_t, group: gid_t) -> c_int => h_meta_nofollow_owner(path);
    fn fchown(fd: c_int, owner: uid_t, group: gid_t) -> c_int => h_fd_meta_owner(fd);
    fn fchownat(dirfd: c_int, path: *const c_char, owner: uid_t, group: gid_t, flags: c_int) -> c_int => h_metaat_owner(dirfd, path, flags);
    fn utime(path: *const c_char, times: *const utimbuf) -> c_int => h_meta_follow_times(path);
    fn utimes(path: *const c_char, times: *const timeval) -> c_int => h_meta_follow_times(path);
    fn lutimes(path: *const c_char, times: *const timeval) -> c_int => h_meta_nofollow_times(path);
    fn futimes(fd: c_int, times: *const timeval) -> c_int => h_fd_meta_times(fd);
    fn futimesat(dirfd: c_int, path: *const c_char, times: *const timeval) -> c_int => h_futimesat(dirfd, path);
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const timespec, flags: c_int) -> c_int => h_metaat_times(dirfd, path, flags);
    fn futimens(fd: c_int, times: *const timespec) -> c_int => h_fd_meta_times(fd);
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int => h_xattr_follow(path, name);
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int => h_xattr_nofollow(path, name);
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int => h_fd_xattr(fd, name);
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int => h_xattr_follow(path, name);
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int => h_xattr_nofollow(path, name);
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int => h_fd_xattr(fd, name);
    fn setuid(uid: uid_t) -> c_int => h_set_euid(uid);
    fn seteuid(euid: uid_t) -> c_int => h_set_euid(euid);
    fn setreuid(ruid: uid_t, euid: uid_t) -> c_int => h_set_euid(euid);
    fn setresuid(ruid: uid_t, euid: uid_t, suid: uid_t) -> c_int => h_set_euid(euid);
}

/// Runs the shim's bookkeeping around one real call.
///
/// `pre` classifies and captures (under the guard and `catch_unwind`); `real` is then called
/// exactly once, with the guard released and errno as the caller left it; `after` sees whether
/// it succeeded. A panic in `pre` is journaled as an irreversible step naming `path`.
fn journaled<R>(
    call: &'static str,
    path: &[u8],
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce() -> R,
    succeeded: impl FnOnce(&R) -> bool,
) -> R {
    let pending = match Guard::enter() {
        None => None,
        Some(guard) => {
            let saved = errno();
            let pending = catch_unwind(AssertUnwindSafe(|| store().map(|s| (s, pre(s))))).unwrap_or_else(|payload| {
                let _ = catch_unwind(AssertUnwindSafe(|| record_panic(call, path, payload)));
                None
            });
            drop(guard);
            set_errno(saved);
            pending
        }
    };
    let result = real();
    if let Some((store, pending)) = pending {
        if !matches!(pending, Pending::Nothing) {
            let err = errno();
            if let Some(guard) = Guard::enter() {
                let ok = succeeded(&result);
                let _ = catch_unwind(AssertUnwindSafe(|| ops::after(store, call, pending, ok, err)));
                drop(guard);
            }
            set_errno(err);
        }
    }
    result
}

/// Runs the real call, then bookkeeping that can only happen afterwards (names the call
/// chose), under the guard and `catch_unwind`, with errno preserved.
fn journaled_after<R>(call: &'static str, real: impl FnOnce() -> R, post: impl FnOnce(&'static Store, &R)) -> R {
    let result = real();
    let err = errno();
    if let Some(guard) = Guard::enter() {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| {
            if let Some(s) = store() {
                post(s, &result)
            }
        })) {
            let _ = catch_unwind(AssertUnwindSafe(|| record_panic(call, b"", payload)));
        }
        drop(guard);
    }
    set_errno(err);
    result
}

fn record_panic(call: &str, path: &[u8], payload: Box<dyn std::any::Any + Send>) {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    if let Some(s) = store() {
        let before = journal::Before::Irreversible { reason: journal::Reason::Internal { message } };
        s.record(call, journal::Op::Change { path: journal::BPath::new(path.to_vec()), before });
    }
}

fn int_ok(r: &c_int) -> bool {
    *r >= 0
}

// ----- open family -----

fn h_open(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, flags: c_int) -> c_int {
    h_openat(call, real, libc::AT_FDCWD, path, flags)
}

fn h_openat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>, flags: c_int) -> c_int {
    // The read-only fast path: a flag test and a tail call.
    if !ops::open_mutates(flags) {
        return real();
    }
    let Some(p) = path else { return real() };
    journaled(call, p, |s| ops::before_open(s, call, dirfd, p, flags), real, int_ok)
}

fn h_creat(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
    journaled(call, p, |s| ops::before_open(s, call, libc::AT_FDCWD, p, flags), real, int_ok)
}

fn h_fopen(call: &'static str, real: impl FnOnce() -> *mut FILE, path: Str<'_>, mode: Str<'_>) -> *mut FILE {
    let flags = mode.and_then(ops::fopen_flags).filter(|&f| ops::open_mutates(f));
    let (Some(flags), Some(p)) = (flags, path) else { return real() };
    journaled(call, p, |s| ops::before_open(s, call, libc::AT_FDCWD, p, flags), real, |f| !f.is_null())
}

fn h_freopen(
    call: &'static str,
    real: impl FnOnce() -> *mut FILE,
    path: Str<'_>,
    mode: Str<'_>,
    stream: *mut FILE,
) -> *mut FILE {
    let Some(flags) = mode.and_then(ops::fopen_flags).filter(|&f| ops::open_mutates(f)) else { return real() };
    // freopen(NULL, mode, stream) reopens the stream's own file with the new mode.
    let target = match path {
        Some(p) => Some(p.to_vec()),
        // SAFETY: `stream` is the caller's FILE, valid for this call; fileno only reads it.
        None if !stream.is_null() => journal::resolve::fd_path(unsafe { libc::fileno(stream) }).ok(),
        None => None,
    };
    let Some(p) = target else { return real() };
    journaled(call, &p, |s| ops::before_open(s, call, libc::AT_FDCWD, &p, flags), real, |f| !f.is_null())
}

// ----- temporary files: the name is only known afterwards -----

/// Whether a mkstemp-like call succeeded (an fd, or mkdtemp's non-null result).
trait CreatedOk {
    fn created(&self) -> bool;
}

impl CreatedOk for c_int {
    fn created(&self) -> bool {
        *self >= 0
    }
}

impl CreatedOk for *mut c_char {
    fn created(&self) -> bool {
        !self.is_null()
    }
}

fn h_mktemp<R: CreatedOk>(call: &'static str, real: impl FnOnce() -> R, template: *mut c_char) -> R {
    journaled_after(call, real, |s, r| {
        if r.created() {
            // SAFETY: on success the call left a NUL-terminated file name in the caller's
            // template buffer, which stays valid for the duration of this call.
            if let Some(p) = unsafe { template.cast_const().to_rust() } {
                ops::after_created(s, call, p);
            }
        }
    })
}

// ----- truncation -----

fn h_truncate(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    journaled(call, p, |s| ops::before_truncate(s, call, p), real, int_ok)
}

fn h_ftruncate(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    journaled(call, b"", |s| ops::before_fd_change(s, call, fd), real, int_ok)
}

// ----- rename -----

fn h_rename(call: &'static str, real: impl FnOnce() -> c_int, old: Str<'_>, new: Str<'_>) -> c_int {
    h_renameat2(call, real, libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0)
}

fn h_renameat(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    od: c_int,
    old: Str<'_>,
    nd: c_int,
    new: Str<'_>,
) -> c_int {
    h_renameat2(call, real, od, old, nd, new, 0)
}

fn h_renameat2(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    olddirfd: c_int,
    old: Str<'_>,
    newdirfd: c_int,
    new: Str<'_>,
    flags: c_uint,
) -> c_int {
    let (Some(o), Some(n)) = (old, new) else { return real() };
    journaled(call, o, |s| ops::before_rename(s, call, olddirfd, o, newdirfd, n, flags), real, int_ok)
}

// ----- removal and creation of names -----

fn h_unlink(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    h_unlinkat(call, real, libc::AT_FDCWD, path, 0)
}

fn h_unlinkat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>, flags: c_int) -> c_int {
    let Some(p) = path else { return real() };
    let removes = if flags & libc::AT_REMOVEDIR != 0 { Removes::Dir } else { Removes::NonDir };
    journaled(call, p, |s| ops::before_remove(s, call, dirfd, p, removes), real, int_ok)
}

fn h_remove(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    journaled(call, p, |s| ops::before_remove(s, call, libc::AT_FDCWD, p, Removes::Either), real, int_ok)
}

fn h_rmdir(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    h_unlinkat(call, real, libc::AT_FDCWD, path, libc::AT_REMOVEDIR)
}

fn h_create(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    h_createat(call, real, libc::AT_FDCWD, path)
}

fn h_createat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>) -> c_int {
    let Some(p) = path else { return real() };
    journaled(call, p, |s| ops::before_create(s, call, dirfd, p), real, int_ok)
}

// ----- credentials -----

fn h_set_euid(call: &'static str, real: impl FnOnce() -> c_int, euid: uid_t) -> c_int {
    journaled(call, b"", |s| ops::before_uid_change(s, call, euid), real, int_ok)
}

// ----- descriptors changed in place -----

fn h_fd_change(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    journaled(call, b"", |s| ops::before_fd_change(s, call, fd), real, int_ok)
}

/// posix_fallocate returns an error number instead of setting errno.
fn h_posix_fallocate(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    journaled(call, b"", |s| ops::before_fd_change(s, call, fd), real, |r| *r == 0)
}

// ----- metadata -----

/// Metadata change by name relative to `dirfd`; `flags` may hold AT_SYMLINK_NOFOLLOW, and
/// AT_EMPTY_PATH (or a null path for utimensat) makes it a change of `dirfd` itself.
fn meta_at(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
    what: MetaKind,
    xattr: Option<&[u8]>,
) -> c_int {
    let on_dirfd_itself = match path {
        None => true,
        Some(b"") => flags & libc::AT_EMPTY_PATH != 0,
        Some(_) => false,
    };
    match path {
        _ if on_dirfd_itself => {
            journaled(call, b"", |s| ops::before_fd_meta(s, call, dirfd, what, xattr), real, int_ok)
        }
        // An empty path without AT_EMPTY_PATH fails with ENOENT.
        None | Some(b"") => real(),
        Some(p) => {
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            journaled(call, p, |s| ops::before_meta(s, call, dirfd, p, follow, what, xattr), real, int_ok)
        }
    }
}

fn h_meta_follow_mode(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Mode, None)
}

fn h_meta_nofollow_mode(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Mode, None)
}

fn h_fd_meta_mode(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    journaled(call, b"", |s| ops::before_fd_meta(s, call, fd, MetaKind::Mode, None), real, int_ok)
}

fn h_metaat_mode(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>, flags: c_int) -> c_int {
    meta_at(call, real, dirfd, path.or(Some(b"")), flags, MetaKind::Mode, None)
}

fn h_meta_follow_owner(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Owner, None)
}

fn h_meta_nofollow_owner(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Owner, None)
}

fn h_fd_meta_owner(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    journaled(call, b"", |s| ops::before_fd_meta(s, call, fd, MetaKind::Owner, None), real, int_ok)
}

fn h_metaat_owner(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
) -> c_int {
    meta_at(call, real, dirfd, path.or(Some(b"")), flags, MetaKind::Owner, None)
}

fn h_meta_follow_times(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Times, None)
}

fn h_meta_nofollow_times(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Times, None)
}

fn h_fd_meta_times(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int) -> c_int {
    journaled(call, b"", |s| ops::before_fd_meta(s, call, fd, MetaKind::Times, None), real, int_ok)
}

/// utimensat: a null path means `dirfd` itself.
fn h_metaat_times(
    call: &'static str,
    real: impl FnOnce() -> c_int,
    dirfd: c_int,
    path: Str<'_>,
    flags: c_int,
) -> c_int {
    meta_at(call, real, dirfd, path, flags, MetaKind::Times, None)
}

/// futimesat: a null path means `dirfd` itself; symlinks are always followed.
fn h_futimesat(call: &'static str, real: impl FnOnce() -> c_int, dirfd: c_int, path: Str<'_>) -> c_int {
    meta_at(call, real, dirfd, path, 0, MetaKind::Times, None)
}

fn h_xattr_follow(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, name: Str<'_>) -> c_int {
    let Some(name) = name else { return real() };
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), 0, MetaKind::Xattr, Some(name))
}

fn h_xattr_nofollow(call: &'static str, real: impl FnOnce() -> c_int, path: Str<'_>, name: Str<'_>) -> c_int {
    let Some(name) = name else { return real() };
    meta_at(call, real, libc::AT_FDCWD, path.or(Some(b"")), libc::AT_SYMLINK_NOFOLLOW, MetaKind::Xattr, Some(name))
}

fn h_fd_xattr(call: &'static str, real: impl FnOnce() -> c_int, fd: c_int, name: Str<'_>) -> c_int {
    let Some(name) = name else { return real() };
    journaled(call, b"", |s| ops::before_fd_meta(s, call, fd, MetaKind::Xattr, Some(name)), real, int_ok)
}
