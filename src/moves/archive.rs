//! The session archive a move carries between hosts (`move.export` writes it,
//! `move.adopt` reads it): sealed with the hosts' move key, and never trusted before the
//! seal checks out (#44).
//!
//! ```text
//! broca-session-archive/v2\n
//! <header: one line of JSON>\n
//! <wal_bytes bytes of the WAL, from its header to the frame before the tombstone>
//! \nhmac-sha256 <64 hex digits: HMAC-SHA256 under the move key of every byte before this line>\n
//! ```
//!
//! The WAL bytes are the exporting host's, unchanged: incarnation, seqs and epochs stay as
//! they were, so reads on the adopting host are byte-identical. Invariants a read checks, in
//! this order: the seal under this host's key (an archive from outside the hosts sharing the
//! key, or edited after it was sealed, goes no further), the magic line, a header naming the
//! session's triple and address, exactly `wal_bytes` bytes whose SHA-256 is `wal_sha256`.
//! Frame-level checks (every frame's CRC, the lineage id, the replay) are the adopter's.

use serde::{Deserialize, Serialize};

use super::key::MoveKey;
use crate::session_key::SessionKey;

pub const MAGIC: &str = "broca-session-archive/v2";
/// The largest archive read (`move.archive_max_bytes`): past it the archive is refused.
pub use crate::limits::MOVE_ARCHIVE_BYTES as MAX_ARCHIVE_BYTES;
/// The largest WAL an export takes (refused `session_too_large` before its tombstone).
pub use crate::limits::MOVE_WAL_BYTES as MAX_WAL_BYTES;
/// The longest header line read.
const MAX_HEADER_BYTES: usize = 16 << 10;
const TRAILER_PREFIX: &[u8] = b"\nhmac-sha256 ";

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
    /// The named file cannot be read as an archive (absent, a symlink, a FIFO, too large).
    Unreadable(super::exchange::ReadError),
    /// Not sealed under this host's move key: from outside the hosts sharing it, or edited.
    Unverified,
    Malformed(&'static str),
    DigestMismatch(&'static str),
}

impl ArchiveError {
    /// The `detail.reason` served.
    pub fn reason(&self) -> &'static str {
        match self {
            ArchiveError::Unreadable(super::exchange::ReadError::TooLarge { .. }) => "too_large",
            ArchiveError::Unreadable(super::exchange::ReadError::NotRegular) => "not_a_file",
            ArchiveError::Unreadable(_) => "unreadable",
            ArchiveError::Unverified => "unverified",
            ArchiveError::Malformed(_) => "malformed",
            ArchiveError::DigestMismatch(_) => "digest_mismatch",
        }
    }
}

impl std::fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArchiveError::Unreadable(e) => write!(f, "the archive cannot be read: {e}"),
            ArchiveError::Unverified => f.write_str(
                "the archive is not sealed with this host's move key: only hosts sharing move.key exchange sessions (docs/security.md)",
            ),
            ArchiveError::Malformed(what) => write!(f, "the archive is malformed: {what}"),
            ArchiveError::DigestMismatch(what) => {
                write!(f, "the archive does not check out: {what} digest does not match")
            }
        }
    }
}

pub use crate::actor::moving::sha256_hex;

/// The archive's bytes, sealed with `key`.
pub fn encode(header: &Header, wal: &[u8], key: &MoveKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(wal.len() + 512);
    out.extend_from_slice(MAGIC.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&serde_json::to_vec(header).expect("a header serializes"));
    out.push(b'\n');
    out.extend_from_slice(wal);
    let seal = key.seal(&out);
    out.extend_from_slice(TRAILER_PREFIX);
    out.extend_from_slice(seal.as_bytes());
    out.push(b'\n');
    out
}

/// The body (every byte before the trailer) and the seal of an archive's bytes.
fn split(bytes: &[u8]) -> Result<(&[u8], &[u8]), ArchiveError> {
    let trailer_len = TRAILER_PREFIX.len() + 64 + 1;
    let body_len = bytes.len().checked_sub(trailer_len).ok_or(ArchiveError::Malformed("too short"))?;
    let (body, trailer) = bytes.split_at(body_len);
    let seal =
        trailer.strip_prefix(TRAILER_PREFIX).and_then(|t| t.strip_suffix(b"\n")).ok_or(ArchiveError::Unverified)?;
    Ok((body, seal))
}

/// Checks an archive's bytes under `key`: its header and WAL bytes.
pub fn decode(bytes: &[u8], key: &MoveKey) -> Result<(Header, Vec<u8>), ArchiveError> {
    let (body, seal) = split(bytes)?;
    if !key.verifies(body, seal) {
        return Err(ArchiveError::Unverified);
    }
    let (header, wal) = parse(body)?;
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

/// The header an archive claims, NOT verified: only for telling which session's route to send
/// it on (`broca session import`). The adopting host checks everything with [`decode`].
pub fn peek_header(bytes: &[u8]) -> Result<Header, ArchiveError> {
    let (body, _) = split(bytes)?;
    Ok(parse(body)?.0)
}

fn parse(body: &[u8]) -> Result<(Header, &[u8]), ArchiveError> {
    let rest = body
        .strip_prefix(MAGIC.as_bytes())
        .and_then(|r| r.strip_prefix(b"\n"))
        .ok_or(ArchiveError::Malformed("not a broca session archive (v2)"))?;
    let line_end = rest
        .iter()
        .take(MAX_HEADER_BYTES)
        .position(|&b| b == b'\n')
        .ok_or(ArchiveError::Malformed("no header line"))?;
    let header: Header = serde_json::from_slice(&rest[..line_end]).map_err(|_| ArchiveError::Malformed("header"))?;
    Ok((header, &rest[line_end + 1..]))
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

    fn key() -> MoveKey {
        MoveKey::from_bytes([1; 32])
    }

    #[test]
    fn an_archive_reads_back_and_any_flipped_byte_is_refused() {
        let wal = b"BWAL and some frames".to_vec();
        let bytes = encode(&header(&wal), &wal, &key());
        let (h, w) = decode(&bytes, &key()).unwrap();
        assert_eq!((h.clone(), w), (header(&wal), wal));
        assert_eq!(peek_header(&bytes).unwrap(), h);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad, &key()).is_err(), "byte {i} flipped");
        }
        assert!(decode(&bytes[..bytes.len() - 1], &key()).is_err());
        assert!(decode(b"", &key()).is_err());
    }

    #[test]
    fn an_archive_sealed_under_another_key_is_refused_whatever_its_digests_say() {
        let wal = b"BWAL".to_vec();
        let forged = encode(&header(&wal), &wal, &MoveKey::from_bytes([2; 32]));
        assert!(matches!(decode(&forged, &key()), Err(ArchiveError::Unverified)));
        assert_eq!(ArchiveError::Unverified.reason(), "unverified");
    }

    #[test]
    fn a_header_naming_another_address_is_refused() {
        let wal = b"w".to_vec();
        let mut h = header(&wal);
        h.session = "other".into();
        assert!(matches!(decode(&encode(&h, &wal, &key()), &key()), Err(ArchiveError::Malformed(_))));
    }
}
