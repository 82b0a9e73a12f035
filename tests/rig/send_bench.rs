//! `send-bench`: `session.send` admission latency through the real subc daemon, behind
//! `make bench`. Prints only `BENCH <name> <value> <unit>` lines on stdout (progress and
//! diagnostics go to stderr); targets are in the README, nothing here asserts them.
//!
//! The rig is the tests' harness (`tests/support`): the daemon booted in this process,
//! supervising the release broca (`BROCA_BENCH_BROCA`, or else `../broca` next to this example's
//! directory), broca-mock in process as its provider, the consumer SDK on its own runtime. The
//! rig directory (and so broca's state root) is created under `BROCA_BENCH_DIR` (default: the
//! system temp dir).
//!
//! - `fs.raw_fsync_us`: p50 of a bare 1 KiB append + fdatasync in the state root (as
//!   `broca-bench` measures it), so `send.admit_p50_us ≤ 3 × raw + 500` reads off one run.
//! - `send.admit_p{50,99}_us`: client-side time of a `session.send` to an idle session (its actor
//!   open, no run) until its `{state: "active"}` reply arrives. The mock answers at once; each
//!   sample waits for the previous run to complete (`run.status`). [`admit_sample_count`] samples over
//!   sessions of [`per_session`] sends; each session's first send (it creates the WAL and opens
//!   the actor) is not counted.
//! - `send.queue_p50_us`: the same for a send to a session whose run is busy (the mock holds its
//!   reply long enough, at least [`busy_min_ms`] ms) until its `{state: "pending"}` reply;
//!   [`queue_sample_count`] samples.
//!
//! At the end the daemon is stopped by SIGTERM to this process; the exit status is 0 when every
//! figure was measured, 1 otherwise (a harness failure panics: 101).

use broca_mock::mock;
#[path = "../bench/quick.rs"]
mod quick;
#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_client_rs::{CallError, SubcConsumer};
use subc_protocol::BindIdentity;
use support::{call_options, send_params, target, Harness, Options, STEP};

const HARNESS: &str = "send-bench";
fn admit_sample_count() -> usize {
    quick::n(200, 10)
}
fn per_session() -> usize {
    quick::n(25, 5)
}
fn queue_sample_count() -> usize {
    quick::n(200, 10)
}
/// How long the mock holds the busy run's reply at least; it is stretched to
/// [`queue_sample_count`] × 4 × the admit p99, so every queue sample lands while the run is busy.
fn busy_min_ms() -> u64 {
    quick::n(2000, 200)
}
fn fsync_samples() -> usize {
    quick::n(1000, 25)
}

type Failure = String;

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        eprintln!("usage: send-bench   (environment: BROCA_BENCH_BROCA = the broca binary; BROCA_BENCH_DIR; RUST_LOG)");
        return ExitCode::SUCCESS;
    }
    let broca = match support::bench_broca_binary() {
        Ok(path) => path,
        Err(why) => {
            eprintln!("send-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let base_dir = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let opts = Options {
        broca,
        base_dir,
        ck_log: "info".into(),
        test_writer: false,
        prefix: "bsb".into(),
        ..Default::default()
    };
    let h = Harness::start_with(opts);
    eprintln!("send-bench: rig {}", h.rig_root().display());
    let outcome = bench(&h);
    if let Err(why) = &outcome {
        eprintln!("send-bench: {why}");
        eprintln!("send-bench: broca's log (tail):\n{}", h.broca_log_tail(30));
    }
    h.stop();
    eprintln!("send-bench: the daemon stopped cleanly");
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

/// Nearest-rank percentile of sorted samples, µs.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1e6
}

fn bench(h: &Harness) -> Result<(), Failure> {
    let raw = broca_testkit::raw_fsync_p50_us(&h.state_root(), fsync_samples());
    report("fs.raw_fsync_us", raw, "us");
    let consumer = h.client().consumer();

    let (mut admit, cold) = h.block_on(admit_samples(consumer))?;
    admit.sort();
    eprintln!(
        "send-bench: admit: {} samples, min {:.0} us, max {:.0} us; first sends of fresh sessions (not counted): {:?}",
        admit.len(),
        percentile(&admit, 0.0),
        percentile(&admit, 100.0),
        cold.iter().map(|d| d.as_micros()).collect::<Vec<_>>()
    );
    let p50 = percentile(&admit, 50.0);
    report("send.admit_p50_us", p50, "us");
    report("send.admit_p99_us", percentile(&admit, 99.0), "us");
    eprintln!("send-bench: admit p50 {p50:.0} us against the target 3 x raw + 500 = {:.0} us", 3.0 * raw + 500.0);

    let busy = Duration::from_secs_f64(queue_sample_count() as f64 * 4.0 * percentile(&admit, 99.0) / 1e6)
        .clamp(Duration::from_millis(busy_min_ms()), Duration::from_secs(60));
    let mut queued = h.block_on(queue_samples(h, consumer, busy))?;
    queued.sort();
    eprintln!(
        "send-bench: queue: {} samples, min {:.0} us, p99 {:.0} us, max {:.0} us",
        queued.len(),
        percentile(&queued, 0.0),
        percentile(&queued, 99.0),
        percentile(&queued, 100.0)
    );
    report("send.queue_p50_us", percentile(&queued, 50.0), "us");
    Ok(())
}

async fn call(consumer: &SubcConsumer, session: &str, method: &str, params: Value) -> Result<Value, Failure> {
    let body = json!({"method": method, "params": params}).to_string().into_bytes();
    match consumer.call(target(), BindIdentity::new(HARNESS, session), body, call_options()).await {
        Ok(reply) => serde_json::from_slice::<Value>(&reply)
            .map(|v| v["result"].clone())
            .map_err(|e| format!("{method}: the reply is not JSON: {e}")),
        Err(CallError::Module(body)) => Err(format!("{method} was refused: {body:?}")),
        Err(e) => Err(format!("{method} failed: {e:?}")),
    }
}

/// One timed `session.send`, keyed as role callers send it (a fresh `send_id`, so admission
/// also looks the key up in the send ledger): the client-side latency and the result.
async fn timed_send(consumer: &SubcConsumer, session: &str, prompt: &str) -> Result<(Duration, Value), Failure> {
    static SENDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut params = send_params(prompt);
    params["send_id"] = json!(format!("bench-{}", SENDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let body = json!({"method": "session.send", "params": params}).to_string().into_bytes();
    let identity = BindIdentity::new(HARNESS, session);
    let options = call_options();
    let start = Instant::now();
    let reply = consumer.call(target(), identity, body, options).await;
    let elapsed = start.elapsed();
    let reply = match reply {
        Ok(reply) => reply,
        Err(CallError::Module(body)) => return Err(format!("session.send was refused: {body:?}")),
        Err(e) => return Err(format!("session.send failed: {e:?}")),
    };
    let v: Value = serde_json::from_slice(&reply).map_err(|e| format!("session.send: the reply is not JSON: {e}"))?;
    Ok((elapsed, v["result"].clone()))
}

/// Polls `run.status` until the run is `completed` (at most `within`).
async fn wait_completed(consumer: &SubcConsumer, session: &str, run_id: &str, within: Duration) -> Result<(), Failure> {
    let until = Instant::now() + within;
    loop {
        let status = call(consumer, session, "run.status", json!({"run_id": run_id})).await;
        match status {
            Ok(s) if s["state"] == "completed" => return Ok(()),
            // `unknown`: a queued send's run has not started yet.
            Ok(s) if !["active", "pending", "unknown"].contains(&s["state"].as_str().unwrap_or_default()) => {
                return Err(format!("run {run_id} ended {s}"));
            }
            other if Instant::now() >= until => {
                return Err(format!("run {run_id} did not complete within {within:?}: {other:?}"));
            }
            _ => tokio::time::sleep(Duration::from_micros(500)).await,
        }
    }
}

fn run_id(result: &Value) -> Result<String, Failure> {
    result["run_id"].as_str().map(String::from).ok_or_else(|| format!("session.send answered {result}"))
}

/// Idle sends: (measured samples, each fresh session's uncounted first send).
async fn admit_samples(consumer: &SubcConsumer) -> Result<(Vec<Duration>, Vec<Duration>), Failure> {
    let (mut samples, mut cold) = (Vec::with_capacity(admit_sample_count()), Vec::new());
    let mut sessions = 0;
    while samples.len() < admit_sample_count() {
        sessions += 1;
        let session = format!("admit-{}-{sessions}", std::process::id());
        for i in 0..=per_session() {
            let (elapsed, result) = timed_send(consumer, &session, "Hello?").await?;
            if result["state"] != "active" {
                return Err(format!("an idle session.send answered {result}"));
            }
            wait_completed(consumer, &session, &run_id(&result)?, STEP).await?;
            if i == 0 {
                cold.push(elapsed);
            } else if samples.len() < admit_sample_count() {
                samples.push(elapsed);
            }
        }
    }
    Ok((samples, cold))
}

/// Sends behind a busy run: the measured samples. Waits for the queue to drain.
async fn queue_samples(h: &Harness, consumer: &SubcConsumer, busy: Duration) -> Result<Vec<Duration>, Failure> {
    let session = format!("queue-{}", std::process::id());
    // Open the session's actor first, with an instant run.
    let (_, warm) = timed_send(consumer, &session, "Warm up.").await?;
    wait_completed(consumer, &session, &run_id(&warm)?, STEP).await?;

    h.mock.reset("default");
    let busy_ms = busy.as_millis() as u64;
    h.install(json!({"responses": [{"delay_ms": busy_ms, "events": [{"text": "Done."}, {"finish": "stop"}]}]}));
    let (_, busy_reply) = timed_send(consumer, &session, "Take your time.").await?;
    let busy_run = run_id(&busy_reply)?;
    // The busy run's model request has reached the mock (which popped the delayed reply).
    let until = Instant::now() + STEP;
    while h.mock.pending("default") > 0 {
        if Instant::now() >= until {
            return Err("the busy run's model request never reached the mock".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let mut samples = Vec::with_capacity(queue_sample_count());
    let mut last = None;
    for i in 0..queue_sample_count() {
        let (elapsed, result) = timed_send(consumer, &session, &format!("Queued {i}.")).await?;
        if result["state"] != "pending" {
            return Err(format!(
                "send {i} behind the busy run answered {result} after {:?} (the run was held {busy:?})",
                started.elapsed()
            ));
        }
        last = result["submission_id"].as_str().map(String::from);
        samples.push(elapsed);
    }
    if started.elapsed() >= busy {
        return Err(format!("the queue samples outlasted the busy run ({:?} of {busy:?})", started.elapsed()));
    }
    // Let the busy run and every queued send finish, so the stop finds the session idle.
    wait_completed(consumer, &session, &busy_run, busy + STEP).await?;
    let last = last.ok_or("no submission id on a pending reply")?;
    wait_completed(consumer, &session, &format!("run-{last}"), Duration::from_secs(120)).await?;
    Ok(samples)
}
