//! Attention of every query to every key of one set, with no mask and no
//! cache: a vision tower's patches attending to each other. On the host,
//! each work item takes [`ROWS`] queries of one head and folds the keys in
//! a tile at a time into a running softmax (flash attention's online
//! softmax), so the `[queries, keys]` score matrix is never formed. For an
//! 896 x 896 SigLIP image that matrix is 16 heads x 4096 x 4096 f32, 1 GiB
//! a layer, whose page faults and scalar `exp` took a third of the tower's
//! time as candle ops.
//!
//! Keys are transposed to `[head_dim][key]`, so a query scores 16 keys per
//! vector operation with no horizontal sums; values stay `[key][head_dim]`,
//! so an output row accumulates 16 dimensions per vector operation. Two
//! queries go together, so that each key or value vector loaded serves
//! both. Queries, keys and dimensions are padded with zeros to whole work
//! items, tiles and vectors, and a padded key's score is -inf.

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use crate::vec_math::{fast_exp, max_of, mul_add, sum_of};

/// One vector's worth of f32.
const LANES: usize = 16;
/// Keys scored at once, in independent accumulators (an FMA's latency
/// covered).
const GROUP: usize = 4 * LANES;
/// Keys per tile: a tile of keys and values stays in cache while the work
/// item's queries use it.
const TILE: usize = 2 * GROUP;
/// Queries per work item (in pairs).
const ROWS: usize = 16;

/// `softmax(q k^T * scale) v` for `q`, `k` and `v` of `[groups, n, d]`
/// (f32, on the host): each of `groups` (an image's head) attends within
/// itself.
pub fn dense_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    DenseKeys::new(k, v)?.attend(q, scale)
}

/// A set's keys and values laid out for the kernel once, for any number
/// of query chunks to attend to: a tower run a chunk of patches at a time
/// packs a layer's keys once.
pub struct DenseKeys {
    /// `[groups, d, np]`: keys transposed, padded with zero keys.
    kt: Vec<f32>,
    /// `[groups, np, dp]`: values padded with zero keys and dimensions.
    v: Vec<f32>,
    groups: usize,
    n: usize,
    d: usize,
}

impl DenseKeys {
    /// `k` and `v` of `[groups, n, d]`, f32 on the host.
    pub fn new(k: &Tensor, v: &Tensor) -> Result<Self> {
        let (groups, n, d) = operands(k, v)?;
        // Keys padded to whole tiles, dimensions to whole vectors, with
        // zeros.
        let np = n.div_ceil(TILE) * TILE;
        let dp = d.div_ceil(LANES) * LANES;
        let kt = k
            .transpose(1, 2)?
            .pad_with_zeros(2, 0, np - n)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let v = v
            .pad_with_zeros(2, 0, dp - d)?
            .pad_with_zeros(1, 0, np - n)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(DenseKeys {
            kt,
            v,
            groups,
            n,
            d,
        })
    }

    /// `softmax(q k^T * scale) v` for queries `q` of `[groups, m, d]`.
    pub fn attend(&self, q: &Tensor, scale: f32) -> Result<Tensor> {
        let (groups, n, d) = (self.groups, self.n, self.d);
        let m = queries(q, groups, d)?;
        let np = n.div_ceil(TILE) * TILE;
        let dp = d.div_ceil(LANES) * LANES;
        // Queries padded to whole work items with zeros.
        let mq = m.div_ceil(ROWS) * ROWS;
        let q = q
            .pad_with_zeros(1, 0, mq - m)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let mut out = vec![0f32; groups * mq * dp];
        out.par_chunks_mut(mq * dp)
            .enumerate()
            .for_each(|(g, out_g)| {
                let head = Head {
                    q: &q[g * mq * d..(g + 1) * mq * d],
                    kt: &self.kt[g * d * np..(g + 1) * d * np],
                    v: &self.v[g * np * dp..(g + 1) * np * dp],
                    n,
                    d,
                    dp,
                    scale,
                };
                out_g
                    .par_chunks_mut(ROWS * dp)
                    .enumerate()
                    .for_each(|(b, out_rows)| head.rows(b * ROWS, out_rows));
            });
        Tensor::from_vec(out, (groups, mq, dp), &Device::Cpu)?
            .narrow(1, 0, m)?
            .narrow(2, 0, d)?
            .contiguous()
    }
}

/// `[groups, n, d]` of `k` and `v`, which must be of one shape in f32 on
/// the host.
pub(super) fn operands(k: &Tensor, v: &Tensor) -> Result<(usize, usize, usize)> {
    let (groups, n, d) = k.dims3()?;
    for t in [k, v] {
        if t.dims() != [groups, n, d] || t.dtype() != DType::F32 || !t.device().is_cpu() {
            candle_core::bail!(
                "dense attention takes k and v of one shape in f32 on the host, not {:?} {:?}",
                t.dims(),
                t.dtype()
            );
        }
    }
    Ok((groups, n, d))
}

/// The number of queries in `q`, which must be `[groups, m, d]` f32 on the
/// host.
pub(super) fn queries(q: &Tensor, groups: usize, d: usize) -> Result<usize> {
    match q.dims3() {
        Ok((g, m, e))
            if g == groups && e == d && q.dtype() == DType::F32 && q.device().is_cpu() =>
        {
            Ok(m)
        }
        _ => candle_core::bail!(
            "dense attention takes queries of [{groups}, _, {d}] f32 on the host, not {:?} {:?}",
            q.dims(),
            q.dtype()
        ),
    }
}

/// One head's queries, transposed keys and values, as laid out above.
struct Head<'a> {
    q: &'a [f32],
    kt: &'a [f32],
    v: &'a [f32],
    /// Keys that are real (the rest are padding).
    n: usize,
    d: usize,
    dp: usize,
    scale: f32,
}

impl Head<'_> {
    fn np(&self) -> usize {
        self.kt.len() / self.d
    }

    /// Queries `first..first + ROWS` into `out` (`ROWS` rows of `dp`),
    /// two at a time: each key or value vector loaded serves both.
    fn rows(&self, first: usize, out: &mut [f32]) {
        let (d, dp) = (self.d, self.dp);
        let mut max = [f32::NEG_INFINITY; ROWS];
        let mut sum = [0f32; ROWS];
        let mut p = [[0f32; TILE]; 2];
        for t0 in (0..self.np()).step_by(TILE) {
            for r in (0..ROWS).step_by(2) {
                let query = |r: usize| &self.q[(first + r) * d..(first + r + 1) * d];
                self.score(query(r), query(r + 1), t0, &mut p);
                let mut rescale = [0f32; 2];
                for (i, row) in [r, r + 1].into_iter().enumerate() {
                    let scores = &mut p[i];
                    let new_max = max[row].max(max_of(scores) * self.scale);
                    for s in scores.iter_mut() {
                        *s = fast_exp(mul_add(*s, self.scale, -new_max));
                    }
                    rescale[i] = fast_exp(max[row] - new_max);
                    sum[row] = mul_add(sum[row], rescale[i], sum_of(scores));
                    max[row] = new_max;
                }
                let (o0, o1) = out.split_at_mut((r + 1) * dp);
                self.accumulate(&p, t0, rescale, &mut o0[r * dp..], &mut o1[..dp]);
            }
        }
        for (r, row) in out.chunks_exact_mut(dp).enumerate() {
            let inv = 1.0 / sum[r];
            row.iter_mut().for_each(|o| *o *= inv);
        }
    }

    /// Two queries' unscaled scores for keys `t0..t0 + TILE`; -inf for
    /// padding keys.
    // Not inlined: inside the row loop its accumulators spill to the stack
    // (the benchmark ran three times slower).
    #[inline(never)]
    fn score(&self, q0: &[f32], q1: &[f32], t0: usize, p: &mut [[f32; TILE]; 2]) {
        let np = self.np();
        for g in (0..TILE).step_by(GROUP) {
            let at = t0 + g;
            let mut a0 = [[0f32; LANES]; 4];
            let mut a1 = [[0f32; LANES]; 4];
            for (j, (&x0, &x1)) in q0.iter().zip(q1).enumerate() {
                let keys = &self.kt[j * np + at..j * np + at + GROUP];
                for ((b0, b1), ks) in a0
                    .iter_mut()
                    .zip(a1.iter_mut())
                    .zip(keys.chunks_exact(LANES))
                {
                    for ((y0, y1), &kv) in b0.iter_mut().zip(b1.iter_mut()).zip(ks) {
                        *y0 = mul_add(x0, kv, *y0);
                        *y1 = mul_add(x1, kv, *y1);
                    }
                }
            }
            for (i, a) in [a0, a1].iter().enumerate() {
                for (dst, v) in p[i][g..g + GROUP].chunks_exact_mut(LANES).zip(a) {
                    dst.copy_from_slice(v);
                }
            }
        }
        let real = self.n.saturating_sub(t0).min(TILE);
        for scores in p.iter_mut() {
            scores[real..].fill(f32::NEG_INFINITY);
        }
    }

    /// `o_i = o_i * rescale[i] + sum_j p[i][j] v[t0 + j]` for the two rows.
    // Not inlined, as `score`.
    #[inline(never)]
    fn accumulate(
        &self,
        p: &[[f32; TILE]; 2],
        t0: usize,
        rescale: [f32; 2],
        o0: &mut [f32],
        o1: &mut [f32],
    ) {
        let dp = self.dp;
        for (c, (d0, d1)) in o0
            .chunks_exact_mut(LANES)
            .zip(o1.chunks_exact_mut(LANES))
            .enumerate()
        {
            // Two keys' chains per row at once.
            let mut a0 = [[0f32; LANES]; 2];
            let mut a1 = [[0f32; LANES]; 2];
            for (j2, (w0, w1)) in p[0].chunks_exact(2).zip(p[1].chunks_exact(2)).enumerate() {
                let at = (t0 + 2 * j2) * dp + c * LANES;
                for k in 0..2 {
                    let vals = &self.v[at + k * dp..at + k * dp + LANES];
                    for ((y0, y1), &vv) in a0[k].iter_mut().zip(a1[k].iter_mut()).zip(vals) {
                        *y0 = mul_add(w0[k], vv, *y0);
                        *y1 = mul_add(w1[k], vv, *y1);
                    }
                }
            }
            for (l, (x0, x1)) in d0.iter_mut().zip(d1.iter_mut()).enumerate() {
                *x0 = mul_add(*x0, rescale[0], a0[0][l] + a0[1][l]);
                *x1 = mul_add(*x1, rescale[1], a1[0][l] + a1[1][l]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::dense_bf16::{dense_attention_bf16, Bf16Keys};

    /// The same attention as candle ops: the score matrix whole.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Tensor {
        let scores = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
        candle_nn::ops::softmax_last_dim(&scores)
            .unwrap()
            .matmul(v)
            .unwrap()
    }

    fn bf16(t: &Tensor) -> Tensor {
        t.to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    }

    /// Against the whole score matrix, over key counts that are and are not
    /// whole tiles, work items and tile blocks, and head sizes that are and
    /// are not whole vectors, with scores large enough that the running
    /// maximum moves between tiles. The f32 kernel to 1e-5; the bf16 one
    /// (where this CPU has AMX tiles) against the operands rounded to bf16,
    /// to the rounding of its probabilities (2^-9 relative) over values of
    /// about 1.
    #[test]
    fn matches_the_whole_score_matrix() {
        for (groups, n, d) in [
            (2, 5, 8),
            (3, 128, 16),
            (3, 130, 16),
            (2, 300, 72),
            (1, 64, 40),
        ] {
            let q = Tensor::randn(0f32, 3.0, (groups, n, d), &Device::Cpu).unwrap();
            let k = Tensor::randn(0f32, 3.0, (groups, n, d), &Device::Cpu).unwrap();
            let v = Tensor::randn(0f32, 1.0, (groups, n, d), &Device::Cpu).unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let max_diff = |got: Tensor, want: Tensor| {
                (got - want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            };
            let want = reference(&q, &k, &v, scale);
            let got = dense_attention(&q, &k, &v, scale as f32).unwrap();
            let diff = max_diff(got, want.clone());
            assert!(diff < 1e-5, "{groups} x {n} x {d}: {diff}");
            // A chunk of the queries against every key, packed once.
            let (from, len) = (n / 3, n.div_ceil(2));
            let chunk = |t: &Tensor| t.narrow(1, from, len).unwrap();
            let keys = DenseKeys::new(&k, &v).unwrap();
            let diff = max_diff(keys.attend(&chunk(&q), scale as f32).unwrap(), chunk(&want));
            assert!(
                diff < 1e-5,
                "queries {from}.. of {groups} x {n} x {d}: {diff}"
            );
            let Some(got) = dense_attention_bf16(&q, &k, &v, scale as f32).unwrap() else {
                continue;
            };
            let want = reference(&bf16(&q), &bf16(&k), &bf16(&v), scale);
            let diff = max_diff(got, want.clone());
            assert!(diff < 2e-2, "bf16 tiles, {groups} x {n} x {d}: {diff}");
            let keys = Bf16Keys::new(&k, &v).unwrap().unwrap();
            let diff = max_diff(keys.attend(&chunk(&q), scale as f32).unwrap(), chunk(&want));
            assert!(
                diff < 2e-2,
                "bf16 tiles, queries {from}.. of {groups} x {n} x {d}: {diff}"
            );
        }
    }

    #[test]
    fn other_shapes_and_types_are_refused() {
        let q = Tensor::zeros((1, 4, 8), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::zeros((1, 5, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(dense_attention(&q, &k, &q, 1.0).is_err(), "k and v differ");
        let h = q.to_dtype(DType::F16).unwrap();
        assert!(dense_attention(&q, &h, &q, 1.0).is_err());
        // Fewer queries than keys are a chunk; another head size is not.
        assert!(DenseKeys::new(&k, &k).unwrap().attend(&q, 1.0).is_ok());
        let wide = Tensor::zeros((1, 4, 16), DType::F32, &Device::Cpu).unwrap();
        assert!(DenseKeys::new(&k, &k).unwrap().attend(&wide, 1.0).is_err());
    }
}
