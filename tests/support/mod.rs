//! A reusable real-daemon harness: the subc daemon (the `subc-daemon` library) booted in this
//! process, supervising the real `broca` binary with a [`MockServer`] as its model provider, and
//! called through the official consumer SDK (`subc-client-rs`).
//!
//! ```ignore
//! use broca_mock::mock; // broca-mock's model providers, which this harness uses as `crate::mock`
//! mod support;
//! use support::Harness;
//!
//! let h = Harness::start();
//! let s = h.session("my-harness", "s1", None);
//! let reply = s.call("session.send", support::send_params("hello")).unwrap();
//! s.wait_run(reply["run_id"].as_str().unwrap(), "completed");
//! h.stop();
//! ```
//!
//! Stopping the in-process daemon means SIGTERM to this process (its tokio handler runs the
//! shutdown sequence of `subc-wire.md` §16), so a test binary boots one harness, in one test
//! fn, and calls [`Harness::stop`] at its end. Every wait is bounded ([`STEP`]); failures panic.
//!
//! Project roots: the SDK's `BindIdentity` carries no project root, and `route.bind` gets `/`
//! unless the opener sends the legacy `identity.project_root` (or opens under a scope with a
//! `workdir`, which needs a scope-owning module). A session with `Some(root)` therefore goes
//! through its own consumer connection whose bytes pass a loopback relay that adds
//! `identity.project_root` to every `route.open` it forwards (the handshake and every other
//! frame pass unchanged); the daemon canonicalizes that root and binds broca with it.
//!
//! Also used by the `send-bench` and `fanout-bench` examples (`#[path]`), with their own [`Options`].
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mock::{MockServer, Script};
use broca::session_key::SessionKey;
use broca::subc::frame;
use serde_json::{json, Value};
use subc_client_rs::{
    CallError, CallOptions, CatalogEntry, ConsumerOptions, SubcConsumer, SubscribeOptions, Subscription,
    SubscriptionEnd,
};
use subc_daemon::bootstrap::{run_with_config, BootstrapConfig, BootstrapError};
use subc_protocol::{BindIdentity, ErrorBody, FrameType, RouteTarget};
use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

pub const MODULE_ID: &str = "broca";
/// The longest wait for any one thing (a stream event, a state, a registration).
pub const STEP: Duration = Duration::from_secs(15);
/// The deadline of one unary call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `session.send` params on the mock model (`mock/echo-chat`).
pub fn send_params(prompt: &str) -> Value {
    json!({"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}})
}

/// The `[cursor, unit]` pairs of the control frames among subscription events.
pub fn control(events: &[Value]) -> Vec<Value> {
    events.iter().filter(|e| e["kind"] == "control").map(|e| json!([e["cursor"], e["unit"]])).collect()
}

pub fn target() -> RouteTarget {
    RouteTarget::ManagementSurface { module_id: MODULE_ID.into() }
}

pub fn consumer_options() -> ConsumerOptions {
    ConsumerOptions { handshake_timeout: Duration::from_secs(2), call_timeout: CALL_TIMEOUT, ..Default::default() }
}

/// `method` on `s` through the relay module `relay` (a `broca-mock relay` the daemon launched),
/// so under the principal `reserved:<relay>`: the `result`, or the refusal as `(code, body)`.
pub fn relay_call(
    h: &Harness,
    relay: &str,
    s: &Session,
    method: &str,
    params: Value,
) -> Result<Value, (String, Value)> {
    let body = json!({"method": method, "params": params}).to_string().into_bytes();
    let target = RouteTarget::ManagementSurface { module_id: relay.into() };
    match h.block_on(h.client().consumer().call(target, s.identity(), body, call_options())) {
        Ok(bytes) => Ok(serde_json::from_slice::<Value>(&bytes).expect("a JSON reply")["result"].clone()),
        Err(CallError::Module(e)) => Err((e.code.clone(), serde_json::to_value(&e).unwrap())),
        Err(e) => panic!("{method} through {relay}: {e:?}"),
    }
}

/// [`relay_call`] that must be answered.
pub fn relay_ok(h: &Harness, relay: &str, s: &Session, method: &str, params: Value) -> Value {
    relay_call(h, relay, s, method, params)
        .unwrap_or_else(|(code, body)| panic!("{relay} {method} refused {code}: {body}"))
}

pub fn call_options() -> CallOptions {
    CallOptions { timeout: CALL_TIMEOUT, ..Default::default() }
}

/// How to boot a [`Harness`].
#[derive(Clone, Debug)]
pub struct Options {
    /// The broca binary the daemon supervises (default: the test's `CARGO_BIN_EXE_broca`).
    pub broca: PathBuf,
    /// broca's `CK_LOG`.
    pub ck_log: String,
    /// Where the private rig directory is created (keep it short: the daemon puts sockets there).
    pub base_dir: PathBuf,
    /// Extra environment for broca.
    pub env: Vec<(String, String)>,
    /// Tracing output (the daemon's) through libtest's capture (true) or to stderr (false).
    pub test_writer: bool,
    /// The rig directory's name prefix.
    pub prefix: String,
    /// broca's `restart` policy in the daemon's module table (`{max_restarts, window_secs,
    /// backoff_ms, max_backoff_ms}`); `None`: the daemon's default (3 crash restarts per 10 min,
    /// backoff 100 ms ×10 each time).
    pub restart: Option<Value>,
    /// More modules in the daemon's table, by id (e.g. broca-mock as a tool provider).
    pub modules: Vec<(String, Value)>,
    /// A program the daemon starts in broca's place (same args and env), e.g. a script that
    /// sets per-incarnation environment; it must `exec` broca, so [`Harness::broca_pid`] (which
    /// looks for the broca binary) finds the process. `None`: broca itself.
    pub launcher: Option<PathBuf>,
    /// Seed `catalog/fusiform-lkg.json` in the state root (false: a fresh root with no catalog).
    pub seed_lkg: bool,
    /// broca's `broca.jsonc` (written into the state root before broca starts), if any.
    pub broca_jsonc: Option<Value>,
    /// More top-level members of the daemon's `subc.jsonc` (e.g. `scope_authority_owners`).
    pub daemon: Vec<(String, Value)>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            broca: option_env!("CARGO_BIN_EXE_broca").map(PathBuf::from).unwrap_or_default(),
            ck_log: "info,broca.requests=debug".into(),
            base_dir: PathBuf::from("/tmp"),
            env: Vec::new(),
            test_writer: true,
            prefix: "bsm".into(),
            restart: None,
            modules: Vec::new(),
            launcher: None,
            seed_lkg: true,
            broca_jsonc: None,
            daemon: Vec::new(),
        }
    }
}

/// For benches: `BROCA_BENCH_BROCA`, or `broca` in the parent of this executable's directory
/// (`target/release/examples/x` → `target/release/broca`), canonicalized.
pub fn bench_broca_binary() -> Result<PathBuf, String> {
    let path = match std::env::var_os("BROCA_BENCH_BROCA").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
            let dir =
                exe.parent().and_then(Path::parent).ok_or_else(|| format!("{} has no grandparent", exe.display()))?;
            dir.join("broca")
        }
    };
    if path.is_file() {
        fs::canonicalize(&path).map_err(|e| format!("{}: {e}", path.display()))
    } else {
        Err(format!(
            "the broca binary {} does not exist (run `cargo build --release --bins` or set BROCA_BENCH_BROCA)",
            path.display()
        ))
    }
}

/// The daemon, broca, the mock and a consumer connection. See the module docs.
pub struct Harness {
    /// broca's model provider: `h.mock.install("default", script)`.
    pub mock: MockServer,
    root: PathBuf,
    broca: PathBuf,
    client: Option<Client>,
    /// One relayed connection per project root, opened on first use.
    rooted: Mutex<HashMap<String, Client>>,
    daemon: Mutex<Option<JoinHandle<Result<(), BootstrapError>>>>,
    stopped: AtomicBool,
    next_id: AtomicU64,
    rt: Option<Runtime>,
    daemon_rt: Option<Runtime>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// Boots with [`Options::default`]; returns once broca is registered and ready.
    pub fn start() -> Harness {
        Harness::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> Harness {
        // Test clients must open routes as plain direct callers (subc-wire.md §20.4). Nothing
        // else runs in this process yet, so changing the environment is safe here.
        for var in ["SUBC_MODULE_ID", "SUBC_LAUNCH_NONCE", "SUBC_LAUNCH_NONCE_FD"] {
            std::env::remove_var(var);
        }
        let filter = || tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
        let _ = if opts.test_writer {
            tracing_subscriber::fmt().with_env_filter(filter()).with_test_writer().try_init()
        } else {
            tracing_subscriber::fmt().with_env_filter(filter()).with_ansi(false).with_writer(io::stderr).try_init()
        };
        assert!(opts.broca.is_file(), "the broca binary {:?} does not exist", opts.broca);
        let broca = fs::canonicalize(&opts.broca).unwrap();
        let mock = MockServer::start("127.0.0.1:0").expect("the mock provider starts");
        let dir = tempfile::Builder::new().prefix(&opts.prefix).tempdir_in(&opts.base_dir).unwrap();
        let root = dir.path().to_path_buf();
        for sub in ["config", "config/cortexkit", "runtime", "run", "run/logs", "state", "state/catalog", "projects"] {
            fs::DirBuilder::new().mode(0o700).create(root.join(sub)).unwrap();
        }
        let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        if opts.seed_lkg {
            // Written "now", so broca's catalog poller finds it fresh and does not poll a fusiform
            // this rig does not run (it still polls every 30 minutes).
            let mut seeded: Value = serde_json::from_slice(&fs::read(lkg).unwrap()).unwrap();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
            seeded["written_at_ms"] = json!(now);
            fs::write(root.join("state/catalog/fusiform-lkg.json"), serde_json::to_vec_pretty(&seeded).unwrap())
                .unwrap();
        }
        if let Some(config) = &opts.broca_jsonc {
            // `{mock}` stands for the mock provider's root URL (known only now).
            fs::write(root.join("state/broca.jsonc"), config.to_string().replace("{mock}", &mock.url())).unwrap();
        }
        let mut env = json!({
            "CK_LOG": opts.ck_log,
            "BROCA_STATE_ROOT": root.join("state"),
            "BROCA_PROVIDER_BASE_URL": mock.base_url(None)
        });
        for (k, v) in &opts.env {
            env[k] = json!(v);
        }
        let program = opts.launcher.as_ref().map_or_else(|| broca.clone(), |l| fs::canonicalize(l).unwrap());
        let mut module = json!({"program": program, "args": [], "env": env, "enabled": true, "reserved": true});
        if let Some(restart) = &opts.restart {
            module["restart"] = restart.clone();
        }
        let mut modules = json!({MODULE_ID: module});
        for (id, extra) in &opts.modules {
            modules[id] = extra.clone();
        }
        let mut config = json!({"version": 1, "modules": modules});
        for (key, value) in &opts.daemon {
            config[key] = value.clone();
        }
        fs::write(root.join("config/cortexkit/subc.jsonc"), config.to_string()).unwrap();
        let conn_file = root.join("runtime/subc-connection.json");
        let daemon_config = BootstrapConfig::new(conn_file.clone(), 0)
            .with_daemon_config_path(root.join("config/cortexkit/subc.jsonc"))
            .unwrap()
            .with_capture_logs_dir(root.join("run/logs"))
            .with_terminal_journal_path(root.join("run/terminals.jsonl"));
        let runtime = |name: &str| {
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(name).enable_all().build()
        };
        let daemon_rt = runtime("subc-daemon").unwrap();
        let rt = runtime("harness-client").unwrap();
        let daemon = daemon_rt.spawn(run_with_config(daemon_config));
        let mut h = Harness {
            mock,
            root,
            broca,
            client: None,
            rooted: Mutex::new(HashMap::new()),
            daemon: Mutex::new(Some(daemon)),
            stopped: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            rt: Some(rt),
            daemon_rt: Some(daemon_rt),
            _dir: dir,
        };
        let until = Instant::now() + STEP;
        while !conn_file.exists() {
            assert!(Instant::now() < until, "{} did not appear within {STEP:?}", conn_file.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        h.client = Some(h.connect());
        h.wait_registered();
        h
    }

    // ---- paths and files

    /// The private rig directory (`config/`, `runtime/`, `run/`, `state/`, `projects/`).
    pub fn rig_root(&self) -> &Path {
        &self.root
    }

    /// broca's state root (`BROCA_STATE_ROOT`).
    pub fn state_root(&self) -> PathBuf {
        self.root.join("state")
    }

    pub fn connection_file(&self) -> PathBuf {
        self.root.join("runtime/subc-connection.json")
    }

    pub fn journal_path(&self) -> PathBuf {
        self.root.join("run/terminals.jsonl")
    }

    /// The daemon's journal of module exits, one JSON object per line.
    pub fn journal(&self) -> Vec<Value> {
        let text = fs::read_to_string(self.journal_path()).unwrap_or_default();
        text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    /// The last journaled exit of broca (an entry with an `exit_code`).
    pub fn last_exit(&self) -> Option<Value> {
        self.journal().into_iter().rev().find(|e| e["module_id"] == MODULE_ID && e.get("exit_code").is_some())
    }

    /// broca's captured stderr (every incarnation).
    pub fn broca_log(&self) -> String {
        fs::read_to_string(self.root.join("run/logs/broca.stderr.log")).unwrap_or_default()
    }

    pub fn broca_log_tail(&self, lines: usize) -> String {
        let log = self.broca_log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A fresh directory `<rig>/projects/<name>` (canonical path), to use as a project root.
    pub fn project_dir(&self, name: &str) -> PathBuf {
        let dir = self.root.join("projects").join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::canonicalize(dir).unwrap()
    }

    /// `prefix-<n>`, unique within this harness.
    pub fn unique(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    // ---- runtime, mock

    /// The client runtime (the SDK's tasks run there).
    pub fn rt(&self) -> &Handle {
        self.rt.as_ref().expect("the harness runtime").handle()
    }

    /// Runs `f` on the client runtime. Not from inside another `block_on`.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt().block_on(f)
    }

    /// Appends a script (JSON, see `mock/model/src/lib.rs`) to the mock's `default` lane FIFO.
    pub fn install(&self, script: Value) {
        self.mock.install("default", Script::from_json(&script.to_string()).expect("a valid mock script"));
    }

    /// Clears the mock's `default` lane (what earlier scenarios left queued or recorded, and the
    /// provider cache it models), then installs `script`.
    pub fn install_alone(&self, script: Value) {
        self.mock.reset("default");
        self.install(script);
    }

    // ---- connections and sessions

    /// The first consumer connection (direct to the daemon; sessions on it bind root `/`).
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the harness client")
    }

    /// Another consumer connection, direct to the daemon.
    pub fn connect(&self) -> Client {
        let consumer = self.connect_consumer(&self.connection_file());
        Client::new(consumer, self.rt().clone(), None, self.state_root(), None)
    }

    /// Another consumer connection whose routes bind `root` as their project root (through a
    /// relay that adds `identity.project_root` to each `route.open`).
    pub fn connect_rooted(&self, root: &Path) -> Client {
        assert!(root.is_absolute(), "a project root is an absolute path: {}", root.display());
        let info: Value = serde_json::from_slice(&fs::read(self.connection_file()).unwrap()).unwrap();
        let endpoint = &info["endpoints"][0];
        let host = endpoint["host"].as_str().unwrap().trim_start_matches('[').trim_end_matches(']');
        let port = endpoint["port"].as_u64().unwrap() as u16;
        let upstream = (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()).expect("the daemon's endpoint");
        let root_text = root.to_str().expect("a UTF-8 project root").to_owned();
        let proxy = Proxy::start(upstream, root_text).unwrap();
        // A private copy of the connection file naming the relay's port.
        let dir = self.root.join("runtime").join(format!("relay-{}", proxy.addr.port()));
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let mut relayed = info.clone();
        relayed["endpoints"] = json!([{"host": "127.0.0.1", "port": proxy.addr.port()}]);
        if let Some(obj) = relayed.as_object_mut() {
            obj.remove("local_endpoint");
        }
        let file = dir.join("subc-connection.json");
        let mut f = fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(&file).unwrap();
        f.write_all(relayed.to_string().as_bytes()).unwrap();
        drop(f);
        let consumer = self.connect_consumer(&file);
        Client::new(consumer, self.rt().clone(), Some(canonical_root(root)), self.state_root(), Some(proxy))
    }

    fn connect_consumer(&self, conn_file: &Path) -> SubcConsumer {
        let until = Instant::now() + STEP;
        loop {
            match self.block_on(SubcConsumer::connect(conn_file, consumer_options())) {
                Ok(c) => return c,
                Err(e) => {
                    assert!(Instant::now() < until, "cannot connect through {}: {e}", conn_file.display());
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A session route `{harness, session}`: on the first connection when `project_root` is
    /// `None` (broca sees root `/`), else on the relayed connection of that root (shared by
    /// every session of that root).
    pub fn session(&self, harness: &str, session: &str, project_root: Option<&Path>) -> Session {
        match project_root {
            None => self.client().session(harness, session),
            Some(root) => {
                let key = root.to_str().expect("a UTF-8 project root").to_owned();
                let client = self.rooted.lock().unwrap().get(&key).cloned();
                let client = client.unwrap_or_else(|| {
                    let c = self.connect_rooted(root);
                    self.rooted.lock().unwrap().entry(key).or_insert(c).clone()
                });
                client.session(harness, session)
            }
        }
    }

    // ---- broca, the daemon

    /// broca's catalog entry once it is registered and ready (waits at most [`STEP`]).
    pub fn wait_registered(&self) -> CatalogEntry {
        let consumer = self.client().consumer();
        let until = Instant::now() + STEP;
        loop {
            if let Ok(list) = self.block_on(consumer.catalog_list()) {
                if let Some(entry) = list.modules.into_iter().find(|m| m.module_id == MODULE_ID && m.ready) {
                    return entry;
                }
            }
            assert!(Instant::now() < until, "broca did not register within {STEP:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid of the broca process this harness's daemon supervises: a child of this process
    /// running the broca binary on this harness's state root (so a second harness in the same
    /// process never finds, or kills, the other's broca).
    pub fn broca_pid(&self) -> Option<i32> {
        let me = std::process::id() as i32;
        let root = format!("BROCA_STATE_ROOT={}", self.state_root().display());
        fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            if fs::read_link(e.path().join("exe")).ok()? != self.broca {
                return None;
            }
            let environ = fs::read(e.path().join("environ")).ok()?;
            if !environ.split(|b| *b == 0).any(|var| var == root.as_bytes()) {
                return None;
            }
            // `pid (comm) state ppid ...`; comm may hold spaces, so parse after the last ')'.
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid: i32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == me).then_some(pid)
        })
    }

    /// SIGKILLs broca; returns the pid killed. See [`Harness::wait_respawn`].
    pub fn kill_broca(&self) -> i32 {
        let pid = self.broca_pid().expect("broca's pid");
        // SAFETY: killing the module process the daemon started for this harness.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        pid
    }

    /// Waits until broca runs again under another pid than `old`, is registered and answers a
    /// call (`role.describe` on a probe route: the catalog can read ready a moment before a
    /// call reaches the new incarnation); its pid.
    pub fn wait_respawn(&self, old: i32) -> i32 {
        let until = Instant::now() + STEP;
        let pid = loop {
            match self.broca_pid() {
                Some(p) if p != old => break p,
                _ => assert!(Instant::now() < until, "broca was not respawned within {STEP:?}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.wait_registered();
        let probe = self.client().session("harness-probe", "respawn");
        loop {
            match probe.try_call("role.describe", json!({})) {
                Ok(_) | Err(CallError::Module(_)) => break,
                Err(e) => assert!(Instant::now() < until, "broca {pid} never answered after its respawn: {e:?}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        pid
    }

    /// SIGTERM to this process: the daemon drains, says GOODBYE to broca, waits for it and
    /// returns. Panics unless the daemon stops cleanly within 40 s. Call it once, last (the
    /// journal, logs and state root stay readable until the harness drops).
    pub fn stop(&self) {
        let daemon = self.daemon.lock().unwrap().take().expect("the daemon was already stopped");
        let daemon_rt = self.daemon_rt.as_ref().expect("the daemon runtime");
        if daemon.is_finished() {
            // Its signal handler may be gone: do not signal a process that would die of it.
            panic!("the daemon had stopped before the end: {:?}", daemon_rt.block_on(daemon));
        }
        // SAFETY: kill(2) on our own pid; the daemon's SIGTERM handler is installed by now.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
        let stopped = daemon_rt.block_on(async { tokio::time::timeout(Duration::from_secs(40), daemon).await });
        let result = stopped.expect("the daemon stopped within 40 s").expect("the daemon task did not panic");
        assert!(result.is_ok(), "daemon: {result:?}");
        self.stopped.store(true, Ordering::SeqCst);
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if !self.stopped.load(Ordering::SeqCst) {
            if std::thread::panicking() {
                eprintln!("harness: broca's log (tail):\n{}", self.broca_log_tail(40));
            }
            // Not stopped (a failure): do not leave the supervised broca running.
            if let Some(pid) = self.broca_pid() {
                // SAFETY: the module process the daemon started for this harness.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        self.client = None;
        self.rooted.lock().unwrap_or_else(|e| e.into_inner()).clear();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        if let Some(rt) = self.daemon_rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// The root as the daemon canonicalizes it: the longest existing ancestor resolved, the
/// missing tail appended.
pub fn canonical_root(path: &Path) -> String {
    let mut existing = path.to_path_buf();
    let mut tail = Vec::new();
    let resolved = loop {
        if let Ok(real) = fs::canonicalize(&existing) {
            break real;
        }
        match (existing.file_name().map(|n| n.to_owned()), existing.parent().map(Path::to_path_buf)) {
            (Some(name), Some(parent)) => {
                tail.push(name);
                existing = parent;
            }
            _ => break existing,
        }
    };
    let full = tail.into_iter().rev().fold(resolved, |acc, name| acc.join(name));
    full.to_str().expect("a UTF-8 project root").to_owned()
}

/// One consumer connection (cheap to clone), with the project root its routes bind.
#[derive(Clone)]
pub struct Client {
    conn: Arc<Conn>,
}

struct Conn {
    consumer: SubcConsumer,
    rt: Handle,
    root: Option<String>,
    state_root: PathBuf,
    // After `consumer`: the relay outlives the connection through it.
    _proxy: Option<Proxy>,
}

impl Client {
    fn new(
        consumer: SubcConsumer,
        rt: Handle,
        root: Option<String>,
        state_root: PathBuf,
        proxy: Option<Proxy>,
    ) -> Client {
        Client { conn: Arc::new(Conn { consumer, rt, root, state_root, _proxy: proxy }) }
    }

    /// The SDK connection, for anything the helpers do not cover (run it with [`Client::block_on`]).
    pub fn consumer(&self) -> &SubcConsumer {
        &self.conn.consumer
    }

    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.conn.rt.block_on(f)
    }

    /// The project root broca binds for routes of this connection (canonical; `/` when direct).
    pub fn project_root(&self) -> &str {
        self.conn.root.as_deref().unwrap_or("/")
    }

    /// A session route on this connection.
    pub fn session(&self, harness: &str, session: &str) -> Session {
        Session { client: self.clone(), harness: harness.into(), id: session.into() }
    }
}

/// One session (`{project_root, harness, session}`) on one connection.
#[derive(Clone)]
pub struct Session {
    client: Client,
    pub harness: String,
    pub id: String,
}

impl Session {
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn identity(&self) -> BindIdentity {
        BindIdentity::new(self.harness.clone(), self.id.clone())
    }

    pub fn project_root(&self) -> &str {
        self.client.project_root()
    }

    pub fn key(&self) -> SessionKey {
        SessionKey::new(self.project_root(), &self.harness, &self.id)
    }

    /// `<state root>/wal/<addr>.wal`.
    pub fn wal_path(&self) -> PathBuf {
        broca::state_root::StateRoot::at(&self.client.conn.state_root).unwrap().wal_path(&self.key())
    }

    /// A raw request body on this route: the reply bytes, or the SDK's error.
    pub fn call_raw(&self, body: Vec<u8>) -> Result<Vec<u8>, CallError> {
        self.client.block_on(self.client.consumer().call(target(), self.identity(), body, call_options()))
    }

    /// `{method, params}`: the reply's `result`, or any SDK error (e.g. while broca restarts).
    pub fn try_call(&self, method: &str, params: Value) -> Result<Value, CallError> {
        let body = json!({"method": method, "params": params}).to_string().into_bytes();
        let reply = self.call_raw(body)?;
        let v: Value = serde_json::from_slice(&reply).expect("a JSON reply");
        Ok(v["result"].clone())
    }

    /// `{method, params}`: the `result`, or the module's refusal as `(code, full error body)`.
    /// Panics on anything else (a transport failure, a timeout).
    pub fn call(&self, method: &str, params: Value) -> Result<Value, (String, Value)> {
        match self.try_call(method, params) {
            Ok(v) => Ok(v),
            Err(CallError::Module(body)) => Err((body.code.clone(), error_json(&body))),
            Err(other) => panic!("{method} on {}/{}: {other:?}", self.harness, self.id),
        }
    }

    /// The `result`; panics on a refusal.
    pub fn ok(&self, method: &str, params: Value) -> Value {
        self.call(method, params).unwrap_or_else(|(code, body)| panic!("{method} was refused {code}: {body}"))
    }

    /// The refusal `(code, full error body)`; panics on success.
    pub fn refused(&self, method: &str, params: Value) -> (String, Value) {
        match self.call(method, params) {
            Ok(v) => panic!("{method} succeeded, expected a refusal: {v}"),
            Err(e) => e,
        }
    }

    /// `session.send {params}` (which must carry a `send_id`) while broca may be SIGKILLed at
    /// any moment: the send's answer, as broca recorded it. Use it for every send of a test
    /// that kills broca (fail points, random kills, restarts) while it sends. Panics where
    /// [`Session::try_send_surviving_kills`] gives up (within [`KILL_DEADLINE`]).
    pub fn send_surviving_kills(&self, params: Value) -> Value {
        let send_id = params["send_id"].clone();
        self.try_send_surviving_kills(&params, KILL_DEADLINE)
            .map(|(answer, _)| answer)
            .unwrap_or_else(|why| panic!("session.send {send_id} on {}/{}: {why}", self.harness, self.id))
    }

    /// The one way a test sends while broca may die: `session.send {params}` (with a
    /// `send_id`) until its fate is known. `Ok((answer, attempts))`, `attempts` counting the
    /// `session.send` calls made; `Err` on a refusal that is not about a restart, or no answer
    /// within `deadline`.
    ///
    /// Why not [`Session::call`] in a retry loop: a send racing a kill has an unknown outcome
    /// (the route closed under it, `OutcomeUnknown`, a deadline): broca may or may not have
    /// recorded it before it died, and `call` panics on those anyway. Only the same `send_id`
    /// and `send.status` can tell; a retry under a new send_id could run the work twice. So:
    /// an answer is returned; a refusal about the restart ([`restart_refusal`]) is sent again;
    /// after a transport error, `send.status {send_id}` decides: recorded, its answer (what an
    /// identical re-send would get, spec §4); `unknown_send`, the same params are sent again.
    pub fn try_send_surviving_kills(&self, params: &Value, deadline: Duration) -> Result<(Value, u32), String> {
        let send_id = params["send_id"].clone();
        assert!(send_id.is_string(), "a send that may race a kill needs a send_id: {params}");
        let until = Instant::now() + deadline;
        let mut attempts = 0;
        let mut last = String::new();
        // Whether a send may have reached broca without an answer (then send.status decides).
        let mut unsure = false;
        loop {
            if unsure {
                match self.try_call("send.status", json!({"send_id": send_id})) {
                    Ok(answer) => return Ok((answer, attempts)),
                    Err(CallError::Module(body)) if body.code == "unknown_send" => unsure = false,
                    Err(CallError::Module(body)) if restart_refusal(&body) => last = format!("send.status: {body:?}"),
                    Err(CallError::Module(body)) => return Err(format!("send.status was refused: {body:?}")),
                    Err(other) => last = format!("send.status: {other:?}"),
                }
            }
            if !unsure {
                attempts += 1;
                match self.try_call("session.send", params.clone()) {
                    Ok(answer) => return Ok((answer, attempts)),
                    Err(CallError::Module(body)) if restart_refusal(&body) => last = format!("session.send: {body:?}"),
                    Err(CallError::Module(body)) => {
                        return Err(format!("session.send refused {}: {}", body.code, body.message))
                    }
                    Err(other) => {
                        last = format!("session.send: {other:?}");
                        unsure = true;
                    }
                }
            }
            if Instant::now() >= until {
                return Err(format!("no answer within {deadline:?} ({attempts} sends; last: {last})"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `session.send` of `prompt` on the mock model: the result.
    pub fn send(&self, prompt: &str) -> Value {
        self.ok("session.send", send_params(prompt))
    }

    pub fn run_status(&self, run_id: &str) -> Value {
        self.ok("run.status", json!({"run_id": run_id}))
    }

    /// Polls `run.status` until its `state` is `state` (at most [`STEP`]); the last status.
    pub fn wait_run(&self, run_id: &str, state: &str) -> Value {
        let until = Instant::now() + STEP;
        loop {
            let status = self.run_status(run_id);
            if status["state"] == state {
                return status;
            }
            assert!(Instant::now() < until, "run {run_id} did not reach {state} within {STEP:?}: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `session.subscribe {from}` with a roomy event buffer (the SDK drops a subscription whose
    /// caller lets it fill).
    pub fn subscribe(&self, from: Value) -> Sub {
        let opts = SubscribeOptions { event_buffer: 100_000, ..SubscribeOptions::default() };
        self.subscribe_with(json!({"from": from}), opts)
    }

    pub fn subscribe_with(&self, params: Value, opts: SubscribeOptions) -> Sub {
        self.try_subscribe_with(params, opts).expect("session.subscribe")
    }

    /// [`Session::subscribe_with`], or the SDK's error (e.g. while broca restarts).
    pub fn try_subscribe_with(&self, params: Value, opts: SubscribeOptions) -> Result<Sub, CallError> {
        let body = json!({"method": "session.subscribe", "params": params}).to_string().into_bytes();
        let sub = self.client.block_on(self.client.consumer().subscribe(target(), self.identity(), body, opts))?;
        Ok(Sub { inner: sub, rt: self.client.conn.rt.clone() })
    }
}

fn error_json(body: &ErrorBody) -> Value {
    serde_json::to_value(body).expect("an error body serializes")
}

/// A `session.subscribe` stream, read synchronously.
pub struct Sub {
    inner: Subscription,
    rt: Handle,
}

impl Sub {
    /// The next event, `None` once the stream ended; panics after [`STEP`] without one.
    pub fn next(&mut self) -> Option<Value> {
        self.next_within(STEP).expect("a stream event within the step")
    }

    /// `Err(())` when nothing arrived within `wait`; `Ok(None)` when the stream ended.
    pub fn next_within(&mut self, wait: Duration) -> Result<Option<Value>, ()> {
        let event = self.rt.block_on(async { tokio::time::timeout(wait, self.inner.events().recv()).await });
        match event {
            Err(_) => Err(()),
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => Ok(Some(serde_json::from_slice(&bytes).expect("a JSON stream event"))),
        }
    }

    /// Reads into `seen` until an event matching `pred` (included); panics if the stream ends.
    pub fn until(&mut self, seen: &mut Vec<Value>, pred: impl Fn(&Value) -> bool) {
        loop {
            let Some(v) = self.next() else { panic!("the stream ended: {:?}", self.ended()) };
            let done = pred(&v);
            seen.push(v);
            if done {
                return;
            }
        }
    }

    /// Reads into `seen` until the `run_finished` unit of `run_id`.
    pub fn until_finished(&mut self, run_id: &str, seen: &mut Vec<Value>) {
        self.until(seen, |v| v["unit"]["type"] == "run_finished" && v["unit"]["run_id"] == json!(run_id));
    }

    /// How the stream ended (waits for it).
    pub fn ended(&mut self) -> SubscriptionEnd {
        self.rt.block_on(self.inner.ended())
    }

    pub fn unsubscribe(&self) {
        self.inner.unsubscribe().unwrap();
    }

    pub fn inner(&mut self) -> &mut Subscription {
        &mut self.inner
    }
}

/// A loopback relay to the daemon that adds `identity.project_root` to every `route.open`.
struct Proxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(upstream: SocketAddr, root: String) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("harness-relay".into()).spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let root = root.clone();
                let _ = std::thread::Builder::new().name("harness-relay-conn".into()).spawn(move || {
                    if let Err(e) = relay(client, upstream, &root) {
                        log::debug!("harness relay: {e}");
                    }
                });
            }
        })?;
        Ok(Proxy { addr, stop, thread: Some(thread) })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn relay(client: TcpStream, upstream: SocketAddr, root: &str) -> io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
    std::thread::Builder::new().name("harness-relay-down".into()).spawn(move || {
        let _ = io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Both);
    })?;
    let (mut from_client, mut to_server) = (client, server);
    let outcome = relay_up(&mut from_client, &mut to_server, root);
    let _ = to_server.shutdown(Shutdown::Write);
    outcome
}

/// Client → daemon: the two handshake messages the client sends (hello, auth) verbatim, then
/// frames, each `route.open` with the project root added.
fn relay_up(from: &mut TcpStream, to: &mut TcpStream, root: &str) -> io::Result<()> {
    for _ in 0..2 {
        let mut len = [0u8; 4];
        from.read_exact(&mut len)?;
        let mut msg = vec![0u8; u32::from_le_bytes(len) as usize];
        from.read_exact(&mut msg)?;
        to.write_all(&len)?;
        to.write_all(&msg)?;
    }
    let mut decoder = frame::Decoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        decoder.feed(&buf[..n]);
        while let Some(f) = decoder.next_frame().map_err(io::Error::other)? {
            let h = f.header;
            let mut body = f.body;
            if h.channel == 0 && h.ty == FrameType::Request {
                if let Ok(mut v) = serde_json::from_slice::<Value>(&body) {
                    if v["op"] == "route.open" && v["identity"].is_object() {
                        v["identity"]["project_root"] = json!(root);
                        body = serde_json::to_vec(&v).expect("JSON");
                    }
                }
            }
            let bytes = frame::encode(h.ty, h.flags, h.channel, h.epoch, h.corr, &body).map_err(io::Error::other)?;
            to.write_all(&bytes)?;
        }
    }
}

/// How long a call made while broca is being killed may take to get an answer (a respawn's
/// backoff, its registration, the dead process's lease going stale).
pub const KILL_DEADLINE: Duration = Duration::from_secs(60);

/// Whether a module refusal is about broca restarting (the route briefly gone, the session's
/// lease still the dead process's, a refusal of class `transient`): the same call may be made
/// again.
pub fn restart_refusal(body: &ErrorBody) -> bool {
    let transient = body.detail.as_ref().and_then(|d| d.get("class")).is_some_and(|c| c == "transient");
    transient || ["session_busy", "lease_stale", "module_reloading"].contains(&body.code.as_str())
}

/// A query (a read: `run.status`, `session.read`, `send.status`, ...) until broca answers:
/// across a restart the route is briefly gone or the session's lease is still the dead
/// process's ([`restart_refusal`]); anything else fails the test. Only for calls that write
/// nothing (repeating them is harmless); a send goes through [`Session::send_surviving_kills`].
pub fn retry(s: &Session, method: &str, params: Value) -> Value {
    let until = Instant::now() + KILL_DEADLINE;
    let mut last;
    loop {
        match s.try_call(method, params.clone()) {
            Ok(v) => return v,
            Err(CallError::Module(body)) => {
                assert!(restart_refusal(&body), "{method}: a refusal that is not about the restart: {body:?}");
                last = format!("{body:?}");
            }
            Err(other) => last = format!("{other:?}"),
        }
        assert!(
            Instant::now() < until,
            "{method} on {}/{} never answered within {KILL_DEADLINE:?}; last: {last}",
            s.harness,
            s.id
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the daemon routes to the tool provider `module` (it registers after broca).
pub fn wait_tool_provider(h: &Harness, module: &str) {
    use broca::subc::consumer::Consumer;
    let consumer = Consumer::connect(&h.connection_file(), None).expect("a probe connection");
    let target = subc_protocol::RouteTarget::ToolProvider { module_id: module.into() };
    let identity = subc_protocol::BindIdentity::new("runner", "probe");
    let body = serde_json::to_vec(&serde_json::json!({"name": "role.describe", "arguments": {}})).unwrap();
    let until = std::time::Instant::now() + STEP;
    while let Err(e) = consumer.call_on(&target, &identity, &body, std::time::Duration::from_secs(1)) {
        assert!(std::time::Instant::now() < until, "the tool provider never answered: {e}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits until the daemon lists every module of `ids` as ready (relays and other modules the
/// daemon launches register after broca).
pub fn wait_modules_ready(h: &Harness, ids: &[&str]) {
    let until = Instant::now() + STEP;
    loop {
        let list = h.block_on(h.client().consumer().catalog_list()).expect("catalog.list");
        if ids.iter().all(|id| list.modules.iter().any(|m| m.module_id == *id && m.ready)) {
            return;
        }
        assert!(Instant::now() < until, "the modules {ids:?} did not register: {list:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One named check of a rig.
pub type Check = (&'static str, fn(&Harness));

/// Runs every check on `h` (a failing one does not stop the others), stops the daemon, and
/// fails naming each check that failed, with broca's log tail. One test fn per daemon, because
/// stopping the in-process daemon means SIGTERM to this process.
pub fn run_checks(h: Harness, checks: &[Check]) {
    let mut failed = Vec::new();
    for (name, check) in checks {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&h))) {
            let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            failed.push(format!("{name}: {}", why.unwrap_or_default()));
        }
    }
    if !failed.is_empty() {
        eprintln!("--- broca log tail\n{}", h.broca_log_tail(60));
    }
    h.stop();
    assert!(failed.is_empty(), "failed: {failed:#?}");
}
