//! Errors in Anthropic's shape, before a stream starts and within one.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::server::error::ApiError;

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`; the message starts
/// with the field at fault when it does not name it already.
pub fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}
