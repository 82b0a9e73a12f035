//! `broca`: the subc module binary. `broca --subc <connection-file>` serves the module connection
//! (started that way by the subc daemon); the other commands are operator tools on the lineage core.
//!
//! Serving today is the management surface's skeleton: `role.describe` and `health.check`; every
//! other method is refused `unknown_method`. Exit 0 after the daemon's GOODBYE (or EOF, or
//! SIGTERM), 1 when the connection could not be made or ended abnormally, 2 for usage errors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use broca::lineage::read;
use broca::lineage::{LineageError, Shared};
use broca::record::{self, Record};
use broca::session_key::SessionKey;
use broca::state_root::{RootEnv, StateRoot};
use broca::subc::{self, BindRequest, ControlRequest, Handler, Outbound, Route};
use broca::wal::{self, ScannedFrame};
use broca::wire::Refusal;
use cortexkit_role_llm_runner::describe::{Major, RoleDescribe};
use subc_protocol::manifest::{
    CapabilityDeclarations, Concurrency, IdentityScope, ManagementOperation, ManagementOperationKind, ModuleManifest,
    ProviderRole,
};
use subc_protocol::{ErrorBody, Flags};

const USAGE: &str = "\
broca: durable agentic LLM loops (a CortexKit subc module)

usage:
  broca --subc CONNECTION_FILE   serve as the subc module (the daemon starts broca this way)
  broca inspect WAL              print a WAL's header and records, one JSON object per line
  broca units WAL                print the durable control units of a WAL, one per line
  broca session PROJECT_ROOT HARNESS SESSION
                                 print the session's address and WAL path under the state root
  broca --help | --version

The state root is BROCA_STATE_ROOT, else $XDG_DATA_HOME/cortexkit/broca, else
~/.local/share/cortexkit/broca. Logs go to stderr, filtered by CK_LOG (default: warn).

exit codes: 0 ok, 1 the WAL, state root or subc connection failed, 2 usage";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("CK_LOG", "warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
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
        ["units", path] => units(&PathBuf::from(path)),
        ["session", root, harness, session] => locate(&SessionKey::new(root, harness, session)),
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
    let header = wal::read_header_of(path, record::KNOWN_FEATURES)?;
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
    for unit in read::control_units(path, None, usize::MAX)? {
        println!("{}", serde_json::to_string(&unit)?);
    }
    Ok(())
}

fn locate(key: &SessionKey) -> Result<(), Box<dyn std::error::Error>> {
    let shared = Shared::open(StateRoot::resolve(&RootEnv::from_process(None))?)?;
    let path = shared.wal_path(key);
    println!("{}", serde_json::json!({"addr": key.addr(), "wal": path, "exists": path.exists()}));
    Ok(())
}

/// The module id when the daemon does not name one (`SUBC_MODULE_ID`).
const DEFAULT_MODULE_ID: &str = "broca";
/// The management operations served, in the order `health.check` reports them.
const MANAGEMENT_OPS: &[&str] = &["role.describe"];

static SIGTERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    SIGTERM.store(true, Ordering::SeqCst);
}

fn serve(conn_file: &Path) -> ExitCode {
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
    let outbound = conn.outbound();
    let handler = Serve { outbound: outbound.clone(), describe: describe_reply(), counts: [0; MANAGEMENT_OPS.len()] };
    // Route binds: the management surface serves only build-level answers so far, so every
    // daemon-stamped caller is admitted; per-session authorization arrives with the session ops.
    let running = match conn.start(handler, |_: &BindRequest| Ok(())) {
        Ok(running) => running,
        Err(e) => {
            eprintln!("broca: cannot start the subc io thread: {e}");
            return ExitCode::from(1);
        }
    };
    watch_sigterm(outbound);
    let end = running.join();
    if end.is_clean() {
        log::info!("broca: exiting cleanly: {end}");
        ExitCode::SUCCESS
    } else {
        eprintln!("broca: {end}");
        ExitCode::from(1)
    }
}

/// On SIGTERM, end the connection in order (GOODBYE, flush, half-close), then exit 0.
fn watch_sigterm(outbound: Outbound) {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t);
    }
    let watcher = std::thread::Builder::new().name("sigterm".into()).spawn(move || loop {
        if SIGTERM.load(Ordering::SeqCst) {
            log::info!("broca: SIGTERM; closing the subc connection");
            outbound.shutdown();
            return;
        }
        if outbound.is_closed() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    if let Err(e) = watcher {
        log::warn!("broca: no SIGTERM watcher: {e}");
    }
}

/// The module manifest: a `management_surface` claiming `llm-runner/v1`.
fn manifest(module_id: &str) -> ModuleManifest {
    let operations = MANAGEMENT_OPS
        .iter()
        .map(|name| ManagementOperation {
            name: (*name).to_owned(),
            kind: ManagementOperationKind::Query,
            description: None,
        })
        .collect();
    ModuleManifest::builder(module_id, env!("CARGO_PKG_VERSION"))
        .provides(vec![ProviderRole::ManagementSurface {
            operations,
            config_schema: serde_json::json!({"type": "object"}),
            observability: Vec::new(),
            identity_scope: vec![IdentityScope::Session],
            concurrency: Concurrency::ModuleManaged,
        }])
        .capabilities(Some(CapabilityDeclarations {
            provides: vec![cortexkit_role_llm_runner::PROVIDES.to_owned()],
            requires: Vec::new(),
            must_never_reach: Vec::new(),
        }))
        .build()
}

/// `{"result": <role.describe answer>}`: the build's major, listing only the ops served.
fn describe_reply() -> Vec<u8> {
    let ops = MANAGEMENT_OPS.iter().map(|op| (*op).to_owned()).collect();
    let describe = RoleDescribe::new(
        vec![Major::new(cortexkit_role_llm_runner::PROVIDES, ops, "alpha")],
        env!("CARGO_PKG_VERSION"),
    )
    .with_capabilities(Vec::new())
    .with_session_capabilities_from(cortexkit_role_llm_runner::capabilities::source::ADMISSION);
    cortexkit_role_llm_runner::wire::reply_body(&describe).expect("role.describe serializes")
}

/// The io thread's handler: answers the build-level ops inline (they are constant and cheap).
struct Serve {
    outbound: Outbound,
    describe: Vec<u8>,
    /// Served requests per entry of `MANAGEMENT_OPS`, for `health.check`.
    counts: [u64; MANAGEMENT_OPS.len()],
}

#[derive(serde::Deserialize)]
struct Envelope {
    method: String,
}

impl Handler for Serve {
    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        let sent = match serde_json::from_slice::<Envelope>(&body) {
            Err(e) => {
                let message = format!("a request is {{\"method\", \"params\"}}: {e}");
                let refusal = Refusal::new("invalid_params", message, Some(broca::detail! {"field" => "method"}));
                self.outbound.refuse(route, corr, &refusal)
            }
            Ok(Envelope { method }) if method == "role.describe" => {
                self.counts[0] += 1;
                self.outbound.reply(route, corr, self.describe.clone())
            }
            Ok(Envelope { method }) => {
                let error = ErrorBody::new("unknown_method", format!("unknown method {method:?}"))
                    .with_detail(serde_json::json!({"method": method}));
                self.outbound.error(route, corr, &error)
            }
        };
        if let Err(e) = sent {
            log::warn!("broca: answering {route} corr {corr}: {e}");
        }
    }

    fn on_cancel(&mut self, _route: Route, _corr: u64) {
        // Every request is answered before the next frame is read, so none is left to cancel.
    }

    fn on_route_closed(&mut self, route: Route) {
        log::debug!("broca: route {route} closed");
    }

    fn on_control(&mut self, request: ControlRequest) {
        match request {
            ControlRequest::HealthCheck { corr } => {
                let ops: serde_json::Map<String, serde_json::Value> =
                    MANAGEMENT_OPS.iter().zip(self.counts).map(|(op, n)| ((*op).to_owned(), n.into())).collect();
                let report = subc::health_ok(serde_json::json!({"management_ops": ops}));
                if let Err(e) = self.outbound.health(corr, report) {
                    log::warn!("broca: answering health.check: {e}");
                }
            }
            ControlRequest::Draining { reason, deadline_ms } => {
                log::info!("broca: subc is draining this module ({reason:?}, deadline {deadline_ms} ms)");
            }
            other => log::debug!("broca: ignoring control request {other:?}"),
        }
    }

    fn on_shutdown(&mut self) {
        log::info!("broca: the subc connection is ending");
    }
}
