//! The rig of `tests/consumer_routes.rs`: one real subc daemon (the `subc-daemon` library booted
//! in this process, no supervised modules) shared by every test of the binary; target modules
//! served in this process by `broca::subc` ([`Probe`]); and a loopback TCP relay ([`Relay`]) that
//! can cut a consumer's connection to the daemon or refuse new ones.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use broca::subc::{self, BindRequest, ControlRequest, Handler, Outbound, Route};
use serde_json::{json, Value};
use subc_daemon::bootstrap::{run_with_config, BootstrapConfig};
use subc_protocol::manifest::{Concurrency, ExecutionMode, ModuleManifest, ProviderRole, Tool};
use subc_protocol::{ErrorBody, Flags};

/// The longest wait for any one thing.
pub const STEP: Duration = Duration::from_secs(15);

pub struct Daemon {
    conn_file: PathBuf,
    root: PathBuf,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

static DAEMON: OnceLock<Daemon> = OnceLock::new();

/// The daemon, booted on first use.
pub fn daemon() -> &'static Daemon {
    DAEMON.get_or_init(boot)
}

fn boot() -> Daemon {
    // Test clients open routes as plain direct callers (subc-wire.md §20.4).
    for var in ["SUBC_MODULE_ID", "SUBC_LAUNCH_NONCE", "SUBC_LAUNCH_NONCE_FD"] {
        std::env::remove_var(var);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "error".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::Builder::new().prefix("bcr").tempdir_in("/tmp").unwrap();
    let root = dir.path().to_path_buf();
    for sub in ["config", "config/cortexkit", "runtime", "run", "run/logs"] {
        fs::DirBuilder::new().mode(0o700).create(root.join(sub)).unwrap();
    }
    let config = root.join("config/cortexkit/subc.jsonc");
    fs::write(&config, json!({"version": 1, "modules": {}}).to_string()).unwrap();
    let conn_file = root.join("runtime/subc-connection.json");
    let daemon_config = BootstrapConfig::new(conn_file.clone(), 0)
        .with_daemon_config_path(config)
        .unwrap()
        .with_capture_logs_dir(root.join("run/logs"))
        .with_terminal_journal_path(root.join("run/terminals.jsonl"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("subc-daemon")
        .enable_all()
        .build()
        .unwrap();
    rt.spawn(run_with_config(daemon_config));
    let until = Instant::now() + STEP;
    while !conn_file.exists() {
        assert!(Instant::now() < until, "{} did not appear within {STEP:?}", conn_file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon { conn_file, root, _rt: rt, _dir: dir }
}

impl Daemon {
    pub fn connection_file(&self) -> &Path {
        &self.conn_file
    }

    /// A private copy of the connection file naming `port` on loopback instead of the daemon.
    pub fn connection_file_via(&self, port: u16) -> PathBuf {
        let mut info: Value = serde_json::from_slice(&fs::read(&self.conn_file).unwrap()).unwrap();
        info["endpoints"] = json!([{"host": "127.0.0.1", "port": port}]);
        if let Some(obj) = info.as_object_mut() {
            obj.remove("local_endpoint");
        }
        let dir = self.root.join("runtime").join(format!("relay-{port}"));
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let file = dir.join("subc-connection.json");
        let mut f = fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(&file).unwrap();
        f.write_all(info.to_string().as_bytes()).unwrap();
        file
    }

    /// The daemon's TCP endpoint.
    pub fn endpoint(&self) -> std::net::SocketAddr {
        let info: Value = serde_json::from_slice(&fs::read(&self.conn_file).unwrap()).unwrap();
        let endpoint = &info["endpoints"][0];
        let host = endpoint["host"].as_str().unwrap().trim_start_matches('[').trim_end_matches(']');
        let port = endpoint["port"].as_u64().unwrap() as u16;
        (host, port).to_socket_addrs().unwrap().next().unwrap()
    }
}

/// Polls `cond` until it holds or [`STEP`] passes.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + STEP;
    while !cond() {
        assert!(Instant::now() < until, "{what}: not within {STEP:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---- a target module

/// What a [`Probe`] saw, shared with the test.
#[derive(Default)]
pub struct Seen {
    pub binds: AtomicU64,
    pub closes: AtomicU64,
    pub requests: AtomicU64,
    pub cancels: AtomicU64,
    /// Live routes and the session each was bound for.
    pub live: Mutex<HashMap<Route, String>>,
    /// Sessions whose route closed, in order (kept only when `log_closes`).
    pub closed: Mutex<Vec<String>>,
    pub log_closes: AtomicBool,
}

impl Seen {
    pub fn binds(&self) -> u64 {
        self.binds.load(Ordering::SeqCst)
    }
    pub fn closes(&self) -> u64 {
        self.closes.load(Ordering::SeqCst)
    }
    pub fn closed(&self) -> Vec<String> {
        self.closed.lock().unwrap().clone()
    }
}

struct ProbeHandler {
    out: Outbound,
    seen: Arc<Seen>,
}

/// The probe's methods: the request body is the method name, optionally followed by `:` and a
/// payload. `echo` answers the body; `hold` answers nothing until cancelled; `close` answers and
/// then ends the route from the module side; anything else (a large payload) answers `ok`.
impl Handler for ProbeHandler {
    fn on_route_bound(&mut self, bind: BindRequest) {
        self.seen.binds.fetch_add(1, Ordering::SeqCst);
        self.seen.live.lock().unwrap().insert(bind.route, bind.identity.session);
    }
    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        self.seen.requests.fetch_add(1, Ordering::SeqCst);
        let method = body.split(|b| *b == b':').next().unwrap_or_default();
        let _ = match method {
            b"echo" => self.out.reply(route, corr, body),
            b"hold" => Ok(()),
            b"close" => {
                let _ = self.out.reply(route, corr, b"closing".to_vec());
                self.out.close_route(route)
            }
            _ => self.out.reply(route, corr, b"ok".to_vec()),
        };
    }
    fn on_cancel(&mut self, route: Route, corr: u64) {
        self.seen.cancels.fetch_add(1, Ordering::SeqCst);
        let _ = self.out.error(route, corr, &ErrorBody::new("cancelled", "cancelled by the client"));
    }
    fn on_route_closed(&mut self, route: Route) {
        self.seen.closes.fetch_add(1, Ordering::SeqCst);
        let session = self.seen.live.lock().unwrap().remove(&route);
        if self.seen.log_closes.load(Ordering::SeqCst) {
            self.seen.closed.lock().unwrap().push(session.unwrap_or_default());
        }
    }
    fn on_control(&mut self, _request: ControlRequest) {}
    fn on_shutdown(&mut self) {}
}

/// A tool provider served in this process through `broca::subc` (a self-connecting module).
pub struct Probe {
    running: Option<subc::Running>,
    pub seen: Arc<Seen>,
}

pub fn tool_manifest(id: &str, concurrency: Concurrency) -> ModuleManifest {
    let tool = Tool {
        name: "echo".into(),
        description: None,
        execution_mode: ExecutionMode::Pure,
        schema: json!({"type": "object"}),
    };
    let role = ProviderRole::ToolProvider {
        tools: vec![tool],
        identity_scope: Vec::new(),
        concurrency,
        emits_push: false,
        sub_supervises: false,
    };
    ModuleManifest::builder(id, "0.0.1").provides(vec![role]).build()
}

impl Probe {
    pub fn start(id: &str) -> Probe {
        Probe::start_with(id, Arc::new(Seen::default()))
    }

    /// A probe that records into `seen` (so a restarted probe continues the same record).
    pub fn start_with(id: &str, seen: Arc<Seen>) -> Probe {
        let conn = subc::connect(daemon().connection_file(), tool_manifest(id, Concurrency::StatelessParallel), id)
            .unwrap_or_else(|e| panic!("the probe {id} registers: {e}"));
        let out = conn.outbound();
        let handler = ProbeHandler { out, seen: Arc::clone(&seen) };
        let running = conn.start(handler, |_: &BindRequest| Ok(())).unwrap();
        Probe { running: Some(running), seen }
    }

    /// Ends the module's connection (GOODBYE) and waits for it to close.
    pub fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.outbound().shutdown();
            let _ = running.join();
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.outbound().shutdown();
        }
    }
}

// ---- a relay that can cut connections

/// A loopback TCP relay in front of the daemon. [`Relay::cut`] shuts every relayed connection;
/// while [`Relay::refuse`] is set, new connections are closed at once.
pub struct Relay {
    pub port: u16,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    refusing: Arc<AtomicBool>,
    pub accepted: Arc<AtomicU64>,
}

impl Relay {
    pub fn start(upstream: std::net::SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let refusing = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (c, r, a) = (Arc::clone(&conns), Arc::clone(&refusing), Arc::clone(&accepted));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                if r.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let mut held = c.lock().unwrap();
                held.push(client.try_clone().unwrap());
                held.push(server.try_clone().unwrap());
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Relay { port, conns, refusing, accepted }
    }

    /// Shuts every connection relayed so far (both sides see the end).
    pub fn cut(&self) {
        for conn in self.conns.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }

    pub fn refuse(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
