//! The GGUF block types wick's kernels multiply, and how each is held.
//!
//! Every type dequantizes as an affine map of small unsigned integers: per
//! group of 32 (or 16) inputs, `value = s * q + m`. At load each GGML block
//! is decoded into those integers and rewritten, exactly, in one of a few
//! tile layouts (16 output rows interleaved, see [`Layout`]); the kernels
//! then only differ in how they widen quants and form `s` and `m`:
//!
//! | type | quants | scales |
//! | --- | --- | --- |
//! | Q4_0, Q5_0 | 4 / 5 bits | `d` per 32, `m = -8d` / `-16d` |
//! | Q4_1, Q5_1 | 4 / 5 bits | `d`, `m` per 32 |
//! | Q8_0 | 8 bits, stored `+128` | `d` per 32, `m = -128d` |
//! | MXFP4 (as Q8_0 of its values) | 4-bit index `i`, `q = E2M1[i]` | `d = 2^x` per 32 as byte `x + 127`, `m = -12d` |
//! | Q4_K, Q5_K | 4 / 5 bits | per 256: `d`, `e`; per 32: 6-bit `sc`, `mn`: `s = d sc`, `m = e mn` |
//! | Q6_K | 6 bits | per 256: `d`, `e = -32d`; per 16: `sc`: `s = d sc`, `m = e sc` |
//! | Q3_K | 3 bits (as 4) | per 256: `d`, `e = -4d`; per 16: signed 6-bit `sc` |
//! | Q2_K | 2 bits (as 4) | per 256: `d`, `e = -dmin`; per 16: 4-bit `sc`, `mn` |
//!
//! Scales stay in the file's f16 and small integers (`e` is `-dmin` or a
//! power-of-two multiple of `d`, exact in f16), so a tile costs about the
//! file's bytes: the kernels stay bound by memory bandwidth as they are on
//! the file itself. Q2_K and Q3_K quants are widened to 4 bits. MXFP4's
//! values are not evenly spaced: its 4-bit codes are kept, and the kernels
//! look each up ([`E2M1`]) as they widen it; its power-of-two scale stays
//! one exponent byte, as in the file (4.25 bits a weight).

use candle_core::quantized::GgmlDType;
use half::f16;
use rayon::prelude::*;

use super::{QK, TILE};

/// Largest GGML block: 256 inputs (the K-quants).
pub(crate) const QK_K: usize = 256;

/// How a tile stores its quants, per 32 inputs of 16 rows. Inputs
/// `4g..4g + 4` of every row form group `g` (0..8), 64 bytes: row `r`'s
/// four at bytes `4r..4r + 4`, as one `vpdpbusd` operand wants them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bits {
    /// A 4-bit plane, 256 bytes: chunk `c` (64 bytes) holds groups `c`
    /// (low nibbles) and `c + 4` (high nibbles).
    Nib,
    /// The 4-bit plane, then the quants' bit 4 in one 64-byte chunk laid
    /// out like the nibbles': byte `4r + i` holds group `g`'s at bit `g`.
    Nib5,
    /// The 4-bit plane, then bits 4..6 in two such chunks: chunk `k` holds
    /// group `4k + t`'s at bits `2t..2t + 2`. Each group's high bits are
    /// then one shift and mask away, as its nibbles are.
    Nib6,
    /// Bytes (`q + 128`), 512: group `g` at `64g`.
    Byte,
    /// [`Bits::Nib`]'s plane of MXFP4 codes, each standing for quant
    /// `E2M1[code]` (0..=24).
    Lut,
}

/// MXFP4's E2M1 values by code (bit 3 the sign), doubled to integers and
/// offset by 12: 0..=24, the quants of [`Bits::Lut`].
pub(crate) const E2M1: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

impl Bits {
    pub(crate) const fn bytes(self) -> usize {
        match self {
            Bits::Nib | Bits::Lut => 256,
            Bits::Nib5 => 256 + 64,
            Bits::Nib6 => 256 + 128,
            Bits::Byte => 512,
        }
    }

    /// The quants' midpoint, which symmetric types (Q4_0, Q5_0, Q8_0,
    /// MXFP4) subtract: their minimum is `-midpoint * d`.
    pub(crate) const fn midpoint(self) -> f32 {
        match self {
            Bits::Lut => 12.0,
            _ => (self.max() + 1) as f32 / 2.0,
        }
    }

    /// Bits of each quant above its nibble.
    pub(crate) const fn high_bits(self) -> u32 {
        match self {
            Bits::Nib5 => 1,
            Bits::Nib6 => 2,
            Bits::Nib | Bits::Byte | Bits::Lut => 0,
        }
    }

    /// The bits a quant's high bits take above its nibble.
    pub(crate) const fn high_mask(self) -> u8 {
        ((1 << self.high_bits()) - 1) << 4
    }

    /// Where group `g`'s high bits sit: their chunk's offset in the
    /// sub-block's quants and their lowest bit in each of its bytes.
    pub(crate) const fn high_at(self, g: usize) -> (usize, u32) {
        let per_byte = 8 / self.high_bits() as usize;
        (
            256 + 64 * (g / per_byte),
            self.high_bits() * (g % per_byte) as u32,
        )
    }

    /// Largest quant.
    pub(crate) const fn max(self) -> u32 {
        match self {
            Bits::Nib => 15,
            Bits::Nib5 => 31,
            Bits::Nib6 => 63,
            Bits::Byte => 255,
            Bits::Lut => 24,
        }
    }
}

/// How a tile stores its scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scales {
    /// Per 32 inputs: `d[16]`, `m[16]` f16 (64 bytes).
    Direct,
    /// Per 32 inputs: `d[16]` f16; `m = -midpoint * d` (symmetric types).
    DirectD,
    /// [`Scales::DirectD`] whose `d` are powers of two (or 0), each held as
    /// its f32 exponent byte (MXFP4's E8M0 scale): `d = f32::from_bits(x << 23)`.
    DirectExp,
    /// Per 256 inputs: `d[16]`, `e[16]` f16; per 32, 6-bit `sc` and `mn`:
    /// `sc` of sub-block `j` at `16j + r`, then `mn` in pairs of
    /// sub-blocks, `(mn[2p], mn[2p+1])` at `128 + 32p + 2r`, as one
    /// `vpmaddwd` operand wants them against activation sums.
    Super32,
    /// Per 256 inputs: `d[16]`, `e[16]` f16; per 16, `sc` and `mn`, each as
    /// sub-block `j`'s pair of halves at `32j + 2r` (`mn` 256 bytes on).
    Super16,
    /// [`Scales::Super16`] whose minima are the scales themselves
    /// (`m = e sc`, the types with an offset: Q6_K, Q3_K), stored once.
    Super16Offset,
}

impl Scales {
    pub(crate) const fn header_bytes(self) -> usize {
        match self {
            Scales::DirectExp => TILE,
            Scales::DirectD => 2 * TILE,
            _ => 4 * TILE,
        }
    }

    /// Whether the minimum is `-midpoint * d`, not stored.
    pub(crate) const fn symmetric(self) -> bool {
        matches!(self, Scales::DirectD | Scales::DirectExp)
    }

    /// Bytes of per-sub-block scales of a block (after the header).
    pub(crate) const fn bytes(self) -> usize {
        match self {
            Scales::Direct | Scales::DirectD | Scales::DirectExp => 0,
            Scales::Super32 | Scales::Super16Offset => 16 * TILE,
            Scales::Super16 => 32 * TILE,
        }
    }

    /// Offset of the minima in a block.
    pub(crate) const fn mins_at(self) -> usize {
        self.header_bytes()
            + match self {
                Scales::Super32 => 8 * TILE,
                Scales::Super16 => 16 * TILE,
                _ => 0,
            }
    }

    /// One block spans 256 inputs, with integer scales per sub-block.
    pub(crate) const fn is_super(self) -> bool {
        !matches!(self, Scales::Direct | Scales::DirectD | Scales::DirectExp)
    }

    /// 32-input sub-blocks per block.
    pub(crate) const fn subs(self) -> usize {
        if self.is_super() {
            QK_K / QK
        } else {
            1
        }
    }

    /// Offset of sub-block `j`'s quants in a block.
    pub(crate) const fn quants_at(self, bits: Bits, j: usize) -> usize {
        self.header_bytes() + self.bytes() + j * bits.bytes()
    }
}

/// A tile layout: one block is 16 rows by `SUBS * 32` inputs, stored as the
/// header, the sub-blocks' scales, then each sub-block's quants.
pub(crate) trait Layout {
    const BITS: Bits;
    const SCALES: Scales;
    const SUBS: usize = Self::SCALES.subs();
    /// Scales per 16 inputs (each sub-block's two halves scale apart).
    const HALVES: bool = matches!(Self::SCALES, Scales::Super16 | Scales::Super16Offset);
    const BLOCK_BYTES: usize = Self::SCALES.quants_at(Self::BITS, Self::SUBS);
}

macro_rules! layout {
    ($name:ident, $bits:ident, $scales:ident) => {
        pub(crate) struct $name;
        impl Layout for $name {
            const BITS: Bits = Bits::$bits;
            const SCALES: Scales = Scales::$scales;
        }
    };
}

layout!(NibDirect, Nib, Direct);
layout!(NibDirectD, Nib, DirectD);
layout!(LutDirectExp, Lut, DirectExp);
layout!(Nib5Direct, Nib5, Direct);
layout!(Nib5DirectD, Nib5, DirectD);
layout!(ByteDirect, Byte, DirectD);
layout!(NibSuper32, Nib, Super32);
layout!(Nib5Super32, Nib5, Super32);
layout!(Nib6Super16Offset, Nib6, Super16Offset);
layout!(NibSuper16, Nib, Super16);
layout!(NibSuper16Offset, Nib, Super16Offset);

/// The GGUF types with kernels, each decoded into one layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    /// Q8_0 blocks whose quants are all doubled E2M1 values and whose
    /// scales are powers of two: MXFP4 as wick reads it ([`super::mxfp4`]),
    /// held as its 4-bit codes and exponent bytes, 4.25 bits a weight
    /// instead of 8.5.
    Mxfp4,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

/// Where a layout's pieces sit, for code that is not generic over it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub bits: Bits,
    pub scales: Scales,
    pub subs: usize,
    pub block_bytes: usize,
}

impl Geometry {
    pub(crate) fn of<L: Layout>() -> Self {
        Geometry {
            bits: L::BITS,
            scales: L::SCALES,
            subs: L::SUBS,
            block_bytes: L::BLOCK_BYTES,
        }
    }
}

impl Format {
    /// Q8_0 blocks `raw` as [`Format::Mxfp4`] where every block is an
    /// MXFP4 one; any other format as it is.
    pub(crate) fn narrowest(self, raw: &[u8]) -> Format {
        let mxfp4 = self == Format::Q8_0
            && raw.par_chunks(34).all(|b| {
                exponent(f16::from_le_bytes([b[0], b[1]])).is_some()
                    && b[2..].iter().all(|&q| e2m1_code(q as i8).is_some())
            });
        match mxfp4 {
            true => Format::Mxfp4,
            false => self,
        }
    }

    pub(crate) fn of(dtype: GgmlDType) -> Option<Format> {
        Some(match dtype {
            GgmlDType::Q4_0 => Format::Q4_0,
            GgmlDType::Q4_1 => Format::Q4_1,
            GgmlDType::Q5_0 => Format::Q5_0,
            GgmlDType::Q5_1 => Format::Q5_1,
            GgmlDType::Q8_0 => Format::Q8_0,
            GgmlDType::Q2K => Format::Q2K,
            GgmlDType::Q3K => Format::Q3K,
            GgmlDType::Q4K => Format::Q4K,
            GgmlDType::Q5K => Format::Q5K,
            GgmlDType::Q6K => Format::Q6K,
            _ => return None,
        })
    }

    pub(crate) fn geometry(self) -> Geometry {
        match self {
            Format::Q4_0 => Geometry::of::<NibDirectD>(),
            Format::Q4_1 => Geometry::of::<NibDirect>(),
            Format::Q5_0 => Geometry::of::<Nib5DirectD>(),
            Format::Q5_1 => Geometry::of::<Nib5Direct>(),
            Format::Q8_0 => Geometry::of::<ByteDirect>(),
            Format::Mxfp4 => Geometry::of::<LutDirectExp>(),
            Format::Q4K => Geometry::of::<NibSuper32>(),
            Format::Q5K => Geometry::of::<Nib5Super32>(),
            Format::Q6K => Geometry::of::<Nib6Super16Offset>(),
            Format::Q2K => Geometry::of::<NibSuper16>(),
            Format::Q3K => Geometry::of::<NibSuper16Offset>(),
        }
    }

    /// Inputs per GGML block.
    pub(crate) fn block_inputs(self) -> usize {
        match self {
            Format::Q4_0
            | Format::Q4_1
            | Format::Q5_0
            | Format::Q5_1
            | Format::Q8_0
            | Format::Mxfp4 => QK,
            _ => QK_K,
        }
    }

    /// Bytes per GGML block.
    pub(crate) fn ggml_block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q8_0 | Format::Mxfp4 => 34,
            Format::Q2K => 84,
            Format::Q3K => 110,
            Format::Q4K => 144,
            Format::Q5K => 176,
            Format::Q6K => 210,
        }
    }

    /// What each quant loses before scaling in GGML's own dequantization
    /// (`s * (q - offset)`); types with a free minimum have none.
    pub(crate) fn offset(self) -> Option<f32> {
        match self {
            Format::Q6K => Some(32.0),
            Format::Q3K => Some(4.0),
            _ => None,
        }
    }

    /// Decodes one GGML block. `None` when a derived f16 (Q6_K's `e = -32d`)
    /// would overflow: then the tensor is left to candle.
    pub(crate) fn decode(self, raw: &[u8]) -> Option<Decoded> {
        let mut out = Decoded::default();
        let f = |at: usize| f16::from_le_bytes([raw[at], raw[at + 1]]);
        match self {
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
                let (has_m, has_qh) = (
                    matches!(self, Format::Q4_1 | Format::Q5_1),
                    matches!(self, Format::Q5_0 | Format::Q5_1),
                );
                let qs_at = 2 + 2 * has_m as usize + 4 * has_qh as usize;
                let qh = if has_qh {
                    let at = qs_at - 4;
                    u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]])
                } else {
                    0
                };
                for j in 0..QK / 2 {
                    let b = raw[qs_at + j];
                    out.q[j] = (b & 0x0F) | (((qh >> j) & 1) << 4) as u8;
                    out.q[j + QK / 2] = (b >> 4) | (((qh >> (j + QK / 2)) & 1) << 4) as u8;
                }
                out.d = f(0);
                if has_m {
                    out.e = f(2);
                }
            }
            Format::Q8_0 => {
                out.d = f(0);
                for (q, &b) in out.q.iter_mut().zip(&raw[2..2 + QK]) {
                    *q = b ^ 0x80;
                }
            }
            Format::Mxfp4 => {
                out.d = f(0);
                for (q, &b) in out.q.iter_mut().zip(&raw[2..2 + QK]) {
                    *q = e2m1_code(b as i8)?;
                }
            }
            Format::Q4K | Format::Q5K => {
                out.d = f(0);
                out.e = -f(2);
                let scales = &raw[4..16];
                for j in 0..QK_K / QK {
                    let (sc, mn) = scale_min_k4(j, scales);
                    out.sc[2 * j] = sc as i8;
                    out.mn[2 * j] = mn as i8;
                }
                let (qh, qs) = match self {
                    Format::Q5K => (Some(&raw[16..48]), &raw[48..176]),
                    _ => (None, &raw[16..144]),
                };
                // 64 inputs per 32 bytes: low nibbles, then high nibbles.
                for c in 0..QK_K / 64 {
                    for l in 0..32 {
                        let b = qs[32 * c + l];
                        let (h0, h1) = qh.map_or((0, 0), |qh| {
                            ((qh[l] >> (2 * c)) & 1, (qh[l] >> (2 * c + 1)) & 1)
                        });
                        out.q[64 * c + l] = (b & 0x0F) | (h0 << 4);
                        out.q[64 * c + 32 + l] = (b >> 4) | (h1 << 4);
                    }
                }
            }
            Format::Q6K => {
                let (ql, qh, sc) = (&raw[..128], &raw[128..192], &raw[192..208]);
                out.d = f(208);
                out.e = exact_multiple(out.d, -32.0)?;
                for (h, &s) in sc.iter().enumerate() {
                    out.sc[h] = s as i8;
                    out.mn[h] = s as i8;
                }
                // 128 inputs per 64 low-nibble bytes and 32 high-bit bytes.
                for half in 0..2 {
                    let (ql, qh, q) =
                        (&ql[64 * half..], &qh[32 * half..], &mut out.q[128 * half..]);
                    for l in 0..32 {
                        q[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                        q[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                        q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    }
                }
            }
            Format::Q3K => {
                let (hmask, qs, scales) = (&raw[..32], &raw[32..96], &raw[96..108]);
                out.d = f(108);
                out.e = exact_multiple(out.d, -4.0)?;
                for h in 0..QK_K / 16 {
                    let low = if h < 8 {
                        scales[h] & 0x0F
                    } else {
                        scales[h - 8] >> 4
                    };
                    let high = (scales[8 + h % 4] >> (2 * (h / 4))) & 3;
                    let s = (low | (high << 4)) as i8 - 32;
                    out.sc[h] = s;
                    out.mn[h] = s;
                }
                // Per 128 inputs: 32 bytes of 2-bit quants at shifts 0, 2,
                // 4, 6; hmask bit set means the 4 is not subtracted.
                for (i, q) in out.q.iter_mut().enumerate() {
                    let (chunk, rest) = (i / 128, i % 128);
                    let (shift, l) = (rest / 32, rest % 32);
                    let low = (qs[32 * chunk + l] >> (2 * shift)) & 3;
                    let high = (hmask[l] >> (4 * chunk + shift)) & 1;
                    *q = low | (high << 2);
                }
            }
            Format::Q2K => {
                let (scales, qs) = (&raw[..16], &raw[16..80]);
                out.d = f(80);
                out.e = -f(82);
                for (h, &s) in scales.iter().enumerate() {
                    out.sc[h] = (s & 0x0F) as i8;
                    out.mn[h] = (s >> 4) as i8;
                }
                for (i, q) in out.q.iter_mut().enumerate() {
                    let (chunk, rest) = (i / 128, i % 128);
                    let (shift, l) = (rest / 32, rest % 32);
                    *q = (qs[32 * chunk + l] >> (2 * shift)) & 3;
                }
            }
        }
        Some(out)
    }
}

/// The MXFP4 code of doubled E2M1 value `q` (+0's, for 0): a table, as a
/// load checks every quant of every Q8_0 matrix's first blocks (and of an
/// MXFP4 matrix, all of them).
fn e2m1_code(q: i8) -> Option<u8> {
    const CODES: [u8; 256] = {
        let mut t = [u8::MAX; 256];
        let mut c = 16;
        while c > 0 {
            c -= 1;
            // Downwards, so +0 (code 0) wins over -0 (code 8).
            t[(E2M1[c] as i8 - 12) as u8 as usize] = c as u8;
        }
        t
    };
    Some(CODES[q as u8 as usize]).filter(|&c| c != u8::MAX)
}

/// The f32 exponent byte of `d`, a power of two or +0 (which is byte 0).
fn exponent(d: f16) -> Option<u8> {
    let bits = d.to_f32().to_bits();
    (bits & 0x807F_FFFF == 0).then_some((bits >> 23) as u8)
}

/// The scale [`Scales::DirectExp`] holds as exponent byte `x`.
pub(crate) fn exp_scale(x: u8) -> f32 {
    f32::from_bits((x as u32) << 23)
}

/// `d * k` when f16 holds it exactly (`k` a power of two, no overflow).
fn exact_multiple(d: f16, k: f32) -> Option<f16> {
    let m = f16::from_f32(d.to_f32() * k);
    (m.is_finite() || !d.is_finite()).then_some(m)
}

/// The 6-bit scale and minimum of sub-block `j` in Q4_K/Q5_K's 12 packed
/// bytes: the first four pairs sit in the low 6 bits of bytes `j` and
/// `j + 4`; the last four take 4 bits from byte `j + 4` and their top two
/// from the spare bits of bytes `j - 4` and `j`.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// One GGML block of one row as integers: `q` per input, and the scales.
/// Direct layouts use `d` and `e` (as `m`) of the one sub-block; Super
/// layouts use `d`, `e` and per 16 inputs `sc[h]`, `mn[h]` (Super32 reads
/// the even halves).
pub(crate) struct Decoded {
    pub q: [u8; QK_K],
    pub d: f16,
    pub e: f16,
    pub sc: [i8; QK_K / 16],
    pub mn: [i8; QK_K / 16],
}

impl Default for Decoded {
    fn default() -> Self {
        Decoded {
            q: [0; QK_K],
            d: f16::ZERO,
            e: f16::ZERO,
            sc: [0; QK_K / 16],
            mn: [0; QK_K / 16],
        }
    }
}

impl Geometry {
    /// Writes row `r` of one decoded GGML block into its tile-block.
    pub(crate) fn encode(&self, dec: &Decoded, r: usize, dst: &mut [u8]) {
        match self.scales {
            // Format::narrowest saw every scale a power of two.
            Scales::DirectExp => dst[r] = exponent(dec.d).unwrap_or_default(),
            _ => dst[2 * r..2 * r + 2].copy_from_slice(&dec.d.to_le_bytes()),
        }
        if !self.scales.symmetric() {
            dst[2 * (TILE + r)..2 * (TILE + r) + 2].copy_from_slice(&dec.e.to_le_bytes());
        }
        if self.scales.is_super() {
            let halves = if self.scales == Scales::Super32 { 1 } else { 2 };
            for j in 0..self.subs {
                for h in 0..halves {
                    let (sc, mn) = self.scale_offsets(j, h, r);
                    dst[sc] = dec.sc[2 * j + h] as u8;
                    dst[mn] = dec.mn[2 * j + h] as u8;
                }
            }
        }
        for j in 0..self.subs {
            let at = self.scales.quants_at(self.bits, j);
            encode_quants(self.bits, &dec.q[QK * j..QK * (j + 1)], r, &mut dst[at..]);
        }
    }

    /// Row `r`'s `d` and `e` and, for a super layout, its integer scale and
    /// minimum per 16 inputs (equal in pairs when the layout scales per 32).
    pub(crate) fn super_row(&self, blk: &[u8], r: usize) -> SuperRow {
        let f = |at: usize| f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
        let d = match self.scales {
            Scales::DirectExp => exp_scale(blk[r]),
            _ => f(2 * r),
        };
        let e = match self.scales.symmetric() {
            true => -self.bits.midpoint() * d,
            false => f(2 * (TILE + r)),
        };
        let mut row = SuperRow {
            d,
            e,
            sc: [0; QK_K / 16],
            mn: [0; QK_K / 16],
        };
        if self.scales.is_super() {
            for h in 0..QK_K / 16 {
                let (sc, mn) = self.scale_offsets(h / 2, h % 2, r);
                (row.sc[h], row.mn[h]) = (blk[sc] as i8, blk[mn] as i8);
            }
        }
        row
    }

    /// Where row `r`'s scale and minimum of half `h` of sub-block `j` sit in
    /// a block of a super layout (one pair for both halves of Super32).
    fn scale_offsets(&self, j: usize, h: usize, r: usize) -> (usize, usize) {
        let (scales, mins) = (self.scales.header_bytes(), self.scales.mins_at());
        match self.scales {
            Scales::Super32 => (
                scales + j * TILE + r,
                mins + (j / 2) * 2 * TILE + 2 * r + j % 2,
            ),
            _ => {
                let at = j * 2 * TILE + 2 * r + h;
                (scales + at, mins + at)
            }
        }
    }

    /// Row `r`'s quants of sub-block `j` of a tile-block.
    pub(crate) fn quants_row(&self, blk: &[u8], j: usize, r: usize) -> [u8; QK] {
        decode_quants(self.bits, &blk[self.scales.quants_at(self.bits, j)..], r)
    }

    /// Row `r`'s quants of sub-block `j` of a tile-block, and per input its
    /// scale and minimum: the scalar reading of the layout (the portable
    /// kernel and dequantization use it).
    pub(crate) fn decode_row(&self, blk: &[u8], j: usize, r: usize) -> RowSub {
        let row = self.super_row(blk, r);
        let (s, m) = if self.scales.is_super() {
            let at = |v: &[i8; QK_K / 16], h: usize| v[2 * j + h] as f32;
            (
                [row.d * at(&row.sc, 0), row.d * at(&row.sc, 1)],
                [row.e * at(&row.mn, 0), row.e * at(&row.mn, 1)],
            )
        } else {
            ([row.d; 2], [row.e; 2])
        };
        RowSub {
            q: self.quants_row(blk, j, r),
            s,
            m,
        }
    }
}

/// One row's `d`, `e` and per-16 integer scales and minima of a block.
pub(crate) struct SuperRow {
    pub d: f32,
    pub e: f32,
    pub sc: [i8; QK_K / 16],
    pub mn: [i8; QK_K / 16],
}

/// One row's 32 quants of a sub-block, with the scale and minimum of each
/// half (equal when the layout scales per 32).
pub(crate) struct RowSub {
    pub q: [u8; QK],
    pub s: [f32; 2],
    pub m: [f32; 2],
}

fn encode_quants(bits: Bits, q: &[u8], r: usize, dst: &mut [u8]) {
    if bits == Bits::Byte {
        for g in 0..8 {
            dst[64 * g + 4 * r..][..4].copy_from_slice(&q[4 * g..4 * g + 4]);
        }
        return;
    }
    for c in 0..4 {
        for i in 0..4 {
            let (lo, hi) = (q[4 * c + i], q[16 + 4 * c + i]);
            dst[64 * c + 4 * r + i] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        }
    }
    if bits.high_bits() > 0 {
        for g in 0..8 {
            let (at, shift) = bits.high_at(g);
            for i in 0..4 {
                dst[at + 4 * r + i] |= (q[4 * g + i] >> 4) << shift;
            }
        }
    }
}

fn decode_quants(bits: Bits, src: &[u8], r: usize) -> [u8; QK] {
    let mut q = [0u8; QK];
    if bits == Bits::Byte {
        for (g, q) in q.chunks_exact_mut(4).enumerate() {
            q.copy_from_slice(&src[64 * g + 4 * r..][..4]);
        }
        return q;
    }
    for c in 0..4 {
        for i in 0..4 {
            let b = src[64 * c + 4 * r + i];
            q[4 * c + i] = b & 0x0F;
            q[16 + 4 * c + i] = b >> 4;
        }
    }
    if bits == Bits::Lut {
        q.iter_mut().for_each(|q| *q = E2M1[*q as usize]);
    }
    if bits.high_bits() > 0 {
        for g in 0..8 {
            let (at, shift) = bits.high_at(g);
            for i in 0..4 {
                q[4 * g + i] |= ((src[at + 4 * r + i] >> shift) << 4) & bits.high_mask();
            }
        }
    }
    q
}
