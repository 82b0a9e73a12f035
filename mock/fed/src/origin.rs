//! The origin side (`--peer`): re-exports the serving side's modules on its own daemon as
//! `fed:<peer machine id>:<module>` and relays their routes over the link.
//!
//! One link session at a time: dial (the port file is re-read on every attempt), `hello` both
//! ways, one module connection per export (HELLO with this process's launch nonce, so the daemon
//! admits the `fed:` id under `callosum`'s reserved prefix), then relay until the link ends.
//! Then every open request is answered `fed_link_lost`, every relayed route gets its GOODBYE,
//! the `fed:` connections end (the daemon unregisters them, so new opens get `unknown_module`),
//! and the link is dialed again with backoff.
//!
//! Invariants:
//! - the subc io threads never block: handlers and the authorizer take the state lock for map
//!   updates only and queue frames without waiting (link `Writer`, `Outbound`);
//! - a request is in `requests` from its relay until its one terminal is written (the serving
//!   side's answer, a local refusal, or `fed_link_lost`), so it gets exactly one;
//! - after the link is lost (`dead`) no bind is accepted and nothing more is relayed;
//! - an origin route ends on this side only by the origin's close, the serving side's `closed`,
//!   or the link's loss, and the serving side hears of the first (`close`).

use std::collections::{HashMap, HashSet};
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::subc::{self, health_ok, BindRequest, ControlRequest, Handler, Outbound, Route, SendError};
use parking_lot::Mutex;
use serde_json::json;
use subc_protocol::manifest::ModuleManifest;
use subc_protocol::{ErrorBody, Flags};

use super::link::{self, Kind, Refused, Writer};
use super::{
    code, is_machine_id, log_line, read_port_file, spell, Backoff, FED_PREFIX, MAX_EXPORTS, MAX_IN_FLIGHT, MAX_ROUTES,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest the serving side may take to answer `hello` (it may wait for its exports).
const HELLO_WAIT: Duration = Duration::from_secs(30);

pub struct Options {
    pub conn_file: PathBuf,
    pub port_file: PathBuf,
    pub machine_id: String,
    pub log: Option<PathBuf>,
}

/// Dials, relays, and dials again, until the process ends.
pub fn run(opts: Options) {
    let mut backoff = Backoff::new();
    loop {
        match dial(&opts) {
            Ok(stream) => match session(stream, &opts) {
                Ok(()) => backoff.reset(),
                Err(e) => log::warn!("link: {e}"),
            },
            Err(e) => log::debug!("no link: {e}"),
        }
        std::thread::sleep(backoff.next_wait());
    }
}

fn dial(opts: &Options) -> Result<TcpStream, String> {
    let port = read_port_file(&opts.port_file).ok_or_else(|| format!("no port in {}", opts.port_file.display()))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| format!("{addr}: {e}"))
}

/// One relayed route: the `fed:` connection it is bound on and its route there.
struct Relayed {
    out: Outbound,
    export: usize,
    route: Route,
}

#[derive(Default)]
struct State {
    routes: HashMap<u64, Relayed>,
    by_route: HashMap<(usize, Route), u64>,
    /// Open requests: (rid, corr).
    requests: HashSet<(u64, u64)>,
    next_rid: u64,
    /// The link is lost: nothing more is accepted or relayed.
    dead: bool,
}

struct Shared {
    /// The serving side's machine id.
    peer: String,
    link: Writer,
    state: Mutex<State>,
    log: Option<PathBuf>,
}

/// Reads frames until `hello`, skipping pings; `None` on anything else.
fn read_hello(reader: &mut BufReader<TcpStream>) -> Result<link::Hello, String> {
    let until = Instant::now() + HELLO_WAIT;
    loop {
        match link::read_frame(reader) {
            Ok(Some(f)) if f.kind == Kind::Ping && Instant::now() < until => {}
            Ok(Some(f)) if f.kind == Kind::Hello => {
                return serde_json::from_slice(&f.body).map_err(|e| format!("a bad hello: {e}"))
            }
            Ok(Some(f)) => return Err(format!("expected hello, got {:?}", f.kind)),
            Ok(None) => return Err("the link closed before hello".into()),
            Err(e) => return Err(format!("reading hello: {e}")),
        }
    }
}

fn session(stream: TcpStream, opts: &Options) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(link::SILENCE)).map_err(|e| e.to_string())?;
    let write_half = stream.try_clone().map_err(|e| e.to_string())?;
    let link =
        Writer::spawn(write_half, "fed-link-w", link::QUEUE_BYTES, Some(link::HEARTBEAT)).map_err(|e| e.to_string())?;
    let hello = link::Hello { v: link::VERSION, machine_id: opts.machine_id.clone(), exports: Vec::new() };
    let body = serde_json::to_vec(&hello).map_err(|e| e.to_string())?;
    let _ = link.send(link::encode(Kind::Hello, 0, 0, &body).unwrap_or_default());
    let mut reader = BufReader::new(stream);
    let answer = match read_hello(&mut reader) {
        Ok(h) if !is_machine_id(&h.machine_id) => Err(format!("the peer's machine id {:?} is not hex", h.machine_id)),
        Ok(h) if h.exports.len() > MAX_EXPORTS => Err(format!("the peer exports more than {MAX_EXPORTS} modules")),
        other => other,
    };
    let answer = answer.inspect_err(|_| link.close())?;
    let shared = Arc::new(Shared {
        peer: answer.machine_id.clone(),
        link: link.clone(),
        state: Mutex::default(),
        log: opts.log.clone(),
    });
    let mut conns = Vec::new();
    let mut registered = Ok(());
    for (export, e) in answer.exports.into_iter().enumerate() {
        let id = format!("{FED_PREFIX}{}:{}", shared.peer, e.module);
        let manifest: ModuleManifest = match serde_json::from_value(e.manifest) {
            Ok(m) => m,
            Err(err) => {
                log::warn!("not re-exporting {}: its manifest: {err}", e.module);
                continue;
            }
        };
        let conn = match subc::connect(&opts.conn_file, manifest, &id) {
            Ok(c) => c,
            Err(err) => {
                registered = Err(format!("registering {id}: {err}"));
                break;
            }
        };
        let out = conn.outbound();
        let handler = Export { export, out: out.clone(), shared: Arc::clone(&shared), module: e.module.clone() };
        let gate = Arc::clone(&shared);
        let authorizer = move |_: &BindRequest| {
            let st = gate.state.lock();
            if st.dead {
                Err(ErrorBody::new(code::LINK_LOST, format!("the link to peer {} is lost", gate.peer)))
            } else if st.routes.len() >= MAX_ROUTES {
                Err(ErrorBody::new(code::BUSY, format!("{MAX_ROUTES} routes are relayed")))
            } else {
                Ok(())
            }
        };
        match conn.start(handler, authorizer) {
            Ok(running) => {
                log::info!("registered {id}");
                conns.push((out, running));
            }
            Err(err) => {
                registered = Err(format!("starting {id}: {err}"));
                break;
            }
        }
    }
    let result = registered.and_then(|()| {
        log::info!("link to {} up ({} modules re-exported)", shared.peer, conns.len());
        loop {
            match link::read_frame(&mut reader) {
                Ok(Some(f)) => shared.on_link(f)?,
                Ok(None) => return Err("the peer closed the link".into()),
                Err(e) => return Err(format!("reading the link: {e}")),
            }
        }
    });
    shared.lost();
    for (out, _) in &conns {
        out.shutdown();
    }
    for (_, running) in conns {
        running.join();
    }
    link.close();
    log::info!("link to {} down", shared.peer);
    result
}

impl Shared {
    fn link_frame(&self, kind: Kind, rid: u64, corr: u64) {
        if let Some(bytes) = link::encode(kind, rid, corr, &[]) {
            let _ = self.link.send(bytes);
        }
    }

    /// One frame from the serving side; an error ends the link.
    fn on_link(&self, f: link::Frame) -> Result<(), String> {
        match f.kind {
            Kind::Ping => {}
            Kind::Response | Kind::Error | Kind::StreamEnd => self.terminal(f),
            Kind::StreamData => self.data(f),
            Kind::Push => {
                let st = self.state.lock();
                if let Some(r) = st.routes.get(&f.rid) {
                    let _ = r.out.push(r.route, f.corr, f.body);
                }
            }
            Kind::Closed => self.closed(f.rid, &f.body),
            other => return Err(format!("the serving side sent {other:?}")),
        }
        Ok(())
    }

    fn terminal(&self, f: link::Frame) {
        let mut st = self.state.lock();
        if !st.requests.remove(&(f.rid, f.corr)) {
            return;
        }
        let Some(r) = st.routes.get(&f.rid) else { return };
        let sent = match f.kind {
            Kind::Response => r.out.reply(r.route, f.corr, f.body),
            Kind::StreamEnd => r.out.stream_end(r.route, f.corr, f.body),
            // Relayed verbatim when it is an error body at all.
            _ if serde_json::from_slice::<ErrorBody>(&f.body).is_ok() => r.out.error_encoded(r.route, f.corr, f.body),
            _ => {
                let message = format!("the serving side answered {}", String::from_utf8_lossy(&f.body));
                r.out.error(r.route, f.corr, &ErrorBody::new(code::BAD_ERROR, message))
            }
        };
        if let Err(e) = sent {
            log::debug!("cannot answer {} corr {}: {e}", r.route, f.corr);
        }
    }

    fn data(&self, f: link::Frame) {
        let mut st = self.state.lock();
        if !st.requests.contains(&(f.rid, f.corr)) {
            return;
        }
        let Some(r) = st.routes.get(&f.rid) else { return };
        let (out, route) = (r.out.clone(), r.route);
        match out.stream_data(route, f.corr, f.body) {
            Ok(()) | Err(SendError::Closed) => {}
            Err(e) => {
                st.requests.remove(&(f.rid, f.corr));
                let _ = out.error(route, f.corr, &ErrorBody::new(code::STREAM_OVERRUN, e.to_string()));
                self.link_frame(Kind::Cancel, f.rid, f.corr);
            }
        }
    }

    /// The serving side's route is gone: its open requests, then the origin route, end.
    fn closed(&self, rid: u64, body: &[u8]) {
        let why = serde_json::from_slice::<link::Closed>(body)
            .map_or_else(|_| String::from_utf8_lossy(body).into_owned(), |c| format!("{}: {}", c.code, c.message));
        let mut st = self.state.lock();
        let Some(r) = st.routes.remove(&rid) else { return };
        st.by_route.remove(&(r.export, r.route));
        let open: Vec<(u64, u64)> = st.requests.iter().filter(|(id, _)| *id == rid).copied().collect();
        for key in open {
            st.requests.remove(&key);
            let message = format!("peer {} closed the route ({why})", self.peer);
            let _ = r.out.error(r.route, key.1, &ErrorBody::new(code::ROUTE_CLOSED, message));
        }
        let _ = r.out.close_route(r.route);
    }

    /// The link is gone: every open request is answered, every relayed route closed.
    fn lost(&self) {
        let mut st = self.state.lock();
        st.dead = true;
        let message = format!("the link to peer {} is lost", self.peer);
        for (rid, corr) in std::mem::take(&mut st.requests) {
            if let Some(r) = st.routes.get(&rid) {
                let _ = r.out.error(r.route, corr, &ErrorBody::new(code::LINK_LOST, message.clone()));
            }
        }
        for (_, r) in st.routes.drain() {
            let _ = r.out.close_route(r.route);
        }
        st.by_route.clear();
    }
}

/// The handler of one `fed:` module connection.
struct Export {
    export: usize,
    out: Outbound,
    shared: Arc<Shared>,
    module: String,
}

impl Export {
    fn refuse(&self, route: Route, corr: u64, code: &str, message: String) {
        let _ = self.out.error(route, corr, &ErrorBody::new(code, message));
    }
}

impl Handler for Export {
    fn on_route_bound(&mut self, bind: BindRequest) {
        let s = &self.shared;
        let mut st = s.state.lock();
        if st.dead {
            drop(st);
            let _ = self.out.close_route(bind.route);
            return;
        }
        let root = bind
            .legacy_project_root
            .clone()
            .or_else(|| bind.scope.as_ref().and_then(|sc| sc.workdir.clone()))
            .unwrap_or_else(|| "/".into());
        let relayed = link::Bind {
            module: self.module.clone(),
            target: bind.target.clone(),
            harness: bind.identity.harness.clone(),
            session: bind.identity.session.clone(),
            root,
            principal: spell(bind.principal.as_ref()),
            role_versions: bind.role_versions.clone(),
            consumer_capabilities: bind.consumer_capabilities.clone(),
        };
        st.next_rid += 1;
        let rid = st.next_rid;
        st.routes.insert(rid, Relayed { out: self.out.clone(), export: self.export, route: bind.route });
        st.by_route.insert((self.export, bind.route), rid);
        let body = serde_json::to_vec(&relayed).unwrap_or_default();
        if let Some(bytes) = link::encode(Kind::Bind, rid, 0, &body) {
            let _ = s.link.send(bytes);
        }
        drop(st);
        log_line(
            s.log.as_deref(),
            &json!({"side": "origin", "peer": s.peer, "module": relayed.module, "harness": relayed.harness,
                    "session": relayed.session, "principal": relayed.principal, "root": relayed.root}),
        );
    }

    fn on_request(&mut self, route: Route, corr: u64, flags: Flags, body: Vec<u8>) {
        let s = &self.shared;
        let mut st = s.state.lock();
        let Some(&rid) = st.by_route.get(&(self.export, route)) else {
            let message = if st.dead { format!("the link to peer {} is lost", s.peer) } else { "not relayed".into() };
            let code = if st.dead { code::LINK_LOST } else { code::UNKNOWN_ROUTE };
            return self.refuse(route, corr, code, message);
        };
        if st.requests.len() >= MAX_IN_FLIGHT {
            return self.refuse(route, corr, code::BUSY, format!("{MAX_IN_FLIGHT} requests are relayed"));
        }
        let kind = if flags.is_subscription() { Kind::Subscribe } else { Kind::Request };
        let Some(bytes) = link::encode(kind, rid, corr, &body) else {
            return self.refuse(route, corr, "frame_too_large", "the request is over the link's limit".into());
        };
        match s.link.send_counted(bytes) {
            Ok(()) => {
                st.requests.insert((rid, corr));
            }
            Err(Refused::Full) => self.refuse(route, corr, code::BUSY, "the link's queue is full".into()),
            Err(Refused::Closed) => {
                self.refuse(route, corr, code::LINK_LOST, format!("the link to peer {} is lost", s.peer))
            }
        }
    }

    fn on_cancel(&mut self, route: Route, corr: u64) {
        let st = self.shared.state.lock();
        if let Some(&rid) = st.by_route.get(&(self.export, route)) {
            if st.requests.contains(&(rid, corr)) {
                self.shared.link_frame(Kind::Cancel, rid, corr);
            }
        }
    }

    fn on_route_closed(&mut self, route: Route) {
        let mut st = self.shared.state.lock();
        let Some(rid) = st.by_route.remove(&(self.export, route)) else { return };
        st.routes.remove(&rid);
        st.requests.retain(|(r, _)| *r != rid);
        if !st.dead {
            self.shared.link_frame(Kind::Close, rid, 0);
        }
    }

    fn on_control(&mut self, request: ControlRequest) {
        if let ControlRequest::HealthCheck { corr } = request {
            let routes = self.shared.state.lock().routes.len();
            let _ = self.out.health(corr, health_ok(json!({"routes": routes})));
        }
    }

    /// The daemon ended this `fed:` connection: the link session ends too, and re-registers
    /// everything when it is back.
    fn on_shutdown(&mut self) {
        self.shared.link.close();
    }
}
