//! The step in flight as a newly attached subscriber first sees it (llm-runner/v1 CONTRACT
//! §7.1, "Attach replay"): `display_reset`, then one coalesced delta per part so far, each the
//! whole part with its `part` and `mid`, then the live deltas.
//!
//! The lineage thread records every display delta it publishes here, under the lock that also
//! covers its ring pushes ([`super::Publisher::publish`]); an attaching subscriber copies the
//! snapshot and takes its ring positions under that same lock, so the snapshot and the deltas
//! after those positions neither overlap nor leave a gap.
//!
//! Invariants:
//! - every part belongs to the one message `mid` of step `step`; a delta of another step or
//!   message starts a new snapshot;
//! - parts keep the order of their first delta, one entry per part index;
//! - the text kept never exceeds [`STEP_SNAPSHOT_BYTES`]; past it the step is marked
//!   `overflowed`, keeps nothing more, and its replay is `display_reset` alone (live deltas
//!   then follow as usual);
//! - a unit that ends the step's stream (an attempt's end, the stored answer, the run's end or
//!   pause) clears the snapshot: from then on the step is no longer in flight.

use crate::agent::DisplayEvent;
use crate::lineage::projection::ControlUnit;

pub use crate::limits::STEP_SNAPSHOT_BYTES;

/// What a part is made of, and so which delta replays it.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Text,
    Reasoning,
    ToolInput { index: usize, tool_call_id: String },
}

#[derive(Clone, Debug, PartialEq)]
struct Part {
    index: usize,
    kind: Kind,
    text: String,
}

/// The coalesced live state of one session's step in flight.
#[derive(Debug, Default)]
pub struct StepSnapshot {
    /// The step and the `mid` of the message it builds; `None` between steps.
    step: Option<(u64, String)>,
    parts: Vec<Part>,
    bytes: usize,
    overflowed: bool,
}

/// What an attaching subscriber replays of the step in flight.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    /// The message the step builds; `None` when no step is in flight (nothing to replay).
    pub mid: Option<String>,
    /// One delta per part so far (empty after an overflow: the replay is `display_reset` alone).
    pub deltas: Vec<DisplayEvent>,
}

impl StepSnapshot {
    /// Notes one published display event. Status lines are not part of a step's parts.
    pub fn record(&mut self, event: &DisplayEvent) {
        let (step, mid, index, text) = match event {
            DisplayEvent::TextDelta { step, mid, part, text }
            | DisplayEvent::ReasoningDelta { step, mid, part, text } => (*step, mid, *part, text),
            DisplayEvent::ToolInputDelta { step, mid, part, delta, .. } => (*step, mid, *part, delta),
            DisplayEvent::Status { .. } => return,
        };
        if self.step.as_ref().is_none_or(|(s, m)| *s != step || m != mid) {
            self.clear();
            self.step = Some((step, mid.clone()));
        }
        if self.overflowed {
            return;
        }
        if self.bytes + text.len() > STEP_SNAPSHOT_BYTES {
            log::debug!(
                "step {step} of {mid}: past {STEP_SNAPSHOT_BYTES} bytes, an attach replays display_reset alone"
            );
            self.overflowed = true;
            self.parts.clear();
            return;
        }
        self.bytes += text.len();
        match self.parts.iter_mut().find(|p| p.index == index) {
            Some(part) => part.text.push_str(text),
            None => {
                let kind = match event {
                    DisplayEvent::ReasoningDelta { .. } => Kind::Reasoning,
                    DisplayEvent::ToolInputDelta { index, tool_call_id, .. } => {
                        Kind::ToolInput { index: *index, tool_call_id: tool_call_id.clone() }
                    }
                    _ => Kind::Text,
                };
                self.parts.push(Part { index, kind, text: text.clone() });
            }
        }
    }

    /// Notes units that just became durable: one that ends the step's stream clears it.
    pub fn settle(&mut self, units: &[ControlUnit]) {
        if units.iter().any(|u| u.unit.ends_step()) {
            self.clear();
        }
    }

    fn clear(&mut self) {
        *self = StepSnapshot::default();
    }

    /// The replay an attaching subscriber gets now.
    pub fn replay(&self) -> Replay {
        let Some((step, mid)) = &self.step else { return Replay::default() };
        let deltas = self
            .parts
            .iter()
            .map(|p| {
                let (step, mid, part, text) = (*step, mid.clone(), p.index, p.text.clone());
                match &p.kind {
                    Kind::Text => DisplayEvent::TextDelta { step, mid, part, text },
                    Kind::Reasoning => DisplayEvent::ReasoningDelta { step, mid, part, text },
                    Kind::ToolInput { index, tool_call_id } => DisplayEvent::ToolInputDelta {
                        step,
                        mid,
                        part,
                        index: *index,
                        tool_call_id: tool_call_id.clone(),
                        delta: text,
                    },
                }
            })
            .collect();
        Replay { mid: Some(mid.clone()), deltas }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineage::projection::{Cursor, Unit};

    fn text(step: u64, mid: &str, part: usize, text: &str) -> DisplayEvent {
        DisplayEvent::TextDelta { step, mid: mid.into(), part, text: text.into() }
    }

    #[test]
    fn parts_coalesce_in_first_delta_order_and_a_new_step_starts_over() {
        let mut s = StepSnapshot::default();
        assert_eq!(s.replay(), Replay::default(), "no step in flight: nothing to replay");
        s.record(&DisplayEvent::ReasoningDelta { step: 1, mid: "m2".into(), part: 0, text: "th".into() });
        s.record(&text(1, "m2", 1, "Hel"));
        s.record(&DisplayEvent::ReasoningDelta { step: 1, mid: "m2".into(), part: 0, text: "ink".into() });
        s.record(&text(1, "m2", 1, "lo"));
        s.record(&DisplayEvent::Status { text: "waiting".into() });
        let replay = s.replay();
        assert_eq!(replay.mid.as_deref(), Some("m2"));
        assert_eq!(
            replay.deltas,
            vec![
                DisplayEvent::ReasoningDelta { step: 1, mid: "m2".into(), part: 0, text: "think".into() },
                text(1, "m2", 1, "Hello"),
            ]
        );
        s.record(&text(2, "m4", 0, "next"));
        assert_eq!(s.replay().deltas, vec![text(2, "m4", 0, "next")]);
    }

    #[test]
    fn a_unit_ending_the_step_clears_it_and_others_do_not() {
        let mut s = StepSnapshot::default();
        s.record(&text(1, "m2", 0, "partial"));
        let unit = |unit: Unit| ControlUnit { cursor: Cursor { wal_seq: 1, sub_index: 0 }, unit, event: None };
        let run_id = String::from("r");
        s.settle(&[
            unit(Unit::SubmissionQueued { submission_id: "s".into() }),
            unit(Unit::RunCancelRequested { run_id: run_id.clone(), at: crate::record::CancelAt::StepBoundary }),
        ]);
        assert_eq!(s.replay().deltas.len(), 1, "a send queued mid-step leaves the step in flight");
        let attempt = Unit::ModelAttemptFinished {
            run_id,
            step: 1,
            attempt: 1,
            outcome: "retry".into(),
            error: None,
            telemetry: Default::default(),
        };
        s.settle(&[unit(attempt)]);
        assert_eq!(s.replay(), Replay::default(), "a retry streams its parts again");
    }

    #[test]
    fn past_the_bound_the_replay_is_a_reset_alone() {
        let mut s = StepSnapshot::default();
        let big = "x".repeat(STEP_SNAPSHOT_BYTES / 2 + 1);
        s.record(&text(1, "m2", 0, &big));
        s.record(&text(1, "m2", 1, &big));
        s.record(&text(1, "m2", 2, "more"));
        assert_eq!(s.replay(), Replay { mid: Some("m2".into()), deltas: Vec::new() });
    }
}
