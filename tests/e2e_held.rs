//! Provider-held calls end to end (spec §19; tool-provider §8): the real subc daemon supervises
//! broca (debug build, held replies declared by `BROCA_TEST_DECLARE_HELD_REPLY_V1=1`, late
//! results pulled every 100 ms) and broca-mock as a `late_results` tool provider whose `approve`
//! tool holds every call; the harness's MockServer plays the model. A held call is released from
//! outside by a control file in the provider's late-results directory, and every count is read
//! at the provider (its call log and its entry log), outside broca.
//!
//! Held calls under retention (spec §19, issue #47): a retained session's deletion waits for its
//! held calls to settle, then takes its lineage's intake rows and leaves the module's feed; a
//! later entry for it is an acked no-op and no `tool.withdraw` is sent. Boot prunes a tombstoned
//! lineage from the intake without opening it; an unreadable intake store keeps an expired
//! session and counts it in `health.check`'s `retention.unreadable_sessions` (pinned); a held run
//! resumes after both `late-results.db` and `run-index.db` were lost, because the rebuild scans
//! the WALs, and the rebuild marker then keeps retention fenced. These run after the others: the
//! last ones leave the state root with the rebuild marker set.
//!
//! Then a kill campaign (`held_kill_campaign`): sessions with held calls while broca is
//! SIGKILLed at every held fail point (after a call's registration, after its held record,
//! before and after a late result's delivery) and at random moments, with releases at random
//! times. Afterwards every late result was delivered exactly once, none was lost, no call ran
//! twice at the provider, and every run is terminal. `BROCA_HELD_KILLS` sizes it (default 10 rounds,
//! every point armed once, in `make test`; `make soak` runs 200).

use broca_mock::mock;
use broca_mock::tools::call_log;
mod pin;
mod support;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broca::limits;
use serde_json::{json, Value};
use support::{Harness, Options, Session};

const HARNESS: &str = "held-e2e";
const TOOLS: &str = "mock-tools";
/// How long a scenario waits for a state broca reaches by itself.
const WAIT: Duration = Duration::from_secs(20);

/// The provider's files, outside broca's state root.
struct Provider {
    late: PathBuf,
    log: PathBuf,
}

impl Provider {
    /// The held calls the provider recorded: `call_key → held record`.
    fn held(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for entry in fs::read_dir(self.late.join("held")).into_iter().flatten().flatten() {
            if let Ok(v) = fs::read(entry.path()).map(|b| serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null)) {
                if let Some(key) = v["call_key"].as_str() {
                    out.insert(key.to_owned(), v);
                }
            }
        }
        out
    }

    /// The held call whose arguments carry `tag`, once the provider holds it.
    fn wait_held(&self, tag: &str) -> String {
        let until = Instant::now() + WAIT;
        loop {
            if let Some((key, _)) = self.held().into_iter().find(|(_, v)| v["arguments"]["tag"] == tag) {
                return key;
            }
            assert!(Instant::now() < until, "the provider never held the call tagged {tag}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Releases the held call `call_key` with `body` (written whole: temp file, then rename).
    fn release(&self, call_key: &str, body: Value) {
        let dir = self.late.join("release");
        fs::create_dir_all(&dir).unwrap();
        let stem: String = call_key.bytes().map(|b| format!("{b:02x}")).collect();
        let tmp = dir.join(format!("{stem}.json.tmp"));
        fs::write(&tmp, body.to_string()).unwrap();
        fs::rename(&tmp, dir.join(format!("{stem}.json"))).unwrap();
    }

    /// The provider's late-result entries, in order (`log.jsonl`).
    fn entries(&self) -> Vec<Value> {
        let text = fs::read_to_string(self.late.join("log.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).map(|l| l["entry"].clone()).collect()
    }

    /// The highest acked entry sequence of every custodian.
    fn acked(&self) -> u64 {
        let v: Value = fs::read(self.late.join("acked.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        v.as_object().map_or(0, |m| m.values().filter_map(Value::as_u64).max().unwrap_or(0))
    }

    /// How many times the provider ran a call of `tool` whose arguments carry `tag`.
    fn runs(&self, tool: &str, tag: &str) -> usize {
        let counts = call_log::read(&self.log).unwrap_or_else(|e| panic!("the call log: {e:?}"));
        counts.calls_to(tool).filter(|c| c.arguments["tag"] == tag).count()
    }
}

fn tools_script(late: &Path) -> Value {
    json!({
        "builtins": true,
        "late_results": true,
        "late_results_dir": late,
        "tools": [{
            "name": "approve",
            "description": "Asks a person to approve; answers once they did.",
            "input_schema": {"type": "object"},
            "result_format": "tool-result/v1",
            "behaviour": {"held": {"reason": "consent", "text": "waiting for a person"}},
        }],
    })
}

fn plan_send(prompt: &str) -> Value {
    let mut p = support::send_params(prompt);
    p["plan"] = json!({"tool_items": [{"provider": TOOLS, "params": {}}]});
    p
}

/// [`plan_send`] under `send_id`, the logical send's key: a send racing a kill is asked about
/// (`send.status`) and re-sent under the same key, never under a new one.
fn keyed_plan_send(prompt: &str, send_id: &str) -> Value {
    let mut p = plan_send(prompt);
    p["send_id"] = json!(send_id);
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

fn run_id(reply: &Value) -> String {
    reply["run_id"].as_str().unwrap_or_else(|| panic!("no run id in {reply}")).to_string()
}

/// Polls `run.status` until `ready` holds (at most [`WAIT`]); the last status.
fn wait_status(s: &Session, run: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + WAIT;
    loop {
        let status = s.ok("run.status", json!({"run_id": run}));
        if ready(&status) {
            return status;
        }
        assert!(Instant::now() < until, "run {run} never {what}: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_held_pause(s: &Session, run: &str) -> Value {
    wait_status(s, run, "paused on a held call", |st| st["state"] == "paused" && st["held_calls"].is_array())
}

/// The results of the session's last tool message, `(tool_call_id, output)` in order.
fn tool_results(s: &Session) -> Vec<(String, Value)> {
    let msgs = s.ok("session.read", json!({"limit": 1000}))["messages"].as_array().cloned().unwrap_or_default();
    let tool = msgs.iter().rev().find(|m| m["message"]["role"] == "tool").expect("a tool message");
    tool["message"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["tool_call_id"].as_str().unwrap().to_string(), p["output"].clone()))
        .collect()
}

/// The session's WAL records, through `broca inspect`.
fn records(s: &Session) -> Vec<Value> {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_broca")).arg("inspect").arg(s.wal_path()).output().unwrap();
    assert!(out.status.success(), "broca inspect: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone())
        .collect()
}

fn count_kind(records: &[Value], kind: &str) -> usize {
    records.iter().filter(|r| r.get(kind).is_some()).count()
}

type Scenario = (&'static str, fn(&Harness, &Provider));

const SCENARIOS: &[Scenario] = &[
    ("a held call pauses its run; its late result resumes it, exactly once", late_result_resumes),
    ("not_started and expired late entries become pinned error results", not_started_and_expired),
    ("a mixed batch pauses only once the synchronous call answered", mixed_batch),
    ("a cancel ends a held run; its late result is then a no-op", cancel_while_held),
    ("a held run survives broca's SIGKILL and takes its late result after", restart_while_held),
    ("a provider restart re-reads its feed from the start under a new incarnation", provider_restart),
    ("retention deletes a held session once its calls settled, with its intake rows", retention_takes_the_intake_rows),
    ("boot prunes a tombstoned lineage from the intake without opening it", boot_prunes_a_tombstoned_lineage),
    ("an unreadable intake store keeps an expired session and counts it in health", unreadable_intake_fences_retention),
    ("a held run resumes after both databases were lost: the rebuild scans the WALs", rebuild_scans_the_wals),
];

fn late_result_resumes(h: &Harness, p: &Provider) {
    let s = h.session(HARNESS, &h.unique("resume"), None);
    let describe = s.ok("role.describe", json!({}));
    assert!(describe["capabilities"].as_array().unwrap().iter().any(|g| g == "held_calls"), "{describe}");
    let tag = h.unique("approve");
    h.install(
        json!({"responses": [call_step(&[("c1", "approve", json!({"tag": tag}))]), text_step("approved, done")]}),
    );
    let mut sub = s.subscribe(json!("start"));
    let run = run_id(&s.ok("session.send", plan_send("please approve")));
    let key = p.wait_held(&tag);
    let status = wait_held_pause(&s, &run);
    let held = &status["held_calls"][0];
    assert_eq!(status["held_calls"].as_array().unwrap().len(), 1, "{status}");
    assert_eq!((held["call_key"].as_str(), held["tool"].as_str()), (Some(key.as_str()), Some("approve")), "{status}");
    assert_eq!((held["provider"].as_str(), held["reason"].as_str()), (Some(TOOLS), Some("consent")), "{status}");
    assert!(held["held_at_ms"].as_u64().is_some_and(|t| t > 0), "{status}");
    assert_eq!(status["reason"], "tool_held", "{status}");
    pin::assert_golden("run_status.tool_held.json", &status.to_string(), None);
    // The model saw nothing of the interim reply: one request so far.
    let requests_before = h.mock.requests("default").len();
    p.release(&key, json!({"kind": "result", "text": format!("approved by a person ({tag})")}));
    let done = s.wait_run(&run, "completed");
    assert!(done.get("held_calls").is_none(), "a finished run lists no held call: {done}");
    let requests = h.mock.requests("default");
    assert_eq!(requests.len(), requests_before + 1, "one more model request, after the late result");
    let last = String::from_utf8_lossy(&requests.last().unwrap().body).to_string();
    assert!(last.contains(&format!("approved by a person ({tag})")), "the late result reached the model: {last}");
    assert!(!last.contains("waiting for a person"), "the interim content never reaches the model");
    assert_eq!(p.runs("approve", &tag), 1, "the provider ran the call once");
    let results = tool_results(&s);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].1["text"], format!("approved by a person ({tag})"), "{results:?}");
    let recs = records(&s);
    assert_eq!(count_kind(&recs, "tool_call_provider_held"), 1);
    assert_eq!(count_kind(&recs, "tool_result"), 1, "exactly one result for the call");
    // The stream: a status event and the pause list the held call; nothing lists it after.
    let mut units = Vec::new();
    sub.until_finished(&run, &mut units);
    let listed: Vec<&Value> = units.iter().filter(|e| e.get("held_calls").is_some()).collect();
    let kinds: Vec<&str> = listed.iter().map(|e| e["unit"]["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["call_held", "run_paused"], "{listed:?}");
    assert_eq!(listed[1]["held_calls"], status["held_calls"], "the event lists what run.status lists");
    // The entry was acked at the provider once the result was durable.
    let entries = p.entries();
    let seq = entries.iter().position(|e| e["call_key"] == key.as_str()).unwrap() as u64 + 1;
    let until = Instant::now() + WAIT;
    while p.acked() < seq {
        assert!(Instant::now() < until, "the entry was never acked");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn not_started_and_expired(h: &Harness, p: &Provider) {
    for (kind, golden) in [("not_started", "held_result.not_started.json"), ("expired", "held_result.expired.json")] {
        let s = h.session(HARNESS, &h.unique(kind), None);
        let tag = h.unique(kind);
        h.install(json!({"responses": [call_step(&[("c1", "approve", json!({"tag": tag}))]), text_step("ok")]}));
        let run = run_id(&s.ok("session.send", plan_send("approve")));
        let key = p.wait_held(&tag);
        wait_held_pause(&s, &run);
        let body = if kind == "not_started" {
            json!({"kind": "not_started", "reason": "restart_before_dispatch"})
        } else {
            json!({"kind": "expired"})
        };
        p.release(&key, body);
        s.wait_run(&run, "completed");
        let results = tool_results(&s);
        pin::assert_golden(golden, &results[0].1.to_string(), None);
    }
}

fn mixed_batch(h: &Harness, p: &Provider) {
    let s = h.session(HARNESS, &h.unique("mixed"), None);
    let tag = h.unique("mixed");
    let echo = json!({"tag": tag, "n": 1});
    h.install(json!({"responses": [
        call_step(&[("c1", "approve", json!({"tag": tag})), ("c2", "echo", echo.clone())]),
        text_step("both done"),
    ]}));
    let run = run_id(&s.ok("session.send", plan_send("mixed")));
    let key = p.wait_held(&tag);
    wait_held_pause(&s, &run);
    let recs = records(&s);
    assert_eq!(count_kind(&recs, "tool_result"), 1, "the echo's result is durable before the pause");
    p.release(&key, json!({"kind": "result", "text": "approved"}));
    s.wait_run(&run, "completed");
    let results = tool_results(&s);
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2"], "results in planned order, whatever order they came in");
    assert_eq!(results[0].1["text"], "approved");
    assert_eq!(results[1].1["json"], echo);
}

fn cancel_while_held(h: &Harness, p: &Provider) {
    // broca pulls a provider's feed only while a call to it is registered (src/held/puller.rs),
    // and the cancel settles this call's registration: without another held call the puller may
    // stop before the late result below is written, and nothing would ever take (ack) it. A
    // second session's held call keeps the feed pulled until the no-op was acked.
    let keeper = h.session(HARNESS, &h.unique("keeper"), None);
    let keeper_tag = h.unique("keeper");
    let s = h.session(HARNESS, &h.unique("cancel"), None);
    let tag = h.unique("cancel");
    // One FIFO: the keeper's call, this session's call, then the keeper's answer.
    h.install(json!({"responses": [
        call_step(&[("k1", "approve", json!({"tag": keeper_tag}))]),
        call_step(&[("c1", "approve", json!({"tag": tag}))]),
        text_step("kept"),
    ]}));
    let keeper_run = run_id(&keeper.ok("session.send", plan_send("hold the feed open")));
    let keeper_key = p.wait_held(&keeper_tag);
    wait_held_pause(&keeper, &keeper_run);
    let run = run_id(&s.ok("session.send", plan_send("approve then cancel")));
    let key = p.wait_held(&tag);
    wait_held_pause(&s, &run);
    assert_eq!(s.ok("run.cancel", json!({"run_id": run})), json!("ack"));
    let done = s.wait_run(&run, "cancelled");
    assert!(done.get("held_calls").is_none(), "{done}");
    let results = tool_results(&s);
    pin::assert_golden("held_result.cancelled.json", &results[0].1.to_string(), None);
    let wal = fs::metadata(s.wal_path()).unwrap().len();
    // The late result still comes; it is acked as a no-op and writes nothing.
    p.release(&key, json!({"kind": "result", "text": "too late"}));
    let seq = {
        let until = Instant::now() + WAIT;
        loop {
            if let Some(i) = p.entries().iter().position(|e| e["call_key"] == key.as_str()) {
                break i as u64 + 1;
            }
            assert!(Instant::now() < until, "the release never became an entry");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let until = Instant::now() + WAIT;
    while p.acked() < seq {
        assert!(Instant::now() < until, "the no-op entry was never acked");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::metadata(s.wal_path()).unwrap().len(), wal, "a late result for a cancelled run writes nothing");
    p.release(&keeper_key, json!({"kind": "result", "text": "kept long enough"}));
    keeper.wait_run(&keeper_run, "completed");
}

fn restart_while_held(h: &Harness, p: &Provider) {
    let s = h.session(HARNESS, &h.unique("restart"), None);
    let tag = h.unique("restart");
    h.install(json!({"responses": [call_step(&[("c1", "approve", json!({"tag": tag}))]), text_step("after restart")]}));
    let run = run_id(&s.ok("session.send", plan_send("approve across a restart")));
    let key = p.wait_held(&tag);
    wait_held_pause(&s, &run);
    let old = h.kill_broca();
    // Released while broca is down: the entry waits at the provider.
    p.release(&key, json!({"kind": "result", "text": "approved while broca was down"}));
    h.wait_respawn(old);
    s.wait_run(&run, "completed");
    assert_eq!(p.runs("approve", &tag), 1, "never sent again");
    let recs = records(&s);
    assert_eq!(count_kind(&recs, "tool_result"), 1, "delivered exactly once");
    assert_eq!(tool_results(&s)[0].1["text"], "approved while broca was down");
}

fn provider_restart(h: &Harness, p: &Provider) {
    let s = h.session(HARNESS, &h.unique("provider"), None);
    let tag = h.unique("provider");
    h.install(json!({"responses": [call_step(&[("c1", "approve", json!({"tag": tag}))]), text_step("done")]}));
    let run = run_id(&s.ok("session.send", plan_send("approve across a provider restart")));
    let key = p.wait_held(&tag);
    wait_held_pause(&s, &run);
    let pid = provider_pid(&p.log).expect("the provider's pid");
    // SAFETY: killing the tool-provider module process the daemon started for this test.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    p.release(&key, json!({"kind": "result", "text": "approved after the provider restarted"}));
    s.wait_run(&run, "completed");
    assert_eq!(tool_results(&s)[0].1["text"], "approved after the provider restarted");
    assert_eq!(count_kind(&records(&s), "tool_result"), 1);
}

/// `late-results.db` under broca's state root, read-only (broca writes it meanwhile).
fn intake_db(h: &Harness) -> rusqlite::Connection {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(h.state_root().join("late-results.db"), flags).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// The intake's rows of `lineage` (its address): `(registrations, receipts)`, a receipt counted
/// by its lineage or by a call key of the lineage (`<lineage>:<seq>`).
fn intake_rows(h: &Harness, lineage: &str) -> (i64, i64) {
    let conn = intake_db(h);
    let count = |sql: &str| conn.query_row(sql, [lineage], |r| r.get::<_, i64>(0)).unwrap();
    (
        count("SELECT count(*) FROM registrations WHERE lineage = ?1"),
        count("SELECT count(*) FROM receipts WHERE lineage = ?1 OR substr(call_key, 1, length(?1) + 1) = ?1 || ':'"),
    )
}

/// `module`'s feed row (its cursor as last acked), if the intake has one.
fn feed_row(h: &Harness, module: &str) -> Option<(String, i64)> {
    use rusqlite::OptionalExtension;
    intake_db(h)
        .query_row("SELECT incarnation, seq FROM feeds WHERE module = ?1", [module], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .unwrap()
}

/// broca's `health.check` metrics, through the daemon's supervisor probe.
fn health(h: &Harness) -> Value {
    let probe = h.block_on(h.client().consumer().supervisor_health_probe(support::MODULE_ID)).unwrap();
    probe.metrics.expect("health metrics")
}

/// Waits until `done` holds (at most [`WAIT`]).
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < until, "{what} did not happen within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The seq of `call_key`'s entry in the provider's log, once it is there.
fn entry_seq(p: &Provider, call_key: &str) -> u64 {
    let until = Instant::now() + WAIT;
    loop {
        if let Some(i) = p.entries().iter().position(|e| e["call_key"] == call_key) {
            return i as u64 + 1;
        }
        assert!(Instant::now() < until, "the release of {call_key} never became an entry");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plan send whose session is kept one second after its last activity.
fn retained_plan_send(prompt: &str) -> Value {
    let mut p = plan_send(prompt);
    p["retention"] = json!(1);
    p
}

/// A keeper session's held call, so the provider's feed stays pulled while another session has
/// none registered (broca pulls a module only while a call to it is registered). The model's
/// script is one FIFO: the keeper's answer after its release is installed by the caller.
fn hold_the_feed(h: &Harness, p: &Provider) -> (Session, String, String) {
    let keeper = h.session(HARNESS, &h.unique("keeper"), None);
    let tag = h.unique("keeper");
    h.install(json!({"responses": [call_step(&[("k1", "approve", json!({"tag": tag}))])]}));
    let run = run_id(&keeper.ok("session.send", plan_send("hold the feed open")));
    let key = p.wait_held(&tag);
    wait_held_pause(&keeper, &run);
    (keeper, run, key)
}

/// H-30, H-31, H-33 (spec §19): a retained session with two held calls is not deleted while
/// paused; one late result is delivered (its receipt taken), the run is cancelled (the other
/// call's registration settles), and once idle past its retention the session is deleted with
/// every intake row of its lineage, while the module's feed row stays. The other call's late
/// entry then comes for a deleted lineage: acked as a no-op, nothing written, no row left, and
/// broca never sent `tool.withdraw`.
fn retention_takes_the_intake_rows(h: &Harness, p: &Provider) {
    let (keeper, keeper_run, keeper_key) = hold_the_feed(h, p);
    let s = h.session(HARNESS, &h.unique("retained"), None);
    let lineage = s.key().addr();
    let (t1, t2) = (h.unique("first"), h.unique("second"));
    h.install(json!({"responses": [call_step(&[("c1", "approve", json!({"tag": t1})), ("c2", "approve", json!({"tag": t2}))])]}));
    let run = run_id(&s.ok("session.send", retained_plan_send("two approvals, kept a second")));
    let (k1, k2) = (p.wait_held(&t1), p.wait_held(&t2));
    wait_held_pause(&s, &run);
    let wal = s.wal_path();
    assert!(wal.starts_with(h.state_root().join("wal-ephemeral")), "{}", wal.display());
    assert_eq!(intake_rows(h, &lineage), (2, 0), "both calls are registered");
    p.release(&k1, json!({"kind": "result", "text": "the first, approved"}));
    wait_until("the first late result's delivery", || intake_rows(h, &lineage) == (1, 1));
    // Paused on the second call well past its retention: kept (a paused run never expires).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(wal.exists(), "a session paused on a held call was deleted");
    assert_eq!(s.ok("run.cancel", json!({"run_id": run})), json!("ack"));
    s.wait_run(&run, "cancelled");
    wait_until("the expired session's deletion", || !wal.exists());
    assert_eq!(intake_rows(h, &lineage), (0, 0), "the deletion left intake rows of its lineage behind");
    let feed = feed_row(h, TOOLS).expect("the module's feed row survives the deletion");
    // The second call's entry, for a lineage that is gone: acked as a no-op, nothing written.
    p.release(&k2, json!({"kind": "result", "text": "too late"}));
    let seq = entry_seq(p, &k2);
    wait_until("the no-op entry's ack", || p.acked() >= seq);
    assert!(!wal.exists(), "a late entry recreated the deleted session");
    assert_eq!(s.refused("session.head", json!({})).0, "expired");
    assert_eq!(intake_rows(h, &lineage), (0, 0), "the no-op entry left a row");
    // broca saves its cursor once the provider took the ack.
    wait_until("the cursor moving past the no-op", || feed_row(h, TOOLS).is_some_and(|c| c.1 >= seq as i64));
    assert_eq!(feed_row(h, TOOLS).unwrap().0, feed.0, "the same feed row, moved on");
    let counts = call_log::read(&p.log).unwrap();
    assert_eq!(counts.role_ops.get("tool.withdraw"), None, "deletion sends no tool.withdraw");
    h.install(json!({"responses": [text_step("kept")]}));
    p.release(&keeper_key, json!({"kind": "result", "text": "kept long enough"}));
    keeper.wait_run(&keeper_run, "completed");
}

/// H-25: rows of a tombstoned lineage (what an older build or a cut deletion left) are pruned at
/// boot without opening an actor for it; nothing of the session comes back.
fn boot_prunes_a_tombstoned_lineage(h: &Harness, _p: &Provider) {
    let s = h.session(HARNESS, &h.unique("tombstoned"), None);
    h.install(json!({"responses": [text_step("kept a second")]}));
    let mut send = support::send_params("kept a second");
    send["retention"] = json!(1);
    s.wait_run(&run_id(&s.ok("session.send", send)), "completed");
    let wal = s.wal_path();
    wait_until("the expired session's deletion", || !wal.exists());
    let (key, lineage) = (s.key(), s.key().addr());
    let old = h.kill_broca();
    {
        let conn = rusqlite::Connection::open(h.state_root().join("late-results.db")).unwrap();
        conn.execute(
            "INSERT INTO registrations (call_key, lineage, project_root, harness, session, run_id, tool_call_id, module, registered_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'run-gone', 'c1', ?6, 1)",
            rusqlite::params![format!("{lineage}:9"), lineage, key.project_root, key.harness, key.session, TOOLS],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO receipts (provider, custodian, call_key, event_id, lineage) VALUES (?1, 'reserved:broca', ?2, 'e-gone', ?3)",
            rusqlite::params![TOOLS, format!("{lineage}:7"), lineage],
        )
        .unwrap();
    }
    // Boot opens every other session still registered (H-26), and only those.
    let others: i64 = {
        let conn = intake_db(h);
        let sql = "SELECT count(DISTINCT lineage) FROM registrations WHERE lineage <> ?1";
        conn.query_row(sql, [&lineage], |r| r.get(0)).unwrap()
    };
    h.wait_respawn(old);
    let opens = || health(h)["actor_opens"].as_i64().unwrap();
    wait_until("boot opening the registered sessions", || opens() >= others);
    // The registration goes either way (a puller finds its session has no WAL): by then boot
    // has decided whether to open the session.
    wait_until("the tombstoned lineage's registration leaving", || intake_rows(h, &lineage).0 == 0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(opens(), others, "boot opened an actor for a tombstoned lineage");
    assert_eq!(intake_rows(h, &lineage), (0, 0), "the tombstoned lineage's receipt was not pruned");
    assert!(!wal.exists());
    assert_eq!(s.refused("session.head", json!({})).0, "expired");
}

/// H-34: an intake store that cannot be read keeps an expired session (its reads answer
/// `expired`) and counts it in `health.check`'s `retention.unreadable_sessions` (pinned). Put
/// back by a restart (the store recreated over held history, the rebuild marker set), the
/// session stays fenced (H-37) and the total falls back to 0.
fn unreadable_intake_fences_retention(h: &Harness, _p: &Provider) {
    let db = h.state_root().join("late-results.db");
    // Replaced under the running broca (whose intake connection keeps the old file), with the
    // old store's write-ahead log and index gone too: a log left beside the garbage can still
    // hold a valid first page, which SQLite would read over the garbage's header.
    let garbage = h.state_root().join("late-results.db.garbage");
    fs::write(&garbage, b"this is not an SQLite database, and never was one").unwrap();
    for suffix in ["-wal", "-shm"] {
        let _ = fs::remove_file(h.state_root().join(format!("late-results.db{suffix}")));
    }
    fs::rename(&garbage, &db).unwrap();
    let s = h.session(HARNESS, &h.unique("fenced"), None);
    h.install(json!({"responses": [text_step("kept a second")]}));
    let mut send = support::send_params("kept a second");
    send["retention"] = json!(1);
    let run = run_id(&s.ok("session.send", send));
    s.wait_run(&run, "completed");
    let wal = s.wal_path();
    wait_until("the unreadable store's count", || health(h)["retention"]["unreadable_sessions"] == json!(1));
    std::thread::sleep(Duration::from_millis(limits::RETENTION_DELETE_WITHIN_MS));
    assert!(wal.exists(), "an expired session was deleted under an unreadable intake store");
    assert_eq!(s.refused("session.read", json!({})).0, "expired");
    pin::assert_golden("health.retention_unreadable.json", &health(h)["retention"].to_string(), None);
    let old = h.kill_broca();
    for suffix in ["", "-wal", "-shm"] {
        let _ = fs::remove_file(h.state_root().join(format!("late-results.db{suffix}")));
    }
    h.wait_respawn(old);
    wait_until("the total falls back", || health(h)["retention"]["unreadable_sessions"] == json!(0));
    assert!(h.state_root().join("late-results-rebuild-required").exists(), "the store was recreated over history");
    std::thread::sleep(Duration::from_millis(limits::RETENTION_DELETE_WITHIN_MS));
    assert!(wal.exists(), "the rebuild marker must keep retention fenced");
    let (code, body) = s.refused("session.send", support::send_params("revive it"));
    assert_eq!((code.as_str(), &body["detail"]["fence"]), ("open_failed", &json!("late_results_rebuild_required")));
}

/// H-27: broca is killed while a run is paused on a held call, and both `late-results.db` and
/// `run-index.db` are lost; the call is released meanwhile. At boot the rebuild finds the call by
/// scanning the live WALs (decoding only those holding a provider-held frame), registers it
/// under the session its held record names, and the run takes its late result, once.
fn rebuild_scans_the_wals(h: &Harness, p: &Provider) {
    let s = h.session(HARNESS, &h.unique("rebuilt"), None);
    let tag = h.unique("rebuilt");
    h.install(
        json!({"responses": [call_step(&[("c1", "approve", json!({"tag": tag}))]), text_step("after the rebuild")]}),
    );
    let run = run_id(&s.ok("session.send", plan_send("approve across a lost intake")));
    let key = p.wait_held(&tag);
    wait_held_pause(&s, &run);
    let old = h.kill_broca();
    for db in ["late-results.db", "run-index.db"] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = fs::remove_file(h.state_root().join(format!("{db}{suffix}")));
        }
    }
    p.release(&key, json!({"kind": "result", "text": "approved while both databases were lost"}));
    let log_before = h.broca_log().len();
    h.wait_respawn(old);
    s.wait_run(&run, "completed");
    assert_eq!(p.runs("approve", &tag), 1, "never sent again");
    assert_eq!(count_kind(&records(&s), "tool_result"), 1, "delivered exactly once");
    assert_eq!(tool_results(&s)[0].1["text"], "approved while both databases were lost");
    let log = h.broca_log()[log_before..].to_owned();
    let line =
        log.lines().find(|l| l.contains("the intake was rebuilt from the live WALs")).expect("the rebuild's log line");
    let number = |after: &str| -> usize {
        let at = line.find(after).unwrap_or_else(|| panic!("{after:?} in {line}"));
        line[..at].trim_end().rsplit(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let (wals, decoded) = (number(" WAL(s)"), number(" holding a provider-held frame"));
    assert!(decoded >= 1 && decoded < wals, "only WALs with a held frame are decoded: {line}");
    assert!(h.state_root().join("late-results-rebuild-required").exists());
}

/// The pid of the broca-mock module writing `log` (its path is on its command line).
fn provider_pid(log: &Path) -> Option<i32> {
    let marker = log.display().to_string();
    fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = String::from_utf8_lossy(&fs::read(e.path().join("cmdline")).ok()?).replace('\0', " ");
        cmdline.contains(&marker).then_some(pid)
    })
}

/// The launcher the daemon starts in broca's place: this incarnation's fail points (taken once
/// from `next-failpoints`), then broca itself, same pid.
fn write_launcher(dir: &Path, broca: &Path) -> PathBuf {
    let script = format!(
        "#!/bin/sh\n\
         spec=''\n\
         if [ -f '{d}/next-failpoints' ]; then spec=$(cat '{d}/next-failpoints'); rm -f '{d}/next-failpoints'; fi\n\
         echo \"$$ ${{spec:-none}}\" >> '{d}/spawns.log'\n\
         if [ -n \"$spec\" ]; then BROCA_FAILPOINTS=\"$spec\"; export BROCA_FAILPOINTS; fi\n\
         exec '{b}' \"$@\"\n",
        d = dir.display(),
        b = broca.display()
    );
    let path = dir.join("launch-broca.sh");
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    path
}

fn arm_next(dir: &Path, spec: &str) {
    let tmp = dir.join("next-failpoints.tmp");
    fs::write(&tmp, spec).unwrap();
    fs::rename(&tmp, dir.join("next-failpoints")).unwrap();
}

/// The fail points the campaign kills at, in turn (`src/failpoint.rs`).
const POINTS: &[&str] =
    &["held.after_register", "held.after_record", "held.before_deliver", "held.after_deliver", "tool.after_reply"];

/// A small deterministic generator (the campaign's choices replay from its seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// broca's pid, once the daemon runs it (it may be respawning after a kill).
fn running_pid(h: &Harness) -> i32 {
    let until = Instant::now() + WAIT;
    loop {
        if let Some(pid) = h.broca_pid() {
            return pid;
        }
        assert!(Instant::now() < until, "broca did not run again within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Releases every call the provider holds that has no entry yet.
fn release_all(p: &Provider, rng: &mut Rng) {
    let entered: Vec<String> = p.entries().iter().filter_map(|e| e["call_key"].as_str().map(String::from)).collect();
    for (key, held) in p.held() {
        if !entered.contains(&key) {
            std::thread::sleep(Duration::from_millis(rng.next() % 50));
            let tag = held["arguments"]["tag"].as_str().unwrap_or_default().to_owned();
            p.release(&key, json!({"kind": "result", "text": format!("released {tag}")}));
        }
    }
}

/// One campaign round: sessions each asking for one held call while broca is armed to die at
/// `point` (or killed at random moments), releases at random times. The model's script is one
/// FIFO, so a resumed run may take another session's step: every check reads each session's own
/// WAL, never the order the steps were scripted in.
fn campaign_round(h: &Harness, p: &Provider, dir: &Path, rng: &mut Rng, point: Option<&str>) -> Vec<(Session, String)> {
    const SESSIONS: usize = 3;
    let old = running_pid(h);
    if let Some(point) = point {
        arm_next(dir, point);
        // The armed spec is taken by the next incarnation: start it now.
        h.kill_broca();
        h.wait_respawn(old);
    }
    let mut out = Vec::new();
    for _ in 0..SESSIONS {
        let tag = h.unique("kill");
        let s = h.session(HARNESS, &h.unique("kill-s"), None);
        h.install_alone(json!({"responses": [call_step(&[("c1", "approve", json!({"tag": tag}))])]}));
        // broca may be dying at the armed point (an earlier session's held call) or respawning.
        let run = run_id(&s.send_surviving_kills(keyed_plan_send(&format!("approve {tag}"), &format!("send-{tag}"))));
        // Until the provider holds it (or broca died before sending it: then no hold).
        let until = Instant::now() + Duration::from_secs(2);
        while !p.held().values().any(|v| v["arguments"]["tag"] == tag.as_str()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if point.is_none() && rng.next().is_multiple_of(3) {
            if let Some(pid) = h.broca_pid() {
                // SAFETY: killing the broca process the daemon started for this harness.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(rng.next() % 200));
        }
        if rng.next().is_multiple_of(2) {
            release_all(p, rng);
        }
        out.push((s, run));
    }
    release_all(p, rng);
    out
}

/// Every session of the campaign: terminal; each call its WAL shows held got exactly one result,
/// its own late result; no call ran twice at the provider.
fn check_campaign(p: &Provider, sessions: &[(Session, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    let counts = call_log::read(&p.log).unwrap_or_else(|e| panic!("the call log: {e:?}"));
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    for c in counts.calls_to("approve") {
        *runs.entry(c.arguments["tag"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    bad.extend(
        runs.iter().filter(|(_, n)| **n > 1).map(|(tag, n)| format!("{tag}: the provider ran the call {n} times")),
    );
    for (s, run) in sessions {
        // Late releases keep arriving: wait for each run to reach a terminal. A late delivery
        // may still hit an armed fail point, so broca may die under these reads too.
        let until = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let status = s.try_call("run.status", json!({"run_id": run})).unwrap_or(Value::Null);
            let state = status["state"].as_str().unwrap_or("");
            if ["completed", "interrupted", "cancelled", "error"].contains(&state) || Instant::now() > until {
                break status;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let state = status["state"].as_str().unwrap_or("").to_owned();
        if !["completed", "interrupted"].contains(&state.as_str()) {
            bad.push(format!("{}: run {run} is {state}: {status}", s.id));
        }
        let recs = records(s);
        if count_kind(&recs, "tool_result") != count_kind(&recs, "tool_dispatch_intent") {
            bad.push(format!("{}: a call without exactly one result", s.id));
        }
        for held in recs.iter().filter_map(|r| r.get("tool_call_provider_held")) {
            // A call is named by its step and id (ids repeat across steps).
            let (id, step) = (&held["tool_call_id"], &held["step"]);
            let same = |r: &&Value| r["tool_call_id"] == *id && r["step"] == *step;
            let intent = recs.iter().filter_map(|r| r.get("tool_dispatch_intent")).find(same);
            let args: Value =
                intent.and_then(|i| serde_json::from_str(i["arguments"].as_str()?).ok()).unwrap_or_default();
            let want = format!("released {}", args["tag"].as_str().unwrap_or_default());
            let results: Vec<&Value> = recs.iter().filter_map(|r| r.get("tool_result")).filter(same).collect();
            // Delivered exactly once; a crash right after the delivery may still interrupt the run.
            if results.len() != 1 || results[0]["output"]["text"] != want.as_str() {
                bad.push(format!("{}: held call {id} has results {results:?}, not its late result once", s.id));
            }
        }
        if bad.last().is_some_and(|b| b.starts_with(s.id.as_str())) {
            let shown: Vec<String> = recs.iter().map(|r| r.to_string().chars().take(300).collect()).collect();
            eprintln!("{}: its records:\n{}", s.id, shown.join("\n"));
        }
    }
    bad
}

#[test]
fn held_calls_end_to_end() {
    let base = tempfile::Builder::new().prefix("bhe").tempdir_in("/tmp").unwrap();
    let late = base.path().join("late");
    let script = base.path().join("tools.json");
    fs::write(&script, tools_script(&late).to_string()).unwrap();
    let log = base.path().join(format!("{TOOLS}.calls.jsonl"));
    let provider = Provider { late, log: log.clone() };
    let mock = broca_mock::exe();
    let tools = json!({"program": mock, "args": ["--tools", script, "--call-log", log, "--call-log-fsync"],
                       "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true,
                       "restart": {"max_restarts": 50, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 200}});
    let broca = PathBuf::from(env!("CARGO_BIN_EXE_broca"));
    let launcher = write_launcher(base.path(), &broca);
    let opts = Options {
        modules: vec![(TOOLS.to_string(), tools)],
        env: vec![
            ("BROCA_TEST_DECLARE_HELD_REPLY_V1".into(), "1".into()),
            ("BROCA_TEST_LATE_POLL_MS".into(), "100".into()),
        ],
        launcher: Some(launcher),
        restart: Some(json!({"max_restarts": 200, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 200})),
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    support::wait_tool_provider(&h, TOOLS);
    let mut failed = Vec::new();
    for (name, scenario) in SCENARIOS {
        let started = Instant::now();
        h.mock.reset("default");
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| scenario(&h, &provider))) {
            eprintln!("scenario {name:?} failed after {:?}\n{}", started.elapsed(), h.broca_log_tail(40));
            failed.push((name, e));
        }
    }
    // The kill campaign, on the same rig.
    let kills: usize = std::env::var("BROCA_HELD_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2 * POINTS.len());
    let seed = std::env::var("BROCA_HELD_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_u64);
    let mut rng = Rng(seed | 1);
    let mut sessions = Vec::new();
    let mut armed = 0;
    for round in 0..kills {
        h.mock.reset("default");
        let point = (round % 2 == 0).then(|| POINTS[(round / 2) % POINTS.len()]);
        armed += usize::from(point.is_some());
        sessions.extend(campaign_round(&h, &provider, base.path(), &mut rng, point));
    }
    let mut bad = check_campaign(&provider, &sessions);
    // Every armed point was reached (its incarnation died there).
    let log = h.broca_log();
    let fired: Vec<&str> = POINTS.iter().copied().filter(|p| log.contains(&format!("failpoint {p} fired"))).collect();
    let armed_points: Vec<&str> = (0..kills).filter(|r| r % 2 == 0).map(|r| POINTS[(r / 2) % POINTS.len()]).collect();
    for point in &armed_points {
        if !fired.contains(point) {
            bad.push(format!("the armed point {point} never fired"));
        }
    }
    let spawned = fs::read_to_string(base.path().join("spawns.log")).unwrap_or_default();
    let calls = provider.held().len();
    println!(
        "HELD-KILLS rounds={kills} armed={armed} fired={} sessions={} held_calls={calls} violations={} seed={seed}",
        fired.len(),
        sessions.len(),
        bad.len()
    );
    if !bad.is_empty() {
        eprintln!("spawns:\n{spawned}\n{}", h.broca_log_tail(80));
    }
    h.stop();
    assert!(bad.is_empty(), "the kill campaign broke an invariant:\n{}", bad.join("\n"));
    if let Some((name, e)) = failed.into_iter().next() {
        eprintln!("first failure: {name}");
        resume_unwind(e);
    }
}
