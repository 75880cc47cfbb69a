//! Finding the real libc functions behind our hooks.
//!
//! Each hook owns a [`Real`]: the symbol name and an `AtomicPtr` filled on first use with
//! `dlsym(RTLD_NEXT, name)`. Resolution is lazy because hooks run before our constructor
//! (libselinux's constructor calls `fopen` first; docs/INTERPOSITION.md, "Hooks run before
//! the constructor"), and it is lock-free so that a `fork` in another thread can never leave
//! it half done.
//!
//! What this module cannot do: invent a function libc does not export. A missing symbol makes
//! the hook fail with `ENOSYS` (never a panic, never an abort of the host; docs/INTERPOSITION.md,
//! "Finding the real functions").

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

/// A lazily resolved pointer to the next definition of a symbol, whose name the caller gives.
///
/// Only the pointer lives here, starting null, so every hook's `Real` is in `.bss`. A name
/// kept beside it (a pointer in a writable static) would need a relocation: the dynamic
/// loader would then write, and so copy, the hook table's pages in every process at load,
/// whether or not any hook is ever called. The name is a constant the code refers to.
pub struct Real {
    ptr: AtomicPtr<c_void>,
}

impl Real {
    /// A not yet resolved symbol.
    pub const fn new() -> Real {
        Real { ptr: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// Whether the symbol has been looked up (one relaxed load).
    pub fn resolved(&self) -> bool {
        !self.ptr.load(Ordering::Relaxed).is_null()
    }

    /// The address of the next definition of `name`, or null when there is none.
    pub fn addr(&self, name: &CStr) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        // SAFETY: RTLD_NEXT with a NUL-terminated name is a valid dlsym call; the result is a
        // plain address (or null) that we only store.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        self.ptr.store(p, Ordering::Release);
        p
    }

    /// The next definition of `name` as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn` type whose signature matches the C declaration of
    /// `name`, and `name` must always be the same symbol for this `Real`.
    pub unsafe fn get<F: Copy>(&self, name: &CStr) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
        let p = self.addr(name);
        if p.is_null() {
            return None;
        }
        // SAFETY: F is a function pointer type of pointer size (asserted above) matching the
        // symbol's signature (the caller's obligation); p is that function's address.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

/// The value a hook returns when its real function is missing (after setting `ENOSYS`).
pub trait Missing {
    /// `-1` for integers, null for pointers.
    fn missing() -> Self;
}

impl Missing for libc::c_int {
    fn missing() -> Self {
        crate::guard::set_errno(libc::ENOSYS);
        -1
    }
}

impl Missing for libc::c_long {
    fn missing() -> Self {
        crate::guard::set_errno(libc::ENOSYS);
        -1
    }
}

impl Missing for isize {
    fn missing() -> Self {
        crate::guard::set_errno(libc::ENOSYS);
        -1
    }
}

/// `closefrom` returns nothing: the call simply does not happen.
impl Missing for () {
    fn missing() {}
}

/// `signal` and its aliases: `SIG_ERR`.
impl Missing for libc::sighandler_t {
    fn missing() -> Self {
        crate::guard::set_errno(libc::ENOSYS);
        libc::SIG_ERR
    }
}

impl<T> Missing for *mut T {
    fn missing() -> Self {
        crate::guard::set_errno(libc::ENOSYS);
        std::ptr::null_mut()
    }
}
