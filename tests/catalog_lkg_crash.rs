//! An LKG write killed with SIGKILL at every step (`broca::catalog::lkg::WriteStep`) leaves a
//! whole LKG: the previous one before the rename, the new one after it, never a torn file.
//! The child is this test binary re-executed with `BROCA_LKG_CRASH_STEP`; it writes the new
//! LKG, prints `STEP <n>` after each step and, at the named one, waits to be killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use broca::catalog::lkg::{self, WriteStep};
use broca::catalog::Catalog;
use serde_json::Value;

const ENV_STEP: &str = "BROCA_LKG_CRASH_STEP";
const ENV_PATH: &str = "BROCA_LKG_CRASH_PATH";
const NEW_VERSION: u64 = 1_795_392_099_999;

fn new_lkg() -> Vec<u8> {
    let seeded = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/catalog/fusiform-lkg.json")).unwrap();
    let mut response = serde_json::from_slice::<Value>(&seeded).unwrap()["response"].clone();
    response["catalog_version"] = NEW_VERSION.into();
    lkg::envelope(&response, 2, 1)
}

/// The child: write, stopping at the named step.
#[test]
fn child_main() {
    let (Ok(step), Ok(path)) = (std::env::var(ENV_STEP), std::env::var(ENV_PATH)) else { return };
    let stop: usize = step.parse().unwrap();
    let bytes = new_lkg();
    lkg::write_atomic_with(std::path::Path::new(&path), &bytes, &mut |s| {
        let n = WriteStep::ALL.iter().position(|x| *x == s).unwrap();
        println!("STEP {n}");
        if n == stop {
            loop {
                std::thread::park();
            }
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn an_lkg_write_killed_at_every_step_leaves_a_whole_lkg() {
    if std::env::var_os(ENV_STEP).is_some() {
        return;
    }
    let seeded = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/catalog/fusiform-lkg.json")).unwrap();
    let renamed = WriteStep::ALL.iter().position(|s| *s == WriteStep::Renamed).unwrap();
    for (n, step) in WriteStep::ALL.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog/fusiform-lkg.json");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &seeded).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
            .env(ENV_STEP, n.to_string())
            .env(ENV_PATH, &path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let want = format!("STEP {n}");
        assert!(lines.any(|l| l.is_ok_and(|l| l.trim_end().ends_with(&want))), "the child never reached {step:?}");
        // SAFETY: killing the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert!(std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL), "{step:?}: {status:?}");
        let catalog = Catalog::load_lkg(&path).unwrap_or_else(|e| panic!("killed at {step:?}: {e}"));
        if n < renamed {
            assert_eq!(std::fs::read(&path).unwrap(), seeded, "killed at {step:?}: the previous LKG is intact");
        } else {
            assert_eq!(catalog.catalog_version, NEW_VERSION, "killed at {step:?}: the new LKG is whole");
        }
        // A stray temp file is all a kill before the rename leaves; the poller removes it.
        lkg::remove_stray_temps(&path);
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().filter_map(Result::ok).collect();
        assert_eq!(left.len(), 1, "killed at {step:?}: only the LKG remains");
    }
}

#[test]
fn the_named_fail_point_kills_mid_write_and_leaves_the_previous_lkg() {
    if std::env::var_os(ENV_STEP).is_some() {
        return;
    }
    let seeded = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/catalog/fusiform-lkg.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog/fusiform-lkg.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &seeded).unwrap();
    // The child writes to the end (no hook stop): the fail point is what kills it.
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env(ENV_STEP, usize::MAX.to_string())
        .env(ENV_PATH, &path)
        .env(broca::failpoint::ENV, "catalog.mid_lkg_write")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(std::fs::read(&path).unwrap(), seeded, "the previous LKG is intact");
    assert_eq!(lkg::remove_stray_temps(&path), 1, "the killed write left its temp file, and only that");
}
