//! Held first replies (`held-reply/v1`, CONTRACT.md §4.1): a call whose behaviour is `held`, or
//! a `from_dir` call whose `<dir>/<key>.held-reply` exists, is held in the late-results store
//! ([`crate::late`]) and answered `{content: [{type: "text", text}], held: {reason}}`.
//!
//! The contract's prerequisites, all checked: the route's bind declared both `held-reply/v1`
//! and `tool-result/v1`, the tool's `result_format` is `tool-result/v1`, the call carries a
//! `call_key`, and the provider serves `late_results` from a store (`late_results_dir`). When
//! one is missing the call answers at once as if it were not held (a `held` behaviour echoes its
//! arguments, a `from_dir` call answers its `<key>.json`), unless `force` sends the held body
//! anyway: a provider breaking the bind's terms, and nothing is recorded to settle it.
//!
//! Order for a held call: the call log's `call` line (as for every call), the durable held
//! record, a `from_dir` call's `<key>.call_key` file, then the held reply.

use super::*;
use crate::late::{principal_text, write_atomic, FromDirHold, HeldRecord, LateStore};
use crate::script::HeldSpec;
use cortexkit_role_tool_provider::consumer_reads_held_reply_v1;
use cortexkit_role_tool_provider::result::HeldReply;

/// A hold the call's behaviour asks for.
#[derive(Debug)]
pub(super) struct HoldPlan {
    spec: HeldSpec,
    from_dir: Option<FromDirHold>,
}

/// What a call that asks to be held answers.
#[derive(Debug, PartialEq)]
pub(super) enum HeldAnswer {
    /// Record `record` (when some) durably, then reply `body`, the held body.
    Held { body: Vec<u8>, record: Option<Box<HeldRecord>> },
    /// A prerequisite is missing (named): answer as if the call were not held.
    Synchronous(&'static str),
}

/// The hold `answer` asks for: a `held` answer, or a `from_dir` call with `<key>.held-reply`
/// (the same members as a `held` behaviour; an unreadable one refuses the call).
pub(super) fn plan(answer: &Answer, arguments: &Value) -> Option<Result<HoldPlan, ErrorBody>> {
    match answer {
        Answer::Held(spec) => Some(Ok(HoldPlan { spec: spec.clone(), from_dir: None })),
        Answer::FromDir(dir) => {
            let key = from_dir_key(arguments);
            let path = dir.join(format!("{key}.held-reply"));
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                Err(e) => return Some(Err(unusable(&path, e))),
            };
            let spec = serde_json::from_slice::<HeldSpec>(&bytes).map_err(|e| unusable(&path, e));
            Some(spec.map(|spec| HoldPlan { spec, from_dir: Some(FromDirHold { dir: dir.clone(), key }) }))
        }
        _ => None,
    }
}

fn unusable(path: &std::path::Path, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new("tool_unavailable", format!("broca-mock: {}: {e}", path.display()))
}

/// Decides a held call: the held body and its record when every prerequisite holds, the held
/// body alone when forced, else a synchronous answer.
pub(super) fn decide(
    plan: HoldPlan,
    bound: &Bound,
    tool: &Tool,
    request: &ToolCallRequest,
    script: &ToolScript,
    store: Option<&LateStore>,
) -> HeldAnswer {
    let missing = if !consumer_reads_held_reply_v1(Some(&bound.consumer_capabilities)) {
        Some("the bind did not declare held-reply/v1 and tool-result/v1")
    } else if tool.entry.result_format != Some(ResultFormat::ToolResultV1) {
        Some("the tool's result_format is not tool-result/v1")
    } else if request.call_key.is_none() {
        Some("the call carries no call_key")
    } else if !script.late_results || store.is_none() {
        Some("the script serves no late_results store (late_results, late_results_dir)")
    } else {
        None
    };
    if let Some(missing) = missing.filter(|_| !plan.spec.force) {
        return HeldAnswer::Synchronous(missing);
    }
    let body = ToolResult::new(vec![ContentPart::text(plan.spec.interim_text())])
        .with_held(HeldReply::new(plan.spec.reason.clone()));
    let body = serde_json::to_vec(&body).expect("results serialize");
    let record = match (missing, &request.call_key) {
        (None, Some(call_key)) => {
            let custodian = principal_text(bound.principal.as_ref());
            let now = now_ms();
            Some(Box::new(HeldRecord {
                call_key: call_key.clone(),
                owner: bound.scope.as_ref().map_or_else(|| custodian.clone(), |s| principal_text(Some(&s.owner))),
                custodian,
                scope_ref: bound.scope.as_ref().map_or_else(|| "unscoped".to_owned(), |s| s.scope_ref.clone()),
                scope_epoch: bound.scope.as_ref().map_or(0, |s| s.scope_epoch),
                session: bound.identity.session.clone(),
                tool: request.name.clone(),
                arguments: request.arguments.clone(),
                reason: plan.spec.reason.clone(),
                held_at_ms: now,
                release_at_ms: plan.spec.release_after_ms.map(|ms| now.saturating_add(ms)),
                from_dir: plan.from_dir,
            }))
        }
        _ => None,
    };
    HeldAnswer::Held { body, record }
}

/// Records a held call durably, then (for a `from_dir` call) writes `<dir>/<key>.call_key`.
pub(super) fn hold(store: &LateStore, record: HeldRecord) -> std::io::Result<()> {
    let from_dir = record.from_dir.clone();
    let call_key = record.call_key.clone();
    store.hold(record)?;
    if let Some(fd) = from_dir {
        let path = fd.dir.join(format!("{}.call_key", fd.key));
        if let Err(e) = write_atomic(&path, call_key.as_bytes()) {
            log::error!("cannot write {}: {e}", path.display());
        }
    }
    Ok(())
}

impl Call<'_> {
    /// Answers a call that asks to be held; `false` when it answered nothing (a prerequisite is
    /// missing: the caller answers it synchronously).
    pub(super) fn answer_held(&self, plan: HoldPlan, tool: &Tool, request: &ToolCallRequest) -> bool {
        let store = self.shared.late.as_deref();
        let (body, record) = match decide(plan, self.bound, tool, request, &self.shared.script, store) {
            HeldAnswer::Synchronous(missing) => {
                log::info!("{}: not held ({missing}); answering now", request.name);
                return false;
            }
            HeldAnswer::Held { body, record } => (body, record),
        };
        match (record, store) {
            (Some(record), Some(store)) => {
                if let Err(e) = hold(store, *record) {
                    let refusal =
                        ErrorBody::new(crate::late::UNWRITABLE, format!("broca-mock cannot record the held call: {e}"));
                    self.end_refused(&request.name, &refusal);
                    return true;
                }
            }
            _ => log::warn!("{}: a forced held reply the bind's terms forbid; nothing will settle it", request.name),
        }
        let _ = self.shared.outbound.reply(self.route, self.corr, body);
        self.record_end(&request.name, Outcome::Held, None);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::late::stem;
    use cortexkit_role_tool_provider::{HELD_REPLY_V1, TOOL_RESULT_V1_CAPABILITY};
    use subc_protocol::scope::ScopeKind;

    fn script(dir: &std::path::Path) -> ToolScript {
        let text = json!({
            "late_results": true,
            "late_results_dir": dir,
            "tools": [
                {"name": "ask", "result_format": "tool-result/v1", "behaviour": {"held": {"reason": "consent"}}},
                {"name": "legacy", "behaviour": {"held": {"reason": "consent"}}},
                {"name": "rude", "behaviour": {"held": {"reason": "running", "text": "later", "force": true}}},
                {"name": "lookup", "result_format": "tool-result/v1", "behaviour": {"from_dir": dir.join("results")}},
            ],
        });
        ToolScript::from_jsonc(&text.to_string()).unwrap()
    }

    fn bound(capabilities: &[&str], scope: Option<ScopeStamp>) -> Bound {
        Bound {
            principal: Some(Principal::Reserved { module_id: "broca".into() }),
            scope,
            identity: BindIdentity::new("h", "sess-1"),
            consumer_capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn request(tool: &str, call_key: Option<&str>) -> ToolCallRequest {
        let mut r = json!({"name": tool, "arguments": {"q": 1}});
        if let Some(k) = call_key {
            r["call_key"] = json!(k);
        }
        decode(r.to_string().as_bytes()).unwrap()
    }

    fn decide_for(s: &ToolScript, b: &Bound, r: &ToolCallRequest, store: Option<&LateStore>) -> HeldAnswer {
        let tool = s.tool(&r.name).unwrap();
        let plan = plan(&tool.spec.behaviour.answer, &r.arguments).unwrap().unwrap();
        decide(plan, b, tool, r, s, store)
    }

    const BOTH: &[&str] = &[HELD_REPLY_V1, TOOL_RESULT_V1_CAPABILITY];

    #[test]
    fn a_held_call_is_recorded_before_its_held_body() {
        let dir = tempfile::tempdir().unwrap();
        let s = script(dir.path());
        let store = LateStore::open(dir.path(), "inc-1").unwrap();
        let HeldAnswer::Held { body, record: Some(record) } =
            decide_for(&s, &bound(BOTH, None), &request("ask", Some("k:1")), Some(&store))
        else {
            panic!("held")
        };
        let reply: ToolResult = serde_json::from_slice(&body).unwrap();
        assert_eq!(reply.held, Some(HeldReply::new("consent")));
        assert_eq!(reply.content, [ContentPart::text("waiting: consent")]);
        cortexkit_role_tool_provider::result::validate(&reply).unwrap();
        assert_eq!((record.custodian.as_str(), record.owner.as_str()), ("reserved:broca", "reserved:broca"));
        assert_eq!((record.scope_ref.as_str(), record.session.as_str()), ("unscoped", "sess-1"));
        hold(&store, *record).unwrap();
        let on_disk: Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("held").join(format!("{}.json", stem("k:1")))).unwrap(),
        )
        .unwrap();
        assert_eq!((on_disk["call_key"].clone(), on_disk["arguments"].clone()), (json!("k:1"), json!({"q": 1})));
    }

    #[test]
    fn a_scoped_route_names_its_scope_and_owner() {
        let dir = tempfile::tempdir().unwrap();
        let s = script(dir.path());
        let store = LateStore::open(dir.path(), "inc-1").unwrap();
        let stamp: ScopeStamp = serde_json::from_value(json!({
            "owner": {"kind": "reserved", "module_id": "lead"}, "ref": "lead-1", "scope_epoch": 3,
            "kind": "head", "owner_authorized": true
        }))
        .unwrap();
        assert_eq!(stamp.kind, ScopeKind::Head);
        let answer = decide_for(&s, &bound(BOTH, Some(stamp)), &request("ask", Some("k:2")), Some(&store));
        let HeldAnswer::Held { record: Some(r), .. } = answer else { panic!("held") };
        assert_eq!((r.owner.as_str(), r.scope_ref.as_str(), r.scope_epoch), ("reserved:lead", "lead-1", 3));
        assert_eq!(r.custodian, "reserved:broca", "the carrier is the custodian");
    }

    #[test]
    fn a_missing_prerequisite_answers_synchronously_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let s = script(dir.path());
        let store = LateStore::open(dir.path(), "inc-1").unwrap();
        let sync = |b: &Bound, r: &ToolCallRequest, store| match decide_for(&s, b, r, store) {
            HeldAnswer::Synchronous(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(sync(&bound(&[TOOL_RESULT_V1_CAPABILITY], None), &request("ask", Some("k")), Some(&store))
            .contains("held-reply/v1"));
        assert!(sync(&bound(BOTH, None), &request("legacy", Some("k")), Some(&store)).contains("result_format"));
        assert!(sync(&bound(BOTH, None), &request("ask", None), Some(&store)).contains("call_key"));
        assert!(sync(&bound(BOTH, None), &request("ask", Some("k")), None).contains("late_results"));
        // Forced: the held body on a bind that declared nothing, and no record to settle it.
        let HeldAnswer::Held { body, record: None } = decide_for(&s, &bound(&[], None), &request("rude", None), None)
        else {
            panic!("forced")
        };
        let reply: ToolResult = serde_json::from_slice(&body).unwrap();
        assert_eq!((reply.held.unwrap().reason.as_str(), reply.content), ("running", vec![ContentPart::text("later")]));
    }

    #[test]
    fn a_from_dir_call_with_a_held_reply_file_is_held_and_names_its_call_key() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results");
        std::fs::create_dir_all(&results).unwrap();
        let s = script(dir.path());
        let store = LateStore::open(dir.path(), "inc-1").unwrap();
        let r = request("lookup", Some("k:9"));
        let tool = s.tool("lookup").unwrap();
        assert!(plan(&tool.spec.behaviour.answer, &r.arguments).is_none(), "no .held-reply: an ordinary call");
        let key = from_dir_key(&r.arguments);
        std::fs::write(results.join(format!("{key}.held-reply")), r#"{"reason": "consent"}"#).unwrap();
        let HeldAnswer::Held { body, record: Some(record) } = decide_for(&s, &bound(BOTH, None), &r, Some(&store))
        else {
            panic!("held")
        };
        assert_eq!(record.from_dir, Some(FromDirHold { dir: results.clone(), key: key.clone() }));
        hold(&store, *record).unwrap();
        assert_eq!(std::fs::read_to_string(results.join(format!("{key}.call_key"))).unwrap(), "k:9");
        let reply: ToolResult = serde_json::from_slice(&body).unwrap();
        assert_eq!(reply.content, [ContentPart::text("waiting: consent")]);
        // The test publishes the answer; the store settles the call with it.
        std::fs::write(results.join(format!("{key}.late")), r#"{"kind": "not_started", "reason": "scope_ended"}"#)
            .unwrap();
        store.scan();
        let late = store.read("reserved:broca", &Default::default()).unwrap();
        assert_eq!(late.entries[0].reason.as_deref(), Some("scope_ended"));
        assert!(!results.join(format!("{key}.late")).exists());
        // The role op serves the entry to the route's principal only, and acks it.
        let other = Bound { principal: Some(Principal::Direct), ..bound(BOTH, None) };
        let served = |b: &Bound| {
            let body = super::super::role::late_read(&store, b, json!({"since": null})).unwrap();
            serde_json::from_slice::<LateResultsReply>(&body).unwrap()
        };
        assert_eq!(served(&other).entries.len(), 0);
        let mine = served(&bound(BOTH, None));
        assert_eq!(mine.entries.len(), 1);
        let ack = json!({"through": mine.cursor});
        assert_eq!(super::super::role::late_ack(&store, &bound(BOTH, None), ack).unwrap(), b"{}");
        assert_eq!(served(&bound(BOTH, None)).entries.len(), 0);
        // An unreadable .held-reply refuses the call by name.
        std::fs::write(results.join(format!("{key}.held-reply")), "{").unwrap();
        let refused = plan(&tool.spec.behaviour.answer, &r.arguments).unwrap().unwrap_err();
        assert_eq!(refused.code, "tool_unavailable");
    }
}
