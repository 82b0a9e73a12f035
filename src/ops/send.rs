//! `session.send` (spec §4, §10, §11): the params decoded ([`crate::wire::send`]), the send
//! pre-checked before its session is opened ([`Admission::precheck`]), then handed to the
//! session's actor, which decides it against the durable state ([`crate::actor::decide::send`]).
//! Every refusal is decided before anything is written.

use std::sync::Arc;

use serde_json::Value;

use super::{Ops, Reply};
use crate::actor::admission::{Arrival, Checked};
use crate::actor::{Answer, SessionCommand};
use crate::lineage::read;
use crate::lineage::LineageError;
use crate::replay::Resolution;
use crate::session_key::SessionKey;
use crate::wal::LeaseError;
use crate::wire::{send, Refusal, RefusalCode};

pub(super) fn session_send(ops: &Arc<Ops>, route: &super::Route, params: Value, reply: Reply) {
    let t0 = std::time::Instant::now();
    let key = &route.key;
    let send = match send::parse(&params, key) {
        Ok(s) => s,
        Err(r) => return reply(Err(r)),
    };
    let shared = ops.registry.shared();
    let exists = shared.has_record(key);
    // Only a plan send needs to know whether the session ran an episode (it fetches only then).
    let has_episode = send.plan.is_some()
        && exists
        && read::snapshot(shared, key).ok().flatten().is_some_and(|page| page.state.last.is_some());
    let arrival = Arrival { key, scoped: route.scoped, sealing: ops.registry.is_sealing(), exists, has_episode };
    let checked = match ops.admission.precheck(&send, arrival) {
        Ok(c) => Checked { caller: route.caller.clone(), ..c },
        Err(r) => return reply(Err(r)),
    };
    let placement = ops.admission.config.placement_for(send.session_class.as_deref(), send.retention.is_some());
    // `broca.timing` (debug): how long broca itself took to answer, apart from the daemon and
    // the caller (`make bench-capacity` reads these lines).
    let prechecked = t0.elapsed();
    let answer = Answer::new(move |r| {
        log::debug!(target: "broca.timing", "send answered in {} us ({} us before the actor)",
            t0.elapsed().as_micros(), prechecked.as_micros());
        reply(r.map(super::body))
    });
    let cmd = SessionCommand::Send { send: Box::new(send), checked: Box::new(checked), answer: answer.clone() };
    if let Err(e) = ops.registry.command(key, placement, cmd) {
        answer.send(Err(open_refusal(ops, key, e)));
    }
}

/// An open failure as a send answers it: another process holding the session's lease is
/// `session_busy` naming the run it is driving and its state (spec §14), distinct from
/// `lease_stale`.
fn open_refusal(ops: &Ops, key: &SessionKey, e: LineageError) -> Refusal {
    let LineageError::Lease(LeaseError::Busy { .. }) = &e else { return e.refusal() };
    let snapshot = read::snapshot(ops.registry.shared(), key);
    let (run_id, state) = match snapshot.map(|p| p.map(|p| p.resolution)) {
        Ok(Some(Resolution::Resume { run_id })) => (Some(run_id), "active"),
        Ok(Some(Resolution::Paused { run_id, .. })) => (Some(run_id), "paused"),
        Ok(Some(Resolution::Idle { run_id, .. })) => (Some(run_id), "idle"),
        _ => (None, "leased"),
    };
    let message = format!("session busy: another broca process holds this session ({e})");
    Refusal::new(RefusalCode::SessionBusy, message, Some(crate::detail!("run_id" => run_id, "state" => state)))
}
