//! The run-index writer thread: derived rows are written off the lineage's thread, so a run's
//! loop never waits on SQLite (DESIGN §2: "run-index writer thread").
//!
//! Invariants: batches are written in the order they were sent (one thread, one FIFO), and only
//! durable (fsynced) facts are ever sent; the queue is bounded, so a slow disk applies
//! backpressure instead of growing memory. A batch for a lineage whose flush once failed is
//! dropped: the store keeps its older, consistent checkpoint and the next open replays from it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Sender};
use parking_lot::{Condvar, Mutex};

use super::{Store, StoreBatch};
use crate::session_key::SessionKey;

use crate::limits::RUN_INDEX_QUEUE as QUEUE;

enum Msg {
    Flush { key: SessionKey, wal: PathBuf, batch: Box<StoreBatch>, broken: Arc<AtomicBool>, mark: Mark },
    Settle(Sender<()>),
}

/// How far one lineage's batches are written: its owner waits on its own mark (a batch of its
/// own still queued), never on every other session's.
#[derive(Debug, Default)]
pub struct FlushMark {
    written: Mutex<u64>,
    cond: Condvar,
}

impl FlushMark {
    fn set(&self, generation: u64) {
        let mut written = self.written.lock();
        *written = (*written).max(generation);
        self.cond.notify_all();
    }

    /// Returns once batch `generation` (and every earlier one) of this lineage is written or
    /// dropped.
    pub fn wait_for(&self, generation: u64) {
        let mut written = self.written.lock();
        while *written < generation {
            self.cond.wait(&mut written);
        }
    }
}

/// A batch's place in its lineage's order.
struct Mark {
    mark: Arc<FlushMark>,
    generation: u64,
}

pub struct StoreWriter {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

impl StoreWriter {
    pub fn start(store: Arc<Store>) -> std::io::Result<StoreWriter> {
        let (tx, rx) = bounded::<Msg>(QUEUE);
        let thread = std::thread::Builder::new().name("broca-run-index".into()).spawn(move || {
            for msg in rx {
                match msg {
                    Msg::Flush { key, wal, batch, broken, mark } => {
                        if !broken.load(Ordering::Acquire) {
                            if let Err(e) = store.flush(&key, &wal, &batch) {
                                log::warn!(
                                    "run-index.db flush for {} failed ({e}); it is rebuilt from the wal on reopen",
                                    key.addr()
                                );
                                broken.store(true, Ordering::Release);
                            }
                        }
                        mark.mark.set(mark.generation);
                    }
                    Msg::Settle(done) => {
                        let _ = done.send(());
                    }
                }
            }
        })?;
        Ok(StoreWriter { tx: Some(tx), thread: Some(thread) })
    }

    /// Queues batch `generation` of durable facts of `key`'s lineage; `mark` records when it
    /// is written.
    pub fn flush(
        &self,
        key: &SessionKey,
        wal: PathBuf,
        batch: StoreBatch,
        broken: &Arc<AtomicBool>,
        mark: &Arc<FlushMark>,
        generation: u64,
    ) {
        let msg = Msg::Flush {
            key: key.clone(),
            wal,
            batch: Box::new(batch),
            broken: Arc::clone(broken),
            mark: Mark { mark: Arc::clone(mark), generation },
        };
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(msg).is_ok());
        if !sent {
            // The writer is gone: nobody will write it; let waiters go.
            mark.set(generation);
        }
    }

    /// Returns once every batch queued before this call is written (or dropped).
    pub fn settle(&self) {
        let (done, wait) = bounded(1);
        if let Some(tx) = &self.tx {
            if tx.send(Msg::Settle(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
