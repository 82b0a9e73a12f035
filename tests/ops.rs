//! The session ops on the actor registry, in-process against broca-mock: idle sends start runs,
//! busy sends queue durably and drain in FIFO order, reads page from store ⊕ WAL, refusals are
//! typed and write nothing, idle actors release their lease.

mod inproc;
use broca_mock::mock;
mod pin;
mod skip;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::catalog::Catalog;
use inproc::{key, reply_script, rig, send};
use mock::Script;
use serde_json::{json, Value};

#[test]
fn an_idle_send_runs_and_a_busy_send_queues_then_drains_in_order() {
    let rig = rig(Duration::from_secs(5));
    let script =
        json!({"responses": [reply_script("first", 300), reply_script("second", 0), reply_script("third", 0)]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    let first = rig.call("session.send", send("one")).unwrap();
    assert_eq!(first["state"], "active");
    let run1 = first["run_id"].as_str().unwrap().to_string();
    assert_eq!(run1, format!("run-{}", first["submission_id"].as_str().unwrap()));
    let second = rig.call("session.send", send("two")).unwrap();
    let third = rig.call("session.send", send("three")).unwrap();
    assert_eq!((second["state"].as_str(), third["state"].as_str()), (Some("pending"), Some("pending")));
    let run3 = format!("run-{}", third["submission_id"].as_str().unwrap());
    rig.wait_state(&run3, "completed");
    rig.wait_state(&run1, "completed");
    let page = rig.call("session.read", json!({})).unwrap();
    let texts: Vec<String> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message"]["content"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts, ["one", "first", "two", "second", "three", "third"], "FIFO, one episode per send");
    assert_eq!(page["lineage_state"], "idle");
    assert!(page["head"]["wal_seq"].as_u64().unwrap() > 0);
    // Paging: a forward page and its continuation.
    let p = rig.call("session.read", json!({"from_ordinal": 1, "limit": 2})).unwrap();
    assert_eq!(p["messages"][0]["mid"], "m1");
    assert_eq!(p["messages"][0]["message"]["content"][0]["text"], "one", "ordinals count from 1");
    assert_eq!(p["next_from_ordinal"], 3);
}

#[test]
fn reads_and_the_head_serve_the_published_contract() {
    let rig = rig(Duration::from_secs(5));
    let script = json!({"responses": [reply_script("first", 0), reply_script("second", 0)]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    // A never-written session: the cache pair, and the caller's grant (its next send would
    // make it the owner; an in-process caller is `direct`, so it never becomes one).
    let head = rig.call("session.head", json!({})).unwrap();
    let grant = json!({"modes": ["tool_result", "steer", "idle_start"], "interrupt": true, "owner": true});
    assert_eq!(head, json!({"history_version": 1, "incarnation": "log-1", "sender": grant}));
    let empty = rig.call("session.read", json!({})).unwrap();
    assert_eq!((empty["history_version"].clone(), empty["incarnation"].clone()), (json!(1), json!("log-1")));
    for prompt in ["one", "two"] {
        let sent = rig.call("session.send", send(prompt)).unwrap();
        rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    }
    let all = rig.call("session.read", json!({})).unwrap();
    pin::assert_golden("session_read.page.json", &all.to_string(), None);
    let entries = all["messages"].as_array().unwrap();
    let ordinals: Vec<u64> = entries.iter().map(|m| m["ordinal"].as_u64().unwrap()).collect();
    assert_eq!(ordinals, [1, 2, 3, 4]);
    let incarnation = all["incarnation"].as_str().unwrap().to_owned();
    assert_eq!(uuid::Uuid::parse_str(&incarnation).unwrap().get_version_num(), 4, "the WAL header's incarnation");
    let roles: Vec<&str> = entries.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert!(entries.iter().all(|m| m["written_at"].as_u64().is_some_and(|t| t > 0)), "{all}");
    // Run attribution: each run's last message is final.
    let finals: Vec<bool> = entries.iter().map(|m| m["run"]["final"].as_bool().unwrap()).collect();
    assert_eq!(finals, [false, true, false, true]);
    assert_eq!(entries[0]["run"]["run_id"], entries[1]["run"]["run_id"]);
    assert_ne!(entries[1]["run"]["run_id"], entries[2]["run"]["run_id"]);
    // A page cut inside a run still knows its last entry is not final.
    let cut = rig.call("session.read", json!({"from_ordinal": 0, "limit": 1})).unwrap();
    assert_eq!(
        (cut["messages"][0]["ordinal"].clone(), cut["messages"][0]["run"]["final"].clone()),
        (json!(1), json!(false))
    );
    // After a message, at the page's history version.
    let after = rig.call("session.read", json!({"after_mid": "m2", "history_version": 1})).unwrap();
    assert_eq!(after["messages"][0]["mid"], "m3");
    let field = |e: broca::wire::Refusal| e.detail.and_then(|d| d.get("field").cloned());
    let e = rig.call("session.read", json!({"after_mid": "m2"})).unwrap_err();
    assert_eq!(e.code, "invalid_params");
    assert_eq!(field(e), Some(json!("history_version")));
    let e = rig.call("session.read", json!({"after_mid": "m2", "from_ordinal": 1, "history_version": 1})).unwrap_err();
    assert_eq!(field(e), Some(json!("from_ordinal")));
    let stale = rig.call("session.read", json!({"after_mid": "m2", "history_version": 7})).unwrap_err();
    assert_eq!(stale.code, "history_changed");
    assert_eq!(rig.call("session.read", json!({"history_version": 7})).unwrap_err().code, "history_changed");
    let unknown = rig.call("session.read", json!({"after_mid": "m9", "history_version": 1})).unwrap_err();
    assert_eq!(unknown.code, "unknown_mid");
    let lineage = rig.call("session.read", json!({"after_mid": "m1", "lineage_id": "other"})).unwrap_err();
    assert_eq!(lineage.code, "lineage_changed");
    for member in ["include_rich_ui", "include_display_facts", "direction"] {
        let e = rig.call("session.read", json!({member: true})).unwrap_err();
        assert_eq!(field(e), Some(json!(member)), "{member} is refused by name");
    }
    assert_eq!(field(rig.call("session.read", json!({"view": "model"})).unwrap_err()), Some(json!("view")));
    let members =
        json!({"max_bytes": 100, "include_tools": true, "include_originals": true, "view": "raw", "media": "inline"});
    let small = rig.call("session.read", members).unwrap();
    assert_eq!(small["messages"].as_array().unwrap().len(), 1, "an over-cap message comes alone: {small}");
    assert!(small["tools"].is_array() && small["tools_run_id"].is_string(), "{small}");
    // The head agrees with the pages.
    let mut head = rig.call("session.head", json!({})).unwrap();
    // The cache clock is this process's memory of its live sends (`driver.rs` checks it); the
    // golden pins the rest.
    let cache = head.as_object_mut().unwrap().remove("cache").expect("the session sent: its cache clock");
    assert_eq!(cache["expiry_basis"], "estimated", "{cache}");
    pin::assert_golden("session_head.json", &head.to_string(), None);
    pin::assert_golden("session_read.history_changed.json", &stale.to_json(), None);
    pin::assert_golden("session_read.unknown_mid.json", &unknown.to_json(), None);
    assert_eq!((head["last_ordinal"].clone(), head["first_ordinal"].clone()), (json!(4), json!(1)));
    assert_eq!(head["incarnation"], incarnation.as_str());
    assert_eq!(head["history_version"], 1);
    assert_eq!(head["head"], all["head"]);
    assert_eq!(head["last_run_state"]["state"], "completed");
    assert_eq!(head["last_run_state"]["run_id"], entries[3]["run"]["run_id"]);
    assert_eq!(head["model"], json!({"provider": "mock", "model": "echo-chat"}));
    assert!(head["updated_at"].as_u64().is_some());
    assert_eq!(field(rig.call("session.head", json!({"x": 1})).unwrap_err()), Some(json!("x")));
    // session_usage: every counted step of the session, since its first run.
    assert_eq!(head["usage"]["steps"], 2, "{head}");
    assert_eq!(head["usage"]["since"], entries[0]["run"]["run_id"]);
    // finish_reason: the normalized finish of the run's last model step, on result and status.
    let run_id = entries[3]["run"]["run_id"].as_str().unwrap();
    let result = rig.call("run.result", json!({"run_id": run_id})).unwrap();
    let status = rig.call("run.status", json!({"run_id": run_id})).unwrap();
    assert_eq!((result["finish"].clone(), status["finish"].clone()), (json!("stop"), json!("stop")), "{result}");
    let older = rig.call("run.result", json!({"run_id": entries[0]["run"]["run_id"]})).unwrap();
    assert_eq!(older["finish"], "stop", "an older run's finish comes from the run index: {older}");
}

#[test]
fn refusals_are_typed_and_write_nothing() {
    let rig = rig(Duration::from_secs(5));
    let err =
        rig.call("session.send", json!({"prompt": "x", "model": {"provider": "nope", "model": "none"}})).unwrap_err();
    assert_eq!(err.code, "model_unknown");
    let err = rig.call("session.send", json!({"model": {"provider": "mock", "model": "echo-chat"}})).unwrap_err();
    assert_eq!(
        (err.code.as_str(), err.detail.unwrap().get("field").cloned()),
        ("invalid_params", Some(json!("prompt")))
    );
    let err = rig.call(
        "session.send",
        json!({"prompt": "x", "session": "other", "model": {"provider": "mock", "model": "echo-chat"}}),
    );
    assert_eq!(err.unwrap_err().detail.unwrap().get("field"), Some(&json!("session")));
    let err = rig.call("session.read", json!({"direction": "backward"})).unwrap_err();
    assert_eq!(err.detail.unwrap().get("field"), Some(&json!("direction")), "session.read is strict");
    let err = rig.call("run.status", json!({"runid": "x"})).unwrap_err();
    assert_eq!(err.code, "invalid_params");
    assert_eq!(rig.call("session.frobnicate", json!({})).unwrap_err().code, "unknown_method");
    assert!(!rig.ops.registry.shared().wal_path(&key()).exists(), "no refusal created the session");
    assert!(rig.mock.requests("default").is_empty());
    assert_eq!(rig.call("run.status", json!({"run_id": "run-nothing"})).unwrap()["state"], "unknown");
}

#[test]
fn an_idle_actor_releases_its_lease() {
    let rig = rig(Duration::from_millis(100));
    let sent = rig.call("session.send", send("hello")).unwrap();
    rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.is_open(&key()) {
        assert!(Instant::now() < deadline, "the actor never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The lease is free: this process can open the lineage directly.
    let l = rig.ops.registry.shared().open_lineage(&key()).unwrap();
    assert_eq!(l.state().episodes, 1);
    drop(l);
    // And a later send reopens the actor and appends a second episode.
    let again = rig.call("session.send", send("again")).unwrap();
    rig.wait_state(again["run_id"].as_str().unwrap(), "completed");
    assert_eq!(rig.call("session.read", json!({})).unwrap()["messages"].as_array().unwrap().len(), 4);
}

#[test]
fn a_newer_writers_session_refuses_the_send_by_name() {
    let rig = rig(Duration::from_secs(5));
    let shared = rig.ops.registry.shared();
    broca::wal::create(&broca::wal::FileStorage, &shared.wal_path(&key()), key().lineage_id()).unwrap();
    let mut frame = Vec::new();
    broca::wal::frame::encode(&mut frame, broca::wal::frame::FrameKind::Record, 1, 1, &["probe-unknown/v1"], b"{}");
    let mut f = std::fs::OpenOptions::new().append(true).open(shared.wal_path(&key())).unwrap();
    std::io::Write::write_all(&mut f, &frame).unwrap();
    let err = rig.call("session.send", send("hi")).unwrap_err();
    assert_eq!(err.code, "wal_newer_writer");
    assert_eq!(rig.call("session.read", json!({})).unwrap_err().code, "wal_newer_writer");
}

#[test]
fn the_baseline_is_not_yet_until_the_first_episode_then_ready() {
    let rig = rig(Duration::from_secs(5));
    assert_eq!(rig.call("session.baseline", json!({})).unwrap(), json!({"state": "not_yet"}));
    let sent = rig.call("session.send", send("hello")).unwrap();
    rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    let ready = rig.call("session.baseline", json!({})).unwrap();
    assert_eq!(ready["state"], "ready");
    assert_eq!(ready["baseline"]["items"], json!([]));
    assert_eq!(ready["baseline"]["tool_names"], json!([]));
    assert!(ready["baseline"].get("composition_digest").is_none(), "admitted without a fetch plan");
    assert_eq!(rig.call("session.baseline", json!({"x": 1})).unwrap_err().code, "invalid_params");
}

#[test]
fn shutdown_seals_a_running_turn_gracefully() {
    let rig = rig(Duration::from_secs(5));
    let stall = json!({"responses": [{"events": [{"text": "slow"}, {"delay_ms": 20000}, {"finish": "stop"}]}]});
    rig.mock.install("default", Script::from_json(&stall.to_string()).unwrap());
    let sent = rig.call("session.send", send("take your time")).unwrap();
    let run_id = sent["run_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.gauges().runs_in_flight.load(std::sync::atomic::Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    // The step cannot reach its boundary within the grace (the provider stalls): sealed at once.
    assert_eq!(rig.ops.registry.seal_all(Duration::from_millis(300)), 0, "every run sealed");
    assert!(started.elapsed() < Duration::from_secs(5), "sealing does not wait for the provider");
    let status = rig.call("run.status", json!({"run_id": run_id})).unwrap();
    assert_eq!(status["state"], "interrupted");
    // A graceful seal carries the planned stop's diagnostic, never the crash one (llm-runner
    // §6.5: `runner_shutdown`, served as the interrupt reason).
    assert_eq!(status["error"]["provider_code"], "runner_shutdown", "{status}");
    assert_eq!(status["reason"], "runner_shutdown", "{status}");
    // No new turn starts while shutting down: a send is refused, retryable.
    assert_eq!(rig.call("session.send", send("later")).unwrap_err().code, "module_reloading");
}

#[test]
fn pages_are_capped_by_bytes_and_an_oversize_message_is_refused_by_name() {
    let rig = rig(Duration::from_secs(5));
    let big = "x".repeat(1_600_000);
    for i in 0..2 {
        let mut params = send(&big);
        params["send_id"] = json!(format!("big-{i}"));
        let sent = rig.call("session.send", params).unwrap();
        rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    }
    // Four messages: 1.6 MB prompt, short answer, twice. The newest page keeps its last ones.
    let newest = rig.call("session.read", json!({})).unwrap();
    let ordinals: Vec<u64> =
        newest["messages"].as_array().unwrap().iter().map(|m| m["ordinal"].as_u64().unwrap()).collect();
    assert_eq!(ordinals, [2, 3, 4], "3 MiB holds one big prompt and the answers (ordinals count from 1)");
    assert!(newest.get("next_from_ordinal").is_none());
    let forward = rig.call("session.read", json!({"from_ordinal": 0})).unwrap();
    assert_eq!(forward["messages"].as_array().unwrap().len(), 2);
    assert_eq!(forward["next_from_ordinal"], 3);
    // A prompt that could never be read back whole is refused at admission, naming the limit.
    let huge = "y".repeat(4_300_000);
    let e = rig.call("session.send", send(&huge)).unwrap_err();
    let limit = e.detail.as_ref().and_then(|d| d.get("limit").cloned());
    assert_eq!((e.code.as_str(), limit), ("invalid_params", Some(json!(broca::wire::send::MAX_MESSAGE_JSON_BYTES))));
    pin::assert_golden("send.prompt_too_large.json", &e.to_json(), None);
    // A model answer that alone crosses the transport limit is refused, naming it, not its content.
    let script = json!({"responses": [{"events": [{"text": "y".repeat(4_300_000)}, {"finish": "stop"}]}]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    let mut params = send("make it huge");
    params["send_id"] = json!("huge");
    let sent = rig.call("session.send", params).unwrap();
    rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    let err = rig.call("session.read", json!({"from_ordinal": 6, "limit": 1})).unwrap_err();
    assert_eq!(err.code, "reply_too_large");
    let detail = err.detail.unwrap();
    assert_eq!(detail.get("subject"), Some(&json!({"kind": "message", "session": "s1", "ordinal": 6})));
    assert_eq!(detail.get("limit"), Some(&json!(4_194_304)));
    assert!(!err.message.contains("yyyy"));
}

#[test]
fn draining_lets_the_step_and_its_batch_finish_then_seals_at_the_boundary() {
    let rig = rig(Duration::from_secs(5));
    let script = json!({"responses": [
        {"events": [{"text": "checking"}, {"delay_ms": 300},
                    {"tool_call": {"id": "c1", "name": "look", "arguments": {}}}, {"finish": "tool_calls"}]},
        {"events": [{"text": "never asked"}, {"finish": "stop"}]},
    ]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    let sent = rig.call("session.send", send("look around")).unwrap();
    let run_id = sent["run_id"].as_str().unwrap().to_string();
    // Drain while the first step streams (its request has reached the provider).
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.mock.requests("default").is_empty() {
        assert!(Instant::now() < deadline, "the first step never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    rig.ops.registry.drain();
    rig.wait_state(&run_id, "interrupted");
    assert_eq!(rig.mock.requests("default").len(), 1, "no model step after the boundary");
    let page = rig.call("session.read", json!({})).unwrap();
    let roles: Vec<&str> =
        page["messages"].as_array().unwrap().iter().map(|m| m["message"]["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"], "the step and its batch finished and were recorded");
}

/// The route of `mock/echo-chat` on the rig's mock, as admission resolves it.
fn mock_route(rig: &inproc::Rig) -> broca::provider::config::RenderConfig {
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let catalog = Catalog::load_lkg(&lkg).unwrap();
    let req = broca::catalog::route::ModelRequest { model: "mock/echo-chat".into(), ..Default::default() };
    let overrides = broca::catalog::route::RouteOverrides {
        base_url_override: Some(rig.mock.base_url(None)),
        ..Default::default()
    };
    broca::catalog::route::resolve(Ok(&catalog), lkg, &req, &overrides).unwrap()
}

/// A steer acknowledged into a run a previous process left open joins the transcript when that
/// run is sealed; no new turn is started for it (spec §4; found by the kill campaign).
#[test]
fn a_steer_into_an_orphaned_run_is_delivered_by_its_seal_not_run_as_a_turn() {
    let rig = rig(Duration::from_secs(5));
    let shared = rig.ops.registry.shared();
    let config = mock_route(&rig);
    let mut l = shared.open_lineage(&key()).unwrap();
    let first = broca::message::Message::user_text("first");
    broca::agent::admit(&mut l, "run-open", None, &config, first, None, None).unwrap();
    let request = broca::record::RequestIdentity {
        config: Some(broca::record::Frozen::new(config.clone())),
        delivery: Some(broca::record::Delivery::Steer),
        target_run: Some("run-open".into()),
        ..Default::default()
    };
    l.enqueue("sub-steer", broca::message::Message::user_text("also this"), request).unwrap();
    drop(l);
    shared.settle();
    rig.ops.registry.recover();
    rig.wait_state("run-open", "interrupted");
    std::thread::sleep(Duration::from_millis(200));
    let page = rig.call("session.read", json!({})).unwrap();
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["message"]["content"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["first", "also this"], "the steer is in the transcript once, and no turn ran for it");
    assert!(rig.mock.requests("default").is_empty(), "no model request");
    let status = rig.call("run.status", json!({"run_id": "run-sub-steer"})).unwrap();
    assert_ne!(status["state"], "completed", "{status}");
}

/// A send queued with `config` by a previous process that died before running it.
fn leave_queued(rig: &inproc::Rig, submission_id: &str, prompt: &str, config: broca::record::Frozen) {
    let shared = rig.ops.registry.shared();
    let mut l = shared.open_lineage(&key()).unwrap();
    let request = broca::record::RequestIdentity { config: Some(config), ..Default::default() };
    l.enqueue(submission_id, broca::message::Message::user_text(prompt), request).unwrap();
    drop(l);
    shared.settle();
}

#[test]
fn boot_recovery_drains_queued_work_left_by_a_previous_process() {
    let rig = rig(Duration::from_secs(5));
    // A previous process queued a send (with its admitted config) and died before running it.
    let config = broca::record::Frozen::new(mock_route(&rig));
    leave_queued(&rig, "sub-left", "left behind", config);
    assert_eq!(rig.ops.registry.recover(), 1);
    rig.wait_state("run-sub-left", "completed");
}

/// A queued send whose frozen config this build cannot read starts a run recorded with that
/// config as written (never a made-up route) and ends at once as an error naming why; the
/// queue behind it drains.
#[test]
fn a_queued_send_with_an_unreadable_config_ends_visibly_with_its_config_as_written() {
    let rig = rig(Duration::from_secs(5));
    let written = json!({"provider": 5, "from_a_newer_build": true});
    leave_queued(&rig, "sub-odd", "from the future", broca::record::Frozen::Unreadable(written.clone()));
    assert_eq!(rig.ops.registry.recover(), 1);
    rig.wait_state("run-sub-odd", "error");
    let path = rig.ops.registry.shared().wal_path(&key());
    let started = broca::lineage::reader::Reader::file(&path);
    let mut configs = Vec::new();
    struct Configs<'a>(&'a mut Vec<broca::record::Frozen>);
    impl broca::lineage::reader::Sink for Configs<'_> {
        fn record(&mut self, _seq: u64, record: &broca::record::Record) -> bool {
            if let broca::record::Record::RunStarted(r) = record {
                self.0.push(r.config.clone());
            }
            true
        }
    }
    started.scan(broca::lineage::reader::Start::Beginning, &mut Configs(&mut configs)).unwrap();
    assert_eq!(configs, vec![broca::record::Frozen::Unreadable(written)], "RunStarted keeps the config as written");
    let result = rig.call("run.result", json!({"run_id": "run-sub-odd"})).unwrap();
    assert_eq!(result["error"]["provider_code"], "queued_config_unreadable", "{result}");
}

/// `io_fault_*` through the actor: an fsync that fails mid-run latches the session's WAL; the
/// actor stops, sends get a typed transient refusal while the device fails, nothing durable is
/// lost, and once it works again the next send reopens the session, which seals the run with the
/// storage error and goes on.
#[test]
fn io_fault_a_failed_fsync_mid_run_refuses_sends_then_recovers() {
    use broca::wal::storage::crash::{CrashStorage, FaultKind, FaultOp};
    let storage = CrashStorage::new();
    let dir = tempfile::tempdir().unwrap();
    let mock = crate::mock::MockServer::start("127.0.0.1:0").unwrap();
    let ops = inproc::ops_on(dir.path(), mock.base_url(None), Duration::from_secs(5), None, Arc::new(storage.clone()));
    let rig = inproc::Rig { dir, mock, ops };
    // Whichever request the fault cuts (run one's step may not reach the provider), the same text.
    rig.script(json!({"responses": [reply_script("answer", 400), reply_script("answer", 0)]}));
    let first = rig.call("session.send", send("one")).unwrap();
    let run1 = first["run_id"].as_str().unwrap().to_string();
    storage.fail(FaultOp::Sync, 0, FaultKind::Eio);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !storage.tripped() {
        assert!(Instant::now() < deadline, "the step's fsync never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let refused = rig.call("session.send", send("two")).expect_err("the device still fails");
    assert_eq!(refused.code, "open_failed", "{refused:?}");
    assert_eq!(refused.detail.as_ref().and_then(|d| d.get("class")).cloned(), Some(json!("transient")));
    storage.clear();
    let third = rig.call("session.send", send("three")).unwrap();
    let run3 = third["run_id"].as_str().unwrap().to_string();
    rig.wait_state(&run3, "completed");
    let status = rig.call("run.status", json!({"run_id": run1})).unwrap();
    assert_eq!(status["state"], "interrupted", "{status}");
    assert_eq!(status["error"]["provider_code"], broca::record::STORAGE_FAILED_CODE, "{status}");
    let page = rig.call("session.read", json!({})).unwrap();
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["message"]["content"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["one", "three", "answer"], "run one's durable prompt kept, its undurable answer gone");
}

/// A queued send consumed into its run answers a retract `already_started`, never
/// `not_pending`, however soon after its `RunStarted` the retract comes (and across reopens).
#[test]
fn a_consumed_send_answers_retract_already_started() {
    let rig = rig(Duration::from_millis(200));
    for round in 0..20 {
        rig.script(json!({"responses": [reply_script("first", 30), reply_script("second", 300)]}));
        let a = rig.call("session.send", send(&format!("a{round}"))).unwrap();
        let b = rig.call("session.send", send(&format!("b{round}"))).unwrap();
        assert_eq!(b["state"], "pending", "{b}");
        let sub = b["submission_id"].as_str().unwrap().to_string();
        let run_b = format!("run-{sub}");
        // Retract as soon as B's run exists.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = rig.call("run.status", json!({"run_id": run_b})).unwrap();
            if status["state"] == "active" {
                break;
            }
            assert!(Instant::now() < deadline, "{status}");
        }
        let answer = rig.call("session.retract", json!({"submission_id": sub})).unwrap();
        assert_eq!(answer, json!({"retracted": false, "reason": "already_started"}), "round {round}");
        rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
        rig.wait_state(&run_b, "completed");
        if round % 2 == 1 {
            // Let the session close, so the next round reopens it from the store.
            let deadline = Instant::now() + Duration::from_secs(10);
            while rig.ops.registry.is_open(&key()) {
                assert!(Instant::now() < deadline, "round {round}: the idle session never closed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A small tmpfs mounted for one test (unmounted when dropped); `Err` says why it cannot be.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: u64) -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs refused: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(SmallDisk { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Fills the file system under `dir` until a write fails with ENOSPC; the filler's path.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    for chunk in [64 << 10, 4 << 10, 1] {
        let bytes = vec![0u8; chunk];
        while f.write_all(&bytes).is_ok() {}
    }
    path
}

/// `io_fault_*` on a real full disk (a small tmpfs state root; skipped by name where this
/// machine refuses the mount): filled while a run streams, its answer's WAL write fails with
/// ENOSPC; sends are refused transiently while the disk is full and reads still serve every
/// durable message; once space is freed the session reopens, seals the cut run with the storage
/// error, and serves new sends.
#[test]
fn io_fault_a_full_disk_mid_run_refuses_sends_keeps_what_was_durable_and_recovers() {
    let disk = match SmallDisk::mount(8 << 20) {
        Ok(d) => d,
        Err(why) => {
            skip::skip("io_fault_a_full_disk_mid_run_refuses_sends_keeps_what_was_durable_and_recovers", &why);
            return;
        }
    };
    let mock = crate::mock::MockServer::start("127.0.0.1:0").unwrap();
    let storage: Arc<dyn broca::wal::Storage> = Arc::new(broca::wal::FileStorage);
    let ops = inproc::ops_on(disk.dir.path(), mock.base_url(None), Duration::from_secs(5), None, storage);
    let rig = inproc::Rig { dir: tempfile::tempdir().unwrap(), mock, ops };
    let long = "x".repeat(64 << 10);
    rig.script(json!({"responses": [reply_script("answer one", 0), reply_script(&long, 600)]}));
    let one = rig.call("session.send", send("one")).unwrap();
    rig.wait_state(one["run_id"].as_str().unwrap(), "completed");
    let two = rig.call("session.send", send("two")).unwrap();
    let run2 = two["run_id"].as_str().unwrap().to_string();
    // The disk fills while run two's model streams: its 64 KiB answer cannot be written. Sends
    // fit into what the WAL's last page still holds for a while; then one is refused.
    let filler = fill(disk.dir.path());
    let mut admitted = Vec::new();
    let refused = loop {
        let prompt = format!("queued {}", admitted.len());
        match rig.call("session.send", send(&prompt)) {
            Err(refusal) => break refusal,
            Ok(_) => admitted.push(prompt),
        }
        assert!(admitted.len() < 500, "sends were never refused on a full disk");
    };
    assert_eq!(refused.detail.as_ref().and_then(|d| d.get("class")).cloned(), Some(json!("transient")), "{refused:?}");
    let page = rig.call("session.read", json!({})).unwrap();
    let texts = |page: &serde_json::Value| -> Vec<String> {
        let messages = page["messages"].as_array().cloned().unwrap_or_default();
        messages.iter().filter_map(|m| m["message"]["content"][0]["text"].as_str().map(String::from)).collect()
    };
    assert_eq!(texts(&page)[..3], ["one", "answer one", "two"], "every durable message still reads");
    // Space again: the session reopens, seals the cut run, drains what it admitted, serves more.
    std::fs::remove_file(&filler).unwrap();
    // A transient refusal is retried, as any client does.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        match rig.call("session.send", send("after")) {
            Ok(reply) => break reply,
            Err(e) => assert!(Instant::now() < deadline, "the session never recovered: {e:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let status = loop {
        let status = rig.call("run.status", json!({"run_id": run2})).unwrap();
        if status["state"] != "active" {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["state"], "interrupted", "{status}");
    let code = status["error"]["provider_code"].as_str().unwrap_or_default().to_string();
    assert!(
        [broca::record::STORAGE_FAILED_CODE, broca::record::ORPHAN_PROVIDER_CODE].contains(&code.as_str()),
        "{status}"
    );
    let run_after = after["run_id"]
        .as_str()
        .map(String::from)
        .or_else(|| after["submission_id"].as_str().map(|s| format!("run-{s}")));
    rig.wait_state(&run_after.unwrap(), "completed");
    let all = texts(&rig.call("session.read", json!({"limit": 1000})).unwrap());
    for prompt in admitted.iter().chain(std::iter::once(&"after".to_string())) {
        assert_eq!(all.iter().filter(|t| *t == prompt).count(), 1, "{prompt} once: {all:?}");
    }
    assert!(!all.iter().any(|t| t.len() == long.len()), "run two's undurable answer is gone");
}

/// A session's actor takes at most `MAILBOX` waiting commands: one more is refused with a
/// transient `open_failed`, never queued without bound; a closed session's registry slot is
/// dropped, so the registry holds only sessions in use.
#[test]
fn a_full_mailbox_is_refused_transiently_and_a_closed_session_leaves_the_registry() {
    use broca::wal::storage::crash::CrashStorage;
    let storage = CrashStorage::new();
    let dir = tempfile::tempdir().unwrap();
    let mock = crate::mock::MockServer::start("127.0.0.1:0").unwrap();
    let ops =
        inproc::ops_on(dir.path(), mock.base_url(None), Duration::from_millis(200), None, Arc::new(storage.clone()));
    let rig = inproc::Rig { dir, mock, ops };
    rig.script(json!({"responses": [reply_script("answer", 300)]}));
    let registry = &rig.ops.registry;
    rig.call("session.send", send("one")).unwrap();
    // The device stops answering: the actor waits inside its next commit, so commands pile up.
    let hold = storage.hold_syncs();
    let deadline = Instant::now() + Duration::from_secs(10);
    while hold.waiting() == 0 {
        assert!(Instant::now() < deadline, "the run never reached a commit");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut refused = None;
    for _ in 0..=broca::actor::MAILBOX {
        if let Err(e) = registry.open(&key()) {
            refused = Some(e);
            break;
        }
    }
    drop(hold);
    let refusal = refused.expect("the mailbox filled").refusal();
    assert_eq!(refusal.code, "open_failed", "{refusal:?}");
    assert_eq!(refusal.detail.as_ref().and_then(|d| d.get("class")).cloned(), Some(json!("transient")));
    let until = Instant::now() + Duration::from_secs(10);
    while registry.slots() > 0 {
        assert!(Instant::now() < until, "the closed session's slot stayed in the registry");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!registry.is_open(&key()));
}

#[test]
fn history_pages_backward_and_forward_raw_and_as_display_rows() {
    let rig = rig(Duration::from_secs(5));
    let script = json!({"responses": [reply_script("first", 0), reply_script("second", 0), reply_script("third", 0)]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    let never = rig.call("session.history", json!({})).unwrap();
    assert_eq!(never, json!({"messages": [], "history_version": 1, "incarnation": "log-1"}));
    for prompt in ["one", "two", "three"] {
        let sent = rig.call("session.send", send(prompt)).unwrap();
        rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    }
    let ordinals = |page: &serde_json::Value| -> Vec<u64> {
        page["messages"].as_array().unwrap().iter().map(|m| m["ordinal"].as_u64().unwrap()).collect()
    };
    // The newest page, then older pages by cursor: no overlap, no gap, an explicit end.
    let newest = rig.call("session.history", json!({"limit": 4})).unwrap();
    assert_eq!(ordinals(&newest), [3, 4, 5, 6]);
    assert!(newest.get("newer").is_none(), "nothing newer: {newest}");
    let older = rig.call("session.history", json!({"cursor": newest["older"], "limit": 4})).unwrap();
    assert_eq!(ordinals(&older), [1, 2]);
    assert!(older.get("older").is_none(), "nothing older: {older}");
    let back = rig.call("session.history", json!({"cursor": older["newer"], "limit": 4})).unwrap();
    assert_eq!(ordinals(&back), [3, 4, 5, 6]);
    // Seeks by mid and ordinal; entries match session.read's.
    let from = rig.call("session.history", json!({"from_mid": "m2", "limit": 2})).unwrap();
    assert_eq!(ordinals(&from), [2, 3]);
    let read = rig.call("session.read", json!({"from_ordinal": 2, "limit": 2})).unwrap();
    for (h, r) in from["messages"].as_array().unwrap().iter().zip(read["messages"].as_array().unwrap()) {
        for k in ["ordinal", "mid", "message", "written_at", "role"] {
            assert_eq!(h[k], r[k], "{k}");
        }
    }
    assert_eq!(from["incarnation"], read["incarnation"]);
    let before = rig.call("session.history", json!({"before_ordinal": 1})).unwrap();
    assert_eq!(ordinals(&before), Vec::<u64>::new());
    assert!(before.get("older").is_none());
    assert_eq!(ordinals(&rig.call("session.history", json!({"from_ordinal": 0, "limit": 1})).unwrap()), [1]);
    let code = |params: serde_json::Value| rig.call("session.history", params).unwrap_err();
    assert_eq!(code(json!({"from_ordinal": 9})).code, "unknown_ordinal");
    assert_eq!(code(json!({"before_mid": "m9"})).code, "unknown_mid");
    let other = code(json!({"cursor": "h1.0000.older.2"}));
    assert_eq!(other.code, "cursor_expired");
    let field = |e: broca::wire::Refusal| e.detail.and_then(|d| d.get("field").cloned());
    assert_eq!(field(code(json!({"cursor": "garbage"}))), Some(json!("cursor")));
    assert_eq!(field(code(json!({"from_mid": "m1", "from_ordinal": 1}))), Some(json!("from_ordinal")));
    assert_eq!(field(code(json!({"view": "model"}))), Some(json!("view")));
    assert_eq!(field(code(json!({"form": "pretty"}))), Some(json!("form")));
    let limits = json!({"arguments_bytes": 2, "result_bytes": 2, "error_result_bytes": 2});
    assert_eq!(field(code(json!({"limits": limits}))), Some(json!("limits")));
    assert_eq!(field(code(json!({"form": "display", "media": "inline"}))), Some(json!("media")));
    pin::assert_golden("session_history.raw.json", &newest.to_string(), None);
    // Display rows: role, joined text, keyed parts, the producing model on assistant rows.
    let display = rig.call("session.history", json!({"form": "display", "limit": 2, "limits": limits})).unwrap();
    let rows: Vec<&serde_json::Value> = display["messages"].as_array().unwrap().iter().map(|m| &m["row"]).collect();
    assert_eq!((rows[0]["role"].clone(), rows[0]["text"].clone()), (json!("user"), json!("three")));
    assert_eq!(rows[1]["model"], "mock/echo-chat", "{display}");
    assert_eq!(rows[1]["parts"][0], json!({"type": "text", "part": "p0", "text": "third"}));
    pin::assert_golden("session_history.display.json", &display.to_string(), None);
}

#[test]
fn history_refuses_a_page_whose_entry_has_no_recorded_time() {
    // A WAL an older build wrote: its answers carry no write time (message-times/v1 came later).
    let rig = rig(Duration::from_secs(5));
    let wal = rig.ops.registry.shared().wal_path(&key());
    std::fs::create_dir_all(wal.parent().unwrap()).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/wal/queue_steer_cancel.wal"), &wal).unwrap();
    let e = rig.call("session.history", json!({})).unwrap_err();
    assert_eq!(e.code, "history_unrepresentable");
    let detail = e.detail.clone().unwrap();
    assert_eq!(
        (detail.get("field").cloned(), detail.get("class").cloned()),
        (Some(json!("written_at")), Some(json!("permanent")))
    );
    pin::assert_golden("session_history.unrepresentable.json", &e.to_json(), None);
    // session.read stays the recovery path: the same entries, written_at absent where unknown.
    let page = rig.call("session.read", json!({})).unwrap();
    assert!(page["messages"].as_array().unwrap().iter().any(|m| m.get("written_at").is_none()));
}

/// The scope's owner is a session owner beside the route's own principal, and is admitted on
/// any route; a caller merely under the same scope is not (llm-runner §6.2). The route stamps
/// are set by hand here; `e2e_owners.rs` takes them from the real daemon.
#[test]
fn a_scope_owner_owns_the_session_its_scope_froze_and_a_caller_under_the_scope_does_not() {
    use broca::ops::Route;
    use broca::owner::Caller;
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [reply_script("scoped", 0)]}));
    let route = |principal: &str, scope_owner: Option<&str>| Route {
        caller: Caller::local(principal, scope_owner, None),
        ..Route::direct(key())
    };
    let call = |route: &Route, method: &str, params: serde_json::Value| {
        let (tx, rx) = crossbeam_channel::bounded(1);
        rig.ops.handle_on(route, method, params, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).expect("an answer")
    };
    let carrier = route("reserved:carrier", Some("reserved:lead"));
    let sent = call(&carrier, "session.send", send("under the scope")).unwrap();
    rig.wait_state(sent["run_id"].as_str().unwrap(), "completed");
    for owner in [route("reserved:lead", None), carrier.clone()] {
        assert_eq!(call(&owner, "session.baseline", json!({})).unwrap()["state"], "ready", "{owner:?}");
    }
    let sibling = route("reserved:sibling", Some("reserved:lead"));
    let refused = call(&sibling, "session.baseline", json!({})).unwrap_err();
    assert_eq!((refused.code.as_str(), refused.detail.is_some()), ("scope_owner_mismatch", true), "{refused:?}");
    assert!(call(&sibling, "session.head", json!({})).unwrap().get("sender").is_none(), "no grant for the sibling");
}

/// llm-runner §9.3.2 (`service_tier` group): `mock/echo-chat` is an OpenAI Chat route, which
/// declares `fast` (rendered `service_tier: "priority"`) with the served level reported. A
/// level the route does not declare (`ultrafast`) and an unknown one are refused by name before
/// any model call, writing nothing; so is `tool_providers` (spec §4 gives it no meaning: tools
/// from other modules are a plan's `tool_items`). A fast run reports the level it applied and
/// the one the provider stated; an interrupt omitting the level inherits it, one naming
/// `standard` does not.
#[test]
fn service_tier_is_applied_reported_inherited_and_refused_by_name() {
    let rig = rig(Duration::from_secs(5));
    let script = json!({"responses": [reply_script("fast", 0), reply_script("inherited", 0), reply_script("std", 0)]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    let before = rig.footprint(&key());
    let mut ultra = send("ultra one");
    ultra["service_tier"] = json!("ultrafast");
    let refused = rig.call("session.send", ultra).unwrap_err();
    pin::assert_golden("session_send.service_tier_unsupported.json", &refused.to_json(), None);
    let mut odd = send("odd one");
    odd["service_tier"] = json!("priority");
    let unknown = rig.call("session.send", odd).unwrap_err();
    pin::assert_golden("session_send.service_tier_unknown.json", &unknown.to_json(), None);
    let mut providers = send("providers");
    providers["tool_providers"] = json!([{"module": "aft"}]);
    let named = rig.call("session.send", providers).unwrap_err();
    pin::assert_golden("session_send.tool_providers.json", &named.to_json(), None);
    assert_eq!(rig.footprint(&key()).diff(&before), None, "refused sends wrote nothing");
    assert!(rig.mock.requests("default").is_empty(), "no model call");
    let usage = |run_id: &str| rig.call("run.result", json!({"run_id": run_id})).unwrap()["usage"].clone();
    let mut fast = send("fast one");
    fast["service_tier"] = json!("fast");
    let run1 = rig.call("session.send", fast).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run1, "completed");
    let u1 = usage(&run1);
    assert_eq!((&u1["service_tier_applied"], &u1["service_tier_served"]), (&json!("fast"), &json!("fast")), "{u1}");
    let interrupt = json!({"prompt": "inherited", "delivery": "interrupt", "send_id": "inherited"});
    let run2 = rig.call("session.send", interrupt).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run2, "completed");
    assert_eq!(usage(&run2)["service_tier_applied"], "fast");
    let standard = json!({"prompt": "std", "delivery": "interrupt", "send_id": "std", "service_tier": "standard"});
    let run3 = rig.call("session.send", standard).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run3, "completed");
    let u3 = usage(&run3);
    assert!(u3.get("service_tier_applied").is_none() && u3.get("service_tier_served").is_none(), "{u3}");
    let tiers: Vec<Value> = rig
        .mock
        .requests("default")
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["service_tier"].clone())
        .collect();
    assert_eq!(tiers, [json!("priority"), json!("priority"), Value::Null]);
    // A fast run's config needs a reader that knows the level (must-understand).
    let features: Vec<Vec<String>> = rig
        .records()
        .into_iter()
        .filter_map(|r| match r {
            broca::record::Record::RunStarted(s) => Some(s.config.features().iter().map(|f| f.to_string()).collect()),
            _ => None,
        })
        .collect();
    assert_eq!(
        features.iter().map(|f| f.contains(&"service-tier/v1".to_owned())).collect::<Vec<_>>(),
        [true, true, false]
    );
}

/// Spec §4 `tool_choice`, `work_class` and `context_limit`: read and checked (malformed ones,
/// and a limit above the model's context, refused by name, writing nothing), frozen on the run,
/// `tool_choice` rendered on the model request (`mock/echo-chat` is an OpenAI Chat route) and
/// the other two never, all taken from the frozen config by an interrupt that omits them (spec
/// §4 line 152).
#[test]
fn tool_choice_is_frozen_rendered_and_inherited() {
    let rig = rig(Duration::from_secs(5));
    let script = json!({"responses": [reply_script("first", 0), reply_script("second", 0)]});
    rig.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    let before = rig.footprint(&key());
    let mut bad = send("bad");
    bad["tool_choice"] = json!({"tool": ""});
    let refused = rig.call("session.send", bad).unwrap_err();
    pin::assert_golden("session_send.tool_choice_invalid.json", &refused.to_json(), None);
    assert_eq!(rig.footprint(&key()).diff(&before), None);
    let mut too_big = send("too big");
    too_big["context_limit"] = json!(40_000);
    let above = rig.call("session.send", too_big).unwrap_err();
    pin::assert_golden("session_send.context_limit_above_model.json", &above.to_json(), None);
    let mut odd_class = send("odd class");
    odd_class["work_class"] = json!("Has Spaces");
    assert_eq!(
        rig.call("session.send", odd_class).unwrap_err().to_json(),
        r#"{"code":"invalid_params","message":"invalid params: work_class: 1-64 characters of [a-z0-9_.:-] (a classification, never content)","detail":{"field":"work_class"}}"#
    );
    assert_eq!(rig.footprint(&key()).diff(&before), None);
    let tools = json!([{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}]);
    let mut first = send("first");
    first["tools"] = tools.clone();
    first["tool_choice"] = json!({"tool": "read"});
    first["work_class"] = json!("batch.nightly");
    first["context_limit"] = json!(16_000);
    let run1 = rig.call("session.send", first).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run1, "completed");
    // An interrupt omitting model, tools and tool_choice takes them all from the frozen config.
    let interrupt = json!({"prompt": "second", "delivery": "interrupt", "send_id": "second"});
    let second = rig.call("session.send", interrupt).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&second, "completed");
    let bodies: Vec<Value> =
        rig.mock.requests("default").iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    for body in &bodies {
        assert_eq!(body["tool_choice"], json!({"type": "function", "function": {"name": "read"}}), "{body}");
        assert!(body.get("work_class").is_none() && body.get("context_limit").is_none(), "never rendered: {body}");
    }
    // Both runs froze work_class and context_limit (the interrupt inherited them).
    let frozen: Vec<Value> = rig
        .records()
        .into_iter()
        .filter_map(|r| match r {
            broca::record::Record::RunStarted(s) => Some(serde_json::to_value(&s.config).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(frozen.len(), 2);
    for config in &frozen {
        assert_eq!(
            (&config["work_class"], &config["context_limit"]),
            (&json!("batch.nightly"), &json!(16_000)),
            "{config}"
        );
    }
}

/// Spec §4 `context_limit` enforced: once the session's next request is known to need at least
/// the run's limit (the last step's reported input and visible output), the run ends before
/// sending it, class `context_overflow`, code `context_limit_reached`, with nothing sent. A
/// later send naming a larger limit (at most the model's window) runs.
#[test]
fn context_limit_ends_a_run_before_a_request_over_it() {
    let rig = rig(Duration::from_secs(5));
    let big = |text: &str| json!({"events": [{"text": text}, {"usage": {"input": 15_000, "output": 1_500}}, {"finish": "stop"}]});
    rig.script(json!({"responses": [big("first"), big("third")]}));
    let mut first = send("first");
    first["context_limit"] = json!(16_000);
    let run1 = rig.call("session.send", first).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run1, "completed");
    // The interrupt inherits the limit; 15,000 + 1,500 tokens are already over it.
    let interrupt = json!({"prompt": "second", "delivery": "interrupt", "send_id": "second"});
    let run2 = rig.call("session.send", interrupt).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run2, "error");
    let status = rig.call("run.status", json!({"run_id": run2})).unwrap();
    let error = &status["error"];
    assert_eq!(
        (&error["class"], &error["provider_code"]),
        (&json!("context_overflow"), &json!("context_limit_reached")),
        "{status}"
    );
    assert_eq!(rig.mock.requests("default").len(), 1, "nothing was sent for the second run");
    let mut third = json!({"prompt": "third", "delivery": "interrupt", "send_id": "third"});
    third["context_limit"] = json!(32_000);
    let run3 = rig.call("session.send", third).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run3, "completed");
    assert_eq!(rig.mock.requests("default").len(), 2);
}

/// A step that reaches its run's `context_limit` while asking for tool calls dispatches none of
/// them: each is sealed never-executed, and the run ends before the request that would carry
/// their results.
#[test]
fn context_limit_seals_the_calls_of_a_step_that_reached_it() {
    let rig = rig(Duration::from_secs(5));
    let script = json!({"responses": [
        {"events": [{"tool_call": {"id": "c1", "name": "look", "arguments": {}}},
                    {"usage": {"input": 15_000, "output": 1_500}}, {"finish": "tool_calls"}]},
        {"events": [{"text": "never asked"}, {"finish": "stop"}]},
    ]});
    rig.script(script);
    let mut first = send("look around");
    first["context_limit"] = json!(16_000);
    let run = rig.call("session.send", first).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run, "error");
    assert_eq!(rig.mock.requests("default").len(), 1, "no request after the limit");
    let page = rig.call("session.read", json!({})).unwrap();
    let messages = page["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);
    let sealed = messages[2]["message"].to_string();
    assert!(sealed.contains("not executed: the run reached its context_limit"), "{sealed}");
}
