//! Turns the scheduled sequences into one flat batch, runs the model over it
//! with the KV pool, and hands back one logits row per sequence that
//! finished its pending tokens this step.

use crate::engine::kv_cache::KvCache;
use crate::engine::sequence::Sequence;
use crate::models::{FlatBatch, Model};

/// One `Vec<f32>` per row.
pub type Rows = Vec<Vec<f32>>;

pub struct ModelRunner {
    model: Box<dyn Model>,
    cache: KvCache,
}

impl ModelRunner {
    pub fn new(model: Box<dyn Model>, cache: KvCache) -> Self {
        ModelRunner { model, cache }
    }

    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The flat batch for every sequence with a non-zero `chunk`, in order.
    pub fn build_batch<'a>(seqs: impl Iterator<Item = &'a Sequence>) -> FlatBatch {
        let mut batch = FlatBatch::default();
        for seq in seqs.filter(|s| s.chunk > 0) {
            let range = seq.num_cached..seq.num_cached + seq.own_chunk();
            batch.push(
                &seq.tokens,
                range,
                seq.block_table.clone(),
                seq.logit_rows(),
            );
            batch.extend_last(&seq.draft);
            if let Some(s) = batch.seqs.last_mut() {
                s.window_table.clone_from(&seq.window_table);
                s.state_slot = seq.state_slot;
                s.hidden = seq.hidden_rows();
            }
        }
        batch
    }

    /// Runs the batch; returns the logits of [`FlatBatch::logit_rows`] and
    /// the final hidden states of [`FlatBatch::hidden_rows`].
    pub fn run(&mut self, batch: &FlatBatch) -> candle_core::Result<(Rows, Rows)> {
        let out = self.model.forward_all(batch, &mut self.cache)?;
        let hidden = match out.hidden {
            Some(h) => h.to_vec2::<f32>()?,
            None => Vec::new(),
        };
        Ok((out.logits.to_vec2::<f32>()?, hidden))
    }
}
