//! broca across two machines: a client on daemon A reaches broca on daemon B through the
//! federation module (`broca-mock fed`, a stand-in for CortexKit's `callosum`), as
//! `fed:<B's machine id>:broca`. The rig (`fed_rig/mod.rs`) runs both daemons as processes of
//! their own, so this target has its own `main`: `--daemon RIG_DIR` is one daemon; otherwise it
//! runs the tests below (a name given on the command line runs the tests containing it;
//! `--list` lists them in libtest's format).

#[path = "fed_rig/mod.rs"]
mod fed_rig;
#[path = "conformance/process.rs"]
mod process;

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use broca::session_key::SessionKey;
use broca::subc::consumer::{CallError, ClientRoute, Consumer, StreamEvent};
use broca_mock::mock::Script;
use fed_rig::{FedOptions, FedRig, CALL};
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

#[path = "mcp_client/mod.rs"]
mod mcp_client;
#[path = "fed_rig/moves_campaign.rs"]
mod moves_campaign;

type Test = (&'static str, fn());

const TESTS: &[Test] = &[
    ("a_client_on_a_reaches_broca_on_b", a_client_on_a_reaches_broca_on_b),
    (
        "an_owner_on_a_drives_a_session_on_b_and_a_stranger_cannot",
        an_owner_on_a_drives_a_session_on_b_and_a_stranger_cannot,
    ),
    (
        "broca_on_b_killed_mid_run_resumes_and_a_resubscriber_on_a_misses_nothing",
        broca_on_b_killed_mid_run_resumes_and_a_resubscriber_on_a_misses_nothing,
    ),
    ("a_dead_stand_in_fails_calls_in_bounded_time", a_dead_stand_in_fails_calls_in_bounded_time),
    ("a_session_moves_between_hosts_through_the_cli", a_session_moves_between_hosts_through_the_cli),
    ("moves_under_load_with_kills_keep_one_writer", moves_under_load_with_kills_keep_one_writer),
    ("broca_mcp_places_sessions_across_hosts", broca_mcp_places_sessions_across_hosts),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, dir] = args.as_slice() {
        if flag == "--daemon" {
            return process::daemon_main(Path::new(dir), "federation daemon");
        }
    }
    if args.iter().any(|a| a == "--list") {
        for (name, _) in TESTS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    // Test clients open routes as plain direct callers (subc-wire.md §20.4).
    for var in ["SUBC_MODULE_ID", "SUBC_LAUNCH_NONCE", "SUBC_LAUNCH_NONCE_FD"] {
        std::env::remove_var(var);
    }
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).try_init();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let chosen: Vec<&Test> = TESTS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let mut failed = Vec::new();
    for (name, test) in &chosen {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(test);
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!("test {name} ... {verdict} ({:.1} s)", started.elapsed().as_secs_f64());
        if outcome.is_err() {
            failed.push(*name);
        }
    }
    let passed = chosen.len() - failed.len();
    println!(
        "\ntest result: {}. {passed} passed; {} failed\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn request(method: &str, params: Value) -> Vec<u8> {
    json!({"method": method, "params": params}).to_string().into_bytes()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The smoke test of the relay: `role.describe` through A equals B's own, a subscription
/// through A streams, and B's stand-in stamped the relayed bind from the link (`direct`, A's
/// machine id).
fn a_client_on_a_reaches_broca_on_b() {
    let rig = FedRig::start(FedOptions::default());
    let root = rig.project_dir("smoke");
    let root_text = root.to_str().expect("a UTF-8 root");
    eprintln!("federation: A={} B={} relaying {}", rig.a.machine_id, rig.b.machine_id, rig.fed_broca());

    // B's own answer, from a client on B.
    let on_b = rig.b.consumer();
    let route_b = on_b
        .open_route_rooted(&FedRig::broca_target(), &BindIdentity::new("fed-smoke", "on-b"), Some(root_text), CALL)
        .unwrap_or_else(|e| panic!("opening broca on B: {e}{}", rig.tails()));
    let describe_b = on_b.call(route_b, &request("role.describe", json!({})), CALL).expect("role.describe on B");

    // The same op through A's re-export.
    let on_a = rig.a.consumer();
    let identity = BindIdentity::new("fed-smoke", "through-a");
    let route_a = on_a
        .open_route_rooted(&rig.fed_target(), &identity, Some(root_text), CALL)
        .unwrap_or_else(|e| panic!("opening {} on A: {e}{}", rig.fed_broca(), rig.tails()));
    let describe_a = match on_a.call(route_a, &request("role.describe", json!({})), CALL) {
        Ok(reply) => reply,
        Err(e) => panic!("role.describe through A: {e}{}", rig.tails()),
    };
    assert_eq!(text(&describe_a), text(&describe_b), "role.describe through A differs from B's own");
    eprintln!("federation: role.describe through A equals B's own ({} bytes)", describe_a.len());

    // A subscription through A, on a route of its own, streams a run started through A.
    let sub_route =
        on_a.open_route_rooted(&rig.fed_target(), &identity, Some(root_text), CALL).expect("a stream route");
    let mut stream =
        on_a.subscribe(sub_route, &request("session.subscribe", json!({"from": "start"})), 1024).expect("subscribing");
    let send = json!({"prompt": "hello over the link", "model": {"provider": "mock", "model": "echo-chat"}});
    let sent = on_a.call(route_a, &request("session.send", send), CALL);
    let sent: Value = match sent {
        Ok(reply) => serde_json::from_slice(&reply).expect("session.send answers JSON"),
        Err(e) => panic!("session.send through A: {e}{}", rig.tails()),
    };
    eprintln!("federation: session.send through A: {sent}");
    let until = Instant::now() + Duration::from_secs(20);
    let mut events = Vec::new();
    while Instant::now() < until {
        match stream.next_until(Instant::now() + Duration::from_millis(200)) {
            Some(StreamEvent::Data(body)) => {
                let frame: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let kind = frame.pointer("/event/type").or_else(|| frame.get("kind")).cloned().unwrap_or(Value::Null);
                events.push(kind.clone());
                if kind == "run_finished" || frame.pointer("/event/type") == Some(&json!("run_finished")) {
                    break;
                }
            }
            Some(StreamEvent::End(end)) => panic!("the stream ended: {end:?}{}", rig.tails()),
            None => {}
        }
    }
    assert!(!events.is_empty(), "no stream frame through A{}", rig.tails());
    eprintln!("federation: session.subscribe through A delivered {} frames: {events:?}", events.len());
    drop(stream);

    // B's stand-in stamped the relayed bind from the link.
    let line = rig.wait_b_fed_log(|l| l["session"] == "through-a");
    assert_eq!(line["principal"], "direct", "{line}");
    assert_eq!(line["peer"], json!(rig.a.machine_id), "{line}");
    assert_eq!(line["module"], "broca", "{line}");
    assert_eq!(line["root"], json!(root_text), "{line}");
    eprintln!("federation: B's stand-in logged {line}");

    // Not relayed: a root outside B's exposed prefix is refused by B's profile.
    let outside =
        on_a.open_route_rooted(&rig.fed_target(), &BindIdentity::new("fed-smoke", "outside"), Some("/"), CALL);
    let outside = outside.expect("the open itself succeeds on A");
    match on_a.call(outside, &request("role.describe", json!({})), CALL) {
        Err(CallError::Module(body)) => {
            assert_eq!(body.code, "fed_root_not_exposed", "{body:?}");
            eprintln!("federation: root / refused {}: {}", body.code, body.message);
        }
        other => panic!("a root outside the exposed prefix was answered {other:?}"),
    }
}

// ---- helpers ------------------------------------------------------------------------------

/// One call's answer (`result`), or the refusal's body as JSON.
fn call(c: &Consumer, route: ClientRoute, method: &str, params: Value) -> Result<Value, Value> {
    match c.call(route, &request(method, params), CALL) {
        Ok(reply) => {
            let v: Value = serde_json::from_slice(&reply).expect("an answer is JSON");
            Ok(v.get("result").cloned().unwrap_or(v))
        }
        Err(CallError::Module(body) | CallError::RouteOpen(body)) => Err(serde_json::to_value(&body).unwrap()),
        Err(e) => Err(json!({"transport": e.to_string()})),
    }
}

fn open(c: &Consumer, target: &RouteTarget, key: &SessionKey) -> ClientRoute {
    let identity = BindIdentity::new(key.harness.clone(), key.session.clone());
    c.open_route_rooted(target, &identity, Some(&key.project_root), CALL)
        .unwrap_or_else(|e| panic!("opening {target:?} for {key:?}: {e}"))
}

fn module(id: &str) -> RouteTarget {
    RouteTarget::ManagementSurface { module_id: id.into() }
}

fn send_params(prompt: &str) -> Value {
    json!({"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}, "send_id": prompt})
}

fn reply(text: &str, delay_ms: u64) -> Value {
    json!({"events": [{"delay_ms": delay_ms}, {"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

fn script(rig: &FedRig, responses: Vec<Value>) {
    let script = json!({"responses": responses}).to_string();
    rig.mock.install("default", Script::from_json(&script).expect("a script"));
}

/// Polls `run.status` until the run reaches `want` (any terminal when `want` is "terminal").
fn wait_run(c: &Consumer, route: ClientRoute, run_id: &str, want: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let status = call(c, route, "run.status", json!({"run_id": run_id}));
        if let Ok(s) = &status {
            let state = s["state"].as_str().unwrap_or_default();
            let terminal = ["completed", "cancelled", "interrupted", "failed"].contains(&state);
            if state == want || (want == "terminal" && terminal) {
                return s.clone();
            }
        }
        assert!(Instant::now() < until, "{run_id} never reached {want}: {status:?}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// The owner recorded in the session's first `run_started`, read from its WAL file.
fn recorded_owner(wal: &Path) -> Value {
    let mut owner = Value::Null;
    broca::wal::read(wal, broca::record::KNOWN_FEATURES, None, &mut |f: broca::wal::ScannedFrame<'_>| {
        if owner.is_null() {
            if let Ok(broca::record::Record::RunStarted(r)) = broca::record::Record::decode(f.payload) {
                owner = serde_json::to_value(&r.owner).unwrap();
            }
        }
        Ok::<(), broca::wal::WalError>(())
    })
    .expect("the WAL reads");
    owner
}

fn wal_of(state_root: &Path, key: &SessionKey) -> std::path::PathBuf {
    state_root.join("wal").join(format!("{}.wal", key.addr()))
}

// ---- the tests ----------------------------------------------------------------------------

/// An attested consumer on A (`relay-1`) owns a session that lives only on B; a second one
/// behind the same link (`relay-2`), and the test process itself, read it but cannot drive it.
fn an_owner_on_a_drives_a_session_on_b_and_a_stranger_cannot() {
    let options = FedOptions {
        relays: vec!["relay-1".into(), "relay-2".into()],
        expose_roots: Some(vec!["/".into()]),
        ..FedOptions::default()
    };
    let rig = FedRig::start(options);
    script(&rig, vec![reply("owned", 0), reply("slow", 4000), reply("local", 0), reply("local again", 0)]);
    // A relay opens its routes without a root: A stamps none and the stand-in relays "/".
    let key = SessionKey::new("/", "fed-owner", "s1");
    let on_a = rig.a.consumer();
    let owner = open(&on_a, &module("relay-1"), &key);
    let stranger = open(&on_a, &module("relay-2"), &key);
    let sent =
        call(&on_a, owner, "session.send", send_params("first")).unwrap_or_else(|e| panic!("{e}{}", rig.tails()));
    let run1 = sent["run_id"].as_str().unwrap().to_owned();
    wait_run(&on_a, owner, &run1, "completed");

    // The WAL lives only under B's state root, owned by relay-1 as A's daemon attested it.
    let wal = wal_of(&rig.b_state_root(), &key);
    assert!(wal.exists(), "no WAL under B: {}", wal.display());
    assert!(!wal_of(&rig.a.state_root(), &key).exists(), "a WAL under A");
    assert_eq!(recorded_owner(&wal), json!({"principal": "reserved:relay-1", "machine": rig.a.machine_id}));

    // The stranger behind the same link, and the direct test process through the re-export,
    // are refused every owner op; reads are open to both and equal B's own.
    let refused = call(&on_a, stranger, "session.send", send_params("hijack")).unwrap_err();
    assert_eq!(refused["code"], "scope_owner_mismatch", "{refused}");
    assert_eq!(refused["detail"]["principal"], "reserved:relay-2", "{refused}");
    let direct_route = open(&on_a, &rig.fed_target(), &key);
    let direct = call(&on_a, direct_route, "session.send", send_params("direct")).unwrap_err();
    assert_eq!(direct["code"], "scope_owner_mismatch", "{direct}");
    let on_b = rig.b.consumer();
    let b_route = open(&on_b, &FedRig::broca_target(), &key);
    let read_b = call(&on_b, b_route, "session.read", json!({})).unwrap();
    assert_eq!(call(&on_a, stranger, "session.read", json!({})).unwrap(), read_b);
    assert_eq!(call(&on_a, direct_route, "session.read", json!({})).unwrap(), read_b);
    // B's own key-holder (direct) is not the owner either.
    assert_eq!(call(&on_b, b_route, "session.send", send_params("local")).unwrap_err()["code"], "scope_owner_mismatch");

    // Cancel: the stranger is refused, the owner's cancel ends the run.
    let slow = call(&on_a, owner, "session.send", send_params("slow")).unwrap();
    let run2 = slow["run_id"].as_str().unwrap().to_owned();
    let no = call(&on_a, stranger, "run.cancel", json!({"run_id": run2})).unwrap_err();
    assert_eq!(no["code"], "scope_owner_mismatch", "{no}");
    assert_eq!(call(&on_a, owner, "run.cancel", json!({"run_id": run2})).unwrap(), json!("ack"));
    let ended = wait_run(&on_a, owner, &run2, "cancelled");
    eprintln!("federation: owner relay-1 drove {run1} and cancelled {}; relay-2 refused {}", run2, refused["message"]);
    assert_eq!(ended["state"], "cancelled");

    // A session B's own key-holder started records no owner: every caller on B may drive it,
    // no caller relayed from A may (#44), attested or not; reads stay open.
    let local_key = SessionKey::new("/", "fed-owner", "b-local");
    let on_b_local = open(&on_b, &FedRig::broca_target(), &local_key);
    let started = call(&on_b, on_b_local, "session.send", send_params("local")).unwrap();
    wait_run(&on_b, on_b_local, started["run_id"].as_str().unwrap(), "completed");
    for relayed in [open(&on_a, &module("relay-1"), &local_key), open(&on_a, &rig.fed_target(), &local_key)] {
        let no = call(&on_a, relayed, "session.send", send_params("from afar")).unwrap_err();
        assert_eq!(no["code"], "scope_owner_mismatch", "{no}");
        let cancel = call(&on_a, relayed, "run.cancel", json!({"run_id": started["run_id"]})).unwrap_err();
        assert_eq!(cancel["code"], "scope_owner_mismatch", "{cancel}");
        assert!(call(&on_a, relayed, "session.read", json!({})).is_ok());
    }
    let again = call(&on_b, on_b_local, "session.send", send_params("local again")).unwrap();
    wait_run(&on_b, on_b_local, again["run_id"].as_str().unwrap(), "completed");
}

/// A consumer on A follows a session on B; B's broca is SIGKILLed mid-run. The daemon restarts
/// it; the interrupted run is sealed and the queued send runs there; the consumer resubscribes
/// through A from its last cursor and, joined, its streams are exactly a fresh replay.
fn broca_on_b_killed_mid_run_resumes_and_a_resubscriber_on_a_misses_nothing() {
    let rig = FedRig::start(FedOptions::default());
    script(&rig, vec![reply("killed", 6000), reply("after", 0)]);
    let root = rig.project_dir("kill");
    let key = SessionKey::new(root.to_str().unwrap(), "fed-kill", "s1");
    let on_a = rig.a.consumer();
    let route = open(&on_a, &rig.fed_target(), &key);
    let mut units: Vec<((u64, u64), Value)> = Vec::new();
    let mut stream = subscribe(&on_a, &rig, &key, json!("start"));
    let first = call(&on_a, route, "session.send", send_params("doomed")).unwrap();
    let queued = call(&on_a, route, "session.send", send_params("queued")).unwrap();
    assert_eq!(queued["state"], "pending", "{queued}");
    // Once the first run's step is durable, B's broca dies.
    follow(&mut stream, &mut units, Duration::from_secs(10), |u| u["type"] == "step_started");
    let pid = rig.b.broca_pid().expect("B's broca");
    fed_rig::kill(pid);
    eprintln!("federation: SIGKILLed B's broca (pid {pid}) mid-run");
    let ended = follow(&mut stream, &mut units, Duration::from_secs(10), |_| false);
    assert!(ended.is_some(), "the stream through A did not end when broca died");
    eprintln!("federation: the stream through A ended: {ended:?}");
    rig.b.wait_ready(&["broca"]);
    // Resubscribe from the last cursor (route opens retried while broca comes back).
    let last = units.last().map(|(c, _)| json!({"wal_seq": c.0, "sub_index": c.1})).unwrap_or(json!("start"));
    let mut again = subscribe(&on_a, &rig, &key, last);
    let route = open(&on_a, &rig.fed_target(), &key);
    let run2 = queued["run_id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("run-{}", queued["submission_id"].as_str().unwrap()));
    let done = wait_run(&on_a, route, &run2, "completed");
    let sealed = wait_run(&on_a, route, first["run_id"].as_str().unwrap(), "terminal");
    assert_eq!(sealed["state"], "interrupted", "{sealed}");
    let head = call(&on_a, route, "session.read", json!({})).unwrap()["head"].clone();
    let head = (head["wal_seq"].as_u64().unwrap(), head["sub_index"].as_u64().unwrap());
    let until = Instant::now() + Duration::from_secs(20);
    while units.last().is_none_or(|(c, _)| *c < head) {
        assert!(Instant::now() < until, "the resubscribed stream never reached the head {head:?}");
        if let Some(end) = follow(&mut again, &mut units, Duration::from_millis(300), |_| false) {
            assert!(units.last().is_some_and(|(c, _)| *c >= head), "the second stream ended early: {end}");
        }
    }
    let mut fresh = Vec::new();
    let mut replay = subscribe(&on_a, &rig, &key, json!("start"));
    let until = Instant::now() + Duration::from_secs(20);
    while fresh.last().is_none_or(|(c, _): &((u64, u64), Value)| *c < head) {
        assert!(Instant::now() < until, "the fresh replay never reached the head");
        follow(&mut replay, &mut fresh, Duration::from_millis(300), |_| true);
    }
    fresh.retain(|(c, _)| *c <= head);
    units.retain(|(c, _)| *c <= head);
    assert_eq!(units, fresh, "the consumer's joined streams differ from a fresh replay");
    eprintln!("federation: {} units gap-free across the kill; {run2} {}", units.len(), done["state"]);
}

/// `session.subscribe` through A on a route of its own, retried while broca is away.
fn subscribe(c: &Consumer, rig: &FedRig, key: &SessionKey, from: Value) -> broca::subc::consumer::StreamCall {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let identity = BindIdentity::new(key.harness.clone(), key.session.clone());
        let opened = c.open_route_rooted(&rig.fed_target(), &identity, Some(&key.project_root), CALL);
        if let Ok(route) = opened {
            let body = request("session.subscribe", json!({"from": from}));
            if let Ok(stream) = c.subscribe(route, &body, 4096) {
                // A refusal comes back as the stream's terminal: look at the first event.
                return stream;
            }
        }
        assert!(Instant::now() < until, "no subscription through A{}", rig.tails());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads control units into `units` until `stop` holds for one (returns `None`), the stream
/// ends (returns its end), or `within` passes (returns `None`).
fn follow(
    stream: &mut broca::subc::consumer::StreamCall,
    units: &mut Vec<((u64, u64), Value)>,
    within: Duration,
    stop: impl Fn(&Value) -> bool,
) -> Option<String> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        match stream.next_until(Instant::now() + Duration::from_millis(100)) {
            Some(StreamEvent::Data(body)) => {
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if event["kind"] != "control" {
                    continue;
                }
                let c = &event["cursor"];
                let cursor = (c["wal_seq"].as_u64().unwrap_or(0), c["sub_index"].as_u64().unwrap_or(0));
                assert!(
                    units.last().is_none_or(|(last, _)| *last < cursor),
                    "cursor {cursor:?} after {:?}",
                    units.last().map(|u| u.0)
                );
                units.push((cursor, event["unit"].clone()));
                if stop(&event["unit"]) {
                    return None;
                }
            }
            Some(StreamEvent::End(end)) => return Some(format!("{end:?}")),
            None => {}
        }
    }
    None
}

/// Killing either stand-in fails what was in flight through A with a typed error in bounded
/// time; nothing hangs, and the re-export comes back.
fn a_dead_stand_in_fails_calls_in_bounded_time() {
    let rig = FedRig::start(FedOptions::default());
    let root = rig.project_dir("dead");
    let key = SessionKey::new(root.to_str().unwrap(), "fed-dead", "s1");
    let on_a = rig.a.consumer();
    for (side, pid) in [("B", rig.b.callosum_pid()), ("A", rig.a.callosum_pid())] {
        let mut stream = subscribe(&on_a, &rig, &key, json!("live"));
        let started = Instant::now();
        fed_rig::kill(pid.expect("a stand-in"));
        let mut units = Vec::new();
        let end = follow(&mut stream, &mut units, Duration::from_secs(15), |_| false);
        let end = end.unwrap_or_else(|| panic!("the stream through A still open 15 s after {side}'s stand-in died"));
        let took = started.elapsed();
        eprintln!("federation: {side}'s stand-in killed: the stream ended in {took:?}: {end}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        // A new call either fails at once (typed) or, once the stand-in is back, is answered.
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let identity = BindIdentity::new(key.harness.clone(), key.session.clone());
            let t = Instant::now();
            let opened = on_a.open_route_rooted(&rig.fed_target(), &identity, Some(&key.project_root), CALL);
            let answered = opened
                .map_err(|e| e.to_string())
                .and_then(|r| call(&on_a, r, "role.describe", json!({})).map_err(|e| e.to_string()));
            assert!(t.elapsed() < CALL + Duration::from_secs(1), "a call through A hung for {:?}", t.elapsed());
            if answered.is_ok() {
                break;
            }
            assert!(Instant::now() < until, "the re-export never came back: {answered:?}{}", rig.tails());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `broca session export` on B and `broca session import` on A, through both daemons: reads
/// equal before and after, placement finds the session on A, B refuses sends by name.
fn a_session_moves_between_hosts_through_the_cli() {
    let rig = FedRig::start(FedOptions::default());
    script(&rig, vec![reply("before", 0), reply("after", 0)]);
    let root = rig.project_dir("cli");
    let key = SessionKey::new(root.to_str().unwrap(), "fed-cli", "s1");
    let on_a = rig.a.consumer();
    let via_fed = open(&on_a, &rig.fed_target(), &key);
    let run =
        call(&on_a, via_fed, "session.send", send_params("before")).unwrap()["run_id"].as_str().unwrap().to_owned();
    wait_run(&on_a, via_fed, &run, "completed");
    let reads = |c: &Consumer, r: ClientRoute| {
        ["session.read", "session.history"].map(|m| call(c, r, m, json!({})).unwrap().to_string())
    };
    let before = reads(&on_a, via_fed);
    let hosts = format!("broca,{}", rig.fed_broca());
    let locate = cli(&rig.a.conn_file(), &["locate", "--hosts", &hosts], &key, &[]);
    assert_eq!(locate["placement"]["host"], json!(rig.fed_broca()), "{locate}");
    let archive = rig.root().join("cli.archive");
    let exported = cli(&rig.b.conn_file(), &["export"], &key, &["--to", archive.to_str().unwrap()]);
    eprintln!("federation: exported on B: {exported}");
    let adopted = cli_plain(&rig.a.conn_file(), &["import", "--from", archive.to_str().unwrap(), "--json"]);
    assert_eq!(adopted["adopted"], true, "{adopted}");
    let local = open(&on_a, &FedRig::broca_target(), &key);
    assert_eq!(reads(&on_a, local), before, "reads on A after the move differ from B's before it");
    assert_eq!(reads(&on_a, via_fed), before, "B's tombstoned copy reads as before");
    let moved = call(&on_a, via_fed, "session.send", send_params("stale")).unwrap_err();
    assert_eq!(moved["code"], "session_moved", "{moved}");
    let after = cli(&rig.a.conn_file(), &["locate", "--hosts", &hosts], &key, &[]);
    assert_eq!(after["placement"], json!({"host": "broca", "existing": true}), "{after}");
    assert_eq!(after["hosts"][rig.fed_broca()]["state"], "moved", "{after}");
    let run = call(&on_a, local, "session.send", send_params("after")).unwrap()["run_id"].as_str().unwrap().to_owned();
    wait_run(&on_a, local, &run, "completed");
    assert!(!wal_of(&rig.a.state_root(), &key).with_extension("wal.adopting").exists());
    // `broca session ROOT HARNESS SESSION` on each host's state root says where it lives.
    for (state_root, want) in [(rig.b_state_root(), "moved"), (rig.a.state_root(), "live")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_broca"))
            .args(["session", &key.project_root, &key.harness, &key.session])
            .env("BROCA_STATE_ROOT", &state_root)
            .output()
            .expect("broca session runs");
        let said: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert_eq!((said["state"].as_str(), said["tree"].as_str()), (Some(want), Some("wal")), "{said}");
    }
}

/// `broca session <verb> --subc FILE --project-root … --json`, its JSON answer.
pub fn cli(conn: &Path, verb: &[&str], key: &SessionKey, more: &[&str]) -> Value {
    cli_keyed(conn, verb, key, more).unwrap_or_else(|e| panic!("{e}"))
}

/// [`cli_result`] for a verb that names the session by its triple.
pub fn cli_keyed(conn: &Path, verb: &[&str], key: &SessionKey, more: &[&str]) -> Result<Value, String> {
    let mut args: Vec<&str> = verb.to_vec();
    args.extend(["--project-root", &key.project_root, "--harness", &key.harness, "--session", &key.session, "--json"]);
    args.extend(more);
    cli_result(conn, &args)
}

pub fn cli_plain(conn: &Path, args: &[&str]) -> Value {
    cli_result(conn, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `broca session ARGS --subc CONN`: its JSON answer, or what it said when it failed.
pub fn cli_result(conn: &Path, args: &[&str]) -> Result<Value, String> {
    // The CLI copies archives in and out of the exchange directory of the state root the
    // daemon's broca uses (`<rig dir>/broca`, beside `<rig dir>/runtime/<connection file>`).
    let state_root = conn.parent().and_then(Path::parent).map(|d| d.join("broca")).expect("a rig connection file");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_broca"))
        .arg("session")
        .args(args)
        .arg("--subc")
        .arg(conn)
        .arg("--state-root")
        .arg(state_root)
        .env_remove("SUBC_MODULE_ID")
        .env_remove("SUBC_LAUNCH_NONCE")
        .env_remove("SUBC_LAUNCH_NONCE_FD")
        .output()
        .map_err(|e| format!("broca session cannot run: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "broca session {}: {}: {}",
            args[0],
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_str(stdout.trim()).map_err(|e| format!("{e}: {stdout}"))
}

fn moves_under_load_with_kills_keep_one_writer() {
    moves_campaign::run();
}

/// `broca-mcp --hosts broca,fed:<B>:broca` on A: each new session lands on the host the
/// placement rule ranks first (its WAL there and only there); a session moved away is found
/// again on the host it moved to (the old host's `session_moved` re-places the send).
fn broca_mcp_places_sessions_across_hosts() {
    let rig = FedRig::start(FedOptions::default());
    let project = rig.project_dir("mcp");
    let root = project.to_str().unwrap().to_owned();
    let hosts = vec!["broca".to_owned(), rig.fed_broca()];
    let conn = rig.a.conn_file();
    let mut m = mcp_client::Mcp::start(
        &["--subc", conn.to_str().unwrap(), "--harness", "fed-mcp", "--hosts", &hosts.join(",")],
        &project,
    );
    m.initialize("2025-11-25");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let state_root = |host: &str| if host == "broca" { rig.a.state_root() } else { rig.b_state_root() };
    let mut on_b = None;
    for i in 0..6u64 {
        let session = format!("s{i}");
        let key = SessionKey::new(&root, "fed-mcp", &session);
        let answer = m.tool(
            10 + i,
            "broca_send",
            json!({"session": session, "prompt": format!("hello {i}"), "model": "mock/echo-chat"}),
        );
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        let ruled = broca::placement::rank(&key.addr(), &hosts)[0].to_owned();
        let other = hosts.iter().find(|h| **h != ruled).unwrap();
        assert!(wal_of(&state_root(&ruled), &key).exists(), "{session} is not on {ruled}");
        assert!(!wal_of(&state_root(other), &key).exists(), "{session} is also on {other}");
        if ruled != "broca" {
            on_b.get_or_insert(key);
        }
    }
    let key = on_b.expect("one of six sessions ranked B first (1 in 64 it would not)");
    let on_a = rig.a.consumer();
    let archive = rig.root().join("mcp.archive");
    cli(&rig.b.conn_file(), &["export"], &key, &["--to", archive.to_str().unwrap()]);
    cli_plain(&rig.a.conn_file(), &["import", "--from", archive.to_str().unwrap(), "--json"]);
    let again = m.tool(
        30,
        "broca_send",
        json!({"session": key.session, "prompt": "after the move", "model": "mock/echo-chat"}),
    );
    assert_eq!(again["result"]["isError"], false, "the send after the move: {again}");
    let local = open(&on_a, &FedRig::broca_target(), &key);
    let run = again["result"]["structuredContent"]["run_id"].as_str().expect("a run id").to_owned();
    wait_run(&on_a, local, &run, "completed");
    eprintln!("federation: broca-mcp placed 6 sessions by the rule and followed {} from B to A", key.session);
    m.finish();
}
