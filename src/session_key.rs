//! A session's identity: the bind triple `{project_root, harness, session}` and the address
//! derived from it.
//!
//! Derivation (stable; changing it orphans every WAL): `project_root` with trailing `/`
//! removed (a bare `/` stays `/`); then SHA-256 over the ASCII tag `broca-session/v1` followed by
//! each of the three fields as a u64 little-endian byte length and its UTF-8 bytes. The first
//! 16 bytes of the digest are the lineage id; their lowercase hex (32 characters) is `<addr>`,
//! the file stem of `wal/<addr>.wal` and `leases/<addr>.lease`.

use sha2::{Digest, Sha256};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub project_root: String,
    pub harness: String,
    pub session: String,
}

impl SessionKey {
    pub fn new(project_root: &str, harness: &str, session: &str) -> SessionKey {
        let trimmed = project_root.trim_end_matches('/');
        let project_root = if trimmed.is_empty() && project_root.starts_with('/') { "/" } else { trimmed };
        SessionKey { project_root: project_root.into(), harness: harness.into(), session: session.into() }
    }

    /// The 16-byte lineage id.
    pub fn lineage_id(&self) -> [u8; 16] {
        let mut h = Sha256::new();
        h.update(b"broca-session/v1");
        for field in [&self.project_root, &self.harness, &self.session] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        let digest = h.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        id
    }

    /// The session address: lowercase hex of the lineage id.
    pub fn addr(&self) -> String {
        hex(&self.lineage_id())
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn trailing_slash_is_ignored_and_fields_do_not_run_together() {
        assert_eq!(SessionKey::new("/p/", "h", "s").addr(), SessionKey::new("/p", "h", "s").addr());
        assert_eq!(SessionKey::new("/", "h", "s").project_root, "/");
        assert_ne!(SessionKey::new("/p", "ab", "c").addr(), SessionKey::new("/p", "a", "bc").addr());
        assert_eq!(SessionKey::new("/p", "h", "s").addr().len(), 32);
    }

    #[test]
    fn derivation_is_pinned() {
        // Changing this value orphans every existing WAL: see the module doc.
        assert_eq!(SessionKey::new("/work/proj", "broca-run", "s1").addr(), PINNED_ADDR);
    }

    const PINNED_ADDR: &str = "f46bbe945ffda0473fb757c9a69934e6";
}
