//! One runner instance: a real subc daemon in its own process (this test binary re-executed
//! with `--daemon RIG_DIR`, booting the `subc-daemon` library), supervising the real `broca`
//! binary on a state root and `broca-mock --subc` as the scripted tool provider, reached through
//! the official consumer SDK.
//!
//! Each instance has its own rig directory (daemon config, connection file, captured logs)
//! under the suite's state root; broca's state root is `<root>/broca` and survives every stop,
//! kill and restart of the instance. The tool provider's call log and its scripted results live
//! outside every state root (see `tools.rs`), so no kill or restart of broca can touch them.
//!
//! A separate daemon process per instance lets the suite run several instances at once (its main
//! runner stays up while crash scenarios spawn and kill their own) and stop each one with its
//! own SIGTERM; an in-process daemon can only be stopped by signalling the whole test process.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_client_rs::{CallOptions, ConsumerOptions, SubcConsumer};

/// broca's module id in every rig's table.
pub const BROCA: &str = "broca";
/// The scripted tool provider's module id.
pub const TOOLS: &str = "mock-tools";
/// The relay modules (`broca-mock relay`) the suite's owner and stranger call broca through:
/// their ids are their attested principals (`reserved:<id>`).
pub const OWNER: &str = "conformance-owner";
pub const STRANGER: &str = "conformance-stranger";
/// The two modules a plan names in `senders` (the delivery-order and sender cases).
pub const SENDER_A: &str = "conformance-sender-a";
pub const SENDER_B: &str = "conformance-sender-b";
/// Every relay module a route may go through, as its attested principal.
pub const RELAYS: [&str; 4] = [OWNER, STRANGER, SENDER_A, SENDER_B];
/// The longest wait for a rig to come up, or to stop after SIGTERM.
const BOOT: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(30);
/// The deadline of one unary call through the SDK.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// What every rig of one suite run shares.
#[derive(Clone, Debug)]
pub struct RigConfig {
    pub broca: PathBuf,
    pub broca_mock: PathBuf,
    /// `BROCA_PROVIDER_BASE_URL`: the scripted model's front (`model.rs`).
    pub model_url: String,
    /// The tool provider's script (`tools.rs`) and its call log, outside every state root.
    pub tool_script: PathBuf,
    pub call_log: PathBuf,
    /// The catalog LKG seeded into a fresh state root.
    pub lkg: PathBuf,
    /// The `broca.jsonc` written into a fresh state root (the bus its step hints go to).
    pub broca_jsonc: Option<String>,
}

/// A running daemon with broca and the tool provider registered and ready.
pub struct Rig {
    pub dir: PathBuf,
    daemon: Option<Child>,
    consumer: Option<Arc<SubcConsumer>>,
    broca_binary: PathBuf,
}

static NEXT_RIG: AtomicU64 = AtomicU64::new(0);

pub fn call_options() -> CallOptions {
    CallOptions { timeout: CALL_TIMEOUT, ..Default::default() }
}

fn mkdirs(path: &Path) -> Result<(), String> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// broca's state root inside a suite-given root.
pub fn broca_root(root: &Path) -> PathBuf {
    root.join("broca")
}

impl Rig {
    /// Boots a daemon for `root` (broca's state root `root/broca`, seeded with the catalog on
    /// first use), with `failpoints` as broca's `BROCA_FAILPOINTS` when given.
    pub async fn start(config: &RigConfig, root: &Path, failpoints: Option<&str>) -> Result<Rig, String> {
        let state = broca_root(root);
        let lkg = state.join("catalog/fusiform-lkg.json");
        if !lkg.exists() {
            mkdirs(&state.join("catalog"))?;
            // Written "now", so broca's catalog poller finds it fresh and does not chase a
            // fusiform this rig does not run.
            let text = fs::read(&config.lkg).map_err(|e| format!("{}: {e}", config.lkg.display()))?;
            let mut seeded: Value = serde_json::from_slice(&text).map_err(|e| format!("the LKG: {e}"))?;
            seeded["written_at_ms"] = json!(now_ms());
            fs::write(&lkg, seeded.to_string()).map_err(|e| format!("{}: {e}", lkg.display()))?;
        }
        if let Some(text) = &config.broca_jsonc {
            let path = state.join("broca.jsonc");
            if !path.exists() {
                fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        let n = NEXT_RIG.fetch_add(1, Ordering::Relaxed) + 1;
        let dir = root.join(format!("rig-{n}"));
        for sub in ["config/cortexkit", "runtime", "run/logs"] {
            mkdirs(&dir.join(sub))?;
        }
        let mut env = json!({
            "CK_LOG": "info",
            "BROCA_STATE_ROOT": state,
            "BROCA_PROVIDER_BASE_URL": config.model_url,
            // Held replies are declared (a debug-build marker; spec §19), and late results are
            // pulled every 100 ms instead of 3 s.
            "BROCA_TEST_DECLARE_HELD_REPLY_V1": "1",
            "BROCA_TEST_LATE_POLL_MS": "100",
        });
        if let Some(points) = failpoints {
            env["BROCA_FAILPOINTS"] = json!(points);
        }
        // The suite's retention clock (`retention::advance`): one file per instance root.
        env[broca::clock::TEST_CLOCK_ENV] = json!(crate::retention::clock_file(root));
        // A crashed broca stays down until the suite restarts the runner: the backoff outlasts
        // any scenario, and the rig is torn down long before it elapses.
        let restart = json!({"max_restarts": 1, "window_secs": 600, "backoff_ms": 600_000, "max_backoff_ms": 600_000});
        let modules = json!({
            BROCA: {"program": config.broca, "args": [], "env": env, "enabled": true, "reserved": true,
                    "restart": restart},
            TOOLS: {"program": config.broca_mock,
                    "args": ["--tools", config.tool_script, "--call-log", config.call_log, "--call-log-fsync"],
                    "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true},
            OWNER: {"program": config.broca_mock, "args": ["relay"], "env": {"CK_LOG": "warn"},
                    "enabled": true, "reserved": true},
            STRANGER: {"program": config.broca_mock, "args": ["relay"], "env": {"CK_LOG": "warn"},
                       "enabled": true, "reserved": true},
            SENDER_A: {"program": config.broca_mock, "args": ["relay"], "env": {"CK_LOG": "warn"},
                       "enabled": true, "reserved": true},
            SENDER_B: {"program": config.broca_mock, "args": ["relay"], "env": {"CK_LOG": "warn"},
                       "enabled": true, "reserved": true},
        });
        let table = json!({"version": 1, "modules": modules});
        let table_path = dir.join("config/cortexkit/subc.jsonc");
        fs::write(&table_path, table.to_string()).map_err(|e| format!("{}: {e}", table_path.display()))?;
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
        let mut rig =
            Rig { dir: dir.clone(), daemon: Some(daemon), consumer: None, broca_binary: config.broca.clone() };
        // `rig` owns the daemon from here: an error drops it, which stops the daemon.
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
                    break c;
                }
            }
            if Instant::now() > until {
                return Err(format!("the daemon in {} did not publish a connection: {}", dir.display(), rig.tail()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let consumer = Arc::new(consumer);
        rig.consumer = Some(Arc::clone(&consumer));
        loop {
            if let Ok(list) = consumer.catalog_list().await {
                let ready = |id: &str| list.modules.iter().any(|m| m.module_id == id && m.ready);
                if [BROCA, TOOLS].into_iter().chain(RELAYS).all(ready) {
                    return Ok(rig);
                }
            }
            if Instant::now() > until {
                return Err(format!(
                    "broca, {TOOLS} and the relays {RELAYS:?} did not register in {}: {}",
                    dir.display(),
                    rig.tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The rig's consumer connection (set once the daemon answered).
    pub fn consumer(&self) -> Option<Arc<SubcConsumer>> {
        self.consumer.clone()
    }

    /// broca's captured stderr, every incarnation under this daemon.
    pub fn broca_log(&self) -> String {
        fs::read_to_string(self.dir.join("run/logs/broca.stderr.log")).unwrap_or_default()
    }

    fn tail(&self) -> String {
        let mut out = String::new();
        for name in ["daemon.log", "broca.stderr.log"] {
            let text = fs::read_to_string(self.dir.join("run/logs").join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("\n--- {name}\n{}", lines[lines.len().saturating_sub(15)..].join("\n")));
        }
        out
    }

    fn daemon_pid(&self) -> Option<i32> {
        self.daemon.as_ref().map(|d| d.id() as i32)
    }

    /// The pid of the broca process this rig's daemon supervises, if one runs.
    pub fn broca_pid(&self) -> Option<i32> {
        let daemon = self.daemon_pid()?;
        children_of(daemon).into_iter().find(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == self.broca_binary) && alive(*pid)
        })
    }

    /// SIGTERM to the daemon (its shutdown sequence stops broca and the provider), bounded;
    /// past the bound every process of the rig is SIGKILLed.
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
                    eprintln!(
                        "conformance: the daemon in {} ignored SIGTERM for {STOP:?}: SIGKILL",
                        self.dir.display()
                    );
                    let _ = daemon.kill();
                    let _ = daemon.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        for child in children {
            if alive(child) {
                // SAFETY: a module process this rig's daemon started (it is still our grandchild).
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

use crate::process::children_of;
pub use crate::process::{alive, now_ms};

/// `--daemon RIG_DIR`: the real subc daemon for one rig, until SIGTERM.
pub fn daemon_main(rig: &Path) -> std::process::ExitCode {
    crate::process::daemon_main(rig, "conformance daemon")
}
