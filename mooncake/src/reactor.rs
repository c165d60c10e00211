//! One background thread per engine that turns the engine's readiness
//! eventfd into wakeups, so that no task polls and no thread is parked per
//! wait. Futures of async batches register a waker under their batch id,
//! notification streams one for any notification. The thread also takes
//! over batches whose owner was dropped while their transfers were still
//! running: it keeps their memory alive until the engine reports them
//! finished, then frees the batch and lets the memory go.
//!
//! Started by the first async use of an engine; stopped when the engine's
//! shared state is dropped.
use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{drain_eventfd, wait_either, EventFd, RawEngine};

/// What a dropped batch leaves behind: its id and whatever must outlive its
/// transfers (the memory it uses, the engine it belongs to).
type Orphan = Box<dyn Any + Send>;

// Lock discipline: no waker is woken or dropped, and no orphan dropped,
// while one of these mutexes is held. Waking or dropping a waker may run an
// executor's code that drops a task, whose `Completion` then locks
// `batches` again on this thread.
struct Inner {
    raw: Arc<RawEngine>,
    batches: Mutex<HashMap<u64, Waker>>,
    notify: Mutex<Vec<Waker>>,
    orphans: Mutex<HashMap<u64, Orphan>>,
    /// The thread stopped waiting (an error): futures fail instead of
    /// waiting for ever.
    dead: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The maps stay consistent whatever a panicking holder did (each update
    // is one insert or remove), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// A batch reported finished: wake its future, or finish it if its
    /// owner is gone.
    fn finished(&self, id: u64) {
        let waker = lock(&self.batches).remove(&id);
        if let Some(w) = waker {
            wake(w);
        }
        self.settle_orphan(id);
    }

    /// The queue overflowed: every waiter checks its batch again.
    fn finished_all(&self) {
        let wakers: Vec<Waker> = lock(&self.batches).drain().map(|(_, w)| w).collect();
        for w in wakers {
            wake(w);
        }
        let ids: Vec<u64> = lock(&self.orphans).keys().copied().collect();
        for id in ids {
            self.settle_orphan(id);
        }
    }

    fn wake_notify(&self) {
        let wakers = std::mem::take(&mut *lock(&self.notify));
        for w in wakers {
            wake(w);
        }
    }

    /// Frees an orphaned batch once every transfer of it has ended; the
    /// memory it held is released after that (outside the lock: dropping it
    /// may drop the engine's last handle).
    fn settle_orphan(&self, id: u64) {
        if !lock(&self.orphans).contains_key(&id) {
            return;
        }
        match self.raw.wait_batch(id, Some(Duration::ZERO)) {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                // Settled meanwhile by the other caller (the adopting thread
                // and this one race): nothing left to do. Otherwise keep it
                // (its memory may still be in use) and look again at the
                // next event.
                if lock(&self.orphans).contains_key(&id) {
                    tracing::error!(target: "mooncake", batch = id, error = %e, "checking a dropped batch failed");
                }
                return;
            }
        }
        // Whoever removes it frees it.
        let orphan = lock(&self.orphans).remove(&id);
        let Some(orphan) = orphan else {
            return;
        };
        if let Err(e) = self.raw.free_batch(id) {
            tracing::error!(target: "mooncake", batch = id, error = %e, "freeing a dropped batch failed");
        }
        drop(orphan);
    }
}

pub(crate) struct Reactor {
    inner: Arc<Inner>,
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Reactor {
    /// Turns on the engine's eventfd and starts the thread that waits on it.
    pub(crate) fn start(raw: &Arc<RawEngine>) -> Result<Self> {
        let event_fd = raw.event_fd()?;
        let stop = Arc::new(
            EventFd::new().map_err(|e| system("cannot create the async reactor's eventfd", &e))?,
        );
        let inner = Arc::new(Inner {
            raw: raw.clone(),
            batches: Mutex::new(HashMap::new()),
            notify: Mutex::new(Vec::new()),
            orphans: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        });
        let (thread_inner, thread_stop) = (inner.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("mooncake-reactor".into())
            .spawn(move || run(&thread_inner, event_fd, &thread_stop))
            .map_err(|e| system("cannot start the async reactor thread", &e))?;
        Ok(Self {
            inner,
            stop,
            thread: Some(thread),
        })
    }

    /// Wakes `waker` when batch `id` is next reported finished.
    pub(crate) fn watch_batch(&self, id: u64, waker: &Waker) {
        let fresh = waker.clone();
        let replaced = {
            let mut batches = lock(&self.inner.batches);
            match batches.get(&id) {
                Some(w) if w.will_wake(waker) => None,
                _ => batches.insert(id, fresh),
            }
        };
        drop(replaced);
    }

    /// Stops watching batch `id`.
    pub(crate) fn unwatch_batch(&self, id: u64) {
        let removed = lock(&self.inner.batches).remove(&id);
        drop(removed);
    }

    /// Whether the reactor thread has stopped (after an error it logged):
    /// async waits fail rather than hang.
    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.inner.dead.load(Ordering::Acquire) {
            return Err(Error::Engine {
                code: ErrorCode::Internal,
                message: "the engine's async reactor thread has stopped (see the log); async \
                          waits cannot complete"
                    .into(),
            });
        }
        Ok(())
    }

    /// Wakes `waker` when the next notification (or any event) arrives.
    pub(crate) fn watch_notifications(&self, waker: &Waker) {
        let mut notify = lock(&self.inner.notify);
        if !notify.iter().any(|w| w.will_wake(waker)) {
            notify.push(waker.clone());
        }
    }

    /// Takes over batch `id`, still running, with what must outlive it;
    /// frees it once its transfers have all ended.
    pub(crate) fn adopt(&self, id: u64, keep: Orphan) {
        self.unwatch_batch(id);
        let earlier = lock(&self.inner.orphans).insert(id, keep);
        drop(earlier);
        // It may have finished before it was adopted (its event then found
        // no orphan): check once now.
        self.inner.settle_orphan(id);
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.stop.signal();
        if let Some(t) = self.thread.take() {
            // The thread itself may drop the engine's last handle (a dropped
            // batch's memory held it): it then leaves its loop on its own.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn system(what: &str, e: &std::io::Error) -> Error {
    Error::Engine {
        code: ErrorCode::Internal,
        message: format!("{what}: {e}"),
    }
}

/// Wakes `w`; an executor's waker that panics is logged, not fatal to the
/// reactor.
fn wake(w: Waker) {
    if catch_unwind(AssertUnwindSafe(|| w.wake())).is_err() {
        tracing::error!(target: "mooncake", "a waker panicked");
    }
}

fn run(inner: &Inner, event_fd: std::os::fd::RawFd, stop: &EventFd) {
    let mut ids = vec![0u64; 1024];
    loop {
        match wait_either(event_fd, stop.raw()) {
            Ok((_, true)) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(target: "mooncake", error = %e, "the async reactor cannot wait; async waits fail from now on");
                inner.dead.store(true, Ordering::Release);
                inner.finished_all();
                inner.wake_notify();
                return;
            }
        }
        // Read the eventfd first, then take: the other order can miss a
        // batch that finishes in between.
        drain_eventfd(event_fd);
        loop {
            let (n, overflowed) = match inner.raw.take_completions(&mut ids) {
                Ok(x) => x,
                Err(e) => {
                    tracing::error!(target: "mooncake", error = %e, "taking finished batches failed");
                    (0, true)
                }
            };
            for &id in &ids[..n] {
                inner.finished(id);
            }
            if overflowed {
                inner.finished_all();
            }
            // Notifications are not starved by a long run of completions.
            inner.wake_notify();
            if n < ids.len() {
                break;
            }
        }
    }
}
