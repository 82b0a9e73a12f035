//! `session.retract` (spec §11) and `run.cancel` (§13): driver writes, decided on the session's
//! actor ([`crate::actor::decide`]) atomically against consumption and the run's own progress.
//! Both are served on a session whose project root is gone (§10.1), and both write nothing
//! when there is nothing to act on: a session without a WAL answers without creating one.

use std::sync::Arc;

use serde::Serialize;

use super::{Ops, Reply, Route};
use crate::actor::{Answer, SessionCommand};
use crate::session_key::SessionKey;
use crate::state_root::Placement;
use crate::wire::answers::{CancelReply, RetractMiss, RetractReply};
use crate::wire::requests::{CancelRequest, RetractRequest};

pub(super) fn session_retract(ops: &Arc<Ops>, route: &Route, request: RetractRequest, reply: Reply) {
    let absent = RetractReply::missed(RetractMiss::NotPending);
    let caller = route.caller.clone();
    on_actor(ops, &route.key, reply, absent, |answer| SessionCommand::Retract { request, caller, answer });
}

pub(super) fn run_cancel(ops: &Arc<Ops>, route: &Route, request: CancelRequest, reply: Reply) {
    let caller = route.caller.clone();
    on_actor(ops, &route.key, reply, CancelReply::NotActive, |answer| SessionCommand::Cancel {
        request,
        caller,
        answer,
    });
}

/// Hands the command `make` builds to the session's actor, answering `absent` when the
/// session has no WAL.
fn on_actor<T: Serialize + 'static>(
    ops: &Arc<Ops>,
    key: &SessionKey,
    reply: Reply,
    absent: T,
    make: impl FnOnce(Answer<T>) -> SessionCommand,
) {
    if !ops.registry.shared().has_record(key) {
        return reply(Ok(super::body(absent)));
    }
    let answer = Answer::new(move |r: Result<T, _>| reply(r.map(super::body)));
    if let Err(e) = ops.registry.command(key, Placement::Standard, make(answer.clone())) {
        answer.send(Err(e.refusal()));
    }
}
