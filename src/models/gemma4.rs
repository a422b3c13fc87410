//! Gemma 4 (text). Gemma 3's sandwich of RMSNorms, GeGLU and sliding-window
//! layers between global ones, with what sets it apart:
//!
//! - norms scale by `w` (Gemma 3's by `1 + w`), queries and keys are
//!   RMS-normed per head, values too (without a weight), and the attention
//!   scale is 1 (folded here into the query norms, as the kernels scale by
//!   `head_dim^-1/2`);
//! - global layers have heads of their own size and count, and
//!   "proportional" RoPE: the first pairs of each head rotate at the base
//!   frequencies of the whole head, the rest not at all; where the
//!   checkpoint says (`attention_k_eq_v`) their values are the raw key
//!   projection;
//! - each layer's output is scaled by its `layer_scalar`;
//! - the small models (E2B, E4B) add per-layer inputs, a second embedding
//!   of each token (one slice per layer) gated into every layer's output,
//!   and let their last layers reuse the K/V of the last earlier layer of
//!   their kind, computing queries only.
//!
//! Layers that reuse K/V hold no cache layer of their own: the pool has
//! the others only, and a reusing layer attends over its source's,
//! writing back the rows its source wrote this step (the same values).

use std::io::{Read, Seek};
use std::sync::Arc;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::elementwise::{self, Act};
use super::embedding::Embedding;
use super::linear::{Linear, WeightFormat, WeightSpec};
use super::mlp::{Activation, Mlp};
use super::moe::{ExpertLoad, Experts, GgufLayer, Moe, MoeConfig, Routing};
use super::rope::Rope;
use super::{hidden_states, read_tensor, Gguf, Model, ModelInfo, Output};
use crate::attention::{paged_attention, AttnDims};
use crate::kv::cache::{KvCache, KvDtype, KvShape};
use crate::kv::step_meta::StepMeta;

/// A layer kind's attention heads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heads {
    pub head_dim: usize,
    pub num_kv_heads: usize,
    pub rope_theta: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub local: Heads,
    pub global: Heads,
    /// Pairs of each global head that rotate; the rest keep their values.
    pub global_rotated_pairs: usize,
    /// Global RoPE's frequencies are divided by this (`factor`).
    pub global_rope_factor: f32,
    /// Per layer: whether it attends within `sliding_window`.
    pub sliding: Vec<bool>,
    pub sliding_window: usize,
    /// The last this many layers reuse earlier layers' K/V.
    pub kv_shared_layers: usize,
    /// Global layers' values are their raw keys.
    pub k_eq_v: bool,
    /// Width of each layer's slice of the per-layer inputs; 0 for none.
    pub per_layer_input: usize,
    pub rms_norm_eps: f64,
    pub final_logit_softcap: Option<f32>,
    pub max_context: usize,
    pub vocab_size: usize,
    /// The 26B-A4B's experts, beside every layer's dense MLP.
    pub moe: Option<MoeConfig>,
}

/// The fields of a Gemma 4 `config.json` (or its `text_config`) wick reads.
#[derive(Deserialize)]
struct HfConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    /// transformers' own save: the global layers' heads, by layer.
    per_layer_config: Option<std::collections::BTreeMap<String, LayerOverride>>,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default)]
    num_kv_shared_layers: usize,
    #[serde(default)]
    hidden_size_per_layer_input: usize,
    layer_types: Vec<String>,
    sliding_window: usize,
    rope_parameters: serde_json::Value,
    rms_norm_eps: f64,
    final_logit_softcapping: Option<f32>,
    max_position_embeddings: usize,
    vocab_size: usize,
    #[serde(default)]
    enable_moe_block: bool,
    num_experts: Option<usize>,
    top_k_experts: Option<usize>,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
}

#[derive(Deserialize)]
struct LayerOverride {
    head_dim: Option<usize>,
    num_key_value_heads: Option<usize>,
}

fn yes() -> bool {
    true
}

impl Config {
    /// Layers below this keep their own K/V; the rest reuse them.
    fn first_shared(&self) -> usize {
        self.num_layers - self.kv_shared_layers
    }

    /// The cache layer layer `i` attends over: its own, or (a reusing
    /// layer's) that of the last layer of its kind that keeps K/V.
    fn cache_layer(&self, i: usize) -> Option<usize> {
        match i < self.first_shared() {
            true => Some(i),
            false => (0..self.first_shared())
                .rev()
                .find(|&j| self.sliding[j] == self.sliding[i]),
        }
    }

    fn heads(&self, i: usize) -> Heads {
        match self.sliding[i] {
            true => self.local,
            false => self.global,
        }
    }

    /// From a checkpoint's `config.json`: a multimodal one's `text_config`.
    pub fn from_hf(json: &str) -> anyhow::Result<(Self, bool)> {
        let mut v: serde_json::Value = serde_json::from_str(json)?;
        if let Some(text) = v.get_mut("text_config").map(serde_json::Value::take) {
            v = text;
        }
        let c: HfConfig = serde_json::from_value(v)?;
        let moe = match (c.enable_moe_block, c.num_experts, c.top_k_experts) {
            (false, _, _) => None,
            (true, Some(experts), Some(top_k)) => Some(moe_config(experts, top_k)),
            (true, _, _) => anyhow::bail!("enable_moe_block without num_experts and top_k_experts"),
        };
        anyhow::ensure!(
            c.layer_types.len() == c.num_hidden_layers,
            "layer_types has {} entries for {} layers",
            c.layer_types.len(),
            c.num_hidden_layers
        );
        let sliding: Vec<bool> = c
            .layer_types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(anyhow::anyhow!("layer type {other:?} is not supported")),
            })
            .collect::<anyhow::Result<_>>()?;
        // transformers reads the global heads from per_layer_config where
        // it saved one, else from the top level (head size 512 if unsaid).
        let saved = c.per_layer_config.as_ref().and_then(|m| m.values().next());
        let global_head_dim = saved
            .and_then(|o| o.head_dim)
            .or(c.global_head_dim)
            .unwrap_or(512);
        let global_kv = match (
            saved.and_then(|o| o.num_key_value_heads),
            c.attention_k_eq_v,
        ) {
            (Some(n), _) => n,
            (None, true) => c
                .num_global_key_value_heads
                .unwrap_or(c.num_key_value_heads),
            (None, false) => c.num_key_value_heads,
        };
        let rope = |kind: &str| c.rope_parameters.get(kind).cloned().unwrap_or_default();
        let (local_rope, global_rope) = (rope("sliding_attention"), rope("full_attention"));
        let theta = |r: &serde_json::Value, default: f64| {
            r.get("rope_theta")
                .and_then(|t| t.as_f64())
                .unwrap_or(default) as f32
        };
        let kind = |r: &serde_json::Value| {
            r.get("rope_type")
                .and_then(|t| t.as_str())
                .unwrap_or("default")
                .to_string()
        };
        anyhow::ensure!(
            kind(&local_rope) == "default",
            "RoPE of type {:?} on sliding-window layers is not supported",
            kind(&local_rope)
        );
        let partial = match kind(&global_rope).as_str() {
            "proportional" => global_rope
                .get("partial_rotary_factor")
                .and_then(|f| f.as_f64())
                .unwrap_or(1.0),
            "default" => 1.0,
            other => anyhow::bail!("RoPE of type {other:?} on global layers is not supported"),
        };
        let config = Config {
            hidden_size: c.hidden_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            local: Heads {
                head_dim: c.head_dim,
                num_kv_heads: c.num_key_value_heads,
                rope_theta: theta(&local_rope, 10_000.0),
            },
            global: Heads {
                head_dim: global_head_dim,
                num_kv_heads: global_kv,
                rope_theta: theta(&global_rope, 1_000_000.0),
            },
            // As transformers rounds it.
            global_rotated_pairs: (partial * global_head_dim as f64) as usize / 2,
            global_rope_factor: global_rope
                .get("factor")
                .and_then(|f| f.as_f64())
                .unwrap_or(1.0) as f32,
            sliding,
            sliding_window: c.sliding_window,
            kv_shared_layers: c.num_kv_shared_layers,
            k_eq_v: c.attention_k_eq_v,
            per_layer_input: c.hidden_size_per_layer_input,
            rms_norm_eps: c.rms_norm_eps,
            final_logit_softcap: c.final_logit_softcapping,
            max_context: c.max_position_embeddings,
            vocab_size: c.vocab_size,
            moe,
        };
        config.check()?;
        Ok((config, c.tie_word_embeddings))
    }

    /// From a GGUF's `gemma4.*` metadata.
    pub fn from_gguf(content: &gguf_file::Content) -> anyhow::Result<Self> {
        let md = |key: &str| {
            content
                .metadata
                .get(&format!("gemma4.{key}"))
                .ok_or_else(|| anyhow::anyhow!("GGUF lacks gemma4.{key}"))
        };
        let num_layers = md("block_count")?.to_u32()? as usize;
        let sliding: Vec<bool> = match md("attention.sliding_window_pattern")? {
            gguf_file::Value::Array(flags) => flags
                .iter()
                .map(|f| f.to_bool())
                .collect::<candle_core::Result<_>>()?,
            other => anyhow::bail!("gemma4.attention.sliding_window_pattern is {other:?}"),
        };
        anyhow::ensure!(
            sliding.len() == num_layers,
            "sliding_window_pattern has {} flags for {num_layers} layers",
            sliding.len()
        );
        // A per-layer array where global layers differ (the converter
        // writes it of i32), else one value.
        let count = |v: &gguf_file::Value| -> anyhow::Result<usize> {
            match v {
                gguf_file::Value::I32(n) => Ok(usize::try_from(*n)?),
                v => Ok(v.to_u32()? as usize),
            }
        };
        let per_layer = |key: &str| -> anyhow::Result<Vec<usize>> {
            match md(key)? {
                gguf_file::Value::Array(vs) => vs.iter().map(count).collect(),
                v => Ok(vec![count(v)?; num_layers]),
            }
        };
        let kv = per_layer("attention.head_count_kv")?;
        anyhow::ensure!(
            kv.len() == num_layers,
            "head_count_kv has {} entries",
            kv.len()
        );
        let of_kind = |want: bool| -> anyhow::Result<usize> {
            let mut of = (0..num_layers)
                .filter(|&i| sliding[i] == want)
                .map(|i| kv[i]);
            let first = of.next().unwrap_or(0);
            anyhow::ensure!(
                of.all(|n| n == first),
                "K/V heads differ within a layer kind"
            );
            Ok(first)
        };
        let md_f32 = |key: &str| md(key).ok().map(|v| v.to_f32()).transpose();
        let global_head_dim = md("attention.key_length")?.to_u32()? as usize;
        let config = Config {
            hidden_size: md("embedding_length")?.to_u32()? as usize,
            num_layers,
            num_heads: md("attention.head_count")?.to_u32()? as usize,
            local: Heads {
                head_dim: md("attention.key_length_swa")?.to_u32()? as usize,
                num_kv_heads: of_kind(true)?,
                rope_theta: md_f32("rope.freq_base_swa")?.unwrap_or(10_000.0),
            },
            global: Heads {
                head_dim: global_head_dim,
                num_kv_heads: of_kind(false)?,
                rope_theta: md_f32("rope.freq_base")?.unwrap_or(1_000_000.0),
            },
            // The file's rope_freqs say which pairs rotate (read with the
            // tensors); until then, all.
            global_rotated_pairs: global_head_dim / 2,
            global_rope_factor: 1.0,
            sliding,
            sliding_window: md("attention.sliding_window")?.to_u32()? as usize,
            kv_shared_layers: md("attention.shared_kv_layers").map_or(Ok(0), |v| v.to_u32())?
                as usize,
            // Read off the tensors: a global layer without attn_v.
            k_eq_v: false,
            per_layer_input: md("embedding_length_per_layer_input").map_or(Ok(0), |v| v.to_u32())?
                as usize,
            rms_norm_eps: md("attention.layer_norm_rms_epsilon")?.to_f32()? as f64,
            final_logit_softcap: md_f32("final_logit_softcapping")?.filter(|&c| c != 0.0),
            max_context: md("context_length")?.to_u32()? as usize,
            vocab_size: content.tensor_infos["token_embd.weight"].shape.dims()[0],
            moe: match md("expert_count").map_or(Ok(0), |v| v.to_u32())? {
                0 => None,
                n => Some(moe_config(
                    n as usize,
                    md("expert_used_count")?.to_u32()? as usize,
                )),
            },
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.kv_shared_layers < self.num_layers,
            "all {} layers reuse K/V",
            self.num_layers
        );
        for i in self.first_shared()..self.num_layers {
            anyhow::ensure!(
                self.cache_layer(i).is_some(),
                "layer {i} reuses K/V, but no earlier layer of its kind keeps any"
            );
        }
        anyhow::ensure!(
            self.global_rotated_pairs <= self.global.head_dim / 2,
            "{} rotated pairs in heads of {}",
            self.global_rotated_pairs,
            self.global.head_dim
        );
        Ok(())
    }

    /// Global RoPE's inverse frequencies, one per pair of the whole head:
    /// over the head's size, 0 (no rotation) past the rotated pairs, or
    /// divided by a GGUF's `rope_freqs` (llama.cpp's way of saying so).
    fn global_inv_freq(&self, freq_factors: Option<&[f32]>) -> Vec<f32> {
        let g = self.global.head_dim;
        (0..g / 2)
            .map(|i| {
                let f = 1.0 / self.global.rope_theta.powf(2.0 * i as f32 / g as f32);
                match freq_factors {
                    Some(ff) => f / ff[i],
                    None if i < self.global_rotated_pairs => f / self.global_rope_factor,
                    None => 0.0,
                }
            })
            .collect()
    }

    fn local_inv_freq(&self) -> Vec<f32> {
        let d = self.local.head_dim;
        (0..d / 2)
            .map(|i| 1.0 / self.local.rope_theta.powf(2.0 * i as f32 / d as f32))
            .collect()
    }
}

/// Gemma's MLP: tanh-GELU-gated, gate and up stacked.
fn geglu(gate_up: Linear, down: Linear) -> Mlp {
    Mlp::new(gate_up, down, Activation::Glu(Act::GeluTanh))
}

/// Every layer's experts, their top k weights renormalized.
fn moe_config(experts: usize, top_k: usize) -> MoeConfig {
    MoeConfig {
        experts,
        routing: Routing {
            top_k,
            renormalize: true,
        },
        dense_layers: Vec::new(),
    }
}

/// The 26B-A4B's experts beside a layer's dense MLP: routed on the
/// residual stream (RMS-normed, scaled per channel by `router_norm`), fed
/// its own norm of it, each output normed before the two are summed.
struct ExpertBlock {
    moe: Moe,
    /// The router's input norm: its `scale` times `hidden^-1/2`.
    router_norm: Tensor,
    pre_norm: Tensor,
    post_dense_norm: Tensor,
    post_experts_norm: Tensor,
}

/// A layer's share of the per-layer inputs: gated by its output, projected
/// back, normed and added.
struct PerLayer {
    gate: Linear,
    proj: Linear,
    norm: Tensor,
}

/// Where a layer's K/V come from.
enum KvSource {
    /// Its own projection gives keys, normed by `k_norm`, then values
    /// unless they are the raw keys (`values_are_keys`).
    Own {
        values_are_keys: bool,
        k_norm: Tensor,
    },
    /// An earlier layer's, this step's rows of which it reuses.
    Reused,
}

struct Layer {
    attn_norm: Tensor,
    /// Queries, then its own keys and values where it has them.
    qkv: Linear,
    kv: KvSource,
    /// Scaled by √head_dim once loaded, which cancels the kernels'
    /// 1/√head_dim.
    q_norm: Tensor,
    o: Linear,
    post_attn_norm: Tensor,
    pre_ffn_norm: Tensor,
    mlp: Mlp,
    post_ffn_norm: Tensor,
    experts: Option<ExpertBlock>,
    per_layer: Option<PerLayer>,
    scalar: f64,
}

/// The per-layer inputs' embedding, projection and norm.
struct PerLayerInputs {
    embed: Embedding,
    proj: Linear,
    norm: Tensor,
}

pub struct Gemma4 {
    config: Config,
    info: ModelInfo,
    device: Device,
    embed: Embedding,
    per_layer_inputs: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    local_rope: Rope,
    global_rope: Rope,
    /// Each head's weightless RMSNorm on the values, as ones.
    local_ones: Tensor,
    global_ones: Tensor,
    expert_load: Option<Arc<ExpertLoad>>,
}

impl Gemma4 {
    /// From a GGUF file; `context` caps the context.
    pub fn from_gguf<R: Read + Seek>(
        content: &Gguf,
        reader: &mut R,
        spec: WeightSpec,
        context: Option<usize>,
        device: &Device,
    ) -> anyhow::Result<Self> {
        let mut config = Config::from_gguf(content)?;
        let has = |name: &str| content.tensor_infos.contains_key(name);
        let mut qt = |name: &str| read_tensor(content, reader, name, device);
        let freq_factors = match has("rope_freqs.weight") {
            true => Some(
                qt("rope_freqs.weight")?
                    .dequantize(device)?
                    .to_vec1::<f32>()?,
            ),
            false => None,
        };
        if let Some(ff) = &freq_factors {
            anyhow::ensure!(
                ff.len() == config.global.head_dim / 2,
                "rope_freqs.weight has {} factors for heads of {}",
                ff.len(),
                config.global.head_dim
            );
        }
        config.k_eq_v = (0..config.first_shared())
            .any(|i| !config.sliding[i] && !has(&format!("blk.{i}.attn_v.weight")));
        let embed_q = qt("token_embd.weight")?;
        let embed = Embedding::new(&embed_q, spec, device)?;
        // The head before the layers, so that the table as the file holds it
        // (`embed_q`) is dropped before they load: it would add to peak RSS.
        let output = match has("output.weight") {
            true => Some(qt("output.weight")?),
            false => None,
        };
        let lm_head = embed.lm_head(output, embed_q, spec, device)?;
        let per_layer_inputs = match config.per_layer_input {
            0 => None,
            _ => Some(PerLayerInputs {
                embed: Embedding::new(&qt("per_layer_token_embd.weight")?, spec, device)?,
                proj: Linear::new(qt("per_layer_model_proj.weight")?, spec, device)?,
                norm: qt("per_layer_proj_norm.weight")?.dequantize(device)?,
            }),
        };
        let load = expert_load(&config);
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("blk.{i}");
            let w = |n: &str| format!("{p}.{n}.weight");
            let experts = match (&config.moe, &load) {
                (Some(moe), Some(load)) => {
                    let found = |n: &str| has(&format!("{p}.{n}"));
                    let layer = GgufLayer {
                        prefix: &p,
                        has: &found,
                        spec,
                        device,
                    };
                    let block = Moe::from_gguf(
                        &layer,
                        &mut qt,
                        moe.experts,
                        moe.routing,
                        (i, load.clone()),
                    )?;
                    let mut vector = |n: &str| -> anyhow::Result<Tensor> {
                        Ok(qt(&format!("{p}.{n}"))?.dequantize(device)?)
                    };
                    let (router_scale, expert_scale) = (
                        vector("ffn_gate_inp.scale")?,
                        vector("ffn_down_exps.scale")?,
                    );
                    let mut norm = |n: &str| vector(&format!("{n}.weight"));
                    Some(ExpertBlock::new(
                        block,
                        &router_scale,
                        expert_scale.to_vec1()?,
                        [
                            norm("pre_ffw_norm_2")?,
                            norm("post_ffw_norm_1")?,
                            norm("post_ffw_norm_2")?,
                        ],
                        config.hidden_size,
                    )?)
                }
                _ => None,
            };
            let own = has(&format!("{p}.attn_k.weight"));
            let values_are_keys = !has(&format!("{p}.attn_v.weight"));
            let names: &[&str] = match (own, values_are_keys) {
                (false, _) => &["attn_q"],
                (true, true) => &["attn_q", "attn_k"],
                (true, false) => &["attn_q", "attn_k", "attn_v"],
            };
            let ws = names
                .iter()
                .map(|n| qt(&w(n)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let qkv = Linear::stacked(ws, spec, device)?;
            let mut linear = |names: &[&str]| -> anyhow::Result<Linear> {
                let ws = names
                    .iter()
                    .map(|n| qt(&w(n)))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok(Linear::stacked(ws, spec, device)?)
            };
            let per_layer = match config.per_layer_input {
                0 => None,
                _ => Some((linear(&["inp_gate"])?, linear(&["proj"])?)),
            };
            let (o, gate_up, down) = (
                linear(&["attn_output"])?,
                linear(&["ffn_gate", "ffn_up"])?,
                linear(&["ffn_down"])?,
            );
            let mut norm =
                |n: &str| -> anyhow::Result<Tensor> { Ok(qt(&w(n))?.dequantize(device)?) };
            let weights = Layer {
                attn_norm: norm("attn_norm")?,
                qkv,
                kv: match own {
                    true => KvSource::Own {
                        values_are_keys,
                        k_norm: norm("attn_k_norm")?,
                    },
                    false => KvSource::Reused,
                },
                q_norm: norm("attn_q_norm")?,
                o,
                post_attn_norm: norm("post_attention_norm")?,
                pre_ffn_norm: norm("ffn_norm")?,
                mlp: geglu(gate_up, down),
                post_ffn_norm: norm("post_ffw_norm")?,
                experts,
                per_layer: match per_layer {
                    Some((gate, proj)) => Some(PerLayer {
                        gate,
                        proj,
                        norm: norm("post_norm")?,
                    }),
                    None => None,
                },
                scalar: match has(&w("layer_output_scale")) {
                    true => norm("layer_output_scale")?
                        .flatten_all()?
                        .to_vec1::<f32>()?[0] as f64,
                    false => 1.0,
                },
            };
            layers.push(weights);
        }
        let norm = qt("output_norm.weight")?.dequantize(device)?;
        let global_inv = config.global_inv_freq(freq_factors.as_deref());
        Ok(Self::assemble(
            config,
            context,
            (embed, per_layer_inputs),
            layers,
            (norm, lm_head),
            global_inv,
            KvDtype::F16,
            device,
        )?)
    }

    /// From a checkpoint: `model.` names, or the multimodal one's
    /// `model.language_model.` (its vision and audio towers not read).
    pub fn from_safetensors(
        config_json: &str,
        vb: VarBuilder,
        spec: WeightSpec,
        context: Option<usize>,
    ) -> anyhow::Result<Self> {
        let (config, tied) = Config::from_hf(config_json)?;
        let device = vb.device().clone();
        let root = match vb.contains_tensor("model.language_model.embed_tokens.weight") {
            true => "model.language_model",
            false => "model",
        };
        let f32_tensor = |name: &str| vb.get_unchecked_dtype(name, DType::F32);
        let linear = |names: &[String]| -> Result<Linear> {
            let ws = names
                .iter()
                .map(|n| vb.get_unchecked(&format!("{n}.weight")))
                .collect::<Result<Vec<_>>>()?;
            Linear::dense(Tensor::cat(&ws, 0)?, None, spec)
        };
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed = Embedding::Dense(f32_tensor(&embed_name)?);
        let per_layer_inputs = match config.per_layer_input {
            0 => None,
            _ => Some(PerLayerInputs {
                embed: Embedding::Dense(f32_tensor(&format!(
                    "{root}.embed_tokens_per_layer.weight"
                ))?),
                proj: linear(&[format!("{root}.per_layer_model_projection")])?,
                norm: f32_tensor(&format!("{root}.per_layer_projection_norm.weight"))?,
            }),
        };
        let load = expert_load(&config);
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("{root}.layers.{i}");
            let a = format!("{p}.self_attn");
            let at = |n: &str| format!("{a}.{n}");
            // A reusing layer's checkpoint may still hold k/v projections,
            // which transformers ignores.
            let own = config.cache_layer(i) == Some(i);
            let values_are_keys = !vb.contains_tensor(&at("v_proj.weight"));
            let names = match (own, values_are_keys) {
                (false, _) => vec![at("q_proj")],
                (true, true) => vec![at("q_proj"), at("k_proj")],
                (true, false) => vec![at("q_proj"), at("k_proj"), at("v_proj")],
            };
            let norm = |n: &str| f32_tensor(&format!("{p}.{n}.weight"));
            let per_layer = match config.per_layer_input {
                0 => None,
                _ => Some(PerLayer {
                    gate: linear(&[format!("{p}.per_layer_input_gate")])?,
                    proj: linear(&[format!("{p}.per_layer_projection")])?,
                    norm: norm("post_per_layer_input_norm")?,
                }),
            };
            let mlp = format!("{p}.mlp");
            let experts = match (&config.moe, &load) {
                (Some(moe), Some(load)) => {
                    let get = |n: &str| vb.get_unchecked(&format!("{p}.{n}"));
                    // `[experts, 2 * ff, hidden]`, gate rows first; `[experts, hidden, ff]`.
                    let (gate_up, down) = (get("experts.gate_up_proj")?, get("experts.down_proj")?);
                    let ff = gate_up.dim(1)? / 2;
                    let each = |t: &Tensor, from: usize, len: usize| -> Result<Vec<Tensor>> {
                        (0..moe.experts)
                            .map(|e| t.get(e)?.narrow(0, from, len)?.contiguous())
                            .collect()
                    };
                    let hidden = down.dim(1)?;
                    let block = Moe {
                        router: Linear::dense(
                            vb.get_unchecked_dtype(&format!("{p}.router.proj.weight"), DType::F32)?,
                            None,
                            WeightFormat::Native.into(),
                        )?,
                        routing: moe.routing,
                        experts: Experts::from_dense(
                            each(&gate_up, 0, ff)?,
                            each(&gate_up, ff, ff)?,
                            each(&down, 0, hidden)?,
                            spec,
                        )?,
                        act: Act::GeluTanh,
                        bias: None,
                        expert_scale: None,
                        shared: None,
                        layer: i,
                        load: load.clone(),
                    };
                    Some(ExpertBlock::new(
                        block,
                        &f32_tensor(&format!("{p}.router.scale"))?,
                        f32_tensor(&format!("{p}.router.per_expert_scale"))?.to_vec1()?,
                        [
                            norm("pre_feedforward_layernorm_2")?,
                            norm("post_feedforward_layernorm_1")?,
                            norm("post_feedforward_layernorm_2")?,
                        ],
                        config.hidden_size,
                    )?)
                }
                _ => None,
            };
            layers.push(Layer {
                attn_norm: norm("input_layernorm")?,
                qkv: linear(&names)?,
                kv: match own {
                    true => KvSource::Own {
                        values_are_keys,
                        k_norm: f32_tensor(&at("k_norm.weight"))?,
                    },
                    false => KvSource::Reused,
                },
                q_norm: f32_tensor(&at("q_norm.weight"))?,
                o: linear(&[at("o_proj")])?,
                post_attn_norm: norm("post_attention_layernorm")?,
                pre_ffn_norm: norm("pre_feedforward_layernorm")?,
                mlp: geglu(
                    linear(&[format!("{mlp}.gate_proj"), format!("{mlp}.up_proj")])?,
                    linear(&[format!("{mlp}.down_proj")])?,
                ),
                post_ffn_norm: norm("post_feedforward_layernorm")?,
                experts,
                per_layer,
                scalar: f32_tensor(&format!("{p}.layer_scalar"))?
                    .flatten_all()?
                    .to_vec1::<f32>()?[0] as f64,
            });
        }
        let head = match tied {
            true => embed_name,
            false => "lm_head.weight".to_string(),
        };
        let lm_head = Linear::dense(vb.get_unchecked(&head)?, None, spec)?;
        let norm = f32_tensor(&format!("{root}.norm.weight"))?;
        let global_inv = config.global_inv_freq(None);
        let kv_dtype = KvDtype::for_weights(vb.dtype());
        Ok(Self::assemble(
            config,
            context,
            (embed, per_layer_inputs),
            layers,
            (norm, lm_head),
            global_inv,
            kv_dtype,
            &device,
        )?)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        mut config: Config,
        context: Option<usize>,
        (embed, per_layer_inputs): (Embedding, Option<PerLayerInputs>),
        mut layers: Vec<Layer>,
        (norm, mut lm_head): (Tensor, Linear),
        global_inv: Vec<f32>,
        kv_dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        if let Some(n) = context.filter(|&n| n > 0) {
            config.max_context = config.max_context.min(n);
        }
        for (i, l) in layers.iter_mut().enumerate() {
            // The attention's scale is 1: √d on the query norm cancels the
            // kernels' 1/√d (RoPE's rotation leaves it in proportion).
            l.q_norm = (&l.q_norm * (config.heads(i).head_dim as f64).sqrt())?;
        }
        let expert_load = layers
            .iter()
            .find_map(|l| l.experts.as_ref().map(|b| b.moe.load.clone()));
        crate::quant::share_pages(
            layers
                .iter_mut()
                .flat_map(|l| {
                    let [up, down] = l.mlp.linears_mut();
                    [&mut l.qkv, &mut l.o, up, down]
                        .into_iter()
                        .chain(l.experts.as_mut().map(|b| &mut b.moe.router))
                })
                .chain([&mut lm_head])
                .flat_map(Linear::own_matrices),
        );
        let rope = |inv: &[f32], head_dim: usize| {
            Rope::new(inv, head_dim, 1.0, config.max_context, false, device)
        };
        let local_rope = rope(&config.local_inv_freq(), config.local.head_dim)?;
        let global_rope = rope(&global_inv, config.global.head_dim)?;
        let ones = |d: usize| Tensor::ones(d, DType::F32, device);
        let first_shared = config.first_shared();
        let info = ModelInfo {
            num_layers: first_shared,
            num_heads: config.num_heads,
            num_kv_heads: config.global.num_kv_heads,
            head_dim: config.global.head_dim,
            vocab_size: config.vocab_size,
            max_context: config.max_context,
            kv_dtype,
            window_layers: (0..first_shared).filter(|&i| config.sliding[i]).collect(),
            sliding_window: Some(config.sliding_window),
            window_kv: Some(KvShape {
                num_kv_heads: config.local.num_kv_heads,
                head_dim: config.local.head_dim,
            })
            .filter(|_| config.local != config.global),
        };
        Ok(Gemma4 {
            expert_load,
            local_ones: ones(config.local.head_dim)?,
            global_ones: ones(config.global.head_dim)?,
            info,
            device: device.clone(),
            embed,
            per_layer_inputs,
            layers,
            norm,
            lm_head,
            local_rope,
            global_rope,
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `[T, layers * per_layer_input]`: each token's per-layer inputs, from
    /// its embedding `x` (already scaled) and its own per-layer rows.
    fn per_layer_inputs(&self, p: &PerLayerInputs, meta: &StepMeta, x: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (t, n) = (x.dim(0)?, c.per_layer_input);
        let eps = c.rms_norm_eps as f32;
        let own = (p.embed.forward(meta.tokens(), &meta.tokens_t()?)? * (n as f64).sqrt())?;
        let projected = (p.proj.forward(x)? * (c.hidden_size as f64).powf(-0.5))?;
        let projected =
            candle_nn::ops::rms_norm(&projected.reshape((t * c.num_layers, n))?, &p.norm, eps)?
                .reshape((t, c.num_layers * n))?;
        elementwise::add(&projected, &own)? * 0.5f64.sqrt()
    }
}

impl ExpertBlock {
    /// From the router's per-channel `router_scale`, the experts' own
    /// scales and the three norms (before the experts, after the dense MLP,
    /// after the experts).
    fn new(
        mut moe: Moe,
        router_scale: &Tensor,
        expert_scale: Vec<f32>,
        [pre_norm, post_dense_norm, post_experts_norm]: [Tensor; 3],
        hidden: usize,
    ) -> Result<Self> {
        if expert_scale.len() != moe.experts.count() {
            candle_core::bail!(
                "{} expert scales for {} experts",
                expert_scale.len(),
                moe.experts.count()
            );
        }
        moe.act = Act::GeluTanh;
        moe.expert_scale = Some(expert_scale);
        Ok(ExpertBlock {
            moe,
            router_norm: (router_scale * (hidden as f64).powf(-0.5))?,
            pre_norm,
            post_dense_norm,
            post_experts_norm,
        })
    }
}

/// Counters of rows routed per layer and expert, for a mixture of experts.
fn expert_load(config: &Config) -> Option<Arc<ExpertLoad>> {
    let moe = config.moe.as_ref()?;
    Some(Arc::new(ExpertLoad::new(config.num_layers, moe.experts)))
}

/// RMS-norms each `head_dim`-wide head of `[T, n * head_dim]` rows by `w`.
fn norm_heads(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let (t, width) = x.dims2()?;
    let d = w.dim(0)?;
    candle_nn::ops::rms_norm(&x.contiguous()?.reshape((t * width / d, d))?, w, eps)?
        .reshape((t, width))
}

impl Model for Gemma4 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn expert_load(&self) -> Option<Arc<ExpertLoad>> {
        self.expert_load.clone()
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn forward_all(&self, meta: &StepMeta, cache: &mut KvCache) -> Result<Output> {
        let c = &self.config;
        let batch = meta.batch();
        let eps = c.rms_norm_eps as f32;
        let positions = meta.positions_t()?;
        let mut x = (self.embed.forward(meta.tokens(), &meta.tokens_t()?)?
            * (c.hidden_size as f64).sqrt())?;
        let per_layer = match &self.per_layer_inputs {
            Some(p) => Some(self.per_layer_inputs(p, meta, &x)?),
            None => None,
        };
        // This step's roped K/V rows of each layer that others reuse.
        let mut kept: Vec<Option<Tensor>> = vec![None; c.num_layers];
        let norm = |x: &Tensor, w: &Tensor| candle_nn::ops::rms_norm(x, w, eps);
        for (i, l) in self.layers.iter().enumerate() {
            let heads = c.heads(i);
            let (hd, nh, nkv) = (heads.head_dim, c.num_heads, heads.num_kv_heads);
            let (rope, ones) = match c.sliding[i] {
                true => (&self.local_rope, &self.local_ones),
                false => (&self.global_rope, &self.global_ones),
            };
            let source = c.cache_layer(i).expect("checked at load");
            let h = norm(&x, &l.attn_norm)?;
            let p = l.qkv.forward(&h)?;
            let q = norm_heads(&p.narrow(1, 0, nh * hd)?, &l.q_norm, eps)?;
            let rows = match &l.kv {
                KvSource::Own {
                    values_are_keys,
                    k_norm,
                } => {
                    let kv_dim = nkv * hd;
                    let k_raw = p.narrow(1, nh * hd, kv_dim)?;
                    let v_raw = match values_are_keys {
                        true => k_raw.clone(),
                        false => p.narrow(1, (nh + nkv) * hd, kv_dim)?,
                    };
                    let k = norm_heads(&k_raw, k_norm, eps)?;
                    let v = norm_heads(&v_raw, ones, eps)?;
                    let rows = Tensor::cat(&[q, k, v], 1)?;
                    let rows = rope.apply(&rows, meta.positions(), &positions, nh + nkv)?;
                    if c.kv_shared_layers > 0 {
                        kept[i] = Some(rows.narrow(1, nh * hd, 2 * kv_dim)?);
                    }
                    rows
                }
                KvSource::Reused => {
                    let q = rope.apply(&q, meta.positions(), &positions, nh)?;
                    let Some(kv) = &kept[source] else {
                        candle_core::bail!("layer {i} reuses layer {source}'s K/V, not computed");
                    };
                    Tensor::cat(&[&q, kv], 1)?
                }
            };
            let dims = AttnDims {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: cache.layout().block_size,
                window: c.sliding[i].then_some(c.sliding_window),
            };
            let attn = paged_attention(&rows, cache.layer_mut(source), meta, dims, None)?;
            x = elementwise::add(&x, &norm(&l.o.forward(&attn)?, &l.post_attn_norm)?)?;
            let h = norm(&x, &l.pre_ffn_norm)?;
            let mut y = l.mlp.forward(&h)?;
            if let Some(b) = &l.experts {
                let routed = norm(&x, &b.router_norm)?;
                let experts = b.moe.forward_routed(&routed, &norm(&x, &b.pre_norm)?)?;
                y = elementwise::add(
                    &norm(&y, &b.post_dense_norm)?,
                    &norm(&experts, &b.post_experts_norm)?,
                )?;
            }
            x = elementwise::add(&x, &norm(&y, &l.post_ffn_norm)?)?;
            if let (Some(pl), Some(inputs)) = (&l.per_layer, &per_layer) {
                let n = c.per_layer_input;
                let gate = elementwise::gelu(&pl.gate.forward(&x)?)?;
                let y = (gate * inputs.narrow(1, i * n, n)?)?;
                x = elementwise::add(&x, &norm(&pl.proj.forward(&y)?, &pl.norm)?)?;
            }
            if l.scalar != 1.0 {
                x = (x * l.scalar)?;
            }
        }
        let hidden = hidden_states(&x, batch, &self.device, |h| norm(h, &self.norm))?;
        if meta.num_logit_rows() == 0 {
            let logits = Tensor::zeros((0, c.vocab_size), DType::F32, &self.device)?;
            return Ok(Output { logits, hidden });
        }
        let x = norm(&x.index_select(&meta.logit_rows_t()?, 0)?, &self.norm)?;
        let logits = self.lm_head.forward(&x)?;
        let logits = match c.final_logit_softcap {
            Some(cap) => ((logits / cap as f64)?.tanh()? * cap as f64)?,
            None => logits,
        };
        Ok(Output { logits, hidden })
    }
}
