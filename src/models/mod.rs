//! Model architectures. A model knows nothing of scheduling: the runner hands
//! it a [`FlatBatch`] (the new tokens of many sequences, concatenated) and the
//! KV pool, and gets back the logits of the rows that asked for them.

pub mod elementwise;
pub mod embedding;
pub mod ffn;
pub mod gated_delta;
pub mod gemma4;
pub mod gguf;
pub mod gpt2;
pub mod linear;
pub mod llama;
pub mod mlp;
pub mod moe;
pub mod moe_device;
pub mod qwen35;
pub mod registry;
pub mod rope;
pub mod siglip;
pub mod vision;

use std::sync::Arc;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Result, Tensor};

use crate::attention;
pub use crate::kv::batch::{FlatBatch, LogitRows, SeqSlice};
use crate::kv::cache::{KvCache, KvDtype, KvShape};
use crate::kv::step_meta::{MetaBuffers, StepMeta};
pub use gguf::{read_tensor, Gguf};
use moe::ExpertLoad;

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
    /// The sliding-window layers' K/V heads where they differ from
    /// `num_kv_heads` of `head_dim` (Gemma 4's).
    pub window_kv: Option<KvShape>,
}

impl ModelInfo {
    /// Refuses heads the attention kernels cannot group: each K/V head
    /// serves `num_heads / num_kv_heads` query heads, so the one must be a
    /// multiple of the other (a malformed file is the only way it is not).
    pub fn check_heads(&self) -> std::result::Result<(), String> {
        let window = self.window_kv.map(|w| w.num_kv_heads);
        for kv in [Some(self.num_kv_heads), window].into_iter().flatten() {
            if kv == 0 || !self.num_heads.is_multiple_of(kv) {
                return Err(format!(
                    "the model has {} attention heads and {kv} K/V heads: the first must be \
                     a multiple of the second",
                    self.num_heads
                ));
            }
        }
        Ok(())
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

/// A GGUF file's `general.architecture`, which [`registry`] keys its
/// families by; empty when the file has none.
pub fn gguf_architecture(content: &gguf_file::Content) -> &str {
    content
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .map_or("", String::as_str)
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
    /// Writes the step's K/V into `cache` and returns the logits and hidden
    /// states its rows asked for. The runner packs the step's metadata
    /// ([`StepMeta`], the batch with it) once, in buffers it keeps.
    fn forward_all(&self, meta: &StepMeta, cache: &mut KvCache) -> Result<Output>;

    /// Bytes of the recurrent state one sequence holds (in a
    /// [`SeqSlice::state_slot`]), for a model with layers that keep one
    /// instead of K/V; `None` for a model that has none.
    fn state_bytes(&self) -> Option<usize> {
        None
    }

    /// Rows routed to each expert so far, for a mixture of experts.
    fn expert_load(&self) -> Option<Arc<ExpertLoad>> {
        None
    }

    /// [`Model::forward_all`]'s logits for `batch` alone, its metadata
    /// packed afresh (for callers without a runner: tests, tools).
    fn forward(&self, batch: &FlatBatch, cache: &mut KvCache) -> Result<Tensor> {
        let mut bufs = MetaBuffers::default();
        let window = self.info().sliding_window;
        let meta = attention::step_meta(&mut bufs, batch, cache, window, self.device())?;
        Ok(self.forward_all(&meta, cache)?.logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(num_heads: usize, num_kv_heads: usize) -> ModelInfo {
        ModelInfo {
            num_layers: 2,
            num_heads,
            num_kv_heads,
            head_dim: 64,
            vocab_size: 100,
            max_context: 128,
            kv_dtype: KvDtype::F32,
            window_layers: Vec::new(),
            sliding_window: None,
            window_kv: None,
        }
    }

    #[test]
    fn query_heads_must_group_evenly_over_kv_heads() {
        assert!(info(32, 8).check_heads().is_ok());
        assert!(info(9, 9).check_heads().is_ok());
        let e = info(10, 4).check_heads().unwrap_err();
        assert!(e.contains("10 attention heads and 4 K/V heads"), "{e}");
        assert!(info(8, 0).check_heads().is_err());
    }
}
