//! `broca-mock`: the scripted model-provider test double (Anthropic Messages, OpenAI Chat,
//! OpenAI Responses over SSE). The script format and the control endpoint are documented in
//! [`mock`] (`mock/mod.rs`).

use std::io::{Read, Write};
use std::process::ExitCode;

// The server uses part of the mock's API; the rest is for the in-process users (`#[path]`
// includes in broca-run, broca-bench and the tests) and the mock's own unit tests.
#[allow(dead_code, unused_imports)]
mod mock;

use mock::{MockServer, Script};

const USAGE: &str = "\
usage: broca-mock [--bind ADDR] [--script FILE] [--until-stdin-eof]

Serves scripted model-provider streams (Anthropic Messages, OpenAI Chat Completions,
OpenAI Responses) until killed. Once listening it prints one line to stdout:
    BROCA_MOCK_URL=http://127.0.0.1:<port>
Point a route's base URL at <url>/v1 (lane \"default\") or <url>/lane/<name>/v1.

  --bind ADDR          listen address (default 127.0.0.1:0, an ephemeral port)
  --script FILE        a JSON script queued on the default lane
  --until-stdin-eof    exit when stdin reaches end of file
  --help               this text

Control endpoint: POST /_mock/lanes/<lane>/script, GET /_mock/lanes/<lane>/requests,
DELETE /_mock/lanes/<lane>, GET /_mock/health. Logs go to stderr, filtered by CK_LOG
(default: warn).";

struct Args {
    bind: String,
    script: Option<String>,
    until_stdin_eof: bool,
}

fn parse_args(args: &[String]) -> Result<Option<Args>, String> {
    let mut parsed = Args { bind: "127.0.0.1:0".into(), script: None, until_stdin_eof: false };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--bind" => parsed.bind = it.next().ok_or("--bind needs an address")?.clone(),
            "--script" => parsed.script = Some(it.next().ok_or("--script needs a file")?.clone()),
            "--until-stdin-eof" => parsed.until_stdin_eof = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Some(parsed))
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("CK_LOG", "warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&args) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broca-mock: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broca-mock: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let script = match &args.script {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
            Some(Script::from_json(&text).map_err(|e| format!("invalid script {path}: {e}"))?)
        }
        None => None,
    };
    let mut server = MockServer::start(&args.bind).map_err(|e| format!("cannot listen on {}: {e}", args.bind))?;
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
