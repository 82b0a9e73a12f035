//! The five tools: their input schemas (written for a model to read) and their thin mapping
//! onto broca's ops. The adapter checks only what it needs to build a request (the argument
//! types, the `model` spelling, an absolute `project_root`); every rule about sessions and runs
//! is broca's, and its refusals come back as `isError` results carrying its body verbatim.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::broca::{Broca, Failure, SessionRef};
use crate::numbers::{stringify, u64_arg};
use crate::rpc::{Out, RpcError, TRANSPORT_ERROR};
use crate::wait::{self, Progress, Waited, DEFAULT_WAIT, MAX_WAIT};

/// The code of an argument the adapter cannot map (`detail.field` names it).
pub const INVALID_ARGUMENTS: &str = "invalid_arguments";

/// What one `tools/call` comes to.
pub enum Outcome {
    /// A `CallToolResult`.
    Result(Value),
    /// A JSON-RPC error (transport failures).
    Error(RpcError),
    /// Cancelled by the client: nothing is sent.
    Cancelled,
}

/// What a call needs besides its arguments.
pub struct Context<'a> {
    pub broca: &'a Broca,
    pub out: &'a Out,
    /// The harness every session is bound under (`--harness`).
    pub harness: &'a str,
    /// `project_root` when a call names none.
    pub default_root: &'a str,
    pub progress_token: Option<Value>,
    pub cancel: &'a AtomicBool,
    /// Whether results carry `structuredContent` (protocol 2025-06-18 and later).
    pub structured: bool,
}

fn session_props() -> Value {
    json!({
        "session": {
            "type": "string", "minLength": 1,
            "description": "The durable broca session (one conversation) to act on. Any name you choose; \
                            reuse it to continue the same conversation later."
        },
        "project_root": {
            "type": "string", "minLength": 1,
            "description": "Absolute path of the project directory the session belongs to. Together with \
                            `session` it identifies the conversation. Defaults to the directory broca-mcp \
                            was started in."
        }
    })
}

fn schema(mut props: Value, extra: Value, required: &[&str]) -> Value {
    if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

const NUMBERS_NOTE: &str = "Every integer in the result (ordinals, cursors, token counts, timestamps) is a \
                            decimal string; message objects are returned exactly as broca recorded them.";

/// The `tools/list` entries.
pub fn list() -> Value {
    let run_id = json!({"type": "string", "minLength": 1,
        "description": "The run to act on: the `run_id` broca_send returned. For a send answered `pending`, \
                        the run it will start is `run-` followed by its `submission_id`."});
    let u64_input = |what: &str| {
        json!({"type": ["integer", "string"], "pattern": "^[0-9]{1,20}$", "minimum": 0,
               "description": format!("{what} A non-negative integer, or its decimal string.")})
    };
    json!([
        {
            "name": "broca_send",
            "title": "Send a prompt to a broca session",
            "description": format!("Send a user prompt to a durable broca session. Returns broca's send reply: \
                `state` is `active` (a run started; `run_id` names it), `pending` (queued behind the running \
                run; `submission_id` names it) or `finished` (a retry of a send that already ran). Also \
                returns `send_id`, the idempotency key: when you omit it one is minted and reported, and \
                sending again with the same `send_id` and content never runs the prompt twice. Then call \
                broca_wait with the `run_id`. {NUMBERS_NOTE}"),
            "inputSchema": schema(session_props(), json!({
                "prompt": {"type": "string", "minLength": 1, "description": "The user message to send."},
                "model": {"type": "string", "pattern": "^[^/]+/.+$",
                    "description": "The model as `provider/model`, e.g. `anthropic/claude-sonnet-4-5`. Required \
                                    for a plain (queue) send; a steer or interrupt uses the session's model."},
                "variant": {"type": "string", "minLength": 1,
                    "description": "A reasoning variant the model defines (e.g. `high`); needs `model`."},
                "system": {"type": "string", "description": "A system prompt for this send."},
                "send_id": {"type": "string", "minLength": 1, "maxLength": 256,
                    "description": "Idempotency key. Reuse the `send_id` of an earlier attempt to retry it safely."},
                "delivery": {"type": "string", "enum": ["queue", "steer", "interrupt"], "default": "queue",
                    "description": "`queue`: run after the current run (one run per send). `steer`: join the \
                                    running run at its next step. `interrupt`: cancel the running run and start \
                                    this one first."},
                "title": {"type": "string", "minLength": 1, "maxLength": 200,
                    "description": "A short human-readable title for the session."}
            }), &["session", "prompt"]),
        },
        {
            "name": "broca_wait",
            "title": "Wait for a broca run",
            "description": format!("Wait until a run stops running, at most `timeout_ms`. Returns \
                `{{outcome: \"finished\", result}}` with broca's run.result (`state`, `reason`, `usage`, and \
                `final_message.text`, the run's final answer), `{{outcome: \"timed_out\", status}}` with the \
                current run.status when it is still running (call again to keep waiting), or \
                `{{outcome: \"not_running\", status}}` when it is paused, unknown or was retracted. With a \
                progress token the run's text streams as progress notifications while it runs; the result \
                holds the authoritative text. {NUMBERS_NOTE}"),
            "inputSchema": schema(session_props(), json!({
                "run_id": run_id,
                "timeout_ms": {"type": ["integer", "string"], "pattern": "^[0-9]{1,20}$", "minimum": 0,
                    "maximum": MAX_WAIT.as_millis() as u64, "default": DEFAULT_WAIT.as_millis() as u64,
                    "description": format!("How long to wait, in milliseconds (at most {}). 0 answers at once.",
                                           MAX_WAIT.as_millis())}
            }), &["session", "run_id"]),
        },
        {
            "name": "broca_read",
            "title": "Read a broca session's transcript",
            "description": format!("Read a page of the session's transcript (broca's session.read). Without \
                `from_ordinal` it returns the newest page. Each message has `ordinal`, `mid` and `message` \
                (role and content parts). `next_from_ordinal` is present when more messages follow the page; \
                to page backward, read from `max(1, first ordinal - limit)`. `head` is the snapshot's \
                cursor. {NUMBERS_NOTE}"),
            "inputSchema": schema(session_props(), json!({
                "from_ordinal": u64_input("The first message ordinal to return."),
                "limit": {"type": ["integer", "string"], "pattern": "^[0-9]{1,20}$", "minimum": 1,
                    "maximum": 1000, "default": 100,
                    "description": "Messages per page (1-1000; larger values are capped). A non-negative integer, \
                                    or its decimal string."}
            }), &["session"]),
        },
        {
            "name": "broca_status",
            "title": "A broca run's status",
            "description": format!("The status of a run (broca's run.status): `state` is `active`, `pending`, \
                `paused`, a finished run's reason (`completed`, `cancelled`, `error`, `interrupted`, \
                `max_steps`, `budget_exhausted`, …) or `unknown`, with `usage` and, while a model step is in \
                flight, `step`. Without `run_id` it answers for the session's latest run. {NUMBERS_NOTE}"),
            "inputSchema": schema(session_props(), json!({"run_id": run_id}), &["session"]),
        },
        {
            "name": "broca_cancel",
            "title": "Cancel a broca run",
            "description": "Cancel a running run (broca's run.cancel). Returns `{\"result\": \"ack\"}` when the run \
                was active and will end `cancelled`, or `{\"result\": \"not_active\"}` (nothing to cancel; a \
                queued send is not a run yet).",
            "inputSchema": schema(session_props(), json!({
                "run_id": run_id,
                "at": {"type": "string", "enum": ["now", "step_boundary"], "default": "now",
                    "description": "`now` stops the model stream at once; `step_boundary` lets the current model \
                                    step and its tool calls finish first."}
            }), &["session", "run_id"]),
        },
    ])
}

/// Whether `name` is one of [`list`]'s tools.
pub fn known(name: &str) -> bool {
    ["broca_send", "broca_wait", "broca_read", "broca_status", "broca_cancel"].contains(&name)
}

struct Args<'a> {
    map: &'a Map<String, Value>,
}

type Refusal = Value;

fn invalid(field: &str, message: impl Into<String>) -> Refusal {
    json!({"code": INVALID_ARGUMENTS, "message": message.into(), "detail": {"field": field}})
}

impl Args<'_> {
    fn check_members(&self, allowed: &[&str]) -> Result<(), Refusal> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(invalid(k, format!("{k}: unknown argument"))),
            None => Ok(()),
        }
    }

    fn string(&self, name: &str) -> Result<Option<&str>, Refusal> {
        match self.map.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid(name, format!("{name}: a string is required"))),
        }
    }

    fn required(&self, name: &str) -> Result<&str, Refusal> {
        match self.string(name)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(invalid(name, format!("{name}: a non-empty string is required"))),
        }
    }

    fn u64(&self, name: &str) -> Result<Option<u64>, Refusal> {
        u64_arg(self.map, name).map_err(|m| invalid(name, m))
    }

    fn session(&self, ctx: &Context<'_>) -> Result<SessionRef, Refusal> {
        let session = self.required("session")?.to_string();
        let project_root = match self.string("project_root")? {
            None => ctx.default_root.to_string(),
            Some(r) if r.starts_with('/') => r.to_string(),
            Some(_) => return Err(invalid("project_root", "project_root: an absolute path is required")),
        };
        Ok(SessionRef { project_root, harness: ctx.harness.to_string(), session })
    }
}

/// A successful result: the answer (an object, or wrapped as `{"result": …}`) as text and,
/// when negotiated, as `structuredContent`.
pub fn success(answer: Value, structured: bool) -> Value {
    let body = if answer.is_object() { answer } else { json!({"result": answer}) };
    tool_result(body, false, structured)
}

/// A refusal: the body verbatim, `isError: true`.
pub fn refusal(body: Value, structured: bool) -> Value {
    tool_result(body, true, structured)
}

fn tool_result(body: Value, is_error: bool, structured: bool) -> Value {
    let mut r = json!({"content": [{"type": "text", "text": body.to_string()}], "isError": is_error});
    if structured {
        r["structuredContent"] = body;
    }
    r
}

/// A transport failure as a JSON-RPC error; `send_id` is the key to retry a send with.
fn transport(message: String, sent: crate::broca::Sent, send_id: Option<&str>) -> RpcError {
    let mut data = json!({"sent": sent.as_str()});
    if let Some(id) = send_id {
        data["send_id"] = json!(id);
    }
    RpcError::new(TRANSPORT_ERROR, format!("broca did not answer: {message}")).with_data(data)
}

fn finish(ctx: &Context<'_>, answer: Result<Value, Failure>, send_id: Option<&str>) -> Outcome {
    match answer {
        Ok(v) => Outcome::Result(success(stringify(v), ctx.structured)),
        Err(Failure::Refused(body)) => Outcome::Result(refusal(json!(body), ctx.structured)),
        Err(Failure::Transport { message, sent }) => Outcome::Error(transport(message, sent, send_id)),
    }
}

/// Runs tool `name` (one of [`known`]).
pub fn call(name: &str, args: &Map<String, Value>, ctx: &Context<'_>) -> Outcome {
    let args = Args { map: args };
    let run = match name {
        "broca_send" => send(&args, ctx),
        "broca_wait" => return wait_for(&args, ctx).unwrap_or_else(|r| Outcome::Result(refusal(r, ctx.structured))),
        "broca_read" => read(&args, ctx),
        "broca_status" => status(&args, ctx),
        _ => cancel(&args, ctx),
    };
    run.unwrap_or_else(|r| Outcome::Result(refusal(r, ctx.structured)))
}

fn send(args: &Args<'_>, ctx: &Context<'_>) -> Result<Outcome, Refusal> {
    args.check_members(&[
        "session",
        "project_root",
        "prompt",
        "model",
        "variant",
        "system",
        "send_id",
        "delivery",
        "title",
    ])?;
    let key = args.session(ctx)?;
    let mut params = json!({"prompt": args.required("prompt")?});
    let model = args.string("model")?;
    let variant = args.string("variant")?;
    match (model, variant) {
        (Some(m), v) => {
            let Some((provider, model)) = m.split_once('/').filter(|(p, m)| !p.is_empty() && !m.is_empty()) else {
                return Err(invalid(
                    "model",
                    "model: `provider/model` is required, e.g. `anthropic/claude-sonnet-4-5`",
                ));
            };
            params["model"] = json!({"provider": provider, "model": model});
            if let Some(v) = v {
                params["model"]["variant"] = json!(v);
            }
        }
        (None, Some(_)) => return Err(invalid("variant", "variant: needs `model`")),
        (None, None) => {}
    }
    for field in ["system", "delivery", "title"] {
        if let Some(v) = args.string(field)? {
            params[field] = json!(v);
        }
    }
    let (send_id, minted) = match args.string("send_id")? {
        Some(id) => (id.to_string(), false),
        None => (format!("mcp-{}", uuid::Uuid::new_v4()), true),
    };
    params["send_id"] = json!(send_id);
    let answer = ctx.broca.call(&key, "session.send", params).map(|reply| {
        let mut out = json!({"send_id": send_id, "send_id_minted": minted});
        if let (Some(o), Some(r)) = (out.as_object_mut(), reply.as_object()) {
            o.extend(r.clone());
        } else {
            out["reply"] = reply;
        }
        out
    });
    Ok(finish(ctx, answer, Some(&send_id)))
}

fn wait_for(args: &Args<'_>, ctx: &Context<'_>) -> Result<Outcome, Refusal> {
    args.check_members(&["session", "project_root", "run_id", "timeout_ms"])?;
    let key = args.session(ctx)?;
    let run_id = args.required("run_id")?;
    let timeout = match args.u64("timeout_ms")? {
        None => DEFAULT_WAIT,
        Some(ms) if ms <= MAX_WAIT.as_millis() as u64 => Duration::from_millis(ms),
        Some(_) => return Err(invalid("timeout_ms", format!("timeout_ms: at most {}", MAX_WAIT.as_millis()))),
    };
    let mut progress = ctx.progress_token.clone().map(|t| Progress::new(ctx.out, t));
    let waited = wait::wait(ctx.broca, &key, run_id, timeout, progress.as_mut(), ctx.cancel);
    Ok(match waited {
        Ok(Waited::Cancelled) => Outcome::Cancelled,
        Ok(Waited::Answer(v)) => finish(ctx, Ok(v), None),
        Err(e) => finish(ctx, Err(e), None),
    })
}

fn read(args: &Args<'_>, ctx: &Context<'_>) -> Result<Outcome, Refusal> {
    args.check_members(&["session", "project_root", "from_ordinal", "limit"])?;
    let key = args.session(ctx)?;
    let mut params = json!({});
    for field in ["from_ordinal", "limit"] {
        if let Some(n) = args.u64(field)? {
            params[field] = json!(n);
        }
    }
    Ok(finish(ctx, ctx.broca.call(&key, "session.read", params), None))
}

fn status(args: &Args<'_>, ctx: &Context<'_>) -> Result<Outcome, Refusal> {
    args.check_members(&["session", "project_root", "run_id"])?;
    let key = args.session(ctx)?;
    let mut params = json!({});
    if let Some(run_id) = args.string("run_id")? {
        params["run_id"] = json!(run_id);
    }
    Ok(finish(ctx, ctx.broca.call(&key, "run.status", params), None))
}

fn cancel(args: &Args<'_>, ctx: &Context<'_>) -> Result<Outcome, Refusal> {
    args.check_members(&["session", "project_root", "run_id", "at"])?;
    let key = args.session(ctx)?;
    let mut params = json!({"run_id": args.required("run_id")?});
    if let Some(at) = args.string("at")? {
        params["at"] = json!(at);
    }
    Ok(finish(ctx, ctx.broca.call(&key, "run.cancel", params), None))
}
