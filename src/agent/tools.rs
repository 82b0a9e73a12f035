//! The tool seam. A batch's calls run concurrently on helper threads; results come back over a
//! channel tagged with their planned position, and the loop records them in planned order.

use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver};
use serde_json::{json, Value};

/// One call the model asked for, after its durable intent.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub run_id: String,
    pub tool_call_id: String,
    pub name: String,
    pub arguments: Value,
    /// `<lineage>:<seq of the call's ToolDispatchIntent>`: the call's identity, for
    /// at-most-once on the provider side.
    pub call_key: String,
}

/// A call's result, in the runner's output shape (`{"kind":"text",…}` or `{"kind":"error",…}`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub output: Value,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput { output: json!({"kind": "text", "text": text.into()}), is_error: false }
    }

    pub fn error(message: impl Into<String>) -> ToolOutput {
        ToolOutput { output: json!({"kind": "error", "message": message.into()}), is_error: true }
    }
}

/// Calls tools. `call` blocks; the loop runs it on a helper thread, never on its own.
pub trait ToolDispatcher: Send + Sync {
    fn call(&self, call: &ToolCall) -> ToolOutput;
}

/// The dispatcher of a run with no tool providers: every call is an error result the model can
/// read, and nothing is sent anywhere.
pub struct NoTools;

impl ToolDispatcher for NoTools {
    fn call(&self, call: &ToolCall) -> ToolOutput {
        ToolOutput::error(format!("no tool named {:?} is available in this run", call.name))
    }
}

/// The helper threads tool calls run on (shared by every run in the process).
fn tool_pool() -> &'static crate::pool::Pool {
    static POOL: std::sync::OnceLock<crate::pool::Pool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| crate::pool::Pool::new("broca-tool"))
}

/// Starts every call of a batch; results arrive as `(planned index, output)`.
pub(crate) fn dispatch_batch(
    dispatcher: &Arc<dyn ToolDispatcher>,
    calls: Vec<ToolCall>,
) -> Receiver<(usize, ToolOutput)> {
    let (tx, rx) = unbounded();
    for (index, call) in calls.into_iter().enumerate() {
        let worker_tx = tx.clone();
        let dispatcher = Arc::clone(dispatcher);
        let spawned = tool_pool().run(move || {
            let out = dispatcher.call(&call);
            let _ = worker_tx.send((index, out));
        });
        if let Err(e) = spawned {
            let _ = tx.send((index, ToolOutput::error(format!("the tool call could not be started: {e}"))));
        }
    }
    rx
}
