//! Serving a listener: a few worker threads take turns receiving notifications; the one that
//! receives a notification journals and answers it, while the next one waits for the next.
//!
//! # Rationale
//! Leader and followers: the thread that received a call handles it itself, so no hand-over
//! to another thread (a wake-up on a two-CPU machine costs as much as the rest of a round
//! trip) sits between the call and its answer. Only the leader, holding the receive lock,
//! waits on the listener. More than one worker lets other threads' calls proceed while a
//! capture takes long (a copy of a big file), but on two CPUs extra workers only contend (a
//! round trip: 7.5 us with one, 14.8 with three), so `run` starts one; the count is a
//! parameter.
//!
//! The supervisor process, which reaps every process of the session, ends once it has reaped
//! the last (`launch.rs`), without waiting for its workers. Since Linux 6.6 a worker learns
//! that the last watched thread has gone (its receive fails at once, the listener hung up) and
//! ends; before 6.6 its receive waits for ever (a `poll` for the hang-up before each receive
//! would cost every notification a system call), and it ends with the process.
//!
//! What this module cannot do: answer calls once the supervisor process has died. The kernel
//! then fails every watched call with `ENOSYS` in the program, so nothing changes unjournaled
//! (README, "Coverage: the supervisor").

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::handle::{Abandoned, Worker};
use crate::listener::Listener;
use crate::store::Store;

/// Serves `listener` with `workers` workers until the listener fails or, where the kernel
/// says so, the watched threads have all gone (before Linux 6.6 it does not return then: see
/// the module documentation). The counts are kept, live, in
/// the session's counters page (see [`aether_journal::internal::counters::SLOT_NOTIFIED`]),
/// where the test suite reads them.
pub fn serve(listener: &Listener, store: &Store, workers: usize) {
    let receiving = Mutex::new(());
    let failed = AtomicBool::new(false);
    let abandoned: Abandoned = Mutex::new(std::collections::HashMap::new());
    let changes = crate::dirs::Changes::default();
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| {
                let mut w = Worker::new(store, &abandoned, &changes);
                loop {
                    let next = {
                        let Ok(_turn) = receiving.lock() else { break };
                        if failed.load(Ordering::Acquire) {
                            break;
                        }
                        listener.recv()
                    };
                    match next {
                        Ok(Some(n)) => w.serve(listener, &n),
                        // Nothing is left to watch, or the listener failed: the others stop too.
                        Ok(None) | Err(_) => {
                            failed.store(true, Ordering::Release);
                            break;
                        }
                    }
                }
            });
        }
    });
}
