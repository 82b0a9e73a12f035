//! The reader thread of one consumer connection: decodes frames and resolves calls until the
//! connection ends.
//!
//! Invariants:
//! - the reader never blocks on anything but its own `read`: what it sends (PONG, reverse
//!   refusals, GOODBYEs for idle routes) goes on the writer's control lane with `try_send`, and
//!   the locks it takes are held only for map updates;
//! - a call resolves only by a terminal frame (Response, Error, StreamEnd) on the exact
//!   `(channel, epoch)` it was sent on, echoing its corr; a **reverse Request** a module sends
//!   on a route lives in the module's corr space, is answered `reverse_request_unhandled` at
//!   once and counted, and never resolves a call, even when its corr collides;
//! - a route the module closes (route GOODBYE) or the daemon closes (`route.closed`) leaves the
//!   route cache, and the calls still open on it fail `RouteClosed` (no terminal will come);
//!   `route.closing` only takes the routes out of the cache, their open calls still finish;
//! - an Error proving the request never reached the module (`unknown_channel`,
//!   `stale_route_epoch`, the daemon's `module_reloading`) fails the call `NotDelivered` and
//!   drops its route from the cache;
//! - a StreamData frame goes to the stream call open on its exact `(channel, epoch, corr)`
//!   without blocking (`Link::stream_data`), and is dropped when there is none;
//! - undecodable input ends the connection; nothing read from the socket can panic this thread;
//! - every read timeout tick, routes idle past the TTL get their GOODBYE.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use subc_protocol::error_codes::{is_established_route_dead, MODULE_RELOADING};
use subc_protocol::{ErrorBody, Flags, Frame, FrameType};

use super::link::{data_flags, Link};
use super::wire::{reverse_family, ControlPush};
use super::{CallError, ClientRoute, REVERSE_REQUEST_UNHANDLED};
use crate::subc::frame::{self, Decoder};

/// The longest the reader sleeps in `read` before it looks for idle routes.
const MAX_TICK: Duration = Duration::from_secs(1);
const MIN_TICK: Duration = Duration::from_millis(10);
const READ_BUF: usize = 64 << 10;

/// The read timeout for a connection whose idle routes expire after `idle_ttl`.
fn tick(idle_ttl: Duration) -> Duration {
    (idle_ttl / 2).clamp(MIN_TICK, MAX_TICK)
}

/// Starts the reader thread of `link` on its connection's read half. If the thread cannot
/// start, the link's writer is closed too (a link without a reader is dead).
pub(super) fn start(read_half: TcpStream, link: &Arc<Link>) -> Result<(), CallError> {
    read_half.set_read_timeout(Some(tick(link.routes.lock().idle_ttl()))).map_err(CallError::Io)?;
    let reading = Arc::clone(link);
    let started =
        std::thread::Builder::new().name("broca-consumer-r".into()).spawn(move || read_loop(read_half, &reading));
    started.map(drop).map_err(|e| {
        link.lanes.wire.close();
        CallError::Io(e)
    })
}

fn read_loop(mut stream: TcpStream, link: &Link) {
    let mut decoder = Decoder::new();
    let mut buf = vec![0u8; READ_BUF];
    let mut last_sweep = Instant::now();
    let sweep_every = tick(link.routes.lock().idle_ttl());
    'read: loop {
        if last_sweep.elapsed() >= sweep_every {
            sweep(link);
            last_sweep = Instant::now();
        }
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if link.is_live() {
                    log::info!(target: "broca::subc", "consumer connection: read failed: {e}");
                }
                break;
            }
        };
        decoder.feed(&buf[..n]);
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => {
                    if !on_frame(link, f) {
                        break 'read;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!(target: "broca::subc", "consumer connection: undecodable frame: {e}");
                    break 'read;
                }
            }
        }
    }
    if link.is_live() {
        log::info!(target: "broca::subc", "consumer connection ended");
    }
    link.end();
}

/// GOODBYE for every route idle past the TTL.
fn sweep(link: &Link) {
    let expired = link.routes.lock().take_expired(Instant::now());
    for route in expired {
        link.goodbye(route);
    }
}

/// Handles one frame; false when the connection is over.
fn on_frame(link: &Link, f: Frame) -> bool {
    let h = f.header;
    let route = link.route(h.channel, h.epoch);
    match h.ty {
        FrameType::Ping => {
            send_control(link, FrameType::Pong, h.flags, route, h.corr, &[]);
            link.totals.pongs.fetch_add(1, Ordering::Relaxed);
        }
        FrameType::Goodbye if h.channel == 0 => return false,
        FrameType::Goodbye => closed_by_module(link, route),
        FrameType::Request if h.channel != 0 => refuse_reverse(link, route, h.corr, &f.body),
        FrameType::Response | FrameType::StreamEnd => answer(link, route, h.corr, Ok(f.body)),
        FrameType::StreamData if h.channel != 0 => link.stream_data(h.corr, route, f.body),
        FrameType::Error => {
            let body = serde_json::from_slice::<ErrorBody>(&f.body).unwrap_or_else(|_| {
                ErrorBody::new(
                    crate::wire::RefusalCode::InvalidError.as_str(),
                    String::from_utf8_lossy(&f.body).into_owned(),
                )
            });
            if h.channel != 0 && not_delivered(h.flags, &body.code) {
                answer(link, route, h.corr, Err(CallError::NotDelivered(body)));
                link.totals.routes_invalidated.fetch_add(1, Ordering::Relaxed);
                link.close_route(route);
            } else {
                answer(link, route, h.corr, Err(CallError::Module(body)));
            }
        }
        FrameType::Push if h.channel == 0 => on_push(link, &f.body),
        ty => log::debug!(target: "broca::subc", "consumer connection: ignoring {ty:?} on channel {}", h.channel),
    }
    true
}

/// Whether an Error on a route proves the module never received the request.
fn not_delivered(flags: Flags, code: &str) -> bool {
    is_established_route_dead(flags, code) || (code == MODULE_RELOADING && flags.is_daemon_origin())
}

fn answer(link: &Link, route: ClientRoute, corr: u64, result: Result<Vec<u8>, CallError>) {
    // Matched on the corr and the route it went out on; anything else is not a terminal of ours.
    let Some(pending) = link.finish_matching(corr, route) else {
        log::debug!(target: "broca::subc", "consumer connection: no open call {corr} on {}/{}", route.channel, route.epoch);
        return;
    };
    let _ = pending.tx.send(result);
    link.end_stream(corr);
}

/// The module ended `route` (GOODBYE on it): the daemon has released it already.
fn closed_by_module(link: &Link, route: ClientRoute) {
    if link.routes.lock().remove(route) {
        link.totals.routes_invalidated.fetch_add(1, Ordering::Relaxed);
    }
    for pending in link.finish_where(|p| p.route == route) {
        let _ = pending.tx.send(Err(CallError::RouteClosed));
    }
}

fn on_push(link: &Link, body: &[u8]) {
    match serde_json::from_slice::<ControlPush>(body) {
        Ok(ControlPush::RouteClosing { module_id, channels, reason }) => {
            let gone = link.routes.lock().remove_channels(&channels);
            log::debug!(target: "broca::subc", "routes to {module_id} closing ({reason:?}): {} cached route(s) dropped", gone.len());
            link.totals.routes_invalidated.fetch_add(gone.len() as u64, Ordering::Relaxed);
        }
        Ok(ControlPush::RouteClosed { module_id, channels, reason }) => {
            let gone = link.routes.lock().remove_channels(&channels);
            link.totals.routes_invalidated.fetch_add(gone.len() as u64, Ordering::Relaxed);
            let failed = link.finish_where(|p| p.route.channel != 0 && channels.contains(&p.route.channel));
            log::debug!(
                target: "broca::subc",
                "routes to {module_id} closed ({reason:?}): {} cached route(s) dropped, {} call(s) failed",
                gone.len(),
                failed.len()
            );
            for pending in failed {
                let _ = pending.tx.send(Err(CallError::RouteClosed));
            }
        }
        Err(e) => log::debug!(target: "broca::subc", "consumer connection: ignoring a push: {e}"),
    }
}

/// A module's reverse request: broca fronts no person who could answer one.
fn refuse_reverse(link: &Link, route: ClientRoute, corr: u64, body: &[u8]) {
    let family = reverse_family(body);
    let refusal =
        ErrorBody::new(REVERSE_REQUEST_UNHANDLED, format!("no reverse-request handler is registered for {family}"));
    let bytes = serde_json::to_vec(&refusal).unwrap_or_default();
    send_control(link, FrameType::Error, data_flags(), route, corr, &bytes);
    link.totals.reverse_requests_refused.fetch_add(1, Ordering::Relaxed);
}

fn send_control(link: &Link, ty: FrameType, flags: Flags, route: ClientRoute, corr: u64, body: &[u8]) {
    let Ok(bytes) = frame::encode(ty, flags, route.channel, route.epoch, corr, body) else {
        return;
    };
    if !link.lanes.control(bytes) && link.is_live() {
        link.totals.control_frames_dropped.fetch_add(1, Ordering::Relaxed);
        log::warn!(target: "broca::subc", "consumer connection: control lane full; {ty:?} on {}/{} dropped", route.channel, route.epoch);
    }
}

#[cfg(test)]
mod tests {
    use subc_protocol::Priority;

    use super::*;

    #[test]
    fn only_the_daemons_pre_send_refusals_count_as_not_delivered() {
        let module = Flags::new(false, Priority::Interactive, false);
        let daemon = module.with_daemon_origin();
        assert!(not_delivered(daemon, "unknown_channel"));
        assert!(not_delivered(daemon, "stale_route_epoch"));
        assert!(not_delivered(daemon, "module_reloading"));
        // A module may spell any code; only the daemon's module_reloading proves non-delivery.
        assert!(!not_delivered(module, "module_reloading"));
        assert!(!not_delivered(daemon, "frame_too_large"), "the module received an oversized-reply request");
        assert!(!not_delivered(daemon, "cancelled"));
    }

    #[test]
    fn the_idle_sweep_ticks_at_half_the_ttl_within_bounds() {
        assert_eq!(tick(Duration::from_secs(120)), MAX_TICK);
        assert_eq!(tick(Duration::from_millis(300)), Duration::from_millis(150));
        assert_eq!(tick(Duration::ZERO), MIN_TICK);
    }
}
