//! `broca-mock fed`: a stand-in for the CortexKit federation module (`callosum`), enough of it
//! to run broca on two real daemons in one test. Two processes, one per daemon, each launched by
//! its daemon as the reserved module `callosum`:
//!
//! ```text
//! broca-mock fed --subc FILE --listen PORT_FILE --export MODULE… [--expose-root PREFIX]… [--log JSONL]
//! broca-mock fed --subc FILE --peer PORT_FILE [--log JSONL]
//! ```
//!
//! - The **serving side** (`--listen`, [`serve`]) listens on `127.0.0.1:0`, publishes its port in
//!   PORT_FILE (tmp + rename), and for each link announces its daemon's machine id and each
//!   exported module's manifest as its daemon's `catalog.list` shows it. Every route the peer
//!   relays becomes an ordinary route on its own daemon, opened over a consumer connection that
//!   presents `callosum`'s launch nonce (so the target sees `reserved:callosum`), with the
//!   origin's bind identity, project root, role versions and consumer capabilities, no scope,
//!   and `admission_facts {"federation": {"peer": <origin machine id>, "principal": <origin
//!   principal>}}`. The serving side stamps that bind itself from what the link says; it never
//!   opens a module it does not export, and refuses a route whose origin root is not under one of
//!   the `--expose-root` prefixes (`fed_root_not_exposed`; none given: every root is refused).
//! - The **origin side** (`--peer`, [`origin`]) dials the link, and for each exported module
//!   registers a second module connection on its own daemon as `fed:<peer machine id>:<module>`
//!   (same launch nonce; the daemon's config gives `callosum` `"reserved_prefixes": ["fed:"]`),
//!   presenting the re-exported manifest. Binds, requests (unary and subscriptions), CANCELs and
//!   route closes go over the link; answers, stream frames and the serving side's route closes
//!   come back and are written to the origin route. When the link drops, every open request is
//!   answered `fed_link_lost`, every relayed route gets its GOODBYE, the `fed:…` registrations
//!   end (new opens get the daemon's `unknown_module`), and the link is dialed again with backoff
//!   ([`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`]).
//!
//! # The link (TCP loopback, [`link`])
//!
//! Frames: `u32 LE len` (the bytes after it), then `u8 kind`, `u64 LE rid`, `u64 LE corr`, then
//! the body (`len - 17` bytes, at most [`link::MAX_BODY`]). `rid` names a relayed route (minted
//! by the origin side per link), `corr` the origin route's request. Bodies of requests and
//! answers are relayed byte for byte; the link parses only its own JSON bodies.
//!
//! | kind | dir | rid/corr | body |
//! |---|---|---|---|
//! | 0 `ping` | both | 0/0 | none; sent every [`link::HEARTBEAT`] a side has nothing else to send |
//! | 1 `hello` | A→B, then B→A | 0/0 | `{"v":1,"machine_id"}`; B adds `"exports":[{"module","manifest"}]` |
//! | 2 `bind` | A→B | rid/0 | [`link::Bind`]: module, target, harness, session, root, principal, … |
//! | 3 `request`, 4 `subscribe` | A→B | rid/corr | the request body |
//! | 5 `cancel` | A→B | rid/corr | none |
//! | 6 `close` | A→B | rid/0 | none: the origin route is gone |
//! | 7 `response`, 8 `error`, 9 `stream_data`, 10 `stream_end`, 12 `push` | B→A | rid/corr | as sent |
//! | 11 `closed` | B→A | rid/0 | `{"code","message"}`: the serving side's route is gone |
//!
//! A side silent for [`link::SILENCE`] (no frame, not even a ping) is a lost link. Anything
//! undecodable on the link ends the link; nothing from the link or a daemon can panic either
//! process.
//!
//! # Bounds (each with a typed answer)
//!
//! Per link: [`MAX_ROUTES`] relayed routes (an origin bind past it is refused `fed_busy`),
//! [`MAX_IN_FLIGHT`] open requests (`fed_busy`), [`link::QUEUE_BYTES`] of request and stream
//! bytes waiting for the link socket (a request: `fed_busy`; a stream frame: the stream ends
//! `fed_stream_overrun` and the module gets a CANCEL), [`MAX_QUEUED_PER_ROUTE`] requests waiting
//! for the serving side's `route.open` (`fed_busy`), [`MAX_EXPORTS`] exports; the origin route's
//! own stream budget (`Outbound`'s) ends a stream `fed_stream_overrun` too. The serving side
//! serves at most [`MAX_LINKS`] links at once.
//!
//! Not relayed: reverse requests (the serving side answers them `reverse_request_unhandled`),
//! scopes (the relayed route has none), frame flags other than SUBSCRIPTION.

pub mod daemon;
pub mod link;
pub mod origin;
pub mod serve;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use broca::subc::{self, health_ok, BindRequest, ControlRequest, Handler, Outbound, Route};
use serde_json::json;
use subc_protocol::{ErrorBody, Flags, Principal};

/// The module id when the daemon names none.
pub const DEFAULT_MODULE_ID: &str = "callosum";
/// The module-id prefix of re-exported modules: `fed:<peer machine id>:<module>`.
pub const FED_PREFIX: &str = "fed:";
/// Relayed routes per link.
pub const MAX_ROUTES: usize = 1024;
/// Open relayed requests per link.
pub const MAX_IN_FLIGHT: usize = 4096;
/// Requests one relayed route may have waiting for its `route.open` on the serving side.
pub const MAX_QUEUED_PER_ROUTE: usize = 64;
/// Modules one serving side exports.
pub const MAX_EXPORTS: usize = 16;
/// Links one serving side serves at once.
pub const MAX_LINKS: usize = 4;
/// The origin side's dial backoff.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The error codes this stand-in answers with.
pub mod code {
    pub const LINK_LOST: &str = "fed_link_lost";
    pub const BUSY: &str = "fed_busy";
    pub const ROOT_NOT_EXPOSED: &str = "fed_root_not_exposed";
    pub const STREAM_OVERRUN: &str = "fed_stream_overrun";
    pub const ROUTE_CLOSED: &str = "fed_route_closed";
    pub const UNKNOWN_ROUTE: &str = "fed_unknown_route";
    pub const NOT_EXPORTED: &str = "fed_not_exported";
    pub const BAD_ERROR: &str = "fed_bad_error";
    pub const NO_ROUTES: &str = "fed_no_routes";
    pub const CANCELLED: &str = "cancelled";
}

const USAGE: &str = "usage: broca-mock fed --subc FILE (--listen PORT_FILE [--export MODULE]... \
[--expose-root PREFIX]... | --peer PORT_FILE) [--log JSONL]";

/// Which side this process is.
#[derive(Debug, PartialEq)]
pub enum Side {
    Serve { port_file: PathBuf, exports: Vec<String>, expose_roots: Vec<PathBuf> },
    Origin { port_file: PathBuf },
}

#[derive(Debug, PartialEq)]
pub struct Args {
    pub conn_file: PathBuf,
    pub side: Side,
    pub log: Option<PathBuf>,
}

pub fn parse(args: &[String]) -> Result<Args, String> {
    let (mut conn, mut listen, mut peer, mut log) = (None, None, None, None);
    let (mut exports, mut roots) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--subc" => conn = Some(PathBuf::from(value()?)),
            "--listen" => listen = Some(PathBuf::from(value()?)),
            "--peer" => peer = Some(PathBuf::from(value()?)),
            "--export" => exports.push(value()?),
            "--expose-root" => roots.push(PathBuf::from(value()?)),
            "--log" => log = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let conn_file = conn.ok_or("needs --subc CONNECTION_FILE")?;
    let side = match (listen, peer) {
        (Some(port_file), None) => {
            if exports.len() > MAX_EXPORTS {
                return Err(format!("at most {MAX_EXPORTS} --export"));
            }
            Side::Serve { port_file, exports, expose_roots: roots }
        }
        (None, Some(port_file)) if exports.is_empty() && roots.is_empty() => Side::Origin { port_file },
        (None, Some(_)) => return Err("--export and --expose-root are for the serving side (--listen)".into()),
        _ => return Err("needs exactly one of --listen and --peer".into()),
    };
    Ok(Args { conn_file, side, log })
}

/// Whether `id` looks like a daemon machine id (hex digits; the daemon's are 32).
pub fn is_machine_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A principal as the role contract spells it; an absent one is `unverified`.
pub fn spell(principal: Option<&Principal>) -> String {
    match principal {
        Some(Principal::Reserved { module_id }) => format!("reserved:{module_id}"),
        Some(Principal::Direct) => "direct".into(),
        Some(Principal::Unverified) | None => "unverified".into(),
    }
}

/// Doubling waits between `BACKOFF_MIN` and `BACKOFF_MAX`.
pub struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Backoff {
        Backoff(BACKOFF_MIN)
    }
    pub fn reset(&mut self) {
        self.0 = BACKOFF_MIN;
    }
    /// The wait to take now; the next one is twice as long (bounded).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        wait
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

/// Writes `port` to `path` atomically (a temporary file renamed over it).
pub fn write_port_file(path: &Path, port: u16) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    fs::write(&tmp, format!("{port}\n"))?;
    fs::rename(&tmp, path)
}

/// The port in a port file, if it holds one.
pub fn read_port_file(path: &Path) -> Option<u16> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Appends one JSON line to the `--log` file (best effort: a test reads it, nothing depends on it).
pub fn log_line(path: Option<&Path>, line: &serde_json::Value) {
    let Some(path) = path else { return };
    let written = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        log::warn!("cannot append to {}: {e}", path.display());
    }
}

/// The `callosum` registration itself: it serves no routes, answers health checks, and ends the
/// process when the daemon ends it.
struct Registration {
    outbound: Outbound,
}

impl Handler for Registration {
    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, _body: Vec<u8>) {
        let _ = self.outbound.error(route, corr, &ErrorBody::new(code::NO_ROUTES, "callosum serves no routes"));
    }
    fn on_cancel(&mut self, _route: Route, _corr: u64) {}
    fn on_route_closed(&mut self, _route: Route) {}
    fn on_control(&mut self, request: ControlRequest) {
        if let ControlRequest::HealthCheck { corr } = request {
            let _ = self.outbound.health(corr, health_ok(json!({})));
        }
    }
    fn on_shutdown(&mut self) {}
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("broca-mock fed: {message}");
    ExitCode::from(1)
}

/// `broca-mock fed …` (the daemon appends `--subc <file>`).
pub fn main(args: &[String]) -> ExitCode {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("broca-mock fed: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let module_id = std::env::var(subc_protocol::SUBC_MODULE_ID_ENV)
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| DEFAULT_MODULE_ID.to_owned());
    let manifest = subc_protocol::manifest::ModuleManifest::builder(&module_id, env!("CARGO_PKG_VERSION")).build();
    // Reads (and caches) the launch nonce first, before any thread exists.
    let conn = match subc::connect(&args.conn_file, manifest, &module_id) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let machine_id = match conn.hello_ack().machine_id.clone() {
        Some(id) if is_machine_id(&id) => id,
        Some(id) => return fail(format!("the daemon's machine id {id:?} is not hex")),
        None => return fail("the daemon names no machine id (boot it with a machine id path)"),
    };
    let nonce = match subc_os::launch_nonce::launch_nonce() {
        Ok(Some(n)) => n.value().to_owned(),
        Ok(None) => return fail("no launch nonce (callosum must be launched by its daemon)"),
        Err(e) => return fail(format!("the launch nonce: {e}")),
    };
    let outbound = conn.outbound();
    let running = match conn.start(Registration { outbound }, |_: &BindRequest| {
        Err(ErrorBody::new(code::NO_ROUTES, "callosum serves no routes"))
    }) {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the subc io thread: {e}")),
    };
    let log = args.log.clone();
    let started = match args.side {
        Side::Serve { port_file, exports, expose_roots } => {
            let opts = serve::Options {
                conn_file: args.conn_file.clone(),
                port_file,
                exports,
                expose_roots: expose_roots.iter().map(|p| fs::canonicalize(p).unwrap_or_else(|_| p.clone())).collect(),
                log,
                module_id: module_id.clone(),
                nonce,
                machine_id: machine_id.clone(),
            };
            std::thread::Builder::new().name("fed-serve".into()).spawn(move || serve::run(opts))
        }
        Side::Origin { port_file } => {
            let opts =
                origin::Options { conn_file: args.conn_file.clone(), port_file, machine_id: machine_id.clone(), log };
            std::thread::Builder::new().name("fed-origin".into()).spawn(move || origin::run(opts))
        }
    };
    if let Err(e) = started {
        return fail(format!("cannot start the link thread: {e}"));
    }
    log::info!("callosum stand-in {module_id} on machine {machine_id}");
    // The process lives as long as its registration: the daemon's GOODBYE or EOF ends it.
    let end = running.join();
    if end.is_clean() {
        ExitCode::SUCCESS
    } else {
        fail(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_sides_are_told_apart_and_mixed_flags_refused() {
        let serve = parse(&args(&["--listen", "p", "--export", "broca", "--expose-root", "/tmp", "--subc", "c"]));
        assert_eq!(
            serve.unwrap().side,
            Side::Serve { port_file: "p".into(), exports: vec!["broca".into()], expose_roots: vec!["/tmp".into()] }
        );
        assert_eq!(parse(&args(&["--peer", "p", "--subc", "c"])).unwrap().side, Side::Origin { port_file: "p".into() });
        assert!(parse(&args(&["--peer", "p", "--export", "x", "--subc", "c"])).is_err());
        assert!(parse(&args(&["--peer", "p", "--listen", "q", "--subc", "c"])).is_err());
        assert!(parse(&args(&["--peer", "p"])).is_err());
        assert!(parse(&args(&["--peer"])).is_err());
    }

    #[test]
    fn backoff_doubles_to_its_bound() {
        let mut b = Backoff::new();
        let waits: Vec<u128> = (0..7).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_wait(), BACKOFF_MIN);
    }

    #[test]
    fn machine_ids_are_hex() {
        assert!(is_machine_id("0123456789abcdef0123456789abcdef"));
        assert!(!is_machine_id(""));
        assert!(!is_machine_id("zz"));
        assert!(!is_machine_id(&"a".repeat(65)));
    }
}
