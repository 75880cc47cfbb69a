//! The mkstemp family and mkdtemp made by the shim itself, under a supervisor: glibc's own
//! versions make their `openat` or `mkdir` inside libc, unmarked, which would cost a round trip
//! to the supervisor per temporary file (`sed -i` makes one per file it edits). These do what
//! glibc's `__gen_tempname` does, with each attempt a marked system call: check the template,
//! replace its six `X`s with letters and digits, and create the name exclusively, trying other
//! letters while the name exists.
//!
//! What this module cannot do: pick the names glibc would have picked (they are random in
//! both), or be used without a supervisor (there glibc's own run, as the program asked).

use std::ffi::{c_char, c_int, c_long};

use rustix::io::Errno;

/// What to make.
#[derive(Clone, Copy, Debug)]
pub enum Temp {
    /// A file (`mkstemp`, `mkostemp`, `mkstemps`, `mkostemps`): `suffix` bytes after the
    /// `X`s, and the caller's extra open flags.
    File {
        /// Length of the suffix after the `X`s.
        suffix: c_int,
        /// `O_APPEND`, `O_CLOEXEC`, `O_SYNC`... (the access mode is always read-write).
        flags: c_int,
    },
    /// A directory (`mkdtemp`).
    Dir,
}

/// glibc's number of attempts (62 to the third).
const ATTEMPTS: u32 = 62 * 62 * 62;
const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Makes the temporary `template` names, in place: the file's descriptor, 0 for a directory,
/// or -1 with errno set (`EINVAL` for a template without six `X`s before its suffix).
///
/// # Safety
/// `template` must be a writable NUL-terminated string.
pub unsafe fn make(template: *mut c_char, kind: Temp) -> c_long {
    // SAFETY: the caller's NUL-terminated string.
    let len = unsafe { libc::strlen(template) };
    let suffix = match kind {
        Temp::File { suffix, .. } => suffix,
        Temp::Dir => 0,
    };
    let Ok(suffix) = usize::try_from(suffix) else { return fail(libc::EINVAL) };
    if len < 6 + suffix {
        return fail(libc::EINVAL);
    }
    let start = len - suffix - 6;
    // SAFETY: `start + 6 <= len`, inside the caller's string, which we may write.
    let xs = unsafe { std::slice::from_raw_parts_mut(template.add(start).cast::<u8>(), 6) };
    if xs.iter().any(|&b| b != b'X') {
        return fail(libc::EINVAL);
    }
    let mut seed = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::NONBLOCK);
    let mut state = u64::from_ne_bytes(seed) ^ (template as u64).rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    for _ in 0..ATTEMPTS {
        // xorshift64*: a new draw for each attempt.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let mut v = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        for b in xs.iter_mut() {
            *b = *LETTERS.get((v % 62) as usize).unwrap_or(&b'X');
            v /= 62;
        }
        let r = match kind {
            // SAFETY: the caller's path, now with its letters; flags and mode as glibc passes.
            Temp::File { flags, .. } => unsafe {
                let flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
                crate::kernel::raw(
                    libc::SYS_openat,
                    [libc::AT_FDCWD as usize, template as usize, flags as usize, 0o600, 0],
                    crate::kernel::mark(),
                )
            },
            // SAFETY: as above.
            Temp::Dir => unsafe {
                crate::kernel::raw(
                    libc::SYS_mkdirat,
                    [libc::AT_FDCWD as usize, template as usize, 0o700, 0, 0],
                    crate::kernel::mark(),
                )
            },
        };
        match r {
            0.. => return r as c_long,
            e if e == -(Errno::EXIST.raw_os_error() as isize) => continue,
            e => return fail(-e as c_int),
        }
    }
    fail(libc::EEXIST)
}

fn fail(errno: c_int) -> c_long {
    crate::guard::set_errno(errno);
    -1
}
