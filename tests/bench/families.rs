//! The wire families beside each other (#29): for each family #29 added, the loop's per-step
//! overhead against broca-mock (as `loop.step_overhead_us` measures Chat's: the loop's wall
//! time per step minus a bare client's on the same requests, 7 rounds) beside the step budget
//! `2 × raw fsync + 300 µs`, and the family's decoder throughput: framing and decoding a long
//! recorded answer (text deltas and a tool call) in memory, in MB/s of wire bytes.

use crate::quick;
use std::path::Path;
use std::time::Instant;

use broca::frozen::AuthMethod;
use broca::provider::event::Family;
use broca_mock::mock::render::{bytes, render, RenderCtx};
use broca_mock::mock::script::{Step, ToolCall};

use super::{loop_step_overhead_of, report, BenchModel};

fn rounds() -> usize {
    quick::n(7, 1)
}

/// (family, the model and auth method that route to it).
const FAMILIES: [(Family, BenchModel); 5] = [
    (Family::GoogleGenerateContent, BenchModel { model: "mock/echo-gemini", auth: AuthMethod::ApiKey }),
    (Family::GoogleCodeAssist, BenchModel { model: "mock/antigravity-echo-gemini", auth: AuthMethod::Antigravity }),
    (Family::AwsBedrockConverse, BenchModel { model: "mock/echo-bedrock", auth: AuthMethod::ApiKey }),
    (Family::OpenaiChatgptResponses, BenchModel { model: "mock/echo-responses", auth: AuthMethod::Chatgpt }),
    (Family::OpenaiChat, BenchModel { model: "mock/echo-chat", auth: AuthMethod::ApiKey }),
];

/// Every family's figures, printed as `BENCH` lines.
pub fn report_all(dir: &Path, raw_fsync_us: f64) {
    report("loop.step_budget_us", 2.0 * raw_fsync_us + 300.0, "us");
    for (family, bench) in &FAMILIES {
        let figures = loop_step_overhead_of(dir, bench, rounds());
        let name = family.as_str();
        report(&format!("loop.step_overhead_us.{name}"), figures.overhead_us, "us");
        report(&format!("decode.mb_per_s.{name}"), decode_mb_per_s(*family), "MB/s");
    }
}

/// Framing and decoding throughput of one long answer, repeated.
fn decode_mb_per_s(family: Family) -> f64 {
    let mut steps: Vec<Step> = (0..2000).map(|i| Step::Text(format!("word {i} of a long answer, "))).collect();
    steps.push(Step::ToolCall(ToolCall::new("call-1", "read", r#"{"path":"src/main.rs","limit":200}"#, 8)));
    steps.push(Step::Finish("tool_calls".into()));
    let ctx = RenderCtx { model: "bench".into(), id: "1".into(), created: 0, served_tier: None };
    let wire = bytes(&render(family, &steps, &ctx));
    let rounds = 20;
    let start = Instant::now();
    let mut events = 0usize;
    for _ in 0..rounds {
        let mut framer = broca::provider::wire(family).framer();
        let mut decoder = broca::provider::wire(family).decoder();
        let mut out = Vec::new();
        for chunk in wire.chunks(16 << 10) {
            for event in framer.push(chunk).expect("frames").events {
                out.clear();
                decoder.decode(&event, &mut out).expect("decodes");
                events += out.len();
            }
        }
        assert!(decoder.finished(), "{family:?}: the recorded answer ends");
    }
    assert!(events > 2000 * rounds, "every delta decoded");
    (wire.len() * rounds) as f64 / start.elapsed().as_secs_f64() / 1e6
}
