//! `broca-mock claustrum --vault FILE [--vault-log PATH] --subc <connection-file>`: a scripted
//! claustrum vault as a real subc module (a `management_surface` whose ops answer as
//! `cortexkit-claustrum-client` 0.8.0 decodes them; `catalog-and-vault.md` Part D). Give it the
//! module id `claustrum` in the daemon's table.
//!
//! The vault file is read again on every request, so a test rotates a record (a new
//! `record_version` and secret) or flips its state by rewriting the file:
//!
//! ```json
//! {"credentials": {"apikey:mock": {"secret": "sk-mock-1", "record_version": 1,
//!    "account_id": "acct-1", "expires_at_ms": null, "state": "ready", "principals": ["broca"]}},
//!  "handles": {"ckh_dev": "apikey:mock"}}
//! ```
//!
//! - `credential.get_scoped {credential_id, min_ttl_ms?}`: a record granted to the route's
//!   principal (`reserved:<module id>`, listed in `principals` by module id; a `direct` route
//!   has none) answers `{result: {payload, record_version, expires_at_ms, account_id?}}`;
//!   unknown or not granted answers `{result: {error: {class: "permanent", code: "not_found"}}}`;
//!   `state: "needs_reauth"` answers class `auth_required`, code `needs_reauth`; `state:
//!   "locked"` answers class `transient`, code `vault_locked` (a vault that is not unlocked yet).
//! - `credential.get {handle}`: the same answers for the record a `ckh_` handle names.
//! - `credential.report_auth_failure {credential_id, provider_status, record_version}`: answers
//!   `{result: {accepted: true}}`; the report is logged with its version.
//!
//! `--vault-log PATH` appends one JSON line per request: `{op, credential_id?, principal,
//! record_version?, provider_status?, outcome}`. It never holds a secret.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use broca::subc::{self, health_ok, BindRequest, ControlRequest, Handler, Outbound, Route};
use serde::Deserialize;
use serde_json::{json, Value};
use subc_protocol::{ErrorBody, Flags, Principal};

/// The module id when the daemon names none.
pub const DEFAULT_MODULE_ID: &str = "claustrum";
/// The largest vault file read.
const MAX_VAULT_FILE: u64 = 1 << 20;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultFile {
    #[serde(default)]
    credentials: BTreeMap<String, Record>,
    #[serde(default)]
    handles: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    secret: String,
    record_version: u64,
    #[serde(default)]
    account_id: Option<String>,
    /// When the record's token expires (an OAuth token's), as the vault reports it.
    #[serde(default)]
    expires_at_ms: Option<i64>,
    #[serde(default = "ready")]
    state: String,
    #[serde(default)]
    principals: Vec<String>,
}

fn ready() -> String {
    "ready".into()
}

#[derive(Debug, Deserialize)]
struct Request {
    method: String,
    #[serde(default)]
    params: Params,
}

#[derive(Debug, Default, Deserialize)]
struct Params {
    credential_id: Option<String>,
    handle: Option<String>,
    provider_status: Option<u16>,
    record_version: Option<Value>,
}

struct Vault {
    file: PathBuf,
    log: Option<PathBuf>,
    outbound: Outbound,
    routes: BTreeMap<Route, Option<String>>,
}

fn load(path: &Path) -> Result<VaultFile, String> {
    use std::io::Read;
    let mut text = String::new();
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.take(MAX_VAULT_FILE).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn refusal(class: &str, code: &str) -> Value {
    json!({"result": {"error": {"class": class, "code": code}}})
}

impl Vault {
    fn record(&self, entry: Value) {
        let Some(path) = &self.log else { return };
        let line = format!("{entry}\n");
        let written =
            OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            log::error!("cannot append to the vault log {}: {e}", path.display());
        }
    }

    fn read(file: &VaultFile, id: &str, principal: Option<&str>) -> (Value, &'static str, Option<u64>) {
        let granted =
            file.credentials.get(id).filter(|r| principal.is_some_and(|p| r.principals.iter().any(|g| g == p)));
        match granted {
            None => (refusal("permanent", "not_found"), "not_found", None),
            Some(r) if r.state == "needs_reauth" => (refusal("auth_required", "needs_reauth"), "needs_reauth", None),
            Some(r) if r.state == "locked" => (refusal("transient", "vault_locked"), "vault_locked", None),
            Some(r) => {
                let mut result = json!({"payload": r.secret, "record_version": r.record_version, "expires_at_ms": r.expires_at_ms, "credential_id": id});
                if let Some(account) = &r.account_id {
                    result["account_id"] = json!(account);
                }
                (json!({"result": result}), "ok", Some(r.record_version))
            }
        }
    }

    fn answer(&self, principal: Option<&str>, body: &[u8]) -> Result<Value, ErrorBody> {
        let request: Request = serde_json::from_slice(body)
            .map_err(|e| ErrorBody::new("invalid_params", format!("not a {{method, params}} request: {e}")))?;
        let file = load(&self.file).map_err(|e| ErrorBody::new("internal", e))?;
        let p = &request.params;
        let (answer, entry) = match request.method.as_str() {
            "credential.get_scoped" => {
                let id = p.credential_id.clone().ok_or_else(|| ErrorBody::new("invalid_params", "credential_id"))?;
                let (answer, outcome, version) = Vault::read(&file, &id, principal);
                (
                    answer,
                    json!({"op": request.method, "credential_id": id, "outcome": outcome, "record_version": version}),
                )
            }
            "credential.get" => {
                let handle = p.handle.clone().ok_or_else(|| ErrorBody::new("invalid_params", "handle"))?;
                // A handle is the capability: it reads its record whatever the principal.
                let id = file.handles.get(&handle).cloned().unwrap_or_default();
                let owner = file.credentials.get(&id).and_then(|r| r.principals.first().cloned());
                let (answer, outcome, version) = Vault::read(&file, &id, owner.as_deref());
                (
                    answer,
                    json!({"op": request.method, "credential_id": id, "outcome": outcome, "record_version": version}),
                )
            }
            "credential.report_auth_failure" => {
                let id = p.credential_id.clone().ok_or_else(|| ErrorBody::new("invalid_params", "credential_id"))?;
                let status = p.provider_status.filter(|s| matches!(s, 401 | 403));
                let Some(status) = status else { return Err(ErrorBody::new("invalid_params", "provider_status")) };
                let entry = json!({"op": request.method, "credential_id": id, "provider_status": status,
                                   "record_version": p.record_version, "outcome": "accepted"});
                (json!({"result": {"accepted": true}}), entry)
            }
            other => return Err(ErrorBody::new("unknown_method", format!("the mock vault does not serve {other}"))),
        };
        let mut entry = entry;
        entry["principal"] = json!(principal);
        self.record(entry);
        Ok(answer)
    }
}

impl Handler for Vault {
    fn on_route_bound(&mut self, bind: BindRequest) {
        let principal = match bind.principal {
            Some(Principal::Reserved { module_id }) => Some(module_id),
            _ => None,
        };
        self.routes.insert(bind.route, principal);
    }

    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        let principal = self.routes.get(&route).cloned().flatten();
        let sent = match self.answer(principal.as_deref(), &body) {
            Ok(answer) => self.outbound.reply(route, corr, answer.to_string().into_bytes()),
            Err(e) => self.outbound.error(route, corr, &e),
        };
        if let Err(e) = sent {
            log::warn!("cannot answer {route} corr {corr}: {e:?}");
        }
    }

    fn on_cancel(&mut self, _route: Route, _corr: u64) {}

    fn on_route_closed(&mut self, route: Route) {
        self.routes.remove(&route);
    }

    fn on_control(&mut self, request: ControlRequest) {
        if let ControlRequest::HealthCheck { corr } = request {
            let _ = self.outbound.health(corr, health_ok(json!({"routes": self.routes.len()})));
        }
    }

    fn on_shutdown(&mut self) {}
}

fn manifest(module_id: &str) -> subc_protocol::manifest::ModuleManifest {
    use subc_protocol::manifest::{
        Concurrency, IdentityScope, ManagementOperation, ManagementOperationKind, ModuleManifest, ProviderRole,
    };
    let op = |name: &str, kind| ManagementOperation { name: name.into(), kind, description: None };
    ModuleManifest::builder(module_id, env!("CARGO_PKG_VERSION"))
        .provides(vec![ProviderRole::ManagementSurface {
            operations: vec![
                op("credential.get_scoped", ManagementOperationKind::Query),
                op("credential.get", ManagementOperationKind::Query),
                op("credential.report_auth_failure", ManagementOperationKind::Mutate),
            ],
            config_schema: json!({"type": "object"}),
            observability: Vec::new(),
            identity_scope: vec![IdentityScope::Session],
            concurrency: Concurrency::ModuleManaged,
        }])
        .build()
}

/// `broca-mock claustrum …` (the daemon appends `--subc <file>`).
pub fn main(args: &[String]) -> ExitCode {
    let (mut file, mut log, mut conn) = (None, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let slot = match arg.as_str() {
            "--vault" => &mut file,
            "--vault-log" => &mut log,
            "--subc" => &mut conn,
            other => {
                eprintln!("broca-mock claustrum: unknown argument `{other}`");
                return ExitCode::from(2);
            }
        };
        *slot = it.next().map(PathBuf::from);
    }
    let (Some(file), Some(conn_file)) = (file, conn) else {
        eprintln!("broca-mock claustrum: needs --vault FILE and --subc CONNECTION_FILE");
        return ExitCode::from(2);
    };
    let module_id = std::env::var(subc_protocol::SUBC_MODULE_ID_ENV)
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| DEFAULT_MODULE_ID.to_owned());
    let conn = match subc::connect(&conn_file, manifest(&module_id), &module_id) {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("broca-mock claustrum: {e}");
            return ExitCode::from(1);
        }
    };
    let outbound = conn.outbound();
    let vault = Vault { file, log, outbound, routes: BTreeMap::new() };
    let running = match conn.start(vault, |_: &BindRequest| Ok(())) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("broca-mock claustrum: cannot start the subc io thread: {e}");
            return ExitCode::from(1);
        }
    };
    let end = running.join();
    if end.is_clean() {
        ExitCode::SUCCESS
    } else {
        eprintln!("broca-mock claustrum: {end}");
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(state: &str) -> VaultFile {
        serde_json::from_value(json!({
            "credentials": {"apikey:mock": {"secret": "sk-mock-1", "record_version": 3, "account_id": "acct-1",
                                            "state": state, "principals": ["broca"]}},
            "handles": {"ckh_dev": "apikey:mock"}
        }))
        .unwrap()
    }

    #[test]
    fn the_documented_vault_file_decodes() {
        let doc: String = include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let start = doc.find("```json\n").unwrap() + "```json\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let file: VaultFile = serde_json::from_str(&doc[start..end]).unwrap();
        assert_eq!(file.credentials["apikey:mock"].state, "ready");
        assert_eq!(file.handles["ckh_dev"], "apikey:mock");
    }

    #[test]
    fn a_granted_ready_record_answers_its_secret() {
        let (answer, outcome, version) = Vault::read(&file("ready"), "apikey:mock", Some("broca"));
        assert_eq!((outcome, version), ("ok", Some(3)));
        let result = &answer["result"];
        assert_eq!(result["payload"], "sk-mock-1");
        assert_eq!(result["record_version"], 3);
        assert_eq!(result["account_id"], "acct-1");
        assert!(result["expires_at_ms"].is_null());
    }

    #[test]
    fn refusals_follow_the_grant_and_the_state() {
        let class_code = |f: &VaultFile, id: &str, principal: Option<&str>| {
            let (answer, outcome, version) = Vault::read(f, id, principal);
            assert_eq!(version, None);
            let error = &answer["result"]["error"];
            (error["class"].as_str().unwrap().to_owned(), error["code"].as_str().unwrap().to_owned(), outcome)
        };
        let not_found = ("permanent".to_owned(), "not_found".to_owned(), "not_found");
        assert_eq!(class_code(&file("ready"), "apikey:other", Some("broca")), not_found);
        assert_eq!(class_code(&file("ready"), "apikey:mock", Some("someone-else")), not_found);
        assert_eq!(class_code(&file("ready"), "apikey:mock", None), not_found, "a direct route has no principal");
        assert_eq!(
            class_code(&file("needs_reauth"), "apikey:mock", Some("broca")),
            ("auth_required".to_owned(), "needs_reauth".to_owned(), "needs_reauth")
        );
        assert_eq!(
            class_code(&file("locked"), "apikey:mock", Some("broca")),
            ("transient".to_owned(), "vault_locked".to_owned(), "vault_locked")
        );
    }
}
