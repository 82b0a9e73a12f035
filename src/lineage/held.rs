//! A lineage's held calls (spec §19) at a run's end: a cancel gives every call a provider still
//! holds its result, and an end the lineage writes on its own seals a call with a given outcome.

use serde_json::json;

use super::{Lineage, LineageError};
use crate::record::{self, Record};
use crate::replay::Resolution;

impl Lineage {
    /// Gives every call a provider still holds in `run_id`'s batch a cancelled result (not yet
    /// durable): the run is ending by a cancel, and no late result will be taken for it. A
    /// paused run is resumed first (a result is only written into a going run). Returns the
    /// calls' ids.
    pub fn cancel_held_calls(&mut self, run_id: &str) -> Result<Vec<String>, LineageError> {
        let held: Vec<(String, u64)> = self
            .replay
            .last
            .as_ref()
            .filter(|e| e.run_id == run_id)
            .map(|e| e.batch.iter().filter(|c| c.is_waiting_held()).map(|c| (c.tool_call_id.clone(), e.step)).collect())
            .unwrap_or_default();
        if held.is_empty() {
            return Ok(Vec::new());
        }
        if matches!(self.replay.resolution(), Resolution::Paused { .. }) {
            self.append(&Record::RunResumed { run_id: run_id.to_owned() })?;
        }
        for (id, step) in &held {
            let output = json!({"kind": "error", "reason": "cancelled_while_held", "message": "the run was cancelled while its provider held the call; its late result is not taken, and its outcome is unknown"});
            self.append_sealed_result(run_id, *step, id, output, record::CallOutcome::Cancelled)?;
        }
        Ok(held.into_iter().map(|(id, _)| id).collect())
    }

    /// Appends `tool_call_id`'s error result with `outcome`, written by broca for a call that
    /// got no answer it could take (not yet durable).
    pub(super) fn append_sealed_result(
        &mut self,
        run_id: &str,
        step: u64,
        tool_call_id: &str,
        output: serde_json::Value,
        outcome: record::CallOutcome,
    ) -> Result<u64, LineageError> {
        self.append(&Record::ToolResult {
            run_id: run_id.to_owned(),
            step,
            tool_call_id: tool_call_id.to_owned(),
            output,
            is_error: true,
            outcome: Some(outcome),
            at_ms: Some(self.now_ms()),
            refused: None,
        })
    }
}
