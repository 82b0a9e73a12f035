//! `session.send`, plain queue delivery (spec §10, §11): resolve the model before any write,
//! then one actor job: on an idle session the send is queued and consumed by its `RunStarted`
//! in one barrier (`{state: "active", run_id}`); behind a running turn it is durably queued
//! (`{state: "pending", submission_id}`) and the actor starts it when the FIFO reaches it.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{invalid_params, note_unread, Ops, Reply, ReplyOnce};
use crate::agent;
use crate::catalog::route::{self, ModelRequest, RouteOverrides};
use crate::lineage::replay::Resolution;
use crate::message::Message;
use crate::provider::client::now_ms;
use crate::provider::config::AuthSource;
use crate::record::{Record, RequestIdentity};
use crate::session_key::SessionKey;
use crate::wire::Refusal;

const READ: &[&str] = &["session", "prompt", "send_id", "model", "system", "stop_when", "title"];

struct Send {
    prompt: String,
    send_id: Option<String>,
    model: ModelRequest,
    title: Option<String>,
}

fn parse(params: &Value, key: &SessionKey) -> Result<Send, Refusal> {
    let obj = params.as_object().ok_or_else(|| invalid_params("params", "must be an object"))?;
    for k in obj.keys().filter(|k| !READ.contains(&k.as_str())) {
        note_unread(k, &key.harness);
    }
    if let Some(s) = obj.get("session") {
        if s.as_str() != Some(key.session.as_str()) {
            return Err(invalid_params("session", "does not match the route's bound session"));
        }
    }
    let prompt = match obj.get("prompt") {
        Some(Value::String(p)) if !p.trim().is_empty() => p.clone(),
        _ => return Err(invalid_params("prompt", "a non-empty string is required")),
    };
    let model = obj.get("model").ok_or_else(|| invalid_params("model", "required"))?;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(String::from);
    let (Some(provider), Some(name)) = (text(model, "provider"), text(model, "model")) else {
        return Err(invalid_params("model", "needs provider and model"));
    };
    if let Some(map) = model.as_object() {
        for k in map.keys().filter(|k| !["provider", "model", "variant"].contains(&k.as_str())) {
            note_unread(&format!("model.{k}"), &key.harness);
        }
    }
    let max_steps = match params.pointer("/stop_when/max_steps") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Some(n),
            _ => return Err(invalid_params("stop_when.max_steps", "a positive integer is required")),
        },
    };
    let title = match obj.get("title") {
        None => None,
        Some(Value::String(t)) if valid_title(t) => Some(t.clone()),
        Some(_) => return Err(invalid_params("title", "1-200 characters, not blank, no control characters")),
    };
    Ok(Send {
        prompt,
        send_id: text(params, "send_id"),
        model: ModelRequest {
            model: format!("{provider}/{name}"),
            variant: text(model, "variant"),
            system: text(params, "system"),
            max_output_tokens: None,
            max_steps,
            tools: Vec::new(),
        },
        title,
    })
}

fn valid_title(t: &str) -> bool {
    let n = t.chars().count();
    (1..=200).contains(&n) && !t.trim().is_empty() && !t.chars().any(char::is_control)
}

pub(super) fn session_send(ops: &Arc<Ops>, key: &SessionKey, params: Value, reply: Reply) {
    let send = match parse(&params, key) {
        Ok(s) => s,
        Err(r) => return reply(Err(r)),
    };
    if ops.registry.is_sealing() {
        let detail = Some(crate::detail!("class" => "transient"));
        return reply(Err(Refusal::new("module_reloading", "broca is shutting down; send again shortly", detail)));
    }
    let overrides = RouteOverrides { base_url_override: ops.base_url_override.clone(), auth: AuthSource::None };
    let config = {
        let catalog = ops.catalog.read();
        route::resolve(catalog.as_ref(), ops.lkg_path(), &send.model, &overrides)
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => return reply(Err(e.refusal())),
    };
    let submission_id = format!("sub-{}", uuid::Uuid::new_v4().simple());
    let request = RequestIdentity {
        send_id: send.send_id,
        principal: None,
        harness: Some(key.harness.clone()),
        received_at_ms: now_ms(),
        config: serde_json::to_value(&config).expect("configs serialize"),
    };
    let message = Message::user_text(send.prompt);
    let title = send.title;
    let reply = ReplyOnce::new(reply);
    let answer = Arc::clone(&reply);
    let job = Box::new(move |lineage: &mut crate::lineage::Lineage| {
        let idle = matches!(lineage.state().resolution(), Resolution::Empty | Resolution::Idle { .. })
            && lineage.state().queue.is_empty();
        let queued = Record::Queued { submission_id: submission_id.clone(), message: message.clone(), request };
        let result = (|| {
            lineage.append(&queued)?;
            if !idle {
                return Ok((json!({"state": "pending", "submission_id": submission_id}), lineage.commit()?));
            }
            // Queued and consumed in one barrier: durable before the reply says "active".
            let run_id = format!("run-{submission_id}");
            let units = agent::admit(lineage, &run_id, Some(&submission_id), &config, message, title)?;
            Ok((json!({"state": "active", "run_id": run_id, "submission_id": submission_id}), units))
        })();
        match result {
            Ok((body, units)) => {
                answer.answer(Ok(body));
                units
            }
            Err(e) => {
                let e: crate::lineage::LineageError = e;
                answer.answer(Err(e.refusal()));
                Vec::new()
            }
        }
    });
    if let Err(e) = ops.registry.submit(key, job) {
        reply.answer(Err(e.refusal()));
    }
}
