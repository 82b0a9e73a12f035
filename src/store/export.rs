//! The metering lane's facts (spec §17b): usage only, insert-once, never rewritten. A run's
//! terminal gives one fact per `(run, provider, model, variant)`; a `session.warm` gives one
//! fact of its own, marked `warm = 1`, whose id is taken over its record's WAL sequence so the
//! run's ordinary facts keep their ids (§4a "Records").
//!
//! `pricing_at_ms` is when a fact's usage was billed, the time a consumer's price table is read
//! at; `pricing_at_precision` says what it is: `step` (the run's first answered step of that
//! model), `request` (a warm's send start), `answer` (a classifier item's answer), or
//! `degraded` (no time: a run without a step of that model, or records that predate answer
//! times).

use rusqlite::{params, Connection};

use super::StoreError;
use crate::record::CacheWarmed;
use crate::session_key::SessionKey;

/// Adds the `warm` mark to a table an older layout created (the lane is kept across layouts).
pub(super) fn add_warm_column(tx: &Connection) -> Result<(), StoreError> {
    let has = tx.prepare("SELECT 1 FROM pragma_table_info('export_facts') WHERE name = 'warm'")?.exists([])?;
    if !has {
        tx.execute_batch("ALTER TABLE export_facts ADD COLUMN warm INTEGER NOT NULL DEFAULT 0")?;
    }
    Ok(())
}

/// A warm's fact, billed under the run whose request it re-sent: no steps, its own usage
/// (absent measurements stay absent), `terminal_reason` `warm`, occurred at its send start.
pub(super) fn insert_warm_fact(
    tx: &Connection,
    key: &SessionKey,
    lineage: &str,
    seq: u64,
    warm: &CacheWarmed,
    recorded_at_ms: u64,
) -> Result<(), StoreError> {
    let opt = |v: Option<u64>| v.map(|v| v as i64);
    let u = &warm.usage;
    tx.prepare_cached(
        "INSERT OR IGNORE INTO export_facts (fact_id, kind, lineage, session, harness, project_root, run_id, provider, model, variant,
            steps, unreported_steps, input_tokens, cached_input_tokens, cache_write_tokens, output_tokens, reasoning_tokens,
            terminal_reason, occurred_at_ms, occurred_at_precision, recorded_at_ms, warm, pricing_at_ms, pricing_at_precision)
         VALUES (?1, 'session', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12, ?13, ?14, ?15, 'warm', ?16, 'terminal', ?17, 1,
            ?16, CASE WHEN ?16 IS NULL THEN 'degraded' ELSE 'request' END)",
    )?
    .execute(params![
        format!("{lineage}:warm:{seq}"),
        lineage,
        key.session,
        key.harness,
        key.project_root,
        warm.run_id,
        warm.provider,
        warm.model,
        warm.variant,
        u.is_unreported() as i64,
        opt(u.input_tokens),
        opt(u.cached_input_tokens),
        opt(u.cache_write_tokens),
        opt(u.output_tokens),
        opt(u.reasoning_tokens),
        (warm.sent_at_ms > 0).then_some(warm.sent_at_ms as i64),
        recorded_at_ms as i64
    ])?;
    Ok(())
}

/// One usage-only fact per `(run, provider, model, variant)`; a run with no step gets one fact
/// with no model. Insert-once: a replay of the same terminal adds nothing.
pub(super) fn insert_facts(
    tx: &Connection,
    key: &SessionKey,
    lineage: &str,
    run_id: &str,
    reason: &str,
    (usage, priced_at): (&crate::message::RunUsage, &[crate::replay::PricedAt]),
    (at_ms, recorded_at_ms): (u64, u64),
) -> Result<(), StoreError> {
    let mut stmt = tx.prepare_cached(
        "INSERT OR IGNORE INTO export_facts (fact_id, kind, lineage, session, harness, project_root, run_id, provider, model, variant,
            steps, unreported_steps, input_tokens, cached_input_tokens, cache_write_tokens, output_tokens, reasoning_tokens,
            terminal_reason, occurred_at_ms, occurred_at_precision, recorded_at_ms, pricing_at_ms, pricing_at_precision)
         VALUES (?1, 'session', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, 'terminal', ?19, ?20,
            CASE WHEN ?20 IS NULL THEN 'degraded' ELSE 'step' END)",
    )?;
    // A model's usage is priced when it first answered in the run; a fact without a step (or
    // from records that predate answer times) has no pricing time and reads `degraded`.
    let priced = |provider: &str, model: &str, variant: Option<&str>| {
        let found =
            priced_at.iter().find(|p| p.provider == provider && p.model == model && p.variant.as_deref() == variant);
        found.map(|p| p.at_ms as i64)
    };
    let occurred = (at_ms > 0).then_some(at_ms as i64);
    let opt = |v: Option<u64>| v.map(|v| v as i64);
    let mut put = |provider: Option<&str>,
                   model: Option<&str>,
                   variant: Option<&str>,
                   steps: u64,
                   unreported: u64,
                   t: &crate::message::StepUsage| {
        let fact_id =
            format!("{lineage}:{run_id}:{}:{}:{}", provider.unwrap_or(""), model.unwrap_or(""), variant.unwrap_or(""));
        stmt.execute(params![
            fact_id,
            lineage,
            key.session,
            key.harness,
            key.project_root,
            run_id,
            provider,
            model,
            variant,
            steps as i64,
            unreported as i64,
            opt(t.input_tokens),
            opt(t.cached_input_tokens),
            opt(t.cache_write_tokens),
            opt(t.output_tokens),
            opt(t.reasoning_tokens),
            reason,
            occurred,
            recorded_at_ms as i64,
            provider.zip(model).and_then(|(p, m)| priced(p, m, variant))
        ])
    };
    if usage.by_model.is_empty() {
        put(None, None, None, usage.steps, usage.unreported_steps, &usage.totals)?;
    }
    for m in &usage.by_model {
        put(Some(&m.provider), Some(&m.model), m.variant.as_deref(), m.steps, m.unreported_steps, &m.totals)?;
    }
    Ok(())
}

/// A `system_one` fact (spec §4b "Metering"): one answered classifier item, sessionless. Its
/// text is the measurement intent `system-one.db` commits with the item's outcome; publishing
/// inserts it once (`fact_id` is unique), so a republish at start adds nothing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SystemOneFact {
    /// `system_one:<item>:<batch_id>` (the batch id last: it may hold `:`).
    pub fact_id: String,
    pub batch_id: String,
    pub item: u64,
    pub provider: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_id: Option<String>,
    /// Reported tokens only; absent is not zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    pub occurred_at_ms: u64,
}

impl SystemOneFact {
    pub fn id_for(batch_id: &str, item: u64) -> String {
        format!("system_one:{item}:{batch_id}")
    }
}

/// Adds the columns sessionless facts and pricing times need to a table an older layout
/// created (a read when they exist: opening writes nothing then). Facts written before carry
/// no pricing time and read `degraded`.
pub(super) fn add_system_one_columns(conn: &Connection) -> Result<(), StoreError> {
    for (column, ty) in [
        ("batch_id", "TEXT"),
        ("item_index", "INTEGER"),
        ("agent_id", "TEXT"),
        ("flow_id", "TEXT"),
        ("pricing_at_ms", "INTEGER"),
        ("pricing_at_precision", "TEXT NOT NULL DEFAULT 'degraded'"),
    ] {
        let has = conn.prepare("SELECT 1 FROM pragma_table_info('export_facts') WHERE name = ?1")?.exists([column])?;
        if !has {
            conn.execute_batch(&format!("ALTER TABLE export_facts ADD COLUMN {column} {ty}"))?;
        }
    }
    Ok(())
}

/// Inserts `system_one` facts once each; returns how many were new.
pub(super) fn insert_system_one_facts(
    tx: &Connection,
    facts: &[SystemOneFact],
    recorded_at_ms: u64,
) -> Result<usize, StoreError> {
    let mut stmt = tx.prepare_cached(
        "INSERT OR IGNORE INTO export_facts (fact_id, kind, lineage, session, harness, project_root, run_id, provider, model,
            steps, unreported_steps, input_tokens, output_tokens, terminal_reason, occurred_at_ms, occurred_at_precision,
            recorded_at_ms, batch_id, item_index, agent_id, flow_id, pricing_at_ms, pricing_at_precision)
         VALUES (?1, 'system_one', '', '', '', '', ?2, ?3, ?4, 1, ?5, ?6, ?7, 'answered', ?8, 'terminal', ?9, ?10, ?11, ?12, ?13,
            ?8, 'answer')",
    )?;
    let mut added = 0;
    for f in facts {
        let unreported = f.input_tokens.is_none() && f.output_tokens.is_none();
        added += stmt.execute(params![
            f.fact_id,
            f.run_id.as_deref().unwrap_or(""),
            f.provider,
            f.model,
            unreported as i64,
            f.input_tokens.map(|v| v as i64),
            f.output_tokens.map(|v| v as i64),
            f.occurred_at_ms as i64,
            recorded_at_ms as i64,
            f.batch_id,
            f.item as i64,
            f.agent_id,
            f.flow_id
        ])?;
    }
    Ok(added)
}
