//! The move ops through the real daemon (#44): no caller makes broca touch a path, a session or
//! a credential it does not own. `broca-mock relay` modules the daemon launches call broca under
//! their own attested principals (`reserved:mover`, `reserved:stranger`); the test process is
//! the daemon's `direct` caller. Each refusal is pinned under `testdata/golden/` (the same
//! bodies `tests/moves.rs` pins in process).
//!
//! - an attested module's export takes no path (`to` refused by name), and never writes
//!   through a link planted in the exchange directory (a `~/.bashrc` stand-in stays as it was);
//! - an adopt naming a symlink to `/dev/zero` or a FIFO is refused at once, and the session
//!   stays open and takes sends; a path in `from` is refused by name;
//! - a forged archive (every digest valid, sealed under another key) is refused `unverified`;
//! - a stranger may not export what another module owns.
//!
//! One test, because stopping the in-process daemon means SIGTERM to this process.

use broca_mock::mock;
mod pin;
mod support;

use std::time::{Duration, Instant};

use broca::moves;
use serde_json::{json, Value};
use subc_client_rs::CallError;
use subc_protocol::RouteTarget;
use support::{call_options, send_params, Harness, Options, Session, STEP};

const MOVER: &str = "mover";
const STRANGER: &str = "stranger";

/// `method` on `s` through the relay module `relay` (under `reserved:<relay>`): the `result`,
/// or the refusal's full body.
fn via(h: &Harness, relay: &str, s: &Session, method: &str, params: Value) -> Result<Value, Value> {
    let body = json!({"method": method, "params": params}).to_string().into_bytes();
    let target = RouteTarget::ManagementSurface { module_id: relay.into() };
    match h.block_on(h.client().consumer().call(target, s.identity(), body, call_options())) {
        Ok(bytes) => Ok(serde_json::from_slice::<Value>(&bytes).expect("a JSON reply")["result"].clone()),
        Err(CallError::Module(e)) => Err(serde_json::to_value(&e).unwrap()),
        Err(e) => panic!("{method} through {relay}: {e:?}"),
    }
}

fn reply(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 3, "output": 1}}, {"finish": "stop"}]})
}

/// A completed run of `prompt` sent by `relay` on `s`.
fn finished(h: &Harness, relay: &str, s: &Session, prompt: &str) {
    let sent = via(h, relay, s, "session.send", send_params(prompt)).unwrap_or_else(|e| panic!("{e}"));
    let run = sent["run_id"].as_str().unwrap().to_owned();
    let until = Instant::now() + STEP;
    while via(h, relay, s, "run.status", json!({"run_id": run})).map(|v| v["state"].clone()) != Ok(json!("completed")) {
        assert!(Instant::now() < until, "{run} did not complete");
        std::thread::sleep(Duration::from_millis(30));
    }
}

fn golden(name: &str, body: &Value) {
    pin::assert_golden(name, &body.to_string(), None);
}

fn exchange(h: &Harness) -> std::path::PathBuf {
    moves::exchange::of(&broca::state_root::StateRoot::at(&h.state_root()).unwrap()).unwrap()
}

/// An export takes no path and never writes through a planted link.
fn exports_write_only_broca_s_own_files(h: &Harness) {
    let s = h.session("moves", "planted", None);
    h.install(json!({"responses": [reply("one")]}));
    finished(h, MOVER, &s, "hello");
    let home = tempfile::tempdir().unwrap();
    let bashrc = home.path().join(".bashrc");
    std::fs::write(&bashrc, b"# the operator's shell\n").unwrap();
    let to = via(h, MOVER, &s, moves::EXPORT, json!({"to": bashrc})).unwrap_err();
    golden("session_export.path_refused.json", &to);
    let stranger = via(h, STRANGER, &s, moves::EXPORT, json!({})).unwrap_err();
    assert_eq!(stranger["code"], "not_authorized", "{stranger}");
    let dir = exchange(h);
    for epoch in 0..8 {
        let name = moves::exchange::export_name(&s.key().addr(), epoch);
        std::os::unix::fs::symlink(&bashrc, dir.join(&name)).unwrap();
        std::os::unix::fs::symlink(&bashrc, dir.join(format!(".{name}.partial"))).unwrap();
    }
    let refused = via(h, MOVER, &s, moves::EXPORT, json!({})).unwrap_err();
    assert_eq!(refused["code"], "open_failed", "{refused}");
    // Refused before the tombstone: the session stays here and takes sends.
    assert_eq!(via(h, MOVER, &s, moves::LOCATE, json!({})).unwrap()["state"], "live");
    h.install(json!({"responses": [reply("after")]}));
    finished(h, MOVER, &s, "still here");
    assert_eq!(std::fs::read(&bashrc).unwrap(), b"# the operator's shell\n", "the planted link's target changed");
    for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
        if entry.file_name().to_string_lossy().contains(&s.key().addr()) {
            assert!(entry.file_type().unwrap().is_symlink(), "{:?} was replaced", entry.file_name());
        }
    }
}

/// Adopts of files that are not archives are refused at once; the session stays open.
fn adopts_read_only_archives(h: &Harness) {
    let s = h.session("moves", "kept", None);
    h.install(json!({"responses": [reply("one"), reply("two")]}));
    finished(h, MOVER, &s, "hello");
    let dir = exchange(h);
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.archive")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo.archive").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path in this test's own state root.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let started = Instant::now();
    let zero = via(h, MOVER, &s, moves::ADOPT, json!({"archive": "zero.archive"})).unwrap_err();
    golden("session_adopt.symlink.json", &zero);
    let fifo = via(h, MOVER, &s, moves::ADOPT, json!({"archive": "fifo.archive"})).unwrap_err();
    golden("session_adopt.not_a_file.json", &fifo);
    assert!(started.elapsed() < Duration::from_secs(10), "refused at once, not after reading or waiting");
    let from = via(h, MOVER, &s, moves::ADOPT, json!({"from": "/dev/zero"})).unwrap_err();
    golden("session_adopt.path_refused.json", &from);
    let named = via(h, MOVER, &s, moves::ADOPT, json!({"archive": "../wal/x.archive"})).unwrap_err();
    golden("session_adopt.archive_name.json", &named);
    assert_eq!(via(h, MOVER, &s, moves::LOCATE, json!({})).unwrap()["state"], "live");
    finished(h, MOVER, &s, "still mine");
}

/// A forged archive (valid digests, another key) is refused before anything in it is trusted.
fn forged_archives_are_refused(h: &Harness) {
    let s = h.session("moves", "forged", None);
    let k = s.key();
    let wal = b"BWAL".to_vec();
    let header = moves::archive::Header {
        addr: k.addr(),
        project_root: k.project_root.clone(),
        harness: k.harness.clone(),
        session: k.session.clone(),
        incarnation: "00000000-0000-4000-8000-000000000000".into(),
        epoch: 1,
        tree: "wal".into(),
        wal_bytes: wal.len() as u64,
        wal_sha256: moves::archive::sha256_hex(&wal),
        exported_at_ms: 1,
        source_machine: None,
    };
    let forged = moves::archive::encode(&header, &wal, &moves::key::MoveKey::from_bytes([7; 32]));
    let name = moves::exchange::import_name(&k.addr());
    moves::exchange::create_new(&exchange(h), &name, &forged, || {}).unwrap();
    let refused = via(h, MOVER, &s, moves::ADOPT, json!({"archive": name})).unwrap_err();
    golden("session_adopt.unverified.json", &refused);
    assert!(!s.wal_path().exists(), "nothing adopted");
}

/// The move ops have names of their own (#47): llm-runner's `session.adopt` (§9.5, taking over
/// a person-started session) is another operation, which broca does not serve, so it is
/// refused `unknown_method`, as is the old `session.export`; the move ops are counted in
/// `health.check`'s `management_ops` (a stranger's refused call is not).
fn move_ops_have_names_of_their_own(h: &Harness) {
    let s = h.session("moves", "named", None);
    h.install(json!({"responses": [reply("one")]}));
    finished(h, MOVER, &s, "hello");
    let counted = || {
        let health = h.block_on(h.client().consumer().supervisor_health_probe(support::MODULE_ID)).unwrap();
        health.metrics.expect("health metrics")["management_ops"].clone()
    };
    let before = counted();
    for old in ["session.adopt", "session.export", "session.locate"] {
        let refused = via(h, MOVER, &s, old, json!({"send_id": "x", "plan": {}})).unwrap_err();
        assert_eq!(refused["code"], "unknown_method", "{old}: {refused}");
    }
    assert_eq!(via(h, MOVER, &s, moves::LOCATE, json!({})).unwrap()["state"], "live");
    assert_eq!(via(h, STRANGER, &s, moves::EXPORT, json!({})).unwrap_err()["code"], "not_authorized");
    let after = counted();
    assert_eq!(after["move.locate"].as_u64(), before["move.locate"].as_u64().map(|n| n + 1), "{after}");
    assert_eq!(after["move.export"], before["move.export"], "a refused authorization is not counted");
    assert!(after.get("session.adopt").is_none() && after["move.adopt"].is_u64(), "{after}");
}

#[test]
fn moves_through_the_daemon() {
    let relay = |id: &str| {
        let entry = json!({"program": broca_mock::exe(), "args": ["relay"], "env": {"CK_LOG": "info"},
                           "enabled": true, "reserved": true});
        (id.to_owned(), entry)
    };
    let h = Harness::start_with(Options { modules: vec![relay(MOVER), relay(STRANGER)], ..Options::default() });
    support::wait_modules_ready(&h, &[MOVER, STRANGER]);
    let checks: [support::Check; 4] = [
        ("move ops have names of their own", move_ops_have_names_of_their_own),
        ("exports write only broca's own files", exports_write_only_broca_s_own_files),
        ("adopts read only archives", adopts_read_only_archives),
        ("forged archives are refused", forged_archives_are_refused),
    ];
    support::run_checks(h, &checks);
}
