//! What the suite's retention cases inspect in broca's state root, never inferred from an
//! expired read (llm-runner §9.1): that an expired session's tombstone is durable and that
//! everything broca held of the record is gone: its live WAL in `wal-ephemeral/`, and its rows
//! in `run-index.db` (lineage checkpoint, transcript, runs and sends).

use std::path::Path;

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
