//! The OpenAI-compatible HTTP front end over the engine.

pub mod access;
pub mod app;
pub mod auth;
pub mod body_guard;
pub mod chat;
pub mod chat_messages;
pub mod completions;
pub mod config;
pub mod embeddings;
pub mod engine_loop;
pub mod error;
pub mod generation;
pub mod handlers;
pub mod host_check;
pub mod json_body;
pub mod legacy_functions;
pub mod listener;
pub mod messages;
pub mod messages_stream;
pub mod metrics;
pub mod protocol;
pub mod respond;
pub mod responses;
pub mod responses_store;
pub mod responses_stream;
pub mod tools;
pub mod unsupported;
pub mod validation;

pub use app::{serve, AppState, ModelState};
