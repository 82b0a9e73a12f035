//! Server-sent events framing: bytes in (split anywhere), whole events out.
//!
//! Handles events split across reads, several events per read, `\r\n` and `\n` line ends,
//! multi-line `data:`, and comment lines (keep-alives), whose bytes are counted. Bounded: a
//! single event larger than `MAX_EVENT_BYTES` is an error, never unbounded growth.

/// The largest event accepted (16 MiB).
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// One SSE event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// What `push` produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    pub events: Vec<SseEvent>,
    /// Comment lines seen (keep-alives).
    pub comments: u64,
    /// Bytes of comment lines (without their line ends).
    pub comment_bytes: u64,
    /// Bytes of an incomplete final event discarded by `finish`.
    pub discarded_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseError(pub String);

/// A response framing: bytes in (split anywhere), whole events out. SSE for most families,
/// the AWS event stream for Bedrock (`super::eventstream`).
pub trait Framer: Send {
    fn push(&mut self, bytes: &[u8]) -> Result<Pushed, SseError>;
    /// Ends the stream (an incomplete event is discarded, never decoded).
    fn finish(&mut self) -> Result<Pushed, SseError>;
}

impl Framer for SseFramer {
    fn push(&mut self, bytes: &[u8]) -> Result<Pushed, SseError> {
        SseFramer::push(self, bytes)
    }
    fn finish(&mut self) -> Result<Pushed, SseError> {
        SseFramer::finish(self)
    }
}

#[derive(Default)]
pub struct SseFramer {
    /// Bytes of an incomplete line.
    line: Vec<u8>,
    current: SseEvent,
    has_field: bool,
    event_bytes: usize,
}

impl SseFramer {
    pub fn new() -> SseFramer {
        SseFramer::default()
    }

    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Pushed, SseError> {
        let mut out = Pushed::default();
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            self.extend_line(&rest[..end])?;
            rest = &rest[end + 1..];
            // The line buffer keeps its capacity across lines.
            let mut line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\r").unwrap_or(&line);
            let done = self.line_done(text, &mut out);
            line.clear();
            self.line = line;
            done?;
        }
        self.extend_line(rest)?;
        Ok(out)
    }

    /// Adds bytes of the current line, refusing an event past [`MAX_EVENT_BYTES`].
    fn extend_line(&mut self, part: &[u8]) -> Result<(), SseError> {
        if self.line.len() + part.len() + self.event_bytes > MAX_EVENT_BYTES {
            return Err(SseError(format!("an SSE event exceeds {MAX_EVENT_BYTES} bytes")));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    /// Ends the stream. As the SSE specification says, an event not terminated by a blank
    /// line when the stream ends is incomplete and is discarded, never decoded half-written;
    /// the returned count says how many bytes were dropped that way.
    pub fn finish(&mut self) -> Result<Pushed, SseError> {
        let dropped = self.line.len() + self.event_bytes;
        *self = SseFramer::default();
        Ok(Pushed { comment_bytes: 0, comments: 0, events: Vec::new(), discarded_bytes: dropped as u64 })
    }

    fn dispatch(&mut self, out: &mut Pushed) {
        if self.has_field {
            out.events.push(std::mem::take(&mut self.current));
        }
        self.current = SseEvent::default();
        self.has_field = false;
        self.event_bytes = 0;
    }

    fn line_done(&mut self, line: &[u8], out: &mut Pushed) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            out.comments += 1;
            out.comment_bytes += line.len() as u64;
            return Ok(());
        }
        let text = std::str::from_utf8(line).map_err(|_| SseError("an SSE line is not UTF-8".into()))?;
        let (field, value) = match text.find(':') {
            Some(i) => (&text[..i], text[i + 1..].strip_prefix(' ').unwrap_or(&text[i + 1..])),
            None => (text, ""),
        };
        self.event_bytes += line.len();
        match field {
            "event" => {
                self.current.event = Some(value.to_string());
                self.has_field = true;
            }
            "data" => {
                if self.has_field && !self.current.data.is_empty() {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_field = true;
            }
            // `id` and `retry` are not used by any family broca speaks; unknown fields are ignored.
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str =
        "event: a\ndata: {\"x\":1}\n\n: keepalive\n\ndata: one\ndata: two\n\nevent: b\r\ndata: é\r\n\r\n";

    fn all_at_once() -> Pushed {
        let mut f = SseFramer::new();
        let mut p = f.push(STREAM.as_bytes()).unwrap();
        p.events.extend(f.finish().unwrap().events);
        p
    }

    #[test]
    fn frames_events_comments_and_multiline_data() {
        let p = all_at_once();
        assert_eq!(p.events.len(), 3);
        assert_eq!(p.events[0], SseEvent { event: Some("a".into()), data: "{\"x\":1}".into() });
        assert_eq!(p.events[1].data, "one\ntwo");
        assert_eq!(p.events[2], SseEvent { event: Some("b".into()), data: "é".into() });
        assert_eq!((p.comments, p.comment_bytes), (1, 11));
    }

    #[test]
    fn any_split_yields_the_same_events() {
        let bytes = STREAM.as_bytes();
        let whole = all_at_once();
        for cut in 0..bytes.len() {
            let mut f = SseFramer::new();
            let mut p = f.push(&bytes[..cut]).unwrap();
            let q = f.push(&bytes[cut..]).unwrap();
            p.events.extend(q.events);
            p.comments += q.comments;
            p.events.extend(f.finish().unwrap().events);
            assert_eq!(p.events, whole.events, "cut {cut}");
            assert_eq!(p.comments, whole.comments);
        }
    }
}
