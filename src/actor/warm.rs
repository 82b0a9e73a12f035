//! `session.warm` on the session's actor (spec §4a "Concurrency"). The actor only decides the
//! refusals and snapshots what the warm needs ([`start`]); the warm itself runs on its own
//! thread ([`perform`]), so cancels, sends, steers and status are never held behind a slow
//! provider. Its completion comes back to the actor as `SessionCommand::WarmDone`, which
//! writes the `cache_warmed` record through the session's single writer, moves the cache clock
//! and only then answers ([`done`]): the answer never promises a record a crash could lose.
//!
//! Refusals, in the order they are decided (the first that applies answers; each writes
//! nothing): `lineage_changed` (by the op, before the actor), `run_paused`, `warm_in_flight`,
//! `no_step_yet`, `warm_unsupported`, `account_walled`, `cache_expired`,
//! `warm_prefix_unavailable`; then on the warm's thread, before anything is sent,
//! `account_changed`. A warm that was sent and refused answers `warm_failed`, writes nothing,
//! bills nothing and leaves the clock where it was.
//!
//! The base request: while a step runs, the exact bytes it sent (held in memory for the step,
//! `CacheClocks::in_flight`); otherwise the session's last request rebuilt from the WAL and
//! rendered from its episode's frozen config, sent only if it renders to the digest its
//! attempt recorded.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::answer::Answer;
use crate::agent::cache_clock::{CacheClocks, WarmSlot};
use crate::clock::SharedClock;
use crate::lineage::{Lineage, LineageError};
use crate::provider::client::ModelClient;
use crate::provider::config::{AuthSource, RenderConfig};
use crate::provider::warm::{WarmAnswer, WarmCall};
use crate::record::{pause_name, CacheWarmed, ErrorClass, ProviderError, Record};
use crate::replay::Resolution;
use crate::session_key::{hex, SessionKey};
use crate::wire::warm::{WarmRefusal, WarmReply};
use crate::wire::{over_limit, Refusal, RefusalCode};

/// A warm is refused `cache_expired` when its estimated expiry is closer than this: the
/// provider may have dropped the prefix by the time the warm lands, and a warm then would be a
/// full cache write.
pub const EXPIRY_MARGIN_MS: u64 = 5_000;
/// The provider code of an attempt that hit its account's usage limit.
pub const ACCOUNT_LIMIT_EXHAUSTED: &str = "account_limit_exhausted";

/// What warms need beyond the session: the provider client, the clocks, the credentials, and
/// the way back to the session's actor.
pub struct WarmDeps {
    pub client: Arc<dyn ModelClient>,
    pub clocks: Arc<CacheClocks>,
    pub credentials: Option<crate::vault::Credentials>,
    pub bearer: Option<String>,
    /// Hands a finished warm to its session's actor (as `SessionCommand::WarmDone`).
    pub post: Post,
}

/// See [`WarmDeps::post`]; `Err` says why the warm could not be handed over.
pub type Post = Arc<dyn Fn(&SessionKey, Box<WarmDone>) -> Result<(), String> + Send + Sync>;

/// A warm decided and snapshotted on the actor, to run on its own thread.
struct Job {
    key: SessionKey,
    run_id: String,
    config: RenderConfig,
    /// The account the session froze, when it froze one.
    account_id: Option<String>,
    request_body_sha256: String,
    body: Vec<u8>,
    ttl_ms: u64,
    clock: SharedClock,
}

/// A warm the provider answered, on its way back to the actor.
pub struct WarmDone {
    record: CacheWarmed,
    reply: WarmReply,
    answer: Answer<WarmReply>,
}

impl std::fmt::Debug for WarmDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WarmDone({})", self.record.run_id)
    }
}

/// Decides the warm on the actor and, unless refused, starts it on its own thread.
pub(super) fn start(deps: &WarmDeps, lineage: &Lineage, answer: Answer<WarmReply>) {
    let addr = lineage.addr().to_owned();
    let job = match decide(deps, lineage) {
        Ok(job) => job,
        Err(refusal) => return answer.send(Err(refusal)),
    };
    let (client, clocks) = (Arc::clone(&deps.client), Arc::clone(&deps.clocks));
    let (credentials, bearer, post) = (deps.credentials.clone(), deps.bearer.clone(), Arc::clone(&deps.post));
    let reply = answer.clone();
    let spawned = std::thread::Builder::new().name("broca-warm".into()).spawn(move || {
        let performed = perform(client.as_ref(), credentials.as_ref(), bearer, &job);
        match performed {
            Err(refused) => {
                clocks.end_warm(&addr);
                reply.send(Err(refused.refusal()));
            }
            Ok((record, done)) => {
                let done = Box::new(WarmDone { record, reply: done, answer: reply });
                if let Err(e) = post(&job.key, done) {
                    // The command (and with it the answer) was dropped: its caller hears the
                    // session closed; the warm is neither recorded nor billed.
                    log::warn!(target: "broca.warm", "session {addr}: a finished warm could not be recorded: {e}");
                    clocks.end_warm(&addr);
                }
            }
        }
    });
    if let Err(e) = spawned {
        deps.clocks.end_warm(lineage.addr());
        let message = format!("cannot start the warm's thread: {e}");
        answer.send(Err(Refusal::new(RefusalCode::OpenFailed, message, Some(crate::detail!("class" => "transient")))));
    }
}

/// The refusals the actor decides, in order, and the warm's snapshot. Takes the session's warm
/// slot, and gives it back when it refuses after taking it.
fn decide(deps: &WarmDeps, lineage: &Lineage) -> Result<Job, Refusal> {
    let state = lineage.state();
    if let Resolution::Paused { run_id, reason } = state.resolution() {
        return Err(WarmRefusal::RunPaused { run_id, reason: pause_name(reason).into() }.refusal());
    }
    let addr = lineage.addr();
    match deps.clocks.begin_warm(addr) {
        Ok(()) => {}
        Err(WarmSlot::Busy) => return Err(WarmRefusal::WarmInFlight.refusal()),
        Err(WarmSlot::Full) => {
            let limit = crate::limits::WARMS_IN_FLIGHT;
            return Err(over_limit(RefusalCode::TooManyRequests, "warms in flight", limit, Some("session.warm")));
        }
    }
    let decided = snapshot(deps, lineage);
    if decided.is_err() {
        deps.clocks.end_warm(addr);
    }
    decided.map_err(|refused| refused.refusal())
}

fn snapshot(deps: &WarmDeps, lineage: &Lineage) -> Result<Job, WarmRefusal> {
    let state = lineage.state();
    let addr = lineage.addr();
    let in_flight = deps.clocks.in_flight(addr);
    let last = state.last_attempt.as_ref();
    let Some(run_id) = in_flight.as_ref().map(|f| f.run_id.clone()).or_else(|| last.map(|a| a.run_id.clone())) else {
        return Err(WarmRefusal::NoStepYet);
    };
    let episode = state.last.as_ref().filter(|e| e.run_id == run_id);
    let recorded = last.filter(|a| a.run_id == run_id).and_then(|a| a.request_body_sha256.clone());
    let unavailable = || WarmRefusal::PrefixUnavailable { request_body_sha256: recorded.clone() };
    let config = episode.and_then(|e| e.config.config()).cloned().ok_or_else(unavailable)?;
    // The base: the step's bytes in flight, else the renders the last request may have been.
    let candidates: Vec<Vec<u8>> = match &in_flight {
        Some(f) => vec![f.body.to_vec()],
        None => rebuilt(lineage, &config).map_err(|_| unavailable())?,
    };
    let first = candidates.first().ok_or_else(unavailable)?;
    if let Some(reason) = crate::provider::warm::unsupported_bytes(&config, first) {
        return Err(WarmRefusal::Unsupported { reason, provider: config.provider.clone() });
    }
    if in_flight.is_none() && last.and_then(|a| a.provider_code.as_deref()) == Some(ACCOUNT_LIMIT_EXHAUSTED) {
        // broca's records carry no reset time for the wall: it stands until a request passes.
        return Err(WarmRefusal::AccountWalled { resets_at_ms: None });
    }
    let now = lineage.now_ms();
    let expires = deps.clocks.get(addr).and_then(|c| c.expires_at_ms());
    match expires {
        Some(at) if at >= now.saturating_add(EXPIRY_MARGIN_MS) => {}
        _ => return Err(WarmRefusal::CacheExpired { expires_at_ms: expires }),
    }
    let base = match in_flight {
        Some(_) => candidates.into_iter().next(),
        None => {
            let want = recorded.clone().ok_or_else(unavailable)?;
            candidates.into_iter().find(|b| sha256(b) == want)
        }
    }
    .ok_or_else(unavailable)?;
    let body = crate::provider::warm::warm_body_bytes(&base).ok_or_else(unavailable)?;
    let ttl_ms = config.cache_ttl_ms().ok_or(WarmRefusal::CacheExpired { expires_at_ms: None })?;
    Ok(Job {
        key: lineage.key().clone(),
        run_id,
        account_id: episode.and_then(|e| e.account_id.clone()),
        config,
        request_body_sha256: sha256(&base),
        body,
        ttl_ms,
        clock: Arc::clone(lineage.clock()),
    })
}

/// The requests the session's last attempt may have sent: its transcript without the last
/// assistant message and what follows it (the step that answered), then the whole transcript
/// (an attempt that got no answer). Its digest picks one.
fn rebuilt(lineage: &Lineage, config: &RenderConfig) -> Result<Vec<Vec<u8>>, LineageError> {
    let messages: Vec<_> = lineage.transcript(0, u64::MAX)?.messages.into_iter().map(|(_, m)| m).collect();
    let messages = crate::refs::tags::shown(config, &messages);
    let answered = messages.iter().rposition(|m| m.role == crate::message::Role::Assistant);
    let mut out = Vec::new();
    if let Some(at) = answered {
        out.push(crate::provider::render_request(config, &messages[..at]));
    }
    out.push(crate::provider::render_request(config, &messages));
    Ok(out)
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The warm on its own thread: the credential read again as a run reads it (refused
/// `account_changed` when it now names another account), then the request.
fn perform(
    client: &dyn ModelClient,
    credentials: Option<&crate::vault::Credentials>,
    bearer: Option<String>,
    job: &Job,
) -> Result<(CacheWarmed, WarmReply), WarmRefusal> {
    let mut account_id = job.account_id.clone();
    let bearer = match &job.config.auth {
        AuthSource::Vault { credential_id } => {
            let Some(vault) = credentials else {
                let message = format!("credential '{credential_id}' is read only from the claustrum vault, and this broca has no vault route");
                return Err(WarmRefusal::Failed(ProviderError::permanent("vault_unavailable", message)));
            };
            let credential = vault.source.get_scoped(credential_id, None).map_err(|e| {
                let class = match e.class {
                    crate::vault::CredentialErrorClass::AuthRequired
                    | crate::vault::CredentialErrorClass::Unauthorized => ErrorClass::AuthRequired,
                    crate::vault::CredentialErrorClass::Transient
                    | crate::vault::CredentialErrorClass::Transport
                    | crate::vault::CredentialErrorClass::Unavailable => ErrorClass::Transient,
                    _ => ErrorClass::Permanent,
                };
                let message = format!("the vault read of credential '{credential_id}' was refused ({})", e.code());
                WarmRefusal::Failed(ProviderError::new(class, Some(e.code().into()), message, None))
            })?;
            if job.account_id.is_some() && credential.account_id != job.account_id {
                return Err(WarmRefusal::AccountChanged { credential_id: credential_id.clone() });
            }
            account_id = credential.account_id.clone().or(account_id);
            Some(credential.secret.expose().to_owned())
        }
        AuthSource::Bearer => bearer,
        AuthSource::None => None,
    };
    let sent_at_ms = job.clock.now_ms();
    let call = WarmCall { config: job.config.clone(), body: job.body.clone(), bearer: bearer.clone() };
    let WarmAnswer { usage, ratelimit } = client.warm(call).map_err(|mut error| {
        if let Some(secret) = bearer.as_deref().filter(|s| !s.is_empty()) {
            error.message = error.message.replace(secret, "[redacted]");
        }
        WarmRefusal::Failed(error)
    })?;
    let expires_at_ms = sent_at_ms.saturating_add(job.ttl_ms);
    let reply = WarmReply {
        request_body_sha256: job.request_body_sha256.clone(),
        warm_body_sha256: sha256(&job.body),
        cache_read_tokens: usage.cached_input_tokens,
        cache_write_tokens: usage.cache_write_tokens,
        input_tokens: usage.input_tokens,
        ttl_ms: job.ttl_ms,
        expires_at_ms,
        expiry_basis: "estimated",
    };
    let record = CacheWarmed {
        run_id: job.run_id.clone(),
        request_body_sha256: reply.request_body_sha256.clone(),
        warm_body_sha256: reply.warm_body_sha256.clone(),
        usage,
        provider: job.config.provider.clone(),
        model: job.config.model.clone(),
        variant: job.config.variant.clone(),
        account_id,
        ratelimit,
        sent_at_ms,
        ttl_ms: Some(job.ttl_ms),
        expires_at_ms: Some(expires_at_ms),
    };
    Ok((record, reply))
}

/// A warm the provider answered, back on the actor: recorded (and so billed), then the clock
/// restarts at its send start, then the caller hears. A write failure answers the failure.
pub(super) fn done(deps: &WarmDeps, lineage: &mut Lineage, done: WarmDone) {
    let WarmDone { record, reply, answer } = done;
    let (sent_at, ttl) = (record.sent_at_ms, record.ttl_ms);
    let written = lineage.append_commit(&Record::CacheWarmed(Box::new(record)));
    deps.clocks.end_warm(lineage.addr());
    match written {
        Ok(_) => {
            deps.clocks.sent(lineage.addr(), sent_at, ttl);
            answer.send(Ok(reply));
        }
        Err(e) => answer.send(Err(e.refusal())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::vault::{Credential, CredentialSource, Credentials, Secret, VaultError};
    use parking_lot::Mutex;
    use std::time::Duration;

    /// A vault whose credential belongs to `account`.
    struct Vault {
        account: &'static str,
    }

    impl CredentialSource for Vault {
        fn get_scoped_within(&self, _: &str, _: Option<u64>, _: Duration) -> Result<Credential, VaultError> {
            let secret = Secret::new("sk-secret".into());
            Ok(Credential {
                secret,
                record_version: "1".into(),
                expires_at_ms: None,
                account_id: Some(self.account.into()),
            })
        }
        fn report_auth_failure(&self, _: &str, _: u16, _: &str) -> Result<bool, VaultError> {
            Ok(true)
        }
    }

    /// A provider that counts warms and echoes the credential back in its refusal.
    #[derive(Default)]
    struct Provider {
        sent: Mutex<Vec<Option<String>>>,
        refuse: bool,
    }

    impl ModelClient for Provider {
        fn start(
            &self,
            _: crate::provider::client::Attempt,
        ) -> crossbeam_channel::Receiver<crate::provider::client::AttemptEvent> {
            unreachable!("a warm starts no attempt")
        }
        fn warm(&self, call: WarmCall) -> Result<WarmAnswer, ProviderError> {
            self.sent.lock().push(call.bearer.clone());
            if self.refuse {
                let message = format!("key {} is over its quota", call.bearer.unwrap_or_default());
                return Err(ProviderError::permanent("rate_limit_error", message));
            }
            Ok(WarmAnswer::default())
        }
    }

    fn job() -> Job {
        let config: RenderConfig = serde_json::from_value(serde_json::json!({
            "provider": "anthropic", "model": "claude-sonnet-4-5", "family": "anthropic_messages",
            "base_url": "http://127.0.0.1:1/v1", "wire_model": "claude-sonnet-4-5",
            "auth": {"kind": "vault", "credential_id": "cred-a"}}))
        .unwrap();
        Job {
            key: SessionKey::new("/p", "h", "s"),
            run_id: "run-1".into(),
            config,
            account_id: Some("acct-1".into()),
            request_body_sha256: "ab".repeat(32),
            body: b"{}".to_vec(),
            ttl_ms: 300_000,
            clock: Arc::new(ManualClock::at(1_000)),
        }
    }

    #[test]
    fn a_credential_of_another_account_is_refused_before_anything_is_sent() {
        let provider = Provider::default();
        let vault = Credentials::new(Arc::new(Vault { account: "acct-2" }));
        let refused = perform(&provider, Some(&vault), None, &job()).unwrap_err();
        assert_eq!(refused, WarmRefusal::AccountChanged { credential_id: "cred-a".into() });
        assert!(provider.sent.lock().is_empty(), "nothing sent");

        let same = Credentials::new(Arc::new(Vault { account: "acct-1" }));
        let (record, reply) = perform(&provider, Some(&same), None, &job()).unwrap();
        assert_eq!(provider.sent.lock().as_slice(), [Some("sk-secret".to_string())], "the vault's credential");
        assert_eq!((record.sent_at_ms, record.expires_at_ms, reply.expires_at_ms), (1_000, Some(301_000), 301_000));
        assert_eq!(record.account_id.as_deref(), Some("acct-1"));
    }

    #[test]
    fn a_provider_refusal_is_warm_failed_with_the_credential_cut_out() {
        let provider = Provider { refuse: true, ..Provider::default() };
        let vault = Credentials::new(Arc::new(Vault { account: "acct-1" }));
        let refused = perform(&provider, Some(&vault), None, &job()).unwrap_err();
        let WarmRefusal::Failed(error) = refused else { panic!("{refused:?}") };
        assert_eq!(error.message, "key [redacted] is over its quota");
        assert_eq!(perform(&provider, None, None, &job()).unwrap_err().code(), RefusalCode::WarmFailed, "no vault");
    }
}
