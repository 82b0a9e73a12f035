//! The prompt-cache clock (spec §4a "Expiry", §4 `session.head.cache`): per session, when it
//! last sent a request its provider answered, and the lifetime that request's cache marks asked
//! for. A provider's cache lives from a request's send start, and a read renews it, so every
//! answered request restarts the estimate. Memory only: after a restart it is unknown until the
//! session sends again. Times come from the lineage's clock (the `Clock` seam).
//!
//! Bound: at most [`crate::limits::CACHE_CLOCKS`] sessions; a new one past it forgets the
//! session that sent longest ago (its estimate is the least likely to be live).
//!
//! Beside the clocks, what `session.warm` needs from memory: the request a session's step has
//! in flight (its exact bytes: a warm of a generating run re-sends them), held only while the
//! step runs, so at most one per running run; and which sessions have a warm in flight (one
//! at a time each, at most [`crate::limits::WARMS_IN_FLIGHT`] in all).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

/// One session's estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheClock {
    /// The send start of the last request its provider answered (unix ms).
    pub last_sent_at_ms: u64,
    /// The lifetime that request asked for; `None` where the provider's is not known.
    pub ttl_ms: Option<u64>,
}

impl CacheClock {
    /// When the cached prefix is estimated to expire, where the lifetime is known.
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.ttl_ms.map(|ttl| self.last_sent_at_ms.saturating_add(ttl))
    }
}

/// The request a step has in flight: its run and its exact bytes.
#[derive(Clone, Debug)]
pub struct InFlight {
    pub run_id: String,
    pub body: Arc<[u8]>,
}

/// Why a warm could not be taken on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmSlot {
    /// The session has a warm in flight already.
    Busy,
    /// The process has [`crate::limits::WARMS_IN_FLIGHT`] warms in flight.
    Full,
}

/// Every session's estimate, by lineage address, and the warm state beside it.
#[derive(Debug, Default)]
pub struct CacheClocks {
    clocks: Mutex<HashMap<String, CacheClock>>,
    sending: Mutex<HashMap<String, InFlight>>,
    warming: Mutex<HashSet<String>>,
}

impl CacheClocks {
    /// `session`'s step is sending `body` (until [`CacheClocks::step_done`]).
    pub fn sending(&self, session: &str, run_id: &str, body: Arc<[u8]>) {
        self.sending.lock().insert(session.to_owned(), InFlight { run_id: run_id.to_owned(), body });
    }

    pub fn step_done(&self, session: &str) {
        self.sending.lock().remove(session);
    }

    /// The request `session` has in flight, if a step of it is running.
    pub fn in_flight(&self, session: &str) -> Option<InFlight> {
        self.sending.lock().get(session).cloned()
    }

    /// Takes `session`'s one warm slot, or says why not.
    pub fn begin_warm(&self, session: &str) -> Result<(), WarmSlot> {
        let mut warming = self.warming.lock();
        if warming.contains(session) {
            return Err(WarmSlot::Busy);
        }
        if warming.len() >= crate::limits::WARMS_IN_FLIGHT {
            return Err(WarmSlot::Full);
        }
        warming.insert(session.to_owned());
        Ok(())
    }

    /// Gives `session`'s warm slot back (its warm ended, however it ended).
    pub fn end_warm(&self, session: &str) {
        self.warming.lock().remove(session);
    }

    /// `session` sent a request at `at_ms` that its provider answered, asking for `ttl_ms`.
    pub fn sent(&self, session: &str, at_ms: u64, ttl_ms: Option<u64>) {
        let mut clocks = self.clocks.lock();
        if clocks.len() >= crate::limits::CACHE_CLOCKS && !clocks.contains_key(session) {
            if let Some(oldest) = clocks.iter().min_by_key(|(_, c)| c.last_sent_at_ms).map(|(k, _)| k.clone()) {
                clocks.remove(&oldest);
            }
        }
        let clock = clocks.entry(session.to_string()).or_insert(CacheClock { last_sent_at_ms: at_ms, ttl_ms });
        if at_ms >= clock.last_sent_at_ms {
            *clock = CacheClock { last_sent_at_ms: at_ms, ttl_ms };
        }
    }

    pub fn get(&self, session: &str) -> Option<CacheClock> {
        self.clocks.lock().get(session).copied()
    }

    /// Drops `session`'s clock: its cache is no longer this host's to judge (moved away, or
    /// adopted from another host).
    pub fn forget(&self, session: &str) {
        self.clocks.lock().remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_send_restarts_the_estimate_and_an_older_one_does_not() {
        let clocks = CacheClocks::default();
        assert_eq!(clocks.get("s"), None, "unknown until the session sends");
        clocks.sent("s", 1_000, Some(300_000));
        clocks.sent("s", 900, None);
        let clock = clocks.get("s").unwrap();
        assert_eq!((clock.last_sent_at_ms, clock.expires_at_ms()), (1_000, Some(301_000)));
        clocks.sent("s", 2_000, None);
        assert_eq!(clocks.get("s").unwrap().expires_at_ms(), None, "an unknown lifetime has no expiry");
    }

    #[test]
    fn one_warm_per_session_and_the_slot_comes_back() {
        let clocks = CacheClocks::default();
        assert_eq!(clocks.begin_warm("s"), Ok(()));
        assert_eq!(clocks.begin_warm("s"), Err(WarmSlot::Busy));
        clocks.end_warm("s");
        assert_eq!(clocks.begin_warm("s"), Ok(()));
        for i in 1..crate::limits::WARMS_IN_FLIGHT {
            assert_eq!(clocks.begin_warm(&format!("t{i}")), Ok(()));
        }
        assert_eq!(clocks.begin_warm("u"), Err(WarmSlot::Full));
    }

    #[test]
    fn a_step_in_flight_is_held_until_it_is_done() {
        let clocks = CacheClocks::default();
        clocks.sending("s", "run-1", Arc::from(&b"body"[..]));
        assert_eq!(&*clocks.in_flight("s").unwrap().body, b"body");
        clocks.step_done("s");
        assert!(clocks.in_flight("s").is_none());
    }
}
