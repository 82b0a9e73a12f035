//! The published llm-runner/v1 test vectors (`cortexkit-role-llm-runner`, feature
//! `test-vectors`) against broca: broca's own answers decode with the role crate's types, the
//! vectors' requests are accepted, and what the vectors refuse broca refuses — except where
//! the project spec and the published role disagree; each such case is asserted here as the
//! spec's behaviour and named in `DEVIATIONS`.

mod inproc;
use broca_mock::mock;
mod pin;

use std::time::{Duration, Instant};

use cortexkit_role_llm_runner::run::{RunResult, RunStatus};
use cortexkit_role_llm_runner::send::SendReply;
use cortexkit_role_llm_runner::vectors;
use inproc::{reply_script, rig, Rig};
use serde_json::{json, Value};

/// Vector cases where the project spec wins over the published role (reference §14).
const DEVIATIONS: &[(&str, &str, &str)] = &[
    ("send.json", "no send_id", "accepted: send_id is optional in the spec (§4); the server mints a run id"),
    (
        "send.json",
        "first send carrying a plan and runner parameters",
        "refused invalid_params model: broca has no fetch plans and names models {provider, model}",
    ),
    (
        "run-cancel.json",
        "unknown cancellation points decode open for runner admission",
        "refused invalid_params at: the spec refuses an unlisted at (§13)",
    ),
    (
        "live-events.json",
        "after a head with limits",
        "refused invalid_params from: the vector's cursor {seq} is another runner's; broca's is {wal_seq, sub_index} (§7)",
    ),
];

fn vector(name: &str) -> Value {
    serde_json::from_str(vectors::file(name).unwrap_or_else(|| panic!("no vector {name}"))).unwrap()
}

fn cases<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key].as_array().unwrap_or_else(|| panic!("vector member {key}"))
}

fn deviation(file: &str, name: &str) -> bool {
    DEVIATIONS.iter().any(|(f, n, _)| *f == file && *n == name)
}

/// A vector request made admissible for broca: the model broca routes to.
fn with_model(mut request: Value) -> Value {
    if request.get("model").is_none() {
        request["model"] = json!({"provider": "mock", "model": "echo-chat"});
    }
    request
}

impl Rig {
    fn until(&self, run_id: &str, terminal: &[&str]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.call("run.status", json!({"run_id": run_id})).unwrap();
            if terminal.contains(&status["state"].as_str().unwrap_or("")) {
                return status;
            }
            assert!(Instant::now() < deadline, "{run_id}: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn send_vectors_are_accepted_refused_and_answered_in_the_roles_shapes() {
    let file = vector("send.json");
    let rig = rig(Duration::from_secs(5));
    let long = json!({"events": [{"text": "busy"}, {"delay_ms": 600}, {"finish": "stop"}]});
    let mut responses = vec![long];
    responses.extend((0..8).map(|i| reply_script(&format!("r{i}"), 0)));
    rig.script(json!({"responses": responses}));
    // The first vector request starts a run; the others meet it running (queue, steer, interrupt).
    for case in cases(&file, "requests") {
        let name = case["name"].as_str().unwrap();
        let answer = rig.call("session.send", with_model(case["request"].clone()));
        if deviation("send.json", name) {
            assert_eq!(answer.unwrap_err().detail.unwrap().get("field"), Some(&json!("model")), "{name}");
            continue;
        }
        let answer = answer.unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let decoded: SendReply = serde_json::from_value(answer.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(["active", "pending"].contains(&answer["state"].as_str().unwrap()), "{name}: {answer}");
        drop(decoded);
        // An identical re-send answers from the record and decodes the same way.
        let again = rig.call("session.send", with_model(case["request"].clone())).unwrap();
        let _: SendReply = serde_json::from_value(again).unwrap();
    }
    for case in cases(&file, "refused_requests") {
        let name = case["name"].as_str().unwrap();
        let answer = rig.call("session.send", with_model(case["request"].clone()));
        if deviation("send.json", name) {
            assert!(answer.is_ok(), "{name}: the spec accepts it");
            continue;
        }
        let e = answer.unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.detail.unwrap().get("field")),
            ("invalid_params", Some(&case["field"])),
            "{name}"
        );
    }
    // The vectors' replies decode with the same type broca's replies were decoded with.
    for case in cases(&file, "replies") {
        let _: SendReply = serde_json::from_value(case["reply"].clone()).unwrap();
    }
    // The refusals broca shares with the role: same code and detail.field.
    let reuse = rig.call(
        "session.send",
        with_model(json!({"prompt": "next task", "send_id": "owner-delivery-17", "delivery": "steer"})),
    );
    assert_eq!(reuse.unwrap_err().detail.unwrap().get("field"), Some(&json!("delivery")));
    let reuse = rig.call("session.send", with_model(json!({"prompt": "another", "send_id": "owner-delivery-17"})));
    assert_eq!(reuse.unwrap_err().detail.unwrap().get("field"), Some(&json!("prompt")));
}

#[test]
fn send_status_vectors_are_refused_by_field_and_unknown_sends_by_code() {
    let file = vector("send-status.json");
    let rig = rig(Duration::from_secs(5));
    let sent =
        rig.call("session.send", with_model(json!({"prompt": "check the build", "send_id": "reminder-7"}))).unwrap();
    for case in cases(&file, "requests") {
        let answer = rig.call("send.status", case["request"].clone()).unwrap();
        let _: SendReply = serde_json::from_value(answer.clone()).unwrap();
        assert_eq!(answer["run_id"], sent["run_id"]);
    }
    for case in cases(&file, "refused_requests") {
        let e = rig.call("send.status", case["request"].clone()).unwrap_err();
        assert_eq!((e.code.as_str(), e.detail.unwrap().get("field")), ("invalid_params", Some(&case["field"])));
    }
    for case in cases(&file, "refusals") {
        let e = rig.call("send.status", case["request"].clone()).unwrap_err();
        assert_eq!(e.code.as_str(), case["refusal"]["code"]);
    }
    for case in cases(&file, "replies") {
        let _: SendReply = serde_json::from_value(case["reply"].clone()).unwrap();
    }
}

#[test]
fn run_result_and_status_decode_with_the_roles_types() {
    let file = vector("run-result.json");
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [
        {"events": [{"reasoning": "hm"}, {"text": "All pass.\n"}, {"text": "The fix is in parse.rs."}, {"usage": {"input": 4, "output": 2}}, {"finish": "stop"}]},
        {"events": [{"usage": {"input": 1, "output": 1}}, {"finish": "stop"}]},
    ]}));
    let a = rig.call("session.send", with_model(json!({"prompt": "go", "send_id": "rr-1"}))).unwrap();
    let run_a = a["run_id"].as_str().unwrap();
    let status = rig.until(run_a, &["completed"]);
    let decoded: RunStatus = serde_json::from_value(status).unwrap();
    assert_eq!(decoded.state, "completed");
    assert_eq!(decoded.undelivered_steers, Some(vec![]));
    let result = rig.call("run.result", json!({"run_id": run_a})).unwrap();
    let decoded: RunResult = serde_json::from_value(result).unwrap();
    assert!(decoded.final_message_consistent());
    assert_eq!(decoded.final_message.unwrap().text, "All pass.\nThe fix is in parse.rs.");
    // A completed run whose final message has no text part: "", never absent.
    let b = rig.call("session.send", with_model(json!({"prompt": "again", "send_id": "rr-2"}))).unwrap();
    rig.until(b["run_id"].as_str().unwrap(), &["completed"]);
    let result = rig.call("run.result", json!({"run_id": b["run_id"]})).unwrap();
    assert_eq!(result["final_message"]["text"], "");
    for case in cases(&file, "refused_requests") {
        assert_eq!(rig.call("run.result", case["request"].clone()).unwrap_err().code, "invalid_params");
    }
    for case in cases(&file, "refusals") {
        assert_eq!(rig.call("run.result", case["request"].clone()).unwrap_err().code.as_str(), case["refusal"]["code"]);
    }
    for case in cases(&file, "answers") {
        let _: RunResult = serde_json::from_value(case["answer"].clone()).unwrap();
    }
    for name in
        ["run_status.usage_unreported_step.json", "run_status.usage_disjoint_input.json", "run_status.held.json"]
    {
        let _: RunStatus = serde_json::from_value(vector(name)).unwrap();
    }
}

#[test]
fn run_cancel_vectors_ack_idempotently_and_escalate() {
    let file = vector("run-cancel.json");
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [
        {"events": [{"text": "long"}, {"delay_ms": 20000}, {"finish": "stop"}]},
        {"status": 401},
    ]}));
    for case in cases(&file, "canonical") {
        let name = case["name"].as_str().unwrap();
        let answer = rig.call("run.cancel", case["params"].clone());
        if deviation("run-cancel.json", name) {
            assert_eq!(answer.unwrap_err().detail.unwrap().get("field"), Some(&json!("at")), "{name}");
        } else {
            assert_eq!(answer.unwrap(), "not_active", "{name}: no run r1 here");
        }
    }
    // "now escalates a waiting boundary cancellation": ack, ack, cancelled.
    let a = rig.call("session.send", with_model(json!({"prompt": "long", "send_id": "rc-1"}))).unwrap();
    let run_a = a["run_id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.mock.requests("default").is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(rig.call("run.cancel", json!({"run_id": run_a, "at": "step_boundary"})).unwrap(), "ack");
    assert_eq!(rig.call("run.cancel", json!({"run_id": run_a, "at": "now"})).unwrap(), "ack");
    rig.until(run_a, &["cancelled"]);
    // "paused run is already at a boundary and starts no further step".
    let b = rig.call("session.send", with_model(json!({"prompt": "auth", "send_id": "rc-2"}))).unwrap();
    let run_b = b["run_id"].as_str().unwrap();
    rig.until(run_b, &["paused"]);
    assert_eq!(rig.call("run.cancel", json!({"run_id": run_b, "at": "step_boundary"})).unwrap(), "ack");
    rig.until(run_b, &["cancelled"]);
    assert_eq!(rig.mock.requests("default").len(), 2);
}

#[test]
fn input_token_cap_results_decode_and_match_broca_s_detail_shape() {
    let file = vector("input-token-cap-results.json");
    for case in cases(&file, "canonical") {
        let r: RunResult = serde_json::from_value(case["result"].clone()).unwrap();
        let s: RunStatus = serde_json::from_value(case["status"].clone()).unwrap();
        assert!(r.detail.is_some() && s.detail.is_some());
    }
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [reply_script("within", 0)]}));
    let capped = with_model(json!({"prompt": "x", "send_id": "cap-1", "budget": {"max_input_tokens": 5}}));
    let a = rig.call("session.send", capped).unwrap();
    // Spending the cap exactly ends the run (a cap of N stops at N).
    rig.until(a["run_id"].as_str().unwrap(), &["budget_exhausted"]);
    let b = rig.call("session.send", with_model(json!({"prompt": "y", "send_id": "cap-2"}))).unwrap();
    let status = rig.until(b["run_id"].as_str().unwrap(), &["budget_exhausted"]);
    let decoded: RunStatus = serde_json::from_value(status).unwrap();
    let detail = serde_json::to_value(decoded.detail.unwrap()).unwrap();
    assert_eq!(detail, json!({"limit": 5, "spent": 5, "cause": "limit_reached"}));
    let result: RunResult =
        serde_json::from_value(rig.call("run.result", json!({"run_id": b["run_id"]})).unwrap()).unwrap();
    assert_eq!(result.state, "budget_exhausted");
}

#[test]
fn role_describe_declares_only_what_broca_serves_and_passes_the_check() {
    let rig = rig(Duration::from_secs(5));
    let describe = rig.call("role.describe", json!({})).unwrap();
    cortexkit_role_llm_runner::describe::check_describe(&describe).unwrap();
    let caps: Vec<&str> = describe["capabilities"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for group in [
        "run_status",
        "run_cancel",
        "run_usage",
        "queue",
        "steer",
        "interrupt",
        "max_steps",
        "no_tools",
        "input_token_cap",
        "send_status",
        "session_class",
        "transcript_reads",
        "run_ops",
        "dispatch_attribution",
        "finish_reason",
        "session_usage",
        "host_history",
        "history_display",
        "streaming",
        "live_events",
        "run_cause",
        "head_sender",
        "retention",
    ] {
        assert!(caps.contains(&group), "{group} missing from {caps:?}");
    }
    // Retention is declared with its limits (llm-runner §9.1).
    assert_eq!(describe["retention"], json!({"max_seconds": 2_592_000, "delete_within_ms": 2_000}));
    // Groups broca does not serve in full are not declared (a request needing one is refused).
    assert!(caps.contains(&"output_refs"), "output_refs is served (llm-runner §9.13)");
    for group in ["step_events", "live_ids", "attachments", "structured_output"] {
        assert!(!caps.contains(&group), "{group} is declared but not served: {caps:?}");
    }
    assert!(!caps.contains(&"retract"), "broca's retract answer is the spec's object, not the role's string");
    assert_eq!(describe["run_cancel"]["at"], json!(["now", "step_boundary"]));
    assert_eq!(describe["session_class"]["backup_classes"], json!(["head"]));
    let ops: Vec<&str> = describe["majors"][0]["ops"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
    for op in [
        "session.send",
        "session.retract",
        "run.cancel",
        "run.status",
        "run.result",
        "send.status",
        "session.send_status",
    ] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
}

#[test]
fn live_events_subscribe_vectors_are_accepted_and_refused_by_member() {
    let v = vector("live-events.json");
    for case in cases(&v, "requests") {
        let name = case["name"].as_str().unwrap();
        let parsed = broca::serve::parse_subscribe(&case["request"]);
        if deviation("live-events.json", name) {
            let refused = parsed.expect_err(name);
            assert_eq!(refused.detail.unwrap().get("field"), Some(&json!("from")), "{name}");
            continue;
        }
        let parsed = parsed.unwrap_or_else(|r| panic!("{name}: refused {}", r.to_json()));
        assert_eq!(parsed.limits.is_some(), case["limits"] == json!(true), "{name}");
        if let Some(limits) = parsed.limits {
            assert_eq!(serde_json::to_value(limits).unwrap(), case["request"]["limits"], "{name}");
        }
    }
    let golden = ["subscribe.unknown_member.json", "subscribe.limits_missing_bound.json"];
    for (case, golden) in cases(&v, "refused_requests").iter().zip(golden) {
        let name = case["name"].as_str().unwrap();
        let refused = broca::serve::parse_subscribe(&case["request"]).expect_err(name);
        let body = refused.to_json();
        assert_eq!(refused.detail.unwrap().get("field"), Some(&case["field"]), "{name}: {body}");
        pin::assert_golden(golden, &body, None);
    }
}
