//! The decisions a session's writer makes against its durable state (spec §4, §11, §13): a
//! send's admission and delivery, a retract, a cancel. Each runs on the lineage's owner (the
//! actor thread, or `broca-run`'s own thread), decides everything before it appends, and
//! returns the control units it made durable for the caller to publish.
//!
//! - a keyed re-send answers its recorded fate (or is refused `send_id_reuse` naming the first
//!   differing member); an auth-paused run's own re-send resumes it;
//! - frozen session facts (class, context management, input-token cap) are checked;
//! - delivery: on an idle session the send is queued and consumed by its `RunStarted` in one
//!   barrier (`active`); behind a running turn `queue` waits in the FIFO (`pending`), `steer`
//!   joins the running run at its next step boundary (`active` naming that run), `interrupt`
//!   is queued first, then cancels the running run and starts ahead of plain sends (`pending`).

use super::admission::{inherit_refused, Admission, Checked};
use super::policy::session_policy;
use crate::agent;
use crate::frozen::{PlanManifest, ToolSpec};
use crate::lineage::ledger::{self, RunPhase};
use crate::lineage::projection::ControlUnit;
use crate::lineage::read::TranscriptPage;
use crate::lineage::{Lineage, LineageError, RetractOutcome};
use crate::message::Message;
use crate::op::Op;
use crate::owner::Caller;
use crate::provider::config::RenderConfig;
use crate::record::{CancelAt, Delivery, DropReason, FinishReason, Frozen, PauseReason, Record, RequestIdentity};
use crate::replay::Resolution;
use crate::store::{Fate, SendLookup, SendRow, Store};
use crate::tools::fetch::FetchedPlan;
use crate::wire::answers::{CancelReply, RetractMiss, RetractReply, SendReply};
use crate::wire::send::{differing_field, SendParams};
use crate::wire::{Refusal, RefusalCode};
use cortexkit_role_llm_runner::delivery_order::{EntryDelivery, Mode};

/// Units a decision made durable.
pub type Units = Vec<ControlUnit>;

/// Admits `send` on its session with what [`Admission::precheck`] settled (the named model's
/// route, a first episode's fetched plan). Durable before it answers.
pub fn send(
    admission: &Admission,
    store: &Store,
    lineage: &mut Lineage,
    mut send: SendParams,
    checked: Checked,
    units: &mut Units,
) -> Result<SendReply, Refusal> {
    let sender = super::senders::admit(lineage, &send, &checked.caller)?;
    if let Some(fence) = lineage.deletion_fenced() {
        // The record expired and held calls keep it from being deleted (spec §19): a send may
        // neither revive it nor start a fresh record over it, and a keyed retry reads nothing
        // of it.
        let at = crate::retention::expiry_of(lineage.state()).unwrap_or_default();
        return Err(deletion_fenced(at, fence));
    }
    if let Some(send_id) = send.send_id.clone() {
        if let Some(row) = recorded_send(store, lineage, &send_id, &sender)? {
            if let Some(field) = differing_field(&row.request.identity, &send.identity) {
                let message = format!("send_id {send_id:?} was already used by a send with a different {field}");
                return Err(Refusal::new(RefusalCode::SendIdReuse, message, Some(crate::detail!("field" => field))));
            }
            let page = lineage.transcript(u64::MAX, 0).map_err(|e| e.refusal())?;
            let addr = lineage.key().addr();
            let row = ledger::send(store, &addr, &page, SendLookup::Submission(&row.submission_id))
                .map_err(|e| e.refusal())?
                .unwrap_or(row);
            return resend(store, lineage, &page, &row, units);
        }
    }
    if let Some(moved) = &lineage.state().moved_out {
        return Err(super::moving::session_moved(lineage.addr(), moved.epoch));
    }
    let fenced = lineage.sends_fenced_for_ms();
    if fenced > 0 {
        return Err(super::moving::moving(fenced));
    }
    // A list send inherits the session's model whatever its modes: it joins or starts a run
    // of the session as the owner's would.
    if send.model.is_none() && send.delivery == Delivery::Queue && send.order.is_none() {
        return Err(inherit_refused());
    }
    if let Some(text) = super::senders::render(lineage, send.order.as_ref(), &sender)? {
        send.prompt = text;
    }
    let state = lineage.state();
    let queue_limit = admission.config.limits.queued_sends_per_session;
    if state.queue.len() >= queue_limit {
        let what = "the session's queue of sends is full";
        return Err(crate::wire::over_limit(RefusalCode::SessionQueueFull, what, queue_limit, None));
    }
    let frozen: Option<RenderConfig> = state.last.as_ref().and_then(|e| e.config.config()).cloned();
    if let Resolution::Paused { run_id, reason: PauseReason::AuthRequired } = state.resolution() {
        if send.delivery != Delivery::Interrupt {
            return Err(run_paused(&run_id, "auth_required"));
        }
    }
    if let (Resolution::Resume { run_id } | Resolution::Paused { run_id, .. }, Delivery::Steer) =
        (state.resolution(), send.delivery)
    {
        // A joining steer cannot replace the running run's routing decision.
        let frozen_decision = frozen.as_ref().and_then(|c| c.policy.route_decision_id.as_deref());
        if send.route_decision_id.as_deref().is_some_and(|sent| Some(sent) != frozen_decision) {
            let message = format!("run {run_id} runs under another route_decision_id; a joining send cannot change it");
            return Err(Refusal::new(
                RefusalCode::InvalidParams,
                message,
                Some(crate::detail!("field" => "route_decision_id")),
            ));
        }
    }
    let running = matches!(state.resolution(), Resolution::Resume { .. } | Resolution::Paused { .. });
    // A joining steer runs under the run's frozen directives: it may repeat them, not change them.
    let frozen_directives = frozen.as_ref().map(|c| c.directives.as_slice()).unwrap_or_default();
    if running && send.delivery == Delivery::Steer && send.directives.as_deref().is_some_and(|d| d != frozen_directives)
    {
        return Err(crate::wire::invalid_params("directives", "a joining steer cannot change its run's directives"));
    }
    let plan = plan_for(&send, state.last.is_some(), frozen.as_ref(), checked.fetched)?;
    if let Some(fault) = &send.tools_fault {
        return Err(fault.clone());
    }
    let mut config = match checked.resolved {
        Some(c) => c,
        None => admission.resolve(&send, frozen.as_ref())?,
    };
    config.policy = session_policy(&admission.config, lineage, &send, frozen.as_ref())?;
    config.service_tier = super::tier::run_tier(&send, running, frozen.as_ref(), config.family)?;
    config.directives = send.directives.clone().unwrap_or_default();
    if let Some((manifest, tools)) = plan {
        // The plan's system text comes first, then the send's own system prompt.
        if let Some(text) = &manifest.system_text {
            config.system = Some(match config.system.take() {
                Some(own) => format!("{text}\n\n{own}"),
                None => text.clone(),
            });
        }
        config.plan = Some(manifest);
        // `tools: []` beside the plan: the model is offered no tools at all, plan tools included.
        config.tools = if send.tools.as_ref().is_some_and(Vec::is_empty) { Vec::new() } else { tools };
    }
    let first_owner = checked.caller.as_owner();
    let sender_module = super::senders::caller_module(&checked.caller).map(str::to_owned);
    let from = Admitted {
        sender,
        sender_module,
        first_owner: first_owner.as_ref(),
        credentials: admission.credentials.as_ref(),
    };
    deliver(lineage, send, config, from, units).map_err(|e| e.refusal())
}

/// Who an admitted send is from, and what its run (if it starts one) is admitted with.
struct Admitted<'a> {
    sender: super::senders::Sender,
    /// The attested module the send came from, owner or named sender (`message_senders`).
    sender_module: Option<String>,
    first_owner: Option<&'a crate::owner::Owner>,
    credentials: Option<&'a crate::vault::Credentials>,
}

/// The owner check against the session's durable state (`crate::owner`): anyone before the
/// first episode, else the recorded owner (or, recorded without one, every local caller).
pub fn owner_admits(lineage: &Lineage, op: Op, caller: &Caller) -> Result<(), Refusal> {
    let Some(last) = lineage.state().last.as_ref() else { return Ok(()) };
    if crate::owner::admits(last.owner.as_ref(), caller) {
        return Ok(());
    }
    Err(crate::wire::scope_owner_mismatch(op.name(), caller))
}

/// The plan a send runs under (spec §4): a session's first episode freezes the plan it
/// fetched; every later send runs under the frozen one, and may repeat it but never change it
/// (`plan_drift`), nor bring tools of its own (`invalid_params {field: "tools"}`).
fn plan_for(
    send: &SendParams,
    had_episode: bool,
    frozen: Option<&RenderConfig>,
    fetched: Option<FetchedPlan>,
) -> Result<Option<(PlanManifest, Vec<ToolSpec>)>, Refusal> {
    let frozen_plan = frozen.and_then(|c| c.plan.as_ref());
    if !had_episode {
        return Ok(fetched.map(|f| (f.manifest, f.tools)));
    }
    if let Some(sent) = &send.plan {
        if frozen_plan.map(|p| p.identity.as_str()) != Some(sent.identity.as_str()) {
            let frozen_identity = frozen_plan.map(|p| p.identity.clone());
            let message = match &frozen_identity {
                Some(f) => format!("plan drift: the session runs under plan {f}; this send names {}", sent.identity),
                None => format!(
                    "plan drift: the session's first episode ran without a plan; this send names {}",
                    sent.identity
                ),
            };
            let detail = match frozen_identity {
                Some(f) => crate::detail!("frozen" => f, "sent" => sent.identity),
                None => crate::detail!("sent" => sent.identity),
            };
            return Err(Refusal::new(RefusalCode::PlanDrift, message, Some(detail)));
        }
    }
    let (Some(manifest), Some(config)) = (frozen_plan, frozen) else { return Ok(None) };
    if send.tools.is_some() || send.tools_fault.is_some() {
        return Err(crate::wire::invalid_params("tools", "the session's tools come from its frozen plan"));
    }
    let tools = config.tools.iter().filter(|t| t.module.is_some()).cloned().collect();
    Ok(Some((manifest.clone(), tools)))
}

/// Records the admitted send and delivers it by its mode against the session's running run.
fn deliver(
    lineage: &mut Lineage,
    send: SendParams,
    config: RenderConfig,
    from: Admitted<'_>,
    units: &mut Units,
) -> Result<SendReply, LineageError> {
    let Admitted { sender, sender_module, first_owner, credentials } = from;
    let submission_id = format!("sub-{}", uuid::Uuid::new_v4().simple());
    let running = match lineage.state().resolution() {
        Resolution::Resume { run_id } => Some((run_id, None)),
        Resolution::Paused { run_id, reason } => Some((run_id, Some(reason))),
        Resolution::Empty | Resolution::Idle { .. } => None,
    };
    // A steer into a run that is not going is a plain send.
    let delivery = if running.is_some() { send.delivery } else { Delivery::Queue };
    let request = RequestIdentity {
        send_id: send.send_id.clone(),
        principal: sender.principal(),
        harness: Some(lineage.key().harness.clone()),
        received_at_ms: lineage.now_ms(),
        config: Some(Frozen::new(config.clone())),
        delivery: (send.delivery != Delivery::Queue).then_some(send.delivery),
        target_run: match (&running, delivery) {
            (Some((run_id, _)), Delivery::Steer) => Some(run_id.clone()),
            _ => None,
        },
        identity: send.identity.clone(),
        title: send.title.clone(),
        order: send.order.as_ref().map(|o| o.modes.clone()),
        dedupe_key: send.order.as_ref().and_then(|o| o.dedupe_key.clone()),
        expires_at_ms: send.order.as_ref().and_then(|o| o.expires_at_ms),
    };
    let mut message = Message::user_text(send.prompt.clone());
    message.sender = sender_module;
    message.client_message_id = send.client_message_id.clone();
    for replaced in super::senders::superseded(lineage, send.order.as_ref(), &sender) {
        lineage.append(&Record::Dropped { submission_id: replaced, reason: DropReason::Superseded })?;
    }
    lineage.append(&Record::Queued { submission_id: submission_id.clone(), message: message.clone(), request })?;
    if let Some(order) = &send.order {
        // A list is delivered at its first boundary where one of its modes is possible: on an
        // idle session (no older send waiting to start) that is now, through `idle_start`;
        // otherwise the next step boundary or run end decides (`Lineage::deliver_listed`).
        let idle_start =
            running.is_none() && super::senders::starts_now(&order.modes) && lineage.state().startable() == 1;
        if !idle_start {
            units.extend(lineage.commit()?);
            return Ok(SendReply::pending(submission_id));
        }
        if cortexkit_role_llm_runner::delivery_order::expired(order.expires_at_ms, lineage.now_ms()) {
            lineage.append(&Record::Dropped { submission_id, reason: DropReason::Expired })?;
            units.extend(lineage.commit()?);
            return Ok(SendReply::ended(crate::wire::answers::SendState::Expired));
        }
        message.delivered_as = Some(EntryDelivery::new(Mode::IdleStart));
    }
    match (running, delivery) {
        (None, _) if lineage.state().startable() > 1 => {
            // Older sends still wait (the actor drains them in order): this one queues too.
            units.extend(lineage.commit()?);
            Ok(SendReply::pending(submission_id))
        }
        (None, _) => {
            // Queued and consumed in one barrier: durable before the reply says "active".
            let run_id = format!("run-{submission_id}");
            units.extend(agent::admit_owned(
                lineage,
                &run_id,
                Some(&submission_id),
                &config,
                message,
                send.title,
                credentials,
                first_owner,
            )?);
            crate::failpoint!("send.after_admitted");
            let first = lineage.state().episodes == 1;
            let mut reply = SendReply::active(run_id.as_str(), Some(submission_id));
            if send.order.is_some() {
                reply = reply.started_turn(run_id);
            }
            reply.baseline = first.then(|| config.baseline());
            Ok(reply)
        }
        (Some((run_id, _)), Delivery::Steer) => {
            units.extend(lineage.commit()?);
            Ok(SendReply::active(run_id, None))
        }
        (Some((run_id, paused)), Delivery::Interrupt) => {
            // Queued first (above), then the running run is cancelled through the cancel path.
            units.extend(cancel_run(lineage, &run_id, CancelAt::Now, paused.is_some())?);
            Ok(SendReply::pending(submission_id))
        }
        (Some(_), Delivery::Queue) => {
            units.extend(lineage.commit()?);
            Ok(SendReply::pending(submission_id))
        }
    }
}

/// The send recorded under `send_id`, looked up the cheap way (a new send is the common case):
/// a pending send is in the replay state; anything older is in the store, which holds every
/// committed send once the run-index writer has caught up (each commit that changes a send
/// hands its rows to the writer; `settle` waits for them).
fn recorded_send(
    store: &Store,
    lineage: &Lineage,
    send_id: &str,
    sender: &super::senders::Sender,
) -> Result<Option<SendRow>, Refusal> {
    // A sender's namespace first; a successor checks its predecessor's before its own
    // (llm-runner §9.7 `sender_succession`): a record there decides, a mismatch included.
    for namespace in super::senders::namespaces(lineage.state(), sender) {
        if let Some(row) = recorded_send_of(store, lineage, send_id, namespace.as_deref())? {
            return Ok(Some(row));
        }
    }
    Ok(None)
}

/// [`recorded_send`] in one sender's namespace (`None`: the owner's).
fn recorded_send_of(
    store: &Store,
    lineage: &Lineage,
    send_id: &str,
    principal: Option<&str>,
) -> Result<Option<SendRow>, Refusal> {
    let lookup = SendLookup::SendId { send_id, principal };
    let pending = lineage
        .state()
        .queue
        .iter()
        .rev()
        .find(|p| p.request.send_id.as_deref() == Some(send_id) && p.request.principal.as_deref() == principal);
    if let Some(p) = pending {
        let row = SendRow {
            submission_id: p.submission_id.clone(),
            request: p.request.clone(),
            fate: Fate::Pending,
            run_id: None,
        };
        return Ok(Some(row));
    }
    let addr = lineage.key().addr();
    if !lineage.store_current() {
        // The store stopped at an older checkpoint: read its rows plus the WAL tail after it.
        let page = lineage.transcript(u64::MAX, 0).map_err(|e| e.refusal())?;
        return ledger::send(store, &addr, &page, lookup).map_err(|e| e.refusal());
    }
    lineage.settle();
    store.send(&addr, lookup).map_err(|e| e.refusal())
}

/// The answer a keyed re-send gets: its recorded fate, never a second run. An auth-paused
/// run's own re-send resumes it (the owner drives it after this decision).
fn resend(
    store: &Store,
    lineage: &mut Lineage,
    page: &TranscriptPage,
    row: &SendRow,
    units: &mut Units,
) -> Result<SendReply, Refusal> {
    let addr = lineage.key().addr();
    if let (Fate::Started, Some(run_id)) = (row.fate, &row.run_id) {
        let facts = ledger::run(store, &addr, page, run_id).map_err(|e| e.refusal())?;
        if facts.is_some_and(|f| f.is_last && f.phase == (RunPhase::Paused { reason: PauseReason::AuthRequired })) {
            let resumed = lineage.append_commit(&Record::RunResumed { run_id: run_id.clone() });
            units.extend(resumed.map_err(|e| e.refusal())?.1);
            return Ok(SendReply::active(run_id.as_str(), Some(row.submission_id.clone())));
        }
    }
    let mut reply = ledger::fate(store, &addr, page, row).map_err(|e| e.refusal())?;
    reply.baseline = ledger::first_baseline(page, row);
    Ok(reply)
}

/// Retracts a pending send; a send no longer pending says why (spec §11).
pub fn retract(store: &Store, lineage: &mut Lineage, submission_id: &str) -> Result<(RetractReply, Units), Refusal> {
    let (outcome, units) = lineage.retract(submission_id).map_err(|e| e.refusal())?;
    if outcome == RetractOutcome::Retracted {
        return Ok((RetractReply::RETRACTED, units));
    }
    // Not pending: consumed into a run (or delivered as a steer), or never queued here. The
    // run the session is on is known without the ledger (it may have consumed the send a moment
    // ago); older ones are looked up once this lineage's own rows are in the store.
    let consumed_now = lineage.state().last.as_ref().is_some_and(|e| e.submission_id.as_deref() == Some(submission_id));
    if consumed_now {
        return Ok((RetractReply::missed(RetractMiss::AlreadyStarted), units));
    }
    lineage.settle();
    let page = lineage.transcript(u64::MAX, 0).map_err(|e| e.refusal())?;
    let row = ledger::send(store, &lineage.key().addr(), &page, SendLookup::Submission(submission_id))
        .map_err(|e| e.refusal())?;
    let reason = match row.as_ref().map(|r| r.fate) {
        Some(Fate::Started | Fate::Delivered) => RetractMiss::AlreadyStarted,
        _ => RetractMiss::NotPending,
    };
    Ok((RetractReply::missed(reason), units))
}

/// `run.cancel` of `run_id`: recorded when it is the session's running or paused run.
pub fn cancel(lineage: &mut Lineage, run_id: &str, at: CancelAt) -> Result<(CancelReply, Units), Refusal> {
    let paused = match lineage.state().resolution() {
        Resolution::Resume { run_id: r } if r == run_id => false,
        Resolution::Paused { run_id: r, .. } if r == run_id => true,
        // Finished, another run, or a queued submission's id: nothing active to cancel.
        _ => return Ok((CancelReply::NotActive, Vec::new())),
    };
    let units = cancel_run(lineage, run_id, at, paused).map_err(|e| e.refusal())?;
    Ok((CancelReply::Ack, units))
}

/// Records a cancel of the session's running (or paused) run. A paused run is at a boundary
/// already: it ends `cancelled` at once, without another model step. Durable when returned.
fn cancel_run(lineage: &mut Lineage, run_id: &str, at: CancelAt, paused: bool) -> Result<Units, LineageError> {
    let current = lineage.state().last.as_ref().and_then(|e| e.cancel);
    // A duplicate boundary request is idempotent; a later `now` escalates one.
    let needed =
        !matches!((current, at), (Some(CancelAt::Now), _) | (Some(CancelAt::StepBoundary), CancelAt::StepBoundary));
    if needed {
        lineage.append(&Record::RunCancelRequested { run_id: run_id.into(), at })?;
    }
    if paused {
        let held = lineage.cancel_held_calls(run_id)?;
        lineage.finish_run(run_id, FinishReason::Cancelled, None, held)?;
    }
    lineage.commit()
}

/// The refusal a send to a paused run gets.
pub fn run_paused(run_id: &str, reason: &str) -> Refusal {
    let message = format!("run {run_id} is paused ({reason}): re-authenticate and resend its own send_id, cancel it, or send with delivery \"interrupt\"");
    Refusal::new(
        RefusalCode::RunPaused,
        message,
        Some(crate::detail!("kind" => "run_paused", "run_id" => run_id, "reason" => reason)),
    )
}

/// The refusal of a send to a record that expired at `expired_at_ms` and that `fence` keeps
/// from being deleted (spec §19): `open_failed` (no fresh record can start over it yet), with
/// `detail {class, reason: "retention_fenced", fence, expired_at_ms}`; `class` is `permanent`
/// only for a fence this runtime never lifts.
fn deletion_fenced(expired_at_ms: u64, fence: &crate::intake::fence::Fence) -> Refusal {
    let message = format!(
        "open failed: the session's record expired under its retention (detail.expired_at_ms) and held calls keep \
         it from being deleted ({}); a send starts a fresh record once it is",
        fence.code()
    );
    let class = if fence.permanent() { "permanent" } else { "transient" };
    let detail = crate::detail!(
        "class" => class,
        "reason" => "retention_fenced",
        "fence" => fence.code(),
        "expired_at_ms" => expired_at_ms
    );
    Refusal::new(crate::wire::RefusalCode::OpenFailed, message, Some(detail))
}
