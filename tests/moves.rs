//! Moving sessions between state roots (`broca::moves`, DESIGN §8), in process: two module
//! cores over two roots stand for two hosts (the daemon-level proof is `tests/federation.rs`).
//! Reads after a move equal reads before it byte for byte, the source refuses sends by name,
//! an archive adopts once and only where it continues what the host holds, a busy session
//! drains first, and every refusal is pinned.

mod inproc;
use broca_mock::mock;
mod pin;

use std::path::PathBuf;
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

/// The exchange directory of a host's state root.
fn exchange(ops: &Ops) -> PathBuf {
    moves::exchange::of(&ops.registry.shared().root).unwrap()
}

/// Hosts that move sessions between them share one move key (docs/security.md): B takes A's.
fn share_key(a: &Ops, b: &Ops) {
    moves::key::MoveKey::load_or_create(a.registry.shared().root.path()).unwrap();
    let key = std::fs::read(moves::key::path(a.registry.shared().root.path())).unwrap();
    let to = moves::key::path(b.registry.shared().root.path());
    std::fs::write(&to, key).unwrap();
    std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

/// What the operator does between two hosts: the archive `name` copied from A's exchange
/// directory into B's, under a fresh name; that name.
fn carry(from: &Ops, name: &Value, to: &Ops) -> String {
    let bytes = std::fs::read(exchange(from).join(name.as_str().unwrap())).unwrap();
    place(to, &bytes)
}

/// `bytes` put in `ops`'s exchange directory under a fresh name; that name.
fn place(ops: &Ops, bytes: &[u8]) -> String {
    let name = moves::exchange::import_name(&key().addr());
    moves::exchange::create_new(&exchange(ops), &name, bytes, || {}).unwrap();
    name
}

#[test]
fn a_session_moves_and_back_with_identical_reads_and_one_writer_at_a_time() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("one", 0), reply_script("two", 0), reply_script("three", 0)]}));
    let b = host(&rig);
    share_key(&rig.ops, &b.ops);
    let run1 = finished_run(&rig, &rig.ops, "first");
    let before = reads(&rig.ops, &run1);

    let exported = move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap();
    assert_eq!(exported["session_ref"], key().addr());
    let archive = exchange(&rig.ops).join(exported["archive"].as_str().unwrap());
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&archive).unwrap()) & 0o777;
    assert_eq!(mode, 0o600, "an archive is its owner's only");
    // The source keeps its reads and refuses sends by name.
    assert_eq!(reads(&rig.ops, &run1), before, "the tombstone is invisible to reads");
    let refused = call(&rig.ops, "session.send", send("late")).unwrap_err();
    pin::assert_golden("session_send.session_moved.json", &refused.to_json(), None);
    assert_eq!(move_op(&rig.ops, direct(), moves::LOCATE, json!({})).unwrap()["state"], "moved");
    // An export repeated after a crash answers from the tombstone, and the archive is the same.
    let first_bytes = std::fs::read(&archive).unwrap();
    let again = move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap();
    assert_eq!(again, exported);
    assert_eq!(std::fs::read(&archive).unwrap(), first_bytes);

    let on_b = carry(&rig.ops, &exported["archive"], &b.ops);
    let adopted = move_op(&b.ops, direct(), moves::ADOPT, json!({"archive": on_b})).unwrap();
    assert_eq!(adopted["adopted"], true);
    assert!(adopted["epoch"].as_u64().unwrap() > exported["epoch"].as_u64().unwrap(), "{adopted} {exported}");
    assert_eq!(reads(&b.ops, &run1), before, "the adopted copy reads as the source did");
    assert_eq!(move_op(&b.ops, direct(), moves::ADOPT, json!({"archive": on_b})).unwrap()["adopted"], false);
    assert_eq!(move_op(&b.ops, direct(), moves::LOCATE, json!({})).unwrap()["state"], "live");

    // B writes; then the session goes back to A, which replaces its tombstoned copy.
    let run2 = finished_run(&rig, &b.ops, "second");
    let reads_b = reads(&b.ops, &run2);
    let back = move_op(&b.ops, direct(), moves::EXPORT, json!({})).unwrap();
    let home = carry(&b.ops, &back["archive"], &rig.ops);
    // The first archive is older than what A would now hold: refused once A adopts the newer.
    let adopted_home = move_op(&rig.ops, direct(), moves::ADOPT, json!({"archive": home})).unwrap();
    assert_eq!(adopted_home["adopted"], true);
    assert_eq!(reads(&rig.ops, &run2), reads_b);
    let stale = move_op(&rig.ops, direct(), moves::ADOPT, json!({"archive": exported["archive"]})).unwrap_err();
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
    let busy = move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap_err();
    pin::assert_golden("session_export.session_busy.json", &busy.to_json(), None);
    // The fence keeps new sends out while the run finishes.
    assert_eq!(call(&rig.ops, "session.send", send("meanwhile")).unwrap_err().code, "session_busy");
    let run = sent["run_id"].as_str().unwrap().to_owned();
    inproc::wait_until("the slow run completes", || {
        call(&rig.ops, "run.status", json!({"run_id": run})).is_ok_and(|s| s["state"] == "completed")
    });
    move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap();
    let names: Vec<String> =
        std::fs::read_dir(exchange(&rig.ops)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().all(|n| !n.ends_with(".partial")), "no partial archive is left: {names:?}");
}

#[test]
fn move_ops_refuse_strangers_bad_archives_and_unknown_sessions_writing_nothing() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("one", 0)]}));
    let missing = move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap_err();
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
    let stranger = move_op(&rig.ops, Caller::local("reserved:other", None, None), moves::EXPORT, json!({}));
    pin::assert_golden("session_export.not_authorized.json", &stranger.unwrap_err().to_json(), None);
    let relayed = Caller { machine: Some("ab".into()), via: Some("reserved:callosum".into()), ..owner.clone() };
    assert_eq!(move_op(&rig.ops, relayed.clone(), moves::EXPORT, json!({})).unwrap_err().code, "not_authorized");
    assert_eq!(
        move_op(&rig.ops, relayed, moves::ADOPT, json!({"from": "/dev/zero"})).unwrap_err().code,
        "not_authorized"
    );
    let unverified = Caller::local("unverified", None, None);
    assert_eq!(
        move_op(&rig.ops, unverified, moves::ADOPT, json!({"archive": "x.archive"})).unwrap_err().code,
        "not_authorized"
    );
    // Moves take no paths: `to` and `from` are refused by name, and so is a name that is a path.
    let to = move_op(&rig.ops, direct(), moves::EXPORT, json!({"to": "/tmp/x"})).unwrap_err();
    pin::assert_golden("session_export.path_refused.json", &to.to_json(), None);
    let from = move_op(&rig.ops, direct(), moves::ADOPT, json!({"from": "/dev/zero"})).unwrap_err();
    pin::assert_golden("session_adopt.path_refused.json", &from.to_json(), None);
    let path_name = move_op(&rig.ops, direct(), moves::ADOPT, json!({"archive": "../wal/x.archive"})).unwrap_err();
    pin::assert_golden("session_adopt.archive_name.json", &path_name.to_json(), None);
    assert_eq!(rig.footprint(&key()).diff(&before), None, "refused move ops wrote nothing");

    // The owner may move it; a flipped byte in the archive is refused at adopt.
    let exported = move_op(&rig.ops, owner.clone(), moves::EXPORT, json!({})).unwrap();
    let b = host(&rig);
    share_key(&rig.ops, &b.ops);
    let good = std::fs::read(exchange(&rig.ops).join(exported["archive"].as_str().unwrap())).unwrap();
    let mut bytes = good.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    let bad = place(&b.ops, &bytes);
    let refused = move_op(&b.ops, direct(), moves::ADOPT, json!({"archive": bad})).unwrap_err();
    pin::assert_golden("session_adopt.archive_invalid.json", &refused.to_json(), None);
    let elsewhere = SessionKey::new("/tmp", "ops-test", "another");
    let name = place(&b.ops, &good);
    let wrong = moves::serve(
        &b.ops,
        &Route { key: elsewhere, scoped: false, caller: direct() },
        moves::ADOPT,
        &json!({"archive": name}),
    );
    assert_eq!(wrong.unwrap_err().code, "invalid_params");
    assert!(std::fs::read_dir(b.dir.path().join("wal")).unwrap().next().is_none(), "no WAL and no staged file");
    // The archive's owner, on its own machine, may adopt it.
    move_op(&b.ops, owner, moves::ADOPT, json!({"archive": name})).unwrap();
}

/// An archive proves where it came from: one sealed under another key (a forger who rewrote
/// the owner, say, with every digest valid) is refused before anything in it is trusted, and
/// files that are not archives (a symlink to /dev/zero, a FIFO, a link to a victim) are refused
/// at once, leaving the session open and untouched.
#[test]
fn forged_archives_and_files_that_are_not_archives_are_refused_at_once() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("one", 0), reply_script("two", 0)]}));
    let run = finished_run(&rig, &rig.ops, "first");
    let exported = move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap();
    let b = host(&rig);
    let sealed = std::fs::read(exchange(&rig.ops).join(exported["archive"].as_str().unwrap())).unwrap();
    // B never shared A's key: A's genuine archive is as good as forged to B.
    let foreign = place(&b.ops, &sealed);
    let unverified = move_op(&b.ops, direct(), moves::ADOPT, json!({"archive": foreign})).unwrap_err();
    pin::assert_golden("session_adopt.unverified.json", &unverified.to_json(), None);
    // A forger re-sealing with a key of its own, every digest valid: refused the same way.
    let (header, wal) =
        moves::archive::decode(&sealed, &moves::key::MoveKey::load_or_create(rig.dir.path()).unwrap()).unwrap();
    let forged = moves::archive::encode(&header, &wal, &moves::key::MoveKey::from_bytes([9; 32]));
    let forged = place(&b.ops, &forged);
    assert_eq!(
        move_op(&b.ops, direct(), moves::ADOPT, json!({"archive": forged})).unwrap_err().to_json(),
        unverified.to_json()
    );
    assert!(std::fs::read_dir(b.dir.path().join("wal")).unwrap().next().is_none(), "nothing adopted or staged");

    // Not files: refused at once (a FIFO would hold the op thread forever if opened blocking).
    let dir = exchange(&rig.ops);
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.archive")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo.archive").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path in this test's own state root.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let device = move_op(&rig.ops, direct(), moves::ADOPT, json!({"archive": "zero.archive"})).unwrap_err();
    pin::assert_golden("session_adopt.symlink.json", &device.to_json(), None);
    let started = std::time::Instant::now();
    let fifo = move_op(&rig.ops, direct(), moves::ADOPT, json!({"archive": "fifo.archive"})).unwrap_err();
    pin::assert_golden("session_adopt.not_a_file.json", &fifo.to_json(), None);
    assert!(started.elapsed() < Duration::from_secs(5), "a FIFO is refused without waiting for a writer");
    assert_eq!(reads(&rig.ops, &run)[0], call(&rig.ops, "session.read", json!({})).unwrap().to_string());
    assert_eq!(move_op(&rig.ops, direct(), moves::LOCATE, json!({})).unwrap()["state"], "moved", "untouched");
}

/// An export never writes through a file planted in the exchange directory: a symlink at the
/// archive's name (to a stand-in for `~/.bashrc`) stays a symlink and its target unchanged.
#[test]
fn an_export_never_writes_through_a_planted_link() {
    let rig = inproc::rig(Duration::from_millis(300));
    rig.script(json!({"responses": [reply_script("one", 0)]}));
    finished_run(&rig, &rig.ops, "first");
    let victim_dir = tempfile::tempdir().unwrap();
    let bashrc = victim_dir.path().join(".bashrc");
    std::fs::write(&bashrc, b"# the operator's shell\n").unwrap();
    let dir = exchange(&rig.ops);
    for epoch in 0..8 {
        let name = moves::exchange::export_name(&key().addr(), epoch);
        std::os::unix::fs::symlink(&bashrc, dir.join(&name)).unwrap();
        std::os::unix::fs::symlink(&bashrc, dir.join(format!(".{name}.partial"))).unwrap();
    }
    let refused = move_op(&rig.ops, direct(), moves::EXPORT, json!({})).unwrap_err();
    assert_eq!(refused.code, "open_failed", "{}", refused.to_json());
    // Refused before the tombstone: the session stays here and takes sends.
    assert_eq!(move_op(&rig.ops, direct(), moves::LOCATE, json!({})).unwrap()["state"], "live");
    assert_eq!(std::fs::read(&bashrc).unwrap(), b"# the operator's shell\n");
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&bashrc).unwrap()) & 0o777;
    assert_ne!(mode & 0o777, 0o600, "its mode is untouched too");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.file_type().unwrap().is_symlink(), "{:?} was replaced", entry.file_name());
    }
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
