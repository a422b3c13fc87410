//! The mixture-of-experts feed-forward block, beside the dense [`Mlp`]: a
//! router scores every expert for each row, the row goes through its top k
//! experts' gated MLPs, and their outputs are summed, weighted by the
//! router; a shared expert, where the family has one, adds its own output
//! to every row.
//!
//! Rows are grouped by expert, so each active expert multiplies once over
//! all the rows routed to it, and an expert no row chose is never read. On
//! the CPU with wick's kernels the products of all active experts run in one
//! parallel call ([`matmul_grouped`]); on a CUDA device, routing and
//! products run in `moe.cu` ([`DeviceExperts`]) for the block types it
//! reads; elsewhere (candle's kernels, dense weights on the CPU, other
//! block types on a GPU) each active expert runs as an ordinary [`Linear`].

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;

use super::elementwise::{self, gelu_tanh, silu, swiglu_oai, Act};
use super::linear::{Linear, WeightFormat, WeightSpec};
use super::mlp::{Activation, Mlp};
use super::moe_device::{DeviceExperts, ExpertStack, Extras, MoeStep};
use crate::quant::{matmul_grouped, mxfp4, GroupedJob, QuantMatrix};

/// How a row's expert weights come from the router's scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routing {
    /// Experts per row.
    pub top_k: usize,
    /// Whether the top k softmax weights are divided by their sum (Mixtral,
    /// Qwen3-MoE), or kept as they are (OLMoE, Qwen2-MoE).
    pub renormalize: bool,
}

impl Routing {
    /// Refuses a top k the experts cannot fill (a malformed file or config
    /// is the only way to get one).
    fn check(&self, experts: usize) -> Result<()> {
        if self.top_k == 0 || self.top_k > experts {
            candle_core::bail!("{} experts per token of {experts}", self.top_k);
        }
        Ok(())
    }
}

/// A model's experts, as its config or metadata gives them (a GGUF's
/// tensors say which layers have them).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    pub routing: Routing,
    /// Layers with a dense MLP instead (Qwen-MoE's `mlp_only_layers` and
    /// `decoder_sparse_step`).
    pub dense_layers: Vec<usize>,
}

/// The experts' weights: gate, up and down projections of each expert.
pub enum Experts {
    /// On wick's CPU kernels: per projection, one matrix per expert (the
    /// GGUF's stacked tensor, repacked in one buffer).
    Quant {
        gate: Vec<QuantMatrix>,
        up: Vec<QuantMatrix>,
        down: Vec<QuantMatrix>,
    },
    /// Any other representation: per expert, gate and up stacked (gate
    /// first) and down.
    Linear {
        gate_up: Vec<Linear>,
        down: Vec<Linear>,
    },
    /// On a CUDA device, stacked as the file holds them, for `moe.cu`.
    Device(DeviceExperts),
}

impl Experts {
    /// From stacked `[experts, n, k]` quantized gate, up and down tensors (a
    /// GGUF's, or a gpt-oss checkpoint's MXFP4 read as Q8_0), which
    /// `read(i)` reads (0 gate, 1 up, 2 down): repacked for wick's kernels
    /// where they run (the CPU, the file's format, a block type they hold),
    /// kept stacked for `moe.cu` on a CUDA device (the file's format, a
    /// block type it reads), else split into a [`Linear`] per expert.
    ///
    /// Each stack is repacked as soon as it is read, so that one at a time
    /// is held in the file's form: a big file loads within little more than
    /// its size. Where a stack turns out not to repack, all three are read
    /// again for the split.
    pub fn from_gguf(
        read: &mut dyn FnMut(usize) -> Result<QTensor>,
        spec: WeightSpec,
        device: &Device,
    ) -> Result<Self> {
        let counts = |ns: [usize; 3]| match ns[1..].iter().all(|&n| n == ns[0]) {
            true => Ok(()),
            false => Err(candle_core::Error::Msg(format!(
                "expert tensors of {ns:?} experts"
            ))),
        };
        if device.is_cpu() {
            let mut held = Vec::with_capacity(3);
            for i in 0..3 {
                let t = read(i)?;
                let native = match spec.format {
                    WeightFormat::Native => true,
                    WeightFormat::Q8_0 => t.dtype() == GgmlDType::Q8_0,
                    _ => false,
                };
                match native {
                    true => match QuantMatrix::stack_from_qtensor(&t)? {
                        Some(ms) => held.push(
                            ms.into_iter()
                                .map(|m| m.with_kernel(spec.kernel))
                                .collect::<Result<Vec<_>>>()?,
                        ),
                        None => break,
                    },
                    false => break,
                }
            }
            if let Ok([gate, up, down]) = <[_; 3]>::try_from(held) {
                counts([gate.len(), up.len(), down.len()])?;
                return Ok(Experts::Quant { gate, up, down });
            }
        }
        let (gate, up, down) = (read(0)?, read(1)?, read(2)?);
        counts([&gate, &up, &down].map(|t| t.shape().dims().first().copied().unwrap_or(0)))?;
        if device.is_cuda() && spec.format == WeightFormat::Native {
            let [g, u, d] = [&gate, &up, &down].map(|t| ExpertStack::from_qtensor(t, device));
            if let (Some(g), Some(u), Some(d)) = (g?, u?, d?) {
                if let Some(d) = DeviceExperts::new([g, u, d]) {
                    return Ok(Experts::Device(d));
                }
            }
        }
        let (gate, up, down) = (
            unstack(&gate, device)?,
            unstack(&up, device)?,
            unstack(&down, device)?,
        );
        let gate_up = gate
            .into_iter()
            .zip(up)
            .map(|(g, u)| Linear::stacked(vec![g, u], spec, device))
            .collect::<Result<_>>()?;
        let down = down
            .into_iter()
            .map(|d| Linear::new(d, spec, device))
            .collect::<Result<_>>()?;
        Ok(Experts::Linear { gate_up, down })
    }

    /// From each expert's dense `[n, k]` gate, up and down matrices (a
    /// safetensors checkpoint): re-quantized to Q8_0 for wick's kernels with
    /// `WeightFormat::Q8_0` on the CPU, stacked for `moe.cu` on a CUDA
    /// device in the dtype `--weights` gives, else a [`Linear`] per expert.
    pub fn from_dense(
        gate: Vec<Tensor>,
        up: Vec<Tensor>,
        down: Vec<Tensor>,
        spec: WeightSpec,
    ) -> Result<Self> {
        let cpu = gate.first().is_some_and(|g| g.device().is_cpu());
        let cuda = gate.first().is_some_and(|g| g.device().is_cuda());
        let dtype = match spec.format {
            WeightFormat::Native => gate.first().map(|g| g.dtype()),
            WeightFormat::F32 => Some(DType::F32),
            WeightFormat::Bf16 => Some(DType::BF16),
            _ => None,
        };
        if let (true, Some(dtype)) = (cuda, dtype) {
            let [g, u, d] = [&gate, &up, &down].map(|ws| ExpertStack::from_dense(ws, dtype));
            if let (Some(g), Some(u), Some(d)) = (g?, u?, d?) {
                if let Some(d) = DeviceExperts::new([g, u, d]) {
                    return Ok(Experts::Device(d));
                }
            }
        }
        if spec.format == WeightFormat::Q8_0 && cpu {
            let q8 = |ws: Vec<Tensor>| -> Result<Vec<QuantMatrix>> {
                ws.into_iter()
                    .map(|w| {
                        let (n, k) = w.dims2()?;
                        let values = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                        QuantMatrix::quantize_q8_0(&values, n, k)?.with_kernel(spec.kernel)
                    })
                    .collect()
            };
            return Ok(Experts::Quant {
                gate: q8(gate)?,
                up: q8(up)?,
                down: q8(down)?,
            });
        }
        let gate_up = gate
            .into_iter()
            .zip(up)
            .map(|(g, u)| Linear::dense(Tensor::cat(&[g, u], 0)?, None, spec))
            .collect::<Result<_>>()?;
        let down = down
            .into_iter()
            .map(|d| Linear::dense(d, None, spec))
            .collect::<Result<_>>()?;
        Ok(Experts::Linear { gate_up, down })
    }

    pub fn count(&self) -> usize {
        match self {
            Experts::Quant { gate, .. } => gate.len(),
            Experts::Linear { gate_up, .. } => gate_up.len(),
            Experts::Device(d) => d.count(),
        }
    }
}

/// Per expert, the biases of its gate, up and down projections
/// (gpt-oss's): `[ff]`, `[ff]` and `[hidden]` each.
pub struct ExpertBias {
    pub gate: Vec<Vec<f32>>,
    pub up: Vec<Vec<f32>>,
    pub down: Vec<Vec<f32>>,
}

impl ExpertBias {
    /// From `[experts, ff]`, `[experts, ff]` and `[experts, hidden]`
    /// tensors.
    pub fn new([gate, up, down]: [Tensor; 3]) -> Result<Self> {
        let rows = |t: Tensor| t.to_dtype(DType::F32)?.to_vec2::<f32>();
        Ok(ExpertBias {
            gate: rows(gate)?,
            up: rows(up)?,
            down: rows(down)?,
        })
    }

    fn check(&self, experts: usize) -> Result<()> {
        if [&self.gate, &self.up, &self.down]
            .iter()
            .any(|b| b.len() != experts)
        {
            candle_core::bail!("expert biases not of {experts} experts");
        }
        Ok(())
    }
}

/// A shared expert (Qwen2-MoE's): an MLP every row goes through, its output
/// scaled by `sigmoid(gate · x)`.
pub struct SharedExpert {
    pub mlp: Mlp,
    /// `[1, hidden]`.
    pub gate: Option<Linear>,
}

/// Rows routed to each expert of each layer since the model loaded, for
/// `/metrics`: MoE throughput follows how evenly the router spreads rows.
pub struct ExpertLoad {
    experts: usize,
    counts: Vec<AtomicU64>,
    /// Layers whose routing runs on a CUDA device count there (`[experts]`
    /// i64 each, added to by `moe.cu`), read when asked.
    device: Mutex<Vec<(usize, Tensor)>>,
}

impl ExpertLoad {
    pub fn new(layers: usize, experts: usize) -> Self {
        ExpertLoad {
            experts,
            counts: (0..layers * experts).map(|_| AtomicU64::new(0)).collect(),
            device: Mutex::new(Vec::new()),
        }
    }

    pub fn layers(&self) -> usize {
        self.counts.len() / self.experts.max(1)
    }

    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Rows routed to each expert of each layer so far, `[layers *
    /// experts]`.
    pub fn snapshot(&self) -> Vec<u64> {
        let mut counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let device = self.device.lock().unwrap_or_else(|e| e.into_inner());
        for (layer, t) in device.iter() {
            // A counter that cannot be read (a device fault, which fails
            // the step too) leaves its layer's host counts.
            if let Ok(values) = t.to_vec1::<i64>() {
                for (c, v) in counts[layer * self.experts..].iter_mut().zip(values) {
                    *c += v as u64;
                }
            }
        }
        counts
    }

    /// Counts `layer`'s routing from its device counters too.
    pub fn attach(&self, layer: usize, counts: Tensor) {
        let mut device = self.device.lock().unwrap_or_else(|e| e.into_inner());
        device.push((layer, counts));
    }

    pub fn record(&self, layer: usize, expert: usize, rows: usize) {
        self.counts[layer * self.experts + expert].fetch_add(rows as u64, Ordering::Relaxed);
    }
}

pub struct Moe {
    /// `[experts, hidden]`: one score per expert.
    pub router: Linear,
    pub routing: Routing,
    pub experts: Experts,
    /// The experts' gate activation: SiLU, Gemma 4's tanh GELU, or
    /// gpt-oss's clamped SwiGLU.
    pub act: Act,
    /// gpt-oss's expert biases.
    pub bias: Option<ExpertBias>,
    /// Gemma 4's: each expert's routing weight is multiplied by its own
    /// scale.
    pub expert_scale: Option<Vec<f32>>,
    pub shared: Option<SharedExpert>,
    /// Which layer this is, in `load`.
    pub layer: usize,
    pub load: Arc<ExpertLoad>,
}

/// A GGUF layer's tensors as a model's loader reads them.
pub struct GgufLayer<'a> {
    /// `blk.{i}`.
    pub prefix: &'a str,
    /// Whether the layer has tensor `{prefix}.{name}` (`name` as
    /// `ffn_up_shexp.weight`).
    pub has: &'a dyn Fn(&str) -> bool,
    pub spec: WeightSpec,
    pub device: &'a Device,
}

/// A step's rows grouped by the experts the router chose for them.
struct Groups {
    /// Per expert: the rows routed to it and each row's weight.
    rows: Vec<Vec<u32>>,
    weights: Vec<Vec<f32>>,
}

impl Moe {
    /// The MoE block of a GGUF layer: the router `ffn_gate_inp`, the
    /// stacked experts `ffn_{gate,up,down}_exps` (or gate and up fused in
    /// `ffn_gate_up_exps`), and a shared expert
    /// (`ffn_{gate,up,down}_shexp`, gated by `ffn_gate_inp_shexp`) where the
    /// file has one; the router's and the experts' biases where it has them
    /// (gpt-oss). `tensor` reads a tensor by its full name; `(layer,
    /// load)` is where this layer counts its routing.
    pub fn from_gguf(
        l: &GgufLayer,
        tensor: &mut dyn FnMut(&str) -> anyhow::Result<QTensor>,
        experts: usize,
        routing: Routing,
        (layer, load): (usize, Arc<ExpertLoad>),
    ) -> anyhow::Result<Moe> {
        let (p, spec, device) = (l.prefix, l.spec, l.device);
        routing.check(experts)?;
        let mut get = |n: &str| tensor(&format!("{p}.{n}.weight"));
        let mut linear = |names: &[&str]| -> anyhow::Result<Linear> {
            let ws = names
                .iter()
                .map(|n| get(n))
                .collect::<anyhow::Result<Vec<_>>>()?;
            Linear::stacked(ws, spec, device)
                .map_err(|e| anyhow::anyhow!("{p}.{}: {e}", names.join("+")))
        };
        let shared = match (l.has)("ffn_up_shexp.weight") {
            false => None,
            true => {
                let mlp = Mlp::new(
                    linear(&["ffn_gate_shexp", "ffn_up_shexp"])?,
                    linear(&["ffn_down_shexp"])?,
                    Activation::Glu(Act::Silu),
                );
                // `[hidden]` in the file.
                let gate = match (l.has)("ffn_gate_inp_shexp.weight") {
                    true => {
                        let w = get("ffn_gate_inp_shexp")?.dequantize(device)?;
                        let w = w.reshape((1, w.elem_count()))?;
                        Some(Linear::dense(w, None, WeightFormat::Native.into())?)
                    }
                    false => None,
                };
                Some(SharedExpert { mlp, gate })
            }
        };
        // The router as the file holds it (llama.cpp's converter and
        // quantizer keep it F32) whatever `--weights` says: which experts a
        // row takes is a discontinuous choice that rounding should not move.
        let router = Linear::new(get("ffn_gate_inp")?, WeightFormat::Native.into(), device)?;
        let router = match (l.has)("ffn_gate_inp.bias") {
            true => {
                router.with_bias(tensor(&format!("{p}.ffn_gate_inp.bias"))?.dequantize(device)?)?
            }
            false => router,
        };
        let bias = match (l.has)("ffn_down_exps.bias") {
            true => {
                let mut b = |n: &str| -> anyhow::Result<Tensor> {
                    Ok(tensor(&format!("{p}.{n}.bias"))?.dequantize(&Device::Cpu)?)
                };
                let b =
                    ExpertBias::new([b("ffn_gate_exps")?, b("ffn_up_exps")?, b("ffn_down_exps")?])?;
                b.check(experts)?;
                Some(b)
            }
            false => None,
        };
        let fused = (l.has)("ffn_gate_up_exps.weight");
        // A fused file's up half, split off with the gate and kept for the
        // next read rather than read and split again.
        let mut up = None;
        let mut read = |i: usize| -> Result<QTensor> {
            let mut get = |n: &str| {
                tensor(&format!("{p}.{n}.weight"))
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            };
            match (i, fused, up.take()) {
                (1, true, Some(up)) => Ok(up),
                (0 | 1, true, _) => {
                    let (gate, rest) = split_gate_up(&get("ffn_gate_up_exps")?, device)?;
                    match i {
                        0 => {
                            up = Some(rest);
                            Ok(gate)
                        }
                        _ => Ok(rest),
                    }
                }
                _ => get(["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"][i]),
            }
        };
        let stacked = Experts::from_gguf(&mut read, spec, device)
            .map_err(|e| anyhow::anyhow!("{p} experts: {e}"))?;
        anyhow::ensure!(
            stacked.count() == experts,
            "{p} has {} experts, its metadata {experts}",
            stacked.count()
        );
        Ok(Moe {
            router,
            routing,
            experts: stacked,
            act: Act::Silu,
            bias,
            expert_scale: None,
            shared,
            layer,
            load,
        })
    }

    /// The MoE block at `at` of a checkpoint: the router `gate` (Granite's
    /// `router.layer`), the experts one matrix per expert and projection
    /// (`experts.{e}.`, Mixtral's `w1`/`w3`/`w2` or the others'
    /// `gate_proj`/`up_proj`/`down_proj`; transformers 5 fuses them in
    /// memory but saves them so) or stacked (Granite's `input_linear`, gate
    /// and up, and `output_linear`; gpt-oss's [`gpt_oss_experts`]), and a
    /// shared expert (`shared_expert`, gated by `shared_expert_gate`) where
    /// it has one.
    pub fn from_hf(
        vb: &VarBuilder,
        at: &str,
        experts: usize,
        routing: Routing,
        (layer, load): (usize, Arc<ExpertLoad>),
        spec: WeightSpec,
    ) -> Result<Moe> {
        routing.check(experts)?;
        let get = |name: &str| vb.get_unchecked(&format!("{at}.{name}"));
        let has = |name: &str| vb.contains_tensor(&format!("{at}.{name}"));
        let gpt_oss = has("experts.gate_up_proj") || has("experts.gate_up_proj_blocks");
        let [gate, up, down] = match has("input_linear.weight") {
            // Granite-MoE: each expert's gate and up rows (gate first) in one
            // `[experts, 2 * ff, hidden]` tensor, its down in another.
            true => {
                let gate_up = get("input_linear.weight")?;
                let (n, rows, _) = gate_up.dims3()?;
                if n != experts || rows % 2 != 0 {
                    candle_core::bail!(
                        "{at}.input_linear.weight is {:?}, not {experts} experts' gate and up",
                        gate_up.dims()
                    );
                }
                let down = get("output_linear.weight")?;
                let each = |t: &Tensor, from: usize, len: usize| -> Result<Vec<Tensor>> {
                    (0..experts)
                        .map(|e| t.get(e)?.narrow(0, from, len)?.contiguous())
                        .collect()
                };
                let rows_down = down.dim(1)?;
                [
                    each(&gate_up, 0, rows / 2),
                    each(&gate_up, rows / 2, rows / 2),
                    each(&down, 0, rows_down),
                ]
            }
            false => {
                let names = match has("experts.0.w1.weight") {
                    true => ["w1", "w3", "w2"],
                    false => ["gate_proj", "up_proj", "down_proj"],
                };
                names.map(|n| {
                    (0..experts)
                        .map(|e| get(&format!("experts.{e}.{n}.weight")))
                        .collect::<Result<Vec<_>>>()
                })
            }
        };
        let shared = match vb.contains_tensor(&format!("{at}.shared_expert.up_proj.weight")) {
            false => None,
            true => {
                let s = |n: &str| get(&format!("shared_expert.{n}.weight"));
                let gate_up = Tensor::cat(&[s("gate_proj")?, s("up_proj")?], 0)?;
                Some(SharedExpert {
                    mlp: Mlp::new(
                        Linear::dense(gate_up, None, spec)?,
                        Linear::dense(s("down_proj")?, None, spec)?,
                        Activation::Glu(Act::Silu),
                    ),
                    gate: match vb.contains_tensor(&format!("{at}.shared_expert_gate.weight")) {
                        true => Some(Linear::dense(
                            get("shared_expert_gate.weight")?,
                            None,
                            spec,
                        )?),
                        false => None,
                    },
                })
            }
        };
        let (stacked, bias) = match gpt_oss {
            true => {
                let (e, b) = gpt_oss_experts(vb, at, spec)?;
                (e, Some(b))
            }
            false => (Experts::from_dense(gate?, up?, down?, spec)?, None),
        };
        if stacked.count() != experts {
            candle_core::bail!("{at} has {} experts, its config {experts}", stacked.count());
        }
        if let Some(b) = &bias {
            b.check(experts)?;
        }
        // Granite's `router.layer`, gpt-oss's `router` (with a bias), the
        // others' `gate`.
        let router = ["router.layer", "router", "gate"]
            .into_iter()
            .find(|r| has(&format!("{r}.weight")))
            .unwrap_or("gate");
        let f32_tensor =
            |n: &str| vb.get_unchecked_dtype(&format!("{at}.{router}.{n}"), DType::F32);
        let router_bias = match has(&format!("{router}.bias")) {
            true => Some(f32_tensor("bias")?),
            false => None,
        };
        Ok(Moe {
            // In f32 whatever `--weights` and `--dtype` say, as a GGUF's
            // router is.
            router: Linear::dense(
                f32_tensor("weight")?,
                router_bias,
                WeightFormat::Native.into(),
            )?,
            routing,
            experts: stacked,
            act: Act::Silu,
            bias,
            expert_scale: None,
            shared,
            layer,
            load,
        })
    }

    /// `x`: `[rows, hidden]`, already normed. Returns `[rows, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_routed(x, x)
    }

    /// The experts over `x`, each row routed by the router's scores of the
    /// same row of `routed` (Gemma 4 routes on other values than its
    /// experts take).
    pub fn forward_routed(&self, routed: &Tensor, x: &Tensor) -> Result<Tensor> {
        let scores = self.router.forward(routed)?.to_dtype(DType::F32)?;
        let out = match &self.experts {
            Experts::Device(d) => {
                let step = MoeStep {
                    top_k: self.routing.top_k,
                    renormalize: self.routing.renormalize,
                    act: self.act,
                };
                d.forward(&scores, x, &step, || self.device_extras(x.device()))?
            }
            Experts::Quant { gate, up, down } => {
                let (t, hidden) = x.dims2()?;
                let groups = self.route_host(&scores, t)?;
                let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let ws: [&[QuantMatrix]; 3] = [gate, up, down];
                let bias = self.bias.as_ref();
                let out = match self.act {
                    Act::Silu => {
                        grouped_forward(&xs, hidden, &groups, ws, bias, |g, u| silu(g) * u)
                    }
                    Act::GeluTanh => {
                        grouped_forward(&xs, hidden, &groups, ws, bias, |g, u| gelu_tanh(g) * u)
                    }
                    Act::SwigluOai => grouped_forward(&xs, hidden, &groups, ws, bias, swiglu_oai),
                };
                Tensor::from_vec(out, (t, hidden), x.device())?
            }
            Experts::Linear { gate_up, down } => self.forward_linear(&scores, x, gate_up, down)?,
        };
        self.add_shared(x, out)
    }

    /// The biases, scales and counters `moe.cu` reads, on `device`; the
    /// counters are this layer's in the model's [`ExpertLoad`].
    fn device_extras(&self, device: &Device) -> Result<Extras> {
        let bias = match &self.bias {
            Some(b) => {
                let gate_up: Vec<f32> = (0..self.experts.count())
                    .flat_map(|e| b.gate[e].iter().chain(&b.up[e]).copied())
                    .collect();
                let down: Vec<f32> = b.down.iter().flatten().copied().collect();
                let (n1, n2) = (gate_up.len(), down.len());
                Some((
                    Tensor::from_vec(gate_up, n1, device)?,
                    Tensor::from_vec(down, n2, device)?,
                ))
            }
            None => None,
        };
        let scale = self
            .expert_scale
            .as_deref()
            .map(|s| Tensor::new(s, device))
            .transpose()?;
        let load = Tensor::zeros(self.experts.count(), DType::I64, device)?;
        self.load.attach(self.layer, load.clone());
        Ok(Extras { bias, scale, load })
    }

    /// Each of `t` rows' experts by its `scores`, routed on the host and
    /// counted.
    fn route_host(&self, scores: &Tensor, t: usize) -> Result<Groups> {
        let mut groups = route(
            &scores.flatten_all()?.to_vec1::<f32>()?,
            t,
            self.experts.count(),
            self.routing,
        )?;
        if let Some(scale) = &self.expert_scale {
            for (weights, &s) in groups.weights.iter_mut().zip(scale) {
                weights.iter_mut().for_each(|w| *w *= s);
            }
        }
        for (e, rows) in groups.rows.iter().enumerate() {
            self.load.record(self.layer, e, rows.len());
        }
        Ok(groups)
    }

    /// The routed experts as a [`Linear`] each, over the rows routed to
    /// them on the host.
    fn forward_linear(
        &self,
        scores: &Tensor,
        x: &Tensor,
        gate_up: &[Linear],
        down: &[Linear],
    ) -> Result<Tensor> {
        let (t, hidden) = x.dims2()?;
        let groups = self.route_host(scores, t)?;
        let mut out = Tensor::zeros((t, hidden), DType::F32, x.device())?;
        for (e, rows) in groups
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
        {
            let idx = Tensor::new(rows.as_slice(), x.device())?;
            let w = Tensor::new(groups.weights[e].as_slice(), x.device())?.unsqueeze(1)?;
            let mut h = gate_up[e].forward(&x.index_select(&idx, 0)?)?;
            if let Some(b) = &self.bias {
                let row = [b.gate[e].as_slice(), &b.up[e]].concat();
                h = h.broadcast_add(&Tensor::new(row, x.device())?.to_dtype(h.dtype())?)?;
            }
            let mut y = down[e].forward(&elementwise::glu(&h, self.act)?)?;
            if let Some(b) = &self.bias {
                let row = Tensor::new(b.down[e].as_slice(), x.device())?;
                y = y.broadcast_add(&row.to_dtype(y.dtype())?)?;
            }
            out = out.index_add(&idx, &y.broadcast_mul(&w)?, 0)?;
        }
        Ok(out)
    }

    /// The shared expert's output over `x`, gated where it has a gate, plus
    /// the routed experts' `out`.
    fn add_shared(&self, x: &Tensor, out: Tensor) -> Result<Tensor> {
        match &self.shared {
            None => Ok(out),
            Some(s) => {
                let y = s.mlp.forward(x)?;
                let y = match &s.gate {
                    Some(g) => y.broadcast_mul(&candle_nn::ops::sigmoid(&g.forward(x)?)?)?,
                    None => y,
                };
                out + y
            }
        }
    }
}

/// gpt-oss's experts at `at` of a checkpoint: gate and up in one
/// `gate_up_proj` whose outputs interleave them (gate even, up odd), down in
/// `down_proj`, each with a bias. OpenAI's release holds the projections in
/// MXFP4 (`*_blocks` `[experts, out, in / 32, 16]` and `*_scales`
/// `[experts, out, in / 32]`), read as Q8_0 stacks of the same values
/// ([`crate::quant::mxfp4`]); re-saved checkpoints hold them dense, as
/// `[experts, in, out]`.
fn gpt_oss_experts(vb: &VarBuilder, at: &str, spec: WeightSpec) -> Result<(Experts, ExpertBias)> {
    let name = |n: &str| format!("{at}.experts.{n}");
    let get = |n: &str| vb.get_unchecked(&name(n));
    // Per expert, the rows `first, first + step, ...` of `[experts, rows, k]`.
    let rows = |t: &Tensor, first: usize, step: usize| -> Result<Tensor> {
        let (e, r, k) = t.dims3()?;
        t.reshape((e, r / step, step, k))?
            .narrow(2, first, 1)?
            .squeeze(2)
    };
    let bias = get("gate_up_proj_bias")?;
    let (e, two_ff) = bias.dims2()?;
    let bias = bias.reshape((e, two_ff, 1))?;
    let bias = ExpertBias::new([
        rows(&bias, 0, 2)?.squeeze(2)?,
        rows(&bias, 1, 2)?.squeeze(2)?,
        get("down_proj_bias")?,
    ])?;
    let device = vb.device();
    if !vb.contains_tensor(&name("gate_up_proj_blocks")) {
        let gate_up = get("gate_up_proj")?.transpose(1, 2)?;
        let down = get("down_proj")?.transpose(1, 2)?;
        let each = |t: Tensor| -> Result<Vec<Tensor>> {
            (0..t.dim(0)?).map(|x| t.get(x)?.contiguous()).collect()
        };
        let (gate, up) = (each(rows(&gate_up, 0, 2)?)?, each(rows(&gate_up, 1, 2)?)?);
        return Ok((Experts::from_dense(gate, up, each(down)?, spec)?, bias));
    }
    let stack = |n: &str, first: usize, step: usize| -> Result<QTensor> {
        let blocks = vb.get_unchecked_dtype(&name(&format!("{n}_blocks")), DType::U8)?;
        let scales = vb.get_unchecked_dtype(&name(&format!("{n}_scales")), DType::U8)?;
        let (e, r, nb, _) = blocks.dims4()?;
        if blocks.dim(3)? != 16 || scales.dims() != [e, r, nb] || r % step != 0 {
            candle_core::bail!(
                "{} are {:?} with scales {:?}, not MXFP4 blocks",
                name(n),
                blocks.dims(),
                scales.dims()
            );
        }
        let (blocks, scales) = (
            blocks.flatten_all()?.to_vec1::<u8>()?,
            scales.flatten_all()?.to_vec1::<u8>()?,
        );
        mxfp4::q8_0_tensor((e, r / step, nb * 32).into(), device, |out| {
            let rows = (0..e).flat_map(|x| (first..r).step_by(step).map(move |row| x * r + row));
            for (row, out) in rows.zip(out.chunks_exact_mut(nb * 34)) {
                let b = row * nb;
                mxfp4::hf_to_q8_0(&blocks[16 * b..16 * (b + nb)], &scales[b..b + nb], out)?;
            }
            Ok(())
        })
    };
    let mut read = |i: usize| match i {
        0 | 1 => stack("gate_up_proj", i, 2),
        _ => stack("down_proj", 0, 1),
    };
    Ok((Experts::from_gguf(&mut read, spec, device)?, bias))
}

/// The `[n, k]` matrices of a stacked `[experts, n, k]` quantized tensor:
/// each expert's rows are whole blocks, one run of bytes.
fn unstack(t: &QTensor, device: &Device) -> Result<Vec<QTensor>> {
    let (e, n, k) = t.shape().dims3()?;
    let data = t.data()?;
    let per = data.len() / e;
    (0..e)
        .map(|i| {
            let bytes = Cow::Owned(data[i * per..][..per].to_vec());
            QTensor::new(QStorage::from_data(bytes, device, t.dtype())?, (n, k))
        })
        .collect()
}

/// The gate and up stacks of a GGUF's fused `ffn_gate_up_exps`
/// (`[experts, 2 x ffn, hidden]`, each expert's gate rows before its up
/// rows, as the converter's `--fuse-gate-up-exps` writes it). Rows are
/// whole blocks, so each half is a run of bytes.
fn split_gate_up(t: &QTensor, device: &Device) -> Result<(QTensor, QTensor)> {
    let (e, rows, k) = t.shape().dims3()?;
    if rows % 2 != 0 {
        candle_core::bail!("ffn_gate_up_exps has {rows} rows per expert, not gate and up alike");
    }
    let data = t.data()?;
    let (per, ff) = (data.len() / e, rows / 2);
    let half = |second: usize| -> Result<QTensor> {
        let mut bytes = Vec::with_capacity(data.len() / 2);
        for x in 0..e {
            bytes.extend_from_slice(&data[x * per + second * per / 2..][..per / 2]);
        }
        QTensor::new(
            QStorage::from_data(Cow::Owned(bytes), device, t.dtype())?,
            (e, ff, k),
        )
    };
    Ok((half(0)?, half(1)?))
}

/// Each of `t` rows' top experts by softmax of its `scores` (`[t, experts]`),
/// grouped by expert.
fn route(scores: &[f32], t: usize, experts: usize, r: Routing) -> Result<Groups> {
    r.check(experts)?;
    let mut groups = Groups {
        rows: vec![Vec::new(); experts],
        weights: vec![Vec::new(); experts],
    };
    let mut order: Vec<usize> = Vec::with_capacity(experts);
    for (row, s) in scores.chunks_exact(experts).take(t).enumerate() {
        let max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let probs: Vec<f32> = s.iter().map(|&v| (v - max).exp()).collect();
        let sum: f32 = probs.iter().sum();
        order.clear();
        order.extend(0..experts);
        // Highest first; ties to the lower index, as torch.topk.
        order.select_nth_unstable_by(r.top_k - 1, |&a, &b| {
            probs[b].total_cmp(&probs[a]).then(a.cmp(&b))
        });
        let top = &order[..r.top_k];
        let norm = match r.renormalize {
            true => top.iter().map(|&e| probs[e]).sum::<f32>(),
            false => sum,
        };
        for &e in top {
            groups.rows[e].push(row as u32);
            groups.weights[e].push(probs[e] / norm);
        }
    }
    Ok(groups)
}

/// The experts' gated MLPs (`act` of gate and up) over their groups, on
/// wick's kernels, biased where they have biases, summed into `[t, hidden]`
/// by the routing weights.
fn grouped_forward(
    xs: &[f32],
    hidden: usize,
    groups: &Groups,
    [gate, up, down]: [&[QuantMatrix]; 3],
    bias: Option<&ExpertBias>,
    act: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let active: Vec<usize> = (0..groups.rows.len())
        .filter(|&e| !groups.rows[e].is_empty())
        .collect();
    // Each active expert's rows, gathered.
    let inputs: Vec<Vec<f32>> = active
        .iter()
        .map(|&e| {
            let rows = &groups.rows[e];
            let mut x = Vec::with_capacity(rows.len() * hidden);
            for &r in rows {
                x.extend_from_slice(&xs[r as usize * hidden..][..hidden]);
            }
            x
        })
        .collect();
    let width = |e: usize| groups.rows[e].len() * gate[e].n();
    let mut g: Vec<Vec<f32>> = active.iter().map(|&e| vec![0.0; width(e)]).collect();
    let mut u: Vec<Vec<f32>> = active.iter().map(|&e| vec![0.0; width(e)]).collect();
    {
        let mut jobs: Vec<GroupedJob> = Vec::with_capacity(2 * active.len());
        for ((&e, x), (g, u)) in active
            .iter()
            .zip(&inputs)
            .zip(g.iter_mut().zip(u.iter_mut()))
        {
            jobs.push(GroupedJob {
                matrix: &gate[e],
                x,
                out: g,
            });
            jobs.push(GroupedJob {
                matrix: &up[e],
                x,
                out: u,
            });
        }
        matmul_grouped(&mut jobs);
    }
    /// Adds `bias` to every row of `rows`.
    fn add_rows(rows: &mut [f32], bias: &[f32]) {
        for row in rows.chunks_exact_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
        }
    }
    for ((&e, g), u) in active.iter().zip(g.iter_mut()).zip(u.iter_mut()) {
        if let Some(b) = bias {
            add_rows(g, &b.gate[e]);
            add_rows(u, &b.up[e]);
        }
        for (g, &u) in g.iter_mut().zip(u.iter()) {
            *g = act(*g, u);
        }
    }
    let mut ys: Vec<Vec<f32>> = active
        .iter()
        .map(|&e| vec![0.0; groups.rows[e].len() * hidden])
        .collect();
    {
        let mut jobs: Vec<GroupedJob> = active
            .iter()
            .zip(&g)
            .zip(ys.iter_mut())
            .map(|((&e, h), y)| GroupedJob {
                matrix: &down[e],
                x: h,
                out: y,
            })
            .collect();
        matmul_grouped(&mut jobs);
    }
    if let Some(b) = bias {
        for (&e, y) in active.iter().zip(ys.iter_mut()) {
            add_rows(y, &b.down[e]);
        }
    }
    let mut out = vec![0.0f32; xs.len()];
    for (&e, y) in active.iter().zip(&ys) {
        for ((&r, &w), y) in groups.rows[e]
            .iter()
            .zip(&groups.weights[e])
            .zip(y.chunks_exact(hidden))
        {
            let o = &mut out[r as usize * hidden..][..hidden];
            for (o, &y) in o.iter_mut().zip(y) {
                *o += w * y;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores of two rows over four experts: each row's top two by
    /// softmax, weights renormalized or not.
    #[test]
    fn routes_each_row_to_its_top_experts() {
        let scores = [0.0, 2.0, 1.0, -1.0, 3.0, 3.0, 0.0, 1.0];
        let r = |renormalize| Routing {
            top_k: 2,
            renormalize,
        };
        let g = route(&scores, 2, 4, r(true)).unwrap();
        assert_eq!(g.rows, vec![vec![1], vec![0, 1], vec![0], vec![]]);
        let e = |x: f32| x.exp();
        let w1 = e(2.0) / (e(2.0) + e(1.0));
        assert!((g.weights[1][0] - w1).abs() < 1e-6);
        assert!((g.weights[0][0] - 0.5).abs() < 1e-6 && (g.weights[1][1] - 0.5).abs() < 1e-6);
        let g = route(&scores, 2, 4, r(false)).unwrap();
        let all = e(0.0) + e(2.0) + e(1.0) + e(-1.0);
        assert!((g.weights[1][0] - e(2.0) / all).abs() < 1e-6);
        assert!(route(
            &scores,
            2,
            4,
            Routing {
                top_k: 5,
                renormalize: true
            }
        )
        .is_err());
    }
}
