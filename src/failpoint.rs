//! Named fail points: places in production code where a crash campaign can make broca SIGKILL
//! itself, so a test can cut the process at exactly the moment an invariant is about
//! (DESIGN.md §2 rule 8, spec §13/§14): after a tool intent's fsync, after the call's request went
//! out, after its reply arrived but before its result is durable, and so on.
//!
//! A site is one line, `crate::failpoint!("tool.after_intent_fsync");`. Which points are armed is
//! read once, at the first hit, from the environment:
//!
//! ```text
//! BROCA_FAILPOINTS=name[,name…]   each entry one of:
//!   name        fire on the point's first hit
//!   name@N      fire on its N-th hit (N ≥ 1): later hits of a busy point
//!   name:P      fire on each hit with probability P (0 < P ≤ 1)
//! ```
//!
//! Firing writes one line `broca: failpoint <name> fired (hit <n>): SIGKILL` to stderr and then
//! `kill(getpid(), SIGKILL)`: no destructor, flush, fsync or goodbye runs, exactly as if the
//! machine's operator had killed the process there. A malformed entry is reported on stderr and
//! ignored (never a panic). Unknown names are accepted (a point a build does not have simply
//! never fires).
//!
//! Zero cost unless compiled in: the macro's body is `#[cfg(debug_assertions)]`, so a release
//! build contains no code, no load and no branch at any site, and no `BROCA_FAILPOINTS` switch
//! at all (the same rule as the other debug-only test switches, e.g. `BROCA_TEST_TOOL_WAIT_MS`).
//! In a debug build with the variable unset a hit is one `OnceLock` load and a `None` check.
//!
//! The points this build has (each a real site; `tests/crash_tools.rs` kills at the `tool.`, `step.`,
//! `run.`, `queue.` and `store.` ones, `tests/e2e_held.rs` at the `held.` ones):
//!
//! | name | site | the durable state when it fires |
//! |---|---|---|
//! | `tool.after_intent_fsync` | `agent::turn` `tool_batch` | the batch's intents durable, no request handed to the consumer |
//! | `tool.after_request_sent` | `subc::consumer::writer` | a request (or CANCEL) frame written to the daemon socket, no reply read |
//! | `tool.after_reply` | `agent::turn` `tool_batch` | a call's outcome back on the loop, its result not appended |
//! | `send.after_admitted` | `actor::decide` `send` | a send's `Queued` + `RunStarted` (its message, `send_id` and frozen plan) durable, no reply sent, no step started (the conformance suite's `crash_at_Admitted` and `crash_at_SendRecorded`) |
//! | `step.after_started` | `agent::turn` `run` | `StepStarted` durable, the model request not sent |
//! | `step.mid_stream` | `agent::turn` `attempt` | a model stream chunk received, the step not finished |
//! | `run.after_finished_before_index` | `agent::turn` `finish_with` | `RunFinished` durable, its run-index row only queued |
//! | `queue.between_queued_and_started` | `actor` `next_turn` | a `Queued` send durable and chosen, its `RunStarted` not written |
//! | `store.mid_checkpoint` | `store` `flush` | a run-index transaction holding the checkpoint row, not committed |
//! | `catalog.mid_lkg_write` | `catalog::lkg` `write_atomic_with` | the new LKG written to its temp file, not synced or renamed (killed in `tests/catalog_lkg_crash.rs`) |
//! | `held.after_register` | `held::puller` `register` | a batch's intents and its late-results registrations durable, no call sent |
//! | `held.after_record` | `agent::turn` `record_held` | a call's `tool_call_provider_held` durable, the run not yet paused |
//! | `held.before_deliver` | `actor::late` `deliver` | a late result taken from the provider, nothing of it written |
//! | `held.after_deliver` | `actor::late` `deliver` | the late result durable as the call's result, the entry not acked |
//! | `classify.after_record` | `classify::run` `record` | a classifier item's outcome (and its fact intent) durable in `system-one.db`, the next item not sent (killed in `tests/crash_classify.rs`) |
//! | `classify.before_publish` | `classify::run` `classify` | every outcome of the call durable, its facts not yet in `run-index.db`, no reply |
//! | `retention.after_tombstone` | `retention` `Expiry::settle` | an expired session's tombstone durable, its store rows and WAL not yet deleted (killed by the conformance suite's `crash_at_RetentionTombstoned`) |

/// The environment variable naming the armed points.
pub const ENV: &str = "BROCA_FAILPOINTS";

/// Whether this build honours [`ENV`] at all (debug builds only).
pub const COMPILED: bool = cfg!(debug_assertions);

/// A named fail point: SIGKILLs this process here when `BROCA_FAILPOINTS` arms `name` (debug
/// builds only; nothing at all in a release build). See [`crate::failpoint`].
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {{
        #[cfg(debug_assertions)]
        $crate::failpoint::hit($name);
    }};
}

/// When an armed point fires.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// On the point's N-th hit (1: the first).
    Nth(u64),
    /// On each hit with this probability, in (0, 1].
    Probability(f64),
}

/// One armed point.
#[derive(Clone, Debug, PartialEq)]
pub struct Armed {
    pub name: String,
    pub trigger: Trigger,
}

/// Parses a `BROCA_FAILPOINTS` value: the armed points, and one message per entry it ignored.
pub fn parse(spec: &str) -> (Vec<Armed>, Vec<String>) {
    let (mut armed, mut ignored) = (Vec::new(), Vec::new());
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let valid_name = |n: &str| {
            !n.is_empty() && n.len() <= 128 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        let parsed = if let Some((name, n)) = entry.split_once('@') {
            match n.parse::<u64>() {
                Ok(n) if n >= 1 && valid_name(name) => Some(Armed { name: name.into(), trigger: Trigger::Nth(n) }),
                _ => None,
            }
        } else if let Some((name, p)) = entry.split_once(':') {
            match p.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 1.0 && valid_name(name) => {
                    Some(Armed { name: name.into(), trigger: Trigger::Probability(p) })
                }
                _ => None,
            }
        } else if valid_name(entry) {
            Some(Armed { name: entry.into(), trigger: Trigger::Nth(1) })
        } else {
            None
        };
        match parsed {
            Some(a) => armed.push(a),
            None => {
                let shown: String = entry.chars().take(64).collect();
                ignored.push(format!(
                    "{ENV}: ignored {shown:?} (expected name, name@N with N >= 1, or name:P with 0 < P <= 1)"
                ));
            }
        }
    }
    (armed, ignored)
}

#[cfg(debug_assertions)]
pub use imp::hit;

#[cfg(debug_assertions)]
mod imp {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::{Armed, Trigger, ENV};

    struct Point {
        armed: Armed,
        hits: AtomicU64,
    }

    static POINTS: OnceLock<Option<Box<[Point]>>> = OnceLock::new();
    /// splitmix64 state for probabilistic points (seeded from the pid and the clock).
    static RNG: AtomicU64 = AtomicU64::new(0);

    fn load() -> Option<Box<[Point]>> {
        let spec = std::env::var(ENV).ok().filter(|s| !s.trim().is_empty())?;
        let (armed, ignored) = super::parse(&spec);
        let mut err = std::io::stderr().lock();
        for why in ignored {
            let _ = writeln!(err, "broca: {why}");
        }
        if armed.is_empty() {
            return None;
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        RNG.store((nanos as u64) ^ (u64::from(std::process::id()) << 32), Ordering::Relaxed);
        let names: Vec<&str> = armed.iter().map(|a| a.name.as_str()).collect();
        let _ = writeln!(err, "broca: fail points armed: {}", names.join(","));
        Some(armed.into_iter().map(|armed| Point { armed, hits: AtomicU64::new(0) }).collect())
    }

    fn random_unit() -> f64 {
        let mut z = RNG.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The macro's target: fires `name` if it is armed and its trigger says so.
    pub fn hit(name: &str) {
        let Some(points) = POINTS.get_or_init(load) else { return };
        for p in points.iter().filter(|p| p.armed.name == name) {
            let n = p.hits.fetch_add(1, Ordering::Relaxed) + 1;
            let fire = match p.armed.trigger {
                Trigger::Nth(at) => n == at,
                Trigger::Probability(prob) => random_unit() < prob,
            };
            if fire {
                kill(name, n);
            }
        }
    }

    fn kill(name: &str, n: u64) -> ! {
        let line = format!("broca: failpoint {name} fired (hit {n}): SIGKILL\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
        // SAFETY: kill(2) on this very process; SIGKILL cannot be caught, so nothing after
        // this line runs (POSIX delivers a signal sent to oneself before kill returns).
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::process::abort()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_by_their_form_and_bad_ones_are_ignored_by_name() {
        let (armed, ignored) = parse(" tool.after_reply, step.mid_stream@3 ,queue.x:0.25,,bad name,y@0,z:1.5,w:0");
        assert_eq!(
            armed,
            vec![
                Armed { name: "tool.after_reply".into(), trigger: Trigger::Nth(1) },
                Armed { name: "step.mid_stream".into(), trigger: Trigger::Nth(3) },
                Armed { name: "queue.x".into(), trigger: Trigger::Probability(0.25) },
            ]
        );
        assert_eq!(ignored.len(), 4, "{ignored:?}");
        assert!(ignored[0].contains("\"bad name\""), "{ignored:?}");
        assert_eq!(parse(""), (vec![], vec![]));
        let long = "x".repeat(10_000);
        let (armed, ignored) = parse(&long);
        assert!(armed.is_empty() && ignored[0].len() < 200, "a long entry is cut in the message");
    }
}
