//! Record builders shared by broca's tests, property checks and benchmarks, and the raw-fsync
//! anchor the benchmarks read their figures against. Not part of the engine: broca depends on
//! this package only as a dev-dependency (issue #45).
//!
//! [`records.rs`](records) names broca's types as `crate::message` and `crate::record`, so the
//! same file also compiles inside broca, where its own unit tests include it by path
//! (`src/replay/tests.rs`); here those two paths are broca's modules, imported at the root.

// Read by `records.rs` as `crate::message` and `crate::record`.
use broca::{message, record};

mod records;

pub use records::*;

#[cfg(test)]
mod tests {
    use super::*;
    use broca::message::Part;
    use broca::record::Record;

    #[test]
    fn a_model_step_calls_the_tools_it_names() {
        let Record::ModelStepFinished { finish_reason, message, .. } =
            model_step("run-1", 1, "calling", &[("c1", "read"), ("c2", "write")])
        else {
            panic!("not a model step")
        };
        assert_eq!(finish_reason, "tool_calls");
        let calls: Vec<(&str, &str)> = message
            .content
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall { tool_call_id, tool_name, .. } => Some((tool_call_id.as_str(), tool_name.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(calls, [("c1", "read"), ("c2", "write")]);
        let Record::ModelStepFinished { finish_reason, .. } = model_step("run-1", 2, "done", &[]) else {
            unreachable!()
        };
        assert_eq!(finish_reason, "stop");
    }

    #[test]
    fn the_records_survive_json() {
        let records = [
            run_started("run-1", Some("sub-1"), "hi"),
            step_started("run-1", 1),
            model_step("run-1", 1, "calling", &[("c1", "read")]),
            intent("run-1", 1, "c1", "read"),
            tool_result("run-1", 1, "c1", "read it"),
        ];
        for record in records {
            let text = serde_json::to_string(&record).unwrap();
            let back: Record = serde_json::from_str(&text).unwrap();
            assert_eq!(back, record, "{text}");
        }
    }

    #[test]
    fn the_raw_fsync_anchor_is_measured_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let p50 = raw_fsync_p50_us(dir.path(), 3);
        assert!(p50.is_finite() && p50 > 0.0, "{p50}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
