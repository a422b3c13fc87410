//! The reply of `POST /v1/messages` as Anthropic's content blocks: text,
//! thinking (a template that thinks) and `tool_use`, from the reply
//! events every API reads (`server::reply`). [`Blocks`] turns them into
//! stream events (`content_block_start`, `content_block_delta`,
//! `content_block_stop`); a stream sends them as SSE with `event:` names
//! between `message_start` and `message_delta` + `message_stop`, and a
//! whole reply is those same events applied to its content, so the two
//! cannot drift apart.

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;

use crate::engine::sequence::FinishReason;
use crate::server::anthropic::error::error_body;
use crate::server::error::ApiError;
use crate::server::protocol;
use crate::server::reply::{ReplyEvent, ReplyStep};
use crate::server::respond::Render;
use crate::server::tools::CallIds;
use crate::server::validation::GenerationPlan;

/// A content block of the reply; in a `content_block_start` event, as it
/// opens (empty).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = MessageStreamEvent)]
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
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct MessageDelta {
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
}

/// A whole reply, and the message of `message_start` (no content yet, no
/// stop reason).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = AnthropicUsage)]
pub struct Usage {
    pub input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub output_tokens: usize,
}

impl Usage {
    fn of(u: protocol::Usage) -> Self {
        let cached = u.prompt_tokens_details.cached_tokens;
        Usage {
            input_tokens: u.prompt_tokens.saturating_sub(cached),
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
            output_tokens: u.completion_tokens,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    ToolUse,
}

/// The reply as content blocks: the [`Render`] of the Messages API.
pub struct Blocks {
    id: String,
    model: String,
    /// `message_start` went out.
    started: bool,
    /// The block now open.
    open: Option<(usize, Kind)>,
    /// Blocks opened so far.
    blocks: usize,
    /// Whitespace after a call or before anything, held until text
    /// follows it (then sent) or a call or the end does (then dropped),
    /// so calls are not separated by blocks of blank text.
    blank: String,
    ids: CallIds,
    /// Set by the step that finishes the reply.
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
}

impl Blocks {
    pub fn new(plan: &GenerationPlan, id: String, model: String) -> Self {
        Blocks {
            id,
            model,
            started: false,
            open: None,
            blocks: 0,
            blank: String::new(),
            ids: plan.tools.ids,
            stop_reason: None,
            stop_sequence: None,
        }
    }

    /// The message before any content, with the usage known so far.
    fn message(&self, usage: Usage) -> MessageBody {
        MessageBody {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage,
        }
    }

    /// `message_start` and `ping`, once: sent with the first delta (or at
    /// the end), when the prompt's cached part is known.
    fn start(&mut self, usage: impl FnOnce() -> Usage, out: &mut Vec<StreamEvent>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let message = self.message(usage());
        out.push(StreamEvent::MessageStart { message });
        out.push(StreamEvent::Ping);
    }

    fn event(&mut self, ev: ReplyEvent, out: &mut Vec<StreamEvent>) {
        match ev {
            ReplyEvent::Text(text) => self.append(Kind::Text, text, out),
            ReplyEvent::Reasoning(text) => self.append(Kind::Thinking, text, out),
            ReplyEvent::ToolCallStart { name, .. } => {
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
                self.start_block(Kind::ToolUse, block, out);
            }
            ReplyEvent::ToolCallArgs { text, .. } => {
                if let (Some((index, Kind::ToolUse)), false) = (self.open, text.is_empty()) {
                    out.push(StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::InputJsonDelta { partial_json: text },
                    });
                }
            }
            ReplyEvent::Finish(f) => {
                self.close(out);
                (self.stop_reason, self.stop_sequence) = match f.reason {
                    FinishReason::Length => (Some("max_tokens"), None),
                    _ if f.calls > 0 => (Some("tool_use"), None),
                    _ => match f.stop_sequence {
                        Some(stop) => (Some("stop_sequence"), Some(stop)),
                        None => (Some("end_turn"), None),
                    },
                };
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
                self.start_block(kind, block, out)
            }
        };
        let delta = match kind {
            Kind::Thinking => BlockDelta::ThinkingDelta { thinking: text },
            _ => BlockDelta::TextDelta { text },
        };
        out.push(StreamEvent::ContentBlockDelta { index, delta });
    }

    fn start_block(
        &mut self,
        kind: Kind,
        block: ContentBlock,
        out: &mut Vec<StreamEvent>,
    ) -> usize {
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
}

/// An id as Anthropic's look: `toolu_` and 24 letters and digits.
fn tool_use_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("toolu_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// A whole reply in the making: the message, and each tool_use block's
/// arguments text until its block stops.
pub struct Whole {
    message: MessageBody,
    json: Vec<String>,
}

impl Render for Blocks {
    type Event = StreamEvent;
    type Whole = Whole;
    const DONE: bool = false;

    fn step(
        &mut self,
        _choice: usize,
        step: ReplyStep,
        usage: &dyn Fn() -> protocol::Usage,
    ) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.start(|| Usage::of(usage()), &mut out);
        for ev in step.events {
            self.event(ev, &mut out);
        }
        out
    }

    fn finish(&mut self, usage: protocol::Usage) -> Vec<StreamEvent> {
        let usage = Usage::of(usage);
        let mut out = Vec::new();
        self.start(|| usage, &mut out);
        let delta = MessageDelta {
            stop_reason: self.stop_reason,
            stop_sequence: self.stop_sequence.clone(),
        };
        out.push(StreamEvent::MessageDelta { delta, usage });
        out.push(StreamEvent::MessageStop);
        out
    }

    fn fail(&mut self, e: &ApiError) -> Vec<Event> {
        vec![Event::default()
            .event("error")
            .data(error_body(e).to_string())]
    }

    fn sse(&self, event: &StreamEvent) -> Event {
        Event::default()
            .event(event.name())
            .data(serde_json::to_string(event).unwrap_or_default())
    }

    fn whole(&self, _choices: usize) -> Whole {
        Whole {
            message: self.message(Usage::default()),
            json: Vec::new(),
        }
    }

    /// Applies `ev` to the whole reply.
    fn fold(&self, whole: &mut Whole, ev: StreamEvent) {
        let (content, json) = (&mut whole.message.content, &mut whole.json);
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
                    // `input` is an object in Anthropic's type, so arguments
                    // cut off by max_tokens (`stop_reason` says so) are `{}`.
                    if !text.trim().is_empty() {
                        *input = serde_json::from_str(&text)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| Value::Object(Default::default()));
                    }
                }
            }
            StreamEvent::MessageDelta { delta, usage } => {
                whole.message.stop_reason = delta.stop_reason;
                whole.message.stop_sequence = delta.stop_sequence;
                whole.message.usage = usage;
            }
            _ => {}
        }
    }

    fn answer(&self, whole: Whole) -> Response {
        Json(whole.message).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::output::Delta;
    use crate::server::reply::testing::{deltas, hermes, parser, plan};
    use crate::server::tools::ToolMode;

    /// `pieces` as the deltas of a reply (the last ending with `finish`)
    /// through `plan`'s parser (tokens reading as `piece`): the renderer,
    /// its content-block events, and the whole content they make.
    fn run(
        plan: &GenerationPlan,
        pieces: &[&str],
        finish: FinishReason,
        piece: &str,
    ) -> (Blocks, Vec<StreamEvent>, Vec<ContentBlock>) {
        run_deltas(plan, deltas(pieces, finish), piece)
    }

    fn run_deltas(
        plan: &GenerationPlan,
        deltas: Vec<Delta>,
        piece: &str,
    ) -> (Blocks, Vec<StreamEvent>, Vec<ContentBlock>) {
        let mut p = parser(plan, piece);
        let mut b = Blocks::new(plan, "msg_1".into(), "m".into());
        let usage = || protocol::Usage {
            prompt_tokens: 0,
            completion_tokens: 0,
            total_tokens: 0,
            prompt_tokens_details: protocol::PromptTokensDetails { cached_tokens: 0 },
            completion_tokens_details: None,
        };
        let mut events = Vec::new();
        for d in deltas {
            events.extend(b.step(0, p.push(d), &usage));
        }
        events.retain(|e| !matches!(e, StreamEvent::MessageStart { .. } | StreamEvent::Ping));
        let mut whole = b.whole(1);
        for ev in events.clone() {
            b.fold(&mut whole, ev);
        }
        (b, events, whole.message.content)
    }

    fn text(t: &str) -> ContentBlock {
        ContentBlock::Text { text: t.into() }
    }

    #[test]
    fn text_streams_as_one_block_and_ends_the_turn() {
        let text_only = plan(None, ToolMode::Off, true);
        let (b, events, content) =
            run(&text_only, &["Hello", " world", ""], FinishReason::Stop, "");
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

        let (b, _, content) = run(&text_only, &["Hel", "lo"], FinishReason::Length, "");
        assert_eq!(content, [text("Hello")]);
        assert_eq!(b.stop_reason, Some("max_tokens"));
        let (_, events, content) = run(&text_only, &[""], FinishReason::Stop, "");
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
        let (b, events, content) = run(&plan(None, hermes(), true), &CALLS, FinishReason::Stop, "");
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

        let one_call = plan(None, hermes(), false);
        let (b, _, content) = run(&one_call, &CALLS[1..], FinishReason::Stop, "");
        assert_eq!(content.len(), 1, "{content:?}");
        assert_eq!(b.stop_reason, Some("tool_use"));
    }

    #[test]
    fn thinking_is_a_block_before_the_answer() {
        let (_, _, content) = run(
            &plan(Some(false), ToolMode::Off, true),
            &["<think>I should", " say hi.</", "think>\n\nHi", "!"],
            FinishReason::Stop,
            "",
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
        let mut plan = plan(None, ToolMode::Off, true);
        plan.params.stop = stops
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .into();
        let delta = Delta {
            text: seen.into(),
            token: Some(1),
            finish: Some(FinishReason::Stop),
            abort_in_engine: early,
            ..Default::default()
        };
        let (b, _, _) = run_deltas(&plan, vec![delta], piece);
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
