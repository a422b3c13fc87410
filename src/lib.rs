//! wick: an OpenAI-compatible LLM inference server on candle.
//!
//! The engine half (this crate's library) knows nothing of HTTP: a model, a
//! paged KV cache, a scheduler and per-request samplers, driven one `step` at a
//! time by whoever owns the [`engine::Engine`].

pub mod attention;
pub mod bench;
pub mod block_manager;
pub mod chat_template;
pub mod cli;
pub mod constraint;
pub mod detokenizer;
pub mod engine;
pub mod error;
pub mod export_hf;
pub mod generate;
pub mod gguf_header;
pub mod hf_dir;
pub mod hub;
pub mod kv_cache;
pub mod loader;
pub mod mask_budget;
pub mod model_fetch;
pub mod model_runner;
pub mod models;
pub mod output;
pub mod quant;
pub mod request_rules;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod stop;
pub mod text_stream;
pub mod tokenizer;
pub mod tool_parser;
pub mod vec_math;
