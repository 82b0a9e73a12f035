//! The MCP stdio transport: newline-delimited JSON-RPC 2.0 on stdin/stdout.
//!
//! Invariants:
//! - a line is read into at most [`MAX_LINE_BYTES`]; the rest of a longer line is read and
//!   dropped without being kept, and the line is answered [`INVALID_REQUEST`] (id `null`);
//! - every line becomes exactly one [`Incoming`]; nothing here panics on input: invalid JSON is
//!   [`PARSE_ERROR`], a non-object (a batch included) or a malformed envelope is
//!   [`INVALID_REQUEST`], non-object `params` is [`INVALID_PARAMS`];
//! - [`Out`] writes one whole message per line and flushes it, under one lock, so lines from
//!   concurrent tool calls never interleave; stdout carries nothing else.

use std::io::{self, BufRead, Write};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

/// The longest input line (one JSON-RPC message), newline excluded.
pub const MAX_LINE_BYTES: usize = 1 << 20;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
/// broca could not be reached, or a call to it ended without an answer (`data` says whether
/// the request was sent).
pub const TRANSPORT_ERROR: i64 = -32000;
/// Too many tool calls are in flight.
pub const BUSY: i64 = -32001;

/// One input line.
#[derive(Debug, PartialEq)]
pub enum Line {
    Text(Vec<u8>),
    /// A line longer than [`MAX_LINE_BYTES`]: its length (it was not kept).
    TooLong(usize),
    Eof,
}

/// Reads lines of at most `limit` bytes from `inner`.
pub struct LineReader<R> {
    inner: R,
    limit: usize,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(inner: R, limit: usize) -> LineReader<R> {
        LineReader { inner, limit }
    }

    /// The next line without its `\n` (and a `\r` before it). A last line without a newline
    /// still counts.
    pub fn next_line(&mut self) -> io::Result<Line> {
        let mut line = Vec::new();
        let mut total = 0usize;
        let mut seen = false;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(chunk) => chunk,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                if !seen {
                    return Ok(Line::Eof);
                }
                break;
            }
            seen = true;
            let (take, newline) = match chunk.iter().position(|b| *b == b'\n') {
                Some(at) => (at, true),
                None => (chunk.len(), false),
            };
            total = total.saturating_add(take);
            if total <= self.limit {
                line.extend_from_slice(&chunk[..take]);
            } else if !line.is_empty() {
                line = Vec::new();
            }
            self.inner.consume(take + usize::from(newline));
            if newline {
                break;
            }
        }
        if total > self.limit {
            return Ok(Line::TooLong(total));
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Ok(Line::Text(line))
    }
}

/// A JSON-RPC error.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    fn to_value(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            e["data"] = data.clone();
        }
        e
    }
}

/// What one line says.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    /// A response to a request of ours (we send none): ignored.
    Response,
    /// Answered with this error; `id` is the request's when it could be read, else `null`.
    Invalid {
        id: Value,
        error: RpcError,
    },
}

/// Classifies one line.
pub fn classify(line: &[u8]) -> Incoming {
    let invalid = |id: Value, code, message: &str| Incoming::Invalid { id, error: RpcError::new(code, message) };
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return invalid(Value::Null, PARSE_ERROR, &format!("Parse error: {e}")),
    };
    let mut obj = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => return invalid(Value::Null, INVALID_REQUEST, "Invalid Request: batches are not supported"),
        _ => return invalid(Value::Null, INVALID_REQUEST, "Invalid Request: a message is a JSON object"),
    };
    let id = match obj.remove("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
        Some(_) => return invalid(Value::Null, INVALID_REQUEST, "Invalid Request: id must be a string or an integer"),
    };
    let echo = id.clone().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(echo, INVALID_REQUEST, "Invalid Request: jsonrpc must be \"2.0\"");
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return invalid(echo, INVALID_REQUEST, "Invalid Request: method must be a string"),
        None if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) => return Incoming::Response,
        None => return invalid(echo, INVALID_REQUEST, "Invalid Request: method is required"),
    };
    let params = match obj.remove("params") {
        None => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => return invalid(echo, INVALID_PARAMS, "Invalid params: params must be an object"),
    };
    match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    }
}

/// stdout: one message per line, flushed. Cloneable; a failed write (the client is gone) is
/// logged once and later writes are dropped.
#[derive(Clone)]
pub struct Out {
    inner: Arc<Mutex<Option<Box<dyn Write + Send>>>>,
}

impl Out {
    pub fn new(w: Box<dyn Write + Send>) -> Out {
        Out { inner: Arc::new(Mutex::new(Some(w))) }
    }

    fn send(&self, message: &Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        let mut guard = self.inner.lock();
        if let Some(w) = guard.as_mut() {
            if let Err(e) = w.write_all(&line).and_then(|()| w.flush()) {
                log::warn!(target: "broca_mcp", "stdout: {e}; no more messages will be written");
                *guard = None;
            }
        }
    }

    pub fn result(&self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    pub fn error(&self, id: &Value, error: &RpcError) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "error": error.to_value()}));
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], limit: usize) -> Vec<Line> {
        let mut r = LineReader::new(io::BufReader::with_capacity(4, input), limit);
        let mut out = Vec::new();
        loop {
            match r.next_line().unwrap() {
                Line::Eof => return out,
                l => out.push(l),
            }
        }
    }

    #[test]
    fn lines_are_bounded_and_the_rest_of_a_long_line_is_skipped() {
        let got = lines(b"abc\r\n0123456789\nxy", 5);
        assert_eq!(got, vec![Line::Text(b"abc".to_vec()), Line::TooLong(10), Line::Text(b"xy".to_vec())]);
        assert_eq!(lines(b"", 5), vec![]);
        assert_eq!(lines(b"\n\n", 5), vec![Line::Text(vec![]), Line::Text(vec![])]);
    }

    #[test]
    fn envelopes_are_classified() {
        let req = classify(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        assert_eq!(req, Incoming::Request { id: json!(7), method: "ping".into(), params: Map::new() });
        let note = classify(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(matches!(note, Incoming::Notification { .. }));
        assert_eq!(classify(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#), Incoming::Response);
        for (line, code) in [
            (&b"{"[..], PARSE_ERROR),
            (b"[]", INVALID_REQUEST),
            (b"3", INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#, INVALID_REQUEST),
            (br#"{"id":1,"method":"ping"}"#, INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"method":3}"#, INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}"#, INVALID_PARAMS),
        ] {
            match classify(line) {
                Incoming::Invalid { error, .. } => assert_eq!(error.code, code, "{}", String::from_utf8_lossy(line)),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(line)),
            }
        }
    }
}
