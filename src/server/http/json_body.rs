//! The one way a handler takes a request body: `Content-Type:
//! application/json` or 415 (a `text/plain` body is what a cross-origin page
//! can send without a CORS preflight), the whole body within the client
//! timeout or 408 (or 503 at once if the server starts shutting down
//! meanwhile), at most `--max-body-bytes` or 413, then JSON parsed with
//! field-named errors; a large body on the blocking pool, since parsing
//! megabytes would hold an async worker (and every connection on it).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

use crate::server::error::ApiError;
use crate::server::validation::parse_json;
use crate::server::AppState;

pub struct JsonBody<T>(pub T);

/// Bodies parsed on the async worker: well under a millisecond of work.
const INLINE_PARSE_BYTES: usize = 64 << 10;

impl<T: DeserializeOwned + Send + 'static> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if !content_type.as_deref().is_some_and(is_json) {
            return Err(ApiError::unsupported_media_type(content_type.as_deref()));
        }
        // A compressed body would otherwise be parsed as plain text.
        if let Some(coding) = req.headers().get(header::CONTENT_ENCODING) {
            let coding = String::from_utf8_lossy(coding.as_bytes());
            if !coding.trim().eq_ignore_ascii_case("identity") {
                return Err(ApiError::unsupported_encoding(&coding));
            }
        }
        let limits = &state.limits;
        let read = tokio::time::timeout(limits.client_timeout, Bytes::from_request(req, state));
        // A request still arriving at shutdown would be refused once read:
        // refuse it now rather than hold the exit for its body.
        let mut stopping = state.shutting_down.subscribe();
        let read = tokio::select! {
            read = read => read,
            _ = stopping.wait_for(|&stop| stop) => return Err(ApiError::shutting_down()),
        };
        let body = read
            .map_err(|_| ApiError::body_timeout(limits.client_timeout))?
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::payload_too_large(limits.max_body_bytes),
                _ => ApiError::bad_request(e.body_text(), None),
            })?;
        if body.len() <= INLINE_PARSE_BYTES {
            return parse_json(&body).map(JsonBody);
        }
        tokio::task::spawn_blocking(move || parse_json(&body).map(JsonBody))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
    }
}

/// `application/json`, with or without parameters such as `charset`.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use super::is_json;

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert!(!is_json(bad), "{bad}");
        }
    }
}
