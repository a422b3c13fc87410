//! The per-256 sums a K-quant kernel needs of an activation row beside its
//! 8-bit values: made where activations are quantized (`act`), read by the
//! kernels (`x86`, `generic`).

use super::formats::{Scales, QK_K};

/// Per block of 256: `d`, and the sums of the quants per 16 and per 32
/// (each fits i16: 32 * 127), which the minimum terms take in pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct SuperScales {
    pub d: f32,
    pub sums16: [i16; QK_K / 16],
    pub sums32: [i16; QK_K / 32],
}

impl SuperScales {
    pub(super) fn new(d: f32, sums16: &[i32; 16]) -> Self {
        SuperScales {
            d,
            sums16: sums16.map(|s| s as i16),
            sums32: std::array::from_fn(|j| (sums16[2 * j] + sums16[2 * j + 1]) as i16),
        }
    }

    /// The sums a super layout's minima pair with: per 32 inputs when they
    /// are per 32, else per 16.
    pub(crate) fn sums_for(&self, scales: Scales) -> &[i16] {
        match scales {
            Scales::Super32 => &self.sums32,
            _ => &self.sums16,
        }
    }

    /// Sums `2i` and `2i + 1` of `sums` as one i32 (first in the low half),
    /// a `vpmaddwd` operand.
    pub(crate) fn pair(sums: &[i16], i: usize) -> i32 {
        (sums[2 * i] as u16 as u32 | (sums[2 * i + 1] as u16 as u32) << 16) as i32
    }
}
