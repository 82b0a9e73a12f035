//! broca: durable agentic LLM loops. See `README.md` and the house plan for the layers.

pub mod actor;
pub mod agent;
pub mod bus;
pub mod catalog;
pub mod classify;
pub mod clock;
pub mod config;
pub mod failpoint;
pub mod fanout;
pub mod frozen;
pub mod held;
pub mod limits;
pub mod lineage;
pub mod message;
pub mod module;
pub mod op;
pub mod ops;
pub mod owner;
pub mod pool;
pub mod provider;
pub mod record;
pub mod refs;
pub mod replay;
pub mod retention;
pub mod serve;
pub mod session_key;
pub mod state_root;
pub mod store;
pub mod subc;
#[doc(hidden)]
pub mod testkit;
pub mod tools;
pub mod vault;
pub mod wal;
pub mod wire;
