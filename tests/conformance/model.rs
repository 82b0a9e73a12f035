//! The scripted model, keyed per session: a loopback front in this process (outside broca)
//! that broca's `BROCA_PROVIDER_BASE_URL` points at, in front of broca-mock's model server
//! (`mock/model`, which speaks the real OpenAI Chat SSE wire broca parses, and the
//! Anthropic Messages wire for the sessions the output_refs cases start).
//!
//! Each session's first send carries the system text `conformance-lane:<lane>` (see
//! `subject.rs`), so every model request names the session it belongs to. The front answers a
//! request of a session with `script.turns[n]`, `n` being the number of assistant messages in the
//! history that request carries, exactly as the suite's `install_script` says: a request resent
//! after a kill gets the same turn again. It renders that turn as a broca-mock script, installs
//! it on the session's own broca-mock lane and forwards the request there unchanged (only the
//! path gains the lane prefix), piping broca-mock's stream back.
//!
//! It also counts and keeps every request it received, per session, and can hold a session's
//! next request until the suite releases it: observations made where the model is, never
//! rebuilt from broca's replies.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cortexkit_role_llm_runner::run::RunError;
use cortexkit_role_llm_runner_conformance::{ModelRequestObservation, Script, ScriptedPart, ScriptedTurn};
use serde_json::{json, Value};

use crate::mock::{MockServer, Script as MockScript};

/// The marker the system text carries: `conformance-lane:<lane>`.
pub const LANE_MARKER: &str = "conformance-lane:";
/// The SSE comment the front holds a stream at (`hold_next_model_stream`). It is sent on with
/// the stream (a comment every SSE reader skips): the stream is chunked, and cutting bytes out
/// of a chunk would break its framing, so the released stream would fail to decode.
const HOLD_COMMENT: &[u8] = b": conformance-hold\n\n";
/// Request heads over this are refused.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 64 * 1024 * 1024;

#[derive(Default)]
struct Session {
    lane: String,
    script: Option<Script>,
    /// Every request body received, in order.
    requests: Vec<Value>,
    hold: Hold,
    /// Hold the next answer mid-stream after this many parts.
    stream_parts: Option<usize>,
    /// Scripted failures already over: a failed request leaves no assistant message, so each
    /// adds one to the turn a request's assistant count picks (see [`turn_of`]).
    failures_past: usize,
    /// The failure turn being served and the history length of the request it answers: a retry
    /// of that request (the same history) gets the failure again, a longer history moves past it.
    failing: Option<(usize, usize)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Hold {
    #[default]
    None,
    /// The next request waits.
    Armed,
    /// A request is waiting.
    Held,
    /// The waiting request may go on.
    Released,
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Session>,
    lanes: HashMap<String, String>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// The model front, with the broca-mock server behind it (both serve until the process ends).
pub struct Model {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl Model {
    pub fn start() -> io::Result<Model> {
        let mock = Arc::new(MockServer::start("127.0.0.1:0")?);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let (accept_shared, accept_mock) = (Arc::clone(&shared), Arc::clone(&mock));
        std::thread::Builder::new().name("conformance-model".into()).spawn(move || {
            for conn in listener.incoming().flatten() {
                let (shared, mock) = (Arc::clone(&accept_shared), Arc::clone(&accept_mock));
                let _ = std::thread::Builder::new().name("conformance-model-conn".into()).spawn(move || {
                    if let Err(e) = serve(&shared, &mock, conn) {
                        log::debug!("conformance model front: {e}");
                    }
                });
            }
        })?;
        Ok(Model { shared, addr })
    }

    /// The base URL broca's routes use (`.../v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The lane of `session`, allocated on first use.
    pub fn lane(&self, session: &str) -> String {
        let mut state = self.shared.state.lock().expect("the model state");
        if let Some(s) = state.sessions.get(session) {
            return s.lane.clone();
        }
        let lane = format!("s{}", state.sessions.len() + 1);
        state.lanes.insert(lane.clone(), session.to_owned());
        state.sessions.insert(session.to_owned(), Session { lane: lane.clone(), ..Session::default() });
        lane
    }

    pub fn install(&self, session: &str, script: Script) {
        self.lane(session);
        let mut state = self.shared.state.lock().expect("the model state");
        if let Some(s) = state.sessions.get_mut(session) {
            s.script = Some(script);
        }
    }

    pub fn invocations(&self, session: &str) -> usize {
        let state = self.shared.state.lock().expect("the model state");
        state.sessions.get(session).map_or(0, |s| s.requests.len())
    }

    pub fn requests(&self, session: &str) -> Vec<ModelRequestObservation> {
        let state = self.shared.state.lock().expect("the model state");
        state.sessions.get(session).map(|s| s.requests.iter().map(observe).collect()).unwrap_or_default()
    }

    pub fn arm_hold(&self, session: &str) {
        self.lane(session);
        let mut state = self.shared.state.lock().expect("the model state");
        if let Some(s) = state.sessions.get_mut(session) {
            s.hold = Hold::Armed;
        }
    }

    /// Holds the next answer of `session` after its first `parts` parts are streamed.
    pub fn arm_stream_hold(&self, session: &str, parts: usize) {
        self.lane(session);
        let mut state = self.shared.state.lock().expect("the model state");
        if let Some(s) = state.sessions.get_mut(session) {
            s.stream_parts = Some(parts);
        }
    }

    /// Whether a request of `session` is waiting in the hold.
    pub fn holding(&self, session: &str) -> bool {
        let state = self.shared.state.lock().expect("the model state");
        state.sessions.get(session).is_some_and(|s| s.hold == Hold::Held)
    }

    /// Lets the held request go on (and disarms a hold no request reached yet).
    pub fn release(&self, session: &str) {
        let mut state = self.shared.state.lock().expect("the model state");
        if let Some(s) = state.sessions.get_mut(session) {
            s.hold = match s.hold {
                Hold::Held => Hold::Released,
                _ => Hold::None,
            };
        }
        self.shared.changed.notify_all();
    }
}

/// What one request offered the model, read from the body broca sent (OpenAI Chat, or
/// Anthropic Messages for the sessions `Subject::output_refs_fields` starts).
fn observe(body: &Value) -> ModelRequestObservation {
    let tools: Vec<&Value> = body["tools"].as_array().map(|t| t.iter().collect()).unwrap_or_default();
    let name = |t: &&Value| t["function"]["name"].as_str().or(t["name"].as_str()).map(str::to_owned);
    let names = tools.iter().filter_map(name).collect();
    let mut observed = ModelRequestObservation::new(names);
    if let Some(max) = cap_of(body) {
        observed = observed.with_max_output_tokens(max);
    }
    if let Some(schema) = body.pointer("/response_format/json_schema/schema") {
        observed = observed.with_final_text_schema(schema.clone());
    }
    if let Some(submit) = tools.iter().find(|t| t["function"]["name"] == "submit_result") {
        observed = observed.with_submit_result_schema(submit["function"]["parameters"].clone());
    }
    observed.with_rendered(rendered(body))
}

/// Every text the request carried, in request order, as the model received it: the system
/// text, each message's string content (system, user, assistant and tool results alike), each
/// text part of an array content and each Anthropic `tool_result` block's content.
fn rendered(body: &Value) -> Vec<String> {
    let messages = body["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut texts = Vec::new();
    contents(&body["system"], &mut texts);
    for content in messages.iter().map(|m| &m["content"]) {
        contents(content, &mut texts);
    }
    texts
}

/// The texts of one content: a string, or an array's text parts and tool results.
fn contents(content: &Value, texts: &mut Vec<String>) {
    match content {
        Value::String(text) => texts.push(text.clone()),
        Value::Array(parts) => {
            for part in parts {
                match part["type"].as_str() {
                    Some("text") => texts.extend(part["text"].as_str().map(str::to_owned)),
                    Some("tool_result") => contents(&part["content"], texts),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// The script turn a request of `session` gets: the number of assistant messages in its history
/// plus the scripted failures already over. A failed request stores no assistant message, so
/// without that the send after a failed run would get the failure again: the failure turn
/// answers the request it was first served for and broca's retries of it (the same history), and
/// a request with a longer history (the next send) goes on to the turn after it.
fn turn_of(session: &mut Session, body: &Value) -> usize {
    let history = body["messages"].as_array().map_or(0, Vec::len);
    loop {
        let n = assistant_messages(body) + session.failures_past;
        let failure = session.script.as_ref().and_then(|s| s.turns.get(n)).is_some_and(|t| t.model_failure.is_some());
        match session.failing {
            _ if !failure => return n,
            Some((turn, seen)) if turn == n && history > seen => {
                session.failing = None;
                session.failures_past += 1;
            }
            Some((turn, _)) if turn == n => return n,
            _ => {
                session.failing = Some((n, history));
                return n;
            }
        }
    }
}

/// The assistant messages in a request's history (OpenAI Chat `messages`).
fn assistant_messages(body: &Value) -> usize {
    body["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
}

/// The lane named by the request's system text (a Chat system or developer message, or
/// Anthropic's top-level `system`).
fn lane_of(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    let chat = messages.iter().filter(|m| m["role"] == "system" || m["role"] == "developer").map(|m| &m["content"]);
    std::iter::once(&body["system"]).chain(chat).find_map(|content| {
        let text = match content {
            Value::Null => return None,
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let at = text.find(LANE_MARKER)? + LANE_MARKER.len();
        let lane: String = text[at..].chars().take_while(char::is_ascii_alphanumeric).collect();
        (!lane.is_empty()).then_some(lane)
    })
}

/// One scripted turn as a broca-mock stream script, for a request whose output cap is `cap`;
/// with `hold_after`, the SSE comment the front holds at follows that many parts.
///
/// The scripted finish reason goes out raw on the Chat wire (`openai.chat_completions`). A cap
/// below the turn's scripted output is honoured as a provider would: the answer is cut after
/// `cap` words (the fixture model's tokens), its reported output is `cap` and its finish
/// `length`; the rest of the turn is never sent.
fn render(turn: &ScriptedTurn, cap: Option<u64>, hold_after: Option<usize>) -> Value {
    let scripted_output = turn.usage.as_ref().map(|u| u.output_tokens);
    let cut = match (cap, scripted_output) {
        (Some(cap), Some(output)) if cap < output => Some(cap),
        _ => None,
    };
    let mut budget = cut.unwrap_or(u64::MAX);
    let mut events: Vec<Value> = Vec::new();
    for (index, part) in turn.parts.iter().enumerate() {
        if hold_after == Some(index) {
            events.push(json!({"comment": "conformance-hold"}));
        }
        if budget == 0 {
            break;
        }
        match part {
            ScriptedPart::Text(text) | ScriptedPart::Reasoning(text) => {
                let shown = if cut.is_some() {
                    let words: Vec<&str> = text.split_whitespace().take(budget as usize).collect();
                    budget -= words.len() as u64;
                    words.join(" ")
                } else {
                    text.clone()
                };
                // Each scripted text part opens a text block of its own where the family has
                // blocks (Anthropic); on Chat it is plain text, joined with its neighbours.
                let key = if matches!(part, ScriptedPart::Text(_)) { "text_block" } else { "reasoning" };
                events.push(json!({ key: shown }));
            }
            ScriptedPart::ToolCall(call) => {
                if cut.is_some() {
                    // A cut answer ends inside its text: a call after the cut is never emitted.
                    break;
                }
                events.push(
                    json!({"tool_call": {"id": call.tool_call_id, "name": call.tool, "arguments": call.arguments}}),
                );
            }
        }
    }
    if hold_after.is_some_and(|k| k >= turn.parts.len()) {
        events.push(json!({"comment": "conformance-hold"}));
    }
    if let Some(u) = &turn.usage {
        let output = cut.unwrap_or(u.output_tokens);
        let mut usage = json!({"input": u.input_tokens, "cached": u.cache_read_tokens,
                               "cache_write": u.cache_write_tokens, "output": output});
        if let Some(r) = u.reasoning_tokens {
            usage["reasoning"] = json!(r.min(output));
        }
        events.push(json!({"usage": usage}));
    }
    match (cut, &turn.finish_reason) {
        (Some(_), _) => events.push(json!({"finish": "length"})),
        (None, Some(raw)) => events.push(json!({"finish": raw})),
        (None, None) => {}
    }
    json!({"responses": [{"events": events}]})
}

/// The output cap a request carried (OpenAI Chat).
fn cap_of(body: &Value) -> Option<u64> {
    body["max_completion_tokens"].as_u64().or_else(|| body["max_tokens"].as_u64())
}

/// A scripted model failure as the provider's own refusal, which broca's real client reads and
/// its family's decoder classifies (`src/provider/errors.rs`): the HTTP status the class and
/// code stand for (the scripted `status` when given), the family's error document with the
/// scripted message, `retry-after` in (fractional) seconds, and a scripted reset as the
/// exhausted limit's reset header. Model-failure scripts run on the Anthropic Messages row
/// (`Subject::install_script`), whose `anthropic-ratelimit-*-reset` is an absolute RFC 3339 time,
/// so a scripted `resets_at_ms` crosses the wire exactly (OpenAI's resets are durations from now,
/// which cannot state a past or exact instant). broca retries a transient failure as it would a
/// real one; each retry is answered the same, as the script's turn is chosen by history.
fn failure(error: Option<&RunError>, messages_wire: bool) -> Value {
    let Some(error) = error else { return refusal("no failure is scripted") };
    let code = error.provider_code.as_str();
    let status = error.status.unwrap_or(match error.class.as_str() {
        "transient" if code.contains("rate") => 429,
        "transient" | "provider_unavailable" => 503,
        "auth_required" | "auth" => 401,
        _ => 400,
    });
    let kind = match status {
        429 => "rate_limit_error",
        401 => "authentication_error",
        500..=599 => "api_error",
        _ if error.class == "context_overflow" => "context_length_exceeded",
        _ => "invalid_request_error",
    };
    let body = if messages_wire {
        json!({"type": "error", "error": {"type": kind, "message": error.message}})
    } else {
        json!({"error": {"type": kind, "code": kind, "message": error.message}})
    };
    let mut headers = serde_json::Map::new();
    if let Some(secs) = error.retry_after_secs {
        headers.insert("retry-after".into(), json!(secs.to_string()));
    }
    if let Some(at) = error.resets_at_ms {
        headers.insert("anthropic-ratelimit-requests-remaining".into(), json!("0"));
        headers.insert("anthropic-ratelimit-requests-reset".into(), json!(rfc3339(at)));
    }
    json!({"responses": [{"status": status, "headers": headers, "body": body}]})
}

/// Unix milliseconds as an RFC 3339 UTC time with milliseconds (`2026-09-21T14:13:23.000Z`).
fn rfc3339(ms: u64) -> String {
    let (days, rest) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (rest / 3_600_000, rest / 60_000 % 60, rest / 1000 % 60, rest % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// A permanent provider error naming why the front could not answer.
fn refusal(message: &str) -> Value {
    json!({"responses": [{"status": 400, "body": {"error": {"message": message, "type": "invalid_request_error"}}}]})
}

/// Picks the turn for one request (after any hold), installs it on the lane and returns the lane,
/// and the session when its answer is to be held mid-stream.
fn choose(
    shared: &Shared,
    mock: &MockServer,
    body: &Value,
    messages_wire: bool,
) -> Result<(String, Option<String>), String> {
    let lane = lane_of(body).ok_or("the request's system text names no conformance lane")?;
    let mut state = shared.state.lock().map_err(|_| "the model state is poisoned")?;
    let session = state.lanes.get(&lane).cloned().ok_or_else(|| format!("no session has lane {lane}"))?;
    {
        let s = state.sessions.get_mut(&session).ok_or("the lane's session is gone")?;
        s.requests.push(body.clone());
        if s.hold == Hold::Armed {
            s.hold = Hold::Held;
            shared.changed.notify_all();
        }
    }
    while state.sessions.get(&session).is_some_and(|s| s.hold == Hold::Held) {
        state = shared.changed.wait_timeout(state, Duration::from_millis(200)).map_err(|_| "poisoned")?.0;
    }
    let s = state.sessions.get_mut(&session).ok_or("the lane's session is gone")?;
    if s.hold == Hold::Released {
        s.hold = Hold::None;
    }
    let n = turn_of(s, body);
    let hold_after = s.stream_parts.take();
    let script = match s.script.as_ref().map(|script| script.turns.get(n)) {
        Some(Some(turn)) if turn.model_failure.is_some() => failure(turn.model_failure.as_ref(), messages_wire),
        Some(Some(turn)) => render(turn, cap_of(body), hold_after),
        Some(None) => refusal(&format!("the script of {session} has no turn {n}")),
        None => refusal(&format!("no script is installed for {session}")),
    };
    let script = MockScript::from_json(&script.to_string()).map_err(|e| format!("rendering turn {n}: {e:?}"))?;
    mock.install(&lane, script);
    Ok((lane, hold_after.map(|_| session)))
}

fn serve(shared: &Shared, mock: &MockServer, mut client: TcpStream) -> io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let (head, body) = read_request(&mut client)?;
    let text = String::from_utf8_lossy(&head).into_owned();
    let (request_line, rest) = text.split_once("\r\n").unwrap_or((&text, ""));
    let mut words = request_line.splitn(3, ' ');
    let (method, target, version) =
        (words.next().unwrap_or(""), words.next().unwrap_or(""), words.next().unwrap_or(""));
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let messages_wire = target.split('?').next().is_some_and(|path| path.ends_with("/messages"));
    let (lane, held) = match choose(shared, mock, &parsed, messages_wire) {
        Ok(chosen) => chosen,
        Err(why) => {
            log::warn!("conformance model front: {why}");
            // An unkeyed request still gets broca-mock's native error document.
            let lane = "unkeyed".to_owned();
            let script =
                MockScript::from_json(&refusal(&why).to_string()).map_err(|e| io::Error::other(format!("{e:?}")))?;
            mock.install(&lane, script);
            (lane, None)
        }
    };
    let target = match target.strip_prefix("/v1") {
        Some(tail) => format!("/lane/{lane}/v1{tail}"),
        None => target.to_owned(),
    };
    let mut upstream = TcpStream::connect(("127.0.0.1", mock.port()))?;
    upstream.write_all(format!("{method} {target} {version}\r\n{}", closing(rest)).as_bytes())?;
    upstream.write_all(&body)?;
    let copied = match held {
        None => io::copy(&mut upstream, &mut client).map(|_| ()),
        Some(session) => pipe_holding(shared, &session, &mut upstream, &mut client),
    };
    let _ = client.shutdown(Shutdown::Both);
    copied
}

/// The request's header lines with `Connection: close` in place of any `Connection` header.
/// The front serves one request per connection, so it says so: broca-mock then ends the response
/// by closing (the copy to broca ends with it), and broca does not pool a connection the front
/// would never read again. Without it, every copy lasted broca-mock's keep-alive idle (5 s), and
/// broca's next request sat on the pooled connection until the front closed it.
fn closing(headers: &str) -> String {
    let kept: String = headers
        .split_inclusive("\r\n")
        .filter(|line| line != &"\r\n")
        .filter(|line| !line.split(':').next().is_some_and(|name| name.trim().eq_ignore_ascii_case("connection")))
        .collect();
    format!("{kept}Connection: close\r\n\r\n")
}

/// Pipes the stream, holding it after [`HOLD_COMMENT`] (it and what came before it are already
/// sent) until the session's hold is released.
fn pipe_holding(shared: &Shared, session: &str, upstream: &mut TcpStream, client: &mut TcpStream) -> io::Result<()> {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut held = false;
    loop {
        let n = upstream.read(&mut chunk)?;
        if n == 0 {
            return client.write_all(&pending);
        }
        pending.extend_from_slice(&chunk[..n]);
        if held {
            client.write_all(&pending)?;
            pending.clear();
            continue;
        }
        match pending.windows(HOLD_COMMENT.len()).position(|w| w == HOLD_COMMENT) {
            Some(at) => {
                client.write_all(&pending[..at + HOLD_COMMENT.len()])?;
                client.flush()?;
                let rest = pending.split_off(at + HOLD_COMMENT.len());
                pending = rest;
                held = true;
                wait_release(shared, session)?;
                client.write_all(&pending)?;
                pending.clear();
            }
            None => {
                // Everything but a tail that could start the marker goes out now.
                let keep = pending.len().min(HOLD_COMMENT.len() - 1);
                let sent: Vec<u8> = pending.drain(..pending.len() - keep).collect();
                client.write_all(&sent)?;
            }
        }
    }
}

/// Marks the session's answer held mid-stream and waits until it is released.
fn wait_release(shared: &Shared, session: &str) -> io::Result<()> {
    let mut state = shared.state.lock().map_err(|_| io::Error::other("the model state is poisoned"))?;
    if let Some(s) = state.sessions.get_mut(session) {
        s.hold = Hold::Held;
    }
    shared.changed.notify_all();
    while state.sessions.get(session).is_some_and(|s| s.hold == Hold::Held) {
        state =
            shared.changed.wait_timeout(state, Duration::from_millis(200)).map_err(|_| io::Error::other("poisoned"))?.0;
    }
    if let Some(s) = state.sessions.get_mut(session) {
        s.hold = Hold::None;
    }
    Ok(())
}

/// The request head (through the blank line) and its `Content-Length` body.
fn read_request(stream: &mut TcpStream) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::other("request head too large"));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::other("closed before the head ended"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = buf[..end].to_vec();
    let length = String::from_utf8_lossy(&head)
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim().eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    if length > MAX_BODY {
        return Err(io::Error::other("request body too large"));
    }
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::other("closed before the body ended"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok((head, body))
}
