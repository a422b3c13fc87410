//! `POST /v1/chat/completions`: the handler and the builder that shapes its
//! chunks (the role first, content deltas, an empty delta with the finish).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;

use super::access::{request_id, AccessRecord};
use super::error::ApiError;
use super::generation;
use super::protocol::{
    ChatChoice, ChatCompletionRequest, ChatDelta, ChatLogprobs, ChatTokenLogprob, ChunkChoice,
    ResponseMessage, TopLogprob,
};
use super::respond::{respond, Envelope, OutputBuilder};
use super::validation::validate_chat;
use super::AppState;
use crate::output::{Delta, TokenLogprob};

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<AccessRecord>,
    headers: HeaderMap,
    body: Request,
) -> Result<Response, ApiError> {
    let (g, plan) =
        generation::begin::<ChatCompletionRequest>(&state, body, validate_chat, access).await?;
    let model = g.model().clone();
    let builder = ChatBuilder {
        want_logprobs: plan.logprobs.is_some(),
        started: vec![false; g.num_choices()],
    };
    let env = Envelope::new(format!("chatcmpl-{}", request_id(&headers)), &model.name);
    respond(g, builder, env, state.limits.stream_shape(&plan)).await
}

pub struct ChatBuilder {
    want_logprobs: bool,
    /// Per choice: its role chunk went out.
    started: Vec<bool>,
}

fn chunk(index: usize, delta: ChatDelta) -> ChunkChoice {
    ChunkChoice {
        index,
        delta,
        logprobs: None,
        finish_reason: None,
    }
}

impl OutputBuilder for ChatBuilder {
    type Chunk = ChunkChoice;
    type Choice = ChatChoice;
    const CHUNK_OBJECT: &'static str = "chat.completion.chunk";
    const OBJECT: &'static str = "chat.completion";

    fn chunks(&mut self, i: usize, d: Delta) -> Vec<ChunkChoice> {
        let mut out = Vec::new();
        // The first chunk of each choice carries the role, as OpenAI sends it.
        if !std::mem::replace(&mut self.started[i], true) {
            out.push(chunk(
                i,
                ChatDelta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                },
            ));
        }
        if !d.text.is_empty() || !d.logprobs.is_empty() {
            out.push(ChunkChoice {
                logprobs: self.want_logprobs.then(|| chat_logprobs(&d.logprobs)),
                ..chunk(
                    i,
                    ChatDelta {
                        role: None,
                        content: Some(d.text),
                    },
                )
            });
        }
        if let Some(f) = d.finish {
            out.push(ChunkChoice {
                finish_reason: Some(f.as_str().to_string()),
                ..chunk(i, ChatDelta::default())
            });
        }
        out
    }

    fn empty_choice(&self, index: usize) -> ChatChoice {
        ChatChoice {
            index,
            message: ResponseMessage {
                role: "assistant".into(),
                content: String::new(),
            },
            logprobs: self.want_logprobs.then(ChatLogprobs::default),
            finish_reason: None,
        }
    }

    fn chunk_index(chunk: &ChunkChoice) -> usize {
        chunk.index
    }

    fn merge(choice: &mut ChatChoice, chunk: ChunkChoice) {
        if let Some(text) = chunk.delta.content {
            choice.message.content.push_str(&text);
        }
        if let (Some(all), Some(more)) = (&mut choice.logprobs, chunk.logprobs) {
            all.content.extend(more.content);
        }
        if chunk.finish_reason.is_some() {
            choice.finish_reason = chunk.finish_reason;
        }
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
