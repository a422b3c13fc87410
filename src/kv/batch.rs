//! A step's input as the models see it: the new tokens of many sequences
//! laid end to end ([`FlatBatch`]), each sequence's slice of the rows and
//! where its K/V live ([`SeqSlice`]), and which rows want logits.

use candle_core::{Result, Tensor};

use super::BlockId;

/// One forward call's input: tokens of many sequences laid end to end, each
/// token's position, and which rows belong to which sequence. Sequences are
/// in row order and cover every row exactly once.
#[derive(Debug, Clone, Default)]
pub struct FlatBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqSlice>,
    /// Rows whose input vectors are given in place of their tokens'
    /// embeddings (an image's tokens, from its encoder and projector): the
    /// first row and `[rows, hidden]`.
    pub embeds: Vec<(usize, Tensor)>,
}

impl FlatBatch {
    /// Appends one sequence's new tokens, `positions` of its whole token list
    /// `tokens`, cached in `block_table`.
    pub fn push(
        &mut self,
        tokens: &[u32],
        positions: std::ops::Range<usize>,
        block_table: Vec<BlockId>,
        logits: LogitRows,
    ) {
        let start = positions.start;
        self.push_at(&tokens[positions], start, block_table, logits);
    }

    /// Appends one sequence's new `tokens`, the first at position
    /// `first_pos`, cached in `block_table`.
    pub fn push_at(
        &mut self,
        tokens: &[u32],
        first_pos: usize,
        block_table: Vec<BlockId>,
        logits: LogitRows,
    ) {
        self.seqs.push(SeqSlice {
            start: self.tokens.len(),
            len: tokens.len(),
            first_pos,
            block_table,
            window_table: Vec::new(),
            state_slot: None,
            logits,
            hidden: LogitRows::None,
            seen_whole: Vec::new(),
        });
        self.tokens.extend_from_slice(tokens);
        let first = first_pos as u32;
        self.positions.extend(first..first + tokens.len() as u32);
    }

    /// Appends `tokens` to the last sequence pushed, at the positions after
    /// its own: a decode row's drafted tokens, run in the same slice.
    pub fn extend_last(&mut self, tokens: &[u32]) {
        let Some(s) = self.seqs.last_mut() else {
            return;
        };
        let next = (s.first_pos + s.len) as u32;
        s.len += tokens.len();
        self.tokens.extend_from_slice(tokens);
        self.positions.extend(next..next + tokens.len() as u32);
    }

    /// `x`, the step's input vectors (one a row, after any scaling of
    /// the token embeddings), with the given rows in place.
    pub fn with_embeds(&self, x: Tensor) -> Result<Tensor> {
        self.embeds.iter().try_fold(x, |x, (row, values)| {
            let (rows, width) = values.dims2()?;
            x.slice_assign(&[*row..row + rows, 0..width], &values.to_dtype(x.dtype())?)
        })
    }

    /// Rows whose logits are wanted, in row order.
    pub fn logit_rows(&self) -> Vec<u32> {
        self.rows(|s| s.logits)
    }

    /// Rows whose final hidden states are wanted, in row order.
    pub fn hidden_rows(&self) -> Vec<u32> {
        self.rows(|s| s.hidden)
    }

    fn rows(&self, which: impl Fn(&SeqSlice) -> LogitRows) -> Vec<u32> {
        let mut rows = Vec::new();
        for s in &self.seqs {
            let end = (s.start + s.len) as u32;
            match which(s) {
                LogitRows::None => {}
                LogitRows::Last => rows.push(end - 1),
                LogitRows::All => rows.extend(s.start as u32..end),
            }
        }
        rows
    }
}

/// One sequence's slice of a flat batch: rows `start..start + len` are its new
/// tokens, at positions `first_pos..first_pos + len`.
#[derive(Debug, Clone)]
pub struct SeqSlice {
    pub start: usize,
    pub len: usize,
    pub first_pos: usize,
    pub block_table: Vec<BlockId>,
    /// Its blocks in the sliding-window layers' pool, where the model has
    /// such layers (`engine::window_blocks`).
    pub window_table: Vec<BlockId>,
    /// Its recurrent-state slot, where the model has layers that keep one
    /// per sequence instead of K/V (Qwen3.5's linear-attention layers;
    /// `engine::state_slots`). A slice at position 0 starts from
    /// a zero state.
    pub state_slot: Option<u32>,
    /// Which of its rows get logits.
    pub logits: LogitRows,
    /// Which of its rows hand back their final hidden states (after the
    /// last norm): an embedding request's, to pool.
    pub hidden: LogitRows,
    /// Spans of positions whose rows see the whole span besides their
    /// causal past (a Gemma 3 image's tokens attend to each other both
    /// ways); each ends within this step's rows, and its start may be
    /// cached.
    pub seen_whole: Vec<std::ops::Range<usize>>,
}

/// Which rows of a sequence's slice the model computes logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None: a prefill chunk that does not end the prompt.
    None,
    /// The last row, to sample the next token from.
    Last,
    /// Every row, to score the prompt tokens (echo with logprobs) too.
    All,
}

impl SeqSlice {
    /// Its block table for a layer: the sliding-window pool's for a
    /// sliding-window layer where it has one, else the shared one (a pool
    /// without a separate window part).
    pub fn table(&self, windowed: bool) -> &[BlockId] {
        match windowed && !self.window_table.is_empty() {
            true => &self.window_table,
            false => &self.block_table,
        }
    }

    /// Positions cached once this step's tokens are written.
    pub fn context_len(&self) -> usize {
        self.first_pos + self.len
    }

    /// The end of the positions the row at `pos` attends to: past its own
    /// to the end of a span seen whole, never past this step's rows (the
    /// kernels read the block table up to it).
    pub fn visible_end(&self, pos: usize) -> usize {
        self.seen_whole
            .iter()
            .find(|span| span.contains(&pos))
            .map_or(pos + 1, |span| span.end.min(self.context_len()))
    }
}
