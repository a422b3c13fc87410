//! The output side of `POST /v1/responses`: a generation's deltas as the
//! Responses API's typed events (`response.output_item.added`,
//! `response.output_text.delta`, …, each with its `sequence_number`) and,
//! from the very same events, the Response object a whole request answers
//! (so a stream and a whole response cannot drift apart).
//!
//! The reply becomes output items in the order the model writes them: its
//! thinking (templates that think) a `reasoning` item, its text a
//! `message` with one `output_text` part, each tool call a `function_call`
//! item. An item is closed (its `.done` events) when the next one opens or
//! the reply ends.

use serde_json::{json, Map, Value};

use crate::engine::output::Delta;
use crate::engine::sequence::FinishReason;
use crate::server::error::ApiError;
use crate::server::protocol::Usage;
use crate::server::tools::CallIds;
use crate::text::reasoning::{self, Piece, ReasoningParser};
use crate::text::tool_parser::{ToolCallParser, ToolEvent};

/// A fresh id: `prefix`, an underscore and 32 hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

#[derive(Debug, Clone, PartialEq)]
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Reasoning { id, .. }
            | Item::Message { id, .. }
            | Item::FunctionCall { id, .. } => id,
        }
    }

    /// The item as the Response object (and the item events) show it.
    fn to_json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text } => json!({
                "id": id, "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
                "encrypted_content": null, "status": status,
            }),
            Item::Message { id, text } => json!({
                "id": id, "type": "message", "status": status, "role": "assistant",
                "content": [output_text(text)],
            }),
            Item::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id,
                "name": name, "arguments": arguments,
            }),
        }
    }

    /// The item as it opens: no text or arguments yet.
    fn opening_json(&self) -> Value {
        let mut v = self.to_json("in_progress");
        match self {
            Item::Reasoning { .. } | Item::Message { .. } => v["content"] = json!([]),
            Item::FunctionCall { .. } => v["arguments"] = json!(""),
        }
        v
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// How a request's reply is read: what the generation plan decided.
pub struct ReplyShape {
    /// `Some(opened)` when the template thinks (see [`ReasoningParser`]).
    pub reasoning: Option<bool>,
    /// The reader of tool calls, when the reply may hold some.
    pub parser: Option<ToolCallParser>,
    /// Whether calls after the first are kept.
    pub parallel: bool,
    pub ids: CallIds,
}

pub struct ResponseBuilder {
    /// The Response object's fields that echo the request (`model`,
    /// `instructions`, `tools`, …), in the order they are shown.
    echo: Map<String, Value>,
    id: String,
    created_at: u64,
    thinking: Option<ReasoningParser>,
    parser: Option<ToolCallParser>,
    parallel: bool,
    ids: CallIds,
    output: Vec<Item>,
    /// Per item: `in_progress` while open, then how it ended.
    status: Vec<&'static str>,
    /// `output[open]` is still being written.
    open: Option<usize>,
    /// Per call index of the reply: its output index (`None`: dropped, as
    /// a second call without `parallel_tool_calls`).
    calls: Vec<Option<usize>>,
    /// Whitespace before any message text, held until text follows.
    held_space: String,
    next_sequence: u64,
    /// The model is inside its thinking (for `reasoning_tokens`).
    in_reasoning: bool,
    reasoning_tokens: usize,
    /// The reply was cut off at `max_output_tokens` (or the time limit).
    cut_off: bool,
}

impl ResponseBuilder {
    pub fn new(id: String, created_at: u64, echo: Map<String, Value>, shape: ReplyShape) -> Self {
        ResponseBuilder {
            echo,
            id,
            created_at,
            in_reasoning: shape.reasoning == Some(true),
            thinking: shape.reasoning.map(ReasoningParser::new),
            parser: shape.parser,
            parallel: shape.parallel,
            ids: shape.ids,
            output: Vec::new(),
            status: Vec::new(),
            open: None,
            calls: Vec::new(),
            held_space: String::new(),
            next_sequence: 0,
            reasoning_tokens: 0,
            cut_off: false,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        for kind in ["response.created", "response.in_progress"] {
            let response = self.snapshot("in_progress", None);
            self.emit(&mut out, json!({"type": kind, "response": response}));
        }
        out
    }

    /// The events one delta of the reply makes.
    pub fn push(&mut self, d: Delta) -> Vec<Value> {
        let mut out = Vec::new();
        let pieces = reasoning::split(self.thinking.as_mut(), d.text, d.finish.is_some());
        if d.token.is_some() {
            let thought = pieces.iter().any(|p| matches!(p, Piece::Reasoning(_)));
            let answered = pieces
                .iter()
                .any(|p| matches!(p, Piece::Content(t) if !t.is_empty()));
            if thought || (self.in_reasoning && !answered) {
                self.reasoning_tokens += 1;
            }
        }
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => {
                    self.in_reasoning = true;
                    self.reasoning(&mut out, text);
                }
                Piece::Content(text) => {
                    if !text.is_empty() {
                        self.in_reasoning = false;
                    }
                    match &mut self.parser {
                        None => self.message(&mut out, text),
                        Some(parser) => {
                            let events = parser.push(&text);
                            self.tool_events(&mut out, events);
                        }
                    }
                }
            }
        }
        if let Some(finish) = &d.finish {
            if let Some(parser) = &mut self.parser {
                let events = parser.finish();
                self.tool_events(&mut out, events);
            }
            self.cut_off = *finish == FinishReason::Length;
        }
        out
    }

    /// The reply ended: the open item closes, and the last event carries
    /// the whole Response object, returned too.
    pub fn finish(&mut self, usage: Usage) -> (Vec<Value>, Value) {
        let mut out = Vec::new();
        let status = if self.cut_off {
            "incomplete"
        } else {
            "completed"
        };
        self.close(&mut out, status);
        let response = self.snapshot(status, Some(usage));
        let kind = format!("response.{status}");
        self.emit(
            &mut out,
            json!({"type": kind, "response": response.clone()}),
        );
        (out, response)
    }

    /// The request failed once streaming: an `error` event, then
    /// `response.failed`.
    pub fn fail(&mut self, e: &ApiError) -> Vec<Value> {
        let mut out = Vec::new();
        self.close(&mut out, "incomplete");
        let code = e.code.clone().unwrap_or_else(|| {
            if e.status.is_server_error() {
                "server_error".into()
            } else {
                "invalid_prompt".into()
            }
        });
        self.emit(
            &mut out,
            json!({"type": "error", "code": code, "message": e.message, "param": e.param}),
        );
        let mut response = self.snapshot("failed", None);
        response["error"] = json!({"code": code, "message": e.message});
        self.emit(
            &mut out,
            json!({"type": "response.failed", "response": response}),
        );
        out
    }

    /// The reply as one assistant chat message, for a conversation a later
    /// request continues: its thinking, text and calls.
    pub fn assistant_message(&self) -> Value {
        let mut reasoning = String::new();
        let mut text = String::new();
        let mut calls = Vec::new();
        for item in &self.output {
            match item {
                Item::Reasoning { text: t, .. } => reasoning.push_str(t),
                Item::Message { text: t, .. } => text.push_str(t),
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                    ..
                } => calls.push(json!({
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments},
                })),
            }
        }
        let mut m = json!({"role": "assistant"});
        m["content"] = if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        };
        if !reasoning.is_empty() {
            m["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        m
    }

    fn emit(&mut self, out: &mut Vec<Value>, mut event: Value) {
        event["sequence_number"] = json!(self.next_sequence);
        self.next_sequence += 1;
        out.push(event);
    }

    /// The Response object now: `status`, the items so far, `usage` once known.
    fn snapshot(&self, status: &str, usage: Option<Usage>) -> Value {
        let mut r = Map::new();
        r.insert("id".into(), json!(self.id));
        r.insert("object".into(), json!("response"));
        r.insert("created_at".into(), json!(self.created_at));
        r.insert("status".into(), json!(status));
        let completed_at = (status == "completed").then(unix_now);
        r.insert("completed_at".into(), json!(completed_at));
        r.insert("error".into(), Value::Null);
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        r.insert("incomplete_details".into(), json!(incomplete));
        let output: Vec<Value> = self
            .output
            .iter()
            .enumerate()
            .map(|(i, item)| item.to_json(self.status[i]))
            .collect();
        r.insert("output".into(), Value::Array(output));
        for (k, v) in &self.echo {
            r.insert(k.clone(), v.clone());
        }
        r.insert("usage".into(), json!(usage.map(|u| self.usage(u))));
        Value::Object(r)
    }

    fn usage(&self, u: Usage) -> Value {
        json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": u.prompt_tokens_details.cached_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens.min(u.completion_tokens),
            },
            "total_tokens": u.total_tokens,
        })
    }

    /// Opens `item` after closing the open one.
    fn open_item(&mut self, out: &mut Vec<Value>, item: Item) -> usize {
        self.close(out, "completed");
        let index = self.output.len();
        let opening = item.opening_json();
        let id = item.id().to_string();
        let part = match &item {
            Item::Reasoning { .. } => Some(json!({"type": "reasoning_text", "text": ""})),
            Item::Message { .. } => Some(output_text("")),
            Item::FunctionCall { .. } => None,
        };
        self.output.push(item);
        self.status.push("in_progress");
        self.open = Some(index);
        self.emit(
            out,
            json!({"type": "response.output_item.added", "output_index": index, "item": opening}),
        );
        if let Some(part) = part {
            self.emit(
                out,
                json!({"type": "response.content_part.added", "item_id": id,
                       "output_index": index, "content_index": 0, "part": part}),
            );
        }
        index
    }

    /// Closes the open item, if any, with its `.done` events.
    fn close(&mut self, out: &mut Vec<Value>, status: &'static str) {
        let Some(index) = self.open.take() else {
            return;
        };
        self.status[index] = status;
        let item = &mut self.output[index];
        if let Item::FunctionCall { arguments, .. } = item {
            // A call with no arguments at all takes none: `{}`.
            if arguments.trim().is_empty() {
                *arguments = "{}".into();
            }
        }
        let item = self.output[index].clone();
        let done = item.to_json(status);
        let id = item.id().to_string();
        let at = |kind: &str| json!({"type": kind, "item_id": id, "output_index": index, "content_index": 0});
        match &item {
            Item::Reasoning { text, .. } => {
                let mut ev = at("response.reasoning_text.done");
                ev["text"] = json!(text);
                self.emit(out, ev);
                let mut ev = at("response.content_part.done");
                ev["part"] = json!({"type": "reasoning_text", "text": text});
                self.emit(out, ev);
            }
            Item::Message { text, .. } => {
                let mut ev = at("response.output_text.done");
                ev["text"] = json!(text);
                ev["logprobs"] = json!([]);
                self.emit(out, ev);
                let mut ev = at("response.content_part.done");
                ev["part"] = output_text(text);
                self.emit(out, ev);
            }
            Item::FunctionCall {
                name, arguments, ..
            } => self.emit(
                out,
                json!({"type": "response.function_call_arguments.done", "item_id": id,
                       "output_index": index, "name": name, "arguments": arguments}),
            ),
        }
        self.emit(
            out,
            json!({"type": "response.output_item.done", "output_index": index, "item": done}),
        );
    }

    fn reasoning(&mut self, out: &mut Vec<Value>, text: String) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(i) if matches!(self.output[i], Item::Reasoning { .. }) => i,
            _ => self.open_item(
                out,
                Item::Reasoning {
                    id: new_id("rs"),
                    text: String::new(),
                },
            ),
        };
        let Item::Reasoning { id, text: all } = &mut self.output[index] else {
            return;
        };
        all.push_str(&text);
        let id = id.clone();
        self.emit(
            out,
            json!({"type": "response.reasoning_text.delta", "item_id": id,
                   "output_index": index, "content_index": 0, "delta": text}),
        );
    }

    fn message(&mut self, out: &mut Vec<Value>, text: String) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(i) if matches!(self.output[i], Item::Message { .. }) => i,
            // No item for whitespace alone.
            _ if text.trim().is_empty() => {
                self.held_space.push_str(&text);
                return;
            }
            _ => self.open_item(
                out,
                Item::Message {
                    id: new_id("msg"),
                    text: String::new(),
                },
            ),
        };
        let text = std::mem::take(&mut self.held_space) + &text;
        let Item::Message { id, text: all } = &mut self.output[index] else {
            return;
        };
        all.push_str(&text);
        let id = id.clone();
        self.emit(
            out,
            json!({"type": "response.output_text.delta", "item_id": id, "output_index": index,
                   "content_index": 0, "delta": text, "logprobs": []}),
        );
    }

    fn tool_events(&mut self, out: &mut Vec<Value>, events: Vec<ToolEvent>) {
        for ev in events {
            match ev {
                ToolEvent::Content(text) => self.message(out, text),
                ToolEvent::Start { index, name } => {
                    if self.calls.len() <= index {
                        self.calls.resize(index + 1, None);
                    }
                    // Without parallel calls only the first is kept.
                    if index > 0 && !self.parallel {
                        continue;
                    }
                    self.held_space.clear();
                    let item = Item::FunctionCall {
                        id: new_id("fc"),
                        call_id: self.ids.issue(),
                        name,
                        arguments: String::new(),
                    };
                    self.calls[index] = Some(self.open_item(out, item));
                }
                ToolEvent::Arguments { index, text } => {
                    let Some(at) = self.calls.get(index).copied().flatten() else {
                        continue;
                    };
                    let Item::FunctionCall { id, arguments, .. } = &mut self.output[at] else {
                        continue;
                    };
                    arguments.push_str(&text);
                    let id = id.clone();
                    self.emit(
                        out,
                        json!({"type": "response.function_call_arguments.delta", "item_id": id,
                               "output_index": at, "delta": text}),
                    );
                }
            }
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::protocol::PromptTokensDetails;
    use crate::text::tool_parser::ToolFormat;

    fn builder(
        reasoning: Option<bool>,
        parser: Option<ToolCallParser>,
        parallel: bool,
    ) -> ResponseBuilder {
        let mut echo = Map::new();
        echo.insert("model".into(), json!("m"));
        let shape = ReplyShape {
            reasoning,
            parser,
            parallel,
            ids: CallIds::OpenAi,
        };
        ResponseBuilder::new("resp_1".into(), 7, echo, shape)
    }

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 5,
            completion_tokens: 4,
            total_tokens: 9,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 2 },
            completion_tokens_details: None,
        }
    }

    /// Runs `pieces` through `b` (one token each, the last finishing with
    /// `finish`): every event, then the final Response object.
    fn run(b: &mut ResponseBuilder, pieces: &[&str], finish: FinishReason) -> (Vec<Value>, Value) {
        let mut events = b.start();
        for (k, text) in pieces.iter().enumerate() {
            let delta = Delta {
                text: text.to_string(),
                token: Some(k as u32),
                finish: (k + 1 == pieces.len()).then(|| finish.clone()),
                ..Default::default()
            };
            events.extend(b.push(delta));
        }
        let (more, response) = b.finish(usage());
        events.extend(more);
        (events, response)
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn text_streams_as_one_message() {
        let mut b = builder(None, None, true);
        let (events, response) = run(&mut b, &["Hel", "lo"], FinishReason::Stop);
        assert_eq!(
            types(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert_eq!(events[0]["response"]["output"], json!([]));
        assert_eq!(events[2]["item"]["content"], json!([]));
        assert_eq!(events[6]["text"], "Hello");
        assert_eq!(response["status"], "completed");
        assert_eq!(response["model"], "m");
        assert_eq!(response["incomplete_details"], Value::Null);
        let out = &response["output"][0];
        assert_eq!(
            (
                out["type"].as_str(),
                out["status"].as_str(),
                out["role"].as_str()
            ),
            (Some("message"), Some("completed"), Some("assistant"))
        );
        assert_eq!(out["content"][0]["text"], "Hello");
        assert!(out["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(
            response["usage"],
            json!({"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                   "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": 9})
        );
        assert_eq!(events.last().unwrap()["response"], response);
        assert_eq!(
            b.assistant_message(),
            json!({"role": "assistant", "content": "Hello"})
        );
    }

    #[test]
    fn a_reply_cut_off_is_incomplete() {
        let mut b = builder(None, None, true);
        let (events, response) = run(&mut b, &["Hi"], FinishReason::Length);
        assert_eq!(events.last().unwrap()["type"], "response.incomplete");
        assert_eq!(response["status"], "incomplete");
        assert_eq!(
            response["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(response["output"][0]["status"], "incomplete");
    }

    #[test]
    fn thinking_then_text_then_calls() {
        let parser = ToolCallParser::new(ToolFormat::Hermes);
        let mut b = builder(Some(false), Some(parser), true);
        let (events, response) = run(
            &mut b,
            &[
                "<think>Need the",
                " weather.</think>\n\nChecking.",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
                "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}",
                "</tool_call>",
            ],
            FinishReason::Stop,
        );
        let kinds: Vec<&str> = response["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["reasoning", "message", "function_call", "function_call"]
        );
        let out = &response["output"];
        assert_eq!(out[0]["content"][0]["text"], "Need the weather.");
        assert_eq!(out[1]["content"][0]["text"], "Checking.");
        assert_eq!(out[2]["name"], "get_weather");
        let args: Value = serde_json::from_str(out[2]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(
            (out[3]["name"].as_str(), out[3]["arguments"].as_str()),
            (Some("now"), Some("{}"))
        );
        assert!(out[2]["call_id"].as_str().unwrap().starts_with("call_"));
        assert_ne!(out[2]["call_id"], out[3]["call_id"]);
        // Each call's arguments stream as deltas, then once whole.
        let streamed: String = events
            .iter()
            .filter(|e| {
                e["type"] == "response.function_call_arguments.delta" && e["output_index"] == 2
            })
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, out[2]["arguments"].as_str().unwrap());
        let done: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.done")
            .collect();
        assert_eq!(done.len(), 2);
        assert_eq!(done[1]["name"], "now");
        assert!(types(&events).contains(&"response.reasoning_text.delta"));
        assert_eq!(
            response["usage"]["output_tokens_details"]["reasoning_tokens"],
            2
        );
        let m = b.assistant_message();
        assert_eq!(m["content"], "Checking.");
        assert_eq!(m["reasoning_content"], "Need the weather.");
        assert_eq!(m["tool_calls"][1]["function"]["name"], "now");
        assert_eq!(m["tool_calls"][0]["id"], out[2]["call_id"]);
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_kept() {
        let parser = ToolCallParser::new(ToolFormat::Hermes);
        let mut b = builder(None, Some(parser), false);
        let (_, response) = run(
            &mut b,
            &["<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>"],
            FinishReason::Stop,
        );
        let out = response["output"].as_array().unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["name"], "a");
        let m = b.assistant_message();
        assert_eq!(m["content"], Value::Null);
    }

    #[test]
    fn a_named_call_is_one_function_call_item() {
        let mut b = builder(None, Some(ToolCallParser::named("f")), true);
        let (events, response) = run(&mut b, &["{\"a\":", " 1}"], FinishReason::Stop);
        let out = response["output"].as_array().unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0]["name"].as_str(), out[0]["arguments"].as_str()),
            (Some("f"), Some("{\"a\": 1}"))
        );
        assert_eq!(events[2]["item"]["arguments"], "");
        assert_eq!(events[2]["item"]["status"], "in_progress");
    }

    #[test]
    fn a_failure_ends_the_stream_with_response_failed() {
        let mut b = builder(None, None, true);
        let mut events = b.start();
        events.extend(b.push(Delta {
            text: "Hi".into(),
            token: Some(1),
            ..Default::default()
        }));
        events.extend(b.fail(&ApiError::internal("boom")));
        let n = events.len();
        assert_eq!(events[n - 2]["type"], "error");
        assert_eq!(events[n - 2]["code"], "server_error");
        assert_eq!(events[n - 1]["type"], "response.failed");
        assert_eq!(events[n - 1]["response"]["error"]["message"], "boom");
        assert_eq!(events[n - 3]["type"], "response.output_item.done");
        assert_eq!(events[n - 3]["item"]["status"], "incomplete");
        assert_eq!(
            events[n - 1]["response"]["output"][0]["status"],
            "incomplete"
        );
        assert_eq!(events[n - 1]["response"]["status"], "failed");
    }

    #[test]
    fn whitespace_alone_opens_no_message() {
        let mut b = builder(None, None, true);
        let (_, response) = run(&mut b, &["\n", " "], FinishReason::Stop);
        assert_eq!(response["output"], json!([]));
        let mut b = builder(None, None, true);
        let (_, response) = run(&mut b, &["\n", "Hi"], FinishReason::Stop);
        assert_eq!(response["output"][0]["content"][0]["text"], "\nHi");
    }
}
