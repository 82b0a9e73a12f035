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

use super::{Store, StoreBatch};
use crate::session_key::SessionKey;

/// Batches that may wait for the writer before senders block.
const QUEUE: usize = 256;

enum Msg {
    Flush { key: SessionKey, wal: PathBuf, batch: Box<StoreBatch>, broken: Arc<AtomicBool> },
    Settle(Sender<()>),
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
                    Msg::Flush { key, wal, batch, broken } => {
                        if broken.load(Ordering::Acquire) {
                            continue;
                        }
                        if let Err(e) = store.flush(&key, &wal, &batch) {
                            log::warn!(
                                "run-index.db flush for {} failed ({e}); it is rebuilt from the wal on reopen",
                                key.addr()
                            );
                            broken.store(true, Ordering::Release);
                        }
                    }
                    Msg::Settle(done) => {
                        let _ = done.send(());
                    }
                }
            }
        })?;
        Ok(StoreWriter { tx: Some(tx), thread: Some(thread) })
    }

    /// Queues a batch of durable facts of `key`'s lineage.
    pub fn flush(&self, key: &SessionKey, wal: PathBuf, batch: StoreBatch, broken: &Arc<AtomicBool>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Flush { key: key.clone(), wal, batch: Box::new(batch), broken: Arc::clone(broken) });
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
