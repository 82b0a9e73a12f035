//! `run-index.db`: the derived projection of the WALs (SQLite). Never the source of truth:
//! deleting it loses nothing, because reopening a lineage derives everything again.
//!
//! Tables:
//! - `lineages`: one row per lineage: its key, WAL path, incarnation and the **checkpoint**
//!   (watermark seq, offset of the next frame, serialized replay state) that lets an open
//!   replay only the WAL tail;
//! - `transcript`: materialized messages up to the lineage's watermark;
//! - `runs`: `run_id → {session, lineage, submission_id, state, wal_path, title, usage, …}`; a
//!   terminal row is never overwritten by a nonterminal one;
//! - `sends`: the send ledger: each durably queued send's request identity and fate (pending,
//!   started, delivered into a run, retracted), keyed by submission id and looked up by send id;
//! - `export_facts` / `export_meta`: the metering lane (spec §17b), insert-once, readable by
//!   other processes with `mode=ro` while broca writes (WAL journal mode).
//!
//! Invariant: a flush writes messages, run rows, facts and the checkpoint in one transaction,
//! so the watermark never claims messages the table lacks.

mod error;
pub mod export;
#[cfg(debug_assertions)]
mod faults;
mod sends;
pub mod writer;

pub use error::StoreError;
#[cfg(debug_assertions)]
use faults::FlushFaults;
pub use sends::{Fate, SendLookup, SendRow};

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};

use crate::clock::SharedClock;
use crate::message::Message;
use crate::replay::Resolution;
use crate::replay::{Effect, Replay, RunState, SendFate};
use crate::session_key::SessionKey;

/// One transcript message with the facts a read serves beside it (internal 0-based ordinal).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub ordinal: u64,
    /// The run whose episode the message belongs to.
    pub run_id: String,
    /// Its recorded write time (unix ms), when one was recorded.
    pub written_at: Option<u64>,
    pub message: Message,
}

/// Bumped when derived tables change shape.
const SCHEMA_VERSION: i64 = 6;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS lineages (
    lineage TEXT PRIMARY KEY,
    project_root TEXT NOT NULL,
    harness TEXT NOT NULL,
    session TEXT NOT NULL,
    wal_path TEXT NOT NULL,
    incarnation TEXT NOT NULL,
    watermark_seq INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    replay TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS transcript (
    lineage TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    wal_seq INTEGER NOT NULL,
    written_at INTEGER,
    message TEXT NOT NULL,
    PRIMARY KEY (lineage, ordinal)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT NOT NULL,
    lineage TEXT NOT NULL,
    session TEXT NOT NULL,
    harness TEXT NOT NULL,
    project_root TEXT NOT NULL,
    submission_id TEXT,
    state TEXT NOT NULL,
    reason TEXT,
    error TEXT,
    terminal INTEGER NOT NULL DEFAULT 0,
    wal_path TEXT NOT NULL,
    title TEXT,
    started_seq INTEGER,
    updated_seq INTEGER NOT NULL,
    usage TEXT,
    auth_selection TEXT,
    detail TEXT,
    undelivered_steers TEXT,
    finish TEXT,
    PRIMARY KEY (lineage, run_id)
);
CREATE INDEX IF NOT EXISTS runs_by_id ON runs (run_id);
CREATE TABLE IF NOT EXISTS sends (
    lineage TEXT NOT NULL,
    submission_id TEXT NOT NULL,
    send_id TEXT,
    request TEXT NOT NULL,
    fate TEXT NOT NULL,
    run_id TEXT,
    queued_seq INTEGER NOT NULL,
    PRIMARY KEY (lineage, submission_id)
);
CREATE INDEX IF NOT EXISTS sends_by_send_id ON sends (lineage, send_id);
CREATE TABLE IF NOT EXISTS export_facts (
    export_seq INTEGER PRIMARY KEY AUTOINCREMENT,
    fact_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    lineage TEXT NOT NULL,
    session TEXT NOT NULL,
    harness TEXT NOT NULL,
    project_root TEXT NOT NULL,
    run_id TEXT NOT NULL,
    provider TEXT,
    model TEXT,
    variant TEXT,
    steps INTEGER NOT NULL,
    unreported_steps INTEGER NOT NULL,
    input_tokens INTEGER,
    cached_input_tokens INTEGER,
    cache_write_tokens INTEGER,
    output_tokens INTEGER,
    reasoning_tokens INTEGER,
    terminal_reason TEXT NOT NULL,
    occurred_at_ms INTEGER,
    occurred_at_precision TEXT NOT NULL,
    recorded_at_ms INTEGER NOT NULL,
    warm INTEGER NOT NULL DEFAULT 0,
    pricing_at_ms INTEGER,
    pricing_at_precision TEXT NOT NULL DEFAULT 'degraded'
);
CREATE TABLE IF NOT EXISTS export_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"#;

/// Where a lineage's materialized prefix ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub incarnation: String,
    /// The last record covered.
    pub watermark_seq: u64,
    /// Offset of the frame after the watermark.
    pub next_offset: u64,
    pub replay: Replay,
}

/// Derived facts waiting to be written, with the checkpoint they bring the store to.
#[derive(Debug, Default)]
pub struct StoreBatch {
    pub effects: Vec<Effect>,
    pub checkpoint: Option<Checkpoint>,
}

impl StoreBatch {
    pub fn is_empty(&self) -> bool {
        self.effects.is_empty() && self.checkpoint.is_none()
    }

    /// Messages held, for the flush threshold.
    pub fn len(&self) -> usize {
        self.effects.len()
    }
}

/// A run's row in the index.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub lineage: String,
    pub session: String,
    pub submission_id: Option<String>,
    pub state: String,
    pub reason: Option<String>,
    pub error: Option<String>,
    pub terminal: bool,
    pub wal_path: String,
    pub title: Option<String>,
    /// The terminal usage (JSON), once the run finished.
    pub usage: Option<String>,
    pub auth_selection: Option<String>,
    /// The terminal's typed detail (JSON), when it has one.
    pub detail: Option<String>,
    /// The steers the run never showed a model (JSON list), once it finished.
    pub undelivered_steers: Option<String>,
    /// The normalized finish of the run's last model step, once it finished.
    pub finish: Option<String>,
}

/// The `-wal` size up to which a closing store leaves the WAL as it is. The next process to
/// open the database rebuilds its WAL index by reading the whole file (start-up time grows with
/// it), so past this a closing store checkpoints and truncates it: a few fsyncs every few CLI
/// turns instead of every turn, and an open that reads at most this much.
pub const WAL_KEEP_BYTES: u64 = 1 << 20;

/// Read connections of a store: readers never wait for the writer's connection (WAL mode lets
/// them read the last committed state while a flush runs).
const READ_CONNECTIONS: usize = 4;

/// Invariants: `conn` is the only connection that writes (the run-index writer thread's
/// flushes, and the rare `forget_lineage`), each write one transaction under its lock;
/// `readers` run `SELECT`s only (`query_only`), and so does a read that borrows `conn`.
pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Opened on first use: each connection parses the schema, which a short-lived process
    /// (a `broca-run` turn reads one checkpoint) should not pay four times at start.
    readers: Vec<Mutex<Option<Connection>>>,
    next_reader: std::sync::atomic::AtomicUsize,
    /// Whether a read ever found `conn` busy (and so opened a reader). Until then reads use
    /// `conn` when it is free: between flushes it holds no transaction, and a `broca-run` turn
    /// then opens one connection, not two, before its request.
    readers_needed: std::sync::atomic::AtomicBool,
    /// Set by [`Store::use_one_connection`]: every read waits for `conn` and no reader is ever
    /// opened.
    one_connection: std::sync::atomic::AtomicBool,
    /// What recorded times read (`export_facts.recorded_at_ms`).
    clock: SharedClock,
    #[cfg(debug_assertions)]
    faults: FlushFaults,
}

/// Leaves SQLite's `-wal` file in place when the last connection closes, instead of
/// checkpointing it into the database and deleting it. A short-lived process (a `broca-run`
/// turn) then costs no checkpoint fsyncs at exit and no WAL re-creation (header and directory
/// fsyncs) at its next start; nothing committed is lost (the WAL is read back on open). What
/// bounds the WAL is the writer's automatic checkpoints and [`WAL_KEEP_BYTES`] at close.
fn keep_wal_on_close(conn: &Connection) -> Result<(), StoreError> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    Ok(())
}

impl Drop for Store {
    fn drop(&mut self) {
        let wal = PathBuf::from(format!("{}-wal", self.path.display()));
        if std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_KEEP_BYTES) {
            // Readers first: a checkpoint cannot truncate past a reader's snapshot.
            for reader in &self.readers {
                reader.lock().take();
            }
            if let Err(e) = self.conn.lock().execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
                log::warn!("run-index.db: checkpoint at close failed: {e}");
            }
        }
    }
}

impl Store {
    /// Opens (or creates, 0600, minting `source_instance_id`) the database at `path`, its
    /// times read from the process's clock ([`crate::clock::from_env`]).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_clocked(path, crate::clock::from_env())
    }

    /// [`Store::open`] with the clock its recorded times read.
    pub fn open_clocked(path: &Path, clock: SharedClock) -> Result<Store, StoreError> {
        if !path.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(|source| StoreError::Io { path: path.into(), source })?;
        }
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        keep_wal_on_close(&conn)?;
        // A database derived by an older layout is derived again: its lineages replay from
        // their WAL on next open (the metering lane is kept; it is insert-once). A current one
        // is left as it is: opening writes nothing (no transaction, so no WAL frame or fsync).
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version != SCHEMA_VERSION {
            // One transaction: the version is never current without the rows it implies.
            let tx = conn.unchecked_transaction()?;
            if version < SCHEMA_VERSION {
                tx.execute_batch("DROP TABLE IF EXISTS runs; DROP TABLE IF EXISTS transcript; DROP TABLE IF EXISTS sends; DROP TABLE IF EXISTS lineages;")?;
            }
            tx.execute_batch(SCHEMA)?;
            export::add_warm_column(&tx)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            tx.execute(
                "INSERT OR IGNORE INTO export_meta (key, value) VALUES ('source_instance_id', ?1)",
                [uuid::Uuid::new_v4().to_string()],
            )?;
            tx.execute("INSERT OR IGNORE INTO export_meta (key, value) VALUES ('high_water', '0')", [])?;
            tx.commit()?;
        }
        export::add_system_one_columns(&conn)?;
        let readers = (0..READ_CONNECTIONS).map(|_| Mutex::new(None)).collect();
        Ok(Store {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            readers,
            next_reader: Default::default(),
            readers_needed: Default::default(),
            one_connection: Default::default(),
            clock,
            #[cfg(debug_assertions)]
            faults: Default::default(),
        })
    }

    /// For a short-lived single-turn process (a `broca-run` turn): reads wait for the writer's
    /// connection instead of opening their own while a flush runs. Opening one parses the
    /// schema (about 1.5 ms, on the turn's way to its first request); waiting costs one flush.
    /// No writer path reads while it holds `conn`, so the wait cannot deadlock.
    pub fn use_one_connection(&self) {
        self.one_connection.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A read connection: a free one if any, else the next in turn; opened on first use.
    fn reader(&self) -> Result<parking_lot::MappedMutexGuard<'_, Connection>, StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.one_connection.load(Relaxed) {
            return Ok(parking_lot::MutexGuard::map(self.conn.lock(), |c| c));
        }
        if !self.readers_needed.load(Relaxed) {
            match self.conn.try_lock() {
                Some(idle) => return Ok(parking_lot::MutexGuard::map(idle, |c| c)),
                None => self.readers_needed.store(true, Relaxed),
            }
        }
        let mut slot = match self.readers.iter().find_map(|r| r.try_lock()) {
            Some(free) => free,
            None => {
                let i = self.next_reader.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.readers.len();
                self.readers[i].lock()
            }
        };
        if slot.is_none() {
            let reader = Connection::open(&self.path)?;
            reader.busy_timeout(std::time::Duration::from_secs(5))?;
            reader.pragma_update(None, "query_only", true)?;
            keep_wal_on_close(&reader)?;
            *slot = Some(reader);
        }
        parking_lot::MutexGuard::try_map(slot, Option::as_mut)
            .map_err(|_| StoreError::Damaged("a read connection went missing".into()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lineage's checkpoint, if its prefix is materialized.
    pub fn checkpoint(&self, lineage: &str) -> Result<Option<Checkpoint>, StoreError> {
        let conn = self.reader()?;
        let row = conn
            .query_row(
                "SELECT incarnation, watermark_seq, next_offset, replay FROM lineages WHERE lineage = ?1",
                [lineage],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, String>(3)?)),
            )
            .optional()?;
        let Some((incarnation, seq, offset, replay)) = row else {
            return Ok(None);
        };
        let replay: Replay =
            serde_json::from_str(&replay).map_err(|e| StoreError::Damaged(format!("checkpoint: {e}")))?;
        Ok(Some(Checkpoint { incarnation, watermark_seq: seq as u64, next_offset: offset as u64, replay }))
    }

    /// Sessions whose last checkpoint shows work a process must pick up: a queued send, or a
    /// run still open (a crash left it). Boot recovery opens them so queued work is never left
    /// idle and orphans are sealed; the WAL then decides.
    pub fn sessions_with_work(&self) -> Result<Vec<SessionKey>, StoreError> {
        use crate::record::PauseReason;
        self.sessions_where(|replay| {
            let open = matches!(
                replay.resolution(),
                Resolution::Resume { .. } | Resolution::Paused { reason: PauseReason::Restart, .. }
            );
            open || !replay.queue.is_empty()
        })
    }

    /// The bind triple of the lineage at `addr`, as its row records it (`None`: no row). The
    /// held-call intake's rebuild names a WAL it found this way when the WAL's held records do
    /// not name their session (records written before they did).
    pub fn key_of(&self, addr: &str) -> Result<Option<SessionKey>, StoreError> {
        let conn = self.reader()?;
        let row = conn
            .query_row("SELECT project_root, harness, session FROM lineages WHERE lineage = ?1", [addr], |r| {
                Ok(SessionKey::new(&r.get::<_, String>(0)?, &r.get::<_, String>(1)?, &r.get::<_, String>(2)?))
            })
            .optional()?;
        Ok(row)
    }

    /// The sessions whose stored replay state `wanted` picks (unreadable states are skipped).
    fn sessions_where(&self, wanted: impl Fn(&Replay) -> bool) -> Result<Vec<SessionKey>, StoreError> {
        let conn = self.reader()?;
        let mut stmt = conn.prepare("SELECT project_root, harness, session, replay FROM lineages")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (root, harness, session, replay) = row?;
            let Ok(replay) = serde_json::from_str::<Replay>(&replay) else { continue };
            if wanted(&replay) {
                out.push(SessionKey::new(&root, &harness, &session));
            }
        }
        Ok(out)
    }

    /// Drops everything derived from a lineage (its WAL was replaced: a new incarnation).
    pub fn forget_lineage(&self, lineage: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM transcript WHERE lineage = ?1", [lineage])?;
        tx.execute("DELETE FROM runs WHERE lineage = ?1", [lineage])?;
        tx.execute("DELETE FROM sends WHERE lineage = ?1", [lineage])?;
        tx.execute("DELETE FROM lineages WHERE lineage = ?1", [lineage])?;
        tx.commit()?;
        Ok(())
    }

    /// Writes a batch in one transaction.
    pub fn flush(&self, key: &SessionKey, wal_path: &Path, batch: &StoreBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let at = FlushAt {
            key,
            lineage: key.addr(),
            wal: wal_path.to_string_lossy().into_owned(),
            recorded_at_ms: self.clock.now_ms(),
        };
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        for effect in &batch.effects {
            match effect {
                Effect::Message { ordinal, run_id, seq, written_at, message } => {
                    let json = serde_json::to_string(message).expect("messages serialize");
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO transcript (lineage, ordinal, run_id, wal_seq, written_at, message) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![at.lineage, *ordinal as i64, run_id, *seq as i64, written_at.map(|t| t as i64), json])?;
                }
                Effect::RunState { run_id, submission_id, state, seq } => {
                    at.put_run_state(&tx, run_id, submission_id.as_deref(), state, *seq)?
                }
                Effect::Send { submission_id, fate, seq } => at.put_send(&tx, submission_id, fate, *seq)?,
                Effect::Warm { seq, warm } => {
                    export::insert_warm_fact(&tx, key, &at.lineage, *seq, warm, at.recorded_at_ms)?
                }
            }
        }
        if let Some(cp) = &batch.checkpoint {
            at.put_checkpoint(&tx, cp)?;
            crate::failpoint!("store.mid_checkpoint");
        }
        tx.execute(
            "UPDATE export_meta SET value = (SELECT COALESCE(MAX(export_seq), 0) FROM export_facts) WHERE key = 'high_water'",
            [],
        )?;
        #[cfg(debug_assertions)]
        self.faults.at_commit(&self.path)?;
        tx.commit()?;
        Ok(())
    }

    /// Publishes `system_one` facts (spec §4b "Metering"), insert-once, in one transaction with
    /// the high-water mark; returns how many were new.
    pub fn publish_system_one(&self, facts: &[export::SystemOneFact]) -> Result<usize, StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        let added = export::insert_system_one_facts(&tx, facts, self.clock.now_ms())?;
        tx.execute(
            "UPDATE export_meta SET value = (SELECT COALESCE(MAX(export_seq), 0) FROM export_facts) WHERE key = 'high_water'",
            [],
        )?;
        tx.commit()?;
        Ok(added)
    }

    /// Fails the `nth` flush from now (1: the next) at its commit, as an I/O error there would:
    /// the transaction rolls back and the flush returns the error (debug builds only; the
    /// storage-seam tests' fault point for `run-index.db`).
    #[cfg(debug_assertions)]
    pub fn fail_flush(&self, nth: u64) {
        self.faults.arm(nth);
    }

    /// Flushes committed or failed so far (debug builds only).
    #[cfg(debug_assertions)]
    pub fn flushes(&self) -> u64 {
        self.faults.seen.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Materialized messages `[from, from + limit)` of a lineage, in ordinal order.
    pub fn messages(&self, lineage: &str, from: u64, limit: u64) -> Result<Vec<(u64, Message)>, StoreError> {
        Ok(self.entries(lineage, from, limit)?.into_iter().map(|e| (e.ordinal, e.message)).collect())
    }

    /// Materialized entries `[from, from + limit)` with their run and write time.
    pub fn entries(&self, lineage: &str, from: u64, limit: u64) -> Result<Vec<Entry>, StoreError> {
        let conn = self.reader()?;
        let mut stmt = conn.prepare_cached(
            "SELECT ordinal, run_id, written_at, message FROM transcript WHERE lineage = ?1 AND ordinal >= ?2 ORDER BY ordinal LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![lineage, from as i64, limit.min(i64::MAX as u64) as i64], |r| {
            let written_at = r.get::<_, Option<i64>>(2)?.map(|t| t as u64);
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?, written_at, r.get::<_, String>(3)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (ordinal, run_id, written_at, json) = row?;
            let message =
                serde_json::from_str(&json).map_err(|e| StoreError::Damaged(format!("message {ordinal}: {e}")))?;
            out.push(Entry { ordinal, run_id, written_at, message });
        }
        Ok(out)
    }

    /// The newest materialized message of `run_id` with `role`.
    pub fn last_message_of_run(
        &self,
        lineage: &str,
        run_id: &str,
        role: crate::message::Role,
    ) -> Result<Option<(u64, Message)>, StoreError> {
        let conn = self.reader()?;
        let mut stmt = conn.prepare_cached(
            "SELECT ordinal, message FROM transcript WHERE lineage = ?1 AND run_id = ?2 ORDER BY ordinal DESC",
        )?;
        let mut rows = stmt.query(params![lineage, run_id])?;
        while let Some(row) = rows.next()? {
            let (ordinal, json): (i64, String) = (row.get(0)?, row.get(1)?);
            let message: Message =
                serde_json::from_str(&json).map_err(|e| StoreError::Damaged(format!("message {ordinal}: {e}")))?;
            if message.role == role {
                return Ok(Some((ordinal as u64, message)));
            }
        }
        Ok(None)
    }

    /// The index row of `run_id` (most recently updated if several lineages used the id).
    pub fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError> {
        let conn = self.reader()?;
        let row = conn
            .query_row(
                "SELECT run_id, lineage, session, submission_id, state, reason, error, terminal, wal_path, title, usage, auth_selection, detail, undelivered_steers, finish FROM runs
                 WHERE run_id = ?1 ORDER BY updated_seq DESC LIMIT 1",
                [run_id],
                |r| {
                    Ok(RunRow {
                        run_id: r.get(0)?,
                        lineage: r.get(1)?,
                        session: r.get(2)?,
                        submission_id: r.get(3)?,
                        state: r.get(4)?,
                        reason: r.get(5)?,
                        error: r.get(6)?,
                        terminal: r.get(7)?,
                        wal_path: r.get(8)?,
                        title: r.get(9)?,
                        usage: r.get(10)?,
                        auth_selection: r.get(11)?,
                        detail: r.get(12)?,
                        undelivered_steers: r.get(13)?,
                        finish: r.get(14)?,
                    })
                },
            )
            .optional()?;
        Ok(row)
    }

    /// The ledger row of a send, by its submission id or (the newest) by its send id.
    pub fn send(&self, lineage: &str, by: SendLookup<'_>) -> Result<Option<SendRow>, StoreError> {
        // A sender's namespace is the `principal` its requests record (absent for the owner's).
        let (sql, key, principal) = match by {
            SendLookup::Submission(id) => (
                "SELECT submission_id, request, fate, run_id FROM sends WHERE lineage = ?1 AND submission_id = ?2
                 AND ?3 IS NULL",
                id,
                None,
            ),
            SendLookup::SendId { send_id, principal } => (
                "SELECT submission_id, request, fate, run_id FROM sends WHERE lineage = ?1 AND send_id = ?2
                 AND json_extract(request, '$.principal') IS ?3 ORDER BY queued_seq DESC LIMIT 1",
                send_id,
                principal,
            ),
        };
        let conn = self.reader()?;
        let row = conn
            .query_row(sql, params![lineage, key, principal], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                ))
            })
            .optional()?;
        let Some((submission_id, request, fate, run_id)) = row else { return Ok(None) };
        let request =
            serde_json::from_str(&request).map_err(|e| StoreError::Damaged(format!("send {submission_id}: {e}")))?;
        let fate: String = fate;
        let fate = Fate::parse(&fate)
            .ok_or_else(|| StoreError::Damaged(format!("send {submission_id}: unknown fate {fate:?}")))?;
        Ok(Some(SendRow { submission_id, request, fate, run_id }))
    }
}

/// One flush's lineage: the rows it writes, inside the flush's transaction.
struct FlushAt<'a> {
    key: &'a SessionKey,
    lineage: String,
    wal: String,
    /// When this flush records its rows (the store's clock).
    recorded_at_ms: u64,
}

impl FlushAt<'_> {
    /// A run's row: never overwritten once terminal, nor by an older record; a terminal also
    /// writes its export facts.
    fn put_run_state(
        &self,
        tx: &Connection,
        run_id: &str,
        submission_id: Option<&str>,
        state: &RunState,
        seq: u64,
    ) -> Result<(), StoreError> {
        let (name, reason, error, terminal) = match state {
            RunState::Active { .. } => ("active", None, None, false),
            RunState::Paused { reason, error } => {
                ("paused", Some(json_str(reason)), error.as_ref().map(json_string), false)
            }
            RunState::Finished { reason, error, .. } => {
                ("terminal", Some(reason.as_str().to_string()), error.as_ref().map(json_string), true)
            }
        };
        let (title, auth_selection) = match state {
            RunState::Active { title, auth_selection, .. } => (title.clone(), auth_selection.as_ref().map(json_string)),
            _ => (None, None),
        };
        let (usage, detail, undelivered, finish) = match state {
            RunState::Finished { usage, detail, undelivered_steers, finish, .. } => (
                Some(json_string(usage)),
                detail.as_ref().map(json_string),
                Some(json_string(undelivered_steers)),
                finish.clone(),
            ),
            _ => (None, None, None, None),
        };
        let key = self.key;
        tx.prepare_cached(
            "INSERT INTO runs (run_id, lineage, session, harness, project_root, submission_id, state, reason, error, terminal, wal_path, started_seq, updated_seq, title, usage, auth_selection, detail, undelivered_steers, finish)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
             ON CONFLICT (lineage, run_id) DO UPDATE SET state = excluded.state, reason = excluded.reason,
                 error = excluded.error, terminal = excluded.terminal, updated_seq = excluded.updated_seq,
                 title = COALESCE(runs.title, excluded.title), usage = COALESCE(excluded.usage, runs.usage),
                 auth_selection = COALESCE(runs.auth_selection, excluded.auth_selection),
                 detail = excluded.detail, undelivered_steers = excluded.undelivered_steers, finish = excluded.finish
             WHERE runs.terminal = 0 AND excluded.updated_seq >= runs.updated_seq",
        )?
        .execute(params![
            run_id,
            self.lineage,
            key.session,
            key.harness,
            key.project_root,
            submission_id,
            name,
            reason,
            error,
            terminal,
            self.wal,
            seq as i64,
            title,
            usage,
            auth_selection,
            detail,
            undelivered,
            finish
        ])?;
        if let RunState::Finished { reason, usage, at_ms, priced_at, .. } = state {
            let times = (*at_ms, self.recorded_at_ms);
            export::insert_facts(tx, key, &self.lineage, run_id, reason.as_str(), (usage, priced_at), times)?;
        }
        Ok(())
    }

    /// A send's ledger row: inserted once when queued, its fate updated as it is consumed.
    fn put_send(&self, tx: &Connection, submission_id: &str, fate: &SendFate, seq: u64) -> Result<(), StoreError> {
        let lineage = &self.lineage;
        let (fate, run_id) = match fate {
            SendFate::Queued(request) => {
                tx.prepare_cached(
                    "INSERT INTO sends (lineage, submission_id, send_id, request, fate, queued_seq) VALUES (?1, ?2, ?3, ?4, 'pending', ?5)
                     ON CONFLICT (lineage, submission_id) DO NOTHING",
                )?
                .execute(params![lineage, submission_id, request.send_id, json_string(request), seq as i64])?;
                return Ok(());
            }
            SendFate::Started { run_id } => (Fate::Started, Some(run_id)),
            SendFate::Delivered { run_id } => (Fate::Delivered, Some(run_id)),
            SendFate::Retracted => (Fate::Retracted, None),
            SendFate::Dropped(reason) => (Fate::dropped(*reason), None),
        };
        tx.prepare_cached("UPDATE sends SET fate = ?3, run_id = ?4 WHERE lineage = ?1 AND submission_id = ?2")?
            .execute(params![lineage, submission_id, fate.as_str(), run_id])?;
        Ok(())
    }

    /// The lineage's checkpoint: where an open resumes its replay.
    fn put_checkpoint(&self, tx: &Connection, cp: &Checkpoint) -> Result<(), StoreError> {
        let replay = serde_json::to_string(&cp.replay).expect("replay state serializes");
        let key = self.key;
        tx.execute(
            "INSERT INTO lineages (lineage, project_root, harness, session, wal_path, incarnation, watermark_seq, next_offset, replay)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (lineage) DO UPDATE SET wal_path = excluded.wal_path, incarnation = excluded.incarnation,
                 watermark_seq = excluded.watermark_seq, next_offset = excluded.next_offset, replay = excluded.replay",
            params![
                self.lineage,
                key.project_root,
                key.harness,
                key.session,
                self.wal,
                cp.incarnation,
                cp.watermark_seq as i64,
                cp.next_offset as i64,
                replay
            ],
        )?;
        Ok(())
    }
}

fn json_string<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializes")
}

/// A unit enum's bare name (`"auth_required"` → `auth_required`).
fn json_str<T: serde::Serialize>(v: &T) -> String {
    json_string(v).trim_matches('"').to_string()
}
