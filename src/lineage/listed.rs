//! Delivering waiting `delivery_order` sends at a run's step boundary (llm-runner §9.7): each
//! goes out in the first mode of its list possible there, in queue order, or waits. At a step
//! entry a run is in progress (`steer` is possible), and the previous step's tool results are
//! about to be sent for the first time when its batch holds them (`tool_result` is possible,
//! riding with the last of them). A send past its `expires_at_ms` is dropped instead. Legacy
//! steers joining the run go out in the same pass, in the same order.
//!
//! A list never goes out at a run's end: no model of the run would see it, and it waits for
//! the next run, or starts one at the idle boundary when it lists `idle_start`.

use cortexkit_role_llm_runner::delivery_order::{self, Boundary, EntryDelivery, Mode};

use super::{Lineage, LineageError};
use crate::message::Message;
use crate::record::{Delivery, DropReason, Record};

impl Lineage {
    /// Delivers, at a step entry of `run_id`, every waiting send possible there: legacy steers
    /// targeting the run, and list sends by their first possible mode. Not yet durable (the
    /// step's barrier covers it). Returns the delivered messages, in queue order.
    pub fn deliver_at_step(&mut self, run_id: &str) -> Result<Vec<Message>, LineageError> {
        let tool_result = self.results_about_to_be_sent();
        let mut boundary = Boundary::default().with_run_in_progress();
        if tool_result.is_some() {
            boundary = boundary.with_tool_result();
        }
        let now = self.now_ms();
        let waiting: Vec<_> = self.state().queue.iter().cloned().collect();
        let mut delivered = Vec::new();
        for p in waiting {
            let mut message = p.message.clone();
            match &p.request.order {
                None if p.request.delivery() == Delivery::Steer && p.request.target_run.as_deref() == Some(run_id) => {}
                None => continue,
                Some(_) if delivery_order::expired(p.request.expires_at_ms, now) => {
                    let reason = DropReason::Expired;
                    self.append(&Record::Dropped { submission_id: p.submission_id, reason })?;
                    continue;
                }
                Some(modes) => {
                    let went = match delivery_order::choose(modes, &boundary) {
                        Some(Mode::ToolResult) => {
                            EntryDelivery::new(Mode::ToolResult).with_call_key(tool_result.clone().unwrap_or_default())
                        }
                        Some(Mode::Steer) => EntryDelivery::new(Mode::Steer),
                        _ => continue,
                    };
                    message.delivered_as = Some(went);
                }
            }
            self.append(&Record::Steered {
                run_id: run_id.to_owned(),
                submission_id: p.submission_id,
                message: message.clone(),
                title: p.request.title,
            })?;
            delivered.push(message);
        }
        Ok(delivered)
    }

    /// The call key of the last tool result the next request sends for the first time: the
    /// open batch's, when every call of it has its result.
    fn results_about_to_be_sent(&self) -> Option<String> {
        let batch = &self.state().last.as_ref()?.batch;
        let complete = !batch.is_empty() && batch.iter().all(|c| c.result.is_some());
        complete.then(|| batch.last().map(|c| c.call_key.clone())).flatten()
    }

    /// Drops the waiting list sends past their `expires_at_ms` (the idle boundary's check,
    /// before the next send starts). Not yet durable.
    pub fn drop_expired(&mut self) -> Result<usize, LineageError> {
        let now = self.now_ms();
        let expired: Vec<String> = self
            .state()
            .queue
            .iter()
            .filter(|p| p.request.order.is_some() && delivery_order::expired(p.request.expires_at_ms, now))
            .map(|p| p.submission_id.clone())
            .collect();
        for submission_id in &expired {
            self.append(&Record::Dropped { submission_id: submission_id.clone(), reason: DropReason::Expired })?;
        }
        Ok(expired.len())
    }
}
