//! `broca-run` as a real process against `broca-mock` on loopback: the rig the CLI tests share.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use broca_mock::mock::{MockServer, Script};
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_broca-run");

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub mock: MockServer,
}

impl Rig {
    pub fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let catalog = dir.path().join("root/catalog");
        std::fs::create_dir_all(&catalog).unwrap();
        let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        std::fs::copy(lkg, catalog.join("fusiform-lkg.json")).unwrap();
        Rig { dir, mock: MockServer::start("127.0.0.1:0").unwrap() }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn script(&self, lane: &str, responses: Value) {
        self.mock.install(lane, Script::from_json(&json!({"responses": responses}).to_string()).unwrap());
    }

    pub fn command(&self, lane: &str, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--state-root").arg(self.root()).arg("--base-url").arg(self.mock.base_url(Some(lane)));
        // A real project directory: a CLI turn refuses a missing project root as the module does.
        c.arg("--project-root").arg(self.dir.path()).args(args);
        c.env_remove("BROCA_PROVIDER_BASE_URL").stdin(Stdio::null());
        c
    }

    pub fn run(&self, lane: &str, args: &[&str]) -> Output {
        self.command(lane, args).output().unwrap()
    }
}

pub fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 12, "output": 4}}, {"finish": "stop"}]})
}

pub fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

pub fn unit<'a>(lines: &'a [Value], ty: &str) -> Option<&'a Value> {
    lines.iter().filter(|l| l["kind"] == "control").map(|l| &l["unit"]).find(|u| u["type"] == ty)
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}
