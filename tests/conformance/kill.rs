//! `kill_at`: the real broca process SIGKILLs itself at one of its debug-build fail points
//! (`src/failpoint.rs`, `BROCA_FAILPOINTS`) right after the role's point is durable, under the
//! real daemon; the harness sees the fail point's own stderr line and the process gone.
//!
//! A fail point is armed when broca starts (it reads `BROCA_FAILPOINTS` once), so `kill_at`
//! first restarts the instance cleanly on the same state root with the point armed (SIGTERM to
//! its daemon, whose shutdown sequence stops broca; then a new daemon), and only then runs the
//! suite's trigger. Every route the suite holds goes on through the new connection. Hit counts
//! start at zero in the new process, so `@N` counts the trigger's own work only.
//!
//! Which broca fail point stands for which role point (`cortexkit_role_llm_runner::points`):
//! only points broca can be cut at exactly are declared.

use cortexkit_role_llm_runner::points;
use cortexkit_role_llm_runner_conformance::harness::{
    HarnessError, KillMechanism, KillPoint, KillReport, PointDeclaration, Trigger,
};
use std::time::{Duration, Instant};

use crate::rig::{alive, Rig};
use crate::subject::{Handle, Subject};

/// The longest a trigger may run before its point fires.
const REACH: Duration = Duration::from_secs(120);

/// `(role point, BROCA_FAILPOINTS entry, why that entry is the point)`.
const POINTS: &[(&str, &str, &str)] = &[
    (
        points::ADMITTED,
        "send.after_admitted@1",
        "broca admits a send with one commit, its RunStarted holding the frozen plan and the send's \
         message; the fail point fires right after that commit, before the reply and before any \
         step or model request",
    ),
    (
        points::SEND_RECORDED,
        "send.after_admitted@1",
        "the send's message and send_id are durable in that same RunStarted (one commit holds both \
         states in broca); the fail point fires right after it, before the send's reply goes out",
    ),
    (
        points::DISPATCH_INTENT,
        "tool.after_intent_fsync@1",
        "the step's dispatch intents are fsynced and no call has been handed to the tool plane",
    ),
    (
        points::TOOL_RESULT_RECORDED,
        "step.after_started@2",
        "the tool results commit with the next StepStarted barrier; the fail point fires after that \
         commit, before the next model request is sent",
    ),
    (
        points::TERMINAL,
        "run.after_finished_before_index@1",
        "RunFinished is durable in the WAL; its run-index row is only queued",
    ),
    (
        points::RETENTION_TOMBSTONED,
        "retention.after_tombstone@1",
        "the expired session's content-free tombstone is fsynced (wal-ephemeral/<addr>.tombstone); \
         its store rows and WAL are not yet deleted (src/retention.rs, Expiry::settle)",
    ),
];

/// The points declared, each reached by a fail point followed by the process's own SIGKILL.
///
/// Not declared: `StepRecorded` (broca commits a tool step's `ModelStepFinished` together with its
/// dispatch intents, so no durable state has the step without its intents),
/// `ReleasePending` and `UserCommandForwarded` (no such state in broca).
pub fn declarations() -> Vec<PointDeclaration> {
    POINTS
        .iter()
        .map(|(point, entry, why)| PointDeclaration {
            point: KillPoint::new(*point),
            mechanisms: vec![KillMechanism::FaultHookThenProcessKill],
            note: format!("BROCA_FAILPOINTS={entry}: {why}, then SIGKILL of the broca process"),
        })
        .collect()
}

fn entry_of(point: &KillPoint) -> Option<&'static str> {
    POINTS.iter().find(|(p, ..)| *p == point.as_str()).map(|(_, entry, _)| *entry)
}

pub async fn kill_at(
    subject: &Subject,
    handle: Handle,
    point: &KillPoint,
    trigger: Trigger<'_>,
) -> Result<KillReport, HarnessError> {
    let entry = entry_of(point).ok_or_else(|| HarnessError::new(format!("{point} is not declared")))?;
    let name = entry.split(['@', ':']).next().unwrap_or(entry);
    let instance = handle.instance();
    if let Some(mut old) = instance.take_rig() {
        old.stop();
    }
    let rig = Rig::start(subject.rig_config(), &instance.root, Some(entry)).await.map_err(HarnessError::new)?;
    let pid = rig.broca_pid().ok_or_else(|| HarnessError::new("the re-armed broca has no process"))?;
    instance.put_rig(rig);
    let marker = format!("broca: failpoint {name} fired");
    let fired = || instance.broca_log().contains(&marker) && !alive(pid);
    let mut trigger = trigger;
    let until = Instant::now() + REACH;
    let mut finished = false;
    while !fired() {
        if finished || Instant::now() > until {
            // The trigger ended (or ran too long) without the point: give a late line a moment.
            tokio::time::sleep(Duration::from_millis(500)).await;
            if fired() {
                break;
            }
            return Err(HarnessError::new(format!(
                "the trigger {} without reaching {point} ({entry}); broca's log:\n{}",
                if finished { "finished" } else { "ran past its bound" },
                tail(&instance.broca_log())
            )));
        }
        tokio::select! {
            () = &mut trigger => finished = true,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    drop(trigger);
    // The instance is done: its daemon (and the provider) stop with the handle.
    drop(handle);
    Ok(KillReport { point: point.clone(), mechanism: KillMechanism::FaultHookThenProcessKill })
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
