//! The typed facts records carry beside their core members: an attempt's content telemetry,
//! admission's credential and account decision, and a `budget_exhausted` terminal's detail.

use serde::{Deserialize, Serialize};

/// An attempt's content telemetry (spec §14): when real content arrived, the longest gap
/// between content events, byte counts by class, and a top-16 tally of event types (then
/// `other`). A measurement never observed is absent, never a synthetic zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptTelemetry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_content_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_content_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_content_gap_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_content_gap_ended_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_content_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_content_bytes_after_last_content: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_after_last_content: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_types: Vec<EventTypeCount>,
}

impl AttemptTelemetry {
    pub fn is_empty(&self) -> bool {
        *self == AttemptTelemetry::default()
    }
}

/// One row of an attempt's event-type tally.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventTypeCount {
    pub event_type: String,
    pub count: u64,
    pub bytes: u64,
    /// A type the family's decoder does not know.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
}

/// What admission froze about a run's credential and account decision
/// (`RunStarted.auth_selection`): the vault credential id (absent on credential-free routes),
/// the account its admission read named (absent when that read was refused), and the
/// conversation key with its source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthSelection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_decision: Option<AccountDecision>,
}

/// The conversation key a run's account was chosen by, and where it came from (`caller`,
/// `session`, `inherited`: an open string, so a later source survives replay).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountDecision {
    pub conversation_key: String,
    pub conversation_key_source: String,
}

/// A `budget_exhausted` terminal's detail (llm-runner's `{limit, spent, cause}`): the
/// session's input-token cap, what its runs spent against it, and why the run stopped
/// (`limit_reached`, or `usage_unreported` when a step's input was never reported; an open
/// string, so a later cause still reads).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetDetail {
    pub limit: u64,
    pub spent: u64,
    pub cause: String,
}
