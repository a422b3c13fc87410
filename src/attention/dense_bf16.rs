//! [`super::dense`]'s attention (every query to every key of one set, no
//! mask, no cache) with its two products in bf16 on AMX tiles
//! ([`crate::quant::bf16`]) and the softmax in f32, as a vision tower in
//! bf16 runs it under transformers.
//!
//! Each work item takes [`QUERIES`] queries of one head: their scores
//! against every key (`q Kᵀ`, `[QUERIES, keys]` f32, kept in L2), each
//! row's exponentials rounded to bf16 into the next product's input, then
//! `P V` and each row divided by its sum. A head's keys and values are
//! packed as tile matrices once ([`Bf16Keys`]), shared by its items and by
//! every chunk of queries.

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use super::dense::{operands, queries};
use crate::quant::bf16::{tiles_available, Bf16Matrix, Bf16Rows, BLOCK};
use crate::vec_math::max_of;

/// Queries per work item: their scores (`QUERIES` x keys f32, 2 MiB at
/// 4096 keys) stay in L2 between the two products.
const QUERIES: usize = 4 * BLOCK;

/// A set's keys and values packed as tile matrices once, for any number
/// of query chunks to attend to (a tower run a chunk of patches at a time
/// packs a layer's keys once).
pub struct Bf16Keys {
    /// Each group's keys as the columns of `q Kᵀ`, and values as the
    /// columns of `P V` (each key an input).
    heads: Vec<(Bf16Matrix, Bf16Matrix)>,
    n: usize,
    d: usize,
}

/// One work item's buffers, reused across the items a thread runs.
struct Scratch {
    scores: Vec<f32>,
    probs: Bf16Rows,
    out: Vec<f32>,
}

/// `softmax(q k^T * scale) v` for `q`, `k` and `v` of `[groups, n, d]`
/// (f32, on the host), each of `groups` attending within itself, with bf16
/// products; `None` where this CPU has no AMX tiles.
pub fn dense_attention_bf16(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
) -> Result<Option<Tensor>> {
    Bf16Keys::new(k, v)?
        .map(|keys| keys.attend(q, scale))
        .transpose()
}

impl Bf16Keys {
    /// `k` and `v` of `[groups, n, d]`, f32 on the host; `None` where this
    /// CPU has no AMX tiles.
    pub fn new(k: &Tensor, v: &Tensor) -> Result<Option<Self>> {
        if !tiles_available() {
            return Ok(None);
        }
        let (groups, n, d) = operands(k, v)?;
        if groups * n * d == 0 {
            return Ok(Some(Bf16Keys {
                heads: Vec::new(),
                n,
                d,
            }));
        }
        let flat = |t: &Tensor| t.contiguous()?.flatten_all()?.to_vec1::<f32>();
        let (k, v) = (flat(k)?, flat(v)?);
        let heads: Option<Vec<_>> = (0..groups)
            .into_par_iter()
            .map(|g| {
                let at = g * n * d..(g + 1) * n * d;
                Some((
                    Bf16Matrix::new(&k[at.clone()], n, d)?,
                    Bf16Matrix::from_transposed(&v[at], n, d)?,
                ))
            })
            .collect();
        Ok(heads.map(|heads| Bf16Keys { heads, n, d }))
    }

    /// `softmax(q k^T * scale) v` for queries `q` of `[groups, m, d]`.
    pub fn attend(&self, q: &Tensor, scale: f32) -> Result<Tensor> {
        let (groups, n, d) = (self.heads.len(), self.n, self.d);
        let m = queries(q, groups, d)?;
        if groups * m * n * d == 0 {
            return Tensor::zeros(q.dims(), DType::F32, &Device::Cpu);
        }
        let q = q.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let q: Vec<Bf16Rows> = (0..groups)
            .into_par_iter()
            .map(|g| Bf16Rows::new(&q[g * m * d..(g + 1) * m * d], m, d))
            .collect();
        let items = m.div_ceil(QUERIES);
        let (k0, v0) = &self.heads[0];
        let mut out = vec![0f32; groups * items * QUERIES * d];
        out.par_chunks_mut(QUERIES * d).enumerate().for_each_init(
            || Scratch {
                scores: vec![0.0; QUERIES * k0.padded_n()],
                probs: Bf16Rows::zeros(QUERIES, n),
                out: vec![0.0; QUERIES * v0.padded_n()],
            },
            |s, (item, out)| {
                let (k, v) = &self.heads[item / items];
                let first = (item % items) * QUERIES;
                let rows = first..(first + QUERIES).min(m.div_ceil(BLOCK) * BLOCK);
                let live = rows.len();
                k.product_rows(&q[item / items], rows, &mut s.scores);
                let stride = k.padded_n();
                let mut sums = [0f32; QUERIES];
                for (r, sum) in sums.iter_mut().enumerate().take(live) {
                    let scores = &s.scores[r * stride..r * stride + n];
                    *sum = s.probs.set_row_exp(r, scores, max_of(scores), scale);
                }
                v.product_rows(&s.probs, 0..live, &mut s.out);
                let stride = v.padded_n();
                for (r, dst) in out.chunks_exact_mut(d).enumerate().take(live) {
                    let inv = 1.0 / sums[r];
                    for (o, &x) in dst.iter_mut().zip(&s.out[r * stride..]) {
                        *o = x * inv;
                    }
                }
            },
        );
        Tensor::from_vec(out, (groups, items * QUERIES, d), &Device::Cpu)?
            .narrow(1, 0, m)?
            .contiguous()
    }
}
