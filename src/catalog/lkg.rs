//! Writing the LKG file (`reference/catalog-and-vault.md` C.1): the merged response in broca's
//! envelope, committed atomically.
//!
//! Invariant: the file at the LKG path is always a whole LKG, the previous one or the new one.
//! The new bytes go to a temp file in the same directory (0600), are fsynced, renamed over the
//! LKG and the directory is fsynced; a crash at any step leaves either the old file (and at most
//! a stray temp file, removed by [`remove_stray_temps`]) or the new one.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use super::pages::{PagedCatalogGet, CATALOG_GET, FUSIFORM_MODULE};
use super::{jcs_sha256, LKG_FORMAT};

/// The temp files' name prefix and suffix (next to the LKG).
const TEMP_PREFIX: &str = ".fusiform-lkg.";
const TEMP_SUFFIX: &str = ".tmp";

/// The steps of [`write_atomic_with`], in order; its hook runs after each (and may fail it,
/// as an I/O error at that step would).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStep {
    TempCreated,
    TempWritten,
    TempSynced,
    Renamed,
    DirSynced,
}

impl WriteStep {
    pub const ALL: [WriteStep; 5] = [
        WriteStep::TempCreated,
        WriteStep::TempWritten,
        WriteStep::TempSynced,
        WriteStep::Renamed,
        WriteStep::DirSynced,
    ];
}

/// The LKG file's bytes for a merged `response` of `pages` pages.
pub fn envelope(response: &Value, pages: usize, written_at_ms: u64) -> Vec<u8> {
    let file = json!({
        "format": LKG_FORMAT,
        "written_at_ms": written_at_ms,
        "fetched_from": {"module": FUSIFORM_MODULE, "tool": CATALOG_GET},
        "request": PagedCatalogGet::page(None),
        "pages": pages,
        "response_sha256": jcs_sha256(response),
        "response": response,
    });
    serde_json::to_vec_pretty(&file).expect("values serialize")
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, bytes, &mut |_| Ok(()))
}

/// [`write_atomic`], calling `hook` after each [`WriteStep`] (the crash test stops there).
pub fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    hook: &mut dyn FnMut(WriteStep) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("the LKG path has no directory"))?;
    std::fs::create_dir_all(dir)?;
    // tempfile creates the file 0600 with O_EXCL.
    let mut temp = tempfile::Builder::new().prefix(TEMP_PREFIX).suffix(TEMP_SUFFIX).tempfile_in(dir)?;
    hook(WriteStep::TempCreated)?;
    temp.write_all(bytes)?;
    hook(WriteStep::TempWritten)?;
    crate::failpoint!("catalog.mid_lkg_write");
    temp.as_file().sync_all()?;
    hook(WriteStep::TempSynced)?;
    temp.persist(path).map_err(|e| e.error)?;
    hook(WriteStep::Renamed)?;
    std::fs::File::open(dir)?.sync_all()?;
    hook(WriteStep::DirSynced)?;
    Ok(())
}

/// Removes temp files a crashed write left next to `path`; returns how many.
pub fn remove_stray_temps(path: &Path) -> usize {
    let Some(dir) = path.parent() else { return 0 };
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX) && n.ends_with(TEMP_SUFFIX)))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// The envelope's `written_at_ms`, when the file is readable and carries one.
pub fn written_at_ms(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice::<Value>(&bytes).ok()?.get("written_at_ms")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    #[test]
    fn a_written_lkg_loads_and_stray_temps_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let seeded = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/catalog/fusiform-lkg.json")).unwrap();
        let response = serde_json::from_slice::<Value>(&seeded).unwrap()["response"].clone();
        let path = dir.path().join("catalog/fusiform-lkg.json");
        let mut steps = Vec::new();
        write_atomic_with(&path, &envelope(&response, 3, 42), &mut |s| {
            steps.push(s);
            Ok(())
        })
        .unwrap();
        assert_eq!(steps, WriteStep::ALL);
        assert_eq!(Catalog::load_lkg(&path).unwrap().len(), 16);
        assert_eq!(written_at_ms(&path), Some(42));
        std::fs::write(dir.path().join("catalog/.fusiform-lkg.abc.tmp"), b"torn").unwrap();
        assert_eq!(remove_stray_temps(&path), 1);
        assert!(path.exists());
    }

    /// An I/O error at any step of a write refuses it with that error, leaves the previous
    /// LKG whole (or, past the rename, the new one whole), and the next write succeeds.
    #[test]
    fn io_fault_at_every_lkg_write_step_keeps_a_whole_lkg_and_recovers() {
        let seeded = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/catalog/fusiform-lkg.json")).unwrap();
        let response = serde_json::from_slice::<Value>(&seeded).unwrap()["response"].clone();
        let mut newer = response.clone();
        newer["catalog_version"] = 99.into();
        for (i, failing) in WriteStep::ALL.into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("catalog/fusiform-lkg.json");
            write_atomic(&path, &envelope(&response, 3, 1)).unwrap();
            let mut fail = |s: WriteStep| match s == failing {
                true => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                false => Ok(()),
            };
            let err = write_atomic_with(&path, &envelope(&newer, 3, 2), &mut fail).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{failing:?}: the step's error is returned");
            let whole = Catalog::load_lkg(&path).unwrap_or_else(|e| panic!("{failing:?}: the LKG is not whole: {e}"));
            let renamed = i >= WriteStep::ALL.iter().position(|s| *s == WriteStep::Renamed).unwrap();
            assert_eq!(written_at_ms(&path), Some(if renamed { 2 } else { 1 }), "{failing:?}");
            assert_eq!(whole.catalog_version, if renamed { 99 } else { response["catalog_version"].as_u64().unwrap() });
            assert_eq!(remove_stray_temps(&path), 0, "{failing:?}: a failed write leaves no temp file");
            write_atomic(&path, &envelope(&newer, 3, 3)).unwrap();
            assert_eq!(written_at_ms(&path), Some(3), "{failing:?}: the next write succeeds");
        }
    }
}
