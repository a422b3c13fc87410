//! Per-call 8-bit quantization of activation rows.

use rayon::prelude::*;

use super::formats::QK_K;
use super::super_scales::SuperScales;
use super::{Isa, QK};

/// Values from which quantization (~0.2 ns each with SIMD) is worth splitting
/// over the pool.
const PAR_MIN_VALUES: usize = 1 << 15;

/// How many inputs share one activation scale, which each weight type's
/// kernels choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActBlocks {
    /// 32, as the per-32 types' own scales: each block's product converts
    /// to float anyway.
    B32,
    /// 256 (GGML's Q8_K), as a K-quant's super-block: its kernels then keep
    /// the sums of all its sub-blocks, weighted by their integer scales, in
    /// integers and convert once per 256 inputs.
    B256,
}

impl ActBlocks {
    const fn inputs(self) -> usize {
        match self {
            ActBlocks::B32 => QK,
            ActBlocks::B256 => QK_K,
        }
    }
}

/// Per block of 32: `d` and `d * Σq`, which folds the block's minimum term
/// into one multiply-add.
pub(crate) type ActScales = [f32; 2];

/// `m x k` activations as `i8` with f32 scales per block of 32 or 256
/// (f32 rather than GGML's f16 keeps the only rounding in `q`).
#[derive(Default)]
pub(crate) struct QuantActs {
    qs: Vec<i8>,
    scales: Vec<ActScales>,
    supers: Vec<SuperScales>,
    m: usize,
    k: usize,
}

impl QuantActs {
    pub(crate) fn quantize(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        blocks: ActBlocks,
        isa: Isa,
        parallel: bool,
    ) {
        debug_assert_eq!(x.len(), m * k);
        self.m = m;
        self.k = k;
        self.qs.resize(m * k, 0);
        let parallel = parallel && m * k >= PAR_MIN_VALUES;
        match blocks {
            ActBlocks::B32 => {
                self.scales.resize(m * k / QK, [0.0; 2]);
                let to = |d: f32, s: &[i32; 16]| [d, d * (s[0] + s[1]) as f32];
                quantize_rows(
                    x,
                    k,
                    &mut self.qs,
                    &mut self.scales,
                    blocks,
                    isa,
                    parallel,
                    to,
                );
            }
            ActBlocks::B256 => {
                self.supers.resize(m * k / QK_K, SuperScales::default());
                let (qs, supers) = (&mut self.qs, &mut self.supers);
                quantize_rows(x, k, qs, supers, blocks, isa, parallel, SuperScales::new);
            }
        }
    }

    pub(crate) fn m(&self) -> usize {
        self.m
    }

    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// All quants, row-major `m x k`.
    pub(crate) fn qs(&self) -> &[i8] {
        &self.qs
    }

    /// All per-32 block scales, row-major `m x k/32` (after
    /// [`ActBlocks::B32`]).
    pub(crate) fn scales(&self) -> &[ActScales] {
        &self.scales
    }

    /// All per-256 block scales, row-major `m x k/256` (after
    /// [`ActBlocks::B256`]).
    pub(crate) fn supers(&self) -> &[SuperScales] {
        &self.supers
    }

    /// Quants of row `i`.
    pub(crate) fn row(&self, i: usize) -> &[i8] {
        &self.qs[i * self.k..(i + 1) * self.k]
    }

    /// The per-32 scales of each block of row `i`.
    pub(crate) fn row_scales(&self, i: usize) -> &[ActScales] {
        let nb = self.k / QK;
        &self.scales[i * nb..(i + 1) * nb]
    }

    /// The per-256 scales of each block of row `i`.
    pub(crate) fn row_supers(&self, i: usize) -> &[SuperScales] {
        let nb = self.k / QK_K;
        &self.supers[i * nb..(i + 1) * nb]
    }
}

/// Quantizes every row of `x` (`k` values each), writing `to(d, sums per
/// 16)` for each of its blocks.
#[allow(clippy::too_many_arguments)]
fn quantize_rows<T: Send>(
    x: &[f32],
    k: usize,
    qs: &mut [i8],
    out: &mut [T],
    blocks: ActBlocks,
    isa: Isa,
    parallel: bool,
    to: impl Fn(f32, &[i32; 16]) -> T + Sync,
) {
    let bs = blocks.inputs();
    let row = |x: &[f32], q: &mut [i8], out: &mut [T]| {
        let emit = |b: usize, d: f32, s: &[i32; 16]| out[b] = to(d, s);
        match isa {
            Isa::Generic => quantize_row(x, q, bs, emit),
            // SAFETY (x86 arms): these `Isa`s are only chosen after runtime
            // detection of their features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::x86::quantize_row_avx2(x, q, bs, emit) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { super::x86::quantize_row_avx512(x, q, bs, emit) },
        }
    };
    let nb = k / bs;
    if parallel {
        x.par_chunks_exact(k)
            .zip(qs.par_chunks_exact_mut(k))
            .zip(out.par_chunks_exact_mut(nb))
            .for_each(|((x, q), o)| row(x, q, o));
    } else {
        x.chunks_exact(k)
            .zip(qs.chunks_exact_mut(k))
            .zip(out.chunks_exact_mut(nb))
            .for_each(|((x, q), o)| row(x, q, o));
    }
}

/// The reference rounding, one scale per block of `bs` inputs: every SIMD
/// variant produces identical bytes (`d = amax / 127`,
/// `q = round_ties_even(x * (1 / d))`). Calls `emit(block, d, sums)` with
/// the sums of the quants per 16 (the first `bs / 16` used).
pub(crate) fn quantize_row(
    x: &[f32],
    qs: &mut [i8],
    bs: usize,
    mut emit: impl FnMut(usize, f32, &[i32; 16]),
) {
    for (b, (x, q)) in x.chunks_exact(bs).zip(qs.chunks_exact_mut(bs)).enumerate() {
        let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sums = [0i32; 16];
        for (i, (q, &v)) in q.iter_mut().zip(x).enumerate() {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sums[i / 16] += r;
        }
        emit(b, d, &sums);
    }
}
