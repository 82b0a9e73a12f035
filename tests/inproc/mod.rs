//! The in-process rig: the session ops on a real actor registry, a temp state root and
//! broca-mock as the provider (shared by the ops and driver tests).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mock::{MockServer, Script};
use broca::agent::{Cancel, LoopOptions, NoTools, ToolCall, ToolDispatcher, ToolOutcome, ToolOutput};
use broca::catalog::Catalog;
use broca::module::ModuleBuilder;
use broca::ops::Ops;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wire::Refusal;
use crossbeam_channel::bounded;
use serde_json::{json, Value};

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub mock: MockServer,
    pub ops: Arc<Ops>,
}

pub fn rig(idle_ttl: Duration) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0").unwrap();
    let ops = ops_over(dir.path(), mock.base_url(None), idle_ttl);
    Rig { dir, mock, ops }
}

/// Ops over the state root at `root` (a second one over the same root stands for a restarted
/// process once the first has let go of its leases).
pub fn ops_over(root: &Path, provider_base_url: String, idle_ttl: Duration) -> Arc<Ops> {
    ops_with(root, provider_base_url, idle_ttl, None)
}

/// [`ops_over`] with a boot readmission check.
pub fn ops_with(
    root: &Path,
    provider_base_url: String,
    idle_ttl: Duration,
    readmit: Option<broca::actor::Readmit>,
) -> Arc<Ops> {
    ops_on(root, provider_base_url, idle_ttl, readmit, Arc::new(broca::wal::FileStorage))
}

/// [`ops_with`] over another WAL storage (a `CrashStorage` for fault tests).
pub fn ops_on(
    root: &Path,
    provider_base_url: String,
    idle_ttl: Duration,
    readmit: Option<broca::actor::Readmit>,
    storage: Arc<dyn broca::wal::Storage>,
) -> Arc<Ops> {
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    ModuleBuilder::new(StateRoot::at(root).unwrap())
        .storage(storage)
        .catalog(Catalog::load_lkg(&lkg))
        .base_url_override(Some(provider_base_url))
        .idle_ttl(idle_ttl)
        .tools(Arc::new(TestTools))
        .loop_options(LoopOptions { tool_wait: Duration::from_secs(1), ..LoopOptions::default() })
        .readmit(readmit)
        .build()
        .unwrap()
        .ops
}

pub fn key() -> SessionKey {
    SessionKey::new("/tmp", "ops-test", "s1")
}

impl Rig {
    pub fn call(&self, method: &str, params: Value) -> Result<Value, Refusal> {
        let (tx, rx) = bounded(1);
        self.ops.handle(&key(), method, params, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).expect("an answer")
    }

    pub fn wait_state(&self, run_id: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.call("run.status", json!({"run_id": run_id})).unwrap();
            if status["state"] == want {
                return;
            }
            assert!(Instant::now() < deadline, "{run_id} never reached {want}: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn send(prompt: &str) -> Value {
    json!({"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}, "send_id": prompt})
}

pub fn reply_script(text: &str, delay_ms: u64) -> Value {
    json!({"events": [{"delay_ms": delay_ms}, {"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

impl Rig {
    pub fn script(&self, script: Value) {
        self.mock.install("default", Script::from_json(&script.to_string()).unwrap());
    }
}

/// The rig's tools: `slow` answers after 400 ms, `slower` after 1.5 s; any other name is
/// unknown (as with no tools). The rig waits 1 s for a call without a `reply` bound.
pub struct TestTools;

impl ToolDispatcher for TestTools {
    fn call(&self, call: &ToolCall, deadline: Instant, cancel: &Cancel) -> ToolOutcome {
        let sleep = match call.name.as_str() {
            "slow" => 400,
            "slower" => 1500,
            _ => return NoTools.call(call, deadline, cancel),
        };
        std::thread::sleep(Duration::from_millis(sleep));
        ToolOutcome::Completed(ToolOutput::text(format!("{} done", call.name)))
    }
}
