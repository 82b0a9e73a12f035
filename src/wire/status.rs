//! The read ops' answers, typed: `run.status`, `run.result` and `session.read` pages. Fields
//! are declared in the order the goldens pin; absent ones are left out.

use serde::{Serialize, Serializer};

use super::answers::Delivered;
use crate::message::RunUsage;
use crate::record::{pause_name, ErrorClass, FinishReason, PauseReason, ProviderError};

/// One in-flight model step (`run.status`'s optional `step`, spec §14). Timestamps are Unix
/// milliseconds; `attempt` is zero-based and its content progress resets on reissue. The gap
/// fields need two content events.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepSnapshot {
    pub step_id: String,
    pub started_at_ms: u64,
    pub attempt: u32,
    pub attempt_started_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_content_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_content_gap_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_content_gap_ended_at_ms: Option<u64>,
}

/// Where a run stands, as `run.status` spells it: a finished run's state is its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    Active,
    Paused,
    Finished(FinishReason),
    /// No run of this id in the session.
    Unknown,
    /// The session has no episode.
    Idle,
    /// A provisional run id whose send was retracted, or is still queued.
    Retracted,
    Pending,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Active => "active",
            RunState::Paused => "paused",
            RunState::Finished(reason) => reason.as_str(),
            RunState::Unknown => "unknown",
            RunState::Idle => "idle",
            RunState::Retracted => "retracted",
            RunState::Pending => "pending",
        }
    }
}

impl Serialize for RunState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A run error as the role spells it: `provider_code` is always present (the class when the
/// provider gave none).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WireError {
    pub class: ErrorClass,
    pub message: String,
    pub provider_code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's `Retry-After`, in seconds (fractional, e.g. 1.5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<f64>,
    /// When the provider said the limit resets (unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at_ms: Option<u64>,
}

impl WireError {
    /// The class as the wire spells it.
    pub fn class_name(&self) -> String {
        serde_json::to_value(self.class).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
    }
}

impl From<&ProviderError> for WireError {
    fn from(e: &ProviderError) -> WireError {
        let class_name = || serde_json::to_value(e.class).ok().and_then(|v| v.as_str().map(String::from));
        WireError {
            class: e.class,
            message: e.message.clone(),
            provider_code: e.provider_code.clone().or_else(class_name).unwrap_or_default(),
            status: e.http_status,
            retry_after_secs: e.retry_after_ms.map(|ms| ms as f64 / 1000.0),
            resets_at_ms: e.resets_at_ms,
        }
    }
}

/// `run.status`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub state: RunState,
    /// A paused run's pause name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The role's spelling of a restart pause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
    /// The terminal's typed detail (`budget_exhausted`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<crate::record::BudgetDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<RunUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The credential the run was admitted with (its id only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_selection: Option<String>,
    /// Present once the run finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undelivered_steers: Option<Vec<String>>,
    /// The normalized finish of the run's last model step (llm-runner §6.6), once it ended and
    /// when that step reported one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// The model step in flight, while the run is active here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepSnapshot>,
    /// A provisional id whose send was delivered as a steer into this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered: Option<Delivered>,
    /// The held calls the run waits on (llm-runner `held_calls`); omitted when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_calls: Vec<cortexkit_role_llm_runner::run::HeldCall>,
    /// A completed run's trailing directives (llm-runner §9.9), when it asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directives: Option<Vec<cortexkit_role_llm_runner::directives::Directive>>,
}

impl RunStatus {
    /// A body with only a state (and the run id asked about, if any).
    pub fn bare(run_id: Option<String>, state: RunState) -> RunStatus {
        RunStatus {
            run_id,
            state,
            reason: None,
            pause_reason: None,
            error: None,
            detail: None,
            usage: None,
            title: None,
            auth_selection: None,
            undelivered_steers: None,
            finish: None,
            directives: None,
            step: None,
            delivered: None,
            held_calls: Vec::new(),
        }
    }

    /// A paused run: its pause name, and `pause_reason` for a restart pause.
    pub fn paused(run_id: String, reason: PauseReason) -> RunStatus {
        RunStatus {
            reason: Some(pause_name(reason)),
            pause_reason: (reason == PauseReason::Restart).then_some("restart"),
            ..RunStatus::bare(Some(run_id), RunState::Paused)
        }
    }
}

/// The final assistant message's text (`run.result`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FinalMessage {
    pub ordinal: u64,
    pub mid: String,
    pub text: String,
}

/// `run.result`'s answer. A paused run's `reason` comes right after `usage`, a finished run's
/// after `auth_selection` (the served order); only one is ever set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunResult {
    pub run_id: String,
    pub state: RunState,
    pub usage: Option<RunUsage>,
    #[serde(rename = "reason", skip_serializing_if = "Option::is_none")]
    pub pause_name: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<crate::record::BudgetDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_selection: Option<String>,
    #[serde(rename = "reason", skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_message: Option<FinalMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// As `run.status` reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directives: Option<Vec<cortexkit_role_llm_runner::directives::Directive>>,
}

impl RunResult {
    /// The result members of a run's status.
    pub fn of(run_id: String, status: RunStatus) -> RunResult {
        RunResult {
            run_id,
            state: status.state,
            usage: status.usage,
            // A finished run's `reason` is `run.result`'s own (`finish_reason`).
            pause_name: if status.state == RunState::Paused { status.reason } else { None },
            pause_reason: status.pause_reason,
            error: status.error,
            detail: status.detail,
            title: status.title,
            auth_selection: status.auth_selection,
            finish_reason: None,
            final_message: None,
            finish: status.finish,
            directives: status.directives,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_puts_each_reason_where_it_is_served() {
        let mut paused = RunResult::of("r".into(), RunStatus::paused("r".into(), PauseReason::Restart));
        paused.usage = Some(RunUsage::default());
        let text = serde_json::to_string(&paused).unwrap();
        assert!(text.starts_with(r#"{"run_id":"r","state":"paused","usage":{"#), "{text}");
        assert!(text.ends_with(r#"},"reason":"restart","pause_reason":"restart"}"#), "{text}");
        let mut done =
            RunResult::of("r".into(), RunStatus::bare(Some("r".into()), RunState::Finished(FinishReason::Completed)));
        done.title = Some("t".into());
        done.finish_reason = Some("completed");
        let text = serde_json::to_string(&done).unwrap();
        assert_eq!(text, r#"{"run_id":"r","state":"completed","usage":null,"title":"t","reason":"completed"}"#);
    }

    #[test]
    fn a_provider_error_always_names_a_code() {
        let e = ProviderError::new(ErrorClass::Transient, None, "m".into(), Some(503));
        let text = serde_json::to_string(&WireError::from(&e)).unwrap();
        assert_eq!(text, r#"{"class":"transient","message":"m","provider_code":"transient","status":503}"#);
    }
}
