//! The OpenAI-compatible HTTP front end over the engine.

pub mod app;
pub mod choice;
pub mod config;
pub mod engine_loop;
pub mod error;
pub mod generation;
pub mod handlers;
pub mod metrics;
pub mod protocol;
pub mod validation;

pub use app::{serve, AppState, ModelState};
