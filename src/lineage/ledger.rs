//! Durable facts about sends and runs as one read sees them: the store's rows (derived up to its
//! watermark) ⊕ the run-state and send effects of the WAL tail after it. Because both halves
//! come from the same snapshot ([`TranscriptPage`]), the answer is the same on a live session
//! and a closed one, before and after a restart, and a read never opens the session.

use super::read::TranscriptPage;
use crate::message::RunUsage;
use crate::record::Delivery;
use crate::record::{AuthSelection, BudgetDetail, FinishReason, PauseReason, ProviderError};
use crate::replay::Resolution;
use crate::replay::{Effect, EpisodeStatus, RunState, SendFate};
use crate::store::{Fate, SendLookup, SendRow, Store, StoreError};
use crate::wire::answers::{SendReply, SendState};

/// A send's row with the tail applied.
pub fn send(
    store: &Store,
    lineage: &str,
    page: &TranscriptPage,
    by: SendLookup<'_>,
) -> Result<Option<SendRow>, StoreError> {
    // The newest queueing in the tail wins over the store (a send id names its newest send).
    let queued_in_tail = page.tail.iter().rev().find_map(|e| match e {
        Effect::Send { submission_id, fate: SendFate::Queued(request), .. } => {
            let hit = match by {
                SendLookup::Submission(id) => submission_id == id,
                SendLookup::SendId { send_id, principal } => {
                    request.send_id.as_deref() == Some(send_id) && request.principal.as_deref() == principal
                }
            };
            hit.then(|| SendRow {
                submission_id: submission_id.clone(),
                request: (**request).clone(),
                fate: Fate::Pending,
                run_id: None,
            })
        }
        _ => None,
    });
    let Some(mut row) = queued_in_tail.map_or_else(|| store.send(lineage, by), |r| Ok(Some(r)))? else {
        return Ok(None);
    };
    for e in &page.tail {
        let Effect::Send { submission_id, fate, .. } = e else { continue };
        if *submission_id != row.submission_id {
            continue;
        }
        match fate {
            SendFate::Queued(_) => {}
            SendFate::Started { run_id } => (row.fate, row.run_id) = (Fate::Started, Some(run_id.clone())),
            SendFate::Delivered { run_id } => (row.fate, row.run_id) = (Fate::Delivered, Some(run_id.clone())),
            SendFate::Retracted => (row.fate, row.run_id) = (Fate::Retracted, None),
            SendFate::Dropped(reason) => (row.fate, row.run_id) = (Fate::dropped(*reason), None),
        }
    }
    Ok(Some(row))
}

/// Where a run stands.
#[derive(Clone, Debug, PartialEq)]
pub enum RunPhase {
    Active,
    Paused { reason: PauseReason },
    Finished { reason: FinishReason },
}

/// What durable state says about one run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunFacts {
    pub run_id: String,
    pub submission_id: Option<String>,
    pub phase: RunPhase,
    pub error: Option<ProviderError>,
    pub usage: RunUsage,
    pub title: Option<String>,
    pub auth_selection: Option<AuthSelection>,
    /// The terminal's typed detail (`budget_exhausted`).
    pub detail: Option<BudgetDetail>,
    /// Steers in the transcript that no model of the run saw (meaningful once it finished).
    pub undelivered_steers: Vec<String>,
    /// The run is the session's last episode.
    pub is_last: bool,
    /// The normalized finish of its last model step, once it finished (when one was reported).
    pub finish: Option<String>,
}

/// The facts of `run_id` in this session: the last episode from the replay state, an older
/// run from its index row with the tail's changes applied. `None` when the session has no
/// such run.
pub fn run(store: &Store, lineage: &str, page: &TranscriptPage, run_id: &str) -> Result<Option<RunFacts>, StoreError> {
    let row = store.run(run_id)?.filter(|r| r.lineage == lineage);
    let stored_auth = row.as_ref().and_then(|r| r.auth_selection.as_deref()).and_then(|a| serde_json::from_str(a).ok());
    let tail_active = page.tail.iter().find_map(|e| match e {
        Effect::RunState { run_id: id, state: RunState::Active { title, auth_selection, .. }, .. } if id == run_id => {
            Some((title.clone(), auth_selection.clone()))
        }
        _ => None,
    });
    if let Some(e) = page.state.last.as_ref().filter(|e| e.run_id == run_id) {
        let (phase, error, detail) = match &e.status {
            EpisodeStatus::Open => (RunPhase::Active, None, None),
            EpisodeStatus::Paused { reason, error } => (RunPhase::Paused { reason: *reason }, error.clone(), None),
            EpisodeStatus::Finished { reason, error, detail } => {
                (RunPhase::Finished { reason: *reason }, error.clone(), detail.clone())
            }
        };
        let auth_selection = tail_active.and_then(|(_, a)| a).or(stored_auth);
        return Ok(Some(RunFacts {
            run_id: run_id.into(),
            submission_id: e.submission_id.clone(),
            phase,
            error,
            usage: e.usage.clone(),
            title: e.title.clone(),
            auth_selection,
            detail,
            undelivered_steers: e.unrendered_steers.clone(),
            is_last: true,
            finish: matches!(e.status, EpisodeStatus::Finished { .. })
                .then(|| e.final_step_finish_reason.clone())
                .flatten(),
        }));
    }
    // An older run: it finished before the last episode started; its start is in the store or
    // in the tail.
    let mut facts = match (&row, &tail_active) {
        (Some(row), _) => RunFacts {
            run_id: run_id.into(),
            submission_id: row.submission_id.clone(),
            phase: RunPhase::Active,
            error: row.error.as_deref().and_then(|e| serde_json::from_str(e).ok()),
            usage: row.usage.as_deref().and_then(|u| serde_json::from_str(u).ok()).unwrap_or_default(),
            title: row.title.clone(),
            auth_selection: stored_auth,
            detail: row.detail.as_deref().and_then(|d| serde_json::from_str(d).ok()),
            undelivered_steers: row
                .undelivered_steers
                .as_deref()
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or_default(),
            is_last: false,
            finish: row.finish.clone(),
        },
        (None, Some((title, auth_selection))) => RunFacts {
            run_id: run_id.into(),
            submission_id: None,
            phase: RunPhase::Active,
            error: None,
            usage: RunUsage::default(),
            title: title.clone(),
            auth_selection: auth_selection.clone(),
            detail: None,
            undelivered_steers: Vec::new(),
            is_last: false,
            finish: None,
        },
        (None, None) => return Ok(None),
    };
    if let Some(row) = row.as_ref().filter(|r| r.terminal) {
        if let Some(reason) = row.reason.as_deref().and_then(FinishReason::from_name) {
            facts.phase = RunPhase::Finished { reason };
        }
    }
    for e in &page.tail {
        if let Effect::RunState { run_id: id, submission_id: Some(sub), .. } = e {
            if id == run_id {
                facts.submission_id = Some(sub.clone());
            }
        }
    }
    for e in &page.tail {
        if let Effect::RunState {
            run_id: id,
            state: RunState::Finished { reason, error, usage, detail, undelivered_steers, finish, .. },
            ..
        } = e
        {
            if id == run_id {
                facts.finish = finish.clone();
                facts.phase = RunPhase::Finished { reason: *reason };
                facts.error = error.clone();
                facts.usage = usage.clone();
                facts.detail = detail.clone();
                facts.undelivered_steers = undelivered_steers.clone();
            }
        }
    }
    Ok(Some(facts))
}

/// What a send's durable fate answers (a keyed re-send and `send.status` alike).
pub fn fate(store: &Store, lineage: &str, page: &TranscriptPage, row: &SendRow) -> Result<SendReply, StoreError> {
    let run_state = |run_id: &str| -> Result<SendReply, StoreError> {
        Ok(match run(store, lineage, page, run_id)?.map(|f| f.phase) {
            Some(RunPhase::Active) | None => SendReply::active(run_id, None),
            Some(RunPhase::Paused { reason }) => SendReply::paused(run_id, reason),
            Some(RunPhase::Finished { reason }) => SendReply::finished(run_id, reason),
        })
    };
    match (row.fate, &row.run_id) {
        (Fate::Started, Some(run_id)) => {
            let mut answer = run_state(run_id)?;
            if answer.state == crate::wire::answers::SendState::Active {
                answer.submission_id = Some(row.submission_id.clone());
            }
            // A list send that started its run went out as `idle_start`: its receipt says so.
            if row.request.order.is_some() {
                answer = answer.started_turn(run_id.as_str());
            }
            Ok(answer)
        }
        (Fate::Delivered, Some(run_id)) => Ok(run_state(run_id)?.delivered_into(run_id.as_str())),
        (Fate::Retracted, _) => Ok(SendReply::retracted(row.submission_id.as_str())),
        (Fate::Superseded, _) => Ok(SendReply::ended(SendState::Superseded)),
        (Fate::Expired, _) => Ok(SendReply::ended(SendState::Expired)),
        _ => {
            // Still queued. A steer waiting for its run's next boundary answers that run.
            let target = row.request.target_run.as_deref().filter(|_| row.request.delivery() == Delivery::Steer);
            match target.filter(|t| matches!(&page.resolution, Resolution::Resume { run_id } if run_id == t)) {
                Some(run_id) => Ok(SendReply::active(run_id, None)),
                None => Ok(SendReply::pending(row.submission_id.as_str())),
            }
        }
    }
}

/// The baseline a keyed re-send (or `send.status`) of the send that started the session's first
/// episode hears again, from the replay state the read holds: only while that episode is the
/// last one (the admitting reply's hint; later, `session.baseline` is the answer).
pub fn first_baseline(page: &TranscriptPage, row: &SendRow) -> Option<crate::frozen::SessionBaseline> {
    let state = &page.state;
    let last = state.last.as_ref().filter(|_| state.episodes == 1)?;
    (row.run_id.as_deref() == Some(last.run_id.as_str())).then(|| last.config.config().map(|c| c.baseline()))?
}
