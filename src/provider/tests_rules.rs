//! What real providers refuse or answer that broca's first reading got wrong (#46): each test
//! pins one rule of a provider's own, with its source in the doc comment. Split from
//! `tests.rs`, whose request builders it shares.

use serde_json::{json, Value};

use super::config::ToolSpec;
use super::event::Family;
use super::tests::{config, stat_tool};
use super::{classify_http_error, render_request};
use crate::record::ErrorClass;

/// What real providers answer that the generic rules misread (#46): a Bedrock 403 for a bad
/// key or signature is an auth failure (a 403 for a missing model permission stays permanent),
/// the ChatGPT backend's 429 `usage_limit_reached` is an account limit with its reset, not a
/// rate to retry, and its refusal of a model it no longer serves keeps the backend's words.
#[test]
fn provider_specific_http_errors_classify_by_what_they_mean() {
    let bad_key = r#"{"message":"The security token included in the request is invalid."}"#;
    let e = classify_http_error(Family::AwsBedrockConverse, 403, bad_key.as_bytes());
    assert_eq!(e.class, ErrorClass::AuthRequired, "{e:?}");
    let typed = r#"{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"invalid"}"#;
    let e = classify_http_error(Family::AwsBedrockConverse, 403, typed.as_bytes());
    assert_eq!((e.class, e.provider_code.as_deref()), (ErrorClass::AuthRequired, Some("UnrecognizedClientException")));
    let api_key = r#"{"Message":"Authentication failed: Please make sure your API Key is valid."}"#;
    assert_eq!(
        classify_http_error(Family::AwsBedrockConverse, 403, api_key.as_bytes()).class,
        ErrorClass::AuthRequired
    );
    let denied = r#"{"message":"You don't have access to the model with the specified model ID."}"#;
    assert_eq!(classify_http_error(Family::AwsBedrockConverse, 403, denied.as_bytes()).class, ErrorClass::Permanent);
    let limit = r#"{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_in_seconds":3600}}"#;
    let e = classify_http_error(Family::OpenaiChatgptResponses, 429, limit.as_bytes());
    assert_eq!((e.class, e.provider_code.as_deref()), (ErrorClass::Permanent, Some("usage_limit_reached")));
    assert!(e.message.contains("resets in 3600 s"), "{}", e.message);
    let gone = r#"{"detail":"The 'gpt-4.1' model is not supported when using Codex with a ChatGPT account."}"#;
    let e = classify_http_error(Family::OpenaiChatgptResponses, 400, gone.as_bytes());
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("'gpt-4.1' model is not supported"), "{}", e.message);
}

/// The ChatGPT backend refuses a `system` input item ("System messages are not allowed"); a
/// system-role transcript message goes as `developer` there, and stays `system` on the public
/// Responses API (#46).
#[test]
fn a_system_message_is_a_developer_item_on_the_chatgpt_backend_only() {
    use crate::message::{Message, Part, Role};
    let system = Message::of(Role::System, vec![Part::Text { text: "be brief".into() }]);
    let transcript = [Message::user_text("hi"), system, Message::user_text("again")];
    let roles = |family: Family| -> Vec<String> {
        let body: Value =
            serde_json::from_slice(&render_request(&config(family, "openai", "gpt-5"), &transcript)).unwrap();
        body["input"].as_array().unwrap().iter().filter_map(|i| i["role"].as_str().map(String::from)).collect()
    };
    assert_eq!(roles(Family::OpenaiChatgptResponses), ["user", "developer", "user"]);
    assert_eq!(roles(Family::OpenaiResponses), ["user", "system", "user"]);
}

/// Converse's own rules (#46): a request whose history holds toolUse/toolResult blocks carries
/// a toolConfig even when the run offers no tools; `toolResult.status` goes to Claude models
/// only; Nova takes cache points on its system and messages but never among its tools.
#[test]
fn bedrock_converse_follows_its_model_rules() {
    use crate::message::{Message, Part, Role};
    let call = Message {
        role: Role::Assistant,
        content: vec![Part::ToolCall {
            tool_call_id: "t1".into(),
            tool_name: "stat_file".into(),
            input: json!({"path": "a"}),
        }],
        origin: None,
        delivered_as: None,
        sender: None,
        client_message_id: None,
    };
    let result = Message {
        role: Role::Tool,
        content: vec![Part::ToolResult {
            tool_call_id: "t1".into(),
            output: json!({"kind": "text", "text": "4 bytes"}),
            is_error: false,
        }],
        origin: None,
        delivered_as: None,
        sender: None,
        client_message_id: None,
    };
    let transcript = [Message::user_text("size of a?"), call, result, Message::user_text("thanks")];
    let body = |model: &str, tools: Vec<ToolSpec>| -> Value {
        let mut c = config(Family::AwsBedrockConverse, "amazon-bedrock", model);
        c.tools = tools;
        serde_json::from_slice(&render_request(&c, &transcript)).unwrap()
    };
    let nova = body("amazon.nova-pro-v1:0", vec![]);
    assert_eq!(
        nova["toolConfig"]["tools"],
        json!([{"toolSpec": {"name": "stat_file", "inputSchema": {"json": {"type": "object"}}}}])
    );
    assert!(nova.pointer("/messages/2/content/0/toolResult/status").is_none(), "{nova}");
    let nova = body("amazon.nova-pro-v1:0", vec![stat_tool()]);
    let tools = nova["toolConfig"]["tools"].as_array().unwrap();
    assert!(tools.iter().all(|t| t.get("cachePoint").is_none()), "no cache point among Nova's tools: {nova}");
    assert!(nova["system"].as_array().unwrap().iter().any(|b| b.get("cachePoint").is_some()), "{nova}");
    let claude = body("anthropic.claude-sonnet-4-5-20250929-v1:0", vec![stat_tool()]);
    assert_eq!(claude.pointer("/messages/2/content/0/toolResult/status"), Some(&json!("success")), "{claude}");
    assert!(claude["toolConfig"]["tools"].as_array().unwrap().iter().any(|t| t.get("cachePoint").is_some()));
}

/// A tool result with an image (#47): Anthropic Messages takes it as an image block inside the
/// `tool_result`, Converse as an image block for Claude models; every other family (and a
/// non-Claude Converse model) gets the result's text with the image's one-line note, exactly
/// what broca sent before it kept images. A result without images renders as it always did.
#[test]
fn an_image_tool_result_renders_per_family() {
    use crate::message::{Message, Part, Role};
    let call = Message::of(
        Role::Assistant,
        vec![Part::ToolCall { tool_call_id: "t1".into(), tool_name: "shot".into(), input: json!({}) }],
    );
    let image = json!({"type": "image", "media_type": "image/png", "data": "AAAA", "width": 2, "height": 3});
    let result = Message {
        role: Role::Tool,
        content: vec![Part::ToolResult {
            tool_call_id: "t1".into(),
            output: json!({"kind": "content", "content": [{"type": "text", "text": "a shot"}, image]}),
            is_error: false,
        }],
        origin: None,
        delivered_as: None,
        sender: None,
        client_message_id: None,
    };
    let transcript = [Message::user_text("look"), call, result];
    let body = |family: Family, provider: &str, model: &str| -> String {
        String::from_utf8(render_request(&config(family, provider, model), &transcript)).unwrap()
    };
    let note = r#"a shot\n[image not shown: mime=image/png 2x3]"#;
    let anthropic: Value =
        serde_json::from_str(&body(Family::AnthropicMessages, "anthropic", "claude-sonnet-4-5")).unwrap();
    assert_eq!(
        anthropic["messages"][2]["content"][0]["content"],
        json!([{"type": "text", "text": "a shot"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}])
    );
    let claude = body(Family::AwsBedrockConverse, "amazon-bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0");
    let claude: Value = serde_json::from_str(&claude).unwrap();
    assert_eq!(
        claude["messages"][2]["content"][0]["toolResult"]["content"],
        json!([{"text": "a shot"}, {"image": {"format": "png", "source": {"bytes": "AAAA"}}}])
    );
    for (family, provider, model) in [
        (Family::AwsBedrockConverse, "amazon-bedrock", "amazon.nova-pro-v1:0"),
        (Family::OpenaiChat, "openai", "o4-mini"),
        (Family::OpenaiResponses, "openai", "gpt-5"),
        (Family::GoogleGenerateContent, "google", "gemini-2.5-flash"),
    ] {
        let text = body(family, provider, model);
        assert!(text.contains(note), "{family:?}: {text}");
        assert!(!text.contains("AAAA"), "{family:?} takes no image in a tool result: {text}");
    }
}
