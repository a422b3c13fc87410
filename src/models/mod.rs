//! Model architectures. A model knows nothing of scheduling: the runner hands
//! it a [`FlatBatch`] (the new tokens of many sequences, concatenated) and the
//! KV pool, and gets back the logits of the rows that asked for them.

pub mod elementwise;
pub mod embedding;
pub mod gpt2;
pub mod linear;
pub mod llama;
pub mod qwen35;
pub mod rope;
pub mod step_meta;

use candle_core::{Device, Result, Tensor};

pub use crate::attention::{LogitRows, SeqSlice};
use crate::kv::cache::{KvCache, KvDtype};
pub use step_meta::StepMeta;

/// What the engine needs to know about a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Longest sequence (prompt plus output) the model accepts.
    pub max_context: usize,
    /// How its K/V are cached: f32 for f32 weights, f16 otherwise.
    pub kv_dtype: KvDtype,
    /// Layers that attend within a sliding window (Gemma 3's local ones),
    /// and that window: their K/V live in a pool of their own.
    pub window_layers: Vec<usize>,
    pub sliding_window: Option<usize>,
}

/// One forward call's input: tokens of many sequences laid end to end, each
/// token's position, and which rows belong to which sequence. Sequences are
/// in row order and cover every row exactly once.
#[derive(Debug, Clone, Default)]
pub struct FlatBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqSlice>,
}

impl FlatBatch {
    /// Appends one sequence's new tokens, `positions` of its whole token list
    /// `tokens`, cached in `block_table`.
    pub fn push(
        &mut self,
        tokens: &[u32],
        positions: std::ops::Range<usize>,
        block_table: Vec<crate::kv::BlockId>,
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
        block_table: Vec<crate::kv::BlockId>,
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

/// What a forward hands back.
pub struct Output {
    /// `[n, vocab]` f32 logits of [`FlatBatch::logit_rows`], in that order.
    pub logits: Tensor,
    /// `[m, hidden]` f32 final hidden states (after the last norm) of
    /// [`FlatBatch::hidden_rows`], in that order; `None` when there are none.
    pub hidden: Option<Tensor>,
}

impl KvDtype {
    /// The cache dtype for weights held in `dtype`.
    pub fn for_weights(dtype: candle_core::DType) -> Self {
        match dtype {
            candle_core::DType::F32 => KvDtype::F32,
            _ => KvDtype::F16,
        }
    }
}

/// The final norm `norm` of the hidden rows `x` (the residual stream after
/// the last layer) that `batch` asks for, if any.
pub fn hidden_states(
    x: &Tensor,
    batch: &FlatBatch,
    device: &Device,
    norm: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    let rows = batch.hidden_rows();
    if rows.is_empty() {
        return Ok(None);
    }
    norm(&x.index_select(&Tensor::new(rows.as_slice(), device)?, 0)?).map(Some)
}

pub trait Model: Send {
    fn info(&self) -> &ModelInfo;
    fn device(&self) -> &Device;
    /// Writes the batch's K/V into `cache` and returns the logits and hidden
    /// states the batch's rows asked for.
    fn forward_all(&self, batch: &FlatBatch, cache: &mut KvCache) -> Result<Output>;

    /// Bytes of the recurrent state one sequence holds (in a
    /// [`SeqSlice::state_slot`]), for a model with layers that keep one
    /// instead of K/V; `None` for a model that has none.
    fn state_bytes(&self) -> Option<usize> {
        None
    }

    /// [`Model::forward_all`]'s logits alone.
    fn forward(&self, batch: &FlatBatch, cache: &mut KvCache) -> Result<Tensor> {
        Ok(self.forward_all(batch, cache)?.logits)
    }
}
