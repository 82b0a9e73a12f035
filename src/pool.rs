//! A small pool of reusable helper threads for blocking work (model streams, tool calls).
//!
//! Starting a thread per attempt or per call costs tens of microseconds on every step; a pool
//! keeps finished helpers waiting for the next job for a while instead.
//!
//! Invariants: `idle` counts workers committed to take one more job; `run` either claims one of
//! them (decrementing `idle`, then sending exactly one job) or starts a new worker for the job,
//! so every job sent finds a worker and no job waits behind another. An idle worker exits after
//! `IDLE_EXIT` unless a job was already claimed for it. Jobs never block each other. `live`
//! counts started workers that have not exited; it never exceeds `max`: past it `run` refuses
//! the job ([`PoolError::Full`]) instead of starting a thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

type Job = Box<dyn FnOnce() + Send + 'static>;

const IDLE_EXIT: Duration = Duration::from_secs(60);

pub struct Pool {
    name: &'static str,
    /// Workers alive at most at once.
    max: usize,
    live: Arc<AtomicUsize>,
    jobs: Sender<Job>,
    queue: Receiver<Job>,
    idle: Arc<AtomicUsize>,
    /// Threads started so far (a diagnostic).
    spawned: AtomicUsize,
}

fn claim(idle: &AtomicUsize) -> bool {
    idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
}

/// Why a job was not started.
#[derive(Debug)]
pub enum PoolError {
    /// `limit` workers are busy already.
    Full { limit: usize },
    /// The system refused a new thread.
    Spawn(std::io::Error),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::Full { limit } => write!(f, "all {limit} helper threads are busy"),
            PoolError::Spawn(e) => write!(f, "cannot start a helper thread: {e}"),
        }
    }
}

impl std::error::Error for PoolError {}

impl Pool {
    /// A pool of at most `max` threads named `name`.
    pub fn new(name: &'static str, max: usize) -> Pool {
        let (jobs, queue) = unbounded();
        Pool {
            name,
            max,
            live: Arc::new(AtomicUsize::new(0)),
            jobs,
            queue,
            idle: Arc::new(AtomicUsize::new(0)),
            spawned: AtomicUsize::new(0),
        }
    }

    /// Runs `job` on a helper thread: an idle one, else a new one while fewer than `max` live.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> Result<(), PoolError> {
        if claim(&self.idle) {
            // A claimed worker is waiting on the queue; the channel never closes while we live.
            let _ = self.jobs.send(Box::new(job));
            return Ok(());
        }
        let (max, live) = (self.max, &self.live);
        if live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_err() {
            return Err(PoolError::Full { limit: max });
        }
        let queue = self.queue.clone();
        let (idle, alive) = (Arc::clone(&self.idle), Arc::clone(&self.live));
        let spawned = std::thread::Builder::new().name(self.name.into()).spawn(move || {
            let _alive = Alive(alive);
            worker(Box::new(job), &queue, &idle);
        });
        if let Err(e) = spawned {
            self.live.fetch_sub(1, Ordering::AcqRel);
            return Err(PoolError::Spawn(e));
        }
        self.spawned.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Threads this pool has started.
    pub fn spawned(&self) -> usize {
        self.spawned.load(Ordering::Relaxed)
    }
}

/// Counts its worker out of `live` when the thread ends, however it ends (a job may panic).
struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
        let pool = Pool::new("test-pool", 4);
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

    #[test]
    fn a_full_pool_refuses_instead_of_starting_threads() {
        let pool = Pool::new("test-full", 2);
        let (gate_tx, gate_rx) = unbounded::<()>();
        for _ in 0..2 {
            let gate_rx = gate_rx.clone();
            pool.run(move || {
                let _ = gate_rx.recv();
            })
            .unwrap();
        }
        assert!(matches!(pool.run(|| {}), Err(PoolError::Full { limit: 2 })));
        gate_tx.send(()).unwrap();
        // A worker that finished its job takes the next one.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pool.idle.load(Ordering::Acquire) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        pool.run(|| {}).unwrap();
        assert_eq!(pool.spawned(), 2);
        gate_tx.send(()).unwrap();
    }
}
