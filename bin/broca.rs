//! `broca`: the subc module binary. `broca --subc <connection-file>` serves the module connection
//! (started that way by the subc daemon); the other commands are operator tools on the lineage core.
//!
//! Served: `role.describe`, `session.send` (plain queue delivery), `session.read`, `run.status`,
//! `session.subscribe` (a watch stream), and `health.check`; any other method is refused
//! `unknown_method`. Exit 0 after the daemon's GOODBYE (or EOF, or SIGTERM), 1 when the
//! connection could not be made or ended abnormally, 2 for usage errors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use broca::agent::LoopOptions;
use broca::catalog::poller::{CatalogHealth, Poller, POLL_INTERVAL};
use broca::catalog::Catalog;
use broca::config::BrocaConfig;
use broca::federation::Federation;
use broca::lineage::read;
use broca::lineage::{LineageError, Shared};
use broca::module::{Module, ModuleBuilder, IDLE_TTL};
use broca::ops::table::manifest;
use broca::record::{self, Record};
use broca::serve::Server;
use broca::session_key::SessionKey;
use broca::state_root::{RootEnv, StateRoot};
use broca::subc::consumer::{Consumer, ConsumerIdentity};
use broca::subc::{self, BindRequest};
use broca::tools::ToolPlane;
use broca::wal::{self, ScannedFrame};

#[path = "broca/doctor.rs"]
mod doctor;
#[path = "broca/session_cli.rs"]
mod session_cli;

const USAGE: &str = "\
broca: durable agentic LLM loops (a CortexKit subc module)

usage:
  broca --subc CONNECTION_FILE   serve as the subc module (the daemon starts broca this way)
  broca inspect WAL|CONTAINER    print a WAL's (or a fold container's) header and records, one
                                 JSON object per line
  broca inspect PROJECT_ROOT HARNESS SESSION
                                 where the session lives (as `broca session` says), then its
                                 records, read from its live WAL or its container (not unfolded)
  broca units WAL                print the durable control units of a WAL, one per line
  broca session PROJECT_ROOT HARNESS SESSION
                                 print the session's address, WAL path and where it lives here
                                 (state live, moved or absent; its tree; a move's epoch)
  broca session export|import|locate ...
                                 move a session between hosts (`broca session --help`)
  broca doctor [--json]          prove each configured provider credential with one cheap
                                 request, a line each (`broca doctor --help`)
  broca fold [--older-than SECS]  fold closed WALs untouched for SECS (default 0) into the
                                 archive trees now, as the module's sweep does (spec §20)
  broca unfold PROJECT_ROOT HARNESS SESSION
                                 unfold a folded session back into its live tree
  broca --help | --version

The state root is BROCA_STATE_ROOT, else $XDG_DATA_HOME/cortexkit/broca, else
~/.local/share/cortexkit/broca. Logs go to stderr, filtered by CK_LOG (default: warn).

exit codes: 0 ok, 1 the WAL, state root or subc connection failed, 2 usage";

/// A read-only command piped into `head` ends quietly when its reader goes, as Unix tools do,
/// instead of panicking on the broken pipe. Only for the commands that print records: the
/// module (`--subc`) keeps SIGPIPE ignored, its sockets report a closed peer as an error.
fn quiet_on_closed_stdout() {
    // SAFETY: restores the default disposition of one signal before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("CK_LOG", "warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    if words.first().is_some_and(|w| ["inspect", "units", "session"].contains(w)) {
        quiet_on_closed_stdout();
    }
    let result = match words.as_slice() {
        ["--help"] | ["-h"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        ["--version"] => {
            println!("broca {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        ["inspect", path] => inspect(&PathBuf::from(path)),
        ["inspect", root, harness, session] => inspect_session(&SessionKey::new(root, harness, session)),
        ["units", path] => units(&PathBuf::from(path)),
        ["session", "--help"] => {
            println!("{}", session_cli::USAGE);
            return ExitCode::SUCCESS;
        }
        ["doctor", rest @ ..] => return doctor::main(rest),
        ["session", verb, rest @ ..] if ["export", "import", "locate"].contains(verb) => {
            return session_cli::main(&words[1..]);
        }
        ["session", root, harness, session] => locate(&SessionKey::new(root, harness, session)),
        ["fold"] => fold(0),
        ["fold", "--older-than", secs] => match secs.parse::<u64>() {
            Ok(secs) => fold(secs),
            Err(_) => {
                eprintln!("broca fold: --older-than takes whole seconds");
                return ExitCode::from(2);
            }
        },
        ["unfold", root, harness, session] => unfold(&SessionKey::new(root, harness, session)),
        ["--subc", path] => return serve(Path::new(path)),
        ["--subc"] => {
            eprintln!("broca: --subc needs the path of the daemon's connection file");
            return ExitCode::from(2);
        }
        [] => {
            eprintln!("broca: refusing to start without --subc <connection-file> (see --help)");
            return ExitCode::from(2);
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broca: {e}");
            ExitCode::from(1)
        }
    }
}

fn inspect(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    if path.extension().is_none_or(|e| e != broca::wal::container::SUFFIX) {
        return inspect_wal(path);
    }
    // A fold container: its own header first, then the WAL it seals, read from a copy.
    let (sealed, wal_bytes) =
        broca::wal::container::open(&std::fs::read(path)?).map_err(|e| format!("the container: {e:?}"))?;
    println!("{}", serde_json::json!({"container": sealed}));
    let copy = tempfile::NamedTempFile::new()?;
    std::fs::write(copy.path(), wal_bytes)?;
    inspect_wal(copy.path())
}

/// `broca inspect PROJECT_ROOT HARNESS SESSION`: where the session lives, then its records.
fn inspect_session(key: &SessionKey) -> Result<(), Box<dyn std::error::Error>> {
    locate(key)?;
    let shared = Shared::open(StateRoot::resolve(&RootEnv::from_process(None))?)?;
    let live = shared.root.wal_path(key);
    if live.exists() {
        return inspect(&live);
    }
    match broca::lineage::fold::container_of(&shared, &key.addr()) {
        Some((container, _)) => inspect(&container),
        None => Ok(()),
    }
}

fn inspect_wal(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let header = wal::read_header_of(&wal::FileStorage, path, record::KNOWN_FEATURES)?;
    println!(
        "{}",
        serde_json::json!({"header": {"lineage": broca::session_key::hex(&header.lineage), "incarnation": header.incarnation_string()}})
    );
    wal::read(path, record::KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| -> Result<(), LineageError> {
        let record = match Record::decode(f.payload) {
            Ok(r) => serde_json::to_value(&r).unwrap_or_default(),
            Err(e) => serde_json::json!({"undecodable": e.0}),
        };
        println!("{}", serde_json::json!({"seq": f.seq, "epoch": f.epoch, "offset": f.offset, "record": record}));
        Ok(())
    })?;
    Ok(())
}

fn units(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    for unit in read::control_units(&broca::lineage::reader::Reader::file(path), None, usize::MAX)? {
        println!("{}", serde_json::to_string(&unit)?);
    }
    Ok(())
}

fn locate(key: &SessionKey) -> Result<(), Box<dyn std::error::Error>> {
    let shared = Shared::open(StateRoot::resolve(&RootEnv::from_process(None))?)?;
    let path = shared.wal_path(key);
    // Where it lives here: a live tree, a tombstone left by a move, or nothing.
    let held = broca::moves::where_is(&shared, key).map_err(|r| r.message)?;
    println!(
        "{}",
        serde_json::json!({"addr": key.addr(), "wal": path, "exists": path.exists(), "state": held["state"], "tree": held["tree"], "epoch": held["epoch"]})
    );
    Ok(())
}

/// `broca fold`: one sweep over the state root, now (sessions a running module holds open are
/// skipped by their leases). One JSON line: what was sealed, skipped and failed.
fn fold(older_than_secs: u64) -> Result<(), Box<dyn std::error::Error>> {
    use broca::lineage::fold::{self, FoldPolicy, Folded};
    let shared = Shared::open(StateRoot::resolve(&RootEnv::from_process(None))?)?;
    let tidied = fold::tidy(&shared);
    let policy = FoldPolicy {
        after_idle_ms: older_than_secs.saturating_mul(1000),
        max_per_pass: usize::MAX,
        ..FoldPolicy::default()
    };
    let (mut sealed, mut wal_bytes, mut container_bytes, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut skipped: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for result in fold::sweep(&shared, &policy) {
        match result {
            Ok(Folded::Sealed { wal_bytes: w, container_bytes: c }) => {
                sealed += 1;
                wal_bytes += w;
                container_bytes += c;
            }
            Ok(Folded::Skipped(why)) => *skipped.entry(why).or_default() += 1,
            Err(e) => {
                errors += 1;
                eprintln!("broca fold: {e}");
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({"sealed": sealed, "wal_bytes": wal_bytes, "container_bytes": container_bytes, "skipped": skipped, "errors": errors, "tidied": tidied})
    );
    if errors > 0 {
        return Err(format!("{errors} fold(s) failed").into());
    }
    Ok(())
}

/// `broca unfold`: the session back into its live tree (what any read of it does).
fn unfold(key: &SessionKey) -> Result<(), Box<dyn std::error::Error>> {
    let shared = Shared::open(StateRoot::resolve(&RootEnv::from_process(None))?)?;
    let live = broca::lineage::fold::unfold(&shared, &key.addr(), false)?;
    println!("{}", serde_json::json!({"addr": key.addr(), "unfolded": live.is_some(), "wal": live}));
    Ok(())
}

/// The module id when the daemon does not name one (`SUBC_MODULE_ID`).
const DEFAULT_MODULE_ID: &str = "broca";
/// Shutdown's grace for running turns to reach their step boundary, and then again for their
/// immediate seal: the spec's 10 s grace within a 20 s budget. (The daemon may kill the module
/// sooner; a turn cut that way is sealed as an orphan on the next open.)
const SEAL_WITHIN: Duration = Duration::from_secs(10);

fn serve(conn_file: &Path) -> ExitCode {
    if let Err(e) = broca::held::release_fence() {
        eprintln!("broca: refusing to start: {e}");
        return ExitCode::from(2);
    }
    let module_id = std::env::var(subc_protocol::SUBC_MODULE_ID_ENV)
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| DEFAULT_MODULE_ID.to_owned());
    // `connect` reads the launch nonce first, before anything could start a child process.
    let conn = match subc::connect(conn_file, manifest(&module_id), &module_id) {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("broca: {e}");
            return ExitCode::from(1);
        }
    };
    let root = match StateRoot::resolve(&RootEnv::from_process(Some(conn_file.to_path_buf()))) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("broca: {e}");
            return ExitCode::from(1);
        }
    };
    // A refused broca.jsonc refuses boot (exit 2) before anything is opened or written.
    let config = match BrocaConfig::load(&root) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("broca: refusing to start: {e}");
            return ExitCode::from(2);
        }
    };
    let catalog = Catalog::load_lkg(&root.catalog_path());
    if let Err(e) = &catalog {
        log::warn!("broca: {e}; sends are refused until the catalog poller reaches fusiform or an LKG is seeded");
    }
    let base_url_override = std::env::var("BROCA_PROVIDER_BASE_URL").ok().filter(|u| !u.is_empty());
    // The consumer connection carries every route broca opens to other modules (tools now).
    let consumer = consumer_connection(conn_file, &module_id);
    let mut opts = loop_options();
    opts.code_assist_project = config.code_assist_project.clone();
    // Live step hints go to the bus broca.jsonc names (llm-runner §14.3), if it names one.
    if let Some(bus) = &config.step_events {
        match broca::bus::StepHints::start(bus) {
            Ok(hints) => opts.step_hints = Some(hints),
            Err(e) => {
                eprintln!("broca: cannot start the bus publisher: {e}");
                return ExitCode::from(1);
            }
        }
    }
    // Provider credentials come only from the claustrum vault on the consumer connection.
    opts.credentials =
        consumer.as_ref().map(|c| broca::vault::Credentials::new(Arc::new(broca::vault::SubcVault::new(c.clone()))));
    let mut builder = ModuleBuilder::new(root)
        .config(config)
        .catalog(catalog)
        .base_url_override(base_url_override)
        .vault_routes(consumer.is_some(), vault_on_mock())
        .idle_ttl(IDLE_TTL)
        .loop_options(opts);
    if let Some(consumer) = &consumer {
        builder = builder.tool_plane(Arc::new(ToolPlane::new(consumer.clone())));
    }
    let built = builder.build();
    let Module { ops, hub, registry, held } = match built {
        Ok(m) => m,
        Err(e) => {
            eprintln!("broca: cannot open the state root: {e}");
            return ExitCode::from(1);
        }
    };
    let outbound = conn.outbound();
    let (stopped, _stopped_rx) = crossbeam_channel::unbounded();
    let catalog_health = Arc::new(CatalogHealth::default());
    if let Some(consumer) = &consumer {
        let poller = Poller {
            source: Arc::new(consumer.clone()),
            catalog: Arc::clone(&ops.admission.catalog),
            lkg: ops.admission.lkg.clone(),
            health: Arc::clone(&catalog_health),
            interval: poll_interval(),
            clock: Arc::clone(&ops.registry.shared().clock),
        };
        if let Err(e) = poller.spawn() {
            log::error!("broca: cannot start the catalog poller: {e}");
        }
    } else {
        log::warn!("broca: no consumer connection: the catalog is not polled (serving the LKG only)");
    }
    let classifier = open_classifier(&ops, consumer.as_ref());
    let fold_policy = ops.admission.config.fold.clone();
    let federation =
        Federation::new(conn.hello_ack().machine_id.clone(), ops.admission.config.federation_carriers.clone());
    let server = Server::new(ops, hub, outbound.clone(), stopped)
        .with_federation(federation.clone())
        .with_consumer(consumer)
        .with_catalog_health(catalog_health)
        .with_classifier(classifier);
    // Binds are decided from the daemon's stamps; owner-only operations arrive with the driver
    // surface.
    let running = match conn.start(server, move |bind: &BindRequest| broca::serve::authorize(bind, &federation)) {
        Ok(running) => running,
        Err(e) => {
            eprintln!("broca: cannot start the subc io thread: {e}");
            return ExitCode::from(1);
        }
    };
    broca::subc::sigterm::close_on_sigterm(outbound, "broca");
    // Retained sessions expire and are deleted from now on; a deletion a crash interrupted
    // finishes on the first pass.
    if let Err(e) = registry.start_retention_sweep() {
        eprintln!("broca: cannot start the retention sweep: {e}");
        return ExitCode::from(1);
    }
    // Cold WALs fold into the archive trees; what a cut fold left is tidied first.
    if let Err(e) = registry.start_fold_sweep(fold_policy) {
        eprintln!("broca: cannot start the fold sweep: {e}");
        return ExitCode::from(1);
    }
    // Boot recovery off the startup path: queued sends drain, orphans are sealed.
    let recovering = Arc::clone(&registry);
    let _ = std::thread::Builder::new().name("broca-recover".into()).spawn(move || {
        let opened = recovering.recover();
        if opened > 0 {
            log::info!("broca: reopened {opened} session(s) with queued or unfinished work");
        }
    });
    // Held calls (debug builds under the test marker only): their sessions reopen and their
    // providers' late results are pulled again.
    broca::module::start_held(held, Arc::clone(&registry));
    let end = running.join();
    // The connection is gone: seal what is still running (a graceful `interrupted`, not the
    // crash diagnostic) before the process ends.
    let left = registry.seal_all(SEAL_WITHIN);
    if left > 0 {
        log::warn!("broca: {left} run(s) still running after {SEAL_WITHIN:?}; the next open seals them");
    }
    if end.is_clean() {
        log::info!("broca: exiting cleanly: {end}");
        ExitCode::SUCCESS
    } else {
        eprintln!("broca: {end}");
        ExitCode::from(1)
    }
}

/// The loop's options. Debug builds only (a non-shipping test switch): `BROCA_TEST_TOOL_WAIT_MS`
/// replaces the 120 s default wait for a tool call, so tests can reach a call's bound quickly.
fn loop_options() -> LoopOptions {
    let mut opts = LoopOptions::default();
    if cfg!(debug_assertions) {
        if let Some(ms) = std::env::var("BROCA_TEST_TOOL_WAIT_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
            opts.tool_wait = Duration::from_millis(ms);
        }
    }
    opts
}

/// Debug builds only (a non-shipping test switch): `BROCA_TEST_VAULT_AUTH=1` keeps vault
/// credentials on `BROCA_PROVIDER_BASE_URL` routes, so the e2e rig can check that the mock
/// provider receives the vault's credential. Release builds never read it: a mock route is
/// credential-free there.
fn vault_on_mock() -> bool {
    cfg!(debug_assertions) && std::env::var("BROCA_TEST_VAULT_AUTH").is_ok_and(|v| v == "1")
}

/// The catalog poll interval. Debug builds only (a non-shipping test switch):
/// `BROCA_TEST_CATALOG_POLL_MS` replaces the 30-minute interval.
fn poll_interval() -> Duration {
    if cfg!(debug_assertions) {
        if let Some(ms) = std::env::var("BROCA_TEST_CATALOG_POLL_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
            return Duration::from_millis(ms.max(1));
        }
    }
    POLL_INTERVAL
}

/// broca's second connection, for routes to other modules (tool providers, the claustrum vault
/// and fusiform's catalog), presenting its consumer identity; it refuses reverse requests.
/// Serving goes on without it if it cannot be made (plans then refuse `fetch_unavailable`).
fn consumer_connection(conn_file: &Path, module_id: &str) -> Option<Consumer> {
    let nonce = subc_os::launch_nonce::launch_nonce().ok().flatten().map(|n| n.value().to_owned());
    let identity = nonce.map(|launch_nonce| ConsumerIdentity { module_id: module_id.to_owned(), launch_nonce });
    match Consumer::connect(conn_file, identity) {
        Ok(c) => Some(c),
        Err(e) => {
            log::warn!("broca: no consumer connection: {e}");
            None
        }
    }
}

/// The classifier role's service over `system-one.db` (spec §4b): its holds released, expired
/// batches deleted and pending facts republished before any route is served. `None` (its calls
/// refused, sessions unaffected) when the store cannot be opened.
fn open_classifier(
    ops: &Arc<broca::ops::Ops>,
    consumer: Option<&broca::subc::consumer::Consumer>,
) -> Option<Arc<broca::classify::Classifier>> {
    let shared = ops.registry.shared();
    let deps = broca::classify::service::Deps {
        root: shared.root.path().to_path_buf(),
        catalog: Arc::clone(&ops.admission.catalog),
        bases: ops.admission.config.provider_base_urls.clone(),
        vault: consumer
            .map(|c| Arc::new(broca::vault::SubcVault::new(c.clone())) as Arc<dyn broca::vault::CredentialSource>),
        facts: Arc::clone(&shared.store),
        clock: Arc::clone(&shared.clock),
    };
    match broca::classify::Classifier::open(deps) {
        Ok(classifier) => Some(Arc::new(classifier)),
        Err(e) => {
            log::error!("broca: the classifier role is unavailable: {e}");
            None
        }
    }
}
