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
