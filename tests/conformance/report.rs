//! The counts, the `CONFORMANCE` line and the list of what to fix, taken from the suite's own
//! report (its outcomes, kill ledger and verdict), never recomputed from anything else.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cortexkit_role_llm_runner_conformance::{CaseOutcome, SuiteReport, SuiteVerdict};

/// A case broca fails on purpose: passing it would break a rule of the published contract, which
/// issue #13 says wins where the two cannot both be served (README, "The llm-runner/v1
/// conformance suite").
pub struct Deviation {
    pub case: &'static str,
    /// The rule passing the case would break.
    pub rule: &'static str,
    /// What the case's failure reason must say: it fails for this rule, or it is an unlisted
    /// failure (#47: a deviation matched by name alone would hide any other failure of it).
    pub reason: &'static str,
}

/// Every deviation, each one failed case of the suite's report. A listed case that stops failing
/// is reported too, so the list never outlives its reason.
pub const DEVIATIONS: &[Deviation] = &[
    Deviation {
        case: "display_without_limits_is_whole",
        rule: "its scripted tool answers a JSON object of over 131,072 canonical bytes; llm-runner 0.8.0 \
               §11.3.1 and tool-provider 0.15.0 §4.5 measure a legacy non-string result as its \
               canonical JSON against the inclusive 65,536-byte limit, so broca discards it for \
               tool_result_too_large (the suite's fake measures string results only)",
        // broca's 117-byte tool_result_too_large error in the object's place (the arguments'
        // size follows the suite's minted ids, so it is not pinned).
        reason: " bytes and a result of 117 bytes, not the whole call",
    },
    Deviation {
        case: "media_descriptors_frame_budget",
        rule: "its mixed-size fallback result is 19 text parts of 3,508,507 model-visible bytes, over \
               the inclusive 65,536-byte provider-result limit (llm-runner 0.8.0 §11.3.1, \
               tool-provider 0.15.0 result::model_visible_bytes), so broca discards it whole for \
               tool_result_too_large and no text part is left to describe (its 3,200,000-character \
               image is also over tool-provider's 3 MiB reply bound); the case's other checks \
               (both args_refs in one message, the inline reply_too_large) pass",
        // No mixed part stored, so none described.
        reason: "largest-first fallback must describe mixed parts [1, 3], got []",
    },
    Deviation {
        case: "media_descriptors_stable_across_pages",
        rule: "its multipart result is 14 text parts of 3,584,000 model-visible bytes, over the \
               inclusive 65,536-byte provider-result limit (llm-runner 0.8.0 §11.3.1), so broca \
               discards it whole for tool_result_too_large and no text part is left to describe \
               (the suite's fake measures string results only)",
        // No text part stored, so none described.
        reason: "fixed message budget must describe exactly 2 tied parts, got 0",
    },
];

/// The failed cases and verdict reasons, sorted against [`DEVIATIONS`].
pub struct Ledger {
    /// Failed cases that are listed deviations.
    pub listed: Vec<String>,
    /// Failed cases no deviation names.
    pub unlisted: Vec<String>,
    /// Listed deviations that did not fail this run (passed, skipped or absent).
    pub stale: Vec<&'static str>,
    /// Verdict reasons that are no failed case (no real kill, say).
    pub other_reasons: Vec<String>,
}

impl Ledger {
    /// Whether the suite failed for listed deviations alone (or not at all).
    pub fn only_listed(&self) -> bool {
        self.unlisted.is_empty() && self.stale.is_empty() && self.other_reasons.is_empty()
    }

    pub fn line(&self) -> String {
        format!(
            "DEVIATIONS listed={} failed_as_listed={} unlisted_failures={} listed_not_failing={} other_verdict_reasons={}",
            DEVIATIONS.len(),
            self.listed.len(),
            self.unlisted.len(),
            self.stale.len(),
            self.other_reasons.len()
        )
    }
}

pub struct Summary {
    passed: usize,
    failed: Vec<(String, String)>,
    /// Skipped case → the capabilities it misses.
    skipped: Vec<(String, Vec<String>, Option<String>)>,
    not_applicable: usize,
    real_kills: usize,
    /// Passed cases of the `held_calls` group: they pass only where the held-reply marker is
    /// set (the rig sets it; a release build declares no held replies), so they are counted
    /// apart.
    held_calls: usize,
    kills: Vec<String>,
    /// Why the suite's verdict failed, beyond failed cases (e.g. no real kill).
    verdict_reasons: Option<Vec<String>>,
}

pub fn summarize(report: &SuiteReport) -> Summary {
    let mut summary = Summary {
        passed: 0,
        failed: Vec::new(),
        skipped: Vec::new(),
        not_applicable: 0,
        real_kills: report.kills.iter().filter(|k| k.mechanism.is_real_process_kill()).count(),
        held_calls: report
            .cases
            .iter()
            .filter(|c| matches!(c.outcome, CaseOutcome::Passed | CaseOutcome::PassedWithInapplicableRule { .. }))
            // The suite gates them on the described `held_calls` capability, not on a required
            // group, so they are known by their names.
            .filter(|c| c.case.starts_with("held_calls_"))
            .count(),
        kills: report.kills.iter().map(|k| format!("{} by {}", k.point, k.mechanism)).collect(),
        verdict_reasons: match &report.verdict {
            SuiteVerdict::Failed { reasons } => Some(reasons.clone()),
            _ => None,
        },
    };
    for case in &report.cases {
        let names = |missing: &[cortexkit_role_llm_runner_conformance::Capability]| -> Vec<String> {
            missing.iter().map(|c| c.name()).collect()
        };
        match &case.outcome {
            CaseOutcome::Passed | CaseOutcome::PassedWithInapplicableRule { .. } => summary.passed += 1,
            CaseOutcome::Failed { reason } => summary.failed.push((case.case.to_owned(), reason.clone())),
            CaseOutcome::Skipped { missing } => summary.skipped.push((case.case.to_owned(), names(missing), None)),
            CaseOutcome::SkippedWithReason { missing, reason } => {
                summary.skipped.push((case.case.to_owned(), names(missing), Some(reason.clone())))
            }
            CaseOutcome::Inapplicable { .. } => summary.not_applicable += 1,
            // The outcome enum is the suite's; a new kind counts as a failure until named here.
            #[allow(unreachable_patterns)]
            other => {
                summary.failed.push((case.case.to_owned(), format!("an outcome this adapter does not know: {other:?}")))
            }
        }
    }
    summary
}

impl Summary {
    /// The suite's verdict: `Passed`, or conforming for the declared capabilities, both pass;
    /// `Failed` (a failed case, or no real process kill) fails.
    pub fn passed(&self) -> bool {
        self.verdict_reasons.is_none()
    }

    /// The verdict's reasons that are not about one of the failed cases.
    fn other_verdict_reasons(&self) -> Vec<String> {
        let reasons = self.verdict_reasons.iter().flatten();
        reasons.filter(|r| !self.failed.iter().any(|(case, _)| r.starts_with(case.as_str()))).cloned().collect()
    }

    pub fn ledger(&self) -> Ledger {
        // Listed only when it failed for its pinned reason; any other failure of it is unlisted.
        let is_listed =
            |(case, reason): &(String, String)| DEVIATIONS.iter().any(|d| d.case == case && reason.contains(d.reason));
        let (listed, unlisted): (Vec<String>, Vec<String>) = {
            let (listed, unlisted): (Vec<_>, Vec<_>) = self.failed.iter().partition(|f| is_listed(f));
            (
                listed.into_iter().map(|(c, _)| c.clone()).collect(),
                unlisted.into_iter().map(|(c, _)| c.clone()).collect(),
            )
        };
        let stale = DEVIATIONS.iter().map(|d| d.case).filter(|case| !listed.iter().any(|c| c == case)).collect();
        Ledger { listed, unlisted, stale, other_reasons: self.other_verdict_reasons() }
    }

    pub fn line(&self) -> String {
        format!(
            "CONFORMANCE passed={} failed={} skipped={} not_applicable={} real_kills={} held_calls={} verdict={}",
            self.passed,
            self.failed.len(),
            self.skipped.len(),
            self.not_applicable,
            self.real_kills,
            self.held_calls,
            if self.passed() { "passed" } else { "failed" }
        )
    }

    /// Failed cases with their messages, skipped cases grouped by what they miss, the kills.
    pub fn details(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "== failed cases ({})", self.failed.len());
        for (case, reason) in &self.failed {
            let _ = writeln!(out, "FAILED {case}: {reason}");
        }
        let mut by_missing: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for (case, missing, reason) in &self.skipped {
            let mut key = missing.join(" + ");
            if let Some(reason) = reason {
                let _ = write!(key, " ({reason})");
            }
            by_missing.entry(key).or_default().push(case);
        }
        let _ = writeln!(
            out,
            "== skipped cases ({}), by the capabilities they require and broca does not declare",
            self.skipped.len()
        );
        for (missing, cases) in &by_missing {
            let _ = writeln!(out, "SKIPPED missing {missing} ({}): {}", cases.len(), cases.join(", "));
        }
        let _ = writeln!(out, "== kills ({}, {} real)", self.kills.len(), self.real_kills);
        for kill in &self.kills {
            let _ = writeln!(out, "KILL {kill}");
        }
        if self.verdict_reasons.is_some() {
            let _ = writeln!(out, "== the suite's verdict: failed");
            for reason in self.other_verdict_reasons() {
                let _ = writeln!(out, "VERDICT {reason}");
            }
        }
        let ledger = self.ledger();
        let _ = writeln!(out, "== deviations ({} listed)", DEVIATIONS.len());
        for deviation in DEVIATIONS {
            let state = if ledger.listed.iter().any(|c| c == deviation.case) { "failed" } else { "DID NOT FAIL" };
            let _ = writeln!(
                out,
                "DEVIATION {} ({state}): {} [pinned reason: {}]",
                deviation.case, deviation.rule, deviation.reason
            );
        }
        for case in &ledger.unlisted {
            let _ = writeln!(out, "UNLISTED FAILURE {case}");
        }
        out
    }
}
