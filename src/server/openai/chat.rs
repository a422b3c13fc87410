//! `POST /v1/chat/completions`: the handler and the builder that shapes its
//! chunks (the role first, content and tool-call deltas, an empty delta
//! with the finish).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;

use crate::engine::output::TokenLogprob;
use crate::engine::sequence::FinishReason;
use crate::server::error::ApiError;
use crate::server::generation;
use crate::server::http::access::{request_id, AccessRecord};
use crate::server::openai::chunks::{Chunks, Envelope, OutputBuilder};
use crate::server::protocol::{
    ChatChoice, ChatCompletionRequest, ChatDelta, ChatLogprobs, ChatTokenLogprob, ChunkChoice,
    FunctionCallDelta, ResponseFunctionCall, ResponseMessage, ResponseToolCall, ToolCallDelta,
    TopLogprob,
};
use crate::server::reply::{ReplyEvent, ReplyStep};
use crate::server::respond::respond;
use crate::server::tools::{CallIds, ToolMode};
use crate::server::validation::{validate_chat, GenerationPlan};
use crate::server::AppState;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<AccessRecord>,
    headers: HeaderMap,
    body: Request,
) -> Result<Response, ApiError> {
    let (g, plan) =
        generation::begin::<ChatCompletionRequest>(&state, body, validate_chat, access).await?;
    let builder = ChatBuilder::new(&plan, g.num_choices());
    let env = Envelope::new(
        format!("chatcmpl-{}", request_id(&headers)),
        &g.model().name,
    );
    let chunks = Chunks::new(builder, env, &plan);
    respond(g, &plan, chunks, state.limits.sse_keep_alive).await
}

pub struct ChatBuilder {
    want_logprobs: bool,
    /// Per choice: its role chunk went out.
    started: Vec<bool>,
    /// The reply is calls alone (`tool_choice` required or named).
    tool_only: bool,
    /// The request named the function to call.
    named: bool,
    /// How the calls' ids look.
    ids: CallIds,
    /// The call goes out as the deprecated `function_call`.
    legacy: bool,
}

fn chunk(index: usize, delta: ChatDelta) -> ChunkChoice {
    ChunkChoice {
        index,
        delta,
        logprobs: None,
        finish_reason: None,
    }
}

impl ChatBuilder {
    pub fn new(plan: &GenerationPlan, choices: usize) -> Self {
        ChatBuilder {
            want_logprobs: plan.logprobs.is_some(),
            started: vec![false; choices],
            tool_only: matches!(plan.tools.mode, ToolMode::Required | ToolMode::Named(_)),
            named: matches!(plan.tools.mode, ToolMode::Named(_)),
            ids: plan.tools.ids,
            legacy: plan.tools.legacy,
        }
    }
}

impl OutputBuilder for ChatBuilder {
    type Chunk = ChunkChoice;
    type Choice = ChatChoice;
    const CHUNK_OBJECT: &'static str = "chat.completion.chunk";
    const OBJECT: &'static str = "chat.completion";

    fn chunks(&mut self, i: usize, step: ReplyStep) -> Vec<ChunkChoice> {
        let mut out = Vec::new();
        let mut logprobs = self.want_logprobs.then(|| chat_logprobs(&step.logprobs));
        let mut deltas = Vec::new();
        let mut finish = None;
        for ev in step.events {
            deltas.push(match ev {
                ReplyEvent::Reasoning(text) => ChatDelta {
                    reasoning_content: Some(text),
                    ..ChatDelta::default()
                },
                ReplyEvent::Text(text) => content(text),
                ReplyEvent::ToolCallStart { index, name } => {
                    let id = Some(self.ids.issue());
                    self.call(index, id, Some(name), String::new())
                }
                ReplyEvent::ToolCallArgs { index, text } => self.call(index, None, None, text),
                ReplyEvent::Finish(f) => {
                    finish = Some(f);
                    continue;
                }
            });
        }
        for delta in deltas {
            let empty = delta.content == Some(Some(String::new()))
                && delta.tool_calls.is_none()
                && delta.function_call.is_none()
                && delta.reasoning_content.is_none();
            if empty && logprobs.as_ref().is_none_or(|l| l.content.is_empty()) {
                continue;
            }
            out.push(ChunkChoice {
                logprobs: logprobs.take(),
                ..chunk(i, delta)
            });
        }
        // Logprobs of tokens whose text is still held back.
        if logprobs.as_ref().is_some_and(|l| !l.content.is_empty()) {
            out.push(ChunkChoice {
                logprobs,
                ..chunk(i, content(String::new()))
            });
        }
        if let Some(f) = finish {
            // A call the request named ends as `stop`, as at OpenAI.
            let reason = match f.reason {
                FinishReason::Stop if f.calls > 0 && !self.named => match self.legacy {
                    true => "function_call",
                    false => "tool_calls",
                },
                r => r.as_str(),
            };
            out.push(ChunkChoice {
                finish_reason: Some(reason.to_string()),
                ..chunk(i, ChatDelta::default())
            });
        }
        self.open(i, &mut out);
        out
    }
    fn empty_choice(&self, index: usize) -> ChatChoice {
        ChatChoice {
            index,
            message: ResponseMessage {
                role: "assistant".into(),
                content: Some(String::new()),
                reasoning_content: None,
                tool_calls: None,
                function_call: None,
            },
            logprobs: self.want_logprobs.then(ChatLogprobs::default),
            finish_reason: None,
        }
    }

    fn chunk_index(chunk: &ChunkChoice) -> usize {
        chunk.index
    }

    fn merge(choice: &mut ChatChoice, chunk: ChunkChoice) {
        let message = &mut choice.message;
        if let Some(Some(text)) = chunk.delta.content {
            message.content.get_or_insert_default().push_str(&text);
        }
        if let Some(text) = chunk.delta.reasoning_content {
            message
                .reasoning_content
                .get_or_insert_default()
                .push_str(&text);
        }
        if let Some(piece) = chunk.delta.function_call {
            let call = message.function_call.get_or_insert(ResponseFunctionCall {
                name: String::new(),
                arguments: String::new(),
            });
            call.name.push_str(&piece.name.unwrap_or_default());
            call.arguments
                .push_str(&piece.arguments.unwrap_or_default());
        }
        for call in chunk.delta.tool_calls.into_iter().flatten() {
            let calls = message.tool_calls.get_or_insert_default();
            match call.id {
                Some(id) => calls.push(ResponseToolCall {
                    id,
                    kind: "function".into(),
                    function: ResponseFunctionCall {
                        name: call.function.name.unwrap_or_default(),
                        arguments: call.function.arguments.unwrap_or_default(),
                    },
                }),
                None => {
                    if let (Some(last), Some(more)) = (calls.last_mut(), call.function.arguments) {
                        last.function.arguments.push_str(&more);
                    }
                }
            }
        }
        // A reply that is only calls has null content, as OpenAI's.
        let calls = message.tool_calls.is_some() || message.function_call.is_some();
        if calls && message.content.as_deref() == Some("") {
            message.content = None;
        }
        if let (Some(all), Some(more)) = (&mut choice.logprobs, chunk.logprobs) {
            all.content.extend(more.content);
        }
        if chunk.finish_reason.is_some() {
            choice.finish_reason = chunk.finish_reason;
        }
    }
}

impl ChatBuilder {
    /// The role goes on each choice's first chunk, as OpenAI sends it: a
    /// chunk of its own with `content: ""` before text, or on the first
    /// call's delta with `content: null` when the reply opens with calls.
    fn open(&mut self, i: usize, out: &mut Vec<ChunkChoice>) {
        let Some(first) = out.first_mut() else {
            return;
        };
        if std::mem::replace(&mut self.started[i], true) {
            return;
        }
        let role = Some("assistant".to_string());
        if first.delta.tool_calls.is_some() || first.delta.function_call.is_some() {
            first.delta.role = role;
            first.delta.content = Some(None);
            return;
        }
        let content = if self.tool_only {
            None
        } else {
            Some(String::new())
        };
        out.insert(
            0,
            chunk(
                i,
                ChatDelta {
                    role,
                    content: Some(content),
                    ..ChatDelta::default()
                },
            ),
        );
    }

    /// A piece of call `index` (its id and name with the first) as a delta.
    fn call(
        &self,
        index: usize,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    ) -> ChatDelta {
        let function = FunctionCallDelta {
            name,
            arguments: Some(arguments),
        };
        if self.legacy {
            return ChatDelta {
                function_call: Some(function),
                ..ChatDelta::default()
            };
        }
        ChatDelta {
            tool_calls: Some(vec![ToolCallDelta {
                index,
                kind: id.as_ref().map(|_| "function".to_string()),
                id,
                function,
            }]),
            ..ChatDelta::default()
        }
    }
}

fn content(text: String) -> ChatDelta {
    ChatDelta {
        content: Some(Some(text)),
        ..ChatDelta::default()
    }
}

fn chat_logprobs(lps: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: lps
            .iter()
            .map(|lp| ChatTokenLogprob {
                token: lp.token.clone(),
                logprob: lp.logprob,
                bytes: lp.token.as_bytes().to_vec(),
                top_logprobs: lp
                    .top
                    .iter()
                    .map(|(t, l)| TopLogprob {
                        token: t.clone(),
                        logprob: *l,
                        bytes: t.as_bytes().to_vec(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::reply::testing::{hermes, plan, steps};
    use crate::text::tool_parser::ToolFormat;

    fn builder(mode: ToolMode, parallel: bool) -> (ChatBuilder, GenerationPlan) {
        let plan = plan(Some(false), mode, parallel);
        (ChatBuilder::new(&plan, 1), plan)
    }

    /// A request in the deprecated `functions` form: its call goes out as
    /// `function_call` pieces, merges into `message.function_call`, and
    /// ends `function_call`.
    #[test]
    fn legacy_calls_take_the_old_shape() {
        let (mut b, plan) = builder(ToolMode::Auto(ToolFormat::JsonList), false);
        b.legacy = true;
        let (chunks, whole) = run(
            &mut b,
            &plan,
            &["[{\"name\": \"add\", ", "\"parameters\": {\"a\": 1}}]"],
        );
        assert!(chunks.iter().all(|c| c.delta.tool_calls.is_none()));
        let first = &chunks[0].delta;
        assert_eq!(first.role.as_deref(), Some("assistant"));
        assert_eq!(first.content, Some(None));
        assert_eq!(
            first.function_call.as_ref().and_then(|f| f.name.as_deref()),
            Some("add")
        );
        assert_eq!(whole.finish_reason.as_deref(), Some("function_call"));
        assert_eq!(
            (whole.message.content, whole.message.tool_calls),
            (None, None)
        );
        assert_eq!(
            whole.message.function_call,
            Some(ResponseFunctionCall {
                name: "add".into(),
                arguments: "{\"a\": 1}".into()
            })
        );
    }

    fn run(
        b: &mut ChatBuilder,
        plan: &GenerationPlan,
        pieces: &[&str],
    ) -> (Vec<ChunkChoice>, ChatChoice) {
        let mut chunks = Vec::new();
        for step in steps(plan, pieces, FinishReason::Stop) {
            chunks.extend(b.chunks(0, step));
        }
        let mut whole = b.empty_choice(0);
        for c in chunks.clone() {
            ChatBuilder::merge(&mut whole, c);
        }
        (chunks, whole)
    }

    #[test]
    fn tool_calls_stream_as_openai_deltas_and_merge_whole() {
        let pieces = [
            "Checking.",
            "<tool_call>\n{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": ",
            "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}",
            "</tool_call>",
        ];
        let (mut b, plan) = builder(hermes(), true);
        let (chunks, whole) = run(&mut b, &plan, &pieces);
        let calls: Vec<&ToolCallDelta> = chunks
            .iter()
            .flat_map(|c| c.delta.tool_calls.iter().flatten())
            .collect();
        // Each call: id, type and name first, then its arguments in pieces.
        assert_eq!(calls[0].function.name.as_deref(), Some("get_weather"));
        assert!(calls[0].id.as_ref().unwrap().starts_with("call_"));
        assert_eq!(calls[0].kind.as_deref(), Some("function"));
        assert!(calls[1..3].iter().all(|c| c.id.is_none() && c.index == 0));
        let last = chunks.last().unwrap();
        assert_eq!(last.finish_reason.as_deref(), Some("tool_calls"));
        let msg = &whole.message;
        assert_eq!(msg.content.as_deref(), Some("Checking."));
        let calls = msg.tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.name, "get_weather");
        let args: serde_json::Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
        assert_eq!(args, serde_json::json!({"city": "Paris"}));
        assert_eq!(
            (
                calls[1].function.name.as_str(),
                calls[1].function.arguments.as_str()
            ),
            ("now", "{}")
        );
        assert_ne!(calls[0].id, calls[1].id);

        // Without parallel calls only the first is kept; with no text
        // around it the content is null.
        let (mut b, plan) = builder(hermes(), false);
        let (_, whole) = run(&mut b, &plan, &pieces[1..]);
        assert_eq!(whole.message.content, None);
        assert_eq!(whole.message.tool_calls.unwrap().len(), 1);
        assert_eq!(whole.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn a_reply_without_calls_is_plain_content() {
        let (mut b, plan) = builder(hermes(), true);
        let (_, whole) = run(&mut b, &plan, &["Hello", " there <tool", "box>"]);
        assert_eq!(
            whole.message.content.as_deref(),
            Some("Hello there <toolbox>")
        );
        assert_eq!(whole.message.tool_calls, None);
        assert_eq!(whole.finish_reason.as_deref(), Some("stop"));
    }

    /// The role rides on the first chunk: its own, with `content: ""`,
    /// before text; on the first call's delta, with `content: null`, when
    /// the reply opens with a call (as OpenAI sends them).
    #[test]
    fn the_role_comes_first_with_null_content_before_a_call() {
        let (mut b, plan) = builder(hermes(), true);
        let (chunks, _) = run(
            &mut b,
            &plan,
            &["<tool_call>{\"name\": \"now\", ", "\"arguments\": {}}"],
        );
        let first = &chunks[0].delta;
        assert_eq!(first.role.as_deref(), Some("assistant"));
        assert_eq!(first.content, Some(None));
        assert!(first.tool_calls.is_some());
        assert!(chunks[1..].iter().all(|c| c.delta.role.is_none()));
        let (mut b, plan) = builder(hermes(), true);
        let (chunks, _) = run(&mut b, &plan, &["Hi", "<tool_call>{\"name\": \"now\"}"]);
        assert_eq!(
            chunks[0].delta,
            ChatDelta {
                role: Some("assistant".into()),
                content: Some(Some(String::new())),
                ..ChatDelta::default()
            }
        );
        assert_eq!(chunks[1].delta, content("Hi".into()));
    }

    /// A named call ends as `stop`, as at OpenAI; `required` as `tool_calls`.
    #[test]
    fn a_named_call_ends_as_stop() {
        let (mut b, plan) = builder(ToolMode::Named("f".into()), true);
        let (_, whole) = run(&mut b, &plan, &["{\"a\":", " 1}"]);
        assert_eq!(
            whole.message.tool_calls.unwrap()[0].function.arguments,
            "{\"a\": 1}"
        );
        assert_eq!(whole.finish_reason.as_deref(), Some("stop"));
    }

    /// Thinking streams as `reasoning_content`, and a call made after it
    /// is read from the answer alone.
    #[test]
    fn thinking_then_a_call() {
        let pieces = [
            "<think>I should",
            " call it.</",
            "think>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}",
            "</tool_call>",
        ];
        let (mut b, plan) = builder(hermes(), true);
        let (chunks, whole) = run(&mut b, &plan, &pieces);
        let thought: String = chunks
            .iter()
            .filter_map(|c| c.delta.reasoning_content.as_deref())
            .collect();
        assert_eq!(thought, "I should call it.");
        let msg = &whole.message;
        assert_eq!(msg.reasoning_content.as_deref(), Some("I should call it."));
        assert_eq!(msg.content, None);
        let calls = msg.tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].function.name, "now");
        assert_eq!(whole.finish_reason.as_deref(), Some("tool_calls"));
    }
}
