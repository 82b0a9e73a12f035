//! The writer thread of one consumer connection and the two lanes that feed it.
//!
//! Invariants:
//! - the writer thread is the only code that writes to the socket, one `write_all` per whole
//!   encoded frame; no lock is held while it writes, so nothing another thread needs waits on the
//!   socket;
//! - the **control lane** carries the frames the reader thread originates (PONG, reverse-request
//!   refusals) and route GOODBYEs; everything enqueues on it with `try_send` and never blocks. It
//!   holds at most [`CONTROL_LANE_FRAMES`] frames; a frame that finds it full is dropped and
//!   counted (the lane is only full when the socket has not drained for a long time);
//! - the **data lane** carries Requests and Cancels in FIFO order (a Cancel never overtakes its
//!   Request). It holds at most [`OUTBOUND_QUEUE_FRAMES`] frames and [`OUTBOUND_QUEUE_BYTES`]
//!   bytes (a single larger frame is admitted only into an empty lane); a caller that finds it
//!   full gets [`CallError::Backpressure`];
//! - between two frames the writer always takes a waiting control frame first, so a PONG waits
//!   behind at most the one data frame being written, never behind the data lane's backlog;
//! - a write error ends the connection (the socket is shut down, so the reader sees the end).

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, select_biased, Receiver, Sender, TrySendError};

use super::CallError;

/// Frames (Requests, Cancels) that may wait for the writer before callers get `Backpressure`.
pub const OUTBOUND_QUEUE_FRAMES: usize = 1024;
/// Bytes of queued data frames past which callers get `Backpressure`.
pub const OUTBOUND_QUEUE_BYTES: usize = 32 * 1024 * 1024;
/// Control frames (PONG, refusals, GOODBYE) that may wait for the writer.
pub const CONTROL_LANE_FRAMES: usize = 1024;
/// How often an idle writer looks at whether its connection has ended.
const WRITER_TICK: Duration = Duration::from_millis(250);

/// State the writer, the reader and callers share.
#[derive(Debug)]
pub(super) struct Wire {
    /// A handle on the socket used only to shut it down (never written through).
    socket: TcpStream,
    closed: AtomicBool,
    queued_bytes: AtomicUsize,
}

impl Wire {
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Ends the connection: both directions of the socket are shut, so the reader's `read`
    /// returns and the writer's next `write` fails.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

/// The enqueueing side of both lanes.
#[derive(Debug)]
pub(super) struct Lanes {
    control: Sender<Vec<u8>>,
    data: Sender<Vec<u8>>,
    pub wire: Arc<Wire>,
}

impl Lanes {
    /// Enqueues a control frame without blocking; false if the lane is full or closed.
    pub fn control(&self, frame: Vec<u8>) -> bool {
        !self.wire.is_closed() && self.control.try_send(frame).is_ok()
    }

    /// Enqueues a data frame without blocking.
    pub fn data(&self, frame: Vec<u8>) -> Result<(), CallError> {
        if self.wire.is_closed() {
            return Err(CallError::Closed);
        }
        let len = frame.len();
        let queued = self.wire.queued_bytes.fetch_add(len, Ordering::AcqRel);
        if queued > 0 && queued + len > OUTBOUND_QUEUE_BYTES {
            self.wire.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            return Err(CallError::Backpressure { queued_frames: self.data.len(), queued_bytes: queued });
        }
        match self.data.try_send(frame) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.wire.queued_bytes.fetch_sub(len, Ordering::AcqRel);
                match e {
                    TrySendError::Full(_) => {
                        Err(CallError::Backpressure { queued_frames: self.data.len(), queued_bytes: queued })
                    }
                    TrySendError::Disconnected(_) => Err(CallError::Closed),
                }
            }
        }
    }

    /// Data frames waiting for the writer.
    pub fn queued_frames(&self) -> usize {
        self.data.len()
    }
}

/// Starts the writer thread on `stream` (the connection's write side).
pub(super) fn start(stream: TcpStream) -> std::io::Result<Lanes> {
    let socket = stream.try_clone()?;
    let wire = Arc::new(Wire { socket, closed: AtomicBool::new(false), queued_bytes: AtomicUsize::new(0) });
    let (control, control_rx) = bounded(CONTROL_LANE_FRAMES);
    let (data, data_rx) = bounded(OUTBOUND_QUEUE_FRAMES);
    let writing = Arc::clone(&wire);
    std::thread::Builder::new()
        .name("broca-consumer-w".into())
        .spawn(move || write_loop(stream, &control_rx, &data_rx, &writing))?;
    Ok(Lanes { control, data, wire })
}

fn write_loop(mut stream: TcpStream, control: &Receiver<Vec<u8>>, data: &Receiver<Vec<u8>>, wire: &Wire) {
    loop {
        if wire.is_closed() {
            break;
        }
        let (frame, charged) = match control.try_recv() {
            Ok(frame) => (frame, false),
            Err(_) => select_biased! {
                recv(control) -> frame => match frame {
                    Ok(frame) => (frame, false),
                    Err(_) => break,
                },
                recv(data) -> frame => match frame {
                    Ok(frame) => (frame, true),
                    Err(_) => break,
                },
                default(WRITER_TICK) => continue,
            },
        };
        let result = stream.write_all(&frame);
        if charged {
            crate::failpoint!("tool.after_request_sent");
            wire.queued_bytes.fetch_sub(frame.len(), Ordering::AcqRel);
        }
        if let Err(e) = result {
            if !wire.is_closed() {
                log::warn!(target: "broca::subc", "consumer connection: write failed, closing: {e}");
            }
            break;
        }
    }
    wire.close();
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    use subc_protocol::{Flags, FrameType, Priority};

    use super::*;
    use crate::subc::frame::{self, Decoder};

    fn small_buffer(stream: &TcpStream, option: libc::c_int) {
        let size: libc::c_int = 16 << 10;
        // SAFETY: a valid socket descriptor and a correctly sized option value.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                &size as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
    }

    fn encoded(ty: FrameType, corr: u64, body: &[u8]) -> Vec<u8> {
        frame::encode(ty, Flags::new(false, Priority::Interactive, false), 1, 1, corr, body).unwrap()
    }

    /// The writer is stuck inside a large write (the peer is not reading and the socket buffers
    /// are tiny) with more data frames queued; a control frame enqueued then goes out right after
    /// the frame being written, ahead of the queued ones.
    #[test]
    fn a_control_frame_overtakes_the_queued_data_frames() {
        const QUEUED: u64 = 12;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        ours.set_nodelay(true).unwrap();
        small_buffer(&ours, libc::SO_SNDBUF);
        small_buffer(&peer, libc::SO_RCVBUF);
        let lanes = start(ours).unwrap();
        let body = vec![7u8; 256 << 10];
        for corr in 0..QUEUED {
            lanes.data(encoded(FrameType::Request, corr, &body)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(lanes.queued_frames() as u64 >= QUEUED - 2, "the writer is stuck in the first frames");
        assert!(lanes.control(encoded(FrameType::Pong, 999, &[])));

        let mut decoder = Decoder::new();
        let mut order = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        while order.len() < QUEUED as usize + 1 {
            let n = peer.read(&mut buf).unwrap();
            assert!(n > 0, "the writer ended early");
            decoder.feed(&buf[..n]);
            while let Some(f) = decoder.next_frame().unwrap() {
                order.push((f.header.ty, f.header.corr));
            }
        }
        let pong_at = order.iter().position(|(ty, _)| *ty == FrameType::Pong).unwrap();
        assert!(pong_at <= 2, "the PONG went out after {pong_at} data frames: {order:?}");
        let data: Vec<u64> = order.iter().filter(|(ty, _)| *ty == FrameType::Request).map(|(_, c)| *c).collect();
        assert_eq!(data, (0..QUEUED).collect::<Vec<_>>(), "data frames keep their order");
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while lanes.wire.queued_bytes.load(Ordering::Acquire) != 0 {
            assert!(std::time::Instant::now() < until, "every written byte is released");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_full_data_lane_is_backpressure_and_a_closed_one_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_peer, _) = listener.accept().unwrap();
        small_buffer(&ours, libc::SO_SNDBUF);
        let lanes = start(ours).unwrap();
        // Past the byte budget (the peer never reads): refused with the counts, nothing queued.
        let big = vec![0u8; OUTBOUND_QUEUE_BYTES / 4];
        let mut refused = None;
        for corr in 0..8 {
            if let Err(e) = lanes.data(encoded(FrameType::Request, corr, &big)) {
                refused = Some(e);
                break;
            }
        }
        match refused {
            Some(CallError::Backpressure { queued_bytes, .. }) => assert!(queued_bytes > OUTBOUND_QUEUE_BYTES / 2),
            other => panic!("expected Backpressure, got {other:?}"),
        }
        // A header-only frame still fits the frame bound but not the byte budget once over it.
        lanes.wire.close();
        assert!(matches!(lanes.data(encoded(FrameType::Cancel, 1, &[])), Err(CallError::Closed)));
        assert!(!lanes.control(encoded(FrameType::Pong, 1, &[])));
    }
}
