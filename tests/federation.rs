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

use broca::subc::consumer::{CallError, StreamEvent};
use fed_rig::{FedOptions, FedRig, CALL};
use serde_json::{json, Value};
use subc_protocol::BindIdentity;

type Test = (&'static str, fn());

const TESTS: &[Test] = &[("a_client_on_a_reaches_broca_on_b", a_client_on_a_reaches_broca_on_b)];

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
