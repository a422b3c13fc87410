//! The Responses API's wire types: the Response object, its output items
//! and their content parts, and the stream's events. Fields are declared
//! in the order they go on the wire (serde_json keeps it), nulls included.

use serde::Serialize;
use serde_json::{Map, Value};

/// A list wick always leaves empty (annotations, logprobs, summaries).
pub type Empty = [(); 0];

/// The Response object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub status: &'static str,
    pub completed_at: Option<u64>,
    pub error: Option<Failure>,
    pub incomplete_details: Option<Incomplete>,
    pub output: Vec<OutputItem>,
    /// The fields that echo the request (`model`, `instructions`, …).
    #[serde(flatten)]
    pub echo: Map<String, Value>,
    pub usage: Option<ResponseUsage>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Failure {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Incomplete {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct InputDetails {
    pub cached_tokens: usize,
    pub cache_write_tokens: usize,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OutputDetails {
    pub reasoning_tokens: usize,
}

/// An output item as the Response object and the item events show it.
/// Each names its `type` after its `id`, so the tag is a field of its own.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum OutputItem {
    Reasoning {
        id: String,
        #[serde(rename = "type")]
        kind: &'static str,
        #[schema(value_type = Vec<serde_json::Value>, max_items = 0)]
        summary: Empty,
        content: Vec<Part>,
        encrypted_content: Option<String>,
        status: &'static str,
    },
    Message {
        id: String,
        #[serde(rename = "type")]
        kind: &'static str,
        status: &'static str,
        role: &'static str,
        content: Vec<Part>,
    },
    FunctionCall {
        id: String,
        #[serde(rename = "type")]
        kind: &'static str,
        status: &'static str,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// A content part of an item.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    ReasoningText {
        text: String,
    },
    OutputText {
        text: String,
        #[schema(value_type = Vec<serde_json::Value>, max_items = 0)]
        annotations: Empty,
        #[schema(value_type = Vec<serde_json::Value>, max_items = 0)]
        logprobs: Empty,
    },
}

impl Part {
    pub fn output_text(text: String) -> Self {
        Part::OutputText {
            text,
            annotations: [],
            logprobs: [],
        }
    }
}

/// An event of the stream, numbered.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = ResponseStreamEvent)]
pub struct StreamEvent {
    #[serde(flatten)]
    pub event: EventKind,
    pub sequence_number: u64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(tag = "type")]
pub enum EventKind {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: ResponseObject },
    #[serde(rename = "error")]
    Error {
        code: String,
        message: String,
        param: Option<String>,
    },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: Part,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: Part,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        #[schema(value_type = Vec<serde_json::Value>, max_items = 0)]
        logprobs: Empty,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        #[schema(value_type = Vec<serde_json::Value>, max_items = 0)]
        logprobs: Empty,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
}

impl EventKind {
    /// The SSE `event:` name, the same as `type`.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Created { .. } => "response.created",
            EventKind::InProgress { .. } => "response.in_progress",
            EventKind::Completed { .. } => "response.completed",
            EventKind::Incomplete { .. } => "response.incomplete",
            EventKind::Failed { .. } => "response.failed",
            EventKind::Error { .. } => "error",
            EventKind::OutputItemAdded { .. } => "response.output_item.added",
            EventKind::OutputItemDone { .. } => "response.output_item.done",
            EventKind::ContentPartAdded { .. } => "response.content_part.added",
            EventKind::ContentPartDone { .. } => "response.content_part.done",
            EventKind::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            EventKind::ReasoningTextDone { .. } => "response.reasoning_text.done",
            EventKind::OutputTextDelta { .. } => "response.output_text.delta",
            EventKind::OutputTextDone { .. } => "response.output_text.done",
            EventKind::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            EventKind::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
        }
    }
}
