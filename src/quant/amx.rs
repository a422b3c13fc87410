//! Intel AMX for the K-quants at prefill: 16x64-byte tile products
//! (`tdpbsud`/`tdpbssd`, 16 Ki multiply-adds each) in place of `vpdpbusd`.
//!
//! A K-quant's integer scales differ per 16 or 32 inputs, which an AMX
//! product cannot apply inside its sum. So each tile is first unpacked with
//! its scales folded in: `v = sc * q` (|v| < 2^15) split into bytes as
//! `v = 256 hi + lo`, `lo` unsigned and `hi` signed. Two products against the
//! same activations then give `Σ sc q x` over a whole 256-input block in
//! integers, exactly the sum the AVX-512 kernel forms, and the block ends in
//! the same float code ([`x86::super_term_avx512`]): results agree with it to
//! the bit. The unpack costs a pass over the tile per call, so only calls
//! with [`MIN_ROWS`] or more activation rows take this path, [`ROWS`] at a
//! time; fewer rows, the remainder, and the per-32 types run on AVX-512.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::act::AMX_GROUP;
use super::formats::{Layout, QK_K};
use super::{x86, OutTile, TileJob, QK, TILE};

/// Activation rows per pass: two A tiles.
const ROWS: usize = 2 * AMX_GROUP;
/// Rows from which a call takes this path: with fewer the tile's unpack
/// costs about what its products save (with 32, the server decoding 32
/// streams measured ~4% slower than on AVX-512 alone; with 128, as fast
/// or faster).
pub(crate) const MIN_ROWS: usize = 128;
/// Bytes of one unpacked plane (lo or hi) per 64 inputs: a B tile of 16
/// groups of 4 inputs by 16 rows.
const B_TILE: usize = 64 * TILE;
/// Inputs per tile product.
const K_STEP: usize = 64;

/// Linux's `arch_prctl` request for permission to use an extended state
/// component, and AMX's tile data component.
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// The CPU has AMX-INT8 and AVX-512 VNNI, the kernel lets this process use
/// the tile registers (a VM may report AMX that it does not enable: then the
/// request is refused and this path is never taken), and `WICK_AMX` is not
/// `0` (which keeps every call on AVX-512, e.g. to compare the two).
pub(crate) fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        if std::env::var_os("WICK_AMX").is_some_and(|v| v == "0") {
            return false;
        }
        // CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
        let edx = __cpuid_count(7, 0).edx;
        let amx = edx & (1 << 24) != 0 && edx & (1 << 25) != 0;
        // SAFETY: a plain system call with integer arguments.
        amx && x86::avx512_vnni_supported()
            && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                ) == 0
            }
    })
}

/// `ldtilecfg`'s operand: palette 1, tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// The four i32 result tiles of a pass, stored for the float epilogue:
/// (rows 0-15, lo), (rows 0-15, hi), (rows 16-31, lo), (rows 16-31, hi).
#[repr(C, align(64))]
struct Sums([[[i32; TILE]; 16]; 4]);

thread_local! {
    /// The unpacked tile, reused across calls on a thread.
    static PLANES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// [`supported`] must have returned true.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn tile<L: Layout>(job: &TileJob) {
    let full = if L::SCALES.is_super() && job.rows.len() >= MIN_ROWS {
        job.rows.len() / ROWS * ROWS
    } else {
        0
    };
    if full > 0 {
        PLANES.with(|planes| {
            let mut planes = planes.borrow_mut();
            unpack::<L>(job, &mut planes);
            asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
            for i0 in (job.rows.start..job.rows.start + full).step_by(ROWS) {
                rows::<L>(job, &planes, i0, i0 == job.rows.start);
            }
            // Back to the init state, so this thread's context switches do not
            // carry the 8 KiB of tile data.
            asm!("tilerelease", options(nostack, nomem));
        });
    }
    if full < job.rows.len() {
        let rest = TileJob {
            tile: job.tile,
            next: job.next,
            acts: job.acts,
            rows: job.rows.start + full..job.rows.end,
            out: OutTile { ..job.out },
        };
        x86::tile_avx512::<L>(&rest);
    }
}

/// Writes the tile as B tiles: per block and 64 inputs, the `lo` plane's
/// 1 KiB then the `hi` plane's, each 16 groups of 4 inputs (one
/// `quants_avx512` register, 16 rows x 4 bytes) in input order.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn unpack<L: Layout>(job: &TileJob, planes: &mut Vec<u8>) {
    debug_assert_eq!(L::SUBS * QK, QK_K);
    let blocks = job.tile.len() / L::BLOCK_BYTES;
    planes.resize(blocks * QK_K / K_STEP * 2 * B_TILE, 0);
    let (low, half) = (_mm512_set1_epi16(0x00FF), _mm512_set1_epi32(0xFFFF));
    for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
        let p = blk.as_ptr();
        for j in 0..L::SUBS {
            let w = x86::quants_avx512::<L>(p, j);
            let sc = x86::scales_avx512::<L>(p, j);
            let step = (b * QK_K + j * QK) / K_STEP;
            let dst = planes
                .as_mut_ptr()
                .add(step * 2 * B_TILE + (j % 2) * B_TILE / 2);
            for (g, &w) in w.iter().enumerate() {
                // A row's scale in both 16-bit halves of its lane; the scale
                // of inputs 16-31 is `sc[1]` (equal to `sc[0]` per 32).
                let s = sc[g / 4];
                let s = _mm512_or_si512(_mm512_and_si512(s, half), _mm512_slli_epi32::<16>(s));
                let even = _mm512_mullo_epi16(_mm512_and_si512(w, low), s);
                let odd = _mm512_mullo_epi16(_mm512_srli_epi16::<8>(w), s);
                let lo = _mm512_or_si512(_mm512_and_si512(even, low), _mm512_slli_epi16::<8>(odd));
                let hi =
                    _mm512_or_si512(_mm512_srli_epi16::<8>(even), _mm512_andnot_si512(low, odd));
                _mm512_storeu_si512(dst.add(64 * g).cast(), lo);
                _mm512_storeu_si512(dst.add(B_TILE + 64 * g).cast(), hi);
            }
        }
    }
}

/// Activation rows `i0..i0 + ROWS` against the unpacked tile, with the
/// tiles configured as [`CONFIG`]; the first pass also prefetches the next
/// weight tile a block at a time, spread over its products as the AVX-512
/// kernel does (rather than all at once during the short unpack).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows<L: Layout>(job: &TileJob, planes: &[u8], i0: usize, prefetch: bool) {
    let acts = job.acts;
    let k = acts.k();
    assert!(i0.is_multiple_of(AMX_GROUP) && i0 + ROWS <= acts.m());
    assert!(planes.len() >= k / K_STEP * 2 * B_TILE);
    let supers = acts.supers().as_ptr();
    let mut acc = [_mm512_setzero_ps(); ROWS];
    let mut sums = std::mem::MaybeUninit::<Sums>::uninit();
    for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
        if prefetch {
            x86::prefetch_block::<L>(job.next, b);
        }
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for step in b * QK_K / K_STEP..(b + 1) * QK_K / K_STEP {
            let g = i0 / AMX_GROUP;
            let (a, a16) = (acts.tile(g, step).as_ptr(), acts.tile(g + 1, step).as_ptr());
            let lo = planes.as_ptr().add(step * 2 * B_TILE);
            // tmm4/5: activation rows 0-15 and 16-31 (signed); tmm6/7: the
            // lo (unsigned) and hi (signed) planes.
            asm!(
                "tileloadd tmm4, [{a} + {ld} * 1]",
                "tileloadd tmm5, [{a16} + {ld} * 1]",
                "tileloadd tmm6, [{lo} + {ld} * 1]",
                "tileloadd tmm7, [{hi} + {ld} * 1]",
                "tdpbsud tmm0, tmm4, tmm6",
                "tdpbssd tmm1, tmm4, tmm7",
                "tdpbsud tmm2, tmm5, tmm6",
                "tdpbssd tmm3, tmm5, tmm7",
                a = in(reg) a,
                a16 = in(reg) a16,
                lo = in(reg) lo,
                hi = in(reg) lo.add(B_TILE),
                ld = in(reg) 64usize,
                options(nostack, readonly)
            );
        }
        asm!(
            "tilestored [{s} + {ld} * 1], tmm0",
            "tilestored [{s} + {ld} * 1 + 1024], tmm1",
            "tilestored [{s} + {ld} * 1 + 2048], tmm2",
            "tilestored [{s} + {ld} * 1 + 3072], tmm3",
            s = in(reg) sums.as_mut_ptr(),
            ld = in(reg) 64usize,
            options(nostack)
        );
        // SAFETY: the four tile stores above wrote all of it.
        let sums = sums.assume_init_ref();
        let p = blk.as_ptr();
        let (de, mn) = (x86::block_scales_avx512::<L>(p), x86::mins_avx512::<L>(p));
        for (r, acc) in acc.iter_mut().enumerate() {
            let (half, row) = (r / 16, r % 16);
            let lo = _mm512_loadu_si512(sums.0[2 * half][row].as_ptr().cast());
            let hi = _mm512_loadu_si512(sums.0[2 * half + 1][row].as_ptr().cast());
            let idot = _mm512_add_epi32(lo, _mm512_slli_epi32::<8>(hi));
            let xs = &*supers.add((i0 + r) * (k / QK_K) + b);
            *acc = x86::super_term_avx512::<L>(de, &mn, xs, idot, *acc);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let mut v = [0f32; TILE];
        _mm512_storeu_ps(v.as_mut_ptr(), *acc);
        job.out.write(i0 + r, &v);
    }
}
