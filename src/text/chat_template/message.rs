//! The conversation a chat template renders.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A plain text turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A turn as chat templates expect it, tool calls and tool results included:
/// OpenAI's message shape. Fields that are `None` are absent from what the
/// template sees (not `none`), as transformers drops them: templates test
/// `'tool_calls' in message` or `message.content is defined`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// Absent on an assistant turn that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// An assistant turn's thinking, apart from its content (templates of
    /// thinking models may show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On a `tool` turn, the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` turn, the function that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The content as a list of parts, where it holds images: what the
    /// template sees as `content` (as transformers passes a multimodal
    /// turn), in place of the text alone.
    #[serde(skip)]
    pub parts: Option<Vec<Part>>,
}

/// A piece of a turn's content in list form: `{"type": "text", "text":
/// ...}`, or `{"type": "image"}` where an image goes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Part {
    Text { text: String },
    Image,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `"function"` in OpenAI's API.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// An object for most templates (they `tojson` it); OpenAI's wire format
    /// sends it as a JSON string, which templates then quote as a string.
    pub arguments: serde_json::Value,
}

impl Message {
    /// A plain turn of `role` saying `content`.
    pub fn text(role: &str, content: String) -> Self {
        Message {
            role: role.to_string(),
            content: Some(content),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
            parts: None,
        }
    }
}

impl From<&ChatMessage> for Message {
    fn from(m: &ChatMessage) -> Self {
        Message {
            role: m.role.clone(),
            content: Some(m.content.clone()),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
            parts: None,
        }
    }
}

/// A turn as transformers hands it to a template: its reasoning also as
/// `thinking`, first, which gpt-oss's template reads.
#[derive(Serialize)]
pub(super) struct TemplateTurn<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    #[serde(flatten)]
    message: Cow<'a, Message>,
    /// The parts of a turn that has them, as its `content`; the message
    /// then goes without its text `content`.
    #[serde(rename = "content", skip_serializing_if = "Option::is_none")]
    parts: Option<&'a [Part]>,
}

impl<'a> From<&'a Message> for TemplateTurn<'a> {
    fn from(message: &'a Message) -> Self {
        let thinking = message.reasoning_content.as_deref();
        match &message.parts {
            None => TemplateTurn {
                thinking,
                message: Cow::Borrowed(message),
                parts: None,
            },
            Some(parts) => TemplateTurn {
                thinking,
                message: Cow::Owned(Message {
                    content: None,
                    ..message.clone()
                }),
                parts: Some(parts),
            },
        }
    }
}
