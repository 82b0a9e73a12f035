//! The tool seam. A batch's calls run concurrently on helper threads; results come back over a
//! channel tagged with their planned position, and the loop records them in planned order.
//!
//! A dispatcher gets each call with its deadline and a [`Cancel`] the loop raises when it
//! stops waiting (the deadline passed, the run was cancelled `now`, broca is shutting down).
//! It answers a [`ToolOutcome`]: the tool's output, an error before anything ran, or an
//! indeterminate outcome (the call may have run) — which is never retried.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{unbounded, Receiver};
use serde_json::{json, Value};

/// One call the model asked for, after its durable intent.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub run_id: String,
    pub tool_call_id: String,
    pub name: String,
    pub arguments: Value,
    /// `<lineage>:<seq of the call's ToolDispatchIntent>`: the call's identity, for
    /// at-most-once on the provider side.
    pub call_key: String,
    /// The provider module serving the tool, from the session's frozen plan; `None` for a
    /// send's own (legacy) tools.
    pub target: Option<CallTarget>,
    /// How long this call may take (its tool's frozen reply bound, never below the default).
    pub wait: std::time::Duration,
}

impl ToolCall {
    /// The session's lineage id: the call key is `<lineage id>:<seq>`, and a lineage id (hex)
    /// holds no `:`.
    pub fn lineage(&self) -> &str {
        self.call_key.rsplit_once(':').map_or(self.call_key.as_str(), |(lineage, _)| lineage)
    }
}

/// Where a call goes, as the session's frozen plan says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallTarget {
    pub module: String,
    /// Forwarded on the call (absent: none sent).
    pub preset: Option<String>,
    /// The tool's frozen `schema_pin`.
    pub pin: Option<String>,
    /// The provider's frozen catalog declares `late_results`: the call carries its `call_key`
    /// (spec §4; other providers never see it).
    pub send_call_key: bool,
    /// The tool's frozen `result_format` is `tool-result/v1`.
    pub tool_result_v1: bool,
}

/// A call's result, in the runner's output shape (`{"kind":"text",…}` or `{"kind":"error",…}`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub output: Value,
    pub is_error: bool,
    /// For a call meant for a tool provider module: whether the provider or the daemon
    /// refused it before it ran (llm-runner's `refused` outcome). `None` for a local result.
    pub refused: Option<bool>,
}

impl ToolOutput {
    pub fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput { output: json!({"kind": "text", "text": text.into()}), is_error: false, refused: None }
    }

    pub fn error(message: impl Into<String>) -> ToolOutput {
        ToolOutput { output: json!({"kind": "error", "message": message.into()}), is_error: true, refused: None }
    }
}

/// Raised by the loop when it stops waiting for a batch; a dispatcher checks it to give up.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// How one call ended, as its dispatcher knows it.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutcome {
    /// The tool ran and answered (its output may itself be an error the model reads).
    Completed(ToolOutput),
    /// Nothing ran (no such tool, its provider refused it before running): an error result.
    Error(String),
    /// The call may have run and no answer came (deadline, lost connection): its outcome is
    /// unknown, it is never sent again, and the run ends `interrupted`.
    Indeterminate(String),
    /// The provider held the call (`held-reply/v1`, spec §19): its result arrives later as a
    /// late result; `reason` is the provider's open held reason.
    Held { reason: String },
}

/// Where calls that may be answered late are registered (spec §19): a dispatch group before
/// it is sent, in one synced transaction; a call's registration goes once its terminal is
/// durable. Only a process that declares held replies has one.
pub trait CallRegistry: Send + Sync + std::fmt::Debug {
    /// Registers `calls` (those whose provider takes call keys) of `session`'s run `run_id`, at
    /// `now_ms` on the session's clock.
    fn register(
        &self,
        session: &crate::session_key::SessionKey,
        run_id: &str,
        calls: &[&ToolCall],
        now_ms: u64,
    ) -> Result<(), String>;
    /// The calls `call_keys` have their durable terminal.
    fn settled(&self, call_keys: &[String]);
}

/// Calls tools. `call` blocks until the tool answers, `deadline` passes or `cancel` is raised;
/// the loop runs it on a helper thread, never on its own.
pub trait ToolDispatcher: Send + Sync {
    fn call(&self, call: &ToolCall, deadline: Instant, cancel: &Cancel) -> ToolOutcome;

    /// The outcome of `call` when it is known without sending anything or waiting (a tool
    /// nothing serves): the loop then records it on its own thread instead of handing the call
    /// to a helper thread and waiting for the hand-back. `None` (the default): call it.
    fn answer_locally(&self, _call: &ToolCall) -> Option<ToolOutcome> {
        None
    }

    /// Whether `module`'s route for the session `lineage` answers before `deadline` (a restart
    /// resume re-checks its tool routes, spec "Graceful restart"); `Err` says why not. Default:
    /// reachable (a dispatcher with no routes to check).
    fn reachable(&self, _module: &str, _lineage: &str, _deadline: Instant) -> Result<(), String> {
        Ok(())
    }
}

/// The dispatcher of a run with no tool providers: every call is an error result the model can
/// read, and nothing is sent anywhere.
pub struct NoTools;

impl NoTools {
    /// The error result of a call nothing serves.
    pub fn unserved(call: &ToolCall) -> ToolOutcome {
        ToolOutcome::Error(format!("no tool named {:?} is available in this run", call.name))
    }
}

impl ToolDispatcher for NoTools {
    fn call(&self, call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
        NoTools::unserved(call)
    }

    fn answer_locally(&self, call: &ToolCall) -> Option<ToolOutcome> {
        Some(NoTools::unserved(call))
    }
}

/// Where a call of `name` goes and how long it may take, from the frozen config: a plan tool
/// names its provider (with the plan item's preset, the tool's pin, and whether the provider
/// takes call keys); every tool's wait is its reply bound (for a plan tool computed with the
/// call's hold argument, tool-provider's rule), never below `default`.
pub(crate) fn call_target(
    config: &crate::provider::config::RenderConfig,
    name: &str,
    arguments: &serde_json::Value,
    default: std::time::Duration,
) -> (Option<CallTarget>, std::time::Duration) {
    let Some(spec) = config.tools.iter().find(|t| t.name == name) else { return (None, default) };
    let Some(module) = spec.module.clone() else { return (None, spec.wait(default)) };
    let send_call_key = config.plan.as_ref().is_some_and(|p| {
        p.items.iter().any(|i| {
            i.provider == module
                && i.declares(cortexkit_role_tool_provider::catalog::session_capabilities::LATE_RESULTS)
        })
    });
    let fallback = u64::try_from(default.as_millis()).unwrap_or(u64::MAX);
    let wait = cortexkit_role_tool_provider::catalog::reply_deadline_ms(spec.reply.as_ref(), arguments, fallback);
    let tool_result_v1 = spec.result_format == Some(cortexkit_role_tool_provider::result::ResultFormat::ToolResultV1);
    let target =
        CallTarget { module, preset: spec.preset.clone(), pin: spec.pin.clone(), send_call_key, tool_result_v1 };
    (Some(target), std::time::Duration::from_millis(wait))
}

/// The helper threads tool calls run on (shared by every run in the process).
fn tool_pool() -> &'static crate::pool::Pool {
    static POOL: std::sync::OnceLock<crate::pool::Pool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| crate::pool::Pool::new("broca-tool", crate::limits::TOOL_THREADS))
}

/// Starts every call of a batch; results arrive as `(planned index, outcome)`. A call its
/// dispatcher answers locally is answered at once, without a helper thread.
pub(crate) fn dispatch_batch(
    dispatcher: &Arc<dyn ToolDispatcher>,
    calls: Vec<ToolCall>,
    deadline: Instant,
    cancel: &Cancel,
) -> Receiver<(usize, ToolOutcome)> {
    let (tx, rx) = unbounded();
    for (index, call) in calls.into_iter().enumerate() {
        if let Some(outcome) = dispatcher.answer_locally(&call) {
            let _ = tx.send((index, outcome));
            continue;
        }
        let worker_tx = tx.clone();
        let (dispatcher, cancel) = (Arc::clone(dispatcher), cancel.clone());
        let spawned = tool_pool().run(move || {
            let outcome = dispatcher.call(&call, deadline, &cancel);
            let _ = worker_tx.send((index, outcome));
        });
        if let Err(e) = spawned {
            let _ = tx.send((index, ToolOutcome::Error(format!("the tool call could not be started: {e}"))));
        }
    }
    rx
}
