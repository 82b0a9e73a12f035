//! No refusal creates or changes a file (issue #34; spec §10, "bad input writes nothing"): every
//! `session.send` refusal the admission path can produce, and refusals of every strict op, on a
//! session with no record and on one with history. Before and after each refusal the state
//! root's files and bytes (leases aside), the run index's rows and the answers of `session.read`
//! and `session.head` are identical ([`inproc::Rig::footprint`]).
//!
//! The fuzzer (`tests/fuzz/ops.rs`) makes the same check over mutated sends and strict params.

mod inproc;
use broca_mock::mock;
mod pin;

use std::time::{Duration, Instant};

use broca::session_key::SessionKey;
use inproc::{key, rig, send, Rig};
use serde_json::{json, Value};

/// A refusal case: its name (the golden it pins, where one does), the params, and the code it
/// is refused with on a session with no record and on one with history (`None`: the case does
/// not apply there, e.g. it would be admitted).
struct Case {
    name: &'static str,
    params: Value,
    fresh: Option<&'static str>,
    existing: Option<&'static str>,
}

fn model() -> Value {
    json!({"provider": "mock", "model": "echo-chat"})
}

fn with(extra: Value) -> Value {
    let mut params = json!({"prompt": "x", "model": model()});
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    params
}

/// Every send refusal admission produces without a scoped route, an owner or a running turn
/// (those are pinned through the real daemon: `tests/e2e_owners.rs`, `tests/e2e_limits.rs`).
fn send_cases() -> Vec<Case> {
    let both = |name, params, code| Case { name, params, fresh: Some(code), existing: Some(code) };
    let invalid = "invalid_params";
    let huge = "y".repeat(4_300_000);
    vec![
        // The malformed `tools` lists the issue found writing a header-only WAL.
        both("tools.number", with(json!({"tools": 5})), invalid),
        both("tools.item_number", with(json!({"tools": [5]})), invalid),
        both("tools.empty_name", with(json!({"tools": [{"name": ""}]})), invalid),
        both("tools.reply_zero", with(json!({"tools": [{"name": "t", "reply": {"max_ms": 0}}]})), invalid),
        both("prompt.missing", json!({"model": model()}), invalid),
        both("prompt.blank", with(json!({"prompt": "  "})), invalid),
        both("send.prompt_too_large", with(json!({"prompt": huge})), invalid),
        both("session.other", with(json!({"session": "other"})), invalid),
        both("model.shape", with(json!({"model": {"provider": "mock"}})), invalid),
        both("model_unknown", with(json!({"model": {"provider": "nope", "model": "none"}})), "model_unknown"),
        both(
            "variant_unsupported",
            with(json!({"model": {"provider": "mock", "model": "echo-chat", "variant": "no-such"}})),
            "variant_unsupported",
        ),
        both(
            "context_management_unavailable",
            with(json!({"context_management": "compaction"})),
            "context_management_unavailable",
        ),
        both("send.retention_zero", with(json!({"retention": 0})), invalid),
        both("send.retention_above_max", with(json!({"retention": 2_592_001})), invalid),
        both("delivery.unknown", with(json!({"delivery": "later"})), invalid),
        both("on_restart.unknown", with(json!({"on_restart": "maybe"})), invalid),
        both("conversation_key.spaces", with(json!({"conversation_key": "a b"})), invalid),
        both("system.number", with(json!({"system": 5})), invalid),
        both("title.control", with(json!({"title": "a\u{7}b"})), invalid),
        both("route_decision_id.empty", with(json!({"route_decision_id": ""})), invalid),
        both("seed_from.lineage", with(json!({"seed_from": {"lineage": "x"}})), invalid),
        both("max_steps.zero", with(json!({"stop_when": {"max_steps": 0}})), invalid),
        // What broca does not serve is refused by name, never accepted and dropped (#47).
        both(
            "send.budget_nudges_unserved",
            with(json!({"budget": {"nudges": [{"at_tool_calls": 3, "text": "wrap up"}]}})),
            invalid,
        ),
        both("send.budget_finalize_unserved", with(json!({"budget": {"finalize_at_tool_calls": 9}})), invalid),
        both("send.stop_when_list_unserved", with(json!({"stop_when": [{"max_steps": 3}]})), invalid),
        both("send.stop_when_member_unserved", with(json!({"stop_when": {"max_steps": 3, "max_tokens": 9}})), invalid),
        both("send.generation_member_unserved", with(json!({"generation": {"temperature": 0.2}})), invalid),
        both("cache.ttl", with(json!({"cache": {"ttl": "1y"}})), invalid),
        // A lifetime the route cannot honour (#28, `provider::cache::unsupported`).
        both("send.cache_ttl_unhonoured", with(json!({"cache": {"ttl": "5m"}})), "open_failed"),
        both(
            "send.cache_1h_off_anthropic",
            with(json!({"model": {"provider": "openai", "model": "gpt-5.6-luna"}, "cache": {"ttl": "1h"}})),
            "open_failed",
        ),
        both(
            "send.output_refs_not_boolean",
            with(json!({"plan": {"tool_items": [{"provider": "fs", "output_refs": "yes"}]}})),
            invalid,
        ),
        both("send.structured_output_undeclared", with(json!({"structured_output": {}})), invalid),
        both("send.attachments_undeclared", with(json!({"attachments": []})), invalid),
        both("send.client_message_id_malformed", with(json!({"client_message_id": "not an id"})), invalid),
        both("send.directives_malformed", with(json!({"directives": ["wake", "wake"]})), invalid),
        both("params.array", json!([1, 2]), invalid),
        // `delivery_order` (llm-runner §9.7): a malformed list, a list of only undeclared modes,
        // list members without a list, a template beside a prompt or that does not render, and
        // a malformed plan `senders` list.
        both("send.delivery_list_malformed", with(json!({"delivery": ["steer", "steer"]})), invalid),
        both("send.delivery_unsupported", with(json!({"delivery": ["turn_system"]})), "delivery_unsupported"),
        both("send.dedupe_key_without_list", with(json!({"delivery": "steer", "dedupe_key": "k"})), invalid),
        both(
            "send.template_beside_prompt",
            with(json!({"delivery": ["steer"], "template": {"id": "t", "digest": "d", "slots": {}}})),
            invalid,
        ),
        both(
            "send.template_unknown",
            json!({"model": model(), "delivery": ["steer"], "template": {"id": "t", "digest": "d", "slots": {}}}),
            invalid,
        ),
        both(
            "send.plan_senders_malformed",
            with(json!({"plan": {"senders": [{"module": "m"}, {"module": "m"}]}})),
            invalid,
        ),
        both(
            "send.plan_succeeds_self",
            with(json!({"plan": {"senders": [{"module": "m", "succeeds": "m"}]}})),
            invalid,
        ),
        Case {
            name: "model.inherit_on_fresh",
            params: json!({"prompt": "x", "delivery": "steer"}),
            fresh: Some(invalid),
            existing: None,
        },
        Case {
            name: "model.inherit_plain",
            params: json!({"prompt": "x"}),
            fresh: Some(invalid),
            existing: Some(invalid),
        },
        Case {
            name: "fetch_unavailable.no_consumer",
            params: with(json!({"plan": {"tool_items": [{"provider": "aft", "preset": "default"}]}})),
            fresh: Some("fetch_unavailable"),
            existing: Some("plan_drift"),
        },
        Case {
            name: "send_id_reuse",
            params: with(json!({"prompt": "not k-1", "send_id": "k-1"})),
            fresh: None,
            existing: Some("send_id_reuse"),
        },
        Case {
            name: "send.retention_late_opt_in",
            params: with(json!({"retention": 60})),
            fresh: None,
            existing: Some(invalid),
        },
        Case {
            name: "session_class.changed",
            params: with(json!({"session_class": "durable"})),
            fresh: None,
            existing: Some(invalid),
        },
    ]
}

/// Waits until the session's runs have ended.
fn settle(rig: &Rig, key: &SessionKey) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let status = rig.call_on(key, "run.status", json!({})).unwrap_or(Value::Null);
        if !matches!(status["state"].as_str(), Some("active" | "pending" | "paused")) {
            return;
        }
        assert!(Instant::now() < until, "the session did not settle: {status}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A rig whose [`key`] has two finished runs (sends `k-1` and `k-2`, keyed by their prompts).
fn rig_with_history() -> Rig {
    let rig = rig(Duration::from_secs(60));
    for prompt in ["k-1", "k-2"] {
        rig.call("session.send", send(prompt)).unwrap();
        settle(&rig, &key());
    }
    rig
}

fn fresh_key(i: usize) -> SessionKey {
    SessionKey::new("/tmp", "ops-test", &format!("fresh-{i}"))
}

/// Sends `params` on `key`, expects the refusal `code`, and checks the footprint is unchanged.
fn refused_writes_nothing(rig: &Rig, key: &SessionKey, what: &str, params: &Value, code: &str) {
    let before = rig.footprint(key);
    let answer = rig.call_on(key, "session.send", params.clone());
    match &answer {
        Err(r) => {
            assert_eq!(r.code.as_str(), code, "{what}: refused otherwise: {}", r.to_json());
            // A case named after a golden is that golden's request: where it is refused with the
            // golden's code, the body is pinned too.
            let golden = format!("{what}.json");
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/golden").join(&golden);
            let pinned: Option<Value> = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
            if pinned.is_some_and(|p| p["code"] == r.code.as_str()) {
                pin::assert_golden(&golden, &r.to_json(), None);
            }
        }
        Ok(body) => panic!("{what}: admitted, not refused {code}: {body}"),
    }
    let after = rig.footprint(key);
    if let Some(diff) = before.diff(&after) {
        panic!("{what}: refused {code} and changed the state root: {diff}");
    }
}

#[test]
fn every_send_refusal_on_a_fresh_session_writes_nothing() {
    let rig = rig(Duration::from_secs(60));
    for (i, case) in send_cases().iter().enumerate() {
        let Some(code) = case.fresh else { continue };
        let key = fresh_key(i);
        refused_writes_nothing(&rig, &key, case.name, &case.params, code);
        // A refused first send leaves no record: readers see the never-written session.
        let head = rig.call_on(&key, "session.head", json!({})).unwrap();
        assert_eq!(head["incarnation"], "log-1", "{}: {head}", case.name);
    }
    assert!(rig.mock.requests("default").is_empty(), "no refused send reached the provider");
}

#[test]
fn every_send_refusal_on_a_session_with_history_writes_nothing() {
    let rig = rig_with_history();
    let served = rig.mock.requests("default").len();
    for case in send_cases() {
        let Some(code) = case.existing else { continue };
        refused_writes_nothing(&rig, &key(), case.name, &case.params, code);
    }
    assert_eq!(rig.mock.requests("default").len(), served, "no refused send reached the provider");
}

/// The refusals of the strict ops (and of an unknown op), on both kinds of session.
#[test]
fn strict_op_refusals_write_nothing() {
    let rig = rig_with_history();
    let cases = [
        ("session.read", json!({"direction": "backward"})),
        ("session.read", json!({"after_mid": "m-none"})),
        ("session.read", json!({"history_version": 99})),
        ("session.read", json!({"limit": -1})),
        // Media modes broca does not serve (pinned by `tests/e2e_media.rs`), and a descriptors
        // read, which answers and writes nothing.
        ("session.read", json!({"media": "blocks"})),
        ("session.read", json!({"media": "bogus"})),
        ("session.read", json!({"media": "descriptors"})),
        ("session.history", json!({"cursor": "garbage"})),
        ("session.history", json!({"before_ordinal": 999})),
        ("session.head", json!({"x": 1})),
        ("session.baseline", json!({"x": 1})),
        ("session.retract", json!({"submission_id": 5})),
        ("session.retract", json!({"session": "other", "submission_id": "sub-x"})),
        ("run.cancel", json!({"run_id": "run-x", "at": "later"})),
        ("run.cancel", json!({})),
        ("run.status", json!({"runid": "x"})),
        ("run.result", json!({"run_id": "run-none"})),
        ("run.result", json!({})),
        ("run.tool_calls", json!({"run_id": "run-none"})),
        ("send.status", json!({"send_id": 5})),
        ("send.status", json!({"send_id": "never-sent"})),
        ("session.send_status", json!({})),
        ("role.describe", json!({"x": 1})),
        ("session.frobnicate", json!({})),
    ];
    for (i, key) in [key(), fresh_key(1000)].iter().enumerate() {
        for (method, params) in &cases {
            let before = rig.footprint(key);
            let answer = rig.call_on(key, method, params.clone());
            let Err(refusal) = answer else {
                // Some of these are answers on one kind of session (a read of a fresh one):
                // an answer must write nothing either.
                let after = rig.footprint(key);
                assert_eq!(before.diff(&after), None, "{method} {params} answered and wrote");
                continue;
            };
            let after = rig.footprint(key);
            if let Some(diff) = before.diff(&after) {
                panic!("{method} {params} on session #{i} refused {} and wrote: {diff}", refusal.code.as_str());
            }
        }
    }
}
