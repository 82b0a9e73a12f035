//! The model client seam and its HTTP implementation (blocking ureq on a helper thread).
//!
//! The loop never blocks on the network: [`ModelClient::start`] returns at once with a channel,
//! and a streamer thread POSTs the request, frames SSE, decodes the family's events, counts
//! telemetry and sends [`AttemptEvent`]s back. Dropping the receiver, or setting the attempt's
//! cancel flag, stops the streamer at its next read.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

use super::config::{AuthSource, RenderConfig};
use super::event::StreamEvent;
use super::sse::SseFramer;
use super::telemetry::Telemetry;
use crate::record::{ErrorClass, ProviderError};

/// Events buffered between the streamer and the loop (backpressure beyond this).
const EVENT_QUEUE: usize = 1024;
const READ_CHUNK: usize = 16 << 10;

/// One model attempt to run.
#[derive(Clone)]
pub struct Attempt {
    pub config: RenderConfig,
    pub body: Vec<u8>,
    /// The secret for `AuthSource::Bearer` (or the vault credential for `AuthSource::Vault`),
    /// held only in memory.
    pub bearer: Option<String>,
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
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The real client: ureq, one thread per attempt. The read timeout (the socket-level half of
/// the watchdog) is the attempt's; agents (TLS configuration, connection pool) are built once
/// per distinct timeout and reused, since building one is costly.
#[derive(Default)]
pub struct HttpClient {
    agents: parking_lot::Mutex<Vec<(Duration, ureq::Agent)>>,
}

impl HttpClient {
    fn agent(&self, read_timeout: Duration) -> ureq::Agent {
        let mut agents = self.agents.lock();
        if let Some((_, a)) = agents.iter().find(|(t, _)| *t == read_timeout) {
            return a.clone();
        }
        let agent =
            ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).timeout_read(read_timeout).build();
        agents.push((read_timeout, agent.clone()));
        agent
    }
}

impl ModelClient for HttpClient {
    fn start(&self, attempt: Attempt) -> Receiver<AttemptEvent> {
        let (tx, rx) = bounded(EVENT_QUEUE);
        let agent = self.agent(attempt.read_timeout);
        let spawned =
            std::thread::Builder::new().name("broca-stream".into()).spawn(move || stream(&agent, attempt, &tx));
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
    ProviderError { class: ErrorClass::Transient, provider_code: Some("transport".into()), message, http_status: None }
}

fn request(agent: &ureq::Agent, a: &Attempt) -> ureq::Request {
    let family = super::wire(a.config.family);
    let url = format!("{}{}", a.config.base_url, family.path());
    let mut req = agent.post(&url).set("content-type", "application/json").set("accept", "text/event-stream");
    for (name, value) in family.headers() {
        req = req.set(name, value);
    }
    if let (AuthSource::Bearer | AuthSource::Vault { .. }, Some(token)) = (&a.config.auth, &a.bearer) {
        req = req.set("authorization", &format!("Bearer {token}"));
    }
    req
}

fn retry_after(resp: &ureq::Response) -> Option<Duration> {
    resp.header("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 3600.0)))
}

/// The streamer thread's body. Ends when the stream ends, fails, is cancelled, or the loop
/// stops listening.
fn stream(agent: &ureq::Agent, a: Attempt, tx: &Sender<AttemptEvent>) {
    let resp = match request(agent, &a).send_bytes(&a.body) {
        Ok(resp) => resp,
        Err(ureq::Error::Status(status, resp)) => {
            let after = retry_after(&resp);
            let mut body = Vec::new();
            let _ = resp.into_reader().take(1 << 20).read_to_end(&mut body);
            let error = super::wire(a.config.family).classify_error(status, &body);
            let _ = tx.send(AttemptEvent::Http { error, retry_after: after });
            return;
        }
        Err(e) => {
            let telemetry = Telemetry::default();
            let _ = tx.send(AttemptEvent::Failed { error: transport_error(e.to_string()), telemetry });
            return;
        }
    };
    let mut reader = resp.into_reader();
    let mut framer = SseFramer::new();
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
        let now = now_ms();
        if pushed.comments > 0 {
            telemetry.observe_comments(pushed.comments, pushed.comment_bytes);
        }
        for sse in &pushed.events {
            events.clear();
            match decoder.decode(sse, &mut events) {
                Ok(class) => telemetry.observe(&class, sse.data.len() as u64, now),
                Err(e) => {
                    let error = ProviderError {
                        class: ErrorClass::Transient,
                        provider_code: Some("undecodable_stream".into()),
                        message: e.to_string(),
                        http_status: None,
                    };
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
        if n == 0 || decoder.finished() {
            let _ = tx.send(AttemptEvent::End { terminal: decoder.finished(), telemetry });
            return;
        }
    }
}
