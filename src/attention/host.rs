//! The CPU attention kernel over the host pool.
//!
//! A `(block, kv_head)` tile of the pool holds `block_size * head_dim` f16
//! (or f32, or int8) values: keys as `[head_dim][slot]`, so one block's keys for a dimension sit
//! side by side and a query scores 16 positions per vector operation with no
//! horizontal sums; values as `[slot][head_dim]`, so an output row accumulates
//! 16 dimensions per vector operation, held in registers across positions.
//! Work items widen each tile to f32 once for all the query heads they hold
//! (a decode row's single group of queries widens in registers instead).
//! int8 tiles carry one scale per slot, applied to a position's score (keys)
//! and to its softmax weight (values) rather than to every value.

use std::cell::RefCell;
use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::{AttnDims, SeqSlice};
use crate::kv::BlockId;
use crate::vec_math::{fast_exp, max_of, mul_add, sum_of};

/// Width of the fixed-size accumulators the compiler turns into vector registers.
const LANES: usize = 16;

/// Query rows of one sequence per work item: they share each widened tile.
const ROW_BLOCK: usize = 16;

/// A value type the pool can hold: widened to f32 for the arithmetic.
pub(super) trait KvElem: Copy + Default + Send + Sync {
    /// Each token's head vector carries a scale (its values are `scale * x`).
    const SCALED: bool;
    /// Encodes one token's head vector; returns its scale (1 if unscaled).
    fn encode(src: &[f32], dst: &mut [Self]) -> f32;
    fn to_f32(self) -> f32;
    fn widen(src: &[Self], dst: &mut [f32]);
    /// One vector's worth, widened in registers.
    #[inline(always)]
    fn lanes(src: &[Self; LANES]) -> [f32; LANES] {
        let mut out = [0f32; LANES];
        Self::widen(src, &mut out);
        out
    }
}

impl KvElem for f16 {
    const SCALED: bool = false;
    fn encode(src: &[f32], dst: &mut [Self]) -> f32 {
        dst.convert_from_f32_slice(src);
        1.0
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
}

impl KvElem for f32 {
    const SCALED: bool = false;
    fn encode(src: &[f32], dst: &mut [Self]) -> f32 {
        dst.copy_from_slice(src);
        1.0
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

/// Group-wise int8: the group is one token's head vector, scaled so its
/// largest magnitude maps to 127.
impl KvElem for i8 {
    const SCALED: bool = true;
    fn encode(src: &[f32], dst: &mut [Self]) -> f32 {
        let amax = src.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (d, &x) in dst.iter_mut().zip(src) {
            // `as` saturates (and maps NaN to 0).
            *d = (x * inv).round() as i8;
        }
        scale
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = x as f32;
        }
    }
}

/// One layer's K or V pool as the kernels see it: the values, and for scaled
/// types one scale per `[block][kv_head][slot]` (else empty).
#[derive(Clone, Copy)]
pub(super) struct Pool<'a, T> {
    pub values: &'a [T],
    pub scales: &'a [f32],
}

pub(super) struct PoolMut<'a, T> {
    pub values: &'a mut [T],
    pub scales: &'a mut [f32],
}

/// Start of the tile holding `pos` of a sequence for `kv_head`.
#[inline]
fn tile(table: &[BlockId], pos: usize, kv_head: usize, dims: &AttnDims) -> usize {
    let block = table[pos / dims.block_size] as usize;
    (block * dims.num_kv_heads + kv_head) * dims.block_size * dims.head_dim
}

/// Stores the key and value heads of this step's stacked rows (`qkv`:
/// `[T, qkv_width]`) in their slots.
pub(super) fn write<T: KvElem>(
    k_pool: PoolMut<T>,
    v_pool: PoolMut<T>,
    qkv: &[f32],
    seqs: &[SeqSlice],
    dims: AttnDims,
) {
    let (hd, bs) = (dims.head_dim, dims.block_size);
    let (k_at, v_at) = dims.kv_offsets();
    let mut key = vec![T::default(); hd];
    for s in seqs {
        for i in 0..s.len {
            let (pos, row) = (s.first_pos + i, (s.start + i) * dims.qkv_width());
            let slot = pos % bs;
            for h in 0..dims.num_kv_heads {
                let t = tile(s.table(dims.window.is_some()), pos, h, &dims);
                let (k, v) = (row + k_at + h * hd, row + v_at + h * hd);
                let k_scale = T::encode(&qkv[k..k + hd], &mut key);
                for (d, &x) in key.iter().enumerate() {
                    k_pool.values[t + d * bs + slot] = x;
                }
                let v_scale = T::encode(&qkv[v..v + hd], &mut v_pool.values[t + slot * hd..][..hd]);
                if T::SCALED {
                    k_pool.scales[t / hd + slot] = k_scale;
                    v_pool.scales[t / hd + slot] = v_scale;
                }
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

/// `qkv`: `[T, qkv_width]`, of which the query heads are read; returns
/// `[T, num_heads * head_dim]`. Each (sequence, block of up to `ROW_BLOCK`
/// rows, kv head) attends over its context a `KV_SPAN` at a time, and the
/// spans' partial softmaxes are merged in order. A work item is such a
/// block's spans, or one span of it where blocks alone would leave threads
/// idle. Every row is computed the same way whatever else is in its item
/// or the batch: spans are fixed by position.
pub(super) fn attend<T: KvElem>(
    qkv: &[f32],
    k_pool: Pool<T>,
    v_pool: Pool<T>,
    seqs: &[SeqSlice],
    dims: AttnDims,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let q_dim = dims.num_heads * dims.head_dim;
    let threads = rayon::current_num_threads();
    let row_block = row_block(seqs.iter().map(|s| s.len), dims.num_kv_heads, threads);
    let span = KV_SPAN.next_multiple_of(dims.block_size);
    // (sequence, kv head, first row, spans), spans innermost.
    let mut items: Vec<(usize, usize, usize, Range<usize>)> = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for first in (0..s.len).step_by(row_block) {
            let reach = reach(s, first..(first + row_block).min(s.len), &dims);
            for h in 0..dims.num_kv_heads {
                items.push((si, h, first, reach.start / span..reach.end.div_ceil(span)));
            }
        }
    }
    if items.len() < 2 * threads {
        items = items
            .into_iter()
            .flat_map(|(si, h, first, spans)| spans.map(move |c| (si, h, first, c..c + 1)))
            .collect();
    }
    let mut results: Vec<Vec<Partial>> = items
        .par_iter()
        .map(|(si, kv_head, first, spans)| {
            let s = &seqs[*si];
            let rows = *first..(first + row_block).min(s.len);
            SCRATCH.with(|scratch| {
                let scratch = &mut scratch.borrow_mut();
                spans
                    .clone()
                    .map(|c| {
                        let positions = c * span..(c + 1) * span;
                        let rows = rows.clone();
                        attend_item(
                            scratch, qkv, k_pool, v_pool, s, *kv_head, rows, positions, &dims,
                        )
                    })
                    .collect()
            })
        })
        .collect();
    let total_rows: usize = seqs.iter().map(|s| s.start + s.len).max().unwrap_or(0);
    let group_dim = dims.group() * dims.head_dim;
    let mut out = vec![0f32; total_rows * q_dim];
    // Each block's partials, from its consecutive items, in span order.
    let mut at = 0;
    while at < items.len() {
        let (si, kv_head, first, _) = items[at];
        let n = items[at..]
            .iter()
            .take_while(|i| (i.0, i.1, i.2) == (si, kv_head, first))
            .count();
        let mut parts: Vec<Partial> = results[at..at + n]
            .iter_mut()
            .flat_map(std::mem::take)
            .collect();
        let group = dims.group();
        let sinks = sinks.map(|s| &s[kv_head * group..(kv_head + 1) * group]);
        merge(&mut parts, dims.head_dim, sinks);
        let s = &seqs[si];
        for (r, chunk) in parts[0].out.chunks_exact(group_dim).enumerate() {
            let row = s.start + first + r;
            out[row * q_dim + kv_head * group_dim..][..group_dim].copy_from_slice(chunk);
        }
        at += n;
    }
    out
}

/// Context positions per span. A lone decode row over 3 kv heads was 3
/// work items however long its context, leaving threads idle (one of two;
/// 13 of 16); at 512 positions a span, a 3,000-token context gives 18, and
/// decoding there measured 25% faster on 2 threads. 256 did as well there
/// but cost long prefills 5% (a partial and a merge per span), 512 nothing
/// measurable. Short contexts are one span, computed as before spans.
const KV_SPAN: usize = 512;

/// One item's softmax over its span, per query: the largest score, the sum
/// of `exp(score - max)`, and the values weighted by those (not yet
/// divided by the sum). A query that sees none of the span has max -inf and
/// zeros.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

/// Combines one row block's span partials, in span order, into each
/// query's attention output, left in the first part's `out`. A single span
/// gives `out * (1 / sum)` exactly, as attention over the whole context did
/// before spans. `sinks` are the sinks of the block's query group, one per
/// head (queries are `[rows][group]`): each joins its head's max and sum.
fn merge(parts: &mut [Partial], hd: usize, sinks: Option<&[f32]>) {
    let (first, rest) = parts.split_first_mut().expect("a row block has a span");
    for q in 0..first.max.len() {
        let sink = sinks.map(|s| s[q % s.len()]);
        let max = rest.iter().fold(first.max[q], |m, p| m.max(p.max[q]));
        let max = sink.map_or(max, |s| max.max(s));
        let mut sum =
            first.sum[q] * fast_exp(first.max[q] - max) + sink.map_or(0.0, |s| fast_exp(s - max));
        for p in rest.iter() {
            sum += p.sum[q] * fast_exp(p.max[q] - max);
        }
        let inv = 1.0 / sum;
        let o = &mut first.out[q * hd..(q + 1) * hd];
        let w = fast_exp(first.max[q] - max) * inv;
        o.iter_mut().for_each(|x| *x *= w);
        for p in rest.iter() {
            // A span the query does not see weighs exactly 0.
            let w = fast_exp(p.max[q] - max) * inv;
            if w != 0.0 {
                for (o, x) in o.iter_mut().zip(&p.out[q * hd..(q + 1) * hd]) {
                    *o = mul_add(*x, w, *o);
                }
            }
        }
    }
}

/// Positions the rows `rows` of sequence `s` read: from the first tile of
/// the first row's window (0 without one) to what the last row sees.
fn reach(s: &SeqSlice, rows: Range<usize>, dims: &AttnDims) -> Range<usize> {
    let lowest = dims
        .window
        .map_or(0, |w| (s.first_pos + rows.start + 1).saturating_sub(w));
    lowest / dims.block_size * dims.block_size..s.visible_end(s.first_pos + rows.end - 1)
}

/// Rows per work item: `ROW_BLOCK`, unless that leaves fewer than two items
/// per thread. Then the rows are cut finer and evenly: a verification step
/// of one sequence's 9 rows over 3 kv heads was 3 items on 2 threads, one
/// thread idle for a third of the attention; cut 5 + 4, it is 6.
fn row_block(lens: impl Iterator<Item = usize> + Clone, kv_heads: usize, threads: usize) -> usize {
    let items = lens.clone().map(|n| n.div_ceil(ROW_BLOCK)).sum::<usize>() * kv_heads;
    let longest = lens.max().unwrap_or(1).min(ROW_BLOCK);
    match items.max(1) {
        n if n >= 2 * threads => ROW_BLOCK,
        n => longest.div_ceil((2 * threads).div_ceil(n)).max(1),
    }
}

/// The query heads of `kv_head` for rows `rows` of sequence `s`, attending
/// causally over its cached positions within `positions` (tile-aligned);
/// the partial softmax of each `[rows][group]` query.
#[allow(clippy::too_many_arguments)]
fn attend_item<T: KvElem>(
    scratch: &mut Scratch,
    qkv: &[f32],
    k_pool: Pool<T>,
    v_pool: Pool<T>,
    s: &SeqSlice,
    kv_head: usize,
    rows: Range<usize>,
    positions: Range<usize>,
    dims: &AttnDims,
) -> Partial {
    let (hd, bs) = (dims.head_dim, dims.block_size);
    let group = dims.group();
    // Query vector `qi` belongs to row `rows.start + qi / group`, at
    // `pos(qi)`, and sees positions `..visible(qi)` (which never falls
    // as `qi` grows).
    let pos = |qi: usize| s.first_pos + rows.start + qi / group;
    let visible = |qi: usize| s.visible_end(pos(qi));
    // A sliding-window layer's query sees only the last `window` positions
    // up to its own; tiles wholly before the first row's window are never
    // read.
    let lowest = |qi: usize| dims.window.map_or(0, |w| (pos(qi) + 1).saturating_sub(w));
    let reach = reach(s, rows.clone(), dims);
    // This item's tiles: `lo..hi`, of which scores are kept `ctx` apart.
    let (lo, hi) = (
        reach.start.max(positions.start),
        reach.end.min(positions.end),
    );
    let ctx = hi - lo;
    let n_queries = rows.len() * group;

    let scale = 1.0 / (hd as f32).sqrt();
    let Scratch {
        queries,
        scores,
        tile: widened,
    } = scratch;
    queries.clear();
    for i in rows.clone() {
        let at = (s.start + i) * dims.qkv_width() + kv_head * group * hd;
        queries.extend(qkv[at..at + group * hd].iter().map(|x| x * scale));
    }
    scores.resize(n_queries * ctx, 0.0);
    widened.resize(bs * hd, 0.0);

    /// The tile holding `pos`, and its per-slot scales (empty if unscaled).
    fn tile_of<'p, T: KvElem>(
        pool: Pool<'p, T>,
        s: &SeqSlice,
        pos: usize,
        kv_head: usize,
        dims: &AttnDims,
    ) -> Pool<'p, T> {
        let (bs, hd) = (dims.block_size, dims.head_dim);
        let t = tile(s.table(dims.window.is_some()), pos, kv_head, dims);
        Pool {
            values: &pool.values[t..][..bs * hd],
            scales: match T::SCALED {
                true => &pool.scales[t / hd..][..bs],
                false => &[],
            },
        }
    }
    /// Asks for a tile (and its scales) ahead of use.
    fn fetch<T>(tile: Pool<T>) {
        prefetch(tile.values);
        prefetch(tile.scales);
    }
    // Multiplies each query's weights at positions `b0..b0 + n` by the
    // tile's scales (scaled storage only).
    let rescale = |scores: &mut [f32], scales: &[f32], b0: usize, n: usize| {
        for qi in 0..n_queries {
            let row = &mut scores[qi * ctx + b0 - lo..][..n];
            row.iter_mut().zip(scales).for_each(|(x, s)| *x *= s);
        }
    };
    for b0 in (lo..hi).step_by(bs) {
        let n = bs.min(hi - b0);
        // Tiles are scattered, so the hardware prefetcher cannot run ahead:
        // ask for the next one while this one is scored.
        match b0 + bs < hi {
            true => fetch(tile_of(k_pool, s, b0 + bs, kv_head, dims)),
            false => fetch(tile_of(v_pool, s, lo, kv_head, dims)),
        }
        let Pool {
            values: keys,
            scales,
        } = tile_of(k_pool, s, b0, kv_head, dims);
        // One group of queries (a decode row) widens in registers; more
        // widen the tile once into scratch and share it.
        if n_queries > QUERIES {
            T::widen(keys, widened);
        }
        for qs in query_groups(n_queries) {
            let (queries, scores) = (
                &queries[qs.start * hd..qs.end * hd],
                &mut scores[qs.start * ctx + b0 - lo..],
            );
            match n_queries > QUERIES {
                true => group_scores(queries, widened.as_slice(), bs, scores, ctx, n),
                false => group_scores(queries, keys, bs, scores, ctx, n),
            }
        }
        if T::SCALED {
            rescale(scores, scales, b0, n);
        }
    }

    let (mut maxes, mut sums) = (Vec::with_capacity(n_queries), Vec::with_capacity(n_queries));
    for qi in 0..n_queries {
        // This query's positions here, relative to `lo`.
        let end = visible(qi).clamp(lo, hi) - lo;
        let start = lowest(qi).clamp(lo, hi) - lo;
        let (sc, hidden) = scores[qi * ctx..(qi + 1) * ctx].split_at_mut(end);
        let (before, sc) = sc.split_at_mut(start.min(end));
        before.fill(0.0);
        let max = match sc.is_empty() {
            true => f32::NEG_INFINITY,
            false => max_of(sc),
        };
        for x in sc.iter_mut() {
            *x = fast_exp(*x - max);
        }
        maxes.push(max);
        sums.push(sum_of(sc));
        // Zero weights let a group of rows share one pass over the values.
        hidden.fill(0.0);
    }

    let mut out = vec![0f32; n_queries * hd];
    for b0 in (lo..hi).step_by(bs) {
        if b0 + bs < hi {
            fetch(tile_of(v_pool, s, b0 + bs, kv_head, dims));
        }
        let Pool { values, scales } = tile_of(v_pool, s, b0, kv_head, dims);
        // A value row's scale folds into its weight (the softmax sums are
        // already taken).
        if T::SCALED {
            rescale(scores, scales, b0, bs.min(hi - b0));
        }
        if n_queries > QUERIES {
            T::widen(values, widened);
        }
        for qs in query_groups(n_queries) {
            let seen = visible(qs.end - 1).min(hi).saturating_sub(b0).min(bs);
            if seen == 0 {
                continue;
            }
            let (out, probs) = (
                &mut out[qs.start * hd..qs.end * hd],
                &scores[qs.start * ctx + b0 - lo..],
            );
            match n_queries > QUERIES {
                true => group_accumulate(out, probs, ctx, seen, &widened[..seen * hd]),
                false => group_accumulate(out, probs, ctx, seen, &values[..seen * hd]),
            }
        }
    }
    Partial {
        max: maxes,
        sum: sums,
        out,
    }
}

/// Asks the CPU to start loading `data` into cache (a hint; no-op off x86).
#[inline]
fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for line in data.chunks(64 / std::mem::size_of::<T>()) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of x86_64; a prefetch only hints, and the
        // address lies inside `data`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Query vectors handled together by the kernels below: each key or value
/// vector loaded is used this many times, and their sums are independent
/// chains the CPU overlaps.
const QUERIES: usize = 4;

/// [`block_scores`] for a group of 1..=`QUERIES` query vectors.
#[inline]
fn group_scores<E: KvElem>(
    queries: &[f32],
    keys: &[E],
    bs: usize,
    out: &mut [f32],
    stride: usize,
    n: usize,
) {
    let hd = keys.len() / bs;
    match queries.len() / hd {
        1 => block_scores::<E, 1>(queries, keys, bs, out, stride, n),
        2 => block_scores::<E, 2>(queries, keys, bs, out, stride, n),
        3 => block_scores::<E, 3>(queries, keys, bs, out, stride, n),
        _ => block_scores::<E, QUERIES>(queries, keys, bs, out, stride, n),
    }
}

/// [`accumulate`] for a group of 1..=`QUERIES` output rows.
#[inline]
fn group_accumulate<E: KvElem>(
    out: &mut [f32],
    probs: &[f32],
    stride: usize,
    seen: usize,
    values: &[E],
) {
    let hd = values.len() / seen;
    match out.len() / hd {
        1 => accumulate::<E, 1>(out, probs, stride, seen, values),
        2 => accumulate::<E, 2>(out, probs, stride, seen, values),
        3 => accumulate::<E, 3>(out, probs, stride, seen, values),
        _ => accumulate::<E, QUERIES>(out, probs, stride, seen, values),
    }
}

/// `0..n` in runs of at most `QUERIES`.
fn query_groups(n: usize) -> impl Iterator<Item = Range<usize>> {
    (0..n)
        .step_by(QUERIES)
        .map(move |q| q..(q + QUERIES).min(n))
}

/// For each of `Q` query vectors (`queries`: `[Q][head_dim]`) and the first
/// `n` positions of a key tile `[head_dim][bs]`, writes
/// `sum_d q[d] * keys[d][pos]` to `out[u * stride + pos]`, summing over `d` in
/// order.
#[inline]
fn block_scores<E: KvElem, const Q: usize>(
    queries: &[f32],
    keys: &[E],
    bs: usize,
    out: &mut [f32],
    stride: usize,
    n: usize,
) {
    let hd = queries.len() / Q;
    let q: [&[f32]; Q] = std::array::from_fn(|u| &queries[u * hd..][..hd]);
    for c0 in (0..n).step_by(LANES) {
        let width = LANES.min(n - c0);
        if c0 + LANES <= bs {
            let mut acc = [[0f32; LANES]; Q];
            for (d, row) in keys.chunks_exact(bs).enumerate() {
                let k = E::lanes(row[c0..c0 + LANES].try_into().unwrap());
                for u in 0..Q {
                    let qd = q[u][d];
                    for l in 0..LANES {
                        acc[u][l] = mul_add(qd, k[l], acc[u][l]);
                    }
                }
            }
            for (u, acc) in acc.iter().enumerate() {
                out[u * stride + c0..][..width].copy_from_slice(&acc[..width]);
            }
        } else {
            // Block sizes that are not a multiple of LANES: the same sums, one lane at a time.
            for (u, q) in q.iter().enumerate() {
                for l in 0..width {
                    let mut x = 0.0;
                    for (d, &qd) in q.iter().enumerate() {
                        x = mul_add(qd, keys[d * bs + c0 + l].to_f32(), x);
                    }
                    out[u * stride + c0 + l] = x;
                }
            }
        }
    }
}

/// For each of `Q` output rows (`out`: `[Q][head_dim]`), adds
/// `sum_j probs[u * stride + j] * values[j]` over the `seen` rows of a value
/// tile `[slot][head_dim]`, summing over `j` in order.
#[inline]
fn accumulate<E: KvElem, const Q: usize>(
    out: &mut [f32],
    probs: &[f32],
    stride: usize,
    seen: usize,
    values: &[E],
) {
    let hd = out.len() / Q;
    let p: [&[f32]; Q] = std::array::from_fn(|u| &probs[u * stride..][..seen]);
    let vector_dims = hd / LANES * LANES;
    for c0 in (0..vector_dims).step_by(LANES) {
        let mut acc: [[f32; LANES]; Q] =
            std::array::from_fn(|u| out[u * hd + c0..][..LANES].try_into().unwrap());
        for (j, row) in values.chunks_exact(hd).enumerate() {
            let v = E::lanes(row[c0..c0 + LANES].try_into().unwrap());
            for u in 0..Q {
                let pj = p[u][j];
                for l in 0..LANES {
                    acc[u][l] = mul_add(pj, v[l], acc[u][l]);
                }
            }
        }
        for (u, acc) in acc.iter().enumerate() {
            out[u * hd + c0..][..LANES].copy_from_slice(acc);
        }
    }
    // Head sizes that are not a multiple of LANES: the tail one lane at a time.
    for c in vector_dims..hd {
        for (u, p) in p.iter().enumerate() {
            for (j, &pj) in p.iter().enumerate() {
                out[u * hd + c] = mul_add(pj, values[j * hd + c].to_f32(), out[u * hd + c]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(lens: &[usize], kv_heads: usize, threads: usize) -> usize {
        row_block(lens.iter().copied(), kv_heads, threads)
    }

    #[test]
    fn few_rows_are_cut_evenly_into_two_items_per_thread() {
        // One sequence's verification rows, 3 kv heads, 2 threads: 5 + 4.
        assert_eq!(block(&[9], 3, 2), 5);
        // 16 threads: one row an item.
        assert_eq!(block(&[9], 3, 16), 1);
        // Enough items already: decode batches and prompt chunks.
        assert_eq!(block(&[1; 32], 3, 2), ROW_BLOCK);
        assert_eq!(block(&[512], 3, 2), ROW_BLOCK);
        assert_eq!(block(&[1, 1], 2, 2), ROW_BLOCK);
        // A lone decode row stays one row.
        assert_eq!(block(&[1], 3, 2), 1);
        assert_eq!(block(&[], 3, 2), 1);
    }
}
