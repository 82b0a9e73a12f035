//! `late-results.db` (spec §19, §20): the intake store of held calls, under the state root and
//! outside the backup catalog. A projection of the WAL: losing it loses nothing a rebuild from
//! the sessions cannot restore.
//!
//! Tables:
//! - `registrations`: a dispatched call that may be answered late — its key, session and
//!   provider — from before it is sent until its terminal is durable;
//! - `receipts`: late entries taken in, by `(provider, custodian, call_key, event_id)`, so a
//!   re-read (lost ack, new provider incarnation) never delivers one twice;
//! - `feeds`: each provider module's cursor, as last acked.
//!
//! Markers beside it: `late-results-registered` is synced at the state root before the first
//! registration, so losing the database cannot erase that held intake was ever used;
//! `late-results-rebuild-required` is set when a missing database had that history (spec: it is
//! never cleared by this runtime).

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};

use crate::session_key::SessionKey;

/// The database's file name under the state root.
pub const FILE: &str = "late-results.db";
/// The marker synced before the first registration.
pub const REGISTERED_MARKER: &str = "late-results-registered";
/// The marker left when a missing database with held history was recreated.
pub const REBUILD_MARKER: &str = "late-results-rebuild-required";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS registrations (
    call_key TEXT PRIMARY KEY,
    lineage TEXT NOT NULL,
    project_root TEXT NOT NULL,
    harness TEXT NOT NULL,
    session TEXT NOT NULL,
    run_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    module TEXT NOT NULL,
    registered_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS registrations_by_module ON registrations(module);
CREATE INDEX IF NOT EXISTS registrations_by_lineage ON registrations(lineage);
CREATE TABLE IF NOT EXISTS receipts (
    provider TEXT NOT NULL,
    custodian TEXT NOT NULL,
    call_key TEXT NOT NULL,
    event_id TEXT NOT NULL,
    lineage TEXT NOT NULL,
    PRIMARY KEY (provider, custodian, call_key, event_id)
);
CREATE TABLE IF NOT EXISTS feeds (
    module TEXT PRIMARY KEY,
    incarnation TEXT NOT NULL,
    seq INTEGER NOT NULL
);
";

/// One call registered for late results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub call_key: String,
    pub key: SessionKey,
    pub run_id: String,
    pub tool_call_id: String,
    pub module: String,
}

/// A failure of the intake store.
#[derive(Debug)]
pub enum IntakeError {
    Sql(rusqlite::Error),
    Io(std::io::Error),
}

impl std::fmt::Display for IntakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntakeError::Sql(e) => write!(f, "late-results.db: {e}"),
            IntakeError::Io(e) => write!(f, "late-results.db: {e}"),
        }
    }
}

impl From<rusqlite::Error> for IntakeError {
    fn from(e: rusqlite::Error) -> Self {
        IntakeError::Sql(e)
    }
}

impl From<std::io::Error> for IntakeError {
    fn from(e: std::io::Error) -> Self {
        IntakeError::Io(e)
    }
}

/// The intake store. One connection behind a lock: registrations are one small transaction
/// per dispatch group, entries a row each.
pub struct Intake {
    conn: Mutex<Connection>,
    root: PathBuf,
    /// The registered marker is known to be durable.
    marked: std::sync::atomic::AtomicBool,
    /// The database was recreated without its history: a rebuild from the sessions is needed.
    rebuilt: bool,
}

impl Intake {
    /// Opens (or creates) `late-results.db` under `root`. A missing or unreadable database is
    /// recreated; when held intake was used before, the rebuild marker is set and
    /// [`Intake::needs_rebuild`] says so.
    pub fn open(root: &Path) -> Result<Intake, IntakeError> {
        let path = root.join(FILE);
        let registered = root.join(REGISTERED_MARKER).exists();
        let existed = path.exists();
        let conn = match Self::connect(&path) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("late-results.db is unreadable ({e}); recreating it");
                let _ = std::fs::rename(&path, root.join(format!("{FILE}.unreadable")));
                Self::connect(&path)?
            }
        };
        let rebuilt = registered && (!existed || !conn_has_tables(&conn));
        if rebuilt {
            write_marker(root, REBUILD_MARKER)?;
        }
        conn.execute_batch(SCHEMA)?;
        Ok(Intake {
            conn: Mutex::new(conn),
            root: root.to_owned(),
            marked: std::sync::atomic::AtomicBool::new(registered),
            rebuilt,
        })
    }

    fn connect(path: &Path) -> Result<Connection, IntakeError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // A registration is synced before its call is sent.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))?;
        Ok(conn)
    }

    /// The database was recreated over held history: the sessions must be scanned again.
    pub fn needs_rebuild(&self) -> bool {
        self.rebuilt
    }

    /// Registers a dispatch group in one synced transaction (the marker first, once).
    pub fn register(&self, calls: &[Registration], now_ms: u64) -> Result<(), IntakeError> {
        if calls.is_empty() {
            return Ok(());
        }
        if !self.marked.load(std::sync::atomic::Ordering::Acquire) {
            write_marker(&self.root, REGISTERED_MARKER)?;
            self.marked.store(true, std::sync::atomic::Ordering::Release);
        }
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        for c in calls {
            tx.execute(
                "INSERT OR REPLACE INTO registrations (call_key, lineage, project_root, harness, session, run_id, tool_call_id, module, registered_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![c.call_key, c.key.addr(), c.key.project_root, c.key.harness, c.key.session, c.run_id, c.tool_call_id, c.module, now_ms as i64],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The registration of `call_key`, if any.
    pub fn registration(&self, call_key: &str) -> Result<Option<Registration>, IntakeError> {
        let conn = self.conn.lock();
        let row = conn
            .query_row(
                "SELECT call_key, project_root, harness, session, run_id, tool_call_id, module FROM registrations WHERE call_key = ?1",
                [call_key],
                registration_row,
            )
            .optional()?;
        Ok(row)
    }

    /// Every registration (boot: the sessions to open, the modules to pull).
    pub fn registrations(&self) -> Result<Vec<Registration>, IntakeError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare(
            "SELECT call_key, project_root, harness, session, run_id, tool_call_id, module FROM registrations ORDER BY registered_ms",
        )?;
        let rows = stmt.query_map([], registration_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Whether `module` still has registered calls (its feed is needed).
    pub fn needs_feed(&self, module: &str) -> Result<bool, IntakeError> {
        let conn = self.conn.lock();
        let n: i64 = conn.query_row("SELECT count(*) FROM registrations WHERE module = ?1", [module], |r| r.get(0))?;
        Ok(n > 0)
    }

    /// Drops the registrations of calls whose terminal is durable.
    pub fn prune(&self, call_keys: &[String]) -> Result<(), IntakeError> {
        if call_keys.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        for k in call_keys {
            tx.execute("DELETE FROM registrations WHERE call_key = ?1", [k])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Whether the entry was taken in already.
    pub fn received(&self, key: &cortexkit_role_tool_provider::late_results::IntakeKey) -> Result<bool, IntakeError> {
        let conn = self.conn.lock();
        let n: i64 = conn.query_row(
            "SELECT count(*) FROM receipts WHERE provider = ?1 AND custodian = ?2 AND call_key = ?3 AND event_id = ?4",
            params![key.provider, key.custodian, key.call_key, key.event_id],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    /// Notes an entry taken in.
    pub fn receive(
        &self,
        key: &cortexkit_role_tool_provider::late_results::IntakeKey,
        lineage: &str,
    ) -> Result<(), IntakeError> {
        let conn = self.conn.lock();
        conn.execute(
            "INSERT OR IGNORE INTO receipts (provider, custodian, call_key, event_id, lineage) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key.provider, key.custodian, key.call_key, key.event_id, lineage],
        )?;
        Ok(())
    }

    /// `module`'s cursor as last acked.
    pub fn cursor(&self, module: &str) -> Result<Option<(String, u64)>, IntakeError> {
        let conn = self.conn.lock();
        let row = conn
            .query_row("SELECT incarnation, seq FROM feeds WHERE module = ?1", [module], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .optional()?;
        Ok(row)
    }

    /// Saves `module`'s cursor after an ack (`None`: read from the start next time).
    pub fn set_cursor(&self, module: &str, cursor: Option<(&str, u64)>) -> Result<(), IntakeError> {
        let conn = self.conn.lock();
        match cursor {
            Some((incarnation, seq)) => conn.execute(
                "INSERT OR REPLACE INTO feeds (module, incarnation, seq) VALUES (?1, ?2, ?3)",
                params![module, incarnation, seq as i64],
            )?,
            None => conn.execute("DELETE FROM feeds WHERE module = ?1", [module])?,
        };
        Ok(())
    }

    /// Retention deleted the session: its registrations and receipts go; module feeds stay.
    pub fn forget_lineage(&self, lineage: &str) -> Result<(), IntakeError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM registrations WHERE lineage = ?1", [lineage])?;
        tx.execute("DELETE FROM receipts WHERE lineage = ?1", [lineage])?;
        tx.commit()?;
        Ok(())
    }

    /// Whether the session has registrations (retention must not delete it).
    pub fn has_lineage(&self, lineage: &str) -> Result<bool, IntakeError> {
        let conn = self.conn.lock();
        let n: i64 =
            conn.query_row("SELECT count(*) FROM registrations WHERE lineage = ?1", [lineage], |r| r.get(0))?;
        Ok(n > 0)
    }
}

fn registration_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Registration> {
    Ok(Registration {
        call_key: r.get(0)?,
        key: SessionKey::new(&r.get::<_, String>(1)?, &r.get::<_, String>(2)?, &r.get::<_, String>(3)?),
        run_id: r.get(4)?,
        tool_call_id: r.get(5)?,
        module: r.get(6)?,
    })
}

fn conn_has_tables(conn: &Connection) -> bool {
    conn.query_row("SELECT count(*) FROM sqlite_master WHERE name = 'registrations'", [], |r| r.get::<_, i64>(0))
        .is_ok_and(|n| n > 0)
}

/// Writes an empty marker file durably (file, then its directory).
fn write_marker(root: &Path, name: &str) -> Result<(), IntakeError> {
    let path = root.join(name);
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
    file.sync_all()?;
    crate::wal::sync_dir(root).map_err(|e| IntakeError::Io(std::io::Error::other(e.to_string())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortexkit_role_tool_provider::late_results::IntakeKey;

    fn reg(key: &str, module: &str) -> Registration {
        Registration {
            call_key: key.into(),
            key: SessionKey::new("/p", "h", "s"),
            run_id: "run-1".into(),
            tool_call_id: "c1".into(),
            module: module.into(),
        }
    }

    #[test]
    fn registrations_receipts_and_cursors_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let intake = Intake::open(dir.path()).unwrap();
        assert!(!dir.path().join(REGISTERED_MARKER).exists());
        intake.register(&[reg("l:1", "tools"), reg("l:2", "tools")], 5).unwrap();
        assert!(dir.path().join(REGISTERED_MARKER).exists(), "the marker precedes the first registration");
        let key =
            IntakeKey { provider: "tools".into(), custodian: "c".into(), call_key: "l:1".into(), event_id: "e".into() };
        intake.receive(&key, "l").unwrap();
        intake.set_cursor("tools", Some(("inc", 3))).unwrap();
        intake.prune(&["l:2".into()]).unwrap();
        drop(intake);
        let again = Intake::open(dir.path()).unwrap();
        assert!(!again.needs_rebuild());
        assert_eq!(again.registration("l:1").unwrap(), Some(reg("l:1", "tools")));
        assert_eq!(again.registration("l:2").unwrap(), None);
        assert!(again.received(&key).unwrap() && again.needs_feed("tools").unwrap());
        assert_eq!(again.cursor("tools").unwrap(), Some(("inc".into(), 3)));
        again.forget_lineage(&SessionKey::new("/p", "h", "s").addr()).unwrap();
        assert!(!again.needs_feed("tools").unwrap());
        assert_eq!(again.cursor("tools").unwrap(), Some(("inc".into(), 3)), "the feed row survives a deletion");
    }

    #[test]
    fn a_lost_database_with_held_history_is_marked_for_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        Intake::open(dir.path()).unwrap().register(&[reg("l:1", "tools")], 5).unwrap();
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        let again = Intake::open(dir.path()).unwrap();
        assert!(again.needs_rebuild() && dir.path().join(REBUILD_MARKER).exists());
        let fresh = tempfile::tempdir().unwrap();
        assert!(!Intake::open(fresh.path()).unwrap().needs_rebuild(), "no history, nothing to rebuild");
    }
}
