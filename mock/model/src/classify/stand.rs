//! The stand-in classifier provider's state: what each key answers, how often each key was
//! asked, the call log (in memory, and optionally appended to a file), the expected
//! credentials, held calls and the latency every call waits. Routes in [`classify`](super).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::http::Stopping;

/// Keys with a scripted answer at once; scripting another key is refused 507.
pub const MAX_SCRIPTED_KEYS: usize = 100_000;
/// Distinct keys counted at once; a call for another key is answered 507 (uncounted).
pub const MAX_COUNTED_KEYS: usize = 100_000;
/// Calls kept in the in-memory log; older ones are dropped and counted.
pub const MAX_LOGGED_CALLS: usize = 100_000;
/// Holds scripted and not yet taken by a call; another is refused 507.
pub const MAX_PENDING_HOLDS: usize = 10_000;
/// The largest latency every call may be given (`/_mock/classify/delay`).
pub const MAX_DELAY_MS: u64 = 600_000;
/// How long a held call waits for its release before it answers 500.
pub const HOLD_TIMEOUT: Duration = Duration::from_secs(60);

/// The key a call is counted and scripted by: the RFC 8785 (JCS) canonical JSON text of the
/// request's `state`, as the conformance suite computes it.
pub fn state_key(state: &Value) -> String {
    String::from_utf8(serde_jcs::to_vec(state).expect("a JSON value canonicalizes")).expect("JCS output is UTF-8")
}

/// What a key answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scripted {
    /// HTTP 200 with these exact bytes (Workers AI: as the envelope's `result`, unchanged).
    Answer(String),
    /// This status: TypeSafe with no body; Workers AI with the error envelope, whose `errors`
    /// names `workers_ai_code` when given and is empty otherwise. `retry_after_ms` becomes a
    /// `Retry-After` header in whole seconds, rounded up.
    Status { status: u16, retry_after_ms: Option<u64>, workers_ai_code: Option<i64> },
}

/// The provider a call was made to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Provider {
    #[serde(rename = "typesafe")]
    TypeSafe,
    #[serde(rename = "workers-ai")]
    WorkersAi,
}

/// One provider call, as `GET /_mock/classify/log` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClassifyCall {
    /// The call number, from 1, rising across resets.
    pub n: u64,
    pub provider: Provider,
    /// The account id in the path (Workers AI).
    pub account_id: Option<String>,
    /// The path's model (Workers AI) or the body's `model` (TypeSafe).
    pub model: Option<String>,
    /// The `Authorization` header as sent.
    pub authorization: Option<String>,
    pub key: String,
    /// The status answered; `None` while the call is held or delayed.
    pub status: Option<u16>,
    /// When the call arrived (Unix ms).
    pub at_ms: u64,
}

/// The credentials calls must carry; `None` is not checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedAuth {
    /// TypeSafe's whole `Authorization` value (`Bearer …`).
    pub typesafe: Option<String>,
    /// Workers AI's whole `Authorization` value.
    pub workers_ai: Option<String>,
    /// The account id Workers AI calls must name in their path.
    pub account_id: Option<String>,
}

/// A bound was reached; the message says which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Full(pub String);

/// How a call's hold ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldEnd {
    NotHeld,
    Released,
    TimedOut,
    Stopped,
}

#[derive(Default)]
struct Inner {
    scripts: HashMap<String, Scripted>,
    counts: HashMap<String, u64>,
    total: u64,
    log: VecDeque<ClassifyCall>,
    dropped: u64,
    auth: ExpectedAuth,
}

#[derive(Default)]
struct Waiting {
    calls: usize,
    /// Raised by each release; a waiter leaves when it differs from the value it saw.
    epoch: u64,
}

#[derive(Default)]
struct Holds {
    pending: HashSet<String>,
    waiting: HashMap<String, Waiting>,
}

/// The stand-in's state, shared by every connection ([`MockServer::classify`](super::super::MockServer::classify)).
#[derive(Default)]
pub struct Stand {
    inner: Mutex<Inner>,
    holds: Mutex<Holds>,
    bell: Condvar,
    delay_ms: AtomicU64,
    /// The last call number given (never reset).
    last_n: AtomicU64,
    file: Option<Mutex<File>>,
    /// [`HOLD_TIMEOUT`] unless a test shortens it.
    hold_timeout_ms: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Stand {
    /// A stand-in that also appends one JSON line per answered call to `log` (created if absent).
    pub(crate) fn new(log: Option<&Path>) -> io::Result<Stand> {
        let file = match log {
            Some(path) => Some(Mutex::new(OpenOptions::new().create(true).append(true).open(path)?)),
            None => None,
        };
        Ok(Stand { file, ..Stand::default() })
    }

    /// Scripts what `key` answers from now on.
    pub fn script(&self, key: &str, scripted: Scripted) -> Result<(), Full> {
        let mut inner = self.inner.lock();
        if inner.scripts.len() >= MAX_SCRIPTED_KEYS && !inner.scripts.contains_key(key) {
            return Err(Full(format!("at most {MAX_SCRIPTED_KEYS} keys may be scripted")));
        }
        inner.scripts.insert(key.to_owned(), scripted);
        Ok(())
    }

    /// What `key` answers now (`None`: unscripted, 500).
    pub fn scripted(&self, key: &str) -> Option<Scripted> {
        self.inner.lock().scripts.get(key).cloned()
    }

    /// Replaces the expected credentials.
    pub fn set_auth(&self, auth: ExpectedAuth) {
        self.inner.lock().auth = auth;
    }

    pub fn auth(&self) -> ExpectedAuth {
        self.inner.lock().auth.clone()
    }

    /// Calls counted under `key`.
    pub fn calls(&self, key: &str) -> u64 {
        self.inner.lock().counts.get(key).copied().unwrap_or(0)
    }

    /// Every counted call, and the counts by key.
    pub fn totals(&self) -> (u64, BTreeMap<String, u64>) {
        let inner = self.inner.lock();
        (inner.total, inner.counts.iter().map(|(k, n)| (k.clone(), *n)).collect())
    }

    /// The logged calls, oldest first, and how many older ones were dropped.
    pub fn log(&self) -> (Vec<ClassifyCall>, u64) {
        let inner = self.inner.lock();
        (inner.log.iter().cloned().collect(), inner.dropped)
    }

    /// Holds the next call for `key` until [`Stand::release`].
    pub fn hold(&self, key: &str) -> Result<(), Full> {
        let mut holds = self.holds.lock();
        if holds.pending.len() >= MAX_PENDING_HOLDS && !holds.pending.contains(key) {
            return Err(Full(format!("at most {MAX_PENDING_HOLDS} holds may be pending")));
        }
        holds.pending.insert(key.to_owned());
        Ok(())
    }

    /// Whether a call for `key` is waiting now.
    pub fn held(&self, key: &str) -> bool {
        self.holds.lock().waiting.get(key).is_some_and(|w| w.calls > 0)
    }

    /// Lets every call waiting for `key` answer; with none waiting, cancels a pending hold.
    pub fn release(&self, key: &str) {
        let mut holds = self.holds.lock();
        match holds.waiting.get_mut(key) {
            Some(waiting) => {
                waiting.epoch += 1;
                self.bell.notify_all();
            }
            None => {
                holds.pending.remove(key);
            }
        }
    }

    /// Every later call waits `ms` before it answers.
    pub fn set_delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn delay_ms(&self) -> u64 {
        self.delay_ms.load(Ordering::SeqCst)
    }

    /// Forgets scripts, counts, the in-memory log, expected credentials, pending holds and the
    /// delay, and releases every waiting call (it then answers as unscripted). Call numbers
    /// keep rising; the file log is kept.
    pub fn reset(&self) {
        *self.inner.lock() = Inner::default();
        let mut holds = self.holds.lock();
        holds.pending.clear();
        for waiting in holds.waiting.values_mut() {
            waiting.epoch += 1;
        }
        self.bell.notify_all();
        drop(holds);
        self.set_delay(0);
    }

    #[cfg(test)]
    pub(crate) fn set_hold_timeout(&self, timeout: Duration) {
        self.hold_timeout_ms.store(timeout.as_millis() as u64, Ordering::SeqCst);
    }

    fn hold_timeout(&self) -> Duration {
        match self.hold_timeout_ms.load(Ordering::SeqCst) {
            0 => HOLD_TIMEOUT,
            ms => Duration::from_millis(ms),
        }
    }

    /// Counts and logs an arriving call: its number and arrival time (Unix ms), or why it
    /// cannot be counted.
    pub(crate) fn arrive(
        &self,
        provider: Provider,
        account_id: Option<String>,
        model: Option<String>,
        authorization: Option<String>,
        key: String,
    ) -> Result<(u64, u64), Full> {
        let mut inner = self.inner.lock();
        let full = inner.counts.len() >= MAX_COUNTED_KEYS;
        match inner.counts.get_mut(&key) {
            Some(n) => *n += 1,
            None if full => {
                return Err(Full(format!("at most {MAX_COUNTED_KEYS} keys are counted; reset the stand-in")));
            }
            None => {
                inner.counts.insert(key.clone(), 1);
            }
        }
        inner.total += 1;
        let n = self.last_n.fetch_add(1, Ordering::SeqCst) + 1;
        if inner.log.len() >= MAX_LOGGED_CALLS {
            inner.log.pop_front();
            inner.dropped += 1;
        }
        let at_ms = now_ms();
        inner.log.push_back(ClassifyCall { n, provider, account_id, model, authorization, key, status: None, at_ms });
        Ok((n, at_ms))
    }

    /// Records call `n`'s answer: in the in-memory log, and as a line of the file log.
    pub(crate) fn finish(&self, n: u64, provider: Provider, key: &str, at_ms: u64, status: u16) {
        {
            let mut inner = self.inner.lock();
            // Numbers are given and logged under one lock, so the log is contiguous in `n`.
            let first = inner.log.front().map(|c| c.n);
            if let Some(call) = first.and_then(|f| n.checked_sub(f)).and_then(|i| inner.log.get_mut(i as usize)) {
                if call.n == n {
                    call.status = Some(status);
                }
            }
        }
        let Some(file) = &self.file else { return };
        let line = serde_json::json!({"n": n, "provider": provider, "key": key, "status": status, "at_ms": at_ms});
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        let mut file = file.lock();
        // One write per line on an O_APPEND file: lines never interleave.
        if let Err(e) = file.write_all(&bytes).and_then(|()| file.flush()) {
            log::warn!("broca-mock: cannot append to the classify log: {e}");
        }
    }

    /// When this call is the one a hold waits for, waits until released (or the timeout, or
    /// the server stopping); otherwise returns at once.
    pub(crate) fn wait_if_held(&self, key: &str, stopping: &Stopping) -> HoldEnd {
        let mut holds = self.holds.lock();
        if !holds.pending.remove(key) {
            return HoldEnd::NotHeld;
        }
        let waiting = holds.waiting.entry(key.to_owned()).or_default();
        waiting.calls += 1;
        let epoch = waiting.epoch;
        let deadline = Instant::now() + self.hold_timeout();
        let end = loop {
            if holds.waiting.get(key).is_some_and(|w| w.epoch != epoch) {
                break HoldEnd::Released;
            }
            if stopping.load(Ordering::SeqCst) {
                break HoldEnd::Stopped;
            }
            let now = Instant::now();
            if now >= deadline {
                break HoldEnd::TimedOut;
            }
            // Woken by a release; the slice bounds how late a stopping server is noticed.
            self.bell.wait_for(&mut holds, (deadline - now).min(Duration::from_millis(100)));
        };
        if let Some(waiting) = holds.waiting.get_mut(key) {
            waiting.calls -= 1;
            if waiting.calls == 0 {
                holds.waiting.remove(key);
            }
        }
        end
    }
}
