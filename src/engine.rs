//! The engine: owns the model runner, the scheduler and every sequence, and
//! advances them one continuous-batching step at a time. It speaks token ids
//! only; text, stop strings and HTTP live with whoever drives it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use rayon::prelude::*;

use crate::block_manager::BlockManager;
use crate::error::{Result, WickError};
use crate::kv_cache::{KvCache, KvDtype, KvLayout};
use crate::model_runner::ModelRunner;
use crate::models::LogitRows;
use crate::models::Model;
use crate::request_rules;
use crate::sampler::{score_token, SampledToken};
use crate::sampling_params::SamplingParams;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sequence::{FinishReason, SeqId, Sequence};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory for the KV pool, in bytes; the pool never grows past it.
    pub kv_cache_bytes: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// How K/V are stored; `None` takes the model's choice.
    pub kv_dtype: Option<KvDtype>,
    /// Use the candle-tensor KV pool and attention even on the CPU (tests the
    /// path other devices take).
    pub force_tensor_kv: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            kv_cache_bytes: 512 << 20,
            max_num_seqs: 256,
            max_num_batched_tokens: 512,
            kv_dtype: None,
            force_tensor_kv: false,
        }
    }
}

/// What happened to one sequence in a step. A token that comes with
/// `finish == Some(Stop)` is the stop token itself (EOS or a stop id): it is
/// reported for the record but is not part of the visible text.
#[derive(Debug, Clone)]
pub struct StepEvent {
    pub seq: SeqId,
    pub token: Option<SampledToken>,
    pub finish: Option<FinishReason>,
    /// With the first token, when `prompt_logprobs` was asked for: the
    /// scores of prompt tokens `1..` (token 0 has nothing to be scored on).
    pub prompt_logprobs: Vec<SampledToken>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Waiting beyond the free sequence slots ([`Scheduler::num_queued`]).
    pub queued: usize,
    pub blocks_used: usize,
    pub blocks_total: usize,
    pub preemptions: u64,
}

pub struct Engine {
    runner: ModelRunner,
    scheduler: Scheduler,
    eos_ids: Vec<u32>,
    next_id: SeqId,
}

impl Engine {
    pub fn new(model: Box<dyn Model>, eos_ids: Vec<u32>, cfg: &EngineConfig) -> Result<Self> {
        let info = model.info().clone();
        let kv_dtype = cfg.kv_dtype.unwrap_or(info.kv_dtype);
        let layout = KvLayout::from_budget(
            info.num_layers,
            info.num_kv_heads,
            info.head_dim,
            cfg.block_size,
            kv_dtype,
            cfg.kv_cache_bytes,
        );
        if layout.num_blocks == 0 {
            return Err(WickError::Model(format!(
                "a KV budget of {} bytes holds no block of {} tokens ({} bytes); raise --kv-cache-memory",
                cfg.kv_cache_bytes,
                cfg.block_size,
                KvLayout::bytes_per_block(info.num_layers, info.num_kv_heads, info.head_dim, cfg.block_size, kv_dtype)
            )));
        }
        let cache = KvCache::new(layout, model.device(), cfg.force_tensor_kv)?;
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: cfg.max_num_seqs,
                max_num_batched_tokens: cfg.max_num_batched_tokens,
            },
            BlockManager::new(layout.num_blocks, cfg.block_size),
        );
        Ok(Engine {
            runner: ModelRunner::new(model, cache),
            scheduler,
            eos_ids,
            next_id: 0,
        })
    }

    pub fn model(&self) -> &dyn Model {
        self.runner.model()
    }

    /// Queues a request after checking it can run at all.
    pub fn add_request(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<SeqId> {
        let info = self.runner.model().info();
        request_rules::check_prompt(&prompt, info.vocab_size)?;
        params.validate(info.vocab_size)?;
        request_rules::check_context(prompt.len(), params.max_tokens, info.max_context)?;
        let id = self.next_id;
        let seq = Sequence::new(id, prompt, params, info.max_context, &self.eos_ids);
        if !self.scheduler.fits(&seq) {
            let bs = self.scheduler.blocks.block_size();
            return Err(WickError::KvCacheTooSmall(format!(
                "the request needs up to {} tokens of KV cache but the pool holds {} ({} blocks of {bs}); raise --kv-cache-memory or lower max_tokens",
                seq.max_len,
                self.scheduler.blocks.num_blocks() * bs,
                self.scheduler.blocks.num_blocks()
            )));
        }
        self.next_id += 1;
        self.scheduler.waiting.push_back(seq);
        Ok(id)
    }

    /// Drops a request wherever it is and frees its blocks. False if unknown
    /// (already finished).
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.scheduler.remove(id).is_some()
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn stats(&self) -> EngineStats {
        let b = &self.scheduler.blocks;
        EngineStats {
            running: self.scheduler.running.len(),
            waiting: self.scheduler.waiting.len(),
            queued: self.scheduler.num_queued(),
            blocks_used: b.num_used(),
            blocks_total: b.num_blocks(),
            preemptions: self.scheduler.num_preemptions,
        }
    }

    /// One continuous-batching step: schedule, run one forward over the flat
    /// batch, sample, and retire finished sequences.
    pub fn step(&mut self) -> Vec<StepEvent> {
        self.scheduler.schedule();
        let batch = ModelRunner::build_batch(self.scheduler.running.iter());
        if batch.tokens.is_empty() {
            return Vec::new();
        }
        // Inside the rayon pool, the kernels' parallel calls are cheap forks
        // rather than a cross-thread hand-off each.
        let runner = &mut self.runner;
        let result = rayon::scope(|_| catch_unwind(AssertUnwindSafe(|| runner.run(&batch))));
        let logits = match result {
            Ok(Ok(logits)) => logits,
            Ok(Err(e)) => return self.fail_scheduled(e.to_string()),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".to_string());
                return self.fail_scheduled(format!("model step panicked: {msg}"));
            }
        };
        let sampled = rayon::scope(|_| self.sample(logits));
        self.retire(sampled)
    }

    /// Advances the cache cursors, scores prompt tokens where asked, and
    /// samples one token for every sequence whose pending tokens are now all
    /// cached, in parallel: each sequence draws from its own RNG, so the
    /// order does not matter.
    fn sample(&mut self, logits: Vec<Vec<f32>>) -> Vec<(SeqId, SampledToken)> {
        let mut rows = logits.into_iter();
        let mut targets: Vec<(&mut Sequence, Vec<f32>)> = Vec::new();
        for seq in self.scheduler.running.iter_mut().filter(|s| s.chunk > 0) {
            let wanted = seq.logit_rows();
            let mut mine: Vec<Vec<f32>> = match wanted {
                LogitRows::None => Vec::new(),
                LogitRows::Last => rows.by_ref().take(1).collect(),
                LogitRows::All => rows.by_ref().take(seq.chunk).collect(),
            };
            let first = seq.num_cached;
            seq.num_cached += seq.chunk;
            if wanted == LogitRows::All {
                score_prompt(seq, first, &mine);
            }
            if seq.num_cached == seq.len() {
                if let Some(row) = mine.pop() {
                    targets.push((seq, row));
                }
            }
        }
        targets
            .par_iter_mut()
            .map(|(seq, row)| {
                let Sequence {
                    id,
                    sampler,
                    tokens,
                    prompt_len,
                    ..
                } = &mut **seq;
                let (prompt, output) = tokens.split_at(*prompt_len);
                (*id, sampler.sample(row, prompt, output))
            })
            .collect()
    }

    fn retire(&mut self, sampled: Vec<(SeqId, SampledToken)>) -> Vec<StepEvent> {
        let mut events = Vec::with_capacity(sampled.len());
        let mut sampled = sampled.into_iter().peekable();
        let mut i = 0;
        while i < self.scheduler.running.len() {
            let seq = &mut self.scheduler.running[i];
            let Some((_, token)) = sampled.next_if(|(id, _)| *id == seq.id) else {
                i += 1;
                continue;
            };
            seq.tokens.push(token.id);
            let finish = self.finish_reason(&self.scheduler.running[i], token.id);
            let seq = &mut self.scheduler.running[i];
            events.push(StepEvent {
                seq: seq.id,
                token: Some(token),
                finish: finish.clone(),
                prompt_logprobs: std::mem::take(&mut seq.prompt_logprobs),
            });
            if finish.is_some() {
                let mut seq = self.scheduler.running.remove(i);
                self.scheduler.blocks.release(&mut seq.block_table);
            } else {
                i += 1;
            }
        }
        events
    }

    fn finish_reason(&self, seq: &Sequence, token: u32) -> Option<FinishReason> {
        let p = &seq.params;
        let may_stop = seq.output().len() > p.min_tokens;
        let is_eos = !p.ignore_eos && self.eos_ids.contains(&token);
        if may_stop && (is_eos || p.stop_token_ids.contains(&token)) {
            Some(FinishReason::Stop)
        } else if seq.len() >= seq.max_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// A failed forward fails exactly the sequences that were in it.
    fn fail_scheduled(&mut self, msg: String) -> Vec<StepEvent> {
        tracing::error!("engine step failed: {msg}");
        let ids: Vec<SeqId> = self
            .scheduler
            .running
            .iter()
            .filter(|s| s.chunk > 0)
            .map(|s| s.id)
            .collect();
        ids.into_iter()
            .map(|id| {
                self.scheduler.remove(id);
                StepEvent {
                    seq: id,
                    token: None,
                    finish: Some(FinishReason::Error(msg.clone())),
                    prompt_logprobs: Vec::new(),
                }
            })
            .collect()
    }
}

/// Scores the prompt tokens that `rows` (logits at positions `first..`)
/// predict and `seq` is still owed, in parallel over the rows.
fn score_prompt(seq: &mut Sequence, first: usize, rows: &[Vec<f32>]) {
    let Some(n) = seq.params.prompt_logprobs else {
        return;
    };
    // The row at position p predicts token p + 1, so these rows score
    // tokens `first + 1..`; chunks are contiguous, so the owed token is never
    // before them.
    let from = seq.next_scored_prompt_token();
    let to = seq.prompt_len.min(first + rows.len() + 1);
    if from <= first || from >= to {
        return;
    }
    let prompt = &seq.tokens[..seq.prompt_len];
    let scored: Vec<SampledToken> = (from..to)
        .into_par_iter()
        .map(|t| score_token(&rows[t - 1 - first], prompt[t], n))
        .collect();
    seq.prompt_logprobs.extend(scored);
}
