//! Work scope and route role of classifier calls (spec §4b "One route, one role" and "Work
//! scope"; model-batch RULES §18).
//!
//! A route is a classifier route exactly when its `route.open` declared `role_versions
//! {"classifier": "v1"}`; a bind declaring both roles, or another classifier version, is refused
//! at bind (`role_versions_unsupported`, `detail.field: "role_versions"`).
//!
//! A call's attribution comes only from what the daemon stamped: a run scope (`agent_id` and
//! `run_id`) or a flow scope (`flow_id`, never attributed to the flow's owner agent).
//! `reserved:basal` must present a flow even when it carries a run stamp.

use std::collections::BTreeMap;

use cortexkit_role_classifier::errors::{ErrorClass, Refusal, RefusalDetail};
use subc_protocol::scope::ScopeStamp;
use subc_protocol::Principal;

use super::store::Attribution;
use crate::wire::RefusalCode;

/// The module whose calls must carry a flow (spec §4b).
pub const FLOW_ONLY_MODULE: &str = "basal";

/// Which role a bound route serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteRole {
    LlmRunner,
    Classifier,
}

/// The role a bind's `role_versions` declares, or the bind refusal (as `{code, message,
/// detail}`).
pub fn route_role(role_versions: Option<&BTreeMap<String, String>>) -> Result<RouteRole, subc_protocol::ErrorBody> {
    let Some(versions) = role_versions else { return Ok(RouteRole::LlmRunner) };
    let classifier = versions.get(cortexkit_role_classifier::ROLE);
    let runner = versions.get("llm-runner");
    let refuse = |message: String| {
        let mut body = subc_protocol::ErrorBody::new(RefusalCode::RoleVersionsUnsupported.as_str(), message);
        body.detail = Some(serde_json::json!({"class": "permanent", "field": "role_versions"}));
        Err(body)
    };
    match (classifier, runner) {
        (Some(_), Some(_)) => refuse("a route serves one role: it declared both classifier and llm-runner".into()),
        (Some(v), None) if v == cortexkit_role_classifier::VERSION => Ok(RouteRole::Classifier),
        (Some(v), None) => refuse(format!("classifier {v} is not served (only v1)")),
        (None, Some(v)) if v == "v1" => Ok(RouteRole::LlmRunner),
        (None, Some(v)) => refuse(format!("llm-runner {v} is not served (only v1)")),
        (None, None) => Ok(RouteRole::LlmRunner),
    }
}

/// What a classifier route's bind stamped: its principal and work scope.
#[derive(Clone, Debug, PartialEq)]
pub struct Stamp {
    pub principal: Option<Principal>,
    pub scope: Option<ScopeStamp>,
}

impl Stamp {
    /// The attribution a call on this route is recorded under, or `scope_required` /
    /// `flow_scope_required` (both permanent: the route's stamp cannot change).
    pub fn attribution(&self) -> Result<Attribution, Refusal> {
        let attributes = self.scope.as_ref().map(|s| &s.attributes);
        let flow = attributes.and_then(|a| a.flow_id.clone());
        let basal = matches!(&self.principal, Some(Principal::Reserved { module_id }) if module_id == FLOW_ONLY_MODULE);
        if let Some(flow_id) = flow {
            return Ok(Attribution { agent_id: None, run_id: None, flow_id: Some(flow_id) });
        }
        if basal {
            return Err(refusal(
                RefusalCode::FlowScopeRequired,
                "reserved:basal classifies only under a flow scope (flow_id); a run stamp is not enough",
            ));
        }
        match attributes.map(|a| (a.agent_id.clone(), a.run_id.clone())) {
            Some((Some(agent_id), Some(run_id))) => {
                Ok(Attribution { agent_id: Some(agent_id), run_id: Some(run_id), flow_id: None })
            }
            _ => Err(refusal(
                RefusalCode::ScopeRequired,
                "classify.run needs a daemon-stamped run scope (agent_id and run_id) or flow scope (flow_id)",
            )),
        }
    }
}

/// A permanent refusal of broca's own (not in the role's vocabulary, so its class is stated).
pub fn refusal(code: RefusalCode, message: &str) -> Refusal {
    Refusal::new(code.as_str(), message).with_detail(RefusalDetail::new(ErrorClass::Permanent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use subc_protocol::scope::{ScopeAttributes, ScopeKind};

    fn versions(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn one_route_one_role() {
        assert_eq!(route_role(None), Ok(RouteRole::LlmRunner));
        assert_eq!(route_role(Some(&versions(&[("classifier", "v1")]))), Ok(RouteRole::Classifier));
        assert_eq!(route_role(Some(&versions(&[("tool-provider", "v1")]))), Ok(RouteRole::LlmRunner));
        for refused in [versions(&[("classifier", "v1"), ("llm-runner", "v1")]), versions(&[("classifier", "v2")])] {
            let body = route_role(Some(&refused)).unwrap_err();
            assert_eq!(body.code, "role_versions_unsupported");
            assert_eq!(body.detail.unwrap()["field"], "role_versions");
        }
    }

    fn stamp(module: Option<&str>, attributes: ScopeAttributes) -> Stamp {
        let owner = Principal::Reserved { module_id: "prefrontal-core".into() };
        Stamp {
            principal: Some(module.map_or(Principal::Direct, |m| Principal::Reserved { module_id: m.into() })),
            scope: Some(ScopeStamp::new(owner, "s-1", 1, ScopeKind::Worker).with_attributes(attributes)),
        }
    }

    #[test]
    fn a_call_needs_a_run_or_a_flow_and_basal_a_flow() {
        let run = ScopeAttributes::new().with_agent_id(Some("a".into())).with_run_id(Some("r".into()));
        let flow = ScopeAttributes::new().with_flow_id(Some("f".into()));
        assert_eq!(stamp(None, run.clone()).attribution().unwrap().run_id.as_deref(), Some("r"));
        let by_flow = stamp(None, flow.clone()).attribution().unwrap();
        assert_eq!((by_flow.flow_id.as_deref(), by_flow.agent_id), (Some("f"), None));
        assert_eq!(stamp(Some("basal"), run).attribution().unwrap_err().code, "flow_scope_required");
        assert!(stamp(Some("basal"), flow).attribution().is_ok());
        let agent_only = ScopeAttributes::new().with_agent_id(Some("a".into()));
        assert_eq!(stamp(None, agent_only).attribution().unwrap_err().code, "scope_required");
        let unscoped = Stamp { principal: Some(Principal::Direct), scope: None };
        let refused = unscoped.attribution().unwrap_err();
        assert_eq!((refused.code.as_str(), refused.detail.class.as_str()), ("scope_required", "permanent"));
    }
}
