//! Model providers: wire families, request rendering, SSE parsing, the streamer.
//!
//! Layering: this module never touches the WAL. It turns a frozen render config plus a
//! transcript into request bytes, and response bytes into typed [`event::StreamEvent`]s.

pub mod config;
pub mod event;
pub mod sse;
