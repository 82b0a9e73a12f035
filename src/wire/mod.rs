//! The wire layer: what broca's ops accept and answer, decoded and encoded without I/O.
//!
//! - [`send`]: `session.send` (lenient: an unread member is logged once per key);
//! - [`requests`]: every other op's request, strict (an unknown member is refused by name);
//! - [`answers`]: the typed answers the session actor gives (send, retract, cancel);
//! - [`status`]: the read ops' answers (`run.status`, `run.result`, `session.read` pages);
//! - here: refusal bodies, `{code, message, detail?}` (subc `ErrorBody`). Every field other
//!   than `code` and `message` goes inside `detail`. The served bytes of each refusal are pinned
//!   by a golden file under `testdata/golden/`, so `detail` keeps its members in the order the
//!   spec writes them (a plain JSON map would sort them).

pub mod answers;
pub mod delivery;
pub mod descriptors;
pub mod history;
pub mod plan;
pub mod read;
pub mod refs;
pub mod requests;
pub mod send;
pub mod status;
pub mod warm;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::Value;

/// An ordered `detail` object.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Detail(pub Vec<(&'static str, Value)>);

impl Detail {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl Serialize for Detail {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// Builds a [`Detail`] from `key => value` pairs, in order.
#[macro_export]
macro_rules! detail {
    ($($k:literal => $v:expr),* $(,)?) => {
        $crate::wire::Detail(vec![$(($k, serde_json::json!($v))),*])
    };
}

/// Every refusal code broca emits: the one place each is spelled. Served as its snake_case
/// string (`as_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalCode {
    /// A send names a context management other than the one the session froze.
    ContextManagementChanged,
    /// The context management a send asks for is not served.
    ContextManagementUnavailable,
    /// A member is malformed or unknown (`detail.field` names it).
    InvalidParams,
    /// The session's project root no longer exists (writes refused).
    InvalidProjectRoot,
    /// The session's lease file is held by a stale holder.
    LeaseStale,
    /// The catalog has no such model.
    ModelUnknown,
    /// broca is draining: send again shortly.
    ModuleReloading,
    /// The session could not be opened or read (`detail.class` when known).
    OpenFailed,
    /// A reply (a named message) would cross the transport's frame limit.
    ReplyTooLarge,
    /// The session's run is paused (for authentication): only its own send resumes it.
    RunPaused,
    /// A route bound with a work scope takes tools only from a fetch plan.
    ScopedToolsRequirePlan,
    /// A `send_id` was sent again with other content (`detail.field`).
    SendIdReuse,
    /// Another writer holds the session.
    SessionBusy,
    /// A subscription's WAL replay failed.
    SubscribeReplayFailed,
    /// A stream unit cannot be put on the wire.
    SubscribeUnitUndeliverable,
    /// A subscriber fell behind the control stream: resubscribe from its cursor.
    SubscriberLagged,
    /// A request arrived on a route that is not bound.
    UnknownChannel,
    /// No such operation on a session route.
    UnknownMethod,
    /// No such run in this session.
    UnknownRun,
    /// No send with this `send_id` is recorded.
    UnknownSend,
    /// The model does not define the requested variant.
    VariantUnsupported,
    /// The session's WAL was written by a newer broca.
    WalNewerWriter,
    /// A reply exceeds the transport limit and names no message to refuse it by (spec §4:
    /// "the adapter's generic `response_too_large` refusal"; subc-protocol's own
    /// `frame_too_large` is the daemon's code for frames it refuses, never broca's).
    ResponseTooLarge,
    /// A bind carries no daemon-stamped principal (subc layer).
    NotAuthorized,
    /// A control request is malformed (subc layer).
    InvalidRequest,
    /// A control request asks for a call mode broca does not serve (subc layer).
    CallModeUnsupported,
    /// A route bind was rejected (subc layer).
    RouteRejected,
    /// A peer's error frame does not decode (subc layer).
    InvalidError,
    /// A peer's hello frame does not decode (subc layer).
    InvalidHello,
    /// A bind declares two roles, or a role version broca does not serve (spec §4b).
    RoleVersionsUnsupported,
    /// `classify.run` without a stamped run or flow scope (spec §4b).
    ScopeRequired,
    /// `reserved:basal` classifying without a flow scope (spec §4b).
    FlowScopeRequired,
    /// A batch re-sent under another work scope than its first (spec §4b).
    BatchScopeMismatch,
    /// The classifier's own store failed or could not be opened (transient).
    Unavailable,
    /// A later send names a plan other than the session's frozen one (`detail {frozen?, sent}`).
    PlanDrift,
    /// A required plan provider could not be fetched (`detail {provider, class}`).
    FetchUnavailable,
    /// Two plan providers offer a tool of the same name (`detail {name, providers}`).
    ToolNameCollision,
    /// A provider's catalog answer is unusable (`detail {provider, reason}`).
    PlanStale,
    /// A read names a history version other than the session's.
    HistoryChanged,
    /// A read names a lineage other than the session's.
    LineageChanged,
    /// A read's `after_mid` names no message of the session.
    UnknownMid,
    /// A history position names an ordinal the session never assigned.
    UnknownOrdinal,
    /// An output-reference set, record or cursor that is not this session's, or a record
    /// without retained content (llm-runner §9.13).
    UnknownRef,
    /// A history cursor no longer names a page (another session's).
    CursorExpired,
    /// A history page holds an entry without a recorded creation time.
    HistoryUnrepresentable,
    /// An owner-only operation from a caller other than the session's owner (`crate::owner`;
    /// `detail.principal` is the caller as the daemon stamped it).
    ScopeOwnerMismatch,
    /// Every op worker is busy (`detail {limit}`): send again shortly.
    TooManyRequests,
    /// Opening one more session would cross the open-session limit (`detail {limit}`).
    TooManySessions,
    /// One more subscription would cross a subscriber limit (`detail {limit, scope}`).
    TooManySubscribers,
    /// The session already holds its limit of queued sends (`detail {limit}`).
    SessionQueueFull,
    /// The session's record expired under its retention (`detail {expired_at_ms}`, llm-runner
    /// §9.1); terminal.
    Expired,
    /// `session.warm` (spec §4a): another warm of the session has not finished.
    WarmInFlight,
    /// `session.warm`: the latest attempt hit the account's limit and it has not reset.
    AccountWalled,
    /// `session.warm`: the credential now belongs to another account than the session froze.
    AccountChanged,
    /// `session.warm`: the session has sent no model request to re-send.
    NoStepYet,
    /// `session.warm`: the session's route or request cannot be warmed (`detail.reason`).
    WarmUnsupported,
    /// `session.warm`: the cache's estimated expiry is unknown or under 5 s away.
    CacheExpired,
    /// `session.warm`: the last request cannot be rebuilt to the bytes its step sent.
    WarmPrefixUnavailable,
    /// `session.warm`: the warm was sent and the provider refused it (its error in `detail`).
    WarmFailed,
    /// The session was exported to another host (`crate::moves`): this copy takes no sends
    /// (`detail {class: "permanent", session_ref, epoch}`).
    SessionMoved,
    /// A move op names a session this host holds no record of (`detail {session_ref}`).
    SessionNotFound,
    /// `move.adopt`: this host holds a copy the archive does not continue.
    SessionExists,
    /// `move.adopt`: the archive does not check out (`detail {field, reason}`).
    ArchiveInvalid,
    /// `move.export`: the session's WAL is larger than a move carries (`detail {class:
    /// "permanent", limit, wal_bytes}`); nothing was written.
    SessionTooLarge,
    /// The run index proves the session has history no WAL here covers (spec §15; `detail
    /// {class: "permanent", session_ref}`, never a path).
    HistoryUnreachable,
    /// A `delivery_order` list none of whose modes this runner declares (`detail {delivery}`,
    /// the list as sent; llm-runner §9.7).
    DeliveryUnsupported,
    /// A template send whose `part_tag` slot names a part the session does not show (`detail
    /// {slot}`; llm-runner §9.7).
    TemplatePartGone,
}

impl RefusalCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            RefusalCode::ContextManagementChanged => "context_management_changed",
            RefusalCode::ContextManagementUnavailable => "context_management_unavailable",
            RefusalCode::InvalidParams => "invalid_params",
            RefusalCode::InvalidProjectRoot => "invalid_project_root",
            RefusalCode::LeaseStale => "lease_stale",
            RefusalCode::ModelUnknown => "model_unknown",
            RefusalCode::ModuleReloading => "module_reloading",
            RefusalCode::OpenFailed => "open_failed",
            RefusalCode::ReplyTooLarge => "reply_too_large",
            RefusalCode::RunPaused => "run_paused",
            RefusalCode::ScopedToolsRequirePlan => "scoped_tools_require_plan",
            RefusalCode::SendIdReuse => "send_id_reuse",
            RefusalCode::SessionBusy => "session_busy",
            RefusalCode::SubscribeReplayFailed => "subscribe_replay_failed",
            RefusalCode::SubscribeUnitUndeliverable => "subscribe_unit_undeliverable",
            RefusalCode::SubscriberLagged => "subscriber_lagged",
            RefusalCode::UnknownChannel => "unknown_channel",
            RefusalCode::UnknownMethod => "unknown_method",
            RefusalCode::UnknownRun => "unknown_run",
            RefusalCode::UnknownSend => "unknown_send",
            RefusalCode::VariantUnsupported => "variant_unsupported",
            RefusalCode::WalNewerWriter => "wal_newer_writer",
            RefusalCode::ResponseTooLarge => "response_too_large",
            RefusalCode::NotAuthorized => "not_authorized",
            RefusalCode::InvalidRequest => "invalid_request",
            RefusalCode::CallModeUnsupported => "call_mode_unsupported",
            RefusalCode::RouteRejected => "route_rejected",
            RefusalCode::InvalidError => "invalid_error",
            RefusalCode::InvalidHello => "invalid_hello",
            RefusalCode::RoleVersionsUnsupported => "role_versions_unsupported",
            RefusalCode::ScopeRequired => "scope_required",
            RefusalCode::FlowScopeRequired => "flow_scope_required",
            RefusalCode::BatchScopeMismatch => "batch_scope_mismatch",
            RefusalCode::Unavailable => "unavailable",
            RefusalCode::PlanDrift => "plan_drift",
            RefusalCode::FetchUnavailable => "fetch_unavailable",
            RefusalCode::ToolNameCollision => "tool_name_collision",
            RefusalCode::PlanStale => "plan_stale",
            RefusalCode::HistoryChanged => "history_changed",
            RefusalCode::LineageChanged => "lineage_changed",
            RefusalCode::UnknownMid => "unknown_mid",
            RefusalCode::UnknownOrdinal => "unknown_ordinal",
            RefusalCode::UnknownRef => "unknown_ref",
            RefusalCode::CursorExpired => "cursor_expired",
            RefusalCode::HistoryUnrepresentable => "history_unrepresentable",
            RefusalCode::ScopeOwnerMismatch => "scope_owner_mismatch",
            RefusalCode::TooManyRequests => "too_many_requests",
            RefusalCode::TooManySessions => "too_many_sessions",
            RefusalCode::TooManySubscribers => "too_many_subscribers",
            RefusalCode::SessionQueueFull => "session_queue_full",
            RefusalCode::Expired => "expired",
            RefusalCode::WarmInFlight => "warm_in_flight",
            RefusalCode::AccountWalled => "account_walled",
            RefusalCode::AccountChanged => "account_changed",
            RefusalCode::NoStepYet => "no_step_yet",
            RefusalCode::WarmUnsupported => "warm_unsupported",
            RefusalCode::CacheExpired => "cache_expired",
            RefusalCode::WarmPrefixUnavailable => "warm_prefix_unavailable",
            RefusalCode::WarmFailed => "warm_failed",
            RefusalCode::SessionMoved => "session_moved",
            RefusalCode::SessionNotFound => "session_not_found",
            RefusalCode::SessionExists => "session_exists",
            RefusalCode::ArchiveInvalid => "archive_invalid",
            RefusalCode::SessionTooLarge => "session_too_large",
            RefusalCode::HistoryUnreachable => "history_unreachable",
            RefusalCode::DeliveryUnsupported => "delivery_unsupported",
            RefusalCode::TemplatePartGone => "template_part_gone",
        }
    }
}

impl std::fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RefusalCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl PartialEq<&str> for RefusalCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for RefusalCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
}

impl Refusal {
    pub fn new(code: RefusalCode, message: impl Into<String>, detail: Option<Detail>) -> Refusal {
        Refusal { code, message: message.into(), detail }
    }

    /// The exact bytes served.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("refusals serialize")
    }
}

/// A bound of [`crate::limits`] was reached: `code` with `detail {limit, class: "transient"}`
/// (and `scope` when the bound is one of several of its kind). Nothing was written.
pub fn over_limit(code: RefusalCode, what: &str, limit: usize, scope: Option<&str>) -> Refusal {
    let message = format!("{what}: the limit of {limit} is reached; try again shortly");
    let detail = match scope {
        Some(scope) => crate::detail!("limit" => limit, "scope" => scope, "class" => "transient"),
        None => crate::detail!("limit" => limit, "class" => "transient"),
    };
    Refusal::new(code, message, Some(detail))
}

/// `invalid_params` naming the member at fault.
pub fn invalid_params(field: &str, why: &str) -> Refusal {
    Refusal::new(
        RefusalCode::InvalidParams,
        format!("invalid params: {field}: {why}"),
        Some(crate::detail!("field" => field)),
    )
}

/// `scope_owner_mismatch`: `method` is owner-only and `caller` is not the session's owner. It
/// names the caller's own stamped principal (never the owner's) and nothing of the session.
pub fn scope_owner_mismatch(method: &str, caller: &crate::owner::Caller) -> Refusal {
    let message = format!(
        "scope owner mismatch: only the session's owner may call {method}; this route's caller is {}",
        caller.principal
    );
    Refusal::new(RefusalCode::ScopeOwnerMismatch, message, Some(crate::detail!("principal" => caller.principal)))
}

/// Refuses members outside `known` (strict ops).
pub fn strict(params: &Value, known: &[&str]) -> Result<(), Refusal> {
    match params {
        Value::Null => Ok(()),
        Value::Object(map) => match map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(invalid_params(k, "unknown member")),
            None => Ok(()),
        },
        _ => Err(invalid_params("params", "must be an object")),
    }
}

/// Distinct unread `session.send` member names remembered (each logged once); past it, new
/// names are logged once more as "and others" and not remembered, so a caller inventing member
/// names cannot grow the set.
pub const UNREAD_NAMES_MAX: usize = 256;
/// The longest member name (and harness) a log line repeats; longer ones are cut and marked.
pub const LOGGED_NAME_MAX: usize = 64;

/// `name` cut to [`LOGGED_NAME_MAX`] bytes at a character boundary, marked when cut.
pub(crate) fn loggable(name: &str) -> String {
    if name.len() <= LOGGED_NAME_MAX {
        return name.to_owned();
    }
    let mut end = LOGGED_NAME_MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes)", &name[..end], name.len())
}

/// Logs an unread `session.send` member once per key per process (bounded, see
/// [`UNREAD_NAMES_MAX`]); returns whether it logged.
pub(crate) fn note_unread(key: &str, harness: &str) -> bool {
    static SEEN: OnceLock<Mutex<(BTreeSet<String>, bool)>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock();
    let (names, overflowed) = &mut *seen;
    let (key, harness) = (loggable(key), loggable(harness));
    if names.contains(&key) {
        return false;
    }
    if names.len() < UNREAD_NAMES_MAX {
        names.insert(key.clone());
        log::warn!(target: "broca.wire", "session.send member {key:?} (from harness {harness:?}) is not read by this build");
        return true;
    }
    if !std::mem::replace(overflowed, true) {
        log::warn!(target: "broca.wire", "session.send member {key:?} (from harness {harness:?}) and others are not read by this build; {UNREAD_NAMES_MAX} names were logged, later ones are not");
        return true;
    }
    false
}

#[cfg(test)]
mod unread_tests {
    use super::*;

    #[test]
    fn unread_names_are_bounded_and_cut_in_logs() {
        let long = "x".repeat(10_000);
        assert!(loggable(&long).len() < 100 && loggable(&long).ends_with("(10000 bytes)"));
        assert_eq!(loggable("é".repeat(40).as_str()).chars().next(), Some('é'), "cut on a char boundary");
        // Thousands of invented names: the set stops growing and the log stops repeating them.
        let logged = (0..3 * UNREAD_NAMES_MAX).filter(|i| note_unread(&format!("bogus-{i}-{long}"), "h")).count();
        assert!(logged <= UNREAD_NAMES_MAX + 1, "{logged} lines for invented names");
        assert!(!note_unread(&format!("bogus-{}-{long}", 3 * UNREAD_NAMES_MAX - 1), "h"), "past the bound, silent");
    }
}
