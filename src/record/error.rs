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
    /// The wait the provider asked for before a retry (its `Retry-After`), in milliseconds:
    /// `run.status` and `session.head` serve it as `retry_after_secs` (llm-runner §4.3, §6).
    /// Absent when the provider gave none (never 0 as a stand-in); a negative or non-finite
    /// value is not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// When the provider said the limit this error hit resets (unix ms), from its rate-limit
    /// headers (`crate::provider::ratelimit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at_ms: Option<u64>,
}

impl ProviderError {
    /// An error with no provider timing.
    pub fn new(class: ErrorClass, provider_code: Option<String>, message: String, http_status: Option<u16>) -> Self {
        ProviderError { class, provider_code, message, http_status, retry_after_ms: None, resets_at_ms: None }
    }

    /// A transient error broca itself decided (no provider status).
    pub fn transient(code: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorClass::Transient, Some(code.into()), message.into(), None)
    }

    /// A permanent error broca itself decided (no provider status).
    pub fn permanent(code: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorClass::Permanent, Some(code.into()), message.into(), None)
    }

    /// The diagnostic a run is sealed with when its WAL latched an I/O failure in this process
    /// (the run could not be ended then; it is sealed when the session reopens).
    pub fn storage_failed(cause: &str) -> ProviderError {
        ProviderError::transient(
            STORAGE_FAILED_CODE,
            format!("the session's WAL failed while this run was going ({cause}); it was sealed on reopen"),
        )
    }

    /// The diagnostic a run broca sealed during a planned stop carries (llm-runner §6.5
    /// `runner_shutdown`).
    pub fn runner_shutdown() -> ProviderError {
        ProviderError::transient(
            cortexkit_role_llm_runner::run::interrupt_reasons::RUNNER_SHUTDOWN,
            "broca stopped (a planned stop) while this run was going; it was sealed then",
        )
    }

    /// The role's durable interrupt reason (llm-runner §6.5) this diagnostic records: a
    /// planned stop's `runner_shutdown`, an orphan's `runner_crash`; `None` for any other.
    pub fn interrupt_reason(&self) -> Option<&'static str> {
        use cortexkit_role_llm_runner::run::interrupt_reasons::{RUNNER_CRASH, RUNNER_SHUTDOWN};
        match self.provider_code.as_deref() {
            Some(ORPHAN_PROVIDER_CODE) => Some(RUNNER_CRASH),
            Some(RUNNER_SHUTDOWN) => Some(RUNNER_SHUTDOWN),
            _ => None,
        }
    }

    /// The diagnostic an orphaned run is sealed with.
    pub fn previous_process_ended() -> ProviderError {
        ProviderError::transient(
            ORPHAN_PROVIDER_CODE,
            "the previous broca process ended without sealing this run: host crash, kill, or power loss",
        )
    }
}
