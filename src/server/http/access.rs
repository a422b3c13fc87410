//! The access log: one line per request, written when its response body is
//! dropped (sent in full, or the client went away), with the request id,
//! status, token counts, time to first token and total time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use tower_http::request_id::{MakeRequestId, MakeRequestUuid};

use crate::server::http::body_guard::{guard_body, BodyEnd};

/// Longest request id wick repeats back in a response body or a log line.
const MAX_REQUEST_ID_CHARS: usize = 128;

/// The client's `X-Request-Id` (set to a fresh UUID by the request-id layer
/// when it sent none), clipped, and with every character but letters,
/// digits and `-_.:` made `_`: it is echoed into every response id and log
/// line, where a space or `=` would forge fields.
pub fn request_id(headers: &HeaderMap) -> String {
    let id: String = headers
        .get("x-request-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
        .chars()
        .take(MAX_REQUEST_ID_CHARS)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' | ':' => c,
            _ => '_',
        })
        .collect();
    id
}

/// Middleware, between the layer that gives a request its id and the one
/// that echoes it: the `X-Request-Id` becomes [`request_id`]'s form, so
/// the echoed header, the log line and the response's id agree. An id
/// with nothing left of it gets a fresh one.
pub async fn sanitize_request_id(mut req: Request, next: Next) -> Response {
    let id = request_id(req.headers());
    let value = match HeaderValue::from_str(&id) {
        Ok(v) if !id.is_empty() => Some(v),
        _ => MakeRequestUuid
            .make_request_id(&req)
            .map(|id| id.header_value().clone()),
    };
    if let Some(v) = value {
        req.headers_mut().insert("x-request-id", v);
    }
    next.run(req).await
}

/// What a handler learns about a request that the access line reports.
#[derive(Clone, Default)]
pub struct AccessRecord(Arc<Mutex<AccessFields>>);

#[derive(Default, Clone, Copy)]
struct AccessFields {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    ttft: Option<Duration>,
}

impl AccessRecord {
    fn update(&self, f: impl FnOnce(&mut AccessFields)) {
        // A poisoned lock only means a panic elsewhere mid-update: the
        // counts are still worth logging.
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn set_tokens(&self, prompt: usize, completion: usize) {
        self.update(|a| {
            a.prompt_tokens = Some(prompt as u64);
            a.completion_tokens = Some(completion as u64);
        });
    }

    pub fn set_ttft(&self, ttft: Duration) {
        self.update(|a| {
            a.ttft.get_or_insert(ttft);
        });
    }

    fn fields(&self) -> AccessFields {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Middleware: hands the handler an [`AccessRecord`] and logs the line once
/// the response body is gone (or the request was dropped before it had one).
pub async fn log_access(mut req: Request, next: Next) -> Response {
    let mut line = AccessLine {
        start: Instant::now(),
        request_id: request_id(req.headers()),
        method: req.method().to_string(),
        path: crate::server::error::clip(req.uri().path(), MAX_REQUEST_ID_CHARS),
        status: None,
        record: AccessRecord::default(),
        complete: false,
    };
    req.extensions_mut().insert(line.record.clone());
    let response = next.run(req).await;
    line.status = Some(response.status().as_u16());
    response.map(|body| guard_body(body, line))
}

/// Milliseconds to the microsecond.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

struct AccessLine {
    start: Instant,
    request_id: String,
    method: String,
    path: String,
    /// None if the client left before there was a response.
    status: Option<u16>,
    record: AccessRecord,
    /// The body was sent to its end (not cut off by a disconnect).
    complete: bool,
}

impl BodyEnd for AccessLine {
    fn body_dropped(&mut self, complete: bool) {
        self.complete = complete;
    }
}

impl Drop for AccessLine {
    fn drop(&mut self) {
        let f = self.record.fields();
        tracing::info!(
            target: "wick::access",
            request_id = %self.request_id,
            method = %self.method,
            path = %self.path,
            status = self.status,
            prompt_tokens = f.prompt_tokens,
            completion_tokens = f.completion_tokens,
            ttft_ms = f.ttft.map(millis),
            total_ms = millis(self.start.elapsed()),
            complete = self.complete,
        );
    }
}
