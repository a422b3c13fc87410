//! One choice's reply, read once for every API: its thinking told from its
//! answer (the reasoning parser), then the answer's tool calls (the
//! tool-call parser of the request's tool plan); or, for a harmony reply
//! (gpt-oss), all three by the harmony parser. [`ReplyParser`] turns each
//! engine delta into [`ReplyEvent`]s, which chat, completions, Messages
//! and Responses only render; what they would all do alike (dropping calls
//! past the first without `parallel_tool_calls`, counting calls and
//! thinking tokens, naming the stop sequence that matched) is done here.
//! Stop strings themselves are cut in `engine::output`, before this.

use std::sync::Arc;

use crate::engine::output::{Delta, TokenLogprob};
use crate::engine::sequence::FinishReason;
use crate::server::tools::ToolMode;
use crate::server::validation::GenerationPlan;
use crate::server::ModelState;
use crate::text::harmony::{Event, HarmonyParser};
use crate::text::reasoning::{self, Piece, ReasoningParser};
use crate::text::stop::StopStrings;
use crate::text::tool_parser::{ToolCallParser, ToolEvent};

/// What one delta of a reply says, in the order it says it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyEvent {
    /// Answer text (possibly empty: a renderer decides what that shows).
    Text(String),
    Reasoning(String),
    /// Call `index` of the reply begins.
    ToolCallStart {
        index: usize,
        name: String,
    },
    /// The next piece of call `index`'s arguments (JSON text).
    ToolCallArgs {
        index: usize,
        text: String,
    },
    /// The reply is over: always the last event of its last delta.
    Finish(Finish),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    /// Calls the reply made (those dropped without parallel calls aside).
    pub calls: usize,
    /// The stop sequence that ended the reply, if one did.
    pub stop_sequence: Option<String>,
    /// Tokens spent thinking: each token whose text was thinking, or that
    /// showed no answer while the model was still thinking.
    pub reasoning_tokens: usize,
}

/// One delta as its renderers need it: the events, and the logprobs the
/// engine reported with it.
#[derive(Debug, Default, PartialEq)]
pub struct ReplyStep {
    pub events: Vec<ReplyEvent>,
    pub logprobs: Vec<TokenLogprob>,
    pub prompt_logprobs: Vec<TokenLogprob>,
}

/// A token's text as it reads mid-reply (to tell which stop sequence a
/// final token completed).
pub type TokenText = Arc<dyn Fn(u32) -> String + Send + Sync>;

/// `model`'s tokens as text mid-reply.
pub fn token_text(model: Arc<ModelState>) -> TokenText {
    Arc::new(move |t| {
        model
            .tokenizer
            .decode_continuation(&[t])
            .unwrap_or_default()
    })
}

/// What one delta's text said, and how it bears on counting thinking tokens.
struct Read {
    said: Vec<Event>,
    /// It showed thinking.
    thought: bool,
    /// It showed answer text or calls.
    answered: bool,
    /// Whether the model is thinking after it, where it says.
    in_reasoning: Option<bool>,
}

pub struct ReplyParser {
    /// A harmony reply (gpt-oss) is read by this alone; other replies by
    /// the reasoning parser, then the tool parser.
    harmony: Option<HarmonyParser>,
    thinking: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
    parallel: bool,
    /// Calls started and kept.
    calls: usize,
    stops: StopStrings,
    token_text: TokenText,
    /// The model is inside its thinking (for [`Finish::reasoning_tokens`]).
    in_reasoning: bool,
    reasoning_tokens: usize,
}

impl ReplyParser {
    /// A parser of one choice of the request `plan` runs.
    pub fn new(plan: &GenerationPlan, token_text: TokenText) -> Self {
        ReplyParser {
            harmony: plan
                .harmony
                .then(|| HarmonyParser::new(plan.tools.mode == ToolMode::Harmony)),
            thinking: plan.reasoning.map(ReasoningParser::new),
            tools: plan.tools.parser(),
            parallel: plan.tools.parallel,
            calls: 0,
            stops: plan.params.stop.clone(),
            token_text,
            in_reasoning: plan.reasoning == Some(true),
            reasoning_tokens: 0,
        }
    }

    pub fn push(&mut self, d: Delta) -> ReplyStep {
        let last = d.finish.is_some();
        // Read before the text is handed on, so no delta's text is copied.
        let stop_sequence = if last { self.matched_stop(&d) } else { None };
        let read = self.read(d.text, last);
        if d.token.is_some() && (read.thought || (self.in_reasoning && !read.answered)) {
            self.reasoning_tokens += 1;
        }
        if let Some(now) = read.in_reasoning {
            self.in_reasoning = now;
        }
        let mut events = Vec::new();
        for said in read.said {
            match said {
                Event::Reasoning(text) => events.push(ReplyEvent::Reasoning(text)),
                Event::Answer(found) => self.calls_of(found, &mut events),
            }
        }
        if let Some(reason) = d.finish {
            events.push(ReplyEvent::Finish(Finish {
                stop_sequence,
                reason,
                calls: self.calls,
                reasoning_tokens: self.reasoning_tokens,
            }));
        }
        ReplyStep {
            events,
            logprobs: d.logprobs,
            prompt_logprobs: d.prompt_logprobs,
        }
    }

    /// One delta's text as thinking and answer (text and calls), in order:
    /// by the harmony parser, or split by the reasoning parser with the
    /// answer read by the tool parser. `last` settles what they held back.
    fn read(&mut self, text: String, last: bool) -> Read {
        if let Some(harmony) = &mut self.harmony {
            let mut said = harmony.push(&text);
            if last {
                said.extend(harmony.finish());
            }
            let answered = |e: &Event| match e {
                Event::Reasoning(_) => false,
                Event::Answer(ToolEvent::Content(t)) => !t.is_empty(),
                Event::Answer(_) => true,
            };
            return Read {
                thought: said.iter().any(|e| matches!(e, Event::Reasoning(_))),
                answered: said.iter().any(answered),
                in_reasoning: said
                    .iter()
                    .rev()
                    .find(|e| matches!(e, Event::Reasoning(_)) || answered(e))
                    .map(|e| matches!(e, Event::Reasoning(_))),
                said,
            };
        }
        let pieces = reasoning::split(self.thinking.as_mut(), text, last);
        let mut read = Read {
            thought: false,
            answered: false,
            in_reasoning: None,
            said: Vec::new(),
        };
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => {
                    read.thought = true;
                    read.in_reasoning = Some(true);
                    read.said.push(Event::Reasoning(text));
                }
                Piece::Content(text) => {
                    if !text.is_empty() {
                        read.answered = true;
                        read.in_reasoning = Some(false);
                    }
                    match &mut self.tools {
                        None => read.said.push(Event::Answer(ToolEvent::Content(text))),
                        Some(parser) => read
                            .said
                            .extend(parser.push(&text).into_iter().map(Event::Answer)),
                    }
                }
            }
        }
        if last {
            if let Some(parser) = &mut self.tools {
                read.said
                    .extend(parser.finish().into_iter().map(Event::Answer));
            }
        }
        read
    }

    /// An answer event as a reply event; without parallel calls, calls
    /// after the first are dropped.
    fn calls_of(&mut self, ev: ToolEvent, out: &mut Vec<ReplyEvent>) {
        out.push(match ev {
            ToolEvent::Content(text) => ReplyEvent::Text(text),
            ToolEvent::Start { index, .. } | ToolEvent::Arguments { index, .. }
                if index > 0 && !self.parallel =>
            {
                return
            }
            ToolEvent::Start { index, name } => {
                self.calls = index + 1;
                ReplyEvent::ToolCallStart { index, name }
            }
            ToolEvent::Arguments { index, text } => ReplyEvent::ToolCallArgs { index, text },
        });
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
        let piece = d.token.map(&*self.token_text).unwrap_or_default();
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

#[cfg(test)]
pub mod testing {
    //! Plans and deltas the renderers' tests share.

    use super::*;
    use crate::sampling::params::SamplingParams;
    use crate::server::tools::{ToolMode, ToolPlan};
    use crate::text::tool_parser::ToolFormat;

    /// A request's plan: thinking as `reasoning`, calls read as `mode`.
    pub fn plan(reasoning: Option<bool>, mode: ToolMode, parallel: bool) -> GenerationPlan {
        GenerationPlan {
            prompts: vec![vec![1].into()],
            params: SamplingParams::default(),
            n: 1,
            stream: false,
            include_usage: false,
            continuous_usage: false,
            echo: false,
            logprobs: None,
            prompt_texts: Vec::new(),
            tools: ToolPlan {
                mode,
                parallel,
                ..ToolPlan::none()
            },
            reasoning,
            harmony: false,
        }
    }

    pub fn hermes() -> ToolMode {
        ToolMode::Auto(ToolFormat::Hermes)
    }

    /// A parser whose tokens all read as `piece`.
    pub fn parser(plan: &GenerationPlan, piece: &str) -> ReplyParser {
        let piece = piece.to_string();
        ReplyParser::new(plan, Arc::new(move |_| piece.clone()))
    }

    /// `pieces` as deltas of one token each, the last ending with `finish`.
    pub fn deltas(pieces: &[&str], finish: FinishReason) -> Vec<Delta> {
        pieces
            .iter()
            .enumerate()
            .map(|(k, text)| Delta {
                text: text.to_string(),
                token: Some(k as u32),
                finish: (k + 1 == pieces.len()).then(|| finish.clone()),
                ..Default::default()
            })
            .collect()
    }

    /// Every step `pieces` make through a fresh parser of `plan`.
    pub fn steps(plan: &GenerationPlan, pieces: &[&str], finish: FinishReason) -> Vec<ReplyStep> {
        let mut p = parser(plan, "");
        deltas(pieces, finish)
            .into_iter()
            .map(|d| p.push(d))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::server::tools::ToolMode;

    fn events(plan: &GenerationPlan, pieces: &[&str]) -> Vec<ReplyEvent> {
        steps(plan, pieces, FinishReason::Stop)
            .into_iter()
            .flat_map(|s| s.events)
            .collect()
    }

    #[test]
    fn thinking_then_answer_then_calls() {
        let plan = plan(Some(false), hermes(), true);
        let pieces = [
            "<think>Hm",
            ".</think>Ok",
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>",
        ];
        let all = events(&plan, &pieces);
        let text: String = all
            .iter()
            .filter_map(|e| match e {
                ReplyEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Ok");
        assert!(all.contains(&ReplyEvent::Reasoning("Hm".into())));
        assert!(all.contains(&ReplyEvent::ToolCallStart {
            index: 0,
            name: "a".into()
        }));
        assert_eq!(
            all.last(),
            Some(&ReplyEvent::Finish(Finish {
                reason: FinishReason::Stop,
                calls: 1,
                stop_sequence: None,
                reasoning_tokens: 2
            }))
        );
    }

    /// A harmony reply: its thinking, its answer, and a call; the tokens
    /// of its thinking (headers between it and the answer included) are
    /// counted as thinking.
    #[test]
    fn harmony_replies_are_read_whole() {
        let harmony = |mode| GenerationPlan {
            harmony: true,
            ..plan(None, mode, true)
        };
        let pieces = [
            "<|channel|>analysis<|message|>Hm",
            ".<|end|>",
            "<|start|>assistant<|channel|>final<|message|>",
            "Ok",
        ];
        let all = events(&harmony(ToolMode::Off), &pieces);
        assert_eq!(
            all,
            [
                ReplyEvent::Reasoning("Hm".into()),
                ReplyEvent::Reasoning(".".into()),
                ReplyEvent::Text("Ok".into()),
                ReplyEvent::Finish(Finish {
                    reason: FinishReason::Stop,
                    calls: 0,
                    stop_sequence: None,
                    reasoning_tokens: 3
                })
            ]
        );
        let call = ["<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}"];
        let all = events(&harmony(ToolMode::Harmony), &call);
        assert_eq!(
            all[..2],
            [
                ReplyEvent::ToolCallStart {
                    index: 0,
                    name: "a".into()
                },
                ReplyEvent::ToolCallArgs {
                    index: 0,
                    text: "{}".into()
                }
            ]
        );
        // Without tools (or with `tool_choice: "none"`) a call is dropped.
        let all = events(&harmony(ToolMode::Off), &call);
        assert!(
            matches!(all[..], [ReplyEvent::Finish(Finish { calls: 0, .. })]),
            "{all:?}"
        );
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_kept() {
        let pieces = ["<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>"];
        let all = events(&plan(None, hermes(), false), &pieces);
        assert!(all.iter().all(|e| !matches!(
            e,
            ReplyEvent::ToolCallStart { index: 1, .. } | ReplyEvent::ToolCallArgs { index: 1, .. }
        )));
        assert!(matches!(
            all.last(),
            Some(ReplyEvent::Finish(Finish { calls: 1, .. }))
        ));
        let all = events(&plan(None, hermes(), true), &pieces);
        assert!(matches!(
            all.last(),
            Some(ReplyEvent::Finish(Finish { calls: 2, .. }))
        ));
    }

    #[test]
    fn text_alone_passes_through() {
        let all = events(&plan(None, ToolMode::Off, true), &["Hi", ""]);
        assert_eq!(
            all[..2],
            [ReplyEvent::Text("Hi".into()), ReplyEvent::Text("".into())]
        );
    }
}
