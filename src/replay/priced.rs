//! When a run's usage was first billed: the time its metering fact is priced at (spec §17b).

use serde::{Deserialize, Serialize};

/// When a run's usage of one `(provider, model, variant)` was first billed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PricedAt {
    pub provider: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub at_ms: u64,
}
