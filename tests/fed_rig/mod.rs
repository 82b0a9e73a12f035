//! Two machines in one test: two real subc daemons, each a process of its own (this test binary
//! re-executed with `--daemon RIG_DIR`, `tests/conformance/process.rs`), each supervising the
//! real `broca` and `broca-mock fed` as the reserved federation module `callosum`.
//!
//! - **B** (the serving machine) runs broca and `callosum --listen <port file> --export broca
//!   --expose-root <rig dir>`, and is configured to let `callosum` carry admission facts to
//!   broca (`admission_facts_carrier_module_id`, `admission_facts_targets`).
//! - **A** (the origin) runs broca and `callosum --peer <port file>` (reserved, with
//!   `reserved_prefixes ["fed:"]`), which re-exports B's broca on A as `fed:<B's machine
//!   id>:broca`; optionally `broca-mock relay --target fed:<B>:broca` modules (each one an
//!   attested caller on A, `reserved:<its id>`, since this test process is always `direct`).
//!
//! Layout under one temporary directory: `A/` and `B/` (each a rig directory: `config/`,
//! `runtime/`, `data/` with the machine id this rig mints before boot, `run/logs/`, and
//! `broca/`, broca's state root), `fed-port` (B's link port), `projects/` (project roots, all
//! under B's exposed prefix). Both brocas call one in-process [`MockServer`].
//!
//! `BROCA_FED_KEEP=1` keeps the directory (every daemon and module log) after the test.
//!
//! Teardown never leaves a process behind: each daemon dies with this process
//! (`PR_SET_PDEATHSIG`), [`FedRig`]'s drop SIGTERMs both daemons and then SIGKILLs whatever
//! of their modules is still alive.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use broca::subc::consumer::Consumer;
use broca_mock::mock::MockServer;
use serde_json::{json, Value};
use subc_protocol::RouteTarget;

use crate::process::{alive, children_of, now_ms};

/// The federation module's id on both daemons.
pub const CALLOSUM: &str = "callosum";
pub const BROCA: &str = "broca";
/// The longest wait for a daemon, a registration or a stop.
pub const BOOT: Duration = Duration::from_secs(30);
const STOP: Duration = Duration::from_secs(15);
/// Set to 1 to keep the rig's directory (daemon and module logs) after the test.
pub const KEEP_ENV: &str = "BROCA_FED_KEEP";
/// The deadline of one call in the tests.
pub const CALL: Duration = Duration::from_secs(10);

/// How to boot a [`FedRig`].
#[derive(Clone, Debug, Default)]
pub struct FedOptions {
    /// Relay modules on A (`broca-mock relay --target fed:<B>:broca`), by module id. A relay
    /// opens its routes without a project root (A stamps `/`), so B refuses them unless
    /// `expose_roots` exposes `/`.
    pub relays: Vec<String>,
    /// B's `--expose-root` prefixes; `None`: the rig's directory (every [`FedRig::project_dir`]).
    pub expose_roots: Option<Vec<PathBuf>>,
    /// More environment for both brocas (`BROCA_FAILPOINTS` for a kill campaign, say).
    pub broca_env: Vec<(String, String)>,
    /// The broca binary (default: the one cargo built for the test).
    pub broca: Option<PathBuf>,
}

/// One daemon process and what it supervises.
pub struct Daemon {
    pub name: &'static str,
    /// The rig directory (`--daemon` argument).
    pub dir: PathBuf,
    pub machine_id: String,
    child: Option<Child>,
    broca: PathBuf,
    mock: PathBuf,
}

/// Both daemons, both brocas, both stand-ins, the model provider.
pub struct FedRig {
    pub a: Daemon,
    pub b: Daemon,
    pub mock: MockServer,
    pub options: FedOptions,
    root: PathBuf,
    /// `None` with `BROCA_FED_KEEP=1`: the directory outlives the rig, for a look at its logs.
    _tmp: Option<tempfile::TempDir>,
}

fn mkdirs(path: &Path) {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A fresh machine id in the daemon's format (32 lowercase hex digits).
/// The move key every daemon of this process's rigs shares: 64 hex digits, random per process.
fn rig_move_key() -> &'static str {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(|| format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()))
}

fn mint_machine_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl FedRig {
    /// Boots B and A (in that order: A's stand-in waits for B's port anyway) and returns once
    /// `fed:<B>:broca` is registered and ready on A.
    pub fn start(options: FedOptions) -> FedRig {
        let tmp = tempfile::Builder::new().prefix("bfed").tempdir_in("/tmp").expect("a temporary directory");
        let root = fs::canonicalize(tmp.path()).expect("the rig directory");
        // A test names the binary cargo built for it; a bench finds it beside itself.
        let broca = options
            .broca
            .clone()
            .or_else(|| option_env!("CARGO_BIN_EXE_broca").map(PathBuf::from))
            .unwrap_or_else(|| broca_mock::exe().with_file_name("broca"));
        let broca = fs::canonicalize(&broca).unwrap_or_else(|e| panic!("the broca binary {}: {e}", broca.display()));
        let mock_bin = broca_mock::exe();
        let mock = MockServer::start("127.0.0.1:0").expect("the mock provider starts");
        mkdirs(&root.join("projects"));
        let (a_id, b_id) = (mint_machine_id(), mint_machine_id());
        let port_file = root.join("fed-port");
        let model_url = mock.base_url(None);
        let restart = json!({"max_restarts": 100, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 500});
        let mut b_args = vec![json!("fed"), json!("--listen"), json!(port_file), json!("--export"), json!(BROCA)];
        b_args.extend([json!("--log"), json!(root.join("B/fed.jsonl"))]);
        for prefix in options.expose_roots.clone().unwrap_or_else(|| vec![root.clone()]) {
            b_args.extend([json!("--expose-root"), json!(prefix)]);
        }
        let callosum_b = json!({
            "program": mock_bin,
            "args": b_args,
            "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true, "restart": restart,
        });
        let b_table = json!({
            "version": 1,
            "admission_facts_carrier_module_id": CALLOSUM,
            "admission_facts_targets": [BROCA],
            "modules": {BROCA: broca_module(&broca, &root.join("B"), &model_url, &restart, &options.broca_env), CALLOSUM: callosum_b},
        });
        let b = Daemon::start("B", root.join("B"), b_id, b_table, &broca, &mock_bin);
        let fed_broca = format!("fed:{}:{BROCA}", b.machine_id);
        let callosum_a = json!({
            "program": mock_bin,
            "args": ["fed", "--peer", port_file, "--log", root.join("A/fed.jsonl")],
            "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true, "reserved_prefixes": ["fed:"],
            "restart": restart,
        });
        let mut a_modules = json!({BROCA: broca_module(&broca, &root.join("A"), &model_url, &restart, &options.broca_env), CALLOSUM: callosum_a});
        for relay in &options.relays {
            a_modules[relay] = json!({"program": mock_bin, "args": ["relay", "--target", fed_broca],
                                      "env": {"CK_LOG": "warn"}, "enabled": true, "reserved": true});
        }
        let a_table = json!({"version": 1, "modules": a_modules});
        let a = Daemon::start("A", root.join("A"), a_id, a_table, &broca, &mock_bin);
        let keep = std::env::var_os(KEEP_ENV).is_some_and(|v| v == "1");
        if keep {
            eprintln!("federation: keeping {}", root.display());
        }
        let tmp = if keep {
            let _ = tmp.keep();
            None
        } else {
            Some(tmp)
        };
        let rig = FedRig { a, b, mock, options, root, _tmp: tmp };
        rig.b.wait_ready(&[BROCA, CALLOSUM]);
        let mut on_a = vec![BROCA.to_owned(), CALLOSUM.to_owned(), fed_broca];
        on_a.extend(rig.options.relays.iter().cloned());
        rig.a.wait_ready(&on_a.iter().map(String::as_str).collect::<Vec<_>>());
        rig
    }

    /// The rig's temporary directory (every project root under it is exposed by B).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `fed:<B's machine id>:broca`, B's broca as A sees it.
    pub fn fed_broca(&self) -> String {
        format!("fed:{}:{BROCA}", self.b.machine_id)
    }

    pub fn fed_target(&self) -> RouteTarget {
        RouteTarget::ManagementSurface { module_id: self.fed_broca() }
    }

    pub fn broca_target() -> RouteTarget {
        RouteTarget::ManagementSurface { module_id: BROCA.into() }
    }

    /// A fresh project root `<rig>/projects/<name>` (canonical), exposed by B.
    pub fn project_dir(&self, name: &str) -> PathBuf {
        let dir = self.root.join("projects").join(name);
        mkdirs(&dir);
        fs::canonicalize(dir).expect("the project directory")
    }

    /// B's broca state root.
    pub fn b_state_root(&self) -> PathBuf {
        self.b.state_root()
    }

    /// The relayed binds B's stand-in logged (`{side, peer, module, harness, session, principal, root}`).
    pub fn b_fed_log(&self) -> Vec<Value> {
        let text = fs::read_to_string(self.root.join("B/fed.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Waits until B's stand-in logged a relayed bind matching `pred`.
    pub fn wait_b_fed_log(&self, pred: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + BOOT;
        loop {
            if let Some(line) = self.b_fed_log().into_iter().find(|l| pred(l)) {
                return line;
            }
            assert!(Instant::now() < until, "B's stand-in logged no such bind: {:?}", self.b_fed_log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of every log of both daemons, for a failure message.
    pub fn tails(&self) -> String {
        format!("{}{}", self.a.tail(), self.b.tail())
    }
}

fn broca_module(broca: &Path, dir: &Path, model_url: &str, restart: &Value, extra: &[(String, String)]) -> Value {
    let state = dir.join("broca");
    mkdirs(&state.join("catalog"));
    // Written "now", so broca's catalog poller finds it fresh and polls no fusiform.
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let mut seeded: Value = serde_json::from_slice(&fs::read(lkg).expect("the catalog LKG")).expect("LKG JSON");
    seeded["written_at_ms"] = json!(now_ms());
    fs::write(state.join("catalog/fusiform-lkg.json"), seeded.to_string()).expect("seeding the catalog");
    // The rig's hosts move sessions between them: they share one move key (docs/security.md).
    let key = state.join(broca::moves::key::FILE);
    fs::write(&key, format!("{}\n", rig_move_key())).expect("provisioning move.key");
    fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("move.key's mode");
    let mut module = json!({
        "program": broca, "args": [], "enabled": true, "reserved": true, "restart": restart,
        "env": {"CK_LOG": "info", "BROCA_STATE_ROOT": state, "BROCA_PROVIDER_BASE_URL": model_url},
    });
    for (k, v) in extra {
        module["env"][k] = json!(v);
    }
    module
}

impl Daemon {
    fn start(name: &'static str, dir: PathBuf, machine_id: String, table: Value, broca: &Path, mock: &Path) -> Daemon {
        for sub in ["config/cortexkit", "runtime", "data", "run/logs"] {
            mkdirs(&dir.join(sub));
        }
        fs::write(dir.join("data/machine-id"), format!("{machine_id}\n")).expect("the machine id");
        fs::write(dir.join("config/cortexkit/subc.jsonc"), table.to_string()).expect("subc.jsonc");
        let log = fs::File::create(dir.join("run/logs/daemon.log")).expect("the daemon log");
        let exe = std::env::current_exe().expect("this test binary");
        let child = Command::new(exe)
            .arg("--daemon")
            .arg(&dir)
            .env_remove("SUBC_MODULE_ID")
            .env_remove("SUBC_LAUNCH_NONCE")
            .env_remove("SUBC_LAUNCH_NONCE_FD")
            .env("XDG_RUNTIME_DIR", dir.join("runtime"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("SUBC_CGROUP_PLACEMENT", "disabled")
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the daemon log"))
            .stderr(log)
            .spawn()
            .expect("starting a daemon");
        Daemon { name, dir, machine_id, child: Some(child), broca: broca.to_owned(), mock: mock.to_owned() }
    }

    pub fn conn_file(&self) -> PathBuf {
        self.dir.join("runtime/subc-connection.json")
    }

    pub fn state_root(&self) -> PathBuf {
        self.dir.join("broca")
    }

    /// A consumer connection of this test process (`direct`), retried until the daemon is up.
    pub fn consumer(&self) -> Consumer {
        let until = Instant::now() + BOOT;
        loop {
            match Consumer::connect(&self.conn_file(), None) {
                Ok(c) => return c,
                Err(e) => assert!(Instant::now() < until, "daemon {}: no connection: {e}{}", self.name, self.tail()),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's `catalog.list` entry for `module`, if it is registered.
    pub fn catalog_entry(&self, consumer: &Consumer, module: &str) -> Option<Value> {
        let body = json!({"op": "catalog.list", "module_id": module}).to_string();
        let reply = consumer.control(body.as_bytes(), CALL).ok()?;
        let list: Value = serde_json::from_slice(&reply).ok()?;
        list["modules"].as_array()?.iter().find(|m| m["module_id"] == module).cloned()
    }

    /// Waits until every module of `ids` is registered and ready.
    pub fn wait_ready(&self, ids: &[&str]) {
        let consumer = self.consumer();
        let until = Instant::now() + BOOT;
        loop {
            let missing: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|id| self.catalog_entry(&consumer, id).is_none_or(|e| e["ready"] == false))
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < until,
                "daemon {}: {missing:?} not ready within {BOOT:?}{}",
                self.name,
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `module` is no longer registered.
    pub fn wait_gone(&self, module: &str) {
        let consumer = self.consumer();
        let until = Instant::now() + BOOT;
        while self.catalog_entry(&consumer, module).is_some() {
            assert!(Instant::now() < until, "daemon {}: {module} still registered{}", self.name, self.tail());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// The pid of the live module process running `program` with `arg` among its arguments.
    fn module_pid(&self, program: &Path, arg: &str) -> Option<i32> {
        children_of(self.pid()?).into_iter().find(|pid| {
            let exe = fs::read_link(format!("/proc/{pid}/exe")).ok();
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            exe.as_deref() == Some(program) && cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()) && alive(*pid)
        })
    }

    /// This daemon's broca process.
    pub fn broca_pid(&self) -> Option<i32> {
        children_of(self.pid()?)
            .into_iter()
            .find(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == self.broca) && alive(*pid))
    }

    /// This daemon's federation stand-in.
    pub fn callosum_pid(&self) -> Option<i32> {
        self.module_pid(&self.mock, "fed")
    }

    /// The relay module `id` (matched by its `SUBC_MODULE_ID`).
    pub fn relay_pid(&self, id: &str) -> Option<i32> {
        let var = format!("SUBC_MODULE_ID={id}");
        children_of(self.pid()?).into_iter().find(|pid| {
            let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ.split(|b| *b == 0).any(|v| v == var.as_bytes()) && alive(*pid)
        })
    }

    /// A module's captured stderr (every incarnation).
    pub fn module_log(&self, module: &str) -> String {
        fs::read_to_string(self.dir.join("run/logs").join(format!("{module}.stderr.log"))).unwrap_or_default()
    }

    pub fn tail(&self) -> String {
        let mut out = String::new();
        for name in ["daemon.log", "broca.stderr.log", "callosum.stderr.log"] {
            let text = fs::read_to_string(self.dir.join("run/logs").join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "\n--- {} {name}\n{}",
                self.name,
                lines[lines.len().saturating_sub(20)..].join("\n")
            ));
        }
        out
    }

    /// SIGTERM (its shutdown sequence stops its modules), bounded; then SIGKILL to whatever of it
    /// is still alive.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pid = child.id() as i32;
        let modules = children_of(pid);
        // SAFETY: kill(2) on the daemon process this rig started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + STOP;
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > until => {
                    eprintln!("federation: daemon {} ignored SIGTERM for {STOP:?}: SIGKILL", self.name);
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        for module in modules {
            if alive(module) {
                // SAFETY: a module process this rig's daemon started.
                unsafe { libc::kill(module, libc::SIGKILL) };
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SIGKILLs `pid` (a module process of the rig).
pub fn kill(pid: i32) {
    // SAFETY: kill(2) on a module process this rig's daemon started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "SIGKILL {pid}");
}
