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

/// Which live-WAL tree a session's WAL lives in (spec: session class and backup placement).
///
/// A session's placement is decided once, when its WAL is created at its first send; nothing
/// moves a WAL between trees afterwards. Addressing and leases stay keyed by the session triple
/// whatever the tree, so one session has at most one live WAL across the three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// `wal/`: unclassed sessions and classes not listed in `backup_classes`.
    #[default]
    Standard,
    /// `wal-durable/`: sessions whose class is listed in `backup_classes` (backed up).
    Durable,
    /// `wal-ephemeral/`: sessions sent with retention; never backed up or folded.
    Ephemeral,
}

impl Placement {
    /// Every placement, in the order [`StateRoot::wal_path`] looks for an existing WAL.
    pub const LOOKUP_ORDER: [Placement; 3] = [Placement::Standard, Placement::Durable, Placement::Ephemeral];

    /// The tree's directory name under the state root.
    pub fn dir_name(self) -> &'static str {
        match self {
            Placement::Standard => "wal",
            Placement::Durable => "wal-durable",
            Placement::Ephemeral => "wal-ephemeral",
        }
    }
}

/// A resolved, created state root.
#[derive(Clone, Debug)]
pub struct StateRoot {
    root: PathBuf,
}

/// The operator's configuration file inside the state root (`broca.jsonc`).
pub const CONFIG_FILE_NAME: &str = "broca.jsonc";

const SUBDIRS: &[&str] =
    &["wal", "wal-durable", "wal-ephemeral", "wal-archive", "wal-archive-durable", "leases", "catalog"];

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

    /// The session's live WAL: the existing file among `wal/`, `wal-durable/` and
    /// `wal-ephemeral/` (looked up in that order), else the standard path in `wal/` (where a
    /// caller that does not choose a placement would create it).
    pub fn wal_path(&self, key: &SessionKey) -> PathBuf {
        let placement = self.placement_of(key).unwrap_or_default();
        self.placed_file(key, placement)
    }

    /// The tree holding the session's existing live WAL, if any (first in
    /// [`Placement::LOOKUP_ORDER`]).
    pub fn placement_of(&self, key: &SessionKey) -> Option<Placement> {
        Placement::LOOKUP_ORDER.into_iter().find(|&p| self.placed_file(key, p).exists())
    }

    /// The path a NEW session's WAL is created at in `placement`'s tree. The tree's directory
    /// is created (0700) if it went missing since boot; if that fails, the failure surfaces
    /// when the WAL is created there, naming the path.
    pub fn wal_path_placed(&self, key: &SessionKey, placement: Placement) -> PathBuf {
        let dir = self.root.join(placement.dir_name());
        if !dir.is_dir() {
            if let Err(e) = crate::wal::ensure_private_dir(&dir) {
                log::warn!("cannot create the wal directory {}: {e}", dir.display());
            }
        }
        self.placed_file(key, placement)
    }

    fn placed_file(&self, key: &SessionKey, placement: Placement) -> PathBuf {
        self.root.join(placement.dir_name()).join(format!("{}.wal", key.addr()))
    }

    /// `broca.jsonc`, the operator's configuration (the config layer reads it).
    pub fn config_path(&self) -> PathBuf {
        self.root.join(CONFIG_FILE_NAME)
    }

    pub fn lease_path(&self, key: &SessionKey) -> PathBuf {
        self.lease_path_of(&key.addr())
    }

    /// [`StateRoot::lease_path`] of the session at address `addr`.
    pub fn lease_path_of(&self, addr: &str) -> PathBuf {
        self.root.join("leases").join(format!("{addr}.lease"))
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

    fn key() -> SessionKey {
        SessionKey::new("/work/proj", "state-root-test", "s1")
    }

    #[test]
    fn every_placement_tree_is_created_private() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::at(t.path()).unwrap();
        for p in Placement::LOOKUP_ORDER {
            assert!(SUBDIRS.contains(&p.dir_name()), "{p:?}");
            let mode = std::fs::metadata(t.path().join(p.dir_name())).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{p:?}");
        }
        assert_eq!(root.config_path(), t.path().join("broca.jsonc"));
    }

    #[test]
    fn placed_paths_are_in_their_trees() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::at(t.path()).unwrap();
        let file = format!("{}.wal", key().addr());
        assert_eq!(root.wal_path_placed(&key(), Placement::Standard), t.path().join("wal").join(&file));
        assert_eq!(root.wal_path_placed(&key(), Placement::Durable), t.path().join("wal-durable").join(&file));
        assert_eq!(root.wal_path_placed(&key(), Placement::Ephemeral), t.path().join("wal-ephemeral").join(&file));
        // A tree removed after boot is recreated 0700 when a new session is placed in it.
        std::fs::remove_dir(t.path().join("wal-durable")).unwrap();
        let path = root.wal_path_placed(&key(), Placement::Durable);
        let mode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn wal_path_finds_the_existing_wal_in_lookup_order() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::at(t.path()).unwrap();
        let placed = |p| root.wal_path_placed(&key(), p);
        // Nothing exists yet: the standard path.
        assert_eq!(root.placement_of(&key()), None);
        assert_eq!(root.wal_path(&key()), placed(Placement::Standard));
        std::fs::write(placed(Placement::Ephemeral), b"").unwrap();
        assert_eq!(root.placement_of(&key()), Some(Placement::Ephemeral));
        assert_eq!(root.wal_path(&key()), placed(Placement::Ephemeral));
        std::fs::write(placed(Placement::Durable), b"").unwrap();
        assert_eq!(root.wal_path(&key()), placed(Placement::Durable));
        std::fs::write(placed(Placement::Standard), b"").unwrap();
        assert_eq!(root.wal_path(&key()), placed(Placement::Standard));
        // Another session's WAL is not this one's, and a temp file is not a WAL.
        let other = SessionKey::new("/work/proj", "state-root-test", "s2");
        assert_eq!(root.wal_path(&other), root.wal_path_placed(&other, Placement::Standard));
        let tmp = root.wal_path_placed(&other, Placement::Durable).with_extension("wal.tmp");
        std::fs::write(tmp, b"").unwrap();
        assert_eq!(root.placement_of(&other), None);
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
