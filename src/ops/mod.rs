//! The session ops: requests mapped to actor jobs (writes) or direct reads. Transport-free: a
//! caller (the subc module, a test) hands in the bound session, the method and its params, and
//! gets exactly one answer through `reply`, possibly from another thread.
//!
//! Leniency is per operation (spec §15): `session.send` tolerates unknown members (logged once
//! per key); `session.read` and `run.status` are strict and refuse unknown members by name.
//! Every refusal is decided before anything is written.

mod driver;
mod read;
pub mod send;
mod status;
pub mod table;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;

use crate::actor::Registry;
use crate::catalog::{Catalog, CatalogError};
use crate::session_key::SessionKey;
use crate::wire::{Refusal, RefusalCode};

/// What an op knows of the route it came on: the bound session, and whether the daemon
/// stamped a work scope on the bind (scoped sessions take tools only from a fetch plan).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    pub key: SessionKey,
    pub scoped: bool,
}

/// One answer, delivered once.
pub type Reply = Box<dyn FnOnce(Result<Value, Refusal>) + Send>;

/// A reply that is answered exactly once: by the first `answer`, or, if it is dropped
/// unanswered (a job that never ran), with a transient refusal, so no request is left hanging.
pub struct ReplyOnce(Mutex<Option<Reply>>);

impl ReplyOnce {
    pub fn new(reply: Reply) -> Arc<ReplyOnce> {
        Arc::new(ReplyOnce(Mutex::new(Some(reply))))
    }

    pub fn answer(&self, result: Result<Value, Refusal>) {
        if let Some(reply) = self.0.lock().take() {
            reply(result);
        }
    }
}

impl Drop for ReplyOnce {
    fn drop(&mut self) {
        if let Some(reply) = self.0.get_mut().take() {
            let detail = Some(crate::detail!("class" => "transient"));
            reply(Err(Refusal::new(
                RefusalCode::OpenFailed,
                "open failed: the session closed before answering",
                detail,
            )));
        }
    }
}

/// What the ops need.
pub struct Ops {
    pub registry: Arc<Registry>,
    pub catalog: Arc<RwLock<Result<Catalog, CatalogError>>>,
    /// `BROCA_PROVIDER_BASE_URL`: mock providers, credential-free.
    pub base_url_override: Option<String>,
    /// `broca.jsonc`, read once at boot: backup classes and context-management defaults.
    pub config: Arc<crate::config::BrocaConfig>,
}

pub fn invalid_params(field: &str, why: &str) -> Refusal {
    Refusal::new(
        RefusalCode::InvalidParams,
        format!("invalid params: {field}: {why}"),
        Some(crate::detail!("field" => field)),
    )
}

/// Refuses members outside `known` (strict ops).
fn strict(params: &Value, known: &[&str]) -> Result<(), Refusal> {
    match params {
        Value::Null => Ok(()),
        Value::Object(map) => match map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(invalid_params(k, "unknown member")),
            None => Ok(()),
        },
        _ => Err(invalid_params("params", "must be an object")),
    }
}

/// Logs an unread `session.send` member once per key per process.
fn note_unread(key: &str, harness: &str) {
    static SEEN: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    if SEEN.get_or_init(Default::default).lock().insert(key.to_string()) {
        log::warn!(target: "broca.wire", "session.send member {key:?} (from harness {harness:?}) is not read by this build");
    }
}

impl Ops {
    pub fn lkg_path(&self) -> PathBuf {
        self.registry.shared().root.catalog_path()
    }

    /// Serves `method` for the session `key`. Blocking work (opening a lineage, reading the
    /// store) happens here: call it from a worker thread.
    pub fn handle(self: &Arc<Self>, key: &SessionKey, method: &str, params: Value, reply: Reply) {
        self.handle_on(&Route { key: key.clone(), scoped: false }, method, params, reply)
    }

    /// [`Ops::handle`] for a route whose bind carried the daemon's stamped work scope.
    pub fn handle_on(self: &Arc<Self>, route: &Route, method: &str, params: Value, reply: Reply) {
        let key = &route.key;
        match method {
            "role.describe" => reply(strict(&params, &[]).map(|()| describe(&self.config))),
            "session.send" => send::session_send(self, route, params, reply),
            "session.retract" => driver::session_retract(self, key, params, reply),
            "run.cancel" => driver::run_cancel(self, key, params, reply),
            "session.read" => reply(read::session_read(self, key, &params)),
            "run.status" => reply(status::run_status(self, key, &params)),
            "run.result" => reply(status::run_result(self, key, &params)),
            "send.status" | "session.send_status" => reply(status::send_status(self, key, &params)),
            "session.baseline" => reply(read::session_baseline(self, key, &params)),
            other => {
                let detail = Some(crate::detail!("method" => other));
                reply(Err(Refusal::new(RefusalCode::UnknownMethod, format!("unknown method {other:?}"), detail)))
            }
        }
    }
}

/// The `role.describe` answer: this build's major, the ops it serves on a session route, and
/// exactly the capability groups whose answers broca gives in the role's shapes (spec §4).
/// `retract` is not declared: broca answers `session.retract` with the project spec's object,
/// which a contract consumer would misread (reference §14, row 13).
pub fn describe(config: &crate::config::BrocaConfig) -> Value {
    use cortexkit_role_llm_runner::capabilities as cap;
    use cortexkit_role_llm_runner::describe::{Major, RoleDescribe};
    let ops = table::OPS.iter().map(|op| op.name.to_owned()).collect();
    let groups = [
        cap::RUN_STATUS,
        cap::RUN_CANCEL,
        cap::RUN_USAGE,
        cap::QUEUE,
        cap::STEER,
        cap::INTERRUPT,
        cap::MAX_STEPS,
        cap::NO_TOOLS,
        cap::INPUT_TOKEN_CAP,
        cap::SEND_STATUS,
        "send_tool_reply_bound",
        "session_class",
    ];
    let describe = RoleDescribe::new(
        vec![Major::new(cortexkit_role_llm_runner::PROVIDES, ops, "alpha")],
        env!("CARGO_PKG_VERSION"),
    )
    .with_capabilities(groups.iter().map(|g| (*g).to_owned()).collect())
    .with_run_cancel(vec!["now".into(), "step_boundary".into()])
    .with_session_capabilities_from(cortexkit_role_llm_runner::capabilities::source::ADMISSION)
    .with_max_bytes(read::MAX_BYTES, read::MAX_BYTES);
    let mut out = serde_json::to_value(describe).expect("role.describe serializes");
    out["session_class"] = serde_json::json!({"backup_classes": config.backup_classes});
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn role_describe_passes_the_role_crates_check() {
        let describe = super::describe(&crate::config::BrocaConfig::default());
        if let Err(problems) = cortexkit_role_llm_runner::describe::check_describe(&describe) {
            panic!("role.describe is refused: {problems:?}\n{describe}");
        }
    }
}
