//! Whole-session retention in-process (llm-runner §9.1, `src/retention.rs`): the refusals of
//! `session.send.retention` (pinned goldens, nothing written), a retained session that expires
//! after its idle time (every read answers `expired` with its last activity plus retention,
//! its WAL and store rows are deleted, a later send starts a fresh record at a new history
//! version), a run that never expires while it is active, and a deletion a crash interrupted
//! after the tombstone, finished by the next open. The same expiry runs through the real
//! daemon in `e2e_driver` and in the published suite (`make conformance`).
//!
//! Held calls under retention (spec §19, `src/held/fence.rs`): an intake registration of the
//! session, a lost intake store on a root that used held intake, an unreadable one (counted in
//! the sweep's unreadable-session total) and the rebuild marker each keep an expired session
//! from being deleted; a send to it is refused (pinned) and writes nothing; once the fence
//! lifts, the deletion takes the lineage's registrations and receipts and leaves the module's
//! feed row. Through the real daemon, with a real provider holding calls, in `e2e_held`.

mod inproc;
use broca_mock::mock;
mod pin;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::clock::{Clock, ManualClock};
use broca::held::intake::{Intake, Registration, REBUILD_MARKER, REGISTERED_MARKER};
use broca::limits::RETENTION_MAX_SECONDS;
use broca::retention::Sweep;
use broca::session_key::SessionKey;
use cortexkit_role_tool_provider::late_results::IntakeKey;
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
fn wait_for(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
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
    // A root that never enabled held intake expires as before, and retention creates no
    // intake file (spec §19, H-36).
    for file in ["late-results.db", REGISTERED_MARKER, REBUILD_MARKER] {
        assert!(!rig.dir.path().join(file).exists(), "retention created {file}");
    }
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

/// A clocked rig holding one retained session (retention 1 s) whose run finished and whose
/// expiry has passed; its actor has closed, so only a sweep settles it.
fn expired_session() -> (Rig, Arc<ManualClock>) {
    let (rig, clock) = clocked();
    answers(&rig, "ok", 0);
    finish(&rig, &rig.call("session.send", retained("kept a second", Some(1))).unwrap());
    clock.advance(Duration::from_secs(2));
    rig.wait_closed(&key());
    (rig, clock)
}

fn sweep_once(rig: &Rig, clock: &ManualClock, sweep: &mut Sweep) -> usize {
    sweep.pass(&rig.ops.registry.shared().expiry(), clock.now_ms())
}

const TOOLS: &str = "mock-tools";

fn receipt(call_key: &str) -> IntakeKey {
    IntakeKey {
        provider: TOOLS.into(),
        custodian: "reserved:broca".into(),
        call_key: call_key.into(),
        event_id: format!("event-{call_key}"),
    }
}

#[test]
fn a_held_call_registration_fences_deletion_until_pruned_and_deletion_takes_the_lineage_s_intake_rows() {
    let (owned, clock) = expired_session();
    let rig = &owned;
    let lineage = key().addr();
    let intake = Intake::open(rig.dir.path(), false).unwrap();
    let call = format!("{lineage}:5");
    let reg = Registration {
        call_key: call.clone(),
        key: key(),
        run_id: "run-x".into(),
        tool_call_id: "c1".into(),
        module: TOOLS.into(),
    };
    intake.register(std::slice::from_ref(&reg), 1).unwrap();
    intake.receive(&receipt(&format!("{lineage}:3")), &lineage).unwrap();
    intake.set_cursor(TOOLS, Some(("incarnation-1", 7))).unwrap();
    let other = SessionKey::new("/tmp", "ops-test", "another").addr();
    intake.receive(&receipt(&format!("{other}:3")), &other).unwrap();

    // H-33: a registration of the session keeps its expired record.
    assert_eq!(sweep_once(rig, &clock, &mut Sweep::default()), 0);
    assert!(ephemeral_wal(rig).exists(), "an expired session with a registered held call was deleted");
    let e = rig.call("session.read", json!({})).unwrap_err();
    assert_eq!(e.code.as_str(), "expired", "reads answer expired all the same");
    // A send neither revives the expired record nor starts a fresh one over it.
    let wal = std::fs::read(ephemeral_wal(rig)).unwrap();
    let e = rig.call("session.send", inproc::send("revive it")).unwrap_err();
    assert_eq!(field(&e).0, "open_failed");
    assert_eq!((detail(&e, "reason"), detail(&e, "fence")), (json!("retention_fenced"), json!("held_call_registered")));
    assert_golden("send.retention_fenced.json", &e.to_json(), None);
    assert_eq!(std::fs::read(ephemeral_wal(rig)).unwrap(), wal, "the refused send wrote nothing");
    rig.wait_closed(&key());

    // The call's terminal is durable: its registration is pruned (H-24); now it may go, and its
    // deletion takes the lineage's registrations and receipts, never the module's feed (H-31).
    intake.prune(std::slice::from_ref(&call)).unwrap();
    assert_eq!(sweep_once(rig, &clock, &mut Sweep::default()), 1);
    assert!(!ephemeral_wal(rig).exists());
    assert!(!intake.received(&receipt(&format!("{lineage}:3"))).unwrap(), "the lineage's receipt stayed");
    assert_eq!(intake.lineages().unwrap(), vec![other.clone()], "only the other lineage's rows stay");
    assert_eq!(intake.cursor(TOOLS).unwrap(), Some(("incarnation-1".into(), 7)), "the feed row survives");
    assert!(intake.received(&receipt(&format!("{other}:3"))).unwrap());
    // A later send starts a fresh record.
    finish(rig, &rig.call("session.send", inproc::send("fresh")).unwrap());
    assert_eq!(rig.call("session.read", json!({})).unwrap()["history_version"], json!(2));
}

#[test]
fn a_lost_intake_store_or_the_rebuild_marker_fences_retention_on_a_root_that_used_held_intake() {
    // H-34: the store lost after registration history, or under a held feature floor; H-37:
    // the rebuild marker, whatever the store holds.
    for case in ["registered marker", "held feature floor", "rebuild marker"] {
        let (owned, clock) = expired_session();
        let (rig, root) = (&owned, owned.dir.path());
        match case {
            "registered marker" => std::fs::write(root.join(REGISTERED_MARKER), b"").unwrap(),
            "held feature floor" => rig.ops.registry.shared().floor.raise(&["provider-held/v1"]).unwrap(),
            _ => {
                drop(Intake::open(root, false).unwrap());
                std::fs::write(root.join(REBUILD_MARKER), b"").unwrap();
            }
        }
        let mut sweep = Sweep::default();
        assert_eq!(sweep_once(rig, &clock, &mut sweep), 0, "{case}");
        assert!(ephemeral_wal(rig).exists(), "{case}: the expired session was deleted");
        assert_eq!(sweep.unreadable_sessions(), 0, "{case}: nothing is unreadable");
        if case != "rebuild marker" {
            assert!(!root.join("late-results.db").exists(), "{case}: retention created the store");
        }
        let e = rig.call("session.send", inproc::send("revive it")).unwrap_err();
        let want = if case == "rebuild marker" {
            ("late_results_rebuild_required", "permanent")
        } else {
            ("late_results_missing", "transient")
        };
        assert_eq!((detail(&e, "fence"), detail(&e, "class")), (json!(want.0), json!(want.1)), "{case}");
    }
}

#[test]
fn an_unreadable_intake_store_fences_retention_and_counts_the_session_unreadable() {
    let (owned, clock) = expired_session();
    let (rig, root) = (&owned, owned.dir.path());
    std::fs::write(root.join("late-results.db"), b"this is not an SQLite database file, not at all").unwrap();
    // A retained WAL this build cannot read counts too (its expiry cannot be told).
    let junk = rig.dir.path().join("wal-ephemeral").join(format!("{}.wal", SessionKey::new("/j", "h", "s").addr()));
    std::fs::write(&junk, b"not a WAL").unwrap();
    let mut sweep = Sweep::default();
    assert_eq!(sweep_once(rig, &clock, &mut sweep), 0);
    assert!(ephemeral_wal(rig).exists(), "deleted under an unreadable intake store");
    assert_eq!(sweep.unreadable_sessions(), 2, "both sessions count in the unreadable-session total");
    std::fs::remove_file(&junk).unwrap();
    sweep_once(rig, &clock, &mut sweep);
    assert_eq!(sweep.unreadable_sessions(), 1, "the session kept by the unreadable store still counts");
    // Gone, on a root with no other trace of held intake: ordinary expiry again (H-36), and the
    // total falls back (the fenced session is tried again after its recheck interval).
    std::fs::remove_file(root.join("late-results.db")).unwrap();
    wait_for(Duration::from_secs(5), "deletion", || {
        sweep_once(rig, &clock, &mut sweep);
        !ephemeral_wal(rig).exists()
    });
    assert_eq!(sweep.unreadable_sessions(), 0);
}
