//! Intel AMX's bf16 tile product (`tdpbf16ps`): sixteen rows of 32 bf16
//! inputs times 32 inputs of sixteen columns, summed into sixteen by
//! sixteen f32, in one instruction. Rust has no stable AMX intrinsics, so
//! the few instructions are inline assembly.
//!
//! Linux hands a process AMX's tile state only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); until then a tile
//! instruction faults. [`supported`] makes that request once, for the whole
//! process and every thread in it.

use std::arch::asm;
use std::sync::OnceLock;

/// Rows of a tile (of A and C; pairs of inputs in B).
pub(crate) const TILE_ROWS: usize = 16;
/// bf16 inputs along a tile's row of A (64 bytes).
pub(crate) const TILE_K: usize = 32;

/// Whether this CPU has AMX tiles with bf16 products and the kernel lets
/// this process use them.
pub(crate) fn supported() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        if std::arch::x86_64::__cpuid(0).eax < 7 {
            return false;
        }
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        if leaf7.edx & (1 << 22) == 0 || leaf7.edx & (1 << 24) == 0 {
            return false;
        }
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments; it fails
        // (non-zero) where the kernel or a hypervisor withholds the state.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    })
}

/// `ldtilecfg`'s 64-byte operand.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn sixteen_by_sixty_four() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            // Bytes per row (u16 little-endian at 16 + 2t), rows at 48 + t.
            c[16 + 2 * t] = 64;
            c[48 + t] = TILE_ROWS as u8;
        }
        TileConfig(c)
    }
}

/// Loads the tile configuration every product here uses: palette 1, eight
/// tiles of 16 rows by 64 bytes (C: 16 x 16 f32; A: 16 x 32 bf16; B: 16
/// pairs of inputs x 16 columns).
///
/// # Safety
/// [`supported`] must have returned true. The thread must call [`release`]
/// before it runs anything else that may configure tiles.
pub(crate) unsafe fn configure() {
    let config = TileConfig::sixteen_by_sixty_four();
    // SAFETY: reads the 64-byte configuration; the caller has the state.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
}

/// Gives the tile state back (cheaper context switches from here on).
///
/// # Safety
/// [`supported`] must have returned true.
pub(crate) unsafe fn release() {
    // SAFETY: tilerelease touches only the tile registers.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// A 32 x 32 block of `C = A Bᵀ` with f32 sums over `kb` steps of
/// [`TILE_K`] inputs, written (not added) to `c`.
///
/// Launch shape: C's four tiles (tmm0-3, two rows of tiles by two columns)
/// stay in the tile registers for the whole sum; each step loads the two
/// A tiles (tmm4-5, rows `0..16` and `16..32`) and the two B tiles (tmm6-7,
/// the two column tiles) and issues four products, so each loaded tile
/// serves two.
///
/// # Safety
/// [`configure`] ran on this thread since its last [`release`]. `a` points
/// at 32 rows of at least `kb * TILE_K` bf16, `a_stride` bytes apart. `b0`
/// and `b1` each point at `kb` consecutive B tiles of 1 KiB (16 input pairs
/// x 16 columns x 2 bf16). `c` points at 32 rows of at least 32 f32,
/// `c_stride` bytes apart, all writable.
pub(crate) unsafe fn block_32x32(
    a: *const u16,
    a_stride: usize,
    b0: *const u16,
    b1: *const u16,
    kb: usize,
    c: *mut f32,
    c_stride: usize,
) {
    // SAFETY (each block below): the caller's contract covers every address
    // a tile load or store reaches: 16 rows from its base, 64 bytes each,
    // at its stride. The tile registers are not the compiler's, so nothing
    // else holds them between these statements.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let a_lower = a.byte_add(TILE_ROWS * a_stride);
        for p in 0..kb {
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a.add(p * TILE_K),
                a1 = in(reg) a_lower.add(p * TILE_K),
                b0 = in(reg) b0.add(p * TILE_ROWS * TILE_K),
                b1 = in(reg) b1.add(p * TILE_ROWS * TILE_K),
                sa = in(reg) a_stride,
                sb = in(reg) 64usize,
                options(nostack, readonly)
            );
        }
        let c_lower = c.byte_add(TILE_ROWS * c_stride);
        asm!(
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c1} + {sc}*1], tmm1",
            "tilestored [{c2} + {sc}*1], tmm2",
            "tilestored [{c3} + {sc}*1], tmm3",
            c0 = in(reg) c,
            c1 = in(reg) c.add(TILE_ROWS),
            c2 = in(reg) c_lower,
            c3 = in(reg) c_lower.add(TILE_ROWS),
            sc = in(reg) c_stride,
            options(nostack)
        );
    }
}

/// [`block_32x32`] for a single column tile: a 32 x 16 block from `b0`
/// (tmm0 and tmm2 the two rows of C's tiles; tmm4-5 A, tmm6 B).
///
/// # Safety
/// As [`block_32x32`], without `b1`, and `c`'s rows need 16 f32.
pub(crate) unsafe fn block_32x16(
    a: *const u16,
    a_stride: usize,
    b0: *const u16,
    kb: usize,
    c: *mut f32,
    c_stride: usize,
) {
    // SAFETY: as in `block_32x32`.
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm2", options(nostack, nomem));
        let a_lower = a.byte_add(TILE_ROWS * a_stride);
        for p in 0..kb {
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm2, tmm5, tmm6",
                a0 = in(reg) a.add(p * TILE_K),
                a1 = in(reg) a_lower.add(p * TILE_K),
                b0 = in(reg) b0.add(p * TILE_ROWS * TILE_K),
                sa = in(reg) a_stride,
                sb = in(reg) 64usize,
                options(nostack, readonly)
            );
        }
        asm!(
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c2} + {sc}*1], tmm2",
            c0 = in(reg) c,
            c2 = in(reg) c.byte_add(TILE_ROWS * c_stride),
            sc = in(reg) c_stride,
            options(nostack)
        );
    }
}
