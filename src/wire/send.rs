//! `session.send` parameters (spec §4): every member's rule and its typed refusal, decided
//! before anything is written. The op stays lenient about members it does not read (each is
//! logged once per key); a member it does read is strict.

use std::collections::BTreeMap;

use cortexkit_role_tool_provider::catalog::{Reply, REPLY_MAX_MS};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{invalid_params, note_unread, Refusal};
use crate::frozen::CachePolicy;
use crate::provider::config::ToolSpec;
use crate::session_key::SessionKey;

/// Top-level members this build reads.
const READ: &[&str] = &[
    "session",
    "prompt",
    "system",
    "send_id",
    "session_class",
    "retention",
    "cache",
    "model",
    "stop_when",
    "generation",
    "budget",
    "seed_from",
    "context_management",
    "delivery",
    "conversation_key",
    "title",
    "on_restart",
    "tools",
    "plan",
    "route_decision_id",
    "service_tier",
    "tool_choice",
    "work_class",
    "context_limit",
    "dedupe_key",
    "expires_at_ms",
    "template",
    "client_message_id",
    "directives",
    "directives",
];

/// Members that ask for a capability group of llm-runner/v1 this build does not declare, with
/// the group: refused by name (`invalid_params {field}`) rather than ignored, so a caller's run
/// never goes ahead without what it asked for. Truly unknown members stay tolerated (logged).
const UNDECLARED: &[(&str, &str)] = &[("structured_output", "structured_output"), ("attachments", "attachments")];

/// Members that make up a send's identity, in the order a `send_id_reuse` names the first
/// that differs. `title` and `send_id` are not part of it.
const IDENTITY: &[&str] = &[
    "prompt",
    "delivery",
    "dedupe_key",
    "template",
    "client_message_id",
    "model",
    "model.variant",
    "system",
    "conversation_key",
    "session_class",
    "retention",
    "cache",
    "stop_when",
    "generation",
    "budget",
    "context_management",
    "on_restart",
    "seed_from",
    "tools",
    "tool_providers",
    "tool_choice",
    "work_class",
    "context_limit",
    "service_tier",
    "plan",
];

pub use crate::record::Delivery;
use cortexkit_role_llm_runner::service_tier::ServiceTier;

/// The model a send names.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelChoice {
    /// `provider/model`.
    pub id: String,
    pub variant: Option<String>,
}

/// A parsed, validated `session.send`.
#[derive(Clone, Debug)]
pub struct SendParams {
    pub prompt: String,
    pub system: Option<String>,
    pub send_id: Option<String>,
    pub title: Option<String>,
    pub delivery: Delivery,
    /// The trailing directives the run should report (llm-runner §9.9); `None` when omitted.
    pub directives: Option<Vec<cortexkit_role_llm_runner::directives::DirectiveName>>,
    /// The caller's id for the user message this send writes (llm-runner §9.11).
    pub client_message_id: Option<String>,
    /// A `delivery_order` list with its members (llm-runner §9.7); `delivery` is then `queue`.
    pub order: Option<cortexkit_role_llm_runner::delivery_order::DeliveryOrder>,
    pub model: Option<ModelChoice>,
    pub session_class: Option<String>,
    pub retention: Option<u64>,
    /// `{role?, ttl?}` as sent (validated).
    pub cache: Option<CachePolicy>,
    pub max_steps: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub max_input_tokens: Option<u64>,
    /// `"none"`, `"compaction"` or `{"transform": id}` as sent (validated shape).
    pub context_management: Option<Value>,
    pub on_restart: Option<String>,
    pub conversation_key: Option<String>,
    /// Legacy direct tools; `None` when omitted (inherit).
    pub tools: Option<Vec<ToolSpec>>,
    /// The session's fetch plan (decided against the frozen one on the actor).
    pub plan: Option<super::plan::Plan>,
    /// The caller's routing decision, fixed per run (llm-runner §9.3.3).
    pub route_decision_id: Option<String>,
    /// `tool_choice`; `None` when omitted (a steer or interrupt inherits the frozen one).
    pub tool_choice: Option<crate::frozen::ToolChoice>,
    /// `work_class` and `context_limit`, inherited the same way.
    pub work_class: Option<String>,
    pub context_limit: Option<u64>,
    /// `service_tier` as sent, an explicit `standard` kept (it cannot inherit another level).
    pub service_tier: Option<ServiceTier>,
    /// Why the send's `tools` list is malformed, refused once the session is known.
    pub tools_fault: Option<Refusal>,
    /// Field → SHA-256 of its canonical JSON, for keyed re-sends.
    pub identity: BTreeMap<String, String>,
}

pub use crate::limits::MAX_MESSAGE_JSON_BYTES;

/// Refuses a prompt whose stored message could never be read back whole, naming the limit.
fn prompt_fits(prompt: &str) -> Result<(), Refusal> {
    // The JSON string's length bounds the stored message's: escapes only ever lengthen it.
    let stored = serde_json::to_string(prompt).map_or(usize::MAX, |s| s.len()) + 64;
    if stored <= MAX_MESSAGE_JSON_BYTES {
        return Ok(());
    }
    let message = format!(
        "invalid params: prompt: its stored message would be {stored} bytes, over the {MAX_MESSAGE_JSON_BYTES}-byte limit every message must fit to be read back whole"
    );
    let detail = crate::detail!("field" => "prompt", "bytes" => stored, "limit" => MAX_MESSAGE_JSON_BYTES);
    Err(Refusal::new(super::RefusalCode::InvalidParams, message, Some(detail)))
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(String::from)
}

/// `retention` (llm-runner §9.1): whole seconds, from 1 to [`crate::limits::RETENTION_MAX_SECONDS`]
/// (above it the refusal carries `max_seconds`). Whether it may change an existing session's
/// policy is the actor's decision (`actor::policy`).
fn retention(v: Option<&Value>) -> Result<Option<u64>, Refusal> {
    use crate::limits::RETENTION_MAX_SECONDS;
    match v.map(Value::as_u64) {
        None => Ok(None),
        Some(Some(n)) if (1..=RETENTION_MAX_SECONDS).contains(&n) => Ok(Some(n)),
        Some(Some(n)) if n > RETENTION_MAX_SECONDS => {
            let message = format!("retention {n} s is above this runner's maximum of {RETENTION_MAX_SECONDS} s");
            let detail = crate::detail!("field" => "retention", "max_seconds" => RETENTION_MAX_SECONDS);
            Err(Refusal::new(super::RefusalCode::InvalidParams, message, Some(detail)))
        }
        Some(_) => Err(invalid_params("retention", "a positive whole number of seconds is required")),
    }
}

fn positive(params: &Value, pointer: &str, field: &str) -> Result<Option<u64>, Refusal> {
    match params.pointer(pointer) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(invalid_params(field, "a positive integer is required")),
        },
    }
}

/// An object whose members are all in `known`; the first other member is refused by its path.
fn closed(v: &Value, field: &str, known: &[&str]) -> Result<(), Refusal> {
    closed_with(v, field, known, "unknown member")
}

/// [`closed`], saying `why` of a member it refuses.
fn closed_with(v: &Value, field: &str, known: &[&str], why: &str) -> Result<(), Refusal> {
    let map = v.as_object().ok_or_else(|| invalid_params(field, "an object is required"))?;
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(invalid_params(&format!("{field}.{k}"), why)),
        None => Ok(()),
    }
}

/// Top-level members of a send this build does not read (each is warned about once per key).
fn unread(obj: &serde_json::Map<String, Value>) -> impl Iterator<Item = &String> {
    obj.keys().filter(|k| !READ.contains(&k.as_str()))
}

/// `service_tier` (llm-runner §9.3.2), read raw before anything else so an unknown level is
/// refused by name: `invalid_params {field: "service_tier", reason: "unsupported_tier"}`. Whether
/// the session's route can apply the level, and whether a running run fixes another one, is
/// decided on the session's actor (`actor::tier`), where the route and the run are known.
fn service_tier(value: Option<&Value>) -> Result<Option<ServiceTier>, Refusal> {
    cortexkit_role_llm_runner::service_tier::parse_request(value).map_err(|problem| {
        let detail = crate::detail!("field" => "service_tier", "reason" => problem.reason());
        let message = "invalid params: service_tier: not a service level (standard, fast, ultrafast)";
        Refusal::new(super::RefusalCode::InvalidParams, message, Some(detail))
    })
}

pub fn parse(params: &Value, key: &SessionKey) -> Result<SendParams, Refusal> {
    let obj = params.as_object().ok_or_else(|| invalid_params("params", "must be an object"))?;
    if let Some((member, group)) = UNDECLARED.iter().find(|(member, _)| obj.contains_key(*member)) {
        let why = format!("{member} is not served by this build (llm-runner/v1 group {group:?} is not declared)");
        return Err(invalid_params(member, &why));
    }
    let service_tier = service_tier(obj.get("service_tier"))?;
    if obj.contains_key("tool_providers") {
        // Spec §4 names the member and gives it no meaning; tools from other modules are a
        // plan's `tool_items`. Refused by name rather than silently dropped.
        return Err(invalid_params(
            "tool_providers",
            "not served: name tool providers as the plan's tool_items (plan.tool_items[].provider)",
        ));
    }
    for k in unread(obj) {
        note_unread(k, &key.harness);
    }
    if let Some(s) = obj.get("session") {
        if s.as_str() != Some(key.session.as_str()) {
            return Err(invalid_params("session", "does not match the route's bound session"));
        }
    }
    let sent_delivery = super::delivery::parse(obj)?;
    // A template send's text is rendered on the session's actor, from its frozen plan.
    let prompt = super::delivery::prompt(obj, &sent_delivery)?.unwrap_or_default();
    prompt_fits(&prompt)?;
    let send_id = match obj.get("send_id") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Some(s.clone()),
        Some(_) => return Err(invalid_params("send_id", "a string of 1-256 bytes is required")),
    };
    let delivery = sent_delivery.legacy();
    let directives = match obj.get("directives") {
        None => None,
        Some(raw) => {
            let names: Vec<cortexkit_role_llm_runner::directives::DirectiveName> = serde_json::from_value(raw.clone())
                .map_err(|_| invalid_params("directives", "a list of directive names (wake)"))?;
            if names.iter().enumerate().any(|(i, n)| names[..i].contains(n)) {
                return Err(invalid_params("directives", "a directive named twice"));
            }
            Some(names)
        }
    };
    let client_message_id = match obj.get("client_message_id") {
        None => None,
        Some(Value::String(id)) if cortexkit_role_llm_runner::display::client_message_id_valid(id) => Some(id.clone()),
        Some(_) => return Err(invalid_params("client_message_id", "1-64 characters of [A-Za-z0-9_-]")),
    };
    let model = match obj.get("model") {
        None => None,
        Some(m) => Some(model(m, &key.harness)?),
    };
    let title = match obj.get("title") {
        None => None,
        Some(Value::String(t)) if valid_title(t) => Some(t.clone()),
        Some(_) => return Err(invalid_params("title", "1-200 characters, not blank, no control characters")),
    };
    let session_class = match obj.get("session_class") {
        None => None,
        Some(Value::String(c)) if crate::config::valid_session_class(c) => Some(c.clone()),
        Some(_) => return Err(invalid_params("session_class", "a label matching [a-z0-9_-]{1,32} is required")),
    };
    let retention = retention(obj.get("retention"))?;
    let cache = match obj.get("cache") {
        None => None,
        Some(c) => Some(cache(c)?),
    };
    // Only what broca serves is accepted: `stop_when.max_steps` and `generation.max_output_tokens`.
    // Any other member (or a legacy stop-condition list that names a condition) is refused by
    // name, never accepted and dropped (llm-runner §9.3.1: "honours it or refuses
    // `invalid_params` naming the field, never silently ignores it").
    match obj.get("stop_when") {
        None => {}
        Some(sw @ Value::Object(_)) => {
            closed_with(sw, "stop_when", &["max_steps"], "broca serves only stop_when.max_steps")?
        }
        Some(Value::Array(list)) if list.is_empty() => {}
        Some(Value::Array(_)) => {
            return Err(invalid_params(
                "stop_when",
                "broca serves only the object {max_steps}, not a list of stop conditions",
            ))
        }
        Some(_) => return Err(invalid_params("stop_when", "an object {max_steps} is required")),
    }
    let max_steps = positive(params, "/stop_when/max_steps", "stop_when.max_steps")?;
    match obj.get("generation") {
        None => {}
        Some(g @ Value::Object(_)) => {
            closed_with(g, "generation", &["max_output_tokens"], "broca serves only generation.max_output_tokens")?
        }
        Some(_) => return Err(invalid_params("generation", "an object is required")),
    }
    let max_output_tokens = positive(params, "/generation/max_output_tokens", "generation.max_output_tokens")?;
    let max_input_tokens = match obj.get("budget") {
        None => None,
        Some(b) => budget(b)?,
    };
    let context_management = match obj.get("context_management") {
        None => None,
        Some(v) => Some(context_management(v)?),
    };
    let on_restart = match obj.get("on_restart").map(Value::as_str) {
        None => None,
        Some(Some(p @ ("resume" | "interrupt"))) => Some(p.to_string()),
        Some(_) => return Err(invalid_params("on_restart", "\"resume\" or \"interrupt\"")),
    };
    let conversation_key = match obj.get("conversation_key") {
        None => None,
        Some(Value::String(k)) if valid_conversation_key(k) => Some(k.clone()),
        Some(_) => return Err(invalid_params("conversation_key", "1-256 printable ASCII characters without spaces")),
    };
    // The fork seam is reserved: only a fresh origin is served (cross-lineage seeding is future).
    if let Some(seed) = obj.get("seed_from") {
        if !(seed.is_null() || seed == "fresh" || seed.get("fresh").is_some()) {
            return Err(invalid_params("seed_from", "only a fresh origin is supported"));
        }
    }
    // A malformed tool list is refused only once the session is known: a session whose plan
    // froze its tools refuses any `tools` naming `tools` (llm-runner §9.3.1), whatever it holds.
    let (tools, tools_fault) = match obj.get("tools") {
        None | Some(Value::Null) => (None, None),
        Some(t) => match tools(t) {
            Ok(list) => (Some(list), None),
            Err(fault) => (None, Some(fault)),
        },
    };
    let plan = match obj.get("plan") {
        None | Some(Value::Null) => None,
        Some(p) => Some(super::plan::decode(p)?),
    };
    // Beside a plan only `tools: []` (offer the model no tools at all) has a meaning.
    if plan.is_some() && (tools.as_ref().is_some_and(|t| !t.is_empty()) || tools_fault.is_some()) {
        return Err(invalid_params("tools", "a send with a fetch plan takes its tools from the plan"));
    }
    let system = match obj.get("system") {
        None | Some(Value::Null) => None,
        // Frozen into the first episode and sent with every request: bounded like a message.
        Some(Value::String(s)) if s.len() > MAX_MESSAGE_JSON_BYTES => {
            return Err(invalid_params("system", &format!("at most {MAX_MESSAGE_JSON_BYTES} bytes")))
        }
        Some(Value::String(s)) => Some(s.clone()).filter(|s| !s.trim().is_empty()),
        Some(_) => return Err(invalid_params("system", "a string is required")),
    };
    let route_decision_id = match obj.get("route_decision_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) if !d.is_empty() && d.len() <= 256 && !d.chars().any(char::is_control) => {
            Some(d.clone())
        }
        Some(_) => return Err(invalid_params("route_decision_id", "a string of 1-256 bytes is required")),
    };
    let tool_choice = tool_choice(obj.get("tool_choice"))?;
    let work_class = match obj.get("work_class") {
        None | Some(Value::Null) => None,
        Some(Value::String(c))
            if (1..=64).contains(&c.len())
                && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.:".contains(&b)) =>
        {
            Some(c.clone())
        }
        Some(_) => {
            return Err(invalid_params(
                "work_class",
                "1-64 characters of [a-z0-9_.:-] (a classification, never content)",
            ))
        }
    };
    let context_limit = positive(params, "/context_limit", "context_limit")?;
    let identity = identity(obj, delivery);
    Ok(SendParams {
        prompt,
        system,
        send_id,
        title,
        delivery,
        order: sent_delivery.order().cloned(),
        client_message_id,
        directives,
        model,
        session_class,
        retention,
        cache,
        max_steps,
        max_output_tokens,
        max_input_tokens,
        context_management,
        on_restart,
        conversation_key,
        tools,
        plan,
        route_decision_id,
        tool_choice,
        work_class,
        context_limit,
        service_tier,
        tools_fault,
        identity,
    })
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"` or `{"tool": name}` (a tool name of 1-128
/// characters); absent or null: inherit on a steer, the provider's default otherwise.
fn tool_choice(value: Option<&Value>) -> Result<Option<crate::frozen::ToolChoice>, Refusal> {
    use crate::frozen::{ToolChoice, ToolChoiceMode};
    let why = "\"auto\", \"none\", \"required\" or {\"tool\": name}";
    Ok(Some(match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Mode(ToolChoiceMode::Auto),
            "none" => ToolChoice::Mode(ToolChoiceMode::None),
            "required" => ToolChoice::Mode(ToolChoiceMode::Required),
            _ => return Err(invalid_params("tool_choice", why)),
        },
        Some(Value::Object(map)) => match (map.len(), map.get("tool").and_then(Value::as_str)) {
            (1, Some(name)) if !name.is_empty() && name.chars().count() <= 128 => {
                ToolChoice::Named { tool: name.to_owned() }
            }
            _ => return Err(invalid_params("tool_choice", why)),
        },
        Some(_) => return Err(invalid_params("tool_choice", why)),
    }))
}

fn model(m: &Value, harness: &str) -> Result<ModelChoice, Refusal> {
    let map =
        m.as_object().ok_or_else(|| invalid_params("model", "an object {provider, model, variant?} is required"))?;
    for k in map.keys().filter(|k| !["provider", "model", "variant"].contains(&k.as_str())) {
        note_unread(&format!("model.{k}"), harness);
    }
    let (Some(provider), Some(name)) = (map.get("provider").and_then(text), map.get("model").and_then(text)) else {
        return Err(invalid_params("model", "needs provider and model"));
    };
    let variant = match map.get("variant") {
        None => None,
        Some(Value::String(v)) if !v.is_empty() => Some(v.clone()),
        Some(_) => return Err(invalid_params("model.variant", "a non-empty string is required")),
    };
    Ok(ModelChoice { id: format!("{provider}/{name}"), variant })
}

fn cache(c: &Value) -> Result<CachePolicy, Refusal> {
    closed(c, "cache", &["role", "ttl"])?;
    Ok(CachePolicy {
        role: cache_member(c, "role", "\"primary\" or \"ephemeral\"")?,
        ttl: cache_member(c, "ttl", "\"5m\", \"1h\" or \"24h\"")?,
    })
}

fn cache_member<T: serde::de::DeserializeOwned>(c: &Value, name: &str, expected: &str) -> Result<Option<T>, Refusal> {
    match c.get(name) {
        None => Ok(None),
        Some(v) => {
            serde_json::from_value(v.clone()).map(Some).map_err(|_| invalid_params(&format!("cache.{name}"), expected))
        }
    }
}

/// `budget` is closed to the members llm-runner §9.3 names; a cap-only budget needs no reminder
/// fields. Broca serves the cap; the tool-call reminders (`nudges`) and the forced finish
/// (`finalize_at_tool_calls`, `finalize_text`) are refused by name when given, after the
/// closed-member checks, never accepted and dropped.
fn budget(b: &Value) -> Result<Option<u64>, Refusal> {
    closed(b, "budget", &["max_input_tokens", "nudges", "finalize_at_tool_calls", "finalize_text"])?;
    if let Some(nudges) = b.get("nudges") {
        let list = nudges.as_array().ok_or_else(|| invalid_params("budget.nudges", "a list is required"))?;
        for (i, n) in list.iter().enumerate() {
            closed(n, &format!("budget.nudges[{i}]"), &["at_tool_calls", "text"])?;
        }
        if !list.is_empty() {
            return Err(invalid_params("budget.nudges", "broca does not serve tool-call reminders"));
        }
    }
    for member in ["finalize_at_tool_calls", "finalize_text"] {
        if b.get(member).is_some() {
            return Err(invalid_params(&format!("budget.{member}"), "broca does not serve a forced finish"));
        }
    }
    match b.get("max_input_tokens") {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(invalid_params("budget.max_input_tokens", "an integer of at least 1 is required")),
        },
    }
}

fn context_management(v: &Value) -> Result<Value, Refusal> {
    let ok = match v {
        Value::String(s) => s == "none" || s == "compaction",
        Value::Object(map) => map.len() == 1 && map.get("transform").is_some_and(Value::is_string),
        _ => false,
    };
    if ok {
        Ok(v.clone())
    } else {
        Err(invalid_params("context_management", "\"none\", \"compaction\" or {\"transform\": <module id>}"))
    }
}

/// A direct tool's strict `reply`: exactly `{max_ms}`, 1 to 86,400,000.
fn reply_bound(reply: &Value, field: &str) -> Result<Reply, Refusal> {
    let map = reply.as_object().ok_or_else(|| invalid_params(&format!("{field}.reply"), "an object is required"))?;
    if let Some(k) = map.keys().find(|k| k.as_str() != "max_ms") {
        return Err(invalid_params(&format!("{field}.reply.{k}"), "unknown member"));
    }
    match map.get("max_ms").and_then(Value::as_u64) {
        Some(n) if (1..=REPLY_MAX_MS).contains(&n) => Ok(Reply::new(n)),
        _ => Err(invalid_params(&format!("{field}.reply.max_ms"), "an integer from 1 to 86400000")),
    }
}

/// The most legacy direct tools one send declares (a plan's catalog is bounded by its items).
pub const MAX_TOOLS: usize = 256;

/// Legacy direct tools: `{name, description?, input_schema, reply?}`; `reply` is strict.
fn tools(t: &Value) -> Result<Vec<ToolSpec>, Refusal> {
    let list = t.as_array().ok_or_else(|| invalid_params("tools", "a list is required"))?;
    if list.len() > MAX_TOOLS {
        return Err(invalid_params("tools", &format!("at most {MAX_TOOLS} tools")));
    }
    // Frozen into the first episode and sent with every request: bounded like a message.
    let bytes = serde_json::to_vec(t).map_or(usize::MAX, |b| b.len());
    if bytes > MAX_MESSAGE_JSON_BYTES {
        return Err(invalid_params("tools", &format!("at most {MAX_MESSAGE_JSON_BYTES} bytes of JSON")));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let field = format!("tools[{i}]");
        let name = tool.get("name").and_then(text).filter(|n| !n.is_empty());
        let Some(name) = name else { return Err(invalid_params(&format!("{field}.name"), "a name is required")) };
        let reply = match tool.get("reply") {
            Some(reply) => Some(reply_bound(reply, &field)?),
            None => None,
        };
        out.push(ToolSpec {
            name,
            description: tool.get("description").and_then(text).unwrap_or_default(),
            input_schema: tool.get("input_schema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
            reply,
            module: None,
            preset: None,
            pin: None,
            result_format: None,
            output_refs: false,
            reference_slots: Vec::new(),
        });
    }
    Ok(out)
}

pub fn valid_title(t: &str) -> bool {
    let n = t.chars().count();
    (1..=200).contains(&n) && !t.trim().is_empty() && !t.chars().any(char::is_control)
}

fn valid_conversation_key(k: &str) -> bool {
    (1..=256).contains(&k.len()) && k.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// One digest per identity member present (delivery always: absent means `queue`).
fn identity(obj: &Map<String, Value>, delivery: Delivery) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut put = |field: &str, v: &Value| {
        let digest = Sha256::digest(canonical(v).as_bytes());
        out.insert(field.to_string(), crate::session_key::hex(&digest));
    };
    for field in IDENTITY {
        match *field {
            // A list is its own identity; a string (or none) the mode it means.
            "delivery" => match obj.get("delivery") {
                Some(list @ Value::Array(_)) => put(field, list),
                _ => put(field, &Value::String(delivery.as_str().into())),
            },
            "model" => {
                if let Some(m) = obj.get("model") {
                    put(field, &serde_json::json!([m.get("provider"), m.get("model")]));
                }
            }
            "model.variant" => {
                if let Some(v) = obj.get("model").and_then(|m| m.get("variant")) {
                    put(field, v);
                }
            }
            other => {
                if let Some(v) = obj.get(other) {
                    put(field, v);
                }
            }
        }
    }
    out
}

/// The first identity member whose digest differs between a recorded send and a re-send.
pub fn differing_field(recorded: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Option<&'static str> {
    IDENTITY.iter().copied().find(|f| recorded.get(*f) != now.get(*f))
}

/// JSON with object members sorted, so member order never changes identity.
fn canonical(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sort(&map[k]))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> SessionKey {
        SessionKey::new("/p", "h", "s")
    }

    /// The field a send is refused naming: at parse, or (a malformed tool list) once the session
    /// is known.
    fn refused(params: Value) -> String {
        let r = match parse(&params, &key()) {
            Ok(p) => p.tools_fault.unwrap_or_else(|| panic!("{params} was accepted")),
            Err(r) => r,
        };
        assert_eq!(r.code, "invalid_params", "{params}");
        r.detail.as_ref().and_then(|d| d.get("field")).and_then(Value::as_str).unwrap().to_string()
    }

    /// An unknown member is tolerated (warned about); `tool_providers`, named by the spec with
    /// no meaning, is refused by name rather than dropped, and so is a non-standard tier.
    #[test]
    fn unknown_members_are_warned_and_tool_providers_is_refused() {
        let params = json!({"prompt": "hi", "model": {}, "frobnicate": 1});
        let unread: Vec<&String> = unread(params.as_object().unwrap()).collect();
        assert_eq!(unread, ["frobnicate"]);
        assert_eq!(refused(json!({"prompt": "hi", "tool_providers": []})), "tool_providers");
        assert_eq!(refused(json!({"prompt": "hi", "service_tier": "future-tier"})), "service_tier");
        assert_eq!(refused(json!({"prompt": "hi", "service_tier": 1})), "service_tier");
        assert_eq!(
            parse(&json!({"prompt": "hi", "service_tier": "fast"}), &key()).unwrap().service_tier,
            Some(ServiceTier::Fast)
        );
        assert!(parse(&json!({"prompt": "hi", "service_tier": "standard"}), &key()).is_ok());
    }

    #[test]
    fn each_strict_member_is_refused_by_name() {
        let base = |extra: Value| {
            let mut p = json!({"prompt": "hi", "model": {"provider": "mock", "model": "m"}});
            p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            p
        };
        let cases = [
            (json!({"title": ""}), "title"),
            (json!({"title": "a\nb"}), "title"),
            (json!({"title": null}), "title"),
            (json!({"delivery": "urgent"}), "delivery"),
            (json!({"session_class": "Head"}), "session_class"),
            (json!({"session_class": null}), "session_class"),
            (json!({"cache": {"ttl": "2h"}}), "cache.ttl"),
            (json!({"cache": {"tier": "x"}}), "cache.tier"),
            (json!({"stop_when": {"max_steps": 0}}), "stop_when.max_steps"),
            (json!({"generation": {"max_output_tokens": "9"}}), "generation.max_output_tokens"),
            (json!({"budget": {"max_input_tokens": 0}}), "budget.max_input_tokens"),
            (json!({"budget": {"max_input_tokens": 5, "extra": 1}}), "budget.extra"),
            (json!({"budget": {"nudges": [{"at_tool_calls": 3, "color": "red"}]}}), "budget.nudges[0].color"),
            // Served members or nothing: never accepted and dropped (#47).
            (json!({"budget": {"nudges": [{"at_tool_calls": 3, "text": "wrap up"}]}}), "budget.nudges"),
            (json!({"budget": {"finalize_at_tool_calls": 9}}), "budget.finalize_at_tool_calls"),
            (json!({"budget": {"finalize_text": "done"}}), "budget.finalize_text"),
            (json!({"stop_when": {"max_steps": 3, "max_tokens": 9}}), "stop_when.max_tokens"),
            (json!({"stop_when": [{"max_steps": 3}]}), "stop_when"),
            (json!({"stop_when": "never"}), "stop_when"),
            (json!({"generation": {"temperature": 0.2}}), "generation.temperature"),
            (json!({"context_management": "auto"}), "context_management"),
            (json!({"on_restart": "later"}), "on_restart"),
            (json!({"conversation_key": "has space"}), "conversation_key"),
            (json!({"conversation_key": 7}), "conversation_key"),
            (json!({"tools": [{"name": "t", "reply": {"max_ms": 0}}]}), "tools[0].reply.max_ms"),
            (json!({"tools": [{"name": "t", "reply": {"max_ms": 5, "grace_ms": 1}}]}), "tools[0].reply.grace_ms"),
            (json!({"model": {"provider": "mock", "model": "m", "variant": ""}}), "model.variant"),
            (json!({"seed_from": {"seeded_from": {"source_lineage": "x", "at_seq": 3}}}), "seed_from"),
        ];
        for (extra, field) in cases {
            assert_eq!(refused(base(extra.clone())), field, "{extra}");
        }
        assert_eq!(refused(json!({"prompt": " "})), "prompt");
    }

    #[test]
    fn identity_ignores_title_member_order_and_names_the_first_difference() {
        let a =
            parse(&json!({"prompt": "p", "title": "one", "cache": {"role": "primary", "ttl": "1h"}}), &key()).unwrap();
        let b =
            parse(&json!({"cache": {"ttl": "1h", "role": "primary"}, "title": "two", "prompt": "p"}), &key()).unwrap();
        assert_eq!(differing_field(&a.identity, &b.identity), None);
        let c = parse(&json!({"prompt": "p", "delivery": "queue", "cache": {"role": "primary", "ttl": "1h"}}), &key())
            .unwrap();
        assert_eq!(differing_field(&a.identity, &c.identity), None, "absent delivery means queue");
        let d = parse(&json!({"prompt": "p", "delivery": "steer"}), &key()).unwrap();
        assert_eq!(differing_field(&a.identity, &d.identity), Some("delivery"));
        let m1 = parse(&json!({"prompt": "p", "model": {"provider": "a", "model": "b", "variant": "high"}}), &key())
            .unwrap();
        let m2 =
            parse(&json!({"prompt": "p", "model": {"provider": "a", "model": "b", "variant": "low"}}), &key()).unwrap();
        assert_eq!(differing_field(&m1.identity, &m2.identity), Some("model.variant"));
        let k = parse(&json!({"prompt": "p", "model": {"provider": "a", "model": "b", "variant": "high"}, "conversation_key": "k1"}), &key()).unwrap();
        assert_eq!(differing_field(&m1.identity, &k.identity), Some("conversation_key"));
    }
}
