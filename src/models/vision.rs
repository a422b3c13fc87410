//! A vision encoder beside a language model: an image's pixel values in,
//! the input vectors of its placeholder tokens out; and how the model's
//! prompts hold an image ([`ImageSpec`]), which the front end follows to
//! place those tokens. The language model itself knows nothing of images:
//! it takes the vectors as given rows ([`super::FlatBatch::embeds`]).

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;

use super::siglip::{Gemma3Projector, SiglipConfig, SiglipVision, TowerMath, TowerRun};
use crate::media::preprocess::ImageProcessor;

/// How a model's prompt holds an image.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    /// What the chat template writes where a message has an image
    /// (Gemma 3's `<start_of_image>`).
    pub marker: String,
    /// What each marker becomes before tokenizing, as the model's HF
    /// processor expands it: the run of placeholder tokens and what
    /// surrounds it.
    pub expansion: String,
    /// The placeholder token, `tokens` of them an image.
    pub token: u32,
    pub tokens: usize,
    /// An image's tokens attend to each other both ways (Gemma 3).
    pub bidirectional: bool,
    /// Turns a decoded image into the encoder's pixel values.
    pub processor: ImageProcessor,
}

/// Patches the engine takes through one stage of a layer at a time while
/// streams decode: at Gemma 3's width on two cores about 40 ms of attention
/// and MLP on AMX tiles (a sixteenth of an 896² image's patches), short
/// beside a decode step, and two of the attention kernel's work items,
/// whole tile blocks, for each of two threads. It costs about 6% of an
/// image's time against whole stages, which the engine runs when nobody
/// waits.
pub const CHUNK_PATCHES: usize = 256;

pub struct VisionEncoder {
    tower: SiglipVision,
    projector: Gemma3Projector,
    spec: ImageSpec,
}

impl VisionEncoder {
    /// Gemma 3's (`Gemma3ForConditionalGeneration`): a SigLIP tower and the
    /// average-pool projector, from the checkpoint's `config.json`, its
    /// `preprocessor_config.json` and the text of its tokens (`token_text`
    /// gives an id's), its tower's products run as `math` says.
    pub fn gemma3(
        config: &Value,
        preprocessor: &Value,
        token_text: impl Fn(u32) -> Option<String>,
        vb: &VarBuilder,
        math: TowerMath,
    ) -> Result<Self> {
        let vision: SiglipConfig = serde_json::from_value(config["vision_config"].clone())
            .context("reading vision_config")?;
        let id = |key: &str| -> Result<u32> {
            config[key]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .with_context(|| format!("config.json has no {key}"))
        };
        let text = |key: &str| -> Result<String> {
            let id = id(key)?;
            token_text(id).with_context(|| format!("{key} {id} is not in the vocabulary"))
        };
        let tokens = config["mm_tokens_per_image"].as_u64().unwrap_or(256) as usize;
        if let Some(n) = preprocessor["image_seq_length"].as_u64() {
            if n as usize != tokens {
                bail!("image_seq_length {n} disagrees with mm_tokens_per_image {tokens}");
            }
        }
        let text_hidden = config["text_config"]["hidden_size"]
            .as_u64()
            .context("text_config has no hidden_size")? as usize;
        let tower = SiglipVision::from_checkpoint(vision.clone(), vb, math)?;
        let projector =
            Gemma3Projector::new(&vision, text_hidden, tokens, vb.pp("multi_modal_projector"))?;
        let processor = ImageProcessor::from_hf(preprocessor)?;
        if (processor.width, processor.height)
            != (vision.image_size as u32, vision.image_size as u32)
        {
            bail!(
                "the image processor's size {} x {} is not the vision tower's {}",
                processor.width,
                processor.height,
                vision.image_size
            );
        }
        // transformers' Gemma3Processor: "\n\n" + begin + image tokens +
        // end + "\n\n" in place of each begin-of-image marker.
        let (begin, end) = (text("boi_token_index")?, text("eoi_token_index")?);
        let image = text("image_token_index")?;
        let spec = ImageSpec {
            expansion: format!("\n\n{begin}{}{end}\n\n", image.repeat(tokens)),
            marker: begin,
            token: id("image_token_index")?,
            tokens,
            bidirectional: true,
            processor,
        };
        Ok(VisionEncoder {
            tower,
            projector,
            spec,
        })
    }

    pub fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    /// Starts an image through the encoder: `pixels` of `[3, height,
    /// width]` as [`ImageSpec::processor`] makes them.
    pub fn begin(&self, pixels: &Tensor) -> candle_core::Result<TowerRun> {
        self.tower.begin(pixels)
    }

    /// Takes `run` through up to `patches` more patches of one stage of a
    /// tower layer; returns the image's `[tokens, text_hidden]` f32 input
    /// vectors once it is through.
    pub fn advance(
        &self,
        run: &mut TowerRun,
        patches: usize,
    ) -> candle_core::Result<Option<Tensor>> {
        match self.tower.advance(run, patches)? {
            Some(patches) => Ok(Some(
                self.projector.forward(&patches.unsqueeze(0)?)?.squeeze(0)?,
            )),
            None => Ok(None),
        }
    }
}
