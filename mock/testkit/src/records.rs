//! Record builders shared by tests, property checks and benchmarks. Not part of the engine.
//!
//! Written against `crate::message` and `crate::record`, with no other path into broca: this
//! package imports those two at its root, and broca's own unit tests include this file by path
//! (`src/replay/tests.rs`), where they are broca's modules.

use serde_json::json;

use crate::message::{Message, Part, Role, StepUsage};
use crate::record::{Origin, Record, RunStarted};

pub fn run_started(run_id: &str, submission_id: Option<&str>, prompt: &str) -> Record {
    Record::RunStarted(Box::new(RunStarted {
        run_id: run_id.into(),
        submission_id: submission_id.map(String::from),
        origin: Origin::Fresh,
        config: crate::record::Frozen::Unreadable(json!({"provider": "mock", "model": "mock-model", "max_steps": 8})),
        input: Message::user_text(prompt),
        title: None,
        started_at_ms: 1_700_000_000_000,
        auth_selection: None,
        owner: None,
    }))
}

pub fn step_started(run_id: &str, step: u64) -> Record {
    Record::StepStarted { run_id: run_id.into(), step, at_ms: 1_700_000_000_000 + step, code_assist_project: None }
}

/// A model step answering `text`, calling the tools named in `calls` (`(id, name)`).
pub fn model_step(run_id: &str, step: u64, text: &str, calls: &[(&str, &str)]) -> Record {
    model_step_at(run_id, step, text, calls, None)
}

/// [`model_step`] answered at `at_ms` (the assistant message's `written_at`).
pub fn model_step_at(run_id: &str, step: u64, text: &str, calls: &[(&str, &str)], at_ms: Option<u64>) -> Record {
    let mut content = vec![Part::Text { text: text.into() }];
    for (id, name) in calls {
        content.push(Part::ToolCall {
            tool_call_id: (*id).into(),
            tool_name: (*name).into(),
            input: json!({"path": "x"}),
        });
    }
    Record::ModelStepFinished {
        run_id: run_id.into(),
        step,
        finish_reason: if calls.is_empty() { "stop" } else { "tool_calls" }.into(),
        usage: StepUsage { input_tokens: Some(10), output_tokens: Some(5), ..Default::default() },
        message: Message::of(Role::Assistant, content),
        provider: "mock".into(),
        model: "mock-model".into(),
        variant: None,
        at_ms,
        service_tier_applied: None,
        service_tier_served: None,
    }
}

pub fn intent(run_id: &str, step: u64, id: &str, name: &str) -> Record {
    Record::ToolDispatchIntent {
        run_id: run_id.into(),
        step,
        tool_call_id: id.into(),
        tool_name: name.into(),
        module_id: None,
        call_key: format!("{run_id}:{id}"),
        arguments: None,
        at_ms: None,
    }
}

pub fn tool_result(run_id: &str, step: u64, id: &str, text: &str) -> Record {
    Record::ToolResult {
        run_id: run_id.into(),
        step,
        tool_call_id: id.into(),
        output: json!({"kind": "text", "text": text}),
        is_error: false,
        outcome: Some(crate::record::CallOutcome::Ok),
        at_ms: None,
        refused: None,
    }
}

/// The physical anchor every durability figure is read against: p50 of `samples` bare 1 KiB
/// appends, each followed by an fdatasync, in `dir` (µs).
pub fn raw_fsync_p50_us(dir: &std::path::Path, samples: usize) -> f64 {
    raw_fsync_paced_p50_us(dir, samples, std::time::Duration::ZERO)
}

/// [`raw_fsync_p50_us`] with `pause` between one fsync and the next write, as a loop that does
/// other work between its barriers has: on this machine's disk an fsync costs more the longer
/// the device sat idle before it.
pub fn raw_fsync_paced_p50_us(dir: &std::path::Path, samples: usize, pause: std::time::Duration) -> f64 {
    use std::io::Write;
    let path = dir.join("raw-fsync");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("raw file");
    let block = [0x5au8; 1024];
    let mut times: Vec<std::time::Duration> = (0..samples.max(1))
        .map(|_| {
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
            let t = std::time::Instant::now();
            f.write_all(&block).expect("write");
            f.sync_data().expect("fsync");
            t.elapsed()
        })
        .collect();
    let _ = std::fs::remove_file(path);
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}
