//! Fan-out in-process: observers attached from `start`, from a cursor and `live` see the same
//! durable control stream with no gap and no duplicate, frames are numbered from 1, a terminal
//! does not end a stream, and a subscriber that never reads slows nothing down.

use broca_mock::mock;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::catalog::Catalog;
use broca::fanout::{From, Hub, SinkError, StreamSink};
use broca::lineage::projection::Cursor;
use broca::module::ModuleBuilder;
use broca::ops::Ops;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use mock::{MockServer, Script};
use serde_json::{json, Value};

struct Rig {
    _dir: tempfile::TempDir,
    mock: MockServer,
    ops: Arc<Ops>,
    hub: Arc<Hub>,
}

fn rig() -> Rig {
    rig_with_ttl(Duration::from_secs(5))
}

fn rig_with_ttl(idle_ttl: Duration) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0").unwrap();
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let module = ModuleBuilder::new(StateRoot::at(dir.path()).unwrap())
        .catalog(Catalog::load_lkg(&lkg))
        .base_url_override(Some(mock.base_url(None)))
        .idle_ttl(idle_ttl)
        .build()
        .unwrap();
    Rig { _dir: dir, mock, ops: module.ops, hub: module.hub }
}

fn key() -> SessionKey {
    SessionKey::new("/tmp", "fanout-test", "s1")
}

/// A sink that forwards frames to the test.
struct Collect(Sender<Result<Value, Option<Refusal>>>);

impl StreamSink for Collect {
    fn frame(&mut self, event: &Value) -> Result<(), SinkError> {
        self.0.send(Ok(event.clone())).map_err(|_| SinkError::Closed)
    }
    fn end(&mut self, error: Option<Refusal>) {
        let _ = self.0.send(Err(error));
    }
}

/// A sink that never returns from its first frame until released: a reader that stopped.
struct Stalled(Receiver<()>);

impl StreamSink for Stalled {
    fn frame(&mut self, _event: &Value) -> Result<(), SinkError> {
        let _ = self.0.recv_timeout(Duration::from_secs(30));
        Err(SinkError::Closed)
    }
    fn end(&mut self, _error: Option<Refusal>) {}
}

impl Rig {
    fn send(&self, prompt: &str) -> Value {
        let (tx, rx) = bounded(1);
        let params = json!({"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}});
        self.ops.handle(&key(), "session.send", params, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap()
    }

    fn attach(&self, from: From) -> Receiver<Result<Value, Option<Refusal>>> {
        let (tx, rx) = unbounded();
        self.hub.attach(self.ops.registry.shared(), &key(), from, Collect(tx));
        rx
    }
}

/// Control frames until (and including) the `run_finished` of `run_id`.
fn until_finished(rx: &Receiver<Result<Value, Option<Refusal>>>, run_id: &str, seen: &mut Vec<Value>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let frame =
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("a frame").expect("open");
        let done = frame["unit"]["type"] == "run_finished" && frame["unit"]["run_id"] == json!(run_id);
        seen.push(frame);
        if done {
            return;
        }
    }
}

fn control(frames: &[Value]) -> Vec<(Value, Value)> {
    frames.iter().filter(|f| f["kind"] == "control").map(|f| (f["cursor"].clone(), f["unit"].clone())).collect()
}

fn script(rig: &Rig, texts: &[&str]) {
    let responses: Vec<Value> = texts
        .iter()
        .map(
            |t| json!({"events": [{"delay_ms": 30}, {"text": t}, {"delay_ms": 30}, {"text": "!"}, {"finish": "stop"}]}),
        )
        .collect();
    rig.mock.install("default", Script::from_json(&json!({"responses": responses}).to_string()).unwrap());
}

#[test]
fn observers_see_one_durable_stream_and_stay_attached_across_episodes() {
    let rig = rig();
    script(&rig, &["first", "second"]);
    let a = rig.attach(From::Start);
    let b = rig.attach(From::Start);
    let run1 = rig.send("one")["run_id"].as_str().unwrap().to_string();
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    until_finished(&a, &run1, &mut fa);
    until_finished(&b, &run1, &mut fb);
    assert_eq!(control(&fa), control(&fb), "both observers see the same control stream");
    assert!(fa.iter().any(|f| f["kind"] == "display" && f["event"]["delta"] == "first"), "display lane is live");
    let seqs: Vec<u64> = fa.iter().map(|f| f["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "seq from 1 with no jumps");
    // A terminal run does not end the stream: the next episode arrives on the same one.
    let run2 = rig.send("two")["run_id"].as_str().unwrap().to_string();
    until_finished(&a, &run2, &mut fa);
    let cursors: Vec<Cursor> = control(&fa).iter().map(|(c, _)| serde_json::from_value(c.clone()).unwrap()).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "cursors strictly increase");
    // A late observer from `start` replays the same durable history.
    let late = rig.attach(From::Start);
    let mut fl = Vec::new();
    until_finished(&late, &run2, &mut fl);
    assert_eq!(control(&fl), control(&fa));
    // Resubscribing from a cursor continues strictly after it: no gap, no duplicate.
    let mid: Cursor = serde_json::from_value(control(&fa)[3].0.clone()).unwrap();
    let resumed = rig.attach(From::After(mid));
    let mut fr = Vec::new();
    until_finished(&resumed, &run2, &mut fr);
    assert_eq!(control(&fr), control(&fa)[4..].to_vec());
}

#[test]
fn live_attaches_after_the_head_and_a_stalled_reader_slows_nothing() {
    let rig = rig();
    script(&rig, &["first", "second"]);
    let run1 = rig.send("one")["run_id"].as_str().unwrap().to_string();
    let watcher = rig.attach(From::Start);
    until_finished(&watcher, &run1, &mut Vec::new());
    let live = rig.attach(From::Live);
    let (_release, stall) = unbounded();
    rig.hub.attach(rig.ops.registry.shared(), &key(), From::Start, Stalled(stall));
    let run2 = rig.send("two")["run_id"].as_str().unwrap().to_string();
    let mut fl = Vec::new();
    until_finished(&live, &run2, &mut fl);
    let units = control(&fl);
    assert_eq!(units[0].1["type"], "submission_queued", "live starts with the next send");
    assert!(units.iter().all(|(_, u)| u["run_id"] != json!(run1)), "live replays no history");
    assert!(units.iter().any(|(_, u)| u["type"] == "run_started" && u["run_id"] == json!(run2)));
    assert_eq!(rig.hub.subscribers(&key()), 3);
}

#[test]
fn an_observed_session_keeps_its_actor_and_lease() {
    let rig = rig_with_ttl(Duration::from_millis(100));
    script(&rig, &["first"]);
    let rx = rig.attach(From::Start);
    let run1 = rig.send("one")["run_id"].as_str().unwrap().to_string();
    until_finished(&rx, &run1, &mut Vec::new());
    std::thread::sleep(Duration::from_millis(400));
    assert!(rig.ops.registry.is_open(&key()), "observed: the actor keeps the lease past its idle TTL");
    assert!(rig.ops.registry.shared().open_lineage(&key()).is_err(), "no second writer meanwhile");
    rig.hub.cancel_all(&key());
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.is_open(&key()) {
        assert!(Instant::now() < deadline, "unobserved, the actor closes after its TTL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every frame `rx` delivers until it is quiet for `quiet`.
fn until_quiet(rx: &Receiver<Result<Value, Option<Refusal>>>, quiet: Duration) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Ok(frame) = rx.recv_timeout(quiet) {
        frames.push(frame.expect("the stream stays open"));
    }
    frames
}

/// The display frames of `frames`: `(type, mid, part, delta)` of each event.
fn display(frames: &[Value]) -> Vec<(String, String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    frames
        .iter()
        .filter(|f| f["kind"] == "display")
        .map(|f| {
            let e = &f["event"];
            (text(&e["type"]), text(&e["mid"]), text(&e["part"]), text(&e["delta"]))
        })
        .collect()
}

fn seqs_from_one(frames: &[Value]) -> bool {
    let seqs: Vec<u64> = frames.iter().map(|f| f["seq"].as_u64().unwrap()).collect();
    seqs == (1..=seqs.len() as u64).collect::<Vec<_>>()
}

/// A subscriber attaching while a step streams gets `display_reset`, then one coalesced delta
/// per part so far with the `mid` the answer is stored under, then the live deltas — from
/// `live` and, after the durable replay, from `start`, `seq` rising across both lanes. With no
/// step in flight there is nothing to replay.
#[test]
fn an_attach_mid_step_replays_the_step_so_far() {
    let rig = rig();
    let events = json!([
        {"reasoning": "think"}, {"delay_ms": 20}, {"reasoning": "ing"},
        {"text": "Hello "}, {"delay_ms": 20}, {"text": "world"},
        {"delay_ms": 3000}, {"text": "!"}, {"finish": "stop"}
    ]);
    rig.mock.install("default", Script::from_json(&json!({"responses": [{"events": events}]}).to_string()).unwrap());
    let run = rig.send("one")["run_id"].as_str().unwrap().to_string();
    let so_far = vec![
        ("display_reset".to_owned(), String::new(), String::new(), String::new()),
        ("reasoning_delta".to_owned(), "m2".to_owned(), "p0".to_owned(), "thinking".to_owned()),
        ("text_delta".to_owned(), "m2".to_owned(), "p1".to_owned(), "Hello world".to_owned()),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    let live = loop {
        let rx = rig.attach(From::Live);
        let frames = until_quiet(&rx, Duration::from_millis(150));
        if display(&frames) == so_far {
            assert!(seqs_from_one(&frames), "seq from 1: {frames:?}");
            break rx;
        }
        rig.hub.cancel_all(&key());
        assert!(Instant::now() < deadline, "no attach replayed the step so far; the last got {frames:?}");
    };
    let start = rig.attach(From::Start);
    let frames = until_quiet(&start, Duration::from_millis(150));
    let first_display = frames.iter().position(|f| f["kind"] == "display").expect("the step's replay");
    assert!(frames[..first_display].iter().all(|f| f["kind"] == "control"), "the durable replay comes first");
    assert!(frames[..first_display].iter().any(|f| f["event"]["type"] == "message_finished"), "m1 is replayed");
    assert_eq!(display(&frames), so_far);
    assert!(seqs_from_one(&frames), "seq rises across both lanes: {frames:?}");
    // The live deltas follow the replay; the answer is stored as the mid the replay named.
    let mut rest = Vec::new();
    until_finished(&live, &run, &mut rest);
    assert!(display(&rest).iter().any(|(t, mid, _, d)| t == "text_delta" && mid == "m2" && d == "!"));
    let stored = rest.iter().find(|f| f["unit"]["type"] == "assistant_message").expect("the answer");
    assert_eq!((&stored["unit"]["mid"], &stored["event"]["type"]), (&json!("m2"), &json!("message_finished")));
    // No step in flight: a new subscriber gets no display frame at all.
    let idle = until_quiet(&rig.attach(From::Start), Duration::from_millis(300));
    assert!(display(&idle).is_empty(), "{idle:?}");
}
