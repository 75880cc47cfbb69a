//! The FFI half of every hook: the table of hooked symbols ([`table`]) and the machinery its
//! rows expand to.
//!
//! A libc symbol is one row of [`table`]: its C signature, how its real call is made, and the
//! handler that classifies it, with the handler's arguments written as expressions of the C
//! arguments (`creat(path, mode)` is `open_at(AT_FDCWD, path, O_WRONLY|O_CREAT|O_TRUNC)`). A
//! row expands to the exported `extern "C"` function, the lazily resolved original
//! ([`Real`]), and an entry in [`hook`], which the self-test walks to prove every symbol
//! resolves. A `syscall(2)` number is a row of the same table's second part, so the numbers
//! the `syscall` hook journals and the dispatch that routes them are one list.
//!
//! Every handler has the same shape, enforced by [`journaled`]: a fast path for calls that
//! cannot change anything (a flag test, a descriptor already known), then guard -> everything
//! the hook does itself (argument parsing, classification and capture), under
//! `catch_unwind` -> the real call, exactly once, outside the guard -> the outcome, with
//! errno restored to what the real call set.
//!
//! How the real call is made is a column of the table ([`Account`] says whether the shim
//! journaled the call): `libc` calls the next definition of the symbol; `kernel` makes the
//! system call itself, carrying the session's marker, when a supervisor watches the process
//! and the shim journaled the call (see [`crate::kernel`]); `pass` calls libc holding a pass,
//! for functions whose own system calls the shim cannot make.
//!
//! Never write to fds 0-2 here, never `print!`: the program may have closed or reused them.
//!
//! What this module cannot do: see calls glibc makes to itself without going through these
//! names (docs/INTERPOSITION.md, "Calls glibc makes to itself"); that is why wrappers such as `fopen`, `remove` and the
//! `mkstemp` family are hooked by their own names.

mod descriptors;
mod exec;
mod files;
mod net;
mod signals;
mod table;

use std::ffi::{CStr, c_char, c_int, c_long};
use std::panic::{AssertUnwindSafe, catch_unwind};

pub use exec::resolve_before_fork;
pub use table::{HOOK_COUNT, hook};

use crate::guard::{Guard, errno, set_errno};
use crate::ops::{self, Pending};
use crate::state::{Store, store};

/// A path argument, read only when a handler needs it: the read-only fast paths never
/// measure it. ABI-identical to `const char *`.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct CPath(*const c_char);

impl CPath {
    /// The path's bytes (`None` for null, which the real call rejects on its own).
    pub fn bytes<'a>(self) -> Option<&'a [u8]> {
        // SAFETY: a CPath is only ever a hooked call's own path argument (the exported
        // functions' parameters, or a `syscall` argument that its number makes a path), which
        // that call's contract makes null or a NUL-terminated string valid for the call.
        (!self.0.is_null()).then(|| unsafe { CStr::from_ptr(self.0) }.to_bytes())
    }

    /// A null path (a call that has none).
    pub const NONE: CPath = CPath(std::ptr::null());
}

/// Whether the shim has journaled the call it is about to make (or knows it needs nothing).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Account {
    /// Journaled (or needing nothing): under a supervisor the call is made so that the kernel
    /// lets it through (marked, or with a pass).
    Journaled,
    /// As the program made it: the shim did not journal it (no store, a panic, a call that
    /// reached the hook while the shim was busy), so a supervisor must see it.
    AsIs,
}

/// A value a hooked call returns, as a handler needs to judge it.
pub trait Ret: Sized {
    /// Whether the call succeeded.
    fn succeeded(&self) -> bool;
    /// The descriptor it returned, if it returns one.
    fn fd(&self) -> Option<c_int> {
        None
    }
    /// How the call fails when the strict policy refuses it: the value the program sees, with
    /// errno set.
    fn refused(errno: c_int) -> Self;
    /// A raw system call's result (a value, or -1 with errno set) as this type.
    fn from_sys(r: c_long) -> Self;
    /// A successful pointer result (`mkdtemp`'s template) as this type; integers have none.
    fn from_ptr<U>(p: *mut U) -> Self {
        let _ = p;
        Self::from_sys(0)
    }
}

impl Ret for c_int {
    fn succeeded(&self) -> bool {
        *self >= 0
    }
    fn fd(&self) -> Option<c_int> {
        (*self >= 0).then_some(*self)
    }
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        -1
    }
    fn from_sys(r: c_long) -> Self {
        r as c_int
    }
}

impl Ret for c_long {
    fn succeeded(&self) -> bool {
        *self >= 0
    }
    fn fd(&self) -> Option<c_int> {
        (*self >= 0).then_some(*self as c_int)
    }
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        -1
    }
    fn from_sys(r: c_long) -> Self {
        r
    }
}

impl Ret for isize {
    fn succeeded(&self) -> bool {
        *self >= 0
    }
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        -1
    }
    fn from_sys(r: c_long) -> Self {
        r as isize
    }
}

impl<T> Ret for *mut T {
    fn succeeded(&self) -> bool {
        !self.is_null()
    }
    fn refused(errno: c_int) -> Self {
        set_errno(errno);
        std::ptr::null_mut()
    }
    fn from_sys(_: c_long) -> Self {
        std::ptr::null_mut()
    }
    fn from_ptr<U>(p: *mut U) -> Self {
        p.cast()
    }
}

/// A C argument as a system call register: integers as the kernel reads them, pointers by
/// address.
pub trait Reg: Copy {
    /// The register value.
    fn reg(self) -> usize;
    /// The argument a `syscall(2)` caller passed in this register.
    fn from_reg(r: c_long) -> Self;
}

macro_rules! int_reg {
    ($($t:ty),*) => {$(
        impl Reg for $t {
            fn reg(self) -> usize {
                self as usize
            }
            fn from_reg(r: c_long) -> Self {
                r as $t
            }
        }
    )*};
}
int_reg!(i32, u32, i64, u64, usize);

impl<T> Reg for *const T {
    fn reg(self) -> usize {
        self as usize
    }
    fn from_reg(r: c_long) -> Self {
        r as usize as *const T
    }
}

impl<T> Reg for *mut T {
    fn reg(self) -> usize {
        self as usize
    }
    fn from_reg(r: c_long) -> Self {
        r as usize as *mut T
    }
}

impl Reg for CPath {
    fn reg(self) -> usize {
        self.0 as usize
    }
    fn from_reg(r: c_long) -> Self {
        CPath(r as usize as *const c_char)
    }
}

/// The five argument registers of a marked call (the sixth carries the marker).
pub fn regs(args: &[usize]) -> [usize; 5] {
    let mut r = [0; 5];
    for (slot, a) in r.iter_mut().zip(args) {
        *slot = *a;
    }
    r
}

/// The counters page of the process's store, if it has one open (for a pass; never opens it).
pub fn open_counters() -> Option<&'static crate::state::SharedCounters> {
    crate::state::published_store().map(|s| &s.counters)
}

/// Whether a supervisor watches this process (the shim then makes some calls itself, marked,
/// where libc's own would be unmarked).
#[inline(always)]
pub fn supervised() -> bool {
    crate::kernel::mark() != 0 && crate::state::config().supervised
}

/// Makes a libc call whose own system calls the shim cannot mark: holding a pass when the
/// shim journaled it and a supervisor watches (see [`crate::kernel::with_pass`]).
#[inline(always)]
pub fn passing<R>(account: Account, call: impl FnOnce() -> R) -> R {
    if account == Account::Journaled
        && crate::kernel::mark() != 0
        && let Some(c) = open_counters()
    {
        return crate::kernel::with_pass(c, call);
    }
    call()
}

/// Defines a hook module's `NAME`: the symbol's name, which its first call looks up with
/// `dlsym` (the loader then reads it).
///
/// The bytes are a static in `.rodata.aether_journal.names`, which shim/startup.ld puts right
/// after the dynamic symbols' names, in the first 64 KiB of the image: the loader reads that
/// window (the headers, the symbol tables) in every process, so the kernel has mapped it
/// already. Left among the other constants, the names were spread over three pages of a window
/// of their own: a page fault in nearly every process that called a hook.
macro_rules! hook_name {
    ($name:ident) => {
        const SPELLED: &str = concat!(stringify!($name), "\0");
        #[cfg_attr(not(test), unsafe(link_section = ".rodata.aether_journal.names"))]
        static BYTES: [u8; SPELLED.len()] = $crate::hooks::spelled(SPELLED);
        pub const NAME: &::std::ffi::CStr = match ::std::ffi::CStr::from_bytes_with_nul(&BYTES) {
            Ok(c) => c,
            Err(_) => panic!("hook names never contain NUL"),
        };
    };
}
pub(crate) use hook_name;

/// `s` as an array of exactly its length (`N`), for [`hook_name`]'s static (evaluated when
/// the shim is compiled).
pub(crate) const fn spelled<const N: usize>(s: &str) -> [u8; N] {
    match s.as_bytes().first_chunk::<N>() {
        Some(bytes) => *bytes,
        None => panic!("N is the name's length"),
    }
}

/// Expands the table of libc symbols: one row per exported function.
///
/// ```text
/// fn NAME(ARG: TYPE, ...; ...VARIADIC: TYPE) -> RET [REAL] => HANDLER(EXPR, ...);
/// ```
///
/// `REAL` is `libc` (the next definition of NAME), `pass` (the same, holding a pass when the
/// shim journaled the call under a supervisor), or `kernel NR(EXPR, ...)` (under a supervisor,
/// when the shim journaled the call: the system call NR with these arguments, marked; else
/// libc). A `; ...NAME: TYPE` tail is the variadic `mode` of the open family (see the SAFETY
/// note in the expansion). The handler is called with the symbol's name, the real call (an
/// `FnOnce(Account) -> RET`), and the expressions, in which the arguments' names are in scope.
macro_rules! libc_hooks {
    ($(
        $(#[$meta:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(; ... $va:ident : $vty:ty)? ) -> $ret:ty
            [ $($real:tt)+ ] => $handler:ident ( $($harg:expr),* $(,)? );
    )*) => {
        $(
            #[allow(non_snake_case)]
            pub mod $name {
                $crate::hooks::hook_name!($name);
                // With the other statics hooks write (shim/startup.ld).
                #[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
                pub static REAL: $crate::real::Real = $crate::real::Real::new();
            }

            $(#[$meta])*
            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($($arg: $ty,)* $($va: $vty)?) -> $ret {
                type RealFn = unsafe extern "C" fn($($ty,)* $($vty)?) -> $ret;
                // SAFETY: RealFn is the C signature of this very symbol, as written in its row.
                // For a row with a variadic tail (the open family's `mode`) it declares that
                // argument as a fixed one: on the x86-64 and AArch64 Linux ABIs an integer
                // passed through `...` travels in the same register or stack slot a fixed
                // argument in its place would, so reading it as one reads exactly what the
                // caller passed (meaningless when the flags do not ask for a mode, and then
                // ignored by libc and the kernel alike).
                match unsafe { $name::REAL.get::<RealFn>($name::NAME) } {
                    Some(real_fn) => {
                        // FnOnce: the handler can call it at most once, and every handler calls
                        // it exactly once (or refuses the call under the strict policy).
                        let real = move |account: $crate::hooks::Account| -> $ret {
                            $crate::hooks::real_call!([$($real)+] account, real_fn, ($($arg,)* $($va)?))
                        };
                        $handler(stringify!($name), real, $($harg),*)
                    }
                    None => <$ret as $crate::real::Missing>::missing(),
                }
            }
        )*

        /// The number of libc symbols hooked.
        const LIBC_HOOK_COUNT: usize = [$(stringify!($name)),*].len();

        /// Calls `visit` with each hooked libc symbol in table order (its name and its
        /// [`Real`]) until it returns false; false if it did. See [`table::each_hook`].
        fn each_libc_hook(visit: &mut $crate::hooks::table::Visit<'_>) -> bool {
            $(
                if !visit($name::NAME, &$name::REAL) {
                    return false;
                }
            )*
            true
        }
    };
}

/// How a row's real call is made (see [`libc_hooks`]).
macro_rules! real_call {
    ([libc] $account:ident, $f:ident, ($($a:expr),* $(,)?)) => {{
        let _ = $account;
        // SAFETY: the caller's own arguments, unchanged, to the function they were meant for.
        unsafe { $f($($a),*) }
    }};
    ([pass] $account:ident, $f:ident, ($($a:expr),* $(,)?)) => {{
        // SAFETY: the caller's own arguments, unchanged, to the function they were meant for.
        let call = move || unsafe { $f($($a),*) };
        $crate::hooks::passing($account, call)
    }};
    ([kernel $nr:ident ( $($k:expr),* ) $(if $cond:expr)?] $account:ident, $f:ident, ($($a:expr),* $(,)?)) => {{
        if $account == $crate::hooks::Account::Journaled && $crate::kernel::mark() != 0 $(&& $cond)? {
            use $crate::hooks::Reg as _;
            // SAFETY: the system call this libc function makes, with the arguments it derives
            // from the caller's (the row's `kernel` column).
            let r = unsafe { $crate::kernel::libc_style(libc::$nr, $crate::hooks::regs(&[$($k.reg()),*])) };
            $crate::hooks::Ret::from_sys(r)
        } else {
            // Without a supervisor, or when the shim did not journal the call, or when the
            // row's condition sends it to libc: libc's own function (holding a pass if the
            // call was journaled).
            // SAFETY: the caller's own arguments, unchanged, to the function they were meant for.
            let call = move || unsafe { $f($($a),*) };
            $crate::hooks::passing($account, call)
        }
    }};
}

/// Expands the `syscall(2)` part of the table: one row per number the `syscall` hook
/// journals or keeps track of.
///
/// ```text
/// sys NR(ARG: TYPE, ...) [REAL] => HANDLER(EXPR, ...);
/// ```
///
/// `REAL` is `kernel` (under a supervisor, when the shim journaled the call: the same system
/// call, marked; else libc's `syscall`) or `libc` (libc's `syscall`, always). The arguments are
/// the caller's registers, in order, as the row's types.
macro_rules! syscall_hooks {
    ($(
        $(#[$meta:meta])*
        sys $nr:ident ( $($arg:ident : $ty:ty),* $(,)? ) [ $real:ident ] => $handler:ident ( $($harg:expr),* $(,)? );
    )*) => {
        /// Whether `syscall(nr, ...)` is one of the rows (the others go straight to libc).
        #[inline(always)]
        pub fn syscall_row(nr: c_long) -> bool {
            match nr {
                $( $(#[$meta])* libc::$nr => true, )*
                _ => false,
            }
        }

        /// The numbers of the rows (for the self-test).
        #[cfg(test)]
        pub const SYSCALL_ROWS: &[(&str, c_long)] = &[$( $(#[$meta])* (stringify!($nr), libc::$nr), )*];

        /// Routes `syscall(nr, a...)` to its row's handler; `real` is libc's `syscall` with the
        /// caller's arguments.
        #[allow(unused_variables, unused_mut)]
        pub fn dispatch(real: impl FnOnce() -> c_long, nr: c_long, a: [c_long; 6]) -> c_long {
            match nr {
                $(
                    $(#[$meta])*
                    libc::$nr => {
                        let mut regs = a.into_iter();
                        $( let $arg: $ty = $crate::hooks::Reg::from_reg(regs.next().unwrap_or(0)); )*
                        let real = move |account: $crate::hooks::Account| -> c_long {
                            $crate::hooks::syscall_real!($real account, real, libc::$nr, a)
                        };
                        $handler("syscall", real, $($harg),*)
                    }
                )*
                _ => real(),
            }
        }
    };
}

/// How a `syscall(2)` row's real call is made (see [`syscall_hooks`]).
macro_rules! syscall_real {
    (libc $account:ident, $real:ident, $nr:expr, $a:ident) => {{
        let _ = $account;
        $real()
    }};
    (pass $account:ident, $real:ident, $nr:expr, $a:ident) => {{ $crate::hooks::passing($account, $real) }};
    (kernel $account:ident, $real:ident, $nr:expr, $a:ident) => {{
        if $account == $crate::hooks::Account::Journaled && $crate::kernel::mark() != 0 {
            let r5 = [$a[0] as usize, $a[1] as usize, $a[2] as usize, $a[3] as usize, $a[4] as usize];
            // SAFETY: the caller's own system call and arguments (the sixth, which none of the
            // rows' calls uses, carries the marker instead).
            unsafe { $crate::kernel::libc_style($nr, r5) }
        } else {
            $real()
        }
    }};
}

/// Expands the variadic exec functions: exported as naked trampolines that jump, with every
/// register and stack slot as the caller left them, to their bodies in C (`variadic.c`: stable
/// Rust cannot define a C-variadic function), which collect the arguments as glibc does and
/// call the hooked `execv`, `execvp` or `execve`. Each has a [`Real`] too, for the self-test.
macro_rules! variadic_hooks {
    ($( fn $name:ident(...) => $body:ident; )*) => {
        unsafe extern "C" {
            $( fn $body(); )*
        }
        $(
            #[allow(non_snake_case)]
            pub mod $name {
                $crate::hooks::hook_name!($name);
                // With the other statics hooks write (shim/startup.ld).
                #[cfg_attr(not(test), unsafe(link_section = ".bss.aether_journal.hot"))]
                pub static REAL: $crate::real::Real = $crate::real::Real::new();
            }

            /// Exported variadic exec: jumps to its C body.
            #[cfg(not(test))]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!("jmp {}", sym $body);
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!("b {}", sym $body);
            }
        )*

        /// The number of variadic symbols hooked.
        const VARIADIC_HOOK_COUNT: usize = [$(stringify!($name)),*].len();

        /// The variadic symbols: as `each_libc_hook`.
        fn each_variadic_hook(visit: &mut $crate::hooks::table::Visit<'_>) -> bool {
            $(
                if !visit($name::NAME, &$name::REAL) {
                    return false;
                }
            )*
            true
        }
    };
}

use libc_hooks;
pub(crate) use real_call;
use syscall_hooks;
pub(crate) use syscall_real;
use variadic_hooks;

use crate::real::Real;

/// Runs the shim's bookkeeping around one real call.
///
/// `pre` does everything the hook does itself before the call (reading its arguments,
/// classifying, capturing: under the guard and `catch_unwind`); `real` is then called exactly
/// once, with the guard released and errno as the caller left it, unless the strict policy
/// refused the call; `outcome` sees whether it succeeded. A panic in `pre` is journaled as an
/// irreversible step naming `name` (read only then, and for the test suite's fault injection).
pub fn journaled<R: Ret>(
    call: &'static str,
    name: CPath,
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce(Account) -> R,
) -> R {
    journaled_unless(call, name, || false, pre, real)
}

/// [`journaled`], except that a call `outside` says leaves the journaled world alone (judged
/// under the guard and `catch_unwind`, before the store is opened) is made as the shim's own
/// without journaling anything, as it would be once `pre` had found the same: no process pays
/// for a store it would not write to.
pub fn journaled_unless<R: Ret>(
    call: &'static str,
    name: CPath,
    outside: impl FnOnce() -> bool,
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce(Account) -> R,
) -> R {
    journaled_with(call, name, outside, pre, real, |r| (r.succeeded(), r.fd()), R::refused)
}

/// [`journaled_unless`] for calls that judge their result or report refusal their own way
/// (stdio's `FILE *`, posix_fallocate's returned error number).
pub fn journaled_with<R>(
    call: &'static str,
    name: CPath,
    outside: impl FnOnce() -> bool,
    pre: impl FnOnce(&'static Store) -> Pending,
    real: impl FnOnce(Account) -> R,
    outcome: impl FnOnce(&R) -> (bool, Option<c_int>),
    refused: impl FnOnce(c_int) -> R,
) -> R {
    let (pending, account) = before_call(call, name, outside, pre);
    if let Some((_, Pending::Refuse(errno))) = pending {
        return refused(errno);
    }
    let result = real(account);
    if let Some((store, pending)) = pending
        && !matches!(pending, Pending::Nothing)
    {
        let err = errno();
        let (ok, fd) = outcome(&result);
        // Most outcomes need nothing, or only lock-free work: no guard for those.
        if let Some(pending) = ops::after_quick(store, pending, ok, fd)
            && let Some(guard) = Guard::enter()
        {
            let _ = catch_unwind(AssertUnwindSafe(|| ops::after(store, call, pending, ok, err, fd)));
            drop(guard);
        }
        set_errno(err);
    }
    result
}

/// The part of [`journaled_with`] before the real call: `pre` under the guard, and how the
/// real call must be made.
fn before_call(
    call: &'static str,
    name: CPath,
    outside: impl FnOnce() -> bool,
    pre: impl FnOnce(&'static Store) -> Pending,
) -> (Option<(&'static Store, Pending)>, Account) {
    let Some(guard) = Guard::enter() else {
        return (None, busy_account());
    };
    let saved = errno();
    if catch_unwind(AssertUnwindSafe(outside)).unwrap_or(false) {
        drop(guard);
        set_errno(saved);
        return (None, Account::Journaled);
    }
    let pending = catch_unwind(AssertUnwindSafe(|| {
        store().map(|s| {
            injected_fault(name);
            (s, pre(s))
        })
    }))
    .unwrap_or_else(|payload| {
        let _ = catch_unwind(AssertUnwindSafe(|| record_panic(call, name, payload)));
        None
    });
    drop(guard);
    set_errno(saved);
    let account = match &pending {
        Some((_, Pending::NotJournaled)) | None => Account::AsIs,
        Some(_) => Account::Journaled,
    };
    (pending, account)
}

/// A hook entered while this thread is already inside the shim: the shim's own calls, which
/// mean to pass through (and, being the shim's own work, are marked), or a signal handler that
/// interrupted its bookkeeping, which cannot be journaled now: counted as lost, unless a
/// supervisor watches the process and journals it instead.
fn busy_account() -> Account {
    if crate::alloc::in_persistent() {
        return Account::Journaled;
    }
    if crate::kernel::mark() == 0 {
        crate::state::note_unjournaled();
    }
    Account::AsIs
}

/// Bookkeeping that can only happen after a real call (names the call chose): under the guard
/// and `catch_unwind`, with errno preserved.
pub fn after_call(call: &'static str, work: impl FnOnce()) {
    let err = errno();
    let guard = Guard::enter();
    if guard.is_none() && !crate::alloc::in_persistent() {
        crate::state::note_unjournaled();
    }
    if let Some(guard) = guard {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(work)) {
            let _ = catch_unwind(AssertUnwindSafe(|| record_panic(call, CPath::NONE, payload)));
        }
        drop(guard);
    }
    set_errno(err);
}

/// The test suite's fault injection (see [`crate::state::Config::test_fault`]).
fn injected_fault(name: CPath) {
    if let Some(f) = crate::state::config().test_fault.as_deref()
        && name.bytes().is_some_and(|p| p.ends_with(f))
    {
        panic!("fault injected by AETHER_JOURNAL_TEST_FAULT");
    }
}

/// The test suite's kill injection (see [`crate::state::Config::test_fault`]).
fn injected_kill_after(call: &str) {
    let fault = crate::state::config().test_fault.as_deref();
    if fault.and_then(|f| f.strip_prefix(b"kill-after-call:")) == Some(call.as_bytes()) {
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}

fn record_panic(call: &str, name: CPath, payload: Box<dyn std::any::Any + Send>) {
    if crate::state::config().supervised {
        // The call goes to the kernel unmarked: the supervisor journals it instead.
        return;
    }
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    if let Some(s) = store() {
        let before = journal_core::Before::irreversible(journal_core::Reason::Internal { message });
        let path = name.bytes().unwrap_or_default().to_vec();
        s.record(call, journal_core::Op::Change { path: journal_core::BPath::new(path), before });
    }
}

/// The self-test's view of the whole table: every hooked symbol, the variadic ones included.
pub fn all_hooks() -> impl Iterator<Item = (&'static CStr, &'static Real)> {
    table::all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_row_is_routed_and_no_other_number_is() {
        for &(name, nr) in table::SYSCALL_ROWS {
            assert!(table::syscall_row(nr), "{name} is a row");
        }
        // A number no row names goes straight to the real call.
        assert!(!table::syscall_row(libc::SYS_getpid));
        assert!(!table::syscall_row(libc::SYS_futex));
        let r = table::dispatch(|| 42, libc::SYS_getpid, [0; 6]);
        assert_eq!(r, 42);
        let mut seen = std::collections::HashSet::new();
        for &(name, nr) in table::SYSCALL_ROWS {
            assert!(seen.insert(nr), "{name} has one row");
        }
    }

    #[test]
    fn a_marked_call_gets_five_argument_registers_padded_with_zeroes() {
        assert_eq!(regs(&[1, 2, 3]), [1, 2, 3, 0, 0]);
        assert_eq!(regs(&[]), [0; 5]);
    }
}
