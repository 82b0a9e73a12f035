//! The run index's one error type: every store operation fails with a [`StoreError`].

use std::path::PathBuf;

#[derive(Debug)]
pub enum StoreError {
    Sqlite(rusqlite::Error),
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A stored row does not decode (the database is damaged; rebuild it).
    Damaged(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Sqlite(e) => write!(f, "run-index.db: {e}"),
            StoreError::Io { path, source } => {
                write!(f, "run-index.db {}: {source}", path.display())
            }
            StoreError::Damaged(what) => write!(f, "run-index.db holds an unreadable row: {what}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl StoreError {
    /// How an op answers a failed index read: transient (the WAL is the truth; retry).
    pub fn refusal(&self) -> crate::wire::Refusal {
        let detail = Some(crate::detail!("class" => "transient"));
        crate::wire::Refusal::new(crate::wire::RefusalCode::OpenFailed, format!("open failed: {self}"), detail)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e)
    }
}
