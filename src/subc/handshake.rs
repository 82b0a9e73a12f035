//! The client side of subc's three-message HMAC-SHA256 handshake, over a blocking `TcpStream`.
//!
//! 1. → `ClientHello {client_nonce: [32], role: "client"}`
//! 2. ← `ServerProof {daemon_id: [16], server_nonce: [32], daemon_ver, server_proof: [32]}`, where
//!    `server_proof = HMAC(key, "subc-server-v1" ‖ client_nonce ‖ server_nonce ‖ daemon_id)`
//! 3. → `ClientAuth {client_auth: HMAC(key, "subc-client-v1" ‖ client_nonce ‖ server_nonce ‖ daemon_id)}`
//!
//! Each message is a little-endian u32 length (at most [`MAX_AUTH_MESSAGE_LEN`]) and that much
//! JSON. Frames follow message 3 immediately; there is no acknowledgement.
//!
//! Invariants: the whole exchange is bounded by one absolute deadline (each read and write gets
//! only the time left); the server proof is compared in constant time and checked before the
//! daemon id, and no `ClientAuth` is sent to a peer that failed either check; the socket's
//! timeouts are cleared again on success. The handshake proves only that the peer holds the key.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::connection_file::{ConnectionInfo, DAEMON_ID_LEN};

pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;
pub const MAX_AUTH_MESSAGE_LEN: u32 = 4096;
pub const SERVER_PROOF_DOMAIN: &str = "subc-server-v1";
pub const CLIENT_AUTH_DOMAIN: &str = "subc-client-v1";
/// The daemon gives a connection this long to authenticate (`subc-daemon` `server.rs`).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Serialize, Deserialize)]
struct ClientHello {
    client_nonce: [u8; NONCE_LEN],
    role: String,
}

#[derive(Serialize, Deserialize)]
struct ServerProof {
    daemon_id: [u8; DAEMON_ID_LEN],
    server_nonce: [u8; NONCE_LEN],
    daemon_ver: String,
    server_proof: [u8; PROOF_LEN],
}

#[derive(Serialize, Deserialize)]
struct ClientAuth {
    client_auth: [u8; PROOF_LEN],
}

/// Which message was being exchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    ClientHello,
    ServerProof,
    ClientAuth,
}

/// Why the handshake failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The deadline passed during `stage`.
    Timeout { stage: Stage },
    /// The socket failed (or closed early) during `stage`.
    Io { stage: Stage, source: io::Error },
    /// The peer announced a message longer than [`MAX_AUTH_MESSAGE_LEN`].
    MessageTooLarge { stage: Stage, len: u32 },
    /// The peer's message is not the expected JSON.
    Json { stage: Stage, source: serde_json::Error },
    /// The peer does not hold our key.
    InvalidServerProof,
    /// The peer holds the key but is another daemon than the connection file names.
    DaemonIdMismatch,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout { stage } => write!(f, "handshake timed out at {stage:?}"),
            Self::Io { stage, source } => write!(f, "handshake I/O failed at {stage:?}: {source}"),
            Self::MessageTooLarge { stage, len } => {
                write!(f, "handshake message at {stage:?} is {len} bytes (max {MAX_AUTH_MESSAGE_LEN})")
            }
            Self::Json { stage, source } => write!(f, "handshake message at {stage:?} is malformed: {source}"),
            Self::InvalidServerProof => write!(f, "the daemon's server proof does not verify"),
            Self::DaemonIdMismatch => write!(f, "the daemon id differs from the connection file's"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// What the daemon said about itself in message 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    pub daemon_ver: String,
}

type HmacSha256 = Hmac<Sha256>;

/// `HMAC-SHA256(key, domain ‖ client_nonce ‖ server_nonce ‖ daemon_id)`.
pub fn compute_proof(
    key: &[u8],
    domain: &str,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    daemon_id: &[u8],
) -> [u8; PROOF_LEN] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(domain.as_bytes());
    mac.update(client_nonce);
    mac.update(server_nonce);
    mac.update(daemon_id);
    mac.finalize().into_bytes().into()
}

/// Compares two proofs without an early exit, so timing reveals nothing about where they differ.
fn constant_time_eq(a: &[u8; PROOF_LEN], b: &[u8; PROOF_LEN]) -> bool {
    let diff = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// 32 bytes from the OS random source (two v4 UUIDs, which `uuid` draws from `getrandom`).
fn random_nonce() -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    nonce[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    nonce[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    nonce
}

/// Runs the client handshake on `stream` within `deadline`, as role `"client"`.
pub fn authenticate(
    stream: &mut TcpStream,
    info: &ConnectionInfo,
    deadline: Duration,
) -> Result<Authenticated, HandshakeError> {
    let result = authenticate_with_nonce(stream, info, Instant::now() + deadline, random_nonce());
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    result
}

fn authenticate_with_nonce(
    stream: &mut TcpStream,
    info: &ConnectionInfo,
    at: Instant,
    client_nonce: [u8; NONCE_LEN],
) -> Result<Authenticated, HandshakeError> {
    let hello = ClientHello { client_nonce, role: "client".into() };
    write_message(stream, Stage::ClientHello, &hello, at)?;
    let proof: ServerProof = read_message(stream, Stage::ServerProof, at)?;
    let expected = compute_proof(&info.key, SERVER_PROOF_DOMAIN, &client_nonce, &proof.server_nonce, &proof.daemon_id);
    if !constant_time_eq(&expected, &proof.server_proof) {
        return Err(HandshakeError::InvalidServerProof);
    }
    if proof.daemon_id != info.daemon_id {
        return Err(HandshakeError::DaemonIdMismatch);
    }
    let client_auth =
        compute_proof(&info.key, CLIENT_AUTH_DOMAIN, &client_nonce, &proof.server_nonce, &proof.daemon_id);
    write_message(stream, Stage::ClientAuth, &ClientAuth { client_auth }, at)?;
    Ok(Authenticated { daemon_ver: proof.daemon_ver })
}

/// Time left before `at`, or a timeout error naming `stage`.
fn remaining(at: Instant, stage: Stage) -> Result<Duration, HandshakeError> {
    let left = at.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HandshakeError::Timeout { stage });
    }
    Ok(left)
}

fn classify(stage: Stage, source: io::Error) -> HandshakeError {
    match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => HandshakeError::Timeout { stage },
        _ => HandshakeError::Io { stage, source },
    }
}

fn write_message<T: Serialize>(
    stream: &mut TcpStream,
    stage: Stage,
    value: &T,
    at: Instant,
) -> Result<(), HandshakeError> {
    let json = serde_json::to_vec(value).map_err(|source| HandshakeError::Json { stage, source })?;
    let mut bytes = (json.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    stream.set_write_timeout(Some(remaining(at, stage)?)).map_err(|e| classify(stage, e))?;
    stream.write_all(&bytes).map_err(|e| classify(stage, e))
}

fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], stage: Stage, at: Instant) -> Result<(), HandshakeError> {
    let mut filled = 0;
    while filled < buf.len() {
        stream.set_read_timeout(Some(remaining(at, stage)?)).map_err(|e| classify(stage, e))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(HandshakeError::Io { stage, source: io::ErrorKind::UnexpectedEof.into() });
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(classify(stage, e)),
        }
    }
    Ok(())
}

fn read_message<T: DeserializeOwned>(stream: &mut TcpStream, stage: Stage, at: Instant) -> Result<T, HandshakeError> {
    let mut len = [0u8; 4];
    read_exact_by(stream, &mut len, stage, at)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_AUTH_MESSAGE_LEN {
        return Err(HandshakeError::MessageTooLarge { stage, len });
    }
    let mut json = vec![0u8; len as usize];
    read_exact_by(stream, &mut json, stage, at)?;
    serde_json::from_slice(&json).map_err(|source| HandshakeError::Json { stage, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subc::connection_file::Endpoint;
    use std::net::TcpListener;

    // Byte-exact vectors from subc-transport 0.15.0 `tests/wire_vectors.rs`, as committed in
    // cortexkit/subconscious `clients/subc-client-swift/Tests/SubcClientTests/Fixtures/wire_vectors.json`.
    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const CLIENT_NONCE_HEX: &str = "abababababababababababababababababababababababababababababababab";
    const SERVER_NONCE_HEX: &str = "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd";
    const DAEMON_ID_HEX: &str = "000102030405060708090a0b0c0d0e0f";
    const SERVER_PROOF_HEX: &str = "ea06076a980bc7558e45017df86de89f3d2fc09861f8460795dea31eadf40527";
    const CLIENT_AUTH_HEX: &str = "a3bc64784dbd94c4f52799e0c66f7b2b8183aa4655594630245c5d4a2fa387a9";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn n32(s: &str) -> [u8; 32] {
        unhex(s).try_into().unwrap()
    }

    #[test]
    fn proofs_match_the_published_vectors() {
        let (key, c, s, id) = (unhex(KEY_HEX), n32(CLIENT_NONCE_HEX), n32(SERVER_NONCE_HEX), unhex(DAEMON_ID_HEX));
        assert_eq!(hex(&compute_proof(&key, SERVER_PROOF_DOMAIN, &c, &s, &id)), SERVER_PROOF_HEX);
        assert_eq!(hex(&compute_proof(&key, CLIENT_AUTH_DOMAIN, &c, &s, &id)), CLIENT_AUTH_HEX);
    }

    #[test]
    fn constant_time_eq_sees_a_difference_anywhere() {
        let a = n32(SERVER_PROOF_HEX);
        assert!(constant_time_eq(&a, &a));
        for i in [0, 17, 31] {
            let mut b = a;
            b[i] ^= 1;
            assert!(!constant_time_eq(&a, &b));
        }
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(random_nonce(), random_nonce());
    }

    fn info() -> ConnectionInfo {
        ConnectionInfo {
            schema: 1,
            wire_version: Some(2),
            endpoints: vec![Endpoint { host: "127.0.0.1".into(), port: 0 }],
            key: unhex(KEY_HEX),
            daemon_id: unhex(DAEMON_ID_HEX).try_into().unwrap(),
            pid: None,
            daemon_ver: "test".into(),
        }
    }

    /// A fake daemon: answers message 1 with the vector's server nonce, signed by `key` and claiming
    /// `daemon_id`, then returns the client's message 3 (if any).
    fn fake_daemon(key: Vec<u8>, daemon_id: [u8; 16]) -> (u16, std::thread::JoinHandle<Option<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let join = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let at = Instant::now() + Duration::from_secs(5);
            let hello: ClientHello = read_message(&mut s, Stage::ClientHello, at).unwrap();
            assert_eq!(hello.role, "client");
            let server_nonce = n32(SERVER_NONCE_HEX);
            let server_proof = compute_proof(&key, SERVER_PROOF_DOMAIN, &hello.client_nonce, &server_nonce, &daemon_id);
            let proof = ServerProof { daemon_id, server_nonce, daemon_ver: "0.39.3".into(), server_proof };
            write_message(&mut s, Stage::ServerProof, &proof, at).unwrap();
            let auth: Option<ClientAuth> = read_message(&mut s, Stage::ClientAuth, at).ok();
            auth.map(|a| a.client_auth.to_vec())
        });
        (port, join)
    }

    #[test]
    fn the_client_sends_the_vector_client_auth_for_the_vector_inputs() {
        let (port, daemon) = fake_daemon(unhex(KEY_HEX), info().daemon_id);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let at = Instant::now() + Duration::from_secs(5);
        let ok = authenticate_with_nonce(&mut s, &info(), at, n32(CLIENT_NONCE_HEX)).unwrap();
        assert_eq!(ok.daemon_ver, "0.39.3");
        assert_eq!(hex(&daemon.join().unwrap().unwrap()), CLIENT_AUTH_HEX);
    }

    #[test]
    fn a_daemon_without_the_key_or_with_another_id_gets_no_client_auth() {
        let (port, daemon) = fake_daemon(vec![7u8; 32], info().daemon_id);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert!(matches!(authenticate(&mut s, &info(), HANDSHAKE_DEADLINE), Err(HandshakeError::InvalidServerProof)));
        drop(s);
        assert_eq!(daemon.join().unwrap(), None);

        let (port, daemon) = fake_daemon(unhex(KEY_HEX), [9u8; 16]);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert!(matches!(authenticate(&mut s, &info(), HANDSHAKE_DEADLINE), Err(HandshakeError::DaemonIdMismatch)));
        drop(s);
        assert_eq!(daemon.join().unwrap(), None);
    }

    #[test]
    fn a_silent_peer_times_out_within_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let started = Instant::now();
        let err = authenticate(&mut s, &info(), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, HandshakeError::Timeout { stage: Stage::ServerProof }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(listener);
    }

    #[test]
    fn an_oversized_message_is_refused_before_reading_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(&(MAX_AUTH_MESSAGE_LEN + 1).to_le_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let err = authenticate(&mut s, &info(), HANDSHAKE_DEADLINE).unwrap_err();
        assert!(matches!(err, HandshakeError::MessageTooLarge { len: 4097, .. }), "{err:?}");
        peer.join().unwrap();
    }
}
