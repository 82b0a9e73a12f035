//! The operator-tunable bounds of `broca.jsonc` `limits` (README "Limits"), crossed through the
//! real daemon: each refusal is typed, names its limit, is pinned as a golden body, and writes
//! nothing; below the bound everything is served as before.

use broca_mock::mock;
mod pin;
mod support;

use serde_json::{json, Value};
use subc_client_rs::SubscriptionEnd;
use support::{send_params, Harness, Options, MODULE_ID};

const HARNESS: &str = "limits-e2e";

/// A reply that keeps its run active for a while (two paced deltas).
fn slow(text: &str, ms: u64) -> Value {
    json!({"events": [{"text": text}, {"delay_ms": ms}, {"text": "."}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

fn open_sessions(h: &Harness) -> u64 {
    let health = h.block_on(h.client().consumer().supervisor_health_probe(MODULE_ID)).unwrap();
    health.metrics.expect("health metrics")["open_sessions"].as_u64().expect("open_sessions is reported")
}

#[test]
fn limits_refuse_typed_and_write_nothing() {
    let config = json!({"limits": {"queued_sends_per_session": 2, "open_sessions": 2,
                                   "subscribers_per_session": 1, "subscribers_per_process": 2}});
    let h = Harness::start_with(Options { prefix: "blim".into(), broca_jsonc: Some(config), ..Options::default() });

    // Queued sends: one run active, two sends queued behind it, the third refused.
    let busy = h.session(HARNESS, "queue", None);
    h.install(json!({"responses": [slow("one", 1500), slow("two", 10), slow("three", 10)]}));
    let first = busy.send("first");
    assert_eq!(first["state"], "active", "{first}");
    let mut queued_runs = Vec::new();
    for prompt in ["second", "third"] {
        let queued = busy.send(prompt);
        assert_eq!(queued["state"], "pending", "{queued}");
        // A queued send's run is run-<submission id> (spec §4, broca extension).
        queued_runs.push(format!("run-{}", queued["submission_id"].as_str().unwrap()));
    }
    let before = std::fs::read(busy.wal_path()).unwrap();
    let (code, body) = busy.refused("session.send", send_params("fourth"));
    assert_eq!(code, "session_queue_full", "{body}");
    assert_eq!(body["detail"]["limit"], 2, "{body}");
    pin::assert_golden("send.session_queue_full.json", &body.to_string(), None);
    // The active run may append its own progress meanwhile (its first delta can land late on a
    // loaded machine); the refused send adds nothing of its own.
    let after = std::fs::read(busy.wal_path()).unwrap();
    assert!(after.starts_with(&before), "the WAL only grew");
    let tail = String::from_utf8_lossy(&after[before.len()..]);
    assert!(!tail.contains("fourth"), "a refused send writes nothing: {tail}");
    // The queue drains, in order.
    busy.wait_run(first["run_id"].as_str().unwrap(), "completed");
    for run in &queued_runs {
        busy.wait_run(run, "completed");
    }

    // Subscribers: one per session, two in the process.
    let mut a = busy.subscribe(json!("start"));
    // Attached once its replay delivers (subscriptions attach on op workers, in any order).
    assert!(a.next().is_some());
    let mut second = busy.subscribe(json!("start"));
    while second.next().is_some() {}
    match second.ended() {
        SubscriptionEnd::Error(body) => {
            assert_eq!(body.code, "too_many_subscribers", "{body:?}");
            let detail = body.detail.clone().unwrap();
            assert_eq!((detail["limit"].as_u64(), detail["scope"].as_str()), (Some(1), Some("session")));
            pin::assert_golden("subscribe.too_many_subscribers.json", &serde_json::to_string(&body).unwrap(), None);
        }
        other => panic!("expected too_many_subscribers, got {other:?}"),
    }
    assert!(a.next().is_some(), "the first subscriber is still served");

    // Open sessions: `queue` is open (it has an observer); one more opens, the next is refused.
    let other = h.session(HARNESS, "other", None);
    h.install(json!({"responses": [slow("ok", 10), slow("never", 10)]}));
    other.wait_run(other.send("hello")["run_id"].as_str().unwrap(), "completed");
    let mut b = other.subscribe(json!("start"));
    assert!(b.next().is_some());
    assert_eq!(open_sessions(&h), 2);
    let third = h.session(HARNESS, "third", None);
    let (code, body) = third.refused("session.send", send_params("hello"));
    assert_eq!(code, "too_many_sessions", "{body}");
    assert_eq!(body["detail"]["limit"], 2, "{body}");
    pin::assert_golden("send.too_many_sessions.json", &body.to_string(), None);
    assert!(!third.wal_path().exists(), "a refused open writes nothing");
    assert_eq!(open_sessions(&h), 2, "a refused open counts nothing");

    // The process bound: two subscribers are attached, a third session's subscription is
    // refused naming the process scope.
    let mut c = third.subscribe(json!("start"));
    while c.next().is_some() {}
    match c.ended() {
        SubscriptionEnd::Error(body) => {
            assert_eq!(body.code, "too_many_subscribers", "{body:?}");
            assert_eq!(body.detail.unwrap()["scope"], "process");
        }
        other => panic!("expected too_many_subscribers, got {other:?}"),
    }
    a.unsubscribe();
    b.unsubscribe();

    // A resume cursor past the durable head names nothing broca ever published: refused by
    // name, with the head; the head itself attaches (nothing after it yet).
    let head = busy.ok("session.read", json!({}))["head"].clone();
    let (seq, sub) = (head["wal_seq"].as_u64().expect("a head cursor"), head["sub_index"].as_u64().unwrap());
    let mut ahead = busy.subscribe(json!({"wal_seq": seq + 5, "sub_index": 0}));
    while ahead.next().is_some() {}
    match ahead.ended() {
        SubscriptionEnd::Error(body) => {
            assert_eq!(body.code, "invalid_params", "{body:?}");
            let detail = body.detail.clone().unwrap();
            assert_eq!((detail["field"].as_str(), &detail["head"]), (Some("from"), &head), "{detail}");
            pin::assert_golden("subscribe.cursor_beyond_head.json", &serde_json::to_string(&body).unwrap(), None);
        }
        other => panic!("expected invalid_params, got {other:?}"),
    }
    let mut at_head = busy.subscribe(json!({"wal_seq": seq, "sub_index": sub}));
    assert!(at_head.next_within(std::time::Duration::from_millis(300)).is_err(), "nothing after the head yet");
    at_head.unsubscribe();
    h.stop();
}
