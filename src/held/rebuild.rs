//! Rebuilding a recreated `late-results.db` from the sessions (spec §19): off the startup path,
//! every session whose last run is unfinished is read to its durable end, and each call its
//! WAL shows held and unanswered is registered again. Until it completes no puller runs, so no
//! entry is delivered or acked against a partial intake. The rebuild marker stays set (spec:
//! this runtime cannot durably verify that the scan was complete).
//!
//! A state root that never registered a call has no marker and is never rebuilt: no WAL is read.

use crate::held::intake::{Intake, Registration};
use crate::lineage::Shared;

/// Whether the registered call still waits for a result in its session's WAL: its batch is open
/// and it has no result. `false` once it has one (or its session is gone): its registration
/// can go. `None` when the WAL cannot be read now.
pub fn still_waiting(shared: &Shared, reg: &Registration) -> Option<bool> {
    let page = crate::lineage::read::snapshot(shared, &reg.key).ok()?;
    let Some(page) = page else { return Some(false) };
    let open = page
        .state
        .last
        .as_ref()
        .is_some_and(|e| e.batch.iter().any(|c| c.call_key == reg.call_key && c.result.is_none()));
    Some(open)
}

/// Registers again every held, unanswered call of the unfinished sessions. Returns how many.
pub fn from_sessions(shared: &Shared, intake: &Intake) -> usize {
    let keys = match shared.store.unfinished_sessions() {
        Ok(k) => k,
        Err(e) => {
            log::warn!("held calls: the intake rebuild cannot list sessions: {e}");
            return 0;
        }
    };
    let mut registered = 0;
    for key in keys {
        let page = match crate::lineage::read::snapshot(shared, &key) {
            Ok(Some(page)) => page,
            Ok(None) => continue,
            Err(e) => {
                log::warn!("held calls: the intake rebuild skips session {}: {e}", key.addr());
                continue;
            }
        };
        let rows: Vec<Registration> = page
            .state
            .held_calls()
            .into_iter()
            .map(|h| Registration {
                call_key: h.call_key.clone(),
                key: key.clone(),
                run_id: h.run_id.clone(),
                tool_call_id: h.tool_call_id.clone(),
                module: h.provider.clone(),
            })
            .collect();
        registered += rows.len();
        if let Err(e) = intake.register(&rows, 0) {
            log::warn!("held calls: the intake rebuild cannot register session {}: {e}", key.addr());
        }
    }
    log::info!("held calls: the intake was rebuilt from the sessions ({registered} held call(s))");
    registered
}
