//! The serving side (`--listen`): exports modules of its own daemon over links.
//!
//! Each accepted link is a session of its own: the origin's `hello`, then this side's `hello`
//! (its machine id and the exported manifests, read from the daemon's `catalog.list` now), then
//! one consumer connection to the daemon for the link's life. A relayed route is opened on that
//! connection when its `bind` arrives; requests that arrive before the daemon answered the open
//! wait (at most [`MAX_QUEUED_PER_ROUTE`] per route), and a refused open answers every request of
//! the route with the daemon's refusal body, verbatim.
//!
//! Invariants:
//! - the bind the daemon sees is stamped here: only exported modules are opened, the root
//!   policy decides first, the identity is the origin's `{harness, session}`, the principal is
//!   this module's own (`consumer_identity`), and the origin travels only as admission facts;
//! - every request relayed to the daemon is in `calls` until its terminal comes back (then it
//!   goes over the link once) or its route ends (then the link gets `fed_route_closed` for it);
//!   a late frame for a forgotten call is dropped;
//! - a route the module or the daemon closes reaches the origin as a `closed` frame, after an
//!   error for each of its open requests;
//! - the session ends when either socket ends; ending it closes both, and the daemon releases
//!   every route of the link with its consumer connection.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::subc::frame;
use parking_lot::Mutex;
use serde_json::{json, Value};
use subc_protocol::error_codes::is_established_route_dead;
use subc_protocol::{ErrorBody, Flags, Frame, FrameType, RouteTarget, FLAG_SUBSCRIPTION};

use super::daemon::{self, control_flags, data_flags};
use super::link::{self, Kind, Refused, Writer};
use super::{
    code, is_machine_id, log_line, write_port_file, Backoff, MAX_IN_FLIGHT, MAX_LINKS, MAX_QUEUED_PER_ROUTE, MAX_ROUTES,
};

/// The longest a new link waits for an exported module to be registered.
const EXPORT_WAIT: Duration = Duration::from_secs(10);
/// The longest a new link may take to say `hello`.
const HELLO_WAIT: Duration = Duration::from_secs(10);

pub struct Options {
    pub conn_file: PathBuf,
    pub port_file: PathBuf,
    pub exports: Vec<String>,
    /// Canonical where they exist.
    pub expose_roots: Vec<PathBuf>,
    pub log: Option<PathBuf>,
    pub module_id: String,
    pub nonce: String,
    pub machine_id: String,
}

/// Waits for the exports, listens, publishes the port, and serves links until the process ends.
pub fn run(opts: Options) {
    let opts = Arc::new(opts);
    let mut backoff = Backoff::new();
    while let Some(missing) =
        opts.exports.iter().find(|m| !matches!(daemon::catalog_entry(&opts.conn_file, m), Ok(Some(_))))
    {
        log::info!("waiting for {missing} to register");
        std::thread::sleep(backoff.next_wait());
    }
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => fatal(format!("cannot listen: {e}")),
    };
    let port = match listener.local_addr() {
        Ok(a) => a.port(),
        Err(e) => fatal(format!("no local address: {e}")),
    };
    if let Err(e) = write_port_file(&opts.port_file, port) {
        fatal(format!("cannot write {}: {e}", opts.port_file.display()));
    }
    log::info!("serving links on 127.0.0.1:{port}, exporting {:?}", opts.exports);
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_LINKS {
            active.fetch_sub(1, Ordering::AcqRel);
            log::warn!("refusing a link: {MAX_LINKS} links are served already");
            continue;
        }
        let (opts, active) = (Arc::clone(&opts), Arc::clone(&active));
        let spawned = std::thread::Builder::new().name("fed-link".into()).spawn(move || {
            if let Err(e) = session(stream, opts) {
                log::warn!("link ended: {e}");
            }
            active.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            log::warn!("cannot serve a link: {e}");
        }
    }
}

fn fatal(message: String) -> ! {
    log::error!("{message}");
    eprintln!("broca-mock fed: {message}");
    std::process::exit(1)
}

/// One relayed route.
enum Phase {
    /// `route.open` sent; requests wait.
    Opening(Vec<Waiting>),
    Open {
        channel: u16,
        epoch: u32,
    },
    /// Every request gets this error body.
    Refused(Vec<u8>),
}

struct Waiting {
    corr: u64,
    subscribe: bool,
    body: Vec<u8>,
}

/// A request relayed to the daemon: its route and its corr on the origin route.
struct Call {
    rid: u64,
    corr: u64,
}

#[derive(Default)]
struct State {
    routes: HashMap<u64, Phase>,
    /// Open routes by the daemon's channel: (epoch, rid).
    by_channel: HashMap<u16, (u32, u64)>,
    /// `route.open`s in flight by their corr: the rid.
    opens: HashMap<u64, u64>,
    /// Relayed requests by their corr on the daemon connection.
    calls: HashMap<u64, Call>,
    by_origin: HashMap<(u64, u64), u64>,
    next_corr: u64,
}

impl State {
    fn corr(&mut self) -> u64 {
        self.next_corr += 1;
        self.next_corr
    }
}

struct Session {
    opts: Arc<Options>,
    /// The origin's machine id.
    peer: String,
    link: Writer,
    daemon: Writer,
    state: Mutex<State>,
}

fn error_json(code: &str, message: String) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody::new(code, message)).unwrap_or_default()
}

fn session(stream: TcpStream, opts: Arc<Options>) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(link::SILENCE)).map_err(|e| e.to_string())?;
    let write_half = stream.try_clone().map_err(|e| e.to_string())?;
    let link =
        Writer::spawn(write_half, "fed-link-w", link::QUEUE_BYTES, Some(link::HEARTBEAT)).map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let ended = |e: String| {
        link.close();
        e
    };
    let until = Instant::now() + HELLO_WAIT;
    let hello: link::Hello = loop {
        match link::read_frame(&mut reader) {
            Ok(Some(f)) if f.kind == Kind::Ping && Instant::now() < until => {}
            Ok(Some(f)) if f.kind == Kind::Hello => {
                break serde_json::from_slice(&f.body).map_err(|e| ended(format!("a bad hello: {e}")))?
            }
            Ok(Some(f)) => return Err(ended(format!("expected hello, got {:?}", f.kind))),
            Ok(None) => return Err(ended("the link closed before hello".into())),
            Err(e) => return Err(ended(format!("reading hello: {e}"))),
        }
    };
    if !is_machine_id(&hello.machine_id) {
        return Err(ended(format!("the peer's machine id {:?} is not hex", hello.machine_id)));
    }
    let mut exports = Vec::new();
    for module in &opts.exports {
        let until = Instant::now() + EXPORT_WAIT;
        let mut backoff = Backoff::new();
        loop {
            match daemon::catalog_entry(&opts.conn_file, module) {
                Ok(Some(entry)) => {
                    exports.push(link::Export { module: module.clone(), manifest: daemon::manifest(&entry) });
                    break;
                }
                other if Instant::now() > until => {
                    log::warn!("not exporting {module} on this link: {other:?}");
                    break;
                }
                _ => std::thread::sleep(backoff.next_wait()),
            }
        }
    }
    let dstream = daemon::dial(&opts.conn_file).map_err(|e| ended(format!("the daemon: {e}")))?;
    let dwrite = dstream.try_clone().map_err(|e| ended(e.to_string()))?;
    let daemon = Writer::spawn(dwrite, "fed-daemon-w", link::QUEUE_BYTES, None).map_err(|e| ended(e.to_string()))?;
    let answer = link::Hello { v: link::VERSION, machine_id: opts.machine_id.clone(), exports };
    let body = serde_json::to_vec(&answer).map_err(|e| ended(e.to_string()))?;
    let _ = link.send(link::encode(Kind::Hello, 0, 0, &body).ok_or_else(|| ended("hello too large".into()))?);
    log::info!("link from {} up", hello.machine_id);
    let s = Arc::new(Session { opts, peer: hello.machine_id, link, daemon, state: Mutex::default() });
    let reading = Arc::clone(&s);
    let daemon_reader = std::thread::Builder::new().name("fed-daemon-r".into()).spawn(move || {
        let mut frames = daemon::Frames::new(dstream);
        loop {
            match frames.next_frame() {
                Ok(Some(f)) => {
                    if !reading.on_daemon(f) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!("the daemon connection: {e}");
                    break;
                }
            }
        }
        reading.end();
    });
    let result = loop {
        match link::read_frame(&mut reader) {
            Ok(Some(f)) => {
                if let Err(e) = s.on_link(f) {
                    break Err(e);
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(format!("reading the link: {e}")),
        }
    };
    s.end();
    if let Ok(t) = daemon_reader {
        let _ = t.join();
    }
    log::info!("link from {} down", s.peer);
    result
}

impl Session {
    fn end(&self) {
        self.link.close();
        self.daemon.close();
    }

    fn link_frame(&self, kind: Kind, rid: u64, corr: u64, body: &[u8]) {
        if let Some(bytes) = link::encode(kind, rid, corr, body) {
            let _ = self.link.send(bytes);
        }
    }

    fn link_error(&self, rid: u64, corr: u64, code: &str, message: String) {
        self.link_frame(Kind::Error, rid, corr, &error_json(code, message));
    }

    fn daemon_frame(&self, ty: FrameType, flags: Flags, channel: u16, epoch: u32, corr: u64, body: &[u8]) {
        if let Ok(bytes) = frame::encode(ty, flags, channel, epoch, corr, body) {
            let _ = self.daemon.send(bytes);
        }
    }

    /// One frame from the origin; an error ends the link.
    fn on_link(&self, f: link::Frame) -> Result<(), String> {
        match f.kind {
            Kind::Ping => {}
            Kind::Bind => self.bind(f.rid, &f.body),
            Kind::Request | Kind::Subscribe => {
                let waiting = Waiting { corr: f.corr, subscribe: f.kind == Kind::Subscribe, body: f.body };
                self.request(f.rid, waiting)
            }
            Kind::Cancel => self.cancel(f.rid, f.corr),
            Kind::Close => self.close(f.rid),
            other => return Err(format!("the origin sent {other:?}")),
        }
        Ok(())
    }

    /// The refusal, if any, the serving side's profile gives a bind before any open.
    fn policy(&self, bind: &link::Bind) -> Option<Vec<u8>> {
        if !self.opts.exports.contains(&bind.module) {
            return Some(error_json(code::NOT_EXPORTED, format!("{} is not exported", bind.module)));
        }
        let root = Path::new(&bind.root);
        let plain = root.is_absolute() && !root.components().any(|c| matches!(c, Component::ParentDir));
        if !plain || !self.opts.expose_roots.iter().any(|prefix| root.starts_with(prefix)) {
            let message = format!("project root {} is not exposed to peer {}", bind.root, self.peer);
            return Some(error_json(code::ROOT_NOT_EXPOSED, message));
        }
        None
    }

    fn bind(&self, rid: u64, body: &[u8]) {
        let bind: link::Bind = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => {
                let closed = link::Closed { code: code::UNKNOWN_ROUTE.into(), message: format!("a bad bind: {e}") };
                return self.link_frame(Kind::Closed, rid, 0, &serde_json::to_vec(&closed).unwrap_or_default());
            }
        };
        let mut st = self.state.lock();
        if st.routes.contains_key(&rid) {
            return log::warn!("ignoring a second bind of route {rid}");
        }
        if st.routes.len() >= MAX_ROUTES {
            drop(st);
            let closed = link::Closed { code: code::BUSY.into(), message: format!("{MAX_ROUTES} routes are relayed") };
            return self.link_frame(Kind::Closed, rid, 0, &serde_json::to_vec(&closed).unwrap_or_default());
        }
        if let Some(refusal) = self.policy(&bind) {
            log::info!(
                "refusing route {rid} ({} {}:{}): {}",
                bind.module,
                bind.harness,
                bind.session,
                String::from_utf8_lossy(&refusal)
            );
            st.routes.insert(rid, Phase::Refused(refusal));
            return;
        }
        let target = match bind.target {
            RouteTarget::ToolProvider { .. } => RouteTarget::ToolProvider { module_id: bind.module.clone() },
            RouteTarget::ManagementSurface { .. } => RouteTarget::ManagementSurface { module_id: bind.module.clone() },
            RouteTarget::InternalService { service_id, .. } => {
                RouteTarget::InternalService { module_id: bind.module.clone(), service_id }
            }
        };
        let mut open = json!({
            "op": "route.open",
            "target": target,
            "identity": {"harness": bind.harness, "session": bind.session, "project_root": bind.root},
            "consumer_identity": {"module_id": self.opts.module_id, "launch_nonce": self.opts.nonce},
            "admission_facts": {"federation": {"peer": self.peer, "principal": bind.principal}},
        });
        if let Some(v) = &bind.role_versions {
            open["role_versions"] = json!(v);
        }
        if let Some(v) = &bind.consumer_capabilities {
            open["consumer_capabilities"] = json!(v);
        }
        let corr = st.corr();
        st.opens.insert(corr, rid);
        st.routes.insert(rid, Phase::Opening(Vec::new()));
        self.daemon_frame(FrameType::Request, control_flags(), 0, 0, corr, open.to_string().as_bytes());
        drop(st);
        log_line(
            self.opts.log.as_deref(),
            &json!({"side": "serve", "peer": self.peer, "module": bind.module, "harness": bind.harness,
                    "session": bind.session, "principal": bind.principal, "root": bind.root}),
        );
    }

    fn request(&self, rid: u64, waiting: Waiting) {
        let mut st = self.state.lock();
        match st.routes.get_mut(&rid) {
            None => self.link_error(rid, waiting.corr, code::UNKNOWN_ROUTE, format!("no relayed route {rid}")),
            Some(Phase::Refused(body)) => self.link_frame(Kind::Error, rid, waiting.corr, body),
            Some(Phase::Opening(queue)) if queue.len() >= MAX_QUEUED_PER_ROUTE => {
                let message = format!("{MAX_QUEUED_PER_ROUTE} requests already wait for the route to open");
                self.link_error(rid, waiting.corr, code::BUSY, message)
            }
            Some(Phase::Opening(queue)) => queue.push(waiting),
            Some(Phase::Open { channel, epoch }) => {
                let (channel, epoch) = (*channel, *epoch);
                self.forward(&mut st, rid, channel, epoch, waiting)
            }
        }
    }

    /// Sends one request on the route's daemon channel and records it.
    fn forward(&self, st: &mut State, rid: u64, channel: u16, epoch: u32, w: Waiting) {
        if st.by_origin.contains_key(&(rid, w.corr)) {
            return log::warn!("ignoring a second request {} on route {rid}", w.corr);
        }
        if st.calls.len() >= MAX_IN_FLIGHT {
            return self.link_error(rid, w.corr, code::BUSY, format!("{MAX_IN_FLIGHT} requests are in flight"));
        }
        let corr = st.corr();
        let flags = if w.subscribe { Flags(data_flags().0 | FLAG_SUBSCRIPTION) } else { data_flags() };
        let bytes = match frame::encode(FrameType::Request, flags, channel, epoch, corr, &w.body) {
            Ok(b) => b,
            Err(e) => return self.link_error(rid, w.corr, "frame_too_large", e.to_string()),
        };
        match self.daemon.send_counted(bytes) {
            Ok(()) => {
                st.calls.insert(corr, Call { rid, corr: w.corr });
                st.by_origin.insert((rid, w.corr), corr);
            }
            Err(Refused::Full) => {
                self.link_error(rid, w.corr, code::BUSY, "the daemon connection's queue is full".into())
            }
            Err(Refused::Closed) => {
                self.link_error(rid, w.corr, code::ROUTE_CLOSED, "the daemon connection is gone".into())
            }
        }
    }

    fn cancel(&self, rid: u64, corr: u64) {
        let mut st = self.state.lock();
        if let Some(&dcorr) = st.by_origin.get(&(rid, corr)) {
            if let Some(Phase::Open { channel, epoch }) = st.routes.get(&rid) {
                self.daemon_frame(FrameType::Cancel, data_flags(), *channel, *epoch, dcorr, &[]);
            }
        } else if let Some(Phase::Opening(queue)) = st.routes.get_mut(&rid) {
            if let Some(at) = queue.iter().position(|w| w.corr == corr) {
                queue.remove(at);
                self.link_error(rid, corr, code::CANCELLED, "cancelled before the route opened".into());
            }
        }
    }

    /// The origin route is gone: close ours and forget its requests.
    fn close(&self, rid: u64) {
        let mut st = self.state.lock();
        let Some(phase) = st.routes.remove(&rid) else { return };
        st.calls.retain(|_, c| c.rid != rid);
        st.by_origin.retain(|(r, _), _| *r != rid);
        if let Phase::Open { channel, epoch } = phase {
            st.by_channel.remove(&channel);
            self.daemon_frame(FrameType::Goodbye, control_flags(), channel, epoch, 0, &[]);
        }
    }

    /// Our route `rid` is gone on the daemon's side: its open requests and then the route itself
    /// end on the origin.
    fn gone(&self, st: &mut State, rid: u64, code: &str, message: String) {
        let Some(phase) = st.routes.remove(&rid) else { return };
        if let Phase::Open { channel, .. } = phase {
            st.by_channel.remove(&channel);
        }
        let calls: Vec<u64> = st.calls.iter().filter(|(_, c)| c.rid == rid).map(|(k, _)| *k).collect();
        for k in calls {
            if let Some(call) = st.calls.remove(&k) {
                st.by_origin.remove(&(rid, call.corr));
                self.link_error(rid, call.corr, code::ROUTE_CLOSED, message.clone());
            }
        }
        let closed = link::Closed { code: code.into(), message };
        self.link_frame(Kind::Closed, rid, 0, &serde_json::to_vec(&closed).unwrap_or_default());
    }

    /// One frame from the daemon; false when the daemon ended the connection.
    fn on_daemon(&self, f: Frame) -> bool {
        let h = f.header;
        if h.channel == 0 {
            match h.ty {
                FrameType::Ping => self.daemon_frame(FrameType::Pong, h.flags, 0, 0, h.corr, &[]),
                FrameType::Response => self.opened(h.corr, &f.body),
                FrameType::Error => self.refused(h.corr, f.body),
                FrameType::Push => self.on_push(&f.body),
                FrameType::Goodbye => return false,
                ty => log::debug!("ignoring a channel-0 {ty:?}"),
            }
            return true;
        }
        let mut st = self.state.lock();
        let Some(&(epoch, rid)) = st.by_channel.get(&h.channel) else { return true };
        if epoch != h.epoch {
            return true;
        }
        match h.ty {
            FrameType::Response | FrameType::StreamEnd | FrameType::Error => {
                let Some(call) = st.calls.remove(&h.corr) else { return true };
                st.by_origin.remove(&(rid, call.corr));
                let kind = match h.ty {
                    FrameType::Response => Kind::Response,
                    FrameType::StreamEnd => Kind::StreamEnd,
                    _ => Kind::Error,
                };
                self.link_frame(kind, rid, call.corr, &f.body);
                if h.ty == FrameType::Error {
                    let code = serde_json::from_slice::<ErrorBody>(&f.body).map(|e| e.code).unwrap_or_default();
                    if h.flags.is_daemon_origin() && is_established_route_dead(h.flags, &code) {
                        self.gone(&mut st, rid, &code, format!("the serving daemon says {code}"));
                    }
                }
            }
            FrameType::StreamData => {
                let Some(call) = st.calls.get(&h.corr) else { return true };
                let acorr = call.corr;
                let sent = link::encode(Kind::StreamData, rid, acorr, &f.body).map(|b| self.link.send_counted(b));
                if !matches!(sent, Some(Ok(()))) {
                    st.calls.remove(&h.corr);
                    st.by_origin.remove(&(rid, acorr));
                    self.daemon_frame(FrameType::Cancel, data_flags(), h.channel, h.epoch, h.corr, &[]);
                    let message = format!("more than {} stream bytes wait for the link", link::QUEUE_BYTES);
                    self.link_error(rid, acorr, code::STREAM_OVERRUN, message);
                }
            }
            FrameType::Push => {
                let acorr = st.calls.get(&h.corr).map_or(0, |c| c.corr);
                self.link_frame(Kind::Push, rid, acorr, &f.body);
            }
            FrameType::Request => {
                let refusal = error_json(
                    broca::subc::consumer::REVERSE_REQUEST_UNHANDLED,
                    "the federation link relays no reverse requests".into(),
                );
                self.daemon_frame(FrameType::Error, data_flags(), h.channel, h.epoch, h.corr, &refusal);
            }
            FrameType::Goodbye => self.gone(&mut st, rid, code::ROUTE_CLOSED, "the module closed the route".into()),
            ty => log::debug!("ignoring {ty:?} on channel {}", h.channel),
        }
        true
    }

    /// The daemon opened the route of `route.open` `corr`.
    fn opened(&self, corr: u64, body: &[u8]) {
        let mut st = self.state.lock();
        let Some(rid) = st.opens.remove(&corr) else { return };
        let answer: Value = serde_json::from_slice(body).unwrap_or_default();
        let channel = answer["route_channel"].as_u64().and_then(|c| u16::try_from(c).ok()).filter(|c| *c != 0);
        let epoch = answer["route_epoch"].as_u64().and_then(|e| u32::try_from(e).ok());
        let (Some(channel), Some(epoch)) = (channel, epoch) else {
            drop(st);
            let message = format!("route.open answered {}", String::from_utf8_lossy(body));
            return self.refused_with(rid, error_json(code::ROUTE_CLOSED, message));
        };
        let queued = match st.routes.get_mut(&rid) {
            Some(phase @ Phase::Opening(_)) => match std::mem::replace(phase, Phase::Open { channel, epoch }) {
                Phase::Opening(q) => q,
                _ => Vec::new(),
            },
            // The origin closed it meanwhile.
            _ => return self.daemon_frame(FrameType::Goodbye, control_flags(), channel, epoch, 0, &[]),
        };
        st.by_channel.insert(channel, (epoch, rid));
        for w in queued {
            self.forward(&mut st, rid, channel, epoch, w);
        }
    }

    /// The daemon refused `route.open` `corr`.
    fn refused(&self, corr: u64, body: Vec<u8>) {
        let rid = self.state.lock().opens.remove(&corr);
        if let Some(rid) = rid {
            log::info!("route {rid} refused: {}", String::from_utf8_lossy(&body));
            self.refused_with(rid, body);
        }
    }

    fn refused_with(&self, rid: u64, body: Vec<u8>) {
        let mut st = self.state.lock();
        let Some(phase) = st.routes.get_mut(&rid) else { return };
        if let Phase::Opening(queue) = std::mem::replace(phase, Phase::Refused(body.clone())) {
            for w in queue {
                self.link_frame(Kind::Error, rid, w.corr, &body);
            }
        }
    }

    fn on_push(&self, body: &[u8]) {
        let push: Value = serde_json::from_slice(body).unwrap_or_default();
        if push["op"] != "route.closed" {
            return;
        }
        let reason = push["reason"].as_str().unwrap_or("unknown").to_owned();
        let channels: Vec<u16> = push["channels"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c.as_u64().and_then(|c| u16::try_from(c).ok())).collect())
            .unwrap_or_default();
        let mut st = self.state.lock();
        for channel in channels {
            if let Some(&(_, rid)) = st.by_channel.get(&channel) {
                self.gone(&mut st, rid, code::ROUTE_CLOSED, format!("the serving daemon closed the route ({reason})"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(roots: &[&str]) -> Session {
        let opts = Options {
            conn_file: PathBuf::new(),
            port_file: PathBuf::new(),
            exports: vec!["broca".into()],
            expose_roots: roots.iter().map(PathBuf::from).collect(),
            log: None,
            module_id: "callosum".into(),
            nonce: "n".into(),
            machine_id: "bb".into(),
        };
        let (a, _b) = loopback();
        let link = Writer::spawn(a.try_clone().unwrap(), "t", 1024, None).unwrap();
        let daemon = Writer::spawn(a, "t", 1024, None).unwrap();
        Session { opts: Arc::new(opts), peer: "aa".into(), link, daemon, state: Mutex::default() }
    }

    fn loopback() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    fn bind(module: &str, root: &str) -> link::Bind {
        link::Bind {
            module: module.into(),
            target: RouteTarget::ManagementSurface { module_id: "fed:bb:broca".into() },
            harness: "h".into(),
            session: "s".into(),
            root: root.into(),
            principal: "direct".into(),
            role_versions: None,
            consumer_capabilities: None,
        }
    }

    fn refusal_code(refusal: Option<Vec<u8>>) -> Option<String> {
        refusal.map(|r| serde_json::from_slice::<ErrorBody>(&r).unwrap().code)
    }

    #[test]
    fn the_profile_exposes_only_exported_modules_under_exposed_roots() {
        let s = session(&["/tmp/rig"]);
        assert_eq!(refusal_code(s.policy(&bind("broca", "/tmp/rig/p"))), None);
        assert_eq!(refusal_code(s.policy(&bind("broca", "/tmp/rig"))), None);
        let not_exposed = Some(code::ROOT_NOT_EXPOSED.to_owned());
        for root in ["/", "/tmp/rigged", "/tmp/rig/../etc", "tmp/rig/p", ""] {
            assert_eq!(refusal_code(s.policy(&bind("broca", root))), not_exposed, "{root}");
        }
        assert_eq!(refusal_code(s.policy(&bind("vault", "/tmp/rig/p"))), Some(code::NOT_EXPORTED.to_owned()));
        let closed = session(&[]);
        assert_eq!(refusal_code(closed.policy(&bind("broca", "/tmp/rig/p"))), not_exposed, "no prefix: no root");
    }
}
