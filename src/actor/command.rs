//! What a session's actor is asked to do. Every write to a session arrives as a
//! [`SessionCommand`] in its bounded mailbox; the actor handles it between the loop's events
//! (never inside a step, or between a tool call and its result) and answers through the
//! command's [`Answer`].

use super::admission::Checked;
use super::answer::Answer;
use super::decide;
use super::warm::WarmDeps;
use crate::agent::{Handled, RunCommand};
use crate::lineage::Lineage;
use crate::op::Op;
use crate::owner::Caller;
use crate::record::CancelAt;
use crate::store::Store;
use crate::wire::answers::{CancelReply, RetractReply, SendReply};
use crate::wire::requests::{CancelRequest, RetractRequest};
use crate::wire::send::SendParams;
use crate::wire::warm::WarmReply;
use crate::wire::Refusal;

pub enum SessionCommand {
    /// Open the session and nothing else: opening seals an orphaned run and drains the queue
    /// (boot recovery, `run.status` on a run left open), and an observer holds the lease.
    Open,
    /// Admit a send with what its pre-check settled (the named model, a first plan's fetch).
    Send { send: Box<SendParams>, checked: Box<Checked>, answer: Answer<SendReply> },
    /// `session.retract` from `caller` (checked against the session's owner here too, so an
    /// owner recorded after the op's own check still decides).
    Retract { request: RetractRequest, caller: Caller, answer: Answer<RetractReply> },
    /// `run.cancel` of a named run, from `caller` (checked as a retract is).
    Cancel { request: CancelRequest, caller: Caller, answer: Answer<CancelReply> },
    /// `session.warm` from `caller` (spec §4a): decided here, sent on its own thread.
    Warm { caller: Caller, answer: Answer<WarmReply> },
    /// A warm the provider answered: recorded, then answered.
    WarmDone(Box<super::warm::WarmDone>),
    /// A held call's late result, from its provider's puller (spec §19).
    LateResult { call_key: String, outcome: crate::held::LateOutcome, answer: Answer<crate::held::LateAck> },
    /// `move.export`'s tombstone (`crate::moves`), written only between runs.
    Export { answer: Answer<crate::record::MovedOut> },
    /// Close the actor now if nothing is running or queued (an adopt needs the lease).
    Close,
    /// Cancel whatever run is going (no answer; nothing when none is).
    CancelRunning(CancelAt),
    /// Shutdown: stop now and seal the running run `interrupted`.
    Seal,
    /// Draining: seal the running run `interrupted` at its next step-entry boundary.
    SealAtBoundary,
}

impl std::fmt::Debug for SessionCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionCommand::Open => write!(f, "Open"),
            SessionCommand::Send { send, .. } => write!(f, "Send({:?})", send.delivery),
            SessionCommand::Retract { request, .. } => write!(f, "Retract({})", request.submission_id),
            SessionCommand::Cancel { request, .. } => write!(f, "Cancel({}, {:?})", request.run_id, request.at),
            SessionCommand::Warm { .. } => write!(f, "Warm"),
            SessionCommand::Export { .. } => write!(f, "Export"),
            SessionCommand::Close => write!(f, "Close"),
            SessionCommand::WarmDone(done) => write!(f, "{done:?}"),
            SessionCommand::LateResult { call_key, .. } => write!(f, "LateResult({call_key})"),
            SessionCommand::CancelRunning(at) => write!(f, "CancelRunning({at:?})"),
            SessionCommand::Seal => write!(f, "Seal"),
            SessionCommand::SealAtBoundary => write!(f, "SealAtBoundary"),
        }
    }
}

/// What commands are decided with: the admission rules, the store, and what warms need.
pub(super) struct Ctx<'a> {
    pub admission: &'a super::admission::Admission,
    pub store: &'a Store,
    pub warm: &'a WarmDeps,
}

/// Handles one command on the session's owner. The signals (cancel, seal) mean something only
/// to a run in progress; between runs they find nothing to act on.
pub(super) fn handle(ctx: &Ctx<'_>, lineage: &mut Lineage, cmd: SessionCommand) -> Handled {
    let (admission, store) = (ctx.admission, ctx.store);
    match cmd {
        SessionCommand::Open => Handled::default(),
        SessionCommand::Send { send, checked, answer } => {
            let mut units = Vec::new();
            answer.send(decide::send(admission, store, lineage, *send, *checked, &mut units));
            Handled { units, signal: None }
        }
        SessionCommand::Retract { request, caller, answer } => {
            let (reply, units) = split(
                decide::owner_admits(lineage, Op::SessionRetract, &caller)
                    .and_then(|()| decide::retract(store, lineage, &request.submission_id)),
            );
            answer.send(reply);
            Handled { units, signal: None }
        }
        SessionCommand::Cancel { request, caller, answer } => {
            let (reply, units) = split(
                decide::owner_admits(lineage, Op::RunCancel, &caller)
                    .and_then(|()| decide::cancel(lineage, &request.run_id, request.at)),
            );
            answer.send(reply);
            Handled { units, signal: None }
        }
        SessionCommand::Warm { caller, answer } => {
            let moved =
                lineage.state().moved_out.as_ref().map(|m| super::moving::session_moved(lineage.addr(), m.epoch));
            match decide::owner_admits(lineage, Op::SessionWarm, &caller).and_then(|()| moved.map_or(Ok(()), Err)) {
                Ok(()) => super::warm::start(ctx.warm, lineage, answer),
                Err(refusal) => answer.send(Err(refusal)),
            }
            Handled::default()
        }
        SessionCommand::WarmDone(done) => {
            super::warm::done(ctx.warm, lineage, *done);
            Handled::default()
        }
        SessionCommand::LateResult { call_key, outcome, answer } => {
            match super::late::deliver(lineage, &call_key, outcome) {
                Ok((ack, units)) => {
                    answer.send(Ok(ack));
                    Handled { units, signal: None }
                }
                Err(e) => {
                    answer.send(Err(e.refusal()));
                    Handled::default()
                }
            }
        }
        SessionCommand::Export { answer } => {
            answer.send(super::moving::tombstone(lineage));
            Handled::default()
        }
        // The actor's loop closes on it; a run in progress ignores it.
        SessionCommand::Close => Handled::default(),
        SessionCommand::CancelRunning(at) => Handled { units: Vec::new(), signal: Some(RunCommand::Cancel(at)) },
        SessionCommand::Seal => Handled { units: Vec::new(), signal: Some(RunCommand::Seal) },
        SessionCommand::SealAtBoundary => Handled { units: Vec::new(), signal: Some(RunCommand::SealAtBoundary) },
    }
}

/// A decision's answer and the units it made durable (none when it refused).
fn split<T>(decided: Result<(T, decide::Units), Refusal>) -> (Result<T, Refusal>, decide::Units) {
    match decided {
        Ok((reply, units)) => (Ok(reply), units),
        Err(r) => (Err(r), Vec::new()),
    }
}
