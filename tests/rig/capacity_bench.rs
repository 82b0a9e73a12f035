//! `capacity-bench` (`make bench-capacity`): how many sessions broca serves at once on this
//! machine, through the real subc daemon. Prints only `BENCH <name> <value> <unit>` lines on
//! stdout (progress on stderr); targets are in the README, nothing here asserts them.
//!
//! The rig is the tests' harness (`tests/support`) supervising the release broca
//! (`BROCA_BENCH_BROCA`, or `../broca` beside this example's directory) with `broca.jsonc`
//! `limits.open_sessions` raised for the boot phase; one consumer connection drives everything.
//!
//! 1. **Idle lineages**: [`SESSIONS`] sessions each get one quick run (their actors stay open
//!    for the idle TTL). `capacity.rss_kib_per_idle_lineage` is broca's RSS growth over its
//!    post-boot RSS, per session.
//! 2. **Active runs**: each of those sessions gets one observer (`session.subscribe` from its
//!    start, proven attached by its replay) and then a send whose model stream is paced
//!    ([`DELTAS`] stamped deltas, [`GAP_MS`] ms apart), so every run stays active while the others
//!    are admitted (`capacity.ramp_admit_p{50,99}_ms`: client-side, [`CONCURRENCY`] in flight,
//!    so mostly the queue that many senders make). Then, with all of them streaming,
//!    [`PROBES`] sends to fresh sessions, [`PROBE_LANES`] in flight: `capacity.admit_p{50,99}_ms`
//!    is their client-side time (route bind included), `capacity.active_during_probes` the
//!    fewest runs in flight around them; the `*_in_broca_*` figures are the same sends as broca's
//!    `broca.timing` log timed them (op start to answer: precheck, actor, the `RunStarted` fsync);
//!    `capacity.active_sessions` the `runs_in_flight` gauge once all are admitted;
//!    `capacity.threads` broca's threads then; `capacity.rss_kib_per_active_run` its RSS growth
//!    over phase 1, per run; `capacity.delta_p99_ms` receive minus stamp of every delta at the
//!    observers; `capacity.refusals` / `capacity.errors` every refused call and every other
//!    failure (stream errors included).
//! 3. **Boot** over a state root of ten thousand sessions, a hundred of them with work waiting
//!    (`capacity_boot.rs`).
//!
//! `BROCA_CAPACITY_ONLY=boot` runs phase 3 alone.

#[path = "capacity_boot.rs"]
mod capacity_boot;
use broca_mock::mock;
#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use subc_client_rs::{CallError, SubcConsumer, SubscribeOptions};
use subc_protocol::BindIdentity;
use support::{call_options, send_params, target, Harness, Options, MODULE_ID};

const HARNESS: &str = "capacity-bench";
/// Sessions served at once in phases 1 and 2.
const SESSIONS: usize = 1000;
/// Stamped deltas per active run and their spacing: each run streams for about 20 s.
const DELTAS: usize = 40;
const GAP_MS: u64 = 500;
/// Calls in flight at once while sessions are set up or admitted.
const CONCURRENCY: usize = 32;
/// Sends that probe admission once all [`SESSIONS`] runs are active, and how many of them are
/// in flight at once (a handful of clients, not the ramp's queue of 32).
const PROBES: usize = 200;
const PROBE_LANES: usize = 4;
/// Sessions per consumer connection: below the SDK's per-connection route cache (256), so no
/// route is retired and reopened mid-bench (a real consumer holds its sessions' routes).
const SESSIONS_PER_CONNECTION: usize = 200;
use capacity_boot::BOOT_SESSIONS;

type Failure = String;

/// Refused calls and other failures, over every phase.
#[derive(Default)]
struct Tally {
    refusals: AtomicU64,
    errors: AtomicU64,
}

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        eprintln!("usage: capacity-bench   (environment: BROCA_BENCH_BROCA = the broca binary; BROCA_BENCH_DIR)");
        return ExitCode::SUCCESS;
    }
    let broca = match support::bench_broca_binary() {
        Ok(path) => path,
        Err(why) => {
            eprintln!("capacity-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let base_dir = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let work = match tempfile::Builder::new().prefix("bcap-launch").tempdir_in(&base_dir) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("capacity-bench: a work directory: {e}");
            return ExitCode::from(1);
        }
    };
    let hold = work.path().join("hold");
    let launcher = match capacity_boot::write_launcher(work.path(), &broca, &hold) {
        Ok(path) => path,
        Err(why) => {
            eprintln!("capacity-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let opts = Options {
        broca,
        launcher: Some(launcher),
        base_dir,
        ck_log: "warn,broca.timing=debug".into(),
        test_writer: false,
        prefix: "bcap".into(),
        broca_jsonc: Some(
            json!({"limits": {"open_sessions": 2 * BOOT_SESSIONS, "subscribers_per_process": 2 * SESSIONS}}),
        ),
        restart: Some(json!({"max_restarts": 10, "window_secs": 600, "backoff_ms": 1, "max_backoff_ms": 10})),
        ..Default::default()
    };
    let h = Harness::start_with(opts);
    eprintln!("capacity-bench: rig {}", h.rig_root().display());
    let outcome = bench(&h, &hold);
    if let Err(why) = &outcome {
        eprintln!("capacity-bench: {why}");
        eprintln!("capacity-bench: broca's log (tail):\n{}", h.broca_log_tail(30));
    }
    h.stop();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// `VmRSS` (KiB) and `Threads` of a process.
fn proc_status(pid: i32) -> Result<(u64, u64), Failure> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("broca's status: {e}"))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| format!("no {name} in broca's status"))
    };
    Ok((field("VmRSS:")?, field("Threads:")?))
}

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

fn quick() -> Value {
    json!({"events": [{"text": "ok"}, {"usage": {"input": 5, "output": 1}}, {"finish": "stop"}]})
}

fn paced() -> Value {
    let mut events = Vec::with_capacity(2 * DELTAS + 2);
    for i in 0..DELTAS {
        if i > 0 {
            events.push(json!({"delay_ms": GAP_MS}));
        }
        events.push(json!({"text": "t={{now_us}};"}));
    }
    events.push(json!({"usage": {"input": 10, "output": DELTAS}}));
    events.push(json!({"finish": "stop"}));
    json!({"events": events})
}

fn held() -> Value {
    json!({"events": [{"text": "holding"}, {"delay_ms": 600_000}, {"finish": "stop"}]})
}

async fn call(c: &SubcConsumer, t: &Tally, session: &str, method: &str, params: Value) -> Result<Value, Failure> {
    let body = json!({"method": method, "params": params}).to_string().into_bytes();
    match c.call(target(), BindIdentity::new(HARNESS, session), body, call_options()).await {
        Ok(reply) => serde_json::from_slice::<Value>(&reply)
            .map(|v| v["result"].clone())
            .map_err(|e| format!("{method}: the reply is not JSON: {e}")),
        Err(CallError::Module(body)) => {
            t.refusals.fetch_add(1, Ordering::Relaxed);
            Err(format!("{method} on {session} was refused: {body:?}"))
        }
        Err(e) => {
            t.errors.fetch_add(1, Ordering::Relaxed);
            Err(format!("{method} on {session} failed: {e:?}"))
        }
    }
}

fn run_of(reply: &Value) -> Result<String, Failure> {
    reply["run_id"]
        .as_str()
        .map(String::from)
        .or_else(|| reply["submission_id"].as_str().map(|s| format!("run-{s}")))
        .ok_or_else(|| format!("session.send answered {reply}"))
}

/// Polls `run.status` until the run is terminal; its state.
async fn terminal(c: &SubcConsumer, t: &Tally, session: &str, run: &str, within: Duration) -> Result<String, Failure> {
    let until = Instant::now() + within;
    loop {
        let status = call(c, t, session, "run.status", json!({"run_id": run})).await?;
        let state = status["state"].as_str().unwrap_or_default().to_string();
        if !["active", "pending", "unknown", "paused"].contains(&state.as_str()) {
            return Ok(state);
        }
        if Instant::now() >= until {
            return Err(format!("run {run} of {session} still {state} after {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `job(i)` for `0..n` on [`CONCURRENCY`] threads (each blocks on the harness runtime for
/// its calls, one at a time); the results in index order, or the first failure.
fn each<T: Send>(n: usize, job: impl Fn(usize) -> Result<T, Failure> + Sync) -> Result<Vec<T>, Failure> {
    each_on(CONCURRENCY, n, job)
}

/// [`each`] on `lanes` threads.
fn each_on<T: Send>(
    lanes: usize,
    n: usize,
    job: impl Fn(usize) -> Result<T, Failure> + Sync,
) -> Result<Vec<T>, Failure> {
    let lanes: Vec<Vec<(usize, Result<T, Failure>)>> = std::thread::scope(|scope| {
        let job = &job;
        let handles: Vec<_> = (0..lanes)
            .map(|lane| scope.spawn(move || (lane..n).step_by(lanes).map(|i| (i, job(i))).collect()))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a bench lane panicked")).collect()
    });
    let mut all: Vec<(usize, Result<T, Failure>)> = lanes.into_iter().flatten().collect();
    all.sort_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, r)| r).collect()
}

fn session_name(phase: &str, i: usize) -> String {
    format!("{phase}-{}-{i}", std::process::id())
}

fn bench(h: &Harness, hold: &std::path::Path) -> Result<(), Failure> {
    let connections: Vec<support::Client> =
        (0..(SESSIONS + capacity_boot::WORK_SESSIONS).div_ceil(SESSIONS_PER_CONNECTION)).map(|_| h.connect()).collect();
    let conn = |i: usize| connections[i / SESSIONS_PER_CONNECTION].consumer();
    let t = Arc::new(Tally::default());
    if std::env::var("BROCA_CAPACITY_ONLY").is_ok_and(|v| v == "boot") {
        return boot(h, &conn, &t, 0, hold);
    }
    let c = h.client().consumer();
    let pid = h.broca_pid().ok_or("no broca process")?;
    let (rss_boot, _) = proc_status(pid)?;

    // 1. Idle lineages.
    h.install(json!({"responses": vec![quick(); SESSIONS]}));
    each(SESSIONS, |i| {
        let name = session_name("cap", i);
        let run = run_of(&h.block_on(call(conn(i), &t, &name, "session.send", send_params("hello")))?)?;
        h.block_on(terminal(conn(i), &t, &name, &run, Duration::from_secs(60))).map(drop)
    })?;
    let (rss_idle, threads_idle) = proc_status(pid)?;
    eprintln!("capacity-bench: {SESSIONS} idle lineages: RSS {rss_boot} -> {rss_idle} KiB, {threads_idle} threads");
    report("capacity.rss_kib_per_idle_lineage", (rss_idle.saturating_sub(rss_boot)) as f64 / SESSIONS as f64, "KiB");

    // 2. Active runs, one observer each.
    let stamps: Arc<parking_lot::Mutex<Vec<f64>>> = Arc::default();
    let opts = SubscribeOptions { event_buffer: 4 * DELTAS + 64, ..SubscribeOptions::default() };
    let mut observers = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let name = session_name("cap", i);
        let body = json!({"method": "session.subscribe", "params": {"from": "start"}}).to_string().into_bytes();
        let sub = h
            .block_on(conn(i).subscribe(target(), BindIdentity::new(HARNESS, &name), body, opts.clone()))
            .map_err(|e| format!("subscribe {name}: {e:?}"))?;
        observers.push(sub);
    }
    // Attached: each replay delivers its first (durable) unit.
    for (i, sub) in observers.iter_mut().enumerate() {
        let first = h.block_on(async { tokio::time::timeout(Duration::from_secs(30), sub.events().recv()).await });
        if !matches!(first, Ok(Some(_))) {
            return Err(format!("observer {i} saw no replay"));
        }
    }
    let rt = h.rt().clone();
    let readers: Vec<_> = observers
        .into_iter()
        .map(|mut sub| {
            let (stamps, t) = (Arc::clone(&stamps), Arc::clone(&t));
            rt.spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(120);
                let mut seen = 0usize;
                while seen < DELTAS && Instant::now() < deadline {
                    match tokio::time::timeout(Duration::from_secs(60), sub.events().recv()).await {
                        Ok(Some(bytes)) => {
                            let at = now_us();
                            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else { continue };
                            let text = v["event"]["delta"].as_str().or(v["delta"].as_str()).unwrap_or_default();
                            for stamp in text.split("t=").skip(1).filter_map(|r| r.get(..16)?.parse::<i64>().ok()) {
                                stamps.lock().push((at - stamp) as f64 / 1e3);
                                seen += 1;
                            }
                        }
                        other => {
                            if t.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                                let why = if other.is_err() { "no event within 60 s" } else { "its stream ended" };
                                eprintln!("capacity-bench: an observer failed after {seen} of {DELTAS} deltas: {why}");
                            }
                            break;
                        }
                    }
                }
                let _ = sub.unsubscribe();
            })
        })
        .collect();
    h.install(json!({"responses": vec![paced(); SESSIONS]}));
    let admits: Vec<f64> = each(SESSIONS, |i| {
        let name = session_name("cap", i);
        let start = Instant::now();
        h.block_on(call(conn(i), &t, &name, "session.send", send_params("stream")))?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    })?;
    let in_flight = || -> Result<u64, Failure> {
        let health = h.block_on(c.supervisor_health_probe(MODULE_ID)).map_err(|e| format!("health: {e:?}"))?;
        Ok(health.metrics.as_ref().and_then(|m| m["runs_in_flight"].as_u64()).unwrap_or(0))
    };
    let active = in_flight()?;
    let (rss_active, threads_active) = proc_status(pid)?;
    // Probes: with every run streaming (each for about 20 s), sends to fresh sessions from a
    // handful of clients, on a connection of their own (its routes fit the SDK's cache). Each
    // probe's run answers at once, so the probes add no lasting load.
    // The mock's lane is one FIFO: until every active run has taken its paced response, a
    // probe's request could take one, leaving a late run the probes' quick answer (no stamped
    // deltas, so its observer would wait in vain).
    let waited = Instant::now();
    while h.mock.pending("default") > 0 && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    h.install(json!({"responses": vec![quick(); PROBES]}));
    let probe_conn = h.connect();
    let probes: Vec<f64> = each_on(PROBE_LANES, PROBES, |i| {
        let name = session_name("probe", i);
        let start = Instant::now();
        h.block_on(call(probe_conn.consumer(), &t, &name, "session.send", send_params("probe")))?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    })?;
    let active_after = in_flight()?;
    eprintln!("capacity-bench: {PROBES} probes admitted with {active} -> {active_after} runs in flight");
    eprintln!("capacity-bench: {active} runs in flight: RSS {rss_active} KiB, {threads_active} threads");
    report("capacity.active_sessions", active as f64, "sessions");
    report("capacity.threads", threads_active as f64, "threads");
    report("capacity.rss_kib_per_active_run", rss_active.saturating_sub(rss_idle) as f64 / SESSIONS as f64, "KiB");
    report("capacity.active_during_probes", active.min(active_after) as f64, "runs");
    let mut probes = probes;
    probes.sort_by(f64::total_cmp);
    report("capacity.admit_p50_ms", percentile(&probes, 50.0), "ms");
    report("capacity.admit_p99_ms", percentile(&probes, 99.0), "ms");
    let mut admits = admits;
    admits.sort_by(f64::total_cmp);
    report("capacity.ramp_admit_p50_ms", percentile(&admits, 50.0), "ms");
    report("capacity.ramp_admit_p99_ms", percentile(&admits, 99.0), "ms");
    // The same sends as broca timed them (`broca.timing`): its share of the latency, apart from
    // the daemon, the SDK and the mock provider this process also runs on the same two cores.
    let log = h.broca_log();
    if let Ok(path) = std::env::var("BROCA_CAPACITY_LOG") {
        let _ = std::fs::write(path, &log);
    }
    let timed = answered_in_broca_ms(&log);
    for (name, skip_last, n) in [("admit_in_broca", 0, PROBES), ("ramp_admit_in_broca", PROBES, SESSIONS)] {
        let end = timed.len().saturating_sub(skip_last);
        let mut inside = timed[end.saturating_sub(n)..end].to_vec();
        if inside.len() < n {
            eprintln!("capacity-bench: broca logged {} of {n} send timings for {name}", inside.len());
            continue;
        }
        inside.sort_by(f64::total_cmp);
        report(&format!("capacity.{name}_p50_ms"), percentile(&inside, 50.0), "ms");
        report(&format!("capacity.{name}_p99_ms"), percentile(&inside, 99.0), "ms");
    }
    for r in readers {
        let _ = h.block_on(r);
    }
    let mut deltas = std::mem::take(&mut *stamps.lock());
    deltas.sort_by(f64::total_cmp);
    if deltas.is_empty() {
        return Err("no observer received a stamped delta".into());
    }
    eprintln!("capacity-bench: {} delta samples (of {})", deltas.len(), SESSIONS * DELTAS);
    report("capacity.delta_p99_ms", percentile(&deltas, 99.0), "ms");
    report("capacity.refusals", t.refusals.load(Ordering::Relaxed) as f64, "refusals");
    report("capacity.errors", t.errors.load(Ordering::Relaxed) as f64, "errors");
    boot(h, &conn, &t, SESSIONS, hold)
}

/// Every `send answered in <us> us` line of broca's log, in order, in milliseconds.
fn answered_in_broca_ms(log: &str) -> Vec<f64> {
    log.lines()
        .filter_map(|l| l.split("send answered in ").nth(1)?.split(' ').next()?.parse::<f64>().ok())
        .map(|us| us / 1e3)
        .collect()
}

/// Phase 3 and its tallies.
fn boot<'a>(
    h: &Harness,
    conn: &(dyn Fn(usize) -> &'a SubcConsumer + Sync),
    t: &Tally,
    sessions_before: usize,
    hold: &std::path::Path,
) -> Result<(), Failure> {
    let (refusals, errors) = (t.refusals.load(Ordering::Relaxed), t.errors.load(Ordering::Relaxed));
    capacity_boot::boot(h, conn, t, sessions_before, hold)?;
    report("capacity.boot_refusals", (t.refusals.load(Ordering::Relaxed) - refusals) as f64, "refusals");
    report("capacity.boot_errors", (t.errors.load(Ordering::Relaxed) - errors) as f64, "errors");
    Ok(())
}
