//! wick: an OpenAI-compatible LLM inference server on candle.
//!
//! A request's path, by layer:
//! - [`server`]: HTTP, validation into engine types, streaming back;
//! - [`engine`]: the continuous-batching step loop, its scheduler, which
//!   KV blocks each sequence owns, and the runner that flattens a step's
//!   batch;
//! - [`models`]: the architectures, over [`quant`]'s weight kernels and
//!   [`attention`] on the KV pool;
//! - [`kv`]: the KV pool's memory, below the models and attention;
//! - [`sampling`]: each row's next token, under its grammar;
//! - [`text`]: tokens to text and back, chat templates, stops, tool calls.
//!
//! [`load`] finds and opens a model; [`cli`] holds the subcommands other than
//! the server. The engine knows nothing of HTTP: whoever owns the
//! [`engine::Engine`] drives it one `step` at a time.

pub mod attention;
pub mod cli;
pub mod engine;
pub mod error;
pub mod kv;
pub mod launch;
pub mod load;
pub mod media;
pub mod models;
pub mod quant;
pub mod sampling;
pub mod server;
pub mod text;
pub mod vec_math;
