//! `session.retract` (spec §11) and `run.cancel` (§13): driver writes decided on the session's
//! actor, atomically against consumption and the run's own progress. Both are served on a
//! session whose project root is gone (§10.1), and both write nothing when there is nothing
//! to act on.

use std::sync::Arc;

use serde_json::{json, Value};

use super::send::{cancel_run, store_refusal};
use super::{invalid_params, strict, Ops, Reply, ReplyOnce};
use crate::lineage::ledger;
use crate::replay::Resolution;
use crate::lineage::{Lineage, RetractOutcome};
use crate::record::CancelAt;
use crate::session_key::SessionKey;
use crate::store::{Fate, SendLookup};
use crate::wire::Refusal;

/// Runs `decide` on the session's actor and answers with its result. A session without a WAL
/// has nothing to act on: it answers `absent` without creating one.
fn on_actor(
    ops: &Arc<Ops>,
    key: &SessionKey,
    reply: Reply,
    absent: Value,
    decide: impl FnOnce(&Ops, &mut Lineage) -> Result<(Value, Vec<crate::lineage::projection::ControlUnit>), Refusal>
        + Send
        + 'static,
) {
    if !ops.registry.shared().wal_path(key).exists() {
        return reply(Ok(absent));
    }
    let reply = ReplyOnce::new(reply);
    let answer = Arc::clone(&reply);
    let ops2 = Arc::clone(ops);
    let job = Box::new(move |lineage: &mut Lineage| match decide(&ops2, lineage) {
        Ok((body, units)) => {
            answer.answer(Ok(body));
            units
        }
        Err(r) => {
            answer.answer(Err(r));
            Vec::new()
        }
    });
    if let Err(e) = ops.registry.submit(key, job) {
        reply.answer(Err(e.refusal()));
    }
}

pub(super) fn session_retract(ops: &Arc<Ops>, key: &SessionKey, params: Value, reply: Reply) {
    if let Err(r) = strict(&params, &["session", "submission_id"]) {
        return reply(Err(r));
    }
    if params.get("session").is_some_and(|s| s.as_str() != Some(key.session.as_str())) {
        return reply(Err(invalid_params("session", "does not match the route's bound session")));
    }
    let Some(submission_id) = params.get("submission_id").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
        return reply(Err(invalid_params("submission_id", "a non-empty string is required")));
    };
    let submission_id = submission_id.to_string();
    let not_pending = json!({"retracted": false, "reason": "not_pending"});
    on_actor(ops, key, reply, not_pending, move |ops, lineage| {
        let (outcome, units) = lineage.retract(&submission_id).map_err(|e| e.refusal())?;
        if outcome == RetractOutcome::Retracted {
            return Ok((json!({"retracted": true}), units));
        }
        // Not pending: consumed into a run (or delivered as a steer), or never queued here.
        let page = lineage.transcript(u64::MAX, 0).map_err(|e| e.refusal())?;
        let store = &ops.registry.shared().store;
        let row = ledger::send(store, &lineage.key().addr(), &page, SendLookup::Submission(&submission_id))
            .map_err(store_refusal)?;
        let reason = match row.as_ref().map(|r| r.fate) {
            Some(Fate::Started | Fate::Delivered) => "already_started",
            _ => "not_pending",
        };
        Ok((json!({"retracted": false, "reason": reason}), units))
    });
}

pub(super) fn run_cancel(ops: &Arc<Ops>, key: &SessionKey, params: Value, reply: Reply) {
    if let Err(r) = strict(&params, &["run_id", "at"]) {
        return reply(Err(r));
    }
    let Some(run_id) = params.get("run_id").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
        return reply(Err(invalid_params("run_id", "a non-empty string is required")));
    };
    let at = match params.get("at").map(Value::as_str) {
        None | Some(Some("now")) => CancelAt::Now,
        Some(Some("step_boundary")) => CancelAt::StepBoundary,
        Some(_) => return reply(Err(invalid_params("at", "\"now\" or \"step_boundary\""))),
    };
    let run_id = run_id.to_string();
    on_actor(ops, key, reply, json!("not_active"), move |_, lineage| {
        let paused = match lineage.state().resolution() {
            Resolution::Resume { run_id: r } if r == run_id => false,
            Resolution::Paused { run_id: r, .. } if r == run_id => true,
            // Finished, another run, or a queued submission's id: nothing active to cancel.
            _ => return Ok((json!("not_active"), Vec::new())),
        };
        let units = cancel_run(lineage, &run_id, at, paused).map_err(|e| e.refusal())?;
        Ok((json!("ack"), units))
    });
}
