//! The strict ops' requests (spec §15): each decoder refuses an unknown member by name, then
//! checks its members in the order the goldens pin, so the first fault named is always the same.
//! `session.send` is lenient and lives in [`super::send`].

use cortexkit_role_llm_runner::read::MediaMode;
use serde_json::Value;

use super::{invalid_params, strict, Refusal, RefusalCode};
use crate::record::CancelAt;
use crate::session_key::SessionKey;

/// `session.read` page size when `limit` is omitted.
pub const READ_DEFAULT_LIMIT: u64 = 100;
pub use crate::limits::READ_MAX_LIMIT;

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

/// The history version every broca session serves: its history is append-only, never
/// rewritten, so the version never moves (spec §4: "its history version is zero").
pub const HISTORY_VERSION: u64 = 0;
pub use crate::limits::READ_MAX_BYTES;

/// Where a `session.read` page starts. Ordinals here are the served ones (from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadCursor {
    /// The newest page.
    Tail,
    /// Forward from this served ordinal (0 is an alias of 1).
    From(u64),
    /// Strictly after the message `m<ordinal>`.
    After(u64),
}

/// `session.read` (spec §4 ∪ llm-runner/v1 §4.1): `{from_ordinal?, after_mid?,
/// history_version?, lineage_id?, limit?, max_bytes?, include_tools?, include_originals?, view?,
/// media?}`. Strict: an unknown member (also `include_rich_ui` and `include_display_facts`,
/// whose groups broca does not declare) is refused naming it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub cursor: ReadCursor,
    /// Clamped to [`READ_MAX_LIMIT`]; never 0.
    pub limit: u64,
    /// Clamped to [`READ_MAX_BYTES`]; never 0.
    pub max_bytes: u64,
    /// Add the tools of the session's latest run (`tools`, `tools_run_id`).
    pub include_tools: bool,
    /// `inline` (the default) or `descriptors` (llm-runner §4.1); `blocks` is refused (broca
    /// declares no `attachments`).
    pub media: MediaMode,
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

/// The members `session.read` reads.
const READ_MEMBERS: [&str; 10] = [
    "from_ordinal",
    "after_mid",
    "history_version",
    "lineage_id",
    "limit",
    "max_bytes",
    "include_tools",
    "include_originals",
    "view",
    "media",
];

impl ReadRequest {
    /// Decodes and checks a read against the session's lineage id: members are checked in the
    /// order the goldens pin, then the cursor, then the cache identity (a read naming another
    /// history version or lineage is refused whatever its mode).
    pub fn decode(params: &Value, lineage_id: &str) -> Result<Self, Refusal> {
        Self::decode_at(params, lineage_id, HISTORY_VERSION)
    }

    /// [`ReadRequest::decode`] for a session whose history version is `version` (a record
    /// started after a retention expiry serves a later one).
    pub fn decode_at(params: &Value, lineage_id: &str, version: u64) -> Result<Self, Refusal> {
        strict(params, &READ_MEMBERS)?;
        let limit = match count(params, "limit")? {
            Some(0) => return Err(invalid_params("limit", "must be at least 1")),
            Some(n) => n.min(READ_MAX_LIMIT),
            None => READ_DEFAULT_LIMIT,
        };
        let max_bytes = match count(params, "max_bytes")? {
            Some(0) => return Err(invalid_params("max_bytes", "must be at least 1")),
            Some(n) => n.min(READ_MAX_BYTES),
            None => READ_MAX_BYTES,
        };
        let include_tools = flag(params, "include_tools")?;
        // No hook changes a broca message, so no entry has originals to add.
        flag(params, "include_originals")?;
        match params.get("view") {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if v == "raw" => {}
            Some(_) => return Err(invalid_params("view", "only \"raw\" is served")),
        }
        let media = match params.get("media") {
            None | Some(Value::Null) => MediaMode::Inline,
            Some(Value::String(m)) if m == "inline" => MediaMode::Inline,
            Some(Value::String(m)) if m == "descriptors" => MediaMode::Descriptors,
            Some(Value::String(m)) if m == "blocks" => {
                return Err(invalid_params(
                    "media",
                    "\"blocks\" needs the attachments group, which broca does not declare",
                ))
            }
            Some(_) => return Err(invalid_params("media", "\"inline\" or \"descriptors\"")),
        };
        let from = count(params, "from_ordinal")?;
        let after = optional_string(params, "after_mid")?;
        let history_version = count(params, "history_version")?;
        let lineage = optional_string(params, "lineage_id")?;
        let cursor = match (after, from) {
            (Some(_), Some(_)) => return Err(invalid_params("from_ordinal", "excludes after_mid")),
            (Some(_), None) if history_version.is_none() && lineage.is_none() => {
                return Err(invalid_params("history_version", "after_mid needs the page's history_version"))
            }
            (Some(mid), None) => ReadCursor::After(parse_mid(&mid)?),
            (None, Some(from)) => ReadCursor::From(from.max(1)),
            (None, None) => ReadCursor::Tail,
        };
        if let Some(v) = history_version.filter(|&v| v != version) {
            let message = format!("history version {v} is not the session's ({version}): read again from the tail");
            let detail = crate::detail!("history_version" => version);
            return Err(Refusal::new(RefusalCode::HistoryChanged, message, Some(detail)));
        }
        if let Some(l) = lineage.filter(|l| l != lineage_id) {
            let message = format!("lineage {l} is not the session's: read again from the tail");
            return Err(Refusal::new(
                RefusalCode::LineageChanged,
                message,
                Some(crate::detail!("lineage_id" => lineage_id)),
            ));
        }
        Ok(ReadRequest { cursor, limit, max_bytes, include_tools, media })
    }
}

/// The served ordinal a `mid` names (`m<ordinal>`, ordinal ≥ 1); anything else names no message.
pub(super) fn parse_mid(mid: &str) -> Result<u64, Refusal> {
    match mid.strip_prefix('m').and_then(|n| n.parse::<u64>().ok()).filter(|&n| n >= 1 && mid == format!("m{n}")) {
        Some(n) => Ok(n),
        None => Err(unknown_mid(mid)),
    }
}

/// `unknown_mid` naming the id.
pub fn unknown_mid(mid: &str) -> Refusal {
    Refusal::new(
        RefusalCode::UnknownMid,
        format!("no message {mid:?} in this session"),
        Some(crate::detail!("mid" => mid)),
    )
}

/// An optional boolean member.
fn flag(params: &Value, field: &str) -> Result<bool, Refusal> {
    match params.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid_params(field, "must be a boolean")),
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
pub(super) fn optional_string(params: &Value, field: &str) -> Result<Option<String>, Refusal> {
    match params.get(field) {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(invalid_params(field, "a non-empty string is required")),
    }
}

pub(super) fn count(params: &Value, field: &str) -> Result<Option<u64>, Refusal> {
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
        assert_eq!(ReadRequest::decode(&json!({"limit": 5000}), "l").unwrap().limit, READ_MAX_LIMIT);
        assert_eq!(ReadRequest::decode(&Value::Null, "l").unwrap().limit, READ_DEFAULT_LIMIT);
        assert_eq!(
            ReadRequest::decode(&json!({"limit": 0}), "l").unwrap_err().message,
            "invalid params: limit: must be at least 1"
        );
        // `limit` is checked before `from_ordinal`.
        let e = ReadRequest::decode(&json!({"limit": -1, "from_ordinal": "x"}), "l").unwrap_err();
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
