//! SigLIP's vision tower, the image encoder of Gemma 3 (and SmolVLM): each
//! `patch x patch` square of the image is embedded by one strided
//! convolution plus a learned position, the patches go through pre-norm
//! transformer layers whose attention sees every patch of the image (no
//! mask, no rotary), and a last LayerNorm. The output is one vector per
//! patch, which a family's projector turns into text-width tokens.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Conv2d, Conv2dConfig, LayerNorm, VarBuilder};

use crate::attention::dense::DenseKeys;
use crate::attention::dense_bf16::Bf16Keys;
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
    /// order), in f32, each image through the tower alone.
    pub fn forward(&self, pixels: &Tensor) -> Result<Tensor> {
        let outputs = (0..pixels.dim(0)?)
            .map(|i| {
                let mut run = self.begin(&pixels.get(i)?)?;
                loop {
                    if let Some(out) = self.advance(&mut run, usize::MAX)? {
                        return Ok(out);
                    }
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::stack(&outputs, 0)
    }

    /// Starts an image through the tower: `pixels` of `[channels, size,
    /// size]`, already resized and normalized, embedded as patches.
    pub fn begin(&self, pixels: &Tensor) -> Result<TowerRun> {
        let c = &self.config;
        if pixels.dims() != [c.num_channels, c.image_size, c.image_size] {
            candle_core::bail!(
                "vision tower: an image of {:?}, not {} x {} x {}",
                pixels.dims(),
                c.num_channels,
                c.image_size,
                c.image_size
            );
        }
        let pixels = pixels.to_dtype(self.positions.dtype())?.unsqueeze(0)?;
        // [1, hidden, side, side] -> [patches, hidden].
        let x = self
            .patch
            .forward(&pixels)?
            .flatten_from(2)?
            .squeeze(0)?
            .t()?;
        Ok(TowerRun {
            x: (x + &self.positions)?,
            layer: 0,
            done: 0,
            stage: Stage::Project { parts: Vec::new() },
        })
    }

    /// Takes `run` through up to `rows` more patches of its layer's
    /// current stage (at least one); returns the tower's output,
    /// `[patches, hidden]` f32, once the last layer is done.
    pub fn advance(&self, run: &mut TowerRun, rows: usize) -> Result<Option<Tensor>> {
        let c = &self.config;
        let (heads, h) = (c.num_attention_heads, c.hidden_size);
        let head_dim = h / heads;
        let patches = run.x.dim(0)?;
        let dtype = run.x.dtype();
        // The linear layers give f32.
        let linear = |l: &Linear, t: &Tensor| l.forward(t)?.to_dtype(dtype);
        if let Some(l) = self.layers.get(run.layer) {
            let (from, len) = (run.done, rows.clamp(1, patches - run.done));
            let x = run.x.narrow(0, from, len)?;
            run.done += len;
            let last = run.done == patches;
            match &mut run.stage {
                Stage::Project { parts } => {
                    parts.push(linear(&l.qkv, &l.norm1.forward(&x)?)?);
                    if last {
                        let qkv = Tensor::cat(parts, 0)?;
                        // [patches, 3 * hidden] -> q, k, v of [heads,
                        // patches, head_dim].
                        let split = |i: usize| {
                            qkv.narrow(1, i * h, h)?
                                .reshape((patches, heads, head_dim))?
                                .transpose(0, 1)?
                                .contiguous()
                        };
                        let keys = LayerKeys::new(&split(1)?, &split(2)?, self.math)?;
                        run.stage = Stage::Mix {
                            q: split(0)?,
                            keys,
                            parts: Vec::new(),
                        };
                        run.done = 0;
                    }
                }
                Stage::Mix { q, keys, parts } => {
                    let scale = 1.0 / (head_dim as f64).sqrt();
                    let attn = keys
                        .attend(&q.narrow(1, from, len)?, scale)?
                        .transpose(0, 1)?
                        .reshape((len, h))?;
                    let x = (x + linear(&l.out, &attn)?)?;
                    let n = l.norm2.forward(&x)?;
                    parts.push((&x + linear(&l.fc2, &elementwise::gelu(&linear(&l.fc1, &n)?)?)?)?);
                    if last {
                        run.x = Tensor::cat(parts, 0)?;
                        run.stage = Stage::Project { parts: Vec::new() };
                        run.layer += 1;
                        run.done = 0;
                    }
                }
            }
        }
        match run.layer == self.layers.len() {
            true => Ok(Some(self.post_norm.forward(&run.x)?.to_dtype(DType::F32)?)),
            false => Ok(None),
        }
    }
}

/// An image part way through the tower, taken on a chunk of patches at a
/// time ([`SiglipVision::advance`]), so that an engine step can encode
/// part of an image and leave the rest to the next. Each layer runs in
/// two stages over the patches: the norm and q, k, v of every patch, then
/// (with all the layer's keys known) attention and the MLP.
pub struct TowerRun {
    /// The residual stream into the current layer, `[patches, hidden]`.
    x: Tensor,
    layer: usize,
    /// Patches through the current stage.
    done: usize,
    stage: Stage,
}

impl TowerRun {
    /// Whether its layer is past q, k and v, into attention and the MLP
    /// (whose chunks take longer).
    pub fn mixing(&self) -> bool {
        matches!(self.stage, Stage::Mix { .. })
    }
}

enum Stage {
    /// q, k and v side by side, of the patches done.
    Project { parts: Vec<Tensor> },
    /// The layer's queries (`[heads, patches, head_dim]`) and keys; the
    /// residual stream out of the layer, of the patches done.
    Mix {
        q: Tensor,
        keys: LayerKeys,
        parts: Vec<Tensor>,
    },
}

/// A layer's keys and values as its attention takes them, packed once for
/// every chunk of queries. On the host, wick's kernels (bf16 tiles where
/// the tower's math says and the CPU has them, else f32, which never forms
/// the score matrix); elsewhere candle's ops.
enum LayerKeys {
    F32(DenseKeys),
    Bf16(Bf16Keys),
    Ops { k: Tensor, v: Tensor },
}

impl LayerKeys {
    /// `k` and `v` of `[heads, patches, head_dim]`.
    fn new(k: &Tensor, v: &Tensor, math: TowerMath) -> Result<Self> {
        if !k.device().is_cpu() {
            return Ok(LayerKeys::Ops {
                k: k.clone(),
                v: v.clone(),
            });
        }
        let (k, v) = (k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?);
        if math == TowerMath::Bf16Tiles {
            if let Some(keys) = Bf16Keys::new(&k, &v)? {
                return Ok(LayerKeys::Bf16(keys));
            }
        }
        Ok(LayerKeys::F32(DenseKeys::new(&k, &v)?))
    }

    /// Every query of `q` (`[heads, queries, head_dim]`) attending to
    /// every key.
    fn attend(&self, q: &Tensor, scale: f64) -> Result<Tensor> {
        let host = |q: &Tensor| q.to_dtype(DType::F32);
        match self {
            LayerKeys::F32(keys) => keys.attend(&host(q)?, scale as f32)?.to_dtype(q.dtype()),
            LayerKeys::Bf16(keys) => keys.attend(&host(q)?, scale as f32)?.to_dtype(q.dtype()),
            LayerKeys::Ops { k, v } => {
                let scores = (q.contiguous()?.matmul(&k.t()?)? * scale)?;
                candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
                    .to_dtype(v.dtype())?
                    .matmul(v)
            }
        }
    }
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
