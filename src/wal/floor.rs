//! The state root's WAL feature floor: every must-understand feature any WAL under this root
//! has required, in `wal-feature-floor` (one name a line).
//!
//! A writer raises the floor, durably, before it appends the first frame requiring a feature,
//! so tools can tell from one small file whether any WAL may hold such frames without reading
//! the WALs. Invariant: a feature named by any durable frame is named by the floor file.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::{sync_dir, WalError};

pub struct FeatureFloor {
    path: PathBuf,
    known: Mutex<BTreeSet<String>>,
}

impl FeatureFloor {
    /// Loads the floor file at `path` (absent = empty).
    pub fn load(path: &Path) -> Result<FeatureFloor, WalError> {
        let known = match fs::read_to_string(path) {
            Ok(text) => text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(source) => return Err(WalError::Io { op: "read feature floor", path: path.into(), source }),
        };
        Ok(FeatureFloor { path: path.to_path_buf(), known: Mutex::new(known) })
    }

    /// The features named so far.
    pub fn features(&self) -> Vec<String> {
        self.known.lock().iter().cloned().collect()
    }

    /// Makes sure every one of `features` is in the floor, writing the file (temp, fsync,
    /// rename, fsync directory) only when one is new.
    pub fn raise(&self, features: &[&str]) -> Result<(), WalError> {
        let mut known = self.known.lock();
        if features.iter().all(|f| known.contains(*f)) {
            return Ok(());
        }
        let mut next = known.clone();
        next.extend(features.iter().map(|f| f.to_string()));
        let text: String = next.iter().map(|f| format!("{f}\n")).collect();
        let tmp = self.path.with_extension("tmp");
        let io = |op, source| WalError::Io { op, path: self.path.clone(), source };
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io("write feature floor", e))?;
        file.write_all(text.as_bytes()).map_err(|e| io("write feature floor", e))?;
        file.sync_all().map_err(|e| io("fsync feature floor", e))?;
        fs::rename(&tmp, &self.path).map_err(|e| io("rename feature floor", e))?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
        }
        *known = next;
        Ok(())
    }
}
