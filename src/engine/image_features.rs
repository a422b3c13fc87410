//! The image side of the engine: the runner's vision encoder, run a chunk
//! of patches at a time over the images running prompts wait for, and its
//! outputs kept by content hash until their tokens are prefilled, and
//! after (an image sent again, in a conversation's next turn whose cached
//! blocks were evicted or in another request, is not encoded again).
//!
//! Encoding shares the scheduler thread with the steps: each step encodes
//! for as long as its budget leaves ([`crate::engine::step_budget`]), at
//! least one chunk, so that a 20-second image never stalls the running
//! streams for more than a chunk past their step. A prompt's chunk stops
//! before an image whose features are not kept yet
//! ([`crate::engine::prompt::media_aligned`]).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use candle_core::{Device, Result, Tensor};

use crate::engine::prompt::Pixels;
use crate::engine::step_plan::StepImage;
use crate::error::panic_message;
use crate::models::siglip::TowerRun;
use crate::models::vision::VisionEncoder;
use crate::models::FlatBatch;

/// Encoder outputs kept past their prompts, the oldest dropped first: a
/// Gemma 3 4B image's is 256 x 2560 f32, 2.6 MB. Those a running prompt
/// still waits to place are never dropped.
const KEPT: usize = 32;

/// An image a running prompt waits for: its content hash and pixels.
pub type WantedImage = (u64, Pixels);

pub struct ImageFeatures {
    encoder: VisionEncoder,
    kept: HashMap<u64, Tensor>,
    /// Hashes in the order they were encoded, to drop the oldest.
    order: VecDeque<u64>,
    /// The image part way through the tower.
    encoding: Option<(u64, TowerRun)>,
    /// How long the last chunk of each stage took (projecting, mixing),
    /// to stop before a chunk that would run past the step's deadline.
    chunk_time: [Duration; 2],
}

impl ImageFeatures {
    pub fn new(encoder: VisionEncoder) -> Self {
        ImageFeatures {
            encoder,
            kept: HashMap::new(),
            order: VecDeque::new(),
            encoding: None,
            chunk_time: [Duration::ZERO; 2],
        }
    }

    pub fn encoder(&self) -> &VisionEncoder {
        &self.encoder
    }

    /// Whether an image's features are kept, ready to place.
    pub fn has(&self, hash: u64) -> bool {
        self.kept.contains_key(&hash)
    }

    /// Encodes the `wanted` images (in the order their prompts run) that
    /// are not kept, one at a time, a chunk of `patches` of a tower stage
    /// at a time: at least one chunk,
    /// and no chunk expected (from the last of its stage) to end past
    /// `until`. An image no prompt waits for any more is dropped part way.
    /// Returns the images that failed, with why (a panic in the encoder is
    /// one).
    pub fn encode(
        &mut self,
        wanted: &[WantedImage],
        until: Instant,
        patches: usize,
        device: &Device,
    ) -> Vec<(u64, String)> {
        let mut failed: Vec<(u64, String)> = Vec::new();
        if let Some((hash, _)) = &self.encoding {
            if !wanted.iter().any(|(w, _)| w == hash) {
                self.encoding = None;
            }
        }
        let mut ran = false;
        loop {
            let (hash, mut run) = match self.encoding.take() {
                Some(current) => current,
                None => {
                    let next = wanted.iter().find(|(h, _)| {
                        !self.kept.contains_key(h) && failed.iter().all(|(f, _)| f != h)
                    });
                    let Some((hash, pixels)) = next else {
                        break;
                    };
                    let shape = (3, pixels.height, pixels.width);
                    let run = Tensor::from_slice(&pixels.values, shape, device)
                        .and_then(|p| self.encoder.begin(&p));
                    match run {
                        Ok(run) => (*hash, run),
                        Err(e) => {
                            failed.push((*hash, e.to_string()));
                            continue;
                        }
                    }
                }
            };
            let stage = usize::from(run.mixing());
            if ran && Instant::now() + self.chunk_time[stage] > until {
                self.encoding = Some((hash, run));
                break;
            }
            let begun = Instant::now();
            let step = catch_unwind(AssertUnwindSafe(|| self.encoder.advance(&mut run, patches)));
            self.chunk_time[stage] = begun.elapsed();
            ran = true;
            match step {
                Ok(Ok(Some(features))) => self.keep(hash, features, wanted),
                Ok(Ok(None)) => self.encoding = Some((hash, run)),
                Ok(Err(e)) => failed.push((hash, e.to_string())),
                Err(panic) => failed.push((
                    hash,
                    format!(
                        "the vision encoder panicked: {}",
                        panic_message(panic.as_ref())
                    ),
                )),
            }
        }
        failed
    }

    /// Puts each image's kept features in place of the rows its span has
    /// in `batch`, and where the model's image tokens see each other both
    /// ways, marks its span seen whole.
    pub fn place(&self, batch: &mut FlatBatch, images: &[StepImage]) -> Result<()> {
        let bidirectional = self.encoder.spec().bidirectional;
        for image in images {
            let Some(features) = self.kept.get(&image.hash) else {
                candle_core::bail!("an image of the step was not encoded");
            };
            let seq = &mut batch.seqs[image.seq];
            let (from, to) = (seq.first_pos, seq.first_pos + seq.len);
            let (lo, hi) = (image.span.start.max(from), image.span.end.min(to));
            if image.span.end > to || lo >= hi {
                candle_core::bail!(
                    "image tokens {:?} are not whole among the step's rows {from}..{to}",
                    image.span
                );
            }
            if bidirectional {
                seq.seen_whole.push(image.span.clone());
            }
            let row = seq.start + lo - from;
            let rows = features.narrow(0, lo - image.span.start, hi - lo)?;
            batch.embeds.push((row, rows));
        }
        Ok(())
    }

    /// Keeps an image's features, dropping the oldest past [`KEPT`] that no
    /// prompt waits for.
    fn keep(&mut self, hash: u64, features: Tensor, wanted: &[WantedImage]) {
        if self.kept.insert(hash, features).is_none() {
            self.order.push_back(hash);
        }
        while self.order.len() > KEPT {
            let idle = self
                .order
                .iter()
                .position(|h| wanted.iter().all(|(w, _)| w != h));
            let Some(old) = idle.and_then(|i| self.order.remove(i)) else {
                break;
            };
            self.kept.remove(&old);
        }
    }
}
