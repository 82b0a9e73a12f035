//! Resubscribing from a cursor across SIGKILLs of broca, through the real subc daemon (one
//! [`support::Harness`]: the daemon in process, the real broca binary, broca-mock, the SDK).
//!
//! For K rounds (`BROCA_RESUB_ROUNDS`, default 8): a run streams slowly on one session while
//! three subscribers follow it (A from `start`, B from `live`, C from `live` joining at round
//! 2), each on its own consumer connection and keeping its last control cursor; broca is
//! SIGKILLed mid-stream and respawned (the daemon gets a large crash budget and a flat 50 ms
//! backoff for this); every subscriber resubscribes from its last cursor as fast as it can
//! (route opens retried every 10 ms while broca is gone); then a new run completes, so later
//! units arrive.
//! At the end a fresh replay `from: "start"` (up to `session.read`'s `head`) is the reference:
//! each subscriber's streams joined, in order, are exactly its units from the subscriber's
//! first cursor onward (no gap, no duplicate, cursors strictly rising), and in particular each
//! killed run's seal units (`error` + `run_finished`, written by the orphan sealing when the
//! respawned broca reopens the session) are there.
//!
//! `BROCA_RESUB_SEED` fixes the kill-point jitter (printed at the start).

use broca_mock::mock;
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use subc_client_rs::{RetryBackoff, SubscribeOptions};
use support::{retry, send_params, Harness, Options, Session};

const HARNESS: &str = "resub-e2e";
const SESSION: &str = "resub";
/// The whole campaign may not take longer than this (the rounds, then the catch-up).
const CAMPAIGN: Duration = Duration::from_secs(240);
/// How long a subscriber may take to reach the final head once it is known.
const CATCH_UP: Duration = Duration::from_secs(30);

/// A control cursor `(wal_seq, sub_index)`; tuples order as the spec does.
type Cursor = (u64, u64);

fn cursor_of(v: &Value) -> Option<Cursor> {
    Some((v["wal_seq"].as_u64()?, v["sub_index"].as_u64()?))
}

fn cursor_json(c: Cursor) -> Value {
    json!({"wal_seq": c.0, "sub_index": c.1})
}

/// What one subscriber saw, and how often it had to come back.
#[derive(Default)]
struct Seen {
    name: String,
    /// Every control unit accepted, in arrival order (cursors strictly rising).
    units: Vec<(Cursor, Value)>,
    /// Control units whose cursor was not above the last one (duplicates, reordering).
    disorder: Vec<String>,
    /// Successful `session.subscribe` calls (the first one included).
    subscribes: u32,
    /// `session.subscribe` attempts the SDK or broca refused (during respawns).
    refused: u32,
    /// How each stream ended, in order.
    ends: Vec<String>,
    /// Set when it never reached the final head.
    stuck: Option<String>,
}

/// Live counters for the progress lines.
#[derive(Default)]
struct Progress {
    units: AtomicUsize,
    resubscribes: AtomicUsize,
    refused: AtomicUsize,
}

/// Shared between the driver (main thread) and the subscribers.
struct Control {
    /// The round the driver is in (1-based; 0 before the first).
    round: AtomicU64,
    /// The fresh head once the driver is done: subscribers stop when they reach it.
    target: Mutex<Option<Cursor>>,
    /// Ends every subscriber now (a failure elsewhere).
    abort: AtomicBool,
}

/// One subscriber: subscribes `from` (once `join_round` is reached), then reads; whenever its
/// stream ends it resubscribes from its last cursor at once, retrying refusals every 10 ms.
fn follow(s: &Session, name: &str, from: Value, join_round: u64, ctl: &Control, progress: &Progress) -> Seen {
    let mut seen = Seen { name: name.into(), ..Seen::default() };
    let hard_stop = Instant::now() + CAMPAIGN;
    while ctl.round.load(Ordering::SeqCst) < join_round && !ctl.abort.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut sub: Option<support::Sub> = None;
    let mut target_seen_at: Option<Instant> = None;
    let mut last_refusal = String::new();
    loop {
        let last = seen.units.last().map(|(c, _)| *c);
        let target = *ctl.target.lock().unwrap();
        if let Some(t) = target {
            if last.is_some_and(|l| l >= t) {
                break;
            }
            let since = *target_seen_at.get_or_insert_with(Instant::now);
            if since.elapsed() > CATCH_UP {
                seen.stuck = Some(format!("last cursor {last:?} never reached the head {t:?} within {CATCH_UP:?}"));
                break;
            }
        }
        if ctl.abort.load(Ordering::SeqCst) {
            seen.stuck = Some("aborted".into());
            break;
        }
        if Instant::now() > hard_stop {
            seen.stuck = Some(format!("the campaign ran past {CAMPAIGN:?} (last cursor {last:?})"));
            break;
        }
        let Some(stream) = sub.as_mut() else {
            let resume = last.map(cursor_json).unwrap_or_else(|| from.clone());
            match s.try_subscribe_with(json!({"from": resume}), eager()) {
                Ok(stream) => {
                    seen.subscribes += 1;
                    if seen.subscribes > 1 {
                        progress.resubscribes.fetch_add(1, Ordering::Relaxed);
                    }
                    sub = Some(stream);
                }
                Err(e) => {
                    seen.refused += 1;
                    progress.refused.fetch_add(1, Ordering::Relaxed);
                    last_refusal = format!("{e:?}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            continue;
        };
        match stream.next_within(Duration::from_millis(50)) {
            Ok(Some(event)) if event["kind"] == "control" => {
                let Some(cursor) = cursor_of(&event["cursor"]) else {
                    seen.disorder.push(format!("a control frame without a cursor: {event}"));
                    continue;
                };
                if last.is_some_and(|l| cursor <= l) {
                    seen.disorder.push(format!(
                        "cursor {cursor:?} ({}) after {last:?} (stream {})",
                        event["unit"]["type"], seen.subscribes
                    ));
                } else {
                    seen.units.push((cursor, event["unit"].clone()));
                    progress.units.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Some(_display)) => {}
            Ok(None) => {
                let ended = stream.ended();
                seen.ends.push(format!("{ended:?}"));
                sub = None;
            }
            Err(()) => {}
        }
    }
    // Dropping a stream cancels it.
    drop(sub);
    if seen.refused > 0 {
        log::debug!("{name}: the last refused subscribe: {last_refusal}");
    }
    seen
}

/// Subscribe options that retry a refused route open every 10 ms (the SDK's default backs off
/// up to 2 s between attempts), with a roomy event buffer.
fn eager() -> SubscribeOptions {
    let route_retry = RetryBackoff { base: Duration::from_millis(10), cap: Duration::from_millis(10), max_attempts: 1 };
    SubscribeOptions { event_buffer: 100_000, route_retry, ..SubscribeOptions::default() }
}

/// A small deterministic generator for the kill-point jitter.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A keyed send (across a restart: the same send_id, send.status deciding): its run id.
fn start_run(s: &Session, prompt: &str, send_id: &str) -> String {
    let mut params = send_params(prompt);
    params["send_id"] = json!(send_id);
    let answer = s.send_surviving_kills(params);
    answer["run_id"]
        .as_str()
        .map(String::from)
        .or_else(|| answer["submission_id"].as_str().map(|sub| format!("run-{sub}")))
        .unwrap_or_else(|| panic!("session.send answered {answer}"))
}

fn wait_state(s: &Session, run_id: &str, states: &[&str]) -> Value {
    let until = Instant::now() + support::STEP;
    loop {
        let status = retry(s, "run.status", json!({"run_id": run_id}));
        if states.iter().any(|st| status["state"] == *st) {
            return status;
        }
        assert!(Instant::now() < until, "run {run_id} did not reach {states:?}: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_requests(h: &Harness, base: usize) {
    let until = Instant::now() + support::STEP;
    while h.mock.requests("default").len() <= base {
        assert!(Instant::now() < until, "the provider never got the round's request");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// About 1.2 s of text deltas: long enough to be killed mid-stream.
fn slow_stream(round: u64) -> Value {
    let mut events = Vec::new();
    for i in 0..12 {
        events.push(json!({"text": format!("r{round}w{i} ")}));
        events.push(json!({"delay_ms": 100}));
    }
    events.push(json!({"usage": {"input": 5, "output": 12}}));
    events.push(json!({"finish": "stop"}));
    json!({"events": events})
}

fn quick_reply(text: &str) -> Value {
    json!({"events": [{"text": text}, {"delay_ms": 20}, {"text": "."}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

/// A fresh `from: "start"` replay on a new connection, read until the unit at `head`.
fn fresh_replay(h: &Harness, head: Cursor) -> Vec<(Cursor, Value)> {
    let s = h.connect().session(HARNESS, SESSION);
    let mut sub = s.subscribe(json!("start"));
    let mut units = Vec::new();
    let until = Instant::now() + support::STEP;
    loop {
        assert!(Instant::now() < until, "the fresh replay never reached the head {head:?} ({} units)", units.len());
        let Some(event) = sub.next_within(Duration::from_millis(200)).expect_or_continue() else { continue };
        if event["kind"] != "control" {
            continue;
        }
        let cursor = cursor_of(&event["cursor"]).expect("a control cursor");
        units.push((cursor, event["unit"].clone()));
        if cursor >= head {
            break;
        }
    }
    sub.unsubscribe();
    units
}

trait NextOrContinue {
    fn expect_or_continue(self) -> Option<Value>;
}

impl NextOrContinue for Result<Option<Value>, ()> {
    /// The event, `None` on a quiet interval; panics when the stream ended.
    fn expect_or_continue(self) -> Option<Value> {
        match self {
            Ok(Some(v)) => Some(v),
            Ok(None) => panic!("the fresh replay's stream ended early"),
            Err(()) => None,
        }
    }
}

fn unit_label(unit: &Value) -> String {
    let ty = unit["type"].as_str().unwrap_or("?");
    match unit["run_id"].as_str() {
        Some(run) => format!("{ty}[{run}]"),
        None => ty.to_string(),
    }
}

/// The subscriber's stream against the fresh replay from its first cursor: `Ok(units)` or
/// every difference found.
fn compare(seen: &Seen, fresh: &[(Cursor, Value)], killed: &[(u64, String)]) -> Result<usize, Vec<String>> {
    let mut problems: Vec<String> = seen.disorder.iter().map(|d| format!("out of order: {d}")).collect();
    if let Some(why) = &seen.stuck {
        problems.push(format!("stuck: {why}"));
    }
    let Some(first) = seen.units.first().map(|(c, _)| *c) else {
        problems.push("received no control unit at all".into());
        return Err(problems);
    };
    let expected: Vec<&(Cursor, Value)> = fresh.iter().filter(|(c, _)| *c >= first).collect();
    if expected.first().map(|(c, _)| *c) != Some(first) {
        problems.push(format!("its first cursor {first:?} is not in the fresh replay"));
    }
    let got: std::collections::BTreeMap<Cursor, &Value> = seen.units.iter().map(|(c, u)| (*c, u)).collect();
    let want: std::collections::BTreeMap<Cursor, &Value> = expected.iter().map(|(c, u)| (*c, u)).collect();
    let missing: Vec<Cursor> = want.keys().filter(|c| !got.contains_key(c)).copied().collect();
    let extra: Vec<Cursor> = got.keys().filter(|c| !want.contains_key(c)).copied().collect();
    if let Some(&gap) = missing.first() {
        let at = fresh.iter().position(|(c, _)| *c == gap).unwrap_or(0);
        let around: Vec<String> = fresh[at.saturating_sub(3)..(at + 4).min(fresh.len())]
            .iter()
            .map(|(c, u)| {
                let mark = if got.contains_key(c) { " " } else { "!" };
                format!("{mark}({},{}) {}", c.0, c.1, unit_label(u))
            })
            .collect();
        let labels: Vec<String> =
            missing.iter().map(|c| format!("({},{}) {}", c.0, c.1, unit_label(want[c]))).collect();
        problems.push(format!(
            "{} unit(s) missing, the first at cursor {gap:?}; around it in the fresh replay (! = missing):\n      {}\n    missing: {}",
            missing.len(),
            around.join("\n      "),
            labels.join(", ")
        ));
    }
    if !extra.is_empty() {
        problems.push(format!("{} unit(s) not in the fresh replay, the first at {:?}", extra.len(), extra[0]));
    }
    let differing: Vec<Cursor> =
        want.iter().filter(|(c, u)| got.get(c).is_some_and(|g| g != *u)).map(|(c, _)| *c).collect();
    if let Some(c) = differing.first() {
        problems.push(format!(
            "{} unit(s) differ from the fresh replay, the first at {c:?}:\n      got  {}\n      want {}",
            differing.len(),
            got[c],
            want[c]
        ));
    }
    // The killed runs' seal units, by name, for every killed run the subscriber's range covers.
    for (round, run) in killed {
        let in_fresh =
            |ty: &str| expected.iter().any(|(_, u)| u["type"] == ty && u["run_id"].as_str() == Some(run.as_str()));
        let in_seen = |ty: &str| seen.units.iter().any(|(_, u)| u["type"] == ty && u["run_id"].as_str() == Some(run));
        for ty in ["error", "run_finished"] {
            if in_fresh(ty) && !in_seen(ty) {
                problems.push(format!("round {round}: the killed run {run}'s seal unit `{ty}` never arrived"));
            }
        }
    }
    if problems.is_empty() {
        Ok(seen.units.len())
    } else {
        Err(problems)
    }
}

#[test]
fn resubscribe_across_sigkills() {
    let rounds: u64 = std::env::var("BROCA_RESUB_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let seed: u64 = std::env::var("BROCA_RESUB_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) % 1_000_000);
    eprintln!("resubscribe: {rounds} round(s), seed {seed} (BROCA_RESUB_ROUNDS, BROCA_RESUB_SEED)");
    let mut jitter = Lcg(seed);
    // One SIGKILL per round: a crash budget and a short, flat backoff for this campaign.
    let restart = json!({"max_restarts": 1000, "window_secs": 3600, "backoff_ms": 50, "max_backoff_ms": 50});
    let h = Harness::start_with(Options { restart: Some(restart), ..Options::default() });
    let driver = h.session(HARNESS, SESSION, None);
    let followers = [("A", json!("start"), 0u64), ("B", json!("live"), 0), ("C", json!("live"), 2)];
    let sessions: Vec<Session> = followers.iter().map(|_| h.connect().session(HARNESS, SESSION)).collect();
    let progress: Vec<Progress> = followers.iter().map(|_| Progress::default()).collect();
    let ctl = Control { round: AtomicU64::new(0), target: Mutex::new(None), abort: AtomicBool::new(false) };
    let started = Instant::now();
    let mut killed: Vec<(u64, String)> = Vec::new();

    let (seen, campaign) = std::thread::scope(|scope| {
        let threads: Vec<_> = followers
            .iter()
            .zip(&sessions)
            .zip(&progress)
            .map(|(((name, from, join), s), p)| {
                let ctl = &ctl;
                scope.spawn(move || follow(s, name, from.clone(), *join, ctl, p))
            })
            .collect();
        let campaign = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A first completed run, so `live` subscribers have something before any kill.
            h.install(json!({"responses": [quick_reply("warm up")]}));
            let warm = start_run(&driver, "warm up", "warm");
            wait_state(&driver, &warm, &["completed"]);
            for round in 1..=rounds {
                ctl.round.store(round, Ordering::SeqCst);
                let base = h.mock.requests("default").len();
                h.install(json!({"responses": [slow_stream(round)]}));
                let doomed = start_run(&driver, &format!("round {round}: stream slowly"), &format!("r{round}-kill"));
                wait_requests(&h, base);
                let pause = 50 + jitter.below(600);
                std::thread::sleep(Duration::from_millis(pause));
                let killed_at = Instant::now();
                let old = h.kill_broca();
                let pid = h.wait_respawn(old);
                let respawned = killed_at.elapsed();
                killed.push((round, doomed.clone()));
                // Later units: a new run right after the respawn (it also opens the session).
                h.install(json!({"responses": [quick_reply(&format!("after kill {round}"))]}));
                let after = start_run(&driver, &format!("round {round}: after the kill"), &format!("r{round}-after"));
                let sealed = wait_state(&driver, &doomed, &["interrupted", "failed", "cancelled", "completed"]);
                wait_state(&driver, &after, &["completed"]);
                let counts: Vec<String> = followers
                    .iter()
                    .zip(&progress)
                    .map(|((name, _, _), p)| {
                        format!(
                            "{name}: {} units, {} resubscribes, {} refused",
                            p.units.load(Ordering::Relaxed),
                            p.resubscribes.load(Ordering::Relaxed),
                            p.refused.load(Ordering::Relaxed)
                        )
                    })
                    .collect();
                eprintln!(
                    "resubscribe: round {round}/{rounds}: killed {doomed} {pause} ms into its stream (sealed {}), \
                     broca {old} -> {pid} in {respawned:?}; {}",
                    sealed["state"],
                    counts.join("; ")
                );
            }
            let page = retry(&driver, "session.read", json!({"limit": 1}));
            cursor_of(&page["head"]).unwrap_or_else(|| panic!("session.read has no head: {page}"))
        }));
        match &campaign {
            Ok(head) => *ctl.target.lock().unwrap() = Some(*head),
            Err(_) => ctl.abort.store(true, Ordering::SeqCst),
        }
        let seen: Vec<Seen> = threads.into_iter().map(|t| t.join().expect("a subscriber thread")).collect();
        (seen, campaign)
    });
    let head = match campaign {
        Ok(head) => head,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    let fresh = fresh_replay(&h, head);
    h.stop();

    let mut failures = Vec::new();
    for (round, run) in &killed {
        for ty in ["error", "run_finished"] {
            if !fresh.iter().any(|(_, u)| u["type"] == ty && u["run_id"].as_str() == Some(run.as_str())) {
                failures.push(format!("round {round}: the fresh replay has no `{ty}` unit of the killed run {run}"));
            }
        }
    }
    let mut summary = Vec::new();
    for s in &seen {
        let resubscribes = s.subscribes.saturating_sub(1);
        match compare(s, &fresh, &killed) {
            Ok(n) => {
                summary.push(format!("{}: {n} units, {resubscribes} resubscribes, {} refused, ok", s.name, s.refused))
            }
            Err(problems) => {
                summary.push(format!(
                    "{}: {} units, {resubscribes} resubscribes, {} refused, FAILED",
                    s.name,
                    s.units.len(),
                    s.refused
                ));
                failures.push(format!("subscriber {}:\n  {}", s.name, problems.join("\n  ")));
            }
        }
    }
    eprintln!(
        "resubscribe: {rounds} round(s) in {:?}, fresh replay {} units up to {head:?}, seed {seed}\n  {}",
        started.elapsed(),
        fresh.len(),
        summary.join("\n  ")
    );
    assert!(failures.is_empty(), "resubscribing lost or duplicated control units:\n{}", failures.join("\n"));
}
