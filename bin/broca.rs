//! `broca`: the subc module binary. Serving over subc (`--subc <connection-file>`) arrives with
//! the module layer; today it offers the operator commands on the lineage core.

use std::path::PathBuf;
use std::process::ExitCode;

use broca::lineage::read;
use broca::lineage::{LineageError, Shared};
use broca::record::{self, Record};
use broca::session_key::SessionKey;
use broca::state_root::{RootEnv, StateRoot};
use broca::wal::{self, ScannedFrame};

const USAGE: &str = "\
broca: durable agentic LLM loops (a CortexKit subc module)

usage:
  broca inspect WAL              print a WAL's header and records, one JSON object per line
  broca units WAL                print the durable control units of a WAL, one per line
  broca session PROJECT_ROOT HARNESS SESSION
                                 print the session's address and WAL path under the state root
  broca --help | --version

The state root is BROCA_STATE_ROOT, else $XDG_DATA_HOME/cortexkit/broca, else
~/.local/share/cortexkit/broca. Logs go to stderr, filtered by CK_LOG (default: warn).

exit codes: 0 ok, 1 the WAL or state root could not be read, 2 usage";

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
