//! A publish-only client of the NATS text protocol, enough for plain hints: `INFO` in,
//! `CONNECT` + `PING` out, `PONG` (or `-ERR`) back, then `PUB`s. A reader thread per connection
//! answers the server's keep-alive `PING`s and marks the connection dead on `-ERR`, EOF or a
//! read error, so a hint is never written into a connection the server already closed.
//!
//! Invariants: every line read is bounded ([`MAX_LINE`]); a server asking for credentials is
//! refused before `CONNECT` (broca holds none); nothing here panics on what the server sends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Deserialize;

/// The longest protocol line read (an `INFO` with a long `connect_urls` list stays below it).
const MAX_LINE: u64 = 64 * 1024;
/// How long connecting, and the `CONNECT`/`PONG` handshake, may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one `PUB` write may block before the connection is given up.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a connection could not be made or used.
#[derive(Debug)]
pub enum BusError {
    Io(std::io::Error),
    /// The server spoke something other than the NATS protocol where a line was expected.
    Protocol(String),
    /// The server refused the connection or a publish (`-ERR '...'`).
    Refused(String),
    /// The server requires credentials; broca's bus configuration carries none.
    AuthRequired,
    /// A payload above the server's `max_payload`.
    TooLarge {
        bytes: usize,
        max: usize,
    },
    /// The reader saw the connection end (EOF, `-ERR`, or a read error).
    Closed,
}

impl std::fmt::Display for BusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusError::Io(e) => write!(f, "{e}"),
            BusError::Protocol(what) => write!(f, "not a NATS server: {what}"),
            BusError::Refused(why) => write!(f, "the server refused: {why}"),
            BusError::AuthRequired => f.write_str("the server requires credentials, and broca's step_events has none"),
            BusError::TooLarge { bytes, max } => write!(f, "a {bytes}-byte payload is over the server's {max}"),
            BusError::Closed => f.write_str("the connection closed"),
        }
    }
}

impl From<std::io::Error> for BusError {
    fn from(e: std::io::Error) -> Self {
        BusError::Io(e)
    }
}

/// The members of the server's `INFO` this client reads.
#[derive(Debug, Deserialize)]
struct Info {
    #[serde(default)]
    auth_required: bool,
    #[serde(default = "default_max_payload")]
    max_payload: usize,
}

fn default_max_payload() -> usize {
    1024 * 1024
}

/// One live connection. Dropping it shuts the socket down, which ends its reader thread.
pub struct Connection {
    writer: Arc<Mutex<TcpStream>>,
    alive: Arc<AtomicBool>,
    max_payload: usize,
}

impl Connection {
    /// Connects to `addr` (`host:port`) and completes the handshake: the server's `PONG` to our
    /// `PING` proves it accepted `CONNECT`.
    pub fn open(addr: &str, name: &str) -> Result<Connection, BusError> {
        let target = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| BusError::Io(std::io::Error::other(format!("{addr} resolves to nothing"))))?;
        let stream = TcpStream::connect_timeout(&target, HANDSHAKE_TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let line = read_line(&mut reader)?;
        let info = line
            .strip_prefix("INFO ")
            .ok_or_else(|| BusError::Protocol(format!("expected INFO, got {:?}", clip(&line))))?;
        let info: Info = serde_json::from_str(info).map_err(|e| BusError::Protocol(format!("INFO: {e}")))?;
        if info.auth_required {
            return Err(BusError::AuthRequired);
        }
        let connect = serde_json::json!({
            "verbose": false, "pedantic": false, "tls_required": false, "name": name,
            "lang": "rust", "version": env!("CARGO_PKG_VERSION"), "protocol": 1, "echo": false,
        });
        let mut writer = stream;
        writer.write_all(format!("CONNECT {connect}\r\nPING\r\n").as_bytes())?;
        loop {
            let line = read_line(&mut reader)?;
            match line.as_str() {
                "PONG" => break,
                "PING" => writer.write_all(b"PONG\r\n")?,
                l if l.starts_with("-ERR") => return Err(BusError::Refused(clip(l).to_owned())),
                l if l.starts_with("INFO ") || l == "+OK" => {}
                l => return Err(BusError::Protocol(format!("unexpected {:?}", clip(l)))),
            }
        }
        reader.get_ref().set_read_timeout(None)?;
        let writer = Arc::new(Mutex::new(writer));
        let alive = Arc::new(AtomicBool::new(true));
        let (w, a) = (Arc::clone(&writer), Arc::clone(&alive));
        std::thread::Builder::new()
            .name("broca-bus-reader".into())
            .spawn(move || read_until_closed(reader, &w, &a))
            .map_err(BusError::Io)?;
        Ok(Connection { writer, alive, max_payload: info.max_payload })
    }

    /// Whether the reader still sees the connection open.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Publishes `payload` on `subject` (no reply subject). A write error, or a connection the
    /// reader saw close, ends this connection: the caller opens a new one.
    pub fn publish(&self, subject: &str, payload: &[u8]) -> Result<(), BusError> {
        if payload.len() > self.max_payload {
            return Err(BusError::TooLarge { bytes: payload.len(), max: self.max_payload });
        }
        if !self.alive() {
            return Err(BusError::Closed);
        }
        let mut frame = Vec::with_capacity(subject.len() + payload.len() + 32);
        frame.extend_from_slice(format!("PUB {subject} {}\r\n", payload.len()).as_bytes());
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        let written = self.writer.lock().write_all(&frame);
        written.map_err(|e| {
            self.alive.store(false, Ordering::Release);
            BusError::Io(e)
        })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        let _ = self.writer.lock().shutdown(std::net::Shutdown::Both);
    }
}

/// The reader thread: answers `PING`, logs `-ERR` (a refused publish names its subject), and
/// marks the connection dead when it ends.
fn read_until_closed(mut reader: BufReader<TcpStream>, writer: &Mutex<TcpStream>, alive: &AtomicBool) {
    loop {
        match read_line(&mut reader) {
            Ok(line) if line == "PING" => {
                if writer.lock().write_all(b"PONG\r\n").is_err() {
                    break;
                }
            }
            Ok(line) if line.starts_with("-ERR") => {
                log::warn!("bus: {}", clip(&line));
                // The server closes the connection after most errors; a permissions error
                // leaves it open, and later hints on other subjects may still pass.
            }
            Ok(_) => {}
            Err(e) => {
                if alive.load(Ordering::Acquire) {
                    log::info!("bus: connection ended: {e}");
                }
                break;
            }
        }
    }
    alive.store(false, Ordering::Release);
}

/// One `\r\n`-terminated line, without its terminator, at most [`MAX_LINE`] bytes.
fn read_line(reader: &mut BufReader<TcpStream>) -> Result<String, BusError> {
    let mut raw = Vec::new();
    let n = reader.by_ref().take(MAX_LINE).read_until(b'\n', &mut raw)?;
    if n == 0 {
        return Err(BusError::Closed);
    }
    if raw.last() != Some(&b'\n') {
        return Err(BusError::Protocol(format!("a line over {MAX_LINE} bytes")));
    }
    raw.pop();
    if raw.last() == Some(&b'\r') {
        raw.pop();
    }
    String::from_utf8(raw).map_err(|_| BusError::Protocol("a line that is not UTF-8".into()))
}

/// At most 200 bytes of a server line, for messages.
fn clip(line: &str) -> &str {
    let mut end = line.len().min(200);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}
