//! The gated delta rule, Qwen3.5's linear attention, after the layer's
//! input projection: per token, q/k/v go through a causal depthwise conv
//! of `conv_kernel` taps and SiLU; q and k are L2-normalized per head (q
//! also scaled by `key_dim^-1/2`); each value head's state `S`
//! (`[key_dim, value_dim]`) decays by `exp(g)`, `g = -exp(A_log) *
//! softplus(a + dt_bias)`, then learns `v` at `k` with rate `beta =
//! sigmoid(b)`: `S += k (beta (v - S^T k))^T`, and the output `S^T q` goes
//! through an RMSNorm gated by `silu(z)`. The conv's last inputs and `S`
//! are the sequence's recurrent state, kept in its state slot between
//! steps.
//!
//! On the CPU, [`GatedDelta::run`] (transformers' reference loop, token by
//! token, sequences and heads in parallel); on a CUDA device, its twin
//! `gated_delta.cu` over every sequence of the step at once, the states in
//! one device pool ([`crate::kv::state_store::DeviceStates`]), so nothing
//! crosses to the host.

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use super::elementwise::silu;
use super::SeqSlice;
use crate::launch::{Arg, Launch};

/// A linear-attention layer's shape: `k_heads` query/key heads of `k_dim`,
/// each serving `v_heads / k_heads` value heads of `v_dim`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaDims {
    pub conv_kernel: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// Value heads in llama.cpp's tiled order (`[G0_v0, G1_v0, G0_v1, ...]`
    /// for key heads G): value head `j` reads key head `j % k_heads`.
    /// Hugging Face checkpoints group them by key head instead
    /// (`j / (v_heads / k_heads)`).
    pub v_heads_tiled: bool,
    /// The gated RMSNorm's epsilon.
    pub eps: f32,
}

impl DeltaDims {
    pub fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }

    pub fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels of the conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Width of a projected row: q/k/v (the conv's input), z, b and a.
    pub fn in_width(&self) -> usize {
        self.conv_dim() + self.value_width() + 2 * self.v_heads
    }

    /// f32 of one layer's state: the conv's last `kernel - 1` inputs
    /// (oldest first), then each value head's `[k_dim, v_dim]` matrix.
    pub fn state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.v_heads * self.k_dim * self.v_dim
    }

    /// The key head that value head `h` reads.
    pub fn key_head_of(&self, h: usize) -> usize {
        match self.v_heads_tiled {
            true => h % self.k_heads,
            false => h / (self.v_heads / self.k_heads),
        }
    }
}

/// torch's softplus (beta 1, linear past 20).
fn softplus(x: f32) -> f32 {
    match x > 20.0 {
        true => x,
        false => x.exp().ln_1p(),
    }
}

/// `x / sqrt(sum(x^2) + 1e-6)`, in place (transformers' `l2norm`).
fn l2_normalize(x: &mut [f32], scale: f32) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt() * scale;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Each sequence's recurrent states for one step, where the layers find
/// them: taken out of their host slots (one `Vec` per sequence, every
/// layer's state in it), or the device pool and the step's sequence
/// descriptors for `gated_delta.cu`.
pub enum StepStates {
    Host(Vec<Vec<f32>>),
    Device { pool: Tensor, seqs: Tensor },
}

impl StepStates {
    /// The device form: `pool` `[slots, slot_len]` f32, and the four `u32`
    /// per sequence `gated_delta.cu` reads (first row, rows, slot, 1 at
    /// position 0), uploaded once for every layer of the step.
    pub fn device(pool: Tensor, seqs: &[SeqSlice], slots: &[u32]) -> Result<Self> {
        let desc: Vec<u32> = seqs
            .iter()
            .zip(slots)
            .flat_map(|(s, &slot)| {
                [
                    s.start as u32,
                    s.len as u32,
                    slot,
                    u32::from(s.first_pos == 0),
                ]
            })
            .collect();
        let seqs = Tensor::from_vec(desc, seqs.len() * 4, pool.device())?;
        Ok(StepStates::Device { pool, seqs })
    }
}

/// One layer's recurrence: its shape and constants.
pub struct GatedDelta {
    dims: DeltaDims,
    /// `[conv_dim, kernel]`.
    conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated RMSNorm's weights, `[v_dim]` (plain w, not 1 + w).
    norm: Vec<f32>,
    /// On a CUDA device, the four above one after another: the kernels'
    /// `params`.
    params: Option<Tensor>,
}

impl GatedDelta {
    pub fn new(
        dims: DeltaDims,
        conv: Vec<f32>,
        neg_a: Vec<f32>,
        dt_bias: Vec<f32>,
        norm: Vec<f32>,
        device: &Device,
    ) -> Result<Self> {
        let want = [
            dims.conv_dim() * dims.conv_kernel,
            dims.v_heads,
            dims.v_heads,
            dims.v_dim,
        ];
        let got = [conv.len(), neg_a.len(), dt_bias.len(), norm.len()];
        let heads = dims.k_heads > 0 && dims.v_heads.is_multiple_of(dims.k_heads);
        if want != got || dims.conv_kernel == 0 || !heads {
            candle_core::bail!("gated delta: constants of {got:?} values for {dims:?}");
        }
        let mut delta = GatedDelta {
            dims,
            conv,
            neg_a,
            dt_bias,
            norm,
            params: None,
        };
        if device.is_cuda() {
            let params = delta.params();
            let n = params.len();
            delta.params = Some(Tensor::from_vec(params, n, device)?);
        }
        Ok(delta)
    }

    pub fn dims(&self) -> &DeltaDims {
        &self.dims
    }

    /// The constants as `gated_delta.cu` reads them: the conv's weights,
    /// `-exp(A_log)`, `dt_bias`, the norm's weights.
    pub fn params(&self) -> Vec<f32> {
        [&self.conv, &self.neg_a, &self.dt_bias, &self.norm]
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The step's projected rows `proj` (`[T, in_width]`) through the
    /// recurrence: each sequence's rows (`seqs`, in batch order) carry on
    /// from its state at `state_at` within its slot, and leave the next
    /// step's there. Returns `[T, value_width]` f32 on `proj`'s device.
    pub fn forward(
        &self,
        proj: &Tensor,
        seqs: &[SeqSlice],
        states: &mut StepStates,
        state_at: usize,
    ) -> Result<Tensor> {
        match states {
            StepStates::Host(states) => self.forward_host(proj, seqs, states, state_at),
            #[cfg(feature = "cuda")]
            StepStates::Device { pool, seqs: desc } => {
                cuda::forward(self, proj, seqs.len(), desc, pool, state_at)
            }
            #[cfg(not(feature = "cuda"))]
            StepStates::Device { .. } => {
                candle_core::bail!("gated delta: device states in a build without CUDA")
            }
        }
    }

    /// The host loop: the rows copied over, each sequence run by
    /// [`Self::run`], the outputs copied back.
    fn forward_host(
        &self,
        proj: &Tensor,
        seqs: &[SeqSlice],
        states: &mut [Vec<f32>],
        state_at: usize,
    ) -> Result<Tensor> {
        let (t, width) = proj.dims2()?;
        if width != self.dims.in_width() {
            candle_core::bail!("gated delta: rows of {width}, not {}", self.dims.in_width());
        }
        let rows = proj
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let vw = self.dims.value_width();
        let mut out = vec![0f32; t * vw];
        // Each sequence's rows of `out`, in batch order.
        let mut parts = Vec::with_capacity(seqs.len());
        let mut rest = out.as_mut_slice();
        for s in seqs {
            let (mine, tail) = rest.split_at_mut(s.len * vw);
            parts.push(mine);
            rest = tail;
        }
        let len = self.dims.state_len();
        seqs.par_iter()
            .zip(states.par_iter_mut())
            .zip(parts.into_par_iter())
            .for_each(|((s, state), out)| {
                let state = &mut state[state_at..state_at + len];
                let rows = &rows[s.start * width..(s.start + s.len) * width];
                self.run(rows, state, out);
            });
        Tensor::from_vec(out, (t, vw), proj.device())
    }

    /// One sequence's new rows (`in_width` each) through the conv and the
    /// delta rule from `state` (`state_len`), which they leave as the next
    /// step's; the gated-norm outputs go to `out`. The conv runs token by
    /// token; then each value head runs its own recurrence over the tokens,
    /// the heads in parallel, since they share nothing but their inputs:
    /// one sequence (a lone stream, a long prompt) spreads over the cores.
    pub fn run(&self, rows: &[f32], state: &mut [f32], out: &mut [f32]) {
        let d = &self.dims;
        let width = d.in_width();
        let (k_taps, conv_dim) = (d.conv_kernel, d.conv_dim());
        let (kw, vw) = (d.key_width(), d.value_width());
        let (dk, dv, nv) = (d.k_dim, d.v_dim, d.v_heads);
        let t = rows.len() / width;
        let (conv_state, s_all) = state.split_at_mut((k_taps - 1) * conv_dim);
        // Each row's q and k (l2-normed) and v: the causal conv over the
        // last kernel - 1 inputs and this one.
        let mut mixed = vec![0f32; t * conv_dim];
        let q_scale = 1.0 / (dk as f32).sqrt();
        for (row, m) in rows
            .chunks_exact(width)
            .zip(mixed.chunks_exact_mut(conv_dim))
        {
            let x = &row[..conv_dim];
            for (ch, m) in m.iter_mut().enumerate() {
                let w = &self.conv[ch * k_taps..(ch + 1) * k_taps];
                let mut acc = w[k_taps - 1] * x[ch];
                for (j, wj) in w[..k_taps - 1].iter().enumerate() {
                    acc += wj * conv_state[j * conv_dim + ch];
                }
                *m = acc;
            }
            m.iter_mut().for_each(|v| *v = silu(*v));
            if k_taps > 1 {
                conv_state.copy_within(conv_dim.., 0);
                conv_state[(k_taps - 2) * conv_dim..].copy_from_slice(x);
            }
            let (q, k) = m[..2 * kw].split_at_mut(kw);
            for (qh, kh) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)) {
                l2_normalize(qh, q_scale);
                l2_normalize(kh, 1.0);
            }
        }
        let heads: Vec<Vec<f32>> = s_all
            .par_chunks_mut(dk * dv)
            .take(nv)
            .enumerate()
            .map(|(h, s)| {
                let g = d.key_head_of(h);
                let mut outs = vec![0f32; t * dv];
                let mut kv_mem = vec![0f32; dv];
                let tokens = rows.chunks_exact(width).zip(mixed.chunks_exact(conv_dim));
                for ((row, m), o) in tokens.zip(outs.chunks_exact_mut(dv)) {
                    let qh = &m[g * dk..(g + 1) * dk];
                    let kh = &m[kw + g * dk..kw + (g + 1) * dk];
                    let vh = &m[2 * kw + h * dv..2 * kw + (h + 1) * dv];
                    let z = &row[conv_dim + h * dv..conv_dim + (h + 1) * dv];
                    let (b, a) = (row[conv_dim + vw + h], row[conv_dim + vw + nv + h]);
                    let decay = (self.neg_a[h] * softplus(a + self.dt_bias[h])).exp();
                    let beta = 1.0 / (1.0 + (-b).exp());
                    s.iter_mut().for_each(|e| *e *= decay);
                    kv_mem.fill(0.0);
                    for (srow, &ki) in s.chunks_exact(dv).zip(kh) {
                        kv_mem.iter_mut().zip(srow).for_each(|(m, &e)| *m += e * ki);
                    }
                    // kv_mem becomes the update: beta (v - S^T k).
                    kv_mem
                        .iter_mut()
                        .zip(vh)
                        .for_each(|(m, &vj)| *m = (vj - *m) * beta);
                    for (srow, (&ki, &qi)) in s.chunks_exact_mut(dv).zip(kh.iter().zip(qh)) {
                        for ((e, &d), o) in srow.iter_mut().zip(&kv_mem).zip(o.iter_mut()) {
                            *e += ki * d;
                            *o += *e * qi;
                        }
                    }
                    // The RMSNorm gated by silu(z).
                    let sq = o.iter().map(|x| x * x).sum::<f32>();
                    let inv = 1.0 / (sq / dv as f32 + d.eps).sqrt();
                    for ((o, &w), &zj) in o.iter_mut().zip(&self.norm).zip(z) {
                        *o = *o * inv * w * silu(zj);
                    }
                }
                outs
            })
            .collect();
        for (h, outs) in heads.iter().enumerate() {
            for (row, o) in out.chunks_exact_mut(vw).zip(outs.chunks_exact(dv)) {
                row[h * dv..(h + 1) * dv].copy_from_slice(o);
            }
        }
    }
}

/// `CONV_THREADS`, `MAX_TAPS`, `RULE_THREADS`, `MAX_ROWS` and `MAX_DK` in
/// `gated_delta.cu`.
const CONV_THREADS: usize = 256;
const MAX_TAPS: usize = 8;
const RULE_THREADS: usize = 128;
const MAX_ROWS: usize = 128;
const MAX_DK: usize = 256;

/// Whether `gated_delta.cu` takes this shape: a value head that divides
/// its block's threads, key heads that fit its shared memory and, split
/// over the block's groups of rows, its registers, and a conv it holds in
/// registers. Qwen3.5's 128 x 128 heads and 4 taps are well inside.
pub fn supports(d: &DeltaDims) -> bool {
    let groups = RULE_THREADS / d.v_dim.max(1);
    (1..=MAX_TAPS).contains(&d.conv_kernel)
        && d.v_dim > 0
        && RULE_THREADS.is_multiple_of(d.v_dim)
        && d.k_dim <= MAX_DK
        && d.k_dim.div_ceil(groups) <= MAX_ROWS
}

/// `gated_delta.cu`'s buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaBuf {
    /// The projected rows, `[T, in_width]` f32.
    Rows,
    /// [`GatedDelta::params`].
    Params,
    /// Four `u32` per sequence ([`StepStates::device`]).
    Seqs,
    /// The state pool, `[slots, state_stride]` f32: read and written.
    States,
    /// `[T, conv_dim]` f32: the conv's outputs, written by the first launch
    /// and read by the second.
    Mixed,
    /// `[T, value_width]` f32: written.
    Out,
}

/// The two launches of one layer's step over `n_seqs` sequences, whose
/// states sit `state_at` into slots of `state_stride` f32: the conv, a
/// thread per channel of each sequence, then the recurrence, a block per
/// sequence and value head. `None` where [`supports`] does not take the
/// shape or an offset passes the kernels' `int`.
pub fn launches(
    d: &DeltaDims,
    n_seqs: usize,
    state_stride: usize,
    state_at: usize,
) -> Option<[Launch<DeltaBuf>; 2]> {
    let int = |x: usize| i32::try_from(x).ok();
    let (stride, at) = (int(state_stride)?, int(state_at)?);
    if !supports(d) || state_at + d.state_len() > state_stride {
        return None;
    }
    let (width, conv_dim, taps) = (int(d.in_width())?, int(d.conv_dim())?, d.conv_kernel as i32);
    let n_seqs = u32::try_from(n_seqs).ok()?;
    let conv = Launch {
        kernel: "delta_conv".into(),
        grid: (n_seqs, d.conv_dim().div_ceil(CONV_THREADS) as u32, 1),
        block: (CONV_THREADS as u32, 1, 1),
        args: vec![
            Arg::Buf(DeltaBuf::Rows),
            Arg::Buf(DeltaBuf::Params),
            Arg::Buf(DeltaBuf::Seqs),
            Arg::Buf(DeltaBuf::States),
            Arg::Buf(DeltaBuf::Mixed),
            Arg::I32(width),
            Arg::I32(conv_dim),
            Arg::I32(taps),
            Arg::I32(stride),
            Arg::I32(at),
        ],
    };
    let rule = Launch {
        kernel: "delta_rule".into(),
        grid: (n_seqs, d.v_heads as u32, 1),
        block: (RULE_THREADS as u32, 1, 1),
        args: vec![
            Arg::Buf(DeltaBuf::Rows),
            Arg::Buf(DeltaBuf::Mixed),
            Arg::Buf(DeltaBuf::Params),
            Arg::Buf(DeltaBuf::Seqs),
            Arg::Buf(DeltaBuf::States),
            Arg::Buf(DeltaBuf::Out),
            Arg::I32(width),
            Arg::I32(conv_dim),
            Arg::I32(taps),
            Arg::I32(d.k_heads as i32),
            Arg::I32(d.v_heads as i32),
            Arg::I32(d.k_dim as i32),
            Arg::I32(d.v_dim as i32),
            Arg::I32(i32::from(d.v_heads_tiled)),
            Arg::F32(d.eps),
            Arg::I32(stride),
            Arg::I32(at),
        ],
    };
    Some([conv, rule])
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Result, Storage, Tensor};

    use super::{launches, DeltaBuf, GatedDelta};
    use crate::launch;

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gated_delta.ptx"));
    const MODULE: &str = "wick_gated_delta";

    /// The step's recurrence on the device: `proj` `[T, in_width]`, `desc`
    /// the step's sequence descriptors, `pool` the states.
    pub fn forward(
        delta: &GatedDelta,
        proj: &Tensor,
        n_seqs: usize,
        desc: &Tensor,
        pool: &Tensor,
        state_at: usize,
    ) -> Result<Tensor> {
        let d = &delta.dims;
        let (t, width) = proj.dims2()?;
        let (slots, stride) = pool.dims2()?;
        let Some(params) = &delta.params else {
            candle_core::bail!("gated delta: constants not on the device");
        };
        let Some(plan) = launches(d, n_seqs, stride, state_at) else {
            candle_core::bail!("gated delta: no kernel for {d:?} at {state_at} of {stride}");
        };
        if width != d.in_width() || desc.dims1()? != 4 * n_seqs || pool.dtype() != DType::F32 {
            candle_core::bail!("gated delta: inputs of the wrong shape");
        }
        let rows = proj.to_dtype(DType::F32)?.contiguous()?;
        let (rows_s, _) = rows.storage_and_layout();
        let (params_s, _) = params.storage_and_layout();
        let (desc_s, _) = desc.storage_and_layout();
        let (pool_s, pool_l) = pool.storage_and_layout();
        let (
            Storage::Cuda(rows_s),
            Storage::Cuda(params_s),
            Storage::Cuda(desc_s),
            Storage::Cuda(pool_s),
        ) = (&*rows_s, &*params_s, &*desc_s, &*pool_s)
        else {
            candle_core::bail!("gated delta: inputs off the CUDA device");
        };
        if pool_l.contiguous_offsets() != Some((0, slots * stride)) {
            candle_core::bail!("gated delta: the state pool is a view");
        }
        let dev = rows_s.device().clone();
        let (conv_dim, vw) = (d.conv_dim(), d.value_width());
        // SAFETY: `alloc` leaves the memory unset. The conv launch writes
        // `mixed[row * conv_dim + ch]` for every row of every sequence and
        // every channel, before the rule launch (after it on the stream)
        // reads it; the rule launch writes `out[row * vw + h * dv + j]` for
        // every row, head and j (group 0's threads). The sequences' rows
        // are the step's `t` rows, each once (a batch's slices partition
        // it), so both are whole before anything reads them.
        let mixed = unsafe { dev.alloc::<f32>(t * conv_dim)? };
        let out = unsafe { dev.alloc::<f32>(t * vw)? };
        let rows_v = rows_s.as_cuda_slice::<f32>()?;
        let params_v = params_s.as_cuda_slice::<f32>()?;
        let desc_v = desc_s.as_cuda_slice::<u32>()?;
        let pool_v = pool_s.as_cuda_slice::<f32>()?;
        let stream = dev.cuda_stream();
        for l in &plan {
            let func = dev.get_or_load_custom_func(&l.kernel, MODULE, PTX)?;
            // SAFETY: the plan's arguments are `delta_conv`'s and
            // `delta_rule`'s parameters in order and type (buffers by role
            // below, scalars i32 and f32). Their accesses stay in bounds:
            // a sequence's rows `start..start + len` lie in the step's `t`
            // (the descriptors come from the batch's slices), and each reads
            // `rows[row * width ..][..width]` of the contiguous `[t, width]`
            // f32 copy above (`width` checked), writes `mixed` and `out`
            // within the `t` rows allocated above, reads `params` within
            // the `conv_dim * taps + 2 * v_heads + v_dim` values `new`
            // uploaded, and touches its slot's `state_at..state_at +
            // state_len` of the pool, which `launches` checked lies inside
            // a slot of `stride`, and `DeviceStates::open` that the slot is
            // below the pool's `slots`. The pool is written through a
            // shared reference: the scheduler thread owns it and the one
            // stream orders this step's layers and the next step after it;
            // no two sequences of a step share a slot.
            unsafe {
                launch::cuda::launch(&stream, &func, l, |b, role| {
                    match role {
                        DeltaBuf::Rows => b.arg(rows_v),
                        DeltaBuf::Params => b.arg(params_v),
                        DeltaBuf::Seqs => b.arg(desc_v),
                        DeltaBuf::States => b.arg(pool_v),
                        DeltaBuf::Mixed => b.arg(&mixed),
                        DeltaBuf::Out => b.arg(&out),
                    };
                })?;
            }
        }
        drop(mixed);
        let out = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev));
        Ok(Tensor::from_storage(
            out,
            (t, vw),
            BackpropOp::none(),
            false,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(v_dim: usize, k_dim: usize) -> DeltaDims {
        DeltaDims {
            conv_kernel: 4,
            k_heads: 2,
            v_heads: 4,
            k_dim,
            v_dim,
            v_heads_tiled: false,
            eps: 1e-6,
        }
    }

    #[test]
    fn the_kernel_takes_qwen35_heads_and_refuses_what_it_cannot_hold() {
        assert!(supports(&dims(128, 128)));
        assert!(supports(&dims(16, 16)));
        assert!(!supports(&dims(96, 128)), "96 does not divide the block");
        assert!(!supports(&dims(256, 128)), "wider than the block");
        assert!(!supports(&dims(1, 512)), "more key rows than shared memory");
        let mut d = dims(128, 128);
        d.conv_kernel = 9;
        assert!(!supports(&d));
    }

    #[test]
    fn launches_refuse_a_state_outside_its_slot() {
        let d = dims(16, 16);
        let len = d.state_len();
        assert!(launches(&d, 3, 2 * len, len).is_some());
        assert!(launches(&d, 3, 2 * len, len + 1).is_none());
        assert!(
            launches(&d, 3, usize::MAX, 0).is_none(),
            "past the kernels' int"
        );
        let [conv, rule] = launches(&d, 3, len, 0).unwrap();
        assert_eq!(
            conv.grid,
            (3, d.conv_dim().div_ceil(CONV_THREADS) as u32, 1)
        );
        assert_eq!(rule.grid, (3, 4, 1));
    }
}
