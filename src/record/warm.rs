//! The `cache_warmed` record (spec §4a "Records"): one successful `session.warm`. It is
//! informational and ungated (no must-understand feature): replay, `session.read` and the
//! projection skip it, so it never becomes a transcript message or a control unit. Billing
//! reads it: the store turns it into its own export fact marked warm, whose id is taken over
//! the record's WAL sequence.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::message::StepUsage;

/// One warm the provider answered. Every member is optional on read, so a record an older or
/// newer build wrote still decodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheWarmed {
    /// The run whose request the warm re-sent (its fact is billed under it).
    #[serde(default)]
    pub run_id: String,
    /// The digest of the re-sent base request (the step's `request_body_sha256`).
    #[serde(default)]
    pub request_body_sha256: String,
    /// The digest of the cache-only body actually sent.
    #[serde(default)]
    pub warm_body_sha256: String,
    /// What the provider reported; a measurement it did not report stays absent.
    #[serde(default)]
    pub usage: StepUsage,
    /// The route and model the warm went to (the fact's provider and model).
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// The account the credential belonged to, where the session froze one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// The provider's raw `anthropic-ratelimit-unified-*` response headers, by lowercase name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ratelimit: BTreeMap<String, String>,
    /// The warm's send start (unix ms): the cache lifetime restarts here.
    #[serde(default)]
    pub sent_at_ms: u64,
    /// The lifetime its marks asked for, and the estimated expiry it gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}
