//! `change_host_metadata`: what the host may change about a session outside the role, none of
//! which reaches the model or the transcript. broca is its own host, so this is what its
//! operator (or its own recovery) does to a session's files and derived rows:
//!
//! 1. the instance is stopped cleanly (SIGTERM to its daemon, which stops broca);
//! 2. the session's WAL gets a write time an hour ahead (`session.head.updated_at` of a session
//!    without retention reads it);
//! 3. the session's run-index rows (its checkpoint, run rows, send ledger and materialized
//!    transcript) are dropped with broca's own `Store::forget_lineage`, so the next open
//!    rebuilds them from the WAL (docs/running.md: run-index.db is derived and rebuilt), and
//!    `run-index.db` gets a new write time too;
//! 4. the instance starts again on the same state root (a reopen: a new broca process).
//!
//! The session's `history_version` is read before and after: a change here that moved it would
//! let the suite's case pass without comparing the two reads, so the hook fails instead.

use std::time::{Duration, SystemTime};

use cortexkit_role_llm_runner_conformance::harness::HarnessError;
use cortexkit_role_llm_runner_conformance::{Reply, RunnerRoute};
use serde_json::{json, Value};
use subc_protocol::BindIdentity;

use crate::rig::{broca_root, Rig, OWNER};
use crate::route::Route;
use crate::subject::{Handle, Subject, HARNESS};

pub async fn change_metadata(subject: &Subject, handle: &Handle, session: &str) -> Result<(), HarnessError> {
    let instance = handle.instance();
    let route = Route { instance: instance.clone(), identity: BindIdentity::new(HARNESS, session), via: Some(OWNER) };
    let before = history_version(&route).await?;
    if let Some(mut rig) = instance.take_rig() {
        rig.stop();
    }
    let root = broca_root(&instance.root);
    let changed = rewrite(&root, session);
    // The instance starts again whatever the change did, so the suite's later cases have it.
    let rig = Rig::start(subject.rig_config(), &instance.root, None).await.map_err(HarnessError::new)?;
    instance.put_rig(rig);
    changed.map_err(HarnessError::new)?;
    let after = history_version(&route).await?;
    if after != before {
        return Err(HarnessError::new(format!(
            "the host-side change moved {session}'s history_version from {before} to {after}"
        )));
    }
    Ok(())
}

/// Steps 2 and 3, with no broca running on `root`.
fn rewrite(root: &std::path::Path, session: &str) -> Result<(), String> {
    let state = broca::state_root::StateRoot::at(root).map_err(|e| format!("the state root: {e:?}"))?;
    let key = broca::session_key::SessionKey::new("/", HARNESS, session);
    let ahead = SystemTime::now() + Duration::from_secs(3600);
    let touch = |path: &std::path::Path| {
        std::fs::File::options()
            .append(true)
            .open(path)
            .and_then(|file| file.set_modified(ahead))
            .map_err(|e| format!("moving {}'s write time: {e}", path.display()))
    };
    touch(&state.wal_path(&key))?;
    let index = state.run_index_path();
    let store = broca::store::Store::open(&index).map_err(|e| format!("opening {}: {e:?}", index.display()))?;
    store.forget_lineage(&key.addr()).map_err(|e| format!("dropping {session}'s run-index rows: {e:?}"))?;
    drop(store);
    touch(&index)
}

async fn history_version(route: &Route) -> Result<u64, HarnessError> {
    let head = match route.request("session.head", json!({})).await {
        Ok(Reply::Response(value)) => value,
        Ok(Reply::Error(error)) => return Err(HarnessError::new(format!("session.head was refused: {error:?}"))),
        Err(failure) => return Err(HarnessError::new(format!("session.head failed: {failure:?}"))),
    };
    head.get("history_version")
        .and_then(Value::as_u64)
        .ok_or_else(|| HarnessError::new(format!("session.head has no history_version: {head}")))
}
