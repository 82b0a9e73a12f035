//! Frames on the wire: encoding, an incremental decoder, and the delivered-frame limit.
//!
//! The header codec is `subc_protocol`'s (21 bytes, little-endian; see `subc-wire.md` §5); this
//! file only adds what a non-blocking socket needs around it.
//!
//! Invariants of [`Decoder`]:
//! - it follows the frozen-prefix rule: once 5 bytes are buffered the version is checked, so an
//!   old-format stream fails at once with a typed error instead of waiting for bytes that never
//!   come;
//! - a declared body longer than `MAX_FRAME_BODY_LEN` is refused before anything is allocated for
//!   it, and malformed input is always an `Err`, never a panic;
//! - after an error the decoder is poisoned and returns the same error again: the stream has no
//!   frame boundaries left to resynchronise on;
//! - frames come out whole and in order; bytes past the last whole frame stay buffered.

use std::fmt;

use subc_protocol::{decode_header, DecodeError, EnvelopeHeader, Flags, Frame, FrameType, PROTOCOL_VERSION};
pub use subc_protocol::{FROZEN_PREFIX_LEN, HEADER_LEN, MAX_DELIVERED_FRAME_LEN, MAX_FRAME_BODY_LEN};

/// Encodes one frame (header then body) into a single buffer, for a single `write`.
pub fn encode(
    ty: FrameType,
    flags: Flags,
    channel: u16,
    epoch: u32,
    corr: u64,
    body: &[u8],
) -> Result<Vec<u8>, TooLarge> {
    if body.len() > MAX_FRAME_BODY_LEN as usize {
        return Err(TooLarge { frame_bytes: HEADER_LEN + body.len(), limit: HEADER_LEN + MAX_FRAME_BODY_LEN as usize });
    }
    let header = EnvelopeHeader { len: body.len() as u32, ver: PROTOCOL_VERSION, ty, flags, channel, epoch, corr };
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    Ok(out)
}

/// Encodes a decoded or built [`Frame`].
pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + frame.body.len());
    out.extend_from_slice(&frame.header.encode());
    out.extend_from_slice(&frame.body);
    out
}

/// A frame would exceed a size limit (`frame_bytes` includes the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    pub frame_bytes: usize,
    pub limit: usize,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "frame of {} bytes exceeds the limit of {} bytes", self.frame_bytes, self.limit)
    }
}

impl std::error::Error for TooLarge {}

/// The size of the frame carrying a body of `body_len` bytes.
pub fn frame_len(body_len: usize) -> usize {
    HEADER_LEN + body_len
}

/// Checks that a module→client frame with this body fits the daemon's delivered-frame limit
/// (4,194,304 bytes, header included). A larger frame is never delivered (`subc-wire.md` §5.2).
pub fn check_delivered(body_len: usize) -> Result<(), TooLarge> {
    let frame_bytes = frame_len(body_len);
    if frame_bytes > MAX_DELIVERED_FRAME_LEN {
        return Err(TooLarge { frame_bytes, limit: MAX_DELIVERED_FRAME_LEN });
    }
    Ok(())
}

/// Why the byte stream stopped being a frame stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The header is malformed (wrong version, unknown type, reserved bits, …).
    Header(DecodeError),
    /// The header declares a body larger than `MAX_FRAME_BODY_LEN`.
    BodyTooLarge { len: u32 },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(e) => write!(f, "bad frame header: {e}"),
            Self::BodyTooLarge { len } => write!(f, "frame body of {len} bytes exceeds {MAX_FRAME_BODY_LEN}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Turns a byte stream fed in arbitrary pieces into whole frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Offset of the first unconsumed byte in `buf`.
    start: usize,
    poisoned: Option<FrameError>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        let pending = &self.buf[self.start..];
        if pending.len() < FROZEN_PREFIX_LEN {
            return Ok(None);
        }
        let header = match decode_header(&pending[..pending.len().min(HEADER_LEN)]) {
            Ok(h) => h,
            Err(DecodeError::TooShortForHeader { .. }) => return Ok(None),
            Err(e) => return Err(self.poison(FrameError::Header(e))),
        };
        if header.len > MAX_FRAME_BODY_LEN {
            return Err(self.poison(FrameError::BodyTooLarge { len: header.len }));
        }
        let total = HEADER_LEN + header.len as usize;
        if pending.len() < total {
            return Ok(None);
        }
        let body = pending[HEADER_LEN..total].to_vec();
        self.start += total;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(Frame::from_wire(header, body)))
    }

    fn poison(&mut self, e: FrameError) -> FrameError {
        self.poisoned = Some(e);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subc_protocol::Priority;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The frame vectors of subc-transport 0.15.0 `tests/wire_vectors.rs` (committed fixture
    /// `clients/subc-client-swift/Tests/SubcClientTests/Fixtures/wire_vectors.json`):
    /// (type, flags, channel, epoch, corr, body hex, expected frame hex).
    const VECTORS: &[(u8, u8, u16, u32, u64, &str, &str)] = &[
        (
            0,
            2,
            0,
            0,
            1,
            "7b226a736f6e727063223a22322e30222c226964223a312c226d6574686f64223a2270696e67227d",
            "2800000002000200000000000001000000000000007b226a736f6e727063223a22322e30222c226964223a312c226d6574686f64223a2270696e67227d",
        ),
        (11, 0, 0, 0, 7, "", "00000000020b000000000000000700000000000000"),
        (3, 29, 513, 1, 320255973501901, "000102037f80feff", "0800000002031d010201000000cdab896745230100000102037f80feff"),
        (
            5,
            4,
            65535,
            4294967295,
            99,
            "7b22636f6465223a226261645f72657175657374222c226d657373616765223a226f6f7073227d",
            "27000000020504ffffffffffff63000000000000007b22636f6465223a226261645f72657175657374222c226d657373616765223a226f6f7073227d",
        ),
        (2, 32, 42, 4294967295, 0, "010203", "030000000202202a00ffffffff0000000000000000010203"),
    ];

    #[test]
    fn encoding_matches_the_published_vectors_and_decodes_back() {
        for &(ty, flags, channel, epoch, corr, body, wire) in VECTORS {
            let ty = FrameType::from_u8(ty).unwrap();
            let bytes = encode(ty, Flags(flags), channel, epoch, corr, &unhex(body)).unwrap();
            assert_eq!(bytes, unhex(wire), "{ty:?}");
            let mut d = Decoder::new();
            d.feed(&bytes);
            let f = d.next_frame().unwrap().unwrap();
            assert_eq!(
                (f.header.ty, f.header.flags.0, f.header.channel, f.header.epoch, f.header.corr),
                (ty, flags, channel, epoch, corr)
            );
            assert_eq!(f.body, unhex(body));
            assert_eq!(encode_frame(&f), bytes);
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn frames_fed_one_byte_at_a_time_come_out_whole_and_in_order() {
        let mut stream = Vec::new();
        for &(_, _, _, _, _, _, wire) in VECTORS {
            stream.extend(unhex(wire));
        }
        let mut d = Decoder::new();
        let mut corrs = Vec::new();
        for b in &stream {
            d.feed(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                corrs.push(f.header.corr);
            }
        }
        assert_eq!(corrs, vec![1, 7, 320255973501901, 99, 0]);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn a_wrong_version_fails_at_the_frozen_prefix_and_poisons() {
        let mut d = Decoder::new();
        d.feed(&[0, 0, 0, 0, 1]);
        let err = d.next_frame().unwrap_err();
        assert_eq!(err, FrameError::Header(DecodeError::UnsupportedVersion { ver: 1 }));
        d.feed(&[0; 32]);
        assert_eq!(d.next_frame().unwrap_err(), err);
    }

    #[test]
    fn bad_headers_are_typed_errors_not_panics() {
        let ping_with_body = encode(FrameType::Request, Flags(0), 0, 0, 1, b"x").unwrap();
        let mut bad = ping_with_body.clone();
        bad[5] = FrameType::Ping as u8;
        let mut d = Decoder::new();
        d.feed(&bad);
        assert!(matches!(d.next_frame(), Err(FrameError::Header(DecodeError::PureHeaderFrameWithBody { .. }))));

        let mut huge = encode(FrameType::Request, Flags(0), 1, 1, 1, b"").unwrap();
        huge[..4].copy_from_slice(&(MAX_FRAME_BODY_LEN + 1).to_le_bytes());
        let mut d = Decoder::new();
        d.feed(&huge);
        assert_eq!(d.next_frame().unwrap_err(), FrameError::BodyTooLarge { len: MAX_FRAME_BODY_LEN + 1 });

        // Every single-byte corruption of a header decodes or fails cleanly.
        let good =
            encode(FrameType::StreamData, Flags::new(false, Priority::Interactive, false), 3, 4, 5, b"ab").unwrap();
        for i in 4..HEADER_LEN {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let mut d = Decoder::new();
                d.feed(&b);
                let _ = d.next_frame();
            }
        }
    }

    #[test]
    fn the_delivered_limit_includes_the_header() {
        assert_eq!(MAX_DELIVERED_FRAME_LEN, 4_194_304);
        assert!(check_delivered(MAX_DELIVERED_FRAME_LEN - HEADER_LEN).is_ok());
        let err = check_delivered(MAX_DELIVERED_FRAME_LEN - HEADER_LEN + 1).unwrap_err();
        assert_eq!(err, TooLarge { frame_bytes: 4_194_305, limit: 4_194_304 });
    }
}
