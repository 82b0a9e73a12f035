//! `session.history` (llm-runner/v1 §4.6–§4.7; spec §4): the request, decoded strictly, and the
//! opaque cursors its pages mint. Ordinals here are served ones (from 1).
//!
//! A cursor is `h1.<lineage_id>.<older|newer>.<ordinal>`: bound to its session (another
//! session's cursor is `cursor_expired`), naming the page that ends directly before `ordinal`
//! (`older`) or starts at it (`newer`). broca's history is append-only, so a cursor never
//! expires within its own session.

use serde_json::Value;

use super::requests::{parse_mid, READ_DEFAULT_LIMIT, READ_MAX_BYTES, READ_MAX_LIMIT};
use super::{invalid_params, strict, Refusal, RefusalCode};

/// The members `session.history` reads.
const HISTORY_MEMBERS: [&str; 12] = [
    "cursor",
    "from_mid",
    "before_mid",
    "from_ordinal",
    "before_ordinal",
    "limit",
    "max_bytes",
    "media",
    "include_originals",
    "view",
    "form",
    "limits",
];

/// Where a history page is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistorySeek {
    Newest,
    /// Forward from this served ordinal, inclusive.
    From(u64),
    /// The page ending directly before this served ordinal.
    Before(u64),
}

/// How a position was named: the refusal a missing entry gets depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Named {
    Newest,
    Cursor,
    Mid,
    Ordinal,
}

/// The byte bounds of a display row's tool payloads.
pub use cortexkit_role_llm_runner::display::Limits;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryRequest {
    pub seek: HistorySeek,
    pub named: Named,
    pub limit: u64,
    pub max_bytes: u64,
    /// `form: "display"`: canonical rows in place of bodies.
    pub display: bool,
    pub limits: Option<Limits>,
}

impl HistoryRequest {
    /// Decodes against the session's lineage id (a cursor minted for another session is
    /// `cursor_expired`).
    pub fn decode(params: &Value, lineage_id: &str) -> Result<Self, Refusal> {
        strict(params, &HISTORY_MEMBERS)?;
        let get = |k: &str| params.get(k).filter(|v| !v.is_null());
        let count = |k: &str| match get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| invalid_params(k, "a non-negative integer is required")),
        };
        let string = |k: &str| match get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid_params(k, "a string is required")),
        };
        let limit = match count("limit")? {
            Some(0) => return Err(invalid_params("limit", "must be at least 1")),
            Some(n) => n.min(READ_MAX_LIMIT),
            None => READ_DEFAULT_LIMIT,
        };
        let max_bytes = match count("max_bytes")? {
            Some(0) => return Err(invalid_params("max_bytes", "must be at least 1")),
            Some(n) => n.min(READ_MAX_BYTES),
            None => READ_MAX_BYTES,
        };
        match get("view") {
            None => {}
            Some(Value::String(v)) if v == "raw" => {}
            Some(_) => return Err(invalid_params("view", "history serves raw entries only")),
        }
        let display = match get("form") {
            None => false,
            Some(Value::String(f)) if f == "raw" => false,
            Some(Value::String(f)) if f == "display" => true,
            Some(_) => return Err(invalid_params("form", "\"raw\" or \"display\"")),
        };
        let media = get("media");
        if let Some(m) = media {
            if m != "inline" {
                return Err(invalid_params("media", "only \"inline\" is served"));
            }
        }
        let originals = match get("include_originals") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid_params("include_originals", "must be a boolean")),
        };
        let limits = match get("limits") {
            None => None,
            Some(v) => Some(
                serde_json::from_value::<Limits>(v.clone())
                    .map_err(|_| invalid_params("limits", "{arguments_bytes, result_bytes, error_result_bytes}"))?,
            ),
        };
        if display && media.is_some() {
            return Err(invalid_params("media", "a display row describes media by refs"));
        }
        if display && originals {
            return Err(invalid_params("include_originals", "a display row carries no originals"));
        }
        if !display && limits.is_some() {
            return Err(invalid_params("limits", "only with form: \"display\""));
        }
        // At most one position; the second given is named, in the contract's order.
        let cursor = string("cursor")?;
        let from_mid = string("from_mid")?;
        let before_mid = string("before_mid")?;
        let from_ordinal = count("from_ordinal")?;
        let before_ordinal = count("before_ordinal")?;
        let given = [
            ("cursor", cursor.is_some()),
            ("from_mid", from_mid.is_some()),
            ("before_mid", before_mid.is_some()),
            ("from_ordinal", from_ordinal.is_some()),
            ("before_ordinal", before_ordinal.is_some()),
        ];
        if let Some((second, _)) = given.iter().filter(|(_, g)| *g).nth(1) {
            return Err(invalid_params(second, "give at most one position"));
        }
        let (seek, named) = if let Some(c) = cursor {
            (parse_cursor(&c, lineage_id)?, Named::Cursor)
        } else if let Some(m) = from_mid {
            (HistorySeek::From(parse_mid(&m)?), Named::Mid)
        } else if let Some(m) = before_mid {
            (HistorySeek::Before(parse_mid(&m)?), Named::Mid)
        } else if let Some(o) = from_ordinal {
            (HistorySeek::From(o.max(1)), Named::Ordinal)
        } else if let Some(o) = before_ordinal {
            (HistorySeek::Before(o.max(1)), Named::Ordinal)
        } else {
            (HistorySeek::Newest, Named::Newest)
        };
        Ok(HistoryRequest { seek, named, limit, max_bytes, display, limits })
    }
}

/// The cursor naming the page that ends directly before served ordinal `before`.
pub fn older_cursor(lineage_id: &str, before: u64) -> String {
    format!("h1.{lineage_id}.older.{before}")
}

/// The cursor naming the page that starts at served ordinal `from`.
pub fn newer_cursor(lineage_id: &str, from: u64) -> String {
    format!("h1.{lineage_id}.newer.{from}")
}

fn parse_cursor(cursor: &str, lineage_id: &str) -> Result<HistorySeek, Refusal> {
    let bad = || invalid_params("cursor", "not a cursor this runner minted");
    let mut parts = cursor.split('.');
    let (Some("h1"), Some(lineage), Some(way), Some(n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let n: u64 = n.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    if lineage != lineage_id {
        let message = "the cursor was minted for another session";
        return Err(Refusal::new(RefusalCode::CursorExpired, message, Some(crate::detail!("field" => "cursor"))));
    }
    match way {
        "older" => Ok(HistorySeek::Before(n)),
        "newer" => Ok(HistorySeek::From(n)),
        _ => Err(bad()),
    }
}
