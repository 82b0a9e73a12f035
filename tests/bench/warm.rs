//! `session.warm` latency (#28): a warm through the module's op path (the actor decides and
//! snapshots, the warm's own thread sends Anthropic's zero-output request to broca-mock, the
//! actor records `cache_warmed` with its fsync, then answers) beside a bare request, the same
//! warm body POSTed to the same mock with a plain ureq agent, measured in the same run.
//!
//! - `warm.latency_us`: median wall time of one `session.warm`, request to answer.
//! - `warm.bare_request_us`: median of the bare request (the provider's share).
//! - `warm.raw_fsync_us`: a raw fsync on the same disk in the same run (a warm pays one).
//! - `warm.ratio_to_bare`: the two side by side; `warm.overhead_less_fsync_us`: what broca adds
//!   beyond the provider's time and its one fsync (decision, WAL rebuild and render, thread).

use crate::quick;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::catalog::Catalog;
use broca::module::ModuleBuilder;
use broca::ops::Ops;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use broca_mock::mock::{MockServer, Script};
use serde_json::{json, Value};

fn samples() -> usize {
    quick::n(50, 3)
}
const LANE: &str = "warm";

fn call(ops: &Arc<Ops>, key: &SessionKey, method: &str, params: Value) -> Result<Value, Refusal> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    ops.handle(key, method, params, Box::new(move |r| tx.send(r).expect("answer")));
    rx.recv_timeout(Duration::from_secs(30)).expect("an answer in time")
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// The figures: (name, value, unit).
pub fn figures(dir: &Path) -> Vec<(&'static str, f64, &'static str)> {
    let mock = MockServer::start("127.0.0.1:0").expect("mock");
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let ops = ModuleBuilder::new(StateRoot::at(&dir.join("warm")).expect("state root"))
        .catalog(Catalog::load_lkg(&lkg))
        .base_url_override(Some(mock.base_url(Some(LANE))))
        .build()
        .expect("module")
        .ops;
    let key = SessionKey::new(&dir.to_string_lossy(), "bench", "warm");
    let answer = json!({"events": [{"text": "noted"}, {"usage": {"measured": true, "output": 3}}, {"finish": "stop"}]});
    mock.install(LANE, Script::from_json(&json!({"responses": [answer]}).to_string()).expect("script"));
    let system = "Read the file before you change it; keep each change small. ".repeat(110);
    let send = json!({"prompt": "Tidy src/.", "system": system, "cache": {"role": "primary"},
                      "model": {"provider": "anthropic", "model": "claude-sonnet-4-5"}});
    let run = call(&ops, &key, "session.send", send).expect("send")["run_id"].as_str().expect("run id").to_owned();
    let until = Instant::now() + Duration::from_secs(30);
    while call(&ops, &key, "run.status", json!({"run_id": run})).expect("status")["state"] != "completed" {
        assert!(Instant::now() < until, "the warm bench's run never completed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut warms = Vec::with_capacity(samples());
    for _ in 0..samples() {
        let start = Instant::now();
        call(&ops, &key, "session.warm", json!({})).expect("warm");
        warms.push(start.elapsed());
    }
    let body = mock.requests(LANE).last().expect("a warm was sent").body.clone();
    let agent = ureq::Agent::config_builder().proxy(None).max_redirects(5).build().new_agent();
    let url = format!("{}/messages", mock.base_url(Some(LANE)));
    let mut bare = Vec::with_capacity(samples());
    for _ in 0..samples() {
        let start = Instant::now();
        let resp = agent
            .post(&url)
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .send(&body[..])
            .expect("bare warm");
        resp.into_body().read_to_string().expect("bare answer");
        bare.push(start.elapsed());
    }
    let (warm, bare) = (median_us(warms), median_us(bare));
    // The warm's own fsync (its record is durable before it answers), on this disk now.
    let fsync = broca_testkit::raw_fsync_p50_us(dir, 200);
    vec![
        ("warm.latency_us", warm, "us"),
        ("warm.bare_request_us", bare, "us"),
        ("warm.raw_fsync_us", fsync, "us"),
        ("warm.ratio_to_bare", warm / bare, "x"),
        ("warm.overhead_less_fsync_us", warm - bare - fsync, "us"),
    ]
}
