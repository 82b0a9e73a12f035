//! The scripted tool provider: `broca-mock --subc` (a real subc module under each rig's daemon)
//! serving the suite's one tool, `conformance_echo`, with its `from_dir` behaviour. A scripted
//! call's result is written to the results directory before the session's first send, keyed by
//! the SHA-256 of the arguments' canonical JSON; a held call waits at the provider while its
//! `.hold` file exists and marks its arrival with a `.held` file. Calls are counted from
//! broca-mock's call log. Directory and log live outside every state root, so no kill or restart
//! of broca can touch them, and they span every rig of the run.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cortexkit_role_llm_runner_conformance::{ScriptedLateEntry, ScriptedToolCall, SCRIPTED_TOOL};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::call_log;

/// How long `await_tool_call` waits for the provider to hold a call.
const ARRIVAL: Duration = Duration::from_secs(30);

pub struct Tools {
    pub dir: PathBuf,
    pub script: PathBuf,
    pub call_log: PathBuf,
}

/// The file stem broca-mock's `from_dir` answer uses for `arguments`.
fn key(arguments: &Value) -> String {
    Sha256::digest(call_log::canonical_json(arguments).as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

impl Tools {
    /// Writes the tool script under `base` (outside every state root).
    pub fn create(base: &Path) -> Result<Tools, String> {
        let dir = base.join("tool-results");
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let script = base.join("tools.json");
        let text = json!({
            "implementation_version": "broca conformance adapter",
            "tools": [{
                "name": SCRIPTED_TOOL,
                "description": "Answers the conformance suite's scripted result for its arguments.",
                "input_schema": {"type": "object"},
                "default": true,
                // With held replies declared on broca's call routes (the rig sets the debug
                // marker) the tool answers tool-result/v1 bodies and may hold a call.
                "result_format": "tool-result/v1",
                // The output_refs cases' slots: `data` holds exactly one reference, `program`
                // is scanned as rich-ui/1 source (llm-runner §9.13).
                "reference_slots": [{"name": "data", "kind": "token"}, {"name": "program", "kind": "source:rich-ui/1"}],
                "behaviour": {"from_dir": dir},
            }],
            "late_results": true,
            "late_results_dir": base.join("late-results"),
        });
        fs::write(&script, text.to_string()).map_err(|e| format!("{}: {e}", script.display()))?;
        Ok(Tools { dir, script, call_log: base.join("tool-calls.jsonl") })
    }

    /// Scripts `call`'s result (and its hold) at the provider.
    pub fn script_call(&self, call: &ScriptedToolCall) -> Result<(), String> {
        if call.tool != SCRIPTED_TOOL {
            return Ok(());
        }
        let key = key(&call.arguments);
        let result = self.dir.join(format!("{key}.json"));
        fs::write(&result, call.result.to_string()).map_err(|e| format!("{}: {e}", result.display()))?;
        if call.hold {
            let hold = self.dir.join(format!("{key}.hold"));
            fs::write(&hold, b"").map_err(|e| format!("{}: {e}", hold.display()))?;
        }
        Ok(())
    }

    /// How many times the provider received a call of the scripted tool with `arguments`.
    pub fn invocations(&self, arguments: &Value) -> Result<usize, String> {
        let counts = call_log::read(&self.call_log).map_err(|e| format!("the provider's call log: {e:?}"))?;
        let wanted = call_log::canonical_json(arguments);
        Ok(counts.calls_to(SCRIPTED_TOOL).filter(|c| call_log::canonical_json(&c.arguments) == wanted).count())
    }

    /// Resolves once the provider holds the call with `arguments`.
    pub async fn await_held(&self, arguments: &Value) -> Result<(), String> {
        let held = self.dir.join(format!("{}.held", key(arguments)));
        let until = Instant::now() + ARRIVAL;
        while !held.exists() {
            if Instant::now() > until {
                return Err(format!("the provider held no call with {arguments} within {ARRIVAL:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Makes the provider answer the call with `arguments` with a `held-reply/v1` first reply.
    pub fn hold_reply(&self, arguments: &Value, reason: &str) -> Result<(), String> {
        let path = self.dir.join(format!("{}.held-reply", key(arguments)));
        fs::write(&path, json!({"reason": reason}).to_string()).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The call_key of the call with `arguments`, once the provider has held it.
    pub async fn held_call_key(&self, arguments: &Value) -> Result<String, String> {
        let path = self.dir.join(format!("{}.call_key", key(arguments)));
        let until = Instant::now() + ARRIVAL;
        loop {
            if let Ok(text) = fs::read_to_string(&path) {
                return Ok(text.trim().to_owned());
            }
            if Instant::now() > until {
                return Err(format!("the provider held no call with {arguments} within {ARRIVAL:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Publishes the provider's late entry for the held call with `arguments` (written whole:
    /// a temporary file renamed into place).
    pub fn publish_late(&self, arguments: &Value, entry: &ScriptedLateEntry) -> Result<(), String> {
        let mut body = json!({"kind": entry.kind()});
        if let Some(result) = entry.result_body() {
            body["result"] = result.clone();
        }
        if let Some(reason) = entry.reason() {
            body["reason"] = json!(reason);
        }
        let stem = key(arguments);
        let (tmp, path) = (self.dir.join(format!("{stem}.late.tmp")), self.dir.join(format!("{stem}.late")));
        fs::write(&tmp, body.to_string()).map_err(|e| format!("{}: {e}", tmp.display()))?;
        fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Lets the held call with `arguments` answer.
    pub fn release(&self, arguments: &Value) -> Result<(), String> {
        let hold = self.dir.join(format!("{}.hold", key(arguments)));
        match fs::remove_file(&hold) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", hold.display())),
        }
    }
}
