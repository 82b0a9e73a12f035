//! The five tools of the real `broca-mcp` binary against the real daemon and broca
//! ([`support::Harness`]): a send whose text streams as progress before the wait's result, the
//! session bound under the adapter's cwd and `--harness` (checked through the SDK), paging,
//! cancelling a running turn, a broca restart under the adapter (its routes are re-opened), and
//! each tool's broca refusal pinned as a golden (`testdata/golden/mcp.*.refusal.json`).
//!
//! One test fn, because stopping the in-process daemon means SIGTERM to this process.

mod mcp_client;
use broca_mock::mock;
mod pin;
mod support;

use std::time::{Duration, Instant};

use mcp_client::{error_code, Mcp};
use pin::assert_golden;
use serde_json::{json, Value};
use support::Harness;

const HARNESS: &str = "mcp-e2e";

/// The tool's answer (its `structuredContent`), asserting it is not an error result.
fn ok(m: &mut Mcp, id: u64, tool: &str, args: Value) -> Value {
    let answer = m.tool(id, tool, args);
    assert_eq!(answer["result"]["isError"], false, "{tool}: {answer}");
    answer["result"]["structuredContent"].clone()
}

fn refused(m: &mut Mcp, id: u64, tool: &str, args: Value) -> Value {
    let answer = m.tool(id, tool, args);
    assert_eq!(answer["result"]["isError"], true, "{tool}: {answer}");
    answer["result"].clone()
}

#[test]
fn mcp_tools_drive_and_watch_a_real_broca() {
    let h = Harness::start();
    h.wait_registered();
    let project = h.project_dir("mcp");
    let conn = h.connection_file();
    let mut m = Mcp::start(&["--subc", conn.to_str().unwrap(), "--harness", HARNESS], &project);
    m.initialize("2025-11-25");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    // A send whose reply streams in paced deltas; the wait streams it as progress.
    let pieces = ["One ", "two ", "three."];
    let mut events: Vec<Value> = Vec::new();
    for p in pieces {
        events.push(json!({"text": p}));
        events.push(json!({"delay_ms": 200}));
    }
    events.push(json!({"finish": "stop"}));
    h.install(json!({"responses": [{"events": events}]}));
    let sent = ok(&mut m, 10, "broca_send", json!({"session": "s1", "prompt": "count", "model": "mock/echo-chat"}));
    assert_eq!(sent["state"], "active", "{sent}");
    assert_eq!(sent["send_id_minted"], true);
    let run_id = sent["run_id"].as_str().unwrap().to_string();
    m.send(json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {
        "name": "broca_wait", "arguments": {"session": "s1", "run_id": run_id, "timeout_ms": "20000"},
        "_meta": {"progressToken": "p-1"}}}));
    let (waited, before) = m.answer(&json!(11));
    let waited = &waited["result"]["structuredContent"];
    assert_eq!(waited["outcome"], "finished", "{waited}");
    assert_eq!(waited["result"]["state"], "completed");
    let final_text = waited["result"]["final_message"]["text"].as_str().unwrap();
    assert_eq!(final_text, pieces.concat());
    assert!(before.len() >= 2, "the text came as progress before the result: {before:?}");
    let mut streamed = String::new();
    let mut last = 0;
    for n in &before {
        assert_eq!(n["method"], "notifications/progress", "{n}");
        assert_eq!(n["params"]["progressToken"], "p-1");
        let progress = n["params"]["progress"].as_u64().unwrap();
        assert!(progress > last, "progress increases: {before:?}");
        last = progress;
        streamed.push_str(n["params"]["message"].as_str().unwrap());
    }
    assert!(!streamed.is_empty() && final_text.ends_with(&streamed), "{streamed:?} vs {final_text:?}");

    // The session is {the adapter's cwd, --harness, s1}: the SDK sees the same run there.
    let same = h.session(HARNESS, "s1", Some(&project));
    assert_eq!(same.run_status(&run_id)["state"], "completed");

    // A retry with the reported send_id answers the recorded fate.
    let again = ok(
        &mut m,
        12,
        "broca_send",
        json!({"session": "s1", "prompt": "count", "model": "mock/echo-chat",
                                                    "send_id": sent["send_id"]}),
    );
    assert_eq!(again["run_id"], run_id.as_str(), "{again}");

    let page = ok(&mut m, 13, "broca_read", json!({"session": "s1", "from_ordinal": 0, "limit": "1"}));
    assert_eq!(page["messages"][0]["ordinal"], "1", "ordinals count from 1; 0 is the first's alias");
    assert_eq!(page["next_from_ordinal"], "2", "{page}");
    let status = ok(&mut m, 14, "broca_status", json!({"session": "s1"}));
    assert_eq!(status["run_id"], run_id.as_str());

    // Cancel a running turn.
    h.install(json!({"responses": [{"events": [{"text": "slow"}, {"delay_ms": 20000}, {"finish": "stop"}]}]}));
    let slow = ok(&mut m, 20, "broca_send", json!({"session": "s1", "prompt": "slowly", "model": "mock/echo-chat"}));
    let slow_id = slow["run_id"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(15);
    while ok(&mut m, 21, "broca_status", json!({"session": "s1", "run_id": slow_id})).get("step").is_none() {
        assert!(Instant::now() < until, "the slow run never reached its model step");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cancel = ok(&mut m, 22, "broca_cancel", json!({"session": "s1", "run_id": slow_id}));
    assert_eq!(cancel, json!({"result": "ack"}));
    let waited = ok(&mut m, 23, "broca_wait", json!({"session": "s1", "run_id": slow_id, "timeout_ms": 15000}));
    assert_eq!(waited["result"]["state"], "cancelled", "{waited}");

    // Each tool's broca refusal, verbatim.
    let cases = [
        (
            "broca_send",
            json!({"session": "s1", "prompt": "x", "model": "mock/echo-chat", "title": " "}),
            "mcp.broca_send.refusal.json",
        ),
        ("broca_wait", json!({"session": " ", "run_id": "r"}), "mcp.broca_wait.refusal.json"),
        ("broca_read", json!({"session": "s1", "limit": 0}), "mcp.broca_read.refusal.json"),
        ("broca_status", json!({"session": "s1", "run_id": ""}), "mcp.broca_status.refusal.json"),
        ("broca_cancel", json!({"session": "s1", "run_id": slow_id, "at": "later"}), "mcp.broca_cancel.refusal.json"),
    ];
    for (i, (tool, args, golden)) in cases.into_iter().enumerate() {
        let result = refused(&mut m, 30 + i as u64, tool, args);
        assert_golden(golden, &result.to_string(), Some(project.to_str().unwrap()));
    }

    // broca restarts under the adapter: its routes die; the adapter opens new ones.
    let old = h.kill_broca();
    h.wait_respawn(old);
    let until = Instant::now() + Duration::from_secs(30);
    let mut id = 100;
    loop {
        id += 1;
        let answer = m.tool(id, "broca_status", json!({"session": "s1", "run_id": run_id}));
        if answer["result"]["isError"] == false {
            assert_eq!(answer["result"]["structuredContent"]["state"], "completed");
            break;
        }
        // Until broca is back: a transport error, or a refusal of the restart window.
        if answer.get("error").is_some() {
            assert_eq!(error_code(&answer), -32000, "{answer}");
        }
        assert!(Instant::now() < until, "the adapter never reached the respawned broca: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
    m.finish();
    h.stop();
}
