//! wick: an OpenAI-compatible LLM inference server on candle.
//!
//! The engine half (this crate's library) knows nothing of HTTP: a model, a
//! paged KV cache, a scheduler and per-request samplers, driven one `step` at a
//! time by whoever owns the [`engine::Engine`].

pub mod attention;
pub mod cli;
pub mod engine;
pub mod error;
pub mod load;
pub mod models;
pub mod quant;
pub mod sampling;
pub mod server;
pub mod text;
pub mod vec_math;
