//! The agent loop: a run as a state machine, step → attempt(s) → step finished → tool batch →
//! … → terminal. It reaches the network only through [`ModelClient`] and tools only through
//! [`ToolDispatcher`], so it is testable without sockets, and it is the same core for the CLI
//! and the module.
//!
//! Durability: each step costs two fsyncs. The first makes `StepStarted` durable (with the
//! previous batch's results, so the model never sees a result that a crash could lose) before
//! the request is sent; the second covers the attempts, `ModelStepFinished` and the tool intents
//! (before any call is sent) or the `RunFinished`. A control unit reaches the output only after
//! the barrier that makes it durable.

mod attempt;
pub mod cache_clock;
mod hints;
pub mod live;
mod tools;
mod turn;

use std::time::Duration;

use crossbeam_channel::Receiver;
use serde_json::Value;

pub use tools::{CallRegistry, CallTarget, Cancel, NoTools, ToolCall, ToolDispatcher, ToolOutcome, ToolOutput};
pub use turn::drive_with;
pub use turn::{admit, admit_owned, admit_unreadable, drive, TurnOutcome};

use crate::lineage::projection::ControlUnit;
use crate::record::CancelAt;

/// Live, lossy, never-durable events for display. A delta names the message it belongs to
/// (`mid`: the ordinal its assistant message gets, as `m<ordinal>`) and the index of the
/// content part it extends in that message.
#[derive(Clone, Debug, PartialEq)]
pub enum DisplayEvent {
    TextDelta {
        step: u64,
        mid: String,
        part: usize,
        text: String,
    },
    ReasoningDelta {
        step: u64,
        mid: String,
        part: usize,
        text: String,
    },
    ToolInputDelta {
        step: u64,
        mid: String,
        part: usize,
        /// The provider stream's index of the call.
        index: usize,
        tool_call_id: String,
        delta: String,
    },
    /// A human-readable status line (retrying, waiting for tools, …).
    Status {
        text: String,
    },
}

/// What the loop hands its front-end, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Display(DisplayEvent),
    /// Units that just became durable.
    Control(Vec<ControlUnit>),
}

/// Signals the loop acts on while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunCommand {
    /// Record a cancel of the running run (`now` or at its next step boundary).
    Cancel(CancelAt),
    /// The process is shutting down: stop now and seal the run `interrupted` (a graceful seal,
    /// without the crash diagnostic); calls still in flight get unknown-outcome results.
    Seal,
    /// The module is draining: finish the current step and its tool batch, then seal the run
    /// `interrupted` at the next step-entry boundary (a terminal the step reaches first wins).
    SealAtBoundary,
}

/// What handling one owner command gave the loop: units it made durable (published like the
/// loop's own), and a signal for the run, if any. A command that recorded a cancel (an
/// interrupting send, `run.cancel`) needs no signal: the loop sees the cancel in the state.
#[derive(Debug, Default)]
pub struct Handled {
    pub units: Vec<ControlUnit>,
    pub signal: Option<RunCommand>,
}

/// The owner's mailbox as the loop sees it: commands arrive on `rx` and `handle` runs each on
/// the lineage between the loop's events (never inside a step, or between a tool call and its
/// result).
pub struct Mailbox<'a, C> {
    pub rx: &'a Receiver<C>,
    pub handle: &'a mut dyn FnMut(&mut crate::lineage::Lineage, C) -> Handled,
}

/// How transient failures are retried.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Backoff before retry n is `base × 2ⁿ`, capped at `max_backoff`; a provider's
    /// `retry-after` wins when it is longer (up to `max_backoff`).
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_retries: 3, base_backoff: Duration::from_millis(250), max_backoff: Duration::from_secs(10) }
    }
}

#[derive(Clone, Debug)]
pub struct LoopOptions {
    /// The provider watchdog: an attempt silent this long ends `interrupted`.
    pub idle_timeout: Duration,
    pub retry: RetryPolicy,
    /// The bearer secret for `AuthSource::Bearer` routes (memory only).
    pub bearer: Option<String>,
    /// The vault `AuthSource::Vault` routes read their credential from; `None`: such a run ends
    /// with `vault_unavailable` (there is no other credential store).
    pub credentials: Option<crate::vault::Credentials>,
    /// Where the loop shows its step in flight (`run.status`'s `step`).
    pub steps: std::sync::Arc<live::StepBoard>,
    /// Where the loop notes each answered request's send start (`session.head.cache`).
    pub cache_clocks: std::sync::Arc<cache_clock::CacheClocks>,
    /// How long a tool call without a `reply` bound may take (spec: 120 s); a call still
    /// unanswered then is indeterminate and the run ends `interrupted`.
    pub tool_wait: Duration,
    /// Where `step.finished.v1` hints go once their attempt records are durable (`None`: no
    /// hints; `broca.jsonc` names no bus, or this is `broca-run`).
    pub step_hints: Option<crate::bus::StepHints>,
    /// Where calls that may be held are registered before they are sent (`None`: this process
    /// does not declare held replies, and no call can be held).
    pub held: Option<std::sync::Arc<dyn tools::CallRegistry>>,
    /// The Google Cloud project Code Assist runs name when the backend names none for the
    /// account (a Workspace account; `broca.jsonc` `code_assist.project`).
    pub code_assist_project: Option<String>,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            idle_timeout: Duration::from_secs(120),
            retry: RetryPolicy::default(),
            bearer: None,
            credentials: None,
            steps: Default::default(),
            cache_clocks: Default::default(),
            tool_wait: Duration::from_secs(120),
            step_hints: None,
            code_assist_project: None,
            held: None,
        }
    }
}

/// Parses a tool call's argument JSON; unparsable arguments are kept as a string so the call
/// is still recorded exactly as the model produced it.
pub(crate) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}
