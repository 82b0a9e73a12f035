//! The providers' request rules as data (#46): for each wire family, a table of what the real
//! provider refuses or requires, one [`Rule`] a row, each naming its public source (the API
//! reference's section, or the provider's own error text as its users report it). broca-mock's
//! provider server checks every model request it receives against its family's table and
//! answers a violation as the provider would ([`refusal`]: its status, its error document);
//! `tests/provider_rules.rs` holds the request goldens to the same tables.
//!
//! A rule is kept only where the provider's behaviour is known: a rule that guessed would fail
//! good requests or pass bad ones. Messages quote the provider's error text where it is public;
//! where it is not (the row's `source` says so), the message is ours and says the same thing.
//!
//! A request that is not JSON is checked by no rule (the server records it; the families' JSON
//! parsers are not modelled). Rules that depend on the model (Bedrock's Nova and Claude-only
//! rows) apply only when the path names it.

use broca::provider::event::Family;
use serde_json::{json, Value};

/// What a rule sees of one request.
pub struct RequestView<'a> {
    pub family: Family,
    /// The request target as sent (empty when unknown, e.g. for a golden body).
    pub path: &'a str,
    pub headers: &'a [(String, String)],
    pub body: &'a Value,
    /// The model the path names (Gemini, Bedrock), else the body's `model`.
    pub model: Option<String>,
}

impl<'a> RequestView<'a> {
    pub fn new(family: Family, path: &'a str, headers: &'a [(String, String)], body: &'a Value) -> RequestView<'a> {
        let model = path_model(path).or_else(|| body.get("model").and_then(Value::as_str).map(str::to_owned));
        RequestView { family, path, headers, body, model }
    }

    /// The first header of this name, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The generateContent request: Code Assist's `request` envelope member, else the body.
    fn gemini(&self) -> &'a Value {
        match self.family {
            Family::GoogleCodeAssist => self.body.get("request").unwrap_or(&Value::Null),
            _ => self.body,
        }
    }

    /// Google's field paths start at the envelope: `request.` under Code Assist.
    fn gemini_prefix(&self) -> &'static str {
        if self.family == Family::GoogleCodeAssist {
            "request."
        } else {
            ""
        }
    }
}

/// A rule's check: the provider's error message when the request breaks the rule.
pub type Check = fn(&RequestView) -> Option<String>;

/// One thing a provider refuses or requires.
pub struct Rule {
    /// `<family prefix>.<name>`, e.g. `anthropic.text_non_empty`: the name a test allows it by.
    pub id: &'static str,
    pub family: Family,
    /// The HTTP status the provider answers a violation with.
    pub status: u16,
    pub what: &'static str,
    /// Where the rule is stated: the API reference's section, or the provider's own error text.
    pub source: &'static str,
    pub check: Check,
}

/// One broken rule of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub status: u16,
    /// The provider's error message for it.
    pub message: String,
}

/// How the provider answers a violation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    /// Headers beyond the JSON content type (Bedrock's `x-amzn-ErrorType`).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

const fn row(id: &'static str, family: Family, what: &'static str, source: &'static str, check: Check) -> Rule {
    Rule { id, family, status: 400, what, source, check }
}

const A: Family = Family::AnthropicMessages;
const CHAT: Family = Family::OpenaiChat;
const RESP: Family = Family::OpenaiResponses;
const GPT: Family = Family::OpenaiChatgptResponses;
const GEM: Family = Family::GoogleGenerateContent;
const CA: Family = Family::GoogleCodeAssist;
const BR: Family = Family::AwsBedrockConverse;

const ANTHROPIC_REF: &str = "Anthropic API reference, Messages > Create a Message";

pub static ANTHROPIC: &[Rule] = &[
    row("anthropic.model_required", A, "`model` is required", ANTHROPIC_REF, a_model),
    row("anthropic.max_tokens_required", A, "`max_tokens` is required", ANTHROPIC_REF, a_max_tokens),
    row("anthropic.messages_non_empty", A, "`messages` is a non-empty array", ANTHROPIC_REF, a_messages),
    row(
        "anthropic.first_message_user",
        A,
        "the first message has role `user`",
        "the API's 400 `messages: first message must use the \"user\" role` (lobehub/lobehub#1601)",
        a_first_user,
    ),
    row(
        "anthropic.roles",
        A,
        "a message's role is `user` or `assistant` (a system prompt is the top-level `system`)",
        "Anthropic API reference, Messages: `messages[].role` is \"user\" | \"assistant\"",
        a_roles,
    ),
    row(
        "anthropic.content_non_empty",
        A,
        "every message but a final assistant one has non-empty content",
        "the API's 400 `messages.N: all messages must have non-empty content except for the optional final assistant message`",
        a_content,
    ),
    row(
        "anthropic.text_non_empty",
        A,
        "text blocks (messages and system) hold non-whitespace text",
        "the API's 400 `messages: text content blocks must be non-empty` / `... must contain non-whitespace text`",
        a_text,
    ),
    row(
        "anthropic.tool_result_answers_tool_use",
        A,
        "every `tool_result`'s `tool_use_id` is a `tool_use` of the immediately previous assistant message",
        "the API's 400 ``unexpected `tool_use_id` found in `tool_result` blocks``; Anthropic docs, Tool use > Handling tool results",
        a_results_answer,
    ),
    row(
        "anthropic.tool_use_answered",
        A,
        "a `tool_use` followed by another message is answered by a `tool_result` in it",
        "the API's 400 ``tool_use` ids were found without `tool_result` blocks immediately after``",
        a_uses_answered,
    ),
    row(
        "anthropic.tool_name_pattern",
        A,
        "a custom tool's name matches ^[a-zA-Z0-9_-]{1,128}$",
        "the API's 400 `tools.N.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'` (vybestack/llxprt-code#482)",
        a_tool_names,
    ),
    row(
        "anthropic.thinking_budget_below_max_tokens",
        A,
        "`thinking.budget_tokens` is at least 1,024 and below `max_tokens`",
        "Anthropic docs, Extended thinking > budget_tokens; the API's 400 `max_tokens must be greater than thinking.budget_tokens`",
        a_thinking_budget,
    ),
    row(
        "anthropic.thinking_not_with_forced_tool",
        A,
        "thinking is not enabled while `tool_choice` forces tool use (`any` or `tool`)",
        "Anthropic docs, Extended thinking > Extended thinking with tool use; the API's 400 `Thinking may not be enabled when tool_choice forces tool use.`",
        a_thinking_forced_tool,
    ),
    Rule {
        id: "anthropic.bearer_needs_oauth_beta",
        family: A,
        status: 401,
        what: "`Authorization: Bearer` is an OAuth token, taken only with `anthropic-beta: oauth-2025-04-20` (API keys go in `x-api-key`)",
        source: "Anthropic API reference, Authentication (`x-api-key`); the API's 401 `OAuth authentication is currently not supported.`",
        check: a_bearer,
    },
];

const CHAT_REF: &str = "OpenAI API reference, Chat > Create chat completion";

pub static OPENAI_CHAT: &[Rule] = &[
    row(
        "openai_chat.model_required",
        CHAT,
        "`model` is required",
        "OpenAI's 400 `you must provide a model parameter`",
        chat_model,
    ),
    row(
        "openai_chat.messages_non_empty",
        CHAT,
        "`messages` is a non-empty array",
        "OpenAI's 400 `Invalid 'messages': empty array. Expected an array with minimum length 1`",
        chat_messages,
    ),
    row(
        "openai_chat.roles",
        CHAT,
        "a message's role is system, developer, user, assistant, tool or function",
        CHAT_REF,
        chat_roles,
    ),
    row(
        "openai_chat.tool_message_answers_call",
        CHAT,
        "a `tool` message answers a `tool_calls` entry of the assistant message its run of tool messages follows",
        "OpenAI's 400 `messages with role 'tool' must be a response to a preceeding message with 'tool_calls'`",
        chat_tool_answers,
    ),
    row(
        "openai_chat.tool_calls_answered",
        CHAT,
        "an assistant message's `tool_calls` followed by another message are each answered by a tool message",
        "OpenAI's 400 `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'`",
        chat_calls_answered,
    ),
    row(
        "openai_chat.stream_options_needs_stream",
        CHAT,
        "`stream_options` only with `stream: true`",
        "OpenAI's 400 `The 'stream_options' parameter is only allowed when 'stream' is enabled.`; API reference, `stream_options`",
        chat_stream_options,
    ),
    row(
        "openai_chat.tool_name_pattern",
        CHAT,
        "a function's name matches ^[a-zA-Z0-9_-]+$, at most 64 characters",
        "OpenAI API reference, `tools[].function.name` (a-z, A-Z, 0-9, underscores and dashes, maximum length of 64)",
        chat_tool_names,
    ),
];

const RESPONSES_REF: &str = "OpenAI API reference, Responses > Create a model response";

pub static OPENAI_RESPONSES: &[Rule] = &[
    row(
        "openai_responses.model_required",
        RESP,
        "`model` is required",
        "OpenAI's 400 `Missing required parameter: 'model'.`",
        resp_model,
    ),
    row(
        "openai_responses.input_roles",
        RESP,
        "an input message's role is user, assistant, system or developer",
        RESPONSES_REF,
        resp_roles,
    ),
    row(
        "openai_responses.function_call_output_answers_call",
        RESP,
        "a `function_call_output`'s `call_id` is an earlier `function_call`'s (unless `previous_response_id` holds the call)",
        "OpenAI's 400 `No tool call found for function call output with call_id ...`",
        resp_output_answers,
    ),
    row(
        "openai_responses.function_call_answered",
        RESP,
        "every `function_call` in `input` has its `function_call_output`",
        "OpenAI's 400 `No tool output found for function call ...`",
        resp_call_answered,
    ),
    row(
        "openai_responses.tool_name_pattern",
        RESP,
        "a function tool's name matches ^[a-zA-Z0-9_-]+$, at most 64 characters",
        "OpenAI API reference, Responses `tools[].name` for function tools",
        resp_tool_names,
    ),
];

pub static CHATGPT: &[Rule] = &[
    row(
        "chatgpt.input_roles",
        GPT,
        "an input message's role is user, assistant, system or developer",
        RESPONSES_REF,
        resp_roles,
    ),
    row(
        "chatgpt.function_call_output_answers_call",
        GPT,
        "a `function_call_output`'s `call_id` is an earlier `function_call`'s",
        "OpenAI's 400 `No tool call found for function call output with call_id ...`",
        resp_output_answers,
    ),
    row(
        "chatgpt.function_call_answered",
        GPT,
        "every `function_call` in `input` has its `function_call_output`",
        "OpenAI's 400 `No tool output found for function call ...`",
        resp_call_answered,
    ),
    row(
        "chatgpt.tool_name_pattern",
        GPT,
        "a function tool's name matches ^[a-zA-Z0-9_-]+$, at most 64 characters",
        "OpenAI API reference, Responses `tools[].name` for function tools",
        resp_tool_names,
    ),
    row(
        "chatgpt.no_system_message",
        GPT,
        "no `system`-role input message (the system prompt is `instructions`)",
        "the Codex backend's 400 `{\"detail\":\"System messages are not allowed\"}`",
        gpt_no_system,
    ),
    row(
        "chatgpt.instructions_required",
        GPT,
        "`instructions` is present (a string)",
        "the Codex backend's 400 `{\"detail\":\"Instructions are required\"}`",
        gpt_instructions,
    ),
    row(
        "chatgpt.max_output_tokens",
        GPT,
        "no `max_output_tokens`",
        "the Codex backend's 400 `{\"detail\":\"Unsupported parameter: max_output_tokens\"}`",
        gpt_max_output_tokens,
    ),
    row(
        "chatgpt.prompt_cache_retention",
        GPT,
        "no `prompt_cache_retention`",
        "the Codex backend's 400 `Unsupported parameter: prompt_cache_retention` (as broca #29 found it; not in public docs)",
        gpt_retention,
    ),
    row(
        "chatgpt.store_false",
        GPT,
        "`store` is false",
        "the Codex backend's 400 `{\"detail\":\"Store must be set to false\"}`",
        gpt_store,
    ),
    row(
        "chatgpt.stream_true",
        GPT,
        "`stream` is true",
        "the Codex backend's 400 `{\"detail\":\"Stream must be set to true\"}`",
        gpt_stream,
    ),
];

const FUNCTION_REF: &str = "Gemini API reference, Function calling > FunctionDeclaration";

/// One Google table's rows: the same checks under Gemini and Code Assist.
macro_rules! google_rules {
    ($name:ident, $prefix:literal, $family:expr $(, $extra:expr)*) => {
        pub static $name: &[Rule] = &[
            row(
                concat!($prefix, ".contents_non_empty"),
                $family,
                "`contents` is a non-empty array",
                "Google's 400 `GenerateContentRequest.contents: contents is not specified`",
                g_contents,
            ),
            row(
                concat!($prefix, ".roles"),
                $family,
                "a content's role is `user` or `model`",
                "Google's 400 `Please use a valid role: user, model.`; Gemini API reference, Content.role",
                g_roles,
            ),
            row(
                concat!($prefix, ".function_response_follows_call"),
                $family,
                "a content with `functionResponse` parts comes right after a model content with `functionCall` parts",
                "Google's 400 `Please ensure that function response turn comes immediately after a function call turn.`",
                g_response_follows,
            ),
            row(
                concat!($prefix, ".function_response_count"),
                $family,
                "a function response turn has as many `functionResponse` parts as its call turn has `functionCall` parts",
                "Google's 400 `Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.`",
                g_response_count,
            ),
            row(
                concat!($prefix, ".function_response_name"),
                $family,
                "a `functionResponse` has a `name`",
                "Google's 400 `...function_response.name: Name cannot be empty.`; Gemini API reference, FunctionResponse.name (required)",
                g_response_name,
            ),
            row(
                concat!($prefix, ".function_name_pattern"),
                $family,
                "a declared function's name starts with a letter or underscore, then a-z, A-Z, 0-9, `_`, `.`, `:`, `-`, at most 64 in all",
                FUNCTION_REF,
                g_function_names,
            ),
            row(
                concat!($prefix, ".parameters_exclusive"),
                $family,
                "a declaration has `parameters` or `parametersJsonSchema`, not both",
                "Gemini API reference, FunctionDeclaration.parametersJsonSchema: \"mutually exclusive with parameters\"",
                g_parameters_exclusive,
            ),
            row(
                concat!($prefix, ".parameters_schema_subset"),
                $family,
                "`parameters` uses only the Schema object's fields (no `$schema`, `additionalProperties`, `const`, `$ref`, ...; those need `parametersJsonSchema`)",
                "Gemini API reference, Schema; Google's 400 `Invalid JSON payload received. Unknown name \"additionalProperties\" at 'tools[0].function_declarations[0].parameters': Cannot find field.`",
                g_parameters_subset,
            ),
            $($extra,)*
        ];
    };
}

google_rules!(GEMINI, "gemini", GEM);
google_rules!(
    CODE_ASSIST,
    "code_assist",
    CA,
    Rule {
        id: "code_assist.project_required",
        family: CA,
        status: 403,
        what: "the envelope names the account's Google Cloud `project` (found with `loadCodeAssist`/`onboardUser`)",
        source: "gemini-cli `code_assist/converter.ts` `toGenerateContentRequest` and `setup.ts` `setupUser`; the backend's 403 `Permission denied on resource project …` (cline/cline#4526)",
        check: ca_project,
    }
);

fn ca_project(r: &RequestView) -> Option<String> {
    let project = r.body.get("project").and_then(Value::as_str).unwrap_or_default();
    project.is_empty().then(|| "Permission denied on resource project .".into())
}

pub static BEDROCK: &[Rule] = &[
    row(
        "bedrock.first_message_user",
        BR,
        "`messages` is non-empty and starts with a user message",
        "Bedrock's ValidationException `A conversation must start with a user message.`",
        b_first_user,
    ),
    row(
        "bedrock.roles",
        BR,
        "a message's role is `user` or `assistant`",
        "Amazon Bedrock API reference, Message.role (Valid Values: user | assistant)",
        b_roles,
    ),
    row(
        "bedrock.roles_alternate",
        BR,
        "no two consecutive messages of one role",
        "Bedrock's ValidationException `A conversation must alternate between user and assistant roles.`",
        b_alternate,
    ),
    row(
        "bedrock.text_non_empty",
        BR,
        "text blocks (messages and system) are not blank",
        "Bedrock's ValidationException `The text field in the ContentBlock object at messages.N.content.M is blank.`",
        b_text,
    ),
    row(
        "bedrock.tool_config_required",
        BR,
        "`toolUse` / `toolResult` blocks need `toolConfig`",
        "Bedrock's ValidationException `The toolConfig field must be defined when using toolUse and toolResult content blocks.`",
        b_tool_config,
    ),
    row(
        "bedrock.tool_results_match_tool_uses",
        BR,
        "the message after an assistant's `toolUse` blocks answers each with a `toolResult`, and no more",
        "Bedrock's ValidationException `Expected toolResult blocks at messages.N.content for the following Ids: ...` / `The number of toolResult blocks at messages.N.content exceeds the number of toolUse blocks of previous turn.`",
        b_results_match,
    ),
    row(
        "bedrock.nova_no_tool_cache_point",
        BR,
        "Amazon Nova models take no `cachePoint` in `toolConfig.tools` (model in the path)",
        "Amazon Bedrock User Guide, Prompt caching > Supported models (Nova: checkpoints in system and messages only); message ours",
        b_nova_tool_cache,
    ),
    row(
        "bedrock.tool_result_status_claude_only",
        BR,
        "`toolResult.status` only for Anthropic Claude models (model in the path)",
        "Amazon Bedrock API reference, ToolResultBlock.status: \"only supported by Anthropic Claude 3 models\"",
        b_status_claude,
    ),
];

/// The family's table.
pub fn rules(family: Family) -> &'static [Rule] {
    match family {
        Family::AnthropicMessages => ANTHROPIC,
        Family::OpenaiChat => OPENAI_CHAT,
        Family::OpenaiResponses => OPENAI_RESPONSES,
        Family::OpenaiChatgptResponses => CHATGPT,
        Family::GoogleGenerateContent => GEMINI,
        Family::GoogleCodeAssist => CODE_ASSIST,
        Family::AwsBedrockConverse => BEDROCK,
    }
}

/// Every rule of every family.
pub fn all() -> impl Iterator<Item = &'static Rule> {
    Family::ALL.into_iter().flat_map(rules)
}

/// The rule of this id.
pub fn find(id: &str) -> Option<&'static Rule> {
    all().find(|r| r.id == id)
}

/// The rules `body` (a `family` request sent to `path` with `headers`) breaks, in table order.
/// A body that is not JSON breaks none.
pub fn check(family: Family, path: &str, headers: &[(String, String)], body: &[u8]) -> Vec<Violation> {
    match serde_json::from_slice::<Value>(body) {
        Ok(body) => check_value(family, path, headers, &body),
        Err(_) => Vec::new(),
    }
}

/// [`check`] of a parsed body.
pub fn check_value(family: Family, path: &str, headers: &[(String, String)], body: &Value) -> Vec<Violation> {
    let view = RequestView::new(family, path, headers, body);
    rules(family)
        .iter()
        .filter_map(|rule| (rule.check)(&view).map(|message| Violation { rule: rule.id, status: rule.status, message }))
        .collect()
}

/// The provider's answer to `violation`: its status and its own error document.
pub fn refusal(family: Family, violation: &Violation) -> Refusal {
    let message = violation.message.as_str();
    let status = violation.status;
    let mut headers = Vec::new();
    let body = match family {
        Family::AnthropicMessages => {
            let kind = if status == 401 { "authentication_error" } else { "invalid_request_error" };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Family::OpenaiChat | Family::OpenaiResponses => {
            json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}})
        }
        Family::OpenaiChatgptResponses => json!({"detail": message}),
        Family::GoogleGenerateContent | Family::GoogleCodeAssist => {
            let kind = match status {
                401 => "UNAUTHENTICATED",
                403 => "PERMISSION_DENIED",
                _ => "INVALID_ARGUMENT",
            };
            json!({"error": {"code": status, "message": message, "status": kind}})
        }
        Family::AwsBedrockConverse => {
            headers.push(("x-amzn-ErrorType".to_string(), "ValidationException".to_string()));
            json!({"message": message})
        }
    };
    Refusal { status, headers, body: serde_json::to_vec(&body).expect("a JSON value serializes") }
}

/// The model a path names: Gemini's `/models/<model>:…`, Bedrock's `/model/<percent-encoded>/…`.
fn path_model(path: &str) -> Option<String> {
    let path = path.split('?').next().unwrap_or_default();
    if let Some(at) = path.find("/models/") {
        let rest = &path[at + "/models/".len()..];
        return rest.split(':').next().filter(|m| !m.is_empty() && !m.contains('/')).map(str::to_owned);
    }
    let at = path.find("/model/")?;
    let encoded = path[at + "/model/".len()..].split('/').next()?;
    percent_decode(encoded).filter(|m| !m.is_empty())
}

/// `s` with its `%XX` escapes decoded (a Bedrock model id in a path), or `None` when malformed.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

// ---- helpers ----------------------------------------------------------------------------------

fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn role(v: &Value) -> &str {
    text(v, "role").unwrap_or_default()
}

fn missing_string(v: &Value, key: &str) -> bool {
    text(v, key).is_none_or(|s| s.is_empty())
}

/// `v`'s `key` blocks of type `kind`: their `id_key` strings.
fn block_ids<'a>(content: &'a Value, kind: &str, id_key: &str) -> Vec<&'a str> {
    content
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| text(b, "type") == Some(kind))
                .map(|b| text(b, id_key).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// ^[a-zA-Z0-9_-]{min,max}$
fn plain_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.chars().count()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

// ---- Anthropic Messages -----------------------------------------------------------------------

fn a_model(r: &RequestView) -> Option<String> {
    missing_string(r.body, "model").then(|| "model: Field required".into())
}

fn a_max_tokens(r: &RequestView) -> Option<String> {
    (!r.body.get("max_tokens").is_some_and(Value::is_u64)).then(|| "max_tokens: Field required".into())
}

fn a_messages(r: &RequestView) -> Option<String> {
    match r.body.get("messages").and_then(Value::as_array) {
        None => Some("messages: Field required".into()),
        Some(m) if m.is_empty() => Some("messages: at least one message is required".into()),
        Some(_) => None,
    }
}

fn a_first_user(r: &RequestView) -> Option<String> {
    let first = arr(r.body, "messages").first()?;
    (role(first) != "user").then(|| "messages: first message must use the \"user\" role".into())
}

fn a_roles(r: &RequestView) -> Option<String> {
    let (i, _) = arr(r.body, "messages").iter().enumerate().find(|(_, m)| !["user", "assistant"].contains(&role(m)))?;
    Some(format!("messages.{i}.role: Input should be 'user' or 'assistant'"))
}

fn a_content(r: &RequestView) -> Option<String> {
    let messages = arr(r.body, "messages");
    let (i, _) = messages.iter().enumerate().find(|(i, m)| {
        let empty = match m.get("content") {
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => true,
        };
        empty && !(*i + 1 == messages.len() && role(m) == "assistant")
    })?;
    Some(format!(
        "messages.{i}: all messages must have non-empty content except for the optional final assistant message"
    ))
}

fn a_text(r: &RequestView) -> Option<String> {
    let system = r.body.get("system").and_then(Value::as_array).map(|s| ("system", s.as_slice()));
    let messages = arr(r.body, "messages").iter().filter_map(|m| m.get("content").and_then(Value::as_array));
    let places = system.into_iter().chain(messages.map(|c| ("messages", c.as_slice())));
    for (place, blocks) in places {
        for block in blocks.iter().filter(|b| text(b, "type") == Some("text")) {
            let t = text(block, "text").unwrap_or_default();
            if t.is_empty() {
                return Some(format!("{place}: text content blocks must be non-empty"));
            }
            if t.trim().is_empty() {
                return Some(format!("{place}: text content blocks must contain non-whitespace text"));
            }
        }
    }
    None
}

fn a_results_answer(r: &RequestView) -> Option<String> {
    let messages = arr(r.body, "messages");
    for (i, m) in messages.iter().enumerate() {
        let content = m.get("content").unwrap_or(&Value::Null);
        let uses = match i.checked_sub(1).map(|p| &messages[p]) {
            Some(prev) if role(prev) == "assistant" => {
                block_ids(prev.get("content").unwrap_or(&Value::Null), "tool_use", "id")
            }
            _ => Vec::new(),
        };
        let blocks = content.as_array().map_or(&[][..], Vec::as_slice);
        for (j, block) in blocks.iter().enumerate().filter(|(_, b)| text(b, "type") == Some("tool_result")) {
            let id = text(block, "tool_use_id").unwrap_or_default();
            if !uses.contains(&id) {
                return Some(format!(
                    "messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. \
                     Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                ));
            }
        }
    }
    None
}

fn a_uses_answered(r: &RequestView) -> Option<String> {
    let messages = arr(r.body, "messages");
    for (i, pair) in messages.windows(2).enumerate() {
        if role(&pair[0]) != "assistant" {
            continue;
        }
        let uses = block_ids(pair[0].get("content").unwrap_or(&Value::Null), "tool_use", "id");
        let results = block_ids(pair[1].get("content").unwrap_or(&Value::Null), "tool_result", "tool_use_id");
        let missing: Vec<&str> = uses.into_iter().filter(|u| !results.contains(u)).collect();
        if !missing.is_empty() {
            return Some(format!(
                "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. \
                 Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                missing.join(", ")
            ));
        }
    }
    None
}

fn a_tool_names(r: &RequestView) -> Option<String> {
    let custom = |t: &Value| text(t, "type").is_none_or(|k| k == "custom");
    let (i, _) = arr(r.body, "tools")
        .iter()
        .enumerate()
        .find(|(_, t)| custom(t) && !plain_name(text(t, "name").unwrap_or_default(), 128))?;
    Some(format!("tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"))
}

fn a_thinking_budget(r: &RequestView) -> Option<String> {
    let thinking = r.body.get("thinking").filter(|t| text(t, "type") == Some("enabled"))?;
    let budget = thinking.get("budget_tokens").and_then(Value::as_u64).unwrap_or(0);
    let max = r.body.get("max_tokens").and_then(Value::as_u64).unwrap_or(0);
    if budget < 1024 {
        return Some("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024".into());
    }
    (max <= budget).then(|| "`max_tokens` must be greater than `thinking.budget_tokens`".into())
}

fn a_thinking_forced_tool(r: &RequestView) -> Option<String> {
    let thinking = r.body.get("thinking").is_some_and(|t| matches!(text(t, "type"), Some("enabled" | "adaptive")));
    let forced = r.body.get("tool_choice").is_some_and(|c| matches!(text(c, "type"), Some("any" | "tool")));
    (thinking && forced).then(|| "Thinking may not be enabled when tool_choice forces tool use.".into())
}

fn a_bearer(r: &RequestView) -> Option<String> {
    let auth = r.header("authorization")?;
    let bearer = auth.get(..7).is_some_and(|p| p.eq_ignore_ascii_case("bearer "));
    let beta = r.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case("anthropic-beta"));
    let oauth = beta.flat_map(|(_, v)| v.split(',')).any(|b| b.trim() == "oauth-2025-04-20");
    (bearer && !oauth).then(|| "OAuth authentication is currently not supported.".into())
}

// ---- OpenAI Chat ------------------------------------------------------------------------------

fn chat_model(r: &RequestView) -> Option<String> {
    missing_string(r.body, "model").then(|| "you must provide a model parameter".into())
}

fn chat_messages(r: &RequestView) -> Option<String> {
    match r.body.get("messages").and_then(Value::as_array) {
        None => Some("Missing required parameter: 'messages'.".into()),
        Some(m) if m.is_empty() => Some(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."
                .into(),
        ),
        Some(_) => None,
    }
}

fn chat_roles(r: &RequestView) -> Option<String> {
    const ROLES: [&str; 6] = ["system", "developer", "user", "assistant", "tool", "function"];
    let m = arr(r.body, "messages").iter().find(|m| !ROLES.contains(&role(m)))?;
    Some(format!(
        "Invalid value: '{}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.",
        role(m)
    ))
}

fn chat_call_ids(m: &Value) -> Vec<&str> {
    arr(m, "tool_calls").iter().map(|c| text(c, "id").unwrap_or_default()).collect()
}

fn chat_tool_answers(r: &RequestView) -> Option<String> {
    let mut open: Option<Vec<&str>> = None;
    for m in arr(r.body, "messages") {
        match role(m) {
            "assistant" => open = Some(chat_call_ids(m)).filter(|ids| !ids.is_empty()),
            "tool" => {
                let id = text(m, "tool_call_id").unwrap_or_default();
                match &open {
                    None => {
                        return Some(
                            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message \
                             with 'tool_calls'."
                                .into(),
                        )
                    }
                    Some(ids) if !ids.contains(&id) => {
                        return Some(format!(
                            "Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."
                        ))
                    }
                    Some(_) => {}
                }
            }
            _ => open = None,
        }
    }
    None
}

fn chat_calls_answered(r: &RequestView) -> Option<String> {
    let messages = arr(r.body, "messages");
    for (i, m) in messages.iter().enumerate() {
        let ids = if role(m) == "assistant" { chat_call_ids(m) } else { continue };
        if ids.is_empty() || i + 1 == messages.len() {
            continue;
        }
        let answered: Vec<&str> = messages[i + 1..]
            .iter()
            .take_while(|n| role(n) == "tool")
            .map(|n| text(n, "tool_call_id").unwrap_or_default())
            .collect();
        let missing: Vec<&str> = ids.into_iter().filter(|id| !answered.contains(id)).collect();
        if !missing.is_empty() {
            return Some(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each \
                 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                missing.join(", ")
            ));
        }
    }
    None
}

fn chat_stream_options(r: &RequestView) -> Option<String> {
    let options = r.body.get("stream_options").is_some_and(|o| !o.is_null());
    (options && r.body.get("stream") != Some(&Value::Bool(true)))
        .then(|| "The 'stream_options' parameter is only allowed when 'stream' is enabled.".into())
}

fn openai_name(place: String, name: &str) -> Option<String> {
    let n = name.chars().count();
    if n > 64 {
        return Some(format!(
            "Invalid '{place}': string too long. Expected a string with maximum length 64, but got a string with \
             length {n} instead."
        ));
    }
    (!plain_name(name, 64)).then(|| {
        format!(
            "Invalid '{place}': string does not match pattern. Expected a string that matches the pattern \
             '^[a-zA-Z0-9_-]+$'."
        )
    })
}

fn chat_tool_names(r: &RequestView) -> Option<String> {
    arr(r.body, "tools").iter().enumerate().find_map(|(i, t)| {
        let f = t.get("function")?;
        openai_name(format!("tools[{i}].function.name"), text(f, "name").unwrap_or_default())
    })
}

// ---- OpenAI Responses and the ChatGPT/Codex backend ------------------------------------------

fn resp_model(r: &RequestView) -> Option<String> {
    missing_string(r.body, "model").then(|| "Missing required parameter: 'model'.".into())
}

fn is_message(item: &Value) -> bool {
    match text(item, "type") {
        Some(kind) => kind == "message",
        None => item.get("role").is_some(),
    }
}

fn resp_roles(r: &RequestView) -> Option<String> {
    const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];
    let (i, m) = arr(r.body, "input").iter().enumerate().find(|(_, m)| is_message(m) && !ROLES.contains(&role(m)))?;
    Some(format!(
        "Invalid value: '{}'. Supported values are: 'assistant', 'system', 'developer', and 'user'. (input[{i}].role)",
        role(m)
    ))
}

fn items_of<'a>(r: &RequestView<'a>, kind: &'a str) -> impl Iterator<Item = (usize, &'a str)> + 'a {
    arr(r.body, "input")
        .iter()
        .enumerate()
        .filter(move |(_, item)| text(item, "type") == Some(kind))
        .map(|(i, item)| (i, text(item, "call_id").unwrap_or_default()))
}

fn resp_output_answers(r: &RequestView) -> Option<String> {
    if r.body.get("previous_response_id").is_some_and(|p| !p.is_null()) {
        return None;
    }
    let calls: Vec<(usize, &str)> = items_of(r, "function_call").collect();
    let (_, id) =
        items_of(r, "function_call_output").find(|(i, id)| !calls.iter().any(|(c, cid)| c < i && cid == id))?;
    Some(format!("No tool call found for function call output with call_id {id}."))
}

fn resp_call_answered(r: &RequestView) -> Option<String> {
    let outputs: Vec<(usize, &str)> = items_of(r, "function_call_output").collect();
    let (_, id) = items_of(r, "function_call").find(|(i, id)| !outputs.iter().any(|(o, oid)| o > i && oid == id))?;
    Some(format!("No tool output found for function call {id}."))
}

fn resp_tool_names(r: &RequestView) -> Option<String> {
    arr(r.body, "tools").iter().enumerate().find_map(|(i, t)| {
        (text(t, "type") == Some("function"))
            .then(|| openai_name(format!("tools[{i}].name"), text(t, "name").unwrap_or_default()))
            .flatten()
    })
}

fn gpt_no_system(r: &RequestView) -> Option<String> {
    arr(r.body, "input")
        .iter()
        .any(|m| is_message(m) && role(m) == "system")
        .then(|| "System messages are not allowed".into())
}

fn gpt_instructions(r: &RequestView) -> Option<String> {
    // Present, as a string: the Codex client sends it always; an empty one is not known to be
    // refused (broca sends `""` without a system prompt).
    (!r.body.get("instructions").is_some_and(Value::is_string)).then(|| "Instructions are required".into())
}

fn gpt_max_output_tokens(r: &RequestView) -> Option<String> {
    r.body.get("max_output_tokens").map(|_| "Unsupported parameter: max_output_tokens".into())
}

fn gpt_retention(r: &RequestView) -> Option<String> {
    r.body.get("prompt_cache_retention").map(|_| "Unsupported parameter: prompt_cache_retention".into())
}

fn gpt_store(r: &RequestView) -> Option<String> {
    (r.body.get("store") != Some(&Value::Bool(false))).then(|| "Store must be set to false".into())
}

fn gpt_stream(r: &RequestView) -> Option<String> {
    (r.body.get("stream") != Some(&Value::Bool(true))).then(|| "Stream must be set to true".into())
}

// ---- Gemini and Code Assist -------------------------------------------------------------------

fn g_contents(r: &RequestView) -> Option<String> {
    arr(r.gemini(), "contents")
        .is_empty()
        .then(|| format!("* GenerateContentRequest.{}contents: contents is not specified", r.gemini_prefix()))
}

fn g_roles(r: &RequestView) -> Option<String> {
    arr(r.gemini(), "contents")
        .iter()
        .any(|c| text(c, "role").is_some_and(|role| role != "user" && role != "model"))
        .then(|| "Please use a valid role: user, model.".into())
}

fn parts_with<'a>(content: &'a Value, key: &'a str) -> impl Iterator<Item = (usize, &'a Value)> + 'a {
    arr(content, "parts").iter().enumerate().filter_map(move |(j, p)| p.get(key).map(|v| (j, v)))
}

fn g_response_follows(r: &RequestView) -> Option<String> {
    let contents = arr(r.gemini(), "contents");
    let bad = contents.iter().enumerate().any(|(i, c)| {
        parts_with(c, "functionResponse").next().is_some()
            && !i.checked_sub(1).is_some_and(|p| {
                role(&contents[p]) == "model" && parts_with(&contents[p], "functionCall").next().is_some()
            })
    });
    bad.then(|| "Please ensure that function response turn comes immediately after a function call turn.".into())
}

fn g_response_count(r: &RequestView) -> Option<String> {
    let bad = arr(r.gemini(), "contents").windows(2).any(|pair| {
        let calls = parts_with(&pair[0], "functionCall").count();
        let responses = parts_with(&pair[1], "functionResponse").count();
        calls > 0 && responses > 0 && calls != responses
    });
    bad.then(|| {
        "Please ensure that the number of function response parts is equal to the number of function call parts of \
         the function call turn."
            .into()
    })
}

fn g_response_name(r: &RequestView) -> Option<String> {
    arr(r.gemini(), "contents").iter().enumerate().find_map(|(i, c)| {
        let (j, _) = parts_with(c, "functionResponse").find(|(_, f)| missing_string(f, "name"))?;
        Some(format!(
            "* GenerateContentRequest.{}contents[{i}].parts[{j}].function_response.name: Name cannot be empty.",
            r.gemini_prefix()
        ))
    })
}

/// Every function declaration with its `tools[t].function_declarations[f]` path.
fn declarations<'a>(r: &RequestView<'a>) -> Vec<(String, &'a Value)> {
    let mut out = Vec::new();
    for (t, tool) in arr(r.gemini(), "tools").iter().enumerate() {
        for (f, decl) in arr(tool, "functionDeclarations").iter().enumerate() {
            out.push((format!("{}tools[{t}].function_declarations[{f}]", r.gemini_prefix()), decl));
        }
    }
    out
}

fn g_function_names(r: &RequestView) -> Option<String> {
    let ok = |name: &str| {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().count() <= 64
            && chars.all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
    };
    let (place, _) = declarations(r).into_iter().find(|(_, d)| !ok(text(d, "name").unwrap_or_default()))?;
    Some(format!(
        "* GenerateContentRequest.{place}.name: Invalid function name. Must start with a letter or an underscore. \
         Must be alphameric (a-z, A-Z, 0-9), underscores (_), dots (.), colons (:), or dashes (-), with a maximum \
         length of 64."
    ))
}

fn g_parameters_exclusive(r: &RequestView) -> Option<String> {
    let (place, _) = declarations(r)
        .into_iter()
        .find(|(_, d)| d.get("parameters").is_some() && d.get("parametersJsonSchema").is_some())?;
    Some(format!("* GenerateContentRequest.{place}: parameters and parameters_json_schema are mutually exclusive"))
}

/// The Gemini API's Schema object: the only members `parameters` (and its nested schemas) take.
const SCHEMA_FIELDS: [&str; 22] = [
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// The first member of `schema` (at `at`) outside the Schema object, with its path.
fn unknown_schema_member(schema: &Value, at: String) -> Option<(String, String)> {
    let object = schema.as_object()?;
    if let Some(key) = object.keys().find(|k| !SCHEMA_FIELDS.contains(&k.as_str())) {
        return Some((key.clone(), at));
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (n, prop) in props.values().enumerate() {
            if let Some(found) = unknown_schema_member(prop, format!("{at}.properties[{n}].value")) {
                return Some(found);
            }
        }
    }
    if let Some(found) = schema.get("items").and_then(|items| unknown_schema_member(items, format!("{at}.items"))) {
        return Some(found);
    }
    arr(schema, "anyOf").iter().enumerate().find_map(|(n, s)| unknown_schema_member(s, format!("{at}.any_of[{n}]")))
}

fn g_parameters_subset(r: &RequestView) -> Option<String> {
    declarations(r).into_iter().find_map(|(place, d)| {
        let (key, at) = unknown_schema_member(d.get("parameters")?, format!("{place}.parameters"))?;
        Some(format!("Invalid JSON payload received. Unknown name \"{key}\" at '{at}': Cannot find field."))
    })
}

// ---- Bedrock Converse -------------------------------------------------------------------------

fn b_first_user(r: &RequestView) -> Option<String> {
    (arr(r.body, "messages").first().map(role) != Some("user")).then(|| {
        "A conversation must start with a user message. Try again with a conversation that starts with a user \
         message."
            .into()
    })
}

fn b_roles(r: &RequestView) -> Option<String> {
    let (i, m) = arr(r.body, "messages").iter().enumerate().find(|(_, m)| !["user", "assistant"].contains(&role(m)))?;
    Some(format!(
        "1 validation error detected: Value '{}' at 'messages.{}.member.role' failed to satisfy constraint: Member \
         must satisfy enum value set: [user, assistant]",
        role(m),
        i + 1
    ))
}

fn b_alternate(r: &RequestView) -> Option<String> {
    arr(r.body, "messages").windows(2).any(|pair| role(&pair[0]) == role(&pair[1])).then(|| {
        "A conversation must alternate between user and assistant roles. Make sure the conversation alternates \
         between user and assistant roles and try again."
            .into()
    })
}

fn b_text(r: &RequestView) -> Option<String> {
    let blank = |b: &Value| text(b, "text").is_some_and(|t| t.trim().is_empty());
    if let Some(j) = arr(r.body, "system").iter().position(blank) {
        return Some(format!(
            "The text field in the SystemContentBlock object at system.{j} is blank. Add text to the text field, \
             and try again."
        ));
    }
    arr(r.body, "messages").iter().enumerate().find_map(|(i, m)| {
        let j = arr(m, "content").iter().position(blank)?;
        Some(format!(
            "The text field in the ContentBlock object at messages.{i}.content.{j} is blank. Add text to the text \
             field, and try again."
        ))
    })
}

fn b_ids<'a>(m: &'a Value, block: &str) -> Vec<&'a str> {
    arr(m, "content").iter().filter_map(|b| b.get(block)).map(|b| text(b, "toolUseId").unwrap_or_default()).collect()
}

fn b_tool_config(r: &RequestView) -> Option<String> {
    let uses_tools = arr(r.body, "messages")
        .iter()
        .any(|m| arr(m, "content").iter().any(|b| b.get("toolUse").is_some() || b.get("toolResult").is_some()));
    (uses_tools && r.body.get("toolConfig").is_none_or(Value::is_null))
        .then(|| "The toolConfig field must be defined when using toolUse and toolResult content blocks.".into())
}

fn b_results_match(r: &RequestView) -> Option<String> {
    let messages = arr(r.body, "messages");
    for (i, m) in messages.iter().enumerate() {
        let results = b_ids(m, "toolResult");
        let uses = match i.checked_sub(1) {
            Some(p) if role(&messages[p]) == "assistant" => b_ids(&messages[p], "toolUse"),
            _ => Vec::new(),
        };
        if results.len() > uses.len() {
            return Some(format!(
                "The number of toolResult blocks at messages.{i}.content exceeds the number of toolUse blocks of \
                 previous turn."
            ));
        }
        let missing: Vec<&str> = uses.into_iter().filter(|u| !results.contains(u)).collect();
        if !missing.is_empty() {
            return Some(format!(
                "Expected toolResult blocks at messages.{i}.content for the following Ids: {}",
                missing.join(", ")
            ));
        }
    }
    None
}

fn model_is(r: &RequestView, needle: &str) -> Option<bool> {
    r.model.as_deref().map(|m| m.contains(needle))
}

fn b_nova_tool_cache(r: &RequestView) -> Option<String> {
    let tools = r.body.get("toolConfig").map_or(&[][..], |c| arr(c, "tools"));
    (model_is(r, "amazon.nova")? && tools.iter().any(|t| t.get("cachePoint").is_some()))
        .then(|| "toolConfig.tools: cachePoint is not supported for Amazon Nova models.".into())
}

fn b_status_claude(r: &RequestView) -> Option<String> {
    let status = arr(r.body, "messages")
        .iter()
        .flat_map(|m| arr(m, "content"))
        .filter_map(|b| b.get("toolResult"))
        .any(|t| t.get("status").is_some());
    (status && !model_is(r, "anthropic.claude")?).then(|| {
        "This model doesn't support the toolResult.status field. Remove toolResult.status and try again.".into()
    })
}

#[cfg(test)]
mod tests;
