//! The OpenAI-compatible HTTP front end over the engine.

pub mod anthropic;
pub mod app;
pub mod chat_messages;
pub mod config;
pub mod engine_loop;
pub mod error;
pub mod generation;
pub mod handlers;
pub mod http;
pub mod images;
pub mod legacy_functions;
pub mod metrics;
pub mod openai;
pub mod openapi;
pub mod protocol;
#[cfg(test)]
mod render_parity;
pub mod reply;
pub mod respond;
pub mod state;
pub mod tools;
pub mod unsupported;
pub mod validation;
pub mod webui;

pub use app::serve;
pub use state::{AppState, ModelState};
