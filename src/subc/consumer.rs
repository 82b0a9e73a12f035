//! The consumer connection (`subc-wire.md` §12.4): a second TCP connection, authenticated with the
//! same connection file, that never says HELLO. Over it broca opens routes to other modules
//! (tool providers, claustrum, fusiform), presenting its consumer identity so targets see broca's
//! reserved principal, and calls them with deadlines.
//!
//! Invariants:
//! - one reader thread owns the read half; writers share the write half under a lock, one
//!   `write` per frame;
//! - a pending call is keyed by `(channel, corr)` of broca's own Request and resolved only by a
//!   terminal frame (Response, Error, StreamEnd) from the module; a **reverse Request** a module
//!   sends toward broca lives in the module's corr space, is answered at once with
//!   `reverse_request_unhandled` and counted, and never resolves a pending call, even when its
//!   corr collides;
//! - when the connection ends, every pending call fails `Closed`.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use parking_lot::Mutex;
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, ErrorBody, Flags, Frame, FrameType, Priority, RouteTarget};

use super::frame::{self, Decoder};
use super::{connection_file, handshake};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);
/// The code and message a consumer answers a reverse request it has no handler for (the same
/// reply the subc Rust consumer SDK sends).
pub const REVERSE_REQUEST_UNHANDLED: &str = "reverse_request_unhandled";

/// Who broca is when it opens routes: its module id and the daemon's launch nonce.
#[derive(Clone, Debug)]
pub struct ConsumerIdentity {
    pub module_id: String,
    pub launch_nonce: String,
}

/// A route broca opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientRoute {
    pub channel: u16,
    pub epoch: u32,
}

#[derive(Debug)]
pub enum CallError {
    /// The module (or the daemon) refused: its error body.
    Module(ErrorBody),
    /// No terminal frame within the deadline; the outcome is unknown.
    Timeout,
    /// The connection ended before an answer.
    Closed,
    Io(io::Error),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Module(body) => write!(f, "{}: {}", body.code, body.message),
            CallError::Timeout => write!(f, "no answer within the deadline"),
            CallError::Closed => write!(f, "the consumer connection closed"),
            CallError::Io(e) => write!(f, "consumer connection: {e}"),
        }
    }
}

impl std::error::Error for CallError {}

type Answer = Result<Vec<u8>, CallError>;

struct Inner {
    writer: Mutex<TcpStream>,
    pending: Mutex<HashMap<(u16, u64), Sender<Answer>>>,
    next_corr: AtomicU64,
    refused: AtomicU64,
    closed: AtomicBool,
    identity: Option<ConsumerIdentity>,
}

/// The consumer connection. Cloneable handles share one socket.
#[derive(Clone)]
pub struct Consumer {
    inner: Arc<Inner>,
}

fn flags() -> Flags {
    Flags::new(false, Priority::Interactive, false)
}

impl Consumer {
    /// Connects and authenticates (no HELLO) and starts the reader thread.
    pub fn connect(conn_file: &Path, identity: Option<ConsumerIdentity>) -> Result<Consumer, CallError> {
        let info = connection_file::read(conn_file).map_err(|e| CallError::Io(io::Error::other(e.to_string())))?;
        let endpoint = &info.endpoints[0];
        let addr = (endpoint.bare_host(), endpoint.port)
            .to_socket_addrs()
            .map_err(CallError::Io)?
            .next()
            .ok_or_else(|| CallError::Io(io::Error::other("the connection file names no address")))?;
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(CallError::Io)?;
        stream.set_nodelay(true).map_err(CallError::Io)?;
        handshake::authenticate(&mut stream, &info, HANDSHAKE_DEADLINE)
            .map_err(|e| CallError::Io(io::Error::other(e.to_string())))?;
        let reader = stream.try_clone().map_err(CallError::Io)?;
        let inner = Arc::new(Inner {
            writer: Mutex::new(stream),
            pending: Mutex::new(HashMap::new()),
            next_corr: AtomicU64::new(1),
            refused: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            identity,
        });
        let reading = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("broca-consumer".into())
            .spawn(move || read_loop(reader, &reading))
            .map_err(CallError::Io)?;
        Ok(Consumer { inner })
    }

    /// Reverse requests answered `reverse_request_unhandled` so far.
    pub fn reverse_requests_refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Opens a route to `target` for `identity`, presenting broca's consumer identity.
    pub fn open_route(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        timeout: Duration,
    ) -> Result<ClientRoute, CallError> {
        let mut body = json!({"op": "route.open", "target": target, "identity": identity});
        if let Some(id) = &self.inner.identity {
            body["consumer_identity"] = json!({"module_id": id.module_id, "launch_nonce": id.launch_nonce});
        }
        let reply = self.request(0, 0, &serde_json::to_vec(&body).expect("route.open serializes"), timeout)?;
        let reply: Value = serde_json::from_slice(&reply).map_err(|e| CallError::Io(io::Error::other(e)))?;
        let channel = reply["route_channel"].as_u64().and_then(|c| u16::try_from(c).ok());
        let epoch = reply["route_epoch"].as_u64().and_then(|e| u32::try_from(e).ok());
        match (channel, epoch) {
            (Some(channel), Some(epoch)) if channel != 0 => Ok(ClientRoute { channel, epoch }),
            _ => Err(CallError::Io(io::Error::other(format!("route.open answered {reply}")))),
        }
    }

    /// One request on `route`; its terminal frame's body, or the refusal.
    pub fn call(&self, route: ClientRoute, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        self.request(route.channel, route.epoch, body, timeout)
    }

    /// Closes a route broca opened (GOODBYE on its channel and epoch).
    pub fn close_route(&self, route: ClientRoute) {
        let bytes = frame::encode(FrameType::Goodbye, flags(), route.channel, route.epoch, 0, &[]).expect("encodes");
        let _ = self.inner.writer.lock().write_all(&bytes);
    }

    fn request(&self, channel: u16, epoch: u32, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(CallError::Closed);
        }
        let corr = self.inner.next_corr.fetch_add(1, Ordering::Relaxed);
        let bytes = frame::encode(FrameType::Request, flags(), channel, epoch, corr, body)
            .map_err(|e| CallError::Io(io::Error::other(e.to_string())))?;
        let (tx, rx) = bounded(1);
        self.inner.pending.lock().insert((channel, corr), tx);
        if let Err(e) = self.inner.writer.lock().write_all(&bytes) {
            self.inner.pending.lock().remove(&(channel, corr));
            return Err(CallError::Io(e));
        }
        match rx.recv_timeout(timeout) {
            Ok(answer) => answer,
            Err(_) => {
                self.inner.pending.lock().remove(&(channel, corr));
                Err(CallError::Timeout)
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.writer.get_mut().shutdown(Shutdown::Both);
    }
}

/// The reader thread: answers, pings and reverse requests until the connection ends.
fn read_loop(mut stream: TcpStream, inner: &Inner) {
    let mut decoder = Decoder::new();
    let mut buf = vec![0u8; 64 << 10];
    'read: loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        decoder.feed(&buf[..n]);
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => {
                    if !on_frame(inner, f) {
                        break 'read;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!(target: "broca::subc", "consumer connection: undecodable frame: {e}");
                    break 'read;
                }
            }
        }
    }
    inner.closed.store(true, Ordering::Release);
    for (_, tx) in inner.pending.lock().drain() {
        let _ = tx.send(Err(CallError::Closed));
    }
}

/// Handles one frame; false when the connection is over.
fn on_frame(inner: &Inner, f: Frame) -> bool {
    let h = f.header;
    match h.ty {
        FrameType::Ping => write(inner, FrameType::Pong, h.flags, h.channel, h.epoch, h.corr, &[]),
        FrameType::Goodbye if h.channel == 0 => return false,
        FrameType::Request if h.channel != 0 => refuse_reverse(inner, &f),
        FrameType::Response | FrameType::StreamEnd => answer(inner, h.channel, h.corr, Ok(f.body)),
        FrameType::Error => {
            let body = serde_json::from_slice::<ErrorBody>(&f.body).unwrap_or_else(|_| {
                ErrorBody::new(
                    crate::wire::RefusalCode::InvalidError.as_str(),
                    String::from_utf8_lossy(&f.body).into_owned(),
                )
            });
            answer(inner, h.channel, h.corr, Err(CallError::Module(body)));
        }
        ty => log::debug!(target: "broca::subc", "consumer connection: ignoring {ty:?} on channel {}", h.channel),
    }
    true
}

fn answer(inner: &Inner, channel: u16, corr: u64, result: Answer) {
    if let Some(tx) = inner.pending.lock().remove(&(channel, corr)) {
        let _ = tx.send(result);
    }
}

/// A module's reverse request: broca fronts no person who could answer one.
fn refuse_reverse(inner: &Inner, f: &Frame) {
    let h = f.header;
    let family = serde_json::from_slice::<Value>(&f.body)
        .ok()
        .and_then(|v| v.get("method").and_then(Value::as_str).map(|m| m.split('/').next().unwrap_or(m).to_owned()))
        .unwrap_or_default();
    let body =
        ErrorBody::new(REVERSE_REQUEST_UNHANDLED, format!("no reverse-request handler is registered for {family}"));
    let bytes = serde_json::to_vec(&body).expect("ErrorBody serializes");
    write(inner, FrameType::Error, flags(), h.channel, h.epoch, h.corr, &bytes);
    inner.refused.fetch_add(1, Ordering::Relaxed);
}

fn write(inner: &Inner, ty: FrameType, flags: Flags, channel: u16, epoch: u32, corr: u64, body: &[u8]) {
    if let Ok(bytes) = frame::encode(ty, flags, channel, epoch, corr, body) {
        let _ = inner.writer.lock().write_all(&bytes);
    }
}
