//! `BROCA_CONFORMANCE_SELFCHECK=1`: the adapter's own check of its harness, run instead of the
//! suite, with only the ops broca has served longest (`session.send`, `run.status`), so a broken
//! harness is told apart from a broca that fails a case. For every declared point it does what a
//! crash case does, through the suite's `CrashDriver`: spawn an instance on a fresh root, kill it
//! at the point while one session's first send runs a tool step, restart it, retry the send with
//! its `send_id`, and wait for the run to end. It prints one `KILLCHECK` line per point with the
//! mechanism, the tool provider's call count at the kill and in all, and the run's final state;
//! its kills never reach the suite's ledger or its `CONFORMANCE` line. Last, `SELFCHECK` lines for
//! what no suite case checks of the adapter itself while broca declares no `streaming` or
//! `live_events`: the route's `session.subscribe` from `start` on a session that ran must see
//! events, and a model answer held mid-stream (`hold_next_model_stream`) shows its first part,
//! not the held one, and keeps its run active until released.

use std::path::Path;
use std::time::{Duration, Instant};

use cortexkit_role_llm_runner::run::RunState;
use cortexkit_role_llm_runner_conformance::harness::{CrashDriver, Harness, KillPoint, Trigger};
use cortexkit_role_llm_runner_conformance::{
    LlmRunnerSubject, Reply, RunnerRoute, Script, ScriptedPart, ScriptedToolCall, ScriptedTurn, SubscribeOutcome,
    SCRIPTED_TOOL,
};
use serde_json::{json, Value};

use crate::route::Route;
use crate::subject::Subject;

const RUN_END: Duration = Duration::from_secs(60);

fn params(subject: &Subject, session: &str, prompt: &str, send_id: &str) -> Value {
    let mut fields = subject.send_fields(session, true);
    fields.insert("prompt".into(), json!(prompt));
    fields.insert("send_id".into(), json!(send_id));
    Value::Object(fields)
}

/// The run id of a send's reply, if it names one.
fn run_of(reply: &Reply) -> Option<String> {
    match reply {
        Reply::Response(v) => v["run_id"].as_str().map(str::to_owned),
        Reply::Error(_) => None,
    }
}

/// Polls `run.status` until the run is terminal; its last state.
async fn wait_end(route: &Route, run_id: &str) -> Result<String, String> {
    let until = Instant::now() + RUN_END;
    loop {
        let state = match route.request("run.status", json!({"run_id": run_id})).await {
            Ok(Reply::Response(v)) => v["state"].as_str().unwrap_or_default().to_owned(),
            Ok(Reply::Error(e)) => format!("refused {}", e.code),
            Err(e) => format!("unanswered: {}", e.message),
        };
        if RunState::parse(&state).is_terminal() {
            return Ok(state);
        }
        if Instant::now() > until {
            return Err(format!("run {run_id} is still {state} after {RUN_END:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn check_point(subject: &Subject, driver: &mut CrashDriver<'_, Subject>, base: &Path, point: &str) -> String {
    let root = base.join(format!("killcheck-{point}"));
    if let Err(e) = std::fs::create_dir_all(&root) {
        return format!("KILLCHECK {point} FAILED creating {}: {e}", root.display());
    }
    let session = format!("killcheck-{point}");
    let call = ScriptedToolCall {
        tool_call_id: "killcheck_call".into(),
        tool: SCRIPTED_TOOL.into(),
        arguments: json!({"marker": format!("killcheck-{point}-args")}),
        result: json!({"marker": format!("killcheck-{point}-result")}),
        hold: false,
    };
    let script = Script {
        turns: vec![
            ScriptedTurn::new(vec![ScriptedPart::Text("step".into()), ScriptedPart::ToolCall(call.clone())]),
            ScriptedTurn::new(vec![ScriptedPart::Text("final".into())]),
        ],
    };
    let outcome: Result<String, String> = async {
        subject.install_script(&session, script).await.map_err(|e| e.to_string())?;
        let handle = driver.spawn(&root).await.map_err(|e| format!("spawning: {e}"))?;
        let owner = subject.owner_stamp();
        let route = subject.session_route(handle.inner(), &session, &owner).await.map_err(|e| e.to_string())?;
        let send = params(subject, &session, &format!("killcheck {point}"), &format!("killcheck-send-{point}"));
        let trigger: Trigger<'_> = {
            let (route, send) = (&route, send.clone());
            Box::pin(async move {
                if let Ok(reply) = route.request("session.send", send).await {
                    if let Some(run) = run_of(&reply) {
                        let _ = wait_end(route, &run).await;
                    }
                }
            })
        };
        let report = driver.kill_at(handle, &KillPoint::new(point), trigger).await.map_err(|e| format!("{e}"))?;
        drop(route);
        let at_kill = subject.tool_invocations(&call.arguments).await;
        let handle = driver.restart(&root).await.map_err(|e| format!("restarting: {e}"))?;
        let route = subject.session_route(handle.inner(), &session, &owner).await.map_err(|e| e.to_string())?;
        let retry = route.request("session.send", send).await.map_err(|e| e.message)?;
        let run = run_of(&retry).ok_or_else(|| format!("the retried send names no run: {retry:?}"))?;
        let state = wait_end(&route, &run).await?;
        let total = subject.tool_invocations(&call.arguments).await;
        Ok(format!("mechanism={} calls_at_kill={at_kill} calls={total} run_state={state}", report.mechanism))
    }
    .await;
    match outcome {
        Ok(facts) => format!("KILLCHECK {point} ok {facts}"),
        Err(why) => format!("KILLCHECK {point} FAILED {why}"),
    }
}

/// One finished run on a fresh instance, then its stream from `start`.
async fn check_subscribe(subject: &Subject, base: &Path) -> String {
    let outcome: Result<String, String> = async {
        let root = base.join("selfcheck-subscribe");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let session = "selfcheck-subscribe";
        let script = Script { turns: vec![ScriptedTurn::new(vec![ScriptedPart::Text("streamed".into())])] };
        subject.install_script(session, script).await.map_err(|e| e.to_string())?;
        let handle = subject.spawn(&root).await.map_err(|e| e.to_string())?;
        let route = subject.session_route(&handle, session, &subject.owner_stamp()).await.map_err(|e| e.to_string())?;
        let reply = route.request("session.send", params(subject, session, "stream me", "selfcheck-send")).await;
        let reply = reply.map_err(|e| e.message)?;
        let run = run_of(&reply).ok_or_else(|| format!("the send names no run: {reply:?}"))?;
        let state = wait_end(&route, &run).await?;
        match route.subscribe(json!({"from": "start"})).await.map_err(|e| e.message)? {
            SubscribeOutcome::Refused(e) => Err(format!("refused {}: {}", e.code, e.message)),
            SubscribeOutcome::Events(events) if events.is_empty() => Err("no event from start".into()),
            SubscribeOutcome::Events(events) => {
                let streamed = events.iter().any(|e| e.to_string().contains("streamed"));
                Ok(format!("events={} run_state={state} text_seen={streamed}", events.len()))
            }
        }
    }
    .await;
    match outcome {
        Ok(facts) => format!("SELFCHECK subscribe ok {facts}"),
        Err(why) => format!("SELFCHECK subscribe FAILED {why}"),
    }
}

/// A model answer held after its first part: the run stays active until the release, then ends.
async fn check_stream_hold(subject: &Subject, base: &Path) -> String {
    let outcome: Result<String, String> = async {
        let root = base.join("selfcheck-hold");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let session = "selfcheck-hold";
        let parts = vec![ScriptedPart::Text("streamed part".into()), ScriptedPart::Text(" held part".into())];
        subject
            .install_script(session, Script { turns: vec![ScriptedTurn::new(parts)] })
            .await
            .map_err(|e| e.to_string())?;
        subject.hold_next_model_stream(session, 1).await.map_err(|e| e.to_string())?;
        let handle = subject.spawn(&root).await.map_err(|e| e.to_string())?;
        let route = subject.session_route(&handle, session, &subject.owner_stamp()).await.map_err(|e| e.to_string())?;
        // Subscribed before the send, the stream goes quiet at the hold: what it carried by then
        // shows the streamed part and not the held one.
        let send = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let reply = route.request("session.send", params(subject, session, "hold me", "selfcheck-hold-send")).await;
            let reply = reply.map_err(|e| e.message)?;
            subject.await_model_step(session).await.map_err(|e| e.to_string())?;
            run_of(&reply).ok_or_else(|| format!("the send names no run: {reply:?}"))
        };
        let (streamed, run) = tokio::join!(route.subscribe(json!({"from": "live"})), send);
        let run = run?;
        let seen = match streamed.map_err(|e| e.message)? {
            SubscribeOutcome::Events(events) => Value::Array(events).to_string(),
            SubscribeOutcome::Refused(e) => return Err(format!("subscribe refused {}", e.code)),
        };
        let (first, rest) = (seen.contains("streamed part"), seen.contains("held part"));
        if !first || rest {
            return Err(format!("while held the stream shows the first part: {first}, the held part: {rest}"));
        }
        let held = match route.request("run.status", json!({"run_id": run})).await.map_err(|e| e.message)? {
            Reply::Response(v) => v["state"].as_str().unwrap_or_default().to_owned(),
            Reply::Error(e) => return Err(format!("run.status refused {}", e.code)),
        };
        if RunState::parse(&held).is_terminal() {
            return Err(format!("the run ended ({held}) while its answer was held"));
        }
        subject.release_model_step(session).await.map_err(|e| e.to_string())?;
        let state = wait_end(&route, &run).await?;
        Ok(format!("state_while_held={held} run_state={state}"))
    }
    .await;
    match outcome {
        Ok(facts) => format!("SELFCHECK stream_hold ok {facts}"),
        Err(why) => format!("SELFCHECK stream_hold FAILED {why}"),
    }
}

/// Checks every declared point, then the route's stream; whether all passed.
pub async fn run(subject: &Subject, base: &Path) -> bool {
    let mut driver = CrashDriver::new(subject);
    let points: Vec<String> = driver.declared_points().iter().map(|d| d.point.as_str().to_owned()).collect();
    let mut ok = true;
    for point in points {
        let line = check_point(subject, &mut driver, base, &point).await;
        ok &= line.contains(" ok ");
        println!("{line}");
    }
    let real = driver.ledger().kills().iter().filter(|k| k.mechanism.is_real_process_kill()).count();
    println!("KILLCHECK kills={} real={real}", driver.ledger().kills().len());
    for line in [check_subscribe(subject, base).await, check_stream_hold(subject, base).await] {
        ok &= line.contains(" ok ");
        println!("{line}");
    }
    ok
}
