//! The CPU attention kernel over the host pool.
//!
//! A `(block, kv_head)` tile of the pool holds `block_size * head_dim` f16
//! values: keys as `[head_dim][slot]`, so one block's keys for a dimension sit
//! side by side and a query scores 16 positions per vector operation with no
//! horizontal sums; values as `[slot][head_dim]`, so an output row accumulates
//! 16 dimensions per vector operation, held in registers across positions.
//! Work items widen each tile to f32 once for all the query heads they hold.

use std::cell::RefCell;
use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::{AttnDims, SeqSlice};
use crate::block_manager::BlockId;
use crate::vec_math::{fast_exp, max_of, sum_of};

/// Width of the fixed-size accumulators the compiler turns into vector registers.
const LANES: usize = 16;

/// Query rows of one sequence per work item: they share each widened tile.
const ROW_BLOCK: usize = 16;

/// Start of the tile holding `pos` of a sequence for `kv_head`.
#[inline]
fn tile(table: &[BlockId], pos: usize, kv_head: usize, dims: &AttnDims) -> usize {
    let block = table[pos / dims.block_size] as usize;
    (block * dims.num_kv_heads + kv_head) * dims.block_size * dims.head_dim
}

/// Stores this step's K and V rows (`[T, kv_heads * head_dim]`) in their slots.
pub(super) fn write(
    k_pool: &mut [f16],
    v_pool: &mut [f16],
    k: &[f32],
    v: &[f32],
    seqs: &[SeqSlice],
    dims: AttnDims,
) {
    let (hd, bs) = (dims.head_dim, dims.block_size);
    let kv_dim = dims.num_kv_heads * hd;
    for s in seqs {
        for i in 0..s.len {
            let (pos, row) = (s.first_pos + i, (s.start + i) * kv_dim);
            let slot = pos % bs;
            for h in 0..dims.num_kv_heads {
                let t = tile(&s.block_table, pos, h, &dims);
                let src = row + h * hd;
                for (d, &x) in k[src..src + hd].iter().enumerate() {
                    k_pool[t + d * bs + slot] = f16::from_f32(x);
                }
                v_pool[t + slot * hd..][..hd].convert_from_f32_slice(&v[src..src + hd]);
            }
        }
    }
}

/// Per-thread buffers, reused across items and steps.
#[derive(Default)]
struct Scratch {
    queries: Vec<f32>,
    scores: Vec<f32>,
    tile: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `q`: `[T, num_heads * head_dim]`; returns the same shape. One work item per
/// (sequence, block of up to `ROW_BLOCK` rows, kv head). Every row is computed
/// the same way whatever else is in its item or the batch.
pub(super) fn attend(
    q: &[f32],
    k_pool: &[f16],
    v_pool: &[f16],
    seqs: &[SeqSlice],
    dims: AttnDims,
) -> Vec<f32> {
    let q_dim = dims.num_heads * dims.head_dim;
    let items: Vec<(usize, usize, usize)> = seqs
        .iter()
        .enumerate()
        .flat_map(|(si, s)| {
            (0..s.len.div_ceil(ROW_BLOCK))
                .flat_map(move |b| (0..dims.num_kv_heads).map(move |h| (si, h, b * ROW_BLOCK)))
        })
        .collect();
    let results: Vec<Vec<f32>> = items
        .par_iter()
        .map(|&(si, kv_head, first)| {
            let s = &seqs[si];
            let rows = first..(first + ROW_BLOCK).min(s.len);
            SCRATCH.with(|scratch| {
                let scratch = &mut scratch.borrow_mut();
                attend_item(scratch, q, k_pool, v_pool, s, kv_head, rows, &dims)
            })
        })
        .collect();
    let total_rows: usize = seqs.iter().map(|s| s.start + s.len).max().unwrap_or(0);
    let group_dim = dims.group() * dims.head_dim;
    let mut out = vec![0f32; total_rows * q_dim];
    for (&(si, kv_head, first), res) in items.iter().zip(&results) {
        let s = &seqs[si];
        for (r, chunk) in res.chunks_exact(group_dim).enumerate() {
            let row = s.start + first + r;
            out[row * q_dim + kv_head * group_dim..][..group_dim].copy_from_slice(chunk);
        }
    }
    out
}

/// The query heads of `kv_head` for rows `rows` of sequence `s`, attending
/// causally over its cached positions; returns `[rows][group][head_dim]`.
#[allow(clippy::too_many_arguments)]
fn attend_item(
    scratch: &mut Scratch,
    q: &[f32],
    k_pool: &[f16],
    v_pool: &[f16],
    s: &SeqSlice,
    kv_head: usize,
    rows: Range<usize>,
    dims: &AttnDims,
) -> Vec<f32> {
    let (hd, bs) = (dims.head_dim, dims.block_size);
    let group = dims.group();
    let q_dim = dims.num_heads * hd;
    let ctx = s.first_pos + rows.end;
    // Query vector `qi` belongs to row `rows.start + qi / group` and sees
    // positions `..visible(qi)`.
    let visible = |qi: usize| s.first_pos + rows.start + qi / group + 1;
    let n_queries = rows.len() * group;

    let scale = 1.0 / (hd as f32).sqrt();
    let Scratch {
        queries,
        scores,
        tile: widened,
    } = scratch;
    queries.clear();
    for i in rows.clone() {
        let at = (s.start + i) * q_dim + kv_head * group * hd;
        queries.extend(q[at..at + group * hd].iter().map(|x| x * scale));
    }
    scores.resize(n_queries * ctx, 0.0);
    widened.resize(bs * hd, 0.0);

    for b0 in (0..ctx).step_by(bs) {
        let n = bs.min(ctx - b0);
        k_pool[tile(&s.block_table, b0, kv_head, dims)..][..bs * hd].convert_to_f32_slice(widened);
        for (qi, qv) in queries.chunks_exact(hd).enumerate() {
            block_scores(qv, widened, bs, &mut scores[qi * ctx + b0..][..n]);
        }
    }

    let mut inv_sums = Vec::with_capacity(n_queries);
    for qi in 0..n_queries {
        let sc = &mut scores[qi * ctx..][..visible(qi)];
        let max = max_of(sc);
        for x in sc.iter_mut() {
            *x = fast_exp(*x - max);
        }
        inv_sums.push(1.0 / sum_of(sc));
    }

    let mut out = vec![0f32; n_queries * hd];
    for b0 in (0..ctx).step_by(bs) {
        v_pool[tile(&s.block_table, b0, kv_head, dims)..][..bs * hd].convert_to_f32_slice(widened);
        for qi in 0..n_queries {
            let seen = visible(qi).saturating_sub(b0).min(bs);
            if seen > 0 {
                let probs = &scores[qi * ctx + b0..][..seen];
                accumulate(&mut out[qi * hd..][..hd], probs, &widened[..seen * hd]);
            }
        }
    }
    for (o, inv) in out.chunks_exact_mut(hd).zip(&inv_sums) {
        o.iter_mut().for_each(|x| *x *= inv);
    }
    out
}

/// `out[l] = sum_d q[d] * keys[d][l]` for the first `out.len()` positions of
/// a widened key tile `[head_dim][bs]`, summing over `d` in order.
#[inline]
fn block_scores(q: &[f32], keys: &[f32], bs: usize, out: &mut [f32]) {
    for (c, dst) in out.chunks_mut(LANES).enumerate() {
        let c0 = c * LANES;
        if c0 + LANES <= bs {
            let mut acc = [0f32; LANES];
            for (d, &qd) in q.iter().enumerate() {
                let k: &[f32; LANES] = keys[d * bs + c0..][..LANES].try_into().unwrap();
                for l in 0..LANES {
                    acc[l] += qd * k[l];
                }
            }
            dst.copy_from_slice(&acc[..dst.len()]);
        } else {
            // Block sizes that are not a multiple of LANES: the same sums, one lane at a time.
            for (l, o) in dst.iter_mut().enumerate() {
                *o = 0.0;
                for (d, &qd) in q.iter().enumerate() {
                    *o += qd * keys[d * bs + c0 + l];
                }
            }
        }
    }
}

/// `out += sum_j probs[j] * values[j]` over rows of a widened value tile
/// `[slot][head_dim]`, summing over `j` in order.
#[inline]
fn accumulate(out: &mut [f32], probs: &[f32], values: &[f32]) {
    let hd = out.len();
    for (c, o) in out.chunks_mut(LANES).enumerate() {
        let c0 = c * LANES;
        if o.len() == LANES {
            let mut acc: [f32; LANES] = (&*o).try_into().unwrap();
            for (j, &p) in probs.iter().enumerate() {
                let v: &[f32; LANES] = values[j * hd + c0..][..LANES].try_into().unwrap();
                for l in 0..LANES {
                    acc[l] += p * v[l];
                }
            }
            o.copy_from_slice(&acc);
        } else {
            // Head sizes that are not a multiple of LANES: the tail one lane at a time.
            for (l, x) in o.iter_mut().enumerate() {
                for (j, &p) in probs.iter().enumerate() {
                    *x += p * values[j * hd + c0 + l];
                }
            }
        }
    }
}
