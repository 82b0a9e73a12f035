//! Fan-out (spec §6–§9, §16): many observers of one session, each with its own thread and
//! bounded lanes, so one slow subscriber never slows the run or the other subscribers.
//!
//! - **Control** lane: durable, replayable units addressed by `(wal_seq, sub_index)`. A
//!   subscriber is registered *before* it replays the WAL, so every unit published meanwhile is
//!   buffered; replay then reads what is durable and remembers the last cursor `R` it sent, and
//!   the live lane skips units at or before `R`. Units are published only after their fsync, so
//!   a unit is either in the replay or after `R`: no gap, no duplicate. A subscriber whose
//!   control lane fills is detached (its stream ends with `subscriber_lagged`) and resubscribes
//!   from its cursor — a control unit is never silently dropped.
//! - **Display** lane: live only, lossy. When it is full, deltas are counted as dropped and the
//!   reader gets one `display_gap {dropped}` before the next delivered display event.
//! - Every frame carries `seq`, from 1, rising by one per frame across both lanes.
//! - A terminal run does not end a stream: subscribers stay attached for later episodes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cortexkit_role_llm_runner::live::{DisplayGap, LiveEvent, TextDelta, ToolInputDelta};
use crossbeam_channel::{bounded, select, Receiver, Sender, TrySendError};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::agent::{DisplayEvent, Output};
use crate::lineage::projection::{self, ControlUnit, Cursor};
use crate::lineage::replay::Replay;
use crate::lineage::LineageError;
use crate::record::{Record, KNOWN_FEATURES};
use crate::session_key::SessionKey;
use crate::wal::ScannedFrame;
use crate::wire::Refusal;

/// Control units a subscriber may lag before it is detached.
pub const CONTROL_LANE: usize = 4096;
/// Display events buffered per subscriber before deltas are dropped.
pub const DISPLAY_LANE: usize = 1024;

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

struct Member {
    id: u64,
    control: Sender<ControlUnit>,
    display: Sender<DisplayEvent>,
    dropped: Arc<AtomicU64>,
    stop: Sender<Option<Refusal>>,
}

#[derive(Default)]
struct Topic {
    members: Vec<Member>,
}

/// All sessions' subscribers in this process.
#[derive(Default)]
pub struct Hub {
    topics: Mutex<HashMap<SessionKey, Topic>>,
    next_id: AtomicU64,
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

impl Hub {
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub::default())
    }

    /// Publishes a lineage's output: control units (already durable) and display events.
    pub fn publish(&self, key: &SessionKey, output: &Output) {
        let mut topics = self.topics.lock();
        let Some(topic) = topics.get_mut(key) else { return };
        let mut lagged = Vec::new();
        for m in &topic.members {
            match output {
                Output::Control(units) => {
                    for u in units {
                        if let Err(TrySendError::Full(_)) = m.control.try_send(u.clone()) {
                            lagged.push(m.id);
                            break;
                        }
                    }
                }
                Output::Display(d) => {
                    if m.display.try_send(d.clone()).is_err() {
                        m.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        for id in lagged {
            if let Some(pos) = topic.members.iter().position(|m| m.id == id) {
                let m = topic.members.remove(pos);
                let refusal = Refusal::new(
                    "subscriber_lagged",
                    "the subscriber fell too far behind the control stream; resubscribe from its last cursor",
                    Some(crate::detail!("class" => "transient")),
                );
                let _ = m.stop.send(Some(refusal));
            }
        }
    }

    fn remove(&self, key: &SessionKey, id: u64, why: Option<Refusal>) {
        let mut topics = self.topics.lock();
        if let Some(topic) = topics.get_mut(key) {
            if let Some(pos) = topic.members.iter().position(|m| m.id == id) {
                let m = topic.members.remove(pos);
                let _ = m.stop.send(why);
            }
            if topic.members.is_empty() {
                topics.remove(key);
            }
        }
    }

    /// Ends every subscription of a session (its streams end cleanly).
    pub fn cancel_all(&self, key: &SessionKey) {
        if let Some(topic) = self.topics.lock().remove(key) {
            for m in topic.members {
                let _ = m.stop.send(None);
            }
        }
    }

    /// Number of subscribers of a session.
    pub fn subscribers(&self, key: &SessionKey) -> usize {
        self.topics.lock().get(key).map_or(0, |t| t.members.len())
    }

    /// Attaches a subscriber to `key`'s session (WAL at `wal`) and starts its thread.
    pub fn attach(self: &Arc<Self>, key: &SessionKey, wal: PathBuf, from: From, sink: impl StreamSink) -> Subscription {
        let (control_tx, control_rx) = bounded(CONTROL_LANE);
        let (display_tx, display_rx) = bounded(DISPLAY_LANE);
        let (stop_tx, stop_rx) = bounded(1);
        let dropped = Arc::new(AtomicU64::new(0));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Registered before the replay reads the WAL: nothing published from here on is missed.
        self.topics.lock().entry(key.clone()).or_default().members.push(Member {
            id,
            control: control_tx,
            display: display_tx,
            dropped: Arc::clone(&dropped),
            stop: stop_tx,
        });
        // The attach barrier for `live`: the durable head is read after registration and
        // before this returns, so everything published later is delivered and nothing before.
        let from = match from {
            From::Live => match durable_head(&wal) {
                Ok(Some(head)) => From::After(head),
                Ok(None) => From::Start,
                Err(e) => {
                    log::warn!("live attach could not read the durable head: {e}");
                    From::Live
                }
            },
            other => other,
        };
        let lanes = Lanes { control: control_rx, display: display_rx, stop: stop_rx, dropped };
        let hub = Arc::clone(self);
        let key2 = key.clone();
        let spawned = std::thread::Builder::new().name("broca-fanout".into()).spawn(move || {
            let mut sink = sink;
            let outcome = Feeder { seq: 0, sink: &mut sink }.run(&wal, from, &lanes);
            hub.remove(&key2, id, None);
            sink.end(outcome.err());
        });
        if let Err(e) = spawned {
            log::error!("cannot start a subscriber thread: {e}");
            self.remove(key, id, None);
        }
        Subscription { hub: Arc::clone(self), key: key.clone(), id }
    }
}

struct Lanes {
    control: Receiver<ControlUnit>,
    display: Receiver<DisplayEvent>,
    stop: Receiver<Option<Refusal>>,
    dropped: Arc<AtomicU64>,
}

/// One subscriber's thread: replay, then the live lanes.
struct Feeder<'a, S: StreamSink> {
    seq: u64,
    sink: &'a mut S,
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

    /// One display event, preceded by a `display_gap` when deltas were dropped since the last.
    fn display(&mut self, event: DisplayEvent, lanes: &Lanes) -> Result<(), Option<Refusal>> {
        let dropped = lanes.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let gap = LiveEvent::DisplayGap(DisplayGap::new(dropped));
            self.send(json!({"kind": "display", "event": gap}))?;
        }
        self.send(display_frame(&event))
    }

    /// Returns `Ok` when the stream was stopped cleanly, `Err(refusal)` when it ends in error.
    fn run(&mut self, wal: &std::path::Path, from: From, lanes: &Lanes) -> Result<(), Refusal> {
        match self.feed(wal, from, lanes) {
            Ok(()) | Err(None) => Ok(()),
            Err(Some(r)) => Err(r),
        }
    }

    fn feed(&mut self, wal: &std::path::Path, from: From, lanes: &Lanes) -> Result<(), Option<Refusal>> {
        let replay_failed = |e: LineageError| {
            Some(Refusal::new("subscribe_replay_failed", format!("subscribe replay failed: {e}"), None))
        };
        // The last cursor sent (or, for `live`, the durable head at attach).
        let mut last: Option<Cursor> = match from {
            From::Start => None,
            From::After(c) => Some(c),
            From::Live => durable_head(wal).map_err(replay_failed)?,
        };
        if from != From::Live && wal.exists() {
            // One pass over the WAL, one record in memory at a time; the replay runs from the
            // start (units name message ordinals), frames before the cursor send nothing.
            let after = last;
            let mut stopped: Option<Option<Refusal>> = None;
            let mut replay = Replay::default();
            let scanned = crate::wal::read::<LineageError>(wal, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
                let rec = Record::decode(f.payload).map_err(|e| LineageError::Decode { seq: f.seq, reason: e.0 })?;
                for unit in projection::apply(&mut replay, f.seq, &rec, &mut drop)? {
                    if after.is_none_or(|a| unit.cursor > a) {
                        if let Err(e) = self.send(control_frame(&unit)) {
                            stopped = Some(e);
                            return Err(LineageError::Refused("the subscriber is gone".into()));
                        }
                        last = Some(unit.cursor);
                    }
                }
                Ok(())
            });
            if let Some(why) = stopped {
                return Err(why);
            }
            scanned.map_err(replay_failed)?;
        }
        loop {
            // The loop publishes a step's display deltas before the units of the barrier that
            // ends it; draining the (bounded) display lane first keeps that order for readers.
            while let Ok(event) = lanes.display.try_recv() {
                self.display(event, lanes)?;
            }
            select! {
                recv(lanes.control) -> unit => {
                    let Ok(unit) = unit else { return Err(None) };
                    if last.is_none_or(|l| unit.cursor > l) {
                        self.send(control_frame(&unit))?;
                        last = Some(unit.cursor);
                    }
                }
                recv(lanes.display) -> event => {
                    let Ok(event) = event else { return Err(None) };
                    self.display(event, lanes)?;
                }
                recv(lanes.stop) -> why => return Err(why.unwrap_or(None)),
            }
        }
    }
}

/// The last durable control unit of a WAL (the `live` attach point), in one pass that builds
/// no unit.
fn durable_head(wal: &std::path::Path) -> Result<Option<Cursor>, LineageError> {
    if !wal.exists() {
        return Ok(None);
    }
    let mut head = None;
    crate::wal::read::<LineageError>(wal, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        let rec = Record::decode(f.payload).map_err(|e| LineageError::Decode { seq: f.seq, reason: e.0 })?;
        let units = projection::unit_count(&rec);
        if units > 0 {
            head = Some(Cursor { wal_seq: f.seq, sub_index: units as u32 - 1 });
        }
        Ok(())
    })?;
    Ok(head)
}

/// A control frame: llm-runner's `kind`/`cursor`, broca's `unit`, and the role's typed
/// `event` when the unit has one.
pub fn control_frame(unit: &ControlUnit) -> Value {
    let mut frame = json!({"kind": "control", "cursor": unit.cursor, "unit": unit.unit});
    if let Some(event) = &unit.event {
        frame["event"] = json!(event);
    }
    frame
}

/// A display frame (live only): the role's typed delta as `event`. A status line has no role
/// equivalent, so it travels as broca's own `status` member, without an `event`.
pub fn display_frame(d: &DisplayEvent) -> Value {
    let event = match d {
        DisplayEvent::TextDelta { mid, part, text, .. } => {
            LiveEvent::TextDelta(TextDelta::new("", text, mid, part.to_string()))
        }
        DisplayEvent::ReasoningDelta { mid, part, text, .. } => {
            LiveEvent::ReasoningDelta(TextDelta::new("", text, mid, part.to_string()))
        }
        DisplayEvent::ToolInputDelta { mid, part, tool_call_id, delta, .. } => {
            LiveEvent::ToolInputDelta(ToolInputDelta::new(tool_call_id, delta, mid, part.to_string()))
        }
        DisplayEvent::Status { text } => return json!({"kind": "display", "status": {"text": text}}),
    };
    json!({"kind": "display", "event": event})
}
