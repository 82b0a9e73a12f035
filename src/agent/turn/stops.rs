//! The run's hard stops (llm-runner §9.3, §9.3.1): the session's input-token cap and the step
//! limit. A step a hard stop cuts off dispatches none of its calls; each is sealed with a
//! never-executed result in the terminal's commit.

use super::*;
use crate::record::BudgetDetail;

/// Why a step's calls were sealed never-executed.
#[derive(Clone, Copy, Debug)]
pub(super) enum HardStop {
    BudgetExhausted,
    MaxSteps,
    ContextLimit,
}

/// The provider code of a run ended by its own `context_limit` before a request was sent.
pub const CONTEXT_LIMIT_REACHED: &str = "context_limit_reached";

impl<C> Driver<'_, C> {
    /// The session's input-token cap is reached (or its spend became unknown): the detail
    /// `{limit, spent, cause}` the run ends with.
    pub(super) fn cap_reached(&self) -> Option<BudgetDetail> {
        let state = self.lineage.state();
        let limit = state.input_cap?;
        let cause = if state.input_unreported {
            "usage_unreported"
        } else if state.input_spent >= limit {
            "limit_reached"
        } else {
            return None;
        };
        Some(BudgetDetail { limit, spent: state.input_spent, cause: cause.into() })
    }

    /// The run's `context_limit` (spec §4) is reached: the session's next request is known to
    /// need at least that many tokens (the last step's consumed input and visible output, as
    /// its provider reported them). The run ends with the class a provider gives a prompt over
    /// its window, `context_overflow`, and nothing is sent. Unknown usage never stops a run.
    pub(super) fn context_limit_reached(&self) -> Option<ProviderError> {
        let limit = self.config.policy.context_limit?;
        let needed = self.lineage.state().context_tokens?;
        (needed >= limit).then(|| ProviderError::new(
            ErrorClass::ContextOverflow,
            Some(CONTEXT_LIMIT_REACHED.into()),
            format!(
                "the session's next request needs at least {needed} tokens and the run's context_limit is {limit}; nothing was sent"
            ),
            None,
        ))
    }

    pub(super) fn finish_budget(&mut self, detail: BudgetDetail) -> Result<TurnOutcome, LineageError> {
        self.finish_with(FinishReason::BudgetExhausted, None, Some(detail))
    }

    /// The calls of a step a hard stop cut off: each gets its intent and a never-executed
    /// error result, so the transcript keeps provider-valid call/result pairs.
    pub(super) fn refuse_batch(
        &mut self,
        step: u64,
        calls: Vec<(String, String, serde_json::Value)>,
        stop: HardStop,
    ) -> Result<(), LineageError> {
        let batch = self.append_intents(step, calls)?;
        let output = match stop {
            HardStop::BudgetExhausted => {
                json!({"kind": "error", "reason": "budget_exhausted", "nothing_sent": true, "message": "not executed: the session's input-token cap was reached"})
            }
            HardStop::MaxSteps => {
                json!({"kind": "error", "reason": "not_executed", "nothing_sent": true, "message": "not executed: the run reached its max_steps"})
            }
            HardStop::ContextLimit => {
                json!({"kind": "error", "reason": "not_executed", "nothing_sent": true, "message": "not executed: the run reached its context_limit"})
            }
        };
        let parts = self.append_not_executed(step, batch, &output)?;
        self.history.push(Message::of(Role::Tool, parts));
        Ok(())
    }

    /// A never-executed error result (`output`) for each of `calls`, whose intents are
    /// appended: the parts of the tool message that carries them.
    pub(super) fn append_not_executed(
        &mut self,
        step: u64,
        calls: Vec<ToolCall>,
        output: &serde_json::Value,
    ) -> Result<Vec<Part>, LineageError> {
        let mut parts = Vec::with_capacity(calls.len());
        for call in calls {
            self.lineage.append(&Record::ToolResult {
                run_id: self.run_id.clone(),
                step,
                tool_call_id: call.tool_call_id.clone(),
                output: output.clone(),
                is_error: true,
                outcome: Some(CallOutcome::NotExecuted),
                at_ms: Some(self.lineage.now_ms()),
                refused: None,
            })?;
            parts.push(Part::ToolResult { tool_call_id: call.tool_call_id, output: output.clone(), is_error: true });
        }
        Ok(parts)
    }
}
