//! The io thread: one `mio::Poll` loop that owns the module connection's socket.
//!
//! It reads and decodes frames, answers Ping, decides and installs `route.bind`, validates
//! `(channel, epoch)`, tracks open requests, hands everything else to the [`Handler`], and writes
//! outbound frames (its own and those queued through [`Outbound`](super::Outbound)) with
//! partial-write handling.
//!
//! Invariants:
//! - it never blocks and never touches disk: the socket is non-blocking, the handler and
//!   authorizer must return at once, and the only waits are in `Poll::poll`;
//! - a bind is recorded in the route table before its RouteBindAck is queued, so the client's
//!   first request after the ack finds the route; a refused bind changes nothing;
//! - a frame on a `(channel, epoch)` that is not installed is dropped (unbound or stale);
//! - outbound frames are written in the order they were queued; a frame is dropped (and its
//!   bytes released) if its route is gone, if it is a terminal for a request that is not open,
//!   or if it is StreamData for a request that is not open;
//! - the end is orderly whenever the socket allows it: on daemon GOODBYE, EOF or our own stop,
//!   replies already queued are written, then a channel-0 GOODBYE, then the write side is shut
//!   and the socket is read (and discarded) until EOF or [`CLOSE_DRAIN`] passes, so the close is
//!   a FIN, not an RST. `Handler::on_shutdown` runs exactly once, before that.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use subc_protocol::call_mode::{derive_call_mode, CallMode};
use subc_protocol::session::{ModuleControlCommand, ModuleControlRequest, ModuleControlResponse};
use subc_protocol::{ErrorBody, Flags, Frame, FrameType, Priority};

use super::frame::{self, Decoder};
use super::handler::{Authorizer, BindRequest, ConnectionEnd, ControlReply, ControlRequest, Handler};
use super::outbound::{Out, Shared};
use super::routes::{Route, RouteTable};

pub(crate) const SOCKET: Token = Token(0);
pub(crate) const WAKER: Token = Token(1);
const READ_CHUNK: usize = 64 * 1024;
/// How long an orderly close waits for the daemon to close its side.
pub const CLOSE_DRAIN: Duration = Duration::from_secs(5);
const LOG: &str = "broca::subc";

/// What the io thread takes over from a registered connection.
pub(crate) struct Parts {
    pub stream: std::net::TcpStream,
    pub decoder: Decoder,
    pub poll: Poll,
    pub rx: Receiver<Out>,
    pub shared: Arc<Shared>,
}

pub(crate) fn spawn<H: Handler, A: Authorizer>(
    parts: Parts,
    handler: H,
    authorizer: A,
) -> io::Result<JoinHandle<ConnectionEnd>> {
    parts.stream.set_nonblocking(true)?;
    let mut sock = TcpStream::from_std(parts.stream);
    parts.poll.registry().register(&mut sock, SOCKET, Interest::READABLE | Interest::WRITABLE)?;
    let io = Io {
        poll: parts.poll,
        sock,
        rx: parts.rx,
        shared: parts.shared,
        decoder: parts.decoder,
        buf: vec![0; READ_CHUNK],
        wq: WriteQueue::default(),
        routes: RouteTable::default(),
        handler,
        authorizer,
        shut_down: false,
    };
    thread::Builder::new().name("subc-io".into()).spawn(move || io.run())
}

struct Io<H, A> {
    poll: Poll,
    sock: TcpStream,
    rx: Receiver<Out>,
    shared: Arc<Shared>,
    decoder: Decoder,
    buf: Vec<u8>,
    wq: WriteQueue,
    routes: RouteTable,
    handler: H,
    authorizer: A,
    shut_down: bool,
}

/// What reading the socket led to.
enum Inbound {
    /// Nothing more to read now.
    Open,
    /// The daemon closed its side.
    Eof,
    /// The daemon said GOODBYE on channel 0.
    Goodbye,
    /// The connection failed.
    Failed(ConnectionEnd),
}

fn classify(e: io::Error) -> ConnectionEnd {
    match e.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => {
            ConnectionEnd::Reset(e)
        }
        _ => ConnectionEnd::Io(e),
    }
}

fn control_flags() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

fn is_terminal(ty: FrameType) -> bool {
    matches!(ty, FrameType::Response | FrameType::Error | FrameType::StreamEnd)
}

fn header_only(ty: FrameType, flags: Flags, route: Route, corr: u64) -> Vec<u8> {
    frame::encode(ty, flags, route.channel, route.epoch, corr, &[]).expect("header-only frames encode")
}

impl<H: Handler, A: Authorizer> Io<H, A> {
    fn run(mut self) -> ConnectionEnd {
        let end = self.serve();
        self.shared.closed.store(true, Ordering::Release);
        let (routes, open) = (self.routes.bound_count(), self.routes.open_count());
        match &end {
            e if e.is_clean() => {
                log::info!(target: LOG, "module connection ended: {e} ({routes} routes, {open} open requests)")
            }
            e => log::warn!(target: LOG, "module connection ended: {e} ({routes} routes, {open} open requests)"),
        }
        end
    }

    fn serve(&mut self) -> ConnectionEnd {
        let mut events = Events::with_capacity(64);
        // Frames that arrived behind the HELLO_ACK come first.
        let mut inbound = self.dispatch_decoded();
        loop {
            match inbound {
                Inbound::Open => {}
                Inbound::Eof => return self.close(ConnectionEnd::Eof, true, &mut events),
                Inbound::Goodbye => return self.close(ConnectionEnd::Goodbye, false, &mut events),
                Inbound::Failed(end) => return self.fail(end),
            }
            if self.drain_outbound() {
                return self.close(ConnectionEnd::Stopped, false, &mut events);
            }
            if let Err(e) = self.wq.flush(&mut self.sock, &self.shared) {
                return self.fail(classify(e));
            }
            if let Err(e) = self.wait(&mut events, None) {
                return self.fail(ConnectionEnd::Io(e));
            }
            inbound = self.read_and_dispatch();
        }
    }

    fn wait(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        match self.poll.poll(events, timeout) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            other => other,
        }
    }

    fn notify_shutdown(&mut self) {
        if !self.shut_down {
            self.shut_down = true;
            self.handler.on_shutdown();
        }
    }

    fn fail(&mut self, end: ConnectionEnd) -> ConnectionEnd {
        self.notify_shutdown();
        end
    }

    /// The orderly end: queued replies, GOODBYE, flush, half-close, read to EOF (bounded).
    fn close(&mut self, end: ConnectionEnd, mut read_eof: bool, events: &mut Events) -> ConnectionEnd {
        self.notify_shutdown();
        self.drain_outbound();
        self.wq.push(header_only(FrameType::Goodbye, control_flags(), Route::CONTROL, 0), false);
        let deadline = Instant::now() + CLOSE_DRAIN;
        let mut write_shut = false;
        loop {
            if self.wq.flush(&mut self.sock, &self.shared).is_err() {
                return end;
            }
            if self.wq.is_empty() && !write_shut {
                let _ = self.sock.shutdown(Shutdown::Write);
                write_shut = true;
            }
            while !read_eof {
                match self.sock.read(&mut self.buf) {
                    Ok(0) => read_eof = true,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return end,
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if (read_eof && write_shut) || left.is_zero() {
                if !(read_eof && write_shut) {
                    log::warn!(target: LOG, "subc did not close its side within {CLOSE_DRAIN:?}; closing anyway");
                }
                return end;
            }
            if self.wait(events, Some(left)).is_err() {
                return end;
            }
        }
    }

    fn read_and_dispatch(&mut self) -> Inbound {
        loop {
            match self.sock.read(&mut self.buf) {
                Ok(0) => return Inbound::Eof,
                Ok(n) => {
                    self.decoder.feed(&self.buf[..n]);
                    match self.dispatch_decoded() {
                        Inbound::Open => {}
                        other => return other,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Inbound::Open,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Inbound::Failed(classify(e)),
            }
        }
    }

    fn dispatch_decoded(&mut self) -> Inbound {
        loop {
            match self.decoder.next_frame() {
                Ok(Some(f)) => {
                    if self.on_frame(f) {
                        return Inbound::Goodbye;
                    }
                }
                Ok(None) => return Inbound::Open,
                Err(e) => return Inbound::Failed(ConnectionEnd::Protocol(e)),
            }
        }
    }

    /// Handles one inbound frame; true when it is the daemon's channel-0 GOODBYE.
    fn on_frame(&mut self, f: Frame) -> bool {
        let h = f.header;
        if h.channel == 0 {
            return self.on_control_frame(f);
        }
        let route = Route::new(h.channel, h.epoch);
        if !self.routes.is_bound(route) {
            log::debug!(target: LOG, "dropping {:?} corr {} on unbound or stale route {route}", h.ty, h.corr);
            return false;
        }
        match h.ty {
            FrameType::Request if self.routes.open_request(route, h.corr) => {
                self.handler.on_request(route, h.corr, h.flags, f.body)
            }
            FrameType::Request => log::warn!(target: LOG, "dropping a duplicate request corr {} on {route}", h.corr),
            FrameType::Cancel if self.routes.is_open(route, h.corr) => self.handler.on_cancel(route, h.corr),
            FrameType::Goodbye => {
                self.routes.close(route);
                self.handler.on_route_closed(route);
            }
            ty => log::debug!(target: LOG, "dropping {ty:?} corr {} on {route}", h.corr),
        }
        false
    }

    fn on_control_frame(&mut self, f: Frame) -> bool {
        let h = f.header;
        match h.ty {
            FrameType::Ping => self.wq.push(header_only(FrameType::Pong, h.flags, Route::CONTROL, h.corr), false),
            FrameType::Goodbye => return true,
            FrameType::Request => self.on_control_request(h.corr, &f.body),
            FrameType::Push => self.on_control_push(&f.body),
            FrameType::Response => self.handler.on_control_reply(h.corr, ControlReply::Response(f.body)),
            FrameType::Error => {
                let body = serde_json::from_slice(&f.body).unwrap_or_else(|_| {
                    ErrorBody::new(
                        crate::wire::RefusalCode::InvalidRequest.as_str(),
                        String::from_utf8_lossy(&f.body).into_owned(),
                    )
                });
                self.handler.on_control_reply(h.corr, ControlReply::Error(body))
            }
            ty => log::warn!(target: LOG, "ignoring an unexpected channel-0 {ty:?} (corr {})", h.corr),
        }
        false
    }

    fn on_control_request(&mut self, corr: u64, body: &[u8]) {
        let decoded = serde_json::from_slice::<serde_json::Value>(body).and_then(|value| {
            let root = value.pointer("/identity/project_root").and_then(|v| v.as_str()).map(str::to_owned);
            serde_json::from_value::<ModuleControlRequest>(value).map(|req| (req, root))
        });
        match decoded {
            Err(e) => {
                log::warn!(target: LOG, "refusing an undecodable control request (corr {corr}): {e}");
                let msg = format!("control request could not be decoded by this module: {e}");
                self.control_error(corr, &ErrorBody::new(crate::wire::RefusalCode::InvalidRequest.as_str(), msg));
            }
            Ok((ModuleControlRequest::HealthCheck {}, _)) => {
                self.routes.open_request(Route::CONTROL, corr);
                self.handler.on_control(ControlRequest::HealthCheck { corr });
            }
            Ok((
                ModuleControlRequest::RouteBind {
                    route_channel,
                    epoch,
                    target,
                    identity,
                    principal,
                    consumer_capabilities,
                    role_versions,
                    admission_facts,
                    scope,
                    call_mode,
                },
                legacy_project_root,
            )) => {
                let call_mode = call_mode.unwrap_or_else(|| derive_call_mode(scope.as_ref()));
                let bind = BindRequest {
                    route: Route::new(route_channel, epoch),
                    target,
                    identity,
                    principal,
                    consumer_capabilities,
                    role_versions,
                    admission_facts,
                    scope,
                    call_mode,
                    legacy_project_root,
                };
                self.bind(corr, bind);
            }
        }
    }

    fn bind(&mut self, corr: u64, bind: BindRequest) {
        let route = bind.route;
        if route.channel == 0 || route.epoch == 0 {
            let msg = format!("route.bind names channel {} epoch {}", route.channel, route.epoch);
            return self.control_error(corr, &ErrorBody::new(crate::wire::RefusalCode::InvalidRequest.as_str(), msg));
        }
        if let CallMode::Unknown(mode) = &bind.call_mode {
            let msg = format!("call mode {mode:?} is not supported");
            return self
                .control_error(corr, &ErrorBody::new(crate::wire::RefusalCode::CallModeUnsupported.as_str(), msg));
        }
        let replaced = match self.routes.check_bind(route) {
            Ok(replaced) => replaced,
            Err(installed) => {
                let msg = format!(
                    "route.bind epoch {} does not supersede installed epoch {installed} on channel {}",
                    route.epoch, route.channel
                );
                return self
                    .control_error(corr, &ErrorBody::new(crate::wire::RefusalCode::RouteRejected.as_str(), msg));
            }
        };
        if let Err(refusal) = self.authorizer.authorize(&bind) {
            log::info!(target: LOG, "refused route.bind {route}: {}", refusal.code);
            return self.control_error(corr, &refusal);
        }
        // Recorded before the ack is queued: the client's first request may follow it at once.
        self.routes.install(route);
        let ack = serde_json::to_vec(&ModuleControlResponse::RouteBindAck {}).expect("acks serialize");
        let ack = frame::encode(FrameType::Response, control_flags(), 0, 0, corr, &ack).expect("acks encode");
        self.wq.push(ack, false);
        if let Some(old) = replaced {
            self.handler.on_route_closed(old);
        }
        log::debug!(target: LOG, "bound route {route}");
        self.handler.on_route_bound(bind);
    }

    fn control_error(&mut self, corr: u64, error: &ErrorBody) {
        let body = serde_json::to_vec(error).expect("ErrorBody serializes");
        let bytes = frame::encode(FrameType::Error, control_flags(), 0, 0, corr, &body).expect("control errors encode");
        self.wq.push(bytes, false);
    }

    fn on_control_push(&mut self, body: &[u8]) {
        match serde_json::from_slice::<ModuleControlCommand>(body) {
            Ok(ModuleControlCommand::Draining { reason, deadline_ms }) => {
                self.handler.on_control(ControlRequest::Draining { reason, deadline_ms })
            }
            Err(e) => log::debug!(target: LOG, "ignoring a channel-0 push this module cannot decode: {e}"),
        }
    }

    /// Moves everything queued through `Outbound` into the write queue; true if a stop was asked.
    fn drain_outbound(&mut self) -> bool {
        let mut stop = false;
        while let Ok(out) = self.rx.try_recv() {
            match out {
                Out::Frame { route, corr, ty, bytes } => self.outbound_frame(route, corr, ty, bytes),
                Out::CloseRoute(route) => {
                    if self.routes.close(route) {
                        self.wq.push(header_only(FrameType::Goodbye, control_flags(), route, 0), false);
                        if !self.shut_down {
                            self.handler.on_route_closed(route);
                        }
                    }
                }
                Out::Shutdown => stop = true,
            }
        }
        stop
    }

    fn outbound_frame(&mut self, route: Route, corr: u64, ty: FrameType, bytes: Vec<u8>) {
        let keep = if !self.routes.is_bound(route) {
            log::debug!(target: LOG, "dropping {ty:?} corr {corr} for {route}: the route is gone");
            false
        } else if is_terminal(ty) {
            let open = self.routes.finish(route, corr);
            if !open {
                log::warn!(target: LOG, "dropping {ty:?} for {route} corr {corr}: the request already had its terminal frame or never arrived");
            }
            open
        } else if ty == FrameType::StreamData {
            let open = self.routes.is_open(route, corr);
            if !open {
                log::warn!(target: LOG, "dropping StreamData for {route} corr {corr}: the request is not open");
            }
            open
        } else {
            true
        };
        if keep {
            self.wq.push(bytes, true);
        } else {
            self.shared.release(bytes.len());
        }
    }
}

/// Encoded frames waiting for the socket, written in order, resuming partial writes.
#[derive(Debug, Default)]
struct WriteQueue {
    /// Each frame with whether its bytes are charged to `Shared::queued_bytes`.
    frames: VecDeque<(Vec<u8>, bool)>,
    /// Bytes of the front frame already written.
    written: usize,
}

impl WriteQueue {
    fn push(&mut self, bytes: Vec<u8>, counted: bool) {
        self.frames.push_back((bytes, counted));
    }

    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Writes until the queue is empty or the socket would block.
    fn flush(&mut self, sock: &mut impl Write, shared: &Shared) -> io::Result<()> {
        while let Some((front, counted)) = self.frames.front() {
            match sock.write(&front[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    if self.written == front.len() {
                        if *counted {
                            shared.release(front.len());
                        }
                        self.frames.pop_front();
                        self.written = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts at most `step` bytes per write and would-block every other call.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.step);
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume_in_order_and_release_counted_bytes() {
        let shared = Shared::default();
        let mut q = WriteQueue::default();
        let a = vec![1u8; 10];
        let b = vec![2u8; 7];
        shared.queued_bytes.store(10, Ordering::Release);
        q.push(a.clone(), true);
        q.push(b.clone(), false);
        let mut sink = Trickle { out: Vec::new(), step: 3, calls: 0 };
        let mut rounds = 0;
        while !q.is_empty() {
            q.flush(&mut sink, &shared).unwrap();
            rounds += 1;
            assert!(rounds < 100);
        }
        assert_eq!(sink.out, [a, b].concat());
        assert_eq!(shared.queued_bytes.load(Ordering::Acquire), 0);
        assert!(rounds > 1, "would-block ended some flushes early");
    }

    #[test]
    fn resets_are_classified_apart_from_other_errors() {
        for kind in [io::ErrorKind::ConnectionReset, io::ErrorKind::ConnectionAborted, io::ErrorKind::BrokenPipe] {
            assert!(matches!(classify(kind.into()), ConnectionEnd::Reset(_)));
        }
        assert!(matches!(classify(io::ErrorKind::PermissionDenied.into()), ConnectionEnd::Io(_)));
    }
}
