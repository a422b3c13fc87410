//! Qwen3.5 (`qwen3_5`, text model `qwen3_5_text`): a hybrid decoder whose
//! layers (`layer_types`) are either gated full attention or gated-DeltaNet
//! linear attention, each followed by a SwiGLU MLP, with (1 + w) RMSNorms.
//! Qwen3.5-MoE and Qwen3.6-MoE (`qwen3_5_moe`) are the same layers with a
//! [`Moe`] in place of every MLP: experts renormalized over the top k, and a
//! shared expert with its sigmoid gate.
//!
//! Full-attention layers: q/k RMSNorms per head, RoPE on the leading
//! `partial_rotary_factor` of each head (the multimodal RoPE of the
//! checkpoint is plain RoPE for text, whose three position rows are
//! equal), paged attention over the KV pool, and the attention output
//! scaled by `sigmoid(gate)`, a second half of each query head's
//! projection. The KV pool has one layer per full-attention layer (about a
//! quarter of the layers): the others keep no K/V at all.
//!
//! Linear-attention layers: the input projection, the gated delta rule
//! ([`GatedDelta`]: a causal conv, then a per-head recurrent state), and
//! the output projection. The conv's last inputs and each head's state are
//! the sequence's recurrent state, kept in its state slot
//! ([`crate::engine::state_slots`]) between steps: a prompt chunk carries
//! on from where the last one stopped. On the CPU the slots are host
//! memory; on a CUDA device they are one device pool, updated in place by
//! `gated_delta.cu` (where its kernels take the heads' shape; otherwise
//! the rows are copied to the host and back).
//!
//! It loads from a Hugging Face checkpoint or from a GGUF file
//! (`general.architecture` `qwen35` or `qwen35moe`, as llama.cpp's converter
//! writes it):
//! the converter stores the (1 + w) norms already shifted, `A_log` as
//! `-exp(A_log)`, the conv as `[conv_dim, kernel]` and the linear layers'
//! value heads in tiled order (value head `j` reads key head
//! `j % key_heads`, not `j / (value_heads / key_heads)`), which the model
//! follows rather than undoes, since a quantized `ssm_out` cannot have its
//! columns reordered.

use std::borrow::Cow;
use std::io::{Read, Seek};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, QStorage, QTensor};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::elementwise::{self, Act};
use super::embedding::Embedding;
use super::ffn::Ffn;
use super::gated_delta::{self, DeltaDims, GatedDelta, StepStates};
use super::linear::{Linear, WeightSpec};
use super::mlp::{Activation, Mlp};
use super::moe::{ExpertLoad, GgufLayer, Moe, MoeConfig, Routing};
use super::rope::Rope;
use super::{hidden_states, read_tensor, Gguf, Model, ModelInfo, Output, SeqSlice};
use crate::attention::{paged_attention, AttnDims};
use crate::kv::cache::{KvCache, KvDtype};
use crate::kv::state_store::{DeviceStates, StateStore};
use crate::kv::step_meta::StepMeta;

/// A layer's token mixer, as `layer_types` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    FullAttention,
    LinearAttention,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: Vec<LayerKind>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    /// Leading dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    pub max_context: usize,
    pub vocab_size: usize,
    /// The linear-attention layers' causal conv taps, and their heads:
    /// `linear_k_heads` query/key heads of `linear_k_dim`, each serving
    /// `linear_v_heads / linear_k_heads` value heads of `linear_v_dim`.
    pub conv_kernel: usize,
    pub linear_k_heads: usize,
    pub linear_v_heads: usize,
    pub linear_k_dim: usize,
    pub linear_v_dim: usize,
    /// Value heads in llama.cpp's tiled order (`[G0_v0, G1_v0, G0_v1, ...]`
    /// for key heads G): value head `j` reads key head `j % key_heads`.
    /// Hugging Face checkpoints group them by key head instead
    /// (`j / (value_heads / key_heads)`).
    pub v_heads_tiled: bool,
    /// Qwen3.5-MoE's experts, in every layer.
    pub moe: Option<MoeConfig>,
}

/// The fields of a Qwen3.5 text `config.json` (or of a multimodal one's
/// `text_config`) that wick reads.
#[derive(Deserialize)]
struct HfConfig {
    hidden_size: usize,
    /// The dense MLPs' width (none in Qwen3.5-MoE).
    #[serde(default)]
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    max_position_embeddings: usize,
    vocab_size: usize,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    rope_parameters: Option<serde_json::Value>,
    rope_theta: Option<f32>,
    partial_rotary_factor: Option<f32>,
    #[serde(default)]
    attention_bias: bool,
    hidden_act: Option<String>,
    linear_conv_kernel_dim: usize,
    linear_key_head_dim: usize,
    linear_value_head_dim: usize,
    linear_num_key_heads: usize,
    linear_num_value_heads: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
}

impl Config {
    /// From `config.json`: a `qwen3_5_text` one, or a `qwen3_5` one whose
    /// `text_config` describes the language model. Also says whether the
    /// LM head is tied to the embeddings.
    pub fn from_hf(json: &str) -> anyhow::Result<(Self, bool)> {
        let mut v: serde_json::Value = serde_json::from_str(json)?;
        let tied_outer = v.get("tie_word_embeddings").and_then(|t| t.as_bool());
        if let Some(text) = v.get_mut("text_config").map(serde_json::Value::take) {
            v = text;
        }
        let c: HfConfig = serde_json::from_value(v)?;
        anyhow::ensure!(
            !c.attention_bias,
            "attention_bias is not supported for qwen3_5"
        );
        if let Some(act) = c.hidden_act.as_deref().filter(|&a| a != "silu") {
            anyhow::bail!("hidden activation {act:?} is not supported (only \"silu\")");
        }
        let layers: Vec<LayerKind> = match &c.layer_types {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(LayerKind::FullAttention),
                    "linear_attention" => Ok(LayerKind::LinearAttention),
                    other => anyhow::bail!("layer type {other:?} is not supported"),
                })
                .collect::<anyhow::Result<_>>()?,
            None => {
                let n = c.full_attention_interval.unwrap_or(4).max(1);
                (0..c.num_hidden_layers)
                    .map(|i| match (i + 1) % n {
                        0 => LayerKind::FullAttention,
                        _ => LayerKind::LinearAttention,
                    })
                    .collect()
            }
        };
        anyhow::ensure!(
            layers.len() == c.num_hidden_layers,
            "layer_types names {} layers of {}",
            layers.len(),
            c.num_hidden_layers
        );
        anyhow::ensure!(
            layers.contains(&LayerKind::FullAttention),
            "a qwen3_5 model without a full-attention layer is not supported"
        );
        anyhow::ensure!(
            c.linear_num_key_heads > 0
                && c.linear_num_value_heads
                    .is_multiple_of(c.linear_num_key_heads),
            "{} linear value heads do not split among {} key heads",
            c.linear_num_value_heads,
            c.linear_num_key_heads
        );
        let (mut rope_theta, mut partial) = (
            c.rope_theta.unwrap_or(10_000_000.0),
            c.partial_rotary_factor.unwrap_or(0.25),
        );
        if let Some(p) = &c.rope_parameters {
            if let Some(t) = p.get("rope_theta").and_then(|t| t.as_f64()) {
                rope_theta = t as f32;
            }
            if let Some(f) = p.get("partial_rotary_factor").and_then(|f| f.as_f64()) {
                partial = f as f32;
            }
            let kind = p
                .get("rope_type")
                .and_then(|t| t.as_str())
                .unwrap_or("default");
            anyhow::ensure!(
                kind == "default",
                "rope_type {kind:?} is not supported for qwen3_5 (only \"default\")"
            );
        }
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads);
        let rope_dim = ((head_dim as f32 * partial) as usize) & !1;
        let config = Config {
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta,
            rope_dim,
            max_context: c.max_position_embeddings,
            vocab_size: c.vocab_size,
            conv_kernel: c.linear_conv_kernel_dim,
            linear_k_heads: c.linear_num_key_heads,
            linear_v_heads: c.linear_num_value_heads,
            linear_k_dim: c.linear_key_head_dim,
            linear_v_dim: c.linear_value_head_dim,
            v_heads_tiled: false,
            // transformers renormalizes Qwen3.5-MoE's top k always.
            moe: c.num_experts.filter(|&n| n > 0).map(|experts| MoeConfig {
                experts,
                routing: Routing {
                    top_k: c.num_experts_per_tok.unwrap_or(8),
                    renormalize: true,
                },
                dense_layers: Vec::new(),
            }),
        };
        Ok((config, tied_outer.unwrap_or(c.tie_word_embeddings)))
    }

    /// From a `qwen35` GGUF file's metadata (llama.cpp's keys: the linear
    /// layers' sizes under `ssm.*`, which layers are recurrent in
    /// `attention.recurrent_layers`). `block_count` counts a multi-token
    /// prediction block too, which `nextn_predict_layers` says and wick
    /// does not run.
    pub fn from_gguf(content: &gguf_file::Content) -> anyhow::Result<Self> {
        // `qwen35`, or `qwen35moe`.
        let arch = super::gguf_architecture(content);
        let get = |key: &str| content.metadata.get(&format!("{arch}.{key}"));
        let md = |key: &str| get(key).ok_or_else(|| anyhow::anyhow!("GGUF lacks {arch}.{key}"));
        let usize_of = |key: &str| -> anyhow::Result<usize> { Ok(md(key)?.to_u32()? as usize) };
        let nextn = get("nextn_predict_layers").map_or(Ok(0), |v| v.to_u32())? as usize;
        let num_layers = usize_of("block_count")?
            .checked_sub(nextn)
            .ok_or_else(|| anyhow::anyhow!("{arch}.nextn_predict_layers exceeds block_count"))?;
        let layers: Vec<LayerKind> = match get("attention.recurrent_layers") {
            Some(gguf_file::Value::Array(flags)) => flags
                .iter()
                .take(num_layers)
                .map(|f| match f.to_bool()? {
                    true => Ok(LayerKind::LinearAttention),
                    false => Ok(LayerKind::FullAttention),
                })
                .collect::<anyhow::Result<_>>()?,
            Some(other) => anyhow::bail!("{arch}.attention.recurrent_layers is {other:?}"),
            None => {
                let n = get("full_attention_interval").map_or(Ok(4), |v| v.to_u32())? as usize;
                (0..num_layers)
                    .map(|i| match (i + 1) % n.max(1) {
                        0 => LayerKind::FullAttention,
                        _ => LayerKind::LinearAttention,
                    })
                    .collect()
            }
        };
        anyhow::ensure!(
            layers.len() == num_layers,
            "{arch}.attention.recurrent_layers names {} layers of {num_layers}",
            layers.len()
        );
        anyhow::ensure!(
            layers.contains(&LayerKind::FullAttention),
            "a qwen35 model without a full-attention layer is not supported"
        );
        if let Some(kind) = get("rope.scaling.type") {
            let kind = kind.to_string()?;
            anyhow::ensure!(
                kind == "none",
                "{arch}.rope.scaling.type {kind:?} is not supported"
            );
        }
        let hidden_size = usize_of("embedding_length")?;
        let num_heads = usize_of("attention.head_count")?;
        let head_dim = match get("attention.key_length") {
            Some(v) => v.to_u32()? as usize,
            None => hidden_size / num_heads,
        };
        let (k_heads, v_heads) = (
            usize_of("ssm.group_count")?,
            usize_of("ssm.time_step_rank")?,
        );
        anyhow::ensure!(
            k_heads > 0 && v_heads.is_multiple_of(k_heads),
            "{v_heads} linear value heads do not split among {k_heads} key heads"
        );
        let inner = usize_of("ssm.inner_size")?;
        anyhow::ensure!(
            inner.is_multiple_of(v_heads),
            "{arch}.ssm.inner_size {inner} is not {v_heads} value heads"
        );
        let vocab_size = match get("vocab_size") {
            Some(v) => v.to_u32()? as usize,
            None => content
                .tensor_infos
                .get("token_embd.weight")
                .ok_or_else(|| anyhow::anyhow!("the file has no tensor token_embd.weight"))?
                .shape
                .dims()[0],
        };
        Ok(Config {
            hidden_size,
            // Qwen3.5-MoE's files give only the experts' width.
            intermediate_size: usize_of("feed_forward_length").unwrap_or(0),
            layers,
            num_heads,
            num_kv_heads: usize_of("attention.head_count_kv")?,
            head_dim,
            rms_norm_eps: md("attention.layer_norm_rms_epsilon")?.to_f32()? as f64,
            rope_theta: get("rope.freq_base").map_or(Ok(10_000_000.0), |v| v.to_f32())?,
            rope_dim: match get("rope.dimension_count") {
                Some(v) => v.to_u32()? as usize,
                None => head_dim / 4,
            },
            max_context: usize_of("context_length")?,
            vocab_size,
            conv_kernel: usize_of("ssm.conv_kernel")?,
            linear_k_heads: k_heads,
            linear_v_heads: v_heads,
            linear_k_dim: usize_of("ssm.state_size")?,
            linear_v_dim: inner / v_heads,
            v_heads_tiled: true,
            // llama.cpp renormalizes `qwen35moe`'s top k, as transformers does.
            moe: match get("expert_count").map(|v| v.to_u32()).transpose()? {
                None | Some(0) => None,
                Some(experts) => Some(MoeConfig {
                    experts: experts as usize,
                    routing: Routing {
                        top_k: usize_of("expert_used_count")?,
                        renormalize: true,
                    },
                    dense_layers: Vec::new(),
                }),
            },
        })
    }

    /// The linear-attention layers' shape.
    fn delta_dims(&self) -> DeltaDims {
        DeltaDims {
            conv_kernel: self.conv_kernel,
            k_heads: self.linear_k_heads,
            v_heads: self.linear_v_heads,
            k_dim: self.linear_k_dim,
            v_dim: self.linear_v_dim,
            v_heads_tiled: self.v_heads_tiled,
            eps: self.rms_norm_eps as f32,
        }
    }

    /// Channels of the linear layers' conv: q, k and v.
    fn conv_dim(&self) -> usize {
        self.delta_dims().conv_dim()
    }

    /// f32 of one linear layer's state.
    fn linear_state_len(&self) -> usize {
        self.delta_dims().state_len()
    }

    fn num_linear_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|&&k| k == LayerKind::LinearAttention)
            .count()
    }
}

struct FullAttention {
    /// q, k, v, then the output gate, stacked:
    /// `[(2 * heads + 2 * kv_heads) * head_dim, hidden]`.
    qkvg: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
    o: Linear,
    /// Its layer in the KV pool.
    kv_layer: usize,
}

struct LinearAttention {
    /// q/k/v (the conv's input), z, b and a, stacked.
    in_proj: Linear,
    delta: GatedDelta,
    out_proj: Linear,
    /// Where its state starts within a slot.
    state_at: usize,
}

enum Mixer {
    Full(FullAttention),
    Linear(LinearAttention),
}

struct Layer {
    input_norm: Tensor,
    mixer: Mixer,
    post_norm: Tensor,
    ffn: Ffn,
}

pub struct Qwen35 {
    config: Config,
    info: ModelInfo,
    device: Device,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    /// The recurrent states of the linear-attention layers, by slot.
    states: Mutex<States>,
    /// Rows routed to each expert, for Qwen3.5-MoE.
    expert_load: Option<Arc<ExpertLoad>>,
}

/// Where the slots' states live: host memory, or a pool on the GPU that
/// `gated_delta.cu` updates in place.
enum States {
    Host(StateStore),
    Device(DeviceStates),
}

/// Rows `[from, from + n)` of every `period` rows of the quantized matrix
/// `w`, stacked: a GGUF row is whole blocks, so its bytes are its row.
fn every_rows(
    w: &QTensor,
    period: usize,
    from: usize,
    n: usize,
    device: &Device,
) -> Result<QTensor> {
    let (rows, cols) = w.shape().dims2()?;
    if rows % period != 0 || from + n > period {
        candle_core::bail!(
            "cannot take rows {from}..{} of every {period} of {rows}",
            from + n
        );
    }
    let data = w.data()?;
    let row = data.len() / rows;
    let bytes: Vec<u8> = data
        .chunks_exact(period * row)
        .flat_map(|group| &group[from * row..(from + n) * row])
        .copied()
        .collect();
    QTensor::new(
        QStorage::from_data(Cow::Owned(bytes), device, w.dtype())?,
        (rows / period * n, cols),
    )
}

impl LinearAttention {
    /// `h`: `[T, hidden]` normed rows of the whole batch; `states`: each
    /// sequence's, in batch order. Returns `[T, hidden]`.
    fn forward(&self, h: &Tensor, seqs: &[SeqSlice], states: &mut StepStates) -> Result<Tensor> {
        let proj = self.in_proj.forward(h)?;
        let out = self.delta.forward(&proj, seqs, states, self.state_at)?;
        self.out_proj.forward(&out.to_dtype(h.dtype())?)
    }
}

/// What every full-attention layer of a step reads besides its rows.
struct AttnStep<'a> {
    meta: &'a StepMeta<'a>,
    /// The rows' positions on the device.
    positions: &'a Tensor,
    rope: &'a Rope,
    dims: AttnDims,
    eps: f32,
}

impl FullAttention {
    fn forward(&self, h: &Tensor, cache: &mut KvCache, step: &AttnStep) -> Result<Tensor> {
        let AttnStep {
            meta,
            positions,
            rope,
            dims,
            eps,
        } = *step;
        let (nh, nkv, hd) = (dims.num_heads, dims.num_kv_heads, dims.head_dim);
        let y = self.qkvg.forward(h)?;
        let t = y.dim(0)?;
        let width = dims.qkv_width();
        let heads = |from: usize, n: usize, w: &Tensor| -> Result<Tensor> {
            let x = y.narrow(1, from * hd, n * hd)?.contiguous()?;
            candle_nn::ops::rms_norm(&x.reshape((t * n, hd))?, w, eps)?.reshape((t, n * hd))
        };
        let qkv = Tensor::cat(
            &[
                heads(0, nh, &self.q_norm)?,
                heads(nh, nkv, &self.k_norm)?,
                y.narrow(1, (nh + nkv) * hd, nkv * hd)?,
            ],
            1,
        )?;
        let qkv = rope.apply(&qkv, meta.positions(), positions, nh + nkv)?;
        let attn = paged_attention(&qkv, cache.layer_mut(self.kv_layer), meta, dims, None)?;
        let gate = candle_nn::ops::sigmoid(&y.narrow(1, width, nh * hd)?.contiguous()?)?;
        self.o.forward(&(attn * gate)?)
    }
}

impl Qwen35 {
    /// From a Hugging Face checkpoint: `config.json` text and its weights
    /// (`model.` or, for the multimodal checkpoint, `model.language_model.`
    /// names; the vision tower is not read). Linear layers are held in
    /// `vb`'s dtype (or as `spec` says); norms, embeddings and the
    /// recurrence's parameters in f32. `context` caps the context.
    pub fn from_safetensors(
        config_json: &str,
        vb: VarBuilder,
        spec: WeightSpec,
        context: Option<usize>,
    ) -> anyhow::Result<Self> {
        let (mut c, tied) = Config::from_hf(config_json)?;
        if let Some(n) = context.filter(|&n| n > 0) {
            c.max_context = c.max_context.min(n);
        }
        let device = vb.device().clone();
        let root = match vb.contains_tensor("model.language_model.embed_tokens.weight") {
            true => "model.language_model",
            false => "model",
        };
        let f32_tensor = |name: &str| vb.get_unchecked_dtype(name, DType::F32);
        let host = |name: &str| -> Result<Vec<f32>> {
            f32_tensor(name)?
                .flatten_all()?
                .to_device(&Device::Cpu)?
                .to_vec1()
        };
        // Its RMSNorms scale by 1 + w.
        let norm = |name: &str| f32_tensor(name)? + 1.0;
        let dense = |names: &[String]| -> Result<Linear> {
            let ws = names
                .iter()
                .map(|n| vb.get_unchecked(n))
                .collect::<Result<Vec<_>>>()?;
            Linear::dense(Tensor::cat(&ws, 0)?, None, spec)
        };
        let (hd, nh) = (c.head_dim, c.num_heads);
        let expert_load = c
            .moe
            .as_ref()
            .map(|m| Arc::new(ExpertLoad::new(c.layers.len(), m.experts)));
        let mut layers = Vec::with_capacity(c.layers.len());
        for (i, kind) in c.layers.iter().enumerate() {
            let p = format!("{root}.layers.{i}");
            let mixer = match kind {
                LayerKind::FullAttention => {
                    let a = format!("{p}.self_attn");
                    // q_proj interleaves each head's query and gate rows.
                    let q = vb.get_unchecked(&format!("{a}.q_proj.weight"))?;
                    let q = q.reshape((nh, 2 * hd, c.hidden_size))?;
                    let half = |from: usize| -> Result<Tensor> {
                        q.narrow(1, from, hd)?.reshape((nh * hd, c.hidden_size))
                    };
                    let (k, v) = (
                        vb.get_unchecked(&format!("{a}.k_proj.weight"))?,
                        vb.get_unchecked(&format!("{a}.v_proj.weight"))?,
                    );
                    let w = Tensor::cat(&[half(0)?, k, v, half(hd)?], 0)?;
                    Mixer::Full(FullAttention {
                        qkvg: Linear::dense(w, None, spec)?,
                        q_norm: norm(&format!("{a}.q_norm.weight"))?,
                        k_norm: norm(&format!("{a}.k_norm.weight"))?,
                        o: dense(&[format!("{a}.o_proj.weight")])?,
                        // Numbered by `assemble`.
                        kv_layer: 0,
                    })
                }
                LayerKind::LinearAttention => {
                    let a = format!("{p}.linear_attn");
                    let conv = host(&format!("{a}.conv1d.weight"))?;
                    anyhow::ensure!(
                        conv.len() == c.conv_dim() * c.conv_kernel,
                        "{a}.conv1d.weight has {} values for {} channels of {} taps",
                        conv.len(),
                        c.conv_dim(),
                        c.conv_kernel
                    );
                    Mixer::Linear(LinearAttention {
                        in_proj: dense(
                            &["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]
                                .map(|n| format!("{a}.{n}.weight")),
                        )?,
                        delta: GatedDelta::new(
                            c.delta_dims(),
                            conv,
                            host(&format!("{a}.A_log"))?
                                .into_iter()
                                .map(|x| -x.exp())
                                .collect(),
                            host(&format!("{a}.dt_bias"))?,
                            host(&format!("{a}.norm.weight"))?,
                            &device,
                        )?,
                        out_proj: dense(&[format!("{a}.out_proj.weight")])?,
                        // Placed by `assemble`.
                        state_at: 0,
                    })
                }
            };
            let m = format!("{p}.mlp");
            let ffn = match (&c.moe, &expert_load) {
                (Some(moe), Some(load)) => Ffn::Experts(Box::new(Moe::from_hf(
                    &vb,
                    &m,
                    moe.experts,
                    moe.routing,
                    (i, load.clone()),
                    spec,
                )?)),
                _ => Ffn::Dense(Mlp::new(
                    dense(&[
                        format!("{m}.gate_proj.weight"),
                        format!("{m}.up_proj.weight"),
                    ])?,
                    dense(&[format!("{m}.down_proj.weight")])?,
                    Activation::Glu(Act::Silu),
                )),
            };
            layers.push(Layer {
                input_norm: norm(&format!("{p}.input_layernorm.weight"))?,
                mixer,
                post_norm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
                ffn,
            });
        }
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed = Embedding::Dense(f32_tensor(&embed_name)?);
        let head = match tied || !vb.contains_tensor("lm_head.weight") {
            true => embed_name,
            false => "lm_head.weight".to_string(),
        };
        let lm_head = Linear::dense(vb.get_unchecked(&head)?, None, spec)?;
        let norm = norm(&format!("{root}.norm.weight"))?;
        let kv_dtype = KvDtype::for_weights(vb.dtype());
        Ok(Self::assemble(
            c, embed, layers, norm, lm_head, kv_dtype, device,
        )?)
    }

    /// From a `qwen35` GGUF file (llama.cpp's tensor names; see the module
    /// comment for how its converter stores them). `context` caps the
    /// context. A multi-token-prediction block, if the file has one, is
    /// not read.
    pub fn from_gguf<R: Read + Seek>(
        content: &Gguf,
        reader: &mut R,
        spec: WeightSpec,
        context: Option<usize>,
        device: &Device,
    ) -> anyhow::Result<Self> {
        let mut c = Config::from_gguf(content)?;
        if let Some(n) = context.filter(|&n| n > 0) {
            c.max_context = c.max_context.min(n);
        }
        // Every tensor error names the tensor and its block type.
        let reader = std::cell::RefCell::new(reader);
        let qt = |name: &str| -> anyhow::Result<QTensor> {
            read_tensor(content, &mut **reader.borrow_mut(), name, device)
        };
        // A vector (norm weights, per-head parameters, the conv) of `len`
        // values, on the host.
        let host = |name: &str, len: usize| -> anyhow::Result<Vec<f32>> {
            let v = qt(name)?
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            anyhow::ensure!(v.len() == len, "{name} has {} values, not {len}", v.len());
            Ok(v)
        };
        let (hd, nh) = (c.head_dim, c.num_heads);
        let embed_q = qt("token_embd.weight")?;
        let embed = Embedding::new(&embed_q, spec, device)?;
        // The head before the layers, so that the table as the file holds it
        // (`embed_q`) is dropped before they load: it would add to peak RSS.
        let output = match content.tensor_infos.contains_key("output.weight") {
            true => Some(qt("output.weight")?),
            false => None,
        };
        let lm_head = embed.lm_head(output, embed_q, spec, device)?;
        let expert_load = c
            .moe
            .as_ref()
            .map(|m| Arc::new(ExpertLoad::new(c.layers.len(), m.experts)));
        let mut layers = Vec::with_capacity(c.layers.len());
        for (i, kind) in c.layers.iter().enumerate() {
            let p = format!("blk.{i}");
            let linear = |names: &[&str]| -> anyhow::Result<Linear> {
                let ws = names
                    .iter()
                    .map(|n| qt(&format!("{p}.{n}.weight")))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Linear::stacked(ws, spec, device)
                    .map_err(|e| anyhow::anyhow!("{p}.{}: {e}", names.join("+")))
            };
            // The (1 + w) norms: the converter stored them shifted.
            let norm = |name: &str, len: usize| -> anyhow::Result<Tensor> {
                Ok(Tensor::from_vec(
                    host(&format!("{p}.{name}.weight"), len)?,
                    len,
                    device,
                )?)
            };
            let mixer = match kind {
                LayerKind::FullAttention => {
                    let (q_norm, k_norm) = (norm("attn_q_norm", hd)?, norm("attn_k_norm", hd)?);
                    // attn_q interleaves each head's query and gate rows,
                    // as the checkpoint's q_proj does.
                    let name = format!("{p}.attn_q.weight");
                    let q = qt(&name)?;
                    anyhow::ensure!(
                        q.shape().dims2()?.0 == 2 * nh * hd,
                        "{name} has {:?} for {nh} heads of query and gate of {hd}",
                        q.shape()
                    );
                    let (q, gate) = (
                        every_rows(&q, 2 * hd, 0, hd, device)?,
                        every_rows(&q, 2 * hd, hd, hd, device)?,
                    );
                    let (k, v) = (
                        qt(&format!("{p}.attn_k.weight"))?,
                        qt(&format!("{p}.attn_v.weight"))?,
                    );
                    let qkvg = Linear::stacked(vec![q, k, v, gate], spec, device)
                        .map_err(|e| anyhow::anyhow!("{p}.attn_q+k+v: {e}"))?;
                    Mixer::Full(FullAttention {
                        qkvg,
                        q_norm,
                        k_norm,
                        o: linear(&["attn_output"])?,
                        kv_layer: 0,
                    })
                }
                LayerKind::LinearAttention => {
                    let nv = c.linear_v_heads;
                    let name = format!("{p}.attn_qkv.weight");
                    let rows = content.tensor_infos.get(&name).map(|t| t.shape.dims()[0]);
                    anyhow::ensure!(
                        rows == Some(c.conv_dim()),
                        "{name} has {rows:?} rows for {} conv channels",
                        c.conv_dim()
                    );
                    // q/k/v, then z, b and a: the order of `run`'s row.
                    let in_proj = linear(&["attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"])?;
                    let host = |n: &str, len| host(&format!("{p}.{n}"), len);
                    Mixer::Linear(LinearAttention {
                        in_proj,
                        delta: GatedDelta::new(
                            c.delta_dims(),
                            // [conv_dim, kernel], as `run` reads it.
                            host("ssm_conv1d.weight", c.conv_dim() * c.conv_kernel)?,
                            // Stored as -exp(A_log) already.
                            host("ssm_a", nv)?,
                            host("ssm_dt.bias", nv)?,
                            host("ssm_norm.weight", c.linear_v_dim)?,
                            device,
                        )?,
                        out_proj: linear(&["ssm_out"])?,
                        state_at: 0,
                    })
                }
            };
            let h = c.hidden_size;
            let ffn = match (&c.moe, &expert_load) {
                (Some(moe), Some(load)) => {
                    let has = |n: &str| content.has(&format!("{p}.{n}"));
                    let gguf = GgufLayer {
                        prefix: &p,
                        has: &has,
                        spec,
                        device,
                    };
                    let mut tensor = |name: &str| qt(name);
                    let load = (i, load.clone());
                    Ffn::Experts(Box::new(Moe::from_gguf(
                        &gguf,
                        &mut tensor,
                        moe.experts,
                        moe.routing,
                        load,
                    )?))
                }
                _ => Ffn::Dense(Mlp::new(
                    linear(&["ffn_gate", "ffn_up"])?,
                    linear(&["ffn_down"])?,
                    Activation::Glu(Act::Silu),
                )),
            };
            layers.push(Layer {
                input_norm: norm("attn_norm", h)?,
                post_norm: norm("post_attention_norm", h)?,
                mixer,
                ffn,
            });
        }
        let norm = Tensor::from_vec(
            host("output_norm.weight", c.hidden_size)?,
            c.hidden_size,
            device,
        )?;
        Ok(Self::assemble(
            c,
            embed,
            layers,
            norm,
            lm_head,
            KvDtype::F16,
            device.clone(),
        )?)
    }

    /// The model from its parts, in `c`'s layer order: numbers the
    /// full-attention layers' KV pool layers and places the linear ones'
    /// states within a slot.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        c: Config,
        embed: Embedding,
        mut layers: Vec<Layer>,
        norm: Tensor,
        mut lm_head: Linear,
        kv_dtype: KvDtype,
        device: Device,
    ) -> Result<Self> {
        let (mut kv_layers, mut state_len) = (0, 0);
        for l in &mut layers {
            match &mut l.mixer {
                Mixer::Full(a) => {
                    a.kv_layer = kv_layers;
                    kv_layers += 1;
                }
                Mixer::Linear(a) => {
                    a.state_at = state_len;
                    state_len += c.linear_state_len();
                }
            }
        }
        let inv_freq: Vec<f32> = (0..c.rope_dim / 2)
            .map(|i| 1.0 / c.rope_theta.powf(2.0 * i as f32 / c.rope_dim as f32))
            .collect();
        let rope = Rope::new(&inv_freq, c.head_dim, 1.0, c.max_context, false, &device)?;
        crate::quant::share_pages(
            layers
                .iter_mut()
                .flat_map(|l| {
                    let mixer: Vec<&mut Linear> = match &mut l.mixer {
                        Mixer::Full(a) => vec![&mut a.qkvg, &mut a.o],
                        Mixer::Linear(a) => vec![&mut a.in_proj, &mut a.out_proj],
                    };
                    mixer.into_iter().chain(l.ffn.linears_mut())
                })
                .chain([&mut lm_head])
                .flat_map(Linear::own_matrices),
        );
        let info = ModelInfo {
            num_layers: kv_layers,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            max_context: c.max_context,
            kv_dtype,
            window_layers: Vec::new(),
            sliding_window: None,
            window_kv: None,
        };
        let expert_load = layers.iter().find_map(|l| match &l.ffn {
            Ffn::Experts(moe) => Some(moe.load.clone()),
            Ffn::Dense(_) => None,
        });
        // The kernels' pool where they take the heads; else host slots,
        // the rows copied over.
        let on_gpu =
            cfg!(feature = "cuda") && device.is_cuda() && gated_delta::supports(&c.delta_dims());
        let states = match on_gpu {
            true => States::Device(DeviceStates::new(state_len, &device)),
            false => States::Host(StateStore::new(state_len)),
        };
        Ok(Qwen35 {
            expert_load,
            states: Mutex::new(states),
            config: c,
            info,
            device,
            embed,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// Every sequence's state out of its host slot (`(slot, fresh)` each),
/// all or none: on an error, what was taken goes back, since a sequence's
/// state is lost only with the sequence.
fn take_all(store: &mut StateStore, slots: &[(u32, bool)]) -> Result<Vec<Vec<f32>>> {
    let mut states = Vec::with_capacity(slots.len());
    for &(slot, fresh) in slots {
        match store.take(slot, fresh) {
            Ok(state) => states.push(state),
            Err(e) => {
                for (&(slot, _), state) in slots.iter().zip(states) {
                    store.put(slot, state);
                }
                return Err(e);
            }
        }
    }
    Ok(states)
}

impl Model for Qwen35 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn expert_load(&self) -> Option<Arc<ExpertLoad>> {
        self.expert_load.clone()
    }

    fn state_bytes(&self) -> Option<usize> {
        (self.config.num_linear_layers() > 0)
            .then(|| self.config.num_linear_layers() * self.config.linear_state_len() * 4)
    }

    fn forward_all(&self, meta: &StepMeta, cache: &mut KvCache) -> Result<Output> {
        let batch = meta.batch();
        let c = &self.config;
        let dims = AttnDims {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: cache.layout().block_size,
            window: None,
        };
        let eps = c.rms_norm_eps as f32;
        let positions = meta.positions_t()?;
        // Each sequence's recurrent state, out of its slot for the step.
        let mut store = self
            .states
            .lock()
            .map_err(|_| candle_core::Error::Msg("the state store is poisoned".into()))?;
        let slots = batch
            .seqs
            .iter()
            .map(|s| {
                s.state_slot
                    .map(|slot| (slot, s.first_pos == 0))
                    .ok_or_else(|| {
                        candle_core::Error::Msg(
                            "a qwen3_5 sequence came without a recurrent-state slot".into(),
                        )
                    })
            })
            .collect::<Result<Vec<(u32, bool)>>>()?;
        let mut states = match &mut *store {
            States::Host(store) => StepStates::Host(take_all(store, &slots)?),
            States::Device(store) => {
                let ids: Vec<u32> = slots.iter().map(|&(slot, _)| slot).collect();
                StepStates::device(store.open(&slots)?, &batch.seqs, &ids)?
            }
        };
        let mut x = self.embed.forward(meta.tokens(), &meta.tokens_t()?)?;
        let step = AttnStep {
            meta,
            positions: &positions,
            rope: &self.rope,
            dims,
            eps,
        };
        // Each residual add and the norm after it are one step
        // (`add_rms_norm`: one launch on a CUDA device): `h` is the normed
        // input of the next mixer or feed-forward.
        let mut h = match self.layers.first() {
            Some(l) => candle_nn::ops::rms_norm(&x, &l.input_norm, eps)?,
            None => x.clone(),
        };
        for (i, l) in self.layers.iter().enumerate() {
            let mixed = match &l.mixer {
                Mixer::Full(a) => a.forward(&h, cache, &step)?,
                Mixer::Linear(a) => a.forward(&h, &batch.seqs, &mut states)?,
            };
            (x, h) = elementwise::add_rms_norm(&x, &mixed, &l.post_norm, eps)?;
            let y = l.ffn.forward(&h)?;
            match self.layers.get(i + 1) {
                Some(next) => (x, h) = elementwise::add_rms_norm(&x, &y, &next.input_norm, eps)?,
                None => x = elementwise::add(&x, &y)?,
            }
        }
        match (&mut *store, states) {
            (States::Host(store), StepStates::Host(states)) => {
                for (&(slot, _), state) in slots.iter().zip(states) {
                    store.put(slot, state);
                }
            }
            (States::Device(store), StepStates::Device { .. }) => store.close(&slots),
            _ => unreachable!("the step's states are the store's kind"),
        }
        drop(store);
        let hidden = hidden_states(&x, batch, &self.device, |h| {
            candle_nn::ops::rms_norm(h, &self.norm, eps)
        })?;
        if meta.num_logit_rows() == 0 {
            let logits = Tensor::zeros((0, c.vocab_size), DType::F32, &self.device)?;
            return Ok(Output { logits, hidden });
        }
        let x =
            candle_nn::ops::rms_norm(&x.index_select(&meta.logit_rows_t()?, 0)?, &self.norm, eps)?;
        Ok(Output {
            logits: self.lm_head.forward(&x)?,
            hidden,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The multimodal checkpoint's `config.json`: the language model in
    /// `text_config`, layer types from the interval, RoPE in
    /// `rope_parameters` with the multimodal sections.
    #[test]
    fn config_from_a_multimodal_checkpoint() {
        let json = serde_json::json!({
            "model_type": "qwen3_5", "tie_word_embeddings": true,
            "text_config": {
                "model_type": "qwen3_5_text", "hidden_size": 1024, "intermediate_size": 3584,
                "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
                "head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                "vocab_size": 248320, "full_attention_interval": 4, "hidden_act": "silu",
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                "linear_num_value_heads": 16,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                    "mrope_interleaved": true},
            },
        });
        let (c, tied) = Config::from_hf(&json.to_string()).unwrap();
        assert!(tied);
        let full: Vec<usize> = (0..8)
            .filter(|&i| c.layers[i] == LayerKind::FullAttention)
            .collect();
        assert_eq!(full, [3, 7]);
        assert_eq!((c.rope_dim, c.rope_theta), (64, 1e7));
        assert_eq!(c.conv_dim(), 3 * 2048);
        assert_eq!(c.linear_state_len(), 3 * 6144 + 16 * 128 * 128);
    }

    /// A converted Qwen3.5 checkpoint keeps its multi-token-prediction
    /// block as one more `blk`, counted in `block_count` and flagged
    /// non-recurrent: wick runs the layers before it.
    #[test]
    fn gguf_config_leaves_out_the_mtp_block() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/gguf-tiny/qwen35-f32.gguf"
        );
        let mut content =
            gguf_file::Content::read(&mut std::fs::File::open(path).unwrap()).unwrap();
        let plain = Config::from_gguf(&content).unwrap();
        assert!(plain.v_heads_tiled);
        assert_eq!(plain.layers.len(), 6);
        assert_eq!((plain.rope_dim, plain.linear_v_dim), (8, 16));
        let md = &mut content.metadata;
        md.insert("qwen35.block_count".into(), gguf_file::Value::U32(7));
        md.insert(
            "qwen35.nextn_predict_layers".into(),
            gguf_file::Value::U32(1),
        );
        let flags = plain
            .layers
            .iter()
            .map(|&k| gguf_file::Value::Bool(k == LayerKind::LinearAttention))
            .chain([gguf_file::Value::Bool(false)])
            .collect();
        md.insert(
            "qwen35.attention.recurrent_layers".into(),
            gguf_file::Value::Array(flags),
        );
        assert_eq!(Config::from_gguf(&content).unwrap(), plain);
    }
}
