//! Fetching a session's plan at admission (spec §4; llm-runner 0.8.0 §10.1): every tool item's
//! provider is asked `role.describe` (it must serve `tool.catalog` under `tool-provider/v1`),
//! then `tool.catalog` with the item's params, preset and the plan's composition — all items in
//! one parallel round inside [`PLAN_FETCH_WITHIN`]. The answers become the session's frozen
//! tools and plan manifest; nothing is written when a required item fails.
//!
//! - a required item that cannot be reached is `fetch_unavailable {provider, class:
//!   "transient"}`; one its provider refuses is `fetch_unavailable {…, class: "permanent",
//!   provider_code}`; an unusable answer is `plan_stale {provider, reason}`;
//! - an optional item has [`OPTIONAL_FETCH_WITHIN`] and, when it fails, is admitted absent
//!   (one [`AbsentItem`] with a flat reason);
//! - two items offering one tool name is `tool_name_collision {name, providers}`;
//! - a system-text item is fetched in the same round; its text must match its digest and name
//!   exactly the tools its provider offered (`plan_stale` with `text_tool_names` otherwise);
//!   the texts, joined, go before the send's own system prompt.

use std::time::{Duration, Instant};

use cortexkit_role_llm_runner::output_refs::ReferenceSlot;
use cortexkit_role_tool_provider::call::SchemaPin;
use cortexkit_role_tool_provider::catalog::{self, CatalogAnswer, CatalogTool};
use cortexkit_role_tool_provider::describe;
use serde_json::{json, Value};

use super::ToolPlane;
use crate::frozen::{AbsentItem, ManifestItem, PlanManifest, TextItem, ToolSpec};
use crate::subc::consumer::CallError;
use crate::wire::plan::{Plan, SystemTextItem, ToolItem};
use crate::wire::{Refusal, RefusalCode};

/// The admission deadline for a plan's whole fetch round.
pub const PLAN_FETCH_WITHIN: Duration = Duration::from_secs(10);
/// An optional item's budget inside the round (spec: five seconds).
pub const OPTIONAL_FETCH_WITHIN: Duration = Duration::from_secs(5);
/// The `tool-provider/v1` major a provider's `role.describe` must list.
const TOOL_PROVIDER_MAJOR: &str = "tool-provider/v1";

/// A fetched plan: the tools it offers and the manifest frozen with them.
#[derive(Clone, Debug, PartialEq)]
pub struct FetchedPlan {
    pub manifest: PlanManifest,
    pub tools: Vec<ToolSpec>,
}

/// Why one item did not arrive.
#[derive(Debug)]
enum Fault {
    /// Not reached (route, transport, deadline).
    Unavailable(String),
    /// Its provider refused the fetch.
    Refused { code: String, message: String },
    /// Its answer is unusable.
    Invalid(String),
}

impl Fault {
    fn reason(&self) -> &'static str {
        match self {
            Fault::Unavailable(_) => "unavailable",
            Fault::Refused { .. } => "refused",
            Fault::Invalid(_) => "invalid",
        }
    }

    fn refusal(self, provider: &str) -> Refusal {
        match self {
            Fault::Unavailable(why) => Refusal::new(
                RefusalCode::FetchUnavailable,
                format!("fetch unavailable: tool provider {provider:?} could not be reached: {why}"),
                Some(crate::detail!("provider" => provider, "class" => "transient")),
            ),
            Fault::Refused { code, message } => Refusal::new(
                RefusalCode::FetchUnavailable,
                format!("fetch unavailable: tool provider {provider:?} refused its catalog: {code}: {message}"),
                Some(crate::detail!("provider" => provider, "class" => "permanent", "provider_code" => code)),
            ),
            Fault::Invalid(why) => Refusal::new(
                RefusalCode::PlanStale,
                format!("plan stale: tool provider {provider:?} answered an unusable catalog: {why}"),
                Some(crate::detail!("provider" => provider, "reason" => why)),
            ),
        }
    }
}

/// One item's usable catalog.
struct Fetched {
    answer: CatalogAnswer,
}

/// One fetch on a scoped thread of its own; a thread the OS refuses is that item's fault, never
/// a panic of the op worker.
fn spawn<'scope, 'env, F>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    f: F,
) -> std::io::Result<std::thread::ScopedJoinHandle<'scope, Result<Fetched, Fault>>>
where
    F: FnOnce() -> Result<Fetched, Fault> + Send + 'scope,
{
    std::thread::Builder::new().name("broca-fetch".into()).spawn_scoped(scope, f)
}

/// Fetches every item of `plan` for the session `lineage` (its route identity), in one round.
pub fn fetch(plane: &ToolPlane, lineage: &str, plan: &Plan) -> Result<FetchedPlan, Refusal> {
    let started = Instant::now();
    let (results, texts) = std::thread::scope(|scope| {
        let tools: Vec<_> = plan
            .tool_items
            .iter()
            .map(|item| {
                let within = if item.optional { OPTIONAL_FETCH_WITHIN } else { PLAN_FETCH_WITHIN };
                let deadline = started + within;
                spawn(scope, move || fetch_item(plane, lineage, plan, item, deadline))
            })
            .collect();
        let composition = plan.composition.as_ref();
        let texts: Vec<_> = plan
            .system_text_items
            .iter()
            .map(|item| {
                let deadline = started + PLAN_FETCH_WITHIN;
                spawn(scope, move || fetch_text(plane, lineage, plan, item, composition, deadline))
            })
            .collect();
        let join = |h: std::io::Result<std::thread::ScopedJoinHandle<'_, Result<Fetched, Fault>>>| match h {
            Ok(h) => h.join().unwrap_or_else(|_| Err(Fault::Invalid("the fetch panicked".into()))),
            Err(e) => Err(Fault::Unavailable(format!("no thread for the fetch: {e}"))),
        };
        let tools: Vec<Result<Fetched, Fault>> = tools.into_iter().map(join).collect();
        let texts: Vec<Result<Fetched, Fault>> = texts.into_iter().map(join).collect();
        (tools, texts)
    });
    let absent_providers: Vec<&str> = plan
        .tool_items
        .iter()
        .zip(&results)
        .filter(|(item, r)| item.optional && r.is_err())
        .map(|(item, _)| item.provider.as_str())
        .collect();
    // An absent optional provider takes its composition entry and its paired text with it; the
    // surviving texts are fetched again against the admitted composition (spec §4,
    // fetch-plan-optional-tools/v1). With nothing absent, the one round stands.
    let admitted = admitted_composition(plan, &absent_providers);
    let texts = match &admitted {
        None => texts,
        Some(composition) => std::thread::scope(|scope| {
            let handles: Vec<_> = plan
                .system_text_items
                .iter()
                .map(|item| {
                    let deadline = started + PLAN_FETCH_WITHIN;
                    let paired_absent = absent_providers.contains(&item.provider.as_str());
                    (!paired_absent).then(|| {
                        spawn(scope, move || fetch_text(plane, lineage, plan, item, composition.as_ref(), deadline))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    None => Err(Fault::Unavailable("its provider is absent".into())),
                    Some(Ok(h)) => h.join().unwrap_or_else(|_| Err(Fault::Invalid("the fetch panicked".into()))),
                    Some(Err(e)) => Err(Fault::Unavailable(format!("no thread for the fetch: {e}"))),
                })
                .collect()
        }),
    };
    let mut items = Vec::new();
    let mut absent = Vec::new();
    let mut tools: Vec<ToolSpec> = Vec::new();
    let mut offered_by: Vec<(String, String)> = Vec::new();
    for (item, result) in plan.tool_items.iter().zip(results) {
        let fetched = match result {
            Ok(f) => f,
            Err(fault) if item.optional => {
                log::info!(target: "broca.tools", "optional tool provider {:?} admitted absent: {fault:?}", item.provider);
                let provider_code = match &fault {
                    Fault::Refused { code, .. } => Some(code.clone()),
                    _ => None,
                };
                let reason = fault.reason().to_owned();
                absent.push(AbsentItem { provider: item.provider.clone(), kind: "tool".into(), reason, provider_code });
                continue;
            }
            Err(fault) => return Err(fault.refusal(&item.provider)),
        };
        for tool in &fetched.answer.tools {
            offered_by.push((tool.name.clone(), item.provider.clone()));
            tools.push(spec(item, tool));
        }
        items.push(manifest_item(item, &fetched.answer));
    }
    collisions(&offered_by)?;
    let mut text_items = Vec::new();
    let mut text = Vec::new();
    for (item, result) in plan.system_text_items.iter().zip(texts) {
        if let Some(tool) = absent.iter().find(|a| a.kind == "tool" && a.provider == item.provider) {
            // Its provider's tools are absent, so its text is too: one absence entry of its own.
            let entry = AbsentItem { kind: "system_text".into(), ..tool.clone() };
            absent.push(entry);
            continue;
        }
        let fetched = result.map_err(|fault| fault.refusal(&item.provider))?;
        let offered: Vec<&str> =
            offered_by.iter().filter(|(_, p)| *p == item.provider).map(|(n, _)| n.as_str()).collect();
        let (entry, body) = text_item(item, &fetched.answer, &offered).map_err(|f| f.refusal(&item.provider))?;
        text_items.push(entry);
        text.push(body);
    }
    let manifest = PlanManifest {
        identity: plan.identity.clone(),
        items,
        absent,
        // The baseline names what was admitted: without an absent provider's entry.
        composition_digest: match &admitted {
            Some(composition) => composition.as_ref().map(|c| crate::wire::plan::digest(&json!(c))),
            None => plan.composition_digest.clone(),
        },
        texts: text_items,
        system_text: (!text.is_empty()).then(|| text.join("\n\n")),
        output_refs: plan.tool_items.iter().any(|i| i.output_refs)
            || plan.system_text_items.iter().any(|i| i.output_refs),
        senders: plan.senders.clone(),
    };
    Ok(FetchedPlan { manifest, tools })
}

/// The composition admitted when `absent` providers are left out: `None` when none is (the
/// plan's stands), else the plan's composition without their entries (`Some(None)`: the plan
/// has no composition).
fn admitted_composition(plan: &Plan, absent: &[&str]) -> Option<Option<serde_json::Map<String, Value>>> {
    if absent.is_empty() {
        return None;
    }
    Some(plan.composition.as_ref().map(|c| {
        c.iter().filter(|(k, _)| !absent.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
    }))
}

/// `role.describe`, then `tool.catalog` asking for one system-text item against `composition`.
fn fetch_text(
    plane: &ToolPlane,
    lineage: &str,
    plan: &Plan,
    item: &SystemTextItem,
    composition: Option<&serde_json::Map<String, Value>>,
    deadline: Instant,
) -> Result<Fetched, Fault> {
    describe_provider(plane, lineage, &item.provider, deadline)?;
    let mut request = json!({"params": item.params, "system_text": {"preset": item.preset, "params": item.params}});
    // The catalog variant is the provider's tool item's preset, when the plan has one.
    if let Some(preset) = plan.tool_items.iter().find(|t| t.provider == item.provider).and_then(|t| t.preset.as_ref()) {
        request["preset"] = json!(preset);
    }
    if let Some(composition) = composition {
        request["composition"] = json!(composition);
    }
    Ok(Fetched { answer: catalog_op(plane, lineage, &item.provider, request, deadline)? })
}

/// A fetched system text, checked: its text is present and matches its digest, and its
/// `tool_names` are the tools the same provider offered in this plan.
fn text_item(item: &SystemTextItem, answer: &CatalogAnswer, offered: &[&str]) -> Result<(TextItem, String), Fault> {
    let text = answer.system_text.as_ref().ok_or_else(|| Fault::Invalid("no system_text in the answer".into()))?;
    let body = text.text.clone().ok_or_else(|| Fault::Invalid("system_text carries no text".into()))?;
    if catalog::system_text_digest(&body) != text.item_digest {
        return Err(Fault::Invalid("system_text.item_digest does not match its text".into()));
    }
    let mut named: Vec<&str> = text.tool_names.iter().flatten().map(String::as_str).collect();
    let mut offered = offered.to_vec();
    named.sort_unstable();
    offered.sort_unstable();
    if named != offered {
        return Err(Fault::Invalid(format!(
            "text_tool_names: the text names {named:?}, the plan's tools are {offered:?}"
        )));
    }
    let entry = TextItem {
        provider: item.provider.clone(),
        preset: item.preset.clone(),
        item_digest: text.item_digest.clone(),
        preflight_digest: text.preflight_digest.clone(),
    };
    Ok((entry, body))
}

/// One `tool.catalog` request and its decoded answer.
fn catalog_op(
    plane: &ToolPlane,
    lineage: &str,
    provider: &str,
    request: Value,
    deadline: Instant,
) -> Result<CatalogAnswer, Fault> {
    let answer = plane.role_op(provider, lineage, "tool.catalog", request, deadline).map_err(fault)?;
    serde_json::from_slice(&answer).map_err(|e| Fault::Invalid(format!("tool.catalog: {e}")))
}

/// The provider serves `tool.catalog` under `tool-provider/v1`.
fn describe_provider(plane: &ToolPlane, lineage: &str, provider: &str, deadline: Instant) -> Result<(), Fault> {
    let described = plane.role_op(provider, lineage, "role.describe", json!({}), deadline).map_err(fault)?;
    let described: Value =
        serde_json::from_slice(&described).map_err(|e| Fault::Invalid(format!("role.describe: {e}")))?;
    let described = describe::check_describe(&described)
        .map_err(|problems| Fault::Invalid(format!("role.describe: {problems:?}")))?;
    if !described.major(TOOL_PROVIDER_MAJOR).is_some_and(|m| m.serves("tool.catalog")) {
        return Err(Fault::Invalid(format!("role.describe lists no {TOOL_PROVIDER_MAJOR} tool.catalog")));
    }
    Ok(())
}

/// `role.describe`, then `tool.catalog`, for one item.
fn fetch_item(
    plane: &ToolPlane,
    lineage: &str,
    plan: &Plan,
    item: &ToolItem,
    deadline: Instant,
) -> Result<Fetched, Fault> {
    describe_provider(plane, lineage, &item.provider, deadline)?;
    let mut request = json!({"params": item.params});
    if let Some(preset) = &item.preset {
        request["preset"] = json!(preset);
    }
    if let Some(composition) = &plan.composition {
        request["composition"] = json!(composition);
    }
    let answer = catalog_op(plane, lineage, &item.provider, request, deadline)?;
    check(&answer)?;
    Ok(Fetched { answer })
}

/// The catalog checks a consumer makes (tool-provider §3.3): valid reply and mode metadata,
/// schema digests, unique names.
fn check(answer: &CatalogAnswer) -> Result<(), Fault> {
    check_catalog(answer).map_err(Fault::Invalid)
}

/// [`fetch`]'s checks of a decoded `tool.catalog` answer, public for the role's vectors: `Err`
/// is the `plan_stale` reason a fetch would give.
pub fn check_catalog(answer: &CatalogAnswer) -> Result<(), String> {
    let mut names: Vec<&str> = answer.tools.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("tool {:?} is listed twice", w[0]));
    }
    for tool in &answer.tools {
        if tool.name.is_empty() {
            return Err("a tool has an empty name".into());
        }
        if !catalog::is_schema_digest(&tool.schema_digest) {
            return Err(format!("tool {:?}: schema_digest is malformed", tool.name));
        }
        catalog::check_reply(tool).map_err(|p| format!("tool {:?}: reply: {p:?}", tool.name))?;
        catalog::check_modes(tool).map_err(|p| format!("tool {:?}: modes: {p:?}", tool.name))?;
        catalog::check_reference_slots(&tool.reference_slots)
            .map_err(|p| format!("tool {:?}: {}: {:?}", tool.name, p.field, p.name))?;
    }
    Ok(())
}

fn fault(e: CallError) -> Fault {
    match e {
        CallError::Module(body) => Fault::Refused { code: body.code, message: body.message },
        other => Fault::Unavailable(other.to_string()),
    }
}

/// A fetched tool as the session freezes it (its pin encoded with `SchemaPin::encode`; none
/// when the tool's name and digest make no valid pin).
pub fn spec(item: &ToolItem, tool: &CatalogTool) -> ToolSpec {
    ToolSpec {
        name: tool.name.clone(),
        description: tool.description.clone().unwrap_or_default(),
        input_schema: tool.input_schema.clone(),
        reply: tool.reply.clone(),
        module: Some(item.provider.clone()),
        preset: item.preset.clone(),
        pin: SchemaPin::new(&tool.name, &tool.schema_digest, tool.semantics).encode().ok(),
        result_format: tool.result_format.clone(),
        output_refs: item.output_refs,
        reference_slots: match item.output_refs {
            true => tool.reference_slots.iter().map(|s| ReferenceSlot::new(&s.name, &s.kind)).collect(),
            false => Vec::new(),
        },
    }
}

fn manifest_item(item: &ToolItem, answer: &CatalogAnswer) -> ManifestItem {
    let capabilities = answer.capabilities.iter().filter(|(_, v)| **v == Value::Bool(true)).map(|(k, _)| k.clone());
    ManifestItem {
        provider: item.provider.clone(),
        preset: item.preset.clone(),
        generation: answer.generation.clone(),
        catalog_digest: answer.catalog_digest.clone(),
        capabilities: capabilities.collect(),
        tool_names: answer.tools.iter().map(|t| t.name.clone()).collect(),
    }
}

/// The first model-facing name two providers offer.
fn collisions(offered_by: &[(String, String)]) -> Result<(), Refusal> {
    for (i, (name, _)) in offered_by.iter().enumerate() {
        if offered_by[..i].iter().any(|(n, _)| n == name) {
            let providers: Vec<&str> = offered_by.iter().filter(|(n, _)| n == name).map(|(_, p)| p.as_str()).collect();
            let message = format!("tool name collision: {name:?} is offered by {}", providers.join(", "));
            let detail = crate::detail!("name" => name, "providers" => providers);
            return Err(Refusal::new(RefusalCode::ToolNameCollision, message, Some(detail)));
        }
    }
    Ok(())
}
