//! The typed body of a control unit (spec §7): one variant per unit kind.
//!
//! A unit stays typed from the projection through the fan-out rings and becomes JSON only at
//! the wire edge ([`crate::fanout::control_frame`], `broca inspect`). Serde spells each variant
//! exactly as the units have always been served: `type` first, then the members in the order
//! below, an absent optional member omitted. `mid` (and a tool unit's `dispatched_to`) follows
//! the record's own members because the projection learns them from the replay's context.

use cortexkit_role_llm_runner::live::LiveEvent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Message, RunUsage, StepUsage};
pub use cortexkit_role_llm_runner::run::HeldCall;

use crate::record::{AttemptTelemetry, CancelAt, FinishReason, PauseReason, ProviderError};

fn no_vec<T>(v: &[T]) -> bool {
    v.is_empty()
}

/// One control unit's body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Unit {
    RunStarted {
        run_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        submission_id: Option<String>,
    },
    SubmissionStarted {
        submission_id: String,
        run_id: String,
    },
    /// The first of a stored message's two units (CONTRACT §7.1).
    MessageStarted {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
    },
    UserMessage {
        run_id: String,
        message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
    },
    StepStarted {
        run_id: String,
        step: u64,
    },
    ModelAttemptFinished {
        run_id: String,
        step: u64,
        attempt: u32,
        outcome: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ProviderError>,
        /// The attempt's content telemetry, as its record keeps it.
        #[serde(flatten)]
        telemetry: AttemptTelemetry,
    },
    AssistantMessage {
        run_id: String,
        step: u64,
        finish_reason: String,
        usage: StepUsage,
        message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
    },
    ToolStarted {
        run_id: String,
        tool_call_id: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        module: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dispatched_to: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
    },
    ToolResult {
        result: UnitToolResult,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dispatched_to: Option<String>,
    },
    /// A closed batch's tool message, leading the units of the record that closed the batch.
    ToolMessage {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
    },
    RunCancelRequested {
        run_id: String,
        at: CancelAt,
    },
    RunPaused {
        run_id: String,
        reason: PauseReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ProviderError>,
        /// The held calls the run waits on (llm-runner `held_calls`); omitted when none.
        #[serde(default, skip_serializing_if = "no_vec")]
        held_calls: Vec<HeldCall>,
    },
    RunResumed {
        run_id: String,
    },
    /// A provider held a call (spec §19): the run's status event, with every held call it now
    /// waits on.
    CallHeld {
        run_id: String,
        tool_call_id: String,
        held_calls: Vec<HeldCall>,
    },
    /// An orphan seal's crash diagnostic, before its `run_finished`.
    Error {
        run_id: String,
        error: ProviderError,
    },
    RunFinished {
        run_id: String,
        reason: FinishReason,
        usage: RunUsage,
        retries_used: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        final_step_finish_reason: Option<String>,
        #[serde(default, skip_serializing_if = "no_vec")]
        indeterminate_tool_calls: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ProviderError>,
    },
    SubmissionQueued {
        submission_id: String,
    },
    SubmissionRetracted {
        submission_id: String,
    },
    Steered {
        run_id: String,
        submission_id: String,
        message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mid: Option<String>,
    },
}

/// A `tool_result` unit's `result`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnitToolResult {
    pub tool_call_id: String,
    /// The tool's output, opaque to broca (the runner's output shape).
    pub output: Value,
    pub is_error: bool,
}

impl Unit {
    /// Gives a message unit its `mid`; other units have none.
    pub(super) fn set_mid(&mut self, to: String) {
        match self {
            Unit::MessageStarted { mid }
            | Unit::UserMessage { mid, .. }
            | Unit::AssistantMessage { mid, .. }
            | Unit::ToolMessage { mid }
            | Unit::Steered { mid, .. }
            | Unit::ToolStarted { mid, .. }
            | Unit::ToolResult { mid, .. } => *mid = Some(to),
            Unit::RunStarted { .. }
            | Unit::SubmissionStarted { .. }
            | Unit::StepStarted { .. }
            | Unit::ModelAttemptFinished { .. }
            | Unit::RunCancelRequested { .. }
            | Unit::RunPaused { .. }
            | Unit::RunResumed { .. }
            | Unit::CallHeld { .. }
            | Unit::Error { .. }
            | Unit::RunFinished { .. }
            | Unit::SubmissionQueued { .. }
            | Unit::SubmissionRetracted { .. } => {}
        }
    }

    /// Whether the unit ends the stream of the step in flight: the attempt ended (a retry
    /// streams its parts again), the answer was stored, or the run ended or paused.
    pub fn ends_step(&self) -> bool {
        matches!(
            self,
            Unit::ModelAttemptFinished { .. }
                | Unit::AssistantMessage { .. }
                | Unit::RunFinished { .. }
                | Unit::RunPaused { .. }
        )
    }

    /// The held calls a status unit lists (llm-runner `held_calls`), when it lists any.
    pub fn held_calls(&self) -> Option<&[HeldCall]> {
        match self {
            Unit::RunPaused { held_calls, .. } | Unit::CallHeld { held_calls, .. } if !held_calls.is_empty() => {
                Some(held_calls)
            }
            _ => None,
        }
    }

    /// The unit as served (its wire JSON).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// One durable unit of the control stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlUnit {
    pub cursor: crate::replay::Cursor,
    pub unit: Unit,
    /// The llm-runner/v1 live event of this unit, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<LiveEvent>,
}

impl ControlUnit {
    /// The unit's body as served.
    pub fn body(&self) -> Value {
        self.unit.to_json()
    }
}
