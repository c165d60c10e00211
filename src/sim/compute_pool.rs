//! A fixed set of threads for the simulated model's compute (writing KV
//! into the cache), started with the engine. Tokio's blocking pool grows
//! one thread per concurrent job, so a prefiller's thread count would
//! follow its load; this pool's does not, and its size matches the cores
//! the work can use anyway.
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Runs blocking jobs on `size` threads started up front.
pub struct ComputePool {
    tx: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl ComputePool {
    /// Starts `size` threads (at least one), named `sim-compute-N`.
    pub fn new(size: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..size.max(1) {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("sim-compute-{i}"))
                    .spawn(move || loop {
                        // The lock is held only while taking a job.
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            // A panicking job drops its result sender (the
                            // caller sees an error); the thread lives on.
                            Ok(job) => {
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            }
                            Err(_) => return, // pool dropped
                        }
                    })?,
            );
        }
        Ok(Self {
            tx: Some(tx),
            threads,
        })
    }

    /// A size for this machine: its available cores, between 1 and 4.
    pub fn default_size() -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 4)
    }

    /// Runs `f` on one of the pool's threads and returns its result.
    /// Err if the pool is shutting down or `f` panicked.
    pub async fn run<T, F>(&self, f: F) -> Result<T, &'static str>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(f());
        });
        self.tx
            .as_ref()
            .ok_or("compute pool stopped")?
            .send(job)
            .map_err(|_| "compute pool stopped")?;
        result.await.map_err(|_| "compute job panicked")
    }
}

impl Drop for ComputePool {
    fn drop(&mut self) {
        drop(self.tx.take());
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            // A job holding the last reference to the engine drops the pool
            // on a pool thread: that thread cannot join itself.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_a_fixed_set_of_threads() {
        let pool = ComputePool::new(2).unwrap();
        let names: Vec<String> = futures::future::join_all((0..32).map(|_| {
            pool.run(|| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                std::thread::current().name().unwrap_or("").to_string()
            })
        }))
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        let mut distinct = names.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() <= 2, "{distinct:?}");
        assert!(distinct.iter().all(|n| n.starts_with("sim-compute-")));
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_pool_keeps_working() {
        let pool = ComputePool::new(1).unwrap();
        let r: Result<(), _> = pool.run(|| panic!("boom")).await;
        assert!(r.is_err());
        assert_eq!(pool.run(|| 7).await, Ok(7));
    }
}
