//! `session.warm` through the real subc daemon (#28, spec §4a), on a harness of its own: the
//! scenario SIGKILLs broca, and the daemon's crash budget (three restarts in ten minutes) is
//! spent by `e2e_driver`'s own kills.

use broca_mock::mock;
mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{send_params, Harness};

const HARNESS: &str = "warm-e2e";

#[test]
fn warm_through_the_daemon() {
    let h = Harness::start();
    warm_then_send(&h);
    h.stop();
    let exit = h.last_exit().unwrap_or_else(|| panic!("no exit of broca in the journal: {:?}", h.journal()));
    assert_eq!(exit["exit_code"], 0, "{exit}\nbroca's log:\n{}", h.broca_log());
}

fn keyed(prompt: &str, send_id: &str) -> Value {
    let mut p = send_params(prompt);
    p["send_id"] = json!(send_id);
    p
}

/// `session.warm` through the daemon (#28, spec §4a): a refused warm writes nothing (another
/// lineage named; a second warm while one is at the provider); a warm re-sends the step's
/// request as a zero-output request and reads the prefix the step wrote; a SIGKILL right after
/// it leaves the transcript as it was (replay skips the record) and forgets the cache clock;
/// the next send within the lifetime reads the prefix on its first step.
fn warm_then_send(h: &Harness) {
    let s = h.session(HARNESS, "warmed", None);
    let answer = |text: &str| json!({"events": [{"text": text}, {"usage": {"measured": true, "output": 3}}, {"finish": "stop"}]});
    h.install_alone(json!({"responses": [answer("noted")]}));
    let mut params = keyed("remember the plan", "wm-1");
    params["model"] = json!({"provider": "anthropic", "model": "claude-sonnet-4-5"});
    params["system"] = json!("Keep the plan in mind and answer in one line. ".repeat(120));
    params["cache"] = json!({"role": "primary"});
    let first = s.ok("session.send", params.clone());
    assert_eq!(first["baseline"]["cache"]["warm"], "supported", "{first}");
    s.wait_run(first["run_id"].as_str().unwrap(), "completed");
    let wal = || std::fs::read(s.wal_path()).unwrap();

    let before = wal();
    assert_eq!(s.refused("session.warm", json!({"lineage_id": "not-this-one"})).0, "lineage_changed");
    assert_eq!(wal(), before, "a refused warm writes nothing");

    let warm = s.ok("session.warm", json!({}));
    assert!(warm["cache_read_tokens"].as_u64().unwrap() > 1000, "the step's prefix is read: {warm}");
    assert_eq!((warm["ttl_ms"].clone(), warm["expiry_basis"].clone()), (json!(3_600_000), json!("estimated")));
    let sent = h.mock.requests("default");
    assert_eq!(sent.last().unwrap().body_json().unwrap()["max_tokens"], 0);

    // One warm at a time: the second, while the first is at the provider, writes nothing.
    h.install(json!({"warms": [{"delay_ms": 3000}]}));
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| s.ok("session.warm", json!({})));
        let until = Instant::now() + Duration::from_secs(20);
        while h.mock.requests("default").len() < sent.len() + 1 {
            assert!(Instant::now() < until, "the first warm never reached the provider");
            std::thread::sleep(Duration::from_millis(10));
        }
        let before = wal();
        assert_eq!(s.refused("session.warm", json!({})).0, "warm_in_flight");
        assert_eq!(wal(), before, "a refused warm writes nothing");
        slow.join().unwrap();
    });

    let read = s.ok("session.read", json!({}));
    let old = h.kill_broca();
    h.wait_respawn(old);
    assert_eq!(s.ok("session.read", json!({})), read, "the warms are not in the transcript");
    let frames = std::cell::RefCell::new(Vec::new());
    broca::wal::read(&s.wal_path(), broca::record::KNOWN_FEATURES, None, &mut |f: broca::wal::ScannedFrame<'_>| {
        frames.borrow_mut().push(broca::record::Record::decode(f.payload).unwrap());
        Ok::<(), broca::lineage::LineageError>(())
    })
    .unwrap();
    let warmed = frames.borrow().iter().filter(|r| matches!(r, broca::record::Record::CacheWarmed(_))).count();
    assert_eq!(warmed, 2, "both warms are recorded");
    assert_eq!(s.refused("session.warm", json!({})).0, "cache_expired", "the clock died with the process");

    h.install(json!({"responses": [answer("on it")]}));
    params["prompt"] = json!("now carry it out");
    params["send_id"] = json!("wm-2");
    let next = s.ok("session.send", params)["run_id"].as_str().unwrap().to_owned();
    s.wait_run(&next, "completed");
    let usage = s.ok("run.result", json!({"run_id": next}))["usage"].clone();
    assert!(usage["cached_input_tokens"].as_u64().unwrap() > 1000, "its first step reads the prefix: {usage}");
}
