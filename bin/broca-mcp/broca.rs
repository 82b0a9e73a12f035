//! The adapter's one connection to broca: a subc consumer connection ([`Consumer`]), opened on
//! the first tool call (never at start-up) and re-dialed by the consumer after a loss, and one
//! route per session it talks to.
//!
//! Invariants:
//! - nothing here decides what broca decides: answers are not cached, and a request is sent a
//!   second time only when the first provably never reached broca (the daemon's pre-send
//!   refusals, or a connection that was already gone when it was handed over); a call that
//!   may have arrived is never repeated;
//! - a session is `{project_root, harness, session}`: the route's bind identity plus the
//!   legacy `identity.project_root` the daemon canonicalizes (`subc-wire.md` §12.1);
//! - at most [`MAX_ROUTES`] session routes are kept; past that the least recently used one is
//!   closed. A route that proves dead is forgotten and the next call opens a fresh one;
//! - with several hosts, a session is served by the host `broca::placement` places it on (the
//!   hosts' own answers decide; remembered for at most [`MAX_PLACED`] sessions). A send a host
//!   refuses `session_moved` (nothing was written) is placed again and sent once more.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use broca::subc::consumer::{CallError, ClientRoute, Consumer, StreamCall};
use parking_lot::Mutex;
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, ErrorBody, RouteTarget};

/// broca's module id in the daemon.
pub const MODULE_ID: &str = "broca";
/// The deadline of one unary call (route open included).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Session routes kept open at once.
pub const MAX_ROUTES: usize = 64;
/// Sessions whose host is remembered; past it the memory is cleared and hosts asked again.
pub const MAX_PLACED: usize = 4096;

/// One session, as broca keys it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionRef {
    pub project_root: String,
    pub harness: String,
    pub session: String,
}

/// Whether a failed request reached broca.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Nothing was delivered: sending it again cannot duplicate it.
    No,
    /// It may have been delivered and acted on.
    Unknown,
}

impl Sent {
    pub fn as_str(self) -> &'static str {
        match self {
            Sent::No => "not_sent",
            Sent::Unknown => "unknown",
        }
    }
}

#[derive(Debug)]
pub enum Failure {
    /// broca (or the daemon, for the session's route) refused: its body, verbatim.
    Refused(ErrorBody),
    /// broca could not be reached or did not answer.
    Transport { message: String, sent: Sent },
}

impl Failure {
    fn transport(e: &CallError, sent: Sent) -> Failure {
        Failure::Transport { message: e.to_string(), sent }
    }
}

struct Routes {
    open: HashMap<SessionRef, (ClientRoute, u64)>,
    clock: u64,
}

pub struct Broca {
    conn_file: Option<PathBuf>,
    consumer: Mutex<Option<Consumer>>,
    routes: Mutex<Routes>,
    /// The module ids of the broca hosts (one: no placement is asked).
    hosts: Vec<String>,
    /// Where each session was placed.
    placed: Mutex<HashMap<SessionRef, String>>,
}

fn target(module_id: &str) -> RouteTarget {
    RouteTarget::ManagementSurface { module_id: module_id.into() }
}

impl Broca {
    /// Connects nothing yet.
    pub fn new(conn_file: Option<PathBuf>) -> Broca {
        Broca {
            conn_file,
            consumer: Mutex::new(None),
            routes: Mutex::new(Routes { open: HashMap::new(), clock: 0 }),
            hosts: vec![MODULE_ID.to_owned()],
            placed: Mutex::new(HashMap::new()),
        }
    }

    /// Places sessions on `hosts` (module ids on this daemon).
    pub fn on_hosts(mut self, hosts: Vec<String>) -> Broca {
        if !hosts.is_empty() {
            self.hosts = hosts;
        }
        self
    }

    /// The host serving `key`: the only one, the remembered one, or the one placement finds.
    fn host(&self, c: &Consumer, key: &SessionRef) -> Result<String, Failure> {
        if let [only] = self.hosts.as_slice() {
            return Ok(only.clone());
        }
        if let Some(host) = self.placed.lock().get(key) {
            return Ok(host.clone());
        }
        let addr = broca::session_key::SessionKey::new(&key.project_root, &key.harness, &key.session).addr();
        let placed = broca::placement::place(&addr, &self.hosts, |host| self.locate(c, key, host))
            .map_err(|e| Failure::Refused(ErrorBody::new(e.code(), e.to_string())))?;
        let mut memory = self.placed.lock();
        if memory.len() >= MAX_PLACED {
            memory.clear();
        }
        memory.insert(key.clone(), placed.host().to_owned());
        Ok(placed.host().to_owned())
    }

    /// `move.locate` on `host`, on a route of its own.
    fn locate(&self, c: &Consumer, key: &SessionRef, host: &str) -> Result<broca::placement::Held, String> {
        let route = self.open_on(c, key, host).map_err(|f| match f {
            Failure::Refused(body) => format!("{}: {}", body.code, body.message),
            Failure::Transport { message, .. } => message,
        })?;
        let body = json!({"method": broca::moves::LOCATE, "params": {}}).to_string();
        let answered = c.call(route, body.as_bytes(), CALL_TIMEOUT);
        c.close_route(route);
        let answer = decode(&answered.map_err(|e| e.to_string())?).map_err(|_| "a malformed answer".to_owned())?;
        broca::placement::Held::from_answer(&answer).ok_or_else(|| format!("an unreadable answer: {answer}"))
    }

    /// Forgets where `key` was placed (a host said it moved away) and its route.
    fn replace(&self, c: &Consumer, key: &SessionRef) {
        self.placed.lock().remove(key);
        let route = self.routes.lock().open.remove(key).map(|(r, _)| r);
        if let Some(route) = route {
            c.close_route(route);
        }
    }

    /// The consumer connection, dialed on first use. A failed first dial is tried again by the
    /// next call; later losses are re-dialed by the consumer itself.
    fn consumer(&self) -> Result<Consumer, Failure> {
        let mut slot = self.consumer.lock();
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let Some(file) = &self.conn_file else {
            return Err(Failure::Transport {
                message: "no subc connection file: start broca-mcp with --subc FILE or set SUBC_CONNECTION_FILE".into(),
                sent: Sent::No,
            });
        };
        let c = Consumer::connect(file, None).map_err(|e| Failure::transport(&e, Sent::No))?;
        log::info!(target: "broca_mcp", "connected to the subc daemon through {}", file.display());
        *slot = Some(c.clone());
        Ok(c)
    }

    fn open(&self, c: &Consumer, key: &SessionRef) -> Result<ClientRoute, Failure> {
        let host = self.host(c, key)?;
        self.open_on(c, key, &host)
    }

    fn open_on(&self, c: &Consumer, key: &SessionRef, host: &str) -> Result<ClientRoute, Failure> {
        let identity = BindIdentity::new(key.harness.clone(), key.session.clone());
        c.open_route_rooted(&target(host), &identity, Some(&key.project_root), CALL_TIMEOUT).map_err(|e| match e {
            CallError::RouteOpen(body) => Failure::Refused(body),
            other => Failure::transport(&other, Sent::No),
        })
    }

    /// The session's route, opened on a miss.
    fn route(&self, c: &Consumer, key: &SessionRef) -> Result<ClientRoute, Failure> {
        {
            let mut routes = self.routes.lock();
            routes.clock += 1;
            let now = routes.clock;
            if let Some((route, used)) = routes.open.get_mut(key) {
                *used = now;
                return Ok(*route);
            }
        }
        let route = self.open(c, key)?;
        let (raced, evicted) = {
            let mut routes = self.routes.lock();
            let now = routes.clock;
            if let Some((existing, _)) = routes.open.get(key) {
                (Some(*existing), None)
            } else {
                let evicted = if routes.open.len() >= MAX_ROUTES {
                    let oldest = routes.open.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
                    oldest.and_then(|k| routes.open.remove(&k)).map(|(r, _)| r)
                } else {
                    None
                };
                routes.open.insert(key.clone(), (route, now));
                (None, evicted)
            }
        };
        if let Some(evicted) = evicted {
            c.close_route(evicted);
        }
        match raced {
            Some(existing) => {
                c.close_route(route);
                Ok(existing)
            }
            None => Ok(route),
        }
    }

    fn forget(&self, c: &Consumer, key: &SessionRef, route: ClientRoute) {
        let mut routes = self.routes.lock();
        if routes.open.get(key).is_some_and(|(r, _)| *r == route) {
            routes.open.remove(key);
        }
        drop(routes);
        c.close_route(route);
    }

    /// Routes of an ended connection are never valid again.
    fn forget_all(&self) {
        self.routes.lock().open.clear();
    }

    /// One broca op on the session's route: `{"method", "params"}` in, the answer's `result` out.
    pub fn call(&self, key: &SessionRef, method: &str, params: Value) -> Result<Value, Failure> {
        let body = json!({"method": method, "params": params}).to_string().into_bytes();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let again = attempt == 1;
            let c = self.consumer()?;
            let route = self.route(&c, key)?;
            let call = match c.start(route, &body) {
                Ok(call) => call,
                // The connection had ended before the request was queued: nothing went out.
                Err(CallError::Closed) if again => {
                    self.forget_all();
                    continue;
                }
                Err(e) => return Err(Failure::transport(&e, Sent::No)),
            };
            return match call.wait(CALL_TIMEOUT) {
                Ok(bytes) => decode(&bytes),
                // Refused before anything was written: the session lives on another host now.
                Err(CallError::Module(body)) if body.code == "session_moved" && again && self.hosts.len() > 1 => {
                    self.replace(&c, key);
                    continue;
                }
                Err(CallError::Module(body)) => Err(Failure::Refused(body)),
                // The daemon proved the module never received it (a stale route): a new route.
                Err(CallError::NotDelivered(body)) => {
                    self.forget(&c, key, route);
                    if again {
                        log::debug!(target: "broca_mcp", "{method}: not delivered ({}); on a new route", body.code);
                        continue;
                    }
                    Err(Failure::Transport {
                        message: format!("not delivered: {}: {}", body.code, body.message),
                        sent: Sent::No,
                    })
                }
                Err(e @ CallError::Closed) => {
                    self.forget_all();
                    Err(Failure::transport(&e, Sent::Unknown))
                }
                Err(e) => {
                    self.forget(&c, key, route);
                    Err(Failure::transport(&e, Sent::Unknown))
                }
            };
        }
    }

    /// A `session.subscribe` stream on a route of its own (subscriptions are never multiplexed
    /// with other ops, spec §9). The route closes when the [`Subscription`] drops.
    pub fn subscribe(&self, key: &SessionRef, params: Value, capacity: usize) -> Result<Subscription, Failure> {
        let c = self.consumer()?;
        let route = self.open(&c, key)?;
        let body = json!({"method": "session.subscribe", "params": params}).to_string().into_bytes();
        match c.subscribe(route, &body, capacity) {
            Ok(stream) => Ok(Subscription { consumer: c, route, stream: Some(stream) }),
            Err(e) => {
                c.close_route(route);
                Err(Failure::transport(&e, Sent::No))
            }
        }
    }
}

/// An answer body: `{"result": …}`.
fn decode(bytes: &[u8]) -> Result<Value, Failure> {
    let malformed = |why: &str| Failure::Transport {
        message: format!(
            "broca's answer is malformed ({why}): {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ),
        sent: Sent::Unknown,
    };
    let mut v: Value = serde_json::from_slice(bytes).map_err(|_| malformed("not JSON"))?;
    match v.get_mut("result") {
        Some(result) => Ok(result.take()),
        None => Err(malformed("no result")),
    }
}

/// A live `session.subscribe` stream and its route.
pub struct Subscription {
    consumer: Consumer,
    route: ClientRoute,
    stream: Option<StreamCall>,
}

impl Subscription {
    pub fn stream(&mut self) -> Option<&mut StreamCall> {
        self.stream.as_mut()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The CANCEL (from the stream's drop) goes out before the route's GOODBYE.
        self.stream.take();
        self.consumer.close_route(self.route);
    }
}
