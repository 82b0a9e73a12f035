//! The late-results pullers (spec §19; tool-provider §8.2): one thread per provider module
//! that pulls `late_results` under broca's own principal on one route per module, every
//! [`super::POLL_EVERY`] while the module still has registered calls ([`super::POLL_AFTER_ERROR`]
//! after an error), and hands each entry to the session's actor through [`Deliver`].
//!
//! Invariants:
//! - an entry is acked (through exactly the cursor the provider returned) only after every
//!   entry up to it was delivered durably or recognized as a no-op; one the actor cannot take
//!   yet pins the ack and the page is read again;
//! - entries are deduplicated on `(provider, custodian, call_key, event_id)` (receipts), and a
//!   `cursor_incarnation_changed` refusal re-reads from the start;
//! - at most one puller runs per module, and at most [`MAX_PULLERS`] at once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cortexkit_role_tool_provider::late_results::{
    AckRequest, Cursor, EntryKind, LateEntry, LateResultsReply, LateResultsRequest, CURSOR_INCARNATION_CHANGED,
};
use cortexkit_role_tool_provider::ops;
use parking_lot::Mutex;

use super::intake::{Intake, Registration};
use super::{LateAck, LateOutcome};
use crate::subc::consumer::CallError;

/// Provider modules pulled at once; past it a module waits for a free puller (logged).
pub const MAX_PULLERS: usize = 64;
/// The route session every puller's route names (one route per module).
pub const FEED_SESSION: &str = "late-results";
/// How long one `late_results` or ack request may take.
const REQUEST_WITHIN: Duration = Duration::from_secs(10);

/// Hands a late result to its session's actor and says what became of it.
pub type Deliver = Arc<dyn Fn(&Registration, LateOutcome) -> LateAck + Send + Sync>;
/// Whether a registered call still waits for its result in its session's WAL (`None`: cannot
/// tell now). A call sealed at a crash, or cancelled while held, gets its result without a late
/// entry: its registration goes when this says so.
pub type StillWaiting = Arc<dyn Fn(&Registration) -> Option<bool> + Send + Sync>;

/// Registrations checked against their WALs per quiet pass.
const SWEEP_PER_PASS: usize = 64;

/// Where a module's feed is read: one role op (`{name, arguments}`) on the module's feed route
/// ([`FEED_SESSION`]), declaring no consumer capability (the tool plane serves it).
pub trait FeedRoute: Send + Sync {
    fn role_op(
        &self,
        module: &str,
        name: &str,
        arguments: serde_json::Value,
        deadline: Instant,
    ) -> Result<Vec<u8>, CallError>;

    /// The principal late entries name as their custodian (`reserved:<broca's module id>`):
    /// broca itself, the carrier of every call it raises (tool-provider §7). `None`: unknown
    /// (no consumer identity), and the entry's custodian is not checked.
    fn custodian(&self) -> Option<String> {
        None
    }
}

/// The pullers of one process.
pub struct Pullers {
    intake: Arc<Intake>,
    feed: Arc<dyn FeedRoute>,
    deliver: Deliver,
    still_waiting: StillWaiting,
    running: Mutex<HashSet<String>>,
    poll: Duration,
    /// This runtime, for starting pullers from a registration.
    me: std::sync::Weak<Pullers>,
    /// Boot finished (a rebuild included): pullers may start.
    ready: std::sync::atomic::AtomicBool,
}

/// How one pass over a module's feed ended.
enum Pass {
    /// The page was taken and acked (or was empty); more may be waiting.
    Done { more: bool },
    /// An entry could not be delivered yet: read the page again later.
    Pinned,
}

impl Pullers {
    pub fn new(
        intake: Arc<Intake>,
        feed: Arc<dyn FeedRoute>,
        deliver: Deliver,
        still_waiting: StillWaiting,
    ) -> Arc<Pullers> {
        Arc::new_cyclic(|me| Pullers {
            intake,
            feed,
            deliver,
            still_waiting,
            running: Mutex::new(HashSet::new()),
            poll: poll_interval(),
            me: me.clone(),
            ready: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn intake(&self) -> &Arc<Intake> {
        &self.intake
    }

    /// Starts `module`'s puller unless it runs already (or boot has not finished: boot starts
    /// every module's then).
    pub fn ensure(self: &Arc<Self>, module: &str) {
        if !self.ready.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut running = self.running.lock();
        if running.contains(module) {
            return;
        }
        if running.len() >= MAX_PULLERS {
            log::warn!("late results: {MAX_PULLERS} pullers run already; {module} waits for a free one");
            return;
        }
        running.insert(module.to_owned());
        let (me, name) = (Arc::clone(self), module.to_owned());
        let spawned = std::thread::Builder::new().name("broca-late".into()).spawn(move || me.run(name));
        if let Err(e) = spawned {
            log::error!("late results: cannot start the puller of {module}: {e}");
            running.remove(module);
        }
    }

    /// Starts a puller for every module with registered calls (boot's last step).
    pub fn ensure_all(self: &Arc<Self>) {
        self.ready.store(true, std::sync::atomic::Ordering::Release);
        match self.intake.registrations() {
            Ok(rows) => {
                let modules: HashSet<String> = rows.into_iter().map(|r| r.module).collect();
                for m in modules {
                    self.ensure(&m);
                }
            }
            Err(e) => log::warn!("late results: cannot list registrations: {e}"),
        }
    }

    fn run(self: Arc<Self>, module: String) {
        let mut since = self
            .intake
            .cursor(&module)
            .ok()
            .flatten()
            .map(|(incarnation, seq)| Cursor { provider_incarnation: incarnation, seq });
        loop {
            {
                // Checked under the running lock: a registration made after this check finds
                // the puller gone and starts another.
                let mut running = self.running.lock();
                if !self.intake.needs_feed(&module).unwrap_or(true) {
                    running.remove(&module);
                    return;
                }
            }
            let wait = match self.pass(&module, &mut since) {
                Ok(Pass::Done { more: true }) => Duration::ZERO,
                Ok(Pass::Done { more: false }) => {
                    self.sweep(&module);
                    self.poll
                }
                Ok(Pass::Pinned) => self.poll,
                Err(e) => {
                    log::info!("late results from {module}: {e:?}; pulling again in {:?}", super::POLL_AFTER_ERROR);
                    super::POLL_AFTER_ERROR.min(self.poll.max(Duration::from_millis(1)) * 10)
                }
            };
            std::thread::sleep(wait);
        }
    }

    /// Drops the registrations of `module` whose calls have their result without a late entry
    /// (sealed at a crash, cancelled while held): nothing will ever answer them here.
    fn sweep(&self, module: &str) {
        let rows = self.intake.registrations().unwrap_or_default();
        let done: Vec<String> = rows
            .iter()
            .filter(|r| r.module == module)
            .take(SWEEP_PER_PASS)
            .filter(|r| (self.still_waiting)(r) == Some(false))
            .map(|r| r.call_key.clone())
            .collect();
        if let Err(e) = self.intake.prune(&done) {
            log::warn!("late results: cannot prune {} settled registration(s): {e}", done.len());
        }
    }

    /// Reads one page of `module`'s feed after `since`, takes its entries and acks them.
    fn pass(&self, module: &str, since: &mut Option<Cursor>) -> Result<Pass, String> {
        let reply = match self.read(module, since.clone()) {
            Err(CallError::Module(body)) if body.code == CURSOR_INCARNATION_CHANGED => {
                // The provider restarted: re-read from the start (receipts dedupe).
                *since = None;
                self.read(module, None).map_err(|e| e.to_string())?
            }
            other => other.map_err(|e| e.to_string())?,
        };
        for entry in &reply.entries {
            if self.take(module, entry)? == LateAck::NotYet {
                return Ok(Pass::Pinned);
            }
        }
        if since.as_ref() != Some(&reply.cursor) {
            let ack = AckRequest { through: reply.cursor.clone() };
            self.role_op(module, ops::LATE_RESULTS_ACK, serde_json::to_value(&ack).unwrap_or_default())
                .map_err(|e| format!("late_results.ack: {e}"))?;
            self.intake
                .set_cursor(module, Some((&reply.cursor.provider_incarnation, reply.cursor.seq)))
                .map_err(|e| e.to_string())?;
            *since = Some(reply.cursor.clone());
        }
        Ok(Pass::Done { more: reply.more })
    }

    fn read(&self, module: &str, since: Option<Cursor>) -> Result<LateResultsReply, CallError> {
        let mut request = LateResultsRequest::new().with_limit(super::PAGE_LIMIT);
        request.since = since;
        let body = self.role_op(module, ops::LATE_RESULTS, serde_json::to_value(&request).unwrap_or_default())?;
        serde_json::from_slice(&body).map_err(|e| CallError::BadReply(e.to_string()))
    }

    fn role_op(&self, module: &str, name: &str, arguments: serde_json::Value) -> Result<Vec<u8>, CallError> {
        self.feed.role_op(module, name, arguments, Instant::now() + REQUEST_WITHIN)
    }

    /// Takes one entry: a no-op (taken before, not a terminal kind, no registration names it)
    /// or a late result for its session's actor.
    fn take(&self, module: &str, entry: &LateEntry) -> Result<LateAck, String> {
        let key = entry.intake_key(module);
        if self.intake.received(&key).map_err(|e| e.to_string())? {
            return Ok(LateAck::NoOp);
        }
        // A call is answered by the module it was dispatched to, for the carrier that raised it
        // (tool-provider §7: correlated by `(carrier, call_key)`): an entry of another module
        // or custodian naming a registered key is taken in as a no-op, never delivered (#44).
        let registration = self.intake.registration(&entry.call_key).map_err(|e| e.to_string())?.filter(|reg| {
            let matches = reg.module == module && self.feed.custodian().is_none_or(|c| c == entry.custodian);
            if !matches {
                log::warn!(
                    "late results: {module:?} sent an entry for call {:?} of {:?} (custodian {:?}): not delivered",
                    entry.call_key,
                    reg.module,
                    entry.custodian
                );
            }
            matches
        });
        let outcome = match entry.kind() {
            EntryKind::Result if entry.reduced || entry.result.is_none() => {
                let outcome = entry.outcome.clone().unwrap_or_else(|| "unknown".into());
                Some(LateOutcome::Result(serde_json::Value::String(format!(
                    "The tool ran; its provider kept only the outcome: {outcome}."
                ))))
            }
            EntryKind::Result => entry.result.clone().map(LateOutcome::Result),
            EntryKind::NotStarted => Some(LateOutcome::NotStarted(entry.reason.clone().unwrap_or_default())),
            EntryKind::Expired => Some(LateOutcome::Expired),
            // `held` updates, `progress` and kinds this build does not know change nothing.
            _ => None,
        };
        // Only the registration this entry answers is pruned: a foreign entry never removes
        // another module's (or carrier's) registration.
        let terminal = outcome.is_some() && registration.is_some();
        let (ack, lineage) = match (registration, outcome) {
            (Some(reg), Some(outcome)) => ((self.deliver)(&reg, outcome), Some(reg.key.addr())),
            (reg, _) => (LateAck::NoOp, reg.map(|r| r.key.addr())),
        };
        // An entry no registration names (its call settled, or its session deleted) leaves no
        // receipt: read again it is the same no-op, and a deleted lineage keeps no row here.
        if let (Some(lineage), true) = (lineage, ack != LateAck::NotYet) {
            self.intake.receive(&key, &lineage).map_err(|e| e.to_string())?;
            if terminal {
                // The call's terminal is durable (delivered now, or recorded before).
                self.intake.prune(std::slice::from_ref(&entry.call_key)).map_err(|e| e.to_string())?;
            }
        }
        Ok(ack)
    }
}

impl std::fmt::Debug for Pullers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pullers").field("running", &self.running.lock().len()).finish()
    }
}

/// The loop registers calls here before sending them, and starts their module's puller.
impl crate::agent::CallRegistry for Pullers {
    fn register(
        &self,
        session: &crate::session_key::SessionKey,
        run_id: &str,
        calls: &[&crate::agent::ToolCall],
        now_ms: u64,
    ) -> Result<(), String> {
        let rows: Vec<Registration> = calls
            .iter()
            .filter_map(|c| {
                let module = c.target.as_ref()?.module.clone();
                Some(Registration {
                    call_key: c.call_key.clone(),
                    key: session.clone(),
                    run_id: run_id.to_owned(),
                    tool_call_id: c.tool_call_id.clone(),
                    module,
                })
            })
            .collect();
        self.intake.register(&rows, now_ms).map_err(|e| e.to_string())?;
        crate::failpoint!("held.after_register");
        if let Some(me) = self.me.upgrade() {
            for row in &rows {
                me.ensure(&row.module);
            }
        }
        Ok(())
    }

    fn settled(&self, call_keys: &[String]) {
        if let Err(e) = self.intake.prune(call_keys) {
            log::warn!("late results: cannot prune {} registration(s): {e}", call_keys.len());
        }
    }
}

/// The poll interval. Debug builds only (a non-shipping test switch): `BROCA_TEST_LATE_POLL_MS`
/// replaces the spec's 3 s so tests need not wait for it.
fn poll_interval() -> Duration {
    if cfg!(debug_assertions) {
        if let Some(ms) = std::env::var("BROCA_TEST_LATE_POLL_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
            return Duration::from_millis(ms.max(1));
        }
    }
    super::POLL_EVERY
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session_key::SessionKey;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A feed that is never read: `take` is driven directly.
    struct Silent;
    impl FeedRoute for Silent {
        fn role_op(&self, _: &str, _: &str, _: serde_json::Value, _: Instant) -> Result<Vec<u8>, CallError> {
            Err(CallError::BadReply("not read in this test".into()))
        }
        fn custodian(&self) -> Option<String> {
            Some("reserved:broca".into())
        }
    }

    fn entry(call_key: &str, custodian: &str, event: &str) -> LateEntry {
        serde_json::from_value(serde_json::json!({
            "kind": "result", "owner": "reserved:broca", "ref": "r", "scope_epoch": 0,
            "custodian": custodian, "call_key": call_key, "event_id": event,
            "settled_at": 1, "result": "done"
        }))
        .unwrap()
    }

    #[test]
    fn a_late_result_is_delivered_only_from_its_module_for_its_custodian() {
        let dir = tempfile::tempdir().unwrap();
        let intake = Arc::new(Intake::open(dir.path(), false).unwrap());
        let reg = Registration {
            call_key: "l:1".into(),
            key: SessionKey::new("/p", "h", "s"),
            run_id: "run-1".into(),
            tool_call_id: "c1".into(),
            module: "tools-a".into(),
        };
        intake.register(std::slice::from_ref(&reg), 1).unwrap();
        let delivered = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&delivered);
        let deliver: Deliver = Arc::new(move |_, _| {
            count.fetch_add(1, Ordering::SeqCst);
            LateAck::Delivered
        });
        let pullers = Pullers::new(Arc::clone(&intake), Arc::new(Silent), deliver, Arc::new(|_| Some(true)));
        // Another provider module naming the key: a no-op that leaves the registration alone.
        assert_eq!(pullers.take("tools-b", &entry("l:1", "reserved:broca", "e1")).unwrap(), LateAck::NoOp);
        // Its own module, but for another carrier: the same.
        assert_eq!(pullers.take("tools-a", &entry("l:1", "reserved:other", "e2")).unwrap(), LateAck::NoOp);
        assert_eq!(delivered.load(Ordering::SeqCst), 0);
        assert_eq!(intake.registration("l:1").unwrap(), Some(reg.clone()), "a foreign entry prunes nothing");
        // The call's own module, for broca: delivered once, and the registration goes.
        assert_eq!(pullers.take("tools-a", &entry("l:1", "reserved:broca", "e3")).unwrap(), LateAck::Delivered);
        assert_eq!(delivered.load(Ordering::SeqCst), 1);
        assert_eq!(intake.registration("l:1").unwrap(), None);
    }
}
