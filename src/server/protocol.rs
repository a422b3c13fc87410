//! The OpenAI wire schema (plus the vLLM and llama.cpp extensions wick
//! accepts). Every request object collects the fields it does not declare
//! in `unknown`, which validation refuses (`unsupported`): a field wick
//! would ignore is an answer the client did not ask for, so declaring a
//! field here is what makes wick accept it. Range checks live in
//! `validation`, not here: serde only enforces types, with one exception:
//! `metadata`'s bounds are checked while it is read, so a body of half a
//! million keys is refused at the 17th rather than built first.
//!
//! Null versus absent follows OpenAI's wire format: `finish_reason` and
//! `logprobs` are always present (null until known), `usage` appears only
//! where it is reported, and a chat delta omits the fields it does not carry.

use std::collections::{BTreeMap, HashMap};

use indexmap::IndexMap;
use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::server::error::{clip, MAX_ECHO_CHARS};

// On an untagged enum, `expecting` is the whole error message when no
// variant matches, hence its "expected ..." wording.

/// Completions `prompt`. Variant order matters to the untagged match: a list
/// of integers must become `Tokens` before `TokenBatches` or `Texts` are
/// tried, and an empty list lands in `Tokens` (rejected by validation).
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string, a list of strings, a list of token ids or a list of lists of token ids"
)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
    Texts(Vec<String>),
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or a list of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// OpenAI's `metadata`, for the client's own records: at most
/// [`MAX_METADATA_KEYS`] keys of at most [`MAX_METADATA_KEY_CHARS`]
/// characters, each value at most [`MAX_METADATA_VALUE_CHARS`], as OpenAI
/// bounds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct Metadata(pub IndexMap<String, String>);

pub const MAX_METADATA_KEYS: usize = 16;
pub const MAX_METADATA_KEY_CHARS: usize = 64;
pub const MAX_METADATA_VALUE_CHARS: usize = 512;

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Metadata;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of string values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
                let mut out = IndexMap::new();
                while let Some((key, value)) = map.next_entry::<String, String>()? {
                    if out.len() == MAX_METADATA_KEYS && !out.contains_key(&key) {
                        return Err(A::Error::custom(format!(
                            "metadata may hold at most {MAX_METADATA_KEYS} keys"
                        )));
                    }
                    if key.chars().count() > MAX_METADATA_KEY_CHARS {
                        return Err(A::Error::custom(format!(
                            "metadata keys may be at most {MAX_METADATA_KEY_CHARS} characters, \
                             got {:?}",
                            clip(&key, MAX_ECHO_CHARS)
                        )));
                    }
                    if value.chars().count() > MAX_METADATA_VALUE_CHARS {
                        return Err(A::Error::custom(format!(
                            "metadata values may be at most {MAX_METADATA_VALUE_CHARS} \
                             characters; the value of {key:?} has {}",
                            value.chars().count()
                        )));
                    }
                    out.insert(key, value);
                }
                Ok(Metadata(out))
            }
        }
        d.deserialize_map(Entries)
    }
}

/// The fields of a request object that its type does not declare, by
/// name, in the order sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct UnknownFields(pub serde_json::Map<String, serde_json::Value>);

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// vLLM's: `usage` (so far) on every chunk.
    pub continuous_usage_stats: Option<bool>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `POST /v1/completions`. Beyond OpenAI's fields: vLLM's `top_k`, `min_p`,
/// `repetition_penalty`, `ignore_eos`, `min_tokens`, `stop_token_ids`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    /// OpenAI's default is 16.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// -1 or 0 disable it (vLLM accepts both).
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Token id (as a decimal string, JSON keys being strings) to bias.
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Number of top alternatives per token, 0..=20.
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    /// Any int64, as OpenAI allows; bit-cast to the engine's u64 seed.
    pub seed: Option<i64>,
    /// Candidates per returned choice: only `n` itself (each choice its own
    /// best) is served.
    pub best_of: Option<u32>,
    /// The end user, for the client's own records: changes nothing.
    pub user: Option<String>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u32>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM's: the prompt shares prefix-cache blocks only with prompts of
    /// the same salt, so one tenant cannot time another's cached prompts.
    pub cache_salt: Option<String>,
    pub response_format: Option<ResponseFormat>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `{"type": "text"}`, `{"type": "json_object"}` or `{"type":
/// "json_schema", "json_schema": {"name", "schema", "strict"}}`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<serde_json::Value>,
    /// Output follows the schema exactly: wick always constrains it so.
    pub strict: Option<bool>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// One content part of a chat message: `text`, or `image_url` for a model
/// that takes images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<ImageUrl>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

impl ContentPart {
    /// A text part, as the APIs that translate into chat build one.
    pub fn text(text: String) -> Self {
        ContentPart {
            kind: "text".into(),
            text: Some(text),
            image_url: None,
            unknown: UnknownFields::default(),
        }
    }

    /// An image part of `url`, at `detail`.
    pub fn image(url: String, detail: Option<String>) -> Self {
        ContentPart {
            kind: "image_url".into(),
            text: None,
            image_url: Some(ImageUrl {
                url,
                detail,
                unknown: UnknownFields::default(),
            }),
            unknown: UnknownFields::default(),
        }
    }
}

/// An image part's image: a `data:` URL, and OpenAI's level of detail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageUrl {
    pub url: String,
    /// `auto` or `high`: the model sees every image at its own full
    /// resolution. `low` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string or a list of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// OpenAI's predicted output: what the answer is expected to be, mostly
/// (a file being edited, say), for decode rows to draft from.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct Prediction {
    /// Only `"content"`.
    #[serde(rename = "type")]
    pub kind: String,
    pub content: MessageContent,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// One turn of a chat request, as OpenAI's API takes it, agent loops
/// included: `system`, `developer` (OpenAI's newer name for system),
/// `user`, `assistant` (possibly calling tools) and `tool` (a call's
/// result). `chat_messages` turns it into what the template sees. Built
/// by `/v1/messages` and `/v1/responses` too; the latter keeps the turns
/// of a conversation serialised (as sent: absent stays absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatRequestMessage {
    pub role: String,
    /// Null or absent only on an assistant turn that calls tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// The participant's name, which some templates show.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's thinking, as wick returned it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls an assistant turn made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<RequestToolCall>>,
    /// The deprecated form of one call ([`crate::server::legacy_functions`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_call: Option<RequestFunctionCall>,
    /// On a `tool` turn: the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On an assistant turn: what OpenAI returned beside its text (URL
    /// citations), replayed by clients. Output metadata: not shown to the
    /// model, so accepted and left unused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<serde_json::Value>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
    /// Where a translated turn came from, as its client named it
    /// (`messages[2].content[0]`, `input[3]`): what its errors name.
    /// Unset, chat's own `messages[i]`.
    #[serde(skip)]
    pub origin: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RequestToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: RequestFunctionCall,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RequestFunctionCall {
    pub name: String,
    pub arguments: FunctionArguments,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// A call's arguments: OpenAI sends the JSON object as a string; some
/// clients send the object itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected a string of JSON or an object")]
pub enum FunctionArguments {
    Json(String),
    Object(serde_json::Map<String, serde_json::Value>),
}

/// `POST /v1/chat/completions`: the completions sampling fields plus chat's
/// own. `max_completion_tokens` (OpenAI's newer name) wins over `max_tokens`.
/// `Default` for the APIs that translate into it, setting what they carry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatRequestMessage>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub logprobs: Option<bool>,
    /// 0..=20, only with `logprobs: true`.
    pub top_logprobs: Option<u32>,
    pub seed: Option<i64>,
    /// Output kinds: only `["text"]` is served.
    pub modalities: Option<Vec<String>>,
    pub prediction: Option<Prediction>,
    // Metadata for the client's own records at OpenAI (who asked, whether
    // and how to keep the completion, the processing tier): changes no
    // output, so accepted and left unused.
    pub user: Option<String>,
    pub store: Option<bool>,
    pub metadata: Option<Metadata>,
    pub service_tier: Option<String>,
    // OpenAI's prompt-cache routing key and the end user's id for abuse
    // checks: no effect on output (wick's prefix cache needs no key).
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    /// GPT-5's answer length (`low`, `medium`, `high`): no chat template
    /// reads it, so it is refused rather than ignored.
    pub verbosity: Option<String>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u32>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM's: the prompt shares prefix-cache blocks only with prompts of
    /// the same salt, so one tenant cannot time another's cached prompts.
    pub cache_salt: Option<String>,
    /// Functions the model may call (OpenAI's `{"type": "function",
    /// "function": {…}}`), shown to it through the chat template.
    pub tools: Option<Vec<ToolDefinition>>,
    pub tool_choice: Option<ToolChoice>,
    /// OpenAI's deprecated form of `tools` ([`crate::server::legacy_functions`]).
    pub functions: Option<Vec<FunctionDefinition>>,
    /// OpenAI's deprecated form of `tool_choice`.
    pub function_call: Option<LegacyFunctionCall>,
    /// Whether one reply may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    /// Variables for the chat template (vLLM's), e.g. `enable_thinking`.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// How hard a thinking model thinks (`"low"`, `"high"`…), passed to
    /// chat templates that read `reasoning_effort` (gpt-oss's), refused for
    /// others.
    pub reasoning_effort: Option<String>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
    /// What the client calls these fields, for errors to name them so: a
    /// translated request's API's names, chat's own by default.
    #[serde(skip)]
    pub names: FieldNames,
}

/// The names errors give a chat request's fields where a translating API
/// calls them otherwise (its messages name their own [`origin`]s).
///
/// [`origin`]: ChatRequestMessage::origin
#[derive(Debug, Clone, PartialEq)]
pub struct FieldNames {
    pub messages: &'static str,
    pub max_tokens: &'static str,
    pub stop: &'static str,
    pub response_format: &'static str,
    /// Where `response_format.json_schema`'s own fields are.
    pub json_schema: &'static str,
    pub reasoning_effort: &'static str,
    pub chat_template_kwargs: &'static str,
    pub tool_choice_name: &'static str,
    /// Where a tool's function's fields are, after `tools[i]`.
    pub tool_function: &'static str,
    /// A tool's `parameters`, after `tools[i]`.
    pub tool_parameters: &'static str,
}

impl FieldNames {
    pub const CHAT: FieldNames = FieldNames {
        messages: "messages",
        max_tokens: "max_tokens",
        stop: "stop",
        response_format: "response_format",
        json_schema: "response_format.json_schema",
        reasoning_effort: "reasoning_effort",
        chat_template_kwargs: "chat_template_kwargs",
        tool_choice_name: "tool_choice.function.name",
        tool_function: ".function",
        tool_parameters: ".function.parameters",
    };
}

impl Default for FieldNames {
    fn default() -> Self {
        Self::CHAT
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolDefinition {
    /// Only `"function"`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten, skip_serializing)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of the arguments object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// Arguments must follow `parameters` exactly: wick constrains forced
    /// calls to the schema whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten, skip_serializing)]
    pub unknown: UnknownFields,
}

/// `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function":
/// {"name": …}}`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(
    untagged,
    expecting = "expected \"none\", \"auto\", \"required\" or a named function"
)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

/// `"none"`, `"auto"` or `{"name": …}`: the deprecated `function_call`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(untagged, expecting = "expected \"none\", \"auto\" or {\"name\": …}")]
pub enum LegacyFunctionCall {
    Mode(String),
    Named(ToolChoiceFunction),
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: ToolChoiceFunction,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ToolChoiceFunction {
    pub name: String,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Where speculative decoding drafted for the request (OpenAI's
    /// predicted-output counts): drafted tokens kept, and rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: u64,
    pub rejected_prediction_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose K/V came from the prefix cache.
    pub cached_tokens: usize,
}

/// OpenAI's legacy completions logprobs: parallel lists, one entry per token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    /// Most likely first, as OpenAI lists them.
    pub top_logprobs: Vec<Option<IndexMap<String, f32>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Adds `more`'s tokens after this one's.
    pub fn append(&mut self, more: CompletionLogprobs) {
        self.tokens.extend(more.tokens);
        self.token_logprobs.extend(more.token_logprobs);
        self.top_logprobs.extend(more.top_logprobs);
        self.text_offset.extend(more.text_offset);
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<String>,
}

/// The envelope every generation answer shares: a whole completion or chat
/// response, or one stream chunk. Chunks carry no `usage` except the final
/// usage chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Response<C> {
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A whole completion, and also each completions stream chunk (OpenAI uses
/// the same object for both).
pub type CompletionResponse = Response<CompletionChoice>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    /// UTF-8 bytes of `token`.
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseMessage {
    pub role: String,
    /// Null when the reply is only tool calls, as OpenAI sends it.
    pub content: Option<String>,
    /// The model's thinking, apart from its answer (models that think).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ResponseToolCall>>,
    /// The call, for a request in the deprecated `functions` form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<ResponseFunctionCall>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseToolCall {
    pub id: String,
    /// `"function"`
    #[serde(rename = "type")]
    pub kind: String,
    pub function: ResponseFunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseFunctionCall {
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
}

/// A piece of one tool call in a stream: the first carries its `id`,
/// `type` and name, the rest pieces of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

pub type ChatCompletionResponse = Response<ChatChoice>;

/// What a chat stream chunk adds to a choice. The first carries the role,
/// the last (with the finish reason) is empty: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// `Some(None)` is sent as `"content": null`: OpenAI's first delta of a
    /// reply that is tool calls alone.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub content: Option<Option<String>>,
    /// The model's thinking, apart from its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// A piece of the call, for a request in the deprecated `functions`
    /// form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCallDelta>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

pub type ChatCompletionChunk = Response<ChunkChoice>;

/// A field that is present, null included (absent is `None` by default).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// One entry of `GET /v1/models`; `max_model_len` is vLLM's extension.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelCard {
    pub id: String,
    /// `model`
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    pub max_model_len: usize,
    /// What a prompt may hold: `["text"]`, or `["text", "image"]` for a
    /// model that takes images.
    pub input_modalities: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    /// `list`
    pub object: String,
    pub data: Vec<ModelCard>,
}

/// `GET /tokenizer_info`, as vLLM answers it: the tokenizer's settings in
/// the shape of transformers' `tokenizer_config.json`, for clients that
/// tokenize and render chat prompts themselves (lm-eval's remote
/// tokenizer reads `eos_token`, `bos_token`, `pad_token`, `chat_template`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenizerInfo {
    /// The transformers class the tokenizer corresponds to.
    pub tokenizer_class: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    /// The served context (`--max-model-len` when set).
    pub model_max_length: usize,
    /// wick decodes text as the tokenizer spells it, without transformers'
    /// clean-up of spaces before punctuation.
    pub clean_up_tokenization_spaces: bool,
    /// Every added token by id, as transformers lists them (JSON's keys
    /// are strings of the ids).
    #[schema(value_type = BTreeMap<String, AddedTokenInfo>)]
    pub added_tokens_decoder: BTreeMap<u32, AddedTokenInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AddedTokenInfo {
    pub content: String,
    pub lstrip: bool,
    pub normalized: bool,
    pub rstrip: bool,
    pub single_word: bool,
    pub special: bool,
}

/// `POST /tokenize`: vLLM sends `prompt`, llama.cpp `content`.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    /// vLLM's clients name the model; it must be a served name.
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub content: Option<String>,
    pub add_special_tokens: Option<bool>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
    /// Fields this type does not declare, refused by validation.
    #[schema(ignore)]
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// The text under both names: vLLM clients read `prompt`, llama.cpp's
/// `content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
    pub content: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn completion(body: Value) -> CompletionRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn prompt_shapes() {
        let p = |v: Value| completion(json!({"prompt": v})).prompt;
        assert_eq!(p(json!("hi")), Prompt::Text("hi".into()));
        assert_eq!(p(json!([1, 2, 3])), Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(p(json!([])), Prompt::Tokens(vec![]));
        assert_eq!(
            p(json!([[1], [2, 3]])),
            Prompt::TokenBatches(vec![vec![1], vec![2, 3]])
        );
        assert_eq!(
            p(json!(["a", "b"])),
            Prompt::Texts(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn bad_prompts_name_the_accepted_shapes() {
        for bad in [
            json!([-1]),
            json!(["a", 1]),
            json!(3),
            json!([[1], "a"]),
            json!(null),
        ] {
            let err = serde_json::from_value::<CompletionRequest>(json!({"prompt": bad}))
                .unwrap_err()
                .to_string();
            assert!(err.contains("a list of token ids"), "{err}");
        }
    }

    #[test]
    fn missing_prompt_is_an_error() {
        let err = serde_json::from_value::<CompletionRequest>(json!({"model": "m"})).unwrap_err();
        assert_eq!(err.to_string(), "missing field `prompt`");
    }

    #[test]
    fn unknown_fields_are_collected_in_order_and_nulls_are_absent() {
        let r = completion(json!({
            "prompt": "x", "suffix": "y", "best_of": 2, "temperature": null, "stop": "\n",
            "guided_json": {"type": "object"}
        }));
        assert_eq!(r.temperature, None);
        assert_eq!(r.best_of, Some(2));
        assert_eq!(r.stop.map(Stop::into_vec), Some(vec!["\n".to_string()]));
        let unknown: Vec<&String> = r.unknown.0.keys().collect();
        assert_eq!(unknown, ["suffix", "guided_json"]);
        assert!(completion(json!({"prompt": "x"})).unknown.0.is_empty());
    }

    #[test]
    fn all_completion_fields() {
        let r = completion(json!({
            "model": "m", "prompt": "x", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
            "top_k": -1, "min_p": 0.1, "n": 2, "stream": true,
            "stream_options": {"include_usage": true}, "stop": ["a", "b"],
            "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1,
            "logit_bias": {"42": -100}, "logprobs": 3, "echo": true, "seed": -7,
            "user": "u", "ignore_eos": true, "min_tokens": 1, "stop_token_ids": [2]
        }));
        assert_eq!(r.top_k, Some(-1));
        assert_eq!(r.seed, Some(-7));
        assert_eq!(r.logit_bias.unwrap()["42"], -100.0);
        assert_eq!(r.stream_options.unwrap().include_usage, Some(true));
        assert_eq!(r.stop.unwrap().into_vec(), ["a", "b"]);
    }

    #[test]
    fn chat_content_string_or_parts() {
        let r: ChatCompletionRequest = serde_json::from_value(json!({
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}
            ],
            "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2
        }))
        .unwrap();
        assert_eq!(
            r.messages[0].content,
            Some(MessageContent::Text("be brief".into()))
        );
        let Some(MessageContent::Parts(parts)) = &r.messages[1].content else {
            panic!()
        };
        assert_eq!(
            parts[0],
            ContentPart {
                kind: "text".into(),
                text: Some("hi".into()),
                image_url: None,
                unknown: UnknownFields::default(),
            }
        );
        assert_eq!(parts[1].kind, "image_url");
        assert_eq!(
            parts[1].image_url.as_ref().map(|i| i.url.as_str()),
            Some("x")
        );
        assert_eq!(parts[1].text, None);
        assert_eq!(
            (r.max_completion_tokens, r.logprobs, r.top_logprobs),
            (Some(9), Some(true), Some(2))
        );
    }

    #[test]
    fn agent_loop_messages() {
        let m: Vec<ChatRequestMessage> = serde_json::from_value(json!([
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}
            ]},
            {"role": "assistant", "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"b": 2}}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "3"}
        ]))
        .unwrap();
        assert_eq!((&m[0].content, &m[1].content), (&None, &None));
        let call = |i: usize| &m[i].tool_calls.as_ref().unwrap()[0];
        assert_eq!(
            (call(0).id.as_str(), call(0).kind.as_str()),
            ("c1", "function")
        );
        assert_eq!(
            call(0).function.arguments,
            FunctionArguments::Json("{\"a\": 1}".into())
        );
        assert_eq!(
            call(1).function.arguments,
            FunctionArguments::Object(json!({"b": 2}).as_object().unwrap().clone())
        );
        assert_eq!(
            (m[2].tool_call_id.as_deref(), m[2].name.as_deref()),
            (Some("c1"), Some("f"))
        );
        let bad = json!([{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": 1}}
        ]}]);
        let e = serde_json::from_value::<Vec<ChatRequestMessage>>(bad).unwrap_err();
        assert!(
            e.to_string().contains("a string of JSON or an object"),
            "{e}"
        );
    }

    fn chunk(delta: ChatDelta, finish: Option<&str>, usage: Option<Usage>) -> Value {
        serde_json::to_value(ChatCompletionChunk {
            id: "chatcmpl-1".into(),
            object: "chat.completion.chunk".into(),
            created: 1,
            model: "m".into(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish.map(str::to_string),
            }],
            usage,
        })
        .unwrap()
    }

    #[test]
    fn chat_chunk_wire_format() {
        let first = chunk(
            ChatDelta {
                role: Some("assistant".into()),
                content: Some(Some(String::new())),
                ..ChatDelta::default()
            },
            None,
            None,
        );
        assert_eq!(
            first,
            json!({
                "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": null, "finish_reason": null}]
            })
        );
        let null = ChatDelta {
            content: Some(None),
            ..ChatDelta::default()
        };
        let json = chunk(null.clone(), None, None)["choices"][0]["delta"].clone();
        assert_eq!(json, json!({"content": null}));
        assert_eq!(serde_json::from_value::<ChatDelta>(json).unwrap(), null);
        let last = chunk(ChatDelta::default(), Some("stop"), None);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert!(last.get("usage").is_none());
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            total_tokens: 5,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 1 },
            completion_tokens_details: None,
        };
        let with_usage = chunk(ChatDelta::default(), None, Some(usage));
        assert_eq!(
            with_usage["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                   "prompt_tokens_details": {"cached_tokens": 1}})
        );
    }

    #[test]
    fn completion_wire_format() {
        let r = CompletionResponse {
            id: "cmpl-1".into(),
            object: "text_completion".into(),
            created: 1,
            model: "m".into(),
            choices: vec![CompletionChoice {
                index: 0,
                text: " world".into(),
                logprobs: Some(CompletionLogprobs {
                    tokens: vec![" world".into()],
                    token_logprobs: vec![Some(-0.5)],
                    top_logprobs: vec![Some(IndexMap::from([(" world".to_string(), -0.5)]))],
                    text_offset: vec![5],
                }),
                finish_reason: Some("length".into()),
            }],
            usage: Some(Usage {
                prompt_tokens: 1,
                completion_tokens: 1,
                total_tokens: 2,
                prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
                completion_tokens_details: None,
            }),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v["choices"][0],
            json!({
                "index": 0, "text": " world", "finish_reason": "length",
                "logprobs": {"tokens": [" world"], "token_logprobs": [-0.5],
                             "top_logprobs": [{" world": -0.5}], "text_offset": [5]}
            })
        );
        assert_eq!(serde_json::from_value::<CompletionResponse>(v).unwrap(), r);

        let stream_chunk = CompletionResponse {
            choices: vec![CompletionChoice {
                index: 1,
                text: "x".into(),
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
            ..r
        };
        let v = serde_json::to_value(&stream_chunk).unwrap();
        assert_eq!(v["choices"][0]["logprobs"], Value::Null);
        assert_eq!(v["choices"][0]["finish_reason"], Value::Null);
        assert!(v.get("usage").is_none());
    }

    #[test]
    fn chat_response_wire_format() {
        let r = ChatCompletionResponse {
            id: "chatcmpl-1".into(),
            object: "chat.completion".into(),
            created: 1,
            model: "m".into(),
            choices: vec![ChatChoice {
                index: 0,
                message: ResponseMessage {
                    role: "assistant".into(),
                    content: Some("Hi".into()),
                    reasoning_content: None,
                    tool_calls: None,
                    function_call: None,
                },
                logprobs: Some(ChatLogprobs {
                    content: vec![ChatTokenLogprob {
                        token: "Hi".into(),
                        logprob: -0.25,
                        bytes: b"Hi".to_vec(),
                        top_logprobs: vec![TopLogprob {
                            token: "Hi".into(),
                            logprob: -0.25,
                            bytes: b"Hi".to_vec(),
                        }],
                    }],
                }),
                finish_reason: Some("stop".into()),
            }],
            usage: Some(Usage {
                prompt_tokens: 4,
                completion_tokens: 1,
                total_tokens: 5,
                prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
                completion_tokens_details: None,
            }),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v["choices"][0]["logprobs"]["content"][0],
            json!({"token": "Hi", "logprob": -0.25, "bytes": [72, 105],
                   "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]}]})
        );
        assert_eq!(
            v["choices"][0]["message"],
            json!({"role": "assistant", "content": "Hi"})
        );
        assert_eq!(v["usage"]["total_tokens"], 5);
    }

    #[test]
    fn tokenize_both_shapes() {
        let vllm: TokenizeRequest =
            serde_json::from_value(json!({"prompt": "hi", "add_special_tokens": false})).unwrap();
        assert_eq!(
            (
                vllm.prompt.as_deref(),
                vllm.content,
                vllm.add_special_tokens
            ),
            (Some("hi"), None, Some(false))
        );
        let llama: TokenizeRequest = serde_json::from_value(json!({"content": "hi"})).unwrap();
        assert_eq!((llama.prompt, llama.content.as_deref()), (None, Some("hi")));
        let d = serde_json::to_value(DetokenizeResponse {
            prompt: "hi".into(),
            content: "hi".into(),
        })
        .unwrap();
        assert_eq!(d, json!({"prompt": "hi", "content": "hi"}));
    }

    #[test]
    fn model_list_shape() {
        let v = serde_json::to_value(ModelList {
            object: "list".into(),
            data: vec![ModelCard {
                id: "m".into(),
                object: "model".into(),
                created: 5,
                owned_by: "wick".into(),
                max_model_len: 8192,
                input_modalities: vec!["text".into()],
            }],
        })
        .unwrap();
        assert_eq!(
            v,
            json!({"object": "list", "data": [{"id": "m", "object": "model", "created": 5,
                                                "owned_by": "wick", "max_model_len": 8192,
                                                "input_modalities": ["text"]}]})
        );
    }

    #[test]
    fn metadata_is_bounded_as_at_openai() {
        let read = |v: Value| serde_json::from_value::<Metadata>(v).map_err(|e| e.to_string());
        let keys =
            |n: usize| Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect());
        let m = read(keys(MAX_METADATA_KEYS)).unwrap();
        assert_eq!(m.0.len(), MAX_METADATA_KEYS);
        assert_eq!(
            m.0.get_index(3),
            Some((&"k3".to_string(), &"v".to_string()))
        );
        let e = read(keys(MAX_METADATA_KEYS + 1)).unwrap_err();
        assert!(e.contains("at most 16 keys"), "{e}");
        let e = read(json!({"k".repeat(65): "v"})).unwrap_err();
        assert!(e.contains("at most 64 characters"), "{e}");
        assert!(read(json!({"é".repeat(64): "é".repeat(512)})).is_ok());
        let e = read(json!({"k": "v".repeat(513)})).unwrap_err();
        assert!(e.contains("at most 512") && e.contains("has 513"), "{e}");
        assert!(read(json!({"k": 1})).is_err());
    }
}
