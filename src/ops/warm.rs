//! `session.warm` (spec §4a): a broca extension op (llm-runner has no group for it). The op
//! checks the identity the request names, then hands the warm to the session's actor
//! ([`crate::actor::warm`]), which decides the rest and answers when the warm is recorded. A
//! session without a WAL has sent nothing: it is refused `no_step_yet` without creating one.

use std::sync::Arc;

use super::{Ops, Reply, Route};
use crate::actor::{Answer, SessionCommand};
use crate::state_root::Placement;
use crate::wire::warm::{WarmRefusal, WarmReply, WarmRequest};

pub(super) fn session_warm(ops: &Arc<Ops>, route: &Route, request: WarmRequest, version: u64, reply: Reply) {
    let key = &route.key;
    if let Err(refused) = request.check(&key.addr(), version) {
        return reply(Err(refused.refusal()));
    }
    if !ops.registry.shared().has_record(key) {
        return reply(Err(WarmRefusal::NoStepYet.refusal()));
    }
    let answer = Answer::new(move |r: Result<WarmReply, _>| reply(r.map(super::body)));
    let cmd = SessionCommand::Warm { caller: route.caller.clone(), answer: answer.clone() };
    if let Err(e) = ops.registry.command(key, Placement::Standard, cmd) {
        answer.send(Err(e.refusal()));
    }
}
