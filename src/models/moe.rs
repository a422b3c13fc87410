//! The mixture-of-experts feed-forward block, beside the dense [`Mlp`]: a
//! router scores every expert for each row, the row goes through its top k
//! experts' gated MLPs, and their outputs are summed, weighted by the
//! router; a shared expert, where the family has one, adds its own output
//! to every row.
//!
//! Rows are grouped by expert, so each active expert multiplies once over
//! all the rows routed to it, and an expert no row chose is never read. On
//! the CPU with wick's kernels the products of all active experts run in one
//! parallel call ([`matmul_grouped`]); elsewhere (candle's kernels, dense
//! weights, a GPU) each active expert runs as an ordinary [`Linear`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Result, Tensor};

use super::linear::{Linear, WeightFormat, WeightSpec};
use super::mlp::Mlp;
use crate::quant::{matmul_grouped, GroupedJob, QuantMatrix};

/// How a row's expert weights come from the router's scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routing {
    /// Experts per row.
    pub top_k: usize,
    /// Whether the top k softmax weights are divided by their sum (Mixtral,
    /// Qwen3-MoE), or kept as they are (OLMoE, Qwen2-MoE).
    pub renormalize: bool,
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
}

impl Experts {
    /// From a GGUF's stacked `[experts, n, k]` gate, up and down tensors:
    /// repacked for wick's kernels where they run (the CPU, the file's
    /// format, a block type they hold), else split into a [`Linear`] per
    /// expert.
    pub fn from_gguf(
        [gate, up, down]: [QTensor; 3],
        spec: WeightSpec,
        device: &Device,
    ) -> Result<Self> {
        let (e, _, _) = gate.shape().dims3()?;
        for t in [&up, &down] {
            if t.shape().dims3()?.0 != e {
                candle_core::bail!("expert tensors of {e} and {:?} experts", t.shape());
            }
        }
        let native = match spec.format {
            WeightFormat::Native => true,
            WeightFormat::Q8_0 => [&gate, &up, &down]
                .iter()
                .all(|t| t.dtype() == GgmlDType::Q8_0),
            _ => false,
        };
        if native && device.is_cpu() {
            let stack = |t: &QTensor| -> Result<Option<Vec<QuantMatrix>>> {
                QuantMatrix::stack_from_qtensor(t)?
                    .map(|ms| ms.into_iter().map(|m| m.with_kernel(spec.kernel)).collect())
                    .transpose()
            };
            if let (Some(gate), Some(up), Some(down)) = (stack(&gate)?, stack(&up)?, stack(&down)?)
            {
                return Ok(Experts::Quant { gate, up, down });
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
    /// `WeightFormat::Q8_0` on the CPU, else a [`Linear`] per expert.
    pub fn from_dense(
        gate: Vec<Tensor>,
        up: Vec<Tensor>,
        down: Vec<Tensor>,
        spec: WeightSpec,
    ) -> Result<Self> {
        let cpu = gate.first().is_some_and(|g| g.device().is_cpu());
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
        }
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
}

impl ExpertLoad {
    pub fn new(layers: usize, experts: usize) -> Self {
        ExpertLoad {
            experts,
            counts: (0..layers * experts).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn layers(&self) -> usize {
        self.counts.len() / self.experts.max(1)
    }

    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Rows routed to `expert` of `layer` so far.
    pub fn routed(&self, layer: usize, expert: usize) -> u64 {
        self.counts[layer * self.experts + expert].load(Ordering::Relaxed)
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
    pub shared: Option<SharedExpert>,
    /// Which layer this is, in `load`.
    pub layer: usize,
    pub load: Arc<ExpertLoad>,
}

/// A step's rows grouped by the experts the router chose for them.
struct Groups {
    /// Per expert: the rows routed to it and each row's weight.
    rows: Vec<Vec<u32>>,
    weights: Vec<Vec<f32>>,
}

impl Moe {
    /// `x`: `[rows, hidden]`, already normed. Returns `[rows, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (t, hidden) = x.dims2()?;
        let scores = self.router.forward(x)?.to_dtype(DType::F32)?;
        let groups = route(
            &scores.flatten_all()?.to_vec1::<f32>()?,
            t,
            self.experts.count(),
            self.routing,
        )?;
        for (e, rows) in groups.rows.iter().enumerate() {
            self.load.record(self.layer, e, rows.len());
        }
        let out = match &self.experts {
            Experts::Quant { gate, up, down } => {
                let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let out = grouped_forward(&xs, hidden, &groups, gate, up, down);
                Tensor::from_vec(out, (t, hidden), x.device())?
            }
            Experts::Linear { gate_up, down } => {
                let mut out = Tensor::zeros((t, hidden), DType::F32, x.device())?;
                for (e, rows) in groups
                    .rows
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| !r.is_empty())
                {
                    let idx = Tensor::new(rows.as_slice(), x.device())?;
                    let w = Tensor::new(groups.weights[e].as_slice(), x.device())?.unsqueeze(1)?;
                    let h = gate_up[e].forward(&x.index_select(&idx, 0)?)?;
                    let y = down[e].forward(&candle_nn::ops::swiglu(&h)?)?;
                    out = out.index_add(&idx, &y.broadcast_mul(&w)?, 0)?;
                }
                out
            }
        };
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

/// Each of `t` rows' top experts by softmax of its `scores` (`[t, experts]`),
/// grouped by expert.
fn route(scores: &[f32], t: usize, experts: usize, r: Routing) -> Result<Groups> {
    if r.top_k == 0 || r.top_k > experts {
        candle_core::bail!("{} experts per token of {experts}", r.top_k);
    }
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

/// The experts' SwiGLU MLPs over their groups, on wick's kernels, summed
/// into `[t, hidden]` by the routing weights.
fn grouped_forward(
    xs: &[f32],
    hidden: usize,
    groups: &Groups,
    gate: &[QuantMatrix],
    up: &[QuantMatrix],
    down: &[QuantMatrix],
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
    for (g, u) in g.iter_mut().zip(&u) {
        for (g, &u) in g.iter_mut().zip(u) {
            *g = super::elementwise::silu(*g) * u;
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
