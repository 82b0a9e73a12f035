//! Durable before visible (DESIGN §2 rule 4, §7): readers of an open session stop at its
//! writer's published fsynced end, and a subscriber attached before an open receives the
//! orphan seal that open writes. Each test here failed before its fix.

use std::sync::Arc;
use std::time::Duration;

use broca::agent::Output;
use broca::fanout::{From, Hub, SinkError, StreamSink};
use broca::lineage::read;
use broca::lineage::reader::Reader;
use broca::lineage::Shared;
use broca::message::Message;
use broca::record::{Record, RequestIdentity};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wal::storage::crash::CrashStorage;
use broca::wire::Refusal;
use broca_testkit::*;
use crossbeam_channel::{unbounded, Receiver, Sender};
use serde_json::Value;

fn key() -> SessionKey {
    SessionKey::new("/work/proj", "durable", "s1")
}

struct Collect(Sender<Value>);

impl StreamSink for Collect {
    fn frame(&mut self, event: &Value) -> Result<(), SinkError> {
        self.0.send(event.clone()).map_err(|_| SinkError::Closed)
    }
    fn end(&mut self, _error: Option<Refusal>) {}
}

fn attach(hub: &Arc<Hub>, shared: &Arc<Shared>, from: From) -> Receiver<Value> {
    let (tx, rx) = unbounded();
    hub.attach(shared, &key(), from, Collect(tx));
    rx
}

/// Control unit types received within `wait`.
fn unit_types(rx: &Receiver<Value>, wait: Duration) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(f) = rx.recv_timeout(wait) {
        if f["kind"] == "control" {
            out.push(f["unit"]["type"].as_str().unwrap_or_default().to_string());
        }
    }
    out
}

fn queued(i: usize, bytes: usize) -> Record {
    let message = Message::user_text(format!("{i}:{}", "x".repeat(bytes)));
    Record::Queued { submission_id: format!("sub-{i}"), message, request: RequestIdentity::default() }
}

/// Frames the writer has written (past its 1 MiB pending bound) but not yet fsynced are seen by
/// no reader: not `session.read`'s transcript, not the control projection, not the `live` head.
/// A `live` subscriber attached meanwhile then receives those units once they are committed,
/// with no gap (before the fix it took its head from the unsynced frames and skipped them).
#[test]
fn written_but_unsynced_frames_are_invisible_to_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let storage = CrashStorage::new();
    let shared = Arc::new(Shared::open_with(StateRoot::at(dir.path()).unwrap(), Arc::new(storage.clone())).unwrap());
    let hub = Hub::new();
    let mut publisher = hub.publisher(&key());
    let mut l = shared.open_lineage(&key()).unwrap();
    l.append(&run_started("run-1", None, "hi")).unwrap();
    publisher.publish(Output::Control(l.commit().unwrap()));
    let head = l.head();
    let reader = Reader::open(&shared, &key()).unwrap();
    let before = read::control_units(&reader, None, usize::MAX).unwrap();

    for i in 0..4 {
        l.append(&queued(i, 300_000)).unwrap();
    }
    assert!(storage.unsynced_bytes(l.wal_path()) > 1 << 20, "the writer wrote frames it has not fsynced");
    assert_eq!(read::control_units(&reader, None, usize::MAX).unwrap(), before, "the projection");
    assert_eq!(read::durable_head(&shared, &key()).unwrap(), head, "the live head");
    let page = read::transcript(&reader, 0, 100).unwrap();
    assert_eq!(page.head, head, "session.read's head");
    assert!(page.state.queue.is_empty(), "session.read's queue: {:?}", page.state.queue.len());
    let live = attach(&hub, &shared, From::Live);
    let replayed = attach(&hub, &shared, From::Start);
    std::thread::sleep(Duration::from_millis(100));

    publisher.publish(Output::Control(l.commit().unwrap()));
    let queued_units = vec!["submission_queued".to_string(); 4];
    assert_eq!(unit_types(&live, Duration::from_millis(500)), queued_units, "live: every committed unit, once");
    let all = unit_types(&replayed, Duration::from_millis(500));
    assert_eq!(all.len(), before.len() + 4, "start: replay then live, no duplicate: {all:?}");
    assert_eq!(read::control_units(&reader, None, usize::MAX).unwrap().len(), before.len() + 4);
}

/// A subscriber attached to a closed session whose last run a previous process left open gets
/// that run's seal (`error` + `run_finished`) when the session's actor opens and seals it
/// (before the fix the open committed the seal and dropped its units).
#[test]
fn a_subscriber_attached_before_the_open_receives_the_orphan_seal() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap());
    {
        let mut l = shared.open_lineage(&key()).unwrap();
        l.append(&run_started("run-1", None, "hi")).unwrap();
        l.append(&step_started("run-1", 1)).unwrap();
        l.commit().unwrap();
        // Dropped unsealed: as a killed process leaves it.
    }
    shared.settle();
    drop(shared);
    let module = broca::module::ModuleBuilder::new(StateRoot::at(dir.path()).unwrap()).build().unwrap();
    let (hub, registry, shared) = (module.hub, module.registry, Arc::clone(module.ops.registry.shared()));
    let live = attach(&hub, &shared, From::Live);
    let from_start = attach(&hub, &shared, From::Start);
    std::thread::sleep(Duration::from_millis(100));
    registry.open(&key()).unwrap();
    assert_eq!(unit_types(&live, Duration::from_millis(500)), ["error", "run_finished"], "live");
    let all = unit_types(&from_start, Duration::from_millis(500));
    assert_eq!(all.iter().filter(|t| *t == "run_finished").count(), 1, "start: the seal once: {all:?}");
    assert_eq!(all.last().map(String::as_str), Some("run_finished"), "{all:?}");
    hub.cancel_all(&key());
}
