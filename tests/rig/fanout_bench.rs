//! `fanout-bench`: the fan-out benchmarks behind `make bench`, through the real subc daemon.
//! Prints only `BENCH <name> <value> <unit>` lines on stdout (progress and diagnostics go to
//! stderr); targets are in the README, nothing here asserts them.
//!
//! The rig is the tests' harness (`tests/support`, as `tests/e2e_subc.rs` uses it): the daemon
//! (the `subc-daemon` library) booted in this process, on its own tokio runtime, in a private
//! temp rig directory. It supervises the release broca binary: `BROCA_BENCH_BROCA`, or else
//! `../broca` next to this example's own directory (`target/release/examples/fanout-bench` →
//! `target/release/broca`). broca's state root is seeded with
//! `testdata/catalog/fusiform-lkg.json` and its provider base URL points at the harness's
//! `mock::MockServer` (broca-mock's module tree, included here). Consumers use the official SDK (`subc-client-rs`) on a second
//! runtime.
//!
//! Every measured run is one `session.send` on `mock/echo-chat` of a fresh session whose
//! scripted reply streams [`deltas`] text deltas `t={{now_us}};`, [`DELTA_GAP_MS`] ms apart; the
//! mock stamps each with its write time (Unix µs). The subscriptions attach `from: live` and are
//! proven attached by a short priming run each of them must see finish first.
//!
//! - `fanout.delta_latency_p{50,99}_us.subs{1,32}`: N subscribers, **one `SubcConsumer`
//!   connection each**; for every display `text_delta` a subscriber takes its receive time (Unix
//!   µs, on arrival from the SDK) minus the embedded time. p50/p99 over all subscribers' samples.
//! - `fanout.stalled_subscriber_slowdown_pct`: wall time from `session.send` to the reading
//!   subscriber's `run_finished` (one reading subscriber), with one extra never-reading
//!   subscription vs without: `(with - without) / without * 100`, the median of
//!   [`stall_rounds`] paired rounds (the order within a pair alternates). The stalled
//!   subscription lives on its own connection, created on a current-thread runtime that is not
//!   driven while the run streams: neither the SDK nor the socket reads its events.
//!
//! Every wait is bounded. At the end the daemon is stopped by SIGTERM to this process (its
//! signal handler runs the shutdown sequence); the exit status is 0 when every figure was
//! measured, 1 otherwise (a harness failure panics: 101).

use broca_mock::mock;
#[path = "../bench/quick.rs"]
mod quick;
#[path = "../support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mock::{MockServer, Script};
use serde_json::{json, Value};
use subc_client_rs::{CallError, CallOptions, ConsumerOptions, SubcConsumer, SubscribeOptions, Subscription};
use subc_protocol::BindIdentity;
use support::{target, Harness, Options};
use tokio::task::JoinSet;

const HARNESS: &str = "fanout-bench";
/// Text deltas in a measured run.
fn deltas() -> usize {
    quick::n(200, 20)
}
/// The pause between two deltas.
const DELTA_GAP_MS: u64 = 5;
/// Paired rounds of the stalled-subscriber measure.
fn stall_rounds() -> usize {
    quick::n(3, 1)
}
/// The subscriber counts of the latency measure.
const FANOUTS: [usize; 2] = [1, 32];
/// The longest wait for any one stream frame or call.
const STEP: Duration = Duration::from_secs(15);
/// The whole benchmark.
const LIMIT: Duration = Duration::from_secs(300);
/// How long display deltas may trail their run's `run_finished` (they travel on another lane).
const GRACE: Duration = Duration::from_secs(2);

type Failure = String;

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        eprintln!("usage: fanout-bench   (environment: BROCA_BENCH_BROCA = the broca binary; RUST_LOG)");
        return ExitCode::SUCCESS;
    }
    let broca = match support::bench_broca_binary() {
        Ok(path) => path,
        Err(why) => {
            eprintln!("fanout-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let opts = Options { broca, ck_log: "info".into(), test_writer: false, prefix: "bfb".into(), ..Default::default() };
    let h = Harness::start_with(opts);
    eprintln!("fanout-bench: rig {}", h.rig_root().display());
    let outcome = h.block_on(async {
        tokio::time::timeout(LIMIT, bench(h.connection_file(), &h.mock))
            .await
            .unwrap_or_else(|_| Err(format!("the benchmark did not finish within {LIMIT:?}")))
    });
    if let Err(why) = &outcome {
        eprintln!("fanout-bench: {why}");
        eprintln!("fanout-bench: broca's log (tail):\n{}", h.broca_log_tail(30));
    }
    h.stop();
    eprintln!("fanout-bench: the daemon stopped cleanly");
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

fn unix_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

fn identity(session: &str) -> BindIdentity {
    BindIdentity::new(HARNESS, session)
}

async fn connect(conn_file: &Path) -> Result<SubcConsumer, Failure> {
    let options = ConsumerOptions {
        handshake_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    SubcConsumer::connect(conn_file, options)
        .await
        .map_err(|e| format!("cannot connect through {}: {e}", conn_file.display()))
}

async fn subscribe(consumer: &SubcConsumer, session: &str, options: SubscribeOptions) -> Result<Subscription, Failure> {
    let body = json!({"method": "session.subscribe", "params": {"from": "live"}}).to_string().into_bytes();
    consumer
        .subscribe(target(), identity(session), body, options)
        .await
        .map_err(|e| format!("session.subscribe: {e:?}"))
}

/// `session.send` on `mock/echo-chat`: the run id.
async fn send(consumer: &SubcConsumer, session: &str, prompt: &str) -> Result<String, Failure> {
    let params = json!({"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}});
    let body = json!({"method": "session.send", "params": params}).to_string().into_bytes();
    let options = CallOptions { timeout: STEP, ..Default::default() };
    let reply = match consumer.call(target(), identity(session), body, options).await {
        Ok(reply) => reply,
        Err(CallError::Module(body)) => return Err(format!("session.send was refused: {body:?}")),
        Err(e) => return Err(format!("session.send failed: {e:?}")),
    };
    let v: Value = serde_json::from_slice(&reply).map_err(|e| format!("session.send: the reply is not JSON: {e}"))?;
    let result = &v["result"];
    result["run_id"]
        .as_str()
        .map(String::from)
        .or_else(|| result["submission_id"].as_str().map(|s| format!("run-{s}")))
        .ok_or_else(|| format!("session.send answered {v}"))
}

/// The measured reply: [`deltas`] stamped text deltas, paced.
fn stamped_script() -> Script {
    let mut events = Vec::with_capacity(2 * deltas() + 2);
    for i in 0..deltas() {
        if i > 0 {
            events.push(json!({"delay_ms": DELTA_GAP_MS}));
        }
        events.push(json!({"text": "t={{now_us}};"}));
    }
    events.push(json!({"usage": {"input": 10, "output": deltas()}}));
    events.push(json!({"finish": "stop"}));
    Script::from_json(&json!({"responses": [{"events": events}]}).to_string()).expect("the bench script is valid")
}

/// The priming reply: late enough that every subscription has attached before it finishes.
fn priming_script() -> Script {
    let reply = json!({"delay_ms": 50, "events": [{"text": "ready"}, {"finish": "stop"}]});
    Script::from_json(&json!({"responses": [reply]}).to_string()).expect("the priming script is valid")
}

fn install(mock: &MockServer, script: Script) {
    mock.reset("default");
    mock.install("default", script);
}

/// The embedded times (Unix µs) of the `t=<16 digits>;` marks in a delta.
fn stamps(delta: &str) -> impl Iterator<Item = i64> + '_ {
    delta.split("t=").skip(1).filter_map(|rest| {
        let digits = rest.get(..16)?;
        digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok()).flatten()
    })
}

/// What one subscriber saw of one run.
struct Seen {
    run_id: String,
    /// Receive minus embedded time of every stamped delta, µs.
    samples: Vec<i64>,
    /// When its `run_finished` arrived.
    finished: Instant,
}

/// Reads `sub` until a `run_finished`, then (for a stamped run) until [`deltas`] stamps or
/// [`GRACE`] pass.
async fn read_run(sub: &mut Subscription, stamped: bool) -> Result<Seen, Failure> {
    let mut samples = Vec::with_capacity(if stamped { deltas() } else { 0 });
    let mut finished: Option<(Instant, String)> = None;
    loop {
        let wait = match &finished {
            None => STEP,
            Some(_) if !stamped || samples.len() >= deltas() => break,
            Some((at, _)) => GRACE.saturating_sub(at.elapsed()),
        };
        let frame = match tokio::time::timeout(wait, sub.events().recv()).await {
            Err(_) if finished.is_some() => break,
            Err(_) => return Err(format!("no stream frame within {STEP:?} (samples so far: {})", samples.len())),
            Ok(None) => return Err(format!("the subscription ended: {:?}", sub.ended().await)),
            Ok(Some(bytes)) => bytes,
        };
        let (recv_us, at) = (unix_us(), Instant::now());
        let v: Value = serde_json::from_slice(&frame)
            .map_err(|e| format!("a stream frame is not JSON ({e}): {}", String::from_utf8_lossy(&frame)))?;
        match v["kind"].as_str() {
            Some("display") if v["event"]["type"] == "text_delta" => {
                let delta = v["event"]["delta"].as_str().unwrap_or_default();
                samples.extend(stamps(delta).map(|t| recv_us - t));
            }
            Some("display") if v["event"]["type"] == "display_gap" => {
                eprintln!("fanout-bench: a subscriber lost display deltas: {}", v["event"]);
            }
            Some("control") if v["unit"]["type"] == "run_finished" && finished.is_none() => {
                finished = Some((at, v["unit"]["run_id"].as_str().unwrap_or_default().to_owned()));
            }
            _ => {}
        }
    }
    let (finished, run_id) = finished.expect("the loop leaves with a finished run");
    Ok(Seen { run_id, samples, finished })
}

/// Reads one run on every subscription concurrently; the subscriptions come back in order.
fn read_all(subs: Vec<Subscription>, stamped: bool) -> JoinSet<(usize, Subscription, Result<Seen, Failure>)> {
    let mut set = JoinSet::new();
    for (i, mut sub) in subs.into_iter().enumerate() {
        set.spawn(async move {
            let seen = read_run(&mut sub, stamped).await;
            (i, sub, seen)
        });
    }
    set
}

async fn collect(
    mut set: JoinSet<(usize, Subscription, Result<Seen, Failure>)>,
    n: usize,
) -> Result<(Vec<Subscription>, Vec<Seen>), Failure> {
    let mut slots: Vec<Option<(Subscription, Seen)>> = (0..n).map(|_| None).collect();
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, sub, Ok(seen))) => slots[i] = Some((sub, seen)),
            Ok((i, sub, Err(why))) => {
                let _ = sub.unsubscribe();
                failure.get_or_insert(format!("subscriber {i}: {why}"));
            }
            Err(e) => {
                failure.get_or_insert(format!("a subscriber task failed: {e}"));
            }
        }
    }
    if let Some(why) = failure {
        for (sub, _) in slots.into_iter().flatten() {
            let _ = sub.unsubscribe();
        }
        return Err(why);
    }
    Ok(slots.into_iter().map(|s| s.expect("every subscriber reported")).unzip())
}

/// One measured run.
struct Run {
    /// Every subscriber's samples, µs.
    samples: Vec<i64>,
    /// `session.send` to the first subscriber's `run_finished`.
    wall: Duration,
}

/// A fresh session with `readers.len()` reading subscriptions (and the stalled one, if given):
/// a priming run every reader sees finish, then the measured run.
async fn measure(
    driver: &SubcConsumer,
    readers: &[SubcConsumer],
    stalled: Option<&Staller>,
    mock: &MockServer,
    session: &str,
) -> Result<Run, Failure> {
    if let Some(staller) = stalled {
        staller.hold(session).await?;
    }
    let outcome = measure_readers(driver, readers, mock, session).await;
    if let Some(staller) = stalled {
        let released = staller.release().await;
        if outcome.is_ok() {
            released?;
        }
    }
    outcome
}

async fn measure_readers(
    driver: &SubcConsumer,
    readers: &[SubcConsumer],
    mock: &MockServer,
    session: &str,
) -> Result<Run, Failure> {
    let n = readers.len();
    let mut subs = Vec::with_capacity(n);
    for consumer in readers {
        subs.push(subscribe(consumer, session, SubscribeOptions::default()).await?);
    }
    install(mock, priming_script());
    let priming = read_all(subs, false);
    let prime_run = send(driver, session, "Get ready.").await?;
    let (subs, seen) = collect(priming, n).await?;
    if let Some(odd) = seen.iter().find(|s| s.run_id != prime_run || !s.samples.is_empty()) {
        return Err(format!("the priming run {prime_run} ended as {} with {} stamps", odd.run_id, odd.samples.len()));
    }

    install(mock, stamped_script());
    let measured = read_all(subs, true);
    let start = Instant::now();
    let run = send(driver, session, "Stream the stamps.").await?;
    let (subs, seen) = collect(measured, n).await?;
    for sub in &subs {
        let _ = sub.unsubscribe();
    }
    if let Some(odd) = seen.iter().find(|s| s.run_id != run) {
        return Err(format!("expected run_finished of {run}, a subscriber saw {}", odd.run_id));
    }
    let short: Vec<usize> = seen.iter().map(|s| s.samples.len()).filter(|&k| k != deltas()).collect();
    if !short.is_empty() {
        eprintln!("fanout-bench: {} of {n} subscribers did not get {} stamps: {short:?}", short.len(), deltas());
    }
    let wall = seen[0].finished.saturating_duration_since(start);
    Ok(Run { samples: seen.into_iter().flat_map(|s| s.samples).collect(), wall })
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[i64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1] as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn bench(conn_file: PathBuf, mock: &MockServer) -> Result<(), Failure> {
    let driver = connect(&conn_file).await?;
    let max = FANOUTS.iter().copied().max().unwrap_or(1);
    let mut readers = Vec::with_capacity(max);
    for _ in 0..max {
        readers.push(connect(&conn_file).await?);
    }
    let mut sessions = 0u32;
    let mut session = || {
        sessions += 1;
        format!("fanout-bench-{}-{sessions}", std::process::id())
    };

    eprintln!("fanout-bench: warm-up run");
    measure(&driver, &readers[..1], None, mock, &session()).await?;

    for n in FANOUTS {
        let run = measure(&driver, &readers[..n], None, mock, &session()).await?;
        let mut samples = run.samples;
        if samples.is_empty() {
            return Err(format!("{n} subscriber(s) received no stamped delta"));
        }
        samples.sort_unstable();
        eprintln!(
            "fanout-bench: {n} subscriber(s): {} samples, min {} us, max {} us, run {:?}",
            samples.len(),
            samples[0],
            samples[samples.len() - 1],
            run.wall
        );
        report(&format!("fanout.delta_latency_p50_us.subs{n}"), percentile(&samples, 50.0), "us");
        report(&format!("fanout.delta_latency_p99_us.subs{n}"), percentile(&samples, 99.0), "us");
    }

    let staller = Staller::start(conn_file)?;
    let mut slowdowns = Vec::with_capacity(stall_rounds());
    for round in 0..stall_rounds() {
        let mut wall = [Duration::ZERO; 2];
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for with in order {
            let stalled = (with == 1).then_some(&staller);
            wall[with] = measure(&driver, &readers[..1], stalled, mock, &session()).await?.wall;
        }
        let [without, with] = wall.map(|d| d.as_secs_f64());
        let pct = (with - without) / without * 100.0;
        eprintln!("fanout-bench: stall round {}: without {without:.4} s, with {with:.4} s: {pct:+.2} %", round + 1);
        slowdowns.push(pct);
    }
    staller.stop().await;
    report("fanout.stalled_subscriber_slowdown_pct", median(slowdowns), "%");
    Ok(())
}

enum StallCommand {
    /// Connect, subscribe to the session, let the request go out, then stop reading.
    Hold(String, mpsc::Sender<Result<(), Failure>>),
    /// Unsubscribe and drop the connection.
    /// Answers how many frames had been left unread.
    Release(mpsc::Sender<usize>),
}

/// A thread owning a current-thread runtime that holds the never-reading subscription. The
/// runtime is driven only while a command runs; between `hold` and `release` nothing polls the
/// SDK's reader task, so the subscription's events stay unread in the socket.
struct Staller {
    commands: mpsc::Sender<StallCommand>,
    thread: std::thread::JoinHandle<()>,
}

impl Staller {
    fn start(conn_file: PathBuf) -> Result<Staller, Failure> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the stalled subscriber's runtime: {e}"))?;
        let (commands, rx) = mpsc::channel::<StallCommand>();
        let thread = std::thread::Builder::new()
            .name("fanout-stall".into())
            .spawn(move || {
                let mut held: Option<(SubcConsumer, Subscription)> = None;
                for command in rx {
                    match command {
                        StallCommand::Hold(session, reply) => {
                            let outcome = rt.block_on(async {
                                tokio::time::timeout(STEP, async {
                                    let consumer = connect(&conn_file).await?;
                                    // Never polled: no SDK-side backpressure ends it either.
                                    let options = SubscribeOptions { event_buffer: 1 << 16, ..Default::default() };
                                    let sub = subscribe(&consumer, &session, options).await?;
                                    // Let the writer task put the request on the wire.
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    Ok((consumer, sub))
                                })
                                .await
                                .unwrap_or_else(|_| Err(format!("the stalled subscription took over {STEP:?}")))
                            });
                            let _ = reply.send(outcome.map(|pair| held = Some(pair)));
                        }
                        StallCommand::Release(reply) => {
                            let mut unread = 0usize;
                            if let Some((consumer, mut sub)) = held.take() {
                                rt.block_on(async {
                                    // What waited unread in the socket: proof it was attached.
                                    while let Ok(Some(_)) =
                                        tokio::time::timeout(Duration::from_millis(100), sub.events().recv()).await
                                    {
                                        unread += 1;
                                    }
                                    let _ = sub.unsubscribe();
                                    drop(sub);
                                    drop(consumer);
                                });
                            }
                            let _ = reply.send(unread);
                        }
                    }
                }
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .map_err(|e| format!("cannot start the stalled subscriber's thread: {e}"))?;
        Ok(Staller { commands, thread })
    }

    /// Waits (off the async workers) for the thread's answer.
    async fn ask<T: Send + 'static>(
        &self,
        command: impl FnOnce(mpsc::Sender<T>) -> StallCommand,
    ) -> Result<T, Failure> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(command(tx)).map_err(|_| "the stalled subscriber's thread is gone".to_owned())?;
        tokio::task::spawn_blocking(move || rx.recv_timeout(STEP + Duration::from_secs(5)))
            .await
            .map_err(|e| format!("waiting for the stalled subscriber: {e}"))?
            .map_err(|_| "the stalled subscriber's thread did not answer".to_owned())
    }

    async fn hold(&self, session: &str) -> Result<(), Failure> {
        let session = session.to_owned();
        self.ask(|tx| StallCommand::Hold(session, tx)).await?
    }

    async fn release(&self) -> Result<(), Failure> {
        let unread = self.ask(StallCommand::Release).await?;
        eprintln!("fanout-bench: the stalled subscription left {unread} frames unread");
        if unread == 0 {
            return Err("the stalled subscription received nothing: it was not attached".into());
        }
        Ok(())
    }

    async fn stop(self) {
        let Staller { commands, thread } = self;
        drop(commands);
        let joined = tokio::time::timeout(STEP, tokio::task::spawn_blocking(move || thread.join())).await;
        if !matches!(joined, Ok(Ok(Ok(())))) {
            eprintln!("fanout-bench: the stalled subscriber's thread did not end cleanly");
        }
    }
}
