//! Session owners (llm-runner 0.8.0 §6.2, §9, §10; spec §4 "Sessions recorded before attested
//! owners were stamped…"): who may drive a session, decided from the daemon's stamps only.
//!
//! Invariants:
//! - an [`Owner`] is recorded once, in the `RunStarted` of a session's first episode, from the
//!   stamps of the route its first send came on: the bind's attested principal and the work
//!   scope's owner. Never from a request field;
//! - only a daemon-attested principal (`reserved:<module>`, a module that proved its launch
//!   nonce) can be an owner. `direct` and `unverified` callers never are: a session they start
//!   records no owner;
//! - an owner never changes: every later `RunStarted` carries the first one's owner (or none);
//! - a session with no recorded owner (written before owners were stamped, or first sent by an
//!   unattested local caller) keeps its unrestricted admission on this host (spec §4): every
//!   local caller is admitted as its owner, but never a caller relayed from another machine,
//!   whose admission facts this host did not attest (#44);
//! - a session a relayed `direct` caller starts (the origin machine's key-holder) records
//!   `direct` qualified by that machine as its owner: that key-holder, and nobody else behind
//!   the link, drives it afterwards (`broca-mcp --hosts` is such a caller).
//!
//! - an owner is qualified by the machine that attested it (the daemon's `HelloAck.machine_id`,
//!   or for a route a federation carrier relayed, the origin peer it reported; DESIGN §8): the
//!   same module id on another machine is another principal. An owner recorded without a
//!   machine (the daemon named none, or it was recorded before machines were stamped) admits
//!   local callers only, never one relayed from another machine.
//!
//! The owner-only operations are `session.send`, `session.retract`, `run.cancel` and
//! `session.baseline` ([`crate::op::Op::owner_only`]); another caller is refused `scope_owner_mismatch`
//! before its parameters are read.

use serde::{Deserialize, Serialize};

/// How an attested principal is spelled: `reserved:<module id>` (the role contract's
/// `RouteStamp.principal`).
pub const RESERVED_PREFIX: &str = "reserved:";
/// The principal of a daemon's key-holder (a caller with no module identity).
pub const DIRECT: &str = "direct";

/// Who called, as the daemon stamped the route: its principal and its work scope's owner.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The bind's principal as stamped: `reserved:<module>`, `direct` or `unverified`.
    pub principal: String,
    /// The stamped work scope's owner, in the same spelling; `None` on an unscoped route.
    pub scope_owner: Option<String>,
    /// The machine whose daemon attested `principal`: this host's daemon for a local route
    /// (`None` when it names no machine id), the origin peer for a relayed one.
    pub machine: Option<String>,
    /// The federation carrier that relayed the route (`reserved:<carrier>` on the bind), when
    /// it came from another machine: `principal` is then the origin's, as the carrier reported
    /// it (`crate::federation`).
    pub via: Option<String>,
}

impl Caller {
    /// A caller with no consumer identity: in-process callers (tests, `broca-run`).
    pub fn direct() -> Caller {
        Caller::local(DIRECT, None, None)
    }

    /// A caller on a route of this host's daemon.
    pub fn local(principal: &str, scope_owner: Option<&str>, machine: Option<&str>) -> Caller {
        Caller {
            principal: principal.into(),
            scope_owner: scope_owner.map(String::from),
            machine: machine.map(String::from),
            via: None,
        }
    }

    /// The route principal when the daemon attested it.
    pub fn attested(&self) -> Option<&str> {
        attested(&self.principal)
    }

    /// The owner a session records when this caller's send starts its first episode: `None`
    /// when neither the caller nor its scope owner is attested (the session stays unrestricted
    /// on this host). A relayed `direct` caller is recorded as its machine's key-holder.
    pub fn as_owner(&self) -> Option<Owner> {
        let relayed_key_holder =
            (self.via.is_some() && self.machine.is_some() && self.principal == DIRECT).then(|| DIRECT.to_owned());
        let principal = self.attested().map(String::from).or(relayed_key_holder);
        let scope_owner = self.scope_owner.as_deref().and_then(attested).map(String::from);
        let machine = self.machine.clone();
        (principal.is_some() || scope_owner.is_some()).then_some(Owner { principal, scope_owner, machine })
    }
}

impl Default for Caller {
    fn default() -> Caller {
        Caller::direct()
    }
}

fn attested(principal: &str) -> Option<&str> {
    principal.strip_prefix(RESERVED_PREFIX).filter(|id| !id.is_empty()).map(|_| principal)
}

/// A session's owner principals (llm-runner §6.2): the attested principal that sent its first
/// episode, and the owner of the work scope that send froze. At least one is present.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_owner: Option<String>,
    /// The machine that attested them (`owner-machine/v1`); absent: this host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

impl Owner {
    /// Whether `caller` is one of the owner principals, attested on the owner's machine.
    /// Principals are compared, not routes: an owner is admitted on any route, scoped or not,
    /// at any scope epoch, local or relayed, as long as the same machine attested it.
    pub fn admits(&self, caller: &Caller) -> bool {
        let same_machine = match &self.machine {
            Some(machine) => caller.machine.as_deref() == Some(machine.as_str()),
            None => caller.via.is_none(),
        };
        // A key-holder owner is always machine-qualified (recorded from a relayed route).
        let key_holder =
            self.machine.is_some() && self.principal.as_deref() == Some(DIRECT) && caller.principal == DIRECT;
        same_machine
            && (key_holder
                || caller
                    .attested()
                    .is_some_and(|p| self.principal.as_deref() == Some(p) || self.scope_owner.as_deref() == Some(p)))
    }
}

/// Whether `caller` may drive a session whose first episode recorded `owner`. A session
/// recorded without one admits every local caller and no relayed one (spec §4, #44); a
/// session with no episode yet is not decided here (its first send records its owner).
pub fn admits(owner: Option<&Owner>, caller: &Caller) -> bool {
    match owner {
        Some(owner) => owner.admits(caller),
        None => caller.via.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(principal: &str, scope_owner: Option<&str>) -> Caller {
        Caller::local(principal, scope_owner, None)
    }

    fn relayed(principal: &str, peer: &str) -> Caller {
        Caller { machine: Some(peer.into()), via: Some("reserved:callosum".into()), ..caller(principal, None) }
    }

    #[test]
    fn an_owner_is_the_principal_on_the_machine_that_attested_it() {
        let here = Caller::local("reserved:a", None, Some("m1")).as_owner().unwrap();
        assert_eq!(here.machine.as_deref(), Some("m1"));
        assert!(here.admits(&Caller::local("reserved:a", None, Some("m1"))));
        assert!(here.admits(&relayed("reserved:a", "m1")), "the same principal, relayed from its machine");
        assert!(!here.admits(&relayed("reserved:a", "m2")), "the same module id on another machine");
        assert!(!here.admits(&relayed("reserved:b", "m1")), "a stranger behind the same link");
        let far = relayed("reserved:a", "m2").as_owner().unwrap();
        assert!(far.admits(&Caller::local("reserved:a", None, Some("m2"))), "after a move to its machine");
        assert!(!far.admits(&Caller::local("reserved:a", None, Some("m1"))));
        let unqualified = caller("reserved:a", None).as_owner().unwrap();
        assert!(unqualified.admits(&caller("reserved:a", None)));
        assert!(!unqualified.admits(&relayed("reserved:a", "m1")), "an unqualified owner is local only");
    }

    #[test]
    fn only_attested_principals_become_owners() {
        assert_eq!(caller("direct", None).as_owner(), None);
        assert_eq!(caller("unverified", None).as_owner(), None);
        assert_eq!(caller("reserved:", None).as_owner(), None, "an empty module id attests nothing");
        let a = caller("reserved:a", None).as_owner().unwrap();
        assert_eq!(a, Owner { principal: Some("reserved:a".into()), scope_owner: None, machine: None });
        let scoped = caller("direct", Some("reserved:lead")).as_owner().unwrap();
        assert_eq!(scoped, Owner { principal: None, scope_owner: Some("reserved:lead".into()), machine: None });
    }

    #[test]
    fn an_owner_admits_its_principals_on_any_route_and_nobody_else() {
        let owner = caller("reserved:a", Some("reserved:lead")).as_owner().unwrap();
        assert!(owner.admits(&caller("reserved:a", None)));
        assert!(owner.admits(&caller("reserved:lead", Some("reserved:other"))), "the scope owner, on any route");
        assert!(
            !owner.admits(&caller("reserved:b", Some("reserved:lead"))),
            "a caller under the scope is not its owner"
        );
        assert!(!owner.admits(&caller("direct", None)), "direct is never an owner");
        assert!(admits(None, &caller("direct", None)), "no recorded owner: unrestricted here");
        assert!(!admits(Some(&owner), &caller("reserved:b", None)));
    }

    #[test]
    fn an_ownerless_session_admits_no_relayed_caller() {
        assert!(admits(None, &caller("reserved:a", None)));
        assert!(admits(None, &caller("unverified", None)));
        assert!(!admits(None, &relayed("reserved:a", "m1")), "a relayed caller never inherits legacy admission");
        assert!(!admits(None, &relayed("direct", "m1")));
    }

    #[test]
    fn a_relayed_key_holder_owns_what_it_starts_and_nobody_else_behind_the_link_does() {
        let owner = relayed("direct", "m1").as_owner().unwrap();
        assert_eq!(owner, Owner { principal: Some("direct".into()), scope_owner: None, machine: Some("m1".into()) });
        assert!(owner.admits(&relayed("direct", "m1")));
        assert!(!owner.admits(&relayed("direct", "m2")), "another machine's key-holder");
        assert!(!owner.admits(&relayed("reserved:direct", "m1")));
        assert!(!owner.admits(&relayed("unverified", "m1")));
        assert!(!owner.admits(&Caller::local("direct", None, Some("m2"))), "this host's key-holder is not it");
        assert!(owner.admits(&Caller::local("direct", None, Some("m1"))), "after a move to its machine");
        assert_eq!(caller("direct", None).as_owner(), None, "a local key-holder still records no owner");
    }
}
