//! The subc layer's decoders of daemon bytes: the frame decoder (a stream of real frames,
//! mutated and fed in random pieces), the connection file (a real file's JSON, mutated; read
//! through the file with the owner-only check), the client handshake (a loopback daemon that
//! answers the real `ClientHello` with a correctly signed `ServerProof` and then mutates it),
//! and the io thread past registration (a scripted daemon's binds, requests, cancels, control
//! requests and pushes with mutated bodies, over a real socket).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use broca::subc::connection_file::{self, ConnectionFileError, ConnectionInfo, Endpoint, DAEMON_ID_LEN, MIN_KEY_LEN};
use broca::subc::frame::{self, Decoder, FrameError, HEADER_LEN, MAX_FRAME_BODY_LEN};
use broca::subc::handshake::{self, HandshakeError, CLIENT_AUTH_DOMAIN, MAX_AUTH_MESSAGE_LEN, SERVER_PROOF_DOMAIN};
use serde_json::{json, Value};
use subc_protocol::{Flags, FrameType};

use crate::{fuzz, Gen};

/// The parameters of subc-transport's published frame vectors (type, flags, channel, epoch,
/// corr), with bodies: a JSON-RPC request, none, binary bytes, an error body, a push.
fn vector_frames() -> Vec<Vec<u8>> {
    type Vector = (FrameType, u8, u16, u32, u64, &'static [u8]);
    let frames: [Vector; 5] = [
        (FrameType::Request, 2, 0, 0, 1, br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
        (FrameType::Goodbye, 0, 0, 0, 7, b""),
        (FrameType::StreamData, 29, 513, 1, 320_255_973_501_901, b"\x00\x01\x02\x03\x7f\x80\xfe\xff"),
        (FrameType::Error, 4, 65535, u32::MAX, 99, br#"{"code":"bad_request","message":"oops"}"#),
        (FrameType::Push, 32, 42, u32::MAX, 0, b"\x01\x02\x03"),
    ];
    frames
        .iter()
        .map(|&(ty, flags, ch, epoch, corr, body)| frame::encode(ty, Flags(flags), ch, epoch, corr, body).unwrap())
        .collect()
}

/// A stream of whole frames drawn from the vectors (and a request with a larger JSON body).
fn frame_stream(g: &mut Gen) -> Vec<u8> {
    let vectors = vector_frames();
    let mut stream = Vec::new();
    for _ in 0..g.range(1, 8) {
        if g.chance(5) {
            let body = json!({"jsonrpc": "2.0", "id": g.u64(), "method": "route.bind", "params": {"x": "y".repeat(g.below(3000))}});
            let ty = *g.pick(&[FrameType::Request, FrameType::Response, FrameType::StreamData]);
            let bytes = serde_json::to_vec(&body).unwrap();
            stream.extend(frame::encode(ty, Flags(0), 3, 9, g.u64(), &bytes).unwrap());
        } else {
            stream.extend(g.pick(&vectors));
        }
    }
    stream
}

/// Damages a frame stream where it hurts: the length field (huge, just over the limit, off by
/// one), the version, type and flags bytes of some header, or anywhere at the byte level.
fn damage(g: &mut Gen, stream: &mut Vec<u8>) {
    let header_at = if stream.len() > HEADER_LEN { g.below(stream.len() - HEADER_LEN) } else { 0 };
    match g.below(6) {
        0 if stream.len() >= 4 => {
            let random = g.u64() as u32;
            let len = *g.pick(&[MAX_FRAME_BODY_LEN, MAX_FRAME_BODY_LEN + 1, u32::MAX, random, 1, 0]);
            stream[..4].copy_from_slice(&len.to_le_bytes());
        }
        1 if stream.len() > header_at + 7 => {
            let i = header_at + 4 + g.below(3);
            stream[i] = g.byte();
        }
        2 => {}
        _ => g.mutate_bytes(stream, &vector_frames().concat()),
    }
}

#[test]
fn fuzz_subc_frame_decoder() {
    fuzz("subc.frame_decoder", 200, |g| {
        let mut stream = frame_stream(g);
        let intact = stream.clone();
        damage(g, &mut stream);
        let mut d = Decoder::new();
        let mut decoded = Vec::new();
        let mut fed = 0;
        let mut error: Option<FrameError> = None;
        while fed < stream.len() && error.is_none() {
            let n = g.range(1, 64.min(stream.len() - fed) + 1);
            d.feed(&stream[fed..fed + n]);
            fed += n;
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => {
                        assert!(f.body.len() <= MAX_FRAME_BODY_LEN as usize);
                        decoded.extend(frame::encode_frame(&f));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            // Never more buffered than was fed and not returned (no allocation for a declared
            // length: the buffer holds received bytes only).
            assert_eq!(d.buffered(), fed - decoded.len(), "buffered bytes are exactly the undelivered ones");
        }
        // Frames come out whole, in order, byte for byte what was sent, and nothing is skipped.
        assert_eq!(decoded[..], stream[..decoded.len()], "decoded frames are a prefix of the stream");
        if let Some(e) = error {
            assert_eq!(d.next_frame().unwrap_err(), e, "a failed decoder stays failed");
            d.feed(&intact);
            assert_eq!(d.next_frame().unwrap_err(), e, "and resynchronises on nothing");
        } else if stream == intact {
            assert_eq!(decoded, intact, "an intact stream decodes whole");
        }
    });
}

/// A valid connection file document (as the daemon writes it).
fn connection_doc(g: &mut Gen) -> Value {
    let key: Vec<u8> = (0..MIN_KEY_LEN + g.below(8)).map(|_| g.byte()).collect();
    let id: Vec<u8> = (0..DAEMON_ID_LEN).map(|_| g.byte()).collect();
    json!({
        "schema": 1, "wire_version": 2,
        "endpoints": [{"host": "127.0.0.1", "port": 8757}, {"host": "[::1]", "port": 8757}],
        "key": key, "daemon_id": id, "pid": 4242, "daemon_ver": "0.39.3",
        "local_endpoint": {"kind": "unix", "path": "/tmp/x/subc.sock"}
    })
}

const CONNECTION_MEMBERS: &[&str] =
    &["schema", "wire_version", "endpoints", "key", "daemon_id", "pid", "daemon_ver", "local_endpoint", "host", "port"];

fn check_connection_info(info: &ConnectionInfo) {
    assert_eq!(info.schema, connection_file::SCHEMA_VERSION);
    assert!(info.wire_version.is_none_or(|v| v == subc_protocol::PROTOCOL_VERSION));
    assert!(!info.endpoints.is_empty() && info.key.len() >= MIN_KEY_LEN);
    let _ = info.endpoints.iter().map(Endpoint::bare_host).count();
    let shown = format!("{info:?}");
    assert!(shown.contains("bytes redacted"), "the key is redacted: {shown}");
}

#[test]
fn fuzz_subc_connection_file() {
    let dir = crate::scratch_dir();
    let path = dir.path().join("subc-connection.json");
    fuzz("subc.connection_file", 200, |g| {
        let doc = connection_doc(g);
        let bytes =
            if g.chance(8) { serde_json::to_vec(&doc).unwrap() } else { g.mutant_bytes(&doc, CONNECTION_MEMBERS) };
        let parsed = connection_file::parse(&bytes);
        match &parsed {
            Ok(info) => check_connection_info(info),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        // The same bytes through the file: the owner-only check first, then the same answer.
        std::fs::write(&path, &bytes).unwrap();
        let mode = if g.chance(6) { *g.pick(&[0o640, 0o604, 0o660, 0o644]) } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        match (connection_file::read(&path), parsed) {
            (Err(ConnectionFileError::TooLarge { len, .. }), _) => {
                assert!(len > 64 * 1024 && len == bytes.len() as u64)
            }
            (Err(ConnectionFileError::InsecurePermissions { mode: m, .. }), _) => {
                assert_eq!((m, mode != 0o600), (mode, true))
            }
            (Ok(a), Ok(b)) => assert_eq!((a, mode), (b, 0o600)),
            (Err(a), Err(b)) => assert_eq!((a.to_string(), mode), (b.to_string(), 0o600)),
            (a, b) => panic!("the file read {a:?} but its bytes parse {b:?}"),
        }
    });
    // A file larger than any connection file is refused by size, not parsed.
    std::fs::write(&path, vec![b' '; 65 * 1024]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(connection_file::read(&path), Err(ConnectionFileError::TooLarge { .. })));
}

/// What the loopback daemon did with one connection.
struct Served {
    /// The server message was the correctly signed one for this file's daemon id.
    valid: bool,
    /// The `ClientAuth` the client sent, if any, and whether it verifies.
    client_auth: Option<bool>,
}

fn read_message(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let len = u32::from_le_bytes(len);
    if len > MAX_AUTH_MESSAGE_LEN {
        return None;
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

fn nonce_of(v: &Value, member: &str) -> Option<[u8; 32]> {
    let bytes: Vec<u8> = v
        .get(member)?
        .as_array()?
        .iter()
        .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
        .collect::<Option<_>>()?;
    bytes.try_into().ok()
}

/// Serves one handshake: reads the real `ClientHello`, signs a `ServerProof` for `info`, mutates
/// it (or not), sends it and closes its write side, then reads a `ClientAuth` if one comes.
fn serve(s: &mut TcpStream, info: &ConnectionInfo, g: &mut Gen) -> Served {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello: Value = serde_json::from_slice(&read_message(s).expect("a ClientHello")).unwrap();
    let client_nonce = nonce_of(&hello, "client_nonce").expect("a client nonce");
    let server_nonce: [u8; 32] = std::array::from_fn(|_| g.byte());
    let proof = handshake::compute_proof(&info.key, SERVER_PROOF_DOMAIN, &client_nonce, &server_nonce, &info.daemon_id);
    let message = json!({"daemon_id": info.daemon_id, "server_nonce": server_nonce, "daemon_ver": "0.39.3", "server_proof": proof});
    let intact = serde_json::to_vec(&message).unwrap();
    let mut body = intact.clone();
    let mut len = body.len() as u32;
    let mut cut = None;
    match g.below(8) {
        0 => {}
        1 => {
            let random = g.u64() as u32;
            len = *g.pick(&[MAX_AUTH_MESSAGE_LEN + 1, u32::MAX, len + 1, len.saturating_sub(1), 0, random]);
        }
        2 => cut = Some(g.below(4 + body.len())),
        3 | 4 => {
            body = g.mutant_bytes(&message, &["daemon_id", "server_nonce", "daemon_ver", "server_proof"]);
            len = body.len() as u32;
        }
        _ => {
            g.mutate_bytes(&mut body, &intact);
            len = body.len() as u32;
        }
    }
    let mut wire = len.to_le_bytes().to_vec();
    wire.extend_from_slice(&body);
    if let Some(cut) = cut {
        wire.truncate(cut);
    }
    let valid = wire[..] == [&(intact.len() as u32).to_le_bytes()[..], &intact[..]].concat()[..];
    let _ = s.write_all(&wire);
    let _ = s.shutdown(Shutdown::Write);
    // The client answers with a ClientAuth only after the proof verified; otherwise it closes.
    let client_auth = read_message(s).map(|auth| {
        let v: Value = serde_json::from_slice(&auth).unwrap_or(Value::Null);
        let expected =
            handshake::compute_proof(&info.key, CLIENT_AUTH_DOMAIN, &client_nonce, &server_nonce, &info.daemon_id);
        nonce_of(&v, "client_auth") == Some(expected)
    });
    Served { valid, client_auth }
}

#[test]
fn fuzz_subc_handshake() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let info = ConnectionInfo {
        schema: 1,
        wire_version: Some(2),
        endpoints: vec![Endpoint { host: "127.0.0.1".into(), port }],
        key: (0..32).collect(),
        daemon_id: std::array::from_fn(|i| i as u8),
        pid: None,
        daemon_ver: "test".into(),
    };
    fuzz("subc.handshake", 100, |g| {
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let mut server_gen = Gen::new(g.u64(), 0);
        let daemon_info = info.clone();
        let daemon = std::thread::spawn(move || serve(&mut server, &daemon_info, &mut server_gen));
        let result = handshake::authenticate(&mut client, &info, Duration::from_secs(5));
        drop(client);
        let served = daemon.join().expect("the loopback daemon");
        match result {
            Ok(_) => {
                // Only a peer that proved the key over its own nonce and id is answered (a
                // mutant may differ in what is not signed: `daemon_ver`, spacing, member order).
                assert_eq!(served.client_auth, Some(true), "the client's auth verifies");
            }
            Err(e) => {
                assert!(!served.valid, "a correctly signed proof was refused: {e}");
                assert_eq!(served.client_auth, None, "a refused peer got a ClientAuth ({e})");
                assert!(
                    matches!(
                        e,
                        HandshakeError::Io { .. }
                            | HandshakeError::Json { .. }
                            | HandshakeError::MessageTooLarge { .. }
                            | HandshakeError::InvalidServerProof
                            | HandshakeError::DaemonIdMismatch
                    ),
                    "{e:?}"
                );
            }
        }
    });
}

/// A handler that acts as broca's would on the frames it is handed: it answers requests and
/// health checks through the outbound handle, so replies race the daemon's frames.
struct Answering {
    out: broca::subc::Outbound,
}

impl broca::subc::Handler for Answering {
    fn on_request(&mut self, route: broca::subc::Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        let _ = self.out.reply(route, corr, body);
    }
    fn on_cancel(&mut self, _route: broca::subc::Route, _corr: u64) {}
    fn on_route_closed(&mut self, _route: broca::subc::Route) {}
    fn on_control(&mut self, request: broca::subc::ControlRequest) {
        if let broca::subc::ControlRequest::HealthCheck { corr } = request {
            let _ = self.out.health(corr, broca::subc::health_ok(json!({})));
        }
    }
    fn on_shutdown(&mut self) {}
}

/// The route.bind request body the daemon sends.
fn bind_body(channel: u16, epoch: u32) -> Value {
    json!({
        "op": "route.bind", "route_channel": channel, "epoch": epoch,
        "target": {"kind": "management_surface", "module_id": "broca"},
        "identity": {"harness": "h", "session": "s", "project_root": "/p"},
        "principal": {"kind": "direct"}
    })
}

const CONTROL_NAMES: &[&str] = &[
    "op",
    "route_channel",
    "epoch",
    "target",
    "kind",
    "module_id",
    "identity",
    "harness",
    "session",
    "project_root",
    "principal",
    "scope",
    "route.bind",
    "route.close",
    "health.check",
    "scope.sync",
    "generation",
    "scopes",
];

/// A daemon's frames after registration: binds, requests, cancels, control requests, pings,
/// goodbyes, with their JSON bodies mutated, then damaged at the byte level now and then.
/// Returns the bytes and whether they are still whole frames without a GOODBYE (so the module
/// must still be serving after them).
fn daemon_stream(g: &mut Gen) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut goodbye = false;
    let mut frame = |ty, flags: u8, ch: u16, ep: u32, corr: u64, body: &[u8]| {
        out.extend(frame::encode(ty, Flags(flags), ch, ep, corr, body).unwrap());
    };
    for n in 0..g.range(1, 12) {
        let corr = n as u64 + 1;
        let (ch, ep) = (1 + g.below(3) as u16, 1 + g.below(3) as u32);
        match g.below(8) {
            0 | 1 => {
                let mut body = bind_body(ch, ep);
                if g.chance(2) {
                    g.mutate_json(&mut body, CONTROL_NAMES);
                }
                frame(FrameType::Request, 0, 0, 0, corr, &serde_json::to_vec(&body).unwrap());
            }
            2 => {
                let mut body = json!({"op": g.pick(&["health.check", "route.close", "scope.sync", "nope"])});
                g.mutate_json(&mut body, CONTROL_NAMES);
                frame(FrameType::Request, 0, 0, 0, corr, &serde_json::to_vec(&body).unwrap());
            }
            3 => frame(FrameType::Request, 2, ch, ep, corr, br#"{"method":"run.status","params":{}}"#),
            4 => frame(FrameType::Cancel, 2, ch, ep, g.below(4) as u64, b""),
            5 => frame(
                FrameType::Push,
                0,
                0,
                0,
                corr,
                &serde_json::to_vec(&json!({"op": "route.closed", "route_channel": ch, "epoch": ep})).unwrap(),
            ),
            6 => frame(FrameType::Response, 0, 0, 0, corr, br#"{"op":"scope.sync","generation":1,"results":[]}"#),
            _ => {
                let ty = *g.pick(&[FrameType::Ping, FrameType::Pong, FrameType::Goodbye]);
                goodbye |= ty == FrameType::Goodbye;
                frame(ty, 2, 0, 0, corr, b"");
            }
        }
    }
    let mut serving = !goodbye;
    if g.chance(6) {
        let intact = out.clone();
        g.mutate_bytes(&mut out, &intact);
        serving = false;
    }
    (out, serving)
}

#[test]
fn fuzz_subc_io_thread() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ack = subc_protocol::ModuleHelloAckBody {
        negotiated_ver: 2,
        subc_ops: Vec::new(),
        subc_capabilities: Vec::new(),
        storage: None,
        machine_id: None,
    };
    fuzz("subc.io_thread", 50, |g| {
        let module_side = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut daemon, _) = listener.accept().unwrap();
        daemon.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // As `subc::connect` sets it (and the daemon): no Nagle delay between small frames.
        module_side.set_nodelay(true).unwrap();
        daemon.set_nodelay(true).unwrap();
        let conn =
            broca::subc::ModuleConn::registered(module_side, Decoder::new(), ack.clone(), "0.39.3".into()).unwrap();
        let out = conn.outbound();
        let authorizer =
            |bind: &broca::subc::BindRequest| broca::serve::authorize(bind, &broca::federation::Federation::default());
        let running = conn.start(Answering { out }, authorizer).unwrap();
        let (stream, serving) = daemon_stream(g);
        // A damaged stream may leave the module waiting for the rest of a frame: wait less.
        let wait = if serving { Duration::from_secs(5) } else { Duration::from_millis(200) };
        daemon.set_read_timeout(Some(wait)).unwrap();
        let _ = daemon.write_all(&stream);
        // A final Ping: a module still serving answers it after everything before it.
        let _ = daemon.write_all(&frame::encode(FrameType::Ping, Flags(2), 0, 0, u64::MAX, b"").unwrap());
        let mut d = Decoder::new();
        let mut buf = [0u8; 8192];
        let mut ponged = false;
        'read: loop {
            let n = match daemon.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            d.feed(&buf[..n]);
            // Everything the module writes is a well-formed frame.
            while let Some(f) = d.next_frame().expect("the module writes frames") {
                if f.header.ty == FrameType::Pong && f.header.corr == u64::MAX {
                    ponged = true;
                    break 'read;
                }
                if f.header.ty == FrameType::Error && f.header.channel == 0 {
                    let e: subc_protocol::ErrorBody = serde_json::from_slice(&f.body).expect("a typed error body");
                    assert!(!e.code.is_empty());
                }
            }
        }
        drop(daemon);
        let end = running.join();
        // A module that stopped serving says why: the stream was not frames, or the daemon
        // said GOODBYE or closed.
        assert!(ponged || !serving, "whole frames without a GOODBYE, and no Pong: {end:?}");
        if !ponged {
            assert!(
                matches!(
                    end,
                    broca::subc::ConnectionEnd::Protocol(_)
                        | broca::subc::ConnectionEnd::Goodbye
                        | broca::subc::ConnectionEnd::Eof
                        | broca::subc::ConnectionEnd::Reset(_)
                ),
                "{end:?}"
            );
        }
    });
}
