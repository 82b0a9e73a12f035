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

/// [`rig`] on `clock` (a `ManualClock` the test moves instead of waiting).
pub fn clocked_rig(idle_ttl: Duration, clock: broca::clock::SharedClock) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0").unwrap();
    let storage = Arc::new(broca::wal::FileStorage);
    let ops = builder(dir.path(), mock.base_url(None), idle_ttl, None, storage).clock(clock).build().unwrap().ops;
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
    builder(root, provider_base_url, idle_ttl, readmit, storage).build().unwrap().ops
}

fn builder(
    root: &Path,
    provider_base_url: String,
    idle_ttl: Duration,
    readmit: Option<broca::actor::Readmit>,
    storage: Arc<dyn broca::wal::Storage>,
) -> ModuleBuilder {
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    ModuleBuilder::new(StateRoot::at(root).unwrap())
        .storage(storage)
        .catalog(Catalog::load_lkg(&lkg))
        .base_url_override(Some(provider_base_url))
        .idle_ttl(idle_ttl)
        .tools(Arc::new(TestTools))
        .loop_options(LoopOptions { tool_wait: Duration::from_secs(1), ..LoopOptions::default() })
        .readmit(readmit)
}

pub fn key() -> SessionKey {
    SessionKey::new("/tmp", "ops-test", "s1")
}

impl Rig {
    pub fn call(&self, method: &str, params: Value) -> Result<Value, Refusal> {
        self.call_on(&key(), method, params)
    }

    /// [`Rig::call`] on another session.
    pub fn call_on(&self, key: &SessionKey, method: &str, params: Value) -> Result<Value, Refusal> {
        let (tx, rx) = bounded(1);
        self.ops.handle(key, method, params, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).expect("an answer")
    }

    /// What a refusal must leave as it was (issue #34): every file under the state root with
    /// its bytes (leases aside; the run index as its rows, not its pages), and what
    /// `session.read` and `session.head` answer on `key`. Settles the run-index writer first.
    pub fn footprint(&self, key: &SessionKey) -> Footprint {
        self.ops.registry.shared().settle();
        let mut files = std::collections::BTreeMap::new();
        collect_files(self.dir.path(), self.dir.path(), &mut files);
        Footprint {
            files,
            rows: run_index_rows(&self.dir.path().join("run-index.db")),
            read: self.call_on(key, "session.read", serde_json::json!({})).map_err(|r| r.to_json()),
            head: self.call_on(key, "session.head", serde_json::json!({})).map_err(|r| r.to_json()),
        }
    }

    /// Waits (10 s at most) until the provider has received `n` requests on the default lane.
    pub fn wait_requests(&self, n: usize) {
        wait_until(&format!("the provider gets request {n}"), || self.mock.requests("default").len() >= n);
    }

    /// Waits (10 s at most) until the session's actor has closed (its idle TTL passed).
    pub fn wait_closed(&self, key: &SessionKey) {
        wait_until("the idle actor closes", || !self.ops.registry.is_open(key));
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

/// Polls `done` until it holds, failing after 10 s with `what`.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
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

    /// Every record of the session's WAL, in order.
    pub fn records(&self) -> Vec<broca::record::Record> {
        let path = self.ops.registry.shared().wal_path(&key());
        let mut out = Vec::new();
        broca::wal::read(&path, broca::record::KNOWN_FEATURES, None, &mut |f: broca::wal::ScannedFrame<'_>| {
            out.push(broca::record::Record::decode(f.payload).unwrap());
            Ok::<(), broca::lineage::LineageError>(())
        })
        .unwrap();
        out
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

/// A state root's observable state (see [`Rig::footprint`]).
#[derive(Debug, PartialEq)]
pub struct Footprint {
    /// Relative path → bytes, for every file but the leases and the run index's own files.
    pub files: std::collections::BTreeMap<String, Vec<u8>>,
    /// Every row of every run-index table, as text, sorted.
    pub rows: Vec<String>,
    pub read: Result<Value, String>,
    pub head: Result<Value, String>,
}

impl Footprint {
    /// The first difference from `other`, in words.
    pub fn diff(&self, other: &Footprint) -> Option<String> {
        let names = |f: &Footprint| f.files.keys().cloned().collect::<Vec<_>>();
        if names(self) != names(other) {
            return Some(format!("files {:?} became {:?}", names(self), names(other)));
        }
        if let Some((name, _)) = self.files.iter().find(|(n, b)| other.files.get(*n) != Some(b)) {
            return Some(format!("{name} changed"));
        }
        if self.rows != other.rows {
            let gone: Vec<_> = self.rows.iter().filter(|r| !other.rows.contains(r)).collect();
            let new: Vec<_> = other.rows.iter().filter(|r| !self.rows.contains(r)).collect();
            return Some(format!("run-index rows changed: gone {gone:?}, new {new:?}"));
        }
        if self.read != other.read {
            return Some(format!("session.read answered {:?}, then {:?}", self.read, other.read));
        }
        (self.head != other.head).then(|| format!("session.head answered {:?}, then {:?}", self.head, other.head))
    }
}

fn collect_files(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if name == "leases" || name.starts_with("run-index.db") {
            continue;
        }
        if path.is_dir() {
            out.insert(format!("{name}/"), Vec::new());
            collect_files(root, &path, out);
        } else {
            out.insert(name, std::fs::read(&path).unwrap_or_default());
        }
    }
}

/// Every row of every table of the run index at `path`, rendered as text and sorted.
fn run_index_rows(path: &Path) -> Vec<String> {
    let Ok(conn) = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return Vec::new();
    };
    let mut tables = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").unwrap();
    let tables: Vec<String> = tables.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    let mut rows = Vec::new();
    for table in tables {
        let mut select = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let columns = select.column_count();
        let mut found = select.query([]).unwrap();
        while let Some(row) = found.next().unwrap() {
            let cells: Vec<String> = (0..columns)
                .map(|i| format!("{:?}", row.get_ref(i).ok().and_then(|v| rusqlite::types::Value::try_from(v).ok())))
                .collect();
            rows.push(format!("{table}: {}", cells.join(" | ")));
        }
    }
    rows.sort();
    rows
}
