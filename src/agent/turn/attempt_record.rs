//! One model attempt's record: appended with its identity (`attempt_id`), and its step hint
//! held until the barrier that makes the record durable (`crate::agent::hints`).

use super::*;

impl<C> Driver<'_, C> {
    /// Records one attempt of `(step, attempt, request body bytes)`, and holds its step hint
    /// until the barrier that makes the record durable.
    pub(super) fn record_attempt(
        &mut self,
        (step, attempt, body_bytes): (u64, u32, usize),
        outcome: &str,
        error: Option<ProviderError>,
        telemetry: &Telemetry,
        answer: Option<(&StepUsage, &str)>,
    ) -> Result<(), LineageError> {
        let seq = self.lineage.next_seq();
        let attempt_id = format!("{}-{seq}", self.lineage.incarnation());
        let rec = Record::ModelAttemptFinished(Box::new(AttemptFinished {
            run_id: self.run_id.clone(),
            step,
            attempt,
            outcome: outcome.into(),
            request_body_sha256: self.request_sha.clone(),
            error,
            attempt_id: Some(attempt_id.clone()),
            telemetry: telemetry.report(),
        }));
        let seq = self.lineage.append(&rec)?;
        let facts = crate::agent::hints::AttemptFacts {
            run_id: &self.run_id,
            step,
            attempt,
            outcome,
            attempt_id: &attempt_id,
            provider: &self.config.provider,
            model: &self.config.model,
            started_at_ms: self.attempt_started_ms,
            finished_at_ms: self.lineage.now_ms(),
            request_body_bytes: body_bytes,
            answer,
            work_class: self.config.policy.work_class.as_deref(),
            context_limit: self.config.policy.context_limit,
        };
        self.hints.hold(self.opts.step_hints.as_ref(), self.lineage, seq, &facts);
        Ok(())
    }
}
