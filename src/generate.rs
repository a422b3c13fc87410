//! Offline generation: runs a set of prompts through the engine together and
//! collects each one's text. `wick generate` and the tests drive this.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::error::{Result, WickError};
use crate::sampling_params::SamplingParams;
use crate::sequence::FinishReason;
use crate::text_stream::TextStream;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Completion {
    pub index: usize,
    pub text: String,
    /// Generated ids, including a final stop token.
    pub token_ids: Vec<u32>,
    pub finish_reason: &'static str,
    #[serde(skip)]
    pub prompt_tokens: usize,
}

#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Until every prompt had its first token.
    pub prefill_time: Duration,
    /// From then until the last request finished.
    pub decode_time: Duration,
}

impl GenerateStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Tokens generated after the prefill phase, per second.
    pub fn decode_tok_s(&self, num_requests: usize) -> f64 {
        self.generated_tokens.saturating_sub(num_requests) as f64
            / self.decode_time.as_secs_f64().max(1e-9)
    }
}

struct Pending {
    index: usize,
    stream: TextStream,
    completion: Completion,
    first_token: bool,
}

/// Runs every request to completion. Requests that fail validation return
/// the error before anything runs.
pub fn generate(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    requests: Vec<(Vec<u32>, SamplingParams)>,
) -> Result<(Vec<Completion>, GenerateStats)> {
    let mut pending = HashMap::new();
    let mut stats = GenerateStats::default();
    let n = requests.len();
    for (index, (prompt, params)) in requests.into_iter().enumerate() {
        stats.prompt_tokens += prompt.len();
        let stream = TextStream::new(params.stop.clone());
        let prompt_tokens = prompt.len();
        let id = engine.add_request(prompt, params)?;
        let completion = Completion {
            index,
            text: String::new(),
            token_ids: Vec::new(),
            finish_reason: "",
            prompt_tokens,
        };
        pending.insert(
            id,
            Pending {
                index,
                stream,
                completion,
                first_token: false,
            },
        );
    }
    let start = Instant::now();
    let mut firsts = 0;
    let mut done: Vec<Option<Completion>> = vec![None; n];
    while engine.has_work() {
        for ev in engine.step() {
            let Some(p) = pending.get_mut(&ev.seq) else {
                continue;
            };
            let mut finish = ev.finish.clone();
            if let Some(tok) = &ev.token {
                stats.generated_tokens += 1;
                p.completion.token_ids.push(tok.id);
                if !p.first_token {
                    p.first_token = true;
                    firsts += 1;
                    if firsts == n {
                        stats.prefill_time = start.elapsed();
                    }
                }
                if finish != Some(FinishReason::Stop) {
                    let delta = p.stream.push(tokenizer, tok.id)?;
                    p.completion.text.push_str(&delta.text);
                    if delta.stopped && finish.is_none() {
                        engine.abort(ev.seq);
                        finish = Some(FinishReason::Stop);
                    }
                }
            }
            if let Some(reason) = finish {
                let mut p = pending.remove(&ev.seq).expect("pending request");
                let tail = p.stream.finish(tokenizer)?;
                p.completion.text.push_str(&tail);
                if let FinishReason::Error(msg) = &reason {
                    return Err(WickError::Internal(msg.clone()));
                }
                p.completion.finish_reason = reason.as_str();
                done[p.index] = Some(p.completion);
            }
        }
    }
    stats.decode_time = start.elapsed().saturating_sub(stats.prefill_time);
    Ok((
        done.into_iter()
            .map(|c| c.expect("every request finishes"))
            .collect(),
        stats,
    ))
}
