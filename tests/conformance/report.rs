//! The counts, the `CONFORMANCE` line and the list of what to fix, taken from the suite's own
//! report (its outcomes, kill ledger and verdict), never recomputed from anything else.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cortexkit_role_llm_runner_conformance::{CaseOutcome, SuiteReport, SuiteVerdict};

pub struct Summary {
    passed: usize,
    failed: Vec<(String, String)>,
    /// Skipped case → the capabilities it misses.
    skipped: Vec<(String, Vec<String>, Option<String>)>,
    not_applicable: usize,
    real_kills: usize,
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

    pub fn line(&self) -> String {
        format!(
            "CONFORMANCE passed={} failed={} skipped={} not_applicable={} real_kills={} verdict={}",
            self.passed,
            self.failed.len(),
            self.skipped.len(),
            self.not_applicable,
            self.real_kills,
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
        if let Some(reasons) = &self.verdict_reasons {
            let _ = writeln!(out, "== the suite's verdict: failed");
            for reason in reasons.iter().filter(|r| !self.failed.iter().any(|(case, _)| r.starts_with(case.as_str()))) {
                let _ = writeln!(out, "VERDICT {reason}");
            }
        }
        out
    }
}
