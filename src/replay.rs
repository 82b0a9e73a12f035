//! The episode state machine (spec §3, §11, §17, §21): records in, lineage state out.
//!
//! A lineage is a sequence of episodes (runs). Each `RunStarted` closes and validates the
//! previous episode (it must be finished), then starts a new one; a `RunFinished` marks its
//! episode finished, never the lineage. Only the last episode is a resume target.
//!
//! Invariants of [`Replay`]:
//! - it holds the last episode, the pending queue and counters only: memory follows the
//!   configured capacities (one episode's config and open batch, the pending sends), never the
//!   length of history. Messages leave through the effect sink as they are derived;
//! - `check` decides whether a record may follow; `apply` never fails after `check` passed, so a
//!   writer checks, appends, then applies, and a reader applies what the writer checked;
//! - pending = Queued − Retracted − consumed (by a `RunStarted` or a `Steered`), in FIFO order;
//!   a `RunStarted` naming a submission must consume a pending one, so no send is consumed twice
//!   or after its retraction (an idle send is queued and consumed in one barrier);
//! - a batch closes (next step, steer, finish) only when every dispatched call has a result.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use cortexkit_role_llm_runner::service_tier::RunServiceTierUsage;

use crate::message::{Message, Part, Role, RunUsage};
use crate::record::{
    CancelAt, Delivery, FinishReason, Frozen, PauseReason, ProviderError, Record, RequestIdentity, RunStarted,
};

/// A durable control-stream position. Ordered by `(wal_seq, sub_index)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Cursor {
    pub wal_seq: u64,
    pub sub_index: u32,
}

/// A send durably queued and not yet consumed or retracted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub submission_id: String,
    pub message: Message,
    pub request: RequestIdentity,
    pub queued_seq: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum EpisodeStatus {
    Open,
    Paused {
        reason: PauseReason,
        error: Option<ProviderError>,
    },
    Finished {
        reason: FinishReason,
        error: Option<ProviderError>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<crate::record::BudgetDetail>,
    },
}

/// One call of the current step's tool batch, in planned order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchCall {
    pub tool_call_id: String,
    pub tool_name: String,
    /// The call's key, as its intent recorded it (absent in older checkpoints).
    #[serde(default)]
    pub call_key: String,
    /// The module the intent dispatched it to (absent for a send's own tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// `(output, is_error)` once its `ToolResult` is recorded.
    pub result: Option<(Value, bool)>,
    /// When that result was recorded (`tool-times/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// Its provider held it (spec §19): until its result is recorded, it waits for a late
    /// result and is neither indeterminate nor sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::record::ToolCallProviderHeld>,
}

impl BatchCall {
    /// Held and still without its result.
    pub fn is_waiting_held(&self) -> bool {
        self.held.is_some() && self.result.is_none()
    }
}

mod effect;
mod priced;
pub use effect::{Effect, RunState, SendFate};
pub use priced::PricedAt;

/// The last episode of a lineage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    pub run_id: String,
    pub submission_id: Option<String>,
    pub started_seq: u64,
    pub started_at_ms: u64,
    /// The frozen config from `RunStarted`.
    pub config: Frozen,
    pub status: EpisodeStatus,
    /// The last `StepStarted` number (0 before the first step).
    pub step: u64,
    /// A step was started and its `ModelStepFinished` is not recorded yet.
    pub step_open: bool,
    pub usage: RunUsage,
    /// The accumulator behind `usage`'s service levels, kept with it in the checkpoint.
    #[serde(default)]
    pub tiers: RunServiceTierUsage,
    pub retries_used: u64,
    pub final_step_finish_reason: Option<String>,
    pub batch: Vec<BatchCall>,
    pub cancel: Option<CancelAt>,
    /// Messages this episode has contributed so far.
    pub messages: u64,
    /// The ordinal of this episode's last assistant message (whose tool calls a batch runs).
    #[serde(default)]
    pub last_assistant: Option<u64>,
    #[serde(default)]
    pub title: Option<String>,
    /// Steers delivered since the last `StepStarted`: in the transcript, not yet shown to a
    /// model of this run.
    #[serde(default)]
    pub unrendered_steers: Vec<String>,
    /// The session's owner as this episode's `RunStarted` recorded it (`crate::owner`; the
    /// same on every episode of a session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::owner::Owner>,
    /// The account its credential belonged to at admission (`auth_selection.account_id`): a
    /// warm whose credential now reads another account is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// The Code Assist project this run's steps name (its first `StepStarted` that named one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_assist_project: Option<String>,
    /// When each `(provider, model, variant)` of this run first answered (its first
    /// `ModelStepFinished.at_ms`): the time its usage fact is priced at (spec §17b).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub priced_at: Vec<PricedAt>,
}

/// How the last episode stands: what opening the lineage must do with it.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// No episode yet.
    Empty,
    /// The last episode finished: idle, a send appends a new episode.
    Idle { run_id: String, reason: FinishReason },
    /// Paused (e.g. `AuthRequired`): resumable on the same run_id; no new episode meanwhile.
    Paused { run_id: String, reason: PauseReason },
    /// Open: resume the same run_id with the last episode's config and counters.
    Resume { run_id: String },
}

/// A record that may not follow the state: the WAL is not one this engine wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayError {
    pub seq: u64,
    pub reason: String,
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "replay refused record seq {}: {}", self.seq, self.reason)
    }
}

impl std::error::Error for ReplayError {}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Replay {
    /// Seq of the last applied record.
    pub last_seq: u64,
    /// Messages in the conversation so far (the next message's ordinal).
    pub prompt_len: u64,
    pub episodes: u64,
    pub last: Option<Episode>,
    pub queue: VecDeque<Pending>,
    /// The cursor of the last control unit projected so far (kept by the reader/writer, not
    /// by `apply`, since projection is not replay's concern).
    #[serde(default)]
    pub last_unit: Option<Cursor>,
    /// The highest lease epoch stamped on a frame so far (kept by the lineage, like
    /// `last_unit`), so a new tenure never stamps a lower one even if the lease file was lost.
    #[serde(default)]
    pub last_epoch: u64,
    /// The session's input-token cap (spec §4): the lowest cap any episode froze.
    #[serde(default)]
    pub input_cap: Option<u64>,
    /// Consumed input across every episode: fresh input + cache read + cache write of each
    /// completed step, saturating. Counted only while every step reported its input.
    #[serde(default)]
    pub input_spent: u64,
    /// A completed step reported no input usage: spend is unknown from then on (fail closed).
    #[serde(default)]
    pub input_unreported: bool,
    /// A lower bound, in tokens, of the session's next model request: the last completed
    /// step's [`StepUsage::next_request_floor`](crate::message::StepUsage::next_request_floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
    /// Session spend (llm-runner §4.3 `session_usage`): every completed step of every run,
    /// folded incrementally as records apply, so the checkpoint carries it with its watermark.
    #[serde(default)]
    pub session_usage: RunUsage,
    /// The first run counted in `session_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_since: Option<String>,
    /// The newest durable activity's recorded time (unix ms, [`Record::activity_ms`]): what a
    /// retained session's expiry counts from, and its `session.head.updated_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_ms: Option<u64>,
    /// The session's newest model attempt (`session.warm` re-sends its request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<LastAttempt>,
    /// The session was exported to another host (`moved_out`): this copy is read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_out: Option<crate::record::MovedOut>,
    /// The newest title any record carried (`run_started`, `queued` or `steered`; spec §4
    /// `session.send.title`): `session.head.title`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_title: Option<String>,
}

/// A model attempt as `session.warm` needs it: whose request it sent, the digest of those
/// bytes, and the provider code it failed with (`account_limit_exhausted` walls a warm).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastAttempt {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
}

impl Replay {
    pub fn resolution(&self) -> Resolution {
        match &self.last {
            None => Resolution::Empty,
            Some(e) => match &e.status {
                EpisodeStatus::Finished { reason, .. } => {
                    Resolution::Idle { run_id: e.run_id.clone(), reason: *reason }
                }
                EpisodeStatus::Paused { reason, .. } => {
                    Resolution::Paused { run_id: e.run_id.clone(), reason: *reason }
                }
                EpisodeStatus::Open => Resolution::Resume { run_id: e.run_id.clone() },
            },
        }
    }

    /// Notes that the record at `seq` projected `units` control units.
    pub fn note_units(&mut self, seq: u64, units: usize) {
        if units > 0 {
            self.last_unit = Some(Cursor { wal_seq: seq, sub_index: units as u32 - 1 });
        }
    }

    /// The ordinal of the assistant message whose tool calls the open batch runs: the last
    /// episode's last assistant message (for a checkpoint written before that was kept, the
    /// conversation's last message, which it is while a batch is open).
    pub fn batch_assistant(&self) -> Option<u64> {
        let e = self.last.as_ref()?;
        e.last_assistant.or_else(|| if e.batch.is_empty() { None } else { self.prompt_len.checked_sub(1) })
    }

    pub fn pending(&self, submission_id: &str) -> Option<&Pending> {
        self.queue.iter().find(|p| p.submission_id == submission_id)
    }

    /// The pending send that starts the next episode: an interrupt first, else the oldest send
    /// (a steer whose run is no longer open is a plain send by then).
    pub fn next_to_start(&self) -> Option<&Pending> {
        let interrupt = self.queue.iter().find(|p| p.request.delivery() == Delivery::Interrupt);
        interrupt.or_else(|| self.queue.iter().find(|p| p.request.may_start()))
    }

    /// How many pending sends may start a run of their own (a `delivery_order` list without
    /// `idle_start` waits for a run instead).
    pub fn startable(&self) -> usize {
        self.queue.iter().filter(|p| p.request.may_start()).count()
    }

    /// Pending steers joining the open run `run_id`, in FIFO order.
    pub fn pending_steers<'a>(&'a self, run_id: &'a str) -> impl Iterator<Item = &'a Pending> + 'a {
        self.queue
            .iter()
            .filter(move |p| p.request.delivery() == Delivery::Steer && p.request.target_run.as_deref() == Some(run_id))
    }

    /// Whether a pending interrupt waits to start.
    pub fn interrupt_pending(&self) -> bool {
        self.queue.iter().any(|p| p.request.delivery() == Delivery::Interrupt)
    }

    /// The episode a record names must be the last one, in an allowed status.
    fn episode_for(&self, run_id: &str, allow_paused: bool) -> Result<&Episode, String> {
        let e = self.last.as_ref().ok_or_else(|| format!("run {run_id} has no RunStarted"))?;
        if e.run_id != run_id {
            return Err(format!("record names run {run_id} but the last episode is {}", e.run_id));
        }
        match e.status {
            EpisodeStatus::Open => Ok(e),
            EpisodeStatus::Paused { .. } if allow_paused => Ok(e),
            _ => Err(format!("run {run_id} is not open")),
        }
    }

    /// A batch closes only when every dispatched call has a result (a real one, or an
    /// unknown-outcome one written by recovery): a sent call is never silently dropped.
    fn batch_resolved(e: &Episode) -> Result<(), String> {
        match e.batch.iter().find(|c| c.result.is_none()) {
            Some(c) => Err(format!("tool call {} has a dispatch intent and no result", c.tool_call_id)),
            None => Ok(()),
        }
    }

    /// Whether `record` may follow the current state.
    pub fn check(&self, record: &Record) -> Result<(), String> {
        if self.moved_out.is_some() && !matches!(record, Record::Unknown(_)) {
            return Err("the session moved to another host: its copy here takes no more records".into());
        }
        match record {
            Record::RunStarted(r) => {
                if let Some(id) = &r.submission_id {
                    if self.pending(id).is_none() {
                        return Err(format!("run {} consumes submission {id}, which is not pending", r.run_id));
                    }
                }
                if let Some(e) = &self.last {
                    if !matches!(e.status, EpisodeStatus::Finished { .. }) {
                        return Err(format!("run {} started while run {} is not finished", r.run_id, e.run_id));
                    }
                    if e.run_id == r.run_id {
                        return Err(format!("run {} started twice", r.run_id));
                    }
                }
                Ok(())
            }
            Record::StepStarted { run_id, step, .. } => {
                let e = self.episode_for(run_id, false)?;
                if *step <= e.step || e.step_open {
                    return Err(format!("step {step} does not follow step {} (open: {})", e.step, e.step_open));
                }
                Self::batch_resolved(e)
            }
            Record::ModelAttemptFinished(a) => self.episode_for(&a.run_id, false).map(drop),
            Record::ModelStepFinished { run_id, step, .. } => {
                let e = self.episode_for(run_id, false)?;
                if !e.step_open || *step != e.step {
                    return Err(format!(
                        "step {step} finished but the open step is {} (open: {})",
                        e.step, e.step_open
                    ));
                }
                Ok(())
            }
            Record::ToolDispatchIntent { run_id, step, tool_call_id, .. } => {
                let e = self.episode_for(run_id, false)?;
                if *step != e.step || e.batch.iter().any(|c| &c.tool_call_id == tool_call_id) {
                    return Err(format!(
                        "intent {tool_call_id} for step {step} is a duplicate or not of step {}",
                        e.step
                    ));
                }
                Ok(())
            }
            Record::ToolResult { run_id, tool_call_id, .. } => {
                let e = self.episode_for(run_id, false)?;
                match e.batch.iter().find(|c| &c.tool_call_id == tool_call_id) {
                    Some(c) if c.result.is_none() => Ok(()),
                    Some(_) => Err(format!("tool call {tool_call_id} already has a result")),
                    None => Err(format!("tool result {tool_call_id} has no dispatch intent")),
                }
            }
            Record::ToolCallProviderHeld(h) => {
                let e = self.episode_for(&h.run_id, false)?;
                match e.batch.iter().find(|c| c.tool_call_id == h.tool_call_id) {
                    Some(c) if c.result.is_none() && c.held.is_none() => Ok(()),
                    Some(_) => Err(format!("tool call {} is already held or answered", h.tool_call_id)),
                    None => Err(format!("held call {} has no dispatch intent", h.tool_call_id)),
                }
            }
            Record::RunCancelRequested { run_id, .. } => self.episode_for(run_id, true).map(drop),
            Record::RunPaused { run_id, .. } => self.episode_for(run_id, false).map(drop),
            Record::RunResumed { run_id } => match self.episode_for(run_id, true)?.status {
                EpisodeStatus::Paused { .. } => Ok(()),
                _ => Err(format!("run {run_id} resumed but is not paused")),
            },
            Record::RunFinished { run_id, .. } => Self::batch_resolved(self.episode_for(run_id, true)?),
            Record::Queued { submission_id, .. } => match self.pending(submission_id) {
                Some(_) => Err(format!("submission {submission_id} is already queued")),
                None => Ok(()),
            },
            Record::Steered { run_id, submission_id, .. } => {
                if self.pending(submission_id).is_none() {
                    return Err(format!("steer {submission_id} is not pending"));
                }
                // The writer delivers at a step entry, or just before the run's terminal (an
                // unfinished step then recorded no message the steer could precede).
                Self::batch_resolved(self.episode_for(run_id, false)?)
            }
            Record::Dropped { submission_id, .. } => match self.pending(submission_id) {
                Some(p) if p.request.order.is_some() => Ok(()),
                _ => Err(format!("dropped {submission_id} is not a pending list send")),
            },
            Record::Retracted { .. } | Record::CacheWarmed(_) | Record::Unknown(_) => Ok(()),
            Record::MovedOut(_) => match &self.last {
                Some(e) if !matches!(e.status, EpisodeStatus::Finished { .. }) => {
                    Err(format!("moved out while run {} is not finished", e.run_id))
                }
                _ if !self.queue.is_empty() => Err("moved out with sends queued".into()),
                _ => Ok(()),
            },
        }
    }

    /// Applies a record at `seq`, reporting derived facts to `sink`.
    pub fn apply(&mut self, seq: u64, record: &Record, sink: &mut dyn FnMut(Effect)) -> Result<(), ReplayError> {
        self.check(record).map_err(|reason| ReplayError { seq, reason })?;
        self.last_seq = seq;
        if let Some(at) = record.activity_ms() {
            self.last_activity_ms = Some(self.last_activity_ms.map_or(at, |last| last.max(at)));
        }
        if let Some(title) = record.title() {
            self.last_title = Some(title.to_owned());
        }
        match record {
            Record::RunStarted(r) => self.start_run(seq, r, sink),
            Record::StepStarted { step, code_assist_project, .. } => {
                self.close_batch(seq, sink);
                let e = self.episode_mut();
                if let Some(project) = code_assist_project {
                    e.code_assist_project = Some(project.clone());
                }
                e.step = *step;
                e.step_open = true;
                e.unrendered_steers.clear();
            }
            Record::ModelAttemptFinished(a) => {
                if a.outcome == "retry" {
                    self.episode_mut().retries_used += 1;
                }
                self.last_attempt = Some(LastAttempt {
                    run_id: a.run_id.clone(),
                    request_body_sha256: a.request_body_sha256.clone(),
                    provider_code: a.error.as_ref().and_then(|e| e.provider_code.clone()),
                });
            }
            Record::ModelStepFinished {
                finish_reason,
                usage,
                message,
                provider,
                model,
                variant,
                at_ms,
                service_tier_applied,
                service_tier_served,
                ..
            } => {
                let ordinal = self.prompt_len;
                let e = self.episode_mut();
                e.step_open = false;
                e.final_step_finish_reason = Some(finish_reason.clone());
                e.usage.add_step(provider, model, variant.as_deref(), usage);
                let seen = |p: &PricedAt| p.provider == *provider && p.model == *model && p.variant == *variant;
                if let (Some(at_ms), false) = (at_ms, e.priced_at.iter().any(seen)) {
                    let (provider, model, variant) = (provider.clone(), model.clone(), variant.clone());
                    e.priced_at.push(PricedAt { provider, model, variant, at_ms: *at_ms });
                }
                e.usage.record_tier(&mut e.tiers, service_tier_applied.as_deref(), service_tier_served.as_deref());
                e.last_assistant = Some(ordinal);
                self.session_usage.add_step(provider, model, variant.as_deref(), usage);
                self.spend_input(usage);
                self.context_tokens = usage.next_request_floor();
                self.push_message(seq, message.clone(), *at_ms, sink);
            }
            Record::ToolDispatchIntent { tool_call_id, tool_name, module_id, call_key, .. } => {
                self.episode_mut().batch.push(BatchCall {
                    tool_call_id: tool_call_id.clone(),
                    tool_name: tool_name.clone(),
                    call_key: call_key.clone(),
                    module: module_id.clone(),
                    result: None,
                    finished_at_ms: None,
                    held: None,
                });
            }
            Record::ToolResult { tool_call_id, output, is_error, at_ms, .. } => {
                if let Some(c) = self.episode_mut().batch.iter_mut().find(|c| &c.tool_call_id == tool_call_id) {
                    c.result = Some((output.clone(), *is_error));
                    c.finished_at_ms = *at_ms;
                }
            }
            Record::ToolCallProviderHeld(h) => {
                if let Some(c) = self.episode_mut().batch.iter_mut().find(|c| c.tool_call_id == h.tool_call_id) {
                    c.held = Some((**h).clone());
                }
            }
            Record::RunCancelRequested { at, .. } => {
                let e = self.episode_mut();
                e.cancel = Some(match (e.cancel, at) {
                    (Some(CancelAt::Now), _) | (_, CancelAt::Now) => CancelAt::Now,
                    _ => CancelAt::StepBoundary,
                });
            }
            Record::RunPaused { .. } | Record::RunResumed { .. } | Record::RunFinished { .. } => {
                self.change_run_state(seq, record, sink)
            }
            Record::Queued { .. } | Record::Retracted { .. } | Record::Dropped { .. } | Record::Steered { .. } => {
                self.change_queue(seq, record, sink)
            }
            // A warm changes no state; billing reads it.
            Record::CacheWarmed(w) => sink(Effect::Warm { seq, warm: w.clone() }),
            Record::MovedOut(m) => self.moved_out = Some((**m).clone()),
            Record::Unknown(_) => {}
        }
        Ok(())
    }

    /// `RunStarted`: a new episode (consuming its submission), its run state, its user message.
    fn start_run(&mut self, seq: u64, r: &RunStarted, sink: &mut dyn FnMut(Effect)) {
        if let Some(id) = &r.submission_id {
            self.queue.retain(|p| &p.submission_id != id);
            let fate = SendFate::Started { run_id: r.run_id.clone() };
            sink(Effect::Send { submission_id: id.clone(), fate, seq });
        }
        self.episodes += 1;
        self.usage_since.get_or_insert_with(|| r.run_id.clone());
        self.last = Some(Episode {
            run_id: r.run_id.clone(),
            submission_id: r.submission_id.clone(),
            started_seq: seq,
            started_at_ms: r.started_at_ms,
            config: r.config.clone(),
            status: EpisodeStatus::Open,
            step: 0,
            step_open: false,
            usage: RunUsage::default(),
            tiers: RunServiceTierUsage::new(),
            retries_used: 0,
            final_step_finish_reason: None,
            batch: Vec::new(),
            cancel: None,
            messages: 0,
            last_assistant: None,
            title: r.title.clone(),
            unrendered_steers: Vec::new(),
            owner: r.owner.clone(),
            account_id: r.auth_selection.as_ref().and_then(|a| a.account_id.clone()),
            code_assist_project: None,
            priced_at: Vec::new(),
        });
        self.lower_input_cap(r.config.input_cap());
        let state = RunState::Active {
            started_at_ms: r.started_at_ms,
            config: r.config.clone(),
            title: r.title.clone(),
            auth_selection: r.auth_selection.clone(),
        };
        sink(Effect::RunState { run_id: r.run_id.clone(), submission_id: r.submission_id.clone(), state, seq });
        let admitted = (r.started_at_ms > 0).then_some(r.started_at_ms);
        self.push_message(seq, r.input.clone(), admitted, sink);
    }

    /// A frozen cap lowers the session's cap (it never rises).
    fn lower_input_cap(&mut self, cap: Option<u64>) {
        if let Some(cap) = cap {
            self.input_cap = Some(self.input_cap.map_or(cap, |c| c.min(cap)));
        }
    }

    /// A completed step's consumed input counts toward the cap; a step without it makes the
    /// spend unknown from then on (fail closed).
    fn spend_input(&mut self, usage: &crate::message::StepUsage) {
        match usage.consumed_input() {
            Some(n) if !self.input_unreported => self.input_spent = self.input_spent.saturating_add(n),
            Some(_) => {}
            None => self.input_unreported = true,
        }
    }

    /// `RunPaused`, `RunResumed`, `RunFinished`: the last episode's status and its run state.
    fn change_run_state(&mut self, seq: u64, record: &Record, sink: &mut dyn FnMut(Effect)) {
        let (run_id, state) = match record {
            Record::RunPaused { run_id, reason, error } => {
                self.episode_mut().status = EpisodeStatus::Paused { reason: *reason, error: error.clone() };
                (run_id, RunState::Paused { reason: *reason, error: error.clone() })
            }
            Record::RunResumed { run_id } => {
                let e = self.episode_mut();
                e.status = EpisodeStatus::Open;
                let state = RunState::Active {
                    started_at_ms: e.started_at_ms,
                    config: e.config.clone(),
                    title: e.title.clone(),
                    auth_selection: None,
                };
                (run_id, state)
            }
            Record::RunFinished {
                run_id,
                reason,
                error,
                usage,
                at_ms,
                detail,
                undelivered_steers,
                final_step_finish_reason,
                ..
            } => {
                self.close_batch(seq, sink);
                let e = self.episode_mut();
                e.status = EpisodeStatus::Finished { reason: *reason, error: error.clone(), detail: detail.clone() };
                e.step_open = false;
                let state = RunState::Finished {
                    reason: *reason,
                    error: error.clone(),
                    usage: usage.clone(),
                    at_ms: *at_ms,
                    detail: detail.clone(),
                    undelivered_steers: undelivered_steers.clone(),
                    finish: final_step_finish_reason.clone(),
                    priced_at: e.priced_at.clone(),
                };
                (run_id, state)
            }
            _ => return,
        };
        let submission_id = self.episode_mut().submission_id.clone();
        sink(Effect::RunState { run_id: run_id.clone(), submission_id, state, seq });
    }

    /// `Queued`, `Retracted`, `Steered`: the durable queue and the send ledger.
    fn change_queue(&mut self, seq: u64, record: &Record, sink: &mut dyn FnMut(Effect)) {
        match record {
            Record::Queued { submission_id, message, request } => {
                // A lower cap accepted while a run is active applies at its next boundary.
                self.lower_input_cap(request.config.as_ref().and_then(Frozen::input_cap));
                self.queue.push_back(Pending {
                    submission_id: submission_id.clone(),
                    message: message.clone(),
                    request: request.clone(),
                    queued_seq: seq,
                });
                let fate = SendFate::Queued(Box::new(request.clone()));
                sink(Effect::Send { submission_id: submission_id.clone(), fate, seq });
            }
            Record::Retracted { submission_id } if self.pending(submission_id).is_some() => {
                self.queue.retain(|p| &p.submission_id != submission_id);
                sink(Effect::Send { submission_id: submission_id.clone(), fate: SendFate::Retracted, seq });
            }
            Record::Dropped { submission_id, reason } => {
                self.queue.retain(|p| &p.submission_id != submission_id);
                sink(Effect::Send { submission_id: submission_id.clone(), fate: SendFate::Dropped(*reason), seq });
            }
            Record::Steered { run_id, submission_id, message, .. } => {
                let admitted = self.pending(submission_id).map(|p| p.request.received_at_ms).filter(|&t| t > 0);
                self.queue.retain(|p| &p.submission_id != submission_id);
                self.episode_mut().unrendered_steers.push(submission_id.clone());
                let fate = SendFate::Delivered { run_id: run_id.clone() };
                sink(Effect::Send { submission_id: submission_id.clone(), fate, seq });
                self.close_batch(seq, sink);
                self.push_message(seq, message.clone(), admitted, sink);
            }
            _ => {}
        }
    }

    fn episode_mut(&mut self) -> &mut Episode {
        self.last.as_mut().expect("check() proved an episode exists")
    }

    fn push_message(&mut self, seq: u64, message: Message, written_at: Option<u64>, sink: &mut dyn FnMut(Effect)) {
        let run_id = self.last.as_ref().map(|e| e.run_id.clone()).unwrap_or_default();
        if let Some(e) = self.last.as_mut() {
            e.messages += 1;
        }
        sink(Effect::Message { ordinal: self.prompt_len, run_id, seq, written_at, message });
        self.prompt_len += 1;
    }

    /// Ends the current tool batch: its recorded results become one tool-role message, in
    /// planned order.
    fn close_batch(&mut self, seq: u64, sink: &mut dyn FnMut(Effect)) {
        let Some(e) = self.last.as_mut() else { return };
        let batch = std::mem::take(&mut e.batch);
        // The tool message is written when its last result was: known only if every result's is.
        let written_at = batch
            .iter()
            .filter(|c| c.result.is_some())
            .map(|c| c.finished_at_ms)
            .try_fold(None::<u64>, |latest, t| t.map(|t| Some(latest.map_or(t, |l| l.max(t)))))
            .flatten();
        let content: Vec<Part> = batch
            .into_iter()
            .filter_map(|c| {
                c.result.map(|(output, is_error)| Part::ToolResult { tool_call_id: c.tool_call_id, output, is_error })
            })
            .collect();
        if !content.is_empty() {
            self.push_message(seq, Message::of(Role::Tool, content), written_at, sink);
        }
    }

    /// The module the open batch's call `tool_call_id` was dispatched to.
    pub fn dispatched_to(&self, tool_call_id: &str) -> Option<&str> {
        let e = self.last.as_ref()?;
        e.batch.iter().find(|c| c.tool_call_id == tool_call_id).and_then(|c| c.module.as_deref())
    }

    /// Calls of the open batch with an intent and no result: their outcome is unknown (a held
    /// call reads so too until its late result arrives).
    pub fn indeterminate_calls(&self) -> Vec<&BatchCall> {
        self.last.iter().flat_map(|e| e.batch.iter().filter(|c| c.result.is_none())).collect()
    }

    /// Calls of the open batch a provider holds and that have no result yet, in planned order.
    pub fn held_calls(&self) -> Vec<&crate::record::ToolCallProviderHeld> {
        self.last
            .iter()
            .flat_map(|e| e.batch.iter().filter(|c| c.is_waiting_held()))
            .filter_map(|c| c.held.as_ref())
            .collect()
    }

    /// The open batch's tool-role message once every call has its result (a batch a late
    /// result completed, not yet closed by the next step): what the next step shows the model.
    pub fn resolved_batch_message(&self) -> Option<Message> {
        let e = self.last.as_ref()?;
        if e.step_open || e.batch.is_empty() || e.batch.iter().any(|c| c.result.is_none()) {
            return None;
        }
        let content = e
            .batch
            .iter()
            .filter_map(|c| {
                let (output, is_error) = c.result.clone()?;
                Some(Part::ToolResult { tool_call_id: c.tool_call_id.clone(), output, is_error })
            })
            .collect();
        Some(Message::of(Role::Tool, content))
    }
}

#[cfg(test)]
mod tests;
