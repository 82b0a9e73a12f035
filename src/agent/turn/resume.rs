//! What a restart resume re-checks before its run goes on (spec "Graceful restart"): its tool
//! routes here; its account where the credential is read (`credential.rs`).

use super::*;

/// How long a restart resume waits for each of its tool providers' routes.
const RESUME_ROUTE_WAIT: Duration = Duration::from_secs(5);

impl<C> Driver<'_, C> {
    /// A restart resume continues only while every tool provider its frozen tools name can be
    /// reached (spec "Graceful restart": "tool routes must be available"): the first that
    /// cannot, and why.
    pub(super) fn tool_routes_missing(&self) -> Option<String> {
        let mut modules: Vec<&str> = self.config.tools.iter().filter_map(|t| t.module.as_deref()).collect();
        modules.sort_unstable();
        modules.dedup();
        let lineage = self.lineage.addr();
        modules.into_iter().find_map(|module| {
            let deadline = Instant::now() + RESUME_ROUTE_WAIT;
            let reached = self.tools.reachable(module, lineage, deadline);
            reached.err().map(|e| format!("tool provider {module:?} is not reachable: {e}"))
        })
    }
}
