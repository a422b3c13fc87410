//! A [`Moe`](super::moe::Moe) block's routed experts on a CUDA device, run
//! by `moe.cu`: routing, each active expert's gate/up and down products
//! over the rows routed to it, and the weighted sum, in four launches with
//! the router's scores and the experts' GGUF blocks kept on the device.
//! The CPU twin is `route` and `grouped_forward` in `moe.rs`.

use std::sync::OnceLock;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Tensor};

use super::elementwise::Act;
use crate::launch::{Arg, Launch};

// `moe.cu`'s constants.
const ROUTE_THREADS: u32 = 256;
const MAX_EXPERTS: usize = 512;
const MAX_TOP_K: usize = 16;
const TILE_ROWS: usize = 8;
const GEMM_WARPS: usize = 8;
const COMBINE_THREADS: usize = 256;

/// GGML's id of a block type `moe.cu` dequantizes.
pub fn type_id(t: GgmlDType) -> Option<i32> {
    Some(match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::BF16 => 30,
        _ => return None,
    })
}

/// One projection of every expert, `[experts, n, k]` in a GGUF block type,
/// its bytes as the file holds them, in a `u8` tensor.
pub struct ExpertStack {
    pub bytes: Tensor,
    pub dtype: GgmlDType,
    pub experts: usize,
    pub n: usize,
    pub k: usize,
}

impl ExpertStack {
    /// A stacked quantized tensor's blocks, uploaded to `device`; `None`
    /// for a block type `moe.cu` does not read.
    pub fn from_qtensor(t: &QTensor, device: &Device) -> Result<Option<Self>> {
        let (experts, n, k) = t.shape().dims3()?;
        if type_id(t.dtype()).is_none() || !k.is_multiple_of(32) {
            return Ok(None);
        }
        let data = t.data()?;
        let bytes = Tensor::from_slice(&data, data.len(), device)?;
        Ok(Some(ExpertStack {
            bytes,
            dtype: t.dtype(),
            experts,
            n,
            k,
        }))
    }

    /// Each expert's dense `[n, k]` matrix in `dtype` (f32, f16 or bf16),
    /// stacked.
    pub fn from_dense(ws: &[Tensor], dtype: DType) -> Result<Option<Self>> {
        let Some(first) = ws.first() else {
            return Ok(None);
        };
        let ggml = match dtype {
            DType::F32 => GgmlDType::F32,
            DType::F16 => GgmlDType::F16,
            DType::BF16 => GgmlDType::BF16,
            _ => return Ok(None),
        };
        let (n, k) = first.dims2()?;
        if !k.is_multiple_of(32) {
            return Ok(None);
        }
        let stacked = Tensor::stack(ws, 0)?.to_dtype(dtype)?.flatten_all()?;
        // Little-endian, as GGUF stores them.
        let bytes: Vec<u8> = match dtype {
            DType::F32 => stacked
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            DType::F16 => stacked
                .to_vec1::<half::f16>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            _ => stacked
                .to_vec1::<half::bf16>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        };
        Ok(Some(ExpertStack {
            bytes: Tensor::from_slice(&bytes, bytes.len(), first.device())?,
            dtype: ggml,
            experts: ws.len(),
            n,
            k,
        }))
    }
}

/// One MoE layer's step as `moe.cu` sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeShape {
    pub rows: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub ff: usize,
    pub renormalize: bool,
    pub act: Act,
    pub has_bias: bool,
    pub has_scale: bool,
    /// Gate, up and down.
    pub types: [GgmlDType; 3],
}

impl MoeShape {
    /// Each row's `top_k` choices.
    pub fn slots(&self) -> usize {
        self.rows * self.top_k
    }

    /// The most tiles (runs of at most `TILE_ROWS` slots of one expert) a
    /// routing of the step can make: every expert with a partial run.
    pub fn max_tiles(&self) -> usize {
        self.slots().div_ceil(TILE_ROWS) + self.experts.min(self.slots())
    }

    /// `u32` of the routing `moe_route` writes: each slot's expert, the
    /// slots in expert order, each slot's place in it, and the tiles.
    pub fn plan_len(&self) -> usize {
        3 * self.slots() + 3 * self.max_tiles()
    }

    fn row_bytes(&self, i: usize) -> usize {
        let t = self.types[i];
        let k = if i == 2 { self.ff } else { self.hidden };
        k / t.block_size() * t.type_size()
    }
}

/// `moe.cu`'s buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeBuf {
    /// The router's scores, `[rows, experts]` f32.
    Scores,
    /// Each expert's routing scale, `[experts]` f32 (read with `has_scale`).
    Scale,
    /// [`MoeShape::plan_len`] `u32`, written by the routing.
    Plan,
    /// Each slot's routing weight, `[slots]` f32, written by the routing.
    Weights,
    /// The layer's rows per expert so far, `[experts]` u64: added to.
    Load,
    /// The block's input rows, `[rows, hidden]` f32.
    X,
    Gate,
    Up,
    Down,
    /// Per expert, the gate's `ff` biases then the up's, f32 (read with
    /// `has_bias`).
    GateUpBias,
    /// `[experts, hidden]` f32 (read with `has_bias`).
    DownBias,
    /// `[slots, ff]` f32 in the routing's order: written, then read.
    Hidden,
    /// `[slots, hidden]` f32 in the routing's order: written, then read.
    Expert,
    /// `[rows, hidden]` f32: written.
    Out,
}

/// The four launches of a step: routing, gate/up, down, combine. `None`
/// for a step `moe.cu` does not take (too many experts or choices, an
/// input size not in whole blocks, a type it does not read, sizes past
/// `int`).
pub fn launches(s: &MoeShape) -> Option<[Launch<MoeBuf>; 4]> {
    let int = |x: usize| i32::try_from(x).ok();
    let types = s.types.map(type_id);
    let ok = (1..=MAX_EXPERTS).contains(&s.experts)
        && (1..=MAX_TOP_K.min(s.experts)).contains(&s.top_k)
        && s.rows > 0
        && s.hidden.is_multiple_of(s.types[0].block_size().max(32))
        && s.hidden.is_multiple_of(s.types[1].block_size().max(32))
        && s.ff.is_multiple_of(s.types[2].block_size().max(32))
        && types.iter().all(Option::is_some);
    // The kernels index rows of `[experts * n, ...]` in `size_t` and the
    // slots' buffers in `int`.
    if !ok || int(s.plan_len()).is_none() || int(s.slots() * s.ff.max(s.hidden)).is_none() {
        return None;
    }
    let [gt, ut, dt] = types.map(|t| t.unwrap_or(0));
    let (rows, top_k, hidden, ff) = (int(s.rows)?, int(s.top_k)?, int(s.hidden)?, int(s.ff)?);
    let tiles = u32::try_from(s.max_tiles()).ok()?;
    let flag = |b: bool| Arg::I32(i32::from(b));
    let act = match s.act {
        Act::Silu => 0,
        Act::GeluTanh => 1,
        Act::SwigluOai => 2,
    };
    use MoeBuf::*;
    let route = Launch {
        kernel: "moe_route".into(),
        grid: (1, 1, 1),
        block: (ROUTE_THREADS, 1, 1),
        args: vec![
            Arg::Buf(Scores),
            Arg::Buf(Scale),
            Arg::Buf(Plan),
            Arg::Buf(Weights),
            Arg::Buf(Load),
            Arg::I32(rows),
            Arg::I32(int(s.experts)?),
            Arg::I32(top_k),
            flag(s.renormalize),
            flag(s.has_scale),
            Arg::I32(int(s.max_tiles())?),
        ],
    };
    let gemm_block = (GEMM_WARPS as u32 * 32, 1, 1);
    let gate_up = Launch {
        kernel: "moe_gate_up".into(),
        grid: (u32::try_from(s.ff.div_ceil(GEMM_WARPS)).ok()?, tiles, 1),
        block: gemm_block,
        args: vec![
            Arg::Buf(X),
            Arg::Buf(Gate),
            Arg::Buf(Up),
            Arg::Buf(GateUpBias),
            Arg::Buf(Plan),
            Arg::Buf(Hidden),
            Arg::I32(rows),
            Arg::I32(top_k),
            Arg::I32(hidden),
            Arg::I32(ff),
            Arg::I32(gt),
            Arg::I32(ut),
            Arg::I32(int(s.row_bytes(0))?),
            Arg::I32(int(s.row_bytes(1))?),
            flag(s.has_bias),
            Arg::I32(act),
        ],
    };
    let down = Launch {
        kernel: "moe_down".into(),
        grid: (u32::try_from(s.hidden.div_ceil(GEMM_WARPS)).ok()?, tiles, 1),
        block: gemm_block,
        args: vec![
            Arg::Buf(Hidden),
            Arg::Buf(Down),
            Arg::Buf(DownBias),
            Arg::Buf(Plan),
            Arg::Buf(Expert),
            Arg::I32(rows),
            Arg::I32(top_k),
            Arg::I32(hidden),
            Arg::I32(ff),
            Arg::I32(dt),
            Arg::I32(int(s.row_bytes(2))?),
            flag(s.has_bias),
        ],
    };
    let combine = Launch {
        kernel: "moe_combine".into(),
        grid: (
            u32::try_from(s.rows).ok()?,
            u32::try_from(s.hidden.div_ceil(COMBINE_THREADS)).ok()?,
            1,
        ),
        block: (COMBINE_THREADS as u32, 1, 1),
        args: vec![
            Arg::Buf(Expert),
            Arg::Buf(Plan),
            Arg::Buf(Weights),
            Arg::Buf(Out),
            Arg::I32(rows),
            Arg::I32(top_k),
            Arg::I32(hidden),
        ],
    };
    Some([route, gate_up, down, combine])
}

/// The experts' gate, up and down stacks on the device, and what the
/// kernels read beside them.
pub struct DeviceExperts {
    pub gate: ExpertStack,
    pub up: ExpertStack,
    pub down: ExpertStack,
    /// Made on the first step: a family sets its scales after the block is
    /// built.
    extras: OnceLock<Extras>,
}

/// What the kernels read beside the weights, on the device.
pub struct Extras {
    /// Per expert, the gate's `ff` biases then the up's (`[experts, 2
    /// ff]`), and the down's (`[experts, hidden]`), f32.
    pub bias: Option<(Tensor, Tensor)>,
    /// Each expert's routing scale, `[experts]` f32.
    pub scale: Option<Tensor>,
    /// The layer's rows per expert, `[experts]` i64, added to by the
    /// routing (as u64).
    pub load: Tensor,
}

/// A step's routing: each row's top `top_k` experts by softmax,
/// renormalized over them or not, and the experts' activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeStep {
    pub top_k: usize,
    pub renormalize: bool,
    pub act: Act,
}

impl DeviceExperts {
    /// `None` unless the three stacks agree (experts; gate and up `[ff,
    /// hidden]`, down `[hidden, ff]`).
    pub fn new([gate, up, down]: [ExpertStack; 3]) -> Option<Self> {
        let fits = gate.experts == up.experts
            && gate.experts == down.experts
            && (gate.n, gate.k) == (up.n, up.k)
            && (down.n, down.k) == (gate.k, gate.n);
        fits.then(|| DeviceExperts {
            gate,
            up,
            down,
            extras: OnceLock::new(),
        })
    }

    pub fn count(&self) -> usize {
        self.gate.experts
    }

    /// The routed experts over `x` (`[rows, hidden]`), each row routed by
    /// its `scores` (`[rows, experts]`); `extras` makes the biases, scales
    /// and counters on the first call. Returns `[rows, hidden]` f32.
    pub fn forward(
        &self,
        scores: &Tensor,
        x: &Tensor,
        step: &MoeStep,
        extras: impl FnOnce() -> Result<Extras>,
    ) -> Result<Tensor> {
        let extras = match self.extras.get() {
            Some(e) => e,
            None => {
                let e = extras()?;
                self.extras.get_or_init(|| e)
            }
        };
        let (rows, hidden) = x.dims2()?;
        let shape = MoeShape {
            rows,
            experts: self.count(),
            top_k: step.top_k,
            hidden: self.gate.k,
            ff: self.gate.n,
            renormalize: step.renormalize,
            act: step.act,
            has_bias: extras.bias.is_some(),
            has_scale: extras.scale.is_some(),
            types: [self.gate.dtype, self.up.dtype, self.down.dtype],
        };
        if scores.dims2()? != (rows, shape.experts) || hidden != shape.hidden {
            candle_core::bail!(
                "experts: scores {:?} and rows {:?} for {shape:?}",
                scores.dims(),
                x.dims()
            );
        }
        let Some(plan) = launches(&shape) else {
            candle_core::bail!("experts: no kernel for {shape:?}");
        };
        #[cfg(feature = "cuda")]
        return cuda::forward(self, extras, &shape, &plan, scores, x);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = plan;
            candle_core::bail!("experts on a device in a build without CUDA")
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Layout, Result, Storage, Tensor};

    use super::{DeviceExperts, Extras, MoeBuf, MoeShape};
    use crate::launch::{self, Launch};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/moe.ptx"));
    const MODULE: &str = "wick_moe";

    /// The start of a contiguous tensor's values in its storage.
    fn start(l: &Layout, what: &str) -> Result<usize> {
        match l.contiguous_offsets() {
            Some((start, _)) => Ok(start),
            None => candle_core::bail!("experts: {what} is not contiguous"),
        }
    }

    pub fn forward(
        experts: &DeviceExperts,
        extras: &Extras,
        s: &MoeShape,
        plan: &[Launch<MoeBuf>; 4],
        scores: &Tensor,
        x: &Tensor,
    ) -> Result<Tensor> {
        let scores = scores.to_dtype(DType::F32)?.contiguous()?;
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let (sc_s, sc_l) = scores.storage_and_layout();
        let (x_s, x_l) = x.storage_and_layout();
        let (g_s, _) = experts.gate.bytes.storage_and_layout();
        let (u_s, _) = experts.up.bytes.storage_and_layout();
        let (d_s, _) = experts.down.bytes.storage_and_layout();
        let (load_s, _) = extras.load.storage_and_layout();
        let (
            Storage::Cuda(sc_s),
            Storage::Cuda(x_s),
            Storage::Cuda(g_s),
            Storage::Cuda(u_s),
            Storage::Cuda(d_s),
            Storage::Cuda(load_s),
        ) = (&*sc_s, &*x_s, &*g_s, &*u_s, &*d_s, &*load_s)
        else {
            candle_core::bail!("experts: inputs off the CUDA device");
        };
        let dev = x_s.device().clone();
        let (slots, rows) = (s.slots(), s.rows);
        // SAFETY: `alloc` leaves the memory unset. `moe_route` writes every
        // slot's expert and weight, the order and places of all slots, and
        // every tile (the unused ones with 0 slots) before the launches
        // after it on the stream read them. Every slot lies in exactly one
        // tile, so `moe_gate_up` writes each place's `ff` values of
        // `hidden` before `moe_down` reads them, and `moe_down` each
        // place's `hidden` values of `expert` before `moe_combine` reads
        // them; `moe_combine` writes every value of `out`.
        let plan_b = unsafe { dev.alloc::<u32>(s.plan_len())? };
        let weights = unsafe { dev.alloc::<f32>(slots)? };
        let hidden_b = unsafe { dev.alloc::<f32>(slots * s.ff)? };
        let expert_b = unsafe { dev.alloc::<f32>(slots * s.hidden)? };
        let out = unsafe { dev.alloc::<f32>(rows * s.hidden)? };
        let scores_v = sc_s
            .as_cuda_slice::<f32>()?
            .slice(start(&sc_l, "the scores")?..);
        let x_v = x_s
            .as_cuda_slice::<f32>()?
            .slice(start(&x_l, "the rows")?..);
        let (gate_v, up_v, down_v) = (
            g_s.as_cuda_slice::<u8>()?,
            u_s.as_cuda_slice::<u8>()?,
            d_s.as_cuda_slice::<u8>()?,
        );
        let load_v = load_s.as_cuda_slice::<i64>()?;
        // Buffers a launch takes but does not read without its flag stand
        // in for the biases and scales the block lacks.
        let guards: Vec<_> = [
            extras.bias.as_ref().map(|b| &b.0),
            extras.bias.as_ref().map(|b| &b.1),
            extras.scale.as_ref(),
        ]
        .map(|t| t.map(|t| t.storage_and_layout().0))
        .into_iter()
        .collect();
        let f32_of = |i: usize| -> Result<Option<_>> {
            match guards[i].as_deref() {
                Some(Storage::Cuda(c)) => Ok(Some(c.as_cuda_slice::<f32>()?)),
                Some(_) => candle_core::bail!("experts: biases off the CUDA device"),
                None => Ok(None),
            }
        };
        let (gub, db, scale) = (f32_of(0)?, f32_of(1)?, f32_of(2)?);
        let stream = dev.cuda_stream();
        for l in plan {
            let func = dev.get_or_load_custom_func(&l.kernel, MODULE, PTX)?;
            // SAFETY: the plan's arguments are the four kernels' parameters
            // in order and type (buffers by role below, scalars i32). Their
            // accesses stay in bounds: the scores and rows are contiguous
            // `[rows, experts]` and `[rows, hidden]` f32 (checked by
            // `DeviceExperts::forward`) from their views' starts; a weight
            // row `e * n + j` of a stack lies in its `experts * n` rows of
            // `row_bytes` (the kernels take e from the routing, below
            // `experts`, and j below n); the biases, scales and counters
            // were made with `experts` rows of the widths the kernels read,
            // and read only under their flags; the buffers allocated above
            // have the lengths `MoeShape` gives the kernels' indexing. The
            // counters are written through a shared reference: only this
            // layer's launches on the one stream write them, and
            // `ExpertLoad` reads them by copying on the same stream.
            unsafe {
                launch::cuda::launch(&stream, &func, l, |b, role| {
                    match role {
                        MoeBuf::Scores => b.arg(&scores_v),
                        MoeBuf::Scale => match scale {
                            Some(v) => b.arg(v),
                            None => b.arg(&scores_v),
                        },
                        MoeBuf::Plan => b.arg(&plan_b),
                        MoeBuf::Weights => b.arg(&weights),
                        MoeBuf::Load => b.arg(load_v),
                        MoeBuf::X => b.arg(&x_v),
                        MoeBuf::Gate => b.arg(gate_v),
                        MoeBuf::Up => b.arg(up_v),
                        MoeBuf::Down => b.arg(down_v),
                        MoeBuf::GateUpBias => match gub {
                            Some(v) => b.arg(v),
                            None => b.arg(&scores_v),
                        },
                        MoeBuf::DownBias => match db {
                            Some(v) => b.arg(v),
                            None => b.arg(&scores_v),
                        },
                        MoeBuf::Hidden => b.arg(&hidden_b),
                        MoeBuf::Expert => b.arg(&expert_b),
                        MoeBuf::Out => b.arg(&out),
                    };
                })?;
            }
        }
        drop((plan_b, weights, hidden_b, expert_b));
        let out = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev));
        Ok(Tensor::from_storage(
            out,
            (rows, s.hidden),
            BackpropOp::none(),
            false,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rows: usize, experts: usize, top_k: usize) -> MoeShape {
        MoeShape {
            rows,
            experts,
            top_k,
            hidden: 64,
            ff: 96,
            renormalize: true,
            act: Act::Silu,
            has_bias: false,
            has_scale: false,
            types: [GgmlDType::Q8_0, GgmlDType::Q8_0, GgmlDType::Q8_0],
        }
    }

    /// Tiles: one step's slots fill at most one partial tile per expert
    /// beyond the full ones; a decode row's k slots need k tiles.
    #[test]
    fn tiles_bound_any_routing() {
        let s = shape(1, 128, 8);
        assert_eq!(s.max_tiles(), 1 + 8);
        let s = shape(100, 4, 2);
        assert_eq!(s.max_tiles(), 25 + 4);
        assert_eq!(s.plan_len(), 3 * 200 + 3 * 29);
    }

    #[test]
    fn launches_refuse_what_the_kernels_cannot_take() {
        assert!(launches(&shape(3, 8, 2)).is_some());
        assert!(launches(&shape(3, 8, 9)).is_none());
        assert!(launches(&shape(3, MAX_EXPERTS + 1, 2)).is_none());
        assert!(launches(&shape(0, 8, 2)).is_none());
        let mut s = shape(3, 8, 2);
        s.types[2] = GgmlDType::Q4K; // ff 96 is not whole 256-blocks
        assert!(launches(&s).is_none());
        s.types[2] = GgmlDType::Q2K;
        assert!(launches(&s).is_none());
    }
}
