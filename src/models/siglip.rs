//! SigLIP's vision tower, the image encoder of Gemma 3 (and SmolVLM): each
//! `patch x patch` square of the image is embedded by one strided
//! convolution plus a learned position, the patches go through pre-norm
//! transformer layers whose attention sees every patch of the image (no
//! mask, no rotary), and a last LayerNorm. The output is one vector per
//! patch, which a family's projector turns into text-width tokens.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Conv2d, Conv2dConfig, LayerNorm, VarBuilder};

use crate::attention::dense::dense_attention;
use crate::attention::dense_bf16::dense_attention_bf16;
use crate::models::elementwise;
use crate::models::linear::{Linear, WeightFormat};
use crate::quant::bf16::tiles_available;

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

/// How the tower's matrix products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TowerMath {
    /// In the weights' dtype throughout.
    Native,
    /// The linear layers' and attention's products in bf16 with f32 sums
    /// on AMX tiles ([`crate::quant::bf16`]), everything else in f32.
    Bf16Tiles,
}

impl TowerMath {
    /// bf16 tiles for weights held in 16 bits on the host, where the CPU
    /// has them: bf16 as published (Gemma 3) loses nothing, and llama.cpp
    /// rounds an F16 file's activations to 16 bits too. `Native` otherwise.
    pub fn for_weights(dtype: DType, device: &Device) -> Self {
        match dtype {
            DType::BF16 | DType::F16 if device.is_cpu() && tiles_available() => {
                TowerMath::Bf16Tiles
            }
            _ => TowerMath::Native,
        }
    }
}

struct Layer {
    norm1: LayerNorm,
    /// q, k and v side by side.
    qkv: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

pub struct SiglipVision {
    config: SiglipConfig,
    math: TowerMath,
    patch: Conv2d,
    /// `[patches, hidden]`.
    positions: Tensor,
    layers: Vec<Layer>,
    post_norm: LayerNorm,
}

impl SiglipVision {
    /// A checkpoint's tower: under `vision_tower.vision_model` (as Gemma 3
    /// is published) or `vision_tower` (as transformers 5 saves it).
    pub fn from_checkpoint(config: SiglipConfig, vb: &VarBuilder, math: TowerMath) -> Result<Self> {
        let nested = vb.pp("vision_tower.vision_model");
        match nested.contains_tensor("post_layernorm.weight") {
            true => Self::new(config, nested, math),
            false => Self::new(config, vb.pp("vision_tower"), math),
        }
    }

    /// The tower at `vb`.
    pub fn new(config: SiglipConfig, vb: VarBuilder, math: TowerMath) -> Result<Self> {
        config.check()?;
        let vb = match math {
            TowerMath::Native => vb,
            TowerMath::Bf16Tiles => vb.set_dtype(DType::F32),
        };
        // `[out, in]` and `[out]` of each of `names`, side by side.
        let linear = |vb: &VarBuilder, names: &[&str], n_in: usize, n_out: usize| {
            let (w, b): (Vec<Tensor>, Vec<Tensor>) = names
                .iter()
                .map(|name| {
                    let vb = vb.pp(name);
                    Ok((vb.get((n_out, n_in), "weight")?, vb.get(n_out, "bias")?))
                })
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .unzip();
            let (w, b) = (Tensor::cat(&w, 0)?, Tensor::cat(&b, 0)?);
            match math {
                TowerMath::Native => Linear::dense(w, Some(b), WeightFormat::Native.into()),
                TowerMath::Bf16Tiles => Linear::bf16_tiles(&w, b),
            }
        };
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
                let wide = config.intermediate_size;
                Ok(Layer {
                    norm1: norm(vb.pp("layer_norm1"))?,
                    qkv: linear(&attn, &["q_proj", "k_proj", "v_proj"], h, h)?,
                    out: linear(&attn, &["out_proj"], h, h)?,
                    norm2: norm(vb.pp("layer_norm2"))?,
                    fc1: linear(&mlp, &["fc1"], h, wide)?,
                    fc2: linear(&mlp, &["fc2"], wide, h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let post_norm = norm(vb.pp("post_layernorm"))?;
        Ok(SiglipVision {
            config,
            math,
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
        // The linear layers take rows, [images * patches, width], and give
        // f32.
        let dtype = x.dtype();
        let linear = |l: &Linear, t: &Tensor| -> Result<Tensor> {
            l.forward(&t.reshape((images * patches, ()))?)?
                .to_dtype(dtype)?
                .reshape((images, patches, ()))
        };
        let split = |qkv: &Tensor, i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * h, h)?
                .reshape((images, patches, heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        for l in &self.layers {
            let n = l.norm1.forward(&x)?;
            let qkv = linear(&l.qkv, &n)?;
            let (q, k, v) = (split(&qkv, 0)?, split(&qkv, 1)?, split(&qkv, 2)?);
            let attn = attend(&q, &k, &v, scale, self.math)?
                .transpose(1, 2)?
                .reshape((images, patches, h))?;
            x = (x + linear(&l.out, &attn)?)?;
            let n = l.norm2.forward(&x)?;
            x = (x + linear(&l.fc2, &elementwise::gelu(&linear(&l.fc1, &n)?)?)?)?;
        }
        self.post_norm.forward(&x)?.to_dtype(DType::F32)
    }
}

/// Every patch of an image attending to every other: `q`, `k`, `v` of
/// `[images, heads, patches, head_dim]`. On the host, wick's kernels (bf16
/// tiles where `math` says, else f32, which never forms the score
/// matrix); elsewhere candle's ops.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, math: TowerMath) -> Result<Tensor> {
    if q.device().is_cpu() {
        let dims = q.dims4()?;
        let flat = |t: &Tensor| t.flatten_to(1)?.to_dtype(DType::F32);
        let (q, k, v_flat) = (flat(q)?, flat(k)?, flat(v)?);
        let tiles = match math {
            TowerMath::Bf16Tiles => dense_attention_bf16(&q, &k, &v_flat, scale as f32)?,
            TowerMath::Native => None,
        };
        let out = match tiles {
            Some(out) => out,
            None => dense_attention(&q, &k, &v_flat, scale as f32)?,
        };
        return out.reshape(dims)?.to_dtype(v.dtype());
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
