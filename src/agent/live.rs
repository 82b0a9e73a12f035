//! The live step board: a cheap snapshot of each running model call, for `run.status`'s
//! optional `step` object (spec §14). Memory only, never inferred from the WAL; a run with no
//! model call in flight has no entry.

use std::collections::HashMap;

use parking_lot::Mutex;

pub use crate::wire::status::StepSnapshot;

/// Run id → its step in flight.
#[derive(Debug, Default)]
pub struct StepBoard(Mutex<HashMap<String, StepSnapshot>>);

impl StepBoard {
    pub fn get(&self, run_id: &str) -> Option<StepSnapshot> {
        self.0.lock().get(run_id).cloned()
    }

    pub(crate) fn begin(&self, run_id: &str, step: u64, now_ms: u64) {
        let snap = StepSnapshot {
            step_id: format!("{run_id}:{step}"),
            started_at_ms: now_ms,
            attempt_started_at_ms: now_ms,
            ..StepSnapshot::default()
        };
        self.0.lock().insert(run_id.to_string(), snap);
    }

    pub(crate) fn attempt(&self, run_id: &str, attempt: u32, now_ms: u64) {
        if let Some(s) = self.0.lock().get_mut(run_id) {
            s.attempt = attempt;
            s.attempt_started_at_ms = now_ms;
            s.last_content_at_ms = None;
            s.max_content_gap_ms = None;
            s.max_content_gap_ended_at_ms = None;
        }
    }

    /// A real-content event arrived.
    pub(crate) fn content(&self, run_id: &str, now_ms: u64) {
        if let Some(s) = self.0.lock().get_mut(run_id) {
            if let Some(last) = s.last_content_at_ms {
                let gap = now_ms.saturating_sub(last);
                if s.max_content_gap_ms.is_none_or(|m| gap > m) {
                    s.max_content_gap_ms = Some(gap);
                    s.max_content_gap_ended_at_ms = Some(now_ms);
                }
            }
            s.last_content_at_ms = Some(now_ms);
        }
    }

    pub(crate) fn end(&self, run_id: &str) {
        self.0.lock().remove(run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_need_two_content_events_and_reset_on_reissue() {
        let b = StepBoard::default();
        b.begin("r", 1, 100);
        b.content("r", 150);
        assert_eq!(b.get("r").unwrap().max_content_gap_ms, None);
        b.content("r", 400);
        b.content("r", 450);
        let s = b.get("r").unwrap();
        assert_eq!(
            (s.max_content_gap_ms, s.max_content_gap_ended_at_ms, s.last_content_at_ms),
            (Some(250), Some(400), Some(450))
        );
        b.attempt("r", 1, 500);
        let s = b.get("r").unwrap();
        assert_eq!((s.attempt, s.last_content_at_ms, s.max_content_gap_ms), (1, None, None));
        b.end("r");
        assert!(b.get("r").is_none());
    }
}
