//! Turns the scheduled sequences into one flat batch, runs the model over it
//! with the KV pool, and hands back one logits row per sequence that
//! finished its pending tokens this step.

use candle_core::Tensor;

use crate::engine::sequence::Sequence;
use crate::kv::cache::KvCache;
use crate::models::{FlatBatch, Model};
use crate::sampling::argmax::argmax_rows;
use crate::sampling::sampler::argmax;

/// One `Vec<f32>` per row.
pub type Rows = Vec<Vec<f32>>;

/// A row of logits as the sampler gets it.
#[derive(Debug, Clone, PartialEq)]
pub enum LogitRow {
    Logits(Vec<f32>),
    /// Only the row's argmax: all a plain greedy row reads
    /// ([`crate::sampling::sampler::Sampler::argmax_only`]), picked on the
    /// device so that the row never crosses to the host.
    Argmax(u32),
}

impl LogitRow {
    pub fn argmax(&self) -> u32 {
        match self {
            LogitRow::Logits(row) => argmax(row),
            LogitRow::Argmax(id) => *id,
        }
    }
}

pub struct ModelRunner {
    model: Box<dyn Model>,
    cache: KvCache,
    /// Pick argmax rows where the logits are (any device but the CPU, or
    /// the CPU taking the devices' path), rather than bringing them back.
    pick_on_device: bool,
}

impl ModelRunner {
    pub fn new(model: Box<dyn Model>, cache: KvCache, force_device_path: bool) -> Self {
        let pick_on_device = force_device_path || !model.device().is_cpu();
        ModelRunner {
            model,
            cache,
            pick_on_device,
        }
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

    /// Runs the batch; returns the logits of [`FlatBatch::logit_rows`], where
    /// `argmax[r]` says row `r` needs only its argmax, and the final hidden
    /// states of [`FlatBatch::hidden_rows`].
    pub fn run(
        &mut self,
        batch: &FlatBatch,
        argmax: &[bool],
    ) -> candle_core::Result<(Vec<LogitRow>, Rows)> {
        let out = self.model.forward_all(batch, &mut self.cache)?;
        let hidden = match out.hidden {
            Some(h) => h.to_vec2::<f32>()?,
            None => Vec::new(),
        };
        Ok((self.logit_rows(&out.logits, argmax)?, hidden))
    }

    /// Brings back whole only the rows that need more than their argmax,
    /// when picking on the device.
    fn logit_rows(&self, logits: &Tensor, argmax: &[bool]) -> candle_core::Result<Vec<LogitRow>> {
        let whole = |t: &Tensor| -> candle_core::Result<Vec<LogitRow>> {
            Ok(t.to_vec2::<f32>()?
                .into_iter()
                .map(LogitRow::Logits)
                .collect())
        };
        if !self.pick_on_device || !argmax.contains(&true) {
            return whole(logits);
        }
        if argmax.len() != logits.dim(0)? {
            candle_core::bail!(
                "{} argmax flags for {} logits rows",
                argmax.len(),
                logits.dim(0)?
            );
        }
        if !argmax.contains(&false) {
            return Ok(argmax_rows(logits)?
                .into_iter()
                .map(LogitRow::Argmax)
                .collect());
        }
        let select = |pick: bool| -> candle_core::Result<Tensor> {
            let rows: Vec<u32> = (0..argmax.len() as u32)
                .filter(|&r| argmax[r as usize] == pick)
                .collect();
            logits.index_select(&Tensor::new(rows, logits.device())?, 0)
        };
        let mut ids = argmax_rows(&select(true)?)?.into_iter();
        let mut rows = whole(&select(false)?)?.into_iter();
        argmax
            .iter()
            .map(|&pick| match pick {
                true => ids.next().map(LogitRow::Argmax),
                false => rows.next(),
            })
            .collect::<Option<_>>()
            .ok_or_else(|| candle_core::Error::Msg("a logits row short".into()))
    }
}
