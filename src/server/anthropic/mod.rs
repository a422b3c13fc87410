//! Anthropic's Messages API.

pub mod messages;
pub mod messages_stream;
