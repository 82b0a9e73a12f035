//! The run index's debug-only fault point (storage-seam tests): [`super::Store::fail_flush`]
//! fails a chosen flush at its commit, as an I/O error there would.

use std::path::Path;

use super::StoreError;

/// The armed flush fault of [`super::Store::fail_flush`].
#[derive(Default)]
pub(super) struct FlushFaults {
    /// Flushes that reached their commit.
    pub(super) seen: std::sync::atomic::AtomicU64,
    /// The `seen` count whose commit fails (0: none).
    fail_at: std::sync::atomic::AtomicU64,
}

impl FlushFaults {
    pub(super) fn arm(&self, nth: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.fail_at.store(self.seen.load(SeqCst) + nth.max(1), SeqCst);
    }

    pub(super) fn at_commit(&self, path: &Path) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.seen.fetch_add(1, SeqCst) + 1;
        if self.fail_at.compare_exchange(n, 0, SeqCst, SeqCst).is_ok() {
            let source = std::io::Error::from_raw_os_error(libc::EIO);
            return Err(StoreError::Io { path: path.to_path_buf(), source });
        }
        Ok(())
    }
}
