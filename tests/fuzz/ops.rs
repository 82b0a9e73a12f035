//! `session.send` and every strict op's params. Valid requests (the shapes the ops tests and
//! goldens use) are mutated as JSON with the members each op and its nested objects read, then:
//!
//! - `session.send`: decoded by `wire::send::parse` (every case), and now and then served
//!   through the in-process rig (a real actor registry, a temp state root, broca-mock as the
//!   provider), where an admitted send runs to its end before the next case;
//! - every strict op (and `session.subscribe`'s `from`): served through the rig's `Ops` on a
//!   session with completed runs, so ids, cursors and mids name real things.
//!
//! Checks: nothing panics or hangs; every refusal is typed, serializes, and an `invalid_params`
//! names its member in `detail.field`; a strict op refuses a member it does not read by that
//! name before anything else; a refused op writes nothing to the session's WAL.

use std::time::{Duration, Instant};

use broca::session_key::SessionKey;
use broca::wire::{Refusal, RefusalCode};
use serde_json::{json, Value};

use crate::fuzz;
use crate::inproc::{key, rig, send, Rig};

/// Every member name a send (or a nested object of it) reads.
const SEND_NAMES: &[&str] = &[
    "session",
    "prompt",
    "system",
    "send_id",
    "session_class",
    "retention",
    "cache",
    "model",
    "stop_when",
    "generation",
    "budget",
    "seed_from",
    "context_management",
    "delivery",
    "conversation_key",
    "title",
    "on_restart",
    "tools",
    "plan",
    "route_decision_id",
    "tool_providers",
    "provider",
    "variant",
    "max_steps",
    "max_output_tokens",
    "max_input_tokens",
    "nudges",
    "at_tool_calls",
    "text",
    "role",
    "ttl",
    "name",
    "description",
    "input_schema",
    "reply",
    "max_ms",
    "tool_items",
    "items",
    "system_text_items",
    "preset",
    "params",
    "optional",
    "composition",
    "composition_digest",
    "output_refs",
    "compaction_item",
    "step_transform_items",
    "transform",
    "fresh",
];

/// Valid sends, one per shape the ops tests and golden WALs use.
fn sends() -> Vec<Value> {
    let model = json!({"provider": "mock", "model": "echo-chat"});
    vec![
        json!({"prompt": "hi", "model": model, "send_id": "s-1"}),
        json!({
            "prompt": "read a.txt", "model": model, "send_id": "g-1", "title": "golden", "system": "be brief",
            "conversation_key": "golden-key", "stop_when": {"max_steps": 6}, "generation": {"max_output_tokens": 256},
            "budget": {"max_input_tokens": 100000},
            "on_restart": "resume",
            "tools": [{"name": "slow", "description": "reads slowly", "input_schema": {"type": "object"}, "reply": {"max_ms": 5000}}, {"name": "missing"}]
        }),
        json!({"prompt": "steer", "delivery": "steer", "session_class": "head", "cache": {"role": "primary", "ttl": "1h"}}),
        json!({"prompt": "think", "model": {"provider": "mock", "model": "effort-responses", "variant": "high"}, "seed_from": "fresh", "context_management": "none", "route_decision_id": "rd-1"}),
        json!({"prompt": "plan", "plan": {"tool_items": [{"provider": "aft", "preset": "default", "params": {"x": 1}, "optional": true}], "system_text_items": [{"provider": "aft", "preset": "head", "params": {}}], "composition": {"a": 1}}, "tools": []}),
        json!({"prompt": "tp", "tool_providers": ["aft"], "delivery": "interrupt", "context_management": {"transform": "mc"}}),
    ]
}

/// The root member a refusal's `detail.field` names (`budget.nudges[0].x` → `budget`).
fn root(field: &str) -> &str {
    field.split(['.', '[']).next().unwrap_or(field)
}

/// A refusal is typed: it serializes to `{code, message, detail?}`, and `invalid_params`
/// names its member.
pub(crate) fn check_refusal(r: &Refusal) -> Option<String> {
    let body: Value = serde_json::from_str(&r.to_json()).expect("a refusal body is JSON");
    assert_eq!(body["code"], r.code.as_str());
    assert!(!r.message.is_empty());
    if r.code == RefusalCode::InvalidParams {
        let field = r.detail.as_ref().and_then(|d| d.get("field")).and_then(Value::as_str);
        let field = field.unwrap_or_else(|| panic!("invalid_params without detail.field: {}", r.to_json()));
        return Some(field.to_owned());
    }
    None
}

fn check_send_parse(params: &Value, key: &SessionKey) {
    match broca::wire::send::parse(params, key) {
        Ok(p) => {
            assert!(!p.prompt.trim().is_empty());
            assert!(p.send_id.as_ref().is_none_or(|s| (1..=256).contains(&s.len())));
            assert!(p.title.as_deref().is_none_or(broca::wire::send::valid_title));
            assert!(p.max_steps.is_none_or(|n| n > 0) && p.max_output_tokens.is_none_or(|n| n > 0));
            assert!(p.identity.contains_key("delivery"));
            if let Some(fault) = &p.tools_fault {
                let field = check_refusal(fault).expect("a tools fault is invalid_params");
                assert_eq!(root(&field), "tools");
            }
        }
        Err(r) => {
            assert_eq!(r.code, RefusalCode::InvalidParams, "{}", r.to_json());
            let field = check_refusal(&r).expect("a send refusal names its member");
            // The member named is one the send has (or `prompt`, the one required member).
            let present = params.as_object().is_some_and(|o| o.contains_key(root(&field)));
            assert!(present || ["params", "prompt"].contains(&root(&field)), "{field} in {params}");
        }
    }
}

#[test]
fn fuzz_ops_session_send_params() {
    let key = SessionKey::new("/p", "h", "s");
    let corpus = sends();
    fuzz("ops.session_send.parse", 300, |g| {
        let mut params = g.pick(&corpus).clone();
        if g.chance(3) {
            g.mutate_json_typed(&mut params);
        } else {
            g.mutate_json(&mut params, SEND_NAMES);
        }
        if g.chance(20) {
            params = g.hostile_value();
        }
        check_send_parse(&params, &key);
    });
}

/// A strict op: its name, the members it reads, and valid params over the rig's session.
struct StrictOp {
    name: &'static str,
    members: &'static [&'static str],
    valid: Vec<Value>,
}

const READ_MEMBERS: &[&str] = &[
    "from_ordinal",
    "after_mid",
    "history_version",
    "lineage_id",
    "limit",
    "max_bytes",
    "include_tools",
    "include_originals",
    "view",
    "media",
];
const HISTORY_MEMBERS: &[&str] = &[
    "cursor",
    "from_mid",
    "before_mid",
    "from_ordinal",
    "before_ordinal",
    "limit",
    "max_bytes",
    "media",
    "include_originals",
    "view",
    "form",
    "limits",
];

fn strict_ops(run: &str, sub: &str, addr: &str) -> Vec<StrictOp> {
    let op = |name, members, valid| StrictOp { name, members, valid };
    vec![
        op("role.describe", &[], vec![json!({}), Value::Null]),
        op("session.head", &[], vec![json!({})]),
        op("session.baseline", &[], vec![json!({})]),
        op("session.retract", &["session", "submission_id"], vec![json!({"session": "s1", "submission_id": sub})]),
        op(
            "run.cancel",
            &["run_id", "at"],
            vec![json!({"run_id": run, "at": "step_boundary"}), json!({"run_id": run})],
        ),
        op(
            "session.read",
            READ_MEMBERS,
            vec![
                json!({"limit": 2, "from_ordinal": 1}),
                json!({"after_mid": "m1", "history_version": 1, "lineage_id": addr, "max_bytes": 4096}),
                json!({"include_tools": true, "include_originals": false, "view": "raw", "media": "inline"}),
            ],
        ),
        op(
            "session.history",
            HISTORY_MEMBERS,
            vec![
                json!({"limit": 2}),
                json!({"cursor": format!("h1.{addr}.older.3")}),
                json!({"from_mid": "m1", "max_bytes": 1000, "view": "raw", "media": "inline"}),
                json!({"before_ordinal": 3, "form": "display", "limits": {"arguments_bytes": 10, "result_bytes": 10, "error_result_bytes": 10}}),
            ],
        ),
        op("run.status", &["run_id", "session"], vec![json!({"run_id": run}), json!({"session": "s1"})]),
        op("run.result", &["run_id"], vec![json!({"run_id": run})]),
        op("send.status", &["send_id"], vec![json!({"send_id": "one"})]),
        op("session.send_status", &["send_id"], vec![json!({"send_id": "two"})]),
        op("run.tool_calls", &["run_id", "after", "limit"], vec![json!({"run_id": run, "limit": 1})]),
        op("session.output_refs", &["set_id", "after"], vec![json!({"set_id": "ors-0-1"})]),
        op(
            "session.output_ref_read",
            &["ref_id", "offset", "length"],
            vec![json!({"ref_id": "ors-0-1.r0", "offset": 0, "length": 0})],
        ),
    ]
}

/// Waits until the session has no active or pending run (an admitted send's run ended).
fn settle(rig: &Rig) {
    settle_on(rig, &key())
}

fn settle_on(rig: &Rig, key: &SessionKey) {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let head = rig.call_on(key, "run.status", json!({})).unwrap_or(Value::Null);
        if !matches!(head["state"].as_str(), Some("active" | "pending" | "paused")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the session did not settle");
}

/// A rig whose session has two completed runs (so there are messages, run ids, a send id).
pub(crate) fn rig_with_history() -> (Rig, String, String) {
    let rig = rig(Duration::from_secs(60));
    let first = rig.call("session.send", send("one")).unwrap();
    settle(&rig);
    rig.call("session.send", send("two")).unwrap();
    settle(&rig);
    let run = first["run_id"].as_str().unwrap().to_owned();
    let sub = first["submission_id"].as_str().unwrap().to_owned();
    (rig, run, sub)
}

#[test]
fn fuzz_ops_strict_params() {
    let (rig, run, sub) = rig_with_history();
    let addr = key().addr();
    let ops = strict_ops(&run, &sub, &addr);
    fuzz("ops.strict_params", 200, |g| {
        let op = g.pick(&ops);
        let mut params = g.pick(&op.valid).clone();
        if g.chance(4) {
            g.mutate_json_typed(&mut params);
        } else if !g.chance(10) {
            g.mutate_json(&mut params, op.members);
        }
        let before = rig.footprint(&key());
        let answer = rig.call(op.name, params.clone());
        // A strict op names the first member it does not read, before any other fault.
        let unknown = params.as_object().and_then(|o| o.keys().find(|k| !op.members.contains(&k.as_str())).cloned());
        match (&answer, &unknown) {
            (Err(r), _) => {
                let field = check_refusal(r);
                if let Some(k) = &unknown {
                    assert_eq!(field.as_deref(), Some(k.as_str()), "{} {params}: {}", op.name, r.to_json());
                }
                if !params.is_object() && !params.is_null() {
                    assert_eq!(field.as_deref(), Some("params"), "{} {params}", op.name);
                }
                if let Some(diff) = before.diff(&rig.footprint(&key())) {
                    panic!("{} refused ({}) and wrote: {diff}", op.name, r.code);
                }
            }
            // Every answer is an object but `run.cancel`'s (spec §13: "ack" or "not_active").
            (Ok(body), None) if op.name == "run.cancel" => assert!(body == "ack" || body == "not_active", "{body}"),
            (Ok(body), None) => assert!(body.is_object(), "{} answered {body}", op.name),
            (Ok(body), Some(k)) => panic!("{} accepted the unknown member {k:?}: {body}", op.name),
        }
        if op.name == "run.cancel" || op.name == "session.retract" {
            settle(&rig);
        }
    });
    // `session.subscribe {from}`: decided before any stream is attached.
    fuzz("ops.subscribe_from", 200, |g| {
        let valid = [
            json!({}),
            json!({"from": "start"}),
            json!({"from": "live"}),
            json!({"from": {"wal_seq": 3, "sub_index": 1}}),
        ];
        let mut params = g.pick(&valid).clone();
        g.mutate_json(&mut params, &["from", "wal_seq", "sub_index"]);
        if let Err(r) = broca::serve::parse_from(&params) {
            assert!(check_refusal(&r).is_some(), "{}", r.to_json());
        }
    });
}

#[test]
fn fuzz_ops_session_send_served() {
    let (rig, _, _) = rig_with_history();
    let corpus = sends();
    let mut fresh = 0;
    fuzz("ops.session_send.served", 30, |g| {
        let mut params = g.pick(&corpus).clone();
        if g.chance(3) {
            g.mutate_json_typed(&mut params);
        } else {
            g.mutate_json(&mut params, SEND_NAMES);
        }
        // Half the cases go to a session with no record: a refused first send must not create it.
        let key = if g.chance(2) {
            fresh += 1;
            SessionKey::new("/tmp", "ops-test", &format!("fuzz-fresh-{fresh}"))
        } else {
            key()
        };
        let before = rig.footprint(&key);
        match rig.call_on(&key, "session.send", params.clone()) {
            Ok(body) => {
                assert!(body["state"].is_string(), "{body}");
                settle_on(&rig, &key);
            }
            Err(r) => {
                check_refusal(&r);
                if let Some(diff) = before.diff(&rig.footprint(&key)) {
                    panic!("session.send refused ({}) and wrote: {diff}: {params}", r.to_json());
                }
            }
        }
    });
}
