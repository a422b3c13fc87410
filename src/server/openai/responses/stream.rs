//! The output side of `POST /v1/responses`: the reply events every API
//! reads (`server::reply`) as the Responses API's typed events
//! (`response.output_item.added`, `response.output_text.delta`, …, each
//! with its `sequence_number`) and, from the very same events, the
//! Response object a whole request answers (so a stream and a whole
//! response cannot drift apart).
//!
//! The reply becomes output items in the order the model writes them: its
//! thinking (templates that think) a `reasoning` item, its text a
//! `message` with one `output_text` part, each tool call a `function_call`
//! item. An item is closed (its `.done` events) when the next one opens or
//! the reply ends.

use axum::body::Bytes;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::engine::sequence::FinishReason;
use crate::server::error::ApiError;
use crate::server::openai::responses::events::{
    EventKind, Failure, Incomplete, InputDetails, OutputDetails, OutputItem, Part, ResponseObject,
    ResponseUsage, StreamEvent,
};
use crate::server::protocol::Usage;
use crate::server::reply::{ReplyEvent, ReplyStep};
use crate::server::respond::Render;
use crate::server::tools::CallIds;

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
    fn wire(&self, status: &'static str) -> OutputItem {
        match self {
            Item::Reasoning { id, text } => OutputItem::Reasoning {
                id: id.clone(),
                kind: "reasoning",
                summary: [],
                content: vec![Part::ReasoningText { text: text.clone() }],
                encrypted_content: None,
                status,
            },
            Item::Message { id, text } => OutputItem::Message {
                id: id.clone(),
                kind: "message",
                status,
                role: "assistant",
                content: vec![Part::output_text(text.clone())],
            },
            Item::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            } => OutputItem::FunctionCall {
                id: id.clone(),
                kind: "function_call",
                status,
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            },
        }
    }

    /// The item as it opens: no text or arguments yet.
    fn opening(&self) -> OutputItem {
        let mut item = self.wire("in_progress");
        match &mut item {
            OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. } => {
                content.clear()
            }
            OutputItem::FunctionCall { arguments, .. } => arguments.clear(),
        }
        item
    }
}

/// What keeps a finished response (the Responses store), given its
/// builder and the Response object as sent.
pub type OnDone = Box<dyn FnOnce(&ResponseBuilder, Bytes) + Send>;

pub struct ResponseBuilder {
    /// The Response object's fields that echo the request (`model`,
    /// `instructions`, `tools`, …), in the order they are shown.
    echo: Map<String, Value>,
    id: String,
    created_at: u64,
    ids: CallIds,
    output: Vec<Item>,
    /// Per item: `in_progress` while open, then how it ended.
    status: Vec<&'static str>,
    /// `output[open]` is still being written.
    open: Option<usize>,
    /// Per call index of the reply: its output index.
    calls: Vec<Option<usize>>,
    /// Whitespace before any message text, held until text follows.
    held_space: String,
    next_sequence: u64,
    reasoning_tokens: usize,
    /// The reply was cut off at `max_output_tokens` (or the time limit).
    cut_off: bool,
    on_done: Option<OnDone>,
}

impl ResponseBuilder {
    pub fn new(
        id: String,
        created_at: u64,
        echo: Map<String, Value>,
        ids: CallIds,
        on_done: Option<OnDone>,
    ) -> Self {
        ResponseBuilder {
            echo,
            id,
            created_at,
            ids,
            output: Vec::new(),
            status: Vec::new(),
            open: None,
            calls: Vec::new(),
            held_space: String::new(),
            next_sequence: 0,
            reasoning_tokens: 0,
            cut_off: false,
            on_done,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The request failed once streaming: an `error` event, then
    /// `response.failed`.
    fn failure(&mut self, e: &ApiError) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.close(&mut out, "incomplete");
        let code = e.code.clone().unwrap_or_else(|| {
            if e.status.is_server_error() {
                "server_error".into()
            } else {
                "invalid_prompt".into()
            }
        });
        let error = EventKind::Error {
            code: code.clone(),
            message: e.message.clone(),
            param: e.param.clone(),
        };
        self.emit(&mut out, error);
        let mut response = self.snapshot("failed", None);
        response.error = Some(Failure {
            code,
            message: e.message.clone(),
        });
        self.emit(&mut out, EventKind::Failed { response });
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

    fn emit(&mut self, out: &mut Vec<StreamEvent>, event: EventKind) {
        out.push(StreamEvent {
            event,
            sequence_number: self.next_sequence,
        });
        self.next_sequence += 1;
    }

    /// The Response object now: `status`, the items so far, `usage` once known.
    fn snapshot(&self, status: &'static str, usage: Option<Usage>) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            completed_at: (status == "completed").then(unix_now),
            error: None,
            incomplete_details: (status == "incomplete").then_some(Incomplete {
                reason: "max_output_tokens",
            }),
            output: (self.output.iter().zip(&self.status))
                .map(|(item, status)| item.wire(status))
                .collect(),
            echo: self.echo.clone(),
            usage: usage.map(|u| self.usage(u)),
        }
    }

    fn usage(&self, u: Usage) -> ResponseUsage {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputDetails {
                reasoning_tokens: self.reasoning_tokens.min(u.completion_tokens),
            },
            total_tokens: u.total_tokens,
        }
    }

    /// Opens `item` after closing the open one.
    fn open_item(&mut self, out: &mut Vec<StreamEvent>, item: Item) -> usize {
        self.close(out, "completed");
        let index = self.output.len();
        let opening = item.opening();
        let item_id = item.id().to_string();
        let part = match &item {
            Item::Reasoning { .. } => Some(Part::ReasoningText {
                text: String::new(),
            }),
            Item::Message { .. } => Some(Part::output_text(String::new())),
            Item::FunctionCall { .. } => None,
        };
        self.output.push(item);
        self.status.push("in_progress");
        self.open = Some(index);
        let added = EventKind::OutputItemAdded {
            output_index: index,
            item: opening,
        };
        self.emit(out, added);
        if let Some(part) = part {
            let added = EventKind::ContentPartAdded {
                item_id,
                output_index: index,
                content_index: 0,
                part,
            };
            self.emit(out, added);
        }
        index
    }

    /// Closes the open item, if any, with its `.done` events.
    fn close(&mut self, out: &mut Vec<StreamEvent>, status: &'static str) {
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
        let done = item.wire(status);
        let item_id = item.id().to_string();
        let (output_index, content_index) = (index, 0);
        let (done_text, part) = match item {
            Item::Reasoning { text, .. } => (
                EventKind::ReasoningTextDone {
                    item_id: item_id.clone(),
                    output_index,
                    content_index,
                    text: text.clone(),
                },
                Some(Part::ReasoningText { text }),
            ),
            Item::Message { text, .. } => (
                EventKind::OutputTextDone {
                    item_id: item_id.clone(),
                    output_index,
                    content_index,
                    text: text.clone(),
                    logprobs: [],
                },
                Some(Part::output_text(text)),
            ),
            Item::FunctionCall {
                name, arguments, ..
            } => (
                EventKind::FunctionCallArgumentsDone {
                    item_id: item_id.clone(),
                    output_index,
                    name,
                    arguments,
                },
                None,
            ),
        };
        self.emit(out, done_text);
        if let Some(part) = part {
            let done = EventKind::ContentPartDone {
                item_id,
                output_index,
                content_index,
                part,
            };
            self.emit(out, done);
        }
        let done = EventKind::OutputItemDone {
            output_index,
            item: done,
        };
        self.emit(out, done);
    }

    fn reasoning(&mut self, out: &mut Vec<StreamEvent>, text: String) {
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
        let delta = EventKind::ReasoningTextDelta {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            delta: text,
        };
        self.emit(out, delta);
    }

    fn message(&mut self, out: &mut Vec<StreamEvent>, text: String) {
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
        let delta = EventKind::OutputTextDelta {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            delta: text,
            logprobs: [],
        };
        self.emit(out, delta);
    }

    fn event(&mut self, out: &mut Vec<StreamEvent>, ev: ReplyEvent) {
        match ev {
            ReplyEvent::Reasoning(text) => self.reasoning(out, text),
            ReplyEvent::Text(text) => self.message(out, text),
            ReplyEvent::ToolCallStart { index, name } => {
                if self.calls.len() <= index {
                    self.calls.resize(index + 1, None);
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
            ReplyEvent::ToolCallArgs { index, text } => {
                let Some(at) = self.calls.get(index).copied().flatten() else {
                    return;
                };
                let Item::FunctionCall { id, arguments, .. } = &mut self.output[at] else {
                    return;
                };
                arguments.push_str(&text);
                let delta = EventKind::FunctionCallArgumentsDelta {
                    item_id: id.clone(),
                    output_index: at,
                    delta: text,
                };
                self.emit(out, delta);
            }
            ReplyEvent::Finish(f) => {
                self.cut_off = f.reason == FinishReason::Length;
                self.reasoning_tokens = f.reasoning_tokens;
            }
        }
    }
}

impl Render for ResponseBuilder {
    type Event = StreamEvent;
    /// The last Response object an event carried.
    type Whole = Option<ResponseObject>;
    const DONE: bool = false;

    /// `response.created` and `response.in_progress`.
    fn open(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let response = self.snapshot("in_progress", None);
        self.emit(&mut out, EventKind::Created { response });
        let response = self.snapshot("in_progress", None);
        self.emit(&mut out, EventKind::InProgress { response });
        out
    }

    fn step(
        &mut self,
        _choice: usize,
        step: ReplyStep,
        _usage: &dyn Fn() -> Usage,
    ) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for ev in step.events {
            self.event(&mut out, ev);
        }
        out
    }

    /// The open item closes, and the last event carries the whole Response
    /// object, kept first (`on_done`) so a follow-up may name it as soon
    /// as the client hears it is done.
    fn finish(&mut self, usage: Usage) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let status = if self.cut_off {
            "incomplete"
        } else {
            "completed"
        };
        self.close(&mut out, status);
        let response = self.snapshot(status, Some(usage));
        if let Some(on_done) = self.on_done.take() {
            // A Response object always serialises.
            let bytes = serde_json::to_vec(&response).unwrap_or_default();
            on_done(self, Bytes::from(bytes));
        }
        let done = match self.cut_off {
            true => EventKind::Incomplete { response },
            false => EventKind::Completed { response },
        };
        self.emit(&mut out, done);
        out
    }

    fn fail(&mut self, e: &ApiError) -> Vec<Event> {
        let events = self.failure(e);
        events.iter().map(|ev| self.sse(ev)).collect()
    }

    fn sse(&self, ev: &StreamEvent) -> Event {
        Event::default()
            .event(ev.event.name())
            .data(serde_json::to_string(ev).unwrap_or_default())
    }

    fn whole(&self, _choices: usize) -> Option<ResponseObject> {
        None
    }

    fn fold(&self, whole: &mut Option<ResponseObject>, ev: StreamEvent) {
        if let EventKind::Completed { response } | EventKind::Incomplete { response } = ev.event {
            *whole = Some(response);
        }
    }

    fn answer(&self, whole: Option<ResponseObject>) -> Response {
        Json(whole).into_response()
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
    use crate::engine::output::Delta;
    use crate::server::protocol::PromptTokensDetails;
    use crate::server::reply::testing::{deltas, hermes, parser, plan};
    use crate::server::tools::ToolMode;
    use crate::server::validation::GenerationPlan;

    fn builder() -> ResponseBuilder {
        let mut echo = Map::new();
        echo.insert("model".into(), json!("m"));
        ResponseBuilder::new("resp_1".into(), 7, echo, CallIds::OpenAi, None)
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

    fn json_of(events: &[StreamEvent]) -> Vec<Value> {
        events
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    /// Runs `pieces` through `plan`'s parser and a builder (one token
    /// each, the last finishing with `finish`): the builder, every event,
    /// then the whole Response object.
    fn run(
        plan: &GenerationPlan,
        pieces: &[&str],
        finish: FinishReason,
    ) -> (ResponseBuilder, Vec<Value>, Value) {
        let (mut b, mut p) = (builder(), parser(plan, ""));
        let mut events = b.open();
        for d in deltas(pieces, finish) {
            events.extend(b.step(0, p.push(d), &usage));
        }
        events.extend(b.finish(usage()));
        let mut whole = b.whole(1);
        for ev in events.clone() {
            b.fold(&mut whole, ev);
        }
        let response = serde_json::to_value(whole).unwrap();
        (b, json_of(&events), response)
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn text_streams_as_one_message() {
        let (b, events, response) = run(
            &plan(None, ToolMode::Off, true),
            &["Hel", "lo"],
            FinishReason::Stop,
        );
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
        let (_, events, response) = run(
            &plan(None, ToolMode::Off, true),
            &["Hi"],
            FinishReason::Length,
        );
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
        let (b, events, response) = run(
            &plan(Some(false), hermes(), true),
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
        let (b, _, response) = run(
            &plan(None, hermes(), false),
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
        let named = plan(None, ToolMode::Named("f".into()), true);
        let (_, events, response) = run(&named, &["{\"a\":", " 1}"], FinishReason::Stop);
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
        let mut b = builder();
        let mut p = parser(&plan(None, ToolMode::Off, true), "");
        let mut events = b.open();
        let delta = Delta {
            text: "Hi".into(),
            token: Some(1),
            ..Default::default()
        };
        events.extend(b.step(0, p.push(delta), &usage));
        events.extend(b.failure(&ApiError::internal("boom")));
        let events = json_of(&events);
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
        let (_, _, response) = run(
            &plan(None, ToolMode::Off, true),
            &["\n", " "],
            FinishReason::Stop,
        );
        assert_eq!(response["output"], json!([]));
        let (_, _, response) = run(
            &plan(None, ToolMode::Off, true),
            &["\n", "Hi"],
            FinishReason::Stop,
        );
        assert_eq!(response["output"][0]["content"][0]["text"], "\nHi");
    }
}
