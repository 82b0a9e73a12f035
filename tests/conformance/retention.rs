//! What the suite's retention cases inspect in broca's state root, never inferred from an
//! expired read (llm-runner §9.1): that an expired session's tombstone is durable and that
//! everything broca held of the record is gone: its live WAL in `wal-ephemeral/`, and its rows
//! in `run-index.db` (lineage checkpoint, transcript, runs and sends).
//!
//! And the suite's retention clock (`advance_retention_clock`): each instance's broca runs on
//! `broca::clock::OffsetFileClock` over [`clock_file`] (a debug build's `BROCA_TEST_CLOCK_FILE`,
//! set by `rig.rs`), so durable activity times, expiry checks and deletion deadlines all read
//! one clock that an advance moves, across kills and restarts (the file outlives them).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broca::session_key::SessionKey;

use crate::subject::HARNESS;

/// Whether the deletion of `session`'s expired record has finished on `root`: its tombstone
/// exists (so the address is the session's and it did expire) and neither its WAL nor any of
/// its store rows remain. `Err` names what is still there.
pub fn deletion_finished(root: &Path, session: &str) -> Result<bool, String> {
    let root = crate::rig::broca_root(root);
    let key = SessionKey::new("/", HARNESS, session);
    let addr = key.addr();
    let ephemeral = root.join("wal-ephemeral");
    if !ephemeral.join(format!("{addr}.tombstone")).is_file() {
        return Err(format!("session {session} ({addr}) has no retention tombstone in {}", ephemeral.display()));
    }
    if ephemeral.join(format!("{addr}.wal")).exists() {
        return Ok(false);
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(root.join("run-index.db"), flags).map_err(|e| e.to_string())?;
    let count = |sql: &str, arg: &str| -> Result<i64, String> {
        conn.query_row(sql, [arg], |r| r.get(0)).map_err(|e| format!("{sql}: {e}"))
    };
    let rows = count("SELECT count(*) FROM lineages WHERE lineage = ?1", &addr)?
        + count("SELECT count(*) FROM transcript WHERE lineage = ?1", &addr)?
        + count("SELECT count(*) FROM runs WHERE lineage = ?1", &addr)?
        + count("SELECT count(*) FROM sends WHERE lineage = ?1", &addr)?
        + count("SELECT count(*) FROM runs WHERE session = ?1", session)?
        + count("SELECT count(*) FROM lineages WHERE session = ?1", session)?;
    Ok(rows == 0)
}

/// Now on `instance_root`'s broca clock: the wall clock plus the instance's offset.
pub fn now_ms(instance_root: &Path) -> u64 {
    let offset: u64 =
        std::fs::read_to_string(clock_file(instance_root)).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(wall.as_millis()).unwrap_or(u64::MAX).saturating_add(offset)
}

/// The file holding an instance's clock offset (decimal milliseconds).
pub fn clock_file(instance_root: &Path) -> PathBuf {
    instance_root.join("clock-offset-ms")
}

/// How long an advance waits, at most, for the expiry and deletion it makes due: an idle actor
/// re-reads a moved clock every sweep tick and the sweep runs every tick, so four ticks cover
/// the actor's close and the sweep after it.
const SETTLE: Duration = Duration::from_millis(4 * broca::limits::RETENTION_SWEEP_MS);

/// Moves `instance_root`'s broca clock `milliseconds` ahead (a new file renamed in, so the
/// clock reads it at once), then waits until `session`'s deletion has finished or [`SETTLE`]
/// has passed (a session the advance did not expire is simply not deleted).
pub fn advance(instance_root: &Path, session: &str, milliseconds: u64) -> Result<(), String> {
    let path = clock_file(instance_root);
    let now: u64 = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
    let next = now.checked_add(milliseconds).ok_or("the clock offset overflows")?;
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, next.to_string()).map_err(|e| format!("{}: {e}", temp.display()))?;
    std::fs::rename(&temp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    let until = Instant::now() + SETTLE;
    while Instant::now() < until {
        if deletion_finished(instance_root, session) == Ok(true) {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}
