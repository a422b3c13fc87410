//! Quantized matmul throughput on SmolLM2-135M's weight shapes:
//! `cargo bench --bench quant_matmul`.
//!
//! Compares wick's `QuantMatrix::matmul` with candle's `QMatMul::forward` on the
//! same weights (and on them requantized to Q8_0) and with an f32 matmul of the
//! dequantized weights. Each measurement cycles through enough copies of the
//! matrix to exceed L3, as decode does (the model streams ~100 MB per token).
//!
//! Every configuration is timed in short rounds spread over several passes and
//! the fastest round is kept, so a burst of other load on the machine (which
//! only ever slows a round down) does not skew one configuration against
//! another.

use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wick::quant::QuantMatrix;

/// Bytes of weights each configuration cycles through: about what decoding
/// one token streams (3x the 32 MiB L3).
const WORKING_SET: usize = 96 << 20;
const PASSES: usize = 8;
const ROUND_TIME: Duration = Duration::from_millis(20);
const MS: [usize; 4] = [1, 8, 32, 128];

struct Shape {
    name: &'static str,
    n: usize,
    k: usize,
    dtype: GgmlDType,
    /// Uses per decoded token (30 layers; the LM head once).
    per_token: usize,
}

const SHAPES: [Shape; 5] = [
    Shape {
        name: "attn_q/o 576x576",
        n: 576,
        k: 576,
        dtype: GgmlDType::Q4_1,
        per_token: 60,
    },
    Shape {
        name: "attn_k/v 192x576",
        n: 192,
        k: 576,
        dtype: GgmlDType::Q4_1,
        per_token: 60,
    },
    Shape {
        name: "ffn_gate/up 1536x576",
        n: 1536,
        k: 576,
        dtype: GgmlDType::Q4_1,
        per_token: 60,
    },
    Shape {
        name: "ffn_down 576x1536",
        n: 576,
        k: 1536,
        dtype: GgmlDType::Q4_1,
        per_token: 30,
    },
    Shape {
        name: "lm_head 49152x576",
        n: 49152,
        k: 576,
        dtype: GgmlDType::Q8_0,
        per_token: 1,
    },
];

const IMPLS: [&str; 4] = ["wick", "candle native", "candle Q8_0", "candle f32"];

/// An engine may drive the model from inside the rayon pool or from its own
/// thread; every rayon-parallel call from outside pays a cross-thread
/// hand-off, so both are measured.
const MODES: [&str; 2] = ["from a rayon worker", "from outside the rayon pool"];

fn copies(bytes: usize) -> usize {
    WORKING_SET.div_ceil(bytes).max(1)
}

fn clone_qtensor(t: &QTensor) -> QTensor {
    let storage = QStorage::from_data(t.data().unwrap(), &Device::Cpu, t.dtype()).unwrap();
    QTensor::new(storage, t.shape().clone()).unwrap()
}

/// One shape's weights in every implementation's form, plus inputs per m.
struct Data {
    ours: Vec<QuantMatrix>,
    native: Vec<QMatMul>,
    q8: Vec<QMatMul>,
    f32s: Vec<Tensor>,
    xs: Vec<(Vec<f32>, Tensor)>,
    out: Vec<f32>,
    calls: usize,
}

impl Data {
    fn new(s: &Shape, rng: &mut ChaCha8Rng) -> Self {
        let (n, k) = (s.n, s.k);
        let w: Vec<f32> = (0..n * k).map(|_| rng.random::<f32>() - 0.5).collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let native = QTensor::quantize(&w, s.dtype).unwrap();
        let deq = native.dequantize(&Device::Cpu).unwrap();
        let q8 = QTensor::quantize(&deq, GgmlDType::Q8_0).unwrap();
        let candle = |t: &QTensor| -> Vec<QMatMul> {
            (0..copies(t.storage_size_in_bytes()))
                .map(|_| QMatMul::from_qtensor(clone_qtensor(t)).unwrap())
                .collect()
        };
        let xs = MS
            .iter()
            .map(|&m| {
                let x: Vec<f32> = (0..m * k)
                    .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                    .collect();
                let xt = Tensor::from_slice(&x, (m, k), &Device::Cpu).unwrap();
                (x, xt)
            })
            .collect();
        Data {
            ours: (0..copies(native.storage_size_in_bytes()))
                .map(|_| QuantMatrix::from_qtensor(&native).unwrap().unwrap())
                .collect(),
            native: candle(&native),
            q8: candle(&q8),
            f32s: (0..copies(4 * n * k))
                .map(|_| deq.copy().unwrap().t().unwrap())
                .collect(),
            xs,
            out: vec![0.0; MS[MS.len() - 1] * n],
            calls: 0,
        }
    }

    /// One call of implementation `imp` on the `mi`-th batch size, on the
    /// next weight copy.
    fn call(&mut self, imp: usize, mi: usize) {
        let (m, i) = (MS[mi], self.calls);
        self.calls += 1;
        let (x, xt) = &self.xs[mi];
        let qmm = |mats: &[QMatMul]| {
            std::hint::black_box(mats[i % mats.len()].forward(xt).unwrap());
        };
        match imp {
            0 => {
                let n = self.ours[0].n();
                self.ours[i % self.ours.len()].matmul(x, m, &mut self.out[..m * n]);
            }
            1 => qmm(&self.native),
            2 => qmm(&self.q8),
            _ => {
                let w = &self.f32s[i % self.f32s.len()];
                std::hint::black_box(xt.matmul(w).unwrap());
            }
        }
    }

    /// Mean seconds per call over one round.
    fn round(&mut self, imp: usize, mi: usize) -> f64 {
        let (start, mut calls) = (Instant::now(), 0u32);
        while calls == 0 || start.elapsed() < ROUND_TIME {
            self.call(imp, mi);
            calls += 1;
        }
        start.elapsed().as_secs_f64() / calls as f64
    }
}

/// `best[shape][impl][m]`: fastest round's seconds per call.
type Best = Vec<Vec<Vec<f64>>>;

/// One round of every configuration.
fn pass(data: &mut [Data], best: &mut Best) {
    for (d, best) in data.iter_mut().zip(best.iter_mut()) {
        for (imp, best) in best.iter_mut().enumerate() {
            for (mi, best) in best.iter_mut().enumerate() {
                *best = best.min(d.round(imp, mi));
            }
        }
    }
}

fn report(mode: &str, best: &Best) {
    println!("\n## Called {mode}");
    let mut per_token = vec![vec![0f64; MS.len()]; IMPLS.len()];
    for (s, r) in SHAPES.iter().zip(best) {
        let bytes = [
            s.n * s.k / 32 * s.dtype.type_size(),
            s.n * s.k / 32 * s.dtype.type_size(),
            s.n * s.k / 32 * GgmlDType::Q8_0.type_size(),
            s.n * s.k * 4,
        ];
        println!("\n### {} ({:?}), {mode}\n", s.name, s.dtype);
        println!(
            "| impl | m=1 µs | m=1 GB/s | m=8 µs | m=32 µs | m=128 µs | GFLOP/s m=1/8/32/128 |"
        );
        println!("|---|---|---|---|---|---|---|");
        for (i, name) in IMPLS.iter().enumerate() {
            let t = &r[i];
            let gflops: Vec<String> = MS
                .iter()
                .zip(t)
                .map(|(&m, &t)| format!("{:.0}", 2.0 * (m * s.n * s.k) as f64 / t / 1e9))
                .collect();
            println!(
                "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                t[0] * 1e6,
                bytes[i] as f64 / t[0] / 1e9,
                t[1] * 1e6,
                t[2] * 1e6,
                t[3] * 1e6,
                gflops.join(" / ")
            );
            for (acc, t) in per_token[i].iter_mut().zip(t) {
                *acc += *t * s.per_token as f64;
            }
        }
    }
    println!("\n### Whole model, matmuls only (30 layers + LM head), {mode}: tokens/s\n");
    println!("| impl | m=1 | m=8 | m=32 | m=128 |");
    println!("|---|---|---|---|---|");
    for (name, t) in IMPLS.iter().zip(&per_token) {
        let tps: Vec<String> = MS
            .iter()
            .zip(t)
            .map(|(&m, &t)| format!("{:.0}", m as f64 / t))
            .collect();
        println!("| {name} | {} |", tps.join(" | "));
    }
}

fn main() {
    println!(
        "rayon threads: {}; fastest of {PASSES} rounds of >= {} ms each, weights cycled over {} MiB",
        rayon::current_num_threads(),
        ROUND_TIME.as_millis(),
        WORKING_SET >> 20
    );
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut data: Vec<Data> = SHAPES.iter().map(|s| Data::new(s, &mut rng)).collect();
    let mut best: Vec<Best> = MODES
        .iter()
        .map(|_| vec![vec![vec![f64::MAX; MS.len()]; IMPLS.len()]; SHAPES.len()])
        .collect();
    for _ in 0..PASSES {
        rayon::scope(|_| pass(&mut data, &mut best[0]));
        pass(&mut data, &mut best[1]);
    }
    for (mode, best) in MODES.iter().zip(&best) {
        report(mode, best);
    }
}
