//! The requests broca's own renderer makes for every family carrying the tool schemas of real
//! MCP servers (`testdata/api-schema/mcp-tools.json`), shared by the checks that hold broca's
//! requests to the providers' definitions (`tests/api_schema.rs`) and rules
//! (`tests/provider_rules.rs`): each tool alone and all together, with and without a system
//! prompt, under each tool_choice the family takes, on a plain turn and on a multi-step tool loop
//! (images, reasoning with signatures, redacted reasoning, tool errors).

use std::path::Path;

use broca::frozen::{
    AuthSource, CachePolicy, CacheRole, CacheTtl, Family, FrozenConfig, ToolChoice, ToolChoiceMode, ToolSpec,
};
use broca::message::{Message, Part, Role};
use broca::provider::render_request;
use serde_json::{json, Value};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The model each family is rendered for (the request goldens' models).
pub fn model(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::AnthropicMessages => ("anthropic", "claude-sonnet-4-5"),
        Family::OpenaiChat => ("openai", "o4-mini"),
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => ("openai", "gpt-5"),
        Family::GoogleGenerateContent => ("google", "gemini-2.5-flash"),
        Family::AwsBedrockConverse => ("amazon-bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
        Family::GoogleCodeAssist => ("google", "gemini-3.8-flash-high"),
    }
}

/// A reasoning variant as each family's catalog spells it (the goldens' `variant` params).
fn variant_params(family: Family) -> Value {
    match family {
        Family::AnthropicMessages => json!({"thinking": {"type": "enabled", "budget_tokens": 8192}}),
        Family::OpenaiChat => json!({"reasoning_effort": "high"}),
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => {
            json!({"reasoning": {"effort": "high", "summary": "auto"}, "include": ["reasoning.encrypted_content"]})
        }
        Family::GoogleGenerateContent | Family::GoogleCodeAssist => {
            json!({"generationConfig": {"thinkingConfig": {"includeThoughts": true, "thinkingBudget": 8192}}})
        }
        Family::AwsBedrockConverse => {
            json!({"additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 8192}}})
        }
    }
}

fn config(family: Family, system: bool, tools: Vec<ToolSpec>) -> FrozenConfig {
    let (provider, wire_model) = model(family);
    FrozenConfig {
        provider: provider.into(),
        model: wire_model.into(),
        family,
        base_url: "http://127.0.0.1:9".into(),
        wire_model: wire_model.into(),
        variant: None,
        variant_params: Value::Null,
        system: system.then(|| "You are a careful coding assistant with tools from MCP servers.".into()),
        max_output_tokens: Some(4096),
        max_steps: None,
        directives: Vec::new(),
        tools,
        auth: AuthSource::None,
        auth_method: Default::default(),
        policy: Default::default(),
        plan: None,
        tool_choice: None,
        service_tier: None,
        // What the loop sets on a Code Assist run (`provider::code_assist`).
        code_assist: (family == Family::GoogleCodeAssist).then(|| broca::frozen::CodeAssistIds {
            project: "broca-mock-project".into(),
            user_prompt_id: "run-1".into(),
            session_id: "s-1".into(),
        }),
    }
}

/// The MCP servers' tools, as ToolSpecs.
fn mcp_tools() -> Vec<(String, ToolSpec)> {
    let text = std::fs::read_to_string(repo().join("testdata/api-schema/mcp-tools.json")).expect("mcp-tools.json");
    let doc: Value = serde_json::from_str(&text).expect("mcp-tools.json is JSON");
    let mut tools = Vec::new();
    for server in doc["servers"].as_array().expect("servers") {
        let name = server["server"].as_str().expect("server name").to_string();
        for tool in server["tools"].as_array().expect("tools") {
            tools.push((
                name.clone(),
                ToolSpec {
                    name: tool["name"].as_str().expect("tool name").into(),
                    description: tool["description"].as_str().unwrap_or_default().into(),
                    input_schema: tool["inputSchema"].clone(),
                    reply: None,
                    module: None,
                    preset: None,
                    pin: None,
                    result_format: None,
                    output_refs: false,
                    reference_slots: Vec::new(),
                },
            ));
        }
    }
    tools
}

/// Arguments a model could send for `schema`: its required members, each a plausible value.
fn example(schema: &Value) -> Value {
    if let Some(first) = schema.get("anyOf").and_then(|a| a.get(0)) {
        return example(first);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => match schema.get("enum").and_then(|e| e.get(0)) {
            Some(first) => first.clone(),
            None => json!("src/main.rs"),
        },
        Some("number") | Some("integer") => json!(3),
        Some("boolean") => json!(true),
        Some("array") => match schema.get("items") {
            Some(items) => json!([example(items)]),
            None => json!([]),
        },
        Some("object") | None => {
            let mut out = serde_json::Map::new();
            let required = schema.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for key in required.iter().filter_map(Value::as_str) {
                    if let Some(prop) = props.get(key) {
                        out.insert(key.into(), example(prop));
                    }
                }
            }
            Value::Object(out)
        }
        Some(_) => Value::Null,
    }
}

fn msg(role: Role, content: Vec<Part>) -> Message {
    Message { role, content, origin: None, delivered_as: None, sender: None, client_message_id: None }
}

/// A tool loop over `tools`: an image, reasoning with a signature, a call of each tool (the
/// first answered, the second an error, the rest JSON), redacted reasoning, and a follow-up.
/// Signatures and redacted data are base64, as providers mint them.
fn tool_loop(tools: &[ToolSpec], system_message: bool) -> Vec<Message> {
    let mut first = vec![Part::Text { text: "Look at the repository and this screenshot, then act.".into() }];
    first.push(Part::Image {
        media_type: "image/png".into(),
        data: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==".into(),
    });
    let mut transcript = vec![msg(Role::User, first)];
    if system_message {
        transcript.push(msg(Role::System, vec![Part::Text { text: "The user prefers short answers.".into() }]));
    }
    let mut calls = vec![
        Part::Reasoning {
            text: "I should call the tools I was given.".into(),
            signature: Some("RXFRQm1vY2tTaWduYXR1cmVCYXNlNjQ=".into()),
        },
        Part::Text { text: "Calling the tools now.".into() },
    ];
    let mut results = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let id = format!("toolu_{i:02}");
        calls.push(Part::ToolCall {
            tool_call_id: id.clone(),
            tool_name: tool.name.clone(),
            input: example(&tool.input_schema),
        });
        let output = match i % 3 {
            0 => json!({"kind": "text", "text": format!("{} done: 3 items (é, \u{1F600})", tool.name)}),
            1 => json!({"kind": "error", "message": "permission denied", "code": "forbidden", "retry": "ask the user"}),
            _ => json!({"kind": "json", "json": {"items": [{"id": 1, "ok": true}], "next": null}}),
        };
        results.push(Part::ToolResult { tool_call_id: id, output, is_error: i % 3 == 1 });
    }
    transcript.push(msg(Role::Assistant, calls));
    transcript.push(msg(Role::Tool, results));
    transcript.push(msg(
        Role::Assistant,
        vec![
            Part::RedactedReasoning { data: "RW13S21vY2tSZWRhY3RlZFRoaW5raW5n".into() },
            Part::Text { text: "Done. Anything else?".into() },
        ],
    ));
    transcript.push(Message::user_text("Yes: summarise what changed."));
    transcript
}

/// The tool_choice values a family takes (Bedrock Converse has no "none": admission refuses it).
fn choices(family: Family, tools: &[ToolSpec]) -> Vec<(String, Option<ToolChoice>)> {
    let mut out = vec![
        ("default".to_string(), None),
        ("auto".into(), Some(ToolChoice::Mode(ToolChoiceMode::Auto))),
        ("required".into(), Some(ToolChoice::Mode(ToolChoiceMode::Required))),
    ];
    if family != Family::AwsBedrockConverse {
        out.push(("none".into(), Some(ToolChoice::Mode(ToolChoiceMode::None))));
    }
    for tool in tools {
        out.push((format!("named.{}", tool.name), Some(ToolChoice::Named { tool: tool.name.clone() })));
    }
    out
}

/// Every rendered request: (file name, body).
pub fn rendered() -> Vec<(String, Vec<u8>)> {
    let tools = mcp_tools();
    let all: Vec<ToolSpec> = tools.iter().map(|(_, t)| t.clone()).collect();
    let plain = vec![Message::user_text("Which of your tools would you use to list open issues?")];
    let mut out = Vec::new();
    for family in Family::ALL {
        let name = |case: &str| format!("request.{}.mcp.{case}.json", family.as_str());
        let mut push = |case: String, config: &FrozenConfig, transcript: &[Message]| {
            out.push((name(&case), render_request(config, transcript)));
        };
        // Each tool alone: offered on a plain turn under each choice, and called in a tool loop.
        for (_, tool) in &tools {
            let one = vec![tool.clone()];
            for system in [true, false] {
                let s = if system { "system" } else { "bare" };
                for (choice, tool_choice) in choices(family, &one) {
                    let mut c = config(family, system, one.clone());
                    c.tool_choice = tool_choice;
                    push(format!("tool.{}.{s}.{choice}.plain", tool.name), &c, &plain);
                }
                push(
                    format!("tool.{}.{s}.loop", tool.name),
                    &config(family, system, one.clone()),
                    &tool_loop(&one, false),
                );
            }
        }
        // Each server's tools together, in a tool loop calling every one of them.
        let mut servers: Vec<&str> = tools.iter().map(|(s, _)| s.as_str()).collect();
        servers.dedup();
        for (i, server) in servers.iter().enumerate() {
            let group: Vec<ToolSpec> = tools.iter().filter(|(s, _)| s == server).map(|(_, t)| t.clone()).collect();
            for system_message in [false, true] {
                let c = config(family, true, group.clone());
                push(format!("server{i:02}.loop.{system_message}"), &c, &tool_loop(&group, system_message));
            }
        }
        // All of them at once, under every choice, on a plain turn and in a loop calling them all.
        for (choice, tool_choice) in choices(family, &all) {
            let mut c = config(family, true, all.clone());
            c.tool_choice = tool_choice;
            push(format!("all.{choice}.plain"), &c, &plain);
            push(format!("all.{choice}.loop"), &c, &tool_loop(&all, true));
        }
        // With the family's reasoning variant, its cache policies and a fast tier where declared.
        let mut variant = config(family, true, all.clone());
        variant.variant = Some("high".into());
        variant.variant_params = variant_params(family);
        variant.max_output_tokens = Some(16000);
        push("all.variant.loop".into(), &variant, &tool_loop(&all, false));
        let policies = [
            ("cache.1h", CachePolicy { role: None, ttl: Some(CacheTtl::OneHour) }),
            ("cache.24h", CachePolicy { role: Some(CacheRole::Primary), ttl: Some(CacheTtl::OneDay) }),
            ("cache.ephemeral", CachePolicy { role: Some(CacheRole::Ephemeral), ttl: None }),
            ("cache.default", CachePolicy::default()),
        ];
        for (case, policy) in policies {
            let mut cached = config(family, true, all.clone());
            cached.policy.cache = Some(policy);
            cached.policy.conversation_key = Some("project-42/session-7".into());
            push(format!("all.{case}.loop"), &cached, &tool_loop(&all, false));
        }
        if broca::provider::tier::declared().contains_key(broca::provider::tier::wire_api(family)) {
            let mut fast = config(family, true, all.clone());
            fast.service_tier = Some(cortexkit_role_llm_runner::service_tier::ServiceTier::Fast);
            push("all.fast.loop".into(), &fast, &tool_loop(&all, false));
        }
    }
    out
}
