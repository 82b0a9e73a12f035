//! broca as a real subc module: the subc daemon (the `subc-daemon` library, booted in this
//! process) supervises the broca binary, and the official consumer SDK (`subc-client-rs`) calls it.
//! The rig is [`support::Harness`].
//!
//! One test, because stopping the in-process daemon means sending SIGTERM to this process (the
//! daemon's tokio signal handler catches it and runs the shutdown sequence of `subc-wire.md` §16).
//! Every wait is bounded.

use broca_mock::mock;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use broca::subc::{self, BindRequest, ConnectionEnd, ControlRequest, Handler, Outbound, Route};
use cortexkit_role_llm_runner::describe::RoleDescribe;
use crossbeam_channel::{Receiver, Sender};
use serde_json::{json, Value};
use subc_client_rs::{CallError, SubcConsumer, SubscribeOptions, SubscriptionEnd};
use subc_protocol::manifest::{
    Concurrency, ManagementOperation, ManagementOperationKind, ModuleManifest, ProviderRole,
};
use subc_protocol::{BindIdentity, ErrorBody, Flags, Principal, RouteTarget};
use support::{call_options, control, send_params, Harness, MODULE_ID, STEP};

/// A module served in this process by `broca::subc`, to drive the io layer through the daemon.
const PROBE_ID: &str = "subc-io-probe";

/// Everything asked of the running module, through the consumer SDK.
fn exercise(h: &Harness) {
    let entry = h.wait_registered();
    assert!(entry.nonce_verified, "the launch nonce was read and sent: {entry:?}");
    assert!(entry.control_ops.iter().any(|op| op == "health.check"), "{:?}", entry.control_ops);
    let provides = entry.capabilities.as_ref().map(|c| c.provides.clone()).unwrap_or_default();
    assert_eq!(
        provides,
        ["llm-runner/v1", "classifier/v1", "agent-run-scopes/v1", "flow-scopes/v1"].map(str::to_owned).to_vec()
    );

    let session = h.session("test-harness", "session-1", None);
    let describe = br#"{"method":"role.describe","params":{}}"#.to_vec();
    let reply = session.call_raw(describe).unwrap();
    let raw: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(raw.as_object().unwrap().keys().collect::<Vec<_>>(), vec!["result"], "{raw}");
    let answer: RoleDescribe = cortexkit_role_llm_runner::wire::read_reply(&reply).unwrap();
    let major = answer.major("llm-runner/v1").expect("the llm-runner/v1 major");
    assert!(major.serves("role.describe"), "{answer:?}");
    assert_eq!(answer.implementation_version, env!("CARGO_PKG_VERSION"));

    let (code, body) = session.refused("nope", json!({}));
    assert_eq!(code, "unknown_method", "{body}");
    assert_eq!(body["detail"]["method"], "nope");

    let health = h.block_on(h.client().consumer().supervisor_health_probe(MODULE_ID)).unwrap();
    assert_eq!(health.status, subc_protocol::session::HealthStatus::Ok);
    let metrics = health.metrics.expect("health metrics");
    assert_eq!(metrics["management_ops"]["role.describe"], 1, "{metrics}");
    assert_eq!(metrics["management_ops"]["session.send"], 0, "every served op is reported: {metrics}");
    for gauge in ["session_reads", "actor_opens", "runs_in_flight", "opening", "closing", "reverse_requests_refused"] {
        assert!(metrics[gauge].is_u64(), "{gauge} is reported: {metrics}");
    }
}

fn slow_reply(text: &str) -> Value {
    json!({"events": [{"delay_ms": 40}, {"text": text}, {"delay_ms": 40}, {"text": "."}, {"usage": {"input": 9, "output": 3}}, {"finish": "stop"}]})
}

/// Sessions end to end: two observers and a driver, resumption from a cursor, reads and status,
/// and a SIGKILL of broca mid-run that the daemon answers with a respawn.
fn exercise_sessions(h: &Harness) {
    let s1 = h.session("e2e-harness", "s1", None);
    h.install(json!({"responses": [slow_reply("Paris"), slow_reply("Two million")]}));
    let mut a = s1.subscribe(json!("start"));
    let mut b = s1.subscribe(json!("start"));
    let first = s1.call("session.send", send_params("Capital of France?")).unwrap();
    assert_eq!(first["state"], "active", "{first}");
    let run1 = first["run_id"].as_str().unwrap().to_owned();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    a.until_finished(&run1, &mut ea);
    b.until_finished(&run1, &mut eb);
    // A third observer disconnects in the middle of the second run and resumes from its cursor.
    let mut m = s1.subscribe(json!("start"));
    let second = s1.call("session.send", send_params("Population?")).unwrap();
    let run2 = second["run_id"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| format!("run-{}", second["submission_id"].as_str().unwrap()));
    let mut em = Vec::new();
    m.until(&mut em, |v| v["unit"]["type"] == "step_started" && v["unit"]["run_id"] == json!(run2));
    m.unsubscribe();
    let last_cursor = control(&em).last().unwrap()[0].clone();
    let mut m2 = s1.subscribe(last_cursor);
    m2.until_finished(&run2, &mut em);
    a.until_finished(&run2, &mut ea);
    b.until_finished(&run2, &mut eb);
    assert_eq!(control(&em), control(&ea), "a mid-run resume has no gap and no duplicate");
    assert_eq!(control(&ea), control(&eb), "both observers see the same control stream");
    assert!(ea.iter().any(|e| e["kind"] == "display" && e["event"]["delta"] == "Paris"), "the display lane is live");
    let seqs: Vec<u64> = ea.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "seq from 1 with no jumps");
    // An observer that reconnects from a cursor gets exactly the rest.
    let all = control(&ea);
    let cursor = all[4][0].clone();
    let mut c = s1.subscribe(cursor);
    let mut ec = Vec::new();
    c.until_finished(&run2, &mut ec);
    assert_eq!(control(&ec), all[5..].to_vec(), "no gap, no duplicate after a cursor");
    // A subscriber that never reads (on its own client connection, which the daemon may close
    // once its egress budget is spent) holds nothing up: the run completes and a reading
    // observer still gets every delta and unit.
    let stalled_client = h.connect();
    let _stalled = stalled_client.session("e2e-harness", "s1").subscribe(json!("live"));
    let mut burst: Vec<Value> = (0..300).map(|i| json!({"text": format!("w{i} ")})).collect();
    burst.push(json!({"finish": "stop"}));
    h.install(json!({"responses": [{"events": burst}]}));
    let busy = s1.call("session.send", send_params("Say three hundred words")).unwrap();
    let run_busy = busy["run_id"].as_str().unwrap().to_owned();
    let mut eburst = Vec::new();
    a.until_finished(&run_busy, &mut eburst);
    let streamed: String =
        eburst.iter().filter(|e| e["kind"] == "display").filter_map(|e| e["event"]["delta"].as_str()).collect();
    let gaps = eburst.iter().filter(|e| e["event"]["type"] == "display_gap").count();
    if gaps == 0 {
        assert_eq!(streamed, (0..300).map(|i| format!("w{i} ")).collect::<String>());
    }
    let answer = control(&eburst).into_iter().find(|u| u[1]["type"] == "assistant_message").expect("the answer");
    assert!(answer[1]["message"]["content"][0]["text"].as_str().unwrap().starts_with("w0 w1 w2"));

    let page = s1.call("session.read", json!({})).unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 6, "{page}");
    // A prompt whose message could never be read back whole is refused at admission, naming the
    // limit; nothing is written.
    let big = h.session("e2e-harness", "big", None);
    let (code, refused) = big.call("session.send", send_params(&"z".repeat(4_300_000))).unwrap_err();
    assert_eq!((code.as_str(), refused["detail"]["field"].as_str()), ("invalid_params", Some("prompt")), "{refused}");
    assert_eq!(refused["detail"]["limit"], broca::wire::send::MAX_MESSAGE_JSON_BYTES);
    assert!(!big.wal_path().exists(), "a refused send writes nothing");
    // A model answer too large for any reply frame is refused by name; the route keeps serving.
    h.install(json!({"responses": [{"events": [{"text": "z".repeat(4_300_000)}, {"finish": "stop"}]}]}));
    let huge = big.call("session.send", send_params("Noted")).unwrap();
    // Its assistant_message unit cannot travel either: the stream ends with the typed error.
    let mut big_sub = big.subscribe(json!("start"));
    while big_sub.next().is_some() {}
    match big_sub.ended() {
        SubscriptionEnd::Error(body) => {
            assert_eq!(body.code, "subscribe_unit_undeliverable", "{body:?}");
            let detail = body.detail.unwrap();
            assert_eq!((detail["reason"].as_str(), detail["limit"].as_u64()), (Some("too_large"), Some(4_194_304)));
            // The streamed delta (a display frame: no cursor) or the answer's unit (a control
            // frame, with its cursor) is the first that cannot travel.
            assert!(detail["cursor"].is_null() || detail["cursor"]["wal_seq"].as_u64().is_some(), "{detail}");
        }
        other => panic!("expected subscribe_unit_undeliverable, got {other:?}"),
    }
    let huge_run = huge["run_id"].as_str().unwrap().to_owned();
    big.wait_run(&huge_run, "completed");
    let (code, refused) = big.call("session.read", json!({"from_ordinal": 2, "limit": 1})).unwrap_err();
    assert_eq!(code, "reply_too_large", "{refused}");
    assert_eq!(refused["detail"]["subject"]["ordinal"], 2);
    let first = big.call("session.read", json!({"from_ordinal": 0, "limit": 1})).unwrap();
    assert_eq!(first["messages"][0]["message"]["content"][0]["text"], "Noted");
    assert_eq!(s1.call("run.status", json!({"run_id": run1})).unwrap()["state"], "completed");
    let (code, _) = s1.call("session.read", json!({"direction": "back"})).unwrap_err();
    assert_eq!(code, "invalid_params");

    // SIGKILL broca mid-run: the daemon respawns it, the run reads interrupted with its
    // diagnostic, and the session takes a new send.
    let stall = json!({"responses": [{"events": [{"text": "thinking"}, {"delay_ms": 20000}, {"finish": "stop"}]}]});
    h.install(stall);
    let third = s1.call("session.send", send_params("Take your time")).unwrap();
    let run3 = third["run_id"].as_str().unwrap().to_owned();
    a.until(&mut Vec::new(), |v| v["kind"] == "display");
    let pid = h.kill_broca();
    h.wait_respawn(pid);
    // Calls racing the restart may meet the dead incarnation's closed route; retry them.
    let until = Instant::now() + STEP;
    let status = loop {
        match s1.try_call("run.status", json!({"run_id": run3})) {
            Ok(s) => break s,
            Err(e) if Instant::now() < until => {
                log::debug!("run.status while broca restarts: {e:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("run.status after the restart: {e:?}"),
        }
    };
    assert_eq!(status["state"], "interrupted", "{status}");
    // The durable interrupt reason (llm-runner §6.5), the same on run.status and run.result.
    assert_eq!(status["reason"], "runner_crash", "{status}");
    assert_eq!(s1.call("run.result", json!({"run_id": run3})).unwrap()["reason"], "runner_crash");
    h.install(json!({"responses": [slow_reply("Back")]}));
    let fourth = s1.call("session.send", send_params("Still there?")).unwrap();
    let run4 = fourth["run_id"].as_str().unwrap().to_owned();
    let mut d = s1.subscribe(json!("start"));
    let mut ed = Vec::new();
    d.until_finished(&run4, &mut ed);
    let units = control(&ed);
    let diag =
        units.iter().find(|u| u[1]["type"] == "error" && u[1]["run_id"] == json!(run3)).expect("the crash diagnostic");
    assert_eq!(diag[1]["error"]["provider_code"], "previous_process_ended_unsealed");
}

/// What the probe's handler saw, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Bound { route: Route, session: String, principal: Option<Principal> },
    Cancel { route: Route, corr: u64 },
    Closed(Route),
    Draining,
    Shutdown,
}

/// A request the handler forwards to the probe's worker thread (the io thread never blocks).
struct Job {
    route: Route,
    corr: u64,
    method: String,
    body: Vec<u8>,
}

struct ProbeHandler {
    jobs: Sender<Job>,
    seen: Sender<Seen>,
}

impl Handler for ProbeHandler {
    fn on_route_bound(&mut self, bind: BindRequest) {
        let _ = self.seen.send(Seen::Bound {
            route: bind.route,
            session: bind.identity.session,
            principal: bind.principal,
        });
    }
    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        let method = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["method"].as_str().map(str::to_owned));
        let _ = self.jobs.send(Job { route, corr, method: method.unwrap_or_default(), body });
    }
    fn on_cancel(&mut self, route: Route, corr: u64) {
        let _ = self.seen.send(Seen::Cancel { route, corr });
        let _ = self.jobs.send(Job { route, corr, method: "cancel".into(), body: Vec::new() });
    }
    fn on_route_closed(&mut self, route: Route) {
        let _ = self.seen.send(Seen::Closed(route));
    }
    fn on_control(&mut self, request: ControlRequest) {
        match request {
            ControlRequest::HealthCheck { .. } => {}
            _ => {
                let _ = self.seen.send(Seen::Draining);
            }
        }
    }
    fn on_shutdown(&mut self) {
        let _ = self.seen.send(Seen::Shutdown);
    }
}

/// The probe's worker: answers each method through `Outbound`, from its own thread.
fn probe_worker(out: Outbound, jobs: Receiver<Job>) {
    let limit = out.frame_limit() - subc::frame::HEADER_LEN;
    for Job { route, corr, method, body } in jobs {
        let _ = match method.as_str() {
            "echo" => out.reply(route, corr, body),
            "exact" => out.reply(route, corr, vec![b'x'; limit]),
            "big" => out.reply(route, corr, vec![b'x'; limit + 1]),
            "twice" => {
                let _ = out.reply(route, corr, b"first".to_vec());
                out.reply(route, corr, b"second".to_vec())
            }
            "stream" => {
                for event in ["a", "b", "c"] {
                    out.stream_data(route, corr, event.as_bytes().to_vec()).unwrap();
                }
                out.stream_end(route, corr, Vec::new()).unwrap();
                // Both dropped by the io thread: nothing follows a terminal frame.
                let _ = out.stream_data(route, corr, b"late".to_vec());
                out.reply(route, corr, b"late".to_vec())
            }
            "hold" => Ok(()),
            "reverse" => {
                // A reverse request in the module's corr space, deliberately reusing the
                // client's corr: the client must answer it and still get this call's reply.
                let ask = br#"{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{}}"#.to_vec();
                out.reverse_request(route, corr, ask).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                out.reply(route, corr, b"done".to_vec())
            }
            "cancel" => out.error(route, corr, &ErrorBody::new("cancelled", "cancelled by the client")),
            "close" => {
                let _ = out.reply(route, corr, b"closing".to_vec());
                out.close_route(route)
            }
            other => out.error(route, corr, &ErrorBody::new("unknown_method", format!("unknown method {other:?}"))),
        };
    }
}

fn probe_manifest() -> ModuleManifest {
    let operations = ["echo", "exact", "big", "twice", "stream", "hold", "close", "reverse"]
        .iter()
        .map(|name| ManagementOperation {
            name: (*name).into(),
            kind: ManagementOperationKind::Query,
            description: None,
        })
        .collect();
    ModuleManifest::builder(PROBE_ID, "0.0.1")
        .provides(vec![ProviderRole::ManagementSurface {
            operations,
            config_schema: serde_json::json!({"type": "object"}),
            observability: Vec::new(),
            identity_scope: Vec::new(),
            concurrency: Concurrency::ModuleManaged,
        }])
        .build()
}

/// Registers the probe (a self-connecting module, as a hand-started one would) and serves it.
fn start_probe(conn_file: &Path) -> (subc::Running, Receiver<Seen>) {
    let conn = subc::connect(conn_file, probe_manifest(), PROBE_ID).unwrap();
    assert_eq!(conn.hello_ack().negotiated_ver, 2);
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
    let (seen_tx, seen_rx) = crossbeam_channel::unbounded();
    let out = conn.outbound();
    std::thread::spawn(move || probe_worker(out, jobs_rx));
    // Test-only: a real authorizer decides on the stamped principal and scope, never on the
    // opener's unattested identity. This one refuses a named session to exercise the refusal path.
    let authorizer = |bind: &BindRequest| match bind.identity.session.as_str() {
        "refuse-me" => Err(ErrorBody::new("not_authorized", "the probe refuses this session")),
        _ => Ok(()),
    };
    let running = conn.start(ProbeHandler { jobs: jobs_tx, seen: seen_tx }, authorizer).unwrap();
    (running, seen_rx)
}

fn next_seen(seen: &Receiver<Seen>) -> Seen {
    seen.recv_timeout(STEP).expect("the probe saw nothing within the step")
}

/// The io layer through the real daemon: binds, replies, limits, one terminal, streams, cancel,
/// refusal and module-side route close.
async fn exercise_probe(consumer: &SubcConsumer, conn_file: &Path, seen: &Receiver<Seen>) {
    let probe = RouteTarget::ManagementSurface { module_id: PROBE_ID.into() };
    let identity = BindIdentity::new("probe-harness", "probe-1");
    let call = |method: &str| {
        let body = serde_json::json!({"method": method, "params": {}}).to_string().into_bytes();
        consumer.call(probe.clone(), identity.clone(), body, call_options())
    };

    let echoed = call("echo").await.unwrap();
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&echoed).unwrap()["method"], "echo");
    let Seen::Bound { route, session, principal } = next_seen(seen) else { panic!("expected the bind first") };
    assert_eq!((session.as_str(), principal), ("probe-1", Some(Principal::Direct)));

    // A reply of exactly the delivered-frame limit (header included) arrives whole.
    assert_eq!(call("exact").await.unwrap().len(), subc_protocol::MAX_DELIVERED_FRAME_LEN - 21);
    // One byte more is replaced by the module's generic refusal; the route stays usable.
    match call("big").await {
        Err(CallError::Module(body)) => {
            assert_eq!(body.code, "response_too_large");
            assert!(body.message.starts_with("module reply of 4194305 bytes"), "{body:?}");
        }
        other => panic!("expected response_too_large, got {other:?}"),
    }
    // A second terminal for one request is dropped; the client sees the first and the route's
    // credit is released exactly once.
    assert_eq!(call("twice").await.unwrap(), b"first");
    assert!(call("echo").await.is_ok());

    let stream_body = br#"{"method":"stream","params":{}}"#.to_vec();
    let mut sub =
        consumer.subscribe(probe.clone(), identity.clone(), stream_body, SubscribeOptions::default()).await.unwrap();
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(STEP, sub.events().recv()).await.expect("stream events") {
        events.push(String::from_utf8(event).unwrap());
    }
    assert_eq!(events, ["a", "b", "c"]);
    assert!(matches!(sub.ended().await, SubscriptionEnd::StreamEnd));

    // Cancel reaches the handler for the open request, which still sends its one terminal.
    let hold_body = br#"{"method":"hold","params":{}}"#.to_vec();
    let held =
        consumer.subscribe(probe.clone(), identity.clone(), hold_body, SubscribeOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.unsubscribe().unwrap();
    let Seen::Cancel { route: cancelled, .. } = next_seen(seen) else { panic!("expected the cancel") };
    assert_eq!(cancelled, route);
    assert!(call("echo").await.is_ok(), "the cancelled request's credit was released");

    // broca's consumer connection (no HELLO): it opens a route to the probe, gets its answer,
    // and refuses the probe's reverse request without mistaking it for that answer.
    let consumer_conn = broca::subc::consumer::Consumer::connect(conn_file, None).unwrap();
    let probe_route =
        consumer_conn.open_route(&probe, &BindIdentity::new("probe-harness", "consumer-1"), STEP).unwrap();
    let body = br#"{"method":"reverse","params":{}}"#;
    assert_eq!(consumer_conn.call(probe_route, body, STEP).unwrap(), b"done");
    assert_eq!(consumer_conn.reverse_requests_refused(), 1);
    assert!(matches!(next_seen(seen), Seen::Bound { ref session, .. } if session == "consumer-1"));
    consumer_conn.close_route(probe_route);
    let closed = next_seen(seen);
    assert!(matches!(closed, Seen::Closed(_)), "the route closed: {closed:?}");

    // A refused bind reaches the opener with the authorizer's code.
    let refused = consumer
        .call(probe.clone(), BindIdentity::new("probe-harness", "refuse-me"), b"{}".to_vec(), call_options())
        .await;
    let err = refused.unwrap_err();
    assert_eq!(err.route_open_refusal().map(|b| b.code.as_str()), Some("not_authorized"), "{err:?}");

    // The module closes a route itself; a new route (another session) still binds and serves.
    assert_eq!(call("close").await.unwrap(), b"closing");
    assert_eq!(next_seen(seen), Seen::Closed(route));
    let other = BindIdentity::new("probe-harness", "probe-2");
    let body = br#"{"method":"echo","params":{}}"#.to_vec();
    assert!(consumer.call(probe.clone(), other, body, call_options()).await.is_ok());
    assert!(matches!(next_seen(seen), Seen::Bound { ref session, .. } if session == "probe-2"));
}

/// `broca` alone or `--subc` without a path is a usage error (2); an unreadable file is 1.
fn refuses_to_start_without_a_connection_file() {
    let run = |args: &[&str]| {
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_broca")).args(args).env_remove("CK_LOG").output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = run(&[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("without --subc"), "{stderr}");
    assert_eq!(run(&["--subc"]).0, Some(2));
    let (code, stderr) = run(&["--subc", "/nonexistent/subc-connection.json"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("connection file /nonexistent/subc-connection.json"), "{stderr}");
}

#[test]
fn broca_serves_under_the_real_daemon_and_exits_zero_on_its_goodbye() {
    refuses_to_start_without_a_connection_file();
    let h = Harness::start();
    exercise(&h);
    exercise_sessions(&h);
    let (probe, seen) = start_probe(&h.connection_file());
    let client = h.connect();
    let probed = h.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), exercise_probe(client.consumer(), &h.connection_file(), &seen))
            .await
    });
    assert!(probed.is_ok(), "the probe scenario timed out");

    // SIGTERM-equivalent stop: the daemon drains, sends GOODBYE, closes, and waits for broca.
    h.stop();

    // The daemon journals every module exit: the SIGKILL above, then the last one, which must be
    // a clean exit 0.
    let exit = h.last_exit().unwrap_or_else(|| {
        panic!("no exit of broca in the journal:\n{:?}\nbroca's log:\n{}", h.journal(), h.broca_log())
    });
    assert_eq!(exit["exit_code"], 0, "{exit}\nbroca's log:\n{}", h.broca_log());
    assert_eq!(exit["disposition"], "daemon_shutdown", "{exit}");

    // The in-process probe saw the drain notice, then the daemon's GOODBYE.
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || tx.send(probe.join()));
    let end = rx.recv_timeout(STEP).expect("the probe's io thread ended");
    assert!(matches!(end, ConnectionEnd::Goodbye), "{end:?}");
    // (The client's route GOODBYE for the last route may land before the drain or not at all.)
    let rest: Vec<Seen> = seen.try_iter().filter(|s| !matches!(s, Seen::Closed(_))).collect();
    assert_eq!(rest, [Seen::Draining, Seen::Shutdown]);
    let log = h.broca_log();
    assert!(log.contains("exiting cleanly: subc said goodbye"), "broca's log:\n{log}");
    // CK_LOG "info,broca.requests=debug": one record per served op, never its parameters.
    assert!(log.contains(r#"op="session.send" session="s1" actor_opened="#), "broca's log:\n{log}");
    assert!(!log.contains("Capital of France"), "request parameters are never logged");
}
