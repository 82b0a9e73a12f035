//! Which host's broca serves a session, decided by the consumer (DESIGN §8): no coordinator,
//! no routing by session in the daemon. A host is named by the module id a consumer opens it
//! by on its own daemon: `broca` for the local one, `fed:<machine id>:broca` for a peer's
//! re-exported by federation.
//!
//! **The rule** (stable: it depends only on the session address and the host names): every
//! host scores `u64::from_be_bytes(SHA-256("broca-placement/v1" ‖ len(addr) ‖ addr ‖
//! len(host) ‖ host)[..8])`, lengths as u64 little-endian; hosts rank by descending score
//! (ties by name). A NEW session goes to the first-ranked host; adding or removing a host
//! changes the first rank of about 1/n of the addresses (rendezvous hashing).
//!
//! **The authority** is the hosts' own answer (`move.locate`): a session live on one host is
//! served there, whatever the rule says (it may have been placed before the host list changed,
//! or moved). Nothing is ever silently forked: a session live on two hosts, tombstoned
//! somewhere and adopted nowhere (a move in transit), or possibly held by a host that did not
//! answer, is refused by name ([`PlacementError`]).

use sha2::{Digest, Sha256};

/// The tag the scores are taken under (changing it re-places every new session).
const TAG: &[u8] = b"broca-placement/v1";

/// What a host says of a session (`move.locate`'s `state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Live,
    /// Exported from here: its tombstone's epoch.
    Moved {
        epoch: u64,
    },
    Absent,
}

impl Held {
    /// `move.locate`'s answer body, read.
    pub fn from_answer(answer: &serde_json::Value) -> Option<Held> {
        match answer.get("state")?.as_str()? {
            // A folded session is that host's: a read or send unfolds it there. Reading it as
            // unreachable could place the session on another host, a silent fork (#44).
            "live" | "folded" => Some(Held::Live),
            "moved" => Some(Held::Moved { epoch: answer.get("epoch").and_then(serde_json::Value::as_u64)? }),
            "absent" => Some(Held::Absent),
            _ => None,
        }
    }
}

/// Where a session is to be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placed {
    /// It lives there (the host's own answer).
    Owner(String),
    /// No host holds it: a new session, placed by the rule.
    New(String),
}

impl Placed {
    pub fn host(&self) -> &str {
        match self {
            Placed::Owner(h) | Placed::New(h) => h,
        }
    }
}

/// Why a session cannot be placed; each names the hosts involved and nothing is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementError {
    NoHosts,
    /// Live on more than one host: a fork an operator must resolve.
    Split {
        hosts: Vec<String>,
    },
    /// Exported from `from` and adopted by no host that answered: finish the move first.
    InTransit {
        from: String,
        epoch: u64,
    },
    /// A host did not answer, and no other holds the session live: it might be there.
    Unreachable {
        host: String,
        why: String,
    },
}

impl PlacementError {
    /// The code a consumer reports (`placement_*`).
    pub fn code(&self) -> &'static str {
        match self {
            PlacementError::NoHosts => "placement_no_hosts",
            PlacementError::Split { .. } => "placement_split",
            PlacementError::InTransit { .. } => "placement_in_transit",
            PlacementError::Unreachable { .. } => "placement_unreachable",
        }
    }
}

impl std::fmt::Display for PlacementError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlacementError::NoHosts => write!(f, "no broca host is configured"),
            PlacementError::Split { hosts } => write!(f, "the session is live on several hosts: {}", hosts.join(", ")),
            PlacementError::InTransit { from, epoch } => {
                write!(f, "the session was exported from {from} (epoch {epoch}) and no host has adopted it yet")
            }
            PlacementError::Unreachable { host, why } => {
                write!(f, "host {host} did not answer ({why}); the session may live there")
            }
        }
    }
}

impl std::error::Error for PlacementError {}

/// The hosts in the rule's order for `addr`.
pub fn rank<'a>(addr: &str, hosts: &'a [String]) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = hosts.iter().map(|h| (score(addr, h), h.as_str())).collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().map(|(_, h)| h).collect()
}

fn score(addr: &str, host: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(TAG);
    for part in [addr, host] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Places the session at `addr`: asks every host (`probe`: its `move.locate` answer, or why
/// it gave none) and decides as the module doc says.
pub fn place(
    addr: &str,
    hosts: &[String],
    mut probe: impl FnMut(&str) -> Result<Held, String>,
) -> Result<Placed, PlacementError> {
    let ranked = rank(addr, hosts);
    let Some(first) = ranked.first() else { return Err(PlacementError::NoHosts) };
    let (mut live, mut moved, mut unreachable) = (Vec::new(), None, None);
    for host in &ranked {
        match probe(host) {
            Ok(Held::Live) => live.push((*host).to_owned()),
            Ok(Held::Moved { epoch }) => {
                if moved.as_ref().is_none_or(|(_, e)| epoch > *e) {
                    moved = Some(((*host).to_owned(), epoch));
                }
            }
            Ok(Held::Absent) => {}
            Err(why) => unreachable = unreachable.or(Some(((*host).to_owned(), why))),
        }
    }
    match (live.len(), unreachable, moved) {
        (1, _, _) => Ok(Placed::Owner(live.remove(0))),
        (n, _, _) if n > 1 => Err(PlacementError::Split { hosts: live }),
        (_, Some((host, why)), _) => Err(PlacementError::Unreachable { host, why }),
        (_, None, Some((from, epoch))) => Err(PlacementError::InTransit { from, epoch }),
        (_, None, None) => Ok(Placed::New((*first).to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_rule_is_pinned_and_moves_about_one_in_n_when_a_host_joins() {
        let two = hosts(&["broca", "fed:aa:broca"]);
        // Pinned: changing the rule re-places every new session.
        assert_eq!(rank("f46bbe945ffda0473fb757c9a69934e6", &two), ["fed:aa:broca", "broca"]);
        let three = hosts(&["broca", "fed:aa:broca", "fed:bb:broca"]);
        let addrs: Vec<String> =
            (0..3000).map(|i| crate::session_key::SessionKey::new("/p", "h", &i.to_string()).addr()).collect();
        let moved = addrs.iter().filter(|a| rank(a, &two)[0] != rank(a, &three)[0]).count();
        assert!((800..1200).contains(&moved), "about a third move to the new host: {moved}");
        assert!(addrs.iter().all(|a| rank(a, &two)[0] == rank(a, &three)[0] || rank(a, &three)[0] == "fed:bb:broca"));
    }

    #[test]
    fn the_owner_s_answer_decides_and_nothing_forks() {
        let hs = hosts(&["a", "b", "c"]);
        let ask = |answers: [Result<Held, String>; 3]| {
            let by_host = |h: &str| answers[["a", "b", "c"].iter().position(|x| *x == h).unwrap()].clone();
            place("addr", &hs, by_host)
        };
        let absent = || Ok(Held::Absent);
        assert_eq!(ask([absent(), Ok(Held::Live), absent()]), Ok(Placed::Owner("b".into())));
        assert_eq!(ask([Ok(Held::Moved { epoch: 3 }), Ok(Held::Live), absent()]), Ok(Placed::Owner("b".into())));
        assert_eq!(ask([absent(), absent(), absent()]), Ok(Placed::New(rank("addr", &hs)[0].to_owned())));
        assert!(matches!(ask([Ok(Held::Live), Ok(Held::Live), absent()]), Err(PlacementError::Split { .. })));
        assert!(matches!(
            ask([Ok(Held::Moved { epoch: 2 }), absent(), absent()]),
            Err(PlacementError::InTransit { .. })
        ));
        assert!(matches!(ask([Err("down".into()), absent(), absent()]), Err(PlacementError::Unreachable { .. })));
        assert_eq!(ask([Err("down".into()), Ok(Held::Live), absent()]), Ok(Placed::Owner("b".into())));
        assert_eq!(place("addr", &[], |_| Ok(Held::Absent)), Err(PlacementError::NoHosts));
    }

    #[test]
    fn a_folded_answer_is_the_host_s_own_and_a_moved_answer_needs_its_epoch() {
        let folded = serde_json::json!({"state": "folded", "session_ref": "addr", "tree": "wal-archive"});
        assert_eq!(Held::from_answer(&folded), Some(Held::Live));
        assert_eq!(Held::from_answer(&serde_json::json!({"state": "moved"})), None, "no epoch: unreadable");
        assert_eq!(
            Held::from_answer(&serde_json::json!({"state": "moved", "epoch": 4})),
            Some(Held::Moved { epoch: 4 })
        );
        let hs = hosts(&["a", "b"]);
        let answers = |h: &str| Ok(if h == "a" { Held::Live } else { Held::from_answer(&folded).unwrap() });
        assert!(matches!(place("addr", &hs, answers), Err(PlacementError::Split { .. })), "folded here, live there");
    }
}
