//! `tool-bench`: tool calls from other modules through the real subc daemon, behind `make
//! bench`. Prints `BENCH <name> <value> <unit>` lines and a few `# …` comment lines (targets,
//! ratios, same-run baselines) on stdout; progress and diagnostics go to stderr. Nothing here
//! asserts a figure.
//!
//! The rig is the tests' harness (`tests/support`, as `tests/e2e_tools.rs` uses it): the daemon
//! booted in this process, supervising the release broca (`BROCA_BENCH_BROCA`, or else `../broca`
//! next to this example's directory) and the release `broca-mock --subc` as the
//! `tool-provider/v1` module `mock-tools` (`BROCA_BENCH_MOCK`, or else `broca-mock` beside
//! broca), its built-in tools, no call log file (counted in memory). The harness's in-process
//! `MockServer` is the model. The rig directory is created under `BROCA_BENCH_DIR` (default: the
//! system temp dir).
//!
//! How each figure is measured:
//!
//! - `fs.raw_fsync_us`: p50 of a bare 1 KiB append + fdatasync in the directory the loop's
//!   lineages live in (as `broca-bench` measures it): the same-run physical anchor.
//! - `tool.call_roundtrip_p{50,99}_us`: broca's own tool plane, in this process: a
//!   [`ToolPlane`] over a real [`broca::subc::consumer::Consumer`] connection to the daemon,
//!   called as the loop calls it (`ToolDispatcher::call`, the frozen `echo` tool's target with
//!   its schema pin, as [`fetch::fetch`] froze it at a real admission-style fetch), one call at
//!   a time. Each sample is the wall time of one `call` — request built and serialized, sent on
//!   the session's cached route, daemon → broca-mock → daemon, the answer turned into the
//!   call's result — so it is the round trip at the provider boundary, nothing of the loop.
//!   broca's recorded timings cannot give this (a `ToolDispatchIntent` and its `ToolResult`
//!   carry no per-call times), and nothing was added to production code to measure it.
//! - `tool.sdk_roundtrip_p{50,99}_us`: the same call (the same body members, built and
//!   serialized per call) made with the official client SDK (`subc-client-rs`
//!   `SubcConsumer::call`, its managed, route-cached unary call) on its own connection, each
//!   sample inside one `block_on` per block, on the harness's client runtime.
//!
//!   Both are warmed ([`warmup`] calls each, routes open), then measured in [`blocks`]
//!   alternating blocks of [`per_block`] calls (the order flips every block), so drift in the
//!   machine's load hits both alike. The target `tool.call_roundtrip_p50_us ≤ 1.5 ×
//!   tool.sdk_roundtrip_p50_us` is printed as a comment line with the ratio.
//! - `tool.call_roundtrip_cpu_us` / `tool.sdk_roundtrip_cpu_us`: CPU time (user + system) of
//!   this process per call over the same blocks: the client's threads plus the in-process
//!   daemon's share of the call (broca-mock, a separate process, is not counted). Steadier than
//!   wall time on a shared machine; the daemon's part is the same for both, so the difference is
//!   the clients'.
//! - `loop.step_overhead_us.with_tool`: the agent loop in this process (`agent::admit` +
//!   `agent::drive`, the release lineage code, a WAL under the rig) running a [`LOOP_STEPS`]-step
//!   run whose model (the harness's `MockServer`) asks for one `echo` call per step (the last
//!   step answers), with the tool plane as its dispatcher and the fetched plan frozen in its
//!   config. Each session is first fetched with [`fetch::fetch`] on its own lineage id, exactly
//!   as admission does, which also opens its route. Per step: (the run's wall time − the time
//!   spent inside the dispatcher's calls, measured around each `ToolPlane::call` on its helper
//!   thread) / steps − the per-step time of a bare ureq client streaming the same responses
//!   with the same rendered request from the same mock, run just before it. What is left is the loop's own cost of
//!   a tool step: the two fsyncs, records, the helper-thread hand-off, history and rendering. The
//!   median of [`loop_rounds`] rounds. Beside it, as a comment, the same loop in the same round
//!   with `NoTools` as the dispatcher (what `broca-bench`'s `loop.step_overhead_us` measures:
//!   each call an immediate error result; the two runs' order flips every round), so the
//!   with-tool extra reads off one run.
//!
//! At the end the daemon is stopped by SIGTERM to this process; the exit status is 0 when every
//! figure was measured, 1 otherwise (a harness failure panics: 101).

use broca_mock::mock;
#[path = "../bench/quick.rs"]
mod quick;
#[path = "../support/mod.rs"]
mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca::agent::{self, CallTarget, Cancel, LoopOptions, NoTools, ToolCall, ToolDispatcher, ToolOutcome};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::lineage::Shared;
use broca::message::Message;
use broca::provider::client::HttpClient;
use broca::provider::config::RenderConfig;
use broca::record::FinishReason;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::subc::consumer::Consumer;
use broca::tools::{fetch, ToolPlane};
use broca::wire::plan::{self, Plan};
use mock::Script;
use serde_json::{json, Value};
use subc_client_rs::{CallOptions, SubcConsumer};
use subc_protocol::{BindIdentity, RouteTarget};
use support::{Harness, Options, STEP};

const TOOLS: &str = "mock-tools";
const TOOL: &str = "echo";
fn warmup() -> usize {
    quick::n(200, 10)
}
fn blocks() -> usize {
    quick::n(40, 2)
}
fn per_block() -> usize {
    quick::n(100, 10)
}
const LOOP_STEPS: usize = 20;
fn loop_rounds() -> usize {
    quick::n(9, 1)
}
fn fsync_samples() -> usize {
    quick::n(1000, 25)
}
/// The wait of one measured call (it answers in well under a millisecond).
const CALL_WAIT: Duration = Duration::from_secs(10);

type Failure = String;

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        eprintln!(
            "usage: tool-bench   (environment: BROCA_BENCH_BROCA = the broca binary; BROCA_BENCH_MOCK = the \
             broca-mock binary; BROCA_BENCH_DIR; RUST_LOG)"
        );
        return ExitCode::SUCCESS;
    }
    let (broca, broca_mock) = match binaries() {
        Ok(paths) => paths,
        Err(why) => {
            eprintln!("tool-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let base_dir = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let provider = json!({"program": broca_mock, "args": [], "env": {"CK_LOG": "warn"},
                          "enabled": true, "reserved": true});
    let opts = Options {
        broca,
        base_dir,
        ck_log: "info".into(),
        test_writer: false,
        prefix: "btb".into(),
        modules: vec![(TOOLS.to_string(), provider)],
        ..Default::default()
    };
    let h = Harness::start_with(opts);
    eprintln!("tool-bench: rig {}", h.rig_root().display());
    let outcome = bench(&h);
    if let Err(why) = &outcome {
        eprintln!("tool-bench: {why}");
        eprintln!("tool-bench: broca's log (tail):\n{}", h.broca_log_tail(30));
    }
    h.stop();
    eprintln!("tool-bench: the daemon stopped cleanly");
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

/// The release broca and, beside it (or `BROCA_BENCH_MOCK`), broca-mock.
fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let broca = support::bench_broca_binary()?;
    let mock = match std::env::var_os("BROCA_BENCH_MOCK").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => broca.with_file_name("broca-mock"),
    };
    if !mock.is_file() {
        return Err(format!(
            "the broca-mock binary {} does not exist (run `cargo build --release --bins` or set BROCA_BENCH_MOCK)",
            mock.display()
        ));
    }
    let mock = std::fs::canonicalize(&mock).map_err(|e| format!("{}: {e}", mock.display()))?;
    Ok((broca, mock))
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

/// Nearest-rank percentile of sorted samples, µs.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// CPU time (user + system) of this whole process so far.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a local.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn bench(h: &Harness) -> Result<(), Failure> {
    let work = h.rig_root().join("bench");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let raw = broca_testkit::raw_fsync_p50_us(&work, fsync_samples());
    report("fs.raw_fsync_us", raw, "us");

    wait_provider(h)?;
    let consumer =
        Consumer::connect(&h.connection_file(), None).map_err(|e| format!("the consumer connection: {e}"))?;
    let plane = Arc::new(ToolPlane::new(consumer));
    let plan = plan::decode(&json!({"tool_items": [{"provider": TOOLS, "params": {}}]}))
        .map_err(|r| format!("the plan: {r:?}"))?;

    let (call, sdk) = roundtrips(h, &plane, &plan)?;
    let (broca_p50, sdk_p50) = (percentile(&call.samples, 50.0), percentile(&sdk.samples, 50.0));
    report("tool.call_roundtrip_p50_us", broca_p50, "us");
    report("tool.call_roundtrip_p99_us", percentile(&call.samples, 99.0), "us");
    report("tool.sdk_roundtrip_p50_us", sdk_p50, "us");
    report("tool.sdk_roundtrip_p99_us", percentile(&sdk.samples, 99.0), "us");
    report("tool.call_roundtrip_cpu_us", call.cpu_per_call_us(), "us");
    report("tool.sdk_roundtrip_cpu_us", sdk.cpu_per_call_us(), "us");
    let ratio = broca_p50 / sdk_p50;
    println!(
        "# tool.call_roundtrip_p50_us / tool.sdk_roundtrip_p50_us = {ratio:.2} (target <= 1.5: {}); \
         cpu ratio {:.2}",
        if ratio <= 1.5 { "met" } else { "NOT met" },
        call.cpu_per_call_us() / sdk.cpu_per_call_us()
    );
    eprintln!(
        "tool-bench: {} samples each; broca min {:.0} max {:.0} us, sdk min {:.0} max {:.0} us",
        call.samples.len(),
        percentile(&call.samples, 0.0),
        percentile(&call.samples, 100.0),
        percentile(&sdk.samples, 0.0),
        percentile(&sdk.samples, 100.0)
    );

    let (with_tool, no_tool, in_loop_call) = loop_overhead(h, &plane, &plan, &work)?;
    report("loop.step_overhead_us.with_tool", with_tool, "us");
    println!(
        "# loop.step_overhead_us with NoTools, same config, this run = {no_tool:.3} us (with_tool - that = {:.3} us); \
         target of loop.step_overhead_us: 2 x raw + 300 = {:.0} us",
        with_tool - no_tool,
        2.0 * raw + 300.0
    );
    eprintln!("tool-bench: the loop's calls took {in_loop_call:.0} us each (median round mean)");
    Ok(())
}

/// Waits until the daemon routes to the tool provider (it registers after broca).
fn wait_provider(h: &Harness) -> Result<(), Failure> {
    let consumer = Consumer::connect(&h.connection_file(), None).map_err(|e| format!("a probe connection: {e}"))?;
    let body = serde_json::to_vec(&json!({"name": "role.describe", "arguments": {}})).expect("JSON");
    let until = Instant::now() + STEP;
    loop {
        match consumer.call_on(&provider_target(), &BindIdentity::new("runner", "probe"), &body, Duration::from_secs(1))
        {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= until => return Err(format!("the tool provider never answered: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn provider_target() -> RouteTarget {
    RouteTarget::ToolProvider { module_id: TOOLS.into() }
}

/// Per-call samples of one client and the process CPU they took.
#[derive(Default)]
struct Samples {
    samples: Vec<Duration>,
    cpu: Duration,
}

impl Samples {
    fn cpu_per_call_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.samples.len() as f64
    }
}

/// The arguments of every measured call.
fn arguments() -> Value {
    json!({"path": "src/lib.rs", "line": 42})
}

/// broca's tool plane and the SDK, the same `echo` call, in alternating blocks.
fn roundtrips(h: &Harness, plane: &ToolPlane, plan: &Plan) -> Result<(Samples, Samples), Failure> {
    // The session's plan fetched as admission does it: the frozen `echo` target (with its pin).
    let lineage = SessionKey::new("/bench", "tool-bench", "calls").addr();
    let fetched = fetch::fetch(plane, &lineage, plan).map_err(|r| format!("the plan fetch: {r:?}"))?;
    let spec = fetched.tools.iter().find(|t| t.name == TOOL).ok_or("the catalog has no echo tool")?;
    let target = CallTarget {
        module: spec.module.clone().ok_or("the echo tool names no module")?,
        preset: spec.preset.clone(),
        pin: spec.pin.clone(),
        send_call_key: false,
        tool_result_v1: false,
    };
    let call = ToolCall {
        run_id: "run-bench".into(),
        tool_call_id: "call-bench".into(),
        name: TOOL.into(),
        arguments: arguments(),
        call_key: format!("{lineage}:7"),
        target: Some(target),
        wait: CALL_WAIT,
    };
    let sdk_client = h.connect();
    let sdk = Sdk { consumer: sdk_client.consumer(), pin: spec.pin.clone() };

    let mut broca_samples = Samples::default();
    let mut sdk_samples = Samples::default();
    broca_block(plane, &call, warmup(), &mut Samples::default())?;
    h.block_on(sdk.block(warmup(), &mut Samples::default()))?;
    for block in 0..blocks() {
        if block % 2 == 0 {
            broca_block(plane, &call, per_block(), &mut broca_samples)?;
            h.block_on(sdk.block(per_block(), &mut sdk_samples))?;
        } else {
            h.block_on(sdk.block(per_block(), &mut sdk_samples))?;
            broca_block(plane, &call, per_block(), &mut broca_samples)?;
        }
    }
    broca_samples.samples.sort();
    sdk_samples.samples.sort();
    Ok((broca_samples, sdk_samples))
}

/// `n` sequential calls through `ToolDispatcher::call`, as the loop's helper thread makes them.
fn broca_block(plane: &ToolPlane, call: &ToolCall, n: usize, into: &mut Samples) -> Result<(), Failure> {
    let cancel = Cancel::default();
    let cpu = process_cpu();
    for _ in 0..n {
        let start = Instant::now();
        let outcome = plane.call(call, Instant::now() + CALL_WAIT, &cancel);
        into.samples.push(start.elapsed());
        match outcome {
            ToolOutcome::Completed(out) if !out.is_error && out.output["json"] == call.arguments => {}
            other => return Err(format!("a tool-plane call ended {other:?}")),
        }
    }
    into.cpu += process_cpu() - cpu;
    Ok(())
}

/// The SDK's side: the same request members broca sends, on the SDK's own connection.
struct Sdk<'a> {
    consumer: &'a SubcConsumer,
    pin: Option<String>,
}

impl Sdk<'_> {
    async fn block(&self, n: usize, into: &mut Samples) -> Result<(), Failure> {
        let identity = BindIdentity::new("runner", SessionKey::new("/bench", "tool-bench", "sdk").addr());
        let options = CallOptions { timeout: CALL_WAIT, ..Default::default() };
        let args = arguments();
        let cpu = process_cpu();
        for _ in 0..n {
            let start = Instant::now();
            let mut request = json!({"name": TOOL, "arguments": args, "tool_call_id": "call-bench"});
            if let Some(pin) = &self.pin {
                request["schema_pin"] = json!(pin);
            }
            let body = serde_json::to_vec(&request).expect("JSON");
            let reply = self.consumer.call(provider_target(), identity.clone(), body, options.clone()).await;
            let answer = reply.map(|bytes| serde_json::from_slice::<Value>(&bytes));
            into.samples.push(start.elapsed());
            match answer {
                Ok(Ok(v)) if v == args => {}
                other => return Err(format!("an SDK call ended {other:?}")),
            }
        }
        into.cpu += process_cpu() - cpu;
        Ok(())
    }
}

/// The loop's dispatcher: the tool plane, with the time spent inside each call.
struct Timed {
    plane: Arc<ToolPlane>,
    spent: Mutex<Vec<Duration>>,
}

impl ToolDispatcher for Timed {
    fn call(&self, call: &ToolCall, deadline: Instant, cancel: &Cancel) -> ToolOutcome {
        let start = Instant::now();
        let outcome = self.plane.call(call, deadline, cancel);
        self.spent.lock().expect("the timings").push(start.elapsed());
        outcome
    }
}

/// [`LOOP_STEPS`] responses: one `echo` call per step, then an answer.
fn loop_script() -> Script {
    let mut responses = Vec::new();
    for i in 0..LOOP_STEPS - 1 {
        responses.push(json!({"events": [
            {"text": "Checking the next file. "},
            {"tool_call": {"id": format!("call-{i}"), "name": TOOL, "arguments": {"path": format!("f{i}.txt")}}},
            {"usage": {"input": 100, "output": 20}}, {"finish": "tool_calls"}
        ]}));
    }
    responses.push(json!({"events": [{"text": "Done."}, {"usage": {"input": 100, "output": 2}}, {"finish": "stop"}]}));
    Script::from_json(&json!({"responses": responses}).to_string()).expect("script")
}

/// The per-step overhead with the tool plane and with `NoTools` (medians over the rounds), and
/// the loop's mean call time (median round).
fn loop_overhead(h: &Harness, plane: &Arc<ToolPlane>, plan: &Plan, work: &Path) -> Result<(f64, f64, f64), Failure> {
    let shared = Shared::open(StateRoot::at(&work.join("loop-root")).map_err(|e| format!("state root: {e:?}"))?)
        .map_err(|e| format!("shared: {e:?}"))?;
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let catalog = Catalog::load_lkg(&lkg).map_err(|e| format!("the catalog: {e:?}"))?;
    let request = ModelRequest { model: "mock/echo-chat".into(), ..Default::default() };
    let overrides =
        RouteOverrides { base_url_override: Some(h.mock.base_url(Some("tool-loop"))), ..Default::default() };
    let base: RenderConfig =
        route::resolve(Ok(&catalog), lkg, &request, &overrides).map_err(|e| format!("the route: {e:?}"))?;
    let client = HttpClient::default();
    let timed = Arc::new(Timed { plane: Arc::clone(plane), spent: Mutex::new(Vec::new()) });
    let (mut with_tool, mut no_tool, mut call_means) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..loop_rounds() {
        // The tool-plane run: its session fetched (route opened) as admission does.
        let key = SessionKey::new("/bench", "tool-bench", &format!("loop-{round}"));
        let fetched = fetch::fetch(plane, &key.addr(), plan).map_err(|r| format!("the plan fetch: {r:?}"))?;
        let mut config = base.clone();
        config.tools = fetched.tools;
        config.plan = Some(fetched.manifest);
        // Each run is paired with a bare pass just before it; the order flips every round.
        for with_plane in [round % 2 == 0, round % 2 != 0] {
            let bare = bare_per_step_us(h, &config)?;
            if with_plane {
                timed.spent.lock().expect("the timings").clear();
                let tools: Arc<dyn ToolDispatcher> = timed.clone();
                let looped = run_loop(h, &shared, &key, &config, &client, &tools)?;
                let spent = timed.spent.lock().expect("the timings").clone();
                if spent.len() != LOOP_STEPS - 1 {
                    return Err(format!("the tool run made {} calls, not {}", spent.len(), LOOP_STEPS - 1));
                }
                let in_calls: Duration = spent.iter().sum();
                let per_step = (looped - in_calls).as_secs_f64() * 1e6 / LOOP_STEPS as f64;
                with_tool.push(per_step - bare);
                call_means.push(in_calls.as_secs_f64() * 1e6 / spent.len() as f64);
            } else {
                // The same run with NoTools (the same tools in the request, every call an
                // error result at once).
                let key = SessionKey::new("/bench", "tool-bench", &format!("loop-notools-{round}"));
                let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
                let looped = run_loop(h, &shared, &key, &config, &client, &tools)?;
                no_tool.push(looped.as_secs_f64() * 1e6 / LOOP_STEPS as f64 - bare);
            }
            eprintln!("tool-bench: loop round {round}: bare {bare:.0} us/step");
        }
        eprintln!(
            "tool-bench: loop round {round}: overhead with tool {:.0} us/step, NoTools {:.0} us/step, call {:.0} us",
            with_tool[round], no_tool[round], call_means[round]
        );
    }
    Ok((median(with_tool), median(no_tool), median(call_means)))
}

/// A bare ureq client: one POST of the run's rendered request and the whole stream per step.
fn bare_per_step_us(h: &Harness, config: &RenderConfig) -> Result<f64, Failure> {
    h.mock.install("tool-bare", loop_script());
    let url = format!("{}/chat/completions", h.mock.base_url(Some("tool-bare")));
    let body = broca::provider::render_request(config, &[Message::user_text("go")]);
    let start = Instant::now();
    for _ in 0..LOOP_STEPS {
        let resp = ureq::post(&url)
            .header("content-type", "application/json")
            .send(&body[..])
            .map_err(|e| format!("bare post: {e}"))?;
        let mut sink = Vec::new();
        resp.into_body().into_reader().read_to_end(&mut sink).map_err(|e| format!("bare read: {e}"))?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / LOOP_STEPS as f64)
}

/// One [`LOOP_STEPS`]-step run on a fresh lineage: its wall time from `drive` to its end.
fn run_loop(
    h: &Harness,
    shared: &Shared,
    key: &SessionKey,
    config: &RenderConfig,
    client: &HttpClient,
    tools: &Arc<dyn ToolDispatcher>,
) -> Result<Duration, Failure> {
    h.mock.install("tool-loop", loop_script());
    let mut lineage = shared.open_lineage(key).map_err(|e| format!("lineage: {e:?}"))?;
    let (_tx, rx) = crossbeam_channel::unbounded();
    agent::admit(&mut lineage, "run-bench", None, config, Message::user_text("go"), None, None)
        .map_err(|e| format!("admit: {e:?}"))?;
    let start = Instant::now();
    let outcome = agent::drive(&mut lineage, client, tools, &rx, &LoopOptions::default(), &mut |_| {})
        .map_err(|e| format!("drive: {e:?}"))?;
    let looped = start.elapsed();
    if outcome.reason != Some(FinishReason::Completed) {
        return Err(format!("the bench run ended {:?}", outcome.reason));
    }
    Ok(looped)
}
