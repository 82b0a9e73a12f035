//! The session ops: requests decoded ([`crate::wire`]) and mapped to actor commands (writes)
//! or direct reads, answers mapped to bodies, and nothing else. Transport-free: a caller (the
//! subc module, a test) hands in the bound session, the method and its params, and gets
//! exactly one answer through `reply`, possibly from another thread.
//!
//! Leniency is per operation (spec §15): `session.send` tolerates unknown members (logged once
//! per key); every other op is strict and refuses unknown members by name. Every refusal is
//! decided before anything is written.

mod baseline;
mod calls;
mod directives;
mod driver;
pub mod expiry;
mod history;
mod owners;
mod read;
mod refs;
mod send;
mod status;
pub mod table;
pub(crate) use owners::first_run_started;
mod warm;

use std::sync::Arc;

use serde_json::Value;

use crate::actor::{Admission, Registry};
use crate::op::Op;
use crate::owner::Caller;
use crate::session_key::SessionKey;
use crate::wire::requests::{
    CancelRequest, Empty, ReadRequest, ResultRequest, RetractRequest, SendStatusRequest, StatusRequest,
    ToolCallsRequest,
};
use crate::wire::{Refusal, RefusalCode};

/// What an op knows of the route it came on: the bound session, whether the daemon stamped a
/// work scope on the bind (scoped sessions take tools only from a fetch plan), and the caller
/// as the daemon stamped it (owner-only ops check it, `crate::owner`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    pub key: SessionKey,
    pub scoped: bool,
    pub caller: Caller,
}

impl Route {
    /// An unscoped route of a caller with no consumer identity (in-process callers).
    pub fn direct(key: SessionKey) -> Route {
        Route { key, scoped: false, caller: Caller::direct() }
    }
}

/// One answer, delivered once (possibly from another thread).
pub type Reply = Box<dyn FnOnce(Result<Value, Refusal>) + Send>;

/// What the ops need: the sessions' actors and the rules a send is admitted by.
pub struct Ops {
    pub registry: Arc<Registry>,
    pub admission: Arc<Admission>,
    /// Output-reference sets and their inputs kept across reads (`session.output_refs`,
    /// `session.output_ref_read`), bounded by `limits::OUTPUT_REF_CACHE_BYTES`.
    pub refs: Arc<crate::refs::cache::RefCache>,
}

/// A typed answer as the JSON body served.
fn body<T: serde::Serialize>(answer: T) -> Value {
    serde_json::to_value(answer).expect("answers serialize")
}

pub use crate::wire::{invalid_params, strict};

impl Ops {
    /// Serves `method` for the session `key`. Blocking work (opening a lineage, reading the
    /// store) happens here: call it from a worker thread.
    pub fn handle(self: &Arc<Self>, key: &SessionKey, method: &str, params: Value, reply: Reply) {
        self.handle_on(&Route::direct(key.clone()), method, params, reply)
    }

    /// [`Ops::handle`] for a route as the daemon stamped it (its caller, its work scope).
    pub fn handle_on(self: &Arc<Self>, route: &Route, method: &str, params: Value, reply: Reply) {
        self.handle_counted(route, method, params, reply, || Ok(()))
    }

    /// Serves `method` on `route`: the caller is authorized first (an owner-only op from
    /// anyone but the session's owner is refused `scope_owner_mismatch` whatever its params),
    /// then `authorized` runs (the op counters count only authorized requests, spec §4; it may
    /// still refuse, as a draining module refuses sends), then the op's request is decoded
    /// (strict ops refuse unknown members by name) and served.
    pub fn handle_counted(
        self: &Arc<Self>,
        route: &Route,
        method: &str,
        params: Value,
        reply: Reply,
        authorized: impl FnOnce() -> Result<(), Refusal>,
    ) {
        let op = Op::parse(method);
        if let Err(refusal) = owners::authorize(self, route, op).and_then(|()| authorized()) {
            return reply(Err(refusal));
        }
        let key = &route.key;
        // Every session op but these two answers `expired` for an expired record (§9.1).
        let version = match op {
            Some(Op::RoleDescribe | Op::SessionSend) => 0,
            _ => match expiry::record_version(self, key) {
                Ok(version) => version,
                Err(refusal) => return reply(Err(refusal)),
            },
        };
        match op {
            // A stream is served by the subscription path (`serve`), never as a request.
            None | Some(Op::SessionSubscribe) => {
                // The caller's string, bounded: a refusal always fits its frame (#44).
                let method = crate::wire::loggable(method);
                let detail = Some(crate::detail!("method" => method));
                reply(Err(Refusal::new(RefusalCode::UnknownMethod, format!("unknown method {method:?}"), detail)))
            }
            Some(Op::RoleDescribe) => reply(Empty::decode(&params).map(|Empty| describe(&self.admission.config))),
            Some(Op::SessionSend) => send::session_send(self, route, params, reply),
            Some(Op::SessionRetract) => match RetractRequest::decode(&params, key) {
                Ok(request) => driver::session_retract(self, route, request, reply),
                Err(r) => reply(Err(r)),
            },
            Some(Op::RunCancel) => match CancelRequest::decode(&params) {
                Ok(request) => driver::run_cancel(self, route, request, reply),
                Err(r) => reply(Err(r)),
            },
            Some(Op::SessionRead) => reply(
                ReadRequest::decode_at(&params, &key.addr(), version)
                    .and_then(|r| read::session_read(self, key, r, version)),
            ),
            Some(Op::SessionHead) => {
                reply(Empty::decode(&params).and_then(|Empty| read::session_head(self, route, version)))
            }
            Some(Op::SessionHistory) => reply(
                crate::wire::history::HistoryRequest::decode(&params, &key.addr())
                    .and_then(|r| history::session_history(self, key, r, version)),
            ),
            Some(Op::RunStatus) => {
                reply(StatusRequest::decode(&params, key).and_then(|r| status::run_status(self, key, r)))
            }
            Some(Op::RunResult) => reply(ResultRequest::decode(&params).and_then(|r| status::run_result(self, key, r))),
            Some(Op::SendStatus | Op::SessionSendStatus) => {
                reply(SendStatusRequest::decode(&params).and_then(|r| status::send_status(self, route, r)))
            }
            Some(Op::RunToolCalls) => {
                reply(ToolCallsRequest::decode(&params).and_then(|r| calls::run_tool_calls(self, key, r)))
            }
            Some(Op::SessionBaseline) => {
                reply(Empty::decode(&params).and_then(|Empty| baseline::session_baseline(self, key)))
            }
            Some(Op::SessionOutputRefs) => {
                reply(crate::wire::refs::decode_list(&params).and_then(|r| refs::session_output_refs(self, key, r)))
            }
            Some(Op::SessionOutputRefRead) => {
                reply(crate::wire::refs::decode_read(&params).and_then(|r| refs::session_output_ref_read(self, key, r)))
            }
            Some(Op::SessionWarm) => match crate::wire::warm::WarmRequest::decode(&params) {
                Ok(request) => warm::session_warm(self, route, request, version, reply),
                Err(r) => reply(Err(r)),
            },
        }
    }
}

/// The capability groups `role.describe` declares: exactly those whose answers broca gives in
/// the role's shapes (spec §4).
pub const GROUPS: &[&str] = {
    use cortexkit_role_llm_runner::capabilities as cap;
    &[
        cap::TRANSCRIPT_READS,
        cap::STREAMING,
        cap::LIVE_EVENTS,
        cap::RUN_CAUSE,
        cap::RUN_OPS,
        cap::FINISH_REASON,
        cap::HOST_HISTORY,
        cap::HISTORY_DISPLAY,
        cap::SESSION_USAGE,
        cap::RUN_STATUS,
        cap::RUN_CANCEL,
        cap::RUN_USAGE,
        cap::QUEUE,
        cap::STEER,
        cap::INTERRUPT,
        cap::MAX_STEPS,
        cap::NO_TOOLS,
        cap::INPUT_TOKEN_CAP,
        cap::SEND_STATUS,
        "send_tool_reply_bound",
        "session_class",
        cap::PLANS,
        cap::RUN_TOOL_CALLS,
        cap::DISPATCH_ATTRIBUTION,
        cap::HEAD_SENDER,
        cap::RETENTION,
        cap::OUTPUT_REFS,
        cap::SERVICE_TIER,
        cap::DELIVERY_ORDER,
        cap::SENDER_SUCCESSION,
        cap::CLIENT_MESSAGE_ID,
        cap::MESSAGE_SENDERS,
        cap::TURN_DIRECTIVES,
        cap::INTERRUPT_REASON,
        "fetch-plan-optional-tools/v1",
    ]
};

/// The `role.describe` answer: this build's major, the ops it serves on a session route, and
/// exactly the capability groups whose answers broca gives in the role's shapes (spec §4).
/// `step_events` is declared only when `broca.jsonc` names a bus to publish on.
/// `retract` is not declared: broca answers `session.retract` with the project spec's object,
/// which a contract consumer would misread (reference §14, row 13).
pub fn describe(config: &crate::config::BrocaConfig) -> Value {
    use cortexkit_role_llm_runner::describe::{Major, RoleDescribe};
    let ops = Op::ALL.iter().map(|op| op.name().to_owned()).collect();
    let describe = RoleDescribe::new(
        vec![Major::new(cortexkit_role_llm_runner::PROVIDES, ops, "alpha")],
        env!("CARGO_PKG_VERSION"),
    )
    .with_capabilities(GROUPS.iter().map(|g| (*g).to_owned()).collect())
    .with_delivery_order_modes(crate::wire::delivery::DECLARED_MODES.iter().map(|m| m.as_str().to_owned()).collect())
    .with_run_cancel(vec!["now".into(), "step_boundary".into()])
    .with_session_capabilities_from(cortexkit_role_llm_runner::capabilities::source::ADMISSION)
    .with_max_bytes(read::MAX_BYTES, read::MAX_BYTES)
    .with_retention(crate::limits::RETENTION_MAX_SECONDS, crate::limits::RETENTION_DELETE_WITHIN_MS)
    .with_service_tiers(crate::provider::tier::declared());
    let describe = match &config.step_events {
        Some(_) => {
            let mut groups = describe.capabilities.clone();
            groups.push(cortexkit_role_llm_runner::capabilities::STEP_EVENTS.to_owned());
            describe.with_capabilities(groups).with_step_events(crate::bus::declaration())
        }
        None => describe,
    };
    // Held calls are reported exactly when tool routes declare held replies (spec §19).
    let describe = if crate::held::declared() {
        let mut groups = describe.capabilities.clone();
        groups.push(cortexkit_role_llm_runner::capabilities::HELD_CALLS.to_owned());
        describe.with_capabilities(groups)
    } else {
        describe
    };
    let mut out = serde_json::to_value(describe).expect("role.describe serializes");
    out["session_class"] = serde_json::json!({"backup_classes": config.backup_classes});
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn role_describe_passes_the_role_crates_check() {
        let describe = super::describe(&crate::config::BrocaConfig::default());
        let groups = describe["capabilities"].as_array().unwrap();
        let held = groups.iter().any(|g| g == cortexkit_role_llm_runner::capabilities::HELD_CALLS);
        assert_eq!(held, crate::held::declared(), "held_calls is declared exactly with held replies");
        if let Err(problems) = cortexkit_role_llm_runner::describe::check_describe(&describe) {
            panic!("role.describe is refused: {problems:?}\n{describe}");
        }
    }

    #[test]
    fn step_events_are_declared_exactly_when_a_bus_is_configured() {
        use cortexkit_role_llm_runner::capabilities::STEP_EVENTS;
        let plain = super::describe(&crate::config::BrocaConfig::default());
        assert!(!plain["capabilities"].as_array().unwrap().iter().any(|g| g == STEP_EVENTS));
        assert!(plain.get("step_events").is_none());
        let bus = crate::config::BusConfig { addr: "127.0.0.1:4222".into(), account: "a".into() };
        let config = crate::config::BrocaConfig { step_events: Some(bus), ..Default::default() };
        let describe = super::describe(&config);
        let checked = cortexkit_role_llm_runner::describe::check_describe(&describe)
            .unwrap_or_else(|problems| panic!("role.describe is refused: {problems:?}\n{describe}"));
        assert_eq!(checked.step_events, Some(crate::bus::declaration()));
        assert!(describe["capabilities"].as_array().unwrap().iter().any(|g| g == STEP_EVENTS));
    }
}
