//! The step-event evidence the suite's `step_events` cases read (llm-runner §14.3): a real
//! `nats-server` every rig's broca publishes on (its `broca.jsonc` names it), a subscriber that
//! captures each hint at the bus and, the moment it arrives, checks that its attempt record is
//! already in the session's WAL, and the native step positions read from the WAL itself,
//! independently of what was published.
//!
//! Without `nats-server` on PATH no rig names a bus, broca does not declare `step_events`, and
//! the three cases skip by that capability.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broca::record::{Record, KNOWN_FEATURES};
use broca::session_key::SessionKey;
use broca::wal::{self, ScannedFrame, WalError};
use cortexkit_role_llm_runner::session_ref::{session_ref, SessionIdentity};
use cortexkit_role_llm_runner::step_events::StepRef;
use cortexkit_role_llm_runner_conformance::step_events::{PublishedStep, RecordedStep, StepEventObservation};
use serde_json::Value;

use crate::nats::{Captured, NatsServer, Subscriber};
use crate::subject::HARNESS;

/// The `{acct}` token of every rig's live subjects.
pub const ACCOUNT: &str = "conformance";
/// How long an observation waits for the hints of a session's recorded attempts.
const SETTLE: Duration = Duration::from_secs(10);

/// The bus of one suite run.
pub struct Bus {
    _server: NatsServer,
    subscriber: Subscriber,
    pub url: String,
}

impl Bus {
    /// A server and its subscriber, if `nats-server` is here; `runs` holds every state root of
    /// the run (where the durability check finds the WALs).
    pub fn start(runs: &Path) -> Option<Bus> {
        if !crate::nats::available("step_events (the suite's three cases skip by capability)") {
            return None;
        }
        let server = NatsServer::start(&[]);
        let runs = runs.to_owned();
        let check = Box::new(move |_: &str, body: &[u8]| durable_in(&runs, body));
        let subscriber = Subscriber::start(&server.addr(), "ck.*.live.*.step.finished.v1", check);
        Some(Bus { url: server.url(), _server: server, subscriber })
    }

    /// The hints captured for `session` so far.
    fn published(&self, session: &str) -> Vec<Captured> {
        let all = self.subscriber.captured.lock().unwrap_or_else(|e| e.into_inner()).clone();
        all.into_iter().filter(|c| names(&c.body, session)).collect()
    }

    /// The suite's evidence for `session` on the state root `root`: every attempt record in its
    /// WAL, and every hint captured for it once as many have arrived (or [`SETTLE`] passed).
    pub async fn observe(&self, root: &Path, session: &str) -> Result<StepEventObservation, String> {
        let recorded = recorded_steps(root, session)?;
        let until = Instant::now() + SETTLE;
        let mut published = self.published(session);
        while published.len() < recorded.len() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
            published = self.published(session);
        }
        let published = published
            .into_iter()
            .map(|c| {
                let body: Value = serde_json::from_slice(&c.body).unwrap_or(Value::Null);
                PublishedStep::new(c.subject, body, c.checked)
            })
            .collect();
        Ok(StepEventObservation::new(recorded, published))
    }
}

/// Whether a hint's body names `session` of the suite's harness.
fn names(body: &[u8], session: &str) -> bool {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    body["harness"] == HARNESS && body["session"] == session
}

/// The session's live WAL under one state root (any placement).
fn wal_of(root: &Path, session: &str) -> Option<PathBuf> {
    let addr = SessionKey::new("/", HARNESS, session).addr();
    ["wal", "wal-durable", "wal-ephemeral"]
        .iter()
        .map(|dir| root.join(dir).join(format!("{addr}.wal")))
        .find(|p| p.is_file())
}

/// The native step records of `session` on `root`: one per `ModelAttemptFinished`, at its WAL
/// position.
fn recorded_steps(root: &Path, session: &str) -> Result<Vec<RecordedStep>, String> {
    let state = crate::rig::broca_root(root);
    let path = wal_of(&state, session).ok_or_else(|| format!("no WAL of {session} under {}", state.display()))?;
    let reference = session_ref(&SessionIdentity { runner: crate::rig::BROCA, harness: HARNESS, session });
    let mut attempts = Vec::new();
    let header = wal::read::<WalError>(&path, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        if let Ok(Record::ModelAttemptFinished(a)) = Record::decode(f.payload) {
            attempts.push((f.seq, a));
        }
        Ok(())
    })
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let incarnation = header.incarnation_string();
    Ok(attempts
        .into_iter()
        .map(|(seq, a)| {
            let position = StepRef::new(crate::rig::BROCA, &reference, &incarnation, seq);
            let attempt = std::num::NonZeroU64::new(u64::from(a.attempt) + 1).unwrap_or(std::num::NonZeroU64::MIN);
            let step = RecordedStep::new(position, &a.run_id, a.step.to_string(), attempt, a.outcome != "retry");
            match a.attempt_id {
                Some(id) => step.with_attempt_id(id),
                None => step,
            }
        })
        .collect())
}

/// At the moment a hint arrives: whether the record it names is already in its session's WAL
/// (same incarnation, a `ModelAttemptFinished` at its seq with its `attempt_id`), under any
/// state root of the run.
fn durable_in(runs: &Path, body: &[u8]) -> bool {
    let Ok(hint) = serde_json::from_slice::<Value>(body) else { return false };
    let (Some(session), Some(seq), Some(id), Some(incarnation)) =
        (hint["session"].as_str(), hint["seq"].as_u64(), hint["attempt_id"].as_str(), hint["log_incarnation"].as_str())
    else {
        return false;
    };
    state_roots(runs).iter().filter_map(|root| wal_of(root, session)).any(|path| {
        let mut found = false;
        let header = wal::read::<WalError>(&path, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
            if f.seq == seq {
                found = matches!(Record::decode(f.payload),
                    Ok(Record::ModelAttemptFinished(a)) if a.attempt_id.as_deref() == Some(id));
            }
            Ok(())
        });
        found && header.is_ok_and(|h| h.incarnation_string() == incarnation)
    })
}

/// Every broca state root under `runs` (`…/broca` directories), at any depth up to six.
fn state_roots(runs: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut frontier = vec![(runs.to_owned(), 0)];
    while let Some((dir, depth)) = frontier.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if path.file_name().is_some_and(|n| n == "broca") {
                out.push(path);
            } else if depth < 6 {
                frontier.push((path, depth + 1));
            }
        }
    }
    out
}

impl Bus {
    /// What each fresh state root's `broca.jsonc` says: publish on this bus.
    pub fn broca_jsonc(&self) -> String {
        serde_json::json!({"step_events": {"bus": self.url, "account": ACCOUNT}}).to_string()
    }
}
