//! Session owners through the real daemon with two attested stamps (`broca::owner`, spec §4,
//! llm-runner 0.8.0 §6.2/§9/§10): `broca-mock relay` modules the daemon launches call broca
//! under their own principals (`reserved:owner-a`, `reserved:owner-b`), and the test process
//! itself is the daemon's `direct` caller.
//!
//! - the first send's attested caller is recorded as the owner in `RunStarted`, and every later
//!   episode carries it;
//! - a stranger's `session.send`, `run.cancel`, `session.retract` and `session.baseline` are
//!   refused `scope_owner_mismatch` (goldens), before their params are read, and write nothing;
//! - `direct` is never an owner: on an owned session it is refused too, and a session it starts
//!   records no owner and stays unrestricted;
//! - a session recorded before owners were stamped (a golden WAL's records) admits any caller;
//! - `session.head.sender` reports the caller's own grant.
//!
//! One test, because stopping the in-process daemon means SIGTERM to this process.

use broca_mock::mock;
mod pin;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use broca::lineage::reader::{Reader, Sink, Start};
use broca::record::{Record, KNOWN_FEATURES};
use broca::wal::{self, FileStorage, ScannedFrame, Wal, WalError, WalOpen};
use serde_json::{json, Value};
use support::{send_params, Harness, Options, Session, STEP};

const A: &str = "owner-a";
const B: &str = "owner-b";

use support::{relay_call as via, relay_ok as ok};

/// The refusal of a stranger's call, checked as `scope_owner_mismatch` naming the caller.
fn mismatch(h: &Harness, relay: &str, s: &Session, method: &str, params: Value) -> Value {
    let (code, body) = match via(h, relay, s, method, params) {
        Ok(v) => panic!("{relay}'s {method} was admitted: {v}"),
        Err(e) => e,
    };
    assert_eq!(code, "scope_owner_mismatch", "{relay} {method}: {body}");
    assert_eq!(body["detail"]["principal"], format!("reserved:{relay}"), "{body}");
    body
}

fn wait_run(h: &Harness, relay: &str, s: &Session, run_id: &str, state: &str) -> Value {
    let until = Instant::now() + STEP;
    loop {
        let status = ok(h, relay, s, "run.status", json!({"run_id": run_id}));
        if status["state"] == state {
            return status;
        }
        assert!(Instant::now() < until, "{run_id} never reached {state}: {status}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// The `owner` member of every `RunStarted` in the session's WAL, in order.
fn recorded_owners(path: &Path) -> Vec<Value> {
    struct Owners(Vec<Value>);
    impl Sink for Owners {
        fn record(&mut self, _seq: u64, record: &Record) -> bool {
            if let Record::RunStarted(r) = record {
                self.0.push(serde_json::to_value(&r.owner).unwrap());
            }
            true
        }
    }
    let mut owners = Owners(Vec::new());
    Reader::file(path).scan(Start::Beginning, &mut owners).expect("the WAL reads");
    owners.0
}

/// `health.check`'s per-op counters.
fn counted(h: &Harness) -> Value {
    let health = h.block_on(h.client().consumer().supervisor_health_probe(support::MODULE_ID)).unwrap();
    health.metrics.expect("health metrics")["management_ops"].clone()
}

fn wal_len(s: &Session) -> u64 {
    std::fs::metadata(s.wal_path()).map_or(0, |m| m.len())
}

fn slow(text: &str, ms: u64) -> Value {
    json!({"events": [{"delay_ms": ms}, {"text": text}, {"usage": {"input": 3, "output": 1}}, {"finish": "stop"}]})
}

fn reply(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 3, "output": 1}}, {"finish": "stop"}]})
}

/// A stranger is refused every owner-only op, before its params are read, and writes nothing;
/// the owner is admitted on the same session.
fn strangers_are_refused(h: &Harness) {
    let s = h.session("owners", "owned", None);
    h.install(json!({"responses": [reply("first"), slow("held", 30_000)]}));
    let first = ok(h, A, &s, "session.send", send_params("hello"));
    let run1 = first["run_id"].as_str().unwrap().to_owned();
    wait_run(h, A, &s, &run1, "completed");
    assert_eq!(recorded_owners(&s.wal_path()), vec![json!({"principal": "reserved:owner-a"})]);

    // A run going (held far longer than the checks below take on a loaded machine; the owner
    // cancels it), a send queued behind it: everything a stranger could touch.
    let requests_before = h.mock.requests("default").len();
    let second = ok(h, A, &s, "session.send", send_params("slowly"));
    let run2 = second["run_id"].as_str().unwrap().to_owned();
    let queued = ok(h, A, &s, "session.send", send_params("after it"));
    assert_eq!(queued["state"], "pending", "{queued}");
    let submission = queued["submission_id"].as_str().unwrap().to_owned();
    // The slow run's step records are durable before its request reaches the model: measure
    // the WAL once the request arrived, so only a refused call could move it (on a loaded
    // machine the step's first record can land after the send's answer).
    let until = Instant::now() + STEP;
    while h.mock.requests("default").len() <= requests_before {
        assert!(Instant::now() < until, "the slow run's request never reached the model");
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = wal_len(&s);
    let counted_before = counted(h);

    let body = mismatch(h, B, &s, "run.cancel", json!({"run_id": run2}));
    pin::assert_golden("scope_owner_mismatch.run_cancel.json", &body.to_string(), None);
    let body = mismatch(h, B, &s, "session.retract", json!({"session": "owned", "submission_id": submission}));
    pin::assert_golden("scope_owner_mismatch.session_retract.json", &body.to_string(), None);
    let body = mismatch(h, B, &s, "session.baseline", json!({}));
    pin::assert_golden("scope_owner_mismatch.session_baseline.json", &body.to_string(), None);
    let body = mismatch(h, B, &s, "session.warm", json!({}));
    pin::assert_golden("scope_owner_mismatch.session_warm.json", &body.to_string(), None);
    let body = mismatch(h, B, &s, "session.send", json!({"prompt": "mine now", "delivery": "interrupt"}));
    pin::assert_golden("scope_owner_mismatch.session_send.json", &body.to_string(), None);
    // Authorization before validation: a stranger's malformed request is still not the owner's.
    mismatch(h, B, &s, "run.cancel", json!({"run_id": 7, "at": "later", "bogus": true}));
    mismatch(h, B, &s, "session.retract", json!({"nonsense": 1}));
    mismatch(h, B, &s, "session.baseline", json!({"unknown": 1}));
    mismatch(h, B, &s, "session.send", json!({"prompt": 5}));
    // The owner's malformed request reaches validation.
    let (code, body) = via(h, A, &s, "run.cancel", json!({"run_id": run2, "at": "later"})).unwrap_err();
    assert_eq!((code.as_str(), &body["detail"]["field"]), ("invalid_params", &json!("at")), "{body}");
    // `direct` is never an owner.
    let (code, body) = s.refused("run.cancel", json!({"run_id": run2}));
    assert_eq!((code.as_str(), &body["detail"]["principal"]), ("scope_owner_mismatch", &json!("direct")), "{body}");
    assert_eq!(wal_len(&s), before, "refused calls wrote nothing");
    // Authorization refusals are not counted (spec §4); the owner's invalid one is.
    let counted_after = counted(h);
    for op in ["session.baseline", "session.retract", "session.send", "session.warm"] {
        assert_eq!(counted_after[op], counted_before[op], "{op}: {counted_after}");
    }
    assert_eq!(counted_after["run.cancel"], counted_before["run.cancel"].as_u64().unwrap() + 1, "{counted_after}");
    let status = ok(h, A, &s, "run.status", json!({"run_id": run2}));
    assert_eq!(status["state"], "active", "the stranger's cancel left the run going: {status}");

    // The owner retracts and cancels; its baseline is ready.
    let retracted = ok(h, A, &s, "session.retract", json!({"session": "owned", "submission_id": submission}));
    assert_eq!(retracted["retracted"], true, "{retracted}");
    assert_eq!(ok(h, A, &s, "run.cancel", json!({"run_id": run2})), json!("ack"));
    wait_run(h, A, &s, &run2, "cancelled");
    assert_eq!(ok(h, A, &s, "session.baseline", json!({}))["state"], "ready");
    let owner = json!({"principal": "reserved:owner-a"});
    assert_eq!(recorded_owners(&s.wal_path()), vec![owner.clone(), owner], "every episode keeps the owner");

    // head.sender: the owner's full grant; the stranger and `direct` have none.
    let grant = ok(h, A, &s, "session.head", json!({}))["sender"].clone();
    assert_eq!(grant, json!({"modes": ["tool_result", "steer", "idle_start"], "interrupt": true, "owner": true}));
    assert!(ok(h, B, &s, "session.head", json!({})).get("sender").is_none(), "a stranger has no grant");
    assert!(s.ok("session.head", json!({})).get("sender").is_none(), "direct has no grant");
    // A session nobody wrote yet: the caller's next send would make it the owner.
    let fresh = h.session("owners", "fresh", None);
    assert_eq!(ok(h, B, &fresh, "session.head", json!({}))["sender"], grant);
    assert_eq!(ok(h, B, &fresh, "session.baseline", json!({}))["state"], "not_yet");
}

/// A session `direct` starts records no owner, and stays unrestricted: any caller is admitted as
/// its owner (spec §4: direct sessions keep their admission).
fn direct_sessions_stay_unrestricted(h: &Harness) {
    let s = h.session("owners", "direct-started", None);
    h.install(json!({"responses": [slow("held", 30_000)]}));
    let run = s.send("hello")["run_id"].as_str().unwrap().to_owned();
    assert_eq!(recorded_owners(&s.wal_path()), vec![Value::Null], "direct is never recorded as the owner");
    let grant = ok(h, B, &s, "session.head", json!({}))["sender"].clone();
    assert_eq!(grant["owner"], true, "{grant}");
    assert_eq!(ok(h, B, &s, "run.cancel", json!({"run_id": run})), json!("ack"));
    wait_run(h, A, &s, &run, "cancelled");
    assert_eq!(ok(h, A, &s, "session.baseline", json!({}))["state"], "ready");
}

/// A WAL written before owners were stamped: its records, as the golden WAL holds them, under a
/// session of this rig. Any attested caller drives it, and its next episode records no owner.
fn legacy_sessions_stay_unrestricted(h: &Harness) {
    let s = h.session("owners", "legacy", None);
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/wal/queue_steer_cancel.wal");
    let mut payloads = Vec::new();
    wal::read::<WalError>(&golden, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        payloads.push(f.payload.to_vec());
        Ok(())
    })
    .unwrap();
    let path = s.wal_path();
    wal::create(&FileStorage, &path, s.key().lineage_id()).unwrap();
    let opts = WalOpen { known_features: KNOWN_FEATURES, resume_at: None, epoch: 1, floor: None, truncate_to: None };
    let mut writer = Wal::open::<WalError>(&FileStorage, &path, opts, &mut |_| Ok(())).unwrap();
    for payload in &payloads {
        let record = Record::decode(payload).unwrap();
        assert!(!matches!(writer.append(&record.features(), payload, false), wal::RecordOutcome::Refused(_)));
    }
    writer.sync().unwrap();
    drop(writer);
    let old = recorded_owners(&path);
    assert!(old.len() >= 2 && old.iter().all(Value::is_null), "the golden WAL has no owners: {old:?}");

    for relay in [A, B] {
        let grant = ok(h, relay, &s, "session.head", json!({}))["sender"].clone();
        assert_eq!(grant["owner"], true, "{relay} on a legacy session: {grant}");
        assert_eq!(ok(h, relay, &s, "session.baseline", json!({}))["state"], "ready");
    }
    h.install(json!({"responses": [reply("legacy answer")]}));
    let run = ok(h, B, &s, "session.send", send_params("still mine to drive"))["run_id"].as_str().unwrap().to_owned();
    wait_run(h, A, &s, &run, "completed");
    let now = recorded_owners(&path);
    assert_eq!(now.len(), old.len() + 1);
    assert!(now.iter().all(Value::is_null), "a legacy session never gains an owner: {now:?}");
    assert_eq!(ok(h, A, &s, "run.cancel", json!({"run_id": run})), json!("not_active"));
}

#[test]
fn owners_through_the_daemon() {
    let mock = broca_mock::exe();
    let relay = |id: &str| {
        let entry = json!({"program": mock, "args": ["relay"], "env": {"CK_LOG": "info"},
                           "enabled": true, "reserved": true});
        (id.to_owned(), entry)
    };
    let h = Harness::start_with(Options { modules: vec![relay(A), relay(B)], ..Options::default() });
    support::wait_modules_ready(&h, &[A, B]);
    let checks: [support::Check; 3] = [
        ("strangers are refused", strangers_are_refused),
        ("direct sessions stay unrestricted", direct_sessions_stay_unrestricted),
        ("legacy sessions stay unrestricted", legacy_sessions_stay_unrestricted),
    ];
    support::run_checks(h, &checks);
}
