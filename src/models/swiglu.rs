//! SwiGLU over a stacked gate/up projection: `silu(gate) * up`.
//!
//! On the CPU one pass reads each row's gate and up halves and writes the
//! product; candle's `swiglu` makes three passes (two strided) and hands
//! large tensors to its own thread pool, whose workers then spin against
//! wick's rayon threads. Other devices use candle's op.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::vec_math::exp_rounded;

/// `x`: `[rows, 2 * f]` with gate first. Returns `[rows, f]`.
pub fn swiglu(x: &Tensor) -> Result<Tensor> {
    match x.device().is_cpu() && x.dtype() == candle_core::DType::F32 {
        true => x.contiguous()?.apply_op1_no_bwd(&SwiGlu),
        false => candle_nn::ops::swiglu(x),
    }
}

/// `x * sigmoid(x)`, written as candle writes it, with an exponential that
/// vectorizes yet nearly always equals libm's to the bit: the greedy parity
/// test showed that a few-ulp approximation here moves Q4_1 logits enough to
/// flip near-ties.
#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp_rounded(-x))
}

/// Rows per parallel task: enough work to outweigh handing it to a thread.
const ROWS_PER_TASK: usize = 16;

struct SwiGlu;

impl CustomOp1 for SwiGlu {
    fn name(&self) -> &'static str {
        "wick-swiglu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = layout.shape().dims2()?;
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("swiglu input must be contiguous".into()))?;
        if !width.is_multiple_of(2) {
            candle_core::bail!("swiglu input width {width} is not even");
        }
        let x = &storage.as_slice::<f32>()?[start..end];
        let f = width / 2;
        let mut out = vec![0f32; rows * f];
        let row = |(o, x): (&mut [f32], &[f32])| {
            let (gate, up) = x.split_at(f);
            for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                *o = silu(g) * u;
            }
        };
        let rows_of = |o: &mut [f32], x: &[f32]| {
            o.chunks_exact_mut(f)
                .zip(x.chunks_exact(width))
                .for_each(row)
        };
        if rows > ROWS_PER_TASK {
            out.par_chunks_mut(ROWS_PER_TASK * f)
                .zip(x.par_chunks(ROWS_PER_TASK * width))
                .for_each(|(o, x)| rows_of(o, x));
        } else {
            rows_of(&mut out, x);
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, f))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The fused op against candle's (the other-device path), over rows
    /// enough to take the parallel branch and values across silu's range.
    #[test]
    fn matches_candle_swiglu() {
        for rows in [1, 3, 40] {
            let f = 24;
            let data: Vec<f32> = (0..rows * 2 * f)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.35)
                .collect();
            let x = Tensor::from_vec(data, (rows, 2 * f), &Device::Cpu).unwrap();
            let got = swiglu(&x).unwrap();
            let want = candle_nn::ops::swiglu(&x).unwrap();
            assert_eq!(got.dims(), want.dims());
            let (got, want) = (
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            let ulps = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g.to_bits() as i64 - w.to_bits() as i64).abs())
                .max()
                .unwrap();
            assert!(ulps <= 1, "{ulps} ulps from candle's swiglu");
        }
    }
}
