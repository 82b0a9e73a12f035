//! The suite's `ClassifierSubject`: the route (`route.rs`), the models the seeded catalog serves
//! (`catalog.rs`), and control of the stand-in provider, broca-mock's classifier stand-in
//! (`mock/model/src/classify`) on a `MockServer` in this process, outside broca: the
//! suite's scripts, counts and holds go straight to its shared state ([`MockServer::classify`]),
//! which keys every provider call by the JCS text of its `state`, as the suite does.
//!
//! The stand-in also expects the vault's credentials on every call (`Authorization: Bearer
//! <secret>` per provider, Workers AI's account id in its path) and answers 401 otherwise, so a
//! passing check is one whose provider calls carried what broca read from the vault.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use broca_mock::mock::classify::{ExpectedAuth, Scripted as StandScript};
use broca_mock::mock::MockServer;
use cortexkit_role_classifier_conformance::{ClassifierSubject, Scripted, ServedModel};
use subc_client_rs::{ScopeSelector, SubcConsumer};
use subc_protocol::{BindIdentity, Principal, RouteTarget};

use crate::route::Route;
use crate::{catalog, rig};

/// The suite's pause between polls: 400 of them bound its waits at 10 s.
pub const PAUSE: Duration = Duration::from_millis(25);
/// The route's identity: a classifier route names no session.
pub const HARNESS: &str = "conformance-classifier";

pub struct Subject {
    consumer: Arc<SubcConsumer>,
    mock: Arc<MockServer>,
    served: Vec<ServedModel>,
}

/// The expectations the stand-in checks every provider call against: the vault's records.
pub fn expected_auth() -> ExpectedAuth {
    ExpectedAuth {
        typesafe: Some(format!("Bearer {}", rig::TYPESAFE_SECRET)),
        workers_ai: Some(format!("Bearer {}", rig::WORKERS_AI_SECRET)),
        account_id: Some(rig::ACCOUNT_ID.into()),
    }
}

/// The host of a URL (`http://127.0.0.1:8080` → `127.0.0.1`).
pub fn host(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6).to_owned(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host).to_owned(),
    }
}

impl Subject {
    pub fn new(consumer: Arc<SubcConsumer>, mock: Arc<MockServer>, rows: catalog::Rows) -> Subject {
        mock.classify().set_auth(expected_auth());
        let served = catalog::served(rows, &host(&mock.url()));
        Subject { consumer, mock, served }
    }

    /// Opens the classifier route under the run scope.
    pub async fn open(&self) -> Result<Route, String> {
        let target = RouteTarget::ManagementSurface { module_id: rig::BROCA.into() };
        let identity = BindIdentity::new(HARNESS, "none");
        let owner = Principal::Reserved { module_id: rig::SCOPES.into() };
        let scope = ScopeSelector::new(owner, rig::RUN_SCOPE, Some(1));
        let versions = BTreeMap::from([("classifier".to_owned(), "v1".to_owned())]);
        let opts = subc_client_rs::CallOptions { role_versions: Some(versions), ..rig::call_options() };
        let handle = self.consumer.open_route_scoped(target, identity, scope, opts).await.map_err(|e| {
            match e.route_open_refusal() {
                Some(body) => format!("route.open was refused {}: {}", body.code, body.message),
                None => format!("route.open: {e}"),
            }
        })?;
        Ok(Route { consumer: Arc::clone(&self.consumer), handle })
    }

    /// The provider calls the stand-in received, per provider: how many, and how many did not
    /// carry the vault's credentials (the stand-in answered those 401).
    pub fn credential_audit(&self) -> Vec<Audit> {
        use broca_mock::mock::classify::Provider;
        let (calls, _) = self.mock.classify().log();
        let auth = expected_auth();
        [(Provider::TypeSafe, "typesafe", &auth.typesafe), (Provider::WorkersAi, "workers-ai", &auth.workers_ai)]
            .into_iter()
            .map(|(provider, name, bearer)| {
                let mine: Vec<_> = calls.iter().filter(|c| c.provider == provider).collect();
                let wrong = mine
                    .iter()
                    .filter(|c| {
                        c.authorization != *bearer
                            || (provider == Provider::WorkersAi && c.account_id != auth.account_id)
                    })
                    .count();
                Audit { provider: name, calls: mine.len(), uncredentialed: wrong }
            })
            .collect()
    }
}

/// One provider's calls at the stand-in.
pub struct Audit {
    pub provider: &'static str,
    pub calls: usize,
    pub uncredentialed: usize,
}

#[async_trait]
impl ClassifierSubject for Subject {
    type Route = Route;

    async fn route(&self) -> Result<Route, String> {
        self.open().await
    }

    fn served_models(&self) -> Vec<ServedModel> {
        self.served.clone()
    }

    fn non_classifier_model(&self) -> Option<String> {
        Some(catalog::CHAT.into())
    }

    fn kindless_model(&self) -> Option<String> {
        Some(catalog::KINDLESS.into())
    }

    async fn script(&self, key: &str, scripted: Scripted) {
        let scripted = match scripted {
            Scripted::Answer(body) => StandScript::Answer(body),
            Scripted::Status { status, retry_after_ms } => {
                StandScript::Status { status, retry_after_ms, workers_ai_code: None }
            }
        };
        if let Err(e) = self.mock.classify().script(key, scripted) {
            panic!("the stand-in refused a script: {}", e.0);
        }
    }

    async fn calls(&self, key: &str) -> usize {
        self.mock.classify().calls(key) as usize
    }

    fn can_hold_calls(&self) -> bool {
        true
    }

    async fn hold_next(&self, key: &str) {
        if let Err(e) = self.mock.classify().hold(key) {
            panic!("the stand-in refused a hold: {}", e.0);
        }
    }

    async fn is_held(&self, key: &str) -> bool {
        self.mock.classify().held(key)
    }

    async fn release(&self, key: &str) {
        self.mock.classify().release(key);
    }

    async fn pause(&self) {
        tokio::time::sleep(PAUSE).await;
    }
}
