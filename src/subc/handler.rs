//! What the io thread and the module hand each other: the decoded binds and control requests
//! the daemon relays, the [`Handler`] and [`Authorizer`] the module installs on the io thread,
//! and how the connection ended. Its own module so that `io` and `module` both import it and
//! neither imports the other's spawner (`tests/layers.rs` checks `src/subc` for circles).

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use subc_protocol::call_mode::CallMode;
use subc_protocol::scope::ScopeStamp;
use subc_protocol::{BindIdentity, ErrorBody, Flags, Principal, RouteCloseReason, RouteTarget};

use super::frame::FrameError;
use super::routes::Route;

/// A `route.bind` the daemon relayed, decoded. Only `principal` and `scope` are the daemon's own
/// stamps; everything else is the opener's unverified claim.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BindRequest {
    pub route: Route,
    pub target: RouteTarget,
    pub identity: BindIdentity,
    pub principal: Option<Principal>,
    pub consumer_capabilities: Option<Vec<String>>,
    pub role_versions: Option<BTreeMap<String, String>>,
    pub admission_facts: Option<serde_json::Value>,
    pub scope: Option<ScopeStamp>,
    /// As stamped, or derived from `scope` when the daemon sent none.
    pub call_mode: CallMode,
    /// The legacy `identity.project_root` daemon 0.39 still sends (`subc-wire.md` §22).
    pub legacy_project_root: Option<String>,
}

/// A channel-0 message from the daemon that the module itself must act on.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ControlRequest {
    /// Answer with [`Outbound::health`](super::outbound::Outbound::health) on this corr, within the daemon's deadline (5 s).
    HealthCheck { corr: u64 },
    /// Stop taking new work; finish or seal what is in flight by `deadline_ms` (Unix ms, "no
    /// later than").
    Draining { reason: RouteCloseReason, deadline_ms: u64 },
}

/// The daemon's answer to a control request the module sent with
/// [`Outbound::control_request`](super::Outbound::control_request), by the request's corr.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ControlReply {
    /// A channel-0 Response: the op's answer body (JSON, tagged by `op`).
    Response(Vec<u8>),
    /// A channel-0 Error: an `ErrorBody` (undecodable bytes come as the message).
    Error(ErrorBody),
}

/// What the io thread hands to the module. Every method runs on the io thread and must not block.
pub trait Handler: Send + 'static {
    /// A route was authorized and acknowledged.
    fn on_route_bound(&mut self, _bind: BindRequest) {}
    /// A client request on a bound route. It is open until one terminal frame answers it.
    fn on_request(&mut self, route: Route, corr: u64, flags: Flags, body: Vec<u8>);
    /// The client cancelled an open request. It still needs its one terminal frame.
    fn on_cancel(&mut self, route: Route, corr: u64);
    /// The route is gone (client GOODBYE, replacement, or the module's own close): abandon its
    /// requests. Their terminals, if sent, are dropped.
    fn on_route_closed(&mut self, route: Route);
    /// A control request or command (`health.check`, `module.draining`).
    fn on_control(&mut self, request: ControlRequest);
    /// The answer to a control request this module sent (`scope.sync`, …). By default the
    /// answer is logged and dropped, as for any module that sends none.
    fn on_control_reply(&mut self, corr: u64, reply: ControlReply) {
        log::debug!(target: "broca::subc", "ignoring a channel-0 answer for corr {corr}: {reply:?}");
    }
    /// The connection is ending (daemon GOODBYE, EOF, reset, error or our own shutdown). Called
    /// once; nothing more is delivered after it.
    fn on_shutdown(&mut self);
}

/// Decides a `route.bind` from the daemon-stamped principal and scope. Runs on the io thread:
/// cheap and non-blocking. A refusal's `ErrorBody` reaches the opener as the `route.open` failure.
pub trait Authorizer: Send + 'static {
    fn authorize(&mut self, bind: &BindRequest) -> Result<(), ErrorBody>;
}

impl<F> Authorizer for F
where
    F: FnMut(&BindRequest) -> Result<(), ErrorBody> + Send + 'static,
{
    fn authorize(&mut self, bind: &BindRequest) -> Result<(), ErrorBody> {
        self(bind)
    }
}

/// How the connection ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectionEnd {
    /// The daemon said GOODBYE on channel 0 (a planned stop).
    Goodbye,
    /// The daemon closed the connection without a GOODBYE.
    Eof,
    /// The module asked to stop ([`Outbound::shutdown`](super::outbound::Outbound::shutdown)).
    Stopped,
    /// The TCP connection was reset (or the pipe broke): the daemon died or dropped us.
    Reset(io::Error),
    /// Another socket or poll error.
    Io(io::Error),
    /// The daemon's byte stream stopped being frames.
    Protocol(FrameError),
}

impl ConnectionEnd {
    /// An orderly end: GOODBYE, EOF or our own stop.
    pub fn is_clean(&self) -> bool {
        matches!(self, Self::Goodbye | Self::Eof | Self::Stopped)
    }
}

impl fmt::Display for ConnectionEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Goodbye => write!(f, "subc said goodbye"),
            Self::Eof => write!(f, "subc closed the connection"),
            Self::Stopped => write!(f, "the module stopped"),
            Self::Reset(e) => write!(f, "connection reset: {e}"),
            Self::Io(e) => write!(f, "connection failed: {e}"),
            Self::Protocol(e) => write!(f, "protocol error: {e}"),
        }
    }
}
