//! The `AETHER_*` entries of the environment a process image started with, copied by the
//! constructor without allocating, so that the configuration comes from the environment the
//! image started with even if the program changes its own before the first hooked call.
//!
//! What this cannot do: keep more than [`EARLY_ENV_CAP`] bytes of them; a larger set is read
//! from the live environment when the configuration is built.

use journal_core::config::ENV_SWITCH;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Room for the `AETHER_*` entries of the starting environment (a session under `run` needs
/// about 180 bytes; a larger set falls back to reading the environment when the configuration
/// is built). Small enough that the shim's zero-initialised statics end on the page of its
/// initialised data, which the loader maps from the file: past that page it maps anonymous
/// memory of its own in every process (see `lazymap.rs`).
const EARLY_ENV_CAP: usize = 1024;

/// The `AETHER_*` entries of the environment this process image started with, each
/// `NAME=value` followed by a NUL, copied by the constructor into static storage.
///
/// # Rationale
/// The configuration must come from the environment the image started with (a program may
/// `clearenv` or `unsetenv` before it execs, and the exec hooks put our variables back), but
/// building it costs allocations and code that a process which never changes a file never
/// needs. The constructor only scans `environ` for the prefix and copies the few matching
/// entries in place, without allocating; [`config`] parses them on first use.
///
/// Every process writes it while starting, so it lives in the start-up data
/// (`shim/startup.ld`), its state and length first: a few hundred bytes of entries touch one
/// page, not the two its 4 KiB could span.
#[repr(C)]
struct EarlyEnv {
    /// `EARLY_EMPTY`, `EARLY_WRITING`, `EARLY_DONE` or `EARLY_OVERFLOW`.
    state: AtomicU32,
    len: AtomicUsize,
    bytes: std::cell::UnsafeCell<[u8; EARLY_ENV_CAP]>,
}

// SAFETY: `bytes` is written only by the one thread that moved `state` from EMPTY to WRITING,
// and read only after `state` is DONE (release/acquire).
unsafe impl Sync for EarlyEnv {}

const EARLY_EMPTY: u32 = 0;
const EARLY_WRITING: u32 = 1;
const EARLY_DONE: u32 = 2;
const EARLY_OVERFLOW: u32 = 3;

#[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.startup_env"))]
static EARLY_ENV: EarlyEnv = EarlyEnv {
    state: AtomicU32::new(EARLY_EMPTY),
    len: AtomicUsize::new(0),
    bytes: std::cell::UnsafeCell::new([0; EARLY_ENV_CAP]),
};

/// Copies the `AETHER_*` entries of `environ` (see [`EarlyEnv`]), once. Allocates nothing.
///
/// The constructor calls it in every process, so it sits in the constructor's code window
/// (shim/startup.ld): left in `.text`, it was a page fault of its own in each of them.
#[cfg_attr(not(test), unsafe(link_section = ".text.startup.aether_journal.env"))]
pub fn capture_early_env() {
    if EARLY_ENV.state.compare_exchange(EARLY_EMPTY, EARLY_WRITING, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return;
    }
    // SAFETY: this thread alone moved the state to WRITING: nobody else touches `bytes` until
    // it is DONE.
    let bytes = unsafe { &mut *EARLY_ENV.bytes.get() };
    let entries = live_entries();
    let mut len = 0;
    let mut state = EARLY_DONE;
    for e in entries {
        let Some(room) = bytes.get_mut(len..len + e.len() + 1) else {
            state = EARLY_OVERFLOW;
            break;
        };
        // NAME=value and its NUL (the room is exactly that long). The NUL is stored on its own:
        // chained from a constant, it was a read of a page no process otherwise touches.
        if let Some((nul, name)) = room.split_last_mut() {
            for (to, from) in name.iter_mut().zip(e) {
                *to = *from;
            }
            *nul = 0;
        }
        len += e.len() + 1;
    }
    EARLY_ENV.len.store(len, Ordering::Relaxed);
    EARLY_ENV.state.store(state, Ordering::Release);
}

/// What the entries kept begin with.
const PREFIX: &[u8] = b"AETHER_";

/// The `AETHER_*` entries of the live `environ`, read in place. Allocates nothing. The slices
/// are the program's strings, valid while it leaves its environment alone: callers copy what
/// they keep (the constructor's copy, the marker's parsed number).
#[cfg_attr(not(test), unsafe(link_section = ".text.startup.aether_journal.env"))]
fn live_entries() -> impl Iterator<Item = &'static [u8]> {
    let environ = crate::exec::current_environ();
    (0..)
        .map_while(move |i| {
            // SAFETY: `environ` is null or a null-terminated array of NUL-terminated strings;
            // this runs in the constructor (before main and its threads) or on a hook's first
            // use, and only reads.
            let p = if environ.is_null() { std::ptr::null() } else { unsafe { *environ.add(i) } };
            (!p.is_null()).then_some(p)
        })
        // The prefix is compared first: measuring every entry (PATH, LS_COLORS: kilobytes in
        // all) cost every process about a microsecond.
        // SAFETY: a non-null entry is a NUL-terminated string (see above).
        .filter(|&p| unsafe { has_prefix(p, PREFIX) })
        // SAFETY: as above; each caller reads the strings before it returns to the program,
        // which alone could change them.
        .map(|p| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), c_len(p)) })
}

/// The length of the NUL-terminated string at `p`, counted here rather than by libc's
/// `strlen` (which `CStr::from_ptr` calls): the constructor measures the `AETHER_*` entries in
/// every process of a session, and libc's `strlen` was a page of libc's code that a small
/// program does not always touch, a page fault in about one process in eight (perf's
/// page-fault records of `/bin/true`). Each byte read goes through `black_box`, so that the
/// compiler cannot turn the loop back into a call of `strlen`. The entries are short.
///
/// # Safety
/// `p` points to a NUL-terminated string.
#[cfg_attr(not(test), unsafe(link_section = ".text.startup.aether_journal.env"))]
unsafe fn c_len(p: *const std::ffi::c_char) -> usize {
    let mut n = 0;
    // SAFETY: every byte before `n` was not the NUL, so `n` is within the string or is its NUL.
    while std::hint::black_box(unsafe { *p.add(n) }) != 0 {
        n += 1;
    }
    n
}

/// Whether the NUL-terminated string at `p` begins with `prefix` (which holds no NUL), reading
/// no byte past the first that differs.
///
/// # Safety
/// `p` points to a NUL-terminated string.
pub unsafe fn has_prefix(p: *const std::ffi::c_char, prefix: &[u8]) -> bool {
    prefix.iter().enumerate().all(|(i, &b)| {
        // SAFETY: every byte before `i` matched a byte of the prefix, so none was the NUL: `i`
        // is within the string or is its NUL.
        unsafe { *p.add(i) as u8 == b }
    })
}

/// The copied entries, once the constructor's copy is complete and whole.
pub(super) fn early_entries() -> Option<impl Iterator<Item = &'static [u8]>> {
    if EARLY_ENV.state.load(Ordering::Acquire) != EARLY_DONE {
        return None;
    }
    // SAFETY: DONE means the writer has finished: `bytes` is only read from now on.
    let bytes = unsafe { &*EARLY_ENV.bytes.get() };
    let copied = bytes.get(..EARLY_ENV.len.load(Ordering::Relaxed)).unwrap_or_default();
    Some(copied.split(|&b| b == 0).filter(|e| !e.is_empty()))
}

/// Sets the supervisor's marker ([`crate::kernel::mark`]) from the starting environment,
/// unless the shim is switched off (then nothing it does is journaled, so nothing is marked).
/// Allocation-free: it runs in the constructor of every process.
pub fn adopt_mark() {
    fn adopt<'a>(entries: impl Iterator<Item = &'a [u8]>) {
        let mut mark = None;
        for e in entries {
            if env_value(e, ENV_SWITCH.as_bytes()) == Some(b"off") {
                return;
            }
            if let Some(v) = env_value(e, journal_core::config::ENV_MARK.as_bytes()) {
                mark = Some(v);
            }
        }
        if let Some(v) = mark {
            crate::kernel::set_mark_from(v);
        }
    }
    capture_early_env();
    match early_entries() {
        Some(entries) => adopt(entries),
        // More than the copy holds: read in place (the constructor runs before the program can
        // change its environment). Unmarked, the shim's own calls would reach the supervisor.
        None => adopt(live_entries()),
    }
}

/// The `AETHER_*` entries the image started with, as `NAME=value` byte strings.
pub(super) fn early_env() -> Vec<Vec<u8>> {
    capture_early_env();
    match early_entries() {
        Some(entries) => entries.map(<[u8]>::to_vec).collect(),
        // Too many variables to keep, or another thread is copying them right now.
        None => std::env::vars_os()
            .filter(|(k, _)| k.as_bytes().starts_with(b"AETHER_"))
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
            .collect(),
    }
}

/// The value in a `NAME=value` environment entry, if it is `name`'s.
pub fn env_value<'a>(entry: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    entry.strip_prefix(name).and_then(|rest| rest.strip_prefix(b"="))
}

/// The value of `name` among `entries` (`NAME=value` strings).
pub(super) fn lookup<'a>(entries: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    entries.iter().find_map(|e| env_value(e, name.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_kept_by_its_prefix_alone_and_a_shorter_one_is_read_no_further_than_its_nul() {
        // SAFETY: a CStr is a NUL-terminated string.
        let has = |s: &std::ffi::CStr| unsafe { has_prefix(s.as_ptr(), PREFIX) };
        assert!(has(c"AETHER_JOURNAL_DIR=/tmp/s"));
        assert!(has(c"AETHER_"));
        assert!(!has(c"AETHER"), "the NUL differs from the prefix's last byte");
        assert!(!has(c"PATH=/usr/bin"));
        assert!(!has(c""));
        assert!(!has(c"aether_journal_dir=x"));
    }
}
