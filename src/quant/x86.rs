//! x86-64 kernels: AVX-512 VNNI (`vpdpbusd`, 16 rows per register) and AVX2
//! (`vpmaddubsw` + `vpmaddwd`, 8 rows per register).
//!
//! Both sum each block (32 inputs, or a K-quant's 256) of every row in i32,
//! weighting a K-quant's sub-blocks by their integer scales on the way
//! (`vpmaddwd` with the scales on AVX2, `vpmulld` on AVX-512), then scale the
//! block's sum to float once: `d dx` for the quants and, for the minima,
//! `e dx` times their integer dot product with the activations' sums.

use std::arch::x86_64::*;

use super::formats::{Bits, Layout, Scales, E2M1, QK_K};
use super::super_scales::SuperScales;
use super::{TileJob, M_BLOCK, QK, TILE};

/// Activation rows kept in registers per pass over a tile's blocks: each needs
/// an i32 block sum and an f32 accumulator beside the 8 weight registers.
const ROWS_512: usize = 8;
/// With 16 ymm registers, 8 of them weights: each row then needs only its
/// i32 block sum in a register (the float accumulators are touched once per
/// block). 5 measured 6-8% faster than 4 on Q4_K at 32-128 rows.
const ROWS_256: usize = 5;

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
/// tile also prefetches ahead ([`prefetch_ahead`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn rows_avx512<L: Layout, const C: usize>(job: &TileJob, i0: usize, prefetch: bool) {
    let acts = job.acts;
    let k = acts.k();
    assert!(i0 + C <= acts.m());
    let xq = acts.qs().as_ptr().add(i0 * k);
    let mut acc = [_mm512_setzero_ps(); C];
    for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
        let p = blk.as_ptr();
        let mut idot = [_mm512_setzero_si512(); C];
        for j in 0..L::SUBS {
            if prefetch {
                prefetch_ahead::<L>(p, j);
            }
            let w = quants_avx512::<L>(p, j);
            let sc = scales_avx512::<L>(p, j);
            for (c, idot) in idot.iter_mut().enumerate() {
                let x = xq.add(c * k + (b * L::SUBS + j) * QK).cast::<i32>();
                *idot = _mm512_add_epi32(*idot, idot_avx512::<L>(&w, x, sc));
            }
        }
        let d = match L::SCALES {
            // Each exponent byte into an f32's exponent field.
            Scales::DirectExp => _mm512_castsi512_ps(_mm512_slli_epi32::<23>(
                _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())),
            )),
            _ => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
        };
        let e = match L::SCALES.symmetric() {
            true => _mm512_mul_ps(d, _mm512_set1_ps(-L::BITS.midpoint())),
            false => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * TILE).cast())),
        };
        for (c, acc) in acc.iter_mut().enumerate() {
            // d (Σ dx): the per-32 types' float order from before the
            // K-quants summed per 256, so their results did not move.
            let sum =
                |s: __m512i, dx: f32| _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(dx));
            *acc = if L::SCALES.is_super() {
                let xs = &*acts.supers().as_ptr().add((i0 + c) * (k / QK_K) + b);
                let a = _mm512_fmadd_ps(d, sum(idot[c], xs.d), *acc);
                _mm512_fmadd_ps(e, sum(mins_avx512::<L>(p, xs), xs.d), a)
            } else {
                let [dx, sx] = *acts.scales().as_ptr().add((i0 + c) * (k / QK) + b);
                let a = _mm512_fmadd_ps(d, sum(idot[c], dx), *acc);
                _mm512_fmadd_ps(e, _mm512_set1_ps(sx), a)
            };
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        let mut v = [0f32; TILE];
        _mm512_storeu_ps(v.as_mut_ptr(), *acc);
        job.out.write(i0 + c, &v);
    }
}

/// Σ quants times activations of one sub-block for the 16 rows, weighted
/// by a K-quant's integer scales `sc` (per half of 16 inputs).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn idot_avx512<L: Layout>(w: &[__m512i; 8], x: *const i32, sc: [__m512i; 2]) -> __m512i {
    let dot = |groups: std::ops::Range<usize>| {
        let mut s = _mm512_setzero_si512();
        for g in groups {
            s = _mm512_dpbusd_epi32(s, w[g], _mm512_set1_epi32(x.add(g).read_unaligned()));
        }
        s
    };
    if !L::SCALES.is_super() {
        dot(0..8)
    } else if L::HALVES {
        _mm512_add_epi32(
            _mm512_mullo_epi32(dot(0..4), sc[0]),
            _mm512_mullo_epi32(dot(4..8), sc[1]),
        )
    } else {
        _mm512_mullo_epi32(dot(0..8), sc[0])
    }
}

/// Sub-block `j`'s integer scales of the 16 rows as i32, per half of 16
/// inputs (both equal when the layout scales per 32); unused by the
/// per-32 layouts.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn scales_avx512<L: Layout>(p: *const u8, j: usize) -> [__m512i; 2] {
    let area = p.add(L::SCALES.header_bytes());
    match L::SCALES {
        Scales::Direct | Scales::DirectD | Scales::DirectExp => [_mm512_setzero_si512(); 2],
        Scales::Super32 => [_mm512_cvtepi8_epi32(_mm_loadu_si128(area.add(j * TILE).cast())); 2],
        Scales::Super16 | Scales::Super16Offset => {
            // Row r's pair (first half, second half) as one i32 of two i16.
            let v = _mm512_cvtepi8_epi16(_mm256_loadu_si256(area.add(j * 2 * TILE).cast()));
            [
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(v)),
                _mm512_srai_epi32::<16>(v),
            ]
        }
    }
}

/// The 16 rows' integer minima dotted with the activations' sums over one
/// super-block: `Σ mn Σx` per row, in pairs of `vpmaddwd`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn mins_avx512<L: Layout>(p: *const u8, xs: &SuperScales) -> __m512i {
    let mins = p.add(L::SCALES.mins_at());
    let sums = xs.sums_for(L::SCALES);
    let mut t = _mm512_setzero_si512();
    for i in 0..sums.len() / 2 {
        let mn = _mm512_cvtepi8_epi16(_mm256_loadu_si256(mins.add(i * 2 * TILE).cast()));
        let x = _mm512_set1_epi32(SuperScales::pair(sums, i));
        t = _mm512_add_epi32(t, _mm512_madd_epi16(mn, x));
    }
    t
}

/// Sub-block `j`'s quants as 8 registers, group `g` (inputs `4g..4g + 4`
/// of all 16 rows) in register `g`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn quants_avx512<L: Layout>(p: *const u8, j: usize) -> [__m512i; 8] {
    let q = p.add(L::SCALES.quants_at(L::BITS, j));
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
    if L::BITS == Bits::Lut {
        // Each code to its quant: one in-lane byte shuffle of the table.
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1.as_ptr().cast()));
        w.iter_mut()
            .for_each(|w| *w = _mm512_shuffle_epi8(table, *w));
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

/// How far ahead of the block being computed the kernels prefetch weights.
/// Tiles lie back to back, so this runs on into the next tile. 768 B to
/// 4 KiB measured alike on Zen 3.
const PREFETCH_AHEAD: usize = 2048;

/// Prefetches the weight bytes `PREFETCH_AHEAD` past sub-block `j` of the
/// block at `p`, so a block's prefetches spread over its sub-blocks, a few
/// lines at a time. Issuing a whole block's lines at once (36 for Q4_K) was
/// slower on Zen 3 than no prefetch at all; spread out, one-row matmuls
/// stream weights at 75-90% of `wick bench`'s bandwidth probe (Q6_K had
/// been at 50%). Not yet measured on the AVX-512 hosts.
#[inline(always)]
fn prefetch_ahead<L: Layout>(p: *const u8, j: usize) {
    let per = L::BLOCK_BYTES / L::SUBS;
    for o in (j * per..(j + 1) * per).step_by(64) {
        // A prefetch only hints the cache and never faults, so the address
        // may lie past the end of the matrix.
        let line = p.wrapping_add(PREFETCH_AHEAD + o);
        // SAFETY: see above; SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast()) };
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`avx2_supported`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_avx2<L: Layout>(job: &TileJob) {
    if L::SCALES.is_super() && L::BITS.high_bits() > 0 && job.rows.len() > 2 {
        return blocks_avx2::<L>(job);
    }
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
        4 => rows_avx2::<L, 4>(job, i, first),
        _ => unreachable!(),
    }
}

/// Activation rows `i0..i0 + C` against the tile, in halves of 8 rows.
/// With few rows (decode) both halves' sums stay live, so the tile streams
/// through once; with more, a pass per half keeps them all in registers
/// and the second pass finds the tile in cache. The first pass over a tile
/// also prefetches ahead ([`prefetch_ahead`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_avx2<L: Layout, const C: usize>(job: &TileJob, i0: usize, prefetch: bool) {
    if L::BITS == Bits::Byte {
        return byte_rows_avx2::<L, C>(job, i0, prefetch);
    }
    let acts = job.acts;
    let k = acts.k();
    assert!(i0 + C <= acts.m());
    let xq = acts.qs().as_ptr().add(i0 * k);
    let per_pass = if C <= 2 { 2 } else { 1 };
    let mut acc = [[_mm256_setzero_ps(); C]; 2];
    for pass in (0..2).step_by(per_pass) {
        let halves = pass..pass + per_pass;
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            let p = blk.as_ptr();
            let mut idot = [[_mm256_setzero_si256(); C]; 2];
            for j in 0..L::SUBS {
                if prefetch && pass == 0 {
                    prefetch_ahead::<L>(p, j);
                }
                for h in halves.clone() {
                    let w = quants_avx2::<L>(p, j, h);
                    let sc = scales_avx2::<L>(p, j, h);
                    for (c, idot) in idot[h].iter_mut().enumerate() {
                        let x = xq.add(c * k + (b * L::SUBS + j) * QK).cast::<i32>();
                        *idot = _mm256_add_epi32(*idot, idot_avx2::<L>(&w, x, sc));
                    }
                }
            }
            for h in halves.clone() {
                let de = block_scales_avx2::<L>(p, h);
                for (c, acc) in acc[h].iter_mut().enumerate() {
                    *acc = scale_block_avx2::<L>(job, p, de, b, h, i0 + c, idot[h][c], *acc);
                }
            }
        }
    }
    write_rows_avx2(job, i0, &acc);
}

/// [`rows_avx2`] for Q8_0, whose signed quants need `vpsignb` to move each
/// quant's sign onto its activation before `vpmaddubsw` (the stored `q + 128`
/// as its unsigned operand would saturate the i16 pair sums) and a
/// `vpmaddwd` per group to widen (two products already fill an i16).
/// Groups are the outer loop, so a group's `q` and `|q|` are formed once
/// for all `C` rows and the 8 groups never have to be live at once: the
/// per-row order spilled them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn byte_rows_avx2<L: Layout, const C: usize>(job: &TileJob, i0: usize, prefetch: bool) {
    let acts = job.acts;
    let k = acts.k();
    assert!(L::SUBS == 1 && i0 + C <= acts.m());
    let xq = acts.qs().as_ptr().add(i0 * k);
    let per_pass = if C <= 2 { 2 } else { 1 };
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; 2];
    for pass in (0..2).step_by(per_pass) {
        let halves = pass..pass + per_pass;
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            let p = blk.as_ptr();
            if prefetch && pass == 0 {
                prefetch_ahead::<L>(p, 0);
            }
            let q = p.add(L::SCALES.quants_at(L::BITS, 0));
            let mut idot = [[_mm256_setzero_si256(); C]; 2];
            for g in 0..8 {
                for h in halves.clone() {
                    // Stored as `q + 128` (the AVX-512 kernel's unsigned operand).
                    let v = _mm256_loadu_si256(q.add(64 * g + 32 * h).cast());
                    let w = _mm256_xor_si256(v, _mm256_set1_epi8(-128));
                    let a = _mm256_abs_epi8(w);
                    for (c, idot) in idot[h].iter_mut().enumerate() {
                        let x = xq.add(c * k + b * QK + 4 * g).cast::<i32>();
                        let xb = _mm256_set1_epi32(x.read_unaligned());
                        let prod = _mm256_maddubs_epi16(a, _mm256_sign_epi8(xb, w));
                        *idot = _mm256_add_epi32(*idot, _mm256_madd_epi16(prod, ones));
                    }
                }
            }
            for h in halves.clone() {
                let de = block_scales_avx2::<L>(p, h);
                for (c, acc) in acc[h].iter_mut().enumerate() {
                    *acc = scale_block_avx2::<L>(job, p, de, b, h, i0 + c, idot[h][c], *acc);
                }
            }
        }
    }
    write_rows_avx2(job, i0, &acc);
}

/// Writes rows `i0..i0 + C` of the tile's output from their two halves' sums.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn write_rows_avx2<const C: usize>(job: &TileJob, i0: usize, acc: &[[__m256; C]; 2]) {
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

/// Q5_K and Q6_K against 3 or more rows, a super-block at a time: each
/// half's quants are unpacked once into a buffer that stays in L1 and
/// serve every row, where [`rows_avx2`] unpacks them again for each pass
/// of `ROWS_256` rows (merging the high bits costs as much as a row's
/// products). The float sums, touched once per block, live in memory.
/// Nibble-only layouts unpack in a few ops, cheaper than this path's
/// buffer and memory sums (Q4_K measured ~4% slower here at 32-128 rows,
/// Q6_K 3-10% faster).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blocks_avx2<L: Layout>(job: &TileJob) {
    let rows = job.rows.clone();
    let i0 = rows.start;
    // Only the rows in use are zeroed: clearing all M_BLOCK (16 KiB) per
    // tile would cost as much as a few blocks' products at 32 rows.
    assert!(rows.len() <= M_BLOCK);
    let mut buf = std::mem::MaybeUninit::<[[__m256; 2]; M_BLOCK]>::uninit();
    let base = buf.as_mut_ptr().cast::<[__m256; 2]>();
    for r in 0..rows.len() {
        base.add(r).write([_mm256_setzero_ps(); 2]);
    }
    // SAFETY: the first rows.len() entries were just written.
    let acc = std::slice::from_raw_parts_mut(base, rows.len());
    let mut w = [[_mm256_setzero_si256(); 8]; QK_K / QK];
    let mut sc = [[_mm256_setzero_si256(); 2]; QK_K / QK];
    for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
        let p = blk.as_ptr();
        for h in 0..2 {
            for j in 0..L::SUBS {
                if h == 0 {
                    prefetch_ahead::<L>(p, j);
                }
                w[j] = quants_avx2::<L>(p, j, h);
                sc[j] = scales_avx2::<L>(p, j, h);
            }
            let mut i = 0;
            while acc.len() - i >= ROWS_256 {
                let group = &mut acc[i..i + ROWS_256];
                group_avx2::<L, ROWS_256>(job, p, b, h, &w, &sc, i0 + i, group);
                i += ROWS_256;
            }
            let rest = &mut acc[i..];
            match rest.len() {
                0 => {}
                1 => group_avx2::<L, 1>(job, p, b, h, &w, &sc, i0 + i, rest),
                2 => group_avx2::<L, 2>(job, p, b, h, &w, &sc, i0 + i, rest),
                3 => group_avx2::<L, 3>(job, p, b, h, &w, &sc, i0 + i, rest),
                4 => group_avx2::<L, 4>(job, p, b, h, &w, &sc, i0 + i, rest),
                _ => unreachable!(),
            }
        }
    }
    for (row, acc) in rows.zip(acc.iter()) {
        let mut v = [0f32; TILE];
        _mm256_storeu_ps(v.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(v[8..].as_mut_ptr(), acc[1]);
        job.out.write(row, &v);
    }
}

/// Block `b`'s half `h`, unpacked into `w` and `sc`, against the `C` rows
/// from `i0` on, whose float sums are `acc`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn group_avx2<L: Layout, const C: usize>(
    job: &TileJob,
    p: *const u8,
    b: usize,
    h: usize,
    w: &[[__m256i; 8]; QK_K / QK],
    sc: &[[__m256i; 2]; QK_K / QK],
    i0: usize,
    acc: &mut [[__m256; 2]],
) {
    let k = job.acts.k();
    let xq = job.acts.qs().as_ptr().add(i0 * k);
    let mut idot = [_mm256_setzero_si256(); C];
    for j in 0..L::SUBS {
        let wj = w[j];
        for (c, idot) in idot.iter_mut().enumerate() {
            let x = xq.add(c * k + (b * L::SUBS + j) * QK).cast::<i32>();
            *idot = _mm256_add_epi32(*idot, idot_avx2::<L>(&wj, x, sc[j]));
        }
    }
    let de = block_scales_avx2::<L>(p, h);
    for (c, acc) in acc[..C].iter_mut().enumerate() {
        acc[h] = scale_block_avx2::<L>(job, p, de, b, h, i0 + c, idot[c], acc[h]);
    }
}

/// Rows `8h..8h + 8`'s block scales as f32: `d` for the quants and `e` for
/// the minima (or the offset's `-midpoint d`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_scales_avx2<L: Layout>(p: *const u8, h: usize) -> [__m256; 2] {
    let d = match L::SCALES {
        // Each exponent byte into an f32's exponent field.
        Scales::DirectExp => _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(p.add(8 * h).cast()),
        ))),
        _ => _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast())),
    };
    let e = match L::SCALES.symmetric() {
        true => _mm256_mul_ps(d, _mm256_set1_ps(-L::BITS.midpoint())),
        false => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * TILE + 16 * h).cast())),
    };
    [d, e]
}

/// `acc` plus activation row `row`'s block `b` for rows `8h..8h + 8`, from
/// its integer sum `idot` and the block scales `[d, e]`: `d (Σ dx)` (as in
/// `rows_avx512`) plus the minima's term.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_block_avx2<L: Layout>(
    job: &TileJob,
    p: *const u8,
    [d, e]: [__m256; 2],
    b: usize,
    h: usize,
    row: usize,
    idot: __m256i,
    acc: __m256,
) -> __m256 {
    let acts = job.acts;
    let k = acts.k();
    let sum = |s: __m256i, dx: f32| _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dx));
    if L::SCALES.is_super() {
        let xs = &*acts.supers().as_ptr().add(row * (k / QK_K) + b);
        let a = _mm256_fmadd_ps(d, sum(idot, xs.d), acc);
        _mm256_fmadd_ps(e, sum(mins_avx2::<L>(p, h, xs), xs.d), a)
    } else {
        let [dx, sx] = *acts.scales().as_ptr().add(row * (k / QK) + b);
        let a = _mm256_fmadd_ps(d, sum(idot, dx), acc);
        if L::BITS == Bits::Byte {
            // Signed quants (see `idot_avx2`): no minimum.
            a
        } else {
            _mm256_fmadd_ps(e, _mm256_set1_ps(sx), a)
        }
    }
}

/// Σ quants times activations of one sub-block for 8 rows of a nibble
/// layout, weighted by the i16 scales `sc` (per half of 16 inputs; ones for
/// the per-32 types).
/// vpmaddubsw pairs sum in i16, so as many groups are added in i16 as the
/// quants' range allows before `vpmaddwd` with the scales widens them.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn idot_avx2<L: Layout>(w: &[__m256i; 8], x: *const i32, sc: [__m256i; 2]) -> __m256i {
    let xb = |g: usize| _mm256_set1_epi32(x.add(g).read_unaligned());
    let mut s32 = _mm256_setzero_si256();
    // Each group adds up to 2 pairs of max * 127 per i16 lane; a chunk of
    // groups summed in i16 must not straddle a half with its own scale.
    // Constant trip counts, so the loops unroll and `w` stays in registers.
    let per_i16 = (i16::MAX as u32 / (2 * L::BITS.max() * 127)) as usize;
    // A power of two, so that chunks tile the 8 groups (MXFP4's quants
    // reach 24, which would allow 5).
    let chunk = 1 << per_i16.min(if L::HALVES { 4 } else { 8 }).ilog2();
    for c in 0..8 / chunk {
        let mut s16 = _mm256_setzero_si256();
        for (i, &w) in w[c * chunk..][..chunk].iter().enumerate() {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w, xb(c * chunk + i)));
        }
        s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, sc[c * chunk / 4]));
    }
    s32
}

/// Sub-block `j`'s integer scales of rows `8h..8h + 8`, each row's in both
/// i16 of its i32 lane (the `vpmaddwd` operand), per half of 16 inputs;
/// ones for the per-32 layouts.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn scales_avx2<L: Layout>(p: *const u8, j: usize, h: usize) -> [__m256i; 2] {
    let area = p.add(L::SCALES.header_bytes());
    match L::SCALES {
        Scales::Direct | Scales::DirectD | Scales::DirectExp => [_mm256_set1_epi16(1); 2],
        Scales::Super32 => {
            let v = _mm_loadl_epi64(area.add(j * TILE + 8 * h).cast());
            [_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v)); 2]
        }
        Scales::Super16 | Scales::Super16Offset => {
            // Row r's pair (first half, second half) as two i16 of lane r.
            let v = _mm256_cvtepi8_epi16(_mm_loadu_si128(area.add(j * 2 * TILE + 16 * h).cast()));
            let lo = _mm256_setr_epi8(
                0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, //
                0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
            );
            let hi = _mm256_add_epi8(lo, _mm256_set1_epi8(2));
            [_mm256_shuffle_epi8(v, lo), _mm256_shuffle_epi8(v, hi)]
        }
    }
}

/// Rows `8h..8h + 8`'s integer minima dotted with the activations' sums
/// over one super-block: `Σ mn Σx` per row, in pairs of `vpmaddwd`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mins_avx2<L: Layout>(p: *const u8, h: usize, xs: &SuperScales) -> __m256i {
    let mins = p.add(L::SCALES.mins_at());
    let sums = xs.sums_for(L::SCALES);
    let mut t = _mm256_setzero_si256();
    for i in 0..sums.len() / 2 {
        let mn = _mm256_cvtepi8_epi16(_mm_loadu_si128(mins.add(i * 2 * TILE + 16 * h).cast()));
        let x = _mm256_set1_epi32(SuperScales::pair(sums, i));
        t = _mm256_add_epi32(t, _mm256_madd_epi16(mn, x));
    }
    t
}

/// [`quants_avx512`] for rows `8h..8h + 8` (bytes `32h..32h + 32` of each
/// 64-byte chunk) of the nibble layouts ([`byte_rows_avx2`] reads bytes).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn quants_avx2<L: Layout>(p: *const u8, j: usize, h: usize) -> [__m256i; 8] {
    let q = p.add(L::SCALES.quants_at(L::BITS, j));
    let mut w = [_mm256_setzero_si256(); 8];
    let nibble = _mm256_set1_epi8(0x0F);
    for c in 0..4 {
        let v = _mm256_loadu_si256(q.add(64 * c + 32 * h).cast());
        w[c] = _mm256_and_si256(v, nibble);
        w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
    }
    if L::BITS == Bits::Lut {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1.as_ptr().cast()));
        w.iter_mut()
            .for_each(|w| *w = _mm256_shuffle_epi8(table, *w));
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
pub(crate) unsafe fn quantize_row_avx512(
    x: &[f32],
    qs: &mut [i8],
    bs: usize,
    mut emit: impl FnMut(usize, f32, &[i32; 16]),
) {
    for (b, (x, q)) in x.chunks_exact(bs).zip(qs.chunks_exact_mut(bs)).enumerate() {
        let mut mx = _mm512_setzero_ps();
        for v in x.chunks_exact(16) {
            mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(v.as_ptr())));
        }
        let d = _mm512_reduce_max_ps(mx) / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let mut sums = [0i32; 16];
        for ((x, q), s) in x
            .chunks_exact(QK)
            .zip(q.chunks_exact_mut(QK))
            .zip(sums.chunks_exact_mut(2))
        {
            // Default MXCSR rounding is to nearest even, as in the scalar code.
            let qa = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x.as_ptr()), id));
            let qb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(16)), id));
            _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128(q.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(qb));
            s[0] = _mm512_reduce_add_epi32(qa);
            s[1] = _mm512_reduce_add_epi32(qb);
        }
        emit(b, d, &sums);
    }
}

/// [`super::act::quantize_row`] with AVX2, bit-identical to it.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_row_avx2(
    x: &[f32],
    qs: &mut [i8],
    bs: usize,
    mut emit: impl FnMut(usize, f32, &[i32; 16]),
) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    for (b, (x, q)) in x.chunks_exact(bs).zip(qs.chunks_exact_mut(bs)).enumerate() {
        let mut mx = _mm256_setzero_ps();
        for v in x.chunks_exact(8) {
            mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(v.as_ptr()), abs_mask));
        }
        let mx = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
        let d = _mm_cvtss_f32(_mm_max_ss(mx, _mm_movehdup_ps(mx))) / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let mut sums = [0i32; 16];
        for ((x, q), s) in x
            .chunks_exact(QK)
            .zip(q.chunks_exact_mut(QK))
            .zip(sums.chunks_exact_mut(2))
        {
            let qi: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * i)), id))
            });
            // packs interleave 128-bit lanes; the dword permute restores order.
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(qi[0], qi[1]),
                _mm256_packs_epi32(qi[2], qi[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr().cast(), p);
            s[0] = hsum_epi32_avx2(_mm256_add_epi32(qi[0], qi[1]));
            s[1] = hsum_epi32_avx2(_mm256_add_epi32(qi[2], qi[3]));
        }
        emit(b, d, &sums);
    }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum_epi32_avx2(v: __m256i) -> i32 {
    let t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<1>(t)))
}
