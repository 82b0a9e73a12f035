//! The tool batch's held calls (spec §19): registering the calls a provider may answer late,
//! before they are sent, and syncing a held reply's record before the batch waits on it.

use super::*;

impl<C> Driver<'_, C> {
    /// Registers the batch's calls that carry their key to a provider taking late results, in
    /// one synced transaction before any is sent (spec §19). Returns their keys. A failure to
    /// register fails the run's write path: nothing has been sent.
    pub(super) fn register(&mut self, batch: &[ToolCall]) -> Result<Vec<String>, LineageError> {
        let Some(registry) = &self.opts.held else { return Ok(Vec::new()) };
        let keyed: Vec<&ToolCall> =
            batch.iter().filter(|c| c.target.as_ref().is_some_and(|t| t.send_call_key)).collect();
        if keyed.is_empty() {
            return Ok(Vec::new());
        }
        registry
            .register(self.lineage.key(), &self.run_id, &keyed, self.lineage.now_ms())
            .map_err(|e| LineageError::Refused(format!("the held-call intake refused the batch: {e}")))?;
        Ok(keyed.iter().map(|c| c.call_key.clone()).collect())
    }

    /// A provider held a call: its held record is made durable before the batch waits on it.
    pub(super) fn record_held(
        &mut self,
        step: u64,
        tool_call_id: &str,
        (call_key, tool, provider): &(String, String, String),
        reason: &str,
    ) -> Result<(), LineageError> {
        let held = crate::record::ToolCallProviderHeld {
            run_id: self.run_id.clone(),
            step,
            tool_call_id: tool_call_id.to_owned(),
            call_key: call_key.clone(),
            tool: tool.clone(),
            provider: provider.clone(),
            reason: reason.to_owned(),
            held_at_ms: self.lineage.now_ms(),
            session: Some(crate::record::HeldSession::of(self.lineage.key())),
        };
        self.lineage.append(&Record::ToolCallProviderHeld(Box::new(held)))?;
        self.commit()?;
        crate::failpoint!("held.after_record");
        Ok(())
    }
}
