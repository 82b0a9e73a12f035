//! The link between the two stand-ins (format in the parent module's doc) and the [`Writer`]
//! both sockets of a side are written through (the link, and the serving side's consumer
//! connection to its daemon).
//!
//! Invariants:
//! - a frame is read whole or not at all: the declared length is checked against
//!   [`MAX_BODY`] before anything is allocated for it, and every malformed input is an
//!   `Err`, never a panic;
//! - only a [`Writer`]'s thread writes its socket, one whole frame per `write_all`, in the order
//!   frames were queued; nothing that queues a frame ever blocks;
//! - bytes queued with [`Writer::send_counted`] (requests, stream frames) are bounded by the
//!   writer's budget (a frame is refused [`Refused::Full`] past it unless the queue is empty);
//!   frames queued with [`Writer::send`] (control frames and terminals) are not, because their
//!   number is bounded by the route and request maps that produce them;
//! - [`Writer::close`] shuts the socket both ways, so the reader on the same socket ends too.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, RecvTimeoutError, Sender};
use serde::{Deserialize, Serialize};
use subc_protocol::{RouteTarget, MAX_FRAME_BODY_LEN};

/// The link protocol version in `hello`.
pub const VERSION: u32 = 1;
/// Bytes after the length: kind, rid, corr.
pub const HEADER: usize = 17;
/// The largest body: a subc request may be as large as a subc frame.
pub const MAX_BODY: usize = MAX_FRAME_BODY_LEN as usize;
/// A side sends a ping when it has sent nothing for this long.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// A side that sent nothing for this long is gone.
pub const SILENCE: Duration = Duration::from_secs(5);
/// Request and stream bytes that may wait for one socket.
pub const QUEUE_BYTES: usize = 32 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Ping = 0,
    Hello = 1,
    Bind = 2,
    Request = 3,
    Subscribe = 4,
    Cancel = 5,
    Close = 6,
    Response = 7,
    Error = 8,
    StreamData = 9,
    StreamEnd = 10,
    Closed = 11,
    Push = 12,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        Some(match b {
            0 => Ping,
            1 => Hello,
            2 => Bind,
            3 => Request,
            4 => Subscribe,
            5 => Cancel,
            6 => Close,
            7 => Response,
            8 => Error,
            9 => StreamData,
            10 => StreamEnd,
            11 => Closed,
            12 => Push,
            _ => return None,
        })
    }
}

/// One link frame.
#[derive(Debug, PartialEq)]
pub struct Frame {
    pub kind: Kind,
    pub rid: u64,
    pub corr: u64,
    pub body: Vec<u8>,
}

/// Encodes one frame; `None` when the body is over [`MAX_BODY`].
pub fn encode(kind: Kind, rid: u64, corr: u64, body: &[u8]) -> Option<Vec<u8>> {
    if body.len() > MAX_BODY {
        return None;
    }
    let mut out = Vec::with_capacity(4 + HEADER + body.len());
    out.extend_from_slice(&((HEADER + body.len()) as u32).to_le_bytes());
    out.push(kind as u8);
    out.extend_from_slice(&rid.to_le_bytes());
    out.extend_from_slice(&corr.to_le_bytes());
    out.extend_from_slice(body);
    Some(out)
}

/// Reads one whole frame; `Ok(None)` at a clean end of stream (between frames).
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if !(HEADER..=HEADER + MAX_BODY).contains(&len) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a link frame of {len} bytes")));
    }
    let mut head = [0u8; HEADER];
    r.read_exact(&mut head)?;
    let kind = Kind::from_u8(head[0])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("link frame kind {}", head[0])))?;
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let mut body = vec![0u8; len - HEADER];
    r.read_exact(&mut body)?;
    Ok(Some(Frame { kind, rid: word(1), corr: word(9), body }))
}

/// `hello`, both ways (the serving side adds its exports).
#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    pub v: u32,
    pub machine_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exports: Vec<Export>,
}

/// One exported module: its name on the serving side and its manifest there.
#[derive(Debug, Serialize, Deserialize)]
pub struct Export {
    pub module: String,
    pub manifest: serde_json::Value,
}

/// `bind`: what the origin's daemon stamped on a relayed route, as the serving side opens it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Bind {
    /// The exported module (its name on the serving side).
    pub module: String,
    /// The origin bind's target (its kind is kept, its module id is the `fed:` one).
    pub target: RouteTarget,
    pub harness: String,
    pub session: String,
    pub root: String,
    /// The origin's principal, spelled `reserved:<id>`, `direct` or `unverified`.
    pub principal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_versions: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_capabilities: Option<Vec<String>>,
}

/// `closed`: why the serving side's route is gone.
#[derive(Debug, Serialize, Deserialize)]
pub struct Closed {
    pub code: String,
    pub message: String,
}

/// Why a frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The counted budget is spent.
    Full,
    /// The socket is closed.
    Closed,
}

struct State {
    queued: AtomicUsize,
    closed: AtomicBool,
    budget: usize,
}

/// The one writer of a socket: a thread fed by an in-order queue. Cheap to clone.
#[derive(Clone)]
pub struct Writer {
    tx: Sender<(Vec<u8>, bool)>,
    state: Arc<State>,
    sock: Arc<TcpStream>,
}

impl Writer {
    /// Starts the writer of `stream`. With `heartbeat`, a link `ping` goes out whenever nothing
    /// else did for that long.
    pub fn spawn(stream: TcpStream, name: &str, budget: usize, heartbeat: Option<Duration>) -> io::Result<Writer> {
        let sock = Arc::new(stream.try_clone()?);
        let state = Arc::new(State { queued: AtomicUsize::new(0), closed: AtomicBool::new(false), budget });
        let (tx, rx) = unbounded::<(Vec<u8>, bool)>();
        let (st, shut) = (Arc::clone(&state), Arc::clone(&sock));
        let ping = encode(Kind::Ping, 0, 0, &[]).unwrap_or_default();
        let tick = heartbeat.unwrap_or(Duration::from_secs(1));
        std::thread::Builder::new().name(name.into()).spawn(move || {
            let mut stream = stream;
            loop {
                if st.closed.load(Ordering::Acquire) {
                    break;
                }
                let written = match rx.recv_timeout(tick) {
                    Ok((bytes, counted)) => {
                        let r = stream.write_all(&bytes);
                        if counted {
                            st.queued.fetch_sub(bytes.len(), Ordering::AcqRel);
                        }
                        r
                    }
                    Err(RecvTimeoutError::Timeout) if heartbeat.is_some() => stream.write_all(&ping),
                    Err(RecvTimeoutError::Timeout) => Ok(()),
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                if let Err(e) = written {
                    log::info!("writer ends: {e}");
                    break;
                }
            }
            st.closed.store(true, Ordering::Release);
            let _ = shut.shutdown(Shutdown::Both);
        })?;
        Ok(Writer { tx, state, sock })
    }

    /// Queues a frame outside the budget (control frames, terminals).
    pub fn send(&self, bytes: Vec<u8>) -> Result<(), Refused> {
        self.queue(bytes, false)
    }

    /// Queues a frame inside the budget (a request, a stream frame).
    pub fn send_counted(&self, bytes: Vec<u8>) -> Result<(), Refused> {
        self.queue(bytes, true)
    }

    fn queue(&self, bytes: Vec<u8>, counted: bool) -> Result<(), Refused> {
        if self.is_closed() {
            return Err(Refused::Closed);
        }
        if counted {
            let len = bytes.len();
            let before = self.state.queued.fetch_add(len, Ordering::AcqRel);
            if before > 0 && before + len > self.state.budget {
                self.state.queued.fetch_sub(len, Ordering::AcqRel);
                return Err(Refused::Full);
            }
        }
        let len = bytes.len();
        self.tx.send((bytes, counted)).map_err(|_| {
            if counted {
                self.state.queued.fetch_sub(len, Ordering::AcqRel);
            }
            Refused::Closed
        })
    }

    pub fn is_closed(&self) -> bool {
        self.state.closed.load(Ordering::Acquire)
    }

    /// Stops writing and shuts the socket both ways (its reader sees the end at once).
    pub fn close(&self) {
        self.state.closed.store(true, Ordering::Release);
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let bytes = encode(Kind::Request, 7, 9, b"{\"x\":1}").unwrap();
        let mut r = &bytes[..];
        let f = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(f, Frame { kind: Kind::Request, rid: 7, corr: 9, body: b"{\"x\":1}".to_vec() });
        assert!(read_frame(&mut r).unwrap().is_none(), "a clean end between frames");
        // A length under the header, a kind nobody speaks, a cut frame, a huge declared length.
        for bad in [
            Some(vec![3, 0, 0, 0, 1, 2, 3]),
            encode(Kind::Ping, 0, 0, &[]).map(|mut b| {
                b[4] = 99;
                b
            }),
            Some(bytes[..bytes.len() - 1].to_vec()),
            Some(u32::MAX.to_le_bytes().to_vec()),
        ]
        .into_iter()
        .flatten()
        {
            assert!(read_frame(&mut &bad[..]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bind_keeps_only_what_is_given() {
        let b = Bind {
            module: "broca".into(),
            target: RouteTarget::ManagementSurface { module_id: "fed:aa:broca".into() },
            harness: "h".into(),
            session: "s".into(),
            root: "/".into(),
            principal: "direct".into(),
            role_versions: None,
            consumer_capabilities: None,
        };
        let v = serde_json::to_value(&b).unwrap();
        assert!(v.get("role_versions").is_none());
        assert_eq!(v["target"]["kind"], "management_surface");
    }
}
