//! Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU)
//! over a flat batch, with K/V in the paged pool. Llama 2 and 3.x, Mistral,
//! TinyLlama, Qwen2/2.5 (q/k/v biases, half-split RoPE), Qwen3 (per-head
//! q/k norms), SmolLM3 (layers without RoPE) and Phi-3/Phi-4-mini (fused
//! matrices, partial rotary, LongRoPE) are this one forward with different
//! settings. So are the mixtures of experts built on those layers: Mixtral
//! (Mistral's), Qwen2-MoE (Qwen2's, with a shared expert), Qwen3-MoE
//! (Qwen3's) and OLMoE (q/k norms over whole projections), whose blocks
//! take a [`Moe`] feed-forward in place of the MLP. So is gpt-oss: biased
//! projections, attention sinks, sliding-window attention on every other
//! layer, YaRN, and experts with biases and a clamped SwiGLU.

use std::io::{Read, Seek};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, QTensor};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::elementwise::{self, Act};
use super::embedding::Embedding;
use super::ffn::Ffn;
use super::linear::{Linear, WeightSpec};
use super::mlp::{Activation, Mlp};
use super::moe::{ExpertLoad, GgufLayer, Moe, MoeConfig, Routing};
use super::rope::Rope;
use super::{gguf_architecture, hidden_states, read_tensor, Gguf, Model, ModelInfo, Output};
use crate::attention::{paged_attention, AttnDims};
use crate::kv::cache::{KvCache, KvDtype};
use crate::kv::step_meta::StepMeta;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    /// Llama 3.1's per-frequency divisors (GGUF `rope_freqs.weight`).
    pub rope_freq_factors: Option<Vec<f32>>,
    /// RoPE rotates adjacent pairs (GGUF: llama.cpp's converter permutes the
    /// q/k rows for it) rather than the two halves of each head (HF).
    pub rope_interleaved: bool,
    /// Layers that skip RoPE (SmolLM3's every fourth); empty when all
    /// rotate.
    pub no_rope_layers: Vec<usize>,
    /// Leading dimensions of each head that RoPE rotates: `head_dim`, or
    /// less where only part rotates (Phi-4-mini's three quarters).
    pub rope_dim: usize,
    /// Phi-3's LongRoPE frequency divisors.
    pub long_rope: Option<LongRope>,
    /// The gate's activation: SiLU, or Gemma's tanh GELU.
    pub act: Act,
    /// Embeddings are multiplied by this: Gemma's √hidden, Granite's
    /// `embedding_multiplier`.
    pub embed_scale: Option<f32>,
    /// A checkpoint's RMSNorms scale by `offset + w`: Gemma's 1 (llama.cpp's
    /// converter adds it into a GGUF's weights), else 0.
    pub norm_offset: f32,
    /// Gemma 3's and gpt-oss's local layers: each token attends to at
    /// most this many positions (itself included), with unscaled RoPE at
    /// `local_rope_theta` where set (Gemma's), else the global layers'.
    pub sliding_window: Option<usize>,
    pub local_layers: Vec<usize>,
    pub local_rope_theta: Option<f32>,
    /// Gemma's `tanh(logits / cap) * cap`, where set.
    pub final_logit_softcap: Option<f32>,
    /// The attention's scale where it is not `head_dim^-1/2`: Gemma's
    /// `query_pre_attn_scalar^-1/2`, Granite's `attention_multiplier`.
    pub attn_scale: Option<f32>,
    /// Granite's: each block's output is multiplied by this before it
    /// joins the residual stream.
    pub residual_scale: Option<f32>,
    /// Granite's: logits are divided by this.
    pub logit_scale: Option<f32>,
    pub max_context: usize,
    pub vocab_size: usize,
    /// A mixture of experts' routing, where the family has one.
    pub moe: Option<MoeConfig>,
    /// Ministral 3's (Llama 4's) query temperature, where set.
    pub attn_temperature: Option<AttnTemperature>,
}

/// Llama 4's attention temperature, as Ministral 3 uses it: past `floor`
/// positions each query is scaled by `1 + beta * ln(1 + ⌊pos / floor⌋)`,
/// which sharpens attention over long contexts. Below `floor` the scale is
/// exactly 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemperature {
    pub beta: f32,
    pub floor: usize,
}

impl AttnTemperature {
    fn scale(&self, pos: u32) -> f32 {
        1.0 + self.beta * (1.0 + (pos as usize / self.floor) as f32).ln()
    }
}

/// Each row's factor on its queries, from a constant factor (an attention
/// scale not folded into weights) and the temperature at its position;
/// `None` where every factor is 1.
fn query_scales(
    constant: Option<f32>,
    temperature: Option<&AttnTemperature>,
    positions: &[u32],
    device: &Device,
) -> Result<Option<Tensor>> {
    let hot = temperature.filter(|t| positions.iter().any(|&p| p as usize >= t.floor));
    if constant.is_none() && hot.is_none() {
        return Ok(None);
    }
    let scales: Vec<f32> = positions
        .iter()
        .map(|&p| constant.unwrap_or(1.0) * hot.map_or(1.0, |t| t.scale(p)))
        .collect();
    Tensor::from_vec(scales, (positions.len(), 1), device).map(Some)
}

/// Scales the first `width` columns (the query heads) of stacked `[T, _]`
/// rows, row `t` by `scales[t]`.
fn scale_queries(qkv: &Tensor, scales: &Tensor, width: usize) -> Result<Tensor> {
    let q = qkv
        .narrow(1, 0, width)?
        .broadcast_mul(&scales.to_dtype(qkv.dtype())?)?;
    let rest = qkv.dim(1)? - width;
    Tensor::cat(&[q, qkv.narrow(1, width, rest)?], 1)
}

/// LongRoPE (Phi-3.5, Phi-4-mini): per-frequency divisors tuned for
/// contexts up to the pretrained length and for longer ones, and a scale on
/// cos and sin. As llama.cpp does, the served context picks one set for
/// every position (transformers picks per forward by the sequence's length,
/// which would make a sequence's keys depend on how it was batched).
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    pub short_factor: Vec<f32>,
    pub long_factor: Vec<f32>,
    pub original_context: usize,
    pub attn_factor: f32,
}

impl LongRope {
    /// The divisors for a served context of `context` tokens.
    fn factors(&self, context: usize) -> &[f32] {
        match context > self.original_context {
            true => &self.long_factor,
            false => &self.short_factor,
        }
    }
}

/// The `rope_scaling` kinds wick supports, as `config.json` spells them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// YaRN: low frequencies interpolated by `factor`, high ones kept, a
    /// ramp between; cos and sin scaled. Resolved from its parameters by
    /// [`Yarn::from_hf`] or from a GGUF's keys.
    #[serde(skip_deserializing)]
    Yarn(Yarn),
}

/// YaRN's settings, resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_context: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The scale on cos and sin.
    pub attn_factor: f32,
    /// Round the ramp's ends outwards to whole dimensions (transformers'
    /// default, and llama.cpp's only way).
    pub truncate: bool,
}

impl Yarn {
    /// `0.1 * mscale * ln(factor) + 1`, YaRN's magnitude correction.
    fn mscale(factor: f32, mscale: f32) -> f32 {
        match factor <= 1.0 {
            true => 1.0,
            false => 0.1 * mscale * factor.ln() + 1.0,
        }
    }

    /// From `rope_scaling` / `rope_parameters` of type "yarn", as
    /// transformers resolves them: the factor from the ratio of contexts
    /// if not given, the attention factor from `mscale` and
    /// `mscale_all_dim` where both are set.
    fn from_hf(v: serde_json::Value, max_position_embeddings: usize) -> anyhow::Result<Self> {
        #[derive(Deserialize)]
        struct Params {
            factor: Option<f32>,
            original_max_position_embeddings: Option<usize>,
            beta_fast: Option<f32>,
            beta_slow: Option<f32>,
            attention_factor: Option<f32>,
            mscale: Option<f32>,
            mscale_all_dim: Option<f32>,
            truncate: Option<bool>,
        }
        let p: Params = serde_json::from_value(v)
            .map_err(|e| anyhow::anyhow!("rope_scaling of type \"yarn\": {e}"))?;
        let original = p
            .original_max_position_embeddings
            .unwrap_or(max_position_embeddings);
        let factor = p
            .factor
            .unwrap_or(max_position_embeddings as f32 / original as f32);
        let attn_factor = match (p.attention_factor, p.mscale, p.mscale_all_dim) {
            (Some(a), _, _) => a,
            (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                Self::mscale(factor, m) / Self::mscale(factor, all)
            }
            _ => Self::mscale(factor, 1.0),
        };
        Ok(Yarn {
            factor,
            original_context: original,
            beta_fast: p.beta_fast.filter(|&b| b != 0.0).unwrap_or(32.0),
            beta_slow: p.beta_slow.filter(|&b| b != 0.0).unwrap_or(1.0),
            attn_factor,
            truncate: p.truncate.unwrap_or(true),
        })
    }

    /// Scaled inverse frequencies from the plain ones (`base`, for a
    /// rotary size `dim` at base `theta`).
    fn inv_freq(&self, base: impl Iterator<Item = f32>, dim: usize, theta: f32) -> Vec<f32> {
        // The pair index at which a frequency makes `turns` rotations over
        // the original context.
        let pair = |turns: f32| {
            let orig = self.original_context as f64;
            dim as f64 * (orig / (turns as f64 * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * (theta as f64).ln())
        };
        let (mut low, mut high) = (pair(self.beta_fast), pair(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, high) = (low.max(0.0) as f32, high.min(dim as f64 - 1.0) as f32);
        let span = match low == high {
            true => 0.001,
            false => high - low,
        };
        base.enumerate()
            .map(|(i, f)| {
                // 0 keeps the frequency, 1 interpolates it.
                let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                f / self.factor * ramp + f * (1.0 - ramp)
            })
            .collect()
    }
}

/// The fields of a Hugging Face Llama `config.json` that wick reads.
#[derive(Deserialize)]
struct HfConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    rope_scaling: Option<serde_json::Value>,
    /// transformers 5 writes `rope_theta` and the scaling here instead.
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: usize,
    /// Mistral's: each token attends to at most this many before it.
    sliding_window: Option<usize>,
    /// Qwen's: whether `sliding_window` applies at all.
    use_sliding_window: Option<bool>,
    /// gpt-oss's SwiGLU clamp, which wick fixes at its release's 7.
    swiglu_limit: Option<f32>,
    /// SmolLM3's: per layer, 1 where it applies RoPE, 0 where not.
    no_rope_layers: Option<Vec<u8>>,
    /// Phi-4-mini's: the fraction of each head that RoPE rotates.
    partial_rotary_factor: Option<f32>,
    /// Phi-3's pretrained context, which LongRoPE scales from.
    original_max_position_embeddings: Option<usize>,
    /// Gemma 3's: which layers attend within `sliding_window`, by name
    /// (transformers 5) or as every layer but each `sliding_window_pattern`th.
    layer_types: Option<Vec<String>>,
    #[serde(alias = "_sliding_window_pattern")]
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f32>,
    /// Gemma's attention scale is this to the -1/2, not the head size's.
    query_pre_attn_scalar: Option<f32>,
    /// Granite's multipliers.
    embedding_multiplier: Option<f32>,
    attention_multiplier: Option<f32>,
    residual_multiplier: Option<f32>,
    logits_scaling: Option<f32>,
    final_logit_softcapping: Option<f32>,
    attn_logit_softcapping: Option<f32>,
    /// Gemma's name for `hidden_act`.
    hidden_activation: Option<String>,
    #[serde(default)]
    model_type: String,
    vocab_size: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    hidden_act: Option<String>,
    /// Experts: Qwen-MoE's and OLMoE's name, and Mixtral's.
    #[serde(alias = "num_local_experts")]
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    /// OLMoE's clamp on q/k/v, which wick does not implement.
    clip_qkv: Option<f64>,
}

fn default_rope_theta() -> f32 {
    10_000.0
}

/// The GGUF architectures (`general.architecture`) that
/// [`super::registry`] gives this forward, each read with its own
/// settings. Mistral and TinyLlama files say `llama`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GgufArch {
    Llama,
    /// Qwen2 and Qwen2.5: q/k/v biases, RoPE on the halves of each head.
    Qwen2,
    /// Qwen3: no biases, an RMSNorm over each query and key head before
    /// RoPE on the halves of each head.
    Qwen3,
    /// SmolLM3: Llama's layers, every fourth without RoPE.
    SmolLm3,
    /// Phi-3.x and Phi-4-mini: fused q/k/v and gate/up matrices, RoPE on
    /// halves (of part of each head, for Phi-4-mini), LongRoPE factors.
    Phi3,
    /// Gemma 3: scaled embeddings, q/k norms, norms after attention and
    /// MLP too, GeGLU, and local sliding-window layers between global ones.
    Gemma3,
    /// Qwen2-MoE: Qwen2's attention, experts with a gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3's attention, experts whose weights are
    /// renormalized.
    Qwen3Moe,
    /// OLMoE: RMSNorms over the whole query and key projections, RoPE on
    /// halves, experts.
    Olmoe,
    /// Mistral 3 (Ministral 3, Mistral Small 3.x, Devstral): Llama's
    /// layers, YaRN and a query temperature where the file sets them.
    Mistral3,
    /// Granite 3.x: Llama's layers with four multipliers (embeddings,
    /// attention scale, residual, logits).
    Granite,
    /// Granite-MoE: Granite's with experts (and an ungated shared expert
    /// where the file has one).
    GraniteMoe,
    /// gpt-oss: biases, sinks, every other layer sliding-window, YaRN,
    /// experts with biases and a clamped SwiGLU.
    GptOss,
}

impl GgufArch {
    const ALL: [GgufArch; 13] = [
        GgufArch::Llama,
        GgufArch::Qwen2,
        GgufArch::Qwen3,
        GgufArch::SmolLm3,
        GgufArch::Phi3,
        GgufArch::Gemma3,
        GgufArch::Qwen2Moe,
        GgufArch::Qwen3Moe,
        GgufArch::Olmoe,
        GgufArch::Mistral3,
        GgufArch::Granite,
        GgufArch::GraniteMoe,
        GgufArch::GptOss,
    ];

    /// The file's architecture, or an error for one this forward does not
    /// run.
    fn of(content: &gguf_file::Content) -> anyhow::Result<Self> {
        let arch = gguf_architecture(content);
        Self::ALL
            .into_iter()
            .find(|a| a.key_prefix() == arch)
            .ok_or_else(|| anyhow::anyhow!("GGUF architecture {arch:?} is not a Llama-family one"))
    }

    /// Its `general.architecture`, which prefixes its metadata keys.
    fn key_prefix(self) -> &'static str {
        match self {
            GgufArch::Llama => "llama",
            GgufArch::Qwen2 => "qwen2",
            GgufArch::Qwen3 => "qwen3",
            GgufArch::SmolLm3 => "smollm3",
            GgufArch::Phi3 => "phi3",
            GgufArch::Gemma3 => "gemma3",
            GgufArch::Qwen2Moe => "qwen2moe",
            GgufArch::Qwen3Moe => "qwen3moe",
            GgufArch::Olmoe => "olmoe",
            GgufArch::Mistral3 => "mistral3",
            GgufArch::Granite => "granite",
            GgufArch::GraniteMoe => "granitemoe",
            GgufArch::GptOss => "gpt-oss",
        }
    }

    /// Whether the top k experts' weights are renormalized to sum to 1, as
    /// llama.cpp fixes it per architecture (Mixtral's files say `llama`).
    fn renormalizes_experts(self) -> bool {
        matches!(
            self,
            GgufArch::Llama
                | GgufArch::Qwen3Moe
                | GgufArch::Mistral3
                | GgufArch::GraniteMoe
                | GgufArch::GptOss
        )
    }
}

impl Config {
    pub fn from_gguf(content: &gguf_file::Content) -> anyhow::Result<Self> {
        let arch = GgufArch::of(content)?;
        let prefix = arch.key_prefix();
        let md = |key: &str| {
            content
                .metadata
                .get(&format!("{prefix}.{key}"))
                .ok_or_else(|| anyhow::anyhow!("GGUF lacks {prefix}.{key}"))
        };
        let hidden_size = md("embedding_length")?.to_u32()? as usize;
        let num_heads = md("attention.head_count")?.to_u32()? as usize;
        let rope_dims = md("rope.dimension_count").and_then(|v| Ok(v.to_u32()? as usize));
        // Phi-4-mini rotates part of each head, so its rotary size is not
        // its head size; older Llama files give the head size only there.
        let head_dim = match (md("attention.key_length"), &rope_dims, arch) {
            (Ok(v), _, _) => v.to_u32()? as usize,
            (Err(_), Ok(d), a) if a != GgufArch::Phi3 => *d,
            _ => hidden_size / num_heads,
        };
        let rope_dim = rope_dims.unwrap_or(head_dim);
        let md_f32 = |key: &str| md(key).ok().map(|v| v.to_f32()).transpose();
        let md_usize = |key: &str| md(key).ok().map(|v| v.to_u32()).transpose();
        let context_length = md("context_length")?.to_u32()? as usize;
        // YaRN's and the query temperature's pretrained context.
        let original_context = md_usize("rope.scaling.original_context_length")?
            .map_or(context_length, |n| n as usize);
        let rope_scaling = match md("rope.scaling.type").and_then(|v| Ok(v.to_string()?.clone())) {
            Err(_) => None,
            Ok(kind) if kind == "none" => None,
            Ok(kind) if kind == "linear" => Some(RopeScaling::Linear {
                factor: md("rope.scaling.factor")?.to_f32()?,
            }),
            Ok(kind) if kind == "yarn" => {
                let factor = md("rope.scaling.factor")?.to_f32()?;
                // As llama.cpp: the log multiplier is `mscale_all_dim`,
                // `mscale` is taken to be 1, and a stored attention factor
                // multiplies the result.
                let attn_factor = match md_f32("rope.scaling.yarn_log_multiplier")? {
                    Some(all) if all != 0.0 => {
                        Yarn::mscale(factor, 1.0) / Yarn::mscale(factor, all)
                    }
                    _ => Yarn::mscale(factor, 1.0),
                } * md_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
                Some(RopeScaling::Yarn(Yarn {
                    factor,
                    original_context,
                    beta_fast: md_f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                    beta_slow: md_f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                    attn_factor,
                    // The file has no key for it: llama.cpp always rounds,
                    // gpt-oss's reference (transformers, OpenAI's) does not.
                    truncate: arch != GgufArch::GptOss,
                }))
            }
            Ok(kind) => anyhow::bail!(
                "{prefix}.rope.scaling.type {kind:?} is not supported; wick supports \"linear\" \
                 and \"yarn\" (and Llama 3.1's rope_freqs)"
            ),
        };
        let attn_temperature = md_f32("attention.temperature_scale")?
            .filter(|&beta| beta != 0.0)
            .map(|beta| AttnTemperature {
                beta,
                floor: original_context,
            });
        let num_layers = md("block_count")?.to_u32()? as usize;
        // llama.cpp fixes SmolLM3's step at 4 rather than store it.
        let no_rope_layers = match arch {
            GgufArch::SmolLm3 => (3..num_layers).step_by(4).collect(),
            _ => Vec::new(),
        };
        let vocab_size = match md("vocab_size") {
            Ok(v) => v.to_u32()? as usize,
            Err(_) => content.tensor_infos["token_embd.weight"].shape.dims()[0],
        };
        let gemma = arch == GgufArch::Gemma3;
        let gpt_oss = arch == GgufArch::GptOss;
        let sliding_window = match md("attention.sliding_window") {
            Ok(w) if (gemma || gpt_oss) && w.to_u32()? > 0 => Some(w.to_u32()? as usize),
            _ => None,
        };
        // llama.cpp's rule: a list of flags, or a period whose last layer
        // is global (6 unless the file says; gpt-oss's 2).
        let local_layers = match (sliding_window, md("attention.sliding_window_pattern")) {
            (None, _) => Vec::new(),
            (Some(_), Ok(gguf_file::Value::Array(flags))) => (0..num_layers)
                .filter(|&i| flags.get(i).is_some_and(|f| f.to_bool().unwrap_or(false)))
                .collect(),
            (Some(_), period) => {
                let default = if gpt_oss { 2 } else { 6 };
                let n = period.map_or(Ok(default), |p| p.to_u32())? as usize;
                (0..num_layers).filter(|i| i % n < n - 1).collect()
            }
        };
        let moe = match md_usize("expert_count")? {
            None | Some(0) => None,
            Some(experts) => Some(MoeConfig {
                experts: experts as usize,
                routing: Routing {
                    top_k: md("expert_used_count")?.to_u32()? as usize,
                    renormalize: arch.renormalizes_experts(),
                },
                dense_layers: Vec::new(),
            }),
        };
        Ok(Config {
            hidden_size,
            // Qwen2-MoE's files give only the experts' width.
            intermediate_size: md_usize("feed_forward_length")?.unwrap_or(0) as usize,
            num_layers,
            num_heads,
            num_kv_heads: md("attention.head_count_kv")?.to_u32()? as usize,
            head_dim,
            rms_norm_eps: md("attention.layer_norm_rms_epsilon")?.to_f32()? as f64,
            rope_theta: md("rope.freq_base")
                .and_then(|v| Ok(v.to_f32()?))
                .unwrap_or(10_000.0),
            rope_scaling,
            rope_freq_factors: None,
            // Phi-3's factors are tensors, which `Llama::from_gguf` reads.
            long_rope: None,
            rope_dim,
            // llama.cpp's converter permutes Llama's (SmolLM3's, Mistral 3's,
            // Granite's) q/k
            // rows for pairwise RoPE; Qwen's and OLMoE's stay in HF order
            // (NEOX-style halves).
            rope_interleaved: matches!(
                arch,
                GgufArch::Llama
                    | GgufArch::SmolLm3
                    | GgufArch::Mistral3
                    | GgufArch::Granite
                    | GgufArch::GraniteMoe
            ),
            no_rope_layers,
            max_context: context_length,
            vocab_size,
            act: match arch {
                GgufArch::Gemma3 => Act::GeluTanh,
                GgufArch::GptOss => Act::SwigluOai,
                _ => Act::Silu,
            },
            embed_scale: match gemma {
                true => Some((hidden_size as f32).sqrt()),
                false => md_f32("embedding_scale")?,
            },
            norm_offset: 0.0,
            sliding_window,
            local_layers,
            local_rope_theta: match gemma {
                true => Some(md_f32("rope.freq_base_swa")?.unwrap_or(10_000.0)),
                false => md_f32("rope.freq_base_swa")?,
            },
            final_logit_softcap: md_f32("final_logit_softcapping")?,
            // As llama.cpp: Gemma 3 27B (62 layers) scales by hidden / heads.
            attn_scale: match gemma && num_layers == 62 {
                true => Some(((hidden_size / num_heads) as f32).powf(-0.5)),
                false => md_f32("attention.scale")?.filter(|&s| s != 0.0),
            },
            residual_scale: md_f32("residual_scale")?.filter(|&s| s != 0.0),
            logit_scale: md_f32("logit_scale")?.filter(|&s| s != 0.0),
            moe,
            attn_temperature,
        })
    }

    /// From a Hugging Face `config.json`; also says whether the LM head is
    /// tied to the embeddings.
    /// A multimodal checkpoint's (Mistral 3's) `text_config` describes the
    /// language model, and its top level whether the head is tied.
    pub fn from_hf(json: &str) -> anyhow::Result<(Self, bool)> {
        let mut v: serde_json::Value = serde_json::from_str(json)?;
        let wrapper_tied = v.get("tie_word_embeddings").and_then(|t| t.as_bool());
        if let Some(text) = v.get_mut("text_config").map(serde_json::Value::take) {
            v = text;
        }
        let c: HfConfig = serde_json::from_value(v)?;
        let tied = wrapper_tied.unwrap_or(c.tie_word_embeddings);
        let gemma = c.model_type == "gemma3_text";
        let gpt_oss = c.model_type == "gpt_oss";
        if let Some(limit) = c.swiglu_limit.filter(|&l| l != elementwise::SWIGLU_LIMIT) {
            anyhow::bail!("swiglu_limit {limit} is not supported (only gpt-oss's 7)");
        }
        // Layers that attend within `sliding_window`, by `layer_types`.
        let windowed = gemma || gpt_oss;
        let act = match c.hidden_activation.as_deref().or(c.hidden_act.as_deref()) {
            _ if gpt_oss => Act::SwigluOai,
            None | Some("silu") => Act::Silu,
            Some("gelu_pytorch_tanh") => Act::GeluTanh,
            Some(act) => anyhow::bail!(
                "hidden activation {act:?} is not supported (only \"silu\" and \"gelu_pytorch_tanh\")"
            ),
        };
        if let Some(cap) = c.attn_logit_softcapping {
            anyhow::bail!("attn_logit_softcapping ({cap}) is not supported");
        }
        if let Some(clip) = c.clip_qkv {
            anyhow::bail!("clip_qkv ({clip}) is not supported");
        }
        let moe = match c.num_experts.filter(|&n| n > 0) {
            None => None,
            Some(experts) => {
                let step = c.decoder_sparse_step.unwrap_or(1).max(1);
                let only = c.mlp_only_layers.clone().unwrap_or_default();
                Some(MoeConfig {
                    experts,
                    routing: Routing {
                        top_k: c.num_experts_per_tok.unwrap_or(2),
                        // Mixtral and Granite-MoE always renormalize (Granite
                        // takes a softmax over the top k logits, the same);
                        // the others say.
                        renormalize: matches!(
                            c.model_type.as_str(),
                            "mixtral" | "granitemoe" | "gpt_oss"
                        ) || c.norm_topk_prob.unwrap_or(false),
                    },
                    dense_layers: (0..c.num_hidden_layers)
                        .filter(|i| only.contains(i) || (i + 1) % step != 0)
                        .collect(),
                })
            }
        };
        let (mut rope_theta, mut partial) = (c.rope_theta, c.partial_rotary_factor.unwrap_or(1.0));
        let mut params = c.rope_parameters.clone().or(c.rope_scaling.clone());
        // Gemma 3 under transformers 5: one set per layer type.
        let mut local_theta = match gemma {
            true => Some(c.rope_local_base_freq.unwrap_or(10_000.0)),
            false => None,
        };
        if let Some(obj) = params.as_mut().and_then(|p| p.as_object_mut()) {
            if let Some(mut local) = obj.remove("sliding_attention") {
                if let Some(t) = local.get("rope_theta").and_then(|t| t.as_f64()) {
                    local_theta = Some(t as f32);
                }
                if let Some(o) = local.as_object_mut() {
                    o.remove("rope_theta");
                }
                anyhow::ensure!(
                    parse_rope_scaling(local.clone(), c.max_position_embeddings)?.is_none(),
                    "RoPE scaling on sliding-window layers is not supported ({local})"
                );
            }
            if let Some(global) = obj.remove("full_attention") {
                params = Some(global);
            }
        }
        // transformers 5 keeps the base and the rotary fraction in there
        // too, and Ministral 3 its query temperature.
        let mut attn_temperature = None;
        if let Some(obj) = params.as_mut().and_then(|p| p.as_object_mut()) {
            if let Some(beta) = obj.remove("llama_4_scaling_beta").and_then(|b| b.as_f64()) {
                let floor =
                    obj.get("original_max_position_embeddings")
                        .and_then(|o| o.as_u64())
                        .unwrap_or(c.max_position_embeddings as u64) as usize;
                anyhow::ensure!(floor > 0, "llama_4_scaling_beta needs an original context");
                attn_temperature = Some(AttnTemperature {
                    beta: beta as f32,
                    floor,
                });
            }
            if let Some(theta) = obj.remove("rope_theta").and_then(|t| t.as_f64()) {
                rope_theta = theta as f32;
            }
            if let Some(f) = obj.remove("partial_rotary_factor").and_then(|f| f.as_f64()) {
                partial = f as f32;
            }
        }
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads);
        let rope_dim = (head_dim as f32 * partial) as usize;
        let (rope_scaling, long_rope) = match params {
            Some(v) if matches!(rope_kind(&v).as_str(), "longrope" | "su") => {
                (None, Some(long_rope(v, &c, rope_dim)?))
            }
            Some(v) => (parse_rope_scaling(v, c.max_position_embeddings)?, None),
            None => (None, None),
        };
        let config = Config {
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
            head_dim,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta,
            rope_scaling,
            rope_freq_factors: None,
            long_rope,
            rope_dim,
            rope_interleaved: false,
            no_rope_layers: c
                .no_rope_layers
                .iter()
                .flatten()
                .enumerate()
                .filter(|&(_, &rope)| rope == 0)
                .map(|(i, _)| i)
                .collect(),
            // Mistral's and Qwen's window applies to every layer: within
            // it, sliding-window attention is full attention, so the
            // context stops there rather than attend wrongly past it.
            // Gemma's local layers attend within theirs.
            max_context: match (windowed, c.sliding_window, c.use_sliding_window) {
                (false, Some(w), None | Some(true)) => w.min(c.max_position_embeddings),
                _ => c.max_position_embeddings,
            },
            vocab_size: c.vocab_size,
            act,
            embed_scale: match gemma {
                true => Some((c.hidden_size as f32).sqrt()),
                false => c.embedding_multiplier,
            },
            norm_offset: match gemma {
                true => 1.0,
                false => 0.0,
            },
            sliding_window: c.sliding_window.filter(|_| windowed),
            local_layers: match (windowed, &c.layer_types, c.sliding_window_pattern) {
                (false, _, _) => Vec::new(),
                (true, Some(types), _) => (0..c.num_hidden_layers)
                    .filter(|&i| types.get(i).is_some_and(|t| t == "sliding_attention"))
                    .collect(),
                (true, None, period) => {
                    let n = period.unwrap_or(6).max(1);
                    (0..c.num_hidden_layers).filter(|i| i % n < n - 1).collect()
                }
            },
            local_rope_theta: local_theta,
            final_logit_softcap: c.final_logit_softcapping,
            attn_scale: c
                .query_pre_attn_scalar
                .map(|s| s.powf(-0.5))
                .or(c.attention_multiplier),
            residual_scale: c.residual_multiplier,
            logit_scale: c.logits_scaling,
            moe,
            attn_temperature,
        };
        Ok((config, tied))
    }

    /// Caps the context at what the server will serve (`--max-model-len`),
    /// which also picks Phi-3's LongRoPE factors.
    pub fn serve_context(&mut self, context: Option<usize>) {
        if let Some(n) = context.filter(|&n| n > 0) {
            self.max_context = self.max_context.min(n);
        }
    }

    /// The scale on RoPE's cos and sin: LongRoPE's or YaRN's attention
    /// factor, or 1.
    fn rope_scale(&self) -> f32 {
        match (&self.long_rope, &self.rope_scaling) {
            (Some(l), _) => l.attn_factor,
            (None, Some(RopeScaling::Yarn(y))) => y.attn_factor,
            _ => 1.0,
        }
    }

    /// The local layers' own RoPE, unscaled at `theta`.
    fn local_inv_freq(&self, theta: f32) -> Vec<f32> {
        let dim = self.rope_dim as f32;
        (0..self.rope_dim / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f32 / dim))
            .collect()
    }

    /// RoPE inverse frequencies, one per pair of rotated head dimensions.
    fn inv_freq(&self) -> Vec<f32> {
        let dim = self.rope_dim as f32;
        let factors = match &self.long_rope {
            Some(l) => Some(l.factors(self.max_context)),
            None => self.rope_freq_factors.as_deref(),
        };
        let base = (0..self.rope_dim / 2).map(|i| {
            let f = 1.0 / self.rope_theta.powf(2.0 * i as f32 / dim);
            factors.map_or(f, |fs| f / fs[i])
        });
        match self.rope_scaling {
            None => base.collect(),
            Some(RopeScaling::Linear { factor }) => base.map(|f| f / factor).collect(),
            Some(RopeScaling::Yarn(y)) => y.inv_freq(base, self.rope_dim, self.rope_theta),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                base.map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
            }
        }
    }
}

/// `rope_type`, or the older `type`, of a `rope_scaling` object.
fn rope_kind(v: &serde_json::Value) -> String {
    v.get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or_default()
        .to_string()
}

/// Phi-3's `rope_scaling` of type "longrope" (once "su"), resolved as
/// transformers does: the pretrained context from the config's top level
/// first, the attention factor from the ratio of contexts unless given.
fn long_rope(v: serde_json::Value, c: &HfConfig, rope_dim: usize) -> anyhow::Result<LongRope> {
    #[derive(Deserialize)]
    struct Params {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: Option<usize>,
        factor: Option<f32>,
        attention_factor: Option<f32>,
    }
    let p: Params = serde_json::from_value(v)
        .map_err(|e| anyhow::anyhow!("rope_scaling of type \"longrope\": {e}"))?;
    for (name, f) in [
        ("short_factor", &p.short_factor),
        ("long_factor", &p.long_factor),
    ] {
        anyhow::ensure!(
            f.len() == rope_dim / 2,
            "rope_scaling.{name} has {} factors for {rope_dim} rotary dimensions",
            f.len()
        );
    }
    let original = c
        .original_max_position_embeddings
        .or(p.original_max_position_embeddings)
        .unwrap_or(c.max_position_embeddings);
    let factor = p
        .factor
        .unwrap_or(c.max_position_embeddings as f32 / original as f32);
    let attn_factor = p.attention_factor.unwrap_or(match factor <= 1.0 {
        true => 1.0,
        false => (1.0 + (factor as f64).ln() / (original as f64).ln()).sqrt() as f32,
    });
    Ok(LongRope {
        short_factor: p.short_factor,
        long_factor: p.long_factor,
        original_context: original,
        attn_factor,
    })
}

/// `rope_scaling` from `config.json`: `rope_type` (or the older `type`) must
/// be a kind wick implements; "default" means none. YaRN's defaults come
/// from the model's `max_position_embeddings`.
fn parse_rope_scaling(
    mut v: serde_json::Value,
    max_position_embeddings: usize,
) -> anyhow::Result<Option<RopeScaling>> {
    let Some(obj) = v.as_object_mut() else {
        anyhow::bail!("rope_scaling must be an object, got {v}");
    };
    if !obj.contains_key("rope_type") {
        if let Some(t) = obj.remove("type") {
            obj.insert("rope_type".into(), t);
        }
    }
    let kind = obj
        .get("rope_type")
        .and_then(|t| t.as_str())
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "default" => return Ok(None),
        "yarn" => {
            return Ok(Some(RopeScaling::Yarn(Yarn::from_hf(
                v,
                max_position_embeddings,
            )?)))
        }
        _ => {}
    }
    serde_json::from_value(v).map(Some).map_err(|e| {
        anyhow::anyhow!(
            "rope_scaling of type {kind:?} is not supported ({e}); wick supports \"linear\", \"llama3\", \"yarn\" and \"longrope\""
        )
    })
}

struct Block {
    attn_norm: Tensor,
    /// q, k and v stacked: `[(heads + 2 * kv_heads) * head_dim, hidden]`.
    qkv: Linear,
    /// Qwen3's per-head RMSNorm weights for the query and key heads.
    qk_norm: Option<(Tensor, Tensor)>,
    o: Linear,
    /// gpt-oss's attention sinks, `[heads]` f32.
    sinks: Option<Tensor>,
    /// Gemma's norms on the attention's and the MLP's outputs.
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    ffn: Ffn,
    post_ffn_norm: Option<Tensor>,
}

pub struct Llama {
    config: Config,
    info: ModelInfo,
    device: Device,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    /// Gemma 3's local layers' own RoPE.
    local_rope: Option<Rope>,
    /// Rows routed to each expert, for a mixture of experts.
    expert_load: Option<Arc<ExpertLoad>>,
    /// The factor on the queries where the attention's scale could not be
    /// folded into query norms.
    q_scale: Option<f32>,
}

impl Llama {
    /// From a GGUF file; `context` caps the context (`--max-model-len`).
    pub fn from_gguf<R: Read + Seek>(
        content: &Gguf,
        reader: &mut R,
        spec: WeightSpec,
        context: Option<usize>,
        device: &Device,
    ) -> anyhow::Result<Self> {
        let mut config = Config::from_gguf(content)?;
        config.serve_context(context);
        // Every tensor error names the tensor and its block type.
        let mut qt = |name: &str| read_tensor(content, reader, name, device);
        if content.tensor_infos.contains_key("rope_freqs.weight") {
            let factors = qt("rope_freqs.weight")?
                .dequantize(device)?
                .to_vec1::<f32>()?;
            anyhow::ensure!(
                factors.len() == config.head_dim / 2,
                "rope_freqs.weight has {} factors for head size {}",
                factors.len(),
                config.head_dim
            );
            config.rope_freq_factors = Some(factors);
        }
        if content
            .tensor_infos
            .contains_key("rope_factors_long.weight")
        {
            let mut factors = |name: &str| -> anyhow::Result<Vec<f32>> {
                let f = qt(name)?.dequantize(device)?.to_vec1::<f32>()?;
                anyhow::ensure!(
                    f.len() == config.rope_dim / 2,
                    "{name} has {} factors for {} rotary dimensions",
                    f.len(),
                    config.rope_dim
                );
                Ok(f)
            };
            let (long_factor, short_factor) = (
                factors("rope_factors_long.weight")?,
                factors("rope_factors_short.weight")?,
            );
            let md = |key: &str| content.metadata.get(&format!("phi3.{key}"));
            config.long_rope = Some(LongRope {
                short_factor,
                long_factor,
                original_context: md("rope.scaling.original_context_length")
                    .map_or(Ok(config.max_context as u32), |v| v.to_u32())?
                    as usize,
                attn_factor: md("rope.scaling.attn_factor").map_or(Ok(1.0), |v| v.to_f32())?,
            });
        }
        let embed_q = qt("token_embd.weight")?;
        let embed = Embedding::new(&embed_q, spec, device)?;
        // The head before the layers, so that the table as the file holds it
        // (`embed_q`) is dropped before they load: it would add to peak RSS.
        let output = match content.tensor_infos.contains_key("output.weight") {
            true => Some(qt("output.weight")?),
            false => None,
        };
        let lm_head = embed.lm_head(output, embed_q, spec, device)?;
        let expert_load = expert_load(&config);
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("blk.{i}");
            let mut linear = |names: &[&str]| -> anyhow::Result<Linear> {
                let ws = names
                    .iter()
                    .map(|n| qt(&format!("{p}.{n}.weight")))
                    .collect::<anyhow::Result<Vec<QTensor>>>()?;
                let what = || format!("{p}.{}", names.join("+"));
                let linear = Linear::stacked(ws, spec, device)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", what()))?;
                // Qwen2's q/k/v carry biases; Llama's layers have none.
                let biases: Vec<String> = names.iter().map(|n| format!("{p}.{n}.bias")).collect();
                if !biases.iter().all(|b| content.tensor_infos.contains_key(b)) {
                    return Ok(linear);
                }
                let bias = biases
                    .iter()
                    .map(|b| Ok(qt(b)?.dequantize(device)?))
                    .collect::<anyhow::Result<Vec<Tensor>>>()?;
                Ok(linear.with_bias(Tensor::cat(&bias, 0)?)?)
            };
            // Phi-3 files hold q/k/v in one matrix, and gate/up (gate
            // first) in `ffn_up`.
            let has = |n: &str| {
                content
                    .tensor_infos
                    .contains_key(&format!("{p}.{n}.weight"))
            };
            let qkv = match has("attn_qkv") {
                true => linear(&["attn_qkv"])?,
                false => linear(&["attn_q", "attn_k", "attn_v"])?,
            };
            let o = linear(&["attn_output"])?;
            let ffn = match (&config.moe, has("ffn_gate_inp")) {
                (Some(moe), true) => {
                    let load = expert_load.clone().expect("a MoE config has a load");
                    let found = |n: &str| content.has(&format!("{p}.{n}"));
                    let gguf = GgufLayer {
                        prefix: &p,
                        has: &found,
                        spec,
                        device,
                    };
                    let mut moe =
                        Moe::from_gguf(&gguf, &mut qt, moe.experts, moe.routing, (i, load))?;
                    moe.act = config.act;
                    Ffn::Experts(Box::new(moe))
                }
                _ => {
                    let gate_up = match has("ffn_gate") {
                        true => linear(&["ffn_gate", "ffn_up"])?,
                        false => linear(&["ffn_up"])?,
                    };
                    let down = linear(&["ffn_down"])?;
                    Ffn::Dense(Mlp::new(gate_up, down, Activation::Glu(config.act)))
                }
            };
            let q_norm = format!("{p}.attn_q_norm.weight");
            let qk_norm = match content.tensor_infos.contains_key(&q_norm) {
                true => Some((
                    qt(&q_norm)?.dequantize(device)?,
                    qt(&format!("{p}.attn_k_norm.weight"))?.dequantize(device)?,
                )),
                false => None,
            };
            let mut optional = |name: &str| -> anyhow::Result<Option<Tensor>> {
                let name = format!("{p}.{name}.weight");
                match content.tensor_infos.contains_key(&name) {
                    true => Ok(Some(qt(&name)?.dequantize(device)?)),
                    false => Ok(None),
                }
            };
            // A file without `ffn_norm` (gpt-oss's) names the norm before
            // the FFN `post_attention_norm`; Gemma's is after attention.
            let (post_attn_norm, ffn_norm) = match has("ffn_norm") {
                true => (optional("post_attention_norm")?, optional("ffn_norm")?),
                false => (None, optional("post_attention_norm")?),
            };
            let need = |t: Option<Tensor>, name: &str| {
                t.ok_or_else(|| anyhow::anyhow!("the file has no tensor {p}.{name}.weight"))
            };
            blocks.push(Block {
                attn_norm: need(optional("attn_norm")?, "attn_norm")?,
                qkv,
                qk_norm,
                o,
                sinks: optional("attn_sinks")?,
                post_attn_norm,
                ffn_norm: need(ffn_norm, "ffn_norm")?,
                ffn,
                post_ffn_norm: optional("post_ffw_norm")?,
            });
        }
        let norm = qt("output_norm.weight")?.dequantize(device)?;
        Ok(Self::assemble(
            config,
            embed,
            blocks,
            norm,
            lm_head,
            KvDtype::F16,
            device,
        )?)
    }

    /// From a Hugging Face checkpoint: `config.json` text and its weights.
    /// Linear layers are held in `vb`'s dtype (or as `spec` says); norms
    /// and embeddings in f32. `context` caps the context.
    pub fn from_safetensors(
        config_json: &str,
        vb: VarBuilder,
        spec: WeightSpec,
        context: Option<usize>,
    ) -> anyhow::Result<Self> {
        let (mut config, tied) = Config::from_hf(config_json)?;
        config.serve_context(context);
        let device = vb.device().clone();
        // Gemma's RMSNorms scale by 1 + w (llama.cpp's converter adds the 1
        // into the file).
        let norm_shift = config.norm_offset as f64;
        let f32_tensor = |name: &str| vb.get_unchecked_dtype(name, DType::F32);
        let norm = |name: &str| f32_tensor(name)? + norm_shift;
        let optional_norm = |name: &str| match vb.contains_tensor(name) {
            true => norm(name).map(Some),
            false => Ok(None),
        };
        let linear = |prefix: &str, names: &[&str]| -> Result<Linear> {
            let get = |n: &str, what: &str| vb.get_unchecked(&format!("{prefix}.{n}.{what}"));
            let ws = names
                .iter()
                .map(|n| get(n, "weight"))
                .collect::<Result<Vec<_>>>()?;
            let has_bias = names
                .iter()
                .all(|n| vb.contains_tensor(&format!("{prefix}.{n}.bias")));
            let bias = match has_bias {
                true => Some(Tensor::cat(
                    &names
                        .iter()
                        .map(|n| get(n, "bias"))
                        .collect::<Result<Vec<_>>>()?,
                    0,
                )?),
                false => None,
            };
            Linear::dense(Tensor::cat(&ws, 0)?, bias, spec)
        };
        // A multimodal checkpoint (Mistral 3) nests the language model, as
        // the hub's files (`language_model.model.`) or transformers 5
        // (`model.language_model.`) name it; its vision tower is not read.
        let root = ["language_model.model", "model.language_model"]
            .into_iter()
            .find(|r| vb.contains_tensor(&format!("{r}.embed_tokens.weight")))
            .unwrap_or("model");
        let expert_load = expert_load(&config);
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("{root}.layers.{i}");
            let q_norm = format!("{p}.self_attn.q_norm.weight");
            let qk_norm = match vb.contains_tensor(&q_norm) {
                true => Some((
                    norm(&q_norm)?,
                    norm(&format!("{p}.self_attn.k_norm.weight"))?,
                )),
                false => None,
            };
            // Gemma's "post_attention_layernorm" follows the attention; its
            // MLP's own norm comes before (and after) it.
            let pre_ffn = format!("{p}.pre_feedforward_layernorm.weight");
            let (post_attn_norm, ffn_norm) = match vb.contains_tensor(&pre_ffn) {
                true => (
                    Some(norm(&format!("{p}.post_attention_layernorm.weight"))?),
                    norm(&pre_ffn)?,
                ),
                false => (None, norm(&format!("{p}.post_attention_layernorm.weight"))?),
            };
            // Phi-3 fuses q/k/v and gate/up (gate first) in the checkpoint.
            let fused = |name: &str| vb.contains_tensor(&format!("{p}.{name}.weight"));
            let (attn, mlp) = (format!("{p}.self_attn"), format!("{p}.mlp"));
            let ffn = match &config.moe {
                Some(moe) if !moe.dense_layers.contains(&i) => {
                    let load = expert_load.clone().expect("a MoE config has a load");
                    // Mixtral's and Granite's block is `block_sparse_moe`,
                    // the others' `mlp`.
                    let sparse = format!("{p}.block_sparse_moe");
                    let at = match ["gate.weight", "router.layer.weight"]
                        .iter()
                        .any(|n| vb.contains_tensor(&format!("{sparse}.{n}")))
                    {
                        true => sparse,
                        false => mlp.clone(),
                    };
                    let mut moe =
                        Moe::from_hf(&vb, &at, moe.experts, moe.routing, (i, load), spec)?;
                    moe.act = config.act;
                    Ffn::Experts(Box::new(moe))
                }
                _ => Ffn::Dense(Mlp::new(
                    match fused("mlp.gate_up_proj") {
                        true => linear(&mlp, &["gate_up_proj"])?,
                        false => linear(&mlp, &["gate_proj", "up_proj"])?,
                    },
                    linear(&mlp, &["down_proj"])?,
                    Activation::Glu(config.act),
                )),
            };
            blocks.push(Block {
                attn_norm: norm(&format!("{p}.input_layernorm.weight"))?,
                qkv: match fused("self_attn.qkv_proj") {
                    true => linear(&attn, &["qkv_proj"])?,
                    false => linear(&attn, &["q_proj", "k_proj", "v_proj"])?,
                },
                qk_norm,
                o: linear(&attn, &["o_proj"])?,
                sinks: match vb.contains_tensor(&format!("{attn}.sinks")) {
                    true => Some(f32_tensor(&format!("{attn}.sinks"))?),
                    false => None,
                },
                post_attn_norm,
                ffn_norm,
                ffn,
                post_ffn_norm: optional_norm(&format!("{p}.post_feedforward_layernorm.weight"))?,
            });
        }
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed = Embedding::Dense(f32_tensor(&embed_name)?);
        let head = match (tied, vb.contains_tensor("language_model.lm_head.weight")) {
            (true, _) => embed_name.as_str(),
            (false, true) => "language_model.lm_head.weight",
            (false, false) => "lm_head.weight",
        };
        let lm_head = Linear::dense(vb.get_unchecked(head)?, None, spec)?;
        let norm = norm(&format!("{root}.norm.weight"))?;
        let kv_dtype = KvDtype::for_weights(vb.dtype());
        Ok(Self::assemble(
            config, embed, blocks, norm, lm_head, kv_dtype, &device,
        )?)
    }

    fn assemble(
        config: Config,
        embed: Embedding,
        mut blocks: Vec<Block>,
        norm: Tensor,
        mut lm_head: Linear,
        kv_dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        // In the order a forward reads them.
        crate::quant::share_pages(
            blocks
                .iter_mut()
                .flat_map(|b| {
                    [&mut b.qkv, &mut b.o]
                        .into_iter()
                        .chain(b.ffn.linears_mut())
                })
                .chain([&mut lm_head])
                .flat_map(Linear::own_matrices),
        );
        let rope = |inv_freq: &[f32], scale: f32| {
            Rope::new(
                inv_freq,
                config.head_dim,
                scale,
                config.max_context,
                config.rope_interleaved,
                device,
            )
        };
        let local_rope = match (config.local_layers.is_empty(), config.local_rope_theta) {
            (false, Some(theta)) => Some(rope(&config.local_inv_freq(theta), 1.0)?),
            _ => None,
        };
        let rope = rope(&config.inv_freq(), config.rope_scale())?;
        // The attention scales by the head size's 1/√d: a different scalar
        // (Gemma's) is folded into the query norms, which RoPE's rotation
        // leaves in proportion; without them (Granite) the queries are
        // scaled after RoPE.
        let factor = config
            .attn_scale
            .map(|s| s as f64 * (config.head_dim as f64).sqrt())
            .filter(|&f| f != 1.0);
        let mut q_scale = None;
        if let Some(factor) = factor {
            for b in blocks.iter_mut() {
                match &mut b.qk_norm {
                    Some((q, _)) => *q = (&*q * factor)?,
                    None => q_scale = Some(factor as f32),
                }
            }
        }
        let info = ModelInfo {
            num_layers: config.num_layers,
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            vocab_size: config.vocab_size,
            max_context: config.max_context,
            kv_dtype,
            window_layers: match config.sliding_window {
                Some(_) => config.local_layers.clone(),
                None => Vec::new(),
            },
            sliding_window: config
                .sliding_window
                .filter(|_| !config.local_layers.is_empty()),
            window_kv: None,
        };
        let expert_load = blocks.iter().find_map(|b| match &b.ffn {
            Ffn::Experts(moe) => Some(moe.load.clone()),
            Ffn::Dense(_) => None,
        });
        Ok(Llama {
            q_scale,
            expert_load,
            info,
            device: device.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            rope,
            local_rope,
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// Counters of rows routed per layer and expert, for a mixture of experts.
fn expert_load(config: &Config) -> Option<Arc<ExpertLoad>> {
    let moe = config.moe.as_ref()?;
    Some(Arc::new(ExpertLoad::new(config.num_layers, moe.experts)))
}

/// The RMSNorms on the query and key parts of stacked `[T, qkv_width]`
/// rows, value heads as they were: over each head with weights of a head's
/// size (Qwen3, Gemma 3), or over the whole projection with weights of its
/// size (OLMoE).
fn norm_heads(qkv: &Tensor, (q, k): &(Tensor, Tensor), c: &Config) -> Result<Tensor> {
    let (t, hd, eps) = (qkv.dim(0)?, c.head_dim, c.rms_norm_eps as f32);
    let heads = |from: usize, n: usize, w: &Tensor| -> Result<Tensor> {
        let x = qkv.narrow(1, from * hd, n * hd)?.contiguous()?;
        let size = w.dim(0)?;
        candle_nn::ops::rms_norm(&x.reshape((t * n * hd / size, size))?, w, eps)?
            .reshape((t, n * hd))
    };
    let (nh, nkv) = (c.num_heads, c.num_kv_heads);
    Tensor::cat(
        &[
            heads(0, nh, q)?,
            heads(nh, nkv, k)?,
            qkv.narrow(1, (nh + nkv) * hd, nkv * hd)?,
        ],
        1,
    )
}

impl Model for Llama {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn expert_load(&self) -> Option<Arc<ExpertLoad>> {
        self.expert_load.clone()
    }

    fn forward_all(&self, meta: &StepMeta, cache: &mut KvCache) -> Result<Output> {
        let batch = meta.batch();
        let c = &self.config;
        let (hd, nh, nkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
        let dims = AttnDims {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: cache.layout().block_size,
            window: None,
        };
        let positions = meta.positions_t()?;
        let mut x = self.embed.forward(meta.tokens(), &meta.tokens_t()?)?;
        if let Some(scale) = c.embed_scale {
            x = (x * scale as f64)?;
        }
        // An image's features replace its placeholder tokens' embeddings,
        // unscaled (transformers scatters them in after the scaling).
        let mut x = batch.with_embeds(x)?;
        let eps = c.rms_norm_eps as f32;
        // Granite scales each block's output before the residual add.
        let post_norm = |y: Tensor, w: &Option<Tensor>| {
            let y = match w {
                Some(w) => candle_nn::ops::rms_norm(&y, w, eps)?,
                None => y,
            };
            match c.residual_scale {
                Some(s) => y * s as f64,
                None => Ok(y),
            }
        };
        let q_scales = query_scales(
            self.q_scale,
            c.attn_temperature.as_ref(),
            meta.positions(),
            &self.device,
        )?;
        // Each residual add and the norm after it are one step
        // (`add_rms_norm`: one launch on a CUDA device): `h` is the normed
        // input of the next attention or feed-forward.
        let mut h = match self.blocks.first() {
            Some(b) => candle_nn::ops::rms_norm(&x, &b.attn_norm, eps)?,
            None => x.clone(),
        };
        for (i, b) in self.blocks.iter().enumerate() {
            let qkv = b.qkv.forward(&h)?;
            let qkv = match &b.qk_norm {
                Some(norms) => norm_heads(&qkv, norms, c)?,
                None => qkv,
            };
            let local = c.local_layers.contains(&i);
            let rope = match (local, &self.local_rope) {
                (true, Some(r)) => r,
                _ => &self.rope,
            };
            let qkv = match c.no_rope_layers.contains(&i) {
                true => qkv,
                false => rope.apply(&qkv, meta.positions(), &positions, nh + nkv)?,
            };
            let qkv = match &q_scales {
                Some(s) => scale_queries(&qkv, s, nh * hd)?,
                None => qkv,
            };
            let dims = AttnDims {
                window: c.sliding_window.filter(|_| local),
                ..dims
            };
            let attn = paged_attention(&qkv, cache.layer_mut(i), meta, dims, b.sinks.as_ref())?;
            let y = post_norm(b.o.forward(&attn)?, &b.post_attn_norm)?;
            (x, h) = elementwise::add_rms_norm(&x, &y, &b.ffn_norm, eps)?;
            let y = post_norm(b.ffn.forward(&h)?, &b.post_ffn_norm)?;
            match self.blocks.get(i + 1) {
                Some(next) => (x, h) = elementwise::add_rms_norm(&x, &y, &next.attn_norm, eps)?,
                None => x = elementwise::add(&x, &y)?,
            }
        }
        let hidden = hidden_states(&x, batch, &self.device, |h| {
            candle_nn::ops::rms_norm(h, &self.norm, eps)
        })?;
        if meta.num_logit_rows() == 0 {
            let logits = Tensor::zeros((0, c.vocab_size), candle_core::DType::F32, &self.device)?;
            return Ok(Output { logits, hidden });
        }
        let x =
            candle_nn::ops::rms_norm(&x.index_select(&meta.logit_rows_t()?, 0)?, &self.norm, eps)?;
        let logits = self.lm_head.forward(&x)?;
        let logits = match c.logit_scale {
            Some(s) => (logits / s as f64)?,
            None => logits,
        };
        let logits = match c.final_logit_softcap {
            Some(cap) => ((logits / cap as f64)?.tanh()? * cap as f64)?,
            None => logits,
        };
        Ok(Output { logits, hidden })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YaRN as gpt-oss configures it (factor 32 from 4096, base 150000,
    /// heads of 64), with `truncate` false and true: inverse frequencies
    /// and the cos/sin scale against transformers 5.23's
    /// `_compute_yarn_parameters` on the same settings (pairs 9, 12 and 17
    /// lie on the ramp, whose ends `truncate` rounds outwards).
    #[test]
    fn yarn_matches_transformers_with_and_without_truncation() {
        let want = [
            (false, [3.170_57e-2, 6.794_96e-3, 1.293_19e-4]),
            (true, [3.162_08e-2, 7.015_71e-3, 2.279_48e-4]),
        ];
        for (truncate, [p9, p12, p17]) in want {
            let json = serde_json::json!({
                "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 2,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "vocab_size": 512,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                    "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                    "beta_slow": 1.0, "truncate": truncate},
            });
            let (c, _) = Config::from_hf(&json.to_string()).unwrap();
            let inv = c.inv_freq();
            for (i, want) in [(9, p9), (12, p12), (17, p17)] {
                let rel = (inv[i] - want).abs() / want;
                assert!(
                    rel < 1e-5,
                    "truncate {truncate}, pair {i}: {} vs {want}",
                    inv[i]
                );
            }
            assert_eq!(inv[0], 1.0);
            assert!(
                (c.rope_scale() - 1.346_573_6).abs() < 1e-6,
                "{}",
                c.rope_scale()
            );
        }
    }

    /// Phi-3.5-mini's `config.json` as published: the older "su" name, the
    /// pretrained context at the top level, no attention factor given. The
    /// served context picks the factors; the factor comes from the ratio.
    #[test]
    fn phi3_long_rope_from_config_json() {
        let (short, long) = (vec![1.0f32; 48], vec![2.0f32; 48]);
        let json = serde_json::json!({
            "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0, "vocab_size": 32064, "hidden_act": "silu",
            "sliding_window": 262144,
            "rope_scaling": {"type": "su", "short_factor": short, "long_factor": long},
        });
        let (mut c, _) = Config::from_hf(&json.to_string()).unwrap();
        let l = c.long_rope.clone().unwrap();
        assert_eq!((l.original_context, c.rope_dim), (4096, 96));
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert!((c.rope_scale() - want).abs() < 1e-6, "{}", c.rope_scale());
        let plain = 1.0 / 10_000f32.powf(2.0 / 96.0);
        assert_eq!(c.inv_freq()[1], plain / 2.0);
        c.serve_context(Some(4096));
        assert_eq!(c.inv_freq()[1], plain);

        // Phi-4-mini rotates three quarters of each head; factors of the
        // wrong length are refused by name.
        let mut json = json;
        json["partial_rotary_factor"] = 0.75.into();
        let e = Config::from_hf(&json.to_string()).unwrap_err().to_string();
        assert!(e.contains("short_factor has 48 factors for 72"), "{e}");
    }
}
