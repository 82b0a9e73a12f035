//! The typed WAL records (spec §18, §21). Each record is one frame's payload, encoded as JSON
//! externally tagged by its snake_case name: `{"run_started":{…}}`.
//!
//! Compatibility rules: fields are only ever added, with defaults, so old bytes stay readable; a
//! record type this build does not know decodes as [`Record::Unknown`] and is skipped, unless
//! its frame names a must-understand feature, in which case the frame is refused by name before
//! it is decoded (see `wal`). A record whose meaning an older reader must not skip declares
//! its feature in [`Record::features`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use cortexkit_role_llm_runner::delivery_order::Mode;

use crate::frozen::FrozenConfig;
use crate::message::{Message, RunUsage, StepUsage};

mod error;
mod facts;
mod held;
mod moved;
mod send;
mod warm;
pub use error::{ErrorClass, ProviderError};
pub use facts::{AccountDecision, AttemptTelemetry, AuthSelection, BudgetDetail, EventTypeCount};
pub use held::{HeldSession, ToolCallProviderHeld, FEATURE_PROVIDER_HELD};
pub use moved::MovedOut;
pub use send::{DropReason, RequestIdentity};
pub use warm::CacheWarmed;

/// The feature a `RunCancelRequested` frame requires.
pub const FEATURE_RUN_CANCEL_AT: &str = "run-cancel-at/v1";

/// The feature a `RunStarted` carrying a session class requires.
pub const FEATURE_SESSION_CLASS: &str = "session-class/v1";
/// The feature a `RunStarted` carrying an input-token cap requires.
pub const FEATURE_INPUT_TOKEN_CAP: &str = "input-token-cap/v1";
/// The feature a record whose frozen tools carry a `reply` bound requires.
pub const FEATURE_TOOL_REPLY: &str = "tool-reply/v1";
/// The feature a `RunPaused{restart}` frame requires.
pub const FEATURE_RESTART_PAUSE: &str = "restart-pause/v1";
/// A config carrying a frozen fetch plan, or tools served by other modules: a reader that
/// ignored it would run the session without its providers' tools, or call them unpinned.
pub const FEATURE_FETCH_PLAN: &str = "fetch-plan/v1";
/// A config whose plan opted into output references: a reader that ignored it would render
/// the session's requests without the part numbers its model was shown (llm-runner §9.13).
pub const FEATURE_OUTPUT_REFS: &str = "output-refs/v1";

/// The feature a `RunStarted` whose owner names its machine requires (DESIGN §8).
pub const FEATURE_OWNER_MACHINE: &str = "owner-machine/v1";
/// The feature a `RunStarted` whose config carries a `tool_choice` requires.
pub const FEATURE_TOOL_CHOICE: &str = "tool-choice/v1";
/// The feature a `RunStarted` whose config fixes a non-standard service level requires: a
/// reader that ignored it would resume the run at standard, a silent downgrade.
pub const FEATURE_SERVICE_TIER: &str = "service-tier/v1";
/// The feature a `MovedOut` tombstone requires (a session exported to another host).
pub const FEATURE_SESSION_MOVE: &str = "session-move/v1";
/// The feature a `Queued` carrying a delivery list, and a `Dropped`, require (llm-runner §9.7):
/// a reader that ignored the list would start a run from a send that must never start one.
pub const FEATURE_DELIVERY_ORDER: &str = "delivery-order/v1";
/// Every must-understand feature this build reads.
pub const KNOWN_FEATURES: &[&str] = &[
    FEATURE_DELIVERY_ORDER,
    FEATURE_OWNER_MACHINE,
    FEATURE_SESSION_MOVE,
    FEATURE_TOOL_CHOICE,
    FEATURE_SERVICE_TIER,
    FEATURE_RUN_CANCEL_AT,
    FEATURE_SESSION_CLASS,
    FEATURE_INPUT_TOKEN_CAP,
    FEATURE_RESTART_PAUSE,
    FEATURE_TOOL_REPLY,
    FEATURE_FETCH_PLAN,
    FEATURE_PROVIDER_HELD,
    FEATURE_OUTPUT_REFS,
];

/// Where an episode's history comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    #[default]
    Fresh,
    SeededFrom {
        source_lineage: String,
        at_seq: u64,
    },
}

/// A run's terminal reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Completed,
    Cancelled,
    Interrupted,
    Error,
    MaxSteps,
    BudgetExhausted,
    /// Read, never written by this build.
    TransformUnavailable,
}

impl FinishReason {
    /// The reason `name` spells (its serde name, as [`FinishReason::as_str`] gives it).
    pub fn from_name(name: &str) -> Option<FinishReason> {
        use serde::de::IntoDeserializer;
        let name: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = name.into_deserializer();
        FinishReason::deserialize(name).ok()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Completed => "completed",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Interrupted => "interrupted",
            FinishReason::Error => "error",
            FinishReason::MaxSteps => "max_steps",
            FinishReason::BudgetExhausted => "budget_exhausted",
            FinishReason::TransformUnavailable => "transform_unavailable",
        }
    }
}

/// Why a run is paused (non-terminal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseReason {
    AuthRequired,
    Restart,
    ToolHeld,
}

/// A pause reason's wire name (`auth_required`, `restart`, `tool_held`).
pub fn pause_name(reason: PauseReason) -> &'static str {
    match reason {
        PauseReason::AuthRequired => "auth_required",
        PauseReason::Restart => "restart",
        PauseReason::ToolHeld => "tool_held",
    }
}

/// Whether a stored tool result was refused before its call ran: its recorded `refused` fact.
/// A record written before that fact existed (`refused` absent) is read by the shape broca
/// then gave such results: an error output naming a module, with `nothing_sent` or a refusal
/// code other than a size error. A local result never names a module, so it reads `false`.
pub fn refused_before_run(refused: Option<bool>, output: &Value) -> bool {
    refused.unwrap_or_else(|| {
        let error = output.get("kind").and_then(Value::as_str) == Some("error");
        let code = output.get("code").and_then(Value::as_str);
        let nothing_sent = output.get("nothing_sent").and_then(Value::as_bool) == Some(true);
        error
            && output.get("module").is_some()
            && (nothing_sent
                || code.is_some_and(|c| {
                    c != cortexkit_role_llm_runner::errors::tool_result_reasons::TOOL_RESULT_TOO_LARGE
                }))
    })
}

/// The provider code of the crash diagnostic written by orphan sealing (spec §14).
pub const ORPHAN_PROVIDER_CODE: &str = "previous_process_ended_unsealed";
/// The provider code of a run sealed after its WAL latched an I/O failure.
pub const STORAGE_FAILED_CODE: &str = "wal_io_failed";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelAt {
    Now,
    StepBoundary,
}

/// A record's frozen config: typed, or — written by a build whose config this one cannot read —
/// kept exactly as written, so the record still replays (its run ends visibly) and re-encodes
/// byte for byte.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Frozen {
    Config(Box<FrozenConfig>),
    Unreadable(Value),
}

impl Frozen {
    pub fn new(config: FrozenConfig) -> Frozen {
        Frozen::Config(Box::new(config))
    }

    /// The must-understand features a record carrying this config requires: derived from the
    /// typed members (a config kept as written is read by its keys).
    pub fn features(&self) -> Vec<&'static str> {
        let (class, cap, reply, plan, refs, choice, tier) = match self {
            Frozen::Config(c) => (
                c.policy.session_class.is_some(),
                c.policy.max_input_tokens.is_some(),
                c.tools.iter().any(|t| t.reply.is_some()),
                c.plan.is_some() || c.tools.iter().any(|t| t.module.is_some()),
                c.renders_part_numbers(),
                c.tool_choice.is_some(),
                c.service_tier.is_some(),
            ),
            Frozen::Unreadable(v) => {
                let has = |k: &str| v.get(k).is_some_and(|v| !v.is_null());
                let tools = v.get("tools").and_then(Value::as_array);
                let any_tool = |member: &str| tools.is_some_and(|t| t.iter().any(|t| t.get(member).is_some()));
                let refs = v.get("plan").and_then(|p| p.get("output_refs")) == Some(&Value::Bool(true));
                (
                    has("session_class"),
                    has("max_input_tokens"),
                    any_tool("reply"),
                    has("plan") || any_tool("module"),
                    refs,
                    has("tool_choice"),
                    has("service_tier"),
                )
            }
        };
        [
            (class, FEATURE_SESSION_CLASS),
            (cap, FEATURE_INPUT_TOKEN_CAP),
            (reply, FEATURE_TOOL_REPLY),
            (plan, FEATURE_FETCH_PLAN),
            (refs, FEATURE_OUTPUT_REFS),
            (choice, FEATURE_TOOL_CHOICE),
            (tier, FEATURE_SERVICE_TIER),
        ]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect()
    }

    /// The session-wide input-token cap this config froze.
    pub fn input_cap(&self) -> Option<u64> {
        match self {
            Frozen::Config(c) => c.policy.max_input_tokens,
            Frozen::Unreadable(v) => v.get("max_input_tokens").and_then(Value::as_u64),
        }
    }

    /// The typed config, when this build can read it.
    pub fn config(&self) -> Option<&FrozenConfig> {
        match self {
            Frozen::Config(c) => Some(c),
            Frozen::Unreadable(_) => None,
        }
    }
}

impl Default for Frozen {
    fn default() -> Self {
        Frozen::Unreadable(Value::Null)
    }
}

/// How a send is delivered (spec §4): queued as its own run, steered into the running run at
/// its next step boundary, or interrupting the running run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    #[default]
    Queue,
    Steer,
    Interrupt,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Queue => "queue",
            Delivery::Steer => "steer",
            Delivery::Interrupt => "interrupt",
        }
    }
}

/// How a tool call ended, as its `ToolResult` records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    /// The tool answered.
    Ok,
    /// The tool (or broca, before anything ran) answered an error.
    Error,
    /// The call may have run and no answer came: never sent again.
    Unknown,
    /// The run was cancelled while the call was in flight.
    Cancelled,
    /// The call was never sent (the step crossed a budget).
    NotExecuted,
}

/// Compares with the wire string (`outcome == "ok"`).
impl PartialEq<str> for CallOutcome {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for CallOutcome {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Error => "error",
            CallOutcome::Unknown => "unknown",
            CallOutcome::Cancelled => "cancelled",
            CallOutcome::NotExecuted => "not_executed",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunStarted {
    /// Authoritative: a resume reuses it.
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
    #[serde(default)]
    pub origin: Origin,
    /// The frozen config (route, model, variant, system, limits, tools, policy): a resume
    /// renders from this and never re-reads the catalog.
    pub config: Frozen,
    /// The user message that starts the turn.
    pub input: Message,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub started_at_ms: u64,
    /// The credential and account decision frozen at admission (spec §4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_selection: Option<AuthSelection>,
    /// The session's attested owner (`crate::owner`): stamped from the route of its first
    /// send and carried unchanged by every later episode. Absent on sessions written before
    /// owners were stamped and on sessions an unattested caller started (unrestricted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::owner::Owner>,
}

/// Telemetry of one model attempt (spec §14); every measurement is optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptFinished {
    pub run_id: String,
    pub step: u64,
    pub attempt: u32,
    /// `ok`, `retry`, `failed`, `interrupted`, `cancelled`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ProviderError>,
    /// The attempt's identity, `<WAL incarnation>-<seq of this record>`: unique, never reused,
    /// and the `attempt_id` of its `step.finished.v1` hint (absent in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    /// The attempt's content telemetry (spec §14).
    #[serde(default, skip_serializing_if = "AttemptTelemetry::is_empty")]
    pub telemetry: AttemptTelemetry,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    RunStarted(Box<RunStarted>),
    StepStarted {
        run_id: String,
        step: u64,
        at_ms: u64,
        /// The Code Assist project this step's requests name, on the run's first step that
        /// names one (`provider::code_assist`): a resumed run sends the same project.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code_assist_project: Option<String>,
    },
    ModelAttemptFinished(Box<AttemptFinished>),
    ModelStepFinished {
        run_id: String,
        step: u64,
        finish_reason: String,
        usage: StepUsage,
        message: Message,
        #[serde(default)]
        provider: String,
        #[serde(default)]
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
        /// When the successful attempt ended (`message-times/v1`; absent in older records): the
        /// assistant message's `written_at`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ms: Option<u64>,
        /// The non-standard service level put on this step's request (llm-runner §9.3.2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service_tier_applied: Option<String>,
        /// The level the provider stated it served, on a wire that reports it; never a copy of
        /// the applied level.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service_tier_served: Option<String>,
    },
    ToolDispatchIntent {
        run_id: String,
        step: u64,
        tool_call_id: String,
        tool_name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        module_id: Option<String>,
        /// The material the call key derives from (the call's identity, for at-most-once).
        call_key: String,
        /// The exact argument JSON text the call is sent with (absent in older records).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<String>,
        /// When the call started: the intent is recorded just before the call is sent
        /// (`tool_started.started_at`; absent in older records, and then never invented).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ms: Option<u64>,
    },
    ToolResult {
        run_id: String,
        step: u64,
        tool_call_id: String,
        output: Value,
        is_error: bool,
        /// `ok`, `error`, `cancelled`, `interrupted`, `unknown` (an indeterminate call).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<CallOutcome>,
        /// When the result was recorded (`tool-times/v1`; absent in older records).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ms: Option<u64>,
        /// For a call meant for a tool provider module: whether it was refused before it ran.
        /// Absent for a local result and in older records; read it with [`refused_before_run`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<bool>,
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
    },
    /// A paused run continues (same run_id) from its last durable boundary.
    RunResumed {
        run_id: String,
    },
    RunFinished {
        run_id: String,
        reason: FinishReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ProviderError>,
        #[serde(default)]
        usage: RunUsage,
        #[serde(default)]
        retries_used: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        final_step_finish_reason: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        indeterminate_tool_calls: Vec<String>,
        #[serde(default)]
        at_ms: u64,
        /// The terminal's typed detail (`budget_exhausted`: `{limit, spent, cause}`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<BudgetDetail>,
        /// Steers that reached the transcript after the run's last model step: no model of
        /// this run saw them (the next turn sees them as history).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        undelivered_steers: Vec<String>,
    },
    Queued {
        submission_id: String,
        message: Message,
        request: RequestIdentity,
    },
    Retracted {
        submission_id: String,
    },
    /// A waiting `delivery_order` send ended undelivered: superseded or expired.
    Dropped {
        submission_id: String,
        reason: DropReason,
    },
    /// A queued submission delivered into the running run at a step boundary.
    Steered {
        run_id: String,
        submission_id: String,
        message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
    },
    /// One successful `session.warm` (informational; replay and the projection skip it).
    CacheWarmed(Box<CacheWarmed>),
    /// A provider held a call: its result arrives later, as a late result (spec §19).
    ToolCallProviderHeld(Box<ToolCallProviderHeld>),
    /// The session was exported to another host: this copy is read-only from here on.
    MovedOut(Box<MovedOut>),
    /// A record type this build does not know (and whose frame required no feature).
    #[serde(skip)]
    Unknown(String),
}

/// Why a payload is not a record.
#[derive(Debug)]
pub struct DecodeError(pub String);

impl Record {
    /// The must-understand features a frame holding this record requires.
    pub fn features(&self) -> Vec<&'static str> {
        match self {
            Record::RunCancelRequested { .. } => vec![FEATURE_RUN_CANCEL_AT],
            Record::RunPaused { reason: PauseReason::Restart, .. } => vec![FEATURE_RESTART_PAUSE],
            Record::ToolCallProviderHeld(_) => vec![FEATURE_PROVIDER_HELD],
            Record::RunStarted(r) => {
                let mut features = r.config.features();
                if r.owner.as_ref().is_some_and(|o| o.machine.is_some()) {
                    features.push(FEATURE_OWNER_MACHINE);
                }
                features
            }
            Record::MovedOut(_) => vec![FEATURE_SESSION_MOVE],
            Record::Queued { request, .. } => {
                let mut features = request.config.as_ref().map_or_else(Vec::new, Frozen::features);
                if request.order.is_some() {
                    features.push(FEATURE_DELIVERY_ORDER);
                }
                features
            }
            Record::Dropped { .. } => vec![FEATURE_DELIVERY_ORDER],
            _ => Vec::new(),
        }
    }

    /// When this record was durable activity of its session (llm-runner §9.1: a send, a step or
    /// a terminal), as recorded. Records broca writes on its own initiative (cache warms) and
    /// records without a time are not activity.
    /// The title a record carries (`run_started`, `queued`, `steered`; spec §4 `title`).
    pub fn title(&self) -> Option<&str> {
        match self {
            Record::RunStarted(r) => r.title.as_deref(),
            Record::Queued { request, .. } => request.title.as_deref(),
            Record::Steered { title, .. } => title.as_deref(),
            _ => None,
        }
    }

    pub fn activity_ms(&self) -> Option<u64> {
        match self {
            Record::RunStarted(r) => Some(r.started_at_ms),
            Record::StepStarted { at_ms, .. } => Some(*at_ms),
            Record::ModelStepFinished { at_ms, .. } | Record::ToolResult { at_ms, .. } => *at_ms,
            Record::RunFinished { at_ms, .. } => Some(*at_ms),
            // Steps' attempts and calls' intents are inside a step already counted; the rest
            // are not a send, a step or a terminal.
            Record::ModelAttemptFinished(_)
            | Record::ToolDispatchIntent { .. }
            | Record::RunCancelRequested { .. }
            | Record::RunPaused { .. }
            | Record::RunResumed { .. }
            | Record::Queued { .. }
            | Record::Retracted { .. }
            | Record::Dropped { .. }
            | Record::Steered { .. }
            | Record::CacheWarmed(_)
            | Record::MovedOut(_)
            | Record::ToolCallProviderHeld(_)
            | Record::Unknown(_) => None,
        }
        .filter(|&at| at > 0)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("records always serialize")
    }

    /// Decodes a payload. A well-formed record of a type this build does not know is
    /// `Unknown(type)`; anything else malformed is an error.
    pub fn decode(payload: &[u8]) -> Result<Record, DecodeError> {
        match serde_json::from_slice::<Record>(payload) {
            Ok(r) => Ok(r),
            Err(e) => {
                #[derive(Deserialize)]
                struct Tagged(std::collections::BTreeMap<String, serde::de::IgnoredAny>);
                match serde_json::from_slice::<Tagged>(payload) {
                    Ok(Tagged(map)) if map.len() == 1 => {
                        let name = map.into_keys().next().unwrap_or_default();
                        if Record::is_known_type(&name) {
                            Err(DecodeError(format!("{name}: {e}")))
                        } else {
                            Ok(Record::Unknown(name))
                        }
                    }
                    _ => Err(DecodeError(e.to_string())),
                }
            }
        }
    }

    fn is_known_type(name: &str) -> bool {
        kinds::known().contains(&name)
    }

    /// The run this record belongs to, when it belongs to one.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Record::RunStarted(r) => Some(&r.run_id),
            Record::ModelAttemptFinished(a) => Some(&a.run_id),
            Record::ToolCallProviderHeld(h) => Some(&h.run_id),
            Record::StepStarted { run_id, .. }
            | Record::ModelStepFinished { run_id, .. }
            | Record::ToolDispatchIntent { run_id, .. }
            | Record::ToolResult { run_id, .. }
            | Record::RunCancelRequested { run_id, .. }
            | Record::RunPaused { run_id, .. }
            | Record::RunResumed { run_id }
            | Record::RunFinished { run_id, .. }
            | Record::Steered { run_id, .. } => Some(run_id),
            Record::Queued { .. }
            | Record::Retracted { .. }
            | Record::Dropped { .. }
            | Record::CacheWarmed(_)
            | Record::MovedOut(_)
            | Record::Unknown(_) => None,
        }
    }
}

/// The record kinds this build knows, as a frame spells them: read from the `Record` enum's
/// own derived `Deserialize` (the variant list it hands a deserializer), so a kind is known
/// the moment it is declared and no hand list can drift from the enum.
mod kinds {
    use std::fmt;
    use std::sync::OnceLock;

    use serde::de::{self, Deserializer, Visitor};

    /// Every kind `Record` decodes (its `#[serde(skip)]` `Unknown` is none of them).
    pub fn known() -> &'static [&'static str] {
        static KNOWN: OnceLock<&'static [&'static str]> = OnceLock::new();
        KNOWN.get_or_init(|| {
            let mut probe = Probe(None);
            let _ = <super::Record as serde::Deserialize>::deserialize(&mut probe);
            probe.0.unwrap_or(&[])
        })
    }

    /// A deserializer that only notes the variants an enum asks it for, then stops.
    struct Probe(Option<&'static [&'static str]>);

    #[derive(Debug)]
    struct Stop;

    impl fmt::Display for Stop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("probe only")
        }
    }

    impl std::error::Error for Stop {}

    impl de::Error for Stop {
        fn custom<T: fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> Deserializer<'de> for &mut Probe {
        type Error = Stop;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }

        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _name: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(variants);
            Err(Stop)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_types_decode_as_unknown_and_known_garbage_is_an_error() {
        assert!(
            matches!(Record::decode(br#"{"future_thing":{"x":1}}"#), Ok(Record::Unknown(n)) if n == "future_thing")
        );
        assert!(Record::decode(br#"{"run_started":{"x":1}}"#).is_err());
        assert!(Record::decode(b"not json").is_err());
        assert!(Record::decode(b"{}").is_err());
    }

    #[test]
    fn a_finish_reason_reads_back_from_its_name() {
        for name in ["completed", "cancelled", "interrupted", "error", "max_steps", "budget_exhausted"] {
            assert_eq!(FinishReason::from_name(name).map(FinishReason::as_str), Some(name));
        }
        assert_eq!(FinishReason::from_name("finished"), None);
    }

    #[test]
    fn the_known_kinds_are_the_record_enum_s_variants() {
        let known = kinds::known();
        assert_eq!(known.len(), 17, "{known:?}");
        for kind in ["run_started", "tool_result", "steered", "cache_warmed", "moved_out"] {
            assert!(Record::is_known_type(kind), "{kind}");
        }
        assert!(!Record::is_known_type("unknown") && !Record::is_known_type("future_thing"));
        assert!(Record::decode(br#"{"tool_result":{"output":1}}"#).is_err(), "a known kind, malformed");
    }

    #[test]
    fn additive_fields_are_tolerated() {
        let bytes = br#"{"retracted":{"submission_id":"sub-1","added_later":true}}"#;
        assert_eq!(Record::decode(bytes).unwrap(), Record::Retracted { submission_id: "sub-1".into() });
    }

    #[test]
    fn round_trip() {
        let r = Record::RunFinished {
            run_id: "run-1".into(),
            reason: FinishReason::Interrupted,
            error: Some(ProviderError::previous_process_ended()),
            usage: RunUsage::default(),
            retries_used: 0,
            final_step_finish_reason: None,
            indeterminate_tool_calls: vec![],
            at_ms: 5,
            detail: None,
            undelivered_steers: vec![],
        };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
    }
}
