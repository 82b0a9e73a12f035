//! `broca doctor`: one cheap authenticated request per configured credential (`broca::doctor`),
//! one line each, exit 1 if any failed.

use std::path::PathBuf;
use std::process::ExitCode;

use broca::catalog::Catalog;
use broca::config::BrocaConfig;
use broca::doctor::{unknown_credential, Check, Doctor, Secret, Target};
use broca::provider::client::HttpClient;
use broca::state_root::{RootEnv, StateRoot};
use broca::subc::consumer::Consumer;
use broca::vault::handles::{self, devtools_handles_path};
use broca::vault::{HandleSource, SubcVault};

pub const USAGE: &str = "\
broca doctor: prove each configured provider credential with one cheap request

usage: broca doctor [--json] [--subc FILE] [--state-root DIR]

For each credential in the dev-tools handles file (BROCA_DEVTOOLS_HANDLES, else
~/.config/cortexkit/broca/dev-tools-handles.json), read from the vault through the subc daemon
(--subc, else BROCA_LIVE_SUBC, else SUBC_SOCKET), broca sends one request to the catalog's first
model of that provider that the credential can reach: a one-line prompt, 16 output tokens, the
same headers, signature and Code Assist project a run uses. One line per credential: `ok`, or
`FAIL` with the problem, the provider's words and what to do.

  --json         one JSON document: {checks: [{credential, provider, method, model, family,
                 status, problem?, message?, advice?}], ok, failed}
  --state-root   the state root whose catalog and broca.jsonc are used (default as the module's)

exit codes: 0 every credential works, 1 one failed or none is configured, 2 usage";

const SUBC_FILE_VARS: [&str; 2] = ["BROCA_LIVE_SUBC", "SUBC_SOCKET"];

struct Args {
    json: bool,
    subc: Option<PathBuf>,
    state_root: Option<PathBuf>,
}

fn parse(words: &[&str]) -> Result<Option<Args>, String> {
    let mut args = Args { json: false, subc: None, state_root: None };
    let mut it = words.iter();
    while let Some(word) = it.next() {
        match *word {
            "--help" | "-h" => return Ok(None),
            "--json" => args.json = true,
            "--subc" => args.subc = Some(it.next().ok_or("--subc needs a file")?.into()),
            "--state-root" => args.state_root = Some(it.next().ok_or("--state-root needs a directory")?.into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

pub fn main(words: &[&str]) -> ExitCode {
    let args = match parse(words) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broca doctor: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("broca doctor: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs every check, printing as it goes; `Ok(true)` when all passed.
fn run(args: &Args) -> Result<bool, String> {
    let root = match &args.state_root {
        Some(dir) => StateRoot::at(dir),
        None => StateRoot::resolve(&RootEnv::from_process(None)),
    }
    .map_err(|e| e.to_string())?;
    let config = BrocaConfig::load(&root).map_err(|e| e.to_string())?;
    let path = devtools_handles_path(|k| std::env::var(k).ok())
        .ok_or_else(|| format!("no dev-tools handles file: set {} or HOME", handles::DEVTOOLS_HANDLES_ENV))?;
    let loaded = handles::load(&path);
    if let Some(warning) = loaded.warning {
        return Err(warning);
    }
    if loaded.handles.is_empty() {
        return Err(format!("no credential is configured in {}", path.display()));
    }
    let subc = args.subc.clone().or_else(|| {
        SUBC_FILE_VARS.iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()).map(PathBuf::from))
    });
    let subc = subc.ok_or("credentials are read through the subc daemon: pass --subc FILE or set SUBC_SOCKET")?;
    let consumer = Consumer::connect(&subc, None).map_err(|e| format!("cannot reach the subc daemon: {e}"))?;
    let vault = SubcVault::new(consumer);
    let lkg_path = root.catalog_path();
    let catalog = Catalog::load_lkg(&lkg_path);
    let client = HttpClient::default();
    let doctor = Doctor {
        client: &client,
        catalog: catalog.as_ref(),
        lkg_path,
        code_assist_project: config.code_assist_project.clone(),
        base_url_override: std::env::var("BROCA_PROVIDER_BASE_URL").ok().filter(|u| !u.is_empty()),
        now_ms: broca::clock::unix_ms() as i64,
    };
    let mut checks: Vec<Check> = Vec::new();
    for id in loaded.handles.ids() {
        let check = match Target::parse(id) {
            None => unknown_credential(id),
            Some(target) => {
                let handle = loaded.handles.get(id).unwrap_or_default();
                let secret = vault
                    .get_handle(handle)
                    .map(|c| Secret {
                        value: c.secret.expose().to_owned(),
                        account_id: c.account_id,
                        expires_at_ms: c.expires_at_ms,
                    })
                    .map_err(|e| format!("the vault refused the dev-tools handle ({}): {e}", e.code()));
                doctor.check(&target, secret)
            }
        };
        if !args.json {
            println!("{}", check.line());
        }
        checks.push(check);
    }
    let ok = checks.iter().filter(|c| c.is_ok()).count();
    let failed = checks.len() - ok;
    if args.json {
        let doc = serde_json::json!({"checks": checks, "ok": ok, "failed": failed});
        println!("{}", serde_json::to_string_pretty(&doc).expect("a report serializes"));
    } else {
        println!("{ok} ok, {failed} failed");
    }
    Ok(failed == 0)
}
