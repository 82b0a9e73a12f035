//! Decoding broca's native tool results from a served `session.read` message body, for the
//! suite's hooks that have no shared body layout. broca stores a call's result as a
//! `{"type": "tool_result", "tool_call_id", "output", "is_error"}` part of a tool message; an error
//! output is `{"kind": "error", "message", "code"?, "reason"?, "detail"?, "nothing_sent"?}`
//! (`src/tools/output.rs`, `src/agent/turn.rs`). Everything here reads what broca served; nothing
//! comes from the script.

use cortexkit_role_llm_runner::errors::tool_result_reasons as reasons;
use cortexkit_role_llm_runner_conformance::{ToolResultLimitObservation, ToolResultObservation};
use serde_json::Value;

/// Reasons the role defines for a call that was never dispatched (`errors::tool_result_reasons`).
const NEVER_DISPATCHED: &[&str] = &[
    reasons::BUDGET_EXHAUSTED,
    reasons::SKIPPED_AFTER_SUBMIT,
    reasons::CONTEXT_CEILING,
    reasons::PRE_TOOL_DENIED,
    reasons::PRE_TOOL_UNAVAILABLE,
    reasons::PRE_TOOL_DECLINED,
    reasons::PRE_TOOL_EXPIRED,
    reasons::ROUTE_DRAINED,
];

/// The result part of `tool_call_id` in a served message.
fn result_part<'a>(message: &'a Value, tool_call_id: &str) -> Option<&'a Value> {
    message["content"]
        .as_array()?
        .iter()
        .find(|part| part["type"] == "tool_result" && part["tool_call_id"] == tool_call_id)
}

/// An error output's code: `code` (a refusal's, or the size check's), else `reason` (the
/// input-cap refusal's member).
fn code_of(output: &Value) -> Option<&str> {
    output["code"].as_str().or_else(|| output["reason"].as_str())
}

/// The call's stored error result, with whether the call ran: not when the output says nothing
/// was sent, or when its code is one the role defines for a call never dispatched.
pub fn not_executed(message: &Value, tool_call_id: &str) -> Option<ToolResultObservation> {
    let output = &result_part(message, tool_call_id)?["output"];
    if output["kind"] != "error" {
        return None;
    }
    let code = code_of(output)?;
    let executed = !(output["nothing_sent"] == true || NEVER_DISPATCHED.contains(&code));
    Some(ToolResultObservation::new(executed, code))
}

/// The call's stored size error: its reason, measured bytes and limit (the output's one-line
/// `detail`), the model-visible text and whether the part is an error.
pub fn oversized(message: &Value, tool_call_id: &str) -> Option<ToolResultLimitObservation> {
    let part = result_part(message, tool_call_id)?;
    let output = &part["output"];
    if code_of(output) != Some(reasons::TOOL_RESULT_TOO_LARGE) {
        return None;
    }
    let detail: Value = serde_json::from_str(output["detail"].as_str()?).ok()?;
    Some(ToolResultLimitObservation::new(
        detail["reason"].as_str()?,
        detail["bytes"].as_u64()?,
        detail["limit"].as_u64()?,
        output["message"].as_str()?,
        part["is_error"] == true,
    ))
}
