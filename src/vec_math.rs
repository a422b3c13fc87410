//! Vectorizable reductions and exponentials over f32 slices, shared by the
//! sampler (over the vocabulary) and attention (over a context).

/// Width of the independent accumulators below: float reductions are not
/// reassociated by the compiler, so with a single accumulator they stay scalar.
pub(crate) const LANES: usize = 8;

/// The largest value, ignoring NaN; -inf if there is none.
pub(crate) fn max_of(values: &[f32]) -> f32 {
    // `v > m` rather than `f32::max`, whose NaN rules cost a vectorized
    // compare and blend per step.
    let larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = larger(*a, v);
        }
    }
    rest.iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |m, &v| larger(m, v))
}

/// The index of the first value equal to `target`. A chunk at a time, the
/// compare reduced without an early exit so that it vectorizes: a plain
/// `position` compares one value per iteration.
pub(crate) fn position_of(values: &[f32], target: f32) -> Option<usize> {
    const CHUNK: usize = 4 * LANES;
    let chunk = values
        .chunks(CHUNK)
        .position(|c| c.iter().fold(false, |hit, &v| hit | (v == target)))?;
    let at = values[chunk * CHUNK..].iter().position(|&v| v == target)?;
    Some(chunk * CHUNK + at)
}

/// Writes `exp((v - max) * scale)` of each value to `out` and returns their
/// sum; `max` must be at least every value.
pub(crate) fn exp_into(values: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f32 {
    // Two passes: a fused loop with the accumulators does not vectorize.
    for (v, o) in values.iter().zip(out.iter_mut()) {
        *o = fast_exp((v - max) * scale);
    }
    sum_of(out)
}

/// `a * b + c`, fused when the build targets FMA: one instruction and one
/// rounding instead of a multiply and an add (the compiler never fuses them
/// itself). Without FMA in the target, `f32::mul_add` would be a libm call.
#[inline(always)]
pub(crate) fn mul_add<T: MulAdd>(a: T, b: T, c: T) -> T {
    if cfg!(target_feature = "fma") {
        a.fused(b, c)
    } else {
        a * b + c
    }
}

pub(crate) trait MulAdd:
    Copy + std::ops::Mul<Output = Self> + std::ops::Add<Output = Self>
{
    fn fused(self, b: Self, c: Self) -> Self;
}

impl MulAdd for f32 {
    #[inline(always)]
    fn fused(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
}

impl MulAdd for f64 {
    #[inline(always)]
    fn fused(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
}

pub(crate) fn sum_of(values: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// `e^x` for `x <= 0`, within a few ulp, as straight-line code the compiler
/// vectorizes: libm's `expf` is a call per element, and exponentials over the
/// whole vocabulary dominated sampling time (about 10x faster over 49k
/// logits). Flushes to 0 below -87, where f32 turns subnormal; exp(-inf) = 0.
#[inline]
pub(crate) fn fast_exp(x: f32) -> f32 {
    // ln 2 split so that n * LN2_HI is exact (LN2_HI has 9 significant bits).
    const LN2_HI: f32 = 355.0 / 512.0;
    const LN2_LO: f32 = (std::f64::consts::LN_2 - 355.0 / 512.0) as f32;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits;
    // integer ops on those bits vectorize where a float-to-int cast
    // (saturating in Rust) does not.
    const SHIFT: f32 = 12_582_912.0;
    let clamped = x.clamp(-87.0, 0.0);
    // x = n ln2 + r with |r| <= ln2 / 2, so e^x = 2^n e^r.
    let t = clamped * std::f32::consts::LOG2_E + SHIFT;
    let n = t - SHIFT;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    // Taylor series to r^7: the remainder is below 1e-8 for |r| <= ln2 / 2.
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = mul_add(p, r, c);
    }
    // n in [-126, 0]: 2^n is a normal float with biased exponent n + 127.
    let n_bits = t.to_bits().wrapping_sub(SHIFT.to_bits());
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * two_n
    }
}

/// `e^x` evaluated in f64 and rounded once to f32: within half an ulp plus
/// ~1e-15 relative, so it nearly always equals libm's `expf` bit for bit,
/// yet it is straight-line code the compiler vectorizes. For activations,
/// where libm's per-element call dominated and a few-ulp approximation moved
/// quantized logits visibly.
#[inline]
pub(crate) fn exp_rounded(x: f32) -> f32 {
    // 1.5 * 2^52: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    // ln 2 in two parts, the first with trailing zero bits so n * LN2_HI is exact.
    // (fdlibm's split: the high part's low 32 bits are zero.)
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    // Past these, the f32 result is 0 or infinity however it is rounded; in
    // between, 2^n stays a normal f64.
    let clamped = f64::from(x).clamp(-110.0, 90.0);
    let t = clamped * std::f64::consts::LOG2_E + SHIFT;
    let n = t - SHIFT;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    // Taylor series to r^11: the remainder is below 1e-15 for |r| <= ln2 / 2.
    let mut p = 1.0 / 39_916_800.0;
    for c in [
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = mul_add(p, r, c);
    }
    let n_bits = t.to_bits().wrapping_sub(SHIFT.to_bits());
    let two_n = f64::from_bits(n_bits.wrapping_add(1023) << 52);
    (p * two_n) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_of_finds_the_first_match_in_any_chunk() {
        let mut values = vec![0.0f32; 100];
        assert_eq!(position_of(&values, 1.0), None);
        for at in [0, 31, 32, 33, 63, 64, 97, 99] {
            values[at] = 1.0;
            assert_eq!(position_of(&values, 1.0), Some(at), "{at}");
            // A later match does not move it.
            values[99] = 1.0;
            assert_eq!(position_of(&values, 1.0), Some(at), "{at}");
            values.fill(0.0);
        }
        assert_eq!(position_of(&[f32::NAN, 2.0], f32::NAN), None);
    }

    #[test]
    fn exp_rounded_agrees_with_libm() {
        assert_eq!(exp_rounded(0.0), 1.0);
        assert_eq!(exp_rounded(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_rounded(f32::INFINITY), f32::INFINITY);
        assert!(exp_rounded(f32::NAN).is_nan());
        let (mut differ, mut total) = (0, 0);
        for i in 0..=2_000_000 {
            let x = -104.0 + i as f32 * 1e-4 * 96.5;
            let (got, want) = (exp_rounded(x), x.exp());
            total += 1;
            if got != want {
                differ += 1;
                let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 1, "exp({x}): {got} vs libm {want}");
            }
        }
        eprintln!("{differ} of {total} differ from libm by one ulp");
        assert!(
            differ * 10_000 < total,
            "{differ} of {total} differ from libm"
        );
    }

    /// (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: rounded alone, the product loses
    /// the 2^-24 (a tie to even), which a fused multiply-add keeps.
    #[test]
    fn mul_add_fuses_when_the_target_has_fma() {
        let a = 1.0 + 2f32.powi(-12);
        let c = -(1.0 + 2f32.powi(-11));
        let fused = if cfg!(target_feature = "fma") {
            2f32.powi(-24)
        } else {
            0.0
        };
        assert_eq!(mul_add(a, a, c), fused);
    }

    #[test]
    fn fast_exp_is_accurate() {
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-88.0), 0.0);
        for i in 0..=870_000 {
            let x = i as f32 * -1e-4;
            let exact = f64::from(x).exp();
            let err = (f64::from(fast_exp(x)) - exact).abs() / exact;
            assert!(err < 4.0 * f64::from(f32::EPSILON), "exp({x}): error {err}");
        }
    }

    #[test]
    fn vector_helpers_handle_every_length() {
        for n in 1..30 {
            let v: Vec<f32> = (0..n).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
            let max = max_of(&v);
            assert_eq!(max, 3.0f32.min(v.iter().cloned().fold(f32::MIN, f32::max)));
            let mut out = vec![0.0; n];
            let sum = exp_into(&v, max, 0.5, &mut out);
            let expected: f32 = v.iter().map(|x| ((x - max) * 0.5).exp()).sum();
            assert!((sum - expected).abs() < 1e-5 * expected, "n={n}");
            for (o, x) in out.iter().zip(&v) {
                assert!((o - ((x - max) * 0.5).exp()).abs() < 1e-6);
            }
        }
        assert_eq!(max_of(&[f32::NAN, -1.0, f32::NAN]), -1.0);
    }
}
