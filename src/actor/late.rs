//! A late result on the session's actor (spec §19): the held call's result, written into its
//! paused run's original batch at the call's position, durable before anything acks it.
//!
//! Decided against the WAL's own state, never the intake: a call that already has its result is
//! a no-op (a redelivery, or a run cancelled meanwhile); a call whose held record is not durable
//! yet, or whose run still waits on other calls of its batch, is "not yet" (the puller reads it
//! again). Once the last held call of the batch has its result the run is no longer paused, and
//! the actor drives it on to its next step.

use crate::held::{LateAck, LateOutcome};
use crate::lineage::{Lineage, LineageError};
use crate::record::{CallOutcome, PauseReason, Record};
use crate::replay::Resolution;
use crate::tools::output;

use super::decide::Units;

/// Takes the late result of the call `call_key`.
pub(super) fn deliver(
    lineage: &mut Lineage,
    call_key: &str,
    outcome: LateOutcome,
) -> Result<(LateAck, Units), LineageError> {
    let Some(e) = lineage.state().last.as_ref() else { return Ok((LateAck::NoOp, Vec::new())) };
    let Some(call) = e.batch.iter().find(|c| c.call_key == call_key) else {
        // Not in the open batch: its batch closed, so it has its result.
        return Ok((LateAck::NoOp, Vec::new()));
    };
    if call.result.is_some() {
        return Ok((LateAck::NoOp, Vec::new()));
    }
    let Some(held) = call.held.clone() else { return Ok((LateAck::NotYet, Vec::new())) };
    let run_id = e.run_id.clone();
    if lineage.state().resolution() != (Resolution::Paused { run_id: run_id.clone(), reason: PauseReason::ToolHeld }) {
        // The run still waits on other calls of the batch (it pauses when only held ones are
        // left), or is paused for another reason.
        return Ok((LateAck::NotYet, Vec::new()));
    }
    let tool_result_v1 = e.config.config().is_some_and(|c| {
        c.tools.iter().any(|t| {
            t.name == held.tool
                && t.result_format == Some(cortexkit_role_tool_provider::result::ResultFormat::ToolResultV1)
        })
    });
    let out = match outcome {
        LateOutcome::Result(value) => output::late_result(&held.provider, value, tool_result_v1),
        LateOutcome::NotStarted(reason) => output::never_started(&held.provider, &reason),
        LateOutcome::Expired => output::expired(&held.provider),
    };
    let call_outcome = if out.is_error { CallOutcome::Error } else { CallOutcome::Ok };
    crate::failpoint!("held.before_deliver");
    lineage.append(&Record::RunResumed { run_id: run_id.clone() })?;
    lineage.append(&Record::ToolResult {
        run_id: run_id.clone(),
        step: held.step,
        tool_call_id: held.tool_call_id.clone(),
        output: out.output,
        is_error: out.is_error,
        outcome: Some(call_outcome),
        at_ms: Some(lineage.now_ms()),
        refused: out.refused,
    })?;
    if !lineage.state().held_calls().is_empty() {
        lineage.append(&Record::RunPaused { run_id, reason: PauseReason::ToolHeld, error: None })?;
    }
    let units = lineage.commit()?;
    crate::failpoint!("held.after_deliver");
    Ok((LateAck::Delivered, units))
}
