//! x86-64 kernels: AVX-512 VNNI (`vpdpbusd`, 16 rows per register) and AVX2
//! (`vpmaddubsw` + `vpmaddwd`, 8 rows per register, two passes per tile).

use std::arch::x86_64::*;

use super::{Layout, TileJob, QK, TILE};

/// Activation rows kept in registers per pass over a tile's blocks: each needs
/// an i32 block sum and an f32 accumulator beside the 8 weight registers.
const ROWS_512: usize = 8;
/// With 16 ymm registers, 8 of them weights.
const ROWS_256: usize = 4;

pub(crate) fn avx512_vnni_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

pub(crate) fn avx2_supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI ([`avx512_vnni_supported`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn tile_avx512<L: Layout>(job: &TileJob) {
    let mut i = job.rows.start;
    while job.rows.end - i >= ROWS_512 {
        rows_avx512::<L, ROWS_512>(job, i, i == job.rows.start);
        i += ROWS_512;
    }
    let first = i == job.rows.start;
    match job.rows.end - i {
        0 => {}
        1 => rows_avx512::<L, 1>(job, i, first),
        2 => rows_avx512::<L, 2>(job, i, first),
        3 => rows_avx512::<L, 3>(job, i, first),
        4 => rows_avx512::<L, 4>(job, i, first),
        5 => rows_avx512::<L, 5>(job, i, first),
        6 => rows_avx512::<L, 6>(job, i, first),
        7 => rows_avx512::<L, 7>(job, i, first),
        _ => unreachable!(),
    }
}

/// Activation rows `i0..i0 + C` against the whole tile; the first pass over a
/// tile also prefetches the next one.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn rows_avx512<L: Layout, const C: usize>(job: &TileJob, i0: usize, prefetch: bool) {
    let acts = job.acts;
    let (k, nb) = (acts.k(), acts.k() / QK);
    assert!(i0 + C <= acts.m());
    let xq = acts.qs().as_ptr().add(i0 * k);
    let sc = acts.scales().as_ptr().add(i0 * nb);
    let nibble = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
        if prefetch {
            prefetch_block::<L>(job.next, b);
        }
        let p = blk.as_ptr();
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        let mut w = [_mm512_setzero_si512(); 8];
        let mn = if L::Q8 {
            for (g, w) in w.iter_mut().enumerate() {
                *w = _mm512_loadu_si512(p.add(2 * TILE + 64 * g).cast());
            }
            // Values are stored +128; Σ(q+128)x - 128Σx restores the signed dot.
            _mm512_mul_ps(d, _mm512_set1_ps(-128.0))
        } else {
            for j in 0..4 {
                let q = _mm512_loadu_si512(p.add(4 * TILE + 64 * j).cast());
                w[j] = _mm512_and_si512(q, nibble);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nibble);
            }
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * TILE).cast()))
        };
        for (c, acc) in acc.iter_mut().enumerate() {
            let x = xq.add(c * k + b * QK).cast::<i32>();
            let mut s = _mm512_setzero_si512();
            for (g, &w) in w.iter().enumerate() {
                s = _mm512_dpbusd_epi32(s, w, _mm512_set1_epi32(x.add(g).read_unaligned()));
            }
            let [dx, sx] = *sc.add(c * nb + b);
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(dx));
            *acc = _mm512_fmadd_ps(d, t, *acc);
            *acc = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx), *acc);
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        let mut v = [0f32; TILE];
        _mm512_storeu_ps(v.as_mut_ptr(), *acc);
        job.out.write(i0 + c, &v);
    }
}

/// Pulls block `b` of the next tile towards L2 while this one computes: the
/// hardware prefetcher alone leaves the first pass over each tile waiting on
/// DRAM (measured ~1.5x slower at batch 32 with cold weights).
#[inline(always)]
fn prefetch_block<L: Layout>(next: &[u8], b: usize) {
    if let Some(blk) = next.get(b * L::BLOCK_BYTES..(b + 1) * L::BLOCK_BYTES) {
        for line in blk.chunks(64) {
            // SAFETY: a prefetch only hints the cache; `line` is in bounds.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`avx2_supported`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_avx2<L: Layout>(job: &TileJob) {
    let mut i = job.rows.start;
    while job.rows.end - i >= ROWS_256 {
        rows_avx2::<L, ROWS_256>(job, i, i == job.rows.start);
        i += ROWS_256;
    }
    let first = i == job.rows.start;
    match job.rows.end - i {
        0 => {}
        1 => rows_avx2::<L, 1>(job, i, first),
        2 => rows_avx2::<L, 2>(job, i, first),
        3 => rows_avx2::<L, 3>(job, i, first),
        _ => unreachable!(),
    }
}

/// Activation rows `i0..i0 + C` against the tile, one half (8 rows) at a time;
/// the first pass over a tile also prefetches the next one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_avx2<L: Layout, const C: usize>(job: &TileJob, i0: usize, prefetch: bool) {
    let acts = job.acts;
    let (k, nb) = (acts.k(), acts.k() / QK);
    assert!(i0 + C <= acts.m());
    let xq = acts.qs().as_ptr().add(i0 * k);
    let sc = acts.scales().as_ptr().add(i0 * nb);
    let nibble = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut v = [[0f32; TILE]; C];
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); C];
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            if prefetch && h == 0 {
                prefetch_block::<L>(job.next, b);
            }
            let p = blk.as_ptr();
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast()));
            if L::Q8 {
                for (c, acc) in acc.iter_mut().enumerate() {
                    let x = xq.add(c * k + b * QK).cast::<i32>();
                    let mut s = _mm256_setzero_si256();
                    for g in 0..8 {
                        let q = _mm256_loadu_si256(p.add(2 * TILE + 64 * g + 32 * h).cast());
                        // Undo the +128 offset: u8 255 x i8 pairs would saturate
                        // vpmaddubsw, so multiply |w| by x carrying w's sign.
                        let w = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
                        let xb = _mm256_set1_epi32(x.add(g).read_unaligned());
                        let prod =
                            _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xb, w));
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(prod, ones));
                    }
                    let dx = (*sc.add(c * nb + b))[0];
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dx));
                    *acc = _mm256_fmadd_ps(d, t, *acc);
                }
            } else {
                let mn = _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * TILE + 16 * h).cast()));
                let mut w = [_mm256_setzero_si256(); 8];
                for j in 0..4 {
                    let q = _mm256_loadu_si256(p.add(4 * TILE + 64 * j + 32 * h).cast());
                    w[j] = _mm256_and_si256(q, nibble);
                    w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
                }
                for (c, acc) in acc.iter_mut().enumerate() {
                    let x = xq.add(c * k + b * QK).cast::<i32>();
                    // 8 pair sums of 15 x 127 stay below i16::MAX, so add in
                    // i16 and widen once.
                    let mut s16 = _mm256_setzero_si256();
                    for (g, &w) in w.iter().enumerate() {
                        let xb = _mm256_set1_epi32(x.add(g).read_unaligned());
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w, xb));
                    }
                    let s = _mm256_madd_epi16(s16, ones);
                    let [dx, sx] = *sc.add(c * nb + b);
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dx));
                    *acc = _mm256_fmadd_ps(d, t, *acc);
                    *acc = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx), *acc);
                }
            }
        }
        for (v, acc) in v.iter_mut().zip(&acc) {
            _mm256_storeu_ps(v[8 * h..].as_mut_ptr(), *acc);
        }
    }
    for (c, v) in v.iter().enumerate() {
        job.out.write(i0 + c, v);
    }
}

/// [`super::act::quantize_row`] with AVX-512, bit-identical to it.
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn quantize_row_avx512(x: &[f32], qs: &mut [i8], scales: &mut [[f32; 2]]) {
    for ((x, q), s) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(scales) {
        let a = _mm512_loadu_ps(x.as_ptr());
        let b = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        // Default MXCSR rounding is to nearest even, as in the scalar code.
        let qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id));
        let qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
        _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(qa));
        _mm_storeu_si128(q.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(qb));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        *s = [d, d * sum as f32];
    }
}

/// [`super::act::quantize_row`] with AVX2, bit-identical to it.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_row_avx2(x: &[f32], qs: &mut [i8], scales: &mut [[f32; 2]]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    for ((x, q), s) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(scales) {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let a: [__m256; 4] = std::array::from_fn(|i| _mm256_and_ps(v[i], abs_mask));
        let mx = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let mx = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
        let amax = _mm_cvtss_f32(_mm_max_ss(mx, _mm_movehdup_ps(mx)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let qi: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
        // packs interleave 128-bit lanes; the dword permute restores order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(qi[0], qi[1]),
            _mm256_packs_epi32(qi[2], qi[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr().cast(), p);
        let t = _mm256_add_epi32(
            _mm256_add_epi32(qi[0], qi[1]),
            _mm256_add_epi32(qi[2], qi[3]),
        );
        let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<1>(t)));
        *s = [d, d * sum as f32];
    }
}
