//! `broca-mock`: the scripted test double. Without `--subc` it is the model-provider server
//! (every wire family broca speaks: SSE, and Bedrock's AWS event stream; the script format and the
//! control endpoint are documented in [`mock`], `mock/model/src/lib.rs`). With `--subc <connection-file>`
//! it is a subc module serving `tool-provider/v1` (the tool script, the call log and the
//! built-in tools are documented in [`tools`], `mock/tools/src/lib.rs`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use broca_mock::{fed, fusiform, mock, relay, tools, vault};
use mock::{MockServer, Script};
use tools::script::{ScopeClass, ToolScript};

const USAGE: &str = "\
usage: broca-mock [--bind ADDR] [--script FILE] [--tls-ca FILE] [--classify-log PATH] [--until-stdin-eof]
       broca-mock [--tools FILE] [--call-log PATH] [--call-log-fsync] [--keepalive-ms N]
                  --subc CONNECTION_FILE
       broca-mock --fusiform-script FILE [--request-log PATH] --subc CONNECTION_FILE
       broca-mock calls --call-log PATH [--json] [--at-most-once]
       broca-mock catalog [--tools FILE] [--preset NAME] [--scope unscoped|head|worker|ephemeral]

Model-provider mode (no --subc): serves scripted model-provider streams (Anthropic Messages,
OpenAI Chat Completions, OpenAI Responses) until killed. Once listening it prints one line to
stdout:
    BROCA_MOCK_URL=http://127.0.0.1:<port>
Point a route's base URL at <url>/v1 (lane \"default\") or <url>/lane/<name>/v1.

  --bind ADDR          listen address (default 127.0.0.1:0, an ephemeral port)
  --script FILE        a JSON script queued on the default lane
  --tls-ca FILE        serve HTTPS (BROCA_MOCK_URL=https://...) with a certificate generated at
                       start, and write the root that signed it to FILE (PEM) for the client
                       to trust explicitly (debug broca builds: BROCA_TEST_PROVIDER_CA=FILE)
  --classify-log PATH  append every classifier provider call (POST /v1/systemone, Workers AI's
                       /client/v4/accounts/<id>/ai/run/@cf/cloudflare/<model>) as a JSON line
                       {n, provider, key, status, at_ms}
  --until-stdin-eof    exit when stdin reaches end of file

Control endpoint: POST /_mock/lanes/<lane>/script, GET /_mock/lanes/<lane>/requests,
DELETE /_mock/lanes/<lane>, GET /_mock/health; the classifier stand-in under /_mock/classify/
(mock/model/src/classify.rs).

Vault mode: `broca-mock claustrum --vault FILE [--vault-log PATH] --subc FILE` serves a scripted
claustrum vault (credential.get_scoped, credential.get, credential.report_auth_failure) as the
subc module `claustrum`; see mock/modules/src/vault/mod.rs.

Relay mode: `broca-mock relay [--target MODULE] --subc FILE` relays every session request it is
sent to MODULE's management surface (default broca) under its own attested principal
(reserved:<its module id>), so a test can call broca as two distinct owners; see
mock/modules/src/relay.rs.

Federation mode: `broca-mock fed --subc FILE (--listen PORT_FILE --export MODULE... [--expose-root
PREFIX]... | --peer PORT_FILE) [--log JSONL]` stands in for the federation module (callosum): the
--listen side exports its daemon's modules over a TCP link, the --peer side re-exports them on its
own daemon as fed:<peer machine id>:<module>; see mock/fed/src/lib.rs.

Tool-provider mode (--subc, as the subc daemon starts modules): registers with the daemon named
by the connection file as SUBC_MODULE_ID (default broca-mock-tools) and serves tool-provider/v1:
role.describe, tool.catalog and scripted tool calls (results, delays with keepalives, refusals,
malformed answers, oversize results, calls that never answer, CANCEL).

  --tools FILE         the tool script (JSONC; format in mock/tools/src/lib.rs); without
                       it the built-in tools: echo, sleep, fail, big, hang, counter, whoami
  --call-log PATH      append every call, cancel, end and role op as a JSON line (default
                       $BROCA_MOCK_CALL_LOG; without either, calls are counted in memory only)
  --call-log-fsync     fsync each line too (lines are always written before the reply)
  --keepalive-ms N     the keepalive period (1..=30000), over the script's
  --subc FILE          the daemon's connection file

Fusiform mode (--fusiform-script with --subc): registers as SUBC_MODULE_ID (default fusiform) and
serves a scripted, paged catalog.get (format in mock/modules/src/fusiform.rs).

  --fusiform-script FILE  the catalog script (JSON), re-read on every request
  --request-log PATH      append every catalog.get request and its answer as a JSON line

calls: totals a call log: per key (call_key, else tool + canonical arguments) how many times the
call ran and was cancelled. --json prints one JSON object; --at-most-once exits 1 when any call
ran more than once.

catalog: prints the tool.catalog answer a script gives for a preset and a route scope.

Logs go to stderr, filtered by CK_LOG (default: warn).
Exit codes: 0 ok, 1 failure (or a call ran twice, with --at-most-once), 2 usage.";

/// What the command line asks for.
#[derive(Debug)]
enum Command {
    Http(HttpArgs),
    Tools(ToolArgs),
    Fusiform(fusiform::Options),
    Calls { call_log: PathBuf, json: bool, at_most_once: bool },
    Catalog { tools: Option<PathBuf>, preset: Option<String>, scope: ScopeClass },
    Help,
}

#[derive(Debug)]
struct HttpArgs {
    bind: String,
    script: Option<String>,
    until_stdin_eof: bool,
    tls_ca: Option<PathBuf>,
    classify_log: Option<PathBuf>,
}

#[derive(Debug)]
struct ToolArgs {
    conn_file: PathBuf,
    tools: Option<PathBuf>,
    call_log: Option<PathBuf>,
    fsync: bool,
    keepalive_ms: Option<u64>,
}

fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str, what: &str) -> Result<String, String> {
    it.next().cloned().ok_or_else(|| format!("{flag} needs {what}"))
}

fn parse_args(args: &[String]) -> Result<Command, String> {
    match args.first().map(String::as_str) {
        Some("calls") => return parse_calls(&args[1..]),
        Some("catalog") => return parse_catalog(&args[1..]),
        _ => {}
    }
    let mut http =
        HttpArgs { bind: "127.0.0.1:0".into(), script: None, until_stdin_eof: false, tls_ca: None, classify_log: None };
    let mut http_flag = None;
    let (mut subc, mut tools, mut call_log, mut fsync, mut keepalive_ms) = (None, None, None, false, None);
    let mut tool_flag = None;
    let (mut fusiform_script, mut request_log) = (None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--tls-ca" => {
                http.tls_ca = Some(PathBuf::from(value(&mut it, arg, "a file")?));
                http_flag = Some(arg);
            }
            "--bind" => {
                http.bind = value(&mut it, arg, "an address")?;
                http_flag = Some(arg);
            }
            "--script" => {
                http.script = Some(value(&mut it, arg, "a file")?);
                http_flag = Some(arg);
            }
            "--classify-log" => {
                http.classify_log = Some(PathBuf::from(value(&mut it, arg, "a path")?));
                http_flag = Some(arg);
            }
            "--until-stdin-eof" => {
                http.until_stdin_eof = true;
                http_flag = Some(arg);
            }
            "--subc" => subc = Some(PathBuf::from(value(&mut it, arg, "the daemon's connection file")?)),
            "--tools" => {
                tools = Some(PathBuf::from(value(&mut it, arg, "a file")?));
                tool_flag = Some(arg);
            }
            "--call-log" => {
                call_log = Some(PathBuf::from(value(&mut it, arg, "a path")?));
                tool_flag = Some(arg);
            }
            "--call-log-fsync" => {
                fsync = true;
                tool_flag = Some(arg);
            }
            "--keepalive-ms" => {
                let n = value(&mut it, arg, "milliseconds")?;
                keepalive_ms = Some(n.parse().map_err(|_| format!("--keepalive-ms {n:?} is not a number"))?);
                tool_flag = Some(arg);
            }
            "--fusiform-script" => fusiform_script = Some(PathBuf::from(value(&mut it, arg, "a file")?)),
            "--request-log" => request_log = Some(PathBuf::from(value(&mut it, arg, "a path")?)),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if let Some(script) = fusiform_script {
        return match (subc, http_flag.or(tool_flag)) {
            (Some(conn_file), None) => Ok(Command::Fusiform(fusiform::Options { conn_file, script, request_log })),
            (None, _) => Err("--fusiform-script needs --subc".into()),
            (_, Some(flag)) => Err(format!("{flag} is not for the fusiform mode")),
        };
    }
    if request_log.is_some() {
        return Err("--request-log is for the fusiform mode (--fusiform-script)".into());
    }
    match (subc, http_flag, tool_flag) {
        (Some(_), Some(flag), _) => Err(format!("{flag} is for the model-provider mode, not with --subc")),
        (Some(conn_file), None, _) => {
            let call_log = call_log.or_else(|| {
                std::env::var_os(tools::call_log::CALL_LOG_ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
            });
            Ok(Command::Tools(ToolArgs { conn_file, tools, call_log, fsync, keepalive_ms }))
        }
        (None, _, Some(flag)) => Err(format!("{flag} needs --subc (the tool-provider mode)")),
        (None, _, None) => Ok(Command::Http(http)),
    }
}

fn parse_calls(args: &[String]) -> Result<Command, String> {
    let (mut call_log, mut json, mut at_most_once) = (None, false, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--call-log" => call_log = Some(PathBuf::from(value(&mut it, arg, "a path")?)),
            "--json" => json = true,
            "--at-most-once" => at_most_once = true,
            other => return Err(format!("calls: unknown argument `{other}`")),
        }
    }
    let call_log = call_log
        .or_else(|| std::env::var_os(tools::call_log::CALL_LOG_ENV).filter(|v| !v.is_empty()).map(PathBuf::from))
        .ok_or("calls needs --call-log PATH")?;
    Ok(Command::Calls { call_log, json, at_most_once })
}

fn parse_catalog(args: &[String]) -> Result<Command, String> {
    let (mut tools, mut preset, mut scope) = (None, None, ScopeClass::Unscoped);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--tools" => tools = Some(PathBuf::from(value(&mut it, arg, "a file")?)),
            "--preset" => preset = Some(value(&mut it, arg, "a preset name")?),
            "--scope" => {
                let s = value(&mut it, arg, "a scope class")?;
                scope = serde_json::from_value(serde_json::Value::String(s.clone()))
                    .map_err(|_| format!("--scope {s:?}: expected unscoped, head, worker or ephemeral"))?;
            }
            other => return Err(format!("catalog: unknown argument `{other}`")),
        }
    }
    Ok(Command::Catalog { tools, preset, scope })
}

fn load_script(path: Option<&PathBuf>, keepalive_ms: Option<u64>) -> Result<ToolScript, String> {
    let mut script = match path {
        Some(path) => ToolScript::load(path).map_err(|e| format!("invalid tool script: {e}"))?,
        None => ToolScript::builtin(),
    };
    if let Some(ms) = keepalive_ms {
        let limit = cortexkit_role_tool_provider::KEEPALIVE_INTERVAL_MS;
        if !(1..=limit).contains(&ms) {
            return Err(format!("--keepalive-ms must be 1 to {limit}"));
        }
        script.keepalive_interval_ms = ms;
    }
    Ok(script)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("CK_LOG", "warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "claustrum") {
        return vault::main(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "relay") {
        return relay::main(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "fed") {
        return fed::main(&args[1..]);
    }
    let command = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("broca-mock: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Help => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Command::Http(args) => run(&args),
        Command::Tools(args) => {
            let script = match load_script(args.tools.as_ref(), args.keepalive_ms) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("broca-mock: {e}");
                    return ExitCode::from(2);
                }
            };
            let sync = if args.fsync { tools::call_log::Sync::Fsync } else { tools::call_log::Sync::Write };
            return tools::serve(tools::Options { conn_file: args.conn_file, script, call_log: args.call_log, sync });
        }
        Command::Fusiform(opts) => return fusiform::serve(opts),
        Command::Calls { call_log, json, at_most_once } => match tools::print_calls(&call_log, json, at_most_once) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e.into()),
        },
        Command::Catalog { tools, preset, scope } => catalog(tools.as_ref(), preset.as_deref(), scope),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broca-mock: {e}");
            ExitCode::from(1)
        }
    }
}

fn catalog(path: Option<&PathBuf>, preset: Option<&str>, scope: ScopeClass) -> Result<(), Box<dyn std::error::Error>> {
    let script = load_script(path, None)?;
    if let Some(p) = preset.filter(|p| !script.lists_preset(p)) {
        return Err(format!("the script lists no preset {p:?} (it lists {:?})", script.presets).into());
    }
    let answer = script.catalog(preset, scope, None, false).map_err(|e| e.message)?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

fn run(args: &HttpArgs) -> Result<(), Box<dyn std::error::Error>> {
    let script = match &args.script {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
            Some(Script::from_json(&text).map_err(|e| format!("invalid script {path}: {e}"))?)
        }
        None => None,
    };
    let options =
        mock::MockOptions { tls: args.tls_ca.is_some(), classify_log: args.classify_log.clone(), ..Default::default() };
    let mut server =
        MockServer::start_with(&args.bind, options).map_err(|e| format!("cannot listen on {}: {e}", args.bind))?;
    if let (Some(path), Some(pem)) = (&args.tls_ca, server.ca_pem()) {
        std::fs::write(path, pem).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(script) = script {
        server.install("default", script);
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "BROCA_MOCK_URL={}", server.url())?;
    stdout.flush()?;
    drop(stdout);
    if args.until_stdin_eof {
        let mut sink = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        while !matches!(stdin.read(&mut sink), Ok(0) | Err(_)) {}
        server.shutdown();
        return Ok(());
    }
    // Serve until killed (SIGTERM's default action ends the process).
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_modes_are_told_apart_and_mixed_flags_refused() {
        assert!(matches!(parse_args(&args(&[])), Ok(Command::Http(_))));
        assert!(
            matches!(parse_args(&args(&["--bind", "127.0.0.1:9"])), Ok(Command::Http(h)) if h.bind == "127.0.0.1:9")
        );
        // The daemon appends `--subc <file>` after the configured args.
        let Ok(Command::Tools(t)) = parse_args(&args(&["--tools", "t.jsonc", "--call-log", "c", "--subc", "f"])) else {
            panic!("tool-provider mode")
        };
        assert_eq!((t.conn_file, t.tools, t.call_log), ("f".into(), Some("t.jsonc".into()), Some("c".into())));
        assert!(parse_args(&args(&["--bind", "x", "--subc", "f"])).unwrap_err().contains("--bind"));
        assert!(matches!(
            parse_args(&args(&["--classify-log", "c.jsonl"])),
            Ok(Command::Http(h)) if h.classify_log == Some("c.jsonl".into())
        ));
        assert!(parse_args(&args(&["--classify-log", "c", "--subc", "f"])).unwrap_err().contains("--classify-log"));
        assert!(parse_args(&args(&["--tools", "t"])).unwrap_err().contains("needs --subc"));
        assert!(parse_args(&args(&["--subc"])).is_err());
        assert!(matches!(
            parse_args(&args(&["calls", "--call-log", "c", "--json"])),
            Ok(Command::Calls { json: true, at_most_once: false, .. })
        ));
        assert!(matches!(
            parse_args(&args(&["catalog", "--scope", "head"])),
            Ok(Command::Catalog { scope: ScopeClass::Head, .. })
        ));
        assert!(parse_args(&args(&["catalog", "--scope", "nowhere"])).is_err());
    }
}
