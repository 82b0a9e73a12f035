//! Fan-out (spec §6–§9, §16): many observers of one session, each with its own thread, so one
//! slow subscriber never slows the run or the other subscribers.
//!
//! Per session there is one [`Lanes`]: a bounded broadcast ring per lane ([`ring`]), written
//! only by the session's lineage thread through its [`Publisher`] (a publish is O(1): it never
//! blocks, never locks, whatever the number of subscribers), and a [`ring::Bell`] that wakes the
//! fan-out threads, each of which drains both rings at its own positions.
//!
//! - **Control** lane: durable, replayable units addressed by `(wal_seq, sub_index)`. A
//!   subscriber takes its ring positions *before* it replays the WAL, so every unit published
//!   meanwhile is still in the ring; replay then reads what is durable and remembers the last
//!   cursor `R` it sent, and the live lane skips units at or before `R`. Units are published only
//!   after their fsync, so a unit is either in the replay or after `R`: no gap, no duplicate. A
//!   subscriber the writer overtakes (more than [`CONTROL_LANE`] units behind) is detached (its
//!   stream ends with `subscriber_lagged`) and resubscribes from its cursor — a control unit is
//!   never silently dropped.
//! - **Display** lane: live only, lossy. A reader the writer overtakes counts the positions it
//!   missed and gets one `display_gap {dropped}` before the next delivered display event.
//! - **Attach replay** ([`step`]): after the durable replay its attach point asks for, a new
//!   subscriber gets the step in flight as it stands — `display_reset`, then one coalesced
//!   delta per part so far — then the live deltas.
//! - Every frame carries `seq`, from 1, rising by one per frame across both lanes.
//! - A terminal run does not end a stream: subscribers stay attached for later episodes.
//!
//! The hub's mutex is taken to attach, detach and count subscribers, never to publish. A
//! publish takes only its session's step lock, which an attach holds just long enough to copy
//! the step snapshot and take its ring positions.

pub mod ring;
pub mod step;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cortexkit_role_llm_runner::display::{self as role_display, Limits};
use cortexkit_role_llm_runner::live::{DisplayGap, LiveEvent, TextDelta, ToolInputDelta};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::agent::{DisplayEvent, Output};
use crate::lineage::projection::{ControlUnit, Cursor};
use crate::lineage::read;
use crate::lineage::reader::{Reader, Start};
use crate::lineage::{LineageError, Shared};
use crate::session_key::SessionKey;
use crate::wire::{Refusal, RefusalCode};
use ring::{Bell, Ring, Slot, Writer};

pub use crate::limits::{CONTROL_LANE, DISPLAY_LANE};
/// Records read per replay batch (no lock is held while a batch's units are sent).
const REPLAY_BATCH: usize = 256;
/// How long an idle fan-out thread sleeps before it looks again (a lost wake costs this).
const IDLE_WAIT: Duration = Duration::from_millis(250);

/// Where a subscription attaches (spec §7, §16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum From {
    Start,
    Live,
    /// Strictly after this unit.
    After(Cursor),
}

/// Why a frame could not be delivered.
#[derive(Debug)]
pub enum SinkError {
    /// The reader is gone; end quietly.
    Closed,
    /// The frame is larger than the transport allows (or cannot be encoded).
    Undeliverable(Refusal),
}

/// The transport end of one subscription.
pub trait StreamSink: Send + 'static {
    fn frame(&mut self, event: &Value) -> Result<(), SinkError>;
    /// Ends the stream: `None` is a clean end, `Some` a typed error.
    fn end(&mut self, error: Option<Refusal>);
}

/// One session's rings and bell.
pub struct Lanes {
    control: Arc<Ring<ControlUnit>>,
    display: Arc<Ring<DisplayEvent>>,
    bell: Bell,
    /// Attached subscribers: with none, the publisher skips the rings (nothing to hold).
    subscribers: AtomicUsize,
    /// The step in flight. Held by a publish across its snapshot update and ring pushes, and by
    /// an attach across its snapshot copy and ring positions, so the two always agree. Lock
    /// order: the hub's `topics`, then this; a publish never takes `topics` while holding it.
    step: Mutex<step::StepSnapshot>,
}

impl Lanes {
    fn new() -> Lanes {
        Lanes {
            control: Arc::new(Ring::new(CONTROL_LANE)),
            display: Arc::new(Ring::new(DISPLAY_LANE)),
            bell: Bell::new(),
            subscribers: AtomicUsize::new(0),
            step: Mutex::default(),
        }
    }
}

/// A stop request for one subscriber: `Some(None)` a clean end, `Some(Some(r))` an error.
type Stop = Arc<Mutex<Option<Option<Refusal>>>>;

struct Member {
    id: u64,
    stop: Stop,
}

/// A session's subscribers and its lanes. Kept while it has members or a publisher.
struct Topic {
    lanes: Arc<Lanes>,
    members: Vec<Member>,
    publishers: usize,
}

impl Topic {
    fn new() -> Topic {
        Topic { lanes: Arc::new(Lanes::new()), members: Vec::new(), publishers: 0 }
    }
}

/// All sessions' subscribers in this process. `attached` is the number of members over every
/// topic; it changes only under the `topics` lock, so the per-process bound is exact.
pub struct Hub {
    topics: Mutex<HashMap<SessionKey, Topic>>,
    next_id: AtomicU64,
    attached: AtomicUsize,
    per_session: usize,
    per_process: usize,
}

impl Default for Hub {
    fn default() -> Hub {
        let limits = crate::limits::Limits::default();
        Hub::with_limits(&limits)
    }
}

/// A live subscription; dropping it does not end the stream (use `cancel`).
pub struct Subscription {
    hub: Arc<Hub>,
    key: SessionKey,
    id: u64,
}

impl Subscription {
    /// Ends the stream (the client cancelled or its route closed).
    pub fn cancel(&self) {
        self.hub.remove(&self.key, self.id, None);
    }
}

/// The lineage thread's end of a session's lanes: the only writer of its rings.
pub struct Publisher {
    hub: Arc<Hub>,
    key: SessionKey,
    lanes: Arc<Lanes>,
    control: Option<Writer<ControlUnit>>,
    display: Option<Writer<DisplayEvent>>,
}

impl Publisher {
    /// Publishes a lineage's output: control units (already durable) and display events. O(1)
    /// per item; the only lock is the session's step lock (uncontended but for an attach); one
    /// wake of one sleeping reader at most. The step snapshot is kept with or without
    /// subscribers: the next one to attach replays it.
    pub fn publish(&mut self, output: Output) {
        let mut step = self.lanes.step.lock();
        match &output {
            Output::Control(units) => step.settle(units),
            Output::Display(event) => step.record(event),
        }
        if self.lanes.subscribers.load(Ordering::SeqCst) == 0 {
            return;
        }
        match output {
            Output::Control(units) => {
                if let Some(w) = &mut self.control {
                    for unit in units {
                        w.push(unit);
                    }
                } else if !units.is_empty() {
                    // Never under the step lock: an attach takes `topics` before it.
                    drop(step);
                    self.hub.detach_all(&self.key, lagged());
                    return;
                }
            }
            Output::Display(event) => {
                if let Some(w) = &mut self.display {
                    w.push(event);
                }
            }
        }
        drop(step);
        self.lanes.bell.ring();
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Release the ring writers before the topic can be dropped or claimed again.
        self.control = None;
        self.display = None;
        let mut topics = self.hub.topics.lock();
        if let Some(topic) = topics.get_mut(&self.key) {
            topic.publishers = topic.publishers.saturating_sub(1);
            if topic.publishers == 0 && topic.members.is_empty() {
                topics.remove(&self.key);
            }
        }
    }
}

fn lagged() -> Refusal {
    Refusal::new(
        RefusalCode::SubscriberLagged,
        "the subscriber fell too far behind the control stream; resubscribe from its last cursor",
        Some(crate::detail!("class" => "transient")),
    )
}

impl Hub {
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub::default())
    }

    /// A hub bounded by `limits.subscribers_per_session` and `limits.subscribers_per_process`.
    pub fn with_limits(limits: &crate::limits::Limits) -> Hub {
        Hub {
            topics: Mutex::default(),
            next_id: AtomicU64::new(0),
            attached: AtomicUsize::new(0),
            per_session: limits.subscribers_per_session,
            per_process: limits.subscribers_per_process,
        }
    }

    /// The session's publisher, for the lineage thread that writes it (one at a time: the
    /// lease makes it so). A writer still held by a closing predecessor is waited for briefly;
    /// if it never comes free, control output detaches every subscriber (they resubscribe from
    /// their cursors) rather than being lost silently.
    pub fn publisher(self: &Arc<Self>, key: &SessionKey) -> Publisher {
        let lanes = {
            let mut topics = self.topics.lock();
            let topic = topics.entry(key.clone()).or_insert_with(Topic::new);
            topic.publishers += 1;
            Arc::clone(&topic.lanes)
        };
        let (mut control, mut display) = (None, None);
        for _ in 0..200 {
            control = control.or_else(|| lanes.control.writer());
            display = display.or_else(|| lanes.display.writer());
            if control.is_some() && display.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if control.is_none() {
            log::error!("session {}: its fan-out ring has another writer; subscribers will be detached", key.addr());
        }
        Publisher { hub: Arc::clone(self), key: key.clone(), lanes, control, display }
    }

    fn remove(&self, key: &SessionKey, id: u64, why: Option<Refusal>) {
        let mut topics = self.topics.lock();
        let Some(topic) = topics.get_mut(key) else { return };
        if let Some(pos) = topic.members.iter().position(|m| m.id == id) {
            let m = topic.members.remove(pos);
            self.attached.fetch_sub(1, Ordering::SeqCst);
            m.stop.lock().get_or_insert(why);
            topic.lanes.subscribers.fetch_sub(1, Ordering::SeqCst);
            topic.lanes.bell.ring_all();
        }
        if topic.members.is_empty() && topic.publishers == 0 {
            topics.remove(key);
        }
    }

    fn detach_all(&self, key: &SessionKey, why: Refusal) {
        let ids: Vec<u64> =
            self.topics.lock().get(key).map(|t| t.members.iter().map(|m| m.id).collect()).unwrap_or_default();
        for id in ids {
            self.remove(key, id, Some(why.clone()));
        }
    }

    /// Ends every subscription of a session (its streams end cleanly).
    pub fn cancel_all(&self, key: &SessionKey) {
        let ids: Vec<u64> =
            self.topics.lock().get(key).map(|t| t.members.iter().map(|m| m.id).collect()).unwrap_or_default();
        for id in ids {
            self.remove(key, id, None);
        }
    }

    /// Number of subscribers of a session.
    pub fn subscribers(&self, key: &SessionKey) -> usize {
        self.topics.lock().get(key).map_or(0, |t| t.members.len())
    }

    /// Attaches a subscriber to `key`'s session and starts its thread. Reads the durable head
    /// for `live`: call it from a worker, never from the io thread. Past a subscriber limit the
    /// stream ends at once with `too_many_subscribers` (`detail {limit, scope}`) and `None`.
    pub fn attach(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        key: &SessionKey,
        from: From,
        sink: impl StreamSink,
    ) -> Option<Subscription> {
        self.attach_with(shared, key, from, None, sink)
    }

    /// [`Hub::attach`] with the subscriber's byte bounds: `tool_started` arguments longer than
    /// `limits.arguments_bytes` are cut and marked `arguments_truncated` (CONTRACT §7.1).
    pub fn attach_with(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        key: &SessionKey,
        from: From,
        limits: Option<Limits>,
        mut sink: impl StreamSink,
    ) -> Option<Subscription> {
        if let From::After(cursor) = from {
            if let Some(refusal) = beyond_head(shared, key, cursor) {
                sink.end(Some(refusal));
                return None;
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stop: Stop = Arc::default();
        // Registered, with its ring positions taken, before the replay reads the WAL (and
        // before the live head is read): nothing published from here on is missed.
        let (lanes, positions, step) = {
            let mut topics = self.topics.lock();
            let members = topics.get(key).map_or(0, |t| t.members.len());
            let over = if members >= self.per_session {
                Some((self.per_session, "session"))
            } else if self.attached.load(Ordering::SeqCst) >= self.per_process {
                Some((self.per_process, "process"))
            } else {
                None
            };
            if let Some((limit, scope)) = over {
                drop(topics);
                let what = format!("no more subscribers may attach to this {scope}");
                sink.end(Some(crate::wire::over_limit(RefusalCode::TooManySubscribers, &what, limit, Some(scope))));
                return None;
            }
            self.attached.fetch_add(1, Ordering::SeqCst);
            let topic = topics.entry(key.clone()).or_insert_with(Topic::new);
            topic.members.push(Member { id, stop: Arc::clone(&stop) });
            topic.lanes.subscribers.fetch_add(1, Ordering::SeqCst);
            let lanes = Arc::clone(&topic.lanes);
            // Counted as a subscriber above, so every publish from here on pushes to the rings.
            let step = lanes.step.lock();
            let positions = Positions { control: lanes.control.head(), display: lanes.display.head() };
            let replay = step.replay();
            drop(step);
            (lanes, positions, replay)
        };
        // The attach barrier for `live`: the durable head is read after registration and
        // before this returns, so everything published later is delivered and nothing before.
        let from = match from {
            From::Live => match read::durable_head(shared, key) {
                Ok(Some(head)) => From::After(head),
                Ok(None) => From::Start,
                Err(e) => {
                    log::warn!("live attach could not read the durable head: {e}");
                    From::Live
                }
            },
            other => other,
        };
        let hub = Arc::clone(self);
        let (key2, shared) = (key.clone(), Arc::clone(shared));
        let spawned = std::thread::Builder::new().name("broca-fanout".into()).spawn(move || {
            let mut sink = sink;
            let mut feeder = Feeder {
                seq: 0,
                sink: &mut sink,
                lanes: &lanes,
                stop: &stop,
                at: positions,
                dropped: 0,
                step: Some(step),
                limits,
            };
            let outcome = feeder.run(&shared, &key2, from);
            hub.remove(&key2, id, None);
            sink.end(outcome.err());
        });
        if let Err(e) = spawned {
            log::error!("cannot start a subscriber thread: {e}");
            self.remove(key, id, None);
        }
        Some(Subscription { hub: Arc::clone(self), key: key.clone(), id })
    }
}

/// A resume cursor past the session's durable head names no unit broca ever made visible
/// (units are published only once fsynced): it is refused `invalid_params` naming `from`, with
/// the durable `head` (absent when the session has no unit), rather than silently waiting for
/// units that would be skipped. A head that cannot be read lets the replay report the failure.
fn beyond_head(shared: &Shared, key: &SessionKey, cursor: Cursor) -> Option<Refusal> {
    let head = read::durable_head(shared, key).ok()?;
    if head.is_some_and(|h| cursor <= h) {
        return None;
    }
    let message = match head {
        Some(h) => format!(
            "invalid params: from: the cursor {{wal_seq: {}, sub_index: {}}} is past the session's durable head {{wal_seq: {}, sub_index: {}}}",
            cursor.wal_seq, cursor.sub_index, h.wal_seq, h.sub_index
        ),
        None => "invalid params: from: the session has no durable unit yet; subscribe from \"start\" or \"live\"".to_string(),
    };
    let detail = match head {
        Some(h) => crate::detail!("field" => "from", "head" => h),
        None => crate::detail!("field" => "from"),
    };
    Some(Refusal::new(RefusalCode::InvalidParams, message, Some(detail)))
}

/// A reader's next ring positions.
#[derive(Clone, Copy, Debug)]
struct Positions {
    control: u64,
    display: u64,
}

/// One subscriber's thread: replay, then the live rings at its own positions.
struct Feeder<'a, S: StreamSink> {
    seq: u64,
    sink: &'a mut S,
    lanes: &'a Lanes,
    stop: &'a Stop,
    at: Positions,
    /// Display positions missed since the last delivered display event.
    dropped: u64,
    /// The step in flight at attach, sent once after the durable replay (`None` once sent).
    step: Option<step::Replay>,
    /// The subscriber's byte bounds on `tool_started` arguments.
    limits: Option<Limits>,
}

impl<S: StreamSink> Feeder<'_, S> {
    fn send(&mut self, mut event: Value) -> Result<(), Option<Refusal>> {
        self.seq += 1;
        event["seq"] = json!(self.seq);
        match self.sink.frame(&event) {
            Ok(()) => Ok(()),
            Err(SinkError::Closed) => Err(None),
            Err(SinkError::Undeliverable(r)) => Err(Some(r)),
        }
    }

    /// One control unit, its `tool_started` arguments cut to the subscriber's limits.
    fn control(&mut self, unit: &ControlUnit) -> Result<(), Option<Refusal>> {
        match (&self.limits, &unit.event) {
            (Some(limits), Some(LiveEvent::ToolStarted(started))) => {
                let (arguments, truncated) = role_display::cut(&started.arguments, limits.arguments_bytes);
                let mut cut = started.clone();
                cut.arguments = arguments;
                cut.arguments_truncated = truncated;
                let unit = ControlUnit { event: Some(LiveEvent::ToolStarted(cut)), ..unit.clone() };
                self.send(control_frame(&unit))
            }
            _ => self.send(control_frame(unit)),
        }
    }

    /// One display event, preceded by a `display_gap` when deltas were dropped since the last.
    fn display(&mut self, event: &DisplayEvent) -> Result<(), Option<Refusal>> {
        let dropped = std::mem::take(&mut self.dropped);
        if dropped > 0 {
            let gap = LiveEvent::DisplayGap(DisplayGap::new(dropped));
            self.send(json!({"kind": "display", "event": gap}))?;
        }
        self.send(display_frame(event))
    }

    /// Returns `Ok` when the stream was stopped cleanly, `Err(refusal)` when it ends in error.
    fn run(&mut self, shared: &Shared, key: &SessionKey, from: From) -> Result<(), Refusal> {
        match self.feed(shared, key, from) {
            Ok(()) | Err(None) => Ok(()),
            Err(Some(r)) => Err(r),
        }
    }

    fn stopped(&self) -> Option<Option<Refusal>> {
        self.stop.lock().clone()
    }

    fn feed(&mut self, shared: &Shared, key: &SessionKey, from: From) -> Result<(), Option<Refusal>> {
        let replay_failed = |e: LineageError| {
            Some(Refusal::new(RefusalCode::SubscribeReplayFailed, format!("subscribe replay failed: {e}"), None))
        };
        // The last cursor sent (or, for `live`, the durable head at attach).
        let mut last: Option<Cursor> = match from {
            From::Start => None,
            From::After(c) => Some(c),
            From::Live => read::durable_head(shared, key).map_err(replay_failed)?,
        };
        if let (true, Some(reader)) = (from != From::Live, Reader::open(shared, key)) {
            // Durable units in batches, one record in memory at a time; no lock is held while
            // they are sent. A cursor replay starts at a store checkpoint below it.
            let start = match last {
                Some(c) => Start::Checkpoint { before: Some(c.wal_seq) },
                None => Start::Beginning,
            };
            let mut scan = reader.start(start).map_err(replay_failed)?;
            loop {
                if let Some(why) = self.stopped() {
                    return Err(why);
                }
                let mut batch = read::UnitsAfter::new(last, usize::MAX);
                let done = reader.next(&mut scan, REPLAY_BATCH, &mut batch).map_err(replay_failed)?;
                for unit in batch.out {
                    self.settle_replayed(&unit);
                    self.control(&unit)?;
                    last = Some(unit.cursor);
                }
                if done {
                    break;
                }
            }
        }
        self.replay_step()?;
        loop {
            if let Some(why) = self.stopped() {
                return Err(why);
            }
            // Read the bell before looking, so a publish after the look wakes the wait.
            let epoch = self.lanes.bell.epoch();
            // The loop publishes a step's display deltas before the units of the barrier that
            // ends it; draining the display ring first keeps that order for readers.
            let mut progressed = self.drain_display()?;
            loop {
                match self.lanes.control.get(self.at.control) {
                    Slot::Ready(unit) => {
                        self.at.control += 1;
                        progressed = true;
                        if last.is_none_or(|l| unit.cursor > l) {
                            self.control(&unit)?;
                            last = Some(unit.cursor);
                        }
                    }
                    Slot::NotYet => break,
                    // Overtaken: never a silent drop of control data; resubscribe from the cursor.
                    Slot::Overwritten { .. } => return Err(Some(lagged())),
                }
            }
            if !progressed {
                self.lanes.bell.wait(epoch, IDLE_WAIT);
            }
        }
    }

    /// A replayed unit that stored the step's message means the step is no longer in flight:
    /// its attach replay would only repeat the stored message.
    fn settle_replayed(&mut self, unit: &ControlUnit) {
        let stored = match &unit.event {
            Some(LiveEvent::MessageFinished(m)) => Some(m.mid.as_str()),
            _ => None,
        };
        if stored.is_some() && self.step.as_ref().and_then(|s| s.mid.as_deref()) == stored {
            self.step = None;
        }
    }

    /// The attach replay: `display_reset`, then one delta per part of the step in flight so
    /// far. Nothing when no step is in flight.
    fn replay_step(&mut self) -> Result<(), Option<Refusal>> {
        let Some(step) = self.step.take().filter(|s| s.mid.is_some()) else { return Ok(()) };
        self.send(json!({"kind": "display", "event": LiveEvent::DisplayReset}))?;
        for delta in &step.deltas {
            self.send(display_frame(delta))?;
        }
        Ok(())
    }

    /// Sends every display event published since the last look; returns whether there was any.
    fn drain_display(&mut self) -> Result<bool, Option<Refusal>> {
        let mut progressed = false;
        loop {
            match self.lanes.display.get(self.at.display) {
                Slot::Ready(event) => {
                    self.at.display += 1;
                    progressed = true;
                    self.display(&event)?;
                }
                Slot::NotYet => return Ok(progressed),
                Slot::Overwritten { missed, oldest } => {
                    self.dropped += missed;
                    self.at.display = oldest;
                    progressed = true;
                }
            }
        }
    }
}

/// A control frame: llm-runner's `kind`/`cursor`, broca's `unit`, and the role's typed
/// `event` when the unit has one.
pub fn control_frame(unit: &ControlUnit) -> Value {
    let mut frame = json!({"kind": "control", "cursor": unit.cursor, "unit": unit.unit.to_json()});
    // A status event while the run waits on held calls carries their list beside the unit, as
    // run.status does (llm-runner §7); omitted when none.
    if let Some(held) = unit.unit.held_calls() {
        frame["held_calls"] = json!(held);
    }
    if let Some(event) = &unit.event {
        frame["event"] = json!(event);
    }
    frame
}

/// A display frame (live only): the role's typed delta as `event`, its `part` the key the
/// stored message's display row gives that part (`p<index>`, `ops::history::row`). A status
/// line has no role equivalent, so it travels as broca's own `status` member, without an
/// `event`.
pub fn display_frame(d: &DisplayEvent) -> Value {
    let key = |part: &usize| format!("p{part}");
    let event = match d {
        DisplayEvent::TextDelta { mid, part, text, .. } => {
            LiveEvent::TextDelta(TextDelta::new("", text, mid, key(part)))
        }
        DisplayEvent::ReasoningDelta { mid, part, text, .. } => {
            LiveEvent::ReasoningDelta(TextDelta::new("", text, mid, key(part)))
        }
        DisplayEvent::ToolInputDelta { mid, part, tool_call_id, delta, .. } => {
            LiveEvent::ToolInputDelta(ToolInputDelta::new(tool_call_id, delta, mid, key(part)))
        }
        DisplayEvent::Status { text } => return json!({"kind": "display", "status": {"text": text}}),
    };
    json!({"kind": "display", "event": event})
}
