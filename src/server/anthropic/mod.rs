//! Anthropic's Messages API.

pub mod error;
pub mod messages;
pub mod messages_stream;
