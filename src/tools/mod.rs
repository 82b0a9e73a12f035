//! The tool plane (spec §4, §13, §19): broca as a consumer of `tool-provider/v1` modules over
//! its consumer connection. [`fetch`] turns a session's fetch plan into frozen tools at
//! admission; [`call`] sends each durable intent's `tool.call` and turns the answer into the
//! call's result.
//!
//! Invariants:
//! - every route to a provider is opened with target `tool_provider {module_id}` and identity
//!   `{harness: "runner", session: <lineage id>}`, presenting broca's consumer identity (the
//!   consumer connection does); routes are cached per `(module, session)` there;
//! - a call is sent at most once: no failure after its Request went out is retried, and a call
//!   given up on (deadline, cancel) gets a CANCEL and an unknown outcome;
//! - provider answers are bare bodies (never `{"result": …}`); refusals are Error frames.

pub mod call;
pub mod fetch;
pub mod output;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

use crate::subc::consumer::{CallError, Consumer};

/// The route identity's harness for every tool route (the llm-runner role's convention).
pub const RUNNER_HARNESS: &str = "runner";
/// How long opening a provider's route may take before a call is given up as not sent.
pub const ROUTE_OPEN_WITHIN: Duration = Duration::from_secs(5);

/// Calls one process may have in flight across every session (the dispatch fence's bound).
pub const MAX_CALLS_IN_FLIGHT: usize = crate::subc::consumer::MAX_PENDING_CALLS;

/// broca's side of the tool plane: the consumer connection it calls providers on, and the
/// dispatch fence.
///
/// The fence holds `(lineage, tool_call_id)` of every call in flight: a second dispatch of a
/// call already in flight (a bug upstream, or a replayed batch racing its first run) is refused
/// without sending, so no call is in flight twice. Bounded by [`MAX_CALLS_IN_FLIGHT`].
pub struct ToolPlane {
    consumer: Consumer,
    fence: parking_lot::Mutex<std::collections::HashSet<(String, String)>>,
}

impl ToolPlane {
    pub fn new(consumer: Consumer) -> ToolPlane {
        ToolPlane { consumer, fence: parking_lot::Mutex::new(std::collections::HashSet::new()) }
    }

    /// Enters `(lineage, tool_call_id)` into the fence; `Err` says why the call may not go.
    fn enter(&self, lineage: &str, tool_call_id: &str) -> Result<FencePass<'_>, &'static str> {
        let mut fence = self.fence.lock();
        if fence.len() >= MAX_CALLS_IN_FLIGHT {
            return Err("too many tool calls are in flight in this process");
        }
        let key = (lineage.to_owned(), tool_call_id.to_owned());
        if !fence.insert(key.clone()) {
            return Err("this call is already in flight; it is not dispatched twice");
        }
        Ok(FencePass { plane: self, key })
    }

    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.fence.lock().len()
    }

    fn target(module: &str) -> RouteTarget {
        RouteTarget::ToolProvider { module_id: module.to_owned() }
    }

    fn identity(lineage: &str) -> BindIdentity {
        BindIdentity::new(RUNNER_HARNESS, lineage)
    }

    /// One role op (`{name, arguments}`, shaped like a tool call) on `module`'s route for the
    /// session `lineage`, answered before `deadline`.
    fn role_op(
        &self,
        module: &str,
        lineage: &str,
        name: &str,
        arguments: Value,
        deadline: Instant,
    ) -> Result<Vec<u8>, CallError> {
        let body = serde_json::to_vec(&json!({"name": name, "arguments": arguments})).expect("role ops serialize");
        let within = deadline.saturating_duration_since(Instant::now());
        self.consumer.call_on(&Self::target(module), &Self::identity(lineage), &body, within)
    }
}

/// A call's place in the fence, given back when the call ends.
struct FencePass<'a> {
    plane: &'a ToolPlane,
    key: (String, String),
}

impl Drop for FencePass<'_> {
    fn drop(&mut self) {
        self.plane.fence.lock().remove(&self.key);
    }
}
