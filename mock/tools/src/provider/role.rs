//! The tool-provider role's own ops on broca-mock's tool route (`role.describe`, `tool.catalog`,
//! the late-results pair) and its module manifest: what a consumer reads about the provider,
//! beside the calls it makes (the parent module).

use super::*;

/// Role ops are answered (or refused `unknown_tool` when not served) and logged as such, never
/// counted as tool calls.
pub(super) fn is_role_op(name: &str) -> bool {
    super::super::script::ROLE_OPS.contains(&name)
}

/// The `role.describe` answer: one `tool-provider/v1` major with the ops served.
pub fn describe(script: &ToolScript) -> RoleDescribe {
    let mut ops_served = vec![ops::ROLE_DESCRIBE.to_owned(), ops::TOOL_CATALOG.to_owned()];
    if script.late_results {
        ops_served.extend([ops::LATE_RESULTS.to_owned(), ops::LATE_RESULTS_ACK.to_owned()]);
    }
    let major = Major { version: PROVIDES.to_owned(), ops: ops_served, stability: "alpha".to_owned() };
    RoleDescribe::new(vec![major], script.implementation_version.clone())
}

pub(super) fn role_op(shared: &Shared, route: Route, corr: u64, bound: &Bound, request: ToolCallRequest) {
    shared.metrics.role_ops.fetch_add(1, Ordering::Relaxed);
    let entry = Entry::Role(RoleEntry {
        incarnation: shared.incarnation.clone(),
        at_ms: now_ms(),
        route: route.to_string(),
        corr,
        op: request.name.clone(),
        preset: request.arguments.get("preset").and_then(Value::as_str).map(str::to_owned),
        scoped: bound.scope.is_some(),
        composition_digest: request
            .arguments
            .get("composition")
            .and_then(|c| cortexkit_role_tool_provider::catalog::composition_digest(c).ok()),
        system_text: request.arguments.get("system_text").is_some(),
    });
    if let Err(e) = shared.log.record(&entry) {
        log::error!("cannot record {} in the call log: {e}", request.name);
    }
    let answer = match request.name.as_str() {
        ops::ROLE_DESCRIBE => Ok(serde_json::to_vec(&describe(&shared.script)).expect("describe serializes")),
        ops::TOOL_CATALOG => catalog(&shared.script, bound, request.arguments),
        ops::LATE_RESULTS if shared.script.late_results => match &shared.late {
            Some(store) => late_read(store, bound, request.arguments),
            None => late_results(&shared.incarnation, request.arguments),
        },
        ops::LATE_RESULTS_ACK if shared.script.late_results => match &shared.late {
            Some(store) => late_ack(store, bound, request.arguments),
            None => late_results_ack(&shared.incarnation, request.arguments),
        },
        other => Err(errors::unknown_tool(other)),
    };
    let _ = match answer {
        Ok(body) => shared.outbound.reply(route, corr, body),
        Err(e) => shared.outbound.error(route, corr, &e),
    };
}

pub(super) fn catalog(script: &ToolScript, bound: &Bound, arguments: Value) -> Result<Vec<u8>, ErrorBody> {
    let request: CatalogRequest =
        serde_json::from_value(arguments).map_err(|e| errors::invalid_request("arguments", e.to_string()))?;
    if let Some(key) = request.params.keys().next() {
        return Err(errors::invalid_request(&format!("params.{key}"), "broca-mock documents no catalog params"));
    }
    if let Some(p) = request.preset.as_deref() {
        if !script.lists_preset(p) {
            return Err(errors::invalid_request(PRESET_FIELD, format!("no preset named {p:?}")));
        }
    }
    // System text needs a preset the script lists (tool-provider 0.10.4 has no default).
    let text_preset = match &request.system_text {
        None => None,
        Some(item) => match item.preset.as_deref() {
            Some(p) if script.lists_preset(p) => Some(p.to_owned()),
            Some(p) => return Err(errors::invalid_request("system_text.preset", format!("no preset named {p:?}"))),
            None => return Err(errors::invalid_request("system_text.preset", "broca-mock needs a system-text preset")),
        },
    };
    let digest_only = request.digest_only == Some(true);
    let mut answer =
        script.catalog(request.preset.as_deref(), bound.scope_class(), request.composition.as_ref(), digest_only)?;
    if let Some(preset) = text_preset {
        answer.system_text = Some(system_text(&preset, &answer));
    }
    if digest_only {
        // Exactly `{generation, catalog_digest}` (catalog-answers.json), not an empty tool list.
        let digest = json!({"generation": answer.generation, "catalog_digest": answer.catalog_digest});
        return Ok(digest.to_string().into_bytes());
    }
    Ok(serde_json::to_vec(&answer).expect("catalog answers serialize"))
}

/// The scripted system text of `preset`: one line naming the preset and the tools it lists.
pub(super) fn system_text(
    preset: &str,
    answer: &CatalogAnswer,
) -> cortexkit_role_tool_provider::catalog::SystemTextAnswer {
    use cortexkit_role_tool_provider::catalog::{system_text_digest, SystemTextAnswer};
    let mut names: Vec<String> = answer.tools.iter().map(|t| t.name.clone()).collect();
    names.sort();
    let text = format!("broca-mock system text ({preset}): the tools are {}.", names.join(", "));
    let digest = system_text_digest(&text);
    let mut out = SystemTextAnswer::new(digest.clone(), digest).with_text(text).with_tool_names(names);
    out.composition_digest = answer.composition_digest.clone();
    out
}

/// `late_results` from the store: the entries whose custodian is the principal stamped on this
/// route ([`crate::late::principal_text`]).
pub(super) fn late_read(store: &LateStore, bound: &Bound, arguments: Value) -> Result<Vec<u8>, ErrorBody> {
    let request: LateResultsRequest =
        serde_json::from_value(arguments).map_err(|e| errors::invalid_request("arguments", e.to_string()))?;
    let reply = store.read(&crate::late::principal_text(bound.principal.as_ref()), &request)?;
    Ok(serde_json::to_vec(&reply).expect("late results serialize"))
}

/// `late_results.ack` from the store, for this route's custodian.
pub(super) fn late_ack(store: &LateStore, bound: &Bound, arguments: Value) -> Result<Vec<u8>, ErrorBody> {
    let request: AckRequest =
        serde_json::from_value(arguments).map_err(|e| errors::invalid_request("arguments", e.to_string()))?;
    store.ack(&crate::late::principal_text(bound.principal.as_ref()), &request)?;
    Ok(b"{}".to_vec())
}

/// `late_results` without a store (`late_results_dir`): the mock holds no call past its
/// reply, so its log is always empty.
pub(super) fn late_results(incarnation: &str, arguments: Value) -> Result<Vec<u8>, ErrorBody> {
    let request: LateResultsRequest =
        serde_json::from_value(arguments).map_err(|e| errors::invalid_request("arguments", e.to_string()))?;
    check_since(incarnation, 0, request.since.as_ref())?;
    let cursor = Cursor { provider_incarnation: incarnation.to_owned(), seq: 0 };
    Ok(serde_json::to_vec(&LateResultsReply { entries: Vec::new(), cursor, more: false }).expect("serializes"))
}

pub(super) fn late_results_ack(incarnation: &str, arguments: Value) -> Result<Vec<u8>, ErrorBody> {
    let request: AckRequest =
        serde_json::from_value(arguments).map_err(|e| errors::invalid_request("arguments", e.to_string()))?;
    check_since(incarnation, 0, Some(&request.through))?;
    Ok(b"{}".to_vec())
}

/// The manifest: a `tool_provider` role listing every tool, `tool-provider/v1` and (when the
/// script keeps it) `call-keepalive/v1` among the capabilities.
pub fn manifest(script: &ToolScript, module_id: &str) -> subc_protocol::manifest::ModuleManifest {
    use subc_protocol::manifest::{CapabilityDeclarations, Concurrency, ExecutionMode, ModuleManifest, ProviderRole};
    let tools = script
        .tools
        .iter()
        .map(|t| subc_protocol::manifest::Tool {
            name: t.spec.name.clone(),
            description: t.spec.description.clone(),
            // Every scripted call counts as a side effect: nothing may re-run one on its own.
            execution_mode: ExecutionMode::Mutating,
            schema: t.spec.input_schema.clone(),
        })
        .collect();
    let mut provides = vec![PROVIDES.to_owned()];
    if script.keepalive {
        provides.push(CALL_KEEPALIVE_CAPABILITY.to_owned());
    }
    ModuleManifest::builder(module_id, env!("CARGO_PKG_VERSION"))
        .provides(vec![ProviderRole::ToolProvider {
            tools,
            identity_scope: Vec::new(),
            // `BROCA_MOCK_CONCURRENCY=serial|stateless_parallel` declares another credit window.
            concurrency: match std::env::var("BROCA_MOCK_CONCURRENCY").as_deref() {
                Ok("serial") => Concurrency::Serial,
                Ok("stateless_parallel") => Concurrency::StatelessParallel,
                _ => Concurrency::ModuleManaged,
            },
            emits_push: script.keepalive,
            sub_supervises: false,
        }])
        .capabilities(Some(CapabilityDeclarations { provides, requires: Vec::new(), must_never_reach: Vec::new() }))
        .build()
}
