//! The catalog the rig seeds into broca's state root (its fusiform LKG), and what the suite is
//! told it serves: one table, so the rows and the [`ServedModel`]s cannot drift apart.
//!
//! Rows: TypeSafe's `jev-1.13.0` (decision, priced, an exact context), Workers AI's `clef`
//! (decision, images allowed, unpriced, no exact context), a chat row (not a classifier) and a
//! row stating no `model.kind` (kindless). Both decision rows route to the stand-in provider
//! (`providers.<id>.base_url` in `broca.jsonc`), so broca's `egress_host` for each is the
//! stand-in's host.

use cortexkit_role_classifier_conformance::ServedModel;
use serde_json::{json, Value};

pub const JEV: &str = "typesafe/jev-1.13.0";
pub const CLEF: &str = "cloudflare-workers-ai/@cf/cloudflare/clef";
/// A row whose `model.kind` is `chat`.
pub const CHAT: &str = "anthropic/claude-sonnet-4-5";
/// A row that states no `model.kind`.
pub const KINDLESS: &str = "conformance/kindless-row";

/// A `rate.*` fact: USD per million tokens as `units × 10^-9`.
fn priced(nano_usd_per_mtok: u64) -> Value {
    json!({"currency": "USD", "exponent": 9, "state": "priced", "units": nano_usd_per_mtok})
}

/// One decision row as the catalog states it, and what broca routes it with.
struct Decision {
    id: &'static str,
    /// `limit.context`; `None` is stated as `null` (no exact figure).
    context: Option<u64>,
    /// `rate.input` and `rate.output`, nano-USD per million tokens; `None`: unpriced.
    rates: Option<(u64, u64)>,
    /// Whether the row lists `image` among its input modalities.
    images: bool,
    /// The image limit per item broca routes the model with (clef's documented 4).
    images_max: Option<u64>,
}

/// Which decision rows a rig's catalog states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Both: the suite's main model is then Jev (`role.describe` lists it first), TypeSafe's wire.
    Both,
    /// Clef alone (the chat and kindless rows still there): every check runs on Workers AI's
    /// wire, its `result` envelope and its account path.
    ClefOnly,
}

impl Rows {
    pub fn name(self) -> &'static str {
        match self {
            Rows::Both => "typesafe+workers-ai",
            Rows::ClefOnly => "workers-ai",
        }
    }

    fn decisions(self) -> impl Iterator<Item = &'static Decision> {
        DECISIONS.iter().filter(move |d| self == Rows::Both || d.id == CLEF)
    }
}

const DECISIONS: [Decision; 2] = [
    Decision {
        id: JEV,
        context: Some(32_768),
        rates: Some((150_000_000, 600_000_000)),
        images: false,
        images_max: None,
    },
    Decision { id: CLEF, context: None, rates: None, images: true, images_max: Some(4) },
];

fn decision_row(d: &Decision) -> Value {
    let modalities: Vec<&str> = if d.images { vec!["image", "text"] } else { vec!["text"] };
    let mut row = json!({
        "existence": "present",
        "model.kind": "decision",
        "model.family": null,
        "model.open_weights": null,
        "limit.context": d.context,
        "limit.output": null,
        "capability.reasoning": false,
        "capability.tool_call": false,
        "capability.attachment": d.images,
        "capability.input_modalities": modalities,
        "capability.output_modalities": ["text"],
        "wire.npm": null,
        "wire.api": null,
    });
    match d.rates {
        Some((input, output)) => {
            row["rate.input"] = priced(input);
            row["rate.output"] = priced(output);
        }
        None => row["rate.input"] = json!({"state": "unpriced", "reason": "missing_rate"}),
    }
    row
}

/// The `catalog.get` response the LKG carries.
pub fn response(rows: Rows, now_ms: u64) -> Value {
    let mut models = serde_json::Map::new();
    for d in rows.decisions() {
        models.insert(d.id.into(), decision_row(d));
    }
    models.insert(
        CHAT.into(),
        json!({
            "existence": "present",
            "model.kind": "chat",
            "model.family": "claude-sonnet",
            "limit.context": 200_000,
            "limit.output": 64_000,
            "capability.tool_call": true,
            "wire.npm": "@ai-sdk/anthropic",
            "wire.api": "https://api.anthropic.com/v1",
            "rate.input": priced(3_000_000_000),
            "rate.output": priced(15_000_000_000),
        }),
    );
    models.insert(
        KINDLESS.into(),
        json!({"existence": "present", "limit.context": 8_192, "rate.input": {"state": "unpriced", "reason": "missing_rate"}}),
    );
    json!({"source": "models.dev", "resolved_at_ms": now_ms, "catalog_version": now_ms, "models": models})
}

/// The LKG file's bytes (broca's own envelope and digest), written "now" so broca's catalog
/// poller finds it fresh and does not chase a fusiform the rig does not run.
pub fn lkg(rows: Rows, now_ms: u64) -> Vec<u8> {
    broca::catalog::lkg::envelope(&response(rows, now_ms), 1, now_ms)
}

/// The decision models the catalog serves, every one through the stand-in at `egress_host`.
pub fn served(rows: Rows, egress_host: &str) -> Vec<ServedModel> {
    rows.decisions()
        .map(|d| ServedModel {
            model: d.id.into(),
            priced: d.rates.is_some(),
            images_max: d.images_max,
            context_tokens: d.context,
            egress_host: egress_host.into(),
        })
        .collect()
}
