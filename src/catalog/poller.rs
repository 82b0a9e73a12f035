//! The catalog poller (spec §1a): its own thread, off every hot path, polls fusiform's
//! `catalog.get` page by page ([`super::pages`]), runs the parser and the monotonicity check,
//! writes the LKG atomically ([`super::lkg`]) and swaps the shared catalog sends resolve against.
//!
//! When it polls: at start when the LKG is missing, unusable or older than [`POLL_INTERVAL`],
//! then every [`POLL_INTERVAL`]. A poll that failed for a retryable reason (the route or
//! connection, or fusiform's `unavailable`) is tried again sooner, from [`RETRY_MIN`] doubling
//! to [`RETRY_MAX`], because fusiform may start after broca; any other failure waits for the
//! next regular poll.
//!
//! Invariants:
//! - a failed poll changes neither the in-memory catalog nor the LKG, and counts once in
//!   [`CatalogHealth`] (`failures`, `last_failure`), whatever happened inside it;
//! - the shared catalog is replaced only after the new LKG is durable (rename + directory
//!   fsync), so memory is never ahead of disk;
//! - one poll sends at most [`MAX_PAGE_REQUESTS`] requests and reads at most
//!   [`MAX_POLL_RESPONSE_BYTES`] of answer bodies (error bodies and abandoned attempts
//!   included), and restarts from page one at most [`MAX_RESTARTS`] times;
//! - only a code (`catalog_changed`) or a snapshot mismatch restarts; message text never does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

use super::lkg;
use super::pages::{self, Assembly, Next, PageFault, PageRefusal, PagedCatalogGet, CATALOG_CHANGED, FUSIFORM_MODULE};
use super::Catalog;
use super::SharedCatalog;
use crate::clock::SharedClock;
use crate::subc::consumer::{CallError, Consumer};

pub const POLL_INTERVAL: Duration = Duration::from_secs(30 * 60);
pub const MAX_PAGE_REQUESTS: usize = 256;
pub const MAX_POLL_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
pub const MAX_RESTARTS: u32 = 2;
/// One page request's deadline (route open included).
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(30);
pub const RETRY_MIN: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// The harness/session broca binds fusiform's route with.
pub const POLLER_HARNESS: &str = "broca";
pub const POLLER_SESSION: &str = "catalog-poller";
/// Daemon relay refusals: fusiform never saw the request (retry sooner).
const RELAY_CODES: [&str; 7] = [
    "unknown_module",
    "module_reloading",
    "module_warming",
    "target_unavailable",
    "module_timeout",
    "unknown_channel",
    "stale_route_epoch",
];

/// Why a poll failed. Each has a stable `code` (health's `last_failure.code`).
#[derive(Clone, Debug, PartialEq)]
pub enum PollError {
    /// The route or the connection failed; fusiform may not have seen the request.
    Transport { reason: String },
    /// fusiform refused a page request; terminal for this poll (`unavailable` is retried sooner).
    Refused { refusal: Box<PageRefusal>, page: usize, members: Vec<&'static str> },
    /// A malformed page, a duplicate model or qualification row, a repeated token.
    Protocol { reason: String },
    /// A per-poll bound ran out.
    Exhausted { bound: &'static str, limit: usize },
    /// The snapshot kept changing: restarted [`MAX_RESTARTS`] times and changed again.
    Unstable { reason: String },
    /// The assembled catalog failed the parser or the monotonicity check.
    Rejected { reason: String },
    /// The LKG could not be written; memory and disk keep the previous catalog.
    Write { reason: String },
}

impl PollError {
    pub fn code(&self) -> String {
        match self {
            PollError::Transport { .. } => "catalog_transport".into(),
            PollError::Refused { refusal, .. } => refusal.code.clone(),
            PollError::Protocol { .. } => "catalog_protocol_error".into(),
            PollError::Exhausted { .. } => "catalog_poll_exhausted".into(),
            PollError::Unstable { .. } => "catalog_unstable".into(),
            PollError::Rejected { .. } => "catalog_rejected".into(),
            PollError::Write { .. } => "catalog_lkg_write_failed".into(),
        }
    }

    /// Tried again before the next regular poll.
    pub fn retry_soon(&self) -> bool {
        match self {
            PollError::Transport { .. } => true,
            PollError::Refused { refusal, .. } => refusal.code == fusiform_protocol::refusal::CODE_UNAVAILABLE,
            _ => false,
        }
    }

    /// The body health reports: `{code, message, detail}`.
    pub fn body(&self) -> Value {
        let (message, detail) = match self {
            PollError::Transport { reason } => (format!("catalog poll: fusiform unreachable: {reason}"), json!({})),
            PollError::Refused { refusal, page, members } => {
                let mut detail =
                    json!({"page": page, "paging_members_sent": members, "fusiform_message": refusal.message});
                if let Some(d) = &refusal.detail {
                    detail["fusiform_detail"] = d.clone();
                }
                let message = if refusal.code == fusiform_protocol::refusal::CODE_BAD_REQUEST {
                    // The 0.30.0 request type denies unknown fields: name what we sent that it may
                    // not know, so an operator sees why the catalog does not refresh.
                    let member = refused_member(refusal).unwrap_or_else(|| members.join(", "));
                    detail["member"] = json!(member);
                    format!(
                        "catalog poll: fusiform refused catalog.get bad_request on page {page}, naming member {member:?} \
                         (a fusiform on fusiform-protocol 0.30.0 refuses the paging members {members:?}); \
                         the catalog is not refreshed: serving the LKG"
                    )
                } else {
                    format!("catalog poll: fusiform refused catalog.get {} on page {page}", refusal.code)
                };
                (message, detail)
            }
            PollError::Protocol { reason } => (format!("catalog poll: protocol error: {reason}"), json!({})),
            PollError::Exhausted { bound, limit } => (
                format!("catalog poll exhausted: more than {limit} {bound} in one poll"),
                json!({"bound": bound, "limit": limit}),
            ),
            PollError::Unstable { reason } => (
                format!("catalog poll: the catalog changed during assembly after {MAX_RESTARTS} restarts: {reason}"),
                json!({"restarts": MAX_RESTARTS}),
            ),
            PollError::Rejected { reason } => {
                (format!("catalog poll: the assembled catalog is refused: {reason}"), json!({}))
            }
            PollError::Write { reason } => (format!("catalog poll: the LKG could not be written: {reason}"), json!({})),
        };
        json!({"code": self.code(), "message": message, "detail": detail})
    }
}

/// The member a `bad_request` names: its detail's `field`/`member`, else serde's
/// "unknown field `x`" in the message (diagnostic only; it decides nothing).
fn refused_member(refusal: &PageRefusal) -> Option<String> {
    let from_detail = refusal
        .detail
        .as_ref()
        .and_then(|d| d.get("field").or_else(|| d.get("member")).and_then(Value::as_str).map(str::to_owned));
    from_detail.or_else(|| {
        let rest = refusal.message.split_once("unknown field `")?.1;
        Some(rest.split_once('`')?.0.to_owned())
    })
}

/// A completed poll.
#[derive(Clone, Debug, PartialEq)]
pub struct Polled {
    pub catalog_version: u64,
    pub models: usize,
    pub pages: usize,
    pub restarts: u32,
    /// The version equalled the installed one: nothing was written or swapped.
    pub unchanged: bool,
}

/// Sends one page request; the real one is broca's consumer connection.
pub trait CatalogSource: Send + Sync {
    fn call(&self, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError>;
}

impl CatalogSource for Consumer {
    fn call(&self, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        let target = RouteTarget::ToolProvider { module_id: FUSIFORM_MODULE.to_owned() };
        self.call_on(&target, &BindIdentity::new(POLLER_HARNESS, POLLER_SESSION), body, timeout)
    }
}

/// The poller's state for `health.check`.
#[derive(Debug, Default)]
pub struct HealthState {
    pub polls: u64,
    pub failures: u64,
    pub last_success_ms: Option<u64>,
    pub last_failure_ms: Option<u64>,
    pub last_failure: Option<Value>,
    pub last_pages: Option<usize>,
    /// `ok`, or the last poll's failure code.
    pub last_outcome: Option<String>,
    pub running: bool,
}

/// Shared between the poller thread and the health handler (a short lock, no I/O under it).
#[derive(Debug, Default)]
pub struct CatalogHealth {
    state: Mutex<HealthState>,
}

impl CatalogHealth {
    /// `metrics.catalog`: last success, last failure, version and model count of the installed
    /// catalog.
    pub fn snapshot(&self, catalog: &SharedCatalog) -> Value {
        let (version, models) = match &*catalog.read() {
            Ok(c) => (Some(c.catalog_version), Some(c.len())),
            Err(_) => (None, None),
        };
        let s = self.state.lock();
        json!({
            "poller": if s.running { "running" } else { "stopped" },
            "polls": s.polls,
            "failures": s.failures,
            "last_success_ms": s.last_success_ms,
            "last_failure_ms": s.last_failure_ms,
            "last_failure_code": s.last_failure.as_ref().map(|f| f["code"].clone()),
            "last_failure": s.last_failure,
            "last_pages": s.last_pages,
            "last_outcome": s.last_outcome,
            "catalog_version": version,
            "models": models,
        })
    }
}

/// One poll's request and byte budget, across its restarts.
struct Budget {
    requests: usize,
    bytes: usize,
}

impl Budget {
    fn request(&mut self) -> Result<(), PollError> {
        if self.requests >= MAX_PAGE_REQUESTS {
            return Err(PollError::Exhausted { bound: "page requests", limit: MAX_PAGE_REQUESTS });
        }
        self.requests += 1;
        Ok(())
    }

    fn read(&mut self, bytes: usize) -> Result<(), PollError> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > MAX_POLL_RESPONSE_BYTES {
            return Err(PollError::Exhausted { bound: "bytes of response JSON", limit: MAX_POLL_RESPONSE_BYTES });
        }
        Ok(())
    }
}

/// Fetches and assembles one catalog: the merged response and its page count.
pub fn fetch(source: &dyn CatalogSource) -> Result<(Value, usize, u32), PollError> {
    let mut budget = Budget { requests: 0, bytes: 0 };
    let mut restarts = 0;
    'attempt: loop {
        let mut assembly = Assembly::default();
        let mut token: Option<String> = None;
        loop {
            let request = PagedCatalogGet::page(token.as_deref());
            budget.request()?;
            let page = assembly.pages + 1;
            let refused = |refusal: PageRefusal| PollError::Refused {
                refusal: Box::new(refusal),
                page,
                members: request.paging_members(),
            };
            let restart = |restarts: &mut u32, reason: String| {
                *restarts += 1;
                if *restarts > MAX_RESTARTS {
                    return Err(PollError::Unstable { reason });
                }
                log::info!(target: "broca.catalog", "catalog poll: restarting from page one: {reason}");
                Ok(())
            };
            let body = match source.call(&request.body(), PAGE_TIMEOUT) {
                Ok(body) => body,
                Err(CallError::Module(e)) => {
                    budget.read(serde_json::to_vec(&e).map_or(0, |b| b.len()))?;
                    if RELAY_CODES.contains(&e.code.as_str()) {
                        return Err(PollError::Transport { reason: format!("{}: {}", e.code, e.message) });
                    }
                    if e.code == CATALOG_CHANGED {
                        restart(&mut restarts, format!("{CATALOG_CHANGED} on page {page}"))?;
                        continue 'attempt;
                    }
                    return Err(refused(PageRefusal { code: e.code, message: e.message, detail: e.detail }));
                }
                Err(e) => return Err(PollError::Transport { reason: e.to_string() }),
            };
            budget.read(body.len())?;
            let value = match pages::classify(&body) {
                Ok(Ok(value)) => value,
                Ok(Err(refusal)) if refusal.code == CATALOG_CHANGED => {
                    restart(&mut restarts, format!("{CATALOG_CHANGED} on page {page}"))?;
                    continue 'attempt;
                }
                Ok(Err(refusal)) => return Err(refused(refusal)),
                Err(reason) => return Err(PollError::Protocol { reason: format!("page {page}: {reason}") }),
            };
            match assembly.add(value) {
                Ok(Next::Page(next)) => token = Some(next),
                Ok(Next::Done) => {
                    let pages = assembly.pages;
                    let merged = assembly.finish().expect("a finished assembly has page one");
                    return Ok((merged, pages, restarts));
                }
                Err(PageFault::Restart(reason)) => {
                    restart(&mut restarts, reason)?;
                    continue 'attempt;
                }
                Err(PageFault::Protocol(reason)) => return Err(PollError::Protocol { reason }),
            }
        }
    }
}

/// The poller: what one poll reads and writes.
pub struct Poller {
    pub source: Arc<dyn CatalogSource>,
    pub catalog: SharedCatalog,
    pub lkg: PathBuf,
    pub health: Arc<CatalogHealth>,
    /// [`POLL_INTERVAL`] unless a test shortens it.
    pub interval: Duration,
    /// The wall clock the LKG's age and the health times read.
    pub clock: SharedClock,
}

impl Poller {
    /// One poll: fetch, parse, check, write, swap. Counts itself in health.
    pub fn poll_once(&self) -> Result<Polled, PollError> {
        let result = self.poll_inner();
        let mut s = self.health.state.lock();
        s.polls += 1;
        match &result {
            Ok(p) => {
                s.last_success_ms = Some(self.clock.now_ms());
                s.last_pages = Some(p.pages);
                s.last_outcome = Some("ok".into());
                log::info!(
                    target: "broca.catalog",
                    "catalog poll: catalog_version {} with {} models in {} page(s){}",
                    p.catalog_version,
                    p.models,
                    p.pages,
                    if p.unchanged { " (unchanged)" } else { "; LKG written" }
                );
            }
            Err(e) => {
                s.failures += 1;
                s.last_outcome = Some(e.code());
                s.last_failure_ms = Some(self.clock.now_ms());
                let body = e.body();
                log::warn!(target: "broca.catalog", "{} [{}]; keeping the previous catalog and LKG", body["message"].as_str().unwrap_or(""), e.code());
                s.last_failure = Some(body);
            }
        }
        result
    }

    fn poll_inner(&self) -> Result<Polled, PollError> {
        let (response, pages, restarts) = fetch(&*self.source)?;
        let catalog = Catalog::from_response(&response).map_err(|reason| PollError::Rejected { reason })?;
        let installed = self.catalog.read().as_ref().ok().map(|c| c.catalog_version);
        let polled = Polled {
            catalog_version: catalog.catalog_version,
            models: catalog.len(),
            pages,
            restarts,
            unchanged: false,
        };
        match installed {
            Some(v) if catalog.catalog_version < v => {
                return Err(PollError::Rejected {
                    reason: format!("catalog_version {} is below the installed {v}", catalog.catalog_version),
                })
            }
            Some(v) if catalog.catalog_version == v && self.lkg.exists() => {
                return Ok(Polled { unchanged: true, ..polled })
            }
            _ => {}
        }
        let bytes = lkg::envelope(&response, pages, self.clock.now_ms());
        lkg::write_atomic(&self.lkg, &bytes).map_err(|e| PollError::Write { reason: e.to_string() })?;
        *self.catalog.write() = Ok(catalog);
        Ok(polled)
    }

    /// How long until the first poll: none when the LKG is missing, unusable or stale.
    fn first_wait(&self) -> Duration {
        if self.catalog.read().is_err() {
            return Duration::ZERO;
        }
        let age = lkg::written_at_ms(&self.lkg).map(|w| Duration::from_millis(self.clock.now_ms().saturating_sub(w)));
        match age {
            Some(age) if age < self.interval => self.interval - age,
            _ => Duration::ZERO,
        }
    }

    /// Runs the poller on its own thread, forever (it ends with the process).
    pub fn spawn(self) -> std::io::Result<()> {
        let removed = lkg::remove_stray_temps(&self.lkg);
        if removed > 0 {
            log::info!(target: "broca.catalog", "removed {removed} temp file(s) of an interrupted LKG write");
        }
        self.health.state.lock().running = true;
        std::thread::Builder::new().name("broca-catalog".into()).spawn(move || {
            let mut wait = self.first_wait();
            let mut retry = RETRY_MIN.min(self.interval);
            loop {
                let until = Instant::now() + wait;
                while Instant::now() < until {
                    std::thread::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_secs(1)));
                }
                wait = match self.poll_once() {
                    Ok(_) => {
                        retry = RETRY_MIN.min(self.interval);
                        self.interval
                    }
                    Err(e) if e.retry_soon() => {
                        let w = retry;
                        retry = (retry * 2).min(RETRY_MAX).min(self.interval);
                        w
                    }
                    Err(_) => self.interval,
                };
            }
        })?;
        Ok(())
    }
}
