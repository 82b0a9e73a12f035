//! The bounds on everything that grows with load, in one place (README "Limits" is the same
//! table). Nothing broca keeps per session, per subscriber, per request or per call grows
//! without one of these: past a bound the caller gets a typed refusal naming it
//! (`detail.limit`), never unbounded memory or threads.
//!
//! Operator-tunable bounds live in [`Limits`] (`broca.jsonc` member `limits`); fixed ones are
//! constants beside their owners and re-exported here so the table below can be checked at
//! compile time. Invariants tied together here:
//! - a read page (and a history page) fits in one transport frame with room for its envelope;
//! - every admitted message can be read back whole in one frame;
//! - one batch never asks for more calls than may be in flight in the whole process;
//! - streamer threads cover one attempt per open session plus as many draining ones.

use serde_json::Value;

/// The largest frame the daemon delivers (subc's transport limit, header included).
pub const FRAME_LIMIT: usize = subc_protocol::MAX_DELIVERED_FRAME_LEN;

/// The largest session archive a move reads or writes (`crate::moves::archive`).
pub const MOVE_ARCHIVE_BYTES: u64 = 256 << 20;
/// The largest WAL a move exports: its archive (magic, a header line of at most 16 KiB, the
/// seal) stays within [`MOVE_ARCHIVE_BYTES`], so every archive written can be adopted. A
/// larger session is refused `session_too_large` before its tombstone.
pub const MOVE_WAL_BYTES: u64 = MOVE_ARCHIVE_BYTES - (16 << 10) - 1024;

/// Commands one session's actor may have waiting; a send past it is refused transiently
/// (`open_failed`, class transient).
pub const MAILBOX: usize = 1024;

/// Control units a subscriber may lag before it is detached (the control ring's capacity;
/// the stream ends `subscriber_lagged` and the client resubscribes from its cursor).
pub const CONTROL_LANE: usize = 4096;
/// Display events a subscriber may lag before deltas are dropped (the display ring's capacity;
/// the subscriber sees `display_gap`).
pub const DISPLAY_LANE: usize = 1024;
/// Text one session keeps of its step in flight for an attaching subscriber's replay (the
/// coalesced deltas of the fan-out's step snapshot). Past it that step's attach replay is
/// `display_reset` alone, then the live deltas.
pub const STEP_SNAPSHOT_BYTES: usize = 512 << 10;

/// Idle keep-alive connections an agent keeps per provider host. A loop's steps are
/// sequential, so one run reuses one connection step after step; the rest serve sessions
/// running at once against the same provider (beyond this, finished connections are closed).
pub const POOL_IDLE_PER_HOST: usize = 8;

/// Model-stream helper threads at once: one attempt per open session, and as many finishing
/// the read of a stream whose end the loop already has. Past it an attempt fails transiently
/// (and is retried by the run's backoff).
pub const STREAMER_THREADS: usize = 2 * DEFAULT_OPEN_SESSIONS;

/// Calls (route opens included) that may be open on broca's consumer connection at once.
pub const MAX_PENDING_CALLS: usize = 4096;
/// Tool calls the whole process may have in flight across every session.
pub const MAX_CALLS_IN_FLIGHT: usize = MAX_PENDING_CALLS;
/// Routes broca's consumer connection keeps open (far below the daemon's 65,535 channels);
/// past it the least recently used idle route is closed, and a full cache of busy routes
/// refuses the open.
pub const ROUTE_CACHE_CAPACITY: usize = 256;

/// The longest `session.send.retention` accepted, in seconds (llm-runner §9.1: declared as
/// `role.describe.retention.max_seconds`): 30 days.
pub const RETENTION_MAX_SECONDS: u64 = 30 * 24 * 3600;
/// The most time from a retained session's expiry to the deletion of everything broca holds of
/// it (`role.describe.retention.delete_within_ms`). The sweep runs every
/// [`RETENTION_SWEEP_MS`], and an idle actor closes at expiry, so deletion lands within one
/// sweep of it; the rest is margin for a slow disk.
pub const RETENTION_DELETE_WITHIN_MS: u64 = 2_000;
/// How often the retention sweep looks at the sessions of `wal-ephemeral/` with no open actor.
pub const RETENTION_SWEEP_MS: u64 = 250;
/// How often the sweep tries again to delete an expired session whose deletion held calls
/// fence (`crate::intake::fence`): each try replays its WAL and reads the intake store. A fenced
/// session is not bound by [`RETENTION_DELETE_WITHIN_MS`] (spec §19 blocks its deletion).
pub const RETENTION_FENCE_RECHECK_MS: u64 = 1_000;
/// How long opening a session waits for a lease this process itself holds (the retention
/// sweep deleting the record, or a closing session writing its last rows) before it answers
/// `session_busy`. Another process's lease is refused at once.
pub const OWN_LEASE_WAIT_MS: u64 = 500;
/// How long a read of a folded session waits for a fold or unfold of it (in this process or
/// another) to let go of its lease before it answers from what it finds.
pub const FOLD_WAIT_MS: u64 = 2_000;

/// The largest `session.read` page a request may ask for (a larger `limit` is clamped).
pub const READ_MAX_LIMIT: u64 = 1000;
/// The largest `session.read` (and `session.history`, `run.tool_calls`) page in bytes, and the
/// default (spec §4: 3 MiB).
pub const READ_MAX_BYTES: u64 = 3 << 20;

/// The largest user message a send may write, as its stored JSON: every admitted message must
/// come back whole on a `session.read` page, whose complete reply frame is at most the
/// transport limit (4 MiB with its header); the rest is the page's envelope. Past it
/// `invalid_params` naming the limit.
pub const MAX_MESSAGE_JSON_BYTES: usize = FRAME_LIMIT - (64 << 10);

/// Durable batches that may wait for the run-index writer before lineages block on it
/// (backpressure from a slow disk, never memory).
pub const RUN_INDEX_QUEUE: usize = 256;

/// Op workers at once (each serves one request; past it a request is refused
/// `too_many_requests`).
pub const OP_THREADS: usize = 512;

/// Tool-call helper threads at once (each waits for one call; past it a call is an error result
/// with nothing sent).
pub const TOOL_THREADS: usize = 1024;

/// Tool calls one model step may ask for: later ones are recorded as never-executed error
/// results (nothing sent), so the provider-valid call/result pairing holds.
pub const CALLS_PER_BATCH: usize = 128;

const _: () = assert!(READ_MAX_BYTES as usize + (64 << 10) <= FRAME_LIMIT, "a read page fits one frame");
const _: () =
    assert!(READ_MAX_BYTES as usize <= MAX_MESSAGE_JSON_BYTES, "a message too large for a page is served alone");
const _: () = assert!(MAX_MESSAGE_JSON_BYTES < FRAME_LIMIT, "an admitted message reads back whole");
const _: () = assert!(CALLS_PER_BATCH <= MAX_CALLS_IN_FLIGHT, "one batch can be in flight at once");
const _: () = assert!(TOOL_THREADS <= MAX_CALLS_IN_FLIGHT, "a tool thread waits for one pending call");
const _: () = assert!(STREAMER_THREADS >= 2 * DEFAULT_OPEN_SESSIONS, "every open session can stream");
const _: () = assert!(DISPLAY_LANE <= CONTROL_LANE, "display lags before control detaches");
const _: () = assert!(
    6 * STEP_SNAPSHOT_BYTES + (64 << 10) <= FRAME_LIMIT,
    "a replayed part fits in one frame even with every byte JSON-escaped"
);

/// The bounds an operator may change in `broca.jsonc` (`"limits": {"open_sessions": 2048}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sends durably queued behind one session's run; past it `session_queue_full`.
    pub queued_sends_per_session: usize,
    /// Sessions open at once in this process (an actor thread and a lease each); a request that
    /// would open one more is refused `too_many_sessions`. Idle sessions close after their TTL.
    pub open_sessions: usize,
    /// Subscriptions attached to one session; past it `too_many_subscribers`.
    pub subscribers_per_session: usize,
    /// Subscriptions attached in the whole process (a thread each); past it
    /// `too_many_subscribers`.
    pub subscribers_per_process: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            queued_sends_per_session: 256,
            open_sessions: DEFAULT_OPEN_SESSIONS,
            subscribers_per_session: 64,
            subscribers_per_process: 4096,
        }
    }
}

/// [`Limits::open_sessions`] when `broca.jsonc` does not say.
pub const DEFAULT_OPEN_SESSIONS: usize = 4096;

/// The largest value any limit may be set to (beyond it a limit is no bound).
const MAX_SETTING: u64 = 1 << 20;

impl Limits {
    /// The `limits` member of `broca.jsonc`: an object of positive integers, each at most
    /// 1,048,576; an unknown member, or any other value, refuses boot naming the member.
    pub fn parse(v: &Value) -> Result<Limits, (String, String)> {
        let Value::Object(map) = v else { return Err(("limits".into(), "must be an object".into())) };
        let mut limits = Limits::default();
        for (name, value) in map {
            let slot = match name.as_str() {
                "queued_sends_per_session" => &mut limits.queued_sends_per_session,
                "open_sessions" => &mut limits.open_sessions,
                "subscribers_per_session" => &mut limits.subscribers_per_session,
                "subscribers_per_process" => &mut limits.subscribers_per_process,
                _ => return Err((format!("limits.{name}"), "unknown limit".into())),
            };
            match value.as_u64() {
                Some(n) if (1..=MAX_SETTING).contains(&n) => *slot = n as usize,
                _ => return Err((format!("limits.{name}"), format!("must be an integer from 1 to {MAX_SETTING}"))),
            }
        }
        Ok(limits)
    }
}

/// The most sessions whose prompt-cache clock (`agent::cache_clock`) one process keeps; past it
/// the one that sent longest ago is forgotten (its head then has no `cache`, as after a restart).
pub const CACHE_CLOCKS: usize = 65_536;

/// The bytes the output-reference cache (`refs::cache`) keeps across every session: each
/// session's index (its part numbers' places and call keys, extended as it grows) and the sets
/// already derived with their snapshots. Past it the least recently read sessions are
/// forgotten (their next read scans their WAL once again); a session whose entry alone is over
/// it is not kept (every read of it derives from the whole session, as before the cache).
pub const OUTPUT_REF_CACHE_BYTES: usize = 64 << 20;
const _: () = assert!(
    OUTPUT_REF_CACHE_BYTES >= 2 * cortexkit_role_llm_runner::output_refs::MAX_SET_BYTES,
    "a set with its snapshots fits the output-reference cache"
);

/// The most `session.warm`s one process has in flight at once (one per session, each on its
/// own thread); one more is refused `too_many_requests` until one finishes.
pub const WARMS_IN_FLIGHT: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_are_positive_bounded_integers_and_known_by_name() {
        let l = Limits::parse(&json!({"open_sessions": 10, "subscribers_per_session": 2})).unwrap();
        assert_eq!((l.open_sessions, l.subscribers_per_session), (10, 2));
        assert_eq!(l.queued_sends_per_session, Limits::default().queued_sends_per_session);
        for bad in [
            json!({"open_sessions": 0}),
            json!({"open_sessions": -1}),
            json!({"open_sessions": 1.5}),
            json!({"open_sessions": "9"}),
            json!({"open_sessions": 2_000_000}),
        ] {
            assert_eq!(Limits::parse(&bad).unwrap_err().0, "limits.open_sessions", "{bad}");
        }
        assert_eq!(Limits::parse(&json!({"threads": 1})).unwrap_err().0, "limits.threads");
        assert_eq!(Limits::parse(&json!([1])).unwrap_err().0, "limits");
    }
}
