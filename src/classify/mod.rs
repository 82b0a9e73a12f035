//! The `classifier/v1` role (spec §4b, System One decision models):
//!
//! - [`scope`]: which role a route serves, and whom a call's work is attributed to;
//! - [`models`]: the decision models this build routes, checked against the live catalog
//!   (`model_unknown`, `model_not_classifier`, `model_unavailable`), and the classifier
//!   `role.describe` built from both;
//! - [`run`]: one `classify.run` call, validation to reply;
//! - [`provider`]: one item's provider call (TypeSafe, Workers AI) and its error mapping;
//! - [`store`]: `system-one.db`, the authority for admitted batches and item outcomes
//!   (idempotency by body identity, single flight, stored outcomes, the ceiling that only
//!   tightens, measurement intents, release at start, seven-day deletion);
//! - [`service`]: what calls share (caps, the vault, metrics, publishing facts).

pub mod models;
pub mod provider;
pub mod run;
pub mod scope;
pub mod service;
pub mod store;

pub use service::Classifier;
