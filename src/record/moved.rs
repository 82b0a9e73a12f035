//! The `moved_out` tombstone (DESIGN §8 "Moving a session"): the last record a host writes to
//! a session it exported. From it on this host's copy is read-only (reads skip the record, so
//! they stay byte-identical to the copy the target adopted); a send is refused
//! `session_moved`. The archive the export wrote holds every frame before it.

use serde::{Deserialize, Serialize};

/// A session handed to another host (`session-move/v1`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedOut {
    /// The lease epoch the export held: the importer's tenure starts above it.
    pub epoch: u64,
    /// The WAL bytes the archive holds (everything before this record).
    pub wal_bytes: u64,
    /// Their SHA-256, lowercase hex.
    pub wal_sha256: String,
    pub at_ms: u64,
}
