//! Runs the model over a step's flat batch with the KV pool, and hands back
//! the logits rows and hidden rows the batch asked for.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use candle_core::Tensor;

use crate::attention;
use crate::engine::image_features::{ImageFeatures, WantedImage};
use crate::engine::sequence::SeqId;
use crate::engine::step_plan::StepImage;
use crate::error::panic_message;
use crate::kv::cache::KvCache;
use crate::kv::step_meta::MetaBuffers;
use crate::models::vision::{ImageSpec, VisionEncoder};
use crate::models::{FlatBatch, Model};
use crate::sampling::argmax::{argmax, argmax_rows};
use crate::sampling::device::DeviceRow;
use crate::sampling::sampler::SampledToken;

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
    /// The token the device sampled for the row ([`Pick::Sample`]).
    Sampled(SampledToken),
    /// Kept on the device until its grammar's mask is known
    /// ([`Pick::SampleMasked`], [`ModelRunner::sample_held`]).
    Held,
}

impl LogitRow {
    /// The row's argmax (a sampled row's token); none for a held row.
    pub fn argmax(&self) -> Option<u32> {
        match self {
            LogitRow::Logits(row) => Some(argmax(row)),
            LogitRow::Argmax(id) => Some(*id),
            LogitRow::Sampled(t) => Some(t.id),
            LogitRow::Held => None,
        }
    }
}

/// Where a logits row is read.
#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    /// Whole, on the host.
    Whole,
    /// Only its argmax: picked on the device where the runner picks there,
    /// else the row comes back whole.
    Argmax,
    /// Sampled on a CUDA device under this row's sampling
    /// ([`ModelRunner::samples_on_device`]); only the token comes back.
    Sample(DeviceRow),
    /// The same under the grammar of sequence `SeqId`, whose mask is
    /// computed beside the forward: held on the device until
    /// [`ModelRunner::sample_held`].
    SampleMasked(SeqId, DeviceRow),
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
    /// The last step's [`Pick::SampleMasked`] rows: their logits, still on
    /// the device, and their sequences and sampling.
    held: Option<(Tensor, Vec<(SeqId, DeviceRow)>)>,
    /// The vision encoder, where the model takes images.
    images: Option<ImageFeatures>,
}

impl ModelRunner {
    pub fn new(model: Box<dyn Model>, cache: KvCache, force_device_path: bool) -> Self {
        let pick_on_device = force_device_path || !model.device().is_cpu();
        ModelRunner {
            model,
            cache,
            meta: MetaBuffers::default(),
            pick_on_device,
            held: None,
            images: None,
        }
    }

    pub fn set_vision(&mut self, encoder: VisionEncoder) {
        self.images = Some(ImageFeatures::new(encoder));
    }

    pub fn image_spec(&self) -> Option<&ImageSpec> {
        self.images.as_ref().map(|i| i.encoder().spec())
    }

    /// Whether an image's encoder output is ready to place.
    pub fn has_image(&self, hash: u64) -> bool {
        self.images.as_ref().is_some_and(|i| i.has(hash))
    }

    /// Encodes the images running prompts wait for, `patches` at a time,
    /// until `until` (at least a chunk); returns those that failed, with
    /// why.
    pub fn encode_images(
        &mut self,
        wanted: &[WantedImage],
        until: Instant,
        patches: usize,
    ) -> Vec<(u64, String)> {
        let device = self.model.device().clone();
        match &mut self.images {
            Some(features) => features.encode(wanted, until, patches, &device),
            None => (wanted.iter())
                .map(|(hash, _)| (*hash, "the model takes no images".to_string()))
                .collect(),
        }
    }

    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Whether rows may be sampled on the device ([`Pick::Sample`]): on a
    /// CUDA device.
    pub fn samples_on_device(&self) -> bool {
        self.model.device().is_cuda()
    }

    /// Runs a step's batch (`StepPlan::batch`) with its images' features
    /// in place (`StepPlan::images`), each logits row read as `picks` says,
    /// timing it; a failed forward, or a panic inside it, is the step's
    /// error.
    pub fn execute(
        &mut self,
        mut batch: FlatBatch,
        images: &[StepImage],
        picks: &[Pick],
    ) -> RunnerOutput {
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| {
            if !images.is_empty() {
                match &self.images {
                    Some(features) => features.place(&mut batch, images)?,
                    None => candle_core::bail!("the model takes no images"),
                }
            }
            self.run(&batch, picks)
        }));
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

    /// Runs the batch; returns the logits of [`FlatBatch::logit_rows`], row
    /// `r` read as `picks[r]` says, and the final hidden states of
    /// [`FlatBatch::hidden_rows`].
    pub fn run(
        &mut self,
        batch: &FlatBatch,
        picks: &[Pick],
    ) -> candle_core::Result<(Vec<LogitRow>, Rows)> {
        let (model, cache) = (self.model.as_ref(), &mut self.cache);
        let window = model.info().sliding_window;
        let meta = attention::step_meta(&mut self.meta, batch, cache, window, model.device())?;
        let out = model.forward_all(&meta, cache)?;
        let hidden = match out.hidden {
            Some(h) => h.to_vec2::<f32>()?,
            None => Vec::new(),
        };
        Ok((self.logit_rows(&out.logits, picks)?, hidden))
    }

    /// Brings back whole only the rows read whole: argmax rows are picked
    /// on the device (where the runner picks there), and sampled rows
    /// sampled there.
    fn logit_rows(
        &mut self,
        logits: &Tensor,
        picks: &[Pick],
    ) -> candle_core::Result<Vec<LogitRow>> {
        if picks.len() != logits.dim(0)? {
            candle_core::bail!("{} picks for {} logits rows", picks.len(), logits.dim(0)?);
        }
        #[derive(PartialEq)]
        enum Where {
            Host,
            Argmax,
            Sample,
            Hold,
        }
        let on_device = self.pick_on_device;
        let place = |p: &Pick| match p {
            Pick::Argmax if on_device => Where::Argmax,
            Pick::Sample(_) => Where::Sample,
            Pick::SampleMasked(..) => Where::Hold,
            _ => Where::Host,
        };
        // The rows read one way, as a tensor of their own (none: no rows).
        let select = |w: Where| -> candle_core::Result<Option<Tensor>> {
            let rows: Vec<u32> = (0..picks.len() as u32)
                .filter(|&r| place(&picks[r as usize]) == w)
                .collect();
            match rows.len() {
                0 => Ok(None),
                n if n == picks.len() => Ok(Some(logits.clone())),
                _ => Ok(Some(
                    logits.index_select(&Tensor::new(rows, logits.device())?, 0)?,
                )),
            }
        };
        let mut whole = match select(Where::Host)? {
            Some(t) => t.to_vec2::<f32>()?,
            None => Vec::new(),
        }
        .into_iter();
        let mut ids = match select(Where::Argmax)? {
            Some(t) => argmax_rows(&t)?,
            None => Vec::new(),
        }
        .into_iter();
        let sampling: Vec<DeviceRow> = picks
            .iter()
            .filter_map(|p| match p {
                Pick::Sample(row) => Some(row.clone()),
                _ => None,
            })
            .collect();
        let mut sampled = match select(Where::Sample)? {
            Some(t) => sample_on_device(&t, &sampling)?,
            None => Vec::new(),
        }
        .into_iter();
        let held: Vec<(SeqId, DeviceRow)> = picks
            .iter()
            .filter_map(|p| match p {
                Pick::SampleMasked(id, row) => Some((*id, row.clone())),
                _ => None,
            })
            .collect();
        self.held = select(Where::Hold)?.map(|t| (t, held));
        picks
            .iter()
            .map(|p| match place(p) {
                Where::Host => whole.next().map(LogitRow::Logits),
                Where::Argmax => ids.next().map(LogitRow::Argmax),
                Where::Sample => sampled.next().map(LogitRow::Sampled),
                Where::Hold => Some(LogitRow::Held),
            })
            .collect::<Option<_>>()
            .ok_or_else(|| candle_core::Error::Msg("a logits row short".into()))
    }
}

impl ModelRunner {
    /// Samples the rows the last step held ([`LogitRow::Held`], in their
    /// order), now that their grammars' masks are known: `allowed(seq,
    /// vocab)` gives a sequence's allowed ids as bits (none where its mask
    /// failed: that row's token is not used).
    pub fn sample_held(
        &mut self,
        allowed: impl Fn(SeqId, usize) -> Option<Vec<u32>>,
    ) -> candle_core::Result<Vec<SampledToken>> {
        let Some((logits, held)) = self.held.take() else {
            return Ok(Vec::new());
        };
        let vocab = logits.dim(1)?;
        let rows: Vec<DeviceRow> = held
            .into_iter()
            .map(|(id, row)| DeviceRow {
                allowed: allowed(id, vocab),
                ..row
            })
            .collect();
        sample_on_device(&logits, &rows)
    }
}

/// `sampling/device.rs`'s kernel, on a CUDA device.
fn sample_on_device(logits: &Tensor, rows: &[DeviceRow]) -> candle_core::Result<Vec<SampledToken>> {
    #[cfg(feature = "cuda")]
    return crate::sampling::device::cuda::sample_rows(logits, rows);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (logits, rows);
        candle_core::bail!("sampling on the device needs a CUDA device")
    }
}
