//! [`Shared`]: the pieces every lineage of a state root shares (the run index and its writer,
//! the feature floor, the WAL storage, the durable ends, the clock), and the session lookups
//! made through them: where a session's WAL is, and whether it has one (unfolding an archived
//! one the first time anything needs it).

use std::path::PathBuf;
use std::sync::Arc;

use super::ends::DurableEnds;
use super::{fold, Lineage, LineageError};
use crate::clock::SharedClock;
use crate::session_key::SessionKey;
use crate::state_root::{Placement, StateRoot};
use crate::store::writer::StoreWriter;
use crate::store::{Store, StoreError};
use crate::wal::{self, FeatureFloor, FileStorage, Storage};

/// The pieces every lineage of a state root shares.
pub struct Shared {
    pub root: StateRoot,
    pub store: Arc<Store>,
    pub floor: Arc<FeatureFloor>,
    pub writer: Arc<StoreWriter>,
    /// Where the WAL files live (real files, or a crash-simulating test storage).
    pub storage: Arc<dyn Storage>,
    /// The fsynced ends of the WALs this process writes: what readers may see.
    pub ends: Arc<DurableEnds>,
    /// The wall clock every durable time and retention decision reads.
    pub clock: SharedClock,
}

impl Shared {
    pub fn open(root: StateRoot) -> Result<Shared, LineageError> {
        Shared::open_with(root, Arc::new(FileStorage))
    }

    /// [`Shared::open`] over another WAL storage (tests: `wal::storage::crash::CrashStorage`).
    pub fn open_with(root: StateRoot, storage: Arc<dyn Storage>) -> Result<Shared, LineageError> {
        Shared::open_clocked(root, storage, crate::clock::from_env())
    }

    /// [`Shared::open_with`] on `clock` (tests: a [`crate::clock::ManualClock`]).
    pub fn open_clocked(
        root: StateRoot,
        storage: Arc<dyn Storage>,
        clock: SharedClock,
    ) -> Result<Shared, LineageError> {
        let store = Arc::new(Store::open_clocked(&root.run_index_path(), Arc::clone(&clock))?);
        let floor = Arc::new(FeatureFloor::load(&root.feature_floor_path())?);
        let writer = StoreWriter::start(Arc::clone(&store))
            .map_err(|source| StoreError::Io { path: root.run_index_path(), source })?;
        Ok(Shared { root, store, floor, writer: Arc::new(writer), storage, ends: Arc::default(), clock })
    }

    /// Opens the session's lineage; a new session's WAL is created in `wal/`.
    pub fn open_lineage(&self, key: &SessionKey) -> Result<Lineage, LineageError> {
        Lineage::open(self, key, Placement::Standard)
    }

    /// Opens the session's lineage; a new session's WAL is created in `placement`'s tree (an
    /// existing one is opened where it is).
    pub fn open_lineage_placed(&self, key: &SessionKey, placement: Placement) -> Result<Lineage, LineageError> {
        Lineage::open(self, key, placement)
    }

    /// The retention deleter of this state root (`crate::retention`).
    pub fn expiry(&self) -> crate::retention::Expiry<'_> {
        crate::retention::Expiry {
            root: &self.root,
            storage: self.storage.as_ref(),
            store: &self.store,
            writer: &self.writer,
            floor: &self.floor,
        }
    }

    /// Returns once every derived row queued so far is in `run-index.db`.
    pub fn settle(&self) {
        self.writer.settle();
    }

    pub fn wal_path(&self, key: &SessionKey) -> PathBuf {
        self.root.wal_path(key)
    }

    /// Whether the session has a WAL with a record of it: one exists and is not a creation a
    /// crash cut inside its unsynced header ([`wal::is_unfinished`]), which is no session.
    pub fn has_record(&self, key: &SessionKey) -> bool {
        self.record_path(key).is_some()
    }

    /// The session's WAL if it [has a record](Shared::has_record).
    /// A folded session is unfolded here, the first time anything needs it (`fold`).
    pub fn record_path(&self, key: &SessionKey) -> Option<PathBuf> {
        let mut path = self.wal_path(key);
        if !path.exists() {
            // A fold or unfold in progress holds the lease for milliseconds: wait it out (a
            // session folded by another process is not absent).
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(crate::limits::FOLD_WAIT_MS);
            loop {
                match fold::unfold(self, &key.addr(), false) {
                    Ok(Some(live)) => path = live,
                    Ok(None) => {}
                    Err(fold::FoldError::Lineage(LineageError::Lease(_))) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        continue;
                    }
                    Err(e) => log::error!("session {}: cannot unfold its archived WAL: {e}", key.addr()),
                }
                break;
            }
            if !path.exists() {
                // Unfolded, or folded and back, meanwhile: look once more.
                path = self.wal_path(key);
            }
        }
        (path.exists() && !wal::is_unfinished(self.storage.as_ref(), &path)).then_some(path)
    }
}
