//! The control endpoint under `/_mock/` (routes documented in [`mock`](super)). Control
//! requests are not recorded and do not touch any lane's FIFO except as asked.

use serde_json::json;

use super::http::{Reply, Request};
use super::script::Script;
use super::Shared;

/// Answers one control request.
pub(crate) fn handle(shared: &Shared, request: &Request) -> Reply {
    let rest = request.path().strip_prefix("/_mock/").unwrap_or_default();
    let parts: Vec<&str> = rest.split('/').collect();
    match (request.method.as_str(), parts.as_slice()) {
        ("GET", ["health"]) => Reply::json(200, &json!({"ok": true})),
        ("GET", ["connections"]) => {
            let c = shared.connections_counted();
            Reply::json(200, &json!({"accepts": c.accepts, "tls_full": c.tls_full, "tls_resumed": c.tls_resumed}))
        }
        ("POST", ["lanes", lane, "script"]) if !lane.is_empty() => {
            match serde_json::from_slice::<Script>(&request.body) {
                Ok(script) => {
                    log::debug!("lane {lane}: {} scripted responses appended", script.responses.len());
                    shared.lanes.install(lane, script);
                    Reply::empty(204)
                }
                Err(e) => Reply::refusal(400, &format!("invalid script: {e}")),
            }
        }
        ("GET", ["lanes", lane, "requests"]) if !lane.is_empty() => {
            let requests = shared.lanes.requests(lane);
            let mut reply = Reply::json(200, &serde_json::to_value(&requests).expect("requests serialize"));
            reply.headers.push(("X-Mock-Dropped-Requests".into(), shared.lanes.dropped(lane).to_string()));
            reply
        }
        ("GET", ["lanes", lane]) if !lane.is_empty() => Reply::json(
            200,
            &json!({
                "pending": shared.lanes.pending(lane),
                "recorded": shared.lanes.recorded(lane),
                "dropped": shared.lanes.dropped(lane),
            }),
        ),
        ("DELETE", ["lanes", lane]) if !lane.is_empty() => {
            shared.lanes.reset(lane);
            Reply::empty(204)
        }
        (_, ["classify", rest @ ..]) => super::classify::control(&shared.classify, request, rest),
        (_, ["health"] | ["connections"] | ["lanes", _, "script" | "requests"] | ["lanes", _]) => {
            Reply::refusal(405, "method not allowed on this control route")
        }
        _ => Reply::refusal(404, "no such control route"),
    }
}
