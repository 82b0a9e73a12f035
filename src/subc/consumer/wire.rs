//! The channel-0 bodies the consumer connection speaks, typed (the shapes of `subc-control`
//! 0.34.1 `ClientControlRequest::RouteOpen`, `ClientControlResponse::RouteOpen` and
//! `ClientControlPush`; `subc-wire.md` §12.3), and the one field of a reverse request it reads.
//!
//! The `route.open` reply carries only the route's `(channel, epoch)`: no credit window. The
//! window follows from the target's declared `concurrency` (1, 32 or 1024; `subc-wire.md` §7),
//! which only the catalog reports.

use serde::{Deserialize, Serialize};
use subc_protocol::{BindIdentity, RouteTarget};

use super::ConsumerIdentity;

/// The `route.open` request.
#[derive(Debug, Serialize)]
pub struct RouteOpen<'a> {
    pub op: &'static str,
    pub target: &'a RouteTarget,
    pub identity: &'a BindIdentity,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer_identity: Option<&'a ConsumerIdentity>,
    /// What this consumer reads on the route (`tool-result/v1`, `held-reply/v1`); omitted
    /// when it declares nothing.
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    pub consumer_capabilities: &'a [&'a str],
}

impl<'a> RouteOpen<'a> {
    pub fn new(
        target: &'a RouteTarget,
        identity: &'a BindIdentity,
        consumer_identity: Option<&'a ConsumerIdentity>,
    ) -> RouteOpen<'a> {
        RouteOpen { op: "route.open", target, identity, consumer_identity, consumer_capabilities: &[] }
    }

    /// The request declaring `capabilities` on the bind.
    pub fn declaring(mut self, capabilities: &'a [&'a str]) -> RouteOpen<'a> {
        self.consumer_capabilities = capabilities;
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings and string maps always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The request with the legacy opener field `identity.project_root`, which daemon 0.39
    /// still accepts during the migration to stamped scopes (`subc-wire.md` §12.1): it
    /// canonicalizes the path and binds the target with it.
    pub fn to_bytes_rooted(&self, project_root: &str) -> Vec<u8> {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(identity) = value.get_mut("identity").and_then(serde_json::Value::as_object_mut) {
            identity.insert("project_root".into(), project_root.into());
        }
        serde_json::to_vec(&value).unwrap_or_default()
    }
}

/// The `route.open` reply: the route in this connection's numbering.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct RouteOpened {
    pub route_channel: u16,
    pub route_epoch: u32,
}

/// A daemon push on channel 0 this connection acts on. Any other push fails to decode and is
/// ignored.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "op")]
pub enum ControlPush {
    /// The module's routes on `channels` are draining: take no new calls on them.
    #[serde(rename = "route.closing")]
    RouteClosing {
        module_id: String,
        #[serde(default)]
        channels: Vec<u16>,
        #[serde(default)]
        reason: Option<String>,
    },
    /// The module's routes on `channels` are gone; calls still open on them get no terminal.
    #[serde(rename = "route.closed")]
    RouteClosed {
        module_id: String,
        #[serde(default)]
        channels: Vec<u16>,
        #[serde(default)]
        reason: Option<String>,
    },
}

/// The part of a module's reverse request the refusal names: the JSON-RPC method's family.
#[derive(Debug, Default, Deserialize)]
struct ReverseRequest {
    #[serde(default)]
    method: Option<String>,
}

/// The method family (the part before `/`) of a reverse request body; empty when it has none.
pub fn reverse_family(body: &[u8]) -> String {
    let method = serde_json::from_slice::<ReverseRequest>(body).unwrap_or_default().method.unwrap_or_default();
    method.split('/').next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_open_has_the_control_shape_and_omits_an_absent_claim() {
        let target = RouteTarget::ToolProvider { module_id: "tools".into() };
        let identity = BindIdentity::new("h", "s");
        let bare: serde_json::Value =
            serde_json::from_slice(&RouteOpen::new(&target, &identity, None).to_bytes()).unwrap();
        assert_eq!(
            bare,
            serde_json::json!({"op": "route.open", "target": {"kind": "tool_provider", "module_id": "tools"},
                               "identity": {"harness": "h", "session": "s"}})
        );
        let me = ConsumerIdentity { module_id: "broca".into(), launch_nonce: "n".into() };
        let claimed: serde_json::Value =
            serde_json::from_slice(&RouteOpen::new(&target, &identity, Some(&me)).to_bytes()).unwrap();
        assert_eq!(claimed["consumer_identity"], serde_json::json!({"module_id": "broca", "launch_nonce": "n"}));
    }

    #[test]
    fn a_rooted_route_open_adds_the_legacy_project_root_to_the_identity() {
        let target = RouteTarget::ManagementSurface { module_id: "broca".into() };
        let identity = BindIdentity::new("h", "s");
        let rooted: serde_json::Value =
            serde_json::from_slice(&RouteOpen::new(&target, &identity, None).to_bytes_rooted("/p")).unwrap();
        assert_eq!(
            rooted,
            serde_json::json!({"op": "route.open", "target": {"kind": "management_surface", "module_id": "broca"},
                               "identity": {"harness": "h", "session": "s", "project_root": "/p"}})
        );
    }

    #[test]
    fn replies_and_pushes_decode_and_unknown_pushes_do_not() {
        let opened: RouteOpened =
            serde_json::from_str(r#"{"op":"route.open","route_channel":3,"route_epoch":9}"#).unwrap();
        assert_eq!(opened, RouteOpened { route_channel: 3, route_epoch: 9 });
        let closed: ControlPush = serde_json::from_str(
            r#"{"op":"route.closed","module_id":"t","channels":[1,2],"reason":"crash","drained":false,"abandoned":0}"#,
        )
        .unwrap();
        assert_eq!(
            closed,
            ControlPush::RouteClosed { module_id: "t".into(), channels: vec![1, 2], reason: Some("crash".into()) }
        );
        assert!(serde_json::from_str::<ControlPush>(r#"{"op":"catalog.changed"}"#).is_err());
    }

    #[test]
    fn the_reverse_family_is_the_method_prefix() {
        assert_eq!(reverse_family(br#"{"jsonrpc":"2.0","id":1,"method":"elicitation/create"}"#), "elicitation");
        assert_eq!(reverse_family(br#"{"method":"ping"}"#), "ping");
        assert_eq!(reverse_family(b"not json"), "");
    }
}
