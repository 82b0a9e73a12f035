//! `broca-mock`: a scripted stand-in for remote model providers on loopback. It speaks the
//! real SSE wire formats of Anthropic Messages, OpenAI Chat Completions and OpenAI Responses
//! (see `provider-streams.md`), because broca's real client parses what it sends.
//!
//! # Lanes and routes
//!
//! HTTP/1.1, one thread per connection. A connection is kept alive between requests (streams
//! are then chunked) unless the client sends `Connection: close`, or the server was started
//! with [`MockOptions::no_keep_alive`]; an idle kept-alive connection is closed after
//! [`KEEP_ALIVE_IDLE`] (or [`MockOptions::idle_close`]). With [`MockOptions::tls`] the server
//! speaks HTTPS with a certificate generated at start; [`MockServer::ca_pem`] is the root a
//! client trusts. [`MockServer::accepts`] counts accepted connections (and
//! [`MockServer::tls_handshakes`] TLS handshakes, full and resumed), so tests can see how many
//! connections a client made. Model requests are routed by path prefix to a *lane*:
//!
//! | path | lane | family |
//! |---|---|---|
//! | `POST /v1/messages` | `default` | Anthropic Messages |
//! | `POST /v1/chat/completions` | `default` | OpenAI Chat |
//! | `POST /v1/responses` | `default` | OpenAI Responses (the ChatGPT/Codex backend when the request carries the Codex client's `originator` header) |
//! | `POST /v1/models/<model>:streamGenerateContent?alt=sse` | `default` | Gemini |
//! | `POST /v1/v1internal:streamGenerateContent?alt=sse` | `default` | Google Code Assist (it must name the lane's account's project) |
//! | `POST /v1/v1internal:loadCodeAssist`, `…:onboardUser`, `GET /v1/v1internal/operations/<id>` | `default` | Code Assist's account setup, per the script's `code_assist` account ([`code_assist`]) |
//! | `POST /v1/model/<percent-encoded id>/converse-stream` | `default` | Bedrock Converse (an AWS event stream) |
//! | `POST /lane/<name>/v1/<same>` | `<name>` | by the rest of the path |
//! | `POST /v1/systemone`, `POST /client/v4/accounts/<id>/ai/run/@cf/cloudflare/<model>` | none | the classifier providers TypeSafe and Workers AI: answers scripted per `state`, counted, held; control under `/_mock/classify/` ([`classify`]) |
//!
//! Every request under a lane prefix is recorded ([`RecordedRequest`]: method, target, headers,
//! body bytes and their SHA-256, family) *before* it is answered (Code Assist's setup requests
//! apart, [`MockServer::setup_requests`]). Each model request then pops
//! one scripted response from the lane's FIFO; an empty FIFO answers a default reply: the text
//! `Hello from broca-mock.` in three deltas, usage, finish `stop`. Other paths under a lane are
//! recorded and answered 404 (405 for a model path with another method).
//!
//! # Script format
//!
//! ```json
//! {"responses": [
//!   {"status": 429, "headers": {"retry-after": "1"}},
//!   {"status": 401, "body": {"error": {"message": "bad key", "type": "invalid_request_error"}}},
//!   {"events": [
//!     {"reasoning": "The user wants a file size.", "signature": "EqQBCkYmock=="},
//!     {"text": "Let me "}, {"delay_ms": 50}, {"text": "check."},
//!     {"comment": "keepalive"},
//!     {"tool_call": {"id": "call_1", "name": "stat_file", "arguments": "{\"path\":\"build.log\"}", "chunks": 3}},
//!     {"usage": {"input": 812, "cached": 4096, "output": 87}},
//!     {"finish": "tool_calls"}
//!   ], "write": {"split_every": 7}},
//!   {"events": [{"text": "The three causes are"}, {"error": {"type": "overloaded_error", "message": "Overloaded"}}]},
//!   {"events": [{"text": "cut off"}, {"disconnect": true}]}
//! ]}
//! ```
//!
//! A script's optional `"authorization": "Bearer …"` makes the lane check every later model
//! request's `Authorization` header against it (the scripted vault credential): a request
//! without it or with another value is answered 401 (the family's error document) and pops
//! nothing.
//!
//! **Strict mode** (always on): every model request is checked, once recorded, against its
//! family's provider rules ([`rules`]: what the real provider refuses or requires, each row
//! with its public source). A request that breaks one is answered as the provider would, with
//! its status and error document (e.g. Anthropic 400 `invalid_request_error`, Bedrock 400
//! `ValidationException`), and pops nothing. A test that sends a bad request on purpose names
//! the rules it breaks in a script's `"allow_rules": ["anthropic.text_non_empty", …]` (for the
//! lane, from then on); such a request is answered as if it kept them. With
//! `BROCA_MOCK_RULES_LOG` set, each checked request appends one JSON line to that file
//! (`{"family", "violations": [ids], "allowed"?, "lane"?, "target"?, "messages"?}`);
//! `scripts/provider-rules-summary` sums them.
//!
//! A **warm** (an Anthropic Messages request with `max_tokens: 0` and no `stream`, as
//! `session.warm` sends it; [`warm`]) pops no response: it is answered with the non-streaming
//! Message its prompt-cache prefix earns (usage only, empty content) and rate-limit headers. A
//! script's optional `"warms": [{"delay_ms"?: n, "status"?: s}, …]` shapes the lane's next
//! warms in order (a delay before answering; an HTTP error instead of the answer).
//!
//! A response is an **HTTP reply** — `status`, optional `body` (default: the family's own
//! error document for that status, e.g. Anthropic `{"type":"error","error":{"type":
//! "rate_limit_error",...}}`, OpenAI `{"error":{"type":"requests","code":
//! "rate_limit_exceeded",...}}`), optional `headers` — or a **stream** (`200
//! text/event-stream`): `events`, optional `write`, optional `headers`. Both take an optional
//! `delay_ms` before the status line.
//!
//! Stream events, family-neutral (each object has exactly one of these keys):
//!
//! | event | renders as |
//! |---|---|
//! | `{"text": s}` | a text delta (consecutive texts share one block / part) |
//! | `{"text_block": s}` | text opening a block of its own (Anthropic: a new `text` content block); elsewhere as `text` |
//! | `{"reasoning": s, "signature": s?}` | Anthropic thinking block (signature just before its stop); Responses reasoning summary (signature → `encrypted_content`); Chat `reasoning_content` |
//! | `{"redacted_reasoning": s}` | Anthropic `redacted_thinking`; Responses reasoning item with `encrypted_content`; nothing in Chat |
//! | `{"refusal": s}` | Anthropic text; Chat `delta.refusal`; Responses `refusal` content part |
//! | `{"tool_call": {"id", "name", "arguments", "chunks"?}}` | a tool call; `arguments` (a string sent as is, or JSON serialized) split into `chunks` (default 2) fragments after an empty first one; the id is Responses' `call_id` |
//! | `{"usage": {"input"?, "cached"?, "cache_write"?, "output"?, "reasoning"?, "measured"?}}` | merged; rendered natively (below); `measured: true` takes `input`, `cached` and `cache_write` from the lane's prompt-cache model of the request ([`prompt_cache`]): what the provider would report |
//! | `{"finish": r}` | `stop`, `length`, `tool_calls`, `content_filter`, `refusal`, or any other string sent raw |
//! | `{"error": {"type", "message", "done"?}}` | an in-stream error after 200, native form; the stream then ends (Chat: `done: true` adds `data: [DONE]`) |
//! | `{"delay_ms": n}` | a pause (bytes before it are flushed) |
//! | `{"comment": s}` | an SSE comment line `: s` |
//! | `{"unknown_event": {"name": s, "data": json}}` | `event: s` + `data: json`, verbatim |
//! | `{"disconnect": true}` | close the connection here (no terminal event) |
//! | `{{now_us}}` inside any string of the above | replaced, as each piece is written, by the current Unix time in microseconds as exactly 16 decimal digits (zero-padded), e.g. `{"text": "t={{now_us}};"}`; one clock reading per write |
//!
//! The `{{now_us}}` token lets a reader measure delivery latency (receive time minus the
//! embedded time). It has a fixed width, so each token adds exactly 6 bytes whatever the time;
//! with `split_every` the bytes are stamped before they are cut. A token must sit whole in one
//! string (one text, one tool-call fragment: `chunks` may cut it). Only a stream whose steps
//! contain the token is scanned when written.
//!
//! Without `finish`, `error` or `disconnect` a stream finishes with `stop` (`tool_calls` if it
//! had tool calls). Content may not follow `finish`/`error`; nothing follows `disconnect`.
//!
//! Finish mapping: Anthropic `stop_reason` `end_turn`/`max_tokens`/`tool_use`/`refusal`
//! (`content_filter` too); Chat `finish_reason` as named (`refusal` → `stop`, the content being
//! `delta.refusal`); Responses `response.completed` for stop/tool_calls/refusal,
//! `response.incomplete` with reason `max_output_tokens` for length and the raw name otherwise.
//!
//! Usage: `input` excludes cache reads (`cached`) and writes (`cache_write`), as broca
//! normalizes it. Anthropic puts `input_tokens` (fresh), `cache_read_input_tokens`,
//! `cache_creation_input_tokens` and `output_tokens: 1` in `message_start` and the final
//! `output_tokens` in `message_delta` (no reasoning field). Chat sends a last `choices: []`
//! chunk with `prompt_tokens` = input + cached + cache_write, `completion_tokens`,
//! `total_tokens`, `prompt_tokens_details`, `completion_tokens_details.reasoning_tokens`, and
//! `"usage": null` on every other chunk. Responses puts the same totals (`input_tokens`
//! including cache) in `response.completed`. Absent fields are omitted; a stream without a
//! usage event carries no usage at all.
//!
//! `write`: absent = one write per SSE event; `{"split_every": n, "pause_ms": m?}` = the bytes
//! in `n`-byte writes (cutting events and UTF-8 characters), `m` ms apart;
//! `{"coalesce": true}` = everything between delays in one write.
//!
//! Without a socket, [`render::render`] and [`render::bytes`] give a script's stream bytes for
//! a family (e.g. for decoder tests).
//!
//! # Control endpoint
//!
//! | request | answer |
//! |---|---|
//! | `GET /_mock/health` | 200 `{"ok":true}` |
//! | `GET /_mock/connections` | 200 `{"accepts", "tls_full", "tls_resumed"}`: connections accepted and TLS handshakes so far |
//! | `POST /_mock/lanes/<lane>/script` (body: a script) | 204; the responses are appended to the lane's FIFO; 400 `{"error":...}` if invalid |
//! | `GET /_mock/lanes/<lane>/requests` | 200, JSON array of `{method, path, headers: [[name, value]...], body (UTF-8, lossy), body_sha256, family}`; header `X-Mock-Dropped-Requests` |
//! | `GET /_mock/lanes/<lane>` | 200 `{"pending", "recorded", "dropped"}` |
//! | `DELETE /_mock/lanes/<lane>` | 204; FIFO and records cleared |
//! | `/_mock/classify/…` | the classifier stand-in's scripts, counts, log, holds and delay ([`classify`]) |
//!
//! # Bounds
//!
//! Request heads over 64 KiB are refused 431 and bodies over 64 MiB 413; chunked request
//! bodies 411. Each lane keeps the last [`MAX_RECORDED_PER_LANE`] requests and counts the
//! dropped ones. At most [`MAX_CONNECTIONS`] connections are served at once (503 beyond).

pub mod classify;
mod code_assist;
mod control;
mod http;
mod lanes;
mod tls;
pub mod warm;

// The scripts, the seven wires' renderers and the prompt-cache model are the package
// `broca-mock-wire` (`mock/wire`); they are this server's modules under their old names.
pub use broca_mock_wire::{prompt_cache, render, rules, script};

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

pub use http::{MAX_BODY_BYTES, MAX_HEAD_BYTES};
pub use lanes::{sha256_hex, RecordedRequest, MAX_RECORDED_PER_LANE};
pub use script::{
    default_reply, HttpReply, Script, ScriptedResponse, Step, StreamError, StreamReply, ToolCall, Usage, WriteMode,
    DEFAULT_REPLY_TEXT, NOW_US_TOKEN,
};

use broca::provider::event::Family;
use http::{Chunked, Ended, Incoming, Reply, Request};
use lanes::Lanes;
use render::RenderCtx;
use tls::{Conn, Handshake};

/// Connections served at once (a thread each); more are answered 503 and closed. Above the
/// capacity bench's thousand streams held open at once, as a real provider serves them: at 256
/// the bench's later runs were refused by the mock, not by broca.
pub const MAX_CONNECTIONS: usize = 2048;
/// Idle read/write limit on a connection.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kept-alive connection may sit idle between requests before the server closes it
/// (real providers close idle connections too, after tens of seconds).
pub const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(5);

/// How a [`MockServer`] serves connections; the default is plain HTTP with keep-alive.
#[derive(Clone, Debug, Default)]
pub struct MockOptions {
    /// Serve HTTPS with a certificate generated at start ([`MockServer::ca_pem`] is its root).
    pub tls: bool,
    /// Answer every request `Connection: close` (a provider that never keeps connections).
    pub no_keep_alive: bool,
    /// Close a kept-alive connection after this much idleness instead of [`KEEP_ALIVE_IDLE`]
    /// (a provider whose idle timeout a client may outlive).
    pub idle_close: Option<Duration>,
    /// Append every classifier provider call, once answered, to this file as a JSON line
    /// ([`classify`]; created if absent).
    pub classify_log: Option<std::path::PathBuf>,
    /// Append a line per checked model request (strict mode) to this file; `None`: the file
    /// `BROCA_MOCK_RULES_LOG` names, if set when the server starts.
    pub rules_log: Option<std::path::PathBuf>,
}

/// Connections and TLS handshakes counted at the server, outside any client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Connections {
    pub accepts: u64,
    pub tls_full: u64,
    pub tls_resumed: u64,
}

/// The state shared by the listener and connection threads.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) lanes: Lanes,
    /// The classifier providers' stand-in.
    pub(crate) classify: classify::Stand,
    next_id: AtomicU64,
    stopping: http::Stopping,
    connections: AtomicUsize,
    options: MockOptions,
    tls: Option<Arc<rustls::ServerConfig>>,
    counted: Mutex<Connections>,
    /// When the last model request's head arrived (for start-up latency figures).
    last_request_at: Mutex<Option<std::time::Instant>>,
    /// Where strict mode's lines go ([`MockOptions::rules_log`]).
    rules_log: Option<std::path::PathBuf>,
}

impl Shared {
    pub(crate) fn connections_counted(&self) -> Connections {
        *self.counted.lock()
    }
}

/// A running mock provider. Dropping it stops the listener.
pub struct MockServer {
    shared: Arc<Shared>,
    /// The address clients connect to (loopback when bound to an unspecified address).
    addr: SocketAddr,
    listener: Option<JoinHandle<()>>,
    ca_pem: Option<String>,
}

impl MockServer {
    /// Binds `bind` (e.g. `127.0.0.1:0`) and starts serving plain HTTP with keep-alive.
    pub fn start(bind: &str) -> io::Result<MockServer> {
        MockServer::start_with(bind, MockOptions::default())
    }

    /// Binds `bind` and starts serving as `options` say.
    pub fn start_with(bind: &str, options: MockOptions) -> io::Result<MockServer> {
        let identity = if options.tls { Some(tls::generate().map_err(io::Error::other)?) } else { None };
        let listener = TcpListener::bind(bind)?;
        let mut addr = listener.local_addr()?;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let (tls, ca_pem) = match identity {
            Some(id) => (Some(id.config), Some(id.ca_pem)),
            None => (None, None),
        };
        let classify = classify::Stand::new(options.classify_log.as_deref())?;
        let rules_log = options
            .rules_log
            .clone()
            .or_else(|| std::env::var_os(RULES_LOG_ENV).filter(|p| !p.is_empty()).map(Into::into));
        let shared = Arc::new(Shared { options, tls, classify, rules_log, ..Shared::default() });
        let accept_shared = Arc::clone(&shared);
        let handle = thread::Builder::new()
            .name("broca-mock-listen".into())
            .spawn(move || accept_loop(listener, accept_shared))?;
        log::info!("broca-mock listening on {addr}");
        Ok(MockServer { shared, addr, listener: Some(handle), ca_pem })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:<port>` (`https://` when serving TLS).
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The PEM of the root that signed the server's certificate, when serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// Connections accepted so far (every TCP connection, whatever it then sent).
    pub fn accepts(&self) -> u64 {
        self.shared.connections_counted().accepts
    }

    /// Accepts and TLS handshakes so far.
    pub fn connections(&self) -> Connections {
        self.shared.connections_counted()
    }

    /// Connections the server is serving now (open, kept alive or mid-response).
    pub fn open_connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// When the last model request's head arrived.
    pub fn last_request_at(&self) -> Option<std::time::Instant> {
        *self.shared.last_request_at.lock()
    }

    /// The base URL a route points at: `.../v1` for the default lane, `.../lane/<lane>/v1`.
    pub fn base_url(&self, lane: Option<&str>) -> String {
        match lane {
            None => format!("{}/v1", self.url()),
            Some(lane) => format!("{}/lane/{lane}/v1", self.url()),
        }
    }

    /// Appends the script's responses to the lane's FIFO.
    pub fn install(&self, lane: &str, script: Script) {
        self.shared.lanes.install(lane, script);
    }

    /// The lane's recorded requests, oldest first.
    pub fn requests(&self, lane: &str) -> Vec<RecordedRequest> {
        self.shared.lanes.requests(lane)
    }

    /// The lane's Code Assist setup requests (`loadCodeAssist`, `onboardUser`, operation
    /// reads), in order; not among [`MockServer::requests`].
    pub fn setup_requests(&self, lane: &str) -> Vec<RecordedRequest> {
        self.shared.lanes.setup_requests(lane)
    }

    /// Requests dropped from the lane's record by the cap.
    pub fn dropped_requests(&self, lane: &str) -> u64 {
        self.shared.lanes.dropped(lane)
    }

    /// Scripted responses still queued on the lane.
    pub fn pending(&self, lane: &str) -> usize {
        self.shared.lanes.pending(lane)
    }

    /// Clears the lane's FIFO and records.
    pub fn reset(&self, lane: &str) {
        self.shared.lanes.reset(lane);
    }

    /// The classifier providers' stand-in: scripts, counts, holds and the call log.
    pub fn classify(&self) -> &classify::Stand {
        &self.shared.classify
    }

    /// Stops accepting and joins the listener thread; streams in flight end at their next
    /// delay. Idempotent.
    pub fn shutdown(&mut self) {
        let Some(handle) = self.listener.take() else { return };
        self.shared.stopping.stop();
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if handle.join().is_err() {
            log::error!("broca-mock listener thread panicked");
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        match conn {
            Ok(stream) => {
                shared.counted.lock().accepts += 1;
                spawn_connection(&shared, stream)
            }
            Err(e) => {
                log::warn!("broca-mock accept failed: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Decrements the connection count when a connection thread ends.
struct ConnectionSlot(Arc<Shared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

fn spawn_connection(shared: &Arc<Shared>, mut stream: TcpStream) {
    if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = http::write_reply(&mut stream, &Reply::refusal(503, "broca-mock connection limit reached"), false);
        return;
    }
    let slot = ConnectionSlot(Arc::clone(shared));
    let spawned = thread::Builder::new().name("broca-mock-conn".into()).spawn(move || {
        let shared = Arc::clone(&slot.0);
        if let Err(e) = serve(&shared, stream) {
            // Clients hanging up mid-stream is routine in tests.
            log::debug!("broca-mock connection ended: {e}");
        }
        drop(slot);
    });
    if let Err(e) = spawned {
        log::warn!("broca-mock cannot spawn a connection thread: {e}");
    }
}

/// Serves one connection: requests until the client closes it, asks to close, or idles past
/// the keep-alive limit; a scripted disconnect or an error ends it too.
fn serve(shared: &Shared, stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut conn = match &shared.tls {
        None => Conn::Plain(stream),
        Some(config) => {
            let (conn, kind) = Conn::tls(config, stream)?;
            let mut counted = shared.counted.lock();
            match kind {
                Handshake::Full => counted.tls_full += 1,
                Handshake::Resumed => counted.tls_resumed += 1,
            }
            conn
        }
    };
    let idle = shared.options.idle_close.unwrap_or(KEEP_ALIVE_IDLE);
    let mut first = true;
    loop {
        if !first {
            // Between requests: wait for the next one as long as the keep-alive limit.
            conn.tcp().set_read_timeout(Some(idle))?;
        }
        let incoming = match http::read_request(&mut conn) {
            Ok(incoming) => incoming,
            Err(e) if !first && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                log::debug!("broca-mock: closing a connection idle for {idle:?}");
                conn.close();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        first = false;
        conn.tcp().set_read_timeout(Some(IO_TIMEOUT))?;
        let request = match incoming {
            Incoming::Closed => return Ok(()),
            Incoming::Refused(reply) => {
                log::warn!("broca-mock refused a request: {}", reply.status);
                http::write_reply(&mut conn, &reply, false)?;
                http::drain(&mut conn);
                return Ok(());
            }
            Incoming::Request(r) => r,
        };
        let keep = !shared.options.no_keep_alive
            && !shared.stopping.load(Ordering::SeqCst)
            && !request.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if !serve_request(shared, &mut conn, request, keep)? {
            conn.close();
            return Ok(());
        }
    }
}

/// Answers one request; returns whether the connection stays open.
fn serve_request(shared: &Shared, conn: &mut Conn, request: Request, keep: bool) -> io::Result<bool> {
    log::debug!("broca-mock {} {} ({} body bytes)", request.method, request.target, request.body.len());
    if request.path().starts_with("/_mock/") {
        http::write_reply(conn, &control::handle(shared, &request), keep)?;
        return Ok(keep);
    }
    if let Some(route) = classify::route(request.path()) {
        let Some(reply) = classify::answer(&shared.classify, &shared.stopping, &request, route) else {
            return Ok(false);
        };
        http::write_reply(conn, &reply, keep)?;
        return Ok(keep);
    }
    let Some((lane, rest)) = route(request.path()) else {
        http::write_reply(conn, &Reply::refusal(404, "not a broca-mock route"), keep)?;
        return Ok(keep);
    };
    let lane = lane.to_string();
    let family = family_of(rest).map(|f| match f {
        // The Codex client speaks Responses to the ChatGPT backend, and says so.
        Family::OpenaiResponses if request.header("originator").is_some() => Family::OpenaiChatgptResponses,
        other => other,
    });
    let is_model = family.is_some() && request.method == "POST";
    let model = model_of(&request);
    let authorized = shared.lanes.authorized(&lane, request.header("authorization"));
    let setup = code_assist::is_setup_path(rest).then(|| rest.to_owned());
    let Request { method, target, headers, body } = request;
    let parsed = if is_model { serde_json::from_slice::<serde_json::Value>(&body).ok() } else { None };
    // Strict mode: the provider's rules, checked on what was received (then recorded as is).
    let violations = match (family, &parsed) {
        (Some(family), Some(body)) => rules::check_value(family, &target, &headers, body),
        _ => Vec::new(),
    };
    if let Some(rest) = setup {
        let request = RecordedRequest::new(&method, &target, headers, body, None);
        let reply = shared.lanes.code_assist_setup(&lane, &rest, request);
        let reply = if authorized { reply } else { code_assist::unauthenticated() };
        http::write_reply(conn, &reply, keep)?;
        return Ok(keep);
    }
    shared.lanes.record(&lane, RecordedRequest::new(&method, &target, headers, body, family));
    let Some(family) = family.filter(|_| is_model) else {
        let status = if family.is_some() { 405 } else { 404 };
        http::write_reply(conn, &Reply::refusal(status, "not a model request"), keep)?;
        return Ok(keep);
    };
    *shared.last_request_at.lock() = Some(std::time::Instant::now());
    let (allowed, violations): (Vec<_>, Vec<_>) =
        violations.into_iter().partition(|v| shared.lanes.allows(&lane, v.rule));
    log_rules(shared.rules_log.as_deref(), (family, &lane, &target), &violations, &allowed);
    if let (true, Some(violation)) = (authorized, violations.first()) {
        log::warn!("broca-mock: lane {lane}: {target} breaks provider rule {}: {}", violation.rule, violation.message);
        let refusal = rules::refusal(family, violation);
        let mut reply = Reply::json(refusal.status, &serde_json::Value::Null);
        reply.headers.extend(refusal.headers);
        reply.body = refusal.body;
        http::write_reply(conn, &reply, keep)?;
        return Ok(keep);
    }
    if let (Family::AwsBedrockConverse, Some(region)) = (family, shared.lanes.aws_region(&lane)) {
        if let Some(reply) = wrong_region(&recorded_authorization(shared, &lane), &region) {
            http::write_reply(conn, &reply, keep)?;
            return Ok(keep);
        }
    }
    if family == Family::GoogleCodeAssist && authorized {
        let project = parsed.as_ref().and_then(|b| b.get("project")).and_then(|p| p.as_str());
        if let Some(reply) = shared.lanes.code_assist_refusal(&lane, project) {
            log::warn!("broca-mock: lane {lane}: a Code Assist request names project {project:?}; 403");
            http::write_reply(conn, &reply, keep)?;
            return Ok(keep);
        }
    }
    let warm_body = parsed.as_ref().filter(|b| family == Family::AnthropicMessages && warm::is_warm(b));
    if let (true, Some(body)) = (authorized, warm_body) {
        return answer_warm(shared, conn, &lane, &model, body, keep);
    }
    let response = if authorized {
        let response = shared.lanes.pop(&lane).unwrap_or_else(|| ScriptedResponse::Stream(default_reply()));
        match (response, &parsed) {
            (ScriptedResponse::Stream(mut reply), Some(body)) if reply.wants_measure() => {
                reply.measure_with(&shared.lanes.measure(&lane, family, body));
                ScriptedResponse::Stream(reply)
            }
            (response, _) => response,
        }
    } else {
        log::info!("broca-mock: lane {lane}: the request's Authorization is not the scripted credential; 401");
        ScriptedResponse::Http(script::HttpReply { status: 401, body: None, headers: Default::default(), delay_ms: 0 })
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed).to_string();
    // OpenAI states the level it served; asked for one, it says that one ("priority").
    let served_tier = match family {
        Family::OpenaiChat | Family::OpenaiResponses => {
            parsed.as_ref().and_then(|b| b.get("service_tier")).and_then(|t| t.as_str()).map(str::to_owned)
        }
        _ => None,
    };
    answer(shared, conn, family, (model, served_tier), id, response, keep)
}

/// The `Authorization` of the lane's newest recorded request (the one being answered).
fn recorded_authorization(shared: &Shared, lane: &str) -> Option<String> {
    shared.lanes.requests(lane).last().and_then(|r| r.header("authorization").map(str::to_owned))
}

/// AWS's refusal of a request whose SigV4 credential scope
/// (`Credential=<key>/<date>/<region>/<service>/aws4_request`) names a region other than the
/// endpoint's; a request without a signature is not judged here.
fn wrong_region(authorization: &Option<String>, region: &str) -> Option<Reply> {
    let scope = authorization.as_deref()?.strip_prefix("AWS4-HMAC-SHA256 Credential=")?;
    let signed_for = scope.split('/').nth(2)?;
    (signed_for != region).then(|| {
        let mut reply =
            Reply::json(403, &serde_json::json!({"message": "Credential should be scoped to a valid region. "}));
        reply.headers.push((
            "x-amzn-ErrorType".into(),
            "InvalidSignatureException:http://internal.amazon.com/coral/com.amazon.coral.service/".into(),
        ));
        reply
    })
}

/// The file strict mode's per-request lines go to when [`MockOptions::rules_log`] is unset.
pub const RULES_LOG_ENV: &str = "BROCA_MOCK_RULES_LOG";

/// Appends one line for a checked model request to `log`: `{"family", "violations": [ids]}`,
/// with `allowed` (broken rules the lane's scripts allow) and, on either, the lane, target and
/// messages. One `write` of one line to a file opened for appending: several processes write
/// the same file.
fn log_rules(
    log: Option<&std::path::Path>,
    (family, lane, target): (Family, &str, &str),
    violations: &[rules::Violation],
    allowed: &[rules::Violation],
) {
    let Some(path) = log else { return };
    let ids = |vs: &[rules::Violation]| vs.iter().map(|v| v.rule).collect::<Vec<_>>();
    let mut line = serde_json::json!({"family": family.as_str(), "violations": ids(violations)});
    if !allowed.is_empty() {
        line["allowed"] = ids(allowed).into();
    }
    if !violations.is_empty() || !allowed.is_empty() {
        line["lane"] = lane.into();
        line["target"] = target.into();
        line["messages"] = violations.iter().chain(allowed).map(|v| v.message.as_str()).collect::<Vec<_>>().into();
    }
    let mut text = line.to_string();
    text.push('\n');
    let written = std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut file| {
        use std::io::Write;
        file.write_all(text.as_bytes())?;
        file.flush()
    });
    if let Err(e) = written {
        log::error!("broca-mock: cannot append to {}: {e}", path.display());
    }
}

/// Answers a warm (`warm`): its scripted delay and status, else what the lane's prompt cache
/// earns it. Pops no scripted response.
fn answer_warm(
    shared: &Shared,
    conn: &mut Conn,
    lane: &str,
    model: &str,
    body: &serde_json::Value,
    keep: bool,
) -> io::Result<bool> {
    let scripted = shared.lanes.pop_warm(lane);
    if !http::pause(scripted.delay_ms, &shared.stopping) {
        return Ok(false);
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed).to_string();
    let reply = match (scripted.status, warm::refused(body)) {
        (Some(status), _) => {
            let mut reply = Reply::json(
                status,
                &render::error_document(Family::AnthropicMessages, status, &format!("req_mock{id}")),
            );
            reply.headers.push(("request-id".into(), format!("req_mock{id}")));
            reply
        }
        (None, Some(why)) => warm::refusal(why, &id),
        (None, None) => warm::answer(model, &id, &shared.lanes.measure(lane, Family::AnthropicMessages, body)),
    };
    http::write_reply(conn, &reply, keep)?;
    Ok(keep)
}

/// Sends one scripted response; returns whether the connection stays open.
fn answer(
    shared: &Shared,
    conn: &mut Conn,
    family: Family,
    (model, served_tier): (String, Option<String>),
    id: String,
    response: ScriptedResponse,
    keep: bool,
) -> io::Result<bool> {
    let request_id = format!("req_mock{id}");
    let id_header = match family {
        Family::AnthropicMessages => Some("request-id"),
        Family::OpenaiChat | Family::OpenaiResponses | Family::OpenaiChatgptResponses => Some("x-request-id"),
        Family::GoogleGenerateContent | Family::GoogleCodeAssist => None,
        Family::AwsBedrockConverse => Some("x-amzn-requestid"),
    };
    let mut headers: Vec<(String, String)> =
        id_header.map(|name| (name.to_string(), request_id.clone())).into_iter().collect();
    match response {
        ScriptedResponse::Http(reply) => {
            if !http::pause(reply.delay_ms, &shared.stopping) {
                return Ok(false);
            }
            let keep = keep && http::framing_free(reply.headers.keys());
            let body = reply.body.unwrap_or_else(|| render::error_document(family, reply.status, &request_id));
            let mut out = Reply::json(reply.status, &body);
            out.headers.extend(headers);
            out.headers.extend(reply.headers);
            http::write_reply(conn, &out, keep)?;
            Ok(keep)
        }
        ScriptedResponse::Stream(reply) => {
            if !http::pause(reply.delay_ms, &shared.stopping) {
                return Ok(false);
            }
            let keep = keep && http::framing_free(reply.headers.keys());
            let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let ctx = RenderCtx { model, id, created, served_tier };
            let pieces = render::render(family, &reply.events, &ctx);
            let stamp = reply.uses_now_token();
            if family == Family::AwsBedrockConverse {
                headers.push(("Content-Type".into(), "application/vnd.amazon.eventstream".into()));
            }
            headers.extend(reply.headers);
            http::write_stream_head(conn, &headers, keep)?;
            let ended = if keep {
                let mut body = Chunked(&mut *conn);
                let ended = http::write_pieces(&mut body, &pieces, &reply.write, stamp, &shared.stopping)?;
                if ended == Ended::Complete {
                    body.finish()?;
                }
                ended
            } else {
                http::write_pieces(conn, &pieces, &reply.write, stamp, &shared.stopping)?
            };
            match ended {
                Ended::Complete => Ok(keep),
                Ended::Disconnect => {
                    conn.cut();
                    Ok(false)
                }
                Ended::Stopped => Ok(false),
            }
        }
    }
}

/// `/v1/...` → (`default`, `/...`); `/lane/<name>/v1/...` → (`<name>`, `/...`).
fn route(path: &str) -> Option<(&str, &str)> {
    let (lane, rest) = match path.strip_prefix("/lane/") {
        Some(rest) => {
            let (name, rest) = rest.split_once('/')?;
            (name, format_rest(rest)?)
        }
        None => ("default", format_rest(path.strip_prefix('/')?)?),
    };
    (!lane.is_empty()).then_some((lane, rest))
}

/// `v1/x` → `/x`; `v1` → ``.
fn format_rest(rest: &str) -> Option<&str> {
    let rest = rest.strip_prefix("v1")?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

fn family_of(rest: &str) -> Option<Family> {
    if gemini_model(rest).is_some() {
        return Some(Family::GoogleGenerateContent);
    }
    if bedrock_model(rest).is_some() {
        return Some(Family::AwsBedrockConverse);
    }
    if rest == "/v1internal:streamGenerateContent" {
        return Some(Family::GoogleCodeAssist);
    }
    [Family::AnthropicMessages, Family::OpenaiChat, Family::OpenaiResponses]
        .into_iter()
        .find(|f| broca::provider::wire(*f).path() == rest)
}

/// The model a Bedrock path names: `/model/<percent-encoded id>/converse-stream`, decoded.
fn bedrock_model(rest: &str) -> Option<String> {
    let encoded =
        rest.strip_prefix("/model/")?.strip_suffix(broca::provider::wire(Family::AwsBedrockConverse).path())?;
    rules::percent_decode(encoded).filter(|m| !m.is_empty() && !m.contains('/'))
}

/// The model a Gemini path names: `/models/<model>:streamGenerateContent`.
fn gemini_model(rest: &str) -> Option<&str> {
    let model =
        rest.strip_prefix("/models/")?.strip_suffix(broca::provider::wire(Family::GoogleGenerateContent).path())?;
    (!model.is_empty() && !model.contains('/')).then_some(model)
}

/// The request's `model` (Gemini's is in the path), echoed in the stream as real servers do.
fn model_of(request: &Request) -> String {
    if let Some(model) = route(request.path()).and_then(|(_, rest)| gemini_model(rest)) {
        return model.to_string();
    }
    if let Some(model) = route(request.path()).and_then(|(_, rest)| bedrock_model(rest)) {
        return model;
    }
    serde_json::from_slice::<serde_json::Value>(&request.body)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_else(|| "broca-mock".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_lanes_and_families() {
        assert_eq!(route("/v1/messages"), Some(("default", "/messages")));
        assert_eq!(route("/lane/a-1/v1/chat/completions"), Some(("a-1", "/chat/completions")));
        assert_eq!(route("/lane/x/v1"), Some(("x", "")));
        assert_eq!(route("/v1x/messages"), None);
        assert_eq!(route("/lane//v1/messages"), None);
        assert_eq!(route("/lane/x/v2/messages"), None);
        assert_eq!(route("/other"), None);
        assert_eq!(family_of("/responses"), Some(Family::OpenaiResponses));
        assert_eq!(family_of("/messages"), Some(Family::AnthropicMessages));
        assert_eq!(family_of("/models"), None);
    }

    #[test]
    fn the_documented_example_script_decodes() {
        let doc: String = include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let start = doc.find("```json\n").unwrap() + "```json\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let script = Script::from_json(&doc[start..end]).unwrap();
        assert_eq!(script.responses.len(), 5);
    }

    /// One request over a fresh connection: (status, headers and body as text).
    fn post(server: &MockServer, target: &str, headers: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut conn = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        let head = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).unwrap();
        conn.write_all(body.as_bytes()).unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).unwrap();
        (out[9..12].parse().unwrap(), out)
    }

    #[test]
    fn strict_mode_refuses_a_broken_rule_as_the_provider_does_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("rules.jsonl");
        let options = MockOptions { rules_log: Some(log.clone()), ..MockOptions::default() };
        let server = MockServer::start_with("127.0.0.1:0", options).unwrap();
        let empty_text =
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":""}]}]}"#;
        let (status, out) = post(&server, "/lane/s/v1/messages", "x-api-key: k\r\n", empty_text);
        assert_eq!(status, 400, "{out}");
        assert!(out.contains(r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: text content blocks must be non-empty"}}"#), "{out}");
        // Recorded all the same; nothing popped.
        assert_eq!(server.requests("s").len(), 1);
        // Bedrock's refusal names its exception.
        let path = "/lane/b/v1/model/amazon.nova-pro-v1%3A0/converse-stream";
        let (status, out) = post(&server, path, "", r#"{"messages":[]}"#);
        assert_eq!(status, 400);
        assert!(
            out.contains("x-amzn-ErrorType: ValidationException")
                && out.contains(r#"{"message":"A conversation must start"#),
            "{out}"
        );
        // A bearer API key on Anthropic: 401.
        let good = r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
        let (status, out) = post(&server, "/lane/s/v1/messages", "Authorization: Bearer sk\r\n", good);
        assert_eq!(status, 401, "{out}");
        // Allowed by name: answered as if kept.
        let allow = Script::from_json(r#"{"allow_rules": ["anthropic.text_non_empty"]}"#).unwrap();
        server.install("s", allow);
        let (status, out) = post(&server, "/lane/s/v1/messages", "x-api-key: k\r\n", empty_text);
        assert_eq!(status, 200, "{out}");
        let (status, _) = post(&server, "/lane/s/v1/messages", "", good);
        assert_eq!(status, 200);
        assert!(Script::from_json(r#"{"allow_rules": ["anthropic.no_such_rule"]}"#).is_err());
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let ids: Vec<_> = lines.iter().map(|l| (l["family"].as_str().unwrap(), l["violations"].clone())).collect();
        assert_eq!(
            ids,
            [
                ("anthropic_messages", serde_json::json!(["anthropic.text_non_empty"])),
                ("aws_bedrock_converse", serde_json::json!(["bedrock.first_message_user"])),
                ("anthropic_messages", serde_json::json!(["anthropic.bearer_needs_oauth_beta"])),
                ("anthropic_messages", serde_json::json!([])),
                ("anthropic_messages", serde_json::json!([])),
            ]
        );
        assert_eq!(lines[3]["allowed"], serde_json::json!(["anthropic.text_non_empty"]));
        assert_eq!(lines[4].get("allowed"), None);
    }

    #[test]
    fn base_urls() {
        let server = MockServer::start("127.0.0.1:0").unwrap();
        let port = server.port();
        assert_eq!(server.base_url(None), format!("http://127.0.0.1:{port}/v1"));
        assert_eq!(server.base_url(Some("b")), format!("http://127.0.0.1:{port}/lane/b/v1"));
    }
}
