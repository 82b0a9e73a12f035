//! A run's first record: admission's durable `RunStarted`, with the frozen config, the
//! credential and account decision admission took, and the session's owner.

use crate::lineage::projection::ControlUnit;
use crate::lineage::{Lineage, LineageError};
use crate::message::Message;
use crate::provider::config::RenderConfig;
use crate::record::{AccountDecision, AuthSelection, Frozen, Origin, Record, RunStarted};

/// Admission's write: the durable `RunStarted` with the frozen config. The caller resolved the
/// model (and everything else that can refuse) before, so a refusal never leaves a ghost run.
/// A session's first episode admitted here records no owner (see [`admit_owned`]).
pub fn admit(
    lineage: &mut Lineage,
    run_id: &str,
    submission_id: Option<&str>,
    config: &RenderConfig,
    input: Message,
    title: Option<String>,
    credentials: Option<&crate::vault::Credentials>,
) -> Result<Vec<ControlUnit>, LineageError> {
    admit_owned(lineage, run_id, submission_id, config, input, title, credentials, None)
}

/// [`admit`] with `first_owner`, what a session's first episode records as its owner; every
/// later episode carries the session's recorded owner instead, so an owner never changes
/// (`crate::owner`).
#[allow(clippy::too_many_arguments)]
pub fn admit_owned(
    lineage: &mut Lineage,
    run_id: &str,
    submission_id: Option<&str>,
    config: &RenderConfig,
    input: Message,
    title: Option<String>,
    credentials: Option<&crate::vault::Credentials>,
    first_owner: Option<&crate::owner::Owner>,
) -> Result<Vec<ControlUnit>, LineageError> {
    use crate::provider::config::AuthSource;
    let account = match (&config.auth, credentials) {
        (AuthSource::Vault { credential_id }, Some(vault)) => vault.read_at_admission(run_id, credential_id),
        _ => None,
    };
    let selection = auth_selection(config, account.as_ref());
    start(lineage, run_id, submission_id, Frozen::new(config.clone()), input, title, selection, first_owner)
}

/// Starts the run of a queued send whose frozen config this build cannot read: `RunStarted`
/// carries that config as it was written (never one made up), so the caller can end the run
/// at once, visibly, instead of leaving the queue stuck behind it.
pub fn admit_unreadable(
    lineage: &mut Lineage,
    run_id: &str,
    submission_id: &str,
    config: Frozen,
    input: Message,
) -> Result<Vec<ControlUnit>, LineageError> {
    start(lineage, run_id, Some(submission_id), config, input, None, None, None)
}

/// Appends and commits a run's `RunStarted`, with the session's recorded owner (or
/// `first_owner` on its first episode).
#[allow(clippy::too_many_arguments)]
fn start(
    lineage: &mut Lineage,
    run_id: &str,
    submission_id: Option<&str>,
    config: Frozen,
    input: Message,
    title: Option<String>,
    auth_selection: Option<AuthSelection>,
    first_owner: Option<&crate::owner::Owner>,
) -> Result<Vec<ControlUnit>, LineageError> {
    let rec = Record::RunStarted(Box::new(RunStarted {
        run_id: run_id.into(),
        submission_id: submission_id.map(String::from),
        origin: Origin::Fresh,
        config,
        input,
        title,
        started_at_ms: lineage.now_ms(),
        auth_selection,
        owner: match lineage.state().last.as_ref() {
            Some(previous) => previous.owner.clone(),
            None => first_owner.cloned(),
        },
    }));
    Ok(lineage.append_commit(&rec)?.1)
}

/// What admission froze about the credential and the account decision: the vault credential
/// id (absent on credential-free routes) with the account admission's vault read named
/// (`account_id`, `record_version`; absent when that read was refused), and the conversation
/// key with its source.
fn auth_selection(config: &RenderConfig, account: Option<&crate::vault::AccountIdentity>) -> Option<AuthSelection> {
    use crate::provider::config::AuthSource;
    let mut sel = AuthSelection::default();
    if let AuthSource::Vault { credential_id } = &config.auth {
        sel.credential_id = Some(credential_id.clone());
        if let Some(account) = account {
            sel.account_id = account.account_id.clone();
            sel.record_version = Some(account.record_version.clone());
        }
    }
    if let Some(key) = &config.policy.conversation_key {
        let source = config.policy.conversation_key_source.as_deref().unwrap_or("caller");
        sel.account_decision =
            Some(AccountDecision { conversation_key: key.clone(), conversation_key_source: source.into() });
    }
    (sel != AuthSelection::default()).then_some(sel)
}
