//! The module's route table and its open requests: owned by the io thread, never shared.
//!
//! Invariants of [`RouteTable`]:
//! - a channel has at most one installed epoch; a bind for an installed channel must carry a
//!   strictly higher epoch (which replaces the old route); equal or lower is refused;
//! - frames are accepted only on an installed `(channel, epoch)`: anything else is unbound or
//!   stale and is dropped by the caller;
//! - every open request belongs to an installed route (or to the control channel,
//!   [`Route::CONTROL`]); closing or replacing a route forgets its open requests, because the
//!   daemon releases their credits with the route;
//! - a request is open from its arrival until its one terminal frame: `finish` succeeds once.

use std::collections::{HashMap, HashSet};
use std::fmt;

/// A bound route in the module's local numbering: the channel and the epoch of its binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    pub channel: u16,
    pub epoch: u32,
}

impl Route {
    /// Channel 0: subc control. Its epoch is always 0.
    pub const CONTROL: Route = Route { channel: 0, epoch: 0 };

    pub fn new(channel: u16, epoch: u32) -> Route {
        Route { channel, epoch }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.channel, self.epoch)
    }
}

#[derive(Debug, Default)]
pub(crate) struct RouteTable {
    installed: HashMap<u16, u32>,
    open: HashMap<Route, HashSet<u64>>,
}

impl RouteTable {
    pub fn is_bound(&self, route: Route) -> bool {
        route == Route::CONTROL || self.installed.get(&route.channel) == Some(&route.epoch)
    }

    /// Whether `route` may be bound: `Ok(Some(old))` when it would replace `old`, `Err(installed)`
    /// when the channel already has an epoch at least as high.
    pub fn check_bind(&self, route: Route) -> Result<Option<Route>, u32> {
        match self.installed.get(&route.channel) {
            None => Ok(None),
            Some(&installed) if route.epoch > installed => Ok(Some(Route::new(route.channel, installed))),
            Some(&installed) => Err(installed),
        }
    }

    /// Installs `route`, replacing (and forgetting the requests of) a lower epoch on its channel.
    pub fn install(&mut self, route: Route) {
        if let Some(old) = self.installed.insert(route.channel, route.epoch) {
            self.open.remove(&Route::new(route.channel, old));
        }
    }

    /// Removes `route` if it is the installed one; returns whether it was.
    pub fn close(&mut self, route: Route) -> bool {
        if route == Route::CONTROL || !self.is_bound(route) {
            return false;
        }
        self.installed.remove(&route.channel);
        self.open.remove(&route);
        true
    }

    /// Records an arriving request; false if that corr is already open on the route.
    pub fn open_request(&mut self, route: Route, corr: u64) -> bool {
        self.open.entry(route).or_default().insert(corr)
    }

    pub fn is_open(&self, route: Route, corr: u64) -> bool {
        self.open.get(&route).is_some_and(|s| s.contains(&corr))
    }

    /// Marks the request answered; false if it was not open (already answered, or never seen).
    pub fn finish(&mut self, route: Route, corr: u64) -> bool {
        let Some(set) = self.open.get_mut(&route) else { return false };
        let removed = set.remove(&corr);
        if set.is_empty() {
            self.open.remove(&route);
        }
        removed
    }

    /// Installed routes (the control channel is not counted).
    pub fn bound_count(&self) -> usize {
        self.installed.len()
    }

    /// Open requests on every route, control included.
    pub fn open_count(&self) -> usize {
        self.open.values().map(HashSet::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_strictly_higher_epoch_replaces_a_route() {
        let mut t = RouteTable::default();
        let r1 = Route::new(3, 1);
        assert_eq!(t.check_bind(r1), Ok(None));
        t.install(r1);
        assert!(t.is_bound(r1));
        assert_eq!(t.check_bind(Route::new(3, 1)), Err(1));
        assert_eq!(t.check_bind(Route::new(3, 0)), Err(1));
        assert!(t.open_request(r1, 9));
        let r2 = Route::new(3, 2);
        assert_eq!(t.check_bind(r2), Ok(Some(r1)));
        t.install(r2);
        assert!(!t.is_bound(r1), "the old epoch is stale now");
        assert!(!t.is_open(r1, 9), "the replaced route's requests are forgotten");
        assert_eq!(t.bound_count(), 1);
    }

    #[test]
    fn closing_names_one_epoch_and_forgets_its_requests() {
        let mut t = RouteTable::default();
        let r = Route::new(1, 5);
        t.install(r);
        t.install(Route::new(2, 1));
        t.open_request(r, 1);
        t.open_request(r, 2);
        assert!(!t.close(Route::new(1, 4)), "a stale GOODBYE closes nothing");
        assert!(t.is_bound(r));
        assert!(t.close(r));
        assert!(!t.is_bound(r));
        assert_eq!(t.open_count(), 0);
        assert!(t.is_bound(Route::new(2, 1)));
        assert!(!t.close(Route::CONTROL));
    }

    #[test]
    fn a_request_finishes_once() {
        let mut t = RouteTable::default();
        let r = Route::new(1, 1);
        t.install(r);
        assert!(t.open_request(r, 7));
        assert!(!t.open_request(r, 7), "a duplicate corr is reported");
        assert!(t.is_open(r, 7));
        assert!(t.finish(r, 7));
        assert!(!t.finish(r, 7));
        assert!(!t.finish(r, 8));
        assert!(t.open_request(Route::CONTROL, 3));
        assert!(t.is_bound(Route::CONTROL));
        assert!(t.finish(Route::CONTROL, 3));
    }
}
