//! `fanout.publish_ns.subsN`: what the lineage thread pays to publish one control unit into its
//! session's fan-out rings with N subscribers attached and draining, in CPU time of the
//! publishing thread (wall time is unstable on a shared 2-core machine). Units are published in
//! bursts, as a model stream's barriers come, so the readers keep up and sleep between bursts.

use crate::quick;
use std::sync::Arc;
use std::time::Duration;

use broca::agent::Output;
use broca::fanout::{From, Hub, SinkError, StreamSink};
use broca::lineage::projection::{ControlUnit, Cursor, Unit};
use broca::lineage::Shared;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use serde_json::Value;

fn bursts() -> u64 {
    quick::n(400, 10)
}
const BURST: u64 = 16;

/// A subscriber that reads everything and keeps nothing.
struct Discard;

impl StreamSink for Discard {
    fn frame(&mut self, _event: &Value) -> Result<(), SinkError> {
        Ok(())
    }
    fn end(&mut self, _error: Option<Refusal>) {}
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a local.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Nanoseconds of publishing-thread CPU per published unit with `subs` subscribers.
pub fn publish_ns(dir: &std::path::Path, subs: usize) -> f64 {
    let shared = Arc::new(Shared::open(StateRoot::at(&dir.join(format!("publish-{subs}"))).unwrap()).unwrap());
    let key = SessionKey::new("/bench", "bench", "publish");
    let hub = Hub::new();
    let mut publisher = hub.publisher(&key);
    let subs: Vec<_> = (0..subs).filter_map(|_| hub.attach(&shared, &key, From::Live, Discard)).collect();
    std::thread::sleep(Duration::from_millis(50));
    let mut spent = Duration::ZERO;
    for b in 0..bursts() {
        let units: Vec<ControlUnit> = (0..BURST)
            .map(|i| ControlUnit {
                cursor: Cursor { wal_seq: b * BURST + i + 1, sub_index: 0 },
                unit: Unit::StepStarted { run_id: "run-bench".into(), step: i },
                event: None,
            })
            .collect();
        let start = thread_cpu();
        for unit in units {
            publisher.publish(Output::Control(vec![unit]));
        }
        spent += thread_cpu() - start;
        std::thread::sleep(Duration::from_micros(500));
    }
    for s in subs {
        s.cancel();
    }
    spent.as_nanos() as f64 / (bursts() * BURST) as f64
}
