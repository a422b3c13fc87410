//! `--api-key`: requests to the API (`/v1/…`, `/tokenize`, `/detokenize`,
//! `/tokenizer_info`) must carry one of the keys, as `Authorization: Bearer
//! KEY` or as `x-api-key: KEY` (how Anthropic's clients send it); `/health`
//! and `/metrics` stay open for probes and scrapers, as in vLLM. The
//! Anthropic endpoints (`/v1/messages…`) refuse in Anthropic's error shape.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;

#[derive(Clone)]
pub struct ApiKeys(Arc<Vec<Vec<u8>>>);

impl ApiKeys {
    pub fn new(keys: Vec<String>) -> Self {
        ApiKeys(Arc::new(keys.into_iter().map(String::into_bytes).collect()))
    }

    /// Whether `given` is one of the keys. Every key is compared, each in
    /// constant time, so the timing tells nothing about which bytes matched.
    fn accepts(&self, given: &[u8]) -> bool {
        self.0.iter().fold(false, |found, key| {
            found | bool::from(key.as_slice().ct_eq(given))
        })
    }
}

fn is_protected(path: &str) -> bool {
    path.starts_with("/v1/")
        || ["/v1", "/tokenize", "/detokenize", "/tokenizer_info"].contains(&path)
}

pub async fn require_api_key(State(keys): State<ApiKeys>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if !is_protected(path) {
        return next.run(req).await;
    }
    // The scheme is case-insensitive (RFC 7235): `bearer KEY` counts.
    let bearer = req.headers().get(header::AUTHORIZATION).map(|v| {
        let v = v.as_bytes();
        match v.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &v[7..],
            _ => b"",
        }
    });
    let x_api_key = req.headers().get("x-api-key").map(|v| v.as_bytes());
    // Both are checked (`|`, not `||`): the time taken tells nothing.
    let accepted =
        bearer.is_some_and(|k| keys.accepts(k)) | x_api_key.is_some_and(|k| keys.accepts(k));
    if accepted {
        return next.run(req).await;
    }
    let provided = bearer.is_some() || x_api_key.is_some();
    let mut response = if is_anthropic(path) {
        anthropic_unauthorized(provided)
    } else {
        ApiError::unauthorized(provided).into_response()
    };
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// `/v1/messages` and `/v1/messages/count_tokens`: Anthropic's API.
fn is_anthropic(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// The 401 as Anthropic answers it (`messages::error_body`'s shape).
fn anthropic_unauthorized(provided: bool) -> Response {
    let message = if provided {
        "invalid x-api-key"
    } else {
        "no API key: send it as the x-api-key header (or as Authorization: Bearer KEY)"
    };
    let body = serde_json::json!({"type": "error",
                                  "error": {"type": "authentication_error", "message": message}});
    (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let keys = ApiKeys::new(vec!["sk-one".into(), "sk-two".into()]);
        assert!(keys.accepts(b"sk-one"));
        assert!(keys.accepts(b"sk-two"));
        for wrong in [
            &b""[..],
            b"sk-on",
            b"sk-one ",
            b"sk-onf",
            b"SK-ONE",
            b"sk-three",
        ] {
            assert!(!keys.accepts(wrong), "{wrong:?}");
        }
        assert!(!ApiKeys::new(Vec::new()).accepts(b""));
    }

    #[test]
    fn the_api_is_protected_and_probes_are_not() {
        for path in [
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/models",
            "/v1/models/HuggingFaceTB/SmolLM2",
            "/v1",
            "/tokenize",
            "/detokenize",
            "/tokenizer_info",
        ] {
            assert!(is_protected(path), "{path}");
        }
        for path in ["/health", "/metrics", "/v1x", "/tokenizer"] {
            assert!(!is_protected(path), "{path}");
        }
        assert!(is_protected("/v1/messages") && is_anthropic("/v1/messages"));
        assert!(is_anthropic("/v1/messages/count_tokens"));
        assert!(!is_anthropic("/v1/messagesx") && !is_anthropic("/v1/chat/completions"));
    }
}
