//! A line-level MCP client for tests: the real `broca-mcp` binary as a child process, its
//! stdout read on a thread, every read bounded by [`STEP`].
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The longest wait for one answer.
pub const STEP: Duration = Duration::from_secs(10);

pub struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Mcp {
    /// The binary with `args`, started in `cwd` (its default project root).
    pub fn start(args: &[&str], cwd: &Path) -> Mcp {
        let mut child = Command::new(env!("CARGO_BIN_EXE_broca-mcp"))
            .args(args)
            .env_remove("SUBC_CONNECTION_FILE")
            .env("CK_LOG", std::env::var("BROCA_MCP_LOG").unwrap_or_else(|_| "warn".into()))
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("BROCA_MCP_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .expect("spawn broca-mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Mcp { child, stdin, lines }
    }

    pub fn write(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, v: Value) {
        self.write(v.to_string().as_bytes());
    }

    /// The next line on stdout, as JSON (stdout carries nothing else).
    pub fn recv(&self) -> Value {
        match self.lines.recv_timeout(STEP) {
            Ok(line) => serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout is not JSON-RPC ({e}): {line}")),
            Err(RecvTimeoutError::Timeout) => panic!("no answer within {STEP:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("broca-mcp closed stdout"),
        }
    }

    /// The answer to request `id`, with every other message read before it.
    pub fn answer(&self, id: &Value) -> (Value, Vec<Value>) {
        let until = Instant::now() + STEP;
        let mut others = Vec::new();
        loop {
            assert!(Instant::now() < until, "no answer to {id} within {STEP:?}");
            let msg = self.recv();
            if &msg["id"] == id && msg.get("method").is_none() {
                return (msg, others);
            }
            others.push(msg);
        }
    }

    pub fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let (answer, others) = self.answer(&json!(id));
        assert!(others.is_empty(), "unexpected messages before the answer to {id}: {others:?}");
        answer
    }

    pub fn tool(&mut self, id: u64, name: &str, arguments: Value) -> Value {
        self.request(id, "tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// Proves the process still answers, in order: a ping's answer is the next message.
    pub fn alive(&mut self, id: u64) {
        let answer = self.request(id, "ping", json!({}));
        assert_eq!(answer, json!({"jsonrpc": "2.0", "id": id, "result": {}}));
    }

    pub fn initialize(&mut self, version: &str) -> Value {
        let params =
            json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});
        self.request(1, "initialize", params)
    }

    /// Closes stdin and expects a clean exit.
    pub fn finish(mut self) {
        self.stdin.take();
        let until = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "broca-mcp exited {status}");
                return;
            }
            assert!(Instant::now() < until, "broca-mcp did not exit after stdin closed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn error_code(msg: &Value) -> i64 {
    msg["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {msg}"))
}
