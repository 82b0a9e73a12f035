//! The io thread against a scripted fake daemon on loopback TCP: the behaviours the real daemon
//! never provokes on purpose (stale epochs, unbound channels, equal-epoch rebinds, undecodable
//! control requests, resets), plus the orderly ends. `tests/subc_module.rs` covers the real daemon.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use subc_protocol::{ErrorBody, Flags, Frame, FrameType, ModuleHelloAckBody, Principal};

use super::frame::{self, Decoder};
use super::module::{BindRequest, ConnectionEnd, ControlReply, ControlRequest, Handler, ModuleConn, Running};
use super::outbound::Outbound;
use super::routes::Route;

const WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, PartialEq)]
enum Seen {
    Bound(Route),
    Request(Route, u64, Vec<u8>),
    Cancel(Route, u64),
    Closed(Route),
    Health(u64),
    ControlReply(u64, ControlReply),
    Shutdown,
}

/// Records what it sees; answers a request whose body is `twice` with two Responses, inline.
struct Recorder {
    seen: Sender<Seen>,
    out: Outbound,
}

impl Handler for Recorder {
    fn on_route_bound(&mut self, bind: BindRequest) {
        self.seen.send(Seen::Bound(bind.route)).unwrap();
    }
    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        if body == b"twice" {
            self.out.reply(route, corr, b"one".to_vec()).unwrap();
            self.out.reply(route, corr, b"two".to_vec()).unwrap();
        }
        self.seen.send(Seen::Request(route, corr, body)).unwrap();
    }
    fn on_cancel(&mut self, route: Route, corr: u64) {
        self.seen.send(Seen::Cancel(route, corr)).unwrap();
    }
    fn on_route_closed(&mut self, route: Route) {
        self.seen.send(Seen::Closed(route)).unwrap();
    }
    fn on_control(&mut self, request: ControlRequest) {
        if let ControlRequest::HealthCheck { corr } = request {
            self.seen.send(Seen::Health(corr)).unwrap();
        }
    }
    fn on_control_reply(&mut self, corr: u64, reply: ControlReply) {
        self.seen.send(Seen::ControlReply(corr, reply)).unwrap();
    }
    fn on_shutdown(&mut self) {
        self.seen.send(Seen::Shutdown).unwrap();
    }
}

/// The daemon's end of the connection.
struct Daemon {
    sock: TcpStream,
    decoder: Decoder,
}

impl Daemon {
    fn send(&mut self, ty: FrameType, flags: u8, channel: u16, epoch: u32, corr: u64, body: &[u8]) {
        self.sock.write_all(&frame::encode(ty, Flags(flags), channel, epoch, corr, body).unwrap()).unwrap();
    }

    fn bind(&mut self, corr: u64, channel: u16, epoch: u32, principal: bool) {
        let mut body = serde_json::json!({
            "op": "route.bind", "route_channel": channel, "epoch": epoch,
            "target": {"kind": "management_surface", "module_id": "t"},
            "identity": {"harness": "h", "session": "s", "project_root": "/"}
        });
        if principal {
            body["principal"] = serde_json::json!({"kind": "direct"});
        }
        self.send(FrameType::Request, 0, 0, 0, corr, body.to_string().as_bytes());
    }

    /// The next frame from the module, or `None` at EOF.
    fn recv(&mut self) -> Option<Frame> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(f) = self.decoder.next_frame().unwrap() {
                return Some(f);
            }
            match self.sock.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.decoder.feed(&buf[..n]),
                Err(e) => panic!("fake daemon read: {e}"),
            }
        }
    }

    fn expect(&mut self, ty: FrameType, corr: u64) -> Frame {
        let f = self.recv().unwrap_or_else(|| panic!("EOF while expecting {ty:?} corr {corr}"));
        assert_eq!((f.header.ty, f.header.corr), (ty, corr), "{f:?}");
        f
    }

    /// Pings and waits for the Pong: every frame the module queued before it has been read.
    fn sync(&mut self, corr: u64) {
        self.send(FrameType::Ping, 2, 0, 0, corr, &[]);
        let pong = self.expect(FrameType::Pong, corr);
        assert_eq!(pong.header.flags.0, 2, "Pong echoes the Ping's flags");
    }
}

fn start() -> (Running, Daemon, Receiver<Seen>, Outbound) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let module_side = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (daemon_side, _) = listener.accept().unwrap();
    daemon_side.set_read_timeout(Some(WAIT)).unwrap();
    let ack = ModuleHelloAckBody {
        negotiated_ver: 2,
        subc_ops: Vec::new(),
        subc_capabilities: Vec::new(),
        storage: None,
        machine_id: None,
    };
    let conn = ModuleConn::registered(module_side, Decoder::new(), ack, "test".into()).unwrap();
    let (tx, seen) = crossbeam_channel::unbounded();
    let out = conn.outbound();
    // Admits only binds the daemon attested.
    let authorizer = |bind: &BindRequest| match bind.principal {
        Some(Principal::Direct) | Some(Principal::Reserved { .. }) => Ok(()),
        _ => Err(ErrorBody::new("not_authorized", "unattested caller")),
    };
    let running = conn.start(Recorder { seen: tx, out: out.clone() }, authorizer).unwrap();
    (running, Daemon { sock: daemon_side, decoder: Decoder::new() }, seen, out)
}

fn next(seen: &Receiver<Seen>) -> Seen {
    seen.recv_timeout(WAIT).expect("the handler saw nothing")
}

fn error_code(f: &Frame) -> String {
    serde_json::from_slice::<ErrorBody>(&f.body).unwrap().code
}

#[test]
fn routes_bind_replace_and_close_by_epoch_and_strangers_are_dropped() {
    let (running, mut d, seen, _out) = start();
    let r1 = Route::new(1, 1);
    // Before any bind: a request on (1, 1) is unbound and dropped.
    d.send(FrameType::Request, 2, 1, 1, 5, b"early");
    d.bind(10, 1, 1, true);
    let ack = d.expect(FrameType::Response, 10);
    assert_eq!(ack.body, br#"{"op":"route.bind"}"#);
    assert_eq!(next(&seen), Seen::Bound(r1));
    // The first request right after the ack finds the route.
    d.send(FrameType::Request, 2, 1, 1, 6, b"hello");
    assert_eq!(next(&seen), Seen::Request(r1, 6, b"hello".to_vec()));
    // Wrong epoch: stale, dropped. Cancel of an unknown corr: dropped.
    d.send(FrameType::Request, 2, 1, 2, 7, b"stale");
    d.send(FrameType::Cancel, 2, 1, 1, 99, &[]);
    d.send(FrameType::Cancel, 2, 1, 1, 6, &[]);
    assert_eq!(next(&seen), Seen::Cancel(r1, 6));
    // An equal epoch is refused; an unattested bind is refused by the authorizer.
    d.bind(11, 1, 1, true);
    assert_eq!(error_code(&d.expect(FrameType::Error, 11)), "route_rejected");
    d.bind(12, 2, 1, false);
    assert_eq!(error_code(&d.expect(FrameType::Error, 12)), "not_authorized");
    // A refused replacement leaves the published route alone; an accepted one replaces it.
    d.bind(13, 1, 2, false);
    assert_eq!(error_code(&d.expect(FrameType::Error, 13)), "not_authorized");
    d.send(FrameType::Request, 2, 1, 1, 8, b"still");
    assert_eq!(next(&seen), Seen::Request(r1, 8, b"still".to_vec()));
    d.bind(14, 1, 2, true);
    d.expect(FrameType::Response, 14);
    let r2 = Route::new(1, 2);
    assert_eq!(next(&seen), Seen::Closed(r1));
    assert_eq!(next(&seen), Seen::Bound(r2));
    // A GOODBYE naming the replaced epoch is stale; the current one closes the route.
    d.send(FrameType::Goodbye, 0, 1, 1, 0, &[]);
    d.send(FrameType::Goodbye, 0, 1, 2, 0, &[]);
    assert_eq!(next(&seen), Seen::Closed(r2));
    d.send(FrameType::Request, 2, 1, 2, 9, b"gone");
    // Undecodable control requests are refused on their corr and the connection stays up.
    d.send(FrameType::Request, 0, 0, 0, 15, br#"{"op":"nope"}"#);
    assert_eq!(error_code(&d.expect(FrameType::Error, 15)), "invalid_request");
    d.sync(16);
    assert!(seen.try_recv().is_err(), "nothing else reached the handler");
    d.send(FrameType::Goodbye, 0, 0, 0, 0, &[]);
    d.expect(FrameType::Goodbye, 0);
    assert!(d.recv().is_none(), "the module half-closed after its GOODBYE");
    drop(d);
    assert!(matches!(running.join(), ConnectionEnd::Goodbye));
    assert_eq!(next(&seen), Seen::Shutdown);
}

#[test]
fn one_terminal_per_request_and_replies_to_closed_routes_are_dropped() {
    let (running, mut d, seen, out) = start();
    let r = Route::new(4, 1);
    d.bind(1, 4, 1, true);
    d.expect(FrameType::Response, 1);
    next(&seen);
    d.send(FrameType::Request, 2, 4, 1, 20, b"twice");
    let reply = d.expect(FrameType::Response, 20);
    assert_eq!(reply.body, b"one");
    assert_eq!(next(&seen), Seen::Request(r, 20, b"twice".to_vec()));
    d.sync(21);
    // A stream frame after the terminal is dropped too; a health check is answered once.
    out.stream_data(r, 20, b"late".to_vec()).unwrap();
    d.send(FrameType::Request, 0, 0, 0, 22, br#"{"op":"health.check"}"#);
    assert_eq!(next(&seen), Seen::Health(22));
    out.health(22, super::health_ok(serde_json::json!({"n": 1}))).unwrap();
    out.health(22, super::health_ok(serde_json::json!({"n": 2}))).unwrap();
    let health: serde_json::Value = serde_json::from_slice(&d.expect(FrameType::Response, 22).body).unwrap();
    assert_eq!(health, serde_json::json!({"op": "health.check", "status": "ok", "metrics": {"n": 1}}));
    // A request open when its route closes: its late answer is dropped.
    d.send(FrameType::Request, 2, 4, 1, 23, b"slow");
    assert_eq!(next(&seen), Seen::Request(r, 23, b"slow".to_vec()));
    d.send(FrameType::Goodbye, 0, 4, 1, 0, &[]);
    assert_eq!(next(&seen), Seen::Closed(r));
    out.reply(r, 23, b"too late".to_vec()).unwrap();
    d.sync(24);
    assert_eq!(out.queued_bytes(), 0, "dropped frames release their bytes");
    // The module stops on its own: GOODBYE, then FIN.
    out.shutdown();
    d.expect(FrameType::Goodbye, 0);
    assert!(d.recv().is_none());
    drop(d);
    assert!(matches!(running.join(), ConnectionEnd::Stopped));
    assert!(out.is_closed());
    assert!(matches!(out.reply(r, 1, Vec::new()), Err(super::SendError::Closed)));
}

#[test]
fn a_control_request_goes_out_on_channel_zero_and_its_answers_come_back_by_corr() {
    let (running, mut d, seen, out) = start();
    out.control_request(2, br#"{"op":"scope.sync","generation":1,"scopes":[]}"#.to_vec()).unwrap();
    let req = d.expect(FrameType::Request, 2);
    assert_eq!((req.header.channel, req.header.epoch, req.header.flags.0), (0, 0, 0));
    assert_eq!(req.body, br#"{"op":"scope.sync","generation":1,"scopes":[]}"#);
    d.send(FrameType::Response, 0, 0, 0, 2, br#"{"op":"scope.sync","generation":1,"results":[]}"#);
    let answer = br#"{"op":"scope.sync","generation":1,"results":[]}"#.to_vec();
    assert_eq!(next(&seen), Seen::ControlReply(2, ControlReply::Response(answer)));
    d.send(FrameType::Error, 0, 0, 0, 3, br#"{"code":"stale_generation","message":"older"}"#);
    let refused = ErrorBody::new("stale_generation", "older");
    assert_eq!(next(&seen), Seen::ControlReply(3, ControlReply::Error(refused)));
    out.shutdown();
    d.expect(FrameType::Goodbye, 0);
    assert!(d.recv().is_none());
    drop(d);
    assert!(matches!(running.join(), ConnectionEnd::Stopped));
}

#[test]
fn a_route_the_module_closes_gets_a_goodbye_on_its_epoch() {
    let (running, mut d, seen, out) = start();
    d.bind(1, 9, 3, true);
    d.expect(FrameType::Response, 1);
    next(&seen);
    out.close_route(Route::new(9, 3)).unwrap();
    let bye = d.expect(FrameType::Goodbye, 0);
    assert_eq!((bye.header.channel, bye.header.epoch), (9, 3));
    assert_eq!(next(&seen), Seen::Closed(Route::new(9, 3)));
    // The daemon's EOF: the module answers GOODBYE, half-closes, and ends cleanly.
    d.sock.shutdown(std::net::Shutdown::Write).unwrap();
    d.expect(FrameType::Goodbye, 0);
    assert!(d.recv().is_none());
    assert!(matches!(running.join(), ConnectionEnd::Eof));
}

#[test]
fn a_reset_is_reported_as_reset() {
    let (running, d, seen, _out) = start();
    // SO_LINGER {on, 0}: closing sends RST instead of FIN.
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid socket descriptor and a correctly sized option value.
    let rc = unsafe {
        libc::setsockopt(
            d.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    drop(d);
    let end = running.join();
    assert!(matches!(end, ConnectionEnd::Reset(_)), "{end:?}");
    assert!(!end.is_clean());
    assert_eq!(next(&seen), Seen::Shutdown);
}

#[test]
fn a_garbled_stream_is_a_protocol_error() {
    let (running, mut d, _seen, _out) = start();
    d.sock.write_all(&[0, 0, 0, 0, 1, 0, 0, 0]).unwrap();
    assert!(matches!(running.join(), ConnectionEnd::Protocol(_)));
}
