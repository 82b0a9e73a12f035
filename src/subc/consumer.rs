//! The consumer connection (`subc-wire.md` §12.4): a second TCP connection, authenticated with the
//! same connection file, that never says HELLO. Over it broca opens routes to other modules
//! (tool providers, claustrum, fusiform), presenting its consumer identity so targets see broca's
//! reserved principal, and calls them with deadlines.
//!
//! Shape: [`Consumer`] (cloneable) holds the current `Link` (`consumer/link.rs`), one per TCP
//! connection, and dials a new one after the old one ended. Each link has a reader thread
//! (`consumer/reader.rs`), a writer thread fed by two bounded lanes (`consumer/writer.rs`), its
//! open calls, and its [`routes::RouteCache`].
//!
//! Invariants:
//! - **no lock is held while the socket is written**: only the writer thread writes, one whole
//!   frame per `write_all`; callers enqueue on the bounded data lane and get
//!   [`CallError::Backpressure`] when it is full; the reader enqueues PONGs and reverse-request
//!   refusals on the control lane with `try_send`, which the writer always serves first, so a
//!   large queued write never holds up a PONG by more than the frame being written;
//! - **routes are cached per (target, bind identity)**, at most [`ConsumerOptions::route_capacity`]
//!   of them (default [`ROUTE_CACHE_CAPACITY`]): past the bound the least recently used idle
//!   route is evicted with a GOODBYE, routes idle past [`ConsumerOptions::route_idle_ttl`]
//!   (default [`ROUTE_IDLE_TTL`]) get their GOODBYE, and a route the module or the daemon closes,
//!   or that a call proves dead, leaves the cache; the next call opens a fresh one. A route with
//!   a call in flight is never evicted. So broca holds a bounded number of routes and never
//!   exhausts the daemon's u16 channel space however many targets and sessions it calls;
//! - **a call is at most once**: nothing here ever sends a Request twice. A `route.open`
//!   refused with a retryable code is retried once; a call is not;
//! - a call resolves only by its own terminal frame on the route it went out on; a **reverse
//!   Request** a module sends toward broca is answered `reverse_request_unhandled` at once,
//!   counted, and never resolves a call, even when its corr collides;
//! - when the connection ends, every open call fails [`CallError::Closed`] and its routes are
//!   gone with it; a route from an ended connection is never sent on another one. The next call
//!   dials again, at most once per backoff step (from [`RECONNECT_BACKOFF_MIN`] doubling to
//!   [`RECONNECT_BACKOFF_MAX`]); calls in between fail `Closed` at once instead of spinning.
//!
//! Not here yet: the per-route credit window. The `route.open` reply names no window (it follows
//! from the target's declared `concurrency`, which only the catalog reports), so calls beyond
//! it wait inside the daemon, which stops reading this connection meanwhile.

mod link;
mod reader;
pub mod routes;
mod wire;
mod writer;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use subc_protocol::{BindIdentity, ErrorBody, RouteTarget};

pub use link::{PendingCall, StreamCall, StreamEvent, MAX_CONCURRENT_ROUTE_OPENS, MAX_PENDING_CALLS};
pub use writer::{CONTROL_LANE_FRAMES, OUTBOUND_QUEUE_BYTES, OUTBOUND_QUEUE_FRAMES};

use self::link::Link;
use super::frame::TooLarge;

/// The code and message a consumer answers a reverse request it has no handler for (the same
/// reply the subc Rust consumer SDK sends).
pub const REVERSE_REQUEST_UNHANDLED: &str = "reverse_request_unhandled";
pub use crate::limits::ROUTE_CACHE_CAPACITY;
/// How long an unused route stays open by default.
pub const ROUTE_IDLE_TTL: Duration = Duration::from_secs(120);
/// The first wait before dialing again after a failed dial.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between dials.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Who broca is when it opens routes: its module id and the daemon's launch nonce.
#[derive(Clone, Debug, Serialize)]
pub struct ConsumerIdentity {
    pub module_id: String,
    pub launch_nonce: String,
}

/// A route broca opened, in its connection's numbering. Only valid on the connection that
/// opened it: after a reconnect it is refused with [`CallError::Closed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientRoute {
    pub channel: u16,
    pub epoch: u32,
    /// The link (connection) the route belongs to.
    generation: u64,
}

/// Tunables; [`Default`] gives the named defaults.
#[derive(Clone, Debug)]
pub struct ConsumerOptions {
    /// Cached routes per connection.
    pub route_capacity: usize,
    /// An unused cached route is closed after this long.
    pub route_idle_ttl: Duration,
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> ConsumerOptions {
        ConsumerOptions {
            route_capacity: ROUTE_CACHE_CAPACITY,
            route_idle_ttl: ROUTE_IDLE_TTL,
            reconnect_backoff_min: RECONNECT_BACKOFF_MIN,
            reconnect_backoff_max: RECONNECT_BACKOFF_MAX,
        }
    }
}

#[derive(Debug)]
#[non_exhaustive]
pub enum CallError {
    /// The module (or the daemon) refused the call: its error body. The module may have acted.
    Module(ErrorBody),
    /// The route could not be opened (the daemon's or the target's refusal); nothing was sent.
    RouteOpen(ErrorBody),
    /// The daemon refused the request before forwarding it (`unknown_channel`,
    /// `stale_route_epoch`, `module_reloading`): the module never received it. The route was
    /// dropped from the cache; the next call opens a new one.
    NotDelivered(ErrorBody),
    /// The route closed (module GOODBYE or the daemon's `route.closed`) with the call open; the
    /// outcome is unknown.
    RouteClosed,
    /// No terminal frame within the deadline; the outcome is unknown.
    Timeout,
    /// The route did not open within the deadline; nothing was sent on it.
    OpenTimeout,
    /// The connection ended (or is being re-dialed) before an answer.
    Closed,
    /// The outbound queue is full; nothing was sent.
    Backpressure {
        queued_frames: usize,
        queued_bytes: usize,
    },
    /// [`MAX_PENDING_CALLS`] calls are already open; nothing was sent.
    TooManyCalls {
        limit: usize,
    },
    /// Every cached route has a call in flight; nothing was sent.
    RouteCacheFull {
        capacity: usize,
    },
    /// The request body exceeds the frame limit; nothing was sent.
    TooLarge(TooLarge),
    /// A stream call's reader left `capacity` frames unread; the stream was ended (and the
    /// module asked to stop). Frames after the last one read are lost.
    StreamOverrun {
        capacity: usize,
    },
    /// A control reply did not have its documented shape.
    BadReply(String),
    /// The connection could not be made (connection file, handshake).
    Connect(String),
    Io(io::Error),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Module(body) => write!(f, "{}: {}", body.code, body.message),
            CallError::RouteOpen(body) => write!(f, "route.open refused: {}: {}", body.code, body.message),
            CallError::NotDelivered(body) => write!(f, "not delivered: {}: {}", body.code, body.message),
            CallError::RouteClosed => write!(f, "the route closed before an answer"),
            CallError::Timeout => write!(f, "no answer within the deadline"),
            CallError::OpenTimeout => write!(f, "the route did not open within the deadline"),
            CallError::Closed => write!(f, "the consumer connection closed"),
            CallError::Backpressure { queued_frames, queued_bytes } => write!(
                f,
                "the outbound queue is full ({queued_frames} frames, {queued_bytes} bytes; limits \
                 {OUTBOUND_QUEUE_FRAMES} frames, {OUTBOUND_QUEUE_BYTES} bytes)"
            ),
            CallError::TooManyCalls { limit } => write!(f, "{limit} calls are already open"),
            CallError::RouteCacheFull { capacity } => write!(f, "all {capacity} cached routes have calls in flight"),
            CallError::TooLarge(e) => write!(f, "request: {e}"),
            CallError::StreamOverrun { capacity } => {
                write!(f, "the stream's {capacity} buffered frames were not read in time")
            }
            CallError::BadReply(e) => write!(f, "malformed control reply: {e}"),
            CallError::Connect(e) => write!(f, "cannot connect: {e}"),
            CallError::Io(e) => write!(f, "consumer connection: {e}"),
        }
    }
}

impl std::error::Error for CallError {}

/// Counters over the consumer's life (every connection it made).
#[derive(Debug, Default)]
struct Totals {
    route_opens: AtomicU64,
    goodbyes_sent: AtomicU64,
    routes_invalidated: AtomicU64,
    reverse_requests_refused: AtomicU64,
    pongs: AtomicU64,
    control_frames_dropped: AtomicU64,
    connects: AtomicU64,
}

/// A snapshot of [`Consumer::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConsumerStats {
    /// `route.open` requests sent.
    pub route_opens: u64,
    /// Route GOODBYEs sent (evictions, idle expiry, closes).
    pub goodbyes_sent: u64,
    /// Cached routes dropped because the module or the daemon closed them, or a call found them dead.
    pub routes_invalidated: u64,
    pub reverse_requests_refused: u64,
    pub pongs: u64,
    /// Control frames (PONG, refusal, GOODBYE) lost to a full control lane.
    pub control_frames_dropped: u64,
    /// Successful dials, the first included.
    pub connects: u64,
    /// Routes cached on the current connection.
    pub routes_cached: usize,
    /// Calls open on the current connection.
    pub pending_calls: usize,
    /// Data frames waiting for the writer.
    pub queued_frames: usize,
    pub connected: bool,
}

struct Dial {
    next_attempt: Instant,
    backoff: Duration,
}

struct Inner {
    conn_file: PathBuf,
    identity: Option<ConsumerIdentity>,
    options: ConsumerOptions,
    totals: Arc<Totals>,
    link: Mutex<Option<Arc<Link>>>,
    /// Held while dialing, so one caller dials and the others wait for its result.
    dial: Mutex<Dial>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(link) = self.link.get_mut().take() {
            link.end();
        }
    }
}

/// Dials a new link and starts its reader: the one place that knows both halves.
fn connect(
    conn_file: &Path,
    identity: Option<ConsumerIdentity>,
    options: &ConsumerOptions,
    totals: Arc<Totals>,
) -> Result<Arc<Link>, CallError> {
    let (link, read_half) = Link::connect(conn_file, identity, options, totals)?;
    reader::start(read_half, &link)?;
    Ok(link)
}

/// The consumer connection. Cloneable handles share one connection (and its route cache).
#[derive(Clone)]
pub struct Consumer {
    inner: Arc<Inner>,
}

impl Consumer {
    /// Connects and authenticates (no HELLO) with the default [`ConsumerOptions`].
    /// The principal targets see on this consumer's routes (`reserved:<module id>`), when it
    /// presents a consumer identity.
    pub fn principal(&self) -> Option<String> {
        self.inner.identity.as_ref().map(|i| format!("{}{}", crate::owner::RESERVED_PREFIX, i.module_id))
    }

    pub fn connect(conn_file: &Path, identity: Option<ConsumerIdentity>) -> Result<Consumer, CallError> {
        Consumer::connect_with(conn_file, identity, ConsumerOptions::default())
    }

    /// Connects and authenticates (no HELLO). The first dial must succeed; later ones happen
    /// on demand after the connection ends.
    pub fn connect_with(
        conn_file: &Path,
        identity: Option<ConsumerIdentity>,
        options: ConsumerOptions,
    ) -> Result<Consumer, CallError> {
        let totals = Arc::new(Totals::default());
        let link = connect(conn_file, identity.clone(), &options, Arc::clone(&totals))?;
        totals.connects.fetch_add(1, Ordering::Relaxed);
        let backoff = options.reconnect_backoff_min;
        let inner = Inner {
            conn_file: conn_file.to_owned(),
            identity,
            options,
            totals,
            link: Mutex::new(Some(link)),
            dial: Mutex::new(Dial { next_attempt: Instant::now(), backoff }),
        };
        Ok(Consumer { inner: Arc::new(inner) })
    }

    /// The live link, dialing a new one if the last one ended and the backoff allows.
    fn link(&self) -> Result<Arc<Link>, CallError> {
        let live = |slot: &Option<Arc<Link>>| slot.as_ref().filter(|l| l.is_live()).cloned();
        if let Some(link) = live(&self.inner.link.lock()) {
            return Ok(link);
        }
        let mut dial = self.inner.dial.lock();
        if let Some(link) = live(&self.inner.link.lock()) {
            return Ok(link);
        }
        let now = Instant::now();
        if now < dial.next_attempt {
            return Err(CallError::Closed);
        }
        let options = &self.inner.options;
        match connect(&self.inner.conn_file, self.inner.identity.clone(), options, Arc::clone(&self.inner.totals)) {
            Ok(link) => {
                self.inner.totals.connects.fetch_add(1, Ordering::Relaxed);
                dial.backoff = options.reconnect_backoff_min;
                log::info!(target: "broca::subc", "consumer connection re-established");
                *self.inner.link.lock() = Some(Arc::clone(&link));
                Ok(link)
            }
            Err(e) => {
                log::warn!(target: "broca::subc", "consumer connection: dial failed (next in {:?}): {e}", dial.backoff);
                dial.next_attempt = now + dial.backoff;
                dial.backoff = (dial.backoff * 2).min(options.reconnect_backoff_max);
                Err(e)
            }
        }
    }

    /// The cached route to `target` for `identity`, opened (and cached) on a miss.
    ///
    /// The route may be evicted once this returns; [`Consumer::call_on`] holds it for the call.
    pub fn route_for(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        timeout: Duration,
    ) -> Result<ClientRoute, CallError> {
        let link = self.link()?;
        let route = link.lease(target, identity, Instant::now() + timeout)?;
        link.release(route);
        Ok(route)
    }

    /// Sends one Request to `target` for `identity` on its cached route (opening it on a miss)
    /// and returns the call in flight. The call holds the route until it resolves.
    pub fn start_on(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        body: &[u8],
        timeout: Duration,
    ) -> Result<PendingCall, CallError> {
        let link = self.link()?;
        let route = link.lease(target, identity, Instant::now() + timeout)?;
        link.start(route, true, body)
    }

    /// [`Consumer::start_on`] on the cached route whose bind declares `capabilities` (a route to
    /// the same target declaring nothing is another route).
    pub fn start_on_declaring(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        capabilities: &'static [&'static str],
        body: &[u8],
        timeout: Duration,
    ) -> Result<PendingCall, CallError> {
        let link = self.link()?;
        let route = link.lease_declaring(target, identity, capabilities, Instant::now() + timeout)?;
        link.start(route, true, body)
    }

    /// One call to `target` for `identity` within `timeout` (route open included). Sent at most
    /// once; see [`CallError`] for what each failure says about delivery.
    pub fn call_on(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let deadline = Instant::now() + timeout;
        let call = self.start_on(target, identity, body, timeout)?;
        call.wait_until(deadline)
    }

    /// Opens an uncached route the caller owns and closes with [`Consumer::close_route`].
    pub fn open_route(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        timeout: Duration,
    ) -> Result<ClientRoute, CallError> {
        self.link()?.open_route(target, identity, Instant::now() + timeout)
    }

    /// [`Consumer::open_route`] with a project root on the bind: the legacy opener field
    /// `identity.project_root` (`subc-wire.md` §12.1), which the daemon canonicalizes and binds
    /// the target with. `None` opens exactly what [`Consumer::open_route`] opens.
    pub fn open_route_rooted(
        &self,
        target: &RouteTarget,
        identity: &BindIdentity,
        project_root: Option<&str>,
        timeout: Duration,
    ) -> Result<ClientRoute, CallError> {
        self.link()?.open_route_rooted(target, identity, project_root, Instant::now() + timeout)
    }

    /// Sends one subscription Request (the SUBSCRIPTION flag; `subc-wire.md` §13) on `route`,
    /// which should be a route of its own ([`Consumer::open_route`]): its StreamData bodies
    /// are buffered, at most `capacity` of them, and read with [`StreamCall::next_until`].
    pub fn subscribe(&self, route: ClientRoute, body: &[u8], capacity: usize) -> Result<StreamCall, CallError> {
        self.link()?.start_stream(route, body, capacity)
    }

    /// Sends one Request on `route`.
    pub fn start(&self, route: ClientRoute, body: &[u8]) -> Result<PendingCall, CallError> {
        self.link()?.start(route, false, body)
    }

    /// One request on `route`; its terminal frame's body, or the refusal.
    pub fn call(&self, route: ClientRoute, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        self.start(route, body)?.wait(timeout)
    }

    /// One control request to the daemon on channel 0 (`catalog.list`, …): its answer body.
    pub fn control(&self, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        let link = self.link()?;
        link.start(link.route(0, 0), false, body)?.wait(timeout)
    }

    /// Asks the module to cancel the call `corr` on `route` (a CANCEL frame). The call still
    /// ends with its one terminal frame.
    pub fn cancel(&self, route: ClientRoute, corr: u64) -> Result<(), CallError> {
        self.current().ok_or(CallError::Closed)?.cancel(route, corr)
    }

    /// Closes `route` (GOODBYE on its channel and epoch) and forgets it if it was cached. Calls
    /// still queued on it fail `NotDelivered`.
    pub fn close_route(&self, route: ClientRoute) {
        if let Some(link) = self.current() {
            link.close_route(route);
        }
    }

    fn current(&self) -> Option<Arc<Link>> {
        self.inner.link.lock().clone()
    }

    /// Reverse requests answered `reverse_request_unhandled` so far.
    pub fn reverse_requests_refused(&self) -> u64 {
        self.inner.totals.reverse_requests_refused.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> ConsumerStats {
        let t = &self.inner.totals;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let link = self.current();
        let live = link.as_ref().filter(|l| l.is_live());
        ConsumerStats {
            route_opens: load(&t.route_opens),
            goodbyes_sent: load(&t.goodbyes_sent),
            routes_invalidated: load(&t.routes_invalidated),
            reverse_requests_refused: load(&t.reverse_requests_refused),
            pongs: load(&t.pongs),
            control_frames_dropped: load(&t.control_frames_dropped),
            connects: load(&t.connects),
            routes_cached: live.map_or(0, |l| l.routes.lock().len()),
            pending_calls: live.map_or(0, |l| l.pending_calls()),
            queued_frames: live.map_or(0, |l| l.lanes.queued_frames()),
            connected: live.is_some(),
        }
    }
}
