//! `tool.call` over the consumer connection (spec §4, §13; tool-provider §4–§6): one Request per
//! durable intent, on the provider's cached route for the session, with the frozen preset and
//! pin; `call_key` only to providers whose frozen catalog declares `late_results`.
//!
//! The wait ends at the call's deadline or when the loop raises its [`Cancel`]; either way the
//! call gets a CANCEL on its corr and an indeterminate outcome (never sent again). A call the
//! daemon proves undelivered is an error result with `nothing_sent`.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{output, ToolPlane};
use crate::agent::{Cancel, NoTools, ToolCall, ToolDispatcher, ToolOutcome};
use crate::subc::consumer::{CallError, PendingCall};

/// How often a waiting call looks at its [`Cancel`].
const CANCEL_POLL: Duration = Duration::from_millis(20);

impl ToolDispatcher for ToolPlane {
    /// `role.describe` on the provider's route: any answer means the route is there.
    fn reachable(&self, module: &str, lineage: &str, deadline: Instant) -> Result<(), String> {
        self.role_op(module, lineage, "role.describe", json!({}), deadline).map(drop).map_err(|e| e.to_string())
    }

    fn call(&self, call: &ToolCall, deadline: Instant, cancel: &Cancel) -> ToolOutcome {
        let Some(target) = &call.target else {
            // A send's own tool: nothing serves it.
            return NoTools::unserved(call);
        };
        let module = target.module.as_str();
        let mut request = json!({"name": call.name, "arguments": call.arguments, "tool_call_id": call.tool_call_id});
        if let Some(preset) = &target.preset {
            request["preset"] = json!(preset);
        }
        if let Some(pin) = &target.pin {
            request["schema_pin"] = json!(pin);
        }
        if target.send_call_key {
            request["call_key"] = json!(call.call_key);
        }
        let body = serde_json::to_vec(&request).expect("calls serialize");
        let lineage = call.lineage();
        let deadline = deadline.min(Instant::now() + call.wait);
        let window = self.window(module);
        let _pass = match self.flight.enter(module, lineage, &call.tool_call_id, window, deadline) {
            Ok(pass) => pass,
            Err(refused) => return ToolOutcome::Error(format!("{} ({module}); nothing was sent", refused.message())),
        };
        let open_within = super::ROUTE_OPEN_WITHIN.min(deadline.saturating_duration_since(Instant::now()));
        let capabilities = crate::held::call_route_capabilities();
        let pending = match self.consumer.start_on_declaring(
            &ToolPlane::target(module),
            &ToolPlane::identity(lineage),
            capabilities,
            &body,
            open_within,
        ) {
            Ok(p) => p,
            Err(e) => return unsent(module, e),
        };
        let declared = !capabilities.is_empty();
        let terms = output::Terms {
            tool_result_v1: declared && target.tool_result_v1,
            may_hold: declared && target.tool_result_v1 && target.send_call_key,
        };
        let waited = Instant::now();
        match wait(&pending, deadline, cancel) {
            Some(Ok(answer)) => match output::first_answer(module, &answer, terms) {
                output::Answered::Result(out) => ToolOutcome::Completed(out),
                output::Answered::Held { reason } => ToolOutcome::Held { reason },
            },
            Some(Err(e)) => ended(module, e),
            None => {
                // Given up on: the provider is told to stop; whatever it did is unknown.
                let _ = self.consumer.cancel(pending.route(), pending.corr());
                let why = if cancel.is_cancelled() {
                    "the call was cancelled while in flight".to_string()
                } else {
                    format!("no answer from {module} within {} ms", waited.elapsed().as_millis())
                };
                ToolOutcome::Indeterminate(why)
            }
        }
    }

    fn answer_locally(&self, call: &ToolCall) -> Option<ToolOutcome> {
        call.target.is_none().then(|| NoTools::unserved(call))
    }
}

/// Waits for the call's terminal frame until `deadline` or `cancel`; `None` when it gave up.
fn wait(pending: &PendingCall, deadline: Instant, cancel: &Cancel) -> Option<Result<Vec<u8>, CallError>> {
    loop {
        if cancel.is_cancelled() || Instant::now() >= deadline {
            return None;
        }
        let until = deadline.min(Instant::now() + CANCEL_POLL);
        if let Some(answer) = pending.poll_until(until) {
            return Some(answer);
        }
    }
}

/// A start that failed: nothing went out.
fn unsent(module: &str, e: CallError) -> ToolOutcome {
    let out = match &e {
        CallError::RouteOpen(body) | CallError::NotDelivered(body) => {
            output::not_sent(module, &body.code, &body.message, output::one_line_detail(body))
        }
        CallError::OpenTimeout => output::not_sent(module, "route_open_timeout", &e.to_string(), None),
        CallError::Closed | CallError::Connect(_) => {
            output::not_sent(module, "consumer_unavailable", &e.to_string(), None)
        }
        _ => output::not_sent(module, "call_not_started", &e.to_string(), None),
    };
    ToolOutcome::Completed(out)
}

/// A call whose Request went out and ended without an answer body.
fn ended(module: &str, e: CallError) -> ToolOutcome {
    match e {
        CallError::Module(body) => ToolOutcome::Completed(output::refused(module, &body)),
        CallError::NotDelivered(body) => {
            ToolOutcome::Completed(output::not_sent(module, &body.code, &body.message, output::one_line_detail(&body)))
        }
        other => ToolOutcome::Indeterminate(format!("the call to {module} ended without an answer: {other}")),
    }
}
