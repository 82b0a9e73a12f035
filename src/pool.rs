//! A small pool of reusable helper threads for blocking work (model streams, tool calls).
//!
//! Starting a thread per attempt or per call costs tens of microseconds on every step; a pool
//! keeps finished helpers waiting for the next job for a while instead.
//!
//! Invariants: `idle` counts workers committed to take one more job; `run` either claims one of
//! them (decrementing `idle`, then sending exactly one job) or starts a new worker for the job,
//! so every job sent finds a worker and no job waits behind another. An idle worker exits after
//! `IDLE_EXIT` unless a job was already claimed for it. Jobs never block each other.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

type Job = Box<dyn FnOnce() + Send + 'static>;

const IDLE_EXIT: Duration = Duration::from_secs(60);

pub struct Pool {
    name: &'static str,
    jobs: Sender<Job>,
    queue: Receiver<Job>,
    idle: Arc<AtomicUsize>,
    /// Threads started so far (a diagnostic).
    spawned: AtomicUsize,
}

fn claim(idle: &AtomicUsize) -> bool {
    idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
}

impl Pool {
    pub fn new(name: &'static str) -> Pool {
        let (jobs, queue) = unbounded();
        Pool { name, jobs, queue, idle: Arc::new(AtomicUsize::new(0)), spawned: AtomicUsize::new(0) }
    }

    /// Runs `job` on a helper thread. Fails only when no thread can be started.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        if claim(&self.idle) {
            // A claimed worker is waiting on the queue; the channel never closes while we live.
            let _ = self.jobs.send(Box::new(job));
            return Ok(());
        }
        let queue = self.queue.clone();
        let idle = Arc::clone(&self.idle);
        std::thread::Builder::new().name(self.name.into()).spawn(move || worker(Box::new(job), &queue, &idle))?;
        self.spawned.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Threads this pool has started.
    pub fn spawned(&self) -> usize {
        self.spawned.load(Ordering::Relaxed)
    }
}

fn worker(first: Job, queue: &Receiver<Job>, idle: &AtomicUsize) {
    let mut job = first;
    loop {
        job();
        idle.fetch_add(1, Ordering::AcqRel);
        job = match queue.recv_timeout(IDLE_EXIT) {
            Ok(next) => next,
            Err(RecvTimeoutError::Timeout) if claim(idle) => return,
            // Our slot was claimed just as we timed out: its job is on the way.
            Err(RecvTimeoutError::Timeout) => match queue.recv() {
                Ok(next) => next,
                Err(_) => return,
            },
            Err(RecvTimeoutError::Disconnected) => return,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_concurrently_and_workers_are_reused() {
        let pool = Pool::new("test-pool");
        let (tx, rx) = unbounded();
        let (gate_tx, gate_rx) = unbounded::<()>();
        // Two blocking jobs at once: neither waits for the other.
        for i in 0..2 {
            let (tx, gate_rx) = (tx.clone(), gate_rx.clone());
            pool.run(move || {
                tx.send(i).unwrap();
                gate_rx.recv().unwrap();
            })
            .unwrap();
        }
        assert_eq!(rx.recv().unwrap() + rx.recv().unwrap(), 1);
        gate_tx.send(()).unwrap();
        gate_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pool.idle.load(Ordering::Acquire), 2);
        // Sequential jobs reuse the idle workers instead of starting threads.
        for i in 0..10 {
            let tx = tx.clone();
            pool.run(move || tx.send(i).unwrap()).unwrap();
            rx.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        assert_eq!(pool.spawned(), 2);
    }
}
