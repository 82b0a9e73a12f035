//! Code Assist reasoning tiers (spec §1a, §4 "Code Assist (Antigravity) renders a variant as a
//! backend tier"): the route publishes a backend id per level (`route.reasoning_wire_ids`) and
//! the id a send without a variant uses (`route.reasoning_default`). A variant the row defines
//! selects its tier's id, exactly as if the caller had spelled that id; its thinking settings
//! go with it (`thinkingConfig {includeThoughts: true, thinkingLevel}`, the level upper-cased
//! on Argon tiers, which take no `thinkingBudget`).

use serde_json::{json, Value};

use super::ModelRow;

/// Why a Code Assist send has no backend tier.
#[derive(Debug, PartialEq, Eq)]
pub enum TierError {
    /// The route publishes no tier map or no default (`fact` names which).
    Missing { fact: &'static str },
    /// The route has no tier for this level (`tiers`: the levels it has).
    NoTier { variant: String, tiers: Vec<String> },
}

/// The backend id and the request members a Code Assist send of `variant` renders to (the
/// row's own variants were checked to hold `variant` before).
pub fn resolve(row: &ModelRow, variant: Option<&str>) -> Result<(String, Value), TierError> {
    let Some(tiers) = row.reasoning_wire_ids.as_ref().filter(|t| !t.is_empty()) else {
        return match variant {
            Some(v) => Err(TierError::NoTier { variant: v.to_owned(), tiers: Vec::new() }),
            None => Err(TierError::Missing { fact: "route.reasoning_wire_ids" }),
        };
    };
    let Some(level) = variant else {
        let default = row.reasoning_default.clone();
        return default.map(|id| (id, Value::Null)).ok_or(TierError::Missing { fact: "route.reasoning_default" });
    };
    let Some(id) = tiers.get(level) else {
        return Err(TierError::NoTier { variant: level.to_owned(), tiers: tiers.keys().cloned().collect() });
    };
    let argon = id.contains("argon");
    let thinking_level = if argon { level.to_ascii_uppercase() } else { level.to_owned() };
    let params =
        json!({"generationConfig": {"thinkingConfig": {"includeThoughts": true, "thinkingLevel": thinking_level}}});
    Ok((id.clone(), params))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tiers: Option<Value>, default: Option<&str>) -> ModelRow {
        let mut facts = json!({"existence": "present", "model.kind": "chat", "wire.npm": "@ai-sdk/google"});
        if let Some(t) = tiers {
            facts["route.reasoning_wire_ids"] = t;
        }
        if let Some(d) = default {
            facts["route.reasoning_default"] = json!(d);
        }
        ModelRow::from_facts("google/antigravity-gemini-3.8-flash", facts.as_object().unwrap()).unwrap()
    }

    #[test]
    fn a_level_selects_its_tier_and_no_level_the_default() {
        let r = row(
            Some(json!({"low": "gemini-3.8-flash-low", "high": "gemini-3.8-flash-high"})),
            Some("gemini-3.8-flash-medium"),
        );
        assert_eq!(resolve(&r, None).unwrap().0, "gemini-3.8-flash-medium");
        let (id, params) = resolve(&r, Some("high")).unwrap();
        assert_eq!(id, "gemini-3.8-flash-high");
        assert_eq!(params["generationConfig"]["thinkingConfig"]["thinkingLevel"], "high");
        // Defined by the row, but the route has no tier for it: refused naming the route's tiers.
        let no_tier = TierError::NoTier { variant: "medium".into(), tiers: vec!["high".into(), "low".into()] };
        assert_eq!(resolve(&r, Some("medium")), Err(no_tier));
    }

    #[test]
    fn argon_tiers_think_in_capitals_and_missing_facts_refuse() {
        let argon = row(Some(json!({"low": "gemini-4-argon-low"})), Some("gemini-4-argon-medium"));
        let (_, params) = resolve(&argon, Some("low")).unwrap();
        assert_eq!(
            params,
            json!({"generationConfig": {"thinkingConfig": {"includeThoughts": true, "thinkingLevel": "LOW"}}})
        );
        let bare = row(None, None);
        assert_eq!(resolve(&bare, None), Err(TierError::Missing { fact: "route.reasoning_wire_ids" }));
        let no_default = row(Some(json!({"low": "x-low"})), None);
        assert_eq!(resolve(&no_default, None), Err(TierError::Missing { fact: "route.reasoning_default" }));
    }
}
