//! The classifier service: what a `classify.run` call needs (the store, the live catalog, the
//! vault, the provider bases, `run-index.db` for facts), its concurrency caps, and the
//! `system_one` health metrics (spec §4b "Health", C-23–C-26).
//!
//! Invariants: at most [`CALLS_PER_PROCESS`] calls run at once (the serve layer's task pool)
//! and at most [`CALLS_PER_MODEL`] per model ([`Classifier::model_slot`]); a call past either
//! is refused `too_many_requests` (transient) before anything is written. The item and spend
//! counters count only outcomes newly recorded by this process: a replayed answer or a
//! republished fact adds nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cortexkit_role_classifier::errors::{ErrorClass, Refusal, RefusalDetail};
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::store::{StoreError, SystemOne};
use crate::catalog::SharedCatalog;
use crate::clock::SharedClock;
use crate::store::export::SystemOneFact;
use crate::store::Store;
use crate::vault::CredentialSource;

/// Classifier calls running at once in this process (each on a task of its own).
pub const CALLS_PER_PROCESS: usize = 32;
/// Classifier calls running at once for one model: its provider's concurrency cap.
pub const CALLS_PER_MODEL: usize = 8;
/// How long a caller refused for a full cap is told to wait.
pub const FULL_RETRY_AFTER_MS: u64 = 250;
/// How often a running process deletes batches past retention (also done at every start).
pub const SWEEP_EVERY_MS: u64 = 60 * 60 * 1000;
/// Intents published per `run-index.db` transaction.
const PUBLISH_CHUNK: usize = 256;

/// What a call needs, shared by every call of the process.
pub struct Classifier {
    pub(super) store: SystemOne,
    pub(super) catalog: SharedCatalog,
    pub bases: BTreeMap<String, String>,
    pub(super) vault: Option<Arc<dyn CredentialSource>>,
    facts: Arc<Store>,
    pub(super) agent: ureq::Agent,
    /// This process's incarnation: the owner of every hold it takes.
    pub(super) holder: String,
    pub(super) clock: SharedClock,
    per_model: Mutex<HashMap<&'static str, usize>>,
    /// When batches past retention were last deleted (Unix ms).
    swept_ms: AtomicU64,
    pub metrics: Metrics,
}

/// A failure of the service itself (not a refusal of the call).
#[derive(Debug)]
pub enum ServiceError {
    Store(StoreError),
    Facts(crate::store::StoreError),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Store(e) => write!(f, "{e}"),
            ServiceError::Facts(e) => write!(f, "run-index.db: {e}"),
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        ServiceError::Store(e)
    }
}

/// Everything [`Classifier::open`] is given.
pub struct Deps {
    pub root: std::path::PathBuf,
    pub catalog: SharedCatalog,
    pub bases: BTreeMap<String, String>,
    pub vault: Option<Arc<dyn CredentialSource>>,
    pub facts: Arc<Store>,
    pub clock: SharedClock,
}

impl Classifier {
    /// Opens `system-one.db` and does what a start owes it: releases every hold (their
    /// holders are dead), deletes batches past retention, republishes pending intents.
    pub fn open(deps: Deps) -> Result<Classifier, ServiceError> {
        let store = SystemOne::open(&deps.root)?;
        let released = store.release_all()?;
        let deleted = store.delete_expired(deps.clock.now_ms())?;
        if released + deleted > 0 {
            log::info!(target: "broca.classify", "system-one.db: {released} held batches released, {deleted} expired batches deleted");
        }
        let started_ms = deps.clock.now_ms();
        // ureq 2's agent, spelled out where ureq 3's defaults differ: a status is an answer
        // (`provider::call` maps it), no proxy from the environment, 5 redirects, a pool of
        // 100 idle connections kept for as long as the provider keeps them.
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(5)
            .timeout_connect(Some(std::time::Duration::from_secs(10)))
            .max_idle_connections(100)
            .max_idle_connections_per_host(CALLS_PER_MODEL)
            .max_idle_age(std::time::Duration::from_secs(3600))
            .build()
            .new_agent();
        let classifier = Classifier {
            store,
            catalog: deps.catalog,
            bases: deps.bases,
            vault: deps.vault,
            facts: deps.facts,
            agent,
            holder: format!("{}-{}", std::process::id(), uuid::Uuid::new_v4()),
            clock: deps.clock,
            per_model: Mutex::new(HashMap::new()),
            swept_ms: AtomicU64::new(started_ms),
            metrics: Metrics::default(),
        };
        let republished = classifier.publish_pending()?;
        if republished > 0 {
            log::info!(target: "broca.classify", "{republished} pending system_one facts published at start");
        }
        Ok(classifier)
    }

    /// Publishes every pending intent to `run-index.db` (insert-once), then marks them
    /// published. Returns how many facts were new there.
    pub fn publish_pending(&self) -> Result<usize, ServiceError> {
        let mut added = 0;
        loop {
            let pending = self.store.pending_intents(PUBLISH_CHUNK)?;
            if pending.is_empty() {
                return Ok(added);
            }
            let facts: Vec<SystemOneFact> = pending
                .iter()
                .filter_map(|intent| match serde_json::from_str(&intent.fact) {
                    Ok(fact) => Some(fact),
                    Err(e) => {
                        log::error!(target: "broca.classify", "intent {} does not decode ({e}); it is skipped", intent.id);
                        None
                    }
                })
                .collect();
            added += self.facts.publish_system_one(&facts).map_err(ServiceError::Facts)?;
            let ids: Vec<i64> = pending.iter().map(|i| i.id).collect();
            self.store.mark_published(&ids)?;
            if pending.len() < PUBLISH_CHUNK {
                return Ok(added);
            }
        }
    }

    /// Deletes batches past retention when [`SWEEP_EVERY_MS`] passed since the last time (a
    /// process runs for months; seven days count from first admission, spec §4b).
    pub fn sweep_if_due(&self) {
        let now = self.clock.now_ms();
        let last = self.swept_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < SWEEP_EVERY_MS
            || self.swept_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        match self.store.delete_expired(now) {
            Ok(0) => {}
            Ok(n) => log::info!(target: "broca.classify", "system-one.db: {n} expired batches deleted"),
            Err(e) => log::error!(target: "broca.classify", "deleting expired batches: {e}"),
        }
    }

    /// Takes one of `model`'s call slots, or refuses `too_many_requests`.
    pub(super) fn model_slot(&self, model: &'static str) -> Result<ModelSlot<'_>, Refusal> {
        let mut counts = self.per_model.lock();
        let count = counts.entry(model).or_default();
        if *count >= CALLS_PER_MODEL {
            return Err(full(&format!("{model} already runs {CALLS_PER_MODEL} classifier calls"), CALLS_PER_MODEL));
        }
        *count += 1;
        Ok(ModelSlot { classifier: self, model })
    }
}

/// One model call slot, given back when dropped.
pub struct ModelSlot<'a> {
    classifier: &'a Classifier,
    model: &'static str,
}

impl Drop for ModelSlot<'_> {
    fn drop(&mut self) {
        if let Some(count) = self.classifier.per_model.lock().get_mut(self.model) {
            *count = count.saturating_sub(1);
        }
    }
}

/// `too_many_requests` for a full cap: transient, with the cap and a short wait.
pub fn full(message: &str, limit: usize) -> Refusal {
    let mut detail = RefusalDetail::new(ErrorClass::Transient);
    detail.limit = Some(limit as u64);
    detail.retry_after_ms = Some(FULL_RETRY_AFTER_MS);
    Refusal::new(crate::wire::RefusalCode::TooManyRequests.as_str(), message).with_detail(detail)
}

/// The `system_one` health metrics (spec §4b "Health"): no item content.
#[derive(Default)]
pub struct Metrics {
    /// Calls holding a batch now: the busy gauge `system_one_batches_in_flight`.
    pub in_flight: AtomicU64,
    pub calls_answered: AtomicU64,
    pub calls_refused: AtomicU64,
    /// Item outcomes newly recorded by this process.
    pub items_answered: AtomicU64,
    pub items_failed: AtomicU64,
    /// Catalog model id → nanodollars of batch-accounted spend newly exported.
    spend_nanos: Mutex<BTreeMap<String, u64>>,
    /// Provider id → the last error code it answered with (and its HTTP status).
    last_error: Mutex<BTreeMap<String, (String, Option<u16>)>>,
}

impl Metrics {
    pub fn spent(&self, model: &str, nanos: u64) {
        *self.spend_nanos.lock().entry(model.to_owned()).or_default() += nanos;
    }

    pub fn provider_error(&self, provider: &str, code: &str, status: Option<u16>) {
        self.last_error.lock().insert(provider.to_owned(), (code.to_owned(), status));
    }

    /// The `system_one` object of `health.check`.
    pub fn snapshot(&self) -> Value {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let last: BTreeMap<String, Value> = self
            .last_error
            .lock()
            .iter()
            .map(|(p, (code, status))| (p.clone(), json!({"code": code, "status": status})))
            .collect();
        json!({
            "batches_in_flight": load(&self.in_flight),
            "calls": {"answered": load(&self.calls_answered), "refused": load(&self.calls_refused)},
            "items": {"answered": load(&self.items_answered), "failed": load(&self.items_failed)},
            "spend_nanos": *self.spend_nanos.lock(),
            "last_provider_error": last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::store::{Arrival, Attribution, ItemUsage, Outcome};
    use crate::clock::ManualClock;
    use cortexkit_role_classifier::identity::BatchIdentity;

    fn classifier(dir: &std::path::Path, clock: Arc<ManualClock>) -> Classifier {
        let missing = crate::catalog::CatalogError::Missing { path: dir.join("lkg.json") };
        Classifier::open(Deps {
            root: dir.to_path_buf(),
            catalog: Arc::new(parking_lot::RwLock::new(Err(missing))),
            bases: BTreeMap::new(),
            vault: None,
            facts: Arc::new(Store::open(&dir.join("run-index.db")).unwrap()),
            clock,
        })
        .unwrap()
    }

    /// A start releases a dead process's hold and publishes its pending intents once; a long-lived
    /// process deletes batches past retention without a restart.
    #[test]
    fn a_start_releases_and_republishes_and_a_running_process_sweeps() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::at(1_000));
        let c = classifier(dir.path(), Arc::clone(&clock));
        let identity: BatchIdentity =
            serde_json::from_value(json!({"model": "m", "questions": "q", "items": ["i0"]})).unwrap();
        let who = Attribution { flow_id: Some("f".into()), ..Attribution::default() };
        let arrival = Arrival {
            batch_id: "b",
            identity: &identity,
            attribution: &who,
            ceiling_nanos: None,
            holder: "dead",
            now_ms: 1_000,
        };
        c.store.admit(&arrival).unwrap().unwrap();
        let fact = SystemOneFact {
            fact_id: SystemOneFact::id_for("b", 0),
            batch_id: "b".into(),
            item: 0,
            provider: "p".into(),
            model: "m".into(),
            agent_id: None,
            run_id: None,
            flow_id: Some("f".into()),
            input_tokens: Some(3),
            output_tokens: None,
            occurred_at_ms: 1_000,
        };
        let answered =
            Outcome::Answered { answers: "{}".into(), usage: ItemUsage::default(), cost_nanos: None, spend_nanos: 0 };
        c.store.record("b", 0, &answered, Some(&serde_json::to_string(&fact).unwrap()), 1_000).unwrap();
        drop(c);
        let c = classifier(dir.path(), Arc::clone(&clock));
        assert!(c.store.pending_intents(10).unwrap().is_empty(), "published at start");
        assert_eq!(c.publish_pending().unwrap(), 0);
        let arrival = Arrival { holder: "live", ..arrival };
        assert!(c.store.admit(&arrival).unwrap().is_ok(), "the dead holder's hold was released");
        c.store.release("b", "live").unwrap();
        clock.advance(std::time::Duration::from_millis(super::super::store::RETENTION_MS + SWEEP_EVERY_MS));
        c.sweep_if_due();
        assert!(c.store.admit(&arrival).unwrap().unwrap().first, "swept: the batch id is new again");
    }
}
