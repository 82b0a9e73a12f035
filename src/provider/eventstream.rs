//! The AWS event-stream framing (`application/vnd.amazon.eventstream`), as Bedrock's
//! `ConverseStream` sends it: bytes in (split anywhere), whole messages out as [`SseEvent`]s,
//! so a family's decoder reads them like SSE events.
//!
//! One message:
//!
//! ```text
//! total_length u32 BE | headers_length u32 BE | prelude_crc u32 BE (CRC-32 of the 8 bytes before)
//! headers (headers_length bytes) | payload | message_crc u32 BE (CRC-32 of everything before)
//! ```
//!
//! A header is `name_len u8 | name | type u8 | value`: type 0/1 (bool true/false, no value),
//! 2 byte, 3 i16, 4 i32, 5 i64, 6 byte array (u16 BE length), 7 string (u16 BE length), 8
//! timestamp (i64), 9 UUID (16 bytes). The event's name is its `:event-type` header for
//! `:message-type: event`, and its `:exception-type` (or `:error-code`) for an `exception` or
//! `error` message, prefixed `exception:`; the payload (JSON) is the event's data.
//!
//! Invariants: every CRC is checked (a mismatch is an error, never a decoded event); a message
//! is at most [`MAX_MESSAGE_BYTES`] and its prelude must be self-consistent before anything is
//! buffered past it; a payload that is not UTF-8 is an error. Nothing here panics on input.

use super::sse::{Framer, Pushed, SseError, SseEvent};

/// The largest message accepted (the service's limit is 16 MiB, as for an SSE event).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Prelude (12 bytes) plus the trailing CRC (4 bytes).
const OVERHEAD: usize = 16;

#[derive(Default)]
pub struct EventStreamFramer {
    buffer: Vec<u8>,
}

impl EventStreamFramer {
    pub fn new() -> EventStreamFramer {
        EventStreamFramer::default()
    }

    /// Feeds bytes; returns the messages completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Pushed, SseError> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Pushed::default();
        let mut at = 0;
        while let Some(len) = self.complete_at(at)? {
            out.events.push(message(&self.buffer[at..at + len])?);
            at += len;
        }
        self.buffer.drain(..at);
        Ok(out)
    }

    /// Ends the stream; bytes of an incomplete message are discarded (and counted).
    pub fn finish(&mut self) -> Result<Pushed, SseError> {
        let dropped = std::mem::take(&mut self.buffer).len() as u64;
        Ok(Pushed { discarded_bytes: dropped, ..Pushed::default() })
    }

    /// The length of the whole message starting at `at`, once it is all buffered; its
    /// prelude is checked as soon as it arrives.
    fn complete_at(&self, at: usize) -> Result<Option<usize>, SseError> {
        let rest = &self.buffer[at..];
        if rest.len() < 12 {
            return Ok(None);
        }
        let total = be32(&rest[0..4]) as usize;
        let headers = be32(&rest[4..8]) as usize;
        if crc32(&rest[0..8]) != be32(&rest[8..12]) {
            return Err(SseError("event-stream prelude CRC mismatch".into()));
        }
        if !(OVERHEAD..=MAX_MESSAGE_BYTES).contains(&total) || headers > total - OVERHEAD {
            return Err(SseError(format!("event-stream message of {total} bytes ({headers} of headers) is malformed")));
        }
        Ok((rest.len() >= total).then_some(total))
    }
}

impl Framer for EventStreamFramer {
    fn push(&mut self, bytes: &[u8]) -> Result<Pushed, SseError> {
        EventStreamFramer::push(self, bytes)
    }
    fn finish(&mut self) -> Result<Pushed, SseError> {
        EventStreamFramer::finish(self)
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// One whole message (its prelude already checked) as an event.
fn message(m: &[u8]) -> Result<SseEvent, SseError> {
    let total = m.len();
    if crc32(&m[..total - 4]) != be32(&m[total - 4..]) {
        return Err(SseError("event-stream message CRC mismatch".into()));
    }
    let headers_len = be32(&m[4..8]) as usize;
    let headers = headers(&m[12..12 + headers_len])?;
    let payload = &m[12 + headers_len..total - 4];
    let data = std::str::from_utf8(payload).map_err(|_| SseError("event-stream payload is not UTF-8".into()))?;
    let find = |name: &str| headers.iter().find(|(n, _)| *n == name.as_bytes()).map(|(_, v)| *v);
    let (event, data) = match find(":message-type") {
        Some("exception") => {
            let kind = find(":exception-type").unwrap_or("unknown");
            (format!("exception:{kind}"), data.to_string())
        }
        // An `error` message carries its code and text in headers (`:error-code`,
        // `:error-message`), its payload often empty (#46; AWS event-stream encoding).
        Some("error") => {
            let kind = find(":error-code").unwrap_or("unknown");
            let message = find(":error-message").unwrap_or_default();
            (format!("exception:{kind}"), serde_json::json!({"message": message}).to_string())
        }
        _ => (find(":event-type").unwrap_or("unknown").to_string(), data.to_string()),
    };
    Ok(SseEvent { event: Some(event), data })
}

/// The string-valued headers, borrowed from the message (other types are skipped, each checked
/// for length).
fn headers(mut b: &[u8]) -> Result<Vec<(&[u8], &str)>, SseError> {
    let short = || SseError("event-stream headers are truncated".into());
    let mut out = Vec::new();
    while !b.is_empty() {
        let name_len = *b.first().ok_or_else(short)? as usize;
        let name = b.get(1..1 + name_len).ok_or_else(short)?;
        let kind = *b.get(1 + name_len).ok_or_else(short)?;
        b = &b[2 + name_len..];
        let fixed = match kind {
            0 | 1 => Some(0),
            2 => Some(1),
            3 => Some(2),
            4 => Some(4),
            5 | 8 => Some(8),
            9 => Some(16),
            6 | 7 => None,
            other => return Err(SseError(format!("event-stream header type {other} is unknown"))),
        };
        let len = match fixed {
            Some(n) => n,
            None => u16::from_be_bytes([*b.first().ok_or_else(short)?, *b.get(1).ok_or_else(short)?]) as usize + 2,
        };
        let value = b.get(..len).ok_or_else(short)?;
        if kind == 7 {
            let text = std::str::from_utf8(&value[2..]).map_err(|_| SseError("a header value is not UTF-8".into()))?;
            out.push((name, text));
        }
        b = &b[len..];
    }
    Ok(out)
}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
pub fn crc32(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            *slot = c;
        }
        t
    });
    !bytes.iter().fold(!0u32, |c, &b| table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8))
}

/// One message's bytes: string headers and a payload (the encoder tests and broca-mock use).
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (name, value) in headers {
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value.as_bytes());
    }
    let total = (OVERHEAD + h.len() + payload.len()) as u32;
    let mut m = Vec::with_capacity(total as usize);
    m.extend_from_slice(&total.to_be_bytes());
    m.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude = crc32(&m);
    m.extend_from_slice(&prelude.to_be_bytes());
    m.extend_from_slice(&h);
    m.extend_from_slice(payload);
    let crc = crc32(&m);
    m.extend_from_slice(&crc.to_be_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, payload: &str) -> Vec<u8> {
        encode(
            &[(":event-type", kind), (":content-type", "application/json"), (":message-type", "event")],
            payload.as_bytes(),
        )
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn messages_split_anywhere_decode_whole() {
        let mut bytes = event("messageStart", r#"{"role":"assistant"}"#);
        bytes.extend(event("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":"hé"}}"#));
        for cut in 0..bytes.len() {
            let mut framer = EventStreamFramer::new();
            let mut events = framer.push(&bytes[..cut]).unwrap().events;
            events.extend(framer.push(&bytes[cut..]).unwrap().events);
            assert_eq!(events.len(), 2, "cut at {cut}");
            assert_eq!(events[0].event.as_deref(), Some("messageStart"));
            assert_eq!(events[1].data, r#"{"contentBlockIndex":0,"delta":{"text":"hé"}}"#);
        }
    }

    #[test]
    fn an_exception_is_named_and_a_bad_crc_or_size_refused() {
        let ex = encode(
            &[
                (":exception-type", "throttlingException"),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            br#"{"message":"slow down"}"#,
        );
        let events = EventStreamFramer::new().push(&ex).unwrap().events;
        assert_eq!(events[0].event.as_deref(), Some("exception:throttlingException"));
        // An `error` message: its code and text are headers, its payload empty (#46).
        let error = encode(
            &[(":error-code", "InternalFailure"), (":error-message", "the stream broke"), (":message-type", "error")],
            b"",
        );
        let events = EventStreamFramer::new().push(&error).unwrap().events;
        assert_eq!(events[0].event.as_deref(), Some("exception:InternalFailure"));
        assert_eq!(events[0].data, r#"{"message":"the stream broke"}"#);
        let mut bad = ex.clone();
        let n = bad.len();
        bad[n - 5] ^= 1;
        assert!(EventStreamFramer::new().push(&bad).is_err(), "payload CRC");
        let mut bad = ex.clone();
        bad[9] ^= 1;
        assert!(EventStreamFramer::new().push(&bad).is_err(), "prelude CRC");
        let mut huge = Vec::new();
        huge.extend_from_slice(&(u32::MAX).to_be_bytes());
        huge.extend_from_slice(&0u32.to_be_bytes());
        huge.extend_from_slice(&crc32(&huge).to_be_bytes());
        assert!(EventStreamFramer::new().push(&huge).is_err(), "over the size bound, refused before buffering");
        let mut framer = EventStreamFramer::new();
        framer.push(&ex[..20]).unwrap();
        assert_eq!(framer.finish().unwrap().discarded_bytes, 20);
    }
}
