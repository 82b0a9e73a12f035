//! The subject: `Harness` and `LlmRunnerSubject` of the published suite over real broca
//! instances (`rig.rs`), the scripted model (`model.rs`) and the scripted tool provider
//! (`tools.rs`). Optional fixtures this adapter cannot provide keep the suite's own default
//! answer, which names the case not applicable or failing by name, never a pass.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cortexkit_role_llm_runner::read::HeadModel;
use cortexkit_role_llm_runner_conformance::harness::{
    Harness, HarnessError, KillPoint, KillReport, PointDeclaration, RouteStamp, Trigger,
};
use cortexkit_role_llm_runner_conformance::{
    AttributionFixture, Capability, LlmRunnerSubject, ModelRequestObservation, PlanSenderIdentity, Reply, RouteFailure,
    RunnerRoute, Script, ScriptedLateEntry, ToolResultLimitObservation, ToolResultObservation,
};
use serde_json::{json, Map, Value};
use subc_client_rs::SubcConsumer;
use subc_protocol::BindIdentity;

use crate::kill;
use crate::model::{Model, LANE_MARKER};
use crate::rig::{Rig, RigConfig, TOOLS};
use crate::route::Route;
use crate::tools::Tools;

/// The harness name every session route binds (`{project_root: "/", harness, session}`).
pub const HARNESS: &str = "conformance";
/// The model every session runs on: broca-mock's OpenAI Chat row in the seeded catalog.
const MODEL: (&str, &str) = ("mock", "echo-chat");
/// The model of the sessions the output_refs cases start: broca-mock's Anthropic Messages row.
const BLOCKS_MODEL: (&str, &str) = ("mock", "echo-messages");
/// How long a held model request is awaited.
const ARRIVAL: Duration = Duration::from_secs(30);
/// How long `switch_head_model` waits for the switching send's run to end.
const SWITCH_RUN: Duration = Duration::from_secs(60);

/// One runner instance: a state root and the rig serving it now.
pub struct Instance {
    pub root: PathBuf,
    rig: Mutex<Option<Rig>>,
}

impl Instance {
    pub fn new(root: PathBuf, rig: Rig) -> Instance {
        Instance { root, rig: Mutex::new(Some(rig)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Rig>> {
        self.rig.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn consumer(&self) -> Result<Arc<SubcConsumer>, String> {
        self.lock()
            .as_ref()
            .and_then(Rig::consumer)
            .ok_or_else(|| format!("the runner on {} is stopped", self.root.display()))
    }

    pub fn take_rig(&self) -> Option<Rig> {
        self.lock().take()
    }

    pub fn put_rig(&self, rig: Rig) {
        *self.lock() = Some(rig);
    }

    pub fn broca_log(&self) -> String {
        self.lock().as_ref().map(Rig::broca_log).unwrap_or_default()
    }
}

/// A live instance; dropping it stops its daemon, broca and the provider.
pub struct Handle(Arc<Instance>);

impl Handle {
    pub fn instance(&self) -> &Arc<Instance> {
        &self.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(mut rig) = self.0.take_rig() {
            rig.stop();
        }
    }
}

pub struct Subject {
    config: RigConfig,
    model: Model,
    tools: Tools,
    /// The groups broca's `role.describe` declares, read from the real binary before the run.
    groups: BTreeSet<Capability>,
    /// The bus every rig's broca publishes step hints on (`None`: no `nats-server` here).
    bus: Option<Arc<crate::bus::Bus>>,
    /// The instance each session was last routed on: `advance_retention_clock` and
    /// `switch_head_model` name only the session.
    instances: Mutex<HashMap<String, Arc<Instance>>>,
    /// Sessions switched to another model (`switch_head_model`): their later sends name it.
    switched: Mutex<HashMap<String, (&'static str, &'static str)>>,
    /// The parts of the message `read_parts` last split (for `shown_part_number`).
    last_parts: Mutex<Vec<(String, Value)>>,
    /// Sessions started by `output_refs_fields`, which run on [`BLOCKS_MODEL`].
    block_sessions: Mutex<BTreeSet<String>>,
    /// The instance a route was last opened on: `delivery_clock_now_ms` reads its clock.
    last_root: Mutex<Option<PathBuf>>,
}

impl Subject {
    pub fn new(
        config: RigConfig,
        model: Model,
        tools: Tools,
        groups: BTreeSet<Capability>,
        bus: Option<Arc<crate::bus::Bus>>,
    ) -> Subject {
        Subject {
            config,
            model,
            tools,
            groups,
            bus,
            instances: Mutex::default(),
            switched: Mutex::default(),
            last_parts: Mutex::default(),
            block_sessions: Mutex::default(),
            last_root: Mutex::default(),
        }
    }

    pub fn rig_config(&self) -> &RigConfig {
        &self.config
    }

    /// The instance `session` was last routed on.
    fn instance_of(&self, session: &str) -> Result<Arc<Instance>, HarnessError> {
        let instance = self.instances.lock().unwrap_or_else(|e| e.into_inner()).get(session).cloned();
        instance
            .ok_or_else(|| HarnessError::new(format!("session {session} was never routed, so no instance holds it")))
    }

    /// The model `session`'s sends name: the one it was switched to, else its row's.
    fn model_of(&self, session: &str) -> (&'static str, &'static str) {
        if let Some(model) = self.switched.lock().unwrap_or_else(|e| e.into_inner()).get(session) {
            return *model;
        }
        let blocks = self.block_sessions.lock().unwrap_or_else(|e| e.into_inner()).contains(session);
        if blocks {
            BLOCKS_MODEL
        } else {
            MODEL
        }
    }

    async fn start(&self, root: &Path) -> Result<Handle, HarnessError> {
        let rig = Rig::start(&self.config, root, None).await.map_err(HarnessError::new)?;
        Ok(Handle(Arc::new(Instance::new(root.to_owned(), rig))))
    }
}

/// A relay module's identity as a plan names it.
fn sender_identity(module: &str) -> PlanSenderIdentity {
    PlanSenderIdentity::new(RouteStamp { principal: format!("reserved:{module}"), scope: None }, module)
}

/// A route's answer, or its refusal or failure as the harness's error.
fn answer(reply: Result<Reply, RouteFailure>, what: &str) -> Result<Value, HarnessError> {
    match reply {
        Ok(Reply::Response(value)) => Ok(value),
        Ok(Reply::Error(error)) => Err(HarnessError::new(format!("{what} was refused: {error:?}"))),
        Err(failure) => Err(HarnessError::new(format!("{what} failed: {failure:?}"))),
    }
}

/// The capability groups a `role.describe` answer declares, as the suite names them.
pub fn declared_groups(describe: &Value) -> (BTreeSet<Capability>, Vec<String>) {
    let mut known = BTreeSet::new();
    let mut unknown = Vec::new();
    for group in describe["capabilities"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        match Capability::from_group(group) {
            Some(c) => {
                known.insert(c);
            }
            None => unknown.push(group.to_owned()),
        }
    }
    (known, unknown)
}

#[async_trait]
impl Harness for Subject {
    type Handle = Handle;
    type Route = Route;

    fn declared_points(&self) -> Vec<PointDeclaration> {
        kill::declarations()
    }

    async fn spawn(&self, state_root: &Path) -> Result<Handle, HarnessError> {
        self.start(state_root).await
    }

    async fn route(&self, handle: &Handle, stamp: &RouteStamp) -> Result<Route, HarnessError> {
        self.session_route(handle, "harness-route", stamp).await
    }

    async fn kill_at(
        &self,
        handle: Handle,
        point: &KillPoint,
        trigger: Trigger<'_>,
    ) -> Result<KillReport, HarnessError> {
        kill::kill_at(self, handle, point, trigger).await
    }

    async fn restart(&self, state_root: &Path) -> Result<Handle, HarnessError> {
        self.start(state_root).await
    }
}

#[async_trait]
impl LlmRunnerSubject for Subject {
    fn tool_provider_module(&self) -> String {
        TOOLS.to_owned()
    }

    async fn install_script(&self, session: &str, script: Script) -> Result<(), HarnessError> {
        for call in script.tool_calls() {
            self.tools.script_call(call).map_err(HarnessError::new)?;
        }
        if script.turns.iter().any(|turn| turn.model_failure.is_some()) {
            // The failure's reset time crosses the wire exactly on Anthropic's absolute reset
            // header (model.rs, `failure`).
            self.block_sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(session.to_owned());
        }
        self.model.install(session, script);
        Ok(())
    }

    async fn hold_next_model_step(&self, session: &str) -> Result<(), HarnessError> {
        self.model.arm_hold(session);
        Ok(())
    }

    async fn await_model_step(&self, session: &str) -> Result<(), HarnessError> {
        let until = Instant::now() + ARRIVAL;
        while !self.model.holding(session) {
            if Instant::now() > until {
                return Err(HarnessError::new(format!(
                    "no model request of {session} reached the hold within {ARRIVAL:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn release_model_step(&self, session: &str) -> Result<(), HarnessError> {
        self.model.release(session);
        Ok(())
    }

    async fn hold_next_model_stream(&self, session: &str, parts: usize) -> Result<(), HarnessError> {
        self.model.arm_stream_hold(session, parts);
        Ok(())
    }

    /// model.rs answers a scripted failure as the provider's own HTTP refusal (status, error
    /// document, `retry-after`, rate-limit reset), which broca's real client classifies, retries
    /// and records as the run's error.
    fn supports_model_failure_fixture(&self) -> bool {
        true
    }

    /// broca records a model switch the way its callers make one: a send naming another model
    /// (every `RunStarted` freezes the send's model; `session.head.model` is the newest one's).
    /// The owner sends one such prompt (on broca-mock's other row) and waits for its run to
    /// end; the session's later sends name the new model too. The selection returned is the
    /// one the send asked for, never read back from broca.
    async fn switch_head_model(&self, session: &str) -> Result<Option<HeadModel>, HarnessError> {
        let instance = self.instance_of(session)?;
        let next = if self.model_of(session) == MODEL { BLOCKS_MODEL } else { MODEL };
        self.switched.lock().unwrap_or_else(|e| e.into_inner()).insert(session.to_owned(), next);
        let route = Route { instance, identity: BindIdentity::new(HARNESS, session), via: Some(crate::rig::OWNER) };
        let mut params = self.send_fields(session, false);
        params.insert("prompt".into(), json!("switching models"));
        params.insert("send_id".into(), json!(format!("switch-{session}")));
        let sent = answer(route.request("session.send", Value::Object(params)).await, "the switching send")?;
        let run_id = sent["run_id"].as_str().map(str::to_owned);
        let until = Instant::now() + SWITCH_RUN;
        loop {
            let head = answer(route.request("session.head", json!({})).await, "session.head")?;
            let last = &head["last_run_state"];
            let ended = !matches!(last["state"].as_str(), None | Some("active" | "pending" | "paused"));
            if ended && (run_id.is_none() || last["run_id"].as_str() == run_id.as_deref()) {
                break;
            }
            if Instant::now() > until {
                return Err(HarnessError::new(format!("the switching send's run did not end: {head}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Some(HeadModel::new(next.0, next.1)))
    }

    fn session_usage_fixtures(&self) -> bool {
        // Scripted usage reaches broca exactly as scripted, on the Chat wire's usage chunk
        // (cache reads and writes in prompt_tokens_details, reasoning in completion details).
        true
    }

    async fn install_attribution_fixture(
        &self,
        _handle: &Handle,
        _session: &str,
    ) -> Result<AttributionFixture, HarnessError> {
        // Every record that puts a message in broca's transcript names its run (RunStarted,
        // ModelStepFinished, ToolResult, Steered: src/record.rs); a Queued send is no message
        // until a run starts or steers it, and broca seeds or imports nothing (seed_from is
        // fresh only). So no native write path can hold a message without its run.
        Ok(AttributionFixture::CannotHoldUnattributable)
    }

    fn not_executed_tool_result(&self, message: &Value, tool_call_id: &str) -> Option<ToolResultObservation> {
        crate::decode::not_executed(message, tool_call_id)
    }

    fn oversized_tool_result(&self, message: &Value, tool_call_id: &str) -> Option<ToolResultLimitObservation> {
        crate::decode::oversized(message, tool_call_id)
    }

    /// The tier cases run on broca-mock's Anthropic Messages row: broca declares `fast` there
    /// with the served level `unknown` (it renders `speed: "fast"` and reads no statement back),
    /// and not `ultrafast`; the scripted stream states no tier. The held step is the front's.
    async fn configure_service_tier(&self, session: &str, _case: &str) -> Result<bool, HarnessError> {
        self.block_sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(session.to_owned());
        Ok(true)
    }

    async fn model_invocations(&self, session: &str) -> Result<usize, HarnessError> {
        Ok(self.model.invocations(session))
    }

    async fn model_requests(&self, session: &str) -> Result<Vec<ModelRequestObservation>, HarnessError> {
        Ok(self.model.requests(session))
    }

    async fn tool_invocations(&self, arguments: &Value) -> usize {
        match self.tools.invocations(arguments) {
            Ok(n) => n,
            Err(e) => {
                // The trait has no error here; an unreadable log must not read as "never ran".
                eprintln!("conformance: {e}");
                usize::MAX
            }
        }
    }

    async fn await_tool_call(&self, arguments: &Value) -> Result<(), HarnessError> {
        self.tools.await_held(arguments).await.map_err(HarnessError::new)
    }

    async fn release_tool_call(&self, arguments: &Value) -> Result<(), HarnessError> {
        self.tools.release(arguments).map_err(HarnessError::new)
    }

    async fn install_held_reply(&self, _session: &str, arguments: &Value, reason: &str) -> Result<(), HarnessError> {
        self.tools.hold_reply(arguments, reason).map_err(HarnessError::new)
    }

    async fn await_held_reply(&self, arguments: &Value) -> Result<String, HarnessError> {
        self.tools.held_call_key(arguments).await.map_err(HarnessError::new)
    }

    async fn publish_late_entry(&self, arguments: &Value, entry: ScriptedLateEntry) -> Result<(), HarnessError> {
        self.tools.publish_late(arguments, &entry).map_err(HarnessError::new)
    }

    async fn pause(&self) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    fn model_finish_reason_source(&self) -> Option<&'static str> {
        // model.rs sends each scripted reason raw on the Chat wire and cuts an answer at the cap
        // the request carried, reporting `length`.
        Some("openai.chat_completions")
    }

    fn retention_probe_params(&self, _session: &str, method: &str) -> Result<Option<Vec<Value>>, HarnessError> {
        match method {
            // Spec §4a: request and warm-body hashes, token counts and times; no content.
            "session.warm" => Ok(None),
            other => Err(HarnessError::new(format!(
                "{other} is advertised on broca's session route but not classified for the retention \
                 leak check (tests/conformance/subject.rs, retention_probe_params)"
            ))),
        }
    }

    /// A host-side change that never reaches the model: new write times on the session's WAL
    /// and the run index, its run-index rows dropped and rebuilt from the WAL, and a restart of
    /// the instance (host.rs).
    async fn change_host_metadata(&self, handle: &Handle, session: &str) -> Result<(), HarnessError> {
        crate::host::change_metadata(self, handle, session).await
    }

    async fn advance_retention_clock(&self, session: &str, milliseconds: u64) -> Result<(), HarnessError> {
        let root = self.instance_of(session)?.root.clone();
        let session = session.to_owned();
        tokio::task::spawn_blocking(move || crate::retention::advance(&root, &session, milliseconds))
            .await
            .map_err(|e| HarnessError::new(e.to_string()))?
            .map_err(HarnessError::new)
    }

    async fn retention_deletion_finished(&self, handle: &Handle, session: &str) -> Result<bool, HarnessError> {
        crate::retention::deletion_finished(&handle.instance().root, session).map_err(HarnessError::new)
    }

    async fn step_event_observation(
        &self,
        handle: &Handle,
        session: &str,
    ) -> Result<cortexkit_role_llm_runner_conformance::step_events::StepEventObservation, HarnessError> {
        let Some(bus) = &self.bus else {
            return Err(HarnessError::new("no nats-server here, so no rig names a bus"));
        };
        bus.observe(&handle.instance().root, session).await.map_err(HarnessError::new)
    }

    fn runner_id(&self) -> &str {
        crate::rig::BROCA
    }

    fn capabilities(&self) -> BTreeSet<Capability> {
        let mut declared = self.groups.clone();
        declared.insert(Capability::HoldToolCalls);
        // model.rs records each request's texts (`ModelRequestObservation::rendered`).
        declared.insert(Capability::RenderedModelInput);
        declared.insert(Capability::HostMetadataChange);
        // retention.rs: every instance's broca runs on a clock an advance moves.
        declared.insert(Capability::RetentionClock);
        declared
    }

    fn owner_stamp(&self) -> RouteStamp {
        RouteStamp { principal: format!("reserved:{}", crate::rig::OWNER), scope: None }
    }

    fn stranger_stamp(&self) -> RouteStamp {
        RouteStamp { principal: format!("reserved:{}", crate::rig::STRANGER), scope: None }
    }

    /// The daemon stamps every route this process opens as its `direct` caller, which is never
    /// a session's owner: the owner and the stranger call through relay modules the daemon
    /// launched (`broca-mock relay`), so broca sees their attested principals.
    async fn session_route(&self, handle: &Handle, session: &str, stamp: &RouteStamp) -> Result<Route, HarnessError> {
        let via = crate::rig::RELAYS
            .into_iter()
            .find(|relay| stamp.scope.is_none() && stamp.principal == format!("reserved:{relay}"));
        let Some(via) = via else {
            return Err(HarnessError::new(format!(
                "this adapter opens routes only as one of the relays {:?}, not as {stamp:?}",
                crate::rig::RELAYS
            )));
        };
        *self.last_root.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle.instance().root.clone());
        self.instances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.to_owned(), Arc::clone(handle.instance()));
        Ok(Route {
            instance: Arc::clone(handle.instance()),
            identity: BindIdentity::new(HARNESS, session),
            via: Some(via),
        })
    }

    /// The first send's fields with the plan's tool item opted into output references: broca
    /// renders part numbers for such a session (README, "Output references"), and the
    /// scripted tool declares the `data` (token) and `program` (rich-ui/1 source) slots.
    /// Such a session runs on broca-mock's Anthropic Messages row: its stream keeps a reply's
    /// text parts apart as content blocks (the shared-samples case scripts one per sample),
    /// where Chat's single text channel joins them.
    fn output_refs_fields(&self, session: &str) -> Result<Map<String, Value>, HarnessError> {
        self.block_sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(session.to_owned());
        let mut fields = self.send_fields(session, true);
        fields.insert("plan".into(), json!({"tool_items": [{"provider": TOOLS, "params": {}, "output_refs": true}]}));
        Ok(fields)
    }

    /// The parts of a read message keyed as broca publishes them (`p<index>` of the body's
    /// `content`, as display rows and descriptor reads' `part_digests` key them), remembered for
    /// the `shown_part_number` call the suite makes next about one of them.
    fn read_parts(&self, message: &Value) -> Vec<(String, Value)> {
        let parts: Vec<(String, Value)> = match message.get("content") {
            Some(Value::Array(parts)) => parts.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.clone())).collect(),
            _ => Vec::new(),
        };
        *self.last_parts.lock().unwrap_or_else(|e| e.into_inner()) = parts.clone();
        parts
    }

    /// The number a part was shown with, read from the requests the scripted model received
    /// (`§N§ ` in front of the part's text, as broca renders it): the part is the one of the
    /// message `read_parts` was last asked about. A part no request has shown yet (the model's
    /// last reply) is the next number: broca's numbers are contiguous (compaction A3 T4), and
    /// the output_refs cases check the number against the writing request's records.
    fn shown_part_number(&self, session: &str, _mid: &str, part: &str) -> Option<u64> {
        let parts = self.last_parts.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (_, value) = parts.into_iter().find(|(key, _)| key == part)?;
        let text = match value["type"].as_str()? {
            "text" => value["text"].as_str()?.to_owned(),
            "tool_result" => broca::message::tool_result_content(&value["output"]),
            _ => return None,
        };
        let shown: Vec<(u64, String)> = self
            .model
            .requests(session)
            .iter()
            .flat_map(|r| r.rendered.clone())
            .filter_map(|t| {
                let rest = t.strip_prefix('§')?;
                let (n, body) = rest.split_once("§ ")?;
                Some((n.parse().ok()?, body.to_owned()))
            })
            .collect();
        match shown.iter().find(|(_, body)| *body == text) {
            Some((n, _)) => Some(*n),
            None => Some(shown.iter().map(|(n, _)| *n).max().unwrap_or(0) + 1),
        }
    }

    /// The delivery-order cases' plan sender: a relay module of its own.
    fn plan_sender(&self) -> Option<PlanSenderIdentity> {
        Some(sender_identity(crate::rig::SENDER_A))
    }

    /// Two named senders besides the owner and the stranger (head.sender, succession and
    /// message-sender cases).
    fn head_sender_identities(&self) -> Option<[PlanSenderIdentity; 2]> {
        Some([sender_identity(crate::rig::SENDER_A), sender_identity(crate::rig::SENDER_B)])
    }

    /// The send's fields with `members` (a plan's `senders`, say) added to the session's plan:
    /// a later send repeats the whole plan, whose identity must match the frozen one.
    fn send_fields_with_plan(
        &self,
        session: &str,
        _first: bool,
        members: &Map<String, Value>,
    ) -> Option<Map<String, Value>> {
        let mut fields = self.send_fields(session, true);
        // The tool item opts into output references, so the session's requests show part
        // numbers and a template's `part_tag` slot can name one (llm-runner §9.7).
        let plan = json!({"tool_items": [{"provider": TOOLS, "params": {}, "output_refs": true}]});
        fields.insert("plan".into(), plan);
        fields.get_mut("plan")?.as_object_mut()?.extend(members.clone());
        Some(fields)
    }

    /// The clock broca decides a send's expiry on: the instance's offset clock (`retention.rs`),
    /// read for the instance a route was last opened on (the case's own session's).
    fn delivery_clock_now_ms(&self) -> Option<u64> {
        let root = self.last_root.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        Some(crate::retention::now_ms(&root))
    }

    /// broca owns its loop: a send is staged the moment it is accepted (llm-runner §9.7).
    async fn send_staged(&self, _session: &str, _send_id: &str) -> Result<(), HarnessError> {
        Ok(())
    }

    /// broca stores every body in its own `owned-broca` profile.
    fn serializer_profile(&self, _session: &str) -> Option<String> {
        Some(cortexkit_role_llm_runner::serializer_profile::OWNED_BROCA.into())
    }

    /// The scripted tool's `tool-result/v1` answer holding one image part of exactly `bytes`
    /// (a PNG: its header gives the part's required dimensions; anything else is not offered).
    /// broca keeps a tool's image inside the call's `tool_result` part, so a result is always
    /// nested; `nested` asks for nothing broca stores differently.
    fn media_tool_result(&self, bytes: &[u8], _nested: bool, _scenario: &str) -> Option<Value> {
        use base64::Engine;
        let dimension = |at: usize| Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        if !bytes.starts_with(b"\x89PNG\r\n\x1a\n") || bytes.get(12..16) != Some(b"IHDR") {
            return None;
        }
        let (width, height) = (dimension(16)?, dimension(20)?);
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        Some(
            json!({"content": [{"type": "image", "mimeType": "image/png", "data": data, "width": width, "height": height}]}),
        )
    }

    /// The scripted tool's `tool-result/v1` answer with one text part per text, in order.
    fn multipart_tool_result(&self, texts: &[String]) -> Option<Value> {
        Some(json!({"content": texts.iter().map(|t| json!({"type": "text", "text": t})).collect::<Vec<_>>()}))
    }

    fn send_fields(&self, session: &str, first: bool) -> Map<String, Value> {
        let lane = self.model.lane(session);
        let mut fields = Map::new();
        let model = self.model_of(session);
        fields.insert("model".into(), json!({"provider": model.0, "model": model.1}));
        // The scripted model keys its answers by this line (model.rs).
        fields.insert("system".into(), json!(format!("{LANE_MARKER}{lane}")));
        if first {
            fields.insert("plan".into(), json!({"tool_items": [{"provider": TOOLS, "params": {}}]}));
        }
        fields
    }
}
