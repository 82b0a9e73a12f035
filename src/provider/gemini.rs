//! Google Gemini (`google.generate_content`): `POST {api}/models/{model}:streamGenerateContent
//! ?alt=sse`, authenticated with the API key in `x-goog-api-key`. Request rendering and the
//! stream decoder.
//!
//! # Request
//!
//! `{contents, systemInstruction?, tools?, generationConfig?}`:
//! - the route's system prompt → `systemInstruction: {parts: [{text}]}`;
//! - user (and system-role) messages → `{role: "user", parts: [{text} | {inlineData: {mimeType,
//!   data}}]}`;
//! - assistant → `{role: "model", parts}`: text → `{text}`; a tool call → `{functionCall: {name,
//!   args}}` (its id as `functionCall.id` when the call had one from Gemini); reasoning text is
//!   not sent back (Gemini ignores thought summaries on input), but a reasoning part's signature
//!   rides on the next part as `thoughtSignature`, where Gemini put it (the part after the
//!   signature, or an empty text part when none follows). A signature minted by another
//!   provider is never sent;
//! - a tool-role message → `{role: "user", parts: [{functionResponse: {name, response}}]}`, one
//!   part per result, the name taken from the call it answers; `response` is `{output}` (the
//!   result's text) or `{error}` for an error result;
//! - tools → `[{functionDeclarations: [{name, description?, parametersJsonSchema}]}]` (the
//!   caller's JSON Schema whole, less a top-level `$schema`; see [`tool`]);
//! - the output cap → `generationConfig.maxOutputTokens`; a variant's `thinkingConfig` is merged
//!   into `generationConfig` (`render_variant` renders `{generationConfig: {thinkingConfig}}`).
//!
//! # Stream
//!
//! `data:`-only events, each a whole `GenerateContentResponse`: `candidates[0].content.parts`
//! (each part one of `text`, `text` with `thought: true` (a thought summary), `functionCall
//! {name, args, id?}` whole in one part, with an optional `thoughtSignature` on any part),
//! `candidates[0].finishReason` on the last chunk, and `usageMetadata` (cumulative, usually on
//! every chunk). There is no terminal sentinel: the chunk carrying a `finishReason` ends the
//! answer. An `{"error": {code, message, status}}` event is an in-stream error. A blocked prompt
//! is one chunk with `promptFeedback.blockReason` and no candidates: a `content_filter` finish.
//!
//! Usage: `promptTokenCount` includes `cachedContentTokenCount` (implicit caching); fresh input
//! is the difference, plus `toolUsePromptTokenCount` (the tool-use prompt, e.g. search results
//! fed back to the model, counted apart: `totalTokenCount` is prompt + tool-use prompt +
//! candidates + thoughts). `candidatesTokenCount` excludes `thoughtsTokenCount`; output is their
//! sum, reasoning the thoughts.
//!
//! Finish reasons by the role's own table (llm-runner §6.6): `STOP` → stop (tool_calls when the
//! answer called a tool), `MAX_TOKENS` → length, the safety family → content_filter,
//! `MALFORMED_FUNCTION_CALL` and the other malformed-output reasons → error, anything else →
//! other.

use crate::frozen::{ToolChoice, ToolChoiceMode};

use serde_json::{json, Value};

use super::common::{class, data_object, replays_reasoning, str_at, tool_output, u64_at, with_description};
use super::config::{RenderConfig, ToolSpec};
use super::errors::stream_error_with_status;
use super::event::{DecodeError, EventClass, StreamDecoder, StreamEvent};
use super::render_context::RenderContext;
use super::sse::SseEvent;
use crate::message::{Message, Part, Role, StepUsage};

/// The request path after the base URL for `wire_model` (the model id is part of the path).
pub fn path(wire_model: &str) -> String {
    format!("/models/{wire_model}:streamGenerateContent?alt=sse")
}

/// One transcript message's element of `contents` (none when it has no part): the message,
/// the config and, for a tool result, the name of the call it answers (`context`).
pub(crate) fn render_message(config: &RenderConfig, context: &RenderContext, m: &Message) -> Vec<Value> {
    content(m, config, context).into_iter().collect()
}

/// The request body around the transcript's rendered `contents`.
pub(crate) fn body_around(config: &RenderConfig, _context: &RenderContext, contents: Vec<Value>) -> Value {
    let mut body = json!({"contents": contents});
    if let Some(system) = config.system.as_deref().filter(|s| !s.is_empty()) {
        body["systemInstruction"] = json!({"parts": [{"text": system}]});
    }
    if !config.tools.is_empty() {
        body["tools"] = json!([{"functionDeclarations": config.tools.iter().map(tool).collect::<Vec<_>>()}]);
        if let Some(choice) = &config.tool_choice {
            body["toolConfig"] = json!({"functionCallingConfig": match choice {
                ToolChoice::Mode(ToolChoiceMode::Auto) => json!({"mode": "AUTO"}),
                ToolChoice::Mode(ToolChoiceMode::None) => json!({"mode": "NONE"}),
                ToolChoice::Mode(ToolChoiceMode::Required) => json!({"mode": "ANY"}),
                ToolChoice::Named { tool } => json!({"mode": "ANY", "allowedFunctionNames": [tool]}),
            }});
        }
    }
    if let Some(cap) = config.max_output_tokens {
        body["generationConfig"] = json!({"maxOutputTokens": cap});
    }
    body
}

/// The Code Assist path after the backend's base URL.
pub const CODE_ASSIST_PATH: &str = "/v1internal:streamGenerateContent?alt=sse";

/// Code Assist's body: the Gemini request in its envelope, `{model: <backend tier id>, project,
/// user_prompt_id, userAgent: "antigravity", request: {…, session_id}}` (gemini-cli
/// `converter.ts` `toGenerateContentRequest`; the project and ids are the loop's,
/// `provider::code_assist`, absent only where no run set them, e.g. a request golden). No
/// per-attempt `requestId`: the bytes of a step stay the same across its retries.
pub(crate) fn code_assist_body_around(config: &RenderConfig, context: &RenderContext, contents: Vec<Value>) -> Value {
    let mut request = body_around(config, context, contents);
    let mut envelope = json!({"model": config.wire_model});
    if let Some(ids) = &config.code_assist {
        envelope["project"] = json!(ids.project);
        envelope["user_prompt_id"] = json!(ids.user_prompt_id);
        request["session_id"] = json!(ids.session_id);
    }
    envelope["userAgent"] = json!("antigravity");
    envelope["request"] = request;
    envelope
}

/// [`merge_variant`] inside Code Assist's envelope.
pub fn code_assist_merge_variant(envelope: &mut Value, config: &RenderConfig) {
    if let Some(request) = envelope.get_mut("request") {
        merge_variant(request, config);
    }
}

/// Merges a variant's `{generationConfig: {thinkingConfig}}` into the body's own
/// `generationConfig` (the output cap stays beside it), then the rest of the variant on top.
pub fn merge_variant(body: &mut Value, config: &RenderConfig) {
    let Value::Object(extra) = &config.variant_params else { return };
    for (k, v) in extra {
        match (k.as_str(), body.get_mut(k.as_str()), v) {
            ("generationConfig", Some(Value::Object(own)), Value::Object(more)) => {
                own.extend(more.iter().map(|(k, v)| (k.clone(), v.clone())))
            }
            _ => body[k.as_str()] = v.clone(),
        }
    }
}

/// A function declaration. The caller's JSON Schema goes in `parametersJsonSchema`, which takes
/// JSON Schema as it is (`additionalProperties`, `const`, `$ref`/`$defs`, `default`, …); the
/// older `parameters` takes only Google's OpenAPI-subset `Schema` and refuses those members 400
/// ("Unknown name …"), which typical MCP tool schemas carry (#46; Gemini API reference,
/// `FunctionDeclaration`: the two are mutually exclusive). Converting to the subset would drop
/// constraints silently; sending the schema whole loses nothing. Only the top-level `$schema`
/// (a dialect marker, not a constraint) is left out.
fn tool(spec: &ToolSpec) -> Value {
    let mut schema = spec.input_schema.clone();
    if let Value::Object(members) = &mut schema {
        members.remove("$schema");
    }
    with_description(json!({"name": spec.name, "parametersJsonSchema": schema}), spec)
}

fn content(m: &Message, config: &RenderConfig, context: &RenderContext) -> Option<Value> {
    let (role, parts) = match m.role {
        Role::User | Role::System => ("user", user_parts(m)),
        Role::Assistant => ("model", model_parts(m, replays_reasoning(m, config))),
        Role::Tool => ("user", m.content.iter().filter_map(|p| function_response(p, context)).collect()),
    };
    (!parts.is_empty()).then(|| json!({"role": role, "parts": parts}))
}

fn user_parts(m: &Message) -> Vec<Value> {
    m.content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.is_empty() => Some(json!({"text": text})),
            Part::Image { media_type, data } => Some(json!({"inlineData": {"mimeType": media_type, "data": data}})),
            _ => None,
        })
        .collect()
}

/// The model's parts, each reasoning signature riding on the part after it.
fn model_parts(m: &Message, replay: bool) -> Vec<Value> {
    let mut parts = Vec::new();
    let mut signature: Option<&str> = None;
    for p in &m.content {
        let mut part = match p {
            Part::Reasoning { signature: Some(s), .. } if replay => {
                signature = Some(s);
                continue;
            }
            Part::Text { text } if !text.is_empty() => json!({"text": text}),
            Part::ToolCall { tool_call_id, tool_name, input } => {
                let args = if input.is_object() { input.clone() } else { json!({}) };
                let mut call = json!({"name": tool_name, "args": args});
                if let Some(id) = tool_call_id.strip_prefix(GEMINI_ID_PREFIX) {
                    call["id"] = json!(id);
                }
                json!({"functionCall": call})
            }
            _ => continue,
        };
        if let Some(s) = signature.take() {
            part["thoughtSignature"] = json!(s);
        }
        parts.push(part);
    }
    if let Some(s) = signature {
        parts.push(json!({"text": "", "thoughtSignature": s}));
    }
    parts
}

/// A tool result as a `functionResponse`, named as the transcript's last call of its id (the
/// id itself when there is none).
fn function_response(p: &Part, context: &RenderContext) -> Option<Value> {
    let Part::ToolResult { tool_call_id, output, is_error } = p else { return None };
    let name = context.tool_name(tool_call_id).unwrap_or(tool_call_id.as_str());
    let (text, is_error) = tool_output(output, *is_error);
    let response = if is_error { json!({"error": text}) } else { json!({"output": text}) };
    let mut answer = json!({"name": name, "response": response});
    if let Some(id) = tool_call_id.strip_prefix(GEMINI_ID_PREFIX) {
        answer["id"] = json!(id);
    }
    Some(json!({"functionResponse": answer}))
}

/// A tool call id Gemini gave (`functionCall.id`) is kept as `gemini:<id>` and sent back; a
/// call without one gets an id broca mints from the response's `responseId` and the call's
/// position (a fresh random one when the response has no id), never sent.
const GEMINI_ID_PREFIX: &str = "gemini:";

/// The finish reason normalized by the role's table for `google.generate_content`;
/// `called`: the answer called a tool.
pub fn normalize_finish_reason(raw: &str, called: bool) -> String {
    super::common::role_finish("google.generate_content", raw, called)
}

fn usage(u: &Value) -> StepUsage {
    // The tool-use prompt is input the model read (`testdata/real-streams/google_generate_content/
    // g07`: 772 total = 17 prompt + 102 tool-use prompt + 241 candidates + 412 thoughts).
    let prompt = match (u64_at(u, &["promptTokenCount"]), u64_at(u, &["toolUsePromptTokenCount"])) {
        (None, None) => None,
        (p, t) => Some(p.unwrap_or(0).saturating_add(t.unwrap_or(0))),
    };
    let cached = u64_at(u, &["cachedContentTokenCount"]);
    let candidates = u64_at(u, &["candidatesTokenCount"]);
    let thoughts = u64_at(u, &["thoughtsTokenCount"]);
    let output = match (candidates, thoughts) {
        (None, None) => None,
        (c, t) => Some(c.unwrap_or(0).saturating_add(t.unwrap_or(0))),
    };
    StepUsage {
        input_tokens: prompt.map(|p| p.saturating_sub(cached.unwrap_or(0))),
        cached_input_tokens: cached,
        cache_write_tokens: None,
        output_tokens: output,
        reasoning_tokens: thoughts,
    }
}

/// Decodes a `streamGenerateContent` SSE stream.
///
/// Invariants: a `ToolCallStart` index counts this answer's function calls in order; each call
/// is whole (its arguments in one delta); `finished` is set by the first chunk with a
/// `finishReason`, and the `Finish` event is emitted once, after that chunk's parts and usage.
#[derive(Default)]
pub struct GeminiDecoder {
    calls: usize,
    finished: bool,
    /// The response's `responseId` (mints the ids of calls Gemini gave none).
    response_id: Option<String>,
}

impl GeminiDecoder {
    pub fn new() -> GeminiDecoder {
        GeminiDecoder::default()
    }

    /// One part's events; returns whether it was content.
    fn part(&mut self, part: &Value, out: &mut Vec<StreamEvent>) -> bool {
        let mut content = false;
        if let Some(signature) = str_at(part, &["thoughtSignature"]).filter(|s| !s.is_empty()) {
            out.push(StreamEvent::ReasoningSignature { signature: signature.to_owned() });
        }
        if let Some(call) = part.get("functionCall") {
            let name = str_at(call, &["name"]).unwrap_or_default().to_owned();
            let id = match str_at(call, &["id"]).filter(|s| !s.is_empty()) {
                Some(id) => format!("{GEMINI_ID_PREFIX}{id}"),
                None => match &self.response_id {
                    Some(response) => format!("call_{response}_{}", self.calls),
                    None => format!("call_{}", uuid::Uuid::new_v4().simple()),
                },
            };
            let args = call.get("args").cloned().unwrap_or_else(|| json!({}));
            let index = self.calls;
            self.calls += 1;
            out.push(StreamEvent::ToolCallStart { index, id, name });
            out.push(StreamEvent::ToolCallArgsDelta { index, delta: args.to_string() });
            content = true;
        }
        if let Some(text) = str_at(part, &["text"]).filter(|t| !t.is_empty()) {
            let thought = part.get("thought").and_then(Value::as_bool) == Some(true);
            out.push(if thought {
                StreamEvent::ReasoningDelta { text: text.to_owned() }
            } else {
                StreamEvent::TextDelta { text: text.to_owned() }
            });
            content = true;
        }
        content
    }
}

impl StreamDecoder for GeminiDecoder {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<EventClass, DecodeError> {
        let data = data_object(event)?;
        Ok(self.response(&data, out))
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

/// Decodes Code Assist's stream: each event `{response: <GenerateContentResponse>, traceId?}`
/// (an error document arrives unwrapped), read as Gemini reads the inner response.
#[derive(Default)]
pub struct CodeAssistDecoder(GeminiDecoder);

impl StreamDecoder for CodeAssistDecoder {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<EventClass, DecodeError> {
        let data = data_object(event)?;
        match data.get("response") {
            Some(response) => Ok(self.0.response(response, out)),
            None => Ok(self.0.response(&data, out)),
        }
    }

    fn finished(&self) -> bool {
        self.0.finished
    }
}

impl GeminiDecoder {
    /// One `GenerateContentResponse` (or error document).
    fn response(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> EventClass {
        if let Some(error) = data.get("error") {
            // `status` names the error; `code` is its HTTP status, which classifies a status the
            // names do not (FAILED_PRECONDITION is a 400: permanent).
            let status = str_at(error, &["status"]);
            let http = u64_at(error, &["code"]);
            out.push(stream_error_with_status(status, None, http, str_at(error, &["message"])));
            self.finished = true;
            return class("error", false, false);
        }
        if self.response_id.is_none() {
            self.response_id = str_at(data, &["responseId"]).filter(|id| !id.is_empty()).map(String::from);
        }
        let candidate = data.get("candidates").and_then(|c| c.get(0));
        // A blocked prompt is one chunk with `promptFeedback.blockReason` and no candidates: a
        // content-filter finish, never a truncated stream to retry (#46; Gemini API reference,
        // `GenerateContentResponse.promptFeedback`).
        if let (None, Some(raw)) = (candidate, str_at(data, &["promptFeedback", "blockReason"])) {
            if let Some(u) = data.get("usageMetadata") {
                out.push(StreamEvent::Usage { usage: usage(u) });
            }
            if !self.finished {
                self.finished = true;
                out.push(StreamEvent::Finish { reason: "content_filter".into(), raw: raw.into() });
            }
            return class("prompt_blocked", false, false);
        }
        let mut content = false;
        if let Some(parts) = candidate.and_then(|c| c.pointer("/content/parts")).and_then(Value::as_array) {
            for part in parts {
                content |= self.part(part, out);
            }
        }
        if let Some(u) = data.get("usageMetadata") {
            out.push(StreamEvent::Usage { usage: usage(u) });
        }
        let known = candidate.is_some() || data.get("usageMetadata").is_some();
        match candidate.and_then(|c| str_at(c, &["finishReason"])) {
            Some(raw) if !self.finished => {
                self.finished = true;
                let reason = normalize_finish_reason(raw, self.calls > 0);
                out.push(StreamEvent::Finish { reason, raw: raw.into() });
            }
            _ => {}
        }
        class("generate_content_response", content, !known)
    }
}
