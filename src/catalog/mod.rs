//! The model catalog: fusiform's `catalog.get` answer cached as the LKG file
//! `catalog/fusiform-lkg.json` under the state root (format: `reference/catalog-and-vault.md`
//! Part C), loaded into an in-memory snapshot.
//!
//! Invariants: a snapshot is installed whole or not at all; the LKG's `response_sha256` (over
//! the JCS bytes of `response`) must match; a fact that is `null` or absent is *unknown*, never
//! defaulted.

pub mod lkg;
pub mod pages;
pub mod poller;
pub mod route;
pub mod tiers;
pub mod variant;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The catalog a module serves from: swapped whole when a newer one is loaded (the poller).
pub type SharedCatalog = std::sync::Arc<parking_lot::RwLock<Result<Catalog, CatalogError>>>;

/// The LKG format this build reads.
pub const LKG_FORMAT: &str = "broca.fusiform-lkg/v1";

#[derive(Debug)]
pub enum CatalogError {
    /// No LKG file: nothing to serve from until it is seeded or fusiform is reached.
    Missing {
        path: PathBuf,
    },
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a usable LKG (bad JSON, unknown format, checksum mismatch, bad rows).
    Invalid {
        path: PathBuf,
        reason: String,
    },
}

impl std::fmt::Display for CatalogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogError::Missing { path } => write!(f, "no catalog LKG at {}", path.display()),
            CatalogError::Io { path, source } => write!(f, "catalog LKG {}: {source}", path.display()),
            CatalogError::Invalid { path, reason } => write!(f, "catalog LKG {} is unusable: {reason}", path.display()),
        }
    }
}

impl std::error::Error for CatalogError {}

/// One model row: the facts broca reads, each `None` when null or absent (unknown).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelRow {
    /// `provider/model`.
    pub key: String,
    pub provider: String,
    pub model: String,
    /// `present` or `retired`.
    pub existence: String,
    pub kind: Option<String>,
    pub family: Option<String>,
    pub limit_context: Option<u64>,
    pub limit_output: Option<u64>,
    pub reasoning: Option<bool>,
    /// `None` unknown, `Some([])` none.
    pub reasoning_options: Option<Vec<Value>>,
    pub tool_call: Option<bool>,
    pub wire_npm: Option<String>,
    pub wire_api: Option<String>,
    pub wire_shape: Option<String>,
    /// `route.reasoning_wire_ids`: a Code Assist route's backend id per reasoning level.
    pub reasoning_wire_ids: Option<BTreeMap<String, String>>,
    /// `route.reasoning_default`: the backend id a Code Assist send without a variant uses.
    pub reasoning_default: Option<String>,
    /// `rate.input` / `rate.output` per million tokens, when the row prices that direction
    /// (`None`: unpriced or unknown, never zero).
    pub rate_input: Option<Rate>,
    pub rate_output: Option<Rate>,
}

/// A catalog rate per million tokens: `units × 10^-exponent` USD (`stated_zero` is `units: 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub units: u64,
    pub exponent: u32,
}

impl Rate {
    /// The rate fact `value`, when it prices in USD (`priced`) or states zero.
    fn from_fact(value: Option<&Value>) -> Option<Rate> {
        let v = value?;
        match v.get("state").and_then(Value::as_str)? {
            "stated_zero" => Some(Rate { units: 0, exponent: 0 }),
            "priced" if v.get("currency").and_then(Value::as_str) == Some("USD") => Some(Rate {
                units: v.get("units").and_then(Value::as_u64)?,
                exponent: u32::try_from(v.get("exponent").and_then(Value::as_u64)?).ok().filter(|e| *e <= 18)?,
            }),
            _ => None,
        }
    }

    /// USD per million tokens as decimal text, exactly (`3000000000 × 10^-9` is `3`).
    pub fn usd_text(self) -> String {
        let digits = self.units.to_string();
        let exponent = self.exponent as usize;
        let (whole, fraction) = match digits.len() > exponent {
            true => (digits[..digits.len() - exponent].to_owned(), digits[digits.len() - exponent..].to_owned()),
            false => ("0".to_owned(), format!("{digits:0>exponent$}")),
        };
        let fraction = fraction.trim_end_matches('0');
        match fraction.is_empty() {
            true => whole,
            false => format!("{whole}.{fraction}"),
        }
    }

    /// Nanodollars per million tokens (the batch ceilings' unit), `None` past `u64`.
    pub fn nanos_per_mtok(self) -> Option<u64> {
        match self.exponent {
            e if e <= 9 => self.units.checked_mul(10u64.pow(9 - e)),
            e => Some(self.units.div_ceil(10u64.pow(e - 9))),
        }
    }
}

impl ModelRow {
    fn from_facts(key: &str, facts: &serde_json::Map<String, Value>) -> Result<ModelRow, String> {
        let (provider, model) =
            key.split_once('/').ok_or_else(|| format!("model key {key:?} is not provider/model"))?;
        let text = |k: &str| facts.get(k).and_then(Value::as_str).map(String::from);
        let num = |k: &str| facts.get(k).and_then(Value::as_u64);
        let existence = text("existence").ok_or_else(|| format!("{key}: existence is required"))?;
        Ok(ModelRow {
            key: key.to_string(),
            provider: provider.to_string(),
            model: model.to_string(),
            existence,
            kind: text("model.kind"),
            family: text("model.family"),
            limit_context: num("limit.context"),
            // An output limit not below the context window is unknown (catalog notes, C.2).
            limit_output: num("limit.output").filter(|o| num("limit.context").is_none_or(|c| *o < c)),
            reasoning: facts.get("capability.reasoning").and_then(Value::as_bool),
            reasoning_options: facts.get("capability.reasoning_options").and_then(Value::as_array).cloned(),
            tool_call: facts.get("capability.tool_call").and_then(Value::as_bool),
            wire_npm: text("wire.npm"),
            wire_api: text("wire.api"),
            wire_shape: text("wire.shape"),
            reasoning_wire_ids: facts.get("route.reasoning_wire_ids").and_then(Value::as_object).map(|tiers| {
                tiers.iter().filter_map(|(level, id)| id.as_str().map(|id| (level.clone(), id.to_owned()))).collect()
            }),
            reasoning_default: text("route.reasoning_default"),
            rate_input: Rate::from_fact(facts.get("rate.input")),
            rate_output: Rate::from_fact(facts.get("rate.output")),
        })
    }
}

/// An in-memory catalog snapshot.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub catalog_version: u64,
    pub resolved_at_ms: u64,
    models: BTreeMap<String, ModelRow>,
}

#[derive(Deserialize)]
struct LkgFile {
    format: String,
    response_sha256: String,
    response: Value,
}

/// Lowercase hex SHA-256 of the JCS (RFC 8785) bytes of `v`: keys sorted, no whitespace. The
/// catalog's values are integers, strings, booleans and nulls, for which serde_json's compact
/// form of a key-sorted value is the canonical form.
pub fn jcs_sha256(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                // JCS orders by UTF-16 code units; for these keys that equals byte order.
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let bytes = serde_json::to_vec(&sorted(v)).expect("values serialize");
    crate::session_key::hex(&Sha256::digest(&bytes))
}

impl Catalog {
    /// Loads the LKG at `path`.
    pub fn load_lkg(path: &Path) -> Result<Catalog, CatalogError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CatalogError::Missing { path: path.to_path_buf() })
            }
            Err(source) => return Err(CatalogError::Io { path: path.to_path_buf(), source }),
        };
        let invalid = |reason: String| CatalogError::Invalid { path: path.to_path_buf(), reason };
        let file: LkgFile = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if file.format.split('/').next() != LKG_FORMAT.split('/').next() || !file.format.ends_with("/v1") {
            return Err(invalid(format!("format {:?} is not {LKG_FORMAT}", file.format)));
        }
        let digest = jcs_sha256(&file.response);
        if digest != file.response_sha256 {
            return Err(invalid(format!(
                "response_sha256 is {} but the response hashes to {digest}",
                file.response_sha256
            )));
        }
        Catalog::from_response(&file.response).map_err(invalid)
    }

    /// Builds a snapshot from a `CatalogGetResponse` value.
    pub fn from_response(response: &Value) -> Result<Catalog, String> {
        let models = response.get("models").and_then(Value::as_object).ok_or("response has no models map")?;
        let mut rows = BTreeMap::new();
        for (key, facts) in models {
            let facts = facts.as_object().ok_or_else(|| format!("{key}: facts are not an object"))?;
            rows.insert(key.clone(), ModelRow::from_facts(key, facts)?);
        }
        Ok(Catalog {
            catalog_version: response.get("catalog_version").and_then(Value::as_u64).unwrap_or(0),
            resolved_at_ms: response.get("resolved_at_ms").and_then(Value::as_u64).unwrap_or(0),
            models: rows,
        })
    }

    /// The row of `provider/model`.
    pub fn row(&self, key: &str) -> Option<&ModelRow> {
        self.models.get(key)
    }

    /// The rows of one provider, in model-id order.
    pub fn provider_rows<'a>(&'a self, provider: &'a str) -> impl Iterator<Item = &'a ModelRow> + 'a {
        self.models.values().filter(move |row| row.provider == provider)
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeded() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json")
    }

    #[test]
    fn the_seeded_lkg_loads_and_its_checksum_holds() {
        let c = Catalog::load_lkg(&seeded()).unwrap();
        let row = c.row("anthropic/claude-sonnet-4-5").unwrap();
        assert_eq!(row.wire_npm.as_deref(), Some("@ai-sdk/anthropic"));
        assert_eq!(row.limit_output, Some(64000));
        assert_eq!(c.row("cloudflare-workers-ai/@cf/cloudflare/clef").unwrap().limit_context, None);
    }

    #[test]
    fn a_tampered_lkg_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(seeded()).unwrap().replacen("64000", "64001", 1);
        let path = dir.path().join("lkg.json");
        std::fs::write(&path, text).unwrap();
        assert!(matches!(Catalog::load_lkg(&path), Err(CatalogError::Invalid { .. })));
        assert!(matches!(Catalog::load_lkg(&dir.path().join("none.json")), Err(CatalogError::Missing { .. })));
    }
}

#[cfg(test)]
mod rate_tests {
    use super::Rate;
    use serde_json::json;

    #[test]
    fn rates_read_as_exact_decimal_text_and_nanodollars() {
        let priced =
            |units, exponent| json!({"currency": "USD", "exponent": exponent, "state": "priced", "units": units});
        let rate = |v: serde_json::Value| Rate::from_fact(Some(&v));
        for (units, exponent, text, nanos) in [
            (3_000_000_000u64, 9u32, "3", 3_000_000_000u64),
            (150_000_000, 9, "0.15", 150_000_000),
            (75, 0, "75", 75_000_000_000),
            (5, 10, "0.0000000005", 1),
        ] {
            let r = rate(priced(units, exponent)).unwrap();
            assert_eq!((r.usd_text().as_str(), r.nanos_per_mtok()), (text, Some(nanos)), "{units}e-{exponent}");
        }
        assert_eq!(rate(json!({"state": "stated_zero"})).map(Rate::usd_text).as_deref(), Some("0"));
        assert_eq!(rate(json!({"state": "unpriced", "reason": "missing_rate"})), None);
        assert_eq!(rate(json!({"currency": "EUR", "exponent": 9, "state": "priced", "units": 1})), None);
    }
}
