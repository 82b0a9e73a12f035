//! The model client seam and its HTTP implementation (blocking ureq on a pooled helper thread).
//!
//! The loop never blocks on the network: [`ModelClient::start`] returns at once with a channel,
//! and a streamer thread POSTs the request, frames SSE, decodes the family's events, counts
//! telemetry and sends [`AttemptEvent`]s back. Dropping the receiver, or setting the attempt's
//! cancel flag, stops the streamer at its next read.
//!
//! # Connections
//!
//! One [`ureq::Agent`] per provider origin (and read timeout) keeps warm keep-alive connections,
//! so a run of any number of steps against one host makes one TCP connection and one TLS
//! handshake. A stream is read to its end after its terminal event (bounded by
//! [`DRAIN_LIMIT`]), which is what returns its connection to the agent's pool; a cancelled,
//! failed or oversized stream drops its connection instead, so nothing reuses a connection left
//! mid-response. The pool is bounded by [`POOL_IDLE_PER_HOST`] and [`POOL_IDLE_TIMEOUT`]. All
//! agents of a client share one rustls configuration, so a new connection to a host it has seen
//! resumes the TLS session (rustls' in-memory session cache).
//!
//! Trust is the Mozilla roots (webpki-roots) plus, only when asked, one extra root for tests:
//! [`HttpClient::with_test_root_pem`], or in debug builds the PEM file named by
//! [`TEST_CA_ENV`]. Nothing turns certificate verification off.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crossbeam_channel::{bounded, Receiver, Sender};

use super::code_assist::{self, Project, ProjectCache};
use super::config::RenderConfig;
use super::event::StreamEvent;
use super::telemetry::Telemetry;
use super::warm::{WarmAnswer, WarmCall};
use crate::record::{ErrorClass, ProviderError};

/// Batches of events buffered between the streamer and the loop (backpressure beyond this).
/// Each batch is everything one socket read decoded (up to [`READ_CHUNK`] bytes), so a small
/// queue holds a long stream; it is allocated per attempt, so it is kept small.
const EVENT_QUEUE: usize = 64;
const READ_CHUNK: usize = 16 << 10;

pub use crate::limits::{POOL_IDLE_PER_HOST, STREAMER_THREADS};
/// An agent idle longer than this is replaced by a fresh one (its pooled connections are then
/// closed, not reused): real providers close idle connections after tens of seconds, and a
/// POST on a connection the server is closing would fail instead of being retried.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes read after a stream's terminal event to reach its end (and so return the
/// connection to the pool); a stream with more is dropped with its connection.
pub const DRAIN_LIMIT: usize = 64 << 10;
/// How long a new attempt waits for a stream of the same agent to finish draining, so it
/// reuses that connection instead of opening another (draining normally takes microseconds:
/// the last chunk follows the terminal event).
const DRAIN_WAIT: Duration = Duration::from_millis(50);
/// The environment variable naming a PEM file whose certificates a debug build's default
/// client trusts as extra roots (a test provider's self-signed CA). Release builds ignore it.
pub const TEST_CA_ENV: &str = "BROCA_TEST_PROVIDER_CA";

/// One model attempt to run.
#[derive(Clone)]
pub struct Attempt {
    pub config: RenderConfig,
    pub body: Vec<u8>,
    /// The secret for `AuthSource::Bearer` (or the vault credential for `AuthSource::Vault`),
    /// held only in memory.
    pub bearer: Option<String>,
    /// The account the credential belongs to, sent where the family routes by it.
    pub account_id: Option<String>,
    /// The longest silence tolerated on the socket before the read fails.
    pub read_timeout: Duration,
    pub cancel: Arc<AtomicBool>,
}

/// What an attempt reports, in order; exactly one terminal (`Http`, `Failed` or `End`).
#[derive(Debug)]
pub enum AttemptEvent {
    /// Decoded stream events of one read, in order, with the time they arrived (one message
    /// per read, not per event, so a burst costs one wake-up of the loop).
    Stream { events: Vec<StreamEvent>, at_ms: u64 },
    /// The provider refused before streaming (non-2xx).
    Http { error: ProviderError, retry_after: Option<Duration> },
    /// The connection or the stream broke (transport error, undecodable data).
    Failed { error: ProviderError, telemetry: Telemetry },
    /// The stream ended; `terminal` is whether its documented terminal event arrived.
    End { terminal: bool, telemetry: Telemetry },
}

/// Starts model attempts. Implementations must return immediately.
pub trait ModelClient: Send + Sync {
    fn start(&self, attempt: Attempt) -> Receiver<AttemptEvent>;

    /// Sends one `session.warm` and waits for the provider's answer. Blocking: a warm runs on
    /// its own thread, never on a session's actor. A client that cannot reach a provider this
    /// way refuses it.
    fn warm(&self, call: WarmCall) -> Result<WarmAnswer, ProviderError> {
        let _ = call;
        Err(ProviderError::permanent("warm_unsupported_client", "this model client sends no warm requests"))
    }

    /// Finds the Code Assist project of a lookup's credential (`super::code_assist`). Returns
    /// at once; the answer arrives on the channel, so the loop can still hear a cancel. A
    /// client that cannot reach the backend this way refuses it.
    fn code_assist_project(&self, lookup: ProjectLookup) -> Receiver<Result<Project, ProviderError>> {
        let _ = lookup;
        let (tx, rx) = bounded(1);
        let message = "this model client does not find Code Assist projects";
        let _ = tx.send(Err(ProviderError::permanent("code_assist_unsupported_client", message)));
        rx
    }
}

/// What finding a Code Assist project needs: the run's route and credential, the project the
/// operator configured, and the run's cancel flag (checked between onboarding polls).
pub struct ProjectLookup {
    pub config: RenderConfig,
    pub bearer: Option<String>,
    pub configured: Option<String>,
    pub cancel: Arc<AtomicBool>,
}

/// The real client: ureq, one helper thread per attempt in flight (reused from a
/// [`crate::pool::Pool`]: starting a thread per step cost tens of microseconds). The read timeout (the socket-level half of
/// the watchdog) is the attempt's; agents (connection pool) are built once per provider origin
/// and distinct timeout and reused, since building one is costly and its pool is the point.
pub struct HttpClient {
    agents: Mutex<Vec<Arc<AgentSlot>>>,
    /// Extra roots (tests only) for the TLS configuration, which is built for the first HTTPS
    /// agent: a process that only talks plain HTTP (a CLI turn on a local server) never pays
    /// for the root store.
    extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    tls: std::sync::OnceLock<Option<Arc<rustls::ClientConfig>>>,
    streamers: crate::pool::Pool,
    /// Code Assist projects found, per credential.
    projects: Arc<ProjectCache>,
}

/// One agent and what tells when its pooled connections may be reused.
struct AgentSlot {
    origin: String,
    read_timeout: Duration,
    agent: ureq::Agent,
    /// Streams of this agent that saw their terminal event and are still reading to the end.
    draining: Mutex<usize>,
    drained: Condvar,
    /// When the agent last finished a request (its newest pooled connection's age).
    last_used: Mutex<Instant>,
}

impl AgentSlot {
    /// Waits (bounded) until no stream of this agent is still draining.
    fn wait_drained(&self) {
        let mut draining = self.draining.lock();
        let deadline = Instant::now() + DRAIN_WAIT;
        while *draining > 0 {
            if self.drained.wait_until(&mut draining, deadline).timed_out() {
                break;
            }
        }
    }

    fn begin_drain(&self) {
        *self.draining.lock() += 1;
    }

    fn end_drain(&self) {
        *self.last_used.lock() = Instant::now();
        let mut draining = self.draining.lock();
        *draining = draining.saturating_sub(1);
        self.drained.notify_all();
    }
}

impl Default for HttpClient {
    /// The Mozilla roots; in debug builds also the PEM file named by [`TEST_CA_ENV`], if set.
    fn default() -> Self {
        let extra = if cfg!(debug_assertions) { std::env::var_os(TEST_CA_ENV) } else { None };
        let pem = extra.and_then(|path| match std::fs::read_to_string(&path) {
            Ok(pem) => Some(pem),
            Err(e) => {
                log::error!(target: "broca.provider", "{TEST_CA_ENV}={}: {e}; not trusted", path.to_string_lossy());
                None
            }
        });
        match pem.map(|pem| HttpClient::with_test_root_pem(&pem)) {
            Some(Ok(client)) => client,
            Some(Err(e)) => {
                log::error!(target: "broca.provider", "{TEST_CA_ENV}: {e}; not trusted");
                HttpClient::with_roots(&[])
            }
            None => HttpClient::with_roots(&[]),
        }
    }
}

impl HttpClient {
    /// A client that also trusts the certificates in `pem` as roots. For tests against a
    /// provider with a self-signed certificate (broca-mock's TLS mode); production clients use
    /// [`HttpClient::default`].
    pub fn with_test_root_pem(pem: &str) -> Result<HttpClient, String> {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not a PEM certificate list: {e}"))?;
        if certs.is_empty() {
            return Err("no certificate in the PEM".into());
        }
        Ok(HttpClient::with_roots(&certs))
    }

    fn with_roots(extra: &[rustls::pki_types::CertificateDer<'static>]) -> HttpClient {
        HttpClient {
            agents: Mutex::new(Vec::new()),
            extra_roots: extra.to_vec(),
            tls: std::sync::OnceLock::new(),
            streamers: crate::pool::Pool::new("broca-stream", STREAMER_THREADS),
            projects: Default::default(),
        }
    }

    fn slot(&self, origin: &str, read_timeout: Duration) -> Arc<AgentSlot> {
        let mut agents = self.agents.lock();
        let found = agents.iter().position(|s| s.origin == origin && s.read_timeout == read_timeout);
        if let Some(i) = found {
            let slot = &agents[i];
            let idle = *slot.draining.lock() == 0 && slot.last_used.lock().elapsed() > POOL_IDLE_TIMEOUT;
            if !idle {
                return Arc::clone(slot);
            }
            log::debug!(target: "broca.provider", "{origin}: pool idle past {POOL_IDLE_TIMEOUT:?}; new connections");
            agents.swap_remove(i);
        }
        let config = agent_config(read_timeout);
        let tls = if origin.starts_with("https:") {
            self.tls.get_or_init(|| tls_config(&self.extra_roots)).as_ref()
        } else {
            None
        };
        let agent = match tls {
            Some(tls) => super::tls::agent(config, Arc::clone(tls)),
            None => ureq::Agent::new_with_config(config),
        };
        let slot = Arc::new(AgentSlot {
            origin: origin.to_string(),
            read_timeout,
            agent,
            draining: Mutex::new(0),
            drained: Condvar::new(),
            last_used: Mutex::new(Instant::now()),
        });
        agents.push(Arc::clone(&slot));
        slot
    }
}

/// An agent's configuration: what ureq 2's agent did, spelled out where ureq 3's defaults
/// differ. A status is an answer, not an error (a 4xx or 5xx is read and classified here);
/// no proxy from the environment; at most 5 redirects; a connect timeout and the per-read one
/// (the socket half of the watchdog); the pool bounded by [`POOL_IDLE_PER_HOST`], a pooled
/// connection reused for as long as its agent is ([`POOL_IDLE_TIMEOUT`], not ureq 3's 15 s).
fn agent_config(read_timeout: Duration) -> ureq::config::Config {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(5)
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_per_read(Some(read_timeout))
        .max_idle_connections(POOL_IDLE_PER_HOST)
        .max_idle_connections_per_host(POOL_IDLE_PER_HOST)
        .max_idle_age(POOL_IDLE_TIMEOUT)
        .build()
}

/// The client TLS configuration every agent shares: webpki roots plus `extra`, ring (the
/// provider ureq's rustls uses), TLS 1.2 and 1.3, rustls' default in-memory session cache (so
/// reconnects resume). `None` (ureq's own default) only if the provider refuses the versions.
fn tls_config(extra: &[rustls::pki_types::CertificateDer<'static>]) -> Option<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    for cert in extra {
        if let Err(e) = roots.add(cert.clone()) {
            log::error!(target: "broca.provider", "an extra root certificate is unusable: {e}");
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions() {
        Ok(builder) => Some(Arc::new(builder.with_root_certificates(roots).with_no_client_auth())),
        Err(e) => {
            log::error!(target: "broca.provider", "TLS configuration: {e}; using ureq's default");
            None
        }
    }
}

/// `scheme://host[:port]` of a base URL (the pool's key); the whole string if it has no path.
fn origin(base_url: &str) -> &str {
    let after_scheme = base_url.find("://").map_or(0, |i| i + 3);
    match base_url[after_scheme..].find('/') {
        Some(i) => &base_url[..after_scheme + i],
        None => base_url,
    }
}

/// How long a warm may take to answer (a zero-output request answers in about the time the
/// provider takes to read the prefix).
pub const WARM_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes read of a warm's answer (or of a refusal's body).
const WARM_ANSWER_MAX: u64 = 1 << 20;

impl ModelClient for HttpClient {
    fn warm(&self, call: WarmCall) -> Result<WarmAnswer, ProviderError> {
        let slot = self.slot(origin(&call.config.base_url), WARM_TIMEOUT);
        let req = request(&slot.agent, &call.config, (call.bearer.as_deref(), None), "application/json", &call.body)?;
        let resp = match req.send(&call.body[..]) {
            Ok(resp) if is_refusal(&resp) => {
                let status = resp.status().as_u16();
                let mut body = Vec::new();
                let _ = resp.into_body().into_reader().take(WARM_ANSWER_MAX).read_to_end(&mut body);
                return Err(super::wire(call.config.family).classify_error(status, &body));
            }
            Ok(resp) => resp,
            Err(e) => return Err(transport_error(e.to_string())),
        };
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .filter_map(|(name, v)| v.to_str().ok().map(|v| (name.as_str().to_owned(), v.to_owned())))
            .collect();
        let mut body = Vec::new();
        resp.into_body()
            .into_reader()
            .take(WARM_ANSWER_MAX)
            .read_to_end(&mut body)
            .map_err(|e| transport_error(format!("the warm's answer broke: {e}")))?;
        *slot.last_used.lock() = Instant::now();
        super::warm::decode_answer(&body, &headers)
    }

    fn code_assist_project(&self, lookup: ProjectLookup) -> Receiver<Result<Project, ProviderError>> {
        let (tx, rx) = bounded(1);
        let secret = lookup.bearer.clone().unwrap_or_default();
        if let Some(found) = self.projects.get(&secret, lookup.configured.as_deref()) {
            let _ = tx.send(Ok(found));
            return rx;
        }
        let slot = self.slot(origin(&lookup.config.base_url), code_assist::SETUP_TIMEOUT);
        let projects = Arc::clone(&self.projects);
        let spawned = self.streamers.run(move || {
            let exchange = SetupExchange { agent: &slot.agent, lookup: &lookup };
            let cancel = Arc::clone(&lookup.cancel);
            let mut sleep = |d: Duration| sleep_unless(d, &cancel);
            let found = code_assist::resolve(&exchange, lookup.configured.as_deref(), &mut sleep);
            if let Ok(project) = &found {
                projects.put(&secret, lookup.configured.as_deref(), project.clone());
            }
            let _ = tx.send(found);
        });
        match spawned {
            Ok(()) => rx,
            Err(e) => {
                let (tx, rx) = bounded(1);
                let _ = tx.send(Err(transport_error(format!("cannot start the Code Assist setup thread: {e}"))));
                rx
            }
        }
    }

    fn start(&self, attempt: Attempt) -> Receiver<AttemptEvent> {
        let (tx, rx) = bounded(EVENT_QUEUE);
        let slot = self.slot(origin(&attempt.config.base_url), attempt.read_timeout);
        let spawned = self.streamers.run(move || {
            slot.wait_drained();
            stream(&slot, attempt, &tx)
        });
        if let Err(e) = spawned {
            let (tx, rx) = bounded(1);
            let error = transport_error(format!("cannot start the streamer thread: {e}"));
            let _ = tx.send(AttemptEvent::Failed { error, telemetry: Telemetry::default() });
            return rx;
        }
        rx
    }
}

fn transport_error(message: String) -> ProviderError {
    ProviderError::transient("transport", message)
}

/// A request to `config`'s route: its URL and the headers [`super::auth::request_headers`]
/// decides (a credential that cannot sign the request is an auth failure, nothing sent).
fn request(
    agent: &ureq::Agent,
    config: &RenderConfig,
    credential: (Option<&str>, Option<&str>),
    accept: &str,
    body: &[u8],
) -> Result<ureq::RequestBuilder<ureq::typestate::WithBody>, ProviderError> {
    let url = super::wire(config.family).url(config);
    let headers = super::auth::request_headers(config, &url, credential, accept, body)?;
    Ok(headers.iter().fold(agent.post(&url), |req, (name, value)| req.header(name, value)))
}

/// Code Assist's setup calls on an agent, with the run's route headers and credential.
struct SetupExchange<'a> {
    agent: &'a ureq::Agent,
    lookup: &'a ProjectLookup,
}

impl SetupExchange<'_> {
    fn headers(&self, url: &str, body: &[u8]) -> Result<Vec<(String, String)>, ProviderError> {
        let credential = (self.lookup.bearer.as_deref(), None);
        super::auth::request_headers(&self.lookup.config, url, credential, "application/json", body)
    }
}

impl code_assist::Exchange for SetupExchange<'_> {
    fn post(&self, path: &str, body: &serde_json::Value) -> Result<(u16, Vec<u8>), ProviderError> {
        let url = format!("{}{path}", self.lookup.config.base_url);
        let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
        let headers = self.headers(&url, &bytes)?;
        let req = headers.iter().fold(self.agent.post(&url), |req, (name, value)| req.header(name, value));
        read_answer(req.send(&bytes[..]))
    }

    fn get(&self, path: &str) -> Result<(u16, Vec<u8>), ProviderError> {
        let url = format!("{}{path}", self.lookup.config.base_url);
        let headers = self.headers(&url, b"")?;
        let req = headers
            .iter()
            .filter(|(name, _)| name != "content-type")
            .fold(self.agent.get(&url), |req, (name, value)| req.header(name, value));
        read_answer(req.call())
    }
}

/// A whole (bounded) answer's status and body, or the transport's failure.
fn read_answer(sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<(u16, Vec<u8>), ProviderError> {
    let resp = sent.map_err(|e| transport_error(e.to_string()))?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    resp.into_body()
        .into_reader()
        .take(code_assist::ANSWER_MAX)
        .read_to_end(&mut body)
        .map_err(|e| transport_error(format!("the answer broke: {e}")))?;
    Ok((status, body))
}

/// Sleeps `d` in short naps; false as soon as `cancel` is set.
fn sleep_unless(d: Duration, cancel: &AtomicBool) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if cancel.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)));
    }
    !cancel.load(Ordering::Relaxed)
}

/// Whether an answer is a refusal: what ureq 2 returned as `Error::Status` (4xx and 5xx).
fn is_refusal(resp: &ureq::http::Response<ureq::Body>) -> bool {
    resp.status().as_u16() >= 400
}

fn retry_after(resp: &ureq::http::Response<ureq::Body>) -> Option<Duration> {
    resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(retry_after_secs)
}

/// Records the refusal's timing as the provider stated it (`retry-after`, rate-limit resets).
fn timing(error: &mut ProviderError, headers: &ureq::http::HeaderMap) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    error.retry_after_ms = header("retry-after").as_deref().and_then(super::ratelimit::retry_after_ms);
    error.resets_at_ms = super::ratelimit::resets_at_ms(&header, crate::clock::unix_ms());
}

/// The longest provider-asked wait honoured.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);

/// A `Retry-After` in seconds, parsed as untrusted input: `NaN`, infinities and anything else
/// that is not a finite number are ignored (never a panic), negatives wait nothing, and the wait
/// is capped at [`RETRY_AFTER_MAX`]. An HTTP date is not honoured (the backoff applies).
fn retry_after_secs(value: &str) -> Option<Duration> {
    let secs = value.trim().parse::<f64>().ok().filter(|s| s.is_finite())?;
    Some(Duration::from_secs_f64(secs.clamp(0.0, RETRY_AFTER_MAX.as_secs_f64())))
}

/// The streamer thread's body. Ends when the stream ends, fails, is cancelled, or the loop
/// stops listening.
fn stream(slot: &AgentSlot, a: Attempt, tx: &Sender<AttemptEvent>) {
    let credential = (a.bearer.as_deref(), a.account_id.as_deref());
    let accept = super::wire(a.config.family).accept();
    let req = match request(&slot.agent, &a.config, credential, accept, &a.body) {
        Ok(req) => req,
        Err(error) => {
            let _ = tx.send(AttemptEvent::Failed { error, telemetry: Telemetry::default() });
            return;
        }
    };
    let resp = match req.send(&a.body[..]) {
        Ok(resp) if is_refusal(&resp) => {
            let status = resp.status().as_u16();
            let after = retry_after(&resp);
            let resp_headers = resp.headers().clone();
            let mut body = Vec::new();
            let _ = resp.into_body().into_reader().take(1 << 20).read_to_end(&mut body);
            let mut error = super::wire(a.config.family).classify_error(status, &body);
            timing(&mut error, &resp_headers);
            let _ = tx.send(AttemptEvent::Http { error, retry_after: after });
            return;
        }
        Ok(resp) => resp,
        Err(e) => {
            let telemetry = Telemetry::default();
            let _ = tx.send(AttemptEvent::Failed { error: transport_error(e.to_string()), telemetry });
            return;
        }
    };
    let mut reader = resp.into_body().into_reader();
    let mut framer = super::wire(a.config.family).framer();
    let mut decoder = super::wire(a.config.family).decoder();
    let mut telemetry = Telemetry::default();
    let mut events = Vec::new();
    let mut batch = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        if a.cancel.load(Ordering::Relaxed) {
            return;
        }
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                let error = transport_error(format!("the provider stream broke: {e}"));
                let _ = tx.send(AttemptEvent::Failed { error, telemetry });
                return;
            }
        };
        let pushed = if n == 0 { framer.finish() } else { framer.push(&buf[..n]) };
        let pushed = match pushed {
            Ok(p) => p,
            Err(e) => {
                let error = transport_error(e.0);
                let _ = tx.send(AttemptEvent::Failed { error, telemetry });
                return;
            }
        };
        let now = crate::clock::unix_ms();
        if pushed.comments > 0 {
            telemetry.observe_comments(pushed.comments, pushed.comment_bytes);
        }
        for sse in &pushed.events {
            events.clear();
            match decoder.decode(sse, &mut events) {
                Ok(class) => telemetry.observe(&class, sse.data.len() as u64, now),
                Err(e) => {
                    let error = ProviderError::new(
                        ErrorClass::Transient,
                        Some("undecodable_stream".into()),
                        e.to_string(),
                        None,
                    );
                    let _ = tx.send(AttemptEvent::Failed { error, telemetry });
                    return;
                }
            }
            batch.append(&mut events);
        }
        if !batch.is_empty()
            && tx.send(AttemptEvent::Stream { events: std::mem::take(&mut batch), at_ms: now }).is_err()
        {
            return;
        }
        if n == 0 {
            // At its end already: ureq has returned the connection to the pool (or closed it,
            // for a stream without a length).
            *slot.last_used.lock() = Instant::now();
            let _ = tx.send(AttemptEvent::End { terminal: decoder.finished(), telemetry });
            return;
        }
        if decoder.finished() {
            // Counted as draining before the loop hears the end, so its next attempt waits for
            // this connection instead of opening another.
            slot.begin_drain();
            let _ = tx.send(AttemptEvent::End { terminal: true, telemetry });
            drain(&mut reader, &mut buf);
            slot.end_drain();
            return;
        }
    }
}

/// Reads what follows a stream's terminal event to its end (at most [`DRAIN_LIMIT`] bytes),
/// which returns the connection to the pool. Anything else (an error, too many bytes) drops
/// the reader, and with it the connection. Nothing read here is decoded.
fn drain(reader: &mut impl Read, buf: &mut [u8]) {
    let mut total = 0usize;
    while total <= DRAIN_LIMIT {
        match reader.read(buf) {
            Ok(0) => return,
            Ok(n) => total += n,
            Err(e) => {
                log::debug!(target: "broca.provider", "after the terminal event the stream broke: {e}");
                return;
            }
        }
    }
    log::debug!(target: "broca.provider", "more than {DRAIN_LIMIT} bytes after the terminal event; connection dropped");
}

#[cfg(test)]
mod pool_tests {
    use super::{origin, retry_after_secs, HttpClient, RETRY_AFTER_MAX};
    use std::time::Duration;

    #[test]
    fn a_hostile_retry_after_never_panics() {
        for bad in ["NaN", "nan", "inf", "-inf", "infinity", "1e400", "", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"] {
            let parsed = retry_after_secs(bad);
            assert!(parsed.is_none_or(|d| d <= RETRY_AFTER_MAX), "{bad}: {parsed:?}");
        }
        assert_eq!(retry_after_secs(" 1.5 "), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after_secs("-3"), Some(Duration::ZERO));
        assert_eq!(retry_after_secs("99999999"), Some(RETRY_AFTER_MAX));
        assert_eq!(retry_after_secs("NaN"), None);
    }

    #[test]
    fn a_test_root_must_be_a_pem_certificate() {
        assert!(HttpClient::with_test_root_pem("not a certificate").is_err());
        assert!(HttpClient::with_test_root_pem("").is_err());
        let junk = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(HttpClient::with_test_root_pem(junk).is_err());
    }

    #[test]
    fn origins_key_the_pool() {
        assert_eq!(origin("https://api.openai.com/v1"), "https://api.openai.com");
        assert_eq!(origin("http://127.0.0.1:8080/lane/a/v1"), "http://127.0.0.1:8080");
        assert_eq!(origin("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(origin("weird"), "weird");
    }
}
