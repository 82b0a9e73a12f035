//! The wire side of broca's scripted model providers: what a lane is scripted to answer
//! ([`script`]), each of the seven wire families' stream for it ([`render`]: Anthropic Messages,
//! OpenAI Chat Completions, OpenAI Responses, Gemini, Google Code Assist, Bedrock Converse's AWS
//! event stream, and the Codex backend), and the provider-side prompt cache the usage figures
//! come from ([`prompt_cache`]). No I/O: the server that speaks these is `broca-mock-model`
//! (`mock/model`), which documents the script format and re-exports these modules.

pub mod prompt_cache;
pub mod render;
pub mod rules;
pub mod script;
