//! Routes that reach broca through subc federation (DESIGN §8).
//!
//! The federation module (`callosum`) re-exports this host's broca on a peer daemon as
//! `fed:<this machine id>:broca` and relays each route it is asked for as an ordinary route
//! on this daemon, opened under its own reserved principal. Such a bind is read as follows
//! (the federation documents leave the session and owner to the serving module; broca takes
//! the stricter reading, and the README lists it):
//!
//! - **The session** is the origin's bind triple, unchanged: the `identity {harness, session}`
//!   and the project root the origin's daemon stamped, which the carrier presents as its own
//!   (its profile decides which roots it relays at all). So a session has one address
//!   whichever way it is reached, and a move between hosts keeps it.
//! - **The caller** is the origin's principal as the carrier reports it in the bind's
//!   `admission_facts` (`{"federation": {"peer", "principal"}}`; the daemon relays admission
//!   facts only from its configured carrier module), qualified by the peer's machine id. The
//!   carrier's own principal never owns anything: everyone behind one link shares it.
//! - A carrier's bind without well-formed facts is refused (`not_authorized`): a relayed
//!   route whose origin is unknown could otherwise act as any session's owner.
//!
//! Only modules listed in `federation.carriers` (default: `callosum`) are carriers.

use subc_protocol::{ErrorBody, Principal};

use crate::owner::{Caller, RESERVED_PREFIX};
use crate::subc::BindRequest;
use crate::wire::RefusalCode;

/// The federation module's id in CortexKit.
pub use crate::config::DEFAULT_FEDERATION_CARRIER as DEFAULT_CARRIER;
/// The admission-facts member a carrier reports the origin in.
pub const FACTS_MEMBER: &str = "federation";
/// The longest machine id accepted (the daemon's are 32 hex digits).
const MAX_MACHINE_ID: usize = 64;
/// The longest origin principal accepted.
const MAX_PRINCIPAL: usize = 256;

/// What this host knows of federation: its own machine and who may relay routes to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Federation {
    /// This daemon's `HelloAck.machine_id` (`None` when it names none).
    pub local_machine: Option<String>,
    /// Module ids whose routes are relayed from other machines.
    pub carriers: Vec<String>,
}

/// The origin of a relayed route, as its carrier reported it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Origin {
    peer: String,
    principal: String,
}

impl Federation {
    pub fn new(local_machine: Option<String>, carriers: Vec<String>) -> Federation {
        Federation { local_machine, carriers }
    }

    /// The carrier module that opened `bind`, if one did.
    fn carrier_of<'a>(&self, bind: &'a BindRequest) -> Option<&'a str> {
        match &bind.principal {
            Some(Principal::Reserved { module_id }) if self.carriers.iter().any(|c| c == module_id) => Some(module_id),
            _ => None,
        }
    }

    /// Who called on `bind`: the stamped principal on a local route, the reported origin on a
    /// relayed one. A relayed bind whose origin cannot be read is refused.
    pub fn caller_of(&self, bind: &BindRequest) -> Result<Caller, ErrorBody> {
        let scope_owner = bind.scope.as_ref().map(|s| spell(&s.owner));
        let refused = |message: String| ErrorBody::new(RefusalCode::NotAuthorized.as_str(), message);
        let Some(carrier) = self.carrier_of(bind) else {
            let principal = bind.principal.as_ref().map_or_else(|| "unverified".to_owned(), spell);
            // The daemon passes admission facts only from its federation carrier: a bind
            // carrying an origin proves it was relayed, so a carrier missing from
            // `federation.carriers` must not pass as a local principal (#44).
            if bind.admission_facts.as_ref().is_some_and(|f| f.get(FACTS_MEMBER).is_some()) {
                return Err(refused(format!(
                    "a route relayed by {principal}, which is not one of broca's federation.carriers"
                )));
            }
            return Ok(Caller::local(&principal, scope_owner.as_deref(), self.local_machine.as_deref()));
        };
        let origin = origin_of(bind.admission_facts.as_ref()).map_err(|why| {
            refused(format!(
                "a route relayed by {carrier} must report its origin in admission_facts.{FACTS_MEMBER}: {why}"
            ))
        })?;
        let peer = origin.peer.to_ascii_lowercase();
        if self.local_machine.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(&peer)) {
            return Err(refused(format!("a route relayed by {carrier} cannot originate on this machine ({peer})")));
        }
        // The scope stamped on the carrier's bind is this host's, not the origin's: a relayed
        // caller carries no scope owner (#44).
        Ok(Caller {
            principal: origin.principal,
            scope_owner: None,
            machine: Some(peer),
            via: Some(format!("{RESERVED_PREFIX}{carrier}")),
        })
    }
}

/// A principal as the role contract spells a `RouteStamp` principal.
pub fn spell(p: &Principal) -> String {
    match p {
        Principal::Reserved { module_id } => format!("{RESERVED_PREFIX}{module_id}"),
        Principal::Direct => "direct".to_owned(),
        Principal::Unverified => "unverified".to_owned(),
    }
}

fn origin_of(facts: Option<&serde_json::Value>) -> Result<Origin, String> {
    let member = facts.and_then(|f| f.get(FACTS_MEMBER)).ok_or("absent")?;
    let origin: Origin = serde_json::from_value(member.clone()).map_err(|e| e.to_string())?;
    let hex = |s: &str| !s.is_empty() && s.len() <= MAX_MACHINE_ID && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(&origin.peer) {
        return Err("peer must be a machine id (hex digits)".into());
    }
    let module = origin.principal.strip_prefix(RESERVED_PREFIX);
    let well_formed = match module {
        Some(id) => !id.is_empty() && !id.chars().any(|c| c.is_whitespace() || c.is_control()),
        None => origin.principal == "direct" || origin.principal == "unverified",
    };
    if !well_formed || origin.principal.len() > MAX_PRINCIPAL {
        return Err("principal must be reserved:<module>, direct or unverified".into());
    }
    Ok(origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bind(principal: Principal, facts: Option<serde_json::Value>) -> BindRequest {
        BindRequest {
            route: crate::subc::Route::new(1, 1),
            target: subc_protocol::RouteTarget::ManagementSurface { module_id: "broca".into() },
            identity: subc_protocol::BindIdentity::new("h", "s"),
            principal: Some(principal),
            consumer_capabilities: None,
            role_versions: None,
            admission_facts: facts,
            scope: None,
            call_mode: subc_protocol::call_mode::CallMode::Classic,
            legacy_project_root: None,
        }
    }

    fn federation() -> Federation {
        Federation::new(Some("aa".into()), vec![DEFAULT_CARRIER.into()])
    }

    #[test]
    fn an_origin_needs_a_machine_and_a_spelled_principal() {
        let ok = json!({"federation": {"peer": "0f", "principal": "reserved:relay-1"}});
        assert_eq!(origin_of(Some(&ok)).unwrap().principal, "reserved:relay-1");
        for bad in [
            json!({}),
            json!({"federation": {"peer": "", "principal": "direct"}}),
            json!({"federation": {"peer": "zz", "principal": "direct"}}),
            json!({"federation": {"peer": "0f", "principal": "reserved:"}}),
            json!({"federation": {"peer": "0f", "principal": "root"}}),
            json!({"federation": {"peer": "0f", "principal": "direct", "extra": 1}}),
        ] {
            assert!(origin_of(Some(&bad)).is_err(), "{bad}");
        }
        assert!(origin_of(None).is_err());
    }

    #[test]
    fn only_a_listed_carrier_relays() {
        let f = federation();
        let reserved = |module: &str| Principal::Reserved { module_id: module.into() };
        let local = f.caller_of(&bind(reserved("relay-1"), None)).unwrap();
        assert_eq!(
            (local.principal.as_str(), local.machine.as_deref(), local.via),
            ("reserved:relay-1", Some("aa"), None)
        );
        assert!(f.caller_of(&bind(reserved(DEFAULT_CARRIER), None)).is_err(), "a carrier without facts");
        let facts = json!({"federation": {"peer": "bb", "principal": "reserved:relay-1"}});
        let relayed = f.caller_of(&bind(reserved(DEFAULT_CARRIER), Some(facts))).unwrap();
        assert_eq!(relayed.principal, "reserved:relay-1");
        assert_eq!(relayed.machine.as_deref(), Some("bb"));
        assert_eq!(relayed.via.as_deref(), Some("reserved:callosum"));
    }

    #[test]
    fn a_relay_cannot_claim_this_machine_nor_pass_unlisted() {
        let f = federation();
        let reserved = |module: &str| Principal::Reserved { module_id: module.into() };
        for peer in ["aa", "AA"] {
            let facts = json!({"federation": {"peer": peer, "principal": "reserved:relay-1"}});
            assert!(f.caller_of(&bind(reserved(DEFAULT_CARRIER), Some(facts))).is_err(), "peer {peer} is this machine");
        }
        let upper = json!({"federation": {"peer": "BB", "principal": "direct"}});
        let relayed = f.caller_of(&bind(reserved(DEFAULT_CARRIER), Some(upper))).unwrap();
        assert_eq!(relayed.machine.as_deref(), Some("bb"), "machine ids are compared lowercased");
        let facts = json!({"federation": {"peer": "bb", "principal": "reserved:relay-1"}});
        let unlisted = f.caller_of(&bind(reserved("other-carrier"), Some(facts))).unwrap_err();
        assert_eq!(unlisted.code, "not_authorized");
        assert!(unlisted.message.contains("federation.carriers"), "{}", unlisted.message);
    }
}
