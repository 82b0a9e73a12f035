//! One `classify.run` call (classifier CONTRACT §3–§8; model-batch RULES §2–§15; spec §4b).
//!
//! The order, each step refusing before anything later happens:
//! 1. the work scope (`scope_required`, `flow_scope_required`): nothing is read or written;
//! 2. validation: size, shape, the catalog row, the model's limits, the spend estimate against
//!    the call's own `max_cost_usd` (`invalid_params`, `model_*`, `cost_exceeded`): nothing
//!    written;
//! 3. the model's call slot (`too_many_requests`), then admission in `system-one.db`
//!    (`batch_id_reuse`, `batch_in_progress`, `batch_scope_mismatch`), which records a new
//!    batch, tightens the ceiling and takes the batch's hold;
//! 4. the items in request order: a stored answer or permanent error is returned as stored; any
//!    other item is sent, one provider call at a time, unless the batch's recorded spend plus
//!    its estimate crosses the ceiling (`cost_exceeded`, stored) or a stop code ended the call;
//!    each outcome (with its measurement intent) is recorded before the next item is sent;
//! 5. a batch-level code on the call's first provider call (or a credential the vault refuses)
//!    refuses the whole call and writes nothing (a first admission is forgotten); later, it
//!    stops the call and is never stored;
//! 6. pending intents are published to `run-index.db`, the hold released, the reply built from
//!    the outcomes with the provider's answer text (its number spellings) spliced in.

use cortexkit_model_batch::absent::add_reported;
use cortexkit_model_batch::estimate::{estimate_item, usd_to_nanos, ItemCostInput, Rounding, Tokens};
use cortexkit_role_classifier::errors::{self as codes, ErrorClass, ItemError, Refusal, RefusalDetail};
use cortexkit_role_classifier::identity::BatchIdentity;
use cortexkit_role_classifier::reply::Usage;
use cortexkit_role_classifier::request::{check_catalog_row, check_request, check_request_bytes, parse_request};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::models::{self, ModelRefusal, Routed};
use super::provider::{self, Outcome as Called};
use super::scope::Stamp;
use super::service::Classifier;
use super::store::{Admitted, Arrival, ItemUsage, Outcome, Refused};
use crate::store::export::SystemOneFact;

/// The bound one image adds to an item's input estimate (RULES §5: a stated bound, never 0).
pub const IMAGE_TOKENS_EACH: u64 = 4_096;
/// The bound of the provider's own per-request overhead in the estimate.
pub const OVERHEAD_TOKENS: u64 = 512;

/// The raw text of what is forwarded verbatim: the questions and each item's state and images.
#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(borrow)]
    questions: &'a RawValue,
    #[serde(borrow)]
    items: Vec<RawItem<'a>>,
}

#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow)]
    state: &'a RawValue,
    #[serde(borrow, default)]
    images: Option<&'a RawValue>,
}

/// The validated call, before admission.
struct Call<'t> {
    batch_id: String,
    routed: &'static Routed,
    identity: BatchIdentity,
    ceiling_nanos: Option<u64>,
    raw: RawBody<'t>,
    /// Nanodollars per million tokens, by direction (`None`: not priced).
    input_rate: Option<u64>,
    output_rate: Option<u64>,
    /// Each item's input estimate, in nanodollars.
    estimates: Vec<u64>,
}

impl Call<'_> {
    fn priced(&self) -> bool {
        self.input_rate.is_some() || self.output_rate.is_some()
    }
}

/// Serves one call; the reply's JSON text (the `result` of the response) or the refusal.
pub fn classify(c: &Classifier, stamp: &Stamp, text: &str) -> Result<String, Refusal> {
    let attribution = stamp.attribution()?;
    c.sweep_if_due();
    let call = validate(c, text)?;
    let _slot = c.model_slot(call.routed.catalog_id)?;
    let now_ms = c.clock.now_ms();
    let arrival = Arrival {
        batch_id: &call.batch_id,
        identity: &call.identity,
        attribution: &attribution,
        ceiling_nanos: call.ceiling_nanos,
        holder: &c.holder,
        now_ms,
    };
    let admitted = match c.store.admit(&arrival).map_err(|e| internal(c, &e))? {
        Ok(admitted) => admitted,
        Err(Refused::Reuse { field }) => return Err(Refusal::batch_id_reuse(field)),
        Err(Refused::InProgress { .. }) => return Err(Refusal::batch_in_progress(super::service::FULL_RETRY_AFTER_MS)),
        Err(Refused::ScopeMismatch) => {
            return Err(super::scope::refusal(
                crate::wire::RefusalCode::BatchScopeMismatch,
                "this batch was first admitted under another work scope; its attribution is frozen",
            ))
        }
    };
    let held = Held::new(c, &call.batch_id);
    let result = run_items(c, &call, &attribution, admitted);
    if let Err(Stop::Refused { refusal, first }) = &result {
        if *first {
            c.store.forget(&call.batch_id, &c.holder).map_err(|e| internal(c, &e))?;
        }
        drop(held);
        return Err(refusal.clone());
    }
    crate::failpoint!("classify.before_publish");
    c.publish_pending().map_err(|e| {
        log::error!(target: "broca.classify", "publishing system_one facts: {e}");
        transient(c, "the measurement facts could not be published; send the batch again")
    })?;
    drop(held);
    let items = match result {
        Ok(items) => items,
        Err(Stop::Internal(e)) => return Err(internal(c, &e)),
        Err(Stop::Refused { .. }) => unreachable!("returned above"),
    };
    Ok(reply_text(&call, items))
}

/// Steps 1–2: everything checked before anything is written.
fn validate<'t>(c: &Classifier, text: &'t str) -> Result<Call<'t>, Refusal> {
    let limits = cortexkit_role_classifier::describe::Limits::new(models::MAX_ITEMS, models::MAX_REQUEST_BYTES);
    check_request_bytes(text.len(), &limits)?;
    let request = parse_request(text)?;
    let catalog = c.catalog.read();
    let catalog = catalog.as_ref().map_err(|e| {
        let mut refusal = Refusal::model_unavailable(&request.model);
        refusal.message = format!("the model catalog is unavailable: {e}");
        refusal
    })?;
    let (row, routed) = match models::resolve(catalog, &request.model) {
        Ok(found) => found,
        Err(ModelRefusal::Unknown) => return Err(Refusal::model_unknown(&request.model)),
        Err(ModelRefusal::NotClassifier { kind: Some(kind) }) => {
            return Err(Refusal::model_not_classifier(&request.model, kind));
        }
        Err(ModelRefusal::NotClassifier { kind: None }) => {
            use cortexkit_model_batch::admission::CatalogRow;
            let kindless = check_catalog_row(&request.model, CatalogRow::Kindless);
            return Err(kindless.err().unwrap_or_else(|| Refusal::model_unknown(&request.model)));
        }
        Err(ModelRefusal::Unavailable) => return Err(Refusal::model_unavailable(&request.model)),
    };
    let entry = models::entry(row, routed, &c.bases);
    check_request(&request, &entry)?;
    let identity = BatchIdentity::of(&request).map_err(|e| Refusal::invalid_params("params", e.to_string()))?;
    let raw: RawBody = serde_json::from_str(text).map_err(|e| Refusal::invalid_params("params", e.to_string()))?;
    let input_rate = row.rate_input.and_then(|r| r.nanos_per_mtok());
    let output_rate = row.rate_output.and_then(|r| r.nanos_per_mtok());
    let schema = Tokens::bound_of_text(raw.questions.get());
    let estimates: Vec<u64> = raw
        .items
        .iter()
        .zip(&request.items)
        .map(|(item, parsed)| {
            let images = parsed.images.as_ref().map_or(0, |i| i.len() as u64);
            let input =
                ItemCostInput::new(Tokens::bound_of_text(item.state.get()), schema, IMAGE_TOKENS_EACH, OVERHEAD_TOKENS)
                    .with_images(images);
            let rate = input_rate.map_or(0, |r| i64::try_from(r).unwrap_or(i64::MAX));
            estimate_item(&input, rate).map_or(u64::MAX, |e| e.cost_nanos)
        })
        .collect();
    let ceiling_nanos = request.max_cost_usd.as_ref().map(|usd| usd_to_nanos(usd, Rounding::Down).unwrap_or(u64::MAX));
    if let (Some(ceiling), Some(usd)) = (ceiling_nanos, &request.max_cost_usd) {
        let total = estimates.iter().fold(0u64, |a, e| a.saturating_add(*e));
        if total > ceiling {
            let estimate = serde_json::Number::from_f64(total as f64 / 1e9).unwrap_or_else(|| 0.into());
            return Err(Refusal::cost_exceeded(estimate, usd.clone()));
        }
    }
    Ok(Call { batch_id: request.batch_id, routed, identity, ceiling_nanos, raw, input_rate, output_rate, estimates })
}

/// Why the item loop ended early.
enum Stop {
    /// The whole call is refused (its first provider call met a batch-level code, or the vault
    /// refused): `first` when the batch was admitted by this call and must be forgotten.
    Refused {
        refusal: Refusal,
        first: bool,
    },
    Internal(super::store::StoreError),
}

/// One item's place in the reply.
enum Shown {
    Answered { answers: String, usage: ItemUsage, cost_nanos: Option<u64> },
    Failed(ItemError),
}

/// Step 4: the items in request order.
fn run_items(
    c: &Classifier,
    call: &Call<'_>,
    attribution: &super::store::Attribution,
    admitted: Admitted,
) -> Result<Vec<Shown>, Stop> {
    let Admitted { first, ceiling_nanos, mut outcomes } = admitted;
    // Read from the vault before the call's first provider call, never for a pure replay.
    let mut credential: Option<(String, String)> = None;
    let mut spent = c.store.spent_nanos(&call.batch_id).map_err(Stop::Internal)?;
    let mut stopped: Option<(u64, ItemError)> = None;
    let mut calls_made = 0u64;
    let mut shown = Vec::with_capacity(call.raw.items.len());
    for (i, item) in call.raw.items.iter().enumerate() {
        let i = i as u64;
        match outcomes.remove(&i) {
            Some(outcome) if !outcome.retried_on_resend() => {
                shown.push(stored(outcome));
                continue;
            }
            _ => {}
        }
        if let Some((at, stop)) = &stopped {
            let message = format!("not sent: item {at} met {} in this call", stop.code);
            shown.push(Shown::Failed(ItemError::new(stop.code.clone(), stop.class.clone(), message)));
            continue;
        }
        let estimate = call.estimates[i as usize];
        if ceiling_nanos.is_some_and(|ceiling| spent.checked_add(estimate).is_none_or(|t| t > ceiling)) {
            let error =
                ItemError::for_code(codes::COST_EXCEEDED, "answering this item would cross the batch's max_cost_usd");
            record(
                c,
                call,
                i,
                &Outcome::Failed { code: error.code.clone(), message: error.message.clone(), transient: false },
                None,
            )?;
            c.metrics.items_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shown.push(Shown::Failed(error));
            continue;
        }
        let read = match credential.take() {
            Some(read) => read,
            None => read_credential(c, call.routed).map_err(|refusal| Stop::Refused { refusal, first })?,
        };
        let (bearer, url) = credential.insert(read);
        let body = provider_body(call, item);
        let called = provider::call(&c.agent, url.as_str(), call.routed, bearer.as_str(), body.as_bytes());
        calls_made += 1;
        match called {
            Called::Answered(answered) => {
                let usage = ItemUsage {
                    input_tokens: answered.usage.and_then(|u| u.input_tokens),
                    output_tokens: answered.usage.and_then(|u| u.output_tokens),
                };
                let (cost_nanos, spend_nanos) = costs(call, &usage, estimate);
                let outcome = Outcome::Answered {
                    answers: answered.answers.clone(),
                    usage: usage.clone(),
                    cost_nanos,
                    spend_nanos,
                };
                let fact = fact(c, call, attribution, i, &usage);
                if record(c, call, i, &outcome, Some(&fact))? {
                    c.metrics.items_answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    c.metrics.spent(call.routed.catalog_id, spend_nanos);
                    spent = spent.saturating_add(spend_nanos);
                }
                shown.push(Shown::Answered { answers: answered.answers, usage, cost_nanos });
            }
            Called::Failed { error, status } => {
                c.metrics.provider_error(call.routed.provider.id(), &error.code, status);
                if status == Some(401) {
                    report_auth_failure(c, call.routed);
                }
                if !error.is_stored() {
                    if calls_made == 1 {
                        return Err(Stop::Refused { refusal: first_call_refusal(call.routed, &error), first });
                    }
                    stopped = Some((i, error.clone()));
                    shown.push(Shown::Failed(error));
                    continue;
                }
                let outcome = Outcome::Failed {
                    code: error.code.clone(),
                    message: error.message.clone(),
                    transient: error.class.is_transient(),
                };
                if record(c, call, i, &outcome, None)? {
                    c.metrics.items_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                if error.stops_the_call() {
                    stopped = Some((i, error.clone()));
                }
                shown.push(Shown::Failed(error));
            }
        }
    }
    Ok(shown)
}

fn stored(outcome: Outcome) -> Shown {
    match outcome {
        Outcome::Answered { answers, usage, cost_nanos, .. } => Shown::Answered { answers, usage, cost_nanos },
        Outcome::Failed { code, message, transient } => {
            let class = if transient { ErrorClass::Transient } else { ErrorClass::Permanent };
            Shown::Failed(ItemError::new(code, class, message))
        }
    }
}

fn record(c: &Classifier, call: &Call<'_>, i: u64, outcome: &Outcome, fact: Option<&str>) -> Result<bool, Stop> {
    let written = c.store.record(&call.batch_id, i, outcome, fact, c.clock.now_ms()).map_err(Stop::Internal)?;
    crate::failpoint!("classify.after_record");
    Ok(written)
}

/// The vault's bearer token and the item URL (Workers AI's carries the record's account id).
fn read_credential(c: &Classifier, routed: &Routed) -> Result<(String, String), Refusal> {
    let id = routed.provider.credential_id();
    let auth_failed = |message: String| {
        let mut refusal = Refusal::auth_failed();
        refusal.message = message;
        refusal.detail.credential = Some(id.clone());
        refusal
    };
    let Some(vault) = &c.vault else {
        return Err(auth_failed(format!("no vault is reachable to read {id}")));
    };
    let credential = match vault.get_scoped(&id, None) {
        Ok(credential) => credential,
        Err(e)
            if e.class == crate::vault::CredentialErrorClass::Transient
                || e.class == crate::vault::CredentialErrorClass::Transport
                || e.class == crate::vault::CredentialErrorClass::Unavailable =>
        {
            return Err(transient(c, &format!("the vault could not give {id} now ({})", e.code())));
        }
        Err(e) => return Err(auth_failed(format!("the vault refused {id} ({})", e.code()))),
    };
    let account = credential.account_id.as_deref();
    if routed.provider == models::Provider::WorkersAi && account.is_none_or(str::is_empty) {
        return Err(auth_failed(format!("the vault record {id} carries no account id")));
    }
    let url = provider::endpoint(routed.provider.base(&c.bases), routed, account);
    Ok((credential.secret.expose().to_owned(), url))
}

fn report_auth_failure(c: &Classifier, routed: &Routed) {
    let Some(vault) = &c.vault else { return };
    let id = routed.provider.credential_id();
    if let Ok(credential) = vault.get_scoped(&id, None) {
        let _ = vault.report_auth_failure(&id, 401, &credential.record_version);
    }
}

/// A batch-level code met on the call's first provider call, as the call's refusal.
fn first_call_refusal(routed: &Routed, error: &ItemError) -> Refusal {
    let mut refusal = match error.code.as_str() {
        codes::AUTH_FAILED => {
            let mut r = Refusal::auth_failed();
            r.detail.credential = Some(routed.provider.credential_id());
            r
        }
        codes::MODEL_UNAVAILABLE => Refusal::model_unavailable(routed.catalog_id),
        codes::ACCOUNT_LIMIT_EXHAUSTED => Refusal::account_limit_exhausted(),
        _ => Refusal::account_not_entitled(),
    };
    refusal.message = format!("the call's first provider call: {}", error.message);
    refusal
}

/// The provider request: `{model, state, questions, images?}`, the caller's text verbatim.
fn provider_body(call: &Call<'_>, item: &RawItem<'_>) -> String {
    let model = serde_json::to_string(call.routed.wire_model).expect("a str encodes");
    let images = item.images.map_or(String::new(), |i| format!(",\"images\":{}", i.get()));
    format!("{{\"model\":{model},\"state\":{},\"questions\":{}{images}}}", item.state.get(), call.raw.questions.get())
}

/// An answered item's cost from reported tokens (absent when a priced direction was not
/// reported, RULES §10) and the spend its batch ceiling counts (the input estimate standing in
/// for unreported input tokens; unreported output counts nothing).
fn costs(call: &Call<'_>, usage: &ItemUsage, estimate: u64) -> (Option<u64>, u64) {
    if !call.priced() {
        return (None, 0);
    }
    let priced = |tokens: Option<u64>, rate: Option<u64>| match rate {
        None | Some(0) => Some(0),
        Some(rate) => tokens.map(|t| ((t as u128 * rate as u128).div_ceil(1_000_000)).min(u64::MAX as u128) as u64),
    };
    let input = priced(usage.input_tokens, call.input_rate);
    let output = priced(usage.output_tokens, call.output_rate);
    let cost = input.zip(output).map(|(i, o)| i.saturating_add(o));
    let spend = input.unwrap_or(estimate).saturating_add(output.unwrap_or(0));
    (cost, spend)
}

/// The item's immutable measurement intent: reported tokens only.
fn fact(c: &Classifier, call: &Call<'_>, who: &super::store::Attribution, i: u64, usage: &ItemUsage) -> String {
    let (provider, model) = call.routed.catalog_id.split_once('/').unwrap_or(("", call.routed.catalog_id));
    let fact = SystemOneFact {
        fact_id: SystemOneFact::id_for(&call.batch_id, i),
        batch_id: call.batch_id.clone(),
        item: i,
        provider: provider.to_owned(),
        model: model.to_owned(),
        agent_id: who.agent_id.clone(),
        run_id: who.run_id.clone(),
        flow_id: who.flow_id.clone(),
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        occurred_at_ms: c.clock.now_ms(),
    };
    serde_json::to_string(&fact).expect("a fact encodes")
}

#[derive(Serialize)]
struct ReplyItem<'a> {
    index: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    answers: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a ItemError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct ReplyText<'a> {
    batch_id: &'a str,
    model: &'a str,
    items: Vec<ReplyItem<'a>>,
    usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_usd: Option<Box<RawValue>>,
}

/// Step 6: the reply, answers spliced in as the provider's text.
fn reply_text(call: &Call<'_>, shown: Vec<Shown>) -> String {
    let raw: Vec<Option<Box<RawValue>>> = shown
        .iter()
        .map(|s| match s {
            Shown::Answered { answers, .. } => RawValue::from_string(answers.clone()).ok(),
            Shown::Failed(_) => None,
        })
        .collect();
    let mut usage = Usage::default();
    let mut cost: Option<u64> = Some(0);
    let items = shown
        .iter()
        .zip(&raw)
        .enumerate()
        .map(|(index, (s, raw))| match s {
            Shown::Answered { usage: u, cost_nanos, .. } => {
                usage.input_tokens = add_reported(usage.input_tokens, u.input_tokens);
                usage.output_tokens = add_reported(usage.output_tokens, u.output_tokens);
                cost = cost.zip(*cost_nanos).map(|(a, b)| a.saturating_add(b));
                let usage = item_usage(u);
                ReplyItem { index: index as u64, answers: raw.as_deref(), error: None, usage }
            }
            Shown::Failed(error) => ReplyItem { index: index as u64, answers: None, error: Some(error), usage: None },
        })
        .collect();
    let cost_usd = cost.filter(|_| call.priced()).and_then(|nanos| RawValue::from_string(usd_text(nanos)).ok());
    let body = ReplyText { batch_id: &call.batch_id, model: call.routed.catalog_id, items, usage, cost_usd };
    serde_json::to_string(&body).expect("a reply encodes")
}

/// What the provider reported for an item, absent when it reported nothing.
fn item_usage(u: &ItemUsage) -> Option<Usage> {
    let mut usage = Usage::new();
    usage.input_tokens = u.input_tokens;
    usage.output_tokens = u.output_tokens;
    (!usage.is_empty()).then_some(usage)
}

/// Nanodollars as a JSON number of USD, exactly (`2000000001` is `2.000000001`).
pub fn usd_text(nanos: u64) -> String {
    let (whole, fraction) = (nanos / 1_000_000_000, nanos % 1_000_000_000);
    let fraction = format!("{fraction:09}");
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        whole.to_string()
    } else {
        format!("{whole}.{fraction}")
    }
}

/// Ends a call's hold on its batch when dropped, and keeps the in-flight gauge.
struct Held<'c> {
    c: &'c Classifier,
    batch_id: String,
}

impl<'c> Held<'c> {
    fn new(c: &'c Classifier, batch_id: &str) -> Held<'c> {
        c.metrics.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Held { c, batch_id: batch_id.to_owned() }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.c.store.release(&self.batch_id, &self.c.holder) {
            log::error!(target: "broca.classify", "releasing batch {}: {e}", self.batch_id);
        }
        self.c.metrics.in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn transient(_c: &Classifier, message: &str) -> Refusal {
    let mut detail = RefusalDetail::new(ErrorClass::Transient);
    detail.retry_after_ms = Some(1_000);
    Refusal::new(crate::wire::RefusalCode::Unavailable.as_str(), message).with_detail(detail)
}

fn internal(c: &Classifier, e: &dyn std::fmt::Display) -> Refusal {
    log::error!(target: "broca.classify", "system-one.db: {e}");
    transient(c, "broca's batch store failed; send the batch again")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_text_is_exact() {
        assert_eq!(usd_text(0), "0");
        assert_eq!(usd_text(2_000_000_001), "2.000000001");
        assert_eq!(usd_text(300_000), "0.0003");
        assert_eq!(usd_text(1_500_000_000), "1.5");
    }
}
