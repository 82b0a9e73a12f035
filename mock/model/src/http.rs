//! A minimal HTTP/1.1 server side: request bodies by `Content-Length` only; no pipelining.
//!
//! A connection is kept alive (HTTP/1.1's default) unless the client sends `Connection: close`
//! or the server is set not to: then replies carry `Content-Length` and streams are chunked, so
//! a stream's end is its last chunk. On a closing connection a stream has no length and ends
//! when the connection closes. Either way a scripted disconnect cuts the connection, which the
//! client sees as a truncated stream.

use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::render::Piece;
use super::script::{WriteMode, NOW_US_TOKEN};
use super::tls::Conn;

/// The largest request head (request line and headers) accepted; larger is refused 431.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// The largest request body accepted; larger is refused 413.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// One parsed request.
pub(crate) struct Request {
    pub method: String,
    /// The request target as sent, query included.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(self.target.as_str(), |(p, _)| p)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A whole (non-streamed) response.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(status: u16, body: &Value) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
        }
    }

    pub fn empty(status: u16) -> Reply {
        Reply { status, headers: Vec::new(), body: Vec::new() }
    }

    /// A JSON `{"error": message}` reply for mock-level refusals (not a provider's shape).
    pub fn refusal(status: u16, message: &str) -> Reply {
        Reply::json(status, &serde_json::json!({ "error": message }))
    }
}

pub(crate) enum Incoming {
    Request(Request),
    /// The request cannot be served; answer this, then drain and close.
    Refused(Reply),
    /// The peer closed before sending a request head.
    Closed,
}

/// Reads one request. A `100 Continue` is sent when the client asks for it.
pub(crate) fn read_request(stream: &mut (impl Read + Write)) -> io::Result<Incoming> {
    let mut buf = Vec::with_capacity(8 << 10);
    let mut chunk = [0u8; 8 << 10];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(Incoming::Refused(Reply::refusal(431, "request head exceeds 64 KiB")));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(Incoming::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let mut request = match parse_head(&buf[..head_end]) {
        Ok(r) => r,
        Err(reply) => return Ok(Incoming::Refused(reply)),
    };
    let length = match body_length(&request) {
        Ok(n) => n,
        Err(reply) => return Ok(Incoming::Refused(reply)),
    };
    let mut body = buf.split_off(head_end + 4);
    if body.len() < length && request.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    while body.len() < length {
        let n = stream.read(&mut chunk[..(length - body.len()).min(8 << 10)])?;
        if n == 0 {
            return Ok(Incoming::Closed);
        }
        body.extend_from_slice(&chunk[..n]);
    }
    // No pipelining: anything past the declared length is not ours.
    body.truncate(length);
    request.body = body;
    Ok(Incoming::Request(request))
}

fn parse_head(head: &[u8]) -> Result<Request, Reply> {
    let bad = |why: &str| Reply::refusal(400, why);
    let text = std::str::from_utf8(head).map_err(|_| bad("request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(bad("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(bad("malformed request line"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line.split_once(':').ok_or_else(|| bad("malformed header line"))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(Request { method: method.into(), target: target.into(), headers, body: Vec::new() })
}

fn body_length(request: &Request) -> Result<usize, Reply> {
    if request.header("transfer-encoding").is_some() {
        return Err(Reply::refusal(411, "broca-mock reads Content-Length bodies only"));
    }
    let mut length: Option<usize> = None;
    for (_, v) in request.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        let n: usize = v.parse().map_err(|_| Reply::refusal(400, "bad Content-Length"))?;
        if length.is_some_and(|l| l != n) {
            return Err(Reply::refusal(400, "conflicting Content-Length headers"));
        }
        length = Some(n);
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY_BYTES {
        return Err(Reply::refusal(413, "request body exceeds 64 MiB"));
    }
    Ok(length)
}

/// After a refusal: stop writing, then discard what the client is still sending (bounded in
/// bytes and time) so it reads our reply instead of a connection reset.
pub(crate) fn drain(stream: &mut Conn) {
    let _ = stream.tcp().shutdown(Shutdown::Write);
    let _ = stream.tcp().set_read_timeout(Some(Duration::from_millis(500)));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sink = [0u8; 64 << 10];
    let mut total = 0usize;
    while Instant::now() < deadline && total <= 2 * MAX_BODY_BYTES {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// Whether scripted headers leave the framing to the server: a script that sets its own
/// `Content-Length`, `Transfer-Encoding` or `Connection` gets a closing connection, so a wrong
/// length cannot desynchronize the next request on it.
pub(crate) fn framing_free<'a>(names: impl IntoIterator<Item = &'a String>) -> bool {
    let framing = ["content-length", "transfer-encoding", "connection"];
    !names.into_iter().any(|k| framing.iter().any(|f| k.eq_ignore_ascii_case(f)))
}

/// Writes the status line and headers; `extra` replaces same-named defaults. `keep` says the
/// connection stays open after this response (`Connection: keep-alive`, else `close`).
fn write_head(
    out: &mut impl Write,
    status: u16,
    defaults: &[(String, String)],
    extra: &[(String, String)],
    keep: bool,
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    let overridden = |name: &str| extra.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    for (k, v) in defaults.iter().filter(|(k, _)| !overridden(k)).chain(extra) {
        if !k.eq_ignore_ascii_case("connection") {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str(if keep { "Connection: keep-alive\r\n\r\n" } else { "Connection: close\r\n\r\n" });
    out.write_all(head.as_bytes())
}

/// Writes a whole response (`keep`: the connection stays open after it).
pub(crate) fn write_reply(out: &mut impl Write, reply: &Reply, keep: bool) -> io::Result<()> {
    let mut defaults = Vec::new();
    if reply.status != 204 && reply.status >= 200 {
        defaults.push(("Content-Length".to_string(), reply.body.len().to_string()));
    }
    write_head(out, reply.status, &defaults, &reply.headers, keep)?;
    out.write_all(&reply.body)?;
    out.flush()
}

/// Writes a 200 event-stream head; with `keep` the body is chunked (write it through
/// [`Chunked`]).
pub(crate) fn write_stream_head(out: &mut impl Write, extra: &[(String, String)], keep: bool) -> io::Result<()> {
    let mut defaults = vec![
        ("Content-Type".to_string(), "text/event-stream; charset=utf-8".to_string()),
        ("Cache-Control".to_string(), "no-cache".to_string()),
    ];
    if keep {
        defaults.push(("Transfer-Encoding".to_string(), "chunked".to_string()));
    }
    write_head(out, 200, &defaults, extra, keep)?;
    out.flush()
}

/// A chunked body writer: each non-empty write is one chunk, written with one call to the
/// inner writer (so `split_every` still reaches the client as separate pieces).
pub(crate) struct Chunked<W: Write>(pub W);

impl<W: Write> Chunked<W> {
    /// The last chunk: the stream is complete and the connection reusable.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.0.write_all(b"0\r\n\r\n")?;
        self.0.flush()
    }
}

impl<W: Write> Write for Chunked<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut frame = format!("{:x}\r\n", buf.len()).into_bytes();
        frame.extend_from_slice(buf);
        frame.extend_from_slice(b"\r\n");
        self.0.write_all(&frame)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// How a stream write ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Complete,
    /// The script asked to close the connection here.
    Disconnect,
    /// The server is shutting down.
    Stopped,
}

/// Writes rendered pieces in `mode`, honouring delays. With `stamp`, every [`NOW_US_TOKEN`]
/// in the bytes is replaced just before they are written (see [`stamp_now`]); without it the
/// bytes are never scanned.
pub(crate) fn write_pieces(
    out: &mut impl Write,
    pieces: &[Piece],
    mode: &WriteMode,
    stamp: bool,
    stopping: &Stopping,
) -> io::Result<Ended> {
    let mut pending = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Bytes(bytes) if *mode == WriteMode::PerEvent => {
                out.write_all(&stamped(bytes, stamp))?;
                out.flush()?;
            }
            Piece::Bytes(bytes) => pending.extend_from_slice(bytes),
            Piece::Delay(ms) => {
                write_pending(out, &mut pending, mode, stamp, stopping)?;
                if !pause(*ms, stopping) {
                    return Ok(Ended::Stopped);
                }
            }
            Piece::Disconnect => {
                write_pending(out, &mut pending, mode, stamp, stopping)?;
                return Ok(Ended::Disconnect);
            }
        }
    }
    write_pending(out, &mut pending, mode, stamp, stopping)?;
    Ok(Ended::Complete)
}

/// Writes the bytes gathered since the last delay; they are stamped once, before any `split`
/// cut, so a token is never cut in two.
fn write_pending(
    out: &mut impl Write,
    pending: &mut Vec<u8>,
    mode: &WriteMode,
    stamp: bool,
    stopping: &Stopping,
) -> io::Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let bytes = stamped(pending, stamp);
    match mode {
        WriteMode::Split { every, pause_ms } => {
            for piece in bytes.chunks(*every) {
                out.write_all(piece)?;
                out.flush()?;
                pause(*pause_ms, stopping);
            }
        }
        _ => {
            out.write_all(&bytes)?;
            out.flush()?;
        }
    }
    drop(bytes);
    pending.clear();
    Ok(())
}

fn stamped(bytes: &[u8], stamp: bool) -> Cow<'_, [u8]> {
    if stamp {
        stamp_now(bytes)
    } else {
        Cow::Borrowed(bytes)
    }
}

/// `bytes` with every [`NOW_US_TOKEN`] replaced by the current Unix time in microseconds, as
/// exactly 16 decimal digits (zero-padded), one reading of the clock for the whole call. Each
/// token grows its piece by a fixed 6 bytes, so the stream's length does not depend on the time.
pub(crate) fn stamp_now(bytes: &[u8]) -> Cow<'_, [u8]> {
    let token = NOW_US_TOKEN.as_bytes();
    let find = |from: usize| bytes[from..].windows(token.len()).position(|w| w == token).map(|i| i + from);
    let Some(first) = find(0) else { return Cow::Borrowed(bytes) };
    let micros = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    // 16 digits hold every instant until the year 2286.
    let now = format!("{:016}", micros.min(9_999_999_999_999_999));
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let (mut at, mut next) = (0, Some(first));
    while let Some(i) = next {
        out.extend_from_slice(&bytes[at..i]);
        out.extend_from_slice(now.as_bytes());
        at = i + token.len();
        next = find(at);
    }
    out.extend_from_slice(&bytes[at..]);
    Cow::Owned(out)
}

/// The server's stop flag, with a bell so a paused stream sleeps its whole delay and still
/// wakes the moment the server stops (1,000 paced streams polling a flag every 20 ms were
/// 50,000 wake-ups a second, on the cores broca is measured on).
#[derive(Default)]
pub(crate) struct Stopping {
    flag: AtomicBool,
    lock: parking_lot::Mutex<()>,
    bell: parking_lot::Condvar,
}

impl Stopping {
    #[cfg(test)]
    pub(crate) fn new(stopped: bool) -> Stopping {
        Stopping { flag: AtomicBool::new(stopped), ..Stopping::default() }
    }

    pub(crate) fn load(&self, order: Ordering) -> bool {
        self.flag.load(order)
    }

    /// Sets the flag and wakes every paused stream.
    pub(crate) fn stop(&self) {
        let _guard = self.lock.lock();
        self.flag.store(true, Ordering::SeqCst);
        self.bell.notify_all();
    }
}

/// Sleeps `ms`, waking early (returning false) when the server stops.
pub(crate) fn pause(ms: u64, stopping: &Stopping) -> bool {
    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut guard = stopping.lock.lock();
    loop {
        if stopping.flag.load(Ordering::SeqCst) {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        stopping.bell.wait_until(&mut guard, deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces() -> Vec<Piece> {
        vec![
            Piece::Bytes(b"data: a\n\n".to_vec()),
            Piece::Bytes(b"data: b\n\n".to_vec()),
            Piece::Delay(1),
            Piece::Bytes(b"data: c\n\n".to_vec()),
            Piece::Disconnect,
            Piece::Bytes(b"data: never\n\n".to_vec()),
        ]
    }

    /// Records each write separately.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn written(mode: WriteMode) -> (Vec<Vec<u8>>, Ended) {
        let mut w = Writes::default();
        let ended = write_pieces(&mut w, &pieces(), &mode, false, &Stopping::new(false)).unwrap();
        (w.0, ended)
    }

    #[test]
    fn write_modes_cut_the_same_bytes_differently() {
        let (per_event, ended) = written(WriteMode::PerEvent);
        assert_eq!(ended, Ended::Disconnect);
        assert_eq!(per_event.len(), 3);
        let (coalesced, _) = written(WriteMode::Coalesce);
        assert_eq!(coalesced, vec![b"data: a\n\ndata: b\n\n".to_vec(), b"data: c\n\n".to_vec()]);
        let (split, _) = written(WriteMode::Split { every: 4, pause_ms: 0 });
        assert!(split.iter().all(|w| w.len() <= 4));
        assert_eq!(split.concat(), per_event.concat());
        assert_eq!(per_event.concat(), b"data: a\n\ndata: b\n\ndata: c\n\n");
    }

    #[test]
    fn stopping_cuts_a_delay_short() {
        let mut w = Writes::default();
        let ended = write_pieces(&mut w, &[Piece::Delay(60_000)], &WriteMode::PerEvent, false, &Stopping::new(true));
        assert_eq!(ended.unwrap(), Ended::Stopped);
    }

    fn now_us() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
    }

    /// The 16-digit stamps in `text`, where the token was.
    fn stamps(text: &str) -> Vec<u64> {
        text.split("t=").skip(1).map(|rest| rest[..16].parse().unwrap()).collect()
    }

    #[test]
    fn the_now_token_is_stamped_when_written() {
        let token_pieces = || {
            vec![
                Piece::Bytes(b"data: {\"t\":\"t={{now_us}};t={{now_us}};\"}\n\n".to_vec()),
                Piece::Delay(2),
                Piece::Bytes(b"data: {\"t\":\"t={{now_us}};{{now\"}\n\n".to_vec()),
            ]
        };
        let original: usize = token_pieces().iter().map(|p| if let Piece::Bytes(b) = p { b.len() } else { 0 }).sum();
        for mode in [WriteMode::PerEvent, WriteMode::Coalesce, WriteMode::Split { every: 5, pause_ms: 0 }] {
            let before = now_us();
            let mut w = Writes::default();
            write_pieces(&mut w, &token_pieces(), &mode, true, &Stopping::new(false)).unwrap();
            let after = now_us();
            let text = String::from_utf8(w.0.concat()).unwrap();
            assert!(!text.contains("{{now_us}}") && text.contains(";{{now\""), "{mode:?}: {text}");
            // Three tokens, each 10 bytes become 16.
            assert_eq!(text.len(), original + 3 * 6, "{mode:?}: {text}");
            let s = stamps(&text);
            assert_eq!(s.len(), 3, "{text}");
            assert!(s.iter().all(|t| (before..=after).contains(t)), "{s:?} not in {before}..={after}");
            assert_eq!(s[0], s[1], "one clock reading per write");
            assert!(s[2] >= s[1] + 2_000, "the piece after the delay is stamped when written: {s:?}");
            assert!(text.split("t=").skip(1).all(|rest| rest.as_bytes()[16] == b';'), "{text}");
        }
        // Without the flag the bytes go out as scripted.
        let mut w = Writes::default();
        write_pieces(&mut w, &token_pieces(), &WriteMode::PerEvent, false, &Stopping::new(false)).unwrap();
        assert_eq!(w.0.concat().len(), original);
        assert!(matches!(stamp_now(b"no token here"), Cow::Borrowed(_)));
        assert_eq!(stamp_now(b"{{now_us}}").len(), 16);
    }

    #[test]
    fn heads_parse_and_refuse() {
        let r = parse_head(b"POST /v1/messages?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3").ok().unwrap();
        assert_eq!((r.method.as_str(), r.path(), r.header("content-length")), ("POST", "/v1/messages", Some("3")));
        assert_eq!(body_length(&r).ok(), Some(3));
        assert!(parse_head(b"GARBAGE").is_err());
        assert!(parse_head(b"GET / HTTP/1.1\r\nno colon").is_err());
        let big = parse_head(format!("POST / HTTP/1.1\r\nContent-Length: {}", MAX_BODY_BYTES + 1).as_bytes()).ok();
        assert_eq!(body_length(&big.unwrap()).err().map(|r| r.status), Some(413));
        let chunked = parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked").ok().unwrap();
        assert_eq!(body_length(&chunked).err().map(|r| r.status), Some(411));
    }

    #[test]
    fn script_headers_replace_defaults() {
        let mut out = Vec::new();
        let reply = Reply {
            status: 429,
            headers: vec![("content-length".into(), "99".into()), ("retry-after".into(), "1".into())],
            body: b"{}".to_vec(),
        };
        write_reply(&mut out, &reply, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(text.contains("retry-after: 1\r\n") && text.contains("content-length: 99\r\n"));
        assert!(!text.contains("Content-Length: 2"));
        assert!(text.ends_with("Connection: close\r\n\r\n{}"));
        assert!(!framing_free(reply.headers.iter().map(|(k, _)| k)));
        assert!(framing_free(&["retry-after".to_string()]));
    }

    #[test]
    fn chunked_bodies_frame_each_write() {
        let mut out = Vec::new();
        let mut body = Chunked(&mut out);
        body.write_all(b"data: a\n\n").unwrap();
        body.write_all(b"").unwrap();
        body.write_all(&[b'x'; 17]).unwrap();
        body.finish().unwrap();
        let x = "x".repeat(17);
        assert_eq!(String::from_utf8(out).unwrap(), format!("9\r\ndata: a\n\n\r\n11\r\n{x}\r\n0\r\n\r\n"));
    }
}
