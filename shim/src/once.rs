//! A value a process builds once and keeps for good (the configuration, the store, the
//! session's shared tables): published lock-free, never freed.
//!
//! # Rationale
//! Each is built on first use, which may be on any thread, inside a signal handler, or in a
//! thread that another thread's `fork` copies midway: a `OnceLock` would leave a child of such a
//! fork waiting for a build that never finishes there (measured: a wedged child of a threaded
//! program). Here, threads that race each build one, the first to publish wins, and the others
//! drop theirs. Values are built and boxed in [`crate::alloc::permanent`] memory, safe in a
//! signal handler that interrupted the program's own `malloc`.
//!
//! What this cannot do: free a published value (a process keeps it until it exits or execs),
//! or stop a racing builder's side effects (a loser's descriptors are closed by its drop; a
//! mapping whose type does not unmap on drop stays mapped).

use std::sync::atomic::{AtomicPtr, Ordering};

/// A value published at most once.
pub struct Leaked<T> {
    ptr: AtomicPtr<T>,
}

impl<T> Leaked<T> {
    /// Nothing published yet.
    pub const fn new() -> Leaked<T> {
        Leaked { ptr: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// The value, if one is published: one atomic load, no system call.
    pub fn get(&self) -> Option<&T> {
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here came from `Box::into_raw` in `publish` and is never
        // freed, so it is valid for as long as `self` is.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The value, built by `make` (in permanent memory) if none is published yet.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &T {
        match self.get() {
            Some(v) => v,
            None => self.publish(crate::alloc::permanent(make)),
        }
    }

    /// The value, built by `make` (in permanent memory) if none is published yet; `None` when
    /// `make` could not build one.
    pub fn get_or_try_init(&self, make: impl FnOnce() -> Option<T>) -> Option<&T> {
        if let Some(v) = self.get() {
            return Some(v);
        }
        Some(self.publish(crate::alloc::permanent(make)?))
    }

    /// Publishes `value` unless another was first, and returns whichever is published (`value`
    /// is then dropped, in permanent memory's scope). Only the box is made here: what `value`
    /// owns (a path, a buffer) must not be in a hook's arena, where it would stay live for good
    /// and keep the arena from ever starting over (every later hook's allocations on fresh
    /// pages). Build it with [`Leaked::get_or_init`], under [`crate::alloc::permanent`], or,
    /// as the constructor does, under [`crate::alloc::persistent`].
    pub fn publish(&self, value: T) -> &T {
        let fresh = crate::alloc::permanent(|| Box::into_raw(Box::new(value)));
        match self.ptr.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: `fresh` is a leaked Box, now published and never freed.
            Ok(_) => unsafe { &*fresh },
            Err(winner) => {
                // SAFETY: `fresh` came from Box::into_raw above and was never shared.
                crate::alloc::permanent(|| drop(unsafe { Box::from_raw(fresh) }));
                // SAFETY: the winner's pointer is a published Box, never freed.
                unsafe { &*winner }
            }
        }
    }
}
