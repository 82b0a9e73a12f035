//! `session.warm { lineage_id?, history_version? }` (spec §4a): the request, its answer, and
//! its refusals. Every refusal is decided before anything is sent and writes nothing; its
//! `code` equals its `detail.kind`, and each is pinned as `testdata/golden/warm_refusal.*.json`.

use serde::Serialize;
use serde_json::Value;

use super::requests::{count, optional_string};
use super::{strict, Detail, Refusal, RefusalCode};
pub use crate::provider::warm::WarmUnsupported;
use crate::record::{ErrorClass, ProviderError};

/// A warm names the session it expects (either identity, or none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WarmRequest {
    pub lineage_id: Option<String>,
    /// llm-runner 0.8.0's identity (`history_version`), accepted beside broca's `lineage_id`.
    pub history_version: Option<u64>,
}

impl WarmRequest {
    pub fn decode(params: &Value) -> Result<WarmRequest, Refusal> {
        strict(params, &["lineage_id", "history_version"])?;
        let lineage_id = optional_string(params, "lineage_id")?;
        let history_version = count(params, "history_version")?;
        Ok(WarmRequest { lineage_id, history_version })
    }

    /// The refusal when the request names another lineage or history version than the
    /// session's (`lineage_changed` either way: the cache of another history is not this one).
    pub fn check(&self, lineage_id: &str, history_version: u64) -> Result<(), WarmRefusal> {
        let other_lineage = self.lineage_id.as_deref().is_some_and(|l| l != lineage_id);
        let other_version = self.history_version.is_some_and(|v| v != history_version);
        if other_lineage || other_version {
            return Err(WarmRefusal::LineageChanged { lineage_id: lineage_id.to_owned(), history_version });
        }
        Ok(())
    }
}

/// What a warm cost and what it bought (W-1). Token counts are the provider's own, absent
/// where it reported none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WarmReply {
    pub request_body_sha256: String,
    pub warm_body_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub expiry_basis: &'static str,
}

/// The warm's refusals, in the order they are decided (`crate::actor::warm`).
#[derive(Clone, Debug, PartialEq)]
pub enum WarmRefusal {
    LineageChanged {
        lineage_id: String,
        history_version: u64,
    },
    RunPaused {
        run_id: String,
        reason: String,
    },
    WarmInFlight,
    NoStepYet,
    Unsupported {
        reason: WarmUnsupported,
        provider: String,
    },
    AccountWalled {
        resets_at_ms: Option<u64>,
    },
    CacheExpired {
        expires_at_ms: Option<u64>,
    },
    PrefixUnavailable {
        request_body_sha256: Option<String>,
    },
    AccountChanged {
        credential_id: String,
    },
    /// Sent, and the provider (or the way to it) refused: its error as the run records one.
    Failed(ProviderError),
}

impl WarmRefusal {
    pub fn code(&self) -> RefusalCode {
        match self {
            WarmRefusal::LineageChanged { .. } => RefusalCode::LineageChanged,
            WarmRefusal::RunPaused { .. } => RefusalCode::RunPaused,
            WarmRefusal::WarmInFlight => RefusalCode::WarmInFlight,
            WarmRefusal::NoStepYet => RefusalCode::NoStepYet,
            WarmRefusal::Unsupported { .. } => RefusalCode::WarmUnsupported,
            WarmRefusal::AccountWalled { .. } => RefusalCode::AccountWalled,
            WarmRefusal::CacheExpired { .. } => RefusalCode::CacheExpired,
            WarmRefusal::PrefixUnavailable { .. } => RefusalCode::WarmPrefixUnavailable,
            WarmRefusal::AccountChanged { .. } => RefusalCode::AccountChanged,
            WarmRefusal::Failed(_) => RefusalCode::WarmFailed,
        }
    }

    /// The served refusal: `detail` is `{kind, class, …}` with `kind` the code.
    pub fn refusal(&self) -> Refusal {
        let code = self.code();
        let kind = code.as_str();
        let class = |class: &str| Detail(vec![("kind", kind.into()), ("class", class.into())]);
        let (message, detail) = match self {
            WarmRefusal::LineageChanged { lineage_id, history_version } => {
                let mut d = class("permanent");
                d.0.push(("lineage_id", lineage_id.as_str().into()));
                d.0.push(("history_version", (*history_version).into()));
                ("session.warm names another lineage or history version than the session's".to_owned(), d)
            }
            WarmRefusal::RunPaused { run_id, reason } => {
                let mut d = class("permanent");
                d.0.push(("run_id", run_id.as_str().into()));
                d.0.push(("reason", reason.as_str().into()));
                (format!("run {run_id} is paused ({reason}): nothing is warmed until it resumes or ends"), d)
            }
            WarmRefusal::WarmInFlight => {
                ("another warm of this session has not finished; one runs at a time".to_owned(), class("transient"))
            }
            WarmRefusal::NoStepYet => {
                ("the session has sent no model request yet: there is nothing to warm".to_owned(), class("permanent"))
            }
            WarmRefusal::Unsupported { reason, provider } => {
                let mut d = class("permanent");
                d.0.push(("reason", reason.as_str().into()));
                d.0.push(("provider", provider.as_str().into()));
                let why = match reason {
                    WarmUnsupported::Provider => "only first-party Anthropic Messages takes a zero-output request",
                    WarmUnsupported::BedrockConverse => "Bedrock Converse has no documented zero-output request",
                    WarmUnsupported::ManualThinking => "manual thinking needs max_tokens above its budget",
                    WarmUnsupported::ForcedToolChoice => "a forced tool_choice must produce a call",
                    WarmUnsupported::StructuredOutput => "a structured output format must produce output",
                };
                (format!("this session's request cannot be warmed on {provider}: {why}"), d)
            }
            WarmRefusal::AccountWalled { resets_at_ms } => {
                let mut d = class("transient");
                if let Some(at) = resets_at_ms {
                    d.0.push(("resets_at_ms", (*at).into()));
                }
                ("the session's account hit its usage limit and has not reset".to_owned(), d)
            }
            WarmRefusal::CacheExpired { expires_at_ms } => {
                let mut d = class("permanent");
                if let Some(at) = expires_at_ms {
                    d.0.push(("expires_at_ms", (*at).into()));
                }
                let why = match expires_at_ms {
                    None => "its estimated expiry is unknown (no request answered since this process started)",
                    Some(_) => "it expires in under 5 s",
                };
                (format!("the cached prefix would be written again, not refreshed: {why}"), d)
            }
            WarmRefusal::PrefixUnavailable { request_body_sha256 } => {
                let mut d = class("permanent");
                if let Some(sha) = request_body_sha256 {
                    d.0.push(("request_body_sha256", sha.as_str().into()));
                }
                ("the session's last request cannot be rebuilt to the bytes its step sent".to_owned(), d)
            }
            WarmRefusal::AccountChanged { credential_id } => {
                let mut d = class("permanent");
                d.0.push(("credential_id", credential_id.as_str().into()));
                (
                    format!(
                        "credential '{credential_id}' now belongs to another account than the session froze; the cache is that account's"
                    ),
                    d,
                )
            }
            WarmRefusal::Failed(error) => {
                let mut d = class(error_class(error.class));
                if let Some(code) = &error.provider_code {
                    d.0.push(("provider_code", code.as_str().into()));
                }
                if let Some(status) = error.http_status {
                    d.0.push(("http_status", status.into()));
                }
                (format!("the provider refused the warm: {}", error.message), d)
            }
        };
        Refusal::new(code, message, Some(detail))
    }
}

fn error_class(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Transient => "transient",
        ErrorClass::AuthRequired => "auth_required",
        ErrorClass::ContextOverflow => "context_overflow",
        ErrorClass::Permanent => "permanent",
    }
}
