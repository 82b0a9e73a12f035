//! `system-one.db` (spec §4b "Durable batches" and "Metering"; model-batch RULES §2–§6): the
//! authority for every admitted classifier batch and its item outcomes, under the state root and
//! outside Engram backups. Nothing here touches a session, a lease or a WAL.
//!
//! Tables:
//! - `batches`: one row per `batch_id`: its body identity (model, questions digest, item
//!   digests), its frozen attribution, its recorded ceiling (it only tightens), when it was first
//!   admitted, and the hold of the call that runs it now (single flight);
//! - `items`: each item's outcome, written before the reply: an answer (the answers' JSON text
//!   as the provider spelled its numbers, usage, batch-accounted cost) or a stored item error;
//! - `intents`: immutable measurement intents, committed in the outcome's transaction and
//!   published to `run-index.db` later (`published` set once they are).
//!
//! Invariants: an answered item is never overwritten; a stored transient error is the only
//! outcome a later one replaces; a hold names the process incarnation that took it, and every
//! hold is released when a process starts (its holder is dead); a batch and its items are
//! deleted [`RETENTION_MS`] after first admission, and a published intent with them.

use std::collections::BTreeMap;
use std::path::Path;

use cortexkit_role_classifier::identity::BatchIdentity;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The database's file name under the state root.
pub const FILE: &str = "system-one.db";
/// How long a batch and its outcomes are kept after first admission (spec §4b).
pub const RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    agent_id TEXT,
    run_id TEXT,
    flow_id TEXT,
    ceiling_nanos INTEGER,
    admitted_ms INTEGER NOT NULL,
    holder TEXT,
    held_ms INTEGER
);
CREATE INDEX IF NOT EXISTS batches_by_admission ON batches(admitted_ms);
CREATE TABLE IF NOT EXISTS items (
    batch_id TEXT NOT NULL,
    item INTEGER NOT NULL,
    answers TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cost_nanos INTEGER,
    spend_nanos INTEGER,
    error_code TEXT,
    error_message TEXT,
    error_transient INTEGER,
    recorded_ms INTEGER NOT NULL,
    PRIMARY KEY (batch_id, item)
);
CREATE TABLE IF NOT EXISTS intents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL,
    item INTEGER NOT NULL,
    fact TEXT NOT NULL,
    admitted_ms INTEGER NOT NULL,
    published INTEGER NOT NULL DEFAULT 0,
    UNIQUE (batch_id, item, fact)
);
";

/// Whom a batch's work is for: a daemon-stamped run scope or a flow (spec §4b "Work scope").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    pub agent_id: Option<String>,
    pub run_id: Option<String>,
    pub flow_id: Option<String>,
}

/// Tokens the provider reported for one item; absent is not zero (RULES §10).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ItemUsage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// One item's recorded outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The answers object's JSON text, provider numbers as sent (RULES §12), with the reported
    /// usage, its cost from reported tokens (absent when unpriced or a priced count was not
    /// reported, RULES §10), and the spend the batch ceiling counts (reported tokens, input
    /// estimated when unreported; 0 when unpriced).
    Answered { answers: String, usage: ItemUsage, cost_nanos: Option<u64>, spend_nanos: u64 },
    /// A stored item error; `transient` ones are retried on a re-send (RULES §4).
    Failed { code: String, message: String, transient: bool },
}

impl Outcome {
    /// Whether a re-send asks the provider again for this item.
    pub fn retried_on_resend(&self) -> bool {
        matches!(self, Outcome::Failed { transient: true, .. })
    }
}

/// A call arriving for a batch.
#[derive(Clone, Debug)]
pub struct Arrival<'a> {
    pub batch_id: &'a str,
    pub identity: &'a BatchIdentity,
    pub attribution: &'a Attribution,
    /// The call's `max_cost_usd` in nanodollars (rounded down), if it carries one.
    pub ceiling_nanos: Option<u64>,
    /// The incarnation of this process: the hold's owner.
    pub holder: &'a str,
    pub now_ms: u64,
}

/// An admitted call: it holds the batch until [`SystemOne::release`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The batch was unknown and is now recorded.
    pub first: bool,
    /// The effective ceiling, recorded durably before any provider call (RULES §5).
    pub ceiling_nanos: Option<u64>,
    /// The batch's stored outcomes by item index.
    pub outcomes: BTreeMap<u64, Outcome>,
}

/// Why a call was not admitted; nothing was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The `batch_id` names a different body: `batch_id_reuse` naming the first difference.
    Reuse { field: String },
    /// Another call holds the batch: `batch_in_progress`.
    InProgress { held_ms: u64 },
    /// The batch froze another attribution: `batch_scope_mismatch`.
    ScopeMismatch,
}

/// A measurement intent waiting to be published to `run-index.db`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    pub id: i64,
    pub batch_id: String,
    pub item: u64,
    /// The fact's JSON text, immutable once committed.
    pub fact: String,
}

/// A failure of the store.
#[derive(Debug)]
pub enum StoreError {
    Sql(rusqlite::Error),
    /// A recorded identity that no longer decodes (a damaged row).
    Identity(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Sql(e) => write!(f, "{FILE}: {e}"),
            StoreError::Identity(e) => write!(f, "{FILE}: a recorded batch identity does not decode: {e}"),
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sql(e)
    }
}

/// The store: one connection behind a lock; each admission and each outcome is one short,
/// synced transaction.
pub struct SystemOne {
    conn: Mutex<Connection>,
}

impl SystemOne {
    /// Opens (or creates) `system-one.db` under `root`.
    pub fn open(root: &Path) -> Result<SystemOne, StoreError> {
        let conn = Connection::open(root.join(FILE))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // An outcome is durable before the reply that reports it.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(SystemOne { conn: Mutex::new(conn) })
    }

    /// Releases every hold: called once at start, when every holder is a dead process.
    pub fn release_all(&self) -> Result<usize, StoreError> {
        let conn = self.conn.lock();
        Ok(conn.execute("UPDATE batches SET holder = NULL, held_ms = NULL WHERE holder IS NOT NULL", [])?)
    }

    /// Admits a call for a batch, in one transaction: records a new batch, or checks a known one
    /// (same body, no other call holding it, same attribution), tightens its ceiling, and takes
    /// its hold. A refusal writes nothing.
    pub fn admit(&self, arrival: &Arrival<'_>) -> Result<Result<Admitted, Refused>, StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row = tx
            .query_row(
                "SELECT identity, agent_id, run_id, flow_id, ceiling_nanos, holder, held_ms FROM batches WHERE batch_id = ?1",
                params![arrival.batch_id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        Attribution { agent_id: r.get(1)?, run_id: r.get(2)?, flow_id: r.get(3)? },
                        r.get::<_, Option<i64>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                        r.get::<_, Option<i64>>(6)?,
                    ))
                },
            )
            .optional()?;
        let Some((identity, attribution, recorded, holder, held_ms)) = row else {
            let identity = serde_json::to_string(arrival.identity).map_err(|e| StoreError::Identity(e.to_string()))?;
            let a = arrival.attribution;
            tx.execute(
                "INSERT INTO batches (batch_id, identity, agent_id, run_id, flow_id, ceiling_nanos, admitted_ms, holder, held_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?7)",
                params![
                    arrival.batch_id,
                    identity,
                    a.agent_id,
                    a.run_id,
                    a.flow_id,
                    arrival.ceiling_nanos.map(to_sql),
                    to_sql(arrival.now_ms),
                    arrival.holder
                ],
            )?;
            tx.commit()?;
            let ceiling_nanos = arrival.ceiling_nanos;
            return Ok(Ok(Admitted { first: true, ceiling_nanos, outcomes: BTreeMap::new() }));
        };
        // Scope first: a caller of another scope learns only that the id is taken, never which
        // member of that scope's batch differs nor whether it runs (#44).
        if attribution != *arrival.attribution {
            return Ok(Err(Refused::ScopeMismatch));
        }
        let recorded_identity: BatchIdentity =
            serde_json::from_str(&identity).map_err(|e| StoreError::Identity(e.to_string()))?;
        if let Some(field) = recorded_identity.first_difference(arrival.identity) {
            return Ok(Err(Refused::Reuse { field }));
        }
        if holder.is_some() {
            return Ok(Err(Refused::InProgress { held_ms: held_ms.map_or(0, from_sql) }));
        }
        // model-batch `admission::effective_ceiling`, in nanodollars: the lower of the two, or
        // whichever is named; recorded before anything is sent.
        let ceiling_nanos = match (recorded.map(from_sql), arrival.ceiling_nanos) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (one, None) | (None, one) => one,
        };
        tx.execute(
            "UPDATE batches SET ceiling_nanos = ?2, holder = ?3, held_ms = ?4 WHERE batch_id = ?1",
            params![arrival.batch_id, ceiling_nanos.map(to_sql), arrival.holder, to_sql(arrival.now_ms)],
        )?;
        let outcomes = outcomes(&tx, arrival.batch_id)?;
        tx.commit()?;
        Ok(Ok(Admitted { first: false, ceiling_nanos, outcomes }))
    }

    /// Records one item's outcome, with its measurement intent when it has one, in one synced
    /// transaction. An answered item is never replaced; a stored permanent error neither.
    /// Returns whether the outcome was written.
    pub fn record(
        &self,
        batch_id: &str,
        item: u64,
        outcome: &Outcome,
        intent: Option<&str>,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let stored = item_outcome(&tx, batch_id, item)?;
        if stored.as_ref().is_some_and(|o| !o.retried_on_resend()) {
            return Ok(false);
        }
        let (answers, usage, cost, spend, error) = match outcome {
            Outcome::Answered { answers, usage, cost_nanos, spend_nanos } => {
                (Some(answers.as_str()), usage.clone(), *cost_nanos, Some(*spend_nanos), None)
            }
            Outcome::Failed { code, message, transient } => {
                (None, ItemUsage::default(), None, None, Some((code.as_str(), message.as_str(), *transient)))
            }
        };
        tx.execute(
            "INSERT OR REPLACE INTO items (batch_id, item, answers, input_tokens, output_tokens, cost_nanos, spend_nanos,
                                           error_code, error_message, error_transient, recorded_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?11, ?7, ?8, ?9, ?10)",
            params![
                batch_id,
                to_sql(item),
                answers,
                usage.input_tokens.map(to_sql),
                usage.output_tokens.map(to_sql),
                cost.map(to_sql),
                error.map(|e| e.0),
                error.map(|e| e.1),
                error.map(|e| e.2),
                to_sql(now_ms),
                spend.map(to_sql)
            ],
        )?;
        if let Some(fact) = intent {
            tx.execute(
                "INSERT OR IGNORE INTO intents (batch_id, item, fact, admitted_ms) VALUES (?1, ?2, ?3, ?4)",
                params![batch_id, to_sql(item), fact, to_sql(now_ms)],
            )?;
        }
        tx.commit()?;
        Ok(true)
    }

    /// The batch's recorded spend: the sum of its answered items' costs, in nanodollars.
    pub fn spent_nanos(&self, batch_id: &str) -> Result<u64, StoreError> {
        let conn = self.conn.lock();
        let sum: Option<i64> = conn.query_row(
            "SELECT SUM(spend_nanos) FROM items WHERE batch_id = ?1 AND answers IS NOT NULL",
            params![batch_id],
            |r| r.get(0),
        )?;
        Ok(sum.map_or(0, from_sql))
    }

    /// Undoes a first admission whose call was refused at its first provider call (RULES §14:
    /// the refusal records no batch): deletes the batch if `holder` holds it and it has no
    /// outcome. Returns whether it was deleted.
    pub fn forget(&self, batch_id: &str, holder: &str) -> Result<bool, StoreError> {
        let conn = self.conn.lock();
        let deleted = conn.execute(
            "DELETE FROM batches WHERE batch_id = ?1 AND holder = ?2
               AND NOT EXISTS (SELECT 1 FROM items WHERE items.batch_id = ?1)",
            params![batch_id, holder],
        )?;
        Ok(deleted == 1)
    }

    /// Ends a call's hold on its batch (only the holder's own).
    pub fn release(&self, batch_id: &str, holder: &str) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        conn.execute(
            "UPDATE batches SET holder = NULL, held_ms = NULL WHERE batch_id = ?1 AND holder = ?2",
            params![batch_id, holder],
        )?;
        Ok(())
    }

    /// Intents not yet published, oldest first (at most `limit`).
    pub fn pending_intents(&self, limit: usize) -> Result<Vec<Intent>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt =
            conn.prepare("SELECT id, batch_id, item, fact FROM intents WHERE published = 0 ORDER BY id LIMIT ?1")?;
        let rows = stmt.query_map(params![to_sql(limit as u64)], |r| {
            Ok(Intent { id: r.get(0)?, batch_id: r.get(1)?, item: from_sql(r.get(2)?), fact: r.get(3)? })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Marks intents published (after their facts are durable in `run-index.db`).
    pub fn mark_published(&self, ids: &[i64]) -> Result<(), StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        for id in ids {
            tx.execute("UPDATE intents SET published = 1 WHERE id = ?1", params![id])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Deletes the batches first admitted more than [`RETENTION_MS`] before `now_ms`, their
    /// items and their published intents (a pending intent waits for its publication). Returns
    /// the batches deleted.
    pub fn delete_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        let cutoff = to_sql(now_ms.saturating_sub(RETENTION_MS));
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        tx.execute(
            "DELETE FROM items WHERE batch_id IN (SELECT batch_id FROM batches WHERE admitted_ms < ?1)",
            params![cutoff],
        )?;
        tx.execute("DELETE FROM intents WHERE published = 1 AND admitted_ms < ?1", params![cutoff])?;
        let deleted = tx.execute("DELETE FROM batches WHERE admitted_ms < ?1 AND holder IS NULL", params![cutoff])?;
        tx.commit()?;
        Ok(deleted)
    }
}

fn outcomes(conn: &Connection, batch_id: &str) -> Result<BTreeMap<u64, Outcome>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT item, answers, input_tokens, output_tokens, cost_nanos, spend_nanos, error_code, error_message, error_transient
         FROM items WHERE batch_id = ?1",
    )?;
    let rows = stmt.query_map(params![batch_id], |r| Ok((from_sql(r.get(0)?), outcome_row(r, 1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn item_outcome(conn: &Connection, batch_id: &str, item: u64) -> Result<Option<Outcome>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT answers, input_tokens, output_tokens, cost_nanos, spend_nanos, error_code, error_message, error_transient
             FROM items WHERE batch_id = ?1 AND item = ?2",
            params![batch_id, to_sql(item)],
            |r| outcome_row(r, 0),
        )
        .optional()?)
}

/// An outcome from the eight item columns starting at `at`.
fn outcome_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Outcome> {
    let answers: Option<String> = r.get(at)?;
    Ok(match answers {
        Some(answers) => Outcome::Answered {
            answers,
            usage: ItemUsage {
                input_tokens: r.get::<_, Option<i64>>(at + 1)?.map(from_sql),
                output_tokens: r.get::<_, Option<i64>>(at + 2)?.map(from_sql),
            },
            cost_nanos: r.get::<_, Option<i64>>(at + 3)?.map(from_sql),
            spend_nanos: r.get::<_, Option<i64>>(at + 4)?.map_or(0, from_sql),
        },
        None => Outcome::Failed {
            code: r.get::<_, Option<String>>(at + 5)?.unwrap_or_default(),
            message: r.get::<_, Option<String>>(at + 6)?.unwrap_or_default(),
            transient: r.get::<_, Option<bool>>(at + 7)?.unwrap_or(false),
        },
    })
}

/// SQLite integers are signed: values past `i64::MAX` (none this store writes) saturate.
fn to_sql(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn from_sql(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(items: &[&str]) -> BatchIdentity {
        serde_json::from_value(serde_json::json!({"model": "typesafe/jev-1.13.0", "questions": "q", "items": items}))
            .unwrap()
    }

    fn run_scope() -> Attribution {
        Attribution { agent_id: Some("agent".into()), run_id: Some("run-1".into()), flow_id: None }
    }

    fn arrival<'a>(id: &'a BatchIdentity, who: &'a Attribution, ceiling: Option<u64>, holder: &'a str) -> Arrival<'a> {
        Arrival { batch_id: "b1", identity: id, attribution: who, ceiling_nanos: ceiling, holder, now_ms: 1_000 }
    }

    fn answered(text: &str, cost: u64) -> Outcome {
        Outcome::Answered {
            answers: text.into(),
            usage: ItemUsage { input_tokens: Some(7), output_tokens: None },
            cost_nanos: Some(cost),
            spend_nanos: cost,
        }
    }

    #[test]
    fn a_batch_is_held_once_replayed_after_release_and_its_answers_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = SystemOne::open(dir.path()).unwrap();
        let (id, who) = (identity(&["i0", "i1"]), run_scope());
        let first = store.admit(&arrival(&id, &who, Some(500), "p1")).unwrap().unwrap();
        assert!(first.first && first.outcomes.is_empty());
        assert_eq!(store.admit(&arrival(&id, &who, None, "p1")).unwrap(), Err(Refused::InProgress { held_ms: 1_000 }));
        assert!(store
            .record("b1", 0, &answered(r#"{"q":{"noul":0.5000}}"#, 100), Some(r#"{"kind":"system_one"}"#), 2)
            .unwrap());
        let failed = Outcome::Failed { code: "rate_limited".into(), message: "slow down".into(), transient: true };
        assert!(store.record("b1", 1, &failed, None, 2).unwrap());
        store.release("b1", "p1").unwrap();
        drop(store);
        let store = SystemOne::open(dir.path()).unwrap();
        let again = store.admit(&arrival(&id, &who, None, "p2")).unwrap().unwrap();
        assert!(!again.first);
        assert_eq!(again.ceiling_nanos, Some(500), "a re-send without a ceiling keeps the recorded one");
        assert_eq!(again.outcomes[&0], answered(r#"{"q":{"noul":0.5000}}"#, 100), "the answers' text, byte for byte");
        assert!(again.outcomes[&1].retried_on_resend());
        // An answer is never replaced; the transient error is.
        assert!(!store.record("b1", 0, &answered("{}", 1), None, 3).unwrap());
        assert!(store.record("b1", 1, &answered(r#"{"q":{"noul":1}}"#, 40), None, 3).unwrap());
        assert_eq!(store.spent_nanos("b1").unwrap(), 140);
    }

    #[test]
    fn a_different_body_another_scope_and_a_looser_ceiling_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = SystemOne::open(dir.path()).unwrap();
        let (id, who) = (identity(&["i0", "i1"]), run_scope());
        store.admit(&arrival(&id, &who, Some(500), "p1")).unwrap().unwrap();
        store.release("b1", "p1").unwrap();
        let other = identity(&["i0", "changed"]);
        assert_eq!(
            store.admit(&arrival(&other, &who, None, "p1")).unwrap(),
            Err(Refused::Reuse { field: "items[1]".into() })
        );
        let flow = Attribution { flow_id: Some("flow-1".into()), ..Attribution::default() };
        assert_eq!(store.admit(&arrival(&id, &flow, None, "p1")).unwrap(), Err(Refused::ScopeMismatch));
        // Another scope with another body learns only that the id is taken (#44).
        assert_eq!(store.admit(&arrival(&other, &flow, None, "p1")).unwrap(), Err(Refused::ScopeMismatch));
        let looser = store.admit(&arrival(&id, &who, Some(900), "p1")).unwrap().unwrap();
        assert_eq!(looser.ceiling_nanos, Some(500), "a ceiling only tightens");
        store.release("b1", "p1").unwrap();
        let tighter = store.admit(&arrival(&id, &who, Some(200), "p1")).unwrap().unwrap();
        assert_eq!(tighter.ceiling_nanos, Some(200));
        store.release("b1", "p1").unwrap();
        let after = store.admit(&arrival(&id, &who, None, "p1")).unwrap().unwrap();
        assert_eq!(after.ceiling_nanos, Some(200), "the tightened ceiling was recorded");
    }

    #[test]
    fn a_dead_process_s_holds_are_released_and_old_batches_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = SystemOne::open(dir.path()).unwrap();
        let (id, who) = (identity(&["i0"]), run_scope());
        store.admit(&arrival(&id, &who, None, "dead")).unwrap().unwrap();
        store.record("b1", 0, &answered("{}", 1), Some("{}"), 1_000).unwrap();
        assert_eq!(store.release_all().unwrap(), 1);
        assert!(store.admit(&arrival(&id, &who, None, "p2")).unwrap().is_ok(), "the dead holder's hold is gone");
        store.release("b1", "p2").unwrap();
        assert_eq!(store.delete_expired(1_000 + RETENTION_MS).unwrap(), 0, "seven days to the millisecond: kept");
        let pending = store.pending_intents(10).unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(store.delete_expired(1_001 + RETENTION_MS).unwrap(), 1);
        assert_eq!(store.pending_intents(10).unwrap(), pending, "an unpublished intent waits for publication");
        store.mark_published(&[pending[0].id]).unwrap();
        store.delete_expired(1_001 + RETENTION_MS).unwrap();
        assert!(store.pending_intents(10).unwrap().is_empty());
        let fresh = store.admit(&arrival(&id, &who, None, "p2")).unwrap().unwrap();
        assert!(fresh.first, "after deletion the batch id is new again");
    }
}
