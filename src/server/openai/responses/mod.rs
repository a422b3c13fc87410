//! `POST /v1/responses`, OpenAI's Responses API, and `GET`/`DELETE
//! /v1/responses/{id}` for the responses it keeps.
//!
//! A translation layer over chat completions, as vLLM serves it for models
//! without their own Responses format: the request becomes a chat request
//! (`instructions` a system message, `message` items messages,
//! `function_call` items an assistant turn's tool calls,
//! `function_call_output` items tool messages, `reasoning` items an
//! assistant turn's thinking, `text.format` the `response_format`, function
//! `tools` chat's, `max_output_tokens` `max_tokens`), which runs through the
//! very validation and generation path `/v1/chat/completions` does;
//! `responses_stream` turns its deltas into output items and events.
//!
//! A field wick cannot honour (built-in tools, `background`, image inputs,
//! reasoning summaries, `truncation: "auto"`, …) is refused with a 400
//! naming it; fields that change no output (`metadata`, `user`,
//! `safety_identifier`, `prompt_cache_key`, `store`, …) are accepted and
//! echoed. Kept responses live in `responses_store`, in memory.

pub mod events;
pub mod store;
pub mod stream;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::server::error::{clip, ApiError, MAX_ECHO_CHARS};
use crate::server::generation;
use crate::server::http::access::AccessRecord;
use crate::server::http::auth::Owner;
use crate::server::http::json_body::JsonBody;
use crate::server::openai::responses::store::{ResponseStore, Stored};
use crate::server::openai::responses::stream::{new_id, OnDone, ResponseBuilder};
use crate::server::protocol::{
    ChatCompletionRequest, ChatRequestMessage, ContentPart as ChatPart, FieldNames,
    FunctionArguments, FunctionDefinition, JsonSchemaFormat, MessageContent, Metadata,
    NamedToolChoice, RequestFunctionCall, RequestToolCall, ResponseFormat, Stop, ToolChoice,
    ToolChoiceFunction, ToolDefinition, UnknownFields,
};
use crate::server::respond::respond;
use crate::server::tools;
use crate::server::unsupported;
use crate::server::validation::{validate_chat, GenerationPlan};
use crate::server::AppState;

/// `input`: a user message's text, or a list of items.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or a list of input items")]
pub enum Input {
    Text(String),
    /// Read item by item, by `type` (see [`input_messages`]).
    Items(Vec<Value>),
}

/// `POST /v1/responses`. Beyond OpenAI's fields, vLLM's sampling
/// extensions `top_k`, `min_p`, `repetition_penalty`, `seed` and `stop`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Input>,
    /// A system message before the input (not carried over to a response
    /// that continues this one, as at OpenAI).
    pub instructions: Option<String>,
    /// Function tools (each `{"type": "function", "name", "parameters", …}`).
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_output_tokens: Option<u32>,
    /// A cap on calls to built-in tools, of which wick runs none: no effect.
    pub max_tool_calls: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Only 0: wick returns no output logprobs here.
    pub top_logprobs: Option<u32>,
    /// Extra output to include: none is served, so only an empty list.
    pub include: Option<Vec<String>>,
    pub text: Option<TextConfig>,
    pub reasoning: Option<ReasoningConfig>,
    pub stream: Option<bool>,
    pub stream_options: Option<ResponsesStreamOptions>,
    /// Keep the response for `GET` and `previous_response_id` (default true).
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    /// Only false: wick answers while the connection is open.
    pub background: Option<bool>,
    /// Only `"disabled"`: an input that does not fit is refused.
    pub truncation: Option<String>,
    // For the client's own records, echoed back: no effect on output.
    pub metadata: Option<Metadata>,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub prompt_cache_retention: Option<String>,
    pub service_tier: Option<String>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Fields this type does not declare, refused.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
    /// Refused, as chat's: no template reads it.
    pub verbosity: Option<String>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `{"type": "text"}`, `{"type": "json_object"}` or `{"type":
/// "json_schema", "name", "schema", "description", "strict"}`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<Value>,
    pub strict: Option<bool>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ReasoningConfig {
    /// Passed as chat's `reasoning_effort` (templates that read it).
    pub effort: Option<String>,
    /// A summary of the thinking: refused, wick shows the thinking itself.
    pub summary: Option<String>,
    pub generate_summary: Option<String>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ResponsesStreamOptions {
    /// Random padding on stream events: wick sends none, so only false.
    pub include_obfuscation: Option<bool>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
struct FunctionTool {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
    strict: Option<bool>,
    /// Tool search's: only false.
    defer_loading: Option<bool>,
    #[serde(rename = "type")]
    _kind: String,
    #[schema(ignore)]
    #[serde(flatten)]
    unknown: UnknownFields,
}

/// A message item's `content`, or a function call output's `output`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or a list of content parts")]
enum ItemContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

// Some fields are declared only to be accepted.
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// A `refusal` part's text.
    refusal: Option<String>,
    /// An `input_image` part's image (a `data:` URL) and detail; an
    /// uploaded file's id is refused.
    image_url: Option<String>,
    detail: Option<String>,
    file_id: Option<String>,
    // What an `output_text` part returned beside its text, replayed by
    // clients: not shown to the model.
    annotations: Option<Value>,
    logprobs: Option<Value>,
    #[schema(ignore)]
    #[serde(flatten)]
    unknown: UnknownFields,
}

// Some fields are declared only to be accepted.
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
struct MessageItem {
    role: String,
    content: ItemContent,
    // An output message replayed as input carries these: no effect.
    id: Option<String>,
    status: Option<String>,
    phase: Option<String>,
    #[serde(rename = "type")]
    _kind: Option<String>,
    #[schema(ignore)]
    #[serde(flatten)]
    unknown: UnknownFields,
}

// Some fields are declared only to be accepted.
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
struct FunctionCallItem {
    call_id: String,
    name: String,
    arguments: String,
    id: Option<String>,
    status: Option<String>,
    #[serde(rename = "type")]
    _kind: String,
    #[schema(ignore)]
    #[serde(flatten)]
    unknown: UnknownFields,
}

// Some fields are declared only to be accepted.
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
struct FunctionCallOutputItem {
    call_id: String,
    output: ItemContent,
    id: Option<String>,
    status: Option<String>,
    #[serde(rename = "type")]
    _kind: String,
    #[schema(ignore)]
    #[serde(flatten)]
    unknown: UnknownFields,
}

// Some fields are declared only to be accepted.
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
struct ReasoningItem {
    id: Option<String>,
    summary: Option<Vec<ContentPart>>,
    content: Option<Vec<ContentPart>>,
    /// Another server's sealed reasoning: wick can neither read nor make it.
    encrypted_content: Option<String>,
    status: Option<String>,
    #[serde(rename = "type")]
    _kind: String,
    #[schema(ignore)]
    #[serde(flatten)]
    unknown: UnknownFields,
}

/// A request read and translated.
struct Translated {
    /// The chat-completions request it runs as.
    chat: ChatCompletionRequest,
    /// The input as chat messages, without the instructions: what a
    /// follow-up's history keeps.
    input: Vec<ChatRequestMessage>,
    /// The Response object's fields that echo the request.
    echo: Map<String, Value>,
}

pub async fn create_response(
    State(state): State<Arc<AppState>>,
    Extension(kept): Extension<Kept>,
    Extension(access): Extension<AccessRecord>,
    owner: Owner,
    request: Request,
) -> Result<Response, ApiError> {
    let JsonBody(req) = JsonBody::<ResponsesRequest>::from_request(request, &state).await?;
    let history = match &req.previous_response_id {
        Some(id) => {
            let stored = kept.lock().get(owner, id, Instant::now());
            stored
                .ok_or_else(|| not_found(id, Some("previous_response_id")))?
                .conversation
        }
        None => Vec::new(),
    };
    let (keeps, stream) = (req.store.unwrap_or(true), req.stream.unwrap_or(false));
    let limit = state.limits.max_body_bytes;
    // Megabytes of JSON work for a large input: off the async workers.
    let (t, conversation) = tokio::task::spawn_blocking(move || {
        let t = translate(&req, &history)?;
        let input: Vec<Bytes> = t.input.iter().map(json_bytes).collect();
        // The conversation runs as one request: a long history counts
        // against --max-body-bytes, as the client's own body does.
        let size: usize = history.iter().chain(&input).map(Bytes::len).sum();
        if size > limit {
            let mut e = ApiError::payload_too_large(limit);
            e.message = format!(
                "{}: the conversation (previous_response_id's history with this input) is too \
                 long",
                e.message
            );
            return Err(e);
        }
        let conversation: Vec<Bytes> = match keeps {
            true => history.into_iter().chain(input).collect(),
            false => Vec::new(),
        };
        Ok::<_, ApiError>((t, conversation))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let (g, plan) = generation::begin_read(&state, t.chat, validate_chat, access).await?;
    let mut echo = t.echo;
    echo.insert("model".into(), json!(g.model().name));
    let on_done = keeps.then(|| {
        let keep = Keep {
            kept,
            owner,
            conversation,
        };
        Box::new(move |b: &ResponseBuilder, response| keep.save(b, response)) as OnDone
    });
    let builder = ResponseBuilder::new(new_id("resp"), unix_now(), echo, plan.tools.ids, on_done);
    // The chat request it runs as leaves streaming to this handler.
    let plan = GenerationPlan { stream, ..plan };
    respond(g, &plan, builder, state.limits.sse_keep_alive).await
}

/// `GET /v1/responses/{id}`: a kept response, sent as the bytes it is
/// kept as (however large, no work on the async workers).
pub async fn retrieve(
    Extension(kept): Extension<Kept>,
    owner: Owner,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    refuse_query(query.as_deref())?;
    let stored = kept.lock().get(owner, &id, Instant::now());
    let stored = stored.ok_or_else(|| not_found(&id, None))?;
    Ok(json_response(stored.response))
}

/// `DELETE /v1/responses/{id}`: forgets a kept response.
pub async fn delete(
    Extension(kept): Extension<Kept>,
    owner: Owner,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !kept.lock().remove(owner, &id) {
        return Err(not_found(&id, None));
    }
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// Where a finished response is kept, with the conversation before its reply.
struct Keep {
    kept: Kept,
    owner: Owner,
    conversation: Vec<Bytes>,
}

impl Keep {
    fn save(&self, builder: &ResponseBuilder, response: Bytes) {
        let mut conversation = self.conversation.clone();
        conversation.push(json_bytes(&builder.assistant_message()));
        let stored = Stored {
            response,
            conversation,
        };
        let id = builder.id().to_string();
        if !self
            .kept
            .lock()
            .insert(self.owner, id, stored, Instant::now())
        {
            tracing::warn!(
                "response {} is larger than the response store's byte budget: not kept",
                builder.id()
            );
        }
    }
}

/// The responses kept, shared by this API's handlers: the router hands it
/// to them, as it is no other API's business.
#[derive(Clone)]
pub struct Kept(Arc<Mutex<ResponseStore>>);

impl Kept {
    /// A store with a shelf for each of `owners` API keys.
    pub fn for_owners(owners: usize) -> Self {
        Kept(Arc::new(Mutex::new(ResponseStore::for_owners(owners))))
    }

    fn lock(&self) -> MutexGuard<'_, ResponseStore> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn json_bytes(v: &impl Serialize) -> Bytes {
    // A `Value`, or a chat message, always serialises.
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

fn json_response(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// 404 for a response that is not kept (never stored, deleted, expired or
/// evicted, or kept by a server since restarted), as vLLM answers.
fn not_found(id: &str, param: Option<&str>) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "Response with id '{}' not found. wick keeps responses in memory, for a \
             limited time and number (docs/api.md, Responses API).",
            clip(id, MAX_ECHO_CHARS)
        ),
        kind: "invalid_request_error",
        param: param.map(str::to_string),
        code: None,
        retry_after: None,
    }
}

/// `GET` takes no options (`stream` and `include` serve background
/// responses and extra output, neither of which wick has).
fn refuse_query(query: Option<&str>) -> Result<(), ApiError> {
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "stream" && value == "false" {
            continue;
        }
        return Err(ApiError::unsupported_parameter(key));
    }
    Ok(())
}

/// Chat's fields as the Responses API names them, for errors (messages
/// name their own origins; together they are the input).
const NAMES: FieldNames = FieldNames {
    messages: "input",
    max_tokens: "max_output_tokens",
    response_format: "text.format",
    json_schema: "text.format",
    reasoning_effort: "reasoning.effort",
    tool_choice_name: "tool_choice.name",
    tool_function: "",
    tool_parameters: ".parameters",
    ..FieldNames::CHAT
};

/// Reads `v` as a `T`; an error names its field under `at`.
fn typed<T: DeserializeOwned>(v: &Value, at: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
        let path = e.path().to_string();
        let text = e.into_inner().to_string();
        let mut param = at.to_string();
        if path != "." {
            param = format!("{param}.{path}");
        }
        if let Some(field) = text
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            param = format!("{param}.{field}");
        }
        ApiError::bad_request(format!("invalid `{param}`: {text}"), Some(&param))
    })
}

/// An f32 as JSON the way it was written (0.7, not 0.699999988).
fn number(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn translate(req: &ResponsesRequest, history: &[Bytes]) -> Result<Translated, ApiError> {
    unsupported::refuse(&req.unknown, "")?;
    refuse_unservable(req)?;
    let mut echo = Map::new();
    let input = match &req.input {
        Some(input) => input_messages(input)?,
        None if req.previous_response_id.is_some() => Vec::new(),
        None => {
            return Err(ApiError::bad_request(
                "input is required (unless previous_response_id continues a response)",
                Some("input"),
            ))
        }
    };
    let mut messages = Vec::new();
    if let Some(instructions) = &req.instructions {
        messages.push(ChatRequestMessage {
            role: "system".into(),
            content: Some(MessageContent::Text(instructions.clone())),
            origin: Some("instructions".into()),
            ..Default::default()
        });
    }
    for m in history {
        let m: ChatRequestMessage =
            serde_json::from_slice(m).map_err(|e| ApiError::internal(e.to_string()))?;
        // Kept turns are the client's by the response it names.
        messages.push(ChatRequestMessage {
            origin: Some("previous_response_id".into()),
            ..m
        });
    }
    messages.extend(input.iter().cloned());

    // An empty list, as some clients send with no tools, is none.
    let tools = req.tools.as_deref().unwrap_or_default();
    tools::check_count(tools.len())?;
    let mut chat_tools = Vec::new();
    let mut echo_tools = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported_value(
                    &format!("{at}.type"),
                    format!(
                        "tools of type {:?} are not supported: wick runs no built-in tools \
                         (web search, file search, code interpreter, computer use, MCP, image \
                         generation, …); give \"function\" tools, which the client runs",
                        clip(other, MAX_ECHO_CHARS)
                    ),
                ))
            }
            None => {
                return Err(ApiError::bad_request(
                    "each tool needs its type (\"function\")",
                    Some(&format!("{at}.type")),
                ))
            }
        }
        let f: FunctionTool = typed(t, &at)?;
        unsupported::refuse(&f.unknown, &at)?;
        if f.defer_loading == Some(true) {
            return Err(ApiError::unsupported_value(
                &format!("{at}.defer_loading"),
                "deferred tools (tool search) are not supported: give every tool in `tools`",
            ));
        }
        echo_tools.push(json!({
            "type": "function", "name": f.name, "description": f.description,
            "parameters": f.parameters, "strict": f.strict,
        }));
        chat_tools.push(ToolDefinition {
            kind: "function".into(),
            function: FunctionDefinition {
                name: f.name,
                description: f.description,
                parameters: f.parameters,
                strict: f.strict,
                unknown: UnknownFields::default(),
            },
            unknown: UnknownFields::default(),
        });
    }
    let tool_choice = req
        .tool_choice
        .as_ref()
        .map(|c| tool_choice(c, !chat_tools.is_empty()))
        .transpose()?
        .flatten();
    let has_tools = !chat_tools.is_empty();

    let format = match &req.text {
        Some(text) => {
            unsupported::refuse(&text.unknown, "text")?;
            if text.verbosity.is_some() {
                return Err(ApiError {
                    code: Some("unsupported_parameter".into()),
                    ..ApiError::bad_request(
                        "Unsupported parameter: 'text.verbosity' is not supported with this \
                         model: no chat template reads it, so it could not change the reply; \
                         leave it out, or ask for the length you want in the input.",
                        Some("text.verbosity"),
                    )
                });
            }
            text.format.as_ref().map(response_format).transpose()?
        }
        None => None,
    };
    let (response_format, shown_format) = match format {
        Some((chat, shown)) => (Some(chat), shown),
        None => (None, json!({"type": "text"})),
    };
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    let chat = ChatCompletionRequest {
        model: req.model.clone(),
        messages,
        tools: has_tools.then_some(chat_tools),
        parallel_tool_calls: req.parallel_tool_calls.filter(|_| has_tools),
        tool_choice,
        response_format,
        reasoning_effort: effort.clone(),
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        min_p: req.min_p,
        repetition_penalty: req.repetition_penalty,
        top_k: req.top_k,
        seed: req.seed,
        stop: req.stop.clone(),
        names: NAMES,
        ..Default::default()
    };

    echo.insert("background".into(), json!(false));
    echo.insert("instructions".into(), json!(req.instructions));
    echo.insert("max_output_tokens".into(), json!(req.max_output_tokens));
    echo.insert("max_tool_calls".into(), json!(req.max_tool_calls));
    echo.insert(
        "metadata".into(),
        json!(req.metadata.clone().unwrap_or_default()),
    );
    echo.insert("model".into(), json!(req.model));
    echo.insert(
        "parallel_tool_calls".into(),
        json!(req.parallel_tool_calls.unwrap_or(true)),
    );
    echo.insert(
        "previous_response_id".into(),
        json!(req.previous_response_id),
    );
    echo.insert("prompt_cache_key".into(), json!(req.prompt_cache_key));
    echo.insert(
        "reasoning".into(),
        json!({"effort": effort, "summary": null}),
    );
    echo.insert("safety_identifier".into(), json!(req.safety_identifier));
    echo.insert(
        "service_tier".into(),
        json!(req.service_tier.as_deref().unwrap_or("default")),
    );
    echo.insert("store".into(), json!(req.store.unwrap_or(true)));
    echo.insert(
        "temperature".into(),
        req.temperature.map_or(json!(1.0), number),
    );
    echo.insert("text".into(), json!({"format": shown_format}));
    echo.insert(
        "tool_choice".into(),
        req.tool_choice.clone().unwrap_or(json!("auto")),
    );
    echo.insert("tools".into(), Value::Array(echo_tools));
    echo.insert("top_logprobs".into(), json!(0));
    echo.insert("top_p".into(), req.top_p.map_or(json!(1.0), number));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("user".into(), json!(req.user));
    Ok(Translated { chat, input, echo })
}

/// The request fields wick has no way to honour, refused by name.
fn refuse_unservable(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) {
        return Err(ApiError::unsupported_value(
            "background",
            "background responses are not supported: wick answers while the request is open \
             (leave background out, or false)",
        ));
    }
    match req.truncation.as_deref() {
        None | Some("disabled") => {}
        Some("auto") => {
            return Err(ApiError::unsupported_value(
                "truncation",
                "truncation \"auto\" (dropping the oldest input to fit the context) is not \
                 supported: an input too long for the context is refused; send \"disabled\" or \
                 leave it out",
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                format!(
                    "truncation must be \"auto\" or \"disabled\", got {:?}",
                    clip(other, MAX_ECHO_CHARS)
                ),
                Some("truncation"),
            ))
        }
    }
    if let Some(what) = req.include.iter().flatten().next() {
        return Err(ApiError::unsupported_value(
            "include",
            format!(
                "include {:?} is not supported: wick returns no extra output here (no \
                 logprobs, encrypted reasoning or built-in tool results)",
                clip(what, MAX_ECHO_CHARS)
            ),
        ));
    }
    if let Some(k) = req.top_logprobs.filter(|&k| k > 0) {
        return Err(ApiError::unsupported_value(
            "top_logprobs",
            format!(
                "top_logprobs {k} is not supported: wick returns no logprobs from \
                 /v1/responses (use /v1/chat/completions for them)"
            ),
        ));
    }
    if let Some(options) = &req.stream_options {
        unsupported::refuse(&options.unknown, "stream_options")?;
        if req.stream != Some(true) {
            return Err(ApiError::bad_request(
                "stream_options is only allowed when stream is true",
                Some("stream_options"),
            ));
        }
        if options.include_obfuscation == Some(true) {
            return Err(ApiError::unsupported_value(
                "stream_options.include_obfuscation",
                "stream obfuscation (random padding on events) is not supported: send false \
                 or leave it out",
            ));
        }
    }
    if let Some(r) = &req.reasoning {
        unsupported::refuse(&r.unknown, "reasoning")?;
        for (field, set) in [
            ("reasoning.summary", &r.summary),
            ("reasoning.generate_summary", &r.generate_summary),
        ] {
            if set.is_some() {
                return Err(ApiError::unsupported_value(
                    field,
                    "reasoning summaries are not supported: wick returns the model's \
                     reasoning itself, in a reasoning item's content",
                ));
            }
        }
    }
    Ok(())
}

/// `text.format` as chat's `response_format`, and as the Response echoes it.
fn response_format(f: &TextFormat) -> Result<(ResponseFormat, Value), ApiError> {
    unsupported::refuse(&f.unknown, "text.format")?;
    let json_schema = match f.kind.as_str() {
        "text" | "json_object" => None,
        "json_schema" => Some(JsonSchemaFormat {
            name: f.name.clone(),
            description: f.description.clone(),
            schema: f.schema.clone(),
            strict: f.strict,
            unknown: UnknownFields::default(),
        }),
        other => {
            return Err(ApiError::unsupported_value(
                "text.format.type",
                format!(
                    "text.format type must be text, json_object or json_schema, got {:?}",
                    clip(other, MAX_ECHO_CHARS)
                ),
            ))
        }
    };
    // The echo flattens the schema's fields into the format, as sent.
    let mut shown = Map::new();
    shown.insert("type".into(), json!(f.kind));
    if let Some(s) = &json_schema {
        for (key, value) in [
            ("name", s.name.as_ref().map(|n| json!(n))),
            ("description", s.description.as_ref().map(|d| json!(d))),
            ("schema", s.schema.clone()),
            ("strict", s.strict.map(|s| json!(s))),
        ] {
            if let Some(v) = value {
                shown.insert(key.into(), v);
            }
        }
    }
    let chat = ResponseFormat {
        kind: f.kind.clone(),
        json_schema,
        unknown: UnknownFields::default(),
    };
    Ok((chat, Value::Object(shown)))
}

/// `tool_choice` as chat's; `None` where it changes nothing (`none` or
/// `auto` with no tools).
fn tool_choice(c: &Value, has_tools: bool) -> Result<Option<ToolChoice>, ApiError> {
    match c {
        Value::String(s) if !has_tools && (s == "none" || s == "auto") => Ok(None),
        Value::String(s) => Ok(Some(ToolChoice::Mode(s.clone()))),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::bad_request(
                        "a tool_choice of type function needs the function's name",
                        Some("tool_choice.name"),
                    )
                })?;
                if let Some((k, _)) = o
                    .iter()
                    .find(|(k, v)| *k != "type" && *k != "name" && !v.is_null())
                {
                    return Err(ApiError::unsupported_parameter(&format!("tool_choice.{k}")));
                }
                Ok(Some(ToolChoice::Named(NamedToolChoice {
                    kind: "function".into(),
                    function: ToolChoiceFunction {
                        name: name.into(),
                        unknown: UnknownFields::default(),
                    },
                    unknown: UnknownFields::default(),
                })))
            }
            Some("allowed_tools") => Err(ApiError::unsupported_value(
                "tool_choice.type",
                "tool_choice of type \"allowed_tools\" is not supported: give only the \
                 allowed tools in `tools`",
            )),
            other => Err(ApiError::unsupported_value(
                "tool_choice.type",
                format!(
                    "tool_choice of type {:?} is not supported: wick runs no built-in tools; \
                     name a function ({{\"type\": \"function\", \"name\": …}}) or send \
                     \"none\", \"auto\" or \"required\"",
                    clip(other.unwrap_or_default(), MAX_ECHO_CHARS)
                ),
            )),
        },
        _ => Err(ApiError::bad_request(
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
             \"name\": …}",
            Some("tool_choice"),
        )),
    }
}

/// The input as chat messages: a string is one user message; items turn
/// into turns in order. Reasoning goes to the assistant turn after it;
/// function calls join the assistant turn before them. Each turn keeps
/// the item it came from (`input[3]`) as its origin.
fn input_messages(input: &Input) -> Result<Vec<ChatRequestMessage>, ApiError> {
    let turn = |role: &str, content, origin: &str| ChatRequestMessage {
        role: role.into(),
        content,
        origin: Some(origin.into()),
        ..Default::default()
    };
    let items = match input {
        Input::Text(text) => {
            let content = Some(MessageContent::Text(text.clone()));
            return Ok(vec![turn("user", content, "input")]);
        }
        Input::Items(items) => items,
    };
    let mut out: Vec<ChatRequestMessage> = Vec::new();
    // Reasoning not yet given to an assistant turn: the item it began at,
    // and its text.
    let mut thought: Option<(String, String)> = None;
    let thought_alone = |(origin, t): (String, String)| ChatRequestMessage {
        reasoning_content: Some(t),
        ..turn(
            "assistant",
            Some(MessageContent::Text(String::new())),
            &origin,
        )
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(ApiError::bad_request(
                "each input item must be an object",
                Some(&at),
            ));
        }
        let kind = match item.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "an input item's type must be a string",
                    Some(&format!("{at}.type")),
                ))
            }
        };
        match kind {
            "message" => {
                let m: MessageItem = typed(item, &at)?;
                unsupported::refuse(&m.unknown, &at)?;
                if !["user", "system", "developer", "assistant"].contains(&m.role.as_str()) {
                    return Err(ApiError::bad_request(
                        format!(
                            "unsupported role {:?}: must be user, system, developer or assistant",
                            clip(&m.role, MAX_ECHO_CHARS)
                        ),
                        Some(&format!("{at}.role")),
                    ));
                }
                let content = content(&m.content, &format!("{at}.content"))?;
                let mut message = turn(&m.role, Some(content), &at);
                match thought.take() {
                    Some((_, t)) if m.role == "assistant" => message.reasoning_content = Some(t),
                    Some(t) => out.push(thought_alone(t)),
                    None => {}
                }
                out.push(message);
            }
            "function_call" => {
                let c: FunctionCallItem = typed(item, &at)?;
                unsupported::refuse(&c.unknown, &at)?;
                let call = RequestToolCall {
                    id: c.call_id,
                    kind: "function".into(),
                    function: RequestFunctionCall {
                        name: c.name,
                        arguments: FunctionArguments::Json(c.arguments),
                        unknown: UnknownFields::default(),
                    },
                    unknown: UnknownFields::default(),
                };
                match out.last_mut() {
                    Some(last) if last.role == "assistant" && thought.is_none() => {
                        last.tool_calls.get_or_insert_default().push(call)
                    }
                    _ => out.push(ChatRequestMessage {
                        reasoning_content: thought.take().map(|(_, t)| t),
                        tool_calls: Some(vec![call]),
                        ..turn("assistant", None, &at)
                    }),
                }
            }
            "function_call_output" => {
                let o: FunctionCallOutputItem = typed(item, &at)?;
                unsupported::refuse(&o.unknown, &at)?;
                if let Some(t) = thought.take() {
                    out.push(thought_alone(t));
                }
                let content = content(&o.output, &format!("{at}.output"))?;
                out.push(ChatRequestMessage {
                    tool_call_id: Some(o.call_id),
                    ..turn("tool", Some(content), &at)
                });
            }
            "reasoning" => {
                let r: ReasoningItem = typed(item, &at)?;
                unsupported::refuse(&r.unknown, &at)?;
                if r.encrypted_content.is_some() {
                    return Err(ApiError::unsupported_value(
                        &format!("{at}.encrypted_content"),
                        "encrypted reasoning is not supported: wick can neither read another \
                         server's nor make its own; send the reasoning's content, or leave \
                         the item out",
                    ));
                }
                let texts = |parts: &[ContentPart], at: &str| {
                    parts
                        .iter()
                        .enumerate()
                        .map(|(j, p)| part_text(p, &format!("{at}[{j}]")))
                        .collect::<Result<Vec<_>, _>>()
                };
                let text = match (&r.content, &r.summary) {
                    (Some(c), _) if !c.is_empty() => texts(c, &format!("{at}.content"))?.concat(),
                    (_, Some(s)) => texts(s, &format!("{at}.summary"))?.join("\n\n"),
                    _ => String::new(),
                };
                let (_, t) = thought.get_or_insert_with(|| (at.clone(), String::new()));
                t.push_str(&text);
            }
            "item_reference" => {
                return Err(ApiError::unsupported_value(
                    &format!("{at}.type"),
                    "item references are not supported: send the item itself, or continue a \
                     kept response with previous_response_id",
                ))
            }
            other => {
                return Err(ApiError::unsupported_value(
                    &format!("{at}.type"),
                    format!(
                        "input items of type {:?} are not supported: wick takes message, \
                         function_call, function_call_output and reasoning items",
                        clip(other, MAX_ECHO_CHARS)
                    ),
                ))
            }
        }
    }
    if let Some(t) = thought {
        out.push(thought_alone(t));
    }
    Ok(out)
}

/// A message's content (or a call's output) as chat content: text as it
/// is, parts as chat's text parts (which chat joins by newlines).
fn content(c: &ItemContent, at: &str) -> Result<MessageContent, ApiError> {
    match c {
        ItemContent::Text(text) => Ok(MessageContent::Text(text.clone())),
        ItemContent::Parts(parts) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| match p.kind.as_str() {
                "input_image" => image_part(p, &format!("{at}[{j}]")),
                _ => part_text(p, &format!("{at}[{j}]")).map(ChatPart::text),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(MessageContent::Parts),
    }
}

/// An `input_image` part as chat's image part.
fn image_part(p: &ContentPart, at: &str) -> Result<ChatPart, ApiError> {
    unsupported::refuse(&p.unknown, at)?;
    if p.file_id.is_some() {
        return Err(ApiError::unsupported_value(
            &format!("{at}.file_id"),
            "file ids are not supported: wick keeps no files; send image_url as a data: URL",
        ));
    }
    let url = p.image_url.clone().ok_or_else(|| {
        ApiError::bad_request(
            "an input_image part needs image_url",
            Some(&format!("{at}.image_url")),
        )
    })?;
    Ok(ChatPart::image(url, p.detail.clone()))
}

fn part_text(p: &ContentPart, at: &str) -> Result<String, ApiError> {
    let text = match p.kind.as_str() {
        "input_text" | "output_text" | "text" | "reasoning_text" | "summary_text" => &p.text,
        "refusal" => &p.refusal,
        "input_image" => {
            return Err(ApiError::unsupported_value(
                &format!("{at}.type"),
                "input_image parts are only taken in a message's content",
            ))
        }
        kind @ ("input_file" | "input_audio") => {
            return Err(ApiError::unsupported_value(
                &format!("{at}.type"),
                format!("{kind} parts are not supported: wick takes text and images"),
            ))
        }
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "unknown content part type {:?}",
                    clip(other, MAX_ECHO_CHARS)
                ),
                Some(&format!("{at}.type")),
            ))
        }
    };
    unsupported::refuse(&p.unknown, at)?;
    text.clone().ok_or_else(|| {
        let field = if p.kind == "refusal" {
            "refusal"
        } else {
            "text"
        };
        ApiError::bad_request(
            format!("a {} part needs its {field}", p.kind),
            Some(&format!("{at}.{field}")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        serde_json::from_value(body).unwrap()
    }

    fn messages(input: Value) -> Result<Vec<ChatRequestMessage>, ApiError> {
        input_messages(&serde_json::from_value(input).unwrap())
    }

    /// The turns' origins, taken out of them.
    fn origins(turns: &mut [ChatRequestMessage]) -> Vec<String> {
        turns.iter_mut().filter_map(|m| m.origin.take()).collect()
    }

    /// Chat's own reading of what a translation should build.
    fn chat<T: DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn items_become_chat_turns() {
        let mut m = messages(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Think."}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Calling.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f",
             "arguments": "{\"x\": 1}", "status": "completed"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "two"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Done."}]},
        ]))
        .unwrap();
        assert_eq!(
            origins(&mut m),
            ["input[0]", "input[1]", "input[3]", "input[6]", "input[7]", "input[8]"]
        );
        assert_eq!(
            m,
            chat::<Vec<ChatRequestMessage>>(json!([
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Calling."}],
                 "reasoning_content": "Think.",
                 "tool_calls": [
                     {"id": "c1", "type": "function",
                      "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                     {"id": "c2", "type": "function",
                      "function": {"name": "g", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2",
                 "content": [{"type": "text", "text": "two"}]},
                {"role": "assistant", "content": "", "reasoning_content": "Done."},
            ]))
        );
        // A call with no assistant turn before it opens one, with its thinking.
        let mut m = messages(json!([
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "T"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]))
        .unwrap();
        assert_eq!(origins(&mut m), ["input[0]", "input[2]"]);
        assert_eq!(
            m[1],
            chat(
                json!({"role": "assistant", "content": null, "reasoning_content": "T",
                        "tool_calls": [{"id": "c", "type": "function",
                                        "function": {"name": "f", "arguments": "{}"}}]})
            )
        );
        let mut m = messages(json!("hello")).unwrap();
        assert_eq!(origins(&mut m), ["input"]);
        assert_eq!(
            m,
            chat::<Vec<ChatRequestMessage>>(json!([{"role": "user", "content": "hello"}]))
        );
    }

    #[test]
    fn bad_items_name_their_field() {
        for (input, param) in [
            (json!([{"role": "user"}]), "input[0].content"),
            (json!([{"role": "user", "content": 3}]), "input[0].content"),
            (
                json!([{"role": "user", "content": [{"type": "input_text"}]}]),
                "input[0].content[0].text",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
                "input[0].content[0].type",
            ),
            (json!(["hi"]), "input[0]"),
            (json!([{"type": 3}]), "input[0].type"),
            (
                json!([{"type": "function_call_output", "call_id": "c"}]),
                "input[0].output",
            ),
        ] {
            let e = messages(input.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{input}: {}", e.message);
        }
    }

    #[test]
    fn the_chat_request_and_the_echo() {
        let req = request(json!({
            "model": "m", "input": "hi", "instructions": "Be brief.", "temperature": 0.7,
            "max_output_tokens": 9, "tools": [{"type": "function", "name": "f",
            "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "seed": 3, "stop": "END",
        }));
        let history = [json_bytes(&json!({"role": "user", "content": "before"}))];
        let mut t = translate(&req, &history).unwrap();
        assert_eq!(
            origins(&mut t.chat.messages),
            ["instructions", "previous_response_id", "input"]
        );
        assert_eq!(origins(&mut t.input), ["input"]);
        assert_eq!(std::mem::take(&mut t.chat.names), NAMES);
        assert_eq!(
            t.chat,
            chat(json!({
                "model": "m",
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "before"},
                             {"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f",
                           "parameters": {"type": "object"}, "strict": true}}],
                "parallel_tool_calls": false,
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": {"type": "object"}}},
                "max_tokens": 9, "temperature": 0.7, "seed": 3, "stop": "END",
            }))
        );
        assert_eq!(
            t.input,
            chat::<Vec<ChatRequestMessage>>(json!([{"role": "user", "content": "hi"}]))
        );
        assert_eq!(t.echo["temperature"], json!(0.7));
        assert_eq!(
            t.echo["text"],
            json!({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})
        );
        assert_eq!(
            t.echo["tools"],
            json!([{"type": "function", "name": "f", "description": null,
                    "parameters": {"type": "object"}, "strict": true}])
        );
        // No tools: an empty list and a choice that changes nothing are left out.
        let mut t = translate(
            &request(json!({"input": "hi", "tools": [], "tool_choice": "none"})),
            &[],
        )
        .unwrap();
        origins(&mut t.chat.messages);
        std::mem::take(&mut t.chat.names);
        assert_eq!(
            t.chat,
            chat(json!({"messages": [{"role": "user", "content": "hi"}]}))
        );
        assert_eq!(t.echo["tool_choice"], "none");
    }

    #[test]
    fn chat_errors_name_the_responses_fields() {
        let tool = |name: &str| json!({"type": "function", "name": name, "parameters": {}});
        for (body, param) in [
            (json!({"tools": [tool("f"), tool("a b")]}), "tools[1].name"),
            (
                json!({"tools": [{"type": "function", "name": "f", "parameters": 3}]}),
                "tools[0].parameters",
            ),
            (
                json!({"tools": [tool("f")], "tool_choice": {"type": "function", "name": "g"}}),
                "tool_choice.name",
            ),
        ] {
            let mut body = body;
            body["input"] = json!("hi");
            let t = translate(&request(body.clone()), &[]).unwrap();
            let e = tools::plan(&t.chat, "").unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn get_takes_no_options() {
        refuse_query(None).unwrap();
        refuse_query(Some("")).unwrap();
        refuse_query(Some("stream=false")).unwrap();
        let e = refuse_query(Some("stream=true")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream"));
        let e = refuse_query(Some("include=x")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("include"));
    }
}
