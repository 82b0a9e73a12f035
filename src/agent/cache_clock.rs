//! The prompt-cache clock (spec §4a "Expiry", §4 `session.head.cache`): per session, when it
//! last sent a request its provider answered, and the lifetime that request's cache marks asked
//! for. A provider's cache lives from a request's send start, and a read renews it, so every
//! answered request restarts the estimate. Memory only: after a restart it is unknown until the
//! session sends again. Times come from the lineage's clock (the `Clock` seam).
//!
//! Bound: at most [`crate::limits::CACHE_CLOCKS`] sessions; a new one past it forgets the
//! session that sent longest ago (its estimate is the least likely to be live).

use std::collections::HashMap;

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

/// Every session's estimate, by lineage address.
#[derive(Debug, Default)]
pub struct CacheClocks(Mutex<HashMap<String, CacheClock>>);

impl CacheClocks {
    /// `session` sent a request at `at_ms` that its provider answered, asking for `ttl_ms`.
    pub fn sent(&self, session: &str, at_ms: u64, ttl_ms: Option<u64>) {
        let mut clocks = self.0.lock();
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
        self.0.lock().get(session).copied()
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
}
