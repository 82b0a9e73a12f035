//! Moving sessions between state roots (`broca::moves`, DESIGN §8), in process: two module
//! cores over two roots stand for two hosts (the daemon-level proof is `tests/federation.rs`).
//! Reads after a move equal reads before it byte for byte, the source refuses sends by name,
//! an archive adopts once and only where it continues what the host holds, a busy session
//! drains first, and every refusal is pinned.

mod inproc;
use broca_mock::mock;
mod pin;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use broca::moves;
use broca::ops::{Ops, Route};
use broca::owner::Caller;
use broca::session_key::SessionKey;
use broca::wire::Refusal;
use inproc::{key, ops_over, reply_script, send, Rig};
use serde_json::{json, Value};

/// A second host: its own state root, the same provider.
struct Host {
    dir: tempfile::TempDir,
    ops: Arc<Ops>,
}

fn host(rig: &Rig) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let ops = ops_over(dir.path(), rig.mock.base_url(None), Duration::from_millis(300));
    Host { dir, ops }
}

fn call(ops: &Arc<Ops>, method: &str, params: Value) -> Result<Value, Refusal> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    ops.handle(&key(), method, params, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).expect("an answer")
}

fn move_op(ops: &Ops, caller: Caller, method: &str, params: Value) -> Result<Value, Refusal> {
    moves::serve(ops, &Route { key: key(), scoped: false, caller }, method, &params)
}

fn direct() -> Caller {
    Caller::direct()
}

/// Everything a reader sees of the session, as served bytes.
fn reads(ops: &Arc<Ops>, run_id: &str) -> Vec<String> {
    ["session.read", "session.history", "run.status", "run.result"]
        .iter()
        .map(|m| {
            let params = match *m {
                "run.status" | "run.result" => json!({"run_id": run_id}),
                _ => json!({}),
            };
            call(ops, m, params).map(|v| v.to_string()).unwrap_or_else(|r| r.to_json())
        })
        .collect()
}

fn finished_run(rig: &Rig, ops: &Arc<Ops>, prompt: &str) -> String {
    let sent = call(ops, "session.send", send(prompt)).unwrap();
    let run = sent["run_id"].as_str().unwrap().to_owned();
    inproc::wait_until("the run completes", || {
        call(ops, "run.status", json!({"run_id": run})).is_ok_and(|s| s["state"] == "completed")
    });
    let _ = rig;
    run
}

fn archive_path(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

#[test]
fn a_session_moves_and_back_with_identical_reads_and_one_writer_at_a_time() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("one", 0), reply_script("two", 0), reply_script("three", 0)]}));
    let b = host(&rig);
    let run1 = finished_run(&rig, &rig.ops, "first");
    let before = reads(&rig.ops, &run1);
    let tmp = tempfile::tempdir().unwrap();
    let to = archive_path(tmp.path(), "s.archive");

    let exported = move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": to})).unwrap();
    assert_eq!(exported["session_ref"], key().addr());
    // The source keeps its reads and refuses sends by name.
    assert_eq!(reads(&rig.ops, &run1), before, "the tombstone is invisible to reads");
    let refused = call(&rig.ops, "session.send", send("late")).unwrap_err();
    pin::assert_golden("session_send.session_moved.json", &refused.to_json(), None);
    assert_eq!(move_op(&rig.ops, direct(), moves::LOCATE, json!({})).unwrap()["state"], "moved");
    // An export repeated after a crash answers from the tombstone, and the archive is the same.
    let first_bytes = std::fs::read(&to).unwrap();
    let again = move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": to})).unwrap();
    assert_eq!(again, exported);
    assert_eq!(std::fs::read(&to).unwrap(), first_bytes);

    let adopted = move_op(&b.ops, direct(), moves::ADOPT, json!({"from": to})).unwrap();
    assert_eq!(adopted["adopted"], true);
    assert!(adopted["epoch"].as_u64().unwrap() > exported["epoch"].as_u64().unwrap(), "{adopted} {exported}");
    assert_eq!(reads(&b.ops, &run1), before, "the adopted copy reads as the source did");
    assert_eq!(move_op(&b.ops, direct(), moves::ADOPT, json!({"from": to})).unwrap()["adopted"], false);
    assert_eq!(move_op(&b.ops, direct(), moves::LOCATE, json!({})).unwrap()["state"], "live");

    // B writes; then the session goes back to A, which replaces its tombstoned copy.
    let run2 = finished_run(&rig, &b.ops, "second");
    let on_b = reads(&b.ops, &run2);
    let back = archive_path(tmp.path(), "back.archive");
    move_op(&b.ops, direct(), moves::EXPORT, json!({"to": back})).unwrap();
    // The first archive is older than what A would now hold: refused once A adopts the newer.
    let home = move_op(&rig.ops, direct(), moves::ADOPT, json!({"from": back})).unwrap();
    assert_eq!(home["adopted"], true);
    assert_eq!(reads(&rig.ops, &run2), on_b);
    let stale = move_op(&rig.ops, direct(), moves::ADOPT, json!({"from": to})).unwrap_err();
    pin::assert_golden("session_adopt.session_exists.json", &stale.to_json(), None);
    // A's copy takes sends again; B's refuses them.
    finished_run(&rig, &rig.ops, "third");
    assert_eq!(call(&b.ops, "session.send", send("fork")).unwrap_err().code, "session_moved");
    let _ = (&b.dir, &rig.dir);
}

#[test]
fn a_busy_session_drains_before_it_moves() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("slow", 1500), reply_script("next", 0)]}));
    let sent = call(&rig.ops, "session.send", send("slow")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let to = archive_path(tmp.path(), "busy.archive");
    let busy = move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": to})).unwrap_err();
    pin::assert_golden("session_export.session_busy.json", &busy.to_json(), None);
    // The fence keeps new sends out while the run finishes.
    assert_eq!(call(&rig.ops, "session.send", send("meanwhile")).unwrap_err().code, "session_busy");
    let run = sent["run_id"].as_str().unwrap().to_owned();
    inproc::wait_until("the slow run completes", || {
        call(&rig.ops, "run.status", json!({"run_id": run})).is_ok_and(|s| s["state"] == "completed")
    });
    move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": to})).unwrap();
    assert!(!Path::new(&to).with_file_name(".busy.archive.partial").exists(), "no partial archive is left");
}

#[test]
fn move_ops_refuse_strangers_bad_archives_and_unknown_sessions_writing_nothing() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("one", 0)]}));
    let tmp = tempfile::tempdir().unwrap();
    let to = archive_path(tmp.path(), "s.archive");
    let missing = move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": to})).unwrap_err();
    pin::assert_golden("session_export.session_not_found.json", &missing.to_json(), None);
    // A session an attested module owns: another module, or its own id relayed from another
    // machine, may not move it.
    let owner = Caller::local("reserved:lead", None, None);
    let sent = {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let route = Route { key: key(), scoped: false, caller: owner.clone() };
        rig.ops.handle_on(&route, "session.send", send("owned"), Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap()
    };
    rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    let before = rig.footprint(&key());
    let stranger = move_op(&rig.ops, Caller::local("reserved:other", None, None), moves::EXPORT, json!({"to": to}));
    pin::assert_golden("session_export.not_authorized.json", &stranger.unwrap_err().to_json(), None);
    let relayed = Caller { machine: Some("ab".into()), via: Some("reserved:callosum".into()), ..owner.clone() };
    assert_eq!(move_op(&rig.ops, relayed, moves::EXPORT, json!({"to": to})).unwrap_err().code, "not_authorized");
    let relative = move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": "rel/path"})).unwrap_err();
    assert_eq!(
        relative.to_json(),
        r#"{"code":"invalid_params","message":"invalid params: to: must be an absolute path","detail":{"field":"to"}}"#
    );
    assert_eq!(rig.footprint(&key()).diff(&before), None, "refused exports wrote nothing");
    assert!(!Path::new(&to).exists());

    // The owner may move it; a flipped byte in the archive is refused at adopt.
    move_op(&rig.ops, owner.clone(), moves::EXPORT, json!({"to": to})).unwrap();
    let b = host(&rig);
    let mut bytes = std::fs::read(&to).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    let bad = archive_path(tmp.path(), "bad.archive");
    std::fs::write(&bad, &bytes).unwrap();
    let refused = move_op(&b.ops, direct(), moves::ADOPT, json!({"from": bad})).unwrap_err();
    pin::assert_golden("session_adopt.archive_invalid.json", &refused.to_json(), None);
    let elsewhere = SessionKey::new("/tmp", "ops-test", "another");
    let wrong = moves::serve(
        &b.ops,
        &Route { key: elsewhere, scoped: false, caller: direct() },
        moves::ADOPT,
        &json!({"from": to}),
    );
    assert_eq!(wrong.unwrap_err().code, "invalid_params");
    assert!(std::fs::read_dir(b.dir.path().join("wal")).unwrap().next().is_none(), "no WAL and no staged file");
    // The archive's owner, on its own machine, may adopt it.
    move_op(&b.ops, owner, moves::ADOPT, json!({"from": to})).unwrap();
}

/// Spec §15: a session whose run index proves history that no WAL holds (here the WAL was
/// removed behind broca's back) refuses reads `history_unreachable` instead of answering an
/// empty page, and names no path; the `view: "model"` reads stay refused as the contract says.
#[test]
fn history_no_wal_covers_is_unreachable_not_empty() {
    let rig = inproc::rig(Duration::from_millis(100));
    rig.script(json!({"responses": [reply_script("one", 0)]}));
    finished_run(&rig, &rig.ops, "first");
    let model_view = call(&rig.ops, "session.read", json!({"view": "model"})).unwrap_err();
    pin::assert_golden("session_read.view_model.json", &model_view.to_json(), None);
    let model_history = call(&rig.ops, "session.history", json!({"view": "model"})).unwrap_err();
    pin::assert_golden("session_history.view_model.json", &model_history.to_json(), None);
    rig.wait_closed(&key());
    rig.ops.registry.shared().settle();
    std::fs::remove_file(rig.ops.registry.shared().root.wal_path(&key())).unwrap();
    let read = call(&rig.ops, "session.read", json!({})).unwrap_err();
    pin::assert_golden("session_read.history_unreachable.json", &read.to_json(), None);
    assert!(!read.to_json().contains(&rig.dir.path().to_string_lossy().into_owned()), "no path");
    let history = call(&rig.ops, "session.history", json!({})).unwrap_err();
    assert_eq!(history.to_json(), read.to_json());
}
