//! broca-run's credentials and catalog through a real subc daemon (spec §1b, `catalog-and-vault.md`
//! Part E.2): broca-mock plays `claustrum` (a dev-tools handle naming a vault record), `fusiform`
//! (the catalog, whose mock route points at broca-mock's model endpoint) and the model (which
//! checks the `Authorization` it receives). broca-run starts on a state root with **no** LKG.

use broca_mock::mock;
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use support::{Harness, Options};

const BIN: &str = env!("CARGO_BIN_EXE_broca-run");
const CREDENTIAL: &str = "apikey:mock";
const SECRET: &str = "sk-devtools-secret-4c1d";
const HANDLE: &str = "ckh_devtools_1";

struct Rig {
    h: Harness,
    dir: tempfile::TempDir,
    vault_log: PathBuf,
}

impl Rig {
    fn start() -> Rig {
        let mock = broca_mock::exe();
        let dir = tempfile::Builder::new().prefix("bdt").tempdir_in("/tmp").unwrap();
        let d = dir.path();
        let vault = json!({"credentials": {CREDENTIAL: {"secret": SECRET, "record_version": 3, "principals": ["broca"]}},
                           "handles": {HANDLE: CREDENTIAL}});
        std::fs::write(d.join("vault.json"), vault.to_string()).unwrap();
        let vault_log = d.join("vault.jsonl");
        let claustrum = json!({"program": mock, "args": ["claustrum", "--vault", d.join("vault.json"), "--vault-log", vault_log],
                               "enabled": true, "reserved": true});
        let script = d.join("fusiform.json");
        let fusiform =
            json!({"program": mock, "args": ["--fusiform-script", script], "enabled": true, "reserved": true});
        let opts = Options {
            modules: vec![("claustrum".into(), claustrum), ("fusiform".into(), fusiform)],
            ..Options::default()
        };
        let h = Harness::start_with(opts);
        // The catalog fusiform serves: the seeded one, its mock route pointed at this mock.
        let seeded = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        let mut lkg: Value = serde_json::from_slice(&std::fs::read(seeded).unwrap()).unwrap();
        lkg["response"]["models"]["mock/echo-chat"]["wire.api"] = json!(h.mock.base_url(Some("devtools")));
        std::fs::write(d.join("catalog.json"), lkg.to_string()).unwrap();
        std::fs::write(&script, json!({"catalog": d.join("catalog.json"), "attempts": [{"pages": [4]}]}).to_string())
            .unwrap();
        Rig { h, dir, vault_log }
    }

    fn handles(&self, text: &str, mode: u32) -> PathBuf {
        let path = self.dir.path().join("dev-tools-handles.json");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn run(&self, root: &str, handles: &Path, extra: &[&str]) -> Output {
        let mut c = Command::new(BIN);
        c.arg("--state-root").arg(self.dir.path().join(root)).arg("--project-root").arg(self.dir.path());
        c.arg("--model").arg("mock/echo-chat").arg("--subc").arg(self.h.connection_file()).args(extra).arg("hello");
        c.env_remove("BROCA_PROVIDER_BASE_URL").env("BROCA_DEVTOOLS_HANDLES", handles).env("HOME", self.dir.path());
        c.stdin(Stdio::null()).output().unwrap()
    }

    fn gets(&self) -> usize {
        let text = std::fs::read_to_string(&self.vault_log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["op"] == "credential.get")
            .count()
    }
}

fn text(out: &Output) -> (i32, String, String) {
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn every_file(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(every_file(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn broca_run_reads_its_credential_by_dev_tools_handle_on_a_catalog_it_fetched() {
    let rig = Rig::start();
    let auth = json!({"authorization": format!("Bearer {SECRET}"), "responses": [
        {"events": [{"text": "from the handle"}, {"usage": {"input": 3, "output": 2}}, {"finish": "stop"}]}]});
    rig.h.mock.install("devtools", mock::Script::from_json(&auth.to_string()).unwrap());
    let good = rig.handles(&json!({"handles": {CREDENTIAL: HANDLE}}).to_string(), 0o600);

    // 1. A fresh state root: the catalog comes from fusiform, the credential from the handle.
    let (code, stdout, stderr) = text(&rig.run("root", &good, &[]));
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("from the handle"), "{stdout}");
    assert!(rig.dir.path().join("root/catalog/fusiform-lkg.json").exists(), "broca-run wrote the LKG it fetched");
    assert_eq!(rig.gets(), 1);
    let sent = rig.h.mock.requests("devtools");
    assert_eq!(sent.last().and_then(|r| r.header("authorization")), Some(format!("Bearer {SECRET}").as_str()));
    for path in every_file(&rig.dir.path().join("root")) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains(SECRET), "{} holds the secret", path.display());
    }
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));

    // 2. --auth-bearer wins: no vault read.
    let bearer = json!({"authorization": "Bearer sk-flag", "responses": [
        {"events": [{"text": "from the flag"}, {"finish": "stop"}]}]});
    rig.h.mock.install("devtools", mock::Script::from_json(&bearer.to_string()).unwrap());
    let (code, stdout, stderr) = text(&rig.run("root", &good, &["--auth-bearer", "sk-flag"]));
    assert_eq!((code, stdout.contains("from the flag")), (0, true), "{stdout}\n{stderr}");
    assert_eq!(rig.gets(), 1, "--auth-bearer reads no handle");

    // 3. --base-url without a bearer stays credential-free.
    let free = json!({"responses": [{"events": [{"text": "no credential"}, {"finish": "stop"}]}]});
    rig.h.mock.install("free", mock::Script::from_json(&free.to_string()).unwrap());
    let base = rig.h.mock.base_url(Some("free"));
    let (code, stdout, stderr) = text(&rig.run("root", &good, &["--base-url", &base]));
    assert_eq!((code, stdout.contains("no credential")), (0, true), "{stdout}\n{stderr}");
    assert_eq!(rig.gets(), 1, "--base-url reads no handle");
    assert_eq!(rig.h.mock.requests("free").last().and_then(|r| r.header("authorization")), None);

    // 4. A handles file the loader refuses (group-readable; one bad entry): a typed refusal
    //    naming the file and the credential id, a warning saying why, nothing read or written.
    for (body, mode, why) in [
        (json!({"handles": {CREDENTIAL: HANDLE}}).to_string(), 0o640, "mode 640"),
        (
            json!({"handles": {CREDENTIAL: HANDLE, "apikey:other": "sk-not-a-handle"}}).to_string(),
            0o600,
            "apikey:other",
        ),
    ] {
        let bad = rig.handles(&body, mode);
        let (code, stdout, stderr) = text(&rig.run("fresh-refused", &bad, &[]));
        assert_eq!(code, 2, "{stdout}\n{stderr}");
        assert!(stderr.contains(&format!("no dev-tools handle for {CREDENTIAL}")), "{stderr}");
        assert!(stderr.contains(why), "the warning says why: {stderr}");
        assert_eq!(rig.gets(), 1);
        let wals = every_file(&rig.dir.path().join("fresh-refused"));
        assert!(
            !wals.iter().any(|p| p.extension().is_some_and(|e| e == "wal")),
            "a refusal writes no session: {wals:?}"
        );
    }
}
