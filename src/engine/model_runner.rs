//! Runs the model over a step's flat batch with the KV pool, and hands back
//! the logits rows and hidden rows the batch asked for.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use candle_core::Tensor;

use crate::attention;
use crate::engine::step_plan::StepPlan;
use crate::error::panic_message;
use crate::kv::cache::KvCache;
use crate::kv::step_meta::MetaBuffers;
use crate::models::{FlatBatch, Model};
use crate::sampling::argmax::{argmax, argmax_rows};

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

/// What a step's forward came to, and how long it took.
pub struct RunnerOutput {
    /// The logits rows, and the hidden rows, in batch order.
    pub rows: Result<(Vec<LogitRow>, Rows), String>,
    pub took: Duration,
}

pub struct ModelRunner {
    model: Box<dyn Model>,
    cache: KvCache,
    /// Each step's metadata, packed into the same buffers step after step.
    meta: MetaBuffers,
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
            meta: MetaBuffers::default(),
            pick_on_device,
        }
    }

    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Runs a step's batch ([`StepPlan::batch`]) for `plan`, timing it; a
    /// failed forward, or a panic inside it, is the step's error.
    pub fn execute(&mut self, plan: &StepPlan, batch: &FlatBatch) -> RunnerOutput {
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| self.run(batch, &plan.argmax())));
        let rows = match result {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(e.to_string()),
            Err(panic) => Err(format!(
                "model step panicked: {}",
                panic_message(panic.as_ref())
            )),
        };
        RunnerOutput {
            rows,
            took: start.elapsed(),
        }
    }

    /// Runs the batch; returns the logits of [`FlatBatch::logit_rows`], where
    /// `argmax[r]` says row `r` needs only its argmax, and the final hidden
    /// states of [`FlatBatch::hidden_rows`].
    pub fn run(
        &mut self,
        batch: &FlatBatch,
        argmax: &[bool],
    ) -> candle_core::Result<(Vec<LogitRow>, Rows)> {
        let (model, cache) = (self.model.as_ref(), &mut self.cache);
        let window = model.info().sliding_window;
        let meta = attention::step_meta(&mut self.meta, batch, cache, window, model.device())?;
        let out = model.forward_all(&meta, cache)?;
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
