//! Provider credentials from the claustrum vault (spec §1b; `catalog-and-vault.md` Part D).
//!
//! broca reads a run's credential with `credential.get_scoped {credential_id, min_ttl_ms?}` on
//! the `claustrum` management-surface route of its own consumer connection (which presents
//! `consumer_identity` with the launch nonce), and reports a provider 401/403 with
//! `credential.report_auth_failure`. Replies are decoded and refusals classified by the
//! transport-free half of `cortexkit-claustrum-client` 0.8.0 (`default-features = false`: no
//! async runtime). The secret lives in memory only: [`Secret`]'s `Debug` is redacted and
//! nothing here logs or serializes it.

pub mod handles;

use std::time::Duration;

use cortexkit_claustrum_client::{decode_credential_reply, decode_report_auth_failure_reply, decode_wire_error};
pub use cortexkit_claustrum_client::{CredentialErrorClass, CredentialResolverError as VaultError};
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

use crate::subc::consumer::{CallError, Consumer};

/// The vault's module id.
pub const CLAUSTRUM_MODULE_ID: &str = "claustrum";
/// One vault call's deadline (route open included); the client crate's whole-call bound.
pub const VAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long admission waits for its one credential read: the send's reply waits for it, so a
/// slow vault costs the reply at most this; the run's own read (bounded by
/// [`VAULT_CALL_TIMEOUT`], retried) then classifies whatever the vault says.
pub const ADMISSION_VAULT_WAIT: Duration = Duration::from_secs(2);
/// The route identity's labels (the route's project comes from its session scope).
const VAULT_HARNESS: &str = "broca";
const VAULT_SESSION: &str = "credential-consumer";

/// A credential's secret bytes as text. Never logged, serialized or written.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([REDACTED])")
    }
}

/// One read of a vault record: the secret and its non-secret identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    pub secret: Secret,
    pub record_version: String,
    pub expires_at_ms: Option<i64>,
    pub account_id: Option<String>,
}

/// Where the loop's vault credentials come from. Calls block (bounded by
/// [`VAULT_CALL_TIMEOUT`]); the loop makes them on its run's thread, never on the io thread.
pub trait CredentialSource: Send + Sync {
    /// `credential.get_scoped`.
    fn get_scoped(&self, credential_id: &str, min_ttl_ms: Option<u64>) -> Result<Credential, VaultError> {
        self.get_scoped_within(credential_id, min_ttl_ms, VAULT_CALL_TIMEOUT)
    }
    /// `credential.get_scoped` with its whole-call bound.
    fn get_scoped_within(
        &self,
        credential_id: &str,
        min_ttl_ms: Option<u64>,
        within: Duration,
    ) -> Result<Credential, VaultError>;
    /// `credential.report_auth_failure`, fenced on the version that failed; `Ok` is the vault's
    /// `accepted`, not proof that anything changed.
    fn report_auth_failure(&self, credential_id: &str, status: u16, record_version: &str) -> Result<bool, VaultError>;
}

/// Credentials read at admission and not yet taken by their run's first attempt. Bounded: an
/// entry pushed out (a burst of admissions whose runs have not started) only costs its run one
/// more vault read.
pub const ADMITTED_CREDENTIALS_MAX: usize = 64;

/// The account a run's credential belongs to, as admission read it: frozen in
/// `RunStarted.auth_selection` beside the credential id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountIdentity {
    pub account_id: Option<String>,
    pub record_version: String,
}

/// The loop's handle on a [`CredentialSource`] (`LoopOptions.credentials`), with the hand-off
/// from admission (which reads the credential to freeze its account) to the run's first
/// attempt (which uses that same read instead of a second one).
///
/// Invariant: `admitted` holds at most [`ADMITTED_CREDENTIALS_MAX`] entries, at most one per
/// run id, each taken at most once.
#[derive(Clone)]
pub struct Credentials {
    pub source: std::sync::Arc<dyn CredentialSource>,
    admitted: std::sync::Arc<parking_lot::Mutex<std::collections::VecDeque<(String, Credential)>>>,
}

impl Credentials {
    pub fn new(source: std::sync::Arc<dyn CredentialSource>) -> Credentials {
        Credentials { source, admitted: Default::default() }
    }

    /// Admission's read of `run_id`'s credential: its account when the vault answered (the
    /// credential waits for the run's first attempt); `None` when it refused, which the run's
    /// own read then classifies (pause, named error, bounded retries).
    pub fn read_at_admission(&self, run_id: &str, credential_id: &str) -> Option<AccountIdentity> {
        match self.source.get_scoped_within(credential_id, None, ADMISSION_VAULT_WAIT) {
            Ok(credential) => {
                let account = AccountIdentity {
                    account_id: credential.account_id.clone(),
                    record_version: credential.record_version.clone(),
                };
                let mut admitted = self.admitted.lock();
                admitted.retain(|(run, _)| run != run_id);
                if admitted.len() >= ADMITTED_CREDENTIALS_MAX {
                    admitted.pop_front();
                }
                admitted.push_back((run_id.to_owned(), credential));
                Some(account)
            }
            Err(e) => {
                log::info!(
                    "run {run_id}: admission's vault read of '{credential_id}' refused ({}); the run reads again",
                    e.code()
                );
                None
            }
        }
    }

    /// The credential admission read for `run_id`, once.
    pub fn take_admitted(&self, run_id: &str) -> Option<Credential> {
        let mut admitted = self.admitted.lock();
        let at = admitted.iter().position(|(run, _)| run == run_id)?;
        admitted.remove(at).map(|(_, credential)| credential)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(..)")
    }
}

/// `credential.get {handle}`: a dev-tools handle read (broca-run).
pub trait HandleSource {
    fn get_handle(&self, handle: &str) -> Result<Credential, VaultError>;
}

/// The vault over broca's consumer connection.
pub struct SubcVault {
    consumer: Consumer,
}

impl SubcVault {
    pub fn new(consumer: Consumer) -> SubcVault {
        SubcVault { consumer }
    }

    fn call(&self, method: &str, params: Value) -> Result<Value, VaultError> {
        self.call_within(method, params, VAULT_CALL_TIMEOUT)
    }

    fn call_within(&self, method: &str, params: Value, within: Duration) -> Result<Value, VaultError> {
        let target = RouteTarget::ManagementSurface { module_id: CLAUSTRUM_MODULE_ID.to_owned() };
        let identity = BindIdentity::new(VAULT_HARNESS, VAULT_SESSION);
        let body = serde_json::to_vec(&json!({"method": method, "params": params}))
            .map_err(|e| VaultError::transport(format!("cannot encode {method}: {e}")))?;
        match self.consumer.call_on(&target, &identity, &body, within) {
            Ok(reply) => serde_json::from_slice(&reply).map_err(|_| {
                VaultError::new(CredentialErrorClass::InvalidResponse, format!("{method} answered non-JSON"))
            }),
            Err(CallError::Module(e) | CallError::RouteOpen(e) | CallError::NotDelivered(e)) => {
                let bytes = serde_json::to_vec(&e).unwrap_or_default();
                Err(decode_wire_error(&bytes))
            }
            Err(e) => Err(VaultError::transport(format!("{method}: {e}"))),
        }
    }
}

fn credential(resolved: cortexkit_claustrum_client::ResolvedCredential) -> Result<Credential, VaultError> {
    let secret = String::from_utf8(resolved.expose().to_vec()).map_err(|_| {
        VaultError::new(CredentialErrorClass::InvalidResponse, "the credential payload is not UTF-8 text")
    })?;
    Ok(Credential {
        secret: Secret(secret),
        record_version: resolved.record_version.clone(),
        expires_at_ms: resolved.expires_at_ms,
        account_id: resolved.account_id.clone(),
    })
}

/// A record version as the vault sent it: a number when it is one.
fn version_value(record_version: &str) -> Value {
    record_version.parse::<u64>().map_or_else(|_| json!(record_version), |v| json!(v))
}

impl CredentialSource for SubcVault {
    fn get_scoped_within(
        &self,
        credential_id: &str,
        min_ttl_ms: Option<u64>,
        within: Duration,
    ) -> Result<Credential, VaultError> {
        let mut params = json!({"credential_id": credential_id});
        if let Some(ttl) = min_ttl_ms {
            params["min_ttl_ms"] = json!(ttl);
        }
        credential(decode_credential_reply(self.call_within("credential.get_scoped", params, within)?)?)
    }

    fn report_auth_failure(&self, credential_id: &str, status: u16, record_version: &str) -> Result<bool, VaultError> {
        if !matches!(status, 401 | 403) {
            return Err(VaultError::new(CredentialErrorClass::Unclassified, "only a 401 or 403 is reported"));
        }
        let params = json!({
            "credential_id": credential_id,
            "provider_status": status,
            "record_version": version_value(record_version),
            "reporter_source": "broca",
        });
        decode_report_auth_failure_reply(self.call("credential.report_auth_failure", params)?)
    }
}

impl HandleSource for SubcVault {
    fn get_handle(&self, handle: &str) -> Result<Credential, VaultError> {
        credential(decode_credential_reply(self.call("credential.get", json!({"handle": handle}))?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_debug_is_redacted() {
        let c = Credential {
            secret: Secret::new("sk-live-123".into()),
            record_version: "1".into(),
            expires_at_ms: None,
            account_id: None,
        };
        assert!(!format!("{c:?}").contains("sk-live"));
    }

    #[test]
    fn refusals_classify_as_the_client_crate_does() {
        let classify = |v: Value| decode_credential_reply(v).err().map(|e| e.class);
        let refusal = |class: &str, code: &str| json!({"result": {"error": {"class": class, "code": code}}});
        assert_eq!(classify(refusal("permanent", "not_found")), Some(CredentialErrorClass::CredentialAbsent));
        assert_eq!(classify(refusal("auth_required", "needs_reauth")), Some(CredentialErrorClass::AuthRequired));
        assert_eq!(classify(refusal("transient", "vault_locked")), Some(CredentialErrorClass::Transient));
        let relay = decode_wire_error(br#"{"code":"unknown_module","message":"no claustrum"}"#);
        assert_eq!(relay.class, CredentialErrorClass::Transport);
        assert_eq!(version_value("7"), json!(7));
        assert_eq!(version_value("v7"), json!("v7"));
    }
}
