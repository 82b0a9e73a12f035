//! Live step hints on the CortexKit bus (llm-runner §14.3): one content-free
//! `step.finished.v1` per durably recorded model attempt, published on
//! `ck.{acct}.live.<runner>.step.finished.v1` by one publisher thread over a plain NATS
//! connection (`nats.rs`).
//!
//! Invariants:
//! - the loop offers a hint only after the WAL barrier that makes its attempt record durable,
//!   so no consumer sees a hint a crash could take back;
//! - the queue between the loops and the publisher is bounded ([`HINT_QUEUE`]); a full queue
//!   refuses the hint with [`HintRefused::Full`] and counts it, and never blocks a loop;
//! - a hint is written at most once: one the connection lost is not resent (hints are lossy by
//!   contract; a consumer's durable read repairs its view), and nothing is stored on the bus;
//! - while the bus is unreachable, hints are dropped and counted, and the publisher retries the
//!   connection with a backoff from [`RETRY_MIN`] doubling to [`RETRY_MAX`].

mod nats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};

pub use cortexkit_role_llm_runner::step_events::{StepEvents, StepFinished, StepRef};
pub use nats::{BusError, Connection};

use crate::config::BusConfig;

/// The module id broca publishes as: the runner token of its live subjects and the `runner`
/// of every hint (its manifest's id).
pub const RUNNER: &str = "broca";
/// Hints waiting for the publisher, across every session of the process.
pub const HINT_QUEUE: usize = 1024;
/// The first and the longest wait before connecting again after a failure.
pub const RETRY_MIN: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(5);

/// The `role.describe.step_events` broca declares: a hint per recorded attempt (retries
/// included), keyed by its WAL position (`step_ref`), never by a host record.
pub fn declaration() -> StepEvents {
    StepEvents::new("per_attempt", "step_ref")
}

/// The subject broca's hints go to in `account`.
pub fn subject(account: &str) -> String {
    format!("ck.{account}.live.{RUNNER}.step.finished.v1")
}

/// Why a hint was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum HintRefused {
    /// [`HINT_QUEUE`] hints are already waiting.
    Full,
    /// The publisher thread is gone.
    Closed,
}

/// The loops' handle on the publisher. Cloning shares the one queue and thread.
#[derive(Clone, Debug)]
pub struct StepHints {
    tx: Sender<StepFinished>,
    counts: Arc<Counts>,
}

/// What happened to the hints offered so far (for logs and tests).
#[derive(Debug, Default)]
pub struct Counts {
    pub published: AtomicU64,
    /// Refused at the queue, or dropped while the bus was unreachable.
    pub dropped: AtomicU64,
}

impl StepHints {
    /// Starts the publisher thread for `config`; it connects at once and again whenever a
    /// connection ends.
    pub fn start(config: &BusConfig) -> std::io::Result<StepHints> {
        let (tx, rx) = crossbeam_channel::bounded(HINT_QUEUE);
        let counts = Arc::new(Counts::default());
        let publisher = Publisher {
            addr: config.addr.clone(),
            subject: subject(&config.account),
            counts: Arc::clone(&counts),
            conn: None,
            retry: RETRY_MIN,
            retry_at: Instant::now(),
        };
        std::thread::Builder::new().name("broca-bus".into()).spawn(move || publisher.run(rx))?;
        Ok(StepHints { tx, counts })
    }

    /// Queues `hint` for publication; never blocks.
    pub fn offer(&self, hint: StepFinished) -> Result<(), HintRefused> {
        match self.tx.try_send(hint) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                Err(HintRefused::Full)
            }
            Err(TrySendError::Disconnected(_)) => Err(HintRefused::Closed),
        }
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }
}

/// The publisher thread's state. It ends when every [`StepHints`] is dropped.
struct Publisher {
    addr: String,
    subject: String,
    counts: Arc<Counts>,
    conn: Option<Connection>,
    retry: Duration,
    retry_at: Instant,
}

impl Publisher {
    fn run(mut self, rx: Receiver<StepFinished>) {
        self.connect();
        for hint in rx.iter() {
            if self.conn.as_ref().is_none_or(|c| !c.alive()) && Instant::now() >= self.retry_at {
                self.connect();
            }
            let body = match serde_json::to_vec(&hint) {
                Ok(body) => body,
                Err(e) => {
                    log::warn!("bus: a step hint does not serialize: {e}");
                    continue;
                }
            };
            let sent = match &self.conn {
                Some(conn) => conn.publish(&self.subject, &body),
                None => Err(BusError::Closed),
            };
            match sent {
                Ok(()) => {
                    self.counts.published.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    if let BusError::TooLarge { .. } = e {
                        log::warn!("bus: step hint for {} dropped: {e}", hint.run_id);
                    } else if self.conn.take().is_some() {
                        log::warn!("bus: {}: {e}; step hints are dropped until it is back", self.addr);
                        self.retry_at = Instant::now();
                    }
                }
            }
        }
    }

    /// One connection attempt; a failure pushes the next one back.
    fn connect(&mut self) {
        match Connection::open(&self.addr, RUNNER) {
            Ok(conn) => {
                log::info!("bus: connected to {}; step hints go to {}", self.addr, self.subject);
                self.conn = Some(conn);
                self.retry = RETRY_MIN;
            }
            Err(e) => {
                if self.retry == RETRY_MIN {
                    log::warn!("bus: cannot reach {}: {e}; retrying", self.addr);
                }
                self.conn = None;
                self.retry_at = Instant::now() + self.retry;
                self.retry = (self.retry * 2).min(RETRY_MAX);
            }
        }
    }
}
