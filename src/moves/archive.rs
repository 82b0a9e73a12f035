//! The session archive a move carries between hosts (`session.export` writes it,
//! `session.adopt` reads it): self-checking, and never trusted before it checks out.
//!
//! ```text
//! broca-session-archive/v1\n
//! <header: one line of JSON>\n
//! <wal_bytes bytes of the WAL, from its header to the frame before the tombstone>
//! \nsha256 <64 hex digits: the digest of every byte before this line>\n
//! ```
//!
//! The WAL bytes are the exporting host's, unchanged: incarnation, seqs and epochs stay as
//! they were, so reads on the adopting host are byte-identical. Invariants a read checks: the
//! magic line, a header naming the session's triple and address, exactly `wal_bytes` bytes
//! whose SHA-256 is `wal_sha256`, and the trailer digest over all of it. Frame-level checks
//! (every frame's CRC, the lineage id, the replay) are the adopter's, on the written file.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::session_key::SessionKey;

pub const MAGIC: &str = "broca-session-archive/v1";
/// The largest archive read (`move.archive_max_bytes`): past it the archive is refused.
pub const MAX_ARCHIVE_BYTES: u64 = 256 << 20;
/// The longest header line read.
const MAX_HEADER_BYTES: usize = 16 << 10;

/// What an archive says about the session it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub addr: String,
    pub project_root: String,
    pub harness: String,
    pub session: String,
    /// The WAL header's incarnation (UUID), kept by the move.
    pub incarnation: String,
    /// The exporting host's lease epoch: the adopter's tenure starts above it.
    pub epoch: u64,
    /// The live tree the session lived in (`wal`, `wal-durable`, `wal-ephemeral`): its
    /// backup class travels with it.
    pub tree: String,
    pub wal_bytes: u64,
    pub wal_sha256: String,
    pub exported_at_ms: u64,
    /// The exporting daemon's machine id, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_machine: Option<String>,
}

impl Header {
    pub fn key(&self) -> SessionKey {
        SessionKey::new(&self.project_root, &self.harness, &self.session)
    }
}

/// Why an archive was refused (`archive_invalid`, `detail.reason`).
#[derive(Debug)]
pub enum ArchiveError {
    Unreadable(std::io::Error),
    TooLarge { limit: u64 },
    Malformed(&'static str),
    DigestMismatch(&'static str),
}

impl ArchiveError {
    /// The `detail.reason` served.
    pub fn reason(&self) -> &'static str {
        match self {
            ArchiveError::Unreadable(_) => "unreadable",
            ArchiveError::TooLarge { .. } => "too_large",
            ArchiveError::Malformed(_) => "malformed",
            ArchiveError::DigestMismatch(_) => "digest_mismatch",
        }
    }
}

impl std::fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArchiveError::Unreadable(e) => write!(f, "the archive cannot be read: {e}"),
            ArchiveError::TooLarge { limit } => write!(f, "the archive is larger than {limit} bytes"),
            ArchiveError::Malformed(what) => write!(f, "the archive is malformed: {what}"),
            ArchiveError::DigestMismatch(what) => {
                write!(f, "the archive does not check out: {what} digest does not match")
            }
        }
    }
}

pub use crate::actor::moving::sha256_hex;

/// The archive's bytes.
pub fn encode(header: &Header, wal: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(wal.len() + 512);
    out.extend_from_slice(MAGIC.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&serde_json::to_vec(header).expect("a header serializes"));
    out.push(b'\n');
    out.extend_from_slice(wal);
    let digest = sha256_hex(&out);
    out.extend_from_slice(format!("\nsha256 {digest}\n").as_bytes());
    out
}

/// Writes the archive at `path` atomically: a temp file beside it, fsync, rename, fsync of
/// the directory. `before_rename` runs between the fsync and the rename (a fail point).
pub fn write_atomic(path: &Path, bytes: &[u8], before_rename: impl FnOnce()) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.partial"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    before_rename();
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reads and checks the archive at `path`: its header and WAL bytes.
pub fn read(path: &Path) -> Result<(Header, Vec<u8>), ArchiveError> {
    let len = std::fs::metadata(path).map_err(ArchiveError::Unreadable)?.len();
    if len > MAX_ARCHIVE_BYTES {
        return Err(ArchiveError::TooLarge { limit: MAX_ARCHIVE_BYTES });
    }
    decode(&std::fs::read(path).map_err(ArchiveError::Unreadable)?)
}

/// [`read`] over bytes in memory.
pub fn decode(bytes: &[u8]) -> Result<(Header, Vec<u8>), ArchiveError> {
    const TRAILER_LEN: usize = "\nsha256 \n".len() + 64;
    let body_len = bytes.len().checked_sub(TRAILER_LEN).ok_or(ArchiveError::Malformed("too short"))?;
    let (body, trailer) = bytes.split_at(body_len);
    let digest = trailer
        .strip_prefix(b"\nsha256 ")
        .and_then(|t| t.strip_suffix(b"\n"))
        .ok_or(ArchiveError::Malformed("no sha256 trailer"))?;
    if digest != sha256_hex(body).as_bytes() {
        return Err(ArchiveError::DigestMismatch("its"));
    }
    let rest = body
        .strip_prefix(MAGIC.as_bytes())
        .and_then(|r| r.strip_prefix(b"\n"))
        .ok_or(ArchiveError::Malformed("not a broca session archive"))?;
    let line_end = rest
        .iter()
        .take(MAX_HEADER_BYTES)
        .position(|&b| b == b'\n')
        .ok_or(ArchiveError::Malformed("no header line"))?;
    let header: Header = serde_json::from_slice(&rest[..line_end]).map_err(|_| ArchiveError::Malformed("header"))?;
    let wal = &rest[line_end + 1..];
    if wal.len() as u64 != header.wal_bytes {
        return Err(ArchiveError::Malformed("wal length"));
    }
    if sha256_hex(wal) != header.wal_sha256 {
        return Err(ArchiveError::DigestMismatch("the WAL's"));
    }
    if header.key().addr() != header.addr {
        return Err(ArchiveError::Malformed("the address is not the triple's"));
    }
    Ok((header, wal.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(wal: &[u8]) -> Header {
        Header {
            addr: SessionKey::new("/p", "h", "s").addr(),
            project_root: "/p".into(),
            harness: "h".into(),
            session: "s".into(),
            incarnation: "i".into(),
            epoch: 3,
            tree: "wal".into(),
            wal_bytes: wal.len() as u64,
            wal_sha256: sha256_hex(wal),
            exported_at_ms: 1,
            source_machine: None,
        }
    }

    #[test]
    fn an_archive_reads_back_and_any_flipped_byte_is_refused() {
        let wal = b"BWAL and some frames".to_vec();
        let bytes = encode(&header(&wal), &wal);
        let (h, w) = decode(&bytes).unwrap();
        assert_eq!((h, w), (header(&wal), wal));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "byte {i} flipped");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(b"").is_err());
    }

    #[test]
    fn a_header_naming_another_address_is_refused() {
        let wal = b"w".to_vec();
        let mut h = header(&wal);
        h.session = "other".into();
        assert!(matches!(decode(&encode(&h, &wal)), Err(ArchiveError::Malformed(_))));
    }
}
