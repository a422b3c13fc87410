//! One request's state inside the engine: its tokens, how many of them are in
//! the KV cache, the blocks holding them, and its own sampler.

use std::time::Instant;

use crate::engine::block_manager::BlockHash;
use crate::engine::mask_budget::MaskRow;
use crate::engine::pooling::Pool;
use crate::engine::prompt::{BlockKeys, MediaSpan, Prompt};
use crate::engine::speculation::{Acceptance, DraftTally};
use crate::kv::BlockId;
use crate::models::LogitRows;
use crate::sampling::device::DeviceRow;
use crate::sampling::params::SamplingParams;
use crate::sampling::sampler::{SampledToken, Sampler};

pub type SeqId = u64;

#[derive(Debug, Clone, PartialEq)]
pub enum FinishReason {
    /// End-of-sequence or a stop token.
    Stop,
    /// max_tokens or the model's context was reached.
    Length,
    /// The caller aborted it.
    Abort,
    /// A failure while running it; the message says what.
    Error(String),
    /// Its grammar could not go on (a client error); the message says why.
    Grammar(String),
}

impl FinishReason {
    /// OpenAI's `finish_reason` vocabulary.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) | FinishReason::Grammar(_) => "error",
        }
    }
}

pub struct Sequence {
    pub id: SeqId,
    /// The request it belongs to (the id of its first sequence): a
    /// request's `n` choices and prompts share the KV pool as one.
    pub group: SeqId,
    /// When it last joined the waiting queue.
    pub queued_at: Instant,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub params: SamplingParams,
    pub sampler: Sampler,
    pub block_table: Vec<BlockId>,
    /// Its blocks in the sliding-window layers' pool, if the model has one
    /// ([`crate::engine::window_blocks`]).
    pub window_table: Vec<BlockId>,
    /// Its recurrent-state slot, for a model with layers that keep one
    /// ([`crate::engine::state_slots`]): held from admission to its
    /// finish or preemption.
    pub state_slot: Option<u32>,
    /// Leading tokens whose K/V are in the cache.
    pub num_cached: usize,
    /// Tokens the scheduler is giving this sequence in the step it is
    /// scheduling, drafts included (0 = none): its working state, which
    /// the step's [`RowPlan`](crate::engine::step_plan::RowPlan) records.
    pub chunk: usize,
    /// Upper bound on `tokens.len()`: prompt + max_tokens, capped by the context.
    pub max_len: usize,
    /// Logprobs of prompt tokens `1..` scored so far (`params.prompt_logprobs`),
    /// handed out with the first sampled token.
    pub prompt_logprobs: Vec<SampledToken>,
    /// Hashes of the full blocks at the start of `block_table`, each
    /// chained from the one before (the prefix cache's keys).
    pub block_hashes: Vec<BlockHash>,
    /// What its prompt adds to those hashes besides the tokens.
    pub block_keys: BlockKeys,
    /// Prompt tokens the prefix cache supplied when the sequence was first
    /// admitted (reported as `cached_tokens`); `None` until then.
    pub cached_prompt_tokens: Option<usize>,
    /// Decode steps sat out in a row for its grammar's mask time
    /// ([`crate::engine::mask_budget::MaskBudget`]).
    pub sat_out: u32,
    /// An embedding request's vector in the making: it samples nothing.
    pub pool: Option<Pool>,
    /// Tokens drafted for the decode row being scheduled
    /// ([`crate::engine::speculation`]), until the step's plan takes them.
    /// Not part of `tokens`: nothing of them is the sequence's until kept.
    pub draft: Vec<u32>,
    /// How likely its drafted tokens have been to hold.
    pub acceptance: Acceptance,
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
    /// With the first token: prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: Option<usize>,
    /// An embedding request's vector, when its prompt is done.
    pub embedding: Option<Vec<f32>>,
    /// With the first token of a step whose decode row ran a draft: how
    /// many tokens were drafted, and accepted.
    pub draft: Option<DraftTally>,
}

impl StepEvent {
    /// The sequence ended without a token (an engine failure, a shutdown).
    pub fn ended(seq: SeqId, finish: FinishReason) -> Self {
        StepEvent {
            seq,
            token: None,
            finish: Some(finish),
            prompt_logprobs: Vec::new(),
            cached_prompt_tokens: None,
            embedding: None,
            draft: None,
        }
    }
}

impl Sequence {
    pub fn new(
        id: SeqId,
        prompt: Prompt,
        params: SamplingParams,
        max_context: usize,
        eos_ids: &[u32],
    ) -> Self {
        let Prompt {
            tokens,
            media,
            cache_salt,
        } = prompt;
        let prompt_len = tokens.len();
        let mut sampler = Sampler::new(&params);
        sampler.set_eos_ids(eos_ids);
        Sequence {
            id,
            group: id,
            queued_at: Instant::now(),
            sampler,
            max_len: (prompt_len + params.max_tokens).min(max_context),
            tokens,
            prompt_len,
            params,
            block_table: Vec::new(),
            window_table: Vec::new(),
            state_slot: None,
            num_cached: 0,
            chunk: 0,
            prompt_logprobs: Vec::new(),
            block_hashes: Vec::new(),
            block_keys: BlockKeys::new(media, cache_salt.as_deref()),
            cached_prompt_tokens: None,
            sat_out: 0,
            pool: None,
            draft: Vec::new(),
            acceptance: Acceptance::default(),
        }
    }

    /// An embedding request: its prompt, pooled as `pool` says.
    pub fn embedding(id: SeqId, prompt: Vec<u32>, pool: Pool) -> Self {
        let len = prompt.len();
        let mut seq = Sequence::new(id, prompt.into(), SamplingParams::default(), len, &[]);
        seq.max_len = len;
        seq.pool = Some(pool);
        seq
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Its next token's sampling, for the device sampler: its sampler
    /// draws the key now, as sampling on the host would.
    pub fn device_row(&mut self) -> DeviceRow {
        let (prompt, output) = self.tokens.split_at(self.prompt_len);
        self.sampler.device_row(prompt, output, None)
    }

    /// A decode row under a grammar: the mask it would compute this step,
    /// as a [`MaskRow`].
    pub fn mask_row(&self) -> Option<MaskRow> {
        let c = self.params.constraint.as_ref()?;
        (self.pending() == 1).then(|| MaskRow {
            cost: c.cost(),
            sat_out: self.sat_out,
        })
    }

    /// Tokens not yet in the cache (the rest of the prompt, or the last sampled token).
    pub fn pending(&self) -> usize {
        self.len() - self.num_cached
    }

    /// Whether sampling this step's rows reads nothing of the logits but
    /// their argmax: plain greedy decoding, no grammar, no prompt scores.
    pub fn argmax_suffices(&self) -> bool {
        let scoring = self.params.prompt_logprobs.is_some() && self.output().is_empty();
        self.params.constraint.is_none()
            && !scoring
            && self.sampler.argmax_only(self.output().len())
    }

    /// Whether its decode rows may carry drafts: a grammar's mask depends
    /// on every token before it, and an embedding decodes nothing.
    pub fn may_draft(&self) -> bool {
        self.params.constraint.is_none() && self.pool.is_none()
    }

    /// This step's tokens that are the sequence's own: its chunk less the
    /// drafted ones.
    /// `chunk` more prompt positions, moved so that they cut no media span
    /// and reach no image not `ready`
    /// ([`crate::engine::prompt::media_aligned`]).
    pub fn media_aligned(&self, chunk: usize, ready: &dyn Fn(u64) -> bool) -> usize {
        let media = self.block_keys.media();
        crate::engine::prompt::media_aligned(media, self.num_cached, chunk, ready)
    }

    /// The images of its prompt not yet prefilled.
    pub fn images_to_place(&self) -> impl Iterator<Item = &MediaSpan> {
        (self.block_keys.media().iter()).filter(|m| m.start + m.len > self.num_cached)
    }

    pub fn own_chunk(&self) -> usize {
        self.chunk - self.draft.len()
    }

    /// The rows of this step's chunk whose final hidden states it pools.
    pub fn hidden_rows(&self) -> LogitRows {
        self.pool.as_ref().map_or(LogitRows::None, |p| {
            p.rows_wanted(self.num_cached, self.chunk, self.len())
        })
    }

    /// The prompt token the next score is owed for (prompt token 0 has none).
    pub fn next_scored_prompt_token(&self) -> usize {
        1 + self.prompt_logprobs.len()
    }

    /// Why the sequence ends with `token` just appended, if it does.
    pub fn finish_reason(&self, token: u32, eos_ids: &[u32]) -> Option<FinishReason> {
        let p = &self.params;
        let may_stop = self.output().len() > p.min_tokens;
        let is_eos = !p.ignore_eos && eos_ids.contains(&token);
        // A constrained sequence samples EOS only where its grammar allows
        // the output to end.
        let grammar_end = p.constraint.is_some() && eos_ids.contains(&token);
        if grammar_end || (may_stop && (is_eos || p.stop_token_ids.binary_search(&token).is_ok())) {
            Some(FinishReason::Stop)
        } else if self.len() >= self.max_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}
