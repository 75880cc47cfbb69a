//! Serving a listener: a few worker threads take turns receiving notifications; the one that
//! receives a notification journals and answers it, while the next one waits for the next.
//!
//! # Rationale
//! Leader and followers: the thread that received a call handles it itself, so no hand-over
//! to another thread (a wake-up on a two-CPU machine costs as much as the rest of a round
//! trip) sits between the call and its answer. Only the leader, holding the receive lock,
//! waits on the listener: a `SECCOMP_IOCTL_NOTIF_RECV` made after the last watched thread has
//! gone blocks for ever, so only a thread that has just seen the listener readable may make
//! it. More than one worker lets other threads' calls proceed while a capture takes long (a
//! copy of a big file), but on two CPUs extra workers only contend (a round trip: 7.5 us with
//! one, 14.8 with three), so `run` starts one; the count is a parameter.
//!
//! What this module cannot do: answer calls once the supervisor process has died. The kernel
//! then fails every watched call with `ENOSYS` in the program, so nothing changes unjournaled
//! (README, "Coverage: the supervisor").

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::handle::{Abandoned, Counts, Worker};
use crate::listener::Listener;
use crate::store::Store;

/// Serves `listener` with `workers` workers until every watched thread has gone; returns what
/// they did. The counts are also kept, live, in the session's counters page (see
/// [`aether_journal::internal::counters::SLOT_NOTIFIED`]), where the test suite reads them.
pub fn serve(listener: &Listener, store: &Store, workers: usize) -> Counts {
    let receiving = Mutex::new(());
    let done = AtomicBool::new(false);
    let abandoned: Abandoned = Mutex::new(std::collections::HashMap::new());
    let changes = crate::dirs::Changes::default();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut w = Worker::new(store, &abandoned, &changes);
                    loop {
                        let next = {
                            let Ok(_turn) = receiving.lock() else { break };
                            if done.load(Ordering::Acquire) {
                                break;
                            }
                            listener.recv()
                        };
                        match next {
                            Ok(Some(n)) => w.serve(listener, &n),
                            // Every watched thread has gone (or the listener failed).
                            Ok(None) | Err(_) => {
                                done.store(true, Ordering::Release);
                                break;
                            }
                        }
                    }
                    w.counts
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .fold(Counts::default(), |a, c| Counts { notified: a.notified + c.notified, passed: a.passed + c.passed })
    })
}
