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

/// At most this many removals wait at once: one more waits for the oldest batch to be done
/// (the steps before the oldest removal still waiting are final, and printed).
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
        if let Some(mut r) = REMOVER.with(|r| r.borrow_mut().take())
            && let Some(r) = Rc::get_mut(&mut r)
        {
            r.jobs = None;
            if let Some(worker) = r.worker.take() {
                let _ = worker.join();
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
    // A full queue waits for its oldest batch only: waiting for all of it left the thread idle
    // while this one refilled it (an undo of 100,000 creations without redo took the time of
    // its checks and its removals added, not the longer of the two).
    while r.queued.borrow().len() >= MAX_QUEUED {
        if !r.collect_oldest() {
            break;
        }
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

/// Removes `name` from `dir` on this thread, its undo journal record written first.
fn unlink_now(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    super::redo::flush_held();
    rustix::fs::unlinkat(dir, name, AtFlags::empty())
}

/// Whether a step acting on `path` must wait for the removals queued: it is one of them, or
/// the directory of one.
pub(super) fn must_wait(path: &[u8]) -> bool {
    current().is_some_and(|r| {
        !r.queued.borrow().is_empty() && (r.paths.borrow().contains(path) || r.dirs.borrow().contains(path))
    })
}

/// The session's record whose undo queued the oldest removal not yet known to be done: the
/// steps taken before it are final, it and those after it may yet be failed by a removal.
/// `None` when nothing is queued.
pub(super) fn oldest_queued() -> Option<Option<u64>> {
    current().and_then(|r| r.queued.borrow().front().map(|f| f.step))
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

    /// Takes the thread's answer for the oldest batch handed over (handing over the removals
    /// not yet handed, if none was): its removals leave the queue, its failures are kept for
    /// [`take_failures`]. `false` when nothing was queued.
    fn collect_oldest(&self) -> bool {
        if self.queued.borrow().is_empty() {
            return false;
        }
        if self.sent.borrow().is_empty() {
            self.hand_over();
        }
        let mut queued = self.queued.borrow_mut();
        let mut failures = self.failures.borrow_mut();
        let n = self.sent.borrow_mut().pop_front();
        let (mut batch, failed) = match n.map(|n| (n, self.results.recv())) {
            Some((n, Ok(failed))) => {
                let n = n.min(queued.len());
                (queued.drain(..n).collect::<Vec<_>>(), failed)
            }
            // The thread is gone (it cannot be, short of a panic in `unlinkat`), or never took
            // them: what it has not said it did is not known to be done.
            _ => {
                let all: Vec<Failure> = queued.drain(..).collect();
                let failed = (0..all.len()).map(|i| (i, Errno::IO)).collect();
                (all, failed)
            }
        };
        let mut paths = self.paths.borrow_mut();
        for done in &batch {
            paths.remove(&done.path);
        }
        for (i, errno) in failed.into_iter().rev() {
            if i < batch.len() {
                let mut removal = batch.swap_remove(i);
                removal.errno = errno;
                failures.push(removal);
            }
        }
        true
    }
}

#[cfg(test)]
thread_local! {
    /// How many times [`wait`] found removals queued (a test counts them).
    pub(super) static WAITED_FOR_ALL: Cell<usize> = const { Cell::new(0) };
}

/// Waits until every removal queued is done (their failures are kept for [`take_failures`]).
pub(super) fn wait() {
    let Some(r) = current() else { return };
    #[cfg(test)]
    if !r.queued.borrow().is_empty() {
        WAITED_FOR_ALL.with(|w| w.set(w.get() + 1));
    }
    r.hand_over();
    while r.collect_oldest() {}
    r.sent.borrow_mut().clear();
    r.paths.borrow_mut().clear();
    r.dirs.borrow_mut().clear();
    // A directory's path may name another directory after the steps to come.
    *r.dir.borrow_mut() = None;
}

/// The removals found failed so far.
pub(super) fn take_failures() -> Vec<Failure> {
    current().map_or_else(Vec::new, |r| r.failures.take())
}
