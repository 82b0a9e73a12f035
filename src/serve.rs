//! The module front: the subc io thread's [`Handler`], mapping bound routes to sessions and
//! requests to ops. It runs on the io thread, so it only decodes, looks up and hands work to
//! the op workers; it never blocks and never touches disk (DESIGN §2 rule 2).
//!
//! Invariants: a route's session is fixed by its bind (harness + session from the identity;
//! project root from the daemon's legacy identity field, else the stamped scope's `workdir`,
//! else `/`); every request gets exactly one terminal frame, from its op's reply or from a
//! refusal here; a `session.subscribe` stream lives until its client cancels, its route closes,
//! or it ends in error.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cortexkit_role_llm_runner::display::Limits;
use parking_lot::Mutex;
use serde_json::{json, Value};
use subc_protocol::Flags;

use crate::actor::Gauges;
use crate::catalog::poller::CatalogHealth;
use crate::classify::scope::{route_role, RouteRole, Stamp};
use crate::classify::Classifier;
use crate::fanout::{From, Hub, SinkError, StreamSink, Subscription};
use crate::federation::Federation;
use crate::lineage::projection::Cursor;
use crate::op::Op;
use crate::ops::{invalid_params, Ops};
use crate::pool::Pool;
use crate::session_key::SessionKey;
use crate::subc::consumer::Consumer;
use crate::subc::{health_ok, BindRequest, ControlRequest, Handler, Outbound, Route};
use crate::wire::{Refusal, RefusalCode};

/// Process-lifetime counters for `health.check`: one per served op (indexed by
/// [`Op::index`]), and the `session.read` count the spec names on its own.
#[derive(Default)]
pub struct Metrics {
    ops: [AtomicU64; Op::ALL.len()],
    session_reads: AtomicU64,
    /// `classify.run` calls (classifier routes; not a session op).
    classify_runs: AtomicU64,
    /// The move ops' calls, in [`crate::op::MOVE_OPS`] order.
    moves: [AtomicU64; crate::op::MOVE_OPS.len()],
}

impl Metrics {
    fn count(&self, op: Option<Op>) {
        let Some(op) = op else { return };
        self.ops[op.index()].fetch_add(1, Ordering::Relaxed);
        if op == Op::SessionRead {
            self.session_reads.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every served operation at zero or above, plus the named gauges.
    pub fn snapshot(&self, gauges: &Gauges, reverse_refused: u64) -> Value {
        let mut management: BTreeMap<&str, u64> =
            Op::ALL.iter().map(|op| (op.name(), self.ops[op.index()].load(Ordering::Relaxed))).collect();
        management.insert(cortexkit_role_classifier::ops::CLASSIFY_RUN, self.classify_runs.load(Ordering::Relaxed));
        for (name, count) in crate::op::MOVE_OPS.iter().zip(&self.moves) {
            management.insert(name, count.load(Ordering::Relaxed));
        }
        let load = |g: &AtomicU64| g.load(Ordering::Relaxed);
        json!({
            "management_ops": management,
            "session_reads": self.session_reads.load(Ordering::Relaxed),
            "actor_opens": load(&gauges.actor_opens),
            "open_sessions": load(&gauges.open_sessions),
            "runs_in_flight": load(&gauges.runs_in_flight),
            "opening": load(&gauges.opening),
            "closing": load(&gauges.closing),
            "reverse_requests_refused": reverse_refused,
            // Spec §19 names the total without naming the metric: the sessions retention
            // cannot read (their WAL, or the intake store their deletion must consult).
            "retention": {"unreadable_sessions": load(&gauges.retention_unreadable_sessions)},
        })
    }
}

pub struct Server {
    ops: Arc<Ops>,
    hub: Arc<Hub>,
    outbound: Outbound,
    workers: Arc<Pool>,
    metrics: Arc<Metrics>,
    routes: HashMap<Route, crate::ops::Route>,
    /// Every stream of a route, from its request until it ends: `None` while a worker attaches
    /// it. A cancel or a route close removes the entry; a worker that then finds its entry gone
    /// cancels what it attached, so no stream outlives its request.
    streams: Arc<Mutex<Streams>>,
    draining: Arc<AtomicBool>,
    stopped: crossbeam_channel::Sender<()>,
    /// broca's consumer connection, when it could be made.
    consumer: Option<Consumer>,
    /// The catalog poller's health, reported as `metrics.catalog`.
    catalog_health: Arc<CatalogHealth>,
    /// The classifier role (`None`: `system-one.db` could not be opened; its calls are refused).
    classifier: Option<Arc<Classifier>>,
    /// Bound classifier routes and their stamps (spec §4b: no session).
    classifier_routes: HashMap<Route, Arc<Stamp>>,
    /// Classifier calls, each on a task of its own, none holding an op worker.
    classify_tasks: Arc<Pool>,
    /// This host's machine and the carriers that relay routes from others (DESIGN §8).
    federation: Federation,
}

impl Server {
    pub fn new(ops: Arc<Ops>, hub: Arc<Hub>, outbound: Outbound, stopped: crossbeam_channel::Sender<()>) -> Server {
        Server {
            ops,
            hub,
            outbound,
            workers: Arc::new(Pool::new("broca-op", crate::limits::OP_THREADS)),
            metrics: Arc::new(Metrics::default()),
            routes: HashMap::new(),
            streams: Arc::new(Mutex::new(HashMap::new())),
            draining: Arc::new(AtomicBool::new(false)),
            stopped,
            consumer: None,
            catalog_health: Arc::default(),
            classifier: None,
            classifier_routes: HashMap::new(),
            classify_tasks: Arc::new(Pool::new("broca-classify", crate::classify::service::CALLS_PER_PROCESS)),
            federation: Federation::default(),
        }
    }

    /// Reads relayed routes' callers by `federation` (without it, no module is a carrier).
    pub fn with_federation(mut self, federation: Federation) -> Server {
        self.federation = federation;
        self
    }

    /// Serves the classifier role on routes that declare it.
    pub fn with_classifier(mut self, classifier: Option<Arc<Classifier>>) -> Server {
        self.classifier = classifier;
        self
    }

    /// Reports the catalog poller's `health` (it stays "stopped" without one).
    pub fn with_catalog_health(mut self, health: Arc<CatalogHealth>) -> Server {
        self.catalog_health = health;
        self
    }

    /// Attaches broca's consumer connection (its reverse-request refusals are reported).
    pub fn with_consumer(mut self, consumer: Option<Consumer>) -> Server {
        self.consumer = consumer;
        self
    }

    fn refuse(&self, route: Route, corr: u64, refusal: &Refusal) {
        let _ = self.outbound.refuse(route, corr, refusal);
    }

    /// A request no op worker could take is refused, never dropped: `too_many_requests` when
    /// every worker is busy ([`crate::limits::OP_THREADS`]), else transient `open_failed`.
    fn refuse_unstarted(&self, route: Route, corr: u64, e: &crate::pool::PoolError) {
        let refusal = match e {
            crate::pool::PoolError::Full { limit } => {
                crate::wire::over_limit(RefusalCode::TooManyRequests, "every op worker is busy", *limit, None)
            }
            crate::pool::PoolError::Spawn(_) => {
                log::error!("cannot start an op worker: {e}");
                Refusal::new(RefusalCode::OpenFailed, e.to_string(), Some(crate::detail!("class" => "transient")))
            }
        };
        self.refuse(route, corr, &refusal);
    }

    fn subscribe(&mut self, route: Route, corr: u64, key: SessionKey, params: &Value) {
        let SubscribeParams { from, limits } = match parse_subscribe(params) {
            Ok(p) => p,
            Err(r) => return self.refuse(route, corr, &r),
        };
        let hub = Arc::clone(&self.hub);
        let sink = SubcSink { outbound: self.outbound.clone(), route, corr };
        let streams = Arc::clone(&self.streams);
        // Attaching reads the disk (the WAL's place, the live head): a worker does it, never
        // the io thread.
        let ops = Arc::clone(&self.ops);
        self.streams.lock().insert((route, corr), None);
        let job = move || {
            let registry = &ops.registry;
            let Some(sub) = hub.attach_with(registry.shared(), &key, from, limits, sink) else {
                streams.lock().remove(&(route, corr));
                return;
            };
            {
                let mut streams = streams.lock();
                match streams.get_mut(&(route, corr)) {
                    Some(slot) => *slot = Some(sub),
                    // Cancelled, or its route closed, while it attached.
                    None => {
                        drop(streams);
                        sub.cancel();
                        return;
                    }
                }
            }
            // A subscription (re)opens the session's actor, which then holds the lease while
            // observers remain. A lease held by another process leaves the stream read-only. An
            // expired record is not opened (its open would delete it and start an empty one).
            let live = registry.shared().has_record(&key) && crate::ops::expiry::record_version(&ops, &key).is_ok();
            let opened = if live { registry.open(&key) } else { Ok(()) };
            if let Err(e) = opened {
                log::info!("subscribe on {}: the session stays closed here ({e})", key.addr());
            }
        };
        if let Err(e) = self.workers.run(job) {
            self.streams.lock().remove(&(route, corr));
            self.refuse_unstarted(route, corr, &e);
        }
    }
}

/// Every stream by its route and request: `None` while a worker attaches it.
type Streams = HashMap<(Route, u64), Option<Subscription>>;

/// A request on a classifier route: `{method, params}`, `params` kept as its text (the body
/// identity and the forwarded `state` are the caller's bytes).
#[derive(serde::Deserialize)]
struct ClassifierEnvelope<'a> {
    method: String,
    #[serde(borrow, default)]
    params: Option<&'a serde_json::value::RawValue>,
}

impl Server {
    /// A classifier route's request (spec §4b): `role.describe` and `classify.run`, each on a
    /// task of the classifier pool; every other method is `unknown_method`. The answer is the
    /// reply's text inside `{"result": …}`, never re-encoded.
    fn classifier_request(&mut self, route: Route, corr: u64, stamp: Arc<Stamp>, body: Vec<u8>) {
        let refuse = move |out: &Outbound, refusal: &cortexkit_role_classifier::errors::Refusal| {
            let detail = serde_json::to_value(&*refusal.detail).ok();
            let mut error = subc_protocol::ErrorBody::new(refusal.code.clone(), refusal.message.clone());
            error.detail = detail;
            let _ = out.error(route, corr, &error);
        };
        let envelope = match serde_json::from_slice::<ClassifierEnvelope>(&body) {
            Ok(e) => e,
            Err(e) => {
                let refusal =
                    cortexkit_role_classifier::errors::Refusal::invalid_params("params", format!("not a request: {e}"));
                return refuse(&self.outbound, &refusal);
            }
        };
        let method = envelope.method.clone();
        let params = envelope.params.map_or("{}", |p| p.get()).to_owned();
        let classify = method == cortexkit_role_classifier::ops::CLASSIFY_RUN;
        if method == Op::RoleDescribe.name() {
            self.metrics.count(Some(Op::RoleDescribe));
        } else if classify {
            self.metrics.classify_runs.fetch_add(1, Ordering::Relaxed);
        } else {
            let method = crate::wire::loggable(&method);
            let message = format!("unknown method {method:?} on a classifier/v1 route");
            let detail = Some(crate::detail!("method" => method, "class" => "permanent"));
            return self.refuse(route, corr, &Refusal::new(RefusalCode::UnknownMethod, message, detail));
        }
        let Some(classifier) = self.classifier.clone() else {
            let refusal = crate::classify::scope::refusal(
                RefusalCode::Unavailable,
                "broca's classifier store could not be opened",
            );
            return refuse(&self.outbound, &refusal);
        };
        if classify && self.draining.load(Ordering::Acquire) {
            let refusal = crate::classify::service::full("broca is draining; send the batch again shortly", 0);
            return refuse(&self.outbound, &refusal);
        }
        let out = self.outbound.clone();
        let catalog = Arc::clone(&self.ops.admission.catalog);
        let job = move || {
            let answer = if classify {
                let answer = crate::classify::run::classify(&classifier, &stamp, &params);
                let counter =
                    if answer.is_ok() { &classifier.metrics.calls_answered } else { &classifier.metrics.calls_refused };
                counter.fetch_add(1, Ordering::Relaxed);
                answer
            } else {
                describe_classifier(&classifier, &catalog, &params)
            };
            match answer {
                Ok(text) => {
                    let _ = out.reply(route, corr, format!("{{\"result\":{text}}}").into_bytes());
                }
                Err(refusal) => refuse(&out, &refusal),
            }
        };
        if let Err(e) = self.classify_tasks.run(job) {
            let refusal = match e {
                crate::pool::PoolError::Full { limit } => {
                    crate::classify::service::full("every classifier task is busy", limit)
                }
                crate::pool::PoolError::Spawn(e) => {
                    log::error!("cannot start a classifier task: {e}");
                    crate::classify::service::full("a classifier task could not be started", 0)
                }
            };
            refuse(&self.outbound, &refusal);
        }
    }
}

/// The classifier `role.describe` (`{}` params only), from the live catalog.
fn describe_classifier(
    classifier: &Classifier,
    catalog: &crate::catalog::SharedCatalog,
    params: &str,
) -> Result<String, cortexkit_role_classifier::errors::Refusal> {
    let empty = serde_json::from_str::<serde_json::Map<String, Value>>(params).is_ok_and(|m| m.is_empty());
    if !empty {
        return Err(cortexkit_role_classifier::errors::Refusal::invalid_params("params", "role.describe takes {}"));
    }
    let describe = match &*catalog.read() {
        Ok(catalog) => crate::classify::models::describe(catalog, &classifier.bases),
        Err(_) => cortexkit_role_classifier::describe::RoleDescribe::new(
            cortexkit_role_classifier::describe::Limits::new(
                crate::classify::models::MAX_ITEMS,
                crate::classify::models::MAX_REQUEST_BYTES,
            ),
            Vec::new(),
        ),
    };
    Ok(serde_json::to_string(&describe).expect("a describe encodes"))
}

/// A `session.subscribe` request: where it attaches, and the byte bounds its `tool_started`
/// events cut arguments to (llm-runner/v1 `LiveSubscribeRequest`; absent: whole arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscribeParams {
    pub from: From,
    pub limits: Option<Limits>,
}

/// `session.subscribe {from?, limits?}`: strict, refused by name. `live_ids` is refused as an
/// unknown member: broca does not declare `live_ids` (CONTRACT §7.1, "older runners refuse the
/// unknown request field").
#[doc(hidden)]
pub fn parse_subscribe(params: &Value) -> Result<SubscribeParams, Refusal> {
    let from = parse_from(params)?;
    let limits = params.get("limits").map(parse_limits).transpose()?;
    Ok(SubscribeParams { from, limits })
}

/// `limits {arguments_bytes, result_bytes, error_result_bytes}` (`display::Limits`): strict,
/// every bound required, a wrong or missing one refused naming it.
fn parse_limits(limits: &Value) -> Result<Limits, Refusal> {
    const BOUNDS: [&str; 3] = ["arguments_bytes", "result_bytes", "error_result_bytes"];
    let Some(map) = limits.as_object() else {
        return Err(invalid_params("limits", "an object {arguments_bytes, result_bytes, error_result_bytes}"));
    };
    if let Some(k) = map.keys().find(|k| !BOUNDS.contains(&k.as_str())) {
        return Err(invalid_params(k, "unknown member of limits"));
    }
    let bound = |name: &str| {
        map.get(name).and_then(Value::as_u64).ok_or_else(|| invalid_params(name, "an unsigned integer is required"))
    };
    Ok(Limits::new(bound(BOUNDS[0])?, bound(BOUNDS[1])?, bound(BOUNDS[2])?))
}

/// The attach point of a `session.subscribe` request (public for the fuzz targets).
#[doc(hidden)]
pub fn parse_from(params: &Value) -> Result<From, Refusal> {
    if let Some(map) = params.as_object() {
        if let Some(k) = map.keys().find(|k| !matches!(k.as_str(), "from" | "limits")) {
            return Err(invalid_params(k, "unknown member"));
        }
    } else if !params.is_null() {
        return Err(invalid_params("params", "must be an object"));
    }
    match params.get("from") {
        None => Ok(From::Live),
        Some(Value::String(s)) if s == "live" => Ok(From::Live),
        Some(Value::String(s)) if s == "start" => Ok(From::Start),
        Some(c @ Value::Object(_)) => serde_json::from_value::<Cursor>(c.clone())
            .map(From::After)
            .map_err(|_| invalid_params("from", "\"start\", \"live\" or a cursor {wal_seq, sub_index}")),
        Some(_) => Err(invalid_params("from", "\"start\", \"live\" or a cursor {wal_seq, sub_index}")),
    }
}

/// Decides a `route.bind` from what the daemon stamped, never from the opener's claims: a bind
/// must carry the daemon's principal, and a session route must name a session. Who may *write*
/// a session (owner rules) is decided per operation.
pub fn authorize(bind: &BindRequest, federation: &Federation) -> Result<(), subc_protocol::ErrorBody> {
    let role = route_role(bind.role_versions.as_ref())?;
    federation.caller_of(bind)?;
    if bind.principal.is_none() {
        return Err(subc_protocol::ErrorBody::new(
            crate::wire::RefusalCode::NotAuthorized.as_str(),
            "the daemon stamped no principal on this bind",
        ));
    }
    if role == RouteRole::Classifier {
        // A classifier route names no session (spec §4b).
        return Ok(());
    }
    if bind.identity.session.trim().is_empty() || bind.identity.harness.trim().is_empty() {
        return Err(subc_protocol::ErrorBody::new(
            crate::wire::RefusalCode::InvalidParams.as_str(),
            "a session route needs a harness and a session",
        ));
    }
    Ok(())
}

/// The session a bind addresses.
fn session_of(bind: &BindRequest) -> SessionKey {
    let root = bind
        .legacy_project_root
        .clone()
        .or_else(|| bind.scope.as_ref().and_then(|s| s.workdir.clone()))
        .unwrap_or_else(|| "/".into());
    SessionKey::new(&root, &bind.identity.harness, &bind.identity.session)
}

impl Server {
    /// A move op (`crate::moves`): on an op worker, like every session op; counted in
    /// `management_ops` unless its authorization refused it (spec §4).
    fn move_op(&mut self, route: Route, corr: u64, bound: crate::ops::Route, method: String, params: Value) {
        let (ops, out, metrics) = (Arc::clone(&self.ops), self.outbound.clone(), Arc::clone(&self.metrics));
        let job = move || {
            let answer = crate::moves::serve(&ops, &bound, &method, &params);
            if !matches!(&answer, Err(r) if r.code == RefusalCode::NotAuthorized) {
                if let Some(i) = crate::op::MOVE_OPS.iter().position(|m| *m == method) {
                    metrics.moves[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = match answer {
                Ok(answer) => out.reply(route, corr, json!({"result": answer}).to_string().into_bytes()),
                Err(refusal) => out.refuse(route, corr, &refusal),
            };
        };
        if let Err(e) = self.workers.run(job) {
            self.refuse_unstarted(route, corr, &e);
        }
    }
}

impl Handler for Server {
    fn on_route_bound(&mut self, bind: BindRequest) {
        if route_role(bind.role_versions.as_ref()) == Ok(RouteRole::Classifier) {
            let stamp = Stamp { principal: bind.principal.clone(), scope: bind.scope.clone() };
            self.classifier_routes.insert(bind.route, Arc::new(stamp));
            return;
        }
        let scoped = bind.scope.is_some();
        // Authorized binds only reach here, so a relayed one has a readable origin.
        let Ok(caller) = self.federation.caller_of(&bind) else { return };
        self.routes.insert(bind.route, crate::ops::Route { key: session_of(&bind), scoped, caller });
    }

    fn on_request(&mut self, route: Route, corr: u64, flags: Flags, body: Vec<u8>) {
        if let Some(stamp) = self.classifier_routes.get(&route).cloned() {
            return self.classifier_request(route, corr, stamp, body);
        }
        let Some(bound) = self.routes.get(&route).cloned() else {
            return self.refuse(
                route,
                corr,
                &Refusal::new(RefusalCode::UnknownChannel, "the route is not bound", None),
            );
        };
        let key = bound.key.clone();
        let envelope: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return self.refuse(route, corr, &invalid_params("body", &format!("not JSON: {e}"))),
        };
        let Some(method) = envelope.get("method").and_then(Value::as_str).map(String::from) else {
            return self.refuse(route, corr, &invalid_params("method", "required"));
        };
        let params = envelope.get("params").cloned().unwrap_or(Value::Null);
        if crate::moves::OPS.contains(&method.as_str()) {
            return self.move_op(route, corr, bound, method, params);
        }
        let op = Op::parse(&method);
        if op == Some(Op::SessionSubscribe) {
            self.metrics.count(op);
            if !flags.is_subscription() {
                return self.refuse(
                    route,
                    corr,
                    &invalid_params("flags", "session.subscribe is a subscription request"),
                );
            }
            return self.subscribe(route, corr, key, &params);
        }
        let (ops, outbound, metrics) = (Arc::clone(&self.ops), self.outbound.clone(), Arc::clone(&self.metrics));
        let draining = Arc::clone(&self.draining);
        let job = move || {
            let out = outbound.clone();
            let started = std::time::Instant::now();
            let session = bound.key.session.clone();
            crate::actor::take_opened_here();
            let log_method = method.clone();
            let reply = Box::new(move |result: Result<Value, Refusal>| {
                let _ = match result {
                    Ok(answer) => out.reply(route, corr, json!({"result": answer}).to_string().into_bytes()),
                    Err(refusal) => out.refuse(route, corr, &refusal),
                };
            });
            // Counted once authorized (spec §4); a draining module refuses sends after that.
            let authorized = || {
                metrics.count(op);
                if op == Some(Op::SessionSend) && draining.load(Ordering::Acquire) {
                    return Err(Refusal::new(
                        RefusalCode::ModuleReloading,
                        "broca is draining; send again shortly",
                        None,
                    ));
                }
                Ok(())
            };
            ops.handle_counted(&bound, &method, params, reply, authorized);
            // One record per served op: never its parameters (spec §4, CK_LOG). The caller's
            // method and session strings are bounded and escaped: one record is one line (#44).
            log::debug!(
                target: "broca.requests",
                "op={:?} session={:?} actor_opened={} elapsed_us={}",
                crate::wire::loggable(&log_method),
                crate::wire::loggable(&session),
                crate::actor::take_opened_here(),
                started.elapsed().as_micros()
            );
        };
        if let Err(e) = self.workers.run(job) {
            self.refuse_unstarted(route, corr, &e);
        }
    }

    fn on_cancel(&mut self, route: Route, corr: u64) {
        // A stream ends on cancel; a unary request keeps its one terminal from its op.
        if let Some(Some(sub)) = self.streams.lock().remove(&(route, corr)) {
            sub.cancel();
        }
    }

    fn on_route_closed(&mut self, route: Route) {
        self.routes.remove(&route);
        self.classifier_routes.remove(&route);
        let mut streams = self.streams.lock();
        let gone: Vec<(Route, u64)> = streams.keys().filter(|(r, _)| *r == route).copied().collect();
        for k in gone {
            if let Some(Some(sub)) = streams.remove(&k) {
                sub.cancel();
            }
        }
    }

    fn on_control(&mut self, request: ControlRequest) {
        match request {
            ControlRequest::HealthCheck { corr } => {
                let refused = self.consumer.as_ref().map_or(0, |c| c.reverse_requests_refused());
                let mut metrics = self.metrics.snapshot(self.ops.registry.gauges(), refused);
                metrics["catalog"] = self.catalog_health.snapshot(&self.ops.admission.catalog);
                // The busy gauge is always reported (0 without a classifier): a drain sums it.
                metrics["system_one_batches_in_flight"] = json!(0);
                if let Some(classifier) = &self.classifier {
                    let system_one = classifier.metrics.snapshot();
                    metrics["system_one_batches_in_flight"] = system_one["batches_in_flight"].clone();
                    metrics["system_one"] = system_one;
                }
                let _ = self.outbound.health(corr, health_ok(metrics));
            }
            ControlRequest::Draining { .. } => {
                // Stop admission now; running turns finish their step and seal at its boundary.
                self.draining.store(true, Ordering::Release);
                let registry = Arc::clone(&self.ops.registry);
                if let Err(e) = self.workers.run(move || registry.drain()) {
                    log::error!("cannot start an op worker to drain: {e}");
                }
            }
        }
    }

    fn on_shutdown(&mut self) {
        let _ = self.stopped.send(());
    }
}

/// A subscription's frames as subc StreamData on its request.
struct SubcSink {
    outbound: Outbound,
    route: Route,
    corr: u64,
}

impl StreamSink for SubcSink {
    fn frame(&mut self, event: &Value) -> Result<(), SinkError> {
        let body = match serde_json::to_vec(event) {
            Ok(b) => b,
            Err(_) => {
                return Err(SinkError::Undeliverable(undeliverable(
                    event,
                    "unencodable",
                    None,
                    self.outbound.frame_limit(),
                )))
            }
        };
        if !self.outbound.fits(body.len()) {
            let refusal = undeliverable(event, "too_large", Some(body.len()), self.outbound.frame_limit());
            return Err(SinkError::Undeliverable(refusal));
        }
        self.outbound.stream_data(self.route, self.corr, body).map_err(|_| SinkError::Closed)
    }

    fn end(&mut self, error: Option<Refusal>) {
        let _ = match error {
            None => self.outbound.stream_end(self.route, self.corr, Vec::new()),
            Some(r) => self.outbound.refuse(self.route, self.corr, &r),
        };
    }
}

/// `subscribe_unit_undeliverable` (spec §9): the stream ends with it and no StreamEnd. `cursor`
/// is the control unit's (null for a display event); `frame_bytes` counts the header.
pub fn undeliverable(event: &Value, reason: &str, body_bytes: Option<usize>, limit: usize) -> Refusal {
    let cursor = event.get("cursor").cloned().unwrap_or(Value::Null);
    let (detail, message) = match body_bytes {
        Some(bytes) => {
            let frame_bytes = bytes + subc_protocol::HEADER_LEN;
            let message = format!(
                "subscribe unit undeliverable: its frame would be {frame_bytes} bytes, over the {limit}-byte limit; resubscribing before its cursor reaches it again"
            );
            (
                crate::detail!("reason" => reason, "cursor" => cursor, "frame_bytes" => frame_bytes, "limit" => limit),
                message,
            )
        }
        None => {
            let message = "subscribe unit undeliverable: it cannot be encoded".to_string();
            (crate::detail!("reason" => reason, "cursor" => cursor), message)
        }
    };
    Refusal::new(RefusalCode::SubscribeUnitUndeliverable, message, Some(detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_undeliverable_refusal_is_pinned() {
        let event =
            json!({"kind": "control", "cursor": {"wal_seq": 7, "sub_index": 0}, "unit": {"type": "assistant_message"}});
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/golden/subscribe_unit_undeliverable.too_large.json");
        let golden = std::fs::read_to_string(path).unwrap();
        // A body exactly at the limit: with its header the frame is 21 bytes over.
        let limit = subc_protocol::MAX_DELIVERED_FRAME_LEN;
        assert_eq!(undeliverable(&event, "too_large", Some(limit), limit).to_json(), golden);
    }
}
