//! The daemon's connection file: where to reach it and the key that proves who it is.
//!
//! A supervised module reads exactly the file named by `--subc` (no discovery). The file is JSON:
//! `{"schema":1,"wire_version"?:2,"endpoints":[{"host","port"}],"key":[..],"daemon_id":[16],
//! "pid","daemon_ver","local_endpoint"?}`; byte arrays are JSON arrays of numbers.
//!
//! Invariants of a [`ConnectionInfo`] returned by [`read`]:
//! - the opened inode (not a second path lookup) is owned by the effective uid and has no group
//!   or other permission bit, so nobody but us could have planted the endpoint and key;
//! - `schema == 1`, `wire_version` is absent or equals `subc_protocol::PROTOCOL_VERSION`;
//! - there is at least one endpoint, the key has at least [`MIN_KEY_LEN`] bytes and the daemon id
//!   exactly [`DAEMON_ID_LEN`];
//! - the key never appears in `Debug` output.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The only connection-file schema this build reads.
pub const SCHEMA_VERSION: u32 = 1;
/// The shortest transport key accepted.
pub const MIN_KEY_LEN: usize = 32;
/// The daemon id's exact length.
pub const DAEMON_ID_LEN: usize = 16;
/// A connection file is a few hundred bytes; anything this large is not one.
const MAX_FILE_LEN: u64 = 64 * 1024;

/// One TCP endpoint of the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// The host without IPv6 brackets (`[::1]` → `::1`), ready for `(host, port)` resolution.
    pub fn bare_host(&self) -> &str {
        self.host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&self.host)
    }
}

/// A validated connection file.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub schema: u32,
    pub wire_version: Option<u8>,
    pub endpoints: Vec<Endpoint>,
    pub key: Vec<u8>,
    pub daemon_id: [u8; DAEMON_ID_LEN],
    pub pid: Option<u32>,
    pub daemon_ver: String,
}

impl fmt::Debug for ConnectionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionInfo")
            .field("schema", &self.schema)
            .field("wire_version", &self.wire_version)
            .field("endpoints", &self.endpoints)
            .field("key", &format_args!("<{} bytes redacted>", self.key.len()))
            .field("daemon_id", &self.daemon_id)
            .field("pid", &self.pid)
            .field("daemon_ver", &self.daemon_ver)
            .finish()
    }
}

/// The on-disk shape, before validation.
#[derive(Deserialize)]
struct Raw {
    schema: u32,
    #[serde(default)]
    wire_version: Option<u8>,
    endpoints: Vec<Endpoint>,
    key: Vec<u8>,
    daemon_id: Vec<u8>,
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    daemon_ver: String,
}

/// Why a connection file was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectionFileError {
    /// The file could not be opened, stat'ed or read.
    Io { path: PathBuf, source: io::Error },
    /// The file belongs to another user, who could have substituted endpoint and key.
    NotOwner { path: PathBuf, owner_uid: u32, euid: u32 },
    /// Group or other permission bits are set: the key is exposed beyond the owner.
    InsecurePermissions { path: PathBuf, mode: u32 },
    /// The file is larger than any connection file.
    TooLarge { path: PathBuf, len: u64 },
    /// The bytes are not a connection file.
    Json(serde_json::Error),
    /// A schema this build does not read.
    UnsupportedSchema { schema: u32 },
    /// The daemon speaks another envelope version.
    WireVersionMismatch { file: u8, supported: u8 },
    /// No endpoint to connect to.
    NoEndpoint,
    /// The key is shorter than [`MIN_KEY_LEN`].
    KeyTooShort { len: usize },
    /// The daemon id is not [`DAEMON_ID_LEN`] bytes.
    BadDaemonId { len: usize },
}

impl fmt::Display for ConnectionFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, source } => write!(f, "connection file {}: {source}", path.display()),
            Self::NotOwner { path, owner_uid, euid } => write!(
                f,
                "connection file {} is owned by uid {owner_uid}, expected effective uid {euid}",
                path.display()
            ),
            Self::InsecurePermissions { path, mode } => {
                write!(f, "connection file {} has mode {mode:o}; group/other bits must be clear", path.display())
            }
            Self::TooLarge { path, len } => write!(f, "connection file {} is {len} bytes; too large", path.display()),
            Self::Json(e) => write!(f, "connection file is not valid: {e}"),
            Self::UnsupportedSchema { schema } => {
                write!(f, "connection file schema {schema} is not supported (expected {SCHEMA_VERSION})")
            }
            Self::WireVersionMismatch { file, supported } => {
                write!(f, "daemon speaks wire version {file}; this build speaks {supported}")
            }
            Self::NoEndpoint => write!(f, "connection file lists no endpoint"),
            Self::KeyTooShort { len } => write!(f, "connection key is {len} bytes; at least {MIN_KEY_LEN} required"),
            Self::BadDaemonId { len } => write!(f, "daemon id is {len} bytes; expected {DAEMON_ID_LEN}"),
        }
    }
}

impl std::error::Error for ConnectionFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Json(e) => Some(e),
            _ => None,
        }
    }
}

/// Reads and validates the connection file at `path`.
pub fn read(path: &Path) -> Result<ConnectionInfo, ConnectionFileError> {
    let io_err = |source| ConnectionFileError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_err)?;
    // Check the opened inode: swapping the path after this point cannot bring in another file.
    let meta = file.metadata().map_err(io_err)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    check_owner_only(path, meta.uid(), meta.mode(), euid)?;
    if meta.len() > MAX_FILE_LEN {
        return Err(ConnectionFileError::TooLarge { path: path.to_path_buf(), len: meta.len() });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_FILE_LEN + 1).read_to_end(&mut bytes).map_err(io_err)?;
    parse(&bytes)
}

fn check_owner_only(path: &Path, owner_uid: u32, mode: u32, euid: u32) -> Result<(), ConnectionFileError> {
    if owner_uid != euid {
        return Err(ConnectionFileError::NotOwner { path: path.to_path_buf(), owner_uid, euid });
    }
    if mode & 0o077 != 0 {
        return Err(ConnectionFileError::InsecurePermissions { path: path.to_path_buf(), mode: mode & 0o777 });
    }
    Ok(())
}

/// Parses and validates connection-file bytes (no ownership check: see [`read`]).
pub fn parse(bytes: &[u8]) -> Result<ConnectionInfo, ConnectionFileError> {
    let raw: Raw = serde_json::from_slice(bytes).map_err(ConnectionFileError::Json)?;
    if raw.schema != SCHEMA_VERSION {
        return Err(ConnectionFileError::UnsupportedSchema { schema: raw.schema });
    }
    let supported = subc_protocol::PROTOCOL_VERSION;
    if let Some(file) = raw.wire_version.filter(|v| *v != supported) {
        return Err(ConnectionFileError::WireVersionMismatch { file, supported });
    }
    if raw.endpoints.is_empty() {
        return Err(ConnectionFileError::NoEndpoint);
    }
    if raw.key.len() < MIN_KEY_LEN {
        return Err(ConnectionFileError::KeyTooShort { len: raw.key.len() });
    }
    let daemon_id: [u8; DAEMON_ID_LEN] = raw
        .daemon_id
        .as_slice()
        .try_into()
        .map_err(|_| ConnectionFileError::BadDaemonId { len: raw.daemon_id.len() })?;
    Ok(ConnectionInfo {
        schema: raw.schema,
        wire_version: raw.wire_version,
        endpoints: raw.endpoints,
        key: raw.key,
        daemon_id,
        pid: raw.pid,
        daemon_ver: raw.daemon_ver,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn doc(key_len: usize, id_len: usize) -> String {
        let key: Vec<u8> = (0..key_len as u8).collect();
        let id: Vec<u8> = (0..id_len as u8).collect();
        serde_json::json!({
            "schema": 1, "wire_version": 2,
            "endpoints": [{"host": "127.0.0.1", "port": 8757}, {"host": "::1", "port": 8757}],
            "key": key, "daemon_id": id, "pid": 42, "daemon_ver": "0.39.3",
            "local_endpoint": {"kind": "unix", "path": "/tmp/x/subc.sock"}
        })
        .to_string()
    }

    #[test]
    fn a_valid_file_parses_and_its_key_is_redacted() {
        let info = parse(doc(32, 16).as_bytes()).unwrap();
        assert_eq!(info.endpoints[0], Endpoint { host: "127.0.0.1".into(), port: 8757 });
        assert_eq!(info.daemon_id[15], 15);
        assert_eq!(info.pid, Some(42));
        let shown = format!("{info:?}");
        assert!(shown.contains("<32 bytes redacted>"), "{shown}");
        assert!(!shown.contains("31"), "key bytes leaked: {shown}");
    }

    #[test]
    fn invalid_files_are_refused_by_name() {
        assert!(matches!(parse(doc(31, 16).as_bytes()), Err(ConnectionFileError::KeyTooShort { len: 31 })));
        assert!(matches!(parse(doc(32, 15).as_bytes()), Err(ConnectionFileError::BadDaemonId { len: 15 })));
        let mut v: serde_json::Value = serde_json::from_str(&doc(32, 16)).unwrap();
        v["schema"] = 2.into();
        assert!(matches!(parse(v.to_string().as_bytes()), Err(ConnectionFileError::UnsupportedSchema { schema: 2 })));
        v["schema"] = 1.into();
        v["wire_version"] = 3.into();
        assert!(matches!(parse(v.to_string().as_bytes()), Err(ConnectionFileError::WireVersionMismatch { .. })));
        v["wire_version"] = serde_json::Value::Null;
        v["endpoints"] = serde_json::json!([]);
        assert!(matches!(parse(v.to_string().as_bytes()), Err(ConnectionFileError::NoEndpoint)));
        assert!(matches!(parse(b"{\"schema\":1}"), Err(ConnectionFileError::Json(_))));
    }

    #[test]
    fn ownership_and_mode_are_checked_on_the_opened_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subc-connection.json");
        std::fs::write(&path, doc(32, 16)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(read(&path), Err(ConnectionFileError::InsecurePermissions { mode: 0o640, .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).unwrap().daemon_ver, "0.39.3");
        let err = check_owner_only(&path, 4242, 0o100600, 1000).unwrap_err();
        assert!(matches!(err, ConnectionFileError::NotOwner { owner_uid: 4242, euid: 1000, .. }));
        assert!(matches!(read(&dir.path().join("absent")), Err(ConnectionFileError::Io { .. })));
    }

    #[test]
    fn bracketed_ipv6_hosts_are_unwrapped() {
        assert_eq!(Endpoint { host: "[::1]".into(), port: 1 }.bare_host(), "::1");
        assert_eq!(Endpoint { host: "127.0.0.1".into(), port: 1 }.bare_host(), "127.0.0.1");
    }
}
