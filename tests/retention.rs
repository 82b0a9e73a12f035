//! Whole-session retention in-process (llm-runner §9.1, `src/retention.rs`): the refusals of
//! `session.send.retention` (pinned goldens, nothing written), a retained session that expires
//! after its idle time (every read answers `expired` with its last activity plus retention,
//! its WAL and store rows are deleted, a later send starts a fresh record at a new history
//! version), a run that never expires while it is active, and a deletion a crash interrupted
//! after the tombstone, finished by the next open. The same expiry runs through the real
//! daemon in `e2e_driver` and in the published suite (`make conformance`).

mod inproc;
use broca_mock::mock;
mod pin;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::clock::{Clock, ManualClock};
use broca::limits::RETENTION_MAX_SECONDS;
use inproc::{key, reply_script, Rig};
use pin::assert_golden;
use serde_json::{json, Value};

fn retained(prompt: &str, retention: Option<u64>) -> Value {
    let mut send = inproc::send(prompt);
    if let Some(seconds) = retention {
        send["retention"] = json!(seconds);
    }
    send
}

fn ephemeral_wal(rig: &Rig) -> PathBuf {
    rig.dir.path().join("wal-ephemeral").join(format!("{}.wal", key().addr()))
}

/// Rows of the session in `run-index.db` (lineage checkpoint, transcript, runs, sends).
fn store_rows(rig: &Rig) -> i64 {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(rig.dir.path().join("run-index.db"), flags).unwrap();
    ["lineages", "transcript", "runs", "sends"]
        .iter()
        .map(|t| {
            let sql = format!("SELECT count(*) FROM {t} WHERE lineage = ?1");
            conn.query_row(&sql, [key().addr()], |r| r.get::<_, i64>(0)).unwrap()
        })
        .sum()
}

/// Scripts every model request of the rig to answer `text` after `delay_ms`.
fn answers(rig: &Rig, text: &str, delay_ms: u64) {
    rig.script(json!({"responses": vec![reply_script(text, delay_ms); 8]}));
}

fn finish(rig: &Rig, reply: &Value) {
    rig.wait_state(reply["run_id"].as_str().unwrap(), "completed");
}

/// `detail[name]` of a refusal.
fn detail(e: &broca::wire::Refusal, name: &str) -> Value {
    e.detail.as_ref().and_then(|d| d.get(name).cloned()).unwrap_or(Value::Null)
}

fn field(e: &broca::wire::Refusal) -> (String, Option<Value>) {
    (e.code.to_string(), e.detail.as_ref().and_then(|d| d.get("field").cloned()))
}

#[test]
fn retention_refusals_name_retention_and_write_nothing() {
    let owned = inproc::rig(Duration::from_secs(5));
    let rig = &owned;
    // Zero, a non-number and a value above the maximum: refused before anything is written.
    let e = rig.call("session.send", retained("zero", Some(0))).unwrap_err();
    assert_eq!(field(&e), ("invalid_params".into(), Some(json!("retention"))));
    assert_golden("send.retention_zero.json", &e.to_json(), None);
    let mut text = retained("text", None);
    text["retention"] = json!("1h");
    assert_eq!(
        field(&rig.call("session.send", text).unwrap_err()),
        ("invalid_params".into(), Some(json!("retention")))
    );
    let e = rig.call("session.send", retained("above", Some(RETENTION_MAX_SECONDS + 1))).unwrap_err();
    assert_eq!(field(&e), ("invalid_params".into(), Some(json!("retention"))));
    assert_eq!(detail(&e, "max_seconds"), json!(RETENTION_MAX_SECONDS));
    assert_golden("send.retention_above_max.json", &e.to_json(), None);
    assert!(!rig.dir.path().join("wal-ephemeral").read_dir().unwrap().any(|_| true), "nothing was written");

    // A session first sent with 60 s may shorten it, never lengthen it.
    answers(rig, "ok", 0);
    finish(rig, &rig.call("session.send", retained("first", Some(60))).unwrap());
    assert!(ephemeral_wal(rig).is_file(), "a retained session lives in wal-ephemeral/");
    let head = rig.call("session.head", json!({})).unwrap();
    let e = rig.call("session.send", retained("longer", Some(61))).unwrap_err();
    assert_eq!(field(&e), ("invalid_params".into(), Some(json!("retention"))));
    assert_golden("send.retention_lengthen.json", &e.to_json(), None);
    assert_eq!(rig.call("session.head", json!({})).unwrap(), head, "a refused send wrote nothing");
    finish(rig, &rig.call("session.send", retained("shorter", Some(30))).unwrap());
    finish(rig, &rig.call("session.send", retained("kept", None)).unwrap());

    // A session first sent without retention is kept forever: a later retention is refused.
    let other = inproc::rig(Duration::from_secs(5));
    answers(&other, "ok", 0);
    finish(&other, &other.call("session.send", retained("forever", None)).unwrap());
    let e = other.call("session.send", retained("late", Some(60))).unwrap_err();
    assert_eq!(field(&e), ("invalid_params".into(), Some(json!("retention"))));
    assert_golden("send.retention_late_opt_in.json", &e.to_json(), None);
}

/// Waits until `done` holds, for at most `within`.
fn wait_for(within: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A rig on a clock the test moves (no test here waits for retention to pass in real time).
fn clocked() -> (Rig, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::now());
    (inproc::clocked_rig(Duration::from_secs(30), clock.clone()), clock)
}

#[test]
fn an_idle_retained_session_expires_is_deleted_and_a_later_send_starts_fresh() {
    let (owned, clock) = clocked();
    let rig = &owned;
    rig.ops.registry.start_retention_sweep().unwrap();
    answers(rig, "ok", 0);
    let reply = rig.call("session.send", retained("secret-prompt", Some(1))).unwrap();
    let run_id = reply["run_id"].as_str().unwrap().to_owned();
    finish(rig, &reply);
    let head = rig.call("session.head", json!({})).unwrap();
    let updated_at = head["updated_at"].as_u64().expect("a retained head has its last activity");
    assert_eq!(head["history_version"], json!(1));
    // Reads do not extend it; its open actor closes at expiry, the sweep deletes it.
    let expired_at = updated_at + 1000;
    clock.advance(Duration::from_millis(999));
    assert!(rig.call("session.head", json!({})).is_ok(), "a millisecond before its expiry it lives");
    clock.advance(Duration::from_millis(1));
    wait_for(Duration::from_secs(5), "deletion", || !ephemeral_wal(rig).exists());
    assert_eq!(store_rows(rig), 0, "the store rows went with the WAL");
    for (method, params) in [
        ("session.read", json!({})),
        ("session.head", json!({})),
        ("run.result", json!({"run_id": run_id})),
        ("run.status", json!({"run_id": run_id})),
        ("session.baseline", json!({})),
    ] {
        let e = rig.call(method, params).unwrap_err();
        assert_eq!(e.code.as_str(), "expired", "{method}");
        assert_eq!(detail(&e, "expired_at_ms"), json!(expired_at), "{method}");
    }
    let e = rig.call("session.read", json!({})).unwrap_err();
    assert_golden("read.expired.json", &e.to_json(), None);
    // A later send starts a fresh record (kept forever, in wal/) at the next history version.
    finish(rig, &rig.call("session.send", inproc::send("fresh")).unwrap());
    let page = rig.call("session.read", json!({})).unwrap();
    assert_eq!(page["history_version"], json!(2));
    assert_ne!(page["incarnation"], head["incarnation"]);
    assert!(!page.to_string().contains("secret-prompt"), "expired content came back: {page}");
    let e = rig.call("session.read", json!({"history_version": 1, "after_mid": "m1"})).unwrap_err();
    assert_eq!(e.code.as_str(), "history_changed");
    clock.advance(Duration::from_secs(3600));
    assert!(rig.call("session.head", json!({})).is_ok(), "the fresh record inherited no retention");
}

#[test]
fn an_active_run_never_expires() {
    let (owned, clock) = clocked();
    let rig = &owned;
    rig.ops.registry.start_retention_sweep().unwrap();
    answers(rig, "slow", 600);
    let reply = rig.call("session.send", retained("long", Some(1))).unwrap();
    // An hour passes while the model answers: a sweep at that time leaves the run alone.
    clock.advance(Duration::from_secs(3600));
    let shared = rig.ops.registry.shared();
    assert_eq!(broca::retention::Sweep::default().pass(&shared.expiry(), clock.now_ms()), 0);
    assert!(ephemeral_wal(rig).exists(), "a session with an active run expired");
    assert!(rig.call("session.head", json!({})).is_ok());
    finish(rig, &reply);
    let head = rig.call("session.head", json!({})).unwrap();
    let updated_at = head["updated_at"].as_u64().unwrap();
    clock.advance(Duration::from_secs(1));
    wait_for(Duration::from_secs(5), "deletion", || !ephemeral_wal(rig).exists());
    let e = rig.call("session.head", json!({})).unwrap_err();
    assert_eq!(detail(&e, "expired_at_ms"), json!(updated_at + 1000), "the clock restarts at the terminal");
}

#[test]
fn a_deletion_cut_after_its_tombstone_is_finished_by_the_next_open() {
    let clock = Arc::new(ManualClock::now());
    let owned = inproc::clocked_rig(Duration::from_millis(50), clock.clone());
    let rig = &owned;
    answers(rig, "ok", 0);
    finish(rig, &rig.call("session.send", retained("cut", Some(1))).unwrap());
    let head = rig.call("session.head", json!({})).unwrap();
    let incarnation = head["incarnation"].as_str().unwrap().to_owned();
    // No sweep runs here: what a crash right after the tombstone leaves behind.
    clock.advance(Duration::from_millis(1100));
    let tombstone = rig.dir.path().join("wal-ephemeral").join(format!("{}.tombstone", key().addr()));
    let expired_at = head["updated_at"].as_u64().unwrap() + 1000;
    let body = json!({"expired_at_ms": expired_at, "incarnation": incarnation, "generation": 1});
    std::fs::write(&tombstone, body.to_string()).unwrap();
    let e = rig.call("session.read", json!({})).unwrap_err();
    assert_eq!((e.code.as_str(), detail(&e, "expired_at_ms")), ("expired", json!(expired_at)));
    assert!(ephemeral_wal(rig).exists(), "only the tombstone is durable so far");
    // The next open (a send) finishes the deletion first, then starts a fresh record.
    finish(rig, &rig.call("session.send", inproc::send("after")).unwrap());
    assert!(!ephemeral_wal(rig).exists());
    let page = rig.call("session.read", json!({})).unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 2, "only the fresh record: {page}");
    assert!(!page.to_string().contains("\"cut\""));
}
