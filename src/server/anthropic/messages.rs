//! `POST /v1/messages` (Anthropic's Messages API, as llama.cpp's server
//! offers it) and `POST /v1/messages/count_tokens`: a translation layer
//! over chat completions. The request is checked in Anthropic's terms
//! (its roles and content blocks, `max_tokens` required, `temperature` in
//! [0, 1]), turned into a chat request (`system` first; `tool_use` blocks
//! become an assistant turn's tool calls, `tool_result` blocks tool turns;
//! tools' `input_schema` their parameters; `tool_choice` auto, any, tool
//! and none become auto, required, a named function and none) and
//! validated as one, so the prompt, the sampling and the tool plan are the
//! very ones chat would run. Its errors name Anthropic's fields. The reply
//! goes back as content blocks (`messages_stream`); every error, before or
//! during a stream, in Anthropic's shape `{"type": "error", "error":
//! {"type", "message"}}`.
//!
//! As everywhere in wick, no field is silently ignored: what wick cannot
//! honour (images, documents, server tools, a final assistant turn to
//! continue, thinking on a model that does not think) is refused, naming
//! the field.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::server::anthropic::error::error_body;
use crate::server::anthropic::messages_stream::Blocks;
use crate::server::error::{clip, ApiError, MAX_ECHO_CHARS};
use crate::server::generation;
use crate::server::handlers;
use crate::server::http::access::{request_id, AccessRecord};
use crate::server::http::json_body::JsonBody;
use crate::server::images::ImageSources;
use crate::server::protocol::{
    ChatCompletionRequest, ChatRequestMessage, ContentPart, FieldNames, FunctionArguments,
    FunctionDefinition, MessageContent, NamedToolChoice, RequestFunctionCall, RequestToolCall,
    Stop, ToolChoice as ChatToolChoice, ToolChoiceFunction, ToolDefinition, UnknownFields,
};
use crate::server::respond::respond;
use crate::server::unsupported;
use crate::server::validation::{validate_chat, GenerationPlan, ModelContext};
use crate::server::AppState;
use crate::text::harmony;
use crate::text::reasoning::ReasoningParser;

/// `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct MessagesRequest {
    /// Optional, unlike at Anthropic: wick serves one model; a name other
    /// than its own is a 404.
    pub model: Option<String>,
    pub messages: Vec<InputMessage>,
    /// Required, as at Anthropic.
    pub max_tokens: u32,
    pub system: Option<Content>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    /// [0, 1], Anthropic's range.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
    /// `user_id`, for the client's own records: no effect.
    pub metadata: Option<Metadata>,
    /// The processing tier at Anthropic: no effect.
    pub service_tier: Option<String>,
    /// Prompt-caching hints: wick caches every prompt's prefix by itself,
    /// so they change nothing.
    pub cache_control: Option<Value>,
    /// Fields this type does not declare, refused.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `POST /v1/messages/count_tokens`: what shapes the prompt, no sampling.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct CountTokensRequest {
    pub model: Option<String>,
    pub messages: Vec<InputMessage>,
    pub system: Option<Content>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
    pub cache_control: Option<Value>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    pub content: Content,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// The `url` sources of the messages' image blocks.
fn image_urls(messages: &[InputMessage]) -> Vec<&str> {
    let blocks = messages.iter().filter_map(|m| match &m.content {
        Content::Blocks(blocks) => Some(blocks),
        Content::Text(_) => None,
    });
    blocks
        .flatten()
        .filter_map(|b| b.source.as_ref())
        .filter(|s| s.kind == "url")
        .filter_map(|s| s.url.as_deref())
        .collect()
}

impl ImageSources for MessagesRequest {
    fn image_urls(&self) -> Vec<&str> {
        image_urls(&self.messages)
    }
}

impl ImageSources for CountTokensRequest {
    fn image_urls(&self) -> Vec<&str> {
        image_urls(&self.messages)
    }
}

/// A message's (or `system`'s, or a tool result's) content: a string or
/// a list of content blocks.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or a list of content blocks")]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block, every kind's fields together; which of them a kind
/// may carry is checked by kind (`text`, `tool_use`, `tool_result`,
/// `thinking`; others are refused).
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `tool_use`: the call's id, name and arguments.
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    /// `tool_result`: the call it answers, its output, and whether the
    /// tool failed.
    pub tool_use_id: Option<String>,
    #[schema(no_recursion)]
    pub content: Option<Content>,
    pub is_error: Option<bool>,
    /// `thinking`: an earlier reply's thinking, replayed.
    pub thinking: Option<String>,
    pub signature: Option<String>,
    /// A prompt-caching hint: no effect (wick caches prefixes itself).
    pub cache_control: Option<Value>,
    /// Citations of a document: wick takes no documents.
    pub citations: Option<Value>,
    /// `image`: the picture, inline (`base64`) or by `url`.
    pub source: Option<ImageSource>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// An image block's source: `{"type": "base64", "media_type", "data"}`, or
/// `{"type": "url", "url"}` (which wick does not fetch).
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ImageSource {
    #[serde(rename = "type")]
    pub kind: String,
    pub media_type: Option<String>,
    pub data: Option<String>,
    pub url: Option<String>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// Required: the arguments' JSON schema.
    pub input_schema: Option<Value>,
    /// `custom` (or absent): Anthropic's server tools are not served.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// As chat's `strict`: forced calls follow the schema whatever it says.
    pub strict: Option<bool>,
    /// Fine-grained tool streaming (the AI SDK sends it): the input
    /// streams as `input_json_delta`s as it is generated, which wick does
    /// for every tool.
    pub eager_input_streaming: Option<bool>,
    pub cache_control: Option<Value>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `{"type": "auto" | "any" | "tool" | "none", "name",
/// "disable_parallel_tool_use"}`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicToolChoice)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub disable_parallel_tool_use: Option<bool>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `{"type": "enabled", "budget_tokens"}` or `{"type": "disabled"}`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    pub budget_tokens: Option<u32>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicMetadata)]
pub struct Metadata {
    pub user_id: Option<String>,
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

/// What shapes the prompt, from either request.
struct Prompt<'r> {
    messages: &'r [InputMessage],
    system: Option<&'r Content>,
    tools: Option<&'r [Tool]>,
    tool_choice: Option<&'r ToolChoice>,
    thinking: Option<&'r Thinking>,
    /// `max_tokens`, against which a thinking budget is checked.
    max_tokens: Option<u32>,
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

impl Prompt<'_> {
    /// The prompt's fields translated into `sampling`, the chat request
    /// that carries the rest. Each chat turn keeps the Anthropic field it
    /// came from (`system`, `messages[2]`, `messages[3].content[0]`).
    fn translate(
        &self,
        ctx: &ModelContext,
        sampling: ChatCompletionRequest,
    ) -> Result<ChatCompletionRequest, ApiError> {
        let mut messages = Vec::new();
        if let Some(system) = self.system {
            messages.push(turn("system", Some(texts(system, "system")?), "system"));
        }
        if self.messages.is_empty() {
            return Err(bad("messages must not be empty", "messages"));
        }
        // Each tool_use id by its function's name, for the results.
        let mut calls = Calls::new();
        for (k, m) in self.messages.iter().enumerate() {
            let at = format!("messages[{k}]");
            unsupported::refuse(&m.unknown, &at)?;
            match m.role.as_str() {
                "user" => messages.extend(user_turns(&m.content, &at, &calls)?),
                "assistant" if k + 1 == self.messages.len() => {
                    return Err(bad(
                        "the last message must be the user's: wick does not continue a final \
                         assistant message (prefill)",
                        &format!("{at}.role"),
                    ))
                }
                "assistant" => messages.push(assistant_turn(&m.content, &at, &mut calls)?),
                other => {
                    return Err(bad(
                        format!(
                            "role must be \"user\" or \"assistant\", got {:?} (a system prompt \
                             goes in the top-level `system`)",
                            clip(other, MAX_ECHO_CHARS)
                        ),
                        &format!("{at}.role"),
                    ))
                }
            }
        }
        // An empty list is no tools (chat would refuse it).
        let tools = match self.tools.filter(|t| !t.is_empty()) {
            Some(tools) => Some(translate_tools(tools)?),
            None => None,
        };
        let (tool_choice, parallel_tool_calls) = match self.tool_choice {
            Some(choice) => {
                let (choice, parallel) = translate_tool_choice(choice)?;
                (Some(choice), parallel)
            }
            None => (None, None),
        };
        Ok(ChatCompletionRequest {
            messages,
            tools,
            tool_choice,
            parallel_tool_calls,
            chat_template_kwargs: self.thinking_kwargs(ctx)?,
            ..sampling
        })
    }

    /// `thinking` as the template's `enable_thinking`, where it reads one.
    /// A template that does not think takes `disabled` (it has nothing to
    /// disable) and refuses `enabled`; one that always thinks refuses
    /// `disabled`. `budget_tokens` is checked as Anthropic checks it; the
    /// thinking is bounded by `max_tokens` alone.
    fn thinking_kwargs(&self, ctx: &ModelContext) -> Result<Option<Map<String, Value>>, ApiError> {
        let Some(t) = self.thinking else {
            return Ok(None);
        };
        unsupported::refuse(&t.unknown, "thinking")?;
        let template = ctx.chat_template;
        // gpt-oss always thinks, in harmony's analysis channel.
        let thinks = template.is_some_and(|t| {
            ReasoningParser::template_thinks(t.source())
                || harmony::template_speaks_harmony(t.source())
        });
        let switch = template.is_some_and(|t| t.reads("enable_thinking"));
        let enable = match t.kind.as_str() {
            "enabled" => true,
            "disabled" => false,
            other => {
                return Err(ApiError::unsupported_value(
                    "thinking.type",
                    format!(
                        "thinking type must be \"enabled\" or \"disabled\", got {:?}",
                        clip(other, MAX_ECHO_CHARS)
                    ),
                ))
            }
        };
        match (enable, t.budget_tokens) {
            (true, None) => {
                return Err(bad(
                    "thinking of type enabled needs budget_tokens",
                    "thinking.budget_tokens",
                ))
            }
            (true, Some(b)) if b < MIN_THINKING_BUDGET => {
                return Err(bad(
                    format!("budget_tokens must be at least {MIN_THINKING_BUDGET}, got {b}"),
                    "thinking.budget_tokens",
                ))
            }
            (true, Some(b)) if self.max_tokens.is_some_and(|m| b >= m) => {
                return Err(bad(
                    format!("budget_tokens ({b}) must be less than max_tokens"),
                    "thinking.budget_tokens",
                ))
            }
            (false, Some(_)) => {
                return Err(bad(
                    "budget_tokens is only taken with thinking of type enabled",
                    "thinking.budget_tokens",
                ))
            }
            _ => {}
        }
        match (enable, thinks, switch) {
            (_, true, true) => Ok(Some(Map::from_iter([(
                "enable_thinking".to_string(),
                Value::Bool(enable),
            )]))),
            (false, false, _) | (true, true, false) => Ok(None),
            (true, false, _) => Err(ApiError::unsupported_value(
                "thinking.type",
                "this model does not think: its chat template writes no thinking block; \
                 leave thinking out or set it to {\"type\": \"disabled\"}",
            )),
            (false, true, false) => Err(ApiError::unsupported_value(
                "thinking.type",
                "this model always thinks: its chat template has no switch \
                 (`enable_thinking`) to turn thinking off",
            )),
        }
    }
}

/// A chat turn of `role` with text `content`, from the field at `origin`.
fn turn(role: &str, content: Option<String>, origin: &str) -> ChatRequestMessage {
    ChatRequestMessage {
        role: role.into(),
        content: content.map(MessageContent::Text),
        origin: Some(origin.into()),
        ..Default::default()
    }
}

/// Text blocks (or a string) as one text, joined by newlines as chat's
/// text parts are.
fn texts(content: &Content, at: &str) -> Result<String, ApiError> {
    let blocks = match content {
        Content::Text(t) => return Ok(t.clone()),
        Content::Blocks(b) => b,
    };
    let mut out = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        if b.kind != "text" {
            return Err(block_type(&b.kind, &format!("{at}.type"), "text"));
        }
        out.push(text_block(b, &at)?);
    }
    Ok(out.join("\n"))
}

fn block_type(kind: &str, param: &str, allowed: &str) -> ApiError {
    ApiError::unsupported_value(
        param,
        format!(
            "content block type {:?} is not supported here: only {allowed}",
            clip(kind, MAX_ECHO_CHARS)
        ),
    )
}

/// Refuses the first field of `b` set that its kind does not carry
/// (`cache_control` and `unknown` fields aside, checked by the caller).
fn only(b: &Block, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    unsupported::refuse(&b.unknown, at)?;
    let set = [
        ("text", b.text.is_some()),
        ("id", b.id.is_some()),
        ("name", b.name.is_some()),
        ("input", b.input.is_some()),
        ("tool_use_id", b.tool_use_id.is_some()),
        ("content", b.content.is_some()),
        ("is_error", b.is_error.is_some()),
        ("thinking", b.thinking.is_some()),
        ("signature", b.signature.is_some()),
        ("citations", b.citations.is_some()),
        ("source", b.source.is_some()),
    ];
    match set
        .iter()
        .find(|(name, set)| *set && !allowed.contains(name))
    {
        Some((name, _)) => Err(ApiError::unsupported_parameter(&format!("{at}.{name}"))),
        None => Ok(()),
    }
}

fn required<'b, T>(
    field: &'b Option<T>,
    at: &str,
    name: &str,
    kind: &str,
) -> Result<&'b T, ApiError> {
    field.as_ref().ok_or_else(|| {
        bad(
            format!("a {kind} block needs `{name}`"),
            &format!("{at}.{name}"),
        )
    })
}

fn text_block(b: &Block, at: &str) -> Result<String, ApiError> {
    only(b, &["text"], at)?;
    Ok(required(&b.text, at, "text", "text")?.clone())
}

/// A user message: its tool results as tool turns, then its text as a
/// user turn (tool results come first, as Anthropic requires).
fn user_turns(
    content: &Content,
    at: &str,
    calls: &Calls,
) -> Result<Vec<ChatRequestMessage>, ApiError> {
    let blocks = match content {
        Content::Text(t) => return Ok(vec![turn("user", Some(t.clone()), at)]),
        Content::Blocks(b) if b.is_empty() => {
            return Err(bad("content must not be empty", &format!("{at}.content")))
        }
        Content::Blocks(b) => b,
    };
    let mut turns = Vec::new();
    let mut parts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at_block = format!("{at}.content[{j}]");
        match b.kind.as_str() {
            "text" => parts.push(ContentPart::text(text_block(b, &at_block)?)),
            "image" => parts.push(image_block(b, &at_block)?),
            "tool_result" if !parts.is_empty() => {
                return Err(bad(
                    "tool_result blocks must come before any text in a user message",
                    &format!("{at_block}.type"),
                ))
            }
            "tool_result" => turns.push(tool_result(b, &at_block, calls)?),
            "tool_use" | "thinking" => {
                return Err(bad(
                    format!("{} blocks belong in assistant messages", b.kind),
                    &format!("{at_block}.type"),
                ))
            }
            other => {
                return Err(block_type(
                    other,
                    &format!("{at_block}.type"),
                    "text, image and tool_result in a user message",
                ))
            }
        }
    }
    if parts.iter().all(|p| p.image_url.is_none()) {
        let joined: Vec<String> = parts.into_iter().filter_map(|p| p.text).collect();
        if !joined.is_empty() {
            turns.push(turn("user", Some(joined.join("\n")), at));
        }
    } else {
        turns.push(ChatRequestMessage {
            content: Some(MessageContent::Parts(parts)),
            ..turn("user", None, at)
        });
    }
    Ok(turns)
}

/// An image block as chat's image part: an inline image as its `data:`
/// URL, a URL as itself (refused where URLs are not fetched).
fn image_block(b: &Block, at: &str) -> Result<ContentPart, ApiError> {
    only(b, &["source"], at)?;
    let source = required(&b.source, at, "source", "image")?;
    let at = format!("{at}.source");
    unsupported::refuse(&source.unknown, &at)?;
    let field = |name: &str, value: &Option<String>| {
        value.clone().ok_or_else(|| {
            bad(
                format!("a {} image source needs `{name}`", source.kind),
                &format!("{at}.{name}"),
            )
        })
    };
    let url = match source.kind.as_str() {
        "base64" => {
            let media_type = field("media_type", &source.media_type)?;
            format!("data:{media_type};base64,{}", field("data", &source.data)?)
        }
        "url" => field("url", &source.url)?,
        other => {
            return Err(ApiError::unsupported_value(
                &format!("{at}.type"),
                format!(
                    "image source type {:?} is not supported: only base64 and url",
                    clip(other, MAX_ECHO_CHARS)
                ),
            ))
        }
    };
    Ok(ContentPart::image(url, None))
}

/// The tool calls of the assistant messages so far: each id's tool name.
type Calls = HashMap<String, String>;

/// A tool result as a tool turn. `is_error` is shown to the model as an
/// `Error: ` before the output, the only way a template can show it.
fn tool_result(b: &Block, at: &str, calls: &Calls) -> Result<ChatRequestMessage, ApiError> {
    only(b, &["tool_use_id", "content", "is_error"], at)?;
    let id = required(&b.tool_use_id, at, "tool_use_id", "tool_result")?;
    let Some(name) = calls.get(id) else {
        return Err(bad(
            format!(
                "tool_use_id {:?} answers no tool_use block of an earlier assistant message",
                clip(id, MAX_ECHO_CHARS)
            ),
            &format!("{at}.tool_use_id"),
        ));
    };
    let mut output = match &b.content {
        None => String::new(),
        Some(c) => texts(c, &format!("{at}.content"))?,
    };
    if b.is_error == Some(true) {
        output.insert_str(0, "Error: ");
    }
    Ok(ChatRequestMessage {
        tool_call_id: Some(id.clone()),
        name: Some(name.clone()),
        ..turn("tool", Some(output), at)
    })
}

/// An assistant message: its text, its thinking and its tool calls as
/// one turn; each call's id is recorded for the results that follow.
fn assistant_turn(
    content: &Content,
    at: &str,
    calls: &mut Calls,
) -> Result<ChatRequestMessage, ApiError> {
    let blocks = match content {
        Content::Text(t) => return Ok(turn("assistant", Some(t.clone()), at)),
        Content::Blocks(b) if b.is_empty() => {
            return Err(bad("content must not be empty", &format!("{at}.content")))
        }
        Content::Blocks(b) => b,
    };
    let (mut text, mut thinking, mut tool_calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match b.kind.as_str() {
            "text" => text.push(text_block(b, &at)?),
            "thinking" => {
                // The signature proves Anthropic wrote the thinking; wick
                // keeps none, so it has nothing to check.
                only(b, &["thinking", "signature"], &at)?;
                thinking.push(required(&b.thinking, &at, "thinking", "thinking")?.clone());
            }
            "tool_use" => {
                only(b, &["id", "name", "input"], &at)?;
                let id = required(&b.id, &at, "id", "tool_use")?;
                let name = required(&b.name, &at, "name", "tool_use")?;
                let input = required(&b.input, &at, "input", "tool_use")?;
                let Some(input) = input.as_object() else {
                    return Err(bad(
                        "a tool_use block's input must be an object",
                        &format!("{at}.input"),
                    ));
                };
                if calls.insert(id.clone(), name.clone()).is_some() {
                    return Err(bad(
                        format!("tool_use id {:?} is used twice", clip(id, MAX_ECHO_CHARS)),
                        &format!("{at}.id"),
                    ));
                }
                tool_calls.push(RequestToolCall {
                    id: id.clone(),
                    kind: "function".into(),
                    function: RequestFunctionCall {
                        name: name.clone(),
                        arguments: FunctionArguments::Object(input.clone()),
                        unknown: UnknownFields::default(),
                    },
                    unknown: UnknownFields::default(),
                });
            }
            "tool_result" => {
                return Err(bad(
                    "tool_result blocks belong in user messages",
                    &format!("{at}.type"),
                ))
            }
            other => {
                return Err(block_type(
                    other,
                    &format!("{at}.type"),
                    "text, thinking and tool_use in an assistant message",
                ))
            }
        }
    }
    // Calls alone have no content, as chat sends them.
    let content = (!text.is_empty() || tool_calls.is_empty()).then(|| text.join("\n"));
    Ok(ChatRequestMessage {
        reasoning_content: (!thinking.is_empty()).then(|| thinking.join("\n")),
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        ..turn("assistant", content, at)
    })
}

/// Anthropic's tools as OpenAI function tools.
fn translate_tools(tools: &[Tool]) -> Result<Vec<ToolDefinition>, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        unsupported::refuse(&t.unknown, &at)?;
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::unsupported_value(
                &format!("{at}.type"),
                format!(
                    "tool type {:?} is not supported: only custom tools (wick runs no server \
                     tools)",
                    clip(kind, MAX_ECHO_CHARS)
                ),
            ));
        }
        let schema = t.input_schema.as_ref().ok_or_else(|| {
            bad(
                "a tool needs an input_schema",
                &format!("{at}.input_schema"),
            )
        })?;
        out.push(ToolDefinition {
            kind: "function".into(),
            function: FunctionDefinition {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: Some(schema.clone()),
                strict: t.strict,
                unknown: UnknownFields::default(),
            },
            unknown: UnknownFields::default(),
        });
    }
    Ok(out)
}

/// `tool_choice` as chat's, and `parallel_tool_calls` when it says.
fn translate_tool_choice(c: &ToolChoice) -> Result<(ChatToolChoice, Option<bool>), ApiError> {
    unsupported::refuse(&c.unknown, "tool_choice")?;
    if c.name.is_some() && c.kind != "tool" {
        return Err(bad(
            "tool_choice.name is only taken with type tool",
            "tool_choice.name",
        ));
    }
    let mode = |m: &str| ChatToolChoice::Mode(m.into());
    let choice = match c.kind.as_str() {
        "auto" => mode("auto"),
        "any" => mode("required"),
        "none" => mode("none"),
        "tool" => {
            let name = c.name.as_ref().ok_or_else(|| {
                bad(
                    "tool_choice of type tool needs the tool's name",
                    "tool_choice.name",
                )
            })?;
            ChatToolChoice::Named(NamedToolChoice {
                kind: "function".into(),
                function: ToolChoiceFunction {
                    name: name.clone(),
                    unknown: UnknownFields::default(),
                },
                unknown: UnknownFields::default(),
            })
        }
        other => {
            return Err(bad(
                format!(
                    "tool_choice type must be \"auto\", \"any\", \"tool\" or \"none\", got {:?}",
                    clip(other, MAX_ECHO_CHARS)
                ),
                "tool_choice.type",
            ))
        }
    };
    Ok((choice, c.disable_parallel_tool_use.map(|d| !d)))
}

/// Chat's fields as this API names them, for errors (messages name their
/// own origins).
const NAMES: FieldNames = FieldNames {
    stop: "stop_sequences",
    chat_template_kwargs: "thinking",
    tool_choice_name: "tool_choice.name",
    tool_function: "",
    tool_parameters: ".input_schema",
    ..FieldNames::CHAT
};

/// Checks a request in Anthropic's terms and validates its chat twin,
/// whose errors name the Anthropic fields.
fn validate_as_chat(
    prompt: &Prompt,
    ctx: &ModelContext,
    sampling: ChatCompletionRequest,
) -> Result<GenerationPlan, ApiError> {
    validate_chat(&prompt.translate(ctx, sampling)?, ctx)
}

fn validate(req: &MessagesRequest, ctx: &ModelContext) -> Result<GenerationPlan, ApiError> {
    unsupported::refuse(&req.unknown, "")?;
    if let Some(m) = &req.metadata {
        unsupported::refuse(&m.unknown, "metadata")?;
    }
    if let Some(t) = req.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(bad(
            format!("temperature must be in [0, 1], got {t}"),
            "temperature",
        ));
    }
    let stops = req.stop_sequences.as_deref().unwrap_or_default();
    if stops.iter().any(String::is_empty) {
        return Err(bad(
            "stop_sequences must not contain an empty string",
            "stop_sequences",
        ));
    }
    let sampling = ChatCompletionRequest {
        model: req.model.clone(),
        max_tokens: Some(req.max_tokens),
        stream: req.stream,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences.clone().map(Stop::Many),
        names: NAMES,
        ..Default::default()
    };
    let prompt = Prompt {
        messages: &req.messages,
        system: req.system.as_ref(),
        tools: req.tools.as_deref(),
        tool_choice: req.tool_choice.as_ref(),
        thinking: req.thinking.as_ref(),
        max_tokens: Some(req.max_tokens),
    };
    validate_as_chat(&prompt, ctx, sampling)
}

fn validate_count(
    req: &CountTokensRequest,
    ctx: &ModelContext,
) -> Result<GenerationPlan, ApiError> {
    unsupported::refuse(&req.unknown, "")?;
    let prompt = Prompt {
        messages: &req.messages,
        system: req.system.as_ref(),
        tools: req.tools.as_deref(),
        tool_choice: req.tool_choice.as_ref(),
        thinking: req.thinking.as_ref(),
        max_tokens: None,
    };
    let sampling = ChatCompletionRequest {
        model: req.model.clone(),
        max_tokens: Some(1),
        names: NAMES,
        ..Default::default()
    };
    validate_as_chat(&prompt, ctx, sampling)
}

pub async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<AccessRecord>,
    headers: HeaderMap,
    body: Request,
) -> Result<Response, AnthropicError> {
    let (g, plan) = generation::begin::<MessagesRequest>(&state, body, validate, access).await?;
    let id = format!("msg_{}", request_id(&headers).replace('-', ""));
    let blocks = Blocks::new(&plan, id, g.model().name.clone());
    Ok(respond(g, &plan, blocks, state.limits.sse_keep_alive).await?)
}

/// `{"input_tokens": N}`: the prompt the same request would run, in tokens.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Request,
) -> Result<Response, AnthropicError> {
    let JsonBody(req) = JsonBody::<CountTokensRequest>::from_request(body, &state).await?;
    let model = handlers::ready(&state)?;
    let plan = handlers::plan(&model, req, validate_count).await?;
    let tokens = plan.prompts.first().map_or(0, |p| p.tokens.len());
    Ok(Json(json!({"input_tokens": tokens})).into_response())
}

/// 405 on the Anthropic paths, in Anthropic's shape.
pub async fn method_not_allowed() -> AnthropicError {
    AnthropicError(ApiError::method_not_allowed())
}

/// An [`ApiError`] in Anthropic's shape, with its status (and
/// `Retry-After`).
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut response = (e.status, Json(error_body(&e))).into_response();
        if let Some(secs) = e.retry_after {
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
    use axum::http::StatusCode;

    fn prompt_of(req: &MessagesRequest) -> Prompt<'_> {
        Prompt {
            messages: &req.messages,
            system: req.system.as_ref(),
            tools: req.tools.as_deref(),
            tool_choice: req.tool_choice.as_ref(),
            thinking: req.thinking.as_ref(),
            max_tokens: Some(req.max_tokens),
        }
    }

    fn request(body: Value) -> MessagesRequest {
        let mut full = json!({"max_tokens": 16});
        full.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        serde_json::from_value(full).unwrap()
    }

    /// A model with no template: the checks that need one pass.
    fn context(tokenizer: &crate::text::tokenizer::Tokenizer) -> ModelContext<'_> {
        use crate::server::images::ImageBudget;
        ModelContext {
            name: "m",
            aliases: &[],
            vocab_size: 10,
            max_context: 100,
            max_seq_tokens: 100,
            max_choices: 1,
            tokenizer,
            chat_template: None,
            constraints: None,
            images: None,
            image_budget: ImageBudget::default(),
            fetched: &crate::media::fetch::NOTHING_FETCHED,
        }
    }

    /// The chat messages a request's conversation becomes (no template:
    /// the checks that need one pass).
    fn chat_messages(body: Value) -> Result<(Vec<String>, Vec<ChatRequestMessage>), ApiError> {
        let req = request(body);
        let tokenizer = crate::text::tokenizer::test_tokenizer();
        let ctx = context(&tokenizer);
        let mut chat = prompt_of(&req).translate(&ctx, ChatCompletionRequest::default())?;
        let origins = chat.messages.iter_mut().filter_map(|m| m.origin.take());
        Ok((origins.collect(), chat.messages))
    }

    /// Chat's own reading of what a translation should build.
    fn chat<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[track_caller]
    fn refused(body: Value, param: &str) -> String {
        let e = chat_messages(body).expect_err("should be refused");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        e.message
    }

    #[test]
    fn a_tool_round_trip_becomes_chat_turns() {
        let (origins, messages) = chat_messages(json!({
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should look.", "signature": ""},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "21 C"}]},
                    {"type": "text", "text": "And tomorrow?"}]}
            ]
        }))
        .unwrap();
        assert_eq!(
            messages,
            chat::<Vec<ChatRequestMessage>>(json!([
                {"role": "system", "content": "Be brief.\nUse tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Looking.", "reasoning_content": "I should look.",
                 "tool_calls": [{"id": "toolu_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "21 C"},
                {"role": "user", "content": "And tomorrow?"}
            ]))
        );
        assert_eq!(
            origins,
            [
                "system",
                "messages[0]",
                "messages[1]",
                "messages[2].content[0]",
                "messages[2]"
            ]
        );
        // The chat request is what validate_chat reads.
        crate::server::chat_messages::conversation(&messages, "messages").unwrap();
    }

    #[test]
    fn calls_alone_have_null_content_and_errors_are_marked() {
        let (_, messages) = chat_messages(json!({"messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": true,
                                          "content": "no network"}]}
        ]}))
        .unwrap();
        assert_eq!(messages[1].content, None);
        assert_eq!(
            messages[2].content,
            Some(MessageContent::Text("Error: no network".into()))
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_field() {
        let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
        refused(json!({"messages": []}), "messages");
        refused(
            json!({"messages": [{"role": "system", "content": "x"}]}),
            "messages[0].role",
        );
        let m = refused(
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]}),
            "messages[1].role",
        );
        assert!(m.contains("prefill"), "{m}");
        let m = refused(
            user(json!([{"type": "document", "source": {"type": "url", "url": "u"}}])),
            "messages[0].content[0].type",
        );
        assert!(m.contains("\"document\""), "{m}");
        refused(
            user(json!([{"type": "image"}])),
            "messages[0].content[0].source",
        );
        let m = refused(
            user(json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}])),
            "messages[0].content[0].source.file_id",
        );
        assert!(!m.is_empty());
        refused(
            user(json!([{"type": "image", "source": {"type": "file"}}])),
            "messages[0].content[0].source.type",
        );
        refused(
            user(json!([{"type": "image", "source": {"type": "base64", "data": "AA=="}}])),
            "messages[0].content[0].source.media_type",
        );
        refused(user(json!([])), "messages[0].content");
        refused(
            user(json!([{"type": "text"}])),
            "messages[0].content[0].text",
        );
        refused(
            user(json!([{"type": "text", "text": "x", "citations": [{}]}])),
            "messages[0].content[0].citations",
        );
        refused(
            user(json!([{"type": "text", "text": "x", "input": {}}])),
            "messages[0].content[0].input",
        );
        refused(
            user(json!([{"type": "tool_result", "tool_use_id": "nope", "content": "x"}])),
            "messages[0].content[0].tool_use_id",
        );
        refused(
            user(json!([{"type": "tool_use", "id": "a", "name": "f", "input": {}}])),
            "messages[0].content[0].type",
        );
        refused(
            json!({"messages": [{"role": "user", "content": "x", "weight": 2}]}),
            "messages[0].weight",
        );
        refused(
            json!({"system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]}),
            "system[0].type",
        );
        let call = |input: Value| {
            json!({"messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": input}]},
                {"role": "user", "content": [{"type": "text", "text": "y"},
                                             {"type": "tool_result", "tool_use_id": "a"}]}]})
        };
        refused(call(json!("{}")), "messages[1].content[0].input");
        refused(call(json!({})), "messages[2].content[1].type");
        refused(
            json!({"messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0].type",
        );
        refused(
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}),
            "tools[0].input_schema",
        );
        refused(
            json!({"messages": [{"role": "user", "content": "x"}],
                   "tool_choice": {"type": "tool"}}),
            "tool_choice.name",
        );
        refused(
            json!({"messages": [{"role": "user", "content": "x"}],
                   "tool_choice": {"type": "sometimes"}}),
            "tool_choice.type",
        );
        refused(
            json!({"messages": [{"role": "user", "content": "x"}],
                   "thinking": {"type": "enabled", "budget_tokens": 2048}}),
            "thinking.budget_tokens",
        );
        refused(
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4096,
                   "thinking": {"type": "enabled", "budget_tokens": 2048}}),
            "thinking.type",
        );
        // Nothing to disable on a model that does not think.
        chat_messages(json!({"messages": [{"role": "user", "content": "x"}],
                             "thinking": {"type": "disabled"}}))
        .unwrap();
    }

    #[test]
    fn chat_errors_name_anthropic_fields() {
        let tool = |name: &str| json!({"name": name, "input_schema": {}});
        for (body, param) in [
            (json!({"tools": [tool("f"), tool("a b")]}), "tools[1].name"),
            (
                json!({"tools": [{"name": "f", "input_schema": 3}]}),
                "tools[0].input_schema",
            ),
            (
                json!({"tools": [tool("f")], "tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice.name",
            ),
        ] {
            let mut body = body;
            body["messages"] = json!([{"role": "user", "content": "x"}]);
            let req = request(body.clone());
            let prompt = prompt_of(&req);
            let sampling = ChatCompletionRequest {
                names: NAMES,
                ..Default::default()
            };
            let tokenizer = crate::text::tokenizer::test_tokenizer();
            let chat = prompt.translate(&context(&tokenizer), sampling).unwrap();
            let e = crate::server::tools::plan(&chat, "").unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn tool_choices_and_tools() {
        let choice = |v: Value| translate_tool_choice(&serde_json::from_value(v).unwrap());
        assert_eq!(
            choice(json!({"type": "auto"})).unwrap(),
            (chat(json!("auto")), None)
        );
        assert_eq!(
            choice(json!({"type": "any", "disable_parallel_tool_use": true})).unwrap(),
            (chat(json!("required")), Some(false))
        );
        assert_eq!(
            choice(json!({"type": "tool", "name": "f"})).unwrap().0,
            chat(json!({"type": "function", "function": {"name": "f"}}))
        );
        assert_eq!(
            choice(json!({"type": "none"})).unwrap().0,
            chat(json!("none"))
        );
        assert_eq!(
            choice(json!({"type": "auto", "name": "f"}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("tool_choice.name")
        );
        let tools: Vec<Tool> = serde_json::from_value(json!([
            {"name": "f", "description": "d", "input_schema": {"type": "object"},
             "cache_control": {"type": "ephemeral"}, "type": "custom"}
        ]))
        .unwrap();
        assert_eq!(
            translate_tools(&tools).unwrap(),
            chat::<Vec<ToolDefinition>>(json!([{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object"}, "description": "d"}}]))
        );
    }

    #[test]
    fn errors_in_anthropic_shape() {
        let e = ApiError::bad_request("must be in [0, 1], got 3", Some("temperature"));
        assert_eq!(
            error_body(&e),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                   "message": "temperature: must be in [0, 1], got 3"}})
        );
        let e = ApiError::unsupported_parameter("thinking");
        assert!(error_body(&e)["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Unsupported parameter: 'thinking'"));
        for (e, kind) in [
            (ApiError::model_not_found("claude"), "not_found_error"),
            (ApiError::queue_full(1), "overloaded_error"),
            (ApiError::internal("x"), "api_error"),
            (ApiError::payload_too_large(1), "request_too_large"),
            (
                ApiError::unsupported_media_type(None),
                "invalid_request_error",
            ),
        ] {
            assert_eq!(error_body(&e)["error"]["type"], kind, "{e:?}");
        }
    }
}
