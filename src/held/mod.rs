//! Provider-held calls and late results (spec §19; tool-provider §8): the runtime that lets a
//! tool provider hold a call past its first reply and answer it later.
//!
//! - [`declared`]: whether tool routes declare `tool-result/v1` and `held-reply/v1`. The spec
//!   keeps them undeclared in release builds (a held call cannot be cancelled or stopped at its
//!   provider yet); debug builds declare both under `BROCA_TEST_DECLARE_HELD_REPLY_V1=1`, a
//!   non-shipping marker a release build refuses to start with ([`release_fence`]).
//! - [`intake`]: `late-results.db`, the intake store — which dispatched calls may be answered
//!   late (registrations), which entries were taken (receipts), each module's feed cursor. A
//!   projection of the WAL: the WAL's `tool_call_provider_held` records are the truth.
//! - [`fence`]: what held calls ask of retention — when a retained session may be deleted, and
//!   which intake rows its deletion takes.
//! - [`rebuild`]: a recreated intake store registered again from the live WALs, and the boot
//!   prune of tombstoned lineages.
//! - [`puller`]: one thread per provider module that pulls `late_results` while the module
//!   needs its feed, hands each entry to the session's actor, and acks only after the result is
//!   durable in the session's WAL.
//!
//! Invariants:
//! - a call is registered (one synced transaction per dispatch group) before it is sent;
//! - a late result is delivered at most once into the WAL (the actor checks the call has no
//!   result yet), and acked only after that write is durable;
//! - a held call is never sent to its provider again.

pub use crate::intake;
pub use crate::intake::fence;
pub mod puller;
pub mod rebuild;

use cortexkit_role_tool_provider::{HELD_REPLY_V1, TOOL_RESULT_V1_CAPABILITY};

/// The non-shipping switch that declares held replies on tool routes (debug builds only).
pub const DECLARE_ENV: &str = "BROCA_TEST_DECLARE_HELD_REPLY_V1";

/// What a call route declares when held replies are on.
const DECLARED: &[&str] = &[TOOL_RESULT_V1_CAPABILITY, HELD_REPLY_V1];

/// How often a module's feed is pulled while it is needed (spec §19).
pub const POLL_EVERY: std::time::Duration = std::time::Duration::from_secs(3);
/// How often after an error.
pub const POLL_AFTER_ERROR: std::time::Duration = std::time::Duration::from_secs(30);
/// Entries asked for per `late_results` read.
pub const PAGE_LIMIT: u32 = 100;

fn switch_on() -> bool {
    std::env::var(DECLARE_ENV).is_ok_and(|v| v == "1")
}

/// Whether this process declares `tool-result/v1` and `held-reply/v1` on its tool-call routes.
pub fn declared() -> bool {
    cfg!(debug_assertions) && switch_on()
}

/// The consumer capabilities a tool-call route declares: both held-reply prerequisites, or
/// nothing (role and plan-fetch routes always declare nothing).
pub fn call_route_capabilities() -> &'static [&'static str] {
    if declared() {
        DECLARED
    } else {
        &[]
    }
}

/// The release fence: a release build started with the non-shipping marker set refuses to
/// start, naming it, rather than silently serving without what the marker asked for.
pub fn release_fence() -> Result<(), String> {
    if !cfg!(debug_assertions) && switch_on() {
        return Err(format!("{DECLARE_ENV} is a non-shipping test marker; release builds refuse it"));
    }
    Ok(())
}

/// A held call's late answer, as its provider's entry gives it (tool-provider §8.2).
#[derive(Clone, Debug, PartialEq)]
pub enum LateOutcome {
    /// The call's result: a body read by the tool's negotiated format.
    Result(serde_json::Value),
    /// The call never ran (`reason`, e.g. `restart_before_dispatch`).
    NotStarted(String),
    /// The provider dropped the answer before it was collected.
    Expired,
}

/// What the session's actor did with a late result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateAck {
    /// Written as the call's result and durable: ack it.
    Delivered,
    /// Nothing to do (the call already has its result, or no held call of this session has this
    /// key): ack it as a no-op.
    NoOp,
    /// Not deliverable yet (its held record is not durable, or the run still waits on other
    /// calls of its batch): do not ack; it is read again.
    NotYet,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_follows_the_debug_only_marker_and_the_fence_refuses_it_in_release() {
        // Tests run with or without the marker; both answers follow from it.
        let on = std::env::var(DECLARE_ENV).is_ok_and(|v| v == "1");
        assert_eq!(declared(), cfg!(debug_assertions) && on);
        assert_eq!(call_route_capabilities().is_empty(), !declared());
        if declared() {
            assert_eq!(call_route_capabilities(), [TOOL_RESULT_V1_CAPABILITY, HELD_REPLY_V1]);
        }
        assert_eq!(release_fence().is_err(), !cfg!(debug_assertions) && on);
    }
}
