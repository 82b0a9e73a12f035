//! Crash-cut tests (DESIGN.md §6): a real child process (this test binary, re-executed) drives a
//! lineage through the public API, is killed with SIGKILL at a named point or at a random moment,
//! and the parent reopens the lineage and checks the durability invariants:
//!
//! - every commit the child reported (`COMMITTED <seq>`, printed after the fsync) is present, and
//!   every control unit readable before the reopen is present, unchanged, after it;
//! - the bytes before a torn tail are never rewritten; the torn tail is truncated;
//! - cursors strictly increase; a run id starts once and finishes at most once; at most one
//!   episode is unfinished and it is the last; after a reopen none is open (only paused);
//! - an orphan is sealed exactly once, `interrupted` with the crash diagnostic (or `cancelled`
//!   after a durable cancel request, unless an interrupt made it: then it stays `interrupted`),
//!   its dispatched calls get unknown-outcome results and are
//!   never dispatched again;
//! - the queue is unambiguous: each submission ends pending, retracted or consumed (by its own
//!   run, or as a steer delivered into the open run at a step entry), never two of them; runs
//!   drain the oldest interrupt first, else the oldest send; the reopened queue equals
//!   Queued − Retracted − consumed in FIFO order;
//! - the replay state reached from the store checkpoint equals a full replay of the WAL, the head
//!   cursor is the last durable unit, and the transcript read through the store equals the one
//!   derived from the WAL;
//! - a finished episode never prevents a new one.
//!
//! The child is `child_main` below; it does nothing unless `BROCA_CRASH_SCENARIO` is set. The
//! run index (`run-index.db` rows and export facts) is checked against the WAL too.
//!
//! Three regression tests pin defects these tests found (and that were fixed): a step over an
//! unresolved call (`step_over_unresolved_call`), a retract answer that was not durable
//! (`retract_answer_is_durable`) and a lease epoch reset by a kill (`lease_epoch_survives_…`).
//!
//! `random_kills` honours `BROCA_CRASH_RANDOM_SEED` and `BROCA_CRASH_KILLS`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use broca::lineage::projection::{self, ControlUnit, Cursor};
use broca::lineage::read;
use broca::lineage::reader::Reader;
use broca::lineage::{Lineage, LineageError, RetractOutcome, Shared};
use broca::message::{Message, Part, Role, StepUsage};
use broca::record::{
    self, CancelAt, ErrorClass, FinishReason, Origin, PauseReason, ProviderError, Record, RequestIdentity, RunStarted,
    FEATURE_RUN_CANCEL_AT, ORPHAN_PROVIDER_CODE,
};
use broca::replay::{Effect, Replay, Resolution};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wal::{self, FrameKind, WalError};
use serde_json::{json, Value};

#[path = "crash_cut/power.rs"]
mod power;

// ---------------------------------------------------------------------------------------------
// Shared by parent and child
// ---------------------------------------------------------------------------------------------

const ENV_SCENARIO: &str = "BROCA_CRASH_SCENARIO";
const ENV_ROOT: &str = "BROCA_CRASH_ROOT";
const ENV_VARIANT: &str = "BROCA_CRASH_VARIANT";
const ENV_SEED: &str = "BROCA_CRASH_SEED";
const ENV_ITER: &str = "BROCA_CRASH_ITER";

fn key() -> SessionKey {
    SessionKey::new("/proj", "crash", "s1")
}

/// xorshift64*: a tiny deterministic PRNG.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn is_child() -> bool {
    std::env::var_os(ENV_SCENARIO).is_some()
}

/// A marker line for the parent (`@@` finds it even after libtest's `test child_main ... `).
fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n@@{msg}");
    let _ = out.flush();
}

/// Commits; in the child, reports the durable seq after the fsync returned.
fn commit(l: &mut Lineage) {
    l.commit().expect("commit");
    report_committed(l);
}

fn report_committed(l: &Lineage) {
    if is_child() {
        say(&format!("COMMITTED {}", l.durable_seq()));
    }
}

fn run_started(run_id: &str, sub: Option<&str>) -> Record {
    Record::RunStarted(Box::new(RunStarted {
        run_id: run_id.into(),
        submission_id: sub.map(Into::into),
        origin: Origin::Fresh,
        config: record::Frozen::Unreadable(
            json!({"route": "mock", "model": "m1", "max_steps": 8, "system": format!("config of {run_id}")}),
        ),
        input: Message::user_text(format!("hello from {run_id}")),
        title: None,
        started_at_ms: 1_000,
        auth_selection: None,
        owner: None,
    }))
}

fn step_started(run_id: &str, step: u64) -> Record {
    Record::StepStarted { run_id: run_id.into(), step, at_ms: 1_000 + step, code_assist_project: None }
}

fn assistant(run_id: &str, step: u64, calls: &[String]) -> Message {
    let mut content = vec![Part::Text { text: format!("{run_id} step {step}") }];
    for c in calls {
        content.push(Part::ToolCall { tool_call_id: c.clone(), tool_name: "echo".into(), input: json!({"call": c}) });
    }
    Message { role: Role::Assistant, content, origin: None, delivered_as: None, sender: None, client_message_id: None }
}

fn model_step(run_id: &str, step: u64, calls: &[String]) -> Record {
    Record::ModelStepFinished {
        run_id: run_id.into(),
        step,
        finish_reason: if calls.is_empty() { "stop" } else { "tool_calls" }.into(),
        usage: StepUsage { input_tokens: Some(10 + step), output_tokens: Some(3), ..StepUsage::default() },
        message: assistant(run_id, step, calls),
        provider: "mock".into(),
        model: "m1".into(),
        variant: None,
        at_ms: None,
        service_tier_applied: None,
        service_tier_served: None,
    }
}

fn intent(run_id: &str, step: u64, call: &str) -> Record {
    Record::ToolDispatchIntent {
        run_id: run_id.into(),
        step,
        tool_call_id: call.into(),
        tool_name: "echo".into(),
        module_id: None,
        call_key: format!("key-{call}"),
        arguments: Some(format!("{{\"path\":\"{call}.txt\"}}")),
        at_ms: None,
    }
}

fn ok_output() -> Value {
    json!({"kind": "text", "text": "ok"})
}

fn tool_ok(run_id: &str, step: u64, call: &str) -> Record {
    Record::ToolResult {
        run_id: run_id.into(),
        step,
        tool_call_id: call.into(),
        output: ok_output(),
        is_error: false,
        outcome: Some(record::CallOutcome::Ok),
        at_ms: None,
        refused: None,
    }
}

fn auth_error() -> ProviderError {
    ProviderError::new(ErrorClass::AuthRequired, Some("auth_required".into()), "credential expired".into(), Some(401))
}

/// The records of a two-step episode after its `RunStarted` (one tool call, then a stop).
fn episode_body(run_id: &str) -> Vec<Record> {
    let c1 = format!("{run_id}-c1");
    vec![
        step_started(run_id, 1),
        model_step(run_id, 1, std::slice::from_ref(&c1)),
        intent(run_id, 1, &c1),
        tool_ok(run_id, 1, &c1),
        step_started(run_id, 2),
        model_step(run_id, 2, &[]),
    ]
}

/// The messages that episode contributes to the transcript, in ordinal order.
fn episode_messages(run_id: &str) -> Vec<Message> {
    let c1 = format!("{run_id}-c1");
    vec![
        Message::user_text(format!("hello from {run_id}")),
        assistant(run_id, 1, std::slice::from_ref(&c1)),
        Message::of(Role::Tool, vec![Part::ToolResult { tool_call_id: c1, output: ok_output(), is_error: false }]),
        assistant(run_id, 2, &[]),
    ]
}

/// Appends, finishes and commits a whole episode.
fn complete_episode(l: &mut Lineage, run_id: &str, sub: Option<&str>) {
    l.append(&run_started(run_id, sub)).expect("RunStarted");
    for r in episode_body(run_id) {
        l.append(&r).expect("episode record");
    }
    l.finish_run(run_id, FinishReason::Completed, None, vec![]).expect("finish");
    commit(l);
}

/// The `i`-th record (from 1) of the group-commit workload: one long episode of tool steps.
fn group_record(i: u64) -> Record {
    const RUN: &str = "run-g";
    if i == 1 {
        return run_started(RUN, None);
    }
    let k = i - 2;
    let step = k / 4 + 1;
    let call = format!("{RUN}-s{step}-c1");
    match k % 4 {
        0 => step_started(RUN, step),
        1 => model_step(RUN, step, std::slice::from_ref(&call)),
        2 => intent(RUN, step, &call),
        _ => tool_ok(RUN, step, &call),
    }
}

// ---------------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------------

fn hang() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn ready_and_hang() -> ! {
    say("READY");
    hang()
}

/// The child process: runs the scenario named by `BROCA_CRASH_SCENARIO`, says `READY` and waits
/// to be killed. Without the variable (an ordinary test run) it does nothing.
#[test]
fn child_main() {
    let Ok(scenario) = std::env::var(ENV_SCENARIO) else { return };
    let root = PathBuf::from(std::env::var(ENV_ROOT).expect("BROCA_CRASH_ROOT"));
    let variant = std::env::var(ENV_VARIANT).unwrap_or_default();
    let shared = Shared::open(StateRoot::at(&root).expect("state root")).expect("shared");
    let mut l = shared.open_lineage(&key()).expect("open lineage");
    say(&format!("OPENED sealed={}", l.open_report().sealed_orphan.as_deref().unwrap_or("-")));
    let l = &mut l;
    match scenario.as_str() {
        "after_append_before_fsync" => {
            complete_episode(l, "run-1", None);
            l.append(&run_started("run-2", None)).unwrap();
            l.append(&step_started("run-2", 1)).unwrap();
            l.append(&model_step("run-2", 1, &[])).unwrap();
        }
        "after_fsync_before_reply" => {
            complete_episode(l, "run-1", None);
            l.append_commit(&run_started("run-2", None)).unwrap();
            report_committed(l);
        }
        "mid_frame" => {
            let (kind, open) = variant.split_once('/').expect("variant kind/open");
            complete_episode(l, "run-1", None);
            let torn_payload = if open == "open" {
                let c1 = "run-2-c1".to_string();
                l.append(&run_started("run-2", None)).unwrap();
                l.append(&step_started("run-2", 1)).unwrap();
                l.append(&model_step("run-2", 1, std::slice::from_ref(&c1))).unwrap();
                l.append(&intent("run-2", 1, &c1)).unwrap();
                commit(l);
                tool_ok("run-2", 1, &c1).encode()
            } else {
                run_started("run-torn", None).encode()
            };
            write_torn_tail(l, kind, &torn_payload);
        }
        "interrupt_acknowledged" => {
            // A run mid-step; a plain send queued behind it; then an interrupt, durable as the
            // module acknowledges it: queued first, then the running run's cancel.
            complete_episode(l, "run-1", None);
            l.append(&run_started("run-2", None)).unwrap();
            l.append(&step_started("run-2", 1)).unwrap();
            commit(l);
            l.enqueue("sub-plain", Message::user_text("plain"), request("plain")).unwrap();
            l.enqueue("sub-int", Message::user_text("interrupt"), request_as("int", "interrupt", None)).unwrap();
            l.request_cancel("run-2", CancelAt::Now).unwrap();
            report_committed(l);
        }
        "between_queued_and_run_started" => {
            complete_episode(l, "run-1", None);
            l.enqueue("sub-a", Message::user_text("queued a"), request("a")).unwrap();
            report_committed(l);
            l.enqueue("sub-b", Message::user_text("queued b"), request("b")).unwrap();
            report_committed(l);
            // The coordinator began consuming sub-a: appended, not yet durable.
            l.append(&run_started("run-sub-a", Some("sub-a"))).unwrap();
        }
        "retract_race" => {
            complete_episode(l, "run-1", None);
            for s in ["sub-a", "sub-b", "sub-c"] {
                l.enqueue(s, Message::user_text(format!("queued {s}")), request(s)).unwrap();
                report_committed(l);
            }
            assert_eq!(l.retract("sub-a").unwrap().0, RetractOutcome::Retracted);
            report_committed(l);
            assert_eq!(l.retract("sub-a").unwrap().0, RetractOutcome::NotPending, "retracted twice");
            l.append(&run_started("run-sub-b", Some("sub-b"))).unwrap();
            if variant == "committed" {
                commit(l);
                assert_eq!(
                    l.retract("sub-b").unwrap().0,
                    RetractOutcome::NotPending,
                    "a consumed submission was retracted"
                );
            }
        }
        "inside_later_episode" | "killed_twice_1" => {
            complete_episode(l, "run-1", None);
            let c1 = "run-2-c1".to_string();
            l.append(&run_started("run-2", None)).unwrap();
            l.append(&step_started("run-2", 1)).unwrap();
            l.append(&model_step("run-2", 1, std::slice::from_ref(&c1))).unwrap();
            l.append(&intent("run-2", 1, &c1)).unwrap();
            commit(l);
        }
        "killed_twice_2" => {
            // This open sealed run-2 (see OPENED above); now crash inside episode 3.
            let c1 = "run-3-c1".to_string();
            l.append_commit(&run_started("run-3", None)).unwrap();
            report_committed(l);
            l.append(&step_started("run-3", 1)).unwrap();
            l.append(&model_step("run-3", 1, std::slice::from_ref(&c1))).unwrap();
            l.append(&intent("run-3", 1, &c1)).unwrap();
            commit(l);
        }
        "after_run_finished_with_queue" => {
            l.append_commit(&run_started("run-1", None)).unwrap();
            report_committed(l);
            l.enqueue("sub-a", Message::user_text("queued during run-1"), request("a")).unwrap();
            report_committed(l);
            for r in episode_body("run-1") {
                l.append(&r).unwrap();
            }
            l.finish_run("run-1", FinishReason::Completed, None, vec![]).unwrap();
            commit(l);
            for s in ["sub-b", "sub-c"] {
                l.enqueue(s, Message::user_text(format!("queued {s}")), request(s)).unwrap();
                report_committed(l);
            }
        }
        "paused_auth" => {
            complete_episode(l, "run-1", None);
            l.append(&run_started("run-2", None)).unwrap();
            l.append(&step_started("run-2", 1)).unwrap();
            l.append(&Record::RunPaused {
                run_id: "run-2".into(),
                reason: PauseReason::AuthRequired,
                error: Some(auth_error()),
            })
            .unwrap();
            commit(l);
            l.enqueue("sub-a", Message::user_text("queued while paused"), request("a")).unwrap();
            report_committed(l);
        }
        "cancel_requested_at_boundary" => {
            let at = if variant == "now" { CancelAt::Now } else { CancelAt::StepBoundary };
            complete_episode(l, "run-1", None);
            let (c1, c2) = ("run-2-c1".to_string(), "run-2-c2".to_string());
            l.append(&run_started("run-2", None)).unwrap();
            l.append(&step_started("run-2", 1)).unwrap();
            l.append(&model_step("run-2", 1, &[c1.clone(), c2.clone()])).unwrap();
            l.append(&intent("run-2", 1, &c1)).unwrap();
            l.append(&intent("run-2", 1, &c2)).unwrap();
            commit(l);
            l.append(&tool_ok("run-2", 1, &c1)).unwrap();
            commit(l);
            l.request_cancel("run-2", at).unwrap();
            report_committed(l);
        }
        "step_over_unresolved_call" => {
            complete_episode(l, "run-1", None);
            let c1 = "run-2-c1".to_string();
            l.append(&run_started("run-2", None)).unwrap();
            l.append(&step_started("run-2", 1)).unwrap();
            l.append(&model_step("run-2", 1, std::slice::from_ref(&c1))).unwrap();
            l.append(&intent("run-2", 1, &c1)).unwrap();
            commit(l);
            // The call was dispatched and has no result: a next step must not begin.
            match l.append(&step_started("run-2", 2)) {
                Ok(_) => {
                    say("STEP2 accepted");
                    commit(l);
                }
                Err(e) => say(&format!("STEP2 refused: {e}")),
            }
        }
        "retract_answer_durable" => {
            complete_episode(l, "run-1", None);
            l.enqueue("sub-a", Message::user_text("queued a"), request("a")).unwrap();
            report_committed(l);
            // Consumption appended, not yet durable; a retract arrives meanwhile.
            l.append(&run_started("run-sub-a", Some("sub-a"))).unwrap();
            let outcome = l.retract("sub-a").unwrap().0;
            say(&format!("RETRACT {outcome:?}"));
        }
        "group_commit_midway" => {
            let mut i = 0u64;
            loop {
                i += 1;
                if i > 200_000 {
                    hang();
                }
                l.append(&group_record(i)).unwrap();
                if i.is_multiple_of(10) {
                    commit(l);
                    if i == 30 {
                        // The parent kills on READY while this loop keeps committing.
                        say("READY");
                    }
                }
            }
        }
        "random" => child_random(l),
        other => panic!("unknown crash scenario {other}"),
    }
    ready_and_hang()
}

fn request(tag: &str) -> RequestIdentity {
    RequestIdentity {
        send_id: Some(format!("send-{tag}")),
        principal: Some("tester".into()),
        harness: None,
        received_at_ms: 7,
        config: Some(record::Frozen::Unreadable(json!({"model": "m1"}))),
        ..Default::default()
    }
}

/// A send with a delivery mode: a steer names the run it joins.
fn request_as(tag: &str, delivery: &str, target: Option<&str>) -> RequestIdentity {
    let delivery = match delivery {
        "steer" => Some(record::Delivery::Steer),
        "interrupt" => Some(record::Delivery::Interrupt),
        _ => None,
    };
    RequestIdentity { delivery, target_run: target.map(String::from), ..request(tag) }
}

/// Writes a torn frame at the WAL's tail with a raw second descriptor, as a crash in the middle
/// of a write would leave it, and reports `TORN <good_len> <torn_len>`.
fn write_torn_tail(l: &Lineage, kind: &str, payload: &[u8]) {
    let path = l.wal_path().to_path_buf();
    let good_len = fs::metadata(&path).unwrap().len();
    let mut frame = Vec::new();
    wal::frame::encode(&mut frame, FrameKind::Record, l.durable_seq() + 1, 1, &[], payload);
    let tail: Vec<u8> = match kind {
        "prefix5" => frame[..5].to_vec(),
        "prefix20" => frame[..20].to_vec(),
        "minus1" => frame[..frame.len() - 1].to_vec(),
        "badcrc" => {
            let mut f = frame.clone();
            *f.last_mut().unwrap() ^= 0x5a;
            f
        }
        "zeros" => vec![0u8; 4096],
        other => panic!("unknown torn kind {other}"),
    };
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&tail).unwrap();
    f.sync_data().unwrap();
    say(&format!("TORN {good_len} {}", tail.len()));
}

/// An endless random workload of valid transitions, committing at random points.
fn child_random(l: &mut Lineage) -> ! {
    let seed: u64 = std::env::var(ENV_SEED).expect("seed").parse().expect("seed");
    let iter: u64 = std::env::var(ENV_ITER).expect("iter").parse().expect("iter");
    let mut rng = Rng::new(seed);
    let mut n = 0u64;
    // Calls of the last model step not dispatched yet (this process planned them).
    let mut planned: VecDeque<String> = VecDeque::new();
    for _ in 0..50_000 {
        let st = l.state().clone();
        let mut committed = false;
        let enqueue_as = |l: &mut Lineage, n: &mut u64, delivery: &str, target: Option<&str>| {
            *n += 1;
            let sub = format!("s{iter}-{n}");
            l.enqueue(&sub, Message::user_text(format!("queued {sub}")), request_as(&sub, delivery, target)).unwrap();
        };
        let enqueue = |l: &mut Lineage, n: &mut u64| enqueue_as(l, n, "queue", None);
        match st.resolution() {
            Resolution::Empty | Resolution::Idle { .. } => {
                let r = rng.below(100);
                if r < 15 {
                    enqueue(l, &mut n);
                    committed = true;
                } else if r < 22 && !st.queue.is_empty() {
                    let sub = st.queue[rng.below(st.queue.len() as u64) as usize].submission_id.clone();
                    assert_eq!(l.retract(&sub).unwrap().0, RetractOutcome::Retracted);
                    committed = true;
                } else {
                    let (run_id, sub) = if !st.queue.is_empty() && rng.below(100) < 60 {
                        // As the actor drains: the oldest interrupt, else the oldest send.
                        let sub = st.next_to_start().expect("queued").submission_id.clone();
                        (format!("run-{sub}"), Some(sub))
                    } else {
                        n += 1;
                        (format!("r{iter}-{n}"), None)
                    };
                    l.append(&run_started(&run_id, sub.as_deref())).unwrap();
                    planned.clear();
                }
            }
            Resolution::Paused { run_id, .. } => {
                let r = rng.below(100);
                if r < 55 {
                    l.append(&Record::RunResumed { run_id }).unwrap();
                } else if r < 75 {
                    l.finish_run(&run_id, FinishReason::Cancelled, None, vec![]).unwrap();
                } else if r < 90 {
                    enqueue(l, &mut n);
                    committed = true;
                } else {
                    l.request_cancel(&run_id, CancelAt::StepBoundary).unwrap();
                    committed = true;
                }
            }
            Resolution::Resume { run_id } => {
                let e = st.last.as_ref().unwrap();
                let indeterminate: Vec<String> =
                    st.indeterminate_calls().iter().map(|c| c.tool_call_id.clone()).collect();
                if e.step_open {
                    if rng.below(100) < 6 {
                        let rec =
                            Record::RunPaused { run_id, reason: PauseReason::AuthRequired, error: Some(auth_error()) };
                        l.append(&rec).unwrap();
                    } else {
                        let k = if e.step >= 4 { 0 } else { rng.below(4) };
                        let calls: Vec<String> = (1..=k).map(|j| format!("{run_id}-s{}-c{j}", e.step)).collect();
                        l.append(&model_step(&run_id, e.step, &calls)).unwrap();
                        planned = calls.into();
                    }
                } else if let Some(c) = planned.pop_front() {
                    l.append(&intent(&run_id, e.step, &c)).unwrap();
                    if planned.is_empty() {
                        // Intents are durable before the batch is dispatched.
                        l.commit().unwrap();
                        committed = true;
                    }
                } else if let Some(c) = indeterminate.first() {
                    let is_error = rng.below(5) == 0;
                    let rec = Record::ToolResult {
                        run_id,
                        step: e.step,
                        tool_call_id: c.clone(),
                        output: if is_error { json!({"kind": "error", "message": "boom"}) } else { ok_output() },
                        is_error,
                        outcome: Some(if is_error { record::CallOutcome::Error } else { record::CallOutcome::Ok }),
                        at_ms: None,
                        refused: None,
                    };
                    l.append(&rec).unwrap();
                } else if e.cancel.is_some() {
                    l.finish_run(&run_id, FinishReason::Cancelled, None, vec![]).unwrap();
                } else if e.final_step_finish_reason.as_deref() == Some("stop") {
                    if rng.below(10) == 0 {
                        let err = ProviderError::new(
                            ErrorClass::Permanent,
                            Some("bad_request".into()),
                            "refused".into(),
                            Some(400),
                        );
                        l.finish_run(&run_id, FinishReason::Error, Some(err), vec![]).unwrap();
                    } else {
                        l.finish_run(&run_id, FinishReason::Completed, None, vec![]).unwrap();
                    }
                } else {
                    let r = rng.below(100);
                    if r < 5 {
                        let at = if rng.below(2) == 0 { CancelAt::StepBoundary } else { CancelAt::Now };
                        l.request_cancel(&run_id, at).unwrap();
                        committed = true;
                    } else if r < 9 {
                        let rec = Record::RunPaused { run_id, reason: PauseReason::AuthRequired, error: None };
                        l.append(&rec).unwrap();
                    } else if r < 11 {
                        enqueue(l, &mut n);
                        committed = true;
                    } else if r < 13 {
                        enqueue_as(l, &mut n, "steer", Some(&run_id));
                        committed = true;
                    } else if r < 14 {
                        // An interrupt: queued first, then the running run is cancelled.
                        enqueue_as(l, &mut n, "interrupt", None);
                        l.request_cancel(&run_id, CancelAt::Now).unwrap();
                        committed = true;
                    } else if r < 17 && !st.queue.is_empty() {
                        let sub = st.queue[rng.below(st.queue.len() as u64) as usize].submission_id.clone();
                        assert_eq!(l.retract(&sub).unwrap().0, RetractOutcome::Retracted);
                        committed = true;
                    } else if r < 19 {
                        l.finish_run(&run_id, FinishReason::MaxSteps, None, vec![]).unwrap();
                    } else {
                        // Step entry: steers joining this run land first.
                        let steers: Vec<String> = st.pending_steers(&run_id).map(|p| p.submission_id.clone()).collect();
                        for sub in steers {
                            let message = Message::user_text(format!("queued {sub}"));
                            let rec =
                                Record::Steered { run_id: run_id.clone(), submission_id: sub, message, title: None };
                            l.append(&rec).unwrap();
                        }
                        l.append(&step_started(&run_id, e.step + 1)).unwrap();
                    }
                }
            }
        }
        if committed {
            report_committed(l);
        } else if rng.below(100) < 35 {
            commit(l);
        }
    }
    commit(l);
    ready_and_hang()
}

// ---------------------------------------------------------------------------------------------
// The parent: running and killing children
// ---------------------------------------------------------------------------------------------

static CHILDREN: AtomicU64 = AtomicU64::new(0);
const CHILD_TIMEOUT: Duration = Duration::from_secs(30);

struct TestDir {
    dir: tempfile::TempDir,
    state: PathBuf,
}

impl TestDir {
    fn new() -> TestDir {
        let dir = tempfile::Builder::new().prefix("broca-crash-").tempdir().expect("tempdir");
        let state = dir.path().join("state");
        TestDir { dir, state }
    }

    fn wal(&self) -> PathBuf {
        self.state.join("wal").join(format!("{}.wal", key().addr()))
    }

    fn open(&self) -> (Shared, Lineage) {
        let shared = Shared::open(StateRoot::at(&self.state).expect("state root")).expect("shared");
        let l = shared.open_lineage(&key()).unwrap_or_else(|e| panic!("reopen failed: {e}"));
        (shared, l)
    }
}

enum KillAt {
    /// When the child says READY.
    Ready,
    /// After this many `COMMITTED` lines, plus a pause.
    Commits(usize, Duration),
}

/// What a killed child said.
struct ChildOut {
    markers: Vec<String>,
    /// From spawn to the child's `OPENED` line, when the parent saw it before the kill.
    opened_after: Option<Duration>,
}

impl ChildOut {
    /// The highest seq the child reported durable (0 when none).
    fn committed(&self) -> u64 {
        self.markers
            .iter()
            .filter_map(|m| m.strip_prefix("COMMITTED "))
            .map(|s| s.trim().parse::<u64>().expect("COMMITTED seq"))
            .max()
            .unwrap_or(0)
    }

    fn value(&self, prefix: &str) -> Option<&str> {
        self.markers.iter().find_map(|m| m.strip_prefix(prefix))
    }
}

/// Runs the child scenario on `t`'s state root and SIGKILLs it at `kill`.
fn run_child(t: &TestDir, scenario: &str, variant: &str, extra: &[(&str, String)], kill: KillAt) -> ChildOut {
    let n = CHILDREN.fetch_add(1, Ordering::Relaxed);
    let err_path = t.dir.path().join(format!("child-{n}.stderr"));
    let err_file = fs::File::create(&err_path).expect("stderr file");
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env(ENV_SCENARIO, scenario)
        .env(ENV_ROOT, &t.state)
        .env(ENV_VARIANT, variant)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err_file));
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let spawned = Instant::now();
    let mut child = cmd.spawn().expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    if let Some(i) = line.find("@@") {
                        let _ = tx.send(line[i + 2..].trim_end().to_string());
                    }
                }
            }
        }
    });
    let stderr_of = |p: &Path| fs::read_to_string(p).unwrap_or_default();
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut markers = Vec::new();
    let (want_ready, want_commits, pause) = match kill {
        KillAt::Ready => (true, usize::MAX, Duration::ZERO),
        KillAt::Commits(k, pause) => (false, k, pause),
    };
    let mut commits = 0usize;
    let mut ready = false;
    let mut opened_after = None;
    while !(if want_ready { ready } else { commits >= want_commits }) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(m) => {
                ready |= m == "READY";
                if m.starts_with("OPENED") {
                    opened_after = Some(spawned.elapsed());
                }
                commits += usize::from(m.starts_with("COMMITTED "));
                markers.push(m);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "child {scenario}/{variant} stalled for {CHILD_TIMEOUT:?}; markers {markers:?}; stderr:\n{}",
                    stderr_of(&err_path)
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().expect("wait");
                panic!(
                    "child {scenario}/{variant} ended by itself ({status}); markers {markers:?}; stderr:\n{}",
                    stderr_of(&err_path)
                );
            }
        }
    }
    if !pause.is_zero() {
        std::thread::sleep(pause);
    }
    child.kill().expect("kill child");
    let status = child.wait().expect("wait child");
    assert_eq!(
        status.signal(),
        Some(9),
        "child {scenario}/{variant} was not killed by SIGKILL ({status}); stderr:\n{}",
        stderr_of(&err_path)
    );
    reader.join().expect("reader thread");
    markers.extend(rx.try_iter());
    ChildOut { markers, opened_after }
}

// ---------------------------------------------------------------------------------------------
// The parent: the model a WAL must satisfy
// ---------------------------------------------------------------------------------------------

/// Per-run facts for the invariant walk.
#[derive(Clone, Default, Debug)]
struct RunFacts {
    submission: Option<String>,
    finished: u32,
    errors: u32,
    reason: Option<FinishReason>,
}

/// Walks records in WAL order and asserts the lineage invariants as it goes.
#[derive(Clone, Default)]
struct Walker {
    last_cursor: Option<Cursor>,
    runs: BTreeMap<String, RunFacts>,
    /// The last episode while it is not finished.
    open_run: Option<String>,
    paused: bool,
    cancel: bool,
    /// Calls of the open run: dispatched, and those with a result.
    dispatched: BTreeSet<String>,
    resulted: BTreeSet<String>,
    /// Unknown-outcome results since the last non-result record of the open run.
    unknown: Vec<String>,
    /// Pending submissions with their delivery (`queue`, `steer`, `interrupt`), in FIFO order.
    pending: VecDeque<(String, String)>,
    queued: BTreeSet<String>,
    retracted: BTreeSet<String>,
    consumed: BTreeMap<String, String>,
    all_calls: BTreeSet<String>,
    cancel_feature_seen: bool,
    /// Counters for reporting.
    steered: u64,
    seals_interrupted: u64,
    seals_cancelled: u64,
    unknown_results: u64,
}

impl Walker {
    fn feed(&mut self, seq: u64, rec: &Record, units: &[ControlUnit]) {
        for u in units {
            assert!(
                self.last_cursor.is_none_or(|c| u.cursor > c),
                "cursor {:?} does not follow {:?}",
                u.cursor,
                self.last_cursor
            );
            self.last_cursor = Some(u.cursor);
            let body = u.body();
            let ty = body["type"].as_str().unwrap_or_default();
            if ty == "error" {
                let run = body["run_id"].as_str().unwrap_or_default();
                assert_eq!(Some(run), self.open_run.as_deref(), "seq {seq}: error unit for a run that is not open");
                assert_eq!(body["error"]["provider_code"], json!(ORPHAN_PROVIDER_CODE), "seq {seq}");
                self.runs.entry(run.to_string()).or_default().errors += 1;
            }
        }
        let in_open = |run_id: &str, this: &Walker| {
            assert_eq!(
                Some(run_id),
                this.open_run.as_deref(),
                "seq {seq}: {rec:?} names a run that is not the open one"
            );
        };
        if !matches!(rec, Record::ToolResult { .. } | Record::RunFinished { .. }) {
            assert!(
                self.unknown.is_empty(),
                "seq {seq}: unknown-outcome results not followed by the run's RunFinished"
            );
        }
        match rec {
            Record::RunStarted(r) => {
                assert!(!self.runs.contains_key(&r.run_id), "seq {seq}: run {} started twice", r.run_id);
                assert!(
                    self.open_run.is_none(),
                    "seq {seq}: run {} started while {:?} is unfinished",
                    r.run_id,
                    self.open_run
                );
                if let Some(sub) = &r.submission_id {
                    assert!(!self.retracted.contains(sub), "seq {seq}: retracted submission {sub} was consumed");
                    assert!(!self.consumed.contains_key(sub), "seq {seq}: submission {sub} consumed twice");
                    // The next episode is the oldest interrupt, else the oldest send (FIFO).
                    let next = self.pending.iter().position(|(_, d)| d == "interrupt").unwrap_or(0);
                    assert_eq!(
                        self.pending.get(next).map(|(s, _)| s),
                        Some(sub),
                        "seq {seq}: {sub} consumed out of order or not pending: {:?}",
                        self.pending
                    );
                    self.pending.remove(next);
                    self.consumed.insert(sub.clone(), r.run_id.clone());
                }
                self.runs
                    .insert(r.run_id.clone(), RunFacts { submission: r.submission_id.clone(), ..RunFacts::default() });
                self.open_run = Some(r.run_id.clone());
                self.paused = false;
                self.cancel = false;
                self.dispatched.clear();
                self.resulted.clear();
            }
            Record::StepStarted { run_id, .. } => {
                in_open(run_id, self);
                assert!(!self.paused, "seq {seq}: step record while paused");
                let unresolved: Vec<&String> = self.dispatched.difference(&self.resulted).collect();
                assert!(
                    unresolved.is_empty(),
                    "seq {seq}: a step started while dispatched calls have no result: {unresolved:?}"
                );
            }
            Record::ModelStepFinished { run_id, .. } => {
                in_open(run_id, self);
                assert!(!self.paused, "seq {seq}: step record while paused");
            }
            Record::ModelAttemptFinished(a) => in_open(&a.run_id, self),
            Record::ToolDispatchIntent { run_id, tool_call_id, .. } => {
                in_open(run_id, self);
                assert!(self.all_calls.insert(tool_call_id.clone()), "seq {seq}: call {tool_call_id} dispatched again");
                self.dispatched.insert(tool_call_id.clone());
            }
            Record::ToolResult { run_id, tool_call_id, outcome, is_error, .. } => {
                in_open(run_id, self);
                assert!(
                    self.dispatched.contains(tool_call_id),
                    "seq {seq}: result of {tool_call_id} without an intent"
                );
                assert!(self.resulted.insert(tool_call_id.clone()), "seq {seq}: second result of {tool_call_id}");
                if outcome.map(|o| o.as_str()) == Some("unknown") {
                    assert!(*is_error, "seq {seq}: an unknown outcome must be an error result");
                    self.unknown.push(tool_call_id.clone());
                    self.unknown_results += 1;
                } else {
                    assert!(self.unknown.is_empty(), "seq {seq}: a known result after unknown ones");
                }
            }
            Record::RunCancelRequested { run_id, .. } => {
                in_open(run_id, self);
                self.cancel = true;
                self.cancel_feature_seen = true;
            }
            Record::RunPaused { run_id, .. } => {
                in_open(run_id, self);
                assert!(!self.paused, "seq {seq}: paused twice");
                self.paused = true;
            }
            Record::RunResumed { run_id } => {
                in_open(run_id, self);
                assert!(self.paused, "seq {seq}: resumed but not paused");
                self.paused = false;
            }
            Record::RunFinished { run_id, reason, error, indeterminate_tool_calls, .. } => {
                in_open(run_id, self);
                let facts = self.runs.get_mut(run_id).expect("started");
                facts.finished += 1;
                assert_eq!(facts.finished, 1, "seq {seq}: run {run_id} finished twice");
                facts.reason = Some(*reason);
                let orphan = error.as_ref().is_some_and(|e| e.provider_code.as_deref() == Some(ORPHAN_PROVIDER_CODE));
                // No workload here writes `interrupted` itself: only sealing does, with the diagnostic.
                assert_eq!(
                    *reason == FinishReason::Interrupted,
                    orphan,
                    "seq {seq}: run {run_id} {reason:?} error {error:?}"
                );
                assert_eq!(facts.errors, u32::from(orphan), "seq {seq}: run {run_id}: error units vs diagnostic");
                // An interrupt's cancel is sealed as the interrupted run it is (spec §4).
                let interrupting = self.pending.iter().any(|(_, d)| d == "interrupt");
                if self.cancel && !(orphan && interrupting) {
                    assert_eq!(
                        *reason,
                        FinishReason::Cancelled,
                        "seq {seq}: run {run_id} had a durable cancel request"
                    );
                }
                assert_eq!(indeterminate_tool_calls, &self.unknown, "seq {seq}: indeterminate calls of {run_id}");
                let unresolved: Vec<&String> = self.dispatched.difference(&self.resulted).collect();
                if orphan || (self.cancel && !self.unknown.is_empty()) {
                    assert!(
                        unresolved.is_empty(),
                        "seq {seq}: sealed {run_id} left calls without a result: {unresolved:?}"
                    );
                }
                if orphan {
                    self.seals_interrupted += 1;
                } else if !self.unknown.is_empty() {
                    self.seals_cancelled += 1;
                }
                self.unknown.clear();
                self.open_run = None;
                self.paused = false;
            }
            Record::Queued { submission_id, request, .. } => {
                assert!(
                    self.queued.insert(submission_id.clone()),
                    "seq {seq}: submission {submission_id} queued twice"
                );
                self.pending.push_back((submission_id.clone(), request.delivery().as_str().to_string()));
            }
            Record::Steered { run_id, submission_id, .. } => {
                in_open(run_id, self);
                let at = self.pending.iter().position(|(s, d)| s == submission_id && d == "steer");
                assert!(at.is_some(), "seq {seq}: steer {submission_id} was not a pending steer");
                self.pending.remove(at.unwrap());
                assert!(self.consumed.insert(submission_id.clone(), run_id.clone()).is_none());
                self.steered += 1;
                let unresolved: Vec<&String> = self.dispatched.difference(&self.resulted).collect();
                assert!(unresolved.is_empty(), "seq {seq}: a steer between a call and its result");
            }
            Record::Retracted { submission_id } => {
                let at = self.pending.iter().position(|(p, _)| p == submission_id);
                assert!(at.is_some(), "seq {seq}: retracted {submission_id} was not pending");
                self.pending.remove(at.unwrap());
                self.retracted.insert(submission_id.clone());
            }
            other => panic!("seq {seq}: unexpected record {other:?}"),
        }
    }
}

/// A replay of the WAL from the start, kept incrementally.
#[derive(Clone, Default)]
struct Model {
    replay: Replay,
    walker: Walker,
    /// Offset after the last frame read.
    end: u64,
    last_epoch: u64,
    /// Frames whose lease epoch is lower than the frame before: `(seq, previous, this)`.
    epoch_regressions: Vec<(u64, u64, u64)>,
}

/// What one `advance` read.
#[derive(Default)]
struct Advance {
    units: Vec<ControlUnit>,
    messages: Vec<(u64, Message)>,
    records: Vec<(u64, Record)>,
}

impl Model {
    /// Reads (read-only, a torn tail ignored) the frames after `end` and applies them.
    fn advance(&mut self, wal: &Path) -> Advance {
        if self.end == 0 {
            // Start after the header frame (created atomically: always whole).
            let bytes = fs::read(wal).expect("read wal");
            let (header, len) = wal::frame::decode(&bytes).expect("header frame");
            assert_eq!((header.kind, header.seq), (FrameKind::Header, 0));
            self.end = len as u64;
        }
        let from = Some((self.end, self.replay.last_seq + 1));
        let mut frames = Vec::new();
        wal::read::<WalError>(wal, record::KNOWN_FEATURES, from, &mut |f| {
            frames.push((f.seq, f.offset, f.len, f.epoch, f.payload.to_vec()));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("durable wal does not read: {e}"));
        let mut out = Advance::default();
        for (seq, offset, len, epoch, payload) in frames {
            assert_eq!(seq, self.replay.last_seq + 1, "seq gap");
            let rec = Record::decode(&payload).unwrap_or_else(|e| panic!("seq {seq} does not decode: {}", e.0));
            let messages = &mut out.messages;
            let mut tool_message = false;
            let units = projection::apply(&mut self.replay, seq, &rec, &mut |e| {
                tool_message |= projection::is_tool_message(&e);
                if let Effect::Message { ordinal, message, .. } = e {
                    messages.push((ordinal, message));
                }
            })
            .unwrap_or_else(|e| panic!("durable wal does not replay: {e}"));
            assert_eq!(
                units.len(),
                projection::unit_count(&rec, tool_message),
                "unit_count disagrees with project at seq {seq}"
            );
            self.walker.feed(seq, &rec, &units);
            if epoch < self.last_epoch {
                self.epoch_regressions.push((seq, self.last_epoch, epoch));
            }
            self.last_epoch = epoch;
            self.end = offset + len;
            out.units.extend(units);
            out.records.push((seq, rec));
        }
        out
    }
}

/// Everything about the WAL before a reopen, read without opening it for writing.
struct Before {
    bytes: Vec<u8>,
    model: Model,
    /// Every durable control unit (`read::control_units`).
    units: Vec<ControlUnit>,
}

fn before(t: &TestDir) -> Before {
    let wal = t.wal();
    let bytes = fs::read(&wal).expect("wal exists");
    let mut model = Model::default();
    let adv = model.advance(&wal);
    let units = read::control_units(&Reader::file(&wal), None, usize::MAX).expect("control_units");
    assert_eq!(units, adv.units, "control_units disagrees with the projection of the records");
    assert_eq!(fs::read(&wal).unwrap(), bytes, "a read-only read changed the wal");
    Before { bytes, model, units }
}

/// A reopened lineage with the model of its WAL.
struct Reopened {
    shared: Shared,
    l: Lineage,
    model: Model,
    records: Vec<(u64, Record)>,
    units: Vec<ControlUnit>,
}

impl Reopened {
    fn finished(&self, run_id: &str) -> usize {
        count_units(&self.units, "run_finished", run_id)
    }
}

fn count_units(units: &[ControlUnit], ty: &str, run_id: &str) -> usize {
    units.iter().filter(|u| u.body()["type"] == json!(ty) && u.body()["run_id"] == json!(run_id)).count()
}

fn max_frame_epoch(path: &Path) -> u64 {
    let mut max = 0;
    wal::read::<WalError>(path, record::KNOWN_FEATURES, None, &mut |f| {
        max = max.max(f.epoch);
        Ok(())
    })
    .expect("read wal");
    max
}

/// Checks the open lineage against the model of its WAL.
fn check_lineage(shared: &Shared, l: &Lineage, m: &Model, messages: &[(u64, Message)], tail: u64) {
    // The epoch is a tenure stamp the lineage keeps, not replayed content: it must only cover
    // every frame's stamp.
    let frames_epoch = max_frame_epoch(&shared.wal_path(&key()));
    assert!(l.state().last_epoch >= frames_epoch, "a tenure epoch below a frame's stamp");
    let expected = Replay { last_epoch: l.state().last_epoch, ..m.replay.clone() };
    assert_eq!(l.state(), &expected, "the replay state after open differs from a full replay of the wal");
    assert_eq!(l.head(), m.walker.last_cursor, "head cursor is not the last durable unit");
    assert_eq!(l.durable_seq(), m.replay.last_seq, "durable seq");
    let queue: Vec<&String> = l.state().queue.iter().map(|p| &p.submission_id).collect();
    let expected: Vec<&String> = m.walker.pending.iter().map(|(s, _)| s).collect();
    assert_eq!(queue, expected, "reopened queue != Queued − Retracted − consumed (FIFO)");
    match l.state().resolution() {
        Resolution::Resume { run_id } => panic!("run {run_id} is still open after the open sealed orphans"),
        Resolution::Paused { run_id, .. } => {
            assert_eq!(m.walker.open_run.as_deref(), Some(run_id.as_str()));
            assert!(m.walker.paused);
        }
        Resolution::Idle { .. } | Resolution::Empty => assert!(m.walker.open_run.is_none()),
    }
    let total = m.replay.prompt_len;
    assert_eq!(messages.len() as u64, total, "messages derived from the wal");
    for (i, (ordinal, _)) in messages.iter().enumerate() {
        assert_eq!(*ordinal, i as u64, "message ordinals are contiguous");
    }
    let from = total.saturating_sub(tail);
    let page =
        read::transcript(&Reader::at(shared, l.key(), l.wal_path().to_path_buf()), from, tail).expect("transcript");
    assert_eq!(page.prompt_len, total, "transcript length");
    assert_eq!(page.messages, messages[from as usize..], "transcript through the store != transcript from the wal");
    if m.walker.cancel_feature_seen {
        let floor = fs::read_to_string(shared.root.feature_floor_path()).unwrap_or_default();
        assert!(floor.lines().any(|f| f == FEATURE_RUN_CANCEL_AT), "a durable frame names a feature the floor lacks");
    }
}

/// The run index (`run-index.db`) agrees with the WAL for `runs`: a finished run's row is
/// terminal with its reason, an unfinished one's is active or paused.
fn check_run_index<'a>(shared: &Shared, w: &Walker, runs: impl IntoIterator<Item = &'a str>) {
    shared.settle();
    for run in runs {
        let facts = &w.runs[run];
        let row = shared.store.run(run).expect("run index").unwrap_or_else(|| panic!("run {run} has no index row"));
        assert_eq!(row.lineage, key().addr(), "run {run}");
        assert_eq!(row.submission_id, facts.submission, "run {run}: submission");
        match facts.reason {
            Some(reason) => {
                assert!(
                    row.terminal && row.state == "terminal",
                    "run {run} finished in the wal but its row is {}",
                    row.state
                );
                assert_eq!(row.reason.as_deref(), Some(reason.as_str()), "run {run}: reason");
            }
            None => {
                let want = if w.paused && w.open_run.as_deref() == Some(run) { "paused" } else { "active" };
                assert!(!row.terminal && row.state == want, "run {run}: row {} but the wal says {want}", row.state);
            }
        }
    }
}

/// Export facts exist for exactly the finished runs, with their terminal reason.
fn check_export_facts(shared: &Shared, w: &Walker) {
    shared.settle();
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(shared.store.path(), flags).expect("read run-index.db");
    let mut stmt = conn
        .prepare("SELECT run_id, terminal_reason, COUNT(*) FROM export_facts GROUP BY run_id, terminal_reason")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let mut with_facts = BTreeSet::new();
    for (run, reason, n) in rows {
        let facts = w.runs.get(&run).unwrap_or_else(|| panic!("export facts of unknown run {run}"));
        let finished = facts.reason.unwrap_or_else(|| panic!("export facts ({n}) of unfinished run {run}"));
        assert_eq!(reason, finished.as_str(), "run {run}: terminal_reason");
        assert_eq!(n, 1, "run {run}: one model, so exactly one fact (insert-once across replays)");
        assert!(with_facts.insert(run.clone()), "run {run} has facts with two reasons");
    }
    let finished: BTreeSet<String> =
        w.runs.iter().filter(|(_, f)| f.reason.is_some()).map(|(r, _)| r.clone()).collect();
    assert_eq!(with_facts, finished, "runs with export facts != finished runs");
}

/// Reopens after a kill and checks everything; `committed` is what the child reported durable.
fn reopen_checked(t: &TestDir, before: &Before, committed: u64) -> Reopened {
    assert!(
        before.model.replay.last_seq >= committed,
        "the child reported seq {committed} durable but the wal ends at seq {}",
        before.model.replay.last_seq
    );
    let expected_seal = match before.model.replay.resolution() {
        Resolution::Resume { run_id } => Some(run_id),
        _ => None,
    };
    let (shared, l) = t.open();
    assert_eq!(l.open_report().sealed_orphan, expected_seal, "what the open sealed");
    assert!(l.durable_seq() >= committed, "durable seq {} < reported {committed}", l.durable_seq());
    let wal = t.wal();
    let after = fs::read(&wal).unwrap();
    let good = before.model.end as usize;
    assert!(after.len() >= good, "the reopen lost durable bytes");
    assert!(after[..good] == before.bytes[..good], "the reopen rewrote bytes before the tail");
    let mut model = Model::default();
    let adv = model.advance(&wal);
    assert_eq!(model.end as usize, after.len(), "the reopened wal has a torn tail");
    let units = read::control_units(&Reader::file(&wal), None, usize::MAX).expect("control_units");
    assert_eq!(units, adv.units);
    assert!(
        units.len() >= before.units.len() && units[..before.units.len()] == before.units[..],
        "durable units changed"
    );
    check_lineage(&shared, &l, &model, &adv.messages, u64::MAX / 4);
    check_run_index(&shared, &model.walker, model.walker.runs.keys().map(String::as_str));
    check_export_facts(&shared, &model.walker);
    Reopened { shared, l, model, records: adv.records, units }
}

/// Closes cleanly and reopens: nothing to seal, everything as before.
fn reopen_again(t: &TestDir, r: Reopened) -> Reopened {
    let durable = r.l.durable_seq();
    drop(r);
    let b = before(t);
    let r = reopen_checked(t, &b, durable);
    assert_eq!(r.l.open_report().sealed_orphan, None);
    r
}

/// A finished episode never prevents a new one: runs a whole episode (consuming the oldest
/// pending submission when there is one) and commits it, then reopens.
fn prove_new_episode(t: &TestDir, mut r: Reopened, fresh_run: &str) -> Reopened {
    assert!(
        matches!(r.l.state().resolution(), Resolution::Idle { .. } | Resolution::Empty),
        "not idle: {:?}",
        r.l.state().resolution()
    );
    let sub = r.l.state().next_to_start().map(|p| p.submission_id.clone());
    let run_id = sub.as_ref().map_or_else(|| fresh_run.to_string(), |s| format!("run-{s}"));
    complete_episode(&mut r.l, &run_id, sub.as_deref());
    assert_eq!(r.l.state().resolution(), Resolution::Idle { run_id: run_id.clone(), reason: FinishReason::Completed });
    let r = reopen_again(t, r);
    assert_eq!(r.finished(&run_id), 1);
    if let Some(s) = sub {
        assert!(r.l.state().pending(&s).is_none());
        assert_eq!(r.model.walker.consumed.get(&s), Some(&run_id));
    }
    r
}

fn tool_result_record<'a>(records: &'a [(u64, Record)], call: &str) -> Vec<&'a Record> {
    records
        .iter()
        .map(|(_, r)| r)
        .filter(|r| matches!(r, Record::ToolResult { tool_call_id, .. } if tool_call_id == call))
        .collect()
}

fn intents_of(records: &[(u64, Record)], call: &str) -> usize {
    records
        .iter()
        .filter(|(_, r)| matches!(r, Record::ToolDispatchIntent { tool_call_id, .. } if tool_call_id == call))
        .count()
}

fn finish_record<'a>(records: &'a [(u64, Record)], run: &str) -> &'a Record {
    let all: Vec<&Record> = records
        .iter()
        .map(|(_, r)| r)
        .filter(|r| matches!(r, Record::RunFinished { run_id, .. } if run_id == run))
        .collect();
    assert_eq!(all.len(), 1, "RunFinished records of {run}");
    all[0]
}

/// The run was sealed by an open as an orphan: `interrupted` with the diagnostic, once.
fn assert_sealed_interrupted(r: &Reopened, run: &str, unknown_calls: &[&str]) {
    assert_eq!(r.finished(run), 1, "run_finished units of {run}");
    assert_eq!(count_units(&r.units, "error", run), 1, "error units of {run}");
    let Record::RunFinished { reason, error, indeterminate_tool_calls, .. } = finish_record(&r.records, run) else {
        unreachable!()
    };
    assert_eq!(*reason, FinishReason::Interrupted);
    assert_eq!(error.as_ref().and_then(|e| e.provider_code.as_deref()), Some(ORPHAN_PROVIDER_CODE));
    assert_eq!(indeterminate_tool_calls, &unknown_calls.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    for call in unknown_calls {
        assert_unknown_result(r, call);
    }
}

fn assert_unknown_result(r: &Reopened, call: &str) {
    let results = tool_result_record(&r.records, call);
    assert_eq!(results.len(), 1, "results of {call}");
    let Record::ToolResult { outcome, is_error, .. } = results[0] else { unreachable!() };
    assert_eq!(outcome.map(|o| o.as_str()), Some("unknown"), "outcome of {call}");
    assert!(*is_error);
    assert_eq!(intents_of(&r.records, call), 1, "{call} was dispatched again");
}

// ---------------------------------------------------------------------------------------------
// Named scenarios
// ---------------------------------------------------------------------------------------------

#[test]
fn after_append_before_fsync() {
    let t = TestDir::new();
    let out = run_child(&t, "after_append_before_fsync", "", &[], KillAt::Ready);
    let b = before(&t);
    // Appended but never committed: not durable, so not in the file at all.
    assert_eq!(b.model.replay.last_seq, out.committed(), "unsynced records reached the wal");
    let r = reopen_checked(&t, &b, out.committed());
    assert_eq!(r.l.state().resolution(), Resolution::Idle { run_id: "run-1".into(), reason: FinishReason::Completed });
    assert_eq!(count_units(&r.units, "run_started", "run-2"), 0);
    assert_eq!(r.l.open_report().sealed_orphan, None);
    prove_new_episode(&t, r, "run-2");
}

#[test]
fn after_fsync_before_reply() {
    let t = TestDir::new();
    let out = run_child(&t, "after_fsync_before_reply", "", &[], KillAt::Ready);
    let b = before(&t);
    let r = reopen_checked(&t, &b, out.committed());
    assert_eq!(count_units(&r.units, "run_started", "run-2"), 1);
    assert_eq!(r.l.open_report().sealed_orphan.as_deref(), Some("run-2"));
    assert_sealed_interrupted(&r, "run-2", &[]);
    assert_eq!(
        r.l.state().resolution(),
        Resolution::Idle { run_id: "run-2".into(), reason: FinishReason::Interrupted }
    );
    prove_new_episode(&t, r, "run-3");
}

#[test]
fn mid_frame() {
    for open in ["idle", "open"] {
        for kind in ["prefix5", "prefix20", "minus1", "badcrc", "zeros"] {
            let t = TestDir::new();
            let out = run_child(&t, "mid_frame", &format!("{kind}/{open}"), &[], KillAt::Ready);
            let torn = out.value("TORN ").expect("TORN line");
            let (good, torn_len) = torn.split_once(' ').unwrap();
            let (good, torn_len): (usize, usize) = (good.parse().unwrap(), torn_len.parse().unwrap());
            let b = before(&t);
            assert_eq!(b.bytes.len(), good + torn_len, "{kind}/{open}: the torn bytes are in the file");
            assert_eq!(b.model.end as usize, good, "{kind}/{open}: a reader stops before the torn frame");
            let r = reopen_checked(&t, &b, out.committed());
            let after = fs::read(t.wal()).unwrap();
            assert!(after[..good] == b.bytes[..good], "{kind}/{open}: bytes before the torn frame changed");
            if open == "idle" {
                assert_eq!(after.len(), good, "{kind}/{open}: the torn tail was not truncated");
                assert_eq!(r.l.open_report().sealed_orphan, None);
                assert_eq!(count_units(&r.units, "run_started", "run-torn"), 0);
            } else {
                // Truncated, then the seal was appended where the torn frame was.
                assert_eq!(
                    r.records.iter().find(|(s, _)| *s == b.model.replay.last_seq + 1).map(|(_, r)| r.run_id()),
                    Some(Some("run-2"))
                );
                assert_sealed_interrupted(&r, "run-2", &["run-2-c1"]);
            }
            let r = prove_new_episode(&t, r, "run-3");
            drop(r);
        }
    }
}

/// An interrupt acknowledged (queued, then the run's cancel durable) and a crash before the run
/// ended: the unfinished interrupted run is sealed `interrupted`, the interrupt is neither lost
/// nor run twice, and it starts ahead of the plain send queued before it.
#[test]
fn interrupt_acknowledged() {
    let t = TestDir::new();
    let out = run_child(&t, "interrupt_acknowledged", "", &[], KillAt::Ready);
    let b = before(&t);
    let mut r = reopen_checked(&t, &b, out.committed());
    assert_sealed_interrupted(&r, "run-2", &[]);
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-plain", "sub-int"], "both sends are still pending");
    assert_eq!(r.l.state().next_to_start().unwrap().submission_id, "sub-int", "the interrupt starts first");
    r = prove_new_episode(&t, r, "unused");
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-plain"], "the interrupt was consumed exactly once");
}

#[test]
fn between_queued_and_run_started() {
    let t = TestDir::new();
    let out = run_child(&t, "between_queued_and_run_started", "", &[], KillAt::Ready);
    let b = before(&t);
    let mut r = reopen_checked(&t, &b, out.committed());
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-a", "sub-b"], "the submission is still pending");
    assert!(r.units.iter().all(|u| u.body()["type"] != json!("submission_started")), "nothing consumed it");
    assert_eq!(count_units(&r.units, "run_started", "run-sub-a"), 0);
    assert_eq!(r.l.state().pending("sub-a").unwrap().request, request("a"), "the request identity survives");
    // Re-drained after the reopen: consumed exactly once.
    r = prove_new_episode(&t, r, "unused");
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-b"]);
    assert_eq!(r.units.iter().filter(|u| u.body()["type"] == json!("submission_started")).count(), 1);
}

#[test]
fn retract_race() {
    for variant in ["uncommitted", "committed"] {
        let t = TestDir::new();
        let out = run_child(&t, "retract_race", variant, &[], KillAt::Ready);
        let b = before(&t);
        let mut r = reopen_checked(&t, &b, out.committed());
        let w = &r.model.walker;
        assert!(w.retracted.contains("sub-a") && !w.consumed.contains_key("sub-a"));
        let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
        if variant == "committed" {
            assert_eq!(w.consumed.get("sub-b").map(String::as_str), Some("run-sub-b"));
            assert_eq!(queue, ["sub-c"]);
            assert_sealed_interrupted(&r, "run-sub-b", &[]);
            assert_eq!(r.l.retract("sub-b").unwrap().0, RetractOutcome::NotPending, "consumed, then retracted");
        } else {
            assert!(!w.consumed.contains_key("sub-b"));
            assert_eq!(queue, ["sub-b", "sub-c"]);
            assert_eq!(r.l.open_report().sealed_orphan, None);
        }
        assert_eq!(r.l.retract("sub-a").unwrap().0, RetractOutcome::NotPending, "retracted twice");
        // Each submission is in exactly one of pending / retracted / consumed.
        for s in ["sub-a", "sub-b", "sub-c"] {
            let w = &r.model.walker;
            let states = [r.l.state().pending(s).is_some(), w.retracted.contains(s), w.consumed.contains_key(s)];
            assert_eq!(states.iter().filter(|x| **x).count(), 1, "{variant}: {s} is {states:?}");
        }
        r = prove_new_episode(&t, r, "unused");
        assert_eq!(
            r.l.retract("sub-c").unwrap().0,
            if variant == "committed" { RetractOutcome::NotPending } else { RetractOutcome::Retracted }
        );
        r.l.retract("sub-c").unwrap();
        let r = reopen_again(&t, r);
        assert!(r.l.state().queue.is_empty());
    }
}

#[test]
fn inside_later_episode() {
    let t = TestDir::new();
    let out = run_child(&t, "inside_later_episode", "", &[], KillAt::Ready);
    let b = before(&t);
    let r = reopen_checked(&t, &b, out.committed());
    // Episode 1 intact.
    let page = read::transcript(&Reader::at(&r.shared, &key(), t.wal()), 0, 1000).unwrap();
    let texts: Vec<Message> = page.messages.iter().map(|(_, m)| m.clone()).collect();
    assert_eq!(texts[..4], episode_messages("run-1")[..], "episode 1's messages");
    assert_eq!(r.finished("run-1"), 1);
    // Episode 2 sealed once; its dispatched call got an unknown outcome and was not resent.
    assert_eq!(r.l.open_report().sealed_orphan.as_deref(), Some("run-2"));
    assert_sealed_interrupted(&r, "run-2", &["run-2-c1"]);
    assert_eq!(texts.len(), 7, "episode 2: input, assistant, tool message");
    let Part::ToolResult { tool_call_id, is_error, .. } = &texts[6].content[0] else { panic!("{:?}", texts[6]) };
    assert_eq!((tool_call_id.as_str(), *is_error), ("run-2-c1", true));
    assert_eq!(
        r.l.state().resolution(),
        Resolution::Idle { run_id: "run-2".into(), reason: FinishReason::Interrupted }
    );
    let r = prove_new_episode(&t, r, "run-3");
    assert_eq!(r.finished("run-2"), 1);
    assert_eq!(r.l.state().prompt_len, 11);
}

#[test]
fn after_run_finished_with_queue() {
    let t = TestDir::new();
    let out = run_child(&t, "after_run_finished_with_queue", "", &[], KillAt::Ready);
    let b = before(&t);
    let r = reopen_checked(&t, &b, out.committed());
    assert_eq!(r.l.state().resolution(), Resolution::Idle { run_id: "run-1".into(), reason: FinishReason::Completed });
    assert_eq!(r.l.open_report().sealed_orphan, None);
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-a", "sub-b", "sub-c"], "queue preserved in FIFO order");
    let r = prove_new_episode(&t, r, "unused");
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-b", "sub-c"]);
    let r = prove_new_episode(&t, r, "unused");
    let queue: Vec<&str> = r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(queue, ["sub-c"]);
}

#[test]
fn paused_auth() {
    let t = TestDir::new();
    let out = run_child(&t, "paused_auth", "", &[], KillAt::Ready);
    let b = before(&t);
    let mut r = reopen_checked(&t, &b, out.committed());
    assert_eq!(
        r.l.state().resolution(),
        Resolution::Paused { run_id: "run-2".into(), reason: PauseReason::AuthRequired }
    );
    assert_eq!(r.l.open_report().sealed_orphan, None, "a paused run is not an orphan");
    assert_eq!(r.finished("run-2"), 0);
    assert_eq!(count_units(&r.units, "error", "run-2"), 0);
    assert_eq!(r.l.state().queue.iter().map(|p| p.submission_id.as_str()).collect::<Vec<_>>(), ["sub-a"]);
    // No new episode while paused.
    let seq = r.l.durable_seq();
    assert!(matches!(r.l.append(&run_started("run-x", None)), Err(LineageError::Refused(_))));
    assert_eq!(r.l.durable_seq(), seq);
    // Resumed on the same run id, it steps and finishes.
    r.l.append(&Record::RunResumed { run_id: "run-2".into() }).unwrap();
    r.l.append(&model_step("run-2", 1, &[])).unwrap();
    r.l.finish_run("run-2", FinishReason::Completed, None, vec![]).unwrap();
    r.l.commit().unwrap();
    assert_eq!(r.l.state().resolution(), Resolution::Idle { run_id: "run-2".into(), reason: FinishReason::Completed });
    let r = reopen_again(&t, r);
    assert_eq!(r.finished("run-2"), 1);
    assert_eq!(count_units(&r.units, "run_started", "run-2"), 1, "resumed on the same run id");
    assert_eq!(count_units(&r.units, "run_resumed", "run-2"), 1);
    let r = prove_new_episode(&t, r, "unused");
    assert_eq!(r.model.walker.consumed.get("sub-a").map(String::as_str), Some("run-sub-a"));
}

#[test]
fn cancel_requested_at_boundary() {
    for variant in ["step_boundary", "now"] {
        let t = TestDir::new();
        let out = run_child(&t, "cancel_requested_at_boundary", variant, &[], KillAt::Ready);
        let b = before(&t);
        let r = reopen_checked(&t, &b, out.committed());
        assert_eq!(r.l.open_report().sealed_orphan.as_deref(), Some("run-2"));
        assert_eq!(r.finished("run-2"), 1, "{variant}: exactly one RunFinished");
        assert_eq!(count_units(&r.units, "error", "run-2"), 0, "{variant}: a cancel seal has no crash diagnostic");
        let Record::RunFinished { reason, error, indeterminate_tool_calls, .. } = finish_record(&r.records, "run-2")
        else {
            unreachable!()
        };
        assert_eq!(*reason, FinishReason::Cancelled, "{variant}");
        assert!(error.is_none());
        assert_eq!(indeterminate_tool_calls, &vec!["run-2-c2".to_string()]);
        let c1 = tool_result_record(&r.records, "run-2-c1");
        assert!(
            matches!(c1[..], [Record::ToolResult { outcome: Some(o), .. }] if o == "ok"),
            "{variant}: c1 keeps its result"
        );
        assert_unknown_result(&r, "run-2-c2");
        assert_eq!(
            r.l.state().resolution(),
            Resolution::Idle { run_id: "run-2".into(), reason: FinishReason::Cancelled }
        );
        prove_new_episode(&t, r, "run-3");
    }
}

#[test]
fn killed_twice() {
    let t = TestDir::new();
    let out1 = run_child(&t, "killed_twice_1", "", &[], KillAt::Ready);
    let b1 = before(&t);
    assert!(b1.model.replay.last_seq >= out1.committed());
    // The second child's open seals episode 2, starts episode 3 and dies inside it.
    let out2 = run_child(&t, "killed_twice_2", "", &[], KillAt::Ready);
    assert_eq!(out2.value("OPENED sealed="), Some("run-2"), "the second child sealed episode 2");
    let b2 = before(&t);
    let good = b1.model.end as usize;
    assert!(b2.bytes[..good] == b1.bytes[..good], "the second child rewrote durable bytes");
    assert!(b2.units[..b1.units.len()] == b1.units[..], "durable units changed across the second crash");
    let r = reopen_checked(&t, &b2, out2.committed());
    assert_eq!(r.l.open_report().sealed_orphan.as_deref(), Some("run-3"));
    let units = read::control_units(&Reader::file(&t.wal()), None, usize::MAX).unwrap();
    let mut finished: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for u in &units {
        let run = u.body()["run_id"].as_str().unwrap_or_default().to_string();
        match u.body()["type"].as_str() {
            Some("run_finished") => *finished.entry(run).or_default() += 1,
            Some("error") => *errors.entry(run).or_default() += 1,
            _ => {}
        }
    }
    let expect = |pairs: &[(&str, usize)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>();
    assert_eq!(finished, expect(&[("run-1", 1), ("run-2", 1), ("run-3", 1)]), "each run finished exactly once");
    assert_eq!(errors, expect(&[("run-2", 1), ("run-3", 1)]), "each orphan sealed exactly once");
    assert_sealed_interrupted(&r, "run-2", &["run-2-c1"]);
    assert_sealed_interrupted(&r, "run-3", &["run-3-c1"]);
    prove_new_episode(&t, r, "run-4");
}

#[test]
fn group_commit_midway() {
    // Killed while the child keeps appending and committing every 10 records.
    let kill_points = [(3, 0), (4, 200), (8, 700), (15, 1500), (25, 3000)];
    for (commits, pause_us) in kill_points {
        let t = TestDir::new();
        let out =
            run_child(&t, "group_commit_midway", "", &[], KillAt::Commits(commits, Duration::from_micros(pause_us)));
        let committed = out.committed();
        assert!(committed >= 10 * commits as u64, "committed {committed}");
        let b = before(&t);
        let r = reopen_checked(&t, &b, committed);
        // Every record the file held before the reopen is the workload's, in order: nothing lost
        // before a reported commit, nothing reordered or altered.
        let last_before = b.model.replay.last_seq;
        assert!(last_before >= committed);
        for (seq, rec) in r.records.iter().filter(|(s, _)| *s <= last_before) {
            assert_eq!(rec, &group_record(*seq), "seq {seq}");
        }
        assert_eq!(r.l.open_report().sealed_orphan.as_deref(), Some("run-g"));
        assert_eq!(r.finished("run-g"), 1);
        assert_eq!(count_units(&r.units, "error", "run-g"), 1);
        println!(
            "group_commit_midway: killed after {commits} commits + {pause_us} us: {} commits reported, seq {committed} \
             committed, {last_before} in the file",
            out.markers.iter().filter(|m| m.starts_with("COMMITTED")).count()
        );
        prove_new_episode(&t, r, "run-after");
    }
}

/// The records of the WAL at `wal`; none when it has no file (a session whose first record
/// never became durable: its WAL is created by that record's write).
fn read_records(wal: &Path) -> Vec<(u64, Record)> {
    let mut out = Vec::new();
    if !wal.exists() {
        return out;
    }
    wal::read::<WalError>(wal, record::KNOWN_FEATURES, None, &mut |f| {
        out.push((f.seq, Record::decode(f.payload).expect("decode")));
        Ok(())
    })
    .expect("read wal");
    out
}

/// A dispatched call with no result must get an unknown-outcome result when its run is sealed,
/// whatever was appended after its intent (DESIGN §2.8).
///
/// Regression: `Replay::check` once accepted a `StepStarted` while the open batch had a call with
/// a durable intent and no result, and the crash seal then never gave that call a result. Now
/// the step is refused, so the seal repairs the call.
#[test]
fn step_over_unresolved_call() {
    let t = TestDir::new();
    let out = run_child(&t, "step_over_unresolved_call", "", &[], KillAt::Ready);
    let step2 = out.value("STEP2 ").unwrap_or("?").to_string();
    let (shared, l) = t.open();
    let sealed = l.open_report().sealed_orphan.clone();
    drop(l);
    drop(shared);
    assert_eq!(sealed.as_deref(), Some("run-2"));
    let records = read_records(&t.wal());
    let results = tool_result_record(&records, "run-2-c1");
    let Record::RunFinished { indeterminate_tool_calls, .. } = finish_record(&records, "run-2") else { unreachable!() };
    assert!(
        results.len() == 1 && indeterminate_tool_calls == &vec!["run-2-c1".to_string()],
        "the lineage accepted `StepStarted 2` over call run-2-c1, which has a durable intent and no result \
         (child: STEP2 {step2}); after the crash the seal left the call with {} results and indeterminate_tool_calls \
         {indeterminate_tool_calls:?}: a dispatched call's outcome was silently lost",
        results.len()
    );
    let b = before(&t);
    let r = reopen_checked(&t, &b, b.model.replay.last_seq);
    assert_sealed_interrupted(&r, "run-2", &["run-2-c1"]);
}

/// Regression: `Lineage::retract` once answered `NotPending` ("already started") from a consuming
/// `RunStarted` that was appended but not committed, so a crash left the submission pending,
/// contradicting the answer (DESIGN §2.4, durable before visible).
#[test]
fn retract_answer_is_durable() {
    let t = TestDir::new();
    let out = run_child(&t, "retract_answer_durable", "", &[], KillAt::Ready);
    let answer = out.value("RETRACT ").expect("RETRACT line").to_string();
    let b = before(&t);
    let r = reopen_checked(&t, &b, out.committed());
    let pending = r.l.state().pending("sub-a").is_some();
    let consumed = r.model.walker.consumed.contains_key("sub-a");
    let retracted = r.model.walker.retracted.contains("sub-a");
    match answer.as_str() {
        "Retracted" => assert!(retracted && !pending && !consumed, "answered Retracted, but after the crash it is not"),
        _ => assert!(
            consumed && !pending,
            "retract answered {answer} (already started) but after the crash sub-a is \
             pending={pending} consumed={consumed}: the answer was not durable"
        ),
    }
}

/// Regression: `Lease::acquire` once truncated the lease file before writing the new epoch, so a
/// kill between the two reset tenure stamps to 1 (seen by `random_kills`). Now the file is
/// overwritten in place, and an open never stamps below the WAL's highest epoch even when the
/// lease file was lost; this test empties the file to prove the second half.
#[test]
fn lease_epoch_survives_a_crash_during_acquire() {
    let t = TestDir::new();
    for i in 0..3 {
        let (_shared, mut l) = t.open();
        complete_episode(&mut l, &format!("run-{i}"), None);
    }
    let lease = StateRoot::at(&t.state).unwrap().lease_path(&key());
    fs::write(&lease, b"").unwrap(); // what a kill after `set_len(0)` leaves
    let (_shared, mut l) = t.open();
    complete_episode(&mut l, "run-after", None);
    drop(l);
    let mut epochs = Vec::new();
    wal::read::<WalError>(&t.wal(), record::KNOWN_FEATURES, None, &mut |f| {
        epochs.push(f.epoch);
        Ok(())
    })
    .unwrap();
    assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "frame epochs went backwards: {epochs:?}");
}

// ---------------------------------------------------------------------------------------------
// Random kills
// ---------------------------------------------------------------------------------------------

/// What the parent does between two children (on the reopened lineage).
fn parent_actions(l: &mut Lineage, rng: &mut Rng, iter: u64) {
    match l.state().resolution() {
        Resolution::Empty | Resolution::Idle { .. } => match rng.below(4) {
            0 => {}
            1 | 2 => {
                // A finished episode never prevents a new one. It takes what the actor would
                // (the oldest interrupt, else the oldest send): taking the FIFO front while an
                // interrupt waited broke the drain-order invariant the walker checks.
                let sub = l.state().next_to_start().map(|p| p.submission_id.clone());
                let run_id = sub.as_ref().map_or_else(|| format!("p{iter}"), |s| format!("run-{s}"));
                complete_episode(l, &run_id, sub.as_deref());
                assert_eq!(l.state().resolution(), Resolution::Idle { run_id, reason: FinishReason::Completed });
            }
            _ => {
                // Left open for the next child's open to seal.
                let run_id = format!("p{iter}");
                let call = format!("{run_id}-s1-c1");
                l.append(&run_started(&run_id, None)).unwrap();
                l.append(&step_started(&run_id, 1)).unwrap();
                l.append(&model_step(&run_id, 1, std::slice::from_ref(&call))).unwrap();
                l.append(&intent(&run_id, 1, &call)).unwrap();
                l.commit().unwrap();
            }
        },
        Resolution::Paused { run_id, .. } => {
            if rng.below(2) == 0 {
                l.finish_run(&run_id, FinishReason::Cancelled, None, vec![]).unwrap();
                l.commit().unwrap();
            }
        }
        Resolution::Resume { run_id } => panic!("run {run_id} open after reopen"),
    }
}

#[test]
fn random_kills() {
    let kills_wanted: u64 = std::env::var("BROCA_CRASH_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let seed: u64 = std::env::var("BROCA_CRASH_RANDOM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_b0ca);
    println!("random_kills: seed {seed} (BROCA_CRASH_RANDOM_SEED), {kills_wanted} kills");
    let started = Instant::now();
    let t = TestDir::new();
    let wal = t.wal();
    let mut rng = Rng::new(seed);
    let mut model = Model::default();
    let mut messages: Vec<(u64, Message)> = Vec::new();
    let mut all_units: Vec<ControlUnit> = Vec::new();
    let mut verified: Vec<u8> = Vec::new();
    let (mut kills, mut parent_seals, mut child_seals, mut max_committed) = (0u64, 0u64, 0u64, 0u64);
    let (mut before_open, mut torn_tails, mut open_window_kills) = (0u64, 0u64, 0u64);
    // Children killed inside an open that had an orphan to seal: after / before its seal was durable.
    let (mut killed_after_seal, mut killed_before_seal) = (0u64, 0u64);
    // How long a child takes from spawn to the end of its open (a running estimate).
    let mut open_latency = Duration::from_millis(20);
    for iter in 0..kills_wanted {
        let (lines, pause) = if rng.below(100) < 15 {
            // Aim at the child's open: lease, replay, orphan sealing, store flush.
            open_window_kills += 1;
            (0, Duration::from_micros(rng.below(open_latency.as_micros() as u64 * 13 / 10)))
        } else {
            (rng.below(50) as usize, Duration::from_micros(rng.below(3000)))
        };
        let child_seed = rng.next();
        let extra = [(ENV_SEED, child_seed.to_string()), (ENV_ITER, iter.to_string())];
        let out = run_child(&t, "random", "", &extra, KillAt::Commits(lines, pause));
        kills += 1;
        child_seals += u64::from(out.value("OPENED sealed=").is_some_and(|s| s != "-"));
        before_open += u64::from(out.value("OPENED sealed=").is_none());
        if let Some(d) = out.opened_after {
            open_latency = (open_latency * 7 + d) / 8;
        }
        let committed = out.committed();
        max_committed = max_committed.max(committed);
        let ctx = format!(
            "iteration {iter} (seed {seed}, child seed {child_seed}, killed after {lines} commits + {pause:?})"
        );

        // Before the reopen, read-only.
        let (before_bytes, before_model, before_units) = if wal.exists() {
            let bytes = fs::read(&wal).unwrap();
            assert!(
                bytes.len() >= verified.len() && bytes[..verified.len()] == verified[..],
                "{ctx}: verified bytes rewritten"
            );
            let mut m = model.clone();
            let adv = m.advance(&wal);
            (bytes, m, adv.units)
        } else {
            assert!(verified.is_empty(), "{ctx}: the wal vanished");
            (Vec::new(), model.clone(), Vec::new())
        };
        assert!(before_model.replay.last_seq >= committed, "{ctx}: committed seq {committed} is not in the wal");
        torn_tails += u64::from(before_model.end < before_bytes.len() as u64);
        if out.value("OPENED sealed=").is_none() && matches!(model.replay.resolution(), Resolution::Resume { .. }) {
            match before_model.replay.resolution() {
                Resolution::Resume { .. } => killed_before_seal += 1,
                _ => killed_after_seal += 1,
            }
        }
        let expected_seal = match before_model.replay.resolution() {
            Resolution::Resume { run_id } => Some(run_id),
            _ => None,
        };

        // Reopen.
        let (shared, mut l) = t.open();
        assert_eq!(l.open_report().sealed_orphan, expected_seal, "{ctx}: what the open sealed");
        parent_seals += u64::from(expected_seal.is_some());
        assert!(l.durable_seq() >= committed, "{ctx}: durable seq {} < committed {committed}", l.durable_seq());
        let after = fs::read(&wal).unwrap();
        let good = before_model.end as usize;
        assert!(
            after.len() >= good && after[..good] == before_bytes[..good],
            "{ctx}: durable bytes rewritten by the reopen"
        );
        let prev_cursor = model.walker.last_cursor;
        let adv = model.advance(&wal);
        assert_eq!(model.end as usize, after.len(), "{ctx}: torn tail left after the reopen");
        assert!(
            adv.units.len() >= before_units.len() && adv.units[..before_units.len()] == before_units[..],
            "{ctx}: durable units changed"
        );
        let read_back = read::control_units(&Reader::file(&wal), prev_cursor, usize::MAX).unwrap();
        assert_eq!(read_back, adv.units, "{ctx}: control_units after the previous head");
        all_units.extend(adv.units);
        messages.extend(adv.messages);
        check_lineage(&shared, &l, &model, &messages, 40);
        let touched: BTreeSet<&str> = adv.records.iter().filter_map(|(_, r)| r.run_id()).collect();
        check_run_index(&shared, &model.walker, touched);
        check_export_facts(&shared, &model.walker);

        parent_actions(&mut l, &mut rng, iter);
        drop(l);
        drop(shared);
        let adv = model.advance(&wal);
        all_units.extend(adv.units);
        messages.extend(adv.messages);
        verified = fs::read(&wal).unwrap();
        assert_eq!(verified.len() as u64, model.end, "{ctx}: the parent left a torn tail");
    }

    // A last full comparison (the parent may have left an episode open: this open seals it).
    let expected_seal = match model.replay.resolution() {
        Resolution::Resume { run_id } => Some(run_id),
        _ => None,
    };
    let (shared, l) = t.open();
    assert_eq!(l.open_report().sealed_orphan, expected_seal);
    let adv = model.advance(&wal);
    all_units.extend(adv.units);
    messages.extend(adv.messages);
    assert_eq!(read::control_units(&Reader::file(&wal), None, usize::MAX).unwrap(), all_units, "all control units");
    check_lineage(&shared, &l, &model, &messages, u64::MAX / 4);
    check_run_index(&shared, &model.walker, model.walker.runs.keys().map(String::as_str));
    check_export_facts(&shared, &model.walker);
    let w = &model.walker;
    println!(
        "random_kills: {kills} kills in {:.1?}; {} records, {} episodes, {} messages; highest committed seq {max_committed}; \
         orphans sealed: {} interrupted + {} cancelled-with-unknown ({} by the parent's opens, {} by children's), {} unknown-outcome results; \
         submissions: {} queued, {} consumed ({} as steers), {} retracted, {} pending; {open_window_kills} kills aimed at the open \
         (open takes ~{open_latency:.1?}), {before_open} kills before the child's open returned \
         ({killed_before_seal} before and {killed_after_seal} after sealing an orphan), \
         {torn_tails} torn tails; lease epoch regressions in frames (seq, before, after): {:?}",
        started.elapsed(),
        model.replay.last_seq,
        model.replay.episodes,
        messages.len(),
        w.seals_interrupted,
        w.seals_cancelled,
        parent_seals,
        child_seals,
        w.unknown_results,
        w.queued.len(),
        w.consumed.len(),
        w.steered,
        w.retracted.len(),
        w.pending.len(),
        model.epoch_regressions,
    );
    assert!(kills >= 200 || kills == kills_wanted);
}
