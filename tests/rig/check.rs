//! `subc-rig-check`: the scripted scenario behind `make e2e`, run against a rig started by
//! `scripts/rig up`. It talks to broca only through the real daemon, with the official consumer
//! SDK (`subc-client-rs`), using the connection file named by `SUBC_CONNECTION_FILE`.
//!
//! - `subc-rig-check --wait-ready [SECS]`: wait (default 60 s) until the daemon lists broca as
//!   registered and ready; exit 0, or 1 with a message.
//! - `subc-rig-check`: the scenario on a fresh session, one numbered check at a time (progress on
//!   stderr); the last line on stdout is `E2E OK <n> checks`. The first failed check ends it
//!   with exit 1 and `E2E FAIL check <n> (<name>): <why>` on stderr. The model is
//!   `BROCA_MOCK_MODEL` (`provider/model`), which broca-mock answers with its default reply.
//!   Its last check SIGKILLs broca (the process `broca --subc $SUBC_CONNECTION_FILE`) three
//!   times mid-run, scripting slow streams through broca-mock's control endpoint at
//!   `BROCA_MOCK_URL`, else the URL `scripts/rig` recorded in `<rig>/run/mock.out`.

use broca_mock::mock;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use subc_client_rs::{
    CallError, CallOptions, ConsumerOptions, RetryBackoff, SubcConsumer, SubscribeOptions, Subscription,
};
use subc_protocol::{BindIdentity, ErrorBody, RouteTarget};

const MODULE_ID: &str = "broca";
const HARNESS: &str = "subc-rig-check";
/// The longest wait for any one stream event or call.
const STEP: Duration = Duration::from_secs(15);
/// The whole scenario.
const SCENARIO: Duration = Duration::from_secs(120);

const USAGE: &str = "\
usage: subc-rig-check [--wait-ready [SECS]]

Environment: SUBC_CONNECTION_FILE (required), BROCA_MOCK_MODEL (provider/model, for the scenario).";

type Failure = String;

/// Numbered checks: each one passes (and is counted) or ends the run.
struct Checks {
    passed: u32,
}

impl Checks {
    fn check(&mut self, name: &str, outcome: Result<(), String>) -> Result<(), Failure> {
        match outcome {
            Ok(()) => {
                self.passed += 1;
                eprintln!("ok {} {name}", self.passed);
                Ok(())
            }
            Err(why) => Err(format!("E2E FAIL check {} ({name}): {why}", self.passed + 1)),
        }
    }

    fn ensure(&mut self, name: &str, ok: bool, detail: impl FnOnce() -> String) -> Result<(), Failure> {
        self.check(name, if ok { Ok(()) } else { Err(detail()) })
    }
}

fn main() -> ExitCode {
    // Open routes as a plain `direct` caller, never as a supervised module (subc-wire §20.4).
    // Nothing else runs in this process yet.
    for var in ["SUBC_MODULE_ID", "SUBC_LAUNCH_NONCE", "SUBC_LAUNCH_NONCE_FD"] {
        std::env::remove_var(var);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wait_ready = match args.as_slice() {
        [] => None,
        [flag] if flag == "--wait-ready" => Some(Duration::from_secs(60)),
        [flag, secs] if flag == "--wait-ready" => match secs.parse::<u64>() {
            Ok(s) => Some(Duration::from_secs(s)),
            Err(_) => return usage_error(&format!("--wait-ready takes whole seconds, not `{secs}`")),
        },
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => return usage_error("unexpected arguments"),
    };
    let Some(conn_file) = std::env::var_os("SUBC_CONNECTION_FILE").filter(|v| !v.is_empty()).map(PathBuf::from) else {
        return usage_error("SUBC_CONNECTION_FILE is not set");
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("subc-rig-check: cannot start the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = match wait_ready {
        Some(within) => runtime.block_on(async {
            let consumer = connect(&conn_file, within).await?;
            ready(&consumer, within).await.map(|_| eprintln!("subc-rig-check: broca is registered and ready"))
        }),
        None => {
            let model = std::env::var("BROCA_MOCK_MODEL").unwrap_or_default();
            let Some((provider, name)) = model.split_once('/').filter(|(p, m)| !p.is_empty() && !m.is_empty()) else {
                return usage_error(&format!("BROCA_MOCK_MODEL must be provider/model, not `{model}`"));
            };
            let model = json!({"provider": provider, "model": name});
            let mut checks = Checks { passed: 0 };
            let run = runtime.block_on(async {
                match tokio::time::timeout(SCENARIO, scenario(&conn_file, model, &mut checks)).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("E2E FAIL: the scenario did not finish within {SCENARIO:?}")),
                }
            });
            run.map(|()| println!("E2E OK {} checks", checks.passed)).map_err(|why| {
                if why.starts_with("E2E FAIL") {
                    why
                } else {
                    format!("E2E FAIL check {}: {why}", checks.passed + 1)
                }
            })
        }
    };
    runtime.shutdown_timeout(Duration::from_secs(2));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
    }
}

fn usage_error(why: &str) -> ExitCode {
    eprintln!("subc-rig-check: {why}\n{USAGE}");
    ExitCode::from(2)
}

fn target() -> RouteTarget {
    RouteTarget::ManagementSurface { module_id: MODULE_ID.into() }
}

fn call_options() -> CallOptions {
    CallOptions { timeout: STEP, ..Default::default() }
}

/// Connects through the connection file, retrying until it exists and the daemon answers.
async fn connect(conn_file: &std::path::Path, within: Duration) -> Result<SubcConsumer, Failure> {
    let until = Instant::now() + within;
    let options = ConsumerOptions {
        handshake_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    loop {
        let last = if conn_file.exists() {
            match SubcConsumer::connect(conn_file, options.clone()).await {
                Ok(consumer) => return Ok(consumer),
                Err(e) => format!("{e}"),
            }
        } else {
            "it does not exist".to_owned()
        };
        if Instant::now() >= until {
            return Err(format!(
                "cannot connect to the daemon through {} within {within:?}: {last}",
                conn_file.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the daemon's catalog lists broca as ready.
async fn ready(consumer: &SubcConsumer, within: Duration) -> Result<subc_client_rs::CatalogEntry, Failure> {
    let until = Instant::now() + within;
    loop {
        let last = match consumer.catalog_list().await {
            Ok(list) => match list.modules.into_iter().find(|m| m.module_id == MODULE_ID) {
                Some(entry) if entry.ready => return Ok(entry),
                Some(_) => "listed but not ready".to_owned(),
                None => "not in the catalog".to_owned(),
            },
            Err(e) => format!("catalog.list failed: {e:?}"),
        };
        if Instant::now() >= until {
            return Err(format!("broca was not registered and ready within {within:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One session op: its `result`, or the module's refusal. Transport failures end the run.
async fn op(
    consumer: &SubcConsumer,
    session: &str,
    method: &str,
    params: Value,
) -> Result<Result<Value, ErrorBody>, Failure> {
    let identity = BindIdentity::new(HARNESS, session);
    let body = json!({"method": method, "params": params}).to_string().into_bytes();
    match consumer.call(target(), identity, body, call_options()).await {
        Ok(reply) => {
            let v: Value = serde_json::from_slice(&reply)
                .map_err(|e| format!("{method}: the reply is not JSON ({e}): {}", String::from_utf8_lossy(&reply)))?;
            match v.get("result") {
                Some(result) => Ok(Ok(result.clone())),
                None => Err(format!("{method}: the reply has no `result`: {v}")),
            }
        }
        Err(CallError::Module(body)) => Ok(Err(body)),
        Err(other) => Err(format!("{method}: the call failed: {other:?}")),
    }
}

/// An op that must succeed.
async fn ok_op(consumer: &SubcConsumer, session: &str, method: &str, params: Value) -> Result<Value, Failure> {
    op(consumer, session, method, params).await?.map_err(|e| format!("{method} was refused: {e:?}"))
}

/// What one subscription delivered for one run.
#[derive(Default)]
struct Episode {
    /// `[cursor, unit]` of every control frame, in order.
    control: Vec<(Value, Value)>,
    /// The text deltas joined.
    display_text: String,
    /// Every frame's `seq`.
    seqs: Vec<u64>,
}

impl Episode {
    fn units_of(&self, run_id: &str) -> Vec<&Value> {
        self.control.iter().map(|(_, u)| u).filter(|u| u["run_id"] == json!(run_id)).collect()
    }

    fn types_of(&self, run_id: &str) -> Vec<String> {
        self.units_of(run_id).iter().map(|u| u["type"].as_str().unwrap_or("?").to_owned()).collect()
    }
}

async fn next_frame(sub: &mut Subscription, within: Duration) -> Result<Option<Value>, Failure> {
    match tokio::time::timeout(within, sub.events().recv()).await {
        Err(_) => Ok(None),
        Ok(None) => Err(format!("the subscription ended: {:?}", sub.ended().await)),
        Ok(Some(bytes)) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("a stream frame is not JSON ({e}): {}", String::from_utf8_lossy(&bytes))),
    }
}

fn absorb(episode: &mut Episode, frame: Value) {
    if let Some(seq) = frame["seq"].as_u64() {
        episode.seqs.push(seq);
    }
    match frame["kind"].as_str() {
        Some("control") => episode.control.push((frame["cursor"].clone(), frame["unit"].clone())),
        Some("display") if frame["event"]["type"] == "text_delta" => {
            episode.display_text.push_str(frame["event"]["delta"].as_str().unwrap_or_default())
        }
        _ => {}
    }
}

/// Streams frames until the `run_finished` unit of `run_id`. Display deltas travel on their own
/// lane and may trail the control unit, so a short grace follows until `expected_text` is whole.
async fn until_finished(sub: &mut Subscription, run_id: &str, expected_text: &str) -> Result<Episode, Failure> {
    let mut episode = Episode::default();
    loop {
        let Some(frame) = next_frame(sub, STEP).await? else {
            return Err(format!(
                "no stream frame within {STEP:?} before run_finished of {run_id}; control so far: {:?}",
                episode.types_of(run_id)
            ));
        };
        let done = frame["kind"] == "control"
            && frame["unit"]["type"] == "run_finished"
            && frame["unit"]["run_id"] == json!(run_id);
        absorb(&mut episode, frame);
        if done {
            break;
        }
    }
    let grace = Instant::now() + Duration::from_secs(2);
    while episode.display_text.len() < expected_text.len() {
        let left = grace.saturating_duration_since(Instant::now());
        match next_frame(sub, left).await? {
            Some(frame) if !left.is_zero() => absorb(&mut episode, frame),
            _ => break,
        }
    }
    Ok(episode)
}

fn assistant_text(message: &Value) -> String {
    message["content"]
        .as_array()
        .map(|parts| parts.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect())
        .unwrap_or_default()
}

/// `needles` appear in `hay` in this relative order.
fn in_order(hay: &[String], needles: &[&str]) -> bool {
    let mut rest = hay.iter();
    needles.iter().all(|n| rest.any(|h| h == n))
}

/// The checks on one finished episode, as seen by the subscription.
fn check_episode(
    checks: &mut Checks,
    label: &str,
    episode: &Episode,
    run_id: &str,
    prompt: &str,
    reply: &str,
) -> Result<(), Failure> {
    let types = episode.types_of(run_id);
    let units = episode.units_of(run_id);
    let finished = units.iter().find(|u| u["type"] == "run_finished").copied().cloned().unwrap_or(Value::Null);
    checks.ensure(&format!("{label}: run_finished says completed"), finished["reason"] == "completed", || {
        format!("run_finished: {finished}")
    })?;
    let expected = ["run_started", "user_message", "step_started", "assistant_message", "run_finished"];
    checks.ensure(
        &format!("{label}: control units run_started, user_message, step_started, assistant_message, run_finished"),
        in_order(&types, &expected) && types.last().map(String::as_str) == Some("run_finished"),
        || format!("the run's control units were {types:?}"),
    )?;
    let user = units.iter().find(|u| u["type"] == "user_message").map(|u| u["message"].clone()).unwrap_or_default();
    checks.ensure(&format!("{label}: user_message carries the prompt"), assistant_text(&user) == prompt, || {
        format!("user_message: {user}")
    })?;
    checks.ensure(&format!("{label}: the display lane streamed {reply:?}"), episode.display_text == reply, || {
        format!("the text deltas joined: {:?}", episode.display_text)
    })?;
    let answer =
        units.iter().find(|u| u["type"] == "assistant_message").map(|u| u["message"].clone()).unwrap_or_default();
    checks.ensure(
        &format!("{label}: assistant_message holds the streamed text"),
        answer["role"] == "assistant" && assistant_text(&answer) == reply,
        || format!("assistant_message: {answer}"),
    )
}

async fn scenario(conn_file: &std::path::Path, model: Value, checks: &mut Checks) -> Result<(), Failure> {
    let consumer = connect(conn_file, STEP).await;
    checks.check("the daemon accepts a consumer connection", consumer.as_ref().map(|_| ()).map_err(Clone::clone))?;
    let consumer = consumer?;
    let entry = ready(&consumer, Duration::from_secs(60)).await;
    checks.check("broca is registered and ready", entry.as_ref().map(|_| ()).map_err(Clone::clone))?;
    let entry = entry?;
    checks.ensure("broca registered with its launch nonce", entry.nonce_verified, || format!("{entry:?}"))?;

    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let session = format!("rig-check-{}-{nanos}", std::process::id());
    eprintln!("subc-rig-check: session {session}, model {model}");
    let identity = BindIdentity::new(HARNESS, session.as_str());
    let body = json!({"method": "session.subscribe", "params": {"from": "start"}}).to_string().into_bytes();
    let sub = consumer.subscribe(target(), identity, body, SubscribeOptions::default()).await;
    checks.check("session.subscribe from start is accepted", sub.as_ref().map(|_| ()).map_err(|e| format!("{e:?}")))?;
    let mut sub = sub.map_err(|e| format!("{e:?}"))?;
    let reply = crate::mock::DEFAULT_REPLY_TEXT;

    // Episode 1.
    let prompt1 = "Say hello through the daemon.";
    let first = ok_op(&consumer, &session, "session.send", json!({"prompt": prompt1, "model": model})).await?;
    let run1 = first["run_id"].as_str().unwrap_or_default().to_owned();
    checks.ensure(
        "session.send starts a run (state active, run_id)",
        first["state"] == "active" && !run1.is_empty(),
        || format!("session.send answered {first}"),
    )?;
    let one = until_finished(&mut sub, &run1, reply).await?;
    check_episode(checks, "episode 1", &one, &run1, prompt1, reply)?;
    checks.ensure(
        "stream seq runs from 1 with no gap",
        one.seqs == (1..=one.seqs.len() as u64).collect::<Vec<_>>(),
        || format!("seq: {:?}", one.seqs),
    )?;

    let page = ok_op(&consumer, &session, "session.read", json!({})).await?;
    let mids: Vec<&str> =
        page["messages"].as_array().map(|m| m.iter().filter_map(|m| m["mid"].as_str()).collect()).unwrap_or_default();
    checks
        .ensure("session.read shows 2 messages, m1 and m2", mids == ["m1", "m2"], || format!("session.read: {page}"))?;
    let roles: Vec<&str> = page["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["message"]["role"].as_str()).collect())
        .unwrap_or_default();
    let texts: Vec<String> = page["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| assistant_text(&m["message"])).collect())
        .unwrap_or_default();
    checks.ensure(
        "session.read: the user prompt, then the assistant's reply",
        roles == ["user", "assistant"] && texts == [prompt1, reply],
        || format!("session.read: {page}"),
    )?;
    let status = ok_op(&consumer, &session, "run.status", json!({"run_id": run1})).await?;
    checks.ensure("run.status says completed", status["state"] == "completed", || format!("run.status: {status}"))?;

    // Episode 2, on the same subscription.
    let prompt2 = "And once more.";
    let second = ok_op(&consumer, &session, "session.send", json!({"prompt": prompt2, "model": model})).await?;
    let run2 = second["run_id"]
        .as_str()
        .map(String::from)
        .or_else(|| second["submission_id"].as_str().map(|s| format!("run-{s}")))
        .unwrap_or_default();
    checks.ensure("a second session.send starts a new run", !run2.is_empty() && run2 != run1, || {
        format!("session.send answered {second}")
    })?;
    let two = until_finished(&mut sub, &run2, reply).await?;
    check_episode(checks, "episode 2 (same subscription)", &two, &run2, prompt2, reply)?;
    let seqs: Vec<u64> = one.seqs.iter().chain(&two.seqs).copied().collect();
    let cursors: Vec<(u64, u64)> = one
        .control
        .iter()
        .chain(&two.control)
        .map(|(c, _)| (c["wal_seq"].as_u64().unwrap_or(0), c["sub_index"].as_u64().unwrap_or(0)))
        .collect();
    checks.ensure(
        "across both episodes: seq has no gap, cursors only rise",
        seqs == (1..=seqs.len() as u64).collect::<Vec<_>>() && cursors.windows(2).all(|w| w[0] < w[1]),
        || format!("seq: {seqs:?}; cursors: {cursors:?}"),
    )?;
    let page = ok_op(&consumer, &session, "session.read", json!({})).await?;
    let mids: Vec<&str> =
        page["messages"].as_array().map(|m| m.iter().filter_map(|m| m["mid"].as_str()).collect()).unwrap_or_default();
    checks.ensure("session.read shows 4 messages, m1 to m4", mids == ["m1", "m2", "m3", "m4"], || {
        format!("session.read: {page}")
    })?;
    let latest = ok_op(&consumer, &session, "run.status", json!({})).await?;
    checks.ensure(
        "run.status without run_id names the second run, completed",
        latest["run_id"] == json!(run2) && latest["state"] == "completed",
        || format!("run.status: {latest}"),
    )?;

    // A strict op refuses a member it does not know.
    let refused = op(&consumer, &session, "session.read", json!({"direction": "back"})).await?;
    checks.ensure(
        "session.read with an unknown member is refused invalid_params",
        matches!(&refused, Err(body) if body.code == "invalid_params"),
        || format!("session.read {{direction}} answered {refused:?}"),
    )?;

    let _ = sub.unsubscribe();

    handoff_under_a_running_turn(conn_file, &consumer, &session, &model, checks).await?;

    // Resubscribing across SIGKILLs of broca (the daemon respawns it): one subscriber on its
    // own connection comes back from its last cursor after each kill and must see exactly the
    // durable units, each killed run's seal (`error` + `run_finished`) included.
    let outcome = resubscribe_across_kills(&consumer, conn_file, &session, &model).await;
    checks.check(
        &format!("a subscriber resubscribing after each of {KILLS} SIGKILLs of broca sees exactly the durable units"),
        outcome,
    )?;
    Ok(())
}

/// How many times [`resubscribe_across_kills`] SIGKILLs broca. The rig keeps the daemon's
/// default crash budget (3 restarts per 10 minutes, backoff 100 ms, 1 s, 10 s): three kills fit,
/// the third respawn takes about 10 s.
const KILLS: u32 = 3;
/// The longest wait for broca to come back after a SIGKILL (see [`KILLS`]).
const RESPAWN: Duration = Duration::from_secs(40);

type Cursor = (u64, u64);

fn cursor_of(v: &Value) -> Option<Cursor> {
    Some((v["wal_seq"].as_u64()?, v["sub_index"].as_u64()?))
}

/// What the resubscribing follower saw.
#[derive(Default)]
struct Followed {
    units: Vec<(Cursor, Value)>,
    disorder: Vec<String>,
    subscribes: u32,
    stuck: Option<String>,
}

/// Subscribes `from: "start"` on `session`, and whenever its stream ends resubscribes from its
/// last cursor at once (retrying refusals every 10 ms), until its last cursor reaches the head
/// set in `target` or `abort` is set.
async fn follow(
    consumer: SubcConsumer,
    session: String,
    head: std::sync::Arc<std::sync::Mutex<Option<Cursor>>>,
    abort: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Followed {
    let mut seen = Followed::default();
    let mut stream: Option<Subscription> = None;
    let mut target_at: Option<Instant> = None;
    loop {
        let last = seen.units.last().map(|(c, _)| *c);
        if let Some(head) = *head.lock().unwrap_or_else(|e| e.into_inner()) {
            if last.is_some_and(|l| l >= head) {
                break;
            }
            if target_at.get_or_insert_with(Instant::now).elapsed() > STEP {
                seen.stuck = Some(format!("its last cursor {last:?} never reached the head {head:?}"));
                break;
            }
        }
        if abort.load(std::sync::atomic::Ordering::SeqCst) {
            seen.stuck = Some("aborted".into());
            break;
        }
        let Some(sub) = stream.as_mut() else {
            let from = last.map_or(json!("start"), |(w, i)| json!({"wal_seq": w, "sub_index": i}));
            let body = json!({"method": "session.subscribe", "params": {"from": from}}).to_string().into_bytes();
            // Route opens refused during the respawn are retried every 10 ms (the SDK's
            // default backs off up to 2 s between attempts).
            let route_retry =
                RetryBackoff { base: Duration::from_millis(10), cap: Duration::from_millis(10), max_attempts: 1 };
            let opts = SubscribeOptions { event_buffer: 100_000, route_retry, ..SubscribeOptions::default() };
            match consumer.subscribe(target(), BindIdentity::new(HARNESS, session.as_str()), body, opts).await {
                Ok(sub) => {
                    seen.subscribes += 1;
                    eprintln!("subc-rig-check: follower: subscribe {} from {from}", seen.subscribes);
                    stream = Some(sub);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
            continue;
        };
        match tokio::time::timeout(Duration::from_millis(50), sub.events().recv()).await {
            Err(_) => {}
            Ok(None) => {
                let ended = sub.ended().await;
                eprintln!("subc-rig-check: follower: stream {} ended: {ended:?}", seen.subscribes);
                stream = None;
            }
            Ok(Some(bytes)) => {
                let Ok(frame) = serde_json::from_slice::<Value>(&bytes) else { continue };
                if frame["kind"] != "control" {
                    continue;
                }
                match cursor_of(&frame["cursor"]) {
                    Some(c) if last.is_some_and(|l| c <= l) => {
                        seen.disorder.push(format!("{c:?} ({}) after {last:?}", frame["unit"]["type"]))
                    }
                    Some(c) => seen.units.push((c, frame["unit"].clone())),
                    None => seen.disorder.push(format!("a control frame without a cursor: {frame}")),
                }
            }
        }
    }
    if let Some(sub) = stream {
        let _ = sub.unsubscribe();
    }
    seen
}

/// The pid of the live broca process this rig's daemon launched (`broca --subc <conn file>`).
fn broca_pid(conn_file: &std::path::Path) -> Option<i32> {
    let conn = conn_file.to_str()?;
    let canonical = std::fs::canonicalize(conn_file).ok();
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let state = stat.rsplit_once(')')?.1.split_whitespace().next()?.to_owned();
        if state == "Z" || state == "X" {
            return None;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let program = std::path::Path::new(std::str::from_utf8(args.first()?).ok()?);
        if program.file_name()? != "broca" {
            return None;
        }
        let at = args.iter().position(|a| *a == b"--subc")?;
        let named = std::path::Path::new(std::str::from_utf8(args.get(at + 1)?).ok()?);
        let same =
            named == std::path::Path::new(conn) || canonical.as_deref() == std::fs::canonicalize(named).ok().as_deref();
        same.then_some(pid)
    })
}

/// broca-mock's URL: `BROCA_MOCK_URL`, else the line `scripts/rig` captured in
/// `<rig>/run/mock.out` (the rig directory holds `runtime/subc-connection.json`).
fn mock_url(conn_file: &std::path::Path) -> Result<String, Failure> {
    if let Some(url) = std::env::var("BROCA_MOCK_URL").ok().filter(|u| !u.is_empty()) {
        return Ok(url);
    }
    let out = conn_file.parent().and_then(std::path::Path::parent).map(|rig| rig.join("run/mock.out"));
    let out = out.ok_or_else(|| format!("no rig directory above {}", conn_file.display()))?;
    let text =
        std::fs::read_to_string(&out).map_err(|e| format!("BROCA_MOCK_URL is not set and {}: {e}", out.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("BROCA_MOCK_URL="))
        .map(String::from)
        .ok_or_else(|| format!("{} names no BROCA_MOCK_URL", out.display()))
}

/// One HTTP/1.1 request to broca-mock's control endpoint: `(status, body)`.
fn mock_http(url: &str, method: &str, path: &str, body: &str) -> Result<(u16, String), Failure> {
    use std::io::{Read, Write};
    let authority = url.strip_prefix("http://").unwrap_or(url).trim_end_matches('/');
    let mut conn = std::net::TcpStream::connect(authority).map_err(|e| format!("broca-mock at {url}: {e}"))?;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).map_err(|e| format!("broca-mock {method} {path}: {e}"))?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply).map_err(|e| format!("broca-mock {method} {path}: {e}"))?;
    let status = reply.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// How many model requests broca-mock's default lane has recorded.
fn mock_recorded(url: &str) -> Result<u64, Failure> {
    let (status, body) = mock_http(url, "GET", "/_mock/lanes/default", "")?;
    let v: Value =
        serde_json::from_str(&body).map_err(|e| format!("broca-mock lane status ({status}): {e}: {body}"))?;
    v["recorded"].as_u64().ok_or_else(|| format!("broca-mock lane status: {v}"))
}

/// An op retried while broca restarts (the route is gone, or the dead process's lease lingers).
async fn retry_op(consumer: &SubcConsumer, session: &str, method: &str, params: Value) -> Result<Value, Failure> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let identity = BindIdentity::new(HARNESS, session);
        let body = json!({"method": method, "params": params}).to_string().into_bytes();
        let why = match consumer.call(target(), identity, body, call_options()).await {
            Ok(reply) => {
                let v: Value =
                    serde_json::from_slice(&reply).map_err(|e| format!("{method}: the reply is not JSON: {e}"))?;
                return Ok(v["result"].clone());
            }
            Err(CallError::Module(body)) => {
                let transient = body.detail.as_ref().and_then(|d| d.get("class")).is_some_and(|c| c == "transient");
                if !transient && !["session_busy", "lease_stale", "module_reloading"].contains(&body.code.as_str()) {
                    return Err(format!("{method} was refused: {body:?}"));
                }
                format!("{body:?}")
            }
            Err(other) => format!("{other:?}"),
        };
        if Instant::now() >= until {
            return Err(format!("{method} never answered while broca restarted: {why}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `run.status` until the run is terminal; its state.
async fn wait_terminal(consumer: &SubcConsumer, session: &str, run_id: &str) -> Result<String, Failure> {
    let until = Instant::now() + STEP;
    loop {
        let status = retry_op(consumer, session, "run.status", json!({"run_id": run_id})).await?;
        let state = status["state"].as_str().unwrap_or_default();
        if !["active", "pending", "paused", ""].contains(&state) {
            return Ok(state.to_owned());
        }
        if Instant::now() >= until {
            return Err(format!("run {run_id} is not terminal within {STEP:?}: {status}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn run_id_of(answer: &Value) -> Result<String, Failure> {
    answer["run_id"]
        .as_str()
        .map(String::from)
        .or_else(|| answer["submission_id"].as_str().map(|s| format!("run-{s}")))
        .ok_or_else(|| format!("session.send answered {answer}"))
}

async fn resubscribe_across_kills(
    consumer: &SubcConsumer,
    conn_file: &std::path::Path,
    base_session: &str,
    model: &Value,
) -> Result<(), Failure> {
    let url = mock_url(conn_file)?;
    if broca_pid(conn_file).is_none() {
        return Err(format!("no live `broca --subc {}` process to kill", conn_file.display()));
    }
    let session = format!("{base_session}-resub");
    let target_head = std::sync::Arc::new(std::sync::Mutex::new(None));
    let abort = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let follower = tokio::spawn(follow(
        connect(conn_file, STEP).await?,
        session.clone(),
        std::sync::Arc::clone(&target_head),
        std::sync::Arc::clone(&abort),
    ));
    let driven = async {
        let mut killed = Vec::new();
        for k in 1..=KILLS {
            let mut events: Vec<Value> = (0..12).map(|i| json!({"text": format!("k{k}w{i} ")})).collect();
            events = events.into_iter().flat_map(|e| [e, json!({"delay_ms": 100})]).collect();
            events.push(json!({"finish": "stop"}));
            let recorded = mock_recorded(&url)?;
            let (status, body) = mock_http(
                &url,
                "POST",
                "/_mock/lanes/default/script",
                &json!({"responses": [{"events": events}]}).to_string(),
            )?;
            if status != 204 {
                return Err(format!("broca-mock refused the script ({status}): {body}"));
            }
            let params =
                json!({"prompt": format!("stream slowly ({k})"), "model": model, "send_id": format!("kill-{k}")});
            let doomed = run_id_of(&retry_op(consumer, &session, "session.send", params).await?)?;
            let until = Instant::now() + STEP;
            while mock_recorded(&url)? <= recorded {
                if Instant::now() >= until {
                    return Err(format!("kill {k}: the model request of {doomed} never reached broca-mock"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(150 + 100 * u64::from(k))).await;
            let old = broca_pid(conn_file).ok_or_else(|| format!("kill {k}: broca's pid is gone"))?;
            // SAFETY: kill(2) on the broca process this rig's daemon supervises.
            if unsafe { libc::kill(old, libc::SIGKILL) } != 0 {
                return Err(format!("kill {k}: SIGKILL to broca (pid {old}): {}", std::io::Error::last_os_error()));
            }
            let until = Instant::now() + RESPAWN;
            let pid = loop {
                match broca_pid(conn_file) {
                    Some(p) if p != old => break p,
                    _ if Instant::now() >= until => {
                        return Err(format!("kill {k}: broca was not respawned within {RESPAWN:?}"))
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            ready(consumer, RESPAWN).await?;
            eprintln!("subc-rig-check: kill {k}/{KILLS}: SIGKILLed broca {old} mid-run ({doomed}); respawned as {pid}");
            // Later units (the default reply), which also reopens the session.
            let params = json!({"prompt": format!("after kill {k}"), "model": model, "send_id": format!("after-{k}")});
            let after = run_id_of(&retry_op(consumer, &session, "session.send", params).await?)?;
            let sealed = wait_terminal(consumer, &session, &doomed).await?;
            let state = wait_terminal(consumer, &session, &after).await?;
            if state != "completed" {
                return Err(format!("kill {k}: the run after the respawn ended {state}"));
            }
            killed.push((doomed, sealed));
        }
        let page = retry_op(consumer, &session, "session.read", json!({"limit": 1})).await?;
        let head = cursor_of(&page["head"]).ok_or_else(|| format!("session.read has no head: {page}"))?;
        Ok::<_, Failure>((killed, head))
    };
    let driven = driven.await;
    match &driven {
        Ok((_, head)) => *target_head.lock().unwrap_or_else(|e| e.into_inner()) = Some(*head),
        Err(_) => abort.store(true, std::sync::atomic::Ordering::SeqCst),
    }
    let seen = follower.await.map_err(|e| format!("the follower task: {e}"))?;
    let (killed, head) = driven?;

    // The reference: a fresh replay from the start, up to the head.
    let identity = BindIdentity::new(HARNESS, session.as_str());
    let body = json!({"method": "session.subscribe", "params": {"from": "start"}}).to_string().into_bytes();
    let opts = SubscribeOptions { event_buffer: 100_000, ..SubscribeOptions::default() };
    let mut fresh_sub = consumer.subscribe(target(), identity, body, opts).await.map_err(|e| format!("{e:?}"))?;
    let mut fresh: Vec<(Cursor, Value)> = Vec::new();
    while fresh.last().is_none_or(|(c, _)| *c < head) {
        let Some(frame) = next_frame(&mut fresh_sub, STEP).await? else {
            return Err(format!(
                "the fresh replay stopped at {:?} before the head {head:?}",
                fresh.last().map(|u| u.0)
            ));
        };
        if frame["kind"] == "control" {
            fresh.push((cursor_of(&frame["cursor"]).unwrap_or_default(), frame["unit"].clone()));
        }
    }
    let _ = fresh_sub.unsubscribe();

    let mut problems = seen.disorder.iter().map(|d| format!("out of order: {d}")).collect::<Vec<_>>();
    problems.extend(seen.stuck.clone());
    let label = |c: &Cursor, u: &Value| {
        format!("({},{}) {}[{}]", c.0, c.1, u["type"].as_str().unwrap_or("?"), u["run_id"].as_str().unwrap_or("-"))
    };
    let got: std::collections::BTreeMap<Cursor, &Value> = seen.units.iter().map(|(c, u)| (*c, u)).collect();
    let missing: Vec<String> = fresh.iter().filter(|(c, _)| !got.contains_key(c)).map(|(c, u)| label(c, u)).collect();
    if !missing.is_empty() {
        problems.push(format!("{} durable unit(s) never arrived: {}", missing.len(), missing.join(", ")));
    }
    let want: std::collections::BTreeMap<Cursor, &Value> = fresh.iter().map(|(c, u)| (*c, u)).collect();
    let extra: Vec<String> =
        seen.units.iter().filter(|(c, _)| !want.contains_key(c)).map(|(c, u)| label(c, u)).collect();
    if !extra.is_empty() {
        problems.push(format!("{} unit(s) not in the fresh replay: {}", extra.len(), extra.join(", ")));
    }
    if let Some((c, _)) = fresh.iter().find(|(c, u)| got.get(c).is_some_and(|g| g != &u)) {
        problems.push(format!("the unit at {c:?} differs: got {}, the fresh replay has {}", got[c], want[c]));
    }
    for (run, sealed) in &killed {
        for ty in ["error", "run_finished"] {
            let has =
                |units: &[(Cursor, Value)]| units.iter().any(|(_, u)| u["type"] == ty && u["run_id"] == json!(run));
            if !has(&fresh) {
                problems.push(format!("the killed run {run} ({sealed}) has no `{ty}` unit even in the fresh replay"));
            } else if !has(&seen.units) {
                problems.push(format!("the killed run {run}'s seal unit `{ty}` never arrived"));
            }
        }
    }
    eprintln!(
        "subc-rig-check: the follower got {} of {} durable units over {} subscribes",
        seen.units.len(),
        fresh.len(),
        seen.subscribes
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// A reader's handoff (llm-runner §7): `session.read` while a turn streams, then
/// `session.subscribe {from: <the page's head>}`; the control units it gets must be exactly the
/// durable units after that head (no gap, no duplicate), as a `from: "start"` subscription of
/// the same session sees them.
async fn handoff_under_a_running_turn(
    conn_file: &std::path::Path,
    consumer: &SubcConsumer,
    base_session: &str,
    model: &Value,
    checks: &mut Checks,
) -> Result<(), Failure> {
    let url = mock_url(conn_file)?;
    let session = format!("{base_session}-handoff");
    let mut events: Vec<Value> = (0..10).map(|i| json!({"text": format!("w{i} ")})).collect();
    events = events.into_iter().flat_map(|e| [e, json!({"delay_ms": 60})]).collect();
    events.push(json!({"finish": "stop"}));
    let script = json!({"responses": [{"events": events}]}).to_string();
    let (status, body) = mock_http(&url, "POST", "/_mock/lanes/default/script", &script)?;
    if status != 204 {
        return Err(format!("broca-mock refused the script ({status}): {body}"));
    }
    let recorded = mock_recorded(&url)?;
    let sent =
        ok_op(consumer, &session, "session.send", json!({"prompt": "stream for a handoff", "model": model})).await?;
    let run_id = run_id_of(&sent)?;
    let until = Instant::now() + STEP;
    while mock_recorded(&url)? <= recorded && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let page = ok_op(consumer, &session, "session.read", json!({})).await?;
    let head = page["head"].clone();
    let identity = BindIdentity::new(HARNESS, session.as_str());
    let body = json!({"method": "session.subscribe", "params": {"from": head}}).to_string().into_bytes();
    let mut from_head = consumer
        .subscribe(target(), identity.clone(), body, SubscribeOptions::default())
        .await
        .map_err(|e| format!("session.subscribe from the read's head: {e:?}"))?;
    let after = until_finished(&mut from_head, &run_id, "").await?;
    let _ = from_head.unsubscribe();
    let body = json!({"method": "session.subscribe", "params": {"from": "start"}}).to_string().into_bytes();
    let mut from_start = consumer
        .subscribe(target(), identity, body, SubscribeOptions::default())
        .await
        .map_err(|e| format!("session.subscribe from start: {e:?}"))?;
    let all = until_finished(&mut from_start, &run_id, "").await?;
    let _ = from_start.unsubscribe();
    let key = |c: &Value| (c["wal_seq"].as_u64().unwrap_or(0), c["sub_index"].as_u64().unwrap_or(0));
    let head_key = key(&head);
    let expected: Vec<(u64, u64)> = all.control.iter().map(|(c, _)| key(c)).filter(|c| *c > head_key).collect();
    let got: Vec<(u64, u64)> = after.control.iter().map(|(c, _)| key(c)).collect();
    checks.ensure(
        "read -> subscribe(from: head) under a running turn: exactly the durable units after the head",
        !head.is_null() && !got.is_empty() && got == expected,
        || format!("head {head}; after it {got:?}; durable {expected:?}"),
    )
}
