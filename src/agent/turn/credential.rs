//! The run's vault credential (spec §1b): read before the first attempt, reported once when a
//! provider refuses it, and cut out of every provider error the run records.

use super::*;

impl<C> Driver<'_, C> {
    pub(super) fn credential_id(&self) -> Option<&str> {
        match &self.config.auth {
            crate::provider::config::AuthSource::Vault { credential_id } => Some(credential_id),
            _ => None,
        }
    }

    /// Reads the run's vault credential when it has none: `Some(end)` when the read ends or
    /// pauses the step (the vault's refusal classified as the client crate classifies it).
    pub(super) fn ensure_credential(&mut self) -> Result<Option<StepEnd>, LineageError> {
        use crate::vault::CredentialErrorClass as C;
        let Some(id) = self.credential_id().map(str::to_owned) else { return Ok(None) };
        if self.credential.is_some() {
            return Ok(None);
        }
        let Some(vault) = self.opts.credentials.clone() else {
            let message = format!(
                "credential '{id}' is read only from the claustrum vault, and this broca has no vault route (no subc consumer connection)"
            );
            return Ok(Some(StepEnd::Ended(
                FinishReason::Error,
                Some(ProviderError::permanent("vault_unavailable", message)),
            )));
        };
        if let Some(credential) = vault.take_admitted(&self.run_id) {
            // Admission read it to freeze the account; the first attempt uses that read.
            self.credential = Some(credential);
            return Ok(None);
        }
        for attempt in 0..=VAULT_READ_RETRIES {
            let e = match vault.source.get_scoped(&id, None) {
                Ok(credential) => {
                    log::info!(
                        "run {}: credential '{id}' read from the vault (record_version {})",
                        self.run_id,
                        credential.record_version
                    );
                    if let Some(end) = self.account_changed(&id, &credential) {
                        return Ok(Some(end));
                    }
                    self.credential = Some(credential);
                    return Ok(None);
                }
                Err(e) => e,
            };
            log::warn!("run {}: vault read of '{id}' refused: {e}", self.run_id);
            let error =
                |class, code: &str, message: String| ProviderError::new(class, Some(code.to_owned()), message, None);
            let end = match e.class {
                C::AuthRequired | C::Unauthorized => StepEnd::Paused(error(
                    ErrorClass::AuthRequired,
                    e.code(),
                    format!("credential '{id}' needs re-authentication in the vault ({})", e.code()),
                )),
                C::CredentialAbsent => StepEnd::Ended(
                    FinishReason::Error,
                    Some(ProviderError::permanent(
                        "credential_absent",
                        format!("credential '{id}' is not in the vault or not granted to broca (not_found); there is no other credential store"),
                    )),
                ),
                C::Transient | C::Transport if attempt < VAULT_READ_RETRIES => {
                    if self.wait_backoff(self.backoff(attempt, None))? {
                        return Ok(Some(StepEnd::Ended(FinishReason::Cancelled, None)));
                    }
                    continue;
                }
                C::Transient | C::Transport | C::Unavailable => StepEnd::Ended(
                    FinishReason::Interrupted,
                    Some(error(
                        ErrorClass::Transient,
                        e.code(),
                        format!("the vault read of credential '{id}' kept failing ({})", e.code()),
                    )),
                ),
                _ => StepEnd::Ended(
                    FinishReason::Error,
                    Some(ProviderError::permanent(
                        e.code(),
                        format!("the vault read of credential '{id}' was refused ({})", e.code()),
                    )),
                ),
            };
            return Ok(Some(end));
        }
        unreachable!("the vault read loop returns")
    }

    /// A run continues only on the account admission froze (spec "Graceful restart": "its
    /// recorded account must match the served account"): a credential that now names another
    /// account ends the run `interrupted`, `resume_refused`, naming both (never the secret).
    fn account_changed(&self, id: &str, credential: &crate::vault::Credential) -> Option<StepEnd> {
        let recorded = self.lineage.state().last.as_ref().and_then(|e| e.account_id.as_deref())?;
        if credential.account_id.as_deref() == Some(recorded) {
            return None;
        }
        let now = credential.account_id.as_deref().unwrap_or("no account");
        let message = format!(
            "the run could not be resumed: credential '{id}' now names account {now}, not {recorded} the run was admitted with"
        );
        log::warn!("run {}: {message}", self.run_id);
        Some(StepEnd::Ended(FinishReason::Interrupted, Some(ProviderError::permanent("resume_refused", message))))
    }

    /// A provider's error with every credential the run holds cut out of its text (providers
    /// sometimes echo a key back), so no secret reaches the WAL, a log line or an error body.
    pub(super) fn scrub(&self, mut error: ProviderError) -> ProviderError {
        let held = [self.credential.as_ref().map(|c| c.secret.expose()), self.opts.bearer.as_deref()];
        for secret in held.into_iter().flatten().filter(|s| !s.is_empty()) {
            error.message = error.message.replace(secret, "[redacted]");
        }
        error
    }

    /// A provider refused the run's vault credential: reported once, fenced on its version, and
    /// dropped (the run pauses; a resume reads the vault again).
    pub(super) fn report_rejected(&mut self, status: u16) {
        let (Some(id), Some(credential)) = (self.credential_id().map(str::to_owned), self.credential.take()) else {
            return;
        };
        let Some(vault) = self.opts.credentials.clone() else { return };
        match vault.source.report_auth_failure(&id, status, &credential.record_version) {
            Ok(accepted) => log::warn!(
                "run {}: the provider refused credential '{id}' (HTTP {status}); reported at record_version {} (accepted: {accepted})",
                self.run_id,
                credential.record_version
            ),
            Err(e) => log::warn!("run {}: reporting the refused credential '{id}' failed: {e}", self.run_id),
        }
    }
}
