//! The `tool_call_provider_held` record (spec §19): a tool provider answered a call with a
//! `held-reply/v1` first reply, so the call's result arrives later as a `late_results` entry.
//! Its frame requires the must-understand feature `provider-held/v1`: a reader that skipped it
//! would seal the held call as an unknown outcome and never take its late result.
//!
//! Invariants: written only after the call's `ToolDispatchIntent` and before its `ToolResult`,
//! once per call; the interim content the provider sent is never recorded or shown to the model.

use serde::{Deserialize, Serialize};

/// The feature a `ToolCallProviderHeld` frame requires.
pub const FEATURE_PROVIDER_HELD: &str = "provider-held/v1";

/// One held call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallProviderHeld {
    pub run_id: String,
    pub step: u64,
    pub tool_call_id: String,
    /// The call's key as it was sent (`<lineage>:<seq of its intent>`), the key its late
    /// result names.
    pub call_key: String,
    pub tool: String,
    /// The provider module holding it.
    pub provider: String,
    /// The provider's open snake_case reason (`consent`, `login_handoff`, `running`, …).
    pub reason: String,
    /// When broca took the held reply.
    pub held_at_ms: u64,
    /// The session the call belongs to, so the intake can be rebuilt from the WALs alone (a WAL
    /// header names only its lineage's hash, spec §19 H-27). Absent in records written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<HeldSession>,
}

/// A held call's session: its bind triple.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSession {
    pub project_root: String,
    pub harness: String,
    pub session: String,
}

impl HeldSession {
    pub fn of(key: &crate::session_key::SessionKey) -> HeldSession {
        HeldSession {
            project_root: key.project_root.clone(),
            harness: key.harness.clone(),
            session: key.session.clone(),
        }
    }

    pub fn key(&self) -> crate::session_key::SessionKey {
        crate::session_key::SessionKey::new(&self.project_root, &self.harness, &self.session)
    }
}
