//! At-most-once tool calls under real kills, through the real daemon (issue #11's crash
//! campaign; the fail points of #14): the subc daemon supervises broca and broca-mock (a
//! `tool-provider/v1` module whose call log, outside broca's state root, is the external count),
//! the harness's MockServer plays the model, and drivers run sessions with tool loops while the
//! campaign SIGKILLs broca — at random moments and, through `BROCA_FAILPOINTS`, at the named
//! points of `src/failpoint.rs` — and the daemon respawns it.
//!
//! # How an incarnation gets its fail points
//!
//! The daemon starts a launcher script in broca's place (`Options::launcher`): it takes the
//! spec the campaign left in `next-failpoints` (removing it, so exactly one incarnation gets
//! it), notes `<pid> <spec>` in `spawns.log`, and `exec`s broca with `BROCA_FAILPOINTS` set — the
//! same pid. Before each kill the campaign writes the next incarnation's spec: a named point
//! (`name@N`, the N-th hit) or none. An armed incarnation is left to die at its point (killed
//! after [`POINT_WAIT`] if its point was not reached); an unarmed one is killed right at
//! its spawn (boot recovery) or at a random moment after it registered.
//!
//! # The load
//!
//! [`DRIVERS`] threads each run sessions of one to four sends, sometimes two back to back (the
//! second queued, steered into the first one's run, or interrupting it); now and then the owner
//! retracts a queued send or cancels the running run (`now` or `step_boundary`). The first send of a session carries the fetch plan (`mock-tools`); every
//! send has a `send_id` and is retried with the same bytes until broca answers, so every send
//! ends accepted exactly once. The model FIFO is kept topped up with steps that call `echo`,
//! `sleep` and `counter` with a unique tag per call (each call has its own key in the call log)
//! or answer text (ending the run); each driver waits for its runs to reach a terminal.
//!
//! # The invariants (checked after the last kill, every one of them)
//!
//! - no call ran twice at the provider (every call-log key at most once), and every call that
//!   ran has a durable `ToolDispatchIntent` (durable before dispatch) with a unique key;
//! - every intent has exactly one `ToolResult`; a result the tool answered (`ok`) ran exactly
//!   once; a `nothing_sent` result never ran; a result with an unknown outcome reads as unknown
//!   in `session.read` (its result text, and `tool_calls[].indeterminate` once a build serves
//!   it), a sealed one is listed in its run's `RunFinished.indeterminate_tool_calls`, and its
//!   run is `interrupted` (`run.status`, and its WAL `RunFinished`) unless we cancelled it;
//! - every run started reaches a terminal (`run.status` and the WAL agree), and every tool call
//!   in the transcript has exactly one result;
//! - every accepted send is in its session's transcript exactly once (a retracted one never);
//! - prior episodes are intact: a session its driver finished reads exactly as it did then;
//! - cursors are continuous: from the start they rise strictly to the durable head with frame
//!   `seq` 1, 2, …, and a stream resumed at a middle cursor delivers exactly the rest;
//! - the store is rebuildable: with broca stopped and `run-index.db` deleted, every session
//!   reopened from its WAL alone reads exactly the transcript broca served.
//!
//! Size: `BROCA_SOAK_KILLS` (default 60, `make test`); `make soak` runs 1,000. `BROCA_SOAK_SECS`
//! bounds the kill phase (default: 3 s per kill + 60 s); fewer kills than asked fails the test.
//! `BROCA_CRASH_TOOLS_SEED` replays the campaign's choices (not the machine's timing). It prints
//! one summary line, `CRASH-TOOLS kills=… calls=… duplicates=0 indeterminate=… violations=0 …`,
//! and last `SOAK kills=… violations=… sends=… calls=…`.

use broca_mock::mock;
use broca_mock::tools::call_log;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use broca::record::{CallOutcome, FinishReason, Record};
use serde_json::{json, Value};
use support::{Harness, Options, Session};

const HARNESS: &str = "crash-tools";
const TOOLS: &str = "mock-tools";
/// Driver threads, each with its own sessions.
const DRIVERS: usize = 3;
/// How long an armed incarnation may take to reach its point before it is killed anyway.
const POINT_WAIT: Duration = Duration::from_secs(4);
/// The longest wait for one send to be answered or one run to reach a terminal.
const SETTLE: Duration = Duration::from_secs(90);
/// broca's default tool wait in this rig (a debug-build switch): no run waits long on a call.
const TOOL_WAIT_MS: u64 = 5000;

/// The named points with `max_n`: a round arms `name@N`, N in `1..=max_n` (a busy point's later
/// hits are other moments).
const POINTS: &[(&str, u64)] = &[
    ("tool.after_intent_fsync", 3),
    ("tool.after_request_sent", 4),
    ("tool.after_reply", 3),
    ("step.after_started", 3),
    ("step.mid_stream", 8),
    ("run.after_finished_before_index", 2),
    ("queue.between_queued_and_started", 1),
    ("store.mid_checkpoint", 3),
];
/// The points at-most-once is about: every campaign must have killed broca at each of them.
const TOOL_POINTS: [&str; 3] = ["tool.after_intent_fsync", "tool.after_request_sent", "tool.after_reply"];
/// The order armed rounds take the points in (indices into [`POINTS`]): the tool points in
/// three of every four rounds, so even a short campaign covers them; every point in 20 rounds.
const ROTATION: [usize; 20] = [0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 5, 0, 1, 2, 6, 0, 1, 2, 7];
/// A campaign this long must have fired every point of [`POINTS`] (`make soak`).
const ALL_POINTS_FROM: usize = 300;

/// xorshift64*: a small deterministic PRNG (one per thread, seeded from the campaign's seed).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------------------
// The fail-point mechanism on its own (a re-executed child of this test binary)
// ---------------------------------------------------------------------------------------------

const CHILD_ENV: &str = "CRASH_TOOLS_FAILPOINT_CHILD";

/// Not a test of its own: the child of `a_failpoint_sigkills_its_process_at_its_nth_hit` (it
/// does nothing unless [`CHILD_ENV`] is set).
#[test]
fn failpoint_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    for i in 1..=5 {
        broca::failpoint!("crash_tools.child");
        println!("SURVIVED {i}");
    }
}

fn run_child(spec: &str) -> (Option<i32>, String, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["failpoint_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(broca::failpoint::ENV, spec)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.signal(), stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_failpoint_sigkills_its_process_at_its_nth_hit() {
    const { assert!(broca::failpoint::COMPILED, "tests are debug builds: fail points are compiled in") };
    let (signal, stdout, stderr) = run_child("other.point,crash_tools.child@3");
    assert_eq!(signal, Some(libc::SIGKILL), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("SURVIVED 2") && !stdout.contains("SURVIVED 3"), "{stdout}");
    assert!(stderr.contains("broca: failpoint crash_tools.child fired (hit 3): SIGKILL"), "{stderr}");
    // Unarmed (another name, or a malformed entry): the child runs to its end.
    let (signal, stdout, stderr) = run_child("crash_tools.other,crash_tools.child@0");
    assert_eq!(signal, None, "{stderr}");
    assert!(stdout.contains("SURVIVED 5"), "{stdout}");
    assert!(stderr.contains("ignored \"crash_tools.child@0\""), "{stderr}");
    // Certain probability fires at the first hit.
    let (signal, stdout, _) = run_child("crash_tools.child:1");
    assert_eq!(signal, Some(libc::SIGKILL));
    assert!(!stdout.contains("SURVIVED 1"), "{stdout}");
}

// ---------------------------------------------------------------------------------------------
// The model script: unique calls, counted by key
// ---------------------------------------------------------------------------------------------

/// Every call the model was scripted to make, by its call-log key.
#[derive(Default)]
struct Scripted {
    next: AtomicU64,
    keys: Mutex<BTreeSet<String>>,
}

impl Scripted {
    /// One model step: 55% a batch of 1–3 unique calls, else a final text.
    fn step(&self, rng: &mut Rng) -> Value {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        if !rng.chance(55) {
            return json!({"events": [{"text": format!("answer {n}")}, {"usage": {"input": 5, "output": 2}},
                                     {"finish": "stop"}]});
        }
        let mut events = vec![json!({"text": "calling"}), json!({"delay_ms": rng.range(5, 40)})];
        for i in 0..rng.range(1, 3) {
            let tag = format!("k{n}-{i}");
            let (tool, args) = match rng.range(0, 2) {
                0 => ("echo", json!({"tag": tag})),
                1 => ("sleep", json!({"ms": rng.range(10, 250), "tag": tag})),
                _ => ("counter", json!({"name": tag})),
            };
            self.keys.lock().unwrap().insert(call_log::call_key_of(None, tool, &args));
            events.push(json!({"tool_call": {"id": format!("c{n}-{i}"), "name": tool, "arguments": args}}));
        }
        events.push(json!({"usage": {"input": 7, "output": 3}}));
        events.push(json!({"finish": "tool_calls"}));
        json!({"events": events})
    }
}

// ---------------------------------------------------------------------------------------------
// Drivers
// ---------------------------------------------------------------------------------------------

/// A send broca answered (`active` or `pending`), and the run id to follow it by.
#[derive(Clone, Debug)]
struct Accepted {
    session: String,
    prompt: String,
    run_id: String,
    /// Its submission, while it may still be pending (a queued reply).
    pending: Option<String>,
    /// `session.retract` answered `retracted: true`: it must never reach the transcript.
    retracted: bool,
    /// The driver asked `run.cancel` of its run.
    cancelled: bool,
    /// Its `delivery` (`queue` when not given) and broca's reply (shown in violations).
    #[allow(dead_code)]
    delivery: &'static str,
    #[allow(dead_code)]
    reply: Value,
}

/// How the second send of a group is delivered against the first one's running run.
fn delivery(rng: &mut Rng) -> &'static str {
    match rng.range(0, 3) {
        0 | 1 => "queue",
        2 => "steer",
        _ => "interrupt",
    }
}

/// What the drivers saw that breaks an invariant, or a wait that never ended.
type Violations = Mutex<Vec<String>>;

fn plan() -> Value {
    json!({"tool_items": [{"provider": TOOLS, "params": {}}]})
}

/// Calls until broca answers (across restarts); `Err` with the reason otherwise. Not for
/// sends: [`Session::try_send_surviving_kills`].
fn call_through(s: &Session, method: &str, params: &Value, until: Instant) -> Result<Value, String> {
    loop {
        let last = match s.try_call(method, params.clone()) {
            Ok(v) => return Ok(v),
            Err(subc_client_rs::CallError::Module(body)) if !support::restart_refusal(&body) => {
                return Err(format!("{method} refused {}: {}", body.code, body.message));
            }
            Err(e) => format!("{e:?}"),
        };
        if Instant::now() >= until {
            return Err(format!("{method} never answered within {SETTLE:?} (last: {last})"));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

const NOT_TERMINAL: &[&str] = &["active", "paused", "pending", "unknown", "idle"];

/// Polls `run.status` until the run is terminal; its state.
fn wait_terminal(s: &Session, run_id: &str) -> Result<String, String> {
    let until = Instant::now() + SETTLE;
    loop {
        let status = call_through(s, "run.status", &json!({"run_id": run_id}), until)?;
        let state = status["state"].as_str().unwrap_or_default().to_string();
        if !NOT_TERMINAL.contains(&state.as_str()) {
            return Ok(state);
        }
        if Instant::now() >= until {
            return Err(format!("run {run_id} of {} never reached a terminal: {status}", s.id));
        }
        std::thread::sleep(Duration::from_millis(40));
    }
}

/// What the drivers share: the sends broca accepted, the sends that needed a retry (same
/// `send_id`, same bytes) and the violations seen.
struct Shared<'a> {
    stop: &'a AtomicBool,
    accepted: &'a Mutex<Vec<Accepted>>,
    resent: &'a AtomicU64,
    bad: &'a Violations,
    /// Each finished session's transcript as read when its driver moved on: later kills must
    /// leave these prior episodes exactly as they were.
    snapshots: &'a Mutex<BTreeMap<String, Vec<Value>>>,
}

fn driver(h: &Harness, d: usize, seed: u64, sh: &Shared<'_>) {
    let Shared { stop, accepted, resent, bad, snapshots } = *sh;
    let mut rng = Rng::new(seed ^ (d as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut sends = 0u64;
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let s = h.session(HARNESS, &format!("d{d}-s{n}"), None);
        let mut first = true;
        for _ in 0..rng.range(1, 4) {
            let group = if rng.chance(30) { 2 } else { 1 };
            let mut runs = Vec::new();
            for _ in 0..group {
                sends += 1;
                let prompt = format!("prompt d{d}-{sends}");
                let mut params = support::send_params(&prompt);
                params["send_id"] = json!(format!("send-d{d}-{sends}"));
                params["stop_when"] = json!({"max_steps": 8});
                if first {
                    params["plan"] = plan();
                }
                let mode = if runs.is_empty() { "queue" } else { delivery(&mut rng) };
                if mode != "queue" {
                    params["delivery"] = json!(mode);
                }
                // Same send_id until its fate is known (send.status after a kill took the answer).
                match s.try_send_surviving_kills(&params, SETTLE) {
                    Ok((reply, attempts)) => {
                        if attempts > 1 {
                            resent.fetch_add(1, Ordering::Relaxed);
                        }
                        first = false;
                        let run_id = match (reply["run_id"].as_str(), reply["submission_id"].as_str()) {
                            (Some(run), _) => run.to_string(),
                            (None, Some(sub)) => format!("run-{sub}"),
                            _ => {
                                bad.lock()
                                    .unwrap()
                                    .push(format!("a send answered neither run nor submission: {reply}"));
                                continue;
                            }
                        };
                        let pending = (reply["state"] == "pending").then(|| reply["submission_id"].as_str()).flatten();
                        let pending = pending.map(String::from);
                        let a = Accepted {
                            session: s.id.clone(),
                            prompt,
                            run_id,
                            pending,
                            retracted: false,
                            cancelled: false,
                            delivery: mode,
                            reply: reply.clone(),
                        };
                        runs.push(a);
                    }
                    Err(why) => bad.lock().unwrap().push(format!("{}: {prompt}: {why}", s.id)),
                }
            }
            // Now and then the owner takes a queued send back, or cancels the running run.
            if let Some(last) = runs.last_mut().filter(|a| a.pending.is_some() && rng.chance(25)) {
                let params = json!({"submission_id": last.pending.clone()});
                match call_through(&s, "session.retract", &params, Instant::now() + SETTLE) {
                    // A retract retried across a kill may find its own tombstone: `not_pending`
                    // for a send that was queued here means it is retracted.
                    Ok(reply) => last.retracted = reply["retracted"] == true || reply["reason"] == "not_pending",
                    Err(why) => bad.lock().unwrap().push(format!("{}: retract: {why}", s.id)),
                }
            }
            if let Some(running) = runs.first_mut().filter(|_| rng.chance(10)) {
                let at = if rng.chance(50) { "now" } else { "step_boundary" };
                let params = json!({"run_id": running.run_id, "at": at});
                running.cancelled = true;
                if let Err(why) = call_through(&s, "run.cancel", &params, Instant::now() + SETTLE) {
                    bad.lock().unwrap().push(format!("{}: run.cancel: {why}", s.id));
                }
            }
            accepted.lock().unwrap().extend(runs.iter().cloned());
            for a in runs.iter().filter(|a| !a.retracted) {
                if let Err(why) = wait_terminal(&s, &a.run_id) {
                    bad.lock().unwrap().push(why);
                }
            }
            if stop.load(Ordering::SeqCst) {
                return;
            }
        }
        snapshots.lock().unwrap().insert(s.id.clone(), transcript(&s));
    }
}

// ---------------------------------------------------------------------------------------------
// The kill loop
// ---------------------------------------------------------------------------------------------

/// The launcher the daemon starts in broca's place (see the module docs).
fn write_launcher(dir: &Path, broca: &Path) -> PathBuf {
    let script = format!(
        "#!/bin/sh\n\
         # crash_tools: this incarnation's fail points (taken once), then broca itself, same pid.\n\
         spec=''\n\
         if [ -f '{d}/next-failpoints' ]; then spec=$(cat '{d}/next-failpoints'); rm -f '{d}/next-failpoints'; fi\n\
         echo \"$$ ${{spec:-none}}\" >> '{d}/spawns.log'\n\
         if [ -n \"$spec\" ]; then BROCA_FAILPOINTS=\"$spec\"; export BROCA_FAILPOINTS; fi\n\
         exec '{b}' \"$@\"\n",
        d = dir.display(),
        b = broca.display()
    );
    let path = dir.join("launch-broca.sh");
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    path
}

/// The next incarnation's spec (atomically replaced; the launcher takes it).
fn arm_next(dir: &Path, spec: Option<&str>) {
    let path = dir.join("next-failpoints");
    match spec {
        Some(spec) => {
            let tmp = dir.join("next-failpoints.tmp");
            fs::write(&tmp, spec).unwrap();
            fs::rename(&tmp, &path).unwrap();
        }
        None => {
            let _ = fs::remove_file(&path);
        }
    }
}

/// The spec each incarnation started with, by pid.
fn spawns(dir: &Path) -> BTreeMap<i32, String> {
    let text = fs::read_to_string(dir.join("spawns.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pid, spec) = l.split_once(' ')?;
            Some((pid.parse().ok()?, spec.to_string()))
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists
        && fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            // A zombie (killed, not yet reaped by the daemon) is dead.
            s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|st| st != "Z")
        })
}

fn wait_dead(pid: i32, within: Duration) -> bool {
    let until = Instant::now() + within;
    while alive(pid) {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// broca's SIGKILLed exits the daemon journaled.
fn journaled_kills(h: &Harness) -> usize {
    h.journal()
        .iter()
        .filter(|e| e["module_id"] == support::MODULE_ID && e["exit_signal"] == json!(libc::SIGKILL))
        .count()
}

/// A broca pid, waiting for one (the daemon respawns after each kill).
fn current_pid(h: &Harness) -> i32 {
    let until = Instant::now() + support::STEP;
    loop {
        if let Some(pid) = h.broca_pid().filter(|p| alive(*p)) {
            return pid;
        }
        assert!(Instant::now() < until, "broca was not respawned within {:?}", support::STEP);
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[derive(Default, Debug)]
struct KillStats {
    /// Incarnations killed by the campaign at a random moment (at boot or after registering).
    random: u64,
    at_boot: u64,
    /// Incarnations armed, by point.
    armed: BTreeMap<String, u64>,
    /// Armed incarnations whose point was not reached in time (killed anyway), by point.
    missed: BTreeMap<String, u64>,
}

fn kill_loop(h: &Harness, dir: &Path, kills: usize, deadline: Instant, rng: &mut Rng) -> KillStats {
    let mut stats = KillStats::default();
    let mut rotation = ROTATION.iter().cycle();
    while journaled_kills(h) < kills && Instant::now() < deadline {
        let pid = current_pid(h);
        let armed = spawns(dir).get(&pid).cloned().unwrap_or_else(|| "none".into());
        let point = armed.split('@').next().unwrap_or_default().to_string();
        if armed != "none" {
            *stats.armed.entry(point.clone()).or_default() += 1;
        }
        // The next incarnation's spec: a named point in 65% of the rounds.
        let next = rng.chance(65).then(|| {
            let (name, max_n) = POINTS[*rotation.next().unwrap()];
            format!("{name}@{}", rng.range(1, max_n))
        });
        arm_next(dir, next.as_deref());
        let killed_here = if armed != "none" {
            !wait_dead(pid, POINT_WAIT)
        } else if rng.chance(15) {
            stats.at_boot += 1;
            true
        } else {
            // A random moment of a registered incarnation.
            let until = Instant::now() + support::STEP;
            while alive(pid)
                && h.block_on(h.client().consumer().catalog_list())
                    .is_ok_and(|l| !l.modules.iter().any(|m| m.module_id == support::MODULE_ID && m.ready))
            {
                assert!(Instant::now() < until, "broca {pid} never registered");
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(rng.range(0, 700)));
            true
        };
        if killed_here && alive(pid) && h.broca_pid() == Some(pid) {
            // SAFETY: the broca process the daemon started for this harness (checked above).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            if armed != "none" {
                *stats.missed.entry(point).or_default() += 1;
            } else {
                stats.random += 1;
            }
        }
        assert!(wait_dead(pid, support::STEP), "broca {pid} survived its SIGKILL");
        // The daemon journals the exit once it reaped the child.
        let until = Instant::now() + support::STEP;
        while h.broca_pid() == Some(pid) {
            assert!(Instant::now() < until, "the daemon never reaped broca {pid}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stats
}

/// `failpoint <name> fired` lines in broca's captured stderr, by name.
fn fired(h: &Harness) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let dir = h.rig_root().join("run/logs");
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("broca.stderr") {
            continue;
        }
        let text = fs::read(entry.path()).unwrap_or_default();
        for line in String::from_utf8_lossy(&text).lines() {
            if let Some(rest) = line.split("broca: failpoint ").nth(1) {
                if let Some((point, _)) = rest.split_once(" fired") {
                    *out.entry(point.to_string()).or_default() += 1;
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The invariants
// ---------------------------------------------------------------------------------------------

/// A call in its WAL: `(run_id, tool_call_id)`.
type CallId = (String, String);
/// A recorded `ToolResult`: its outcome and output.
type Recorded = (Option<CallOutcome>, Value);

/// What one session's WAL says.
#[derive(Default, Debug)]
struct WalFacts {
    /// Each intent's tool and arguments.
    intents: BTreeMap<CallId, (String, Value)>,
    /// Every result recorded for each call.
    results: BTreeMap<CallId, Vec<Recorded>>,
    started: Vec<String>,
    finished: BTreeMap<String, FinishReason>,
    /// `RunFinished.indeterminate_tool_calls`, by run.
    listed: BTreeMap<String, Vec<String>>,
}

fn read_wals(state: &Path) -> BTreeMap<PathBuf, WalFacts> {
    let mut out = BTreeMap::new();
    for tree in ["wal", "wal-durable", "wal-ephemeral", "wal-archive"] {
        for entry in fs::read_dir(state.join(tree)).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "wal") {
                continue;
            }
            let mut facts = WalFacts::default();
            broca::wal::read(&path, broca::record::KNOWN_FEATURES, None, &mut |f: broca::wal::ScannedFrame<'_>| {
                match Record::decode(f.payload).unwrap() {
                    Record::RunStarted(r) => facts.started.push(r.run_id),
                    Record::ToolDispatchIntent { run_id, tool_call_id, tool_name, arguments, .. } => {
                        let args = arguments.and_then(|a| serde_json::from_str(&a).ok()).unwrap_or(Value::Null);
                        facts.intents.insert((run_id, tool_call_id), (tool_name, args));
                    }
                    Record::ToolResult { run_id, tool_call_id, outcome, output, .. } => {
                        facts.results.entry((run_id, tool_call_id)).or_default().push((outcome, output));
                    }
                    Record::RunFinished { run_id, reason, indeterminate_tool_calls, .. } => {
                        facts.listed.insert(run_id.clone(), indeterminate_tool_calls);
                        facts.finished.insert(run_id, reason);
                    }
                    _ => {}
                }
                Ok::<(), broca::lineage::LineageError>(())
            })
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.insert(path, facts);
        }
    }
    out
}

/// Every message of a session, through `session.read` (paged).
fn transcript(s: &Session) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 0u64;
    loop {
        let until = Instant::now() + SETTLE;
        let page = call_through(s, "session.read", &json!({"from_ordinal": from, "limit": 500}), until)
            .unwrap_or_else(|e| panic!("session.read of {}: {e}", s.id));
        out.extend(page["messages"].as_array().cloned().unwrap_or_default());
        match page["next_from_ordinal"].as_u64() {
            Some(next) if next > from => from = next,
            _ => return out,
        }
    }
}

#[derive(Default, Debug)]
struct Totals {
    sends: usize,
    runs: usize,
    intents: usize,
    calls: u64,
    indeterminate: usize,
    sealed: usize,
    not_sent: usize,
    interrupted_runs: usize,
    retracted: usize,
    cancelled_runs: usize,
    /// Finished sessions compared with their snapshot, and cursors replayed.
    snapshots: usize,
    cursors: usize,
}

/// A control cursor `(wal_seq, sub_index)`; tuples order as the spec does.
type Cursor = (u64, u64);

fn cursor_of(v: &Value) -> Option<Cursor> {
    Some((v["wal_seq"].as_u64()?, v["sub_index"].as_u64()?))
}

/// The control cursors a subscription from `from` delivers up to `head` (the stream is left).
fn cursors_until(s: &Session, from: Value, head: Cursor) -> Result<Vec<Cursor>, String> {
    let mut sub = s.subscribe(from);
    let mut out = Vec::new();
    let mut frames = 0u64;
    while out.last() != Some(&head) {
        let Ok(Some(event)) = sub.next_within(support::STEP) else {
            return Err(format!("the stream stopped before the head {head:?} (after {:?})", out.last()));
        };
        frames += 1;
        if event["seq"].as_u64() != Some(frames) {
            return Err(format!("frame {frames} has seq {}", event["seq"]));
        }
        if let Some(c) = cursor_of(&event["cursor"]) {
            out.push(c);
        }
    }
    sub.unsubscribe();
    Ok(out)
}

/// Cursors are continuous: a subscription from the start delivers strictly rising cursors up
/// to the durable head `session.read` names, and one resumed from a middle cursor delivers
/// exactly the rest. Returns how many cursors were checked.
fn check_cursors(s: &Session, bad: &mut Vec<String>) -> usize {
    let page = call_through(s, "session.read", &json!({}), Instant::now() + SETTLE).unwrap_or_default();
    let Some(head) = cursor_of(&page["head"]) else { return 0 };
    let all = match cursors_until(s, json!("start"), head) {
        Ok(all) => all,
        Err(why) => {
            bad.push(format!("{}: from start: {why}", s.id));
            return 0;
        }
    };
    if let Some(w) = all.windows(2).find(|w| w[0] >= w[1]) {
        bad.push(format!("{}: cursors not rising: {:?} then {:?}", s.id, w[0], w[1]));
    }
    if all.len() < 2 {
        return all.len();
    }
    let at = (all.len() - 1) / 2;
    let mid = all[at];
    match cursors_until(s, json!({"wal_seq": mid.0, "sub_index": mid.1}), head) {
        Ok(rest) if rest[..] == all[at + 1..] => {}
        Ok(rest) => {
            bad.push(format!("{}: resumed at {mid:?}: {} cursors, expected {}", s.id, rest.len(), all.len() - at - 1))
        }
        Err(why) => bad.push(format!("{}: resumed at {mid:?}: {why}", s.id)),
    }
    all.len()
}

/// What [`check`] read of each session (its key and served transcript), for the rebuild check.
type Served = BTreeMap<String, (broca::session_key::SessionKey, Vec<Value>)>;

/// Sessions whose cursors [`check`] replays (each costs two subscriptions).
const CURSOR_SESSIONS: usize = 12;

fn check(
    h: &Harness,
    log: &Path,
    scripted: &Scripted,
    accepted: &[Accepted],
    snapshots: &BTreeMap<String, Vec<Value>>,
    bad: &mut Vec<String>,
) -> (Totals, Served) {
    let mut t = Totals { sends: accepted.len(), ..Totals::default() };
    let mut served = Served::new();
    let counts = call_log::read(log).unwrap_or_else(|e| panic!("the provider's call log: {e}"));
    t.calls = counts.calls;
    // 1. No call ran twice.
    for (key, k) in counts.duplicates() {
        bad.push(format!("call {key} ({}) ran {} times at the provider", k.tool, k.calls));
    }
    let wals = read_wals(&h.state_root());
    // 2. Every intent is unique and every call that ran had a durable intent.
    let mut intent_keys: BTreeMap<String, (String, String)> = BTreeMap::new();
    for facts in wals.values() {
        for ((run, id), (tool, args)) in &facts.intents {
            let key = call_log::call_key_of(None, tool, args);
            if let Some(other) = intent_keys.insert(key.clone(), (run.clone(), id.clone())) {
                bad.push(format!("two intents for {key}: {other:?} and ({run}, {id})"));
            }
        }
    }
    let scripted_keys = scripted.keys.lock().unwrap();
    for (key, k) in &counts.keys {
        if k.calls > 0 && !intent_keys.contains_key(key) {
            bad.push(format!("call {key} ran at the provider without a durable intent"));
        }
        if k.calls > 0 && !scripted_keys.contains(key) {
            bad.push(format!("call {key} ran but the model never asked for it"));
        }
    }
    // 3. Results, runs and transcripts, per session.
    let by_session: BTreeMap<&str, Vec<&Accepted>> = accepted.iter().fold(BTreeMap::new(), |mut m, a| {
        m.entry(a.session.as_str()).or_default().push(a);
        m
    });
    let mut seen_wals = 0;
    for (session, sends) in &by_session {
        let s = h.session(HARNESS, session, None);
        let Some(facts) = wals.get(&s.wal_path()) else {
            bad.push(format!("session {session} has accepted sends but no WAL"));
            continue;
        };
        seen_wals += 1;
        t.runs += facts.started.len();
        let messages = transcript(&s);
        // Prior episodes intact: a session its driver had finished reads as it did then.
        if let Some(before) = snapshots.get(*session) {
            t.snapshots += 1;
            if *before != messages {
                let at =
                    before.iter().zip(&messages).position(|(a, b)| a != b).unwrap_or(before.len().min(messages.len()));
                let cut = |v: Option<&Value>| v.map_or("-".to_string(), |v| v.to_string().chars().take(700).collect());
                bad.push(format!(
                    "{session}: its transcript changed after its driver finished it ({} then {} messages; first \
                     difference at {at}: {} became {})",
                    before.len(),
                    messages.len(),
                    cut(before.get(at)),
                    cut(messages.get(at))
                ));
            }
        }
        if served.len() < CURSOR_SESSIONS {
            t.cursors += check_cursors(&s, bad);
        }
        served.insert(session.to_string(), (s.key(), messages.clone()));
        // Every accepted send exactly once.
        let users: Vec<String> = messages
            .iter()
            .filter(|m| m["message"]["role"] == "user")
            .map(|m| {
                m["message"]["content"].as_array().into_iter().flatten().filter_map(|p| p["text"].as_str()).collect()
            })
            .collect();
        for a in sends {
            let n = users.iter().filter(|u| **u == a.prompt).count();
            let expected = usize::from(!a.retracted);
            if n != expected {
                bad.push(format!("{session}: accepted send {:?} ({a:?}) is in the transcript {n} times", a.prompt));
            }
            t.retracted += usize::from(a.retracted);
        }
        // Every tool call in the transcript has exactly one result, and unknown outcomes read so.
        let mut results_text: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut calls_seen = BTreeSet::new();
        // `session.read`'s `tool_calls[].indeterminate` (spec §4), where this build serves it.
        let mut flagged: BTreeMap<String, bool> = BTreeMap::new();
        for m in &messages {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                if let (Some(id), Some(ind)) = (c["tool_call_id"].as_str(), c["indeterminate"].as_bool()) {
                    flagged.insert(id.to_string(), ind);
                }
            }
            for p in m["message"]["content"].as_array().into_iter().flatten() {
                match p["type"].as_str() {
                    Some("tool_call") => {
                        calls_seen.insert(p["tool_call_id"].as_str().unwrap_or_default().to_string());
                    }
                    Some("tool_result") => results_text
                        .entry(p["tool_call_id"].as_str().unwrap_or_default().to_string())
                        .or_default()
                        .push(p["output"].clone()),
                    _ => {}
                }
            }
        }
        for id in &calls_seen {
            let n = results_text.get(id).map_or(0, Vec::len);
            if n != 1 {
                bad.push(format!("{session}: tool call {id} has {n} results in the transcript"));
            }
        }
        let mut unknown_runs = BTreeSet::new();
        for ((run, id), (tool, args)) in &facts.intents {
            t.intents += 1;
            let key = call_log::call_key_of(None, tool, args);
            let ran = counts.calls_of(&key);
            let results = facts.results.get(&(run.clone(), id.clone())).map_or(&[][..], Vec::as_slice);
            let [(outcome, output)] = results else {
                bad.push(format!("{session}: intent {id} of {run} has {} results in its WAL", results.len()));
                continue;
            };
            // Every intent here has its result (an unknown outcome is closed by one), so no read
            // may still call it indeterminate (llm-runner §5, §14).
            if flagged.get(id) == Some(&true) {
                bad.push(format!("{session}: {id} reads indeterminate after its result ({outcome:?})"));
            }
            match outcome {
                Some(CallOutcome::Ok) if ran != 1 => {
                    bad.push(format!("{session}: {id} answered ok but ran {ran} times at the provider ({key})"));
                }
                Some(CallOutcome::Unknown) => {
                    t.indeterminate += 1;
                    unknown_runs.insert(run.clone());
                    let text = output["message"].as_str().unwrap_or_default();
                    if text.contains("broca ended while it was in flight") {
                        // Sealed at reopen: its run's RunFinished names it.
                        t.sealed += 1;
                        if !facts.listed.get(run).is_some_and(|l| l.contains(id)) {
                            bad.push(format!("{session}: sealed call {id} is not in {run}'s indeterminate_tool_calls"));
                        }
                    }
                    let read = results_text.get(id).and_then(|r| r.first()).cloned().unwrap_or(Value::Null);
                    if !read["message"].as_str().is_some_and(|m| m.contains("unknown")) {
                        bad.push(format!("{session}: unknown-outcome call {id} reads {read} in session.read"));
                    }
                }
                _ => {}
            }
            if output["nothing_sent"] == true {
                t.not_sent += 1;
                if ran != 0 {
                    bad.push(format!("{session}: {id} says nothing was sent but ran {ran} times ({key})"));
                }
            }
        }
        // Every run terminal, the WAL and run.status agreeing; unknown outcomes end interrupted.
        for run in &facts.started {
            let wal = facts.finished.get(run).map(|r| r.as_str());
            let status = match wait_terminal(&s, run) {
                Ok(state) => state,
                Err(why) => {
                    bad.push(why);
                    continue;
                }
            };
            if wal != Some(status.as_str()) {
                bad.push(format!("{session}: run {run} is {status} by run.status, {wal:?} in its WAL"));
            }
            if status == "interrupted" {
                t.interrupted_runs += 1;
            }
            if status == "cancelled" {
                t.cancelled_runs += 1;
            }
            let cancelled_by_us = sends.iter().any(|a| a.cancelled && a.run_id == *run) && status == "cancelled";
            if unknown_runs.contains(run) && status != "interrupted" && !cancelled_by_us {
                bad.push(format!("{session}: run {run} has an unknown-outcome call but ended {status}"));
            }
        }
    }
    if seen_wals != by_session.len() {
        bad.push(format!("{} sessions with sends, {seen_wals} WALs read", by_session.len()));
    }
    (t, served)
}

/// The store is rebuildable from the WALs: with broca stopped and `run-index.db` deleted, every
/// session reopened from its WAL alone (which rebuilds its rows) reads exactly the transcript
/// broca served. Returns how many sessions were rebuilt.
fn check_rebuild(state: &Path, served: &Served, bad: &mut Vec<String>) -> usize {
    for name in ["run-index.db", "run-index.db-wal", "run-index.db-shm"] {
        let _ = fs::remove_file(state.join(name));
    }
    let root = broca::state_root::StateRoot::at(state).expect("the state root");
    let shared = broca::lineage::Shared::open(root).expect("a fresh run index");
    for (session, (key, messages)) in served {
        match shared.open_lineage(key) {
            Ok(lineage) => drop(lineage),
            Err(e) => {
                bad.push(format!("{session}: does not reopen from its WAL: {e}"));
                continue;
            }
        }
        shared.settle();
        let Some(reader) = broca::lineage::reader::Reader::open(&shared, key) else {
            bad.push(format!("{session}: its WAL is gone"));
            continue;
        };
        let page = match broca::lineage::read::transcript(&reader, 0, u64::MAX) {
            Ok(page) => page,
            Err(e) => {
                bad.push(format!("{session}: rebuilt read failed: {e}"));
                continue;
            }
        };
        let rebuilt: Vec<Value> = page.messages.iter().map(|(_, m)| serde_json::to_value(m).unwrap()).collect();
        let served: Vec<Value> = messages.iter().map(|m| m["message"].clone()).collect();
        if rebuilt != served {
            bad.push(format!(
                "{session}: rebuilt transcript ({} messages) differs from the served one ({})",
                rebuilt.len(),
                served.len()
            ));
        }
    }
    served.len()
}

// ---------------------------------------------------------------------------------------------
// The campaign
// ---------------------------------------------------------------------------------------------

#[test]
fn tool_calls_are_at_most_once_under_real_kills() {
    let kills = env_u64("BROCA_SOAK_KILLS").unwrap_or(60).max(1) as usize;
    let secs = env_u64("BROCA_SOAK_SECS").unwrap_or(kills as u64 * 3 + 60);
    let seed = env_u64("BROCA_CRASH_TOOLS_SEED").unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        nanos as u64 ^ u64::from(std::process::id())
    });
    eprintln!("crash_tools: {kills} kills within {secs} s, BROCA_CRASH_TOOLS_SEED={seed}");
    let dir = tempfile::Builder::new().prefix("bct").tempdir_in("/tmp").unwrap();
    let log = dir.path().join("calls.jsonl");
    let broca = fs::canonicalize(env!("CARGO_BIN_EXE_broca")).unwrap();
    let launcher = write_launcher(dir.path(), &broca);
    let mock = broca_mock::exe();
    let tools = json!({"program": mock, "args": ["--call-log", log, "--call-log-fsync"], "env": {"CK_LOG": "warn"},
                       "enabled": true, "reserved": true});
    let opts = Options {
        modules: vec![(TOOLS.to_string(), tools)],
        env: vec![("BROCA_TEST_TOOL_WAIT_MS".into(), TOOL_WAIT_MS.to_string())],
        // The daemon's default budget is 3 crash restarts per 600 s: far too few here.
        restart: Some(json!({"max_restarts": 100_000, "window_secs": 600, "backoff_ms": 1, "max_backoff_ms": 10})),
        launcher: Some(launcher),
        ck_log: "warn".into(),
        prefix: "bct".into(),
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    support::wait_tool_provider(&h, TOOLS);
    let started = Instant::now();
    let scripted = Scripted::default();
    let accepted = Mutex::new(Vec::new());
    let violations: Violations = Mutex::new(Vec::new());
    let resent = AtomicU64::new(0);
    let snapshots = Mutex::new(BTreeMap::new());
    let (stop, stop_model) = (AtomicBool::new(false), AtomicBool::new(false));
    let mut rng = Rng::new(seed);
    let shared = Shared { stop: &stop, accepted: &accepted, resent: &resent, bad: &violations, snapshots: &snapshots };
    let stats = std::thread::scope(|scope| {
        // The model FIFO, kept topped up (an empty FIFO answers a final text).
        scope.spawn(|| {
            let mut rng = Rng::new(seed ^ 0x5EED);
            while !stop_model.load(Ordering::SeqCst) {
                if h.mock.pending("default") < 24 {
                    let steps: Vec<Value> = (0..16).map(|_| scripted.step(&mut rng)).collect();
                    h.install(json!({"responses": steps}));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let drivers: Vec<_> = (0..DRIVERS)
            .map(|d| {
                let (h, shared) = (&h, &shared);
                scope.spawn(move || driver(h, d, seed, shared))
            })
            .collect();
        let stats = kill_loop(&h, dir.path(), kills, started + Duration::from_secs(secs), &mut rng);
        // No more kills: the next incarnation runs unarmed; if the current one is armed, it may
        // still die at its point (and the unarmed one takes over).
        arm_next(dir.path(), None);
        let pid = current_pid(&h);
        if spawns(dir.path()).get(&pid).is_some_and(|s| s != "none") && !wait_dead(pid, POINT_WAIT) && alive(pid) {
            // SAFETY: the broca process the daemon started for this harness.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        h.wait_registered();
        stop.store(true, Ordering::SeqCst);
        for d in drivers {
            d.join().expect("a driver panicked");
        }
        stop_model.store(true, Ordering::SeqCst);
        stats
    });
    let kill_phase = started.elapsed();
    let mut bad = violations.into_inner().unwrap();
    let accepted = accepted.into_inner().unwrap();
    let snapshots = snapshots.into_inner().unwrap();
    let (totals, served) = check(&h, &log, &scripted, &accepted, &snapshots, &mut bad);
    let journaled = journaled_kills(&h);
    let fired = fired(&h);
    let points: u64 = fired.values().sum();
    let duplicates = call_log::read(&log).map(|c| c.duplicates().len()).unwrap_or(usize::MAX);
    h.stop();
    if !bad.is_empty() {
        // The evidence outlives the rig: every WAL and the provider's call log.
        let evidence = std::env::temp_dir().join(format!("crash-tools-evidence-{seed}"));
        let _ = Command::new("cp").arg("-r").arg(h.state_root()).arg(&evidence).status();
        let _ = fs::copy(&log, evidence.join("calls.jsonl"));
        eprintln!("crash_tools: evidence kept in {}", evidence.display());
    }
    let rebuilt = check_rebuild(&h.state_root(), &served, &mut bad);
    let per_point: Vec<String> = POINTS
        .iter()
        .map(|(p, _)| {
            let n = |m: &BTreeMap<String, u64>| m.get(*p).copied().unwrap_or(0);
            format!("{p}={}/{}/{}", n(&fired), n(&stats.armed), n(&stats.missed))
        })
        .collect();
    eprintln!(
        "crash_tools: kill phase {:.1} s; random kills {} ({} at boot); per point fired/armed/missed: {}",
        kill_phase.as_secs_f64(),
        stats.random,
        stats.at_boot,
        per_point.join(" ")
    );
    let missed: u64 = stats.missed.values().sum();
    println!(
        "CRASH-TOOLS kills={journaled} random={} points={points} sends={} resent={} runs={} interrupted_runs={} \
         intents={} calls={} duplicates={duplicates} indeterminate={} sealed={} not_sent={} violations={} seconds={:.1}",
        stats.random + missed,
        totals.sends,
        resent.load(Ordering::Relaxed),
        totals.runs,
        totals.interrupted_runs,
        totals.intents,
        totals.calls,
        totals.indeterminate,
        totals.sealed,
        totals.not_sent,
        bad.len(),
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "crash_tools: retracted {} cancelled runs {} snapshots compared {} cursors replayed {} sessions rebuilt {rebuilt}",
        totals.retracted, totals.cancelled_runs, totals.snapshots, totals.cursors
    );
    println!("SOAK kills={journaled} violations={} sends={} calls={}", bad.len(), totals.sends, totals.calls);
    for v in bad.iter().take(30) {
        eprintln!("VIOLATION {v}");
    }
    assert!(bad.is_empty(), "{} invariant violations (seed {seed}); the first: {}", bad.len(), bad[0]);
    assert!(journaled >= kills, "only {journaled} of {kills} kills within {secs} s (seed {seed})");
    assert!(totals.calls > 0 && totals.intents > 0, "the campaign made no tool calls");
    for point in TOOL_POINTS {
        assert!(fired.contains_key(point), "broca was never killed at {point} (seed {seed})");
    }
    if kills >= ALL_POINTS_FROM {
        for (point, _) in POINTS {
            assert!(fired.contains_key(*point), "broca was never killed at {point} (seed {seed})");
        }
    }
}
