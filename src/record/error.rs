//! The typed error a run records: its class and the provider's (or broca's) words.

use serde::{Deserialize, Serialize};

use super::{ORPHAN_PROVIDER_CODE, STORAGE_FAILED_CODE};

/// Error classes of the role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    Transient,
    Permanent,
    AuthRequired,
    ContextOverflow,
}

/// A typed provider (or process) error persisted on a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderError {
    pub class: ErrorClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
}

impl ProviderError {
    /// A permanent error broca itself decided (no provider status).
    pub fn permanent(code: &str, message: impl Into<String>) -> ProviderError {
        ProviderError {
            class: ErrorClass::Permanent,
            provider_code: Some(code.into()),
            message: message.into(),
            http_status: None,
        }
    }

    /// The diagnostic a run is sealed with when its WAL latched an I/O failure in this process
    /// (the run could not be ended then; it is sealed when the session reopens).
    pub fn storage_failed(cause: &str) -> ProviderError {
        ProviderError {
            class: ErrorClass::Transient,
            provider_code: Some(STORAGE_FAILED_CODE.into()),
            message: format!("the session's WAL failed while this run was going ({cause}); it was sealed on reopen"),
            http_status: None,
        }
    }

    /// The diagnostic an orphaned run is sealed with.
    pub fn previous_process_ended() -> ProviderError {
        ProviderError {
            class: ErrorClass::Transient,
            provider_code: Some(ORPHAN_PROVIDER_CODE.into()),
            message: "the previous broca process ended without sealing this run: host crash, kill, or power loss"
                .into(),
            http_status: None,
        }
    }
}
