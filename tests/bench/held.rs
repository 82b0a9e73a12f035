//! Held calls (#30): how fast a late result turns into the run's next model request.
//!
//! In process: a module whose tool dispatcher answers every call as held by its provider, so a
//! run pauses `tool_held` exactly as under a real `late_results` provider; then the late result
//! is handed to the session's actor the way a puller hands it (`Registry::deliver_late`) and the
//! clock stops when broca-mock records the run's next model request.
//!
//! - `held.resume_latency_us`: median, late result taken in → next model request received (the
//!   result's write and fsync, the resume, the render and the send).
//! - `held.resume_latency_min_us`: the fastest sample (this machine's fsyncs vary tenfold).
//! - `held.bare_request_us`: a bare request to the same mock in the same run (ureq, same body).
//! - `held.raw_fsync_us`: a raw fsync on the same disk (a delivery pays one).
//! - `held.overhead_less_fsyncs_us`: what broca adds beyond the provider's time and its two
//!   fsyncs (the late result's write, then the next step's `StepStarted` barrier).

use crate::quick;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::agent::{Cancel, ToolCall, ToolDispatcher, ToolOutcome};
use broca::catalog::Catalog;
use broca::held::intake::Registration;
use broca::held::{LateAck, LateOutcome};
use broca::module::ModuleBuilder;
use broca::ops::Ops;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use broca_mock::mock::{MockServer, Script};
use serde_json::{json, Value};

fn samples() -> usize {
    quick::n(40, 3)
}
const LANE: &str = "held";

/// Every call is held by its provider.
struct Holding;

impl ToolDispatcher for Holding {
    fn call(&self, _call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
        ToolOutcome::Held { reason: "consent".into() }
    }
}

fn call(ops: &Arc<Ops>, key: &SessionKey, method: &str, params: Value) -> Result<Value, Refusal> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    ops.handle(key, method, params, Box::new(move |r| tx.send(r).expect("answer")));
    rx.recv_timeout(Duration::from_secs(30)).expect("an answer in time")
}

fn wait_status(ops: &Arc<Ops>, key: &SessionKey, run: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let status = call(ops, key, "run.status", json!({"run_id": run})).expect("status");
        if ready(&status) {
            return status;
        }
        assert!(Instant::now() < until, "the held bench's run stalled: {status}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// The figures: (name, value, unit).
pub fn figures(dir: &Path) -> Vec<(&'static str, f64, &'static str)> {
    let mock = MockServer::start("127.0.0.1:0").expect("mock");
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let module = ModuleBuilder::new(StateRoot::at(&dir.join("held")).expect("state root"))
        .catalog(Catalog::load_lkg(&lkg))
        .base_url_override(Some(mock.base_url(Some(LANE))))
        .tools(Arc::new(Holding))
        .build()
        .expect("module");
    let (ops, registry) = (module.ops, module.registry);
    let call_step =
        json!({"events": [{"tool_call": {"id": "c1", "name": "approve", "arguments": {}}}, {"finish": "tool_calls"}]});
    let text_step = json!({"events": [{"text": "approved"}, {"finish": "stop"}]});
    let mut resumes = Vec::with_capacity(samples());
    for i in 0..samples() {
        // A session per sample: the figure is one resume, not a transcript growing with the bench.
        let key = SessionKey::new(&dir.to_string_lossy(), "bench", &format!("held-{i}"));
        mock.install(
            LANE,
            Script::from_json(&json!({"responses": [call_step, text_step]}).to_string()).expect("script"),
        );
        let send = json!({"prompt": format!("approve #{i}"), "model": {"provider": "mock", "model": "echo-chat"},
                          "tools": [{"name": "approve", "input_schema": {"type": "object"}}]});
        let run = call(&ops, &key, "session.send", send).expect("send")["run_id"].as_str().expect("run id").to_owned();
        let status = wait_status(&ops, &key, &run, |s| s["held_calls"].is_array());
        let reg = Registration {
            call_key: status["held_calls"][0]["call_key"].as_str().expect("call key").to_owned(),
            key: key.clone(),
            run_id: run.clone(),
            tool_call_id: "c1".into(),
            module: String::new(),
        };
        let start = Instant::now();
        assert_eq!(registry.deliver_late(&reg, LateOutcome::Result(json!("approved by a person"))), LateAck::Delivered);

        let until = start + Duration::from_secs(30);
        let sent = loop {
            if let Some(at) = mock.last_request_at().filter(|at| *at > start) {
                break at;
            }
            assert!(Instant::now() < until, "the resumed run sent no model request");
            std::hint::spin_loop();
        };
        resumes.push(sent - start);

        wait_status(&ops, &key, &run, |s| s["state"] == "completed");
    }
    let body = mock.requests(LANE).last().expect("a request").body.clone();
    let agent = ureq::Agent::config_builder().proxy(None).max_redirects(5).build().new_agent();
    let url = format!("{}/chat/completions", mock.base_url(Some(LANE)));
    let mut bare = Vec::with_capacity(samples());
    for _ in 0..samples() {
        let start = Instant::now();
        let resp = agent.post(&url).header("content-type", "application/json").send(&body[..]).expect("bare request");
        resp.into_body().read_to_string().expect("bare answer");
        bare.push(start.elapsed());
    }
    let fastest = resumes.iter().min().copied().unwrap_or_default().as_secs_f64() * 1e6;
    let (resume, bare) = (median_us(resumes), median_us(bare));
    let fsync = broca_testkit::raw_fsync_p50_us(dir, 200);
    vec![
        ("held.resume_latency_us", resume, "us"),
        ("held.resume_latency_min_us", fastest, "us"),
        ("held.bare_request_us", bare, "us"),
        ("held.raw_fsync_us", fsync, "us"),
        ("held.overhead_less_fsyncs_us", resume - bare - 2.0 * fsync, "us"),
    ]
}
