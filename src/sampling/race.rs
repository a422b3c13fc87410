//! The draw of one token: an exponential race. Token `i` of weight `w_i`
//! gets an exponential noise `e_i` and the largest `w_i / e_i` wins, which
//! happens with probability `w_i / Σ w` (the first of independent
//! exponential clocks of rates `w_i` to ring). vLLM samples this way too.
//!
//! The noises are hashed from one random 64-bit key per draw and the token
//! id, so a draw costs one number from the sequence's RNG however large the
//! vocabulary, and the same key gives a token the same noise in any
//! distribution. That is what lets a draft model propose well for sampled
//! rows: drawn with the key its target row will use, a proposal is the
//! target's own pick wherever the two distributions agree, whatever order
//! their filters left the tokens in ([`crate::sampling::sampler::Sampler::propose`]).

use crate::sampling::argmax::argmax;

/// Weights screened at a time.
const CHUNK: usize = 32;

/// The index of `weights` (non-negative, at least one positive) that wins
/// the race keyed by `key`, token `i` being `ids(i)`.
///
/// The winner is the token of smallest time `e / w`, which the heaviest
/// token's time bounds. Since `e = -ln u >= 1 - u`, a token can beat a
/// bound `b` only if `1 - u < b w`: that screen, with no logarithm or
/// division, vectorizes, and few tokens pass it (about `ln` of the number
/// that matter), so a draw costs a hash per token, not a logarithm.
pub fn race(key: u64, weights: &[f32], ids: impl Fn(usize) -> u32) -> usize {
    let mut best = argmax(weights) as usize;
    let mut bound = time(key, ids(best), weights[best]);
    for (c, chunk) in weights.chunks(CHUNK).enumerate() {
        let base = c * CHUNK;
        // Widened a little, so that f32 rounding never screens out a token
        // the exact time would let win.
        let reach = bound as f32 * (1.0 + 1e-5);
        let may_win = |j: usize, w: f32| gap_below(hash(key, ids(base + j))) <= reach * w;
        let any = chunk
            .iter()
            .enumerate()
            .fold(false, |hit, (j, &w)| hit | may_win(j, w));
        if !any {
            continue;
        }
        for (j, &w) in chunk.iter().enumerate() {
            let i = base + j;
            if i != best && may_win(j, w) {
                let t = time(key, ids(i), w);
                if t < bound || (t == bound && i < best) {
                    (best, bound) = (i, t);
                }
            }
        }
    }
    best
}

/// When token `id` of weight `w` finishes under `key`: its exponential
/// noise over its weight (infinite for weight 0).
fn time(key: u64, id: u32, w: f32) -> f64 {
    // u uniform in (0, 1) from all 32 bits, never 0 or 1.
    let u = (f64::from(hash(key, id)) + 0.5) / 4_294_967_296.0;
    -u.ln() / f64::from(w)
}

/// A lower bound on `1 - u` for the `u` of [`time`], from the top 24 bits
/// (below 2^24, so the signed conversion, which vectorizes, is exact).
#[inline(always)]
fn gap_below(h: u32) -> f32 {
    ((!h >> 8) as i32) as f32 * (1.0 / 16_777_216.0)
}

/// Token `id`'s hash under `key`.
#[inline(always)]
fn hash(key: u64, id: u32) -> u32 {
    mix(mix(id ^ key as u32) ^ (key >> 32) as u32)
}

/// A bijective 32-bit integer hash with full avalanche (Wellons'
/// "lowbias32" constants): distinct ids get unrelated noises.
#[inline(always)]
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pearson's chi-square of `hits` against `expected` counts.
    fn chi_square(hits: &[u32], expected: &[f64]) -> f64 {
        hits.iter()
            .zip(expected)
            .map(|(&h, &e)| (f64::from(h) - e).powi(2) / e)
            .sum()
    }

    #[test]
    fn wins_in_proportion_to_weight_over_many_ids() {
        // 200 ids scattered over a large vocabulary, weights 1..=4: each
        // id's noise must be independent of its neighbours' and its key's.
        let ids: Vec<u32> = (0..200u32).map(|i| i * 245 + 3).collect();
        let weights: Vec<f32> = (0..200).map(|i| (i % 4 + 1) as f32).collect();
        let total: f32 = weights.iter().sum();
        let draws = 100_000u64;
        let mut hits = vec![0u32; ids.len()];
        for key in 0..draws {
            // Consecutive keys, as a poor RNG would give: still independent.
            hits[race(key, &weights, |i| ids[i])] += 1;
        }
        let expected: Vec<f64> = weights
            .iter()
            .map(|&w| f64::from(w / total) * draws as f64)
            .collect();
        // 199 degrees of freedom: the 0.1% tail starts at 269.
        let chi = chi_square(&hits, &expected);
        assert!(chi < 269.0, "chi-square {chi}");
    }

    #[test]
    fn zero_weights_never_win() {
        let weights = [0.0, 1e-30, 0.0, 0.0];
        for key in 0..1000 {
            assert_eq!(race(key, &weights, |i| i as u32), 1);
        }
    }

    #[test]
    fn times_are_exponential_and_the_screen_never_drops_a_winner() {
        // Mean 1 and P(e > 1) = 1/e over one key's ids; 1 - u never below
        // its screened bound.
        let n = 1_000_000u32;
        let (mut sum, mut above) = (0.0f64, 0u32);
        for id in 0..n {
            let h = hash(0x5eed, id);
            let e = time(0x5eed, id, 1.0);
            assert!(e > 0.0 && e.is_finite());
            let u = (-e).exp();
            assert!(f64::from(gap_below(h)) <= 1.0 - u, "{h}");
            sum += e;
            above += u32::from(e > 1.0);
        }
        let mean = sum / f64::from(n);
        let tail = f64::from(above) / f64::from(n);
        assert!((mean - 1.0).abs() < 0.005, "mean {mean}");
        assert!((tail - (-1f64).exp()).abs() < 0.002, "P(e > 1) = {tail}");
    }

    #[test]
    fn the_screened_race_picks_the_exact_race_winner() {
        // Against every token's time computed: flat and peaked weights,
        // over a vocabulary's worth.
        let flat: Vec<f32> = (0..5000).map(|i| 0.5 + (i % 7) as f32 * 0.05).collect();
        let peaked: Vec<f32> = (0..5000).map(|i| 0.8f32.powi(i % 97)).collect();
        for weights in [flat, peaked] {
            for key in 0..300u64 {
                let key = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let exact = (0..weights.len())
                    .min_by(|&a, &b| {
                        let t = |i: usize| time(key, i as u32, weights[i]);
                        t(a).total_cmp(&t(b)).then(a.cmp(&b))
                    })
                    .unwrap();
                assert_eq!(race(key, &weights, |i| i as u32), exact, "key {key}");
            }
        }
    }
}
