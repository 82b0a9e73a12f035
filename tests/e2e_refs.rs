//! Output references end to end (llm-runner §9.13): the real subc daemon supervises broca and
//! broca-mock as a tool provider whose `logs` tool declares a `data` token slot; the harness's
//! MockServer plays the model and records every request body, so the part numbers the model
//! was shown are read at the model, outside broca.
//!
//! A session whose plan item says `output_refs: true` shows `§N§ ` numbers; the model's reply
//! naming `$$tc(N)` gets a reference set whose records resolve to the stored tool output, read
//! back a range at a time; its descriptors appear on display rows only; another session's ids
//! are unknown; retention removes the sets with the session; a SIGKILLed broca derives the same
//! records after its restart.

use broca_mock::mock;
mod pin;
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use support::{Harness, Options, Session};

const HARNESS: &str = "refs-e2e";
const TOOLS: &str = "mock-tools";
/// The tool's output: long enough to page, with a marker no other text carries.
fn output() -> String {
    let lines: Vec<String> = (0..400).map(|i| format!("log line {i:03}: all quiet")).collect();
    format!("LOGS-MARKER\n{}", lines.join("\n"))
}

fn tools_script() -> Value {
    json!({
        "tools": [{
            "name": "logs",
            "description": "Shows the service's log.",
            "input_schema": {"type": "object"},
            "reference_slots": [{"name": "data", "kind": "token"}],
            "behaviour": {"text": output()},
        }, {
            "name": "summarize",
            "description": "Summarizes a referenced output.",
            "input_schema": {"type": "object"},
            "reference_slots": [{"name": "data", "kind": "token"}],
            "behaviour": {"text": "summary: quiet"},
        }],
    })
}

fn plan_send(prompt: &str, output_refs: bool) -> Value {
    let mut p = support::send_params(prompt);
    p["plan"] = json!({"tool_items": [{"provider": TOOLS, "params": {}, "output_refs": output_refs}]});
    p
}

fn call_step(id: &str, name: &str, args: Value) -> Value {
    json!({"events": [{"tool_call": {"id": id, "name": name, "arguments": args}}, {"finish": "tool_calls"}]})
}

fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

/// The number the model was shown in front of `text`'s start, in the last request.
fn shown_number(h: &Harness, starts: &str) -> Option<u64> {
    let requests = h.mock.requests("default");
    let body: Value = serde_json::from_slice(&requests.last()?.body).ok()?;
    let rendered = body.to_string();
    let at = rendered.find(&format!("§ {starts}"))?;
    let head = &rendered[..at];
    let open = head.rfind('§')?;
    head[open + '§'.len_utf8()..].parse().ok()
}

/// The display rows' descriptors, in order: `(ordinal, part index or None, descriptor)`.
fn descriptors(s: &Session) -> Vec<(u64, Option<usize>, Value)> {
    let page = s.ok("session.history", json!({"form": "display", "limit": 100}));
    let mut out = Vec::new();
    for entry in page["messages"].as_array().unwrap() {
        let ordinal = entry["ordinal"].as_u64().unwrap();
        if let Some(d) = entry["row"].get("output_refs") {
            out.push((ordinal, None, d.clone()));
        }
        for (i, part) in entry["row"]["parts"].as_array().unwrap().iter().enumerate() {
            if let Some(d) = part.get("output_refs") {
                out.push((ordinal, Some(i), d.clone()));
            }
        }
    }
    out
}

/// Every record of the set `set_id`, paged through `session.output_refs`.
fn records(s: &Session, set_id: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = Value::Null;
    loop {
        let page = s.ok("session.output_refs", json!({"set_id": set_id, "after": after}));
        assert!(page.to_string().len() <= 16_384, "a page is at most 16,384 bytes");
        all.extend(page["records"].as_array().unwrap().iter().cloned());
        match page.get("next") {
            Some(next) => after = next.clone(),
            None => return all,
        }
    }
}

/// A record's whole snapshot, read in `chunk`-byte ranges.
fn snapshot(s: &Session, ref_id: &str, chunk: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let reply = s.ok("session.output_ref_read", json!({"ref_id": ref_id, "offset": out.len(), "length": chunk}));
        let data = base64::engine::general_purpose::STANDARD.decode(reply["data"].as_str().unwrap()).unwrap();
        if data.is_empty() {
            assert_eq!(reply["size"].as_u64(), Some(out.len() as u64), "{reply}");
            return out;
        }
        out.extend(data);
    }
}

#[test]
fn output_references_end_to_end() {
    let base = tempfile::Builder::new().prefix("bre").tempdir_in("/tmp").unwrap();
    let script = base.path().join("tools.json");
    std::fs::write(&script, tools_script().to_string()).unwrap();
    let mock = broca_mock::exe();
    let log: PathBuf = base.path().join("calls.jsonl");
    let tools = json!({"program": mock, "args": ["--tools", script, "--call-log", log],
                       "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true});
    let h = Harness::start_with(Options { modules: vec![(TOOLS.to_string(), tools)], ..Options::default() });
    support::wait_tool_provider(&h, TOOLS);
    let name = h.unique("refs");
    let s = h.session(HARNESS, &name, None);
    let describe = s.ok("role.describe", json!({}));
    let caps = describe["capabilities"].as_array().unwrap();
    assert!(caps.iter().any(|g| g == "output_refs"), "{describe}");
    for op in ["session.output_refs", "session.output_ref_read"] {
        assert!(describe["majors"][0]["ops"].as_array().unwrap().iter().any(|o| o == op), "{op}");
    }

    // The first turn: the model reads the log. Its second request shows the output numbered.
    h.install(json!({"responses": [call_step("c1", "logs", json!({})), text_step("the log is quiet")]}));
    let sent = s.ok("session.send", plan_send("show me the log", true));
    s.wait_run(sent["run_id"].as_str().unwrap(), "completed");
    assert_eq!(shown_number(&h, "show me the log"), Some(1), "the user's text is part 1");
    let tag = shown_number(&h, "LOGS-MARKER").expect("the tool output was shown with a number");
    assert_eq!(tag, 2, "the call's result is numbered at the call's position");

    // The second turn: the reply names the output, the user's text and an unknown number, and
    // a `summarize` call names the output in its token slot.
    h.install(json!({"responses": [
        json!({"events": [{"text": format!("see $$tc({tag}), not $$tc(1) nor $$tc(77)")},
                          // The model reuses its first call's id: calls pair with results by position.
                          {"tool_call": {"id": "c1", "name": "summarize", "arguments": {"data": format!("$$tc({tag})"), "note": format!("$$tc({tag})")}}},
                          {"finish": "tool_calls"}]}),
        text_step("summarized"),
    ]}));
    let second = s.ok("session.send", plan_send("what does it say?", true));
    s.wait_run(second["run_id"].as_str().unwrap(), "completed");
    let last = String::from_utf8_lossy(&h.mock.requests("default").last().unwrap().body).to_string();
    assert!(last.contains("§6§ summary: quiet"), "numbers continue over the new messages: {last}");
    assert!(last.contains(&format!("§{tag}§ LOGS-MARKER")), "the first call's result keeps its number: {last}");

    let sets = descriptors(&s);
    let with_refs: Vec<_> = sets.iter().filter(|(_, _, d)| d["count"].as_u64() > Some(0)).collect();
    assert_eq!(with_refs.len(), 2, "the reply set and the call set: {sets:?}");
    let (reply_ordinal, reply_part, reply) = with_refs[0];
    let (call_ordinal, call_part, call) = with_refs[1];
    assert_eq!((reply_part, call_ordinal, call_part), (&None, reply_ordinal, &Some(1)), "{sets:?}");
    assert_eq!(reply["dialect"], "rich-ui/1");
    assert_eq!(reply["count"], 3);
    assert!(reply.get("call_key").is_none() && call["call_key"].is_string(), "{reply} {call}");

    let reply_records = records(&s, reply["set_id"].as_str().unwrap());
    let states: Vec<(&str, Option<&str>)> =
        reply_records.iter().map(|r| (r["state"].as_str().unwrap(), r["reason"].as_str())).collect();
    assert_eq!(
        states,
        [("resolved", None), ("unresolved", Some("not_a_tool_output")), ("unresolved", Some("unknown_tag"))]
    );
    let resolved = &reply_records[0];
    assert_eq!((resolved["tool"].as_str(), resolved["provider"].as_str()), (Some("logs"), Some(TOOLS)));
    assert_eq!(resolved["bytes"].as_u64(), Some(output().len() as u64));
    // The snapshot is the stored output, never the rendered `§N§ ` prefix.
    let ref_id = resolved["ref_id"].as_str().unwrap();
    assert_eq!(snapshot(&s, ref_id, 1000), output().as_bytes(), "read back in ranges, byte for byte");
    let call_records = records(&s, call["set_id"].as_str().unwrap());
    assert_eq!(call_records.len(), 1, "only the declared slot is scanned: {call_records:?}");
    assert_eq!(call_records[0]["sha256"], resolved["sha256"]);
    assert_ne!(call["call_key"], resolved["call_key"], "the containing call is not the referenced one");

    // Refusals, pinned: another session's ids are unknown, and reads stay within bounds.
    let size = output().len();
    let (code, body) = s.refused("session.output_ref_read", json!({"ref_id": ref_id, "offset": size + 1, "length": 0}));
    assert_eq!((code.as_str(), &body["detail"]["field"]), ("invalid_params", &json!("offset")));
    pin::assert_golden("output_ref_read.offset_beyond.json", &body.to_string(), None);
    let (_, body) = s.refused("session.output_ref_read", json!({"ref_id": ref_id, "offset": 0, "length": 131_073}));
    pin::assert_golden("output_ref_read.length_over_cap.json", &body.to_string(), None);
    let meta = s.ok("session.output_ref_read", json!({"ref_id": ref_id, "offset": 0, "length": 0}));
    assert_eq!(meta, json!({"data": "", "size": size, "format": "text"}));
    let (_, body) = s.refused("session.output_refs", json!({"set_id": "ors-000000000000-3"}));
    pin::assert_golden("output_refs.unknown_ref.json", &body.to_string(), None);
    let (_, body) = s.refused("session.output_refs", json!({"set_id": reply["set_id"], "after": "nope"}));
    pin::assert_golden("output_refs.unknown_cursor.json", &body.to_string(), None);
    let stranger = h.session(HARNESS, &h.unique("other"), None);
    h.install(json!({"responses": [text_step("hello")]}));
    let other = stranger.ok("session.send", plan_send("hi", true));
    stranger.wait_run(other["run_id"].as_str().unwrap(), "completed");
    assert_eq!(stranger.refused("session.output_refs", json!({"set_id": reply["set_id"]})).0, "unknown_ref");
    assert_eq!(
        stranger.refused("session.output_ref_read", json!({"ref_id": ref_id, "offset": 0, "length": 0})).0,
        "unknown_ref"
    );

    // Descriptors are display metadata only.
    for (method, params) in
        [("session.read", json!({"limit": 100})), ("run.status", json!({"run_id": second["run_id"]}))]
    {
        let body = s.ok(method, params).to_string();
        assert!(!body.contains("output_refs") && !body.contains("§"), "{method} is unchanged: {body}");
    }

    // A session whose plan does not opt in shows no numbers and has no sets.
    let plain = h.session(HARNESS, &h.unique("plain"), None);
    h.install(json!({"responses": [call_step("c1", "logs", json!({})), text_step("quiet")]}));
    let run = plain.ok("session.send", plan_send("show me the log", false));
    plain.wait_run(run["run_id"].as_str().unwrap(), "completed");
    let last = String::from_utf8_lossy(&h.mock.requests("default").last().unwrap().body).to_string();
    assert!(!last.contains('§'), "no numbers without the opt-in: {last}");
    assert!(descriptors(&plain).is_empty());

    // Retention removes the sets with the session: a retained session's reference is readable
    // until it expires, then every read answers `expired`, and its WAL is deleted.
    let brief = h.session(HARNESS, &h.unique("brief"), None);
    h.install(json!({"responses": [call_step("c1", "logs", json!({})), text_step("quiet"), text_step("see $$tc(2)")]}));
    let mut first = plan_send("show me the log", true);
    first["retention"] = json!(1);
    let run = brief.ok("session.send", first);
    brief.wait_run(run["run_id"].as_str().unwrap(), "completed");
    let run = brief.ok("session.send", plan_send("cite it", true));
    brief.wait_run(run["run_id"].as_str().unwrap(), "completed");
    let set = descriptors(&brief).into_iter().find(|(_, _, d)| d["count"] == 1).expect("the citing reply's set").2;
    assert_eq!(records(&brief, set["set_id"].as_str().unwrap())[0]["state"], "resolved");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match brief.call("session.output_refs", json!({"set_id": set["set_id"]})) {
            Err((code, _)) if code == "expired" => break,
            other => assert!(Instant::now() < until, "the retained session never expired: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    while brief.wal_path().exists() {
        assert!(Instant::now() < until, "the expired session's WAL was never deleted");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The records are a function of the durable transcript: the same after a SIGKILL.
    let before = (descriptors(&s), records(&s, reply["set_id"].as_str().unwrap()));
    let old = h.kill_broca();
    h.wait_respawn(old);
    let s = h.session(HARNESS, &name, None);
    let after = (descriptors(&s), records(&s, reply["set_id"].as_str().unwrap()));
    assert_eq!(before, after, "the sets read the same after a restart");
}
