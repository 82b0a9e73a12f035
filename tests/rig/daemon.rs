//! `subc-rig-daemon RIG_DIR`: the real subc daemon (the `subc-daemon` library), booted for the
//! `scripts/rig` test rig. It reads `RIG_DIR/config/cortexkit/subc.jsonc`, publishes
//! `RIG_DIR/runtime/subc-connection.json` (an OS-chosen loopback port), captures module output
//! under `RIG_DIR/run/logs/` and journals module exits to `RIG_DIR/run/terminals.jsonl`. It
//! writes nothing else itself; its own log goes to stderr (filter: `RUST_LOG`, default `info`).
//!
//! SIGTERM runs the daemon's shutdown sequence (drain, GOODBYE, wait for the modules); the
//! launcher then exits 0. A daemon that fails to boot or stops with an error exits 1.

use std::path::PathBuf;
use std::process::ExitCode;

use subc_daemon::bootstrap::{run_with_config, BootstrapConfig};

const USAGE: &str = "usage: subc-rig-daemon RIG_DIR";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rig = match args.as_slice() {
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        [dir] => PathBuf::from(dir),
        _ => {
            eprintln!("subc-rig-daemon: {USAGE}");
            return ExitCode::from(2);
        }
    };
    let config_path = rig.join("config/cortexkit/subc.jsonc");
    if !config_path.is_file() {
        eprintln!("subc-rig-daemon: {} is missing (is {} a rig directory?)", config_path.display(), rig.display());
        return ExitCode::from(2);
    }
    // Without a subscriber the daemon says nothing at all; the rig waits on its log.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let config =
        match BootstrapConfig::new(rig.join("runtime/subc-connection.json"), 0).with_daemon_config_path(&config_path) {
            Ok(config) => config
                .with_capture_logs_dir(rig.join("run/logs"))
                .with_terminal_journal_path(rig.join("run/terminals.jsonl")),
            Err(e) => {
                eprintln!("subc-rig-daemon: cannot load {}: {e}", config_path.display());
                return ExitCode::from(1);
            }
        };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("subc-rig-daemon: cannot start the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(run_with_config(config));
    // The shutdown sequence has run; tasks still parked (timers, blocking reads) are dropped.
    runtime.shutdown_background();
    match outcome {
        Ok(()) => {
            eprintln!("subc-rig-daemon: the daemon stopped cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("subc-rig-daemon: the daemon failed: {e}");
            ExitCode::from(1)
        }
    }
}
