//! The image side of a step: the runner's vision encoder, run over the
//! images whose tokens the step prefills, and its outputs kept by content
//! hash, so that an image sent again (a conversation's next turn whose
//! cached blocks were evicted, the same picture in another request) is
//! not encoded again.

use std::collections::{HashMap, VecDeque};

use candle_core::{Device, Result, Tensor};

use crate::engine::step_plan::StepImage;
use crate::models::vision::VisionEncoder;
use crate::models::FlatBatch;

/// Encoder outputs kept, the oldest dropped first: a Gemma 3 4B image's is
/// 256 x 2560 f32, 2.6 MB.
const KEPT: usize = 32;

pub struct ImageFeatures {
    encoder: VisionEncoder,
    kept: HashMap<u64, Tensor>,
    /// Hashes in the order they were encoded, to drop the oldest.
    order: VecDeque<u64>,
}

impl ImageFeatures {
    pub fn new(encoder: VisionEncoder) -> Self {
        ImageFeatures {
            encoder,
            kept: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn encoder(&self) -> &VisionEncoder {
        &self.encoder
    }

    /// Puts each image's features in place of the rows its span has in
    /// `batch` (the images not kept encoded in one pass), and where the
    /// model's image tokens see each other both ways, marks its span seen
    /// whole.
    pub fn place(
        &mut self,
        batch: &mut FlatBatch,
        images: &[StepImage],
        device: &Device,
    ) -> Result<()> {
        let mut missing: Vec<&StepImage> = Vec::new();
        for image in images {
            if !self.kept.contains_key(&image.hash) && missing.iter().all(|m| m.hash != image.hash)
            {
                missing.push(image);
            }
        }
        // This step's own, placed before any is kept: a step may hold more
        // images than are kept.
        let mut fresh = HashMap::new();
        if !missing.is_empty() {
            let pixels = missing
                .iter()
                .map(|m| {
                    let p = &m.pixels;
                    Tensor::from_slice(&p.values, (3, p.height, p.width), device)
                })
                .collect::<Result<Vec<_>>>()?;
            let features = self.encoder.encode(&Tensor::stack(&pixels, 0)?)?;
            for (i, m) in missing.iter().enumerate() {
                fresh.insert(m.hash, features.get(i)?);
            }
        }
        let bidirectional = self.encoder.spec().bidirectional;
        for image in images {
            let Some(features) = fresh
                .get(&image.hash)
                .or_else(|| self.kept.get(&image.hash))
            else {
                candle_core::bail!("no features for an image of the step");
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
        for (hash, features) in fresh {
            self.keep(hash, features);
        }
        Ok(())
    }

    fn keep(&mut self, hash: u64, features: Tensor) {
        if self.kept.insert(hash, features).is_none() {
            self.order.push_back(hash);
        }
        while self.order.len() > KEPT {
            if let Some(old) = self.order.pop_front() {
                self.kept.remove(&old);
            }
        }
    }
}
