//! Calls in flight (spec §19): the dispatch fence and the per-route credit window.
//!
//! Invariants:
//! - a `(lineage, tool_call_id)` is in flight at most once: a second dispatch of a call already
//!   in flight is refused without sending;
//! - a route (a provider module for a session) never has more calls in flight than the
//!   provider's credit window (its declared concurrency: `serial` 1, `module_managed` 32,
//!   `stateless_parallel` 1024). Beyond it a call waits here, never in the daemon — the daemon
//!   stops reading a connection whose request waits for credit, pongs included;
//! - at most [`MAX_CALLS_IN_FLIGHT`] calls are in flight in the process.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

pub use crate::limits::MAX_CALLS_IN_FLIGHT;
/// The window of a provider whose concurrency is undeclared or unknown (`module_managed`).
pub const DEFAULT_WINDOW: usize = 32;

/// The credit window a module's declared `concurrency` gives (subc-wire §7).
pub fn window_of(concurrency: Option<&str>) -> usize {
    match concurrency {
        Some("serial") => 1,
        Some("stateless_parallel") => 1024,
        _ => DEFAULT_WINDOW,
    }
}

#[derive(Default)]
struct State {
    calls: HashSet<(String, String)>,
    /// `(module, lineage)` → calls in flight on that route.
    routes: HashMap<(String, String), usize>,
}

/// See the module docs.
#[derive(Default)]
pub struct Flight {
    state: Mutex<State>,
    freed: Condvar,
}

/// Why a call may not go (nothing was sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The same call is already in flight.
    InFlight,
    /// The process holds [`MAX_CALLS_IN_FLIGHT`] calls.
    Full,
    /// The route's window stayed full until the call's deadline.
    WindowFull,
}

impl Refused {
    pub fn message(self) -> &'static str {
        match self {
            Refused::InFlight => "this call is already in flight; it is not dispatched twice",
            Refused::Full => "too many tool calls are in flight in this process",
            Refused::WindowFull => "the provider's credit window stayed full until the call's deadline",
        }
    }
}

impl Flight {
    /// Takes a place for the call `(lineage, tool_call_id)` on `module`'s route, waiting (until
    /// `deadline`) while the route holds `window` calls.
    pub fn enter(
        &self,
        module: &str,
        lineage: &str,
        tool_call_id: &str,
        window: usize,
        deadline: Instant,
    ) -> Result<Pass<'_>, Refused> {
        let call = (lineage.to_owned(), tool_call_id.to_owned());
        let route = (module.to_owned(), lineage.to_owned());
        let mut state = self.state.lock();
        if state.calls.contains(&call) {
            return Err(Refused::InFlight);
        }
        if state.calls.len() >= MAX_CALLS_IN_FLIGHT {
            return Err(Refused::Full);
        }
        while state.routes.get(&route).copied().unwrap_or(0) >= window.max(1) {
            if self.freed.wait_until(&mut state, deadline).timed_out() {
                return Err(Refused::WindowFull);
            }
        }
        state.calls.insert(call.clone());
        *state.routes.entry(route.clone()).or_insert(0) += 1;
        Ok(Pass { flight: self, call, route })
    }

    /// Calls in flight now.
    pub fn len(&self) -> usize {
        self.state.lock().calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A call's place, given back when it ends.
pub struct Pass<'a> {
    flight: &'a Flight,
    call: (String, String),
    route: (String, String),
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut state = self.flight.state.lock();
        state.calls.remove(&self.call);
        if let Some(n) = state.routes.get_mut(&self.route) {
            *n -= 1;
            if *n == 0 {
                state.routes.remove(&self.route);
            }
        }
        drop(state);
        self.flight.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn a_call_in_flight_is_not_dispatched_twice() {
        let f = Flight::default();
        let _a = f.enter("m", "l", "c1", 32, soon()).unwrap();
        assert_eq!(f.enter("m", "l", "c1", 32, soon()).err(), Some(Refused::InFlight));
        assert!(f.enter("m", "other-session", "c1", 32, soon()).is_ok(), "the fence is per session");
    }

    #[test]
    fn a_serial_route_holds_one_call_and_the_next_waits_for_it() {
        let f = Arc::new(Flight::default());
        let first = f.enter("m", "l", "c1", window_of(Some("serial")), soon()).unwrap();
        let short = Instant::now() + Duration::from_millis(50);
        assert_eq!(f.enter("m", "l", "c2", 1, short).err(), Some(Refused::WindowFull));
        assert!(f.enter("m", "l2", "c2", 1, soon()).is_ok(), "another session's route has its own window");
        let waiter = {
            let f = Arc::clone(&f);
            std::thread::spawn(move || f.enter("m", "l", "c3", 1, soon()).map(drop).is_ok())
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        assert!(waiter.join().unwrap(), "the waiting call went once the first ended");
        assert!(f.is_empty());
    }

    #[test]
    fn windows_follow_the_declared_concurrency() {
        assert_eq!(window_of(Some("serial")), 1);
        assert_eq!(window_of(Some("stateless_parallel")), 1024);
        assert_eq!(window_of(Some("module_managed")), 32);
        assert_eq!(window_of(None), 32);
    }
}
