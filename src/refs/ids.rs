//! Set and record ids (llm-runner §9.13): opaque to callers, session-bound, and parsed back
//! without any index. `ors-<salt>-<ordinal>` names a message's reply set,
//! `ors-<salt>-<ordinal>-<part>` the call set of the call at that part, and `<set id>.r<n>` a
//! record. The salt is a digest of the session's address and WAL incarnation, so another
//! session's id (or this session's after it was deleted and re-created) names nothing here.

use std::fmt;

use sha2::{Digest, Sha256};

/// The session-bound part of every id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSalt(String);

impl SetSalt {
    /// Twelve hex digits of SHA-256 over the session's address and incarnation.
    pub fn new(session_addr: &str, incarnation: &str) -> SetSalt {
        let digest = Sha256::digest(format!("{session_addr}\n{incarnation}").as_bytes());
        SetSalt(digest.iter().take(6).map(|b| format!("{b:02x}")).collect())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetId {
    salt: SetSalt,
    /// The internal ordinal of the message the set belongs to.
    pub ordinal: u64,
    /// The call's part index, for a call set.
    pub part: Option<usize>,
}

impl SetId {
    pub fn reply(salt: &SetSalt, ordinal: u64) -> SetId {
        SetId { salt: salt.clone(), ordinal, part: None }
    }

    pub fn call(salt: &SetSalt, ordinal: u64, part: usize) -> SetId {
        SetId { salt: salt.clone(), ordinal, part: Some(part) }
    }

    /// The id `text` spells, if it is one of this session's (`salt`).
    pub fn parse(text: &str, salt: &SetSalt) -> Option<SetId> {
        let mut fields = text.strip_prefix("ors-")?.split('-');
        if fields.next()? != salt.0 {
            return None;
        }
        let ordinal = canonical(fields.next()?)?;
        let part = match fields.next() {
            None => None,
            Some(p) => Some(usize::try_from(canonical(p)?).ok()?),
        };
        fields.next().is_none().then(|| SetId { salt: salt.clone(), ordinal, part })
    }
}

impl fmt::Display for SetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ors-{}-{}", self.salt.0, self.ordinal)?;
        match self.part {
            Some(p) => write!(f, "-{p}"),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefId {
    pub set: SetId,
    /// The record's place in its set.
    pub index: u32,
}

impl RefId {
    pub fn parse(text: &str, salt: &SetSalt) -> Option<RefId> {
        let (set, index) = text.rsplit_once(".r")?;
        let index = u32::try_from(canonical(index)?).ok()?;
        Some(RefId { set: SetId::parse(set, salt)?, index })
    }
}

impl fmt::Display for RefId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.r{}", self.set, self.index)
    }
}

/// A decimal number written the one way this module writes it (no sign, no leading zero).
fn canonical(text: &str) -> Option<u64> {
    let n: u64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_bind_to_their_session() {
        let salt = SetSalt::new("lineage-a", "inc-1");
        let other = SetSalt::new("lineage-b", "inc-1");
        let reborn = SetSalt::new("lineage-a", "inc-2");
        for id in [SetId::reply(&salt, 7), SetId::call(&salt, 7, 2)] {
            assert_eq!(SetId::parse(&id.to_string(), &salt), Some(id.clone()));
            assert_eq!(SetId::parse(&id.to_string(), &other), None);
            assert_eq!(SetId::parse(&id.to_string(), &reborn), None);
            let r = RefId { set: id, index: 3 };
            assert_eq!(RefId::parse(&r.to_string(), &salt), Some(r.clone()));
            assert_eq!(RefId::parse(&r.to_string(), &other), None);
        }
        for junk in ["", "ors-", "ors-x-1", "nope", "ors-{salt}-01", "ors-{salt}-1-2-3", "ors-{salt}-+1"] {
            assert_eq!(SetId::parse(&junk.replace("{salt}", &salt.0), &salt), None, "{junk}");
        }
    }
}
