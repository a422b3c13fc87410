//! Per-call 8-bit quantization of activation rows.

use rayon::prelude::*;

use super::{Isa, QK};

/// Values from which quantization (~0.2 ns each with SIMD) is worth splitting
/// over the pool.
const PAR_MIN_VALUES: usize = 1 << 15;

/// Per block of 32: `d`, `d * Σq`, and `d * Σq` over the first 16 (for
/// types that scale per 16 inputs).
pub(crate) type ActScales = [f32; 3];

/// `m x k` activations as blocks of 32 `i8` with their [`ActScales`] in f32
/// (f32 rather than GGML's f16 keeps the only rounding in `q`).
#[derive(Default)]
pub(crate) struct QuantActs {
    qs: Vec<i8>,
    scales: Vec<ActScales>,
    m: usize,
    k: usize,
}

impl QuantActs {
    pub(crate) fn quantize(&mut self, x: &[f32], m: usize, k: usize, isa: Isa, parallel: bool) {
        debug_assert_eq!(x.len(), m * k);
        self.m = m;
        self.k = k;
        self.qs.resize(m * k, 0);
        self.scales.resize(m * k / QK, [0.0; 3]);
        let quantize_row = |x: &[f32], q: &mut [i8], s: &mut [ActScales]| match isa {
            Isa::Generic => quantize_row(x, q, s),
            // SAFETY (x86 arms): these `Isa`s are only chosen after runtime
            // detection of their features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::x86::quantize_row_avx2(x, q, s) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { super::x86::quantize_row_avx512(x, q, s) },
        };
        let nb = k / QK;
        if parallel && m * k >= PAR_MIN_VALUES {
            x.par_chunks_exact(k)
                .zip(self.qs.par_chunks_exact_mut(k))
                .zip(self.scales.par_chunks_exact_mut(nb))
                .for_each(|((x, q), s)| quantize_row(x, q, s));
        } else {
            x.chunks_exact(k)
                .zip(self.qs.chunks_exact_mut(k))
                .zip(self.scales.chunks_exact_mut(nb))
                .for_each(|((x, q), s)| quantize_row(x, q, s));
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

    /// All block scales, row-major `m x k/32`.
    pub(crate) fn scales(&self) -> &[ActScales] {
        &self.scales
    }

    /// Quants of row `i`.
    pub(crate) fn row(&self, i: usize) -> &[i8] {
        &self.qs[i * self.k..(i + 1) * self.k]
    }

    /// The scales of each block of row `i`.
    pub(crate) fn row_scales(&self, i: usize) -> &[ActScales] {
        let nb = self.k / QK;
        &self.scales[i * nb..(i + 1) * nb]
    }
}

/// The reference rounding: every SIMD variant produces identical bytes
/// (`d = amax / 127`, `q = round_ties_even(x * (1 / d))`).
pub(crate) fn quantize_row(x: &[f32], qs: &mut [i8], scales: &mut [ActScales]) {
    for ((x, q), s) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(scales) {
        let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sums = [0i32; 2];
        for (i, (q, &v)) in q.iter_mut().zip(x).enumerate() {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sums[i / 16] += r;
        }
        *s = scales_of(d, sums);
    }
}

/// The block's scales from `d` and its two half sums of quants.
pub(crate) fn scales_of(d: f32, [lo, hi]: [i32; 2]) -> ActScales {
    [d, d * (lo + hi) as f32, d * lo as f32]
}
