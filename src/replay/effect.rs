//! What applying a record yields for the world outside the replay state: messages, run
//! states and the send ledger for the store, and warms for billing.

use super::*;

/// What replaying a record yields beyond the state: derived facts for the store.
///
/// Effects live for one record's apply (moved into a sink, batched to the store and dropped),
/// so the run-state variant stays inline: boxing it would allocate on every run-state change to
/// save stack bytes no collection holds for long.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// A message joins the conversation at `ordinal`; `written_at` is its recorded write time (admission for
    /// input and steers, the successful attempt's end for an answer, the last result's record
    /// time for a tool message), absent when a record did not carry one.
    Message { ordinal: u64, run_id: String, seq: u64, written_at: Option<u64>, message: Message },
    /// A run's lifecycle state changed.
    RunState { run_id: String, submission_id: Option<String>, state: RunState, seq: u64 },
    /// A send's fate changed (the send ledger: keyed re-sends, `send.status`, provisional ids).
    Send { submission_id: String, fate: SendFate, seq: u64 },
    /// A `session.warm` the provider answered (its own export fact, never a message).
    Warm { seq: u64, warm: Box<crate::record::CacheWarmed> },
}

/// What became of a durably queued send.
#[derive(Clone, Debug, PartialEq)]
pub enum SendFate {
    /// Queued with its request identity; not yet consumed.
    Queued(Box<RequestIdentity>),
    /// Consumed by the `RunStarted` of its own run.
    Started {
        run_id: String,
    },
    /// Delivered into a running run as a steer.
    Delivered {
        run_id: String,
    },
    Retracted,
    /// A waiting `delivery_order` send ended undelivered.
    Dropped(crate::record::DropReason),
}

/// A run's lifecycle state as the run index keeps it.
#[derive(Clone, Debug, PartialEq)]
pub enum RunState {
    Active {
        started_at_ms: u64,
        config: Frozen,
        title: Option<String>,
        auth_selection: Option<crate::record::AuthSelection>,
    },
    Paused {
        reason: PauseReason,
        error: Option<ProviderError>,
    },
    Finished {
        reason: FinishReason,
        error: Option<ProviderError>,
        usage: RunUsage,
        at_ms: u64,
        detail: Option<crate::record::BudgetDetail>,
        undelivered_steers: Vec<String>,
        /// The normalized finish of the run's last model step, when it reported one.
        finish: Option<String>,
        /// When each model's usage was first billed (`Episode::priced_at`).
        priced_at: Vec<PricedAt>,
    },
}
