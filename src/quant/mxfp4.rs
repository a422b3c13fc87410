//! MXFP4 (the OCP microscaling 4-bit float, GGML type 39), the format
//! gpt-oss's experts ship in: per 32 weights one E8M0 power-of-two scale and
//! 32 E2M1 values (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}).
//!
//! Doubled, E2M1 values are the integers ±{0, 1, 2, 3, 4, 6, 8, 12}, so an
//! MXFP4 block is exactly a Q8_0 block: those integers as its quants and
//! half the power of two as its f16 scale. wick reads MXFP4 so, whatever
//! runs the matrix next (candle's kernels on any device, or wick's, which
//! hold such blocks as codes and exponent bytes again, [`super::formats`]).

use std::borrow::Cow;

use candle_core::quantized::k_quants::{BlockQ8_0, GgmlType};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Shape};
use half::f16;
use rayon::prelude::*;

/// Bytes of a GGUF MXFP4 block: the exponent, then 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 17;
const QK: usize = 32;
const Q8_0_BYTES: usize = 34;

/// E2M1 values doubled, by nibble (bit 3 is the sign).
const VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The f16 scale of doubled values under exponent byte `e`: `2^(e - 128)`,
/// exact from 2^-24 to 2^15. Smaller scales (weights under 4e-7) round to
/// f16's nearest; larger ones are no weights any model holds.
fn scale(e: u8) -> Result<f16, String> {
    let d = f16::from_f32((e as f32 - 128.0).exp2());
    match d.is_finite() {
        true => Ok(d),
        false => Err(format!("MXFP4 scale 2^{} is out of range", e as i32 - 127)),
    }
}

/// A Q8_0 tensor of `shape` whose blocks `fill` writes, as bytes: on a CPU
/// straight into the blocks candle holds rather than copied there, so that
/// a big file's load stays within its weights' size.
pub fn q8_0_tensor(
    shape: Shape,
    device: &Device,
    fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
) -> candle_core::Result<QTensor> {
    let blocks = shape.elem_count() / QK;
    let mut q8 = vec![BlockQ8_0::zeros(); blocks];
    let bytes = |q8: &mut [BlockQ8_0]| {
        // SAFETY: BlockQ8_0 is repr(C), an f16 then 32 i8: 34 bytes with no
        // padding (candle asserts its size), valid whatever they hold.
        unsafe {
            std::slice::from_raw_parts_mut(q8.as_mut_ptr().cast::<u8>(), q8.len() * Q8_0_BYTES)
        }
    };
    fill(bytes(&mut q8)).map_err(candle_core::Error::Msg)?;
    let storage = match device {
        Device::Cpu => QStorage::Cpu(Box::new(q8)),
        _ => QStorage::from_data(Cow::Borrowed(bytes(&mut q8)), device, GgmlDType::Q8_0)?,
    };
    QTensor::new(storage, shape)
}

/// GGUF's MXFP4 blocks (`e`, then byte `j` holding weight `j` in its low
/// nibble and weight `j + 16` in its high one) as Q8_0 blocks, into `out`.
pub fn gguf_to_q8_0(raw: &[u8], out: &mut [u8]) -> Result<(), String> {
    if !raw.len().is_multiple_of(BLOCK_BYTES) || out.len() != raw.len() / BLOCK_BYTES * Q8_0_BYTES {
        return Err(format!(
            "{} bytes are not the {} bytes of whole MXFP4 blocks",
            raw.len(),
            out.len() / Q8_0_BYTES * BLOCK_BYTES
        ));
    }
    // In parallel: a model's experts are billions of weights.
    out.par_chunks_mut(Q8_0_BYTES)
        .zip(raw.par_chunks(BLOCK_BYTES))
        .try_for_each(|(out, b)| {
            let mut q = [0i8; QK];
            for (j, &byte) in b[1..].iter().enumerate() {
                q[j] = VALUES[(byte & 0x0F) as usize];
                q[j + QK / 2] = VALUES[(byte >> 4) as usize];
            }
            write_q8_0(out, b[0], &q)
        })
}

/// A Hugging Face checkpoint's MXFP4 (`*_blocks`: per block 16 bytes, byte
/// `j` holding weight `2j` in its low nibble and `2j + 1` in its high one;
/// `*_scales`: one exponent byte per block) as Q8_0 blocks, into `out`.
pub fn hf_to_q8_0(blocks: &[u8], scales: &[u8], out: &mut [u8]) -> Result<(), String> {
    if blocks.len() != scales.len() * QK / 2 || out.len() != scales.len() * Q8_0_BYTES {
        return Err(format!(
            "{} bytes of MXFP4 blocks for {} scales",
            blocks.len(),
            scales.len()
        ));
    }
    out.par_chunks_mut(Q8_0_BYTES)
        .zip(blocks.par_chunks(QK / 2).zip(scales.par_iter()))
        .try_for_each(|(out, (b, &e))| {
            let mut q = [0i8; QK];
            for (j, &byte) in b.iter().enumerate() {
                q[2 * j] = VALUES[(byte & 0x0F) as usize];
                q[2 * j + 1] = VALUES[(byte >> 4) as usize];
            }
            write_q8_0(out, e, &q)
        })
}

/// One Q8_0 block (34 bytes) of quants `q` under MXFP4 exponent `e`.
fn write_q8_0(out: &mut [u8], e: u8, q: &[i8; QK]) -> Result<(), String> {
    // An all-zero block's exponent is arbitrary (GGML writes 0).
    let d = match q.iter().all(|&q| q == 0) {
        true => f16::ZERO,
        false => scale(e)?,
    };
    out[..2].copy_from_slice(&d.to_le_bytes());
    out[2..].iter_mut().zip(q).for_each(|(o, &q)| *o = q as u8);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OCP MX definition, written out: E2M1 `(-1)^s * 2^(E-1) * (1 +
    /// M/2)` (subnormal `M/2` at E = 0) times `2^(e - 127)`.
    fn ocp(nibble: u8, e: u8) -> f32 {
        let (s, ex, m) = (nibble >> 3, (nibble >> 1) & 3, nibble & 1);
        let mag = match ex {
            0 => m as f32 * 0.5,
            _ => (ex as f32 - 1.0).exp2() * (1.0 + m as f32 * 0.5),
        };
        let v = if s == 1 { -mag } else { mag };
        v * (e as f32 - 127.0).exp2()
    }

    fn q8_values(q8: &[u8]) -> Vec<f32> {
        q8.chunks_exact(Q8_0_BYTES)
            .flat_map(|b| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                b[2..].iter().map(move |&q| q as i8 as f32 * d)
            })
            .collect()
    }

    /// Every nibble at several exponents, in both layouts, against the
    /// definition.
    #[test]
    fn blocks_become_q8_0_of_the_same_values() {
        for e in [100u8, 118, 127, 130, 140] {
            let mut gguf = vec![e];
            let mut hf = Vec::new();
            // Weights 0..16 take nibbles 0..16, weights 16..32 nibbles 15..=0.
            let nib = |i: usize| if i < 16 { i as u8 } else { 31 - i as u8 };
            for j in 0..16 {
                gguf.push(nib(j) | (nib(j + 16) << 4));
                hf.push(nib(2 * j) | (nib(2 * j + 1) << 4));
            }
            let want: Vec<f32> = (0..32).map(|i| ocp(nib(i), e)).collect();
            let (mut from_gguf, mut from_hf) = ([0; Q8_0_BYTES], [0; Q8_0_BYTES]);
            gguf_to_q8_0(&gguf, &mut from_gguf).unwrap();
            hf_to_q8_0(&hf, &[e], &mut from_hf).unwrap();
            for got in [q8_values(&from_gguf), q8_values(&from_hf)] {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = if e < 104 { w.abs() * 0.5 + 1e-7 } else { 0.0 };
                    assert!((g - w).abs() <= tol, "e {e} weight {i}: {g} vs {w}");
                }
            }
        }
        let mut out = [0; Q8_0_BYTES];
        assert!(gguf_to_q8_0(&[0; 16], &mut out).is_err());
        assert!(gguf_to_q8_0(
            &[255, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &mut out
        )
        .is_err());
        assert!(hf_to_q8_0(&[0; 16], &[1, 2], &mut out).is_err());
    }
}
