//! The provider: broca-mock's [`Handler`] on broca's subc io thread, and the calls it runs.
//!
//! The io thread only decodes a request's name and hands it on (DESIGN §2 rule 2): role ops
//! and tool calls run on a pool of helper threads, which write the call log (a file write before
//! any reply) and answer through [`Outbound`].
//!
//! Invariants:
//! - every request gets exactly one terminal frame, except a call whose route closed first
//!   (the daemon released its credit with the route) and a scripted `hang` with
//!   `ignore_cancel` (a deliberately broken provider);
//! - a tool call's `call` line is in the call log before the call does anything or answers;
//!   requests turned away unseen (`module_reloading` while draining, `provider_busy` past
//!   [`MAX_CALLS_IN_FLIGHT`]) have none, because nothing ran;
//! - an open call is in `in_flight` from its arrival on the io thread until its worker ends,
//!   so a CANCEL or a route close always finds it;
//! - keepalives are Pushes on the call's corr, sent by the call's own wait loop, only on routes
//!   whose bind declared `call-keepalive/v1` and only while the provider declares it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broca::pool::Pool;
use broca::subc::{health_ok, BindRequest, ControlReply, ControlRequest, Handler, Outbound, Route};
use cortexkit_role_tool_provider::call::{check_call, ToolCallRequest};
use cortexkit_role_tool_provider::catalog::{CatalogAnswer, CatalogRequest};
use cortexkit_role_tool_provider::describe::{Major, RoleDescribe};
use cortexkit_role_tool_provider::late_results::{
    check_since, AckRequest, Cursor, LateResultsReply, LateResultsRequest,
};
use cortexkit_role_tool_provider::result::{ContentPart, ResultFormat, ToolResult};
use cortexkit_role_tool_provider::{errors, keepalive_body, ops, CALL_KEEPALIVE_CAPABILITY, PROVIDES};
use crossbeam_channel::{RecvTimeoutError, Sender};
use parking_lot::Mutex;
use serde_json::{json, Value};
use subc_protocol::scope::ScopeStamp;
use subc_protocol::session::{ModuleControlRequestFromModule, ModuleControlResponseToModule};
use subc_protocol::tool_call::PRESET_FIELD;
use subc_protocol::{BindIdentity, ErrorBody, Flags, Principal};

use super::call_log::{self, CallEntry, CallLog, CancelEntry, Entry, Outcome, ReplyEntry, RoleEntry};
use super::late::LateStore;
use super::script::{Answer, Behaviour, ScopeClass, Tool, ToolScript};

mod held;
mod role;

pub use role::manifest;
#[cfg(test)]
use role::{describe, late_results, late_results_ack};
use role::{is_role_op, role_op};

/// Tool calls running at once; past it a call is refused `provider_busy` (nothing ran).
pub const MAX_CALLS_IN_FLIGHT: usize = 4096;
/// The code of that refusal.
pub const PROVIDER_BUSY: &str = "provider_busy";
/// The code a call stopped by CANCEL answers with.
pub const CANCELLED: &str = "cancelled";
/// The corr of the `scope.sync` sent at start (the module's own corr space; HELLO used 1).
const SCOPE_SYNC_CORR: u64 = 2;

/// What a route's bind said, kept for its calls. Only `principal` and `scope` are the daemon's.
#[derive(Debug)]
pub struct Bound {
    pub principal: Option<Principal>,
    pub scope: Option<ScopeStamp>,
    pub identity: BindIdentity,
    pub consumer_capabilities: Vec<String>,
}

impl Bound {
    fn declares(&self, capability: &str) -> bool {
        self.consumer_capabilities.iter().any(|c| c == capability)
    }

    fn scope_class(&self) -> ScopeClass {
        ScopeClass::of(self.scope.as_ref())
    }
}

/// Why a running call must stop waiting.
enum Stop {
    Cancel,
    RouteClosed,
}

/// One open tool call, as the io thread knows it.
struct InFlight {
    stop: Sender<Stop>,
    key: String,
    tool: String,
}

/// Process-lifetime counters for `health.check`.
#[derive(Default)]
struct Metrics {
    calls: AtomicU64,
    cancels: AtomicU64,
    role_ops: AtomicU64,
    refused_unseen: AtomicU64,
}

/// What the helper threads share.
struct Shared {
    script: ToolScript,
    outbound: Outbound,
    log: CallLog,
    /// Held calls and their late entries, with `late_results_dir`.
    late: Option<Arc<LateStore>>,
    incarnation: String,
    module_id: String,
    in_flight: Mutex<HashMap<(Route, u64), InFlight>>,
    metrics: Metrics,
}

pub struct Provider {
    shared: Arc<Shared>,
    workers: Arc<Pool>,
    routes: HashMap<Route, Arc<Bound>>,
    draining: bool,
    stopped: Sender<()>,
}

impl Provider {
    /// A provider with a new incarnation; with `late_results_dir`, its late-results store opened
    /// (the error names the directory when it cannot be).
    pub fn new(
        script: ToolScript,
        outbound: Outbound,
        log: CallLog,
        module_id: &str,
        stopped: Sender<()>,
    ) -> Result<Provider, String> {
        let incarnation = uuid::Uuid::new_v4().to_string();
        let late = match script.late_results_dir.as_deref().filter(|_| script.late_results) {
            Some(dir) => Some(
                LateStore::open(dir, &incarnation)
                    .map_err(|e| format!("cannot open the late-results store {}: {e}", dir.display()))?
                    .start(),
            ),
            None => None,
        };
        let shared = Shared {
            script,
            outbound,
            log,
            late,
            incarnation,
            module_id: module_id.to_owned(),
            in_flight: Mutex::new(HashMap::new()),
            metrics: Metrics::default(),
        };
        Ok(Provider {
            shared: Arc::new(shared),
            workers: Arc::new(Pool::new("mock-tool", broca::limits::OP_THREADS)),
            routes: HashMap::new(),
            draining: false,
            stopped,
        })
    }

    /// Sends the script's scopes to the daemon (`scope.sync`), when it has any.
    pub fn sync_scopes(script: &ToolScript, outbound: &Outbound) {
        if script.scopes.is_empty() {
            return;
        }
        let body = ModuleControlRequestFromModule::ScopeSync { generation: 1, scopes: script.scopes.clone() };
        let body = serde_json::to_vec(&body).expect("scope.sync serializes");
        if let Err(e) = outbound.control_request(SCOPE_SYNC_CORR, body) {
            log::error!("cannot send scope.sync: {e}");
        }
    }

    fn refuse(&self, route: Route, corr: u64, error: &ErrorBody) {
        let _ = self.shared.outbound.error(route, corr, error);
    }

    fn run(&self, job: impl FnOnce() + Send + 'static, route: Route, corr: u64) {
        if let Err(e) = self.workers.run(job) {
            log::error!("cannot start a helper thread: {e}");
            self.shared.in_flight.lock().remove(&(route, corr));
            self.refuse(route, corr, &ErrorBody::new(PROVIDER_BUSY, format!("no helper thread: {e}")));
        }
    }
}

/// Decides a bind from the daemon's stamp: a bind must carry the daemon's principal.
pub fn authorize(bind: &BindRequest) -> Result<(), ErrorBody> {
    match bind.principal {
        Some(_) => Ok(()),
        None => Err(ErrorBody::new("not_authorized", "the daemon stamped no principal on this bind")),
    }
}

/// A request body as the role defines it: `{name, arguments, ...}`, with `arguments` optional
/// for role ops.
fn decode(body: &[u8]) -> Result<ToolCallRequest, ErrorBody> {
    let mut value: Value = serde_json::from_slice(body)
        .map_err(|e| errors::invalid_request("body", format!("the request is not JSON: {e}")))?;
    let Some(object) = value.as_object_mut() else {
        return Err(errors::invalid_request("body", "the request is not a JSON object"));
    };
    if !object.get("name").is_some_and(Value::is_string) {
        return Err(errors::invalid_request("name", "a request names its op or tool in a string `name`"));
    }
    object.entry("arguments").or_insert_with(|| json!({}));
    serde_json::from_value(value).map_err(|e| errors::invalid_request("body", e.to_string()))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Handler for Provider {
    fn on_route_bound(&mut self, bind: BindRequest) {
        log::debug!(
            "bound {} for {:?} (scope {:?})",
            bind.route,
            bind.principal,
            bind.scope.as_ref().map(|s| &s.scope_ref)
        );
        let bound = Bound {
            principal: bind.principal,
            scope: bind.scope,
            identity: bind.identity,
            consumer_capabilities: bind.consumer_capabilities.unwrap_or_default(),
        };
        self.routes.insert(bind.route, Arc::new(bound));
    }

    fn on_request(&mut self, route: Route, corr: u64, flags: Flags, body: Vec<u8>) {
        let Some(bound) = self.routes.get(&route).cloned() else {
            return self.refuse(route, corr, &ErrorBody::new("unknown_channel", "the route is not bound"));
        };
        if flags.is_subscription() {
            return self.refuse(route, corr, &errors::invalid_request("flags", "tool-provider requests are unary"));
        }
        let request = match decode(&body) {
            Ok(r) => r,
            Err(e) => return self.refuse(route, corr, &e),
        };
        if self.draining {
            self.shared.metrics.refused_unseen.fetch_add(1, Ordering::Relaxed);
            let e = ErrorBody::new("module_reloading", "broca-mock is draining; nothing ran")
                .with_detail(json!({"class": "transient"}));
            return self.refuse(route, corr, &e);
        }
        let shared = Arc::clone(&self.shared);
        if is_role_op(&request.name) {
            return self.run(move || role_op(&shared, route, corr, &bound, request), route, corr);
        }
        let key = call_log::call_key_of(request.call_key.as_deref(), &request.name, &request.arguments);
        let (stop, stopped) = crossbeam_channel::bounded(4);
        {
            let mut in_flight = self.shared.in_flight.lock();
            if in_flight.len() >= MAX_CALLS_IN_FLIGHT {
                drop(in_flight);
                self.shared.metrics.refused_unseen.fetch_add(1, Ordering::Relaxed);
                let e = ErrorBody::new(PROVIDER_BUSY, format!("{MAX_CALLS_IN_FLIGHT} calls already run; nothing ran"));
                return self.refuse(route, corr, &e);
            }
            in_flight.insert((route, corr), InFlight { stop, key: key.clone(), tool: request.name.clone() });
        }
        let job = move || {
            let call = Call { shared: &shared, route, corr, bound: &bound, key, stopped };
            call.run(request);
            shared.in_flight.lock().remove(&(route, corr));
        };
        self.run(job, route, corr);
    }

    fn on_cancel(&mut self, route: Route, corr: u64) {
        let in_flight = self.shared.in_flight.lock();
        let Some(call) = in_flight.get(&(route, corr)) else {
            log::debug!("CANCEL for {route} corr {corr}: not a running call");
            return;
        };
        let _ = call.stop.try_send(Stop::Cancel);
        self.shared.metrics.cancels.fetch_add(1, Ordering::Relaxed);
        let entry = Entry::Cancel(CancelEntry {
            incarnation: self.shared.incarnation.clone(),
            at_ms: now_ms(),
            route: route.to_string(),
            corr,
            key: call.key.clone(),
            tool: call.tool.clone(),
        });
        drop(in_flight);
        let shared = Arc::clone(&self.shared);
        // The file write happens on a helper, never on the io thread.
        if let Err(e) = self.workers.run(move || {
            if let Err(e) = shared.log.record(&entry) {
                log::error!("cannot record a cancel in the call log: {e}");
            }
        }) {
            log::error!("cannot start a helper thread to record a cancel: {e}");
        }
    }

    fn on_route_closed(&mut self, route: Route) {
        self.routes.remove(&route);
        for ((r, _), call) in self.shared.in_flight.lock().iter() {
            if *r == route {
                let _ = call.stop.try_send(Stop::RouteClosed);
            }
        }
    }

    fn on_control(&mut self, request: ControlRequest) {
        match request {
            ControlRequest::HealthCheck { corr } => {
                let m = &self.shared.metrics;
                let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let metrics = json!({
                    "incarnation": self.shared.incarnation,
                    "calls": load(&m.calls),
                    "cancels": load(&m.cancels),
                    "role_ops": load(&m.role_ops),
                    "refused_unseen": load(&m.refused_unseen),
                    "in_flight": self.shared.in_flight.lock().len(),
                    "routes": self.routes.len(),
                });
                let _ = self.shared.outbound.health(corr, health_ok(metrics));
            }
            ControlRequest::Draining { .. } => {
                log::info!("draining: new requests are refused module_reloading");
                self.draining = true;
            }
            other => log::debug!("ignoring {other:?}"),
        }
    }

    fn on_control_reply(&mut self, corr: u64, reply: ControlReply) {
        match (corr, reply) {
            (SCOPE_SYNC_CORR, ControlReply::Response(body)) => {
                match serde_json::from_slice::<ModuleControlResponseToModule>(&body) {
                    Ok(ModuleControlResponseToModule::ScopeSync { results, .. }) => {
                        for r in results {
                            if r.code.is_some() {
                                log::error!(
                                    "scope {} epoch {} refused: {:?} {:?}",
                                    r.scope_ref,
                                    r.scope_epoch,
                                    r.code,
                                    r.message
                                );
                            } else {
                                log::info!("scope {} epoch {}: {:?}", r.scope_ref, r.scope_epoch, r.outcome);
                            }
                        }
                    }
                    other => log::warn!("scope.sync answered {other:?}"),
                }
            }
            (SCOPE_SYNC_CORR, ControlReply::Error(e)) => log::error!("scope.sync refused: {}: {}", e.code, e.message),
            (corr, reply) => log::debug!("ignoring a control answer for corr {corr}: {reply:?}"),
        }
    }

    fn on_shutdown(&mut self) {
        for call in self.shared.in_flight.lock().values() {
            let _ = call.stop.try_send(Stop::RouteClosed);
        }
        let _ = self.stopped.send(());
    }
}

/// One tool call on its helper thread.
struct Call<'a> {
    shared: &'a Shared,
    route: Route,
    corr: u64,
    bound: &'a Bound,
    key: String,
    stopped: crossbeam_channel::Receiver<Stop>,
}

/// How the call's wait ended.
enum Waited {
    Done,
    Cancelled,
    RouteClosed,
}

impl Call<'_> {
    fn run(&self, request: ToolCallRequest) {
        let shared = self.shared;
        shared.metrics.calls.fetch_add(1, Ordering::Relaxed);
        let count = match shared.log.record(&self.call_entry(&request)) {
            Ok(n) => n,
            Err(e) => {
                log::error!("cannot record a call in the call log: {e}");
                let refusal = ErrorBody::new("call_log_unwritable", format!("broca-mock cannot record the call: {e}"));
                return self.end_refused(&request.name, &refusal);
            }
        };
        let tool = match self.admit(&request) {
            Ok(t) => t,
            Err(refusal) => return self.end_refused(&request.name, &refusal),
        };
        let behaviour = tool.behaviour_for(&request.arguments, request.preset.as_deref());
        let waited = match &behaviour.answer {
            Answer::FromDir(dir) => self.hold_from_dir(dir, &request.arguments),
            _ => self.wait(behaviour, &request.arguments),
        };
        match waited {
            Waited::Done => {}
            Waited::RouteClosed => return self.record_end(&request.name, Outcome::Abandoned, None),
            Waited::Cancelled => {
                let e = ErrorBody::new(CANCELLED, "the call was cancelled before it answered");
                let _ = shared.outbound.error(self.route, self.corr, &e);
                return self.record_end(&request.name, Outcome::Cancelled, None);
            }
        }
        let hold = match held::plan(&behaviour.answer, &request.arguments) {
            Some(Err(refusal)) => return self.end_refused(&request.name, &refusal),
            plan => plan.and_then(Result::ok),
        };
        // A call asking to be held is answered here, unless a prerequisite is missing.
        if hold.is_some_and(|plan| self.answer_held(plan, tool, &request)) {
            return;
        }
        let tool_result = self.bound.declares(cortexkit_role_tool_provider::TOOL_RESULT_V1_CAPABILITY)
            && tool.entry.result_format == Some(ResultFormat::ToolResultV1);
        match self.render(&behaviour.answer, &request, count, tool_result) {
            Rendered::Body(body) => {
                let _ = shared.outbound.reply(self.route, self.corr, body);
                self.record_end(&request.name, Outcome::Result, None);
            }
            Rendered::Malformed(bytes) => {
                let _ = shared.outbound.reply(self.route, self.corr, bytes);
                self.record_end(&request.name, Outcome::Malformed, None);
            }
            Rendered::Refusal(e) => self.end_refused(&request.name, &e),
            Rendered::Hang => match self.hang(behaviour) {
                Waited::Cancelled => {
                    let e = ErrorBody::new(CANCELLED, "the call was cancelled before it answered");
                    let _ = shared.outbound.error(self.route, self.corr, &e);
                    self.record_end(&request.name, Outcome::Cancelled, None);
                }
                _ => self.record_end(&request.name, Outcome::Abandoned, None),
            },
        }
    }

    fn call_entry(&self, request: &ToolCallRequest) -> Entry {
        let canonical = call_log::canonical_json(&request.arguments);
        let (arguments, arguments_bytes) = if canonical.len() > call_log::MAX_LOGGED_ARGUMENT_BYTES {
            (Value::Null, Some(canonical.len()))
        } else {
            (request.arguments.clone(), None)
        };
        Entry::Call(CallEntry {
            incarnation: self.shared.incarnation.clone(),
            pid: std::process::id(),
            at_ms: now_ms(),
            route: self.route.to_string(),
            corr: self.corr,
            key: self.key.clone(),
            tool: request.name.clone(),
            call_key: request.call_key.clone(),
            tool_call_id: request.tool_call_id.clone(),
            preset: request.preset.clone(),
            scoped: self.bound.scope.is_some(),
            arguments,
            arguments_bytes,
        })
    }

    /// The role's checks, in order: key and pin shapes, the preset, the tool, the pin's contents.
    fn admit(&self, request: &ToolCallRequest) -> Result<&Tool, ErrorBody> {
        let script = &self.shared.script;
        let pin = check_call(request)?;
        match request.preset.as_deref() {
            Some(p) if !script.lists_preset(p) => {
                return Err(errors::invalid_request(PRESET_FIELD, format!("no preset named {p:?}")))
            }
            None if self.bound.scope.is_some() && script.scoped_calls_need_preset => {
                return Err(errors::invalid_request(PRESET_FIELD, "a call on a scoped route names its preset"))
            }
            _ => {}
        }
        let tool = script
            .tool(&request.name)
            .filter(|t| t.offered(request.preset.as_deref(), self.bound.scope_class()))
            .ok_or_else(|| errors::unknown_tool(&request.name))?;
        if let Some(pin) = pin {
            if pin.schema_digest != tool.entry.schema_digest {
                return Err(changed(
                    errors::TOOL_SCHEMA_CHANGED,
                    &tool.entry.name,
                    &pin.schema_digest,
                    &tool.entry.schema_digest,
                ));
            }
            if pin.semantics != tool.entry.semantics {
                let (expected, current) = (pin.semantics.to_string(), tool.entry.semantics.to_string());
                return Err(changed(errors::TOOL_SEMANTICS_CHANGED, &tool.entry.name, &expected, &current));
            }
        }
        Ok(tool)
    }

    /// Waits out the behaviour's delay, sending keepalives, until done, CANCEL or route close.
    fn wait(&self, behaviour: &Behaviour, arguments: &Value) -> Waited {
        let delay = Duration::from_millis(behaviour.delay_for(arguments));
        if delay.is_zero() {
            return Waited::Done;
        }
        let deadline = Instant::now() + delay;
        let keepalives = behaviour.sends_keepalives();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Waited::Done;
            }
            match self.pause(deadline - now, keepalives) {
                Some(Stop::Cancel) => return Waited::Cancelled,
                Some(Stop::RouteClosed) => return Waited::RouteClosed,
                None => {}
            }
        }
    }

    /// A `from_dir` call: while `<dir>/<key>.hold` exists it waits (CANCEL and a route close end
    /// the wait), having created `<key>.held` so a test sees the call arrived.
    fn hold_from_dir(&self, dir: &std::path::Path, arguments: &Value) -> Waited {
        let key = from_dir_key(arguments);
        let hold = dir.join(format!("{key}.hold"));
        if !hold.exists() {
            return Waited::Done;
        }
        if let Err(e) = std::fs::write(dir.join(format!("{key}.held")), b"") {
            log::warn!("broca-mock cannot mark the held call {key}: {e}");
        }
        while hold.exists() {
            match self.pause(Duration::from_millis(20), false) {
                Some(Stop::Cancel) => return Waited::Cancelled,
                Some(Stop::RouteClosed) => return Waited::RouteClosed,
                None => {}
            }
        }
        Waited::Done
    }

    /// A call that never answers on its own: only CANCEL (unless ignored) or a route close ends it.
    fn hang(&self, behaviour: &Behaviour) -> Waited {
        let ignore_cancel = matches!(behaviour.answer, Answer::Hang { ignore_cancel: true });
        let keepalives = behaviour.sends_keepalives();
        loop {
            match self.pause(Duration::from_secs(3600), keepalives) {
                Some(Stop::Cancel) if ignore_cancel => {
                    log::info!("hang ignores the CANCEL on {} corr {}", self.route, self.corr)
                }
                Some(Stop::Cancel) => return Waited::Cancelled,
                Some(Stop::RouteClosed) => return Waited::RouteClosed,
                None => {}
            }
        }
    }

    /// Sleeps at most `most`, sending one keepalive first when they are due; a stop ends it early.
    fn pause(&self, most: Duration, keepalives: bool) -> Option<Stop> {
        let interval = Duration::from_millis(self.shared.script.keepalive_interval_ms);
        let sends = keepalives && self.shared.script.keepalive && self.bound.declares(CALL_KEEPALIVE_CAPABILITY);
        let step = if sends { most.min(interval) } else { most };
        match self.stopped.recv_timeout(step) {
            Ok(stop) => Some(stop),
            Err(RecvTimeoutError::Timeout) => {
                if sends && step == interval {
                    let _ = self.shared.outbound.push(self.route, self.corr, keepalive_body().to_vec());
                }
                None
            }
            Err(RecvTimeoutError::Disconnected) => Some(Stop::RouteClosed),
        }
    }

    fn render(&self, answer: &Answer, request: &ToolCallRequest, count: u64, tool_result: bool) -> Rendered {
        let text_or_json = |text: String, legacy: Value, structured: Option<Value>| {
            if tool_result {
                let mut r = ToolResult::new(vec![ContentPart::text(text)]);
                if let Some(Value::Object(map)) = structured {
                    r = r.with_structured_content(map);
                }
                Rendered::Body(serde_json::to_vec(&r).expect("results serialize"))
            } else {
                Rendered::Body(serde_json::to_vec(&legacy).expect("results serialize"))
            }
        };
        match answer {
            // A `held` call answered at once (a prerequisite is missing) echoes its arguments.
            Answer::Echo | Answer::Held(_) => {
                let args = request.arguments.clone();
                text_or_json(args.to_string(), args.clone(), Some(args))
            }
            Answer::Text(t) => text_or_json(t.clone(), Value::String(t.clone()), None),
            Answer::Result(v) => Rendered::Body(serde_json::to_vec(v).expect("results serialize")),
            Answer::Refuse(e) => Rendered::Refusal(e.clone()),
            Answer::Malformed(raw) => Rendered::Malformed(raw.clone().into_bytes()),
            Answer::Big(big) => {
                let from = big.from.as_deref().and_then(|n| request.arguments.get(n)).and_then(Value::as_u64);
                let bytes = from.map_or(big.bytes, |n| n as usize).min(super::script::MAX_BIG_BYTES);
                let text = filler(bytes);
                text_or_json(text.clone(), Value::String(text), None)
            }
            Answer::Hang { .. } => Rendered::Hang,
            Answer::Count => {
                let v = json!({"key": self.key, "count": count});
                text_or_json(format!("count={count}"), v.clone(), Some(v))
            }
            Answer::FromDir(dir) => {
                let path = dir.join(format!("{}.json", from_dir_key(&request.arguments)));
                match std::fs::read(&path) {
                    // Under tool-result/v1 a scripted value that is not such a body is wrapped:
                    // a string as its text, anything else as its canonical JSON.
                    Ok(bytes) if tool_result => match serde_json::from_slice::<Value>(&bytes) {
                        Ok(value) => Rendered::Body(
                            serde_json::to_vec(&super::late::as_tool_result(value)).expect("results serialize"),
                        ),
                        Err(_) => Rendered::Refusal(ErrorBody::new(
                            "tool_unavailable",
                            format!("broca-mock: {} is not JSON", path.display()),
                        )),
                    },
                    Ok(bytes) if serde_json::from_slice::<Value>(&bytes).is_ok() => Rendered::Body(bytes),
                    Ok(_) => Rendered::Refusal(ErrorBody::new(
                        "tool_unavailable",
                        format!("broca-mock: {} is not JSON", path.display()),
                    )),
                    Err(e) => Rendered::Refusal(ErrorBody::new(
                        "tool_unavailable",
                        format!("broca-mock: no scripted result for these arguments ({}: {e})", path.display()),
                    )),
                }
            }
            Answer::WhoAmI => {
                let v = json!({
                    "module_id": self.shared.module_id,
                    "incarnation": self.shared.incarnation,
                    "principal": self.bound.principal,
                    "scope": self.bound.scope,
                    "identity": self.bound.identity,
                    "consumer_capabilities": self.bound.consumer_capabilities,
                    "preset": request.preset,
                    "call_key": request.call_key,
                    "tool_call_id": request.tool_call_id,
                });
                text_or_json(v.to_string(), v.clone(), Some(v))
            }
        }
    }

    fn end_refused(&self, tool: &str, refusal: &ErrorBody) {
        let _ = self.shared.outbound.error(self.route, self.corr, refusal);
        self.record_end(tool, Outcome::Refused, Some(refusal.code.clone()));
    }

    fn record_end(&self, tool: &str, outcome: Outcome, code: Option<String>) {
        let entry = Entry::Reply(ReplyEntry {
            incarnation: self.shared.incarnation.clone(),
            at_ms: now_ms(),
            route: self.route.to_string(),
            corr: self.corr,
            key: self.key.clone(),
            tool: tool.to_owned(),
            outcome,
            code,
        });
        if let Err(e) = self.shared.log.record(&entry) {
            log::error!("cannot record a call's end in the call log: {e}");
        }
    }
}

enum Rendered {
    Body(Vec<u8>),
    Malformed(Vec<u8>),
    Refusal(ErrorBody),
    Hang,
}

fn changed(code: &str, tool: &str, expected: &str, current: &str) -> ErrorBody {
    ErrorBody::new(code, format!("{tool}: the pinned {expected} is not served (now {current})"))
        .with_detail(json!({"tool": tool, "expected": expected, "current": current}))
}

/// `bytes` bytes of readable ASCII text.
fn filler(bytes: usize) -> String {
    const UNIT: &str = "broca-mock filler text. ";
    UNIT.repeat(bytes / UNIT.len() + 1)[..bytes].to_owned()
}

/// The file stem a `from_dir` answer is found under: the SHA-256 of the arguments' canonical
/// JSON ([`call_log::canonical_json`]), lowercase hex.
pub fn from_dir_key(arguments: &Value) -> String {
    super::script::sha256_hex(call_log::canonical_json(arguments).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_leniently_for_role_ops_and_refuse_by_field() {
        let r = decode(br#"{"name":"role.describe"}"#).unwrap();
        assert_eq!((r.name.as_str(), r.arguments.clone()), ("role.describe", json!({})));
        let call = decode(br#"{"name":"echo","arguments":{"a":1},"call_key":"k:1","preset":"default"}"#).unwrap();
        assert_eq!((call.call_key.as_deref(), call.preset.as_deref()), (Some("k:1"), Some("default")));
        for (body, field) in [
            (&b"nope"[..], "body"),
            (b"[1]", "body"),
            (br#"{"arguments":{}}"#, "name"),
            (br#"{"name":"x","arguments":{},"tool_call_id":5}"#, "body"),
        ] {
            let e = decode(body).unwrap_err();
            assert_eq!(
                (e.code.as_str(), errors::invalid_request_field(&e)),
                ("invalid_request", Some(field)),
                "{body:?}"
            );
        }
    }

    #[test]
    fn describe_lists_the_required_ops_and_late_results_only_when_declared() {
        let s = ToolScript::builtin();
        let raw = serde_json::to_value(describe(&s)).unwrap();
        let checked = cortexkit_role_tool_provider::describe::check_describe(&raw).unwrap();
        let major = checked.major(PROVIDES).unwrap();
        assert!(
            major.serves(ops::ROLE_DESCRIBE) && major.serves(ops::TOOL_CATALOG) && !major.serves(ops::LATE_RESULTS)
        );
        let late = ToolScript::from_jsonc(r#"{"late_results": true}"#).unwrap();
        assert!(describe(&late).major(PROVIDES).unwrap().serves(ops::LATE_RESULTS_ACK));
    }

    #[test]
    fn the_late_results_log_is_empty_and_checks_its_cursor() {
        let body = late_results("inc-1", json!({"since": null})).unwrap();
        let reply: LateResultsReply = serde_json::from_slice(&body).unwrap();
        assert_eq!((reply.entries.len(), reply.cursor.seq, reply.more), (0, 0, false));
        let stale = late_results("inc-1", json!({"since": {"provider_incarnation": "inc-0", "seq": 0}})).unwrap_err();
        assert_eq!(stale.code, "cursor_incarnation_changed");
        assert_eq!(
            late_results_ack("inc-1", json!({"through": {"provider_incarnation": "inc-1", "seq": 0}})).unwrap(),
            b"{}"
        );
    }

    #[test]
    fn filler_has_the_exact_size() {
        for n in [0, 1, 23, 24, 25, 70 * 1024] {
            assert_eq!(filler(n).len(), n);
        }
    }
}
