//! A real `nats-server` on loopback for the step-hint tests, and a subscriber that captures
//! what is published on it. Tests that need the server skip by name when `nats-server` is not
//! on PATH (`scripts/install-test-deps` installs Debian's package).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../skip/mod.rs"]
mod skip;

/// How long a server or a subscription may take to come up.
const UP: Duration = Duration::from_secs(10);

/// Whether `nats-server` can be started here; prints the skip line for `case` when not.
pub fn available(case: &str) -> bool {
    let found = Command::new("nats-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if found.is_ok_and(|s| s.success()) {
        return true;
    }
    skip::skip(case, "nats-server is not on PATH (scripts/install-test-deps installs it)");
    false
}

/// One `nats-server` process; dropping it kills it.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    extra: Vec<String>,
}

impl NatsServer {
    /// A server on a free loopback port, with `extra` arguments (say `--user`/`--pass`).
    pub fn start(extra: &[&str]) -> NatsServer {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        NatsServer::start_on(port, extra.iter().map(|s| s.to_string()).collect())
    }

    fn start_on(port: u16, extra: Vec<String>) -> NatsServer {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(&extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        let until = Instant::now() + UP;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "nats-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        NatsServer { child, port, extra }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server and starts a new one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let next = NatsServer::start_on(self.port, std::mem::take(&mut self.extra));
        *self = next;
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One message as the subscriber received it, with what `check` said at that moment.
#[derive(Clone, Debug)]
pub struct Captured {
    pub subject: String,
    pub body: Vec<u8>,
    pub checked: bool,
}

/// A subscription on a running server; every message is captured with `check(subject, body)`
/// evaluated the moment it arrives (the step-hint tests read the WAL there).
pub struct Subscriber {
    pub captured: Arc<Mutex<Vec<Captured>>>,
    _stream: TcpStream,
}

pub type Check = Box<dyn FnMut(&str, &[u8]) -> bool + Send>;

impl Subscriber {
    pub fn start(addr: &str, subject: &str, mut check: Check) -> Subscriber {
        let mut stream = TcpStream::connect(addr).expect("the subscriber connects");
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("INFO "), "{line}");
        write!(stream, "CONNECT {{\"verbose\":false,\"protocol\":1}}\r\nSUB {subject} 1\r\nPING\r\n").unwrap();
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.trim_end() == "PONG" {
                break;
            }
            assert!(!line.starts_with("-ERR"), "{line}");
        }
        let captured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&captured);
        let mut writer = stream.try_clone().unwrap();
        std::thread::spawn(move || loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line == "PING" {
                let _ = writer.write_all(b"PONG\r\n");
                continue;
            }
            let Some(rest) = line.strip_prefix("MSG ") else { continue };
            let fields: Vec<&str> = rest.split(' ').collect();
            let subject = fields[0].to_owned();
            let size: usize = fields.last().unwrap().parse().unwrap();
            let mut body = vec![0; size + 2];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            body.truncate(size);
            let checked = check(&subject, &body);
            sink.lock().unwrap().push(Captured { subject, body, checked });
        });
        Subscriber { captured, _stream: stream }
    }

    /// Waits until at least `n` messages arrived (or `within` passed); returns them all.
    pub fn wait_for(&self, n: usize, within: Duration) -> Vec<Captured> {
        let until = Instant::now() + within;
        loop {
            let got = self.captured.lock().unwrap().clone();
            if got.len() >= n || Instant::now() > until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self._stream.shutdown(std::net::Shutdown::Both);
    }
}
