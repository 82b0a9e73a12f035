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
        self.raise_with(features, &mut |_| Ok(()))
    }

    /// [`Self::raise`], calling `hook` after each [`FloorStep`] (an I/O fault test fails one).
    /// A failed raise leaves the floor it had in memory, so the next raise writes the file
    /// again: the floor file never names less than a durable frame needs.
    pub fn raise_with(
        &self,
        features: &[&str],
        hook: &mut dyn FnMut(FloorStep) -> std::io::Result<()>,
    ) -> Result<(), WalError> {
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
        file.write_all(text.as_bytes())
            .and_then(|()| hook(FloorStep::TempWritten))
            .map_err(|e| io("write feature floor", e))?;
        file.sync_all().and_then(|()| hook(FloorStep::TempSynced)).map_err(|e| io("fsync feature floor", e))?;
        fs::rename(&tmp, &self.path)
            .and_then(|()| hook(FloorStep::Renamed))
            .map_err(|e| io("rename feature floor", e))?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
            hook(FloorStep::DirSynced).map_err(|e| io("fsync feature floor directory", e))?;
        }
        *known = next;
        Ok(())
    }
}

/// The steps of [`FeatureFloor::raise_with`], in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorStep {
    TempWritten,
    TempSynced,
    Renamed,
    DirSynced,
}

impl FloorStep {
    pub const ALL: [FloorStep; 4] =
        [FloorStep::TempWritten, FloorStep::TempSynced, FloorStep::Renamed, FloorStep::DirSynced];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An I/O error at any step of a raise refuses it, typed, with the floor's memory unchanged;
    /// the floor file still names every feature raised before; the next raise succeeds.
    #[test]
    fn io_fault_at_every_floor_step_refuses_the_raise_and_recovers() {
        for failing in FloorStep::ALL {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("wal-feature-floor");
            let floor = FeatureFloor::load(&path).unwrap();
            floor.raise(&["a"]).unwrap();
            let mut fail = |s: FloorStep| match s == failing {
                true => Err(std::io::Error::from_raw_os_error(libc::EIO)),
                false => Ok(()),
            };
            let err = floor.raise_with(&["a", "b"], &mut fail).unwrap_err();
            assert!(matches!(err, WalError::Io { .. }), "{failing:?}: {err}");
            assert_eq!(floor.features(), vec!["a".to_string()], "{failing:?}: the floor in memory is unchanged");
            let on_disk = FeatureFloor::load(&path).unwrap().features();
            assert!(on_disk.contains(&"a".to_string()), "{failing:?}: the file still names what was raised");
            floor.raise(&["a", "b"]).unwrap();
            assert_eq!(FeatureFloor::load(&path).unwrap().features(), vec!["a".to_string(), "b".to_string()]);
        }
    }
}
