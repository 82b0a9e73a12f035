//! `late-results.db` (spec §19, §20): the intake store of held calls (`crate::held` runs it;
//! it imports nothing above `session_key`, so retention and the lineage may read it too), under the state root and
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

pub mod fence;

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
    /// recreated; when held intake was used before (the registered marker, or `held_floor`: the
    /// WAL feature floor names `provider-held/v1`), the rebuild marker is set and
    /// [`Intake::needs_rebuild`] says so.
    pub fn open(root: &Path, held_floor: bool) -> Result<Intake, IntakeError> {
        let path = root.join(FILE);
        let registered = root.join(REGISTERED_MARKER).exists();
        let history = registered || held_floor;
        let existed = path.exists();
        let conn = match Self::connect(&path) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("late-results.db is unreadable ({e}); recreating it");
                let _ = std::fs::rename(&path, root.join(format!("{FILE}.unreadable")));
                Self::connect(&path)?
            }
        };
        let rebuilt = history && (!existed || !conn_has_tables(&conn));
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

    /// The session's record is gone (retention deleted it): its registrations and receipts go;
    /// module feeds stay ([`forget_lineage_tx`]).
    pub fn forget_lineage(&self, lineage: &str) -> Result<(), IntakeError> {
        let mut conn = self.conn.lock();
        forget_lineage_tx(&mut conn, lineage)
    }

    /// Every lineage the store holds a registration or a receipt of (boot: which are
    /// tombstoned).
    pub fn lineages(&self) -> Result<Vec<String>, IntakeError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare("SELECT lineage FROM registrations UNION SELECT lineage FROM receipts")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// Removes a lineage's registrations and receipts in one transaction, leaving the module feed
/// rows (cursor, owed ack) other sessions still need (spec §19).
fn forget_lineage_tx(conn: &mut Connection, lineage: &str) -> Result<(), IntakeError> {
    let tx = conn.transaction()?;
    tx.execute("DELETE FROM registrations WHERE lineage = ?1", [lineage])?;
    tx.execute("DELETE FROM receipts WHERE lineage = ?1", [lineage])?;
    tx.commit()?;
    Ok(())
}

/// What the intake store under a state root says of one lineage, read without creating or
/// repairing anything (retention reads it; only the held-call runtime recreates a store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    /// There is no `late-results.db`.
    NoStore,
    /// The store holds this many registrations of the lineage.
    Registrations(u64),
    /// The store exists and cannot be read (not a database, no tables, an I/O error).
    Unreadable(String),
}

/// The lineage's registrations in the store under `root` ([`Holding`]). Opened without
/// `CREATE`, and read-write only so that a closed store's `-wal`/`-shm` files, which a reader of
/// a WAL-mode database needs, are removed again when it closes (a read-only connection would
/// leave them behind).
pub fn holding(root: &Path, lineage: &str) -> Holding {
    let path = root.join(FILE);
    if !path.exists() {
        return Holding::NoStore;
    }
    let read = || -> Result<u64, rusqlite::Error> {
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let n: i64 =
            conn.query_row("SELECT count(*) FROM registrations WHERE lineage = ?1", [lineage], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    match read() {
        Ok(n) => Holding::Registrations(n),
        Err(e) => Holding::Unreadable(e.to_string()),
    }
}

/// Removes the lineage's registrations and receipts from the store under `root` (module feed
/// rows stay). A state root without a store holds none: nothing is created.
pub fn forget_lineage_at(root: &Path, lineage: &str) -> Result<(), IntakeError> {
    let path = root.join(FILE);
    if !path.exists() {
        return Ok(());
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(&path, flags)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    forget_lineage_tx(&mut conn, lineage)
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
        let intake = Intake::open(dir.path(), false).unwrap();
        assert!(!dir.path().join(REGISTERED_MARKER).exists());
        intake.register(&[reg("l:1", "tools"), reg("l:2", "tools")], 5).unwrap();
        assert!(dir.path().join(REGISTERED_MARKER).exists(), "the marker precedes the first registration");
        let key =
            IntakeKey { provider: "tools".into(), custodian: "c".into(), call_key: "l:1".into(), event_id: "e".into() };
        intake.receive(&key, "l").unwrap();
        intake.set_cursor("tools", Some(("inc", 3))).unwrap();
        intake.prune(&["l:2".into()]).unwrap();
        drop(intake);
        let again = Intake::open(dir.path(), false).unwrap();
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
        Intake::open(dir.path(), false).unwrap().register(&[reg("l:1", "tools")], 5).unwrap();
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        let again = Intake::open(dir.path(), false).unwrap();
        assert!(again.needs_rebuild() && dir.path().join(REBUILD_MARKER).exists());
        let fresh = tempfile::tempdir().unwrap();
        assert!(!Intake::open(fresh.path(), false).unwrap().needs_rebuild(), "no history, nothing to rebuild");
        // A WAL feature floor naming provider-held/v1 is held history too (a WAL with held
        // frames may have come without its registrations, e.g. by a move).
        let floored = tempfile::tempdir().unwrap();
        assert!(Intake::open(floored.path(), true).unwrap().needs_rebuild());
        assert!(floored.path().join(REBUILD_MARKER).exists());
    }

    #[test]
    fn retention_reads_a_lineage_without_creating_or_repairing_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let lineage = SessionKey::new("/p", "h", "s").addr();
        assert_eq!(holding(dir.path(), &lineage), Holding::NoStore);
        forget_lineage_at(dir.path(), &lineage).unwrap();
        assert!(!dir.path().join(FILE).exists(), "reading or forgetting creates no store");
        let intake = Intake::open(dir.path(), false).unwrap();
        intake.register(&[reg("l:1", "tools")], 5).unwrap();
        let key =
            IntakeKey { provider: "tools".into(), custodian: "c".into(), call_key: "l:1".into(), event_id: "e".into() };
        intake.receive(&key, &lineage).unwrap();
        intake.set_cursor("tools", Some(("inc", 3))).unwrap();
        assert_eq!(holding(dir.path(), &lineage), Holding::Registrations(1));
        assert_eq!(holding(dir.path(), "other"), Holding::Registrations(0));
        assert_eq!(intake.lineages().unwrap(), vec![lineage.clone()]);
        forget_lineage_at(dir.path(), &lineage).unwrap();
        assert_eq!(holding(dir.path(), &lineage), Holding::Registrations(0));
        assert!(!intake.received(&key).unwrap() && intake.lineages().unwrap().is_empty());
        assert_eq!(intake.cursor("tools").unwrap(), Some(("inc".into(), 3)), "the feed row stays");
        drop(intake);
        // Closed (its -wal and -shm files gone), the store still reads, and leaves none behind.
        assert!(!dir.path().join(format!("{FILE}-shm")).exists());
        assert_eq!(holding(dir.path(), &lineage), Holding::Registrations(0));
        assert!(!dir.path().join(format!("{FILE}-shm")).exists() && !dir.path().join(format!("{FILE}-wal")).exists());
        std::fs::write(dir.path().join(FILE), b"not a database, not at all, no").unwrap();
        assert!(matches!(holding(dir.path(), &lineage), Holding::Unreadable(_)));
        assert!(forget_lineage_at(dir.path(), &lineage).is_err());
    }
}
