//! The HTTP face of every failure: an OpenAI-shaped error body
//! `{"error": {"message", "type", "param", "code"}}` with its status, sent
//! either as a whole response or, once a stream has started, as one SSE event.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::WickError;

/// Seconds a client is told to wait when the engine reports its queue full
/// without a better estimate: the queue drains continuously, so a short wait
/// is usually enough.
pub const DEFAULT_RETRY_AFTER_SECS: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error` for the client's mistakes,
    /// `server_error` for ours.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Sent as the `Retry-After` header (seconds).
    pub retry_after: Option<u64>,
}

const INVALID_REQUEST: &str = "invalid_request_error";
const SERVER_ERROR: &str = "server_error";

/// Longest value from a request (a model name, a header) quoted back.
pub const MAX_ECHO_CHARS: usize = 256;
/// Longest error message: messages quote parts of the request (serde's
/// type errors quote the offending value), which may be megabytes.
const MAX_MESSAGE_CHARS: usize = 1024;

/// `s` cut to `max_chars` characters, marked with `…` where it was cut.
pub fn clip(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_string(),
    }
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: clip(&message.into(), MAX_MESSAGE_CHARS),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or a value is out of range; `param`
    /// names the offending field.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            param: param.map(|p| clip(p, MAX_ECHO_CHARS)),
            ..Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message)
        }
    }

    /// 400 for a field wick does not implement, with OpenAI's code
    /// `unsupported_parameter`: refused, never silently ignored.
    pub fn unsupported_parameter(param: &str) -> Self {
        let param = clip(param, MAX_ECHO_CHARS);
        ApiError {
            code: Some("unsupported_parameter".into()),
            ..Self::bad_request(
                format!(
                    "Unsupported parameter: '{param}' is not supported by wick (it refuses \
                     the fields it does not implement rather than ignore them)."
                ),
                Some(&param),
            )
        }
    }

    /// 400 for a field wick implements only for some values, with OpenAI's
    /// code `unsupported_value`; `message` says what it takes.
    pub fn unsupported_value(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            code: Some("unsupported_value".into()),
            ..Self::bad_request(message, Some(param))
        }
    }

    /// 400 with code `context_length_exceeded`, as OpenAI answers; `param` is
    /// `messages` for chat and `prompt` for completions (as OpenAI), or none
    /// when the engine refuses a prompt it was handed.
    pub fn context_length_exceeded(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            code: Some("context_length_exceeded".into()),
            ..Self::bad_request(message, param)
        }
    }

    /// 404 for a `model` other than the one served, worded as OpenAI's.
    pub fn model_not_found(name: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                INVALID_REQUEST,
                format!("The model `{}` does not exist.", clip(name, MAX_ECHO_CHARS)),
            )
        }
    }

    /// 404 for a path no route serves.
    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            "Not found: no endpoint at this path",
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            INVALID_REQUEST,
            "Method not allowed for this endpoint",
        )
    }

    pub fn payload_too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID_REQUEST,
            format!("Request body is larger than the limit of {limit_bytes} bytes"),
        )
    }

    /// 415: request bodies are JSON, declared as such.
    pub fn unsupported_media_type(content_type: Option<&str>) -> Self {
        let got = match content_type {
            Some(t) => format!("got `{}`", clip(t, MAX_ECHO_CHARS)),
            None => "none was given".to_string(),
        };
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_REQUEST,
            format!("Content-Type must be application/json; {got}"),
        )
    }

    /// 415: request bodies are sent uncompressed.
    pub fn unsupported_encoding(coding: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_REQUEST,
            format!(
                "Content-Encoding `{}` is not supported; send the body uncompressed",
                clip(coding, MAX_ECHO_CHARS)
            ),
        )
    }

    /// 408: the client did not send its whole body in time.
    pub fn body_timeout(limit: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            INVALID_REQUEST,
            format!(
                "the request body did not arrive within {} s",
                limit.as_secs_f64()
            ),
        )
    }

    /// 431: the request line and headers exceed the limit.
    pub fn headers_too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            INVALID_REQUEST,
            format!("Request headers are larger than the limit of {limit_bytes} bytes"),
        )
    }

    /// 431: more header fields than wick reads.
    pub fn too_many_headers(limit: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            INVALID_REQUEST,
            format!("Requests may carry at most {limit} header fields"),
        )
    }

    /// 403: the request may not be answered at all (a foreign `Host`).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, INVALID_REQUEST, message)
    }

    /// 401, worded as OpenAI's: `provided` says whether a key was sent at all.
    pub fn unauthorized(provided: bool) -> Self {
        let message = if provided {
            "Incorrect API key provided."
        } else {
            "You didn't provide an API key. You need to provide your API key in an \
             Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        };
        ApiError {
            code: Some("invalid_api_key".into()),
            ..Self::new(StatusCode::UNAUTHORIZED, INVALID_REQUEST, message)
        }
    }

    /// 503 with `Retry-After`: the waiting queue is full (vLLM answers
    /// overload with 503 too; OpenAI's SDKs retry it).
    pub fn queue_full(retry_after_secs: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after_secs),
            ..Self::unavailable(
                "The server is overloaded: too many requests are waiting. Retry later.",
            )
        }
    }

    /// 503 with `Retry-After` while the model loads.
    pub fn loading() -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::unavailable("the model is still loading")
        }
    }

    /// 503 once the server has begun to shut down.
    pub fn shutting_down() -> Self {
        Self::unavailable("the server is shutting down")
    }

    /// 503 while the model loads or the server shuts down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, SERVER_ERROR, message)
    }

    /// The JSON body text, for a `data: …` SSE event after a stream started.
    pub fn sse_data(&self) -> String {
        serde_json::to_string(&self.body()).expect("an error body always serializes")
    }

    fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code.as_deref(),
            },
        }
    }
}

/// `param` and `code` serialize as `null` when unset: OpenAI always sends
/// all four keys, and some clients index them unconditionally.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// An engine error about the request's prompt, told in the words of
    /// the field the client sent it as: OpenAI words a context overflow
    /// differently for chat (`messages`) and completions (`prompt`).
    pub fn for_prompt(e: WickError, param: &str) -> Self {
        let WickError::ContextLengthExceeded {
            max_context: n,
            prompt_tokens: p,
            max_tokens: m,
        } = e
        else {
            return e.into();
        };
        let total = p + m;
        let message = if param == "messages" {
            format!(
                "This model's maximum context length is {n} tokens. However, you requested \
                 {total} tokens ({p} in the messages, {m} in the completion). Please reduce the \
                 length of the messages or completion."
            )
        } else {
            format!(
                "This model's maximum context length is {n} tokens, however you requested \
                 {total} tokens ({p} in your prompt; {m} for the completion). Please reduce your \
                 prompt; or completion length."
            )
        };
        ApiError::context_length_exceeded(message, Some(param))
    }
}

impl From<WickError> for ApiError {
    fn from(e: WickError) -> Self {
        match e {
            WickError::InvalidRequest { message, param } => {
                ApiError::bad_request(message, param.as_deref())
            }
            e @ (WickError::ContextLengthExceeded { .. } | WickError::KvCacheTooSmall(_)) => {
                ApiError::context_length_exceeded(e.to_string(), None)
            }
            WickError::Overloaded(m) => ApiError {
                message: m,
                ..ApiError::queue_full(DEFAULT_RETRY_AFTER_SECS)
            },
            WickError::Unavailable(m) => ApiError::unavailable(m),
            e @ (WickError::Model(_) | WickError::Internal(_)) => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.sse_data(),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    async fn parts(e: ApiError) -> (StatusCode, Option<String>, Value) {
        let response = e.into_response();
        let status = response.status();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let retry = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn bad_request_body_has_all_four_keys() {
        let (status, retry, body) = run(parts(ApiError::bad_request(
            "temperature must be in [0, 2], got 3",
            Some("temperature"),
        )));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(retry, None);
        assert_eq!(
            body,
            json!({"error": {
                "message": "temperature must be in [0, 2], got 3",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": null,
            }})
        );
    }

    #[test]
    fn null_param_and_code_are_present() {
        let (_, _, body) = run(parts(ApiError::internal("boom")));
        let error = body["error"].as_object().unwrap();
        assert_eq!(error.len(), 4);
        assert_eq!(error["param"], Value::Null);
        assert_eq!(error["code"], Value::Null);
        assert_eq!(error["type"], "server_error");
    }

    #[test]
    fn statuses_types_and_codes() {
        let cases = [
            (
                ApiError::context_length_exceeded("too long", Some("messages")),
                400,
                "invalid_request_error",
                Some("context_length_exceeded"),
            ),
            (
                ApiError::model_not_found("gpt-4"),
                404,
                "invalid_request_error",
                Some("model_not_found"),
            ),
            (ApiError::not_found(), 404, "invalid_request_error", None),
            (
                ApiError::method_not_allowed(),
                405,
                "invalid_request_error",
                None,
            ),
            (
                ApiError::payload_too_large(1024),
                413,
                "invalid_request_error",
                None,
            ),
            (ApiError::queue_full(3), 503, "server_error", None),
            (
                ApiError::unsupported_media_type(Some("text/plain")),
                415,
                "invalid_request_error",
                None,
            ),
            (
                ApiError::body_timeout(Duration::from_secs(3)),
                408,
                "invalid_request_error",
                None,
            ),
            (
                ApiError::headers_too_large(100),
                431,
                "invalid_request_error",
                None,
            ),
            (
                ApiError::unauthorized(true),
                401,
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
            (ApiError::unavailable("loading"), 503, "server_error", None),
            (ApiError::internal("boom"), 500, "server_error", None),
        ];
        for (e, status, kind, code) in cases {
            assert_eq!(e.status.as_u16(), status, "{e:?}");
            assert_eq!(e.kind, kind, "{e:?}");
            assert_eq!(e.code.as_deref(), code, "{e:?}");
        }
    }

    #[test]
    fn model_not_found_reads_like_openai() {
        let e = ApiError::model_not_found("gpt-4");
        assert_eq!(e.message, "The model `gpt-4` does not exist.");
        assert_eq!(e.param.as_deref(), Some("model"));
    }

    #[test]
    fn echoed_values_are_clipped() {
        let huge = "m".repeat(8 << 20);
        let e = ApiError::model_not_found(&huge);
        assert!(
            e.message.chars().count() < MAX_ECHO_CHARS + 40,
            "{}",
            e.message.len()
        );
        assert!(
            e.message.starts_with("The model `mmm") && e.message.ends_with("…` does not exist.")
        );
        let e = ApiError::bad_request(format!("invalid type: string {huge:?}"), Some(&huge));
        assert_eq!(e.message.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert_eq!(e.param.unwrap().chars().count(), MAX_ECHO_CHARS + 1);
        let e = ApiError::unsupported_media_type(Some(&huge));
        assert!(e.message.len() < 400);
        // Short values and multi-byte text are left whole or cut on a character.
        assert_eq!(clip("héllo", 10), "héllo");
        assert_eq!(clip("héllo", 2), "hé…");
    }

    #[test]
    fn payload_too_large_names_the_limit() {
        assert!(ApiError::payload_too_large(1024).message.contains("1024"));
    }

    #[test]
    fn queue_full_sends_retry_after() {
        let (status, retry, body) = run(parts(ApiError::queue_full(7)));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry.as_deref(), Some("7"));
        assert_eq!(body["error"]["type"], "server_error");
        let (_, retry, _) = run(parts(ApiError::unavailable("shutting down")));
        assert_eq!(retry, None);
        let (status, retry, _) = run(parts(ApiError::loading()));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            retry.as_deref(),
            Some("1"),
            "clients retry a loading server"
        );
    }

    #[test]
    fn from_wick_error() {
        let e = ApiError::from(WickError::invalid("bad top_p", "top_p".to_string()));
        assert_eq!(e, ApiError::bad_request("bad top_p", Some("top_p")));

        let too_long = || WickError::ContextLengthExceeded {
            max_context: 10,
            prompt_tokens: 6,
            max_tokens: 5,
        };
        let e = ApiError::from(too_long());
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert_eq!(e.param, None);
        assert!(
            e.message
                .contains("11 tokens (6 in the prompt, 5 for the completion)"),
            "{}",
            e.message
        );
        let e = ApiError::for_prompt(too_long(), "messages");
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(
            e.message
                .contains("(6 in the messages, 5 in the completion)"),
            "{}",
            e.message
        );
        let e = ApiError::for_prompt(WickError::invalid("x", "prompt".to_string()), "messages");
        assert_eq!(
            e.param.as_deref(),
            Some("prompt"),
            "other errors keep their own field"
        );

        let e = ApiError::from(WickError::Overloaded("queue full".into()));
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(DEFAULT_RETRY_AFTER_SECS));
        assert_eq!(e.message, "queue full");

        let e = ApiError::from(WickError::Unavailable("shutting down".into()));
        assert_eq!(e, ApiError::unavailable("shutting down"));

        for w in [
            WickError::Model("x".into()),
            WickError::Internal("y".into()),
        ] {
            let e = ApiError::from(w);
            assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(e.kind, "server_error");
        }
    }

    #[test]
    fn sse_data_is_the_body() {
        let e = ApiError::bad_request("nope", None);
        let (_, _, body) = run(parts(e.clone()));
        let event: Value = serde_json::from_str(&e.sse_data()).unwrap();
        assert_eq!(event, body);
        assert!(!e.sse_data().contains('\n'));
    }
}
