//! The sealed container a cold WAL is folded into (`lineage::fold`, spec §20 "wal-archive/,
//! wal-archive-durable/"): one session per container, `<archive tree>/<addr>.fold`.
//!
//! ```text
//! broca-fold/v1\n
//! <header: one line of JSON>\n
//! <the WAL's bytes, deflated (RFC 1951)>
//! \nsha256 <64 hex digits: the digest of every byte before this line>\n
//! ```
//!
//! The header names the address, the live tree the WAL came from (so an unfold keeps the
//! session's class), the WAL's length, its SHA-256 and its modification time (an unfolded WAL
//! keeps it: `session.head.updated_at` reads it). Invariants a read checks: the magic line, the
//! trailer digest, the inflated length and digest. A container is never trusted before all
//! of them check out.

use serde::{Deserialize, Serialize};

pub const MAGIC: &str = "broca-fold/v1";
/// The file name suffix of a container.
pub const SUFFIX: &str = "fold";
/// The largest WAL a container holds (`fold.max_wal_bytes`): larger WALs stay live.
pub const MAX_WAL_BYTES: u64 = 64 << 20;
const MAX_HEADER_BYTES: usize = 4 << 10;
/// Deflate level: the default trade of speed for size.
const LEVEL: u8 = 6;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub addr: String,
    /// The live tree the WAL lived in (`wal`, `wal-durable`).
    pub tree: String,
    pub wal_bytes: u64,
    pub wal_sha256: String,
    /// The live WAL's modification time, Unix ms.
    pub wal_mtime_ms: u64,
    pub folded_at_ms: u64,
}

/// Why a container does not check out.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsealed(pub &'static str);

impl std::fmt::Display for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the fold container does not check out: {}", self.0)
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    crate::session_key::hex(&Sha256::digest(bytes))
}

/// The container's bytes for `wal` (the header's length and digest are `wal`'s).
pub fn seal(header: &Header, wal: &[u8]) -> Vec<u8> {
    let deflated = miniz_oxide::deflate::compress_to_vec(wal, LEVEL);
    let mut out = Vec::with_capacity(deflated.len() + 256);
    out.extend_from_slice(MAGIC.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&serde_json::to_vec(header).expect("a header serializes"));
    out.push(b'\n');
    out.extend_from_slice(&deflated);
    let digest = sha256_hex(&out);
    out.extend_from_slice(format!("\nsha256 {digest}\n").as_bytes());
    out
}

/// The header and the WAL's bytes, once every check passes.
pub fn open(bytes: &[u8]) -> Result<(Header, Vec<u8>), Unsealed> {
    let (header, deflated) = split(bytes)?;
    let limit = usize::try_from(header.wal_bytes.min(MAX_WAL_BYTES)).unwrap_or(0);
    let wal = miniz_oxide::inflate::decompress_to_vec_with_limit(deflated, limit).map_err(|_| Unsealed("inflate"))?;
    if wal.len() as u64 != header.wal_bytes {
        return Err(Unsealed("wal length"));
    }
    if sha256_hex(&wal) != header.wal_sha256 {
        return Err(Unsealed("wal digest"));
    }
    Ok((header, wal))
}

/// The header alone, checked against the trailer digest (nothing inflated).
pub fn header(bytes: &[u8]) -> Result<Header, Unsealed> {
    split(bytes).map(|(h, _)| h)
}

fn split(bytes: &[u8]) -> Result<(Header, &[u8]), Unsealed> {
    const TRAILER_LEN: usize = "\nsha256 \n".len() + 64;
    let body_len = bytes.len().checked_sub(TRAILER_LEN).ok_or(Unsealed("too short"))?;
    let (body, trailer) = bytes.split_at(body_len);
    let digest =
        trailer.strip_prefix(b"\nsha256 ").and_then(|t| t.strip_suffix(b"\n")).ok_or(Unsealed("no trailer"))?;
    if digest != sha256_hex(body).as_bytes() {
        return Err(Unsealed("digest"));
    }
    let rest = body.strip_prefix(MAGIC.as_bytes()).and_then(|r| r.strip_prefix(b"\n")).ok_or(Unsealed("magic"))?;
    let end = rest.iter().take(MAX_HEADER_BYTES).position(|&b| b == b'\n').ok_or(Unsealed("header line"))?;
    let header: Header = serde_json::from_slice(&rest[..end]).map_err(|_| Unsealed("header"))?;
    Ok((header, &rest[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_wal_opens_to_its_bytes_and_any_flip_is_refused() {
        let wal: Vec<u8> = b"BWAL".iter().chain(b"{\"record\": 1} ".repeat(200).iter()).copied().collect();
        let header = Header {
            addr: "a".into(),
            tree: "wal".into(),
            wal_bytes: wal.len() as u64,
            wal_sha256: sha256_hex(&wal),
            wal_mtime_ms: 5,
            folded_at_ms: 6,
        };
        let sealed = seal(&header, &wal);
        assert!(sealed.len() < wal.len() / 4, "repetitive JSON deflates: {} of {}", sealed.len(), wal.len());
        assert_eq!(open(&sealed).unwrap(), (header.clone(), wal));
        assert_eq!(super::header(&sealed).unwrap(), header);
        for i in (0..sealed.len()).step_by(7) {
            let mut bad = sealed.clone();
            bad[i] ^= 0x04;
            assert!(open(&bad).is_err(), "byte {i}");
        }
    }
}
