//! The module manifest, derived from the one list of served operations ([`crate::op::Op`]).

use std::collections::BTreeMap;

use subc_protocol::manifest::{
    CapabilityDeclarations, Concurrency, IdentityScope, ManagementOperation, ManagementOperationKind, ModuleManifest,
    OperationDelivery, ProviderRole, SelfSignalDeclaration, SelfSignalEffect, SelfSignalKind, SignalAnchor,
};

use crate::op::{Op, OpKind};

/// The module manifest: a `management_surface` claiming `llm-runner/v1`; writes are `mutate`,
/// streams are delivered as a watch.
pub fn manifest(module_id: &str) -> ModuleManifest {
    let mut operations: Vec<ManagementOperation> = Op::ALL
        .iter()
        .map(|o| ManagementOperation {
            name: o.name().to_owned(),
            kind: match o.kind() {
                OpKind::Write => ManagementOperationKind::Mutate,
                OpKind::Query | OpKind::Stream => ManagementOperationKind::Query,
            },
            description: None,
        })
        .collect();
    // Served on classifier routes only (spec §4b); it writes `system-one.db`.
    operations.push(ManagementOperation {
        name: cortexkit_role_classifier::ops::CLASSIFY_RUN.to_owned(),
        kind: ManagementOperationKind::Mutate,
        description: None,
    });
    // Moving sessions between hosts (DESIGN §8): broca's own, outside the role's op list.
    operations.extend(crate::op::MOVE_OPS.iter().map(|name| ManagementOperation {
        name: (*name).to_owned(),
        kind: if *name == crate::op::MOVE_LOCATE {
            ManagementOperationKind::Query
        } else {
            ManagementOperationKind::Mutate
        },
        description: None,
    }));
    let delivery: BTreeMap<String, OperationDelivery> = Op::ALL
        .iter()
        .filter(|o| o.kind() == OpKind::Stream)
        .map(|o| (o.name().to_owned(), OperationDelivery::Watch))
        .collect();
    ModuleManifest::builder(module_id, env!("CARGO_PKG_VERSION"))
        .provides(vec![ProviderRole::ManagementSurface {
            operations,
            config_schema: serde_json::json!({"type": "object"}),
            observability: Vec::new(),
            identity_scope: vec![IdentityScope::Session],
            concurrency: Concurrency::ModuleManaged,
        }])
        .capabilities(Some(CapabilityDeclarations {
            provides: vec![
                cortexkit_role_llm_runner::PROVIDES.to_owned(),
                cortexkit_role_classifier::PROVIDES.to_owned(),
                // Classifier calls are attributed to a stamped run or flow (spec §4b); a flow
                // is never taken for its owner agent, a run never exercises its authority.
                subc_protocol::scope::AGENT_RUN_SCOPES_CAPABILITY.to_owned(),
                subc_protocol::scope::FLOW_SCOPES_CAPABILITY.to_owned(),
            ],
            requires: Vec::new(),
            must_never_reach: Vec::new(),
        }))
        .operation_delivery(delivery)
        .self_signals(Some(vec![busy_gauges()]))
        .build()
}

/// The work a drain waits for ("Graceful restart policy"): runs, actors opening or closing,
/// classifier batches in flight. Paused actors are idle.
pub const BUSY_GAUGES: [&str; 4] = ["runs_in_flight", "opening", "closing", "system_one_batches_in_flight"];

fn busy_gauges() -> SelfSignalDeclaration {
    SelfSignalDeclaration {
        name: "in_flight_work".to_owned(),
        kind: SelfSignalKind::Busy,
        effect: SelfSignalEffect::Mutate,
        anchored_to: SignalAnchor::HealthGauges { gauges: BUSY_GAUGES.iter().map(|g| (*g).to_owned()).collect() },
        cadence: None,
        domain: None,
        note: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifest once declared `session.retract` and `run.cancel` as queries; both write.
    #[test]
    fn every_op_that_writes_is_declared_mutate_and_the_stream_a_watch() {
        let manifest = manifest("broca");
        let Some(ProviderRole::ManagementSurface { operations, .. }) = manifest.provides.first() else {
            panic!("a management surface: {manifest:?}")
        };
        let kind = |name: &str| operations.iter().find(|o| o.name == name).map(|o| o.kind.clone());
        for write in ["session.send", "session.retract", "run.cancel"] {
            assert_eq!(kind(write), Some(ManagementOperationKind::Mutate), "{write}");
        }
        for query in ["session.read", "run.status", "run.result", "send.status", "role.describe"] {
            assert_eq!(kind(query), Some(ManagementOperationKind::Query), "{query}");
        }
        assert_eq!(manifest.operation_delivery.get("session.subscribe"), Some(&OperationDelivery::Watch));
        assert_eq!(kind("classify.run"), Some(ManagementOperationKind::Mutate), "it writes system-one.db");
    }

    /// Spec §4b: the manifest provides classifier/v1 (with the scope capabilities its calls'
    /// attribution needs) and declares the busy gauges a drain waits for.
    #[test]
    fn the_classifier_role_and_the_busy_gauges_are_declared() {
        let manifest = manifest("broca");
        let provides = &manifest.capabilities.as_ref().unwrap().provides;
        for cap in ["llm-runner/v1", "classifier/v1", "agent-run-scopes/v1", "flow-scopes/v1"] {
            assert!(provides.iter().any(|p| p == cap), "{cap} in {provides:?}");
        }
        let signals = manifest.self_signals.as_ref().unwrap();
        let busy: Vec<&SelfSignalDeclaration> = signals.iter().filter(|s| s.kind == SelfSignalKind::Busy).collect();
        assert_eq!(busy.len(), 1);
        let SignalAnchor::HealthGauges { gauges } = &busy[0].anchored_to else { panic!("{busy:?}") };
        assert_eq!(gauges, &BUSY_GAUGES.map(String::from).to_vec());
    }
}
