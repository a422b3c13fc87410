//! x86-64 kernels: AVX-512 VNNI (`vpdpbusd`, 16 rows per register) and AVX2
//! (`vpmaddubsw` + `vpmaddwd`, 8 rows per register, two passes per tile).

use std::arch::x86_64::*;

use super::act::{scales_of, ActScales};
use super::formats::{Bits, Layout, Scales};
use super::{TileJob, QK, TILE};

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

/// Moves a group's high bits from bit `bit` of each byte to bit 4, where
/// [`Bits::high_mask`] keeps them; the shifts are 16-bit, and bits that cross into a
/// neighbouring byte fall outside the mask. Immediate shift counts need a
/// literal per case.
macro_rules! high_to_bit4 {
    ($v:expr, $bit:expr, $sll:ident, $srl:ident) => {
        match $bit {
            0 => $sll::<4>($v),
            1 => $sll::<3>($v),
            2 => $sll::<2>($v),
            3 => $sll::<1>($v),
            4 => $v,
            5 => $srl::<1>($v),
            6 => $srl::<2>($v),
            _ => $srl::<3>($v),
        }
    };
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
    let mut acc = [_mm512_setzero_ps(); C];
    for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
        if prefetch {
            prefetch_block::<L>(job.next, b);
        }
        let p = blk.as_ptr();
        let hd = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        let he = match L::SCALES {
            Scales::DirectD => _mm512_mul_ps(hd, _mm512_set1_ps(-L::BITS.midpoint())),
            _ => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * TILE).cast())),
        };
        for j in 0..L::SUBS {
            let (s, m) = scales_avx512::<L>(p, j, hd, he);
            let w = quants_avx512::<L>(p, j);
            let ab = b * L::SUBS + j;
            for (c, acc) in acc.iter_mut().enumerate() {
                let x = xq.add(c * k + ab * QK).cast::<i32>();
                let dot = |groups: std::ops::Range<usize>| {
                    let mut s = _mm512_setzero_si512();
                    for g in groups {
                        s = _mm512_dpbusd_epi32(
                            s,
                            w[g],
                            _mm512_set1_epi32(x.add(g).read_unaligned()),
                        );
                    }
                    _mm512_cvtepi32_ps(s)
                };
                let [dx, sx, sx_lo] = *sc.add(c * nb + ab);
                let dx = _mm512_set1_ps(dx);
                if L::HALVES {
                    *acc = _mm512_fmadd_ps(s[0], _mm512_mul_ps(dot(0..4), dx), *acc);
                    *acc = _mm512_fmadd_ps(s[1], _mm512_mul_ps(dot(4..8), dx), *acc);
                    *acc = _mm512_fmadd_ps(m[0], _mm512_set1_ps(sx_lo), *acc);
                    *acc = _mm512_fmadd_ps(m[1], _mm512_set1_ps(sx - sx_lo), *acc);
                } else {
                    *acc = _mm512_fmadd_ps(s[0], _mm512_mul_ps(dot(0..8), dx), *acc);
                    *acc = _mm512_fmadd_ps(m[0], _mm512_set1_ps(sx), *acc);
                }
            }
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        let mut v = [0f32; TILE];
        _mm512_storeu_ps(v.as_mut_ptr(), *acc);
        job.out.write(i0 + c, &v);
    }
}

/// Sub-block `j`'s scales and minima of the tile's 16 rows, per half
/// (both halves equal unless the layout scales per 16 inputs). `hd` and
/// `he` are the block header's two f16 vectors.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn scales_avx512<L: Layout>(
    p: *const u8,
    j: usize,
    hd: __m512,
    he: __m512,
) -> ([__m512; 2], [__m512; 2]) {
    let sub = p.add(L::SCALES.header_bytes() + j * L::SCALES.sub_bytes());
    let ints = |at: usize| {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            sub.add(at * TILE).cast(),
        )))
    };
    match L::SCALES {
        Scales::Direct | Scales::DirectD => ([hd; 2], [he; 2]),
        Scales::Super32 => {
            let (s, m) = (_mm512_mul_ps(hd, ints(0)), _mm512_mul_ps(he, ints(1)));
            ([s; 2], [m; 2])
        }
        Scales::Super16 => (
            [_mm512_mul_ps(hd, ints(0)), _mm512_mul_ps(hd, ints(1))],
            [_mm512_mul_ps(he, ints(2)), _mm512_mul_ps(he, ints(3))],
        ),
    }
}

/// Sub-block `j`'s quants as 8 registers, group `g` (inputs `4g..4g + 4`
/// of all 16 rows) in register `g`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn quants_avx512<L: Layout>(p: *const u8, j: usize) -> [__m512i; 8] {
    let q = p.add(L::SCALES.header_bytes() + L::SUBS * L::SCALES.sub_bytes() + j * L::BITS.bytes());
    let mut w = [_mm512_setzero_si512(); 8];
    if L::BITS == Bits::Byte {
        for (g, w) in w.iter_mut().enumerate() {
            *w = _mm512_loadu_si512(q.add(64 * g).cast());
        }
        return w;
    }
    let nibble = _mm512_set1_epi8(0x0F);
    for c in 0..4 {
        let v = _mm512_loadu_si512(q.add(64 * c).cast());
        w[c] = _mm512_and_si512(v, nibble);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
    }
    if L::BITS.high_bits() > 0 {
        let high = _mm512_set1_epi8(L::BITS.high_mask() as i8);
        for (g, w) in w.iter_mut().enumerate() {
            let (at, bit) = L::BITS.high_at(g);
            let v = _mm512_loadu_si512(q.add(at).cast());
            let v = high_to_bit4!(v, bit, _mm512_slli_epi16, _mm512_srli_epi16);
            *w = _mm512_or_si512(*w, _mm512_and_si512(v, high));
        }
    }
    w
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

/// Activation rows `i0..i0 + C` against the tile, in halves of 8 rows.
/// With few rows (decode) both halves' accumulators stay live, so the tile
/// streams through once; with more, a pass per half keeps them all in
/// registers and the second pass finds the tile in cache. The first pass
/// over a tile also prefetches the next one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_avx2<L: Layout, const C: usize>(job: &TileJob, i0: usize, prefetch: bool) {
    let acts = job.acts;
    let (k, nb) = (acts.k(), acts.k() / QK);
    assert!(i0 + C <= acts.m());
    let xq = acts.qs().as_ptr().add(i0 * k);
    let sc = acts.scales().as_ptr().add(i0 * nb);
    let per_pass = if C <= 2 { 2 } else { 1 };
    let mut acc = [[_mm256_setzero_ps(); C]; 2];
    for pass in (0..2).step_by(per_pass) {
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            if prefetch && pass == 0 {
                prefetch_block::<L>(job.next, b);
            }
            let p = blk.as_ptr();
            for j in 0..L::SUBS {
                let ab = b * L::SUBS + j;
                let x_at = |c: usize| xq.add(c * k + ab * QK).cast::<i32>();
                let act = |c: usize| -> ActScales { *sc.add(c * nb + ab) };
                for (h, acc) in acc.iter_mut().enumerate().skip(pass).take(per_pass) {
                    half_avx2::<L, C>(p, j, h, acc, x_at, act);
                }
            }
        }
    }
    let mut v = [[0f32; TILE]; C];
    for (h, acc) in acc.iter().enumerate() {
        for (v, acc) in v.iter_mut().zip(acc) {
            _mm256_storeu_ps(v[8 * h..].as_mut_ptr(), *acc);
        }
    }
    for (c, v) in v.iter().enumerate() {
        job.out.write(i0 + c, v);
    }
}

/// Sub-block `j` of half `h` (output rows `8h..8h + 8`) of the block at `p`
/// against the rows, into `acc`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn half_avx2<L: Layout, const C: usize>(
    p: *const u8,
    j: usize,
    h: usize,
    acc: &mut [__m256; C],
    x_at: impl Fn(usize) -> *const i32,
    act: impl Fn(usize) -> ActScales,
) {
    let hd = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast()));
    if L::BITS == Bits::Byte {
        return byte_rows_avx2(p, h, hd, acc, x_at, act);
    }
    let he = match L::SCALES {
        Scales::DirectD => _mm256_mul_ps(hd, _mm256_set1_ps(-L::BITS.midpoint())),
        _ => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * TILE + 16 * h).cast())),
    };
    let (s, m) = scales_avx2::<L>(p, j, h, hd, he);
    let w = quants_avx2::<L>(p, j, h);
    for (c, acc) in acc.iter_mut().enumerate() {
        let x = x_at(c);
        let [dx, sx, sx_lo] = act(c);
        let dx = _mm256_set1_ps(dx);
        let dot = |g: std::ops::Range<usize>| dot_avx2(&w, x, g, L::BITS);
        if L::HALVES {
            *acc = _mm256_fmadd_ps(s[0], _mm256_mul_ps(dot(0..4), dx), *acc);
            *acc = _mm256_fmadd_ps(s[1], _mm256_mul_ps(dot(4..8), dx), *acc);
            *acc = _mm256_fmadd_ps(m[0], _mm256_set1_ps(sx_lo), *acc);
            *acc = _mm256_fmadd_ps(m[1], _mm256_set1_ps(sx - sx_lo), *acc);
        } else {
            *acc = _mm256_fmadd_ps(s[0], _mm256_mul_ps(dot(0..8), dx), *acc);
            *acc = _mm256_fmadd_ps(m[0], _mm256_set1_ps(sx), *acc);
        }
    }
}

/// Byte quants (Q8_0, stored `q + 128`) of half `h` against the rows:
/// vpmaddubsw would saturate on u8 255 x i8 pairs, so this multiplies `|q|`
/// by `x` carrying `q`'s sign, which also makes the minimum term vanish.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn byte_rows_avx2<const C: usize>(
    p: *const u8,
    h: usize,
    d: __m256,
    acc: &mut [__m256; C],
    x_at: impl Fn(usize) -> *const i32,
    act: impl Fn(usize) -> ActScales,
) {
    let ones = _mm256_set1_epi16(1);
    for (c, acc) in acc.iter_mut().enumerate() {
        let x = x_at(c);
        let mut s = _mm256_setzero_si256();
        for g in 0..8 {
            let q = _mm256_loadu_si256(p.add(2 * TILE + 64 * g + 32 * h).cast());
            let w = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
            let xb = _mm256_set1_epi32(x.add(g).read_unaligned());
            let prod = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xb, w));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(prod, ones));
        }
        let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(act(c)[0]));
        *acc = _mm256_fmadd_ps(d, t, *acc);
    }
}

/// Σ over groups `groups` of quants times activations, for 8 rows.
/// vpmaddubsw pairs sum in i16, so as many groups are added in i16 as the
/// quants' range allows before widening to i32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_avx2(
    w: &[__m256i; 8],
    x: *const i32,
    groups: std::ops::Range<usize>,
    bits: Bits,
) -> __m256 {
    // Each group adds up to 2 pairs of max * 127 per i16 lane.
    let per_i16 = (i16::MAX as u32 / (2 * bits.max() * 127)) as usize;
    let ones = _mm256_set1_epi16(1);
    let mut s32 = _mm256_setzero_si256();
    let mut g = groups.start;
    while g < groups.end {
        let end = (g + per_i16).min(groups.end);
        let mut s16 = _mm256_setzero_si256();
        for (g, &w) in w.iter().enumerate().take(end).skip(g) {
            let xb = _mm256_set1_epi32(x.add(g).read_unaligned());
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w, xb));
        }
        s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, ones));
        g = end;
    }
    _mm256_cvtepi32_ps(s32)
}

/// [`scales_avx512`] for rows `8h..8h + 8`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scales_avx2<L: Layout>(
    p: *const u8,
    j: usize,
    h: usize,
    hd: __m256,
    he: __m256,
) -> ([__m256; 2], [__m256; 2]) {
    let sub = p.add(L::SCALES.header_bytes() + j * L::SCALES.sub_bytes());
    let ints = |at: usize| {
        let v = _mm_loadl_epi64(sub.add(at * TILE + 8 * h).cast());
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
    };
    match L::SCALES {
        Scales::Direct | Scales::DirectD => ([hd; 2], [he; 2]),
        Scales::Super32 => {
            let (s, m) = (_mm256_mul_ps(hd, ints(0)), _mm256_mul_ps(he, ints(1)));
            ([s; 2], [m; 2])
        }
        Scales::Super16 => (
            [_mm256_mul_ps(hd, ints(0)), _mm256_mul_ps(hd, ints(1))],
            [_mm256_mul_ps(he, ints(2)), _mm256_mul_ps(he, ints(3))],
        ),
    }
}

/// [`quants_avx512`] for rows `8h..8h + 8` (bytes `32h..32h + 32` of each
/// 64-byte chunk).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn quants_avx2<L: Layout>(p: *const u8, j: usize, h: usize) -> [__m256i; 8] {
    let q = p.add(L::SCALES.header_bytes() + L::SUBS * L::SCALES.sub_bytes() + j * L::BITS.bytes());
    let nibble = _mm256_set1_epi8(0x0F);
    let mut w = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let v = _mm256_loadu_si256(q.add(64 * c + 32 * h).cast());
        w[c] = _mm256_and_si256(v, nibble);
        w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
    }
    if L::BITS.high_bits() > 0 {
        let high = _mm256_set1_epi8(L::BITS.high_mask() as i8);
        for (g, w) in w.iter_mut().enumerate() {
            let (at, bit) = L::BITS.high_at(g);
            let v = _mm256_loadu_si256(q.add(at + 32 * h).cast());
            let v = high_to_bit4!(v, bit, _mm256_slli_epi16, _mm256_srli_epi16);
            *w = _mm256_or_si256(*w, _mm256_and_si256(v, high));
        }
    }
    w
}

/// [`super::act::quantize_row`] with AVX-512, bit-identical to it.
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn quantize_row_avx512(x: &[f32], qs: &mut [i8], scales: &mut [ActScales]) {
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
        *s = scales_of(
            d,
            [_mm512_reduce_add_epi32(qa), _mm512_reduce_add_epi32(qb)],
        );
    }
}

/// [`super::act::quantize_row`] with AVX2, bit-identical to it.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_row_avx2(x: &[f32], qs: &mut [i8], scales: &mut [ActScales]) {
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
        let lo = hsum_epi32_avx2(_mm256_add_epi32(qi[0], qi[1]));
        let hi = hsum_epi32_avx2(_mm256_add_epi32(qi[2], qi[3]));
        *s = scales_of(d, [lo, hi]);
    }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum_epi32_avx2(v: __m256i) -> i32 {
    let t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<1>(t)))
}
