//! Attention over the paged KV pool, per sequence of a flat batch.
//!
//! Each sequence's new K/V rows are written into its own blocks, then each new
//! query token attends causally to every cached position of its sequence up to
//! its own. No padding and no per-step cache copies: the CPU kernel reads the
//! keys straight out of the blocks (see [`host`]). On a CUDA device
//! `paged_attention.cu` does the same for the whole batch in one launch per
//! layer (see `cuda`). The tensor path (any device) gathers a sequence's
//! rows with `index_select`, through views of the step's metadata uploaded
//! once per step ([`StepMeta`]); it is the fallback for head sizes the
//! kernel lacks, and is tested against the CPU kernel.

use candle_core::{DType, Device, Result, Storage, Tensor};

use crate::kv::batch::{FlatBatch, SeqSlice};
use crate::kv::cache::{HostPool, KvCache, KvLayout, LayerCache};
use crate::kv::step_meta::{MetaBuffers, StepMeta};

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dense;
pub mod dense_bf16;
mod host;
pub mod launch;
mod split;

/// `batch`'s metadata packed into `bufs` for what reads `cache` on
/// `device`: the host kernel, the CUDA kernel, or the candle-op fallback.
pub fn step_meta<'a>(
    bufs: &'a mut MetaBuffers,
    batch: &'a FlatBatch,
    cache: &KvCache,
    window: Option<usize>,
    device: &Device,
) -> Result<StepMeta<'a>> {
    let kernel = has_kernel(cache.layout(), device);
    bufs.pack(batch, cache, window, device, kernel)
}

/// Whether a tensor pool of `layout` on `device` is read by the CUDA kernel
/// (else by the candle-op fallback): the kernel must take every layer's
/// head size.
pub fn has_kernel(layout: &KvLayout, device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        return [false, true]
            .into_iter()
            .all(|window| launch::supports(layout.shape(window).head_dim));
    }
    let _ = (layout, device);
    false
}

#[derive(Debug, Clone, Copy)]
pub struct AttnDims {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// A sliding-window layer's window: each query sees at most this many
    /// positions, its own included.
    pub window: Option<usize>,
}

impl AttnDims {
    fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Width of a stacked q/k/v row: the query heads, then the key heads,
    /// then the value heads.
    pub fn qkv_width(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }

    /// Offsets of the key and value heads within a stacked row.
    fn kv_offsets(&self) -> (usize, usize) {
        let k = self.num_heads * self.head_dim;
        (k, k + self.num_kv_heads * self.head_dim)
    }
}

/// `qkv`: `[T, qkv_width]`, each row its token's query, key and value heads
/// (RoPE applied), as the fused projection produces them: the host kernel
/// reads them in place. Returns `[T, num_heads * head_dim]`.
///
/// `sinks` (gpt-oss's), `[num_heads]` f32 on the model's device: a learned
/// logit per query head that joins each softmax as one more score (its max
/// and its sum) with no value, so a head can attend to nothing.
pub fn paged_attention(
    qkv: &Tensor,
    cache: &mut LayerCache,
    meta: &StepMeta,
    dims: AttnDims,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    if let Some(s) = sinks {
        if s.dims() != [dims.num_heads] || s.dtype() != DType::F32 {
            candle_core::bail!(
                "attention sinks are {:?} {:?}, not [{}] f32",
                s.dims(),
                s.dtype(),
                dims.num_heads
            );
        }
    }
    let seqs = meta.seqs();
    let (t, width) = qkv.dims2()?;
    if width != dims.qkv_width() {
        candle_core::bail!(
            "attention input rows are {width} wide, not {}",
            dims.qkv_width()
        );
    }
    match cache {
        LayerCache::Host {
            k: k_pool,
            v: v_pool,
        } => {
            let qkv = qkv.contiguous()?;
            let (storage, layout) = qkv.storage_and_layout();
            let Storage::Cpu(cpu) = &*storage else {
                candle_core::bail!("the host KV pool needs its input on the CPU");
            };
            let (from, to) = layout
                .contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg("attention input not contiguous".into()))?;
            let rows = &cpu.as_slice::<f32>()?[from..to];
            let sinks = sinks.map(|s| s.to_vec1::<f32>()).transpose()?;
            let sinks = sinks.as_deref();
            /// Writes this step's K/V, then attends; scales are empty for
            /// unscaled storage.
            fn run<T: host::KvElem>(
                (k, k_scales): (&mut [T], &mut [f32]),
                (v, v_scales): (&mut [T], &mut [f32]),
                rows: &[f32],
                seqs: &[SeqSlice],
                dims: AttnDims,
                sinks: Option<&[f32]>,
            ) -> Vec<f32> {
                host::write(
                    host::PoolMut {
                        values: &mut *k,
                        scales: &mut *k_scales,
                    },
                    host::PoolMut {
                        values: &mut *v,
                        scales: &mut *v_scales,
                    },
                    rows,
                    seqs,
                    dims,
                );
                host::attend(
                    rows,
                    host::Pool {
                        values: k,
                        scales: k_scales,
                    },
                    host::Pool {
                        values: v,
                        scales: v_scales,
                    },
                    seqs,
                    dims,
                    sinks,
                )
            }
            let out = match (k_pool, v_pool) {
                (HostPool::F16(kp), HostPool::F16(vp)) => {
                    run((kp, &mut []), (vp, &mut []), rows, seqs, dims, sinks)
                }
                (HostPool::F32(kp), HostPool::F32(vp)) => {
                    run((kp, &mut []), (vp, &mut []), rows, seqs, dims, sinks)
                }
                (HostPool::Int8(kp, ks), HostPool::Int8(vp, vs)) => {
                    run((kp, ks), (vp, vs), rows, seqs, dims, sinks)
                }
                _ => candle_core::bail!("K and V pools of different dtypes"),
            };
            Tensor::from_vec(out, (t, dims.num_heads * dims.head_dim), &Device::Cpu)
        }
        #[cfg(feature = "cuda")]
        LayerCache::Tensor { k, v } if meta.kernel().is_some() => {
            cuda::write_and_attend(&qkv.contiguous()?, k, v, meta, dims, sinks)
        }
        LayerCache::Tensor {
            k: k_pool,
            v: v_pool,
        } => {
            let (k_at, v_at) = dims.kv_offsets();
            let kv_dim = dims.num_kv_heads * dims.head_dim;
            let q = qkv.narrow(1, 0, k_at)?.contiguous()?;
            let k = qkv.narrow(1, k_at, kv_dim)?.contiguous()?;
            let v = qkv.narrow(1, v_at, kv_dim)?.contiguous()?;
            attend_tensor(&q, &k, &v, (k_pool, v_pool), meta, dims, sinks)
        }
    }
}

fn attend_tensor(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (k_pool, v_pool): (&Tensor, &Tensor),
    meta: &StepMeta,
    dims: AttnDims,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    let (hd, nh, group) = (dims.head_dim, dims.num_heads, dims.group());
    let kv_dim = dims.num_kv_heads * hd;
    // Scatter this step's rows into their slots: the batch's rows are its
    // sequences' new tokens in order, so row r goes to slot r of the step.
    let n_new = meta.num_tokens();
    let idx = meta
        .slots_t(dims.window.is_some())?
        .reshape((n_new, 1))?
        .broadcast_as((n_new, kv_dim))?
        .contiguous()?;
    let to_pool = |x: &Tensor| x.to_dtype(k_pool.dtype())?.contiguous();
    k_pool.scatter_set(&idx, &to_pool(k)?, 0)?;
    v_pool.scatter_set(&idx, &to_pool(v)?, 0)?;

    let scale = 1.0 / (hd as f64).sqrt();
    let mut outs = Vec::with_capacity(meta.seqs().len());
    for (i, s) in meta.seqs().iter().enumerate() {
        let ctx = s.context_len();
        let slots = meta.gather_t(i, dims.window.is_some())?;
        // [ctx, kv_heads, hd] -> repeat each kv head for its query group -> [nh, ctx, hd]
        let expand = |pool: &Tensor| -> Result<Tensor> {
            pool.index_select(&slots, 0)?
                .to_dtype(DType::F32)?
                .reshape((ctx, dims.num_kv_heads, 1, hd))?
                .broadcast_as((ctx, dims.num_kv_heads, group, hd))?
                .reshape((ctx, nh, hd))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (ks, vs) = (expand(k_pool)?, expand(v_pool)?);
        let qs = q
            .narrow(0, s.start, s.len)?
            .reshape((s.len, nh, hd))?
            .transpose(0, 1)?
            .contiguous()?;
        let mut att = (qs.matmul(&ks.t()?)? * scale)?;
        if let Some(mask) = meta.mask_t(i, dims.window.is_some())? {
            att = att.broadcast_add(&mask)?;
        }
        let att = match sinks {
            None => candle_nn::ops::softmax_last_dim(&att)?,
            // The sink as one more column of scores, dropped after the
            // softmax.
            Some(sinks) => {
                let column = sinks
                    .reshape((nh, 1, 1))?
                    .broadcast_as((nh, s.len, 1))?
                    .to_dtype(att.dtype())?;
                candle_nn::ops::softmax_last_dim(&Tensor::cat(&[&att, &column], 2)?.contiguous()?)?
                    .narrow(2, 0, ctx)?
            }
        };
        outs.push(
            att.matmul(&vs)?
                .transpose(0, 1)?
                .reshape((s.len, nh * hd))?,
        );
    }
    // `seqs` are in flat-batch row order (the runner lays the batch out so).
    Tensor::cat(&outs, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::batch::{FlatBatch, LogitRows};
    use crate::kv::cache::{KvCache, KvDtype, KvLayout};

    fn rand_tensor(rows: usize, cols: usize, seed: u64) -> Tensor {
        // A small LCG keeps the test free of RNG dependencies' version churn.
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap()
    }

    /// Plain causal attention over one whole sequence with scalar loops: an
    /// independent reference, no cache and no candle ops. With a window,
    /// position i sees `i + 1 - window..=i`; a position in one of `whole`
    /// sees on to that span's end; a head's sink is one more score with no
    /// value.
    fn reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dims: AttnDims,
        sinks: Option<&[f32]>,
        whole: &[std::ops::Range<usize>],
    ) -> Tensor {
        let (q, k, v) = (
            q.to_vec2::<f32>().unwrap(),
            k.to_vec2::<f32>().unwrap(),
            v.to_vec2::<f32>().unwrap(),
        );
        let (nh, hd, group) = (dims.num_heads, dims.head_dim, dims.group());
        let mut out = vec![0f32; q.len() * nh * hd];
        for i in 0..q.len() {
            for h in 0..nh {
                let g = h / group;
                let qh = &q[i][h * hd..(h + 1) * hd];
                let lowest = dims.window.map_or(0, |w| (i + 1).saturating_sub(w));
                let end = whole
                    .iter()
                    .find(|r| r.contains(&i))
                    .map_or(i + 1, |r| r.end);
                let scores: Vec<f32> = (lowest..end)
                    .map(|j| {
                        qh.iter()
                            .zip(&k[j][g * hd..(g + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let sink = sinks.map(|s| s[h]);
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = scores.iter().chain(&sink).map(|s| (s - max).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - max).exp() / z;
                    for d in 0..hd {
                        out[(i * nh + h) * hd + d] += p * v[lowest + j][g * hd + d];
                    }
                }
            }
        }
        Tensor::from_vec(out, (q.len(), nh * hd), &Device::Cpu).unwrap()
    }

    /// int8 encoding: within half a step of each value, the largest
    /// magnitude exact, an all-zero vector all zero.
    #[test]
    fn int8_encoding_rounds_to_the_nearest_step() {
        use host::KvElem;
        let src: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.31)
            .collect();
        let mut q = [0i8; 64];
        let scale = i8::encode(&src, &mut q);
        let amax = src.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert_eq!(scale, amax / 127.0);
        for (&x, &q) in src.iter().zip(&q) {
            assert!(
                (x - q as f32 * scale).abs() <= scale / 2.0 + 1e-6,
                "{x} -> {q}"
            );
        }
        assert!(q.iter().any(|&q| q.abs() == 127));
        assert_eq!(i8::encode(&[0.0; 64], &mut q), 0.0);
        assert!(q.iter().all(|&q| q == 0));
    }

    /// Two sequences with scattered block tables, fed in two steps (a prefill
    /// chunk, then a mixed chunk + decode step): both storages must match a
    /// plain causal attention over each whole sequence. The shapes cover the
    /// host kernel's vector paths and its tails (block or head sizes that are
    /// not a multiple of its 16 lanes), row blocks of more than 16 rows and
    /// contexts of several spans, with f16, f32 and int8 pools. On 2 threads
    /// and on 8, where the host kernel cuts the rows of step 2 (and of step
    /// 1's shorter shapes) into finer work items: every row comes out the
    /// same to the bit.
    #[test]
    fn paged_matches_dense_on_both_storages() {
        let pools = [2, 8].map(|threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        });
        for (block_size, head_dim, lens) in [
            (4, 16, [11, 6]),
            (16, 16, [41, 30]),
            (32, 24, [70, 40]),
            (16, 16, [600, 300]),
        ] {
            for dtype in [KvDtype::F16, KvDtype::F32, KvDtype::Int8] {
                let [a, b] = &pools.each_ref().map(|pool| {
                    pool.install(|| {
                        check_paged_against_dense(
                            block_size, head_dim, lens, dtype, None, false, false,
                        )
                    })
                });
                assert!(a == b, "rows differ with the threads' cut of the work");
            }
        }
    }

    /// Sliding-window layers: windows shorter than a block, spanning
    /// several, and longer than one sequence, so that whole tiles are
    /// skipped, windows start mid-tile, and a prompt chunk's rows see
    /// different ranges.
    #[test]
    fn paged_matches_dense_within_a_sliding_window() {
        for window in [3, 9, 35] {
            for dtype in [KvDtype::F16, KvDtype::Int8] {
                check_paged_against_dense(4, 16, [31, 14], dtype, Some(window), false, false);
                check_paged_against_dense(32, 24, [70, 40], dtype, Some(window), false, false);
            }
        }
        // Windows within one span and across spans, over contexts of several.
        for window in [100, 300] {
            check_paged_against_dense(16, 16, [600, 300], KvDtype::F16, Some(window), false, false);
        }
    }

    /// gpt-oss's attention sinks, with and without a window, over one span
    /// and several, on both storages: one head's sink exceeds every score,
    /// so the sink sets its max.
    #[test]
    fn paged_matches_dense_with_sinks() {
        for (block_size, head_dim, lens, window) in [
            (4, 16, [11, 6], None),
            (16, 16, [41, 30], Some(9)),
            (16, 16, [600, 300], None),
            (16, 16, [600, 300], Some(128)),
        ] {
            for dtype in [KvDtype::F16, KvDtype::F32] {
                check_paged_against_dense(block_size, head_dim, lens, dtype, window, true, false);
            }
        }
    }

    /// Spans seen whole (a Gemma 3 image's tokens), in a first step and as
    /// a whole later chunk, crossing tiles and KV spans, with windows
    /// shorter and longer than the span and with sinks, on both storages.
    #[test]
    fn paged_matches_dense_where_spans_are_seen_whole() {
        for (block_size, lens, window) in [
            (4, [31, 14], None),
            (4, [31, 14], Some(3)),
            (16, [80, 30], Some(20)),
            (16, [600, 300], None),
        ] {
            for dtype in [KvDtype::F16, KvDtype::Int8] {
                check_paged_against_dense(block_size, 16, lens, dtype, window, false, true);
            }
            check_paged_against_dense(block_size, 16, lens, KvDtype::F32, window, true, true);
        }
    }

    /// With `seen_whole`, each sequence has spans whose rows see each other
    /// whole: in its first step's rows, and (the first) the whole second
    /// step's chunk.
    fn check_paged_against_dense(
        block_size: usize,
        head_dim: usize,
        lens: [usize; 2],
        dtype: KvDtype,
        window: Option<usize>,
        with_sinks: bool,
        seen_whole: bool,
    ) -> Vec<Vec<f32>> {
        let dims = AttnDims {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim,
            block_size,
            window,
        };
        let (qd, kd) = (
            dims.num_heads * dims.head_dim,
            dims.num_kv_heads * dims.head_dim,
        );
        // Scattered block tables: the blocks in a stride-7919 permutation.
        let need = lens.map(|l| l.div_ceil(block_size));
        let num_blocks = need[0] + need[1];
        let order: Vec<u32> = (0..num_blocks)
            .map(|i| (i * 7919 % num_blocks) as u32)
            .collect();
        let tables = [order[..need[0]].to_vec(), order[need[0]..].to_vec()];
        let full: Vec<(Tensor, Tensor, Tensor)> = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                (
                    rand_tensor(l, qd, 10 + i as u64),
                    rand_tensor(l, kd, 20 + i as u64),
                    rand_tensor(l, kd, 30 + i as u64),
                )
            })
            .collect();
        // An f16 pool rounds K/V, an int8 one quantizes each token's head
        // vector to 127 steps of its largest magnitude: the reference sees
        // the same values.
        let stored = |t: &Tensor| match dtype {
            KvDtype::F16 => t
                .to_dtype(DType::F16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap(),
            KvDtype::F32 => t.clone(),
            KvDtype::Int8 => {
                let (rows, width) = t.dims2().unwrap();
                let heads = t.reshape((rows, width / head_dim, head_dim)).unwrap();
                let scale = (heads.abs().unwrap().max_keepdim(2).unwrap() / 127.0).unwrap();
                heads
                    .broadcast_div(&scale)
                    .unwrap()
                    .round()
                    .unwrap()
                    .broadcast_mul(&scale)
                    .unwrap()
                    .reshape((rows, width))
                    .unwrap()
            }
        };
        let sinks: Vec<f32> = (0..dims.num_heads)
            .map(|h| [-1.5, 0.3, 8.0, -0.2, 1.1, 0.0][h % 6])
            .collect();
        let sinks = with_sinks.then_some(sinks);
        let sinks_t = sinks
            .as_ref()
            .map(|s| Tensor::new(s.as_slice(), &Device::Cpu).unwrap());
        // Step 1: seq 0 all but its last 4 rows, seq 1 all but its last.
        // Step 2: the rest (a 4-row chunk and a decode row).
        let (c0, c1) = (lens[0] - 4, lens[1] - 1);
        let whole: [Vec<std::ops::Range<usize>>; 2] = match seen_whole {
            true => [
                vec![2..c0.min(2 + 3 * block_size), c0..lens[0]],
                std::iter::once(1..c1.min(6)).collect(),
            ],
            false => Default::default(),
        };
        let expected: Vec<Tensor> = full
            .iter()
            .zip(&whole)
            .map(|((q, k, v), whole)| {
                reference(q, &stored(k), &stored(v), dims, sinks.as_deref(), whole)
            })
            .collect();

        // The host kernel's output for each sequence, for comparing runs.
        let mut host = Vec::new();
        for force_tensor in [false, true] {
            let layout = KvLayout {
                num_layers: 1,
                num_kv_heads: 2,
                head_dim,
                block_size,
                num_blocks,
                dtype,
                window_kv: None,
            };
            let mut cache = match KvCache::new(layout, &Device::Cpu, force_tensor) {
                Ok(cache) => cache,
                // int8 is a host-pool format: other storages refuse it clearly.
                Err(e) if dtype == KvDtype::Int8 && force_tensor => {
                    assert!(e.to_string().contains("CPU cache format"), "{e}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let mut got = [Vec::new(), Vec::new()];
            let mut bufs = MetaBuffers::default();
            for split in [[(0, c0), (0, c1)], [(c0, lens[0]), (c1, lens[1])]] {
                let mut batch = FlatBatch::default();
                let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
                for (si, &(a, b)) in split.iter().enumerate() {
                    let (q, k, v) = &full[si];
                    qs.push(q.narrow(0, a, b - a).unwrap());
                    ks.push(k.narrow(0, a, b - a).unwrap());
                    vs.push(v.narrow(0, a, b - a).unwrap());
                    let tokens = vec![0; lens[si]];
                    batch.push(&tokens, a..b, tables[si].clone(), LogitRows::Last);
                    batch.seqs[si].seen_whole = whole[si]
                        .iter()
                        .filter(|r| a <= r.start && r.end <= b)
                        .cloned()
                        .collect();
                }
                let cat = |xs: &[Tensor]| Tensor::cat(xs, 0).unwrap();
                let qkv = Tensor::cat(&[cat(&qs), cat(&ks), cat(&vs)], 1).unwrap();
                let meta = step_meta(&mut bufs, &batch, &cache, window, &Device::Cpu).unwrap();
                let out = paged_attention(&qkv, cache.layer_mut(0), &meta, dims, sinks_t.as_ref())
                    .unwrap();
                for (si, s) in batch.seqs.iter().enumerate() {
                    got[si].push(out.narrow(0, s.start, s.len).unwrap());
                }
            }
            for si in 0..2 {
                let got = Tensor::cat(&got[si], 0).unwrap();
                if !force_tensor {
                    host.push(got.flatten_all().unwrap().to_vec1::<f32>().unwrap());
                }
                let diff = (got - &expected[si])
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(
                    diff < 1e-5,
                    "seq {si} block {block_size} head {head_dim} {dtype:?} window {window:?} force_tensor={force_tensor}: max diff {diff}"
                );
            }
        }
        host
    }
}
