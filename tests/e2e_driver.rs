//! The driver surface through the real subc daemon: one harness ([`support::Harness`]: the
//! daemon in process, the real broca binary, broca-mock, the consumer SDK) and a list of
//! scenarios run one after another on it.
//!
//! One test fn, because stopping the in-process daemon means SIGTERM to this process. To add a
//! scenario: write `fn my_scenario(h: &Harness)` using its own session id (or `h.unique(..)`)
//! and append it to [`SCENARIOS`]. Every wait is bounded.

use broca_mock::mock;
mod pin;
mod support;

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use pin::assert_golden;
use serde_json::{json, Value};
use support::{retry, send_params, Harness, Session};

/// The bind harness of every scenario's sessions.
const HARNESS: &str = "driver-e2e";

/// A named scenario: it runs against the shared harness and panics on a failed check.
type Scenario = (&'static str, fn(&Harness));

/// Run in order, on one harness; each prints its name before it runs.
const SCENARIOS: &[Scenario] = &[
    ("a refused first send leaves no file and the session unwritten", a_refused_first_send_leaves_no_file),
    ("idle send starts a run that completes", idle_send_runs_to_completion),
    ("removed ops answer unknown_method and write nothing", removed_ops_are_unknown),
    ("sessions bind their project root and harness", sessions_bind_root_and_harness),
    ("keyed re-sends replay their answer; other content is send_id_reuse", keyed_resends),
    ("a steer joins the running turn; its provisional id survives a restart", steer_joins_the_running_turn),
    ("interrupt, queue, retract and cancel keep one order", interrupt_queue_retract_cancel),
    ("run.status, run.result and send.status answer in pinned shapes", statuses_are_pinned),
    ("an auth pause refuses other sends and resumes on its own send_id", auth_pause_and_resume),
    ("a vanished project root refuses writes and serves reads", vanished_project_root),
    ("a newer writer's WAL is refused by name by every op", newer_writer_refused_everywhere),
    ("the input-token cap ends runs budget_exhausted", input_token_cap),
    ("session class, context management and cache are decided at admission", admission_policy),
    ("many drivers, a SIGKILL and a respawn lose and duplicate nothing", stress_with_restart),
    ("a restart-paused run is resumed at boot under the same run id", restart_pause_resumes_at_boot),
    ("a restart resume is refused when a tool route is gone", restart_resume_needs_its_tool_routes),
    ("unknown send members are tolerated and logged once per key", unknown_members_logged_once),
    ("a retained session expires, is deleted and a later send starts fresh", retention_expires_and_deletes),
    ("an Anthropic tool loop reads its prefix from the provider cache from its second step", prompt_cache_reads),
    ("a rate-limited run's error keeps the provider's retry-after and reset time", rate_limit_timing_recorded),
];

/// A run ended by a provider's rate limit records the provider's own timing (llm-runner §4.3,
/// §6): `run.status` serves its fractional `Retry-After` and the exhausted limit's reset time
/// (Anthropic's RFC 3339 header), `session.head.last_run_error` the same values from the same
/// record, and both read the same after a SIGKILL and respawn (the WAL holds them).
fn rate_limit_timing_recorded(h: &Harness) {
    let s = h.session(HARNESS, &h.unique("rate-limited"), None);
    let limited = json!({"status": 429, "headers": {
        "retry-after": "1.5",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-09-21T14:13:23Z",
        "anthropic-ratelimit-tokens-remaining": "900",
        "anthropic-ratelimit-tokens-reset": "2026-09-21T14:20:00Z",
    }});
    // The first attempt and broca's three retries (each waits the asked 1.5 s at least).
    h.install_alone(json!({"responses": [limited, limited, limited, limited]}));
    let mut params = keyed("summarize the log", "rl-1");
    params["model"] = json!({"provider": "mock", "model": "echo-messages"});
    let run_id = s.ok("session.send", params)["run_id"].as_str().unwrap().to_owned();
    let status = s.wait_run(&run_id, "error");
    let error = &status["error"];
    assert_eq!((&error["class"], &error["status"]), (&json!("transient"), &json!(429)), "{status}");
    assert_eq!((&error["retry_after_secs"], &error["resets_at_ms"]), (&json!(1.5), &json!(1_790_000_003_000u64)));
    let expected = json!({"class": "transient", "retry_after_secs": 1.5, "resets_at_ms": 1_790_000_003_000u64});
    let head = s.ok("session.head", json!({}));
    assert_eq!((&head["last_run_state"]["run_id"], &head["last_run_error"]), (&json!(run_id), &expected), "{head}");
    let old = h.kill_broca();
    h.wait_respawn(old);
    assert_eq!(s.ok("run.status", json!({"run_id": run_id})), status, "run.status after a restart");
    assert_eq!(s.ok("session.head", json!({}))["last_run_error"], expected, "the head after a restart");
}

/// Prompt caching through the daemon (#28): broca marks the prefix, broca-mock's model of the
/// provider's cache (`{"usage": {"measured": true}}`) reads it back on every later step, and the
/// run's usage and the head's cache clock show it.
fn prompt_cache_reads(h: &Harness) {
    let s = h.session(HARNESS, "cached-loop", None);
    let measured = json!({"usage": {"measured": true, "output": 5}});
    let call = |id: &str| json!({"events": [{"tool_call": {"id": id, "name": "look", "arguments": {}}}, measured, {"finish": "tool_calls"}]});
    h.install_alone(
        json!({"responses": [call("c1"), call("c2"), {"events": [{"text": "done"}, measured, {"finish": "stop"}]}]}),
    );
    let mut params = keyed("tidy the tree", "pc-1");
    params["model"] = json!({"provider": "mock", "model": "echo-messages"});
    params["system"] = json!("Read the file before you change it; keep each change small. ".repeat(120));
    params["tools"] = json!([{"name": "look", "input_schema": {"type": "object"}}]);
    let run = s.ok("session.send", params)["run_id"].as_str().unwrap().to_owned();
    s.wait_run(&run, "completed");
    let usage = s.ok("run.result", json!({"run_id": run}))["usage"].clone();
    let tokens = |name: &str| usage[name].as_u64().unwrap_or_else(|| panic!("{name} in {usage}"));
    let (cached, written) = (tokens("cached_input_tokens"), tokens("cache_write_tokens"));
    assert!(written > 1000, "the first step wrote the prefix: {usage}");
    assert!(cached > written, "steps two and three read what the steps before them wrote: {usage}");
    let cache = s.ok("session.head", json!({}))["cache"].clone();
    assert_eq!(
        (cache["ttl_ms"].clone(), cache["expiry_basis"].clone()),
        (json!(300_000), json!("estimated")),
        "{cache}"
    );
}

/// `session.send` is lenient: members it does not read are accepted and each is logged once per
/// process at WARN on `broca.wire`, naming the key and the caller's harness.
fn unknown_members_logged_once(h: &Harness) {
    let s = h.session(HARNESS, "lenient", None);
    for i in 0..2 {
        let mut params = keyed("hi", &format!("u-{i}"));
        params["frobnicate_level"] = json!(3);
        params["model"]["shade"] = json!("blue");
        let reply = s.ok("session.send", params);
        s.wait_run(reply["run_id"].as_str().unwrap(), "completed");
    }
    let log = h.broca_log();
    for key in ["\"frobnicate_level\"", "\"model.shade\""] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("broca.wire") && l.contains(key)).collect();
        assert_eq!(lines.len(), 1, "{key}: {lines:?}");
        assert!(lines[0].contains("WARN") && lines[0].contains(HARNESS), "{}", lines[0]);
    }
}

fn keyed(prompt: &str, send_id: &str) -> Value {
    let mut p = send_params(prompt);
    p["send_id"] = json!(send_id);
    p
}

fn with(mut params: Value, member: &str, value: Value) -> Value {
    params[member] = value;
    params
}

fn reply(text: &str, delay_ms: u64) -> Value {
    json!({"events": [{"text": text}, {"delay_ms": delay_ms}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

/// Waits until the provider has seen `n` requests more than `base`.
fn wait_requests(h: &Harness, base: usize, n: usize) {
    let until = Instant::now() + support::STEP;
    while h.mock.requests("default").len() < base + n {
        assert!(Instant::now() < until, "the provider never got request {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn texts(s: &Session) -> Vec<String> {
    let page = s.ok("session.read", json!({"limit": 1000}));
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let parts = m["message"]["content"].as_array().cloned().unwrap_or_default();
            let text: String = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            format!("{}:{text}", m["message"]["role"].as_str().unwrap())
        })
        .collect()
}

fn refusal_json(body: &Value) -> String {
    body.to_string()
}

fn keyed_resends(h: &Harness) {
    let s = h.session(HARNESS, "keyed", None);
    h.install(json!({"responses": [reply("one", 300)]}));
    let first = s.ok("session.send", keyed("hello", "k-1"));
    assert_eq!(s.ok("session.send", keyed("hello", "k-1")), first, "an identical retry while active");
    assert_eq!(
        s.ok("session.send", with(keyed("hello", "k-1"), "title", json!("edited"))),
        first,
        "title is not identity"
    );
    let run_id = first["run_id"].as_str().unwrap();
    s.wait_run(run_id, "completed");
    assert_eq!(
        s.ok("session.send", keyed("hello", "k-1")),
        json!({"state": "finished", "run_id": run_id, "reason": "completed", "baseline": first["baseline"]})
    );
    assert_eq!(s.ok("send.status", json!({"send_id": "k-1"})), s.ok("session.send", keyed("hello", "k-1")));
    let (_, body) = s.refused("session.send", keyed("other words", "k-1"));
    assert_golden("send_id_reuse.json", &refusal_json(&body), None);
    let (_, body) = s.refused("session.send", with(keyed("hello", "k-1"), "delivery", json!("interrupt")));
    assert_eq!(body["detail"]["field"], "delivery");
    let (_, body) = s.refused("send.status", json!({"send_id": "nope"}));
    assert_golden("unknown_send.json", &refusal_json(&body), None);
}

fn steer_joins_the_running_turn(h: &Harness) {
    let s = h.session(HARNESS, "steer", None);
    let base = h.mock.requests("default").len();
    h.install(json!({"responses": [reply("first answer", 500), reply("saw the steer", 0)]}));
    let run = s.ok("session.send", keyed("start", "st-1"));
    let run_id = run["run_id"].as_str().unwrap().to_string();
    wait_requests(h, base, 1);
    let joined = s.ok("session.send", with(keyed("also check the tests", "st-2"), "delivery", json!("steer")));
    assert_eq!(joined, json!({"state": "active", "run_id": run_id}));
    s.wait_run(&run_id, "completed");
    assert_eq!(
        texts(&s),
        ["user:start", "assistant:first answer", "user:also check the tests", "assistant:saw the steer"]
    );
    // The steer's provisional run id, taken after a restart (SIGKILL, respawn).
    let receipt = s.ok("session.send", with(keyed("also check the tests", "st-2"), "delivery", json!("steer")));
    assert_eq!(receipt["delivered"], json!({"as": "step", "ref": run_id}));
    let sub = steer_submission(h, &s);
    let before = s.ok("run.status", json!({"run_id": format!("run-{sub}")}));
    let old = h.kill_broca();
    h.wait_respawn(old);
    let after = s.ok("run.status", json!({"run_id": format!("run-{sub}")}));
    assert_eq!(after, before, "the same answer before and after a restart");
    assert_golden("run_status.provisional_delivered_steer.json", &after.to_string(), None);
}

/// The submission id of the session's (only) steer, from its WAL.
fn steer_submission(h: &Harness, s: &Session) -> String {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_broca")).arg("inspect").arg(s.wal_path()).output().unwrap();
    let _ = h;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|r| r.pointer("/record/steered/submission_id").and_then(Value::as_str).map(String::from))
        .unwrap_or_else(|| panic!("no steered record in {}", String::from_utf8_lossy(&out.stdout)))
}

fn interrupt_queue_retract_cancel(h: &Harness) {
    let s = h.session(HARNESS, "interrupt", None);
    let base = h.mock.requests("default").len();
    h.install(json!({"responses": [reply("never finished", 20_000), reply("interrupt handled", 0), reply("queued handled", 0)]}));
    let a = s.ok("session.send", keyed("long task", "i-1"));
    let run_a = a["run_id"].as_str().unwrap().to_string();
    wait_requests(h, base, 1);
    let queued = s.ok("session.send", keyed("plain next", "i-2"));
    let doomed = s.ok("session.send", keyed("never mind", "i-3"));
    assert_eq!(s.ok("session.retract", json!({"submission_id": doomed["submission_id"]})), json!({"retracted": true}));
    assert_eq!(
        s.ok("session.retract", json!({"session": "interrupt", "submission_id": a["submission_id"]})),
        json!({"retracted": false, "reason": "already_started"})
    );
    assert_eq!(
        s.ok("run.cancel", json!({"run_id": format!("run-{}", queued["submission_id"].as_str().unwrap())})),
        "not_active"
    );
    let (_, body) = s.refused("run.cancel", json!({"run_id": run_a, "at": "whenever"}));
    assert_eq!(body["detail"]["field"], "at");
    let i = s.ok("session.send", with(keyed("stop, do this", "i-4"), "delivery", json!("interrupt")));
    assert_eq!(i["state"], "pending");
    s.wait_run(&run_a, "cancelled");
    s.wait_run(&format!("run-{}", queued["submission_id"].as_str().unwrap()), "completed");
    assert_eq!(
        texts(&s),
        [
            "user:long task",
            "user:stop, do this",
            "assistant:interrupt handled",
            "user:plain next",
            "assistant:queued handled"
        ]
    );
    assert_eq!(s.ok("run.cancel", json!({"run_id": run_a})), "not_active");
    assert_eq!(
        s.ok("run.status", json!({"run_id": format!("run-{}", doomed["submission_id"].as_str().unwrap())})),
        json!({"state": "retracted"})
    );
}

fn statuses_are_pinned(h: &Harness) {
    let s = h.session(HARNESS, "status", None);
    let base = h.mock.requests("default").len();
    h.install(json!({"responses": [
        reply("looking", 600),
        {"events": [{"reasoning": "thinking"}, {"text": "All pass.\n"}, {"text": "The fix is in parse.rs."}, {"usage": {"input": 7, "output": 3}}, {"finish": "stop"}]},
    ]}));
    let a = s.ok("session.send", with(keyed("one", "p-1"), "title", json!("first task")));
    let run_a = a["run_id"].as_str().unwrap().to_string();
    let b = s.ok("session.send", keyed("two", "p-2"));
    let run_b = format!("run-{}", b["submission_id"].as_str().unwrap());
    assert_golden(
        "run_status.provisional_pending.json",
        &s.ok("run.status", json!({"run_id": run_b})).to_string(),
        None,
    );
    assert_eq!(s.ok("session.send_status", json!({"send_id": "p-2"})), b);
    wait_requests(h, base, 1);
    std::thread::sleep(Duration::from_millis(150));
    let live = s.ok("run.status", json!({"run_id": run_a}));
    assert_golden("run_status.active_with_step.json", &live.to_string(), None);
    s.wait_run(&run_b, "completed");
    let status = s.ok("run.status", json!({"run_id": run_b}));
    assert_golden("run_status.provisional_started.json", &status.to_string(), None);
    assert_golden("run_result.completed.json", &s.ok("run.result", json!({"run_id": run_b})).to_string(), None);
}

fn auth_pause_and_resume(h: &Harness) {
    let s = h.session(HARNESS, "auth", None);
    h.install(json!({"responses": [{"status": 401}, reply("welcome back", 0)]}));
    let a = s.ok("session.send", keyed("needs auth", "a-1"));
    let run_a = a["run_id"].as_str().unwrap().to_string();
    let paused = s.wait_run(&run_a, "paused");
    assert_eq!(paused["reason"], "auth_required");
    let (_, body) = s.refused("session.send", keyed("something else", "a-2"));
    assert_golden("run_paused.json", &refusal_json(&body), None);
    let (_, body) = s.refused("session.send", with(keyed("steer it", "a-3"), "delivery", json!("steer")));
    assert_eq!(body["code"], "run_paused");
    let resumed = s.ok("session.send", keyed("needs auth", "a-1"));
    assert_eq!((resumed["state"].as_str(), resumed["run_id"].as_str()), (Some("active"), Some(run_a.as_str())));
    s.wait_run(&run_a, "completed");
    assert_eq!(texts(&s), ["user:needs auth", "assistant:welcome back"]);
}

fn vanished_project_root(h: &Harness) {
    let root = h.project_dir("vanishing");
    let s = h.session(HARNESS, "vanish", Some(&root));
    let a = s.send("hello");
    let run_a = a["run_id"].as_str().unwrap().to_string();
    s.wait_run(&run_a, "completed");
    std::fs::remove_dir(&root).unwrap();
    let (_, body) = s.refused("session.send", keyed("more", "v-2"));
    assert_golden("invalid_project_root.json", &refusal_json(&body), Some(root.to_str().unwrap()));
    assert_eq!(s.ok("session.read", json!({}))["messages"].as_array().unwrap().len(), 2);
    assert_eq!(s.ok("run.status", json!({"run_id": run_a}))["state"], "completed");
    assert_eq!(s.ok("run.cancel", json!({"run_id": run_a})), "not_active");
    assert_eq!(s.ok("session.retract", json!({"submission_id": "sub-x"}))["retracted"], false);
    std::fs::create_dir(&root).unwrap();
    let again = s.ok("session.send", keyed("more", "v-2"));
    s.wait_run(again["run_id"].as_str().unwrap(), "completed");
}

fn newer_writer_refused_everywhere(h: &Harness) {
    let s = h.session(HARNESS, "newer", None);
    // A WAL whose second frame needs a feature this build does not know, written while no
    // broca holds the session (as a newer broca would have left it).
    broca::wal::create(&broca::wal::FileStorage, &s.wal_path(), s.key().lineage_id()).unwrap();
    let mut frame = Vec::new();
    broca::wal::frame::encode(&mut frame, broca::wal::frame::FrameKind::Record, 1, 1, &["probe-unknown/v1"], b"{}");
    let mut f = std::fs::OpenOptions::new().append(true).open(s.wal_path()).unwrap();
    std::io::Write::write_all(&mut f, &frame).unwrap();
    for (method, params) in [
        ("session.send", keyed("hi", "n-1")),
        ("session.read", json!({})),
        ("run.status", json!({"run_id": "run-x"})),
        ("run.status", json!({})),
        ("session.retract", json!({"submission_id": "sub-x"})),
        ("run.cancel", json!({"run_id": "run-x"})),
        ("run.result", json!({"run_id": "run-x"})),
        ("send.status", json!({"send_id": "n-1"})),
    ] {
        let (_, body) = s.refused(method, params);
        assert_golden("wal_newer_writer.json", &refusal_json(&body), None);
    }
}

fn input_token_cap(h: &Harness) {
    let s = h.session(HARNESS, "cap", None);
    h.install(json!({"responses": [reply("within", 0)]}));
    // A step that spends the cap exactly ends its run: a cap of N stops at N (llm-runner §9.3).
    let a = s.ok("session.send", with(keyed("one", "b-1"), "budget", json!({"max_input_tokens": 5})));
    let first = s.wait_run(a["run_id"].as_str().unwrap(), "budget_exhausted");
    assert_eq!(first["detail"], json!({"limit": 5, "spent": 5, "cause": "limit_reached"}));
    let (_, body) = s.refused("session.send", with(keyed("two", "b-2"), "budget", json!({"max_input_tokens": 6})));
    assert_eq!(body["detail"]["field"], "budget.max_input_tokens");
    let b = s.ok("session.send", keyed("two", "b-3"));
    let status = s.wait_run(b["run_id"].as_str().unwrap(), "budget_exhausted");
    assert_eq!(status["detail"], json!({"limit": 5, "spent": 5, "cause": "limit_reached"}));
    assert_eq!(s.ok("run.result", json!({"run_id": b["run_id"]}))["detail"], status["detail"]);
}

fn admission_policy(h: &Harness) {
    let s = h.session(HARNESS, "classed", None);
    let (_, body) = s.refused("session.send", with(keyed("x", "c-0"), "context_management", json!("compaction")));
    assert_golden("context_management_unavailable.json", &refusal_json(&body), None);
    let (_, body) = s.refused("session.send", with(keyed("x", "c-1"), "cache", json!({"ttl": "24h"})));
    assert_golden("open_failed_permanent.json", &refusal_json(&body), None);
    assert!(!s.wal_path().exists(), "admission refusals write nothing");
    let a = s.ok("session.send", with(keyed("one", "c-2"), "session_class", json!("head")));
    s.wait_run(a["run_id"].as_str().unwrap(), "completed");
    assert!(s.wal_path().starts_with(h.state_root().join("wal-durable")), "{}", s.wal_path().display());
    let (_, body) = s.refused("session.send", with(keyed("two", "c-3"), "session_class", json!("worker")));
    assert_eq!(body["detail"]["field"], "session_class");
    let e = s.session_member_refusal();
    assert_eq!(e, "session");
    let describe = s.ok("role.describe", json!({}));
    assert_eq!(describe["session_class"]["backup_classes"], json!(["head"]));
}

trait SessionMember {
    fn session_member_refusal(&self) -> String;
}

impl SessionMember for Session {
    /// A send naming another session than the route's is refused naming `session`.
    fn session_member_refusal(&self) -> String {
        let (_, body) = self.refused("session.send", with(keyed("x", "c-9"), "session", json!("someone-else")));
        body["detail"]["field"].as_str().unwrap().to_string()
    }
}

/// Four drivers on two sessions send (queue, steer, interrupt), retract and cancel while broca
/// is SIGKILLed and respawned once; afterwards every send they were told was accepted appears
/// exactly once (none that was retracted), each session's queued sends kept their order, and
/// every run is terminal.
fn stress_with_restart(h: &Harness) {
    let responses: Vec<Value> = (0..80).map(|i| reply(&format!("answer {i}"), 15)).collect();
    h.install(json!({"responses": responses}));
    let sessions = [h.session(HARNESS, "stress-a", None), h.session(HARNESS, "stress-b", None)];
    let killed = std::sync::atomic::AtomicBool::new(false);
    let outcomes: Vec<(usize, Vec<(String, bool)>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let s = sessions[t % 2].clone();
                let killed = &killed;
                scope.spawn(move || {
                    let mut sent = Vec::new();
                    for i in 0..8 {
                        let id = format!("t{t}-{i}");
                        let delivery = ["queue", "steer", "queue", "interrupt"][i % 4];
                        let params = with(keyed(&format!("msg {id}"), &id), "delivery", json!(delivery));
                        // The same send_id across the restart, send.status deciding: at most one send.
                        let answer = s.send_surviving_kills(params);
                        let mut retracted = false;
                        if i == 6 && answer["state"] == "pending" {
                            retry(&s, "session.retract", json!({"submission_id": answer["submission_id"]}));
                            // A retract racing the kill may have been recorded without its answer
                            // (a second one then finds the tombstone): the send's fate says.
                            retracted = retry(&s, "send.status", json!({"send_id": id}))["state"] == "retracted";
                        }
                        if i == 5 {
                            if let Some(run) = answer["run_id"].as_str() {
                                retry(&s, "run.cancel", json!({"run_id": run, "at": "step_boundary"}));
                            }
                        }
                        sent.push((format!("msg {id}"), retracted));
                        if t == 0 && i == 3 && !killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            let old = h.kill_broca();
                            h.wait_respawn(old);
                        }
                    }
                    (t % 2, sent)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (index, s) in sessions.iter().enumerate() {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let status = retry(s, "run.status", json!({}));
            let queued = s.ok("session.read", json!({"limit": 1}));
            if status["state"] != "active"
                && queued["lineage_state"] != "active"
                && all_sent_landed(s, &outcomes, index)
            {
                break;
            }
            assert!(Instant::now() < until, "session {} never settled: {status}", s.id);
            std::thread::sleep(Duration::from_millis(100));
        }
        let users: Vec<String> =
            texts(s).into_iter().filter_map(|t| t.strip_prefix("user:").map(String::from)).collect();
        for (_, sent) in outcomes.iter().filter(|(i, _)| *i == index) {
            for (message, retracted) in sent {
                let n = users.iter().filter(|u| *u == message).count();
                assert_eq!(n, usize::from(!retracted), "{message} appears {n} times in {}: {users:?}", s.id);
            }
        }
    }
}

/// Whether every non-retracted send of session `index` is in its transcript.
fn all_sent_landed(s: &Session, outcomes: &[(usize, Vec<(String, bool)>)], index: usize) -> bool {
    let users: Vec<String> = texts(s).into_iter().filter_map(|t| t.strip_prefix("user:").map(String::from)).collect();
    outcomes.iter().filter(|(i, _)| *i == index).flat_map(|(_, sent)| sent).all(|(m, r)| *r || users.contains(m))
}

/// Kills broca and leaves `s` as a drain would have: a new episode `run_b` (send `send_id`,
/// frozen `config` changed by `edit`) paused for a restart at its step-entry boundary, written
/// while no broca holds it. Returns the killed process's pid, for `wait_respawn`.
fn plant_restart_pause(
    h: &Harness,
    s: &Session,
    (run_b, send_id): (&str, &str),
    edit: impl FnOnce(&mut broca::frozen::FrozenConfig),
) -> i32 {
    let old = h.kill_broca();
    let shared = broca::lineage::Shared::open(broca::state_root::StateRoot::at(&h.state_root()).unwrap()).unwrap();
    let mut l = loop {
        match shared.open_lineage(&s.key()) {
            Ok(l) => break l,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut frozen = l.state().last.as_ref().unwrap().config.config().unwrap().clone();
    edit(&mut frozen);
    let config = broca::record::Frozen::new(frozen);
    let request = broca::record::RequestIdentity {
        send_id: Some(send_id.into()),
        config: Some(config.clone()),
        ..Default::default()
    };
    let sub = run_b.trim_start_matches("run-").to_string();
    l.enqueue(&sub, broca::message::Message::user_text("resume me"), request).unwrap();
    let started = broca::record::RunStarted {
        run_id: run_b.into(),
        submission_id: Some(sub),
        origin: Default::default(),
        config,
        input: broca::message::Message::user_text("resume me"),
        title: None,
        started_at_ms: 1,
        auth_selection: None,
        owner: None,
    };
    l.append(&broca::record::Record::RunStarted(Box::new(started))).unwrap();
    l.append(&broca::record::Record::RunPaused {
        run_id: run_b.into(),
        reason: broca::record::PauseReason::Restart,
        error: None,
    })
    .unwrap();
    l.commit().unwrap();
    drop(l);
    shared.settle();
    old
}

/// A run whose WAL shows it paused for a restart (as a drain leaves it) is resumed by the next
/// process's boot recovery: same run id, same send id, the next step runs.
fn restart_pause_resumes_at_boot(h: &Harness) {
    let s = h.session(HARNESS, "restart-pause", None);
    // (The lane may still hold answers an earlier scenario did not use: texts are not checked.)
    let a = s.ok("session.send", with(keyed("long job", "rp-1"), "on_restart", json!("resume")));
    let run_a = a["run_id"].as_str().unwrap().to_string();
    s.wait_run(&run_a, "completed");
    let run_b = "run-sub-00000000000000000000000000restart".to_string();
    let old = plant_restart_pause(h, &s, (&run_b, "rp-2"), |_| {});
    h.wait_respawn(old);
    let status = s.wait_run(&run_b, "completed");
    assert_eq!(status["run_id"], run_b);
    assert_eq!(s.ok("send.status", json!({"send_id": "rp-2"}))["run_id"], run_b);
    let texts = texts(&s);
    assert_eq!(texts.len(), 4, "{texts:?}");
    assert_eq!(texts[2], "user:resume me");
    assert!(texts[3].starts_with("assistant:"), "the resumed run took its next step: {texts:?}");
}

/// A restart resume re-checks its tool routes (spec "Graceful restart", #47): a run whose frozen
/// tools name a provider the daemon no longer serves is sealed interrupted, `resume_refused`,
/// naming the provider; its model is never called.
fn restart_resume_needs_its_tool_routes(h: &Harness) {
    let s = h.session(HARNESS, "restart-routes", None);
    let a = s.ok("session.send", with(keyed("first", "rr-1"), "on_restart", json!("resume")));
    s.wait_run(a["run_id"].as_str().unwrap(), "completed");
    let run_b = "run-sub-0000000000000000000000000000routes".to_string();
    let old = plant_restart_pause(h, &s, (&run_b, "rr-2"), |c| {
        let mut tool: broca::frozen::ToolSpec =
            serde_json::from_value(json!({"name": "gone", "input_schema": {"type": "object"}})).unwrap();
        tool.module = Some("no-such-provider".into());
        c.tools = vec![tool];
    });
    let requests = h.mock.requests("default").len();
    h.wait_respawn(old);
    let status = s.wait_run(&run_b, "interrupted");
    assert_eq!(status["error"]["provider_code"], "resume_refused", "{status}");
    assert!(status["error"]["message"].as_str().unwrap().contains("\"no-such-provider\" is not reachable"), "{status}");
    assert_eq!(h.mock.requests("default").len(), requests, "the model was not called");
}

/// An idle `session.send` answers `{state: "active", run_id}`; `run.status` reaches `completed`.
fn idle_send_runs_to_completion(h: &Harness) {
    let s = h.session(HARNESS, "idle-send", None);
    let reply = s.ok("session.send", send_params("Hello?"));
    assert_eq!(reply["state"], "active", "{reply}");
    let run_id = reply["run_id"].as_str().unwrap_or_else(|| panic!("a run_id: {reply}"));
    s.wait_run(run_id, "completed");
}

/// `cap.install`, `spend.delta` and `usage.export` are gone: each is `unknown_method`, and the
/// session's WAL was never created.
fn removed_ops_are_unknown(h: &Harness) {
    let s = h.session(HARNESS, "removed-ops", None);
    for method in ["cap.install", "spend.delta", "usage.export"] {
        let (code, body) = s.refused(method, json!({}));
        assert_eq!(code, "unknown_method", "{method}: {body}");
    }
    assert!(!s.wal_path().exists(), "a refused op wrote {}", s.wal_path().display());
}

/// The harness itself: one `{harness, session}` under two project roots (relayed connections),
/// under root `/` and under another harness name are four sessions with four WALs, each at the
/// address `broca session ROOT HARNESS SESSION` prints; a second connection reaches the same
/// session as the first.
fn sessions_bind_root_and_harness(h: &Harness) {
    let (a, b) = (h.project_dir("alpha"), h.project_dir("beta"));
    let sessions = [
        h.session(HARNESS, "rooted", Some(&a)),
        h.session(HARNESS, "rooted", Some(&b)),
        h.session(HARNESS, "rooted", None),
        h.session("driver-e2e-other", "rooted", None),
    ];
    let mut wals = Vec::new();
    for s in &sessions {
        let reply = s.send(&format!("Where is {}?", s.project_root()));
        s.wait_run(reply["run_id"].as_str().unwrap(), "completed");
        let printed = std::process::Command::new(env!("CARGO_BIN_EXE_broca"))
            .args(["session", s.project_root(), &s.harness, &s.id])
            .env("BROCA_STATE_ROOT", h.state_root())
            .output()
            .unwrap();
        let printed: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
        assert_eq!(printed["wal"], json!(s.wal_path()), "{printed}");
        assert!(s.wal_path().exists(), "{}", s.wal_path().display());
        let page = s.ok("session.read", json!({}));
        assert_eq!(page["messages"].as_array().map(Vec::len), Some(2), "one turn per session: {page}");
        wals.push(s.wal_path());
    }
    wals.sort();
    wals.dedup();
    assert_eq!(wals.len(), sessions.len(), "four distinct sessions");
    assert_eq!(sessions[0].project_root(), a.to_str().unwrap());
    let again = h.connect().session(HARNESS, "rooted");
    assert_eq!(again.ok("session.read", json!({}))["messages"], sessions[2].ok("session.read", json!({}))["messages"]);
    assert!(h.broca_pid().is_some(), "broca runs as this process's child");
}

#[test]
fn driver_surface() {
    // Its scenarios kill broca four times (more than the daemon's default crash budget).
    let restart = json!({"max_restarts": 20, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 200});
    let h = Harness::start_with(support::Options { restart: Some(restart), ..support::Options::default() });
    for (name, scenario) in SCENARIOS {
        eprintln!("scenario: {name}");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| scenario(&h))) {
            eprintln!("scenario failed: {name}");
            resume_unwind(panic);
        }
    }
    h.stop();
    let exit = h.last_exit().unwrap_or_else(|| panic!("no exit of broca in the journal: {:?}", h.journal()));
    assert_eq!(exit["exit_code"], 0, "{exit}\nbroca's log:\n{}", h.broca_log());
    assert_eq!(exit["disposition"], "daemon_shutdown", "{exit}");
}

/// A send with `retention` lives in `wal-ephemeral/`; once idle for its retention the real
/// binary's sweep deletes it (WAL and store rows), every read answers `expired` with its last
/// activity plus retention, and a later send starts a fresh record at history version 1.
fn retention_expires_and_deletes(h: &Harness) {
    let s = h.session(HARNESS, &h.unique("retained"), None);
    let a = s.ok("session.send", with(keyed("retained secret", "r-1"), "retention", json!(1)));
    let run_id = a["run_id"].as_str().unwrap().to_owned();
    s.wait_run(&run_id, "completed");
    let wal = s.wal_path();
    assert!(wal.starts_with(h.state_root().join("wal-ephemeral")), "{}", wal.display());
    let head = s.ok("session.head", json!({}));
    let expired_at = head["updated_at"].as_u64().expect("a retained head has its activity") + 1000;
    let deadline = Instant::now() + Duration::from_secs(10);
    while wal.exists() {
        assert!(Instant::now() < deadline, "the expired session was not deleted");
        std::thread::sleep(Duration::from_millis(50));
    }
    for (method, params) in
        [("session.read", json!({})), ("session.head", json!({})), ("run.result", json!({"run_id": run_id}))]
    {
        let (code, body) = s.refused(method, params);
        assert_eq!((code.as_str(), &body["detail"]["expired_at_ms"]), ("expired", &json!(expired_at)), "{method}");
    }
    s.wait_run(s.ok("session.send", keyed("fresh", "r-2"))["run_id"].as_str().unwrap(), "completed");
    let page = s.ok("session.read", json!({}));
    assert_eq!(page["history_version"], json!(2));
    assert!(!page.to_string().contains("retained secret"), "expired content came back: {page}");
}

/// Issue #34, through the real daemon: a malformed `tools` list on a session's first send is
/// refused by name and leaves no file under the state root's WAL trees; the session still
/// reads as never written (`incarnation: "log-1"`), and a good send afterwards starts it.
fn a_refused_first_send_leaves_no_file(h: &Harness) {
    let wal_files = || -> Vec<String> {
        let mut found = Vec::new();
        for tree in ["wal", "wal-durable", "wal-ephemeral", "wal-archive"] {
            if let Ok(entries) = std::fs::read_dir(h.state_root().join(tree)) {
                found.extend(entries.flatten().map(|e| format!("{tree}/{}", e.file_name().to_string_lossy())));
            }
        }
        found
    };
    let before = wal_files();
    let malformed = [json!(5), json!([5]), json!([{"name": ""}]), json!([{"name": "t", "reply": {"max_ms": 0}}])];
    for (i, tools) in malformed.iter().enumerate() {
        let session = h.session(HARNESS, &format!("nofile-tools-{i}"), None);
        let mut params = send_params("hi");
        params["tools"] = tools.clone();
        let (code, body) = session.refused("session.send", params);
        assert_eq!(code, "invalid_params", "{body}");
        assert!(body["detail"]["field"].as_str().is_some_and(|f| f.starts_with("tools")), "{body}");
        assert_eq!(wal_files(), before, "a refused send with tools {tools} left a file");
        assert!(!session.wal_path().exists());
        let head = session.ok("session.head", json!({}));
        assert_eq!(head["incarnation"], "log-1", "{head}");
        let read = session.ok("session.read", json!({}));
        assert_eq!(read["messages"], json!([]), "{read}");
    }
    let session = h.session(HARNESS, "nofile-tools-0", None);
    let admitted = session.send("now well formed");
    session.wait_run(admitted["run_id"].as_str().unwrap(), "completed");
    assert!(session.wal_path().exists(), "the admitted send created the session's WAL");
    assert_ne!(session.ok("session.head", json!({}))["incarnation"], "log-1");
}
