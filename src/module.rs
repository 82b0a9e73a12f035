//! The module's wiring in one place: a state root's shared lineage pieces, the fan-out hub, the
//! actor registry and the session ops. `bin/broca.rs` builds through it (then attaches the subc
//! connections), and so do the in-process test rigs, so what they test is what serves.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use crate::actor::{Admission, Readmit, Registry, RunDeps};
use crate::agent::{LoopOptions, NoTools, ToolDispatcher};
use crate::catalog::route::RouteOverrides;
use crate::catalog::{Catalog, CatalogError};
use crate::clock::SharedClock;
use crate::config::BrocaConfig;
use crate::fanout::Hub;
use crate::held::puller::Pullers;
use crate::lineage::{LineageError, Shared};
use crate::ops::Ops;
use crate::provider::client::{HttpClient, ModelClient};
use crate::provider::config::AuthSource;
use crate::state_root::StateRoot;
use crate::tools::ToolPlane;
use crate::wal::{FileStorage, Storage};

/// How long an idle session's actor keeps its lease, unless a builder says otherwise.
pub const IDLE_TTL: Duration = Duration::from_secs(30);

/// A built module: what serves a state root's sessions.
pub struct Module {
    pub ops: Arc<Ops>,
    pub hub: Arc<Hub>,
    pub registry: Arc<Registry>,
    /// The held-call runtime (spec §19), when this process declares held replies and has a
    /// tool plane: start it with [`Module::start_held`] once the module serves.
    pub held: Option<Arc<Pullers>>,
}

impl Module {
    /// Boot of the held-call runtime ([`start_held`]).
    pub fn start_held(&self) {
        start_held(self.held.clone(), Arc::clone(&self.registry));
    }
}

/// Boot of the held-call runtime, off the startup path (spec §19 "At boot…"): a recreated
/// intake store is first rebuilt from the live WALs, tombstoned lineages are pruned from the
/// intake without opening an actor, every remaining session with a registration is opened (its
/// open-time recovery runs), then each module still needing its feed gets its puller.
pub fn start_held(held: Option<Arc<Pullers>>, registry: Arc<Registry>) {
    {
        let Some(pullers) = held else { return };
        let spawned = std::thread::Builder::new().name("broca-held-boot".into()).spawn(move || {
            if pullers.intake().needs_rebuild() {
                crate::held::rebuild::from_wals(registry.shared(), pullers.intake());
            }
            crate::held::rebuild::prune_tombstoned(registry.shared(), pullers.intake());
            let rows = pullers.intake().registrations().unwrap_or_default();
            let mut opened = std::collections::HashSet::new();
            for row in rows {
                if opened.insert(row.key.clone()) {
                    if let Err(e) = registry.open(&row.key) {
                        log::warn!("held calls: session {} could not be opened: {e}", row.key.addr());
                    }
                }
            }
            pullers.ensure_all();
        });
        if let Err(e) = spawned {
            log::error!("held calls: cannot start the boot thread: {e}");
        }
    }
}

/// Builds a [`Module`]; every setting has the serving default.
pub struct ModuleBuilder {
    root: StateRoot,
    storage: Arc<dyn Storage>,
    config: Arc<BrocaConfig>,
    catalog: Option<Result<Catalog, CatalogError>>,
    base_url_override: Option<String>,
    /// Whether catalog routes read their credential from the vault (and on mock routes too).
    vault: (bool, bool),
    idle_ttl: Duration,
    client: Arc<dyn ModelClient>,
    tools: Arc<dyn ToolDispatcher>,
    opts: LoopOptions,
    readmit: Option<Readmit>,
    readmit_from_catalog: bool,
    plane: Option<Arc<ToolPlane>>,
    clock: SharedClock,
    held: bool,
}

impl ModuleBuilder {
    /// The serving defaults: real files, the state root's LKG catalog, the HTTP client, no tool
    /// providers, the default loop options, [`IDLE_TTL`], and restart-paused runs re-admitted
    /// against the catalog before they resume.
    pub fn new(root: StateRoot) -> ModuleBuilder {
        ModuleBuilder {
            root,
            storage: Arc::new(FileStorage),
            config: Arc::default(),
            catalog: None,
            base_url_override: None,
            vault: (false, false),
            idle_ttl: IDLE_TTL,
            client: Arc::new(HttpClient::default()),
            tools: Arc::new(NoTools),
            opts: LoopOptions::default(),
            readmit: None,
            readmit_from_catalog: true,
            plane: None,
            clock: crate::clock::from_env(),
            held: crate::held::declared(),
        }
    }

    /// Where the WAL files live (tests: a `CrashStorage`).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// `broca.jsonc`, already loaded.
    pub fn config(mut self, config: Arc<BrocaConfig>) -> Self {
        self.config = config;
        self
    }

    /// The catalog to serve (default: the state root's `catalog/fusiform-lkg.json`).
    pub fn catalog(mut self, catalog: Result<Catalog, CatalogError>) -> Self {
        self.catalog = Some(catalog);
        self
    }

    /// `BROCA_PROVIDER_BASE_URL`: every route goes to this base URL (mock providers).
    pub fn base_url_override(mut self, url: Option<String>) -> Self {
        self.base_url_override = url;
        self
    }

    /// broca has a vault route: catalog routes freeze `AuthSource::Vault` (see
    /// [`RouteOverrides::vault`]); `on_override` keeps that on `base_url_override` routes.
    pub fn vault_routes(mut self, enabled: bool, on_override: bool) -> Self {
        self.vault = (enabled, on_override);
        self
    }

    /// The wall clock every durable time and retention decision reads (default: the process's,
    /// [`crate::clock::from_env`]; tests: a [`crate::clock::ManualClock`] they move).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    pub fn idle_ttl(mut self, idle_ttl: Duration) -> Self {
        self.idle_ttl = idle_ttl;
        self
    }

    pub fn tools(mut self, tools: Arc<dyn ToolDispatcher>) -> Self {
        self.tools = tools;
        self
    }

    /// Tools from other modules: plans are fetched and calls sent through `plane` (broca's
    /// consumer connection). Replaces [`ModuleBuilder::tools`].
    pub fn tool_plane(mut self, plane: Arc<ToolPlane>) -> Self {
        self.tools = Arc::clone(&plane) as Arc<dyn ToolDispatcher>;
        self.plane = Some(plane);
        self
    }

    pub fn loop_options(mut self, opts: LoopOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Re-admits restart-paused runs with `check` instead of the catalog (`None`: every
    /// resume is admitted).
    pub fn readmit(mut self, check: Option<Readmit>) -> Self {
        self.readmit = check;
        self.readmit_from_catalog = false;
        self
    }

    /// Declare held replies on tool routes and run the held-call runtime (default: what
    /// [`crate::held::declared`] says). Needs a tool plane.
    pub fn held(mut self, on: bool) -> Self {
        self.held = on;
        self
    }

    pub fn build(mut self) -> Result<Module, LineageError> {
        let shared = Arc::new(Shared::open_clocked(self.root, self.storage, self.clock)?);
        let held = match (&self.plane, self.held) {
            (Some(plane), true) => {
                let held_floor = shared.floor.features().iter().any(|f| f == crate::record::FEATURE_PROVIDER_HELD);
                let intake = crate::held::intake::Intake::open(shared.root.path(), held_floor)
                    .map_err(|e| LineageError::Refused(format!("the held-call intake store: {e}")))?;
                let registry_slot: Arc<std::sync::OnceLock<std::sync::Weak<Registry>>> = Arc::default();
                let slot = Arc::clone(&registry_slot);
                let deliver: crate::held::puller::Deliver =
                    Arc::new(move |reg, outcome| match slot.get().and_then(std::sync::Weak::upgrade) {
                        Some(registry) => registry.deliver_late(reg, outcome),
                        None => crate::held::LateAck::NotYet,
                    });
                let reading = Arc::clone(&shared);
                let still_waiting: crate::held::puller::StillWaiting =
                    Arc::new(move |reg| crate::held::rebuild::still_waiting(&reading, reg));
                let feed = Arc::clone(plane) as Arc<dyn crate::held::puller::FeedRoute>;
                let pullers = Pullers::new(Arc::new(intake), feed, deliver, still_waiting);
                self.opts.held = Some(Arc::clone(&pullers) as Arc<dyn crate::agent::CallRegistry>);
                Some((pullers, registry_slot))
            }
            _ => None,
        };
        let lkg = shared.root.catalog_path();
        let catalog = self.catalog.unwrap_or_else(|| Catalog::load_lkg(&lkg));
        let overrides = RouteOverrides {
            base_url_override: self.base_url_override,
            auth: AuthSource::None,
            vault: self.vault.0,
            vault_on_override: self.vault.1,
            auth_methods: self.config.auth_methods.clone(),
        };
        let admission = Arc::new(Admission {
            catalog: Arc::new(RwLock::new(catalog)),
            config: self.config,
            overrides,
            lkg,
            tools: self.plane.clone(),
            credentials: self.opts.credentials.clone(),
        });
        let hub = Arc::new(Hub::with_limits(&admission.config.limits));
        let readmit = if self.readmit_from_catalog {
            let admission = Arc::clone(&admission);
            Some(Arc::new(move |config: &_| admission.readmit(config)) as Readmit)
        } else {
            self.readmit
        };
        let (publish_hub, observed_hub) = (Arc::clone(&hub), Arc::clone(&hub));
        let deps = RunDeps {
            admission: Arc::clone(&admission),
            client: self.client,
            tools: self.tools,
            opts: self.opts,
            publish: Arc::new(move |key| {
                let mut publisher = publish_hub.publisher(key);
                Box::new(move |out| publisher.publish(out))
            }),
            idle_ttl: self.idle_ttl,
            observed: Arc::new(move |key| observed_hub.subscribers(key) > 0),
            readmit,
        };
        let registry = Registry::new(shared, deps);
        let held = held.map(|(pullers, slot)| {
            let _ = slot.set(Arc::downgrade(&registry));
            pullers
        });
        let ops = Arc::new(Ops { registry: Arc::clone(&registry), admission, refs: Arc::default() });
        Ok(Module { ops, hub, registry, held })
    }
}
