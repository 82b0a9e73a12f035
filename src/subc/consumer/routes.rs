//! [`RouteCache`]: the routes one consumer connection keeps open, one per (target, bind identity).
//!
//! Pure bookkeeping: no I/O and no clock of its own (every method takes `now`), so the rules are
//! tested here without sockets. The caller sends the route GOODBYE for every route a method hands
//! back as closed or evicted.
//!
//! Invariants:
//! - `by_key` and `entries` describe the same set: a key maps to exactly one route and that
//!   route's entry names the key back; at most [`RouteCache::capacity`] routes are cached, so a
//!   connection holds at most that many open routes of its own and the daemon's u16 channel
//!   space (per connection and per target endpoint) is never exhausted by broca;
//! - `in_flight` counts the calls that hold a lease on the route (a Request sent and its
//!   terminal frame not yet seen); a leased route is never evicted and never expires, so a
//!   GOODBYE never overtakes a Request still in flight on that route;
//! - eviction takes the least recently used idle route; when every route is leased the cache
//!   refuses ([`Insert::Full`]) instead of growing;
//! - a route idle for longer than the idle TTL is handed back by [`RouteCache::take_expired`];
//! - a route the module or the daemon closed is forgotten ([`RouteCache::remove`],
//!   [`RouteCache::remove_channels`]) and the next call for its key opens a new one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use subc_protocol::{BindIdentity, RouteTarget};

use super::ClientRoute;

/// What a cached route is for: the target and every field of the bind identity the opener sends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteKey {
    target: TargetKey,
    harness: String,
    session: String,
    build_class: Option<String>,
    /// The consumer capabilities the route was opened declaring: routes to one target that
    /// declare differently are different routes.
    capabilities: &'static [&'static str],
}

/// [`RouteTarget`] in a hashable form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum TargetKey {
    ToolProvider(String),
    ManagementSurface(String),
    InternalService { module_id: String, service_id: String },
}

impl RouteKey {
    pub fn new(target: &RouteTarget, identity: &BindIdentity) -> RouteKey {
        RouteKey::declaring(target, identity, &[])
    }

    /// The key of a route opened declaring `capabilities`.
    pub fn declaring(target: &RouteTarget, identity: &BindIdentity, capabilities: &'static [&'static str]) -> RouteKey {
        let target = match target {
            RouteTarget::ToolProvider { module_id } => TargetKey::ToolProvider(module_id.clone()),
            RouteTarget::ManagementSurface { module_id } => TargetKey::ManagementSurface(module_id.clone()),
            RouteTarget::InternalService { module_id, service_id } => {
                TargetKey::InternalService { module_id: module_id.clone(), service_id: service_id.clone() }
            }
        };
        RouteKey {
            target,
            harness: identity.harness.clone(),
            session: identity.session.clone(),
            build_class: identity.build_class.clone(),
            capabilities,
        }
    }

    /// The target module's id.
    pub fn module_id(&self) -> &str {
        match &self.target {
            TargetKey::ToolProvider(id) | TargetKey::ManagementSurface(id) => id,
            TargetKey::InternalService { module_id, .. } => module_id,
        }
    }
}

#[derive(Debug)]
struct Entry {
    key: RouteKey,
    in_flight: u32,
    /// When the route last became idle or was last leased (the idle TTL counts from here).
    last_used: Instant,
    /// Recency stamp for LRU: larger is more recent (ties on `Instant` are common).
    stamp: u64,
}

/// The outcome of [`RouteCache::insert_leased`].
#[derive(Debug, PartialEq, Eq)]
pub enum Insert {
    /// Cached and leased; `evicted` (if any) was dropped to make room and needs its GOODBYE.
    Inserted { evicted: Option<ClientRoute> },
    /// Another caller cached a route for this key first: it is leased instead, and the new one
    /// (not cached) needs its GOODBYE.
    Raced { existing: ClientRoute },
    /// Every cached route is leased: nothing was cached and the new route needs its GOODBYE.
    Full,
}

/// See the module docs.
#[derive(Debug)]
pub struct RouteCache {
    capacity: usize,
    idle_ttl: Duration,
    by_key: HashMap<RouteKey, ClientRoute>,
    entries: HashMap<ClientRoute, Entry>,
    next_stamp: u64,
}

impl RouteCache {
    /// A cache of at most `capacity` routes (at least one).
    pub fn new(capacity: usize, idle_ttl: Duration) -> RouteCache {
        RouteCache {
            capacity: capacity.max(1),
            idle_ttl,
            by_key: HashMap::new(),
            entries: HashMap::new(),
            next_stamp: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn idle_ttl(&self) -> Duration {
        self.idle_ttl
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is cached.
    pub fn contains(&self, key: &RouteKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// Whether a new route could be cached now (a free slot, or an idle route to evict).
    pub fn has_room(&self) -> bool {
        self.entries.len() < self.capacity || self.entries.values().any(|e| e.in_flight == 0)
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// The cached route for `key`, leased (released by [`RouteCache::release`]).
    pub fn lease(&mut self, key: &RouteKey, now: Instant) -> Option<ClientRoute> {
        let route = *self.by_key.get(key)?;
        self.lease_route(route, now).then_some(route)
    }

    /// Leases `route` if it is cached; false (nothing changed) if it is not.
    pub fn lease_route(&mut self, route: ClientRoute, now: Instant) -> bool {
        let stamp = self.stamp();
        match self.entries.get_mut(&route) {
            Some(entry) => {
                entry.in_flight = entry.in_flight.saturating_add(1);
                entry.last_used = now;
                entry.stamp = stamp;
                true
            }
            None => false,
        }
    }

    /// Ends one lease on `route` (a no-op if the route was forgotten meanwhile).
    pub fn release(&mut self, route: ClientRoute, now: Instant) {
        if let Some(entry) = self.entries.get_mut(&route) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.last_used = now;
        }
    }

    /// Caches a route just opened for `key`, leased once. See [`Insert`].
    pub fn insert_leased(&mut self, key: RouteKey, route: ClientRoute, now: Instant) -> Insert {
        if let Some(&existing) = self.by_key.get(&key) {
            self.lease_route(existing, now);
            return Insert::Raced { existing };
        }
        let mut evicted = None;
        if self.entries.len() >= self.capacity {
            let lru =
                self.entries.iter().filter(|(_, e)| e.in_flight == 0).min_by_key(|(_, e)| e.stamp).map(|(r, _)| *r);
            match lru {
                Some(lru) => {
                    self.remove(lru);
                    evicted = Some(lru);
                }
                None => return Insert::Full,
            }
        }
        let stamp = self.stamp();
        self.by_key.insert(key.clone(), route);
        self.entries.insert(route, Entry { key, in_flight: 1, last_used: now, stamp });
        Insert::Inserted { evicted }
    }

    /// Forgets exactly `route` (channel and epoch); true if it was cached.
    pub fn remove(&mut self, route: ClientRoute) -> bool {
        match self.entries.remove(&route) {
            Some(entry) => {
                self.by_key.remove(&entry.key);
                true
            }
            None => false,
        }
    }

    /// Forgets every cached route on one of `channels` (a daemon closure notice names channels,
    /// not epochs); the routes forgotten.
    pub fn remove_channels(&mut self, channels: &[u16]) -> Vec<ClientRoute> {
        let gone: Vec<ClientRoute> = self.entries.keys().filter(|r| channels.contains(&r.channel)).copied().collect();
        for route in &gone {
            self.remove(*route);
        }
        gone
    }

    /// Forgets and returns every idle route unused for longer than the idle TTL.
    pub fn take_expired(&mut self, now: Instant) -> Vec<ClientRoute> {
        let ttl = self.idle_ttl;
        let expired: Vec<ClientRoute> = self
            .entries
            .iter()
            .filter(|(_, e)| e.in_flight == 0 && now.saturating_duration_since(e.last_used) > ttl)
            .map(|(r, _)| *r)
            .collect();
        for route in &expired {
            self.remove(*route);
        }
        expired
    }

    /// Forgets everything (the connection ended: its routes ended with it).
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: &str) -> RouteKey {
        RouteKey::new(&RouteTarget::ToolProvider { module_id: "tools".into() }, &BindIdentity::new("h", session))
    }

    fn route(channel: u16) -> ClientRoute {
        ClientRoute { channel, epoch: 1, generation: 0 }
    }

    #[test]
    fn a_cached_route_is_leased_again_for_the_same_key_only() {
        let now = Instant::now();
        let mut cache = RouteCache::new(4, Duration::from_secs(60));
        assert_eq!(cache.lease(&key("a"), now), None);
        assert_eq!(cache.insert_leased(key("a"), route(1), now), Insert::Inserted { evicted: None });
        assert_eq!(cache.lease(&key("a"), now), Some(route(1)));
        assert_eq!(cache.lease(&key("b"), now), None);
        let other_target =
            RouteKey::new(&RouteTarget::ManagementSurface { module_id: "tools".into() }, &BindIdentity::new("h", "a"));
        assert_eq!(cache.lease(&other_target, now), None, "the target kind is part of the key");
        let mut classed = BindIdentity::new("h", "a");
        classed.build_class = Some("production".into());
        let classed = RouteKey::new(&RouteTarget::ToolProvider { module_id: "tools".into() }, &classed);
        assert_eq!(cache.lease(&classed, now), None, "so is every identity field");
        assert_eq!(key("a").module_id(), "tools");
    }

    #[test]
    fn past_the_bound_the_least_recently_used_idle_route_is_evicted() {
        let now = Instant::now();
        let mut cache = RouteCache::new(2, Duration::from_secs(60));
        cache.insert_leased(key("a"), route(1), now);
        cache.insert_leased(key("b"), route(2), now);
        cache.release(route(1), now);
        cache.release(route(2), now);
        // `a` is used again, so `b` is now the least recently used.
        assert!(cache.lease(&key("a"), now).is_some());
        cache.release(route(1), now);
        assert_eq!(cache.insert_leased(key("c"), route(3), now), Insert::Inserted { evicted: Some(route(2)) });
        assert_eq!(cache.len(), 2);
        assert!(!cache.contains(&key("b")));
    }

    #[test]
    fn a_leased_route_is_never_evicted_and_a_full_cache_of_leased_routes_refuses() {
        let now = Instant::now();
        let mut cache = RouteCache::new(2, Duration::from_secs(60));
        cache.insert_leased(key("a"), route(1), now);
        cache.insert_leased(key("b"), route(2), now);
        cache.release(route(2), now);
        assert_eq!(cache.insert_leased(key("c"), route(3), now), Insert::Inserted { evicted: Some(route(2)) });
        assert!(!cache.has_room());
        assert_eq!(cache.insert_leased(key("d"), route(4), now), Insert::Full);
        assert_eq!(cache.len(), 2);
        cache.release(route(1), now);
        assert!(cache.has_room());
    }

    #[test]
    fn a_second_open_for_a_cached_key_leases_the_first_route() {
        let now = Instant::now();
        let mut cache = RouteCache::new(2, Duration::from_secs(60));
        cache.insert_leased(key("a"), route(1), now);
        assert_eq!(cache.insert_leased(key("a"), route(2), now), Insert::Raced { existing: route(1) });
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn only_idle_routes_expire_and_the_ttl_counts_from_the_last_release() {
        let start = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut cache = RouteCache::new(4, ttl);
        cache.insert_leased(key("a"), route(1), start);
        cache.insert_leased(key("b"), route(2), start);
        cache.release(route(2), start);
        let later = start + ttl + Duration::from_secs(1);
        assert_eq!(cache.take_expired(later), vec![route(2)], "a leased route does not expire");
        cache.release(route(1), later);
        assert!(cache.take_expired(later + ttl).is_empty(), "idle for exactly the TTL is not expired");
        assert_eq!(cache.take_expired(later + ttl + Duration::from_millis(1)), vec![route(1)]);
        assert!(cache.is_empty());
    }

    #[test]
    fn closed_routes_are_forgotten_by_route_or_channel_and_a_stale_epoch_is_not_confused() {
        let now = Instant::now();
        let mut cache = RouteCache::new(4, Duration::from_secs(60));
        cache.insert_leased(key("a"), route(1), now);
        cache.insert_leased(key("b"), route(2), now);
        cache.insert_leased(key("c"), route(3), now);
        assert!(
            !cache.remove(ClientRoute { channel: 1, epoch: 7, generation: 0 }),
            "another epoch on the channel is another route"
        );
        assert!(cache.remove(route(1)));
        assert!(!cache.contains(&key("a")));
        let mut gone = cache.remove_channels(&[2, 3, 9]);
        gone.sort_by_key(|r| r.channel);
        assert_eq!(gone, vec![route(2), route(3)]);
        assert!(cache.is_empty());
        // A release after the route was forgotten changes nothing.
        cache.release(route(2), now);
        assert!(cache.is_empty());
    }
}
