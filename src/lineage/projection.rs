//! The control projection (spec §7): each record yields zero or more ordered control units,
//! addressed by the durable cursor `(wal_seq, sub_index)`.
//!
//! The projection is a pure function of one record, so projecting a WAL twice, in one process
//! or across a reopen, yields identical units at identical cursors. Display deltas are never
//! projected; a finished turn shows assembled messages.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::record::{Record, ORPHAN_PROVIDER_CODE};

/// A durable control-stream position. Ordered by `(wal_seq, sub_index)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Cursor {
    pub wal_seq: u64,
    pub sub_index: u32,
}

/// One durable unit of the control stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlUnit {
    pub cursor: Cursor,
    pub unit: Value,
}

/// Projects the record at `seq` into its units.
pub fn project(seq: u64, record: &Record) -> Vec<ControlUnit> {
    let bodies = unit_bodies(record);
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, unit)| ControlUnit { cursor: Cursor { wal_seq: seq, sub_index: i as u32 }, unit })
        .collect()
}

/// How many units `project` yields for `record`, without building them (replay uses it to
/// keep the head cursor). Must agree with `unit_bodies` (tested).
pub fn unit_count(record: &Record) -> usize {
    match record {
        Record::RunStarted(r) => 2 + usize::from(r.submission_id.is_some()),
        Record::RunFinished { error, .. } => {
            1 + usize::from(error.as_ref().is_some_and(|e| e.provider_code.as_deref() == Some(ORPHAN_PROVIDER_CODE)))
        }
        Record::CacheWarmed { .. } | Record::Unknown(_) => 0,
        _ => 1,
    }
}

fn unit_bodies(record: &Record) -> Vec<Value> {
    match record {
        Record::RunStarted(r) => {
            let mut started = json!({"type": "run_started", "run_id": r.run_id});
            let mut units = Vec::with_capacity(3);
            if let Some(sub) = &r.submission_id {
                started["submission_id"] = json!(sub);
                units.push(json!({"type": "submission_started", "submission_id": sub, "run_id": r.run_id}));
            }
            units.insert(0, started);
            units.push(json!({"type": "user_message", "run_id": r.run_id, "message": r.input}));
            units
        }
        Record::StepStarted { run_id, step, .. } => {
            vec![json!({"type": "step_started", "run_id": run_id, "step": step})]
        }
        Record::ModelAttemptFinished(a) => {
            let mut unit = json!({"type": "model_attempt_finished", "run_id": a.run_id, "step": a.step, "attempt": a.attempt, "outcome": a.outcome});
            if let Some(e) = &a.error {
                unit["error"] = json!(e);
            }
            for (k, v) in &a.telemetry {
                unit[k] = v.clone();
            }
            vec![unit]
        }
        Record::ModelStepFinished { run_id, step, finish_reason, usage, message, .. } => vec![json!({
            "type": "assistant_message", "run_id": run_id, "step": step, "finish_reason": finish_reason,
            "usage": usage, "message": message,
        })],
        Record::ToolDispatchIntent { run_id, tool_call_id, tool_name, module_id, .. } => {
            let mut unit =
                json!({"type": "tool_started", "run_id": run_id, "tool_call_id": tool_call_id, "name": tool_name});
            if let Some(m) = module_id {
                unit["module"] = json!(m);
            }
            vec![unit]
        }
        Record::ToolResult { tool_call_id, output, is_error, .. } => vec![json!({
            "type": "tool_result", "result": {"tool_call_id": tool_call_id, "output": output, "is_error": is_error},
        })],
        Record::RunCancelRequested { run_id, at } => {
            vec![json!({"type": "run_cancel_requested", "run_id": run_id, "at": at})]
        }
        Record::RunPaused { run_id, reason, error } => {
            let mut unit = json!({"type": "run_paused", "run_id": run_id, "reason": reason});
            if let Some(e) = error {
                unit["error"] = json!(e);
            }
            vec![unit]
        }
        Record::RunResumed { run_id } => vec![json!({"type": "run_resumed", "run_id": run_id})],
        Record::RunFinished {
            run_id,
            reason,
            error,
            usage,
            retries_used,
            final_step_finish_reason,
            indeterminate_tool_calls,
            ..
        } => {
            let mut units = Vec::with_capacity(2);
            if let Some(e) = error.as_ref().filter(|e| e.provider_code.as_deref() == Some(ORPHAN_PROVIDER_CODE)) {
                units.push(json!({"type": "error", "run_id": run_id, "error": e}));
            }
            let mut unit = json!({"type": "run_finished", "run_id": run_id, "reason": reason, "usage": usage, "retries_used": retries_used});
            if let Some(f) = final_step_finish_reason {
                unit["final_step_finish_reason"] = json!(f);
            }
            if !indeterminate_tool_calls.is_empty() {
                unit["indeterminate_tool_calls"] = json!(indeterminate_tool_calls);
            }
            if let Some(e) = error {
                unit["error"] = json!(e);
            }
            units.push(unit);
            units
        }
        Record::Queued { submission_id, .. } => {
            vec![json!({"type": "submission_queued", "submission_id": submission_id})]
        }
        Record::Retracted { submission_id } => {
            vec![json!({"type": "submission_retracted", "submission_id": submission_id})]
        }
        Record::Steered { run_id, submission_id, message } => vec![json!({
            "type": "steered", "run_id": run_id, "submission_id": submission_id, "message": message,
        })],
        Record::CacheWarmed { .. } | Record::Unknown(_) => Vec::new(),
    }
}
