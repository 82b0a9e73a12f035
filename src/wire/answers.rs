//! The answers the session actor gives, typed; serde writes them in the byte order the goldens
//! pin (fields in declaration order, absent ones left out).

use serde::Serialize;

use crate::record::{pause_name, FinishReason, PauseReason};

/// Where a send stands, as `session.send`, a keyed re-send and `send.status` answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SendState {
    Active,
    Pending,
    Paused,
    Finished,
    Retracted,
    /// A waiting `delivery_order` send replaced under its `dedupe_key` (terminal).
    Superseded,
    /// A waiting `delivery_order` send past its `expires_at_ms` (terminal).
    Expired,
}

/// A steer's delivery: `{as: "step", ref: <run_id>}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Delivered {
    #[serde(rename = "as")]
    pub as_: &'static str,
    #[serde(rename = "ref")]
    pub reference: String,
}

/// `session.send`'s answer. Built only through its constructors, so each state carries exactly
/// the members the spec gives it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SendReply {
    pub state: SendState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// A paused run's pause name, or a finished run's finish reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The role's spelling of a restart pause (beside `reason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered: Option<Delivered>,
    /// On the send that admitted the session's first episode (and its keyed re-send): the
    /// baseline `session.baseline` serves, from the config the send froze (llm-runner §10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<crate::frozen::SessionBaseline>,
}

impl SendReply {
    fn bare(state: SendState) -> SendReply {
        SendReply {
            state,
            run_id: None,
            reason: None,
            pause_reason: None,
            submission_id: None,
            delivered: None,
            baseline: None,
        }
    }

    /// The send runs (or joined) `run_id`; `submission_id` when the send started it.
    pub fn active(run_id: impl Into<String>, submission_id: Option<String>) -> SendReply {
        SendReply { run_id: Some(run_id.into()), submission_id, ..Self::bare(SendState::Active) }
    }

    /// Still queued.
    pub fn pending(submission_id: impl Into<String>) -> SendReply {
        SendReply { submission_id: Some(submission_id.into()), ..Self::bare(SendState::Pending) }
    }

    /// A terminal state with no run (`superseded`, `expired`).
    pub fn ended(state: SendState) -> SendReply {
        Self::bare(state)
    }

    pub fn retracted(submission_id: impl Into<String>) -> SendReply {
        SendReply { submission_id: Some(submission_id.into()), ..Self::bare(SendState::Retracted) }
    }

    pub fn paused(run_id: impl Into<String>, reason: PauseReason) -> SendReply {
        let restart = reason == PauseReason::Restart;
        SendReply {
            run_id: Some(run_id.into()),
            reason: Some(pause_name(reason)),
            pause_reason: restart.then_some("restart"),
            ..Self::bare(SendState::Paused)
        }
    }

    pub fn finished(run_id: impl Into<String>, reason: FinishReason) -> SendReply {
        SendReply { run_id: Some(run_id.into()), reason: Some(reason.as_str()), ..Self::bare(SendState::Finished) }
    }

    /// This `delivery_order` send started `run_id` (`idle_start`): `{as: "turn", ref: run_id}`.
    pub fn started_turn(mut self, run_id: impl Into<String>) -> SendReply {
        self.delivered = Some(Delivered { as_: "turn", reference: run_id.into() });
        self
    }

    /// This send was delivered as a steer into `run_id`.
    pub fn delivered_into(mut self, run_id: impl Into<String>) -> SendReply {
        self.delivered = Some(Delivered { as_: "step", reference: run_id.into() });
        self
    }
}

/// Why a retract did not retract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetractMiss {
    /// Never queued here, or already retracted.
    NotPending,
    /// Consumed into a run, or delivered as a steer.
    AlreadyStarted,
}

/// `session.retract`'s answer: `{retracted: true}` or `{retracted: false, reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RetractReply {
    pub retracted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<RetractMiss>,
}

impl RetractReply {
    pub const RETRACTED: RetractReply = RetractReply { retracted: true, reason: None };

    pub fn missed(reason: RetractMiss) -> RetractReply {
        RetractReply { retracted: false, reason: Some(reason) }
    }
}

/// `run.cancel`'s answer: `"ack"` (recorded, or already requested) or `"not_active"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReply {
    Ack,
    NotActive,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<T: Serialize>(t: &T) -> String {
        serde_json::to_string(t).unwrap()
    }

    #[test]
    fn send_replies_keep_the_served_member_order() {
        let active = SendReply::active("run-1", Some("sub-1".into()));
        assert_eq!(json(&active), r#"{"state":"active","run_id":"run-1","submission_id":"sub-1"}"#);
        assert_eq!(json(&SendReply::pending("sub-2")), r#"{"state":"pending","submission_id":"sub-2"}"#);
        let restart = SendReply::paused("run-3", PauseReason::Restart);
        assert_eq!(
            json(&restart),
            r#"{"state":"paused","run_id":"run-3","reason":"restart","pause_reason":"restart"}"#
        );
        let steered = SendReply::finished("run-4", FinishReason::Completed).delivered_into("run-4");
        assert_eq!(
            json(&steered),
            r#"{"state":"finished","run_id":"run-4","reason":"completed","delivered":{"as":"step","ref":"run-4"}}"#
        );
    }

    #[test]
    fn retract_and_cancel_replies_are_the_spec_shapes() {
        assert_eq!(json(&RetractReply::RETRACTED), r#"{"retracted":true}"#);
        assert_eq!(
            json(&RetractReply::missed(RetractMiss::AlreadyStarted)),
            r#"{"retracted":false,"reason":"already_started"}"#
        );
        assert_eq!(json(&CancelReply::NotActive), r#""not_active""#);
        assert_eq!(json(&CancelReply::Ack), r#""ack""#);
    }
}
