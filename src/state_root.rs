//! The state root (spec §20): where WALs, leases, the catalog and `run-index.db` live.
//!
//! Resolution: `BROCA_STATE_ROOT` (non-empty) → `$XDG_DATA_HOME/cortexkit/broca` →
//! `~/.local/share/cortexkit/broca`; none available refuses to start. When `BROCA_STATE_ROOT`
//! is unset and only the legacy `broca-state` directory beside the subc connection file holds
//! data (`wal/` or `run-index.db`), broca refuses to start and names both paths.
//! Directories are created 0700; files are created 0600.

use std::path::{Path, PathBuf};

use crate::session_key::SessionKey;

/// The variables resolution reads, gathered so tests need not touch the process environment.
#[derive(Clone, Debug, Default)]
pub struct RootEnv {
    pub broca_state_root: Option<String>,
    pub xdg_data_home: Option<String>,
    pub home: Option<String>,
    /// The subc connection file, when serving as a module (for the legacy-layout check).
    pub connection_file: Option<PathBuf>,
}

impl RootEnv {
    pub fn from_process(connection_file: Option<PathBuf>) -> RootEnv {
        let var = |k| std::env::var(k).ok();
        RootEnv {
            broca_state_root: var("BROCA_STATE_ROOT"),
            xdg_data_home: var("XDG_DATA_HOME"),
            home: var("HOME"),
            connection_file,
        }
    }
}

#[derive(Debug)]
pub enum StateRootError {
    /// Neither `BROCA_STATE_ROOT`, `XDG_DATA_HOME` nor `HOME` names a place.
    Unavailable,
    /// Only the legacy directory holds data.
    LegacyOnly {
        legacy: PathBuf,
        current: PathBuf,
    },
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for StateRootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateRootError::Unavailable => write!(
                f,
                "no state root: set BROCA_STATE_ROOT, or XDG_DATA_HOME or HOME so the default ~/.local/share/cortexkit/broca resolves"
            ),
            StateRootError::LegacyOnly { legacy, current } => write!(
                f,
                "refusing to start: session data exists only in the legacy state directory {} while the state root is {}; move it there or set BROCA_STATE_ROOT={}",
                legacy.display(),
                current.display(),
                legacy.display()
            ),
            StateRootError::Io { path, source } => write!(f, "state root {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for StateRootError {}

/// A resolved, created state root.
#[derive(Clone, Debug)]
pub struct StateRoot {
    root: PathBuf,
}

const SUBDIRS: &[&str] = &["wal", "wal-durable", "wal-ephemeral", "wal-archive", "leases", "catalog"];

fn holds_data(dir: &Path) -> bool {
    dir.join("run-index.db").exists() || dir.join("wal").is_dir()
}

impl StateRoot {
    /// Resolves the root per §20 and creates its layout.
    pub fn resolve(env: &RootEnv) -> Result<StateRoot, StateRootError> {
        let nonempty = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(PathBuf::from);
        if let Some(root) = nonempty(&env.broca_state_root) {
            return StateRoot::at(&root);
        }
        let root = match (nonempty(&env.xdg_data_home), nonempty(&env.home)) {
            (Some(xdg), _) => xdg.join("cortexkit/broca"),
            (None, Some(home)) => home.join(".local/share/cortexkit/broca"),
            (None, None) => return Err(StateRootError::Unavailable),
        };
        if let Some(dir) = env.connection_file.as_deref().and_then(Path::parent) {
            let legacy = dir.join("broca-state");
            if holds_data(&legacy) && !holds_data(&root) {
                return Err(StateRootError::LegacyOnly { legacy, current: root });
            }
        }
        StateRoot::at(&root)
    }

    /// Uses `root` as the state root, creating its layout.
    pub fn at(root: &Path) -> Result<StateRoot, StateRootError> {
        for sub in std::iter::once("").chain(SUBDIRS.iter().copied()) {
            let dir = root.join(sub);
            crate::wal::ensure_private_dir(&dir).map_err(|source| StateRootError::Io { path: dir.clone(), source })?;
        }
        Ok(StateRoot { root: root.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn wal_path(&self, key: &SessionKey) -> PathBuf {
        self.root.join("wal").join(format!("{}.wal", key.addr()))
    }

    pub fn lease_path(&self, key: &SessionKey) -> PathBuf {
        self.root.join("leases").join(format!("{}.lease", key.addr()))
    }

    pub fn run_index_path(&self) -> PathBuf {
        self.root.join("run-index.db")
    }

    pub fn feature_floor_path(&self) -> PathBuf {
        self.root.join("wal-feature-floor")
    }

    pub fn catalog_path(&self) -> PathBuf {
        self.root.join("catalog/fusiform-lkg.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn env(root: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> RootEnv {
        RootEnv {
            broca_state_root: root.map(Into::into),
            xdg_data_home: xdg.map(Into::into),
            home: home.map(Into::into),
            connection_file: None,
        }
    }

    #[test]
    fn resolution_order() {
        let t = tempfile::tempdir().unwrap();
        let p = |s: &str| t.path().join(s).to_string_lossy().into_owned();
        let r = StateRoot::resolve(&env(Some(&p("a")), Some(&p("x")), Some(&p("h")))).unwrap();
        assert_eq!(r.path(), t.path().join("a"));
        let r = StateRoot::resolve(&env(Some(""), Some(&p("x")), Some(&p("h")))).unwrap();
        assert_eq!(r.path(), t.path().join("x/cortexkit/broca"));
        let r = StateRoot::resolve(&env(None, None, Some(&p("h")))).unwrap();
        assert_eq!(r.path(), t.path().join("h/.local/share/cortexkit/broca"));
        assert!(matches!(StateRoot::resolve(&env(None, Some(""), None)), Err(StateRootError::Unavailable)));
        let mode = std::fs::metadata(t.path().join("a/wal")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn legacy_only_refuses_and_names_both() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("subc/broca-state/wal")).unwrap();
        let mut e = env(None, Some(&t.path().join("x").to_string_lossy()), None);
        e.connection_file = Some(t.path().join("subc/conn.json"));
        let err = StateRoot::resolve(&e).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("subc/broca-state") && msg.contains("x/cortexkit/broca"), "{msg}");
        // Once the current root holds data, the legacy directory no longer blocks.
        std::fs::create_dir_all(t.path().join("x/cortexkit/broca/wal")).unwrap();
        assert!(StateRoot::resolve(&e).is_ok());
    }
}
