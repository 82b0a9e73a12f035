//! `run.status`, `run.result` and `send.status` (spec §4, §14): strict reads answered from
//! durable state (store rows ⊕ the WAL tail, see `lineage::ledger`) plus the live step board.
//! None of them opens the session's actor, except `run.status` finding an orphan a previous
//! process left open, which it seals first (so the answer is terminal, not a stale "active").

use serde_json::{json, Value};

use super::Ops;
use crate::lineage::ledger::{self, RunFacts, RunPhase};
use crate::lineage::read::{self, TranscriptPage};
use crate::lineage::reader::Reader;
use crate::message::Role;
use crate::record::ProviderError;
use crate::replay::Resolution;
use crate::session_key::SessionKey;
use crate::store::{Fate, SendLookup};
use crate::wire::answers::Delivered;
use crate::wire::requests::{ResultRequest, SendStatusRequest, StatusRequest};
use crate::wire::status::{FinalMessage, RunResult, RunState, RunStatus, WireError};
use crate::wire::{Refusal, RefusalCode};

/// The session's durable snapshot, `None` when it has no WAL.
fn snapshot(ops: &Ops, key: &SessionKey) -> Result<Option<TranscriptPage>, Refusal> {
    read::snapshot(ops.registry.shared(), key).map_err(|e| e.refusal())
}

/// A known run's status; `page` gives the held calls of the session's last run.
fn run_body(ops: &Ops, key: &SessionKey, facts: &RunFacts, page: &TranscriptPage) -> Result<RunStatus, Refusal> {
    let run_id = Some(facts.run_id.clone());
    let mut out = match &facts.phase {
        RunPhase::Active => RunStatus::bare(run_id, RunState::Active),
        RunPhase::Paused { reason } => RunStatus::paused(facts.run_id.clone(), *reason),
        RunPhase::Finished { reason } => RunStatus::bare(run_id, RunState::Finished(*reason)),
    };
    out.error = facts.error.as_ref().map(WireError::from);
    if facts.phase == (RunPhase::Finished { reason: crate::record::FinishReason::Interrupted }) {
        // The durable interrupt reason (llm-runner §6.5), from the seal's recorded diagnostic.
        out.reason = facts.error.as_ref().and_then(ProviderError::interrupt_reason);
    }
    out.detail = facts.detail.clone();
    out.usage = Some(facts.usage.clone());
    out.title = facts.title.clone();
    out.auth_selection = facts.auth_selection.as_ref().and_then(|a| a.credential_id.clone());
    if matches!(facts.phase, RunPhase::Finished { .. }) {
        // Every acknowledged steer reaches the transcript before its run's terminal; these
        // came after the run's last model step, so no model of the run saw them.
        out.undelivered_steers = Some(facts.undelivered_steers.clone());
        out.finish = facts.finish.as_deref().map(finish_name);
    }
    if facts.phase == RunPhase::Active {
        out.step = ops.registry.steps().get(&facts.run_id);
    }
    if page.state.last.as_ref().is_some_and(|e| e.run_id == facts.run_id) {
        out.held_calls = crate::lineage::projection::held_calls(&page.state);
    }
    if let RunPhase::Finished { reason: reason @ crate::record::FinishReason::Completed } = facts.phase {
        if let Some(reader) = Reader::open(ops.registry.shared(), key) {
            out.directives =
                super::directives::of_run(&reader, page, &facts.run_id, Some(reason)).map_err(|e| e.refusal())?;
        }
    }
    Ok(out)
}

pub(super) fn run_status(ops: &Ops, key: &SessionKey, request: StatusRequest) -> Result<Value, Refusal> {
    status_of(ops, key, request.run_id).map(super::body)
}

pub(super) fn status_of(ops: &Ops, key: &SessionKey, run_id: Option<String>) -> Result<RunStatus, Refusal> {
    let idle = || RunStatus::bare(None, RunState::Idle);
    let Some(mut page) = snapshot(ops, key)? else {
        return Ok(match run_id {
            Some(id) => RunStatus::bare(Some(id), RunState::Unknown),
            None => idle(),
        });
    };
    if matches!(page.resolution, Resolution::Resume { .. }) && !ops.registry.is_open(key) {
        // An open run with no actor here was left by a previous process: opening the session
        // seals it (interrupted, with its diagnostic) before this answers. Another process
        // holding the lease keeps it active.
        if ops.registry.open(key).is_ok() {
            page = snapshot(ops, key)?.unwrap_or(page);
        }
    }
    let store = &ops.registry.shared().store;
    let addr = key.addr();
    let Some(run_id) = run_id else {
        // Session-level: the last episode.
        let last = match &page.resolution {
            Resolution::Empty => return Ok(idle()),
            Resolution::Idle { run_id, .. } | Resolution::Paused { run_id, .. } | Resolution::Resume { run_id } => {
                run_id.clone()
            }
        };
        let facts = ledger::run(store, &addr, &page, &last).map_err(|e| e.refusal())?;
        return facts.map_or_else(|| Ok(idle()), |f| run_body(ops, key, &f, &page));
    };
    if let Some(facts) = ledger::run(store, &addr, &page, &run_id).map_err(|e| e.refusal())? {
        return run_body(ops, key, &facts, &page);
    }
    // A queued send's provisional run id (`run-` + its submission id): its fate, from the WAL.
    if let Some(submission) = run_id.strip_prefix("run-").filter(|s| s.starts_with("sub-")) {
        if let Some(row) =
            ledger::send(store, &addr, &page, SendLookup::Submission(submission)).map_err(|e| e.refusal())?
        {
            return Ok(match (row.fate, &row.run_id) {
                (Fate::Delivered, Some(x)) | (Fate::Started, Some(x)) => {
                    let facts = ledger::run(store, &addr, &page, x).map_err(|e| e.refusal())?;
                    let unknown = || RunStatus::bare(Some(x.clone()), RunState::Unknown);
                    let mut body = facts.map_or_else(|| Ok(unknown()), |f| run_body(ops, key, &f, &page))?;
                    if row.fate == Fate::Delivered {
                        body.delivered = Some(Delivered { as_: "step", reference: x.clone() });
                    }
                    body
                }
                (Fate::Retracted | Fate::Superseded | Fate::Expired, _) => RunStatus::bare(None, RunState::Retracted),
                _ => RunStatus::bare(None, RunState::Pending),
            });
        }
    }
    Ok(RunStatus::bare(Some(run_id), RunState::Unknown))
}

/// `run.result {run_id}`: state, usage, reason, error and the final assistant message's text.
pub(super) fn run_result(ops: &Ops, key: &SessionKey, request: ResultRequest) -> Result<Value, Refusal> {
    let run_id = request.run_id;
    // The role's answer for a run this session does not know (its vector `run-result.json`).
    let unknown = || {
        let detail = Some(crate::detail!("class" => "permanent"));
        Refusal::new(RefusalCode::UnknownRun, format!("no run {run_id} in this session"), detail)
    };
    let Some(page) = snapshot(ops, key)? else { return Err(unknown()) };
    let shared = ops.registry.shared();
    let Some(facts) = ledger::run(&shared.store, &key.addr(), &page, &run_id).map_err(|e| e.refusal())? else {
        return Err(unknown());
    };
    let mut out = RunResult::of(run_id.clone(), run_body(ops, key, &facts, &page)?);
    if let RunPhase::Finished { reason } = facts.phase {
        out.finish_reason =
            Some(facts.error.as_ref().and_then(ProviderError::interrupt_reason).unwrap_or(reason.as_str()));
        let reader = Reader::open(shared, key).ok_or_else(unknown)?;
        let final_message = read::last_message_of_run(&reader, &run_id, Role::Assistant).map_err(|e| e.refusal())?;
        if let Some((internal, message)) = final_message {
            let ordinal = crate::lineage::projection::served_ordinal(internal);
            let text = message.text();
            out.final_message = Some(FinalMessage { ordinal, mid: crate::lineage::projection::mid(internal), text });
            let frame = serde_json::to_vec(&json!({"result": &out})).map_or(0, |b| b.len()) + subc_protocol::HEADER_LEN;
            if frame > subc_protocol::MAX_DELIVERED_FRAME_LEN {
                let subject = json!({"kind": "message", "session": key.session, "ordinal": ordinal});
                let limit = subc_protocol::MAX_DELIVERED_FRAME_LEN;
                let detail = crate::detail!("bytes" => frame, "limit" => limit, "subject" => subject);
                let message = format!(
                    "run.result: the final message m{ordinal} makes a {frame}-byte reply, over the transport limit"
                );
                return Err(Refusal::new(RefusalCode::ReplyTooLarge, message, Some(detail)));
            }
        }
    }
    Ok(super::body(out))
}

/// `send.status {send_id}` (alias `session.send_status`): what an identical re-send would be
/// answered, computed from durable state, writing nothing.
pub(super) fn send_status(ops: &Ops, route: &super::Route, request: SendStatusRequest) -> Result<Value, Refusal> {
    let key = &route.key;
    let send_id = request.send_id;
    let unknown = || {
        let message = format!("no send with send_id {send_id:?} is recorded for this session");
        Refusal::new(RefusalCode::UnknownSend, message, Some(crate::detail!("class" => "permanent")))
    };
    let Some(page) = snapshot(ops, key)? else { return Err(unknown()) };
    let store = &ops.registry.shared().store;
    let addr = key.addr();
    // The caller's own namespace (a successor's predecessor's first), llm-runner §9.7.
    let sender = crate::actor::senders::reader_of(&page.state, &route.caller);
    let mut found = None;
    for namespace in crate::actor::senders::namespaces(&page.state, &sender) {
        let lookup = SendLookup::SendId { send_id: &send_id, principal: namespace.as_deref() };
        found = ledger::send(store, &addr, &page, lookup).map_err(|e| e.refusal())?;
        if found.is_some() {
            break;
        }
    }
    let Some(row) = found else { return Err(unknown()) };
    let mut reply = ledger::fate(store, &addr, &page, &row).map_err(|e| e.refusal())?;
    reply.baseline = ledger::first_baseline(&page, &row);
    Ok(super::body(reply))
}

/// A recorded step finish as llm-runner §6.6 spells it: broca's decoders already normalize a
/// provider's reason into the role's set, so a known value passes through; anything else (an
/// older record's raw spelling) is `other`, never guessed.
fn finish_name(recorded: &str) -> String {
    match recorded {
        "stop" | "length" | "content_filter" | "tool_calls" | "error" | "other" => recorded.to_owned(),
        // A model's refusal (openai chat's `refusal` member) is filtered generation.
        "refusal" => "content_filter".to_owned(),
        _ => "other".to_owned(),
    }
}
