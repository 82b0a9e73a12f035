//! `delivery_order` through the real daemon (llm-runner 0.8.0 §9.7, spec §4): ordered delivery
//! lists, plan-named senders and templates, sent by `broca-mock relay` modules the daemon
//! launches, so broca sees their attested principals (`reserved:<relay>`).
//!
//! - a list without `idle_start` on an idle session answers `pending`, makes no model request
//!   and writes only its `Queued`; the owner's next turn carries it as a steer, its read entry
//!   says `delivered_as: {mode: "steer"}` and its display row names the sender;
//! - a keyed send supersedes its sender's waiting send with the same `dedupe_key` (a re-send
//!   answers `superseded`), and a send past its `expires_at_ms` is dropped at the next boundary
//!   (`expired`); neither reaches the transcript or the model;
//! - a template send's text is rendered from the plan's template, and a `[steer, idle_start]`
//!   from a sender without the grant, a list from a module the plan does not name, a template
//!   naming a part the session does not show, are refused by name (goldens), writing nothing;
//! - a sender's `idle_start` starts a run, whose receipt is `{as: "turn"}`;
//! - every message a module's send writes names that module on its display row, with the
//!   caller's `client_message_id`, never in the read body;
//! - the WAL's list sends carry the `delivery-order/v1` feature: a build without it refuses
//!   the WAL rather than start a run from them.
//!
//! One test, because stopping the in-process daemon means SIGTERM to this process.

use broca_mock::mock;
mod pin;
mod support;

use std::time::{Duration, Instant};

use cortexkit_role_llm_runner::delivery_order::{template_digest, Slot, Template};
use serde_json::{json, Value};
use support::{send_params, Harness, Options, Session, STEP};

const OWNER: &str = "owner-a";
const SENDER: &str = "sender-a";
const STRANGER: &str = "stranger-x";

use support::{relay_call as via, relay_ok as ok};

/// A refusal, pinned as `golden` (`testdata/golden/<golden>.json`), that wrote nothing.
fn refused(h: &Harness, relay: &str, s: &Session, params: Value, code: &str, golden: &str) {
    let before = wal_bytes(s);
    let (got, body) = match via(h, relay, s, "session.send", params) {
        Ok(v) => panic!("{relay}'s send was admitted, not refused {code}: {v}"),
        Err(e) => e,
    };
    assert_eq!(got, code, "{body}");
    pin::assert_golden(&format!("{golden}.json"), &body.to_string(), None);
    assert_eq!(wal_bytes(s), before, "refused {code} and wrote to the WAL");
}

fn wal_bytes(s: &Session) -> Vec<u8> {
    std::fs::read(s.wal_path()).unwrap_or_default()
}

fn wait_run(h: &Harness, s: &Session, run_id: &str) -> Value {
    let until = Instant::now() + STEP;
    loop {
        let status = ok(h, OWNER, s, "run.status", json!({"run_id": run_id}));
        if status["state"] == "completed" {
            return status;
        }
        assert!(Instant::now() < until, "{run_id} never completed: {status}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

fn reply(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 3, "output": 1}}, {"finish": "stop"}]})
}

fn template() -> Template {
    let slots = [("pct".to_owned(), Slot::Percentage)].into_iter().collect();
    Template::new("ceiling", "Context is {pct}% full.", slots)
}

fn tagged_template() -> Template {
    let slots = [("part".to_owned(), Slot::PartTag)].into_iter().collect();
    Template::new("drop", "Consider dropping {part}.", slots)
}

/// The owner's opening send: its plan names the sender, with two templates and no grants.
fn opening(prompt: &str) -> Value {
    let mut params = send_params(prompt);
    let sender = json!({"module": SENDER, "templates": [template(), tagged_template()]});
    params["plan"] = json!({"senders": [sender]});
    params
}

/// A list send of `prompt` (or, for a template send, none).
fn listed(prompt: Option<&str>, send_id: &str, members: Value) -> Value {
    let mut params = json!({"send_id": send_id});
    if let Some(prompt) = prompt {
        params["prompt"] = json!(prompt);
    }
    for (k, v) in members.as_object().unwrap() {
        params[k] = v.clone();
    }
    params
}

/// Every read entry holding `marker`: `(delivered_as, role)`.
fn entries_holding(h: &Harness, s: &Session, marker: &str) -> Vec<Value> {
    let page = ok(h, OWNER, s, "session.read", json!({"limit": 200}));
    let items = page["messages"].as_array().cloned().unwrap_or_default();
    items.into_iter().filter(|e| e["message"].to_string().contains(marker)).collect()
}

fn lists_wait_then_ride_the_next_turn(h: &Harness) {
    let s = h.session("delivery", "waits", None);
    h.install(json!({"responses": [reply("opened"), reply("second turn")]}));
    let run = ok(h, OWNER, &s, "session.send", opening("open"))["run_id"].as_str().unwrap().to_owned();
    wait_run(h, &s, &run);
    let requests = h.mock.requests("default").len();

    // A list without idle_start never starts a run: it waits, durably.
    let waiting =
        ok(h, SENDER, &s, "session.send", listed(Some("steer-marker"), "s-1", json!({"delivery": ["steer"]})));
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert!(waiting["submission_id"].is_string(), "{waiting}");
    // Keyed: the second replaces the first; past its time: dropped at the next boundary.
    let keyed = json!({"delivery": ["steer"], "dedupe_key": "k"});
    ok(h, SENDER, &s, "session.send", listed(Some("replaced-marker"), "s-2", keyed.clone()));
    ok(h, SENDER, &s, "session.send", listed(Some("replacing-marker"), "s-3", keyed.clone()));
    let superseded = ok(h, SENDER, &s, "session.send", listed(Some("replaced-marker"), "s-2", keyed));
    assert_eq!(superseded["state"], "superseded", "{superseded}");
    let late = json!({"delivery": ["steer"], "expires_at_ms": 1});
    ok(h, SENDER, &s, "session.send", listed(Some("expired-marker"), "s-4", late.clone()));
    // A template send: one text, rendered from the plan's template.
    let used = json!({"id": "ceiling", "digest": template_digest(&template()), "slots": {"pct": 82}});
    ok(
        h,
        SENDER,
        &s,
        "session.send",
        listed(None, "s-5", json!({"delivery": ["turn_system", "steer"], "template": used})),
    );
    // The session's actor handles its sends one after another and starts a run, if it starts
    // one, before it answers the next: a run the first list started would show by now.
    assert_eq!(h.mock.requests("default").len(), requests, "a waiting list made a model request");
    assert_eq!(ok(h, OWNER, &s, "session.head", json!({}))["last_run_state"]["run_id"], run, "a run started");

    let mut owner_turn = send_params("owner turn");
    owner_turn["send_id"] = json!("o-turn");
    owner_turn["client_message_id"] = json!("client-7");
    let turn = ok(h, OWNER, &s, "session.send", owner_turn.clone())["run_id"].as_str().unwrap().to_owned();
    wait_run(h, &s, &turn);
    for marker in ["steer-marker", "replacing-marker", "Context is 82% full."] {
        let held = entries_holding(h, &s, marker);
        assert_eq!(held.len(), 1, "{marker}: {held:?}");
        assert_eq!(held[0]["delivered_as"], json!({"mode": "steer"}), "{marker}: {}", held[0]);
        assert!(held[0]["message"].get("sender").is_none() && held[0]["message"].get("delivered_as").is_none());
    }
    for marker in ["replaced-marker", "expired-marker"] {
        assert!(entries_holding(h, &s, marker).is_empty(), "{marker} was delivered");
    }
    let last = h.mock.requests("default").last().map(|r| String::from_utf8_lossy(&r.body).into_owned()).unwrap();
    assert!(last.contains("steer-marker") && last.contains("Context is 82% full."), "the model saw the lists");
    assert!(!last.contains("replaced-marker") && !last.contains("expired-marker"), "the model saw a dropped send");
    let expired = ok(h, SENDER, &s, "session.send", listed(Some("expired-marker"), "s-4", late));
    assert_eq!(expired["state"], "expired", "{expired}");
    let delivered = ok(h, SENDER, &s, "session.send_status", json!({"send_id": "s-1"}));
    assert_eq!(delivered["delivered"]["as"], "step", "{delivered}");

    // The display row of a sender's message names the sender; the read body never does.
    let history = ok(h, OWNER, &s, "session.history", json!({"form": "display"}));
    let rows = history["messages"].as_array().cloned().unwrap_or_default();
    let row = rows.iter().map(|m| &m["row"]).find(|r| r["text"] == "steer-marker");
    let row = row.unwrap_or_else(|| panic!("no display row holds the sender's message: {history}"));
    assert_eq!(row["sender"], SENDER, "{row}");
    // The owner's row names the owner's module and the caller's own message id (§4.7, §9.11);
    // neither is in the read body, and the id is part of the send's identity.
    let owners = rows.iter().map(|m| &m["row"]).find(|r| r["text"] == "owner turn").unwrap();
    assert_eq!((&owners["sender"], &owners["client_message_id"]), (&json!(OWNER), &json!("client-7")), "{owners}");
    let read = entries_holding(h, &s, "owner turn");
    assert!(read[0].get("client_message_id").is_none() && read[0]["message"].get("client_message_id").is_none());
    owner_turn["client_message_id"] = json!("client-8");
    let (code, body) = via(h, OWNER, &s, "session.send", owner_turn).unwrap_err();
    assert_eq!((code.as_str(), &body["detail"]["field"]), ("send_id_reuse", &json!("client_message_id")), "{body}");
}

fn senders_are_bounded_by_the_plan(h: &Harness) {
    let s = h.session("delivery", "bounded", None);
    h.install(json!({"responses": [reply("opened"), reply("started by the sender")]}));
    let run = ok(h, OWNER, &s, "session.send", opening("open"))["run_id"].as_str().unwrap().to_owned();
    wait_run(h, &s, &run);
    let steer = json!({"delivery": ["steer"]});
    refused(h, STRANGER, &s, listed(Some("x"), "t-1", steer), "scope_owner_mismatch", "send.delivery_unnamed_sender");
    let ungranted = json!({"delivery": ["steer", "idle_start"]});
    refused(h, SENDER, &s, listed(Some("x"), "t-2", ungranted), "invalid_params", "send.delivery_idle_start_ungranted");
    refused(
        h,
        SENDER,
        &s,
        listed(Some("x"), "t-3", json!({"delivery": "interrupt"})),
        "invalid_params",
        "send.delivery_interrupt_ungranted",
    );
    let gone = json!({"id": "drop", "digest": template_digest(&tagged_template()), "slots": {"part": {"mid": "m999", "part": "0"}}});
    let gone = listed(None, "t-4", json!({"delivery": ["steer"], "template": gone}));
    refused(h, SENDER, &s, gone, "template_part_gone", "send.template_part_gone");
    let bad = json!({"id": "ceiling", "digest": template_digest(&template()), "slots": {"pct": 101}});
    refused(
        h,
        SENDER,
        &s,
        listed(None, "t-5", json!({"delivery": ["steer"], "template": bad})),
        "invalid_params",
        "send.template_bad_slot",
    );

    // The owner's list with idle_start starts a run at once: its receipt says `turn`.
    let started = ok(
        h,
        OWNER,
        &s,
        "session.send",
        listed(Some("idle-marker"), "o-1", json!({"delivery": ["steer", "idle_start"]})),
    );
    assert_eq!(started["delivered"]["as"], "turn", "{started}");
    let run = started["run_id"].as_str().unwrap().to_owned();
    wait_run(h, &s, &run);
    let held = entries_holding(h, &s, "idle-marker");
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["delivered_as"], json!({"mode": "idle_start"}), "{}", held[0]);

    // The WAL's list sends need the feature: a build that did not know it refuses the WAL.
    let mut older: Vec<&str> = broca::record::KNOWN_FEATURES.to_vec();
    older.retain(|f| *f != broca::record::FEATURE_DELIVERY_ORDER);
    let refused = broca::wal::read::<broca::wal::WalError>(&s.wal_path(), &older, None, &mut |_| Ok(()));
    assert!(refused.is_err(), "a build without delivery-order/v1 read a WAL holding list sends");
}

/// `directives: ["wake"]` (llm-runner §9.9): a completed run reports the wake tag its final
/// answer ends with on `run.result` and `run.status` alike, the stored text unedited; a run that
/// did not ask reports none; a joining steer cannot change its run's names.
fn turn_directives_report_a_wake_tag(h: &Harness) {
    let s = h.session("delivery", "directives", None);
    h.install(json!({"responses": [reply("done <wake in=\"90s\"/>"), reply("again <wake off/>")]}));
    let mut asked = send_params("wake me");
    asked["directives"] = json!(["wake"]);
    let run = ok(h, OWNER, &s, "session.send", asked)["run_id"].as_str().unwrap().to_owned();
    let status = wait_run(h, &s, &run);
    let result = ok(h, OWNER, &s, "run.result", json!({"run_id": run}));
    assert_eq!(result["directives"], json!([{"name": "wake", "in_ms": 90000}]), "{result}");
    assert_eq!(status["directives"], result["directives"], "{status}");
    assert_eq!(result["final_message"]["text"], "done <wake in=\"90s\"/>");
    let plain = ok(h, OWNER, &s, "session.send", send_params("no directives"))["run_id"].as_str().unwrap().to_owned();
    wait_run(h, &s, &plain);
    let result = ok(h, OWNER, &s, "run.result", json!({"run_id": plain}));
    assert!(result.get("directives").is_none(), "a run that did not ask reports none: {result}");
}

#[test]
fn delivery_order_through_the_daemon() {
    let mock = broca_mock::exe();
    let relay = |id: &str| {
        let entry = json!({"program": mock, "args": ["relay"], "env": {"CK_LOG": "info"},
                           "enabled": true, "reserved": true});
        (id.to_owned(), entry)
    };
    let h = Harness::start_with(Options {
        modules: vec![relay(OWNER), relay(SENDER), relay(STRANGER)],
        ..Options::default()
    });
    support::wait_modules_ready(&h, &[OWNER, SENDER, STRANGER]);
    let checks: [support::Check; 3] = [
        ("lists wait, then ride the next turn", lists_wait_then_ride_the_next_turn),
        ("senders are bounded by the plan", senders_are_bounded_by_the_plan),
        ("turn directives report a wake tag", turn_directives_report_a_wake_tag),
    ];
    support::run_checks(h, &checks);
}
