//! Driving a run from admission to a terminal or a pause.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, RecvError};
use serde_json::json;
use sha2::{Digest, Sha256};

mod admit;
mod attempt_record;
mod backoff;
mod code_assist;
mod credential;
mod held;
mod mailbox;
mod resume;
mod stops;

pub use admit::{admit, admit_owned, admit_unreadable};

use stops::HardStop;

use super::attempt::Assembler;
use super::tools::dispatch_batch;
use super::tools::{Cancel, ToolOutcome};
use super::{DisplayEvent, Handled, LoopOptions, Mailbox, Output, RunCommand, ToolCall, ToolDispatcher, ToolOutput};
use crate::lineage::projection;
use crate::lineage::{Lineage, LineageError};
use crate::message::{Message, Part, Role, StepUsage};
use crate::provider::client::{Attempt, AttemptEvent, ModelClient};
use crate::provider::config::RenderConfig;
use crate::provider::event::StreamEvent;
use crate::provider::telemetry::Telemetry;
use crate::record::{
    AttemptFinished, CallOutcome, CancelAt, ErrorClass, FinishReason, PauseReason, ProviderError, Record,
};
use crate::replay::{EpisodeStatus, Resolution};

/// Retries of a vault read refused transient or transport before the run ends `interrupted`.
const VAULT_READ_RETRIES: u32 = 3;

/// How a drive ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnOutcome {
    pub run_id: String,
    /// `Some` when the run finished; `None` when it paused.
    pub reason: Option<FinishReason>,
    pub paused: Option<PauseReason>,
    pub error: Option<ProviderError>,
}

/// How one step's model call ended.
enum StepEnd {
    Answered { message: Box<Message>, finish: (String, String), usage: StepUsage, served_tier: Option<String> },
    Paused(ProviderError),
    Ended(FinishReason, Option<ProviderError>),
}

/// How a tool batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchEnd {
    /// Every call has its result; `indeterminate`: one ended with its outcome unknown.
    Done { indeterminate: bool },
    /// Calls its providers hold still wait for their late results: the run pauses.
    Held,
}

/// How one attempt ended.
enum AttemptEnd {
    Done(Assembler, Telemetry),
    Failed { error: ProviderError, delivered: bool, retry_after: Option<Duration>, telemetry: Telemetry },
    Cancelled(Telemetry),
    Watchdog(Telemetry),
}

struct Driver<'a, C> {
    lineage: &'a mut Lineage,
    client: &'a dyn ModelClient,
    tools: &'a Arc<dyn ToolDispatcher>,
    commands: Receiver<C>,
    handle: &'a mut dyn FnMut(&mut Lineage, C) -> Handled,
    opts: &'a LoopOptions,
    out: &'a mut dyn FnMut(Output),
    run_id: String,
    config: RenderConfig,
    /// The transcript the model sees. Only ever appended to (the render cache relies on it).
    history: Vec<Message>,
    /// `history` rendered so far: each step renders only the messages added since the last.
    render_cache: crate::provider::render_cache::RenderCache,
    /// A `Seal` arrived: every way out of the run ends `interrupted`.
    sealing: bool,
    /// A `SealAtBoundary` arrived: the next step-entry boundary ends the run `interrupted`.
    seal_at_boundary: bool,
    /// Calls of this run whose outcome is unknown (given up on in flight): the run's terminal
    /// lists them.
    unknown_calls: Vec<String>,
    /// The vault credential of an `AuthSource::Vault` run, in memory only; read before the
    /// first attempt and again after a provider refused it.
    credential: Option<crate::vault::Credential>,
    /// The current step's request body digest (attempt telemetry), taken once per step.
    request_sha: Option<String>,
    /// When the current attempt's request went out.
    attempt_started_ms: u64,
    /// Step hints waiting for the barrier that makes their attempt records durable.
    hints: super::hints::PendingHints,
}

/// Runs the lineage's last episode (open, or paused and now resumed) until it finishes or
/// pauses. Every record goes through `lineage`; every network wait is on helper threads.
/// Its only commands are the run's signals (`broca-run`, tests); [`drive_with`] takes an
/// owner's mailbox.
pub fn drive(
    lineage: &mut Lineage,
    client: &dyn ModelClient,
    tools: &Arc<dyn ToolDispatcher>,
    commands: &Receiver<RunCommand>,
    opts: &LoopOptions,
    out: &mut dyn FnMut(Output),
) -> Result<TurnOutcome, LineageError> {
    let mut signal = |_: &mut Lineage, cmd: RunCommand| Handled { units: Vec::new(), signal: Some(cmd) };
    drive_with(lineage, client, tools, Mailbox { rx: commands, handle: &mut signal }, opts, out)
}

/// [`drive`], handling the owner's commands from `mailbox` while the run goes.
pub fn drive_with<C>(
    lineage: &mut Lineage,
    client: &dyn ModelClient,
    tools: &Arc<dyn ToolDispatcher>,
    mailbox: Mailbox<'_, C>,
    opts: &LoopOptions,
    out: &mut dyn FnMut(Output),
) -> Result<TurnOutcome, LineageError> {
    let (run_id, paused) = match lineage.state().resolution() {
        Resolution::Resume { run_id } => (run_id, None),
        Resolution::Paused { run_id, reason } => (run_id, Some(reason)),
        other => return Err(LineageError::Refused(format!("no run to drive: the lineage is {other:?}"))),
    };
    if paused.is_some() {
        let units = lineage.append_commit(&Record::RunResumed { run_id: run_id.clone() })?.1;
        out(Output::Control(units));
    }
    let frozen = lineage.state().last.as_ref().and_then(|e| e.config.config()).cloned();
    let mut history: Vec<Message> = lineage.transcript(0, u64::MAX)?.messages.into_iter().map(|(_, m)| m).collect();
    // A batch late results completed while the run was paused: its tool message closes with
    // the next step, and the model sees it there.
    history.extend(lineage.state().resolved_batch_message());
    let config: RenderConfig = match frozen {
        Some(c) => c,
        None => {
            let error = ProviderError::new(
                ErrorClass::Permanent,
                Some("frozen_config_unreadable".into()),
                "the run's frozen config does not decode in this build".to_string(),
                None,
            );
            lineage.finish_run(&run_id, FinishReason::Error, Some(error.clone()), vec![])?;
            out(Output::Control(lineage.commit()?));
            return Ok(TurnOutcome { run_id, reason: Some(FinishReason::Error), paused: None, error: Some(error) });
        }
    };
    let mut d = Driver {
        lineage,
        client,
        tools,
        commands: mailbox.rx.clone(),
        handle: mailbox.handle,
        opts,
        out,
        run_id,
        config,
        history,
        render_cache: Default::default(),
        sealing: false,
        seal_at_boundary: false,
        unknown_calls: Vec::new(),
        credential: None,
        request_sha: None,
        attempt_started_ms: 0,
        hints: Default::default(),
    };
    if paused == Some(PauseReason::Restart) {
        if let Some(why) = d.tool_routes_missing() {
            let message = format!("the restart-paused run could not be resumed: {why}");
            return d.finish(FinishReason::Interrupted, Some(ProviderError::permanent("resume_refused", message)));
        }
    }
    d.run()
}

impl<C> Driver<'_, C> {
    fn commit(&mut self) -> Result<(), LineageError> {
        let units = self.lineage.commit()?;
        self.hints.release(self.opts.step_hints.as_ref(), self.lineage.durable_seq());
        if !units.is_empty() {
            (self.out)(Output::Control(units));
        }
        Ok(())
    }

    fn finish(&mut self, reason: FinishReason, error: Option<ProviderError>) -> Result<TurnOutcome, LineageError> {
        self.finish_with(reason, error, None)
    }

    fn finish_with(
        &mut self,
        reason: FinishReason,
        error: Option<ProviderError>,
        detail: Option<crate::record::BudgetDetail>,
    ) -> Result<TurnOutcome, LineageError> {
        let (reason, error) = if self.sealing {
            (FinishReason::Interrupted, Some(ProviderError::runner_shutdown()))
        } else {
            (reason, error)
        };
        // An acknowledged steer is in the transcript even when the run ends before a step
        // could show it to the model (the next turn sees it as history).
        self.deliver_steers(true)?;
        let unknown = std::mem::take(&mut self.unknown_calls);
        self.lineage.finish_run_with(&self.run_id, reason, error.clone(), unknown, detail)?;
        self.commit()?;
        crate::failpoint!("run.after_finished_before_index");
        Ok(TurnOutcome { run_id: self.run_id.clone(), reason: Some(reason), paused: None, error })
    }

    /// A non-terminal pause: the same run continues later from this boundary.
    fn pause(&mut self, reason: PauseReason, error: Option<ProviderError>) -> Result<TurnOutcome, LineageError> {
        self.lineage.append(&Record::RunPaused { run_id: self.run_id.clone(), reason, error: error.clone() })?;
        self.commit()?;
        Ok(TurnOutcome { run_id: self.run_id.clone(), reason: None, paused: Some(reason), error })
    }

    /// Delivers the steers waiting for this run, in FIFO order, at a step entry or at the run's
    /// end (never between a call and its result, and never inside a step that will still record
    /// its message). Not yet durable: the boundary's barrier covers it.
    fn deliver_steers(&mut self, at_finish: bool) -> Result<(), LineageError> {
        let e = self.lineage.state().last.as_ref();
        if e.is_none_or(|e| (e.step_open && !at_finish) || e.batch.iter().any(|c| c.result.is_none())) {
            return Ok(());
        }
        // At a step entry list sends go out too, by their first possible mode; at the run's
        // end only the steers acknowledged into it.
        let delivered = if at_finish {
            self.lineage.deliver_steers(&self.run_id)?
        } else {
            self.lineage.deliver_at_step(&self.run_id)?
        };
        self.history.extend(delivered);
        Ok(())
    }

    /// Appends one dispatch intent per call, in planned order (durable with the next commit):
    /// the calls as they will be dispatched, each with its call key.
    fn append_intents(
        &mut self,
        step: u64,
        calls: Vec<(String, String, serde_json::Value)>,
    ) -> Result<Vec<ToolCall>, LineageError> {
        let lineage_id = self.lineage.addr().to_owned();
        let mut batch = Vec::with_capacity(calls.len());
        for (id, name, arguments) in calls {
            let call_key = format!("{lineage_id}:{}", self.lineage.next_seq());
            let text = serde_json::to_string(&arguments).unwrap_or_else(|_| "{}".into());
            let (target, wait) = super::tools::call_target(&self.config, &name, &arguments, self.opts.tool_wait);
            self.lineage.append(&Record::ToolDispatchIntent {
                run_id: self.run_id.clone(),
                step,
                tool_call_id: id.clone(),
                tool_name: name.clone(),
                module_id: target.as_ref().map(|t| t.module.clone()),
                call_key: call_key.clone(),
                arguments: Some(text),
                at_ms: Some(self.lineage.now_ms()),
            })?;
            batch.push(ToolCall {
                run_id: self.run_id.clone(),
                tool_call_id: id,
                name,
                arguments,
                call_key,
                target,
                wait,
            });
        }
        Ok(batch)
    }

    fn run(&mut self) -> Result<TurnOutcome, LineageError> {
        loop {
            self.drain_commands()?;
            if self.sealing || self.cancel_requested().is_some() {
                return self.finish(FinishReason::Cancelled, None);
            }
            if self.seal_at_boundary {
                if self.config.policy.on_restart.as_deref() == Some("resume") {
                    return self.pause(PauseReason::Restart, None);
                }
                return self.finish(FinishReason::Interrupted, Some(ProviderError::runner_shutdown()));
            }
            match self.ensure_code_assist()? {
                Some(StepEnd::Paused(error)) => return self.pause(PauseReason::AuthRequired, Some(error)),
                Some(StepEnd::Ended(reason, error)) => return self.finish(reason, error),
                _ => {}
            }
            let (step, step_open) = {
                let e = self.lineage.state().last.as_ref().expect("drive has an episode");
                debug_assert!(matches!(e.status, EpisodeStatus::Open));
                (e.step, e.step_open)
            };
            let step = if step_open {
                step
            } else {
                // Step entry: steers join here, after the previous batch's results.
                self.deliver_steers(false)?;
                if self.config.max_steps.is_some_and(|max| step >= max) {
                    return self.finish(FinishReason::MaxSteps, None);
                }
                if let Some(detail) = self.cap_reached() {
                    return self.finish_budget(detail);
                }
                if let Some(error) = self.context_limit_reached() {
                    return self.finish(FinishReason::Error, Some(error));
                }
                // The previous batch's results share this barrier: durable before the model
                // sees them, and the step is announced before it streams.
                self.lineage.append(&Record::StepStarted {
                    run_id: self.run_id.clone(),
                    step: step + 1,
                    at_ms: self.lineage.now_ms(),
                    code_assist_project: self.project_to_record(),
                })?;
                self.commit()?;
                crate::failpoint!("step.after_started");
                step + 1
            };
            match self.model_step(step)? {
                StepEnd::Paused(error) => return self.pause(PauseReason::AuthRequired, Some(error)),
                StepEnd::Ended(reason, error) => return self.finish(reason, error),
                StepEnd::Answered { message, finish, usage, served_tier } => {
                    let message = *message;
                    let calls = tool_calls(&message);
                    self.lineage.append(&Record::ModelStepFinished {
                        run_id: self.run_id.clone(),
                        step,
                        finish_reason: finish.0,
                        usage,
                        message: message.clone(),
                        provider: self.config.provider.clone(),
                        model: self.config.model.clone(),
                        variant: self.config.variant.clone(),
                        at_ms: Some(self.lineage.now_ms()),
                        service_tier_applied: self
                            .config
                            .service_tier
                            .filter(|t| !t.is_standard())
                            .map(|t| t.as_str().into()),
                        // Only a wire the declaration calls `reported` states what it served.
                        service_tier_served: served_tier
                            .filter(|_| crate::provider::tier::reports_served(self.config.family)),
                    })?;
                    self.history.push(message);
                    if let Some(detail) = self.cap_reached() {
                        // A step that reached the cap dispatches none of its calls, and the run
                        // ends at once (llm-runner §9.3: a cap of N stops at exactly N).
                        if !calls.is_empty() {
                            self.refuse_batch(step, calls, HardStop::BudgetExhausted)?;
                        }
                        return self.finish_budget(detail);
                    }
                    if let Some(error) = self.context_limit_reached().filter(|_| !calls.is_empty()) {
                        // The next request could not be sent: the calls whose results it would
                        // carry are sealed never-executed, like a cut-off step's.
                        self.refuse_batch(step, calls, HardStop::ContextLimit)?;
                        return self.finish(FinishReason::Error, Some(error));
                    }
                    if !calls.is_empty() && self.config.max_steps.is_some_and(|max| step >= max) {
                        // The limit cut the run off: the calls that would lead to another step
                        // are sealed never-executed in the terminal's commit (llm-runner §9.3.1).
                        self.refuse_batch(step, calls, HardStop::MaxSteps)?;
                        return self.finish(FinishReason::MaxSteps, None);
                    }
                    if calls.is_empty() {
                        // A final answer while a steer waits gets one more step to render it.
                        if self.lineage.state().pending_steers(&self.run_id).next().is_some() {
                            continue;
                        }
                        return self.finish(FinishReason::Completed, None);
                    }
                    let end = self.tool_batch(step, calls)?;
                    if end == BatchEnd::Held {
                        return self.pause(PauseReason::ToolHeld, None);
                    }
                    if end == (BatchEnd::Done { indeterminate: true }) {
                        // A planned stop often closes the tool routes before broca's own stop
                        // arrives: wait for it briefly, so such a run is sealed as the stop's
                        // (`runner_shutdown`) rather than as a timeout.
                        self.await_seal(mailbox::SEAL_GRACE)?;
                        if self.sealing || self.seal_at_boundary {
                            return self.finish(FinishReason::Interrupted, Some(ProviderError::runner_shutdown()));
                        }
                        let error = ProviderError::new(
                            ErrorClass::Transient,
                            Some("tool_reply_timeout".into()),
                            "a tool call went unanswered past its wait; its outcome is unknown".into(),
                            None,
                        );
                        return self.finish(FinishReason::Interrupted, Some(error));
                    }
                }
            }
        }
    }

    /// One model step, shown on the step board while it is in flight.
    fn model_step(&mut self, step: u64) -> Result<StepEnd, LineageError> {
        self.opts.steps.begin(&self.run_id, step, self.lineage.now_ms());
        let end = self.model_step_attempts(step);
        self.opts.steps.end(&self.run_id);
        self.opts.cache_clocks.step_done(self.lineage.addr());
        end
    }

    /// Attempts with retries until an answer, a pause or an end.
    fn model_step_attempts(&mut self, step: u64) -> Result<StepEnd, LineageError> {
        let shown = crate::refs::tags::shown(&self.config, &self.history);
        let body: Arc<[u8]> = self.render_cache.render_appended(&self.config, &shown).into();
        // A warm of this session while the step runs re-sends these exact bytes (spec §4a).
        self.opts.cache_clocks.sending(self.lineage.addr(), &self.run_id, Arc::clone(&body));
        // The body's digest (attempt telemetry) is taken once the first attempt's request is
        // on its way, so hashing overlaps the provider's answer instead of delaying the request.
        self.request_sha = None;
        for attempt in 0.. {
            if let Some(end) = self.ensure_credential()? {
                return Ok(end);
            }
            self.attempt_started_ms = self.lineage.now_ms();
            self.opts.steps.attempt(&self.run_id, attempt, self.attempt_started_ms);
            let (outcome, end, error, telemetry, retry_after) = match self.attempt(step, &body)? {
                AttemptEnd::Done(asm, telemetry) => {
                    // The provider answered: its cache lives from this request's send start.
                    let ttl = self.config.cache_ttl_ms();
                    self.opts.cache_clocks.sent(self.lineage.addr(), self.attempt_started_ms, ttl);
                    let finish = asm.finish.clone().unwrap_or_else(|| ("stop".into(), String::new()));
                    let usage = asm.usage.clone();
                    let answer = Some((&usage, finish.0.as_str()));
                    self.record_attempt((step, attempt, body.len()), "ok", None, &telemetry, answer)?;
                    let origin = json!({"provider_module_id": self.config.provider, "model_id": self.config.model});
                    let served_tier = asm.served_tier.clone();
                    return Ok(StepEnd::Answered {
                        message: Box::new(asm.into_message(origin)),
                        finish,
                        usage,
                        served_tier,
                    });
                }
                AttemptEnd::Cancelled(t) => {
                    ("cancelled", Some(StepEnd::Ended(FinishReason::Cancelled, None)), None, t, None)
                }
                AttemptEnd::Watchdog(t) => {
                    let error = ProviderError::new(
                        ErrorClass::Transient,
                        Some("provider_idle_timeout".into()),
                        format!("the provider sent nothing for {} ms", self.opts.idle_timeout.as_millis()),
                        None,
                    );
                    (
                        "interrupted",
                        Some(StepEnd::Ended(FinishReason::Interrupted, Some(error.clone()))),
                        Some(error),
                        t,
                        None,
                    )
                }
                AttemptEnd::Failed { error, delivered, retry_after, telemetry } => {
                    let error = self.scrub(error);
                    let retry =
                        error.class == ErrorClass::Transient && !delivered && attempt < self.opts.retry.max_retries;
                    let rejected = matches!(error.http_status, Some(401 | 403));
                    if rejected {
                        self.report_rejected(error.http_status.unwrap_or(401));
                    }
                    let end = match error.class {
                        _ if retry => None,
                        ErrorClass::AuthRequired => Some(StepEnd::Paused(error.clone())),
                        _ if rejected && self.credential_id().is_some() => Some(StepEnd::Paused(error.clone())),
                        _ => Some(StepEnd::Ended(FinishReason::Error, Some(error.clone()))),
                    };
                    (if retry { "retry" } else { "failed" }, end, Some(error), telemetry, retry_after)
                }
            };
            self.record_attempt((step, attempt, body.len()), outcome, error.clone(), &telemetry, None)?;
            if let Some(end) = end {
                return Ok(end);
            }
            let backoff = self.backoff(attempt, retry_after);
            let why = error.map(|e| e.message).unwrap_or_default();
            (self.out)(Output::Display(DisplayEvent::Status {
                text: format!("retrying in {} ms: {why}", backoff.as_millis()),
            }));
            if self.wait_backoff(backoff)? {
                return Ok(StepEnd::Ended(FinishReason::Cancelled, None));
            }
        }
        unreachable!("the attempt loop returns")
    }

    /// Runs one attempt, streaming display events out as they arrive; fills `request_sha` with
    /// the body's digest (hex SHA-256) once the request is handed to the streamer.
    fn attempt(&mut self, step: u64, body: &[u8]) -> Result<AttemptEnd, LineageError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let rx = self.client.start(Attempt {
            config: self.config.clone(),
            body: body.to_vec(),
            bearer: match &self.credential {
                Some(c) => Some(c.secret.expose().to_owned()),
                None => self.opts.bearer.clone(),
            },
            account_id: self.credential.as_ref().and_then(|c| c.account_id.clone()),
            read_timeout: self.opts.idle_timeout + Duration::from_secs(1),
            cancel: Arc::clone(&cancel),
        });
        self.request_sha.get_or_insert_with(|| crate::session_key::hex(&Sha256::digest(body)));
        let stop = |cancel: &AtomicBool| cancel.store(true, Ordering::Relaxed);
        let mut asm = Assembler::default();
        let mut last_event = Instant::now();
        loop {
            let commands = self.commands.clone();
            select! {
                recv(rx) -> msg => {
                    last_event = Instant::now();
                    match msg {
                        Ok(AttemptEvent::Stream { events, .. }) => {
                            crate::failpoint!("step.mid_stream");
                            for event in events {
                                if let StreamEvent::Error { error } = event {
                                    stop(&cancel);
                                    let telemetry = Telemetry::default();
                                    return Ok(AttemptEnd::Failed { error, delivered: asm.delivered, retry_after: None, telemetry });
                                }
                                if matches!(event, StreamEvent::TextDelta { .. } | StreamEvent::ReasoningDelta { .. } | StreamEvent::ToolCallArgsDelta { .. }) {
                                    self.opts.steps.content(&self.run_id, self.lineage.now_ms());
                                }
                                self.display(step, &asm, &event);
                                asm.push(event);
                            }
                        }
                        Ok(AttemptEvent::Http { error, retry_after }) => {
                            return Ok(AttemptEnd::Failed { error, delivered: false, retry_after, telemetry: Telemetry::default() });
                        }
                        Ok(AttemptEvent::Failed { error, telemetry }) => {
                            return Ok(AttemptEnd::Failed { error, delivered: asm.delivered, retry_after: None, telemetry });
                        }
                        Ok(AttemptEvent::End { terminal: true, telemetry }) => return Ok(AttemptEnd::Done(asm, telemetry)),
                        Ok(AttemptEvent::End { terminal: false, telemetry }) => {
                            let error = ProviderError::new(ErrorClass::Transient, Some("stream_truncated".into()), "the provider stream ended without its terminal event".into(), None);
                            return Ok(AttemptEnd::Failed { error, delivered: asm.delivered, retry_after: None, telemetry });
                        }
                        Err(_) => {
                            let error = ProviderError::new(ErrorClass::Transient, Some("transport".into()), "the streamer ended without a result".into(), None);
                            return Ok(AttemptEnd::Failed { error, delivered: asm.delivered, retry_after: None, telemetry: Telemetry::default() });
                        }
                    }
                },
                recv(commands) -> cmd => if self.command(cmd)? == Some(CancelAt::Now) {
                    stop(&cancel);
                    return Ok(AttemptEnd::Cancelled(Telemetry::default()));
                },
                // Wakes only when the watchdog would fire: an active run costs no wake-ups while
                // its stream is quiet (1,000 runs ticking every 25 ms were 40,000 wake-ups a second).
                default(self.opts.idle_timeout.saturating_sub(last_event.elapsed())) => {
                    if last_event.elapsed() >= self.opts.idle_timeout {
                        stop(&cancel);
                        return Ok(AttemptEnd::Watchdog(Telemetry::default()));
                    }
                },
            }
        }
    }

    /// A delta of the step in flight, named by the message it builds: the assistant message
    /// gets ordinal `history.len()`.
    fn display(&mut self, step: u64, asm: &Assembler, event: &StreamEvent) {
        let Some((part, tool_call_id)) = asm.locate(event) else { return };
        let mid = projection::mid(self.history.len() as u64);
        let shown = match event {
            StreamEvent::TextDelta { text } => DisplayEvent::TextDelta { step, mid, part, text: text.clone() },
            StreamEvent::ReasoningDelta { text } => {
                DisplayEvent::ReasoningDelta { step, mid, part, text: text.clone() }
            }
            StreamEvent::ToolCallArgsDelta { index, delta } => DisplayEvent::ToolInputDelta {
                step,
                mid,
                part,
                index: *index,
                tool_call_id: tool_call_id.unwrap_or_default(),
                delta: delta.clone(),
            },
            _ => return,
        };
        (self.out)(Output::Display(shown));
    }

    /// Intents (durable before any call) → registrations of calls that may be held → calls →
    /// results in planned order → one tool message. A call its provider holds gets its held
    /// record (durable) and waits; when only held calls are left the batch ends [`BatchEnd::Held`]
    /// and the run pauses (`tool_held`) with the other results recorded.
    /// A call ending indeterminate (unanswered past its wait, or its dispatcher could not tell)
    /// makes [`BatchEnd::Done`] `indeterminate`: its outcome is unknown and the run ends
    /// `interrupted`. Calls past [`crate::limits::CALLS_PER_BATCH`] get their intents and a
    /// never-executed result (`reason: "too_many_calls"`), after the dispatched ones.
    fn tool_batch(
        &mut self,
        step: u64,
        mut calls: Vec<(String, String, serde_json::Value)>,
    ) -> Result<BatchEnd, LineageError> {
        let over = calls.split_off(calls.len().min(crate::limits::CALLS_PER_BATCH));
        let batch = self.append_intents(step, calls)?;
        let unsent = self.append_intents(step, over)?;
        self.commit()?;
        crate::failpoint!("tool.after_intent_fsync");
        let registered = self.register(&batch)?;
        let ids: Vec<String> = batch.iter().map(|c| c.tool_call_id.clone()).collect();
        let keyed: Vec<(String, String, String)> = batch
            .iter()
            .map(|c| {
                (c.call_key.clone(), c.name.clone(), c.target.as_ref().map_or(String::new(), |t| t.module.clone()))
            })
            .collect();
        // The batch waits as long as its slowest-bounded call may take.
        let wait = batch.iter().map(|c| c.wait).max().unwrap_or(self.opts.tool_wait);
        let deadline = Instant::now() + wait;
        let cancel = Cancel::default();
        let rx = dispatch_batch(self.tools, batch, deadline, &cancel);
        let mut results: Vec<Option<ToolOutcome>> = vec![None; ids.len()];
        let mut waiting = ids.len();
        let mut timed_out = false;
        (self.out)(Output::Display(DisplayEvent::Status { text: format!("waiting for {waiting} tool call(s)") }));
        while waiting > 0 {
            let commands = self.commands.clone();
            select! {
                recv(rx) -> msg => match msg {
                    Ok((i, out)) => {
                        crate::failpoint!("tool.after_reply");
                        if let ToolOutcome::Held { reason } = &out {
                            self.record_held(step, &ids[i], &keyed[i], reason)?;
                        }
                        if results[i].replace(out).is_none() {
                            waiting -= 1;
                        }
                    }
                    Err(_) => break,
                },
                // An interrupt cancels the run but waits for its running calls (never killed);
                // a plain cancel `now` or a shutdown stops waiting.
                recv(commands) -> cmd => if self.command(cmd)? == Some(CancelAt::Now)
                    && (self.sealing || !self.lineage.state().interrupt_pending()) {
                    break;
                },
                default(deadline.saturating_duration_since(Instant::now())) => {
                    timed_out = true;
                    break;
                },
            }
        }
        // Calls still running are given up on (their outcome is unknown; never sent again).
        cancel.cancel();
        // Held calls keep waiting across a shutdown (the run pauses); a cancel ends them.
        let cancelling = !self.sealing && self.cancel_requested().is_some();
        let mut indeterminate = false;
        let mut held = false;
        let mut parts = Vec::with_capacity(ids.len());
        let mut settled = Vec::new();
        for ((id, result), (call_key, _, _)) in ids.into_iter().zip(results).zip(keyed) {
            let (out, outcome) = match result {
                Some(ToolOutcome::Held { .. }) if !cancelling => {
                    held = true;
                    continue;
                }
                Some(ToolOutcome::Held { .. }) => (
                    ToolOutput::error("the run was cancelled while its provider held the call; its outcome is unknown"),
                    CallOutcome::Cancelled,
                ),
                Some(ToolOutcome::Completed(out)) => {
                    let outcome = if out.is_error { CallOutcome::Error } else { CallOutcome::Ok };
                    (out, outcome)
                }
                Some(ToolOutcome::Error(message)) => (ToolOutput::error(message), CallOutcome::Error),
                Some(ToolOutcome::Indeterminate(reason)) => {
                    indeterminate = true;
                    (ToolOutput::error(format!("{reason}; its outcome is unknown")), CallOutcome::Unknown)
                }
                None if self.sealing => (
                    ToolOutput::error("broca shut down while the call was in flight; its outcome is unknown"),
                    CallOutcome::Unknown,
                ),
                None if timed_out => (
                    ToolOutput::error(format!("no answer within {} ms; its outcome is unknown", wait.as_millis())),
                    CallOutcome::Unknown,
                ),
                None => (
                    ToolOutput::error("the call was cancelled while in flight; its outcome is unknown"),
                    CallOutcome::Cancelled,
                ),
            };
            if matches!(outcome, CallOutcome::Unknown | CallOutcome::Cancelled) {
                self.unknown_calls.push(id.clone());
            }
            if registered.contains(&call_key) {
                settled.push(call_key);
            }
            self.lineage.append(&Record::ToolResult {
                run_id: self.run_id.clone(),
                step,
                tool_call_id: id.clone(),
                output: out.output.clone(),
                is_error: out.is_error,
                outcome: Some(outcome),
                at_ms: Some(self.lineage.now_ms()),
                refused: out.refused,
            })?;
            parts.push(Part::ToolResult { tool_call_id: id, output: out.output, is_error: out.is_error });
        }
        if !unsent.is_empty() {
            let limit = crate::limits::CALLS_PER_BATCH;
            let output = json!({"kind": "error", "reason": "too_many_calls", "nothing_sent": true, "limit": limit,
                "message": format!("not executed: one step may call at most {limit} tools")});
            parts.extend(self.append_not_executed(step, unsent, &output)?);
        }
        if !settled.is_empty() {
            // A registration goes once its call's result is durable.
            self.commit()?;
            if let Some(registry) = &self.opts.held {
                registry.settled(&settled);
            }
        }
        if held {
            return Ok(BatchEnd::Held);
        }
        self.history.push(Message::of(Role::Tool, parts));
        Ok(BatchEnd::Done { indeterminate: timed_out || indeterminate })
    }
}

/// The tool calls of an assistant message, in planned order: `(id, name, arguments)`.
fn tool_calls(message: &Message) -> Vec<(String, String, serde_json::Value)> {
    message
        .content
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall { tool_call_id, tool_name, input } => {
                Some((tool_call_id.clone(), tool_name.clone(), input.clone()))
            }
            _ => None,
        })
        .collect()
}
