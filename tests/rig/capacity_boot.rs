//! Phase 3 of `capacity-bench`: a boot over a state root of [`BOOT_SESSIONS`] sessions.
//!
//! [`WORK_SESSIONS`] of them are made through the daemon with work waiting (a run held on the
//! provider and a send queued behind it). broca is then SIGKILLed; while the daemon's respawn
//! waits at the launcher (a hold file), the rest are written into the state root directly, as
//! broca records a finished turn (the library's lineage: `RunStarted`, `RunFinished`), so the
//! root holds exactly [`BOOT_SESSIONS`]. Creating thousands of sessions through a live module
//! measures admission, not boot. Once the hold is released (the clock starts):
//! `capacity.boot_register_ms` to broca registered with the daemon again,
//! `capacity.boot_recover_ms` to every held run sealed `interrupted` and every queued send run
//! to `completed`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broca::lineage::Shared;
use broca::message::Message;
use broca::record::FinishReason;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use serde_json::json;
use subc_client_rs::SubcConsumer;

use super::{call, each, held, quick, report, run_of, session_name, terminal, Failure, Harness, Tally};
use super::{HARNESS, SESSIONS};
use crate::support::send_params;

/// Sessions in the state root at boot, and those with work waiting.
pub const BOOT_SESSIONS: usize = 10_000;
pub const WORK_SESSIONS: usize = 100;

/// The launcher the daemon starts in broca's place: it waits while `$BROCA_BOOT_HOLD` exists,
/// then becomes broca (same pid, so the harness finds it).
pub fn write_launcher(dir: &Path, broca: &Path, hold: &Path) -> Result<PathBuf, Failure> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("capacity-launcher.sh");
    let script = format!(
        "#!/bin/sh\nwhile [ -e '{}' ]; do sleep 0.005; done\nexec '{}' \"$@\"\n",
        hold.display(),
        broca.display()
    );
    std::fs::write(&path, script).map_err(|e| format!("the launcher: {e}"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("the launcher: {e}"))?;
    Ok(path)
}

/// Phase 3 (see the module docs). `sessions_before` sessions exist already; `hold` is the
/// launcher's hold file.
pub fn boot<'a>(
    h: &Harness,
    conn: &(dyn Fn(usize) -> &'a SubcConsumer + Sync),
    t: &Tally,
    sessions_before: usize,
    hold: &Path,
) -> Result<(), Failure> {
    let boot_sessions =
        std::env::var("BROCA_CAPACITY_BOOT_SESSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(BOOT_SESSIONS);
    h.install(json!({"responses": vec![held(); WORK_SESSIONS]}));
    let work: Vec<(String, String, String)> = each(WORK_SESSIONS, |i| {
        let (name, c) = (session_name("work", i), conn(SESSIONS + i));
        let held = run_of(&h.block_on(call(c, t, &name, "session.send", send_params("held")))?)?;
        let queued = run_of(&h.block_on(call(c, t, &name, "session.send", send_params("queued")))?)?;
        Ok((name, held, queued))
    })?;
    // The held streams have started (each run is on the provider) before the kill.
    let until = Instant::now() + Duration::from_secs(30);
    while h.mock.pending("default") > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(hold, b"").map_err(|e| format!("the hold file: {e}"))?;
    let old = h.kill_broca();
    // broca is gone (its leases with it) and cannot come back while the hold file exists.
    while h.broca_pid() == Some(old) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let seeded = boot_sessions.saturating_sub(sessions_before + WORK_SESSIONS);
    let started = Instant::now();
    seed(&h.state_root(), seeded, &h.mock.base_url(None))?;
    eprintln!("capacity-bench: {seeded} sessions written into the state root in {:.1?}", started.elapsed());
    h.install(json!({"responses": vec![quick(); WORK_SESSIONS]}));
    let released = Instant::now();
    std::fs::remove_file(hold).map_err(|e| format!("the hold file: {e}"))?;
    h.wait_respawn(old);
    let registered = released.elapsed();
    each(WORK_SESSIONS, |i| {
        let (name, held, queued) = &work[i];
        let c = conn(SESSIONS + i);
        let sealed = h.block_on(terminal(c, t, name, held, Duration::from_secs(60)))?;
        let drained = h.block_on(terminal(c, t, name, queued, Duration::from_secs(60)))?;
        if sealed != "interrupted" || drained != "completed" {
            return Err(format!("{name}: held run {sealed}, queued run {drained}"));
        }
        Ok(())
    })?;
    let recovered = released.elapsed();
    report("capacity.boot_sessions", boot_sessions as f64, "sessions");
    report("capacity.boot_register_ms", registered.as_secs_f64() * 1e3, "ms");
    report("capacity.boot_recover_ms", recovered.as_secs_f64() * 1e3, "ms");
    Ok(())
}

/// The route of the bench's model at the mock's `base_url`, as admission resolves it.
fn mock_route(base_url: &str) -> Result<broca::provider::config::RenderConfig, Failure> {
    use broca::catalog::route::{self, ModelRequest, RouteOverrides};
    let lkg: serde_json::Value = serde_json::from_str(include_str!("../../testdata/catalog/fusiform-lkg.json"))
        .map_err(|e| format!("the LKG: {e}"))?;
    let catalog = broca::catalog::Catalog::from_response(&lkg["response"])?;
    let req = ModelRequest { model: "mock/echo-chat".into(), ..Default::default() };
    let overrides = RouteOverrides { base_url_override: Some(base_url.to_owned()), ..Default::default() };
    route::resolve(Ok(&catalog), PathBuf::new(), &req, &overrides).map_err(|e| format!("the route: {e:?}"))
}

/// Writes `n` sessions with one finished turn each into the state root at `root` (no broca
/// runs on it), under the project root the daemon's binds give the bench's sessions, on two
/// threads.
fn seed(root: &Path, n: usize, base_url: &str) -> Result<(), Failure> {
    let shared = Shared::open(StateRoot::at(root).map_err(|e| format!("the state root: {e}"))?)
        .map_err(|e| format!("the state root: {e}"))?;
    let project_root = match shared.store.sessions_with_work().map_err(|e| format!("the run index: {e}"))?.first() {
        Some(key) => key.project_root.clone(),
        None => return Err("no session with work in the run index to take the project root from".into()),
    };
    let config = mock_route(base_url)?;
    let write = |i: usize| -> Result<(), Failure> {
        let key = SessionKey::new(&project_root, HARNESS, &session_name("boot", i));
        let mut lineage = shared.open_lineage(&key).map_err(|e| format!("open {i}: {e}"))?;
        let run_id = format!("run-boot-{i}");
        broca::agent::admit(&mut lineage, &run_id, None, &config, Message::user_text("hello"), None, None)
            .map_err(|e| format!("admit {i}: {e}"))?;
        lineage.finish_run(&run_id, FinishReason::Completed, None, vec![]).map_err(|e| format!("finish {i}: {e}"))?;
        lineage.commit().map(drop).map_err(|e| format!("commit {i}: {e}"))
    };
    std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..2).map(|lane| scope.spawn(move || (lane..n).step_by(2).try_for_each(write))).collect();
        lanes.into_iter().try_for_each(|l| l.join().map_err(|_| "a seeding lane panicked".to_string())?)
    })?;
    shared.settle();
    Ok(())
}
