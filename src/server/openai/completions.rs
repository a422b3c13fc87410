//! `POST /v1/completions`: the handler and the builder that shapes its
//! chunks (the echoed prompt, legacy logprobs with text offsets).

use indexmap::IndexMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;

use crate::engine::output::TokenLogprob;
use crate::server::error::ApiError;
use crate::server::generation;
use crate::server::http::access::{request_id, AccessRecord};
use crate::server::openai::chunks::{Chunks, Envelope, OutputBuilder};
use crate::server::protocol::{CompletionChoice, CompletionLogprobs, CompletionRequest};
use crate::server::reply::{ReplyEvent, ReplyStep};
use crate::server::respond::respond;
use crate::server::validation::{validate_completion, GenerationPlan};
use crate::server::AppState;
use crate::text::tokenizer::Tokenizer;

pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<AccessRecord>,
    headers: HeaderMap,
    body: Request,
) -> Result<Response, ApiError> {
    let (g, plan) =
        generation::begin::<CompletionRequest>(&state, body, validate_completion, access).await?;
    let model = g.model().clone();
    let builder = CompletionBuilder::new(&plan, &model.tokenizer, g.num_choices());
    let env = Envelope::new(format!("cmpl-{}", request_id(&headers)), &model.name);
    let chunks = Chunks::new(builder, env, &plan);
    respond(g, &plan, chunks, state.limits.sse_keep_alive).await
}

pub struct CompletionBuilder {
    want_logprobs: bool,
    /// Per choice: the echoed prompt, sent with its first chunk.
    echo: Vec<String>,
    /// Per choice, the echoed prompt's first token until its logprobs go out.
    echo_first: Vec<Option<String>>,
    /// Per choice: characters of text sent so far (logprobs' `text_offset`).
    offsets: Vec<usize>,
}

impl CompletionBuilder {
    pub fn new(plan: &GenerationPlan, tok: &Tokenizer, num_choices: usize) -> Self {
        let prompt_of = |i: usize| i / plan.n;
        let echo: Vec<String> = (0..num_choices)
            .map(|i| match plan.echo {
                true => plan.prompt_texts[prompt_of(i)].clone(),
                false => String::new(),
            })
            .collect();
        let echo_first = (0..num_choices)
            .map(|i| {
                let first = *plan.prompts[prompt_of(i)].tokens.first()?;
                (plan.echo && plan.logprobs.is_some())
                    .then(|| tok.decode(&[first]).unwrap_or_default())
            })
            .collect();
        CompletionBuilder {
            want_logprobs: plan.logprobs.is_some(),
            offsets: echo.iter().map(|e| e.chars().count()).collect(),
            echo,
            echo_first,
        }
    }
}

impl OutputBuilder for CompletionBuilder {
    type Chunk = CompletionChoice;
    type Choice = CompletionChoice;
    const CHUNK_OBJECT: &'static str = "text_completion";
    const OBJECT: &'static str = "text_completion";

    /// One chunk per step: completions have no thinking or calls to
    /// read, so the step is the raw text.
    fn chunks(&mut self, i: usize, step: ReplyStep) -> Vec<CompletionChoice> {
        let echo = std::mem::take(&mut self.echo[i]);
        let mut generated = String::new();
        let mut finish_reason = None;
        for ev in step.events {
            match ev {
                ReplyEvent::Text(t) => generated.push_str(&t),
                ReplyEvent::Finish(f) => finish_reason = Some(f.reason.as_str().to_string()),
                _ => {}
            }
        }
        let logprobs = self.want_logprobs.then(|| {
            let mut lp = match self.echo_first[i].take() {
                Some(first) => echo_logprobs(first, &step.prompt_logprobs),
                None => CompletionLogprobs::default(),
            };
            lp.append(completion_logprobs(&step.logprobs, self.offsets[i]));
            lp
        });
        self.offsets[i] += generated.chars().count();
        vec![CompletionChoice {
            index: i,
            text: echo + &generated,
            logprobs,
            finish_reason,
        }]
    }

    fn empty_choice(&self, index: usize) -> CompletionChoice {
        CompletionChoice {
            index,
            text: String::new(),
            logprobs: self.want_logprobs.then(CompletionLogprobs::default),
            finish_reason: None,
        }
    }

    fn chunk_index(chunk: &CompletionChoice) -> usize {
        chunk.index
    }

    fn merge(choice: &mut CompletionChoice, chunk: CompletionChoice) {
        choice.text.push_str(&chunk.text);
        if let (Some(all), Some(more)) = (&mut choice.logprobs, chunk.logprobs) {
            all.append(more);
        }
        if chunk.finish_reason.is_some() {
            choice.finish_reason = chunk.finish_reason;
        }
    }
}

/// The echoed prompt's logprobs: its first token (nothing to score it on,
/// so null, as OpenAI and vLLM report it) and the scored rest, offsets from 0.
fn echo_logprobs(first_token: String, scored: &[TokenLogprob]) -> CompletionLogprobs {
    let offset = first_token.chars().count();
    let mut out = CompletionLogprobs {
        tokens: vec![first_token],
        token_logprobs: vec![None],
        top_logprobs: vec![None],
        text_offset: vec![0],
    };
    out.append(completion_logprobs(scored, offset));
    out
}

/// Completions' logprobs for one delta; `offset` is the text length before it.
fn completion_logprobs(lps: &[TokenLogprob], mut offset: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for lp in lps {
        out.tokens.push(lp.token.clone());
        out.token_logprobs.push(Some(lp.logprob));
        out.top_logprobs.push(Some(top_map(&lp.top)));
        out.text_offset.push(offset);
        offset += lp.token.chars().count();
    }
    out
}

/// The alternatives as OpenAI's map, most likely first. Two tokens can decode
/// to the same text; the likelier keeps the entry.
fn top_map(top: &[(String, f32)]) -> IndexMap<String, f32> {
    let mut sorted: Vec<&(String, f32)> = top.iter().collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut map = IndexMap::with_capacity(sorted.len());
    for (token, logprob) in sorted {
        map.entry(token.clone()).or_insert(*logprob);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logprobs_list_the_likeliest_first_once_per_text() {
        let top = [
            (" La".to_string(), -3.4),
            (" Paris".to_string(), -0.5),
            ("".to_string(), -2.9),
            (" the".to_string(), -2.3),
            ("".to_string(), -2.5),
        ];
        let json = serde_json::to_string(&top_map(&top)).unwrap();
        assert_eq!(json, r#"{" Paris":-0.5," the":-2.3,"":-2.5," La":-3.4}"#);
    }
}
