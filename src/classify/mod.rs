//! The `classifier/v1` role (spec §4b, System One decision models): what exists so far.
//!
//! - [`models`]: the decision models this build routes, checked against the live catalog
//!   (`model_unknown`, `model_not_classifier`, `model_unavailable`), and the classifier
//!   `role.describe` built from both;
//! - [`store`]: `system-one.db`, the authority for admitted batches and item outcomes
//!   (idempotency by body identity, single flight, stored outcomes, the ceiling that only
//!   tightens, measurement intents, release at start, seven-day deletion).
//!
//! Not yet: the classifier route and `classify.run`, the providers (TypeSafe, Workers AI),
//! publishing intents to `run-index.db`, health metrics (#31).

pub mod models;
pub mod store;
