//! The strict ops' requests (spec §15): each decoder refuses an unknown member by name, then
//! checks its members in the order the goldens pin, so the first fault named is always the same.
//! `session.send` is lenient and lives in [`super::send`].

use serde_json::Value;

use super::{invalid_params, strict, Refusal};
use crate::record::CancelAt;
use crate::session_key::SessionKey;

/// `session.read` page size when `limit` is omitted.
pub const READ_DEFAULT_LIMIT: u64 = 100;
/// The largest `session.read` page a request may ask for (a larger `limit` is clamped).
pub const READ_MAX_LIMIT: u64 = 1000;

/// `session.retract {session?, submission_id}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetractRequest {
    pub submission_id: String,
}

/// `run.cancel {run_id, at?}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelRequest {
    pub run_id: String,
    pub at: CancelAt,
}

/// `session.read {from_ordinal?, limit?}`; `from_ordinal: None` asks for the newest page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub from_ordinal: Option<u64>,
    /// Clamped to [`READ_MAX_LIMIT`]; never 0.
    pub limit: u64,
}

/// `run.status {session?, run_id?}`; no `run_id` asks for the session's last episode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusRequest {
    pub run_id: Option<String>,
}

/// `run.result {run_id}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultRequest {
    pub run_id: String,
}

/// `send.status {send_id}` (alias `session.send_status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendStatusRequest {
    pub send_id: String,
}

/// `run.tool_calls {run_id, after?, limit?}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallsRequest {
    pub run_id: String,
    /// The opaque cursor a previous page returned as `next`.
    pub after: Option<String>,
    /// Clamped to [`READ_MAX_LIMIT`]; never 0.
    pub limit: u64,
}

/// An op without members (`role.describe`, `session.baseline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Empty;

impl RetractRequest {
    pub fn decode(params: &Value, key: &SessionKey) -> Result<Self, Refusal> {
        strict(params, &["session", "submission_id"])?;
        if params.get("session").is_some_and(|s| s.as_str() != Some(key.session.as_str())) {
            return Err(invalid_params("session", "does not match the route's bound session"));
        }
        let submission_id = non_empty(params, "submission_id")?;
        Ok(RetractRequest { submission_id })
    }
}

impl CancelRequest {
    pub fn decode(params: &Value) -> Result<Self, Refusal> {
        strict(params, &["run_id", "at"])?;
        let run_id = non_empty(params, "run_id")?;
        let at = match params.get("at").map(Value::as_str) {
            None | Some(Some("now")) => CancelAt::Now,
            Some(Some("step_boundary")) => CancelAt::StepBoundary,
            Some(_) => return Err(invalid_params("at", "\"now\" or \"step_boundary\"")),
        };
        Ok(CancelRequest { run_id, at })
    }
}

impl ReadRequest {
    pub fn decode(params: &Value) -> Result<Self, Refusal> {
        strict(params, &["from_ordinal", "limit"])?;
        let limit = match count(params, "limit")? {
            Some(0) => return Err(invalid_params("limit", "must be at least 1")),
            Some(n) => n.min(READ_MAX_LIMIT),
            None => READ_DEFAULT_LIMIT,
        };
        let from_ordinal = count(params, "from_ordinal")?;
        Ok(ReadRequest { from_ordinal, limit })
    }
}

impl StatusRequest {
    pub fn decode(params: &Value, key: &SessionKey) -> Result<Self, Refusal> {
        strict(params, &["run_id", "session"])?;
        match params.get("session") {
            None => {}
            Some(Value::String(s)) if *s == key.session => {}
            Some(_) => return Err(invalid_params("session", "does not match the route's bound session")),
        }
        Ok(StatusRequest { run_id: optional_string(params, "run_id")? })
    }
}

impl ResultRequest {
    pub fn decode(params: &Value) -> Result<Self, Refusal> {
        strict(params, &["run_id"])?;
        let run_id = optional_string(params, "run_id")?.ok_or_else(|| invalid_params("run_id", "required"))?;
        Ok(ResultRequest { run_id })
    }
}

impl SendStatusRequest {
    pub fn decode(params: &Value) -> Result<Self, Refusal> {
        strict(params, &["send_id"])?;
        let send_id = optional_string(params, "send_id")?.ok_or_else(|| invalid_params("send_id", "required"))?;
        Ok(SendStatusRequest { send_id })
    }
}

impl ToolCallsRequest {
    pub fn decode(params: &Value) -> Result<Self, Refusal> {
        strict(params, &["run_id", "after", "limit"])?;
        let run_id = optional_string(params, "run_id")?.ok_or_else(|| invalid_params("run_id", "required"))?;
        let after = optional_string(params, "after")?;
        let limit = match count(params, "limit")? {
            Some(0) => return Err(invalid_params("limit", "must be at least 1")),
            Some(n) => n.min(READ_MAX_LIMIT),
            None => READ_DEFAULT_LIMIT,
        };
        Ok(ToolCallsRequest { run_id, after, limit })
    }
}

impl Empty {
    pub fn decode(params: &Value) -> Result<Self, Refusal> {
        strict(params, &[]).map(|()| Empty)
    }
}

/// A required non-empty string (absent, empty and non-strings are refused alike).
fn non_empty(params: &Value, field: &str) -> Result<String, Refusal> {
    match params.get(field).and_then(Value::as_str).filter(|s| !s.is_empty()) {
        Some(s) => Ok(s.to_string()),
        None => Err(invalid_params(field, "a non-empty string is required")),
    }
}

/// An optional member that, when present, must be a non-empty string.
fn optional_string(params: &Value, field: &str) -> Result<Option<String>, Refusal> {
    match params.get(field) {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(invalid_params(field, "a non-empty string is required")),
    }
}

fn count(params: &Value, field: &str) -> Result<Option<u64>, Refusal> {
    match params.get(field) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| invalid_params(field, "a non-negative integer is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> SessionKey {
        SessionKey::new("/p", "h", "s")
    }

    #[test]
    fn an_unknown_member_is_named_before_any_other_fault() {
        let e = RetractRequest::decode(&json!({"bogus": 1, "submission_id": 5}), &key()).unwrap_err();
        assert_eq!(e.message, "invalid params: bogus: unknown member");
        let e = CancelRequest::decode(&json!({"at": "later", "x": 1})).unwrap_err();
        assert_eq!(e.message, "invalid params: x: unknown member");
    }

    #[test]
    fn read_limits_clamp_and_refuse_zero() {
        assert_eq!(ReadRequest::decode(&json!({"limit": 5000})).unwrap().limit, READ_MAX_LIMIT);
        assert_eq!(ReadRequest::decode(&Value::Null).unwrap().limit, READ_DEFAULT_LIMIT);
        assert_eq!(
            ReadRequest::decode(&json!({"limit": 0})).unwrap_err().message,
            "invalid params: limit: must be at least 1"
        );
        // `limit` is checked before `from_ordinal`.
        let e = ReadRequest::decode(&json!({"limit": -1, "from_ordinal": "x"})).unwrap_err();
        assert_eq!(e.message, "invalid params: limit: a non-negative integer is required");
    }

    #[test]
    fn cancel_defaults_to_now_and_names_bad_modes() {
        assert_eq!(CancelRequest::decode(&json!({"run_id": "r"})).unwrap().at, CancelAt::Now);
        let at = CancelRequest::decode(&json!({"run_id": "r", "at": "step_boundary"})).unwrap().at;
        assert_eq!(at, CancelAt::StepBoundary);
        assert_eq!(
            CancelRequest::decode(&json!({"run_id": "r", "at": 3})).unwrap_err().message,
            "invalid params: at: \"now\" or \"step_boundary\""
        );
    }

    #[test]
    fn the_bound_session_is_the_only_one_accepted() {
        let e = StatusRequest::decode(&json!({"session": "other"}), &key()).unwrap_err();
        assert_eq!(e.message, "invalid params: session: does not match the route's bound session");
        assert_eq!(StatusRequest::decode(&json!({"session": "s"}), &key()).unwrap().run_id, None);
        let e = RetractRequest::decode(&json!({"session": 1, "submission_id": "x"}), &key()).unwrap_err();
        assert_eq!(e.message, "invalid params: session: does not match the route's bound session");
    }

    #[test]
    fn required_ids_are_named_when_missing() {
        assert_eq!(ResultRequest::decode(&json!({})).unwrap_err().message, "invalid params: run_id: required");
        assert_eq!(SendStatusRequest::decode(&json!({})).unwrap_err().message, "invalid params: send_id: required");
        let e = SendStatusRequest::decode(&json!({"send_id": ""})).unwrap_err();
        assert_eq!(e.message, "invalid params: send_id: a non-empty string is required");
    }
}
