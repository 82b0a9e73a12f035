//! The rig: a real subc daemon in its own process (this test binary re-executed with
//! `--daemon RIG_DIR`, booting the `subc-daemon` library, as `tests/conformance/rig.rs` does
//! for the llm-runner suite), supervising three modules, reached through the official consumer
//! SDK:
//!
//! - `broca`: the real binary cargo built, on a state root seeded with the catalog
//!   (`catalog.rs`) and a `broca.jsonc` pointing both classifier providers
//!   (`providers.<id>.base_url`) at the stand-in, a `MockServer` in this process;
//! - `claustrum`: `broca-mock claustrum --vault FILE`, the vault, holding `apikey:typesafe` and
//!   `apikey:cloudflare-workers-ai` (with its `account_id`) for principal `broca`, and nothing
//!   else broca could read a provider credential from;
//! - `mock-tools`: `broca-mock --tools SCRIPT`, the scope authority (the daemon's
//!   `scope_authority_owners`), syncing one run scope whose attributes name `agent_id` and
//!   `run_id` and whose carriers admit a direct caller, the test's consumer.
//!
//! The daemon never outlives the test process (`PR_SET_PDEATHSIG`), and [`Rig::stop`] (also on
//! drop) SIGTERMs it and SIGKILLs whatever module is left after the bound.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_client_rs::{CallOptions, ConsumerOptions, SubcConsumer};

pub const BROCA: &str = "broca";
pub const VAULT: &str = "claustrum";
/// The scope authority's module id: the scope's owner is `reserved:mock-tools`.
pub const SCOPES: &str = "mock-tools";
/// The run scope the classifier route is opened under, and its attributes.
pub const RUN_SCOPE: &str = "run-scope";
pub const AGENT_ID: &str = "agent-conf";
pub const RUN_ID: &str = "run-conf";

/// The vault's credentials, and the account id of the Workers AI record.
pub const TYPESAFE_SECRET: &str = "ts-conf-1";
pub const WORKERS_AI_SECRET: &str = "cf-conf-1";
pub const ACCOUNT_ID: &str = "acct-conf";

const BOOT: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(30);
/// The deadline of one call through the SDK: longer than the suite's longest wait for a held
/// provider call (400 pauses of `subject::PAUSE`) and a 4 MiB request.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

pub fn call_options() -> CallOptions {
    CallOptions { timeout: CALL_TIMEOUT, ..Default::default() }
}

/// What the rig is built from.
pub struct RigConfig {
    pub broca: PathBuf,
    pub broca_mock: PathBuf,
    /// The stand-in provider's root URL (`http://127.0.0.1:<port>`).
    pub provider_url: String,
}

pub struct Rig {
    pub dir: PathBuf,
    daemon: Option<Child>,
    consumer: Option<Arc<SubcConsumer>>,
}

fn mkdirs(path: &Path) -> Result<(), String> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), String> {
    fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

pub use crate::process::now_ms;

/// `broca-mock claustrum`'s vault file.
pub fn vault() -> Value {
    let record = |secret: &str| json!({"secret": secret, "record_version": 1, "state": "ready", "principals": [BROCA]});
    let mut workers_ai = record(WORKERS_AI_SECRET);
    workers_ai["account_id"] = json!(ACCOUNT_ID);
    json!({"credentials": {"apikey:typesafe": record(TYPESAFE_SECRET), "apikey:cloudflare-workers-ai": workers_ai}})
}

/// `broca-mock --tools`'s script: no tools, one run scope a direct caller may carry.
pub fn scopes_script() -> Value {
    json!({
        "scopes": [{"ref": RUN_SCOPE, "scope_epoch": 1, "kind": "worker",
                    "carriers": [{"principal": {"kind": "direct"}}],
                    "attributes": {"agent_id": AGENT_ID, "run_id": RUN_ID}}],
        "tools": [],
    })
}

/// broca's `broca.jsonc`: both classifier providers at the stand-in.
pub fn broca_jsonc(provider_url: &str) -> Value {
    json!({"providers": {"typesafe": {"base_url": provider_url}, "cloudflare-workers-ai": {"base_url": provider_url}}})
}

impl Rig {
    /// Writes broca's state root (its catalog stating `rows`) and the modules' files under `root`, boots the daemon and
    /// returns once broca, the vault and the scope authority are registered and ready.
    pub async fn start(config: &RigConfig, rows: crate::catalog::Rows, root: &Path) -> Result<Rig, String> {
        let state = root.join("broca");
        mkdirs(&state.join("catalog"))?;
        write(&state.join("catalog/fusiform-lkg.json"), crate::catalog::lkg(rows, now_ms()))?;
        write(&state.join("broca.jsonc"), broca_jsonc(&config.provider_url).to_string())?;
        let files = root.join("files");
        mkdirs(&files)?;
        let (vault_file, script) = (files.join("vault.json"), files.join("scopes.json"));
        write(&vault_file, vault().to_string())?;
        write(&script, scopes_script().to_string())?;
        let dir = root.join("rig");
        for sub in ["config/cortexkit", "runtime", "run/logs"] {
            mkdirs(&dir.join(sub))?;
        }
        let modules = json!({
            BROCA: {"program": config.broca, "args": [], "enabled": true, "reserved": true,
                    "env": {"CK_LOG": "info", "BROCA_STATE_ROOT": state}},
            VAULT: {"program": config.broca_mock, "args": ["claustrum", "--vault", vault_file],
                    "env": {"CK_LOG": "warn"}, "enabled": true, "reserved": true},
            SCOPES: {"program": config.broca_mock,
                     "args": ["--tools", script, "--call-log", files.join("tool-calls.jsonl")],
                     "env": {"CK_LOG": "warn"}, "enabled": true, "reserved": true},
        });
        let table = json!({"version": 1, "modules": modules, "scope_authority_owners": [SCOPES]});
        write(&dir.join("config/cortexkit/subc.jsonc"), table.to_string())?;
        let log = fs::File::create(dir.join("run/logs/daemon.log")).map_err(|e| format!("the daemon log: {e}"))?;
        let exe = std::env::current_exe().map_err(|e| format!("this test binary: {e}"))?;
        let daemon = Command::new(exe)
            .arg("--daemon")
            .arg(&dir)
            .env_remove("SUBC_MODULE_ID")
            .env_remove("SUBC_LAUNCH_NONCE")
            .env_remove("SUBC_LAUNCH_NONCE_FD")
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("the daemon log: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the daemon: {e}"))?;
        // `rig` owns the daemon from here: an error drops it, which stops the daemon.
        let mut rig = Rig { dir: dir.clone(), daemon: Some(daemon), consumer: None };
        let conn = dir.join("runtime/subc-connection.json");
        let until = Instant::now() + BOOT;
        let consumer = loop {
            if conn.exists() {
                let opts = ConsumerOptions {
                    handshake_timeout: Duration::from_secs(2),
                    call_timeout: CALL_TIMEOUT,
                    ..Default::default()
                };
                if let Ok(c) = SubcConsumer::connect(&conn, opts).await {
                    break Arc::new(c);
                }
            }
            if Instant::now() > until {
                return Err(format!("the daemon in {} did not publish a connection:{}", dir.display(), rig.tail()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        rig.consumer = Some(Arc::clone(&consumer));
        loop {
            if let Ok(list) = consumer.catalog_list().await {
                let ready = |id: &str| list.modules.iter().any(|m| m.module_id == id && m.ready);
                if [BROCA, VAULT, SCOPES].into_iter().all(ready) {
                    return Ok(rig);
                }
            }
            if Instant::now() > until {
                return Err(format!(
                    "{BROCA}, {VAULT} and {SCOPES} did not register in {}:{}",
                    dir.display(),
                    rig.tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn consumer(&self) -> Option<Arc<SubcConsumer>> {
        self.consumer.clone()
    }

    /// The last lines of the daemon's and broca's logs.
    pub fn tail(&self) -> String {
        let mut out = String::new();
        for name in ["daemon.log", "broca.stderr.log"] {
            let text = fs::read_to_string(self.dir.join("run/logs").join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("\n--- {name}\n{}", lines[lines.len().saturating_sub(15)..].join("\n")));
        }
        out
    }

    /// SIGTERM to the daemon (its shutdown sequence stops the modules), bounded; past the bound
    /// the daemon and every module it started are SIGKILLed.
    pub fn stop(&mut self) {
        self.consumer = None;
        let Some(mut daemon) = self.daemon.take() else { return };
        let pid = daemon.id() as i32;
        let children = children_of(pid);
        // SAFETY: kill(2) on the daemon process this rig started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + STOP;
        loop {
            match daemon.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > until => {
                    eprintln!("conformance-classifier: the daemon ignored SIGTERM for {STOP:?}: SIGKILL");
                    let _ = daemon.kill();
                    let _ = daemon.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        for child in children {
            if alive(child) {
                // SAFETY: a module process this rig's daemon started.
                unsafe { libc::kill(child, libc::SIGKILL) };
            }
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop();
    }
}

use crate::process::{alive, children_of};

/// `--daemon RIG_DIR`: the real subc daemon for the rig, until SIGTERM.
pub fn daemon_main(rig: &Path) -> std::process::ExitCode {
    crate::process::daemon_main(rig, "conformance-classifier daemon")
}
