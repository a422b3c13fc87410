//! SigLIP's vision tower, the image encoder of Gemma 3 (and SmolVLM): each
//! `patch x patch` square of the image is embedded by one strided
//! convolution plus a learned position, the patches go through pre-norm
//! transformer layers whose attention sees every patch of the image (no
//! mask, no rotary), and a last LayerNorm. The output is one vector per
//! patch, which a family's projector turns into text-width tokens.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{Conv2d, Conv2dConfig, LayerNorm, Linear, VarBuilder};

use crate::attention::dense::dense_attention;
use crate::models::elementwise;

/// A checkpoint's `vision_config`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct SiglipConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "three")]
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
}

fn three() -> usize {
    3
}

fn eps() -> f64 {
    1e-6
}

impl SiglipConfig {
    /// Patches along each side of an image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    fn check(&self) -> Result<()> {
        let heads = self.num_attention_heads;
        if self.patch_size == 0
            || !self.image_size.is_multiple_of(self.patch_size)
            || heads == 0
            || !self.hidden_size.is_multiple_of(heads)
        {
            candle_core::bail!("vision tower: an unusable config {self:?}");
        }
        Ok(())
    }
}

struct Layer {
    norm1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

pub struct SiglipVision {
    config: SiglipConfig,
    patch: Conv2d,
    /// `[patches, hidden]`.
    positions: Tensor,
    layers: Vec<Layer>,
    post_norm: LayerNorm,
}

impl SiglipVision {
    /// A checkpoint's tower: under `vision_tower.vision_model` (as Gemma 3
    /// is published) or `vision_tower` (as transformers 5 saves it).
    pub fn from_checkpoint(config: SiglipConfig, vb: &VarBuilder) -> Result<Self> {
        let nested = vb.pp("vision_tower.vision_model");
        match nested.contains_tensor("post_layernorm.weight") {
            true => Self::new(config, nested),
            false => Self::new(config, vb.pp("vision_tower")),
        }
    }

    /// The tower at `vb`.
    pub fn new(config: SiglipConfig, vb: VarBuilder) -> Result<Self> {
        config.check()?;
        let (h, eps) = (config.hidden_size, config.layer_norm_eps);
        let norm = |vb: VarBuilder| candle_nn::layer_norm(h, eps, vb);
        let patch = candle_nn::conv2d(
            config.num_channels,
            h,
            config.patch_size,
            Conv2dConfig {
                stride: config.patch_size,
                ..Default::default()
            },
            vb.pp("embeddings.patch_embedding"),
        )?;
        let patches = config.patches_per_side().pow(2);
        let positions = vb.get((patches, h), "embeddings.position_embedding.weight")?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let vb = vb.pp(format!("encoder.layers.{i}"));
                let attn = vb.pp("self_attn");
                let mlp = vb.pp("mlp");
                Ok(Layer {
                    norm1: norm(vb.pp("layer_norm1"))?,
                    q: candle_nn::linear(h, h, attn.pp("q_proj"))?,
                    k: candle_nn::linear(h, h, attn.pp("k_proj"))?,
                    v: candle_nn::linear(h, h, attn.pp("v_proj"))?,
                    out: candle_nn::linear(h, h, attn.pp("out_proj"))?,
                    norm2: norm(vb.pp("layer_norm2"))?,
                    fc1: candle_nn::linear(h, config.intermediate_size, mlp.pp("fc1"))?,
                    fc2: candle_nn::linear(config.intermediate_size, h, mlp.pp("fc2"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let post_norm = norm(vb.pp("post_layernorm"))?;
        Ok(SiglipVision {
            config,
            patch,
            positions,
            layers,
            post_norm,
        })
    }

    pub fn config(&self) -> &SiglipConfig {
        &self.config
    }

    /// `pixels`: `[images, channels, size, size]`, already resized and
    /// normalized. Returns `[images, patches, hidden]` (patches in row
    /// order), in f32.
    pub fn forward(&self, pixels: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (images, channels, height, width) = pixels.dims4()?;
        if channels != c.num_channels || height != c.image_size || width != c.image_size {
            candle_core::bail!(
                "vision tower: images of {:?}, not {} x {} x {}",
                pixels.dims(),
                c.num_channels,
                c.image_size,
                c.image_size
            );
        }
        let pixels = pixels.to_dtype(self.positions.dtype())?;
        // [images, hidden, side, side] -> [images, patches, hidden].
        let x = self
            .patch
            .forward(&pixels)?
            .flatten_from(2)?
            .transpose(1, 2)?;
        let mut x = x.broadcast_add(&self.positions)?;
        let (heads, h) = (c.num_attention_heads, c.hidden_size);
        let head_dim = h / heads;
        let scale = 1.0 / (head_dim as f64).sqrt();
        let patches = x.dim(1)?;
        let split = |t: Tensor| -> Result<Tensor> {
            t.reshape((images, patches, heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        for l in &self.layers {
            let n = l.norm1.forward(&x)?;
            let (q, k, v) = (
                split(l.q.forward(&n)?)?,
                split(l.k.forward(&n)?)?,
                split(l.v.forward(&n)?)?,
            );
            let attn = attend(&q, &k, &v, scale)?
                .transpose(1, 2)?
                .reshape((images, patches, h))?;
            x = (x + l.out.forward(&attn)?)?;
            let n = l.norm2.forward(&x)?;
            let m = l.fc2.forward(&elementwise::gelu(&l.fc1.forward(&n)?)?)?;
            x = (x + m)?;
        }
        self.post_norm.forward(&x)?.to_dtype(DType::F32)
    }
}

/// Every patch of an image attending to every other: `q`, `k`, `v` of
/// `[images, heads, patches, head_dim]`. On the host, wick's kernel, which
/// never forms the score matrix; elsewhere candle's ops.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    if q.device().is_cpu() {
        let dims = q.dims4()?;
        let flat = |t: &Tensor| t.flatten_to(1)?.to_dtype(DType::F32);
        return dense_attention(&flat(q)?, &flat(k)?, &flat(v)?, scale as f32)?
            .reshape(dims)?
            .to_dtype(v.dtype());
    }
    let scores = (q.matmul(&k.t()?)? * scale)?;
    candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
        .to_dtype(v.dtype())?
        .matmul(v)
}

/// Gemma 3's projector from the tower's patches to image tokens: the
/// patch grid average-pooled to `tokens_per_side` squared tokens, an
/// RMSNorm scaling by `1 + w`, and a projection to the text width.
pub struct Gemma3Projector {
    /// `1 + w`, `[vision_hidden]`.
    norm: Tensor,
    eps: f64,
    /// `[vision_hidden, text_hidden]`.
    projection: Tensor,
    patches_per_side: usize,
    tokens_per_side: usize,
}

impl Gemma3Projector {
    /// The projector at `vb` (`multi_modal_projector`), for `tokens` image
    /// tokens (`mm_tokens_per_image`, a square) over `vision`'s patches.
    pub fn new(
        vision: &SiglipConfig,
        text_hidden: usize,
        tokens: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        let side = (tokens as f64).sqrt().round() as usize;
        let patches = vision.patches_per_side();
        if side == 0 || side * side != tokens || !patches.is_multiple_of(side) {
            candle_core::bail!(
                "vision projector: {tokens} tokens an image from {patches} x {patches} patches"
            );
        }
        let h = vision.hidden_size;
        let norm = (vb.get(h, "mm_soft_emb_norm.weight")? + 1.0)?;
        let projection = vb.get((h, text_hidden), "mm_input_projection_weight")?;
        Ok(Gemma3Projector {
            norm,
            eps: vision.layer_norm_eps,
            projection,
            patches_per_side: patches,
            tokens_per_side: side,
        })
    }

    /// `patches`: the tower's `[images, patches, vision_hidden]`. Returns
    /// `[images, tokens, text_hidden]` f32.
    pub fn forward(&self, patches: &Tensor) -> Result<Tensor> {
        let (images, _, h) = patches.dims3()?;
        let p = self.patches_per_side;
        let kernel = p / self.tokens_per_side;
        let grid = patches
            .to_dtype(DType::F32)?
            .transpose(1, 2)?
            .reshape((images, h, p, p))?;
        let pooled = grid.avg_pool2d(kernel)?.flatten_from(2)?.transpose(1, 2)?;
        let rms = (pooled.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?.sqrt()?;
        let normed = pooled
            .broadcast_div(&rms)?
            .broadcast_mul(&self.norm.to_dtype(DType::F32)?)?;
        normed.broadcast_matmul(&self.projection.to_dtype(DType::F32)?)
    }
}
