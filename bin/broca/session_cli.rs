//! `broca session export|import|locate`: moving a session between hosts from the command line
//! (DESIGN §8, `broca::moves`). Each talks to the running broca through the subc daemon, as
//! the host's key-holder (a `direct` caller): the module owns the session's writer, so only it
//! can tombstone or adopt one.
//!
//! broca never takes a path from a caller (docs/security.md): its archives live in the state
//! root's exchange directory. This CLI, run by the operator with the operator's own rights,
//! copies them out (`export --to FILE`) and in (`import --from FILE`), so it needs the state
//! root broca uses (`--state-root`, else resolved as broca resolves it).
//!
//! Exit codes: 0 done, 1 the daemon or broca could not be reached (or did not answer), 2 usage,
//! 3 broca refused (its refusal is printed), 4 the session stayed busy past `--wait`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use broca::moves::{archive, exchange, ADOPT, EXPORT, LOCATE};
use broca::placement::{self, Held};
use broca::session_key::SessionKey;
use broca::state_root::{RootEnv, StateRoot};
use broca::subc::consumer::{CallError, Consumer};
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

pub const USAGE: &str = "\
broca session export --project-root DIR --harness H --session S [--to FILE] [options]
    tombstone the session on this host; its archive is written to broca's exchange directory
    (<state root>/exchange/) and, with --to, copied to FILE (never over an existing file)
broca session import --from FILE [options]
    copy the archive FILE into broca's exchange directory and adopt the session it holds (its
    triple is read from the archive); the hosts must share <state root>/move.key
broca session locate --project-root DIR --harness H --session S [--hosts A,B,...] [options]
    where the session lives: each host's answer and the placement rule's choice

options:
  --subc FILE     the daemon's connection file (else $SUBC_CONNECTION_FILE)
  --module ID     broca's module id on that daemon (default broca; a peer: fed:<machine>:broca)
  --state-root DIR  broca's state root on this host (else $BROCA_STATE_ROOT, $XDG_DATA_HOME/
                  cortexkit/broca, ~/.local/share/cortexkit/broca)
  --wait SECS     how long to retry while the session drains (default 60)
  --json          print the answer as one JSON object";

const EXIT_UNREACHABLE: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_REFUSED: u8 = 3;
const EXIT_BUSY: u8 = 4;
const CALL_TIMEOUT: Duration = Duration::from_secs(40);

#[derive(Default)]
struct Args {
    verb: String,
    root: Option<String>,
    harness: Option<String>,
    session: Option<String>,
    to: Option<PathBuf>,
    from: Option<PathBuf>,
    subc: Option<PathBuf>,
    state_root: Option<PathBuf>,
    module: Option<String>,
    hosts: Vec<String>,
    wait: Duration,
    json: bool,
}

fn parse(words: &[&str]) -> Result<Args, String> {
    let mut args = Args { wait: Duration::from_secs(60), ..Args::default() };
    let (verb, mut rest) = words.split_first().ok_or("a verb: export, import or locate")?;
    args.verb = (*verb).to_owned();
    while let Some((flag, tail)) = rest.split_first() {
        rest = tail;
        if *flag == "--json" {
            args.json = true;
            continue;
        }
        let (value, tail) = rest.split_first().ok_or_else(|| format!("{flag} needs a value"))?;
        rest = tail;
        let value = (*value).to_owned();
        match *flag {
            "--project-root" => args.root = Some(value),
            "--harness" => args.harness = Some(value),
            "--session" => args.session = Some(value),
            "--to" => args.to = Some(absolute(&value)?),
            "--from" => args.from = Some(absolute(&value)?),
            "--subc" => args.subc = Some(PathBuf::from(value)),
            "--state-root" => args.state_root = Some(absolute(&value)?),
            "--module" => args.module = Some(value),
            "--hosts" => args.hosts = value.split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect(),
            "--wait" => args.wait = Duration::from_secs(value.parse().map_err(|_| "--wait takes whole seconds")?),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(args)
}

fn absolute(path: &str) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{path}: {e}"))
}

pub fn main(words: &[&str]) -> ExitCode {
    let args = match parse(words) {
        Ok(a) => a,
        Err(why) => return usage(&why),
    };
    let key = match (&args.root, &args.harness, &args.session) {
        (Some(r), Some(h), Some(s)) => Some(SessionKey::new(r, h, s)),
        _ => None,
    };
    let module = args.module.as_deref().unwrap_or("broca");
    let outcome = match (args.verb.as_str(), key, &args.to, &args.from) {
        ("export", Some(key), to, None) => export(&args, &key, to.as_deref(), module),
        ("import", None, None, Some(from)) => import(&args, from, module),
        ("locate", Some(key), None, None) => locate(&args, &key),
        _ => return usage("see the forms below"),
    };
    match outcome {
        Ok(answer) => {
            if args.json {
                println!("{answer}");
            } else {
                println!("{}", human(&args.verb, &answer));
            }
            ExitCode::SUCCESS
        }
        Err((code, message)) => {
            eprintln!("broca session {}: {message}", args.verb);
            ExitCode::from(code)
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("broca session: {why}\n\n{USAGE}");
    ExitCode::from(EXIT_USAGE)
}

type Failure = (u8, String);

fn connection_file(args: &Args) -> Option<PathBuf> {
    args.subc.clone().or_else(|| std::env::var_os("SUBC_CONNECTION_FILE").map(PathBuf::from))
}

fn connect(args: &Args) -> Result<Consumer, Failure> {
    let file = connection_file(args)
        .ok_or((EXIT_USAGE, "no connection file: give --subc FILE or set SUBC_CONNECTION_FILE".to_owned()))?;
    Consumer::connect(&file, None).map_err(|e| (EXIT_UNREACHABLE, format!("cannot reach the daemon: {e}")))
}

/// One call to `module` on the session's route: its answer, or the refusal body.
fn call(consumer: &Consumer, module: &str, key: &SessionKey, method: &str, params: &Value) -> Result<Value, Failure> {
    let target = RouteTarget::ManagementSurface { module_id: module.to_owned() };
    let identity = BindIdentity::new(key.harness.clone(), key.session.clone());
    let route = consumer
        .open_route_rooted(&target, &identity, Some(&key.project_root), CALL_TIMEOUT)
        .map_err(|e| refusal_or_unreachable(module, e))?;
    let body = json!({"method": method, "params": params}).to_string();
    let answered = consumer.call(route, body.as_bytes(), CALL_TIMEOUT);
    consumer.close_route(route);
    let bytes = answered.map_err(|e| refusal_or_unreachable(module, e))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| (EXIT_UNREACHABLE, format!("{module}: {e}")))?;
    Ok(value.get("result").cloned().unwrap_or(value))
}

fn refusal_or_unreachable(module: &str, e: CallError) -> Failure {
    match e {
        CallError::Module(body) | CallError::RouteOpen(body) => {
            (EXIT_REFUSED, serde_json::to_string(&body).unwrap_or_else(|_| body.message.clone()))
        }
        other => (EXIT_UNREACHABLE, format!("{module}: {other}")),
    }
}

/// [`call`], asked again while broca answers `session_busy` (a session draining for a move),
/// for up to `--wait`.
fn call_retrying(args: &Args, key: &SessionKey, method: &str, params: Value, module: &str) -> Result<Value, Failure> {
    let consumer = connect(args)?;
    let deadline = Instant::now() + args.wait;
    loop {
        match call(&consumer, module, key, method, &params) {
            Err((EXIT_REFUSED, body)) if body.contains("\"session_busy\"") => {
                if Instant::now() >= deadline {
                    return Err((EXIT_BUSY, format!("still busy after {}s: {body}", args.wait.as_secs())));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// `move.export`, then the archive copied out of the exchange directory to `to`.
fn export(args: &Args, key: &SessionKey, to: Option<&Path>, module: &str) -> Result<Value, Failure> {
    let mut answer = call_retrying(args, key, EXPORT, json!({}), module)?;
    let name = answer.get("archive").and_then(Value::as_str).unwrap_or_default().to_owned();
    let archive = exchange_dir(args)?.join(&name);
    if let Some(to) = to {
        let bytes = exchange::read_bounded(&archive, archive::MAX_ARCHIVE_BYTES)
            .map_err(|e| (EXIT_REFUSED, format!("{}: {e}", archive.display())))?;
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to).map_err(|e| {
            (EXIT_REFUSED, format!("{}: {e} (exported; the archive stays at {})", to.display(), archive.display()))
        })?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| (EXIT_REFUSED, format!("{}: {e}", to.display())))?;
    }
    answer["path"] = json!(to.unwrap_or(&archive));
    Ok(answer)
}

/// The archive at `from` copied into the exchange directory under a fresh name, adopted, and
/// the copy removed.
fn import(args: &Args, from: &Path, module: &str) -> Result<Value, Failure> {
    let bytes = exchange::read_bounded(from, archive::MAX_ARCHIVE_BYTES)
        .map_err(|e| (EXIT_REFUSED, format!("{}: {e}", from.display())))?;
    // Only which session's route to ask on: broca checks the archive's seal and every byte.
    let header = archive::peek_header(&bytes).map_err(|e| (EXIT_REFUSED, format!("{}: {e}", from.display())))?;
    let dir = exchange_dir(args)?;
    let name = exchange::import_name(&header.addr);
    exchange::create_new(&dir, &name, &bytes, || {})
        .map_err(|e| (EXIT_REFUSED, format!("cannot copy the archive into {}: {e}", dir.display())))?;
    let adopted = call_retrying(args, &header.key(), ADOPT, json!({"archive": name}), module);
    let _ = std::fs::remove_file(dir.join(&name));
    adopted
}

/// broca's exchange directory on this host.
fn exchange_dir(args: &Args) -> Result<PathBuf, Failure> {
    let root = match &args.state_root {
        Some(root) => StateRoot::at(root),
        None => StateRoot::resolve(&RootEnv::from_process(connection_file(args))),
    };
    let root = root.map_err(|e| (EXIT_USAGE, format!("broca's state root: {e} (give --state-root DIR)")))?;
    exchange::of(&root).map_err(|e| (EXIT_REFUSED, format!("broca's exchange directory: {e}")))
}

/// Every host's `move.locate` and the placement decision.
fn locate(args: &Args, key: &SessionKey) -> Result<Value, Failure> {
    let consumer = connect(args)?;
    let hosts = if args.hosts.is_empty() {
        vec![args.module.clone().unwrap_or_else(|| "broca".to_owned())]
    } else {
        args.hosts.clone()
    };
    let mut answers = serde_json::Map::new();
    let placed = placement::place(&key.addr(), &hosts, |host| {
        let answer = call(&consumer, host, key, LOCATE, &json!({})).map_err(|(_, why)| why)?;
        answers.insert(host.to_owned(), answer.clone());
        Held::from_answer(&answer).ok_or_else(|| format!("an unreadable answer: {answer}"))
    });
    let decision = match placed {
        Ok(p) => json!({"host": p.host(), "existing": matches!(p, placement::Placed::Owner(_))}),
        Err(e) => json!({"error": {"code": e.code(), "message": e.to_string()}}),
    };
    Ok(json!({"session_ref": key.addr(), "hosts": answers, "placement": decision}))
}

fn human(verb: &str, answer: &Value) -> String {
    let field = |k: &str| answer.get(k).map(|v| v.to_string().trim_matches('"').to_owned()).unwrap_or_default();
    match verb {
        "export" => format!(
            "exported {} (epoch {}, {} WAL bytes) to {}; this host now refuses its sends",
            field("session_ref"),
            field("epoch"),
            field("wal_bytes"),
            field("path")
        ),
        "import" if answer.get("adopted") == Some(&Value::Bool(false)) => {
            format!("{} was already adopted here (epoch {})", field("session_ref"), field("epoch"))
        }
        "import" => format!("adopted {} at epoch {}", field("session_ref"), field("epoch")),
        _ => serde_json::to_string_pretty(answer).unwrap_or_default(),
    }
}
