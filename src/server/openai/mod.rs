//! OpenAI's API: chat completions, completions, embeddings and
//! Responses, with its wire schema.

pub mod chat;
pub mod chat_messages;
pub mod completions;
pub mod embeddings;
pub mod legacy_functions;
pub mod protocol;
pub mod responses;
