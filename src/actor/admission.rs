//! Admission (spec §4): what a send must pass before anything is written, for the module and
//! `broca-run` alike. [`Admission::precheck`] runs before the session is opened (the model is
//! resolved against the catalog, shutdown and scoped-tool rules are applied); the rest is
//! decided on the session's actor against its durable state ([`super::decide::send`]).

use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::route::{self, AdmissionError, ModelRequest, RouteOverrides};
use crate::config::BrocaConfig;
use crate::provider::config::RenderConfig;
use crate::record::Delivery;
use crate::session_key::SessionKey;
use crate::tools::fetch::{self, FetchedPlan};
use crate::tools::ToolPlane;
use crate::wire::send::SendParams;
use crate::wire::{invalid_params, Refusal, RefusalCode};

pub use crate::catalog::SharedCatalog;

/// What admission reads: the catalog, `broca.jsonc`, and how routes are overridden.
pub struct Admission {
    pub catalog: SharedCatalog,
    /// `broca.jsonc`, read once at boot: backup classes and context-management defaults.
    pub config: Arc<BrocaConfig>,
    /// `BROCA_PROVIDER_BASE_URL` (mock providers) and the auth a new send's route uses.
    pub overrides: RouteOverrides,
    /// The LKG catalog file, named in catalog refusals.
    pub lkg: PathBuf,
    /// The tool plane plan fetches go through (`None`: no consumer connection, so every plan
    /// provider is unreachable).
    pub tools: Option<Arc<ToolPlane>>,
    /// The vault admission reads a vault route's credential from, to freeze its account in
    /// `RunStarted.auth_selection` (`None`: no consumer connection).
    pub credentials: Option<crate::vault::Credentials>,
}

/// What the pre-check settled: the named model's route, and the plan a session's first
/// episode fetched; and who sent it, as the daemon stamped its route (the session's actor
/// checks it against the recorded owner, and a first episode records it as the owner).
#[derive(Clone, Debug, Default)]
pub struct Checked {
    pub resolved: Option<RenderConfig>,
    pub fetched: Option<FetchedPlan>,
    pub caller: crate::owner::Caller,
}

/// Where a send arrives: the facts of its front-end that admission weighs.
#[derive(Clone, Copy, Debug)]
pub struct Arrival<'a> {
    pub key: &'a SessionKey,
    /// The daemon stamped a work scope on the route (tools come only from a fetch plan).
    pub scoped: bool,
    /// The module is shutting down.
    pub sealing: bool,
    /// The session already has a WAL.
    pub exists: bool,
    /// The session has run an episode (so a plan is checked against its frozen one, never
    /// fetched).
    pub has_episode: bool,
}

impl Admission {
    /// The checks made before the session is opened: the model resolved when the send names
    /// one (otherwise it inherits the session's frozen model, decided on the actor), and a
    /// first episode's plan fetched.
    pub fn precheck(&self, send: &SendParams, at: Arrival<'_>) -> Result<Checked, Refusal> {
        let resolved = self.check_model(send, at)?;
        // A session with no record has no frozen plan to weigh a malformed `tools` list
        // against: it is refused here, before anything is opened.
        if let (false, Some(fault)) = (at.exists, &send.tools_fault) {
            return Err(fault.clone());
        }
        let fetched = match &send.plan {
            Some(plan) if !at.has_episode => Some(self.fetch_plan(at.key, plan)?),
            _ => None,
        };
        Ok(Checked { resolved, fetched, caller: crate::owner::Caller::direct() })
    }

    /// Fetches a first episode's plan through the tool plane.
    fn fetch_plan(&self, key: &SessionKey, plan: &crate::wire::plan::Plan) -> Result<FetchedPlan, Refusal> {
        match &self.tools {
            Some(plane) => fetch::fetch(plane, &key.addr(), plan),
            None => {
                let provider = plan.tool_items.first().map_or("", |i| i.provider.as_str());
                let message =
                    format!("fetch unavailable: broca has no consumer connection to reach tool provider {provider:?}");
                let detail = Some(crate::detail!("provider" => provider, "class" => "transient"));
                Err(Refusal::new(RefusalCode::FetchUnavailable, message, detail))
            }
        }
    }

    fn check_model(&self, send: &SendParams, at: Arrival<'_>) -> Result<Option<RenderConfig>, Refusal> {
        // Tool providers need a per-call preset on scoped routes, which only a fetch plan gives:
        // legacy direct tools cannot run there (broca has no fetch plans yet).
        if at.scoped && send.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            let message =
                "session.send: tools on a scoped session must come from a fetch plan; legacy tools are refused";
            let detail = Some(crate::detail!("class" => "permanent"));
            return Err(Refusal::new(RefusalCode::ScopedToolsRequirePlan, message, detail));
        }
        if at.sealing {
            let detail = Some(crate::detail!("class" => "transient"));
            return Err(Refusal::new(
                RefusalCode::ModuleReloading,
                "broca is shutting down; send again shortly",
                detail,
            ));
        }
        project_root_present(at.key)?;
        // "none" is the only mode this build serves: any other value is refused by name before
        // the session is even opened (whatever it bound, the send cannot run).
        if let Some(mode) = send.context_management.as_ref().filter(|m| **m != "none") {
            return Err(super::policy::context_unavailable(mode));
        }
        // A named model resolves before the session is opened; an omitted one needs the
        // session's frozen config, so only a session with history can omit it.
        match &send.model {
            Some(_) => self.resolve(send, None).map(Some),
            None if !at.exists => {
                Err(invalid_params("model", "required: the session has no episode to inherit it from"))
            }
            // Only a steer or an interrupt takes the session's frozen model; a plain send names one.
            None if send.delivery == Delivery::Queue && send.send_id.is_none() => Err(inherit_refused()),
            None => Ok(None),
        }
    }

    /// Resolves the send's model (or the inherited one) against the catalog.
    pub fn resolve(&self, send: &SendParams, inherited: Option<&RenderConfig>) -> Result<RenderConfig, Refusal> {
        let (model, variant) = match (&send.model, inherited) {
            (Some(m), _) => (m.id.clone(), m.variant.clone()),
            (None, Some(c)) => (format!("{}/{}", c.provider, c.model), c.variant.clone()),
            (None, None) => return Err(invalid_params("model", "required")),
        };
        let request = ModelRequest {
            model,
            variant,
            system: send.system.clone(),
            max_output_tokens: send.max_output_tokens.or(inherited.and_then(|c| c.max_output_tokens)),
            max_steps: send.max_steps.or(inherited.and_then(|c| c.max_steps)),
            tools: send.tools.clone().or_else(|| inherited.map(|c| c.tools.clone())).unwrap_or_default(),
        };
        let catalog = self.catalog.read();
        let mut config =
            route::resolve(catalog.as_ref(), self.lkg.clone(), &request, &self.overrides).map_err(|e| e.refusal())?;
        if let Some(limit) = send.context_limit {
            let row = catalog.as_ref().ok().and_then(|c| c.row(&format!("{}/{}", config.provider, config.model)));
            if let Some(model_limit) = row.and_then(|r| r.limit_context).filter(|l| *l > 0 && limit > *l) {
                let message = format!(
                    "invalid params: context_limit: {limit} is above {}/{}'s context of {model_limit} tokens",
                    config.provider, config.model
                );
                let detail = crate::detail!("field" => "context_limit", "max" => model_limit);
                return Err(Refusal::new(RefusalCode::InvalidParams, message, Some(detail)));
            }
        }
        // Spec §4 line 152: a send omitting `tool_choice` takes the session's frozen one.
        config.tool_choice = send.tool_choice.clone().or_else(|| inherited.and_then(|c| c.tool_choice.clone()));
        route::yield_default_thinking(&mut config);
        if config.family == crate::frozen::Family::AwsBedrockConverse
            && config.tool_choice == Some(crate::frozen::ToolChoice::Mode(crate::frozen::ToolChoiceMode::None))
        {
            let message = format!(
                "invalid params: tool_choice: \"none\" cannot be honoured on {}/{} (Bedrock Converse has no such choice)",
                config.provider, config.model
            );
            let detail = crate::detail!("field" => "tool_choice", "reason" => "unsupported_by_route");
            return Err(Refusal::new(crate::wire::RefusalCode::InvalidParams, message, Some(detail)));
        }
        if let Some(what) = send.cache.as_ref().and_then(|c| crate::provider::cache::unsupported(&config, c)) {
            let e = AdmissionError::RouteUnsupported { model: format!("{}/{}", config.provider, config.model), what };
            return Err(e.refusal());
        }
        Ok(config)
    }

    /// A restart-paused run resumes only if its recorded model still resolves; `Err` carries
    /// the refusal's message.
    pub fn readmit(&self, config: &RenderConfig) -> Result<(), String> {
        let request = ModelRequest {
            model: format!("{}/{}", config.provider, config.model),
            variant: config.variant.clone(),
            ..ModelRequest::default()
        };
        let overrides = RouteOverrides { auth: config.auth.clone(), ..self.overrides.clone() };
        let catalog = self.catalog.read();
        route::resolve(catalog.as_ref(), self.lkg.clone(), &request, &overrides)
            .map(drop)
            .map_err(|e| e.refusal().message)
    }
}

/// A plain send that names no model.
pub(super) fn inherit_refused() -> Refusal {
    invalid_params("model", "required: only a steer or an interrupt inherits the session's model")
}

/// §10.1: writes refuse a session whose project root is gone (reads still work).
fn project_root_present(key: &SessionKey) -> Result<(), Refusal> {
    let root = std::path::Path::new(&key.project_root);
    if root.is_dir() {
        return Ok(());
    }
    let message =
        format!("invalid project root: {} does not exist; recreate it to continue this session", key.project_root);
    Err(Refusal::new(RefusalCode::InvalidProjectRoot, message, Some(crate::detail!("path" => key.project_root))))
}
