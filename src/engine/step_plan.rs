//! One step as data, as it passes from stage to stage:
//! [`Scheduler::schedule`](crate::engine::scheduler::Scheduler::schedule)
//! writes a [`StepPlan`] (which sequences run, with which tokens and
//! drafts, and what each row needs), the drafter fills its drafts in, the
//! runner turns it into one [`FlatBatch`], sampling answers each row with
//! a [`RowOutput`], and
//! [`Scheduler::update`](crate::engine::scheduler::Scheduler::update)
//! applies those to the sequences.

use std::borrow::Borrow;
use std::ops::Range;

use crate::engine::sequence::{SeqId, Sequence};
use crate::models::{FlatBatch, LogitRows};
use crate::sampling::sampler::SampledToken;

/// What the scheduler gave one step.
#[derive(Debug, Default)]
pub struct StepPlan {
    /// The sequences that run, in batch order.
    pub rows: Vec<RowPlan>,
    /// Sequences taken out of the running batch for want of blocks, queued
    /// again.
    pub preempted: Vec<SeqId>,
}

/// One running sequence's part of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct RowPlan {
    pub seq: SeqId,
    /// Its index among the scheduler's running sequences, which stay put
    /// from `schedule` to `update`.
    pub slot: usize,
    /// Position of its first new token: the tokens before it are cached.
    pub first: usize,
    /// Its own new tokens (prompt, or the one pending), from `first`.
    pub chunk: usize,
    /// Tokens drafted after them, verified by sampling
    /// ([`crate::engine::speculation`]); placeholders until the draft model
    /// proposes.
    pub draft: Vec<u32>,
    /// The chunk brings it to its end: it samples (or pools) this step.
    pub ends: bool,
    /// Scores its prompt: every row's logits, not only the last.
    pub scores: bool,
    /// An embedding request: it pools instead of sampling.
    pub pools: bool,
    /// Which rows' final hidden states it pools.
    pub hidden: LogitRows,
    /// Sampling reads nothing but the argmax of its rows.
    pub argmax_only: bool,
    /// Samples under a grammar, whose mask is computed beside the forward.
    pub masked: bool,
}

impl RowPlan {
    /// The plan of `seq` for the tokens the scheduler gave it.
    pub fn of(seq: &Sequence, slot: usize) -> RowPlan {
        RowPlan {
            seq: seq.id,
            slot,
            first: seq.num_cached,
            chunk: seq.own_chunk(),
            draft: seq.draft.clone(),
            ends: seq.num_cached + seq.own_chunk() == seq.len(),
            scores: seq.params.prompt_logprobs.is_some() && seq.output().is_empty(),
            pools: seq.pool.is_some(),
            hidden: seq.hidden_rows(),
            argmax_only: seq.argmax_suffices(),
            masked: seq.params.constraint.is_some(),
        }
    }

    /// Which of its rows need logits. Prompt scoring stops with the first
    /// sampled token, so a sequence preempted later does not score its
    /// prompt again when it is recomputed.
    pub fn logit_rows(&self) -> LogitRows {
        match (self.scores, self.ends) {
            _ if !self.draft.is_empty() => LogitRows::All,
            _ if self.pools => LogitRows::None,
            (true, _) => LogitRows::All,
            (false, true) => LogitRows::Last,
            (false, false) => LogitRows::None,
        }
    }

    /// How many logits rows it has ([`RowPlan::logit_rows`]).
    pub fn num_logit_rows(&self) -> usize {
        rows_of(self.logit_rows(), self.chunk + self.draft.len())
    }

    /// How many hidden rows it hands back ([`RowPlan::hidden`]).
    pub fn num_hidden_rows(&self) -> usize {
        rows_of(self.hidden, self.chunk)
    }

    /// Whether its grammar's mask is needed this step: it samples.
    pub fn needs_mask(&self) -> bool {
        self.masked && self.ends
    }
}

fn rows_of(which: LogitRows, len: usize) -> usize {
    match which {
        LogitRows::None => 0,
        LogitRows::Last => 1,
        LogitRows::All => len,
    }
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The step's flat batch, read from the `running` sequences the rows
    /// point into.
    pub fn batch(&self, running: &[Sequence]) -> FlatBatch {
        let mut batch = FlatBatch::default();
        for row in &self.rows {
            let seq = &running[row.slot];
            let range = row.first..row.first + row.chunk;
            batch.push(
                &seq.tokens,
                range,
                seq.block_table.clone(),
                row.logit_rows(),
            );
            batch.extend_last(&row.draft);
            if let Some(s) = batch.seqs.last_mut() {
                s.window_table.clone_from(&seq.window_table);
                s.state_slot = seq.state_slot;
                s.hidden = row.hidden;
            }
        }
        batch
    }
}

/// An image whose tokens a step prefills (some of them, where the rest are
/// cached), for the runner to put its encoder's kept output in their
/// place.
#[derive(Debug, Clone, PartialEq)]
pub struct StepImage {
    /// Its sequence's index in the step's batch.
    pub seq: usize,
    /// Its tokens' prompt positions.
    pub span: Range<usize>,
    pub hash: u64,
}

impl StepPlan {
    /// The images among the rows the step runs, read from the `running`
    /// sequences the rows point into.
    pub fn images(&self, running: &[Sequence]) -> Vec<StepImage> {
        let mut images = Vec::new();
        for (i, row) in self.rows.iter().enumerate() {
            let (from, to) = (row.first, row.first + row.chunk);
            let media = running[row.slot].block_keys.media();
            images.extend(
                media
                    .iter()
                    .filter(|m| m.start < to && from < m.start + m.len)
                    .map(|m| StepImage {
                        seq: i,
                        span: m.start..m.start + m.len,
                        hash: m.hash,
                    }),
            );
        }
        images
    }
}

/// Pairs each of `rows` with its sequence among `running`; rows are in
/// slot order, as the scheduler plans them.
pub fn pair<R: Borrow<RowPlan>>(
    rows: impl IntoIterator<Item = R>,
    running: &mut [Sequence],
) -> Vec<(R, &mut Sequence)> {
    let mut seqs = running.iter_mut().enumerate();
    rows.into_iter()
        .filter_map(|row| {
            let want = row.borrow().slot;
            let (_, seq) = seqs.by_ref().find(|(i, _)| *i == want)?;
            Some((row, seq))
        })
        .collect()
}

/// What one row of a step came to.
#[derive(Debug, Default)]
pub struct RowOutput {
    /// Tokens sampled: none for a chunk short of its end, one for a plain
    /// row, the drafts kept and the one past them for a drafted row.
    pub tokens: Vec<SampledToken>,
    /// Scores of prompt tokens its logits rows predict.
    pub prompt_logprobs: Vec<SampledToken>,
    /// Its final hidden rows, for an embedding request to pool.
    pub hidden: Vec<Vec<f32>>,
    /// Its grammar failed: it samples nothing and ends, with this message.
    pub failed: Option<String>,
}
