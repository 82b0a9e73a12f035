//! The control projection (spec §7): each record yields zero or more ordered control units,
//! addressed by the durable cursor `(wal_seq, sub_index)`.
//!
//! The projection is a pure function of one record and the [`Context`] the replay gives it at
//! that record (the message ordinals it touches), so projecting a WAL twice, in one process or
//! across a reopen, yields identical units at identical cursors. Every path applies the replay
//! to know the context ([`apply`]). Display deltas are never projected; a finished turn shows
//! assembled messages.
//!
//! A unit with an llm-runner/v1 equivalent also carries that role's typed live event
//! (`session.subscribe` `event`): `run_started`, `message_started`, `message_finished`,
//! `tool_started`, `tool_finished`, `run_finished`, `run_paused`.
//!
//! Every stored message gets two units (CONTRACT §7.1): a `message_started` unit, then the unit
//! that carries the message with its `message_finished`. A closed tool batch's tool message has
//! no unit of its own among its results, so the record that closes the batch (`StepStarted`,
//! `RunFinished`, `Steered`) leads with that pair for it: `message_started`, then `tool_message`.

use cortexkit_role_llm_runner::live::{LiveEvent, MessageEvent, RunEnded, RunStarted, ToolFinished, ToolStarted};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::message::Role;
use crate::record::{self, CallOutcome, Record, ORPHAN_PROVIDER_CODE};
use crate::replay::{Effect, Replay, ReplayError};

pub use crate::replay::Cursor;

/// One durable unit of the control stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlUnit {
    pub cursor: Cursor,
    pub unit: Value,
    /// The llm-runner/v1 live event of this unit, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<LiveEvent>,
}

/// What the replay knows at a record that its units name: message ordinals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// The ordinal of the message the record itself added to the conversation (a `RunStarted`'s
    /// input, a `Steered` message, a `ModelStepFinished` answer).
    pub message: Option<u64>,
    /// The ordinal of the tool message the record added by closing the open tool batch.
    pub tool_message: Option<u64>,
    /// The ordinal of the assistant message whose tool calls the current batch runs.
    pub assistant: Option<u64>,
    /// The module a `ToolResult`'s call was dispatched to.
    pub dispatched_to: Option<String>,
    /// The `send_id` of the queued send a `RunStarted` consumes (`run_started.send_id`).
    pub send_id: Option<String>,
}

/// The message id (`mid`) of the message at internal `ordinal`, as the role spells it: `m`
/// and its served ordinal.
pub fn mid(ordinal: u64) -> String {
    format!("m{}", served_ordinal(ordinal))
}

/// The ordinal reads serve for internal `ordinal`: llm-runner/v1 counts entries from 1, broca's
/// replay and store from 0.
pub const fn served_ordinal(ordinal: u64) -> u64 {
    ordinal + 1
}

/// Applies `record` at `seq` to `replay` (reporting effects to `sink`), notes its units and
/// returns them, projected with the context the replay gives. The one way the writer and every
/// reader turn a record into units, so they agree.
pub fn apply(
    replay: &mut Replay,
    seq: u64,
    record: &Record,
    sink: &mut dyn FnMut(Effect),
) -> Result<Vec<ControlUnit>, ReplayError> {
    // Read before the replay consumes the send the run starts from.
    let send_id = match record {
        Record::RunStarted(r) => {
            r.submission_id.as_deref().and_then(|s| replay.pending(s)).and_then(|p| p.request.send_id.clone())
        }
        _ => None,
    };
    let (mut message, mut tool_message) = (None, None);
    replay.apply(seq, record, &mut |e| {
        if let Effect::Message { ordinal, .. } = &e {
            if is_tool_message(&e) {
                tool_message = Some(*ordinal);
            } else {
                message = Some(*ordinal);
            }
        }
        sink(e)
    })?;
    let dispatched_to = match record {
        Record::ToolResult { tool_call_id, .. } => replay.dispatched_to(tool_call_id).map(String::from),
        _ => None,
    };
    let context = Context { message, tool_message, assistant: replay.batch_assistant(), dispatched_to, send_id };
    let units = project(seq, record, &context);
    replay.note_units(seq, units.len());
    Ok(units)
}

/// Projects the record at `seq` into its units.
pub fn project(seq: u64, record: &Record, context: &Context) -> Vec<ControlUnit> {
    let bodies = unit_bodies(record, context);
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, (unit, event))| ControlUnit { cursor: Cursor { wal_seq: seq, sub_index: i as u32 }, unit, event })
        .collect()
}

/// Whether `effect` is the tool message of a closed batch (its units lead the closing record's).
pub fn is_tool_message(effect: &Effect) -> bool {
    matches!(effect, Effect::Message { message, .. } if message.role == Role::Tool)
}

/// How many units `project` yields for `record`, without building them (replay uses it to
/// keep the head cursor). `tool_message`: whether applying the record added a closed batch's
/// tool message ([`is_tool_message`]). Must agree with `unit_bodies` (tested); depends on
/// nothing else of the context.
pub fn unit_count(record: &Record, tool_message: bool) -> usize {
    let own = match record {
        Record::RunStarted(r) => 3 + usize::from(r.submission_id.is_some()),
        Record::ModelStepFinished { .. } | Record::Steered { .. } => 2,
        Record::RunFinished { error, .. } => {
            1 + usize::from(error.as_ref().is_some_and(|e| e.provider_code.as_deref() == Some(ORPHAN_PROVIDER_CODE)))
        }
        Record::CacheWarmed { .. } | Record::Unknown(_) => 0,
        _ => 1,
    };
    own + if tool_message { 2 } else { 0 }
}

/// A stored message's two units: `message_started`, then `unit` (which gains `mid`) with
/// `message_finished`. Without an ordinal (never for a replayed record) neither has an event,
/// and the count stays what [`unit_count`] says.
fn message_units(mut unit: Value, ordinal: Option<u64>) -> [(Value, Option<LiveEvent>); 2] {
    let mut started = json!({"type": "message_started"});
    match ordinal {
        Some(o) => {
            started["mid"] = json!(mid(o));
            unit["mid"] = json!(mid(o));
            [
                (started, Some(LiveEvent::MessageStarted(MessageEvent::new(mid(o))))),
                (unit, Some(LiveEvent::MessageFinished(MessageEvent::new(mid(o))))),
            ]
        }
        None => [(started, None), (unit, None)],
    }
}

/// The `reason` member of a run unit, as the unit spells it.
fn reason_of(unit: &Value) -> String {
    unit["reason"].as_str().unwrap_or_default().to_string()
}

/// A record's unit bodies, each with its live event: the tool message it added by closing a
/// batch first (its message joined the conversation first), then the record's own.
fn unit_bodies(record: &Record, context: &Context) -> Vec<(Value, Option<LiveEvent>)> {
    let mut units = Vec::new();
    if let Some(o) = context.tool_message {
        units.extend(message_units(json!({"type": "tool_message"}), Some(o)));
    }
    units.extend(record_units(record, context));
    units
}

/// The record's own unit bodies. One function per record kind with more than a line to say;
/// the rest are spelled here.
fn record_units(record: &Record, context: &Context) -> Vec<(Value, Option<LiveEvent>)> {
    let assistant_mid = context.assistant.map(mid);
    match record {
        Record::RunStarted(r) => run_started(r, context),
        Record::StepStarted { run_id, step, .. } => {
            vec![(json!({"type": "step_started", "run_id": run_id, "step": step}), None)]
        }
        Record::ModelAttemptFinished(a) => vec![(attempt_finished(a), None)],
        Record::ModelStepFinished { run_id, step, finish_reason, usage, message, .. } => message_units(
            json!({
                "type": "assistant_message", "run_id": run_id, "step": step, "finish_reason": finish_reason,
                "usage": usage, "message": message,
            }),
            context.message,
        )
        .to_vec(),
        Record::ToolDispatchIntent { run_id, tool_call_id, tool_name, module_id, arguments, at_ms, .. } => {
            let call = StartedCall {
                run_id,
                tool_call_id,
                tool_name,
                module_id: module_id.as_deref(),
                arguments,
                at_ms: *at_ms,
            };
            vec![tool_started(&call, assistant_mid.as_deref())]
        }
        Record::ToolResult { tool_call_id, output, is_error, outcome, at_ms, .. } => {
            let result = FinishedCall { tool_call_id, output, is_error: *is_error, outcome: *outcome, at_ms: *at_ms };
            let mut unit = tool_result(&result, assistant_mid.as_deref());
            if let Some(m) = &context.dispatched_to {
                unit.0["dispatched_to"] = json!(m);
            }
            vec![unit]
        }
        Record::RunCancelRequested { run_id, at } => {
            vec![(json!({"type": "run_cancel_requested", "run_id": run_id, "at": at}), None)]
        }
        Record::RunPaused { run_id, reason, error } => {
            let mut unit = json!({"type": "run_paused", "run_id": run_id, "reason": reason});
            if let Some(e) = error {
                unit["error"] = json!(e);
            }
            let event = LiveEvent::RunPaused(RunEnded::new(run_id, reason_of(&unit)));
            vec![(unit, Some(event))]
        }
        Record::RunResumed { run_id } => vec![(json!({"type": "run_resumed", "run_id": run_id}), None)],
        Record::RunFinished { .. } => run_finished(record),
        Record::Queued { submission_id, .. } => {
            vec![(json!({"type": "submission_queued", "submission_id": submission_id}), None)]
        }
        Record::Retracted { submission_id } => {
            vec![(json!({"type": "submission_retracted", "submission_id": submission_id}), None)]
        }
        Record::Steered { run_id, submission_id, message, .. } => message_units(
            json!({"type": "steered", "run_id": run_id, "submission_id": submission_id, "message": message}),
            context.message,
        )
        .to_vec(),
        Record::CacheWarmed { .. } | Record::Unknown(_) => Vec::new(),
    }
}

/// `run_started`, then `submission_started` for a send's run, then the user message's pair.
fn run_started(r: &record::RunStarted, context: &Context) -> Vec<(Value, Option<LiveEvent>)> {
    let mut started = json!({"type": "run_started", "run_id": r.run_id});
    let mut units = Vec::with_capacity(4);
    if let Some(sub) = &r.submission_id {
        started["submission_id"] = json!(sub);
        units.push((json!({"type": "submission_started", "submission_id": sub, "run_id": r.run_id}), None));
    }
    let mut event = RunStarted::new(&r.run_id);
    if let Some(send_id) = &context.send_id {
        event = event.with_send_id(send_id);
    }
    units.insert(0, (started, Some(LiveEvent::RunStarted(event))));
    units.extend(message_units(
        json!({"type": "user_message", "run_id": r.run_id, "message": r.input}),
        context.message,
    ));
    units
}

fn attempt_finished(a: &record::AttemptFinished) -> Value {
    let mut unit = json!({"type": "model_attempt_finished", "run_id": a.run_id, "step": a.step, "attempt": a.attempt, "outcome": a.outcome});
    if let Some(e) = &a.error {
        unit["error"] = json!(e);
    }
    for (k, v) in &a.telemetry {
        unit[k] = v.clone();
    }
    unit
}

/// The members of a dispatch intent its unit shows.
struct StartedCall<'a> {
    run_id: &'a str,
    tool_call_id: &'a str,
    tool_name: &'a str,
    module_id: Option<&'a str>,
    arguments: &'a Option<String>,
    /// When the intent was recorded: the call's start (absent in older records).
    at_ms: Option<u64>,
}

/// The members of a tool result its unit shows.
struct FinishedCall<'a> {
    tool_call_id: &'a str,
    output: &'a Value,
    is_error: bool,
    outcome: Option<CallOutcome>,
    /// When the result was recorded: the call's finish (absent in older records).
    at_ms: Option<u64>,
}

/// `tool_started`; inside a batch it carries the batch's assistant `mid` and its live event.
fn tool_started(call: &StartedCall<'_>, assistant_mid: Option<&str>) -> (Value, Option<LiveEvent>) {
    let mut unit = json!({"type": "tool_started", "run_id": call.run_id, "tool_call_id": call.tool_call_id, "name": call.tool_name});
    if let Some(m) = call.module_id {
        unit["module"] = json!(m);
        unit["dispatched_to"] = json!(m);
    }
    let event = assistant_mid.map(|m| {
        unit["mid"] = json!(m);
        let mut started = ToolStarted::new(m, call.tool_call_id, call.tool_name, &Value::Null, None, call.at_ms);
        started.arguments = call.arguments.clone().unwrap_or_else(|| "{}".into());
        LiveEvent::ToolStarted(started)
    });
    (unit, event)
}

/// `tool_result`; inside a batch it carries the batch's assistant `mid` and its live event.
fn tool_result(call: &FinishedCall<'_>, assistant_mid: Option<&str>) -> (Value, Option<LiveEvent>) {
    let FinishedCall { tool_call_id, output, is_error, outcome, at_ms } = *call;
    let mut unit = json!({
        "type": "tool_result", "result": {"tool_call_id": tool_call_id, "output": output, "is_error": is_error},
    });
    let event = assistant_mid.map(|m| {
        unit["mid"] = json!(m);
        let outcome = outcome.unwrap_or(if is_error { CallOutcome::Error } else { CallOutcome::Ok }).as_str();
        let bytes = crate::message::tool_result_content(output).len() as u64;
        LiveEvent::ToolFinished(ToolFinished::new(m, tool_call_id, outcome, bytes, at_ms))
    });
    (unit, event)
}

/// An orphan seal's `error` unit first (the crash diagnostic), then `run_finished`.
fn run_finished(record: &Record) -> Vec<(Value, Option<LiveEvent>)> {
    let Record::RunFinished {
        run_id,
        reason,
        error,
        usage,
        retries_used,
        final_step_finish_reason,
        indeterminate_tool_calls,
        ..
    } = record
    else {
        return Vec::new();
    };
    let mut units = Vec::with_capacity(2);
    if let Some(e) = error.as_ref().filter(|e| e.provider_code.as_deref() == Some(ORPHAN_PROVIDER_CODE)) {
        units.push((json!({"type": "error", "run_id": run_id, "error": e}), None));
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
    let event = LiveEvent::RunFinished(RunEnded::new(run_id, reason_of(&unit)));
    units.push((unit, Some(event)));
    units
}
