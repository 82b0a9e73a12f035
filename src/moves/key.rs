//! The move key (`<state root>/move.key`): the secret that makes an archive prove where it came
//! from (#44). `move.export` seals each archive with HMAC-SHA256 under it and
//! `move.adopt` trusts nothing in an archive before its seal checks out under its own key, so
//! only hosts that share the key exchange sessions; an archive written by anyone else (forged,
//! edited, or from a host outside the group) is refused `archive_invalid {reason: "unverified"}`.
//!
//! Provisioning: a host makes its own key (32 bytes from the OS's random source, stored as 64
//! hex digits, mode 0600, created with `O_EXCL`) at its first export or adopt. Hosts that move
//! sessions between them share one key: the operator copies `move.key` from one state root to
//! the others (same bytes, mode 0600) before the first move (docs/security.md). The key never
//! leaves the state root through broca: no op reads or serves it.

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The key file's name under the state root.
pub const FILE: &str = "move.key";
/// Key bytes.
const KEY_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// A host's move key. Its bytes are never printed (`Debug` names only the fingerprint).
#[derive(Clone)]
pub struct MoveKey([u8; KEY_LEN]);

impl std::fmt::Debug for MoveKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MoveKey({})", self.fingerprint())
    }
}

impl MoveKey {
    /// The key of the state root at `root`, made now if it has none.
    pub fn load_or_create(root: &Path) -> io::Result<MoveKey> {
        let path = root.join(FILE);
        match read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => match create(&path) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(&path),
                other => other,
            },
            other => other,
        }
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> MoveKey {
        MoveKey(bytes)
    }

    /// The seal of `body`: HMAC-SHA256, lowercase hex.
    pub fn seal(&self, body: &[u8]) -> String {
        crate::session_key::hex(&self.mac(body).finalize().into_bytes())
    }

    /// Whether `seal` (hex) is `body`'s seal under this key (compared in constant time).
    pub fn verifies(&self, body: &[u8], seal: &[u8]) -> bool {
        let Some(tag) = unhex(seal) else { return false };
        self.mac(body).verify_slice(&tag).is_ok()
    }

    /// A short, non-secret name of the key (to compare two hosts' keys by eye): the first 8
    /// bytes of SHA-256 over a fixed label and the key.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let digest = Sha256::new().chain_update(b"broca-move-key-fingerprint/v1").chain_update(self.0).finalize();
        crate::session_key::hex(&digest[..8])
    }

    fn mac(&self, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(body);
        mac
    }
}

/// The key file's path under `root`.
pub fn path(root: &Path) -> PathBuf {
    root.join(FILE)
}

fn read(path: &Path) -> io::Result<MoveKey> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    if !meta.is_file() {
        return Err(invalid("not a regular file"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(invalid("readable by others than its owner: chmod 600 it"));
    }
    let mut text = String::new();
    file.take(KEY_LEN as u64 * 2 + 2).read_to_string(&mut text).map_err(|_| invalid("not hex"))?;
    let bytes = unhex(text.trim_end().as_bytes()).ok_or_else(|| invalid("not 64 hex digits"))?;
    let key: [u8; KEY_LEN] = bytes.try_into().map_err(|_| invalid("not 64 hex digits"))?;
    Ok(MoveKey(key))
}

fn create(path: &Path) -> io::Result<MoveKey> {
    let mut key = [0u8; KEY_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let tmp = path.with_extension(format!("key.{}.tmp", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        writeln!(file, "{}", crate::session_key::hex(&key))?;
        file.sync_all()?;
        // A link never replaces a key another process made meanwhile.
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    written?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(MoveKey(key))
}

/// Lowercase hex only: one spelling per value, so no byte of a sealed archive can change and
/// still verify.
fn unhex(hex: &[u8]) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' | b'a'..=b'f' => (b as char).to_digit(16),
        _ => None,
    };
    hex.chunks(2).map(|p| Some((digit(p[0])? * 16 + digit(p[1])?) as u8)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let key = MoveKey::load_or_create(tmp.path()).unwrap();
        let again = MoveKey::load_or_create(tmp.path()).unwrap();
        assert_eq!(key.fingerprint(), again.fingerprint());
        assert_eq!(std::fs::metadata(path(tmp.path())).unwrap().mode() & 0o777, 0o600);
        let seal = key.seal(b"body");
        assert!(again.verifies(b"body", seal.as_bytes()));
        assert!(!again.verifies(b"bodY", seal.as_bytes()));
        let other = MoveKey::from_bytes([7; KEY_LEN]);
        assert!(!other.verifies(b"body", seal.as_bytes()), "another host's key");
        assert!(!key.verifies(b"body", b"zz"));
        assert!(!key.verifies(b"body", seal.to_uppercase().as_bytes()), "one spelling per seal");
        assert!(!format!("{key:?}").contains(&crate::session_key::hex(&key.0)), "Debug never prints the key");
    }

    #[test]
    fn a_key_readable_by_others_or_behind_a_link_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        MoveKey::load_or_create(tmp.path()).unwrap();
        let p = path(tmp.path());
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        assert!(MoveKey::load_or_create(tmp.path()).is_err());
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&p, path(other.path())).unwrap();
        assert!(MoveKey::load_or_create(other.path()).is_err());
    }
}
