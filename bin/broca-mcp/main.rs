//! `broca-mcp`: a thin MCP stdio adapter over broca, so any MCP client can start durable broca
//! runs, watch them, read their transcripts and cancel them. The model is
//! `../shared/spec/agent-protocol.md`'s `saccade-mcp`: each input line is one bounded JSON-RPC
//! message, responses go straight to stdout, the service is connected only when a tool is
//! called, and every decision (admission, idempotency, ownership) stays in broca.
//!
//! Layout: `rpc` (the transport: bounded lines, envelopes, stdout), `tools` (schemas and the
//! mapping onto broca's ops), `wait` (`broca_wait` and its progress stream), `broca` (the
//! consumer connection and session routes), `numbers` (64-bit values as decimal strings).
//!
//! Threads: the main thread reads stdin and answers everything but `tools/call` itself; each
//! tool call runs on its own thread, at most [`MAX_IN_FLIGHT`] at once, so a long
//! `broca_wait` never holds up `ping`, `notifications/cancelled` or other calls.

mod broca;
mod numbers;
mod rpc;
mod tools;
mod wait;

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::rpc::{Incoming, Line, LineReader, Out, RpcError, BUSY, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};

/// Tool calls running at once; one more is refused [`BUSY`].
pub const MAX_IN_FLIGHT: usize = 16;
/// Protocol versions this server speaks, oldest first; the last is offered when a client asks
/// for one it does not know.
pub const PROTOCOL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The first version whose tool results carry `structuredContent`.
const STRUCTURED_SINCE: &str = "2025-06-18";
/// After stdin ends, how long running tool calls get to finish.
const EXIT_GRACE: Duration = Duration::from_secs(5);
const DEFAULT_HARNESS: &str = "broca-mcp";

const HELP: &str = "\
broca-mcp: an MCP server (stdio transport) for broca's durable agent sessions.

USAGE:
    broca-mcp [--subc FILE] [--harness NAME] [--hosts ID,ID,...]

OPTIONS:
    --subc FILE       the subc daemon's connection file (default: $SUBC_CONNECTION_FILE). It is
                      opened when the first tool is called, not at start-up.
    --harness NAME    the harness sessions are bound under (default: broca-mcp). A session is
                      {project_root, harness, session}: the same names under another harness are
                      other sessions.
    --hosts IDS       the broca hosts sessions are placed on, as module ids on this daemon
                      (default: $BROCA_HOSTS, else broca): `broca` here, `fed:<machine>:broca` a
                      peer's through federation. A session goes to the host that holds it
                      (each host is asked), a new one to the host broca's placement rule ranks
                      first (README, Beyond one host).
    -h, --help        this text

Tools: broca_send, broca_wait (streams the run's text as notifications/progress when the call
carries a progressToken), broca_read, broca_status, broca_cancel. A session's project_root
defaults to the directory broca-mcp was started in.

stdout carries only MCP messages (newline-delimited JSON-RPC 2.0, each line at most 1 MiB in).
Logs go to stderr, filtered by CK_LOG (default: warn).
";

struct Config {
    conn_file: Option<PathBuf>,
    harness: String,
    hosts: Vec<String>,
}

fn parse_args() -> Result<Option<Config>, String> {
    let mut conn_file = None;
    let mut harness = DEFAULT_HARNESS.to_string();
    let mut hosts = std::env::var("BROCA_HOSTS").ok().filter(|v| !v.is_empty());
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("-h" | "--help") => return Ok(None),
            Some("--subc") => conn_file = Some(PathBuf::from(args.next().ok_or("--subc needs a file")?)),
            Some("--harness") => {
                let name = args.next().and_then(|a| a.into_string().ok()).filter(|h| !h.trim().is_empty());
                harness = name.ok_or("--harness needs a non-empty name")?;
            }
            Some("--hosts") => hosts = Some(args.next().and_then(|a| a.into_string().ok()).ok_or("--hosts needs ids")?),
            _ => return Err(format!("unknown argument {arg:?} (see --help)")),
        }
    }
    let conn_file =
        conn_file.or_else(|| std::env::var_os("SUBC_CONNECTION_FILE").filter(|v| !v.is_empty()).map(PathBuf::from));
    let hosts: Vec<String> = match hosts {
        Some(list) => list.split(',').map(str::trim).filter(|h| !h.is_empty()).map(str::to_owned).collect(),
        None => vec![broca::MODULE_ID.to_owned()],
    };
    if hosts.is_empty() {
        return Err("--hosts names no host".into());
    }
    Ok(Some(Config { conn_file, harness, hosts }))
}

/// The version to answer `initialize` with: the client's when spoken here, else the newest.
fn negotiate(requested: Option<&str>) -> &'static str {
    let newest = PROTOCOL_VERSIONS[PROTOCOL_VERSIONS.len() - 1];
    requested.and_then(|r| PROTOCOL_VERSIONS.iter().copied().find(|v| *v == r)).unwrap_or(newest)
}

struct Server {
    out: Out,
    broca: Arc<broca::Broca>,
    harness: String,
    default_root: String,
    /// Tool calls in flight, by their request id's JSON text: their cancel flags.
    in_flight: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    structured: Arc<AtomicBool>,
}

impl Server {
    fn handle(&self, incoming: Incoming) {
        match incoming {
            Incoming::Invalid { id, error } => self.out.error(&id, &error),
            Incoming::Response => {
                log::debug!(target: "broca_mcp", "ignoring a response (this server sends no requests)")
            }
            Incoming::Notification { method, params } => self.notification(&method, &params),
            Incoming::Request { id, method, params } => self.request(id, &method, params),
        }
    }

    fn notification(&self, method: &str, params: &Map<String, Value>) {
        match method {
            "notifications/initialized" => log::info!(target: "broca_mcp", "client initialized"),
            "notifications/cancelled" => {
                let Some(id) = params.get("requestId") else { return };
                match self.in_flight.lock().get(&id.to_string()) {
                    Some(flag) => {
                        log::info!(target: "broca_mcp", "request {id} cancelled by the client");
                        flag.store(true, Ordering::Release);
                    }
                    None => log::debug!(target: "broca_mcp", "cancel for {id}, which is not in flight"),
                }
            }
            other => log::debug!(target: "broca_mcp", "ignoring notification {other}"),
        }
    }

    fn request(&self, id: Value, method: &str, params: Map<String, Value>) {
        match method {
            "initialize" => {
                let version = negotiate(params.get("protocolVersion").and_then(Value::as_str));
                self.structured.store(version >= STRUCTURED_SINCE, Ordering::Release);
                log::info!(target: "broca_mcp", "initialize: protocol {version}");
                self.out.result(
                    &id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": {"tools": {"listChanged": false}},
                        "serverInfo": {"name": "broca-mcp", "title": "broca", "version": env!("CARGO_PKG_VERSION")},
                        "instructions": "broca runs durable LLM agent sessions. broca_send starts a run in a \
                            session and returns its run_id; broca_wait waits for it (streaming its text as \
                            progress) and returns the final answer; broca_read pages the transcript; \
                            broca_status and broca_cancel act on a run. Integers in results are decimal strings."
                    }),
                );
            }
            "ping" => self.out.result(&id, json!({})),
            "tools/list" => self.out.result(&id, json!({"tools": tools::list()})),
            "tools/call" => self.tool_call(id, params),
            other => self.out.error(&id, &RpcError::new(METHOD_NOT_FOUND, format!("Method not found: {other}"))),
        }
    }

    fn tool_call(&self, id: Value, mut params: Map<String, Value>) {
        let name = match params.get("name") {
            Some(Value::String(n)) if tools::known(n) => n.clone(),
            Some(Value::String(n)) => {
                return self.out.error(&id, &RpcError::new(INVALID_PARAMS, format!("Unknown tool: {n}")));
            }
            _ => return self.out.error(&id, &RpcError::new(INVALID_PARAMS, "Invalid params: name must be a string")),
        };
        let args = match params.remove("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a,
            Some(_) => {
                return self
                    .out
                    .error(&id, &RpcError::new(INVALID_PARAMS, "Invalid params: arguments must be an object"))
            }
        };
        let token = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
            .cloned();
        let key = id.to_string();
        let cancel = Arc::new(AtomicBool::new(false));
        {
            let mut in_flight = self.in_flight.lock();
            if in_flight.contains_key(&key) {
                drop(in_flight);
                return self
                    .out
                    .error(&id, &RpcError::new(INVALID_REQUEST, "Invalid Request: this id is already in flight"));
            }
            if in_flight.len() >= MAX_IN_FLIGHT {
                drop(in_flight);
                let e = RpcError::new(BUSY, format!("{MAX_IN_FLIGHT} tool calls are already in flight"));
                return self.out.error(&id, &e.with_data(json!({"limit": MAX_IN_FLIGHT})));
            }
            in_flight.insert(key.clone(), Arc::clone(&cancel));
        }
        let (out, broca, in_flight) = (self.out.clone(), Arc::clone(&self.broca), Arc::clone(&self.in_flight));
        let (harness, root, structured) =
            (self.harness.clone(), self.default_root.clone(), self.structured.load(Ordering::Acquire));
        let job = move || {
            let ctx = tools::Context {
                broca: &broca,
                out: &out,
                harness: &harness,
                default_root: &root,
                progress_token: token,
                cancel: &cancel,
                structured,
            };
            let started = Instant::now();
            let outcome = tools::call(&name, &args, &ctx);
            log::debug!(target: "broca_mcp", "{name} took {:?}", started.elapsed());
            in_flight.lock().remove(&key);
            if cancel.load(Ordering::Acquire) {
                return;
            }
            match outcome {
                tools::Outcome::Result(r) => out.result(&id, r),
                tools::Outcome::Error(e) => out.error(&id, &e),
                tools::Outcome::Cancelled => {}
            }
        };
        if let Err(e) = std::thread::Builder::new().name("broca-mcp-call".into()).spawn(job) {
            log::error!(target: "broca_mcp", "cannot start a tool call thread: {e}");
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("CK_LOG", "warn")).init();
    let config = match parse_args() {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broca-mcp: {e}");
            return ExitCode::from(2);
        }
    };
    let default_root = match std::env::current_dir() {
        Ok(dir) => dir.to_string_lossy().into_owned(),
        Err(e) => {
            eprintln!("broca-mcp: cannot read the current directory (the default project root): {e}");
            return ExitCode::from(2);
        }
    };
    if config.conn_file.is_none() {
        log::warn!(target: "broca_mcp", "no --subc and no SUBC_CONNECTION_FILE: tool calls will fail until one is given");
    }
    let server = Server {
        out: Out::new(Box::new(io::stdout())),
        broca: Arc::new(broca::Broca::new(config.conn_file).on_hosts(config.hosts)),
        harness: config.harness,
        default_root,
        in_flight: Arc::new(Mutex::new(HashMap::new())),
        structured: Arc::new(AtomicBool::new(true)),
    };
    let mut lines = LineReader::new(BufReader::new(io::stdin()), rpc::MAX_LINE_BYTES);
    loop {
        match lines.next_line() {
            Ok(Line::Eof) => break,
            Ok(Line::TooLong(bytes)) => {
                let e = RpcError::new(
                    INVALID_REQUEST,
                    format!("Invalid Request: the line exceeds {} bytes", rpc::MAX_LINE_BYTES),
                )
                .with_data(json!({"limit": rpc::MAX_LINE_BYTES, "bytes": bytes}));
                server.out.error(&Value::Null, &e);
            }
            Ok(Line::Text(line)) if line.iter().all(u8::is_ascii_whitespace) => {}
            Ok(Line::Text(line)) => server.handle(rpc::classify(&line)),
            Err(e) => {
                log::warn!(target: "broca_mcp", "stdin: {e}");
                break;
            }
        }
    }
    // The client is gone: waits stop, and running calls get a moment to end.
    for flag in server.in_flight.lock().values() {
        flag.store(true, Ordering::Release);
    }
    let until = Instant::now() + EXIT_GRACE;
    while !server.in_flight.lock().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_version_is_answered_when_spoken_else_the_newest() {
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2024-11-05")), "2024-11-05");
        assert_eq!(negotiate(Some("2099-01-01")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
    }
}
