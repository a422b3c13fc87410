//! `--api-key`: requests to the API (`/v1/…`, `/tokenize`, `/detokenize`,
//! `/tokenizer_info`) must carry `Authorization: Bearer KEY` with one of the
//! keys; `/health` and `/metrics` stay open for probes and scrapers, as in
//! vLLM.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
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
    if !is_protected(req.uri().path()) {
        return next.run(req).await;
    }
    // The scheme is case-insensitive (RFC 7235): `bearer KEY` counts.
    let given = req.headers().get(header::AUTHORIZATION).map(|v| {
        let v = v.as_bytes();
        match v.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &v[7..],
            _ => b"",
        }
    });
    match given {
        Some(key) if keys.accepts(key) => next.run(req).await,
        _ => {
            let mut response = ApiError::unauthorized(given.is_some()).into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
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
    }
}
