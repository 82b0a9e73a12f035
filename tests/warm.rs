//! `session.warm` in-process (spec §4a): the warm re-sends the session's last request as a
//! zero-output request, records `cache_warmed` (never a message), bills its own export fact and
//! restarts the cache clock; every refusal writes nothing and is pinned as a golden body. The
//! same warm runs through the real daemon in `e2e_driver`.

mod inproc;
use broca_mock::mock;
mod pin;

use std::sync::Arc;
use std::time::Duration;

use broca::clock::ManualClock;
use broca::record::Record;
use broca::wire::warm::{WarmRefusal, WarmUnsupported};
use inproc::{key, Rig};
use pin::assert_golden;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A system prompt long enough for the provider to cache (over 1,024 tokens).
fn long_system() -> String {
    "You are a careful assistant. Keep every answer short and exact. ".repeat(80)
}

/// A first-party Anthropic send (`anthropic/claude-sonnet-4-5`, routed to broca-mock), asking
/// for the hour-long tier.
fn anthropic(prompt: &str, send_id: &str) -> Value {
    json!({"prompt": prompt, "send_id": send_id, "system": long_system(), "cache": {"role": "primary"},
           "model": {"provider": "anthropic", "model": "claude-sonnet-4-5"}})
}

fn measured(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"measured": true, "output": 2}}, {"finish": "stop"}]})
}

/// One completed Anthropic turn; its run id.
fn turn(rig: &Rig, prompt: &str, send_id: &str) -> String {
    rig.script(json!({"responses": [measured("done")]}));
    let sent = rig.call("session.send", anthropic(prompt, send_id)).unwrap();
    let run_id = sent["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run_id, "completed");
    run_id
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn last_attempt_sha(rig: &Rig) -> String {
    let sha = rig.records().into_iter().rev().find_map(|r| match r {
        Record::ModelAttemptFinished(a) => a.request_body_sha256,
        _ => None,
    });
    sha.expect("an attempt recorded its request digest")
}

/// `(fact_id, run_id, warm, cached_input_tokens)` of every export fact.
fn facts(rig: &Rig) -> Vec<(String, String, i64, Option<i64>)> {
    rig.ops.registry.shared().settle();
    let db = rusqlite::Connection::open(rig.dir.path().join("run-index.db")).unwrap();
    let mut stmt =
        db.prepare("SELECT fact_id, run_id, warm, cached_input_tokens FROM export_facts ORDER BY export_seq").unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).unwrap();
    rows.map(Result::unwrap).collect()
}

#[test]
fn a_warm_re_sends_the_last_request_without_output_and_records_it_beside_the_transcript() {
    let rig = inproc::rig(Duration::from_secs(5));
    let run_id = turn(&rig, "hello", "w-1");
    let read_before = rig.call("session.read", json!({})).unwrap();
    let sent_before = rig.call("session.head", json!({})).unwrap()["cache"]["last_sent_at_ms"].as_u64().unwrap();
    let recorded = last_attempt_sha(&rig);

    let warm = rig.call("session.warm", json!({})).unwrap();
    let requests = rig.mock.requests("default");
    assert_eq!(requests.len(), 2, "one warm request");
    let (step, sent) = (requests[0].body_json().unwrap(), requests[1].body_json().unwrap());
    // The base is the step's exact request, changed only so nothing is generated.
    assert_eq!(warm["request_body_sha256"], recorded);
    assert_eq!(warm["request_body_sha256"], sha256(&requests[0].body));
    assert_eq!(warm["warm_body_sha256"], requests[1].body_sha256);
    assert_eq!(sent["max_tokens"], 0);
    assert!(sent.get("stream").is_none(), "{sent}");
    let mut expected = step.as_object().unwrap().clone();
    expected.insert("max_tokens".into(), json!(0));
    expected.shift_remove("stream");
    assert_eq!(sent, Value::Object(expected), "everything else is the step's");
    // The step wrote the prefix; the warm reads it.
    assert!(warm["cache_read_tokens"].as_u64().unwrap() > 1024, "{warm}");
    assert_eq!(warm["ttl_ms"], 3_600_000);
    assert_eq!(warm["expiry_basis"], "estimated");
    let expires = warm["expires_at_ms"].as_u64().unwrap();

    // The transcript is as it was; the record is there, informational.
    assert_eq!(rig.call("session.read", json!({})).unwrap(), read_before);
    let warmed = rig.records().into_iter().find_map(|r| match r {
        Record::CacheWarmed(w) => Some(w),
        _ => None,
    });
    let warmed = warmed.expect("a cache_warmed record");
    assert_eq!((warmed.run_id.as_str(), warmed.request_body_sha256.as_str()), (run_id.as_str(), recorded.as_str()));
    assert_eq!(warmed.expires_at_ms, Some(expires));
    assert!(warmed.ratelimit.contains_key("anthropic-ratelimit-unified-status"), "{:?}", warmed.ratelimit);
    // The clock restarted at the warm's send start.
    let cache = rig.call("session.head", json!({})).unwrap()["cache"].clone();
    assert!(cache["last_sent_at_ms"].as_u64().unwrap() >= sent_before, "{cache}");
    assert_eq!(cache["expires_at_ms"], expires);
    // Billed as its own fact under the run it re-sent; the run's own fact kept its id.
    let facts = facts(&rig);
    let warm_facts: Vec<_> = facts.iter().filter(|f| f.2 == 1).collect();
    assert_eq!(warm_facts.len(), 1, "{facts:?}");
    assert_eq!(warm_facts[0].1, run_id);
    assert!(warm_facts[0].0.contains(":warm:"), "{facts:?}");
    assert_eq!(warm_facts[0].3, warm["cache_read_tokens"].as_i64());
    assert_eq!(facts.iter().filter(|f| f.2 == 0).count(), 1, "the run's own fact");

    // The next turn reads the warmed prefix from its first step, and renders as before.
    let next = turn(&rig, "and again", "w-2");
    let status = rig.call("run.status", json!({"run_id": next})).unwrap();
    assert!(status["usage"]["cached_input_tokens"].as_u64().unwrap() > 1024, "{status}");
}

#[test]
fn a_reopened_session_rebuilds_its_last_request_to_the_recorded_digest() {
    let rig = inproc::rig(Duration::from_millis(100));
    turn(&rig, "hello", "r-1");
    // The actor closes when idle; the warm reopens the session and renders from the WAL.
    rig.wait_closed(&key());
    let warm = rig.call("session.warm", json!({})).unwrap();
    assert_eq!(warm["request_body_sha256"], sha256(&rig.mock.requests("default")[0].body));
}

#[test]
fn warm_refusals_write_nothing_and_are_pinned() {
    let rig = inproc::rig(Duration::from_secs(5));
    let refused = |rig: &Rig, params: Value, golden: &str| {
        let before = rig.footprint(&key());
        let e = rig.call("session.warm", params).unwrap_err();
        assert_eq!(e.detail.as_ref().and_then(|d| d.get("kind")).and_then(Value::as_str), Some(e.code.as_str()));
        assert_golden(golden, &e.to_json(), None);
        assert_eq!(before.diff(&rig.footprint(&key())), None, "{golden} wrote something");
        e
    };
    // Nothing sent yet: no WAL is created for the refusal.
    refused(&rig, json!({}), "warm_refusal.no_step_yet.json");
    assert!(!rig.ops.registry.shared().has_record(&key()));
    assert_eq!(rig.call("session.warm", json!({"nope": 1})).unwrap_err().code, "invalid_params");

    turn(&rig, "hello", "f-1");
    let head = rig.call("session.head", json!({})).unwrap();
    let named = json!({"lineage_id": head["lineage_id"], "history_version": head["history_version"]});
    assert!(rig.call("session.warm", named).is_ok(), "the session's own identity is no refusal");
    refused(&rig, json!({"lineage_id": "another"}), "warm_refusal.lineage_changed.json");

    // One warm at a time: a second while the first is at the provider.
    rig.script(json!({"warms": [{"delay_ms": 3000}]}));
    let first = {
        let ops = Arc::clone(&rig.ops);
        std::thread::spawn(move || {
            let (tx, rx) = crossbeam_channel::bounded(1);
            ops.handle(&key(), "session.warm", json!({}), Box::new(move |r| tx.send(r).unwrap()));
            rx.recv_timeout(Duration::from_secs(10)).unwrap()
        })
    };
    rig.wait_requests(3);
    refused(&rig, json!({}), "warm_refusal.warm_in_flight.json");
    assert!(first.join().unwrap().is_ok(), "the first warm finishes");

    // Sent, and refused by the provider: nothing recorded, billed or moved.
    rig.script(json!({"warms": [{"status": 529}]}));
    let e = refused(&rig, json!({}), "warm_failed.json");
    assert_eq!(e.detail.unwrap().get("class").unwrap(), "transient");
    assert_eq!(facts(&rig).iter().filter(|f| f.2 == 1).count(), 2, "two warms billed, not the refused one");

    // A paused run takes no warm.
    rig.script(json!({"responses": [{"status": 401}]}));
    let paused = rig.call("session.send", anthropic("needs auth", "f-2")).unwrap();
    rig.wait_state(paused["run_id"].as_str().unwrap(), "paused");
    refused(&rig, json!({}), "warm_refusal.run_paused.json");
}

#[test]
fn a_route_without_a_zero_output_request_is_warm_unsupported_and_says_so_in_its_baseline() {
    let rig = inproc::rig(Duration::from_secs(5));
    rig.script(json!({"responses": [inproc::reply_script("hi", 0)]}));
    let sent = rig.call("session.send", inproc::send("plain")).unwrap();
    assert_eq!(sent["baseline"]["cache"]["warm"], "unsupported");
    rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    let before = rig.footprint(&key());
    let e = rig.call("session.warm", json!({})).unwrap_err();
    assert_golden("warm_refusal.warm_unsupported.json", &e.to_json(), None);
    assert_eq!(before.diff(&rig.footprint(&key())), None);
    assert_eq!(rig.mock.requests("default").len(), 1, "nothing sent");

    let other = inproc::rig(Duration::from_secs(5));
    other.script(json!({"responses": [measured("done")]}));
    let sent = other.call("session.send", anthropic("hello", "u-1")).unwrap();
    assert_eq!(sent["baseline"]["cache"]["warm"], "supported", "{sent}");
}

#[test]
fn an_unknown_or_near_expiry_is_cache_expired() {
    let clock = Arc::new(ManualClock::now());
    let rig = inproc::clocked_rig(Duration::from_secs(5), clock.clone());
    turn(&rig, "hello", "e-1");
    assert!(rig.call("session.warm", json!({})).is_ok());
    // 4 s before the hour ends: a warm would land on an expired prefix.
    clock.advance(Duration::from_millis(3_600_000 - 4_000));
    let before = rig.footprint(&key());
    let e = rig.call("session.warm", json!({})).unwrap_err();
    assert_golden("warm_refusal.cache_expired.json", &e.to_json(), None);
    assert_eq!(before.diff(&rig.footprint(&key())), None);

    // After a restart the clock is unknown until the session sends again.
    let fresh = inproc::rig(Duration::from_millis(100));
    turn(&fresh, "hello", "e-2");
    fresh.wait_closed(&key());
    let restarted = inproc::ops_over(fresh.dir.path(), fresh.mock.base_url(None), Duration::from_secs(5));
    let (tx, rx) = crossbeam_channel::bounded(1);
    restarted.handle(&key(), "session.warm", json!({}), Box::new(move |r| tx.send(r).unwrap()));
    let e = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap_err();
    assert_eq!(e.code, "cache_expired");
    assert!(e.detail.unwrap().get("expires_at_ms").is_none(), "unknown");
}

/// The refusals no in-process session reaches here (an account's wall and a changed account
/// need a vault and an account-routing provider; an unrenderable prefix needs a WAL another
/// build wrote), pinned from their typed values.
#[test]
fn the_remaining_warm_refusals_are_pinned() {
    let cases = [
        (WarmRefusal::AccountWalled { resets_at_ms: None }, "warm_refusal.account_walled.json"),
        (WarmRefusal::AccountChanged { credential_id: "cred-anthropic".into() }, "warm_refusal.account_changed.json"),
        (
            WarmRefusal::PrefixUnavailable { request_body_sha256: Some("ab".repeat(32)) },
            "warm_refusal.warm_prefix_unavailable.json",
        ),
    ];
    for (refusal, golden) in cases {
        let served = refusal.refusal();
        assert_eq!(served.detail.as_ref().unwrap().get("kind").unwrap(), served.code.as_str());
        assert_golden(golden, &served.to_json(), None);
    }
    let unsupported =
        WarmRefusal::Unsupported { reason: WarmUnsupported::ManualThinking, provider: "anthropic".into() };
    assert_eq!(unsupported.refusal().detail.unwrap().get("reason").unwrap(), "manual_thinking");
}

/// A running run is never a refusal (W-5, W-7): while its step is at the provider, the warm
/// re-sends that step's exact bytes, is recorded mid-run and billed under that run, and the
/// run goes on to finish as it would have.
#[test]
fn a_warm_while_a_step_streams_re_sends_the_bytes_in_flight() {
    let rig = inproc::rig(Duration::from_secs(5));
    turn(&rig, "hello", "i-1");
    let slow = json!({"events": [{"text": "thinking it over"}, {"delay_ms": 1500}, {"usage": {"measured": true, "output": 2}},
                                 {"finish": "stop"}]});
    rig.script(json!({"responses": [slow]}));
    let sent = rig.call("session.send", anthropic("take your time", "i-2")).unwrap();
    let run_id = sent["run_id"].as_str().unwrap().to_owned();
    rig.wait_requests(2);
    let warm = rig.call("session.warm", json!({})).unwrap();
    let requests = rig.mock.requests("default");
    assert_eq!(warm["request_body_sha256"], requests[1].body_sha256, "the step's own bytes");
    assert_eq!(rig.call("run.status", json!({"run_id": run_id})).unwrap()["state"], "active");
    rig.wait_state(&run_id, "completed");
    let warmed = rig.records().into_iter().find_map(|r| match r {
        Record::CacheWarmed(w) => Some(w),
        _ => None,
    });
    assert_eq!(warmed.unwrap().run_id, run_id);
    let texts: Vec<Value> = rig.call("session.read", json!({})).unwrap()["messages"].as_array().unwrap().clone();
    assert_eq!(texts.len(), 4, "two turns, no warm message: {texts:?}");
}
