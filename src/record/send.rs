//! A queued send's request as its `Queued` record keeps it, and why a waiting list send ended.

use serde::{Deserialize, Serialize};

use super::{Delivery, Frozen, Mode};

/// Who asked for a queued submission, and what they asked for (the request identity, not just
/// its message).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestIdentity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<String>,
    pub received_at_ms: u64,
    /// The config frozen at admission, so the run this send starts later renders what was
    /// admitted (a build or catalog change meanwhile cannot alter it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Frozen>,
    /// `queue` (absent), `steer` or `interrupt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// For a steer: the running run it joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_run: Option<String>,
    /// The send's identity, one SHA-256 per identity field (`title` and `send_id` excluded), so
    /// a keyed re-send with other content is refused naming the field that differs.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub identity: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// A `delivery_order` send's list, replacing `delivery` (llm-runner §9.7): delivered at the
    /// first boundary where one of its modes is possible, never starting a run without
    /// `idle_start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<Mode>>,
    /// The list's replacement key: a later send from the same sender with the same key
    /// supersedes this one while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_key: Option<String>,
    /// When the list send, still undelivered, is dropped (`expired`), ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl RequestIdentity {
    /// The delivery mode, `queue` when absent.
    pub fn delivery(&self) -> Delivery {
        self.delivery.unwrap_or_default()
    }

    /// Whether this send may start a run of its own: a legacy send always, a list only with
    /// `idle_start`.
    pub fn may_start(&self) -> bool {
        self.order.as_ref().is_none_or(|modes| modes.contains(&Mode::IdleStart))
    }
}

/// Why a waiting `delivery_order` send ended undelivered (llm-runner §9.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// A later send from the same sender with the same `dedupe_key` replaced it.
    Superseded,
    /// Its `expires_at_ms` passed before any boundary could deliver it.
    Expired,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Superseded => "superseded",
            DropReason::Expired => "expired",
        }
    }
}
