//! Serving a listener: one thread receives notifications, a few workers journal and answer
//! them, until every watched thread has gone.
//!
//! # Rationale
//! One receiver: a `SECCOMP_IOCTL_NOTIF_RECV` made after the last watched thread has gone
//! blocks for ever, so only a thread that has just seen the listener readable may make it, and
//! two threads woken by the same notification would leave one of them blocked. Several workers:
//! a capture can take long (a copy of a big file), and other threads' calls must not wait for
//! it.
//!
//! What this module cannot do: answer calls once the supervisor process has died. The kernel
//! then fails every watched call with `ENOSYS` in the program, so nothing changes unjournaled
//! (README, "What the supervisor changes for programs").

use std::sync::Mutex;
use std::sync::mpsc;

use crate::handle::{Counts, Worker};
use crate::listener::{Listener, Notification};
use crate::store::Store;

/// Serves `listener` with `workers` workers until every watched thread has gone; returns what
/// they did. The counts are also kept, live, in the session's counters page (see
/// [`aether_journal::session::SLOT_NOTIFIED`]), where the test suite reads them.
pub fn serve(listener: &Listener, store: &Store, workers: usize) -> Counts {
    let (tx, rx) = mpsc::sync_channel::<Notification>(256);
    let rx = Mutex::new(rx);
    let abandoned = Mutex::new(std::collections::HashMap::new());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut w = Worker::new(store, &abandoned);
                    loop {
                        let next = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => break,
                        };
                        let Ok(n) = next else { break };
                        w.serve(listener, &n);
                    }
                    w.counts
                })
            })
            .collect();
        while let Ok(Some(n)) = listener.recv() {
            if tx.send(n).is_err() {
                break;
            }
        }
        drop(tx);
        handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .fold(Counts::default(), |a, c| Counts { notified: a.notified + c.notified, passed: a.passed + c.passed })
    })
}
