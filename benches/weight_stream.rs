//! How close the matmul kernels come to the memory: `cargo bench --bench
//! weight_stream [-- FORMAT ...]` (default: q4_k q6_k q4_0 q8_0).
//!
//! One-stream decode reads every weight once per token, so its ceiling is the
//! speed at which the cores can read those bytes at all. For each format this
//! builds the matrices of a random Llama-3.2-1B-shaped stack (16 layers of
//! q/k/v, o, gate/up and down, ~0.5-1 GB, far larger than any cache) and, in
//! alternating rounds, times
//! - a plain read: summing each matrix's repacked bytes in the order decode
//!   reads them, each matrix split into one contiguous part per thread, as the
//!   kernels split it;
//! - the kernels: each matrix times one activation row, back to back, as one
//!   decode step runs them without the rest of the forward.
//!
//! It prints each round's GB/s and the median ratio. `wick bench` sets a
//! whole decode step against a 1 GiB read; this separates the kernels' share
//! of the gap from the rest of the forward's.

use std::hint::black_box;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use wick::quant::QuantMatrix;

const LAYERS: usize = 16;
const HIDDEN: usize = 2048;
/// (rows, inputs) of one layer's matrices, q/k/v and gate/up stacked as wick
/// loads them.
const SHAPES: [(usize, usize); 4] = [
    (HIDDEN + 2 * 512, HIDDEN),
    (HIDDEN, HIDDEN),
    (2 * 8192, HIDDEN),
    (HIDDEN, 8192),
];
const ROUNDS: usize = 7;
/// Passes per round; a round keeps its fastest, as a burst of other load only
/// ever slows a pass down.
const PASSES: usize = 3;

fn format(name: &str) -> Option<GgmlDType> {
    Some(match name {
        "q4_0" => GgmlDType::Q4_0,
        "q4_1" => GgmlDType::Q4_1,
        "q5_0" => GgmlDType::Q5_0,
        "q5_1" => GgmlDType::Q5_1,
        "q8_0" => GgmlDType::Q8_0,
        "q2_k" => GgmlDType::Q2K,
        "q3_k" => GgmlDType::Q3K,
        "q4_k" => GgmlDType::Q4K,
        "q5_k" => GgmlDType::Q5K,
        "q6_k" => GgmlDType::Q6K,
        _ => return None,
    })
}

fn matrix(rng: &mut ChaCha8Rng, (n, k): (usize, usize), dtype: GgmlDType) -> QuantMatrix {
    let w: Vec<f32> = (0..n * k).map(|_| rng.random::<f32>() - 0.5).collect();
    let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    QuantMatrix::from_qtensor(&q).unwrap().unwrap()
}

/// Sum of the bytes as u64 words: the cheapest loop that touches them all.
fn sum(bytes: &[u8]) -> u64 {
    // SAFETY: any 8 bytes are a valid u64.
    let (head, words, tail) = unsafe { bytes.align_to::<u64>() };
    let edges = head.iter().chain(tail).map(|&b| b as u64);
    words
        .iter()
        .copied()
        .chain(edges)
        .fold(0, u64::wrapping_add)
}

fn plain_read(mats: &[QuantMatrix], threads: usize) -> u64 {
    mats.iter().fold(0, |acc, m| {
        let bytes = m.bytes();
        let part = bytes.len().div_ceil(threads).next_multiple_of(64);
        let s = bytes
            .par_chunks(part)
            .map(sum)
            .reduce(|| 0, u64::wrapping_add);
        acc.wrapping_add(s)
    })
}

fn kernels(mats: &[QuantMatrix], x: &[f32], out: &mut [f32]) {
    for m in mats {
        m.matmul(&x[..m.k()], 1, &mut out[..m.n()]);
    }
}

/// Fastest of `PASSES` runs of `f`, in seconds.
fn fastest(mut f: impl FnMut()) -> f64 {
    (0..PASSES)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let names = if args.is_empty() {
        ["q4_k", "q6_k", "q4_0", "q8_0"].map(String::from).to_vec()
    } else {
        args
    };
    let threads = rayon::current_num_threads();
    println!("rayon threads: {threads}; {ROUNDS} rounds, each the fastest of {PASSES} passes");
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let x: Vec<f32> = (0..8192).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    let mut out = vec![0f32; 2 * 8192];
    for name in names {
        let Some(dtype) = format(&name) else {
            eprintln!("unknown format {name:?}: use q4_0, q4_1, q5_0, q5_1, q8_0 or q2_k..q6_k");
            std::process::exit(2);
        };
        let mats: Vec<QuantMatrix> = (0..LAYERS)
            .flat_map(|_| SHAPES)
            .map(|shape| matrix(&mut rng, shape, dtype))
            .collect();
        let bytes: usize = mats.iter().map(|m| m.bytes().len()).sum();
        println!("\n{name}: {:.0} MB of weights", bytes as f64 / 1e6);
        let gbs = |secs: f64| bytes as f64 / secs / 1e9;
        let mut ratios = Vec::new();
        // Inside the pool, as the engine runs its forward.
        rayon::scope(|_| {
            for round in 0..ROUNDS {
                let plain = gbs(fastest(|| {
                    black_box(plain_read(&mats, threads));
                }));
                let kern = gbs(fastest(|| kernels(&mats, &x, &mut out)));
                black_box(&out);
                println!(
                    "  round {round}: plain read {plain:.1} GB/s, kernels {kern:.1} GB/s = {:.0}%",
                    100.0 * kern / plain
                );
                ratios.push(kern / plain);
            }
        });
        println!(
            "{name}: kernels at {:.0}% of a plain read (median)",
            100.0 * median(ratios)
        );
    }
}
