//! Model providers: wire families, request rendering, SSE parsing, the streamer.
//!
//! Layering: this module never touches the WAL. It turns a frozen render config plus a
//! transcript into request bytes, and response bytes into typed [`event::StreamEvent`]s.

pub mod anthropic;
pub mod client;
mod common;
pub mod config;
pub mod errors;
pub mod event;
pub mod openai_chat;
pub mod openai_responses;
pub mod sse;
pub mod telemetry;

pub use errors::classify_http_error;

use config::RenderConfig;
use event::{Family, StreamDecoder};

use crate::message::Message;

/// A fresh stream decoder for `family`.
pub fn decoder(family: Family) -> Box<dyn StreamDecoder> {
    match family {
        Family::AnthropicMessages => Box::new(anthropic::AnthropicDecoder::new()),
        Family::OpenaiChat => Box::new(openai_chat::ChatDecoder::new()),
        Family::OpenaiResponses => Box::new(openai_responses::ResponsesDecoder::new()),
    }
}

/// The request body for `config.family`: deterministic bytes (same input, same bytes).
pub fn render_request(config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
    match config.family {
        Family::AnthropicMessages => anthropic::render(config, transcript),
        Family::OpenaiChat => openai_chat::render(config, transcript),
        Family::OpenaiResponses => openai_responses::render(config, transcript),
    }
}

#[cfg(test)]
mod tests;
