//! The move campaign (`tests/federation.rs`): sessions moved A → B → A … under load, with
//! SIGKILLs of either broca at every step of export and import (fail points armed with a
//! probability in both brocas, `BROCA_FAILPOINTS`) and at random moments between steps.
//!
//! Load: one thread per session sends to wherever `broca::placement` finds the session (each
//! host's own `move.locate` answer), recording what each send was answered. Moves: the CLI
//! (`broca session export` on the owner's daemon, `broca session import` on the other's),
//! repeated until each answers, as an operator would after a crash.
//!
//! Checked, as violations: a session live on both hosts at any check; reads on the target after
//! a move that differ from the source's after its export; at the end, a session not live on
//! exactly one host, an accepted send missing from its final transcript or present twice, any
//! send present twice. `BROCA_FED_MOVES` sets the rounds (default 8; `make soak` runs more).
//! The last line is `FED-MOVES rounds=… kills=… sends=… accepted=… violations=…`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca::placement::{self, Held, Placed};
use broca::session_key::SessionKey;
use broca::subc::consumer::Consumer;
use serde_json::{json, Value};

use crate::fed_rig::{self, FedOptions, FedRig};
use crate::{call, cli_keyed, cli_result, module, open, send_params};

const SESSIONS: usize = 3;
/// The probability each move fail point fires at a hit.
const FAILPOINT_P: &str = "0.2";
const FAILPOINTS: [&str; 5] = [
    "move.export.after_tombstone",
    "move.export.before_rename",
    "move.adopt.after_stage",
    "move.adopt.after_forget",
    "move.adopt.after_rename",
];

struct Hosts {
    /// Module ids on A: A's own broca and B's re-exported one.
    ids: [String; 2],
}

/// What the load saw of one send.
#[derive(Debug, Clone, PartialEq)]
enum Sent {
    Accepted,
    Refused(String),
    Unknown,
}

pub fn run() {
    let rounds: usize = std::env::var("BROCA_FED_MOVES").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let failpoints = FAILPOINTS.iter().map(|f| format!("{f}:{FAILPOINT_P}")).collect::<Vec<_>>().join(",");
    let options = FedOptions { broca_env: vec![("BROCA_FAILPOINTS".into(), failpoints)], ..FedOptions::default() };
    let rig = Arc::new(FedRig::start(options));
    let hosts = Arc::new(Hosts { ids: ["broca".to_owned(), rig.fed_broca()] });
    let keys: Vec<SessionKey> = (0..SESSIONS)
        .map(|i| {
            SessionKey::new(rig.project_dir(&format!("move-{i}")).to_str().unwrap(), "fed-moves", &format!("s{i}"))
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let paused: Arc<Vec<AtomicBool>> = Arc::new((0..SESSIONS).map(|_| AtomicBool::new(false)).collect());
    let log: Arc<Mutex<Vec<BTreeMap<String, Sent>>>> = Arc::new(Mutex::new(vec![BTreeMap::new(); SESSIONS]));
    let kills = Arc::new(AtomicU64::new(0));
    let mut violations: Vec<String> = Vec::new();

    let loaders: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let (rig, hosts, key, stop, paused, log) = (
                Arc::clone(&rig),
                Arc::clone(&hosts),
                keys[i].clone(),
                Arc::clone(&stop),
                Arc::clone(&paused),
                Arc::clone(&log),
            );
            std::thread::spawn(move || load(&rig, &hosts, &key, i, &stop, &paused[i], &log))
        })
        .collect();
    // Every session exists somewhere before the first move.
    let on_a = rig.a.consumer();
    for key in &keys {
        wait_for(&format!("{} to exist", key.session), Duration::from_secs(30), || {
            matches!(place(&on_a, &hosts, key), Ok(Placed::Owner(_)))
        });
    }
    let seed = std::process::id() as u64;
    let mut random = seed;
    let mut next = || {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random
    };
    for round in 0..rounds {
        let i = round % SESSIONS;
        let key = &keys[i];
        paused[i].store(true, Ordering::SeqCst);
        let on_a = rig.a.consumer();
        let owner = loop {
            match place(&on_a, &hosts, key) {
                Ok(Placed::Owner(h)) => break h,
                other => {
                    std::thread::sleep(Duration::from_millis(100));
                    eprintln!("moves: round {round}: waiting for {}: {other:?}", key.session);
                }
            }
        };
        let (from, to) = if owner == "broca" { (&rig.a, &rig.b) } else { (&rig.b, &rig.a) };
        let archive = rig.root().join(format!("round-{round}.archive"));
        if next() % 3 == 0 {
            kill_broca(&rig, if next() % 2 == 0 { &rig.a } else { &rig.b }, &kills);
        }
        retry_cli(&format!("export {} round {round}", key.session), || {
            cli_keyed(&from.conn_file(), &["export"], key, &["--to", archive.to_str().unwrap()])
        });
        let read_from = reads_on(from, key);
        if next() % 3 == 0 {
            kill_broca(&rig, if next() % 2 == 0 { &rig.a } else { &rig.b }, &kills);
        }
        // In transit: neither host takes the session's sends.
        if let Ok(Placed::Owner(h)) | Ok(Placed::New(h)) = place(&on_a, &hosts, key) {
            violations.push(format!("round {round}: {} placed on {h} while in transit", key.session));
        }
        retry_cli(&format!("import {} round {round}", key.session), || {
            cli_result(&to.conn_file(), &["import", "--from", archive.to_str().unwrap(), "--json"])
        });
        let read_to = reads_on(to, key);
        if read_to != read_from {
            violations.push(format!(
                "round {round}: {} reads differ after the move:\n{read_from:?}\n{read_to:?}",
                key.session
            ));
        }
        match place(&on_a, &hosts, key) {
            Ok(Placed::Owner(h)) if h == hosts.ids[usize::from(owner == "broca")] => {}
            other => violations.push(format!("round {round}: {} after the move: {other:?}", key.session)),
        }
        paused[i].store(false, Ordering::SeqCst);
        eprintln!(
            "moves: round {round}: {} {owner} -> the other host ({} kills so far)",
            key.session,
            kills.load(Ordering::Relaxed)
        );
    }
    stop.store(true, Ordering::SeqCst);
    for l in loaders {
        l.join().expect("a load thread");
    }
    // Settle: every session's runs end; then the final transcripts.
    let on_a = rig.a.consumer();
    let (mut sends, mut accepted) = (0, 0);
    for (i, key) in keys.iter().enumerate() {
        // A broca killed last may still be restarting (`module_warming`): an unreachable host is
        // asked again, as a caller would, for a bounded time; any other answer decides.
        let until = Instant::now() + Duration::from_secs(30);
        let placed = loop {
            match place(&on_a, &hosts, key) {
                Err(placement::PlacementError::Unreachable { .. }) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => break other,
            }
        };
        let Ok(Placed::Owner(host)) = placed else {
            violations.push(format!("{}: at the end {placed:?}", key.session));
            continue;
        };
        let route = open(&on_a, &module(&host), key);
        let prompts = wait_settled(&on_a, route);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for p in &prompts {
            *counts.entry(p.clone()).or_default() += 1;
        }
        for (p, n) in &counts {
            if *n > 1 {
                violations.push(format!("{}: {p:?} is in the transcript {n} times", key.session));
            }
        }
        let log = log.lock().unwrap();
        for (prompt, sent) in &log[i] {
            sends += 1;
            let present = counts.contains_key(prompt);
            match sent {
                Sent::Accepted => {
                    accepted += 1;
                    if !present {
                        violations.push(format!("{}: accepted {prompt:?} is missing", key.session));
                    }
                }
                Sent::Refused(code) if present => {
                    violations.push(format!("{}: {prompt:?} was refused {code} yet ran", key.session))
                }
                _ => {}
            }
        }
    }
    let line = format!(
        "FED-MOVES rounds={rounds} kills={} sends={sends} accepted={accepted} violations={}",
        kills.load(Ordering::Relaxed) + failpoint_kills(&rig),
        violations.len()
    );
    println!("{line}");
    assert!(violations.is_empty(), "{line}\n{}", violations.join("\n"));
}

/// One session's load: a send every ~50 ms to wherever the session is placed.
fn load(
    rig: &FedRig,
    hosts: &Hosts,
    key: &SessionKey,
    i: usize,
    stop: &AtomicBool,
    paused: &AtomicBool,
    log: &Mutex<Vec<BTreeMap<String, Sent>>>,
) {
    let on_a = rig.a.consumer();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        if paused.load(Ordering::SeqCst) {
            continue;
        }
        let host = match place(&on_a, hosts, key) {
            Ok(p) => p.host().to_owned(),
            Err(_) => continue,
        };
        let identity = subc_protocol::BindIdentity::new(key.harness.clone(), key.session.clone());
        let Ok(route) =
            on_a.open_route_rooted(&module(&host), &identity, Some(&key.project_root), crate::fed_rig::CALL)
        else {
            continue;
        };
        let prompt = format!("load-{i}-{n}");
        n += 1;
        let outcome = match call(&on_a, route, "session.send", send_params(&prompt)) {
            Ok(_) => Sent::Accepted,
            // The stand-in's own codes say the route went away with the send in flight: its
            // outcome is unknown (it may have run), as after any lost connection.
            Err(e) if e["code"].as_str().is_some_and(|c| !c.starts_with("fed_")) => {
                Sent::Refused(e["code"].as_str().unwrap_or_default().to_owned())
            }
            Err(_) => Sent::Unknown,
        };
        on_a.close_route(route);
        log.lock().unwrap()[i].insert(prompt, outcome);
    }
}

fn place(on_a: &Consumer, hosts: &Hosts, key: &SessionKey) -> Result<Placed, placement::PlacementError> {
    placement::place(&key.addr(), &hosts.ids, |host| {
        let identity = subc_protocol::BindIdentity::new(key.harness.clone(), key.session.clone());
        let route = on_a
            .open_route_rooted(&module(host), &identity, Some(&key.project_root), crate::fed_rig::CALL)
            .map_err(|e| e.to_string())?;
        let answer = call(on_a, route, broca::moves::LOCATE, json!({}));
        on_a.close_route(route);
        let answer = answer.map_err(|e| e.to_string())?;
        Held::from_answer(&answer).ok_or_else(|| format!("unreadable: {answer}"))
    })
}

/// The session's transcript's user prompts once nothing runs or waits (its last run ended and
/// its head stayed put for a while).
fn wait_settled(c: &Consumer, route: broca::subc::consumer::ClientRoute) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(60);
    let mut last_head = Value::Null;
    loop {
        let head = call(c, route, "session.head", json!({}));
        let ended = head.as_ref().is_ok_and(|h| {
            ["completed", "cancelled", "interrupted", "failed"]
                .contains(&h["last_run_state"]["state"].as_str().unwrap_or(""))
        });
        let cursor = head.as_ref().map(|h| h["head"].clone()).unwrap_or(Value::Null);
        if ended && cursor == last_head {
            let page = call(c, route, "session.read", json!({"from_ordinal": 1, "limit": 1000})).expect("session.read");
            let mut prompts = Vec::new();
            for m in page["messages"].as_array().into_iter().flatten() {
                if m["message"]["role"] == "user" {
                    for part in m["message"]["content"].as_array().into_iter().flatten() {
                        if let Some(t) = part["text"].as_str() {
                            prompts.push(t.to_owned());
                        }
                    }
                }
            }
            return prompts;
        }
        last_head = cursor;
        assert!(Instant::now() < until, "the session never settled: {head:?}");
        std::thread::sleep(Duration::from_millis(700));
    }
}

fn reads_on(daemon: &fed_rig::Daemon, key: &SessionKey) -> Vec<String> {
    let c = daemon.consumer();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let route = open(&c, &crate::FedRig::broca_target(), key);
        let got: Result<Vec<String>, Value> = ["session.read", "session.history"]
            .iter()
            .map(|m| call(&c, route, m, json!({})).map(|v| v.to_string()))
            .collect();
        c.close_route(route);
        match got {
            Ok(reads) => return reads,
            Err(e) => assert!(Instant::now() < until, "reads on {} failed: {e}", daemon.name),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn kill_broca(rig: &FedRig, daemon: &fed_rig::Daemon, kills: &AtomicU64) {
    if let Some(pid) = daemon.broca_pid() {
        fed_rig::kill(pid);
        kills.fetch_add(1, Ordering::Relaxed);
        let _ = rig;
    }
}

/// The fail-point kills both brocas logged.
fn failpoint_kills(rig: &FedRig) -> u64 {
    [&rig.a, &rig.b].iter().map(|d| d.module_log("broca").matches("failpoint move.").count() as u64).sum()
}

fn retry_cli(what: &str, mut attempt: impl FnMut() -> Result<Value, String>) -> Value {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        match attempt() {
            Ok(v) => return v,
            Err(e) => {
                eprintln!("moves: {what}: {e}");
                assert!(Instant::now() < until, "{what}: {e}");
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
