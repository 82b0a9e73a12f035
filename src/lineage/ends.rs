//! The durable ends of the WALs this process writes (DESIGN §7: readers stop at the fsynced
//! end). A lineage publishes its WAL's end after every successful fsync; a reader of a session
//! reads only up to it, so nothing it serves can be erased by a power loss.
//!
//! Invariants of an [`EndSlot`]:
//! - `open` is `Some` exactly while a [`Lineage`](super::Lineage) of this process holds the
//!   session's lease and has finished opening; it only moves forward, and only after the fsync
//!   that made it true;
//! - while a lineage opens (scans, truncates a torn tail) it holds the slot's write lock, so a
//!   reader never reads bytes an open is about to cut;
//! - a reader of a session with no open writer holds the read lock for the batch it reads, so
//!   no writer can open (and truncate) under it;
//! - `failed_end` is the fsynced end a writer left after a failed write or fsync: bytes past it
//!   were never durable, so readers stop there and the next open cuts them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::lock_api::ArcRwLockWriteGuard;
use parking_lot::{Mutex, RawRwLock, RwLock};

/// The opening writer's hold on its slot: readers of the session wait until it is dropped.
pub type Opening = ArcRwLockWriteGuard<RawRwLock, SlotState>;

use super::projection::Cursor;

/// What is durable in a WAL whose writer is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durable {
    /// The offset after the last fsynced frame.
    pub offset: u64,
    /// The last fsynced seq.
    pub seq: u64,
    /// The last durable control unit (`from: "live"` attaches strictly after it).
    pub head: Option<Cursor>,
}

#[derive(Debug, Default)]
pub struct SlotState {
    pub open: Option<Durable>,
    pub failed_end: Option<u64>,
    /// What failed, for the seal of the run the failed writer left open.
    pub failure: Option<String>,
}

#[derive(Debug, Default)]
pub struct EndSlot {
    state: Arc<RwLock<SlotState>>,
}

/// Every session's slot, by session address. Slots of sessions nobody reads or writes are
/// dropped, so the map is bounded by the sessions in use (plus those whose writer failed).
#[derive(Debug, Default)]
pub struct DurableEnds {
    slots: Mutex<HashMap<String, Arc<EndSlot>>>,
}

impl DurableEnds {
    fn slot(&self, addr: &str) -> Arc<EndSlot> {
        Arc::clone(self.slots.lock().entry(addr.to_string()).or_default())
    }

    /// Drops the map's slot when nobody else holds it and it remembers nothing.
    fn release(&self, addr: &str, slot: Arc<EndSlot>) {
        let mut slots = self.slots.lock();
        drop(slot);
        let unused = slots.get(addr).is_some_and(|s| {
            Arc::strong_count(s) == 1
                && s.state.try_read().is_some_and(|state| state.open.is_none() && state.failed_end.is_none())
        });
        if unused {
            slots.remove(addr);
        }
    }

    /// Runs `read` with the end a reader of `addr` may see: `Some(offset)` (an open writer's
    /// fsynced end, or a failed writer's), or `None` (no writer: the end of the file, with no
    /// open possible until `read` returns).
    pub fn read_within<T>(&self, addr: &str, read: impl FnOnce(Option<u64>) -> T) -> T {
        let slot = self.slot(addr);
        let guard = slot.state.read();
        let out = match (guard.open, guard.failed_end) {
            (Some(Durable { offset: end, .. }), _) | (None, Some(end)) => {
                // Bytes before a published end are never cut: no lock is needed to read them.
                drop(guard);
                read(Some(end))
            }
            (None, None) => {
                let out = read(None);
                drop(guard);
                out
            }
        };
        self.release(addr, slot);
        out
    }

    /// The open writer's durable state, if a lineage of this process writes `addr`.
    pub fn open_writer(&self, addr: &str) -> Option<Durable> {
        let slot = self.slot(addr);
        let open = slot.state.read().open;
        self.release(addr, slot);
        open
    }

    /// The writer's handle, taken by a lineage once it holds the lease.
    pub fn writer(self: &Arc<Self>, addr: &str) -> WriterEnd {
        WriterEnd { slot: self.slot(addr), ends: Arc::clone(self), addr: addr.to_string() }
    }
}

/// A lineage's end of its slot: it opens under the write lock and publishes after each fsync.
pub struct WriterEnd {
    slot: Arc<EndSlot>,
    ends: Arc<DurableEnds>,
    addr: String,
}

impl WriterEnd {
    /// Held while the lineage opens and seals an orphan (readers of the session wait, so none
    /// sees the orphan still open while its seal is being written).
    pub fn opening(&self) -> Opening {
        self.slot.state.write_arc()
    }

    /// Publishes what is now durable (after the fsync that made it so), through the opening
    /// hold while the lineage still has it.
    pub fn publish(&self, opening: Option<&mut Opening>, durable: Durable) {
        let apply = |state: &mut SlotState| {
            state.open = Some(durable);
            state.failed_end = None;
        };
        match opening {
            Some(guard) => apply(guard),
            None => apply(&mut self.slot.state.write()),
        }
    }

    /// The writer latched an I/O failure: bytes after `synced_end` were never durable.
    pub fn failed(&self, opening: Option<&mut Opening>, synced_end: u64, cause: String) {
        let apply = |state: &mut SlotState| {
            state.open = None;
            state.failed_end = Some(synced_end);
            state.failure = Some(cause);
        };
        match opening {
            Some(guard) => apply(guard),
            None => apply(&mut self.slot.state.write()),
        }
    }
}

impl Drop for WriterEnd {
    fn drop(&mut self) {
        self.slot.state.write().open = None;
        let slot = std::mem::take(&mut self.slot);
        self.ends.release(&self.addr, slot);
    }
}
