//! Output references (llm-runner §9.13): immutable records of the tool outputs a model's reply
//! (or an opted-in tool call's reference slots) names by the part numbers its request showed.
//!
//! A session renders part numbers, and gets reference sets, when an item of its frozen fetch
//! plan carries `output_refs: true` (the contract's "tag-rendering plan"; broca has no
//! compaction provider, whose contract otherwise owns numbering). Nothing is stored for it: the
//! sets are derived from the durable transcript ([`sets`]), ids are session-bound ([`ids`]).

pub mod cache;
pub mod ids;
pub mod index;
pub mod sets;
pub mod tags;

/// The reference dialect scanned (the scanner of `cortexkit-rich-ui-syntax` the role crate pins).
pub const DIALECT: &str = "rich-ui/1";
