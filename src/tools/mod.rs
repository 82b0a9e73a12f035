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
pub mod flight;
pub mod output;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

use crate::subc::consumer::{CallError, Consumer};

/// The route identity's harness for every tool route (the llm-runner role's convention).
pub const RUNNER_HARNESS: &str = "runner";
/// How long opening a provider's route may take before a call is given up as not sent.
pub const ROUTE_OPEN_WITHIN: Duration = Duration::from_secs(5);

/// Providers whose credit window is remembered (past it the memory starts over).
pub const MAX_KNOWN_WINDOWS: usize = crate::subc::consumer::ROUTE_CACHE_CAPACITY;
/// How long asking the daemon for a provider's declared concurrency may take.
const WINDOW_LOOKUP_WITHIN: Duration = Duration::from_secs(2);

/// The late-results feed of a module is read on its own route (spec §19: one unscoped route
/// per module, under broca's own principal).
impl crate::held::puller::FeedRoute for ToolPlane {
    fn role_op(&self, module: &str, name: &str, arguments: Value, deadline: Instant) -> Result<Vec<u8>, CallError> {
        ToolPlane::role_op(self, module, crate::held::puller::FEED_SESSION, name, arguments, deadline)
    }

    fn custodian(&self) -> Option<String> {
        self.consumer.principal()
    }
}

/// broca's side of the tool plane: the consumer connection it calls providers on, the calls in
/// flight (dispatch fence and credit windows, [`flight`]) and each provider's window.
pub struct ToolPlane {
    consumer: Consumer,
    flight: flight::Flight,
    /// Module id → its credit window, from the daemon's catalog (bounded by [`MAX_KNOWN_WINDOWS`]).
    windows: parking_lot::Mutex<std::collections::HashMap<String, usize>>,
}

impl ToolPlane {
    pub fn new(consumer: Consumer) -> ToolPlane {
        ToolPlane { consumer, flight: flight::Flight::default(), windows: Default::default() }
    }

    /// `module`'s credit window: its `tool_provider` role's declared concurrency, asked of the
    /// daemon (`catalog.list`) once and remembered; the default window when it cannot be told.
    pub fn window(&self, module: &str) -> usize {
        if let Some(w) = self.windows.lock().get(module) {
            return *w;
        }
        let body = br#"{"op":"catalog.list"}"#;
        let answer = self.consumer.control(body, WINDOW_LOOKUP_WITHIN);
        let concurrency = answer.ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).and_then(|catalog| {
            let modules = catalog.get("modules")?.as_array()?;
            let entry = modules.iter().find(|m| m.get("module_id").and_then(Value::as_str) == Some(module))?;
            let roles = entry.get("roles")?.as_array()?;
            let role = roles.iter().find(|r| r.get("role").and_then(Value::as_str) == Some("tool_provider"))?;
            Some(role.get("concurrency").and_then(Value::as_str).map(String::from))
        });
        let window = flight::window_of(concurrency.flatten().as_deref());
        let mut windows = self.windows.lock();
        if windows.len() >= MAX_KNOWN_WINDOWS {
            windows.clear();
        }
        windows.insert(module.to_owned(), window);
        window
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.flight.len()
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
