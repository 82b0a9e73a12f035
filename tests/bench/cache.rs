//! Prompt caching over a 20-step tool loop (#28): the loop runs against broca-mock with
//! measured usage (`{"usage": {"measured": true}}`: the mock's model of the provider's prompt
//! cache, `mock/wire/src/prompt_cache.rs`), so the cache tokens are what the provider
//! would report for the requests broca really rendered.
//!
//! - `cache.read_share.<family>`: cached input tokens / all input tokens over steps 2–20.
//! - `cache.billed_input_ratio.anthropic`: input billed at Anthropic's published cache prices
//!   (reads 0.1×, five-minute writes 1.25×) / the same tokens uncached, over all 20 steps.
//! - `cache.read_share.anthropic.unmarked`, the baseline taken in the same run: the run's own
//!   20 Anthropic requests with their `cache_control` markers removed (what broca sent before
//!   it rendered them), measured by a fresh model of the same provider cache.

use std::path::Path;
use std::sync::Arc;

use broca::agent::{self, LoopOptions, NoTools, ToolDispatcher};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::lineage::Shared;
use broca::message::{Message, StepUsage};
use broca::provider::client::HttpClient;
use broca::provider::event::Family;
use broca::record::{FinishReason, Record};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wal::{self, ScannedFrame, WalError};
use broca_mock::mock::prompt_cache::PromptCache;
use broca_mock::mock::{MockServer, Script};

const STEPS: usize = 20;

/// A coding agent's standing instructions: about 2,700 tokens, the prefix every step resends.
fn system_prompt() -> String {
    let rule = "Read the file before you change it; keep each change small and say why in the commit message. ";
    rule.repeat(110)
}

/// 19 steps calling a tool, then an answer; every step's usage measured by the mock.
fn script() -> Script {
    let usage = serde_json::json!({"usage": {"measured": true, "output": 20}});
    let mut responses = Vec::new();
    for i in 0..STEPS - 1 {
        responses.push(serde_json::json!({"events": [
            {"text": format!("Reading the next file (step {i}). ")},
            {"tool_call": {"id": format!("call-{i}"), "name": "read", "arguments": {"path": format!("src/f{i}.rs")}}},
            usage, {"finish": "tool_calls"}
        ]}));
    }
    responses.push(serde_json::json!({"events": [{"text": "Done."}, usage, {"finish": "stop"}]}));
    Script::from_json(&serde_json::json!({"responses": responses}).to_string()).expect("script")
}

/// Each step's usage of one 20-step run of `model` at `mock`'s `lane`.
fn run(dir: &Path, mock: &MockServer, model: &str, lane: &str) -> Vec<StepUsage> {
    let lkg: serde_json::Value =
        serde_json::from_str(include_str!("../../testdata/catalog/fusiform-lkg.json")).expect("lkg");
    let catalog = Catalog::from_response(&lkg["response"]).expect("catalog");
    let req = ModelRequest { model: model.into(), ..Default::default() };
    let overrides = RouteOverrides { base_url_override: Some(mock.base_url(Some(lane))), ..Default::default() };
    let mut config = route::resolve(Ok(&catalog), dir.join("lkg"), &req, &overrides).expect("route");
    config.system = Some(system_prompt());
    config.policy.conversation_key = Some(format!("bench-{lane}"));
    mock.install(lane, script());
    let shared = Shared::open(StateRoot::at(&dir.join(lane)).expect("state root")).expect("shared");
    let mut lineage = shared.open_lineage(&SessionKey::new("/bench", "bench", lane)).expect("lineage");
    agent::admit(&mut lineage, "run-cache", None, &config, Message::user_text("Tidy src/."), None, None)
        .expect("admit");
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    let (_tx, rx) = crossbeam_channel::unbounded();
    let client = HttpClient::default();
    let outcome =
        agent::drive(&mut lineage, &client, &tools, &rx, &LoopOptions::default(), &mut |_| {}).expect("drive");
    assert_eq!(outcome.reason, Some(FinishReason::Completed), "the cache bench run completes");
    let mut steps = Vec::new();
    wal::read::<WalError>(lineage.wal_path(), broca::record::KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        if let Ok(Record::ModelStepFinished { usage, .. }) = Record::decode(f.payload) {
            steps.push(usage);
        }
        Ok(())
    })
    .expect("the bench WAL reads");
    assert_eq!(steps.len(), STEPS, "one step record per step");
    steps
}

fn tokens(u: &StepUsage) -> (f64, f64, f64) {
    let n = |v: Option<u64>| v.unwrap_or(0) as f64;
    (n(u.input_tokens), n(u.cached_input_tokens), n(u.cache_write_tokens))
}

/// Cached input / all input over steps 2–20.
fn read_share(steps: &[StepUsage]) -> f64 {
    let (cached, all) = steps[1..].iter().map(tokens).fold((0.0, 0.0), |(c, a), (i, r, w)| (c + r, a + i + r + w));
    cached / all
}

/// Anthropic's cache prices over the run (reads 0.1×, five-minute writes 1.25×) / uncached.
fn billed_ratio(steps: &[StepUsage]) -> f64 {
    let (billed, all) =
        steps.iter().map(tokens).fold((0.0, 0.0), |(b, a), (i, r, w)| (b + i + 0.1 * r + 1.25 * w, a + i + r + w));
    billed / all
}

/// The read share of `lane`'s recorded requests with every `cache_control` removed.
fn unmarked_read_share(mock: &MockServer, lane: &str) -> f64 {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                o.remove("cache_control");
                o.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut cache = PromptCache::default();
    let now = std::time::Instant::now();
    let steps: Vec<StepUsage> = mock
        .requests(lane)
        .iter()
        .filter_map(|r| r.body_json())
        .map(|mut body| {
            strip(&mut body);
            let u = cache.measure(Family::AnthropicMessages, &body, now);
            StepUsage {
                input_tokens: u.input,
                cached_input_tokens: u.cached,
                cache_write_tokens: u.cache_write,
                ..StepUsage::default()
            }
        })
        .collect();
    read_share(&steps)
}

/// The figures: (name, value, unit).
pub fn figures(dir: &Path) -> Vec<(&'static str, f64, &'static str)> {
    let mock = MockServer::start("127.0.0.1:0").expect("mock");
    let anthropic = run(dir, &mock, "anthropic/claude-sonnet-4-5", "cache-anthropic");
    let responses = run(dir, &mock, "openai/gpt-5.6-luna", "cache-responses");
    vec![
        ("cache.read_share.anthropic.unmarked", unmarked_read_share(&mock, "cache-anthropic"), "ratio"),
        ("cache.read_share.anthropic", read_share(&anthropic), "ratio"),
        ("cache.read_share.openai_responses", read_share(&responses), "ratio"),
        ("cache.billed_input_ratio.anthropic", billed_ratio(&anthropic), "ratio"),
    ]
}
