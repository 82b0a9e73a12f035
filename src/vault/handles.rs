//! broca-run's dev-tools handles (`catalog-and-vault.md` Part E): a map from credential id to a
//! `ckh_` capability handle, read with `credential.get {handle}` through subc.
//!
//! The file is `BROCA_DEVTOOLS_HANDLES` (an empty value is ignored) or
//! `$HOME/.config/cortexkit/broca/dev-tools-handles.json`, shaped like the public vault-handles
//! file: `{"handles": {"<credential id>": "ckh_…"}}`. The loader follows that pattern's rules:
//!
//! - opened once with `O_NOFOLLOW` and checked from that descriptor: a symlink is refused, the
//!   file must be regular with no group or world permission bits;
//! - a missing file is an empty map (authoritative, no warning);
//! - a symlink, wrong mode, non-regular or unreadable file, malformed JSON, a duplicate key (top
//!   level or credential id), a missing `handles`, or any bad entry (a handle without the `ckh_`
//!   prefix, an id or handle with surrounding whitespace or a control character) gives an empty
//!   map with a warning naming why (one bad entry rejects the whole file); unknown top-level
//!   keys are ignored.
//!
//! A one-shot CLI has no previous snapshot to keep on a transient I/O error, so that is an
//! empty map with a warning too.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};

/// The variable naming the handles file.
pub const DEVTOOLS_HANDLES_ENV: &str = "BROCA_DEVTOOLS_HANDLES";
/// The handles file's default place under `$HOME`.
pub const DEVTOOLS_HANDLES_HOME_PATH: &str = ".config/cortexkit/broca/dev-tools-handles.json";
/// Every handle starts with this.
pub const HANDLE_PREFIX: &str = "ckh_";
/// The largest handles file read (a map of a few ids; anything bigger is not one).
pub const HANDLES_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// The handles file `BROCA_DEVTOOLS_HANDLES` or `$HOME` names (`None`: neither is set).
pub fn devtools_handles_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    match env(DEVTOOLS_HANDLES_ENV).filter(|v| !v.is_empty()) {
        Some(path) => Some(PathBuf::from(path)),
        None => env("HOME").filter(|h| !h.is_empty()).map(|h| Path::new(&h).join(DEVTOOLS_HANDLES_HOME_PATH)),
    }
}

/// A loaded handles map: credential id → handle. Never printed whole (a handle is a capability).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Handles {
    entries: BTreeMap<String, String>,
}

impl fmt::Debug for Handles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handles").field("ids", &self.entries.keys().collect::<Vec<_>>()).finish()
    }
}

impl Handles {
    pub fn get(&self, credential_id: &str) -> Option<&str> {
        self.entries.get(credential_id).map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The credential ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }
}

/// What loading the file gave: the map (empty when the file was refused) and the warning that
/// says why it was refused.
#[derive(Debug)]
pub struct Loaded {
    pub handles: Handles,
    pub warning: Option<String>,
}

/// Loads `path` by the rules above.
pub fn load(path: &Path) -> Loaded {
    match read_checked(path).and_then(|bytes| parse(&bytes)) {
        Ok(handles) => Loaded { handles, warning: None },
        Err(Refused::Missing) => Loaded { handles: Handles::default(), warning: None },
        Err(Refused::Why(why)) => Loaded {
            handles: Handles::default(),
            warning: Some(format!("dev-tools handles {}: {why}; using no handles", path.display())),
        },
    }
}

enum Refused {
    Missing,
    Why(String),
}

fn read_checked(path: &Path) -> Result<Vec<u8>, Refused> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Refused::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Refused::Why("is a symlink (refused)".into())),
        Err(e) => return Err(Refused::Why(format!("cannot be opened: {e}"))),
    };
    let meta = file.metadata().map_err(|e| Refused::Why(format!("cannot be inspected: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(Refused::Why("is not a regular file".into()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Refused::Why(format!(
            "has mode {:o}; it must be 0600 (no group or world bits)",
            meta.mode() & 0o777
        )));
    }
    if meta.len() > HANDLES_FILE_MAX_BYTES {
        return Err(Refused::Why(format!("is larger than {HANDLES_FILE_MAX_BYTES} bytes")));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&mut file)
        .take(HANDLES_FILE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Refused::Why(format!("cannot be read: {e}")))?;
    Ok(bytes)
}

fn parse(bytes: &[u8]) -> Result<Handles, Refused> {
    let file: HandlesFile =
        serde_json::from_slice(bytes).map_err(|e| Refused::Why(format!("is not a handles file: {e}")))?;
    let bad: Vec<&str> = file
        .handles
        .iter()
        .filter(|(id, handle)| !clean(id) || !clean(handle) || !handle.starts_with(HANDLE_PREFIX))
        .map(|(id, _)| id.as_str())
        .collect();
    if !bad.is_empty() {
        let ids = bad.iter().map(|id| format!("{:?}", id.escape_debug().to_string())).collect::<Vec<_>>().join(", ");
        return Err(Refused::Why(format!(
            "bad entries for {ids} (a handle starts with {HANDLE_PREFIX:?}; no surrounding whitespace or control characters)"
        )));
    }
    Ok(Handles { entries: file.handles })
}

/// No surrounding whitespace, no control characters, not empty.
fn clean(s: &str) -> bool {
    !s.is_empty() && s.trim() == s && !s.chars().any(char::is_control)
}

/// The file's shape, decoded with duplicate keys refused at both levels.
struct HandlesFile {
    handles: BTreeMap<String, String>,
}

impl<'de> serde::Deserialize<'de> for HandlesFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Top;
        impl<'de> Visitor<'de> for Top {
            type Value = HandlesFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object with a \"handles\" object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HandlesFile, A::Error> {
                let mut seen = std::collections::BTreeSet::new();
                let mut handles = None;
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(A::Error::custom(format!("duplicate top-level key {key:?}")));
                    }
                    if key == "handles" {
                        handles = Some(map.next_value::<UniqueMap>()?.0);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                handles.map(|handles| HandlesFile { handles }).ok_or_else(|| A::Error::missing_field("handles"))
            }
        }
        d.deserialize_map(Top)
    }
}

/// A string-to-string object whose keys are unique.
struct UniqueMap(BTreeMap<String, String>);

impl<'de> serde::Deserialize<'de> for UniqueMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = UniqueMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of credential id to handle strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((id, handle)) = map.next_entry::<String, String>()? {
                    if out.contains_key(&id) {
                        return Err(A::Error::custom(format!("duplicate credential id {id:?}")));
                    }
                    out.insert(id, handle);
                }
                Ok(UniqueMap(out))
            }
        }
        d.deserialize_map(Entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn refused(loaded: &Loaded, why: &str) {
        assert!(loaded.handles.is_empty(), "{loaded:?}");
        let warning = loaded.warning.as_deref().unwrap_or_default();
        assert!(warning.contains(why), "{warning:?} should say {why:?}");
    }

    #[test]
    fn a_good_file_loads_and_unknown_top_level_keys_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "h.json", r#"{"v":1,"handles":{"apikey:openai":"ckh_abc"}}"#, 0o600);
        let loaded = load(&path);
        assert_eq!(loaded.warning, None);
        assert_eq!(loaded.handles.get("apikey:openai"), Some("ckh_abc"));
        assert!(!format!("{:?}", loaded.handles).contains("ckh_abc"), "Debug never shows a handle");
    }

    #[test]
    fn a_missing_file_is_an_empty_map_without_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(&dir.path().join("absent.json"));
        assert!(loaded.handles.is_empty() && loaded.warning.is_none());
    }

    #[test]
    fn every_loader_rule_refuses_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let good = write(d, "good.json", r#"{"handles":{"apikey:a":"ckh_a"}}"#, 0o600);
        std::os::unix::fs::symlink(&good, d.join("link.json")).unwrap();
        refused(&load(&d.join("link.json")), "symlink");
        refused(&load(&write(d, "open.json", r#"{"handles":{"apikey:a":"ckh_a"}}"#, 0o644)), "mode 644");
        refused(&load(&write(d, "group.json", r#"{"handles":{"apikey:a":"ckh_a"}}"#, 0o640)), "0600");
        std::fs::create_dir(d.join("dir.json")).unwrap();
        refused(&load(&d.join("dir.json")), "not a regular file");
        refused(&load(&write(d, "bad.json", "{not json", 0o600)), "not a handles file");
        refused(&load(&write(d, "nohandles.json", r#"{"other":{}}"#, 0o600)), "handles");
        let dup_top = r#"{"handles":{"apikey:a":"ckh_a"},"handles":{}}"#;
        refused(&load(&write(d, "duptop.json", dup_top, 0o600)), "duplicate top-level key");
        let dup_id = r#"{"handles":{"apikey:a":"ckh_a","apikey:a":"ckh_b"}}"#;
        refused(&load(&write(d, "dupid.json", dup_id, 0o600)), "duplicate credential id");
        let one_bad = r#"{"handles":{"apikey:a":"ckh_a","apikey:b":"sk-live"}}"#;
        refused(&load(&write(d, "prefix.json", one_bad, 0o600)), "apikey:b");
        let spaced = r#"{"handles":{" apikey:a":"ckh_a"}}"#;
        refused(&load(&write(d, "space.json", spaced, 0o600)), "bad entries");
        let control = "{\"handles\":{\"apikey:a\":\"ckh_a\\u0007\"}}";
        refused(&load(&write(d, "ctl.json", control, 0o600)), "bad entries");
        refused(&load(&write(d, "notstr.json", r#"{"handles":{"apikey:a":7}}"#, 0o600)), "not a handles file");
    }

    #[test]
    fn the_path_comes_from_the_variable_else_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(devtools_handles_path(env(&[(DEVTOOLS_HANDLES_ENV, "/x/h.json")])), Some("/x/h.json".into()));
        let home = devtools_handles_path(env(&[(DEVTOOLS_HANDLES_ENV, ""), ("HOME", "/home/u")]));
        assert_eq!(home, Some(PathBuf::from("/home/u/.config/cortexkit/broca/dev-tools-handles.json")));
        assert_eq!(devtools_handles_path(env(&[])), None);
    }
}
