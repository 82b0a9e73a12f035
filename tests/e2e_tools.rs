//! Tools from other modules, end to end: the real subc daemon supervises broca and broca-mock
//! as a `tool-provider/v1` module (`broca-mock --subc`), broca-mock also plays the model, and
//! the official consumer SDK drives sessions with fetch plans. Every call is counted at the
//! provider (its call log, outside broca's state root).

use broca_mock::mock;
use broca_mock::tools::call_log;
mod pin;
mod support;

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Harness, Options, Session};

const HARNESS: &str = "tools-e2e";
const TOOLS: &str = "mock-tools";
/// A second provider serving the same built-in tools (for name collisions).
const TWIN: &str = "mock-tools-2";
/// broca's default tool wait in this rig (`BROCA_TEST_TOOL_WAIT_MS`, a debug-build switch).
const TOOL_WAIT_MS: u64 = 1500;

type Scenario = (&'static str, fn(&Harness, &Path));

const SCENARIOS: &[Scenario] = &[
    ("a plan is fetched once, frozen, and a differing later plan is plan_drift", plan_frozen_and_drift),
    ("a parallel batch answered out of order lands in planned order", parallel_batch_in_planned_order),
    ("a provider refusal and an oversized result are model-visible errors", refusals_and_oversize),
    ("a call past its bound is indeterminate and the run ends interrupted", call_past_its_bound),
    ("run.cancel mid-call sends CANCEL and records an unknown outcome", cancel_mid_call),
    ("admission refuses unreachable providers and admits optional ones absent", unreachable_and_optional),
    ("two providers offering one name are refused tool_name_collision", name_collision),
    ("system text from a plan goes before the send's own system prompt", system_text_items),
    (
        "an absent optional provider takes its paired text and composition entry",
        absent_optional_provider_takes_its_text,
    ),
    ("a provider that restarts mid-session is reached again on a new route", provider_restart),
    ("broca-run --subc --tool-provider runs a turn with the provider's tools", cli_turn_with_tools),
];

fn plan(items: Value) -> Value {
    json!({"tool_items": items})
}

fn tools_item() -> Value {
    json!({"provider": TOOLS, "params": {}})
}

/// A plan send on the mock model.
fn plan_send(prompt: &str, plan: Value) -> Value {
    let mut p = support::send_params(prompt);
    p["plan"] = plan;
    p
}

fn call_step(calls: &[(&str, &str, Value)]) -> Value {
    let mut events: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({"tool_call": {"id": id, "name": name, "arguments": args}}))
        .collect();
    events.push(json!({"finish": "tool_calls"}));
    json!({"events": events})
}

fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

fn counts(log: &Path) -> call_log::Counts {
    call_log::read(log).unwrap_or_else(|e| panic!("the provider's call log: {e:?}"))
}

/// The session's messages.
fn messages(s: &Session) -> Vec<Value> {
    s.ok("session.read", json!({"limit": 1000}))["messages"].as_array().cloned().unwrap_or_default()
}

/// The tool-role message's results as `(tool_call_id, output)`, in order.
fn tool_results(s: &Session) -> Vec<(String, Value)> {
    let msgs = messages(s);
    let tool = msgs.iter().rev().find(|m| m["message"]["role"] == "tool").expect("a tool message");
    tool["message"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["tool_call_id"].as_str().unwrap().to_string(), p["output"].clone()))
        .collect()
}

fn run_id(reply: &Value) -> String {
    reply["run_id"].as_str().unwrap_or_else(|| panic!("no run id in {reply}")).to_string()
}

fn plan_frozen_and_drift(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("frozen"), None);
    let fetches = |c: &call_log::Counts| {
        c.entries.iter().filter(|e| matches!(e, call_log::Entry::Role(r) if r.op == "tool.catalog")).count()
    };
    let before = fetches(&counts(log));
    h.install(json!({"responses": [text_step("one"), text_step("two"), text_step("three")]}));
    let first = s.ok("session.send", plan_send("hello", plan(json!([tools_item()]))));
    s.wait_run(&run_id(&first), "completed");
    assert_eq!(fetches(&counts(log)), before + 1, "the first episode fetched the catalog once");
    let baseline = s.ok("session.baseline", json!({}));
    assert_eq!(baseline["state"], "ready", "{baseline}");
    let names = baseline["baseline"]["tool_names"].as_array().unwrap();
    assert!(names.iter().any(|n| n == "echo") && names.iter().any(|n| n == "hang"), "{baseline}");
    // The same plan again is a no-op; no plan inherits the frozen one. Neither fetches.
    let again = s.ok("session.send", plan_send("again", plan(json!([tools_item()]))));
    s.wait_run(&run_id(&again), "completed");
    let plain = s.ok("session.send", support::send_params("plain"));
    s.wait_run(&run_id(&plain), "completed");
    assert_eq!(fetches(&counts(log)), before + 1, "later sends never refetch");
    // The model saw the plan's tools on every request.
    let requests = h.mock.requests("default");
    let last: Value = serde_json::from_slice(&requests.last().unwrap().body).unwrap();
    assert!(last["tools"].as_array().is_some_and(|t| t.len() >= 6), "{last}");
    // A different plan is refused by identity, and writes nothing.
    let wal_len = std::fs::metadata(s.wal_path()).unwrap().len();
    let (code, body) = s.refused(
        "session.send",
        plan_send("drift", plan(json!([{"provider": TOOLS, "preset": "worker", "params": {}}]))),
    );
    assert_eq!(code, "plan_drift", "{body}");
    pin::assert_golden("plan_drift.json", &body.to_string(), None);
    assert!(body["detail"]["frozen"].is_string() && body["detail"]["sent"].is_string(), "{body}");
    assert_eq!(std::fs::metadata(s.wal_path()).unwrap().len(), wal_len, "a refused send wrote nothing");
    // Legacy tools on a plan session are refused by name.
    let mut with_tools = support::send_params("tools");
    with_tools["tools"] = json!([{"name": "x", "input_schema": {"type": "object"}}]);
    let (code, body) = s.refused("session.send", with_tools);
    assert_eq!((code.as_str(), body["detail"]["field"].as_str()), ("invalid_params", Some("tools")), "{body}");
}

fn parallel_batch_in_planned_order(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("batch"), None);
    let tag = h.unique("b");
    let slow = json!({"ms": 600, "tag": tag});
    let mid = json!({"ms": 300, "tag": tag});
    let fast = json!({"tag": tag, "n": 3});
    h.install(json!({"responses": [
        call_step(&[("c1", "sleep", slow.clone()), ("c2", "sleep", mid.clone()), ("c3", "echo", fast.clone())]),
        text_step("done"),
    ]}));
    let reply = s.ok("session.send", plan_send("batch", plan(json!([tools_item()]))));
    s.wait_run(&run_id(&reply), "completed");
    let results = tool_results(&s);
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2", "c3"], "one tool message, in planned order");
    assert_eq!(results[2].1["json"], fast, "echo answered its arguments: {:?}", results[2].1);
    let c = counts(log);
    for (tool, args) in [("sleep", &slow), ("sleep", &mid), ("echo", &fast)] {
        let key = call_log::call_key_of(None, tool, args);
        assert_eq!(c.calls_of(&key), 1, "{key} ran exactly once");
    }
    // Each result came back after the one planned after it (out of order at the provider).
    let replies: Vec<String> = c
        .entries
        .iter()
        .filter_map(|e| match e {
            call_log::Entry::Reply(r) if r.key.contains(&tag) => Some(r.key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(replies.first().map(|k| k.contains("\"n\":3")), Some(true), "echo answered first: {replies:?}");
    // The transcript carries each call's dispatch facts on the message that asked for it.
    let msgs = messages(&s);
    let asked = msgs.iter().find(|m| m["tool_calls"].is_array()).expect("the assistant message's tool_calls");
    let facts = asked["tool_calls"].as_array().unwrap();
    let ids: Vec<&str> = facts.iter().map(|f| f["tool_call_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["c1", "c2", "c3"], "{asked}");
    for f in facts {
        assert_eq!((f["dispatched_to"].as_str(), f["indeterminate"].as_bool()), (Some(TOOLS), Some(false)), "{f}");
        assert!(f["call_key"].as_str().is_some_and(|k| k.contains(':')), "{f}");
    }
    // run.tool_calls pages them in dispatch order.
    let run = run_id(&reply);
    let first = s.ok("run.tool_calls", json!({"run_id": run, "limit": 2}));
    assert_eq!(first["calls"].as_array().unwrap().len(), 2, "{first}");
    let rest = s.ok("run.tool_calls", json!({"run_id": run, "after": first["next"]}));
    assert!(rest.get("next").is_none(), "{rest}");
    let all: Vec<Value> =
        first["calls"].as_array().unwrap().iter().chain(rest["calls"].as_array().unwrap()).cloned().collect();
    let ordinal = asked["ordinal"].as_u64().unwrap();
    for (i, call) in all.iter().enumerate() {
        assert_eq!(call["outcome"], "succeeded", "{call}");
        assert_eq!((call["ordinal"].as_u64(), call["position"].as_u64()), (Some(ordinal), Some(i as u64)), "{call}");
        assert_eq!(call["result_ordinal"].as_u64(), Some(ordinal + 1), "{call}");
        assert_eq!(call["dispatched_to"], TOOLS, "{call}");
        assert!(call["result_bytes"].as_u64().unwrap() > 0, "{call}");
    }
    assert_eq!(all[2]["args"], fast);
    let (code, body) = s.refused("run.tool_calls", json!({"run_id": run, "after": "c99"}));
    assert_eq!((code.as_str(), body["detail"]["field"].as_str()), ("invalid_params", Some("after")), "{body}");
    let (code, _) = s.refused("run.tool_calls", json!({"run_id": "run-nope"}));
    assert_eq!(code, "unknown_run");
}

fn refusals_and_oversize(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("errors"), None);
    let tag = h.unique("e");
    let big = json!({"bytes": 70 * 1024, "tag": tag});
    h.install(json!({"responses": [
        call_step(&[("f1", "fail", json!({"tag": tag})), ("b1", "big", big.clone())]),
        text_step("noted"),
    ]}));
    let reply = s.ok("session.send", plan_send("errors", plan(json!([tools_item()]))));
    s.wait_run(&run_id(&reply), "completed");
    let results = tool_results(&s);
    let refused = &results[0].1;
    assert_eq!(
        (refused["kind"].as_str(), refused["code"].as_str()),
        (Some("error"), Some("tool_unavailable")),
        "{refused}"
    );
    assert_eq!(refused["module"], TOOLS, "{refused}");
    let oversized = &results[1].1;
    assert_eq!(oversized["code"], "tool_result_too_large", "{oversized}");
    pin::assert_golden("tool_result_too_large.output.json", &oversized.to_string(), None);
    let detail: Value = serde_json::from_str(oversized["detail"].as_str().unwrap()).unwrap();
    assert_eq!(detail["limit"], 65536, "{detail}");
    assert!(detail["bytes"].as_u64().unwrap() > 65536, "{detail}");
    assert_eq!(
        counts(log).calls_of(&call_log::call_key_of(None, "big", &big)),
        1,
        "the big call ran once, never again"
    );
    // The model saw the error text, not the discarded output.
    let requests = h.mock.requests("default");
    let last = String::from_utf8_lossy(&requests.last().unwrap().body).into_owned();
    assert!(last.contains("tool_result_too_large") && !last.contains(&"x".repeat(1000)), "the model's view");
}

fn call_past_its_bound(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("bound"), None);
    let args = json!({"tag": h.unique("h")});
    h.install(json!({"responses": [call_step(&[("h1", "hang", args.clone())])]}));
    let reply = s.ok("session.send", plan_send("hang", plan(json!([tools_item()]))));
    let status = s.wait_run(&run_id(&reply), "interrupted");
    assert!(status["state"] == "interrupted", "{status}");
    let results = tool_results(&s);
    assert!(results[0].1["message"].as_str().unwrap().contains("unknown"), "{:?}", results[0]);
    let listed = s.ok("run.tool_calls", json!({"run_id": run_id(&reply)}));
    assert_eq!(listed["calls"][0]["outcome"], "indeterminate", "{listed}");
    let asked = messages(&s).into_iter().find(|m| m["tool_calls"].is_array()).unwrap();
    // Closed with its outcome_unknown result, the call is no longer indeterminate on reads.
    assert_eq!(asked["tool_calls"][0]["indeterminate"], false, "{asked}");
    assert_eq!(finished_unknown(&s), [vec!["h1".to_string()]], "the terminal lists the call given up on");
    let key = call_log::call_key_of(None, "hang", &args);
    let until = Instant::now() + support::STEP;
    loop {
        let c = counts(log);
        let cancelled = c.entries.iter().any(|e| matches!(e, call_log::Entry::Cancel(x) if x.key == key));
        if cancelled {
            assert_eq!(c.calls_of(&key), 1);
            break;
        }
        assert!(Instant::now() < until, "the provider never saw the CANCEL");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each `RunFinished`'s `indeterminate_tool_calls`, read from the session's WAL.
fn finished_unknown(s: &Session) -> Vec<Vec<String>> {
    use broca::record::Record;
    let mut out = Vec::new();
    broca::wal::read(&s.wal_path(), broca::record::KNOWN_FEATURES, None, &mut |f: broca::wal::ScannedFrame<'_>| {
        if let Ok(Record::RunFinished { indeterminate_tool_calls, .. }) = Record::decode(f.payload) {
            out.push(indeterminate_tool_calls);
        }
        Ok::<(), broca::lineage::LineageError>(())
    })
    .unwrap();
    out
}

fn cancel_mid_call(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("cancel"), None);
    let args = json!({"ms": 5000, "tag": h.unique("c")});
    h.install(json!({"responses": [call_step(&[("s1", "sleep", args.clone())])]}));
    let reply = s.ok("session.send", plan_send("cancel", plan(json!([tools_item()]))));
    let run = run_id(&reply);
    let key = call_log::call_key_of(None, "sleep", &args);
    let until = Instant::now() + support::STEP;
    while counts(log).calls_of(&key) == 0 {
        assert!(Instant::now() < until, "the call never reached the provider");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.ok("run.cancel", json!({"run_id": run, "at": "now"})), json!("ack"));
    s.wait_run(&run, "cancelled");
    let results = tool_results(&s);
    assert!(results[0].1["message"].as_str().unwrap().contains("outcome is unknown"), "{:?}", results[0]);
    let until = Instant::now() + support::STEP;
    while !counts(log).entries.iter().any(|e| matches!(e, call_log::Entry::Cancel(x) if x.key == key)) {
        assert!(Instant::now() < until, "the provider never saw the CANCEL");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(counts(log).calls_of(&key), 1);
}

fn unreachable_and_optional(h: &Harness, _log: &Path) {
    let s = h.session(HARNESS, &h.unique("absent"), None);
    let (code, body) =
        s.refused("session.send", plan_send("hi", plan(json!([{"provider": "no-such-module", "params": {}}]))));
    assert_eq!(code, "fetch_unavailable", "{body}");
    pin::assert_golden("fetch_unavailable.json", &body.to_string(), None);
    assert_eq!(body["detail"]["provider"], "no-such-module", "{body}");
    assert!(!s.wal_path().exists(), "a refused first send created no session");
    h.install(json!({"responses": [text_step("fine")]}));
    let items = json!([tools_item(), {"provider": "no-such-module", "params": {}, "optional": true}]);
    let reply = s.ok("session.send", plan_send("hi", plan(items)));
    s.wait_run(&run_id(&reply), "completed");
    let baseline = s.ok("session.baseline", json!({}));
    let absent = &baseline["baseline"]["absent_items"];
    assert_eq!(absent[0]["provider"], "no-such-module", "{baseline}");
}

/// An absent optional provider takes its paired system text and its composition entry with it
/// (spec §4, fetch-plan-optional-tools/v1, #47): the launch is admitted, the absences name
/// `tool` and `system_text`, the surviving text is fetched again against the admitted
/// composition, and the baseline carries that composition's digest.
fn absent_optional_provider_takes_its_text(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("optional-text"), None);
    h.install(json!({"responses": [text_step("fine")]}));
    let composition = json!({TOOLS: {"role": "tools"}, "no-such-module": {"role": "gone"}});
    let admitted = json!({TOOLS: {"role": "tools"}});
    let digest = |v: &Value| cortexkit_role_tool_provider::catalog::composition_digest(v).unwrap();
    let plan = json!({
        "tool_items": [{"provider": TOOLS, "preset": "default", "params": {}},
                       {"provider": "no-such-module", "preset": "default", "params": {}, "optional": true}],
        "system_text_items": [{"provider": TOOLS, "preset": "default", "params": {}},
                              {"provider": "no-such-module", "preset": "default", "params": {}}],
        "composition": composition,
        "composition_digest": digest(&composition),
    });
    let reply = s.ok("session.send", plan_send("hi", plan));
    s.wait_run(&run_id(&reply), "completed");
    let baseline = s.ok("session.baseline", json!({}));
    let absent: Vec<(Value, Value)> = baseline["baseline"]["absent_items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["provider"].clone(), a["kind"].clone()))
        .collect();
    assert_eq!(absent, [(json!("no-such-module"), json!("tool")), (json!("no-such-module"), json!("system_text"))]);
    assert_eq!(baseline["baseline"]["composition_digest"], json!(digest(&admitted)), "{baseline}");
    let texts: Vec<Option<String>> = counts(log)
        .entries
        .iter()
        .filter_map(|e| match e {
            call_log::Entry::Role(r) if r.system_text => Some(r.composition_digest.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts.last(), Some(&Some(digest(&admitted))), "the surviving text was fetched again: {texts:?}");
    let request = h.mock.requests("default").last().unwrap().body_json().unwrap().to_string();
    assert!(request.contains("broca-mock system text (default)"), "the surviving text is rendered: {request}");
}

fn system_text_items(h: &Harness, _log: &Path) {
    let s = h.session(HARNESS, &h.unique("text"), None);
    let preset_less = json!({"tool_items": [tools_item()], "system_text_items": [{"provider": TOOLS, "params": {}}]});
    let (code, body) = s.refused("session.send", plan_send("hi", preset_less));
    assert_eq!(body["detail"]["field"], "plan.system_text_items[0].preset", "{code}: {body}");
    h.install(json!({"responses": [text_step("ok")]}));
    let with_text = json!({"tool_items": [{"provider": TOOLS, "preset": "default", "params": {}}],
                           "system_text_items": [{"provider": TOOLS, "preset": "default", "params": {}}]});
    let mut send = plan_send("hi", with_text);
    send["system"] = json!("Be brief.");
    let reply = s.ok("session.send", send);
    s.wait_run(&run_id(&reply), "completed");
    let request: Value = serde_json::from_slice(&h.mock.requests("default").last().unwrap().body).unwrap();
    let rendered = request.to_string();
    let text_at = rendered.find("broca-mock system text (default)").expect("the plan's text was rendered");
    let own_at = rendered.find("Be brief.").expect("the send's own system prompt was rendered");
    assert!(text_at < own_at, "the plan's text comes first: {rendered}");
    let baseline = s.ok("session.baseline", json!({}));
    let items = baseline["baseline"]["items"].as_array().unwrap();
    assert!(items.iter().any(|i| i["item"] == "system_text" && i["provider"] == TOOLS), "{baseline}");
}

fn name_collision(h: &Harness, _log: &Path) {
    let s = h.session(HARNESS, &h.unique("collide"), None);
    let items = json!([tools_item(), {"provider": TWIN, "params": {}}]);
    let (code, body) = s.refused("session.send", plan_send("hi", plan(items)));
    assert_eq!(code, "tool_name_collision", "{body}");
    assert_eq!(body["detail"], json!({"name": "echo", "providers": [TOOLS, TWIN]}), "{body}");
    pin::assert_golden("tool_name_collision.json", &body.to_string(), None);
    assert!(!s.wal_path().exists(), "nothing was written");
}

fn provider_restart(h: &Harness, log: &Path) {
    let s = h.session(HARNESS, &h.unique("restart"), None);
    let before = json!({"tag": h.unique("r1")});
    let after = json!({"tag": h.unique("r2")});
    h.install(json!({"responses": [call_step(&[("r1", "echo", before.clone())]), text_step("one")]}));
    let first = s.ok("session.send", plan_send("first", plan(json!([tools_item()]))));
    s.wait_run(&run_id(&first), "completed");
    // The provider goes away (a real SIGKILL) and the daemon starts it again.
    let pid = provider_pid(h, TOOLS);
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let until = Instant::now() + support::STEP;
    while provider_pid_opt(h, TOOLS).is_none_or(|p| p == pid) {
        assert!(Instant::now() < until, "the daemon never restarted the provider");
        std::thread::sleep(Duration::from_millis(50));
    }
    support::wait_tool_provider(h, TOOLS);
    h.install(json!({"responses": [call_step(&[("r2", "echo", after.clone())]), text_step("two")]}));
    let second = s.ok("session.send", support::send_params("second"));
    s.wait_run(&run_id(&second), "completed");
    let results = tool_results(&s);
    assert_eq!(results[0].1["json"], after, "the call after the restart was answered: {:?}", results[0]);
    let c = counts(log);
    assert_eq!(c.calls_of(&call_log::call_key_of(None, "echo", &after)), 1);
    assert_eq!(c.calls_of(&call_log::call_key_of(None, "echo", &before)), 1);
}

fn cli_turn_with_tools(h: &Harness, log: &Path) {
    let args = json!({"tag": h.unique("cli")});
    h.install(json!({"responses": [call_step(&[("k1", "echo", args.clone())]), text_step("cli done")]}));
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("catalog")).unwrap();
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    std::fs::copy(lkg, root.path().join("catalog/fusiform-lkg.json")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_broca-run"))
        .arg("--state-root")
        .arg(root.path())
        .arg("--project-root")
        .arg(root.path())
        .arg("--base-url")
        .arg(h.mock.base_url(None))
        .arg("--subc")
        .arg(h.connection_file())
        .args(["--tool-provider", TOOLS, "--model", "mock/echo-chat", "--json", "use the tool"])
        .env_remove("BROCA_PROVIDER_BASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "broca-run failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("cli done"), "{stdout}");
    assert_eq!(counts(log).calls_of(&call_log::call_key_of(None, "echo", &args)), 1, "the CLI's call ran once");
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_broca-run"))
        .args(["--tool-provider", TOOLS, "hi"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "--tool-provider without --subc is a usage error");
}

/// The pid of a module the daemon runs, from the process table (its call log's name is in its
/// command line).
fn provider_pid_opt(h: &Harness, module: &str) -> Option<i32> {
    let _ = h;
    let marker = format!("/{module}.calls.jsonl");
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        cmdline.contains(&marker).then_some(pid)
    })
}

fn provider_pid(h: &Harness, module: &str) -> i32 {
    provider_pid_opt(h, module).unwrap_or_else(|| panic!("no process runs {module}"))
}

#[test]
fn tools_from_other_modules() {
    let mock = broca_mock::exe();
    let base = tempfile::Builder::new().prefix("bto").tempdir_in("/tmp").unwrap();
    let module = |id: &str| {
        let log = base.path().join(format!("{id}.calls.jsonl"));
        // The twin declares `serial` concurrency: a credit window of one.
        let concurrency = if id == TWIN { "serial" } else { "module_managed" };
        let entry = json!({"program": mock, "args": ["--call-log", log],
                           "env": {"CK_LOG": "info", "BROCA_MOCK_CONCURRENCY": concurrency},
                           "enabled": true, "reserved": true,
                           "restart": {"max_restarts": 20, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 200}});
        (id.to_string(), entry)
    };
    let opts = Options {
        modules: vec![module(TOOLS), module(TWIN)],
        env: vec![("BROCA_TEST_TOOL_WAIT_MS".into(), TOOL_WAIT_MS.to_string())],
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    let log = base.path().join(format!("{TOOLS}.calls.jsonl"));
    support::wait_tool_provider(&h, TOOLS);
    support::wait_tool_provider(&h, TWIN);
    // Each provider's credit window comes from its declared concurrency, read from the daemon.
    let plane =
        broca::tools::ToolPlane::new(broca::subc::consumer::Consumer::connect(&h.connection_file(), None).unwrap());
    assert_eq!((plane.window(TOOLS), plane.window(TWIN)), (32, 1), "credit windows from catalog.list");
    let mut failed = Vec::new();
    for (name, scenario) in SCENARIOS {
        let started = Instant::now();
        // A failed scenario's unread model script must not answer the next one.
        h.mock.reset("default");
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| scenario(&h, &log))) {
            eprintln!("scenario {name:?} failed after {:?}\n{}", started.elapsed(), h.broca_log_tail(40));
            failed.push((name, e));
        }
    }
    h.stop();
    if let Some((name, e)) = failed.into_iter().next() {
        eprintln!("first failure: {name}");
        resume_unwind(e);
    }
}
