//! Rotary position embeddings, applied to the query and key heads of stacked
//! q/k/v rows where the fused projection left them, each row at its own
//! position (a flat batch mixes sequences). On the CPU one pass rotates a
//! copy of the rows in place; other devices use candle's rope ops.

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows per parallel task: below two tasks' worth the pass runs on the
/// calling thread (a decode step's rows take a few microseconds).
const ROWS_PER_TASK: usize = 32;

pub struct Rope {
    /// `[max_context, rot_dim / 2]` cos and sin of position × frequency.
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The same tables on the model's device, for candle's ops.
    cos_t: Tensor,
    sin_t: Tensor,
    head_dim: usize,
    /// The leading dimensions of each head that rotate (all, or part for
    /// Phi-4-mini's partial rotary).
    rot_dim: usize,
    /// Rotate adjacent pairs (GGUF, whose converter permutes q/k for it)
    /// rather than the two halves of each head (Hugging Face).
    interleaved: bool,
}

impl Rope {
    /// Tables for positions `0..max_context` from the per-pair inverse
    /// frequencies (`rot_dim / 2` of them, for heads of `head_dim`), cos and
    /// sin multiplied by `scale` (LongRoPE's attention factor; else 1).
    pub fn new(
        inv_freq: &[f32],
        head_dim: usize,
        scale: f32,
        max_context: usize,
        interleaved: bool,
        device: &Device,
    ) -> Result<Self> {
        let half = inv_freq.len();
        if 2 * half > head_dim {
            candle_core::bail!("rope: {half} frequencies for heads of {head_dim}");
        }
        let inv = Tensor::from_slice(inv_freq, (1, half), &Device::Cpu)?;
        let pos = Tensor::arange(0u32, max_context as u32, &Device::Cpu)?
            .to_dtype(DType::F32)?
            .reshape((max_context, 1))?;
        let angles = pos.broadcast_mul(&inv)?;
        let (mut cos_t, mut sin_t) = (angles.cos()?, angles.sin()?);
        if scale != 1.0 {
            (cos_t, sin_t) = ((cos_t * scale as f64)?, (sin_t * scale as f64)?);
        }
        Ok(Rope {
            cos: cos_t.flatten_all()?.to_vec1()?,
            sin: sin_t.flatten_all()?.to_vec1()?,
            cos_t: cos_t.to_device(device)?,
            sin_t: sin_t.to_device(device)?,
            head_dim,
            rot_dim: 2 * half,
            interleaved,
        })
    }

    /// `qkv`: `[T, width]` stacked rows. Returns them with the first
    /// `rotated` heads of row `t` (the query and key heads) rotated to
    /// `positions[t]`, the rest (value heads) as they were. `on_device` is
    /// `positions` on `qkv`'s device (a view of the step's upload).
    pub fn apply(
        &self,
        qkv: &Tensor,
        positions: &[u32],
        on_device: &Tensor,
        rotated: usize,
    ) -> Result<Tensor> {
        let (t, width) = qkv.dims2()?;
        if t != positions.len() || rotated * self.head_dim > width {
            candle_core::bail!(
                "rope: {t} rows of {width} for {} positions and {rotated} heads of {}",
                positions.len(),
                self.head_dim
            );
        }
        let max = self.cos.len() / (self.rot_dim / 2);
        if let Some(p) = positions.iter().find(|&&p| p as usize >= max) {
            candle_core::bail!("rope: position {p} is past the {max} the model was built for");
        }
        match qkv.device().is_cpu() && qkv.dtype() == DType::F32 {
            true => qkv.contiguous()?.apply_op1_no_bwd(&HostRope {
                rope: self,
                positions,
                rotated,
            }),
            false => self.apply_candle(qkv, on_device, rotated),
        }
    }

    /// The any-device path: candle's rope over the gathered table rows.
    fn apply_candle(&self, qkv: &Tensor, pos: &Tensor, rotated: usize) -> Result<Tensor> {
        let (t, width) = qkv.dims2()?;
        let (hd, rd, split) = (self.head_dim, self.rot_dim, rotated * self.head_dim);
        // `(b = T, t = 1, d / 2)` rows for candle's `(T, heads, 1, d)` layout.
        let table = |x: &Tensor| x.index_select(pos, 0)?.reshape((t, 1, rd / 2));
        let (cos, sin) = (table(&self.cos_t)?, table(&self.sin_t)?);
        let rope = match self.interleaved {
            true => candle_nn::rotary_emb::rope_i,
            false => candle_nn::rotary_emb::rope,
        };
        let heads = qkv.narrow(1, 0, split)?.reshape((t, rotated, 1, hd))?;
        let rot = rope(&heads.narrow(3, 0, rd)?.contiguous()?, &cos, &sin)?;
        let heads = match rd < hd {
            true => Tensor::cat(&[rot, heads.narrow(3, rd, hd - rd)?], 3)?,
            false => rot,
        }
        .reshape((t, split))?;
        match split < width {
            true => Tensor::cat(&[heads, qkv.narrow(1, split, width - split)?], 1),
            false => Ok(heads),
        }
    }
}

struct HostRope<'a> {
    rope: &'a Rope,
    positions: &'a [u32],
    rotated: usize,
}

impl HostRope<'_> {
    /// Rotates the leading heads of one row in place, as candle's kernels
    /// compute it (same products, same order: the same bits).
    fn row(&self, row: &mut [f32], pos: u32) {
        let (hd, rd) = (self.rope.head_dim, self.rope.rot_dim);
        let half = rd / 2;
        let at = pos as usize * half;
        let (cos, sin) = (&self.rope.cos[at..at + half], &self.rope.sin[at..at + half]);
        for head in row[..self.rotated * hd].chunks_exact_mut(hd) {
            let head = &mut head[..rd];
            if self.rope.interleaved {
                for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * c - x1 * s;
                    pair[1] = x0 * s + x1 * c;
                }
            } else {
                let (lo, hi) = head.split_at_mut(half);
                for ((a, b), (&c, &s)) in lo.iter_mut().zip(hi).zip(cos.iter().zip(sin)) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * c - x1 * s;
                    *b = x0 * s + x1 * c;
                }
            }
        }
    }
}

impl CustomOp1 for HostRope<'_> {
    fn name(&self) -> &'static str {
        "wick-rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (t, width) = layout.shape().dims2()?;
        let (from, to) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("rope input must be contiguous".into()))?;
        let mut out = storage.as_slice::<f32>()?[from..to].to_vec();
        if t >= 2 * ROWS_PER_TASK {
            out.par_chunks_mut(ROWS_PER_TASK * width)
                .zip(self.positions.par_chunks(ROWS_PER_TASK))
                .for_each(|(rows, pos)| {
                    for (row, &p) in rows.chunks_exact_mut(width).zip(pos) {
                        self.row(row, p);
                    }
                });
        } else {
            for (row, &p) in out.chunks_exact_mut(width).zip(self.positions) {
                self.row(row, p);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((t, width))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host pass against candle's ops (the other-device path), both pair
    /// layouts, whole and partial rotary, scaled or not, serial and
    /// parallel row counts, bit for bit; value heads and the unrotated tail
    /// of each head untouched.
    #[test]
    fn host_pass_equals_candle_rope() {
        let (hd, rotated, width) = (8, 3, 5 * 8);
        for (interleaved, rd, scale) in [(true, 8, 1.0), (false, 8, 1.0), (false, 6, 1.19)] {
            let inv_freq: Vec<f32> = (0..rd / 2)
                .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / rd as f32))
                .collect();
            let rope = Rope::new(&inv_freq, hd, scale, 512, interleaved, &Device::Cpu).unwrap();
            for t in [1, 5, 2 * ROWS_PER_TASK + 3] {
                let data: Vec<f32> = (0..t * width)
                    .map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.05)
                    .collect();
                let qkv = Tensor::from_vec(data.clone(), (t, width), &Device::Cpu).unwrap();
                let positions: Vec<u32> = (0..t as u32).map(|i| (i * 37) % 500).collect();
                let on_device = Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
                let got = rope.apply(&qkv, &positions, &on_device, rotated).unwrap();
                let want = rope.apply_candle(&qkv, &on_device, rotated).unwrap();
                let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
                let want: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
                assert_eq!(got, want, "interleaved={interleaved} t={t}");
                for (r, row) in got.chunks_exact(width).enumerate() {
                    let was = &data[r * width..(r + 1) * width];
                    assert_eq!(row[rotated * hd..], was[rotated * hd..]);
                    for h in 0..rotated {
                        assert_eq!(
                            row[h * hd + rd..(h + 1) * hd],
                            was[h * hd + rd..(h + 1) * hd]
                        );
                    }
                    if positions[r] > 0 {
                        assert_ne!(row[..hd], data[r * width..r * width + hd]);
                    }
                }
            }
            let qkv = Tensor::zeros((1, width), DType::F32, &Device::Cpu).unwrap();
            let at = Tensor::new(&[512u32], &Device::Cpu).unwrap();
            assert!(rope.apply(&qkv, &[512], &at, rotated).is_err());
        }
    }
}
