//! Record builders shared by broca's tests, property checks and benchmarks, and the raw-fsync
//! anchor the benchmarks read their figures against. Not part of the engine: broca depends on
//! this package only as a dev-dependency (issue #45).
//!
//! [`records.rs`](records) names broca's types as `crate::message` and `crate::record`, so the
//! same file also compiles inside broca, where its own unit tests include it by path
//! (`src/replay/tests.rs`); here those two paths are broca's modules, imported at the root.

// Read by `records.rs` as `crate::message` and `crate::record`.
use broca::{message, record};

mod records;

pub use records::*;
