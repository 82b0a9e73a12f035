//! A Code Assist run's project and ids (`crate::provider::code_assist`): found before the run's
//! first step, recorded on that step's `StepStarted`, and taken from the record on a resume.

use super::*;
use crate::frozen::{CodeAssistIds, Family};
use crate::provider::client::ProjectLookup;

impl<C> Driver<'_, C> {
    /// Sets the run's Code Assist ids when it has none: the project its steps already named,
    /// else the backend's answer for the credential. `Some(end)` when finding it ends or pauses
    /// the run (no project for the account, a refused credential, a cancel).
    pub(super) fn ensure_code_assist(&mut self) -> Result<Option<StepEnd>, LineageError> {
        if self.config.family != Family::GoogleCodeAssist || self.config.code_assist.is_some() {
            return Ok(None);
        }
        let recorded = self.lineage.state().last.as_ref().and_then(|e| e.code_assist_project.clone());
        let project = match recorded {
            Some(project) => project,
            None => match self.find_project()? {
                Ok(project) => project,
                Err(end) => return Ok(Some(end)),
            },
        };
        self.config.code_assist = Some(CodeAssistIds {
            project,
            user_prompt_id: self.run_id.clone(),
            session_id: self.lineage.addr().to_owned(),
        });
        Ok(None)
    }

    /// The project a `StepStarted` records: the run's, on its first step that names one.
    pub(super) fn project_to_record(&self) -> Option<String> {
        let recorded = self.lineage.state().last.as_ref().and_then(|e| e.code_assist_project.as_deref());
        let ids = self.config.code_assist.as_ref()?;
        (recorded != Some(ids.project.as_str())).then(|| ids.project.clone())
    }

    /// Asks the client for the credential's project, hearing commands meanwhile; a transient
    /// failure is retried with the model attempts' backoff.
    fn find_project(&mut self) -> Result<Result<String, StepEnd>, LineageError> {
        if let Some(end) = self.ensure_credential()? {
            return Ok(Err(end));
        }
        for attempt in 0.. {
            let cancel = Arc::new(AtomicBool::new(false));
            let rx = self.client.code_assist_project(ProjectLookup {
                config: self.config.clone(),
                bearer: match &self.credential {
                    Some(c) => Some(c.secret.expose().to_owned()),
                    None => self.opts.bearer.clone(),
                },
                configured: self.opts.code_assist_project.clone(),
                cancel: Arc::clone(&cancel),
            });
            let found = loop {
                let commands = self.commands.clone();
                select! {
                    recv(rx) -> found => break found.unwrap_or_else(|_| {
                        Err(ProviderError::permanent("code_assist_setup_lost", "the Code Assist setup thread ended without an answer"))
                    }),
                    recv(commands) -> cmd => if self.command(cmd)? == Some(CancelAt::Now) {
                        cancel.store(true, Ordering::Relaxed);
                        return Ok(Err(StepEnd::Ended(FinishReason::Cancelled, None)));
                    },
                }
            };
            let error = match found {
                Ok(project) => {
                    log::info!("run {}: Code Assist project {} (tier {})", self.run_id, project.id, project.tier);
                    return Ok(Ok(project.id));
                }
                Err(error) => self.scrub(error),
            };
            log::warn!("run {}: finding the Code Assist project failed: {}", self.run_id, error.message);
            match error.class {
                ErrorClass::AuthRequired => {
                    self.report_rejected(error.http_status.unwrap_or(401));
                    return Ok(Err(StepEnd::Paused(error)));
                }
                ErrorClass::Transient if attempt < self.opts.retry.max_retries => {
                    if self.wait_backoff(self.backoff(attempt, None))? {
                        return Ok(Err(StepEnd::Ended(FinishReason::Cancelled, None)));
                    }
                }
                ErrorClass::Transient => return Ok(Err(StepEnd::Ended(FinishReason::Interrupted, Some(error)))),
                _ => return Ok(Err(StepEnd::Ended(FinishReason::Error, Some(error)))),
            }
        }
        unreachable!("the setup loop returns")
    }
}
