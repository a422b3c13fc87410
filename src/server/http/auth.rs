//! `--api-key`: requests to the API (`/v1/…`, `/tokenize`, `/detokenize`,
//! `/tokenizer_info`) must carry one of the keys, as `Authorization: Bearer
//! KEY` or as `x-api-key: KEY` (how Anthropic's clients send it); `/health`
//! and `/metrics` stay open for probes and scrapers, as in vLLM. The
//! Anthropic endpoints (`/v1/messages…`) refuse in Anthropic's error shape.
//! A request let through carries which key it gave ([`Owner`]), so what
//! one key stores is its own.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::server::error::ApiError;

/// Which API key a request carried: its index among the keys (0 on a
/// server without keys). A handler takes it as an extractor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner(pub usize);

impl<S: Send + Sync> FromRequestParts<S> for Owner {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Owner>().copied().unwrap_or_default())
    }
}

#[derive(Clone)]
pub struct ApiKeys(Arc<Vec<Vec<u8>>>);

impl ApiKeys {
    pub fn new(keys: Vec<String>) -> Self {
        ApiKeys(Arc::new(keys.into_iter().map(String::into_bytes).collect()))
    }

    /// Which of the keys `given` is. Every key is compared, each in
    /// constant time, so the timing tells nothing about which bytes matched,
    /// nor which key.
    fn find(&self, given: &[u8]) -> Option<Owner> {
        let none = u64::MAX;
        let found = self.0.iter().enumerate().fold(none, |found, (i, key)| {
            u64::conditional_select(&found, &(i as u64), key.as_slice().ct_eq(given))
        });
        (found != none).then_some(Owner(found as usize))
    }
}

fn is_protected(path: &str) -> bool {
    path.starts_with("/v1/")
        || ["/v1", "/tokenize", "/detokenize", "/tokenizer_info"].contains(&path)
}

pub async fn require_api_key(
    State(keys): State<ApiKeys>,
    mut req: Request,
    next: Next,
) -> Response {
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
    // Both are checked: the time taken tells nothing.
    let (by_bearer, by_header) = (
        bearer.and_then(|k| keys.find(k)),
        x_api_key.and_then(|k| keys.find(k)),
    );
    let provided = bearer.is_some() || x_api_key.is_some();
    if let Some(owner) = by_bearer.or(by_header) {
        req.extensions_mut().insert(owner);
        return next.run(req).await;
    }
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

/// The 401 as Anthropic answers it (`anthropic::error::error_body`'s shape).
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
        assert_eq!(keys.find(b"sk-one"), Some(Owner(0)));
        assert_eq!(keys.find(b"sk-two"), Some(Owner(1)));
        for wrong in [
            &b""[..],
            b"sk-on",
            b"sk-one ",
            b"sk-onf",
            b"SK-ONE",
            b"sk-three",
        ] {
            assert_eq!(keys.find(wrong), None, "{wrong:?}");
        }
        assert_eq!(ApiKeys::new(Vec::new()).find(b""), None);
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
