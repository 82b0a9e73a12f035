//! `broca-mock relay [--target MODULE] --subc <connection-file>`: a caller with its own
//! daemon-attested principal. The daemon launches it as a module (its id is the principal,
//! `reserved:<module id>`); it serves a `management_surface` with broca's session ops and
//! relays every request, byte for byte, to the target's (default `broca`) management surface
//! over its own consumer connection, presenting its launch nonce. The target so sees a route
//! the daemon stamped with this module's principal, which a test process (always `direct`)
//! cannot present itself: two relays are two distinct owners.
//!
//! Each request keeps the bind identity (harness, session) it arrived with. A reply is
//! relayed as the target sent it; the target's refusal is relayed as its own error body; a
//! call that never got the target's answer (the daemon refused it, the route closed, the call
//! timed out) is refused `relay_failed` naming why. Streams
//! (`session.subscribe`) are refused `relay_unsupported`. At most [`MAX_IN_FLIGHT`] calls are
//! relayed at once (one thread each); past it a request is refused `relay_busy`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broca::subc::consumer::{CallError, Consumer, ConsumerIdentity};
use broca::subc::{self, health_ok, BindRequest, ControlRequest, Handler, Outbound, Route};
use serde_json::json;
use subc_protocol::{BindIdentity, ErrorBody, Flags, RouteTarget};

/// The module id when the daemon names none.
pub const DEFAULT_MODULE_ID: &str = "broca-relay";
/// The module relayed to when `--target` names none.
const DEFAULT_TARGET: &str = "broca";
/// Calls relayed at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// The deadline of one relayed call: above broca's own 10 s bound on a send's answer, below
/// the conformance adapter's 20 s call deadline, so the relay's answer arrives first.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

struct Relay {
    outbound: Outbound,
    consumer: Consumer,
    target: RouteTarget,
    routes: BTreeMap<Route, BindIdentity>,
    in_flight: Arc<AtomicUsize>,
}

fn refuse(outbound: &Outbound, route: Route, corr: u64, code: &str, message: String) {
    if let Err(e) = outbound.error(route, corr, &ErrorBody::new(code, message)) {
        log::warn!("cannot answer {route} corr {corr}: {e:?}");
    }
}

impl Handler for Relay {
    fn on_route_bound(&mut self, bind: BindRequest) {
        self.routes.insert(bind.route, bind.identity);
    }

    fn on_request(&mut self, route: Route, corr: u64, flags: Flags, body: Vec<u8>) {
        let Some(identity) = self.routes.get(&route).cloned() else {
            return refuse(&self.outbound, route, corr, "unknown_channel", "the route is not bound".into());
        };
        if flags.is_subscription() {
            return refuse(
                &self.outbound,
                route,
                corr,
                "relay_unsupported",
                "the relay relays unary calls only".into(),
            );
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            let message = format!("the relay already relays {MAX_IN_FLIGHT} calls");
            return refuse(&self.outbound, route, corr, "relay_busy", message);
        }
        let (outbound, consumer, target) = (self.outbound.clone(), self.consumer.clone(), self.target.clone());
        let in_flight = Arc::clone(&self.in_flight);
        // The io thread never blocks: each relayed call waits on its own thread.
        let spawned = std::thread::Builder::new().name("relay-call".into()).spawn(move || {
            let sent = match consumer.call_on(&target, &identity, &body, CALL_TIMEOUT) {
                Ok(reply) => outbound.reply(route, corr, reply),
                Err(CallError::Module(error)) => outbound.error(route, corr, &error),
                // The daemon's refusals (the call never reached the target) and transport ends.
                Err(e) => outbound.error(route, corr, &ErrorBody::new("relay_failed", format!("relaying: {e}"))),
            };
            if let Err(e) = sent {
                log::warn!("cannot answer {route} corr {corr}: {e:?}");
            }
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            refuse(&self.outbound, route, corr, "relay_failed", format!("cannot start a relay thread: {e}"));
        }
    }

    fn on_cancel(&mut self, _route: Route, _corr: u64) {}

    fn on_route_closed(&mut self, route: Route) {
        self.routes.remove(&route);
    }

    fn on_control(&mut self, request: ControlRequest) {
        if let ControlRequest::HealthCheck { corr } = request {
            let _ = self.outbound.health(corr, health_ok(json!({"routes": self.routes.len()})));
        }
    }

    fn on_shutdown(&mut self) {}
}

/// A management surface with the target's session ops (broca's own op table).
fn manifest(module_id: &str) -> subc_protocol::manifest::ModuleManifest {
    use broca::op::{Op, OpKind};
    use subc_protocol::manifest::{
        Concurrency, IdentityScope, ManagementOperation, ManagementOperationKind, ModuleManifest, ProviderRole,
    };
    let operations = Op::ALL
        .iter()
        .filter(|o| o.kind() != OpKind::Stream)
        .map(|o| ManagementOperation {
            name: o.name().into(),
            kind: match o.kind() {
                OpKind::Write => ManagementOperationKind::Mutate,
                OpKind::Query | OpKind::Stream => ManagementOperationKind::Query,
            },
            description: None,
        })
        .collect();
    ModuleManifest::builder(module_id, env!("CARGO_PKG_VERSION"))
        .provides(vec![ProviderRole::ManagementSurface {
            operations,
            config_schema: json!({"type": "object"}),
            observability: Vec::new(),
            identity_scope: vec![IdentityScope::Session],
            concurrency: Concurrency::ModuleManaged,
        }])
        .build()
}

/// `broca-mock relay …` (the daemon appends `--subc <file>`).
pub fn main(args: &[String]) -> ExitCode {
    let (mut target, mut conn) = (None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--target" => target = it.next().cloned(),
            "--subc" => conn = it.next().map(PathBuf::from),
            other => {
                eprintln!("broca-mock relay: unknown argument `{other}`");
                return ExitCode::from(2);
            }
        }
    }
    let Some(conn_file) = conn else {
        eprintln!("broca-mock relay: needs --subc CONNECTION_FILE");
        return ExitCode::from(2);
    };
    let module_id = std::env::var(subc_protocol::SUBC_MODULE_ID_ENV)
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| DEFAULT_MODULE_ID.to_owned());
    let conn = match subc::connect(&conn_file, manifest(&module_id), &module_id) {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("broca-mock relay: {e}");
            return ExitCode::from(1);
        }
    };
    // The consumer presents this module's launch nonce: that is what makes the daemon stamp
    // `reserved:<module id>` on the routes it opens.
    let nonce = match subc_os::launch_nonce::launch_nonce() {
        Ok(Some(n)) => n.value().to_owned(),
        Ok(None) => {
            eprintln!("broca-mock relay: no launch nonce (the relay must be launched by the daemon)");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("broca-mock relay: the launch nonce: {e}");
            return ExitCode::from(1);
        }
    };
    let identity = ConsumerIdentity { module_id: module_id.clone(), launch_nonce: nonce };
    let consumer = match Consumer::connect(&conn_file, Some(identity)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("broca-mock relay: no consumer connection: {e}");
            return ExitCode::from(1);
        }
    };
    let relay = Relay {
        outbound: conn.outbound(),
        consumer,
        target: RouteTarget::ManagementSurface { module_id: target.unwrap_or_else(|| DEFAULT_TARGET.to_owned()) },
        routes: BTreeMap::new(),
        in_flight: Arc::new(AtomicUsize::new(0)),
    };
    let running = match conn.start(relay, |_: &BindRequest| Ok(())) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("broca-mock relay: cannot start the subc io thread: {e}");
            return ExitCode::from(1);
        }
    };
    log::info!("relaying as reserved:{module_id}");
    let end = running.join();
    if end.is_clean() {
        ExitCode::SUCCESS
    } else {
        eprintln!("broca-mock relay: {end}");
        ExitCode::from(1)
    }
}
