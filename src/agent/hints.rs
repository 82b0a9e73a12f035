//! The loop's live step hints (llm-runner §14.3): one `step.finished.v1` per recorded model
//! attempt, held until the WAL barrier that makes its record durable, then offered to the bus
//! publisher ([`crate::bus`]).
//!
//! Invariants: a hint is offered only once `durable_seq` covers its record's seq; a hint is
//! offered at most once; without a publisher nothing is held.

use std::num::NonZeroU64;

use cortexkit_role_llm_runner::session_ref::{session_ref, SessionIdentity};

use crate::bus::{StepFinished, StepHints, StepRef, RUNNER};
use crate::lineage::Lineage;
use crate::message::StepUsage;

/// What one attempt record says, for its hint.
pub(super) struct AttemptFacts<'a> {
    pub run_id: &'a str,
    pub step: u64,
    /// Zero-based, as recorded.
    pub attempt: u32,
    /// The record's outcome: `ok`, `retry`, `failed`, `interrupted`, `cancelled`.
    pub outcome: &'a str,
    pub attempt_id: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    pub request_body_bytes: usize,
    /// The answered attempt's usage and finish reason.
    pub answer: Option<(&'a StepUsage, &'a str)>,
    /// The run's frozen `work_class` and `context_limit` (spec §4 runner parameters).
    pub work_class: Option<&'a str>,
    pub context_limit: Option<u64>,
}

/// Hints waiting for their barrier.
#[derive(Default)]
pub(super) struct PendingHints {
    /// `(record seq, hint)`, in seq order.
    waiting: Vec<(u64, StepFinished)>,
    /// The session's `session_ref`, computed on first use.
    session_ref: Option<String>,
}

impl PendingHints {
    /// Holds the hint of the attempt record appended at `seq` (not yet durable).
    pub fn hold(&mut self, hints: Option<&StepHints>, lineage: &Lineage, seq: u64, facts: &AttemptFacts<'_>) {
        if hints.is_none() {
            return;
        }
        let key = lineage.key();
        let session_ref = self
            .session_ref
            .get_or_insert_with(|| {
                session_ref(&SessionIdentity { runner: RUNNER, harness: &key.harness, session: &key.session })
            })
            .clone();
        let position = StepRef::new(RUNNER, session_ref, lineage.incarnation(), seq);
        let attempt = NonZeroU64::new(u64::from(facts.attempt) + 1).unwrap_or(NonZeroU64::MIN);
        let mut hint = StepFinished::new(
            position,
            facts.run_id,
            facts.step.to_string(),
            attempt,
            terminal_status(facts.outcome),
            &key.harness,
            &key.session,
            facts.provider,
            facts.model,
            facts.started_at_ms,
            facts.finished_at_ms,
        )
        .with_attempt_id(facts.attempt_id)
        .with_request_body_bytes(facts.request_body_bytes as u64);
        if let Some(class) = facts.work_class {
            hint = hint.with_work_class(class);
        }
        if let Some(limit) = facts.context_limit {
            hint = hint.with_context_limit(limit);
        }
        if let Some((usage, finish)) = facts.answer {
            hint.input_tokens = usage.input_tokens;
            hint.cached_input_tokens = usage.cached_input_tokens;
            hint.cache_write_tokens = usage.cache_write_tokens;
            hint.output_tokens = usage.output_tokens;
            hint.reasoning_tokens = usage.reasoning_tokens;
            if !finish.is_empty() {
                hint = hint.with_finish_reason(finish);
            }
        }
        self.waiting.push((seq, hint));
    }

    /// Offers every held hint whose record `durable_seq` covers.
    pub fn release(&mut self, hints: Option<&StepHints>, durable_seq: u64) {
        let (Some(hints), false) = (hints, self.waiting.is_empty()) else { return };
        let ready = self.waiting.partition_point(|(seq, _)| *seq <= durable_seq);
        for (_, hint) in self.waiting.drain(..ready) {
            if let Err(refused) = hints.offer(hint) {
                log::debug!("bus: a step hint was not queued: {refused:?}");
            }
        }
    }
}

/// `terminal_status` for a recorded attempt outcome: a retried attempt failed.
fn terminal_status(outcome: &str) -> &str {
    match outcome {
        "ok" => "completed",
        "retry" => "failed",
        other => other,
    }
}
