//! Finding a model and opening it: the default model's fetch, the hub
//! cache, GGUF files and Hugging Face checkpoint directories.

pub mod gguf_header;
pub mod gguf_split;
pub mod hf_dir;
pub mod hub;
pub mod load_progress;
pub mod loader;
pub mod mmproj;
pub mod model_fetch;
