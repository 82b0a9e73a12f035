//! Conversation messages in the runner's own schema (`owned-broca`), and usage shapes.
//!
//! `{"role":"user","content":[{"type":"text","text":"hi"}]}`; assistant messages may carry
//! `origin`; a tool-role message holds one `tool_result` part per call of a batch, in planned
//! order.

use cortexkit_role_llm_runner::service_tier::RunServiceTierUsage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    Tool,
    System,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    Reasoning {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Reasoning the provider returned only as an opaque blob (Anthropic `redacted_thinking`);
    /// sent back unchanged.
    RedactedReasoning {
        data: String,
    },
    ToolCall {
        tool_call_id: String,
        tool_name: String,
        input: Value,
    },
    ToolResult {
        tool_call_id: String,
        output: Value,
        is_error: bool,
    },
    Image {
        media_type: String,
        data: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Value>,
    /// How a `delivery_order` send went out (llm-runner §9.7), on the entry it became: the
    /// mode, and for `tool_result` the call key of the result it rode with. Stored with the
    /// message so readers and a resumed run see what was sent; served in the read envelope,
    /// never inside the message, and never rendered to a provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_as: Option<cortexkit_role_llm_runner::delivery_order::EntryDelivery>,
    /// The attested module whose send wrote this user message, the owner's or a plan-named
    /// sender's (llm-runner §4.7 `message_senders`, §9.7); absent for a caller that is no
    /// module. Shown on its display row only, never in a read body nor to a provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// The caller's own id for this user message (llm-runner §9.11): on its display row only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
}

/// The text a tool result's `output` shows as: a text output's text, a content output's text
/// ([`ContentOutput::text`]), else its `message`, else its JSON. A display row's
/// `tool_result.content` holds it, and a live `tool_finished`'s `output_bytes` is its length, so
/// the two always agree.
pub fn tool_result_content(output: &Value) -> String {
    if let Some(content) = ContentOutput::of(output) {
        return content.text();
    }
    match output.get("text").and_then(Value::as_str) {
        Some(text) if output.get("kind").and_then(Value::as_str) == Some("text") => text.to_owned(),
        _ => output.get("message").and_then(Value::as_str).map_or_else(|| output.to_string(), String::from),
    }
}

/// A tool result that carries images (`{"kind":"content","content":[…]}`): a `tool-result/v1`
/// body's parts in the provider's order, each text part (an unknown part as its one-line note)
/// and each image with its decoded-from-base64 bytes kept as the provider sent them. A result
/// without images stays `{"kind":"text"}`, so its stored bytes are what they always were.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename = "content")]
pub struct ContentOutput {
    pub content: Vec<OutputPart>,
}

/// One part of a [`ContentOutput`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputPart {
    Text {
        text: String,
    },
    Image {
        media_type: String,
        /// Standard base64, checked on receipt (tool-provider `result::validate`).
        data: String,
        width: u64,
        height: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alt: Option<String>,
    },
}

impl ContentOutput {
    /// The stored output as a content output, when it is one.
    pub fn of(output: &Value) -> Option<ContentOutput> {
        if output.get("kind").and_then(Value::as_str) != Some("content") {
            return None;
        }
        serde_json::from_value(output.clone()).ok()
    }

    /// The stored value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The result as text, for a model that takes no image in a tool result and for display:
    /// the parts joined by `\n`, each image as the note broca has always shown for one.
    pub fn text(&self) -> String {
        self.content.iter().map(OutputPart::text).collect::<Vec<_>>().join("\n")
    }
}

impl OutputPart {
    /// The part as text: its text, or an image's note.
    pub fn text(&self) -> String {
        match self {
            OutputPart::Text { text } => text.clone(),
            OutputPart::Image { media_type, width, height, .. } => image_note(media_type, *width, *height),
        }
    }
}

/// What stands for an image where it is not shown (`[image not shown: mime=image/png 1x1]`).
pub fn image_note(media_type: &str, width: u64, height: u64) -> String {
    format!("[image not shown: mime={media_type} {width}x{height}]")
}

impl Message {
    /// A message of `role` holding `content`, with nothing kept beside it.
    pub fn of(role: Role, content: Vec<Part>) -> Message {
        Message { role, content, origin: None, delivered_as: None, sender: None, client_message_id: None }
    }

    pub fn user_text(text: impl Into<String>) -> Message {
        Message::of(Role::User, vec![Part::Text { text: text.into() }])
    }

    pub fn assistant_text(text: impl Into<String>) -> Message {
        Message::of(Role::Assistant, vec![Part::Text { text: text.into() }])
    }

    /// The text parts joined, as `run.result` reports an assistant's answer.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// One model step's usage, normalized: `input_tokens` excludes cache reads and writes;
/// `reasoning_tokens` is inside `output_tokens`; a measurement never reported is absent, never 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

impl StepUsage {
    /// A step with all five measurements absent is *unreported*.
    pub fn is_unreported(&self) -> bool {
        self.input_tokens.is_none()
            && self.cached_input_tokens.is_none()
            && self.cache_write_tokens.is_none()
            && self.output_tokens.is_none()
            && self.reasoning_tokens.is_none()
    }

    /// Input this step consumed against a session's input-token cap (spec §4): fresh input,
    /// cache read and cache write at face value; `None` when the step reported no input (the
    /// cap then fails closed).
    pub fn consumed_input(&self) -> Option<u64> {
        let fresh = self.input_tokens?;
        let extra = self.cached_input_tokens.unwrap_or(0).saturating_add(self.cache_write_tokens.unwrap_or(0));
        Some(fresh.saturating_add(extra))
    }

    /// A lower bound of the session's next request, in tokens, after this step: its consumed
    /// input plus its visible output (reasoning left out: a family may drop it from later
    /// requests); `None` unless the step reported both.
    pub fn next_request_floor(&self) -> Option<u64> {
        let visible = self.output_tokens?.saturating_sub(self.reasoning_tokens.unwrap_or(0));
        Some(self.consumed_input()?.saturating_add(visible))
    }

    /// Adds `other` into `self`; a total stays absent until some step reports it.
    pub fn add(&mut self, other: &StepUsage) {
        fn add(a: &mut Option<u64>, b: Option<u64>) {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0).saturating_add(b));
            }
        }
        add(&mut self.input_tokens, other.input_tokens);
        add(&mut self.cached_input_tokens, other.cached_input_tokens);
        add(&mut self.cache_write_tokens, other.cache_write_tokens);
        add(&mut self.output_tokens, other.output_tokens);
        add(&mut self.reasoning_tokens, other.reasoning_tokens);
    }
}

/// Usage of one `(provider, model, variant)` within a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelUsage {
    pub provider: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub steps: u64,
    pub unreported_steps: u64,
    #[serde(flatten)]
    pub totals: StepUsage,
}

/// A run's usage (`RunUsage` of the role): totals plus one entry per model in order of first use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunUsage {
    pub steps: u64,
    pub unreported_steps: u64,
    #[serde(flatten)]
    pub totals: StepUsage,
    #[serde(default)]
    pub by_model: Vec<ModelUsage>,
    /// The run's non-standard service level and the level its provider stated, when every
    /// step that stated one agreed (llm-runner §9.3.2); derived from the steps by `record_tier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier_applied: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier_served: Option<String>,
}

impl RunUsage {
    pub fn add_step(&mut self, provider: &str, model: &str, variant: Option<&str>, usage: &StepUsage) {
        let unreported = u64::from(usage.is_unreported());
        self.steps += 1;
        self.unreported_steps += unreported;
        self.totals.add(usage);
        let entry = match self
            .by_model
            .iter_mut()
            .position(|m| m.provider == provider && m.model == model && m.variant.as_deref() == variant)
        {
            Some(i) => &mut self.by_model[i],
            None => {
                self.by_model.push(ModelUsage {
                    provider: provider.into(),
                    model: model.into(),
                    variant: variant.map(String::from),
                    ..ModelUsage::default()
                });
                self.by_model.last_mut().expect("just pushed")
            }
        };
        entry.steps += 1;
        entry.unreported_steps += unreported;
        entry.totals.add(usage);
    }

    /// Adds one step's service levels (its record's `service_tier_applied` and
    /// `service_tier_served`) to `tiers`, the crate's constant-size accumulator the caller keeps
    /// durable beside these totals (a disagreement between steps is never forgotten), and
    /// takes the run's two members from it. A step whose applied level differs from the run's
    /// earlier steps (no writer produces one) leaves both unchanged.
    pub fn record_tier(&mut self, tiers: &mut RunServiceTierUsage, applied: Option<&str>, served: Option<&str>) {
        use cortexkit_role_llm_runner::service_tier::{ServiceTier, ServiceTierUsage};
        let level = applied.map_or(Some(ServiceTier::Standard), ServiceTier::parse);
        let Some(level) = level else { return };
        let mut step = ServiceTierUsage::new(level);
        if let Some(served) = served {
            step = step.with_served(served);
        }
        if tiers.record_step(&step).is_ok() {
            let usage = tiers.usage();
            self.service_tier_applied = usage.service_tier_applied;
            self.service_tier_served = usage.service_tier_served;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_stays_absent_and_by_model_sums_match() {
        let mut run = RunUsage::default();
        run.add_step("p", "m", None, &StepUsage::default());
        assert_eq!(run.totals, StepUsage::default());
        assert_eq!(run.unreported_steps, 1);
        run.add_step("p", "m2", Some("high"), &StepUsage { output_tokens: Some(5), ..Default::default() });
        run.add_step(
            "p",
            "m",
            None,
            &StepUsage { output_tokens: Some(2), input_tokens: Some(0), ..Default::default() },
        );
        assert_eq!(run.totals.output_tokens, Some(7));
        assert_eq!(run.totals.input_tokens, Some(0));
        assert_eq!(run.totals.reasoning_tokens, None);
        assert_eq!(run.by_model.len(), 2);
        assert_eq!(run.by_model[0].steps + run.by_model[1].steps, run.steps);
        let json = serde_json::to_string(&run).unwrap();
        assert!(json.starts_with(r#"{"steps":3,"unreported_steps":1,"input_tokens":0,"output_tokens":7"#), "{json}");
    }

    #[test]
    fn tiers_report_applied_and_only_an_agreed_served_level() {
        let mut run = RunUsage::default();
        run.record_tier(&mut RunServiceTierUsage::new(), None, Some("standard"));
        assert_eq!((run.service_tier_applied.as_deref(), run.service_tier_served.as_deref()), (None, Some("standard")));
        let mut fast = RunUsage::default();
        let mut tiers = RunServiceTierUsage::new();
        fast.record_tier(&mut tiers, Some("fast"), None);
        assert_eq!((fast.service_tier_applied.as_deref(), fast.service_tier_served.as_deref()), (Some("fast"), None));
        fast.record_tier(&mut tiers, Some("fast"), Some("fast"));
        fast.record_tier(&mut tiers, Some("fast"), None);
        assert_eq!(fast.service_tier_served.as_deref(), Some("fast"), "a missing report does not vote");
        fast.record_tier(&mut tiers, Some("fast"), Some("standard"));
        // The accumulator survives a checkpoint (it is durable state, not a wire member).
        let mut tiers: RunServiceTierUsage = serde_json::from_value(serde_json::to_value(&tiers).unwrap()).unwrap();
        fast.record_tier(&mut tiers, Some("fast"), Some("fast"));
        assert_eq!(fast.service_tier_served, None, "a disagreement is never forgotten");
        assert_eq!(fast.service_tier_applied.as_deref(), Some("fast"));
        let json = serde_json::to_value(&fast).unwrap();
        assert_eq!(json["service_tier_applied"], "fast");
        assert!(json.get("service_tier_served").is_none());
    }
}
