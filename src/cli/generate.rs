//! Offline generation: runs a set of prompts through the engine together and
//! collects each one's text. `wick generate` and the tests drive this.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::engine::output::SequenceOutput;
use crate::engine::sequence::FinishReason;
use crate::engine::Engine;
use crate::error::{Result, WickError};
use crate::sampling::params::SamplingParams;
use crate::text::tokenizer::Tokenizer;

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
    output: SequenceOutput,
    completion: Completion,
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
        let output = SequenceOutput::new(params.stop.clone(), false);
        let prompt_tokens = prompt.len();
        let id = engine.add_request(prompt, params)?;
        let completion = Completion {
            index,
            text: String::new(),
            token_ids: Vec::new(),
            finish_reason: "",
            prompt_tokens,
        };
        pending.insert(id, Pending { output, completion });
    }
    let start = Instant::now();
    let mut firsts = 0;
    let mut done: Vec<Option<Completion>> = vec![None; n];
    while engine.has_work() {
        for ev in engine.step() {
            let id = ev.seq;
            let Some(p) = pending.get_mut(&id) else {
                continue;
            };
            let Some(delta) = p.output.on_event(tokenizer, ev)? else {
                continue;
            };
            if let Some(token) = delta.token {
                stats.generated_tokens += 1;
                if p.completion.token_ids.is_empty() {
                    firsts += 1;
                    if firsts == n {
                        stats.prefill_time = start.elapsed();
                    }
                }
                p.completion.token_ids.push(token);
            }
            p.completion.text.push_str(&delta.text);
            if delta.abort_in_engine {
                engine.abort(id);
            }
            let Some(reason) = delta.finish else {
                continue;
            };
            if let FinishReason::Error(msg) | FinishReason::Grammar(msg) = &reason {
                return Err(WickError::Internal(msg.clone()));
            }
            let mut p = pending.remove(&id).expect("pending request");
            p.completion.finish_reason = reason.as_str();
            let index = p.completion.index;
            done[index] = Some(p.completion);
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
