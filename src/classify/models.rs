//! The decision models this build routes (spec §4b), checked against the live catalog
//! (model-batch RULES §9, checklist C-27), and the classifier `role.describe` built from both
//! (classifier CONTRACT §2).
//!
//! A catalog row is a classifier when its `model.kind` is `decision` (the spec's word) or
//! `classifier` (the role crate's; decision C-Q3.2). A row stating another kind, or none, is
//! `model_not_classifier` (its `detail.kind` only when the row states one); a model the catalog
//! does not list is `model_unknown`; a decision row this build does not route, or one the
//! catalog lists as retired, is `model_unavailable`.

use std::collections::BTreeMap;

use cortexkit_role_classifier::describe::{ImageSupport, Limits, ModelEntry, Price, RoleDescribe};
use cortexkit_role_classifier::provider::{catalog_ids, clef_limits, hosts, models};

use crate::catalog::{Catalog, ModelRow, Rate};

/// The most items one batch may carry: a batch answers within one call (RULES §11), and the
/// model's concurrency cap bounds how fast its items go.
pub const MAX_ITEMS: u64 = 1_000;
/// The largest `classify.run` params: 64 KiB under the transport's 4 MiB frame (spec §4), so a
/// request just over it still reaches broca and is refused by name (`invalid_params` naming
/// `params`, RULES §8) instead of failing in the transport.
pub const MAX_REQUEST_BYTES: u64 = 4_194_304 - 65_536;
/// The most questions in one batch: clef's documented bound, which broca applies to Jev too
/// (TypeSafe documents none; C-Q3.9).
pub const MAX_QUESTIONS: u64 = clef_limits::MAX_QUESTIONS as u64;

/// The catalog's kind for a decision model (spec §4b); the role crate's `classifier` is read
/// the same way.
pub const DECISION_KIND: &str = "decision";

/// Who answers a routed model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// TypeSafe: `POST https://api.typesafe.ai/v1/systemone`.
    TypeSafe,
    /// Cloudflare Workers AI: `POST .../accounts/{account_id}/ai/run/@cf/cloudflare/{model}`.
    WorkersAi,
}

impl Provider {
    /// The provider id: the catalog's and `providers.<id>.base_url`'s.
    pub fn id(self) -> &'static str {
        match self {
            Provider::TypeSafe => "typesafe",
            Provider::WorkersAi => "cloudflare-workers-ai",
        }
    }

    /// The host item text is sent to.
    pub fn egress_host(self) -> &'static str {
        match self {
            Provider::TypeSafe => hosts::TYPESAFE,
            Provider::WorkersAi => hosts::CLOUDFLARE,
        }
    }

    /// The vault credential its calls read (spec §4b; nothing else, §1b).
    pub fn credential_id(self) -> String {
        format!("apikey:{}", self.id())
    }

    /// The base its calls go to: `providers.<id>.base_url` when `broca.jsonc` names one.
    pub fn base(self, overrides: &BTreeMap<String, String>) -> &str {
        overrides.get(self.id()).map_or(default_base(self), String::as_str)
    }
}

/// The default bases, replaced by `providers.<id>.base_url` (spec §4b).
pub fn default_base(provider: Provider) -> &'static str {
    match provider {
        Provider::TypeSafe => "https://api.typesafe.ai",
        Provider::WorkersAi => "https://api.cloudflare.com",
    }
}

/// The host of `base` (`egress_host` in `role.describe`: where item text goes).
pub fn host_of(base: &str) -> &str {
    let rest = base.split_once("://").map_or(base, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.split(':').next().unwrap_or(host),
    }
}

/// One routed model: its catalog id, the pinned value its provider is sent (never a moving
/// alias), and its image bound (`None`: text only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    pub catalog_id: &'static str,
    pub wire_model: &'static str,
    pub provider: Provider,
    pub images: Option<u64>,
}

/// Every decision model this build routes.
pub const ROUTED: [Routed; 3] = [
    Routed {
        catalog_id: catalog_ids::JEV_1_13_0,
        wire_model: models::JEV_1_13_0,
        provider: Provider::TypeSafe,
        images: None,
    },
    Routed {
        catalog_id: catalog_ids::CLEF,
        wire_model: models::CLEF,
        provider: Provider::WorkersAi,
        images: Some(clef_limits::MAX_IMAGES as u64),
    },
    Routed {
        catalog_id: catalog_ids::CLEF_FLASH,
        wire_model: models::CLEF_FLASH,
        provider: Provider::WorkersAi,
        images: Some(clef_limits::MAX_IMAGES as u64),
    },
];

/// Why a requested model cannot be classified with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelRefusal {
    /// `model_unknown`: the catalog lists no such model.
    Unknown,
    /// `model_not_classifier`: the row states another kind, or none.
    NotClassifier { kind: Option<String> },
    /// `model_unavailable`: a decision row this build does not route, or a retired one.
    Unavailable,
}

/// The catalog row and the routing of `model`.
pub fn resolve<'c>(catalog: &'c Catalog, model: &str) -> Result<(&'c ModelRow, &'static Routed), ModelRefusal> {
    let row = catalog.row(model).ok_or(ModelRefusal::Unknown)?;
    if !matches!(row.kind.as_deref(), Some(DECISION_KIND | cortexkit_role_classifier::request::CLASSIFIER_KIND)) {
        return Err(ModelRefusal::NotClassifier { kind: row.kind.clone() });
    }
    let routed = ROUTED.iter().find(|r| r.catalog_id == model).ok_or(ModelRefusal::Unavailable)?;
    match row.existence.as_str() {
        "present" => Ok((row, routed)),
        _ => Err(ModelRefusal::Unavailable),
    }
}

/// The classifier `role.describe`: the module's limits and every routed model the catalog
/// lists as a present decision row, with its context and prices as the catalog states them
/// (absent, never zero, when it does not), and the host its item text goes to (the effective
/// base's: `providers.<id>.base_url` moves it).
pub fn describe(catalog: &Catalog, bases: &BTreeMap<String, String>) -> RoleDescribe {
    let entries = ROUTED.iter().filter_map(|routed| {
        let (row, _) = resolve(catalog, routed.catalog_id).ok()?;
        Some(entry(row, routed, bases))
    });
    RoleDescribe::new(Limits::new(MAX_ITEMS, MAX_REQUEST_BYTES), entries.collect())
}

/// One model's `role.describe` entry: what its requests are checked against.
pub fn entry(row: &ModelRow, routed: &Routed, bases: &BTreeMap<String, String>) -> ModelEntry {
    let host = host_of(routed.provider.base(bases));
    let mut entry =
        ModelEntry::new(routed.catalog_id, MAX_QUESTIONS, MAX_ITEMS, row.limit_context.filter(|c| *c > 0), host);
    if let Some(max) = routed.images {
        entry = entry.with_images(ImageSupport::new(max));
    }
    let number = |rate: Option<Rate>| rate.and_then(|r| r.usd_text().parse::<serde_json::Number>().ok());
    let (input, output) = (number(row.rate_input), number(row.rate_output));
    if input.is_some() || output.is_some() {
        let mut price = Price::new();
        price.input_per_mtok_usd = input;
        price.output_per_mtok_usd = output;
        entry = entry.with_price(price);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog() -> Catalog {
        let decision = |extra: serde_json::Value| {
            let mut row = json!({"existence": "present", "model.kind": "decision", "limit.context": null,
                                 "rate.input": {"state": "unpriced", "reason": "missing_rate"}});
            row.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            row
        };
        let priced = json!({"currency": "USD", "exponent": 9, "state": "priced", "units": 150_000_000});
        Catalog::from_response(&json!({"models": {
            catalog_ids::CLEF: decision(json!({})),
            catalog_ids::JEV_1_13_0: decision(json!({"limit.context": 32768, "rate.input": priced, "rate.output": {"state": "stated_zero"}})),
            catalog_ids::CLEF_FLASH: decision(json!({"existence": "retired"})),
            "typesafe/jev-2": decision(json!({})),
            "anthropic/claude-sonnet-4-5": {"existence": "present", "model.kind": "chat"},
            "odd/kindless": {"existence": "present"},
        }}))
        .unwrap()
    }

    #[test]
    fn only_present_routed_decision_rows_are_classifiers() {
        let c = catalog();
        assert!(resolve(&c, catalog_ids::CLEF).is_ok_and(|(_, r)| r.wire_model == "clef"));
        assert_eq!(resolve(&c, "nobody/nothing").unwrap_err(), ModelRefusal::Unknown);
        assert_eq!(
            resolve(&c, "anthropic/claude-sonnet-4-5").unwrap_err(),
            ModelRefusal::NotClassifier { kind: Some("chat".into()) }
        );
        assert_eq!(resolve(&c, "odd/kindless").unwrap_err(), ModelRefusal::NotClassifier { kind: None });
        assert_eq!(
            resolve(&c, "typesafe/jev-2").unwrap_err(),
            ModelRefusal::Unavailable,
            "a decision row broca does not route"
        );
        assert_eq!(resolve(&c, catalog_ids::CLEF_FLASH).unwrap_err(), ModelRefusal::Unavailable, "retired");
    }

    #[test]
    fn describe_lists_what_the_catalog_states_and_nothing_it_does_not() {
        let describe = describe(&catalog(), &BTreeMap::new());
        cortexkit_role_classifier::describe::check_describe(&describe).unwrap();
        let body = serde_json::to_value(&describe).unwrap();
        let models: Vec<&str> =
            body["models"].as_array().unwrap().iter().map(|m| m["model"].as_str().unwrap()).collect();
        assert_eq!(models, [catalog_ids::JEV_1_13_0, catalog_ids::CLEF]);
        let jev = &body["models"][0];
        assert_eq!(jev["egress_host"], "api.typesafe.ai");
        assert_eq!(jev["context_tokens"], 32768);
        assert_eq!(jev["images"], serde_json::Value::Null, "text only is stated as null");
        assert_eq!(jev["price"], json!({"input_per_mtok_usd": 0.15, "output_per_mtok_usd": 0}));
        let clef = &body["models"][1];
        assert_eq!(
            (clef["images"]["max"].as_u64(), clef.get("price"), clef.get("context_tokens")),
            (Some(4), None, None)
        );
        assert_eq!(body["limits"], json!({"max_items": 1000, "max_request_bytes": 4128768}));
        assert_eq!(body["role"], "classifier/v1");
    }

    #[test]
    fn the_lkg_s_clef_row_is_a_classifier() {
        let lkg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        let catalog = Catalog::load_lkg(&lkg).unwrap();
        assert!(resolve(&catalog, catalog_ids::CLEF).is_ok());
        assert_eq!(describe(&catalog, &BTreeMap::new()).models.len(), 1);
    }
}
