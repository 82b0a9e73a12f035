//! `session.send` (spec §4, §10, §11): parse every member, resolve the model before any write,
//! then one actor job decides against the session's durable state:
//!
//! - a keyed re-send answers its recorded fate (or is refused `send_id_reuse` naming the first
//!   differing member); an auth-paused run's own re-send resumes it;
//! - frozen session facts (class, context management, input-token cap) are checked;
//! - delivery: on an idle session the send is queued and consumed by its `RunStarted` in one
//!   barrier (`active`); behind a running turn `queue` waits in the FIFO (`pending`), `steer`
//!   joins the running run at its next step boundary (`active` naming that run), `interrupt`
//!   is queued first, then cancels the running run and starts ahead of plain sends (`pending`).
//!
//! Every refusal is decided before anything is written.

pub mod parse;

use std::sync::Arc;

use serde_json::{json, Value};

use parse::{Delivery, SendParams};

use super::{invalid_params, Ops, Reply, ReplyOnce};
use crate::agent;
use crate::catalog::route::{self, AdmissionError, ModelRequest, RouteOverrides};
use crate::lineage::ledger::{self, RunPhase};
use crate::lineage::read::TranscriptPage;
use crate::replay::Resolution;
use crate::lineage::{Lineage, LineageError};
use crate::message::Message;
use crate::provider::client::now_ms;
use crate::provider::config::{AuthSource, RenderConfig};
use crate::record::{CancelAt, FinishReason, PauseReason, Record, RequestIdentity};
use crate::session_key::SessionKey;
use crate::store::{Fate, SendLookup, SendRow, Store};
use crate::wire::{Refusal, RefusalCode};

pub(super) fn session_send(ops: &Arc<Ops>, route: &super::Route, params: Value, reply: Reply) {
    let key = &route.key;
    let send = match parse::parse(&params, key) {
        Ok(s) => s,
        Err(r) => return reply(Err(r)),
    };
    // Tool providers need a per-call preset on scoped routes, which only a fetch plan gives:
    // legacy direct tools cannot run there (broca has no fetch plans yet).
    if route.scoped && send.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        let message = "session.send: tools on a scoped session must come from a fetch plan; legacy tools are refused";
        let detail = Some(crate::detail!("class" => "permanent"));
        return reply(Err(Refusal::new(RefusalCode::ScopedToolsRequirePlan, message, detail)));
    }
    if ops.registry.is_sealing() {
        let detail = Some(crate::detail!("class" => "transient"));
        return reply(Err(Refusal::new(
            RefusalCode::ModuleReloading,
            "broca is shutting down; send again shortly",
            detail,
        )));
    }
    if let Err(r) = project_root_present(key) {
        return reply(Err(r));
    }
    // "none" is the only mode this build serves: any other value is refused by name before the
    // session is even opened (whatever it bound, the send cannot run).
    if let Some(mode) = send.context_management.as_ref().filter(|m| **m != "none") {
        return reply(Err(context_unavailable(mode)));
    }
    let shared = ops.registry.shared();
    let exists = shared.wal_path(key).exists();
    // A named model resolves before the session is even opened; an omitted one needs the
    // session's frozen config, so only a session with history can omit it.
    let resolved = match &send.model {
        Some(_) => match resolve(ops, &send, None) {
            Ok(c) => Some(c),
            Err(r) => return reply(Err(r)),
        },
        None if !exists => {
            return reply(Err(invalid_params("model", "required: the session has no episode to inherit it from")))
        }
        // Only a steer or an interrupt takes the session's frozen model; a plain send names one.
        None if send.delivery == Delivery::Queue && send.send_id.is_none() => {
            return reply(Err(invalid_params(
                "model",
                "required: only a steer or an interrupt inherits the session's model",
            )))
        }
        None => None,
    };
    let placement = ops.config.placement_for(send.session_class.as_deref(), send.retention.is_some());
    let reply = ReplyOnce::new(reply);
    let answer = Arc::clone(&reply);
    let ops2 = Arc::clone(ops);
    let job = Box::new(move |lineage: &mut Lineage| {
        let mut units = Vec::new();
        let result = admit(&ops2, lineage, send, resolved, &mut units);
        answer.answer(result);
        units
    });
    if let Err(e) = ops.registry.submit_placed(key, placement, job) {
        reply.answer(Err(open_refusal(ops, key, e)));
    }
}

/// An open failure as a send answers it: another process holding the session's lease is
/// `session_busy` naming the run it is driving and its state (spec §14), distinct from
/// `lease_stale`.
fn open_refusal(ops: &Ops, key: &SessionKey, e: LineageError) -> Refusal {
    use crate::lineage::read;
    use crate::wal::LeaseError;
    let LineageError::Lease(LeaseError::Busy { .. }) = &e else { return e.refusal() };
    let shared = ops.registry.shared();
    let snapshot = read::snapshot(shared, key);
    let (run_id, state) = match snapshot.map(|p| p.map(|p| p.resolution)) {
        Ok(Some(Resolution::Resume { run_id })) => (Some(run_id), "active"),
        Ok(Some(Resolution::Paused { run_id, .. })) => (Some(run_id), "paused"),
        Ok(Some(Resolution::Idle { run_id, .. })) => (Some(run_id), "idle"),
        _ => (None, "leased"),
    };
    let message = format!("session busy: another broca process holds this session ({e})");
    Refusal::new(RefusalCode::SessionBusy, message, Some(crate::detail!("run_id" => run_id, "state" => state)))
}

/// §10.1: writes refuse a session whose project root is gone (reads still work).
pub(super) fn project_root_present(key: &SessionKey) -> Result<(), Refusal> {
    let root = std::path::Path::new(&key.project_root);
    if root.is_dir() {
        return Ok(());
    }
    let message =
        format!("invalid project root: {} does not exist; recreate it to continue this session", key.project_root);
    Err(Refusal::new(RefusalCode::InvalidProjectRoot, message, Some(crate::detail!("path" => key.project_root))))
}

/// Resolves the send's model (or the inherited one) against the catalog.
fn resolve(ops: &Ops, send: &SendParams, inherited: Option<&RenderConfig>) -> Result<RenderConfig, Refusal> {
    let (model, variant) = match (&send.model, inherited) {
        (Some(m), _) => (m.id.clone(), m.variant.clone()),
        (None, Some(c)) => (format!("{}/{}", c.provider, c.model), c.variant.clone()),
        (None, None) => return Err(invalid_params("model", "required")),
    };
    let request = ModelRequest {
        model,
        variant,
        system: send.system.clone(),
        max_output_tokens: send.max_output_tokens.or(inherited.and_then(|c| c.max_output_tokens)),
        max_steps: send.max_steps.or(inherited.and_then(|c| c.max_steps)),
        tools: send.tools.clone().or_else(|| inherited.map(|c| c.tools.clone())).unwrap_or_default(),
    };
    let overrides = RouteOverrides { base_url_override: ops.base_url_override.clone(), auth: AuthSource::None };
    let catalog = ops.catalog.read();
    let config = route::resolve(catalog.as_ref(), ops.lkg_path(), &request, &overrides).map_err(|e| e.refusal())?;
    if let Some(ttl) = send.cache.as_ref().and_then(|c| c.get("ttl")).and_then(Value::as_str) {
        if ttl == "24h" && !openai_api_route(&config) {
            let e = AdmissionError::RouteUnsupported {
                model: format!("{}/{}", config.provider, config.model),
                what: "cache ttl \"24h\" is served only on OpenAI's own API-key routes".into(),
            };
            return Err(e.refusal());
        }
    }
    Ok(config)
}

fn openai_api_route(config: &RenderConfig) -> bool {
    use crate::provider::event::Family;
    config.provider == "openai" && matches!(config.family, Family::OpenaiChat | Family::OpenaiResponses)
}

/// The actor half: everything that depends on the session's durable state.
fn admit(
    ops: &Ops,
    lineage: &mut Lineage,
    send: SendParams,
    resolved: Option<RenderConfig>,
    units: &mut Vec<crate::lineage::projection::ControlUnit>,
) -> Result<Value, Refusal> {
    let store = Arc::clone(&ops.registry.shared().store);
    let addr = lineage.key().addr();
    if let Some(send_id) = send.send_id.clone() {
        if let Some(row) = recorded_send(ops, lineage, &send_id)? {
            if let Some(field) = parse::differing_field(&row.request.identity, &send.identity) {
                let message = format!("send_id {send_id:?} was already used by a send with a different {field}");
                return Err(Refusal::new(RefusalCode::SendIdReuse, message, Some(crate::detail!("field" => field))));
            }
            let page = lineage.transcript(u64::MAX, 0).map_err(|e| e.refusal())?;
            let row = ledger::send(&store, &addr, &page, SendLookup::Submission(&row.submission_id))
                .map_err(store_refusal)?
                .unwrap_or(row);
            return resend(&store, lineage, &page, &row, units);
        }
    }
    if send.model.is_none() && send.delivery == Delivery::Queue {
        return Err(invalid_params("model", "required: only a steer or an interrupt inherits the session's model"));
    }
    let state = lineage.state();
    let frozen: Option<RenderConfig> = state.last.as_ref().and_then(|e| e.config.config()).cloned();
    if let Resolution::Paused { run_id, reason: PauseReason::AuthRequired } = state.resolution() {
        if send.delivery != Delivery::Interrupt {
            return Err(run_paused(&run_id, "auth_required"));
        }
    }
    let mut config = match resolved {
        Some(c) => c,
        None => resolve(ops, &send, frozen.as_ref())?,
    };
    config.policy = session_policy(&ops.config, lineage, &send, frozen.as_ref())?;
    let submission_id = format!("sub-{}", uuid::Uuid::new_v4().simple());
    let running = match lineage.state().resolution() {
        Resolution::Resume { run_id } => Some((run_id, None)),
        Resolution::Paused { run_id, reason } => Some((run_id, Some(reason))),
        Resolution::Empty | Resolution::Idle { .. } => None,
    };
    let delivery = match (&running, send.delivery) {
        // A steer into a run that is not going (or is auth-paused) is a plain send.
        (None, _) => Delivery::Queue,
        (Some(_), d) => d,
    };
    let request = RequestIdentity {
        send_id: send.send_id.clone(),
        principal: None,
        harness: Some(lineage.key().harness.clone()),
        received_at_ms: now_ms(),
        config: Some(crate::record::Frozen::new(config.clone())),
        delivery: (send.delivery != Delivery::Queue).then_some(send.delivery),
        target_run: match (&running, delivery) {
            (Some((run_id, _)), Delivery::Steer) => Some(run_id.clone()),
            _ => None,
        },
        identity: send.identity.clone(),
        title: send.title.clone(),
    };
    let message = Message::user_text(send.prompt.clone());
    let queued = Record::Queued { submission_id: submission_id.clone(), message: message.clone(), request };
    let fail = |e: LineageError| e.refusal();
    lineage.append(&queued).map_err(fail)?;
    match (running, delivery) {
        (None, _) if lineage.state().queue.len() > 1 => {
            // Older sends still wait (the actor drains them in order): this one queues too.
            units.extend(lineage.commit().map_err(fail)?);
            Ok(json!({"state": "pending", "submission_id": submission_id}))
        }
        (None, _) => {
            // Queued and consumed in one barrier: durable before the reply says "active".
            let run_id = format!("run-{submission_id}");
            units.extend(
                agent::admit(lineage, &run_id, Some(&submission_id), &config, message, send.title).map_err(fail)?,
            );
            Ok(json!({"state": "active", "run_id": run_id, "submission_id": submission_id}))
        }
        (Some((run_id, _)), Delivery::Steer) => {
            units.extend(lineage.commit().map_err(fail)?);
            Ok(json!({"state": "active", "run_id": run_id}))
        }
        (Some((run_id, paused)), Delivery::Interrupt) => {
            // Queued first (above), then the running run is cancelled through the cancel path.
            units.extend(cancel_run(lineage, &run_id, CancelAt::Now, paused.is_some()).map_err(fail)?);
            Ok(json!({"state": "pending", "submission_id": submission_id}))
        }
        (Some(_), Delivery::Queue) => {
            units.extend(lineage.commit().map_err(fail)?);
            Ok(json!({"state": "pending", "submission_id": submission_id}))
        }
    }
}

/// The send recorded under `send_id`, looked up the cheap way on the actor (a new send is the
/// common case): a pending send is in the replay state; anything older is in the store, which
/// holds every committed send once the run-index writer has caught up (each commit that
/// changes a send hands its rows to the writer; `settle` waits for them).
fn recorded_send(ops: &Ops, lineage: &Lineage, send_id: &str) -> Result<Option<SendRow>, Refusal> {
    let pending = lineage.state().queue.iter().rev().find(|p| p.request.send_id.as_deref() == Some(send_id));
    if let Some(p) = pending {
        let row = SendRow {
            submission_id: p.submission_id.clone(),
            request: p.request.clone(),
            fate: Fate::Pending,
            run_id: None,
        };
        return Ok(Some(row));
    }
    let shared = ops.registry.shared();
    let addr = lineage.key().addr();
    if !lineage.store_current() {
        // The store stopped at an older checkpoint: read its rows plus the WAL tail after it.
        let page = lineage.transcript(u64::MAX, 0).map_err(|e| e.refusal())?;
        return ledger::send(&shared.store, &addr, &page, SendLookup::SendId(send_id)).map_err(store_refusal);
    }
    lineage.settle();
    shared.store.send(&addr, SendLookup::SendId(send_id)).map_err(store_refusal)
}

/// The session policy a new send runs under: frozen facts checked, omitted ones inherited.
/// The module and `broca-run` admit through it alike (nothing is written when it refuses).
pub fn session_policy(
    broca_config: &crate::config::BrocaConfig,
    lineage: &Lineage,
    send: &SendParams,
    frozen: Option<&RenderConfig>,
) -> Result<crate::provider::config::RunPolicy, Refusal> {
    let state = lineage.state();
    let had_episode = state.last.is_some();
    let prior = frozen.map(|c| c.policy.clone()).unwrap_or_default();
    // The class is frozen by the first send, its absence included.
    let session_class = match (&send.session_class, had_episode) {
        (Some(c), true) if prior.session_class.as_ref() != Some(c) => {
            return Err(invalid_params("session_class", "the session's class was frozen by its first send"))
        }
        (c, true) => c.clone().or(prior.session_class.clone()),
        (c, false) => c.clone(),
    };
    // Context management binds on the first episode; a session without a recorded value is "none".
    let bound =
        if had_episode { Some(prior.context_management.clone().unwrap_or_else(|| json!("none"))) } else { None };
    let context_management = match (&send.context_management, bound) {
        (Some(sent), Some(bound)) if *sent != bound => {
            let message = format!("context_management is bound to {bound} for this session; {sent} differs");
            let detail = crate::detail!("frozen" => bound, "sent" => sent, "class" => "permanent");
            return Err(Refusal::new(RefusalCode::ContextManagementChanged, message, Some(detail)));
        }
        (_, Some(bound)) => bound,
        (Some(sent), None) => sent.clone(),
        (None, None) => json!(broca_config.context_default_for(&lineage.key().project_root).unwrap_or("none")),
    };
    if context_management != "none" {
        // Bound (by an older build) to a mode this build does not serve: never run it as "none".
        return Err(context_unavailable(&context_management));
    }
    let max_input_tokens = match (send.max_input_tokens, state.input_cap) {
        (Some(new), Some(cap)) if new > cap => {
            return Err(invalid_params("budget.max_input_tokens", "the session's input-token cap can only decrease"))
        }
        (new, cap) => new.or(cap),
    };
    let inherits = matches!(send.delivery, Delivery::Steer | Delivery::Interrupt);
    let (conversation_key, source) = match (&send.conversation_key, &prior.conversation_key) {
        (Some(k), _) => (k.clone(), "caller"),
        (None, Some(k)) => (k.clone(), "inherited"),
        (None, None) => (lineage.key().addr(), "session"),
    };
    Ok(crate::provider::config::RunPolicy {
        context_management: Some(context_management),
        session_class,
        on_restart: send.on_restart.clone(),
        max_input_tokens,
        cache: send.cache.clone().or_else(|| if inherits { prior.cache.clone() } else { None }),
        conversation_key: Some(conversation_key),
        conversation_key_source: Some(source.into()),
        retention: send.retention.or(prior.retention),
    })
}

fn context_unavailable(mode: &Value) -> Refusal {
    let name = match mode {
        Value::Object(m) => m.get("transform").and_then(Value::as_str).unwrap_or("").to_string(),
        other => other.as_str().unwrap_or("").to_string(),
    };
    let message = format!("context management {name:?} is not available in this build");
    let detail = crate::detail!("mode" => mode, "class" => "permanent");
    Refusal::new(RefusalCode::ContextManagementUnavailable, message, Some(detail))
}

/// Records a cancel of the session's running (or paused) run. A paused run is at a boundary
/// already: it ends `cancelled` at once, without another model step. Durable when returned.
pub(super) fn cancel_run(
    lineage: &mut Lineage,
    run_id: &str,
    at: CancelAt,
    paused: bool,
) -> Result<Vec<crate::lineage::projection::ControlUnit>, LineageError> {
    let current = lineage.state().last.as_ref().and_then(|e| e.cancel);
    // A duplicate boundary request is idempotent; a later `now` escalates one.
    let needed =
        !matches!((current, at), (Some(CancelAt::Now), _) | (Some(CancelAt::StepBoundary), CancelAt::StepBoundary));
    if needed {
        lineage.append(&Record::RunCancelRequested { run_id: run_id.into(), at })?;
    }
    if paused {
        lineage.finish_run(run_id, FinishReason::Cancelled, None, vec![])?;
    }
    lineage.commit()
}

/// The answer a keyed re-send gets: its recorded fate, never a second run. An auth-paused
/// run's own re-send resumes it (the actor drives it after this job).
fn resend(
    store: &Store,
    lineage: &mut Lineage,
    page: &TranscriptPage,
    row: &SendRow,
    units: &mut Vec<crate::lineage::projection::ControlUnit>,
) -> Result<Value, Refusal> {
    let addr = lineage.key().addr();
    if row.fate == Fate::Started {
        if let Some(run_id) = &row.run_id {
            let facts = ledger::run(store, &addr, page, run_id).map_err(store_refusal)?;
            if let Some(f) = facts.filter(|f| f.is_last) {
                if f.phase == (RunPhase::Paused { reason: PauseReason::AuthRequired }) {
                    let resumed = lineage.append_commit(&Record::RunResumed { run_id: run_id.clone() });
                    units.extend(resumed.map_err(|e| e.refusal())?.1);
                    return Ok(json!({"state": "active", "run_id": run_id, "submission_id": row.submission_id}));
                }
            }
        }
    }
    fate_reply(store, &addr, page, row)
}

/// What a send's durable fate answers (a re-send and `send.status` alike).
pub(super) fn fate_reply(store: &Store, lineage: &str, page: &TranscriptPage, row: &SendRow) -> Result<Value, Refusal> {
    let run_state = |run_id: &str| -> Result<Value, Refusal> {
        let facts = ledger::run(store, lineage, page, run_id).map_err(store_refusal)?;
        Ok(match facts.map(|f| f.phase) {
            Some(RunPhase::Active) | None => json!({"state": "active", "run_id": run_id}),
            Some(RunPhase::Paused { reason: PauseReason::Restart }) => {
                json!({"state": "paused", "run_id": run_id, "reason": "restart", "pause_reason": "restart"})
            }
            Some(RunPhase::Paused { reason }) => {
                json!({"state": "paused", "run_id": run_id, "reason": crate::record::pause_name(reason)})
            }
            Some(RunPhase::Finished { reason }) => {
                json!({"state": "finished", "run_id": run_id, "reason": reason.as_str()})
            }
        })
    };
    match (row.fate, &row.run_id) {
        (Fate::Started, Some(run_id)) => {
            let mut answer = run_state(run_id)?;
            if answer["state"] == "active" {
                answer["submission_id"] = json!(row.submission_id);
            }
            Ok(answer)
        }
        (Fate::Delivered, Some(run_id)) => {
            let mut answer = run_state(run_id)?;
            answer["delivered"] = json!({"as": "step", "ref": run_id});
            Ok(answer)
        }
        (Fate::Retracted, _) => Ok(json!({"state": "retracted", "submission_id": row.submission_id})),
        _ => {
            // Still queued. A steer waiting for its run's next boundary answers that run.
            let target = row.request.target_run.as_deref().filter(|_| row.request.delivery() == Delivery::Steer);
            match target.filter(|t| matches!(&page.resolution, Resolution::Resume { run_id } if run_id == t)) {
                Some(run_id) => Ok(json!({"state": "active", "run_id": run_id})),
                None => Ok(json!({"state": "pending", "submission_id": row.submission_id})),
            }
        }
    }
}

pub(super) fn run_paused(run_id: &str, reason: &str) -> Refusal {
    let message = format!("run {run_id} is paused ({reason}): re-authenticate and resend its own send_id, cancel it, or send with delivery \"interrupt\"");
    Refusal::new(
        RefusalCode::RunPaused,
        message,
        Some(crate::detail!("kind" => "run_paused", "run_id" => run_id, "reason" => reason)),
    )
}

pub(super) fn store_refusal(e: crate::store::StoreError) -> Refusal {
    Refusal::new(RefusalCode::OpenFailed, format!("open failed: {e}"), Some(crate::detail!("class" => "transient")))
}
