//! A session-bound management route to broca through the daemon, with the official consumer
//! SDK: every request is a real `REQUEST` on broca's management surface, every reply decoded
//! with the role crate's `wire::read_reply`.
//!
//! A route names its runner instance, not one daemon connection: when the harness re-arms an
//! instance before a kill (`kill.rs`), routes the suite opened before go on through the new
//! connection, as a caller reconnecting after a restart would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cortexkit_role_llm_runner::wire::read_reply;
use cortexkit_role_llm_runner_conformance::{envelope, Reply, RouteFailure, RunnerRoute, SubscribeOutcome};
use serde_json::Value;
use subc_client_rs::{CallError, SubscribeOptions};
use subc_protocol::{BindIdentity, RouteTarget};

use crate::rig;
use crate::subject::Instance;

/// A subscription is read until no event arrived for this long. Some cases poll a stream up
/// to the suite's 400 times until it shows what they wait for, so this bounds such a case at
/// about three minutes while leaving a loaded two-core machine time to start a replay.
const QUIET: Duration = Duration::from_millis(400);
/// ... and never longer than this in all.
const SUBSCRIBE_MOST: Duration = Duration::from_secs(30);
const MAX_EVENTS: usize = 100_000;

pub struct Route {
    pub instance: Arc<Instance>,
    pub identity: BindIdentity,
    /// The relay module (`broca-mock relay`, `rig::OWNER` or `rig::STRANGER`) whose attested
    /// principal unary requests go under; `None`: straight to broca as the daemon's `direct`
    /// caller. Subscriptions always go straight to broca (reads need no owner, and the relay
    /// relays unary calls only).
    pub via: Option<&'static str>,
}

fn target() -> RouteTarget {
    RouteTarget::ManagementSurface { module_id: rig::BROCA.into() }
}

/// The relay's own refusals: the call never reached broca's answer, so they are route
/// failures, as the same failure on a direct route is.
const RELAY_FAILURES: [&str; 3] = ["relay_failed", "relay_busy", "relay_unsupported"];

fn failure(what: &str, e: &CallError) -> RouteFailure {
    RouteFailure::new(format!("{what}: {e}"))
}

#[async_trait]
impl RunnerRoute for Route {
    async fn request(&self, method: &str, params: Value) -> Result<Reply, RouteFailure> {
        let consumer = self.instance.consumer().map_err(RouteFailure::new)?;
        let body = serde_json::to_vec(&envelope(method, params)).map_err(|e| RouteFailure::new(e.to_string()))?;
        let to = self.via.map_or_else(target, |relay| RouteTarget::ManagementSurface { module_id: relay.into() });
        match consumer.call(to, self.identity.clone(), body, rig::call_options()).await {
            Ok(bytes) => read_reply::<Value>(&bytes)
                .map(Reply::Response)
                .map_err(|e| RouteFailure::new(format!("{method}: the reply is not {{\"result\": ...}}: {e:?}"))),
            Err(CallError::Module(body)) if self.via.is_some() && RELAY_FAILURES.contains(&body.code.as_str()) => {
                Err(RouteFailure::new(format!("{method}: {}: {}", body.code, body.message)))
            }
            Err(CallError::Module(body)) => Ok(Reply::Error(body)),
            Err(e) => Err(failure(method, &e)),
        }
    }

    async fn subscribe(&self, params: Value) -> Result<SubscribeOutcome, RouteFailure> {
        let consumer = self.instance.consumer().map_err(RouteFailure::new)?;
        let body =
            serde_json::to_vec(&envelope("session.subscribe", params)).map_err(|e| RouteFailure::new(e.to_string()))?;
        let opts = SubscribeOptions { event_buffer: MAX_EVENTS, ..SubscribeOptions::default() };
        let mut sub = match consumer.subscribe(target(), self.identity.clone(), body, opts).await {
            Ok(sub) => sub,
            Err(CallError::Module(body)) => return Ok(SubscribeOutcome::Refused(body)),
            Err(e) => return Err(failure("session.subscribe", &e)),
        };
        let mut events = Vec::new();
        let until = Instant::now() + SUBSCRIBE_MOST;
        while Instant::now() < until && events.len() < MAX_EVENTS {
            match tokio::time::timeout(QUIET, sub.events().recv()).await {
                Err(_) => break,
                Ok(None) => {
                    // The stream ended: a refusal before any event is the runner's answer.
                    if events.is_empty() {
                        if let subc_client_rs::SubscriptionEnd::Error(body) = sub.ended().await {
                            return Ok(SubscribeOutcome::Refused(body));
                        }
                    }
                    break;
                }
                Ok(Some(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
                    Ok(event) => events.push(event),
                    Err(e) => return Err(RouteFailure::new(format!("a stream event is not JSON: {e}"))),
                },
            }
        }
        let _ = sub.unsubscribe();
        Ok(SubscribeOutcome::Events(events))
    }
}
