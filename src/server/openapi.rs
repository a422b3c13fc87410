//! `GET /openapi.json`: an OpenAPI 3.1 document of every route. The bodies'
//! schemas are generated (utoipa's derives) from the very types the
//! handlers deserialize requests into and serialize replies from, so they
//! cannot drift from what the server does; the routes are listed here, one
//! row each, beside the router's table in `app.rs`. `tests/openapi.rs`
//! sends real requests to every route and checks them and the replies
//! against the document with standard validators.

use serde_json::{json, Value};
use utoipa::OpenApi;

use crate::server::anthropic::messages::{CountTokensRequest, MessagesRequest};
use crate::server::anthropic::messages_stream::{MessageBody, StreamEvent as MessagesEvent};
use crate::server::error::ErrorBody;
use crate::server::openai::embeddings::{EmbeddingRequest, EmbeddingResponse};
use crate::server::openai::responses::events::{ResponseObject, StreamEvent as ResponsesEvent};
use crate::server::openai::responses::ResponsesRequest;
use crate::server::protocol::{
    ChatChoice, ChatCompletionRequest, ChunkChoice, CompletionChoice, CompletionRequest,
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, Response, TokenizeRequest,
    TokenizeResponse, TokenizerInfo,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "wick",
        description = "An OpenAI-compatible LLM inference server (with Anthropic's Messages API). \
                       Every route and field is described in docs/api.md.",
    ),
    components(schemas(
        CompletionRequest,
        Response<CompletionChoice>,
        ChatCompletionRequest,
        Response<ChatChoice>,
        Response<ChunkChoice>,
        EmbeddingRequest,
        EmbeddingResponse,
        ResponsesRequest,
        ResponseObject,
        ResponsesEvent,
        MessagesRequest,
        CountTokensRequest,
        MessageBody,
        MessagesEvent,
        ModelList,
        ModelCard,
        TokenizerInfo,
        TokenizeRequest,
        TokenizeResponse,
        DetokenizeRequest,
        DetokenizeResponse,
        ErrorBody,
    ))
)]
struct Schemas;

/// What a route answers with status 200.
enum Reply {
    /// JSON of a component schema; with a stream, `text/event-stream`
    /// whose `data:` lines are JSON of the second.
    Json(&'static str, Option<&'static str>),
    /// JSON of an inline schema.
    Inline(fn() -> Value),
    /// Text of a media type.
    Text(&'static str),
}

/// One row per route: method, path, summary, request body schema, reply,
/// and whether it answers errors in Anthropic's shape.
struct Route {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    body: Option<&'static str>,
    reply: Reply,
    anthropic: bool,
}

const fn route(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    body: Option<&'static str>,
    reply: Reply,
) -> Route {
    Route {
        method,
        path,
        summary,
        body,
        reply,
        anthropic: false,
    }
}

const COMPLETION: &str = "Response_CompletionChoice";
const CHAT: &str = "Response_ChatChoice";
const CHUNK: &str = "Response_ChunkChoice";

/// Every route the router serves (the chat page's files and this document
/// included), in the router's order.
fn routes() -> Vec<Route> {
    use Reply::*;
    let mut messages = route(
        "post",
        "/v1/messages",
        "Anthropic's Messages API over the chat path",
        Some("MessagesRequest"),
        Json("MessageBody", Some("MessageStreamEvent")),
    );
    messages.anthropic = true;
    let mut count = route(
        "post",
        "/v1/messages/count_tokens",
        "The prompt a Messages request would run, in tokens",
        Some("CountTokensRequest"),
        Inline(|| {
            json!({"type": "object", "required": ["input_tokens"],
                         "properties": {"input_tokens": {"type": "integer", "minimum": 0}}})
        }),
    );
    count.anthropic = true;
    vec![
        route(
            "post",
            "/v1/completions",
            "Text completion of a raw prompt",
            Some("CompletionRequest"),
            Json(COMPLETION, Some(COMPLETION)),
        ),
        route(
            "post",
            "/v1/chat/completions",
            "Chat completion through the model's chat template",
            Some("ChatCompletionRequest"),
            Json(CHAT, Some(CHUNK)),
        ),
        route(
            "post",
            "/v1/embeddings",
            "One L2-normalised vector per input",
            Some("EmbeddingRequest"),
            Json("EmbeddingResponse", None),
        ),
        route(
            "post",
            "/v1/responses",
            "OpenAI's Responses API over the chat path",
            Some("ResponsesRequest"),
            Json("ResponseObject", Some("ResponseStreamEvent")),
        ),
        route(
            "get",
            "/v1/responses/{id}",
            "A kept response",
            None,
            Json("ResponseObject", None),
        ),
        route(
            "delete",
            "/v1/responses/{id}",
            "Forget a kept response",
            None,
            Inline(|| {
                json!({"type": "object", "required": ["id", "object", "deleted"], "properties": {
                    "id": {"type": "string"},
                    "object": {"const": "response.deleted"},
                    "deleted": {"type": "boolean"}}})
            }),
        ),
        messages,
        count,
        route(
            "get",
            "/v1/models",
            "One model card per served name",
            None,
            Json("ModelList", None),
        ),
        route(
            "get",
            "/v1/models/{id}",
            "One served name's card",
            None,
            Json("ModelCard", None),
        ),
        route(
            "get",
            "/tokenizer_info",
            "The tokenizer's settings",
            None,
            Json("TokenizerInfo", None),
        ),
        route(
            "get",
            "/health",
            "200 once the model is loaded; 503 before and during shutdown",
            None,
            Text("text/plain"),
        ),
        route(
            "get",
            "/metrics",
            "Prometheus metrics",
            None,
            Text("text/plain"),
        ),
        route(
            "post",
            "/tokenize",
            "Text to token ids",
            Some("TokenizeRequest"),
            Json("TokenizeResponse", None),
        ),
        route(
            "post",
            "/detokenize",
            "Token ids to text",
            Some("DetokenizeRequest"),
            Json("DetokenizeResponse", None),
        ),
        route(
            "get",
            "/openapi.json",
            "This document",
            None,
            Inline(|| json!({"type": "object"})),
        ),
        route(
            "get",
            "/",
            "The chat page (absent with --no-webui)",
            None,
            Text("text/html"),
        ),
    ]
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The document, built once per server.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(Schemas::openapi()).expect("a serializable document");
    doc["openapi"] = json!("3.1.0");
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    doc["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "With --api-key: the key; Anthropic clients may send it as x-api-key"}
    });
    let mut paths = serde_json::Map::new();
    for r in routes() {
        let error = match r.anthropic {
            true => json!({"type": "object", "required": ["type", "error"], "properties": {
                "type": {"const": "error"},
                "error": {"type": "object", "required": ["type", "message"], "properties": {
                    "type": {"type": "string"}, "message": {"type": "string"}}}}}),
            false => schema_ref("ErrorBody"),
        };
        let ok = match r.reply {
            Reply::Json(name, stream) => {
                let mut content = json!({"application/json": {"schema": schema_ref(name)}});
                if let Some(event) = stream {
                    content["text/event-stream"] = json!({
                        "schema": {"description": format!("Server-sent events (`\"stream\": \
                                       true`): each `data:` line is JSON of {event}")},
                        "x-wick-event": schema_ref(event),
                    });
                }
                content
            }
            Reply::Inline(schema) => json!({"application/json": {"schema": schema()}}),
            Reply::Text(media) => json!({media: {"schema": {"type": "string"}}}),
        };
        let mut op = json!({
            "summary": r.summary,
            "responses": {
                "200": {"description": "OK", "content": ok},
                "default": {"description": "An error, in the API's own shape",
                            "content": {"application/json": {"schema": error}}},
            },
        });
        if let Some(body) = r.body {
            op["requestBody"] = json!({"required": true,
                "content": {"application/json": {"schema": schema_ref(body)}}});
        }
        if r.path.contains("{id}") {
            op["parameters"] = json!([{"name": "id", "in": "path", "required": true,
                                       "schema": {"type": "string"}}]);
        }
        if r.path.starts_with("/v1/") || r.path.ends_with("tokenize") || r.path == "/tokenizer_info"
        {
            op["security"] = json!([{"bearer": []}, {}]);
        }
        let item = paths.entry(r.path).or_insert_with(|| json!({}));
        item[r.method] = op;
    }
    doc["paths"] = Value::Object(paths);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` in the document names a schema it holds.
    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let mut refs = 0;
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(schemas.contains_key(name), "{name} is not in the document");
            refs += 1;
        }
        assert!(refs > 30, "{refs}");
        for name in [
            COMPLETION,
            CHAT,
            CHUNK,
            "MessageStreamEvent",
            "ResponseStreamEvent",
        ] {
            assert!(schemas.contains_key(name), "{name}");
        }
    }
}
