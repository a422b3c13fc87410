//! The reply of `POST /v1/messages` as Anthropic's content blocks: text,
//! thinking (a template that thinks) and `tool_use`, read from the
//! generation as chat reads it (the reasoning parser, then the tool-call
//! parser of the request's tool plan). [`BlockBuilder`] turns each delta
//! into stream events (`content_block_start`, `content_block_delta`,
//! `content_block_stop`); a stream sends them as SSE with `event:` names
//! between `message_start` and `message_delta` + `message_stop`, and a
//! whole reply is those same events applied to its content, so the two
//! cannot drift apart.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;

use crate::engine::output::Delta;
use crate::engine::sequence::FinishReason;
use crate::server::anthropic::error::error_body;
use crate::server::error::ApiError;
use crate::server::generation::Generation;
use crate::server::tools::CallIds;
use crate::server::validation::GenerationPlan;
use crate::server::ModelState;
use crate::text::reasoning::{self, Piece, ReasoningParser};
use crate::text::stop::StopStrings;
use crate::text::tool_parser::{ToolCallParser, ToolEvent};

/// A content block of the reply; in a `content_block_start` event, as it
/// opens (empty).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// wick signs nothing: the signature is empty.
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart {
        message: MessageBody,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: Usage,
    },
    MessageStop,
    Ping,
}

impl StreamEvent {
    /// The SSE `event:` name, the same as `type`.
    fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
        }
    }

    fn sse(&self) -> Event {
        Event::default()
            .event(self.name())
            .data(serde_json::to_string(self).unwrap_or_default())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageDelta {
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
}

/// A whole reply, and the message of `message_start` (no content yet, no
/// stop reason).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageBody {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// Anthropic's usage: `input_tokens` are the prompt tokens computed for
/// this request, `cache_read_input_tokens` those wick's prefix cache
/// supplied (their sum is the prompt); wick writes no cache on request, so
/// `cache_creation_input_tokens` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub output_tokens: usize,
}

fn usage(g: &Generation) -> Usage {
    let u = g.usage();
    let cached = u.prompt_tokens_details.cached_tokens;
    Usage {
        input_tokens: u.prompt_tokens.saturating_sub(cached),
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cached,
        output_tokens: u.completion_tokens,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    ToolUse,
}

/// One reply's deltas as content-block events.
pub struct BlockBuilder {
    thinking: Option<ReasoningParser>,
    parser: Option<ToolCallParser>,
    /// The block now open.
    open: Option<(usize, Kind)>,
    /// Blocks opened so far.
    blocks: usize,
    /// Whitespace after a call or before anything, held until text
    /// follows it (then sent) or a call or the end does (then dropped),
    /// so calls are not separated by blocks of blank text.
    blank: String,
    /// Calls started.
    calls: usize,
    parallel: bool,
    ids: CallIds,
    stops: StopStrings,
    /// A token's text, as it reads mid-reply.
    token_text: Box<dyn Fn(u32) -> String + Send>,
    /// Set by the delta that finishes the reply.
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
}

impl BlockBuilder {
    pub fn new(plan: &GenerationPlan, model: Arc<ModelState>) -> Self {
        let token_text = move |t: u32| {
            model
                .tokenizer
                .decode_continuation(&[t])
                .unwrap_or_default()
        };
        BlockBuilder {
            thinking: plan.reasoning.map(ReasoningParser::new),
            parser: plan.tools.parser(),
            open: None,
            blocks: 0,
            blank: String::new(),
            calls: 0,
            parallel: plan.tools.parallel,
            ids: plan.tools.ids,
            stops: plan.params.stop.clone(),
            token_text: Box::new(token_text),
            stop_reason: None,
            stop_sequence: None,
        }
    }

    /// The events of one delta; the last delta closes the open block and
    /// sets the stop reason.
    pub fn push(&mut self, d: Delta) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let pieces = reasoning::split(self.thinking.as_mut(), d.text.clone(), d.finish.is_some());
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => self.append(Kind::Thinking, text, &mut out),
                Piece::Content(text) => match &mut self.parser {
                    None => self.append(Kind::Text, text, &mut out),
                    Some(parser) => {
                        let events = parser.push(&text);
                        self.tool_events(events, &mut out);
                    }
                },
            }
        }
        let Some(finish) = d.finish.clone() else {
            return out;
        };
        if let Some(parser) = &mut self.parser {
            let events = parser.finish();
            self.tool_events(events, &mut out);
        }
        self.close(&mut out);
        (self.stop_reason, self.stop_sequence) = match finish {
            FinishReason::Length => (Some("max_tokens"), None),
            _ if self.calls > 0 => (Some("tool_use"), None),
            _ => match self.matched_stop(&d) {
                Some(stop) => (Some("stop_sequence"), Some(stop)),
                None => (Some("end_turn"), None),
            },
        };
        out
    }

    fn tool_events(&mut self, events: Vec<ToolEvent>, out: &mut Vec<StreamEvent>) {
        for ev in events {
            match ev {
                ToolEvent::Content(text) => self.append(Kind::Text, text, out),
                // Without parallel calls, only the first is kept.
                ToolEvent::Start { index, .. } | ToolEvent::Arguments { index, .. }
                    if index > 0 && !self.parallel => {}
                ToolEvent::Start { index, name } => {
                    self.calls = index + 1;
                    self.blank.clear();
                    let id = match self.ids {
                        CallIds::OpenAi => tool_use_id(),
                        // Mistral's templates take back no other ids.
                        CallIds::Mistral => self.ids.issue(),
                    };
                    let block = ContentBlock::ToolUse {
                        id,
                        name,
                        input: Value::Object(Default::default()),
                    };
                    self.start(Kind::ToolUse, block, out);
                }
                ToolEvent::Arguments { text, .. } => {
                    if let (Some((index, Kind::ToolUse)), false) = (self.open, text.is_empty()) {
                        out.push(StreamEvent::ContentBlockDelta {
                            index,
                            delta: BlockDelta::InputJsonDelta { partial_json: text },
                        });
                    }
                }
            }
        }
    }

    /// Text or thinking, into the open block of its kind or a new one.
    fn append(&mut self, kind: Kind, mut text: String, out: &mut Vec<StreamEvent>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some((index, open)) if open == kind => index,
            _ if kind == Kind::Text && text.trim().is_empty() => {
                self.blank.push_str(&text);
                return;
            }
            _ => {
                let block = match kind {
                    Kind::Thinking => ContentBlock::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    },
                    _ => {
                        text.insert_str(0, &std::mem::take(&mut self.blank));
                        ContentBlock::Text {
                            text: String::new(),
                        }
                    }
                };
                self.start(kind, block, out)
            }
        };
        let delta = match kind {
            Kind::Thinking => BlockDelta::ThinkingDelta { thinking: text },
            _ => BlockDelta::TextDelta { text },
        };
        out.push(StreamEvent::ContentBlockDelta { index, delta });
    }

    fn start(&mut self, kind: Kind, block: ContentBlock, out: &mut Vec<StreamEvent>) -> usize {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, kind));
        out.push(StreamEvent::ContentBlockStart {
            index,
            content_block: block,
        });
        index
    }

    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        if let Some((index, _)) = self.open.take() {
            out.push(StreamEvent::ContentBlockStop { index });
        }
    }

    /// Which stop sequence ended the reply, if one did. The engine shows
    /// the text before the match (`d.text`, the rest of what it held back)
    /// and the token that completed it: the match starts where `d.text`
    /// ends and ends inside that token's text, so a stop sequence fits
    /// when `d.text` + it ends with a start of the token's text (the
    /// shortest that fits matched first).
    fn matched_stop(&self, d: &Delta) -> Option<String> {
        if d.finish != Some(FinishReason::Stop) || self.stops.is_empty() {
            return None;
        }
        let piece = d.token.map(&self.token_text).unwrap_or_default();
        let fits = |stop: &&str| {
            let seen = format!("{}{stop}", d.text);
            piece
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .any(|end| seen.ends_with(&piece[..end]))
        };
        let found = self.stops.iter().filter(fits).min_by_key(|s| s.len());
        match found {
            Some(stop) => Some(stop.to_string()),
            // The engine stops a sequence early only for a stop string.
            None if d.abort_in_engine && self.stops.len() == 1 => {
                self.stops.iter().next().map(str::to_string)
            }
            None => None,
        }
    }
}

/// An id as Anthropic's look: `toolu_` and 24 letters and digits.
fn tool_use_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("toolu_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// Applies `ev` to a whole reply's content; `json` holds each tool_use
/// block's arguments text until its block stops.
fn apply(content: &mut Vec<ContentBlock>, json: &mut Vec<String>, ev: StreamEvent) {
    match ev {
        StreamEvent::ContentBlockStart { content_block, .. } => {
            content.push(content_block);
            json.push(String::new());
        }
        StreamEvent::ContentBlockDelta { index, delta } => match (&mut content[index], delta) {
            (ContentBlock::Text { text }, BlockDelta::TextDelta { text: more }) => {
                text.push_str(&more)
            }
            (
                ContentBlock::Thinking { thinking, .. },
                BlockDelta::ThinkingDelta { thinking: more },
            ) => thinking.push_str(&more),
            (ContentBlock::ToolUse { .. }, BlockDelta::InputJsonDelta { partial_json }) => {
                json[index].push_str(&partial_json)
            }
            _ => {}
        },
        StreamEvent::ContentBlockStop { index } => {
            if let ContentBlock::ToolUse { input, .. } = &mut content[index] {
                let text = std::mem::take(&mut json[index]);
                // Arguments cut off by max_tokens stay as the model wrote them.
                if !text.trim().is_empty() {
                    *input = serde_json::from_str(&text).unwrap_or(Value::String(text));
                }
            }
        }
        _ => {}
    }
}

fn error_event(e: &ApiError) -> Event {
    Event::default()
        .event("error")
        .data(error_body(e).to_string())
}

/// Streams the reply over SSE, or answers it whole.
pub async fn respond(
    mut g: Generation,
    plan: &GenerationPlan,
    id: String,
    keep_alive: Duration,
) -> Result<Response, ApiError> {
    let model = g.model().clone();
    let mut builder = BlockBuilder::new(plan, model.clone());
    let message = |content, builder: &BlockBuilder, usage| MessageBody {
        id: id.clone(),
        kind: "message",
        role: "assistant",
        model: model.name.clone(),
        content,
        stop_reason: builder.stop_reason,
        stop_sequence: builder.stop_sequence.clone(),
        usage,
    };
    if plan.stream {
        // Sent with the first token, once the prompt's cached part is known.
        let start = StreamEvent::MessageStart {
            message: message(
                Vec::new(),
                &builder,
                Usage {
                    input_tokens: 0,
                    cache_creation_input_tokens: 0,
                    cache_read_input_tokens: 0,
                    output_tokens: 0,
                },
            ),
        };
        let events = async_stream::stream! {
            let mut start = Some(start);
            loop {
                let next = g.next().await;
                if let (Some(StreamEvent::MessageStart { mut message }), Some(Ok(_)) | None) =
                    (start.take(), &next)
                {
                    message.usage = usage(&g);
                    yield StreamEvent::MessageStart { message }.sse();
                    yield StreamEvent::Ping.sse();
                }
                match next {
                    Some(Ok((_, delta))) => {
                        for ev in builder.push(delta) {
                            yield ev.sse();
                        }
                    }
                    Some(Err(e)) => {
                        yield error_event(&e);
                        break;
                    }
                    None => {
                        let delta = MessageDelta {
                            stop_reason: builder.stop_reason,
                            stop_sequence: builder.stop_sequence.clone(),
                        };
                        yield StreamEvent::MessageDelta { delta, usage: usage(&g) }.sse();
                        yield StreamEvent::MessageStop.sse();
                        break;
                    }
                }
            }
        };
        let events = futures::StreamExt::map(events, Ok::<_, Infallible>);
        let keep_alive = KeepAlive::new().interval(keep_alive);
        return Ok(Sse::new(events).keep_alive(keep_alive).into_response());
    }
    let (mut content, mut json) = (Vec::new(), Vec::new());
    while let Some(next) = g.next().await {
        let (_, delta) = next?;
        for ev in builder.push(delta) {
            apply(&mut content, &mut json, ev);
        }
    }
    Ok(Json(message(content, &builder, usage(&g))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tool_parser::ToolFormat;

    /// A builder whose tokens all read as `piece`.
    fn builder(
        parser: Option<ToolCallParser>,
        thinks: bool,
        stops: &[&str],
        piece: &str,
    ) -> BlockBuilder {
        let piece = piece.to_string();
        BlockBuilder {
            thinking: thinks.then(|| ReasoningParser::new(false)),
            parser,
            open: None,
            blocks: 0,
            blank: String::new(),
            calls: 0,
            parallel: true,
            ids: CallIds::OpenAi,
            stops: stops
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into(),
            token_text: Box::new(move |_| piece.clone()),
            stop_reason: None,
            stop_sequence: None,
        }
    }

    /// `pieces` as deltas, the last ending with `finish`: the events, and
    /// the whole content they make.
    fn run(
        b: &mut BlockBuilder,
        pieces: &[&str],
        finish: FinishReason,
    ) -> (Vec<StreamEvent>, Vec<ContentBlock>) {
        let mut events = Vec::new();
        for (k, text) in pieces.iter().enumerate() {
            let last = k + 1 == pieces.len();
            events.extend(b.push(Delta {
                text: text.to_string(),
                token: Some(7),
                finish: last.then(|| finish.clone()),
                ..Default::default()
            }));
        }
        let (mut content, mut json) = (Vec::new(), Vec::new());
        for ev in events.clone() {
            apply(&mut content, &mut json, ev);
        }
        (events, content)
    }

    fn text(t: &str) -> ContentBlock {
        ContentBlock::Text { text: t.into() }
    }

    #[test]
    fn text_streams_as_one_block_and_ends_the_turn() {
        let mut b = builder(None, false, &[], "");
        let (events, content) = run(&mut b, &["Hello", " world", ""], FinishReason::Stop);
        assert_eq!(content, [text("Hello world")]);
        assert_eq!(
            events[0],
            StreamEvent::ContentBlockStart {
                index: 0,
                content_block: text("")
            }
        );
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(events[3], StreamEvent::ContentBlockStop { index: 0 });
        assert_eq!((b.stop_reason, b.stop_sequence), (Some("end_turn"), None));

        let mut b = builder(None, false, &[], "");
        let (_, content) = run(&mut b, &["Hel", "lo"], FinishReason::Length);
        assert_eq!(content, [text("Hello")]);
        assert_eq!(b.stop_reason, Some("max_tokens"));
        let mut b = builder(None, false, &[], "");
        let (events, content) = run(&mut b, &[""], FinishReason::Stop);
        assert!(events.is_empty() && content.is_empty());
    }

    const CALLS: [&str; 5] = [
        "Checking.",
        "<tool_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": ",
        "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}",
        "</tool_call>\n",
    ];

    #[test]
    fn calls_are_tool_use_blocks_without_blank_text_between() {
        let mut b = builder(
            Some(ToolCallParser::new(ToolFormat::Hermes)),
            false,
            &[],
            "",
        );
        let (events, content) = run(&mut b, &CALLS, FinishReason::Stop);
        assert_eq!(content.len(), 3, "{content:?}");
        assert_eq!(content[0], text("Checking."));
        let (ContentBlock::ToolUse { id: a, name, input }, ContentBlock::ToolUse { id: b2, .. }) =
            (&content[1], &content[2])
        else {
            panic!("{content:?}")
        };
        assert_eq!(
            (name.as_str(), input),
            ("get_weather", &serde_json::json!({"city": "Paris"}))
        );
        assert!(
            a.starts_with("toolu_") && a.len() == 30 && a != b2,
            "{a} {b2}"
        );
        assert_eq!(
            content[2],
            ContentBlock::ToolUse {
                id: b2.clone(),
                name: "now".into(),
                input: serde_json::json!({})
            }
        );
        assert_eq!(b.stop_reason, Some("tool_use"));
        // Each block opens empty, its arguments follow as JSON pieces.
        assert!(events.iter().any(|e| matches!(
            e,
            StreamEvent::ContentBlockDelta {
                index: 1,
                delta: BlockDelta::InputJsonDelta { .. }
            }
        )));

        let mut b = builder(
            Some(ToolCallParser::new(ToolFormat::Hermes)),
            false,
            &[],
            "",
        );
        b.parallel = false;
        let (_, content) = run(&mut b, &CALLS[1..], FinishReason::Stop);
        assert_eq!(content.len(), 1, "{content:?}");
        assert_eq!(b.stop_reason, Some("tool_use"));
    }

    #[test]
    fn thinking_is_a_block_before_the_answer() {
        let mut b = builder(None, true, &[], "");
        let (_, content) = run(
            &mut b,
            &["<think>I should", " say hi.</", "think>\n\nHi", "!"],
            FinishReason::Stop,
        );
        assert_eq!(
            content,
            [
                ContentBlock::Thinking {
                    thinking: "I should say hi.".into(),
                    signature: String::new()
                },
                text("Hi!")
            ]
        );
    }

    fn stopped(
        stops: &[&str],
        seen: &str,
        piece: &str,
        early: bool,
    ) -> (Option<&'static str>, Option<String>) {
        let mut b = builder(None, false, stops, piece);
        b.push(Delta {
            text: seen.into(),
            token: Some(1),
            finish: Some(FinishReason::Stop),
            abort_in_engine: early,
            ..Default::default()
        });
        (b.stop_reason, b.stop_sequence)
    }

    #[test]
    fn the_stop_sequence_that_matched_is_named() {
        let stop = |s: &str| (Some("stop_sequence"), Some(s.to_string()));
        assert_eq!(stopped(&["xyz", "END"], "The ", "END", true), stop("END"));
        // The match began in text held back before the last token.
        assert_eq!(stopped(&["xyz", "END"], "The ", "ND", true), stop("END"));
        // The token goes on past the match; the earliest match wins.
        assert_eq!(stopped(&["\n", "ab"], "", "ab\nc", true), stop("ab"));
        assert_eq!(stopped(&["\n", "ab"], "x", "\nab", true), stop("\n"));
        // An end-of-sequence token is no stop sequence.
        assert_eq!(
            stopped(&["END"], "Done.", "", false),
            (Some("end_turn"), None)
        );
        // One stop sequence, ended early by the engine: that one.
        assert_eq!(stopped(&["END"], "", "", true), stop("END"));
    }
}
