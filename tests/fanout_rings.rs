//! The fan-out rings under an overtaken reader: a display reader that falls more than the
//! display ring behind gets one `display_gap` counting exactly the deltas it missed; a control
//! reader that falls more than the control ring behind is detached with `subscriber_lagged`
//! (to resubscribe from its cursor), never silently skipped ahead.

use std::sync::Arc;
use std::time::Duration;

use broca::agent::{DisplayEvent, Output};
use broca::fanout::{From, Hub, Publisher, SinkError, StreamSink, CONTROL_LANE, DISPLAY_LANE};
use broca::lineage::projection::{ControlUnit, Cursor, Unit};
use broca::lineage::Shared;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use serde_json::Value;

fn key() -> SessionKey {
    SessionKey::new("/work/proj", "rings", "s1")
}

/// Holds its first frame until released (saying when it holds), then forwards everything.
struct Gate {
    release: Receiver<()>,
    holding: Sender<()>,
    held: bool,
    out: Sender<Result<Value, Option<Refusal>>>,
}

impl StreamSink for Gate {
    fn frame(&mut self, event: &Value) -> Result<(), SinkError> {
        if !self.held {
            self.held = true;
            let _ = self.holding.send(());
            let _ = self.release.recv_timeout(Duration::from_secs(20));
        }
        self.out.send(Ok(event.clone())).map_err(|_| SinkError::Closed)
    }
    fn end(&mut self, error: Option<Refusal>) {
        let _ = self.out.send(Err(error));
    }
}

/// A session with its publisher and one `live` subscriber held at its first frame.
struct Gated {
    _dir: tempfile::TempDir,
    hub: Arc<Hub>,
    publisher: Publisher,
    release: Sender<()>,
    /// Signalled once the subscriber holds its first frame.
    holding: Receiver<()>,
    frames: Receiver<Result<Value, Option<Refusal>>>,
}

fn gated() -> Gated {
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap());
    let hub = Hub::new();
    let publisher = hub.publisher(&key());
    let (release, gate) = bounded(1);
    let (out, frames) = unbounded();
    let (holding_tx, holding) = bounded(1);
    hub.attach(&shared, &key(), From::Live, Gate { release: gate, holding: holding_tx, held: false, out });
    std::thread::sleep(Duration::from_millis(100));
    Gated { _dir: dir, hub, publisher, release, holding, frames }
}

fn delta(i: usize) -> Output {
    Output::Display(DisplayEvent::TextDelta { step: 1, mid: "m1".into(), part: 0, text: format!("d{i}") })
}

fn unit(seq: u64) -> ControlUnit {
    ControlUnit {
        cursor: Cursor { wal_seq: seq, sub_index: 0 },
        unit: Unit::StepStarted { run_id: "r".into(), step: seq },
        event: None,
    }
}

#[test]
fn an_overtaken_display_reader_gets_one_exact_display_gap() {
    let Gated { _dir, hub, mut publisher, release: release_tx, holding, frames } = gated();
    let total = DISPLAY_LANE * 3;
    // The first delta reaches the subscriber, which holds it; the rest overtake it.
    publisher.publish(delta(0));
    holding.recv_timeout(Duration::from_secs(10)).expect("the subscriber holds its first frame");
    for i in 1..total {
        publisher.publish(delta(i));
    }
    std::thread::sleep(Duration::from_millis(50));
    release_tx.send(()).unwrap();
    let mut texts = Vec::new();
    let mut gaps = Vec::new();
    while let Ok(Ok(f)) = frames.recv_timeout(Duration::from_millis(500)) {
        match f["event"]["type"].as_str() {
            Some("display_gap") => gaps.push(f["event"]["dropped"].as_u64().unwrap()),
            _ => texts.push(f["event"]["delta"].as_str().or(f["event"]["text"].as_str()).unwrap_or("").to_string()),
        }
    }
    assert_eq!(gaps.len(), 1, "one gap: {gaps:?}");
    assert_eq!(texts.len() as u64 + gaps[0], total as u64, "delivered + dropped = published");
    assert_eq!(texts.last().map(String::as_str), Some(format!("d{}", total - 1).as_str()), "the newest kept");
    hub.cancel_all(&key());
}

#[test]
fn an_overtaken_control_reader_is_detached_lagged_never_skipped_ahead() {
    let Gated { _dir, hub: _hub, mut publisher, release: release_tx, holding, frames } = gated();
    let total = CONTROL_LANE as u64 * 2;
    // The first unit reaches the subscriber, which holds it; the rest overtake it (publishing
    // them all at once could overtake it before it took any, and deliver nothing).
    publisher.publish(Output::Control(vec![unit(1)]));
    holding.recv_timeout(Duration::from_secs(10)).expect("the subscriber holds its first unit");
    for seq in 2..=total {
        publisher.publish(Output::Control(vec![unit(seq)]));
    }
    release_tx.send(()).unwrap();
    let mut cursors = Vec::new();
    let end = loop {
        match frames.recv_timeout(Duration::from_secs(5)).expect("the stream ends") {
            Ok(f) => cursors.push(f["cursor"]["wal_seq"].as_u64().unwrap()),
            Err(end) => break end,
        }
    };
    assert_eq!(end.map(|r| r.code.as_str()), Some("subscriber_lagged"));
    assert!(!cursors.is_empty() && (cursors.len() as u64) < total, "{} delivered", cursors.len());
    assert!(cursors.windows(2).all(|w| w[1] == w[0] + 1), "delivered units are contiguous: no skip ahead");
}
