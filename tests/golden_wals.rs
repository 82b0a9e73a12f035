//! Golden WALs: session WALs written by an earlier build (under `testdata/wal/`) must replay,
//! in this build, to the same control units, transcript and replay state, and every record must
//! re-encode to exactly its stored bytes (records are additive: a build may add fields, never
//! change how an existing record is written).
//!
//! `BROCA_BLESS_WALS=1 cargo test --test golden_wals` writes new golden WALs and expectations by
//! running the scenarios below through the session ops (in process, broca-mock as the provider):
//! do that only in a build whose record bytes are the reference, and review the diff.

mod inproc;
use broca_mock::mock;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broca::lineage::read;
use broca::lineage::reader::{Reader, Sink, Start};
use broca::record::Record;
use broca::wal::{self, ScannedFrame, WalError};
use inproc::{key, reply_script, rig, Rig};
use serde_json::{json, Value};

const MODEL: &str = "echo-chat";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/wal")
}

/// What a WAL replays to: its control units, its transcript and the replay state at its end.
fn replayed(path: &Path) -> Value {
    let reader = Reader::file(path);
    let units = read::control_units(&reader, None, usize::MAX).expect("control units");
    let page = read::transcript(&reader, 0, u64::MAX).expect("transcript");
    struct Records(Vec<Value>);
    impl Sink for Records {
        fn record(&mut self, seq: u64, record: &Record) -> bool {
            self.0.push(json!({"seq": seq, "record": record}));
            true
        }
    }
    let mut records = Records(Vec::new());
    reader.scan(Start::Beginning, &mut records).expect("records");
    json!({
        "records": records.0,
        "units": units,
        "messages": page.messages.iter().map(|(o, m)| json!({"ordinal": o, "message": m})).collect::<Vec<_>>(),
        "state": page.state,
    })
}

#[test]
fn golden_wals_replay_to_the_same_units_reads_and_state_and_re_encode_byte_for_byte() {
    if std::env::var_os("BROCA_BLESS_WALS").is_some() {
        bless();
    }
    let mut checked = 0;
    for entry in fs::read_dir(dir()).expect("testdata/wal") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "wal") {
            continue;
        }
        let expect_path = path.with_extension("expect.json");
        if std::env::var_os("BROCA_BLESS").is_some() {
            // The WALs stay as an older build wrote them; only what this build reads back moves.
            fs::write(&expect_path, serde_json::to_string_pretty(&replayed(&path)).unwrap() + "\n").unwrap();
        }
        let expected: Value = serde_json::from_str(&fs::read_to_string(&expect_path).unwrap()).unwrap();
        assert_eq!(replayed(&path), expected, "{} replays differently", path.display());
        wal::read::<WalError>(&path, broca::record::KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
            let record = Record::decode(f.payload).expect("decodes");
            // Every config this build wrote reads back typed, never as an unreadable value.
            let frozen = match &record {
                Record::RunStarted(r) => Some(&r.config),
                Record::Queued { request, .. } => request.config.as_ref(),
                _ => None,
            };
            if let Some(frozen) = frozen {
                assert!(frozen.config().is_some(), "{} seq {}: the frozen config is not typed", path.display(), f.seq);
            }
            let again = record.encode();
            assert!(
                again == f.payload,
                "{} seq {}: re-encoded differently:\n  stored {}\n  now    {}",
                path.display(),
                f.seq,
                String::from_utf8_lossy(f.payload),
                String::from_utf8_lossy(&again)
            );
            Ok(())
        })
        .unwrap();
        checked += 1;
    }
    assert!(checked >= 2, "golden WALs under testdata/wal: {checked}");
}

// ---------------------------------------------------------------------------------------------
// Writing the goldens
// ---------------------------------------------------------------------------------------------

fn send(prompt: &str, send_id: &str) -> Value {
    json!({"prompt": prompt, "model": {"provider": "mock", "model": MODEL}, "send_id": send_id})
}

fn wait_state(rig: &Rig, run_id: &str, states: &[&str]) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let s = rig.call("run.status", json!({"run_id": run_id})).unwrap();
        if states.iter().any(|w| s["state"] == *w) {
            return;
        }
        assert!(Instant::now() < until, "{run_id}: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tool batch, every admission option a send can freeze, and a second episode.
fn tools_and_options(rig: &Rig) {
    rig.script(json!({"responses": [
        {"events": [
            {"text": "Let me look."},
            {"tool_call": {"id": "c1", "name": "slow", "arguments": {"path": "a.txt"}}},
            {"tool_call": {"id": "c2", "name": "missing", "arguments": {}}},
            {"usage": {"input": 20, "output": 7}},
            {"finish": "tool_calls"}
        ]},
        reply_script("all done", 0),
        reply_script("second episode", 0),
    ]}));
    let mut first = send("read a.txt", "g-1");
    first["title"] = json!("golden");
    first["system"] = json!("be brief");
    first["conversation_key"] = json!("golden-key");
    first["stop_when"] = json!({"max_steps": 6});
    first["generation"] = json!({"max_output_tokens": 256});
    first["budget"] = json!({"max_input_tokens": 100000});
    first["on_restart"] = json!("resume");
    first["tools"] = json!([
        {"name": "slow", "description": "reads slowly", "input_schema": {"type": "object"}, "reply": {"max_ms": 5000}},
        {"name": "missing"}
    ]);
    let run = rig.call("session.send", first).unwrap()["run_id"].as_str().unwrap().to_string();
    wait_state(rig, &run, &["completed"]);
    let run = rig.call("session.send", send("and again", "g-2")).unwrap()["run_id"].as_str().unwrap().to_string();
    wait_state(rig, &run, &["completed"]);
}

/// Queue, steer, retract, an interrupt and a boundary cancel, each with its own script.
fn queue_steer_cancel(rig: &Rig) {
    rig.script(json!({"responses": [
        {"events": [{"text": "working"}, {"delay_ms": 500}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]},
        reply_script("saw the steer", 0),
    ]}));
    let first = rig.call("session.send", send("start", "q-1")).unwrap()["run_id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(150));
    let mut steer = send("also this", "q-2");
    steer["delivery"] = json!("steer");
    rig.call("session.send", steer).unwrap();
    let queued = rig.call("session.send", send("later", "q-3")).unwrap();
    let sub = queued["submission_id"].as_str().unwrap().to_string();
    assert_eq!(rig.call("session.retract", json!({"submission_id": sub})).unwrap(), json!({"retracted": true}));
    wait_state(rig, &first, &["completed"]);

    rig.script(json!({"responses": [
        {"events": [{"text": "long"}, {"delay_ms": 20000}, {"finish": "stop"}]},
        reply_script("interrupt handled", 0),
    ]}));
    let long = rig.call("session.send", send("long one", "q-4")).unwrap()["run_id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(300));
    let mut interrupt = send("stop, do this", "q-5");
    interrupt["delivery"] = json!("interrupt");
    let i = rig.call("session.send", interrupt).unwrap();
    wait_state(rig, &long, &["cancelled", "interrupted"]);
    let irun = format!("run-{}", i["submission_id"].as_str().unwrap());
    wait_state(rig, &irun, &["completed"]);

    rig.script(json!({"responses": [{"events": [{"text": "cancel me"}, {"delay_ms": 600}, {"finish": "stop"}]}]}));
    let last = rig.call("session.send", send("cancel me", "q-6")).unwrap()["run_id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(200));
    rig.call("run.cancel", json!({"run_id": last, "at": "step_boundary"})).unwrap();
    wait_state(rig, &last, &["cancelled", "completed"]);
}

fn bless() {
    let out = dir();
    fs::create_dir_all(&out).unwrap();
    for (name, scenario) in
        [("tools_and_options", tools_and_options as fn(&Rig)), ("queue_steer_cancel", queue_steer_cancel)]
    {
        let rig = rig(Duration::from_secs(60));
        scenario(&rig);
        let shared = rig.ops.registry.shared();
        shared.settle();
        let wal = shared.wal_path(&key());
        let target = out.join(format!("{name}.wal"));
        fs::copy(&wal, &target).unwrap();
        let expect = serde_json::to_string_pretty(&replayed(&target)).unwrap() + "\n";
        fs::write(target.with_extension("expect.json"), expect).unwrap();
    }
}
