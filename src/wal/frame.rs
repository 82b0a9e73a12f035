//! The WAL frame: the unit of append, checksum and recovery.
//!
//! ```text
//! offset  size  field
//!      0     4  body_len      u32 LE, bytes of `body` below
//!      4     4  len_check     !body_len, so a damaged length is told from a torn tail
//!      8     4  crc32         CRC-32 (IEEE) of `body`
//!     12        body:
//!            2    version     frame format version (FRAME_VERSION)
//!            1    kind        0 = header, 1 = record
//!            1    n_features  must-understand features this frame requires
//!            8    seq         u64 LE, monotonic per file across all episodes (header = 0)
//!            8    epoch       u64 LE, the writer's lease epoch (a forensic tenure stamp)
//!                 features    n_features × (u8 len, UTF-8 name)
//!                 payload     the rest: opaque to this layer
//! ```
//!
//! Invariants: a frame is written with one `write` call; `body_len <= MAX_BODY_LEN`; a decoder
//! never panics and never allocates more than the declared (bounded) body length.

/// The version every frame of this build is written with.
pub const FRAME_VERSION: u16 = 3;
/// Bytes before the body: length, length check, checksum.
pub const PREFIX_LEN: usize = 12;
/// Fixed part of the body before the feature list.
pub const BODY_FIXED_LEN: usize = 20;
/// The largest body a frame may carry (64 MiB, the subc request bound).
pub const MAX_BODY_LEN: usize = 64 << 20;
/// The longest feature name (it is stored behind a u8 length).
pub const MAX_FEATURE_LEN: usize = 255;

/// What a frame holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Header,
    Record,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Header => 0,
            FrameKind::Record => 1,
        }
    }
}

/// A decoded frame borrowing its bytes from the read buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub version: u16,
    pub kind: FrameKind,
    pub seq: u64,
    pub epoch: u64,
    pub features: Vec<&'a str>,
    pub payload: &'a [u8],
}

/// Why bytes at an offset are not a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the prefix or the declared body: a torn tail if at the end of the file.
    Incomplete,
    /// The length field disagrees with its check: damaged, never torn.
    BadLength,
    /// The body does not match its checksum.
    BadChecksum,
    /// The checksum holds but the body is malformed (an unknown kind, a bad feature list).
    Malformed(&'static str),
}

/// Reads the body length from a prefix; `Incomplete` when fewer than `PREFIX_LEN` bytes.
pub fn body_len(prefix: &[u8]) -> Result<usize, DecodeError> {
    if prefix.len() < PREFIX_LEN {
        return Err(DecodeError::Incomplete);
    }
    let len = u32::from_le_bytes(prefix[0..4].try_into().unwrap_or_default());
    let check = u32::from_le_bytes(prefix[4..8].try_into().unwrap_or_default());
    if check != !len || (len as usize) < BODY_FIXED_LEN || len as usize > MAX_BODY_LEN {
        return Err(DecodeError::BadLength);
    }
    Ok(len as usize)
}

/// Decodes one whole frame (prefix + body) from the start of `bytes`.
/// Returns the frame and its total length.
pub fn decode(bytes: &[u8]) -> Result<(Frame<'_>, usize), DecodeError> {
    let len = body_len(bytes)?;
    let total = PREFIX_LEN + len;
    if bytes.len() < total {
        return Err(DecodeError::Incomplete);
    }
    let crc = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    let body = &bytes[PREFIX_LEN..total];
    if crc32fast::hash(body) != crc {
        return Err(DecodeError::BadChecksum);
    }
    Ok((decode_body(body)?, total))
}

fn decode_body(body: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let version = u16::from_le_bytes([body[0], body[1]]);
    let kind = match body[2] {
        0 => FrameKind::Header,
        1 => FrameKind::Record,
        _ => return Err(DecodeError::Malformed("unknown frame kind")),
    };
    let n_features = body[3] as usize;
    let seq = u64::from_le_bytes(body[4..12].try_into().unwrap_or_default());
    let epoch = u64::from_le_bytes(body[12..20].try_into().unwrap_or_default());
    let mut at = BODY_FIXED_LEN;
    let mut features = Vec::with_capacity(n_features);
    for _ in 0..n_features {
        let len = *body.get(at).ok_or(DecodeError::Malformed("feature list overruns the frame"))? as usize;
        let name = body.get(at + 1..at + 1 + len).ok_or(DecodeError::Malformed("feature list overruns the frame"))?;
        let name = std::str::from_utf8(name).map_err(|_| DecodeError::Malformed("feature name is not UTF-8"))?;
        features.push(name);
        at += 1 + len;
    }
    Ok(Frame { version, kind, seq, epoch, features, payload: &body[at..] })
}

/// Encodes a frame into `out` (cleared first). Feature names must be 1..=255 bytes;
/// the caller checks that (see `Wal::append`).
pub fn encode(out: &mut Vec<u8>, kind: FrameKind, seq: u64, epoch: u64, features: &[&str], payload: &[u8]) {
    out.clear();
    out.extend_from_slice(&[0u8; PREFIX_LEN]);
    out.extend_from_slice(&FRAME_VERSION.to_le_bytes());
    out.push(kind.code());
    out.push(features.len() as u8);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    for f in features {
        out.push(f.len() as u8);
        out.extend_from_slice(f.as_bytes());
    }
    out.extend_from_slice(payload);
    let len = (out.len() - PREFIX_LEN) as u32;
    let crc = crc32fast::hash(&out[PREFIX_LEN..]);
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&(!len).to_le_bytes());
    out[8..12].copy_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(&mut buf, FrameKind::Record, 7, 2, &["a/v1", "bb/v2"], b"hello");
        let (f, n) = decode(&buf).unwrap();
        assert_eq!(n, buf.len());
        assert_eq!(f.seq, 7);
        assert_eq!(f.epoch, 2);
        assert_eq!(f.kind, FrameKind::Record);
        assert_eq!(f.version, FRAME_VERSION);
        assert_eq!(f.features, vec!["a/v1", "bb/v2"]);
        assert_eq!(f.payload, b"hello");
    }

    #[test]
    fn every_prefix_is_incomplete_and_every_flip_is_caught() {
        let mut buf = Vec::new();
        encode(&mut buf, FrameKind::Record, 1, 1, &["x/v1"], b"payload bytes");
        for cut in 0..buf.len() {
            assert_eq!(decode(&buf[..cut]).unwrap_err(), DecodeError::Incomplete, "cut {cut}");
        }
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[i] ^= 1 << bit;
                assert!(decode(&bad).is_err(), "flip byte {i} bit {bit} went unnoticed");
            }
        }
    }
}
