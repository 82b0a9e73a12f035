//! The module connection: registration ([`connect`]) and the hand-off to the io thread
//! ([`ModuleConn::start`]).
//!
//! Start-up order (`subc-wire.md` §4): launch nonce first (before anything could spawn a child
//! and inherit its descriptor), connection file, TCP connect to `endpoints[0]` with
//! `TCP_NODELAY`, handshake, HELLO on channel 0 with corr 1, then wait for HELLO_ACK; an Error on
//! corr 1 is a refusal. Bytes that arrive behind the HELLO_ACK stay in the decoder and are the
//! io thread's first input, so nothing the daemon sends right after registering is lost.
//!
//! After `start`, the io thread owns the socket. The [`Handler`] and [`Authorizer`] run on it:
//! both must return quickly and never block (forward work to other threads; answer through an
//! [`Outbound`]).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use subc_os::launch_nonce::LaunchNonceError;
use subc_protocol::manifest::ModuleManifest;
use subc_protocol::session::{HealthReport, MODULE_CONTROL_OP_HEALTH_CHECK};
use subc_protocol::{
    ErrorBody, Flags, Frame, FrameType, ModuleHelloAckBody, ModuleHelloBody, Priority, PROTOCOL_VERSION,
};

use super::connection_file::{self, ConnectionFileError};
use super::frame::{self, Decoder, FrameError};
pub use super::handler::{Authorizer, BindRequest, ConnectionEnd, ControlReply, ControlRequest, Handler};
use super::handshake::{self, HandshakeError, HANDSHAKE_DEADLINE};
use super::io as io_thread;
use super::outbound::{Outbound, Shared};

/// The corr the module's HELLO carries and the HELLO_ACK echoes.
pub const HELLO_CORR: u64 = 1;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const HELLO_ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why registration failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// `module_id` is empty.
    EmptyModuleId,
    /// The launch nonce descriptor named by `SUBC_LAUNCH_NONCE_FD` could not be read.
    LaunchNonce(LaunchNonceError),
    ConnectionFile(ConnectionFileError),
    /// TCP connect to the daemon failed.
    Connect {
        endpoint: String,
        source: io::Error,
    },
    Handshake(HandshakeError),
    /// The socket failed between the handshake and HELLO_ACK.
    Io(io::Error),
    /// The byte stream is not frames.
    Protocol(FrameError),
    /// The daemon refused the HELLO (Error on corr 1).
    Refused(ErrorBody),
    /// The daemon sent something other than HELLO_ACK, Error or Ping before acknowledging.
    UnexpectedFrame {
        ty: FrameType,
        corr: u64,
    },
    /// The HELLO_ACK body does not decode.
    BadHelloAck(serde_json::Error),
    /// The daemon closed the connection before acknowledging.
    ClosedBeforeAck,
    /// No HELLO_ACK within the wait.
    HelloAckTimeout,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyModuleId => write!(f, "the module id is empty"),
            Self::LaunchNonce(e) => write!(f, "launch nonce: {e}"),
            Self::ConnectionFile(e) => write!(f, "{e}"),
            Self::Connect { endpoint, source } => write!(f, "connect to subc at {endpoint}: {source}"),
            Self::Handshake(e) => write!(f, "{e}"),
            Self::Io(e) => write!(f, "registration I/O: {e}"),
            Self::Protocol(e) => write!(f, "registration: {e}"),
            Self::Refused(body) => write!(f, "subc refused the HELLO: {}: {}", body.code, body.message),
            Self::UnexpectedFrame { ty, corr } => write!(f, "unexpected {ty:?} (corr {corr}) before HELLO_ACK"),
            Self::BadHelloAck(e) => write!(f, "HELLO_ACK does not decode: {e}"),
            Self::ClosedBeforeAck => write!(f, "subc closed the connection before HELLO_ACK"),
            Self::HelloAckTimeout => write!(f, "no HELLO_ACK within {HELLO_ACK_TIMEOUT:?}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// A registered module connection, not yet served.
pub struct ModuleConn {
    stream: TcpStream,
    decoder: Decoder,
    poll: mio::Poll,
    rx: crossbeam_channel::Receiver<super::outbound::Out>,
    outbound: Outbound,
    hello_ack: ModuleHelloAckBody,
    daemon_ver: String,
}

/// Registers with the daemon named by the connection file at `conn_file`, as `module_id` (which
/// replaces the manifest's own id), and returns once the HELLO_ACK has arrived.
pub fn connect(conn_file: &Path, mut manifest: ModuleManifest, module_id: &str) -> Result<ModuleConn, ConnectError> {
    let launch_nonce = subc_os::launch_nonce::launch_nonce().map_err(ConnectError::LaunchNonce)?;
    if module_id.is_empty() {
        return Err(ConnectError::EmptyModuleId);
    }
    let info = connection_file::read(conn_file).map_err(ConnectError::ConnectionFile)?;
    let endpoint = &info.endpoints[0];
    let label = format!("{}:{}", endpoint.host, endpoint.port);
    let mut stream = tcp_connect(endpoint.bare_host(), endpoint.port)
        .map_err(|source| ConnectError::Connect { endpoint: label.clone(), source })?;
    stream.set_nodelay(true).map_err(ConnectError::Io)?;
    let auth = handshake::authenticate(&mut stream, &info, HANDSHAKE_DEADLINE).map_err(ConnectError::Handshake)?;

    manifest.module_id = module_id.to_owned();
    manifest.protocol_ver = PROTOCOL_VERSION;
    let hello = ModuleHelloBody {
        manifest,
        protocol_ver: PROTOCOL_VERSION,
        control_ops: Some(vec![MODULE_CONTROL_OP_HEALTH_CHECK.to_owned()]),
        launch_nonce: launch_nonce.map(|n| n.value().to_owned()),
    };
    let body = serde_json::to_vec(&hello).expect("HELLO serializes");
    let bytes = frame::encode(FrameType::Hello, control_flags(), 0, 0, HELLO_CORR, &body).expect("HELLO fits a frame");
    stream.write_all(&bytes).map_err(ConnectError::Io)?;
    let mut decoder = Decoder::new();
    let hello_ack = await_hello_ack(&mut stream, &mut decoder)?;
    log::info!(target: "broca::subc", "registered as {module_id} with subc {} at {label}", auth.daemon_ver);
    ModuleConn::registered(stream, decoder, hello_ack, auth.daemon_ver).map_err(ConnectError::Io)
}

fn control_flags() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

fn tcp_connect(host: &str, port: u16) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Reads until HELLO_ACK (or a refusal), answering Pings meanwhile. Bytes after the
/// acknowledgement stay in `decoder`.
fn await_hello_ack(stream: &mut TcpStream, decoder: &mut Decoder) -> Result<ModuleHelloAckBody, ConnectError> {
    let deadline = Instant::now() + HELLO_ACK_TIMEOUT;
    let mut buf = [0u8; 16 * 1024];
    let result = loop {
        if let Some(f) = decoder.next_frame().map_err(ConnectError::Protocol)? {
            match pre_ack(stream, f)? {
                Some(ack) => break Ok(ack),
                None => continue,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err(ConnectError::HelloAckTimeout);
        }
        stream.set_read_timeout(Some(left)).map_err(ConnectError::Io)?;
        match stream.read(&mut buf) {
            Ok(0) => break Err(ConnectError::ClosedBeforeAck),
            Ok(n) => decoder.feed(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                break Err(ConnectError::HelloAckTimeout)
            }
            Err(e) => break Err(ConnectError::Io(e)),
        }
    };
    stream.set_read_timeout(None).map_err(ConnectError::Io)?;
    result
}

fn pre_ack(stream: &mut TcpStream, f: Frame) -> Result<Option<ModuleHelloAckBody>, ConnectError> {
    let h = f.header;
    match h.ty {
        FrameType::HelloAck if h.corr == HELLO_CORR => {
            serde_json::from_slice(&f.body).map(Some).map_err(ConnectError::BadHelloAck)
        }
        FrameType::Error if h.channel == 0 && h.corr == HELLO_CORR => {
            let body = serde_json::from_slice(&f.body).unwrap_or_else(|_| {
                ErrorBody::new(
                    crate::wire::RefusalCode::InvalidHello.as_str(),
                    String::from_utf8_lossy(&f.body).into_owned(),
                )
            });
            Err(ConnectError::Refused(body))
        }
        FrameType::Ping if h.channel == 0 => {
            let pong = frame::encode(FrameType::Pong, h.flags, 0, 0, h.corr, &[]).expect("pong encodes");
            stream.write_all(&pong).map_err(ConnectError::Io)?;
            Ok(None)
        }
        ty => Err(ConnectError::UnexpectedFrame { ty, corr: h.corr }),
    }
}

impl ModuleConn {
    /// Wraps a socket whose registration is done; `decoder` holds any bytes read past HELLO_ACK.
    /// Public (hidden) so the fuzz targets drive the io thread from a scripted daemon.
    #[doc(hidden)]
    pub fn registered(
        stream: TcpStream,
        decoder: Decoder,
        hello_ack: ModuleHelloAckBody,
        daemon_ver: String,
    ) -> io::Result<ModuleConn> {
        let poll = mio::Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), io_thread::WAKER)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        let outbound = Outbound { tx, waker, shared: Arc::new(Shared::default()) };
        Ok(ModuleConn { stream, decoder, poll, rx, outbound, hello_ack, daemon_ver })
    }

    /// The daemon's registration answer.
    pub fn hello_ack(&self) -> &ModuleHelloAckBody {
        &self.hello_ack
    }

    /// The daemon version the handshake reported.
    pub fn daemon_ver(&self) -> &str {
        &self.daemon_ver
    }

    /// A handle for sending frames; valid before and after [`start`](Self::start).
    pub fn outbound(&self) -> Outbound {
        self.outbound.clone()
    }

    /// Starts the io thread, which serves until the connection ends.
    pub fn start<H: Handler, A: Authorizer>(self, handler: H, authorizer: A) -> io::Result<Running> {
        let ModuleConn { stream, decoder, poll, rx, outbound, .. } = self;
        let parts = io_thread::Parts { stream, decoder, poll, rx, shared: Arc::clone(&outbound.shared) };
        let join = io_thread::spawn(parts, handler, authorizer)?;
        Ok(Running { join, outbound })
    }
}

/// A served connection: its io thread and an [`Outbound`].
pub struct Running {
    join: JoinHandle<ConnectionEnd>,
    outbound: Outbound,
}

impl Running {
    pub fn outbound(&self) -> Outbound {
        self.outbound.clone()
    }

    /// Waits for the connection to end.
    pub fn join(self) -> ConnectionEnd {
        self.join.join().unwrap_or_else(|_| ConnectionEnd::Io(io::Error::other("the subc io thread panicked")))
    }
}

/// A health report helper: `ok` with `metrics`.
pub fn health_ok(metrics: serde_json::Value) -> HealthReport {
    let mut report = HealthReport::ok();
    report.metrics = Some(metrics);
    report
}
