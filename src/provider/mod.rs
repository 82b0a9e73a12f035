//! Model providers: wire families, request rendering, SSE parsing, the streamer.
//!
//! Layering: this module never touches the WAL. It turns a frozen render config plus a
//! transcript into request bytes, and response bytes into typed [`event::StreamEvent`]s.

pub mod anthropic;
pub mod auth;
pub mod bedrock;
pub mod cache;
mod chat_chunk;
pub mod client;
pub mod code_assist;
mod common;
/// The frozen config as the providers render it (it lives in the records layer, `crate::frozen`).
pub mod config {
    pub use crate::frozen::{AuthSource, FrozenConfig as RenderConfig, RunPolicy, ToolSpec};
}
pub mod errors;
pub mod event;
pub mod eventstream;
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;
pub mod ratelimit;
pub mod render_cache;
pub mod render_context;
pub mod scripted;
pub mod sigv4;
pub mod sse;
pub mod telemetry;
pub mod tier;
mod tls;
pub mod warm;
pub mod wire;

pub(crate) use common::tool_output;
pub use errors::classify_http_error;

pub use wire::{wire, WireFamily};

/// The request body for `config.family`: deterministic bytes (same input, same bytes).
pub fn render_request(config: &config::RenderConfig, transcript: &[crate::message::Message]) -> Vec<u8> {
    wire(config.family).render(config, transcript)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_render;
#[cfg(test)]
mod tests_rules;
