//! Every GGUF block type wick has kernels for, in a whole model: the default
//! model re-quantized by candle into each type (and into a file that mixes
//! types per tensor, as llama.cpp's `*_K_M` files do) loads, and on every
//! CPU kernel this host runs it stays as close to the same file's weights
//! dequantized to f32 (dense f32 matmul) as candle's own quantized matmul
//! does.
//!
//! Why candle is the yardstick: wick's kernels and candle's both round each
//! matmul's activations to 8 bits (per 32 inputs for the per-32 types, per
//! 256 for the K-quants), which the f32 path does not. Every layer then
//! re-rounds its inputs, so a difference of one float ulp anywhere (another
//! summation order, another ISA) moves some roundings by a whole step and
//! the paths part by the size of the rounding noise itself: on a 2-bit
//! model, greedy choices near a tie flip at different steps on each path
//! (Q2_K: 3 to 7 of 64 across candle and wick's three ISAs), while the
//! average divergence stays put. So the test bounds that average: the mean
//! KL divergence from the f32 path's next-token distribution, over every
//! teacher-forced step.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use wick::engine::{Engine, EngineConfig};
use wick::kv::cache::KvDtype;
use wick::load::loader::{load, LoadOptions, LoadedModel};
use wick::models::linear::WeightFormat;
use wick::quant::Kernel;

/// Each wick kernel's mean KL against candle's, at most. Between
/// implementations with the same rounding the ratio is noise: observed
/// 0.52-1.36 over these files on the generic, AVX2 and AVX-512 kernels.
/// Rounding activations to one bit fewer would quadruple the noise's
/// variance, and so the KL (which grows as its square for small noise).
const MAX_KL_RATIO: f64 = 2.0;
/// Mean KL in nats, at most, whatever candle shows: observed at most 0.028
/// (Q2_K) and 0.007 for every other type; a kernel that drops a term or
/// misplaces a scale is off by nats.
const MAX_KL: f64 = 0.1;
/// The f32 path's greedy token must be wick's best or within this many nats
/// of it at every step: a flip happens only at a near tie.
const MAX_MARGIN: f32 = 0.75;
const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
];
const STEPS: usize = 16;

/// Which type each weight matrix gets: `types(name, k)`, or Q8_0 where the
/// type's blocks do not divide the row (as llama-quantize falls back).
fn requantize(out: &Path, types: impl Fn(&str) -> GgmlDType) -> PathBuf {
    let src = common::model_path();
    let mut reader = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for name in content.tensor_infos.keys() {
        let t = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
        let matrix = name.starts_with("blk.") && name.ends_with(".weight") && t.shape().rank() == 2;
        let t = if matrix {
            let k = t.shape().dims2().unwrap().1;
            let want = types(name);
            let dtype = match k % want.block_size() {
                0 => want,
                _ => GgmlDType::Q8_0,
            };
            let f = t.dequantize(&Device::Cpu).unwrap();
            QTensor::quantize(&f, dtype).unwrap()
        } else {
            t
        };
        tensors.push((name.clone(), t));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut file, &metadata, &tensors).unwrap();
    out.to_path_buf()
}

fn load_as(path: &Path, weights: WeightFormat, kernel: Kernel) -> LoadedModel {
    let options = LoadOptions {
        weights,
        kernel,
        ..Default::default()
    };
    load(path, &options, &Device::Cpu)
        .unwrap_or_else(|e| panic!("loading {} as {weights:?}: {e:#}", path.display()))
}

/// Log-softmax in f64.
fn log_probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&l| l as f64 - max - z).collect()
}

/// How far one path's teacher-forced steps are from the f32 path's.
#[derive(Debug)]
struct Divergence {
    /// Mean KL(f32 ‖ path) of the next-token distributions, in nats.
    kl: f64,
    /// Steps whose best token is not the f32 path's.
    differ: usize,
    /// The most the f32 path's token trailed the path's best, in nats.
    margin: f32,
}

type Logits = Vec<Vec<Vec<f32>>>;

fn divergence(reference: &Logits, got: &Logits, seqs: &[(usize, Vec<u32>)]) -> Divergence {
    let (mut kl, mut steps, mut differ, mut margin) = (0.0, 0, 0, 0f32);
    for ((want_rows, rows), (prompt_len, toks)) in reference.iter().zip(got).zip(seqs) {
        for (step, (p, q)) in want_rows.iter().zip(rows).enumerate() {
            let (lp, lq) = (log_probs(p), log_probs(q));
            kl += lp
                .iter()
                .zip(&lq)
                .map(|(a, b)| a.exp() * (a - b))
                .sum::<f64>();
            steps += 1;
            let (want, best) = (toks[prompt_len + step], common::argmax(q));
            if best != want {
                differ += 1;
                margin = margin.max(q[best as usize] - q[want as usize]);
            }
        }
    }
    Divergence {
        kl: kl / steps as f64,
        differ,
        margin,
    }
}

/// The f32 path's greedy continuations, then every other path
/// teacher-forced on them: candle's quantized matmul first, then wick's
/// kernels.
fn compare(path: &Path, kernels: &[Kernel]) -> Vec<(String, Divergence)> {
    let reference = load_as(path, WeightFormat::F32, Kernel::Auto);
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| reference.tokenizer.encode(p).unwrap())
        .collect();
    let mut engine = Engine::new(reference.model, Vec::new(), &EngineConfig::default()).unwrap();
    let continuations = common::greedy_batch(
        &mut engine,
        prompts.iter().map(|p| (p.clone(), STEPS)).collect(),
    );
    drop(engine);
    let seqs: Vec<(usize, Vec<u32>)> = prompts
        .iter()
        .zip(&continuations)
        .map(|(p, c)| (p.len(), p.iter().chain(c).copied().collect()))
        .collect();
    let forced = |weights, kernel| {
        let model = load_as(path, weights, kernel).model;
        common::teacher_forced_logits(&*model, &seqs, KvDtype::F32, false)
    };
    let f32_logits = forced(WeightFormat::F32, Kernel::Auto);
    let paths = [("candle".to_string(), WeightFormat::Candle, Kernel::Auto)]
        .into_iter()
        .chain(
            kernels
                .iter()
                .map(|&k| (format!("wick {k:?}"), WeightFormat::Native, k)),
        );
    paths
        .map(|(name, weights, kernel)| {
            let d = divergence(&f32_logits, &forced(weights, kernel), &seqs);
            (name, d)
        })
        .collect()
}

#[test]
fn every_type_loads_and_follows_its_dequantized_weights() {
    let kernels: Vec<Kernel> = [Kernel::Generic, Kernel::Avx2, Kernel::Avx512]
        .into_iter()
        .filter(|k| k.runs_here())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<(String, PathBuf)> = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ]
    .into_iter()
    .map(|dtype| {
        let name = format!("{dtype:?}");
        let path = requantize(&dir.path().join(format!("{name}.gguf")), |_| dtype);
        (name, path)
    })
    .collect();
    // llama.cpp's Q4_K_M pattern on this model: K-quants where rows divide
    // into 256, Q5_0 elsewhere, Q8_0 for attn_v and Q6_K for some ffn_down,
    // so q/k/v and gate/up mix types and cannot be stacked.
    let mixed = requantize(&dir.path().join("mixed.gguf"), |name| {
        let layer: usize = name.split('.').nth(1).unwrap().parse().unwrap();
        match name {
            n if n.contains("attn_v") => GgmlDType::Q8_0,
            n if n.contains("ffn_down") && layer.is_multiple_of(3) => GgmlDType::Q6K,
            n if n.contains("ffn_down") => GgmlDType::Q4K,
            n if n.contains("ffn_up") => GgmlDType::Q4_1,
            _ => GgmlDType::Q5_0,
        }
    });
    files.push(("mixed".to_string(), mixed));
    let mut failures = Vec::new();
    eprintln!("mean KL from the f32 path (nats), steps whose best token differs of 64:");
    for (what, path) in &files {
        let results = compare(path, &kernels);
        let candle = results[0].1.kl;
        for (name, d) in &results {
            eprintln!(
                "{what:>6} {name:<12} KL {:.5} ({:.2}x candle's), {} differ, worst margin {:.3}",
                d.kl,
                d.kl / candle,
                d.differ,
                d.margin
            );
            if !name.starts_with("wick") {
                continue;
            }
            if d.kl > MAX_KL_RATIO * candle || d.kl > MAX_KL {
                failures.push(format!(
                    "{what} {name}: KL {:.5} vs candle's {candle:.5}",
                    d.kl
                ));
            }
            if d.margin > MAX_MARGIN {
                failures.push(format!("{what} {name}: a flip trailing by {}", d.margin));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
