//! The agent loop in-process, against the real HTTP client and `broca-mock` on loopback, with an
//! in-process tool dispatcher: the batch machinery, at-most-once, cancel, watchdog, retries,
//! auth pause and resume, max_steps, and what really went over the wire.

use broca_mock::mock;
#[allow(dead_code)]
mod nats;
mod pin;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca::agent::{
    self, Cancel, DisplayEvent, LoopOptions, NoTools, Output, RetryPolicy, RunCommand, ToolCall, ToolDispatcher,
    ToolOutcome, ToolOutput,
};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::fanout::{From, Hub};
use broca::lineage::projection::ControlUnit;
use broca::lineage::reader::Reader;
use broca::lineage::{read, Lineage, Shared};
use broca::message::{Message, Part, Role, StepUsage};
use broca::provider::client::HttpClient;
use broca::provider::config::RenderConfig;
use broca::record::{CallOutcome, CancelAt, FinishReason, PauseReason, Record};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wal::{self, ScannedFrame, WalError};
use cortexkit_role_llm_runner::live::LiveEvent;
use crossbeam_channel::{unbounded, Receiver, Sender};
use mock::{MockServer, Script};
use serde_json::{json, Value};

struct Rig {
    _dir: tempfile::TempDir,
    shared: Arc<Shared>,
    mock: MockServer,
    lane: String,
}

fn rig(lane: &str) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap());
    let mock = MockServer::start("127.0.0.1:0").unwrap();
    Rig { _dir: dir, shared, mock, lane: lane.into() }
}

fn key() -> SessionKey {
    SessionKey::new("/work/proj", "loop-test", "s1")
}

impl Rig {
    fn config(&self, model: &str, max_steps: Option<u64>) -> RenderConfig {
        let lkg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        let catalog = Catalog::load_lkg(&lkg).unwrap();
        let req = ModelRequest { model: model.into(), max_steps, ..Default::default() };
        let overrides =
            RouteOverrides { base_url_override: Some(self.mock.base_url(Some(&self.lane))), ..Default::default() };
        route::resolve(Ok(&catalog), lkg, &req, &overrides).unwrap()
    }

    fn script(&self, json: Value) {
        self.mock.install(&self.lane, Script::from_json(&json.to_string()).unwrap());
    }

    fn bodies(&self) -> Vec<Value> {
        self.mock.requests(&self.lane).iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
    }
}

fn opts() -> LoopOptions {
    LoopOptions {
        idle_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            max_retries: 2,
            base_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        },
        ..LoopOptions::default()
    }
}

/// Admits and drives one turn; returns the outcome and everything the loop output.
fn turn(
    l: &mut Lineage,
    config: &RenderConfig,
    prompt: &str,
    tools: Arc<dyn ToolDispatcher>,
    commands: &Receiver<RunCommand>,
    opts: &LoopOptions,
) -> (agent::TurnOutcome, Vec<Output>) {
    let run_id = format!("run-{}", l.state().episodes + 1);
    let mut seen = Vec::new();
    seen.push(Output::Control(agent::admit(l, &run_id, None, config, Message::user_text(prompt), None, None).unwrap()));
    let outcome = agent::drive(l, &HttpClient::default(), &tools, commands, opts, &mut |o| seen.push(o)).unwrap();
    (outcome, seen)
}

fn records(path: &std::path::Path) -> Vec<Record> {
    let mut out = Vec::new();
    wal::read::<WalError>(path, broca::record::KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        out.push(Record::decode(f.payload).unwrap());
        Ok(())
    })
    .unwrap();
    out
}

fn idle() -> (Sender<RunCommand>, Receiver<RunCommand>) {
    unbounded()
}

fn tool_steps(calls: &[(&str, &str)]) -> Value {
    let mut events: Vec<Value> = vec![json!({"text": "Let me look."})];
    for (id, name) in calls {
        events.push(
            json!({"tool_call": {"id": id, "name": name, "arguments": {"path": format!("{id}.txt")}, "chunks": 3}}),
        );
    }
    events.push(json!({"usage": {"input": 20, "output": 7}}));
    events.push(json!({"finish": "tool_calls"}));
    json!({"events": events})
}

fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 30, "output": 3}}, {"finish": "stop"}]})
}

/// Records every call, answers after a per-name delay, and checks that the call's intent is
/// already durable in the WAL when the call arrives.
struct Recorder {
    wal: std::path::PathBuf,
    calls: Mutex<Vec<ToolCall>>,
    durable_at_call: AtomicUsize,
}

impl Recorder {
    fn new(wal: &std::path::Path) -> Arc<Recorder> {
        Arc::new(Recorder { wal: wal.to_path_buf(), calls: Mutex::new(vec![]), durable_at_call: AtomicUsize::new(0) })
    }
}

impl ToolDispatcher for Recorder {
    fn call(&self, call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
        let durable = read::control_units(&Reader::file(&self.wal), None, usize::MAX)
            .unwrap()
            .iter()
            .any(|u| u.body()["type"] == "tool_started" && u.body()["tool_call_id"] == json!(call.tool_call_id));
        if durable {
            self.durable_at_call.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.lock().unwrap().push(call.clone());
        if call.name == "slow" {
            std::thread::sleep(Duration::from_millis(150));
        }
        ToolOutcome::Completed(ToolOutput::text(format!("result of {}", call.tool_call_id)))
    }
}

#[test]
fn a_tool_batch_is_intended_durably_dispatched_once_and_answered_in_planned_order() {
    for model in ["mock/echo-chat", "mock/echo-messages", "mock/echo-responses"] {
        let r = rig(model.split('/').nth(1).unwrap());
        r.script(json!({"responses": [tool_steps(&[("c1", "slow"), ("c2", "fast")]), text_step("All done.")]}));
        let mut l = r.shared.open_lineage(&key()).unwrap();
        let recorder = Recorder::new(l.wal_path());
        let fsyncs_before = l.fsyncs();
        let (_tx, rx) = idle();
        let (outcome, _) = turn(&mut l, &r.config(model, None), "read two files", recorder.clone(), &rx, &opts());
        assert_eq!(outcome.reason, Some(FinishReason::Completed), "{model}");
        let calls = recorder.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 2, "{model}: each call dispatched exactly once");
        assert_eq!(recorder.durable_at_call.load(Ordering::SeqCst), 2, "{model}: intents durable before the calls");
        assert!(calls.iter().all(|c| c.call_key.starts_with(&key().addr())));
        assert_eq!(calls.iter().find(|c| c.tool_call_id == "c1").unwrap().arguments, json!({"path": "c1.txt"}));
        // The tool message holds both results in planned order (c1 answered last).
        let page = l.transcript(0, 100).unwrap();
        let tool_msg = &page.messages[2].1;
        assert_eq!(tool_msg.role, Role::Tool);
        let ids: Vec<_> = tool_msg
            .content
            .iter()
            .map(|p| match p {
                Part::ToolResult { tool_call_id, .. } => tool_call_id.as_str(),
                _ => "?",
            })
            .collect();
        assert_eq!(ids, ["c1", "c2"], "{model}");
        // What really went over the wire: the second request carries both results, in order.
        let bodies = r.bodies();
        assert_eq!(bodies.len(), 2);
        let second = bodies[1].to_string();
        let (p1, p2) = (second.find("result of c1").unwrap(), second.find("result of c2").unwrap());
        assert!(p1 < p2, "{model}: results in planned order on the wire");
        // Two steps, two fsyncs each, plus one for the RunStarted.
        assert_eq!(l.fsyncs() - fsyncs_before, 1 + 2 * 2, "{model}: fsyncs");
        // The recorded request digest is the digest of the bytes the mock received.
        let shas: Vec<String> = records(l.wal_path())
            .into_iter()
            .filter_map(|rec| match rec {
                Record::ModelAttemptFinished(a) => a.request_body_sha256,
                _ => None,
            })
            .collect();
        let received: Vec<String> = r.mock.requests(&r.lane).iter().map(|q| q.body_sha256.clone()).collect();
        assert_eq!(shas, received, "{model}");
    }
}

#[test]
fn calls_past_the_batch_limit_are_never_sent_and_answered_in_planned_order() {
    let limit = broca::limits::CALLS_PER_BATCH;
    let r = rig("wide");
    let ids: Vec<String> = (0..limit + 2).map(|i| format!("w{i}")).collect();
    let calls: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "fast")).collect();
    r.script(json!({"responses": [tool_steps(&calls), text_step("Done.")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let recorder = Recorder::new(l.wal_path());
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-chat", None), "wide", recorder.clone(), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Completed));
    // Counted at the dispatcher: exactly the first `limit` calls were sent, once each.
    let mut sent: Vec<String> = recorder.calls.lock().unwrap().iter().map(|c| c.tool_call_id.clone()).collect();
    sent.sort_by_key(|id| id[1..].parse::<usize>().unwrap());
    assert_eq!(sent, ids[..limit].to_vec());
    let page = l.transcript(0, 100).unwrap();
    let results: Vec<(&str, &Value)> = page.messages[2]
        .1
        .content
        .iter()
        .filter_map(|p| match p {
            Part::ToolResult { tool_call_id, output, .. } => Some((tool_call_id.as_str(), output)),
            _ => None,
        })
        .collect();
    let order: Vec<&str> = results.iter().map(|(id, _)| *id).collect();
    assert_eq!(order, ids.iter().map(String::as_str).collect::<Vec<_>>(), "every call answered, in planned order");
    for (id, output) in &results[limit..] {
        assert_eq!(output["reason"], "too_many_calls", "{id}: {output}");
        assert_eq!((output["nothing_sent"].as_bool(), output["limit"].as_u64()), (Some(true), Some(limit as u64)));
    }
    let not_executed = records(l.wal_path())
        .into_iter()
        .filter(|rec| matches!(rec, Record::ToolResult { outcome: Some(CallOutcome::NotExecuted), .. }))
        .count();
    assert_eq!(not_executed, 2);
}

#[test]
fn max_steps_ends_the_run_after_that_many_steps() {
    let r = rig("max");
    r.script(json!({"responses": [tool_steps(&[("a", "x")]), tool_steps(&[("b", "x")]), tool_steps(&[("c", "x")])]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-chat", Some(2)), "loop", Arc::new(NoTools), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::MaxSteps));
    assert_eq!(r.bodies().len(), 2);
    // NoTools answered each call with an error result the model could read.
    let page = l.transcript(0, 100).unwrap();
    assert!(matches!(&page.messages[2].1.content[0], Part::ToolResult { is_error: true, .. }));
}

#[test]
fn transient_failures_are_retried_with_the_same_bytes_and_counted() {
    let r = rig("retry");
    r.script(json!({"responses": [
        {"status": 503},
        {"events": [{"error": {"type": "overloaded_error", "message": "busy"}}]},
        text_step("third time lucky"),
    ]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let (outcome, seen) = turn(&mut l, &r.config("mock/echo-messages", None), "hi", Arc::new(NoTools), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Completed));
    let shas: Vec<String> = r.mock.requests(&r.lane).iter().map(|q| q.body_sha256.clone()).collect();
    assert_eq!(shas.len(), 3);
    assert!(shas.windows(2).all(|w| w[0] == w[1]), "a retry sends the same bytes");
    let finished = seen
        .iter()
        .filter_map(|o| match o {
            Output::Control(units) => units.iter().find(|u| u.body()["type"] == "run_finished").cloned(),
            _ => None,
        })
        .next()
        .unwrap();
    assert_eq!(finished.body()["retries_used"], 2);
}

/// One `step.finished.v1` per recorded attempt (a retried one included), published on a real
/// `nats-server` only once its record is in the WAL, with the record's position and
/// `attempt_id`, and the usage and finish reason of the answered attempt.
#[test]
fn each_recorded_attempt_is_hinted_on_the_bus_after_its_record_is_durable() {
    if !nats::available("each_recorded_attempt_is_hinted_on_the_bus_after_its_record_is_durable") {
        return;
    }
    let server = nats::NatsServer::start(&[]);
    let r = rig("hints");
    r.script(json!({"responses": [{"status": 503}, text_step("second time")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let wal = l.wal_path().to_owned();
    let in_wal = move |_: &str, body: &[u8]| {
        let hint: Value = serde_json::from_slice(body).unwrap();
        records(&wal).iter().any(|rec| {
            matches!(rec, Record::ModelAttemptFinished(a) if a.attempt_id.as_deref() == hint["attempt_id"].as_str())
        })
    };
    let sub = nats::Subscriber::start(&server.addr(), "ck.*.live.*.step.finished.v1", Box::new(in_wal));
    let bus = broca::config::BusConfig { addr: server.addr(), account: "acct".into() };
    let opts = LoopOptions { step_hints: Some(broca::bus::StepHints::start(&bus).unwrap()), ..opts() };
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-messages", None), "hi", Arc::new(NoTools), &rx, &opts);
    assert_eq!(outcome.reason, Some(FinishReason::Completed));
    let got = sub.wait_for(2, Duration::from_secs(10));
    assert_eq!(got.len(), 2, "one hint per attempt: {got:?}");
    assert!(got.iter().all(|c| c.checked), "a hint arrived before its attempt record was in the WAL");
    let hints: Vec<_> = got
        .iter()
        .map(|c| cortexkit_role_llm_runner::step_events::decode_step_finished(&c.subject, &c.body).unwrap())
        .collect();
    let mut seq = 0;
    let attempts: Vec<(u64, String)> = records(l.wal_path())
        .into_iter()
        .filter_map(|rec| {
            seq += 1;
            match rec {
                Record::ModelAttemptFinished(a) => Some((seq, a.attempt_id.unwrap())),
                _ => None,
            }
        })
        .collect();
    let published: Vec<(u64, String)> = hints.iter().map(|h| (h.seq, h.attempt_id.clone().unwrap())).collect();
    assert_eq!(published, attempts, "hints name their records' positions and attempt ids");
    let expected_ref =
        cortexkit_role_llm_runner::session_ref::session_ref(&cortexkit_role_llm_runner::session_ref::SessionIdentity {
            runner: "broca",
            harness: &key().harness,
            session: &key().session,
        });
    for (h, (status, attempt)) in hints.iter().zip([("failed", 1), ("completed", 2)]) {
        assert_eq!((h.terminal_status.as_str(), h.attempt.get()), (status, attempt));
        assert_eq!(
            (h.run_id.as_str(), h.step_id.as_str(), h.session_ref.as_str()),
            ("run-1", "1", expected_ref.as_str())
        );
        assert_eq!(h.log_incarnation, l.incarnation());
        assert!(h.started_at_ms <= h.finished_at_ms);
    }
    assert_eq!((hints[0].input_tokens, hints[0].finish_reason.as_deref()), (None, None));
    assert_eq!((hints[1].input_tokens, hints[1].output_tokens), (Some(30), Some(3)));
    assert_eq!(hints[1].finish_reason.as_deref(), Some("stop"));
}

#[test]
fn an_error_after_content_fails_the_run_without_a_retry() {
    let r = rig("midstream");
    r.script(json!({"responses": [
        {"events": [{"text": "The three causes are"}, {"error": {"type": "overloaded_error", "message": "Overloaded"}}]},
        text_step("never sent"),
    ]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-messages", None), "hi", Arc::new(NoTools), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Error));
    assert_eq!(outcome.error.unwrap().message, "Overloaded");
    assert_eq!(r.bodies().len(), 1, "content was delivered: no retry");
}

/// Prompt caching through the loop (#28): an Anthropic tool loop against broca-mock's model of
/// the provider's cache. The first step writes the prefix up to its markers (system, tools and
/// the transcript's tail), every later step reads what the step before it wrote, and the run's
/// usage carries both.
#[test]
fn an_anthropic_tool_loop_reads_its_prefix_from_the_provider_cache_on_every_later_step() {
    let r = rig("cache");
    let mut config = r.config("mock/echo-messages", None);
    config.system = Some("Read the file before you change it; keep each change small. ".repeat(120));
    let measured = json!({"usage": {"measured": true, "output": 9}});
    let mut responses: Vec<Value> = (0..4)
        .map(|i| json!({"events": [{"tool_call": {"id": format!("c{i}"), "name": "read", "arguments": {"path": "a"}}}, measured, {"finish": "tool_calls"}]}))
        .collect();
    responses.push(json!({"events": [{"text": "done"}, measured, {"finish": "stop"}]}));
    r.script(json!({ "responses": responses }));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &config, "tidy", Arc::new(NoTools), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Completed));
    let steps: Vec<StepUsage> = records(l.wal_path())
        .into_iter()
        .filter_map(|rec| match rec {
            Record::ModelStepFinished { usage, .. } => Some(usage),
            _ => None,
        })
        .collect();
    assert_eq!(steps.len(), 5);
    assert_eq!(steps[0].cached_input_tokens, Some(0), "nothing cached yet: {:?}", steps[0]);
    assert!(steps[0].cache_write_tokens.unwrap() > 1000, "the first step writes its prefix: {:?}", steps[0]);
    for (i, s) in steps.iter().enumerate().skip(1) {
        let wrote_before = steps[i - 1].cached_input_tokens.unwrap() + steps[i - 1].cache_write_tokens.unwrap();
        assert_eq!(s.cached_input_tokens, Some(wrote_before), "step {i} reads all the step before it cached: {s:?}");
    }
    let body = &r.bodies()[0];
    assert_eq!(body["system"][0]["cache_control"], json!({"type": "ephemeral"}), "the system prompt is marked");
    let usage = l.state().last.as_ref().unwrap().usage.totals.clone();
    let cached: u64 = steps.iter().filter_map(|s| s.cached_input_tokens).sum();
    assert_eq!(usage.cached_input_tokens, Some(cached), "the run's usage sums the steps' cache reads");
}

/// The loop on a scripted `ModelClient` (no socket, no SSE): its events become the stored
/// answer, the request was rendered for it, and an attempt the script has no answer for ends
/// the next run with a named permanent error instead of waiting.
#[test]
fn a_scripted_client_drives_turns_without_a_socket() {
    use broca::provider::event::StreamEvent;
    use broca::provider::scripted::{ScriptedClient, Step};
    let r = rig("scripted");
    let config = r.config("mock/echo-messages", None);
    let answer = vec![
        Step::Event(StreamEvent::TextDelta { text: "scripted ".into() }),
        Step::Pause(Duration::from_millis(5)),
        Step::Event(StreamEvent::TextDelta { text: "answer".into() }),
        Step::Event(StreamEvent::Finish { reason: "stop".into(), raw: "end_turn".into() }),
    ];
    let client = ScriptedClient::new([answer]).unwrap();
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    for (run, prompt) in [("run-1", "first"), ("run-2", "second")] {
        agent::admit(&mut l, run, None, &config, Message::user_text(prompt), None, None).unwrap();
        let outcome = agent::drive(&mut l, &client, &tools, &rx, &opts(), &mut |_| {}).unwrap();
        if run == "run-1" {
            assert_eq!(outcome.reason, Some(FinishReason::Completed));
            let page = l.transcript(0, 10).unwrap();
            let last = &page.messages.last().unwrap().1;
            assert_eq!(serde_json::to_value(last).unwrap()["content"][0]["text"], "scripted answer");
        } else {
            assert_eq!(outcome.reason, Some(FinishReason::Error));
            assert_eq!(outcome.error.unwrap().provider_code.as_deref(), Some("scripted"));
        }
    }
    let bodies = client.bodies();
    assert_eq!(bodies.len(), 2, "one attempt per run: a permanent failure is not retried");
    let first: Value = serde_json::from_slice(&bodies[0]).unwrap();
    assert!(first.to_string().contains("first"), "the rendered request carries the prompt: {first}");
    assert!(r.bodies().is_empty(), "nothing reached the loopback mock");
}

/// A provider that echoes the credential back in its error text never gets it onto disk: the
/// loop cuts every secret it holds out of provider errors before recording them.
#[test]
fn a_secret_echoed_by_the_provider_is_never_recorded() {
    const SECRET: &str = "sk-test-echoed-secret-0123456789";
    let r = rig("echo-secret");
    let body = json!({"error": {"message": format!("invalid api key {SECRET}"), "type": "invalid_request_error"}});
    r.script(json!({"responses": [{"status": 400, "body": body}]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let mut config = r.config("mock/echo-chat", None);
    config.auth = broca::provider::config::AuthSource::Bearer;
    let opts = LoopOptions { bearer: Some(SECRET.into()), ..opts() };
    let (outcome, _) = turn(&mut l, &config, "hi", Arc::new(NoTools), &rx, &opts);
    let error = outcome.error.expect("the run failed");
    assert!(error.message.contains("[redacted]") && !error.message.contains(SECRET), "{}", error.message);
    let wal = std::fs::read(r.shared.wal_path(&key())).unwrap();
    assert!(!String::from_utf8_lossy(&wal).contains(SECRET), "the secret reached the WAL");
}

#[test]
fn a_vault_route_without_a_vault_ends_with_a_named_permanent_error() {
    let r = rig("no-vault");
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let mut config = r.config("mock/echo-chat", None);
    config.auth = broca::provider::config::AuthSource::Vault { credential_id: "apikey:mock".into() };
    let (outcome, _) = turn(&mut l, &config, "hi", Arc::new(NoTools), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Error));
    let error = outcome.error.expect("a named error");
    assert!(r.mock.requests(&r.lane).is_empty(), "no model request without a credential");
    pin::assert_golden("vault_unavailable_run_error.json", &serde_json::to_string(&error).unwrap(), None);
}

#[test]
fn auth_failure_pauses_and_the_same_run_resumes() {
    let r = rig("auth");
    r.script(json!({"responses": [{"status": 401}, text_step("welcome back")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-responses", None), "hi", Arc::new(NoTools), &rx, &opts());
    assert_eq!(outcome.paused, Some(PauseReason::AuthRequired));
    assert_eq!(outcome.reason, None);
    let run_id = outcome.run_id.clone();
    drop(l);
    // A new process: the paused run is not sealed, and resuming continues the same run_id.
    let mut l = r.shared.open_lineage(&key()).unwrap();
    assert_eq!(l.open_report().sealed_orphan, None);
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    let resumed = agent::drive(&mut l, &HttpClient::default(), &tools, &rx, &opts(), &mut |_| {}).unwrap();
    assert_eq!(resumed.run_id, run_id);
    assert_eq!(resumed.reason, Some(FinishReason::Completed));
    assert_eq!(l.transcript(0, 10).unwrap().messages.len(), 2, "one user message, one answer: no new episode");
}

#[test]
fn the_watchdog_interrupts_a_silent_provider() {
    let r = rig("watchdog");
    r.script(
        json!({"responses": [{"events": [{"text": "a"}, {"delay_ms": 3000}, {"text": "b"}, {"finish": "stop"}]}]}),
    );
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let opts = LoopOptions { idle_timeout: Duration::from_millis(300), ..opts() };
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-chat", None), "hi", Arc::new(NoTools), &rx, &opts);
    assert_eq!(outcome.reason, Some(FinishReason::Interrupted), "interrupted, not cancelled");
    assert_eq!(outcome.error.unwrap().provider_code.as_deref(), Some("provider_idle_timeout"));
}

#[test]
fn cancel_now_stops_the_stream() {
    let r = rig("cancel-now");
    let mut events = vec![json!({"text": "start "})];
    for _ in 0..50 {
        events.push(json!({"delay_ms": 100}));
        events.push(json!({"text": "more "}));
    }
    r.script(json!({"responses": [{"events": events}]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (tx, rx) = idle();
    let config = r.config("mock/echo-chat", None);
    agent::admit(&mut l, "run-1", None, &config, Message::user_text("go"), None, None).unwrap();
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    let mut sent = false;
    let outcome = agent::drive(&mut l, &HttpClient::default(), &tools, &rx, &opts(), &mut |o| {
        if matches!(o, Output::Display(_)) && !sent {
            tx.send(RunCommand::Cancel(CancelAt::Now)).unwrap();
            sent = true;
        }
    })
    .unwrap();
    assert_eq!(outcome.reason, Some(FinishReason::Cancelled));
    let recs = records(l.wal_path());
    assert!(recs.iter().any(|r| matches!(r, Record::RunCancelRequested { at: CancelAt::Now, .. })));
    assert!(!recs.iter().any(|r| matches!(r, Record::ModelStepFinished { .. })), "the cancelled step has no answer");
}

/// Blocks each call until released, so a boundary cancel can arrive mid-batch.
struct Gate {
    release: Receiver<()>,
    started: Sender<()>,
}

impl ToolDispatcher for Gate {
    fn call(&self, _call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
        let _ = self.started.send(());
        let _ = self.release.recv_timeout(Duration::from_secs(10));
        ToolOutcome::Completed(ToolOutput::text("released"))
    }
}

#[test]
fn cancel_at_the_step_boundary_finishes_the_batch_and_starts_no_step() {
    let r = rig("cancel-boundary");
    r.script(json!({"responses": [tool_steps(&[("c1", "x")]), text_step("must not be asked")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (tx, rx) = idle();
    let (release_tx, release_rx) = unbounded();
    let (started_tx, started_rx) = unbounded();
    let gate: Arc<dyn ToolDispatcher> = Arc::new(Gate { release: release_rx, started: started_tx });
    let driver = std::thread::spawn(move || {
        // Cancel once the call is in flight, then let the call finish.
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        tx.send(RunCommand::Cancel(CancelAt::StepBoundary)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        release_tx.send(()).unwrap();
    });
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-chat", None), "go", gate, &rx, &opts());
    driver.join().unwrap();
    assert_eq!(outcome.reason, Some(FinishReason::Cancelled));
    let recs = records(l.wal_path());
    let steps = recs.iter().filter(|r| matches!(r, Record::StepStarted { .. })).count();
    assert_eq!(steps, 1, "no further StepStarted after a boundary cancel");
    assert!(
        recs.iter().any(|r| matches!(r, Record::ToolResult { outcome: Some(o), .. } if o == "ok")),
        "the batch finished"
    );
    assert_eq!(r.bodies().len(), 1);
}

/// Waits for the call's deadline or the loop's cancel, then reports what it saw: a dispatcher that
/// cannot tell whether its call ran answers indeterminate.
struct Unanswered {
    saw_cancel: std::sync::atomic::AtomicBool,
}

impl ToolDispatcher for Unanswered {
    fn call(&self, _call: &ToolCall, deadline: Instant, cancel: &Cancel) -> ToolOutcome {
        while !cancel.is_cancelled() && Instant::now() < deadline + Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.saw_cancel.store(cancel.is_cancelled(), Ordering::SeqCst);
        ToolOutcome::Indeterminate("the provider never answered".into())
    }
}

/// No answer by the batch's deadline: the loop raises the call's cancel, records an
/// unknown-outcome result (never a resend) and ends the run `interrupted`.
#[test]
fn an_unanswered_call_is_cancelled_at_its_deadline_recorded_unknown_and_ends_the_run() {
    let r = rig("unanswered");
    r.script(json!({"responses": [tool_steps(&[("c1", "x")]), text_step("must not be asked")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let tools = Arc::new(Unanswered { saw_cancel: Default::default() });
    let quick = LoopOptions { tool_wait: Duration::from_millis(200), ..opts() };
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-chat", None), "go", tools.clone(), &rx, &quick);
    assert_eq!(outcome.reason, Some(FinishReason::Interrupted));
    let recs = records(l.wal_path());
    assert!(recs.iter().any(|r| matches!(r, Record::ToolResult { outcome: Some(o), .. } if o == "unknown")));
    assert_eq!(r.bodies().len(), 1, "no step after the indeterminate call");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !tools.saw_cancel.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the dispatcher saw the cancel");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A dispatcher's own indeterminate answer (say, its connection closed) ends the run the same way.
#[test]
fn an_indeterminate_answer_is_recorded_unknown_and_ends_the_run() {
    struct Lost;
    impl ToolDispatcher for Lost {
        fn call(&self, _call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
            ToolOutcome::Indeterminate("the connection closed before the provider answered".into())
        }
    }
    let r = rig("lost");
    r.script(json!({"responses": [tool_steps(&[("c1", "x")]), text_step("must not be asked")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let (outcome, _) = turn(&mut l, &r.config("mock/echo-chat", None), "go", Arc::new(Lost), &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Interrupted));
    let result = records(l.wal_path()).into_iter().find(|r| matches!(r, Record::ToolResult { .. })).unwrap();
    let Record::ToolResult { outcome, output, .. } = result else { unreachable!() };
    assert_eq!(outcome.map(|o| o.as_str()), Some("unknown"));
    assert!(output["message"].as_str().unwrap().contains("connection closed"), "{output}");
}

#[test]
fn a_second_episode_sends_the_prefix() {
    let r = rig("episodes");
    r.script(json!({"responses": [text_step("first answer"), text_step("second answer")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let (_tx, rx) = idle();
    let config = r.config("mock/echo-responses", None);
    turn(&mut l, &config, "first question", Arc::new(NoTools), &rx, &opts());
    drop(l);
    let mut l = r.shared.open_lineage(&key()).unwrap();
    turn(&mut l, &config, "second question", Arc::new(NoTools), &rx, &opts());
    let second = r.bodies()[1].to_string();
    for needle in ["first question", "first answer", "second question"] {
        assert!(second.contains(needle), "the second request lacks {needle:?}");
    }
}

/// A sink that forwards a subscription's frames to the test.
struct Frames(Sender<Value>);

impl broca::fanout::StreamSink for Frames {
    fn frame(&mut self, event: &Value) -> Result<(), broca::fanout::SinkError> {
        self.0.send(event.clone()).map_err(|_| broca::fanout::SinkError::Closed)
    }
    fn end(&mut self, _error: Option<broca::wire::Refusal>) {}
}

/// The frame's typed event, which must decode strictly as the llm-runner/v1 role's.
fn strict_event(frame: &Value) -> Option<LiveEvent> {
    let event = frame.get("event")?;
    Some(LiveEvent::decode_strict(event).unwrap_or_else(|e| panic!("{frame}: {e}")))
}

#[test]
fn frames_carry_the_llm_runner_live_events_and_every_path_projects_the_same_units() {
    let r = rig("echo-chat");
    r.script(json!({"responses": [tool_steps(&[("c1", "slow"), ("c2", "fast")]), text_step("All done.")]}));
    let mut l = r.shared.open_lineage(&key()).unwrap();
    let recorder = Recorder::new(l.wal_path());
    let (_tx, rx) = idle();
    let (outcome, seen) = turn(&mut l, &r.config("mock/echo-chat", None), "read two files", recorder, &rx, &opts());
    assert_eq!(outcome.reason, Some(FinishReason::Completed));

    // The writer path: units as the loop published them, frames as the fan-out builds them.
    let written: Vec<ControlUnit> = seen
        .iter()
        .filter_map(|o| match o {
            Output::Control(units) => Some(units.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let displays: Vec<DisplayEvent> = seen
        .iter()
        .filter_map(|o| match o {
            Output::Display(d) => Some(d.clone()),
            _ => None,
        })
        .collect();
    // The read path replays from the start and projects the very same units.
    assert_eq!(read::control_units(&l.reader(), None, usize::MAX).unwrap(), written, "read::control_units");
    let tail = read::control_units(&l.reader(), Some(written[3].cursor), usize::MAX).unwrap();
    assert_eq!(tail, written[4..], "read::control_units after a cursor");

    // The fan-out replay (from the start and from a cursor) sends the same control frames.
    let hub = Hub::new();
    let subscribe = |from: From| {
        let (tx, frames) = unbounded();
        hub.attach(&r.shared, &key(), from, Frames(tx));
        let mut out = Vec::new();
        loop {
            let f = frames.recv_timeout(Duration::from_secs(10)).expect("a replayed frame");
            let done = f["unit"]["type"] == "run_finished";
            out.push(f);
            if done {
                return out;
            }
        }
    };
    let strip_seq = |f: &Value| {
        let mut f = f.clone();
        f.as_object_mut().unwrap().remove("seq");
        f
    };
    let expected: Vec<Value> = written.iter().map(broca::fanout::control_frame).collect();
    let replayed: Vec<Value> = subscribe(From::Start).iter().map(strip_seq).collect();
    assert_eq!(replayed, expected, "fan-out replay from start");
    let replayed: Vec<Value> = subscribe(From::After(written[3].cursor)).iter().map(strip_seq).collect();
    assert_eq!(replayed, expected[4..], "fan-out replay from a cursor");

    // Every frame's event decodes strictly; units with a role equivalent carry the right one.
    let page = l.transcript(0, 100).unwrap();
    let mut assistant_of_step = std::collections::HashMap::new();
    let mut finished_mids = Vec::new();
    let mut started_mids = Vec::new();
    for (unit, frame) in written.iter().zip(&expected) {
        let body = unit.body();
        let ty = body["type"].as_str().unwrap();
        let event = strict_event(frame);
        match (ty, &event) {
            ("run_started", Some(LiveEvent::RunStarted(e))) => assert_eq!(json!(e.run_id), body["run_id"]),
            ("message_started", Some(LiveEvent::MessageStarted(e))) => {
                assert_eq!(json!(e.mid), body["mid"]);
                assert!(!finished_mids.contains(&e.mid), "{} started before it finishes", e.mid);
                started_mids.push(e.mid.clone());
            }
            ("tool_message", Some(LiveEvent::MessageFinished(e))) => {
                assert_eq!(json!(e.mid), body["mid"]);
                let served: usize = e.mid.strip_prefix('m').unwrap().parse().unwrap();
                assert_eq!(page.messages[served - 1].1.role, Role::Tool, "{}", e.mid);
                finished_mids.push(e.mid.clone());
            }
            ("user_message" | "steered" | "assistant_message", Some(LiveEvent::MessageFinished(e))) => {
                assert_eq!(json!(e.mid), body["mid"]);
                // Served ordinals (and mids) count from 1; the transcript's from 0.
                let served: usize = e.mid.strip_prefix('m').unwrap().parse().unwrap();
                let (at, message) = &page.messages[served - 1];
                assert_eq!(*at as usize + 1, served, "session.read ordinal");
                assert_eq!(serde_json::to_value(message).unwrap(), body["message"], "{ty} {}", e.mid);
                if ty == "assistant_message" {
                    assistant_of_step.insert(body["step"].as_u64().unwrap(), e.mid.clone());
                }
                finished_mids.push(e.mid.clone());
            }
            ("tool_started", Some(LiveEvent::ToolStarted(e))) => {
                assert_eq!(Some(&e.mid), assistant_of_step.get(&1), "tool_started names the asking message");
                assert_eq!(json!(e.tool_call_id), body["tool_call_id"]);
                let arguments: Value = serde_json::from_str(&e.arguments).unwrap();
                assert_eq!(arguments, json!({"path": format!("{}.txt", e.tool_call_id)}));
                assert!(e.started_at.is_some(), "broca records when a call it ran started");
            }
            ("tool_result", Some(LiveEvent::ToolFinished(e))) => {
                assert_eq!(Some(&e.mid), assistant_of_step.get(&1), "tool_finished names the asking message");
                assert_eq!(json!(e.tool_call_id), body["result"]["tool_call_id"]);
                assert_eq!(e.outcome, "ok");
                let output = broca::message::tool_result_content(&body["result"]["output"]);
                assert_eq!(e.output_bytes, output.len() as u64, "the display row's content, uncut");
                assert!(e.finished_at.is_some(), "broca records when a call it ran finished");
            }
            ("run_finished", Some(LiveEvent::RunFinished(e))) => {
                assert_eq!((json!(e.run_id), e.reason.as_str()), (body["run_id"].clone(), "completed"))
            }
            ("step_started" | "model_attempt_finished", None) => {}
            other => panic!("unexpected unit/event pair {other:?}"),
        }
    }
    assert_eq!(finished_mids, ["m1", "m2", "m3", "m4"], "user, tool-asking answer, tool message, final answer");
    assert_eq!(started_mids, finished_mids, "every stored message is started, then finished");

    // Display frames: the role's deltas, named by the stored message and part they build.
    assert!(displays.iter().any(|d| matches!(d, DisplayEvent::ToolInputDelta { .. })));
    for d in &displays {
        let frame = broca::fanout::display_frame(d);
        let event = strict_event(&frame);
        let (step, mid, part) = match (d, &event) {
            (DisplayEvent::TextDelta { step, mid, part, .. }, Some(LiveEvent::TextDelta(e))) => {
                assert_eq!((e.mid.as_ref(), e.part.clone()), (Some(mid), Some(format!("p{part}"))));
                (step, mid, part)
            }
            (
                DisplayEvent::ToolInputDelta { step, mid, part, tool_call_id, .. },
                Some(LiveEvent::ToolInputDelta(e)),
            ) => {
                assert_eq!(&e.tool_call_id, tool_call_id);
                assert_eq!((e.mid.as_ref(), e.part.clone()), (Some(mid), Some(format!("p{part}"))));
                let served: usize = mid.strip_prefix('m').unwrap().parse().unwrap();
                match &page.messages[served - 1].1.content[*part] {
                    Part::ToolCall { tool_call_id: id, .. } => assert_eq!(id, tool_call_id, "part {part}"),
                    other => panic!("tool_input_delta part {part} is {other:?}"),
                }
                (step, mid, part)
            }
            (DisplayEvent::Status { .. }, None) => continue,
            other => panic!("unexpected display/event pair {other:?}"),
        };
        assert_eq!(Some(mid), assistant_of_step.get(step), "a delta names its step's message");
        let served: usize = mid.strip_prefix('m').unwrap().parse().unwrap();
        assert!(*part < page.messages[served - 1].1.content.len(), "{mid} part {part}");
    }
}
