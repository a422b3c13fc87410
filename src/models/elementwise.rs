//! Elementwise steps of a layer on the CPU, as single passes on wick's rayon
//! threads: candle's versions hand prefill-sized tensors to candle's own
//! thread pool, whose workers then spin for a while after each op and take a
//! core from the matmuls, and its `swiglu` makes three passes (two strided).
//! Other devices use candle's ops, and on a CUDA device the residual add
//! and the norm after it are one launch (`add_rms_norm.cu`).

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::launch::{Arg, Launch};
use crate::vec_math::exp_rounded;

/// `a + b` for f32 tensors of one shape (the residual stream).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let host = a.device().is_cpu() && a.dtype() == DType::F32 && b.dtype() == DType::F32;
    match host && a.shape() == b.shape() {
        true => a.contiguous()?.apply_op2_no_bwd(&b.contiguous()?, &Add),
        false => a + b,
    }
}

/// `(x + y, rms_norm(x + y) * w)`: a residual add and the RMSNorm after
/// it, for `[rows, hidden]` activations and a `[hidden]` weight. On a CUDA
/// device, one pass (`add_rms_norm.cu`); elsewhere [`add`], then candle's
/// `rms_norm`.
pub fn add_rms_norm(x: &Tensor, y: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        if let Some(fused) = cuda::add_rms_norm(x, y, w, eps)? {
            return Ok(fused);
        }
    }
    let sum = add(x, y)?;
    let out = candle_nn::ops::rms_norm(&sum, w, eps)?;
    Ok((sum, out))
}

/// `add_rms_norm.cu`'s buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormBuf {
    /// `[rows, hidden]` each, in the launch's dtype.
    X,
    Y,
    /// `[hidden]`.
    W,
    /// `[rows, hidden]` each: written.
    Sum,
    Out,
}

/// `THREADS` in `add_rms_norm.cu`.
const NORM_THREADS: u32 = 256;

/// The fused add and norm over `rows` rows of `hidden` values of `dtype`
/// (f32, f16 or bf16): one block of exactly NORM_THREADS threads per row
/// (the kernel strides by it and sizes its shared partials by it); no
/// dynamic shared memory.
pub fn add_rms_norm_launch(rows: usize, hidden: usize, dtype: DType, eps: f32) -> Launch<NormBuf> {
    Launch {
        kernel: format!("add_rms_norm_{}", dtype.as_str()),
        grid: (rows as u32, 1, 1),
        block: (NORM_THREADS, 1, 1),
        args: vec![
            Arg::Buf(NormBuf::X),
            Arg::Buf(NormBuf::Y),
            Arg::Buf(NormBuf::W),
            Arg::I32(hidden as i32),
            Arg::F32(eps),
            Arg::Buf(NormBuf::Sum),
            Arg::Buf(NormBuf::Out),
        ],
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Result, Storage, Tensor};
    use half::{bf16, f16};

    use super::{add_rms_norm_launch, NormBuf};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/add_rms_norm.ptx"));
    const MODULE: &str = "wick_add_rms_norm";

    /// The fused pass, where the inputs suit it: `x` and `y` contiguous
    /// `[rows, hidden]` and `w` contiguous `[hidden]`, all of one dtype the
    /// kernel takes; else `None`, for the unfused ops.
    pub fn add_rms_norm(
        x: &Tensor,
        y: &Tensor,
        w: &Tensor,
        eps: f32,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Ok((rows, hidden)) = x.dims2() else {
            return Ok(None);
        };
        let same = y.dims() == x.dims() && w.dims() == [hidden];
        let typed = y.dtype() == x.dtype() && w.dtype() == x.dtype();
        if !same || !typed || rows == 0 || hidden == 0 {
            return Ok(None);
        }
        let (x, y, w) = (x.contiguous()?, y.contiguous()?, w.contiguous()?);
        match x.dtype() {
            DType::F32 => run::<f32>(&x, &y, &w, eps).map(Some),
            DType::F16 => run::<f16>(&x, &y, &w, eps).map(Some),
            DType::BF16 => run::<bf16>(&x, &y, &w, eps).map(Some),
            _ => Ok(None),
        }
    }

    fn view<'a, T: CudaDType + DeviceRepr>(
        s: &'a CudaStorage,
        t: &Tensor,
    ) -> Result<CudaView<'a, T>> {
        let Some((from, to)) = t.layout().contiguous_offsets() else {
            candle_core::bail!("add_rms_norm: a non-contiguous input");
        };
        Ok(s.as_cuda_slice::<T>()?.slice(from..to))
    }

    fn run<T: CudaDType + DeviceRepr + candle_core::WithDType>(
        x: &Tensor,
        y: &Tensor,
        w: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let (rows, hidden) = x.dims2()?;
        let (xs, _) = x.storage_and_layout();
        let (ys, _) = y.storage_and_layout();
        let (ws, _) = w.storage_and_layout();
        let (Storage::Cuda(xs), Storage::Cuda(ys), Storage::Cuda(ws)) = (&*xs, &*ys, &*ws) else {
            candle_core::bail!("add_rms_norm: inputs on different devices");
        };
        let dev = xs.device().clone();
        let n = rows * hidden;
        // SAFETY: `alloc` leaves the memory unset; the launch below has a
        // block per row whose threads write every one of the row's `hidden`
        // values of both halves (`sum` and `out`) before anything reads
        // them, the stream ordering later reads after it.
        let both = unsafe { dev.alloc::<T>(2 * n)? };
        // The launch borrows the halves; `both` is wrapped after it.
        {
            let (sum, out) = (both.slice(..n), both.slice(n..));
            let (xv, yv, wv) = (view::<T>(xs, x)?, view::<T>(ys, y)?, view::<T>(ws, w)?);
            let launch = add_rms_norm_launch(rows, hidden, T::DTYPE, eps);
            let func = dev.get_or_load_custom_func(&launch.kernel, MODULE, PTX)?;
            let stream = dev.cuda_stream();
            // SAFETY: the arguments match `add_rms_norm_<dtype>(const T*, const
            // T*, const T*, int, float, T*, T*)` in order and type (`T::DTYPE`
            // names the instantiation). Block `r < rows` reads `x` and `y` at
            // `r * hidden..][..hidden]`, inside their contiguous `[rows, hidden]`
            // views (shapes checked by the caller), and `w[..hidden]` (checked
            // `[hidden]`); it writes the same range of `sum` and `out`, the two
            // halves of the allocation above, which nothing else holds.
            unsafe {
                crate::launch::cuda::launch(&stream, &func, &launch, |b, role| {
                    match role {
                        NormBuf::X => b.arg(&xv),
                        NormBuf::Y => b.arg(&yv),
                        NormBuf::W => b.arg(&wv),
                        NormBuf::Sum => b.arg(&sum),
                        NormBuf::Out => b.arg(&out),
                    };
                })?;
            }
        }
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(both, dev));
        let both = Tensor::from_storage(storage, (2, rows, hidden), BackpropOp::none(), false);
        Ok((both.get(0)?, both.get(1)?))
    }
}

/// The contiguous f32 values of a tensor's storage.
fn values<'s>(storage: &'s CpuStorage, layout: &Layout) -> Result<&'s [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("elementwise input must be contiguous".into()))?;
    Ok(&storage.as_slice::<f32>()?[start..end])
}

/// `len` values, written a chunk of `chunk` at a time (in parallel when
/// there are several) by `fill(i, chunk_i)`, which returns how many it
/// wrote. Nothing is zeroed first: prefill-sized outputs are megabytes, and
/// zeroing them was a second pass over memory (in a SmolLM2 prefill profile,
/// longer than `add` itself).
fn written(
    len: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) -> usize + Sync,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    if len == 0 {
        return out;
    }
    let spare = &mut out.spare_capacity_mut()[..len];
    let run = |(i, o): (usize, &mut [MaybeUninit<f32>])| {
        let n = o.len();
        assert_eq!(fill(i, o), n, "elementwise: chunk {i} not fully written");
    };
    match len > chunk {
        true => spare.par_chunks_mut(chunk).enumerate().for_each(run),
        false => run((0, spare)),
    }
    // SAFETY: every chunk, hence each of the `len` values, was written (the
    // assertion above), and the capacity is `len`.
    unsafe { out.set_len(len) };
    out
}

/// Values per parallel task of `add`.
const ADD_CHUNK: usize = 1 << 14;

struct Add;

impl CustomOp2 for Add {
    fn name(&self) -> &'static str {
        "wick-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (a, b) = (values(s1, l1)?, values(s2, l2)?);
        if a.len() != b.len() {
            candle_core::bail!("add of {} and {} values", a.len(), b.len());
        }
        let out = written(a.len(), ADD_CHUNK, |i, o| {
            let at = i * ADD_CHUNK;
            let (a, b) = (&a[at..at + o.len()], &b[at..at + o.len()]);
            o.iter_mut()
                .zip(a.iter().zip(b))
                .map(|(o, (a, b))| o.write(a + b))
                .count()
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// The activation on the gate of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// SwiGLU (Llama and most others).
    Silu,
    /// GeGLU with GELU's tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: [`swiglu_oai`].
    SwigluOai,
}

/// gpt-oss's SwiGLU limit and sigmoid slope (fixed in its code and in
/// llama.cpp's).
pub const SWIGLU_LIMIT: f32 = 7.0;
const SWIGLU_ALPHA: f32 = 1.702;

/// A gated MLP's activation over a stacked gate/up projection,
/// `act(gate) * up`. `x`: `[rows, 2 * f]` with gate first. Returns
/// `[rows, f]`.
pub fn glu(x: &Tensor, act: Act) -> Result<Tensor> {
    let f = x.dim(1)? / 2;
    match (x.device().is_cpu() && x.dtype() == DType::F32, act) {
        (true, _) => x.contiguous()?.apply_op1_no_bwd(&Glu(act)),
        (false, Act::Silu) => candle_nn::ops::swiglu(x),
        (false, Act::GeluTanh) => x.narrow(1, 0, f)?.gelu()? * x.narrow(1, f, f)?,
        (false, Act::SwigluOai) => {
            let lim = SWIGLU_LIMIT as f64;
            let g = x.narrow(1, 0, f)?.minimum(lim)?;
            let u = x.narrow(1, f, f)?.clamp(-lim, lim)?;
            let s = candle_nn::ops::sigmoid(&(&g * SWIGLU_ALPHA as f64)?)?;
            (g * s)? * (u + 1.0)?
        }
    }
}

/// GELU's tanh approximation of every value (GPT-2's MLP, a SigLIP
/// tower's): [`gelu_tanh`] on the host in f32, which vectorizes where
/// candle's calls libm's `tanh` per value; candle's elsewhere.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    match x.device().is_cpu() && x.dtype() == DType::F32 {
        true => x.contiguous()?.apply_op1_no_bwd(&Gelu),
        false => x.gelu(),
    }
}

struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "wick-gelu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = values(storage, layout)?;
        let out = written(x.len(), GLU_CHUNK, |i, o| {
            let x = &x[i * GLU_CHUNK..i * GLU_CHUNK + o.len()];
            o.iter_mut()
                .zip(x)
                .map(|(o, &v)| o.write(gelu_tanh(v)))
                .count()
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// `x * sigmoid(x)`, written as candle writes it, with an exponential that
/// vectorizes yet nearly always equals libm's to the bit: the greedy parity
/// test showed that a few-ulp approximation here moves Q4_1 logits enough to
/// flip near-ties.
#[inline]
pub(super) fn silu(x: f32) -> f32 {
    x / (1.0 + exp_rounded(-x))
}

/// GELU's tanh approximation, `0.5 x (1 + tanh(u))`, written as the equal
/// `x / (1 + e^(-2u))` so it takes silu's vectorizing exponential rather
/// than libm's scalar `tanh` (several times slower per element, and Gemma's
/// MLP is the widest activation in its prefill).
#[inline]
pub(super) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_TWO_OVER_PI * x * (1.0 + 0.044715 * x * x);
    x / (1.0 + exp_rounded(-2.0 * u))
}

/// `min(g, 7) σ(1.702 min(g, 7)) (clamp(u, ±7) + 1)`, gpt-oss's gated
/// activation, its sigmoid written as silu's.
#[inline]
pub(super) fn swiglu_oai(g: f32, u: f32) -> f32 {
    let g = g.min(SWIGLU_LIMIT);
    let u = u.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT);
    g / (1.0 + exp_rounded(-SWIGLU_ALPHA * g)) * (u + 1.0)
}

/// Output values per parallel task of `glu` and `gelu`: a decode step's few rows are
/// split too, since one thread alone over a 9-row verification step's
/// activations showed as 8% of a speculative decoding profile.
const GLU_CHUNK: usize = 1 << 12;

struct Glu(Act);

impl CustomOp1 for Glu {
    fn name(&self) -> &'static str {
        "wick-glu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = layout.shape().dims2()?;
        if !width.is_multiple_of(2) {
            candle_core::bail!("swiglu input width {width} is not even");
        }
        let x = values(storage, layout)?;
        // A function item per activation, not a pointer, so that each loop
        // is compiled with its activation inlined and vectorized.
        let out = match self.0 {
            Act::Silu => gated(x, rows, width / 2, |g, u| silu(g) * u),
            Act::GeluTanh => gated(x, rows, width / 2, |g, u| gelu_tanh(g) * u),
            Act::SwigluOai => gated(x, rows, width / 2, swiglu_oai),
        };
        Ok((CpuStorage::F32(out), Shape::from((rows, width / 2))))
    }
}

/// `act(gate, up)` for each of `rows` rows of `[gate (f) | up (f)]`.
fn gated(x: &[f32], rows: usize, f: usize, act: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    written(rows * f, GLU_CHUNK, |i, o| {
        let mut at = i * GLU_CHUNK;
        let mut o = &mut o[..];
        while !o.is_empty() {
            let (row, col) = (at / f, at % f);
            let n = (f - col).min(o.len());
            let (gate, up) = x[row * 2 * f..(row + 1) * 2 * f].split_at(f);
            let (head, rest) = o.split_at_mut(n);
            for (o, (&g, &u)) in head.iter_mut().zip(gate[col..].iter().zip(&up[col..])) {
                o.write(act(g, u));
            }
            (o, at) = (rest, at + n);
        }
        at - i * GLU_CHUNK
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Both sizes (serial and parallel) against candle's add.
    #[test]
    fn add_matches_candle() {
        for n in [5, 3 * ADD_CHUNK + 7] {
            let a: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.37 - 11.0).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 89) as f32 * -0.21 + 3.0).collect();
            let a = Tensor::from_vec(a, (n, 1), &Device::Cpu).unwrap();
            let b = Tensor::from_vec(b, (n, 1), &Device::Cpu).unwrap();
            let got = add(&a, &b)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let want = (&a + &b)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(got, want);
        }
    }

    /// SwiGLU against candle's op (the other-device path) to the ulp, and
    /// GeGLU against its formula in f64 (candle's f32 `1 + tanh` loses
    /// digits where tanh nears -1), over values across the activations'
    /// range, and sizes that take the parallel branch with chunks that
    /// start and end inside rows.
    /// Against candle's GELU (tanh form), over a range and lengths on
    /// either side of a parallel chunk.
    #[test]
    fn gelu_matches_candle_s() {
        for len in [7, GLU_CHUNK + 3] {
            let data: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 1001) as f32 - 500.0) * 0.02)
                .collect();
            let x = Tensor::from_vec(data, (len,), &Device::Cpu).unwrap();
            let got = gelu(&x).unwrap().to_vec1::<f32>().unwrap();
            let want = x.gelu().unwrap().to_vec1::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "{g} against {w}");
            }
        }
    }

    #[test]
    fn glu_matches_its_references() {
        for ((rows, f), act) in [(1, 24), (3, 24), (9, 1000), (3, 5000)]
            .into_iter()
            .flat_map(|r| [(r, Act::Silu), (r, Act::GeluTanh), (r, Act::SwigluOai)])
        {
            let data: Vec<f32> = (0..rows * 2 * f)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.35)
                .collect();
            let x = Tensor::from_vec(data.clone(), (rows, 2 * f), &Device::Cpu).unwrap();
            let got = glu(&x, act).unwrap();
            assert_eq!(got.dims(), &[rows, f]);
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            match act {
                Act::Silu => {
                    let want = candle_nn::ops::swiglu(&x).unwrap();
                    let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let ulps = got
                        .iter()
                        .zip(&want)
                        .map(|(g, w)| (g.to_bits() as i64 - w.to_bits() as i64).abs())
                        .max()
                        .unwrap();
                    assert!(ulps <= 1, "{ulps} ulps from candle's swiglu");
                }
                Act::GeluTanh => {
                    for (i, &g) in got.iter().enumerate() {
                        let row = &data[(i / f) * 2 * f..];
                        let (gate, up) = (row[i % f] as f64, row[f + i % f] as f64);
                        let u =
                            (2.0 / std::f64::consts::PI).sqrt() * (gate + 0.044715 * gate.powi(3));
                        let want = 0.5 * gate * (1.0 + u.tanh()) * up;
                        let err = (g as f64 - want).abs() / want.abs().max(1e-3);
                        assert!(err < 1e-5, "gelu({gate}) * {up}: {g} against {want}");
                    }
                }
                // Against its formula in f64, and the other-device path.
                Act::SwigluOai => {
                    for (i, &g) in got.iter().enumerate() {
                        let row = &data[(i / f) * 2 * f..];
                        let (gate, up) = (row[i % f] as f64, row[f + i % f] as f64);
                        let gate = gate.min(7.0);
                        let want =
                            gate / (1.0 + (-1.702 * gate).exp()) * (up.clamp(-7.0, 7.0) + 1.0);
                        let err = (g as f64 - want).abs() / want.abs().max(1e-3);
                        assert!(err < 1e-5, "swiglu_oai({gate}, {up}): {g} against {want}");
                    }
                    let x = x.to_dtype(DType::F64).unwrap();
                    let other = glu(&x, act).unwrap().to_dtype(DType::F32).unwrap();
                    let other = other.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    for (g, o) in got.iter().zip(&other) {
                        assert!((g - o).abs() <= 1e-5 * o.abs().max(1e-3), "{g} vs {o}");
                    }
                }
            }
        }
    }
}
