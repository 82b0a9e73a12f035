//! The real `broca-mcp` binary on its stdio transport, with no daemon behind it: the protocol
//! handshake, `tools/list` and each tool's argument refusal pinned as goldens
//! (`testdata/golden/mcp.*.json`, `BROCA_BLESS=1` rewrites them), and invalid, oversize and
//! fuzzed lines, each of which must get its JSON-RPC error (or none, for a notification)
//! without the process crashing or stalling. Every read is bounded by `mcp_client::STEP`.

mod mcp_client;
mod pin;

use std::path::Path;

use mcp_client::{error_code, Mcp};
use pin::assert_golden;
use serde_json::{json, Value};

/// The adapter's input line bound.
const MAX_LINE: usize = 1 << 20;
/// A connection file that does not exist: tool calls that get past their arguments fail to
/// connect, a transport failure.
const NO_DAEMON: &str = "/nonexistent/broca-mcp-test/subc-connection.json";

#[test]
fn initialize_negotiates_the_version_and_tools_list_is_pinned() {
    let mut m = Mcp::start(&["--subc", NO_DAEMON], Path::new("/"));
    let init = m.initialize("2025-06-18");
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["capabilities"], json!({"tools": {"listChanged": false}}));
    assert_eq!(init["result"]["serverInfo"]["name"], "broca-mcp");
    // A version this server does not speak is answered with its newest.
    assert_eq!(m.initialize("1999-01-01")["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(m.initialize("2024-11-05")["result"]["protocolVersion"], "2024-11-05");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    m.alive(2);
    let listed = m.request(3, "tools/list", json!({}));
    assert_golden("mcp.tools_list.json", &listed["result"].to_string(), None);
    for tool in listed["result"]["tools"].as_array().unwrap() {
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        for (name, prop) in schema["properties"].as_object().unwrap() {
            assert!(
                prop["description"].as_str().is_some_and(|d| d.len() > 20),
                "{}.{name}: no description",
                tool["name"]
            );
        }
    }
    m.finish();
}

#[test]
fn tool_argument_refusals_and_transport_failures_are_pinned() {
    let mut m = Mcp::start(&["--subc", NO_DAEMON], Path::new("/"));
    m.initialize("2025-11-25");
    let cases = [
        ("broca_send", json!({"session": "s"}), "mcp.broca_send.invalid_arguments.json"),
        (
            "broca_wait",
            json!({"session": "s", "run_id": "r", "timeout_ms": 600001}),
            "mcp.broca_wait.invalid_arguments.json",
        ),
        ("broca_read", json!({"session": "s", "from_ordinal": "-1"}), "mcp.broca_read.invalid_arguments.json"),
        (
            "broca_status",
            json!({"session": "s", "project_root": "relative/dir"}),
            "mcp.broca_status.invalid_arguments.json",
        ),
        (
            "broca_cancel",
            json!({"session": "s", "run_id": "r", "when": "now"}),
            "mcp.broca_cancel.invalid_arguments.json",
        ),
    ];
    for (i, (tool, args, golden)) in cases.into_iter().enumerate() {
        let answer = m.tool(10 + i as u64, tool, args);
        let result = &answer["result"];
        assert_eq!(result["isError"], true, "{tool}: {answer}");
        assert_eq!(result["structuredContent"]["code"], "invalid_arguments");
        assert_eq!(result["content"][0]["text"], result["structuredContent"].to_string());
        assert_golden(golden, &result.to_string(), None);
    }
    // Arguments that map: the call gets as far as connecting, which fails (a JSON-RPC error
    // saying nothing was sent, with the send_id a retry should reuse).
    let failed =
        m.tool(20, "broca_send", json!({"session": "s", "prompt": "hi", "model": "mock/echo-chat", "send_id": "k-1"}));
    assert_eq!(error_code(&failed), -32000);
    assert_golden("mcp.transport_error.json", &failed.to_string(), None);
    let minted = m.tool(21, "broca_send", json!({"session": "s", "prompt": "hi"}));
    let send_id = minted["error"]["data"]["send_id"].as_str().unwrap();
    assert!(send_id.starts_with("mcp-") && send_id.len() > 20, "a minted send_id: {minted}");
    // Before 2025-06-18 results carry text content only.
    m.initialize("2025-03-26");
    let old = m.tool(22, "broca_read", json!({"session": "s", "limit": true}));
    assert_eq!(old["result"]["isError"], true);
    assert!(old["result"].get("structuredContent").is_none(), "{old}");
    m.finish();
}

#[test]
fn invalid_lines_get_their_json_rpc_errors_and_the_server_goes_on() {
    let mut m = Mcp::start(&["--subc", NO_DAEMON], Path::new("/"));
    let null = Value::Null;
    let cases: Vec<(&[u8], i64, Value)> = vec![
        (b"{", -32700, null.clone()),
        (b"not json at all", -32700, null.clone()),
        (b"\xff\xfe{\"jsonrpc\":\"2.0\"}", -32700, null.clone()),
        (b"[]", -32600, null.clone()),
        (br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, -32600, null.clone()),
        (b"42", -32600, null.clone()),
        (b"\"ping\"", -32600, null.clone()),
        (b"null", -32600, null.clone()),
        (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, -32600, null.clone()),
        (br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, -32600, null.clone()),
        (br#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#, -32600, json!(5)),
        (br#"{"jsonrpc":"2.0","id":"s","method":7}"#, -32600, json!("s")),
        (br#"{"jsonrpc":"2.0","id":6}"#, -32600, json!(6)),
        (br#"{"jsonrpc":"2.0","id":7,"method":"ping","params":"x"}"#, -32602, json!(7)),
        (br#"{"jsonrpc":"2.0","id":8,"method":"resources/list"}"#, -32601, json!(8)),
        (br#"{"jsonrpc":"2.0","id":9,"method":"server/discover"}"#, -32601, json!(9)),
        (br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"nope"}}"#, -32602, json!(10)),
        (br#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{}}"#, -32602, json!(11)),
        (
            br#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"broca_read","arguments":[]}}"#,
            -32602,
            json!(12),
        ),
    ];
    for (i, (line, code, id)) in cases.iter().enumerate() {
        m.write(line);
        let got = m.recv();
        assert_eq!(got["jsonrpc"], "2.0", "{got}");
        assert_eq!(error_code(&got), *code, "{}: {got}", String::from_utf8_lossy(line));
        assert_eq!(&got["id"], id, "{}: {got}", String::from_utf8_lossy(line));
        m.alive(1000 + i as u64);
    }
    // Notifications and responses are never answered, blank lines are skipped.
    for line in [
        &br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":{}}"#[..],
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999}}"#,
        br#"{"jsonrpc":"2.0","id":77,"result":{}}"#,
        b"",
        b"   \t",
    ] {
        m.write(line);
        m.alive(2000);
    }
    m.finish();
}

#[test]
fn oversize_lines_are_refused_and_the_next_line_is_read_whole() {
    let mut m = Mcp::start(&["--subc", NO_DAEMON], Path::new("/"));
    let ping_with_pad = |id: u64, total: usize| {
        let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"pad":""#);
        let tail = r#""}}"#;
        let pad = "x".repeat(total - head.len() - tail.len());
        format!("{head}{pad}{tail}")
    };
    // Exactly at the bound: a message like any other.
    m.write(ping_with_pad(1, MAX_LINE).as_bytes());
    assert_eq!(m.recv(), json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
    // One byte over, and far over: refused, id null (it was never parsed), nothing kept.
    for (id, size) in [(2, MAX_LINE + 1), (3, 5 * MAX_LINE)] {
        m.write(ping_with_pad(id, size).as_bytes());
        let got = m.recv();
        assert_eq!(error_code(&got), -32600, "{got}");
        assert_eq!(got["id"], Value::Null);
        assert_eq!(got["error"]["data"], json!({"limit": MAX_LINE, "bytes": size}));
        m.alive(10 + id);
    }
    m.finish();
}

/// xorshift64*: a fixed seed, so a failure names the line that caused it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Lines that are almost messages: valid ones cut, spliced and byte-flipped, random bytes, deep
/// nesting, huge numbers and odd ids.
fn fuzz_line(rng: &mut Rng) -> Vec<u8> {
    const SEEDS: &[&str] = &[
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"broca_read","arguments":{"session":"s","limit":"5"}}}"#,
        r#"{"jsonrpc":"2.0","id":"w","method":"tools/call","params":{"name":"broca_wait","arguments":{"session":"s","run_id":"r","timeout_ms":0},"_meta":{"progressToken":"t"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"w"}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
    ];
    let seed = SEEDS[rng.below(SEEDS.len())].as_bytes();
    let mut line = seed.to_vec();
    match rng.below(7) {
        0 => line.truncate(rng.below(seed.len())),
        1 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(line.len());
                line[at] = (rng.next() & 0xff) as u8;
            }
        }
        2 => {
            let at = rng.below(line.len());
            let other = SEEDS[rng.below(SEEDS.len())].as_bytes();
            line.splice(at..at, other[rng.below(other.len())..].iter().copied());
        }
        3 => line = (0..rng.below(300)).map(|_| (rng.next() & 0xff) as u8).collect(),
        4 => {
            let depth = 1 + rng.below(5000);
            line = format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
        }
        5 => {
            let ids = ["1e400", "-0", "18446744073709551616", "true", "[]", "\"\"", "1.0"];
            line = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, ids[rng.below(ids.len())]).into_bytes();
        }
        _ => {
            let at = rng.below(line.len());
            line.insert(at, [b'"', b'{', b'}', b'\\', b',', 0u8][rng.below(6)]);
        }
    }
    line.retain(|b| *b != b'\n');
    line
}

#[test]
fn fuzzed_lines_never_crash_or_stall_the_adapter() {
    let mut m = Mcp::start(&["--subc", NO_DAEMON], Path::new("/"));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let allowed = [-32700, -32600, -32601, -32602, -32000, -32001];
    for i in 0..400u64 {
        let line = fuzz_line(&mut rng);
        m.write(&line);
        // A ping after every line: its answer proves the line was dealt with and the server lives.
        let id = json!(format!("alive-{i}"));
        m.send(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}));
        let (_, others) = m.answer(&id);
        for msg in others {
            assert_eq!(msg["jsonrpc"], "2.0", "line {i} {:?}: {msg}", String::from_utf8_lossy(&line));
            if let Some(code) = msg["error"]["code"].as_i64() {
                assert!(allowed.contains(&code), "line {i} {:?}: {msg}", String::from_utf8_lossy(&line));
            } else {
                assert!(msg.get("result").is_some() || msg.get("method").is_some(), "line {i}: {msg}");
            }
        }
    }
    m.finish();
}
