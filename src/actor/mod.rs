//! Lineage actors (spec §12): one OS thread per open session owns its [`Lineage`] (lease, WAL
//! writer, replay state, queue) and runs its turns. Every write to a session goes through its
//! actor as a [`SessionCommand`] ([`command`]), decided there ([`decide`], under the rules of
//! [`admission`] and [`policy`]); reads that need no writer go around it.
//!
//! Registry invariants:
//! - each key has one slot (`Mutex<Option<Actor>>`); opening happens under the slot's lock, so
//!   exactly one Opening exists per lineage and a concurrent opener waits for it;
//! - an actor closes only under its slot's lock and only when no job is waiting, and it drops
//!   its lineage (releasing the lease) before unlocking, so a send racing a close either reaches
//!   the live actor or opens a fresh one after the lease is free — never a half-torn state;
//! - durable queued work keeps an actor open (it drains the FIFO, one episode per send), and so
//!   does a run in progress; an idle actor with no pending work closes after its TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};
use parking_lot::Mutex;

pub mod admission;
mod answer;
pub mod command;
pub mod decide;
mod late;
pub mod moving;
pub mod policy;
pub mod senders;
mod tier;
pub mod warm;

use crate::agent::{self, LoopOptions, Mailbox, Output, ToolDispatcher};
use crate::lineage::{Lineage, LineageError, Shared};
use crate::provider::client::ModelClient;
use crate::provider::config::RenderConfig;
use crate::record::{CancelAt, FinishReason, Frozen, PauseReason, ProviderError};
use crate::replay::Resolution;
use crate::session_key::SessionKey;
use crate::state_root::Placement;

pub use crate::limits::MAILBOX;
/// How long a control command (cancel, drain, seal) may wait for room in a full mailbox.
const CONTROL_WAIT: Duration = Duration::from_secs(2);
/// How long a puller waits for a session's actor to take a late result.
const LATE_RESULT_WAIT: Duration = Duration::from_secs(30);

/// Where an actor's output goes: for each session its lineage thread opens, one sink (the
/// session's fan-out publisher, or nowhere).
pub type Publish = Arc<dyn Fn(&SessionKey) -> Box<dyn FnMut(Output) + Send> + Send + Sync>;

pub use admission::Admission;
pub use answer::Answer;
pub use command::SessionCommand;

/// What every actor needs to run turns.
pub struct RunDeps {
    /// The rules a send is admitted by (the catalog, `broca.jsonc`).
    pub admission: Arc<Admission>,
    pub client: Arc<dyn ModelClient>,
    pub tools: Arc<dyn ToolDispatcher>,
    pub opts: LoopOptions,
    pub publish: Publish,
    /// How long an idle actor with nothing pending keeps its lease.
    pub idle_ttl: Duration,
    /// Whether a session has observers: an actor keeps its lease while it does (§12), so no
    /// other process can write the session behind their backs.
    pub observed: Arc<dyn Fn(&SessionKey) -> bool + Send + Sync>,
    /// Admission checks a restart-paused run passes again before it resumes (the recorded
    /// model must still resolve); `None` admits every resume.
    pub readmit: Option<Readmit>,
}

/// Re-admits a frozen config; `Err` carries the refusal's message.
pub type Readmit = Arc<dyn Fn(&RenderConfig) -> Result<(), String> + Send + Sync>;

struct Actor {
    tx: Sender<SessionCommand>,
}

type Slot = Arc<Mutex<Option<Actor>>>;

pub struct Registry {
    shared: Arc<Shared>,
    deps: Arc<RunDeps>,
    /// What `session.warm` needs (the client, the clocks, the way back to an actor).
    warm: warm::WarmDeps,
    slots: Mutex<HashMap<SessionKey, Slot>>,
    gauges: Gauges,
    /// Shutting down: no new turn starts, and running ones are sealed.
    sealing: AtomicBool,
}

/// Counters and gauges for `health.check`.
#[derive(Default)]
pub struct Gauges {
    pub actor_opens: AtomicU64,
    /// Actors alive now (bounded by `limits.open_sessions`).
    pub open_sessions: AtomicU64,
    pub opening: AtomicU64,
    pub closing: AtomicU64,
    pub runs_in_flight: AtomicU64,
    /// Retention's unreadable-session total at the sweep's last pass
    /// (`crate::retention::Sweep::unreadable_sessions`).
    pub retention_unreadable_sessions: AtomicU64,
}

/// One open session counted in [`Gauges::open_sessions`]: given back when dropped (its actor
/// ended, however it ended, or the open failed).
struct OpenSession(Arc<Registry>);

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0.gauges.open_sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

thread_local! {
    /// Set when the current thread opened an actor (for the per-request log record).
    static OPENED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread opened an actor since the last call (and resets the flag).
pub fn take_opened_here() -> bool {
    OPENED_HERE.with(|c| c.replace(false))
}

impl Registry {
    pub fn new(shared: Arc<Shared>, deps: RunDeps) -> Arc<Registry> {
        Arc::new_cyclic(|registry: &std::sync::Weak<Registry>| Registry {
            warm: warm::WarmDeps {
                client: Arc::clone(&deps.client),
                clocks: Arc::clone(&deps.opts.cache_clocks),
                credentials: deps.opts.credentials.clone(),
                bearer: deps.opts.bearer.clone(),
                post: {
                    let registry = registry.clone();
                    Arc::new(move |key: &SessionKey, done| match registry.upgrade() {
                        Some(r) => r
                            .command(key, Placement::Standard, SessionCommand::WarmDone(done))
                            .map_err(|e| e.to_string()),
                        None => Err("the module is shutting down".into()),
                    })
                },
            },
            shared,
            deps: Arc::new(deps),
            slots: Mutex::new(HashMap::new()),
            gauges: Gauges::default(),
            sealing: AtomicBool::new(false),
        })
    }

    pub fn gauges(&self) -> &Gauges {
        &self.gauges
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The live step board of this registry's runs.
    pub fn steps(&self) -> &crate::agent::live::StepBoard {
        &self.deps.opts.steps
    }

    /// The prompt-cache clock of this registry's sessions.
    pub fn cache_clocks(&self) -> &crate::agent::cache_clock::CacheClocks {
        &self.deps.opts.cache_clocks
    }

    /// The session's slot, made if it has none (only for a command that may open it: an
    /// unused slot is pruned by the actor that closes, so a slot never outlives its use).
    fn slot(&self, key: &SessionKey) -> Slot {
        Arc::clone(self.slots.lock().entry(key.clone()).or_default())
    }

    /// The session's slot if it has one; queries never make one (the map would grow with
    /// every key ever asked about).
    fn existing_slot(&self, key: &SessionKey) -> Option<Slot> {
        self.slots.lock().get(key).cloned()
    }

    /// Hands `cmd` to the session's actor, opening it first if needed (a NEW session's WAL is
    /// created in `placement`'s tree; an existing WAL stays where it is). Blocks only while
    /// opening (lease and replay): call it from a worker, never from the io thread. A full
    /// mailbox is [`LineageError::MailboxFull`]; the command is dropped with its answer.
    pub fn command(
        self: &Arc<Self>,
        key: &SessionKey,
        placement: Placement,
        cmd: SessionCommand,
    ) -> Result<(), LineageError> {
        self.send(key, placement, cmd)
    }

    /// Opens the session's actor (nothing else): orphans are sealed and the queue drains.
    pub fn open(self: &Arc<Self>, key: &SessionKey) -> Result<(), LineageError> {
        self.send(key, Placement::Standard, SessionCommand::Open)
    }

    /// Hands a held call's late result to its session's actor (opening it if needed) and waits
    /// for what became of it. Anything short of an answer is "not yet": the puller reads the
    /// entry again later and nothing is acked.
    pub fn deliver_late(
        self: &Arc<Self>,
        reg: &crate::held::intake::Registration,
        outcome: crate::held::LateOutcome,
    ) -> crate::held::LateAck {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let answer = Answer::new(move |r| {
            let _ = tx.send(r);
        });
        let cmd = SessionCommand::LateResult { call_key: reg.call_key.clone(), outcome, answer };
        if let Err(e) = self.command(&reg.key, Placement::Standard, cmd) {
            log::info!("late result for {}: the session could not take it: {e}", reg.call_key);
            return crate::held::LateAck::NotYet;
        }
        match rx.recv_timeout(LATE_RESULT_WAIT) {
            Ok(Ok(ack)) => ack,
            Ok(Err(refusal)) => {
                log::info!("late result for {}: {}", reg.call_key, refusal.message);
                crate::held::LateAck::NotYet
            }
            Err(_) => crate::held::LateAck::NotYet,
        }
    }

    /// Asks the session's running turn to cancel. Returns false when no actor is open (so no
    /// run is active in this process).
    pub fn cancel(&self, key: &SessionKey, at: CancelAt) -> bool {
        let Some(slot) = self.existing_slot(key) else { return false };
        let guard = slot.lock();
        guard.as_ref().is_some_and(|a| a.tx.send_timeout(SessionCommand::CancelRunning(at), CONTROL_WAIT).is_ok())
    }

    /// Draining (spec: graceful restart): no new turn starts, and every running turn finishes
    /// its current step and batch, then seals `interrupted` at its next step-entry boundary.
    pub fn drain(&self) {
        self.sealing.store(true, Ordering::Release);
        self.tell_all(|| SessionCommand::SealAtBoundary);
    }

    /// Shutdown: drains, waits up to `grace` for turns to reach their boundary, then seals the
    /// rest `interrupted` at once (unknown-outcome results for calls in flight) and waits up to
    /// `grace` again. Returns the number still running at the end.
    pub fn seal_all(&self, grace: Duration) -> u64 {
        self.drain();
        if self.wait_idle(grace) == 0 {
            return 0;
        }
        self.tell_all(|| SessionCommand::Seal);
        self.wait_idle(grace)
    }

    fn tell_all(&self, cmd: impl Fn() -> SessionCommand) {
        let slots: Vec<Slot> = self.slots.lock().values().cloned().collect();
        for slot in slots {
            if let Some(actor) = slot.lock().as_ref() {
                if let Err(SendTimeoutError::Timeout(_)) = actor.tx.send_timeout(cmd(), CONTROL_WAIT) {
                    log::warn!("a session's actor mailbox stayed full; a drain/seal command was not delivered");
                }
            }
        }
    }

    /// Waits until no turn is running or `within` passes; returns how many still run.
    fn wait_idle(&self, within: Duration) -> u64 {
        let deadline = std::time::Instant::now() + within;
        loop {
            let running = self.gauges.runs_in_flight.load(Ordering::Acquire);
            if running == 0 || std::time::Instant::now() >= deadline {
                return running;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Boot recovery: opens every session the store shows with queued work or an open run, so
    /// the FIFO drains and orphans are sealed without waiting for a request. Returns how many
    /// were opened.
    pub fn recover(self: &Arc<Self>) -> usize {
        let keys = match self.shared.store.sessions_with_work() {
            Ok(k) => k,
            Err(e) => {
                log::warn!("boot recovery could not read run-index.db: {e}");
                return 0;
            }
        };
        let opened = |key: &&SessionKey| match self.open(key) {
            Ok(()) => true,
            Err(e) => {
                // A newer writer's WAL (or any unopenable one) is left untouched; others go on.
                log::warn!("boot recovery left session {:?} ({}) alone: {e}", key.session, key.addr());
                false
            }
        };
        keys.iter().filter(opened).count()
    }

    /// Starts the retention sweep (`crate::retention::Sweep`): one thread that, every
    /// [`crate::limits::RETENTION_SWEEP_MS`], deletes the retained sessions whose expiry has
    /// come and finishes deletions a crash interrupted (at boot too). It ends when the
    /// registry is dropped.
    pub fn start_retention_sweep(self: &Arc<Self>) -> std::io::Result<()> {
        let registry = Arc::downgrade(self);
        let every = Duration::from_millis(crate::limits::RETENTION_SWEEP_MS);
        std::thread::Builder::new().name("broca-retention".into()).spawn(move || {
            let mut sweep = crate::retention::Sweep::default();
            while let Some(registry) = registry.upgrade() {
                let deleted = sweep.pass(&registry.shared.expiry(), registry.shared.clock.now_ms());
                if deleted > 0 {
                    log::info!("retention: deleted {deleted} expired session(s)");
                }
                let unreadable = u64::try_from(sweep.unreadable_sessions()).unwrap_or(u64::MAX);
                registry.gauges.retention_unreadable_sessions.store(unreadable, Ordering::Relaxed);
                drop(registry);
                std::thread::sleep(every);
            }
        })?;
        Ok(())
    }

    /// Folds cold WALs in the background (`lineage::fold`): first what cut folds left is
    /// tidied, then a sweep every `policy.sweep_every_ms`.
    pub fn start_fold_sweep(self: &Arc<Self>, policy: crate::lineage::fold::FoldPolicy) -> std::io::Result<()> {
        let tidied = crate::lineage::fold::tidy(&self.shared);
        if tidied > 0 {
            log::info!("fold: removed {tidied} file(s) a cut fold or unfold left");
        }
        let registry = Arc::downgrade(self);
        let every = Duration::from_millis(policy.sweep_every_ms.max(1000));
        std::thread::Builder::new().name("broca-fold".into()).spawn(move || loop {
            std::thread::sleep(every);
            let Some(registry) = registry.upgrade() else { return };
            let results = crate::lineage::fold::sweep(&registry.shared, &policy);
            let sealed =
                results.iter().filter(|r| matches!(r, Ok(crate::lineage::fold::Folded::Sealed { .. }))).count();
            for e in results.iter().filter_map(|r| r.as_ref().err()) {
                log::warn!("{e}");
            }
            if sealed > 0 {
                log::info!("fold: sealed {sealed} cold session(s)");
            }
        })?;
        Ok(())
    }

    /// Whether shutdown has begun (no new turn may start).
    pub fn is_sealing(&self) -> bool {
        self.sealing.load(Ordering::Acquire)
    }

    /// Asks the session's actor, if one is open, to close once nothing runs or waits (an
    /// adopt needs the lease); waits briefly for it to go. Never opens one.
    pub fn close_idle(&self, key: &SessionKey) {
        let Some(slot) = self.existing_slot(key) else { return };
        let sent = slot.lock().as_ref().is_some_and(|actor| actor.tx.try_send(SessionCommand::Close).is_ok());
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while sent && slot.lock().is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Whether the session has an open actor.
    pub fn is_open(&self, key: &SessionKey) -> bool {
        self.existing_slot(key).is_some_and(|slot| slot.lock().is_some())
    }

    /// Hands `cmd` to the session's actor, opening one (with `placement` for a new WAL) if none
    /// is open or the open one died.
    fn send(self: &Arc<Self>, key: &SessionKey, placement: Placement, cmd: SessionCommand) -> Result<(), LineageError> {
        let slot = self.slot(key);
        let sent = self.send_to(key, placement, &slot, cmd);
        if sent.is_err() {
            // A failed open leaves no slot behind.
            self.prune(key, slot);
        }
        sent
    }

    fn send_to(
        self: &Arc<Self>,
        key: &SessionKey,
        placement: Placement,
        slot: &Slot,
        cmd: SessionCommand,
    ) -> Result<(), LineageError> {
        let mut guard = slot.lock();
        if let Some(actor) = guard.as_ref() {
            match actor.tx.try_send(cmd) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(_)) => return Err(LineageError::MailboxFull { limit: MAILBOX }),
                // The actor died (a panic or a poisoned WAL); open a fresh one.
                Err(TrySendError::Disconnected(cmd)) => {
                    *guard = None;
                    return self.open_locked(key, placement, slot, &mut guard, cmd);
                }
            }
        }
        self.open_locked(key, placement, slot, &mut guard, cmd)
    }

    fn open_locked(
        self: &Arc<Self>,
        key: &SessionKey,
        placement: Placement,
        slot: &Slot,
        guard: &mut Option<Actor>,
        first: SessionCommand,
    ) -> Result<(), LineageError> {
        let limit = self.deps.admission.config.limits.open_sessions;
        let counted = self
            .gauges
            .open_sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit as u64).then_some(n + 1));
        if counted.is_err() {
            return Err(LineageError::TooManySessions { limit });
        }
        // From here the count is the actor's: its thread gives it back when it ends.
        let open = OpenSession(Arc::clone(self));
        self.gauges.opening.fetch_add(1, Ordering::Relaxed);
        let opened = self.shared.open_lineage_placed(key, placement);
        self.gauges.opening.fetch_sub(1, Ordering::Relaxed);
        let lineage = opened?;
        self.gauges.actor_opens.fetch_add(1, Ordering::Relaxed);
        OPENED_HERE.with(|c| c.set(true));
        let (tx, rx) = bounded(MAILBOX);
        let _ = tx.try_send(first);
        let registry = Arc::clone(self);
        let slot = Arc::clone(slot);
        let name = format!("broca-actor-{}", &key.addr()[..8]);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _open = open;
                registry.actor_main(lineage, rx, slot)
            })
            .map_err(|e| LineageError::Refused(format!("cannot start the session's actor: {e}")))?;
        *guard = Some(Actor { tx });
        Ok(())
    }

    /// The actor thread: jobs, then turns (a resumed run or the next queued send), then an idle
    /// wait that ends in closing.
    fn actor_main(self: Arc<Self>, mut lineage: Lineage, rx: Receiver<SessionCommand>, slot: Slot) {
        let key = lineage.key().clone();
        // Declared after `lineage`, so it is dropped first (even on a panic): the next actor of
        // this session can take the session's rings as soon as the lease is free.
        let mut publish = (self.deps.publish)(&key);
        // An orphan's seal, made durable by the open: subscribers attached before it wait for it.
        let sealed = lineage.take_opened_units();
        if !sealed.is_empty() {
            publish(Output::Control(sealed));
        }
        // A `Close` asked for: honoured once nothing runs or waits (`crate::moves` adopt).
        let mut close_asked = false;
        loop {
            while let Ok(cmd) = rx.try_recv() {
                if matches!(cmd, SessionCommand::Close) {
                    close_asked = true;
                    continue;
                }
                if matches!(cmd, SessionCommand::Send { .. }) && expired_deletable(&lineage) {
                    // The send starts a fresh record: this actor closes, and the next open
                    // deletes the expired one first (`crate::retention`).
                    drop(publish);
                    return self.close_expired(lineage, &rx, slot, cmd);
                }
                self.handle(&mut lineage, cmd, &mut publish);
            }
            // A command whose write failed latched the WAL: every later command would be refused
            // by this writer, so the actor ends and the next command reopens the session (which
            // cuts the WAL back to its durable end) once the device works again.
            let turn = if lineage.write_failed() {
                Err(LineageError::Refused("the session's WAL latched a write failure".into()))
            } else {
                self.next_turn(&mut lineage, &rx, &mut publish)
            };
            match turn {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    log::error!("session {}: the actor stops after a write failure: {e}", key.addr());
                    drop(publish);
                    self.close(&slot, &rx);
                    self.prune(&key, slot);
                    return;
                }
            }
            // A retained session closes at its expiry, observed or not: its lease is then free
            // for the retention sweep to delete it within `delete_within_ms`.
            let expiry = crate::retention::expiry_of(lineage.state());
            // A clock a test moves is read again at least every `recheck`.
            let clock = lineage.clock();
            let wait = match expiry {
                Some(at) => Duration::from_millis(at.saturating_sub(clock.now_ms())).min(self.deps.idle_ttl),
                None => self.deps.idle_ttl,
            };
            let wait = clock.recheck().map_or(wait, |tick| wait.min(tick));
            // A close asked for is decided at once, below.
            let wait = if close_asked { Duration::ZERO } else { wait };
            match rx.recv_timeout(wait) {
                Ok(SessionCommand::Close) => close_asked = true,
                Ok(cmd) => {
                    if matches!(cmd, SessionCommand::Send { .. }) && expired_deletable(&lineage) {
                        drop(publish);
                        return self.close_expired(lineage, &rx, slot, cmd);
                    }
                    self.handle(&mut lineage, cmd, &mut publish);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    let asked = std::mem::take(&mut close_asked) && !running(&lineage);
                    let mut guard = slot.lock();
                    let quiet = rx.is_empty() && lineage.state().queue.is_empty();
                    if quiet && (asked || expired(&lineage) || !(self.deps.observed)(&key)) {
                        self.gauges.closing.fetch_add(1, Ordering::Relaxed);
                        *guard = None;
                        drop(publish);
                        drop(lineage);
                        self.gauges.closing.fetch_sub(1, Ordering::Relaxed);
                        drop(guard);
                        self.prune(&key, slot);
                        return;
                    }
                }
            }
        }
    }

    /// Closes the actor of an expired session and hands `first` and every command still in its
    /// mailbox to a fresh actor, whose open deletes the expired record before anything runs.
    fn close_expired(
        self: &Arc<Self>,
        lineage: Lineage,
        rx: &Receiver<SessionCommand>,
        slot: Slot,
        first: SessionCommand,
    ) {
        let key = lineage.key().clone();
        let mut waiting = vec![first];
        {
            let mut guard = slot.lock();
            *guard = None;
            drop(lineage);
            waiting.extend(rx.try_iter());
        }
        self.prune(&key, slot);
        for cmd in waiting {
            let placement = match &cmd {
                SessionCommand::Send { send, .. } => {
                    self.deps.admission.config.placement_for(send.session_class.as_deref(), send.retention.is_some())
                }
                _ => Placement::Standard,
            };
            if let Err(e) = self.send(&key, placement, cmd) {
                log::warn!("session {}: a command for the expired record was dropped: {e}", key.addr());
            }
        }
    }

    /// Handles a command between turns (a signal finds no run to act on).
    fn handle(&self, lineage: &mut Lineage, cmd: SessionCommand, publish: &mut dyn FnMut(Output)) {
        let handled = command::handle(&self.ctx(), lineage, cmd);
        if !handled.units.is_empty() {
            publish(Output::Control(handled.units));
        }
    }

    fn ctx(&self) -> command::Ctx<'_> {
        command::Ctx { admission: &self.deps.admission, store: &self.shared.store, warm: &self.warm }
    }

    /// Drops a closed session's slot from the registry unless someone else holds it (a caller
    /// about to open it again keeps it), so the map holds only sessions in use.
    fn prune(&self, key: &SessionKey, slot: Slot) {
        let mut slots = self.slots.lock();
        drop(slot);
        let unused =
            slots.get(key).is_some_and(|s| Arc::strong_count(s) == 1 && s.try_lock().is_some_and(|a| a.is_none()));
        if unused {
            slots.remove(key);
        }
    }

    /// Sessions with a registry slot (open, opening, or just used).
    pub fn slots(&self) -> usize {
        self.slots.lock().len()
    }

    fn close(&self, slot: &Slot, rx: &Receiver<SessionCommand>) {
        let mut guard = slot.lock();
        *guard = None;
        // Commands that can no longer run are dropped; their answers say the session closed.
        while rx.try_recv().is_ok() {}
    }

    /// Drives the open run, or starts the next queued send. Returns whether it did anything.
    fn next_turn(
        &self,
        lineage: &mut Lineage,
        rx: &Receiver<SessionCommand>,
        publish: &mut dyn FnMut(Output),
    ) -> Result<bool, LineageError> {
        if self.sealing.load(Ordering::Acquire) {
            return Ok(false);
        }
        match lineage.state().resolution() {
            Resolution::Resume { .. } => {}
            Resolution::Paused { run_id, reason: PauseReason::Restart } => {
                // Resumed through the normal admission checks; a refusal seals it.
                let frozen = lineage.state().last.as_ref().and_then(|e| e.config.config());
                let refused = match frozen {
                    Some(config) => self.deps.readmit.as_ref().and_then(|check| check(config).err()),
                    None => Some("the frozen config does not decode in this build".to_string()),
                };
                if let Some(why) = refused {
                    let message = format!("the restart-paused run could not be resumed: {why}");
                    let error = ProviderError::permanent("resume_refused", message);
                    lineage.finish_run(&run_id, FinishReason::Interrupted, Some(error), vec![])?;
                    publish(Output::Control(lineage.commit()?));
                    return Ok(true);
                }
            }
            Resolution::Paused { .. } => return Ok(false),
            Resolution::Empty | Resolution::Idle { .. } => {
                // The idle boundary: waiting list sends past their time are dropped first.
                if lineage.drop_expired()? > 0 {
                    publish(Output::Control(lineage.commit()?));
                }
                let Some(mut next) = lineage.state().next_to_start().cloned() else { return Ok(false) };
                if next.request.order.is_some() {
                    // A list starts its run through `idle_start`, and its entry says so.
                    let went = cortexkit_role_llm_runner::delivery_order::EntryDelivery::new(
                        cortexkit_role_llm_runner::delivery_order::Mode::IdleStart,
                    );
                    next.message.delivered_as = Some(went);
                }
                crate::failpoint!("queue.between_queued_and_started");
                let run_id = format!("run-{}", next.submission_id);
                let config: RenderConfig = match next.request.config.as_ref().and_then(Frozen::config) {
                    Some(c) => c.clone(),
                    None => {
                        // Admitted under a config this build cannot read: its run starts with
                        // that config as written and ends visibly, rather than leave the FIFO
                        // stuck behind it.
                        let written =
                            next.request.config.clone().unwrap_or(Frozen::Unreadable(serde_json::Value::Null));
                        let units =
                            agent::admit_unreadable(lineage, &run_id, &next.submission_id, written, next.message)?;
                        publish(Output::Control(units));
                        let message = "the queued send's frozen config does not decode in this build".to_string();
                        let error = ProviderError::permanent("queued_config_unreadable", message);
                        lineage.finish_run(&run_id, FinishReason::Error, Some(error), vec![])?;
                        publish(Output::Control(lineage.commit()?));
                        return Ok(true);
                    }
                };
                let title = next.request.title.clone();
                let units = agent::admit(
                    lineage,
                    &run_id,
                    Some(&next.submission_id),
                    &config,
                    next.message,
                    title,
                    self.deps.admission.credentials.as_ref(),
                )?;
                publish(Output::Control(units));
            }
        }
        let d = &self.deps;
        self.gauges.runs_in_flight.fetch_add(1, Ordering::Relaxed);
        let ctx = self.ctx();
        let mut handle = |lineage: &mut Lineage, cmd| command::handle(&ctx, lineage, cmd);
        let mailbox = Mailbox { rx, handle: &mut handle };
        let driven = agent::drive_with(lineage, d.client.as_ref(), &d.tools, mailbox, &d.opts, &mut |o| publish(o));
        self.gauges.runs_in_flight.fetch_sub(1, Ordering::Relaxed);
        driven?;
        Ok(true)
    }
}

/// Whether the session's record is past its retention now (`crate::retention::expiry_of`).
fn expired(lineage: &Lineage) -> bool {
    crate::retention::expiry_of(lineage.state()).is_some_and(|at| lineage.now_ms() >= at)
}

/// Whether a send to the session is for a fresh record: its record expired, and this writer
/// did not find the deletion fenced when it opened (a fenced one refuses the send instead of
/// reopening round and round, `decide::send`).
fn expired_deletable(lineage: &Lineage) -> bool {
    expired(lineage) && lineage.deletion_fenced().is_none()
}

/// Whether the session's last run has not finished (running or paused).
fn running(lineage: &Lineage) -> bool {
    lineage.state().last.as_ref().is_some_and(|e| !matches!(e.status, crate::replay::EpisodeStatus::Finished { .. }))
}
