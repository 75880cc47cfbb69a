//! Removals of files made by a thread of their own, while the undo goes on to its next steps.
//!
//! An undo of many creations spends most of its time in `unlinkat`, and the rest (checking
//! each path, journaling what it removes for `redo`) can run beside it: an undo that hands
//! each file's removal to this thread, after its checks and its record, ends in about the time
//! of the removals alone (and two threads removing from one directory overlap part of the
//! kernel's work too). The order the undo's steps are taken in is kept: a step that does
//! anything but remove a file, or that names a path (or the directory of a path) still waiting
//! to be removed, waits for every removal queued before it ([`must_wait`], [`wait`]).
//!
//! A removal that fails (a file made immutable since, a read-only mount) is reported where it
//! was queued, once the executor collects it ([`take_failures`]): until then, no step after the
//! oldest removal still queued is printed as done.
//!
//! What this module cannot do: remove a directory (a directory is removed in order, once the
//! removals before it are done), or remove anything in a dry run (which acts on an overlay).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::sync::{Arc, mpsc};

use rustix::fs::AtFlags;
use rustix::io::Errno;

/// At most this many removals wait at once: the steps before the oldest one are printed when
/// they are done, so a long run of removals is printed in pieces of this many.
pub(super) const MAX_QUEUED: usize = 4096;

/// Removals are handed to the thread this many at a time: one at a time, waking it for each
/// cost more than the removals saved.
const BATCH: usize = 128;

/// A removal that failed, and where it was queued.
pub(super) struct Failure {
    /// The session's record whose undo queued it.
    pub(super) step: Option<u64>,
    /// The path that was to be removed.
    pub(super) path: Vec<u8>,
    /// The record the undo's own journal holds for it (to be taken back).
    pub(super) logged: Option<u64>,
    pub(super) errno: Errno,
}

/// A directory's path, and a descriptor of it the thread can use.
type SharedDir = (Rc<[u8]>, Arc<OwnedFd>);

/// Removals handed over at once: each name, in its directory.
type Batch = Vec<(Arc<OwnedFd>, Vec<u8>)>;

struct Remover {
    jobs: Option<mpsc::Sender<Batch>>,
    /// For each batch, in order, the failed removals in it (by position).
    results: mpsc::Receiver<Vec<(usize, Errno)>>,
    /// The removals not yet handed over.
    batch: RefCell<Batch>,
    /// How many queued removals were handed over, in batches of these sizes.
    sent: RefCell<std::collections::VecDeque<usize>>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// The removals queued, oldest first (the thread makes them in this order).
    queued: RefCell<std::collections::VecDeque<Failure>>,
    /// The directory of the last removal queued, shared with the thread.
    dir: RefCell<Option<SharedDir>>,
    /// The paths queued, and their directories.
    paths: RefCell<HashSet<Vec<u8>>>,
    dirs: RefCell<HashSet<Rc<[u8]>>>,
    failures: RefCell<Vec<Failure>>,
    /// The session's record being undone.
    step: Cell<Option<u64>>,
    /// Whether its removals may be queued (its undo does nothing but remove its path).
    may_queue: Cell<bool>,
}

thread_local! {
    static REMOVER: RefCell<Option<Rc<Remover>>> = const { RefCell::new(None) };
}

fn current() -> Option<Rc<Remover>> {
    REMOVER.with(|r| r.borrow().clone())
}

/// While this lives, files removed on this thread by [`unlink`] are removed by another one.
pub(super) struct Started(());

/// Starts the removal thread for the undo running on this thread. `None` when it cannot be
/// started (removals are then made in place, as without it).
pub(super) fn start() -> Option<Started> {
    let (jobs, inbox) = mpsc::channel::<Batch>();
    let (outbox, results) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("undo-remover".into())
        .spawn(move || {
            for batch in inbox {
                let failed: Vec<(usize, Errno)> = batch
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (dir, name))| {
                        rustix::fs::unlinkat(dir.as_fd(), name.as_slice(), AtFlags::empty()).err().map(|e| (i, e))
                    })
                    .collect();
                if outbox.send(failed).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    let remover = Remover {
        jobs: Some(jobs),
        results,
        batch: RefCell::new(Vec::with_capacity(BATCH)),
        sent: Default::default(),
        worker: Some(worker),
        queued: Default::default(),
        dir: RefCell::new(None),
        paths: Default::default(),
        dirs: Default::default(),
        failures: Default::default(),
        step: Cell::new(None),
        may_queue: Cell::new(false),
    };
    REMOVER.with(|r| *r.borrow_mut() = Some(Rc::new(remover)));
    Some(Started(()))
}

impl Drop for Started {
    fn drop(&mut self) {
        wait();
        if let Some(mut r) = REMOVER.with(|r| r.borrow_mut().take()) {
            if let Some(r) = Rc::get_mut(&mut r) {
                r.jobs = None;
                if let Some(worker) = r.worker.take() {
                    let _ = worker.join();
                }
            }
        }
    }
}

/// The session's record being undone from now on, and whether its removals may be queued: only
/// a step that does nothing after its removal may go on before it is made.
pub(super) fn set_step(step: Option<u64>, may_queue: bool) {
    if let Some(r) = current() {
        r.step.set(step);
        r.may_queue.set(may_queue);
    }
}

/// Removes the non-directory `name` from `dir` (at `path`): queued when the removal thread
/// runs and the step allows it (the result is then `Ok`, and a failure comes later from
/// [`take_failures`]), made here otherwise. `logged` is the undo journal's record of it, if
/// it has one.
pub(super) fn unlink(path: &Rc<[u8]>, dir: BorrowedFd<'_>, name: &[u8], logged: Option<u64>) -> Result<(), Errno> {
    let Some(r) = current().filter(|r| r.may_queue.get()) else {
        return unlink_now(dir, name);
    };
    if r.jobs.is_none() {
        return unlink_now(dir, name);
    }
    if r.queued.borrow().len() >= MAX_QUEUED {
        wait();
    }
    let shared = {
        let mut last = r.dir.borrow_mut();
        match &*last {
            Some((p, fd)) if p == path => fd.clone(),
            _ => match rustix::io::fcntl_dupfd_cloexec(dir, 0) {
                Ok(fd) => last.insert((path.clone(), Arc::new(fd))).1.clone(),
                Err(_) => return unlink_now(dir, name),
            },
        }
    };
    let full = crate::bpath::join(path, name);
    let full_batch = {
        let mut batch = r.batch.borrow_mut();
        batch.push((shared, name.to_vec()));
        batch.len() >= BATCH
    };
    if full_batch {
        r.hand_over();
    }
    r.queued.borrow_mut().push_back(Failure { step: r.step.get(), path: full.clone(), logged, errno: Errno::IO });
    r.paths.borrow_mut().insert(full);
    r.dirs.borrow_mut().insert(path.clone());
    Ok(())
}

impl Remover {
    /// Hands the removals not yet handed over to the thread.
    fn hand_over(&self) {
        let batch = self.batch.take();
        let n = batch.len();
        if n == 0 {
            return;
        }
        // Their records first: a removal is never made before its record is written.
        super::redo::flush_held();
        // (Should the thread be gone, its receiver is, and [`wait`] finds every removal of
        // this batch not done.)
        if self.jobs.as_ref().is_some_and(|jobs| jobs.send(batch).is_ok()) {
            self.sent.borrow_mut().push_back(n);
        }
    }
}

/// Removes `name` from `dir` on this thread, its undo journal record written first.
fn unlink_now(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    super::redo::flush_held();
    rustix::fs::unlinkat(dir, name, AtFlags::empty())
}

/// How many removals are queued and not yet known to be done.
pub(super) fn queued() -> usize {
    current().map_or(0, |r| r.queued.borrow().len())
}

/// Whether a step acting on `path` must wait for the removals queued: it is one of them, or
/// the directory of one.
pub(super) fn must_wait(path: &[u8]) -> bool {
    current().is_some_and(|r| {
        !r.queued.borrow().is_empty() && (r.paths.borrow().contains(path) || r.dirs.borrow().contains(path))
    })
}

/// Waits until every removal queued is done (their failures are kept for [`take_failures`]).
pub(super) fn wait() {
    let Some(r) = current() else { return };
    r.hand_over();
    let mut queued = r.queued.borrow_mut();
    let mut failures = r.failures.borrow_mut();
    while !queued.is_empty() {
        let n = r.sent.borrow_mut().pop_front();
        match n.map(|n| (n, r.results.recv())) {
            Some((n, Ok(failed))) => {
                let n = n.min(queued.len());
                let mut batch: Vec<Failure> = queued.drain(..n).collect();
                for (i, errno) in failed.into_iter().rev() {
                    if i < batch.len() {
                        let mut removal = batch.swap_remove(i);
                        removal.errno = errno;
                        failures.push(removal);
                    }
                }
            }
            // The thread is gone (it cannot be, short of a panic in `unlinkat`), or never took
            // them: what it has not said it did is not known to be done.
            _ => failures.extend(queued.drain(..)),
        }
    }
    r.sent.borrow_mut().clear();
    drop((queued, failures));
    r.paths.borrow_mut().clear();
    r.dirs.borrow_mut().clear();
    // A directory's path may name another directory after the steps to come.
    *r.dir.borrow_mut() = None;
}

/// The removals found failed so far.
pub(super) fn take_failures() -> Vec<Failure> {
    current().map_or_else(Vec::new, |r| r.failures.take())
}
