//! [`Link`]: one authenticated consumer connection — its lanes, its open calls and its routes.
//!
//! A `Link` lives as long as its TCP connection. Routes are numbered per connection, so the
//! route cache belongs here and ends with the link; [`super::Consumer`] replaces a dead link
//! with a new one.
//!
//! Invariants:
//! - at most [`MAX_PENDING_CALLS`] calls are open; each is keyed by its corr (unique on the
//!   link), remembers the route it was sent on, and is resolved once: by its terminal frame on
//!   that same `(channel, epoch)`, by its route closing, by the connection ending, or by its
//!   caller giving up. Whoever removes it from `pending` ends its route lease;
//! - locks are taken one at a time (`pending` or `routes`, never both), and never across a
//!   blocking call: enqueueing is `try_send`, waiting for an answer happens with no lock held;
//! - every route a link opens is either cached, handed to a caller of [`Link::open_route`]
//!   (who closes it), or sent its GOODBYE;
//! - at most [`MAX_CONCURRENT_ROUTE_OPENS`] `route.open`s are in flight, the daemon's own limit
//!   per connection (past it the daemon refuses `target_unavailable`); further openers wait for
//!   a slot within their deadline;
//! - a **stream call** ([`Link::start_stream`], a Request with the SUBSCRIPTION flag) is an open
//!   call like any other plus an entry in `streams`, so there are never more streams than
//!   [`MAX_PENDING_CALLS`]. The reader hands each StreamData body to the caller's bounded
//!   buffer with `try_send`; a full buffer ends the call [`CallError::StreamOverrun`] and sends
//!   the module a CANCEL, so a slow caller never stalls the reader.

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TrySendError};
use parking_lot::{Condvar, Mutex};
use subc_protocol::error_codes::is_retryable_route_open;
use subc_protocol::{BindIdentity, Flags, FrameType, Priority, RouteTarget, FLAG_SUBSCRIPTION};

use super::routes::{Insert, RouteCache, RouteKey};
use super::wire::{RouteOpen, RouteOpened};
use super::writer::{self, Lanes};
use super::{CallError, ClientRoute, ConsumerIdentity, ConsumerOptions, Totals};
use crate::subc::{connection_file, frame, handshake};

pub use crate::limits::MAX_PENDING_CALLS;
/// `route.open`s in flight on one connection: subc-daemon 0.39.3's
/// `MAX_PENDING_ROUTE_OPENS_PER_CONNECTION`.
pub const MAX_CONCURRENT_ROUTE_OPENS: usize = 8;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);
/// The pause before the one retry of a `route.open` refused with a retryable code.
const ROUTE_OPEN_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Every link gets its own number, so a route from an ended connection is never sent on another.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

pub(super) type Answer = Result<Vec<u8>, CallError>;

pub(super) struct Pending {
    pub route: ClientRoute,
    /// Whether this call holds a lease on a cached route.
    leased: bool,
    pub tx: Sender<Answer>,
}

/// One stream call's data buffer: the route it went out on, its sender and its capacity.
type StreamSlot = (ClientRoute, Sender<Vec<u8>>, usize);

pub(super) struct Link {
    pub generation: u64,
    pub lanes: Lanes,
    pending: Mutex<HashMap<u64, Pending>>,
    pub routes: Mutex<RouteCache>,
    /// The open stream calls' data buffers, by corr: the route each went out on, its sender
    /// and its capacity.
    streams: Mutex<HashMap<u64, StreamSlot>>,
    next_corr: AtomicU64,
    identity: Option<ConsumerIdentity>,
    pub totals: Arc<Totals>,
    /// `route.open`s in flight, and the signal that one ended.
    opening: Mutex<usize>,
    open_ended: Condvar,
}

pub(super) fn data_flags() -> Flags {
    Flags::new(false, Priority::Interactive, false)
}

pub(super) fn control_flags() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

impl Link {
    /// Connects, authenticates (no HELLO) and starts the writer thread. Returns the link and
    /// the connection's read half, for the caller to start its reader on (`reader::start`):
    /// the reader acts on the link, so the link does not know the reader.
    pub fn connect(
        conn_file: &Path,
        identity: Option<ConsumerIdentity>,
        options: &ConsumerOptions,
        totals: Arc<Totals>,
    ) -> Result<(Arc<Link>, TcpStream), CallError> {
        let info = connection_file::read(conn_file).map_err(|e| CallError::Connect(e.to_string()))?;
        let endpoint =
            info.endpoints.first().ok_or_else(|| CallError::Connect("the connection file names no endpoint".into()))?;
        let addr = (endpoint.bare_host(), endpoint.port)
            .to_socket_addrs()
            .map_err(CallError::Io)?
            .next()
            .ok_or_else(|| CallError::Connect("the connection file names no address".into()))?;
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(CallError::Io)?;
        stream.set_nodelay(true).map_err(CallError::Io)?;
        handshake::authenticate(&mut stream, &info, HANDSHAKE_DEADLINE)
            .map_err(|e| CallError::Connect(e.to_string()))?;
        let read_half = stream.try_clone().map_err(CallError::Io)?;
        let lanes = writer::start(stream).map_err(CallError::Io)?;
        let link = Arc::new(Link {
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            lanes,
            pending: Mutex::new(HashMap::new()),
            routes: Mutex::new(RouteCache::new(options.route_capacity, options.route_idle_ttl)),
            streams: Mutex::new(HashMap::new()),
            next_corr: AtomicU64::new(1),
            identity,
            totals,
            opening: Mutex::new(0),
            open_ended: Condvar::new(),
        });
        Ok((link, read_half))
    }

    pub fn is_live(&self) -> bool {
        !self.lanes.wire.is_closed()
    }

    pub fn route(&self, channel: u16, epoch: u32) -> ClientRoute {
        ClientRoute { channel, epoch, generation: self.generation }
    }

    pub fn pending_calls(&self) -> usize {
        self.pending.lock().len()
    }

    /// Sends one Request on `route`; `leased` says whether the caller already holds a lease on
    /// it (which the call then owns). Without one, a cached route is leased here.
    pub fn start(self: &Arc<Self>, route: ClientRoute, leased: bool, body: &[u8]) -> Result<PendingCall, CallError> {
        self.start_with(route, leased, body, None)
    }

    /// Sends one subscription Request on `route` (not leased: a stream belongs on a route of its
    /// own); its StreamData bodies are buffered, at most `capacity` of them, until read.
    pub fn start_stream(
        self: &Arc<Self>,
        route: ClientRoute,
        body: &[u8],
        capacity: usize,
    ) -> Result<StreamCall, CallError> {
        let capacity = capacity.max(1);
        let (tx, data) = bounded(capacity);
        let call = self.start_with(route, false, body, Some((tx, capacity)))?;
        Ok(StreamCall { call: Some(call), data, end: None })
    }

    fn start_with(
        self: &Arc<Self>,
        route: ClientRoute,
        leased: bool,
        body: &[u8],
        stream: Option<(Sender<Vec<u8>>, usize)>,
    ) -> Result<PendingCall, CallError> {
        let leased = leased || self.routes.lock().lease_route(route, Instant::now());
        let release = |link: &Link| {
            if leased {
                link.routes.lock().release(route, Instant::now());
            }
        };
        if route.generation != self.generation || !self.is_live() {
            release(self);
            return Err(CallError::Closed);
        }
        let corr = self.next_corr.fetch_add(1, Ordering::Relaxed);
        let mut flags = if route.channel == 0 { control_flags() } else { data_flags() };
        if stream.is_some() {
            flags = Flags(flags.0 | FLAG_SUBSCRIPTION);
        }
        let bytes = match frame::encode(FrameType::Request, flags, route.channel, route.epoch, corr, body) {
            Ok(bytes) => bytes,
            Err(e) => {
                release(self);
                return Err(CallError::TooLarge(e));
            }
        };
        let (tx, rx) = bounded(1);
        {
            let mut pending = self.pending.lock();
            if pending.len() >= MAX_PENDING_CALLS {
                drop(pending);
                release(self);
                return Err(CallError::TooManyCalls { limit: MAX_PENDING_CALLS });
            }
            pending.insert(corr, Pending { route, leased, tx });
        }
        if let Some((tx, capacity)) = stream {
            self.streams.lock().insert(corr, (route, tx, capacity));
        }
        if let Err(e) = self.lanes.data(bytes) {
            self.finish(corr);
            self.end_stream(corr);
            return Err(e);
        }
        Ok(PendingCall { corr, route, rx, link: Arc::clone(self) })
    }

    /// Hands one StreamData body to the stream call `corr` on `route` (the reader's side). A full
    /// buffer ends the call [`CallError::StreamOverrun`] and asks the module to stop.
    pub fn stream_data(&self, corr: u64, route: ClientRoute, body: Vec<u8>) {
        let sent = match self.streams.lock().get(&corr) {
            Some((r, tx, capacity)) if *r == route => tx.try_send(body).map_err(|e| (e, *capacity)),
            _ => return,
        };
        match sent {
            Ok(()) => {}
            Err((TrySendError::Full(_), capacity)) => {
                log::warn!(target: "broca::subc", "consumer connection: stream {corr} on {}/{}: {capacity} unread frames; ending it", route.channel, route.epoch);
                if let Some(pending) = self.finish_matching(corr, route) {
                    let _ = pending.tx.send(Err(CallError::StreamOverrun { capacity }));
                }
                self.end_stream(corr);
                let _ = self.cancel(route, corr);
            }
            Err((TrySendError::Disconnected(_), _)) => self.end_stream(corr),
        }
    }

    /// Forgets the data buffer of the stream call `corr`, if it has one.
    pub fn end_stream(&self, corr: u64) {
        self.streams.lock().remove(&corr);
    }

    /// Removes an open call (ending its lease); `None` if it was already resolved.
    pub fn finish(&self, corr: u64) -> Option<Pending> {
        let pending = self.pending.lock().remove(&corr)?;
        if pending.leased {
            self.routes.lock().release(pending.route, Instant::now());
        }
        Some(pending)
    }

    /// Removes the open call `corr` if it went out on `route` (ending its lease).
    pub fn finish_matching(&self, corr: u64, route: ClientRoute) -> Option<Pending> {
        let pending = {
            let mut pending = self.pending.lock();
            match pending.get(&corr) {
                Some(p) if p.route == route => pending.remove(&corr),
                _ => None,
            }
        }?;
        if pending.leased {
            self.routes.lock().release(pending.route, Instant::now());
        }
        Some(pending)
    }

    /// Removes every open call matching `which` (ending their leases).
    pub fn finish_where(&self, which: impl Fn(&Pending) -> bool) -> Vec<Pending> {
        let gone: Vec<Pending> = {
            let mut pending = self.pending.lock();
            let corrs: Vec<u64> = pending.iter().filter(|(_, p)| which(p)).map(|(c, _)| *c).collect();
            corrs.iter().filter_map(|c| pending.remove(c)).collect()
        };
        let now = Instant::now();
        let mut routes = self.routes.lock();
        for p in gone.iter().filter(|p| p.leased) {
            routes.release(p.route, now);
        }
        gone
    }

    /// Opens a route the caller owns (not cached).
    pub fn open_route(
        self: &Arc<Self>,
        target: &RouteTarget,
        identity: &BindIdentity,
        deadline: Instant,
    ) -> Result<ClientRoute, CallError> {
        self.open_route_rooted(target, identity, None, deadline)
    }

    /// [`Link::open_route`], the bind carrying `project_root` when one is given.
    pub fn open_route_rooted(
        self: &Arc<Self>,
        target: &RouteTarget,
        identity: &BindIdentity,
        project_root: Option<&str>,
        deadline: Instant,
    ) -> Result<ClientRoute, CallError> {
        self.open_route_declaring(target, identity, project_root, &[], deadline)
    }

    /// [`Link::open_route_rooted`], the bind declaring `capabilities`.
    fn open_route_declaring(
        self: &Arc<Self>,
        target: &RouteTarget,
        identity: &BindIdentity,
        project_root: Option<&str>,
        capabilities: &[&str],
        deadline: Instant,
    ) -> Result<ClientRoute, CallError> {
        let open = RouteOpen::new(target, identity, self.identity.as_ref()).declaring(capabilities);
        let body = match project_root {
            Some(root) => open.to_bytes_rooted(root),
            None => open.to_bytes(),
        };
        let _slot = self.open_slot(deadline)?;
        let call = self.start(self.route(0, 0), false, &body)?;
        self.totals.route_opens.fetch_add(1, Ordering::Relaxed);
        let reply = match call.wait_until(deadline) {
            Ok(reply) => reply,
            Err(CallError::Module(body)) => return Err(CallError::RouteOpen(body)),
            Err(CallError::Timeout) => return Err(CallError::OpenTimeout),
            Err(e) => return Err(e),
        };
        let opened: RouteOpened = serde_json::from_slice(&reply).map_err(|e| CallError::BadReply(e.to_string()))?;
        if opened.route_channel == 0 {
            return Err(CallError::BadReply("route.open answered channel 0".into()));
        }
        Ok(self.route(opened.route_channel, opened.route_epoch))
    }

    /// Waits (until `deadline`) for one of the [`MAX_CONCURRENT_ROUTE_OPENS`] open slots.
    fn open_slot(&self, deadline: Instant) -> Result<OpenSlot<'_>, CallError> {
        let mut opening = self.opening.lock();
        while *opening >= MAX_CONCURRENT_ROUTE_OPENS {
            if self.open_ended.wait_until(&mut opening, deadline).timed_out() {
                return Err(CallError::OpenTimeout);
            }
        }
        *opening += 1;
        Ok(OpenSlot(self))
    }

    /// [`Link::open_route`], retried once after a short pause when the refusal is retryable.
    fn open_route_retrying(
        self: &Arc<Self>,
        target: &RouteTarget,
        identity: &BindIdentity,
        capabilities: &[&str],
        deadline: Instant,
    ) -> Result<ClientRoute, CallError> {
        match self.open_route_declaring(target, identity, None, capabilities, deadline) {
            Err(CallError::RouteOpen(body))
                if is_retryable_route_open(&body.code) && Instant::now() + ROUTE_OPEN_RETRY_PAUSE < deadline =>
            {
                log::debug!(target: "broca::subc", "route.open refused {}; retrying once", body.code);
                std::thread::sleep(ROUTE_OPEN_RETRY_PAUSE);
                self.open_route_declaring(target, identity, None, capabilities, deadline)
            }
            other => other,
        }
    }

    /// The cached route for `(target, identity)`, leased, opening (and caching) one on a miss.
    pub fn lease(
        self: &Arc<Self>,
        target: &RouteTarget,
        identity: &BindIdentity,
        deadline: Instant,
    ) -> Result<ClientRoute, CallError> {
        self.lease_declaring(target, identity, &[], deadline)
    }

    /// [`Link::lease`] of the route whose bind declares `capabilities`.
    pub fn lease_declaring(
        self: &Arc<Self>,
        target: &RouteTarget,
        identity: &BindIdentity,
        capabilities: &'static [&'static str],
        deadline: Instant,
    ) -> Result<ClientRoute, CallError> {
        let key = RouteKey::declaring(target, identity, capabilities);
        {
            let mut routes = self.routes.lock();
            if let Some(route) = routes.lease(&key, Instant::now()) {
                return Ok(route);
            }
            if !routes.has_room() {
                return Err(CallError::RouteCacheFull { capacity: routes.capacity() });
            }
        }
        let route = self.open_route_retrying(target, identity, capabilities, deadline)?;
        let inserted = self.routes.lock().insert_leased(key, route, Instant::now());
        match inserted {
            Insert::Inserted { evicted } => {
                if let Some(evicted) = evicted {
                    self.goodbye(evicted);
                }
                Ok(route)
            }
            Insert::Raced { existing } => {
                self.goodbye(route);
                Ok(existing)
            }
            Insert::Full => {
                self.goodbye(route);
                Err(CallError::RouteCacheFull { capacity: self.routes.lock().capacity() })
            }
        }
    }

    /// Ends a lease taken by [`Link::lease`] without a call.
    pub fn release(&self, route: ClientRoute) {
        self.routes.lock().release(route, Instant::now());
    }

    /// Sends a route GOODBYE on the control lane (counted; a full lane loses it, also counted).
    pub fn goodbye(&self, route: ClientRoute) {
        let Ok(bytes) = frame::encode(FrameType::Goodbye, control_flags(), route.channel, route.epoch, 0, &[]) else {
            return;
        };
        if self.lanes.control(bytes) {
            self.totals.goodbyes_sent.fetch_add(1, Ordering::Relaxed);
        } else if self.is_live() {
            self.totals.control_frames_dropped.fetch_add(1, Ordering::Relaxed);
            log::warn!(target: "broca::subc", "consumer connection: control lane full; GOODBYE for route {}/{} lost", route.channel, route.epoch);
        }
    }

    /// Forgets `route` if it is cached and closes it.
    pub fn close_route(&self, route: ClientRoute) {
        if route.generation != self.generation {
            return;
        }
        self.routes.lock().remove(route);
        self.goodbye(route);
    }

    /// Sends a CANCEL for the call `corr` on `route` (data lane: it follows its Request).
    pub fn cancel(&self, route: ClientRoute, corr: u64) -> Result<(), CallError> {
        if route.generation != self.generation {
            return Err(CallError::Closed);
        }
        let bytes = frame::encode(FrameType::Cancel, data_flags(), route.channel, route.epoch, corr, &[])
            .map_err(CallError::TooLarge)?;
        self.lanes.data(bytes)
    }

    /// Connection over: every open call fails `Closed` and the routes are forgotten.
    pub fn end(&self) {
        self.lanes.wire.close();
        for pending in self.finish_where(|_| true) {
            let _ = pending.tx.send(Err(CallError::Closed));
        }
        self.routes.lock().clear();
        self.streams.lock().clear();
    }
}

/// A held `route.open` slot; released on drop.
struct OpenSlot<'a>(&'a Link);

impl Drop for OpenSlot<'_> {
    fn drop(&mut self) {
        *self.0.opening.lock() -= 1;
        self.0.open_ended.notify_one();
    }
}

/// One Request in flight: its corr (to [`super::Consumer::cancel`] it) and its answer.
///
/// Dropping it without waiting forgets the call (its answer, if one comes, is discarded).
pub struct PendingCall {
    corr: u64,
    route: ClientRoute,
    rx: Receiver<Answer>,
    link: Arc<Link>,
}

impl std::fmt::Debug for PendingCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCall").field("corr", &self.corr).field("route", &self.route).finish()
    }
}

impl PendingCall {
    /// The corr broca minted for this Request.
    pub fn corr(&self) -> u64 {
        self.corr
    }

    /// The route the Request went out on.
    pub fn route(&self) -> ClientRoute {
        self.route
    }

    /// Waits at most `timeout` for the terminal frame.
    pub fn wait(self, timeout: Duration) -> Result<Vec<u8>, CallError> {
        self.wait_until(Instant::now() + timeout)
    }

    /// Waits until `until` for the terminal frame and keeps the call open when none came (a
    /// caller that checks for its own cancellation between waits).
    pub fn poll_until(&self, until: Instant) -> Option<Answer> {
        self.rx.recv_deadline(until).ok()
    }

    /// Waits until `deadline` for the terminal frame. On `Timeout` the outcome is unknown.
    pub fn wait_until(self, deadline: Instant) -> Result<Vec<u8>, CallError> {
        match self.rx.recv_deadline(deadline) {
            Ok(answer) => answer,
            Err(_) => match self.link.finish(self.corr) {
                Some(_) => Err(CallError::Timeout),
                // Resolved between the deadline and the removal: take that answer.
                None => self.rx.try_recv().unwrap_or(Err(CallError::Timeout)),
            },
        }
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.link.finish(self.corr);
    }
}

/// What a [`StreamCall`] yields, in order: its data frames, then its one terminal.
#[derive(Debug)]
pub enum StreamEvent {
    /// One StreamData body.
    Data(Vec<u8>),
    /// The terminal: StreamEnd's body, or why the stream ended (the module's Error, the route or
    /// the connection closing, [`CallError::StreamOverrun`]).
    End(Result<Vec<u8>, CallError>),
}

/// One subscription Request in flight ([`super::Consumer::subscribe`]). Dropping it before its
/// terminal sends the module a CANCEL.
pub struct StreamCall {
    /// `None` once the terminal was taken.
    call: Option<PendingCall>,
    data: Receiver<Vec<u8>>,
    /// The terminal, held back until the frames before it were read.
    end: Option<Answer>,
}

impl std::fmt::Debug for StreamCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCall").field("call", &self.call).field("buffered", &self.data.len()).finish()
    }
}

impl StreamCall {
    /// The next event, waiting until `until`; `None` when nothing came by then, and always once
    /// the terminal was returned. Data frames always come before the terminal.
    pub fn next_until(&mut self, until: Instant) -> Option<StreamEvent> {
        loop {
            if let Ok(body) = self.data.try_recv() {
                return Some(StreamEvent::Data(body));
            }
            if let Some(end) = self.end.take() {
                self.close_call();
                return Some(StreamEvent::End(end));
            }
            let call = self.call.as_ref()?;
            let timeout = until.saturating_duration_since(Instant::now());
            select! {
                recv(self.data) -> body => match body {
                    Ok(body) => return Some(StreamEvent::Data(body)),
                    // The reader let go of the buffer: the terminal (or the overrun) is already
                    // on its way to the call.
                    Err(_) => self.end = Some(call.rx.try_recv().unwrap_or(Err(CallError::Closed))),
                },
                recv(call.rx) -> end => self.end = Some(end.unwrap_or(Err(CallError::Closed))),
                default(timeout) => return None,
            }
        }
    }

    /// The corr broca minted for this Request.
    pub fn corr(&self) -> Option<u64> {
        self.call.as_ref().map(PendingCall::corr)
    }

    fn close_call(&mut self) {
        if let Some(call) = self.call.take() {
            call.link.end_stream(call.corr);
        }
    }
}

impl Drop for StreamCall {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call.link.end_stream(call.corr);
            if self.end.is_none() && call.link.finish(call.corr).is_some() {
                let _ = call.link.cancel(call.route, call.corr);
            }
        }
    }
}
