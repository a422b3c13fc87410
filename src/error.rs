//! The one error type of the engine; the server maps it once to an HTTP status
//! and once to an SSE error event.

use thiserror::Error;

/// What a caught panic says: its message, for the log or the error it
/// becomes.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

#[derive(Debug, Error)]
pub enum WickError {
    /// The request itself is wrong (bad parameter, token out of vocabulary...).
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    /// Prompt plus max_tokens do not fit the model's context.
    #[error(
        "This model's maximum context length is {max_context} tokens. However, you requested \
         {} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion).",
        prompt_tokens + max_tokens
    )]
    ContextLengthExceeded {
        max_context: usize,
        prompt_tokens: usize,
        max_tokens: usize,
    },
    /// The KV pool could not hold the request even with nothing else running.
    #[error("{0}")]
    KvCacheTooSmall(String),
    /// The waiting queue is full; the client should retry later.
    #[error("{0}")]
    Overloaded(String),
    /// Not serving right now (loading, or shutting down).
    #[error("{0}")]
    Unavailable(String),
    /// Loading or fetching a model failed.
    #[error("model error: {0}")]
    Model(String),
    /// A failure inside the engine while running a step.
    #[error("internal error: {0}")]
    Internal(String),
}

impl WickError {
    pub fn invalid(message: impl Into<String>, param: impl Into<Option<String>>) -> Self {
        WickError::InvalidRequest {
            message: message.into(),
            param: param.into(),
        }
    }
}

impl From<candle_core::Error> for WickError {
    fn from(e: candle_core::Error) -> Self {
        WickError::Internal(e.to_string())
    }
}

impl From<anyhow::Error> for WickError {
    fn from(e: anyhow::Error) -> Self {
        WickError::Internal(format!("{e:#}"))
    }
}

pub type Result<T> = std::result::Result<T, WickError>;
