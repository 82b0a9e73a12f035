//! A hand-rolled target module (no `broca::subc` io thread, so it can send what that one never
//! does): it registers, acks every bind, answers every request `ok`, and on its first request
//! sends a PING on that request's route. It reports how many requests had arrived when the PONG
//! came back through the daemon from the consumer.
//!
//! It reads slowly ([`PER_REQUEST`] per request, through a small receive buffer), so the daemon
//! stops reading the consumer's connection and a backlog stays queued in the consumer itself
//! instead of vanishing into kernel buffers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use broca::subc::frame::{self, Decoder};
use broca::subc::{connection_file, handshake};
use crossbeam_channel::{Receiver, Sender};
use subc_protocol::session::ModuleControlResponse;
use subc_protocol::{Flags, Frame, FrameType, ModuleHelloBody, Priority, PROTOCOL_VERSION};

use crate::rig::tool_manifest;

/// The corr of the module's PING (its own corr space).
const PING_CORR: u64 = 4242;
/// How long the module spends on each request after the first.
const PER_REQUEST: Duration = Duration::from_millis(3);
/// The module socket's receive buffer.
const RCVBUF: libc::c_int = 64 << 10;

fn small_receive_buffer(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket descriptor and a correctly sized option value.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &RCVBUF as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}

#[derive(Debug)]
pub struct PongSeen {
    /// Requests the module had received when the PONG arrived.
    pub requests_before_pong: u64,
    pub round_trip: Duration,
}

fn flags() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

fn send(stream: &mut TcpStream, ty: FrameType, channel: u16, epoch: u32, corr: u64, body: &[u8]) {
    let bytes = frame::encode(ty, flags(), channel, epoch, corr, body).unwrap();
    stream.write_all(&bytes).unwrap();
}

/// Registers `id` and serves it on a thread; the PONG report arrives on the receiver.
pub fn start(conn_file: &Path, id: &str) -> Receiver<PongSeen> {
    let info = connection_file::read(conn_file).unwrap();
    let endpoint = &info.endpoints[0];
    let mut stream = TcpStream::connect((endpoint.bare_host(), endpoint.port)).unwrap();
    stream.set_nodelay(true).unwrap();
    small_receive_buffer(&stream);
    handshake::authenticate(&mut stream, &info, Duration::from_secs(2)).unwrap();
    let hello = ModuleHelloBody {
        manifest: tool_manifest(id, subc_protocol::manifest::Concurrency::StatelessParallel),
        protocol_ver: PROTOCOL_VERSION,
        control_ops: None,
        launch_nonce: None,
    };
    send(&mut stream, FrameType::Hello, 0, 0, 1, &serde_json::to_vec(&hello).unwrap());
    let mut frames = Frames { stream: stream.try_clone().unwrap(), decoder: Decoder::new() };
    let ack = frames.next().expect("HELLO_ACK");
    assert_eq!(ack.header.ty, FrameType::HelloAck, "registered: {}", String::from_utf8_lossy(&ack.body));
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || serve(stream, frames, &tx));
    rx
}

struct Frames {
    stream: TcpStream,
    decoder: Decoder,
}

impl Frames {
    fn next(&mut self) -> Option<Frame> {
        let mut buf = vec![0u8; 256 << 10];
        loop {
            if let Some(f) = self.decoder.next_frame().ok()? {
                return Some(f);
            }
            match self.stream.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.decoder.feed(&buf[..n]),
            }
        }
    }
}

fn serve(mut stream: TcpStream, mut frames: Frames, report: &Sender<PongSeen>) {
    let mut requests = 0u64;
    let mut pinged: Option<Instant> = None;
    while let Some(f) = frames.next() {
        let h = f.header;
        match (h.ty, h.channel) {
            (FrameType::Request, 0) => {
                // route.bind (the only control request this module is sent): ack it.
                let ack = serde_json::to_vec(&ModuleControlResponse::RouteBindAck {}).unwrap();
                send(&mut stream, FrameType::Response, 0, 0, h.corr, &ack);
            }
            (FrameType::Ping, 0) => send(&mut stream, FrameType::Pong, 0, 0, h.corr, &[]),
            (FrameType::Goodbye, 0) => return,
            (FrameType::Request, channel) => {
                requests += 1;
                if pinged.is_none() {
                    send(&mut stream, FrameType::Ping, channel, h.epoch, PING_CORR, &[]);
                    pinged = Some(Instant::now());
                } else {
                    std::thread::sleep(PER_REQUEST);
                }
                send(&mut stream, FrameType::Response, channel, h.epoch, h.corr, b"ok");
            }
            (FrameType::Pong, _) if h.corr == PING_CORR => {
                let round_trip = pinged.map(|t| t.elapsed()).unwrap_or_default();
                let _ = report.try_send(PongSeen { requests_before_pong: requests, round_trip });
            }
            _ => {}
        }
    }
}
