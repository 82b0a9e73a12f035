//! Process plumbing the rigs that run daemons as processes share (`tests/conformance.rs`,
//! `tests/conformance_classifier.rs`, `tests/federation.rs`): the daemon a rig re-executes its
//! test binary as, and the `/proc` reads its teardown needs.
#![allow(dead_code)]

use std::fs;
use std::path::Path;

/// Live (not zombie) processes whose parent is `parent`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            // `pid (comm) state ppid ...`; comm may hold spaces, so parse after the last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else { return false };
            rest.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok()) == Some(parent)
        })
        .collect()
}

/// Whether `pid` is a live process (not gone, not a zombie).
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned));
    !matches!(state.as_deref(), None | Some("Z") | Some("X"))
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `--daemon RIG_DIR`: the real subc daemon for one rig, until SIGTERM (`name` prefixes its
/// errors). When the rig wrote a machine id to `RIG_DIR/data/machine-id` (one line, 32 hex
/// digits), the daemon serves it and its modules' HELLO_ACK names it; without one it serves none
/// (a rig whose instances share a broca state root across rig directories must not get a new
/// machine under every instance).
pub fn daemon_main(rig: &Path, name: &str) -> std::process::ExitCode {
    // A daemon never outlives the suite that started it (a killed or timed-out run leaves no
    // broca behind): SIGTERM runs its shutdown sequence when the parent goes.
    // SAFETY: prctl(2) on this process only; getppid(2) has no preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        if libc::getppid() == 1 {
            return std::process::ExitCode::from(1);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let table = rig.join("config/cortexkit/subc.jsonc");
    let config = match subc_daemon::bootstrap::BootstrapConfig::new(rig.join("runtime/subc-connection.json"), 0)
        .with_daemon_config_path(&table)
    {
        Ok(c) => {
            let c = c
                .with_capture_logs_dir(rig.join("run/logs"))
                .with_terminal_journal_path(rig.join("run/terminals.jsonl"));
            let machine_id = rig.join("data/machine-id");
            if machine_id.is_file() {
                c.with_machine_id_path(machine_id)
            } else {
                c
            }
        }
        Err(e) => {
            eprintln!("{name}: cannot load {}: {e}", table.display());
            return std::process::ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start tokio: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(subc_daemon::bootstrap::run_with_config(config));
    runtime.shutdown_background();
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
