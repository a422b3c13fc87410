//! The sampler's cost per token over a 49,152-token vocabulary (SmolLM2's)
//! for the parameter sets clients send: `cargo bench --bench sampling`.
//!
//! Each set is timed in short rounds over several passes and the fastest
//! round kept, so a burst of other load (which only slows a round) does
//! not skew one set against another.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wick::sampling::params::SamplingParams;
use wick::sampling::sampler::Sampler;

const VOCAB: usize = 49_152;
const PASSES: usize = 8;
const ROUND_TIME: Duration = Duration::from_millis(20);

fn main() {
    // Logits shaped like a language model's: a few likely tokens over a
    // long tail (Gumbel-distributed, spread 2 nats).
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let logits: Vec<f32> = (0..VOCAB)
        .map(|_| -2.0 * (-(rng.random::<f32>().max(1e-12)).ln()).ln())
        .collect();
    let sets: [(&str, SamplingParams); 5] = [
        ("greedy", params(0.0, 0, 1.0)),
        ("temperature 1", params(1.0, 0, 1.0)),
        ("temperature 0.7, top-p 0.95", params(0.7, 0, 0.95)),
        ("temperature 0.8, top-k 50", params(0.8, 50, 1.0)),
        ("top-k 50, top-p 0.9", params(1.0, 50, 0.9)),
    ];
    let mut best = vec![f64::INFINITY; sets.len()];
    for _ in 0..PASSES {
        for (i, (_, p)) in sets.iter().enumerate() {
            let mut sampler = Sampler::new(p);
            let mut row = logits.clone();
            let start = Instant::now();
            let mut n = 0u32;
            while start.elapsed() < ROUND_TIME {
                row.copy_from_slice(&logits);
                std::hint::black_box(sampler.sample(&mut row, &[], &[]));
                n += 1;
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
            best[i] = best[i].min(us);
        }
    }
    println!("{:<30} {:>12}", "parameters", "µs / token");
    for ((name, _), us) in sets.iter().zip(best) {
        println!("{name:<30} {us:>12.1}");
    }
}

fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: Some(1),
        ..SamplingParams::default()
    }
}
