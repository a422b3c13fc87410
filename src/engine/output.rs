//! One sequence's output as whoever consumes engine events sees it: step
//! events in, visible text (detokenized, stop strings held back), logprobs
//! and the finish out. The CLI and the server both read the engine through
//! this, so the two cannot disagree on what a sequence produced.
//!
//! A sequence is over at its first finish: a stop string matched here, or
//! the engine reported one. Events still in flight after that (the engine
//! had already scheduled the next step) are ignored, so a choice finishes
//! once and counts no token past its end.

use crate::engine::sequence::FinishReason;
use crate::engine::sequence::StepEvent;
use crate::engine::speculation::DraftTally;
use crate::sampling::sampler::SampledToken;
use crate::text::stop::StopStrings;
use crate::text::stream::TextStream;
use crate::text::tokenizer::Tokenizer;

/// One token's logprob with its top alternatives, as text.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// What one event made visible.
#[derive(Debug, Default, PartialEq)]
pub struct Delta {
    pub text: String,
    /// The token sampled with this event, the final stop token included.
    pub token: Option<u32>,
    pub logprobs: Vec<TokenLogprob>,
    /// Prompt tokens `1..` with their logprobs, on the first delta of a
    /// sequence that asked to score its prompt.
    pub prompt_logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    /// The sequence ended here (a stop string) while the engine still runs
    /// it: the caller must abort it there.
    pub abort_in_engine: bool,
}

impl Delta {
    /// Nothing a client would see.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
            && self.finish.is_none()
            && self.logprobs.is_empty()
            && self.prompt_logprobs.is_empty()
    }
}

pub struct SequenceOutput {
    stream: TextStream,
    want_logprobs: bool,
    /// Tokens generated up to the finish, the stop token included.
    pub completion_tokens: usize,
    /// Tokens drafted for it and accepted, up to the finish.
    pub drafts: DraftTally,
    finished: bool,
}

/// A generated token's text as it reads after what came before it.
fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode_continuation(&[id]).unwrap_or_default()
}

pub fn token_logprob(tok: &Tokenizer, t: &SampledToken) -> TokenLogprob {
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

impl SequenceOutput {
    pub fn new(stops: StopStrings, want_logprobs: bool) -> Self {
        SequenceOutput {
            stream: TextStream::new(stops),
            want_logprobs,
            completion_tokens: 0,
            drafts: DraftTally::default(),
            finished: false,
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The delta of one engine event; `None` once the sequence has finished.
    pub fn on_event(&mut self, tok: &Tokenizer, ev: StepEvent) -> anyhow::Result<Option<Delta>> {
        if self.finished {
            return Ok(None);
        }
        let mut delta = Delta::default();
        if let Some(d) = ev.draft {
            self.drafts.add(d);
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
            delta.token = Some(t.id);
            // A token that ends the sequence by Stop is EOS or a stop id:
            // counted, not shown.
            if ev.finish != Some(FinishReason::Stop) {
                let d = self.stream.push(tok, t.id)?;
                delta.text = d.text;
                if self.want_logprobs {
                    delta.logprobs.push(token_logprob(tok, t));
                }
                if d.stopped {
                    delta.abort_in_engine = ev.finish.is_none();
                    delta.finish = Some(FinishReason::Stop);
                }
            }
        }
        if delta.finish.is_none() {
            delta.finish = ev.finish;
        }
        if delta.finish.is_some() {
            delta.text.push_str(&self.stream.finish(tok)?);
            self.finished = true;
        }
        Ok(Some(delta))
    }

    /// Ends the sequence for a reason of the caller's (a deadline, say):
    /// what the stop-string hold-back kept is released. `None` if it had
    /// already finished.
    pub fn end(&mut self, tok: &Tokenizer, reason: FinishReason) -> anyhow::Result<Option<Delta>> {
        if self.finished {
            return Ok(None);
        }
        self.finished = true;
        Ok(Some(Delta {
            text: self.stream.finish(tok)?,
            finish: Some(reason),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: u32, finish: Option<FinishReason>) -> StepEvent {
        StepEvent {
            seq: 0,
            token: Some(SampledToken {
                id,
                logprob: None,
                top_logprobs: Vec::new(),
            }),
            finish,
            prompt_logprobs: Vec::new(),
            cached_prompt_tokens: None,
            embedding: None,
            draft: None,
        }
    }

    fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text).unwrap()
    }

    /// Feeds `tokens` as step events; returns the deltas that came out.
    fn run(out: &mut SequenceOutput, tok: &Tokenizer, tokens: &[u32]) -> Vec<Delta> {
        tokens
            .iter()
            .filter_map(|&id| out.on_event(tok, event(id, None)).unwrap())
            .collect()
    }

    #[test]
    fn a_stop_string_finishes_once_and_later_events_are_ignored() {
        let tok = crate::text::tokenizer::test_tokenizer();
        let tokens = ids(&tok, "Hello there. More text. And more.");
        let mut out = SequenceOutput::new(vec![".".into()].into(), false);
        let deltas = run(&mut out, &tok, &tokens);
        let finishes: Vec<&Delta> = deltas.iter().filter(|d| d.finish.is_some()).collect();
        assert_eq!(finishes.len(), 1, "{deltas:?}");
        assert!(finishes[0].abort_in_engine);
        assert_eq!(finishes[0].finish, Some(FinishReason::Stop));
        let text: String = deltas.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(text, "Hello there");
        // Counted up to the token that completed the stop string, no further.
        let dot = tokens
            .iter()
            .position(|&t| tok.decode(&[t]).unwrap().contains('.'))
            .unwrap();
        assert_eq!(out.completion_tokens, dot + 1);
        assert!(out.is_finished());
        // A finish the engine sends afterwards is ignored too.
        assert!(out
            .on_event(&tok, event(tokens[0], Some(FinishReason::Length)))
            .unwrap()
            .is_none());
    }

    #[test]
    fn eos_is_counted_not_shown() {
        let tok = crate::text::tokenizer::test_tokenizer();
        let mut out = SequenceOutput::new(StopStrings::default(), false);
        let mut deltas = run(&mut out, &tok, &ids(&tok, "Hi"));
        let eos = tok.eos_ids()[0];
        deltas.push(
            out.on_event(&tok, event(eos, Some(FinishReason::Stop)))
                .unwrap()
                .unwrap(),
        );
        let text: String = deltas.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(text, "Hi");
        let last = deltas.last().unwrap();
        assert_eq!(last.token, Some(eos));
        assert!(!last.abort_in_engine, "the engine already retired it");
        assert_eq!(out.completion_tokens, ids(&tok, "Hi").len() + 1);
    }

    #[test]
    fn end_releases_held_back_text() {
        let tok = crate::text::tokenizer::test_tokenizer();
        // "Hel" could begin the stop string "Hello!", so it is held back.
        let mut out = SequenceOutput::new(vec!["Hello!".into()].into(), false);
        let shown: String = run(&mut out, &tok, &ids(&tok, "Hello"))
            .iter()
            .map(|d| d.text.clone())
            .collect();
        assert_eq!(shown, "");
        let last = out.end(&tok, FinishReason::Length).unwrap().unwrap();
        assert_eq!(last.text, "Hello");
        assert_eq!(last.finish, Some(FinishReason::Length));
        assert!(out.end(&tok, FinishReason::Length).unwrap().is_none());
    }
}
