//! GPT-2 over a flat batch: learned position embeddings, pre-LayerNorm
//! blocks, a GELU MLP, q/k/v fused in one projection, and the LM head tied to
//! the token embeddings. K/V live in the paged pool like every model's.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::elementwise;
use super::linear::{Linear, WeightSpec};
use super::mlp::{Activation, Mlp};
use super::{hidden_states, Model, ModelInfo, Output};
use crate::attention::{paged_attention, AttnDims};
use crate::kv::cache::{KvCache, KvDtype};
use crate::kv::step_meta::StepMeta;

/// The fields of a Hugging Face GPT-2 `config.json` that wick reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    /// Longest sequence: positions past it have no embedding.
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_activation")]
    pub activation_function: String,
    #[serde(default = "yes")]
    scale_attn_weights: bool,
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_activation() -> String {
    "gelu_new".into()
}

fn yes() -> bool {
    true
}

impl Config {
    pub fn from_hf(json: &str) -> anyhow::Result<Self> {
        let c: Config = serde_json::from_str(json)?;
        c.activation()?;
        if !c.scale_attn_weights || c.scale_attn_by_inverse_layer_idx {
            anyhow::bail!(
                "GPT-2 attention scaling other than 1/sqrt(head_dim) \
                 (scale_attn_weights = false or scale_attn_by_inverse_layer_idx) is not supported"
            );
        }
        if c.n_head == 0 || !c.n_embd.is_multiple_of(c.n_head) {
            anyhow::bail!(
                "n_embd {} is not a multiple of n_head {}",
                c.n_embd,
                c.n_head
            );
        }
        Ok(c)
    }

    fn activation(&self) -> anyhow::Result<Activation> {
        match self.activation_function.as_str() {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
            "gelu" => Ok(Activation::GeluErf),
            other => anyhow::bail!(
                "GPT-2 activation_function {other:?} is not supported \
                 (gelu_new, gelu_pytorch_tanh, gelu_fast or gelu)"
            ),
        }
    }

    fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}

struct Block {
    ln_1: LayerNorm,
    /// q, k and v: `[3 * n_embd, n_embd]`.
    qkv: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    mlp: Mlp,
}

pub struct Gpt2 {
    config: Config,
    info: ModelInfo,
    device: Device,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    lm_head: Linear,
}

impl Gpt2 {
    /// From a Hugging Face checkpoint: `config.json` text and its weights.
    /// Linear layers are held in `vb`'s dtype (or as `spec` says);
    /// embeddings and norms in f32.
    pub fn from_safetensors(
        config_json: &str,
        vb: VarBuilder,
        spec: WeightSpec,
    ) -> anyhow::Result<Self> {
        let config = Config::from_hf(config_json)?;
        let activation = config.activation()?;
        // Checkpoints saved from GPT2LMHeadModel prefix every name with
        // `transformer.`; the original release does not.
        let vb = match vb.contains_tensor("transformer.wte.weight") {
            true => vb.pp("transformer"),
            false => vb,
        };
        let f32_tensor = |name: &str| vb.get_unchecked_dtype(name, DType::F32);
        let norm = |name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm {
                weight: f32_tensor(&format!("{name}.weight"))?,
                bias: f32_tensor(&format!("{name}.bias"))?,
                eps: config.layer_norm_epsilon as f32,
            })
        };
        // Conv1D stores `[in, out]`: transposed relative to a linear layer.
        let conv1d = |name: &str| -> Result<Linear> {
            let w = vb
                .get_unchecked(&format!("{name}.weight"))?
                .t()?
                .contiguous()?;
            Linear::dense(w, Some(f32_tensor(&format!("{name}.bias"))?), spec)
        };
        let blocks = (0..config.n_layer)
            .map(|i| {
                let p = format!("h.{i}");
                Ok(Block {
                    ln_1: norm(&format!("{p}.ln_1"))?,
                    qkv: conv1d(&format!("{p}.attn.c_attn"))?,
                    attn_proj: conv1d(&format!("{p}.attn.c_proj"))?,
                    ln_2: norm(&format!("{p}.ln_2"))?,
                    mlp: Mlp::new(
                        conv1d(&format!("{p}.mlp.c_fc"))?,
                        conv1d(&format!("{p}.mlp.c_proj"))?,
                        activation,
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = Linear::dense(vb.get_unchecked("wte.weight")?, None, spec)?;
        let info = ModelInfo {
            num_layers: config.n_layer,
            num_heads: config.n_head,
            num_kv_heads: config.n_head,
            head_dim: config.head_dim(),
            vocab_size: config.vocab_size,
            max_context: config.n_positions,
            kv_dtype: KvDtype::for_weights(vb.dtype()),
            window_layers: Vec::new(),
            sliding_window: None,
            window_kv: None,
        };
        Ok(Gpt2 {
            info,
            device: vb.device().clone(),
            wte: f32_tensor("wte.weight")?,
            wpe: f32_tensor("wpe.weight")?,
            blocks,
            ln_f: norm("ln_f")?,
            lm_head,
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl Model for Gpt2 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn forward_all(&self, meta: &StepMeta, cache: &mut KvCache) -> Result<Output> {
        let batch = meta.batch();
        let dims = AttnDims {
            num_heads: self.config.n_head,
            num_kv_heads: self.config.n_head,
            head_dim: self.config.head_dim(),
            block_size: cache.layout().block_size,
            window: None,
        };
        let mut x = (self.wte.index_select(&meta.tokens_t()?, 0)?
            + self.wpe.index_select(&meta.positions_t()?, 0)?)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let qkv = b.qkv.forward(&b.ln_1.forward(&x)?)?;
            let attn = paged_attention(&qkv, cache.layer_mut(i), meta, dims, None)?;
            x = elementwise::add(&x, &b.attn_proj.forward(&attn)?)?;
            x = elementwise::add(&x, &b.mlp.forward(&b.ln_2.forward(&x)?)?)?;
        }
        let hidden = hidden_states(&x, batch, &self.device, |h| self.ln_f.forward(h))?;
        if meta.num_logit_rows() == 0 {
            let logits = Tensor::zeros((0, self.config.vocab_size), DType::F32, &self.device)?;
            return Ok(Output { logits, hidden });
        }
        let logits = self.lm_head.forward(
            &self
                .ln_f
                .forward(&x.index_select(&meta.logit_rows_t()?, 0)?)?,
        )?;
        Ok(Output { logits, hidden })
    }
}
