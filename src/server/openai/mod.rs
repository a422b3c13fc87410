//! OpenAI's API: chat completions, completions, embeddings and Responses.
//! Its wire schema (`server::protocol`) stays with validation, whose input
//! it is for every API.

pub mod chat;
pub mod chunks;
pub mod completions;
pub mod embeddings;
pub mod responses;
