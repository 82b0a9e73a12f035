//! The driver surface in-process (spec §4, §10.1, §11, §13, §14, §17, restart policy, session
//! class): keyed re-sends and their refusals, queue/steer/interrupt, retract, cancel, run.status
//! and its provisional ids, run.result, send.status, the input-token cap, pauses, placement.
//! The same rules run through the real daemon in `e2e_driver`.

mod inproc;
use broca_mock::mock;
mod pin;

use std::time::{Duration, Instant};

use broca::lineage::read;
use broca::record::{PauseReason, Record};
use inproc::{key, reply_script, rig, Rig};
use pin::assert_golden;
use serde_json::{json, Value};

const MODEL: &str = "echo-chat";

fn keyed(prompt: &str, send_id: &str) -> Value {
    json!({"prompt": prompt, "model": {"provider": "mock", "model": MODEL}, "send_id": send_id})
}

fn slow(text: &str, delay_ms: u64) -> Value {
    json!({"events": [{"text": text}, {"delay_ms": delay_ms}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

impl Rig {
    fn texts(&self) -> Vec<String> {
        let page = self.call("session.read", json!({})).unwrap();
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let content = m["message"]["content"].as_array().cloned().unwrap_or_default();
                let text = content.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("");
                format!("{}:{}", m["message"]["role"].as_str().unwrap(), text)
            })
            .collect()
    }

    fn wait_state_value(&self, run_id: &str, want: &str) -> Value {
        self.wait_state(run_id, want);
        self.call("run.status", json!({"run_id": run_id})).unwrap()
    }

    fn wal_len(&self) -> u64 {
        std::fs::metadata(self.ops.registry.shared().wal_path(&key())).map_or(0, |m| m.len())
    }

    fn field_of(&self, method: &str, params: Value) -> (String, Option<Value>) {
        let e = self.call(method, params).unwrap_err();
        (e.code.to_string(), e.detail.and_then(|d| d.get("field").cloned()))
    }
}

#[test]
fn a_keyed_resend_replays_its_answer_and_differing_content_is_refused_by_field() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [slow("one", 300)]}));
    let first = rig.call("session.send", keyed("hello", "k-1")).unwrap();
    assert_eq!(first["state"], "active");
    let again = rig.call("session.send", keyed("hello", "k-1")).unwrap();
    assert_eq!(again, first, "a byte-identical retry while active answers the same");
    let mut titled = keyed("hello", "k-1");
    titled["title"] = json!("an edited title");
    assert_eq!(rig.call("session.send", titled).unwrap(), first, "title is not identity");
    let run_id = first["run_id"].as_str().unwrap();
    rig.wait_state(run_id, "completed");
    let done = rig.call("session.send", keyed("hello", "k-1")).unwrap();
    let baseline = first["baseline"].clone();
    assert_eq!(done, json!({"state": "finished", "run_id": run_id, "reason": "completed", "baseline": baseline}));
    assert_eq!(rig.mock.requests("default").len(), 1, "no second run");
    let wal = rig.wal_len();
    let cases = [
        (keyed("other words", "k-1"), "prompt"),
        (
            json!({"prompt": "hello", "model": {"provider": "mock", "model": MODEL}, "send_id": "k-1", "delivery": "steer"}),
            "delivery",
        ),
        (
            json!({"prompt": "hello", "model": {"provider": "mock", "model": "echo-messages"}, "send_id": "k-1"}),
            "model",
        ),
        (
            json!({"prompt": "hello", "model": {"provider": "mock", "model": MODEL}, "send_id": "k-1", "conversation_key": "ck"}),
            "conversation_key",
        ),
    ];
    let e = rig.call("session.send", keyed("other words", "k-1")).unwrap_err();
    assert_golden("send_id_reuse.json", &e.to_json(), None);
    for (params, field) in cases {
        let e = rig.call("session.send", params).unwrap_err();
        assert_eq!((e.code.as_str(), e.detail.unwrap().get("field").cloned()), ("send_id_reuse", Some(json!(field))));
    }
    assert_eq!(rig.wal_len(), wal, "refusals write nothing");
    // Without a send_id every send is new.
    let a = rig.call("session.send", json!({"prompt": "x", "model": {"provider": "mock", "model": MODEL}})).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let b = rig.call("session.send", json!({"prompt": "x", "model": {"provider": "mock", "model": MODEL}})).unwrap();
    assert_ne!(a["run_id"], b["run_id"]);
}

#[test]
fn a_steer_joins_the_running_turn_at_its_next_boundary_and_gets_one_more_step() {
    let rig = rig(Duration::from_millis(300));
    rig.script(json!({"responses": [slow("first answer", 400), reply_script("saw the steer", 0)]}));
    let run = rig.call("session.send", keyed("start", "s-1")).unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_string();
    rig.wait_requests(1);
    let mut steer = keyed("also check the tests", "s-2");
    steer["delivery"] = json!("steer");
    let joined = rig.call("session.send", steer.clone()).unwrap();
    assert_eq!(joined, json!({"state": "active", "run_id": run_id}), "names the running run");
    rig.wait_state(&run_id, "completed");
    assert_eq!(
        rig.texts(),
        ["user:start", "assistant:first answer", "user:also check the tests", "assistant:saw the steer"]
    );
    let second = &rig.mock.requests("default")[1];
    assert!(String::from_utf8_lossy(&second.body).contains("also check the tests"), "the model saw the steer");
    // Its re-send and its provisional run id both answer the run that carried it.
    let resend = rig.call("session.send", steer).unwrap();
    assert_eq!(resend["delivered"], json!({"as": "step", "ref": run_id}));
    assert_eq!(resend["state"], "finished");
    let sub = rig
        .records()
        .iter()
        .find_map(|r| match r {
            Record::Steered { submission_id, .. } => Some(submission_id.clone()),
            _ => None,
        })
        .unwrap();
    let provisional = rig.call("run.status", json!({"run_id": format!("run-{sub}")})).unwrap();
    assert_eq!(provisional["delivered"], json!({"as": "step", "ref": run_id}));
    assert_eq!(provisional["state"], "completed");
    // The same answer after a restart: a second process over the same state root.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.is_open(&key()) {
        assert!(Instant::now() < deadline, "the actor never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let next = inproc::ops_over(rig.dir.path(), rig.mock.base_url(None), Duration::from_secs(5));
    let (tx, rx) = crossbeam_channel::bounded(1);
    next.handle(&key(), "run.status", json!({"run_id": format!("run-{sub}")}), Box::new(move |r| tx.send(r).unwrap()));
    let after = rx.recv().unwrap().unwrap();
    assert_eq!(after, provisional, "identical before and after a restart");
    assert_golden("run_status.provisional_delivered_steer.json", &after.to_string(), None);
    assert_eq!(rig.call("run.cancel", json!({"run_id": format!("run-{sub}")})).unwrap(), "not_active");
    // With nothing running, a steer is a plain send.
    let plain = rig
        .call(
            "session.send",
            json!({"prompt": "idle now", "delivery": "steer", "model": {"provider": "mock", "model": MODEL}}),
        )
        .unwrap();
    assert_eq!(plain["state"], "active");
    assert_ne!(plain["run_id"], json!(run_id));
}

#[test]
fn a_steer_is_never_placed_between_a_tool_call_and_its_result() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [
        {"events": [{"text": "looking"}, {"delay_ms": 300}, {"tool_call": {"id": "c1", "name": "look", "arguments": {}}}, {"finish": "tool_calls"}]},
        reply_script("done", 0),
    ]}));
    let run = rig.call("session.send", keyed("go", "t-1")).unwrap();
    rig.wait_requests(1);
    let mut steer = keyed("steer text", "t-2");
    steer["delivery"] = json!("steer");
    rig.call("session.send", steer).unwrap();
    rig.wait_state(run["run_id"].as_str().unwrap(), "completed");
    let roles: Vec<String> = rig.texts().iter().map(|t| t.split(':').next().unwrap().to_string()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "user", "assistant"], "the steer follows the tool result");
}

#[test]
fn an_interrupt_is_queued_first_cancels_the_run_and_starts_ahead_of_plain_sends() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [slow("never finished", 20_000), reply_script("interrupt handled", 0), reply_script("queued handled", 0)]}));
    let a = rig.call("session.send", keyed("long task", "i-1")).unwrap();
    rig.wait_requests(1);
    let queued = rig.call("session.send", keyed("plain next", "i-2")).unwrap();
    assert_eq!(queued["state"], "pending");
    let mut interrupt = keyed("stop, do this", "i-3");
    interrupt["delivery"] = json!("interrupt");
    let i = rig.call("session.send", interrupt).unwrap();
    assert_eq!(i["state"], "pending");
    rig.wait_state(a["run_id"].as_str().unwrap(), "cancelled");
    let plain_run = format!("run-{}", queued["submission_id"].as_str().unwrap());
    rig.wait_state(&plain_run, "completed");
    assert_eq!(
        rig.texts(),
        [
            "user:long task",
            "user:stop, do this",
            "assistant:interrupt handled",
            "user:plain next",
            "assistant:queued handled"
        ]
    );
}

#[test]
fn retract_is_decided_atomically_against_consumption() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [slow("busy", 600)]}));
    let a = rig.call("session.send", keyed("first", "r-1")).unwrap();
    let b = rig.call("session.send", keyed("second", "r-2")).unwrap();
    let sub_b = b["submission_id"].as_str().unwrap().to_string();
    assert_eq!(rig.call("session.retract", json!({"submission_id": sub_b})).unwrap(), json!({"retracted": true}));
    assert_eq!(
        rig.call("session.retract", json!({"submission_id": sub_b})).unwrap(),
        json!({"retracted": false, "reason": "not_pending"})
    );
    assert_eq!(
        rig.call("session.retract", json!({"session": "s1", "submission_id": a["submission_id"]})).unwrap(),
        json!({"retracted": false, "reason": "already_started"})
    );
    assert_eq!(
        rig.field_of("session.retract", json!({"submission": "x"})),
        ("invalid_params".into(), Some(json!("submission")))
    );
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rig.mock.requests("default").len(), 1, "the retracted send never ran");
    assert_eq!(
        rig.call("run.status", json!({"run_id": format!("run-{sub_b}")})).unwrap(),
        json!({"state": "retracted"})
    );
    assert_eq!(
        rig.call("session.send", keyed("second", "r-2")).unwrap(),
        json!({"state": "retracted", "submission_id": sub_b})
    );
}

#[test]
fn cancel_answers_ack_or_not_active_and_a_boundary_request_is_durable_and_idempotent() {
    let rig = rig(Duration::from_secs(5));
    assert_eq!(rig.call("run.cancel", json!({"run_id": "run-x"})).unwrap(), "not_active", "no session yet");
    assert!(!rig.ops.registry.shared().wal_path(&key()).exists(), "and nothing was created");
    rig.script(json!({"responses": [
        {"events": [{"text": "slow"}, {"delay_ms": 800}, {"tool_call": {"id": "c1", "name": "look", "arguments": {}}}, {"finish": "tool_calls"}]},
        slow("slow too", 20_000),
    ]}));
    let a = rig.call("session.send", keyed("one", "c-1")).unwrap();
    let run_a = a["run_id"].as_str().unwrap().to_string();
    let queued = rig.call("session.send", keyed("two", "c-2")).unwrap();
    assert_eq!(
        rig.field_of("run.cancel", json!({"run_id": run_a, "at": "later"})),
        ("invalid_params".into(), Some(json!("at")))
    );
    assert_eq!(
        rig.field_of("run.cancel", json!({"run_id": run_a, "at": 3})),
        ("invalid_params".into(), Some(json!("at")))
    );
    // Once the first step is in flight (a boundary cancel before it would end the run at once).
    rig.wait_requests(1);
    for _ in 0..3 {
        assert_eq!(rig.call("run.cancel", json!({"run_id": run_a, "at": "step_boundary"})).unwrap(), "ack");
    }
    let requests = rig.records().iter().filter(|r| matches!(r, Record::RunCancelRequested { .. })).count();
    assert_eq!(requests, 1, "a duplicate boundary request writes nothing");
    rig.wait_state(&run_a, "cancelled");
    let steps =
        rig.records().iter().filter(|r| matches!(r, Record::StepStarted { run_id, .. } if *run_id == run_a)).count();
    assert_eq!(steps, 1, "the in-flight step and its batch finished; no further step");
    assert_eq!(rig.texts()[..2], ["user:one".to_string(), "assistant:slow".to_string()]);
    let run_b = format!("run-{}", queued["submission_id"].as_str().unwrap());
    rig.wait_requests(2);
    assert_eq!(rig.call("run.cancel", json!({"run_id": run_a})).unwrap(), "not_active", "already ended");
    assert_eq!(rig.call("run.cancel", json!({"run_id": run_b, "at": "now"})).unwrap(), "ack");
    rig.wait_state(&run_b, "cancelled");
}

/// `session.head.title` is the newest title any record carries: a queued send's, while the run
/// it waits behind (with an older title) is still active (spec §4 `title`, #47).
#[test]
fn head_title_is_the_newest_across_started_queued_and_steered_records() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [slow("looking", 600), {"events": [{"text": "ok"}, {"finish": "stop"}]}]}));
    let mut first = keyed("one", "ht-1");
    first["title"] = json!("first task");
    rig.call("session.send", first).unwrap();
    rig.wait_requests(1);
    let head = |rig: &Rig| rig.call("session.head", json!({})).unwrap()["title"].clone();
    assert_eq!(head(&rig), json!("first task"));
    let mut second = keyed("two", "ht-2");
    second["title"] = json!("second task");
    let queued = rig.call("session.send", second).unwrap();
    assert_eq!(head(&rig), json!("second task"), "the queued send's title, before its run starts");
    let untitled = rig.call("session.send", keyed("three", "ht-3")).unwrap();
    assert_eq!(head(&rig), json!("second task"), "a send without a title keeps the newest one");
    let run = format!("run-{}", untitled["submission_id"].as_str().unwrap());
    rig.wait_state(&run, "completed");
    assert!(queued["submission_id"].is_string());
    assert_eq!(head(&rig), json!("second task"));
}

#[test]
fn status_result_and_send_status_answer_from_durable_state() {
    let rig = rig(Duration::from_secs(5));
    let unknown = rig.call("send.status", json!({"send_id": "nope"})).unwrap_err();
    assert_golden("unknown_send.json", &unknown.to_json(), None);
    rig.script(json!({"responses": [
        slow("looking", 500),
        {"events": [{"reasoning": "thinking"}, {"text": "All pass.\n"}, {"text": "The fix is in parse.rs."}, {"usage": {"input": 7, "output": 3}}, {"finish": "stop"}]},
    ]}));
    let mut first = keyed("one", "st-1");
    first["title"] = json!("first task");
    let a = rig.call("session.send", first).unwrap();
    let run_a = a["run_id"].as_str().unwrap().to_string();
    let b = rig.call("session.send", keyed("two", "st-2")).unwrap();
    let run_b = format!("run-{}", b["submission_id"].as_str().unwrap());
    let pending = rig.call("run.status", json!({"run_id": run_b})).unwrap();
    assert_golden("run_status.provisional_pending.json", &pending.to_string(), None);
    assert_eq!(rig.call("send.status", json!({"send_id": "st-2"})).unwrap(), b, "what a re-send answers");
    assert_eq!(rig.call("session.send_status", json!({"send_id": "st-2"})).unwrap(), b);
    rig.wait_requests(1);
    std::thread::sleep(Duration::from_millis(150));
    let live = rig.call("run.status", json!({"run_id": run_a})).unwrap();
    assert_eq!((live["state"].as_str(), live["title"].as_str()), (Some("active"), Some("first task")));
    let step = &live["step"];
    assert_eq!(step["step_id"], format!("{run_a}:1"));
    assert_eq!(step["attempt"], 0);
    assert!(step["last_content_at_ms"].as_u64().unwrap() >= step["started_at_ms"].as_u64().unwrap());
    assert_eq!(live["usage"], json!({"steps": 0, "unreported_steps": 0, "by_model": []}));
    assert_golden("run_status.active_with_step.json", &live.to_string(), None);
    rig.wait_state(&run_b, "completed");
    let wal = rig.wal_len();
    let result = rig.call("run.result", json!({"run_id": run_b})).unwrap();
    assert_eq!(
        result["final_message"],
        json!({"ordinal": 4, "mid": "m4", "text": "All pass.\nThe fix is in parse.rs."})
    );
    assert_eq!(result["state"], "completed");
    assert_eq!(result["usage"]["input_tokens"], 7);
    assert_eq!(result["usage"]["by_model"][0]["model"], MODEL);
    let status = rig.call("run.status", json!({"run_id": run_b})).unwrap();
    assert_eq!(status["undelivered_steers"], json!([]));
    assert_golden("run_status.provisional_started.json", &status.to_string(), None);
    assert_golden("run_result.completed.json", &result.to_string(), None);
    assert!(status.get("step").is_none());
    let resend = rig.call("session.send", keyed("two", "st-2")).unwrap();
    assert_eq!(rig.call("send.status", json!({"send_id": "st-2"})).unwrap(), resend);
    assert_eq!(rig.wal_len(), wal, "status reads write nothing");
    assert_eq!(
        rig.field_of("send.status", json!({"send_id": "st-2", "prompt": "x"})),
        ("invalid_params".into(), Some(json!("prompt")))
    );
    assert_eq!(rig.field_of("run.result", json!({})), ("invalid_params".into(), Some(json!("run_id"))));
    for removed in ["cap.install", "spend.delta", "usage.export"] {
        assert_eq!(rig.call(removed, json!({})).unwrap_err().code, "unknown_method");
    }
    assert_eq!(rig.wal_len(), wal);
}

#[test]
fn the_input_token_cap_is_durable_lower_only_and_ends_runs_budget_exhausted() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [
        reply_script("first", 0),
        {"events": [{"tool_call": {"id": "c1", "name": "look", "arguments": {}}}, {"usage": {"input": 5, "output": 1}}, {"finish": "tool_calls"}]},
    ]}));
    let mut capped = keyed("one", "b-1");
    capped["budget"] = json!({"max_input_tokens": 8});
    let a = rig.call("session.send", capped).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let mut raise = keyed("two", "b-2");
    raise["budget"] = json!({"max_input_tokens": 9});
    assert_eq!(rig.field_of("session.send", raise), ("invalid_params".into(), Some(json!("budget.max_input_tokens"))));
    let b = rig.call("session.send", keyed("two", "b-3")).unwrap();
    let run_b = b["run_id"].as_str().unwrap().to_string();
    rig.wait_state(&run_b, "budget_exhausted");
    let status = rig.call("run.status", json!({"run_id": run_b})).unwrap();
    assert_eq!(status["detail"], json!({"limit": 8, "spent": 10, "cause": "limit_reached"}));
    let roles: Vec<String> = rig.texts().iter().map(|t| t.split(':').next().unwrap().to_string()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant", "tool"],
        "the crossing step's call got a never-executed result"
    );
    let c = rig.call("session.send", keyed("three", "b-4")).unwrap();
    rig.wait_state(c["run_id"].as_str().unwrap(), "budget_exhausted");
    assert_eq!(rig.mock.requests("default").len(), 2, "no step starts at or above the cap");
    assert!(rig.records().iter().any(|r| matches!(r, Record::RunStarted(s) if s.config.input_cap().is_some())));
}

/// A run ("needs auth") whose first model call answers 401: paused for authentication. The
/// provider's next answer is `next_reply`. Its run id.
fn paused_for_auth(rig: &Rig, send_id: &str, next_reply: &str) -> String {
    rig.script(json!({"responses": [{"status": 401}, reply_script(next_reply, 0)]}));
    let run_id =
        rig.call("session.send", keyed("needs auth", send_id)).unwrap()["run_id"].as_str().unwrap().to_string();
    rig.wait_state(&run_id, "paused");
    run_id
}

#[test]
fn an_auth_paused_run_refuses_other_sends_and_resumes_on_its_own_send_id() {
    let rig = rig(Duration::from_secs(5));
    let run_a = paused_for_auth(&rig, "p-1", "welcome back");
    let status = rig.call("run.status", json!({"run_id": run_a})).unwrap();
    assert_eq!(status["reason"], "auth_required");
    assert!(status.get("pause_reason").is_none(), "auth pauses keep their format");
    let e = rig.call("session.send", keyed("something else", "p-2")).unwrap_err();
    assert_eq!(e.code, "run_paused");
    assert_golden("run_paused.json", &e.to_json(), None);
    assert_eq!(rig.call("send.status", json!({"send_id": "p-1"})).unwrap()["state"], "paused");
    let resumed = rig.call("session.send", keyed("needs auth", "p-1")).unwrap();
    assert_eq!((resumed["state"].as_str(), resumed["run_id"].as_str()), (Some("active"), Some(run_a.as_str())));
    rig.wait_state(&run_a, "completed");
    assert_eq!(rig.texts(), ["user:needs auth", "assistant:welcome back"]);
}

#[test]
fn an_interrupt_ends_a_paused_run_without_another_model_step() {
    let rig = rig(Duration::from_secs(5));
    let run_a = paused_for_auth(&rig, "q-1", "the new message");
    let mut interrupt = keyed("forget that", "q-2");
    interrupt["delivery"] = json!("interrupt");
    assert_eq!(rig.call("session.send", interrupt).unwrap()["state"], "pending");
    rig.wait_state(&run_a, "cancelled");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.texts().len() < 3 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(rig.texts(), ["user:needs auth", "user:forget that", "assistant:the new message"]);
    assert_eq!(rig.mock.requests("default").len(), 2);
}

#[test]
fn session_class_and_context_management_freeze_on_the_first_send() {
    let rig = rig(Duration::from_secs(5));
    let mut bad = keyed("x", "f-0");
    bad["context_management"] = json!("compaction");
    let e = rig.call("session.send", bad).unwrap_err();
    assert_golden("context_management_unavailable.json", &e.to_json(), None);
    assert!(!rig.ops.registry.shared().wal_path(&key()).exists(), "refused before anything was written");
    let mut first = keyed("one", "f-1");
    first["session_class"] = json!("head");
    let a = rig.call("session.send", first).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let path = rig.ops.registry.shared().wal_path(&key());
    let durable = rig.dir.path().join("wal-durable");
    assert!(path.starts_with(&durable), "a listed class lives in {durable:?}: {path:?}");
    let mut other = keyed("two", "f-2");
    other["session_class"] = json!("worker");
    assert_eq!(rig.field_of("session.send", other), ("invalid_params".into(), Some(json!("session_class"))));
    let mut changed = keyed("two", "f-3");
    changed["context_management"] = json!({"transform": "some-module"});
    let e = rig.call("session.send", changed).unwrap_err();
    assert_eq!(e.code, "context_management_unavailable", "refused by name, never run as none");
    let mut same = keyed("two", "f-5");
    same["context_management"] = json!("none");
    let same = rig.call("session.send", same).unwrap();
    rig.wait_state(same["run_id"].as_str().unwrap(), "completed");
    let b = rig.call("session.send", keyed("two", "f-4")).unwrap();
    rig.wait_state(b["run_id"].as_str().unwrap(), "completed");
    let started: Vec<Value> = rig
        .records()
        .iter()
        .filter_map(|r| match r {
            Record::RunStarted(s) => Some(serde_json::to_value(&s.config).unwrap()),
            _ => None,
        })
        .collect();
    assert!(started.iter().all(|c| c["session_class"] == "head" && c["context_management"] == "none"), "{started:?}");
}

#[test]
fn a_vanished_project_root_refuses_writes_and_serves_reads() {
    let rig = rig(Duration::from_secs(5));
    let root = rig.dir.path().join("project");
    std::fs::create_dir(&root).unwrap();
    let key = broca::session_key::SessionKey::new(root.to_str().unwrap(), "driver-test", "gone");
    let call = |method: &str, params: Value| {
        let (tx, rx) = crossbeam_channel::bounded(1);
        rig.ops.handle(&key, method, params, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    };
    let a = call("session.send", keyed("hello", "v-1")).unwrap();
    let run_a = a["run_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while call("run.status", json!({"run_id": run_a})).unwrap()["state"] != "completed" {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir(&root).unwrap();
    let e = call("session.send", keyed("more", "v-2")).unwrap_err();
    assert_golden("invalid_project_root.json", &e.to_json(), Some(root.to_str().unwrap()));
    assert_eq!(e.detail.unwrap().get("path"), Some(&json!(root.to_str().unwrap())));
    assert_eq!(call("session.read", json!({})).unwrap()["messages"].as_array().unwrap().len(), 2);
    assert_eq!(call("run.status", json!({"run_id": run_a})).unwrap()["state"], "completed");
    assert_eq!(call("run.cancel", json!({"run_id": run_a})).unwrap(), "not_active");
    assert_eq!(call("session.retract", json!({"submission_id": "sub-x"})).unwrap()["retracted"], false);
    std::fs::create_dir(&root).unwrap();
    assert_eq!(call("session.send", keyed("more", "v-2")).unwrap()["state"], "active", "recreating revives it");
}

/// A resume-enabled run (one step with a tool call) drained mid-step: it finishes the step and
/// its batch, then pauses for the restart. Its run id.
fn paused_for_restart(rig: &Rig, send_id: &str) -> String {
    rig.script(json!({"responses": [
        {"events": [{"text": "working"}, {"delay_ms": 300}, {"tool_call": {"id": "c1", "name": "look", "arguments": {}}}, {"finish": "tool_calls"}]},
    ]}));
    let mut resumable = keyed("long job", send_id);
    resumable["on_restart"] = json!("resume");
    let run_id = rig.call("session.send", resumable).unwrap()["run_id"].as_str().unwrap().to_string();
    rig.wait_requests(1);
    rig.ops.registry.drain();
    rig.wait_state(&run_id, "paused");
    run_id
}

#[test]
fn draining_pauses_a_resume_enabled_run_and_boot_resumes_the_same_run() {
    let rig = rig(Duration::from_millis(200));
    let run_a = paused_for_restart(&rig, "rs-1");
    let status = rig.call("run.status", json!({"run_id": run_a})).unwrap();
    assert_eq!((status["reason"].as_str(), status["pause_reason"].as_str()), (Some("restart"), Some("restart")));
    assert_eq!(rig.call("send.status", json!({"send_id": "rs-1"})).unwrap()["pause_reason"], "restart");
    let paused =
        rig.records().into_iter().find(|r| matches!(r, Record::RunPaused { reason: PauseReason::Restart, .. }));
    assert!(paused.is_some());
    // The frame that holds it requires restart-pause/v1: a reader without it refuses by name.
    let path = rig.ops.registry.shared().wal_path(&key());
    let older = ["run-cancel-at/v1", "session-class/v1", "input-token-cap/v1"];
    let refused = broca::wal::read(&path, &older, None, &mut |_: broca::wal::ScannedFrame<'_>| {
        Ok::<(), broca::lineage::LineageError>(())
    });
    let refusal = refused.unwrap_err().refusal();
    assert_eq!(refusal.code, "wal_newer_writer");
    assert_eq!(refusal.detail.unwrap().get("missing"), Some(&json!(["restart-pause/v1"])));
    let results = rig.records().iter().filter(|r| matches!(r, Record::ToolResult { .. })).count();
    assert_eq!(results, 1, "the step and its batch finished before the pause");
    // A restarted process: the first lets go of the lease (paused actors are idle), the next
    // one's boot recovery resumes the same run through admission.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.is_open(&key()) {
        assert!(Instant::now() < deadline, "the paused actor never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    rig.script(json!({"responses": [reply_script("resumed and done", 0)]}));
    let next = inproc::ops_over(rig.dir.path(), rig.mock.base_url(None), Duration::from_secs(5));
    assert_eq!(next.registry.recover(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (tx, rx) = crossbeam_channel::bounded(1);
        next.handle(&key(), "run.status", json!({"run_id": run_a}), Box::new(move |r| tx.send(r).unwrap()));
        if rx.recv().unwrap().unwrap()["state"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "the resumed run never completed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let page =
        read::transcript(&broca::lineage::reader::Reader::at(next.registry.shared(), &key(), path.clone()), 0, 10)
            .unwrap();
    let roles: Vec<_> = page.messages.iter().map(|(_, m)| m.role).collect();
    use broca::message::Role::*;
    assert_eq!(roles, [User, Assistant, Tool, Assistant], "the same run continued from its boundary");
}

#[test]
fn interleaved_drivers_lose_and_duplicate_nothing() {
    let rig = rig(Duration::from_secs(5));
    let responses: Vec<Value> = (0..40).map(|i| slow(&format!("answer {i}"), 20)).collect();
    rig.script(json!({"responses": responses}));
    let rig = std::sync::Arc::new(rig);
    let mut handles = Vec::new();
    for t in 0..4 {
        let rig = std::sync::Arc::clone(&rig);
        handles.push(std::thread::spawn(move || {
            let mut retracted = Vec::new();
            for i in 0..6 {
                let id = format!("d{t}-{i}");
                let mut p = keyed(&format!("msg {id}"), &id);
                p["delivery"] = json!(["queue", "steer", "queue"][i % 3]);
                let answer = rig.call("session.send", p.clone()).unwrap();
                // A keyed re-send answers from the record (never a second send).
                assert!(rig.call("session.send", p).unwrap()["state"].is_string());
                if i == 4 {
                    if let Some(sub) = answer["submission_id"].as_str().filter(|_| answer["state"] == "pending") {
                        if rig.call("session.retract", json!({"submission_id": sub})).unwrap()["retracted"] == true {
                            retracted.push(format!("msg {id}"));
                        }
                    }
                }
            }
            retracted
        }));
    }
    let retracted: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = rig.call("run.status", json!({})).unwrap();
        let page = rig.call("session.read", json!({"limit": 1000})).unwrap();
        let idle =
            status["state"] != "active" && rig.ops.registry.shared().store.sessions_with_work().unwrap().is_empty();
        if idle && page["lineage_state"] == "idle" {
            break;
        }
        assert!(Instant::now() < deadline, "the session never went idle: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let users: Vec<String> =
        rig.texts().into_iter().filter_map(|t| t.strip_prefix("user:").map(String::from)).collect();
    for t in 0..4 {
        for i in 0..6 {
            let m = format!("msg d{t}-{i}");
            let n = users.iter().filter(|u| **u == m).count();
            let want = usize::from(!retracted.contains(&m));
            assert_eq!(n, want, "{m} appears {n} times in {users:?}");
        }
        // FIFO per driver: its queued messages start in the order it sent them (a steer joins
        // the running turn, ahead of the queue, by design).
        let queued = |u: &&String| [0, 2, 3, 5].iter().any(|i| **u == format!("msg d{t}-{i}"));
        let mine: Vec<&String> = users.iter().filter(queued).collect();
        let mut sorted = mine.clone();
        sorted.sort();
        assert_eq!(mine, sorted, "driver {t}'s sends kept their order");
    }
}

#[test]
fn admission_failures_answer_open_failed_with_their_class() {
    let rig = rig(Duration::from_secs(5));
    // An explicit 24h cache on a route that is not OpenAI's own: permanent.
    let mut cached = keyed("x", "o-1");
    cached["cache"] = json!({"role": "primary", "ttl": "24h"});
    let e = rig.call("session.send", cached).unwrap_err();
    assert_golden("open_failed_permanent.json", &e.to_json(), None);
    // No catalog in memory: transient (seed it, or let broca reach fusiform).
    *rig.ops.admission.catalog.write() = broca::catalog::Catalog::load_lkg(&rig.dir.path().join("absent.json"));
    let e = rig.call("session.send", keyed("x", "o-2")).unwrap_err();
    assert_golden("open_failed_transient.json", &e.to_json(), Some(rig.dir.path().to_str().unwrap()));
    assert!(!rig.ops.registry.shared().wal_path(&key()).exists(), "admission refusals write nothing");
}

#[test]
fn a_restart_paused_run_refused_at_boot_is_sealed_interrupted_with_the_reason() {
    let rig = rig(Duration::from_millis(200));
    let run_a = paused_for_restart(&rig, "rr-1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.is_open(&key()) {
        assert!(Instant::now() < deadline, "the paused actor never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let refuse: broca::actor::Readmit = std::sync::Arc::new(|_| Err("model 'mock/echo-chat' is retired".into()));
    let next = inproc::ops_with(rig.dir.path(), rig.mock.base_url(None), Duration::from_secs(5), Some(refuse));
    assert_eq!(next.registry.recover(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let (tx, rx) = crossbeam_channel::bounded(1);
        next.handle(&key(), "run.status", json!({"run_id": run_a}), Box::new(move |r| tx.send(r).unwrap()));
        let status = rx.recv().unwrap().unwrap();
        if status["state"] == "interrupted" {
            break status;
        }
        assert!(Instant::now() < deadline, "never sealed: {status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["error"]["provider_code"], "resume_refused");
    assert!(status["error"]["message"].as_str().unwrap().contains("retired"), "{status}");
    assert_eq!(rig.mock.requests("default").len(), 1, "no model step after the refused resume");
}

#[test]
fn a_plain_send_must_name_its_model_and_a_steer_inherits_it() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [slow("first", 400), reply_script("second", 0)]}));
    let bare = json!({"prompt": "no model"});
    assert_eq!(rig.field_of("session.send", bare.clone()), ("invalid_params".into(), Some(json!("model"))));
    let a = rig.call("session.send", keyed("one", "m-1")).unwrap();
    rig.wait_requests(1);
    assert_eq!(
        rig.field_of("session.send", json!({"prompt": "queued, no model", "send_id": "m-2"})),
        ("invalid_params".into(), Some(json!("model")))
    );
    let steer = rig.call("session.send", json!({"prompt": "steer, no model", "delivery": "steer"})).unwrap();
    assert_eq!(steer["run_id"], a["run_id"]);
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
}

#[test]
fn a_session_another_writer_holds_is_session_busy_naming_its_run() {
    let rig = rig(Duration::from_millis(100));
    let a = rig.call("session.send", keyed("one", "sb-1")).unwrap();
    let run_a = a["run_id"].as_str().unwrap().to_string();
    rig.wait_state(&run_a, "completed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ops.registry.is_open(&key()) {
        assert!(Instant::now() < deadline, "the actor never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Another writer (here: a direct open, as broca-run would) holds the lease.
    let held = rig.ops.registry.shared().open_lineage(&key()).unwrap();
    let e = rig.call("session.send", keyed("two", "sb-2")).unwrap_err();
    assert_eq!(e.code, "session_busy");
    let detail = e.detail.unwrap();
    assert_eq!((detail.get("run_id"), detail.get("state")), (Some(&json!(run_a)), Some(&json!("idle"))));
    drop(held);
    assert_eq!(rig.call("session.send", keyed("two", "sb-2")).unwrap()["state"], "active");
}

#[test]
fn a_scoped_session_refuses_legacy_tools_before_writing() {
    let rig = rig(Duration::from_secs(5));
    let route = broca::ops::Route { scoped: true, ..broca::ops::Route::direct(key()) };
    let call = |params: Value| {
        let (tx, rx) = crossbeam_channel::bounded(1);
        rig.ops.handle_on(&route, "session.send", params, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    };
    let mut tooled = keyed("x", "sc-1");
    tooled["tools"] = json!([{"name": "read", "input_schema": {"type": "object"}}]);
    let e = call(tooled).unwrap_err();
    assert_golden("scoped_tools_require_plan.json", &e.to_json(), None);
    assert!(!rig.ops.registry.shared().wal_path(&key()).exists());
    let mut empty = keyed("x", "sc-2");
    empty["tools"] = json!([]);
    assert_eq!(call(empty).unwrap()["state"], "active", "empty tools stay admitted");
}

#[test]
fn an_interrupt_waits_for_a_running_tool_call_instead_of_abandoning_it() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [
        {"events": [{"tool_call": {"id": "c1", "name": "slow", "arguments": {}}}, {"finish": "tool_calls"}]},
        reply_script("interrupt handled", 0),
    ]}));
    let a = rig.call("session.send", keyed("use the slow tool", "w-1")).unwrap();
    rig.wait_requests(1);
    std::thread::sleep(Duration::from_millis(100));
    let i = rig.call("session.send", with_delivery(keyed("stop, do this", "w-2"), "interrupt")).unwrap();
    assert_eq!(i["state"], "pending");
    rig.wait_state(a["run_id"].as_str().unwrap(), "cancelled");
    let outcome = rig.records().into_iter().find_map(|r| match r {
        Record::ToolResult { output, outcome, .. } => Some((output, outcome)),
        _ => None,
    });
    assert_eq!(outcome, Some((json!({"kind": "text", "text": "slow done"}), Some(broca::record::CallOutcome::Ok))));
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.texts().len() < 5 {
        assert!(Instant::now() < deadline, "{:?}", rig.texts());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(rig.texts()[3..], ["user:stop, do this".to_string(), "assistant:interrupt handled".to_string()]);
}

#[test]
fn a_24h_cache_on_an_openai_route_renders_the_long_retention() {
    let rig = rig(Duration::from_secs(5));
    let mut params =
        json!({"prompt": "cache me", "send_id": "ttl-1", "model": {"provider": "openai", "model": "gpt-5.6-luna"}});
    params["cache"] = json!({"role": "primary", "ttl": "24h"});
    let a = rig.call("session.send", params).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let body: Value = serde_json::from_slice(&rig.mock.requests("default")[0].body).unwrap();
    assert_eq!(body["prompt_cache_retention"], "24h");
}

/// `session.head.cache` (spec §4, §4a "Expiry"): absent until the session sends; then the send
/// start of its last answered request, the lifetime its marks asked for (Anthropic's one hour
/// for a primary session) and the estimated expiry; a route whose lifetime is not known has
/// the send time alone.
#[test]
fn the_head_reports_the_prompt_cache_clock_from_memory() {
    let rig = rig(Duration::from_secs(5));
    let head = rig.call("session.head", json!({})).unwrap();
    assert!(head.get("cache").is_none(), "no request sent yet: {head}");
    let mut params = keyed("cache me", "hc-1");
    params["model"] = json!({"provider": "mock", "model": "echo-messages"});
    params["cache"] = json!({"role": "primary"});
    let before = broca::clock::unix_ms();
    let a = rig.call("session.send", params).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let cache = rig.call("session.head", json!({})).unwrap()["cache"].clone();
    let sent = cache["last_sent_at_ms"].as_u64().expect("a send time");
    assert!(sent >= before, "{cache}");
    assert_eq!(cache["ttl_ms"], 3_600_000, "a primary session asks Anthropic for the hour: {cache}");
    assert_eq!(cache["expires_at_ms"], sent + 3_600_000);
    assert_eq!(cache["expiry_basis"], "estimated");
    let body: Value = serde_json::from_slice(&rig.mock.requests("default")[0].body).unwrap();
    assert_eq!(body["system"], Value::Null, "no system prompt here");
    assert_eq!(body["messages"][0]["content"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
    // On a Chat compatible the lifetime is the provider's own: the send time alone.
    let b = rig.call("session.send", keyed("and again", "hc-2")).unwrap();
    rig.wait_state(b["run_id"].as_str().unwrap(), "completed");
    let cache = rig.call("session.head", json!({})).unwrap()["cache"].clone();
    assert!(cache["last_sent_at_ms"].as_u64().unwrap() >= sent && cache.get("ttl_ms").is_none(), "{cache}");
}

/// `baseline.cache` (spec §4a "Head and declaration") on the admitting send's reply and on
/// `session.baseline` alike: what the session's cache request resolved to on its route.
#[test]
fn the_baseline_declares_the_cache_its_route_resolved() {
    let rig = rig(Duration::from_secs(5));
    let mut params = keyed("declare", "bc-1");
    params["model"] = json!({"provider": "mock", "model": "echo-messages"});
    params["cache"] = json!({"role": "primary"});
    let a = rig.call("session.send", params).unwrap();
    let want = json!({"ttl_ms": 3_600_000, "ttl_options_ms": [300_000, 3_600_000], "read_refreshes_ttl": true,
                      "warm": "unsupported", "basis": "requested"});
    assert_eq!(a["baseline"]["cache"], want, "{a}");
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let served = rig.call("session.baseline", json!({})).unwrap();
    assert_eq!(served["baseline"], a["baseline"], "the reply's baseline is session.baseline's");
    // A Chat compatible's lifetime is its own: nothing known but that.
    let other = inproc::rig(Duration::from_secs(5));
    let b = other.call("session.send", keyed("declare", "bc-2")).unwrap();
    assert_eq!(b["baseline"]["cache"], json!({"warm": "unsupported", "basis": "provider_default"}));
}

fn with_delivery(mut params: Value, delivery: &str) -> Value {
    params["delivery"] = json!(delivery);
    params
}

#[test]
fn a_tool_reply_bound_is_frozen_with_the_tool_and_a_call_past_its_wait_ends_the_run_interrupted() {
    let rig = rig(Duration::from_secs(5));
    let call =
        json!({"events": [{"tool_call": {"id": "c1", "name": "slower", "arguments": {}}}, {"finish": "tool_calls"}]});
    rig.script(json!({"responses": [call.clone(), reply_script("done", 0), call]}));
    // Bounded at 3 s: the 1.5 s call is waited for (longer than the rig's 1 s default).
    let mut bounded = keyed("use it", "tr-1");
    bounded["tools"] = json!([{"name": "slower", "input_schema": {"type": "object"}, "reply": {"max_ms": 3000}}]);
    let a = rig.call("session.send", bounded).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let frozen = rig.records().into_iter().find_map(|r| match r {
        Record::RunStarted(s) => Some(serde_json::to_value(&s.config).unwrap()["tools"][0]["reply"].clone()),
        _ => None,
    });
    assert_eq!(frozen, Some(json!({"max_ms": 3000})), "frozen with the tool");
    let body: Value = serde_json::from_slice(&rig.mock.requests("default")[0].body).unwrap();
    assert!(!body.to_string().contains("max_ms"), "never rendered into a provider request");
    // The frame requires tool-reply/v1: a reader without it refuses the WAL by name.
    let path = rig.ops.registry.shared().wal_path(&key());
    let older = ["run-cancel-at/v1", "session-class/v1", "input-token-cap/v1", "restart-pause/v1"];
    let refused = broca::wal::read(&path, &older, None, &mut |_: broca::wal::ScannedFrame<'_>| {
        Ok::<(), broca::lineage::LineageError>(())
    });
    assert_eq!(refused.unwrap_err().refusal().detail.unwrap().get("missing"), Some(&json!(["tool-reply/v1"])));
    // Unbounded: the same call outlives the 1 s default wait: indeterminate, run interrupted.
    let mut unbounded = keyed("use it again", "tr-2");
    unbounded["tools"] = json!([{"name": "slower", "input_schema": {"type": "object"}}]);
    let b = rig.call("session.send", unbounded).unwrap();
    rig.wait_state(b["run_id"].as_str().unwrap(), "interrupted");
    let status = rig.call("run.status", json!({"run_id": b["run_id"]})).unwrap();
    assert_eq!(status["error"]["provider_code"], "tool_reply_timeout");
    // Interrupted by a timeout, not by a stop or a crash: no role interrupt reason (§6.5).
    assert!(status.get("reason").is_none(), "{status}");
    let outcomes: Vec<Option<broca::record::CallOutcome>> = rig
        .records()
        .into_iter()
        .filter_map(|r| match r {
            Record::ToolResult { outcome, .. } => Some(outcome),
            _ => None,
        })
        .collect();
    use broca::record::CallOutcome;
    assert_eq!(outcomes, [Some(CallOutcome::Ok), Some(CallOutcome::Unknown)]);
}

#[test]
fn a_steer_acknowledged_before_a_cancel_is_in_the_transcript_and_reported_undelivered() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [slow("never finished", 20_000)]}));
    let a = rig.call("session.send", keyed("long task", "u-1")).unwrap();
    let run_a = a["run_id"].as_str().unwrap().to_string();
    rig.wait_requests(1);
    let steer = rig.call("session.send", with_delivery(keyed("one more thing", "u-2"), "steer")).unwrap();
    assert_eq!(steer["run_id"], json!(run_a));
    assert_eq!(rig.call("run.cancel", json!({"run_id": run_a})).unwrap(), "ack");
    let status = rig.wait_state_value(&run_a, "cancelled");
    let sub = rig
        .records()
        .iter()
        .find_map(|r| match r {
            Record::Steered { submission_id, .. } => Some(submission_id.clone()),
            _ => None,
        })
        .expect("the steer was delivered into the transcript");
    assert_eq!(status["undelivered_steers"], json!([sub]));
    assert_eq!(rig.texts(), ["user:long task", "user:one more thing"], "no new turn started for it");
    assert_eq!(rig.mock.requests("default").len(), 1);
}

/// What a session's state root holds: no WAL anywhere means nothing was written.
fn wals(rig: &Rig) -> Vec<std::path::PathBuf> {
    ["wal", "wal-durable", "wal-ephemeral"]
        .iter()
        .flat_map(|d| std::fs::read_dir(rig.dir.path().join(d)).into_iter().flatten().flatten().map(|e| e.path()))
        .collect()
}

#[test]
fn members_broca_does_not_serve_or_that_are_malformed_are_refused_by_name_and_write_nothing() {
    let rig = rig(Duration::from_secs(5));
    let refusals_wrote_nothing = |rig: &inproc::Rig| assert!(wals(rig).is_empty(), "{:?}", wals(rig));
    // (retention is served since the group is declared: tests/retention.rs.)
    // plan.*.output_refs (§9.13, declared): a value other than true or false is refused by
    // the list's field, before anything is fetched.
    let mut plan_send = keyed("with refs", "e-2");
    plan_send["plan"] = json!({"tool_items": [{"provider": "fs", "output_refs": "yes"}]});
    let e = rig.call("session.send", plan_send).unwrap_err();
    assert_eq!(e.detail.as_ref().and_then(|d| d.get("field").cloned()), Some(json!("plan.tool_items[].output_refs")));
    assert_golden("send.output_refs_not_boolean.json", &e.to_json(), None);
    // A member the op reads is strict: a non-string system is refused.
    let mut system = keyed("odd system", "e-3");
    system["system"] = json!({"text": "be brief"});
    let e = rig.call("session.send", system).unwrap_err();
    assert_eq!(e.detail.as_ref().and_then(|d| d.get("field").cloned()), Some(json!("system")));
    // Members of groups broca does not declare are refused by name, never ignored: a caller's
    // run must not go ahead without what it asked for.
    // (`client_message_id` and `directives` are served since #47: their malformed values are
    // pinned in tests/refusals_write_nothing.rs.)
    for (member, value) in
        [("structured_output", json!({"schema": {"type": "object"}})), ("attachments", json!([{"upload_id": "u-1"}]))]
    {
        let mut send = keyed("with an undeclared member", "e-4");
        send[member] = value;
        let e = rig.call("session.send", send).unwrap_err();
        assert_eq!(e.detail.as_ref().and_then(|d| d.get("field").cloned()), Some(json!(member)));
        assert_golden(&format!("send.{member}_undeclared.json"), &e.to_json(), None);
    }
    refusals_wrote_nothing(&rig);
    // A member no contract names stays tolerated (logged once).
    let mut unknown = keyed("with an unknown member", "e-5");
    unknown["x_vendor_hint"] = json!(1);
    assert!(rig.call("session.send", unknown).is_ok());
}

#[test]
fn the_admitting_send_carries_the_baseline_and_its_re_send_hears_it_again() {
    let rig = rig(Duration::from_secs(5));
    rig.script(json!({"responses": [reply_script("one", 0), reply_script("two", 0)]}));
    let first = rig.call("session.send", keyed("hello", "b-1")).unwrap();
    let baseline = first["baseline"].clone();
    assert_eq!(baseline["tool_names"], json!([]), "{first}");
    assert_eq!(baseline["items"], json!([]), "{first}");
    rig.wait_state(first["run_id"].as_str().unwrap(), "completed");
    let served = rig.call("session.baseline", json!({})).unwrap();
    assert_eq!(served["baseline"], baseline, "the same struct session.baseline answers");
    let again = rig.call("session.send", keyed("hello", "b-1")).unwrap();
    assert_eq!(again["baseline"], baseline, "a retried first send gets the same reply");
    let status = rig.call("session.send_status", json!({"send_id": "b-1"})).unwrap();
    assert_eq!(status["baseline"], baseline);
    let later = rig.call("session.send", keyed("later", "b-2")).unwrap();
    assert!(later.get("baseline").is_none(), "only the admitting send carries it: {later}");
}

#[test]
fn a_joining_steer_cannot_change_the_runs_route_decision() {
    let rig = rig(Duration::from_millis(300));
    rig.script(json!({"responses": [slow("first answer", 600), reply_script("after", 0)]}));
    let mut start = keyed("start", "r-1");
    start["route_decision_id"] = json!("decision-a");
    let run = rig.call("session.send", start).unwrap();
    rig.wait_requests(1);
    let mut other = keyed("steer elsewhere", "r-2");
    other["delivery"] = json!("steer");
    other["route_decision_id"] = json!("decision-b");
    let e = rig.call("session.send", other).unwrap_err();
    assert_eq!(e.detail.as_ref().and_then(|d| d.get("field").cloned()), Some(json!("route_decision_id")));
    let before = rig.records().len();
    let mut same = keyed("steer along", "r-3");
    same["delivery"] = json!("steer");
    same["route_decision_id"] = json!("decision-a");
    rig.call("session.send", same).unwrap();
    let mut omitted = keyed("steer inheriting", "r-4");
    omitted["delivery"] = json!("steer");
    rig.call("session.send", omitted).unwrap();
    assert_eq!(rig.records().len(), before + 2, "the same and an omitted decision join; the refused one wrote nothing");
    rig.wait_state(run["run_id"].as_str().unwrap(), "completed");
}

#[test]
fn the_conversation_key_and_its_source_are_frozen_on_each_run() {
    let rig = rig(Duration::from_secs(5));
    let sources = |rig: &Rig| -> Vec<(Value, Value)> {
        rig.records()
            .into_iter()
            .filter_map(|r| match r {
                Record::RunStarted(s) => {
                    let d =
                        serde_json::to_value(s.auth_selection.unwrap_or_default()).unwrap()["account_decision"].clone();
                    Some((d["conversation_key"].clone(), d["conversation_key_source"].clone()))
                }
                _ => None,
            })
            .collect()
    };
    let a = rig.call("session.send", keyed("one", "ck-1")).unwrap();
    rig.wait_state(a["run_id"].as_str().unwrap(), "completed");
    let mut keyed_send = keyed("two", "ck-2");
    keyed_send["conversation_key"] = json!("team-7");
    let b = rig.call("session.send", keyed_send).unwrap();
    rig.wait_state(b["run_id"].as_str().unwrap(), "completed");
    let c = rig.call("session.send", keyed("three", "ck-3")).unwrap();
    rig.wait_state(c["run_id"].as_str().unwrap(), "completed");
    let got = sources(&rig);
    assert_eq!(got[0], (json!(key().addr()), json!("session")), "derived from the session");
    assert_eq!(got[1], (json!("team-7"), json!("caller")));
    assert_eq!(got[2], (json!("team-7"), json!("inherited")), "absent inherits the latest frozen key");
}

/// Gemini (#29): a tool loop on `google.generate_content` through broca-mock. The call Gemini
/// made comes back as a `functionCall` carrying the thought signature Gemini put on it, its
/// result as a `functionResponse` named after the tool, and the run reads back whole.
#[test]
fn a_gemini_tool_loop_round_trips_its_call_result_and_signature() {
    let rig = rig(Duration::from_secs(5));
    let call = json!({"events": [{"reasoning": "I should time it.", "signature": "CiQBgeminiSig=="},
                                  {"tool_call": {"id": "fc_9", "name": "slow", "arguments": {"n": 1}}},
                                  {"usage": {"input": 40, "output": 7, "reasoning": 3}}, {"finish": "tool_calls"}]});
    rig.script(json!({"responses": [call, reply_script("It took a while.", 0)]}));
    let mut params = keyed("how slow is it?", "gm-1");
    params["model"] = json!({"provider": "mock", "model": "echo-gemini"});
    params["tools"] = json!([{"name": "slow", "input_schema": {"type": "object"}}]);
    let run = rig.call("session.send", params).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run, "completed");
    let requests = rig.mock.requests("default");
    assert_eq!(requests.len(), 2);
    assert!(requests[0].path.ends_with("/models/echo-gemini:streamGenerateContent?alt=sse"), "{}", requests[0].path);
    let second = requests[1].body_json().unwrap();
    let model_turn = &second["contents"][1];
    assert_eq!(model_turn["role"], "model");
    assert_eq!(
        model_turn["parts"][0],
        json!({"functionCall": {"name": "slow", "args": {"n": 1}, "id": "fc_9"}, "thoughtSignature": "CiQBgeminiSig=="})
    );
    let answer = &second["contents"][2]["parts"][0]["functionResponse"];
    assert_eq!((answer["name"].clone(), answer["id"].clone()), (json!("slow"), json!("fc_9")), "{second}");
    assert_eq!(answer["response"]["output"], "slow done");
    let texts = ["user:how slow is it?", "assistant:I should time it.", "tool:", "assistant:It took a while."];
    assert_eq!(rig.texts(), texts, "the thought summary is kept as reasoning");
    let status = rig.call("run.status", json!({"run_id": run})).unwrap();
    assert_eq!(status["usage"]["reasoning_tokens"], 3, "{status}");
}

/// Bedrock Converse (#29): a tool loop over broca-mock's AWS event stream (binary frames with
/// their CRCs). The call comes back as `toolUse`, its result as a `toolResult` in the next user
/// turn, and the reasoning's signature as `reasoningContent`.
#[test]
fn a_bedrock_tool_loop_round_trips_over_the_event_stream() {
    let rig = rig(Duration::from_secs(5));
    let call = json!({"events": [{"reasoning": "Time it.", "signature": "EqQBbedrock=="},
                                  {"tool_call": {"id": "tooluse_1", "name": "slow", "arguments": {"n": 2}, "chunks": 3}},
                                  {"usage": {"input": 30, "output": 9, "cached": 0}}, {"finish": "tool_calls"}]});
    rig.script(json!({"responses": [call, reply_script("Done timing.", 0)]}));
    let mut params = keyed("time the slow tool", "bd-1");
    params["model"] = json!({"provider": "mock", "model": "echo-bedrock"});
    params["tools"] = json!([{"name": "slow", "input_schema": {"type": "object"}}]);
    let run = rig.call("session.send", params).unwrap()["run_id"].as_str().unwrap().to_owned();
    rig.wait_state(&run, "completed");
    let requests = rig.mock.requests("default");
    assert!(requests[0].path.ends_with("/model/echo-bedrock/converse-stream"), "{}", requests[0].path);
    assert_eq!(requests[0].header("accept"), Some("application/vnd.amazon.eventstream"));
    let second = requests[1].body_json().unwrap();
    let assistant = &second["messages"][1];
    assert_eq!(
        assistant["content"][0],
        json!({"reasoningContent": {"reasoningText": {"text": "Time it.", "signature": "EqQBbedrock=="}}})
    );
    assert_eq!(
        assistant["content"][1],
        json!({"toolUse": {"toolUseId": "tooluse_1", "name": "slow", "input": {"n": 2}}})
    );
    // `toolResult.status` is documented for Claude models only (#46): `echo-bedrock` gets none.
    let result = &second["messages"][2]["content"][0]["toolResult"];
    assert_eq!((result["toolUseId"].clone(), result["status"].clone()), (json!("tooluse_1"), Value::Null), "{second}");
    let texts = ["user:time the slow tool", "assistant:Time it.", "tool:", "assistant:Done timing."];
    assert_eq!(rig.texts(), texts);
}

/// One session whose runs switch wire families (#29): each send names its own model, so each
/// episode renders the whole history in its family's shape, and the session reads back intact.
#[test]
fn a_session_switching_families_between_runs_reads_back_intact() {
    let rig = rig(Duration::from_secs(5));
    let models = ["echo-chat", "echo-messages", "echo-gemini", "echo-bedrock", "echo-responses"];
    let mut expected = Vec::new();
    for (i, model) in models.iter().enumerate() {
        rig.script(json!({"responses": [reply_script(&format!("answer {i}"), 0)]}));
        let mut params = keyed(&format!("question {i}"), &format!("sw-{i}"));
        params["model"] = json!({"provider": "mock", "model": model});
        let run = rig.call("session.send", params).unwrap()["run_id"].as_str().unwrap().to_owned();
        rig.wait_state(&run, "completed");
        expected.push(format!("user:question {i}"));
        expected.push(format!("assistant:answer {i}"));
        // The run's request carried every earlier turn, in this family's shape.
        let sent = rig.mock.requests("default").last().unwrap().body.clone();
        let sent = String::from_utf8_lossy(&sent).to_string();
        for earlier in 0..i {
            assert!(sent.contains(&format!("answer {earlier}")), "{model}: lacks answer {earlier}: {sent}");
        }
    }
    assert_eq!(rig.texts(), expected);
}
