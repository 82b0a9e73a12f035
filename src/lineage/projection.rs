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

use crate::message::Role;
use crate::record::{self, pause_name, CallOutcome, Record, ORPHAN_PROVIDER_CODE};
use crate::replay::{Effect, Replay, ReplayError};

pub use super::unit::{ControlUnit, Unit, UnitToolResult};
pub use crate::replay::Cursor;

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
    /// The held calls the run waits on after a held record or a pause (a resume lists none: the
    /// late result that resumed it is recorded right after it, and a pause follows if others
    /// still wait).
    pub held_calls: Vec<super::unit::HeldCall>,
}

/// The held calls waiting in `replay`'s open batch, as the role lists them.
pub fn held_calls(replay: &Replay) -> Vec<super::unit::HeldCall> {
    replay
        .held_calls()
        .into_iter()
        .map(|h| super::unit::HeldCall::new(&h.call_key, &h.tool, &h.provider, &h.reason, h.held_at_ms))
        .collect()
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
    let held_calls = match record {
        Record::ToolCallProviderHeld(_) | Record::RunPaused { .. } => held_calls(replay),
        _ => Vec::new(),
    };
    let context =
        Context { message, tool_message, assistant: replay.batch_assistant(), dispatched_to, send_id, held_calls };
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
        Record::CacheWarmed(_) | Record::MovedOut(_) | Record::Unknown(_) => 0,
        Record::ToolCallProviderHeld(_)
        | Record::StepStarted { .. }
        | Record::ModelAttemptFinished(_)
        | Record::ToolDispatchIntent { .. }
        | Record::ToolResult { .. }
        | Record::RunCancelRequested { .. }
        | Record::RunPaused { .. }
        | Record::RunResumed { .. }
        | Record::Queued { .. }
        | Record::Retracted { .. }
        | Record::Dropped { .. } => 1,
    };
    own + if tool_message { 2 } else { 0 }
}

/// A stored message's two units: `message_started`, then `unit` (which gains `mid`) with
/// `message_finished`. Without an ordinal (never for a replayed record) neither has an event,
/// and the count stays what [`unit_count`] says.
fn message_units(mut unit: Unit, ordinal: Option<u64>) -> [(Unit, Option<LiveEvent>); 2] {
    match ordinal {
        Some(o) => {
            unit.set_mid(mid(o));
            [
                (
                    Unit::MessageStarted { mid: Some(mid(o)) },
                    Some(LiveEvent::MessageStarted(MessageEvent::new(mid(o)))),
                ),
                (unit, Some(LiveEvent::MessageFinished(MessageEvent::new(mid(o))))),
            ]
        }
        None => [(Unit::MessageStarted { mid: None }, None), (unit, None)],
    }
}

/// A record's unit bodies, each with its live event: the tool message it added by closing a
/// batch first (its message joined the conversation first), then the record's own.
fn unit_bodies(record: &Record, context: &Context) -> Vec<(Unit, Option<LiveEvent>)> {
    let mut units = Vec::new();
    if let Some(o) = context.tool_message {
        units.extend(message_units(Unit::ToolMessage { mid: None }, Some(o)));
    }
    units.extend(record_units(record, context));
    units
}

/// The record's own unit bodies. One function per record kind with more than a line to say;
/// the rest are spelled here.
fn record_units(record: &Record, context: &Context) -> Vec<(Unit, Option<LiveEvent>)> {
    let assistant_mid = context.assistant.map(mid);
    match record {
        Record::RunStarted(r) => run_started(r, context),
        Record::StepStarted { run_id, step, .. } => {
            vec![(Unit::StepStarted { run_id: run_id.clone(), step: *step }, None)]
        }
        Record::ModelAttemptFinished(a) => vec![(attempt_finished(a), None)],
        Record::ModelStepFinished { run_id, step, finish_reason, usage, message, .. } => message_units(
            Unit::AssistantMessage {
                run_id: run_id.clone(),
                step: *step,
                finish_reason: finish_reason.clone(),
                usage: usage.clone(),
                message: message.clone(),
                mid: None,
            },
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
            vec![tool_result(&result, assistant_mid.as_deref(), context.dispatched_to.clone())]
        }
        Record::RunCancelRequested { run_id, at } => {
            vec![(Unit::RunCancelRequested { run_id: run_id.clone(), at: *at }, None)]
        }
        Record::RunPaused { run_id, reason, error } => {
            let event = LiveEvent::RunPaused(RunEnded::new(run_id, pause_name(*reason)));
            let held_calls = context.held_calls.clone();
            vec![(
                Unit::RunPaused { run_id: run_id.clone(), reason: *reason, error: error.clone(), held_calls },
                Some(event),
            )]
        }
        Record::RunResumed { run_id } => vec![(Unit::RunResumed { run_id: run_id.clone() }, None)],
        Record::ToolCallProviderHeld(h) => vec![(
            Unit::CallHeld {
                run_id: h.run_id.clone(),
                tool_call_id: h.tool_call_id.clone(),
                held_calls: context.held_calls.clone(),
            },
            None,
        )],
        Record::RunFinished { .. } => run_finished(record),
        Record::Queued { submission_id, .. } => {
            vec![(Unit::SubmissionQueued { submission_id: submission_id.clone() }, None)]
        }
        // A dropped list send leaves the queue as a retracted one does (observers see it
        // gone; its send state says why).
        Record::Retracted { submission_id } | Record::Dropped { submission_id, .. } => {
            vec![(Unit::SubmissionRetracted { submission_id: submission_id.clone() }, None)]
        }
        Record::Steered { run_id, submission_id, message, .. } => message_units(
            Unit::Steered {
                run_id: run_id.clone(),
                submission_id: submission_id.clone(),
                message: message.clone(),
                mid: None,
            },
            context.message,
        )
        .to_vec(),
        Record::CacheWarmed(_) | Record::MovedOut(_) | Record::Unknown(_) => Vec::new(),
    }
}

/// `run_started`, then `submission_started` for a send's run, then the user message's pair.
fn run_started(r: &record::RunStarted, context: &Context) -> Vec<(Unit, Option<LiveEvent>)> {
    let mut event = RunStarted::new(&r.run_id);
    if let Some(send_id) = &context.send_id {
        event = event.with_send_id(send_id);
    }
    let started = Unit::RunStarted { run_id: r.run_id.clone(), submission_id: r.submission_id.clone() };
    let mut units = vec![(started, Some(LiveEvent::RunStarted(event)))];
    if let Some(sub) = &r.submission_id {
        units.push((Unit::SubmissionStarted { submission_id: sub.clone(), run_id: r.run_id.clone() }, None));
    }
    let input = Unit::UserMessage { run_id: r.run_id.clone(), message: r.input.clone(), mid: None };
    units.extend(message_units(input, context.message));
    units
}

fn attempt_finished(a: &record::AttemptFinished) -> Unit {
    Unit::ModelAttemptFinished {
        run_id: a.run_id.clone(),
        step: a.step,
        attempt: a.attempt,
        outcome: a.outcome.clone(),
        error: a.error.clone(),
        telemetry: a.telemetry.clone(),
    }
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
    output: &'a serde_json::Value,
    is_error: bool,
    outcome: Option<CallOutcome>,
    /// When the result was recorded: the call's finish (absent in older records).
    at_ms: Option<u64>,
}

/// `tool_started`; inside a batch it carries the batch's assistant `mid` and its live event.
fn tool_started(call: &StartedCall<'_>, assistant_mid: Option<&str>) -> (Unit, Option<LiveEvent>) {
    let event = assistant_mid.map(|m| {
        let mut started =
            ToolStarted::new(m, call.tool_call_id, call.tool_name, &serde_json::Value::Null, None, call.at_ms);
        started.arguments = call.arguments.clone().unwrap_or_else(|| "{}".into());
        LiveEvent::ToolStarted(started)
    });
    let unit = Unit::ToolStarted {
        run_id: call.run_id.to_string(),
        tool_call_id: call.tool_call_id.to_string(),
        name: call.tool_name.to_string(),
        module: call.module_id.map(String::from),
        dispatched_to: call.module_id.map(String::from),
        mid: assistant_mid.map(String::from),
    };
    (unit, event)
}

/// `tool_result`; inside a batch it carries the batch's assistant `mid` and its live event.
fn tool_result(
    call: &FinishedCall<'_>,
    assistant_mid: Option<&str>,
    dispatched_to: Option<String>,
) -> (Unit, Option<LiveEvent>) {
    let FinishedCall { tool_call_id, output, is_error, outcome, at_ms } = *call;
    let event = assistant_mid.map(|m| {
        let outcome = outcome.unwrap_or(if is_error { CallOutcome::Error } else { CallOutcome::Ok }).as_str();
        let bytes = crate::message::tool_result_content(output).len() as u64;
        LiveEvent::ToolFinished(ToolFinished::new(m, tool_call_id, outcome, bytes, at_ms))
    });
    let result = UnitToolResult { tool_call_id: tool_call_id.to_string(), output: output.clone(), is_error };
    (Unit::ToolResult { result, mid: assistant_mid.map(String::from), dispatched_to }, event)
}

/// An orphan seal's `error` unit first (the crash diagnostic), then `run_finished`.
fn run_finished(record: &Record) -> Vec<(Unit, Option<LiveEvent>)> {
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
        units.push((Unit::Error { run_id: run_id.clone(), error: e.clone() }, None));
    }
    let event = LiveEvent::RunFinished(RunEnded::new(run_id, reason.as_str()));
    let unit = Unit::RunFinished {
        run_id: run_id.clone(),
        reason: *reason,
        usage: usage.clone(),
        retries_used: *retries_used,
        final_step_finish_reason: final_step_finish_reason.clone(),
        indeterminate_tool_calls: indeterminate_tool_calls.clone(),
        error: error.clone(),
    };
    units.push((unit, Some(event)));
    units
}
