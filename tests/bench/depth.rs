//! `depth-bench` (`make bench`, #50): what a step, a render, a read, a warm, an open and an
//! idle session cost as a session grows, at [`depths`] of 10, 1,000 and 10,000 messages (10 and
//! 100 in quick mode). Prints `BENCH <name> <value> <unit>` lines on stdout (progress on
//! stderr); nothing here asserts a figure (`scripts/bench-targets` judges them).
//!
//! Every session is written straight through the lineage API ([`write_history`]): finished
//! runs of a user prompt, up to [`TOOL_STEPS`] tool steps (the model's text and call, the call's
//! intent and result) and a final answer, [`COMMIT_EVERY`] records to a commit, so a 10,000-message
//! session takes a fraction of a second, not 5,000 model steps. Each run's `RunStarted` carries
//! the typed frozen config of the family it is measured in, as a live session's would.
//!
//! In-process seams, no subc daemon (the figures are of broca's own paths; the daemon's frame
//! hop is the same at any depth): the loop figures drive `agent::admit` + `agent::drive` on a
//! `Lineage` against an in-process broca-mock, as `broca-bench`'s `loop.step_overhead_us` does;
//! the op figures go through `Ops::handle` of a module built in this process, as `broca-bench`'s
//! `warm.*` figures do.
//!
//! - `depth.raw_fsync_us` / `depth.step_budget_us`: the same-run anchor (p50 bare 1 KiB append +
//!   fdatasync here) and the step budget, 2 × it + 300 µs.
//! - `depth.step_overhead_us.<family>.<n>`: per step, the loop's wall time of a
//!   [`loop_steps`]-step run (19 of 20 steps call a tool, `NoTools` answers; the first step loads
//!   the history, so its cost is spread over the run) on a session of n messages, less a bare
//!   ureq client's time posting the same request bodies (recorded from a warm-up run on a
//!   session written the same way) to the same mock and reading each whole stream; median of
//!   [`rounds`] paired rounds (21, 5 at 10,000 messages), each on a freshly written session.
//! - `depth.render_us.<family>.<n>`: rendering the request of one step of a session of n
//!   messages as the loop does (`RenderCache::render_appended`, the cache holding the request
//!   before the step's two new messages: it renders those and the open tail, and copies the
//!   settled bytes into the body); p50.
//! - `depth.read_page_us.<n>`: `session.read {limit: 10}` (the ten newest messages); p50.
//! - `depth.output_ref_read_mb_per_s.<n>`: snapshot bytes served per second by back-to-back
//!   whole reads (60,000 bytes) of `session.output_ref_read` of a reference the session's last
//!   reply makes to the output of its last tool call (as `refs-bench` reads one, in process).
//! - `depth.warm_us.<n>` / `depth.warm_bare_request_us.<n>`: `session.warm` (p50) after one real
//!   Anthropic send on the session (which makes it n + 2 messages), and the same warm body
//!   POSTed by a bare ureq client to the same mock (the provider's share, which grows with it).
//! - `depth.open_ms.<n>`: `Shared::open_lineage` of the closed session (lease, checkpoint,
//!   replay of the tail; p50 of reopens), as an actor opens it.
//! - `depth.rss_kib.<n>`: RSS growth of a fresh process (a module over the state root, one small
//!   session already open) when the session's actor opens and sits idle (`Registry::open`).

mod quick;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::agent::{self, LoopOptions, NoTools, ToolDispatcher};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::frozen::{AuthMethod, Family, FrozenConfig, PlanManifest, ToolSpec};
use broca::lineage::{Lineage, Shared};
use broca::message::{Message, Part, Role};
use broca::module::ModuleBuilder;
use broca::ops::Ops;
use broca::provider::client::HttpClient;
use broca::provider::render_cache::RenderCache;
use broca::record::{FinishReason, Frozen, Record};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use broca_mock::mock::{MockServer, Script};
use broca_testkit::{intent, model_step, run_started, step_started, tool_result};
use serde_json::{json, Value};

/// Session sizes, in messages.
fn depths() -> Vec<usize> {
    if quick::on() {
        vec![10, 100]
    } else {
        vec![10, 1_000, 10_000]
    }
}

/// Paired rounds per family at `n` messages (`BROCA_BENCH_DEPTH_ROUNDS` overrides): many where a
/// round takes milliseconds (a burst of load on a shared machine then moves the median less;
/// the 10-message figure is every ratio's denominator), 5 at 10,000 messages.
fn rounds(n: usize) -> usize {
    let default = quick::n(if n <= 1_000 { 21 } else { 5 }, 1);
    std::env::var("BROCA_BENCH_DEPTH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default).max(1)
}

/// Steps of each measured run.
fn loop_steps() -> usize {
    quick::n(20, 3)
}

fn samples() -> usize {
    quick::n(15, 2)
}

/// Tool steps in each written run (a run of k steps is 2 + 2k messages).
const TOOL_STEPS: usize = 4;
/// Records appended between two commits while writing a session.
const COMMIT_EVERY: usize = 1_000;
/// The tool output a reference names (as `refs-bench`'s `logs` tool answers).
const OUTPUT_BYTES: usize = 60_000;

/// The wire families, each with a mock model and auth method that route to it.
const FAMILIES: [(Family, &str, AuthMethod); 7] = [
    (Family::AnthropicMessages, "mock/echo-messages", AuthMethod::ApiKey),
    (Family::OpenaiChat, "mock/echo-chat", AuthMethod::ApiKey),
    (Family::OpenaiResponses, "mock/echo-responses", AuthMethod::ApiKey),
    (Family::OpenaiChatgptResponses, "mock/echo-responses", AuthMethod::Chatgpt),
    (Family::GoogleGenerateContent, "mock/echo-gemini", AuthMethod::ApiKey),
    (Family::GoogleCodeAssist, "mock/antigravity-echo-gemini", AuthMethod::Antigravity),
    (Family::AwsBedrockConverse, "mock/echo-bedrock", AuthMethod::ApiKey),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--help" | "-h") => {
            println!("usage: depth-bench              every depth figure\n       depth-bench FAMILY...    only these families' figures (e.g. under a profiler)\n       depth-bench sessions     only the session figures (read, output refs, warm, open, rss)\n       depth-bench rss ROOT SMALL SESSION   (internal) open two sessions' actors, print the second's RSS growth in KiB");
            return;
        }
        Some("rss") => {
            println!("{}", rss_child(Path::new(&args[2]), &args[3], &args[4]));
            return;
        }
        _ => {}
    }
    let sessions_only = args.get(1).is_some_and(|a| a == "sessions");
    let only = if sessions_only { &args[..0] } else { &args[1..] };
    if let Some(unknown) = only.iter().find(|a| !FAMILIES.iter().any(|(f, _, _)| f.as_str() == a.as_str())) {
        eprintln!("depth-bench: {unknown:?} is no family (see --help)");
        std::process::exit(2);
    }
    let base = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::Builder::new().prefix("depth-bench-").tempdir_in(&base).expect("bench dir");
    let raw = broca_testkit::raw_fsync_p50_us(dir.path(), quick::n(200, 10));
    report("depth.raw_fsync_us", raw, "us");
    report("depth.step_budget_us", 2.0 * raw + 300.0, "us");
    for (family, model, auth) in FAMILIES {
        if sessions_only || (!only.is_empty() && !only.iter().any(|a| a == family.as_str())) {
            continue;
        }
        for &n in &depths() {
            let started = Instant::now();
            let (overhead, render) = family_figures(dir.path(), family, model, auth, n);
            report(&format!("depth.step_overhead_us.{}.{n}", family.as_str()), overhead, "us");
            report(&format!("depth.render_us.{}.{n}", family.as_str()), render, "us");
            eprintln!("depth-bench: {} at {n} messages in {:.1} s", family.as_str(), started.elapsed().as_secs_f64());
        }
    }
    for &n in depths().iter().filter(|_| only.is_empty()) {
        let started = Instant::now();
        session_figures(dir.path(), n);
        eprintln!("depth-bench: the session figures at {n} messages in {:.1} s", started.elapsed().as_secs_f64());
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p50_us(samples: Vec<Duration>) -> f64 {
    median(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect())
}

fn catalog() -> Catalog {
    let lkg: Value = serde_json::from_str(include_str!("../../testdata/catalog/fusiform-lkg.json")).expect("lkg");
    Catalog::from_response(&lkg["response"]).expect("catalog")
}

/// The frozen config of `model` (authenticated by `auth`) routed to `mock`'s `lane`.
fn route_to(mock: &MockServer, lane: &str, model: &str, auth: AuthMethod) -> FrozenConfig {
    let req = ModelRequest { model: model.into(), ..Default::default() };
    let provider = model.split_once('/').map_or("", |(p, _)| p).to_owned();
    let overrides = RouteOverrides {
        base_url_override: Some(mock.base_url(Some(lane))),
        auth_methods: [(provider, auth)].into_iter().collect(),
        ..Default::default()
    };
    route::resolve(Ok(&catalog()), PathBuf::new(), &req, &overrides).expect("route")
}

// ---------------------------------------------------------------------------------------------
// Writing a session.

/// The time every written record carries.
const AT_MS: u64 = 1_700_000_000_000;

/// Appends `rec`, stamped with its time as a live writer stamps it, committing (one fsync)
/// every [`COMMIT_EVERY`] records.
fn put(lineage: &mut Lineage, mut rec: Record, pending: &mut usize) {
    if let Record::ModelStepFinished { at_ms, .. }
    | Record::ToolDispatchIntent { at_ms, .. }
    | Record::ToolResult { at_ms, .. } = &mut rec
    {
        *at_ms = Some(AT_MS);
    }
    lineage.append(&rec).unwrap_or_else(|e| panic!("append {rec:?}: {e}"));
    *pending += 1;
    if *pending >= COMMIT_EVERY {
        lineage.commit().expect("commit");
        *pending = 0;
    }
}

fn run_finished(run: &str) -> Record {
    Record::RunFinished {
        run_id: run.into(),
        reason: FinishReason::Completed,
        error: None,
        usage: Default::default(),
        retries_used: 0,
        final_step_finish_reason: Some("stop".into()),
        indeterminate_tool_calls: vec![],
        at_ms: AT_MS,
        detail: None,
        undelivered_steers: vec![],
    }
}

fn started(run: &str, prompt: &str, config: &Frozen) -> Record {
    let mut rec = run_started(run, None, prompt);
    if let Record::RunStarted(r) = &mut rec {
        r.config = config.clone();
    }
    rec
}

/// A source file's worth of tool output (about 300 bytes).
fn file_text(ep: usize, step: usize) -> String {
    let line = "fn handle(request: &Request) -> Response { route(request).unwrap_or_default() }\n";
    format!("// src/module_{ep}_{step}.rs\n{}", line.repeat(3))
}

/// Appends `messages` (even, at least 2) messages to `lineage` as finished runs: a user prompt,
/// up to [`TOOL_STEPS`] steps of the model's text and call with the call's result, and a final
/// answer, every run frozen with `config`. Everything is durable when it returns.
fn write_history(lineage: &mut Lineage, config: &Frozen, tag: &str, messages: usize) {
    assert!(messages >= 2 && messages.is_multiple_of(2), "{messages} messages: whole runs only");
    let mut pending = 0;
    let mut left = messages;
    let mut ep = 0;
    while left > 0 {
        let steps = ((left - 2) / 2).min(TOOL_STEPS);
        let run = format!("{tag}-{ep}");
        let prompt = format!("Episode {ep}: read the next module and tell me briefly what it does.");
        put(lineage, started(&run, &prompt, config), &mut pending);
        for step in 1..=steps as u64 {
            let id = format!("{run}-c{step}");
            let text = format!("Reading src/module_{ep}_{step}.rs to see how it handles a request.");
            put(lineage, step_started(&run, step), &mut pending);
            put(lineage, model_step(&run, step, &text, &[(&id, "read")]), &mut pending);
            put(lineage, intent(&run, step, &id, "read"), &mut pending);
            put(lineage, tool_result(&run, step, &id, &file_text(ep, step as usize)), &mut pending);
        }
        let last = steps as u64 + 1;
        put(lineage, step_started(&run, last), &mut pending);
        let answer = "The module routes each request and falls back to a default response; nothing else stands out.";
        put(lineage, model_step(&run, last, answer, &[]), &mut pending);
        put(lineage, run_finished(&run), &mut pending);
        left -= 2 + 2 * steps;
        ep += 1;
    }
    lineage.commit().expect("commit");
}

/// The durable transcript of `lineage`.
fn transcript(lineage: &Lineage) -> Vec<Message> {
    lineage.transcript(0, u64::MAX).expect("transcript").messages.into_iter().map(|(_, m)| m).collect()
}

// ---------------------------------------------------------------------------------------------
// The loop and the render, per family.

/// `steps` scripted responses: tool calls, then an answer.
fn loop_script(steps: usize) -> Script {
    let mut responses = Vec::new();
    for i in 0..steps - 1 {
        responses.push(json!({"events": [
            {"text": "Checking the next file. "},
            {"tool_call": {"id": format!("call-{i}"), "name": "read", "arguments": {"path": format!("f{i}.txt")}}},
            {"usage": {"input": 100, "output": 20}}, {"finish": "tool_calls"}
        ]}));
    }
    responses.push(json!({"events": [{"text": "Done."}, {"usage": {"input": 100, "output": 2}}, {"finish": "stop"}]}));
    Script::from_json(&json!({"responses": responses}).to_string()).expect("script")
}

/// (`depth.step_overhead_us`, `depth.render_us`) of `family` at `n` messages.
fn family_figures(dir: &Path, family: Family, model: &str, auth: AuthMethod, n: usize) -> (f64, f64) {
    let mock = MockServer::start("127.0.0.1:0").expect("mock");
    let root =
        tempfile::Builder::new().prefix(&format!("loop-{}-{n}-", family.as_str())).tempdir_in(dir).expect("root");
    let shared = Shared::open(StateRoot::at(root.path()).expect("state root")).expect("shared");
    let client = HttpClient::default();
    let steps = loop_steps();
    // Writes a session of `n` messages, reopens it (as an actor would) and runs one run on it.
    let run_loop = |lane: &str| -> (Duration, Vec<Message>) {
        mock.install(lane, loop_script(steps));
        let config = route_to(&mock, lane, model, auth);
        assert_eq!(config.family, family, "{model} with {auth:?} routes to {family:?}");
        let key = SessionKey::new("/bench", "depth", lane);
        write_history(&mut shared.open_lineage(&key).expect("lineage"), &Frozen::new(config.clone()), "hist", n);
        let mut lineage = shared.open_lineage(&key).expect("reopen");
        let history = transcript(&lineage);
        assert_eq!(history.len(), n, "the session holds {n} messages");
        agent::admit(&mut lineage, "run-depth", None, &config, Message::user_text("go"), None, None).expect("admit");
        let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
        let (_tx, rx) = crossbeam_channel::unbounded();
        let start = Instant::now();
        let outcome =
            agent::drive(&mut lineage, &client, &tools, &rx, &LoopOptions::default(), &mut |_| {}).expect("drive");
        let wall = start.elapsed();
        assert_eq!(outcome.reason, Some(FinishReason::Completed), "the depth run completes");
        (wall, history)
    };
    let (_, history) = run_loop("warm");
    let bodies: Vec<Vec<u8>> = mock.requests("warm").into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), steps, "the warm-up run sent one request per step");
    let render = render_us(&route_to(&mock, "warm", model, auth), &history);

    let bare_config = route_to(&mock, "bare", model, auth);
    let url = broca::provider::wire(family).url(&bare_config);
    let headers = broca::provider::wire(family).headers();
    let agent = ureq::Agent::config_builder().proxy(None).max_redirects(5).build().new_agent();
    let mut overheads = Vec::new();
    for round in 0..rounds(n) {
        mock.install("bare", loop_script(steps));
        let start = Instant::now();
        for body in &bodies {
            let mut req = agent.post(&url).header("content-type", "application/json");
            for (name, value) in headers {
                req = req.header(*name, *value);
            }
            let resp = req.send(&body[..]).expect("bare post");
            let mut sink = Vec::new();
            resp.into_body().into_reader().read_to_end(&mut sink).expect("bare read");
        }
        let bare = start.elapsed();
        let (looped, _) = run_loop(&format!("loop-{round}"));
        let per_step = |d: Duration| d.as_secs_f64() * 1e6 / steps as f64;
        if std::env::var_os("BROCA_BENCH_VERBOSE").is_some() {
            eprintln!(
                "{} {n}: loop {:.0} us/step, bare {:.0} us/step",
                family.as_str(),
                per_step(looped),
                per_step(bare)
            );
        }
        overheads.push(per_step(looped) - per_step(bare));
    }
    (median(overheads), render)
}

/// p50 of rendering `history` as a step of the loop does: the render cache holding the
/// request of the step before (all but the last two messages).
fn render_us(config: &FrozenConfig, history: &[Message]) -> f64 {
    let before = history.len().saturating_sub(2);
    let times = (0..samples())
        .map(|_| {
            let mut cache = RenderCache::default();
            cache.render_appended(config, &history[..before]);
            let start = Instant::now();
            let body = cache.render_appended(config, history);
            let took = start.elapsed();
            assert!(!body.is_empty());
            took
        })
        .collect();
    p50_us(times)
}

// ---------------------------------------------------------------------------------------------
// A session's reads, warm, open and idle memory, through the op path.

const LANE: &str = "ops";
const WARM_MODEL: &str = "anthropic/claude-sonnet-4-5";

fn call(ops: &Arc<Ops>, key: &SessionKey, method: &str, params: Value) -> Result<Value, Refusal> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    ops.handle(key, method, params, Box::new(move |r| tx.send(r).expect("answer")));
    rx.recv_timeout(Duration::from_secs(120)).expect("an answer in time")
}

fn ok(ops: &Arc<Ops>, key: &SessionKey, method: &str, params: Value) -> Value {
    call(ops, key, method, params).unwrap_or_else(|r| panic!("{method}: {r:?}"))
}

/// The `logs` tool a reference-rendering session froze (its plan item opted into references).
fn logs_tool() -> ToolSpec {
    ToolSpec {
        name: "logs".into(),
        description: "The service's log.".into(),
        input_schema: json!({"type": "object"}),
        reply: None,
        module: Some("mock-tools".into()),
        preset: None,
        pin: None,
        result_format: None,
        output_refs: true,
        reference_slots: vec![cortexkit_role_llm_runner::output_refs::ReferenceSlot::new("data", "token")],
    }
}

/// A session of `n` messages whose requests render part numbers, and whose last reply names
/// the output of its last call (`$$tc(N)`, 60,000 bytes).
fn write_refs_session(shared: &Shared, key: &SessionKey, mut config: FrozenConfig, n: usize) {
    config.plan = Some(PlanManifest {
        identity: "depth-bench".into(),
        items: Vec::new(),
        absent: Vec::new(),
        composition_digest: None,
        texts: Vec::new(),
        system_text: None,
        output_refs: true,
        senders: Vec::new(),
    });
    config.tools = vec![logs_tool()];
    let frozen = Frozen::new(config);
    let mut lineage = shared.open_lineage(key).expect("refs lineage");
    write_history(&mut lineage, &frozen, "hist", n - 4);
    let (run, id, mut pending) = ("run-logs", "run-logs-c1", 0);
    put(&mut lineage, started(run, "read the log", &frozen), &mut pending);
    put(&mut lineage, step_started(run, 1), &mut pending);
    put(&mut lineage, model_step(run, 1, "Reading the log.", &[(id, "logs")]), &mut pending);
    put(&mut lineage, intent(run, 1, id, "logs"), &mut pending);
    let log = "2026-12-01T08:00:00Z GET /health 200 0.4ms\n".repeat(OUTPUT_BYTES / 43 + 1);
    put(&mut lineage, tool_result(run, 1, id, &log[..OUTPUT_BYTES]), &mut pending);
    // The batch's results join the transcript as one tool message when the next step starts.
    put(&mut lineage, step_started(run, 2), &mut pending);
    lineage.commit().expect("commit");
    let history = transcript(&lineage);
    let asked = history.len() - 2;
    assert!(history[asked].role == Role::Assistant && matches!(history[asked].content[1], Part::ToolCall { .. }));
    let tag = broca::refs::tags::numbers(&history)[asked][1].expect("the answered call is numbered");
    put(&mut lineage, model_step(run, 2, &format!("The log is clean: see $$tc({tag})."), &[]), &mut pending);
    put(&mut lineage, run_finished(run), &mut pending);
    lineage.commit().expect("commit");
    assert_eq!(transcript(&lineage).len(), n, "the refs session holds {n} messages");
}

/// Every figure of one session size but the per-family ones.
fn session_figures(dir: &Path, n: usize) {
    let mock = MockServer::start("127.0.0.1:0").expect("mock");
    let root_dir = tempfile::Builder::new().prefix(&format!("ops-{n}-")).tempdir_in(dir).expect("root");
    let key = |name: &str| session_key(root_dir.path(), name);
    let anthropic = route_to(&mock, LANE, WARM_MODEL, AuthMethod::ApiKey);
    {
        let shared = Shared::open(StateRoot::at(root_dir.path()).expect("state root")).expect("shared");
        let frozen = Frozen::new(anthropic.clone());
        write_history(&mut shared.open_lineage(&key("main")).expect("lineage"), &frozen, "hist", n);
        write_history(&mut shared.open_lineage(&key("small")).expect("lineage"), &frozen, "hist", 2);
        write_refs_session(&shared, &key("refs"), anthropic, n);
        let opens = (0..quick::n(7, 2))
            .map(|_| {
                let start = Instant::now();
                let lineage = shared.open_lineage(&key("main")).expect("reopen");
                let took = start.elapsed();
                assert!(lineage.open_report().from_checkpoint, "a closed session opens from its checkpoint");
                took
            })
            .collect();
        report(&format!("depth.open_ms.{n}"), p50_us(opens) / 1e3, "ms");
    }
    report(&format!("depth.rss_kib.{n}"), rss_of(root_dir.path(), "small", "main"), "KiB");

    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let ops = ModuleBuilder::new(StateRoot::at(root_dir.path()).expect("state root"))
        .catalog(Catalog::load_lkg(&lkg))
        .base_url_override(Some(mock.base_url(Some(LANE))))
        .build()
        .expect("module")
        .ops;
    let reads = (0..samples())
        .map(|_| {
            let start = Instant::now();
            let page = ok(&ops, &key("main"), "session.read", json!({"limit": 10}));
            let took = start.elapsed();
            assert_eq!(page["messages"].as_array().map(Vec::len), Some(10), "a page of ten");
            took
        })
        .collect();
    report(&format!("depth.read_page_us.{n}"), p50_us(reads), "us");
    report(&format!("depth.output_ref_read_mb_per_s.{n}"), output_ref_mb_per_s(&ops, &key("refs")), "MB/s");
    let (warm, bare) = warm_us(&ops, &mock, &key("main"));
    report(&format!("depth.warm_us.{n}"), warm, "us");
    report(&format!("depth.warm_bare_request_us.{n}"), bare, "us");
}

/// MB/s of whole reads of the reference the refs session's last reply makes.
fn output_ref_mb_per_s(ops: &Arc<Ops>, key: &SessionKey) -> f64 {
    let page = ok(ops, key, "session.history", json!({"form": "display", "limit": 1}));
    let set = page["messages"][0]["row"]["output_refs"]["set_id"].as_str().expect("the reply's set").to_owned();
    let records = ok(ops, key, "session.output_refs", json!({"set_id": set}));
    let record = &records["records"][0];
    assert!(record["state"] == "resolved" && record["bytes"] == OUTPUT_BYTES, "the reference resolves: {record}");
    let params = json!({"ref_id": record["ref_id"], "offset": 0, "length": 131_072});
    let reads = quick::n(20, 2);
    let mut bytes = 0;
    let start = Instant::now();
    for _ in 0..reads {
        let reply = ok(ops, key, "session.output_ref_read", params.clone());
        bytes += reply["data"].as_str().map_or(0, |d| d.len() / 4 * 3);
    }
    assert!(bytes >= reads * OUTPUT_BYTES, "every read served the whole snapshot");
    bytes as f64 / start.elapsed().as_secs_f64() / 1e6
}

/// (p50 `session.warm`, p50 of the same warm body from a bare client) on `key` after one send.
fn warm_us(ops: &Arc<Ops>, mock: &MockServer, key: &SessionKey) -> (f64, f64) {
    let answer = json!({"events": [{"text": "noted"}, {"usage": {"measured": true, "output": 3}}, {"finish": "stop"}]});
    mock.install(LANE, Script::from_json(&json!({"responses": [answer]}).to_string()).expect("script"));
    let system = "Read the file before you change it; keep each change small. ".repeat(110);
    let (provider, model) = WARM_MODEL.split_once('/').expect("provider/model");
    let send = json!({"prompt": "Tidy src/.", "system": system, "cache": {"role": "primary"},
                      "model": {"provider": provider, "model": model}});
    let run = ok(ops, key, "session.send", send)["run_id"].as_str().expect("run id").to_owned();
    let until = Instant::now() + Duration::from_secs(120);
    while ok(ops, key, "run.status", json!({"run_id": run}))["state"] != "completed" {
        assert!(Instant::now() < until, "the depth send never completed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let warms = (0..samples())
        .map(|_| {
            let start = Instant::now();
            ok(ops, key, "session.warm", json!({}));
            start.elapsed()
        })
        .collect();
    let body = mock.requests(LANE).last().expect("a warm was sent").body.clone();
    let agent = ureq::Agent::config_builder().proxy(None).max_redirects(5).build().new_agent();
    let url = format!("{}/messages", mock.base_url(Some(LANE)));
    let bare = (0..samples())
        .map(|_| {
            let start = Instant::now();
            let resp = agent
                .post(&url)
                .header("content-type", "application/json")
                .header("anthropic-version", "2023-06-01")
                .send(&body[..])
                .expect("bare warm");
            resp.into_body().read_to_string().expect("bare answer");
            start.elapsed()
        })
        .collect();
    (p50_us(warms), p50_us(bare))
}

/// A session of the op figures: its project root is the state root (a send needs one that
/// exists).
fn session_key(root: &Path, name: &str) -> SessionKey {
    SessionKey::new(&root.to_string_lossy(), "depth", name)
}

/// `depth.rss_kib`: run in a child process ([`rss_child`]), so nothing this one allocated counts.
fn rss_of(root: &Path, small: &str, session: &str) -> f64 {
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["rss".as_ref(), root.as_os_str(), small.as_ref(), session.as_ref()])
        .output()
        .expect("spawn the rss child");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the rss child failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    text.trim().parse().expect("the child prints KiB")
}

/// In the child: a module over `root`, the small session's actor opened first (so the first
/// actor's one-time costs are not counted), then `session`'s; its RSS growth in KiB.
fn rss_child(root: &Path, small: &str, session: &str) -> f64 {
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let module = ModuleBuilder::new(StateRoot::at(root).expect("state root"))
        .catalog(Catalog::load_lkg(&lkg))
        .build()
        .expect("module");
    let open = |name: &str| {
        let key = session_key(root, name);
        module.registry.open(&key).expect("open the session's actor");
        assert!(module.registry.is_open(&key), "the actor is open");
        // Let the actor settle into idle.
        std::thread::sleep(Duration::from_millis(200));
    };
    open(small);
    let before = vm_rss_kib();
    open(session);
    vm_rss_kib().saturating_sub(before) as f64
}

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
