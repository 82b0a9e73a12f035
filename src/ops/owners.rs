//! The owner check of every owner-only op (`crate::owner`), made before the op reads its
//! params (spec §9: authorization before validation), and `session.head.sender`, the caller's
//! own grant from the same rule. The session's actor checks sends, retracts and cancels again
//! against its durable state, so an owner recorded after this check still decides.

use cortexkit_role_llm_runner::delivery_order::{Mode, PlanSender};
use cortexkit_role_llm_runner::read::HeadSender;

use super::{Ops, Route};
use crate::lineage::reader::{Reader, Sink, Start};
use crate::lineage::LineageError;
use crate::op::Op;
use crate::owner::{self, Caller, Owner};
use crate::record::{Record, RunStarted};
use crate::wire::Refusal;

/// Refuses an owner-only `op` from anyone but the session's recorded owner. A session
/// without a WAL or without an episode admits every caller (its first send records the owner);
/// one recorded without an owner admits every local caller ([`owner::admits`]).
pub(super) fn authorize(ops: &Ops, route: &Route, op: Option<Op>) -> Result<(), Refusal> {
    let Some(op) = op.filter(|op| op.owner_only()) else { return Ok(()) };
    let Some(reader) = Reader::open(ops.registry.shared(), &route.key) else { return Ok(()) };
    let Some(first) = first_run_started(&reader).map_err(|e| e.refusal())? else { return Ok(()) };
    if owner::admits(first.owner.as_ref(), &route.caller) {
        return Ok(());
    }
    // A module the session's plan names as a sender may send (its grants are the actor's to
    // check against the durable plan).
    let senders = crate::actor::senders::plan_senders(first.config.config());
    let named =
        crate::actor::senders::caller_module(&route.caller).is_some_and(|m| senders.iter().any(|s| s.module == m));
    if op == Op::SessionSend && named {
        return Ok(());
    }
    Err(crate::wire::scope_owner_mismatch(op.name(), &route.caller))
}

/// The session's first durable `RunStarted`, reading only as far as it (it is the first or
/// second record of a WAL, so this reads a few kilobytes).
pub(crate) fn first_run_started(reader: &Reader) -> Result<Option<Box<RunStarted>>, LineageError> {
    struct First(Option<Box<RunStarted>>);
    impl Sink for First {
        fn record(&mut self, _seq: u64, record: &Record) -> bool {
            if let Record::RunStarted(r) = record {
                self.0 = Some(r.clone());
            }
            // Stop the scan at the first episode: it is all this needs.
            self.0.is_none()
        }
    }
    let mut sink = First(None);
    reader.scan(Start::Beginning, &mut sink)?;
    Ok(sink.0)
}

/// `session.head.sender` (`head_sender`): the caller's own grant on its next send. The owner
/// (and every caller of a session with no recorded owner, whose next send is admitted as the
/// owner's) gets every delivery mode broca declares and interruption; anyone else no grant.
/// `episode_owner` is `None` before the first episode (every caller's send is admitted then),
/// else the owner the session recorded.
pub(super) fn sender_grant(
    episode_owner: Option<Option<&Owner>>,
    senders: &[PlanSender],
    caller: &Caller,
) -> Option<HeadSender> {
    let declared = [Mode::ToolResult, Mode::TurnSystem, Mode::Steer, Mode::IdleStart]
        .into_iter()
        .filter(|m| m.is_declared(super::GROUPS) && crate::wire::delivery::DECLARED_MODES.contains(m));
    if episode_owner.is_none_or(|owner| owner::admits(owner, caller)) {
        return Some(HeadSender::for_owner(declared.map(|m| m.as_str().to_owned()).collect()));
    }
    // A plan-named sender: the modes its entry grants (`idle_start` only when granted).
    let module = crate::actor::senders::caller_module(caller)?;
    let entry = senders.iter().find(|s| s.module == module)?;
    let modes = declared.filter(|m| *m != Mode::IdleStart || entry.idle_start).map(|m| m.as_str().to_owned());
    Some(HeadSender::new(modes.collect(), entry.interrupt))
}
