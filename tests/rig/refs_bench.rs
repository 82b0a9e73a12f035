//! `refs-bench`: reading output references (llm-runner §9.13) through the real subc daemon,
//! behind `make bench`. Prints `BENCH <name> <value> <unit>` lines on stdout; progress goes to
//! stderr. Nothing here asserts a figure.
//!
//! The rig is the tests' harness (as `tests/e2e_refs.rs` uses it) with the release broca
//! (`BROCA_BENCH_BROCA`, or `../broca` beside this example's directory) and the release
//! `broca-mock --subc` as the tool provider `mock-tools`, whose `logs` tool answers 60,000 bytes
//! of text and declares a token slot. Each session's plan opts into output references; its model
//! (the harness's `MockServer`) reads the log, then names it `$$tc(2)`.
//!
//! - `output_ref.read_mb_per_s`: snapshot bytes served per second by `session.output_ref_read`
//!   reading the whole 60,000-byte snapshot in one call, [`read_count`] calls back to back, on a
//!   session of four messages (decimal MB).
//! - `output_ref.read_mb_per_s.deep`: the same on a session whose reference sits after
//!   [`deep_turns`] earlier turns: a set is derived from the durable transcript at each read,
//!   so this shows what a long session costs.
//! - `output_ref.read_p50_us` / `output_ref.list_p50_us`: one whole-snapshot read, one
//!   `session.output_refs` page (shallow session).
//! - `output_ref.bare_request_p50_us`: a `session.head` on the same session and route in the
//!   same run: the round trip every read pays before any reference work.
//! - `output_ref.session_read_mb_per_s`: the same 60,000 stored bytes served by `session.read`
//!   (the tool message alone), for comparison.

use broca_mock::mock;
#[path = "../bench/quick.rs"]
mod quick;
#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Harness, Options, Session};

const TOOLS: &str = "mock-tools";
const OUTPUT_BYTES: usize = 60_000;
fn read_count() -> usize {
    quick::n(200, 10)
}
fn deep_turns() -> usize {
    quick::n(100, 5)
}

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        eprintln!("usage: refs-bench   (environment: BROCA_BENCH_BROCA, BROCA_BENCH_MOCK, BROCA_BENCH_DIR, RUST_LOG)");
        return ExitCode::SUCCESS;
    }
    let broca = match support::bench_broca_binary() {
        Ok(path) => path,
        Err(why) => {
            eprintln!("refs-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let mock_bin = match std::env::var_os("BROCA_BENCH_MOCK").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => broca.with_file_name("broca-mock"),
    };
    let base_dir = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let script = base_dir.join(format!("refs-bench-tools-{}.json", std::process::id()));
    let tools = json!({"tools": [{
        "name": "logs",
        "input_schema": {"type": "object"},
        "reference_slots": [{"name": "data", "kind": "token"}],
        "behaviour": {"big": {"bytes": OUTPUT_BYTES}},
    }]});
    if let Err(e) = std::fs::write(&script, tools.to_string()) {
        eprintln!("refs-bench: {}: {e}", script.display());
        return ExitCode::from(1);
    }
    let provider = json!({"program": mock_bin, "args": ["--tools", script], "env": {"CK_LOG": "warn"},
                          "enabled": true, "reserved": true});
    let opts = Options {
        broca,
        base_dir,
        ck_log: "warn".into(),
        test_writer: false,
        prefix: "brb".into(),
        modules: vec![(TOOLS.to_string(), provider)],
        ..Default::default()
    };
    let h = Harness::start_with(opts);
    let outcome = bench(&h);
    if let Err(why) = &outcome {
        eprintln!("refs-bench: {why}\n{}", h.broca_log_tail(30));
    }
    h.stop();
    let _ = std::fs::remove_file(&script);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

fn send(s: &Session, prompt: &str) -> Result<(), String> {
    let mut params = support::send_params(prompt);
    params["plan"] = json!({"tool_items": [{"provider": TOOLS, "params": {}, "output_refs": true}]});
    let run = s.call("session.send", params).map_err(|e| format!("send: {e:?}"))?;
    s.wait_run(run["run_id"].as_str().ok_or("no run id")?, "completed");
    Ok(())
}

/// A session whose last reply names the log after `turns` earlier turns: its reference's id.
fn session(h: &Harness, name: &str, turns: usize) -> Result<(Session, String, String), String> {
    let s = h.session("refs-bench", &h.unique(name), None);
    for i in 0..turns {
        h.install(json!({"responses": [text_step(&format!("noted {i}"))]}));
        send(&s, &format!("note {i}"))?;
    }
    let call =
        json!({"events": [{"tool_call": {"id": "c1", "name": "logs", "arguments": {}}}, {"finish": "tool_calls"}]});
    h.install(json!({"responses": [call, text_step("read it")]}));
    send(&s, "read the log")?;
    // The log's number: the user text and the call are the two numbered parts of this send.
    let tag = 2 * turns + 2;
    h.install(json!({"responses": [text_step(&format!("see $$tc({tag})"))]}));
    send(&s, "cite it")?;
    let page = s.ok("session.history", json!({"form": "display", "limit": 1}));
    let set = page["messages"][0]["row"]["output_refs"]["set_id"].as_str().ok_or("no reply set")?.to_owned();
    let records = s.ok("session.output_refs", json!({"set_id": set}));
    let record = &records["records"][0];
    if record["state"] != "resolved" || record["bytes"] != OUTPUT_BYTES {
        return Err(format!("the reference did not resolve to the log: {record}"));
    }
    Ok((s, set, record["ref_id"].as_str().unwrap_or_default().to_owned()))
}

/// `READS` whole-snapshot reads: (MB/s, per-read samples).
fn reads(s: &Session, ref_id: &str) -> Result<(f64, Vec<Duration>), String> {
    let params = json!({"ref_id": ref_id, "offset": 0, "length": 131_072});
    let mut samples = Vec::with_capacity(read_count());
    let mut bytes = 0usize;
    let started = Instant::now();
    for _ in 0..read_count() {
        let at = Instant::now();
        let reply = s.call("session.output_ref_read", params.clone()).map_err(|e| format!("read: {e:?}"))?;
        samples.push(at.elapsed());
        bytes += reply["data"].as_str().map_or(0, |d| d.len() / 4 * 3);
    }
    Ok((bytes as f64 / started.elapsed().as_secs_f64() / 1e6, samples))
}

fn bench(h: &Harness) -> Result<(), String> {
    support::wait_tool_provider(h, TOOLS);
    let (shallow, set, ref_id) = session(h, "shallow", 0)?;
    let (deep, _, deep_ref) = session(h, "deep", deep_turns())?;
    let _ = reads(&shallow, &ref_id)?;
    let (mb_s, samples) = reads(&shallow, &ref_id)?;
    let (deep_mb_s, _) = reads(&deep, &deep_ref)?;
    let time = |method: &str, params: Value| -> Result<Vec<Duration>, String> {
        (0..read_count())
            .map(|_| {
                let at = Instant::now();
                shallow.call(method, params.clone()).map_err(|e| format!("{method}: {e:?}"))?;
                Ok(at.elapsed())
            })
            .collect()
    };
    let list = time("session.output_refs", json!({"set_id": set}))?;
    let bare = time("session.head", json!({}))?;
    let whole_read = time("session.read", json!({"from_ordinal": 3, "limit": 1}))?;
    let read_total: f64 = whole_read.iter().map(Duration::as_secs_f64).sum();
    report("output_ref.read_mb_per_s", mb_s, "MB/s");
    report("output_ref.read_mb_per_s.deep", deep_mb_s, "MB/s");
    report("output_ref.read_p50_us", p50(samples), "us");
    report("output_ref.list_p50_us", p50(list), "us");
    report("output_ref.bare_request_p50_us", p50(bare), "us");
    report("output_ref.session_read_mb_per_s", (read_count() * OUTPUT_BYTES) as f64 / read_total / 1e6, "MB/s");
    Ok(())
}
