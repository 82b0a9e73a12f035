//! The serving side's plain consumer connections to its own daemon (no HELLO; `subc-wire.md`
//! §12.4): dial and handshake, whole frames from a blocking socket, `catalog.list`, and the
//! manifest a catalog entry re-exports.
//!
//! The serving side speaks frames itself rather than through broca's `Consumer`: it relays by
//! `(channel, epoch, corr)` and must see every route close the daemon or the module sends,
//! including on routes with nothing in flight.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use broca::subc::frame::{self, Decoder};
use broca::subc::{connection_file, handshake};
use serde_json::{json, Map, Value};
use subc_protocol::{Flags, Frame, FrameType, Priority};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The wait for a `catalog.list` answer.
const CATALOG_TIMEOUT: Duration = Duration::from_secs(5);

pub fn control_flags() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

pub fn data_flags() -> Flags {
    Flags::new(false, Priority::Interactive, false)
}

/// An authenticated consumer connection to the daemon named by `conn_file`.
pub fn dial(conn_file: &Path) -> Result<TcpStream, String> {
    let info = connection_file::read(conn_file).map_err(|e| e.to_string())?;
    let endpoint = info.endpoints.first().ok_or("the connection file names no endpoint")?;
    let addr = (endpoint.bare_host(), endpoint.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("the connection file names no address")?;
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    handshake::authenticate(&mut stream, &info, handshake::HANDSHAKE_DEADLINE).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Whole frames from a blocking socket.
pub struct Frames {
    stream: TcpStream,
    decoder: Decoder,
    buf: Vec<u8>,
}

impl Frames {
    pub fn new(stream: TcpStream) -> Frames {
        Frames { stream, decoder: Decoder::new(), buf: vec![0; 64 << 10] }
    }

    /// The next frame; `Ok(None)` when the daemon closed the connection.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        loop {
            if let Some(f) = self.decoder.next_frame().map_err(|e| e.to_string())? {
                return Ok(Some(f));
            }
            match self.stream.read(&mut self.buf) {
                Ok(0) => return Ok(None),
                Ok(n) => self.decoder.feed(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// `module`'s `catalog.list` entry, when it is registered and ready.
pub fn catalog_entry(conn_file: &Path, module: &str) -> Result<Option<Value>, String> {
    let stream = dial(conn_file)?;
    stream.set_read_timeout(Some(CATALOG_TIMEOUT)).map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let body = json!({"op": "catalog.list", "module_id": module}).to_string();
    let request =
        frame::encode(FrameType::Request, control_flags(), 0, 0, 1, body.as_bytes()).map_err(|e| e.to_string())?;
    writer.write_all(&request).map_err(|e| e.to_string())?;
    let mut frames = Frames::new(stream);
    let answer = loop {
        let Some(f) = frames.next_frame()? else { return Err("the daemon closed the connection".into()) };
        let h = f.header;
        match h.ty {
            FrameType::Ping => {
                let pong = frame::encode(FrameType::Pong, h.flags, 0, 0, h.corr, &[]).map_err(|e| e.to_string())?;
                writer.write_all(&pong).map_err(|e| e.to_string())?;
            }
            FrameType::Response if h.channel == 0 && h.corr == 1 => break f.body,
            FrameType::Error if h.channel == 0 && h.corr == 1 => {
                return Err(format!("catalog.list refused: {}", String::from_utf8_lossy(&f.body)))
            }
            _ => {}
        }
    };
    let _ = writer.shutdown(std::net::Shutdown::Both);
    let list: Value = serde_json::from_slice(&answer).map_err(|e| format!("catalog.list answer: {e}"))?;
    let entry = list["modules"].as_array().and_then(|modules| {
        modules.iter().find(|m| m["module_id"] == module && m.get("ready").and_then(Value::as_bool) != Some(false))
    });
    Ok(entry.cloned())
}

/// The manifest a `catalog.list` entry mirrors: every manifest member the catalog carries,
/// except what only the serving daemon can honour (`capabilities.requires` and
/// `must_never_reach`: the exported module's needs are met where it runs; readiness: the
/// serving daemon refuses an open itself while its module warms up; `self_signals`: the busy
/// gauges the module reports to its own daemon, which the re-export cannot report).
pub fn manifest(entry: &Value) -> Value {
    let mut m = Map::new();
    m.insert("module_id".into(), entry["module_id"].clone());
    m.insert("module_version".into(), entry.get("module_version").cloned().unwrap_or_else(|| json!("0.0.0")));
    m.insert("protocol_ver".into(), json!(subc_protocol::PROTOCOL_VERSION));
    m.insert("provides".into(), entry.get("roles").cloned().unwrap_or_else(|| json!([])));
    for key in [
        "provenance",
        "events",
        "operation_delivery",
        "operation_payload",
        "flow_operations",
        "confirm_operations",
        "rich_ui",
        "role_declarations",
    ] {
        if let Some(v) = entry.get(key) {
            m.insert(key.into(), v.clone());
        }
    }
    if let Some(provides) = entry.pointer("/capabilities/provides") {
        m.insert("capabilities".into(), json!({"provides": provides}));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_keeps_roles_and_hints_and_drops_the_serving_sides_needs() {
        let entry = json!({"module_id": "broca", "ready": true, "module_version": "0.1.0",
            "roles": [{"role": "management_surface", "operations": []}], "control_ops": ["route.bind"],
            "operation_delivery": {"session.subscribe": "watch"}, "nonce_verified": true, "self_signals": [],
            "capabilities": {"provides": [{"capability": "llm-runner/v1"}], "requires": [{"capability": "x"}]}});
        let m = manifest(&entry);
        assert_eq!(m["provides"], entry["roles"]);
        assert_eq!(m["operation_delivery"], entry["operation_delivery"]);
        assert_eq!(m["capabilities"], json!({"provides": [{"capability": "llm-runner/v1"}]}));
        for gone in ["ready", "control_ops", "nonce_verified", "roles", "self_signals"] {
            assert!(m.get(gone).is_none(), "{gone}");
        }
    }
}
