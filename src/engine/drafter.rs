//! Drafts from a second, smaller model sharing the tokenizer
//! (`--draft-model`): for each decode row the scheduler gave a draft
//! length, the draft model catches up on the row's tokens it has not seen
//! and then proposes that many tokens, one forward over all such rows per
//! token. Each proposal is what the row's own sampler picks from the draft
//! model's logits with the random key its target row will be sampled with
//! ([`crate::sampling::sampler::Sampler::propose`]); greedy rows take the
//! argmax. Verification ([`crate::engine::speculation`]) keeps a
//! drafted token only where the target samples it, so the output is
//! exactly the target's, and a sampled row's draft holds wherever the two
//! models' distributions agree.
//!
//! The draft model has a paged KV pool of its own, and a block table and
//! cache cursor per sequence. What it cached past the tokens the target
//! has kept is stale once a draft is rejected; each round starts from the
//! shorter of its cursor and the target's, so nothing needs rolling back.

use std::collections::{HashMap, HashSet};

use crate::engine::block_manager::BlockManager;
use crate::engine::model_runner::{LogitRow, ModelRunner, Pick};
use crate::engine::sequence::{SeqId, Sequence};
use crate::engine::speculation::{DraftRun, MODEL_DRAFT};
use crate::engine::step_plan::RowPlan;
use crate::kv::cache::KvCache;
use crate::kv::BlockId;
use crate::models::{FlatBatch, LogitRows, Model};

/// A sequence's state in the draft model's pool.
#[derive(Default)]
struct DraftSeq {
    table: Vec<BlockId>,
    /// Leading tokens whose K/V the draft model holds.
    cached: usize,
}

pub struct Drafter {
    runner: ModelRunner,
    blocks: BlockManager,
    seqs: HashMap<SeqId, DraftSeq>,
}

impl Drafter {
    pub fn new(model: Box<dyn Model>, cache: KvCache, blocks: BlockManager) -> Self {
        Drafter {
            runner: ModelRunner::new(model, cache, false),
            blocks,
            seqs: HashMap::new(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.runner.model().info().vocab_size
    }

    /// Replaces the placeholder drafts of a step's rows
    /// ([`MODEL_DRAFT`](crate::engine::speculation::MODEL_DRAFT)) with the
    /// draft model's proposals, as many as it has placeholders.
    /// Rows without a draft are prompt chunks: the draft model caches them
    /// in the first round, alongside the target's prefill, so a prompt
    /// costs the first decode step nothing. A row the draft pool cannot
    /// hold, or a failed forward, leaves its draft empty (and its chunk
    /// one token). Returns what it ran, for the plan to learn a round's
    /// cost.
    pub fn propose(&mut self, rows: Vec<(&mut RowPlan, &mut Sequence)>) -> DraftRun {
        // Rows drafting with the model, and the prompt chunks of those that
        // may draft later, which it caches alongside the target.
        let mut rows: Vec<_> = rows
            .into_iter()
            .filter(|(row, seq)| match row.draft.first() {
                Some(&t) => t == MODEL_DRAFT,
                None => seq.may_draft() && (seq.pending() > 1 || seq.output().is_empty()),
            })
            .collect();
        if rows.is_empty() {
            return DraftRun::default();
        }
        let mut active: Vec<usize> = Vec::new();
        for (r, (row, seq)) in rows.iter_mut().enumerate() {
            let state = self.seqs.entry(seq.id).or_default();
            state.cached = state.cached.min(seq.num_cached);
            // A prompt chunk's tokens; a drafting row's tokens, then all
            // but its last proposal.
            let upto = match row.draft.len() {
                0 => row.first + row.chunk,
                want => seq.len() + want - 1,
            };
            if self.blocks.grow(&mut state.table, upto) {
                active.push(r);
            } else {
                let mut state = self.seqs.remove(&seq.id).unwrap_or_default();
                self.blocks.release(&mut state.table);
                // Back to its one token.
                row.draft.clear();
            }
        }
        let mut proposals: Vec<Vec<u32>> = vec![Vec::new(); rows.len()];
        // The keys each drafting row's sampler will draw its rows with.
        let ahead: Vec<Vec<u64>> = rows
            .iter()
            .map(|(row, seq)| seq.sampler.next_keys(row.draft.len()))
            .collect();
        let ran = DraftRun {
            rounds: active
                .iter()
                .map(|&r| rows[r].0.draft.len())
                .max()
                .unwrap_or(0),
            prefilled: active.iter().any(|&r| rows[r].0.draft.is_empty()),
        };
        // Prompt chunks run in the first round.
        for j in 0..ran.rounds.max(usize::from(ran.prefilled)) {
            let run: Vec<usize> = active
                .iter()
                .copied()
                .filter(|&r| rows[r].0.draft.len() > j || j == 0)
                .collect();
            let mut batch = FlatBatch::default();
            for &r in &run {
                let (row, seq) = &rows[r];
                let state = &self.seqs[&seq.id];
                let table = state.table.clone();
                // The first round catches up on the sequence's own tokens;
                // later ones feed the last proposal.
                match (proposals[r].last(), row.draft.is_empty()) {
                    (None, true) => {
                        let chunk = state.cached..row.first + row.chunk;
                        batch.push(&seq.tokens, chunk, table, LogitRows::None)
                    }
                    (None, false) => {
                        batch.push(&seq.tokens, state.cached..seq.len(), table, LogitRows::Last)
                    }
                    (Some(&last), _) => {
                        batch.push_at(&[last], seq.len() + j - 1, table, LogitRows::Last)
                    }
                }
            }
            let picks: Vec<Pick> = run
                .iter()
                .map(|&r| &rows[r])
                .filter(|(row, _)| !row.draft.is_empty())
                .map(
                    |(_, seq)| match seq.sampler.argmax_only(seq.output().len() + j) {
                        true => Pick::Argmax,
                        false => Pick::Whole,
                    },
                )
                .collect();
            let logits = match self.runner.run(&batch, &picks) {
                Ok((logits, _)) => logits,
                Err(e) => {
                    tracing::warn!("draft model step failed, drafting nothing: {e}");
                    for &r in &active {
                        rows[r].0.draft.clear();
                    }
                    self.retain(&HashSet::new());
                    return DraftRun::default();
                }
            };
            let mut logits = logits.into_iter();
            for &r in &run {
                let (row, seq) = &mut rows[r];
                let state = self.seqs.get_mut(&seq.id).expect("drafting sequence");
                if row.draft.is_empty() {
                    state.cached = row.first + row.chunk;
                    continue;
                }
                state.cached = seq.len() + j;
                if let Some(row) = logits.next() {
                    let key = ahead[r][proposals[r].len()];
                    if let Some(token) = propose(seq, row, &proposals[r], key) {
                        proposals[r].push(token);
                    }
                }
            }
        }
        for &r in &active {
            if !rows[r].0.draft.is_empty() {
                rows[r].0.draft = std::mem::take(&mut proposals[r]);
            }
        }
        ran
    }

    /// Forgets the sequences not in `running`, freeing their blocks.
    pub fn retain(&mut self, running: &HashSet<SeqId>) {
        let blocks = &mut self.blocks;
        self.seqs.retain(|id, state| {
            let keep = running.contains(id);
            if !keep {
                blocks.release(&mut state.table);
            }
            keep
        });
    }
}

/// The token `seq`'s sampler picks from the draft model's `row`, after
/// its output and the `proposed` tokens, drawing with `key`.
fn propose(seq: &mut Sequence, row: LogitRow, proposed: &[u32], key: u64) -> Option<u32> {
    match row {
        LogitRow::Logits(mut row) => {
            let (prompt, output) = seq.tokens.split_at(seq.prompt_len);
            let output = [output, proposed].concat();
            Some(seq.sampler.propose(&mut row, prompt, &output, key))
        }
        // The draft model's rows are picked whole or as their argmax.
        row => row.argmax(),
    }
}
