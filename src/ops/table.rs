//! The operations served on a session route: one table, from which the module manifest,
//! `role.describe`'s op list and the per-op counters of `health.check` are derived. Adding an op
//! is a row here plus its handler in `Ops::handle_on`.

use std::collections::BTreeMap;

use subc_protocol::manifest::{
    CapabilityDeclarations, Concurrency, IdentityScope, ManagementOperation, ManagementOperationKind, ModuleManifest,
    OperationDelivery, ProviderRole,
};

/// What an operation does to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Reads only.
    Query,
    /// May write the session's WAL (the manifest's `mutate`).
    Write,
    /// A long-lived stream (delivered as a watch).
    Stream,
}

/// One served operation.
#[derive(Clone, Copy, Debug)]
pub struct OpSpec {
    pub name: &'static str,
    pub kind: OpKind,
}

const fn op(name: &'static str, kind: OpKind) -> OpSpec {
    OpSpec { name, kind }
}

/// Every operation served on a session route, in the order `role.describe` lists them.
pub const OPS: &[OpSpec] = &[
    op("role.describe", OpKind::Query),
    op("session.baseline", OpKind::Query),
    op("session.send", OpKind::Write),
    op("session.retract", OpKind::Write),
    op("session.read", OpKind::Query),
    op("session.head", OpKind::Query),
    op("session.history", OpKind::Query),
    op("run.status", OpKind::Query),
    op("run.result", OpKind::Query),
    op("run.cancel", OpKind::Write),
    op("run.tool_calls", OpKind::Query),
    op("send.status", OpKind::Query),
    op("session.send_status", OpKind::Query),
    op("session.subscribe", OpKind::Stream),
];

/// The served op of this name.
pub fn find(name: &str) -> Option<&'static OpSpec> {
    OPS.iter().find(|o| o.name == name)
}

/// The module manifest: a `management_surface` claiming `llm-runner/v1`; writes are `mutate`,
/// streams are delivered as a watch.
pub fn manifest(module_id: &str) -> ModuleManifest {
    let operations = OPS
        .iter()
        .map(|o| ManagementOperation {
            name: o.name.to_owned(),
            kind: match o.kind {
                OpKind::Write => ManagementOperationKind::Mutate,
                OpKind::Query | OpKind::Stream => ManagementOperationKind::Query,
            },
            description: None,
        })
        .collect();
    let delivery: BTreeMap<String, OperationDelivery> = OPS
        .iter()
        .filter(|o| o.kind == OpKind::Stream)
        .map(|o| (o.name.to_owned(), OperationDelivery::Watch))
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
            provides: vec![cortexkit_role_llm_runner::PROVIDES.to_owned()],
            requires: Vec::new(),
            must_never_reach: Vec::new(),
        }))
        .operation_delivery(delivery)
        .build()
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
    }
}
