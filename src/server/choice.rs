//! One choice's output on the handler side: step events in, visible text
//! (detokenized, stop strings held back) and logprobs out.

use crate::engine::StepEvent;
use crate::sampler::SampledToken;
use crate::sequence::FinishReason;
use crate::text_stream::TextStream;
use crate::tokenizer::Tokenizer;

use super::error::ApiError;

/// One generated token's logprob entry, with its top alternatives.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// What one step event made visible.
#[derive(Debug, Default)]
pub struct Delta {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// Prompt tokens `1..` with their logprobs, on the first delta of a
    /// choice whose request echoes the prompt with logprobs.
    pub prompt_logprobs: Vec<TokenLogprob>,
    pub finish: Option<&'static str>,
    /// A stop string matched: the handler must abort the sequence.
    pub stopped_by_string: bool,
}

pub struct ChoiceOutput {
    stream: TextStream,
    want_logprobs: bool,
    pub completion_tokens: usize,
    pub finished: bool,
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

fn token_logprob(tok: &Tokenizer, t: &SampledToken) -> TokenLogprob {
    TokenLogprob {
        token: token_text(tok, t.id),
        // Present whenever logprobs were requested, the only time this runs.
        logprob: t.logprob.unwrap_or(f32::NAN),
        top: t
            .top_logprobs
            .iter()
            .map(|&(id, lp)| (token_text(tok, id), lp))
            .collect(),
    }
}

impl ChoiceOutput {
    pub fn new(stops: Vec<String>, want_logprobs: bool) -> Self {
        ChoiceOutput {
            stream: TextStream::new(stops),
            want_logprobs,
            completion_tokens: 0,
            finished: false,
        }
    }

    pub fn on_event(&mut self, tok: &Tokenizer, ev: StepEvent) -> Result<Delta, ApiError> {
        let mut delta = Delta::default();
        if let Some(FinishReason::Error(msg)) = &ev.finish {
            self.finished = true;
            return Err(ApiError::internal(msg));
        }
        if self.want_logprobs {
            delta.prompt_logprobs = ev
                .prompt_logprobs
                .iter()
                .map(|t| token_logprob(tok, t))
                .collect();
        }
        if let Some(t) = &ev.token {
            self.completion_tokens += 1;
            // A token that ends the sequence by Stop is EOS or a stop id: counted, not shown.
            if ev.finish != Some(FinishReason::Stop) {
                let d = self
                    .stream
                    .push(tok, t.id)
                    .map_err(|e| ApiError::internal(format!("{e:#}")))?;
                delta.text = d.text;
                if self.want_logprobs {
                    delta.logprobs.push(token_logprob(tok, t));
                }
                if d.stopped {
                    delta.stopped_by_string = true;
                    delta.finish = Some("stop");
                }
            }
        }
        if let Some(reason) = &ev.finish {
            delta.finish.get_or_insert(reason.as_str());
        }
        if delta.finish.is_some() {
            self.finished = true;
            if !delta.stopped_by_string {
                let tail = self
                    .stream
                    .finish(tok)
                    .map_err(|e| ApiError::internal(format!("{e:#}")))?;
                delta.text.push_str(&tail);
            }
        }
        Ok(delta)
    }
}
