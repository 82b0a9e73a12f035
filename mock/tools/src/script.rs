//! The tool script: what the provider serves and how each call behaves. The format is documented
//! in [`crate`] (`lib.rs`); [`ToolScript::builtin`] is the set served without `--tools`.
//!
//! Invariants of a [`ToolScript`] (checked once, by [`ToolScript::from_file`]):
//! - tool names are unique, non-empty, and never a role op's name;
//! - every schema is flat (`check_flat_schema`), every `reply` valid (`check_reply`), every
//!   capability tag well formed (`check_capability_tag`), and each tool's `schema_digest` is
//!   computed from its schema (never taken from the script);
//! - presets are unique valid names, at most `MAX_PRESETS`, and a tool names only listed ones;
//! - every behaviour has exactly one answer and bounded delays and sizes.

use std::collections::BTreeSet;
use std::fmt;

use cortexkit_role_tool_provider::catalog::{
    self, check_flat_schema, check_reply, schema_digest, valid_preset_name, CatalogAnswer, CatalogTool, Reply,
    MAX_PRESETS, REPLY_MAX_MS,
};
use cortexkit_role_tool_provider::result::{HeldReply, ResultFormat};
use cortexkit_role_tool_provider::{check_capability_tag, ops, KEEPALIVE_INTERVAL_MS};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use subc_protocol::scope::{ScopeKind, ScopeRecord, ScopeStamp};
use subc_protocol::ErrorBody;

/// The largest script file read.
pub const MAX_SCRIPT_BYTES: u64 = 4 * 1024 * 1024;
/// The most tools one script serves.
pub const MAX_TOOLS: usize = 256;
/// The most rules one tool has.
pub const MAX_RULES: usize = 64;
/// The longest scripted delay (the role's `reply.max_ms` ceiling, 24 h).
pub const MAX_DELAY_MS: u64 = REPLY_MAX_MS;
/// The largest `big` result, in model-visible bytes.
pub const MAX_BIG_BYTES: usize = 8 * 1024 * 1024;
/// The default `big` result: 70 KiB, over the 65,536-byte model-visible limit.
pub const DEFAULT_BIG_BYTES: usize = 70 * 1024;
/// The most scope records synced at start.
pub const MAX_SCOPES: usize = 64;

/// The role's op names: never a catalog tool's (role ops are never model tools).
pub const ROLE_OPS: &[&str] = &[
    ops::ROLE_DESCRIBE,
    ops::TOOL_CATALOG,
    ops::TOOL_VIEWS,
    ops::USER_COMMAND_INVOKE,
    ops::TOOL_WITHDRAW,
    ops::LATE_RESULTS,
    ops::LATE_RESULTS_ACK,
];

/// Which kind of route a tool is offered on: unscoped, or under a daemon-stamped scope of a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeClass {
    Unscoped,
    Head,
    Worker,
    Ephemeral,
}

impl ScopeClass {
    pub fn of(scope: Option<&ScopeStamp>) -> ScopeClass {
        match scope.map(|s| s.kind) {
            None => ScopeClass::Unscoped,
            Some(ScopeKind::Head) => ScopeClass::Head,
            Some(ScopeKind::Worker) => ScopeClass::Worker,
            Some(ScopeKind::Ephemeral) => ScopeClass::Ephemeral,
        }
    }
}

/// A `big` answer: a text result of `bytes` model-visible bytes, or of the integer argument
/// named `from` when the call has one.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BigSpec {
    #[serde(default = "default_big_bytes")]
    pub bytes: usize,
    #[serde(default)]
    pub from: Option<String>,
}

fn default_big_bytes() -> usize {
    DEFAULT_BIG_BYTES
}

/// What a call answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The call's arguments.
    Echo,
    /// This text.
    Text(String),
    /// This JSON value, as the reply body verbatim.
    Result(Value),
    /// An Error frame with this body.
    Refuse(ErrorBody),
    /// A Response whose body is these bytes, verbatim (not what the role defines).
    Malformed(String),
    /// A text result of a given size.
    Big(BigSpec),
    /// Nothing, until CANCEL (or, with `ignore_cancel`, not even then).
    Hang { ignore_cancel: bool },
    /// `{key, count}`: how many times this call's key has been received, this one included.
    Count,
    /// What the daemon stamped on the route, and the call's preset.
    WhoAmI,
    /// The JSON in `<dir>/<sha256 of the canonical arguments>.json`, written by a test before
    /// the call; while `<…>.hold` exists the call waits (its arrival marked by `<…>.held`); with
    /// `<…>.held-reply` it answers a held first reply instead (`provider/held.rs`).
    FromDir(std::path::PathBuf),
    /// A held first reply (`held-reply/v1`) when the route, the tool and the call allow one, the
    /// answer coming later through `late_results`; otherwise the echo of the arguments.
    Held(HeldSpec),
}

/// A `held` answer: the reason, the interim text, an optional automatic release, and `force`
/// to send the held body even where the bind's terms forbid it (a deliberately broken provider).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldSpec {
    pub reason: String,
    /// The interim model-facing text; default `waiting: <reason>`.
    #[serde(default)]
    pub text: Option<String>,
    /// Settle the call this long after it was held, with a `result` entry echoing the arguments.
    #[serde(default)]
    pub release_after_ms: Option<u64>,
    #[serde(default)]
    pub force: bool,
}

impl HeldSpec {
    pub fn interim_text(&self) -> String {
        self.text.clone().unwrap_or_else(|| format!("waiting: {}", self.reason))
    }
}

/// The script's spelling of a behaviour: modifiers plus exactly one answer member.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BehaviourSpec {
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    refuse: Option<ErrorBody>,
    #[serde(default)]
    malformed: Option<String>,
    #[serde(default)]
    big: Option<BigSpec>,
    #[serde(default)]
    hang: bool,
    #[serde(default)]
    ignore_cancel: bool,
    #[serde(default)]
    count: bool,
    #[serde(default)]
    whoami: bool,
    #[serde(default)]
    from_dir: Option<std::path::PathBuf>,
    #[serde(default)]
    held: Option<HeldSpec>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    delay_from: Option<String>,
    #[serde(default)]
    keepalive: Option<bool>,
}

/// How a call behaves: an optional delay (with keepalives), then its answer.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(try_from = "BehaviourSpec")]
pub struct Behaviour {
    pub answer: Answer,
    /// A fixed delay before answering.
    pub delay_ms: u64,
    /// An integer argument that, when present, replaces `delay_ms`.
    pub delay_from: Option<String>,
    /// Keepalives while the call waits; `None`: yes while delaying, no while hanging.
    pub keepalive: Option<bool>,
}

impl Default for Behaviour {
    fn default() -> Behaviour {
        Behaviour::answer(Answer::Echo)
    }
}

impl Behaviour {
    pub fn answer(answer: Answer) -> Behaviour {
        Behaviour { answer, delay_ms: 0, delay_from: None, keepalive: None }
    }

    /// The delay for a call with `arguments`, within [`MAX_DELAY_MS`].
    pub fn delay_for(&self, arguments: &Value) -> u64 {
        let from = self.delay_from.as_deref().and_then(|name| arguments.get(name)).and_then(Value::as_u64);
        from.unwrap_or(self.delay_ms).min(MAX_DELAY_MS)
    }

    /// Whether keepalives are sent while this behaviour waits (if the route also declared them).
    pub fn sends_keepalives(&self) -> bool {
        self.keepalive.unwrap_or(!matches!(self.answer, Answer::Hang { .. }))
    }
}

impl TryFrom<BehaviourSpec> for Behaviour {
    type Error = String;

    fn try_from(s: BehaviourSpec) -> Result<Behaviour, String> {
        let mut answers = Vec::new();
        if s.echo {
            answers.push(Answer::Echo);
        }
        if let Some(text) = s.text {
            answers.push(Answer::Text(text));
        }
        if let Some(value) = s.result {
            answers.push(Answer::Result(value));
        }
        if let Some(body) = s.refuse {
            answers.push(Answer::Refuse(body));
        }
        if let Some(raw) = s.malformed {
            answers.push(Answer::Malformed(raw));
        }
        if let Some(big) = s.big {
            if big.bytes > MAX_BIG_BYTES {
                return Err(format!("big.bytes {} is over the {MAX_BIG_BYTES}-byte bound", big.bytes));
            }
            answers.push(Answer::Big(big));
        }
        if s.hang {
            answers.push(Answer::Hang { ignore_cancel: s.ignore_cancel });
        } else if s.ignore_cancel {
            return Err("ignore_cancel goes with hang".into());
        }
        if s.count {
            answers.push(Answer::Count);
        }
        if s.whoami {
            answers.push(Answer::WhoAmI);
        }
        if let Some(dir) = s.from_dir {
            answers.push(Answer::FromDir(dir));
        }
        if let Some(held) = s.held {
            // A forced held body may carry a malformed reason on purpose.
            if !held.force {
                HeldReply::new(held.reason.clone()).validate().map_err(|p| format!("held.reason: {p}"))?;
            }
            if held.release_after_ms.is_some_and(|ms| ms > MAX_DELAY_MS) {
                return Err(format!("held.release_after_ms is over {MAX_DELAY_MS}"));
            }
            answers.push(Answer::Held(held));
        }
        let answer = match answers.len() {
            0 => Answer::Echo,
            1 => answers.remove(0),
            _ => {
                return Err(
                    "a behaviour has one answer: echo, text, result, refuse, malformed, big, hang, count, whoami, from_dir or held"
                        .into(),
                )
            }
        };
        let delay_ms = s.delay_ms.unwrap_or(0);
        if delay_ms > MAX_DELAY_MS {
            return Err(format!("delay_ms {delay_ms} is over {MAX_DELAY_MS}"));
        }
        Ok(Behaviour { answer, delay_ms, delay_from: s.delay_from, keepalive: s.keepalive })
    }
}

/// When a rule applies: every listed top-level argument equals the call's, and the preset matches.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    #[serde(default)]
    pub arguments: Map<String, Value>,
    #[serde(default)]
    pub preset: Option<String>,
}

impl When {
    fn matches(&self, arguments: &Value, preset: Option<&str>) -> bool {
        let args_match = self.arguments.iter().all(|(k, v)| arguments.get(k) == Some(v));
        let preset_match = self.preset.as_deref().is_none_or(|p| preset == Some(p));
        args_match && preset_match
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub when: When,
    pub then: Behaviour,
}

fn yes() -> bool {
    true
}

fn object_schema() -> Value {
    json!({"type": "object"})
}

fn one() -> u64 {
    1
}

/// One tool as the script declares it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default = "object_schema")]
    pub input_schema: Value,
    #[serde(default = "one")]
    pub semantics: u64,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub reply: Option<Reply>,
    #[serde(default)]
    pub result_format: Option<ResultFormat>,
    #[serde(default)]
    pub emits_events: Option<bool>,
    /// Reference-bearing arguments (`[{name, kind: "token" | "source:<dialect>"}]`), declared
    /// in the catalog as tool-provider's `reference_slots`.
    #[serde(default)]
    pub reference_slots: Vec<catalog::ReferenceSlot>,
    /// Listed in the answer to a catalog request without a preset.
    #[serde(default = "yes")]
    pub default: bool,
    /// The presets whose catalog lists it; absent: every preset.
    #[serde(default)]
    pub presets: Option<Vec<String>>,
    /// The route scopes whose catalog lists it; absent: every route.
    #[serde(default)]
    pub scopes: Option<Vec<ScopeClass>>,
    #[serde(default)]
    pub behaviour: Behaviour,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// The script file (`--tools FILE`, JSON with `//` and `/* */` comments and trailing commas).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptFile {
    #[serde(default)]
    pub implementation_version: Option<String>,
    /// Declare `call-keepalive/v1` (manifest) and send keepalives on routes that declare it.
    #[serde(default = "yes")]
    pub keepalive: bool,
    /// The keepalive period, 1 to 30,000 ms (the role's `KEEPALIVE_INTERVAL_MS`).
    #[serde(default)]
    pub keepalive_interval_ms: Option<u64>,
    /// Declare the `late_results` session capability and serve `late_results` /
    /// `late_results.ack`: an always-empty log, or with `late_results_dir` the durable store of
    /// held calls and their late entries (`late.rs`).
    #[serde(default)]
    pub late_results: bool,
    /// Where held calls and late entries live (`late.rs`); needs `late_results: true`.
    #[serde(default)]
    pub late_results_dir: Option<std::path::PathBuf>,
    /// The presets served, listed in every preset-less catalog answer.
    #[serde(default)]
    pub presets: Vec<String>,
    /// Refuse a call without a preset on a scoped route (`invalid_request {field: "preset"}`).
    #[serde(default = "yes")]
    pub scoped_calls_need_preset: bool,
    /// Scopes this module owns, synced with the daemon when it starts (`scope.sync`), so routes
    /// can be opened under them (list `{"principal": {"kind": "direct"}}` among the carriers to
    /// let a plain test client open them).
    #[serde(default)]
    pub scopes: Vec<ScopeRecord>,
    /// Serve the built-in tools too (before the script's own; a script tool of the same name
    /// replaces a built-in).
    #[serde(default)]
    pub builtins: bool,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
}

/// A tool ready to serve: its spec and its catalog entry.
#[derive(Clone, Debug)]
pub struct Tool {
    pub spec: ToolSpec,
    pub entry: CatalogTool,
}

impl Tool {
    /// The behaviour for one call: the first matching rule's, else the tool's own.
    pub fn behaviour_for(&self, arguments: &Value, preset: Option<&str>) -> &Behaviour {
        self.spec.rules.iter().find(|r| r.when.matches(arguments, preset)).map_or(&self.spec.behaviour, |r| &r.then)
    }

    /// Whether the catalog for `preset` on a route of `scope` lists this tool.
    pub fn offered(&self, preset: Option<&str>, scope: ScopeClass) -> bool {
        let by_preset = match preset {
            None => self.spec.default,
            Some(p) => self.spec.presets.as_ref().is_none_or(|ps| ps.iter().any(|x| x == p)),
        };
        by_preset && self.spec.scopes.as_ref().is_none_or(|s| s.contains(&scope))
    }
}

/// A validated script.
#[derive(Clone, Debug)]
pub struct ToolScript {
    pub implementation_version: String,
    pub keepalive: bool,
    pub keepalive_interval_ms: u64,
    pub late_results: bool,
    /// The late-results store's directory; only with `late_results`.
    pub late_results_dir: Option<std::path::PathBuf>,
    pub presets: Vec<String>,
    pub scoped_calls_need_preset: bool,
    pub scopes: Vec<ScopeRecord>,
    pub tools: Vec<Tool>,
    /// Opaque; changes whenever the served definitions change.
    pub generation: String,
}

/// Why a script is refused.
#[derive(Debug)]
pub struct ScriptError(pub String);

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScriptError {}

fn err(message: impl Into<String>) -> ScriptError {
    ScriptError(message.into())
}

impl ToolScript {
    /// Parses a script's text (JSONC).
    pub fn from_jsonc(text: &str) -> Result<ToolScript, ScriptError> {
        let json = jsonc_to_json(text).map_err(err)?;
        let file: ScriptFile = serde_json::from_str(&json).map_err(|e| err(e.to_string()))?;
        ToolScript::from_file(file)
    }

    /// Reads and parses the script at `path`.
    pub fn load(path: &std::path::Path) -> Result<ToolScript, ScriptError> {
        let meta = std::fs::metadata(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        if meta.len() > MAX_SCRIPT_BYTES {
            return Err(err(format!("{} is over the {MAX_SCRIPT_BYTES}-byte bound", path.display())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        ToolScript::from_jsonc(&text).map_err(|e| err(format!("{}: {e}", path.display())))
    }

    /// The built-in set: `echo`, `sleep`, `fail`, `big`, `hang`, `counter`, `whoami`, presets
    /// `default` (every tool) and `worker` (`echo`, `sleep`, `counter`, `whoami`).
    pub fn builtin() -> ToolScript {
        ToolScript::from_file(ScriptFile::builtin()).expect("the built-in script is valid")
    }

    /// Validates `file` and builds every catalog entry.
    pub fn from_file(file: ScriptFile) -> Result<ToolScript, ScriptError> {
        let mut specs: Vec<ToolSpec> = if file.builtins { ScriptFile::builtin().tools } else { Vec::new() };
        let mut presets = file.presets.clone();
        if file.builtins {
            for p in ScriptFile::builtin().presets {
                if !presets.contains(&p) {
                    presets.push(p);
                }
            }
        }
        let mut own = BTreeSet::new();
        for tool in file.tools {
            if !own.insert(tool.name.clone()) {
                return Err(err(format!("tool {:?} is declared twice", tool.name)));
            }
            // A script tool replaces the built-in of its name.
            specs.retain(|t| t.name != tool.name);
            specs.push(tool);
        }
        check_presets(&presets)?;
        if specs.len() > MAX_TOOLS {
            return Err(err(format!("{} tools, over the bound of {MAX_TOOLS}", specs.len())));
        }
        if file.scopes.len() > MAX_SCOPES {
            return Err(err(format!("{} scopes, over the bound of {MAX_SCOPES}", file.scopes.len())));
        }
        if file.late_results_dir.is_some() && !file.late_results {
            return Err(err("late_results_dir needs \"late_results\": true"));
        }
        let keepalive_interval_ms = file.keepalive_interval_ms.unwrap_or(KEEPALIVE_INTERVAL_MS);
        if !(1..=KEEPALIVE_INTERVAL_MS).contains(&keepalive_interval_ms) {
            return Err(err(format!("keepalive_interval_ms must be 1 to {KEEPALIVE_INTERVAL_MS}")));
        }
        let mut names = BTreeSet::new();
        let mut tools = Vec::with_capacity(specs.len());
        for spec in specs {
            let entry = catalog_entry(&spec, &presets)?;
            if !names.insert(spec.name.clone()) {
                return Err(err(format!("tool {:?} is declared twice", spec.name)));
            }
            tools.push(Tool { spec, entry });
        }
        let mut script = ToolScript {
            implementation_version: file
                .implementation_version
                .unwrap_or_else(|| format!("broca-mock {}", env!("CARGO_PKG_VERSION"))),
            keepalive: file.keepalive,
            keepalive_interval_ms,
            late_results: file.late_results,
            late_results_dir: file.late_results_dir,
            presets,
            scoped_calls_need_preset: file.scoped_calls_need_preset,
            scopes: file.scopes,
            tools,
            generation: String::new(),
        };
        script.generation = script.compute_generation();
        Ok(script)
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.spec.name == name)
    }

    pub fn lists_preset(&self, preset: &str) -> bool {
        self.presets.iter().any(|p| p == preset)
    }

    /// Every definition the provider can advertise, in one digest.
    fn compute_generation(&self) -> String {
        let all: Vec<Value> = self
            .tools
            .iter()
            .map(|t| json!({"entry": t.entry, "default": t.spec.default, "presets": t.spec.presets, "scopes": t.spec.scopes.as_ref().map(|s| s.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>())}))
            .collect();
        let basis = json!({"tools": all, "presets": self.presets, "late_results": self.late_results});
        format!("mock-{}", &sha256_hex(basis.to_string().as_bytes())[..16])
    }

    /// The catalog answer for `preset` on a route of `scope`, resolved against `composition`.
    /// The digest covers everything else in the answer, so a `digest_only` answer to the same
    /// inputs carries the same value.
    pub fn catalog(
        &self,
        preset: Option<&str>,
        scope: ScopeClass,
        composition: Option<&Map<String, Value>>,
        digest_only: bool,
    ) -> Result<CatalogAnswer, ErrorBody> {
        let tools: Vec<CatalogTool> =
            self.tools.iter().filter(|t| t.offered(preset, scope)).map(|t| t.entry.clone()).collect();
        let mut answer = CatalogAnswer::new(self.generation.clone(), String::new()).with_tools(tools);
        if let Some(c) = composition {
            let digest = catalog::composition_digest(&Value::Object(c.clone()))
                .map_err(|e| cortexkit_role_tool_provider::errors::invalid_request("composition", e.to_string()))?;
            answer = answer.with_composition_digest(digest);
        }
        if self.late_results {
            let mut caps = Map::new();
            caps.insert(catalog::session_capabilities::LATE_RESULTS.into(), Value::Bool(true));
            answer = answer.with_capabilities(caps);
        }
        if preset.is_none() {
            answer = answer.with_presets(self.presets.clone());
        }
        let bytes = serde_json::to_vec(&answer).expect("catalog answers serialize");
        answer.catalog_digest = sha256_hex(&bytes);
        if digest_only {
            return Ok(CatalogAnswer::new(answer.generation, answer.catalog_digest));
        }
        Ok(answer)
    }
}

fn check_presets(presets: &[String]) -> Result<(), ScriptError> {
    if presets.len() > MAX_PRESETS {
        return Err(err(format!("{} presets, over the role's bound of {MAX_PRESETS}", presets.len())));
    }
    let mut seen = BTreeSet::new();
    for p in presets {
        if !valid_preset_name(p) {
            return Err(err(format!("preset {p:?} is not 1-32 bytes matching ^[a-z][a-z0-9_-]*$")));
        }
        if !seen.insert(p) {
            return Err(err(format!("preset {p:?} is listed twice")));
        }
    }
    Ok(())
}

fn catalog_entry(spec: &ToolSpec, presets: &[String]) -> Result<CatalogTool, ScriptError> {
    let name = &spec.name;
    if name.is_empty() {
        return Err(err("a tool has an empty name"));
    }
    if ROLE_OPS.contains(&name.as_str()) {
        return Err(err(format!("{name:?} is a role op, never a tool")));
    }
    check_flat_schema(&spec.input_schema).map_err(|p| err(format!("tool {name}: input_schema is not flat: {p:?}")))?;
    for tag in &spec.capabilities {
        check_capability_tag(tag).map_err(|p| err(format!("tool {name}: capability {tag:?}: {p}")))?;
    }
    for p in spec.presets.iter().flatten() {
        if !presets.contains(p) {
            return Err(err(format!("tool {name} names preset {p:?}, which the script does not list")));
        }
    }
    if spec.rules.len() > MAX_RULES {
        return Err(err(format!("tool {name}: {} rules, over the bound of {MAX_RULES}", spec.rules.len())));
    }
    let digest = schema_digest(&spec.input_schema).map_err(|e| err(format!("tool {name}: {e}")))?;
    let mut entry = CatalogTool::new(name.clone(), digest, spec.semantics, spec.input_schema.clone())
        .with_capabilities(spec.capabilities.clone());
    if let Some(d) = &spec.description {
        entry = entry.with_description(d.clone());
    }
    if let Some(reply) = &spec.reply {
        entry = entry.with_reply(reply.clone());
    }
    if let Some(format) = &spec.result_format {
        entry = entry.with_result_format(format.clone());
    }
    if let Some(emits) = spec.emits_events {
        entry = entry.with_emits_events(emits);
    }
    if !spec.reference_slots.is_empty() {
        catalog::check_reference_slots(&spec.reference_slots)
            .map_err(|p| err(format!("tool {name}: reference_slots: {} {:?}", p.field, p.name)))?;
        entry = entry.with_reference_slots(spec.reference_slots.clone());
    }
    check_reply(&entry).map_err(|p| err(format!("tool {p}")))?;
    Ok(entry)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

impl ScriptFile {
    /// The built-in set (see [`ToolScript::builtin`]).
    pub fn builtin() -> ScriptFile {
        let tools = json!([
            {"name": "echo", "description": "Answers with its arguments.",
             "input_schema": {"type": "object", "properties": {"text": {"type": "string", "description": "Anything."}}},
             "emits_events": false, "behaviour": {"echo": true}},
            {"name": "sleep", "description": "Waits `ms` milliseconds (keepalives while it waits), then answers with its arguments.",
             "input_schema": {"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0}}, "required": ["ms"]},
             "reply": {"max_ms": 600000, "hold_argument": {"name": "ms", "default_ms": 1000, "grace_ms": 5000}},
             "emits_events": false, "behaviour": {"echo": true, "delay_from": "ms", "delay_ms": 1000}},
            {"name": "fail", "description": "Refuses every call (tool_unavailable); `mode: \"malformed\"` answers a body that is not JSON.",
             "input_schema": {"type": "object", "properties": {"mode": {"type": "string", "enum": ["refuse", "malformed"]}}},
             "presets": ["default"], "emits_events": false,
             "behaviour": {"refuse": {"code": "tool_unavailable", "message": "fail always fails", "detail": {"tool": "fail", "reason": "under_review"}}},
             "rules": [{"when": {"arguments": {"mode": "malformed"}}, "then": {"malformed": "this is not JSON {"}}]},
            {"name": "big", "description": "Answers a text of `bytes` bytes (default 70 KiB, over the 65,536-byte model-visible limit).",
             "input_schema": {"type": "object", "properties": {"bytes": {"type": "integer", "minimum": 0}}},
             "presets": ["default"], "emits_events": false, "behaviour": {"big": {"bytes": DEFAULT_BIG_BYTES, "from": "bytes"}}},
            {"name": "hang", "description": "Never answers; on CANCEL it answers `cancelled`.",
             "input_schema": {"type": "object"},
             "presets": ["default"], "emits_events": false, "behaviour": {"hang": true}},
            {"name": "counter", "description": "Answers how many times this very call (its call_key, else its arguments) has been received.",
             "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}},
             "emits_events": false, "behaviour": {"count": true}},
            {"name": "whoami", "description": "Answers what the daemon stamped on the route (principal, scope) and the call's preset.",
             "input_schema": {"type": "object"}, "emits_events": false, "behaviour": {"whoami": true}}
        ]);
        let file = json!({"presets": ["default", "worker"], "tools": tools});
        serde_json::from_value(file).expect("the built-in script decodes")
    }
}

/// JSONC to JSON, as broca reads `broca.jsonc` (one reader for both).
pub use broca::config::jsonc_to_json;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_set_serves_every_named_tool_and_its_presets() {
        let s = ToolScript::builtin();
        let names: Vec<&str> = s.tools.iter().map(|t| t.spec.name.as_str()).collect();
        assert_eq!(names, ["echo", "sleep", "fail", "big", "hang", "counter", "whoami"]);
        let all = s.catalog(None, ScopeClass::Unscoped, None, false).unwrap();
        assert_eq!(all.tools.len(), 7);
        assert_eq!(all.presets, ["default", "worker"]);
        let worker = s.catalog(Some("worker"), ScopeClass::Head, None, false).unwrap();
        let w: Vec<&str> = worker.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(w, ["echo", "sleep", "counter", "whoami"]);
        assert!(worker.presets.is_empty(), "presets are listed only without a preset");
        catalog::check_presets(&all, None).unwrap();
        // A digest-only answer carries the full answer's digest; another preset another one.
        let digest = s.catalog(Some("worker"), ScopeClass::Head, None, true).unwrap();
        assert_eq!((digest.catalog_digest.as_str(), digest.tools.len()), (worker.catalog_digest.as_str(), 0));
        assert_ne!(worker.catalog_digest, all.catalog_digest);
        assert_eq!(worker.generation, all.generation);
        let sleep = s.tool("sleep").unwrap();
        assert_eq!(sleep.entry.schema_digest, schema_digest(&sleep.spec.input_schema).unwrap());
        assert_eq!(sleep.behaviour_for(&json!({"ms": 25}), None).delay_for(&json!({"ms": 25})), 25);
        let fail = s.tool("fail").unwrap();
        assert!(matches!(fail.behaviour_for(&json!({"mode": "malformed"}), None).answer, Answer::Malformed(_)));
        assert!(matches!(fail.behaviour_for(&json!({}), None).answer, Answer::Refuse(_)));
    }

    #[test]
    fn catalogs_follow_the_stamped_scope_and_the_composition() {
        let text = r#"{
            // A tool for head scopes only, one for unscoped routes only.
            "presets": ["lead"],
            "late_results": true,
            "tools": [
                {"name": "plan", "scopes": ["head"], "behaviour": {"text": "planned"}},
                {"name": "local", "scopes": ["unscoped"], "presets": [],},
            ],
        }"#;
        let s = ToolScript::from_jsonc(text).unwrap();
        let names = |a: &CatalogAnswer| a.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&s.catalog(None, ScopeClass::Unscoped, None, false).unwrap()), ["local"]);
        assert_eq!(names(&s.catalog(None, ScopeClass::Head, None, false).unwrap()), ["plan"]);
        assert_eq!(names(&s.catalog(Some("lead"), ScopeClass::Unscoped, None, false).unwrap()), Vec::<String>::new());
        assert_eq!(names(&s.catalog(Some("lead"), ScopeClass::Head, None, false).unwrap()), ["plan"]);
        let composition: Map<String, Value> = serde_json::from_value(json!({"b": 1, "a": [true]})).unwrap();
        let a = s.catalog(None, ScopeClass::Head, Some(&composition), false).unwrap();
        assert_eq!(a.composition_digest, Some(catalog::composition_digest(&Value::Object(composition)).unwrap()));
        assert!(a.declares("late_results"));
    }

    #[test]
    fn bad_scripts_are_refused_by_name() {
        for (text, needle) in [
            (r#"{"tools": [{"name": "tool.catalog"}]}"#, "role op"),
            (r#"{"tools": [{"name": "a"}, {"name": "a"}]}"#, "twice"),
            (r#"{"tools": [{"name": "a", "input_schema": {"anyOf": []}}]}"#, "not flat"),
            (r#"{"tools": [{"name": "a", "capabilities": ["nope/v1"]}]}"#, "capability"),
            (r#"{"tools": [{"name": "a", "presets": ["x"]}]}"#, "does not list"),
            (r#"{"presets": ["Bad"]}"#, "preset"),
            (r#"{"tools": [{"name": "a", "reply": {"max_ms": 0}}]}"#, "reply.max_ms"),
            (r#"{"tools": [{"name": "a", "behaviour": {"echo": true, "hang": true}}]}"#, "one answer"),
            (r#"{"tools": [{"name": "a", "behaviour": {"big": {"bytes": 99999999}}}]}"#, "bound"),
            (r#"{"tools": [{"name": "a", "behaviour": {"shout": true}}]}"#, "unknown field"),
            (r#"{"keepalive_interval_ms": 0}"#, "keepalive_interval_ms"),
            (r#"{"late_results_dir": "/tmp/late"}"#, "late_results_dir needs"),
            (r#"{"tools": [{"name": "a", "behaviour": {"held": {"reason": "Not Snake"}}}]}"#, "held.reason"),
            (r#"{"tools": [{"name": "a", "behaviour": {"held": {"reason": "consent"}, "echo": true}}]}"#, "one answer"),
            (r#"{"tools": [{"name": "a", "behaviour": {"held": {"reason": "consent", "why": 1}}}]}"#, "unknown field"),
            (r#"{"toolz": []}"#, "unknown field"),
            ("{/* open", "unterminated"),
        ] {
            let e = ToolScript::from_jsonc(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn jsonc_keeps_strings_and_drops_comments_and_trailing_commas() {
        let json = jsonc_to_json("{\"a\": \"// not a comment, ]\", /* x */ \"b\": [1, 2, ], // end\n}").unwrap();
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v, json!({"a": "// not a comment, ]", "b": [1, 2]}));
    }

    #[test]
    fn from_dir_is_one_answer_and_excludes_the_others() {
        let s = ToolScript::from_jsonc(r#"{"tools": [{"name": "t", "behaviour": {"from_dir": "/tmp/r"}}]}"#).unwrap();
        assert_eq!(s.tool("t").unwrap().spec.behaviour.answer, Answer::FromDir("/tmp/r".into()));
        let both =
            ToolScript::from_jsonc(r#"{"tools": [{"name": "t", "behaviour": {"from_dir": "/r", "echo": true}}]}"#);
        assert!(both.is_err_and(|e| e.to_string().contains("from_dir")));
    }

    #[test]
    fn builtins_merge_with_a_script() {
        let s = ToolScript::from_jsonc(
            r#"{"builtins": true, "presets": ["x"], "tools": [{"name": "echo", "behaviour": {"text": "mine"}}]}"#,
        )
        .unwrap();
        assert_eq!(s.presets, ["x", "default", "worker"]);
        assert_eq!(s.tool("echo").unwrap().spec.behaviour.answer, Answer::Text("mine".into()));
        assert!(s.tool("hang").is_some());
    }
}
