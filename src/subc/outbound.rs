//! [`Outbound`]: the cloneable handle other threads use to send frames on the module connection.
//!
//! Frames are encoded on the caller's thread and handed to the io thread through an unbounded
//! channel plus a `mio::Waker`; no method ever blocks. The io thread does the bookkeeping that
//! needs its state (is the route still bound? is the request still open?).
//!
//! Invariants:
//! - no frame larger than `MAX_DELIVERED_FRAME_LEN` (header included) is ever queued: an
//!   oversized terminal (Response, Error, StreamEnd) is replaced by the generic `response_too_large`
//!   Error so the request still ends and its credit is released; an oversized StreamData or Push
//!   is refused to the caller, who must end the stream with its own typed error;
//! - bytes queued and not yet written are counted in `Shared::queued_bytes`; StreamData and Push
//!   are refused with `Backpressure` once that count would pass [`STREAM_BUDGET_BYTES`], so a slow
//!   daemon socket detaches streams instead of growing memory. Terminal frames are always
//!   accepted: their number is bounded by the daemon's credits (one per open request);
//! - exactly one terminal per request is enforced by the io thread: a second one is dropped with
//!   a WARN, and nothing is sent for a request after its terminal.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;
use mio::Waker;
use subc_protocol::session::{HealthReport, ModuleControlResponse};
use subc_protocol::{ErrorBody, Flags, FrameType, Priority};

use super::frame::{self, TooLarge, MAX_DELIVERED_FRAME_LEN};
use super::routes::Route;
use crate::wire::Refusal;

/// Bytes of StreamData and Push that may wait unwritten before such frames are refused.
pub const STREAM_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// The code of the generic refusal that replaces an oversized terminal frame.
pub const RESPONSE_TOO_LARGE: &str = crate::wire::RefusalCode::ResponseTooLarge.as_str();

/// What the io thread receives from [`Outbound`].
pub(crate) enum Out {
    /// An encoded frame; its length is charged to `Shared::queued_bytes` until written or dropped.
    Frame { route: Route, corr: u64, ty: FrameType, bytes: Vec<u8> },
    /// Close one route from the module side (route GOODBYE).
    CloseRoute(Route),
    /// Stop the whole connection (channel-0 GOODBYE, flush, half-close, read to EOF).
    Shutdown,
}

/// State shared between the io thread and every [`Outbound`].
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub queued_bytes: AtomicUsize,
    pub closed: AtomicBool,
}

impl Shared {
    pub fn release(&self, bytes: usize) {
        self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Why a frame was not queued.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError {
    /// The connection has ended.
    Closed,
    /// The frame would exceed the delivered-frame limit. With `answered`, the request was ended
    /// with the generic `response_too_large` Error in its place.
    TooLarge { too_large: TooLarge, answered: bool },
    /// Too many stream bytes are waiting for the socket; detach the stream.
    Backpressure { queued_bytes: usize, limit: usize },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => write!(f, "the module connection is closed"),
            Self::TooLarge { too_large, answered: true } => {
                write!(f, "{too_large}; answered with {RESPONSE_TOO_LARGE}")
            }
            Self::TooLarge { too_large, answered: false } => write!(f, "{too_large}"),
            Self::Backpressure { queued_bytes, limit } => {
                write!(f, "{queued_bytes} stream bytes already wait for the socket (limit {limit})")
            }
        }
    }
}

impl std::error::Error for SendError {}

/// Sends frames on the module connection from any thread. Cheap to clone.
#[derive(Clone)]
pub struct Outbound {
    pub(crate) tx: Sender<Out>,
    pub(crate) waker: Arc<Waker>,
    pub(crate) shared: Arc<Shared>,
}

fn data_flags() -> Flags {
    Flags::new(false, Priority::Interactive, false)
}

fn control_flags() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

impl Outbound {
    /// The largest frame (header included) the daemon delivers to a client.
    pub fn frame_limit(&self) -> usize {
        MAX_DELIVERED_FRAME_LEN
    }

    /// Whether a reply or stream frame with a body of `body_len` bytes can be delivered.
    pub fn fits(&self, body_len: usize) -> bool {
        frame::check_delivered(body_len).is_ok()
    }

    /// Bytes queued by this connection's handles and not yet written to the socket.
    pub fn queued_bytes(&self) -> usize {
        self.shared.queued_bytes.load(Ordering::Acquire)
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Answers a request with a Response (terminal).
    pub fn reply(&self, route: Route, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        self.terminal(route, corr, FrameType::Response, data_flags(), body)
    }

    /// Refuses a request with an Error frame carrying `error` (terminal).
    pub fn error(&self, route: Route, corr: u64, error: &ErrorBody) -> Result<(), SendError> {
        let body = serde_json::to_vec(error).expect("ErrorBody serializes");
        self.terminal(route, corr, FrameType::Error, data_flags(), body)
    }

    /// Refuses a request with an Error frame whose body is an already encoded `ErrorBody`, sent
    /// byte for byte (a relay passing another module's refusal on; terminal).
    pub fn error_encoded(&self, route: Route, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        self.terminal(route, corr, FrameType::Error, data_flags(), body)
    }

    /// Refuses a request with one of broca's refusals (detail members keep their order).
    pub fn refuse(&self, route: Route, corr: u64, refusal: &Refusal) -> Result<(), SendError> {
        self.terminal(route, corr, FrameType::Error, data_flags(), refusal.to_json().into_bytes())
    }

    /// Sends one StreamData frame for an open request (not terminal).
    pub fn stream_data(&self, route: Route, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        self.non_terminal(route, corr, FrameType::StreamData, body)
    }

    /// Ends a stream with StreamEnd (terminal).
    pub fn stream_end(&self, route: Route, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        self.terminal(route, corr, FrameType::StreamEnd, data_flags(), body)
    }

    /// Sends an unsolicited Push on a route (`corr` 0 unless it belongs to a call).
    pub fn push(&self, route: Route, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        self.non_terminal(route, corr, FrameType::Push, body)
    }

    /// Sends a reverse Request toward the route's client, in the module's own corr space (it
    /// takes no credit; the client answers on the same corr).
    pub fn reverse_request(&self, route: Route, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        self.non_terminal(route, corr, FrameType::Request, body)
    }

    /// Answers the daemon's `health.check` request `corr`.
    pub fn health(&self, corr: u64, report: HealthReport) -> Result<(), SendError> {
        let HealthReport { status, detail, metrics } = report;
        let body = serde_json::to_vec(&ModuleControlResponse::HealthCheck { status, detail, metrics })
            .expect("health replies serialize");
        self.terminal(Route::CONTROL, corr, FrameType::Response, control_flags(), body)
    }

    /// Sends a module-originated control request on channel 0 (`scope.sync`, `catalog.update`,
    /// …) with a corr from the module's own space (not [`HELLO_CORR`](super::module::HELLO_CORR)).
    /// The daemon's answer reaches [`Handler::on_control_reply`](super::Handler::on_control_reply).
    pub fn control_request(&self, corr: u64, body: Vec<u8>) -> Result<(), SendError> {
        frame::check_delivered(body.len()).map_err(|too_large| SendError::TooLarge { too_large, answered: false })?;
        self.queue(Route::CONTROL, corr, FrameType::Request, control_flags(), &body, false)
    }

    /// Closes one route from the module side: a GOODBYE on its `(channel, epoch)`.
    pub fn close_route(&self, route: Route) -> Result<(), SendError> {
        self.send(Out::CloseRoute(route), 0, false)
    }

    /// Ends the connection in order: channel-0 GOODBYE, flush, half-close, read to EOF.
    pub fn shutdown(&self) {
        let _ = self.send(Out::Shutdown, 0, false);
    }

    fn terminal(&self, route: Route, corr: u64, ty: FrameType, flags: Flags, body: Vec<u8>) -> Result<(), SendError> {
        if let Err(too_large) = frame::check_delivered(body.len()) {
            log::warn!(target: "broca::subc", "{ty:?} for {route} corr {corr} is {too_large}; answering {RESPONSE_TOO_LARGE}");
            let error = ErrorBody::new(
                RESPONSE_TOO_LARGE,
                format!(
                    "module reply of {} bytes exceeds the frame limit of {} bytes",
                    too_large.frame_bytes, too_large.limit
                ),
            )
            .with_detail(serde_json::json!({"byte_limit": too_large.limit, "frame_bytes": too_large.frame_bytes}));
            let body = serde_json::to_vec(&error).expect("ErrorBody serializes");
            self.queue(route, corr, FrameType::Error, flags, &body, false)?;
            return Err(SendError::TooLarge { too_large, answered: true });
        }
        self.queue(route, corr, ty, flags, &body, false)
    }

    fn non_terminal(&self, route: Route, corr: u64, ty: FrameType, body: Vec<u8>) -> Result<(), SendError> {
        frame::check_delivered(body.len()).map_err(|too_large| SendError::TooLarge { too_large, answered: false })?;
        self.queue(route, corr, ty, data_flags(), &body, true)
    }

    fn queue(
        &self,
        route: Route,
        corr: u64,
        ty: FrameType,
        flags: Flags,
        body: &[u8],
        budgeted: bool,
    ) -> Result<(), SendError> {
        let bytes = frame::encode(ty, flags, route.channel, route.epoch, corr, body)
            .expect("bodies within the delivered limit always encode");
        let len = bytes.len();
        self.send(Out::Frame { route, corr, ty, bytes }, len, budgeted)
    }

    fn send(&self, out: Out, counted: usize, budgeted: bool) -> Result<(), SendError> {
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        let before = self.shared.queued_bytes.fetch_add(counted, Ordering::AcqRel);
        if budgeted && before + counted > STREAM_BUDGET_BYTES {
            self.shared.release(counted);
            return Err(SendError::Backpressure { queued_bytes: before, limit: STREAM_BUDGET_BYTES });
        }
        if self.tx.send(out).is_err() {
            self.shared.release(counted);
            return Err(SendError::Closed);
        }
        // A failed wake means the poll is gone, and so is the io thread; the send above then failed too.
        let _ = self.waker.wake();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> (Outbound, crossbeam_channel::Receiver<Out>, mio::Poll) {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(1)).unwrap());
        let (tx, rx) = crossbeam_channel::unbounded();
        (Outbound { tx, waker, shared: Arc::default() }, rx, poll)
    }

    fn next_frame(rx: &crossbeam_channel::Receiver<Out>) -> subc_protocol::Frame {
        let Ok(Out::Frame { bytes, .. }) = rx.try_recv() else { panic!("expected a frame") };
        let mut d = frame::Decoder::new();
        d.feed(&bytes);
        d.next_frame().unwrap().unwrap()
    }

    #[test]
    fn an_oversized_reply_becomes_the_generic_refusal() {
        let (out, rx, _poll) = handle();
        let route = Route::new(2, 1);
        let body = vec![b'x'; MAX_DELIVERED_FRAME_LEN - frame::HEADER_LEN + 1];
        let err = out.reply(route, 9, body).unwrap_err();
        assert!(matches!(err, SendError::TooLarge { answered: true, too_large } if too_large.frame_bytes == 4_194_305));
        let f = next_frame(&rx);
        assert_eq!((f.header.ty, f.header.channel, f.header.epoch, f.header.corr), (FrameType::Error, 2, 1, 9));
        let e: ErrorBody = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(e.code, RESPONSE_TOO_LARGE);
        assert_eq!(e.detail.unwrap()["byte_limit"], 4_194_304);
        // A body at exactly the limit goes out unchanged.
        out.reply(route, 10, vec![b'y'; MAX_DELIVERED_FRAME_LEN - frame::HEADER_LEN]).unwrap();
        assert_eq!(next_frame(&rx).header.ty, FrameType::Response);
    }

    #[test]
    fn oversized_or_over_budget_stream_frames_are_refused_to_the_caller() {
        let (out, rx, _poll) = handle();
        let route = Route::new(1, 1);
        let err = out.stream_data(route, 1, vec![0; MAX_DELIVERED_FRAME_LEN]).unwrap_err();
        assert!(matches!(err, SendError::TooLarge { answered: false, .. }));
        assert!(rx.try_recv().is_err());
        let chunk = vec![0; 4 * 1024 * 1024 - frame::HEADER_LEN];
        for _ in 0..4 {
            out.stream_data(route, 1, chunk.clone()).unwrap();
        }
        assert!(matches!(out.stream_data(route, 1, vec![1]), Err(SendError::Backpressure { .. })));
        // Terminals still go through, and the count drops as the io thread releases bytes.
        out.stream_end(route, 1, Vec::new()).unwrap();
        out.shared.release(out.queued_bytes());
        out.stream_data(route, 2, vec![1]).unwrap();
    }

    #[test]
    fn a_closed_connection_refuses_everything() {
        let (out, rx, _poll) = handle();
        drop(rx);
        assert!(matches!(out.reply(Route::new(1, 1), 1, vec![]), Err(SendError::Closed)));
        assert_eq!(out.queued_bytes(), 0);
        out.shared.closed.store(true, Ordering::Release);
        assert!(out.is_closed());
    }
}
