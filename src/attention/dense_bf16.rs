//! [`super::dense`]'s attention (every query to every key of one set, no
//! mask, no cache) with its two products in bf16 on AMX tiles
//! ([`crate::quant::bf16`]) and the softmax in f32, as a vision tower in
//! bf16 runs it under transformers.
//!
//! Each work item takes [`QUERIES`] queries of one head: their scores
//! against every key (`q Kᵀ`, `[QUERIES, keys]` f32, kept in L2), each
//! row's exponentials rounded to bf16 into the next product's input, then
//! `P V` and each row divided by its sum. A head's keys and values are
//! packed as tile matrices once, shared by its items.

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use super::dense::operands;
use crate::quant::bf16::{tiles_available, Bf16Matrix, Bf16Rows, BLOCK};
use crate::vec_math::max_of;

/// Queries per work item: their scores (`QUERIES` x keys f32, 2 MiB at
/// 4096 keys) stay in L2 between the two products.
const QUERIES: usize = 4 * BLOCK;

/// One head's operands, packed.
struct Head {
    q: Bf16Rows,
    /// Keys as the columns of `q Kᵀ`.
    k: Bf16Matrix,
    /// Values as the columns of `P V`: each key an input.
    v: Bf16Matrix,
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
    if !tiles_available() {
        return Ok(None);
    }
    let (groups, n, d) = operands(q, k, v)?;
    if groups * n * d == 0 {
        return Ok(Some(Tensor::zeros(
            (groups, n, d),
            DType::F32,
            &Device::Cpu,
        )?));
    }
    let flat = |t: &Tensor| t.contiguous()?.flatten_all()?.to_vec1::<f32>();
    let (q, k, v) = (flat(q)?, flat(k)?, flat(v)?);
    let heads: Option<Vec<Head>> = (0..groups)
        .into_par_iter()
        .map(|g| {
            let at = g * n * d..(g + 1) * n * d;
            Some(Head {
                q: Bf16Rows::new(&q[at.clone()], n, d),
                k: Bf16Matrix::new(&k[at.clone()], n, d)?,
                v: Bf16Matrix::from_transposed(&v[at], n, d)?,
            })
        })
        .collect();
    let Some(heads) = heads else {
        return Ok(None);
    };
    let items = n.div_ceil(QUERIES);
    let mut out = vec![0f32; groups * items * QUERIES * d];
    out.par_chunks_mut(QUERIES * d).enumerate().for_each_init(
        || Scratch {
            scores: vec![0.0; QUERIES * heads[0].k.padded_n()],
            probs: Bf16Rows::zeros(QUERIES, n),
            out: vec![0.0; QUERIES * heads[0].v.padded_n()],
        },
        |s, (item, out)| {
            let head = &heads[item / items];
            let first = (item % items) * QUERIES;
            let rows = first..(first + QUERIES).min(n.div_ceil(BLOCK) * BLOCK);
            let live = rows.len();
            head.k.product_rows(&head.q, rows, &mut s.scores);
            let stride = head.k.padded_n();
            let mut sums = [0f32; QUERIES];
            for (r, sum) in sums.iter_mut().enumerate().take(live) {
                let scores = &s.scores[r * stride..r * stride + n];
                *sum = s.probs.set_row_exp(r, scores, max_of(scores), scale);
            }
            head.v.product_rows(&s.probs, 0..live, &mut s.out);
            let stride = head.v.padded_n();
            for (r, dst) in out.chunks_exact_mut(d).enumerate().take(live) {
                let inv = 1.0 / sums[r];
                for (o, &x) in dst.iter_mut().zip(&s.out[r * stride..]) {
                    *o = x * inv;
                }
            }
        },
    );
    Ok(Some(
        Tensor::from_vec(out, (groups, items * QUERIES, d), &Device::Cpu)?
            .narrow(1, 0, n)?
            .contiguous()?,
    ))
}
